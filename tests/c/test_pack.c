/* test_pack.c - packed weight layouts (kern/pack.h): pack/unpack round trip, the
 * SIMD tile kernels bit-identical to the packed reference whatever the number
 * of tokens per call, and the packed reference on two-part activations within a
 * float-summation bound of the plain GGUF reference dots of the two parts (same
 * bound as test_kern_simd.c: 1e-5 x the sum of the addends' magnitudes). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kern/pack.h"
#include "tests/c/pack_acts.h"

struct mat {
	enum nx_type t;
	int64_t n_in;
	int n_out;
	size_t row_bytes;
	uint8_t *plain, *packed;
	float *deq; /* (n_out, n_in) dequantized plain rows */
};

static void mat_make(struct mat *m, enum nx_type t, int n_out, int64_t n_in)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	m->t = t;
	m->n_in = n_in;
	m->n_out = n_out;
	m->row_bytes = (size_t)nx_row_size(t, n_in);
	m->plain = malloc(m->row_bytes * n_out);
	m->packed = malloc(m->row_bytes * n_out);
	m->deq = malloc(sizeof(float) * n_in * n_out);
	float *x = malloc(sizeof(float) * n_in);
	for (int r = 0; r < n_out; r++) {
		/* rows of different magnitudes and a few outliers, like real weights */
		float scale = 0.02f * (1 + r % 5);
		for (int64_t i = 0; i < n_in; i++)
			x[i] = scale * rng_sym() + (i % 97 == 0 ? 0.3f * rng_sym() : 0);
		tr->quant(x, m->plain + r * m->row_bytes, n_in);
		tr->dequant(m->plain + r * m->row_bytes, m->deq + r * n_in, n_in);
	}
	free(x);
	for (int g = 0; g < n_out / NX_PACK_ROWS; g++)
		nx_pack_group(t, m->plain + (size_t)g * NX_PACK_ROWS * m->row_bytes, m->row_bytes,
			      m->packed + (size_t)g * NX_PACK_ROWS * m->row_bytes, n_in);
}

static void mat_free(struct mat *m)
{
	free(m->plain);
	free(m->packed);
	free(m->deq);
}

static const enum nx_type types[] = {NX_Q4_0, NX_Q4_1, NX_Q5_0, NX_Q5_1, NX_Q8_0, NX_IQ4_NL};
static const int64_t lens[] = {32, 64, 96, 224, 576, 1536}; /* 1, 2, 3, 7, 18, 48 blocks */
#define N_TYPES (sizeof(types) / sizeof(types[0]))
#define N_LENS (sizeof(lens) / sizeof(lens[0]))

/* The min of block k / 32 of a plain row of a type with mins (q4_1, q5_1), else 0. */
static float block_min(enum nx_type t, const uint8_t *row, int64_t k)
{
	if (t == NX_Q4_1)
		return nx_f16_to_f32(((const struct nx_block_q4_1 *)row)[k / 32].m);
	if (t == NX_Q5_1)
		return nx_f16_to_f32(((const struct nx_block_q5_1 *)row)[k / 32].m);
	return 0;
}

static void test_roundtrip(void **state)
{
	(void)state;
	for (size_t ti = 0; ti < N_TYPES; ti++)
		for (size_t li = 0; li < N_LENS; li++) {
			struct mat m;
			mat_make(&m, types[ti], 32, lens[li]);
			uint8_t *row = malloc(m.row_bytes);
			for (int r = 0; r < m.n_out; r++) {
				nx_unpack_row(m.t, m.packed + (size_t)(r / 16) * 16 * m.row_bytes, r % 16, row, m.n_in);
				assert_memory_equal(row, m.plain + r * m.row_bytes, m.row_bytes);
			}
			free(row);
			mat_free(&m);
		}
}

/* The packed reference against the plain reference dot, within the bound. */
static void test_ref_vs_plain(void **state)
{
	(void)state;
	for (size_t ti = 0; ti < N_TYPES; ti++)
		for (size_t li = 0; li < N_LENS; li++) {
			struct mat m;
			struct acts x;
			const int n_act = NX_PACK_ACT_MAX;
			mat_make(&m, types[ti], 32, lens[li]);
			acts_make(&x, n_act, lens[li], false);
			const struct nx_type_traits *tr = nx_type_ref(m.t);
			float out[NX_PACK_ACT_MAX * NX_PACK_ROWS];
			for (int g = 0; g < m.n_out / 16; g++) {
				nx_pack_kernel_ref(m.t)(m.packed + (size_t)g * 16 * m.row_bytes, &x.a, n_act, out, m.n_in);
				for (int i = 0; i < n_act; i++)
					for (int r = 0; r < 16; r++) {
						const int row = g * 16 + r;
						/* the plain path: dot(w, hi) + dot(w, lo) */
						const uint8_t *w = m.plain + row * m.row_bytes, *hi = x.q + i * x.stride;
						const double want = (double)tr->dot(w, hi, m.n_in) + tr->dot(w, hi + x.rs, m.n_in);
						double mag = 0;
						for (int64_t k = 0; k < m.n_in; k++)
							mag += fabs((double)m.deq[row * m.n_in + k] * x.deq[i * m.n_in + k]);
						/* the min part apart, as in test_kern_simd.c */
						for (int64_t k = 0; k < m.n_in; k++)
							mag += fabs((double)block_min(m.t, m.plain + row * m.row_bytes, k) *
								    x.deq[i * m.n_in + k]);
						const double err = fabs((double)out[i * 16 + r] - want);
						if (err > 1e-5 * mag + 1e-30) {
							print_error("%s n_in %lld row %d act %d: packed %.9g plain %.9g (bound %.3g)\n",
								    nx_type_name(m.t), (long long)m.n_in, row, i, out[i * 16 + r],
								    want, 1e-5 * mag);
							fail();
						}
					}
			}
			acts_free(&x);
			mat_free(&m);
		}
}

/* Every layout has its SIMD kernel wherever any has one (the CPU, NX_KERN). */
static void test_every_layout_fast(void **state)
{
	(void)state;
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		assert_true(nx_pack_layout(types[ti]));
		assert_non_null(nx_pack_kernel_ref(types[ti]));
		assert_int_equal(nx_pack_fast(types[ti]), nx_pack_fast(NX_Q8_0));
	}
	assert_false(nx_pack_layout(NX_F16));
}

/* The engine's kernel against the packed reference, bit for bit, for every
 * count of tokens per call and several starting tokens; with two-part
 * activations and with one-part ones (lo zeros, which the kernel skips). */
static void test_kernel_exact(void **state)
{
	(void)state;
	if (!nx_pack_fast(NX_Q4_1))
		print_message("no SIMD packed kernel on this CPU: checking the reference against itself\n");
	for (size_t ti = 0; ti < N_TYPES; ti++)
		for (size_t li = 0; li < 2 * N_LENS; li++) {
			struct mat m;
			struct acts x;
			const int n_tot = 11;
			mat_make(&m, types[ti], 32, lens[li % N_LENS]);
			acts_make(&x, n_tot, lens[li % N_LENS], false);
			if (li >= N_LENS)
				acts_zero_lo(&x, n_tot, lens[li % N_LENS]);
			float want[16 * 16], got[NX_PACK_ACT_MAX * NX_PACK_ROWS];
			for (int g = 0; g < m.n_out / 16; g++) {
				const uint8_t *grp = m.packed + (size_t)g * 16 * m.row_bytes;
				for (int i = 0; i < n_tot; i++) {
					struct nx_pack_act a = acts_from(&x, i);
					nx_pack_kernel_ref(m.t)(grp, &a, 1, want + i * 16, m.n_in);
				}
				for (int na = 1; na <= NX_PACK_ACT_MAX; na++)
					for (int i0 = 0; i0 + na <= n_tot; i0 += 3) {
						struct nx_pack_act a = acts_from(&x, i0);
						nx_pack_kernel(m.t)(grp, &a, na, got, m.n_in);
						assert_memory_equal(got, want + i0 * 16, sizeof(float) * 16 * na);
					}
			}
			acts_free(&x);
			mat_free(&m);
		}
}

/* The engine's epilogue against the reference: STORE (with and without a bias)
 * and ADD bit for bit, SWIGLU within its e^x's error; gates of every size,
 * signed zeros and the ends of the float range included. */
static void test_epilogue(void **state)
{
	(void)state;
	const nx_pack_epi_fn fast = nx_pack_epilogue(), ref = nx_pack_epilogue_ref();
	if (fast == ref)
		print_message("no SIMD epilogue on this CPU: checking the reference against itself\n");
	static const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.5f, -87.5f, 88.8f, -88.8f, 89.5f, -89.5f,
				     100.0f, -100.0f, 3e38f, -3e38f, 20.0f, -20.0f};
	float out[NX_PACK_ACT_MAX * 16], bias[16], y0[NX_PACK_ACT_MAX][16], y1[NX_PACK_ACT_MAX][16];
	for (int rep = 0; rep < 200; rep++)
		for (int op = NX_PACK_STORE; op <= NX_PACK_SWIGLU; op++) {
			const int n_act = 1 + rep % NX_PACK_ACT_MAX;
			for (int k = 0; k < 16; k++)
				bias[k] = rng_sym();
			for (int i = 0; i < n_act; i++)
				for (int k = 0; k < 16; k++) {
					out[i * 16 + k] = 4 * rng_sym();
					y0[i][k] = y1[i][k] = rep < 4 ? edge[k] : 12 * rng_sym() * (1 + (k % 5 == 0) * 4);
				}
			float *p0[NX_PACK_ACT_MAX], *p1[NX_PACK_ACT_MAX];
			for (int i = 0; i < n_act; i++)
				p0[i] = y0[i], p1[i] = y1[i];
			const float *b = rep % 2 && op == NX_PACK_STORE ? bias : NULL;
			ref((enum nx_pack_op)op, p0, out, b, n_act);
			fast((enum nx_pack_op)op, p1, out, b, n_act);
			for (int i = 0; i < n_act; i++)
				for (int k = 0; k < 16; k++) {
					const float want = y0[i][k], got = y1[i][k];
					const bool same = !memcmp(&want, &got, sizeof(float));
					if (op != NX_PACK_SWIGLU ? !same
								  : !same && !(fabsf(got - want) <= 1e-6f * fabsf(want)))
						fail_msg("epilogue op %d, rep %d, token %d row %d: %.9g, reference %.9g", op, rep, i,
							 k, got, want);
				}
		}
}

int main(void)
{
	rng_state = 0x9e3779b97f4a7c15ull;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_ref_vs_plain),
		cmocka_unit_test(test_every_layout_fast),
		cmocka_unit_test(test_kernel_exact),
		cmocka_unit_test(test_epilogue),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
