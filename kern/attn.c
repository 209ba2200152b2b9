/* attn.c - the scalar merge of attention spans (kern/attn.h): the reference nx_attn_merge's
 * AVX-512 version (attn_avx512.c) is held to bit for bit; and the scalar attention over a Q8_0
 * K/V cache. */

/* No fused multiply-add here: the AVX-512 merge rounds each product and each
 * sum on its own, and must match this whatever -march says. */
#pragma GCC optimize("fp-contract=off")

#include "kern/attn.h"

#include <math.h>

void nx_attn_merge_ref(float *out, const float *part, const float *ms, int n_head, int n_span, int hd)
{
	const size_t mstep = 2 * (size_t)n_head, pstep = (size_t)n_head * hd;
	for (int h = 0; h < n_head; h++) {
		const float *m = ms + 2 * (size_t)h;
		float mx = m[0], z = 0.0f;
		for (int c = 1; c < n_span; c++)
			mx = m[c * mstep] > mx ? m[c * mstep] : mx;
		float *o = out + (size_t)h * hd;
		for (int i = 0; i < hd; i++)
			o[i] = 0.0f;
		for (int c = 0; c < n_span; c++) {
			const float w = m[c * mstep + 1] * expf(m[c * mstep] - mx);
			const float *p = part + c * pstep + (size_t)h * hd;
			z += w;
			for (int i = 0; i < hd; i++)
				o[i] += w * p[i];
		}
		const float inv = 1.0f / z;
		for (int i = 0; i < hd; i++)
			o[i] *= inv;
	}
}

/* Value i of a row of Q8_0 blocks. */
static inline float q8_at(const struct nx_block_q8_0 *row, int i)
{
	return nx_f16_to_f32(row[i / QK8_0].d) * row[i / QK8_0].qs[i % QK8_0];
}

void nx_attend_q8_0_ref(float *out, const float *q, int n_q, const struct nx_block_q8_0 *kc,
			const struct nx_block_q8_0 *vc, int n, size_t ld, int hd, float scale, float *att, float *ms)
{
	for (int h = 0; h < n_q; h++, q += hd, out += hd) {
		float mx = -INFINITY;
		for (int j = 0; j < n; j++) {
			const struct nx_block_q8_0 *k = kc + (size_t)j * ld;
			float d = 0;
			for (int i = 0; i < hd; i++)
				d += q[i] * q8_at(k, i);
			att[j] = d * scale;
			if (att[j] > mx)
				mx = att[j];
		}
		float sum = 0;
		for (int j = 0; j < n; j++) {
			att[j] = expf(att[j] - mx);
			sum += att[j];
		}
		for (int i = 0; i < hd; i++)
			out[i] = 0;
		for (int j = 0; j < n; j++) {
			const struct nx_block_q8_0 *v = vc + (size_t)j * ld;
			for (int i = 0; i < hd; i++)
				out[i] += att[j] * q8_at(v, i);
		}
		const float inv = 1.0f / sum;
		for (int i = 0; i < hd; i++)
			out[i] *= inv;
		if (ms) {
			ms[2 * h] = mx;
			ms[2 * h + 1] = sum;
		}
	}
}
