/* fuzz_tokenizer.c - libFuzzer target: nx_tok_encode and the streaming detokenizer on real vocabularies.
 *
 * Input: byte 0 is a set of flags, the rest is text (or token ids):
 *   bits 0-1  vocabulary: 0 fuzz/data/tiny-bpe.vocab, 1 fuzz/data/tiny-spm.vocab,
 *             2 ggml-vocab-gpt-2.gguf, 3 ggml-vocab-llama-spm.gguf from
 *             ../shared/data/vocab (the tiny ones stand in when it is absent)
 *   bit 2     parse_special
 *   bit 3     detokenize with NX_DETOK_SPECIAL
 *   bit 4     detokenize with NX_DETOK_STRIP
 *   bit 5     ids mode: the rest is little-endian int16 token ids (out of range
 *             ones included) pushed through the detokenizer
 *   bit 6     vocabulary 4 + bit 0 instead: fuzz/data/tiny-sp-bpe.vocab (Gemma 4's
 *             SentencePiece-style BPE), fuzz/data/tiny-ws.vocab (whitespace)
 * The files are found from $NX_FUZZ_ROOT (default "."), the repo root.
 *
 * Properties, each an abort when broken:
 *   - every id encode gives is in [0, n_vocab); a buffer too small gets the
 *     same count and the same first ids as a big one;
 *   - the streaming detokenizer's output is strict UTF-8, never more than
 *     nx_detok_bound per push, and equals nx_tok_decode of the same ids;
 *   - valid UTF-8 text encoded without parse_special decodes back to itself.
 *     SPM exceptions, by design (llama.cpp does the same): text holding U+2581,
 *     which SPM cannot tell from a space, and text split by a user-defined
 *     token, after which the next text piece gets a space prefix again; the
 *     SentencePiece-style BPE: text holding U+2581; the whitespace vocabulary
 *     drops whitespace, so none of its text comes back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/util.h"
#include "model/gguf.h"
#include "tok/tokenizer.h"

#define MAX_IDS 8192

#define N_VOCABS 6
#define SP_BPE 4 /* toks[]: the SentencePiece-style BPE */
#define WS 5     /* toks[]: the whitespace vocabulary */

static struct nx_tok *toks[N_VOCABS];
static char vocab_name[N_VOCABS][512];

static struct nx_tok *load(const char *path)
{
	struct gguf_mapped m;
	struct nx_err err;
	struct nx_tok *t = NULL;

	if (gguf_open(&m, path, &err))
		return NULL;
	if (nx_tok_load(&t, &m.g, &err)) {
		fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err.msg);
		gguf_close(&m);
		return NULL;
	}
	gguf_close(&m); /* the tokenizer keeps copies */
	return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *root = getenv("NX_FUZZ_ROOT");
	char path[N_VOCABS][512];

	if (!root || !*root)
		root = ".";
	snprintf(path[0], sizeof(path[0]), "%s/fuzz/data/tiny-bpe.vocab", root);
	snprintf(path[1], sizeof(path[1]), "%s/fuzz/data/tiny-spm.vocab", root);
	snprintf(path[2], sizeof(path[2]), "%s/../shared/data/vocab/ggml-vocab-gpt-2.gguf", root);
	snprintf(path[3], sizeof(path[3]), "%s/../shared/data/vocab/ggml-vocab-llama-spm.gguf", root);
	snprintf(path[SP_BPE], sizeof(path[SP_BPE]), "%s/fuzz/data/tiny-sp-bpe.vocab", root);
	snprintf(path[WS], sizeof(path[WS]), "%s/fuzz/data/tiny-ws.vocab", root);
	for (int i = 0; i < N_VOCABS; i++) {
		toks[i] = load(path[i]);
		snprintf(vocab_name[i], sizeof(vocab_name[i]), "%s", path[i]);
		if (!toks[i] && (i == 2 || i == 3)) { /* the shared data is optional */
			toks[i] = toks[i - 2];
			snprintf(vocab_name[i], sizeof(vocab_name[i]), "%s", path[i - 2]);
		}
		if (!toks[i]) {
			fprintf(stderr, "fuzz_tokenizer: cannot load %s (set NX_FUZZ_ROOT to the repo root)\n", path[i]);
			exit(1);
		}
	}
	fprintf(stderr, "fuzz_tokenizer: vocabularies %s, %s, %s, %s, %s, %s\n", vocab_name[0], vocab_name[1],
		vocab_name[2], vocab_name[3], vocab_name[SP_BPE], vocab_name[WS]);
	return 0;
}

/* Streams ids through a fresh detokenizer into out (cap >= n * bound + 3); returns the length. */
static size_t stream_decode(const struct nx_tok *t, const int32_t *ids, size_t n, unsigned flags, char *out,
			    size_t cap)
{
	struct nx_detok d;
	size_t bound = nx_detok_bound(t), len = 0;
	struct nx_err err;

	nx_detok_init(&d, t, flags);
	for (size_t i = 0; i < n; i++) {
		size_t k = 0;
		FUZZ_CHECK(cap - len >= bound, "output buffer too small");
		err.msg[0] = 0;
		if (nx_detok_push(&d, ids[i], out + len, bound, &k, &err)) {
			FUZZ_CHECK(ids[i] < 0 || ids[i] >= nx_tok_n_vocab(t), "push of id %d in range failed: %s", ids[i],
				   err.msg);
			FUZZ_CHECK(err.msg[0], "push of id %d failed without a message", ids[i]);
			continue;
		}
		FUZZ_CHECK(ids[i] >= 0 && ids[i] < nx_tok_n_vocab(t), "push of id %d out of range succeeded", ids[i]);
		FUZZ_CHECK(k <= bound, "push wrote %zu bytes > bound %zu", k, bound);
		len += k;
	}
	size_t k = nx_detok_flush(&d, out + len, cap - len);
	FUZZ_CHECK(k <= 3, "flush wrote %zu bytes", k);
	len += k;
	size_t bad = 0;
	FUZZ_CHECK(fuzz_utf8_valid((const uint8_t *)out, len, &bad), "detokenizer output is not UTF-8 at byte %zu of %zu",
		   bad, len);
	return len;
}

/* Any user-defined or control token after the first: SPM prefixes the text after it with a space. */
static bool splits(const struct nx_tok *t, const int32_t *ids, size_t n)
{
	for (size_t i = 1; i < n; i++)
		if (nx_tok_type(t, ids[i - 1]) == NX_TT_USER || nx_tok_type(t, ids[i - 1]) == NX_TT_CONTROL)
			return true;
	return false;
}

static bool has_u2581(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i + 2 < n; i++)
		if (s[i] == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81)
			return true;
	return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t fl = data[0];
	const int v = fl & 64 ? SP_BPE + (fl & 1) : fl & 3;
	const struct nx_tok *t = toks[v];
	bool special = fl & 4;
	unsigned dflags = (fl & 8 ? NX_DETOK_SPECIAL : 0) | (fl & 16 ? NX_DETOK_STRIP : 0);
	const uint8_t *text = data + 1;
	size_t len = size - 1, bound = nx_detok_bound(t);
	int32_t n_vocab = nx_tok_n_vocab(t);
	static int32_t ids[MAX_IDS], ids2[MAX_IDS];
	struct nx_err err;
	size_t n = 0;

	if (fl & 32) { /* ids mode */
		n = len / 2 < MAX_IDS ? len / 2 : MAX_IDS;
		for (size_t i = 0; i < n; i++) {
			int16_t v;
			memcpy(&v, text + 2 * i, 2);
			ids[i] = v;
		}
	} else {
		/* A small buffer first: same count, same prefix as the full encode. */
		size_t n_small = 0, cap_small = 4;
		int32_t small[4];
		err.msg[0] = 0;
		int rc = nx_tok_encode(t, (const char *)text, len, special, small, cap_small, &n_small, &err);
		if (rc == 0) {
			FUZZ_CHECK(n_small <= cap_small, "encode succeeded with %zu ids in %zu", n_small, cap_small);
		} else {
			FUZZ_CHECK(err.msg[0], "encode failed without a message");
			FUZZ_CHECK(n_small > cap_small, "encode failed (%s) with %zu ids <= cap %zu", err.msg, n_small,
				   cap_small);
		}
		if (n_small > MAX_IDS)
			return 0;
		err.msg[0] = 0;
		FUZZ_CHECK(nx_tok_encode(t, (const char *)text, len, special, ids, n_small, &n, &err) == 0,
			   "encode into the %zu ids it asked for failed: %s", n_small, err.msg);
		FUZZ_CHECK(n == n_small, "encode count %zu, then %zu", n_small, n);
		for (size_t i = 0; i < n; i++)
			FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "encode gave id %d of %d", ids[i], n_vocab);
		for (size_t i = 0; i < n && i < cap_small; i++)
			FUZZ_CHECK(small[i] == ids[i], "id %zu differs between a small and a full buffer", i);
	}

	size_t cap = n * bound + 16;
	char *out = malloc(cap), *out2 = malloc(cap);
	if (!out || !out2)
		abort();
	size_t m = stream_decode(t, ids, n, dflags, out, cap);

	/* nx_tok_decode of the in-range ids gives the same text. */
	size_t n2 = 0;
	for (size_t i = 0; i < n; i++)
		if (ids[i] >= 0 && ids[i] < n_vocab)
			ids2[n2++] = ids[i];
	size_t m2 = 0;
	err.msg[0] = 0;
	FUZZ_CHECK(nx_tok_decode(t, ids2, n2, dflags, out2, cap, &m2, &err) == 0, "decode failed: %s", err.msg);
	FUZZ_CHECK(m2 == m && !memcmp(out, out2, m), "streamed decode (%zu bytes) != nx_tok_decode (%zu bytes)", m, m2);
	if (m2 > 0) { /* too small a buffer: the call fails and says how much it needs */
		size_t m3 = 0;
		FUZZ_CHECK(nx_tok_decode(t, ids2, n2, dflags, out2, m2 - 1, &m3, &err) != 0 && m3 == m2,
			   "decode into %zu bytes of %zu: needed %zu", m2 - 1, m2, m3);
	}

	/* Round trip: what was encoded from valid text (no special parsing) decodes back. */
	if (!(fl & 32) && !special && fuzz_utf8_valid(text, len, NULL) &&
	    !(nx_tok_kind(t) == NX_TOK_SPM && (has_u2581(text, len) || splits(t, ids, n))) &&
	    !(v == SP_BPE && has_u2581(text, len)) && v != WS) {
		size_t m4 = stream_decode(t, ids, n, NX_DETOK_STRIP, out, cap);
		FUZZ_CHECK(m4 == len && !memcmp(out, text, len),
			   "round trip through %s: %zu bytes in, %zu bytes out (\"%.*s\" -> \"%.*s\")",
			   vocab_name[v], len, m4, (int)(len < 200 ? len : 200), (const char *)text,
			   (int)(m4 < 200 ? m4 : 200), out);
	}
	free(out);
	free(out2);
	return 0;
}
