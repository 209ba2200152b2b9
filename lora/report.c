/* report.c - grades folded weights and the runtime delta against the exact float64 adapted weight on probe inputs. */
#include "lora/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/splitmix.h"
#include "lora/delta.h"
#include "lora/fold.h"

double nx_grade_rel(const struct nx_grade_err *e)
{
	return e->ref_sq > 0 ? sqrt(e->sq / e->ref_sq) : 0;
}

void nx_grade_add(struct nx_grade_err *a, const struct nx_grade_err *b)
{
	a->sq += b->sq;
	a->ref_sq += b->ref_sq;
	if (b->max_abs > a->max_abs)
		a->max_abs = b->max_abs;
}

static void note(struct nx_grade_err *e, double err, double ref)
{
	e->sq += err * err;
	e->ref_sq += ref * ref;
	if (fabs(err) > e->max_abs)
		e->max_abs = fabs(err);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int nx_lora_grade_tensor(const struct nx_wt *w, const struct nx_lora_t *t, float s, const float *x, int n_x,
			 const enum nx_type *types, int n_types, struct nx_lora_grade *g, struct nx_err *err)
{
	if (n_types < 1 || n_types > NX_GRADE_MAX_TYPES || n_x < 1)
		return nx_errf(err, "report: need 1..%d fold types and at least one probe", NX_GRADE_MAX_TYPES);
	for (int i = 0; i < n_types; i++)
		if (nx_fold_check(w, t, types[i], err))
			return -1;
	if (nx_fold_check(w, t, w->type, err)) /* the noise estimate re-quantizes to the base type */
		return -1;
	memset(g, 0, sizeof(*g));
	g->layer = t->layer;
	g->which = t->which;
	g->base_type = w->type;
	g->n_types = n_types;
	memcpy(g->types, types, sizeof(*types) * (size_t)n_types);

	const int64_t n_in = w->n_in, n_out = w->n_out;
	const int rank = t->rank;
	const double sd = s;
	size_t qmax = 0;
	for (int i = 0; i < n_types; i++)
		if ((size_t)nx_row_size(types[i], n_in) > qmax)
			qmax = (size_t)nx_row_size(types[i], n_in);
	if ((size_t)nx_row_size(w->type, n_in) > qmax)
		qmax = (size_t)nx_row_size(w->type, n_in);

	double *xt = malloc(sizeof(double) * (size_t)n_in * n_x);     /* (n_in, n_x) probes, transposed */
	double *ud = malloc(sizeof(double) * (size_t)n_x * rank);     /* (n_x, rank) A @ x in float64 */
	float *ydel = calloc((size_t)n_x * n_out, sizeof(float));     /* (n_x, n_out) runtime delta */
	float *u = malloc(sizeof(float) * (size_t)n_x * rank);
	double *acc = malloc(sizeof(double) * (size_t)n_in);
	float *rowf = malloc(sizeof(float) * (size_t)n_in);            /* folded row, f32 */
	float *wb = malloc(sizeof(float) * (size_t)n_in);              /* dequant(W) row */
	float *deq = malloc(sizeof(float) * (size_t)n_in);
	double *e = malloc(sizeof(double) * (size_t)n_in);             /* exact row, float64 */
	double *d = malloc(sizeof(double) * (size_t)n_in);
	float *wp = malloc(sizeof(float) * (size_t)n_in);              /* permuted base row */
	int64_t *perm = malloc(sizeof(int64_t) * (size_t)n_in);
	uint8_t *q = malloc(qmax);
	double *y = malloc(sizeof(double) * (size_t)n_x), *dy = malloc(sizeof(double) * (size_t)n_x);
	int rc = -1;
	if (!xt || !ud || !ydel || !u || !acc || !rowf || !wb || !deq || !e || !d || !wp || !perm || !q || !y || !dy) {
		nx_errf(err, "report: out of memory");
		goto out;
	}
	for (int p = 0; p < n_x; p++)
		for (int64_t j = 0; j < n_in; j++)
			xt[j * n_x + p] = x[(size_t)p * n_in + j];
	for (int p = 0; p < n_x; p++)
		for (int k = 0; k < rank; k++) {
			double a = 0;
			for (int64_t j = 0; j < n_in; j++)
				a += (double)nx_lora_elt(t->dtype, t->a, (size_t)k * n_in + j) * x[(size_t)p * n_in + j];
			ud[(size_t)p * rank + k] = a;
		}
	/* The runtime's delta, exactly as the forward pass computes it. */
	nx_lora_delta(t, s, x, (size_t)n_in, n_x, ydel, (size_t)n_out, 0, n_out, u);
	/* One fixed permutation (Fisher-Yates) for the noise estimate. */
	uint64_t seed = 0x5eed ^ (uint64_t)n_in;
	for (int64_t j = 0; j < n_in; j++)
		perm[j] = j;
	for (int64_t j = n_in - 1; j > 0; j--) {
		int64_t k = (int64_t)(nx_splitmix64(&seed) % (uint64_t)(j + 1)), tmp = perm[j];
		perm[j] = perm[k];
		perm[k] = tmp;
	}

	const struct nx_type_traits *bt = nx_type_get(w->type);
	for (int64_t r = 0; r < n_out; r++) {
		/* The fold to types[0], timed: exactly what nx_fold_rows does for this row. */
		const struct nx_type_traits *t0 = nx_type_get(types[0]);
		double t_start = now_ms();
		nx_fold_exact_row(w, t, s, r, rowf, acc);
		t0->quant(rowf, q, n_in);
		g->fold_ms += now_ms() - t_start;

		bt->dequant((const uint8_t *)w->data + (size_t)r * w->row_bytes, wb, n_in);
		for (int64_t j = 0; j < n_in; j++)
			e[j] = (double)wb[j] + sd * acc[j];
		nx_lora_dots_f64(e, xt, n_in, n_x, y);
		for (int p = 0; p < n_x; p++) {
			double eff = 0;
			for (int k = 0; k < rank; k++)
				eff += (double)nx_lora_elt(t->dtype, t->b, (size_t)r * rank + k) * ud[(size_t)p * rank + k];
			eff *= sd;
			note(&g->effect, eff, y[p]);
			note(&g->delta, (double)ydel[(size_t)p * n_out + r] - eff, y[p]);
		}
		for (int i = 0; i < n_types; i++) {
			const struct nx_type_traits *tt = nx_type_get(types[i]);
			if (i > 0)
				tt->quant(rowf, q, n_in);
			tt->dequant(q, deq, n_in);
			for (int64_t j = 0; j < n_in; j++)
				d[j] = (double)deq[j] - e[j];
			nx_lora_dots_f64(d, xt, n_in, n_x, dy);
			for (int p = 0; p < n_x; p++)
				note(&g->fold[i], dy[p], y[p]);
		}
		/* Noise: the base type quantizing an off-grid matrix like W. */
		for (int64_t j = 0; j < n_in; j++)
			wp[j] = wb[perm[j]];
		bt->quant(wp, q, n_in);
		bt->dequant(q, deq, n_in);
		for (int64_t j = 0; j < n_in; j++) {
			d[j] = (double)deq[j] - wp[j];
			e[j] = wp[j];
		}
		nx_lora_dots_f64(d, xt, n_in, n_x, dy);
		nx_lora_dots_f64(e, xt, n_in, n_x, y);
		for (int p = 0; p < n_x; p++)
			note(&g->noise, dy[p], y[p]);
	}
	rc = 0;
out:
	free(xt), free(ud), free(ydel), free(u), free(acc), free(rowf), free(wb), free(deq), free(e), free(d);
	free(wp), free(perm), free(q), free(y), free(dy);
	return rc;
}

/* ---------------------------------------------------------------- probes */

static void rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
	double ss = 0;
	for (int64_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float r = (float)(1.0 / sqrt(ss / n + eps));
	for (int64_t i = 0; i < n; i++)
		out[i] = x[i] * r * w[i];
}

/* y = W x for all rows of W, dequantizing one row at a time into tmp (n_in floats). */
static void matvec(const struct nx_wt *w, const float *x, float *y, float *tmp)
{
	const struct nx_type_traits *tr = nx_type_get(w->type);
	for (int64_t r = 0; r < w->n_out; r++) {
		tr->dequant((const uint8_t *)w->data + (size_t)r * w->row_bytes, tmp, w->n_in);
		double a = 0;
		for (int64_t j = 0; j < w->n_in; j++)
			a += (double)tmp[j] * x[j];
		y[r] = (float)a;
	}
}

/* Normed embedding of a random token with the given norm weights. */
static void normed_token(const struct nx_model *m, const float *norm, uint64_t *seed, float *emb, float *out)
{
	const struct nx_wt *e = &m->tok_embd;
	int64_t tok = (int64_t)(nx_splitmix64(seed) % (uint64_t)e->n_out);
	nx_type_get(e->type)->dequant((const uint8_t *)e->data + (size_t)tok * e->row_bytes, emb, e->n_in);
	rmsnorm(out, emb, norm, e->n_in, m->hp.norm_eps);
}

int nx_lora_probe(const struct nx_model *m, int layer, enum nx_lora_which which, int n, uint64_t seed, float *x,
		  struct nx_err *err)
{
	const struct nx_wt *w = nx_lora_base(m, layer, which);
	if (!w)
		return nx_errf(err, "report: no matrix %d of layer %d", (int)which, layer);
	const struct nx_layer *L = &m->layers[layer];
	const int64_t dim = m->hp.dim, n_in = w->n_in;
	/* room for any matvec output here: gate / up (n_ff), V (kv heads of key_length, which can exceed both) */
	const int64_t kv = (int64_t)m->hp.n_head_kv * m->hp.head_dim, big0 = m->hp.n_ff > dim ? m->hp.n_ff : dim;
	const int64_t big = kv > big0 ? kv : big0;
	float *emb = malloc(sizeof(float) * (size_t)dim), *xn = malloc(sizeof(float) * (size_t)dim);
	float *g = malloc(sizeof(float) * (size_t)big), *u = malloc(sizeof(float) * (size_t)big);
	float *tmp = malloc(sizeof(float) * (size_t)(big > n_in ? big : n_in));
	if (!emb || !xn || !g || !u || !tmp) {
		free(emb), free(xn), free(g), free(u), free(tmp);
		return nx_errf(err, "report: out of memory");
	}
	uint64_t s = seed * 0x100000001b3ull + (uint64_t)layer * 7 + (uint64_t)which;
	for (int p = 0; p < n; p++) {
		float *xp = x + (size_t)p * n_in;
		switch (which) {
		case NX_LORA_Q:
		case NX_LORA_K:
		case NX_LORA_V:
			normed_token(m, L->attn_norm, &s, emb, xp);
			break;
		case NX_LORA_GATE:
		case NX_LORA_UP:
			normed_token(m, L->ffn_norm, &s, emb, xp);
			break;
		case NX_LORA_O: {
			/* Attention output: per query head, a softmax mix of the values of 4 tokens
			 * (query head h reads kv head h / (n_head / n_head_kv)). */
			const int hd = m->hp.head_dim, group = m->hp.n_head / m->hp.n_head_kv;
			double wsum = 0, wts[4];
			for (int j = 0; j < 4; j++)
				wsum += wts[j] = exp(2.0 * ((double)(nx_splitmix64(&s) >> 11) / 9007199254740992.0));
			for (int64_t i = 0; i < n_in; i++)
				xp[i] = 0;
			for (int j = 0; j < 4; j++) {
				normed_token(m, L->attn_norm, &s, emb, xn);
				matvec(&L->wv, xn, g, tmp);
				for (int h = 0; h < m->hp.n_head; h++)
					for (int i = 0; i < hd; i++)
						xp[(size_t)h * hd + i] += (float)(wts[j] / wsum) * g[(size_t)(h / group) * hd + i];
			}
			break;
		}
		case NX_LORA_DOWN:
			normed_token(m, L->ffn_norm, &s, emb, xn);
			matvec(&L->w_gate, xn, g, tmp);
			matvec(&L->w_up, xn, u, tmp);
			for (int64_t i = 0; i < n_in; i++)
				xp[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
			break;
		default:
			break;
		}
	}
	free(emb), free(xn), free(g), free(u), free(tmp);
	return 0;
}
