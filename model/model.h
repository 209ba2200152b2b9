/* model.h - a llama / qwen2 / qwen3 model bound to the tensors of a parsed GGUF file.
 *
 * nx_model is plain data (no heap pointers of its own), so the daemon can copy
 * it into shared memory and swap one weight between steps (LoRA fold). */
#ifndef NX_MODEL_H
#define NX_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "kern/quant.h"
#include "model/gguf.h"

#define NX_MAX_LAYERS 128

enum nx_arch { NX_ARCH_LLAMA, NX_ARCH_QWEN2, NX_ARCH_QWEN3, NX_ARCH_QWEN3MOE };

/* general.architecture's name of a family ("llama", "qwen2", "qwen3"). */
const char *nx_arch_name(enum nx_arch a);

/* RoPE scaling ({arch}.rope.scaling.type; docs/models.md). */
enum nx_rope_scaling {
	NX_ROPE_NONE,
	NX_ROPE_LINEAR, /* every frequency / rope_factor */
	NX_ROPE_YARN,   /* frequencies blended between / rope_factor and as they are, cos and sin x yarn_mscale */
};

struct nx_hparams {
	enum nx_arch arch;
	int n_layer;
	int dim;        /* embedding length */
	int n_ff;       /* feed-forward length */
	int n_head;
	int n_head_kv;
	int head_dim;   /* attention.key_length, else dim / n_head */
	int rope_dim;   /* rotated dims per head (<= head_dim) */
	int n_vocab;
	int n_ctx_train;
	float rope_base;
	enum nx_rope_scaling rope_scaling;
	float rope_factor;  /* LINEAR, YARN: the context's scaling factor (>= 1 for YARN) */
	/* YARN: pairs below yarn_lo keep their frequency, pairs above yarn_hi
	 * take it / rope_factor, a linear ramp between (forward.c: rope_freq) */
	float yarn_lo, yarn_hi;
	float yarn_mscale;  /* YARN: 0.1 ln(rope_factor) + 1 */
	float norm_eps;
	/* What the family does besides llama's (model.c: families): */
	bool rope_neox; /* rotate (i, i + rope_dim/2) pairs (qwen2, qwen3) instead of (2i, 2i+1) (llama) */
	bool qk_norm;   /* RMSNorm of each head of Q and K (weights q_norm, k_norm) before RoPE (qwen3) */
	/* Mixture of experts (qwen3moe; llama with expert_count: Mixtral), else all 0:
	 * every layer's FFN is n_expert SwiGLU experts of n_ff_exp, of which each
	 * token takes the n_expert_used with the largest router logits (model/moe.h) */
	int n_expert, n_expert_used;
	int n_ff_exp;     /* an expert's feed-forward length; n_ff is set to it */
	bool moe_norm_w;  /* the chosen experts' softmax weights renormalised to sum 1 (Mixtral; qwen3moe's norm_topk_prob) */
};

/* A weight matrix W of shape (n_out, n_in): row r (n_in elements of `type`)
 * starts at data + r * row_bytes. */
struct nx_wt {
	enum nx_type type;
	int64_t n_in;
	int64_t n_out;
	size_t row_bytes;
	const void *data;
	/* NULL, or the same matrix in kern/pack.h's row-interleaved layout (group g
	 * of 16 rows at packed + g * 16 * row_bytes), set by nx_model_pack; the
	 * forward pass then uses the tile kernels. data stays the plain rows. */
	const void *packed;
};

struct nx_layer {
	const float *attn_norm;     /* (dim) */
	struct nx_wt wq;            /* (n_head*head_dim, dim) */
	struct nx_wt wk;            /* (n_head_kv*head_dim, dim) */
	struct nx_wt wv;            /* (n_head_kv*head_dim, dim) */
	const float *bq, *bk, *bv;  /* qwen2 biases, same lengths as the rows above; NULL otherwise */
	const float *q_norm, *k_norm; /* (head_dim) qwen3's per-head RMSNorm weights; NULL otherwise */
	struct nx_wt wo;            /* (dim, n_head*head_dim) */
	const float *ffn_norm;      /* (dim) */
	struct nx_wt w_gate;        /* (n_ff, dim) */
	struct nx_wt w_up;          /* (n_ff, dim) */
	struct nx_wt w_down;        /* (dim, n_ff) */
	/* Mixture of experts (hp.n_expert > 0; the dense three above are then empty):
	 * expert e's rows of a stacked matrix are rows [e * r, (e + 1) * r) (model/moe.h: nx_moe_expert) */
	struct nx_wt moe_router;    /* (n_expert, dim) ffn_gate_inp */
	struct nx_wt moe_gate;      /* (n_expert * n_ff_exp, dim) ffn_gate_exps */
	struct nx_wt moe_up;        /* (n_expert * n_ff_exp, dim) ffn_up_exps */
	struct nx_wt moe_down;      /* (n_expert * dim, n_ff_exp) ffn_down_exps */
};

struct nx_model {
	struct nx_hparams hp;
	struct nx_wt tok_embd;      /* (n_vocab, dim), rows looked up by token id */
	const float *out_norm;      /* (dim) */
	struct nx_wt output;        /* (n_vocab, dim); tok_embd when the file ties them */
	const float *rope_freqs;    /* (rope_dim/2) each rotation pair's frequency divisor (llama: rope_freqs.weight,
				     * Llama 3.1+), or NULL */
	struct nx_layer layers[NX_MAX_LAYERS];
};

/* Reads hyper-parameters from metadata and binds every tensor, checking
 * architecture, shapes and types. Norm and bias vectors must be F32. */
int nx_model_bind(struct nx_model *m, const struct gguf_file *g, struct nx_err *err);

#endif
