/* attn_avx512.c - nx_attend_f16 (kern/attn.h) with AVX-512: f16 keys and values converted in registers, a vector exp for the softmax. */
#include "kern/attn.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define TGT_STR "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define TGT __attribute__((target(TGT_STR)))
#define INL static inline __attribute__((always_inline, target(TGT_STR)))

/* 0: not yet known, 1: no, 2: yes. Computed on first use without locks (the
 * answer is the same for every caller): pthread_once would end with a private
 * futex wake, which the worker sandbox does not allow. */
static _Atomic int fast;

static int fast_probe(void)
{
	__builtin_cpu_init();
	const char *k = getenv("NX_KERN");
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
			       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
			       __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
			       !(k && (!strcmp(k, "ref") || !strcmp(k, "avx2")))
		       ? 2
		       : 1;
}

bool nx_attn_fast(int hd)
{
	if (!fast)
		fast = fast_probe();
	return fast == 2 && hd > 0 && hd % 16 == 0 && hd <= 256;
}

/* e^x for x <= 0 (softmax arguments after the max is taken off): 2^(x log2 e)
 * as 2^n * p(f), f in [-0.5, 0.5], p of degree 6 (relative error ~2e-7);
 * below -87 the result flushes to 0. */
INL __m512 exp_neg(__m512 x)
{
	x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
	const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
	const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	const __m512 f = _mm512_sub_ps(t, n);
	/* 2^f = e^(f ln 2): Taylor-like minimax coefficients */
	__m512 p = _mm512_set1_ps(1.535336188319500e-4f);
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(p, n);
}

INL __m512 ld16(const nx_f16 *p)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

INL void attend(float *out, const float *q, const nx_f16 *kc, const nx_f16 *vc, int n, size_t ld, const int hd,
		float scale, float *att)
{
	const int nc = hd / 16;
	__m512 qv[16];
	for (int c = 0; c < nc; c++)
		qv[c] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * c), _mm512_set1_ps(scale));

	/* scores, 4 keys at a time so their sums reduce together */
	__m512 mxv = _mm512_set1_ps(-INFINITY);
	int j = 0;
	for (; j + 4 <= n; j += 4) {
		__m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
		const nx_f16 *k0 = kc + (size_t)j * ld;
		for (int c = 0; c < nc; c++) {
			s0 = _mm512_fmadd_ps(qv[c], ld16(k0 + 16 * c), s0);
			s1 = _mm512_fmadd_ps(qv[c], ld16(k0 + ld + 16 * c), s1);
			s2 = _mm512_fmadd_ps(qv[c], ld16(k0 + 2 * ld + 16 * c), s2);
			s3 = _mm512_fmadd_ps(qv[c], ld16(k0 + 3 * ld + 16 * c), s3);
		}
		/* 4 x 16 lanes -> 4 sums: halve twice within pairs, then finish per key */
		const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(s0, s1, 0x44), _mm512_shuffle_f32x4(s0, s1, 0xee));
		const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(s2, s3, 0x44), _mm512_shuffle_f32x4(s2, s3, 0xee));
		/* a01 = [s0 lo256+hi256 | s1 lo256+hi256], a23 likewise */
		const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88), _mm512_shuffle_f32x4(a01, a23, 0xdd));
		/* b = 4 x 128-bit: s0, s1, s2, s3 partials (4 lanes each) */
		const __m512 c1 = _mm512_add_ps(b, _mm512_permute_ps(b, 0x4e));
		const __m512 c2 = _mm512_add_ps(c1, _mm512_permute_ps(c1, 0xb1));
		/* lane 0 of each 128-bit lane holds a key's score */
		const __m128 sc = _mm512_castps512_ps128(
			_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c2));
		_mm_storeu_ps(att + j, sc);
		mxv = _mm512_max_ps(mxv, _mm512_castps128_ps512(sc));
	}
	float mx = _mm512_reduce_max_ps(_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), 0x000f, mxv));
	for (; j < n; j++) {
		__m512 s = _mm512_setzero_ps();
		for (int c = 0; c < nc; c++)
			s = _mm512_fmadd_ps(qv[c], ld16(kc + (size_t)j * ld + 16 * c), s);
		att[j] = _mm512_reduce_add_ps(s);
		if (att[j] > mx)
			mx = att[j];
	}

	/* p_j = e^(s_j - max), summed */
	const __m512 mv = _mm512_set1_ps(mx);
	__m512 sumv = _mm512_setzero_ps();
	for (j = 0; j + 16 <= n; j += 16) {
		const __m512 e = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(att + j), mv));
		_mm512_storeu_ps(att + j, e);
		sumv = _mm512_add_ps(sumv, e);
	}
	if (j < n) {
		const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
		const __m512 e = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, att + j), mv));
		_mm512_mask_storeu_ps(att + j, m, e);
		sumv = _mm512_add_ps(sumv, _mm512_maskz_mov_ps(m, e));
	}
	const float sum = _mm512_reduce_add_ps(sumv);

	/* out = sum_j p_j v_j / sum, two keys at a time into two accumulator sets */
	__m512 o0[16], o1[16];
	for (int c = 0; c < nc; c++)
		o0[c] = o1[c] = _mm512_setzero_ps();
	for (j = 0; j + 2 <= n; j += 2) {
		const __m512 p0 = _mm512_set1_ps(att[j]), p1 = _mm512_set1_ps(att[j + 1]);
		const nx_f16 *v0 = vc + (size_t)j * ld;
		for (int c = 0; c < nc; c++) {
			o0[c] = _mm512_fmadd_ps(p0, ld16(v0 + 16 * c), o0[c]);
			o1[c] = _mm512_fmadd_ps(p1, ld16(v0 + ld + 16 * c), o1[c]);
		}
	}
	if (j < n) {
		const __m512 p0 = _mm512_set1_ps(att[j]);
		for (int c = 0; c < nc; c++)
			o0[c] = _mm512_fmadd_ps(p0, ld16(vc + (size_t)j * ld + 16 * c), o0[c]);
	}
	const __m512 inv = _mm512_set1_ps(1.0f / sum);
	for (int c = 0; c < nc; c++)
		_mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(_mm512_add_ps(o0[c], o1[c]), inv));
}

/* One instance per common head size, so the accumulators stay in registers. */
TGT void nx_attend_f16(float *out, const float *q, const nx_f16 *kc, const nx_f16 *vc, int n, size_t ld, int hd,
		       float scale, float *att)
{
	if (hd == 64)
		attend(out, q, kc, vc, n, ld, 64, scale, att);
	else if (hd == 128)
		attend(out, q, kc, vc, n, ld, 128, scale, att);
	else
		attend(out, q, kc, vc, n, ld, hd, scale, att);
}
