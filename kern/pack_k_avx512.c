/* pack_k_avx512.c - AVX-512 VNNI tile kernels for the super-block types' packed layouts (kern/pack.h: q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs): 16 weight rows x up to 8 tokens per call.
 *
 * Per sub-block, the group's weights are decoded to bytes (nibbles split and
 * q5_k's fifth bit merged in; q6_k's 6-bit q masked out of their bytes) and
 * the scales to floats once; each token then costs 16 vpdpbusd (8 per part,
 * 8 in all when the lo part is zeros: nx_pack_act.lo_zero)
 * against broadcast 4-byte words of its Q8_0 blocks, an integer 128 * hi + lo
 * and 4-7 float ops. q6_k's -32 offset (q3_k's -4) comes in as the starting value of the
 * lo part's integer sums (nx_pack_act.c16), and q2_k's mins against c16 as floats. Every lane follows
 * kern/pack_k.c's reference arithmetic exactly. Built without -m flags (target
 * attributes), used only where kern/cpu.c picks avx512 or amx for the pack family. */
#include "kern/pack_k.h"
#include "kern/pack_tile_avx512.h"

/* q4_k (q5 false) and q5_k; NA tokens (a compile-time constant in each
 * instance: with the loops unrolled the accumulators and decoded weights live
 * in registers; without the pragmas GCC keeps some loops and spills them). */
INL void k4_tile(const void *group, const struct nx_pack_act *a, const int NA, float *out, int64_t n_in, const bool q5,
		 const bool LO)
{
	const int64_t nb = n_in / 32;
	const size_t sbb = q5 ? PK_Q5_K_SB : PK_Q4_K_SB;
	__m512 acc[NX_PACK_ACT_MAX];
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		acc[i] = _mm512_setzero_ps();
	const uint8_t *o = group;
	for (int64_t b0 = 0; b0 < nb; b0 += 8, o += sbb) {
		const uint8_t *hdr = o + PK_K4_HDR;
		__m512 d, ndmin;
		k4_super(hdr, &d, &ndmin);
		/* q4_k's high nibbles stay in place (16 x the code, k4_decode's HI16):
		 * their sums are 16 x the true ones, still multiples of 16 under 2^28,
		 * so converted exactly, and their scale d * sc / 16 is exact, as is
		 * the product: the same bits as shifting the nibbles down. */
		const __m512 d1 = q5 ? d : _mm512_mul_ps(d, _mm512_set1_ps(1.0f / 16));
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
			pf_ahead(o + c * (sbb / 4), (int)(sbb / 4), NA);
			__m512 dsc0, dsc1, nm0, nm1;
			k4_scales(hdr, c, d, d1, ndmin, &dsc0, &dsc1, &nm0, &nm1);
			__m512i lo[8], hi[8];
			k4_decode(o, c, q5, !q5, lo, hi);
			const int64_t b = b0 + 2 * c;
#pragma GCC unroll 8
			for (int i = 0; i < NA; i++) {
				/* sub-blocks b (low nibbles) and b + 1 (high), hi part (h*) and lo part (l*) */
				__m512i h0 = dp4(_mm512_setzero_si512(), lo[0], a, i, 0, b, 0);
				__m512i h1 = dp4(_mm512_setzero_si512(), hi[0], a, i, 0, b + 1, 0);
				__m512i l0 = dp4_lo(_mm512_setzero_si512(), lo[0], a, i, b, 0, LO);
				__m512i l1 = dp4_lo(_mm512_setzero_si512(), hi[0], a, i, b + 1, 0, LO);
#pragma GCC unroll 7
				for (int w = 1; w < 8; w++) {
					h0 = dp4(h0, lo[w], a, i, 0, b, 4 * w);
					h1 = dp4(h1, hi[w], a, i, 0, b + 1, 4 * w);
					l0 = dp4_lo(l0, lo[w], a, i, b, 4 * w, LO);
					l1 = dp4_lo(l1, hi[w], a, i, b + 1, 4 * w, LO);
				}
				const int64_t k = i * nb + b;
				acc[i] = _mm512_fmadd_ps(dsc0, _mm512_mul_ps(_mm512_cvtepi32_ps(comb(h0, l0)), _mm512_set1_ps(a->d[k])), acc[i]);
				acc[i] = _mm512_fmadd_ps(nm0, _mm512_set1_ps(a->s[k]), acc[i]);
				acc[i] = _mm512_fmadd_ps(dsc1, _mm512_mul_ps(_mm512_cvtepi32_ps(comb(h1, l1)), _mm512_set1_ps(a->d[k + 1])), acc[i]);
				acc[i] = _mm512_fmadd_ps(nm1, _mm512_set1_ps(a->s[k + 1]), acc[i]);
			}
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, acc[i]);
}

INL void q4_k_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	k4_tile(g, a, NA, out, n, false, LO);
}

INL void q5_k_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	k4_tile(g, a, NA, out, n, true, LO);
}

INL void q6_k_tile(const void *group, const struct nx_pack_act *a, const int NA, float *out, int64_t n_in,
		   const bool LO)
{
	const int64_t nb = n_in / 32;
	__m512 acc[NX_PACK_ACT_MAX];
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		acc[i] = _mm512_setzero_ps();
	const uint8_t *o = group;
	for (int64_t b0 = 0; b0 < nb; b0 += 8, o += PK_Q6_K_SB) {
		const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + PK_Q6_K_D)));
#pragma GCC unroll 8
		for (int blk = 0; blk < 8; blk++) {
			pf_ahead(o + blk * (PK_Q6_K_SB / 8), PK_Q6_K_SB / 8, NA);
			__m512i q[8];
			q6_decode(o, blk, q);
			__m512 dsc0, dsc1;
			q6_scales(o, blk, d, &dsc0, &dsc1);
			const int64_t b = b0 + blk;
#pragma GCC unroll 8
			for (int i = 0; i < NA; i++) {
				/* halves 0 and 1 of block b, hi part (h*) and lo part (l*, from the offsets) */
				const int32_t *c16 = a->c16 + 2 * (i * nb + b);
				__m512i h0 = dp4(_mm512_setzero_si512(), q[0], a, i, 0, b, 0);
				__m512i h1 = dp4(_mm512_setzero_si512(), q[4], a, i, 0, b, 16);
				__m512i l0 = dp4_lo(_mm512_set1_epi32(c16[0]), q[0], a, i, b, 0, LO);
				__m512i l1 = dp4_lo(_mm512_set1_epi32(c16[1]), q[4], a, i, b, 16, LO);
#pragma GCC unroll 3
				for (int w = 1; w < 4; w++) {
					h0 = dp4(h0, q[w], a, i, 0, b, 4 * w);
					h1 = dp4(h1, q[4 + w], a, i, 0, b, 16 + 4 * w);
					l0 = dp4_lo(l0, q[w], a, i, b, 4 * w, LO);
					l1 = dp4_lo(l1, q[4 + w], a, i, b, 16 + 4 * w, LO);
				}
				const __m512 f = _mm512_fmadd_ps(dsc1, _mm512_cvtepi32_ps(comb(h1, l1)),
								 _mm512_mul_ps(dsc0, _mm512_cvtepi32_ps(comb(h0, l0))));
				acc[i] = _mm512_fmadd_ps(f, _mm512_set1_ps(a->d[i * nb + b]), acc[i]);
			}
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, acc[i]);
}

/* iq4_xs: per sub-block, the nibbles looked up as grid + 128 (unsigned codes, q8_0's
 * offset -c as the lo part's start) and the 16 rows' d * (ls - 32) as floats. */
INL void iq4_xs_tile(const void *group, const struct nx_pack_act *a, const int NA, float *out, int64_t n_in,
		     const bool LO)
{
	const int64_t nb = n_in / 32;
	const __m512i m4 = _mm512_set1_epi8(0x0f), m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
	const __m512i grid = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)nx_kvalues_iq4nl)),
					     _mm512_set1_epi8((char)0x80));
	__m512 acc[NX_PACK_ACT_MAX];
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		acc[i] = _mm512_setzero_ps();
	const uint8_t *o = group;
	for (int64_t b0 = 0; b0 < nb; b0 += 8, o += PK_IQ4_XS_SB) {
		const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + PK_XS_D)));
		const __m512i sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(o + PK_XS_SH)));
#pragma GCC unroll 8
		for (int j = 0; j < 8; j++) {
			if (j % 2 == 0) /* the whole super-block, its scales too, in four parts */
				pf_ahead(o + PK_IQ4_XS_SB / 4 * (j / 2), PK_IQ4_XS_SB / 4, NA);
			const __m512i sl = _mm512_and_si512(_mm512_srli_epi32(lanes_u8(o + PK_XS_SL + 16 * (j / 2)), 4 * (j % 2)), m15);
			const __m512i ls = or_and(sl, _mm512_slli_epi32(_mm512_srli_epi32(sh, 2 * j), 4), _mm512_slli_epi32(m3, 4));
			const __m512 dsc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))), d);
			__m512i lo[4], hi[4];
#pragma GCC unroll 4
			for (int c = 0; c < 4; c++) {
				const __m512i v = load(o + PK_XS_QS + 64 * (4 * j + c));
				lo[c] = _mm512_shuffle_epi8(grid, _mm512_and_si512(v, m4));
				hi[c] = _mm512_shuffle_epi8(grid, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
			}
			const int64_t b = b0 + j;
#pragma GCC unroll 8
			for (int i = 0; i < NA; i++) {
				__m512i h0 = dp4(_mm512_setzero_si512(), lo[0], a, i, 0, b, 0);
				__m512i h1 = dp4(_mm512_setzero_si512(), hi[0], a, i, 0, b, 16);
				__m512i l0 = dp4_lo(_mm512_set1_epi32(-a->c[i * nb + b]), lo[0], a, i, b, 0, LO);
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
				acc[i] = _mm512_fmadd_ps(dsc, t, acc[i]);
			}
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, acc[i]);
}

/* q2_k (q3 false) and q3_k: per block, the 8 words' levels shifted out of two
 * vectors (q3_k: the third bit merged in from a third), the two halves' scales
 * (q2_k: and mins) as floats; per token, q6_k's steps (q2_k: and the mins). */
INL void k2_tile(const void *group, const struct nx_pack_act *a, const int NA, float *out, int64_t n_in, const bool q3,
		 const bool LO)
{
	const int64_t nb = n_in / 32;
	const size_t sbb = q3 ? PK_Q3_K_SB : PK_Q2_K_SB;
	const __m512i m3 = _mm512_set1_epi8(0x03), m4 = _mm512_set1_epi8(0x04), m15 = _mm512_set1_epi32(15),
		      m32 = _mm512_set1_epi32(32);
	__m512 acc[NX_PACK_ACT_MAX];
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		acc[i] = _mm512_setzero_ps();
	const uint8_t *o = group;
	for (int64_t b0 = 0; b0 < nb; b0 += 8, o += sbb) {
		const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + (q3 ? PK_Q3_K_D : PK_Q2_K_D))));
		const __m512 dmin32 = q3 ? d : _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + PK_Q2_K_DMIN))),
							      _mm512_set1_ps(1.0f / 32));
#pragma GCC unroll 8
		for (int j = 0; j < 8; j++) {
			pf_ahead(o + j * (int)(sbb / 8), (int)(sbb / 8), NA);
			__m512i q[8];
			const __m512i v0 = load(o + PK_K2_QS(q3) + 64 * (2 * j)), v1 = load(o + PK_K2_QS(q3) + 64 * (2 * j + 1));
#pragma GCC unroll 4
			for (int s = 0; s < 4; s++) {
				q[s] = _mm512_and_si512(_mm512_srli_epi16(v0, 2 * s), m3);
				q[4 + s] = _mm512_and_si512(_mm512_srli_epi16(v1, 2 * s), m3);
			}
			__m512 dsc0, dsc1, dm0 = d, dm1 = d;
			if (q3) { /* bit w of the third-bit bytes to bit 2 of word w */
				const __m512i h = load(o + PK_Q3_K_HM + 64 * j);
#pragma GCC unroll 8
				for (int w = 0; w < 8; w++) {
					const __m512i hw = w < 2 ? _mm512_slli_epi16(h, 2 - w) : w == 2 ? h : _mm512_srli_epi16(h, w - 2);
					q[w] = or_and(q[w], hw, m4);
				}
				const __m512i sl = lanes_u8(o + PK_Q3_K_SL + 16 * j);
				const __m512i sh = _mm512_srli_epi32(lanes_u8(o + PK_Q3_K_SH + 16 * (j / 2)), 4 * (j % 2));
				const __m512i s0 = or_and(_mm512_and_si512(sl, m15), _mm512_slli_epi32(sh, 4), _mm512_set1_epi32(0x30));
				const __m512i s1 = or_and(_mm512_srli_epi32(sl, 4), _mm512_slli_epi32(sh, 2), _mm512_set1_epi32(0x30));
				dsc0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s0, m32)), d);
				dsc1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s1, m32)), d);
			} else {
				const __m512i s0 = lanes_u8(o + PK_Q2_K_SC + 16 * (2 * j)), s1 = lanes_u8(o + PK_Q2_K_SC + 16 * (2 * j + 1));
				dsc0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(s0, m15)), d);
				dsc1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(s1, m15)), d);
				dm0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(s0, 4)), dmin32);
				dm1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(s1, 4)), dmin32);
			}
			const int64_t b = b0 + j;
#pragma GCC unroll 8
			for (int i = 0; i < NA; i++) {
				const int32_t *c16 = a->c16 + 2 * (i * nb + b);
				__m512i h0 = dp4(_mm512_setzero_si512(), q[0], a, i, 0, b, 0);
				__m512i h1 = dp4(_mm512_setzero_si512(), q[4], a, i, 0, b, 16);
				/* c16 broadcast from memory (a load, not a shuffle); a multiple of 32, so >> 3 is / 8 */
				const __m512i c0 = _mm512_set1_epi32(c16[0]), c1 = _mm512_set1_epi32(c16[1]);
				__m512i l0 = dp4_lo(q3 ? _mm512_srai_epi32(c0, 3) : _mm512_setzero_si512(), q[0], a, i, b, 0, LO);
				__m512i l1 = dp4_lo(q3 ? _mm512_srai_epi32(c1, 3) : _mm512_setzero_si512(), q[4], a, i, b, 16, LO);
#pragma GCC unroll 3
				for (int w = 1; w < 4; w++) {
					h0 = dp4(h0, q[w], a, i, 0, b, 4 * w);
					h1 = dp4(h1, q[4 + w], a, i, 0, b, 16 + 4 * w);
					l0 = dp4_lo(l0, q[w], a, i, b, 4 * w, LO);
					l1 = dp4_lo(l1, q[4 + w], a, i, b, 16 + 4 * w, LO);
				}
				__m512 f = _mm512_fmadd_ps(dsc1, _mm512_cvtepi32_ps(comb(h1, l1)),
							   _mm512_mul_ps(dsc0, _mm512_cvtepi32_ps(comb(h0, l0))));
				if (!q3) {
					f = _mm512_fmadd_ps(dm0, _mm512_cvtepi32_ps(c0), f);
					f = _mm512_fmadd_ps(dm1, _mm512_cvtepi32_ps(c1), f);
				}
				acc[i] = _mm512_fmadd_ps(f, _mm512_set1_ps(a->d[i * nb + b]), acc[i]);
			}
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < NA; i++)
		_mm512_storeu_ps(out + i * NX_PACK_ROWS, acc[i]);
}

INL void q2_k_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	k2_tile(g, a, NA, out, n, false, LO);
}

INL void q3_k_tile(const void *g, const struct nx_pack_act *a, const int NA, float *out, int64_t n, const bool LO)
{
	k2_tile(g, a, NA, out, n, true, LO);
}

TILE_FN(q2_k)
TILE_FN(q3_k)
TILE_FN(q4_k)
TILE_FN(q5_k)
TILE_FN(q6_k)
TILE_FN(iq4_xs)

nx_pack_fn nx_pack_k_avx512_kernel(enum nx_type t)
{
	switch (t) {
	case NX_Q2_K: return pk_q2_k;
	case NX_Q3_K: return pk_q3_k;
	case NX_Q4_K: return pk_q4_k;
	case NX_Q5_K: return pk_q5_k;
	case NX_Q6_K: return pk_q6_k;
	case NX_IQ4_XS: return pk_iq4_xs;
	default: return NULL;
	}
}
