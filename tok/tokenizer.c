/* tokenizer.c - loading a GGUF vocabulary, special-token splitting, the encode
 * entry point, token pieces and the streaming detokenizer. */
#include "tok/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

int nx_tok_grow(void **p, size_t *cap, size_t n, size_t sz)
{
	if (n <= *cap)
		return 0;
	size_t want = *cap ? *cap : 64;
	while (want < n)
		want *= 2;
	if (want > SIZE_MAX / sz)
		return -1;
	void *q = realloc(*p, want * sz);
	if (!q)
		return -1;
	*p = q;
	*cap = want;
	return 0;
}

static void scratch_free(struct nx_tok_scratch *s)
{
	free(s->span);
	free(s->sym);
	free(s->heap);
	free(s->buf);
	free(s->esc);
	if (s->md)
		pcre2_match_data_free(s->md);
}

uint32_t nx_tok_hash(const void *p, size_t n)
{
	/* FNV-1a, then a final mix so the low bits used as the slot index vary */
	const uint8_t *s = p;
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ s[i]) * 16777619u;
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	return h;
}

int32_t nx_tok_map_get(const struct nx_tok *t, const char *s, size_t n)
{
	const struct nx_strmap *m = &t->map;
	for (uint32_t i = nx_tok_hash(s, n) & m->mask;; i = (i + 1) & m->mask) {
		int32_t id = m->slot[i];
		if (id < 0)
			return -1;
		size_t len;
		const char *txt = nx_tok_str(t, id, &len);
		if (len == n && memcmp(txt, s, n) == 0)
			return id;
	}
}

static bool is_control_like(uint8_t type)
{
	return type == NX_TT_CONTROL || type == NX_TT_UNKNOWN || type == NX_TT_UNUSED;
}

/* ------------------------------------------------------------------- load */

/* Copies the vocabulary texts and builds the text -> id map. */
static int load_vocab(struct nx_tok *t, const struct gguf_file *g, struct nx_err *err)
{
	const struct gguf_value *v = gguf_get(g, "tokenizer.ggml.tokens");
	if (!v)
		return nx_errf(err, "tokenizer: missing tokenizer.ggml.tokens");
	if (v->type != GGUF_ARRAY || v->arr.type != GGUF_STRING)
		return nx_errf(err, "tokenizer: tokenizer.ggml.tokens is not an array of strings");
	if (v->arr.n == 0 || v->arr.n > (1u << 24))
		return nx_errf(err, "tokenizer: tokenizer.ggml.tokens has %llu entries", (unsigned long long)v->arr.n);
	int32_t n = (int32_t)v->arr.n;
	t->n_vocab = n;

	struct gguf_str *strs = calloc((size_t)n, sizeof(*strs));
	if (!strs)
		return nx_errf(err, "tokenizer: out of memory for %d tokens", n);
	if (gguf_arr_strings(v, strs)) {
		free(strs);
		return nx_errf(err, "tokenizer: tokenizer.ggml.tokens: bad string array");
	}
	uint64_t total = 0;
	for (int32_t i = 0; i < n; i++)
		total += strs[i].len;
	if (total > UINT32_MAX / 2) {
		free(strs);
		return nx_errf(err, "tokenizer: tokenizer.ggml.tokens holds %llu bytes of text", (unsigned long long)total);
	}
	uint32_t slots = 16;
	while (slots < 2 * (uint32_t)n)
		slots <<= 1;
	t->text = malloc(total ? total : 1);
	t->text_off = malloc(((size_t)n + 1) * sizeof(uint32_t));
	t->map.slot = malloc(slots * sizeof(int32_t));
	if (!t->text || !t->text_off || !t->map.slot) {
		free(strs);
		return nx_errf(err, "tokenizer: out of memory for %d tokens", n);
	}
	t->map.mask = slots - 1;
	memset(t->map.slot, 0xFF, slots * sizeof(int32_t));
	uint32_t off = 0;
	for (int32_t i = 0; i < n; i++) {
		t->text_off[i] = off;
		if (strs[i].len)
			memcpy(t->text + off, strs[i].p, strs[i].len);
		off += (uint32_t)strs[i].len;
	}
	t->text_off[n] = off;
	free(strs);

	for (int32_t i = 0; i < n; i++) {
		size_t len;
		const char *s = nx_tok_str(t, i, &len);
		if (len == 0)
			continue; /* an empty text can never be looked up */
		uint32_t h = nx_tok_hash(s, len) & t->map.mask;
		for (;; h = (h + 1) & t->map.mask) {
			int32_t o = t->map.slot[h];
			if (o < 0) {
				t->map.slot[h] = i;
				break;
			}
			size_t ol;
			const char *os = nx_tok_str(t, o, &ol);
			if (ol == len && memcmp(os, s, len) == 0)
				return nx_errf(err, "tokenizer: tokenizer.ggml.tokens: ids %d and %d have the same text", o, i);
		}
	}
	return 0;
}

/* Reads an optional per-token array (token_type, scores) of at least n_vocab
 * elements. Returns its data (NULL when absent) and its element type. */
static int get_per_token(const struct gguf_file *g, const char *key, int32_t n, enum gguf_vtype a, enum gguf_vtype b,
			 const uint8_t **data, enum gguf_vtype *type, struct nx_err *err)
{
	const struct gguf_value *v = gguf_get(g, key);
	*data = NULL;
	if (!v)
		return 0;
	if (v->type != GGUF_ARRAY || (v->arr.type != a && v->arr.type != b))
		return nx_errf(err, "tokenizer: %s has the wrong type", key);
	if (v->arr.n < (uint64_t)n)
		return nx_errf(err, "tokenizer: %s has %llu entries for %d tokens", key, (unsigned long long)v->arr.n, n);
	*data = v->arr.data;
	*type = v->arr.type;
	return 0;
}

static int load_types_scores(struct nx_tok *t, const struct gguf_file *g, struct nx_err *err)
{
	int32_t n = t->n_vocab;
	t->type = malloc((size_t)n);
	t->score = malloc((size_t)n * sizeof(float));
	t->eog = calloc((size_t)n, 1);
	if (!t->type || !t->score || !t->eog)
		return nx_errf(err, "tokenizer: out of memory for %d tokens", n);

	const uint8_t *d;
	enum gguf_vtype vt;
	if (get_per_token(g, "tokenizer.ggml.token_type", n, GGUF_I32, GGUF_I32, &d, &vt, err))
		return -1;
	for (int32_t i = 0; i < n; i++) {
		int32_t ty = NX_TT_NORMAL;
		if (d)
			memcpy(&ty, d + 4 * (size_t)i, 4); /* the file need not align it */
		/* anything outside the known types is read as a normal token */
		t->type[i] = ty >= NX_TT_NORMAL && ty <= NX_TT_BYTE ? (uint8_t)ty : NX_TT_NORMAL;
	}
	if (get_per_token(g, "tokenizer.ggml.scores", n, GGUF_F32, GGUF_I32, &d, &vt, err))
		return -1;
	for (int32_t i = 0; i < n; i++) {
		float f = 0.0f;
		if (d && vt == GGUF_F32) {
			memcpy(&f, d + 4 * (size_t)i, 4);
		} else if (d) {
			int32_t k;
			memcpy(&k, d + 4 * (size_t)i, 4);
			f = (float)k;
		}
		t->score[i] = f;
	}
	return 0;
}

/* An optional token id key: absent or out of range keeps *id. */
static int get_id(const struct gguf_file *g, const char *key, int32_t n, int32_t *id, struct nx_err *err)
{
	uint32_t v;
	if (!gguf_get(g, key))
		return 0;
	if (gguf_get_u32(g, key, &v, false, err))
		return nx_err_prefix(err, "tokenizer");
	if (v < (uint32_t)n)
		*id = (int32_t)v;
	return 0;
}

static int get_flag(const struct gguf_file *g, const char *key, bool *out, struct nx_err *err)
{
	if (!gguf_get(g, key))
		return 0;
	if (gguf_get_bool(g, key, out, false, err))
		return nx_err_prefix(err, "tokenizer");
	return 0;
}

/* Texts that end a turn, best first: the EOT when the file names none
 * (llama.cpp's list, in an order that prefers the chat-turn marker). */
static const char *const eot_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
	"<EOT>", "_<EOT>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "<end_of_utterance>",
};
/* Texts that end generation wherever they appear. */
static const char *const eog_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
	"<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
	"<eos>", "<turn|>", "<|tool_response>", /* Gemma 4's, as llama.cpp lists them */
};

static int32_t find_cstr(const struct nx_tok *t, const char *s)
{
	return nx_tok_map_get(t, s, strlen(s));
}

static int load_specials(struct nx_tok *t, const struct gguf_file *g, struct nx_err *err)
{
	int32_t n = t->n_vocab, eom = -1;
	if (t->kind == NX_TOK_SPM) {
		/* SentencePiece's fixed layout, when the file does not say */
		t->unk = 0;
		t->bos = n > 1 ? 1 : -1;
		t->eos = n > 2 ? 2 : -1;
	}
	if (get_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos, err) ||
	    get_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos, err) ||
	    get_id(g, "tokenizer.ggml.eot_token_id", n, &t->eot, err) ||
	    get_id(g, "tokenizer.ggml.eom_token_id", n, &eom, err) ||
	    get_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk, err))
		return -1;

	if (t->eot < 0) {
		for (size_t i = 0; i < sizeof(eot_texts) / sizeof(eot_texts[0]) && t->eot < 0; i++)
			t->eot = find_cstr(t, eot_texts[i]);
	}
	for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++) {
		int32_t id = find_cstr(t, eog_texts[i]);
		if (id >= 0)
			t->eog[id] = 1;
	}
	if (t->eos >= 0)
		t->eog[t->eos] = 1;
	if (t->eot >= 0)
		t->eog[t->eot] = 1;
	if (eom >= 0)
		t->eog[eom] = 1;
	/* an end marker typed as a normal token is a conversion slip: treat it as
	 * control so it never prints and parse_special finds it (as llama.cpp does) */
	for (int32_t i = 0; i < n; i++)
		if (t->eog[i] && (t->type[i] == NX_TT_NORMAL))
			t->type[i] = NX_TT_CONTROL;

	if (gguf_get(g, "tokenizer.ggml.add_bos_token")) {
		if (get_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err))
			return -1;
		if (t->add_bos && t->bos < 0)
			return nx_errf(err, "tokenizer: tokenizer.ggml.add_bos_token is true but there is no BOS token");
	} else if (t->bos < 0) {
		t->add_bos = false; /* a default that cannot apply */
	}
	return 0;
}

/* Byte trie over the texts split out of the input before tokenizing. */
static int build_trie(struct nx_tok *t, struct nx_err *err)
{
	size_t cap = 1;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		uint8_t ty = t->type[i];
		if (ty == NX_TT_CONTROL || ty == NX_TT_UNKNOWN || ty == NX_TT_USER)
			cap += t->text_off[i + 1] - t->text_off[i];
	}
	if (cap > INT32_MAX)
		return nx_errf(err, "tokenizer: special token texts too long");
	t->trie = malloc(cap * sizeof(*t->trie));
	if (!t->trie)
		return nx_errf(err, "tokenizer: out of memory for the special-token trie");
	t->trie[0] = (struct nx_trie_node){-1, -1, -1, 0};
	t->n_trie = 1;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		uint8_t ty = t->type[i];
		if (ty != NX_TT_CONTROL && ty != NX_TT_UNKNOWN && ty != NX_TT_USER)
			continue;
		size_t len;
		const uint8_t *s = (const uint8_t *)nx_tok_str(t, i, &len);
		if (len == 0)
			continue;
		int32_t node = 0;
		for (size_t k = 0; k < len; k++) {
			int32_t c = t->trie[node].child;
			while (c >= 0 && t->trie[c].byte != s[k])
				c = t->trie[c].sibling;
			if (c < 0) {
				c = t->n_trie++;
				t->trie[c] = (struct nx_trie_node){-1, t->trie[node].child, -1, s[k]};
				t->trie[node].child = c;
			}
			node = c;
		}
		t->trie[node].id = i;
	}
	return 0;
}

/* "<0xXX>" -> XX; -1 when text is not a byte token's text. */
static int byte_token_value(const char *s, size_t len)
{
	int v = 0;
	if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	for (int k = 3; k < 5; k++) {
		char c = s[k];
		if (c >= '0' && c <= '9')
			v = v * 16 + (c - '0');
		else if (c >= 'A' && c <= 'F')
			v = v * 16 + (c - 'A' + 10);
		else if (c >= 'a' && c <= 'f')
			v = v * 16 + (c - 'a' + 10);
		else
			return -1;
	}
	return v;
}

/* Decoded bytes of every token, computed once so nx_tok_piece is a lookup. */
static int build_pieces(struct nx_tok *t, struct nx_err *err)
{
	int32_t n = t->n_vocab;
	size_t total = t->text_off[n]; /* decoding never lengthens a text */
	t->piece = malloc(total ? total : 1);
	t->piece_off = malloc(((size_t)n + 1) * sizeof(uint32_t));
	if (!t->piece || !t->piece_off)
		return nx_errf(err, "tokenizer: out of memory for token pieces");
	uint32_t off = 0;
	t->max_piece = 0;
	for (int32_t i = 0; i < n; i++) {
		size_t len;
		const char *s = nx_tok_str(t, i, &len);
		char *o = t->piece + off;
		size_t m = 0;
		uint8_t ty = t->type[i];
		/* SentencePiece-style BPE decodes <0xXX> by its text, as HF's ByteFallback
		 * decoder does: converted through get_vocab_base, those tokens are typed normal */
		bool spm_bpe = t->kind == NX_TOK_BPE && (t->pre.flags & NX_PRE_ESCAPE_SPACES);
		int byte = ty == NX_TT_BYTE || (spm_bpe && ty == NX_TT_NORMAL) ? byte_token_value(s, len) : -1;
		if (is_control_like(ty)) {
			m = 0; /* their text only with special */
		} else if (byte >= 0) {
			o[0] = (char)byte;
			m = 1;
		} else if (ty == NX_TT_USER || ty == NX_TT_BYTE) {
			memcpy(o, s, len);
			m = len;
		} else if (t->kind == NX_TOK_BPE && !(t->pre.flags & NX_PRE_RAW_UTF8)) {
			m = nx_bpe_unmap(s, len, o);
		} else if (t->kind == NX_TOK_BPE && !(t->pre.flags & NX_PRE_ESCAPE_SPACES)) {
			memcpy(o, s, len); /* raw UTF-8 pieces, spaces as themselves */
			m = len;
		} else { /* SentencePiece and SentencePiece-style BPE: U+2581 is a space */
			for (size_t k = 0; k < len;) {
				if (k + 3 <= len && memcmp(s + k, "\xE2\x96\x81", 3) == 0) {
					o[m++] = ' ';
					k += 3;
				} else {
					o[m++] = s[k++];
				}
			}
		}
		t->piece_off[i] = off;
		off += (uint32_t)m;
		if (m > t->max_piece)
			t->max_piece = m;
		if (is_control_like(ty) && len > t->max_piece)
			t->max_piece = len;
	}
	t->piece_off[n] = off;
	return 0;
}

int nx_tok_load(struct nx_tok **out, const struct gguf_file *g, struct nx_err *err)
{
	*out = NULL;
	struct nx_tok *t = calloc(1, sizeof(*t));
	char *model = NULL, *pre = NULL;
	if (!t)
		return nx_errf(err, "tokenizer: out of memory");
	t->bos = t->eos = t->eot = t->unk = -1;
	for (int b = 0; b < 256; b++)
		t->byte_tok[b] = -1;

	if (gguf_get_str(g, "tokenizer.ggml.model", &model, true, err)) {
		nx_err_prefix(err, "tokenizer");
		goto fail;
	}
	/* gemma4 and whitespace are BPE vocabularies of llama.cpp's loader with a
	 * pre-tokenizer of their own (tok/pretok.c) */
	bool gemma4 = strcmp(model, "gemma4") == 0, whitespace = strcmp(model, "whitespace") == 0;
	if (strcmp(model, "gpt2") == 0 || gemma4 || whitespace) {
		t->kind = NX_TOK_BPE;
	} else if (strcmp(model, "llama") == 0) {
		t->kind = NX_TOK_SPM;
	} else {
		nx_errf(err, "tokenizer: unknown tokenizer.ggml.model '%.64s' (supported: gpt2, llama, gemma4, whitespace)",
			model);
		goto fail;
	}
	if (gguf_get_str(g, "tokenizer.ggml.pre", &pre, false, err)) {
		nx_err_prefix(err, "tokenizer");
		goto fail;
	}
	snprintf(t->pre_name, sizeof(t->pre_name), "%s", pre && *pre ? pre : "default");
	if (gemma4) /* llama.cpp's loader sets it whatever the file says */
		snprintf(t->pre_name, sizeof(t->pre_name), "gemma4");
	if (whitespace) {
		bool lower = false;
		if (!pre || strcmp(pre, "whitespace") != 0) {
			nx_errf(err, "tokenizer: tokenizer.ggml.model 'whitespace' with tokenizer.ggml.pre '%.64s' "
				"(only 'whitespace') is not implemented", pre ? pre : "");
			goto fail;
		}
		if (get_flag(g, "tokenizer.ggml.normalizer.lowercase", &lower, err))
			goto fail;
		if (lower) {
			nx_errf(err, "tokenizer: tokenizer.ggml.normalizer.lowercase = true (lowercasing a whitespace "
				"vocabulary's text) is not implemented");
			goto fail;
		}
		t->drop_whitespace = true;
	}
	if (pre && strlen(pre) >= sizeof(t->pre_name) && t->kind == NX_TOK_BPE && !gemma4) {
		nx_errf(err, "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre '%.64s...'", pre);
		goto fail;
	}

	if (load_vocab(t, g, err) || load_types_scores(t, g, err))
		goto fail;

	if (t->kind == NX_TOK_BPE) {
		bool prefix = false;
		if (nx_bpe_load(t, g, err)) /* merges, pre-tokenizer, its add_bos default */
			goto fail;
		/* llama.cpp's BPE never prepends the U+2581 a SentencePiece-style
		 * tokenizer.json's Prepend normalizer would: refused, not ignored */
		if ((t->pre.flags & NX_PRE_ESCAPE_SPACES) &&
		    get_flag(g, "tokenizer.ggml.add_space_prefix", &prefix, err))
			goto fail;
		if (prefix) {
			nx_errf(err, "tokenizer: tokenizer.ggml.add_space_prefix = true with tokenizer.ggml.pre '%s' "
				"is not implemented", t->pre_name);
			goto fail;
		}
	} else {
		t->add_bos = true;
		t->add_space_prefix = true;
		for (int b = 0; b < 256; b++) {
			char hex[8];
			snprintf(hex, sizeof(hex), "<0x%02X>", b);
			t->byte_tok[b] = find_cstr(t, hex);
			if (t->byte_tok[b] < 0 && b < 0x80) {
				char c = (char)b;
				t->byte_tok[b] = nx_tok_map_get(t, &c, 1);
			}
		}
		if (get_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err))
			goto fail;
	}
	if (load_specials(t, g, err))
		goto fail;
	if (t->kind == NX_TOK_BPE && (t->pre.flags & NX_PRE_FORCE_BOS)) {
		if (t->bos < 0) {
			nx_errf(err, "tokenizer: tokenizer.ggml.pre '%s' always adds BOS but there is no "
				"tokenizer.ggml.bos_token_id", t->pre_name);
			goto fail;
		}
		t->add_bos = true;
	}
	if (build_trie(t, err) || build_pieces(t, err))
		goto fail;
	free(model);
	free(pre);
	*out = t;
	return 0;
fail:
	free(model);
	free(pre);
	nx_tok_free(t);
	return -1;
}

void nx_tok_free(struct nx_tok *t)
{
	if (!t)
		return;
	nx_pretok_free(&t->pre);
	free(t->merges.key);
	free(t->merges.rank);
	free(t->merges.merged);
	free(t->map.slot);
	free(t->text);
	free(t->text_off);
	free(t->score);
	free(t->type);
	free(t->eog);
	free(t->piece);
	free(t->piece_off);
	free(t->trie);
	free(t);
}

/* ----------------------------------------------------------------- encode */

/* Longest special token starting at s that may be matched; its length, 0 if none. */
static size_t special_at(const struct nx_tok *t, const uint8_t *s, size_t n, bool parse_special, int32_t *id)
{
	size_t best = 0;
	int32_t node = 0;
	for (size_t k = 0; k < n; k++) {
		int32_t c = t->trie[node].child;
		while (c >= 0 && t->trie[c].byte != s[k])
			c = t->trie[c].sibling;
		if (c < 0)
			break;
		node = c;
		int32_t tid = t->trie[node].id;
		if (tid >= 0 && (parse_special || t->type[tid] == NX_TT_USER)) {
			best = k + 1;
			*id = tid;
		}
	}
	return best;
}

static int encode_text(const struct nx_tok *t, const char *s, size_t n, bool after_special, struct nx_tok_scratch *sc,
		       struct nx_emit *e, struct nx_err *err)
{
	if (n == 0)
		return 0;
	if (t->kind == NX_TOK_BPE)
		return nx_bpe_encode(t, s, n, sc, e, err);
	return nx_spm_encode(t, s, n, t->add_space_prefix && after_special, sc, e, err);
}

int nx_tok_encode(const struct nx_tok *t, const char *text, size_t len, bool parse_special, int32_t *out,
		  size_t cap, size_t *n_out, struct nx_err *err)
{
	struct nx_emit e = {out, cap, 0};
	struct nx_tok_scratch sc = {0};
	int rc = 0;
	size_t start = 0;
	bool after_special = true; /* the start of the text counts as after a special token (SPM prefix) */
	*n_out = 0;
	if (!text && len)
		return nx_errf(err, "tokenizer: no text");
	if (len > NX_TOK_MAX_TEXT) /* symbol indices are int32 */
		return nx_errf(err, "tokenizer: text of %zu bytes is over the %u-byte limit", len, NX_TOK_MAX_TEXT);

	/* Leftmost-longest split on special texts (HF's added-token matching);
	 * the text between them is tokenized normally. */
	for (size_t i = 0; i < len;) {
		int32_t id = -1;
		size_t m = t->trie[0].child >= 0
				   ? special_at(t, (const uint8_t *)text + i, len - i, parse_special, &id)
				   : 0;
		if (m == 0) {
			i++;
			continue;
		}
		if (i > start) {
			if ((rc = encode_text(t, text + start, i - start, after_special, &sc, &e, err)))
				goto out;
		}
		nx_emit(&e, id);
		after_special = true;
		i += m;
		start = i;
	}
	if (len > start)
		rc = encode_text(t, text + start, len - start, after_special, &sc, &e, err);
out:
	scratch_free(&sc);
	if (rc)
		return rc;
	*n_out = e.n;
	if (e.n > cap)
		return nx_errf(err, "tokenizer: text needs %zu tokens, room for %zu", e.n, cap);
	return 0;
}

/* -------------------------------------------------------------- accessors */

enum nx_tok_kind nx_tok_kind(const struct nx_tok *t) { return t->kind; }
const char *nx_tok_pre_name(const struct nx_tok *t) { return t->pre_name; }
int32_t nx_tok_n_vocab(const struct nx_tok *t) { return t->n_vocab; }
int32_t nx_tok_bos(const struct nx_tok *t) { return t->bos; }
int32_t nx_tok_eos(const struct nx_tok *t) { return t->eos; }
int32_t nx_tok_eot(const struct nx_tok *t) { return t->eot; }
bool nx_tok_add_bos(const struct nx_tok *t) { return t->add_bos; }
bool nx_tok_add_space_prefix(const struct nx_tok *t) { return t->kind == NX_TOK_SPM && t->add_space_prefix; }

bool nx_tok_is_eog(const struct nx_tok *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && t->eog[id];
}

bool nx_tok_is_control(const struct nx_tok *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && t->type[id] == NX_TT_CONTROL;
}

int nx_tok_type(const struct nx_tok *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}

int32_t nx_tok_find(const struct nx_tok *t, const char *text, size_t len)
{
	return len ? nx_tok_map_get(t, text, len) : -1;
}

const char *nx_tok_text(const struct nx_tok *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->n_vocab)
		return NULL;
	return nx_tok_str(t, id, len);
}

const char *nx_tok_piece(const struct nx_tok *t, int32_t id, bool special, size_t *len)
{
	if (id < 0 || id >= t->n_vocab)
		return NULL;
	if (special && is_control_like(t->type[id]))
		return nx_tok_str(t, id, len);
	*len = t->piece_off[id + 1] - t->piece_off[id];
	return t->piece + t->piece_off[id];
}

size_t nx_tok_max_piece(const struct nx_tok *t) { return t->max_piece; }

/* ------------------------------------------------------------ detokenizer */

void nx_detok_init(struct nx_detok *d, const struct nx_tok *t, unsigned flags)
{
	memset(d, 0, sizeof(*d));
	d->tok = t;
	d->flags = flags;
	d->strip = (flags & NX_DETOK_STRIP) && nx_tok_add_space_prefix(t);
}

size_t nx_detok_bound(const struct nx_tok *t)
{
	/* every byte, pending ones included, may turn into a 3-byte U+FFFD */
	return 3 * (t->max_piece + 4);
}

static size_t put_fffd(char *o)
{
	o[0] = (char)0xEF;
	o[1] = (char)0xBF;
	o[2] = (char)0xBD;
	return 3;
}

/* Feeds one byte through the UTF-8 checker; returns the bytes written to o. */
static size_t detok_byte(struct nx_detok *d, uint8_t b, char *o)
{
	size_t n = 0;
	if (d->n_pend > 0) {
		uint8_t lo = 0x80, hi = 0xBF;
		if (d->n_pend == 1) { /* the second byte rules out overlongs and surrogates */
			switch (d->pend[0]) {
			case 0xE0: lo = 0xA0; break;
			case 0xED: hi = 0x9F; break;
			case 0xF0: lo = 0x90; break;
			case 0xF4: hi = 0x8F; break;
			}
		}
		if (b >= lo && b <= hi) {
			d->pend[d->n_pend++] = b;
			if (d->n_pend == d->need) {
				memcpy(o, d->pend, d->need);
				n = d->need;
				d->n_pend = 0;
			}
			return n;
		}
		/* the pending prefix can no longer complete; b starts afresh */
		n = put_fffd(o);
		d->n_pend = 0;
	}
	if (b < 0x80) {
		o[n++] = (char)b;
	} else if (b >= 0xC2 && b <= 0xF4) {
		d->pend[0] = b;
		d->n_pend = 1;
		d->need = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
	} else {
		n += put_fffd(o + n);
	}
	return n;
}

int nx_detok_push(struct nx_detok *d, int32_t id, char *out, size_t cap, size_t *n_out, struct nx_err *err)
{
	const struct nx_tok *t = d->tok;
	*n_out = 0;
	if (id < 0 || id >= t->n_vocab)
		return nx_errf(err, "detokenize: token id %d outside the vocabulary [0, %d)", id, t->n_vocab);
	if (cap < nx_detok_bound(t))
		return nx_errf(err, "detokenize: output buffer of %zu bytes, needs %zu", cap, nx_detok_bound(t));
	size_t len;
	const char *p = nx_tok_piece(t, id, d->flags & NX_DETOK_SPECIAL, &len);
	if (d->strip && !is_control_like(t->type[id]) && len > 0) {
		if (p[0] == ' ') {
			p++;
			len--;
		}
		d->strip = false;
	}
	size_t n = 0;
	for (size_t i = 0; i < len; i++)
		n += detok_byte(d, (uint8_t)p[i], out + n);
	*n_out = n;
	return 0;
}

size_t nx_detok_flush(struct nx_detok *d, char *out, size_t cap)
{
	if (d->n_pend == 0 || cap < 3)
		return 0;
	d->n_pend = 0;
	return put_fffd(out);
}

int nx_tok_decode(const struct nx_tok *t, const int32_t *ids, size_t n, unsigned flags, char *out, size_t cap,
		  size_t *n_out, struct nx_err *err)
{
	struct nx_detok d;
	size_t bound = nx_detok_bound(t), total = 0, k;
	char *tmp = NULL;
	nx_detok_init(&d, t, flags);
	*n_out = 0;
	for (size_t i = 0; i <= n; i++) {
		/* write in place while a whole bound fits, else through tmp */
		bool direct = cap >= total && cap - total >= bound;
		char *dst = direct ? out + total : tmp;
		if (!direct && !tmp) {
			if (!(tmp = malloc(bound))) /* bound >= 12, so a flush fits too */
				return nx_errf(err, "detokenize: out of memory");
			dst = tmp;
		}
		if (i < n) {
			if (nx_detok_push(&d, ids[i], dst, bound, &k, err)) {
				free(tmp);
				return -1;
			}
		} else {
			k = nx_detok_flush(&d, dst, bound);
		}
		if (!direct && total < cap)
			memcpy(out + total, tmp, k < cap - total ? k : cap - total);
		total += k;
	}
	free(tmp);
	*n_out = total;
	if (total > cap)
		return nx_errf(err, "detokenize: text needs %zu bytes, room for %zu", total, cap);
	return 0;
}
