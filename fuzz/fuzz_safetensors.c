/* fuzz_safetensors.c - libFuzzer target: an untrusted safetensors file through nx_st_parse and the PEFT LoRA loader.
 *
 * When the file parses, every tensor's name, shape and data range is checked
 * against what the header promised and read (first and last element through
 * nx_st_elem), every metadata entry and lookup too. Then the same bytes go
 * through nx_lora_parse_peft against a tiny bound model (fuzz/data/tiny-llama.model,
 * dim 32, kv 16, ffn 32, 2 layers, found from $NX_FUZZ_ROOT, default ".") with
 * configs of rank 2 and 4; an adapter that validates is converted with
 * nx_lora_size / nx_lora_init, every adapted matrix is read back, and a
 * forward step runs with the adapter as a runtime delta. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/util.h"
#include "lora/adapter.h"
#include "lora/safetensors.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"

static struct gguf_mapped model_file;
static struct nx_model model;
static unsigned sink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *root = getenv("NX_FUZZ_ROOT");
	char path[512];
	struct nx_err err;

	snprintf(path, sizeof(path), "%s/fuzz/data/tiny-llama.model", root && *root ? root : ".");
	if (gguf_open(&model_file, path, &err) || nx_model_bind(&model, &model_file.g, &err)) {
		fprintf(stderr, "fuzz_safetensors: %s: %s (set NX_FUZZ_ROOT to the repo root)\n", path, err.msg);
		exit(1);
	}
	return 0; /* the model stays mapped for the whole run */
}

static void walk(const struct nx_st_file *f, const uint8_t *data, size_t size)
{
	FUZZ_CHECK(f->header_len < NX_ST_MAX_HEADER && f->header_len <= size - 8, "header_len %llu",
		   (unsigned long long)f->header_len);
	const uint8_t *d0 = data + 8 + f->header_len;
	uint64_t total = 0;
	for (size_t i = 0; i < f->n_tensors; i++) {
		const struct nx_st_tensor *t = &f->tensors[i];
		FUZZ_CHECK(t->name && t->n_dims >= 0 && t->n_dims <= NX_ST_MAX_DIMS, "tensor %zu: n_dims %d", i,
			   t->n_dims);
		int64_t n = 1;
		for (int k = 0; k < t->n_dims; k++) {
			FUZZ_CHECK(t->shape[k] >= 0, "tensor %zu: shape[%d] = %lld", i, k, (long long)t->shape[k]);
			FUZZ_CHECK(!__builtin_mul_overflow(n, t->shape[k], &n), "tensor %zu: shape overflows", i);
		}
		FUZZ_CHECK(n == t->n_elem, "tensor %zu: n_elem %lld, shape gives %lld", i, (long long)t->n_elem,
			   (long long)n);
		size_t es = nx_st_dtype_size(t->dtype);
		FUZZ_CHECK(es > 0 && t->begin <= t->end && t->end - t->begin == (uint64_t)n * es,
			   "tensor %zu: [%llu, %llu) for %lld x %zu bytes", i, (unsigned long long)t->begin,
			   (unsigned long long)t->end, (long long)n, es);
		FUZZ_CHECK(t->data == d0 + t->begin && t->end <= size - 8 - f->header_len,
			   "tensor %zu: data outside the file", i);
		total += t->end - t->begin;
		if (n > 0) {
			volatile float a = nx_st_elem(t->dtype, t->data, 0), b = nx_st_elem(t->dtype, t->data, n - 1);
			sink += (unsigned)(a == b);
		}
		sink += (unsigned)strlen(nx_st_dtype_name(t->dtype));
		FUZZ_CHECK(nx_st_find(f, t->name) != NULL, "nx_st_find('%s') found nothing", t->name);
	}
	/* Tensors tile the data section exactly. */
	FUZZ_CHECK(total == size - 8 - f->header_len, "tensors hold %llu bytes of a %zu-byte data section",
		   (unsigned long long)total, (size_t)(size - 8 - f->header_len));
	for (size_t i = 0; i < f->n_meta; i++) {
		FUZZ_CHECK(f->meta[i].key && f->meta[i].val, "meta %zu", i);
		const char *v = nx_st_meta_get(f, f->meta[i].key);
		FUZZ_CHECK(v != NULL, "nx_st_meta_get('%s') found nothing", f->meta[i].key);
		sink += (unsigned)strlen(v);
	}
	FUZZ_CHECK(nx_st_find(f, "") == NULL || f->n_tensors > 0, "empty name found in an empty file");
}

static void barrier_none(void *ctx) { (void)ctx; }

/* A forward step of two tokens, the second with the adapter as a runtime
 * delta (lora/delta.c): whatever adapter validated must stay in bounds. */
static void run_step(const struct nx_lora *l)
{
	static void *smem, *cmem;
	static size_t ss, cs;
	static struct nx_state_cfg cfg = { .max_batch = 2, .max_logits = 2, .n_slots = 1, .n_ctx = 2 };
	struct nx_state st;
	struct nx_scratch sc;
	struct nx_err err;

	if (!smem) { /* the model is fixed: size once */
		ss = nx_state_size(&model.hp, &cfg);
		cs = nx_scratch_size(&model.hp, &cfg);
		smem = aligned_alloc(64, (ss + 63) & ~(size_t)63);
		cmem = aligned_alloc(64, (cs + 63) & ~(size_t)63);
		if (!ss || !cs || !smem || !cmem)
			abort();
	}
	if (nx_state_init(&st, smem, ss, &model.hp, &cfg, &err) || nx_scratch_init(&sc, cmem, cs, &model.hp, &cfg, &err)) {
		fprintf(stderr, "fuzz_safetensors: state: %s\n", err.msg);
		abort();
	}
	struct nx_lora_mix mix = { .n = 1, .l = { l }, .scale = { 0.5f } };
	st.lora = &mix;
	st.n_lora = 1;
	struct nx_tok_in toks[2] = { { .token = 1, .pos = 0, .slot = 0, .logits_row = 0, .lora = 1 },
				     { .token = 2, .pos = 1, .slot = 0, .logits_row = 1, .lora = 0 } };
	struct nx_sync sync = { .barrier = barrier_none };
	nx_forward(&model, &st, toks, 2, 0, 1, &sc, &sync);
	sink += fuzz_touch(st.logits, 2 * (size_t)model.hp.n_vocab * sizeof(float));
}

static void try_lora(const uint8_t *data, size_t size, const char *config)
{
	struct nx_lora_src src;
	struct nx_err err = { { 0 } };

	if (nx_lora_parse_peft(&src, data, size, config, strlen(config), &model, &err)) {
		FUZZ_CHECK(err.msg[0], "nx_lora_parse_peft failed without a message");
		return;
	}
	size_t n = nx_lora_size(&src);
	FUZZ_CHECK(n > 0 || src.n == 0, "nx_lora_size 0 for %d matrices", src.n);
	if (n > 0 && n < (64u << 20)) {
		void *mem = aligned_alloc(64, (n + 63) & ~(size_t)63);
		struct nx_lora *l = malloc(sizeof(*l));
		if (!mem || !l)
			abort();
		err.msg[0] = 0;
		if (nx_lora_init(l, mem, n, &src, &err) == 0) {
			int seen = 0;
			for (int il = 0; il < model.hp.n_layer; il++)
				for (int w = 0; w < NX_LORA_N_WHICH; w++) {
					const struct nx_lora_t *t = nx_lora_get(l, il, (enum nx_lora_which)w);
					if (!t)
						continue;
					const struct nx_wt *base = nx_lora_base(&model, il, (enum nx_lora_which)w);
					FUZZ_CHECK(base && t->n_in == base->n_in && t->n_out == base->n_out && t->rank >= 1,
						   "layer %d matrix %d: shape differs from the base", il, w);
					const size_t elt = nx_lora_elt_size(t->dtype);
					const uint8_t *a = t->a, *b = t->b;
					FUZZ_CHECK(a >= (uint8_t *)mem && b + elt * (size_t)(t->n_out * t->rank) <= (uint8_t *)mem + n,
						   "layer %d matrix %d: A/B outside mem", il, w);
					volatile float x = nx_lora_elt(t->dtype, a, 0) +
							   nx_lora_elt(t->dtype, a, (size_t)(t->rank * t->n_in - 1)) +
							   nx_lora_elt(t->dtype, b, 0) +
							   nx_lora_elt(t->dtype, b, (size_t)(t->n_out * t->rank - 1));
					sink += (unsigned)(x == 0);
					seen++;
				}
			FUZZ_CHECK(seen == l->n, "nx_lora_get found %d of %d matrices", seen, l->n);
			run_step(l);
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
	struct nx_st_file f;
	struct nx_err err = { { 0 } };

	if (nx_st_parse(&f, data, size, &err)) {
		FUZZ_CHECK(err.msg[0], "nx_st_parse failed without a message");
		return 0;
	}
	walk(&f, data, size);
	nx_st_free(&f);

	try_lora(data, size, "{\"r\":2,\"lora_alpha\":4,\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\","
			     "\"o_proj\",\"gate_proj\",\"up_proj\",\"down_proj\"]}");
	try_lora(data, size, "{\"r\":4,\"lora_alpha\":8,\"use_rslora\":true,\"target_modules\":\"all\"}");
	return 0;
}
