/* pack_avx512.c - AVX-512 VNNI tile kernels for the packed layouts (kern/pack.h): 16 weight rows x up to 8 tokens per call.
 *
 * Per block, the group's weights are loaded (and for the 4-bit types split into
 * nibbles, q5's fifth bits added under a mask) once; each token then costs 16
 * vpdpbusd (8 per part) whose activation operand is a broadcast 4-byte word of
 * its Q8_0 block, an integer 128 * hi + lo, and 3-4 float ops for the scales;
 * 8 when the lo part is zeros (one-part activations, nx_pack_act.lo_zero).
 * Every lane follows kern/pack.c's reference arithmetic exactly. The loops over
 * tokens and vectors are unrolled by pragma: at -O2 GCC leaves them
 * rolled, keeps the accumulators in stack arrays and the kernel runs at half
 * speed (store-forwarding chains). Built without
 * -m flags (target attributes), used only where kern/cpu.c picks avx512 or amx for the pack family. */
#include "kern/pack.h"
#include "kern/pack_tile_avx512.h"
#include "kern/vexp_avx512.h"

/* The 4-bit types, a group block of GB bytes laid out as in kern/pack.h: scales
 * at 0, mins at M, fifth-bit masks at H (M, H < 0: none), nibble vectors at QS.
 * SHIFT >= 0: the weights are stored offset (q4_0: q + 8, q5_0: q + 16; iq4_nl,
 * GRID: codes grid[nibble] + 128, looked up), so the block sum starts at
 * -c / 2^SHIFT (= -8, -16 or -128 times the activation's sum).
 * NA tokens. All arguments but the pointers and n_in are compile-time
 * constants in each instance, so the accumulators live in registers. */
INL void nib_tile(const void *group, const struct nx_pack_act *a, const int NA, float *out, int64_t n_in,
		  const int GB, const int M, const int H, const int QS, const int SHIFT, const bool GRID, const bool LO)
{
	const int64_t nb = n_in / 32;
	const __m512i grid = nib_grid(GRID);
	__m512 acc_d[NX_PACK_ACT_MAX], acc_m[NX_PACK_ACT_MAX];
	#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		acc_d[i] = acc_m[i] = _mm512_setzero_ps();
	const uint8_t *o = group;
	for (int64_t b = 0; b < nb; b++, o += GB) {
		pf_ahead(o, GB, NA);
		const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
		const __m512 mw = M >= 0 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + M))) : dw;
		__m512i lo[4], hi[4];
		nib_decode(o, H, QS, GRID, grid, lo, hi);
		#pragma GCC unroll 8
		for (int i = 0; i < NA; i++) {
			/* four chains: the hi part (h*) and the lo part (l*), low and high nibbles */
			const int32_t off = SHIFT >= 0 ? a->c[i * nb + b] / (1 << SHIFT) : 0;
			__m512i h0 = dp4(_mm512_setzero_si512(), lo[0], a, i, 0, b, 0);
			__m512i h1 = dp4(_mm512_setzero_si512(), hi[0], a, i, 0, b, 16);
			__m512i l0 = dp4_lo(_mm512_set1_epi32(-off), lo[0], a, i, b, 0, LO);
			__m512i l1 = dp4_lo(_mm512_setzero_si512(), hi[0], a, i, b, 16, LO);
			#pragma GCC unroll 3
			for (int c = 1; c < 4; c++) {
				h0 = dp4(h0, lo[c], a, i, 0, b, 4 * c);
				h1 = dp4(h1, hi[c], a, i, 0, b, 16 + 4 * c);
				l0 = dp4_lo(l0, lo[c], a, i, b, 4 * c, LO);
				l1 = dp4_lo(l1, hi[c], a, i, b, 16 + 4 * c, LO);
			}
			const __m512i s = comb(_mm512_add_epi32(h0, h1), _mm512_add_epi32(l0, l1));
			const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a->d[i * nb + b]));
			acc_d[i] = _mm512_fmadd_ps(dw, t, acc_d[i]);
			if (M >= 0)
				acc_m[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->s[i * nb + b]), acc_m[i]);
		}
	}
	#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, M >= 0 ? _mm512_add_ps(acc_d[i], acc_m[i]) : acc_d[i]);
}

/* Block bytes and offsets: kern/pack.h (tests/c/test_pack.c holds them to kern/pack.c's reference). */
INL void q4_0_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	nib_tile(g, a, NA, out, n, 288, -1, -1, 32, 4, false, LO);
}

INL void iq4_nl_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	nib_tile(g, a, NA, out, n, 288, -1, -1, 32, 0, true, LO);
}

INL void q4_1_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	nib_tile(g, a, NA, out, n, 320, 32, -1, 64, -1, false, LO);
}

INL void q5_0_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	nib_tile(g, a, NA, out, n, 352, -1, 32, 96, 3, false, LO);
}

INL void q5_1_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	nib_tile(g, a, NA, out, n, 384, 32, 64, 128, -1, false, LO);
}

INL void q8_0_tile(const void *group, const struct nx_pack_act *a, const int NA, float *out, int64_t n_in,
		   const bool LO)
{
	const int64_t nb = n_in / 32;
	__m512 acc[NX_PACK_ACT_MAX];
	#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		acc[i] = _mm512_setzero_ps();
	const uint8_t *o = group;
	for (int64_t b = 0; b < nb; b++, o += 544) {
		pf_ahead(o, 544, NA);
		const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
		__m512i w[8];
		#pragma GCC unroll 8
		for (int c = 0; c < 8; c++)
			w[c] = _mm512_loadu_si512((const void *)(o + 32 + 64 * c));
		#pragma GCC unroll 8
		for (int i = 0; i < NA; i++) {
			__m512i h0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], act4(a, i, 0, b, 0));
			__m512i h1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], act4(a, i, 0, b, 4));
			__m512i l0 = _mm512_set1_epi32(-a->c[i * nb + b]), l1 = _mm512_setzero_si512();
			if (LO) {
				l0 = _mm512_dpbusd_epi32(l0, w[0], act4(a, i, 1, b, 0));
				l1 = _mm512_dpbusd_epi32(l1, w[1], act4(a, i, 1, b, 4));
			}
			#pragma GCC unroll 3
			for (int c = 2; c < 8; c += 2) {
				h0 = _mm512_dpbusd_epi32(h0, w[c], act4(a, i, 0, b, 4 * c));
				h1 = _mm512_dpbusd_epi32(h1, w[c + 1], act4(a, i, 0, b, 4 * c + 4));
				if (LO) {
					l0 = _mm512_dpbusd_epi32(l0, w[c], act4(a, i, 1, b, 4 * c));
					l1 = _mm512_dpbusd_epi32(l1, w[c + 1], act4(a, i, 1, b, 4 * c + 4));
				}
			}
			const __m512i s = comb(_mm512_add_epi32(h0, h1), _mm512_add_epi32(l0, l1));
			const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a->d[i * nb + b]));
			acc[i] = _mm512_fmadd_ps(dw, t, acc[i]);
		}
	}
	#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, acc[i]);
}

TILE_FN(q4_0)
TILE_FN(q4_1)
TILE_FN(q5_0)
TILE_FN(q5_1)
TILE_FN(q8_0)
TILE_FN(iq4_nl)

/* The reference's arithmetic, 16 rows (one vector) per token; SiLU's e^-y by
 * nx_vexp instead of expf. */
static TGT void epi(enum nx_pack_op op, float *const *y, const float *out, const float *bias, int n_act)
{
	const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
	for (int i = 0; i < n_act; i++) {
		const __m512 d = _mm512_loadu_ps(out + i * NX_PACK_ROWS);
		switch (op) {
		case NX_PACK_STORE:
			_mm512_storeu_ps(y[i], bias ? _mm512_add_ps(d, b) : d);
			break;
		case NX_PACK_ADD:
			_mm512_storeu_ps(y[i], _mm512_add_ps(_mm512_loadu_ps(y[i]), d));
			break;
		case NX_PACK_SWIGLU: {
			const __m512 g = _mm512_loadu_ps(y[i]);
			const __m512 e = nx_vexp(_mm512_sub_ps(_mm512_setzero_ps(), g));
			_mm512_storeu_ps(y[i], _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), d));
			break;
		}
		}
	}
}

nx_pack_epi_fn nx_pack_avx512_epilogue(void)
{
	return epi;
}

nx_pack_fn nx_pack_avx512_kernel(enum nx_type t)
{
	switch (t) {
	case NX_Q4_0: return pk_q4_0;
	case NX_Q4_1: return pk_q4_1;
	case NX_Q5_0: return pk_q5_0;
	case NX_Q5_1: return pk_q5_1;
	case NX_Q8_0: return pk_q8_0;
	case NX_IQ4_NL: return pk_iq4_nl;
	default: return NULL;
	}
}
