/* probe.h - real hidden states as probe activations, the measured cost of the runtime delta, and the accuracy report as JSON.
 *
 * report.h grades one matrix on given probe inputs; this file gets those
 * inputs from the model itself: nx_lora_probe_run runs the forward pass (one
 * band, its own state) over a probe prompt with nx_state.capture set, so every
 * adapted matmul is graded on the activations it really sees at those
 * positions (normed x for q/k/v/gate/up, the attention output for o,
 * silu(gate) * up for down). It also times a decode step of one token and
 * the runtime delta of every adapted matrix for one token (on its real
 * input): the delta's measured extra cost per token (one thread; the
 * daemon's workers split B @ u like the matmuls, each computes A @ x).
 *
 * nx_lora_report_json grades every adapted matrix and adds them up, as
 * tools/nx-lora's report does, into one JSON object the daemon sends and
 * nxctl prints. */
#ifndef NX_LORA_PROBE_H
#define NX_LORA_PROBE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"
#include "lora/adapter.h"
#include "lora/report.h"
#include "model/model.h"

#define NX_LORA_PROBE_MAX 512 /* probe tokens */

struct nx_lora_probe_run {
	float *cap;              /* (n_layer * nx_capture_layer(hp, n)) floats, malloc'd: free() it */
	int n;                   /* probe tokens */
	double base_ms_per_tok;  /* one decode token through the model alone (fastest of the runs) */
	double delta_ms_per_tok; /* the runtime delta of every adapted matrix for one token (fastest); 0 without l */
};

/* Runs tokens[0..n) as one sequence through m capturing every matmul input,
 * then times n_time decode steps and n_time runs of l's delta (at user_scale).
 * l may be NULL (no delta timing). */
int nx_lora_probe_run(const struct nx_model *m, const struct nx_lora *l, float user_scale, const int32_t *tokens,
		      int n, int n_time, struct nx_lora_probe_run *r, struct nx_err *err);

/* The (n, n_in) captured input rows of matrix (layer, which). */
const float *nx_lora_capture_rows(const struct nx_hparams *hp, const float *cap, int n, int layer,
				  enum nx_lora_which which);

struct nx_lora_report_opts {
	float user_scale;
	int n_types;
	int types[NX_GRADE_MAX_TYPES]; /* fold targets; -1: each tensor's own type ("keep") */
	const float *cap;              /* nx_lora_probe_run's capture of n_probe tokens */
	int n_probe;
	const bool *layers;            /* (n_layer) which layers to grade; NULL: all */
	/* Called after each graded matrix (from the caller's thread); may be NULL. */
	void (*progress)(void *ctx, int done, int total);
	void *ctx;
	volatile int *stop;            /* set non-zero to give up early (error "stopped"); may be NULL */
};

/* Grades every adapted matrix of l against the weights of m (the model the
 * fold would start from) on the captured probes. Returns
 *   {"probe_tokens":n,"scale":s,"types":[...],
 *    "tensors":[{"tensor","type","rank","effect","fold_ms",
 *                "fold":[{"type","rel_rms","max_abs"}...],"delta":{...},"noise":{...}}...],
 *    "total":{"tensors","effect","fold_ms","fold":[...],"delta":{...},"noise":{...}}}
 * (caller json_decref's it), or NULL with err. */
json_t *nx_lora_report_json(const struct nx_model *m, const struct nx_lora *l, const struct nx_lora_report_opts *o,
			    struct nx_err *err);

#endif
