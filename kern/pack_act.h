/* pack_act.h - the packed kernels' activation side values (kern/pack.h) for several Q8_0 rows at once, with SIMD. */
#ifndef NX_PACK_ACT_H
#define NX_PACK_ACT_H

#include <stddef.h>
#include <stdint.h>

/* nx_pack_act_prep of n_rows Q8_0 rows of n_in elements, row i at q + i * stride,
 * its d, s, c at d + i * nb, ... (nb = n_in / 32), bit-identical to it; SIMD
 * where the CPU has it (AVX2 and F16C), unless NX_KERN=ref. */
void nx_pack_act_prep_rows(const void *q, size_t stride, int n_rows, int64_t n_in, float *d, float *s, int32_t *c);

#endif
