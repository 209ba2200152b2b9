/* forward.h - the batched forward pass of every family nxd runs (model.c: families), written SPMD.
 *
 * Every participant ("band") calls nx_forward with the same model, state and
 * batch and its own (band, n_bands); each computes only its share of every op
 * (output rows of a matmul; (token, kv head, chunk of its query heads) units of
 * attention) and meets the others at sync->barrier between dependent ops. With
 * n_bands = 1 and a no-op barrier it is a plain single-threaded pass. The
 * daemon runs it in forked workers over shared memory with futex barriers;
 * tests use 1 band or threads.
 *
 * Nothing here allocates: all memory comes from nx_state (shared by the bands)
 * and nx_scratch (private to one band), both sized up front. */
#ifndef NX_FORWARD_H
#define NX_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "lora/adapter.h"
#include "model/model.h"
#include "model/moe.h"

/* How the K/V cache stores each value (nxd --kv-type). A row is one
 * (kv head, position): head_dim values. */
enum nx_kv_type {
	NX_KV_F16,  /* f16 each */
	NX_KV_Q8_0, /* head_dim / 32 Q8_0 blocks (kern/quant.h), K after RoPE, as ggml's q8_0 cache:
		     * d = amax / 127 in f16, q = round(x / d); needs head_dim % 32 == 0 */
};

/* "f16" / "q8_0", as nxd --kv-type and status give them. */
const char *nx_kv_type_name(enum nx_kv_type t);
/* name -> *t; false when it names no type. */
bool nx_kv_type_parse(const char *name, enum nx_kv_type *t);
/* Bytes of one row of hd values; 0 when the type cannot hold hd (q8_0: hd % 32). */
size_t nx_kv_row_bytes(enum nx_kv_type t, int hd);
/* 0 when the model's heads fit type t; else an error naming both. */
int nx_kv_type_check(const struct nx_hparams *hp, enum nx_kv_type t, struct nx_err *err);

struct nx_state_cfg {
	int max_batch;  /* tokens per step */
	int max_logits; /* rows of logits per step (<= max_batch) */
	int n_slots;    /* sequences with their own KV cache */
	int n_ctx;      /* positions per slot */
	/* Each matmul input quantized in one 8-bit part (Q8_0 / Q8_K, as llama.cpp
	 * does) instead of two: the lo rows stay zeros and the packed kernels skip
	 * them. Faster where several tokens share a step; further from the float
	 * result (forward.c: prep_act_q). */
	bool act_one_part;
	enum nx_kv_type kv_type; /* how K and V are stored (NX_KV_F16 by default) */
};

/* The names of the two activation modes, as nxd --activations and status
 * give them: "precise" (two parts) and "fast" (act_one_part). */
const char *nx_act_mode_name(bool one_part);
/* name -> *one_part; false when it is neither name. */
bool nx_act_mode_parse(const char *name, bool *one_part);

/* One token of a step. */
struct nx_tok_in {
	int32_t token;
	int32_t pos;        /* position in its sequence; K/V is written there */
	int32_t slot;       /* KV cache of its sequence, in [0, n_slots) */
	int32_t logits_row; /* row of nx_state.logits to fill, or -1 */
	int32_t lora;       /* 0: the model alone; k > 0: plus the runtime LoRA delta of nx_state.lora[k - 1] */
};

/* Runtime LoRA: the adapters one token carries, each at its user scale. Every
 * adapted matmul of such a token adds scale[i] * (alpha/r) * B @ (A @ x) for
 * each adapter (lora/delta.h); the weights are not touched. */
#define NX_LORA_MIX_MAX 8
struct nx_lora_mix {
	int n;
	const struct nx_lora *l[NX_LORA_MIX_MAX];
	float scale[NX_LORA_MIX_MAX];
};

/* Probe capture (nx_state.capture): the f32 input of every matmul of every
 * layer for all n tokens of a step, per (layer, kind) a (n, width) block at
 * nx_capture_off(); widths dim, q_dim, dim, n_ff. */
enum nx_capture_kind {
	NX_CAP_ATTN,     /* normed x: input of q, k, v */
	NX_CAP_ATTN_OUT, /* attention output: input of o */
	NX_CAP_FFN,      /* normed x: input of gate, up */
	NX_CAP_FFN_HID,  /* silu(gate) * up: input of down */
};

static inline size_t nx_capture_width(const struct nx_hparams *hp, enum nx_capture_kind k)
{
	return k == NX_CAP_ATTN_OUT ? (size_t)hp->n_head * hp->head_dim : k == NX_CAP_FFN_HID ? (size_t)hp->n_ff
											  : (size_t)hp->dim;
}

/* Floats of one layer's capture for n tokens, and where (layer, kind) starts. */
static inline size_t nx_capture_layer(const struct nx_hparams *hp, int n)
{
	return (size_t)n * (2 * (size_t)hp->dim + (size_t)hp->n_head * hp->head_dim + (size_t)hp->n_ff);
}

static inline size_t nx_capture_off(const struct nx_hparams *hp, int n, int layer, enum nx_capture_kind k)
{
	size_t off = (size_t)layer * nx_capture_layer(hp, n);
	for (int i = 0; i < (int)k; i++)
		off += (size_t)n * nx_capture_width(hp, (enum nx_capture_kind)i);
	return off;
}

/* Memory shared by all bands: activations, KV cache, logits.
 * Lives in one caller-provided block (the daemon's shared arena). */
struct nx_state {
	struct nx_state_cfg cfg;
	int dim, kv_dim, q_dim, n_ff, n_vocab, n_layer;
	float *x;       /* (max_batch, dim) residual stream */
	float *q;       /* (max_batch, q_dim) queries; RoPE is applied in place */
	float *k;       /* (max_batch, kv_dim) keys before RoPE (they reach k_cache rotated, as cfg.kv_type) */
	float *v;       /* (max_batch, kv_dim) values (copied to v_cache as cfg.kv_type by the band that made them) */
	float *att_out; /* (max_batch, q_dim) attention output */
	float *hb;      /* (max_batch, n_ff) SwiGLU (GeGLU) output */
	float *y;       /* (max_batch, dim) with post_norms: Wo's or Wdown's output before its norm; else none */
	/* (n_slots, n_layer, n_head_kv, n_ctx) rows of head_dim values, each
	 * nx_kv_row_bytes(cfg.kv_type) (f16 values or Q8_0 blocks): each kv head's
	 * keys in one run, which attention reads front to back (not every third
	 * 128-byte piece of a position's row, as with (n_ctx, kv_dim) per layer) */
	void *k_cache;
	void *v_cache;  /* same shape as k_cache */
	float *logits;  /* (max_logits, n_vocab) */
	/* (max_logits, ceil(n_vocab / NX_SAMPLE_GROUP)) each logits row's group
	 * maxima (sample/sampler.h: nx_sample_group_max), by the band that wrote the group */
	float *logit_gmax;
	/* Attention of tokens with more than one span of positions (forward.c:
	 * NX_ATTN_SPAN), before the merge; spans = n_ctx / NX_ATTN_SPAN rounded up */
	float *att_part;/* (max_batch, spans, n_head, head_dim) each span's output */
	float *att_ms;  /* (max_batch, spans, n_head, 2) each span's largest score and sum of e^(score - it) */
	/* Mixture of experts (hp n_expert > 0; NULL otherwise; forward.c: moe_*): */
	float *moe_logits; /* (max_batch, n_expert) the router's logits of the current layer */
	float *moe_h;      /* (max_batch * n_expert_used, n_ff_exp) silu(gate) * up of each routed (token, expert) row */
	/* qwen2moe's shared expert (hp n_ff_shexp > 0; NULL otherwise; forward.c: shexp_*): */
	float *shexp_h;    /* (max_batch, n_ff_shexp) its silu(gate) * up */
	float *shexp_g;    /* (max_batch) each token's logit of its sigmoid gate */
	float *lora_u;  /* (NX_LORA_U_SHARED) A @ x of the runtime LoRA deltas when the bands share it out
			 * (forward.c struct deltas, split): Q's, V's and K's, a half of NX_LORA_U_CAP each */
	/* Set by the owner after nx_state_init (zero by default): */
	const struct nx_lora_mix *lora; /* (n_lora) adapter sets that nx_tok_in.lora selects; NULL: none */
	int n_lora;
	float *capture; /* NULL, or (n_layer * nx_capture_layer(n)) floats: band 0 copies every matmul input */
};

#define NX_LORA_U_CAP (NX_LORA_MIX_MAX * NX_LORA_MAX_RANK) /* one token's A @ x for a full mix, at any rank */
#define NX_LORA_U_SHARED (3 * NX_LORA_U_CAP / 2)
#define NX_LORA_Y_TOK 64
#define NX_LORA_Y_ROWS 64

/* Memory private to one band: its copy of the normed/quantized activations
 * and its attention scores. */
struct nx_scratch {
	float *xn;      /* (max_batch, max(dim, n_ff, q_dim)) normed input of the current matmul */
	void *xq;       /* (max_batch, xq_stride bytes) activations quantized to the weight's vec_dot_type,
			 * two rows per token (hi and lo parts, see forward.c: prep_act) */
	size_t xq_stride; /* bytes of xq per token: room for max(dim, n_ff, q_dim) floats, 64-aligned */
	/* (max_batch, max(dim, n_ff, q_dim) / 32) when xq holds two-part Q8_0 rows: each token's
	 * per-block side values for the packed kernels (kern/pack.h: nx_pack_act_prep) */
	float *xq_d, *xq_s; /* (with experts: max_batch * n_expert_used rows instead of max_batch, here and in xq) */
	int32_t *xq_c;
	int32_t *xq_c16; /* (max_batch, 2 * max(...) / 32): per-16 offsets for q6_k (nx_pack_act_prep_c16),
			  * filled when a packed q6_k matrix first reads the current xq */
	bool xq_c16_ok;
	bool act_one_part; /* nx_state_cfg.act_one_part */
	float *att;     /* (min(group, nx_attn_group(head_dim)), n_ctx) attention scores of one
			 * (token, kv head, chunk of its query heads); group = n_head / n_head_kv */
	float *att_in;  /* (max_batch, n_head * head_dim) the step's attention output with its
			 * tokens' spans merged: Wo's input when a token has more than one span */
	float *rope;    /* (max_batch, rope_dim/2, 2) cos, sin of each token's rotation angles */
	float *rope_swa;/* the same for sliding-window layers with their own base (rope_base_swa); else none */
	float *lora_u;  /* (NX_LORA_U_CAP) A @ x of the runtime LoRA delta (forward.c lora_runs' layout):
			 * the step's for two matrices, one per half, or a few tokens' for one */
	float *lora_y;  /* (NX_LORA_Y_TOK, NX_LORA_Y_ROWS) up-projection rows of an adapted SwiGLU */
	/* Mixture of experts (NULL without): each band routes the step itself, the same way */
	struct nx_moe_route route;
	float *moe_x;   /* (max_batch * n_expert_used, dim) each routed row's normed input, grouped by expert */
	float *moe_y;   /* (max_batch, dim) one expert's down-projection rows of its tokens */
	/* What xq holds now, so Q/K/V (and gate/up) quantize their shared input once. */
	const float *xq_src;
	enum nx_type xq_type;
	struct nx_prof *prof; /* NULL (the default): no timing; else this band's counters, added to */
};

/* Bytes of the K and V caches together (part of the state block); 0 when cfg is invalid or overflows. */
size_t nx_kv_cache_bytes(const struct nx_hparams *hp, const struct nx_state_cfg *cfg);
/* Bytes of the state block; 0 when cfg is invalid or the size overflows. */
size_t nx_state_size(const struct nx_hparams *hp, const struct nx_state_cfg *cfg);
/* Lays the state out in mem (size >= nx_state_size, 64-byte aligned). */
int nx_state_init(struct nx_state *s, void *mem, size_t size, const struct nx_hparams *hp,
		  const struct nx_state_cfg *cfg, struct nx_err *err);

/* Copies the K/V of positions [p0, p1) of slot src into slot dst, every layer
 * and kv head (head_dim hd): the same bytes (f16 values or Q8_0 blocks) a step
 * would have written there for the same tokens. Neither slot may be written by a step meanwhile (the
 * caller's scheduling: src's positions below its n_past stay as they are). */
void nx_state_copy_kv(const struct nx_state *s, int hd, int dst, int src, int p0, int p1);

/* Bytes of one band's scratch block (0 when cfg is invalid); laid out like the state. */
size_t nx_scratch_size(const struct nx_hparams *hp, const struct nx_state_cfg *cfg);
int nx_scratch_init(struct nx_scratch *sc, void *mem, size_t size, const struct nx_hparams *hp,
		    const struct nx_state_cfg *cfg, struct nx_err *err);

#define NX_SYNC_TAKE_UNITS 0x7fff

struct nx_sync {
	void (*barrier)(void *ctx); /* returns when every band has arrived */
	/* NULL, or hands out an op's rows between two barriers (nx_barrier_take,
	 * units <= NX_SYNC_TAKE_UNITS): each band takes its own contiguous range
	 * front to back, half of what is left at a time, then helps with the
	 * backs of the others'. Each band streams its rows in order when the
	 * machine leaves it alone (as fixed bands would), and a band that runs
	 * slower than the others does not hold them at the barrier. */
	bool (*take)(void *ctx, uint32_t tag, uint32_t band, uint32_t units, uint32_t chunk, uint32_t *u0,
		     uint32_t *u1);
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

/* Where a band's time goes in nx_forward, when nx_scratch.prof is set (nxd
 * --profile, nx-perf --profile). Counted in ticks of nx_prof_now(): the TSC on
 * x86 (no syscall: fine in the worker sandbox), so the reader converts with
 * nx_prof_tick_ns(). */
enum nx_prof_phase {
	NX_PROF_MATMUL,  /* the weight matmuls of the layers (Q/K/V, Wo, gate/up, down) */
	NX_PROF_LOGITS,  /* the output head */
	NX_PROF_ATTN,    /* attention over the KV cache */
	NX_PROF_QUANT,   /* rmsnorm and activation quantization (private, per band) */
	NX_PROF_OTHER,   /* embedding, RoPE, K/V cache writes */
	NX_PROF_BARRIER, /* waiting for the other bands */
	NX_PROF_N
};
struct nx_prof {
	uint64_t ticks[NX_PROF_N]; /* per phase, summed over steps */
	uint64_t steps;
	uint64_t mark;             /* nx_forward's own: when the current phase began */
	int phase;                 /* and which it is */
	uint64_t begin, end;       /* when the last step began and ended (nxd's time between steps) */
};
/* The phase's short name ("matmul", "attention", ...). */
const char *nx_prof_name(int phase);
/* The clock the counters use. */
uint64_t nx_prof_now(void);
/* Nanoseconds per tick (measured once, about 10 ms, on the first call). */
double nx_prof_tick_ns(void);

#endif
