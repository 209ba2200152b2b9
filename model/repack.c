/* repack.c - nx_model_repack: the model's matrices into the tile kernels' packed layout, as a copy or in place. */
#include "model/repack.h"

#include <stdlib.h>
#include <string.h>

#include "kern/pack.h"

bool nx_wt_packable(const struct nx_wt *w)
{
	return w->data && nx_pack_fast(w->type) && w->n_out % NX_PACK_ROWS == 0 && w->n_in % 32 == 0 &&
	       (size_t)nx_row_size(w->type, w->n_in) == w->row_bytes;
}

/* Every matrix of the model, the embedding last (it may be the output's tensor). */
static int all_wts(struct nx_model *m, struct nx_wt **out)
{
	int n = 0;
	for (int il = 0; il < m->hp.n_layer; il++) {
		struct nx_layer *L = &m->layers[il];
		out[n++] = &L->wq;
		out[n++] = &L->wk;
		out[n++] = &L->wv;
		out[n++] = &L->wo;
		out[n++] = &L->w_gate;
		out[n++] = &L->w_up;
		out[n++] = &L->w_down;
	}
	out[n++] = &m->output;
	out[n++] = &m->tok_embd;
	return n;
}

#define MAX_WTS (7 * NX_MAX_LAYERS + 2)

/* The first of wts[0..i) with the same data as wts[i], or NULL. */
static struct nx_wt *earlier(struct nx_wt **wts, int i)
{
	for (int k = 0; k < i; k++)
		if (wts[k]->data == wts[i]->data)
			return wts[k];
	return NULL;
}

static size_t wt_bytes(const struct nx_wt *w)
{
	return (w->row_bytes * (size_t)w->n_out + 63) / 64 * 64;
}

size_t nx_model_repack_size(const struct nx_model *m)
{
	struct nx_wt *wts[MAX_WTS];
	int n = all_wts((struct nx_model *)m, wts);
	size_t total = 0;
	for (int i = 0; i < n; i++)
		if (nx_wt_packable(wts[i]) && !earlier(wts, i))
			total += wt_bytes(wts[i]);
	return total;
}

static void pack_matrix(const struct nx_wt *w, const uint8_t *src, uint8_t *dst)
{
	const size_t gbytes = NX_PACK_ROWS * w->row_bytes;
	for (int64_t g = 0; g < w->n_out / NX_PACK_ROWS; g++)
		nx_pack_group(w->type, src + (size_t)g * gbytes, w->row_bytes, dst + (size_t)g * gbytes, w->n_in);
}

int nx_model_repack(struct nx_model *m, void *dst, size_t size, struct nx_err *err)
{
	if (size < nx_model_repack_size(m) || (uintptr_t)dst % 64)
		return nx_errf(err, "repack: block of %zu bytes at %p, need %zu bytes 64-aligned", size, dst,
			       nx_model_repack_size(m));
	struct nx_wt *wts[MAX_WTS];
	int n = all_wts(m, wts);
	uint8_t *p = dst;
	for (int i = 0; i < n; i++) {
		struct nx_wt *w = wts[i], *e = earlier(wts, i);
		if (!nx_wt_packable(w))
			continue;
		if (e) {
			w->packed = e->packed;
			continue;
		}
		pack_matrix(w, w->data, p);
		w->packed = p;
		p += wt_bytes(w);
	}
	return 0;
}

int nx_model_repack_inplace(struct nx_model *m, ptrdiff_t plain_delta, struct nx_err *err)
{
	struct nx_wt *wts[MAX_WTS];
	int n = all_wts(m, wts), packed = 0;
	const void *orig[MAX_WTS];
	for (int i = 0; i < n; i++)
		orig[i] = wts[i]->data;
	for (int i = 0; i < n; i++) {
		struct nx_wt *w = wts[i];
		int e = -1;
		for (int k = 0; k < i; k++)
			if (orig[k] == orig[i])
				e = k;
		if (e >= 0) { /* the same tensor as an earlier matrix (tied output / embedding) */
			w->packed = wts[e]->packed;
			w->data = wts[e]->data;
			continue;
		}
		if (!nx_wt_packable(w))
			continue;
		const size_t gbytes = NX_PACK_ROWS * w->row_bytes;
		uint8_t *rows = malloc(gbytes);
		if (!rows)
			return nx_errf(err, "repack: out of memory (%zu bytes)", gbytes);
		uint8_t *base = (uint8_t *)(uintptr_t)w->data; /* the caller's own, writable bytes */
		for (int64_t g = 0; g < w->n_out / NX_PACK_ROWS; g++) {
			memcpy(rows, base + (size_t)g * gbytes, gbytes);
			nx_pack_group(w->type, rows, w->row_bytes, base + (size_t)g * gbytes, w->n_in);
		}
		free(rows);
		w->packed = base;
		w->data = base + plain_delta;
		packed++;
	}
	return packed;
}
