/* norm.h - RMS normalization of one activation row: the scalar reference and SIMD kernels, bit-identical. */
#ifndef NX_NORM_H
#define NX_NORM_H

#include "kern/cpu.h"

/* out[i] = x[i] * r * w[i] (two float products, in that order) for i < n, with
 * r = (float)(1 / sqrt(ss / n + eps)) in double and ss = sum of x[i]^2 in double,
 * summed in a fixed order: 16 partial sums, element i into sum i % 16, then
 * halves added pairwise (8 sums, 4, 2, 1). Each x[i]^2 is exact in double, so a
 * fused multiply-add changes nothing and every kernel gives the same bits: a
 * token's result depends neither on the CPU's kernel set nor on its batch.
 * out may be x. */
typedef void (*nx_rmsnorm_fn)(float *out, const float *x, const float *w, int n, float eps);

/* The kernel of set k; NULL when this CPU cannot run it. */
nx_rmsnorm_fn nx_rmsnorm_kernel(enum nx_kset k);
/* The engine's: the set kern/cpu.c picks for the norm family. */
void nx_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

#endif
