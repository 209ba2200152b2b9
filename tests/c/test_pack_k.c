/* test_pack_k.c - the k-quants' and iq4_xs's packed layouts (kern/pack.h, kern/pack_k.c): pack/unpack
 * round trip, the packed reference within a float-summation bound of the exact
 * dot of the plain rows' dequantized values with the two-part Q8_0 activations,
 * and the SIMD tile kernels bit-identical to the packed reference for every
 * number of tokens per call. Weights come from the quantizer and from random
 * block bytes (every scale and quant pattern, activations down to -128). */
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

static const enum nx_type types[] = {NX_Q4_K, NX_Q5_K, NX_Q6_K, NX_IQ4_XS, NX_Q2_K, NX_Q3_K};
#define N_TYPES 6

struct mat {
	enum nx_type t;
	int64_t n_in;
	int n_out;
	size_t row_bytes;
	uint8_t *plain, *packed;
	float *deq;  /* (n_out, n_in) dequantized plain rows */
	float *mins; /* (n_out, n_in) q2_k/q4_k/q5_k: the min each element subtracts (dmin * m), else 0 */
};

/* Offsets of the f16 scales in a plain super-block, which random bytes keep finite. */
static void set_scales(enum nx_type t, uint8_t *blk)
{
	const nx_f16 d = nx_f32_to_f16(0.001f + 0.01f * fabsf(rng_sym())), dm = nx_f32_to_f16(0.01f * fabsf(rng_sym()));
	if (t == NX_Q6_K) {
		memcpy(blk + offsetof(struct nx_block_q6_k, d), &d, 2);
	} else if (t == NX_Q3_K) {
		memcpy(blk + offsetof(struct nx_block_q3_k, d), &d, 2);
	} else if (t == NX_Q2_K) {
		memcpy(blk + offsetof(struct nx_block_q2_k, d), &d, 2);
		memcpy(blk + offsetof(struct nx_block_q2_k, dmin), &dm, 2);
	} else if (t == NX_IQ4_XS) {
		memcpy(blk, &d, 2);
	} else {
		memcpy(blk, &d, 2); /* d, dmin lead q4_k and q5_k */
		memcpy(blk + 2, &dm, 2);
	}
}

/* random_bytes: every byte random but the f16 scales; else quantized rows of real-looking weights. */
static void mat_make(struct mat *m, enum nx_type t, int n_out, int64_t n_in, bool random_bytes)
{
	const struct nx_type_traits *tr = nx_type_ref(t);
	m->t = t;
	m->n_in = n_in;
	m->n_out = n_out;
	m->row_bytes = (size_t)nx_row_size(t, n_in);
	m->plain = malloc(m->row_bytes * n_out);
	m->packed = malloc(m->row_bytes * n_out);
	m->deq = malloc(sizeof(float) * n_in * n_out);
	m->mins = malloc(sizeof(float) * n_in * n_out);
	float *x = malloc(sizeof(float) * n_in);
	uint8_t *zq = malloc(m->row_bytes);
	for (int r = 0; r < n_out; r++) {
		uint8_t *row = m->plain + r * m->row_bytes;
		if (random_bytes) {
			for (size_t k = 0; k < m->row_bytes; k++)
				row[k] = (uint8_t)rng_next();
			for (int64_t sb = 0; sb < n_in / QK_K; sb++)
				set_scales(t, row + sb * tr->type_size);
		} else {
			const float scale = 0.02f * (1 + r % 5); /* rows of different magnitudes, a few outliers */
			for (int64_t i = 0; i < n_in; i++)
				x[i] = scale * rng_sym() + (i % 97 == 0 ? 0.3f * rng_sym() : 0);
			tr->quant(x, row, n_in);
		}
		tr->dequant(row, m->deq + r * n_in, n_in);
		/* The mins: the row with every q zeroed dequantizes to -dmin * m exactly. */
		memcpy(zq, row, m->row_bytes);
		for (int64_t sb = 0; sb < n_in / QK_K; sb++) {
			if (t == NX_Q4_K)
				memset(((struct nx_block_q4_k *)zq)[sb].qs, 0, QK_K / 2);
			if (t == NX_Q5_K) {
				memset(((struct nx_block_q5_k *)zq)[sb].qs, 0, QK_K / 2);
				memset(((struct nx_block_q5_k *)zq)[sb].qh, 0, QK_K / 8);
			}
			if (t == NX_Q2_K)
				memset(((struct nx_block_q2_k *)zq)[sb].qs, 0, QK_K / 4);
		}
		tr->dequant(zq, m->mins + r * n_in, n_in);
		for (int64_t i = 0; t != NX_Q4_K && t != NX_Q5_K && t != NX_Q2_K && i < n_in; i++)
			m->mins[r * n_in + i] = 0;
	}
	free(zq);
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
	free(m->mins);
}

static void test_layout(void **state)
{
	(void)state;
	for (int ti = 0; ti < N_TYPES; ti++) {
		assert_true(nx_pack_layout(types[ti]));
		assert_non_null(nx_pack_kernel_ref(types[ti]));
		assert_non_null(nx_pack_kernel(types[ti]));
	}
	assert_false(nx_pack_layout(NX_F16));
	/* the types whose kernels read the per-16 activation sums, and only they */
	for (int ti = 0; ti < N_TYPES; ti++)
		assert_int_equal(nx_pack_needs_c16(types[ti]),
				 types[ti] == NX_Q6_K || types[ti] == NX_Q2_K || types[ti] == NX_Q3_K);
}

static void test_roundtrip(void **state)
{
	(void)state;
	static const int64_t lens[] = {256, 512, 1536};
	for (int ti = 0; ti < N_TYPES; ti++)
		for (int li = 0; li < 3; li++)
			for (int rnd = 0; rnd < 2; rnd++) {
				struct mat m;
				mat_make(&m, types[ti], 32, lens[li], rnd);
				uint8_t *row = malloc(m.row_bytes);
				for (int r = 0; r < m.n_out; r++) {
					nx_unpack_row(m.t, m.packed + (size_t)(r / 16) * 16 * m.row_bytes, r % 16, row, m.n_in);
					assert_memory_equal(row, m.plain + r * m.row_bytes, m.row_bytes);
				}
				free(row);
				mat_free(&m);
			}
}

/* The packed reference against the exact (float64) dot of the plain rows'
 * dequantized values with the dequantized activations: within 1e-5 x the sum of
 * the addends' magnitudes, the mins counted apart (as test_pack.c). */
static void test_ref_vs_plain(void **state)
{
	(void)state;
	static const int64_t lens[] = {256, 768, 1536};
	for (int ti = 0; ti < N_TYPES; ti++)
		for (int li = 0; li < 3; li++)
			for (int rnd = 0; rnd < 2; rnd++) {
				struct mat m;
				struct acts x;
				const int n_act = NX_PACK_ACT_MAX;
				mat_make(&m, types[ti], 32, lens[li], rnd);
				acts_make(&x, n_act, lens[li], rnd);
				float out[NX_PACK_ACT_MAX * NX_PACK_ROWS];
				for (int g = 0; g < m.n_out / 16; g++) {
					nx_pack_kernel_ref(m.t)(m.packed + (size_t)g * 16 * m.row_bytes, &x.a, n_act, out, m.n_in);
					for (int i = 0; i < n_act; i++)
						for (int r = 0; r < 16; r++) {
							const int row = g * 16 + r;
							double want = 0, mag = 0;
							for (int64_t k = 0; k < m.n_in; k++) {
								const double a = x.deq[i * m.n_in + k];
								want += (double)m.deq[row * m.n_in + k] * a;
								mag += (fabs(m.deq[row * m.n_in + k]) + fabs(m.mins[row * m.n_in + k])) * fabs(a);
							}
							const double err = fabs((double)out[i * 16 + r] - want);
							if (!(err <= 1e-5 * mag + 1e-30)) {
								print_error("%s n_in %lld %s row %d act %d: packed %.9g exact %.9g (bound %.3g)\n",
									    nx_type_name(m.t), (long long)m.n_in, rnd ? "random" : "quantized",
									    row, i, out[i * 16 + r], want, 1e-5 * mag);
								fail();
							}
						}
				}
				acts_free(&x);
				mat_free(&m);
			}
}

/* The engine's kernel against the packed reference, bit for bit, for every
 * count of tokens per call (1..NX_PACK_ACT_MAX) and several starting tokens;
 * with two-part activations and with one-part ones (lo zeros, which the
 * kernel skips). */
static void test_kernel_exact(void **state)
{
	(void)state;
	static const int64_t lens[] = {256, 512, 768, 1536, 4864};
	if (!nx_pack_fast(NX_Q4_K))
		print_message("no SIMD packed kernel on this CPU: checking the reference against itself\n");
	for (int ti = 0; ti < N_TYPES; ti++)
		for (int li = 0; li < 5; li++)
			for (int rnd = 0; rnd < 4; rnd++) {
				struct mat m;
				struct acts x;
				const int n_tot = 11;
				mat_make(&m, types[ti], 32, lens[li], rnd & 1);
				acts_make(&x, n_tot, lens[li], rnd & 1);
				if (rnd >= 2)
					acts_zero_lo(&x, n_tot, lens[li]);
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
							memset(got, 0xff, sizeof(got));
							nx_pack_kernel(m.t)(grp, &a, na, got, m.n_in);
							if (memcmp(got, want + i0 * 16, sizeof(float) * 16 * na)) {
								for (int k = 0; k < 16 * na; k++)
									if (memcmp(&got[k], &want[i0 * 16 + k], sizeof(float)))
										print_error("%s n_in %lld %s%s na %d i0 %d: row %d act %d simd %.9g ref %.9g\n",
											    nx_type_name(m.t), (long long)m.n_in,
											    rnd & 1 ? "random" : "quantized", rnd & 2 ? " one-part" : "",
											    na, i0, k % 16,
											    i0 + k / 16, got[k], want[i0 * 16 + k]);
								fail();
							}
						}
				}
				acts_free(&x);
				mat_free(&m);
			}
}

int main(void)
{
	rng_state = 0x2545f4914f6cdd1dull;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_ref_vs_plain),
		cmocka_unit_test(test_kernel_exact),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
