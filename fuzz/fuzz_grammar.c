/* fuzz_grammar.c - libFuzzer target: the GBNF compiler, the JSON-schema compiler and the matcher's token mask.
 *
 * Input: byte 0 picks the mode (bit 0: the rest is a JSON schema, else GBNF
 * text; bits 1-7 seed the walk), the rest is the text.
 *
 * Properties, each an abort when broken:
 *   - a compile either succeeds or fails with a message;
 *   - a schema the schema compiler accepts gives GBNF the grammar compiler
 *     accepts;
 *   - along a walk of up to 24 tokens drawn from each mask, the mask agrees
 *     with accepting each token on its own (a sample of allowed and refused
 *     ids, on a fresh matcher replaying the walk), counts its bits right, and
 *     allows the end token exactly when the text so far is complete. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/util.h"
#include "sample/grammar.h"

static const char *const extra[] = {
	"{\"", "\":", "\",", "\"}", "true", "null", "  ", "\n", "12", "-1", ".5", "e+", "ab", "abc", "é", "\xC3",
	"\xA9", "日本", "\xE6\x97", "\\n", "\\u00", "}", "]", "[{", ", ", ": ", "0000", "\"a\"",
};
#define N_EXTRA ((int)(sizeof(extra) / sizeof(extra[0])))
#define N_VOCAB (256 + N_EXTRA + 1)
#define EOS_ID (N_VOCAB - 1)
#define MAX_STEPS 24

static char bytes[256];
static const char *pieces[N_VOCAB];
static size_t lens[N_VOCAB];
static bool eog[N_VOCAB];
static struct nx_vocab_trie *trie;

static void init(void)
{
	for (int i = 0; i < 256; i++) {
		bytes[i] = (char)i;
		pieces[i] = &bytes[i];
		lens[i] = 1;
	}
	for (int i = 0; i < N_EXTRA; i++) {
		pieces[256 + i] = extra[i];
		lens[256 + i] = strlen(extra[i]);
	}
	eog[EOS_ID] = true;
	struct nx_err err;
	if (nx_vocab_trie_from_pieces(N_VOCAB, pieces, lens, eog, &trie, &err))
		abort();
}

static struct nx_gmatch *replay(const char *gbnf, const int32_t *path, int n)
{
	struct nx_grammar *g;
	struct nx_gmatch *m;
	struct nx_err err;
	FUZZ_CHECK(nx_grammar_compile(gbnf, strlen(gbnf), &g, &err) == 0, "recompile failed: %s", err.msg);
	if (nx_gmatch_new(g, trie, &m, &err))
		return NULL;
	for (int i = 0; i < n; i++)
		FUZZ_CHECK(nx_gmatch_accept_token(m, path[i]) == 0, "replay of token %d failed", path[i]);
	return m;
}

static bool bit(const uint64_t *mask, int id)
{
	return (mask[id >> 6] >> (id & 63)) & 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!trie)
		init();
	if (size < 1)
		return 0;
	const uint8_t mode = data[0];
	char *text = fuzz_strndup(data + 1, size - 1);
	char *gbnf = NULL;
	struct nx_err err = { { 0 } };
	if (mode & 1) {
		if (nx_schema_to_gbnf(text, size - 1, &gbnf, &err)) {
			FUZZ_CHECK(err.msg[0], "a schema refused without a message");
			free(text);
			return 0;
		}
	} else {
		gbnf = fuzz_strndup(data + 1, size - 1);
	}
	struct nx_grammar *g;
	if (nx_grammar_compile(gbnf, strlen(gbnf), &g, &err)) {
		FUZZ_CHECK(err.msg[0], "a grammar refused without a message");
		FUZZ_CHECK(!(mode & 1), "the schema compiler wrote GBNF the grammar compiler refuses: %s\n%s", err.msg, gbnf);
		free(gbnf);
		free(text);
		return 0;
	}
	struct nx_gmatch *m;
	if (nx_gmatch_new(g, trie, &m, &err)) {
		free(gbnf);
		free(text);
		return 0;
	}
	int32_t path[MAX_STEPS];
	uint32_t rng = 2166136261u ^ mode;
	for (int step = 0; step < MAX_STEPS; step++) {
		int n_allowed = 0;
		const uint64_t *mask = nx_gmatch_mask(m, &n_allowed, &err);
		if (!mask)
			break; /* out of its bounds: an ambiguous grammar, a clean error */
		int counted = 0;
		for (int id = 0; id < N_VOCAB; id++)
			counted += bit(mask, id);
		FUZZ_CHECK(counted == n_allowed, "mask has %d bits, says %d", counted, n_allowed);
		FUZZ_CHECK(bit(mask, EOS_ID) == nx_gmatch_accepting(m), "end token allowed %d, complete %d",
			   bit(mask, EOS_ID), nx_gmatch_accepting(m));
		/* a sample of ids checked one by one */
		for (int k = 0; k < 8; k++) {
			rng = rng * 1664525u + 1013904223u;
			int id = (int)(rng >> 8) % N_VOCAB;
			struct nx_gmatch *b = replay(gbnf, path, step);
			if (!b)
				break;
			bool ok = nx_gmatch_accept_token(b, id) == 0;
			nx_gmatch_free(b);
			FUZZ_CHECK(ok == bit(mask, id), "step %d: token %d accepted %d, mask %d", step, id, ok, bit(mask, id));
		}
		if (n_allowed == 0 || (n_allowed == 1 && bit(mask, EOS_ID)))
			break;
		/* the next token: one of the allowed, not the end */
		rng = rng * 1664525u + 1013904223u;
		int pick = (int)(rng >> 8) % n_allowed, tok = -1;
		for (int id = 0; id < N_VOCAB; id++)
			if (bit(mask, id) && pick-- == 0) {
				tok = id;
				break;
			}
		if (tok == EOS_ID)
			break;
		FUZZ_CHECK(nx_gmatch_accept_token(m, tok) == 0, "an allowed token %d was refused", tok);
		path[step] = tok;
	}
	nx_gmatch_free(m);
	free(gbnf);
	free(text);
	return 0;
}
