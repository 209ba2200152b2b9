/* pack_acts.h - the packed-kernel tests' activations (test_pack.c, test_pack_k.c): n
 * tokens' two-part Q8_0 rows of n_in elements (kern/quant.h: quant2), token i's
 * hi row at q + i * stride and its lo row rs bytes further, with their side
 * values (kern/pack.h: nx_pack_act_prep, c16 too); deq: hi + lo as floats. */
#ifndef NX_TEST_PACK_ACTS_H
#define NX_TEST_PACK_ACTS_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kern/pack.h"
#include "tests/c/rng.h"

struct acts {
	uint8_t *q;
	float *deq, *d, *s;
	int32_t *c, *c16;
	size_t stride, rs;
	int64_t nb;
	struct nx_pack_act a;
};

/* random_bytes: both parts' levels random, down to -128 (which quant2 never
 * writes), lo's scale hi's / 128; else quant2 of activation-like values, some
 * blocks small enough (amax / 127 < 2^-7) for quant2's rounded-up scale. */
static void acts_make(struct acts *x, int n, int64_t n_in, bool random_bytes)
{
	const struct nx_type_traits *q8 = nx_type_ref(NX_Q8_0);
	x->rs = (size_t)nx_row_size(NX_Q8_0, n_in);
	x->stride = 2 * x->rs;
	x->nb = n_in / 32;
	x->q = malloc(x->stride * n);
	x->deq = malloc(sizeof(float) * n_in * n);
	x->d = malloc(sizeof(float) * x->nb * n);
	x->s = malloc(sizeof(float) * x->nb * n);
	x->c = malloc(sizeof(int32_t) * x->nb * n);
	x->c16 = malloc(sizeof(int32_t) * 2 * x->nb * n);
	float *f = malloc(sizeof(float) * n_in), *lo = malloc(sizeof(float) * n_in);
	for (int i = 0; i < n; i++) {
		uint8_t *hi = x->q + i * x->stride;
		if (random_bytes) {
			for (int64_t b = 0; b < x->nb; b++) {
				struct nx_block_q8_0 *hb = (struct nx_block_q8_0 *)hi + b;
				struct nx_block_q8_0 *lb = (struct nx_block_q8_0 *)(hi + x->rs) + b;
				hb->d = nx_f32_to_f16(0.01f + fabsf(rng_sym()));
				lb->d = nx_f32_to_f16(nx_f16_to_f32(hb->d) / 128); /* exact: lo's scale is hi's / 128 */
				for (int k = 0; k < 32; k++) {
					hb->qs[k] = (int8_t)(k % 7 == 0 ? -128 : (int)(rng_next() & 255) - 128);
					lb->qs[k] = (int8_t)(k % 5 == 0 ? -128 : (int)(rng_next() & 255) - 128);
				}
			}
		} else {
			for (int64_t k = 0; k < n_in; k++)
				f[k] = rng_sym() * (1 + (k % 13 == 0) * 20) * (k % 64 < 32 ? 1 : 0.003f);
			q8->quant2(f, hi, hi + x->rs, n_in);
		}
		q8->dequant(hi, x->deq + i * n_in, n_in);
		q8->dequant(hi + x->rs, lo, n_in);
		for (int64_t k = 0; k < n_in; k++)
			x->deq[i * n_in + k] += lo[k];
		nx_pack_act_prep(hi, hi + x->rs, n_in, x->d + i * x->nb, x->s + i * x->nb, x->c + i * x->nb);
		nx_pack_act_prep_c16(hi, hi + x->rs, n_in, x->c16 + 2 * i * x->nb);
	}
	free(f);
	free(lo);
	x->a = (struct nx_pack_act){x->q, x->stride, x->rs, x->d, x->s, x->c, x->nb, x->c16, false};
}

/* The one-part form of x's n tokens (nxd --activations fast): every lo row
 * zeros, the side values and deq of hi alone, and lo_zero set, so that the
 * kernels may skip the lo part. */
static void acts_zero_lo(struct acts *x, int n, int64_t n_in)
{
	const struct nx_type_traits *q8 = nx_type_ref(NX_Q8_0);
	for (int i = 0; i < n; i++) {
		uint8_t *hi = x->q + i * x->stride;
		memset(hi + x->rs, 0, x->rs);
		q8->dequant(hi, x->deq + i * n_in, n_in);
		nx_pack_act_prep(hi, hi + x->rs, n_in, x->d + i * x->nb, x->s + i * x->nb, x->c + i * x->nb);
		nx_pack_act_prep_c16(hi, hi + x->rs, n_in, x->c16 + 2 * i * x->nb);
	}
	x->a.lo_zero = true;
}

static void acts_free(struct acts *x)
{
	free(x->q);
	free(x->deq);
	free(x->d);
	free(x->s);
	free(x->c);
	free(x->c16);
}

/* The tokens from i0 on, as a kernel call sees them. */
static struct nx_pack_act acts_from(const struct acts *x, int i0)
{
	struct nx_pack_act a = x->a;
	a.q += (size_t)i0 * x->stride;
	a.d += i0 * x->nb;
	a.s += i0 * x->nb;
	a.c += i0 * x->nb;
	a.c16 += 2 * i0 * x->nb;
	return a;
}

#endif
