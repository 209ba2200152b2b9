/* attn.c - the scalar merge of attention spans (kern/attn.h): the reference nx_attn_merge's
 * AVX-512 version (attn_avx512.c) is held to bit for bit. */

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
