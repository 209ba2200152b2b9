/* attn.h - attention of the query heads of one kv head over an f16 or Q8_0 K/V cache, vectorized (AVX-512),
 * for the forward pass. */
#ifndef NX_ATTN_H
#define NX_ATTN_H

#include <stdbool.h>
#include <stddef.h>

#include "kern/quant.h"

/* True when nx_attend_f16 can run here for heads of hd dims: kern/cpu.c picks
 * avx512 for the attn family (not with NX_KERN=ref or avx2), and hd is a
 * multiple of 16. */
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
 * and deterministic for given inputs (no dependence on anything but them).
 * next_k: NULL, or the next_n key rows (ld apart) the caller attends to next,
 * which are prefetched toward L2 while the values are summed: a hint, never
 * loaded from, without effect on the output. */
void nx_attend_f16(float *out, const float *q, int n_q, const nx_f16 *kc, const nx_f16 *vc, int n, size_t ld,
		   int hd, float scale, float *att, float *ms, const void *next_k, int next_n);

/* nx_attend_f16 over a Q8_0 cache: key and value j are the hd / 32 blocks at
 * kc + j * ld and vc + j * ld (ld in blocks), each value d * q. That product is
 * exact in float (an 8-bit level times an f16 scale), so after it the
 * arithmetic is nx_attend_f16's, operation for operation: on values that both
 * formats hold exactly the two give the same bits. Same scratch, ms,
 * next_k and per-head guarantees; hd % 32 == 0. */
void nx_attend_q8_0(float *out, const float *q, int n_q, const struct nx_block_q8_0 *kc,
		    const struct nx_block_q8_0 *vc, int n, size_t ld, int hd, float scale, float *att, float *ms,
		    const void *next_k, int next_n);
/* The scalar reference (any CPU, any hd % 32 == 0), head by head: scores summed
 * element by element, softmax with expf, then the weighted sum of values. */
void nx_attend_q8_0_ref(float *out, const float *q, int n_q, const struct nx_block_q8_0 *kc,
			const struct nx_block_q8_0 *vc, int n, size_t ld, int hd, float scale, float *att, float *ms);

/* One token's attention output, n_head heads of hd floats, over n_span spans of
 * its keys, from each span's output (softmax within the span) part[c][h] =
 * part + (c * n_head + h) * hd and its largest score and sum ms[c][h] = ms +
 * 2 * (c * n_head + h) = (m_c, l_c), as nx_attend_f16 gives them: the spans'
 * outputs weighted by l_c e^(m_c - m), m the largest m_c, summed in span order,
 * over the weights' sum. Vectorized (AVX-512) where nx_attn_fast(hd) holds,
 * bit-identical to nx_attn_merge_ref: every product and sum rounded on its own,
 * in the same order. */
void nx_attn_merge(float *out, const float *part, const float *ms, int n_head, int n_span, int hd);
void nx_attn_merge_ref(float *out, const float *part, const float *ms, int n_head, int n_span, int hd);

#endif
