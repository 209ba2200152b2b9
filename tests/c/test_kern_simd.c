/* test_kern_simd.c - every SIMD kernel set this CPU can run, against the scalar reference:
 * dots within a float-summation bound, dot_rows bit-identical to dot, activation
 * quantizers (one- and two-part) bit-identical to the reference blocks, rmsnorm
 * and the packed kernels' activation side values bit-identical to their references.
 *
 * The bound: |simd - ref| <= 1e-5 * T, T = sum over the dot's addends of their
 * magnitudes (sum_i |w_i a_i| over dequantized values, with a block's scale part
 * and min part counted apart: sum_i (|d q_i| + |m|) |a_i|). Both kernels compute the
 * same exact integer block sums and the same float scales; they differ only in
 * how the float terms are rounded and added (the reference: one running float sum
 * per block in order, or double for f32/f16/bf16; SIMD: lanes, pairs of blocks,
 * a tree at the end). Each rounding costs at most 2^-24 of the magnitude it
 * touches, and no addend passes through more than ~(blocks + log2 lanes + 3) of
 * them, so for the lengths tested here (<= 48 blocks of 32, 6 super-blocks, 1536
 * floats, i.e. <= ~100 roundings per side) the worst case is about 1.2e-5 * T
 * and the typical one far smaller: 1e-5 catches any wrong integer (one unit of
 * one level moves the result by ~1/n of T, >= 6e-4 here) while leaving the
 * summation order free. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kern/cpu.h"
#include "kern/norm.h"
#include "kern/pack.h"
#include "kern/pack_act.h"
#include "kern/quant.h"
#include "tests/c/rng.h"

/* The kernel sets (kern/x86_*.c), as kern/quant_dispatch.c declares them. */
void nx_kern_avx2_install(struct nx_type_traits *tab, size_t n);
void nx_kern_avx512_install(struct nx_type_traits *tab, size_t n);

struct kset {
	const char *name;
	enum nx_kset set;
	void (*install)(struct nx_type_traits *tab, size_t n);
};

static const struct kset ksets[] = {
	{ "avx2", NX_KSET_AVX2, nx_kern_avx2_install },
	{ "avx512", NX_KSET_AVX512, nx_kern_avx512_install },
};

/* Whether this CPU runs the dot kernels of ks (kern/cpu.c's table). */
static bool usable(const struct kset *ks)
{
	return nx_kern_runs(NX_KFAM_DOT, ks->set, nx_cpu_features());
}

#define N_IDS 64

/* The reference table with only this set laid over it (what the set itself provides). */
static void set_table(const struct kset *ks, struct nx_type_traits *tab)
{
	memset(tab, 0, N_IDS * sizeof(*tab));
	for (uint32_t t = 0; t < N_IDS; t++) {
		const struct nx_type_traits *ref = nx_type_ref((enum nx_type)t);
		if (ref)
			tab[t] = *ref;
	}
	ks->install(tab, N_IDS);
}

/* Weight types in the lead's priority order. */
static const enum nx_type wtypes[] = { NX_Q4_1, NX_Q8_0, NX_Q4_0, NX_Q4_K, NX_Q6_K, NX_Q5_K,
				       NX_Q5_0, NX_Q5_1, NX_F16, NX_BF16, NX_F32, NX_Q2_K,
				       NX_Q3_K, NX_IQ4_NL, NX_IQ4_XS };
#define N_WTYPES (sizeof(wtypes) / sizeof(wtypes[0]))

/* ---------------------------------------------------------------- random data */

/* Weight- or activation-like data: gaussian, an offset per row, a few outliers. */
static void fill_data(float *x, int64_t n)
{
	const float off = 0.3f * rng_gauss();
	for (int64_t i = 0; i < n; i++) {
		x[i] = rng_gauss() + off;
		if (rng_next() % 50 == 0)
			x[i] *= 8;
	}
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	assert_non_null(p);
	return p;
}

/* n elements of type t from floats with the reference quantizer. */
static void *make_row(enum nx_type t, const float *x, int64_t n)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	void *q = xmalloc((size_t)nx_row_size(t, n));
	tr->quant(x, q, n);
	return q;
}

/* A random finite f16 scale of magnitude 2^-10 .. 1. */
static nx_f16 rand_scale(void)
{
	float v = (float)ldexp(0.5 + 0.5 * rng_uniform(), -(int)(rng_next() % 10));
	return nx_f32_to_f16(rng_next() & 1 ? -v : v);
}

/* Byte offset of a block's f16 d; a min scale (has_min) follows it. */
static size_t d_offset(enum nx_type t)
{
	switch (t) {
	case NX_Q6_K:
		return offsetof(struct nx_block_q6_k, d);
	case NX_Q2_K:
		return offsetof(struct nx_block_q2_k, d);
	case NX_Q3_K:
		return offsetof(struct nx_block_q3_k, d);
	default:
		return 0;
	}
}

static bool has_min(enum nx_type t)
{
	return t == NX_Q4_1 || t == NX_Q5_1 || t == NX_Q4_K || t == NX_Q5_K || t == NX_Q2_K;
}

/* Overwrites every byte of a quantized row with random bits, then gives the f16
 * scale fields sane values: every level, scale and bit pattern gets exercised. */
static void randomize_blocks(enum nx_type t, uint8_t *row, int64_t n)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	const size_t bs = tr->type_size;
	const int64_t nb = n / tr->blck;
	for (size_t i = 0; i < (size_t)nb * bs; i++)
		row[i] = (uint8_t)rng_next();
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *blk = row + (size_t)b * bs;
		nx_f16 s[2] = { rand_scale(), rand_scale() };
		memcpy(blk + d_offset(t), s, has_min(t) ? 4 : 2); /* d, then m / dmin */
	}
}

/* Zeroes the min fields (keep = 0) or the scale fields (keep = 1) of every block. */
static void split_blocks(enum nx_type t, uint8_t *row, int64_t n, int keep)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	const int64_t nb = n / tr->blck;
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *blk = row + (size_t)b * tr->type_size;
		memset(blk + d_offset(t) + (keep ? 0 : 2), 0, 2);
	}
}

/* T of the bound: sum of the magnitudes of the dot's addends (see the top of the file). */
static double terms(enum nx_type t, const void *w, const void *a, int64_t n)
{
	const struct nx_type_traits *tr = nx_type_ref(t), *at = nx_type_ref(tr->vec_dot_type);
	const size_t wbytes = (size_t)nx_row_size(t, n);
	float *av = xmalloc((size_t)n * sizeof(float)), *ws = xmalloc((size_t)n * sizeof(float));
	float *wm = xmalloc((size_t)n * sizeof(float));
	uint8_t *tmp = xmalloc(wbytes);
	at->dequant(a, av, n);
	memcpy(tmp, w, wbytes);
	if (has_min(t))
		split_blocks(t, tmp, n, 0);
	tr->dequant(tmp, ws, n);
	memset(wm, 0, (size_t)n * sizeof(float));
	if (has_min(t)) {
		memcpy(tmp, w, wbytes);
		split_blocks(t, tmp, n, 1);
		tr->dequant(tmp, wm, n);
	}
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += (fabs((double)ws[i]) + fabs((double)wm[i])) * fabs((double)av[i]);
	free(av);
	free(ws);
	free(wm);
	free(tmp);
	return s;
}

/* Lengths: 1 block, odd and even block counts, the model's 576 and 1536. */
static int lengths(enum nx_type t, int64_t *out)
{
	static const int64_t q32[] = { 32, 64, 96, 160, 224, 576, 1536 };
	static const int64_t qk[] = { 256, 512, 768, 1536 };
	static const int64_t fl[] = { 1, 7, 8, 15, 16, 17, 31, 33, 100, 576, 1536 };
	const int64_t *src = q32;
	int n = 7;
	if (nx_type_ref(t)->blck == QK_K) {
		src = qk;
		n = 4;
	} else if (nx_type_ref(t)->blck == 1) {
		src = fl;
		n = 11;
	}
	memcpy(out, src, (size_t)n * sizeof(*out));
	return n;
}

static const struct kset *get_set(void **state)
{
	const struct kset *ks = *state;
	if (!usable(ks)) {
		print_message("kernel set %s: not usable on this CPU, skipped\n", ks->name);
		skip();
	}
	return ks;
}

/* ---------------------------------------------------------------- tests */

static void test_installed(void **state)
{
	const struct kset *ks = get_set(state);
	struct nx_type_traits tab[N_IDS];
	set_table(ks, tab);
	for (size_t i = 0; i < N_WTYPES; i++) {
		const struct nx_type_traits *ref = nx_type_ref(wtypes[i]);
		if (tab[wtypes[i]].dot == ref->dot || tab[wtypes[i]].dot_rows == ref->dot_rows)
			fail_msg("%s: no %s dot", ks->name, ref->name);
	}
	assert_true(tab[NX_F16].quant != nx_type_ref(NX_F16)->quant);
	assert_true(tab[NX_Q8_0].quant != nx_type_ref(NX_Q8_0)->quant);
	assert_true(tab[NX_Q8_K].quant != nx_type_ref(NX_Q8_K)->quant);
	assert_true(tab[NX_Q8_0].quant2 != nx_type_ref(NX_Q8_0)->quant2);
	assert_true(tab[NX_Q8_K].quant2 != nx_type_ref(NX_Q8_K)->quant2);
	/* layouts untouched */
	for (uint32_t t = 0; t < N_IDS; t++) {
		const struct nx_type_traits *ref = nx_type_ref((enum nx_type)t);
		if (!ref)
			continue;
		assert_int_equal(tab[t].blck, ref->blck);
		assert_int_equal(tab[t].type_size, ref->type_size);
		assert_int_equal(tab[t].vec_dot_type, ref->vec_dot_type);
	}
}

/* Largest |simd - ref| / T seen by check_dot (reported, so the margin under 1e-5 is visible). */
static double worst_ratio;

static void check_dot(const struct kset *ks, const struct nx_type_traits *tab, enum nx_type t, const void *w,
		      const void *a, int64_t n, const char *what)
{
	const float ref = nx_type_ref(t)->dot(w, a, n);
	const float got = tab[t].dot(w, a, n);
	const double T = terms(t, w, a, n), bound = 1e-5 * T;
	if (T > 0 && fabs((double)got - ref) / T > worst_ratio)
		worst_ratio = fabs((double)got - ref) / T;
	if (!(fabs((double)got - ref) <= bound))
		fail_msg("%s %s dot, %s, n=%lld: %.9g vs reference %.9g (bound %.3g)", ks->name, nx_type_name(t), what,
			 (long long)n, got, ref, bound);
}

static void test_dots(void **state)
{
	const struct kset *ks = get_set(state);
	struct nx_type_traits tab[N_IDS];
	set_table(ks, tab);
	rng_state = 0x5eed0001;
	worst_ratio = 0;
	for (size_t ti = 0; ti < N_WTYPES; ti++) {
		const enum nx_type t = wtypes[ti];
		const enum nx_type vt = nx_type_ref(t)->vec_dot_type;
		int64_t lens[16];
		const int nl = lengths(t, lens);
		for (int li = 0; li < nl; li++) {
			const int64_t n = lens[li];
			float *x = xmalloc((size_t)n * sizeof(float)), *y = xmalloc((size_t)n * sizeof(float));
			for (int rep = 0; rep < 4; rep++) {
				fill_data(x, n);
				fill_data(y, n);
				void *w = make_row(t, x, n), *a = make_row(vt, y, n);
				check_dot(ks, tab, t, w, a, n, "quantized data");
				if (nx_type_ref(t)->blck > 1) {
					randomize_blocks(t, w, n);
					check_dot(ks, tab, t, w, a, n, "random blocks");
				}
				free(w);
				free(a);
			}
			free(x);
			free(y);
		}
	}
	print_message("%s dots: worst |simd - ref| / T = %.2e (bound 1e-5)\n", ks->name, worst_ratio);
}

/* Integer extremes: every weight level at its maximum against activations at +-127. */
static void test_dot_extremes(void **state)
{
	const struct kset *ks = get_set(state);
	struct nx_type_traits tab[N_IDS];
	set_table(ks, tab);
	const int64_t n = 512;
	float y[512];
	for (size_t ti = 0; ti < N_WTYPES; ti++) {
		const enum nx_type t = wtypes[ti];
		const struct nx_type_traits *tr = nx_type_ref(t);
		if (tr->blck == 1)
			continue;
		for (int pat = 0; pat < 4; pat++) {
			uint8_t *w = xmalloc((size_t)nx_row_size(t, n));
			randomize_blocks(t, w, n);
			/* all bits set: top levels, top scales; or all clear (q6_k: -32, q8_0: 0) */
			uint8_t *keep = xmalloc((size_t)nx_row_size(t, n));
			memcpy(keep, w, (size_t)nx_row_size(t, n));
			memset(w, pat & 1 ? 0xff : 0x00, (size_t)nx_row_size(t, n));
			/* put the scales back */
			for (int64_t b = 0; b < n / tr->blck; b++) {
				uint8_t *blk = w + (size_t)b * tr->type_size, *src = keep + (size_t)b * tr->type_size;
				memcpy(blk + d_offset(t), src + d_offset(t), has_min(t) ? 4 : 2);
			}
			if (t == NX_Q8_0 && pat >= 2) /* -128, which the quantizer never makes, but a file may hold */
				for (int64_t b = 0; b < n / 32; b++)
					memset(((struct nx_block_q8_0 *)w)[b].qs, 0x80, 32);
			for (int64_t i = 0; i < n; i++)
				y[i] = (pat & 2) ? ((i & 1) ? 1.0f : -1.0f) : 1.0f;
			void *a = make_row(tr->vec_dot_type, y, n);
			check_dot(ks, tab, t, w, a, n, "extreme levels");
			free(a);
			free(w);
			free(keep);
		}
	}
}

/* dot_rows == dot bit for bit, for every count of activation rows and a padded stride;
 * and the reference's dot_rows is its dot. */
static void test_dot_rows(void **state)
{
	const struct kset *ks = get_set(state);
	struct nx_type_traits tab[N_IDS];
	set_table(ks, tab);
	rng_state = 0x5eed0002;
	for (size_t ti = 0; ti < N_WTYPES; ti++) {
		const enum nx_type t = wtypes[ti];
		const struct nx_type_traits *ref = nx_type_ref(t);
		const enum nx_type vt = ref->vec_dot_type;
		const int64_t n = ref->blck == QK_K ? 768 : ref->blck == 1 ? 233 : 224;
		const size_t abytes = (size_t)nx_row_size(vt, n), stride = abytes + 40;
		enum { MAX_ACT = 11 };
		float *x = xmalloc((size_t)n * sizeof(float)), *y = xmalloc((size_t)n * sizeof(float));
		uint8_t *acts = xmalloc(stride * MAX_ACT);
		memset(acts, 0xff, stride * MAX_ACT); /* padding: NaNs if ever read as floats */
		fill_data(x, n);
		void *w = make_row(t, x, n);
		for (int r = 0; r < MAX_ACT; r++) {
			fill_data(y, n);
			nx_type_ref(vt)->quant(y, acts + (size_t)r * stride, n);
		}
		for (int na = 0; na <= MAX_ACT; na++) {
			float out[MAX_ACT + 1], rout[MAX_ACT + 1];
			out[na] = rout[na] = 12345.0f; /* must stay */
			tab[t].dot_rows(w, acts, stride, na, out, n);
			ref->dot_rows(w, acts, stride, na, rout, n);
			assert_true(out[na] == 12345.0f && rout[na] == 12345.0f);
			for (int r = 0; r < na; r++) {
				const float one = tab[t].dot(w, acts + (size_t)r * stride, n);
				if (memcmp(&one, &out[r], sizeof(float)))
					fail_msg("%s %s dot_rows(%d)[%d] = %.9g, dot = %.9g", ks->name, ref->name, na, r,
						 out[r], one);
				const float rone = ref->dot(w, acts + (size_t)r * stride, n);
				if (memcmp(&rone, &rout[r], sizeof(float)))
					fail_msg("reference %s dot_rows differs from dot", ref->name);
			}
		}
		free(w);
		free(x);
		free(y);
		free(acts);
	}
}

/* Inputs for the activation quantizers, block by block: random scales over the
 * whole float range, exact rounding ties, zeros, both signs of the largest
 * magnitude, values so small that 1/d overflows. */
static void fill_act_case(float *x, int64_t n, int blk, int kind)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = rng_gauss();
	switch (kind) {
	case 0: { /* scaled gaussian */
		static const float sc[] = { 1, 1e-3f, 1e3f, 1e-20f, 1e20f, 3e38f / 8, 1e-30f, 5e-36f };
		const float s = sc[rng_next() % 8];
		for (int64_t i = 0; i < n; i++)
			x[i] *= s;
		break;
	}
	case 1: /* ties: largest magnitude 127 so that the scale is exactly 1, values k + 0.5 */
		for (int64_t i = 0; i < n; i++)
			x[i] = (float)((int)(rng_next() % 253) - 126) + 0.5f;
		for (int64_t b = 0; b < n / blk; b++)
			x[b * blk + (int64_t)(rng_next() % (uint64_t)blk)] = rng_next() & 1 ? 127.0f : -127.0f;
		break;
	case 2: /* ties at scale 2 (largest 63.5): x * 2 = k + 0.5 for x = k/2 + 0.25 */
		for (int64_t i = 0; i < n; i++)
			x[i] = ((float)((int)(rng_next() % 251) - 125) + 0.5f) / 2;
		for (int64_t b = 0; b < n / blk; b++)
			x[b * blk] = -63.5f;
		break;
	case 3: /* zero blocks, signed zeros, a lone value */
		for (int64_t i = 0; i < n; i++)
			x[i] = (rng_next() & 1) ? 0.0f : -0.0f;
		if (n > blk)
			x[blk + 5] = -3.0f;
		break;
	case 4: /* +max and -max in one block: the first one wins */
		for (int64_t b = 0; b < n / blk; b++) {
			const int64_t i0 = b * blk + (int64_t)(rng_next() % (uint64_t)blk);
			const int64_t i1 = b * blk + (int64_t)(rng_next() % (uint64_t)blk);
			x[i0] = 9.0f;
			x[i1] = -9.0f;
		}
		break;
	default: /* tiny (1/d overflows: the reference's out-of-range conversion gives 0) */
		for (int64_t i = 0; i < n; i++)
			x[i] *= 1e-39f;
		break;
	}
}

static void test_quant_act(void **state)
{
	const struct kset *ks = get_set(state);
	struct nx_type_traits tab[N_IDS];
	set_table(ks, tab);
	rng_state = 0x5eed0003;
	static const enum nx_type ats[] = { NX_Q8_0, NX_Q8_K };
	for (size_t k = 0; k < 2; k++) {
		const enum nx_type t = ats[k];
		const int blk = (int)nx_type_ref(t)->blck;
		for (int kind = 0; kind < 6; kind++) {
			for (int rep = 0; rep < 20; rep++) {
				const int64_t n = blk * (1 + (int64_t)(rng_next() % 8));
				float *x = xmalloc((size_t)n * sizeof(float));
				fill_act_case(x, n, blk, kind);
				const size_t bytes = (size_t)nx_row_size(t, n);
				uint8_t *q = xmalloc(bytes), *r = xmalloc(bytes);
				memset(q, 0xaa, bytes);
				memset(r, 0x55, bytes);
				tab[t].quant(x, q, n);
				nx_type_ref(t)->quant(x, r, n);
				for (size_t i = 0; i < bytes; i++)
					if (q[i] != r[i])
						fail_msg("%s %s quant, case %d, n=%lld: byte %zu (block %zu) is %02x, "
							 "reference %02x",
							 ks->name, nx_type_name(t), kind, (long long)n, i,
							 i / nx_type_ref(t)->type_size, q[i], r[i]);
				free(x);
				free(q);
				free(r);
			}
		}
	}
}

/* The K/V cache's float -> half rows: the set's against nx_f32_to_f16 over a
 * sweep of every 61st float bit pattern (all exponents, both signs, NaNs,
 * infinities, subnormals of both formats, the overflow and underflow edges)
 * plus each exact rounding tie, in rows of every length mod 16 so that the
 * vector tails are checked as well. */
static void test_quant_f16(void **state)
{
	const struct kset *ks = get_set(state);
	struct nx_type_traits tab[N_IDS];
	set_table(ks, tab);
	enum { ROW = 4099 };
	float x[ROW];
	nx_f16 h[ROW + 1];
	uint64_t u = 0, checked = 0;
	for (int64_t row = 0; u <= UINT32_MAX; row++) {
		const int64_t n = 1 + row % ROW;
		for (int64_t i = 0; i < n; i++, u += 61) {
			uint32_t b = (uint32_t)u;
			if (i % 7 == 3) /* a tie: the low 13 bits are exactly half an f16 step */
				b = (b & ~0x1fffu) | 0x1000u;
			memcpy(&x[i], &b, sizeof(b));
		}
		h[n] = 0xbeef;
		tab[NX_F16].quant(x, h, n);
		assert_int_equal(h[n], 0xbeef); /* nothing past the row */
		for (int64_t i = 0; i < n; i++) {
			uint32_t b;
			memcpy(&b, &x[i], sizeof(b));
			if (h[i] != nx_f32_to_f16(x[i]))
				fail_msg("%s f16 quant of 0x%08x (row of %lld): %04x, reference %04x", ks->name, b,
					 (long long)n, h[i], nx_f32_to_f16(x[i]));
		}
		checked += (uint64_t)n;
	}
	assert_true(checked > 70000000);
}

/* Inputs for the two-part quantizers: the cases above, and three more. */
static void fill_act2_case(float *x, int64_t n, int blk, int kind)
{
	if (kind < 6) {
		fill_act_case(x, n, blk, kind);
		return;
	}
	switch (kind) {
	case 6: /* huge: around the largest Q8_0 block whose f16 scale is finite, 127 * 65504 */
		for (int64_t b = 0; b < n / blk; b++) {
			const float top = 127.0f * 65504.0f * (float)(1.0 + ldexp((double)(rng_next() % 65) - 32, -14));
			for (int64_t i = b * blk; i < (b + 1) * blk; i++)
				x[i] = top * (float)(2 * rng_uniform() - 1);
			x[b * blk + (int64_t)(rng_next() % (uint64_t)blk)] = rng_next() & 1 ? top : -top;
		}
		break;
	case 7: /* exact levels (scale 1/8): x - hi is 0, lo a zero block */
		for (int64_t i = 0; i < n; i++)
			x[i] = (float)((int)(rng_next() % 255) - 127) / 8;
		for (int64_t b = 0; b < n / blk; b++)
			x[b * blk] = 127.0f / 8;
		break;
	default: /* activation-like */
		fill_data(x, n);
		break;
	}
}

/* roundf(y) as a stored Q8_0 level (NaN: 0). */
static int8_t level8(float y)
{
	const float q = roundf(y);
	return (int8_t)(q >= 127.0f ? 127 : q <= -128.0f ? -128 : q == q ? q : 0);
}

/* quant2's definition (kern/quant.h), with table tr's quant and dequant.
 * Q8_K: quant, dequant, subtract, quant. Q8_0, block by block: hi = quant(x)
 * where amax / 127 >= 2^-7, else the levels of x at that scale rounded up to a
 * multiple of 2^-17; lo = the levels of x - dequant(hi) at hi's scale / 128. */
static void compose2(const struct nx_type_traits *tr, enum nx_type t, const float *x, uint8_t *hi, uint8_t *lo,
		     int64_t n)
{
	float *r = xmalloc((size_t)n * sizeof(float));
	tr->quant(x, hi, n);
	if (t == NX_Q8_0) {
		struct nx_block_q8_0 *h = (void *)hi, *l = (void *)lo;
		for (int64_t b = 0; b < n / QK8_0; b++) {
			const float *xb = x + b * QK8_0;
			float amax = 0;
			for (int j = 0; j < QK8_0; j++)
				amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
			const float d = amax / 127;
			if (d < 0x1p-7f) {
				const float ds = ceilf(d * 0x1p17f) * 0x1p-17f;
				h[b].d = nx_f32_to_f16(ds);
				for (int j = 0; j < QK8_0; j++)
					h[b].qs[j] = level8(xb[j] * (ds ? 1.0f / ds : 0.0f));
			}
			const float dh = nx_f16_to_f32(h[b].d);
			memset(&l[b], 0, sizeof(l[b]));
			if (!isfinite(dh))
				continue;
			const float dl = dh / 128;
			l[b].d = nx_f32_to_f16(dl);
			for (int j = 0; j < QK8_0; j++)
				l[b].qs[j] = level8((xb[j] - h[b].qs[j] * dh) * (dl ? 1.0f / dl : 0.0f));
		}
	} else {
		tr->dequant(hi, r, n);
		for (int64_t i = 0; i < n; i++)
			r[i] = x[i] - r[i];
		tr->quant(r, lo, n);
	}
	free(r);
}

/* What the Q8_0 parts are for: lo's scale is hi's / 128 exactly, and hi + lo is
 * x to within half of lo's step, wherever hi's scale and x are finite. */
static void check_q8_0_parts(const char *what, const float *x, const uint8_t *hi, const uint8_t *lo, int64_t n,
			     int kind)
{
	const struct nx_block_q8_0 *h = (const void *)hi, *l = (const void *)lo;
	for (int64_t b = 0; b < n / QK8_0; b++) {
		const float dh = nx_f16_to_f32(h[b].d), dl = nx_f16_to_f32(l[b].d);
		if (!isfinite(dh))
			continue;
		if (dl != dh / 128)
			fail_msg("%s q8_0, case %d: block %lld: lo's scale %g is not hi's %g / 128", what, kind,
				 (long long)b, dl, dh);
		for (int j = 0; j < QK8_0; j++) {
			const double xv = x[b * QK8_0 + j], got = (double)h[b].qs[j] * dh + (double)l[b].qs[j] * dl;
			if (isfinite(xv) && fabs(got - xv) > 0.5001 * dl)
				fail_msg("%s q8_0, case %d: element %lld: hi + lo = %.9g, x = %.9g, lo's step %g", what,
					 kind, (long long)(b * QK8_0 + j), got, xv, dl);
		}
	}
}

/* lo's blocks against the composition's; where hi's f16 scale overflowed, lo must be a zero block. */
static int check_lo(const char *what, enum nx_type t, const uint8_t *hi, const uint8_t *lo, const uint8_t *clo,
		    int64_t n, int kind)
{
	const struct nx_type_traits *ref = nx_type_ref(t);
	const size_t bs = ref->type_size;
	int overflowed = 0;
	for (int64_t b = 0; b < n / ref->blck; b++) {
		const uint8_t *l = lo + (size_t)b * bs, *c = clo + (size_t)b * bs;
		nx_f16 dh;
		memcpy(&dh, hi + (size_t)b * bs, 2);
		if (t == NX_Q8_0 && (dh & 0x7fff) == 0x7c00) {
			overflowed++;
			for (size_t i = 0; i < bs; i++)
				if (l[i])
					fail_msg("%s %s, case %d: block %lld overflowed, lo byte %zu is %02x, want 0", what,
						 nx_type_name(t), kind, (long long)b, i, l[i]);
			continue;
		}
		for (size_t i = 0; i < bs; i++)
			if (l[i] != c[i])
				fail_msg("%s %s, case %d, n=%lld: lo byte %zu (block %lld) is %02x, composition %02x", what,
					 nx_type_name(t), kind, (long long)n, i, (long long)b, l[i], c[i]);
	}
	return overflowed;
}

static void check_bytes(const char *what, enum nx_type t, const char *part, const uint8_t *got, const uint8_t *want,
			size_t bytes, int kind)
{
	for (size_t i = 0; i < bytes; i++)
		if (got[i] != want[i])
			fail_msg("%s %s %s, case %d: byte %zu (block %zu) is %02x, want %02x", what, nx_type_name(t), part,
				 kind, i, i / nx_type_ref(t)->type_size, got[i], want[i]);
}

/* quant2, the set's and the reference's, against each other (all bytes), against
 * its definition with the set's and the reference's kernels, and (Q8_0) what its
 * parts promise; without lo, the same hi bytes (one-part activations). */
static void test_quant2(void **state)
{
	const struct kset *ks = get_set(state);
	struct nx_type_traits tab[N_IDS];
	set_table(ks, tab);
	rng_state = 0x5eed0004;
	static const enum nx_type ats[] = { NX_Q8_0, NX_Q8_K };
	int overflowed = 0, lo_zero = 0, lo_blocks = 0;
	for (size_t k = 0; k < 2; k++) {
		const enum nx_type t = ats[k];
		const struct nx_type_traits *ref = nx_type_ref(t);
		const int blk = (int)ref->blck;
		assert_non_null(ref->quant2);
		assert_non_null(tab[t].quant2);
		for (int kind = 0; kind < 9; kind++) {
			for (int rep = 0; rep < 20; rep++) {
				/* the model's 1536 and 576; up to 40 blocks: the Q8_0 SIMD kernels go 16 at a time */
				const int64_t n = rep < 2 && blk == QK8_0 ? (rep ? 576 : 1536)
									  : blk * (1 + (int64_t)(rng_next() % 40));
				float *x = xmalloc((size_t)n * sizeof(float));
				fill_act2_case(x, n, blk, kind);
				const size_t bytes = (size_t)nx_row_size(t, n);
				uint8_t *buf = xmalloc(6 * bytes);
				uint8_t *hi = buf, *lo = buf + bytes, *rhi = buf + 2 * bytes, *rlo = buf + 3 * bytes;
				uint8_t *chi = buf + 4 * bytes, *clo = buf + 5 * bytes;
				memset(buf, 0xaa, 6 * bytes);
				tab[t].quant2(x, hi, lo, n);
				ref->quant2(x, rhi, rlo, n);
				check_bytes(ks->name, t, "quant2 hi", hi, rhi, bytes, kind);
				check_bytes(ks->name, t, "quant2 lo", lo, rlo, bytes, kind);
				memset(chi, 0xaa, bytes);
				tab[t].quant2(x, chi, NULL, n);
				check_bytes(ks->name, t, "quant2 hi alone", chi, rhi, bytes, kind);
				memset(chi, 0xaa, bytes);
				ref->quant2(x, chi, NULL, n);
				check_bytes("ref", t, "quant2 hi alone", chi, rhi, bytes, kind);
				compose2(ref, t, x, chi, clo, n);
				check_bytes("ref", t, "quant2 hi", rhi, chi, bytes, kind);
				overflowed += check_lo("ref", t, rhi, rlo, clo, n, kind);
				if (t == NX_Q8_0)
					check_q8_0_parts("ref", x, rhi, rlo, n, kind);
				compose2(&tab[t], t, x, chi, clo, n);
				check_bytes(ks->name, t, "quant2 hi", hi, chi, bytes, kind);
				check_lo(ks->name, t, hi, lo, clo, n, kind);
				if (t == NX_Q8_0)
					check_q8_0_parts(ks->name, x, hi, lo, n, kind);
				for (size_t b = 0; b < bytes / ref->type_size; b++) {
					const uint8_t *l = lo + b * ref->type_size;
					size_t z = 0;
					while (z < ref->type_size && !l[z])
						z++;
					lo_zero += z == ref->type_size;
					lo_blocks++;
				}
				free(x);
				free(buf);
			}
		}
	}
	/* the cases reach what they are for: overflowed Q8_0 scales, zero and non-zero lo blocks */
	assert_true(overflowed > 0);
	assert_true(lo_zero > 0 && lo_zero < lo_blocks / 2);
}

/* rmsnorm: every set's kernel bit-identical to the reference (also in place), the
 * reference within float rounding of the exact value; lengths with and without a
 * tail. (A kernel summing in another order would still pass almost always: the
 * double sum's last bits rarely reach the float result. The order is kept by
 * construction, kern/norm.h; what this catches is a wrong lane, tail or product.) */
static void test_rmsnorm(void **state)
{
	rng_state = 0x5eed0005;
	const nx_rmsnorm_fn ref = nx_rmsnorm_kernel(NX_KSET_REF);
	assert_non_null(ref);
	static const int ns[] = { 1, 7, 15, 16, 17, 31, 33, 100, 576, 896, 1536 };
	static const float scales[] = { 1, 1e-3f, 1e3f, 1e-30f, 1e30f, 0 };
	for (int c = 0; c < 11 * 6 * 3; c++) {
		const int n = ns[c % 11];
		const float sc = scales[c / 11 % 6];
		float *x = xmalloc((size_t)n * sizeof(float)), *w = xmalloc((size_t)n * sizeof(float));
		float *r = xmalloc((size_t)n * sizeof(float)), *o = xmalloc((size_t)n * sizeof(float));
		fill_data(x, n);
		for (int i = 0; i < n; i++) {
			x[i] *= sc;
			w[i] = 1 + 0.5f * rng_gauss();
		}
		const float eps = c % 2 ? 1e-5f : 1e-6f;
		ref(r, x, w, n, eps);
		double ss = 0;
		for (int i = 0; i < n; i++)
			ss += (double)x[i] * x[i];
		const double inv = 1.0 / sqrt(ss / n + eps);
		for (int i = 0; i < n; i++) {
			const double want = (double)x[i] * inv * w[i];
			if (fabs(r[i] - want) > 4e-7 * fabs(want) + 1e-45)
				fail_msg("ref rmsnorm n=%d scale %g: out[%d] = %.9g, exact %.9g", n, sc, i, r[i], want);
		}
		for (int k = NX_KSET_AVX2; k < NX_KSET_N; k++) {
			const nx_rmsnorm_fn f = nx_rmsnorm_kernel((enum nx_kset)k);
			if (!f)
				continue;
			memcpy(o, x, (size_t)n * sizeof(float));
			f(o, o, w, n, eps);
			if (memcmp(o, r, (size_t)n * sizeof(float)))
				fail_msg("%s rmsnorm n=%d scale %g differs from the reference", nx_kset_name((enum nx_kset)k), n, sc);
		}
		nx_rmsnorm(o, x, w, n, eps);
		assert_memory_equal(o, r, (size_t)n * sizeof(float));
		free(x);
		free(w);
		free(r);
		free(o);
	}
}

/* nx_pack_act_prep_fast bit-identical to nx_pack_act_prep token by token: random
 * levels (-128 too), scales of every kind (0, subnormal, inf, negative). */
static void test_pack_act_rows(void **state)
{
	rng_state = 0x5eed0006;
	static const nx_f16 odd[] = { 0x0000, 0x8000, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7bff, 0x3c00 };
	for (int rep = 0; rep < 50; rep++) {
		const int64_t n = 32 * (1 + (int64_t)(rng_next() % 50));
		const int toks = 1 + (int)(rng_next() % 4), nb = (int)(n / 32);
		const size_t rs = (size_t)nx_row_size(NX_Q8_0, n), lo = rs + 34 * (rng_next() % 2);
		const size_t stride = lo + rs + 34 * (rng_next() % 3);
		uint8_t *q = xmalloc(stride * (size_t)toks);
		for (int i = 0; i < toks; i++)
			for (int part = 0; part < 2; part++) {
				uint8_t *row = q + (size_t)i * stride + (part ? lo : 0);
				randomize_blocks(NX_Q8_0, row, n);
				for (int b = 0; b < nb; b++)
					if (rng_next() % 4 == 0)
						memcpy(row + 34 * b, &odd[rng_next() % 8], 2);
			}
		float *d = xmalloc(4 * sizeof(float) * (size_t)toks * nb), *s = d + toks * nb;
		float *rd = s + toks * nb, *rsum = rd + toks * nb;
		int32_t *c = xmalloc(2 * sizeof(int32_t) * (size_t)toks * nb), *rc = c + toks * nb;
		for (int i = 0; i < toks; i++) {
			const uint8_t *hi = q + (size_t)i * stride;
			nx_pack_act_prep_fast(hi, hi + lo, n, d + i * nb, s + i * nb, c + i * nb);
			nx_pack_act_prep(hi, hi + lo, n, rd + i * nb, rsum + i * nb, rc + i * nb);
		}
		if (memcmp(d, rd, sizeof(float) * (size_t)toks * nb) || memcmp(c, rc, sizeof(int32_t) * (size_t)toks * nb) ||
		    memcmp(s, rsum, sizeof(float) * (size_t)toks * nb))
			fail_msg("nx_pack_act_prep_fast differs from nx_pack_act_prep (n=%lld, tokens %d)", (long long)n, toks);
		free(q);
		free(d);
		free(c);
	}
}

/* The engine's table takes the kernels of the set kern/cpu.c picks (the
 * strongest usable one, or NX_KERN's), and has dot_rows everywhere. */
static void test_engine_table(void **state)
{
	const enum nx_kset top = nx_kern_set(NX_KFAM_DOT);
	for (size_t i = 0; i < N_WTYPES; i++) {
		const struct nx_type_traits *g = nx_type_get(wtypes[i]), *ref = nx_type_ref(wtypes[i]);
		assert_non_null(g);
		assert_non_null(g->dot_rows);
		struct nx_type_traits tab[N_IDS];
		for (size_t k = 0; k < sizeof(ksets) / sizeof(ksets[0]); k++)
			if (ksets[k].set == top)
				set_table(&ksets[k], tab);
		const struct nx_type_traits *want = top == NX_KSET_REF ? ref : &tab[wtypes[i]];
		if (g->dot != want->dot || g->dot_rows != want->dot_rows)
			fail_msg("engine %s dot is not the %s set's", nx_type_name(wtypes[i]), nx_kset_name(top));
	}
	print_message("engine kernels: %s\n", nx_kset_name(top));
}

int main(void)
{
#define SET_TESTS(i, name)                                                                 \
	{ name " installed", test_installed, NULL, NULL, (void *)&ksets[i] },              \
	{ name " dots", test_dots, NULL, NULL, (void *)&ksets[i] },                        \
	{ name " dot extremes", test_dot_extremes, NULL, NULL, (void *)&ksets[i] },        \
	{ name " dot_rows", test_dot_rows, NULL, NULL, (void *)&ksets[i] },                \
	{ name " activation quantizers", test_quant_act, NULL, NULL, (void *)&ksets[i] },  \
	{ name " f16 rows", test_quant_f16, NULL, NULL, (void *)&ksets[i] },               \
	{ name " two-part quantizers", test_quant2, NULL, NULL, (void *)&ksets[i] }
	const struct CMUnitTest tests[] = {
		SET_TESTS(0, "avx2"),
		SET_TESTS(1, "avx512"),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_pack_act_rows),
		cmocka_unit_test(test_engine_table),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
