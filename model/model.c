/* model.c - binds a model of a family below to the tensors of a parsed GGUF file, checking every key, shape and type. */
#include "model/model.h"
#include "model/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- families */

/* What each family adds to llama's block (RMSNorm, SwiGLU, RoPE on pairs
 * (2i, 2i+1)): the one forward pass reads these flags, never the name. */
static const struct family {
	const char *name; /* general.architecture */
	enum nx_arch arch;
	bool neox;        /* RoPE on pairs (i, i + rope_dim/2) */
	bool qkv_bias;    /* attn_q.bias, attn_k.bias, attn_v.bias */
	bool qk_norm;     /* attn_q_norm.weight, attn_k_norm.weight: RMSNorm of each head before RoPE */
	bool rope_freqs;  /* rope_freqs.weight may divide the RoPE frequencies */
	bool fused_qkv;   /* attn_qkv.weight: Q's rows, then K's, then V's (no attn_q / attn_k / attn_v) */
	bool fused_gate_up; /* ffn_up.weight holds gate's rows, then up's (no ffn_gate) */
	bool long_rope;   /* rope_factors_long.weight / rope_factors_short.weight may divide the frequencies */
	int nope_every;   /* every nope_every-th layer has no RoPE; 0: none */
	/* Sliding-window attention (read_window): attention.sliding_window is
	 * read, the window of the layers that slide: every layer but each
	 * swa_global_every-th (0: every layer); swa_default is the window when
	 * the key is absent (0: none), or -1 when the file must say it */
	bool swa;
	int swa_global_every;
	int swa_default;
	/* Gemma's block (read_gemma): embedding times sqrt(dim), GeGLU; but for
	 * Gemma 1, post_attention_norm and post_ffw_norm and the soft-caps */
	bool gemma;
	/* Mixture-of-experts FFN (model/moe.h): EXPERTS_MAY when expert_count > 0
	 * (llama: Mixtral), EXPERTS_ALWAYS (qwen3moe); the expert_* keys are then read */
	enum { EXPERTS_NEVER, EXPERTS_MAY, EXPERTS_ALWAYS } experts;
	/* expert_weights_norm when the file has none: true, but false for
	 * qwen2moe (Hugging Face's norm_topk_prob default, llama.cpp's graph) */
	bool experts_unnormed;
	/* a shared expert beside the routed ones (read_shared_expert) */
	bool shared_expert;
	/* keys of the namespace this family reads beyond key_rules' and read_window's (NULL-terminated) */
	const char *const *reads;
} families[] = {
	{ "llama", NX_ARCH_LLAMA, .rope_freqs = true, .experts = EXPERTS_MAY },
	{ "qwen2", NX_ARCH_QWEN2, .neox = true, .qkv_bias = true },
	{ "qwen3", NX_ARCH_QWEN3, .neox = true, .qk_norm = true },
	{ "qwen3moe", NX_ARCH_QWEN3MOE, .neox = true, .qk_norm = true, .experts = EXPERTS_ALWAYS },
	/* Phi-3, Phi-3.5, Phi-4(-mini): Hugging Face's Phi3 (rotate_half RoPE, its
	 * qkv_proj and gate_up_proj kept fused by llama.cpp's converter); one
	 * window for every layer */
	{ "phi3", NX_ARCH_PHI3, .neox = true, .fused_qkv = true, .fused_gate_up = true, .long_rope = true, .swa = true,
	  .swa_default = -1,
	  .reads = (const char *const[]){ "rope.scaling.attn_factor", NULL } },
	/* SmolLM3: llama's block (the converter permutes Q/K as for llama) without
	 * RoPE in every 4th layer; llama.cpp fixes the 4 (no key), as does
	 * Hugging Face's default no_rope_layers */
	{ "smollm3", NX_ARCH_SMOLLM3, .nope_every = 4 },
	/* Gemma 2: every other layer slides, from the first (HF's default window 4096) */
	{ "gemma2", NX_ARCH_GEMMA2, .neox = true, .gemma = true, .swa = true, .swa_global_every = 2,
	  .swa_default = 4096,
	  .reads = (const char *const[]){ "attn_logit_softcapping", "final_logit_softcapping", NULL } },
	/* Gemma 3: five layers of every six slide; no key, no sliding layers */
	{ "gemma3", NX_ARCH_GEMMA3, .neox = true, .qk_norm = true, .gemma = true, .swa = true, .swa_global_every = 6,
	  .reads = (const char *const[]){ "final_logit_softcapping", "rope.freq_base_swa", NULL } },
	/* Gemma 1 (gemma-2b/7b, CodeGemma): Gemma 2's block without what Gemma 2
	 * added (post-norms, soft-caps, sliding windows); the converter writes
	 * none of their keys, and key_rules refuses them on a gemma file */
	{ "gemma", NX_ARCH_GEMMA, .neox = true, .gemma = true },
	/* Qwen1.5-MoE, Qwen2-57B-A14B: qwen2's attention, every FFN experts plus
	 * the sigmoid-gated shared expert (Hugging Face's Qwen2MoeSparseMoeBlock) */
	{ "qwen2moe", NX_ARCH_QWEN2MOE, .neox = true, .qkv_bias = true, .experts = EXPERTS_ALWAYS,
	  .experts_unnormed = true, .shared_expert = true,
	  .reads = (const char *const[]){ "expert_shared_feed_forward_length", NULL } },
};

static const struct family *family_of(enum nx_arch a)
{
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
		if (families[i].arch == a)
			return &families[i];
	return &families[0];
}

const char *nx_arch_name(enum nx_arch a)
{
	return family_of(a)->name;
}

/* ---------------------------------------------------------------- metadata */

static int arch_u32(const struct gguf_file *g, const char *arch, const char *name, uint32_t *out,
		    bool required, struct nx_err *err)
{
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", arch, name);
	return gguf_get_u32(g, key, out, required, err);
}

static int arch_f32(const struct gguf_file *g, const char *arch, const char *name, float *out,
		    bool required, struct nx_err *err)
{
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", arch, name);
	return gguf_get_f32(g, key, out, required, err);
}

/* A value as a message shows it: numbers, bools, strings (cut at 48 bytes), array shapes. */
static void value_str(char *buf, size_t n, const struct gguf_value *v)
{
	switch (v->type) {
	case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64:
		snprintf(buf, n, "%llu", (unsigned long long)v->u64);
		break;
	case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
		snprintf(buf, n, "%lld", (long long)v->i64);
		break;
	case GGUF_F32: case GGUF_F64:
		snprintf(buf, n, "%g", v->f64);
		break;
	case GGUF_BOOL:
		snprintf(buf, n, "%s", v->u64 ? "true" : "false");
		break;
	case GGUF_STRING:
		snprintf(buf, n, "\"%.*s\"", (int)(v->str.len < 48 ? v->str.len : 48), v->str.p);
		break;
	default:
		snprintf(buf, n, "an array of %llu %s", (unsigned long long)v->arr.n, gguf_vtype_name(v->arr.type));
		break;
	}
}

static bool is_number(const struct gguf_value *v, double *out)
{
	switch (v->type) {
	case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64: case GGUF_BOOL:
		*out = (double)v->u64;
		return true;
	case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
		*out = (double)v->i64;
		return true;
	case GGUF_F32: case GGUF_F64:
		*out = v->f64;
		return true;
	default:
		return false;
	}
}

/* The value with which a key nxd does not implement changes nothing. */
enum neutral {
	NEVER,     /* every value changes the arithmetic */
	IF_ZERO,   /* 0 (a count of experts) */
	IF_ONE,    /* 1 (a multiplier; true for a bool) */
	IF_NONE,   /* the string "none" */
	IF_CTX,    /* at least context_length: a sliding window no position can leave */
};

/* Every key of the family's namespace ({arch}.name) that nxd knows. Keys with
 * why == NULL are read (read_hparams); the others change the arithmetic in a
 * way nxd does not implement and are refused, naming key, value and why,
 * unless they hold their neutral value. Any key of the namespace that is not
 * here is refused too: nxd cannot tell what it would change. */
static const struct key_rule {
	const char *name;
	const char *why;
	enum neutral neutral;
} key_rules[] = {
	{ "block_count", NULL, NEVER },
	{ "context_length", NULL, NEVER },
	{ "embedding_length", NULL, NEVER },
	{ "feed_forward_length", NULL, NEVER },
	{ "vocab_size", NULL, NEVER },
	{ "attention.head_count", NULL, NEVER },
	{ "attention.head_count_kv", NULL, NEVER },
	{ "attention.layer_norm_rms_epsilon", NULL, NEVER },
	{ "attention.key_length", NULL, NEVER },
	{ "attention.value_length", NULL, NEVER },
	{ "rope.dimension_count", NULL, NEVER },
	{ "rope.freq_base", NULL, NEVER },
	/* no arithmetic: whether the model was fine-tuned on the scaled context */
	{ "rope.scaling.finetuned", NULL, NEVER },
	{ "rope.scaling.type", NULL, NEVER },
	{ "rope.scaling.factor", NULL, NEVER },
	{ "rope.scale_linear", NULL, NEVER },
	{ "rope.scaling.original_context_length", NULL, NEVER },
	{ "rope.scaling.yarn_beta_fast", NULL, NEVER },
	{ "rope.scaling.yarn_beta_slow", NULL, NEVER },
	{ "rope.scaling.attn_factor", "a RoPE attention factor is not implemented", IF_ONE },
	{ "rope.scaling.yarn_ext_factor", "YaRN with a partial extrapolation mix is not implemented", IF_ONE },
	/* HF's attention_factor replaces YaRN's 0.1 ln(s) + 1, llama.cpp's
	 * multiplies it: the two disagree, so neither is guessed */
	{ "rope.scaling.yarn_attn_factor", "YaRN with an explicit attention factor is not implemented", NEVER },
	{ "rope.scaling.yarn_log_multiplier", "YaRN's log multiplier is not implemented", NEVER },
	{ "rope.freq_base_swa", "sliding-window layers' own RoPE base is not implemented", NEVER },
	{ "rope.dimension_sections", "multimodal RoPE sections are not implemented", NEVER },
	{ "attention.sliding_window", "sliding-window attention is not implemented", IF_CTX },
	{ "attention.sliding_window_pattern", "sliding-window attention is not implemented", NEVER },
	{ "attn_logit_softcapping", "soft-capping of the attention scores is not implemented", NEVER },
	{ "final_logit_softcapping", "soft-capping of the logits is not implemented", NEVER },
	{ "logit_scale", "a logit scale is not implemented", IF_ONE },
	{ "embedding_scale", "an embedding scale is not implemented", IF_ONE },
	{ "residual_scale", "a residual scale is not implemented", IF_ONE },
	{ "attention.scale", "an attention scale other than 1/sqrt(head dimension) is not implemented", NEVER },
	{ "attention.causal", "non-causal attention is not implemented", IF_ONE },
	{ "attention.layer_norm_epsilon", "LayerNorm (not RMSNorm) is not implemented", NEVER },
	{ "attention.clamp_kqv", "clamping Q, K and V is not implemented", NEVER },
	{ "attention.max_alibi_bias", "ALiBi is not implemented", IF_ZERO },
	{ "expert_count", "mixture-of-experts layers are not implemented for this architecture", IF_ZERO },
	{ "expert_used_count", "mixture-of-experts layers are not implemented for this architecture", IF_ZERO },
	{ "expert_feed_forward_length", "mixture-of-experts layers are not implemented for this architecture", IF_ZERO },
	{ "expert_weights_norm", "mixture-of-experts layers are not implemented for this architecture", NEVER },
	/* llama.cpp's enum: 1 softmax, 2 sigmoid, ... */
	{ "expert_gating_func", "only the softmax router (expert_gating_func 1) is implemented", IF_ONE },
	{ "expert_weights_scale", "a scale of the experts' weights is not implemented", IF_ONE },
	{ "expert_shared_count", "shared experts are not implemented", IF_ZERO },
	{ "expert_shared_feed_forward_length", "shared experts are not implemented", IF_ZERO },
	{ "expert_group_count", "grouped expert routing is not implemented", IF_ZERO },
	{ "expert_group_used_count", "grouped expert routing is not implemented", IF_ZERO },
	{ "leading_dense_block_count", "dense layers before the mixture-of-experts ones are not implemented", IF_ZERO },
	{ "moe_every_n_layers", "interleaved dense and mixture-of-experts layers are not implemented", IF_ZERO },
	{ "use_parallel_residual", "parallel residual blocks are not implemented", NEVER },
	{ "pooling_type", "embedding models (pooling) are not implemented", IF_ZERO },
};

/* The keys of key_rules that a family with experts reads (read_experts). */
static const char *const expert_keys[] = { "expert_count", "expert_used_count", "expert_feed_forward_length",
					   "expert_weights_norm" };

static bool is_expert_key(const struct key_rule *r)
{
	for (size_t i = 0; i < sizeof(expert_keys) / sizeof(expert_keys[0]); i++)
		if (!strcmp(r->name, expert_keys[i]))
			return true;
	return false;
}

static const struct key_rule *key_rule(const char *name, size_t len)
{
	for (size_t i = 0; i < sizeof(key_rules) / sizeof(key_rules[0]); i++)
		if (strlen(key_rules[i].name) == len && !memcmp(key_rules[i].name, name, len))
			return &key_rules[i];
	return NULL;
}

static bool is_neutral(const struct key_rule *r, const struct gguf_value *v, uint32_t n_ctx)
{
	double x;
	switch (r->neutral) {
	case IF_ZERO:
		return is_number(v, &x) && x == 0;
	case IF_ONE:
		return is_number(v, &x) && x == 1;
	case IF_NONE:
		return v->type == GGUF_STRING && v->str.len == 4 && !memcmp(v->str.p, "none", 4);
	case IF_CTX:
		return is_number(v, &x) && x >= n_ctx;
	default:
		return false;
	}
}

/* Whether the family reads key `name` (len bytes) of its namespace beyond key_rules' common ones. */
static bool family_reads(const struct family *fam, const char *name, size_t len)
{
	static const char window[] = "attention.sliding_window"; /* read_window's */
	if (fam->swa && len == sizeof(window) - 1 && !memcmp(window, name, len))
		return true;
	for (const char *const *k = fam->reads; k && *k; k++)
		if (strlen(*k) == len && !memcmp(*k, name, len))
			return true;
	return false;
}

/* Every key of the {arch}. namespace is one nxd reads, or one holding its
 * neutral value: anything else is refused by name (DESIGN.md "Model families"). */
static int check_keys(const struct gguf_file *g, const struct family *fam, uint32_t n_ctx, struct nx_err *err)
{
	const char *arch = fam->name;
	const size_t al = strlen(arch);
	for (uint64_t i = 0; i < g->n_kv; i++) {
		const struct gguf_str *k = &g->kv[i].key;
		if (k->len <= al + 1 || memcmp(k->p, arch, al) || k->p[al] != '.')
			continue;
		if (family_reads(fam, k->p + al + 1, (size_t)k->len - al - 1))
			continue;
		const struct key_rule *r = key_rule(k->p + al + 1, (size_t)k->len - al - 1);
		if (r && (!r->why || (fam->experts != EXPERTS_NEVER && is_expert_key(r)) || is_neutral(r, &g->kv[i].val, n_ctx)))
			continue;
		char val[80];
		value_str(val, sizeof(val), &g->kv[i].val);
		return nx_errf(err, "model: key '%.*s' = %s: %s; refused", (int)(k->len < 96 ? k->len : 96), k->p, val,
			       r ? r->why : "not a key nxd knows, so it may change the arithmetic");
	}
	return 0;
}

/* RoPE scaling as llama.cpp's loader reads it: rope.scaling.type (none,
 * linear, yarn; absent: linear, with rope.scaling.factor or the older
 * rope.scale_linear, 1 by default), and for YaRN the original context
 * (default: context_length) and beta_fast / beta_slow (32, 1). YaRN's ramp
 * and attention factor are Hugging Face's (modeling_rope_utils.py:
 * _compute_yarn_parameters), which llama.cpp's rope_yarn computes alike. */
static int read_rope_scaling(struct nx_hparams *hp, const struct gguf_file *g, const char *arch, struct nx_err *err)
{
	char key[128], *type = NULL;
	snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
	float factor = 0;
	if (gguf_get_str(g, key, &type, false, err) || arch_f32(g, arch, "rope.scaling.factor", &factor, false, err) ||
	    (factor == 0 && arch_f32(g, arch, "rope.scale_linear", &factor, false, err)))
		goto err;
	const bool given = factor != 0;
	if (!given)
		factor = 1;
	if (!(factor > 0 && isfinite(factor))) {
		nx_errf(err, "model: key '%s.rope.scaling.factor' = %g: expected a positive number", arch, factor);
		goto err;
	}
	hp->rope_scaling = NX_ROPE_NONE;
	hp->rope_factor = factor;
	hp->yarn_mscale = 1;
	hp->rope_attn_factor = 1;
	if (!type || !strcmp(type, "linear")) {
		if (factor != 1)
			hp->rope_scaling = NX_ROPE_LINEAR;
	} else if (!strcmp(type, "none")) {
		if (factor != 1) { /* llama.cpp would still scale by it */
			nx_errf(err, "model: key '%s.rope.scaling.type' = \"none\" with factor %g: contradictory; refused", arch, factor);
			goto err;
		}
	} else if (!strcmp(type, "yarn")) {
		uint32_t orig = (uint32_t)hp->n_ctx_train;
		float fast = 32, slow = 1;
		if (arch_u32(g, arch, "rope.scaling.original_context_length", &orig, false, err) ||
		    arch_f32(g, arch, "rope.scaling.yarn_beta_fast", &fast, false, err) ||
		    arch_f32(g, arch, "rope.scaling.yarn_beta_slow", &slow, false, err))
			goto err;
		/* below 1, HF's attention factor is 1 and llama.cpp's 0.1 ln(s) + 1 */
		if (!given || factor < 1 || orig < 1 || !(fast > 0 && slow > 0 && isfinite(fast) && isfinite(slow))) {
			nx_errf(err, "model: key '%s.rope.scaling.type' = \"yarn\" with factor %g, original_context_length %u, "
				"yarn_beta_fast %g, yarn_beta_slow %g: expected a factor >= 1, a context and positive betas; refused",
				arch, given ? factor : 0.0, orig, fast, slow);
			goto err;
		}
		/* the pair whose wavelength makes `rot` turns over the original context */
		const double d = hp->rope_dim, lb = 2 * log(hp->rope_base), two_pi = 6.283185307179586;
		double lo = floor(d * log(orig / (fast * two_pi)) / lb), hi = ceil(d * log(orig / (slow * two_pi)) / lb);
		lo = lo > 0 ? lo : 0;
		hi = hi < d - 1 ? hi : d - 1;
		if (hi < lo) { /* HF's ramp would run backwards, llama.cpp's not */
			nx_errf(err, "model: %s.rope.scaling: YaRN's correction dimensions %g > %g (original_context_length %u, "
				"betas %g, %g); refused", arch, lo, hi, orig, fast, slow);
			goto err;
		}
		hp->rope_scaling = NX_ROPE_YARN;
		hp->yarn_lo = (float)lo;
		hp->yarn_hi = (float)hi;
		hp->yarn_mscale = (float)(0.1 * log(factor) + 1);
	} else {
		nx_errf(err, "model: key '%s.rope.scaling.type' = \"%.32s\": only none, linear and yarn are implemented; refused",
			arch, type);
		goto err;
	}
	free(type);
	return 0;
err:
	free(type);
	return -1;
}

/* {arch}.attention.sliding_window (fam->swa): the window of the layers that
 * slide (nx_layer_window), whose tokens attend to their last W positions, the
 * token's own among them (Hugging Face's sliding-window mask, kv > q - W);
 * 0 is none (what the converter writes for phi3 without one: Phi-4; gemma3
 * without sliding layers). Absent: the family's default, or refused where
 * llama.cpp's loader requires the key (phi3: files from converters that did
 * not write it do not say their window; Phi-3-mini-4k's is 2047, which
 * llama.cpp guesses from the shapes). llama.cpp ignores phi3's window;
 * Hugging Face applies it, and nxd is graded against Hugging Face. */
static int read_window(struct nx_hparams *hp, const struct gguf_file *g, const struct family *fam, struct nx_err *err)
{
	const char *arch = fam->name;
	char key[128];
	snprintf(key, sizeof(key), "%s.attention.sliding_window", arch);
	if (fam->swa_default < 0 && !gguf_get(g, key))
		return nx_errf(err, "model: key '%s' is missing: the file does not say its sliding window; refused", key);
	uint32_t w = fam->swa_default < 0 ? 0 : (uint32_t)fam->swa_default;
	if (arch_u32(g, arch, "attention.sliding_window", &w, false, err))
		return -1;
	hp->swa_window = w > INT32_MAX ? INT32_MAX : (int)w;
	hp->swa_global_every = fam->swa_global_every;
	return 0;
}

/* Gemma's hyper-parameters, as llama.cpp's loader reads them (llama-model.cpp,
 * LLM_ARCH_GEMMA / GEMMA2 / GEMMA3) for Hugging Face's Gemma / Gemma2 / Gemma3
 * models:
 * - the attention scale 1/sqrt(query_pre_attn_scalar), which the file does not
 *   hold: head_dim, except for the 27B models (46 gemma2 layers, 62 gemma3),
 *   whose scalar is dim / n_head (gemma_pytorch's config); Gemma 1's is
 *   head_dim's (modeling_gemma.py: head_dim**-0.5), the default;
 * - gemma2's sliding window (read_window) is never 0; gemma3's sliding layers
 *   rotate with base 10000 (or rope.freq_base_swa) unscaled;
 * - gemma2's soft-caps default to 50 (attention) and 30 (logits), HF's and
 *   llama.cpp's; gemma3's final_logit_softcapping only when the file has it;
 * - Gemma 1 has neither caps nor post-norms (its HF post_attention_layernorm
 *   is the FFN's pre-norm, ffn_norm). */
static int read_gemma(struct nx_hparams *hp, const struct gguf_file *g, const struct family *fam, struct nx_err *err)
{
	const char *arch = fam->name;
	if (hp->rope_scaling == NX_ROPE_YARN)
		return nx_errf(err, "model: key '%s.rope.scaling.type' = \"yarn\": YaRN on %s is not implemented; refused",
			       arch, arch);
	hp->gelu = true;
	hp->embd_scale = (float)sqrt((double)hp->dim);
	if (fam->arch == NX_ARCH_GEMMA)
		return 0;
	const bool g2 = fam->arch == NX_ARCH_GEMMA2;
	float attn_cap = g2 ? 50 : 0, final_cap = g2 ? 30 : 0, base_swa = 10000.0f;
	if ((g2 && arch_f32(g, arch, "attn_logit_softcapping", &attn_cap, false, err)) ||
	    arch_f32(g, arch, "final_logit_softcapping", &final_cap, false, err) ||
	    (!g2 && arch_f32(g, arch, "rope.freq_base_swa", &base_swa, false, err)))
		return -1;
	if (g2 && hp->swa_window == 0)
		return nx_errf(err, "model: key '%s.attention.sliding_window' = 0: expected a window of at least 1 "
			       "position", arch);
	if (!(attn_cap >= 0 && isfinite(attn_cap)) || (g2 && attn_cap == 0))
		return nx_errf(err, "model: key '%s.attn_logit_softcapping' = %g: expected a positive cap", arch, attn_cap);
	char key[128];
	snprintf(key, sizeof(key), "%s.final_logit_softcapping", arch);
	if (!(final_cap >= 0 && isfinite(final_cap)) || (final_cap == 0 && gguf_get(g, key)))
		return nx_errf(err, "model: key '%s.final_logit_softcapping' = %g: expected a positive cap", arch,
			       final_cap);
	if (!(base_swa > 1 && isfinite(base_swa)))
		return nx_errf(err, "model: key '%s.rope.freq_base_swa' = %g: expected > 1", arch, base_swa);
	hp->post_norms = true;
	const bool is_27b = hp->n_layer == (g2 ? 46 : 62);
	const int scalar = is_27b ? hp->dim / hp->n_head : hp->head_dim;
	hp->attn_scale = 1.0f / sqrtf((float)scalar);
	hp->attn_softcap = attn_cap;
	hp->final_softcap = final_cap;
	hp->rope_base_swa = hp->swa_window > 0 && !g2 ? base_swa : 0;
	return 0;
}

/* Upper bound on any single dimension: keeps products of a few of them far
 * from overflowing int64 / size_t and rejects absurd headers early. */
#define NX_MAX_DIM (1 << 24)

/* The experts as llama.cpp's loader reads them: expert_count and
 * expert_used_count; an expert's feed-forward length from
 * expert_feed_forward_length, else (as llama.cpp does) feed_forward_length
 * for llama (Mixtral's converter writes the expert's there) and
 * feed_forward_length / expert_used_count for qwen3moe and qwen2moe;
 * expert_weights_norm (absent: true, as llama.cpp computes both and Qwen3 MoE
 * releases set norm_topk_prob; false for qwen2moe, whose releases and Hugging
 * Face's default leave norm_topk_prob false and whose llama.cpp graph never
 * normalises; a qwen2moe file that says true gets Hugging Face's true).
 * With experts, every layer's FFN is the experts (no dense FFN tensor is
 * read: one in the file is refused), so n_ff becomes the expert's length. */
static int read_experts(struct nx_hparams *hp, const struct gguf_file *g, const char *arch, const struct family *fam,
			struct nx_err *err)
{
	uint32_t n_expert = 0, n_used = 0, n_ff_exp = 0;
	bool norm = !fam->experts_unnormed;
	if (fam->experts == EXPERTS_NEVER)
		return 0;
	if (arch_u32(g, arch, "expert_count", &n_expert, fam->experts == EXPERTS_ALWAYS, err))
		return -1;
	if (n_expert == 0 && fam->experts == EXPERTS_MAY)
		return 0;
	char key[128];
	snprintf(key, sizeof(key), "%s.expert_weights_norm", arch);
	if (arch_u32(g, arch, "expert_used_count", &n_used, true, err) || gguf_get_bool(g, key, &norm, false, err))
		return -1;
	if (n_expert < 1 || n_expert > NX_MOE_MAX_EXPERTS || n_used < 1 || n_used > n_expert)
		return nx_errf(err, "model: %s.expert_count = %u, expert_used_count = %u: expected 1 <= used <= count <= %d",
			       arch, n_expert, n_used, NX_MOE_MAX_EXPERTS);
	n_ff_exp = fam->experts == EXPERTS_ALWAYS ? (uint32_t)hp->n_ff / n_used : (uint32_t)hp->n_ff;
	if (arch_u32(g, arch, "expert_feed_forward_length", &n_ff_exp, false, err))
		return -1;
	if (n_ff_exp < 1 || n_ff_exp > NX_MAX_DIM)
		return nx_errf(err, "model: %s.expert_feed_forward_length = %u out of range", arch, n_ff_exp);
	hp->n_expert = (int)n_expert;
	hp->n_expert_used = (int)n_used;
	hp->n_ff_exp = (int)n_ff_exp;
	hp->n_ff = (int)n_ff_exp;
	hp->moe_norm_w = norm;
	return 0;
}

/* qwen2moe's shared expert as llama.cpp's loader reads it: its FFN length
 * expert_shared_feed_forward_length, else feed_forward_length (Hugging Face's
 * intermediate_size, which Qwen1.5-MoE sets to the shared expert's). Read
 * before read_experts, which makes n_ff the routed experts' length. */
static int read_shared_expert(struct nx_hparams *hp, const struct gguf_file *g, const char *arch, struct nx_err *err)
{
	uint32_t n = (uint32_t)hp->n_ff;
	if (arch_u32(g, arch, "expert_shared_feed_forward_length", &n, false, err))
		return -1;
	if (n < 1 || n > NX_MAX_DIM)
		return nx_errf(err, "model: %s.expert_shared_feed_forward_length = %u out of range", arch, n);
	hp->n_ff_shexp = (int)n;
	return 0;
}

static int read_hparams(struct nx_hparams *hp, const struct gguf_file *g, struct nx_err *err)
{
	char *arch = NULL;
	if (gguf_get_str(g, "general.architecture", &arch, true, err))
		return -1;
	const struct family *fam = NULL;
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
		if (!strcmp(arch, families[i].name))
			fam = &families[i];
	if (!fam) {
		nx_errf(err, "model: architecture '%.64s' is not supported (llama, qwen2, qwen3, qwen3moe, qwen2moe, phi3, "
			"smollm3, gemma, gemma2, gemma3)", arch);
		free(arch);
		return -1;
	}
	hp->arch = fam->arch;

	uint32_t n_layer = 0, dim = 0, n_ff = 0, n_head = 0, n_ctx = 0;
	if (arch_u32(g, arch, "block_count", &n_layer, true, err) ||
	    arch_u32(g, arch, "embedding_length", &dim, true, err) ||
	    arch_u32(g, arch, "feed_forward_length", &n_ff, true, err) ||
	    arch_u32(g, arch, "attention.head_count", &n_head, true, err) ||
	    arch_u32(g, arch, "context_length", &n_ctx, true, err) || check_keys(g, fam, n_ctx, err))
		goto err;
	uint32_t n_head_kv = n_head;
	if (arch_u32(g, arch, "attention.head_count_kv", &n_head_kv, false, err))
		goto err;
	float eps = 0;
	if (arch_f32(g, arch, "attention.layer_norm_rms_epsilon", &eps, true, err))
		goto err;
	float base = 10000.0f;
	if (arch_f32(g, arch, "rope.freq_base", &base, false, err))
		goto err;

	if (n_layer < 1 || n_layer > NX_MAX_LAYERS) {
		nx_errf(err, "model: %s.block_count = %u, expected 1..%d", arch, n_layer, NX_MAX_LAYERS);
		goto err;
	}
	if (dim < 1 || dim > NX_MAX_DIM || n_ff < 1 || n_ff > NX_MAX_DIM) {
		nx_errf(err, "model: %s.embedding_length = %u / feed_forward_length = %u out of range",
			arch, dim, n_ff);
		goto err;
	}
	if (n_head < 1 || n_head > 4096 || n_head_kv < 1 || n_head % n_head_kv != 0) {
		nx_errf(err, "model: %s.attention.head_count = %u, head_count_kv = %u: need head_count a multiple of head_count_kv",
			arch, n_head, n_head_kv);
		goto err;
	}
	/* head_dim is dim / n_head unless the file says otherwise (key_length);
	 * Q has n_head of them, Wo maps them back to dim. */
	uint32_t head_dim = dim % n_head ? 0 : dim / n_head;
	if (arch_u32(g, arch, "attention.key_length", &head_dim, false, err))
		goto err;
	uint32_t v_dim = head_dim;
	if (arch_u32(g, arch, "attention.value_length", &v_dim, false, err))
		goto err;
	if (v_dim != head_dim) {
		nx_errf(err, "model: %s.attention.value_length = %u, key_length = %u: value heads of another size "
			"than key heads are not supported; refused", arch, v_dim, head_dim);
		goto err;
	}
	if (head_dim < 2 || head_dim > 4096 || head_dim % 2 != 0) {
		nx_errf(err, "model: head dimension %u (embedding_length %u / head_count %u, key_length) is not supported",
			head_dim, dim, n_head);
		goto err;
	}
	uint32_t rope_dim = head_dim;
	if (arch_u32(g, arch, "rope.dimension_count", &rope_dim, false, err))
		goto err;
	if (rope_dim < 2 || rope_dim > head_dim || rope_dim % 2 != 0) {
		nx_errf(err, "model: %s.rope.dimension_count = %u, expected an even number in 2..%u",
			arch, rope_dim, head_dim);
		goto err;
	}
	if (!(eps > 0 && eps < 1)) {
		nx_errf(err, "model: %s.attention.layer_norm_rms_epsilon = %g, expected in (0, 1)", arch, eps);
		goto err;
	}
	if (!(base > 1 && isfinite(base))) {
		nx_errf(err, "model: %s.rope.freq_base = %g, expected > 1", arch, base);
		goto err;
	}
	if (n_ctx < 1) {
		nx_errf(err, "model: %s.context_length = 0", arch);
		goto err;
	}

	hp->n_layer = (int)n_layer;
	hp->dim = (int)dim;
	hp->n_ff = (int)n_ff;
	hp->n_head = (int)n_head;
	hp->n_head_kv = (int)n_head_kv;
	hp->head_dim = (int)head_dim;
	hp->rope_dim = (int)rope_dim;
	hp->n_ctx_train = n_ctx > INT32_MAX ? INT32_MAX : (int)n_ctx;
	hp->rope_base = base;
	hp->norm_eps = eps;
	hp->rope_neox = fam->neox;
	hp->qk_norm = fam->qk_norm;
	hp->nope_every = fam->nope_every;
	if (read_rope_scaling(hp, g, arch, err) || (fam->swa && read_window(hp, g, fam, err)) ||
	    (fam->gemma && read_gemma(hp, g, fam, err)) || (fam->shared_expert && read_shared_expert(hp, g, arch, err)) ||
	    read_experts(hp, g, arch, fam, err))
		goto err;

	/* Vocabulary size: from metadata when present, else the embedding rows (set by the caller). */
	uint32_t n_vocab = 0;
	if (arch_u32(g, arch, "vocab_size", &n_vocab, false, err))
		goto err;
	hp->n_vocab = (int)n_vocab;
	free(arch);
	return 0;
err:
	free(arch);
	return -1;
}

/* ---------------------------------------------------------------- tensors */

static const struct gguf_tensor *need(const struct gguf_file *g, const char *name, struct nx_err *err)
{
	const struct gguf_tensor *t = gguf_find_tensor(g, name);
	if (!t)
		nx_errf(err, "model: tensor '%s' is missing", name);
	return t;
}

static void shape_str(char *buf, size_t n, const struct gguf_tensor *t)
{
	int off = snprintf(buf, n, "[");
	for (uint32_t i = 0; i < t->n_dims && off > 0 && (size_t)off < n; i++)
		off += snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)t->ne[i]);
	if (off > 0 && (size_t)off < n)
		snprintf(buf + off, n - off, "]");
}

/* Checks that t is exactly (ne0) or (ne0, ne1); ne1 = 0 means a vector. */
static int check_shape(const struct gguf_tensor *t, const char *name, int64_t ne0, int64_t ne1, struct nx_err *err)
{
	bool ok = t->ne[0] == ne0 && t->ne[2] == 1 && t->ne[3] == 1 && (ne1 ? t->ne[1] == ne1 : t->ne[1] == 1);
	if (ok)
		return 0;
	char have[96];
	shape_str(have, sizeof(have), t);
	if (ne1)
		return nx_errf(err, "model: tensor '%s' has shape %s, expected [%lld, %lld]", name, have,
			       (long long)ne0, (long long)ne1);
	return nx_errf(err, "model: tensor '%s' has shape %s, expected [%lld]", name, have, (long long)ne0);
}

/* Kernels read F32 data as floats and blocks through structs of f16 fields; a
 * file with general.alignment 1 or 2 may place data at any address. */
static int check_aligned(const struct gguf_file *g, const struct gguf_tensor *t, const char *name, struct nx_err *err)
{
	if ((uintptr_t)t->data % sizeof(float) == 0)
		return 0;
	return nx_errf(err, "model: tensor '%s': data at file offset %llu is not %zu-byte aligned (general.alignment %llu)",
		       name, (unsigned long long)((const uint8_t *)t->data - g->base), sizeof(float),
		       (unsigned long long)g->alignment);
}

/* A norm or bias vector of n floats. */
static int bind_vec(const float **out, const struct gguf_file *g, const char *name, int64_t n, struct nx_err *err)
{
	const struct gguf_tensor *t = need(g, name, err);
	if (!t || check_shape(t, name, n, 0, err))
		return -1;
	if (t->type != NX_F32)
		return nx_errf(err, "model: tensor '%s' has type %s, expected f32", name, nx_type_name(t->type));
	if (check_aligned(g, t, name, err))
		return -1;
	*out = t->data;
	return 0;
}

static int bind_wt_rows(struct nx_wt *w, const struct gguf_file *g, const struct gguf_tensor *t, const char *name,
			int64_t n_in, int64_t n_out, struct nx_err *err);

/* A weight matrix (n_out, n_in) whose type we can dot: its activation type
 * must be producible for rows of n_in elements. */
static int bind_wt(struct nx_wt *w, const struct gguf_file *g, const char *name, int64_t n_in, int64_t n_out,
		   struct nx_err *err)
{
	const struct gguf_tensor *t = need(g, name, err);
	if (!t || check_shape(t, name, n_in, n_out, err))
		return -1;
	return bind_wt_rows(w, g, t, name, n_in, n_out, err);
}

/* Experts' matrices stacked in one tensor [n_in, rows, n_expert] (the
 * converter's ffn_*_exps): bound as one matrix of n_expert * rows rows,
 * expert e's from row e * rows (model/moe.h: nx_moe_expert). */
static int bind_experts(struct nx_wt *w, const struct gguf_file *g, const char *name, int64_t n_in, int64_t rows,
			int64_t n_expert, struct nx_err *err)
{
	const struct gguf_tensor *t = need(g, name, err);
	if (!t)
		return -1;
	if (t->ne[0] != n_in || t->ne[1] != rows || t->ne[2] != n_expert || t->ne[3] != 1) {
		char have[96];
		shape_str(have, sizeof(have), t);
		return nx_errf(err, "model: tensor '%s' has shape %s, expected [%lld, %lld, %lld]", name, have,
			       (long long)n_in, (long long)rows, (long long)n_expert);
	}
	return bind_wt_rows(w, g, t, name, n_in, rows * n_expert, err);
}

/* bind_wt's checks of a tensor of the right shape: n_out rows of n_in. */
static int bind_wt_rows(struct nx_wt *w, const struct gguf_file *g, const struct gguf_tensor *t, const char *name,
			int64_t n_in, int64_t n_out, struct nx_err *err)
{
	if (check_aligned(g, t, name, err))
		return -1;
	const struct nx_type_traits *tr = nx_type_supported(t->type) ? nx_type_get(t->type) : NULL;
	if (!tr || !tr->dequant || !tr->dot)
		return nx_errf(err, "model: tensor '%s' has unsupported type %s", name, nx_type_name(t->type));
	int64_t row = nx_row_size(t->type, n_in);
	if (row < 0)
		return nx_errf(err, "model: tensor '%s': rows of %lld elements do not fit type %s blocks", name,
			       (long long)n_in, nx_type_name(t->type));
	enum nx_type vt = tr->vec_dot_type;
	if (vt != NX_F32) {
		const struct nx_type_traits *vtr = nx_type_get(vt);
		if (!vtr || !vtr->quant2 || nx_row_size(vt, n_in) < 0) /* forward.c: prep_act_q, two parts */
			return nx_errf(err, "model: tensor '%s' (%s): rows of %lld elements cannot be quantized to %s",
				       name, nx_type_name(t->type), (long long)n_in, nx_type_name(vt));
	}
	/* gguf_parse checked the data range against ne and the type; guard the arithmetic here anyway. */
	if ((uint64_t)row * (uint64_t)n_out != t->size)
		return nx_errf(err, "model: tensor '%s' holds %llu bytes, expected %llu", name,
			       (unsigned long long)t->size, (unsigned long long)row * (unsigned long long)n_out);
	w->type = t->type;
	w->n_in = n_in;
	w->n_out = n_out;
	w->row_bytes = (size_t)row;
	w->data = t->data;
	return 0;
}

/* Rows [r0, r0 + n) of a fused matrix w (tensor `name`) as a matrix of their
 * own: phi3's Q, K and V in attn_qkv, gate and up in ffn_up (Hugging Face's
 * qkv_proj split and gate_up_proj's chunk(2): gate first, as llama.cpp's
 * swiglu takes the first half). */
static int wt_rows(struct nx_wt *out, const struct nx_wt *w, int64_t r0, int64_t n, const char *name,
		   struct nx_err *err)
{
	*out = *w;
	out->data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
	out->n_out = n;
	if ((uintptr_t)out->data % sizeof(float))
		return nx_errf(err, "model: tensor '%s': its rows from %lld (%zu bytes each) are not %zu-byte aligned",
			       name, (long long)r0, w->row_bytes, sizeof(float));
	return 0;
}

static int bind_layer(struct nx_layer *L, int il, const struct nx_hparams *hp, const struct gguf_file *g,
		      struct nx_err *err)
{
	const int64_t dim = hp->dim, q_dim = (int64_t)hp->n_head * hp->head_dim,
		      kv_dim = (int64_t)hp->n_head_kv * hp->head_dim, n_ff = hp->n_ff;
	char name[96];
#define NAME(s) (snprintf(name, sizeof(name), "blk.%d." s, il), name)
	memset(L, 0, sizeof(*L));
	const struct family *fam = family_of(hp->arch);
	if (bind_vec(&L->attn_norm, g, NAME("attn_norm.weight"), dim, err) ||
	    bind_wt(&L->wo, g, NAME("attn_output.weight"), q_dim, dim, err) ||
	    bind_vec(&L->ffn_norm, g, NAME("ffn_norm.weight"), dim, err))
		return -1;
	if (fam->fused_qkv) {
		struct nx_wt qkv;
		if (bind_wt(&qkv, g, NAME("attn_qkv.weight"), dim, q_dim + 2 * kv_dim, err) ||
		    wt_rows(&L->wq, &qkv, 0, q_dim, name, err) || wt_rows(&L->wk, &qkv, q_dim, kv_dim, name, err) ||
		    wt_rows(&L->wv, &qkv, q_dim + kv_dim, kv_dim, name, err))
			return -1;
	} else if (bind_wt(&L->wq, g, NAME("attn_q.weight"), dim, q_dim, err) ||
		   bind_wt(&L->wk, g, NAME("attn_k.weight"), dim, kv_dim, err) ||
		   bind_wt(&L->wv, g, NAME("attn_v.weight"), dim, kv_dim, err)) {
		return -1;
	}
	if (hp->n_expert) {
		const int64_t ne = hp->n_expert;
		if (bind_wt(&L->moe_router, g, NAME("ffn_gate_inp.weight"), dim, ne, err) ||
		    bind_experts(&L->moe_gate, g, NAME("ffn_gate_exps.weight"), dim, n_ff, ne, err) ||
		    bind_experts(&L->moe_up, g, NAME("ffn_up_exps.weight"), dim, n_ff, ne, err) ||
		    bind_experts(&L->moe_down, g, NAME("ffn_down_exps.weight"), n_ff, dim, ne, err))
			return -1;
		const int64_t n_sh = hp->n_ff_shexp;
		if (n_sh && (bind_wt(&L->shexp_gate_inp, g, NAME("ffn_gate_inp_shexp.weight"), dim, 1, err) ||
			     bind_wt(&L->shexp_gate, g, NAME("ffn_gate_shexp.weight"), dim, n_sh, err) ||
			     bind_wt(&L->shexp_up, g, NAME("ffn_up_shexp.weight"), dim, n_sh, err) ||
			     bind_wt(&L->shexp_down, g, NAME("ffn_down_shexp.weight"), n_sh, dim, err)))
			return -1;
	} else if (bind_wt(&L->w_down, g, NAME("ffn_down.weight"), n_ff, dim, err)) {
		return -1;
	} else if (fam->fused_gate_up) {
		struct nx_wt gate_up;
		if (bind_wt(&gate_up, g, NAME("ffn_up.weight"), dim, 2 * n_ff, err) ||
		    wt_rows(&L->w_gate, &gate_up, 0, n_ff, name, err) || wt_rows(&L->w_up, &gate_up, n_ff, n_ff, name, err))
			return -1;
	} else if (bind_wt(&L->w_gate, g, NAME("ffn_gate.weight"), dim, n_ff, err) ||
		   bind_wt(&L->w_up, g, NAME("ffn_up.weight"), dim, n_ff, err)) {
		return -1;
	}
	if (fam->qkv_bias) {
		if (bind_vec(&L->bq, g, NAME("attn_q.bias"), q_dim, err) ||
		    bind_vec(&L->bk, g, NAME("attn_k.bias"), kv_dim, err) ||
		    bind_vec(&L->bv, g, NAME("attn_v.bias"), kv_dim, err))
			return -1;
	}
	if (hp->qk_norm) {
		if (bind_vec(&L->q_norm, g, NAME("attn_q_norm.weight"), hp->head_dim, err) ||
		    bind_vec(&L->k_norm, g, NAME("attn_k_norm.weight"), hp->head_dim, err))
			return -1;
	}
	if (hp->post_norms) { /* gguf-py's ATTN_POST_NORM, FFN_POST_NORM */
		if (bind_vec(&L->attn_post_norm, g, NAME("post_attention_norm.weight"), dim, err) ||
		    bind_vec(&L->ffn_post_norm, g, NAME("post_ffw_norm.weight"), dim, err))
			return -1;
	}
#undef NAME
	return 0;
}

/* rope_freqs.weight (llama, optional): each rotation pair's frequency
 * divisor, as llama.cpp applies it (Llama 3.1+'s converter writes HF's
 * "llama3" rope type this way). Not graded together with a scaling type. */
static int bind_rope_freqs(struct nx_model *m, const struct gguf_file *g, struct nx_err *err)
{
	const char *name = "rope_freqs.weight";
	const int half = m->hp.rope_dim / 2;
	if (!gguf_find_tensor(g, name))
		return 0;
	if (m->hp.rope_scaling != NX_ROPE_NONE)
		return nx_errf(err, "model: tensor '%s' together with RoPE scaling (rope.scaling.type, factor %g) is not "
			       "implemented; refused", name, m->hp.rope_factor);
	if (bind_vec(&m->rope_freqs, g, name, half, err))
		return -1;
	for (int i = 0; i < half; i++)
		if (!(m->rope_freqs[i] > 0 && isfinite(m->rope_freqs[i])))
			return nx_errf(err, "model: tensor '%s': element %d is %g, expected a positive number", name, i,
				       m->rope_freqs[i]);
	return 0;
}

/* rope_factors_long.weight and rope_factors_short.weight (phi3, optional,
 * both or neither): LongRoPE's per-pair frequency divisors past the original
 * context and within it (Hugging Face's long_factor, short_factor), and the
 * attention factor on cos and sin: rope.scaling.attn_factor as the converter
 * writes it, else Hugging Face's default sqrt(1 + ln(s) / ln(original)) for
 * s = context_length / original_context_length > 1 (1 otherwise). */
static int bind_long_rope(struct nx_model *m, const struct gguf_file *g, const char *arch, struct nx_err *err)
{
	struct nx_hparams *hp = &m->hp;
	const char *ln = "rope_factors_long.weight", *sn = "rope_factors_short.weight";
	const bool has_l = gguf_find_tensor(g, ln), has_s = gguf_find_tensor(g, sn);
	float af = 0;
	uint32_t orig = 0;
	if (arch_f32(g, arch, "rope.scaling.attn_factor", &af, false, err))
		return -1;
	if (!has_l && !has_s) {
		if (af != 0 && af != 1)
			return nx_errf(err, "model: key '%s.rope.scaling.attn_factor' = %g without LongRoPE factors (%s, %s): "
				       "an attention factor on plain RoPE is not implemented; refused", arch, af, ln, sn);
		return 0;
	}
	if (!has_l || !has_s)
		return nx_errf(err, "model: tensor '%s' without '%s': LongRoPE needs both; refused", has_l ? ln : sn,
			       has_l ? sn : ln);
	if (hp->rope_scaling != NX_ROPE_NONE)
		return nx_errf(err, "model: LongRoPE factors (%s) together with RoPE scaling (rope.scaling.type, factor %g) "
			       "are not implemented; refused", ln, hp->rope_factor);
	if (arch_u32(g, arch, "rope.scaling.original_context_length", &orig, true, err))
		return -1;
	if (orig < 2 || orig > (uint32_t)hp->n_ctx_train)
		return nx_errf(err, "model: key '%s.rope.scaling.original_context_length' = %u: expected 2..context_length "
			       "(%d) with LongRoPE factors", arch, orig, hp->n_ctx_train);
	const int half = hp->rope_dim / 2;
	if (bind_vec(&m->rope_long, g, ln, half, err) || bind_vec(&m->rope_short, g, sn, half, err))
		return -1;
	for (int i = 0; i < half; i++)
		if (!(m->rope_long[i] > 0 && isfinite(m->rope_long[i]) && m->rope_short[i] > 0 && isfinite(m->rope_short[i])))
			return nx_errf(err, "model: tensor '%s' or '%s': element %d is %g / %g, expected positive numbers", ln,
				       sn, i, m->rope_long[i], m->rope_short[i]);
	if (af == 0) {
		const double s = (double)hp->n_ctx_train / orig;
		af = s > 1 ? (float)sqrt(1 + log(s) / log((double)orig)) : 1.0f;
	}
	if (!(af > 0 && isfinite(af)))
		return nx_errf(err, "model: key '%s.rope.scaling.attn_factor' = %g: expected a positive number", arch, af);
	hp->rope_attn_factor = af;
	hp->rope_orig_ctx = (int)orig;
	return 0;
}

const float *nx_model_rope_factors(const struct nx_model *m, int n_ctx)
{
	if (m->rope_long)
		return n_ctx > m->hp.rope_orig_ctx ? m->rope_long : m->rope_short;
	return m->rope_freqs;
}

/* Whether the model reads the tensor data at p (tensors never overlap: gguf_parse). */
static bool is_bound(const struct nx_model *m, const void *p)
{
	if (p == m->tok_embd.data || p == m->output.data || p == (const void *)m->out_norm ||
	    p == (const void *)m->rope_freqs || p == (const void *)m->rope_long || p == (const void *)m->rope_short)
		return true;
	for (int il = 0; il < m->hp.n_layer; il++) {
		const struct nx_layer *L = &m->layers[il];
		const void *const ptrs[] = { L->attn_norm, L->wq.data, L->wk.data, L->wv.data, L->bq, L->bk, L->bv,
					     L->q_norm, L->k_norm, L->wo.data, L->ffn_norm, L->w_gate.data,
					     L->w_up.data, L->w_down.data, L->attn_post_norm, L->ffn_post_norm,
					     L->moe_router.data, L->moe_gate.data, L->moe_up.data, L->moe_down.data,
					     L->shexp_gate_inp.data, L->shexp_gate.data, L->shexp_up.data,
					     L->shexp_down.data };
		for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
			if (p == ptrs[i])
				return true;
	}
	return false;
}

/* A tensor the forward pass would not read is refused by name: it is there
 * because the architecture uses it (a norm, a bias, RoPE factors, experts),
 * and computing without it would be silently wrong. */
static int check_all_bound(const struct nx_model *m, const struct gguf_file *g, const char *arch, struct nx_err *err)
{
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->tensors[i];
		if (!is_bound(m, t->data))
			return nx_errf(err, "model: tensor '%.*s' is not one nxd's %s reads; computing without it "
				       "would be wrong, so the file is refused", (int)(t->name.len < 96 ? t->name.len : 96),
				       t->name.p, arch);
	}
	return 0;
}

int nx_model_bind(struct nx_model *m, const struct gguf_file *g, struct nx_err *err)
{
	memset(m, 0, sizeof(*m));
	struct nx_hparams *hp = &m->hp;
	if (read_hparams(hp, g, err))
		return -1;

	/* The embedding fixes the vocabulary when metadata does not. */
	const struct gguf_tensor *te = need(g, "token_embd.weight", err);
	if (!te)
		return -1;
	if (hp->n_vocab == 0) {
		if (te->ne[1] < 1 || te->ne[1] > INT32_MAX)
			return nx_errf(err, "model: tensor 'token_embd.weight' has %lld rows", (long long)te->ne[1]);
		hp->n_vocab = (int)te->ne[1];
	}
	if (bind_wt(&m->tok_embd, g, "token_embd.weight", hp->dim, hp->n_vocab, err) ||
	    bind_vec(&m->out_norm, g, "output_norm.weight", hp->dim, err))
		return -1;
	if (gguf_find_tensor(g, "output.weight")) {
		if (bind_wt(&m->output, g, "output.weight", hp->dim, hp->n_vocab, err))
			return -1;
	} else {
		m->output = m->tok_embd; /* tied embeddings */
	}
	if (family_of(hp->arch)->rope_freqs && bind_rope_freqs(m, g, err))
		return -1;
	if (family_of(hp->arch)->long_rope && bind_long_rope(m, g, nx_arch_name(hp->arch), err))
		return -1;
	for (int il = 0; il < hp->n_layer; il++)
		if (bind_layer(&m->layers[il], il, hp, g, err))
			return -1;
	return check_all_bound(m, g, nx_arch_name(hp->arch), err);
}
