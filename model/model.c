/* model.c - binds a llama / qwen2 model to the tensors of a parsed GGUF file, checking every shape and type. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Upper bound on any single dimension: keeps products of a few of them far
 * from overflowing int64 / size_t and rejects absurd headers early. */
#define NX_MAX_DIM (1 << 24)

static int read_hparams(struct nx_hparams *hp, const struct gguf_file *g, struct nx_err *err)
{
	char *arch = NULL;
	if (gguf_get_str(g, "general.architecture", &arch, true, err))
		return -1;
	if (strcmp(arch, "llama") == 0) {
		hp->arch = NX_ARCH_LLAMA;
	} else if (strcmp(arch, "qwen2") == 0) {
		hp->arch = NX_ARCH_QWEN2;
	} else {
		nx_errf(err, "model: architecture '%.64s' is not supported (llama, qwen2)", arch);
		free(arch);
		return -1;
	}

	uint32_t n_layer = 0, dim = 0, n_ff = 0, n_head = 0, n_ctx = 0;
	if (arch_u32(g, arch, "block_count", &n_layer, true, err) ||
	    arch_u32(g, arch, "embedding_length", &dim, true, err) ||
	    arch_u32(g, arch, "feed_forward_length", &n_ff, true, err) ||
	    arch_u32(g, arch, "attention.head_count", &n_head, true, err) ||
	    arch_u32(g, arch, "context_length", &n_ctx, true, err))
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
	/* head_dim is dim / n_head unless the file says otherwise (key_length). */
	uint32_t head_dim = dim / n_head;
	if (dim % n_head != 0)
		head_dim = 0;
	if (arch_u32(g, arch, "attention.key_length", &head_dim, false, err))
		goto err;
	uint32_t v_dim = head_dim;
	if (arch_u32(g, arch, "attention.value_length", &v_dim, false, err))
		goto err;
	if (head_dim < 2 || head_dim > 4096 || head_dim % 2 != 0 || v_dim != head_dim) {
		nx_errf(err, "model: head dimension %u (embedding_length %u / head_count %u, value_length %u) is not supported",
			head_dim, dim, n_head, v_dim);
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
	hp->rope_neox = hp->arch == NX_ARCH_QWEN2;

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

/* A weight matrix (n_out, n_in) whose type we can dot: its activation type
 * must be producible for rows of n_in elements. */
static int bind_wt(struct nx_wt *w, const struct gguf_file *g, const char *name, int64_t n_in, int64_t n_out,
		   struct nx_err *err)
{
	const struct gguf_tensor *t = need(g, name, err);
	if (!t || check_shape(t, name, n_in, n_out, err) || check_aligned(g, t, name, err))
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

static int bind_layer(struct nx_layer *L, int il, const struct nx_hparams *hp, const struct gguf_file *g,
		      struct nx_err *err)
{
	const int64_t dim = hp->dim, q_dim = (int64_t)hp->n_head * hp->head_dim,
		      kv_dim = (int64_t)hp->n_head_kv * hp->head_dim, n_ff = hp->n_ff;
	char name[96];
#define NAME(s) (snprintf(name, sizeof(name), "blk.%d." s, il), name)
	memset(L, 0, sizeof(*L));
	if (bind_vec(&L->attn_norm, g, NAME("attn_norm.weight"), dim, err) ||
	    bind_wt(&L->wq, g, NAME("attn_q.weight"), dim, q_dim, err) ||
	    bind_wt(&L->wk, g, NAME("attn_k.weight"), dim, kv_dim, err) ||
	    bind_wt(&L->wv, g, NAME("attn_v.weight"), dim, kv_dim, err) ||
	    bind_wt(&L->wo, g, NAME("attn_output.weight"), q_dim, dim, err) ||
	    bind_vec(&L->ffn_norm, g, NAME("ffn_norm.weight"), dim, err) ||
	    bind_wt(&L->w_gate, g, NAME("ffn_gate.weight"), dim, n_ff, err) ||
	    bind_wt(&L->w_up, g, NAME("ffn_up.weight"), dim, n_ff, err) ||
	    bind_wt(&L->w_down, g, NAME("ffn_down.weight"), n_ff, dim, err))
		return -1;
	if (hp->arch == NX_ARCH_QWEN2) {
		if (bind_vec(&L->bq, g, NAME("attn_q.bias"), q_dim, err) ||
		    bind_vec(&L->bk, g, NAME("attn_k.bias"), kv_dim, err) ||
		    bind_vec(&L->bv, g, NAME("attn_v.bias"), kv_dim, err))
			return -1;
	}
#undef NAME
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
	for (int il = 0; il < hp->n_layer; il++)
		if (bind_layer(&m->layers[il], il, hp, g, err))
			return -1;
	return 0;
}
