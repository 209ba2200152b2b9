/* model.h - a model of one of nxd's families (model.c: families) bound to the tensors of a parsed GGUF file.
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

enum nx_arch {
	NX_ARCH_LLAMA,
	NX_ARCH_QWEN2,
	NX_ARCH_QWEN3,
	NX_ARCH_QWEN3MOE,
	NX_ARCH_PHI3,
	NX_ARCH_SMOLLM3,
	NX_ARCH_GEMMA2,
	NX_ARCH_GEMMA3,
	NX_ARCH_GEMMA,
	NX_ARCH_QWEN2MOE,
};

/* general.architecture's name of a family ("llama", "qwen2", "qwen3", "phi3", "smollm3", "gemma2", "gemma3", "gemma", ...). */
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
	/* LongRoPE (phi3's rope_factors_long / _short): cos and sin times this
	 * attention factor (rope.scaling.attn_factor; 1 without the factors), and
	 * the context past which the long factors apply (nx_model_rope_factors) */
	float rope_attn_factor;
	int rope_orig_ctx;
	float norm_eps;
	/* What the family does besides llama's (model.c: families): */
	/* rotate (i, i + rope_dim/2) pairs (qwen2, qwen3, phi3, gemma2, gemma3) instead of (2i, 2i+1) (llama) */
	bool rope_neox;
	bool qk_norm;   /* RMSNorm of each head of Q and K (weights q_norm, k_norm) before RoPE (qwen3, gemma3) */
	/* Layers il with (il + 1) % nope_every == 0 apply no RoPE; 0: all do (smollm3: 4) */
	int nope_every;
	/* Gemma's block (gemma, gemma2, gemma3; post_norms, the caps and attn_scale not gemma's); all zero / false for the others: */
	bool gelu;          /* the FFN gate through GELU (tanh approximation), not SiLU: GeGLU */
	bool post_norms;    /* RMSNorm of the attention and FFN outputs before each residual add
			     * (attn_post_norm, ffn_post_norm) */
	float embd_scale;   /* 0: none; else every embedding row times it (sqrt(dim)) */
	float attn_scale;   /* 0: 1/sqrt(head_dim); else the scores' scale (1/sqrt(query_pre_attn_scalar)) */
	float attn_softcap; /* 0: none; else each score s becomes cap * tanh(s / cap), before the mask */
	float final_softcap;/* 0: none; else each logit likewise */
	/* Sliding-window attention: a token of a sliding layer attends to the
	 * last swa_window positions only (its own among them), as Hugging Face's
	 * sliding-window mask; any other layer to all of them. With swa_window
	 * > 0 every layer slides (phi3) but, when swa_global_every > 0, those
	 * with (il + 1) % swa_global_every == 0 (gemma2: 2, gemma3: 6):
	 * nx_layer_window. Sliding layers rotate with base rope_base_swa,
	 * unscaled, when it is > 0 (gemma3), else as the other layers. */
	int swa_window;
	int swa_global_every;
	float rope_base_swa;
	/* Mixture of experts (qwen3moe, qwen2moe; llama with expert_count: Mixtral), else all 0:
	 * every layer's FFN is n_expert SwiGLU experts of n_ff_exp, of which each
	 * token takes the n_expert_used with the largest router logits (model/moe.h) */
	int n_expert, n_expert_used;
	int n_ff_exp;     /* an expert's feed-forward length; n_ff is set to it */
	bool moe_norm_w;  /* the chosen experts' softmax weights renormalised to sum 1 (Mixtral; qwen3moe's norm_topk_prob) */
	/* qwen2moe's shared expert, else 0: every token also runs a SwiGLU FFN of
	 * n_ff_shexp, its output times sigmoid(shexp_gate_inp . xn), added to the
	 * routed experts' sum */
	int n_ff_shexp;
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
	const float *attn_post_norm; /* (dim) post_norms: of Wo's output before the residual add; NULL otherwise */
	const float *ffn_norm;      /* (dim) */
	struct nx_wt w_gate;        /* (n_ff, dim) */
	struct nx_wt w_up;          /* (n_ff, dim) */
	struct nx_wt w_down;        /* (dim, n_ff) */
	const float *ffn_post_norm; /* (dim) post_norms: of Wdown's output before the residual add; NULL otherwise */
	/* Mixture of experts (hp.n_expert > 0; the dense three above are then empty):
	 * expert e's rows of a stacked matrix are rows [e * r, (e + 1) * r) (model/moe.h: nx_moe_expert) */
	struct nx_wt moe_router;    /* (n_expert, dim) ffn_gate_inp */
	struct nx_wt moe_gate;      /* (n_expert * n_ff_exp, dim) ffn_gate_exps */
	struct nx_wt moe_up;        /* (n_expert * n_ff_exp, dim) ffn_up_exps */
	struct nx_wt moe_down;      /* (n_expert * dim, n_ff_exp) ffn_down_exps */
	/* The shared expert (hp.n_ff_shexp > 0), else empty */
	struct nx_wt shexp_gate_inp; /* (1, dim) ffn_gate_inp_shexp: the logit of its sigmoid gate */
	struct nx_wt shexp_gate;    /* (n_ff_shexp, dim) ffn_gate_shexp */
	struct nx_wt shexp_up;      /* (n_ff_shexp, dim) ffn_up_shexp */
	struct nx_wt shexp_down;    /* (dim, n_ff_shexp) ffn_down_shexp */
};

struct nx_model {
	struct nx_hparams hp;
	struct nx_wt tok_embd;      /* (n_vocab, dim), rows looked up by token id */
	const float *out_norm;      /* (dim) */
	struct nx_wt output;        /* (n_vocab, dim); tok_embd when the file ties them */
	const float *rope_freqs;    /* (rope_dim/2) each rotation pair's frequency divisor (llama: rope_freqs.weight,
				     * Llama 3.1+), or NULL */
	/* (rope_dim/2) LongRoPE's divisors for a context past rope_orig_ctx and
	 * within it (phi3: rope_factors_long.weight, _short.weight), or NULL */
	const float *rope_long, *rope_short;
	struct nx_layer layers[NX_MAX_LAYERS];
};

/* Reads hyper-parameters from metadata and binds every tensor, checking
 * architecture, shapes and types. Norm and bias vectors must be F32. */
int nx_model_bind(struct nx_model *m, const struct gguf_file *g, struct nx_err *err);

/* The per-pair frequency divisors RoPE uses with a context of n_ctx positions
 * per slot, or NULL (none): rope_freqs, or LongRoPE's long set when n_ctx is
 * past rope_orig_ctx and its short set otherwise, as llama.cpp chooses. One
 * choice per context, never per sequence or batch: a token's logits do not
 * depend on the batch around it. (Hugging Face chooses per forward call, by
 * the longest position it holds: the same set for a sequence that runs past
 * rope_orig_ctx when n_ctx does, and for every sequence when n_ctx does not.) */
const float *nx_model_rope_factors(const struct nx_model *m, int n_ctx);

/* Whether layer il applies RoPE to Q and K (nope_every). */
static inline bool nx_layer_ropes(const struct nx_hparams *hp, int il)
{
	return !hp->nope_every || (il + 1) % hp->nope_every != 0;
}

/* Layer il's attention window (struct nx_hparams: swa_window): a token
 * attends to its last that many positions, or to all of them when it is 0. */
static inline int nx_layer_window(const struct nx_hparams *hp, int il)
{
	const bool global = hp->swa_global_every && (il + 1) % hp->swa_global_every == 0;
	return global ? 0 : hp->swa_window;
}

#endif
