/* test_quant.c - tensor types: f16/bf16 conversions, quantize/dequantize error, dots, row sizes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <immintrin.h>

#include "kern/quant.h"
#include "tests/c/rng.h"

/* ---------------------------------------------------------------- helpers */

static uint32_t bits_of(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float float_of(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* The weight types with a full set of kernels, and bounds on the rms error of
 * quantize -> dequantize relative to the rms of the data, for gaussian data
 * and for weight-like data (small values, an offset, sparse outliers that set
 * the block scales). Measured on 65536 values, bound ~20% above:
 *             gaussian          weight-like
 *   f32       exact             exact
 *   f16       0.00021  3e-4     0.00019  3e-4    (11-bit mantissa)
 *   bf16      0.00167  2e-3     0.00153  2e-3    (8-bit mantissa)
 *   q8_0      0.0054   0.0065   0.0094   0.011
 *   q4_0      0.086    0.10     0.147    0.17
 *   q4_1      0.078    0.092    0.094    0.11
 *   q5_0      0.043    0.05     0.074    0.088
 *   q5_1      0.038    0.045    0.045    0.054
 *   q4_k      0.071    0.085    0.087    0.10     (4.5 bits, below q4_1's 5)
 *   q5_k      0.036    0.043    0.043    0.052
 *   q6_k      0.0178   0.021    0.027    0.032
 *   q2_k      0.302    0.36     0.345    0.41     (2.625 bits)
 *   q3_k      0.152    0.18     0.217    0.26
 *   iq4_nl    0.0764   0.092    0.112    0.135
 *   iq4_xs    0.0772   0.093    0.114    0.137    (4.25 bits) */
struct type_case {
	enum nx_type t;
	double max_gauss, max_weights;
};

static const struct type_case weight_types[] = {
	{ NX_F32, 0, 0 },           { NX_F16, 3e-4, 3e-4 },      { NX_BF16, 2e-3, 2e-3 },
	{ NX_Q8_0, 0.0065, 0.011 }, { NX_Q4_0, 0.10, 0.17 },     { NX_Q4_1, 0.092, 0.11 },
	{ NX_Q5_0, 0.05, 0.088 },   { NX_Q5_1, 0.045, 0.054 },   { NX_Q4_K, 0.085, 0.10 },
	{ NX_Q5_K, 0.043, 0.052 },  { NX_Q6_K, 0.021, 0.032 },  { NX_Q2_K, 0.36, 0.41 },
	{ NX_Q3_K, 0.18, 0.26 },    { NX_IQ4_NL, 0.092, 0.135 }, { NX_IQ4_XS, 0.093, 0.137 },
};
#define N_WEIGHT_TYPES (sizeof(weight_types) / sizeof(weight_types[0]))

#define N_ELEMS 4096 /* 16 super-blocks, 128 small blocks */

static void fill_gauss(float *x, int64_t n, uint64_t seed)
{
	rng_state = seed;
	for (int64_t i = 0; i < n; i++)
		x[i] = rng_gauss();
}

static double rel_rms(const float *x, const float *y, int64_t n)
{
	double se = 0, sx = 0;
	for (int64_t i = 0; i < n; i++) {
		se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
		sx += (double)x[i] * x[i];
	}
	return sqrt(se / sx);
}

/* Quantizes n floats to type t in a fresh buffer (caller frees). */
static void *quantize(enum nx_type t, const float *x, int64_t n)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	assert_non_null(tr);
	assert_non_null(tr->quant);
	int64_t bytes = nx_row_size(t, n);
	assert_true(bytes > 0);
	void *q = malloc((size_t)bytes);
	assert_non_null(q);
	tr->quant(x, q, n);
	return q;
}

/* ---------------------------------------------------------------- f16 / bf16 */

static void test_f16_edges(void **state)
{
	static const struct {
		uint32_t f;
		uint16_t h;
	} cases[] = {
		{ 0x00000000, 0x0000 }, /* +0 */
		{ 0x80000000, 0x8000 }, /* -0 */
		{ 0x3f800000, 0x3c00 }, /* 1 */
		{ 0xc0000000, 0xc000 }, /* -2 */
		{ 0x477fe000, 0x7bff }, /* 65504, largest half */
		{ 0x477fefff, 0x7bff }, /* just below 65520 */
		{ 0x477ff000, 0x7c00 }, /* 65520: tie, rounds to even = inf */
		{ 0x7f7fffff, 0x7c00 }, /* FLT_MAX */
		{ 0x7f800000, 0x7c00 }, /* inf */
		{ 0xff800000, 0xfc00 }, /* -inf */
		{ 0x3f801000, 0x3c00 }, /* 1 + 2^-11: tie between 1 and 1+2^-10, even is 1 */
		{ 0x3f803000, 0x3c02 }, /* 1 + 3*2^-11: tie, even is 1+2^-9 */
		{ 0x3f801001, 0x3c01 }, /* just above the tie */
		{ 0x38800000, 0x0400 }, /* 2^-14, smallest normal */
		{ 0x33800000, 0x0001 }, /* 2^-24, smallest subnormal */
		{ 0x33000000, 0x0000 }, /* 2^-25: tie between 0 and 2^-24, even is 0 */
		{ 0x33000001, 0x0001 }, /* just above that tie */
		{ 0xb3000001, 0x8001 }, /* negative */
		{ 0x32ffffff, 0x0000 }, /* below 2^-25 */
		{ 0x00000001, 0x0000 }, /* smallest float subnormal */
		{ 0x33c00000, 0x0002 }, /* 1.5 * 2^-24: tie between 1 and 2 ulps, even is 2 */
		{ 0x34200000, 0x0002 }, /* 2.5 * 2^-24: tie between 2 and 3 ulps, even is 2 */
		{ 0x34400000, 0x0003 }, /* 3 * 2^-24, exact */
		{ 0x387fe000, 0x0400 }, /* 1023.5 * 2^-24: tie between 0x3ff and 0x400, even is 0x400 */
		{ 0x387fa000, 0x03fe }, /* 1022.5 * 2^-24: tie, even is 0x3fe */
		{ 0x38000000, 0x0200 }, /* 2^-15, a subnormal half */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint16_t h = nx_f32_to_f16(float_of(cases[i].f));
		if (h != cases[i].h)
			fail_msg("f32 %08x -> f16 %04x, want %04x", cases[i].f, h, cases[i].h);
	}

	/* NaN stays NaN (quiet), with its sign. */
	assert_int_equal(nx_f32_to_f16(float_of(0x7fc00000)) & 0x7e00, 0x7e00);
	assert_int_equal(nx_f32_to_f16(float_of(0x7f800001)) & 0x7e00, 0x7e00); /* signalling */
	assert_int_equal(nx_f32_to_f16(float_of(0xffc00000)), 0xfe00);

	/* Every half converts to float and back to itself; subnormals and NaN included. */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = nx_f16_to_f32((nx_f16)h);
		bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
		if (is_nan) {
			assert_true(isnan(f));
			assert_int_equal(nx_f32_to_f16(f) & 0x7e00, 0x7e00);
			continue;
		}
		if (nx_f32_to_f16(f) != h)
			fail_msg("f16 %04x -> %a -> %04x", h, f, nx_f32_to_f16(f));
	}
	assert_true(nx_f16_to_f32(0x0001) == ldexpf(1, -24));
	assert_true(nx_f16_to_f32(0x03ff) == ldexpf(1023, -24));
	assert_true(nx_f16_to_f32(0x7bff) == 65504.0f);
	assert_true(isinf(nx_f16_to_f32(0xfc00)) && nx_f16_to_f32(0xfc00) < 0);
	assert_true(signbit(nx_f16_to_f32(0x8000)));
}

__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
	return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* Against the CPU's own converter (F16C, exact IEEE RNE) over every float
 * whose exponent can round to a finite nonzero half or to inf; the rest is
 * covered by test_f16_edges. Both directions, all signs. */
static void test_f16_vs_f16c(void **state)
{
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("f16c"))
		skip();
	for (uint32_t h = 0; h < 0x10000; h++) {
		float a = nx_f16_to_f32((nx_f16)h), b = hw_f16_to_f32((uint16_t)h);
		if (bits_of(a) != bits_of(b) && !(isnan(a) && isnan(b)))
			fail_msg("f16 %04x: %08x, f16c %08x", h, bits_of(a), bits_of(b));
	}
	/* biased exponents 101..143: from below half the smallest subnormal to above 65520 */
	for (uint32_t e = 101; e <= 143; e++) {
		for (uint32_t m = 0; m < (1u << 23); m++) {
			uint32_t u = (e << 23) | m;
			for (int s = 0; s < 2; s++, u ^= 0x80000000u) {
				uint16_t a = nx_f32_to_f16(float_of(u)), b = hw_f32_to_f16(float_of(u));
				if (a != b)
					fail_msg("f32 %08x: %04x, f16c %04x", u, a, b);
			}
		}
	}
}

static void test_bf16_edges(void **state)
{
	static const struct {
		uint32_t f;
		uint16_t h;
	} cases[] = {
		{ 0x3f800000, 0x3f80 }, /* 1 */
		{ 0x3f808000, 0x3f80 }, /* tie, even */
		{ 0x3f818000, 0x3f82 }, /* tie, even (up) */
		{ 0x3f808001, 0x3f81 }, /* above the tie */
		{ 0x3f807fff, 0x3f80 }, /* below the tie */
		{ 0x80000000, 0x8000 }, /* -0 */
		{ 0x00000001, 0x0000 }, /* tiny subnormal rounds to 0 */
		{ 0x00008000, 0x0000 }, /* subnormal tie, even */
		{ 0x00018000, 0x0002 }, /* subnormal tie, even (up) */
		{ 0x7f7fffff, 0x7f80 }, /* FLT_MAX rounds to inf */
		{ 0x7f7f7fff, 0x7f7f }, /* stays finite */
		{ 0x7f800000, 0x7f80 }, /* inf */
		{ 0xff800000, 0xff80 }, /* -inf */
		{ 0x7f800001, 0x7fc0 }, /* signalling nan: quieted, not rounded to inf */
		{ 0xffffffff, 0xffff }, /* nan stays nan */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint16_t h = nx_f32_to_bf16(float_of(cases[i].f));
		if (h != cases[i].h)
			fail_msg("f32 %08x -> bf16 %04x, want %04x", cases[i].f, h, cases[i].h);
	}
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = nx_bf16_to_f32((nx_bf16)h);
		assert_int_equal(bits_of(f), h << 16);
		if (!isnan(f))
			assert_int_equal(nx_f32_to_bf16(f), h);
	}
	/* Nearest: for random floats, no bf16 neighbour is closer; ties go to even. */
	rng_state = 7;
	for (int i = 0; i < 1000000; i++) {
		uint32_t u = (uint32_t)rng_next() & 0xff7fffffu; /* finite */
		float f = float_of(u);
		uint16_t h = nx_f32_to_bf16(f);
		if (isinf(nx_bf16_to_f32(h)))
			continue;
		double err = fabs((double)nx_bf16_to_f32(h) - f);
		double lo = fabs((double)nx_bf16_to_f32((uint16_t)(h - 1)) - f);
		double hi = fabs((double)nx_bf16_to_f32((uint16_t)(h + 1)) - f);
		if ((h & 0x7fff) != 0 && (err > lo || (err == lo && (h & 1))))
			fail_msg("bf16 of %08x = %04x is not nearest-even", u, h);
		if ((h & 0x7fff) != 0x7f7f && (err > hi || (err == hi && (h & 1))))
			fail_msg("bf16 of %08x = %04x is not nearest-even", u, h);
	}
}

/* ---------------------------------------------------------------- types, row sizes */

static void test_type_table(void **state)
{
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
		enum nx_type t = weight_types[i].t;
		const struct nx_type_traits *tr = nx_type_ref(t);
		assert_non_null(tr);
		assert_true(nx_type_supported(t));
		assert_non_null(tr->dequant);
		assert_non_null(tr->quant);
		assert_non_null(tr->dot);
		assert_string_equal(nx_type_name(t), tr->name);
		/* the activation type can be produced */
		assert_non_null(nx_type_ref(tr->vec_dot_type));
		assert_non_null(nx_type_ref(tr->vec_dot_type)->quant);
		/* the engine's table has the same layout */
		const struct nx_type_traits *g = nx_type_get(t);
		assert_non_null(g);
		assert_int_equal(g->blck, tr->blck);
		assert_int_equal(g->type_size, tr->type_size);
		assert_int_equal(g->vec_dot_type, tr->vec_dot_type);
	}
	assert_int_equal(nx_type_ref(NX_Q4_0)->vec_dot_type, NX_Q8_0);
	assert_int_equal(nx_type_ref(NX_Q4_1)->vec_dot_type, NX_Q8_0);
	assert_int_equal(nx_type_ref(NX_Q6_K)->vec_dot_type, NX_Q8_K);
	assert_int_equal(nx_type_ref(NX_Q2_K)->vec_dot_type, NX_Q8_K);
	assert_int_equal(nx_type_ref(NX_Q3_K)->vec_dot_type, NX_Q8_K);
	assert_int_equal(nx_type_ref(NX_IQ4_NL)->vec_dot_type, NX_Q8_0);
	assert_int_equal(nx_type_ref(NX_IQ4_XS)->vec_dot_type, NX_Q8_K);
	assert_int_equal(nx_type_ref(NX_BF16)->vec_dot_type, NX_F32);

	assert_string_equal(nx_type_name(NX_Q4_K), "q4_k");
	assert_string_equal(nx_type_name(NX_BF16), "bf16");
	assert_string_equal(nx_type_name(NX_Q2_K), "q2_k");
	assert_string_equal(nx_type_name(23), "iq4_xs");
	assert_string_equal(nx_type_name(4), "?"); /* removed q4_2 */
	assert_string_equal(nx_type_name(1000), "?");
	assert_string_equal(nx_type_name(UINT32_MAX), "?");

	/* readable but not computable: known layout, no kernels */
	assert_false(nx_type_supported(16)); /* iq2_xxs */
	assert_false(nx_type_supported(21)); /* iq3_s */
	assert_false(nx_type_supported(NX_Q8_1));
	assert_false(nx_type_supported(NX_Q8_K)); /* activation type only */
	assert_false(nx_type_supported(4));
	assert_false(nx_type_supported(NX_TYPE_COUNT));
	assert_false(nx_type_supported(UINT32_MAX));
	assert_non_null(nx_type_ref(16));
	assert_null(nx_type_ref(16)->dequant);
	assert_null(nx_type_ref((enum nx_type)4));
	assert_null(nx_type_ref((enum nx_type)5000));
	assert_null(nx_type_get((enum nx_type)4));
	assert_null(nx_type_get((enum nx_type)5000));
}

static void test_row_size(void **state)
{
	assert_int_equal(nx_row_size(NX_F32, 10), 40);
	assert_int_equal(nx_row_size(NX_F16, 3), 6);
	assert_int_equal(nx_row_size(NX_BF16, 0), 0);
	assert_int_equal(nx_row_size(NX_Q4_0, 64), 36);
	assert_int_equal(nx_row_size(NX_Q4_1, 576), 18 * 20);
	assert_int_equal(nx_row_size(NX_Q5_0, 32), 22);
	assert_int_equal(nx_row_size(NX_Q5_1, 32), 24);
	assert_int_equal(nx_row_size(NX_Q8_0, 32), 34);
	assert_int_equal(nx_row_size(NX_Q4_K, 512), 288);
	assert_int_equal(nx_row_size(NX_Q5_K, 256), 176);
	assert_int_equal(nx_row_size(NX_Q6_K, 256), 210);
	assert_int_equal(nx_row_size(NX_Q8_K, 256), 292);
	assert_int_equal(nx_row_size(NX_Q2_K, 256), 84);
	assert_int_equal(nx_row_size(NX_Q3_K, 256), 110);
	assert_int_equal(nx_row_size(NX_IQ4_NL, 64), 36);
	assert_int_equal(nx_row_size(NX_IQ4_XS, 512), 272);
	assert_int_equal(nx_row_size(NX_IQ4_XS, 32), -1);

	/* not a multiple of the block */
	assert_int_equal(nx_row_size(NX_Q4_0, 31), -1);
	assert_int_equal(nx_row_size(NX_Q4_0, 33), -1);
	assert_int_equal(nx_row_size(NX_Q4_K, 576), -1);
	assert_int_equal(nx_row_size(NX_Q6_K, 128), -1);
	/* negative, unknown type */
	assert_int_equal(nx_row_size(NX_F32, -1), -1);
	assert_int_equal(nx_row_size(NX_Q8_0, -32), -1);
	assert_int_equal(nx_row_size(NX_Q8_0, INT64_MIN), -1);
	assert_int_equal(nx_row_size((enum nx_type)4, 32), -1);
	assert_int_equal(nx_row_size((enum nx_type)9999, 32), -1);
	/* overflow */
	assert_int_equal(nx_row_size(NX_F32, INT64_MAX), -1);
	assert_int_equal(nx_row_size(NX_F32, INT64_MAX / 4 + 1), -1);
	assert_int_equal(nx_row_size(NX_F32, INT64_MAX / 4), (INT64_MAX / 4) * 4);
	assert_int_equal(nx_row_size(NX_F16, INT64_MAX / 2 + 1), -1);
	assert_int_equal(nx_row_size(NX_Q8_K, INT64_MAX / 256 * 256), -1); /* 292 > 256 bytes per block */
	assert_int_equal(nx_row_size(NX_Q8_0, INT64_MAX / 32 * 32), -1);   /* 34 > 32 */
	assert_true(nx_row_size(NX_Q4_0, INT64_MAX / 32 * 32) > 0);        /* 18 < 32: fits */
}

/* ---------------------------------------------------------------- quantize / dequantize */

static void test_quant_error(void **state)
{
	float *x = malloc(N_ELEMS * sizeof(float)), *y = malloc(N_ELEMS * sizeof(float));
	assert_non_null(x);
	assert_non_null(y);
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
		enum nx_type t = weight_types[i].t;
		const struct nx_type_traits *tr = nx_type_ref(t);
		for (uint64_t seed = 1; seed <= 4; seed++) {
			fill_gauss(x, N_ELEMS, seed);
			bool weights = seed > 2;
			if (weights)
				for (int j = 0; j < N_ELEMS; j++)
					x[j] = 0.02f * x[j] + 0.01f + (j % 97 == 0 ? 0.2f : 0);
			double bound = weights ? weight_types[i].max_weights : weight_types[i].max_gauss;
			void *q = quantize(t, x, N_ELEMS);
			tr->dequant(q, y, N_ELEMS);
			double e = rel_rms(x, y, N_ELEMS);
			print_message("  %-5s %-8s: rel rms error %.5f (bound %.5f)\n", tr->name,
				      weights ? "weights" : "gauss", e, bound);
			if (!(e <= bound))
				fail_msg("%s: rel rms error %g > %g", tr->name, e, bound);
			free(q);
		}
	}
	free(x);
	free(y);
}

/* The k-quant quantizers search for the best scale and min (make_qkx2_quants,
 * make_qx_quants) instead of taking the min/max grid. On these 16384 gaussian
 * values the search gives (without -> with): q4_k 0.0768 -> 0.0722, q5_k
 * 0.0378 -> 0.0368, q6_k 0.0185 -> 0.0178; the thresholds sit between, so
 * dropping the search fails this test. */
static void test_kquant_search_pays(void **state)
{
	enum { N = 16384 };
	static const struct {
		enum nx_type t;
		double max;
	} cases[] = { { NX_Q4_K, 0.0745 }, { NX_Q5_K, 0.0373 }, { NX_Q6_K, 0.0182 } };
	float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
	assert_non_null(x);
	assert_non_null(y);
	fill_gauss(x, N, 11);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		void *q = quantize(cases[i].t, x, N);
		nx_type_ref(cases[i].t)->dequant(q, y, N);
		double e = rel_rms(x, y, N);
		if (!(e < cases[i].max))
			fail_msg("%s: rel rms error %g, want < %g", nx_type_name(cases[i].t), e, cases[i].max);
		free(q);
	}
	free(x);
	free(y);
}

/* All-zero and constant blocks must quantize without NaN and dequantize exactly (zero) or close. */
static void test_quant_degenerate(void **state)
{
	static float x[512], y[512];
	enum nx_type ts[N_WEIGHT_TYPES + 1];
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++)
		ts[i] = weight_types[i].t;
	ts[N_WEIGHT_TYPES] = NX_Q8_K;
	for (size_t i = 0; i < N_WEIGHT_TYPES + 1; i++) {
		const struct nx_type_traits *tr = nx_type_ref(ts[i]);
		memset(x, 0, sizeof(x));
		void *q = quantize(ts[i], x, 512);
		for (int j = 0; j < 512; j++)
			y[j] = 1;
		tr->dequant(q, y, 512);
		for (int j = 0; j < 512; j++)
			if (y[j] != 0)
				fail_msg("%s: zeros dequantize to %g at %d", tr->name, y[j], j);
		if (ts[i] == NX_Q8_K) {
			const struct nx_block_q8_k *b = q;
			for (int g = 0; g < QK_K / 16; g++)
				assert_int_equal(b[0].bsums[g], 0);
		}
		free(q);

		for (int j = 0; j < 512; j++)
			x[j] = -0.75f;
		q = quantize(ts[i], x, 512);
		tr->dequant(q, y, 512);
		for (int j = 0; j < 512; j++)
			if (!(fabsf(y[j] + 0.75f) <= 0.01f))
				fail_msg("%s: constant -0.75 dequantizes to %g at %d", tr->name, y[j], j);
		free(q);
	}
}

/* Q8_K carries the sums of its 16-groups; the k-quant dots depend on them. */
static void test_q8_k_bsums(void **state)
{
	float x[2 * QK_K], y[2 * QK_K];
	fill_gauss(x, 2 * QK_K, 5);
	struct nx_block_q8_k *b = quantize(NX_Q8_K, x, 2 * QK_K);
	for (int i = 0; i < 2; i++) {
		for (int g = 0; g < QK_K / 16; g++) {
			int s = 0;
			for (int j = 0; j < 16; j++)
				s += b[i].qs[16 * g + j];
			assert_int_equal(b[i].bsums[g], s);
		}
	}
	nx_type_ref(NX_Q8_K)->dequant(b, y, 2 * QK_K);
	assert_true(rel_rms(x, y, 2 * QK_K) < 0.0085); /* measured 0.0070 */
	free(b);
}

/* ---------------------------------------------------------------- dots */

/* Two checks per weight type, with the activation quantized to vec_dot_type:
 * 1. exact arithmetic: dot(w, a) equals the double-precision sum of
 *    dequant(w) * dequant(a) up to float rounding of the per-block scaling
 *    (bound 2e-5 of sum |w_i a_i|); this pins the indexing of every layout;
 * 2. the end-to-end error against the float dot of dequant(w) with the
 *    unquantized x stays within the activation's quantization noise
 *    (bound 0.01 of |w| |x| for Q8_0 / Q8_K, 1e-6 for float activations). */
static void test_dot(void **state)
{
	float *w = malloc(N_ELEMS * sizeof(float)), *x = malloc(N_ELEMS * sizeof(float));
	float *wd = malloc(N_ELEMS * sizeof(float)), *ad = malloc(N_ELEMS * sizeof(float));
	assert_true(w && x && wd && ad);
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
		enum nx_type t = weight_types[i].t;
		const struct nx_type_traits *tr = nx_type_ref(t);
		const struct nx_type_traits *at = nx_type_ref(tr->vec_dot_type);
		for (uint64_t seed = 21; seed <= 23; seed++) {
			fill_gauss(w, N_ELEMS, seed);
			fill_gauss(x, N_ELEMS, seed + 100);
			if (seed == 23) /* correlated, so the dot is large and the min terms matter */
				for (int j = 0; j < N_ELEMS; j++)
					x[j] = 0.5f * x[j] + w[j] + 0.3f;
			void *qw = quantize(t, w, N_ELEMS);
			void *qa = quantize(tr->vec_dot_type, x, N_ELEMS);
			tr->dequant(qw, wd, N_ELEMS);
			at->dequant(qa, ad, N_ELEMS);

			double exact = 0, mag = 0, vs_x = 0, nw = 0, nx = 0;
			for (int j = 0; j < N_ELEMS; j++) {
				exact += (double)wd[j] * ad[j];
				mag += fabs((double)wd[j] * ad[j]);
				vs_x += (double)wd[j] * x[j];
				nw += (double)wd[j] * wd[j];
				nx += (double)x[j] * x[j];
			}
			float got = tr->dot(qw, qa, N_ELEMS);
			if (!(fabs(got - exact) <= 2e-5 * mag))
				fail_msg("%s dot %.8g, exact %.8g (|diff| %g > %g)", tr->name, got, exact,
					 fabs(got - exact), 2e-5 * mag);
			double tol = (tr->vec_dot_type == NX_F32 ? 1e-6 : 0.01) * sqrt(nw * nx);
			if (!(fabs(got - vs_x) <= tol))
				fail_msg("%s dot %.8g vs float %.8g (|diff| %g > %g)", tr->name, got, vs_x,
					 fabs(got - vs_x), tol);

			/* the engine's kernels agree with the reference */
			const struct nx_type_traits *g = nx_type_get(t);
			float got2 = g->dot(qw, qa, N_ELEMS);
			assert_true(fabs(got2 - exact) <= 2e-5 * mag);
			free(qw);
			free(qa);
		}
	}
	free(w);
	free(x);
	free(wd);
	free(ad);
}

/* A short row (one block) and a row of several super-blocks both work: dots do
 * not read past n. Guard bytes after the row must not matter. */
static void test_dot_lengths(void **state)
{
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
		enum nx_type t = weight_types[i].t;
		const struct nx_type_traits *tr = nx_type_ref(t);
		const struct nx_type_traits *at = nx_type_ref(tr->vec_dot_type);
		int64_t blk = tr->blck > at->blck ? tr->blck : at->blck;
		if (blk < 32)
			blk = 32;
		float w[512], x[512], wd[512], ad[512];
		fill_gauss(w, 512, 31);
		fill_gauss(x, 512, 32);
		for (int64_t n = blk; n <= 512; n += blk) {
			size_t wb = (size_t)nx_row_size(t, n), ab = (size_t)nx_row_size(tr->vec_dot_type, n);
			uint8_t *qw = malloc(wb + 64), *qa = malloc(ab + 64);
			assert_true(qw && qa);
			memset(qw + wb, 0x7f, 64); /* garbage after the row */
			memset(qa + ab, 0x7f, 64);
			tr->quant(w, qw, n);
			at->quant(x, qa, n);
			tr->dequant(qw, wd, n);
			at->dequant(qa, ad, n);
			double exact = 0, mag = 0;
			for (int64_t j = 0; j < n; j++) {
				exact += (double)wd[j] * ad[j];
				mag += fabs((double)wd[j] * ad[j]);
			}
			float got = tr->dot(qw, qa, n);
			if (!(fabs(got - exact) <= 2e-5 * mag + 1e-30))
				fail_msg("%s n=%lld: dot %g, exact %g", tr->name, (long long)n, got, exact);
			free(qw);
			free(qa);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_f16_edges),
		cmocka_unit_test(test_f16_vs_f16c),
		cmocka_unit_test(test_bf16_edges),
		cmocka_unit_test(test_type_table),
		cmocka_unit_test(test_row_size),
		cmocka_unit_test(test_quant_error),
		cmocka_unit_test(test_kquant_search_pays),
		cmocka_unit_test(test_quant_degenerate),
		cmocka_unit_test(test_q8_k_bsums),
		cmocka_unit_test(test_dot),
		cmocka_unit_test(test_dot_lengths),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
