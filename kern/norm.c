/* norm.c - RMS normalization (kern/norm.h): the scalar reference, AVX2 and AVX-512
 * kernels in the reference's summation order, and the choice of kernel. */
#include "kern/norm.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define LANES 16 /* partial sums of x^2 (kern/norm.h) */

static float inv_rms(double ss, int n, float eps)
{
	return (float)(1.0 / sqrt(ss / n + eps));
}

static void rmsnorm_ref(float *out, const float *x, const float *w, int n, float eps)
{
	double acc[LANES] = { 0 };
	for (int i = 0; i < n; i++)
		acc[i % LANES] += (double)x[i] * x[i];
	for (int h = LANES / 2; h >= 1; h /= 2)
		for (int j = 0; j < h; j++)
			acc[j] += acc[j + h];
	const float r = inv_rms(acc[0], n, eps);
	for (int i = 0; i < n; i++)
		out[i] = x[i] * r * w[i];
}

/* ---------------------------------------------------------------- AVX2: sums 0-3, 4-7, 8-11, 12-15 in a0..a3 */

#define TGT2 __attribute__((target("avx2,fma")))

static TGT2 void rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps)
{
	__m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
	float tail[LANES] = { 0 }; /* the last n % 16 values, zero-padded: 0 * 0 adds nothing */
	for (int i = 0; i < n; i += LANES) {
		const float *p = x + i;
		if (n - i < LANES) {
			memcpy(tail, p, (size_t)(n - i) * sizeof(float));
			p = tail;
		}
		const __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(p)), v1 = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
		const __m256d v2 = _mm256_cvtps_pd(_mm_loadu_ps(p + 8)), v3 = _mm256_cvtps_pd(_mm_loadu_ps(p + 12));
		a0 = _mm256_fmadd_pd(v0, v0, a0);
		a1 = _mm256_fmadd_pd(v1, v1, a1);
		a2 = _mm256_fmadd_pd(v2, v2, a2);
		a3 = _mm256_fmadd_pd(v3, v3, a3);
	}
	const __m256d s8a = _mm256_add_pd(a0, a2), s8b = _mm256_add_pd(a1, a3); /* sums j and j + 8 */
	const __m256d s4 = _mm256_add_pd(s8a, s8b);                              /* j and j + 4 */
	const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
	const double ss = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
	const float r = inv_rms(ss, n, eps);
	const __m256 rv = _mm256_set1_ps(r);
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
	for (; i < n; i++)
		out[i] = x[i] * r * w[i];
}

/* ---------------------------------------------------------------- AVX-512: sums 0-7 in a0, 8-15 in a1 */

#define TGT512 __attribute__((target("avx512f,avx2,fma")))

static TGT512 void rmsnorm_avx512(float *out, const float *x, const float *w, int n, float eps)
{
	__m512d a0 = _mm512_setzero_pd(), a1 = a0;
	for (int i = 0; i < n; i += LANES) {
		const __mmask16 m = n - i >= LANES ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
		const __m512 v = _mm512_maskz_loadu_ps(m, x + i); /* masked-off lanes are 0: they add nothing */
		_mm_prefetch((const char *)(w + i), _MM_HINT_T0); /* w is cold (one per layer): overlap its misses with x's */
		const __m512d v0 = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
		const __m512d v1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
		a0 = _mm512_fmadd_pd(v0, v0, a0);
		a1 = _mm512_fmadd_pd(v1, v1, a1);
	}
	const __m512d s8 = _mm512_add_pd(a0, a1);
	const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
	const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
	const double ss = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
	const __m512 rv = _mm512_set1_ps(inv_rms(ss, n, eps));
	for (int i = 0; i < n; i += LANES) {
		const __mmask16 m = n - i >= LANES ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
		const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv);
		_mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
	}
}

/* ---------------------------------------------------------------- the choice */

static const nx_rmsnorm_fn kernels[NX_KSET_N] = {
	[NX_KSET_REF] = rmsnorm_ref,
	[NX_KSET_AVX2] = rmsnorm_avx2,
	[NX_KSET_AVX512] = rmsnorm_avx512,
};

nx_rmsnorm_fn nx_rmsnorm_kernel(enum nx_kset k)
{
	return nx_kern_runs(NX_KFAM_NORM, k, nx_cpu_features()) ? kernels[k] : NULL;
}

/* Chosen on first use without locks (every caller picks the same), as kern/pack.c does. */
static _Atomic nx_rmsnorm_fn chosen;

void nx_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
	nx_rmsnorm_fn f = atomic_load_explicit(&chosen, memory_order_relaxed);
	if (!f) {
		f = kernels[nx_kern_set(NX_KFAM_NORM)];
		atomic_store_explicit(&chosen, f, memory_order_relaxed);
	}
	f(out, x, w, n, eps);
}
