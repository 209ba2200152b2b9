/* x86_avx512.c - AVX-512 (F, BW, VL, VNNI) kernels: the dot of every weight type with its
 * activation type (one or several activation rows per weight row), and the Q8_0 / Q8_K
 * activation quantizers, one- and two-part (bit-identical to the reference).
 *
 * Built without -m flags (target attributes); installed over the AVX2 set where
 * kern/cpu.c says the CPU and OS can run it. VNNI is required (kern/cpu.c's
 * table): without it (Skylake-X) the AVX2 set is as good. Integer parts of every dot are exact;
 * only the order of the float sums of block terms differs from the reference.
 *
 * 32-element blocks go two to a zmm in element order, [block i | block i+1], so one
 * activation load serves two blocks and one vpdpbusd (u8 x s8, four products per
 * int32 lane) does 64 products. vpdpbusd needs one unsigned side:
 *   unsigned levels (q4_1, q5_1): q . y directly, and 1 . y for the min term;
 *   signed levels (q4_0, q5_0, q8_0): (y + 128) . x - 128 * sum(x), where y + 128 is
 *   y ^ 0x80 and -128 * sum(x) depends on the weights only (computed once and used
 *   as the accumulator's start for every activation row).
 * The k-quants use vpmaddubsw (levels <= 63 unsigned, so pairs never saturate)
 * then vpdpwssd with the 16-bit sub-block scales.
 *
 * As in x86_avx2.c, each dot is one always-inline body over nr activation rows with
 * per-row accumulators, so dot_rows is bit-identical to dot. */
#include "kern/quant.h"

#include <float.h>
#include <immintrin.h>
#include <string.h>

#define TGT_STR "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c"
#define TGT __attribute__((target(TGT_STR)))
#define INL static inline __attribute__((always_inline, target(TGT_STR)))

#define ROWS_MAX 4
#define ROWS(r) _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++)

/* ---------------------------------------------------------------- helpers */

INL float f16(nx_f16 h)
{
	return _cvtsh_ss(h);
}

/* Two f16 (lo, hi of a 32-bit word) -> [lo x8 | hi x8]. */
INL __m512 f16_pair_x8(uint32_t two)
{
	const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128((int)two));
	return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
				     _mm512_castps128_ps512(v));
}

INL uint32_t rd16(const void *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

INL uint32_t rd32(const void *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

INL const void *act_row(const uint8_t *a, size_t as, int r)
{
	return a + (size_t)r * as;
}

/* ---------------------------------------------------------------- 32-element blocks x Q8_0 */

enum k32 { K_Q4_0, K_Q4_1, K_Q5_0, K_Q5_1, K_Q8_0, K_IQ4_NL };

static inline size_t k32_size(enum k32 k)
{
	switch (k) {
	case K_Q4_0:
		return sizeof(struct nx_block_q4_0);
	case K_Q4_1:
		return sizeof(struct nx_block_q4_1);
	case K_Q5_0:
		return sizeof(struct nx_block_q5_0);
	case K_Q5_1:
		return sizeof(struct nx_block_q5_1);
	case K_IQ4_NL:
		return sizeof(struct nx_block_iq4_nl);
	default:
		return sizeof(struct nx_block_q8_0);
	}
}

/* The iq4 grid in every 128-bit lane, for a byte lookup by nibble. */
INL __m512i iq4_grid(void)
{
	return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)nx_kvalues_iq4nl));
}

static inline bool k32_unsigned(enum k32 k)
{
	return k == K_Q4_1 || k == K_Q5_1;
}

/* Two weight blocks unpacked: levels, [d0 x8 | d1 x8], [m0 x8 | m1 x8] (unsigned
 * types; zero for signed ones), and for signed types the -128 * sum(x) start of
 * the accumulator. k32_unpack fills q and start, k32_scales2/4 d and m. */
struct wpair {
	__m512i q, start;
	__m512 d, m;
};

/* 16 bytes of nibbles of b0 and b1 -> [b0 lo | b0 hi | b1 lo | b1 hi] = element order. */
INL __m512i nibbles_pair(const uint8_t *qs0, const uint8_t *qs1)
{
	const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs0));
	const __m256i b = qs1 ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs1))
			      : _mm256_setzero_si256();
	const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
	return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)),
				_mm512_set1_epi8(0x0f));
}

/* b1 == NULL: one block (the upper half is zero weight). */
INL struct wpair k32_unpack(enum k32 k, const uint8_t *b0, const uint8_t *b1)
{
	struct wpair w;
	uint64_t hmask;
	switch (k) {
	case K_IQ4_NL: { /* the upper half of a lone block looks up grid[0]; its d and y are 0 */
		const struct nx_block_iq4_nl *x0 = (const void *)b0, *x1 = (const void *)b1;
		w.q = _mm512_shuffle_epi8(iq4_grid(), nibbles_pair(x0->qs, b1 ? x1->qs : NULL));
		break;
	}
	case K_Q4_0:
	case K_Q4_1: {
		const struct nx_block_q4_0 *x0 = (const void *)b0, *x1 = (const void *)b1;
		const struct nx_block_q4_1 *y0 = (const void *)b0, *y1 = (const void *)b1;
		w.q = k == K_Q4_0 ? nibbles_pair(x0->qs, b1 ? x1->qs : NULL) : nibbles_pair(y0->qs, b1 ? y1->qs : NULL);
		break;
	}
	case K_Q5_0: {
		const struct nx_block_q5_0 *x0 = (const void *)b0, *x1 = (const void *)b1;
		w.q = nibbles_pair(x0->qs, b1 ? x1->qs : NULL);
		hmask = rd32(x0->qh) | (b1 ? (uint64_t)rd32(x1->qh) << 32 : 0);
		w.q = _mm512_mask_add_epi8(w.q, _cvtu64_mask64(hmask), w.q, _mm512_set1_epi8(0x10));
		break;
	}
	case K_Q5_1: {
		const struct nx_block_q5_1 *x0 = (const void *)b0, *x1 = (const void *)b1;
		w.q = nibbles_pair(x0->qs, b1 ? x1->qs : NULL);
		hmask = rd32(x0->qh) | (b1 ? (uint64_t)rd32(x1->qh) << 32 : 0);
		w.q = _mm512_mask_add_epi8(w.q, _cvtu64_mask64(hmask), w.q, _mm512_set1_epi8(0x10));
		break;
	}
	default: {
		const struct nx_block_q8_0 *x0 = (const void *)b0, *x1 = (const void *)b1;
		const __m256i lo = _mm256_loadu_si256((const __m256i *)x0->qs);
		const __m256i hi = b1 ? _mm256_loadu_si256((const __m256i *)x1->qs) : _mm256_setzero_si256();
		w.q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
		break;
	}
	}
	if (k == K_Q4_0)
		w.q = _mm512_sub_epi8(w.q, _mm512_set1_epi8(8));
	if (k == K_Q5_0)
		w.q = _mm512_sub_epi8(w.q, _mm512_set1_epi8(16));

	w.start = _mm512_setzero_si512();
	if (!k32_unsigned(k)) /* -128 * sum(x) per int32 lane: the correction for using y + 128 */
		w.start = _mm512_sub_epi32(_mm512_setzero_si512(),
					   _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), w.q));
	return w;
}

/* vpermps indices [j x8 | k x8]. */
INL __m512i idx_x8(int j, int k)
{
	return _mm512_set_epi32(k, k, k, k, k, k, k, k, j, j, j, j, j, j, j, j);
}

/* Scales of a pair (b1 NULL: one block) through one f16 conversion. */
INL void k32_scales2(enum k32 k, struct wpair *w, const uint8_t *b0, const uint8_t *b1)
{
	if (k32_unsigned(k)) {
		/* d and m are adjacent: [d0 m0 d1 m1] */
		__m128i h = _mm_cvtsi32_si128((int)rd32(b0));
		if (b1)
			h = _mm_insert_epi32(h, (int)rd32(b1), 1);
		const __m512 v = _mm512_castps128_ps512(_mm_cvtph_ps(h));
		w->d = _mm512_permutexvar_ps(idx_x8(0, 2), v);
		w->m = _mm512_permutexvar_ps(idx_x8(1, 3), v);
	} else {
		w->d = f16_pair_x8(rd16(b0) | (b1 ? rd16(b1) << 16 : 0));
		w->m = _mm512_setzero_ps();
	}
}

/* Scales of two pairs (four blocks at b, b + bs, ...) through one f16 conversion. */
INL void k32_scales4(enum k32 k, struct wpair *wa, struct wpair *wb, const uint8_t *b, size_t bs)
{
	if (k32_unsigned(k)) {
		__m128i h = _mm_cvtsi32_si128((int)rd32(b));
		h = _mm_insert_epi32(h, (int)rd32(b + bs), 1);
		h = _mm_insert_epi32(h, (int)rd32(b + 2 * bs), 2);
		h = _mm_insert_epi32(h, (int)rd32(b + 3 * bs), 3);
		const __m512 v = _mm512_castps256_ps512(_mm256_cvtph_ps(h)); /* d0 m0 d1 m1 d2 m2 d3 m3 */
		wa->d = _mm512_permutexvar_ps(idx_x8(0, 2), v);
		wa->m = _mm512_permutexvar_ps(idx_x8(1, 3), v);
		wb->d = _mm512_permutexvar_ps(idx_x8(4, 6), v);
		wb->m = _mm512_permutexvar_ps(idx_x8(5, 7), v);
	} else {
		__m128i h = _mm_cvtsi32_si128((int)rd16(b));
		h = _mm_insert_epi16(h, (int)rd16(b + bs), 1);
		h = _mm_insert_epi16(h, (int)rd16(b + 2 * bs), 2);
		h = _mm_insert_epi16(h, (int)rd16(b + 3 * bs), 3);
		const __m512 v = _mm512_castps128_ps512(_mm_cvtph_ps(h));
		wa->d = _mm512_permutexvar_ps(idx_x8(0, 1), v);
		wb->d = _mm512_permutexvar_ps(idx_x8(2, 3), v);
		wa->m = wb->m = _mm512_setzero_ps();
	}
}

/* Activation scales of four blocks: [dy0 x8 | dy1 x8], [dy2 x8 | dy3 x8]. */
INL void act_scales4(const struct nx_block_q8_0 *y, __m512 *dya, __m512 *dyb)
{
	__m128i h = _mm_cvtsi32_si128((int)rd16(&y[0].d));
	h = _mm_insert_epi16(h, (int)rd16(&y[1].d), 1);
	h = _mm_insert_epi16(h, (int)rd16(&y[2].d), 2);
	h = _mm_insert_epi16(h, (int)rd16(&y[3].d), 3);
	const __m512 v = _mm512_castps128_ps512(_mm_cvtph_ps(h));
	*dya = _mm512_permutexvar_ps(idx_x8(0, 1), v);
	*dyb = _mm512_permutexvar_ps(idx_x8(2, 3), v);
}

/* Terms of a block pair against activation blocks y0, y1 (y1 NULL: one block),
 * before the activation scales. */
INL __m512 k32_term(enum k32 k, const struct wpair *w, const struct nx_block_q8_0 *y0,
		    const struct nx_block_q8_0 *y1)
{
	const __m256i lo = _mm256_loadu_si256((const __m256i *)y0->qs);
	const __m256i hi = y1 ? _mm256_loadu_si256((const __m256i *)y1->qs) : _mm256_setzero_si256();
	const __m512i yq = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
	if (k32_unsigned(k)) {
		const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w->q, yq);
		const __m512i ys = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), yq);
		return _mm512_fmadd_ps(_mm512_cvtepi32_ps(ys), w->m, _mm512_mul_ps(_mm512_cvtepi32_ps(s), w->d));
	}
	const __m512i yu = _mm512_xor_si512(yq, _mm512_set1_epi8((char)0x80));
	const __m512i s = _mm512_dpbusd_epi32(w->start, yu, w->q);
	return _mm512_mul_ps(_mm512_cvtepi32_ps(s), w->d);
}

/* Four blocks per step (two pairs, summed apart from the accumulator), then a pair, then one. */
INL void k32_k(enum k32 k, const void *w, const uint8_t *a, size_t as, int nr, int64_t nb, float *out)
{
	const uint8_t *x = w;
	const size_t bs = k32_size(k);
	__m512 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm512_setzero_ps();
	int64_t i = 0;
	for (; i + 4 <= nb; i += 4) {
		const uint8_t *xb = x + (size_t)i * bs;
		struct wpair wa = k32_unpack(k, xb, xb + bs);
		struct wpair wb = k32_unpack(k, xb + 2 * bs, xb + 3 * bs);
		k32_scales4(k, &wa, &wb, xb, bs);
		ROWS(r)
		{
			const struct nx_block_q8_0 *y = (const struct nx_block_q8_0 *)act_row(a, as, r) + i;
			__m512 dya, dyb;
			act_scales4(y, &dya, &dyb);
			const __m512 ta = k32_term(k, &wa, &y[0], &y[1]);
			const __m512 tb = k32_term(k, &wb, &y[2], &y[3]);
			acc[r] = _mm512_add_ps(acc[r], _mm512_fmadd_ps(tb, dyb, _mm512_mul_ps(ta, dya)));
		}
	}
	if (i + 2 <= nb) {
		const uint8_t *xb = x + (size_t)i * bs;
		struct wpair wa = k32_unpack(k, xb, xb + bs);
		k32_scales2(k, &wa, xb, xb + bs);
		ROWS(r)
		{
			const struct nx_block_q8_0 *y = (const struct nx_block_q8_0 *)act_row(a, as, r) + i;
			const __m512 dya = f16_pair_x8(rd16(&y[0].d) | rd16(&y[1].d) << 16);
			acc[r] = _mm512_fmadd_ps(k32_term(k, &wa, &y[0], &y[1]), dya, acc[r]);
		}
		i += 2;
	}
	if (i < nb) {
		struct wpair wa = k32_unpack(k, x + (size_t)i * bs, NULL);
		k32_scales2(k, &wa, x + (size_t)i * bs, NULL);
		ROWS(r)
		{
			const struct nx_block_q8_0 *y = (const struct nx_block_q8_0 *)act_row(a, as, r) + i;
			const __m512 dya = f16_pair_x8(rd16(&y[0].d));
			acc[r] = _mm512_fmadd_ps(k32_term(k, &wa, &y[0], NULL), dya, acc[r]);
		}
	}
	ROWS(r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

INL void q4_0_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k32_k(K_Q4_0, w, a, as, nr, n / QK4_0, out);
}
INL void q4_1_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k32_k(K_Q4_1, w, a, as, nr, n / QK4_1, out);
}
INL void q5_0_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k32_k(K_Q5_0, w, a, as, nr, n / QK5_0, out);
}
INL void q5_1_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k32_k(K_Q5_1, w, a, as, nr, n / QK5_1, out);
}
INL void q8_0_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k32_k(K_Q8_0, w, a, as, nr, n / QK8_0, out);
}
INL void iq4_nl_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k32_k(K_IQ4_NL, w, a, as, nr, n / QK4_NL, out);
}

/* ---------------------------------------------------------------- k-quants x Q8_K */

/* Q4_K/Q5_K scales: 12 packed bytes -> bytes 0..7 the 8 scales, 8..15 the 8 mins. */
INL __m128i k4_unpack_scales(const uint8_t *q)
{
	uint32_t u[4];
	memcpy(u, q, 12);
	const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
	u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4); /* mins 4..7 */
	const uint32_t mins_lo = u[1] & m1;                     /* mins 0..3 */
	u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);         /* scales 4..7 */
	u[2] = mins_lo;
	u[0] &= m1; /* scales 0..3 */
	return _mm_loadu_si128((const __m128i *)u);
}

/* vpermw indices [j x16 | j+1 x16]: the scales of sub-blocks j (elements 0..31) and j+1. */
INL __m512i idx_pair16(int j)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)j)), _mm256_set1_epi16((short)(j + 1)),
				  1);
}

/* Q4_K and Q5_K. 64 elements per zmm: the 32 bytes of qs for sub-blocks 2c (low
 * nibbles) and 2c+1 (high), broadcast to both halves and shifted per half. */
INL void k45_k(bool five, const void *w, const uint8_t *a, size_t as, int nr, int64_t nb, float *out)
{
	const size_t bs = five ? sizeof(struct nx_block_q5_k) : sizeof(struct nx_block_q4_k);
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512i sh = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
	__m512 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm512_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *blk = (const uint8_t *)w + (size_t)i * bs;
		const struct nx_block_q4_k *x4 = (const void *)blk;
		const struct nx_block_q5_k *x5 = (const void *)blk;
		const uint8_t *qs = five ? x5->qs : x4->qs;
		const __m128i sm = k4_unpack_scales(x4->scales);
		const __m512i sm16 = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(sm)); /* sc0..7, m0..7 */
		/* [m0 m0 m1 m1 ... m7 m7]: each min against the two 16-sums of its sub-block */
		const __m256i mins = _mm256_cvtepu8_epi16(
			_mm_shuffle_epi8(sm, _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8)));
		const __m512i hb = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x5->qh))
					: _mm512_setzero_si512();
		const float d = f16(x4->d), dmin = f16(x4->dmin); /* same offsets in both layouts */
		__m512i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
		for (int c = 0; c < QK_K / 64; c++) {
			const __m512i qb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * c)));
			__m512i q = _mm512_and_si512(_mm512_srlv_epi64(qb, sh), m4);
			if (five) {
				const __m512i bit = _mm512_inserti64x4(
					_mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << (2 * c)))),
					_mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
				q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hb, bit), q, _mm512_set1_epi8(0x10));
			}
			const __m512i sc = _mm512_permutexvar_epi16(idx_pair16(2 * c), sm16);
			ROWS(r)
			{
				const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
				const __m512i yq = _mm512_loadu_si512((const void *)(y->qs + 64 * c));
				sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(q, yq), sc);
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins);
			acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * y->d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
			acc[r] = _mm512_fnmadd_ps(_mm512_set1_ps(dmin * y->d),
						  _mm512_cvtepi32_ps(_mm512_zextsi256_si512(msum)), acc[r]);
		}
	}
	ROWS(r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

INL void q4_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k45_k(false, w, a, as, nr, n / QK_K, out);
}
INL void q5_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k45_k(true, w, a, as, nr, n / QK_K, out);
}

/* Q6_K, 64 elements per zmm: in each 128-half, ql's 64 bytes hold elements 0..63
 * in their low nibbles and 64..127 in their high ones; qh's 32 bytes give bits
 * 4..5 (2 bits per 32-group, broadcast and shifted per half). Levels 0..63 are
 * dotted unsigned; the -32 offset comes once per block from the activation's
 * 16-group sums, which match the scale groups. */
INL void q6_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	const struct nx_block_q6_k *x = w;
	const int64_t nb = n / QK_K;
	const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
	const __m512i shl = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), shr = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
	/* vpermw indices: group g of 4 consecutive 16-groups, 8 int16 each */
	__m512i gidx[4];
	for (int j = 0; j < 4; j++)
		gidx[j] = _mm512_add_epi16(_mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
							    0x0002000200020002, 0x0001000100010001, 0x0001000100010001,
							    0, 0),
					   _mm512_set1_epi16((short)(4 * j)));
	__m512 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm512_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
		const __m512i sc16z = _mm512_castsi256_si512(sc16);
		const float d = f16(x[i].d);
		__m512i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm512_setzero_si512();
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const __m512i ql = _mm512_loadu_si512((const void *)(x[i].ql + 64 * h));
			const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h)));
			/* elements 0..63 of the half: bits 0..1 (32-group 0), 2..3 (group 1) of qh */
			const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4),
							    _mm512_and_si512(_mm512_sllv_epi64(qh, shl), m30));
			/* elements 64..127: bits 4..5, 6..7 */
			const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
							    _mm512_and_si512(_mm512_srlv_epi64(qh, shr), m30));
			const __m512i s01 = _mm512_permutexvar_epi16(gidx[2 * h], sc16z);
			const __m512i s23 = _mm512_permutexvar_epi16(gidx[2 * h + 1], sc16z);
			ROWS(r)
			{
				const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
				const __m512i y01 = _mm512_loadu_si512((const void *)(y->qs + 128 * h));
				const __m512i y23 = _mm512_loadu_si512((const void *)(y->qs + 128 * h + 64));
				sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(q01, y01), s01);
				sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(q23, y23), s23);
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
			const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5); /* 32 * sc . bsums */
			const __m512i s = _mm512_sub_epi32(sumi[r], _mm512_zextsi256_si512(off));
			acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * y->d), _mm512_cvtepi32_ps(s), acc[r]);
		}
	}
	ROWS(r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* vpermw indices for 4 consecutive 16-groups from group 4j: 8 int16 each. */
INL __m512i group4_idx(int j)
{
	return _mm512_add_epi16(_mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
						 0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0),
				_mm512_set1_epi16((short)(4 * j)));
}

/* Q3_K's 16 six-bit scales (12 packed bytes) as 16 int8, each minus 32: group g's
 * low 4 bits are nibble g / 8 of byte g % 8, its high 2 bits at bit 2 (g / 4)
 * of byte 8 + g % 4. */
INL __m128i q3_k_scales(const uint8_t *q)
{
	const __m128i m4 = _mm_set1_epi8(0x0f);
	const __m128i b8 = _mm_loadl_epi64((const __m128i *)q);
	const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(b8, m4), _mm_and_si128(_mm_srli_epi16(b8, 4), m4));
	uint32_t h;
	memcpy(&h, q + 8, 4);
	/* 32-bit lane k = bytes 4k..4k+3 = groups 4k..4k+3: h >> 2k, 2 bits per byte */
	const __m128i hs = _mm_srlv_epi32(_mm_set1_epi32((int)h), _mm_set_epi32(6, 4, 2, 0));
	const __m128i hi = _mm_slli_epi16(_mm_and_si128(hs, _mm_set1_epi8(3)), 4);
	return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}

/* Q2_K and Q3_K, 64 elements per zmm: a 128-half's 32 bytes of qs, broadcast to
 * both halves and shifted per half, give elements 0..63 (bits 0..3) and 64..127
 * (bits 4..7); q3_k adds 4 where its hmask bit is set. Levels are dotted
 * unsigned; q2_k's min term and q3_k's -4 offset come once per block from the
 * activation's 16-group sums. */
INL void k23_k(bool three, const void *w, const uint8_t *a, size_t as, int nr, int64_t nb, float *out)
{
	const size_t bs = three ? sizeof(struct nx_block_q3_k) : sizeof(struct nx_block_q2_k);
	const __m512i m3 = _mm512_set1_epi8(3);
	const __m512i sh01 = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0), sh23 = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
	__m512i gidx[4];
	for (int j = 0; j < 4; j++)
		gidx[j] = group4_idx(j);
	__m512 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm512_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *blk = (const uint8_t *)w + (size_t)i * bs;
		const struct nx_block_q2_k *x2 = (const void *)blk;
		const struct nx_block_q3_k *x3 = (const void *)blk;
		const uint8_t *qs = three ? x3->qs : x2->qs;
		__m128i sc8;
		__m256i mins = _mm256_setzero_si256();
		__m512i hm = _mm512_setzero_si512();
		if (three) {
			sc8 = q3_k_scales(x3->scales);
			hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x3->hmask));
		} else {
			const __m128i raw = _mm_loadu_si128((const __m128i *)x2->scales);
			sc8 = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
			mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f)));
		}
		const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
		const __m512i sc16z = _mm512_castsi256_si512(sc16);
		const float d = f16(three ? x3->d : x2->d);
		__m512i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm512_setzero_si512();
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const __m512i qb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
			__m512i q01 = _mm512_and_si512(_mm512_srlv_epi64(qb, sh01), m3);
			__m512i q23 = _mm512_and_si512(_mm512_srlv_epi64(qb, sh23), m3);
			if (three) { /* element 128h + 32j + l: bit 4h + j of hmask[l] */
				const __m512i four = _mm512_set1_epi8(4);
				const __m512i b01 = _mm512_inserti64x4(
					_mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << (4 * h)))),
					_mm256_set1_epi8((char)(1 << (4 * h + 1))), 1);
				const __m512i b23 = _mm512_inserti64x4(
					_mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << (4 * h + 2)))),
					_mm256_set1_epi8((char)(1 << (4 * h + 3))), 1);
				q01 = _mm512_mask_add_epi8(q01, _mm512_test_epi8_mask(hm, b01), q01, four);
				q23 = _mm512_mask_add_epi8(q23, _mm512_test_epi8_mask(hm, b23), q23, four);
			}
			const __m512i s01 = _mm512_permutexvar_epi16(gidx[2 * h], sc16z);
			const __m512i s23 = _mm512_permutexvar_epi16(gidx[2 * h + 1], sc16z);
			ROWS(r)
			{
				const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
				const __m512i y01 = _mm512_loadu_si512((const void *)(y->qs + 128 * h));
				const __m512i y23 = _mm512_loadu_si512((const void *)(y->qs + 128 * h + 64));
				sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(q01, y01), s01);
				sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(q23, y23), s23);
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
			if (three) {
				const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 2); /* 4 * sc . bsums */
				const __m512i s = _mm512_sub_epi32(sumi[r], _mm512_zextsi256_si512(off));
				acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * y->d), _mm512_cvtepi32_ps(s), acc[r]);
			} else {
				const __m256i msum = _mm256_madd_epi16(mins, bsums);
				acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * y->d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
				acc[r] = _mm512_fnmadd_ps(_mm512_set1_ps(f16(x2->dmin) * y->d),
							  _mm512_cvtepi32_ps(_mm512_zextsi256_si512(msum)), acc[r]);
			}
		}
	}
	ROWS(r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

INL void q2_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k23_k(false, w, a, as, nr, n / QK_K, out);
}
INL void q3_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k23_k(true, w, a, as, nr, n / QK_K, out);
}

/* IQ4_XS, two 32-groups per zmm (their 32 bytes of qs in element order): grid
 * values looked up from the nibbles, dotted as |q| (unsigned) with y negated
 * where q < 0 (vpmaddubsw; |q| <= 127 and |y| <= 127, so pairs never saturate),
 * then vpdpwssd with each group's ls - 32. */
INL void iq4_xs_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	const struct nx_block_iq4_xs *x = w;
	const int64_t nb = n / QK_K;
	const __m512i grid = iq4_grid();
	__m512 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm512_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const float d = f16(x[i].d);
		__m512i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
		for (int c = 0; c < QK_K / 64; c++) {
			const int ls0 = ((x[i].scales_l[c] & 0x0f) | (((x[i].scales_h >> (4 * c)) & 3) << 4)) - 32;
			const int ls1 = ((x[i].scales_l[c] >> 4) | (((x[i].scales_h >> (4 * c + 2)) & 3) << 4)) - 32;
			const __m512i q = _mm512_shuffle_epi8(grid, nibbles_pair(x[i].qs + 32 * c, x[i].qs + 32 * c + 16));
			const __m512i aq = _mm512_abs_epi8(q);
			const __mmask64 neg = _mm512_movepi8_mask(q);
			const __m512i sc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)ls0)),
							      _mm256_set1_epi16((short)ls1), 1);
			ROWS(r)
			{
				const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
				const __m512i yq = _mm512_loadu_si512((const void *)(y->qs + 64 * c));
				const __m512i ys = _mm512_mask_sub_epi8(yq, neg, _mm512_setzero_si512(), yq);
				sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(aq, ys), sc);
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * y->d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
		}
	}
	ROWS(r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* ---------------------------------------------------------------- f32 / f16 / bf16 x F32 */

enum kf { K_F32, K_F16, K_BF16 };

/* 16 weights at element i as floats; the first `valid` only (mask), zeros after. */
INL __m512 kf_load(enum kf k, const void *w, int64_t i, __mmask16 valid)
{
	switch (k) {
	case K_F32:
		return _mm512_maskz_loadu_ps(valid, (const float *)w + i);
	case K_F16:
		return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, (const nx_f16 *)w + i));
	default:
		return _mm512_castsi512_ps(
			_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(valid, (const nx_bf16 *)w + i)), 16));
	}
}

/* 32 elements per step in two accumulators; the tail through masked loads. */
INL void kf_k(enum kf k, const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	__m512 acc0[ROWS_MAX], acc1[ROWS_MAX];
	ROWS(r) acc0[r] = acc1[r] = _mm512_setzero_ps();
	int64_t i = 0;
	for (; i + 32 <= n; i += 32) {
		const __m512 w0 = kf_load(k, w, i, 0xffff), w1 = kf_load(k, w, i + 16, 0xffff);
		ROWS(r)
		{
			const float *y = (const float *)act_row(a, as, r) + i;
			acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(y), acc0[r]);
			acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(y + 16), acc1[r]);
		}
	}
	if (i + 16 <= n) {
		const __m512 w0 = kf_load(k, w, i, 0xffff);
		ROWS(r) acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps((const float *)act_row(a, as, r) + i), acc0[r]);
		i += 16;
	}
	if (i < n) {
		const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
		const __m512 w0 = kf_load(k, w, i, m);
		ROWS(r)
		acc1[r] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, (const float *)act_row(a, as, r) + i), acc1[r]);
	}
	ROWS(r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

/* ---------------------------------------------------------------- activation quantizers */

/* roundf (ties away from zero): x - trunc(x) is exact, so the test is too. */
INL __m512 round_away(__m512 x)
{
	const __m512 t = _mm512_roundscale_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
	const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(x, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
	const __m512 one = _mm512_or_ps(_mm512_and_ps(x, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
	return _mm512_mask_add_ps(t, up, t, one);
}

/* Float -> int conversion with the reference's (x86) result for values out of
 * int range (inf, nan when 1/d overflowed): the indefinite integer, whose low
 * byte the reference stores, i.e. 0. */
INL __m512i fix_indefinite(__m512i q)
{
	return _mm512_maskz_mov_epi32(_mm512_cmpneq_epi32_mask(q, _mm512_set1_epi32(INT32_MIN)), q);
}

/* The compiler may not fuse what it is given through this into a multiply-add:
 * the two-part quantizers must round x - d * q as the reference does. */
INL __m512 opaque(__m512 v)
{
	__asm__("" : "+v"(v));
	return v;
}

/* float -> IEEE half, round to nearest even: F16C does exactly what nx_f32_to_f16 does (NaNs included). */
static TGT void quant_f16(const float *src, void *dst, int64_t n)
{
	nx_f16 *h = dst;
	for (int64_t i = 0; i < n; i += 16) {
		const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		_mm256_mask_storeu_epi16(h + i, m,
					 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
							 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	}
}

/* As the reference: d = amax / 127 (stored f16), q = roundf(x / d) using id = 1/d. */
static TGT void quant_q8_0(const float *src, void *dst, int64_t n)
{
	struct nx_block_q8_0 *b = dst;
	for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
		const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);
		const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
		const float d = amax / 127;
		const float id = d ? 1.0f / d : 0.0f;
		b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
		const __m512 idv = _mm512_set1_ps(id);
		const __m512i q0 = fix_indefinite(_mm512_cvttps_epi32(round_away(_mm512_mul_ps(v0, idv))));
		const __m512i q1 = fix_indefinite(_mm512_cvttps_epi32(round_away(_mm512_mul_ps(v1, idv))));
		_mm_storeu_si128((__m128i *)b[i].qs, _mm512_cvtsepi32_epi8(q0));
		_mm_storeu_si128((__m128i *)(b[i].qs + 16), _mm512_cvtsepi32_epi8(q1));
	}
}

/* Two-part Q8_0, 16 blocks at a time: the per-block scalar steps (the largest
 * magnitude, d, 1/d, the f16 rounding) are done for 16 blocks in one vector,
 * so no block waits on its own horizontal reduction and divisions. */

/* Where block b's vector goes among max16's inputs: lane b of the result is its largest lane. */
#define MSLOT(b) (4 * ((b) % 4) + (b) / 4)

/* Lane i of the result = the largest lane of m[MSLOT(i)]: a 16 x 16 transpose
 * and max in four levels of pairwise shuffles (lane 4k + s ends up with m[4s + k]). */
INL __m512 max16(const __m512 *m)
{
	__m512 c[8], e[4], g[2];
	for (int j = 0; j < 8; j++) /* 256-bit halves */
		c[j] = _mm512_max_ps(_mm512_shuffle_f32x4(m[2 * j], m[2 * j + 1], 0x44),
				     _mm512_shuffle_f32x4(m[2 * j], m[2 * j + 1], 0xee));
	for (int j = 0; j < 4; j++) /* 128-bit quarters */
		e[j] = _mm512_max_ps(_mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0x88),
				     _mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0xdd));
	for (int j = 0; j < 2; j++) /* pairs within quarters */
		g[j] = _mm512_max_ps(_mm512_shuffle_ps(e[2 * j], e[2 * j + 1], 0x44),
				     _mm512_shuffle_ps(e[2 * j], e[2 * j + 1], 0xee));
	return _mm512_max_ps(_mm512_shuffle_ps(g[0], g[1], 0x88), _mm512_shuffle_ps(g[0], g[1], 0xdd));
}

INL __m512 absmax2(__m512 v0, __m512 v1)
{
	return _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
}

/* The scales of 16 blocks, as the reference: d to f16 (d16), that f16 as a
 * float (dh), id = 1/d, or 0 where 1/d is not finite (d = 0 or subnormal). */
INL void q8_0_scales(__m512 d, uint16_t *d16, float *dh, float *id)
{
	const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), d);
	const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(inv), _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ);
	_mm512_storeu_ps(id, _mm512_maskz_mov_ps(finite, inv));
	const __m256i h = _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
	_mm256_storeu_si256((__m256i *)d16, h);
	_mm512_storeu_ps(dh, _mm512_cvtph_ps(h));
}

/* One block's 32 levels roundf(x * id), stored at qs; q0, q1 get them as int32.
 * roundf(y) = trunc(y + copysign(0.5 - 2^-25, y)) for every float |y| < 256
 * (checked over all of them; here |y| <= 127 and a bit). A NaN y (inf * 0,
 * only for an infinite x) converts to INT32_MIN, saturates to -128, and is
 * stored as 0, as in the reference; finite input never gives -128. */
INL void q8_0_levels(__m512 v0, __m512 v1, __m512 idv, int8_t *qs, __m512i *q0, __m512i *q1)
{
	const __m512 sign = _mm512_set1_ps(-0.0f), half = _mm512_set1_ps(0x1.fffffep-2f);
	const __m512 y0 = opaque(_mm512_mul_ps(v0, idv)), y1 = opaque(_mm512_mul_ps(v1, idv));
	*q0 = _mm512_cvttps_epi32(_mm512_add_ps(y0, _mm512_or_ps(_mm512_and_ps(y0, sign), half)));
	*q1 = _mm512_cvttps_epi32(_mm512_add_ps(y1, _mm512_or_ps(_mm512_and_ps(y1, sign), half)));
	__m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(*q0)),
					    _mm512_cvtsepi32_epi8(*q1), 1);
	b = _mm256_maskz_mov_epi8(_mm256_cmpneq_epi8_mask(b, _mm256_set1_epi8(-128)), b);
	_mm256_storeu_si256((__m256i *)qs, b);
}

static TGT void quant2_q8_0(const float *src, void *hi, void *lo, int64_t n)
{
	struct nx_block_q8_0 *h = hi, *l = lo;
	const int64_t nb = n / QK8_0;
	uint16_t d16[16];
	float dh[16], id[16];
	for (int64_t b0 = 0; b0 < nb; b0 += 16, src += 16 * QK8_0) {
		const int k = nb - b0 < 16 ? (int)(nb - b0) : 16;
		__m512 m[16];
		for (int b = 0; b < 16; b++)
			m[b] = _mm512_setzero_ps();
		for (int b = 0; b < k; b++)
			m[MSLOT(b)] = absmax2(_mm512_loadu_ps(src + 32 * b), _mm512_loadu_ps(src + 32 * b + 16));
		/* hi's scale: d = amax / 127, or below 2^-7 d rounded up to a multiple of 2^-17 */
		__m512 d = _mm512_div_ps(max16(m), _mm512_set1_ps(127.0f));
		const __mmask16 small = _mm512_cmp_ps_mask(d, _mm512_set1_ps(0x1p-7f), _CMP_LT_OQ);
		const __m512 up = _mm512_roundscale_ps(_mm512_mul_ps(d, _mm512_set1_ps(0x1p17f)), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
		d = _mm512_mask_mul_ps(d, small, up, _mm512_set1_ps(0x1p-17f));
		q8_0_scales(d, d16, dh, id);
		/* lo's: hi's / 128, or 0 (a zero block) where hi's overflowed to inf */
		const __m512 dhv = _mm512_loadu_ps(dh);
		const __mmask16 ok = _mm512_cmp_ps_mask(dhv, _mm512_set1_ps(65504.0f), _CMP_LE_OQ);
		const __m512 dl = _mm512_maskz_mul_ps(ok, dhv, _mm512_set1_ps(0x1p-7f));
		uint16_t l16[16];
		float ldh[16], lid[16];
		q8_0_scales(dl, l16, ldh, lid);
		for (int b = 0; b < k; b++) {
			const __m512 v0 = _mm512_loadu_ps(src + 32 * b), v1 = _mm512_loadu_ps(src + 32 * b + 16);
			__m512i q0, q1;
			q8_0_levels(v0, v1, _mm512_set1_ps(id[b]), h[b0 + b].qs, &q0, &q1);
			memcpy(&h[b0 + b].d, &d16[b], 2);
			if (!l)
				continue;
			/* q * dh is exact (8-bit q, 11-bit dh): fused or not, this is x - dequant(hi) */
			const __m512 dv = _mm512_set1_ps(dh[b]);
			const __m512 r0 = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(q0), dv, v0);
			const __m512 r1 = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(q1), dv, v1);
			q8_0_levels(r0, r1, _mm512_set1_ps(lid[b]), l[b0 + b].qs, &q0, &q1);
			memcpy(&l[b0 + b].d, &l16[b], 2);
		}
	}
}

/* One Q8_K block from src[0..256), as the reference: max = the first value of
 * largest magnitude, iscale = -127/max, q = min(127, round-to-even(iscale * x)),
 * d = 1/iscale, bsums over 16-groups. */
INL void q8_k_block(const float *src, struct nx_block_q8_k *b)
{
	__m512 m = _mm512_setzero_ps();
	for (int j = 0; j < QK_K; j += 16)
		m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(src + j)));
	const float amax = _mm512_reduce_max_ps(m);
	if (!amax) {
		memset(b, 0, sizeof(*b));
		return;
	}
	const __m512 amv = _mm512_set1_ps(amax);
	int first = 0;
	for (int j = 0; j < QK_K; j += 16) {
		const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(src + j)), amv, _CMP_EQ_OQ);
		if (eq) {
			first = j + __builtin_ctz((unsigned)eq);
			break;
		}
	}
	const float iscale = -127.f / src[first];
	const __m512 isv = _mm512_set1_ps(iscale);
	for (int g = 0; g < QK_K / 16; g++) {
		__m512i q = fix_indefinite(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + 16 * g), isv)));
		q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
		_mm_storeu_si128((__m128i *)(b->qs + 16 * g), _mm512_cvtsepi32_epi8(q));
		b->bsums[g] = (int16_t)_mm512_reduce_add_epi32(q);
	}
	b->d = 1 / iscale;
}

static TGT void quant_q8_k(const float *src, void *dst, int64_t n)
{
	struct nx_block_q8_k *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K)
		q8_k_block(src, &b[i]);
}

/* x - d * q (d a float: the product is rounded, then subtracted, as in the reference). */
static TGT void quant2_q8_k(const float *src, void *hi, void *lo, int64_t n)
{
	struct nx_block_q8_k *h = hi, *l = lo;
	float r[QK_K];
	for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
		q8_k_block(src, &h[i]);
		if (!l)
			continue;
		const __m512 dv = _mm512_set1_ps(h[i].d);
		for (int j = 0; j < QK_K; j += 16) {
			const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(h[i].qs + j))));
			_mm512_storeu_ps(r + j, _mm512_sub_ps(_mm512_loadu_ps(src + j), opaque(_mm512_mul_ps(dv, q))));
		}
		q8_k_block(r, &l[i]);
	}
}

/* ---------------------------------------------------------------- the set */

#include "kern/x86_dot_table.h"

void nx_kern_avx512_install(struct nx_type_traits *tab, size_t n)
{
	install_set(tab, n);
}
