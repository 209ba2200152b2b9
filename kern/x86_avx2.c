/* x86_avx2.c - AVX2/FMA/F16C kernels: the dot of every weight type with its activation
 * type (one or several activation rows per weight row), and the Q8_0 / Q8_K activation
 * quantizers, one- and two-part (bit-identical to the reference).
 *
 * Built without -m flags: every function carries target("avx2,fma,f16c"), and the
 * dispatcher installs the set only where kern/cpu.c says the CPU and OS can run
 * it. Integer parts of every dot are exact (the same integers the reference
 * sums); only the order of the float sums of block terms differs.
 *
 * Each dot is one always-inline body `<type>_k(w, a, a_stride, nr, nb, out)` over
 * nr activation rows (nr a compile-time constant, 1..ROWS_MAX): the weight block is
 * unpacked once and dotted with each row, every row in its own accumulators with
 * the same operations in the same order, so dot_rows gives exactly what dot gives.
 *
 * maddubs (u8 x s8 pairs summed into int16) never saturates here: the unsigned side
 * is at most 63 (q6_k), or 128 against activations in -127..127 (|x| via the sign
 * trick), so a pair is at most 2 * 128 * 127 = 32512. Activations come from the
 * Q8_0 / Q8_K quantizers, which never produce -128 (the sign trick needs that). */
#include "kern/quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* Activation rows per pass of dot_rows; each keeps one or two ymm accumulators. */
#define ROWS_MAX 4
#define ROWS(r) _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++)

/* ---------------------------------------------------------------- helpers */

INL float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

INL float f16(nx_f16 h)
{
	return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 bytes 0..15: low nibbles (elements 0..15), then high (16..31). */
INL __m256i nibbles32(const uint8_t *qs)
{
	const __m128i t = _mm_loadu_si128((const __m128i *)qs);
	const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
	return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

/* Bit j of the 32-bit word at qh -> byte j = 0x10 (bit 4 of a 5-bit level) or 0. */
INL __m256i qh_bits32(const uint8_t *qh)
{
	uint32_t h;
	memcpy(&h, qh, 4);
	const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
	__m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf); /* byte j = byte j/8 of h */
	b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)); /* all bits but bit j%8 */
	b = _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
	return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

/* Sums of 4 adjacent products of int16 pairs from maddubs: 8 int32. */
INL __m256i sum_pairs(__m256i p16)
{
	return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* x . y for signed x (any int8) and y (-127..127): |x| . (y with x's sign), 8 int32 partial sums. */
INL __m256i dot_s8(__m256i ax, __m256i x, __m256i y)
{
	return sum_pairs(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x)));
}

INL const void *act_row(const uint8_t *a, size_t as, int r)
{
	return a + (size_t)r * as;
}

/* ---------------------------------------------------------------- 32-element blocks x Q8_0 */

/* The integer part of block x[i] . y, by type: signed levels go through the sign
 * trick; q4_1 / q5_1 keep unsigned levels and also sum y for the min term.
 * iq4_nl's levels are its grid's values (-127..113), looked up from the nibbles. */
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

/* The iq4 grid in both 128-bit lanes, for a byte lookup by nibble. */
INL __m256i iq4_grid(void)
{
	return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nx_kvalues_iq4nl));
}

/* A weight block unpacked: levels (signed types: x and |x|), scale, min. */
struct wblk {
	__m256i q, aq;
	float d, m;
};

INL struct wblk k32_unpack(enum k32 k, const uint8_t *b)
{
	struct wblk w;
	w.m = 0;
	switch (k) {
	case K_Q4_0: {
		const struct nx_block_q4_0 *x = (const void *)b;
		w.q = _mm256_sub_epi8(nibbles32(x->qs), _mm256_set1_epi8(8));
		w.d = f16(x->d);
		break;
	}
	case K_Q4_1: {
		const struct nx_block_q4_1 *x = (const void *)b;
		w.q = nibbles32(x->qs);
		w.d = f16(x->d);
		w.m = f16(x->m);
		break;
	}
	case K_Q5_0: {
		const struct nx_block_q5_0 *x = (const void *)b;
		w.q = _mm256_or_si256(nibbles32(x->qs), qh_bits32(x->qh));
		w.q = _mm256_sub_epi8(w.q, _mm256_set1_epi8(16));
		w.d = f16(x->d);
		break;
	}
	case K_Q5_1: {
		const struct nx_block_q5_1 *x = (const void *)b;
		w.q = _mm256_or_si256(nibbles32(x->qs), qh_bits32(x->qh));
		w.d = f16(x->d);
		w.m = f16(x->m);
		break;
	}
	case K_IQ4_NL: {
		const struct nx_block_iq4_nl *x = (const void *)b;
		w.q = _mm256_shuffle_epi8(iq4_grid(), nibbles32(x->qs));
		w.d = f16(x->d);
		break;
	}
	default: {
		const struct nx_block_q8_0 *x = (const void *)b;
		w.q = _mm256_loadu_si256((const __m256i *)x->qs);
		w.d = f16(x->d);
		break;
	}
	}
	w.aq = (k == K_Q4_1 || k == K_Q5_1) ? w.q : _mm256_sign_epi8(w.q, w.q);
	return w;
}

/* Term of one block against activation block y, as 8 float lanes to be summed. */
INL __m256 k32_term(enum k32 k, const struct wblk *w, const struct nx_block_q8_0 *y)
{
	const __m256i yq = _mm256_loadu_si256((const __m256i *)y->qs);
	const float dy = f16(y->d);
	if (k == K_Q4_1 || k == K_Q5_1) {
		const __m256 s = _mm256_cvtepi32_ps(sum_pairs(_mm256_maddubs_epi16(w->q, yq)));
		const __m256 ys = _mm256_cvtepi32_ps(sum_pairs(_mm256_maddubs_epi16(_mm256_set1_epi8(1), yq)));
		return _mm256_fmadd_ps(ys, _mm256_set1_ps(w->m * dy), _mm256_mul_ps(s, _mm256_set1_ps(w->d * dy)));
	}
	const __m256 s = _mm256_cvtepi32_ps(dot_s8(w->aq, w->q, yq));
	return _mm256_mul_ps(s, _mm256_set1_ps(w->d * dy));
}

/* Two blocks per step: the step's terms are summed apart from the accumulator, so
 * the loop-carried chain is one add per two blocks. */
INL void k32_k(enum k32 k, const void *w, const uint8_t *a, size_t as, int nr, int64_t nb, float *out)
{
	const uint8_t *x = w;
	const size_t bs = k32_size(k);
	__m256 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm256_setzero_ps();
	int64_t i = 0;
	for (; i + 2 <= nb; i += 2) {
		const struct wblk w0 = k32_unpack(k, x + (size_t)i * bs);
		const struct wblk w1 = k32_unpack(k, x + (size_t)(i + 1) * bs);
		ROWS(r)
		{
			const struct nx_block_q8_0 *y = (const struct nx_block_q8_0 *)act_row(a, as, r) + i;
			const __m256 t = _mm256_add_ps(k32_term(k, &w0, &y[0]), k32_term(k, &w1, &y[1]));
			acc[r] = _mm256_add_ps(acc[r], t);
		}
	}
	if (i < nb) {
		const struct wblk w0 = k32_unpack(k, x + (size_t)i * bs);
		ROWS(r)
		{
			const struct nx_block_q8_0 *y = (const struct nx_block_q8_0 *)act_row(a, as, r) + i;
			acc[r] = _mm256_add_ps(acc[r], k32_term(k, &w0, y));
		}
	}
	ROWS(r) out[r] = hsum8(acc[r]);
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

/* Broadcasts int16 element k of each 128-bit lane. */
INL __m256i bcast16(__m256i v, int k)
{
	return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k))));
}

/* Q4_K and Q5_K (hi: the fifth bit from qh). Per 64 elements: 32 bytes of qs, low
 * nibbles are sub-block 2c, high nibbles 2c+1. The min term comes from bsums. */
INL void k45_k(bool five, const void *w, const uint8_t *a, size_t as, int nr, int64_t nb, float *out)
{
	const size_t bs = five ? sizeof(struct nx_block_q5_k) : sizeof(struct nx_block_q4_k);
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm256_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *blk = (const uint8_t *)w + (size_t)i * bs;
		const struct nx_block_q4_k *x4 = (const void *)blk;
		const struct nx_block_q5_k *x5 = (const void *)blk;
		const uint8_t *qs = five ? x5->qs : x4->qs;
		const __m256i sm = _mm256_cvtepu8_epi16(k4_unpack_scales(x4->scales)); /* sc0..7 | m0..7 */
		const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);
		const __m128i mins = _mm256_extracti128_si256(sm, 1);
		const __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)x5->qh) : _mm256_setzero_si256();
		const float d = f16(x4->d), dmin = f16(x4->dmin); /* same offsets in both layouts */
		__m256i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
		for (int c = 0; c < QK_K / 64; c++) {
			const __m256i qb = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
			__m256i ql = _mm256_and_si256(qb, m4);
			__m256i qhi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
			if (five) {
				const __m256i one = _mm256_set1_epi8(1);
				ql = _mm256_or_si256(ql, _mm256_slli_epi16(
								 _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), one), 4));
				qhi = _mm256_or_si256(qhi, _mm256_slli_epi16(_mm256_and_si256(
								   _mm256_srli_epi16(hbits, 2 * c + 1), one), 4));
			}
			const __m256i s1 = bcast16(scales, 2 * c), s2 = bcast16(scales, 2 * c + 1);
			ROWS(r)
			{
				const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
				const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c));
				const __m256i y2 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32));
				const __m256i p1 = _mm256_madd_epi16(s1, _mm256_maddubs_epi16(ql, y1));
				const __m256i p2 = _mm256_madd_epi16(s2, _mm256_maddubs_epi16(qhi, y2));
				sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p1, p2));
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
			const __m128i g32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
			const __m128i msum = _mm_madd_epi16(mins, g32); /* 4 int32: m_j * sum of sub-block j */
			acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
			acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * y->d),
						  _mm256_cvtepi32_ps(_mm256_zextsi128_si256(msum)), acc[r]);
		}
	}
	ROWS(r) out[r] = hsum8(acc[r]);
}

INL void q4_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k45_k(false, w, a, as, nr, n / QK_K, out);
}
INL void q5_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k45_k(true, w, a, as, nr, n / QK_K, out);
}

/* Q6_K: levels 0..63 dotted as unsigned; the -32 offset is taken once per block
 * from the activation's 16-group sums (bsums), which match the scale groups. */
INL void q6_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	const struct nx_block_q6_k *x = w;
	const int64_t nb = n / QK_K;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm256_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
		const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
		const float d = f16(x[i].d);
		__m256i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
			const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
			const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
#pragma GCC unroll 4
			for (int k = 0; k < 4; k++) {
				/* e = 128h + 32k + l: low 4 bits in ql[64h + l + 32(k&1)] (low nibble
				 * for k<2), high 2 bits at bits 2k..2k+1 of qh[32h + l]. */
				const __m256i lo = (k & 1) ? ql1 : ql0;
				const __m256i lo4 = _mm256_and_si256(k < 2 ? lo : _mm256_srli_epi16(lo, 4), m4);
				const __m256i hi2 = _mm256_and_si256(qh, _mm256_set1_epi8((char)(3 << (2 * k))));
				const __m256i hi = k == 0 ? _mm256_slli_epi16(hi2, 4)
						   : k == 1 ? _mm256_slli_epi16(hi2, 2)
						   : k == 2 ? hi2
							    : _mm256_srli_epi16(hi2, 2);
				const __m256i q = _mm256_or_si256(lo4, hi);
				/* groups 8h+2k (elements l<16, low lane) and 8h+2k+1 (high lane) */
				const int g = 8 * h + 2 * k;
				const __m128i pick = _mm_set_epi8((char)(g + 1), (char)(g + 1), (char)(g + 1), (char)(g + 1),
								  (char)(g + 1), (char)(g + 1), (char)(g + 1), (char)(g + 1),
								  (char)g, (char)g, (char)g, (char)g, (char)g, (char)g, (char)g,
								  (char)g);
				const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
				ROWS(r)
				{
					const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
					const __m256i yq = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * k));
					sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, yq)));
				}
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
			const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5); /* 32 * sc . bsums */
			const __m256i s = _mm256_sub_epi32(sumi[r], off);
			acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(s), acc[r]);
		}
	}
	ROWS(r) out[r] = hsum8(acc[r]);
}

/* Bytes g x8, g+1 x8 of sc8 as 16 int16: the scales of 16-groups g (low lane) and g+1 (high lane). */
INL __m256i scale_pair16(__m128i sc8, int g)
{
	const __m128i pick = _mm_set_epi8((char)(g + 1), (char)(g + 1), (char)(g + 1), (char)(g + 1), (char)(g + 1),
					  (char)(g + 1), (char)(g + 1), (char)(g + 1), (char)g, (char)g, (char)g, (char)g,
					  (char)g, (char)g, (char)g, (char)g);
	return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
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

/* Q2_K and Q3_K (three: the third bit from hmask). Element 128h + 32j + l has its
 * two low bits at bits 2j of qs[32h + l]; 32 of them per vector, 16-groups
 * 8h + 2j and 8h + 2j + 1 in its two lanes. Levels are dotted unsigned: q2_k's
 * min term and q3_k's -4 offset come once per block from the activation's
 * 16-group sums (bsums), which match the scale groups. */
INL void k23_k(bool three, const void *w, const uint8_t *a, size_t as, int nr, int64_t nb, float *out)
{
	const size_t bs = three ? sizeof(struct nx_block_q3_k) : sizeof(struct nx_block_q2_k);
	const __m256i m3 = _mm256_set1_epi8(3);
	__m256 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm256_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *blk = (const uint8_t *)w + (size_t)i * bs;
		const struct nx_block_q2_k *x2 = (const void *)blk;
		const struct nx_block_q3_k *x3 = (const void *)blk;
		const uint8_t *qs = three ? x3->qs : x2->qs;
		__m128i sc8;
		__m256i mins = _mm256_setzero_si256(), hm = _mm256_setzero_si256();
		if (three) {
			sc8 = q3_k_scales(x3->scales);
			hm = _mm256_loadu_si256((const __m256i *)x3->hmask);
		} else {
			const __m128i raw = _mm_loadu_si128((const __m128i *)x2->scales);
			sc8 = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
			mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f)));
		}
		const float d = f16(three ? x3->d : x2->d);
		__m256i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const __m256i qb = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
#pragma GCC unroll 4
			for (int j = 0; j < 4; j++) {
				__m256i q = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * j), m3);
				if (three) { /* +4 where bit 4h + j of hmask[l] is set */
					const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
					const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
					q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(4)));
				}
				const __m256i sc = scale_pair16(sc8, 8 * h + 2 * j);
				ROWS(r)
				{
					const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
					const __m256i yq = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * j));
					sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, yq)));
				}
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
			if (three) {
				const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
				const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 2); /* 4 * sc . bsums */
				const __m256i s = _mm256_sub_epi32(sumi[r], off);
				acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(s), acc[r]);
			} else {
				const __m256i msum = _mm256_madd_epi16(mins, bsums); /* m_g * sum of group g, in pairs */
				acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
				acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(f16(x2->dmin) * y->d), _mm256_cvtepi32_ps(msum),
							  acc[r]);
			}
		}
	}
	ROWS(r) out[r] = hsum8(acc[r]);
}

INL void q2_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k23_k(false, w, a, as, nr, n / QK_K, out);
}
INL void q3_k_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	k23_k(true, w, a, as, nr, n / QK_K, out);
}

/* IQ4_XS: per 32-group, the grid values looked up from the nibbles (signed, so
 * through the sign trick), their int16 pair sums scaled by the group's ls - 32. */
INL void iq4_xs_k(const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	const struct nx_block_iq4_xs *x = w;
	const int64_t nb = n / QK_K;
	const __m256i grid = iq4_grid();
	__m256 acc[ROWS_MAX];
	ROWS(r) acc[r] = _mm256_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const float d = f16(x[i].d);
		__m256i sumi[ROWS_MAX];
		ROWS(r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const int ls = (((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) |
					(((x[i].scales_h >> (2 * ib)) & 3) << 4)) - 32;
			const __m256i q = _mm256_shuffle_epi8(grid, nibbles32(x[i].qs + 16 * ib));
			const __m256i aq = _mm256_sign_epi8(q, q), sc = _mm256_set1_epi16((short)ls);
			ROWS(r)
			{
				const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
				const __m256i yq = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * ib));
				const __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(yq, q));
				sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sc));
			}
		}
		ROWS(r)
		{
			const struct nx_block_q8_k *y = (const struct nx_block_q8_k *)act_row(a, as, r) + i;
			acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
		}
	}
	ROWS(r) out[r] = hsum8(acc[r]);
}

/* ---------------------------------------------------------------- f32 / f16 / bf16 x F32 */

enum kf { K_F32, K_F16, K_BF16 };

/* 8 weights at element i as floats. */
INL __m256 kf_load(enum kf k, const void *w, int64_t i)
{
	switch (k) {
	case K_F32:
		return _mm256_loadu_ps((const float *)w + i);
	case K_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const nx_f16 *)w + i)));
	default:
		return _mm256_castsi256_ps(_mm256_slli_epi32(
			_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const nx_bf16 *)w + i))), 16));
	}
}

/* 16 elements per step in two accumulators; the last n % 8 go through a zero-padded copy. */
INL void kf_k(enum kf k, const void *w, const uint8_t *a, size_t as, int nr, int64_t n, float *out)
{
	const size_t esz = k == K_F32 ? 4 : 2;
	__m256 acc0[ROWS_MAX], acc1[ROWS_MAX];
	ROWS(r) acc0[r] = acc1[r] = _mm256_setzero_ps();
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		const __m256 w0 = kf_load(k, w, i), w1 = kf_load(k, w, i + 8);
		ROWS(r)
		{
			const float *y = (const float *)act_row(a, as, r) + i;
			acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y), acc0[r]);
			acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(y + 8), acc1[r]);
		}
	}
	if (i + 8 <= n) {
		const __m256 w0 = kf_load(k, w, i);
		ROWS(r) acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps((const float *)act_row(a, as, r) + i), acc0[r]);
		i += 8;
	}
	if (i < n) {
		const size_t rem = (size_t)(n - i);
		uint8_t wb[32] = { 0 };
		memcpy(wb, (const uint8_t *)w + (size_t)i * esz, rem * esz);
		const __m256 w0 = kf_load(k, wb, 0);
		ROWS(r)
		{
			float yb[8] = { 0 };
			memcpy(yb, (const float *)act_row(a, as, r) + i, rem * sizeof(float));
			acc1[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(yb), acc1[r]);
		}
	}
	ROWS(r) out[r] = hsum8(_mm256_add_ps(acc0[r], acc1[r]));
}

/* ---------------------------------------------------------------- activation quantizers */

/* roundf: to nearest, ties away from zero. x - trunc(x) is exact, so the test is too. */
INL __m256 round_away(__m256 x)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	const __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
	const __m256 f = _mm256_andnot_ps(sign, _mm256_sub_ps(x, t));
	const __m256 up = _mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
	const __m256 one = _mm256_or_ps(_mm256_and_ps(x, sign), _mm256_set1_ps(1.0f)); /* +-1 */
	return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* Float -> int conversion with the reference's (x86) result for values out of
 * int range (inf, nan when 1/d overflowed): the indefinite integer, whose low
 * byte the reference stores, i.e. 0. */
INL __m256i fix_indefinite(__m256i q)
{
	return _mm256_andnot_si256(_mm256_cmpeq_epi32(q, _mm256_set1_epi32(INT32_MIN)), q);
}

/* 32 int32 (-128..127 after saturation) -> 32 int8 in order. */
INL __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
	const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
	return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

INL float hmax8(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

/* The compiler may not fuse what it is given through this into a multiply-add:
 * the two-part quantizers must round x - d * q as the reference does. */
INL __m256 opaque(__m256 v)
{
	__asm__("" : "+x"(v));
	return v;
}

INL float q8_0_amax(const __m256 *v)
{
	const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	return hmax8(_mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
				   _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask))));
}

/* The 32 levels roundf(v * id) of a block, stored at qs and returned. */
INL __m256i q8_0_levels(const __m256 *v, float id, int8_t *qs)
{
	const __m256 idv = _mm256_set1_ps(id);
	__m256i q[4];
	for (int k = 0; k < 4; k++)
		q[k] = fix_indefinite(_mm256_cvttps_epi32(round_away(_mm256_mul_ps(v[k], idv))));
	const __m256i p = pack32(q[0], q[1], q[2], q[3]);
	_mm256_storeu_si256((__m256i *)qs, p);
	return p;
}

/* One Q8_0 block from its 32 values v[0..3], as the reference: d = amax / 127
 * (stored f16), q = roundf(x / d) using id = 1/d. Returns the stored levels. */
INL __m256i q8_0_block(const __m256 *v, struct nx_block_q8_0 *b)
{
	const float d = q8_0_amax(v) / 127;
	b->d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
	return q8_0_levels(v, d ? 1.0f / d : 0.0f, b->qs);
}

/* float -> IEEE half, round to nearest even: F16C does exactly what nx_f32_to_f16 does (NaNs included). */
static TGT void quant_f16(const float *src, void *dst, int64_t n)
{
	nx_f16 *h = dst;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(h + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	for (; i < n; i++)
		h[i] = nx_f32_to_f16(src[i]);
}

static TGT void quant_q8_0(const float *src, void *dst, int64_t n)
{
	struct nx_block_q8_0 *b = dst;
	for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
		__m256 v[4];
		for (int k = 0; k < 4; k++)
			v[k] = _mm256_loadu_ps(src + 8 * k);
		q8_0_block(v, &b[i]);
	}
}

/* hi and lo of each block (kern/quant.h) with x and x - hi in registers. q * d
 * is exact (8-bit q, 11-bit d), so x - q * d here is the reference's dequant
 * and subtraction. */
static TGT void quant2_q8_0(const float *src, void *hi, void *lo, int64_t n)
{
	struct nx_block_q8_0 *h = hi, *l = lo;
	for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
		__m256 v[4], r[4];
		for (int k = 0; k < 4; k++)
			v[k] = _mm256_loadu_ps(src + 8 * k);
		float d = q8_0_amax(v) / 127;
		if (d < 0x1p-7f) /* rounded up to a multiple of 2^-17 */
			d = ceilf(d * 0x1p17f) * 0x1p-17f;
		h[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
		const __m256i p = q8_0_levels(v, d ? 1.0f / d : 0.0f, h[i].qs);
		if (!l)
			continue;
		const float dh = f16(h[i].d);
		if (dh > 65504.0f) { /* inf: the f16 scale overflowed (kern/quant.h) */
			memset(&l[i], 0, sizeof(l[i]));
			continue;
		}
		const __m256 dv = _mm256_set1_ps(dh);
		const __m128i p0 = _mm256_castsi256_si128(p), p1 = _mm256_extracti128_si256(p, 1);
		const __m128i q8[4] = { p0, _mm_srli_si128(p0, 8), p1, _mm_srli_si128(p1, 8) };
		for (int k = 0; k < 4; k++) {
			const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8[k]));
			r[k] = _mm256_sub_ps(v[k], opaque(_mm256_mul_ps(q, dv)));
		}
		const float dl = dh / 128;
		l[i].d = _cvtss_sh(dl, _MM_FROUND_TO_NEAREST_INT);
		q8_0_levels(r, dl ? 1.0f / dl : 0.0f, l[i].qs);
	}
}

/* One Q8_K block from src[0..256), as the reference: max = the first value of
 * largest magnitude, iscale = -127/max, q = min(127, round-to-even(iscale * x)),
 * d = 1/iscale, bsums over 16-groups. */
INL void q8_k_block(const float *src, struct nx_block_q8_k *b)
{
	const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 m = _mm256_setzero_ps();
	for (int j = 0; j < QK_K; j += 8)
		m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(src + j), abs_mask));
	const float amax = hmax8(m);
	if (!amax) {
		memset(b, 0, sizeof(*b));
		return;
	}
	const __m256 amv = _mm256_set1_ps(amax);
	int first = 0;
	for (int j = 0; j < QK_K; j += 8) {
		const __m256 eq = _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(src + j), abs_mask), amv, _CMP_EQ_OQ);
		const int bits = _mm256_movemask_ps(eq);
		if (bits) {
			first = j + __builtin_ctz((unsigned)bits);
			break;
		}
	}
	const float iscale = -127.f / src[first];
	const __m256 isv = _mm256_set1_ps(iscale);
	for (int j = 0; j < QK_K; j += 32) {
		__m256i q[4];
		for (int k = 0; k < 4; k++)
			q[k] = fix_indefinite(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + j + 8 * k), isv)));
		_mm256_storeu_si256((__m256i *)(b->qs + j), pack32(q[0], q[1], q[2], q[3]));
	}
	/* sum of 16 int8 = sad of (q + 128) against 0, less 16 * 128 */
	for (int g = 0; g < QK_K / 16; g++) {
		const __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(b->qs + 16 * g)),
						_mm_set1_epi8((char)0x80));
		const __m128i s = _mm_sad_epu8(v, _mm_setzero_si128());
		b->bsums[g] = (int16_t)(_mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128);
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
		const __m256 dv = _mm256_set1_ps(h[i].d);
		for (int j = 0; j < QK_K; j += 8) {
			const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(h[i].qs + j))));
			_mm256_storeu_ps(r + j, _mm256_sub_ps(_mm256_loadu_ps(src + j), opaque(_mm256_mul_ps(dv, q))));
		}
		q8_k_block(r, &l[i]);
	}
}

/* ---------------------------------------------------------------- the set */

#include "kern/x86_dot_table.h"

void nx_kern_avx2_install(struct nx_type_traits *tab, size_t n)
{
	install_set(tab, n);
}
