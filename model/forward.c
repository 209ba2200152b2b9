/* forward.c - the batched llama/qwen2 forward pass, SPMD over bands of rows and heads. */
#include "model/forward.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- sizes */

#define ALIGN 64

static size_t round_up(size_t n, size_t a)
{
	return (n + a - 1) / a * a;
}

/* Adds round_up(n * elt, ALIGN) to *total; false on overflow. */
static bool add_buf(size_t *total, size_t n, size_t elt)
{
	size_t b;
	if (__builtin_mul_overflow(n, elt, &b) || b > SIZE_MAX - ALIGN)
		return false;
	return !__builtin_add_overflow(*total, round_up(b, ALIGN), total);
}

/* Carves the next buffer of n * elt bytes out of mem (sizes already checked). */
static void *take(uint8_t **p, size_t n, size_t elt)
{
	void *r = *p;
	*p += round_up(n * elt, ALIGN);
	return r;
}

static bool cfg_ok(const struct nx_hparams *hp, const struct nx_state_cfg *c)
{
	return hp->n_layer > 0 && hp->dim > 0 && hp->n_head > 0 && hp->n_head_kv > 0 && hp->head_dim > 0 &&
	       hp->n_ff > 0 && hp->n_vocab > 0 && c->max_batch > 0 && c->max_logits >= 0 &&
	       c->max_logits <= c->max_batch && c->n_slots > 0 && c->n_ctx > 0;
}

static int max_in(const struct nx_hparams *hp)
{
	int q_dim = hp->n_head * hp->head_dim, m = hp->dim;
	if (hp->n_ff > m)
		m = hp->n_ff;
	if (q_dim > m)
		m = q_dim;
	return m;
}

/* Walks the state layout once for both sizing and carving: mem NULL sizes it. */
static size_t state_layout(struct nx_state *s, void *mem, const struct nx_hparams *hp, const struct nx_state_cfg *c)
{
	size_t B = (size_t)c->max_batch, dim = hp->dim, q_dim = (size_t)hp->n_head * hp->head_dim,
	       kv_dim = (size_t)hp->n_head_kv * hp->head_dim, n_ff = hp->n_ff, n_vocab = hp->n_vocab;
	size_t cache;
	if (__builtin_mul_overflow((size_t)c->n_slots * hp->n_layer, (size_t)c->n_ctx, &cache) ||
	    __builtin_mul_overflow(cache, kv_dim, &cache))
		return 0;
	size_t total = 0;
	if (!add_buf(&total, B * dim, sizeof(float)) || !add_buf(&total, B * q_dim, sizeof(float)) ||
	    !add_buf(&total, B * kv_dim, sizeof(float)) || !add_buf(&total, B * kv_dim, sizeof(float)) ||
	    !add_buf(&total, B * q_dim, sizeof(float)) || !add_buf(&total, B * n_ff, sizeof(float)) ||
	    !add_buf(&total, cache, sizeof(nx_f16)) || !add_buf(&total, cache, sizeof(nx_f16)) ||
	    !add_buf(&total, (size_t)c->max_logits * n_vocab, sizeof(float)))
		return 0;
	if (mem) {
		uint8_t *p = mem;
		s->x = take(&p, B * dim, sizeof(float));
		s->q = take(&p, B * q_dim, sizeof(float));
		s->k = take(&p, B * kv_dim, sizeof(float));
		s->v = take(&p, B * kv_dim, sizeof(float));
		s->att_out = take(&p, B * q_dim, sizeof(float));
		s->hb = take(&p, B * n_ff, sizeof(float));
		s->k_cache = take(&p, cache, sizeof(nx_f16));
		s->v_cache = take(&p, cache, sizeof(nx_f16));
		s->logits = take(&p, (size_t)c->max_logits * n_vocab, sizeof(float));
	}
	return total;
}

size_t nx_state_size(const struct nx_hparams *hp, const struct nx_state_cfg *cfg)
{
	if (!cfg_ok(hp, cfg))
		return 0;
	return state_layout(NULL, NULL, hp, cfg);
}

int nx_state_init(struct nx_state *s, void *mem, size_t size, const struct nx_hparams *hp,
		  const struct nx_state_cfg *cfg, struct nx_err *err)
{
	if (!cfg_ok(hp, cfg))
		return nx_errf(err, "forward: bad state config (max_batch %d, max_logits %d, n_slots %d, n_ctx %d)",
			       cfg->max_batch, cfg->max_logits, cfg->n_slots, cfg->n_ctx);
	size_t need = state_layout(NULL, NULL, hp, cfg);
	if (need == 0)
		return nx_errf(err, "forward: state size overflows (n_slots %d x n_ctx %d)", cfg->n_slots, cfg->n_ctx);
	if (size < need || ((uintptr_t)mem % ALIGN) != 0)
		return nx_errf(err, "forward: state block of %zu bytes at %p, need %zu bytes %d-aligned", size, mem,
			       need, ALIGN);
	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	s->dim = hp->dim;
	s->q_dim = hp->n_head * hp->head_dim;
	s->kv_dim = hp->n_head_kv * hp->head_dim;
	s->n_ff = hp->n_ff;
	s->n_vocab = hp->n_vocab;
	s->n_layer = hp->n_layer;
	state_layout(s, mem, hp, cfg);
	return 0;
}

/* xq rows hold any activation type: F32 (4 bytes/element) is the widest. */
static size_t xq_stride(const struct nx_hparams *hp)
{
	return round_up((size_t)max_in(hp) * sizeof(float), ALIGN);
}

static size_t scratch_layout(struct nx_scratch *sc, void *mem, const struct nx_hparams *hp,
			     const struct nx_state_cfg *c)
{
	size_t B = (size_t)c->max_batch, total = 0;
	if (!add_buf(&total, B * max_in(hp), sizeof(float)) || !add_buf(&total, B, xq_stride(hp)) ||
	    !add_buf(&total, (size_t)c->n_ctx, sizeof(float)) || !add_buf(&total, B * hp->rope_dim, sizeof(float)))
		return 0;
	if (mem) {
		uint8_t *p = mem;
		sc->xn = take(&p, B * max_in(hp), sizeof(float));
		sc->xq = take(&p, B, xq_stride(hp));
		sc->xq_stride = xq_stride(hp);
		sc->att = take(&p, (size_t)c->n_ctx, sizeof(float));
		sc->rope = take(&p, B * hp->rope_dim, sizeof(float));
	}
	return total;
}

size_t nx_scratch_size(const struct nx_hparams *hp, const struct nx_state_cfg *cfg)
{
	if (!cfg_ok(hp, cfg))
		return 0;
	return scratch_layout(NULL, NULL, hp, cfg);
}

int nx_scratch_init(struct nx_scratch *sc, void *mem, size_t size, const struct nx_hparams *hp,
		    const struct nx_state_cfg *cfg, struct nx_err *err)
{
	if (!cfg_ok(hp, cfg))
		return nx_errf(err, "forward: bad scratch config (max_batch %d, n_ctx %d)", cfg->max_batch, cfg->n_ctx);
	size_t need = scratch_layout(NULL, NULL, hp, cfg);
	if (need == 0 || size < need || ((uintptr_t)mem % ALIGN) != 0)
		return nx_errf(err, "forward: scratch block of %zu bytes at %p, need %zu bytes %d-aligned", size, mem,
			       need, ALIGN);
	memset(sc, 0, sizeof(*sc));
	scratch_layout(sc, mem, hp, cfg);
	return 0;
}

/* ---------------------------------------------------------------- helpers */

/* IEEE half -> float without a call, so attention's inner loops vectorize
 * (same method as the FP16 library / ggml's scalar path; exact for all inputs). */
static inline float f16_to_f32(nx_f16 h)
{
	union { uint32_t u; float f; } a, b, r;
	const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
	a.u = (two_w >> 4) + (0xE0u << 23);
	a.f *= 0x1.0p-112f;               /* normal numbers, inf, nan */
	b.u = (two_w >> 17) | (126u << 23);
	b.f -= 0.5f;                      /* subnormals */
	r.u = sign | (two_w < (1u << 27) ? b.u : a.u);
	return r.f;
}

/* Splits n into n_bands contiguous ranges; granularity g keeps bands on
 * multiples of g rows (for SIMD kernels that do g rows at a time). */
static void band_range(int n, int g, int band, int n_bands, int *lo, int *hi)
{
	int64_t units = ((int64_t)n + g - 1) / g;
	int64_t u0 = units * band / n_bands, u1 = units * (band + 1) / n_bands;
	int64_t a = u0 * g, b = u1 * g;
	*lo = (int)(a < n ? a : n);
	*hi = (int)(b < n ? b : n);
}

#define ROW_GRAIN 16

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float r = (float)(1.0 / sqrt(ss / n + eps));
	for (int i = 0; i < n; i++)
		out[i] = x[i] * r * w[i];
}

/* Activation rows for a matmul: row t at data + t * stride, in type vt. */
struct act {
	const uint8_t *data;
	size_t stride;
};

/* Brings rows src[t * n_in ...] (t < n, or only tokens with logits when
 * only_logits) into the weight's vec_dot_type in this band's private xq.
 * Quantizes once per (source, type): Q/K/V and gate/up share it. */
static struct act prep_act(struct nx_scratch *sc, const float *src, int n, int n_in, enum nx_type vt,
			   const struct nx_tok_in *toks, bool only_logits)
{
	if (vt == NX_F32)
		return (struct act){(const uint8_t *)src, (size_t)n_in * sizeof(float)};
	struct act a = {sc->xq, sc->xq_stride};
	if (sc->xq_src == src && sc->xq_type == vt)
		return a;
	const struct nx_type_traits *tr = nx_type_get(vt);
	for (int t = 0; t < n; t++)
		if (!only_logits || toks[t].logits_row >= 0)
			tr->quant(src + (size_t)t * n_in, sc->xq + (size_t)t * sc->xq_stride, n_in);
	sc->xq_src = src;
	sc->xq_type = vt;
	return a;
}

enum mm_op {
	MM_STORE,  /* y = W a (+ bias) */
	MM_ADD,    /* y += W a        (residual) */
	MM_SWIGLU, /* y = silu(y) * (W a), y holding the gate */
};

/* y[t * ldy + r] op= W_r . a_t for rows r in [r0, r1) and tokens t < n.
 * Row-outer: each weight row is read once and dotted with every token. */
static void matmul(const struct nx_wt *w, struct act a, int n, int r0, int r1, float *y, size_t ldy,
		   const float *bias, enum mm_op op)
{
	const nx_dot_fn dot = nx_type_get(w->type)->dot;
	const uint8_t *row = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
	for (int r = r0; r < r1; r++, row += w->row_bytes) {
		const uint8_t *at = a.data;
		float *yr = y + r;
		for (int t = 0; t < n; t++, at += a.stride, yr += ldy) {
			float d = dot(row, at, w->n_in);
			switch (op) {
			case MM_STORE:
				*yr = bias ? d + bias[r] : d;
				break;
			case MM_ADD:
				*yr += d;
				break;
			case MM_SWIGLU:
				*yr = *yr / (1.0f + expf(-*yr)) * d;
				break;
			}
		}
	}
}

/* As matmul, but only for tokens that want logits; output row = their logits_row. */
static void matmul_logits(const struct nx_wt *w, struct act a, const struct nx_tok_in *toks, int n, int r0, int r1,
			  float *logits, size_t n_vocab)
{
	const nx_dot_fn dot = nx_type_get(w->type)->dot;
	const uint8_t *row = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
	for (int r = r0; r < r1; r++, row += w->row_bytes)
		for (int t = 0; t < n; t++)
			if (toks[t].logits_row >= 0)
				logits[(size_t)toks[t].logits_row * n_vocab + r] =
					dot(row, a.data + (size_t)t * a.stride, w->n_in);
}

/* Rotates one head in place: pairs (2i, 2i+1) (llama; GGUF's llama Q/K rows are
 * permuted for this) or (i, i + rope_dim/2) (NeoX, qwen2); dims past rope_dim stay. */
static void rope_head(float *h, const float *cs, int rope_dim, bool neox)
{
	int half = rope_dim / 2;
	for (int i = 0; i < half; i++) {
		int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
		float c = cs[2 * i], s = cs[2 * i + 1], a = h[i0], b = h[i1];
		h[i0] = a * c - b * s;
		h[i1] = a * s + b * c;
	}
}

static inline void sync_barrier(const struct nx_sync *sync)
{
	if (sync && sync->barrier)
		sync->barrier(sync->ctx);
}

/* ---------------------------------------------------------------- the pass */

/* Attention of one (token, head): softmax(q . k_j / sqrt(hd)) over j <= pos, times v. */
static void attend(float *out, const float *q, const nx_f16 *kc, const nx_f16 *vc, int pos, int kv_dim, int hd,
		   float *att)
{
	const float scale = 1.0f / sqrtf((float)hd);
	float mx = -INFINITY;
	for (int j = 0; j <= pos; j++) {
		const nx_f16 *k = kc + (size_t)j * kv_dim;
		float d = 0;
		for (int i = 0; i < hd; i++)
			d += q[i] * f16_to_f32(k[i]);
		att[j] = d * scale;
		if (att[j] > mx)
			mx = att[j];
	}
	float sum = 0;
	for (int j = 0; j <= pos; j++) {
		att[j] = expf(att[j] - mx);
		sum += att[j];
	}
	for (int i = 0; i < hd; i++)
		out[i] = 0;
	for (int j = 0; j <= pos; j++) {
		const nx_f16 *v = vc + (size_t)j * kv_dim;
		const float p = att[j];
		for (int i = 0; i < hd; i++)
			out[i] += p * f16_to_f32(v[i]);
	}
	const float inv = 1.0f / sum;
	for (int i = 0; i < hd; i++)
		out[i] *= inv;
}

void nx_forward(const struct nx_model *m, struct nx_state *s, const struct nx_tok_in *toks, int n,
		int band, int n_bands, struct nx_scratch *sc, const struct nx_sync *sync)
{
	const struct nx_hparams *hp = &m->hp;
	const int dim = hp->dim, q_dim = s->q_dim, kv_dim = s->kv_dim, n_ff = hp->n_ff, hd = hp->head_dim;
	const int n_head = hp->n_head, n_head_kv = hp->n_head_kv, group = n_head / n_head_kv;
	const int rope_half = hp->rope_dim / 2, n_ctx = s->cfg.n_ctx;
	const float eps = hp->norm_eps;
	int lo, hi;

	/* Embedding rows, one band per token; and (private, redundant) each token's
	 * RoPE angles, shared by every layer: theta_i = pos * base^(-2i/rope_dim). */
	band_range(n, 1, band, n_bands, &lo, &hi);
	const struct nx_type_traits *emb = nx_type_get(m->tok_embd.type);
	for (int t = lo; t < hi; t++)
		emb->dequant((const uint8_t *)m->tok_embd.data + (size_t)toks[t].token * m->tok_embd.row_bytes,
			     s->x + (size_t)t * dim, dim);
	for (int t = 0; t < n; t++) {
		float *cs = sc->rope + (size_t)t * hp->rope_dim;
		for (int i = 0; i < rope_half; i++) {
			double th = toks[t].pos * pow(hp->rope_base, -2.0 * i / hp->rope_dim);
			cs[2 * i] = (float)cos(th);
			cs[2 * i + 1] = (float)sin(th);
		}
	}
	sync_barrier(sync);

	for (int il = 0; il < hp->n_layer; il++) {
		const struct nx_layer *L = &m->layers[il];
		/* This layer's cache of slot 0; a slot is n_layer layers further. */
		const size_t slot_stride = (size_t)s->n_layer * n_ctx * kv_dim;
		nx_f16 *kc = s->k_cache + (size_t)il * n_ctx * kv_dim;
		nx_f16 *vc = s->v_cache + (size_t)il * n_ctx * kv_dim;

		/* [A] xn = rmsnorm(x) * attn_norm (private); Q, K, V rows of this band; V to the cache. */
		for (int t = 0; t < n; t++)
			rmsnorm(sc->xn + (size_t)t * dim, s->x + (size_t)t * dim, L->attn_norm, dim, eps);
		sc->xq_src = NULL;
		band_range(q_dim, ROW_GRAIN, band, n_bands, &lo, &hi);
		matmul(&L->wq, prep_act(sc, sc->xn, n, dim, nx_type_get(L->wq.type)->vec_dot_type, toks, false), n, lo,
		       hi, s->q, q_dim, L->bq, MM_STORE);
		band_range(kv_dim, ROW_GRAIN, band, n_bands, &lo, &hi);
		matmul(&L->wk, prep_act(sc, sc->xn, n, dim, nx_type_get(L->wk.type)->vec_dot_type, toks, false), n, lo,
		       hi, s->k, kv_dim, L->bk, MM_STORE);
		matmul(&L->wv, prep_act(sc, sc->xn, n, dim, nx_type_get(L->wv.type)->vec_dot_type, toks, false), n, lo,
		       hi, s->v, kv_dim, L->bv, MM_STORE);
		for (int t = 0; t < n; t++) {
			nx_f16 *dst = vc + toks[t].slot * slot_stride + (size_t)toks[t].pos * kv_dim;
			const float *src = s->v + (size_t)t * kv_dim;
			for (int r = lo; r < hi; r++)
				dst[r] = nx_f32_to_f16(src[r]);
		}
		sync_barrier(sync);

		/* [B] RoPE: queries in place per (token, head); keys per (token, kv head) into the cache. */
		band_range(n * n_head, 1, band, n_bands, &lo, &hi);
		for (int u = lo; u < hi; u++) {
			int t = u / n_head, h = u % n_head;
			rope_head(s->q + (size_t)t * q_dim + (size_t)h * hd, sc->rope + (size_t)t * hp->rope_dim,
				  hp->rope_dim, hp->rope_neox);
		}
		band_range(n * n_head_kv, 1, band, n_bands, &lo, &hi);
		for (int u = lo; u < hi; u++) {
			int t = u / n_head_kv, h = u % n_head_kv;
			float *k = s->k + (size_t)t * kv_dim + (size_t)h * hd;
			rope_head(k, sc->rope + (size_t)t * hp->rope_dim, hp->rope_dim, hp->rope_neox);
			nx_f16 *dst = kc + toks[t].slot * slot_stride + (size_t)toks[t].pos * kv_dim + (size_t)h * hd;
			for (int i = 0; i < hd; i++)
				dst[i] = nx_f32_to_f16(k[i]);
		}
		sync_barrier(sync);

		/* [C] attention per (token, head) over positions 0..pos of the token's slot. */
		band_range(n * n_head, 1, band, n_bands, &lo, &hi);
		for (int u = lo; u < hi; u++) {
			int t = u / n_head, h = u % n_head;
			size_t off = toks[t].slot * slot_stride + (size_t)(h / group) * hd;
			attend(s->att_out + (size_t)t * q_dim + (size_t)h * hd, s->q + (size_t)t * q_dim + (size_t)h * hd,
			       kc + off, vc + off, toks[t].pos, kv_dim, hd, sc->att);
		}
		sync_barrier(sync);

		/* [D] x += Wo att_out: this band's rows of x. */
		sc->xq_src = NULL;
		band_range(dim, ROW_GRAIN, band, n_bands, &lo, &hi);
		matmul(&L->wo, prep_act(sc, s->att_out, n, q_dim, nx_type_get(L->wo.type)->vec_dot_type, toks, false), n,
		       lo, hi, s->x, dim, NULL, MM_ADD);
		sync_barrier(sync);

		/* [E] xn = rmsnorm(x) * ffn_norm (private); hb = silu(Wgate xn) * (Wup xn) on this band's rows. */
		for (int t = 0; t < n; t++)
			rmsnorm(sc->xn + (size_t)t * dim, s->x + (size_t)t * dim, L->ffn_norm, dim, eps);
		sc->xq_src = NULL;
		band_range(n_ff, ROW_GRAIN, band, n_bands, &lo, &hi);
		matmul(&L->w_gate, prep_act(sc, sc->xn, n, dim, nx_type_get(L->w_gate.type)->vec_dot_type, toks, false),
		       n, lo, hi, s->hb, n_ff, NULL, MM_STORE);
		matmul(&L->w_up, prep_act(sc, sc->xn, n, dim, nx_type_get(L->w_up.type)->vec_dot_type, toks, false), n,
		       lo, hi, s->hb, n_ff, NULL, MM_SWIGLU);
		sync_barrier(sync);

		/* [F] x += Wdown hb: this band's rows of x. */
		sc->xq_src = NULL;
		band_range(dim, ROW_GRAIN, band, n_bands, &lo, &hi);
		matmul(&L->w_down, prep_act(sc, s->hb, n, n_ff, nx_type_get(L->w_down.type)->vec_dot_type, toks, false),
		       n, lo, hi, s->x, dim, NULL, MM_ADD);
		sync_barrier(sync);
	}

	/* Output: final norm of the tokens that want logits (private), then this band's vocabulary rows. */
	for (int t = 0; t < n; t++)
		if (toks[t].logits_row >= 0)
			rmsnorm(sc->xn + (size_t)t * dim, s->x + (size_t)t * dim, m->out_norm, dim, eps);
	sc->xq_src = NULL;
	band_range(hp->n_vocab, ROW_GRAIN, band, n_bands, &lo, &hi);
	matmul_logits(&m->output, prep_act(sc, sc->xn, n, dim, nx_type_get(m->output.type)->vec_dot_type, toks, true),
		      toks, n, lo, hi, s->logits, hp->n_vocab);
	sync_barrier(sync);
}
