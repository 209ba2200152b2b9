/* test_attn.c - nx_attend_f16 (kern/attn.h): against a double-precision reference within a
 * rounding bound, and each head's output bit-identical whether it is computed alone or
 * with the other query heads of its group; nx_attn_merge of spans' outputs: against the
 * same reference over all the keys, and bit for bit against nx_attn_merge_ref.
 * nx_attend_q8_0 (a Q8_0 cache) and its scalar reference nx_attend_q8_0_ref: against the
 * same double reference of the blocks' values within the same bound; the AVX-512 one bit for
 * bit against nx_attend_f16 where every value is exact in both formats, and per head
 * whatever the group.
 *
 * The bound: |out_i - ref_i| <= 2^-24 * (4 (hd / 16 + 4) S + n + 64) * V, S the largest
 * |scale * q . k_j| summed by magnitude (scale * sum_i |q_i k_ji|), V the largest |v_ji|.
 * A score passes through hd / 16 + 4 float roundings (the FMA chain over 16-lane chunks,
 * the reduction tree), each costing at most 2^-24 of S, and an error d in a score scales
 * its weight by e^d, which moves the output by at most ~2d V (x2 again for the max, which
 * the reference takes exactly); exp_neg is within ~2e-7 (~4 ulps); the weighted sum and
 * the sum of the weights add up to n / 2 + 4 and n / 16 + 4 roundings of at most V and
 * the total. The typical error is far smaller; one wrong chunk of K or V is off by ~V. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kern/attn.h"
#include "kern/quant.h"
#include "tests/c/rng.h"

/* ---------------------------------------------------------------- helpers */

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	assert_non_null(p);
	return p;
}

static const int lens[] = { 1, 2, 3, 4, 5, 17, 64, 255, 1000 };
#define N_LENS (sizeof(lens) / sizeof(lens[0]))
static const int hds[] = { 64, 128, 32, 96 }; /* 32 and 96: the generic (one head a pass) path */
#define N_HDS (sizeof(hds) / sizeof(hds[0]))
#define MAX_Q 7
#define KV_HEADS 3 /* the cache rows hold 3 kv heads: ld = 3 hd, the test's one the middle one */
#define GUARD 16   /* floats past each output and scratch buffer that must stay untouched */
#define POISON 0x7fc01234u

/* One case's data: K and V rows of n keys (kv head 1 of KV_HEADS), n_q query heads. */
struct attn_case {
	int n, hd, n_q;
	size_t ld;
	float scale;
	nx_f16 *kc, *vc; /* (n, ld) each; the test's head at + hd */
	float *q;        /* (n_q, hd) */
	/* Q8_0 rows of the same shape (ld / 32 blocks a row), and what the reference reads:
	 * the f16 values, or with q8 set the blocks' values */
	struct nx_block_q8_0 *kq, *vq;
	float *kf, *vf;
	bool q8;
};

static void case_init(struct attn_case *c, int n, int hd, int n_q, float scale)
{
	c->n = n, c->hd = hd, c->n_q = n_q, c->ld = (size_t)KV_HEADS * hd, c->scale = scale;
	c->kc = xmalloc((size_t)n * c->ld * sizeof(nx_f16));
	c->vc = xmalloc((size_t)n * c->ld * sizeof(nx_f16));
	c->q = xmalloc((size_t)n_q * hd * sizeof(float));
	/* keys with a per-key offset so the scores spread; every value through f16 */
	for (int j = 0; j < n; j++) {
		const float off = 0.5f * rng_gauss();
		for (size_t i = 0; i < c->ld; i++) {
			c->kc[(size_t)j * c->ld + i] = nx_f32_to_f16(rng_gauss() + off);
			c->vc[(size_t)j * c->ld + i] = nx_f32_to_f16(rng_gauss());
		}
	}
	for (int i = 0; i < n_q * hd; i++)
		c->q[i] = rng_gauss();
	c->kq = c->vq = NULL;
	c->q8 = false;
	c->kf = xmalloc((size_t)n * c->ld * sizeof(float));
	c->vf = xmalloc((size_t)n * c->ld * sizeof(float));
	for (size_t i = 0; i < (size_t)n * c->ld; i++)
		c->kf[i] = nx_f16_to_f32(c->kc[i]), c->vf[i] = nx_f16_to_f32(c->vc[i]);
}

/* The case's K and V as Q8_0 blocks too. exact: each block's scale a power of two and its
 * levels random, written to the f16 rows as well (d q is exact in f16 then), so both
 * formats hold the same values; else the f16 values quantized (nx_type_ref(NX_Q8_0)), and
 * the reference reads the blocks' values. */
static void case_q8(struct attn_case *c, bool exact)
{
	const size_t nb = (size_t)c->n * c->ld / QK8_0;
	c->kq = xmalloc(nb * sizeof(*c->kq));
	c->vq = xmalloc(nb * sizeof(*c->vq));
	const struct nx_type_traits *q8 = nx_type_ref(NX_Q8_0);
	for (int w = 0; w < 2; w++) {
		struct nx_block_q8_0 *b = w ? c->vq : c->kq;
		nx_f16 *h = w ? c->vc : c->kc;
		float *f = w ? c->vf : c->kf;
		for (size_t i = 0; i < nb; i++) {
			if (exact) {
				const float d = ldexpf(1.0f, -2 - (int)(rng_next() % 6));
				b[i].d = nx_f32_to_f16(d);
				for (int j = 0; j < QK8_0; j++) {
					b[i].qs[j] = (int8_t)((int)(rng_next() % 255) - 127);
					h[i * QK8_0 + j] = nx_f32_to_f16(d * b[i].qs[j]);
				}
			} else {
				q8->quant(f + i * QK8_0, b + i, QK8_0);
			}
			for (int j = 0; j < QK8_0; j++)
				f[i * QK8_0 + j] = nx_f16_to_f32(b[i].d) * b[i].qs[j];
		}
	}
	c->q8 = true;
}

static void case_free(struct attn_case *c)
{
	free(c->kc);
	free(c->vc);
	free(c->q);
	free(c->kq);
	free(c->vq);
	free(c->kf);
	free(c->vf);
}

/* The attention function under test: nx_attend_f16, or with the case's Q8_0 rows
 * nx_attend_q8_0 (ref: nx_attend_q8_0_ref), on kv head 1. hint: the next keys to
 * fetch ahead are kv head 0's, as another unit's would be (the reference takes none). */
static void attend_case(const struct attn_case *c, bool ref, float *out, const float *q, int n_q, int p0, int np,
			float *att, float *ms, bool hint)
{
	const size_t lb = c->ld / QK8_0;
	if (!c->q8)
		nx_attend_f16(out, q, n_q, c->kc + (size_t)p0 * c->ld + c->hd, c->vc + (size_t)p0 * c->ld + c->hd, np,
			      c->ld, c->hd, c->scale, att, ms, hint ? c->kc : NULL, hint ? c->n : 0);
	else if (ref)
		nx_attend_q8_0_ref(out, q, n_q, c->kq + (size_t)p0 * lb + c->hd / QK8_0,
				   c->vq + (size_t)p0 * lb + c->hd / QK8_0, np, lb, c->hd, c->scale, att, ms);
	else
		nx_attend_q8_0(out, q, n_q, c->kq + (size_t)p0 * lb + c->hd / QK8_0, c->vq + (size_t)p0 * lb + c->hd / QK8_0,
			       np, lb, c->hd, c->scale, att, ms, hint ? c->kq : NULL, hint ? c->n : 0);
}

/* Scratch for n_q heads as kern/attn.h asks for: min(n_q, nx_attn_group(hd)) * n floats. */
static size_t att_len(const struct attn_case *c)
{
	const int g = nx_attn_group(c->hd);
	return (size_t)(c->n_q < g ? c->n_q : g) * c->n;
}

/* nx_attend_f16 on heads [h0, h0 + n_q) of the case into out (n_q x hd floats), with
 * poisoned guards after out and the scratch, which must come back untouched; once
 * more with keys to fetch ahead (and with ms, n_q x 2 floats, non-NULL, asking for
 * each head's largest score and sum), which must not change a bit of out. */
static void run_with(const struct attn_case *c, bool ref, int h0, int n_q, float *out, float *ms)
{
	const size_t n_out = (size_t)n_q * c->hd;
	struct attn_case one = *c;
	one.n_q = n_q;
	const size_t n_att = att_len(&one);
	float *o = xmalloc((n_out + GUARD) * sizeof(float)), *att = xmalloc((n_att + GUARD) * sizeof(float));
	const uint32_t poison = POISON;
	for (size_t i = 0; i < n_out + GUARD; i++)
		memcpy(o + i, &poison, sizeof(poison));
	for (size_t i = 0; i < n_att + GUARD; i++)
		memcpy(att + i, &poison, sizeof(poison));
	attend_case(c, ref, o, c->q + (size_t)h0 * c->hd, n_q, 0, c->n, att, NULL, false);
	for (size_t i = 0; i < GUARD; i++) {
		assert_memory_equal(o + n_out + i, &poison, sizeof(poison));
		assert_memory_equal(att + n_att + i, &poison, sizeof(poison));
	}
	memcpy(out, o, n_out * sizeof(float));
	memset(o, 0, n_out * sizeof(float));
	attend_case(c, ref, o, c->q + (size_t)h0 * c->hd, n_q, 0, c->n, att, ms, true);
	assert_memory_equal(o, out, n_out * sizeof(float));
	free(o);
	free(att);
}

static void run(const struct attn_case *c, int h0, int n_q, float *out, float *ms)
{
	run_with(c, false, h0, n_q, out, ms);
}

/* out (hd doubles) = the case's head h, in double from the f16 values; *bound as in the
 * header; ms: the largest score and the sum of e^(score - it), and bounds on their errors
 * (a score's, as above; the sum's: each weight's e^d, d up to twice that, plus the exp's
 * ~4 ulps and n / 16 + 4 float additions). */
static void reference_seq(const struct attn_case *c, int h, double *out, double *bound, double ms[4], bool seq)
{
	const int n = c->n, hd = c->hd;
	const float *q = c->q + (size_t)h * hd;
	double *s = xmalloc((size_t)n * sizeof(double)), mx = -INFINITY, S = 0, V = 0, sum = 0;
	for (int j = 0; j < n; j++) {
		const float *k = c->kf + (size_t)j * c->ld + hd;
		double d = 0, m = 0;
		for (int i = 0; i < hd; i++) {
			d += (double)q[i] * k[i];
			m += fabs((double)q[i] * k[i]);
		}
		s[j] = d * c->scale;
		mx = fmax(mx, s[j]);
		S = fmax(S, m * c->scale);
	}
	for (int j = 0; j < n; j++) {
		s[j] = exp(s[j] - mx);
		sum += s[j];
	}
	for (int i = 0; i < hd; i++)
		out[i] = 0;
	for (int j = 0; j < n; j++) {
		const float *v = c->vf + (size_t)j * c->ld + hd;
		for (int i = 0; i < hd; i++) {
			out[i] += s[j] * v[i];
			V = fmax(V, fabs(v[i]));
		}
	}
	for (int i = 0; i < hd; i++)
		out[i] /= sum;
	/* seq: every sum one element at a time (nx_attend_q8_0_ref) */
	const double terms = seq ? hd + 4 : hd / 16 + 4, adds = seq ? 2.0 * n : n;
	*bound = ldexp(4.0 * terms * S + adds + 64, -24) * V;
	const double es = ldexp(2.0 * terms * S, -24);
	ms[0] = mx, ms[1] = sum, ms[2] = es, ms[3] = sum * (2 * es + ldexp(n / 16 + 8, -24));
	free(s);
}

static void reference(const struct attn_case *c, int h, double *out, double *bound, double ms[4])
{
	reference_seq(c, h, out, bound, ms, false);
}

static bool fast_or_skip(void)
{
	if (nx_attn_fast(64))
		return true;
	print_message("nx_attend_f16 cannot run here (no AVX-512, or NX_KERN=ref/avx2): skipped\n");
	skip();
	return false;
}

/* ---------------------------------------------------------------- tests */

/* Every head of n_q = 1..MAX_Q against the double reference. */
static void test_reference(void **state)
{
	(void)state;
	if (!fast_or_skip())
		return;
	rng_state = 0x5eed0001;
	const float scales[] = { 0, 1, 8 }; /* 0: 1 / sqrt(hd); 8: peaked softmax, most weights flush to 0 */
	double worst = 0;                   /* largest error / bound seen */
	for (size_t ih = 0; ih < N_HDS; ih++)
		for (size_t il = 0; il < N_LENS; il++)
			for (int n_q = 1; n_q <= MAX_Q; n_q++)
				for (size_t is = 0; is < sizeof(scales) / sizeof(scales[0]); is++) {
					const int hd = hds[ih], n = lens[il];
					const float scale = scales[is] ? scales[is] / sqrtf((float)hd) : 1 / sqrtf((float)hd);
					if (!nx_attn_fast(hd))
						continue;
					struct attn_case c;
					case_init(&c, n, hd, n_q, scale);
					float *out = xmalloc((size_t)n_q * hd * sizeof(float)), ms[2 * MAX_Q];
					double *ref = xmalloc((size_t)hd * sizeof(double)), bound, rms[4];
					run(&c, 0, n_q, out, ms);
					for (int h = 0; h < n_q; h++) {
						reference(&c, h, ref, &bound, rms);
						if (!(fabs(ms[2 * h] - rms[0]) <= rms[2] && fabs(ms[2 * h + 1] - rms[1]) <= rms[3]))
							fail_msg("hd %d n %d n_q %d head %d: largest score %.9g sum %.9g, want %.9g "
								 "(+-%.3g) and %.9g (+-%.3g)", hd, n, n_q, h, (double)ms[2 * h],
								 (double)ms[2 * h + 1], rms[0], rms[2], rms[1], rms[3]);
						for (int i = 0; i < hd; i++) {
							const double e = fabs(out[(size_t)h * hd + i] - ref[i]);
							if (!(e <= bound))
								fail_msg("hd %d n %d n_q %d scale %g head %d [%d]: %.9g vs %.9g "
									 "(|d| %.3g > bound %.3g)",
									 hd, n, n_q, (double)scale, h, i,
									 (double)out[(size_t)h * hd + i], ref[i], e, bound);
							worst = fmax(worst, e / bound);
						}
					}
					free(out);
					free(ref);
					case_free(&c);
				}
	print_message("largest error: %.3f of the bound\n", worst);
}

/* Heads computed n_q at a time (and from any first head) give the bits of one at a time. */
static void test_grouped_bits(void **state)
{
	(void)state;
	if (!fast_or_skip())
		return;
	rng_state = 0x5eed0002;
	for (size_t ih = 0; ih < N_HDS; ih++)
		for (size_t il = 0; il < N_LENS; il++) {
			const int hd = hds[ih], n = lens[il];
			if (!nx_attn_fast(hd))
				continue;
			struct attn_case c;
			case_init(&c, n, hd, MAX_Q, 1 / sqrtf((float)hd));
			float *alone = xmalloc((size_t)MAX_Q * hd * sizeof(float));
			float *grouped = xmalloc((size_t)MAX_Q * hd * sizeof(float));
			for (int h = 0; h < MAX_Q; h++)
				run(&c, h, 1, alone + (size_t)h * hd, NULL);
			for (int h0 = 0; h0 < MAX_Q; h0++)
				for (int n_q = 1; h0 + n_q <= MAX_Q; n_q++) {
					run(&c, h0, n_q, grouped, NULL);
					for (int h = 0; h < n_q; h++)
						if (memcmp(grouped + (size_t)h * hd, alone + (size_t)(h0 + h) * hd,
							   (size_t)hd * sizeof(float)))
							fail_msg("hd %d n %d: head %d of %d from head %d differs from it alone",
								 hd, n, h, n_q, h0);
				}
			free(alone);
			free(grouped);
			case_free(&c);
		}
}

/* Keys cut into spans of SPAN (the forward pass's NX_ATTN_SPAN), each span attended on
 * its own, the outputs merged: the merge within twice the whole range's bound of the
 * double reference over all keys (it adds a rounding of each span's weight and the
 * spans' sums), and nx_attn_merge's bits those of nx_attn_merge_ref. */
#define SPAN 256
static void test_merge(void **state)
{
	(void)state;
	if (!fast_or_skip())
		return;
	rng_state = 0x5eed0003;
	const int ns[] = { 257, 600, 1000, 1300 }, n_q = 3;
	const float scales[] = { 1, 8 };
	double worst = 0;
	for (size_t ih = 0; ih < N_HDS; ih++)
		for (size_t il = 0; il < sizeof(ns) / sizeof(ns[0]); il++)
			for (size_t is = 0; is < sizeof(scales) / sizeof(scales[0]); is++) {
				const int hd = hds[ih], n = ns[il], n_span = (n + SPAN - 1) / SPAN;
				if (!nx_attn_fast(hd))
					continue;
				struct attn_case c;
				case_init(&c, n, hd, n_q, scales[is] / sqrtf((float)hd));
				/* (span, head) outputs and (max, sum)s, as the forward pass lays them out */
				float *part = xmalloc((size_t)n_span * n_q * hd * sizeof(float));
				float *ms = xmalloc((size_t)n_span * n_q * 2 * sizeof(float));
				float *att = xmalloc((size_t)nx_attn_group(hd) * SPAN * sizeof(float));
				for (int sp = 0; sp < n_span; sp++) {
					const int p0 = sp * SPAN, np = (p0 + SPAN < n ? SPAN : n - p0);
					/* the next span's keys fetched ahead, as the forward pass asks */
					const int next_n = sp + 1 < n_span ? (p0 + 2 * SPAN < n ? SPAN : n - p0 - SPAN) : 0;
					nx_attend_f16(part + (size_t)sp * n_q * hd, c.q, n_q, c.kc + (size_t)p0 * c.ld + hd,
						      c.vc + (size_t)p0 * c.ld + hd, np, c.ld, hd, c.scale, att,
						      ms + (size_t)sp * n_q * 2,
						      next_n ? c.kc + (size_t)(p0 + SPAN) * c.ld + hd : NULL, next_n);
				}
				const size_t n_out = (size_t)n_q * hd;
				float *fast = xmalloc((n_out + GUARD) * sizeof(float)), *ref = xmalloc(n_out * sizeof(float));
				const uint32_t poison = POISON;
				for (size_t i = 0; i < n_out + GUARD; i++)
					memcpy(fast + i, &poison, sizeof(poison));
				nx_attn_merge(fast, part, ms, n_q, n_span, hd);
				nx_attn_merge_ref(ref, part, ms, n_q, n_span, hd);
				for (size_t i = 0; i < GUARD; i++)
					assert_memory_equal(fast + n_out + i, &poison, sizeof(poison));
				if (memcmp(fast, ref, n_out * sizeof(float)))
					fail_msg("hd %d n %d: nx_attn_merge differs from nx_attn_merge_ref", hd, n);
				double *want = xmalloc((size_t)hd * sizeof(double)), bound, rms[4];
				for (int h = 0; h < n_q; h++) {
					reference(&c, h, want, &bound, rms);
					for (int i = 0; i < hd; i++) {
						const double e = fabs(fast[(size_t)h * hd + i] - want[i]);
						if (!(e <= 2 * bound))
							fail_msg("hd %d n %d scale %g head %d [%d]: merged %.9g vs %.9g "
								 "(|d| %.3g > 2 x bound %.3g)", hd, n, (double)c.scale, h, i,
								 (double)fast[(size_t)h * hd + i], want[i], e, bound);
						worst = fmax(worst, e / (2 * bound));
					}
				}
				free(want);
				free(fast);
				free(ref);
				free(att);
				free(ms);
				free(part);
				case_free(&c);
			}
	print_message("merge: largest error %.3f of the bound\n", worst);
}

/* nx_attend_q8_0 (where it runs) and nx_attend_q8_0_ref over blocks quantized from random
 * K and V, against the double reference of the blocks' values: the vector one within the
 * header's bound, the scalar one within it with its sequential sums (hd roundings per score,
 * n per output and sum in place of hd / 16 + 4 and n / 2 + 4). */
static void test_q8_reference(void **state)
{
	(void)state;
	rng_state = 0x5eed0004;
	const float scales[] = { 1, 8 };
	const int nqs[] = { 1, 2, 3, 7 };
	double worst[2] = { 0, 0 };
	for (size_t ih = 0; ih < N_HDS; ih++)
		for (size_t il = 0; il < N_LENS; il++)
			for (size_t iq = 0; iq < sizeof(nqs) / sizeof(nqs[0]); iq++)
				for (size_t is = 0; is < sizeof(scales) / sizeof(scales[0]); is++) {
					const int hd = hds[ih], n = lens[il], n_q = nqs[iq];
					struct attn_case c;
					case_init(&c, n, hd, n_q, scales[is] / sqrtf((float)hd));
					case_q8(&c, false);
					float *out = xmalloc((size_t)n_q * hd * sizeof(float)), ms[2 * MAX_Q];
					double *ref = xmalloc((size_t)hd * sizeof(double)), bound, rms[4];
					for (int scalar = 0; scalar < 2; scalar++) {
						if (!scalar && !nx_attn_fast(hd))
							continue;
						run_with(&c, scalar, 0, n_q, out, ms);
						for (int h = 0; h < n_q; h++) {
							reference_seq(&c, h, ref, &bound, rms, scalar);
							const double b = bound;
							for (int i = 0; i < hd; i++) {
								const double e = fabs(out[(size_t)h * hd + i] - ref[i]);
								if (!(e <= b))
									fail_msg("%s hd %d n %d n_q %d head %d [%d]: %.9g vs %.9g "
										 "(|d| %.3g > bound %.3g)", scalar ? "scalar" : "avx512",
										 hd, n, n_q, h, i, (double)out[(size_t)h * hd + i], ref[i],
										 e, b);
								worst[scalar] = fmax(worst[scalar], e / b);
							}
						}
					}
					free(out);
					free(ref);
					case_free(&c);
				}
	print_message("q8_0: largest error %.3f (avx512), %.3f (scalar) of the bound\n", worst[0], worst[1]);
}

/* Where every value is exact in both formats, nx_attend_q8_0 gives nx_attend_f16's bits
 * (outputs, largest scores and sums): after the load it is the same arithmetic. */
static void test_q8_bits_as_f16(void **state)
{
	(void)state;
	if (!fast_or_skip())
		return;
	rng_state = 0x5eed0005;
	for (size_t ih = 0; ih < N_HDS; ih++)
		for (size_t il = 0; il < N_LENS; il++)
			for (int n_q = 1; n_q <= MAX_Q; n_q++) {
				const int hd = hds[ih], n = lens[il];
				if (!nx_attn_fast(hd))
					continue;
				struct attn_case c;
				case_init(&c, n, hd, n_q, 1 / sqrtf((float)hd));
				case_q8(&c, true);
				const size_t n_out = (size_t)n_q * hd;
				float *a = xmalloc(n_out * sizeof(float)), *b = xmalloc(n_out * sizeof(float));
				float ma[2 * MAX_Q], mb[2 * MAX_Q];
				run(&c, 0, n_q, a, ma);
				c.q8 = false;
				run(&c, 0, n_q, b, mb);
				if (memcmp(a, b, n_out * sizeof(float)) || memcmp(ma, mb, 2 * (size_t)n_q * sizeof(float)))
					fail_msg("hd %d n %d n_q %d: q8_0 differs from f16 on the same values", hd, n, n_q);
				free(a);
				free(b);
				case_free(&c);
			}
}

/* nx_attend_q8_0: heads n_q at a time give the bits of one at a time, as nx_attend_f16's. */
static void test_q8_grouped_bits(void **state)
{
	(void)state;
	if (!fast_or_skip())
		return;
	rng_state = 0x5eed0006;
	for (size_t ih = 0; ih < N_HDS; ih++)
		for (size_t il = 0; il < N_LENS; il++) {
			const int hd = hds[ih], n = lens[il];
			if (!nx_attn_fast(hd))
				continue;
			struct attn_case c;
			case_init(&c, n, hd, MAX_Q, 1 / sqrtf((float)hd));
			case_q8(&c, false);
			float *alone = xmalloc((size_t)MAX_Q * hd * sizeof(float));
			float *grouped = xmalloc((size_t)MAX_Q * hd * sizeof(float));
			for (int h = 0; h < MAX_Q; h++)
				run(&c, h, 1, alone + (size_t)h * hd, NULL);
			for (int h0 = 0; h0 < MAX_Q; h0++)
				for (int n_q = 1; h0 + n_q <= MAX_Q; n_q++) {
					run(&c, h0, n_q, grouped, NULL);
					if (memcmp(grouped, alone + (size_t)h0 * hd, (size_t)n_q * hd * sizeof(float)))
						fail_msg("q8_0 hd %d n %d: heads %d..%d together differ from alone", hd, n,
							 h0, h0 + n_q - 1);
				}
			free(alone);
			free(grouped);
			case_free(&c);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_grouped_bits),
		cmocka_unit_test(test_merge),
		cmocka_unit_test(test_q8_reference),
		cmocka_unit_test(test_q8_bits_as_f16),
		cmocka_unit_test(test_q8_grouped_bits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
