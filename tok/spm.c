/* spm.c - SentencePiece BPE (tokenizer.ggml.model = llama): spaces become U+2581,
 * adjacent pieces merge best score first, and whatever is left that is not a
 * token falls back to <0xXX> byte tokens. */
#include "tok/tok_internal.h"

#include <string.h>

struct spm_sym {
	uint32_t off, n; /* bytes of the escaped text; n = 0 once merged away */
	int32_t prev, next;
};

struct spm_cand {
	float score;
	int32_t left, right;
	uint32_t size; /* bytes of the pair when queued: stale once either side changed */
	int32_t id;
};

static bool cand_before(const struct spm_cand *a, const struct spm_cand *b)
{
	return a->score > b->score || (a->score == b->score && a->left < b->left);
}

NX_TOK_DEFINE_HEAP(struct spm_cand, cand_before)

/* Only normal pieces come out of merging: "<s>" or "<0x41>" typed as text stay text. */
static int32_t normal_tok(const struct nx_tok *t, const char *s, size_t n)
{
	int32_t id = nx_tok_map_get(t, s, n);
	return id >= 0 && t->type[id] == NX_TT_NORMAL ? id : -1;
}

static void try_pair(const struct nx_tok *t, const char *buf, const struct spm_sym *sym, int32_t l, int32_t r,
		     struct spm_cand *h, size_t *nh)
{
	if (l < 0 || r < 0)
		return;
	uint32_t size = sym[l].n + sym[r].n;
	int32_t id = normal_tok(t, buf + sym[l].off, size);
	if (id < 0)
		return;
	heap_push(h, nh, (struct spm_cand){t->score[id], l, r, size, id});
}

int nx_spm_encode(const struct nx_tok *t, const char *text, size_t len, bool space_prefix, struct nx_tok_scratch *s,
		  struct nx_emit *e, struct nx_err *err)
{
	static const char esc[3] = {'\xE2', '\x96', '\x81'}; /* U+2581 */
	if (len > UINT32_MAX / 4)
		return nx_errf(err, "tokenizer: text of %zu bytes is too long", len);
	size_t cap = 3 * (len + 1);
	if (nx_tok_grow((void **)&s->buf, &s->buf_cap, cap, 1))
		return nx_errf(err, "tokenizer: out of memory for %zu bytes of text", len);
	char *buf = s->buf;
	size_t n = 0;
	if (space_prefix) {
		memcpy(buf, esc, 3);
		n = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(buf + n, esc, 3);
			n += 3;
		} else {
			buf[n++] = text[i];
		}
	}
	if (n == 0)
		return 0;

	/* one symbol per UTF-8 character (a stray byte is a character of its own) */
	if (nx_tok_grow(&s->sym, &s->sym_cap, n, sizeof(struct spm_sym)) ||
	    nx_tok_grow(&s->heap, &s->heap_cap, 3 * n, sizeof(struct spm_cand)))
		return nx_errf(err, "tokenizer: out of memory for %zu bytes of text", len);
	struct spm_sym *sym = s->sym;
	struct spm_cand *heap = s->heap;
	int32_t n_sym = 0;
	for (size_t i = 0; i < n;) {
		static const uint8_t clen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
		size_t l = clen[(uint8_t)buf[i] >> 4];
		if (l > n - i)
			l = n - i;
		sym[n_sym] = (struct spm_sym){(uint32_t)i, (uint32_t)l, n_sym - 1, n_sym + 1};
		n_sym++;
		i += l;
	}
	sym[n_sym - 1].next = -1;

	size_t nh = 0;
	for (int32_t i = 1; i < n_sym; i++)
		try_pair(t, buf, sym, i - 1, i, heap, &nh);
	while (nh > 0) {
		struct spm_cand c = heap_pop(heap, &nh);
		struct spm_sym *l = &sym[c.left], *r = &sym[c.right];
		if (l->n == 0 || r->n == 0 || l->n + r->n != c.size || l->next != c.right)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			sym[r->next].prev = c.left;
		try_pair(t, buf, sym, l->prev, c.left, heap, &nh);
		try_pair(t, buf, sym, c.left, l->next, heap, &nh);
	}

	for (int32_t i = 0; i >= 0; i = sym[i].next) {
		int32_t id = normal_tok(t, buf + sym[i].off, sym[i].n);
		if (id >= 0) {
			nx_emit(e, id);
			continue;
		}
		/* byte fallback; a character without byte tokens is one <unk> */
		bool bytes = true;
		for (uint32_t j = 0; j < sym[i].n; j++)
			bytes = bytes && t->byte_tok[(uint8_t)buf[sym[i].off + j]] >= 0;
		if (!bytes) {
			if (t->unk >= 0)
				nx_emit(e, t->unk);
			continue;
		}
		for (uint32_t j = 0; j < sym[i].n; j++)
			nx_emit(e, t->byte_tok[(uint8_t)buf[sym[i].off + j]]);
	}
	return 0;
}
