/* delta.h - the runtime LoRA delta of the forward pass: y += s * B @ (A @ x), banded over output rows.
 *
 * For a matmul y = W x with an adapted W, the forward pass adds the delta
 * without touching W (the base carries no new error):
 *
 *   1. u = A @ x        u: (n, rank) per token; nx_lora_delta_a, rows [k0, k1)
 *                       of u so bands can share it (or each band computes all
 *                       of u privately: rank * n_in per token, small next to W)
 *   2. y += s * B @ u   output rows [r0, r1) of this band; nx_lora_delta_b
 *
 * Cost per token: 2 * rank * (n_in + n_out) flops (rank * n_in for A @ x,
 * rank * n_out for B @ u, one multiply-add each) and no memory traffic beyond
 * A and B themselves, which is what bounds it: they are read as held (f32, or
 * the adapter file's f16 / bf16, converted exactly in registers), f32
 * arithmetic and accumulation (nx_lora_dot_fast's); x is the f32 input of the
 * matmul (before it is quantized for the weight's dot), so the delta does not
 * see activation-quantization error.
 *
 * s = user_scale * t->scale. Nothing here allocates or makes a syscall.
 *
 * In model/forward.c each band computes u for an op's tokens (runs of
 * consecutive tokens with the same adapters) with nx_lora_delta_a before the
 * op's rows are shared out, then adds nx_lora_delta_b for every range of rows
 * it takes, to the matmul's output (s->q, s->k, s->v; s->x for o and down;
 * s->hb for gate; for up, fused into the SwiGLU, the W_up rows in lora_y
 * before the product). */
#ifndef NX_LORA_DELTA_H
#define NX_LORA_DELTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lora/adapter.h"

/* u[i * ldu + k] = sum_j A[k, j] * x[i * ldx + j] for tokens i < n and k in [k0, k1). */
void nx_lora_delta_a(const struct nx_lora_t *t, const float *x, size_t ldx, int n, int k0, int k1, float *u,
		     size_t ldu);

/* y[i * ldy + r] += s * sum_k B[r, k] * u[i * ldu + k] for tokens i < n and rows r in [r0, r1). */
void nx_lora_delta_b(const struct nx_lora_t *t, const float *u, size_t ldu, int n, float s, float *y, size_t ldy,
		     int64_t r0, int64_t r1);

/* Both steps for one band that computes all of u itself: u needs n * t->rank floats. */
void nx_lora_delta(const struct nx_lora_t *t, float s, const float *x, size_t ldx, int n, float *y, size_t ldy,
		   int64_t r0, int64_t r1, float *u);

/* s-free delta of one output row for one token: sum_k B[r, k] * u[k]. */
float nx_lora_delta_row(const struct nx_lora_t *t, int64_t r, const float *u);

/* sum_j a[j] * x[j], the dot product the functions above use: AVX-512
 * (sixteen lanes, fused multiply-adds, a masked tail) where kern/cpu.c picks
 * avx512 for the lora family, else eight f32 lanes of plain vectors; chosen
 * once, the same for every call, so a row's value never depends on the
 * caller's banding. */
float nx_lora_dot_fast(const float *a, const float *x, int64_t n);

/* True when the delta converts 16-bit A and B in registers (the AVX-512
 * kernels): only then do adapters stay in their file's f16 / bf16
 * (lora/adapter.c), since the plain-vector path would convert one value at a
 * time, slower than reading twice the bytes. */
bool nx_lora_fast16(void);

/* acc[j] += b[k] * A[k, j] for k = 0, 1, ... rank - 1 in turn and the n columns of A (rank rows of n
 * values held as d), in float64, each product and each sum rounded, as a scalar loop does it (AVX-512 where
 * the CPU has it: the same bits, 32 columns at a time). The fold's row of B @ A (lora/fold.c). */
void nx_lora_ba_f64(enum nx_lora_dtype d, const void *a, int64_t n, int rank, const double *b, double *acc);

/* out[p] = sum_j d[j] * xt[j * n_x + p] for p < n_x (xt: n rows of n_x), in float64 from 0 in order
 * of j, each product and each sum rounded (AVX-512 where the CPU has it: the same bits). The report's
 * dots of a row with every probe (lora/report.c). */
void nx_lora_dots_f64(const double *d, const double *xt, int64_t n, int n_x, double *out);

/* Flops of the delta per token (2 * rank * (n_in + n_out)). */
int64_t nx_lora_delta_flops(const struct nx_lora_t *t);

#endif
