/* moe.c - mixture-of-experts routing (top-k of the router's softmax, the model's normalisation), grouped by expert. */
#include "model/moe.h"

#include <math.h>
#include <string.h>

void nx_moe_route(const struct nx_hparams *hp, const float *logits, int n, struct nx_moe_route *r)
{
	const int ne = hp->n_expert, k = hp->n_expert_used;
	memset(r->count, 0, (size_t)ne * sizeof(*r->count));
	for (int t = 0; t < n; t++) {
		const float *l = logits + (size_t)t * ne;
		int32_t *sel = r->tok_sel + (size_t)t * k;
		int m = 0; /* sel[0..m): the largest logits so far, largest first, the lower id first on a tie */
		for (int e = 0; e < ne; e++) {
			if (m == k && !(l[e] > l[sel[k - 1]]))
				continue;
			int j = m < k ? m++ : k - 1;
			for (; j > 0 && l[e] > l[sel[j - 1]]; j--)
				sel[j] = sel[j - 1];
			sel[j] = e;
		}
		/* the softmax over all experts (in double), at the chosen ones; over the chosen ones when normalised */
		const double mx = l[sel[0]];
		double all = 0, chosen = 0, p[NX_MOE_MAX_EXPERTS];
		for (int e = 0; e < ne; e++)
			all += exp((double)l[e] - mx);
		for (int j = 0; j < k; j++)
			chosen += p[j] = exp((double)l[sel[j]] - mx);
		const double div = hp->moe_norm_w ? chosen : all;
		for (int j = 0; j < k; j++) {
			r->tok_w[(size_t)t * k + j] = (float)(p[j] / div);
			r->count[sel[j]]++;
		}
	}
	/* the active experts in increasing id, each one's rows after the previous one's */
	int32_t fill[NX_MOE_MAX_EXPERTS], at = 0;
	r->n_active = 0;
	for (int e = 0; e < ne; e++) {
		if (!r->count[e])
			continue;
		fill[e] = at;
		r->expert[r->n_active] = e;
		r->off[r->n_active++] = at;
		at += r->count[e];
	}
	r->off[r->n_active] = at;
	for (int t = 0; t < n; t++)
		for (int j = 0; j < k; j++) {
			const int32_t row = fill[r->tok_sel[(size_t)t * k + j]]++;
			r->row_tok[row] = t;
			r->row_w[row] = r->tok_w[(size_t)t * k + j];
		}
}

struct nx_wt nx_moe_expert(const struct nx_wt *stacked, int e, int64_t rows_per_expert)
{
	struct nx_wt w = *stacked;
	const size_t at = (size_t)e * (size_t)rows_per_expert * stacked->row_bytes;
	w.n_out = rows_per_expert;
	w.data = (const uint8_t *)stacked->data + at;
	if (stacked->packed)
		w.packed = (const uint8_t *)stacked->packed + at;
	return w;
}
