/* forward.c - the batched forward pass of every family (model.c: families), SPMD over bands of rows and heads. */
#include "model/forward.h"

#include "lora/delta.h"
#include "kern/attn.h"
#include "kern/norm.h"
#include "kern/pack.h"
#include "kern/pack_act.h"
#include "sample/sampler.h"

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
	       c->max_logits <= c->max_batch && c->n_slots > 0 && c->n_ctx > 0 &&
	       nx_kv_row_bytes(c->kv_type, hp->head_dim) > 0;
}

const char *nx_kv_type_name(enum nx_kv_type t)
{
	return t == NX_KV_Q8_0 ? "q8_0" : t == NX_KV_F16 ? "f16" : "?";
}

bool nx_kv_type_parse(const char *name, enum nx_kv_type *t)
{
	for (int k = NX_KV_F16; k <= NX_KV_Q8_0; k++)
		if (!strcmp(name, nx_kv_type_name((enum nx_kv_type)k))) {
			*t = (enum nx_kv_type)k;
			return true;
		}
	return false;
}

size_t nx_kv_row_bytes(enum nx_kv_type t, int hd)
{
	if (hd <= 0)
		return 0;
	switch (t) {
	case NX_KV_F16:
		return (size_t)hd * sizeof(nx_f16);
	case NX_KV_Q8_0:
		return hd % QK8_0 ? 0 : (size_t)hd / QK8_0 * sizeof(struct nx_block_q8_0);
	}
	return 0;
}

int nx_kv_type_check(const struct nx_hparams *hp, enum nx_kv_type t, struct nx_err *err)
{
	if (nx_kv_row_bytes(t, hp->head_dim) == 0)
		return nx_errf(err, "--kv-type %s: this model's heads of %d values are not a multiple of %d (Q8_0 "
			       "blocks); use --kv-type f16", nx_kv_type_name(t), hp->head_dim, QK8_0);
	if (t == NX_KV_Q8_0 && hp->attn_softcap > 0)
		return nx_errf(err, "--kv-type %s: this model's attention soft-cap (attn_logit_softcapping %g) is "
			       "computed with the f16 cache only; use --kv-type f16", nx_kv_type_name(t),
			       (double)hp->attn_softcap);
	return 0;
}

/* Bytes of one of the K and V caches: (n_slots, n_layer, n_head_kv, n_ctx) rows; 0 on overflow. */
static size_t cache_bytes(const struct nx_hparams *hp, const struct nx_state_cfg *c)
{
	size_t n;
	if (__builtin_mul_overflow((size_t)c->n_slots * hp->n_layer, (size_t)c->n_ctx, &n) ||
	    __builtin_mul_overflow(n, (size_t)hp->n_head_kv, &n) ||
	    __builtin_mul_overflow(n, nx_kv_row_bytes(c->kv_type, hp->head_dim), &n))
		return 0;
	return n;
}

size_t nx_kv_cache_bytes(const struct nx_hparams *hp, const struct nx_state_cfg *cfg)
{
	size_t n;
	if (!cfg_ok(hp, cfg) || __builtin_mul_overflow(cache_bytes(hp, cfg), 2, &n))
		return 0;
	return n;
}

static int max_in(const struct nx_hparams *hp)
{
	int q_dim = hp->n_head * hp->head_dim, m = hp->dim;
	if (hp->n_ff > m)
		m = hp->n_ff;
	if (q_dim > m)
		m = q_dim;
	if (hp->n_ff_shexp > m)
		m = hp->n_ff_shexp;
	return m;
}

/* Attention splits a token's positions into spans of NX_ATTN_SPAN (the last
 * one shorter), each a unit of work of its own, and merges the spans' outputs
 * (nx_attn_merge). Fixed spans, not a split by how many tokens a step has: a
 * token's output depends on its position only, never on the batch it ran in.
 * With one sequence, a few kv heads cannot keep the bands busy alone; spans
 * can, without each band reading the K/V of a kv head whose query heads are
 * shared out (docs/bench.md). A token within one span takes the path it took
 * before spans: the same arithmetic, no merge. */
#define NX_ATTN_SPAN 256

static int attn_spans(int n_pos)
{
	return (n_pos + NX_ATTN_SPAN - 1) / NX_ATTN_SPAN;
}

/* Positions a token at pos attends to in a layer of window `window`
 * (nx_layer_window): the last `window` of 0..pos (its own among them), as
 * Hugging Face's sliding mask (kv > q - W) and llama.cpp's is_masked_swa have
 * it, or all of them when window is 0. */
static int attn_len(int window, int pos)
{
	return window && pos + 1 > window ? window : pos + 1;
}

/* The spans of a token's attn_len positions, cut from the first of them: a
 * window of at most NX_ATTN_SPAN is one span, the path without a merge. */
static int tok_spans(int window, int pos)
{
	return attn_spans(attn_len(window, pos));
}

/* Walks the state layout once for both sizing and carving: mem NULL sizes it. */
static size_t state_layout(struct nx_state *s, void *mem, const struct nx_hparams *hp, const struct nx_state_cfg *c)
{
	size_t B = (size_t)c->max_batch, dim = hp->dim, q_dim = (size_t)hp->n_head * hp->head_dim,
	       kv_dim = (size_t)hp->n_head_kv * hp->head_dim, n_ff = hp->n_ff, n_vocab = hp->n_vocab;
	const size_t spans = (size_t)attn_spans(c->n_ctx), heads = B * (size_t)hp->n_head;
	const size_t n_groups = (n_vocab + NX_SAMPLE_GROUP - 1) / NX_SAMPLE_GROUP;
	const size_t cache = cache_bytes(hp, c);
	if (cache == 0)
		return 0;
	size_t total = 0;
	if (!add_buf(&total, B * dim, sizeof(float)) || !add_buf(&total, B * q_dim, sizeof(float)) ||
	    !add_buf(&total, B * kv_dim, sizeof(float)) || !add_buf(&total, B * kv_dim, sizeof(float)) ||
	    !add_buf(&total, B * q_dim, sizeof(float)) || !add_buf(&total, B * n_ff, sizeof(float)) ||
	    !add_buf(&total, hp->post_norms ? B * dim : 0, sizeof(float)) ||
	    !add_buf(&total, cache, 1) || !add_buf(&total, cache, 1) ||
	    !add_buf(&total, (size_t)c->max_logits * n_vocab, sizeof(float)) ||
	    !add_buf(&total, (size_t)c->max_logits * n_groups, sizeof(float)) ||
	    !add_buf(&total, heads * spans * hp->head_dim, sizeof(float)) || !add_buf(&total, heads * spans * 2, sizeof(float)) ||
	    !add_buf(&total, NX_LORA_U_SHARED, sizeof(float)) || !add_buf(&total, B * hp->n_expert, sizeof(float)) ||
	    !add_buf(&total, nx_moe_route_rows(hp, c->max_batch) * hp->n_ff_exp, sizeof(float)) ||
	    !add_buf(&total, B * hp->n_ff_shexp, sizeof(float)) || !add_buf(&total, hp->n_ff_shexp ? B : 0, sizeof(float)))
		return 0;
	if (mem) {
		uint8_t *p = mem;
		s->x = take(&p, B * dim, sizeof(float));
		s->q = take(&p, B * q_dim, sizeof(float));
		s->k = take(&p, B * kv_dim, sizeof(float));
		s->v = take(&p, B * kv_dim, sizeof(float));
		s->att_out = take(&p, B * q_dim, sizeof(float));
		s->hb = take(&p, B * n_ff, sizeof(float));
		s->y = take(&p, hp->post_norms ? B * dim : 0, sizeof(float));
		s->k_cache = take(&p, cache, 1);
		s->v_cache = take(&p, cache, 1);
		s->logits = take(&p, (size_t)c->max_logits * n_vocab, sizeof(float));
		s->logit_gmax = take(&p, (size_t)c->max_logits * n_groups, sizeof(float));
		s->att_part = take(&p, heads * spans * hp->head_dim, sizeof(float));
		s->att_ms = take(&p, heads * spans * 2, sizeof(float));
		s->lora_u = take(&p, NX_LORA_U_SHARED, sizeof(float));
		if (hp->n_expert) {
			s->moe_logits = take(&p, B * hp->n_expert, sizeof(float));
			s->moe_h = take(&p, nx_moe_route_rows(hp, c->max_batch) * hp->n_ff_exp, sizeof(float));
		}
		if (hp->n_ff_shexp) {
			s->shexp_h = take(&p, B * hp->n_ff_shexp, sizeof(float));
			s->shexp_g = take(&p, B, sizeof(float));
		}
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
	if (nx_kv_type_check(hp, cfg->kv_type, err) < 0)
		return -1;
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

void nx_state_copy_kv(const struct nx_state *s, int hd, int dst, int src, int p0, int p1)
{
	if (p1 <= p0)
		return;
	const size_t n_ctx = (size_t)s->cfg.n_ctx, row = nx_kv_row_bytes(s->cfg.kv_type, hd);
	const size_t runs = (size_t)s->n_layer * (s->kv_dim / hd); /* (layer, kv head): n_ctx positions each */
	const size_t slot = runs * n_ctx * row, len = (size_t)(p1 - p0) * row;
	uint8_t *const kc = s->k_cache, *const vc = s->v_cache;
	for (size_t r = 0; r < runs; r++) {
		const size_t at = (r * n_ctx + (size_t)p0) * row;
		memcpy(kc + dst * slot + at, kc + src * slot + at, len);
		memcpy(vc + dst * slot + at, vc + src * slot + at, len);
	}
}

/* Bytes of xq per token: the hi and lo rows of a quantized activation take at
 * most 2 x 292/256 bytes per element (Q8_K; Q8_0 2 x 34/32), so 4 (a float) is room. */
static size_t xq_stride(const struct nx_hparams *hp)
{
	return round_up((size_t)max_in(hp) * sizeof(float), ALIGN);
}

/* Most query heads of a group that one unit of attention takes: what
 * nx_attend_f16 does in one pass over K and V; sc->att holds their scores. */
static int attn_chunk_max(const struct nx_hparams *hp)
{
	const int group = hp->n_head / hp->n_head_kv, g = nx_attn_group(hp->head_dim);
	return group < 1 ? 1 : group < g ? group : g;
}

/* Chunks each group's query heads are cut into for attention, as even as can
 * be: the fewest that keep each within attn_chunk_max and leave the bands at
 * least 2 units each to balance (n spans of all tokens x n_head_kv groups x
 * chunks), so that heads share K/V reads where there is work enough to go
 * round. */
static int attn_chunks(const struct nx_hparams *hp, int n, int n_bands)
{
	const int group = hp->n_head / hp->n_head_kv, cmax = attn_chunk_max(hp);
	int k = (group + cmax - 1) / cmax;
	while (k < group && (int64_t)n * hp->n_head_kv * k < 2 * n_bands)
		k++;
	return k;
}

static size_t scratch_layout(struct nx_scratch *sc, void *mem, const struct nx_hparams *hp,
			     const struct nx_state_cfg *c)
{
	/* with experts, xq also holds a quantized row (of dim or n_ff_exp) per routed (token, expert)
	 * pair (moe_gate_up, moe_down): bytes and side values for the larger of the two uses */
	const size_t rows = nx_moe_route_rows(hp, c->max_batch), ne = (size_t)hp->n_expert;
	const size_t B = (size_t)c->max_batch, moe_in = (size_t)(hp->dim > hp->n_ff_exp ? hp->dim : hp->n_ff_exp);
	size_t xq_bytes = B * xq_stride(hp), sides = B * (size_t)(max_in(hp) / 32);
	if (rows * round_up(moe_in * sizeof(float), ALIGN) > xq_bytes)
		xq_bytes = rows * round_up(moe_in * sizeof(float), ALIGN);
	if (rows * (moe_in / 32) > sides)
		sides = rows * (moe_in / 32);
	size_t total = 0;
	if (!add_buf(&total, B * max_in(hp), sizeof(float)) || !add_buf(&total, xq_bytes, 1) ||
	    !add_buf(&total, sides, sizeof(float)) || !add_buf(&total, sides, sizeof(float)) ||
	    !add_buf(&total, sides, sizeof(int32_t)) || !add_buf(&total, 2 * sides, sizeof(int32_t)) ||
	    !add_buf(&total, (size_t)attn_chunk_max(hp) * c->n_ctx, sizeof(float)) ||
	    !add_buf(&total, B * (size_t)hp->n_head * hp->head_dim, sizeof(float)) ||
	    !add_buf(&total, B * hp->rope_dim, sizeof(float)) ||
	    !add_buf(&total, hp->rope_base_swa ? B * hp->rope_dim : 0, sizeof(float)) ||
	    !add_buf(&total, NX_LORA_U_CAP, sizeof(float)) ||
	    !add_buf(&total, (size_t)NX_LORA_Y_TOK * NX_LORA_Y_ROWS, sizeof(float)) ||
	    !add_buf(&total, 2 * ne + 1, sizeof(int32_t)) || !add_buf(&total, ne, sizeof(int32_t)) ||
	    !add_buf(&total, 2 * rows, sizeof(int32_t)) || !add_buf(&total, 2 * rows, sizeof(float)) ||
	    !add_buf(&total, rows * hp->dim, sizeof(float)) || !add_buf(&total, ne ? B * hp->dim : 0, sizeof(float)))
		return 0;
	if (mem) {
		uint8_t *p = mem;
		sc->xn = take(&p, B * max_in(hp), sizeof(float));
		sc->xq = take(&p, xq_bytes, 1);
		sc->xq_stride = xq_stride(hp);
		sc->xq_d = take(&p, sides, sizeof(float));
		sc->xq_s = take(&p, sides, sizeof(float));
		sc->xq_c = take(&p, sides, sizeof(int32_t));
		sc->xq_c16 = take(&p, 2 * sides, sizeof(int32_t));
		sc->att = take(&p, (size_t)attn_chunk_max(hp) * c->n_ctx, sizeof(float));
		sc->att_in = take(&p, B * (size_t)hp->n_head * hp->head_dim, sizeof(float));
		sc->rope = take(&p, B * hp->rope_dim, sizeof(float));
		sc->rope_swa = take(&p, hp->rope_base_swa ? B * hp->rope_dim : 0, sizeof(float));
		sc->lora_u = take(&p, NX_LORA_U_CAP, sizeof(float));
		sc->lora_y = take(&p, (size_t)NX_LORA_Y_TOK * NX_LORA_Y_ROWS, sizeof(float));
		if (ne) {
			struct nx_moe_route *r = &sc->route;
			r->expert = take(&p, 2 * ne + 1, sizeof(int32_t));
			r->off = r->expert + ne;
			r->count = take(&p, ne, sizeof(int32_t));
			r->row_tok = take(&p, 2 * rows, sizeof(int32_t));
			r->tok_sel = r->row_tok + rows;
			r->row_w = take(&p, 2 * rows, sizeof(float));
			r->tok_w = r->row_w + rows;
			sc->moe_x = take(&p, rows * hp->dim, sizeof(float));
			sc->moe_y = take(&p, B * hp->dim, sizeof(float));
		}
	}
	return total;
}

const char *nx_act_mode_name(bool one_part)
{
	return one_part ? "fast" : "precise";
}

bool nx_act_mode_parse(const char *name, bool *one_part)
{
	for (int m = 0; m < 2; m++)
		if (!strcmp(name, nx_act_mode_name(m))) {
			*one_part = m;
			return true;
		}
	return false;
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
	sc->act_one_part = cfg->act_one_part;
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
_Static_assert(ROW_GRAIN % NX_SAMPLE_GROUP == 0, "a band writes whole groups of logits");

/* Rows [0, n) of one op, in units of `grain` rows, shared out between the
 * bands. With the sync's take (and a dynamic split), band b has the b-th of
 * n_bands contiguous ranges and takes it front to back, half of what is left
 * at a time, then helps with the backs of the other ranges (nx_barrier_take,
 * tag `tag`): on an idle machine each band streams its rows in order, one
 * stream per band for the hardware prefetcher (small chunks from a shared
 * pool break those streams: docs/bench.md), nearly as fast as fixed bands;
 * a band that runs slower than the others (a smaller core, a
 * busy sibling) leaves the end of its range to them instead of holding them
 * at the next barrier. (A band that is preempted holds everyone at the
 * barrier whatever the split.) Otherwise each band does its band_range in one
 * piece. Which band computes a row never changes the row's value. */
struct split {
	const struct nx_sync *sync;
	uint32_t tag, band;
	int n, grain, units;
	int lo, hi; /* static split: this band's units */
	bool dynamic, done;
};

static void split_begin(struct split *sp, const struct nx_sync *sync, uint32_t tag, int n, int grain, int band,
			int n_bands, bool dynamic)
{
	*sp = (struct split){.sync = sync, .tag = tag, .band = (uint32_t)band, .n = n, .grain = grain};
	sp->units = (n + grain - 1) / grain;
	sp->dynamic = dynamic && sync && sync->take && n_bands > 1 && sp->units <= NX_SYNC_TAKE_UNITS;
	if (sp->dynamic)
		return;
	sp->lo = (int)((int64_t)sp->units * band / n_bands);
	sp->hi = (int)((int64_t)sp->units * (band + 1) / n_bands);
}

/* This band's next rows [*r0, *r1); false when it has no more. */
static bool split_next(struct split *sp, int *r0, int *r1)
{
	int u0, u1;
	if (sp->dynamic) {
		uint32_t a, z;
		if (!sp->sync->take(sp->sync->ctx, sp->tag, sp->band, (uint32_t)sp->units, 1, &a, &z))
			return false;
		u0 = (int)a;
		u1 = (int)z;
	} else {
		if (sp->done || sp->lo >= sp->hi)
			return false;
		sp->done = true;
		u0 = sp->lo;
		u1 = sp->hi;
	}
	*r0 = u0 * sp->grain;
	*r1 = u1 * sp->grain < sp->n ? u1 * sp->grain : sp->n;
	return true;
}

/* What a matmul's activations are quantized to: Q8_0 rows for a packed matrix
 * (every tile kernel takes them, the k-quants' too: kern/pack.h), else the
 * weight type's vec_dot_type (Q8_K for the plain k-quant kernels). */
static enum nx_type act_type(const struct nx_wt *w)
{
	return w->packed ? NX_Q8_0 : nx_type_get(w->type)->vec_dot_type;
}

/* Activation rows for a matmul: token t's row at data + t * stride. For a
 * quantized vec_dot_type the row is two rows of that type, hi at data + t * stride
 * and lo at lo bytes after it, and the activation is their sum (prep_act). */
struct act {
	const uint8_t *data;
	size_t stride;
	size_t lo; /* 0: one row (F32) */
	/* Two-part Q8_0: the side values for the packed kernels (kern/pack.h:
	 * nx_pack_act_prep), token t's at t * n_in / 32; NULL: not at hand */
	const float *pd, *ps;
	const int32_t *pc;
	const int32_t *pc16; /* the per-16 sums of q6_k, q2_k, q3_k (kern/pack.h c16), token t's at 2 * t * n_in / 32; NULL: not needed */
	bool lo_zero;        /* one-part activations: every lo row is zeros */
};

/* Tokens t, t + 1, ... of a (rows of n_in elements). */
static struct act act_from(struct act a, int t, int n_in)
{
	const size_t i = (size_t)t * (size_t)(n_in / 32);
	a.data += (size_t)t * a.stride;
	if (a.pd) {
		a.pd += i;
		a.ps += i;
		a.pc += i;
	}
	if (a.pc16)
		a.pc16 += 2 * i;
	return a;
}

/* Brings rows src[t * n_in ...] (t < n, or only tokens with logits when
 * only_logits) into the weight's vec_dot_type in this band's private xq.
 * Quantizes once per (source, type): Q/K/V and gate/up share it.
 *
 * A quantized activation is stored in two parts, hi = Q(x) and lo = x - hi in
 * finer levels (kern/quant.h: quant2; Q8_0's at hi's scale / 128), and every
 * dot is dot(w, hi) + dot(w, lo): about 14-15 bits per value instead of 8. Why:
 * with one Q8_0 rounding (1/254 of each 32-block's peak) at each of the 7
 * matmul inputs of a layer, the top-1 token differs from the exact float64
 * model's at a few percent of positions (docs/bench.md, SmolLM2-135M).
 * The noise comes from every matmul alike, not from a few outlier
 * channels: finer blocks (8 or 16 values) or an f32 scale barely help, and 12+
 * bits at every input are needed (tests/py/study_activation_error.py). hi + lo
 * is as close as f32 activations (what is left is the f16 K/V cache), keeps
 * the integer dot kernels and block layouts, and reads each weight row once for
 * both parts (one dot_rows / tile-kernel call): the cost is the second integer
 * dot, not memory traffic (the study's --bench measures it). With Q8_0's lo
 * scale tied to hi's, the tile kernels add the two dots as 128 * hi + lo in
 * integers and do the float work once per token (kern/pack.h). */
static struct act prep_act_q(struct nx_scratch *sc, const float *src, int n, int n_in, enum nx_type vt,
			     const struct nx_tok_in *toks, bool only_logits)
{
	if (vt == NX_F32)
		return (struct act){.data = (const uint8_t *)src, .stride = (size_t)n_in * sizeof(float)};
	const size_t rs = (size_t)nx_row_size(vt, n_in); /* model binding checked that n_in fits vt */
	struct act a = {.data = sc->xq, .stride = 2 * rs, .lo = rs, .lo_zero = sc->act_one_part};
	if (vt == NX_Q8_0) {
		a.pd = sc->xq_d;
		a.ps = sc->xq_s;
		a.pc = sc->xq_c;
	}
	if (sc->xq_src == src && sc->xq_type == vt)
		return a;
	const struct nx_type_traits *tr = nx_type_get(vt);
	const int64_t nb = n_in / 32;
	for (int t = 0; t < n; t++) {
		if (only_logits && toks[t].logits_row < 0)
			continue;
		const float *x = src + (size_t)t * n_in;
		uint8_t *hi = (uint8_t *)sc->xq + (size_t)t * a.stride;
		/* every activation type has one (model.c: bind_wt); one part: hi alone,
		 * and lo zeros, so that every kernel adds 0 for it */
		tr->quant2(x, hi, a.lo_zero ? NULL : hi + rs, n_in);
		if (a.lo_zero)
			memset(hi + rs, 0, rs);
		if (a.pd) { /* once here rather than in every packed matmul of this input */
			const size_t i = (size_t)t * nb;
			nx_pack_act_prep_fast(hi, hi + rs, n_in, sc->xq_d + i, sc->xq_s + i, sc->xq_c + i);
		}
	}
	sc->xq_src = src;
	sc->xq_type = vt;
	sc->xq_c16_ok = false;
	return a;
}

/* --profile (nx_scratch.prof): charges the time since the last mark to the
 * current phase and makes `phase` current. Without prof, one branch. */
static inline void prof_to(struct nx_scratch *sc, enum nx_prof_phase phase)
{
	struct nx_prof *p = sc->prof;
	if (!p)
		return;
	const uint64_t t = nx_prof_now();
	p->ticks[p->phase] += t - p->mark;
	p->mark = t;
	p->phase = phase;
}

/* prep_act_q, timed as norm+quant; what follows it is a matmul. */
static struct act prep_act(struct nx_scratch *sc, const float *src, int n, int n_in, const struct nx_wt *w,
			   const struct nx_tok_in *toks, bool only_logits)
{
	prof_to(sc, NX_PROF_QUANT);
	struct act a = prep_act_q(sc, src, n, n_in, act_type(w), toks, only_logits);
	if (a.pd && w->packed && nx_pack_needs_c16(w->type)) { /* the tile kernels with a side value per 16 */
		const int64_t nb = n_in / 32;
		if (!sc->xq_c16_ok)
			for (int t = 0; t < n; t++) {
				if (only_logits && toks[t].logits_row < 0)
					continue; /* not quantized either (prep_act_q) */
				const uint8_t *hi = a.data + (size_t)t * a.stride;
				nx_pack_act_prep_c16(hi, hi + a.lo, n_in, sc->xq_c16 + 2 * t * nb);
			}
		sc->xq_c16_ok = true;
		a.pc16 = sc->xq_c16;
	}
	prof_to(sc, only_logits ? NX_PROF_LOGITS : NX_PROF_MATMUL);
	return a;
}

enum mm_op {
	MM_STORE = NX_PACK_STORE,   /* y = W a (+ bias) */
	MM_ADD = NX_PACK_ADD,       /* y += W a        (residual) */
	MM_SWIGLU = NX_PACK_SWIGLU, /* y = silu(y) * (W a), y holding the gate */
	MM_GEGLU = NX_PACK_SWIGLU + 1, /* y = gelu(y) * (W a), y holding the gate (forward.c's own epilogue) */
};

/* GELU, the tanh approximation (HF's gelu_pytorch_tanh, ggml's gelu): Gemma's FFN gate. */
static inline float gelu_tanh(float x)
{
	return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* Tokens per dot_rows call: up to 2 * TOK_CHUNK activation rows against one weight row. */
#define TOK_CHUNK 8

/* Runs of at least this many tokens take the AMX kernels where there are
 * some (a guess until measured on an AMX host: their tile work per block is
 * fixed, the AVX-512 kernels' grows with the tokens). */
#define AMX_MIN_TOKENS 8

/* The packed path of matmul and matmul_logits (kern/pack.h): a tile kernel dots
 * 16 weight rows with the two-part activations of up to NX_PACK_ACT_MAX tokens
 * per call (NX_PACK_AMX_MAX for the AMX kernels), each weight block unpacked
 * once for all of them. With toks, only
 * tokens that want logits, written to row toks[t].logits_row of y. Each (row,
 * token) result does not depend on the chunk it was computed in, as in matmul.
 * Returns false, having done nothing, when it does not apply: no packed copy,
 * or activations that are not two-part Q8_0 rows with the side values prep_act
 * computes for the tile kernels (once per input, not per call). */
static bool matmul_packed(const struct nx_wt *w, struct act a, int n, int r0, int r1, float *y, size_t ldy,
			  const float *bias, enum mm_op op, const struct nx_tok_in *toks)
{
	const size_t rs = (size_t)nx_row_size(NX_Q8_0, w->n_in);
	const int64_t nb = w->n_in / 32;
	if (!w->packed || !a.pd || (nx_pack_needs_c16(w->type) && !a.pc16) || a.lo != rs || a.stride != 2 * rs ||
	    r0 % NX_PACK_ROWS || r1 % NX_PACK_ROWS)
		return false;
	const nx_pack_fn tile = nx_pack_kernel(w->type), amx = n >= AMX_MIN_TOKENS ? nx_pack_kernel_amx(w->type) : NULL;
	const nx_pack_epi_fn epi = nx_pack_epilogue();
	const size_t gbytes = NX_PACK_ROWS * w->row_bytes;
	const int max = amx ? NX_PACK_AMX_MAX : NX_PACK_ACT_MAX;
	float out[NX_PACK_AMX_MAX * NX_PACK_ROWS], *yt[NX_PACK_AMX_MAX];
	for (int t0 = 0; t0 < n;) {
		if (toks && toks[t0].logits_row < 0) {
			t0++;
			continue;
		}
		int cnt = 1; /* a run of tokens: their activation rows are evenly spaced */
		while (cnt < max && t0 + cnt < n && (!toks || toks[t0 + cnt].logits_row >= 0))
			cnt++;
		nx_pack_fn kern = tile;
		if (amx && cnt >= AMX_MIN_TOKENS)
			kern = amx;
		else if (cnt > NX_PACK_ACT_MAX)
			cnt = NX_PACK_ACT_MAX;
		const size_t i0 = (size_t)t0 * nb;
		const struct nx_pack_act pa = {a.data + (size_t)t0 * a.stride, a.stride, a.lo, a.pd + i0, a.ps + i0,
					       a.pc + i0, nb, a.pc16 ? a.pc16 + 2 * i0 : NULL, a.lo_zero};
		for (int t = 0; t < cnt; t++)
			yt[t] = y + (size_t)(toks ? toks[t0 + t].logits_row : t0 + t) * ldy + r0;
		for (int r = r0; r < r1; r += NX_PACK_ROWS) {
			kern((const uint8_t *)w->packed + (size_t)(r / NX_PACK_ROWS) * gbytes, &pa, cnt, out, w->n_in);
			if (op == MM_GEGLU)
				for (int t = 0; t < cnt; t++)
					for (int k = 0; k < NX_PACK_ROWS; k++)
						yt[t][k] = gelu_tanh(yt[t][k]) * out[t * NX_PACK_ROWS + k];
			else
				epi((enum nx_pack_op)op, yt, out, bias ? bias + r : NULL, cnt);
			for (int t = 0; t < cnt; t++)
				yt[t] += NX_PACK_ROWS;
		}
		t0 += cnt;
	}
	return true;
}

/* y[t * ldy + r] op= W_r . a_t for rows r in [r0, r1) and tokens t < n.
 * Row-outer: each weight row is read once and dotted with every token, a chunk
 * of tokens (both parts of each) per dot_rows call, which unpacks the row once
 * per call and gives each row what dot would (kern/quant.h). */
static void matmul(const struct nx_wt *w, struct act a, int n, int r0, int r1, float *y, size_t ldy,
		   const float *bias, enum mm_op op)
{
	if (matmul_packed(w, a, n, r0, r1, y, ldy, bias, op, NULL))
		return;
	const struct nx_type_traits *tr = nx_type_get(w->type);
	const int parts = a.lo ? 2 : 1;
	const size_t row_stride = a.stride / parts; /* hi_0 lo_0 hi_1 lo_1 ... are evenly spaced */
	float dp[2 * TOK_CHUNK];
	const uint8_t *row = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
	for (int r = r0; r < r1; r++, row += w->row_bytes) {
		for (int t0 = 0; t0 < n; t0 += TOK_CHUNK) {
			const int cnt = n - t0 < TOK_CHUNK ? n - t0 : TOK_CHUNK;
			tr->dot_rows(row, a.data + (size_t)t0 * a.stride, row_stride, parts * cnt, dp, w->n_in);
			float *yr = y + (size_t)t0 * ldy + r;
			for (int t = 0; t < cnt; t++, yr += ldy) {
				const float d = parts == 2 ? dp[2 * t] + dp[2 * t + 1] : dp[t];
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
				case MM_GEGLU:
					*yr = gelu_tanh(*yr) * d;
					break;
				}
			}
		}
	}
}

/* As matmul, but only for tokens that want logits (one dot_rows call each: they
 * need not be adjacent); output row = their logits_row. */
static void matmul_logits(const struct nx_wt *w, struct act a, const struct nx_tok_in *toks, int n, int r0, int r1,
			  float *logits, size_t n_vocab)
{
	if (matmul_packed(w, a, n, r0, r1, logits, n_vocab, NULL, MM_STORE, toks))
		return;
	const struct nx_type_traits *tr = nx_type_get(w->type);
	const int parts = a.lo ? 2 : 1;
	float dp[2];
	const uint8_t *row = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
	for (int r = r0; r < r1; r++, row += w->row_bytes)
		for (int t = 0; t < n; t++)
			if (toks[t].logits_row >= 0) {
				tr->dot_rows(row, a.data + (size_t)t * a.stride, a.lo, parts, dp, w->n_in);
				logits[(size_t)toks[t].logits_row * n_vocab + r] = parts == 2 ? dp[0] + dp[1] : dp[0];
			}
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

/* One llama pair (p[0], p[1]) rotated by angle (cos c, sin s): as rope_head. */
static inline void rope_head_pair(float *p, float c, float s)
{
	const float a = p[0], b = p[1];
	p[0] = a * c - b * s;
	p[1] = a * s + b * c;
}

/* RoPE on rows [r0, r1) of n token rows (row t at y + t * ld) of Q or K, in the
 * band that computed them, so no barrier is needed between the matmul and the
 * rotation. The band must hold whole rotation pairs: rope_grain(). */
static void rope_rows(float *y, size_t ld, int n, int r0, int r1, const float *rope, const struct nx_hparams *hp)
{
	const int hd = hp->head_dim, rd = hp->rope_dim;
	for (int t = 0; t < n; t++) {
		float *row = y + (size_t)t * ld;
		const float *cs = rope + (size_t)t * rd;
		if (hp->rope_neox) {
			for (int h0 = r0; h0 < r1; h0 += hd)
				rope_head(row + h0, cs, rd, true);
			continue;
		}
		for (int r = r0; r < r1; r += 2) {
			const int j = r % hd;
			if (j < rd)
				rope_head_pair(row + r, cs[j], cs[j + 1]);
		}
	}
}

/* Qwen3's RMSNorm of each head of Q or K (weight w, NULL: none), in place on
 * rows [r0, r1) of n token rows, whole heads (rope_grain), before RoPE. */
static void head_norm_rows(float *y, size_t ld, int n, int r0, int r1, const float *w, const struct nx_hparams *hp)
{
	if (!w)
		return;
	const int hd = hp->head_dim;
	for (int t = 0; t < n; t++)
		for (int h0 = r0; h0 < r1; h0 += hd)
			nx_rmsnorm(y + (size_t)t * ld + h0, y + (size_t)t * ld + h0, w, hd, hp->norm_eps);
}

/* Band granularity of the Q and K rows: whole pairs (2i, 2i+1) for llama, whole
 * heads for NeoX (pairs i, i + rope_dim/2) and per-head norms, and a multiple of ROW_GRAIN. */
static int rope_grain(const struct nx_hparams *hp)
{
	if (!hp->rope_neox && !hp->qk_norm)
		return ROW_GRAIN;
	int g = hp->head_dim;
	while (g % ROW_GRAIN)
		g += hp->head_dim;
	return g;
}

static inline void sync_barrier(const struct nx_sync *sync)
{
	if (sync && sync->barrier)
		sync->barrier(sync->ctx);
}

/* sync_barrier, timed as barrier wait; then back to `next`. */
static inline void band_sync(const struct nx_sync *sync, struct nx_scratch *sc, enum nx_prof_phase next)
{
	prof_to(sc, NX_PROF_BARRIER);
	sync_barrier(sync);
	prof_to(sc, next);
}

/* ---------------------------------------------------------------- runtime LoRA delta */

/* The adapter set a token carries, or NULL (none, or an id outside the table). */
static inline const struct nx_lora_mix *tok_mix(const struct nx_state *s, const struct nx_tok_in *tk)
{
	return tk->lora > 0 && tk->lora <= s->n_lora ? &s->lora[tk->lora - 1] : NULL;
}

static bool step_has_lora(const struct nx_state *s, const struct nx_tok_in *toks, int n)
{
	if (!s->lora)
		return false;
	for (int t = 0; t < n; t++)
		if (tok_mix(s, &toks[t]))
			return true;
	return false;
}

/* Summed rank of a token's adapters on matrix (il, w): 0 when none adapts it. */
static int tok_rank(const struct nx_state *s, const struct nx_tok_in *tk, int il, enum nx_lora_which w)
{
	const struct nx_lora_mix *mx = tok_mix(s, tk);
	int r = 0;
	for (int k = 0; mx && k < mx->n; k++)
		if (mx->l[k]->t[il][w].layer >= 0)
			r += mx->l[k]->t[il][w].rank;
	return r;
}

/* The end of the run of tokens from t that carry the same adapters (a prompt
 * chunk; slots with the same set): A and B are read once for a run. A token
 * without adapters is a run of its own. */
static int lora_run_end(const struct nx_state *s, const struct nx_tok_in *toks, int n, int t)
{
	const struct nx_lora_mix *mx = tok_mix(s, &toks[t]);
	int t1 = t + 1;
	while (mx && t1 < n && tok_mix(s, &toks[t1]) &&
	       (tok_mix(s, &toks[t1]) == mx || !memcmp(tok_mix(s, &toks[t1]), mx, sizeof(*mx))))
		t1++;
	return t1;
}

/* Whether every op's A @ x for the whole step fits half of lora_u (two
 * matrices' at once: K and V, gate and up), so a band computes it once per op
 * (lora_a) and the op's rows can be shared out dynamically. */
static bool lora_fits(const struct nx_state *s, const struct nx_tok_in *toks, int n)
{
	size_t need = 0;
	for (int t = 0; t < n; t++) {
		const struct nx_lora_mix *mx = tok_mix(s, &toks[t]);
		for (int k = 0; mx && k < mx->n; k++)
			need += (size_t)mx->l[k]->rank;
	}
	return need <= NX_LORA_U_CAP / 2;
}

/* Each run of tokens with the same adapters, and in it each adapter that
 * adapts matrix (il, w), with u laid out token after token, each token's
 * values adapter after adapter in mix order (tok_rank of them per token):
 * with y NULL, u = A @ x (band's part of each adapter's rows of A, of
 * n_bands); else y += scale * B @ u on rows [r0, r1). */
static void lora_runs(const struct nx_state *s, const struct nx_tok_in *toks, int n, int il, enum nx_lora_which w,
		      const float *x, size_t ldx, float *u, float *y, size_t ldy, int r0, int r1, int band, int n_bands)
{
	for (int t = 0; t < n;) {
		const struct nx_lora_mix *mx = tok_mix(s, &toks[t]);
		const int t1 = lora_run_end(s, toks, n, t), R = tok_rank(s, &toks[t], il, w);
		for (int k = 0, ko = 0; mx && k < mx->n; k++) {
			const struct nx_lora_t *lt = &mx->l[k]->t[il][w];
			if (lt->layer < 0)
				continue;
			if (y)
				nx_lora_delta_b(lt, u + ko, (size_t)R, t1 - t, mx->scale[k] * lt->scale, y + (size_t)t * ldy,
						ldy, r0, r1);
			else
				nx_lora_delta_a(lt, x + (size_t)t * ldx, ldx, t1 - t, lt->rank * band / n_bands,
						lt->rank * (band + 1) / n_bands, u + ko, (size_t)R);
			ko += lt->rank;
		}
		u += (size_t)R * (t1 - t);
		t = t1;
	}
}

/* u = A @ x of matrix (il, w) for tokens [0, n), laid out as lora_runs says:
 * band's part of it (of n_bands; 0 of 1: all). */
static void lora_a(const struct nx_state *s, const struct nx_tok_in *toks, int n, int il, enum nx_lora_which w,
		   const float *x, size_t ldx, float *u, int band, int n_bands)
{
	lora_runs(s, toks, n, il, w, x, ldx, u, NULL, 0, 0, 0, band, n_bands);
}

/* Whether the bands share out each op's A @ x (into the state's lora_u, then
 * a barrier: four more per layer) rather than each computing all of it for
 * itself. Each band reading every A costs more than the barriers once A is
 * large; the threshold is where sharing out began to pay (docs/bench.md).
 * The same answer in every band (it depends on the step only). */
#define LORA_SPLIT_MIN_LAYER (128 << 10) /* bytes of A per layer, on average */
static bool lora_split_pays(const struct nx_state *s, const struct nx_tok_in *toks, int n, int n_bands)
{
	if (n_bands < 2)
		return false;
	size_t bytes = 0;
	for (int t = 0; t < n; t = lora_run_end(s, toks, n, t)) {
		const struct nx_lora_mix *mx = tok_mix(s, &toks[t]);
		for (int k = 0; mx && k < mx->n; k++)
			bytes += mx->l[k]->a_bytes;
	}
	return bytes >= (size_t)LORA_SPLIT_MIN_LAYER * s->n_layer;
}

/* y[t] += scale * B @ (A @ x[t]) on rows [r0, r1), for each adapter of each
 * token that adapts matrix (il, w), with ax = A @ x from lora_a, or (ax NULL)
 * computed here per call, as many tokens at a time as lora_u holds (one
 * token's mix always fits). Each (token, row) is computed the same way in any
 * run and either way, and whether the bands shared A @ x out or not. */
static void lora_add(const struct nx_state *s, struct nx_scratch *sc, const struct nx_tok_in *toks, int n, int il,
		     enum nx_lora_which w, const float *x, size_t ldx, float *y, size_t ldy, int r0, int r1, float *ax)
{
	if (ax) {
		lora_runs(s, toks, n, il, w, NULL, 0, ax, y, ldy, r0, r1, 0, 1);
		return;
	}
	for (int t = 0, t1; t < n; t = t1) {
		size_t need = 0;
		for (t1 = t; t1 < n; t1++) {
			const size_t rk = (size_t)tok_rank(s, &toks[t1], il, w);
			if (need + rk > NX_LORA_U_CAP)
				break;
			need += rk;
		}
		lora_a(s, toks + t, t1 - t, il, w, x + (size_t)t * ldx, ldx, sc->lora_u, 0, 1);
		lora_runs(s, toks + t, t1 - t, il, w, NULL, 0, sc->lora_u, y + (size_t)t * ldy, ldy, r0, r1, 0, 1);
	}
}

/* hb = silu(hb) * (W_up xn + the up deltas) on rows [r0, r1), in a step where
 * some token adapts up (the delta must land before the product). Runs of
 * tokens without an up adapter take the fused MM_SWIGLU matmul as always;
 * runs with one are done in groups (their A_up @ x from ax_up, lora_a's, or
 * when ax_up is NULL computed here into lora_u), NX_LORA_Y_ROWS rows at a
 * time through lora_y. Each token's arithmetic is the same in any grouping,
 * so its result does not depend on the batch around it. */
static void lora_swiglu(const struct nx_state *s, struct nx_scratch *sc, const struct nx_tok_in *toks, int n, int il,
			const struct nx_wt *w, struct act a, const float *xn, int dim, float *hb, int n_ff, int r0,
			int r1, const float *ax_up, bool gelu)
{
	const nx_pack_epi_fn epi = nx_pack_epilogue();
	int t = 0;
	size_t u_at = 0; /* the ax_up values of the tokens before t */
	while (t < n) {
		int t1 = t;
		if (!tok_rank(s, &toks[t], il, NX_LORA_UP)) {
			while (t1 < n && !tok_rank(s, &toks[t1], il, NX_LORA_UP))
				t1++;
			struct act at = act_from(a, t, w->n_in);
			matmul(w, at, t1 - t, r0, r1, hb + (size_t)t * n_ff, (size_t)n_ff, NULL, gelu ? MM_GEGLU : MM_SWIGLU);
			t = t1;
			continue;
		}
		size_t used = 0;
		while (t1 < n && t1 - t < NX_LORA_Y_TOK) {
			const int rk = tok_rank(s, &toks[t1], il, NX_LORA_UP);
			if (!rk || (!ax_up && used + (size_t)rk > NX_LORA_U_CAP))
				break;
			used += (size_t)rk;
			t1++;
		}
		if (!ax_up) /* the group's A_up @ x */
			lora_a(s, toks + t, t1 - t, il, NX_LORA_UP, xn + (size_t)t * dim, (size_t)dim, sc->lora_u, 0, 1);
		struct act at = act_from(a, t, w->n_in);
		for (int c0 = r0; c0 < r1; c0 += NX_LORA_Y_ROWS) {
			const int c1 = c0 + NX_LORA_Y_ROWS < r1 ? c0 + NX_LORA_Y_ROWS : r1;
			/* W_up rows [c0, c1) as a matrix of their own, written to lora_y (token, row - c0). */
			struct nx_wt wc = *w;
			wc.data = (const uint8_t *)w->data + (size_t)c0 * w->row_bytes;
			if (w->packed) /* c0 - r0 is a multiple of 16: whole groups */
				wc.packed = (const uint8_t *)w->packed + (size_t)c0 * w->row_bytes;
			wc.n_out = c1 - c0;
			matmul(&wc, at, t1 - t, 0, c1 - c0, sc->lora_y, NX_LORA_Y_ROWS, NULL, MM_STORE);
			const float *u = ax_up ? ax_up + u_at : sc->lora_u;
			for (int i = t; i < t1; i++) {
				float *yi = sc->lora_y + (size_t)(i - t) * NX_LORA_Y_ROWS;
				const struct nx_lora_mix *mx = tok_mix(s, &toks[i]);
				for (int k = 0; k < mx->n; k++) {
					const struct nx_lora_t *lt = &mx->l[k]->t[il][NX_LORA_UP];
					if (lt->layer < 0)
						continue;
					const struct nx_lora_t lc = nx_lora_b_rows(lt, c0, c1);
					nx_lora_delta_b(&lc, u, (size_t)lt->rank, 1, mx->scale[k] * lt->scale, yi, NX_LORA_Y_ROWS,
							0, c1 - c0);
					u += lt->rank;
				}
				/* h = silu(h) * (W_up + deltas), 16 rows at a time as the fused matmul does it;
				 * gelu(h) * (...) as matmul does it, one row at a time */
				int r = c0;
				if (gelu)
					for (float *h = hb + (size_t)i * n_ff; r < c1; r++)
						h[r] = gelu_tanh(h[r]) * yi[r - c0];
				for (float *h; r + NX_PACK_ROWS <= c1; r += NX_PACK_ROWS) {
					h = hb + (size_t)i * n_ff + r;
					epi(NX_PACK_SWIGLU, &h, yi + (r - c0), NULL, 1);
				}
				for (float *h = hb + (size_t)i * n_ff; r < c1; r++)
					h[r] = h[r] / (1.0f + expf(-h[r])) * yi[r - c0];
			}
		}
		u_at += used;
		t = t1;
	}
}

/* Probe capture: band 0 copies a matmul's input rows (all n tokens) to the capture buffer. */
static void capture(const struct nx_state *s, const struct nx_hparams *hp, int n, int il, enum nx_capture_kind k,
		    const float *src, int band)
{
	if (!s->capture || band != 0)
		return;
	memcpy(s->capture + nx_capture_off(hp, n, il, k), src, (size_t)n * nx_capture_width(hp, k) * sizeof(float));
}

/* ---------------------------------------------------------------- one step, as a band sees it */

/* The runtime LoRA deltas of a step, planned alike by every band (the plan
 * depends on the step only). An adapted matmul adds B @ (A @ x) in two steps:
 * delta_ax computes A @ x for the op's matrices before the op's rows are
 * shared out, delta_add then adds B @ it on the band's rows.
 *
 * With `once`, each adapted matrix's A @ x for the whole step fits lora_u and
 * is kept at ax[w]: computed by each band into its own lora_u, or with `split`
 * a part by each band into the state's, which a barrier completes. Without
 * it, delta_add computes A @ x per range of rows, so each band keeps one
 * range per op (no dynamic split). Q's, K's and V's are all computed before
 * Q's rows when split, so they take three regions; otherwise K's takes Q's
 * region once Q's rows are done. The ops after a barrier reuse the regions. */
struct deltas {
	bool on; /* some token carries an adapter */
	bool once, split;
	int part, n_parts;          /* this band's part of each A @ x: (band, n_bands) when split, else (0, 1) */
	float *ax[NX_LORA_N_WHICH]; /* A @ x of matrix w when once, else NULL */
};

static struct deltas deltas_plan(const struct nx_state *s, struct nx_scratch *sc, const struct nx_tok_in *toks, int n,
				 int band, int n_bands)
{
	struct deltas d = {.on = step_has_lora(s, toks, n), .n_parts = 1};
	d.once = d.on && lora_fits(s, toks, n);
	d.split = d.once && lora_split_pays(s, toks, n, n_bands);
	if (d.split) {
		d.part = band;
		d.n_parts = n_bands;
	}
	if (d.once) {
		float *const u = d.split ? s->lora_u : sc->lora_u, *const half = u + NX_LORA_U_CAP / 2;
		d.ax[NX_LORA_Q] = d.ax[NX_LORA_O] = d.ax[NX_LORA_GATE] = d.ax[NX_LORA_DOWN] = u;
		d.ax[NX_LORA_V] = d.ax[NX_LORA_UP] = half;
		d.ax[NX_LORA_K] = d.split ? u + NX_LORA_U_CAP : u;
	}
	return d;
}

/* One band's step: its inputs and what every phase derives from them. */
struct pass {
	const struct nx_model *m;
	const struct nx_hparams *hp;
	struct nx_state *s;
	const struct nx_tok_in *toks;
	int n; /* tokens */
	int band, n_bands;
	struct nx_scratch *sc;
	const struct nx_sync *sync;
	bool dyn;            /* an op's rows may be shared out dynamically (struct split) */
	int rgrain;          /* the Q and K rows' band granularity (rope_grain) */
	struct deltas lora;  /* the runtime LoRA deltas */
	/* Attention's units: (token, span of positions, kv head, chunk of its query heads). */
	bool attn_fast;      /* nx_attend_f16 */
	int ns_max;          /* spans per (token, head) that att_part / att_ms hold */
	float attn_scale;    /* the scores' scale (hp->attn_scale, else 1/sqrt(head_dim)) */
	/* per kind of layer (nx_layer_window): [0] global, [1] sliding (hp->swa_window) */
	struct attn_plan {
		bool multi_span; /* some token has more than one span */
		int n_chunk, n_units;
	} plan[2];
};

static struct pass pass_begin(const struct nx_model *m, struct nx_state *s, const struct nx_tok_in *toks, int n,
			      int band, int n_bands, struct nx_scratch *sc, const struct nx_sync *sync)
{
	const struct nx_hparams *hp = &m->hp;
	struct pass pass = {.m = m, .hp = hp, .s = s, .toks = toks, .n = n, .band = band, .n_bands = n_bands,
			    .sc = sc, .sync = sync, .rgrain = rope_grain(hp),
			    .lora = deltas_plan(s, sc, toks, n, band, n_bands),
			    .attn_fast = nx_attn_fast(hp->head_dim), .ns_max = attn_spans(s->cfg.n_ctx)};
	pass.dyn = !pass.lora.on || pass.lora.once;
	pass.attn_scale = hp->attn_scale ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim);
	/* the soft-cap is in the scalar attend only */
	pass.attn_fast = pass.attn_fast && !hp->attn_softcap;
	for (int k = 0; k < 2; k++) {
		const int window = k ? hp->swa_window : 0;
		int n_span_all = 0; /* spans of all tokens */
		for (int t = 0; t < n; t++)
			n_span_all += tok_spans(window, toks[t].pos);
		struct attn_plan *pl = &pass.plan[k];
		pl->multi_span = n_span_all > n;
		pl->n_chunk = attn_chunks(hp, n_span_all, n_bands);
		pl->n_units = n_span_all * hp->n_head_kv * pl->n_chunk;
	}
	return pass;
}

/* This band's rows of an op of n rows in units of grain rows, as struct split
 * shares them out: for (sp = op_rows(...); split_next(&sp, &lo, &hi);). tag
 * tells apart the splits of one op that run without a barrier between them. */
static inline struct split op_rows(const struct pass *pass, uint32_t tag, int n, int grain)
{
	struct split sp;
	split_begin(&sp, pass->sync, tag, n, grain, pass->band, pass->n_bands, pass->dyn);
	return sp;
}

#define LORA_BIT(w) (1u << (w))

/* The adapter delta, first step: A @ x for the whole step of each matrix in
 * the mask `which` (LORA_BIT) that some token adapts, rows x[t * ldx ...],
 * when the plan computes it once per op; timed as matmul. */
static void delta_ax(struct pass *pass, int il, unsigned which, const float *x, size_t ldx)
{
	const struct deltas *d = &pass->lora;
	if (!d->once)
		return;
	prof_to(pass->sc, NX_PROF_MATMUL);
	for (int w = 0; w < NX_LORA_N_WHICH; w++)
		if (which & LORA_BIT(w))
			lora_a(pass->s, pass->toks, pass->n, il, (enum nx_lora_which)w, x, ldx, d->ax[w], d->part,
			       d->n_parts);
	if (d->split)
		band_sync(pass->sync, pass->sc, NX_PROF_MATMUL);
}

/* The adapter delta, second step: y[t] += scale * B @ (A @ x[t]) on rows
 * [r0, r1) of matrix w for every token's adapters (A @ x from delta_ax, or
 * computed here when the plan does not keep it). */
static inline void delta_add(struct pass *pass, int il, enum nx_lora_which w, const float *x, size_t ldx, float *y,
			     size_t ldy, int r0, int r1)
{
	if (pass->lora.on)
		lora_add(pass->s, pass->sc, pass->toks, pass->n, il, w, x, ldx, y, ldy, r0, r1, pass->lora.ax[w]);
}

/* Layer il's cache (k_cache or v_cache) of slot 0: n_head_kv runs of n_ctx
 * rows of nx_kv_row_bytes(cfg.kv_type, hd) bytes; a slot's is slot_stride further. */
static uint8_t *layer_cache(void *cache, const struct nx_state *s, int il, int hd)
{
	return (uint8_t *)cache + (size_t)il * s->cfg.n_ctx * (s->kv_dim / hd) * nx_kv_row_bytes(s->cfg.kv_type, hd);
}

static size_t slot_stride(const struct nx_state *s, int hd)
{
	return (size_t)s->n_layer * s->cfg.n_ctx * (s->kv_dim / hd) * nx_kv_row_bytes(s->cfg.kv_type, hd);
}

/* xn = rmsnorm(x) * w of the tokens (only those that want logits, with only_logits), in the band's scratch. */
static void norm_rows(struct pass *pass, const float *w, bool only_logits)
{
	const int dim = pass->hp->dim;
	for (int t = 0; t < pass->n; t++)
		if (!only_logits || pass->toks[t].logits_row >= 0)
			nx_rmsnorm(pass->sc->xn + (size_t)t * dim, pass->s->x + (size_t)t * dim, w, dim,
				   pass->hp->norm_eps);
}

/* ---------------------------------------------------------------- the pass */

/* Attention of one (token, head): softmax(scale * q . k_j) over j <= pos, times v
 * (key and value j at kc + j * ld, vc + j * ld), each score s soft-capped to
 * cap * tanh(s / cap) when cap > 0 (gemma2); ms: NULL or the largest score
 * and the sum of e^(score - largest), as nx_attend_f16 gives them. */
static void attend(float *out, const float *q, const nx_f16 *kc, const nx_f16 *vc, int pos, size_t ld, int hd,
		   float scale, float cap, float *att, float *ms)
{
	float mx = -INFINITY;
	for (int j = 0; j <= pos; j++) {
		const nx_f16 *k = kc + (size_t)j * ld;
		float d = 0;
		for (int i = 0; i < hd; i++)
			d += q[i] * f16_to_f32(k[i]);
		att[j] = d * scale;
		if (cap > 0)
			att[j] = cap * tanhf(att[j] / cap);
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
		const nx_f16 *v = vc + (size_t)j * ld;
		const float p = att[j];
		for (int i = 0; i < hd; i++)
			out[i] += p * f16_to_f32(v[i]);
	}
	const float inv = 1.0f / sum;
	for (int i = 0; i < hd; i++)
		out[i] *= inv;
	if (ms) {
		ms[0] = mx;
		ms[1] = sum;
	}
}

/* Rotation pair i's angle per position: base^(-2i/rope_dim), divided by the
 * file's divisor for it (div: rope_freqs, Llama 3.1+; LongRoPE's long or short
 * factors, nx_model_rope_factors) or the linear factor; YaRN
 * keeps the pairs below yarn_lo as they are, divides those above yarn_hi and
 * ramps between (HF modeling_rope_utils.py; llama.cpp's rope_yarn). */
static double rope_freq(const struct nx_model *m, const float *div, int i)
{
	const struct nx_hparams *hp = &m->hp;
	const double f = pow(hp->rope_base, -2.0 * i / hp->rope_dim);
	switch (hp->rope_scaling) {
	case NX_ROPE_LINEAR:
		return f / hp->rope_factor;
	case NX_ROPE_YARN: {
		const double w = hp->yarn_hi > hp->yarn_lo ? hp->yarn_hi - hp->yarn_lo : 0.001;
		const double r = (i - hp->yarn_lo) / w, ramp = r < 0 ? 0 : r > 1 ? 1 : r;
		return f / hp->rope_factor * ramp + f * (1 - ramp);
	}
	default:
		return div ? f / div[i] : f;
	}
}

/* Embedding rows, one band per token; and (private, redundant) each token's
 * RoPE cos and sin, shared by every layer: of theta_i = pos * rope_freq(i),
 * times YaRN's or LongRoPE's attention factor (1 otherwise). */
static void embed(struct pass *pass)
{
	const struct nx_hparams *hp = pass->hp;
	const struct nx_wt *e = &pass->m->tok_embd;
	const struct nx_type_traits *emb = nx_type_get(e->type);
	int lo, hi;
	band_range(pass->n, 1, pass->band, pass->n_bands, &lo, &hi);
	for (int t = lo; t < hi; t++) {
		float *x = pass->s->x + (size_t)t * hp->dim;
		emb->dequant((const uint8_t *)e->data + (size_t)pass->toks[t].token * e->row_bytes, x, hp->dim);
		for (int i = 0; hp->embd_scale && i < hp->dim; i++)
			x[i] *= hp->embd_scale;
	}
	for (int i = 0; hp->rope_base_swa && i < hp->rope_dim / 2; i++) { /* sliding layers' own, unscaled */
		const double f = pow(hp->rope_base_swa, -2.0 * i / hp->rope_dim);
		for (int t = 0; t < pass->n; t++) {
			float *cs = pass->sc->rope_swa + (size_t)t * hp->rope_dim;
			const double th = pass->toks[t].pos * f;
			cs[2 * i] = (float)cos(th);
			cs[2 * i + 1] = (float)sin(th);
		}
	}
	const double ms = hp->rope_scaling == NX_ROPE_YARN ? hp->yarn_mscale
			  : pass->m->rope_long ? hp->rope_attn_factor : 1.0;
	const float *div = nx_model_rope_factors(pass->m, pass->s->cfg.n_ctx);
	for (int i = 0; i < hp->rope_dim / 2; i++) {
		const double f = rope_freq(pass->m, div, i);
		for (int t = 0; t < pass->n; t++) {
			float *cs = pass->sc->rope + (size_t)t * hp->rope_dim;
			const double th = pass->toks[t].pos * f;
			cs[2 * i] = (float)(cos(th) * ms);
			cs[2 * i + 1] = (float)(sin(th) * ms);
		}
	}
}

/* [A] xn = rmsnorm(x) * attn_norm (private); Q, K, V rows of this band (plus
 * biases), the per-head norms and RoPE (unless the layer has none) on its Q
 * and K rows; K and V rows to the cache. */
static void attn_qkv(struct pass *pass, const struct nx_layer *L, int il)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const struct nx_tok_in *toks = pass->toks;
	const int n = pass->n, dim = hp->dim, q_dim = s->q_dim, kv_dim = s->kv_dim, hd = hp->head_dim;
	const int n_ctx = s->cfg.n_ctx;
	const bool ropes = nx_layer_ropes(hp, il);
	const float *rope = hp->rope_base_swa && nx_layer_window(hp, il) ? sc->rope_swa : sc->rope;
	norm_rows(pass, L->attn_norm, false);
	capture(s, hp, n, il, NX_CAP_ATTN, sc->xn, pass->band);
	sc->xq_src = NULL;
	int lo, hi;
	/* K's A @ x takes the place of Q's once Q's rows are done, unless split (struct deltas) */
	const unsigned qkv = LORA_BIT(NX_LORA_Q) | LORA_BIT(NX_LORA_K) | LORA_BIT(NX_LORA_V);
	delta_ax(pass, il, pass->lora.split ? qkv : LORA_BIT(NX_LORA_Q), sc->xn, dim);
	for (struct split sp = op_rows(pass, 0, q_dim, pass->rgrain); split_next(&sp, &lo, &hi);) {
		matmul(&L->wq, prep_act(sc, sc->xn, n, dim, &L->wq, toks, false), n, lo, hi, s->q, q_dim, L->bq,
		       MM_STORE);
		delta_add(pass, il, NX_LORA_Q, sc->xn, dim, s->q, q_dim, lo, hi);
		prof_to(sc, NX_PROF_OTHER);
		head_norm_rows(s->q, q_dim, n, lo, hi, L->q_norm, hp);
		if (ropes)
			rope_rows(s->q, q_dim, n, lo, hi, rope, hp);
		prof_to(sc, NX_PROF_MATMUL);
	}
	if (!pass->lora.split)
		delta_ax(pass, il, LORA_BIT(NX_LORA_K) | LORA_BIT(NX_LORA_V), sc->xn, dim);
	/* f16 values, or Q8_0 blocks of 32 along each head (K after RoPE): a band's
	 * rows are then whole blocks (kv_grain); both quantizers are the engine's
	 * own, bit-identical to their scalar references (tests/c/test_quant.c) */
	const bool q8 = s->cfg.kv_type == NX_KV_Q8_0;
	const struct nx_type_traits *to_kv = nx_type_get(q8 ? NX_Q8_0 : NX_F16);
	uint8_t *kc = layer_cache(s->k_cache, s, il, hd), *vc = layer_cache(s->v_cache, s, il, hd);
	const size_t stride = slot_stride(s, hd), row = nx_kv_row_bytes(s->cfg.kv_type, hd);
	const size_t vbytes = q8 ? sizeof(struct nx_block_q8_0) : sizeof(nx_f16), per = q8 ? QK8_0 : 1;
	const int kv_grain = q8 && pass->rgrain % QK8_0 ? 2 * pass->rgrain : pass->rgrain; /* rgrain: 16k */
	for (struct split sp = op_rows(pass, 1, kv_dim, kv_grain); split_next(&sp, &lo, &hi);) {
		matmul(&L->wk, prep_act(sc, sc->xn, n, dim, &L->wk, toks, false), n, lo, hi, s->k, kv_dim, L->bk,
		       MM_STORE);
		matmul(&L->wv, prep_act(sc, sc->xn, n, dim, &L->wv, toks, false), n, lo, hi, s->v, kv_dim, L->bv,
		       MM_STORE);
		delta_add(pass, il, NX_LORA_K, sc->xn, dim, s->k, kv_dim, lo, hi);
		delta_add(pass, il, NX_LORA_V, sc->xn, dim, s->v, kv_dim, lo, hi);
		prof_to(sc, NX_PROF_OTHER);
		head_norm_rows(s->k, kv_dim, n, lo, hi, L->k_norm, hp);
		if (ropes)
			rope_rows(s->k, kv_dim, n, lo, hi, rope, hp);
		for (int t = 0; t < n; t++)
			for (int c = lo, e; c < hi; c = e) { /* the part of [lo, hi) in kv head c / hd */
				const int kh = c / hd;
				e = (kh + 1) * hd < hi ? (kh + 1) * hd : hi;
				const size_t at = toks[t].slot * stride + ((size_t)kh * n_ctx + toks[t].pos) * row +
						  (size_t)(c - kh * hd) / per * vbytes;
				const size_t x = (size_t)t * kv_dim + c;
				to_kv->quant(s->k + x, kc + at, e - c);
				to_kv->quant(s->v + x, vc + at, e - c);
			}
		prof_to(sc, NX_PROF_MATMUL);
	}
}

/* One unit of attention (struct attn_plan): a token's query heads [h0, h1) of
 * one kv head over span sn of its ns, np positions whose K and V rows start at
 * off in the caches. */
struct attn_unit {
	int t, h0, h1, sn, ns, np;
	size_t off;
};

/* Unit u of the step's attention in a layer of window `window`: per (token, kv
 * head, chunk of its query heads, span of positions). *t, *t_base: the token of
 * the last unit asked for and the units of the tokens before it, a cursor that
 * moves forward as a band's units rise, and back to 0 for a range behind it. */
static struct attn_unit attn_unit_at(const struct pass *pass, int window, int u, int *t, int *t_base)
{
	const struct nx_hparams *hp = pass->hp;
	const struct nx_state *s = pass->s;
	const struct nx_tok_in *toks = pass->toks;
	const int group = hp->n_head / hp->n_head_kv, n_chunk = pass->plan[window != 0].n_chunk;
	const int per_span = hp->n_head_kv * n_chunk;
	if (u < *t_base) /* a range behind the last one (taken from another band's end) */
		*t = *t_base = 0;
	while (u >= *t_base + per_span * tok_spans(window, toks[*t].pos)) {
		*t_base += per_span * tok_spans(window, toks[*t].pos);
		++*t;
	}
	const int len = attn_len(window, toks[*t].pos), first = toks[*t].pos + 1 - len;
	const int ns = attn_spans(len), r = u - *t_base, sn = r % ns;
	const int kh = r / ns / n_chunk, ch = r / ns % n_chunk;
	const int p0 = first + sn * NX_ATTN_SPAN;
	return (struct attn_unit){
		.t = *t, .sn = sn, .ns = ns,
		.h0 = kh * group + ch * group / n_chunk, .h1 = kh * group + (ch + 1) * group / n_chunk,
		.np = sn + 1 < ns ? NX_ATTN_SPAN : len - sn * NX_ATTN_SPAN,
		.off = toks[*t].slot * slot_stride(s, hp->head_dim) +
		       ((size_t)kh * s->cfg.n_ctx + p0) * nx_kv_row_bytes(s->cfg.kv_type, hp->head_dim)};
}

/* [B] attention over the last attn_len positions of the token's slot (all of
 * 0..pos in a global layer), per unit (attn_unit_at): a chunk's heads share
 * each K/V read (nx_attend_f16). A token of one span writes att_out; one of
 * more, each span's output and (max, sum) to att_part / att_ms, merged in [C].
 * The kernels are given the band's next unit's keys to fetch ahead. */
static void attention(struct pass *pass, int il)
{
	const struct nx_hparams *hp = pass->hp;
	const struct nx_state *s = pass->s;
	const int q_dim = s->q_dim, hd = hp->head_dim, n_head = hp->n_head;
	const int window = nx_layer_window(hp, il);
	const struct attn_plan *plan = &pass->plan[window != 0];
	const int ns_max = pass->ns_max;
	const uint8_t *kc = layer_cache(s->k_cache, s, il, hd), *vc = layer_cache(s->v_cache, s, il, hd);
	const bool q8 = s->cfg.kv_type == NX_KV_Q8_0;
	int t = 0, t_base = 0; /* attn_unit_at's cursor */
	int lo, hi;
	for (struct split sp = op_rows(pass, 0, plan->n_units, 1); split_next(&sp, &lo, &hi);) {
		struct attn_unit a = attn_unit_at(pass, window, lo, &t, &t_base), next = {0};
		for (int u = lo; u < hi; u++, a = next) {
			const void *next_k = NULL;
			int next_n = 0;
			if (u + 1 < hi) {
				next = attn_unit_at(pass, window, u + 1, &t, &t_base);
				next_k = kc + next.off;
				next_n = next.np;
			}
			const float *q = s->q + (size_t)a.t * q_dim + (size_t)a.h0 * hd;
			float *out = s->att_out + (size_t)a.t * q_dim + (size_t)a.h0 * hd, *ms = NULL;
			if (a.ns > 1) { /* (token, span, head) */
				const size_t at = ((size_t)a.t * ns_max + a.sn) * n_head + a.h0;
				out = s->att_part + at * hd;
				ms = s->att_ms + at * 2;
			}
			if (q8) { /* rows of hd / 32 blocks; no soft-cap (nx_kv_type_check) */
				const struct nx_block_q8_0 *kb = (const void *)(kc + a.off), *vb = (const void *)(vc + a.off);
				if (pass->attn_fast)
					nx_attend_q8_0(out, q, a.h1 - a.h0, kb, vb, a.np, (size_t)hd / QK8_0, hd,
						       pass->attn_scale, pass->sc->att, ms, next_k, next_n);
				else
					nx_attend_q8_0_ref(out, q, a.h1 - a.h0, kb, vb, a.np, (size_t)hd / QK8_0, hd,
							   pass->attn_scale, pass->sc->att, ms);
			} else if (pass->attn_fast)
				nx_attend_f16(out, q, a.h1 - a.h0, (const nx_f16 *)(kc + a.off), (const nx_f16 *)(vc + a.off),
					      a.np, (size_t)hd, hd, pass->attn_scale, pass->sc->att, ms, next_k, next_n);
			else
				for (int h = 0; h < a.h1 - a.h0; h++)
					attend(out + (size_t)h * hd, q + (size_t)h * hd, (const nx_f16 *)(kc + a.off),
					       (const nx_f16 *)(vc + a.off), a.np - 1, (size_t)hd, hd, pass->attn_scale,
					       hp->attn_softcap, pass->sc->att, ms ? ms + 2 * h : NULL);
		}
	}
}

/* [C] x += Wo att: this band's rows of x, from att_out or (when some token has
 * more than one span) its own merged copy. */
static void attn_out(struct pass *pass, const struct nx_layer *L, int il)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const int n = pass->n, dim = hp->dim, q_dim = s->q_dim, hd = hp->head_dim, n_head = hp->n_head;
	const float *att = s->att_out;
	const int window = nx_layer_window(hp, il);
	if (pass->plan[window != 0].multi_span) {
		for (int i = 0; i < n; i++) {
			float *dst = sc->att_in + (size_t)i * q_dim;
			const int ns = tok_spans(window, pass->toks[i].pos);
			if (ns == 1)
				memcpy(dst, s->att_out + (size_t)i * q_dim, (size_t)q_dim * sizeof(float));
			else
				nx_attn_merge(dst, s->att_part + (size_t)i * pass->ns_max * n_head * hd,
					      s->att_ms + (size_t)i * pass->ns_max * n_head * 2, n_head, ns, hd);
		}
		att = sc->att_in;
	}
	capture(s, hp, n, il, NX_CAP_ATTN_OUT, att, pass->band);
	sc->xq_src = NULL;
	delta_ax(pass, il, LORA_BIT(NX_LORA_O), att, q_dim);
	int lo, hi;
	/* with a post-norm, Wo att goes to y first (post_norm_add) */
	float *const y = L->attn_post_norm ? s->y : s->x;
	for (struct split sp = op_rows(pass, 0, dim, ROW_GRAIN); split_next(&sp, &lo, &hi);) {
		matmul(&L->wo, prep_act(sc, att, n, q_dim, &L->wo, pass->toks, false), n, lo, hi, y, dim, NULL,
		       L->attn_post_norm ? MM_STORE : MM_ADD);
		delta_add(pass, il, NX_LORA_O, att, q_dim, y, dim, lo, hi);
	}
}

/* [D] xn = rmsnorm(x) * ffn_norm (private); hb = silu(Wgate xn) * (Wup xn) on this band's rows. */
static void ffn_gate_up(struct pass *pass, const struct nx_layer *L, int il)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const struct nx_tok_in *toks = pass->toks;
	const int n = pass->n, dim = hp->dim, n_ff = hp->n_ff;
	norm_rows(pass, L->ffn_norm, false);
	capture(s, hp, n, il, NX_CAP_FFN, sc->xn, pass->band);
	sc->xq_src = NULL;
	delta_ax(pass, il, LORA_BIT(NX_LORA_GATE) | LORA_BIT(NX_LORA_UP), sc->xn, dim);
	int lo, hi;
	for (struct split sp = op_rows(pass, 0, n_ff, ROW_GRAIN); split_next(&sp, &lo, &hi);) {
		matmul(&L->w_gate, prep_act(sc, sc->xn, n, dim, &L->w_gate, toks, false), n, lo, hi, s->hb, n_ff, NULL,
		       MM_STORE);
		delta_add(pass, il, NX_LORA_GATE, sc->xn, dim, s->hb, n_ff, lo, hi);
		const struct act up = prep_act(sc, sc->xn, n, dim, &L->w_up, toks, false);
		if (pass->lora.on) /* up's delta must land before the product */
			lora_swiglu(s, sc, toks, n, il, &L->w_up, up, sc->xn, dim, s->hb, n_ff, lo, hi,
				    pass->lora.ax[NX_LORA_UP], hp->gelu);
		else
			matmul(&L->w_up, up, n, lo, hi, s->hb, n_ff, NULL, hp->gelu ? MM_GEGLU : MM_SWIGLU);
	}
}

/* [E] x += Wdown hb: this band's rows of x. */
static void ffn_down(struct pass *pass, const struct nx_layer *L, int il)
{
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const int n = pass->n, dim = pass->hp->dim, n_ff = pass->hp->n_ff;
	capture(s, pass->hp, n, il, NX_CAP_FFN_HID, s->hb, pass->band);
	sc->xq_src = NULL;
	delta_ax(pass, il, LORA_BIT(NX_LORA_DOWN), s->hb, n_ff);
	int lo, hi;
	float *const y = L->ffn_post_norm ? s->y : s->x; /* as in attn_out */
	for (struct split sp = op_rows(pass, 0, dim, ROW_GRAIN); split_next(&sp, &lo, &hi);) {
		matmul(&L->w_down, prep_act(sc, s->hb, n, n_ff, &L->w_down, pass->toks, false), n, lo, hi, y, dim,
		       NULL, L->ffn_post_norm ? MM_STORE : MM_ADD);
		delta_add(pass, il, NX_LORA_DOWN, s->hb, n_ff, y, dim, lo, hi);
	}
}

/* [C'], [E'] (post_norms) x += rmsnorm(y) * w, one band per token: y is Wo's or
 * Wdown's output, whole rows only after the barrier that ends the matmul. */
static void post_norm_add(struct pass *pass, const float *w)
{
	const int dim = pass->hp->dim;
	int lo, hi;
	band_range(pass->n, 1, pass->band, pass->n_bands, &lo, &hi);
	for (int t = lo; t < hi; t++) {
		float *y = pass->s->y + (size_t)t * dim, *x = pass->s->x + (size_t)t * dim;
		nx_rmsnorm(y, y, w, dim, pass->hp->norm_eps);
		for (int i = 0; i < dim; i++)
			x[i] += y[i];
	}
}

/* ---------------------------------------------------------------- mixture of experts (model/moe.h) */

/* [D1] xn = rmsnorm(x) * ffn_norm (private); this band's rows of the router's
 * logits (n, n_expert) into the state. */
static void moe_router(struct pass *pass, const struct nx_layer *L, int il)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const int n = pass->n;
	norm_rows(pass, L->ffn_norm, false);
	capture(s, hp, n, il, NX_CAP_FFN, sc->xn, pass->band);
	sc->xq_src = NULL;
	int lo, hi;
	for (struct split sp = op_rows(pass, 0, hp->n_expert, ROW_GRAIN); split_next(&sp, &lo, &hi);)
		matmul(&L->moe_router, prep_act(sc, sc->xn, n, hp->dim, &L->moe_router, pass->toks, false), n, lo, hi,
		       s->moe_logits, hp->n_expert, NULL, MM_STORE);
}

/* [D2] every band routes the step alike (nx_moe_route) and gathers each
 * routed row's input; then this band's rows of silu(gate_e xn) * (up_e xn)
 * of the active experts e, each over the tokens routed to it only: the units
 * are (active expert, ROW_GRAIN rows of its n_ff_exp), shared out as one op. */
static void moe_gate_up(struct pass *pass, const struct nx_layer *L)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	struct nx_moe_route *r = &sc->route;
	const int dim = hp->dim, ff = hp->n_ff_exp, rows = pass->n * hp->n_expert_used;
	prof_to(sc, NX_PROF_QUANT);
	nx_moe_route(hp, s->moe_logits, pass->n, r);
	for (int i = 0; i < rows; i++)
		memcpy(sc->moe_x + (size_t)i * dim, sc->xn + (size_t)r->row_tok[i] * dim, (size_t)dim * sizeof(float));
	sc->xq_src = NULL;
	prof_to(sc, NX_PROF_MATMUL);
	const int per = (ff + ROW_GRAIN - 1) / ROW_GRAIN * ROW_GRAIN; /* an expert's rows, in whole units */
	int lo, hi;
	for (struct split sp = op_rows(pass, 0, r->n_active * per, ROW_GRAIN); split_next(&sp, &lo, &hi);)
		for (int u = lo; u < hi;) {
			const int i = u / per, r0 = u % per, r1 = hi - u < per - r0 ? r0 + hi - u : per;
			const int e = r->expert[i], t0 = r->off[i], cnt = r->off[i + 1] - t0;
			const struct nx_wt gate = nx_moe_expert(&L->moe_gate, e, ff), up = nx_moe_expert(&L->moe_up, e, ff);
			float *h = s->moe_h + (size_t)t0 * ff;
			const int e1 = r1 < ff ? r1 : ff;
			if (r0 < e1) {
				matmul(&gate, act_from(prep_act(sc, sc->moe_x, rows, dim, &gate, NULL, false), t0, dim), cnt, r0,
				       e1, h, ff, NULL, MM_STORE);
				matmul(&up, act_from(prep_act(sc, sc->moe_x, rows, dim, &up, NULL, false), t0, dim), cnt, r0, e1,
				       h, ff, NULL, MM_SWIGLU);
			}
			u += r1 - r0;
		}
}

/* [D3] x += sum over its experts e of w_e * (down_e h) for each token, on
 * this band's rows of x: each range of rows takes every active expert in
 * increasing id, so a token's sum runs in the same order whatever the batch. */
static void moe_down(struct pass *pass, const struct nx_layer *L)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const struct nx_moe_route *r = &sc->route;
	const int dim = hp->dim, ff = hp->n_ff_exp, rows = pass->n * hp->n_expert_used;
	sc->xq_src = NULL;
	int lo, hi;
	for (struct split sp = op_rows(pass, 0, dim, ROW_GRAIN); split_next(&sp, &lo, &hi);)
		for (int i = 0; i < r->n_active; i++) {
			const int t0 = r->off[i], cnt = r->off[i + 1] - t0, w = hi - lo;
			const struct nx_wt down = nx_moe_expert(&L->moe_down, r->expert[i], dim);
			/* rows [lo, hi) of the expert's tokens to moe_y (token j's at j * w) */
			matmul(&down, act_from(prep_act(sc, s->moe_h, rows, ff, &down, NULL, false), t0, ff), cnt, lo, hi,
			       sc->moe_y - lo, (size_t)w, NULL, MM_STORE);
			for (int j = 0; j < cnt; j++) {
				const float wt = r->row_w[t0 + j], *y = sc->moe_y + (size_t)j * w;
				float *x = s->x + (size_t)r->row_tok[t0 + j] * dim + lo;
				for (int c = 0; c < w; c++)
					x[c] += wt * y[c];
			}
		}
}

/* ---------------------------------------------------------------- qwen2moe's shared expert */

/* [D1'] beside the router, on the same xn: this band's rows of
 * silu(gate_s xn) * (up_s xn) into shexp_h (a dense FFN's rows, shared out as
 * ffn_gate_up's), and the shared gate's logit ffn_gate_inp_shexp . xn (one row). */
static void shexp_gate_up(struct pass *pass, const struct nx_layer *L)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const int n = pass->n, dim = hp->dim, ff = hp->n_ff_shexp;
	int lo, hi;
	for (struct split sp = op_rows(pass, 1, 1, ROW_GRAIN); split_next(&sp, &lo, &hi);)
		matmul(&L->shexp_gate_inp, prep_act(sc, sc->xn, n, dim, &L->shexp_gate_inp, pass->toks, false), n, lo,
		       hi, s->shexp_g, 1, NULL, MM_STORE);
	for (struct split sp = op_rows(pass, 2, ff, ROW_GRAIN); split_next(&sp, &lo, &hi);) {
		matmul(&L->shexp_gate, prep_act(sc, sc->xn, n, dim, &L->shexp_gate, pass->toks, false), n, lo, hi,
		       s->shexp_h, ff, NULL, MM_STORE);
		matmul(&L->shexp_up, prep_act(sc, sc->xn, n, dim, &L->shexp_up, pass->toks, false), n, lo, hi,
		       s->shexp_h, ff, NULL, MM_SWIGLU);
	}
}

/* [D4] after the routed experts' sum: x += sigmoid(g) * (down_s h) for each
 * token, on this band's rows of x (Hugging Face's routed + gated shared). */
static void shexp_down(struct pass *pass, const struct nx_layer *L)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const int n = pass->n, dim = hp->dim, ff = hp->n_ff_shexp;
	sc->xq_src = NULL; /* shexp_h is the previous layer's pointer too */
	int lo, hi;
	for (struct split sp = op_rows(pass, 0, dim, ROW_GRAIN); split_next(&sp, &lo, &hi);) {
		const int w = hi - lo;
		/* rows [lo, hi) of each token to moe_y (token t's at t * w) */
		matmul(&L->shexp_down, prep_act(sc, s->shexp_h, n, ff, &L->shexp_down, pass->toks, false), n, lo, hi,
		       sc->moe_y - lo, (size_t)w, NULL, MM_STORE);
		for (int t = 0; t < n; t++) {
			const float gate = 1.0f / (1.0f + expf(-s->shexp_g[t])), *y = sc->moe_y + (size_t)t * w;
			float *x = s->x + (size_t)t * dim + lo;
			for (int c = 0; c < w; c++)
				x[c] += gate * y[c];
		}
	}
}

/* The FFN of a mixture-of-experts layer: [D1], [D2], [D3] with barriers
 * between; with a shared expert, [D1'] beside [D1] and [D4] after [D3]. */
static void moe_ffn(struct pass *pass, const struct nx_layer *L, int il)
{
	const bool shexp = pass->hp->n_ff_shexp > 0;
	moe_router(pass, L, il);
	if (shexp)
		shexp_gate_up(pass, L);
	band_sync(pass->sync, pass->sc, NX_PROF_QUANT);
	moe_gate_up(pass, L);
	band_sync(pass->sync, pass->sc, NX_PROF_QUANT);
	moe_down(pass, L);
	if (shexp) {
		band_sync(pass->sync, pass->sc, NX_PROF_QUANT);
		shexp_down(pass, L);
	}
}

/* Output: final norm of the tokens that want logits (private), then this band's
 * vocabulary rows, and each row group's maximum for the sampler. */
static void logits(struct pass *pass)
{
	const struct nx_hparams *hp = pass->hp;
	struct nx_state *s = pass->s;
	struct nx_scratch *sc = pass->sc;
	const struct nx_tok_in *toks = pass->toks;
	const int n = pass->n;
	norm_rows(pass, pass->m->out_norm, true);
	sc->xq_src = NULL;
	const size_t n_groups = (size_t)(hp->n_vocab + NX_SAMPLE_GROUP - 1) / NX_SAMPLE_GROUP;
	int lo, hi;
	for (struct split sp = op_rows(pass, 0, hp->n_vocab, ROW_GRAIN); split_next(&sp, &lo, &hi);) {
		const struct nx_wt *out = &pass->m->output;
		matmul_logits(out, prep_act(sc, sc->xn, n, hp->dim, out, toks, true), toks, n, lo, hi, s->logits,
			      hp->n_vocab);
		const float cap = hp->final_softcap;
		for (int t = 0; cap > 0 && t < n; t++) /* gemma2's soft-cap: cap * tanh(logit / cap) */
			if (toks[t].logits_row >= 0) {
				float *row = s->logits + (size_t)toks[t].logits_row * hp->n_vocab;
				for (int r = lo; r < hi; r++)
					row[r] = cap * tanhf(row[r] / cap);
			}
		for (int t = 0; t < n; t++) /* while the rows are in this core's cache */
			if (toks[t].logits_row >= 0)
				nx_sample_group_max(s->logits + (size_t)toks[t].logits_row * hp->n_vocab + lo, hi - lo,
						    s->logit_gmax + (size_t)toks[t].logits_row * n_groups + lo / NX_SAMPLE_GROUP);
	}
}

void nx_forward(const struct nx_model *m, struct nx_state *s, const struct nx_tok_in *toks, int n,
		int band, int n_bands, struct nx_scratch *sc, const struct nx_sync *sync)
{
	struct pass pass = pass_begin(m, s, toks, n, band, n_bands, sc, sync);
	if (sc->prof) {
		sc->prof->mark = sc->prof->begin = nx_prof_now();
		sc->prof->phase = NX_PROF_OTHER;
		sc->prof->steps++;
	}
	embed(&pass);
	band_sync(sync, sc, NX_PROF_QUANT);
	for (int il = 0; il < m->hp.n_layer; il++) {
		const struct nx_layer *L = &m->layers[il];
		attn_qkv(&pass, L, il);
		band_sync(sync, sc, NX_PROF_ATTN);
		attention(&pass, il);
		band_sync(sync, sc, NX_PROF_QUANT);
		attn_out(&pass, L, il);
		band_sync(sync, sc, NX_PROF_QUANT);
		if (L->attn_post_norm) {
			post_norm_add(&pass, L->attn_post_norm);
			band_sync(sync, sc, NX_PROF_QUANT);
		}
		if (m->hp.n_expert) {
			moe_ffn(&pass, L, il);
		} else {
			ffn_gate_up(&pass, L, il);
			band_sync(sync, sc, NX_PROF_QUANT);
			ffn_down(&pass, L, il);
		}
		band_sync(sync, sc, NX_PROF_QUANT);
		if (L->ffn_post_norm) {
			post_norm_add(&pass, L->ffn_post_norm);
			band_sync(sync, sc, NX_PROF_QUANT);
		}
	}
	logits(&pass);
	band_sync(sync, sc, NX_PROF_OTHER);
	prof_to(sc, NX_PROF_OTHER);
	if (sc->prof)
		sc->prof->end = sc->prof->mark;
}
