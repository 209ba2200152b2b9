/* moe.h - mixture-of-experts routing: which experts each token of a step takes, at what weight, grouped by expert.
 *
 * A MoE layer's FFN (Hugging Face modeling_mixtral.py, modeling_qwen3_moe.py)
 * is, per token: logits = W_router xn over n_expert experts; p = softmax(logits);
 * the n_expert_used experts of largest p; their weights p_e, divided by the sum
 * of the chosen ones' p when moe_norm_w (Mixtral always; qwen3moe's
 * norm_topk_prob), so the chosen weights are then the softmax of the chosen
 * logits; out = sum_e w_e * down_e(silu(gate_e xn) * up_e xn).
 *
 * The forward pass (forward.c: moe_*) computes the router logits with the rows
 * shared out, then every band routes every token itself with nx_moe_route (the
 * same floats in every band, whatever the batch), and runs each chosen expert
 * only on the tokens routed to it: a step reads the active experts' rows only. */
#ifndef NX_MOE_H
#define NX_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Most experts a layer may have (a bound on the routing tables). */
#define NX_MOE_MAX_EXPERTS 512

/* A step's routing at one layer: rows are (token, chosen expert) pairs,
 * grouped by expert in increasing id, each expert's in increasing token order. */
struct nx_moe_route {
	int n_active;     /* experts some token chose */
	int32_t *expert;  /* (n_expert) the active experts' ids, increasing */
	int32_t *off;     /* (n_expert + 1) active expert i's rows are [off[i], off[i + 1]) */
	int32_t *row_tok; /* (max_batch * n_expert_used) each row's token */
	float *row_w;     /* (max_batch * n_expert_used) each row's routing weight */
	/* nx_moe_route's own: (rows) each token's choice and weight, token after token; (n_expert) a count */
	int32_t *tok_sel;
	float *tok_w;
	int32_t *count;
};

/* Elements of each of the route's arrays, for the caller's layout. */
static inline size_t nx_moe_route_rows(const struct nx_hparams *hp, int max_batch)
{
	return (size_t)max_batch * (size_t)hp->n_expert_used;
}

/* Routes tokens [0, n) by their router logits (n, n_expert) into r. A token's
 * choice and weights depend on its own logits only. Ties go to the lower id. */
void nx_moe_route(const struct nx_hparams *hp, const float *logits, int n, struct nx_moe_route *r);

/* Expert e's rows of a stacked expert matrix (rows_per_expert of them) as a
 * matrix of its own: its plain rows, and its packed group when packed (whole
 * groups: the stacked one is packed only when rows_per_expert allows it). */
struct nx_wt nx_moe_expert(const struct nx_wt *stacked, int e, int64_t rows_per_expert);

#endif
