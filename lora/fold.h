/* fold.h - folding a LoRA delta into a weight: W' = quant(dequant(W) + s * B @ A).
 *
 * s is the effective scale: user_scale * t->scale (alpha / rank, or
 * alpha / sqrt(rank) with rslora). Each output row r is computed as
 *   acc[j]  = sum_k B[r,k] * A[k,j]              (float64 accumulation)
 *   W'[r,j] = (float)(dequant(W)[r,j] + s * acc[j])
 * then quantized, row by row, to the weight's own type or a chosen one.
 *
 * The base bytes are never written: the fold reads w->data and writes a new
 * tensor into a caller-provided buffer. "Unfold" is the caller putting the
 * original struct nx_wt back (it keeps it), which restores the base bit for
 * bit. The daemon folds into the arena, then swaps the layer's nx_wt between
 * steps (tensor-level copy-on-write, DESIGN.md "Memory").
 *
 * The work is split by output rows ([r0, r1)), so several threads can fold
 * one tensor and a caller can report progress. */
#ifndef NX_LORA_FOLD_H
#define NX_LORA_FOLD_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kern/quant.h"
#include "lora/adapter.h"
#include "model/model.h"

/* Checks that w can be folded with t into type out (shapes agree; out is a
 * weight type with a quantizer and rows of n_in fit its blocks; w's type can
 * be dequantized). */
int nx_fold_check(const struct nx_wt *w, const struct nx_lora_t *t, enum nx_type out, struct nx_err *err);

/* Bytes of the folded tensor: n_out rows of nx_row_size(out, n_in); -1 when
 * rows do not fit out's blocks or the size overflows. */
int64_t nx_fold_size(const struct nx_wt *w, enum nx_type out);

/* The most any fold of w can take, whatever type it is folded to (w's own
 * included): the widest output, twice for a type the tile kernels pack (the
 * daemon keeps a packed copy beside the plain rows). -1 when no type fits
 * or the size overflows. The arena's reservation is sized with it. */
int64_t nx_fold_size_max(const struct nx_wt *w);

/* Per-thread work memory nx_fold_rows needs: n_in floats and n_in doubles. */
size_t nx_fold_work_size(const struct nx_wt *w);

/* Folds rows [r0, r1) into dst, the whole output tensor (row r at
 * dst + r * nx_row_size(out, n_in)). work: nx_fold_work_size bytes, 8-aligned.
 * Preconditions: nx_fold_check passed and 0 <= r0 <= r1 <= n_out. */
void nx_fold_rows(const struct nx_wt *w, const struct nx_lora_t *t, float s, enum nx_type out, void *dst,
		  int64_t r0, int64_t r1, void *work);

/* The unquantized folded row r: row[j] = (float)(dequant(W)[r,j] + s * (B@A)[r,j]),
 * with acc (n_in doubles) as scratch. nx_fold_rows quantizes exactly this. */
void nx_fold_exact_row(const struct nx_wt *w, const struct nx_lora_t *t, float s, int64_t r, float *row,
		       double *acc);

/* Whole-tensor fold (allocating its work memory): check, then every row.
 * dst must hold nx_fold_size(w, out) bytes. */
int nx_fold_tensor(const struct nx_wt *w, const struct nx_lora_t *t, float s, enum nx_type out, void *dst,
		   struct nx_err *err);

/* A weight type by name ("q8_0", "F16", ...) that can be a fold target; -1 with err otherwise. */
int nx_fold_type_parse(const char *name, enum nx_type *out, struct nx_err *err);

#endif
