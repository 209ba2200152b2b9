/* attn_avx512.c - nx_attend_f16 and nx_attend_q8_0 (kern/attn.h) with AVX-512: f16 or Q8_0 keys and values
 * converted in registers once for the query heads of a group, a vector exp for the softmax; and nx_attn_merge. */
#include "kern/attn.h"

#include "kern/cpu.h"
#include "kern/vexp_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>

#define TGT_STR "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define TGT __attribute__((target(TGT_STR)))
#define INL static inline __attribute__((always_inline, target(TGT_STR)))

/* 0: not yet known, 1: no, 2: yes. Computed on first use without locks (the
 * answer is the same for every caller): pthread_once would end with a private
 * futex wake, which the worker sandbox does not allow. */
static _Atomic int fast;

bool nx_attn_fast(int hd)
{
	if (!fast)
		fast = nx_kern_set(NX_KFAM_ATTN) == NX_KSET_AVX512 ? 2 : 1;
	return fast == 2 && hd > 0 && hd % 16 == 0 && hd <= 256;
}

INL __m512 ld16(const nx_f16 *p)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Values 16c .. 16c + 15 of row j of a K or V run (ld: f16 values, or Q8_0
 * blocks, a row apart) as floats. A Q8_0 value d * q is exact in float (an
 * 8-bit level times an f16 scale), so what follows sees the value itself. */
INL __m512 ld_row(const void *run, size_t j, size_t ld, int c, const bool q8)
{
	if (!q8)
		return ld16((const nx_f16 *)run + j * ld + 16 * c);
	const struct nx_block_q8_0 *b = (const struct nx_block_q8_0 *)run + j * ld + c / 2;
	const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * (c & 1)))));
	return _mm512_mul_ps(x, _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d)));
}

/* Bytes of a row of hd values. */
INL size_t row_bytes(size_t ld, const bool q8)
{
	return q8 ? ld * sizeof(struct nx_block_q8_0) : ld * sizeof(nx_f16);
}

/* Most heads attend() takes in one pass over K/V (nx_attn_group). At hd 64 their
 * q, score and output accumulators and the keys in flight fit the 32 vector
 * registers (12 q + 12 scores + 4 keys; 24 outputs + 6 weights + 2 values). 4
 * heads measured no faster: the FMAs, not the conversions, bound it by then.
 * (The loops over heads below say `#pragma GCC unroll 3` to match.) */
#define GMAX 3

/* Heads g < G of one kv head: q and out at + g * hd, scores at att + g * n.
 * Each K and V chunk is loaded and converted once and used by every head; each
 * head's own arithmetic is the same operations in the same order as with G = 1,
 * so its output does not depend on G or on the other heads. */
INL void attend(float *out, const float *q, const void *kc, const void *vc, int n, size_t ld, const int hd,
		const int G, const bool q8, float scale, float *att, float *ms, const void *next_k, int next_n)
{
	const size_t rb = row_bytes(ld, q8);
	const int nc = hd / 16;
	/* zeros: only so that at a generic hd (nc not known) GCC sees no unset elements */
	__m512 qv[GMAX][16] = {0};
#pragma GCC unroll 3
	for (int g = 0; g < G; g++)
#pragma GCC unroll 16
		for (int c = 0; c < nc; c++)
			qv[g][c] = _mm512_mul_ps(_mm512_loadu_ps(q + g * hd + 16 * c), _mm512_set1_ps(scale));

	/* scores, 4 keys at a time so their sums reduce together */
	__m512 mxv[GMAX];
#pragma GCC unroll 3
	for (int g = 0; g < G; g++)
		mxv[g] = _mm512_set1_ps(-INFINITY);
	int j = 0;
	for (; j + 4 <= n; j += 4) {
		__m512 s[GMAX][4];
#pragma GCC unroll 3
		for (int g = 0; g < G; g++)
			s[g][0] = s[g][1] = s[g][2] = s[g][3] = _mm512_setzero_ps();
		/* These keys' value rows towards L2 while the scores are worked out:
		 * a span of a short context is too short a stream for the hardware
		 * prefetcher, and V is read right after. */
		for (int z = 0; z < 4; z++)
			for (size_t b = 0; b < rb; b += 64)
				_mm_prefetch((const char *)vc + (size_t)(j + z) * rb + b, _MM_HINT_T1);
#pragma GCC unroll 16
		for (int c = 0; c < nc; c++) {
			const __m512 x0 = ld_row(kc, j, ld, c, q8), x1 = ld_row(kc, j + 1, ld, c, q8);
			const __m512 x2 = ld_row(kc, j + 2, ld, c, q8), x3 = ld_row(kc, j + 3, ld, c, q8);
#pragma GCC unroll 3
			for (int g = 0; g < G; g++) {
				s[g][0] = _mm512_fmadd_ps(qv[g][c], x0, s[g][0]);
				s[g][1] = _mm512_fmadd_ps(qv[g][c], x1, s[g][1]);
				s[g][2] = _mm512_fmadd_ps(qv[g][c], x2, s[g][2]);
				s[g][3] = _mm512_fmadd_ps(qv[g][c], x3, s[g][3]);
			}
		}
#pragma GCC unroll 3
		for (int g = 0; g < G; g++) {
			/* 4 x 16 lanes -> 4 sums: halve twice within pairs, then finish per key */
			const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(s[g][0], s[g][1], 0x44),
							 _mm512_shuffle_f32x4(s[g][0], s[g][1], 0xee));
			const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(s[g][2], s[g][3], 0x44),
							 _mm512_shuffle_f32x4(s[g][2], s[g][3], 0xee));
			/* a01 = [s0 lo256+hi256 | s1 lo256+hi256], a23 likewise */
			const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88),
						       _mm512_shuffle_f32x4(a01, a23, 0xdd));
			/* b = 4 x 128-bit: s0, s1, s2, s3 partials (4 lanes each) */
			const __m512 c1 = _mm512_add_ps(b, _mm512_permute_ps(b, 0x4e));
			const __m512 c2 = _mm512_add_ps(c1, _mm512_permute_ps(c1, 0xb1));
			/* lane 0 of each 128-bit lane holds a key's score */
			const __m128 sc = _mm512_castps512_ps128(_mm512_permutexvar_ps(
				_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c2));
			_mm_storeu_ps(att + (size_t)g * n + j, sc);
			mxv[g] = _mm512_max_ps(mxv[g], _mm512_castps128_ps512(sc));
		}
	}
	float mx[GMAX];
#pragma GCC unroll 3
	for (int g = 0; g < G; g++)
		mx[g] = _mm512_reduce_max_ps(_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), 0x000f, mxv[g]));
	for (; j < n; j++) {
		__m512 s[GMAX];
#pragma GCC unroll 3
		for (int g = 0; g < G; g++)
			s[g] = _mm512_setzero_ps();
#pragma GCC unroll 16
		for (int c = 0; c < nc; c++) {
			const __m512 x = ld_row(kc, j, ld, c, q8);
#pragma GCC unroll 3
			for (int g = 0; g < G; g++)
				s[g] = _mm512_fmadd_ps(qv[g][c], x, s[g]);
		}
#pragma GCC unroll 3
		for (int g = 0; g < G; g++) {
			float *a = att + (size_t)g * n;
			a[j] = _mm512_reduce_add_ps(s[g]);
			if (a[j] > mx[g])
				mx[g] = a[j];
		}
	}

	/* p_j = e^(s_j - max), summed; per head */
	float sum[GMAX];
#pragma GCC unroll 3
	for (int g = 0; g < G; g++) {
		float *a = att + (size_t)g * n;
		const __m512 mv = _mm512_set1_ps(mx[g]);
		__m512 sumv = _mm512_setzero_ps();
		for (j = 0; j + 16 <= n; j += 16) {
			const __m512 e = nx_vexp_neg(_mm512_sub_ps(_mm512_loadu_ps(a + j), mv));
			_mm512_storeu_ps(a + j, e);
			sumv = _mm512_add_ps(sumv, e);
		}
		if (j < n) {
			const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
			const __m512 e = nx_vexp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + j), mv));
			_mm512_mask_storeu_ps(a + j, m, e);
			sumv = _mm512_add_ps(sumv, _mm512_maskz_mov_ps(m, e));
		}
		sum[g] = _mm512_reduce_add_ps(sumv);
		if (ms) {
			ms[2 * g] = mx[g];
			ms[2 * g + 1] = sum[g];
		}
	}

	/* out = sum_j p_j v_j / sum, two keys at a time into two accumulator sets;
	 * over vb of the nc chunks at a time, so that 2 x G x vb accumulators stay in
	 * registers (hd 128, 2 or 3 heads: two passes of 4 chunks). The values come
	 * from L2 (prefetched above), so the first pass also sends next_k's rows
	 * there, a key row for each value row: without that the memory would idle
	 * here, between one unit's K stream and the next's. */
	const char *const nk = (const char *)next_k;
	const size_t nk_bytes = next_k ? (size_t)next_n * rb : 0;
	size_t nk_at = 0;
	const int vb = 2 * G * nc <= 24 ? nc : 4;
	for (int c0 = 0; c0 < nc; c0 += vb) {
		__m512 o0[GMAX][16] = {0}, o1[GMAX][16] = {0};
		for (j = 0; j + 2 <= n; j += 2) {
			for (; nk_at < nk_bytes && nk_at < (size_t)(j + 2) * rb; nk_at += 64)
				_mm_prefetch(nk + nk_at, _MM_HINT_T1);
#pragma GCC unroll 16
			for (int c = 0; c < vb; c++) {
				const __m512 x0 = ld_row(vc, j, ld, c0 + c, q8), x1 = ld_row(vc, j + 1, ld, c0 + c, q8);
#pragma GCC unroll 3
				for (int g = 0; g < G; g++) {
					const float *a = att + (size_t)g * n + j;
					o0[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(a[0]), x0, o0[g][c]);
					o1[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(a[1]), x1, o1[g][c]);
				}
			}
		}
		if (j < n) {
#pragma GCC unroll 16
			for (int c = 0; c < vb; c++) {
				const __m512 x0 = ld_row(vc, j, ld, c0 + c, q8);
#pragma GCC unroll 3
				for (int g = 0; g < G; g++)
					o0[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(att[(size_t)g * n + j]), x0, o0[g][c]);
			}
		}
#pragma GCC unroll 3
		for (int g = 0; g < G; g++) {
			const __m512 inv = _mm512_set1_ps(1.0f / sum[g]);
#pragma GCC unroll 16
			for (int c = 0; c < vb; c++)
				_mm512_storeu_ps(out + g * hd + 16 * (c0 + c),
						 _mm512_mul_ps(_mm512_add_ps(o0[g][c], o1[g][c]), inv));
		}
	}
	for (; nk_at < nk_bytes; nk_at += 64) /* next_k longer than this run */
		_mm_prefetch(nk + nk_at, _MM_HINT_T1);
}

int nx_attn_group(int hd)
{
	return hd == 64 || hd == 128 ? GMAX : 1;
}

/* One instance per common head size, group and cache type, so the
 * accumulators stay in registers (at hd 128 and 3 heads some q chunks are read
 * from the stack, which measured faster than 2 heads a pass). n_q heads in as
 * few passes of up to nx_attn_group(hd) as there can be, as even as can be (7:
 * 3, 2, 2), each reusing att. */
INL void attend_heads(float *out, const float *q, int n_q, const void *kc, const void *vc, int n, size_t ld, int hd,
		      const bool q8, float scale, float *att, float *ms, const void *next_k, int next_n)
{
	const int gmax = nx_attn_group(hd), passes = (n_q + gmax - 1) / gmax;
	for (int i = 0, h = 0; i < passes; i++) {
		const int g = n_q / passes + (i < n_q % passes);
		float *o = out + (size_t)h * hd, *m = ms ? ms + 2 * h : NULL;
		const float *qh = q + (size_t)h * hd;
		/* the next unit's keys in the last pass only: after an earlier one, this unit's K is read again */
		const void *nk = i + 1 == passes ? next_k : NULL;
		const int nn = i + 1 == passes ? next_n : 0;
		if (hd == 64 && g == 3)
			attend(o, qh, kc, vc, n, ld, 64, 3, q8, scale, att, m, nk, nn);
		else if (hd == 64 && g == 2)
			attend(o, qh, kc, vc, n, ld, 64, 2, q8, scale, att, m, nk, nn);
		else if (hd == 64)
			attend(o, qh, kc, vc, n, ld, 64, 1, q8, scale, att, m, nk, nn);
		else if (hd == 128 && g == 3)
			attend(o, qh, kc, vc, n, ld, 128, 3, q8, scale, att, m, nk, nn);
		else if (hd == 128 && g == 2)
			attend(o, qh, kc, vc, n, ld, 128, 2, q8, scale, att, m, nk, nn);
		else if (hd == 128)
			attend(o, qh, kc, vc, n, ld, 128, 1, q8, scale, att, m, nk, nn);
		else
			attend(o, qh, kc, vc, n, ld, hd, 1, q8, scale, att, m, nk, nn);
		h += g;
	}
}

TGT void nx_attend_f16(float *out, const float *q, int n_q, const nx_f16 *kc, const nx_f16 *vc, int n, size_t ld,
		       int hd, float scale, float *att, float *ms, const void *next_k, int next_n)
{
	attend_heads(out, q, n_q, kc, vc, n, ld, hd, false, scale, att, ms, next_k, next_n);
}

TGT void nx_attend_q8_0(float *out, const float *q, int n_q, const struct nx_block_q8_0 *kc,
			const struct nx_block_q8_0 *vc, int n, size_t ld, int hd, float scale, float *att, float *ms,
			const void *next_k, int next_n)
{
	attend_heads(out, q, n_q, kc, vc, n, ld, hd, true, scale, att, ms, next_k, next_n);
}

/* nx_attn_merge_ref with hd / 16 (NC) vectors of each head's output in
 * registers over all spans. The _round forms: GCC may fuse a plain
 * _mm512_mul_ps into the _mm512_add_ps after it, which would round once where
 * the reference rounds twice. */
INL void merge(float *out, const float *part, const float *ms, int n_head, int n_span, const int hd)
{
	enum { RN = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC };
	const int nc = hd / 16;
	const size_t mstep = 2 * (size_t)n_head, pstep = (size_t)n_head * hd;
	for (int h = 0; h < n_head; h++) {
		const float *m = ms + 2 * (size_t)h;
		float mx = m[0], z = 0.0f;
		for (int c = 1; c < n_span; c++)
			mx = m[c * mstep] > mx ? m[c * mstep] : mx;
		__m512 o[16] = {0};
		for (int c = 0; c < n_span; c++) {
			const float w = m[c * mstep + 1] * expf(m[c * mstep] - mx);
			const float *p = part + c * pstep + (size_t)h * hd;
			const __m512 wv = _mm512_set1_ps(w);
			z += w;
#pragma GCC unroll 16
			for (int k = 0; k < nc; k++)
				o[k] = _mm512_add_round_ps(o[k], _mm512_mul_round_ps(wv, _mm512_loadu_ps(p + 16 * k), RN), RN);
		}
		const __m512 inv = _mm512_set1_ps(1.0f / z);
#pragma GCC unroll 16
		for (int k = 0; k < nc; k++)
			_mm512_storeu_ps(out + (size_t)h * hd + 16 * k, _mm512_mul_ps(o[k], inv));
	}
}

static TGT void merge_fast(float *out, const float *part, const float *ms, int n_head, int n_span, int hd)
{
	if (hd == 64)
		merge(out, part, ms, n_head, n_span, 64);
	else if (hd == 128)
		merge(out, part, ms, n_head, n_span, 128);
	else
		merge(out, part, ms, n_head, n_span, hd);
}

void nx_attn_merge(float *out, const float *part, const float *ms, int n_head, int n_span, int hd)
{
	if (nx_attn_fast(hd))
		merge_fast(out, part, ms, n_head, n_span, hd);
	else
		nx_attn_merge_ref(out, part, ms, n_head, n_span, hd);
}
