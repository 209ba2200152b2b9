/* adapter.c - loads LoRA adapters (PEFT safetensors + adapter_config.json, or GGUF) and validates them against the model. */
#include "lora/adapter.h"
#include "lora/delta.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALIGN 64
#define MAX_CONFIG (1 << 20) /* adapter_config.json is a few hundred bytes */

static const char *const gguf_names[NX_LORA_N_WHICH] = {
	"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};
static const char *const peft_names[NX_LORA_N_WHICH] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};
/* The HF submodule each PEFT module lives in. */
static const char *const peft_groups[NX_LORA_N_WHICH] = {
	"self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp",
};

const char *nx_lora_which_gguf(enum nx_lora_which w)
{
	return (unsigned)w < NX_LORA_N_WHICH ? gguf_names[w] : "?";
}

const char *nx_lora_which_peft(enum nx_lora_which w)
{
	return (unsigned)w < NX_LORA_N_WHICH ? peft_names[w] : "?";
}

const struct nx_wt *nx_lora_base(const struct nx_model *m, int layer, enum nx_lora_which which)
{
	if (layer < 0 || layer >= m->hp.n_layer)
		return NULL;
	const struct nx_layer *L = &m->layers[layer];
	switch (which) {
	case NX_LORA_Q: return &L->wq;
	case NX_LORA_K: return &L->wk;
	case NX_LORA_V: return &L->wv;
	case NX_LORA_O: return &L->wo;
	case NX_LORA_GATE: return &L->w_gate;
	case NX_LORA_UP: return &L->w_up;
	case NX_LORA_DOWN: return &L->w_down;
	default: return NULL;
	}
}

const struct nx_lora_t *nx_lora_get(const struct nx_lora *l, int layer, enum nx_lora_which which)
{
	if (!l || layer < 0 || layer >= NX_MAX_LAYERS || (unsigned)which >= NX_LORA_N_WHICH)
		return NULL;
	const struct nx_lora_t *t = &l->t[layer][which];
	return t->layer < 0 ? NULL : t;
}


/* ---------------------------------------------------------------- candidates */

/* One A or B tensor found in a file, before pairing. rows/cols are the
 * row-major matrix shape: A (rank, n_in), B (n_out, rank). */
struct cand {
	const char *name;
	int layer;
	enum nx_lora_which which;
	bool is_b;
	int n_dims;
	int64_t rows, cols;
	const uint8_t *data;
	bool is_gguf;
	enum nx_st_dtype st;
	enum nx_type gg;
};

/* Shape as the file writes it: numpy order for safetensors, ne order for GGUF. */
static void shape_str(char *buf, size_t n, bool gguf, int64_t rows, int64_t cols)
{
	if (gguf)
		snprintf(buf, n, "[%lld, %lld]", (long long)cols, (long long)rows);
	else
		snprintf(buf, n, "[%lld, %lld]", (long long)rows, (long long)cols);
}

static void base_name(char *buf, size_t n, int layer, enum nx_lora_which w)
{
	snprintf(buf, n, "blk.%d.%s.weight", layer, gguf_names[w]);
}

/* Pairs the candidates, checks ranks and shapes against m, fills src->t. */
static int pair_up(struct nx_lora_src *src, struct cand *c, size_t n, int config_rank, const struct nx_model *m,
		   struct nx_err *err)
{
	const struct cand *(*slot)[NX_LORA_N_WHICH][2] = calloc(NX_MAX_LAYERS, sizeof(*slot));
	if (!slot)
		return nx_errf(err, "lora: out of memory");
	int rc = -1;
	char bn[64], have[64], want[64];

	for (size_t i = 0; i < n; i++) {
		const struct cand *x = &c[i];
		const struct cand **s = &slot[x->layer][x->which][x->is_b];
		if (*s) {
			base_name(bn, sizeof(bn), x->layer, x->which);
			nx_errf(err, "lora: '%s' and '%s' are both lora_%s of %s", (*s)->name, x->name,
				x->is_gguf ? (x->is_b ? "b" : "a") : (x->is_b ? "B" : "A"), bn);
			goto out;
		}
		*s = x;
	}
	src->t = calloc(n / 2 + 1, sizeof(*src->t));
	if (!src->t) {
		nx_errf(err, "lora: out of memory");
		goto out;
	}
	for (int il = 0; il < NX_MAX_LAYERS; il++) {
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct cand *a = slot[il][w][0], *b = slot[il][w][1];
			if (!a && !b)
				continue;
			base_name(bn, sizeof(bn), il, (enum nx_lora_which)w);
			if (!a || !b) {
				const struct cand *x = a ? a : b;
				nx_errf(err, "lora: '%s' has no matching %s (both halves of the pair for %s are needed)",
					x->name, x->is_gguf ? (a ? "lora_b" : "lora_a") : (a ? "lora_B" : "lora_A"), bn);
				goto out;
			}
			/* phi3's Q, K, V and gate, up are parts of one matrix each (attn_qkv, ffn_up):
			 * an adapter of the file's ffn_up is of both gate and up, never of one part */
			if (m->hp.arch == NX_ARCH_PHI3 && w != NX_LORA_O && w != NX_LORA_DOWN) {
				nx_errf(err, "lora: '%s': phi3's %s is part of a fused matrix (attn_qkv or ffn_up); adapters of "
					"it are not implemented (attn_output and ffn_down are)", a->name, bn);
				goto out;
			}
			const char *what = a->is_gguf ? "[n_in, rank]" : "[rank, n_in]";
			const char *whatb = a->is_gguf ? "[rank, n_out]" : "[n_out, rank]";
			if (a->n_dims != 2 || b->n_dims != 2) {
				const struct cand *x = a->n_dims != 2 ? a : b;
				nx_errf(err, "lora: '%s' has %d dimensions, expected 2 (%s)", x->name, x->n_dims,
					x == a ? what : whatb);
				goto out;
			}
			/* A is (rank, n_in), B is (n_out, rank). */
			if (a->rows != b->cols) {
				char sa[64], sb[64];
				shape_str(sa, sizeof(sa), a->is_gguf, a->rows, a->cols);
				shape_str(sb, sizeof(sb), b->is_gguf, b->rows, b->cols);
				nx_errf(err, "lora: rank mismatch for %s: '%s' has rank %lld (shape %s) but '%s' has rank %lld (shape %s)",
					bn, a->name, (long long)a->rows, sa, b->name, (long long)b->cols, sb);
				goto out;
			}
			int64_t rank = a->rows;
			if (rank < 1 || rank > NX_LORA_MAX_RANK) {
				nx_errf(err, "lora: '%s' has rank %lld, expected 1..%d", a->name, (long long)rank,
					NX_LORA_MAX_RANK);
				goto out;
			}
			if (config_rank > 0 && rank != config_rank) {
				nx_errf(err, "lora: '%s' has rank %lld, but adapter_config.json says r = %d (rank_pattern is not supported)",
					a->name, (long long)rank, config_rank);
				goto out;
			}
			const struct nx_wt *base = nx_lora_base(m, il, (enum nx_lora_which)w);
			const char *hint = "";
			if (a->cols != base->n_in) {
				if (base->n_in == m->hp.dim)
					hint = "; the adapter is for another hidden size";
				shape_str(have, sizeof(have), a->is_gguf, a->rows, a->cols);
				shape_str(want, sizeof(want), a->is_gguf, rank, base->n_in);
				if (!a->is_gguf) /* name the dimensions in the file's order */
					nx_errf(err, "lora: '%s' has shape %s, expected %s (rank %lld x n_in of %s; the model's hidden size is %d%s)",
						a->name, have, want, (long long)rank, bn, m->hp.dim, hint);
				else
					nx_errf(err, "lora: '%s' has shape %s, expected %s (n_in of %s x rank %lld; the model's hidden size is %d%s)",
						a->name, have, want, bn, (long long)rank, m->hp.dim, hint);
				goto out;
			}
			if (b->rows != base->n_out) {
				if (base->n_out == m->hp.dim)
					hint = "; the adapter is for another hidden size";
				shape_str(have, sizeof(have), b->is_gguf, b->rows, b->cols);
				shape_str(want, sizeof(want), b->is_gguf, base->n_out, rank);
				if (b->is_gguf)
					nx_errf(err, "lora: '%s' has shape %s, expected %s (rank %lld x n_out of %s; the model's hidden size is %d%s)",
						b->name, have, want, (long long)rank, bn, m->hp.dim, hint);
				else
					nx_errf(err, "lora: '%s' has shape %s, expected %s (n_out of %s x rank %lld; the model's hidden size is %d%s)",
						b->name, have, want, bn, (long long)rank, m->hp.dim, hint);
				goto out;
			}
			struct nx_lora_src_t *t = &src->t[src->n++];
			t->layer = il;
			t->which = (enum nx_lora_which)w;
			t->rank = (int)rank;
			t->n_in = base->n_in;
			t->n_out = base->n_out;
			t->a = a->data;
			t->b = b->data;
			t->is_gguf = a->is_gguf;
			t->st_a = a->st;
			t->st_b = b->st;
			t->gg_a = a->gg;
			t->gg_b = b->gg;
			snprintf(t->name_a, sizeof(t->name_a), "%s", a->name);
			snprintf(t->name_b, sizeof(t->name_b), "%s", b->name);
			if (t->rank > src->rank)
				src->rank = t->rank;
		}
	}
	if (src->n == 0) {
		nx_errf(err, "lora: the adapter holds no LoRA tensors");
		goto out;
	}
	rc = 0;
out:
	free(slot);
	return rc;
}

/* Names go into error messages (and logs): refuse control bytes before printing one. */
static int check_printable(const char *name, size_t i, struct nx_err *err)
{
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return nx_errf(err, "lora: the name of tensor %zu holds control characters", i);
	return 0;
}

/* Parses a decimal layer index: digits only, no leading zero, < 10^6. */
static int parse_layer(const char *s, const char **end)
{
	int v = 0, n = 0;
	if (*s == '0' && s[1] >= '0' && s[1] <= '9')
		return -1;
	while (*s >= '0' && *s <= '9' && n < 6) {
		v = v * 10 + (*s++ - '0');
		n++;
	}
	if (n == 0 || (*s >= '0' && *s <= '9'))
		return -1;
	*end = s;
	return v;
}

static int check_layer(const char *name, int layer, const struct nx_model *m, struct nx_err *err)
{
	if (layer < 0 || layer >= m->hp.n_layer)
		return nx_errf(err, "lora: '%s': layer %d is out of range (the model has %d layers, 0..%d)", name, layer,
			       m->hp.n_layer, m->hp.n_layer - 1);
	return 0;
}

/* ---------------------------------------------------------------- PEFT */

static const char *const peft_prefixes[] = {
	"base_model.model.model.layers.", "base_model.model.layers.", "model.layers.", "layers.",
};

/* Maps a PEFT tensor name to (layer, which, is_b). */
static int parse_peft_name(struct cand *c, const char *name, const struct nx_model *m, struct nx_err *err)
{
	const char *p = NULL;
	for (size_t i = 0; i < sizeof(peft_prefixes) / sizeof(peft_prefixes[0]) && !p; i++)
		if (!strncmp(name, peft_prefixes[i], strlen(peft_prefixes[i])))
			p = name + strlen(peft_prefixes[i]);
	size_t len = strlen(name);
	const char *suffix = NULL;
	if (len > 14 && !strcmp(name + len - 14, ".lora_A.weight"))
		suffix = name + len - 14, c->is_b = false;
	else if (len > 14 && !strcmp(name + len - 14, ".lora_B.weight"))
		suffix = name + len - 14, c->is_b = true;
	if (!p || !suffix)
		return nx_errf(err, "lora: tensor '%s' is not a LoRA weight this loader understands (expected "
			       "base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight and the like)", name);
	const char *e;
	int layer = parse_layer(p, &e);
	if (layer < 0 || *e != '.' || e + 1 >= suffix)
		return nx_errf(err, "lora: tensor '%s': no layer number after 'layers.'", name);
	if (check_layer(name, layer, m, err))
		return -1;
	/* What lies between "layers.N." and ".lora_X.weight": group.module */
	const char *mod = e + 1;
	size_t mlen = (size_t)(suffix - mod);
	for (int w = 0; w < NX_LORA_N_WHICH; w++) {
		char want[64];
		snprintf(want, sizeof(want), "%s.%s", peft_groups[w], peft_names[w]);
		if (strlen(want) == mlen && !strncmp(mod, want, mlen)) {
			c->layer = layer;
			c->which = (enum nx_lora_which)w;
			return 0;
		}
	}
	return nx_errf(err, "lora: tensor '%s': module '%.*s' is not supported (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj)",
		       name, (int)(mlen > 80 ? 80 : mlen), mod);
}

struct peft_config {
	int r;
	double alpha;
	bool rslora;
	json_t *targets; /* borrowed: list of strings, or a string (regex) */
};

/* An optional key that must be absent, null, empty or false. */
static int must_be_unset(json_t *cfg, const char *key, const char *what, struct nx_err *err)
{
	json_t *v = json_object_get(cfg, key);
	if (!v || json_is_null(v) || json_is_false(v))
		return 0;
	if ((json_is_object(v) && json_object_size(v) == 0) || (json_is_array(v) && json_array_size(v) == 0))
		return 0;
	return nx_errf(err, "lora: adapter_config.json: '%s' is set: %s is not supported", key, what);
}

static int parse_config(struct peft_config *pc, json_t *cfg, struct nx_err *err)
{
	if (!json_is_object(cfg))
		return nx_errf(err, "lora: adapter_config.json is not a JSON object");
	json_t *v = json_object_get(cfg, "peft_type");
	if (v && (!json_is_string(v) || strcmp(json_string_value(v), "LORA")))
		return nx_errf(err, "lora: adapter_config.json: peft_type is not \"LORA\"");
	v = json_object_get(cfg, "r");
	if (!v)
		return nx_errf(err, "lora: adapter_config.json: 'r' is missing");
	if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > NX_LORA_MAX_RANK)
		return nx_errf(err, "lora: adapter_config.json: 'r' is not an integer in 1..%d", NX_LORA_MAX_RANK);
	pc->r = (int)json_integer_value(v);
	v = json_object_get(cfg, "lora_alpha");
	if (!v)
		return nx_errf(err, "lora: adapter_config.json: 'lora_alpha' is missing");
	if (!json_is_number(v) || !isfinite(json_number_value(v)))
		return nx_errf(err, "lora: adapter_config.json: 'lora_alpha' is not a finite number");
	pc->alpha = json_number_value(v);
	v = json_object_get(cfg, "use_rslora");
	pc->rslora = false;
	if (v && !json_is_null(v)) {
		if (!json_is_boolean(v))
			return nx_errf(err, "lora: adapter_config.json: 'use_rslora' is not a boolean");
		pc->rslora = json_is_true(v);
	}
	pc->targets = json_object_get(cfg, "target_modules");
	if (!pc->targets)
		return nx_errf(err, "lora: adapter_config.json: 'target_modules' is missing");
	if (json_is_array(pc->targets)) {
		for (size_t i = 0; i < json_array_size(pc->targets); i++)
			if (!json_is_string(json_array_get(pc->targets, i)))
				return nx_errf(err, "lora: adapter_config.json: target_modules[%zu] is not a string", i);
	} else if (!json_is_string(pc->targets)) {
		return nx_errf(err, "lora: adapter_config.json: 'target_modules' is neither a list nor a string");
	}
	if (must_be_unset(cfg, "rank_pattern", "a rank per module", err) ||
	    must_be_unset(cfg, "alpha_pattern", "an alpha per module", err) ||
	    must_be_unset(cfg, "use_dora", "DoRA", err) ||
	    must_be_unset(cfg, "fan_in_fan_out", "transposed (Conv1D) weights", err))
		return -1;
	return 0;
}

/* True when the list form of target_modules names this module (PEFT matches
 * by the last component of the module path). */
static bool targeted(json_t *targets, enum nx_lora_which w)
{
	if (!json_is_array(targets))
		return true; /* a regex: PEFT's re.fullmatch, not re-checked here */
	for (size_t i = 0; i < json_array_size(targets); i++) {
		const char *s = json_string_value(json_array_get(targets, i));
		if (!strcmp(s, peft_names[w]) || !strcmp(s, "all-linear"))
			return true;
	}
	return false;
}

static void set_name(char *dst, size_t n, const char *path)
{
	char *tmp = strdup(path);
	if (!tmp) {
		snprintf(dst, n, "?");
		return;
	}
	size_t l = strlen(tmp);
	while (l > 1 && tmp[l - 1] == '/')
		tmp[--l] = 0;
	snprintf(dst, n, "%s", basename(tmp));
	free(tmp);
}

static float scale_of(double alpha, int rank, bool rslora)
{
	return (float)(rslora ? alpha / sqrt((double)rank) : alpha / rank);
}

static int peft_build(struct nx_lora_src *src, const struct nx_st_file *f, const char *config, size_t config_len,
		      const struct nx_model *m, struct nx_err *err)
{
	json_error_t je;
	json_t *cfg = json_loadb(config, config_len, JSON_REJECT_DUPLICATES, &je);
	if (!cfg)
		return nx_errf(err, "lora: adapter_config.json is not valid JSON: %s (line %d, column %d)", je.text,
			       je.line, je.column);
	struct peft_config pc = {0};
	struct cand *c = NULL;
	int rc = -1;
	if (parse_config(&pc, cfg, err))
		goto out;
	c = calloc(f->n_tensors + 1, sizeof(*c));
	if (!c) {
		nx_errf(err, "lora: out of memory");
		goto out;
	}
	for (size_t i = 0; i < f->n_tensors; i++) {
		const struct nx_st_tensor *t = &f->tensors[i];
		if (check_printable(t->name, i, err) || parse_peft_name(&c[i], t->name, m, err))
			goto out;
		if (!targeted(pc.targets, c[i].which)) {
			nx_errf(err, "lora: tensor '%s' adapts %s, which is not in adapter_config.json's target_modules",
				t->name, peft_names[c[i].which]);
			goto out;
		}
		c[i].name = t->name;
		c[i].n_dims = t->n_dims;
		c[i].rows = t->n_dims > 0 ? t->shape[0] : 1;
		c[i].cols = t->n_dims > 1 ? t->shape[1] : 1;
		c[i].data = t->data;
		c[i].st = t->dtype;
	}
	if (pair_up(src, c, f->n_tensors, pc.r, m, err))
		goto out;
	src->alpha = (float)pc.alpha;
	src->rslora = pc.rslora;
	/* the GGUF's Q/K rows are permuted from Hugging Face's for llama's RoPE pairs (smollm3's too) */
	src->permute_qk = m->hp.arch == NX_ARCH_LLAMA || m->hp.arch == NX_ARCH_SMOLLM3;
	src->n_head = m->hp.n_head;
	src->n_head_kv = m->hp.n_head_kv;
	rc = 0;
out:
	free(c);
	json_decref(cfg);
	return rc;
}

int nx_lora_parse_peft(struct nx_lora_src *src, const void *st, size_t st_size, const char *config,
		       size_t config_len, const struct nx_model *m, struct nx_err *err)
{
	memset(src, 0, sizeof(*src));
	snprintf(src->name, sizeof(src->name), "memory");
	if (nx_st_parse(&src->st_mem, st, st_size, err))
		return -1;
	if (peft_build(src, &src->st_mem, config, config_len, m, err)) {
		nx_lora_close(src);
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- GGUF */

static int gguf_build(struct nx_lora_src *src, const struct gguf_file *g, const struct nx_model *m,
		      struct nx_err *err)
{
	char *s = NULL;
	int rc = -1;
	struct cand *c = NULL;
	if (gguf_get_str(g, "general.type", &s, false, err))
		return -1;
	if (!s || strcmp(s, "adapter")) {
		nx_errf(err, "lora: general.type is %s%s%s, expected 'adapter' (a model file, not a LoRA?)", s ? "'" : "",
			s ? s : "missing", s ? "'" : "");
		goto out;
	}
	free(s);
	s = NULL;
	if (gguf_get_str(g, "adapter.type", &s, true, err))
		goto out;
	if (strcmp(s, "lora")) {
		nx_errf(err, "lora: adapter.type is '%.64s', expected 'lora'", s);
		goto out;
	}
	free(s);
	s = NULL;
	if (gguf_get_str(g, "general.architecture", &s, true, err))
		goto out;
	if (strcmp(s, nx_arch_name(m->hp.arch))) {
		nx_errf(err, "lora: the adapter is for architecture '%.64s', the model is '%s'", s, nx_arch_name(m->hp.arch));
		goto out;
	}
	char key[96];
	uint32_t dim = 0;
	snprintf(key, sizeof(key), "%s.embedding_length", s);
	if (gguf_get_u32(g, key, &dim, false, err))
		goto out;
	if (dim && dim != (uint32_t)m->hp.dim) {
		nx_errf(err, "lora: %s = %u: the adapter is for hidden size %u, the model's is %d", key, dim, dim, m->hp.dim);
		goto out;
	}
	float alpha = 0;
	if (gguf_get_f32(g, "adapter.lora.alpha", &alpha, false, err))
		goto out;
	if (!isfinite(alpha) || alpha < 0) {
		nx_errf(err, "lora: adapter.lora.alpha = %g, expected a finite number >= 0", alpha);
		goto out;
	}
	if (gguf_get(g, "adapter.alora.invocation_tokens")) {
		nx_errf(err, "lora: activated LoRA (adapter.alora.invocation_tokens) is not supported");
		goto out;
	}

	c = calloc(g->n_tensors + 1, sizeof(*c));
	char **names = calloc(g->n_tensors + 1, sizeof(char *));
	if (!c || !names) {
		free(names);
		nx_errf(err, "lora: out of memory");
		goto out;
	}
	size_t n = 0;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->tensors[i];
		char *nm = names[i] = strndup(t->name.p, t->name.len > 200 ? 200 : t->name.len);
		if (!nm) {
			nx_errf(err, "lora: out of memory");
			goto free_names;
		}
		struct cand *x = &c[n];
		if (strlen(nm) != t->name.len || check_printable(nm, (size_t)i, err)) {
			if (strlen(nm) != t->name.len && t->name.len <= 200)
				nx_errf(err, "lora: the name of tensor %llu holds a NUL byte", (unsigned long long)i);
			else if (t->name.len > 200)
				nx_errf(err, "lora: the name of tensor %llu is %llu bytes long", (unsigned long long)i,
					(unsigned long long)t->name.len);
			goto free_names;
		}
		size_t len = strlen(nm);
		const char *suffix = NULL;
		if (len > 14 && !strcmp(nm + len - 14, ".weight.lora_a"))
			suffix = nm + len - 14, x->is_b = false;
		else if (len > 14 && !strcmp(nm + len - 14, ".weight.lora_b"))
			suffix = nm + len - 14, x->is_b = true;
		if (!suffix || strncmp(nm, "blk.", 4)) {
			nx_errf(err, "lora: tensor '%s' is not supported (expected blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight.lora_{a,b})",
				nm);
			goto free_names;
		}
		const char *e;
		int layer = parse_layer(nm + 4, &e);
		if (layer < 0 || *e != '.') {
			nx_errf(err, "lora: tensor '%s': no layer number after 'blk.'", nm);
			goto free_names;
		}
		if (check_layer(nm, layer, m, err))
			goto free_names;
		const char *mod = e + 1;
		size_t mlen = (size_t)(suffix - mod);
		int which = -1;
		for (int w = 0; w < NX_LORA_N_WHICH; w++)
			if (strlen(gguf_names[w]) == mlen && !strncmp(mod, gguf_names[w], mlen))
				which = w;
		if (which < 0) {
			nx_errf(err, "lora: tensor '%s': module '%.*s' is not supported (attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down)",
				nm, (int)(mlen > 80 ? 80 : mlen), mod);
			goto free_names;
		}
		const struct nx_type_traits *tr = nx_type_supported(t->type) ? nx_type_ref(t->type) : NULL;
		if (!tr || !tr->dequant) {
			nx_errf(err, "lora: tensor '%s' has type %s, which cannot be read", nm, nx_type_name(t->type));
			goto free_names;
		}
		x->name = nm;
		x->layer = layer;
		x->which = (enum nx_lora_which)which;
		x->n_dims = (t->ne[2] == 1 && t->ne[3] == 1) ? 2 : (t->ne[3] == 1 ? 3 : 4);
		x->rows = t->ne[1];
		x->cols = t->ne[0];
		x->data = t->data;
		x->is_gguf = true;
		x->gg = t->type;
		n++;
	}
	if (pair_up(src, c, n, 0, m, err))
		goto free_names;
	src->alpha = alpha;
	src->rslora = false;
	rc = 0;
free_names:
	for (uint64_t i = 0; i < g->n_tensors; i++)
		free(names[i]);
	free(names);
out:
	free(s);
	free(c);
	return rc;
}

int nx_lora_parse_gguf(struct nx_lora_src *src, const void *gg, size_t gg_size, const struct nx_model *m,
		       struct nx_err *err)
{
	memset(src, 0, sizeof(*src));
	snprintf(src->name, sizeof(src->name), "memory");
	if (gguf_parse(&src->gg_mem, gg, gg_size, err))
		return nx_err_prefix(err, "lora");
	if (gguf_build(src, &src->gg_mem, m, err)) {
		nx_lora_close(src);
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- files */

/* Reads a small regular file whole (NUL-terminated); fd stays the caller's. */
static int read_small_fd(int fd, const char *name, char **out, size_t *len, struct nx_err *err)
{
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > MAX_CONFIG)
		return nx_errf(err, "lora: '%s' is not a regular file of at most %d bytes", name, MAX_CONFIG);
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		return nx_errf(err, "lora: out of memory");
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	buf[got] = 0;
	*out = buf;
	*len = got;
	return 0;
}

bool nx_lora_fd_is_gguf(int fd)
{
	char magic[4];
	struct stat st;
	return !fstat(fd, &st) && S_ISREG(st.st_mode) && pread(fd, magic, 4, 0) == 4 && !memcmp(magic, "GGUF", 4);
}

int nx_lora_open_files(struct nx_lora_src *src, const struct nx_lora_files *f, const struct nx_model *m,
		       struct nx_err *err)
{
	memset(src, 0, sizeof(*src));
	set_name(src->name, sizeof(src->name), f->name);
	if (f->config_fd < 0) {
		if (gguf_open_fd(&src->gg, f->data_fd, f->name, err))
			return nx_err_prefix(err, "lora");
		if (gguf_build(src, &src->gg.g, m, err)) {
			nx_err_prefix(err, "%s", f->name);
			nx_lora_close(src);
			return -1;
		}
		return 0;
	}
	char *cfg = NULL;
	size_t cfg_len = 0;
	if (read_small_fd(f->config_fd, "adapter_config.json", &cfg, &cfg_len, err))
		return -1;
	if (nx_st_open_fd(&src->st, f->data_fd, f->name, err)) {
		free(cfg);
		return nx_err_prefix(err, "lora");
	}
	int rc = peft_build(src, &src->st.f, cfg, cfg_len, m, err);
	free(cfg);
	if (rc) {
		nx_err_prefix(err, "%s", f->name);
		nx_lora_close(src);
	}
	return rc;
}

/* O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected after. */
static int open_ro(const char *path, struct nx_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		nx_errf(err, "lora: cannot open '%s': %s", path, strerror(errno));
	return fd;
}

int nx_lora_open(struct nx_lora_src *src, const char *path, const struct nx_model *m, struct nx_err *err)
{
	memset(src, 0, sizeof(*src));
	struct nx_lora_files f = { .name = path, .data_fd = -1, .config_fd = -1 };
	struct stat st;
	if (stat(path, &st))
		return nx_errf(err, "lora: cannot open '%s': %s", path, strerror(errno));
	/* PEFT: the directory, or the .safetensors inside it with the config beside it. */
	char stp[4096], cfgp[4096];
	if (S_ISDIR(st.st_mode)) {
		snprintf(stp, sizeof(stp), "%s/adapter_model.safetensors", path);
		snprintf(cfgp, sizeof(cfgp), "%s/adapter_config.json", path);
	} else {
		char *tmp = strdup(path);
		if (!tmp)
			return nx_errf(err, "lora: out of memory");
		snprintf(stp, sizeof(stp), "%s", path);
		snprintf(cfgp, sizeof(cfgp), "%s/adapter_config.json", dirname(tmp));
		free(tmp);
	}
	int rc = -1;
	if ((f.data_fd = open_ro(stp, err)) < 0)
		goto out;
	if (!nx_lora_fd_is_gguf(f.data_fd) && (f.config_fd = open_ro(cfgp, err)) < 0)
		goto out;
	rc = nx_lora_open_files(src, &f, m, err);
out:
	if (f.data_fd >= 0)
		close(f.data_fd);
	if (f.config_fd >= 0)
		close(f.config_fd);
	return rc;
}

void nx_lora_close(struct nx_lora_src *src)
{
	free(src->t);
	src->t = NULL;
	src->n = 0;
	if (src->st.map)
		nx_st_close(&src->st);
	if (src->gg.map)
		gguf_close(&src->gg);
	nx_st_free(&src->st_mem);
	if (src->gg_mem.base)
		gguf_free(&src->gg_mem);
	memset(&src->gg_mem, 0, sizeof(src->gg_mem));
}

/* ---------------------------------------------------------------- conversion */

static size_t round_up(size_t n)
{
	return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* What A and B of s are held as: f16 or bf16 when the file stores both so
 * and the delta converts them in registers (nx_lora_fast16), else f32. */
static enum nx_lora_dtype held_as(const struct nx_lora_src_t *s)
{
	if (!nx_lora_fast16())
		return NX_LORA_F32;
	if (s->is_gguf)
		return s->gg_a == NX_F16 && s->gg_b == NX_F16	   ? NX_LORA_F16
		       : s->gg_a == NX_BF16 && s->gg_b == NX_BF16 ? NX_LORA_BF16
								  : NX_LORA_F32;
	return s->st_a == NX_ST_F16 && s->st_b == NX_ST_F16	 ? NX_LORA_F16
	       : s->st_a == NX_ST_BF16 && s->st_b == NX_ST_BF16 ? NX_LORA_BF16
								: NX_LORA_F32;
}

size_t nx_lora_size(const struct nx_lora_src *src)
{
	size_t total = 0;
	for (int i = 0; i < src->n; i++) {
		const struct nx_lora_src_t *t = &src->t[i];
		const size_t elt = nx_lora_elt_size(held_as(t));
		size_t a, b;
		/* rank <= NX_LORA_MAX_RANK and n_in/n_out bounded by the model: no overflow in practice, but check. */
		if (__builtin_mul_overflow((size_t)t->rank * elt, (size_t)t->n_in, &a) ||
		    __builtin_mul_overflow((size_t)t->rank * elt, (size_t)t->n_out, &b) ||
		    __builtin_add_overflow(total, round_up(a) + round_up(b), &total))
			return 0;
		if (nx_lora_b_tiled(t->rank, held_as(t)) &&
		    __builtin_add_overflow(total, round_up(nx_lora_b_tiles_size(t->n_out, t->rank, held_as(t))), &total))
			return 0;
	}
	return total;
}

bool nx_lora_b_tiled(int rank, enum nx_lora_dtype d)
{
	return nx_lora_fast16() && (size_t)rank * nx_lora_elt_size(d) < 64;
}

void nx_lora_b_tile(void *bt, const void *b, int64_t n_out, int rank, enum nx_lora_dtype d)
{
	const size_t elt = nx_lora_elt_size(d);
	uint8_t *o = bt;
	for (int64_t r0 = 0; r0 < n_out; r0 += 16)
		for (int k = 0; k < rank; k++)
			for (int64_t q = r0; q < r0 + 16; q++, o += elt)
				if (q < n_out)
					memcpy(o, (const uint8_t *)nx_lora_row(d, b, q, rank) + (size_t)k * elt, elt);
				else
					memset(o, 0, elt);
}

/* n elements of A or B as stored -> held as d (f32, or the same 16-bit
 * format: copied); checks every value is finite. */
static int convert(void *dst, enum nx_lora_dtype d, const uint8_t *data, int64_t n, bool is_gguf,
		   enum nx_st_dtype st, enum nx_type gg, int64_t cols, const char *name, struct nx_err *err)
{
	if (d != NX_LORA_F32)
		memcpy(dst, data, (size_t)n * sizeof(uint16_t)); /* held_as: the file's own format */
	else if (is_gguf)
		nx_type_ref(gg)->dequant(data, dst, n);
	else
		for (int64_t i = 0; i < n; i++)
			((float *)dst)[i] = nx_st_elem(st, data, i);
	for (int64_t i = 0; i < n; i++) {
		const float v = nx_lora_elt(d, dst, (size_t)i);
		if (!isfinite(v))
			return nx_errf(err, "lora: '%s' holds a non-finite value (%g) at row %lld, column %lld", name, v,
				       (long long)(i / cols), (long long)(i % cols));
	}
	return 0;
}

/* llama.cpp's LlamaModel.permute on the rows of B (n_out, rank): within each of
 * n_head heads of hd rows, row j * hd/2 + i (HF: halves) goes to row 2 * i + j
 * (GGUF: interleaved pairs), for j in {0, 1}, i < hd/2. */
static int permute_rows(void *b, size_t elt, int64_t n_out, int rank, int n_head, const char *name,
			struct nx_err *err)
{
	if (n_head < 1 || n_out % n_head || (n_out / n_head) % 2)
		return nx_errf(err, "lora: '%s': %lld rows do not split into %d heads of an even size", name,
			       (long long)n_out, n_head);
	const int64_t hd = n_out / n_head, half = hd / 2;
	const size_t row = elt * (size_t)rank;
	uint8_t *tmp = malloc(row * (size_t)n_out);
	if (!tmp)
		return nx_errf(err, "lora: out of memory");
	memcpy(tmp, b, row * (size_t)n_out);
	for (int64_t h = 0; h < n_head; h++)
		for (int64_t j = 0; j < 2; j++)
			for (int64_t i = 0; i < half; i++)
				memcpy((uint8_t *)b + (size_t)(h * hd + 2 * i + j) * row, tmp + (size_t)(h * hd + j * half + i) * row,
				       row);
	free(tmp);
	return 0;
}

int nx_lora_init(struct nx_lora *l, void *mem, size_t size, const struct nx_lora_src *src, struct nx_err *err)
{
	size_t need = nx_lora_size(src);
	if (need == 0 || size < need || (uintptr_t)mem % ALIGN)
		return nx_errf(err, "lora: buffer of %zu bytes at %p, need %zu bytes %d-aligned", size, mem, need, ALIGN);
	memset(l, 0, sizeof(*l));
	for (int il = 0; il < NX_MAX_LAYERS; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++)
			l->t[il][w].layer = -1;
	snprintf(l->name, sizeof(l->name), "%s", src->name);
	l->rank = src->rank;
	l->alpha = src->alpha;
	l->rslora = src->rslora;
	uint8_t *p = mem;
	for (int i = 0; i < src->n; i++) {
		const struct nx_lora_src_t *s = &src->t[i];
		struct nx_lora_t *t = &l->t[s->layer][s->which];
		t->layer = s->layer;
		t->which = s->which;
		t->rank = s->rank;
		t->n_in = s->n_in;
		t->n_out = s->n_out;
		/* GGUF without alpha: no alpha/rank factor (llama.cpp's rule). */
		t->scale = (s->is_gguf && src->alpha == 0) ? 1.0f : scale_of(src->alpha, s->rank, src->rslora);
		t->dtype = held_as(s);
		const size_t elt = nx_lora_elt_size(t->dtype);
		t->a = p;
		p += round_up((size_t)s->rank * s->n_in * elt);
		l->a_bytes += (size_t)s->rank * s->n_in * elt;
		t->b = p;
		p += round_up((size_t)s->rank * s->n_out * elt);
		if (convert(t->a, t->dtype, s->a, (int64_t)s->rank * s->n_in, s->is_gguf, s->st_a, s->gg_a, s->n_in,
			    s->name_a, err) ||
		    convert(t->b, t->dtype, s->b, (int64_t)s->rank * s->n_out, s->is_gguf, s->st_b, s->gg_b, s->rank,
			    s->name_b, err))
			return -1;
		if (!s->is_gguf && src->permute_qk && (s->which == NX_LORA_Q || s->which == NX_LORA_K) &&
		    permute_rows(t->b, elt, s->n_out, s->rank, s->which == NX_LORA_Q ? src->n_head : src->n_head_kv,
				 s->name_b, err))
			return -1;
		if (nx_lora_b_tiled(t->rank, t->dtype)) { /* from B in its final row order */
			t->bt = p;
			p += round_up(nx_lora_b_tiles_size(t->n_out, t->rank, t->dtype));
			nx_lora_b_tile(t->bt, t->b, t->n_out, t->rank, t->dtype);
		}
		l->n++;
	}
	return 0;
}

int nx_lora_load(struct nx_lora **lp, void **mem, const char *path, const struct nx_model *m, struct nx_err *err)
{
	struct nx_lora_src src;
	*lp = NULL;
	*mem = NULL;
	if (nx_lora_open(&src, path, m, err))
		return -1;
	size_t n = nx_lora_size(&src);
	struct nx_lora *l = malloc(sizeof(*l));
	void *p = n ? aligned_alloc(ALIGN, n) : NULL;
	if (!l || !p) {
		free(l);
		free(p);
		nx_lora_close(&src);
		return nx_errf(err, "lora: out of memory for %zu bytes of adapter", n);
	}
	int rc = nx_lora_init(l, p, n, &src, err);
	nx_lora_close(&src);
	if (rc) {
		free(l);
		free(p);
		return nx_err_prefix(err, "%s", path);
	}
	*lp = l;
	*mem = p;
	return 0;
}
