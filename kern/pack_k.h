/* pack_k.h - the super-block types' packed layouts (q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs: kern/pack_k.c, kern/pack_k_avx512.c), reached through kern/pack.c. */
#ifndef NX_PACK_K_H
#define NX_PACK_K_H

#include "kern/pack.h"

/* True for the super-block types with a packed layout: q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs. */
bool nx_pack_k_type(enum nx_type t);
void nx_pack_k_group(enum nx_type t, const void *rows, size_t row_bytes, void *dst, int64_t n_in);
void nx_unpack_k_row(enum nx_type t, const void *group, int r, void *dst, int64_t n_in);
nx_pack_fn nx_pack_k_kernel_ref(enum nx_type t);
/* The AVX-512 VNNI kernels (kern/pack_k_avx512.c); call only where kern/cpu.c picks avx512 or amx for the pack family. */
nx_pack_fn nx_pack_k_avx512_kernel(enum nx_type t);

/* Offsets inside one super-block of a group (kern/pack.h describes the layouts).
 * Each super-block begins with the scales its kernel reads first, then the
 * quants in the order it reads them, so a tile streams its group front to back
 * and the prefetch ahead of the quants (pf_ahead) reaches the next scales as
 * early as the next quants. */
#define PK_K4_HDR 0                   /* q4_k, q5_k: sc[8][16], mlo[4][16], d[16], dmin[16] */
#define PK_K4_SC 0
#define PK_K4_MLO 128
#define PK_K4_D 192
#define PK_K4_DMIN 224
#define PK_K5_QH 256                  /* q5_k: 8 fifth-bit vectors */
#define PK_K4_QS(q5) ((q5) ? 768 : 256) /* 32 nibble vectors */
#define PK_Q4_K_SB 2304               /* 16 x 144 */
#define PK_Q5_K_SB 2816               /* 16 x 176 */
#define PK_Q6_K_D 0                   /* q6_k: d[16] f16 */
#define PK_Q6_K_SC 32                 /* sc[16][16] int8 */
#define PK_Q6_K_Q 288                 /* 16 triples of q vectors */
#define PK_Q6_K_SB 3360               /* 16 x 210 */
#define PK_XS_SL 0                    /* iq4_xs: sl[4][16], scales_l[c] of row r */
#define PK_XS_SH 64                   /* sh[16] u16: scales_h */
#define PK_XS_D 96                    /* d[16] f16 */
#define PK_XS_QS 128                  /* 8 x 4 nibble vectors */
#define PK_IQ4_XS_SB 2176             /* 16 x 136 */
#define PK_Q2_K_SC 0                  /* q2_k: sc[16][16], ggml's scale | min << 4 */
#define PK_Q2_K_D 256                 /* d[16] f16 */
#define PK_Q2_K_DMIN 288              /* dmin[16] f16 */
#define PK_Q2_K_SB 1344               /* 16 x 84 */
#define PK_Q3_K_SL 0                  /* q3_k: sl[8][16], low 4 bits of scales 2j, 2j + 1 */
#define PK_Q3_K_SH 128                /* sh[4][16]: top 2 bits of scales 4c .. 4c + 3 */
#define PK_Q3_K_D 192                 /* d[16] f16 */
#define PK_Q3_K_HM 1248               /* 8 vectors of third bits */
#define PK_K2_QS(q3) ((q3) ? 224 : 320) /* q2_k, q3_k: 16 vectors of 2-bit levels */
#define PK_Q3_K_SB 1760               /* 16 x 110 */

#endif
