/* fuzz_gguf.c - libFuzzer target: an untrusted GGUF file through gguf_parse, every accessor, nx_model_bind and nx_tok_load.
 *
 * When a file parses, everything the parser vouched for is read back: every
 * key and value (nested arrays through the iterator, which must consume
 * exactly the bytes the parser measured), the typed getters on every key,
 * lookups by key and tensor name, the first and last byte of every tensor's
 * data. Then the model binder and the tokenizer loader get the same file; a
 * model that binds has every bound vector and weight row range read and runs
 * one forward step of two tokens. Last,
 * the bytes are read as a GGUF LoRA adapter for fuzz/data/tiny-llama.model
 * (found from $NX_FUZZ_ROOT, default "."), converted when they validate.
 * ASan and UBSan catch reads outside the input; FUZZ_CHECK catches broken
 * promises. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/util.h"
#include "lora/adapter.h"
#include "model/gguf.h"
#include "model/forward.h"
#include "model/model.h"
#include "tok/chat.h"
#include "tok/tokenizer.h"

static unsigned sink;
static struct gguf_mapped base_file;
static struct nx_model base_model; /* what adapters are checked against */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *root = getenv("NX_FUZZ_ROOT");
	char path[512];
	struct nx_err err;

	snprintf(path, sizeof(path), "%s/fuzz/data/tiny-llama.model", root && *root ? root : ".");
	if (gguf_open(&base_file, path, &err) || nx_model_bind(&base_model, &base_file.g, &err)) {
		fprintf(stderr, "fuzz_gguf: %s: %s (set NX_FUZZ_ROOT to the repo root)\n", path, err.msg);
		exit(1);
	}
	return 0;
}

static void walk_value(const struct gguf_file *g, const struct gguf_value *v, int depth)
{
	const uint8_t *lo = g->base, *hi = g->base + g->size;

	FUZZ_CHECK(depth <= GGUF_MAX_NEST + 1, "array nesting %d deeper than GGUF_MAX_NEST", depth);
	switch (v->type) {
	case GGUF_STRING:
		FUZZ_CHECK(v->str.len <= g->size && (const uint8_t *)v->str.p >= lo &&
				   (const uint8_t *)v->str.p + v->str.len <= hi,
			   "string of %llu bytes outside the file", (unsigned long long)v->str.len);
		sink += fuzz_touch(v->str.p, v->str.len);
		break;
	case GGUF_ARRAY: {
		const uint8_t *d = v->arr.data;
		FUZZ_CHECK(d >= lo && v->arr.bytes <= (uint64_t)(hi - d), "array of %llu bytes outside the file",
			   (unsigned long long)v->arr.bytes);
		size_t esz = gguf_vtype_size(v->arr.type);
		if (esz)
			FUZZ_CHECK(v->arr.n * esz == v->arr.bytes, "array of %llu x %zu bytes claims %llu bytes",
				   (unsigned long long)v->arr.n, esz, (unsigned long long)v->arr.bytes);
		if (v->arr.bytes)
			sink += d[0] + d[v->arr.bytes - 1];

		struct gguf_arr_iter it;
		struct gguf_value e;
		uint64_t n = 0;
		gguf_arr_iter_init(&it, v);
		while (gguf_arr_next(&it, &e)) {
			FUZZ_CHECK(e.type == v->arr.type, "element type %u in an array of %u", e.type, v->arr.type);
			walk_value(g, &e, depth + 1);
			n++;
		}
		FUZZ_CHECK(n == v->arr.n, "iterator gave %llu of %llu elements", (unsigned long long)n,
			   (unsigned long long)v->arr.n);
		FUZZ_CHECK(it.p == d + v->arr.bytes, "iterator ended %td bytes off the array end",
			   it.p - (d + v->arr.bytes));

		if (v->arr.type == GGUF_STRING && v->arr.n <= 4096) {
			struct gguf_str *s = malloc((v->arr.n ? v->arr.n : 1) * sizeof(*s));
			if (!s)
				abort();
			FUZZ_CHECK(gguf_arr_strings(v, s) == 0, "gguf_arr_strings refused a string array");
			for (uint64_t i = 0; i < v->arr.n; i++)
				sink += fuzz_touch(s[i].p, s[i].len);
			free(s);
		}
		break;
	}
	case GGUF_BOOL:
		FUZZ_CHECK(v->u64 <= 1, "bool value %llu", (unsigned long long)v->u64);
		break;
	default:
		FUZZ_CHECK(gguf_vtype_size(v->type) > 0, "scalar of unknown type %u", v->type);
		sink += (unsigned)v->u64;
		break;
	}
}

/* Every getter on one key: each either succeeds or names the key. */
static void try_getters(const struct gguf_file *g, const char *key)
{
	struct nx_err err;
	uint32_t u;
	float f;
	bool b;
	char *s = NULL;
	const struct gguf_value *a;

	err.msg[0] = 0;
	if (gguf_get_u32(g, key, &u, true, &err))
		FUZZ_CHECK(err.msg[0], "gguf_get_u32('%s') failed without a message", key);
	err.msg[0] = 0;
	if (gguf_get_f32(g, key, &f, true, &err))
		FUZZ_CHECK(err.msg[0], "gguf_get_f32('%s') failed without a message", key);
	err.msg[0] = 0;
	if (gguf_get_bool(g, key, &b, true, &err))
		FUZZ_CHECK(err.msg[0], "gguf_get_bool('%s') failed without a message", key);
	err.msg[0] = 0;
	if (gguf_get_str(g, key, &s, true, &err) == 0) {
		FUZZ_CHECK(s != NULL, "gguf_get_str('%s') succeeded with no string", key);
		sink += (unsigned)strlen(s);
		free(s);
	} else {
		FUZZ_CHECK(err.msg[0], "gguf_get_str('%s') failed without a message", key);
	}
	static const enum gguf_vtype elems[] = { GGUF_STRING, GGUF_F32, GGUF_I32, GGUF_U8, GGUF_ARRAY };
	for (size_t i = 0; i < sizeof(elems) / sizeof(elems[0]); i++) {
		err.msg[0] = 0;
		if (gguf_get_arr(g, key, elems[i], &a, true, &err))
			FUZZ_CHECK(err.msg[0], "gguf_get_arr('%s') failed without a message", key);
		else
			FUZZ_CHECK(a && a->type == GGUF_ARRAY && a->arr.type == elems[i],
				   "gguf_get_arr('%s', %s) gave another type", key, gguf_vtype_name(elems[i]));
	}
}

static void touch_wt(const struct nx_wt *w)
{
	if (!w->data)
		return;
	FUZZ_CHECK(w->n_in > 0 && w->n_out > 0 && w->row_bytes > 0, "bound weight of shape (%lld, %lld)",
		   (long long)w->n_out, (long long)w->n_in);
	const uint8_t *d = w->data;
	size_t last = (size_t)(w->n_out - 1) * w->row_bytes;
	sink += d[0] + d[w->row_bytes - 1] + d[last] + d[last + w->row_bytes - 1];
}

static void touch_vec(const float *v, int n)
{
	if (!v)
		return;
	/* Read as floats, as the forward pass does: UBSan flags a misaligned vector. */
	volatile float a = v[0], b = v[n - 1];
	sink += (unsigned)(a != b);
}

static void barrier_none(void *ctx) { (void)ctx; }

/* One forward step of two tokens (first and last id, positions 0 and 1) on a
 * model that bound: whatever shapes the binder let through, the pass must
 * stay inside its state, scratch and weights. */
static void run_step(const struct nx_model *m)
{
	struct nx_state_cfg cfg = { .max_batch = 2, .max_logits = 2, .n_slots = 1, .n_ctx = 2 };
	size_t ss = nx_state_size(&m->hp, &cfg), cs = nx_scratch_size(&m->hp, &cfg);
	struct nx_err err = { { 0 } };
	struct nx_state st;
	struct nx_scratch sc;

	if (!ss || !cs || ss > (64u << 20) || cs > (64u << 20))
		return;
	void *smem = aligned_alloc(64, (ss + 63) & ~(size_t)63), *cmem = aligned_alloc(64, (cs + 63) & ~(size_t)63);
	if (!smem || !cmem)
		abort();
	if (nx_state_init(&st, smem, ss, &m->hp, &cfg, &err) == 0 && nx_scratch_init(&sc, cmem, cs, &m->hp, &cfg, &err) == 0) {
		struct nx_tok_in toks[2] = { { .token = 0, .pos = 0, .slot = 0, .logits_row = 0 },
					     { .token = m->hp.n_vocab - 1, .pos = 1, .slot = 0, .logits_row = 1 } };
		struct nx_sync sync = { .barrier = barrier_none };
		nx_forward(m, &st, toks, 2, 0, 1, &sc, &sync);
		sink += fuzz_touch(st.logits, 2 * (size_t)m->hp.n_vocab * sizeof(float));
	} else {
		FUZZ_CHECK(err.msg[0], "state/scratch init failed without a message");
	}
	free(smem);
	free(cmem);
}

static void check_model(const struct gguf_file *g)
{
	static struct nx_model m; /* ~40 KB: keep it off the stack */
	struct nx_err err = { { 0 } };

	if (nx_model_bind(&m, g, &err)) {
		FUZZ_CHECK(err.msg[0], "nx_model_bind failed without a message");
		return;
	}
	const struct nx_hparams *hp = &m.hp;
	FUZZ_CHECK(hp->n_layer >= 1 && hp->n_layer <= NX_MAX_LAYERS, "n_layer %d", hp->n_layer);
	FUZZ_CHECK(hp->dim > 0 && hp->n_head > 0 && hp->n_head_kv > 0 && hp->n_vocab > 0,
		   "hparams dim %d n_head %d n_head_kv %d n_vocab %d", hp->dim, hp->n_head, hp->n_head_kv,
		   hp->n_vocab);
	FUZZ_CHECK(hp->head_dim > 0 && hp->rope_dim > 0 && hp->rope_dim <= hp->head_dim, "head_dim %d rope_dim %d",
		   hp->head_dim, hp->rope_dim);
	touch_wt(&m.tok_embd);
	touch_wt(&m.output);
	touch_vec(m.out_norm, hp->dim);
	for (int il = 0; il < hp->n_layer; il++) {
		const struct nx_layer *L = &m.layers[il];
		int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
		touch_vec(L->attn_norm, hp->dim);
		touch_vec(L->ffn_norm, hp->dim);
		touch_vec(L->bq, q_dim);
		touch_vec(L->bk, kv_dim);
		touch_vec(L->bv, kv_dim);
		touch_wt(&L->wq);
		touch_wt(&L->wk);
		touch_wt(&L->wv);
		touch_wt(&L->wo);
		touch_wt(&L->w_gate);
		touch_wt(&L->w_up);
		touch_wt(&L->w_down);
		touch_wt(&L->moe_router);
		touch_wt(&L->moe_gate);
		touch_wt(&L->moe_up);
		touch_wt(&L->moe_down);
		touch_wt(&L->shexp_gate_inp);
		touch_wt(&L->shexp_gate);
		touch_wt(&L->shexp_up);
		touch_wt(&L->shexp_down);
	}
	run_step(&m);
}

static void check_tokenizer(const struct gguf_file *g, const uint8_t *data, size_t size)
{
	struct nx_tok *t = NULL;
	struct nx_err err = { { 0 } };

	if (nx_tok_load(&t, g, &err)) {
		FUZZ_CHECK(err.msg[0], "nx_tok_load failed without a message");
		return;
	}
	int32_t n_vocab = nx_tok_n_vocab(t);
	FUZZ_CHECK(n_vocab > 0, "tokenizer with %d tokens", n_vocab);
	int32_t special[] = { nx_tok_bos(t), nx_tok_eos(t), nx_tok_eot(t) };
	for (size_t i = 0; i < 3; i++)
		FUZZ_CHECK(special[i] >= -1 && special[i] < n_vocab, "special id %d of %d", special[i], n_vocab);
	sink += (unsigned)nx_tok_add_bos(t) + (unsigned)nx_tok_add_space_prefix(t) + (unsigned)nx_tok_kind(t);
	sink += (unsigned)strlen(nx_tok_pre_name(t));

	/* Every token's text and piece: the loader copied them out of the file. */
	size_t max_piece = nx_tok_max_piece(t);
	for (int32_t id = 0; id < n_vocab && id < 4096; id++) {
		size_t len = 0;
		const char *s = nx_tok_text(t, id, &len);
		FUZZ_CHECK(s != NULL, "no text for id %d < n_vocab %d", id, n_vocab);
		sink += fuzz_touch(s, len);
		for (int sp = 0; sp < 2; sp++) {
			s = nx_tok_piece(t, id, sp, &len);
			FUZZ_CHECK(s != NULL, "no piece for id %d", id);
			FUZZ_CHECK(len <= max_piece, "piece of id %d is %zu bytes > max_piece %zu", id, len, max_piece);
			sink += fuzz_touch(s, len);
		}
		sink += (unsigned)nx_tok_type(t, id) + nx_tok_is_eog(t, id) + nx_tok_is_control(t, id);
	}
	FUZZ_CHECK(nx_tok_text(t, n_vocab, &(size_t){ 0 }) == NULL, "text for id n_vocab");

	/* A short encode/decode of the file's own tail, both special modes. */
	size_t n = size < 64 ? size : 64;
	const char *text = (const char *)data + size - n;
	int32_t ids[256];
	size_t n_ids = 0;
	for (int sp = 0; sp < 2; sp++) {
		err.msg[0] = 0;
		if (nx_tok_encode(t, text, n, sp, ids, 256, &n_ids, &err)) {
			FUZZ_CHECK(err.msg[0], "nx_tok_encode failed without a message");
			continue;
		}
		FUZZ_CHECK(n_ids <= 256, "encode wrote %zu ids into 256", n_ids);
		for (size_t i = 0; i < n_ids; i++)
			FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "encode gave id %d of %d", ids[i], n_vocab);
		char out[4096];
		size_t n_out = 0;
		if (nx_tok_decode(t, ids, n_ids, NX_DETOK_SPECIAL, out, sizeof(out), &n_out, &err) == 0) {
			size_t bad = 0;
			FUZZ_CHECK(fuzz_utf8_valid((const uint8_t *)out, n_out, &bad),
				   "decode gave invalid UTF-8 at byte %zu of %zu", bad, n_out);
		}
	}
	nx_tok_free(t);
}

static void check_chat(const struct gguf_file *g)
{
	char *jinja = NULL, *sys = NULL, *out = NULL;
	struct nx_err err;

	if (gguf_get_str(g, "tokenizer.chat_template", &jinja, false, &err) || !jinja)
		return;
	enum nx_chat_tmpl tm = nx_chat_detect(jinja);
	if (nx_chat_default_system(tm, jinja, &sys, &err) == 0 && sys)
		sink += (unsigned)strlen(sys);
	struct nx_chat_msg msgs[] = { { "system", " sys " }, { "user", "hi" }, { "assistant", "yo" }, { "user", "q" } };
	if (nx_chat_render(tm, jinja, msgs + 1, 3, true, &out, &err) == 0)
		sink += (unsigned)strlen(out);
	free(out);
	out = NULL;
	if (nx_chat_render(tm, jinja, msgs, 4, true, &out, &err) == 0)
		sink += (unsigned)strlen(out);
	free(out);
	free(sys);
	free(jinja);
}

static void check_adapter(const uint8_t *data, size_t size)
{
	struct nx_lora_src src;
	struct nx_err err = { { 0 } };

	if (nx_lora_parse_gguf(&src, data, size, &base_model, &err)) {
		FUZZ_CHECK(err.msg[0], "nx_lora_parse_gguf failed without a message");
		return;
	}
	size_t n = nx_lora_size(&src);
	if (n > 0 && n < (64u << 20)) {
		void *mem = aligned_alloc(64, (n + 63) & ~(size_t)63);
		struct nx_lora *l = malloc(sizeof(*l));
		if (!mem || !l)
			abort();
		err.msg[0] = 0;
		if (nx_lora_init(l, mem, n, &src, &err) == 0) {
			for (int il = 0; il < base_model.hp.n_layer; il++)
				for (int w = 0; w < NX_LORA_N_WHICH; w++) {
					const struct nx_lora_t *t = nx_lora_get(l, il, (enum nx_lora_which)w);
					const struct nx_wt *bw = nx_lora_base(&base_model, il, (enum nx_lora_which)w);
					if (!t)
						continue;
					FUZZ_CHECK(bw && t->n_in == bw->n_in && t->n_out == bw->n_out && t->rank >= 1,
						   "adapter layer %d matrix %d: shape differs from the base", il, w);
					volatile float x = nx_lora_elt(t->dtype, t->a, 0) +
							   nx_lora_elt(t->dtype, t->a, (size_t)(t->rank * t->n_in - 1)) +
							   nx_lora_elt(t->dtype, t->b, 0) +
							   nx_lora_elt(t->dtype, t->b, (size_t)(t->n_out * t->rank - 1));
					sink += (unsigned)(x == 0);
				}
		} else {
			FUZZ_CHECK(err.msg[0], "nx_lora_init failed without a message");
		}
		free(l);
		free(mem);
	}
	nx_lora_close(&src);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file g;
	struct nx_err err = { { 0 } };

	if (gguf_parse(&g, data, size, &err)) {
		FUZZ_CHECK(err.msg[0] && strlen(err.msg) < sizeof(err.msg), "gguf_parse failed without a message");
		/* gguf_parse frees on failure; freeing again must be harmless. */
		gguf_free(&g);
		return 0;
	}
	FUZZ_CHECK(g.version == 2 || g.version == 3, "version %u accepted", g.version);
	FUZZ_CHECK(g.alignment && !(g.alignment & (g.alignment - 1)), "alignment %llu",
		   (unsigned long long)g.alignment);

	for (uint64_t i = 0; i < g.n_kv; i++) {
		const struct gguf_kv *kv = &g.kv[i];
		FUZZ_CHECK(kv->key.len > 0 && kv->key.len <= size, "key %llu of %llu bytes", (unsigned long long)i,
			   (unsigned long long)kv->key.len);
		sink += fuzz_touch(kv->key.p, kv->key.len);
		walk_value(&g, &kv->val, 0);
		char *key = fuzz_strndup(kv->key.p, kv->key.len);
		if (strlen(key) == kv->key.len) { /* a key with a NUL inside cannot be asked for by name */
			const struct gguf_value *v = gguf_get(&g, key);
			FUZZ_CHECK(v == &kv->val, "gguf_get('%s') did not find key %llu", key, (unsigned long long)i);
			if (i < 64)
				try_getters(&g, key);
		}
		free(key);
	}
	for (uint64_t i = 0; i < g.n_tensors; i++) {
		const struct gguf_tensor *t = &g.tensors[i];
		const uint8_t *d = t->data;
		FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS, "n_dims %u", t->n_dims);
		for (int k = 0; k < GGUF_MAX_DIMS; k++)
			FUZZ_CHECK(t->ne[k] > 0, "tensor %llu ne[%d] = %lld", (unsigned long long)i, k,
				   (long long)t->ne[k]);
		FUZZ_CHECK(t->size > 0 && d >= data && t->size <= size && (size_t)(d - data) <= size - t->size,
			   "tensor %llu data [%td, +%llu) outside the %zu-byte file", (unsigned long long)i, d - data,
			   (unsigned long long)t->size, size);
		int64_t row = nx_row_size(t->type, t->ne[0]);
		FUZZ_CHECK(row > 0 && (uint64_t)row * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]) == t->size,
			   "tensor %llu size %llu does not match its shape", (unsigned long long)i,
			   (unsigned long long)t->size);
		sink += d[0] + d[t->size - 1];
		char *name = fuzz_strndup(t->name.p, t->name.len);
		if (strlen(name) == t->name.len)
			FUZZ_CHECK(gguf_find_tensor(&g, name) == t, "gguf_find_tensor('%s') missed tensor %llu", name,
				   (unsigned long long)i);
		free(name);
	}
	static const char *const common_keys[] = {
		"general.architecture", "general.alignment", "general.name", "llama.block_count",
		"llama.context_length", "llama.rope.freq_base", "qwen2.block_count", "tokenizer.ggml.model",
		"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
		"tokenizer.ggml.merges", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id",
		"tokenizer.chat_template", "",
	};
	for (size_t i = 0; i < sizeof(common_keys) / sizeof(common_keys[0]); i++)
		try_getters(&g, common_keys[i]);
	FUZZ_CHECK(gguf_find_tensor(&g, "") == NULL, "an empty tensor name was found");

	check_model(&g);
	check_tokenizer(&g, data, size);
	check_chat(&g);
	gguf_free(&g);
	check_adapter(data, size);
	return 0;
}
