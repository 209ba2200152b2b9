/* bpe.c - BPE (tokenizer.ggml.model = gpt2, gemma4, whitespace): GPT-2's byte
 * stand-in characters or (SentencePiece-style, NX_PRE_RAW_UTF8) the text's own
 * UTF-8 characters with <0xXX> fallback, merge ranks from tokenizer.ggml.merges,
 * and the merge loop run on each pre-tokenized piece with a heap of candidate pairs. */
#include "tok/tok_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the
 * other 68 take the code points from 256 on, in byte order. */
static uint32_t byte_cp(uint8_t b)
{
	if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))
		return b;
	uint32_t n = 0;
	for (uint32_t c = 0; c < b; c++)
		if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE)))
			n++;
	return 256 + n;
}

/* Encodes cp (< 0x800) as UTF-8 into out; returns its length. */
static size_t cp_utf8(uint32_t cp, char *out)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xC0 | (cp >> 6));
	out[1] = (char)(0x80 | (cp & 0x3F));
	return 2;
}

/* Inverse of byte_cp for code points < 512, built once. */
static int16_t cp_byte[512];
static pthread_once_t cp_byte_once = PTHREAD_ONCE_INIT;

static void cp_byte_init(void)
{
	for (int i = 0; i < 512; i++)
		cp_byte[i] = -1;
	for (int b = 0; b < 256; b++)
		cp_byte[byte_cp((uint8_t)b)] = (int16_t)b;
}

size_t nx_bpe_unmap(const char *text, size_t len, char *out)
{
	pthread_once(&cp_byte_once, cp_byte_init);
	const uint8_t *s = (const uint8_t *)text;
	size_t n = 0;
	for (size_t i = 0; i < len;) {
		uint32_t cp = s[i];
		size_t l = 1;
		if (cp >= 0xC0 && cp < 0xE0 && i + 1 < len && (s[i + 1] & 0xC0) == 0x80) {
			cp = ((cp & 0x1F) << 6) | (s[i + 1] & 0x3F);
			l = 2;
		}
		if (cp < 512 && cp_byte[cp] >= 0 && (l == 2 || cp < 0x80)) {
			out[n++] = (char)cp_byte[cp];
		} else {
			/* not a stand-in character: keep its bytes (a token that was not byte-mapped) */
			memcpy(out + n, s + i, l);
			n += l;
		}
		i += l;
	}
	return n;
}

static uint32_t pair_hash(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return (uint32_t)k;
}

static void pair_put(struct nx_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (uint32_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
		if (m->key[i] == k)
			return; /* the first (lowest) rank of a repeated merge wins */
		if (m->key[i] == UINT64_MAX) {
			m->key[i] = k;
			m->rank[i] = rank;
			m->merged[i] = merged;
			return;
		}
	}
}

static bool pair_get(const struct nx_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged)
{
	if (!m->key)
		return false;
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (uint32_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
		if (m->key[i] == k) {
			*rank = m->rank[i];
			*merged = m->merged[i];
			return true;
		}
		if (m->key[i] == UINT64_MAX)
			return false;
	}
}

int nx_bpe_load(struct nx_tok *t, const struct gguf_file *g, struct nx_err *err)
{
	for (int b = 0; b < 256; b++) {
		char u[2];
		size_t n = cp_utf8(byte_cp((uint8_t)b), u);
		t->byte_tok[b] = nx_tok_map_get(t, u, n);
	}

	const struct gguf_value *mv = gguf_get(g, "tokenizer.ggml.merges");
	if (!mv)
		return nx_errf(err, "tokenizer: gpt2 vocabulary without tokenizer.ggml.merges");
	if (mv->type != GGUF_ARRAY || mv->arr.type != GGUF_STRING)
		return nx_errf(err, "tokenizer: tokenizer.ggml.merges is not an array of strings");
	uint64_t n = mv->arr.n;
	if (n > INT32_MAX / 4)
		return nx_errf(err, "tokenizer: tokenizer.ggml.merges has %llu entries", (unsigned long long)n);
	struct gguf_str *ms = calloc(n ? n : 1, sizeof(*ms));
	if (!ms)
		return nx_errf(err, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
	if (n && gguf_arr_strings(mv, ms)) {
		free(ms);
		return nx_errf(err, "tokenizer: tokenizer.ggml.merges: bad string array");
	}
	uint32_t slots = 16;
	while (slots < 2 * n)
		slots <<= 1;
	t->merges.mask = slots - 1;
	t->merges.key = malloc(slots * sizeof(uint64_t));
	t->merges.rank = malloc(slots * sizeof(int32_t));
	t->merges.merged = malloc(slots * sizeof(int32_t));
	char *cat = NULL;
	size_t cat_cap = 0;
	if (!t->merges.key || !t->merges.rank || !t->merges.merged)
		goto oom;
	memset(t->merges.key, 0xFF, slots * sizeof(uint64_t));

	for (uint64_t i = 0; i < n; i++) {
		const char *s = ms[i].p;
		size_t len = ms[i].len;
		/* "left right", split at the first space after the first byte (a
		 * stand-in never is a plain space, but llama.cpp splits this way too) */
		const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
		if (!sp)
			continue;
		size_t ll = (size_t)(sp - s), rl = len - ll - 1;
		int32_t a = nx_tok_map_get(t, s, ll), b = nx_tok_map_get(t, sp + 1, rl);
		if (a < 0 || b < 0)
			continue; /* can never apply: symbols are always vocabulary tokens */
		if (ll + rl > cat_cap) {
			char *c = realloc(cat, ll + rl);
			if (!c)
				goto oom;
			cat = c;
			cat_cap = ll + rl;
		}
		memcpy(cat, s, ll);
		memcpy(cat + ll, sp + 1, rl);
		int32_t m = nx_tok_map_get(t, cat, ll + rl);
		if (m < 0)
			continue;
		pair_put(&t->merges, a, b, (int32_t)i, m);
	}
	free(cat);
	free(ms);
	if (nx_pretok_init(&t->pre, t->pre_name, &t->ignore_merges, &t->add_bos, err))
		return -1;
	if (t->pre.flags & NX_PRE_RAW_UTF8) {
		/* no byte stand-ins: a byte falls back to its <0xXX> token, as SentencePiece's */
		for (int b = 0; b < 256; b++) {
			char hex[8];
			snprintf(hex, sizeof(hex), "<0x%02X>", b);
			t->byte_tok[b] = nx_tok_map_get(t, hex, strlen(hex));
		}
	}
	return 0;
oom:
	free(cat);
	free(ms);
	return nx_errf(err, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
}

struct bpe_sym {
	int32_t id; /* -1: byte or character without a token; -2: merged into its left neighbour */
	int32_t prev, next;
	uint32_t off, len; /* its bytes in the piece (NX_PRE_RAW_UTF8: for the <0xXX> fallback) */
};

struct bpe_cand {
	int32_t rank;
	int32_t left, right;
	int32_t lid, rid; /* the ids the pair had when queued: stale once either changed */
	int32_t merged;
};

static bool cand_before(const struct bpe_cand *a, const struct bpe_cand *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

NX_TOK_DEFINE_HEAP(struct bpe_cand, cand_before)

static void try_pair(const struct nx_tok *t, struct bpe_sym *sym, int32_t l, int32_t r, struct bpe_cand *h, size_t *nh)
{
	if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0)
		return;
	int32_t rank, merged;
	if (!pair_get(&t->merges, sym[l].id, sym[r].id, &rank, &merged))
		return;
	heap_push(h, nh, (struct bpe_cand){rank, l, r, sym[l].id, sym[r].id, merged});
}

/* Length of the valid UTF-8 sequence at s[0..n), or 1 for a byte that does not start one. */
static size_t utf8_seq(const uint8_t *s, size_t n)
{
	uint8_t c = s[0];
	size_t len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
	if (len <= 1 || len > n)
		return 1;
	uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
	if (s[1] < lo || s[1] > hi)
		return 1;
	for (size_t k = 2; k < len; k++)
		if ((s[k] & 0xC0) != 0x80)
			return 1;
	return len;
}

/* Merges one pre-tokenized piece w[0..n) and emits its tokens. */
static int bpe_word(const struct nx_tok *t, const uint8_t *w, size_t n, struct nx_tok_scratch *s, struct nx_emit *e,
		    struct nx_err *err)
{
	bool raw = t->pre.flags & NX_PRE_RAW_UTF8;
	if (t->pre.flags & NX_PRE_NEWLINE_RUNS) {
		size_t k = 0;
		while (k < n && w[k] == '\n')
			k++;
		int32_t id = k == n ? nx_tok_map_get(t, (const char *)w, n) : -1;
		if (id >= 0) {
			nx_emit(e, id);
			return 0;
		}
	}
	if (t->ignore_merges && raw) {
		int32_t id = nx_tok_map_get(t, (const char *)w, n);
		if (id >= 0) {
			nx_emit(e, id);
			return 0;
		}
	} else if (t->ignore_merges) {
		/* the whole piece in stand-in characters, if it is one token */
		if (nx_tok_grow((void **)&s->buf, &s->buf_cap, 2 * n, 1))
			return nx_errf(err, "tokenizer: out of memory");
		size_t m = 0;
		for (size_t i = 0; i < n; i++)
			m += cp_utf8(byte_cp(w[i]), s->buf + m);
		int32_t id = nx_tok_map_get(t, s->buf, m);
		if (id >= 0) {
			nx_emit(e, id);
			return 0;
		}
	}
	if (nx_tok_grow(&s->sym, &s->sym_cap, n, sizeof(struct bpe_sym)) ||
	    nx_tok_grow(&s->heap, &s->heap_cap, 3 * n, sizeof(struct bpe_cand)))
		return nx_errf(err, "tokenizer: out of memory");
	struct bpe_sym *sym = s->sym;
	struct bpe_cand *heap = s->heap;
	size_t nh = 0, n_sym = 0;
	for (size_t i = 0; i < n;) {
		size_t len = raw ? utf8_seq(w + i, n - i) : 1;
		int32_t id = raw ? nx_tok_map_get(t, (const char *)w + i, len) : t->byte_tok[w[i]];
		sym[n_sym] = (struct bpe_sym){id, (int32_t)n_sym - 1, -1, (uint32_t)i, (uint32_t)len};
		if (n_sym > 0)
			sym[n_sym - 1].next = (int32_t)n_sym;
		n_sym++;
		i += len;
	}
	for (size_t i = 1; i < n_sym; i++)
		try_pair(t, sym, (int32_t)i - 1, (int32_t)i, heap, &nh);
	/* Each merge queues at most two pairs, so the heap never outgrows 3n. */
	while (nh > 0) {
		struct bpe_cand c = heap_pop(heap, &nh);
		struct bpe_sym *l = &sym[c.left], *r = &sym[c.right];
		if (l->id != c.lid || r->id != c.rid || l->next != c.right)
			continue;
		l->id = c.merged;
		r->id = -2;
		l->next = r->next;
		if (r->next >= 0)
			sym[r->next].prev = c.left;
		try_pair(t, sym, l->prev, c.left, heap, &nh);
		try_pair(t, sym, c.left, l->next, heap, &nh);
	}
	for (int32_t i = 0; i >= 0; i = sym[i].next) {
		if (sym[i].id >= 0) {
			nx_emit(e, sym[i].id);
		} else if (raw) {
			/* a byte without a <0xXX> token is dropped, as llama.cpp does */
			for (uint32_t k = 0; k < sym[i].len; k++)
				if (t->byte_tok[w[sym[i].off + k]] >= 0)
					nx_emit(e, t->byte_tok[w[sym[i].off + k]]);
		}
	}
	return 0;
}

/* Pre-tokenizes and merges text with no whitespace to drop. */
static int bpe_segment(const struct nx_tok *t, const char *text, size_t len, struct nx_tok_scratch *s,
		       struct nx_emit *e, struct nx_err *err)
{
	if (t->pre.flags & NX_PRE_ESCAPE_SPACES) {
		/* llama_escape_whitespace: every ' ' becomes U+2581, nothing else changes */
		if (len > SIZE_MAX / 3 || nx_tok_grow((void **)&s->esc, &s->esc_cap, 3 * len, 1))
			return nx_errf(err, "tokenizer: out of memory");
		size_t m = 0;
		for (size_t i = 0; i < len; i++) {
			if (text[i] == ' ') {
				memcpy(s->esc + m, "\xE2\x96\x81", 3);
				m += 3;
			} else {
				s->esc[m++] = text[i];
			}
		}
		text = s->esc;
		len = m;
	}
	struct nx_span *sp;
	size_t n_sp;
	if (nx_pretok_split(&t->pre, text, len, s, &sp, &n_sp, err))
		return -1;
	for (size_t i = 0; i < n_sp; i++)
		if (bpe_word(t, (const uint8_t *)text + sp[i].off, sp[i].len, s, e, err))
			return -1;
	return 0;
}

/* Unicode White_Space (llama.cpp's is_whitespace flag; Rust's char::is_whitespace). */
static bool is_white_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
	       (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
	       cp == 0x3000;
}

int nx_bpe_encode(const struct nx_tok *t, const char *text, size_t len, struct nx_tok_scratch *s, struct nx_emit *e,
		  struct nx_err *err)
{
	if (!t->drop_whitespace)
		return bpe_segment(t, text, len, s, e, err);
	/* llm_tokenizer_whitespace_session: whitespace ends a segment and is dropped */
	const uint8_t *u = (const uint8_t *)text;
	size_t start = 0;
	for (size_t i = 0; i < len;) {
		size_t l = utf8_seq(u + i, len - i);
		uint32_t cp = u[i] < 0x80 ? u[i] : UINT32_MAX; /* a stray byte is not whitespace */
		if (l == 2)
			cp = (uint32_t)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F);
		else if (l == 3)
			cp = (uint32_t)(u[i] & 0x0F) << 12 | (uint32_t)(u[i + 1] & 0x3F) << 6 | (u[i + 2] & 0x3F);
		if (l <= 3 && is_white_space(cp)) {
			if (i > start && bpe_segment(t, text + start, i - start, s, e, err))
				return -1;
			start = i + l;
		}
		i += l;
	}
	if (len > start)
		return bpe_segment(t, text + start, len - start, s, e, err);
	return 0;
}
