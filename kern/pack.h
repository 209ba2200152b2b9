/* pack.h - row-interleaved ("packed") weight layouts and their tile kernels.
 *
 * A packed matrix stores NX_PACK_ROWS = 16 rows together, block by block, so one
 * 512-bit load holds 4 bytes of each of the 16 rows (one int32 lane per row) and
 * one vpdpbusd against a broadcast 4-byte activation word does 64 products for
 * 16 rows at once: no per-row shuffles, no horizontal sums. A kernel call dots
 * one group of 16 rows with the activations of up to NX_PACK_ACT_MAX tokens,
 * unpacking each weight block once for all of them (batched decode, prefill).
 *
 * Layout of group g (rows 16g .. 16g+15, lane r = row 16g + r), for each block b
 * of 32 elements in order:
 *   q4_1 (320 bytes): d[16] f16, m[16] f16, then for c = 0..3 a 64-byte vector
 *         whose lane r is qs[4c .. 4c+3] of row r (low nibbles: elements 4c..4c+3,
 *         high nibbles: 16+4c .. 16+4c+3)
 *   q8_0 (544 bytes): d[16] f16, then for c = 0..7 a 64-byte vector whose lane r
 *         is qs[4c .. 4c+3] of row r, each byte ^ 0x80 (q + 128, unsigned for vpdpbusd)
 *   q4_0 (288 bytes): d[16] f16, then the 4 nibble vectors of q4_1, q unsigned
 *         0..15 (value q - 8)
 *   q5_0 (352 bytes): d[16] f16, h[8] u64 little-endian, then the 4 nibble vectors of q4_1;
 *         the low 4 bits of q (0..31, value q - 16) are in the nibbles and bit
 *         4 * r + k of mask h[j] is bit 4 of the element in byte 4 * r + k of
 *         the low (j < 4: vector j) or high (j >= 4: vector j - 4) nibbles, that
 *         is nibble j of row r's qh
 *   q5_1 (384 bytes): d[16] f16, m[16] f16, h[8] u64, the 4 nibble vectors, as q5_0
 *         with q unsigned 0..31
 *   iq4_nl (288 bytes): as q4_0, the nibbles indexing the grid (value grid[q]); the
 *         kernels look up grid[q] + 128 (unsigned, as q8_0's codes)
 * The k-quants and iq4_xs (kern/pack_k.c) go super-block by super-block (256 elements),
 * activation block b being sub-block b % 8 (q6_k: halves 2b, 2b + 1). Each
 * super-block holds its scales first, then its quants in the order the kernels
 * read them (kern/pack_k.h has the offsets):
 *   q4_k (2304 bytes): sc[8][16] bytes, sc[j][r] = scale j of row r
 *         | (min j >> 4) << 6; mlo[4][16], mlo[c][r] = low 4 bits of min 2c
 *         | those of min 2c + 1 << 4; d[16] f16; dmin[16] f16; then for
 *         c = 0..3, w = 0..7 a vector whose lane r is qs[32c + 4w .. +3] of
 *         row r (low nibbles: sub-block 2c, high: 2c + 1, elements 4w .. 4w+3)
 *   q5_k (2816 bytes): q4_k's sc, mlo, d, dmin; then for w = 0..7 a vector whose
 *         lane r is qh[4w .. +3] of row r (bit j: bit 4 of sub-block j's q);
 *         then q4_k's 32 vectors
 *   q6_k (3360 bytes): d[16] f16; sc[16][16] int8, sc[g][r] = scale g of row r;
 *         then for block j = 0..7 and half f = 0..1 three vectors X, Y, Z
 *         holding words w = 4f .. 4f+3 (elements 4w .. 4w+3 of the block; lane r:
 *         row r): q of word 4f, 4f+1, 4f+2 in the low 6 bits of X, Y, Z and q of
 *         word 4f+3 in their top 2 bits (X: bits 0-1 of it, Y: 2-3, Z: 4-5).
 *         q is ggml's, unsigned 0..63 (value q - 32), whole instead of split
 *         over ql, qh
 *   iq4_xs (2176 bytes): sl[4][16], sl[c][r] = scales_l[c] of row r; sh[16] u16,
 *         row r's scales_h; d[16] f16; then for sub-block j = 0..7 the 4 nibble
 *         vectors of q4_1 (lane r: qs[16j + 4c .. +3] of row r). The kernels
 *         look the nibbles up as grid[q] + 128, as iq4_nl's
 *   q2_k (1344 bytes): sc[16][16], sc[g][r] = ggml's scales[g] of row r (scale
 *         | min << 4); d[16] f16; dmin[16] f16; then for block j = 0..7 and
 *         half f = 0..1 a vector whose lane r holds words 4f .. 4f+3 of the
 *         block (elements 4w .. 4w+3, w = 4f + s) of row r: the 2-bit level of
 *         element 4w + k at bits 2s of byte k
 *   q3_k (1760 bytes): sl[8][16], sl[j][r] = low 4 bits of scale 2j | those of
 *         scale 2j + 1 << 4; sh[4][16], sh[c][r] = top 2 bits of scale 4c + i
 *         at bits 2i; d[16] f16; then q2_k's 16 vectors (the low 2 bits of q,
 *         ggml's qs); then for block j = 0..7 a vector whose lane r holds the
 *         third bit (ggml's hmask) of element 4w + k of the block at bit w of
 *         byte k. q is 0..7 (value q - 4), a scale 0..63 (value s - 32)
 * Their activations are Q8_0 rows too, not Q8_K (the plain kernels'): a 32-wide
 * sub-block is one Q8_0 block; q6_k, q2_k and q3_k need one more side value
 * per 16 (c16: nx_pack_needs_c16).
 * Their fixed arithmetic is in kern/pack_k.c.
 * A group takes exactly the bytes of its 16 plain rows (16 x row_bytes), so a
 * matrix packs in place and rows [16a, 16b) keep their byte range.
 *
 * Activations are two-part Q8_0 (kern/quant.h, quant2: lo's scale is hi's / 128)
 * plus per-block side values (nx_pack_act_prep). Per (row, token) and block, the
 * kernel takes the exact integer dots of the weights with hi and lo and forms
 * 128 * dot(hi) + dot(lo) in int32 (|.| < 2^28), so the float steps are those of
 * one activation row with lo's scale. That arithmetic is fixed (see kern/pack.c):
 * the float steps are the same fused multiply-adds in the reference and the
 * SIMD kernel, so the two are bit-identical, and a row's result does not depend
 * on how many tokens share the call. It differs from the plain kernels' dot(w,
 * hi) + dot(w, lo) only by float rounding (tests/c/test_pack.c bounds it). */
#ifndef NX_PACK_H
#define NX_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kern/quant.h"

#define NX_PACK_ROWS 16
#define NX_PACK_ACT_MAX 8 /* tokens per kernel call */
#define NX_PACK_AMX_MAX 16 /* tokens per AMX kernel call */

/* True when type t has a packed layout (whatever the CPU): q4_0, q4_1, q5_0,
 * q5_1, q8_0, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs. */
bool nx_pack_layout(enum nx_type t);
/* True when t's tile kernels read nx_pack_act.c16 (the per-16 activation sums): q2_k, q3_k, q6_k. */
bool nx_pack_needs_c16(enum nx_type t);
/* True when this CPU has a SIMD kernel for t's packed layout: only then is
 * packing worth it (the reference kernel is for tests). False unless kern/cpu.c
 * picks avx512 or amx for the pack family (so with NX_KERN=ref or avx2). */
bool nx_pack_fast(enum nx_type t);

/* Packs 16 plain rows (row r at rows + r * row_bytes, n_in elements each) into
 * one group at dst (16 * row_bytes bytes; must not overlap rows). */
void nx_pack_group(enum nx_type t, const void *rows, size_t row_bytes, void *dst, int64_t n_in);
/* Row r (< 16) of a packed group back in the plain layout at dst (row_bytes bytes). */
void nx_unpack_row(enum nx_type t, const void *group, int r, void *dst, int64_t n_in);

/* Two-part Q8_0 activations of a few tokens and their side values. Per token i
 * and block b, with Sh = sum(q) over hi's block, Sl over lo's (halves: over 16):
 *   d[b] = lo's scale as a float (hi's / 128)
 *   s[b] = d[b] * (float)(128 * Sh + Sl)     (the min term's factor)
 *   c[b] = 128 * (128 * Sh + Sl)             (offsets of unsigned weight codes)
 *   c16[2b + h] = -32 * (128 * Sh_h + Sl_h)  (q6_k's offset, per half h; q3_k's / 8, q2_k's min factor)
 * token i's at d + i * nb, ..., c16 + 2 * i * nb. */
struct nx_pack_act {
	const uint8_t *q; /* token i's hi row at q + i * stride, its lo row at q + i * stride + lo */
	size_t stride, lo;
	const float *d, *s;
	const int32_t *c;
	int64_t nb;         /* blocks per row */
	const int32_t *c16; /* only where nx_pack_needs_c16; else may be NULL */
	bool lo_zero;       /* every lo row is all zeros (one-part activations): a kernel may skip them */
};
/* The quants of token i's hi (part 0) or lo (part 1) block b. */
static inline const int8_t *nx_pack_act_qs(const struct nx_pack_act *a, int i, int part, int64_t b)
{
	return ((const struct nx_block_q8_0 *)(a->q + (size_t)i * a->stride + (part ? a->lo : 0)))[b].qs;
}
/* Fills d, s, c (nb = n_in / 32 entries each) for one token's hi and lo rows. */
void nx_pack_act_prep(const void *hi, const void *lo, int64_t n_in, float *d, float *s, int32_t *c);
/* Fills c16 (2 * n_in / 32 entries) for one token's hi and lo rows. */
void nx_pack_act_prep_c16(const void *hi, const void *lo, int64_t n_in, int32_t *c16);

/* out[i * 16 + r] = row r of the group . token i's activation (hi + lo), for
 * i < n_act (1 <= n_act <= NX_PACK_ACT_MAX) and r < 16. */
typedef void (*nx_pack_fn)(const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in);
/* What becomes of a group's results in the matmul's output (model/forward.c). */
enum nx_pack_op {
	NX_PACK_STORE,  /* y = out (+ bias) */
	NX_PACK_ADD,    /* y += out        (the residual) */
	NX_PACK_SWIGLU, /* y = silu(y) * out = y / (1 + e^-y) * out, y holding the gate */
};
/* For tokens i < n_act and r < 16: y[i][r] op= out[i * 16 + r] (bias: NULL or
 * 16 floats, STORE only). */
typedef void (*nx_pack_epi_fn)(enum nx_pack_op op, float *const *y, const float *out, const float *bias, int n_act);
/* The engine's: SIMD where the tile kernels are (STORE and ADD bit-identical to
 * the reference, SWIGLU within its e^x's ~2e-7), else the reference. */
nx_pack_epi_fn nx_pack_epilogue(void);
nx_pack_epi_fn nx_pack_epilogue_ref(void);

/* The kernel the engine uses (SIMD when nx_pack_fast, else the reference); NULL without a layout. */
nx_pack_fn nx_pack_kernel(enum nx_type t);
/* The scalar reference kernel; NULL without a layout. */
nx_pack_fn nx_pack_kernel_ref(enum nx_type t);

/* The AMX-INT8 kernels (kern/pack_amx.c): as nx_pack_fn but for n_act up to
 * NX_PACK_AMX_MAX, each result bit-identical to the AVX-512 kernel's and the
 * reference's. For q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, q4_k, q5_k and q6_k; NULL
 * for the other types. The engine's: where kern/cpu.c picks amx for the pack
 * family (the CPU has AMX-INT8, Linux gave the tile state, NX_KERN allows
 * amx), else NULL; but with NXD_TEST_AMX_EMULATE, where the pack family runs
 * avx512, the emulated kernels. */
nx_pack_fn nx_pack_kernel_amx(enum nx_type t);
/* The kernels themselves: emulated, every tile instruction done in scalar code
 * as the ISA defines it (for tests; needs what the AVX-512 kernels need), or
 * not (call only where nx_kern_set(NX_KFAM_PACK) is NX_KSET_AMX). */
nx_pack_fn nx_pack_amx_kernel(enum nx_type t, bool emulated);
/* Runs each of the engine's AMX kernels (nx_pack_kernel_amx) once on fixed
 * pseudo-random weights and 16 tokens against its AVX-512 kernel: where one
 * differs by a bit, -1 naming the type, and no AMX kernel is offered from
 * then on. At start, before the fork, so that a CPU whose tiles compute
 * otherwise than kern/pack_amx.c expects cannot change a result. */
int nx_pack_amx_check(struct nx_err *err);
/* The pack family's kernels as they run: "amx", "amx-emulated" (NXD_TEST_AMX_EMULATE),
 * else the name of its set ("avx512" also where the check turned the AMX ones off). */
const char *nx_pack_kernels_name(void);

#endif
