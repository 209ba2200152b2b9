/* attn.h - attention of the query heads of one kv head over an f16 K/V cache, vectorized (AVX-512), for the
 * forward pass. */
#ifndef NX_ATTN_H
#define NX_ATTN_H

#include <stdbool.h>
#include <stddef.h>

#include "kern/quant.h"

/* True when nx_attend_f16 can run here for heads of hd dims (AVX-512 and hd a
 * multiple of 16); NX_KERN=ref or avx2: false. */
bool nx_attn_fast(int hd);

/* Heads of one kv head that nx_attend_f16 takes in one pass over K and V at hd
 * dims (more take further passes): what a caller should group by. Depends on hd
 * only, not on the CPU, so buffers sized by it are the same everywhere. */
int nx_attn_group(int hd);

/* n_q query heads sharing one kv head: for each head i < n_q,
 * out_i = sum_j p_j v_j with p = softmax(scale * q_i . k_j) over j < n, where
 * q_i = q + i * hd and out_i = out + i * hd (n_q x hd floats each), keys at
 * kc + j * ld and values at vc + j * ld (f16). att: scratch of
 * min(n_q, nx_attn_group(hd)) * n floats. ms: NULL, or n_q x 2 floats that
 * get each head's largest score (scale * q_i . k_j) and sum of e^(score -
 * largest), to merge outputs over parts of a longer range of keys.
 * Each head's output is bit-identical whatever n_q and the other heads are,
 * and deterministic for given inputs (no dependence on anything but them). */
void nx_attend_f16(float *out, const float *q, int n_q, const nx_f16 *kc, const nx_f16 *vc, int n, size_t ld,
		   int hd, float scale, float *att, float *ms);

#endif
