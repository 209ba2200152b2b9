/* attn.h - attention of one query head over an f16 K/V cache, vectorized (AVX-512), for the forward pass. */
#ifndef NX_ATTN_H
#define NX_ATTN_H

#include <stdbool.h>
#include <stddef.h>

#include "kern/quant.h"

/* True when nx_attend_f16 can run here for heads of hd dims (AVX-512 and hd a
 * multiple of 16); NX_KERN=ref or avx2: false. */
bool nx_attn_fast(int hd);

/* out[0..hd) = sum_j p_j v_j with p = softmax(scale * q . k_j) over j < n, keys
 * at kc + j * ld and values at vc + j * ld (f16). att: n floats of scratch.
 * Deterministic for given inputs (no dependence on anything but them). */
void nx_attend_f16(float *out, const float *q, const nx_f16 *kc, const nx_f16 *vc, int n, size_t ld, int hd,
		   float scale, float *att);

#endif
