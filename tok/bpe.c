/* bpe.c - byte-level BPE (tokenizer.ggml.model = gpt2): GPT-2's byte stand-in
 * characters, merge ranks from tokenizer.ggml.merges, and the merge loop run on
 * each pre-tokenized piece with a heap of candidate pairs. */
#include "tok/tok_internal.h"

#include <pthread.h>
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
	return nx_pretok_init(&t->pre, t->pre_name, &t->ignore_merges, &t->add_bos, err);
oom:
	free(cat);
	free(ms);
	return nx_errf(err, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
}

struct bpe_sym {
	int32_t id; /* -1: byte without a token (dropped); -2: merged into its left neighbour */
	int32_t prev, next;
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

/* Merges one pre-tokenized piece w[0..n) and emits its tokens. */
static int bpe_word(const struct nx_tok *t, const uint8_t *w, size_t n, struct nx_tok_scratch *s, struct nx_emit *e,
		    struct nx_err *err)
{
	if (t->ignore_merges) {
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
	size_t nh = 0;
	for (size_t i = 0; i < n; i++)
		sym[i] = (struct bpe_sym){t->byte_tok[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
	for (size_t i = 1; i < n; i++)
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
	for (int32_t i = 0; i >= 0; i = sym[i].next)
		if (sym[i].id >= 0)
			nx_emit(e, sym[i].id);
	return 0;
}

int nx_bpe_encode(const struct nx_tok *t, const char *text, size_t len, struct nx_tok_scratch *s, struct nx_emit *e,
		  struct nx_err *err)
{
	struct nx_span *sp;
	size_t n_sp;
	if (nx_pretok_split(&t->pre, text, len, s, &sp, &n_sp, err))
		return -1;
	for (size_t i = 0; i < n_sp; i++)
		if (bpe_word(t, (const uint8_t *)text + sp[i].off, sp[i].len, s, e, err))
			return -1;
	return 0;
}
