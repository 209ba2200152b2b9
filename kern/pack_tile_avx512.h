/* pack_tile_avx512.h - what the AVX-512 tile kernel files (pack_avx512.c, pack_k_avx512.c) share:
 * their target attributes, the broadcast of an activation word, and the
 * per-NA instancing of a kernel. Include only from those files. */
#ifndef NX_PACK_TILE_AVX512_H
#define NX_PACK_TILE_AVX512_H

#include <immintrin.h>
#include <string.h>

#include "kern/pack.h"

#define TGT_STR "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c"
#define TGT __attribute__((target(TGT_STR)))
#define INL static inline __attribute__((always_inline, target(TGT_STR)))

/* The 4 quant bytes at k of token i's hi (part 0) or lo (part 1) block b, in every int32 lane. */
INL __m512i act4(const struct nx_pack_act *a, int i, int part, int64_t b, int k)
{
	int32_t v;
	memcpy(&v, nx_pack_act_qs(a, i, part, b) + k, 4);
	return _mm512_set1_epi32(v);
}

/* _mm512_dpbusd_epi32(acc, w, act4(a, i, part, b, k)) with the word as an
 * embedded broadcast of the instruction's memory operand (GCC does not fold
 * the set1 into it). With the weights in L2 (nx-packbench -c -t 1) Q4_1's
 * tile took 1.29-1.31 ms per step at 1 token instead of 1.36-1.39, 2.32 at 2
 * instead of 2.41-2.43, the same at 4; q8_0's, which loads twice the weight
 * vectors per block, took 1.96-2.04 at 1 token instead of 1.75, so it keeps act4. */
INL __m512i dp4(__m512i acc, __m512i w, const struct nx_pack_act *a, int i, int part, int64_t b, int k)
{
	const int8_t *p = nx_pack_act_qs(a, i, part, b) + k;
	__asm__("vpdpbusd %[m]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [m] "m"(*(const int32_t *)p));
	return acc;
}

/* dp4 of token i's lo part, or acc itself when the lo rows are zeros (LO false,
 * a compile-time constant): adding nothing leaves the same bits. */
INL __m512i dp4_lo(__m512i acc, __m512i w, const struct nx_pack_act *a, int i, int64_t b, int k, const bool LO)
{
	return LO ? dp4(acc, w, a, i, 1, b, k) : acc;
}

/* Bytes ahead of the weights in use that the kernels ask the cache for. With
 * the hardware prefetchers alone the 4-token tiles waited on memory: SmolLM2
 * decode of 4 sequences (nx-perf --seqs 4, 2 threads) went from 586-626 to
 * 675-717 tok/s in Q4_1 and from 536-556 to 684-733 in Q4_K_M with this; one
 * sequence, already streaming at the memory's pace, did not change (2048: less
 * gain, 8192: the same). Past the end of a matrix it asks for bytes nobody
 * uses; a prefetch never faults.
 *
 * Tiles of more than one token, which spend longer on each block, ask
 * further ahead and into L2 (NX_PF_AHEAD_MT, prefetcht1). The Q8_0 tile at 4 tokens
 * (nx-packbench -T q8_0 -t 2 -a 4, four alternating runs) streamed 20-28 GB/s
 * with prefetcht0 4 KiB ahead, 30-38 with prefetcht1 8 KiB ahead; the Q4_1 one
 * (bound by its dot products there) and every 1-token tile did not change,
 * and the qwen2 shape's 1-token step was 4-7% slower with prefetcht1 (two
 * runs), hence only for NA > 1. */
#ifndef NX_PF_AHEAD
#define NX_PF_AHEAD 4096
#endif
#ifndef NX_PF_AHEAD_MT
#define NX_PF_AHEAD_MT 8192
#endif

/* Asks for the `bytes` (a compile-time constant) ahead of o, for a tile of NA tokens (a compile-time constant). */
INL void pf_ahead(const uint8_t *o, const int bytes, const int NA)
{
	for (int l = 0; l < bytes; l += 64)
		if (NA > 1)
			_mm_prefetch((const char *)o + NX_PF_AHEAD_MT + l, _MM_HINT_T1);
		else
			_mm_prefetch((const char *)o + NX_PF_AHEAD + l, _MM_HINT_T0);
}

/* 128 * hi + lo of a token's integer block dots (kern/pack.h: |.| < 2^28). */
INL __m512i comb(__m512i hi, __m512i lo)
{
	return _mm512_add_epi32(_mm512_slli_epi32(hi, 7), lo);
}

/* NAME_tile for n_act tokens (1..4), NA a compile-time constant per case. */
#define TILE_CASES(name, LO)                                                    \
	switch (n_act) {                                                        \
	case 1: name##_tile(g, a, 1, out, n, LO); break;                        \
	case 2: name##_tile(g, a, 2, out, n, LO); break;                        \
	case 3: name##_tile(g, a, 3, out, n, LO); break;                        \
	default: name##_tile(g, a, 4, out, n, LO); break;                       \
	}

/* pk_NAME(group, act, n_act, out, n_in): NAME_tile with NA (tokens) and LO
 * (whether the lo part is dotted: not when act->lo_zero) compile-time
 * constants per case, so its accumulators live in registers. */
#define TILE_FN(name)                                                                                         \
	static TGT void pk_##name(const void *g, const struct nx_pack_act *a, int n_act, float *out, int64_t n) \
	{                                                                                                     \
		if (a->lo_zero)                                                                               \
			TILE_CASES(name, false)                                                               \
		else                                                                                          \
			TILE_CASES(name, true)                                                                \
	}

#endif
