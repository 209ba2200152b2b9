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
 * A and B themselves. f32 inputs, f32 accumulation (nx_lora_dot_fast); x is
 * the f32 input of the matmul (before it is quantized for the weight's dot),
 * so the delta does not see activation-quantization error.
 *
 * s = user_scale * t->scale. Nothing here allocates or makes a syscall.
 *
 * Wiring it into model/forward.c (for whoever does): after a band's matmul
 * rows [lo, hi) of an adapted weight, for the tokens that use this adapter,
 * call nx_lora_delta with the matmul's f32 input (sc->xn, s->att_out, s->hb)
 * and its output (s->q, s->k, s->v, s->x for o/down residual adds, s->hb for
 * gate), u in the band's private scratch (max_batch * max rank floats).
 * Tokens of one step may use different adapters: call it once per run of
 * consecutive tokens with the same adapter (x/y strides stay the row strides),
 * or per token. ffn_up is fused into the SwiGLU pass (y = silu(gate) * up):
 * compute u = A_up @ xn first (nx_lora_delta_a), then inside the pass use
 * up = dot + s * nx_lora_delta_row(t, r, u_t) before multiplying. */
#ifndef NX_LORA_DELTA_H
#define NX_LORA_DELTA_H

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

/* sum_j a[j] * x[j] in f32, eight lanes (j mod 8, two 16-byte GCC vectors:
 * 32-byte ones on a build without AVX kept their sums on the stack, and
 * runtime LoRA decode ran at a third of its speed) summed pairwise, then the
 * lanes in a fixed order: the same result wherever a and x are and however
 * the caller bands its rows. */
typedef float nx_lora_v4 __attribute__((vector_size(16)));
static inline nx_lora_v4 nx_lora_ld4(const float *p)
{
	nx_lora_v4 v;
	__builtin_memcpy(&v, p, 16);
	return v;
}

static inline float nx_lora_dot(const float *a, const float *x, int64_t n)
{
	/* lanes 0-3 and 4-7 of two eight-lane sums, for j mod 16 < 8 and >= 8 */
	nx_lora_v4 s0 = {0}, s1 = {0}, t0 = {0}, t1 = {0};
	int64_t j = 0;
	for (; j + 16 <= n; j += 16) {
		s0 += nx_lora_ld4(a + j) * nx_lora_ld4(x + j);
		s1 += nx_lora_ld4(a + j + 4) * nx_lora_ld4(x + j + 4);
		t0 += nx_lora_ld4(a + j + 8) * nx_lora_ld4(x + j + 8);
		t1 += nx_lora_ld4(a + j + 12) * nx_lora_ld4(x + j + 12);
	}
	for (; j + 8 <= n; j += 8) {
		s0 += nx_lora_ld4(a + j) * nx_lora_ld4(x + j);
		s1 += nx_lora_ld4(a + j + 4) * nx_lora_ld4(x + j + 4);
	}
	s0 += t0;
	s1 += t1;
	float d = ((s0[0] + s1[0]) + (s0[1] + s1[1])) + ((s0[2] + s1[2]) + (s0[3] + s1[3]));
	for (; j < n; j++)
		d += a[j] * x[j];
	return d;
}

/* s-free delta of one output row for one token: sum_k B[r, k] * u[k]. */
float nx_lora_delta_row(const struct nx_lora_t *t, int64_t r, const float *u);

/* The dot product the functions above use: AVX-512 (sixteen lanes, fused
 * multiply-adds, a masked tail) where the CPU has it and NX_KERN is not ref
 * or avx2, else nx_lora_dot; chosen once, the same for every call. */
float nx_lora_dot_fast(const float *a, const float *x, int64_t n);

/* Flops of the delta per token (2 * rank * (n_in + n_out)). */
int64_t nx_lora_delta_flops(const struct nx_lora_t *t);

#endif
