/* pack_act.h - the packed kernels' activation side values (kern/pack.h) for several tokens at once, with SIMD. */
#ifndef NX_PACK_ACT_H
#define NX_PACK_ACT_H

#include <stddef.h>
#include <stdint.h>

/* nx_pack_act_prep for n_tok tokens of n_in elements, token i's hi row at
 * q + i * stride and its lo row lo bytes further, its d, s, c at d + i * nb, ...
 * (nb = n_in / 32), bit-identical to it; SIMD where the CPU has it (AVX2 and
 * F16C), unless NX_KERN=ref. */
void nx_pack_act_prep_tokens(const void *q, size_t stride, size_t lo, int n_tok, int64_t n_in, float *d, float *s,
			     int32_t *c);

#endif
