/* forward.h - the batched llama/qwen2 forward pass, written SPMD.
 *
 * Every participant ("band") calls nx_forward with the same model, state and
 * batch and its own (band, n_bands); each computes only its share of every op
 * (output rows of a matmul, (token, head) pairs of attention) and meets the
 * others at sync->barrier between dependent ops. With n_bands = 1 and a no-op
 * barrier it is a plain single-threaded pass. The daemon runs it in forked
 * workers over shared memory with futex barriers; tests use 1 band or threads.
 *
 * Nothing here allocates: all memory comes from nx_state (shared by the bands)
 * and nx_scratch (private to one band), both sized up front. */
#ifndef NX_FORWARD_H
#define NX_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

struct nx_state_cfg {
	int max_batch;  /* tokens per step */
	int max_logits; /* rows of logits per step (<= max_batch) */
	int n_slots;    /* sequences with their own KV cache */
	int n_ctx;      /* positions per slot */
};

/* One token of a step. */
struct nx_tok_in {
	int32_t token;
	int32_t pos;        /* position in its sequence; K/V is written there */
	int32_t slot;       /* KV cache of its sequence, in [0, n_slots) */
	int32_t logits_row; /* row of nx_state.logits to fill, or -1 */
};

/* Memory shared by all bands: activations, KV cache, logits.
 * Lives in one caller-provided block (the daemon's shared arena). */
struct nx_state {
	struct nx_state_cfg cfg;
	int dim, kv_dim, q_dim, n_ff, n_vocab, n_layer;
	float *x;       /* (max_batch, dim) residual stream */
	float *q;       /* (max_batch, q_dim) queries; RoPE is applied in place */
	float *k;       /* (max_batch, kv_dim) keys before RoPE (they reach k_cache rotated, as f16) */
	float *v;       /* (max_batch, kv_dim) values (copied to v_cache as f16 by the band that made them) */
	float *att_out; /* (max_batch, q_dim) attention output */
	float *hb;      /* (max_batch, n_ff) SwiGLU output */
	nx_f16 *k_cache;/* (n_slots, n_layer, n_ctx, kv_dim) */
	nx_f16 *v_cache;/* (n_slots, n_layer, n_ctx, kv_dim) */
	float *logits;  /* (max_logits, n_vocab) */
};

/* Memory private to one band: its copy of the normed/quantized activations
 * and its attention scores. */
struct nx_scratch {
	float *xn;      /* (max_batch, max(dim, n_ff, q_dim)) normed input of the current matmul */
	void *xq;       /* (max_batch, xq_stride bytes) activations quantized to the weight's vec_dot_type */
	size_t xq_stride; /* bytes per row of xq: room for max(dim, n_ff, q_dim) floats, 64-aligned */
	float *att;     /* (n_ctx) attention scores of one (token, head) */
	float *rope;    /* (max_batch, rope_dim/2, 2) cos, sin of each token's rotation angles */
	/* What xq holds now, so Q/K/V (and gate/up) quantize their shared input once. */
	const float *xq_src;
	enum nx_type xq_type;
};

/* Bytes of the state block; 0 when cfg is invalid or the size overflows. */
size_t nx_state_size(const struct nx_hparams *hp, const struct nx_state_cfg *cfg);
/* Lays the state out in mem (size >= nx_state_size, 64-byte aligned). */
int nx_state_init(struct nx_state *s, void *mem, size_t size, const struct nx_hparams *hp,
		  const struct nx_state_cfg *cfg, struct nx_err *err);

/* Bytes of one band's scratch block (0 when cfg is invalid); laid out like the state. */
size_t nx_scratch_size(const struct nx_hparams *hp, const struct nx_state_cfg *cfg);
int nx_scratch_init(struct nx_scratch *sc, void *mem, size_t size, const struct nx_hparams *hp,
		    const struct nx_state_cfg *cfg, struct nx_err *err);

struct nx_sync {
	void (*barrier)(void *ctx); /* returns when every band has arrived */
	void *ctx;
};

/* Runs one step over toks[0..n). Preconditions (checked by the caller, the
 * scheduler): n <= max_batch, each slot/pos in range, tokens < n_vocab, and a
 * sequence's earlier positions already in its KV cache or in this batch.
 * The last op is a barrier: when any band returns, every logits row is done.
 * A token's arithmetic does not depend on the batch around it nor on n_bands
 * (bands only pick which rows / heads they compute; every dot runs whole), so
 * logits are bit-identical however the scheduler batches and splits. */
void nx_forward(const struct nx_model *m, struct nx_state *s, const struct nx_tok_in *toks, int n,
		int band, int n_bands, struct nx_scratch *sc, const struct nx_sync *sync);

#endif
