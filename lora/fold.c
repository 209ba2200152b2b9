/* fold.c - W' = quant(dequant(W) + s * B @ A), row by row, with float64 accumulation of B @ A. */
#include "lora/fold.h"
#include "lora/delta.h"
#include "kern/pack.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static bool fold_target(enum nx_type t)
{
	const struct nx_type_traits *tr = nx_type_supported(t) ? nx_type_ref(t) : NULL;
	return tr && tr->quant && tr->dequant && tr->dot;
}

int64_t nx_fold_size(const struct nx_wt *w, enum nx_type out)
{
	int64_t row = nx_row_size(out, w->n_in), total;
	if (row < 0 || __builtin_mul_overflow(row, w->n_out, &total))
		return -1;
	return total;
}

int64_t nx_fold_size_max(const struct nx_wt *w)
{
	int64_t most = 0;
	for (uint32_t t = 0; t < NX_TYPE_COUNT; t++) {
		if (!fold_target((enum nx_type)t) && t != (uint32_t)w->type)
			continue;
		int64_t n = nx_fold_size(w, (enum nx_type)t);
		if (n > 0 && nx_pack_layout((enum nx_type)t) && __builtin_mul_overflow(n, 2, &n))
			return -1;
		if (n > most)
			most = n;
	}
	return most > 0 ? most : -1;
}

int nx_fold_check(const struct nx_wt *w, const struct nx_lora_t *t, enum nx_type out, struct nx_err *err)
{
	if (!nx_type_supported(w->type))
		return nx_errf(err, "fold: base type %s cannot be read", nx_type_name(w->type));
	if (!fold_target(out))
		return nx_errf(err, "fold: cannot produce type %s", nx_type_name(out));
	if (t->n_in != w->n_in || t->n_out != w->n_out)
		return nx_errf(err, "fold: adapter for blk.%d.%s.weight is (%lld, %lld), the weight is (%lld, %lld)",
			       t->layer, nx_lora_which_gguf(t->which), (long long)t->n_out, (long long)t->n_in,
			       (long long)w->n_out, (long long)w->n_in);
	if (nx_fold_size(w, out) < 0)
		return nx_errf(err, "fold: blk.%d.%s.weight: rows of %lld elements do not fit %s blocks of %lld", t->layer,
			       nx_lora_which_gguf(t->which), (long long)w->n_in, nx_type_name(out),
			       (long long)nx_type_ref(out)->blck);
	/* The folded tensor must also be usable: its activation type must fit the rows. */
	enum nx_type vt = nx_type_ref(out)->vec_dot_type;
	if (vt != NX_F32 && nx_row_size(vt, w->n_in) < 0)
		return nx_errf(err, "fold: rows of %lld elements cannot be quantized to %s for %s dots",
			       (long long)w->n_in, nx_type_name(vt), nx_type_name(out));
	return 0;
}

size_t nx_fold_work_size(const struct nx_wt *w)
{
	return (size_t)w->n_in * (sizeof(float) + sizeof(double));
}

void nx_fold_exact_row(const struct nx_wt *w, const struct nx_lora_t *t, float s, int64_t r, float *row,
		       double *acc)
{
	const int64_t n = w->n_in, rank = t->rank;
	for (int64_t j = 0; j < n; j++)
		acc[j] = 0;
	const void *b = nx_lora_row(t->dtype, t->b, r, rank);
	double bk[64]; /* B[r, k0 ...] as doubles, a run of k at a time: the sums go on in order of k */
	for (int64_t k0 = 0; k0 < rank; k0 += 64) {
		const int m = rank - k0 < 64 ? (int)(rank - k0) : 64;
		for (int k = 0; k < m; k++)
			bk[k] = nx_lora_elt(t->dtype, b, (size_t)(k0 + k));
		nx_lora_ba_f64(t->dtype, nx_lora_row(t->dtype, t->a, k0, n), n, m, bk, acc);
	}
	nx_type_get(w->type)->dequant((const uint8_t *)w->data + (size_t)r * w->row_bytes, row, n);
	const double sd = s;
	for (int64_t j = 0; j < n; j++)
		row[j] = (float)((double)row[j] + sd * acc[j]);
}

void nx_fold_rows(const struct nx_wt *w, const struct nx_lora_t *t, float s, enum nx_type out, void *dst,
		  int64_t r0, int64_t r1, void *work)
{
	double *acc = work;
	float *row = (float *)(acc + w->n_in);
	const nx_quant_fn quant = nx_type_get(out)->quant;
	const size_t out_row = (size_t)nx_row_size(out, w->n_in);
	for (int64_t r = r0; r < r1; r++) {
		nx_fold_exact_row(w, t, s, r, row, acc);
		quant(row, (uint8_t *)dst + (size_t)r * out_row, w->n_in);
	}
}

int nx_fold_tensor(const struct nx_wt *w, const struct nx_lora_t *t, float s, enum nx_type out, void *dst,
		   struct nx_err *err)
{
	if (nx_fold_check(w, t, out, err))
		return -1;
	void *work = malloc(nx_fold_work_size(w));
	if (!work)
		return nx_errf(err, "fold: out of memory");
	nx_fold_rows(w, t, s, out, dst, 0, w->n_out, work);
	free(work);
	return 0;
}

int nx_fold_type_parse(const char *name, enum nx_type *out, struct nx_err *err)
{
	char low[16];
	size_t n = strlen(name);
	if (n < sizeof(low)) {
		for (size_t i = 0; i <= n; i++)
			low[i] = (char)tolower((unsigned char)name[i]);
		for (uint32_t t = 0; t < NX_TYPE_COUNT; t++) {
			if (fold_target((enum nx_type)t) && !strcmp(nx_type_name(t), low)) {
				*out = (enum nx_type)t;
				return 0;
			}
		}
	}
	return nx_errf(err, "fold: unknown or unsupported type '%.32s' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs)",
		       name);
}
