/* vexp_avx512.h - e^x on 16 floats with AVX-512F, for the kernels that need it
 * (softmax in kern/attn_avx512.c, SiLU in kern/pack_avx512.c). Include only from
 * files built with AVX-512 target attributes. */
#ifndef NX_VEXP_AVX512_H
#define NX_VEXP_AVX512_H

#include <immintrin.h>

#define NX_VEXP_TGT __attribute__((always_inline, target("avx512f")))

/* 2^n * 2^f for f in [-0.5, 0.5]: p(f) of degree 6 (relative error ~2e-7),
 * scaled by 2^n (inf when that overflows, as expf does past 88.72). */
static inline NX_VEXP_TGT __m512 nx_vexp2(__m512 f, __m512 n)
{
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

/* e^x for x <= 0 (softmax arguments after the max is taken off): x log2 e
 * rounded, then split into n + f; below -87 the result is e^-87 ~ 1.6e-38,
 * which the sums it enters do not see. Relative error ~2e-7 near 0, growing to
 * ~2e-6 at -80 where the terms no longer count. */
static inline NX_VEXP_TGT __m512 nx_vexp_neg(__m512 x)
{
	const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504088896341f));
	const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	return nx_vexp2(_mm512_sub_ps(t, n), n);
}

/* e^x for any x, ~2e-7 relative throughout: f = x log2 e - n with log2 e in two
 * parts and fused steps, so it stays exact to ~1e-8 however large n is. inf
 * above ~88.72, e^-87 below -87 (what 1 + e^x and x / e^x, the uses here,
 * cannot tell from 0); a NaN x gives e^-87 (the callers' own arithmetic with x
 * keeps the NaN). */
static inline NX_VEXP_TGT __m512 nx_vexp(__m512 x)
{
	const __m512 l2e_hi = _mm512_set1_ps(1.44269502162933349609375f), l2e_lo = _mm512_set1_ps(1.925963033500011e-08f);
	x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(89.0f));
	const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, l2e_hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	return nx_vexp2(_mm512_fmadd_ps(x, l2e_lo, _mm512_fmsub_ps(x, l2e_hi, n)), n);
}

#endif
