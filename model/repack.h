/* repack.h - puts a bound model's matrices into the packed layout of the tile kernels (kern/pack.h). */
#ifndef NX_REPACK_H
#define NX_REPACK_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* True when w would be packed: its type has a layout and a SIMD kernel on this
 * CPU (nx_pack_fast), and its shape fits (n_out a multiple of 16). */
bool nx_wt_packable(const struct nx_wt *w);

/* Bytes nx_model_repack needs for the packed copies of m's packable matrices
 * (each distinct matrix once: a tied output and embedding share one). */
size_t nx_model_repack_size(const struct nx_model *m);

/* Packs copies of m's packable matrices into dst (size >= nx_model_repack_size,
 * 64-byte aligned) and sets their packed pointers; data stays as it was. */
int nx_model_repack(struct nx_model *m, void *dst, size_t size, struct nx_err *err);

/* Packs m's packable matrices in place (their plain bytes are rearranged, no
 * memory added) and points their data at plain_delta bytes from where they
 * were: another copy of the same plain bytes the caller keeps (the daemon: the
 * model file mapped read-only, so the plain rows cost no memory until read —
 * by the embedding lookup, a LoRA fold). Returns the number of matrices packed,
 * or -1 (out of memory for one group's rows). */
int nx_model_repack_inplace(struct nx_model *m, ptrdiff_t plain_delta, struct nx_err *err);

#endif
