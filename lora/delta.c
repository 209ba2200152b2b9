/* delta.c - the runtime LoRA delta y += s * B @ (A @ x), f32 throughout (eight-lane dots, nx_lora_dot). */
#include "lora/delta.h"

void nx_lora_delta_a(const struct nx_lora_t *t, const float *x, size_t ldx, int n, int k0, int k1, float *u,
		     size_t ldu)
{
	const int64_t n_in = t->n_in;
	for (int k = k0; k < k1; k++) {
		const float *a = t->a + (size_t)k * n_in;
		for (int i = 0; i < n; i++)
			u[(size_t)i * ldu + k] = nx_lora_dot(a, x + (size_t)i * ldx, n_in);
	}
}

void nx_lora_delta_b(const struct nx_lora_t *t, const float *u, size_t ldu, int n, float s, float *y, size_t ldy,
		     int64_t r0, int64_t r1)
{
	for (int64_t r = r0; r < r1; r++)
		for (int i = 0; i < n; i++)
			y[(size_t)i * ldy + r] += s * nx_lora_delta_row(t, r, u + (size_t)i * ldu);
}

void nx_lora_delta(const struct nx_lora_t *t, float s, const float *x, size_t ldx, int n, float *y, size_t ldy,
		   int64_t r0, int64_t r1, float *u)
{
	nx_lora_delta_a(t, x, ldx, n, 0, t->rank, u, (size_t)t->rank);
	nx_lora_delta_b(t, u, (size_t)t->rank, n, s, y, ldy, r0, r1);
}

int64_t nx_lora_delta_flops(const struct nx_lora_t *t)
{
	return 2 * (int64_t)t->rank * (t->n_in + t->n_out);
}
