/* pack.h - row-interleaved ("packed") weight layouts and their tile kernels.
 *
 * A packed matrix stores NX_PACK_ROWS = 16 rows together, block by block, so one
 * 512-bit load holds 4 bytes of each of the 16 rows (one int32 lane per row) and
 * one vpdpbusd against a broadcast 4-byte activation word does 64 products for
 * 16 rows at once: no per-row shuffles, no horizontal sums. A kernel call dots
 * one group of 16 rows with up to NX_PACK_ACT_MAX activation rows, unpacking each
 * weight block once for all of them (batched decode, prefill).
 *
 * Layout of group g (rows 16g .. 16g+15, lane r = row 16g + r), for each block b
 * of 32 elements in order:
 *   q4_1 (320 bytes): d[16] f16, m[16] f16, then for c = 0..3 a 64-byte vector
 *         whose lane r is qs[4c .. 4c+3] of row r (low nibbles: elements 4c..4c+3,
 *         high nibbles: 16+4c .. 16+4c+3)
 *   q8_0 (544 bytes): d[16] f16, then for c = 0..7 a 64-byte vector whose lane r
 *         is qs[4c .. 4c+3] of row r, each byte ^ 0x80 (q + 128, unsigned for vpdpbusd)
 * A group takes exactly the bytes of its 16 plain rows (16 x row_bytes), so a
 * matrix packs in place and rows [16a, 16b) keep their byte range.
 *
 * Activations are Q8_0 rows (the vec_dot_type of both) plus per-block side
 * values (nx_pack_act_prep). The arithmetic per (row, activation row), block by
 * block, is fixed (see kern/pack.c): the integer block sums are exact and the
 * float steps are the same fused multiply-adds in the reference and the SIMD
 * kernel, so the two are bit-identical, and a row's result does not depend on
 * how many activation rows share the call. It differs from the plain kernels'
 * result only by float rounding (tests/c/test_pack.c bounds it). */
#ifndef NX_PACK_H
#define NX_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern/quant.h"

#define NX_PACK_ROWS 16
#define NX_PACK_ACT_MAX 8

/* True when type t has a packed layout (whatever the CPU). */
bool nx_pack_layout(enum nx_type t);
/* True when this CPU has a SIMD kernel for t's packed layout: only then is
 * packing worth it (the reference kernel is for tests). NX_KERN=ref: false. */
bool nx_pack_fast(enum nx_type t);

/* Packs 16 plain rows (row r at rows + r * row_bytes, n_in elements each) into
 * one group at dst (16 * row_bytes bytes; must not overlap rows). */
void nx_pack_group(enum nx_type t, const void *rows, size_t row_bytes, void *dst, int64_t n_in);
/* Row r (< 16) of a packed group back in the plain layout at dst (row_bytes bytes). */
void nx_unpack_row(enum nx_type t, const void *group, int r, void *dst, int64_t n_in);

/* Side values of Q8_0 activation rows, per block b: d[b] = the block scale as a
 * float, s[b] = d[b] * sum(q), c[b] = 128 * sum(q). Row i's at d + i * nb, ... */
struct nx_pack_act {
	const uint8_t *q; /* Q8_0 row i at q + i * stride */
	size_t stride;
	const float *d, *s;
	const int32_t *c;
	int64_t nb; /* blocks per row */
};
/* Fills d, s, c (nb = n_in / 32 entries each) for one Q8_0 row. */
void nx_pack_act_prep(const void *q8_0_row, int64_t n_in, float *d, float *s, int32_t *c);

/* out[i * 16 + r] = row r of the group . activation row i, for i < n_act
 * (1 <= n_act <= NX_PACK_ACT_MAX) and r < 16. */
typedef void (*nx_pack_fn)(const void *group, const struct nx_pack_act *a, int n_act, float *out, int64_t n_in);
/* The kernel the engine uses (SIMD when nx_pack_fast, else the reference); NULL without a layout. */
nx_pack_fn nx_pack_kernel(enum nx_type t);
/* The scalar reference kernel; NULL without a layout. */
nx_pack_fn nx_pack_kernel_ref(enum nx_type t);

#endif
