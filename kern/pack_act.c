/* pack_act.c - side values of two-part Q8_0 activations for the packed kernels (kern/pack_act.h):
 * the reference is nx_pack_act_prep itself; the AVX2 version sums each block's levels with
 * one vpsadbw instead of widening them, and converts the f16 scale with F16C. */
#include "kern/pack_act.h"

#include "kern/cpu.h"
#include "kern/pack.h"
#include "kern/quant.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdbool.h>

#define TGT __attribute__((target("avx2,f16c")))

/* sum(q) of a block's levels: sum(q + 128) - 32 * 128, and q + 128 = q ^ 0x80 summed by vpsadbw against 0. */
static inline TGT int32_t block_sum(const struct nx_block_q8_0 *y)
{
	const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)y->qs), _mm256_set1_epi8((char)0x80));
	const __m256i sad = _mm256_sad_epu8(u, _mm256_setzero_si256());
	const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
	return _mm_cvtsi128_si32(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 32 * 128;
}

static TGT void prep_avx2(const void *hi, const void *lo, int64_t n_in, float *d, float *s, int32_t *c)
{
	const struct nx_block_q8_0 *yh = hi, *yl = lo;
	for (int64_t b = 0; b < n_in / 32; b++) {
		const int32_t t = 128 * block_sum(&yh[b]) + block_sum(&yl[b]);
		d[b] = _cvtsh_ss(yh[b].d) / 128; /* exact, as nx_f16_to_f32(d) / 128 */
		s[b] = d[b] * (float)t;
		c[b] = 128 * t;
	}
}

typedef void (*prep_fn)(const void *, const void *, int64_t, float *, float *, int32_t *);

/* Chosen on first use without locks (every caller picks the same), as kern/pack.c does. */
static _Atomic prep_fn chosen;

void nx_pack_act_prep_fast(const void *hi, const void *lo, int64_t n_in, float *d, float *s, int32_t *c)
{
	prep_fn f = atomic_load_explicit(&chosen, memory_order_relaxed);
	if (!f) {
		f = nx_kern_set(NX_KFAM_PACK_ACT) == NX_KSET_AVX2 ? prep_avx2 : nx_pack_act_prep;
		atomic_store_explicit(&chosen, f, memory_order_relaxed);
	}
	f(hi, lo, n_in, d, s, c);
}
