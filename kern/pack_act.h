/* pack_act.h - the packed kernels' activation side values (kern/pack.h) with SIMD. */
#ifndef NX_PACK_ACT_H
#define NX_PACK_ACT_H

#include <stddef.h>
#include <stdint.h>

/* nx_pack_act_prep (kern/pack.h) of one token's hi and lo Q8_0 rows, bit-identical
 * to it; AVX2 where kern/cpu.c picks it for the pack_act family (not with NX_KERN=ref). */
void nx_pack_act_prep_fast(const void *hi, const void *lo, int64_t n_in, float *d, float *s, int32_t *c);

#endif
