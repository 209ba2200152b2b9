/* report.h - grading fold and runtime delta against the exact float64 adapted weight, on probe activations.
 *
 * For one adapted matrix W (n_out, n_in), scale s and probe inputs x_p:
 *   y_exact = (dequant(W) + s * B @ A) @ x            float64 throughout
 *   y_fold  = dequant(W_folded) @ x                   W_folded = nx_fold_rows(..., type) for each type asked
 *   y_delta = dequant(W) @ x + s * B @ (A @ x)        the delta part by nx_lora_delta, f32, as the runtime does
 * and each is graded against y_exact only - never against each other
 * (DESIGN.md "LoRA"). The errors are relative RMS (sqrt(sum err^2 / sum
 * y_exact^2) over all outputs and probes) and the largest absolute error.
 * The base part dequant(W) @ x is common to every method, so activation
 * quantization (which the forward pass adds to any matmul) is left out.
 *
 * To put the fold error in scale we also report the base type's own
 * quantization noise on this tensor, which we cannot measure directly (the
 * float weights the file was quantized from are gone). Estimate: take
 * dequant(W) with each row's elements permuted by one fixed random
 * permutation - a matrix with the same value distribution but no longer on
 * the type's grid - quantize it to the base type and measure
 * |(Q(Wp) - Wp) @ x| / |Wp @ x|. For a re-quantizing fold (keep type) the
 * fold error should be of this size: the fold quantizes once more; the
 * original quantization error is already in the base. For float base types
 * (f32, f16, bf16) the estimate is 0: permuted values stay representable.
 *
 * Also reported: the size of the adapter's effect, |s B A x| / |y_exact|, so
 * a fold error can be compared with what the adapter changes (a fold error
 * close to the effect means the fold lost the adapter). */
#ifndef NX_LORA_REPORT_H
#define NX_LORA_REPORT_H

#include <stdint.h>

#include "common/err.h"
#include "lora/adapter.h"
#include "model/model.h"

#define NX_GRADE_MAX_TYPES 8

/* Error sums of one method: combine tensors by adding sq / ref_sq, max of max. */
struct nx_grade_err {
	double sq;      /* sum of squared errors */
	double ref_sq;  /* sum of squared reference outputs */
	double max_abs; /* largest absolute error */
};

struct nx_lora_grade {
	int layer;
	enum nx_lora_which which;
	enum nx_type base_type;
	int n_types;
	enum nx_type types[NX_GRADE_MAX_TYPES];   /* fold targets, as asked */
	struct nx_grade_err fold[NX_GRADE_MAX_TYPES];
	struct nx_grade_err delta;                /* runtime delta (f32) */
	struct nx_grade_err noise;                /* base type's estimated quantization noise */
	struct nx_grade_err effect;               /* sq: sum (s B A x)^2, ref_sq: sum y_exact^2 */
	double fold_ms;                           /* time to fold this tensor to types[0] (exact rows + quantize) */
};

/* Relative RMS error of e (0 when the reference is 0). */
double nx_grade_rel(const struct nx_grade_err *e);
/* Adds b into a (sums add, maxima combine). */
void nx_grade_add(struct nx_grade_err *a, const struct nx_grade_err *b);

/* Grades one adapted matrix on n_x probe inputs x (n_x, n_in) at effective
 * scale s, folding to each of types[0..n_types) (n_types <= NX_GRADE_MAX_TYPES). */
int nx_lora_grade_tensor(const struct nx_wt *w, const struct nx_lora_t *t, float s, const float *x, int n_x,
			 const enum nx_type *types, int n_types, struct nx_lora_grade *g, struct nx_err *err);

/* Synthetic probe inputs for (layer, which) until the forward pass can dump
 * real hidden states: real token embeddings (random token ids) through the
 * layer's own norm weights (q, k, v, gate, up); for o, softmax-weighted mixes
 * of the layer's V projections of 4 such tokens (what attention outputs);
 * for down, silu(W_gate xn) * (W_up xn) with the layer's own weights.
 * Deterministic in seed. x: (n, n_in of that matrix). */
int nx_lora_probe(const struct nx_model *m, int layer, enum nx_lora_which which, int n, uint64_t seed, float *x,
		  struct nx_err *err);

#endif
