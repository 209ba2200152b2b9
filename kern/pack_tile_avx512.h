/* pack_tile_avx512.h - what the AVX-512 and AMX tile kernel files (pack_avx512.c, pack_k_avx512.c, pack_amx.c) share:
 * their target attributes, the broadcast of an activation word, the weight decoders and the
 * per-NA instancing of a kernel. Include only from those files. */
#ifndef NX_PACK_TILE_AVX512_H
#define NX_PACK_TILE_AVX512_H

#include <immintrin.h>
#include <string.h>

#include "kern/pack.h"
#include "kern/pack_k.h"

#define TGT_STR "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c"
#define TGT __attribute__((target(TGT_STR)))
#define INL static inline __attribute__((always_inline, target(TGT_STR)))

/* The 4 quant bytes at k of token i's hi (part 0) or lo (part 1) block b, in every int32 lane. */
INL __m512i act4(const struct nx_pack_act *a, int i, int part, int64_t b, int k)
{
	int32_t v;
	memcpy(&v, nx_pack_act_qs(a, i, part, b) + k, 4);
	return _mm512_set1_epi32(v);
}

/* _mm512_dpbusd_epi32(acc, w, act4(a, i, part, b, k)) with the word as an
 * embedded broadcast of the instruction's memory operand (GCC does not fold
 * the set1 into it). With the weights in L2 (nx-packbench -c -t 1) Q4_1's
 * tile took 1.29-1.31 ms per step at 1 token instead of 1.36-1.39, 2.32 at 2
 * instead of 2.41-2.43, the same at 4; q8_0's, which loads twice the weight
 * vectors per block, took 1.96-2.04 at 1 token instead of 1.75, so it keeps act4. */
INL __m512i dp4(__m512i acc, __m512i w, const struct nx_pack_act *a, int i, int part, int64_t b, int k)
{
	const int8_t *p = nx_pack_act_qs(a, i, part, b) + k;
	__asm__("vpdpbusd %[m]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [m] "m"(*(const int32_t *)p));
	return acc;
}

/* dp4 of token i's lo part, or acc itself when the lo rows are zeros (LO false,
 * a compile-time constant): adding nothing leaves the same bits. */
INL __m512i dp4_lo(__m512i acc, __m512i w, const struct nx_pack_act *a, int i, int64_t b, int k, const bool LO)
{
	return LO ? dp4(acc, w, a, i, 1, b, k) : acc;
}

/* Bytes ahead of the weights in use that the kernels ask the cache for: with
 * the hardware prefetchers alone the tiles wait on memory (several tokens
 * on every host measured, one token on some). Past the end of a matrix it
 * asks for bytes nobody uses; a prefetch never faults. Tiles of more than
 * one token, which spend longer on each block, ask further ahead and into L2
 * (NX_PF_AHEAD_MT, prefetcht1); one-token tiles were slower with that alone,
 * so they ask twice: into L2 far ahead (NX_PF_AHEAD_L2), which keeps more
 * lines on their way from memory, and into L1 nearer (NX_PF_AHEAD), by then
 * from L2. docs/bench.md, "Measurements behind choices in the code", has the runs. */
#ifndef NX_PF_AHEAD
#define NX_PF_AHEAD 2048
#endif
#ifndef NX_PF_AHEAD_L2
#define NX_PF_AHEAD_L2 16384
#endif
#ifndef NX_PF_AHEAD_MT
#define NX_PF_AHEAD_MT 8192
#endif

/* Asks for the `bytes` (a compile-time constant) ahead of o, for a tile of NA tokens (a compile-time constant). */
INL void pf_ahead(const uint8_t *o, const int bytes, const int NA)
{
	for (int l = 0; l < bytes; l += 64)
		if (NA > 1) {
			_mm_prefetch((const char *)o + NX_PF_AHEAD_MT + l, _MM_HINT_T1);
		} else {
			_mm_prefetch((const char *)o + NX_PF_AHEAD_L2 + l, _MM_HINT_T1);
			_mm_prefetch((const char *)o + NX_PF_AHEAD + l, _MM_HINT_T0);
		}
}

/* 128 * hi + lo of a token's integer block dots (kern/pack.h: |.| < 2^28). */
INL __m512i comb(__m512i hi, __m512i lo)
{
	return _mm512_add_epi32(_mm512_slli_epi32(hi, 7), lo);
}

/* 16 bytes (one per row) widened to 16 int32 lanes. */
INL __m512i lanes_u8(const uint8_t *p)
{
	return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

INL __m512i lanes_i8(const uint8_t *p)
{
	return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}

INL __m512i load(const uint8_t *p)
{
	return _mm512_loadu_si512((const void *)p);
}

/* a | (b & c), bitwise */
INL __m512i or_and(__m512i a, __m512i b, __m512i c)
{
	return _mm512_ternarylogic_epi32(a, b, c, 0xf8);
}

/* q4_k's and q5_k's super-block scales d and -dmin, one lane per row (hdr: PK_K4_HDR). */
INL void k4_super(const uint8_t *hdr, __m512 *d, __m512 *ndmin)
{
	*d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(hdr + PK_K4_D)));
	*ndmin = _mm512_castsi512_ps(_mm512_xor_si512(
		_mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(hdr + PK_K4_DMIN)))),
		_mm512_set1_epi32((int)0x80000000)));
}

/* Sub-blocks 2c and 2c + 1 of a q4_k / q5_k super-block: d0 * scale (dsc0), d1 * scale (dsc1) and
 * -dmin * min (nm*) per row; d0 and d1 the super-block's d (d1 / 16 for k4_decode's HI16). */
INL void k4_scales(const uint8_t *hdr, int c, __m512 d0, __m512 d1, __m512 ndmin, __m512 *dsc0, __m512 *dsc1,
		   __m512 *nm0, __m512 *nm1)
{
	const __m512i m63 = _mm512_set1_epi32(63), m30 = _mm512_set1_epi32(0x30);
	const __m512i s0 = lanes_u8(hdr + PK_K4_SC + 16 * (2 * c)), s1 = lanes_u8(hdr + PK_K4_SC + 16 * (2 * c + 1));
	const __m512i ml = lanes_u8(hdr + PK_K4_MLO + 16 * c);
	*dsc0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(s0, m63)), d0);
	*dsc1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(s1, m63)), d1);
	const __m512i mn0 = or_and(_mm512_and_si512(ml, _mm512_set1_epi32(15)), _mm512_srli_epi32(s0, 2), m30);
	const __m512i mn1 = or_and(_mm512_srli_epi32(ml, 4), _mm512_srli_epi32(s1, 2), m30);
	*nm0 = _mm512_mul_ps(_mm512_cvtepi32_ps(mn0), ndmin);
	*nm1 = _mm512_mul_ps(_mm512_cvtepi32_ps(mn1), ndmin);
}

/* The weight bytes of sub-blocks 2c (lo[w]) and 2c + 1 (hi[w]) of a q4_k / q5_k
 * super-block o, lane r = elements 4w .. 4w+3 of row r, q5: the fifth bits merged in.
 * HI16 (q4_k only): hi[w] holds 16 x the high nibbles, left in place (one op
 * fewer a vector); the caller scales that sub-block by 1/16. */
INL void k4_decode(const uint8_t *o, const int c, const bool q5, const bool HI16, __m512i lo[8], __m512i hi[8])
{
	const __m512i m4 = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10), m4h = _mm512_set1_epi8((char)0xf0);
#pragma GCC unroll 8
	for (int w = 0; w < 8; w++) {
		const __m512i v = load(o + PK_K4_QS(q5) + 64 * (8 * c + w));
		lo[w] = _mm512_and_si512(v, m4);
		hi[w] = HI16 ? _mm512_and_si512(v, m4h) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
		if (q5) { /* bit 2c of qh to bit 4 of the low, bit 2c + 1 to bit 4 of the high nibbles */
			const __m512i h = load(o + PK_K5_QH + 64 * w);
			const __m512i h0 = c < 2 ? _mm512_slli_epi16(h, 4 - 2 * c) : c == 2 ? h : _mm512_srli_epi16(h, 2);
			const __m512i h1 = c < 2 ? _mm512_slli_epi16(h, 3 - 2 * c) : _mm512_srli_epi16(h, 2 * c - 3);
			lo[w] = or_and(lo[w], h0, bit4);
			hi[w] = or_and(hi[w], h1, bit4);
		}
	}
}

/* The 6-bit codes of block blk of a q6_k super-block o: q[w] lane r = elements 4w .. 4w+3 of row r. */
INL void q6_decode(const uint8_t *o, int blk, __m512i q[8])
{
	const __m512i m63 = _mm512_set1_epi8(0x3f), mc0 = _mm512_set1_epi8((char)0xc0), m03 = _mm512_set1_epi8(0x03),
		      m0c = _mm512_set1_epi8(0x0c);
#pragma GCC unroll 2
	for (int half = 0; half < 2; half++) { /* words 4 half .. + 3 from X, Y, Z */
		const uint8_t *v = o + PK_Q6_K_Q + 64 * (6 * blk + 3 * half);
		const __m512i x = load(v), y = load(v + 64), z = load(v + 128);
		q[4 * half] = _mm512_and_si512(x, m63);
		q[4 * half + 1] = _mm512_and_si512(y, m63);
		q[4 * half + 2] = _mm512_and_si512(z, m63);
		/* top 2 bits of z, y, x to bits 4-5, 2-3, 0-1 (shifting a masked z
		 * brings no bits in from the byte above) */
		const __m512i zy = or_and(_mm512_srli_epi16(_mm512_and_si512(z, mc0), 2), _mm512_srli_epi16(y, 4), m0c);
		q[4 * half + 3] = or_and(zy, _mm512_srli_epi16(x, 6), m03);
	}
}

/* d * the scales of block blk's halves (dsc0: elements 0..15, dsc1: 16..31), one lane per row; d: the super-block's. */
INL void q6_scales(const uint8_t *o, int blk, __m512 d, __m512 *dsc0, __m512 *dsc1)
{
	*dsc0 = _mm512_mul_ps(_mm512_cvtepi32_ps(lanes_i8(o + PK_Q6_K_SC + 16 * (2 * blk))), d);
	*dsc1 = _mm512_mul_ps(_mm512_cvtepi32_ps(lanes_i8(o + PK_Q6_K_SC + 16 * (2 * blk + 1))), d);
}

/* iq4_nl's grid + 128 in every 128-bit lane (GRID), for nib_decode's lookups; else zeros. */
INL __m512i nib_grid(const bool GRID)
{
	return GRID ? _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)nx_kvalues_iq4nl)),
				      _mm512_set1_epi8((char)0x80))
		    : _mm512_setzero_si512();
}

/* The weight bytes of one group block o of a 4-bit type (kern/pack.h): lo[c]
 * lane r = elements 4c .. 4c+3 of row r, hi[c] = elements 16+4c .. 16+4c+3,
 * each an unsigned code: the nibble, looked up in grid (GRID), with the fifth
 * bits from the masks at H added (H >= 0). Nibble vectors at QS. */
INL void nib_decode(const uint8_t *o, const int H, const int QS, const bool GRID, __m512i grid, __m512i lo[4],
		    __m512i hi[4])
{
	const __m512i m4 = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
	#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		const __m512i v = _mm512_loadu_si512((const void *)(o + QS + 64 * c));
		lo[c] = _mm512_and_si512(v, m4);
		hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
		if (GRID) {
			lo[c] = _mm512_shuffle_epi8(grid, lo[c]);
			hi[c] = _mm512_shuffle_epi8(grid, hi[c]);
		}
		if (H >= 0) { /* the fifth bits: one mask bit per byte of the vector */
			uint64_t hl, hh;
			memcpy(&hl, o + H + 8 * c, 8);
			memcpy(&hh, o + H + 8 * (4 + c), 8);
			lo[c] = _mm512_mask_add_epi8(lo[c], _cvtu64_mask64(hl), lo[c], bit4);
			hi[c] = _mm512_mask_add_epi8(hi[c], _cvtu64_mask64(hh), hi[c], bit4);
		}
	}
}

/* NAME_tile for n_act tokens (1..NX_PACK_ACT_MAX), NA a compile-time constant
 * per case. The kernels' loops over tokens unroll by the same 8. */
_Static_assert(NX_PACK_ACT_MAX == 8, "TILE_CASES and the tiles' '#pragma GCC unroll 8' cover NX_PACK_ACT_MAX tokens");
#define TILE_CASES(name, LO)                                                    \
	switch (n_act) {                                                        \
	case 1: name##_tile(g, a, 1, out, n, LO); break;                        \
	case 2: name##_tile(g, a, 2, out, n, LO); break;                        \
	case 3: name##_tile(g, a, 3, out, n, LO); break;                        \
	case 4: name##_tile(g, a, 4, out, n, LO); break;                        \
	case 5: name##_tile(g, a, 5, out, n, LO); break;                        \
	case 6: name##_tile(g, a, 6, out, n, LO); break;                        \
	case 7: name##_tile(g, a, 7, out, n, LO); break;                        \
	default: name##_tile(g, a, 8, out, n, LO); break;                       \
	}

/* pk_NAME(group, act, n_act, out, n_in): NAME_tile with NA (tokens) and LO
 * (whether the lo part is dotted: not when act->lo_zero) compile-time
 * constants per case, so its accumulators live in registers. */
#define TILE_FN(name)                                                                                         \
	static TGT void pk_##name(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n) \
	{                                                                                                     \
		if (a->lo_zero)                                                                               \
			TILE_CASES(name, false)                                                               \
		else                                                                                          \
			TILE_CASES(name, true)                                                                \
	}

#endif
