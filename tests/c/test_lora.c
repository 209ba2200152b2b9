/* test_lora.c - safetensors parser and LoRA loader against good and hostile adapters (docs/reliability.md 11-12), plus fold and delta arithmetic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lora/adapter.h"
#include "lora/delta.h"
#include "kern/pack.h"
#include "lora/fold.h"
#include "lora/safetensors.h"
#include "model/gguf.h"
#include "rng.h"

/* ---------------------------------------------------------------- buffers */

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	if (n)
		memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void w_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void w_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void w_str(struct buf *b, const char *s)
{
	w_u64(b, strlen(s));
	put(b, s, strlen(s));
}

static void buf_free(struct buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* Asserts rc == -1 and that err mentions every one of the given strings. */
#define expect_err(rc, err, ...) expect_err_(rc, &(err), __FILE__, __LINE__, __VA_ARGS__, NULL)
static void expect_err_(int rc, const struct nx_err *err, const char *file, int line, ...)
{
	if (rc != -1)
		fail_msg("%s:%d: expected an error, got rc %d", file, line, rc);
	va_list ap;
	va_start(ap, line);
	for (const char *s; (s = va_arg(ap, const char *));)
		if (!strstr(err->msg, s))
			fail_msg("%s:%d: error \"%s\" does not mention \"%s\"", file, line, err->msg, s);
	va_end(ap);
}

#define expect_ok(rc, err)                                                      \
	do {                                                                    \
		if ((rc) != 0)                                                  \
			fail_msg("%s:%d: unexpected error: %s", __FILE__, __LINE__, (err).msg); \
	} while (0)

/* ---------------------------------------------------------------- a model */

/* llama, 2 layers, dim 64, n_ff 128, 4 heads of 16, 2 kv heads: q_dim 64, kv_dim 32. */
#define DIM 64
#define N_FF 128
#define KV_DIM 32
#define N_LAYER 2

static struct nx_model model;
static float wdata[N_FF * N_FF]; /* shared F32 weights: only shapes matter for loading */

static void set_wt(struct nx_wt *w, int64_t n_in, int64_t n_out)
{
	w->type = NX_F32;
	w->n_in = n_in;
	w->n_out = n_out;
	w->row_bytes = (size_t)n_in * 4;
	w->data = wdata;
}

static void make_model(void)
{
	memset(&model, 0, sizeof(model));
	model.hp = (struct nx_hparams){.arch = NX_ARCH_LLAMA, .n_layer = N_LAYER, .dim = DIM, .n_ff = N_FF,
				       .n_head = 4, .n_head_kv = 2, .head_dim = 16, .rope_dim = 16, .n_vocab = 10,
				       .n_ctx_train = 64, .rope_base = 10000, .norm_eps = 1e-5f};
	for (int il = 0; il < N_LAYER; il++) {
		struct nx_layer *L = &model.layers[il];
		set_wt(&L->wq, DIM, DIM);
		set_wt(&L->wk, DIM, KV_DIM);
		set_wt(&L->wv, DIM, KV_DIM);
		set_wt(&L->wo, DIM, DIM);
		set_wt(&L->w_gate, DIM, N_FF);
		set_wt(&L->w_up, DIM, N_FF);
		set_wt(&L->w_down, N_FF, DIM);
	}
	for (size_t i = 0; i < sizeof(wdata) / sizeof(wdata[0]); i++)
		wdata[i] = (float)((int)(i * 29 % 23) - 11) / 32.0f;
}

/* A value exact in f32, f16 and bf16, different per (tensor seed, index). */
static float pattern(uint32_t seed, int64_t i)
{
	return (float)((int64_t)((i + seed) * 37 % 17) - 8) / 16.0f;
}

/* ---------------------------------------------------------------- safetensors writer */

struct st_spec {
	char name[160];
	const char *dtype; /* "F32", "F16", "BF16" or anything for hostile files */
	int n_dims;
	int64_t shape[3];
};

static int64_t n_elem(const struct st_spec *s)
{
	int64_t n = 1;
	for (int i = 0; i < s->n_dims; i++)
		n *= s->shape[i];
	return n;
}

/* 8-byte length, header text, data (raw). hlen: the header length to write. */
static void st_raw(struct buf *b, uint64_t hlen, const char *header, const void *data, size_t n)
{
	w_u64(b, hlen);
	put(b, header, strlen(header));
	put(b, data, n);
}

/* A well-formed file with tensors in order, data filled by pattern(i-th tensor). */
static void st_build(struct buf *b, const struct st_spec *t, int n, const char *metadata_json)
{
	char *h = malloc(1 << 16);
	assert_non_null(h);
	size_t o = (size_t)snprintf(h, 1 << 16, "{");
	if (metadata_json)
		o += (size_t)snprintf(h + o, (1 << 16) - o, "\"__metadata__\":%s,", metadata_json);
	struct buf data = {0};
	for (int i = 0; i < n; i++) {
		size_t begin = data.n;
		for (int64_t j = 0; j < n_elem(&t[i]); j++) {
			float f = pattern((uint32_t)i, j);
			if (!strcmp(t[i].dtype, "F32")) {
				put(&data, &f, 4);
			} else if (!strcmp(t[i].dtype, "F16")) {
				uint16_t v = nx_f32_to_f16(f);
				put(&data, &v, 2);
			} else {
				uint16_t v = nx_f32_to_bf16(f);
				put(&data, &v, 2);
			}
		}
		o += (size_t)snprintf(h + o, (1 << 16) - o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
				      t[i].name, t[i].dtype);
		for (int d = 0; d < t[i].n_dims; d++)
			o += (size_t)snprintf(h + o, (1 << 16) - o, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
		o += (size_t)snprintf(h + o, (1 << 16) - o, "],\"data_offsets\":[%zu,%zu]}", begin, data.n);
	}
	o += (size_t)snprintf(h + o, (1 << 16) - o, "}");
	while (o % 8) /* as the reference writer does: pad with spaces */
		h[o++] = ' ';
	h[o] = 0;
	st_raw(b, o, h, data.p, data.n);
	free(h);
	buf_free(&data);
}

static int st_parse_buf(const struct buf *b, struct nx_err *err)
{
	struct nx_st_file f;
	int rc = nx_st_parse(&f, b->p, b->n, err);
	if (rc == 0)
		nx_st_free(&f);
	return rc;
}

/* Parses header + data_bytes of zeros, with the real header length. */
static int st_try(const char *header, size_t data_bytes, struct nx_err *err)
{
	struct buf b = {0};
	uint8_t *zero = calloc(1, data_bytes + 1);
	st_raw(&b, strlen(header), header, zero, data_bytes);
	int rc = st_parse_buf(&b, err);
	free(zero);
	buf_free(&b);
	return rc;
}

/* ---------------------------------------------------------------- safetensors tests */

static void test_st_valid(void **state)
{
	struct buf b = {0};
	struct nx_err err;
	struct st_spec t[] = {
		{"x", "F32", 2, {2, 3}},
		{"y", "F16", 1, {5}},
		{"z", "BF16", 3, {1, 2, 2}},
		{"empty", "F32", 2, {0, 4}},
	};
	st_build(&b, t, 4, "{\"format\":\"pt\",\"k\":\"v\"}");
	struct nx_st_file f;
	expect_ok(nx_st_parse(&f, b.p, b.n, &err), err);
	assert_int_equal(f.n_tensors, 4);
	assert_string_equal(nx_st_meta_get(&f, "format"), "pt");
	assert_null(nx_st_meta_get(&f, "nope"));
	for (int i = 0; i < 3; i++) {
		const struct nx_st_tensor *x = nx_st_find(&f, t[i].name);
		assert_non_null(x);
		assert_int_equal(x->n_dims, t[i].n_dims);
		for (int64_t j = 0; j < x->n_elem; j++)
			assert_true(nx_st_elem(x->dtype, x->data, j) == pattern((uint32_t)i, j));
	}
	assert_int_equal(nx_st_find(&f, "empty")->n_elem, 0);
	assert_null(nx_st_find(&f, "w"));
	nx_st_free(&f);

	/* Every truncation is an error, never a crash (and never an out-of-range read: ASan/valgrind clean). */
	for (size_t n = 0; n < b.n; n++) {
		uint8_t *copy = malloc(n ? n : 1);
		memcpy(copy, b.p, n);
		assert_int_equal(nx_st_parse(&f, copy, n, &err), -1);
		free(copy);
	}
	buf_free(&b);

	/* Tensors may be listed in any order as long as the offsets tile the data. */
	expect_ok(st_try("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
			 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, &err), err);
	/* No tensors, empty data section. */
	expect_ok(st_try("{}", 0, &err), err);
}

static void test_st_header_length(void **state)
{
	struct nx_err err;
	struct buf b = {0};
	const char *h = "{}";
	st_raw(&b, 100000000ull, h, NULL, 0);
	expect_err(st_parse_buf(&b, &err), err, "header length 100000000", "limit");
	buf_free(&b);
	st_raw(&b, UINT64_MAX, h, NULL, 0);
	expect_err(st_parse_buf(&b, &err), err, "header length", "limit");
	buf_free(&b);
	st_raw(&b, 1000, h, NULL, 0);
	expect_err(st_parse_buf(&b, &err), err, "header length 1000", "past the end");
	buf_free(&b);
	st_raw(&b, 3, h, NULL, 0); /* one byte past */
	expect_err(st_parse_buf(&b, &err), err, "past the end");
	buf_free(&b);
	struct nx_st_file f;
	expect_err(nx_st_parse(&f, "\x02\0\0", 3, &err), err, "too short");
}

static void test_st_not_utf8_json(void **state)
{
	struct nx_err err;
	expect_err(st_try("{\"a\xff\":{}}", 0, &err), err, "not UTF-8", "0xff");
	expect_err(st_try("{\"\xc0\xaf\":{}}", 0, &err), err, "not UTF-8"); /* overlong '/' */
	expect_err(st_try("{\"\xed\xa0\x80\":{}}", 0, &err), err, "not UTF-8"); /* a surrogate */
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",", 0, &err), err, "not valid JSON");
	expect_err(st_try("{\"a\":1} x", 0, &err), err, "not valid JSON");
	expect_err(st_try("[1, 2]  ", 0, &err), err, "not a JSON object");
	expect_err(st_try("  {}", 0, &err), err, "not a JSON object");
	struct buf b = {0};
	st_raw(&b, 4, "{}", NULL, 0);
	put(&b, "\0\0", 2); /* NUL bytes inside the header */
	expect_err(st_parse_buf(&b, &err), err, "not valid JSON");
	buf_free(&b);
	/* Duplicate names. */
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, &err),
		   err, "not valid JSON", "duplicate");
	expect_err(st_try("{\"__metadata__\":{\"k\":1}}", 0, &err), err, "__metadata__", "'k'", "not a string");
	expect_err(st_try("{\"__metadata__\":[]}", 0, &err), err, "__metadata__", "not an object");
}

static void test_st_offsets(void **state)
{
	struct nx_err err;
#define T(name, b, e) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[" #b "," #e "]}"
	expect_err(st_try("{" T("a", 0, 32) "," T("b", 16, 48) "}", 48, &err), err, "'b'", "overlap", "'a'");
	expect_err(st_try("{" T("a", 0, 32) "," T("b", 0, 32) "}", 32, &err), err, "overlap");
	expect_err(st_try("{" T("a", 0, 32) "," T("b", 40, 72) "}", 72, &err), err, "'b'", "gap of 8 bytes", "'a'");
	expect_err(st_try("{" T("a", 8, 40) "}", 40, &err), err, "'a'", "gap", "start of the data section");
	expect_err(st_try("{" T("a", 32, 0) "}", 32, &err), err, "'a'", "data_offsets [32, 0]", "reversed");
	expect_err(st_try("{" T("a", 0, 32) "}", 40, &err), err, "end at data offset 32 (tensor 'a')", "short of", "40 bytes");
	expect_err(st_try("{" T("a", 0, 32) "}", 16, &err), err, "'a'", "run past the data section");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,18446744073709551615]}}", 32, &err),
		   err, "not valid JSON"); /* beyond int64: jansson refuses it */
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0]}}", 32, &err), err, "'a'",
		   "data_offsets", "[begin, end]");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[-4,28]}}", 32, &err), err, "'a'",
		   "non-negative");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0.0,32]}}", 32, &err), err, "'a'",
		   "non-negative integers");
#undef T
}

static void test_st_shape_dtype(void **state)
{
	struct nx_err err;
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,16]}}", 16, &err), err, "'a'",
		   "span 16 bytes", "shape [2, 4] x F32 needs 32");
	expect_err(st_try("{\"a\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,32]}}", 32, &err), err,
		   "needs 16");
	expect_err(st_try("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err), err, "'a'",
		   "unknown dtype 'F33'");
	expect_err(st_try("{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, &err), err, "'a'",
		   "dtype 'I64' is not supported");
	expect_err(st_try("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err), err, "'a'", "dtype",
		   "not a string");
	expect_err(st_try("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err), err, "'a'", "'dtype' is missing");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, &err), err, "'shape' is missing");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, &err), err, "'data_offsets' is missing");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, &err), err, "'a'",
		   "shape[0]", "non-negative");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,\"x\"],\"data_offsets\":[0,4]}}", 4, &err), err,
		   "shape[1]");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, &err),
		   err, "'a'", "overflows");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4, &err),
		   err, "'a'", "shape x dtype size overflows"); /* 2^62 elements x 4 bytes */
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952],\"data_offsets\":[0,4]}}", 4, &err),
		   err, "'a'", "needs 9223372036854775808"); /* 2^61 x 4 fits: a plain mismatch */
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, &err),
		   err, "9 dimensions");
	expect_err(st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4, &err), err,
		   "'a'", "unknown field 'extra'");
	expect_err(st_try("{\"a\":[1]}", 0, &err), err, "'a'", "not an object");
	expect_err(st_try("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err), err, "empty name");
}

static void test_st_open(void **state)
{
	struct nx_err err;
	struct nx_st_mapped m;
	char dir[] = "/tmp/nx-test-lora-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char p[256];
	snprintf(p, sizeof(p), "%s/fifo", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	expect_err(nx_st_open(&m, p, &err), err, "not a regular file");
	unlink(p);
	expect_err(nx_st_open(&m, dir, &err), err, "not a regular file");
	snprintf(p, sizeof(p), "%s/missing", dir);
	expect_err(nx_st_open(&m, p, &err), err, "cannot open");
	snprintf(p, sizeof(p), "%s/ok.safetensors", dir);
	struct buf b = {0};
	struct st_spec t[] = {{"x", "F32", 2, {2, 3}}};
	st_build(&b, t, 1, NULL);
	FILE *f = fopen(p, "wb");
	fwrite(b.p, 1, b.n, f);
	fclose(f);
	expect_ok(nx_st_open(&m, p, &err), err);
	assert_int_equal(m.f.n_tensors, 1);
	nx_st_close(&m);
	/* A bad file names itself. */
	f = fopen(p, "r+b");
	fputc(0xff, f);
	fclose(f);
	expect_err(nx_st_open(&m, p, &err), err, p, "header length");
	unlink(p);
	rmdir(dir);
	buf_free(&b);
}

/* ---------------------------------------------------------------- PEFT adapters */

static const char *const peft_mod[NX_LORA_N_WHICH] = {
	"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
	"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
};
static const int64_t mat_in[NX_LORA_N_WHICH] = {DIM, DIM, DIM, DIM, DIM, DIM, N_FF};
static const int64_t mat_out[NX_LORA_N_WHICH] = {DIM, KV_DIM, KV_DIM, DIM, N_FF, N_FF, DIM};

/* Specs for a full rank-r PEFT adapter over every layer and matrix (A then B). */
static int peft_specs(struct st_spec *t, int rank, const char *dtype)
{
	int n = 0;
	for (int il = 0; il < N_LAYER; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			snprintf(t[n].name, sizeof(t[n].name), "base_model.model.model.layers.%d.%s.lora_A.weight", il,
				 peft_mod[w]);
			t[n].dtype = dtype;
			t[n].n_dims = 2;
			t[n].shape[0] = rank;
			t[n].shape[1] = mat_in[w];
			n++;
			snprintf(t[n].name, sizeof(t[n].name), "base_model.model.model.layers.%d.%s.lora_B.weight", il,
				 peft_mod[w]);
			t[n].dtype = dtype;
			t[n].n_dims = 2;
			t[n].shape[0] = mat_out[w];
			t[n].shape[1] = rank;
			n++;
		}
	return n;
}

#define CONFIG(r, alpha, extra)                                                                          \
	"{\"peft_type\":\"LORA\",\"r\":" #r ",\"lora_alpha\":" #alpha ",\"target_modules\":[\"q_proj\",\"k_proj\"," \
	"\"v_proj\",\"o_proj\",\"gate_proj\",\"up_proj\",\"down_proj\"],\"rank_pattern\":{},\"alpha_pattern\":{}" extra "}"

static int peft_try(const struct st_spec *t, int n, const char *config, struct nx_err *err)
{
	struct buf b = {0};
	struct nx_lora_src src;
	st_build(&b, t, n, NULL);
	int rc = nx_lora_parse_peft(&src, b.p, b.n, config, strlen(config), &model, err);
	if (rc == 0)
		nx_lora_close(&src);
	buf_free(&b);
	return rc;
}

/* Loads a PEFT buffer fully into *l (heap mem in *mem). */
static int peft_load(const struct buf *b, const char *config, struct nx_lora *l, void **mem, struct nx_err *err)
{
	struct nx_lora_src src;
	if (nx_lora_parse_peft(&src, b->p, b->n, config, strlen(config), &model, err))
		return -1;
	size_t n = nx_lora_size(&src);
	*mem = aligned_alloc(64, (n + 63) / 64 * 64);
	int rc = nx_lora_init(l, *mem, n, &src, err);
	nx_lora_close(&src);
	return rc;
}

/* The HF row that llama.cpp's q/k permutation puts at GGUF row r (heads 0: no permutation). */
static int64_t hf_row(int64_t r, int heads, int64_t n_out)
{
	if (!heads)
		return r;
	int64_t hd = n_out / heads, h = r / hd, i = (r % hd) / 2, j = r % 2;
	return h * hd + j * (hd / 2) + i;
}

static void test_peft_valid(void **state)
{
	static struct st_spec t[64];
	static struct nx_lora l;
	struct nx_err err;
	const char *dtypes[] = {"F32", "F16", "BF16"};
	for (int d = 0; d < 3; d++) {
		int n = peft_specs(t, 4, dtypes[d]);
		struct buf b = {0};
		st_build(&b, t, n, "{\"format\":\"pt\"}");
		void *mem;
		expect_ok(peft_load(&b, CONFIG(4, 8, ), &l, &mem, &err), err);
		assert_int_equal(l.n, N_LAYER * NX_LORA_N_WHICH);
		assert_int_equal(l.rank, 4);
		assert_true(l.alpha == 8);
		int i = 0;
		for (int il = 0; il < N_LAYER; il++)
			for (int w = 0; w < NX_LORA_N_WHICH; w++, i += 2) {
				const struct nx_lora_t *x = nx_lora_get(&l, il, (enum nx_lora_which)w);
				assert_non_null(x);
				assert_int_equal(x->rank, 4);
				assert_int_equal(x->n_in, mat_in[w]);
				assert_int_equal(x->n_out, mat_out[w]);
				assert_true(x->scale == 2.0f);
				assert_int_equal((uintptr_t)x->a % 64, 0);
				assert_int_equal((uintptr_t)x->b % 64, 0);
				/* held in the file's own 16-bit format where the delta converts it in registers */
				assert_int_equal(x->dtype, d == 0 || !nx_lora_fast16() ? NX_LORA_F32
							   : d == 1			? NX_LORA_F16
											: NX_LORA_BF16);
				for (int64_t j = 0; j < 4 * x->n_in; j++)
					assert_true(nx_lora_elt(x->dtype, x->a, (size_t)j) == pattern((uint32_t)i, j));
				/* q and k rows in GGUF's order (llama): per head, HF's halves interleaved. */
				int heads = w == NX_LORA_Q ? 4 : w == NX_LORA_K ? 2 : 0;
				for (int64_t r = 0; r < x->n_out; r++)
					for (int k = 0; k < 4; k++)
						assert_true(nx_lora_elt(x->dtype, x->b, (size_t)(r * 4 + k)) ==
							    pattern((uint32_t)i + 1, hf_row(r, heads, x->n_out) * 4 + k));
				/* rank 4: B's tiles with the AVX-512 delta, from the rows in that order */
				assert_true((x->bt != NULL) == nx_lora_fast16());
				for (int64_t r = 0; x->bt && r < x->n_out; r++)
					for (int k = 0; k < 4; k++)
						assert_true(nx_lora_elt(x->dtype, x->bt, (size_t)(((r / 16) * 4 + k) * 16 + r % 16)) ==
							    nx_lora_elt(x->dtype, x->b, (size_t)(r * 4 + k)));
			}
		assert_null(nx_lora_get(&l, N_LAYER, NX_LORA_Q));
		free(mem);
		buf_free(&b);
	}

	/* rslora: alpha / sqrt(r); and a partial adapter (q and v of layer 1 only, other prefix). */
	struct st_spec p[4] = {
		{"base_model.model.layers.1.self_attn.q_proj.lora_A.weight", "F32", 2, {16, DIM}},
		{"base_model.model.layers.1.self_attn.q_proj.lora_B.weight", "F32", 2, {DIM, 16}},
		{"base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight", "F32", 2, {KV_DIM, 16}},
		{"base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight", "F32", 2, {16, DIM}},
	};
	struct buf b = {0};
	st_build(&b, p, 4, NULL);
	void *mem;
	expect_ok(peft_load(&b, CONFIG(16, 32, ",\"use_rslora\":true"), &l, &mem, &err), err);
	assert_int_equal(l.n, 2);
	assert_true(l.rslora);
	assert_float_equal(nx_lora_get(&l, 1, NX_LORA_Q)->scale, 8.0f, 1e-6);
	assert_null(nx_lora_get(&l, 1, NX_LORA_Q)->bt); /* rank 16 in f32: rows of a cache line, no tiles */
	assert_non_null(nx_lora_get(&l, 1, NX_LORA_V));
	assert_null(nx_lora_get(&l, 0, NX_LORA_Q));
	assert_null(nx_lora_get(&l, 1, NX_LORA_K));
	free(mem);

	/* qwen2 models are not permuted, nor are their PEFT adapters. */
	model.hp.arch = NX_ARCH_QWEN2;
	expect_ok(peft_load(&b, CONFIG(16, 32, ), &l, &mem, &err), err);
	model.hp.arch = NX_ARCH_LLAMA;
	for (int64_t j = 0; j < 16 * DIM; j++)
		assert_true(nx_lora_elt(NX_LORA_F32, nx_lora_get(&l, 1, NX_LORA_Q)->b, (size_t)j) == pattern(1, j));
	free(mem);

	/* The buffer must be big enough and aligned. */
	struct nx_lora_src src;
	const char *cfg = CONFIG(16, 32, );
	expect_ok(nx_lora_parse_peft(&src, b.p, b.n, cfg, strlen(cfg), &model, &err), err);
	size_t need = nx_lora_size(&src);
	assert_true(need >= (size_t)(16 * DIM * 2 + 16 * DIM + 16 * KV_DIM) * 4);
	uint8_t *big = aligned_alloc(64, need + 64);
	expect_err(nx_lora_init(&l, big, need - 1, &src, &err), err, "need");
	expect_err(nx_lora_init(&l, big + 4, need, &src, &err), err, "aligned");
	expect_ok(nx_lora_init(&l, big, need, &src, &err), err);
	nx_lora_close(&src);
	free(big);
	buf_free(&b);
}

/* One PEFT pair (A, B) of layer il, matrix w with the given shapes. */
static void pair(struct st_spec *t, int il, int w, int64_t a0, int64_t a1, int64_t b0, int64_t b1)
{
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.model.layers.%d.%s.lora_A.weight", il, peft_mod[w]);
	snprintf(t[1].name, sizeof(t[1].name), "base_model.model.model.layers.%d.%s.lora_B.weight", il, peft_mod[w]);
	t[0].dtype = t[1].dtype = "F32";
	t[0].n_dims = t[1].n_dims = 2;
	t[0].shape[0] = a0, t[0].shape[1] = a1;
	t[1].shape[0] = b0, t[1].shape[1] = b1;
}

static void test_peft_hostile(void **state)
{
	struct st_spec t[4];
	struct nx_err err;
	const char *cfg = CONFIG(4, 8, );

	/* rank mismatch between A and B */
	pair(t, 0, NX_LORA_Q, 4, DIM, DIM, 8);
	expect_err(peft_try(t, 2, cfg, &err), err, "rank mismatch", "q_proj.lora_A.weight' has rank 4",
		   "q_proj.lora_B.weight' has rank 8", "blk.0.attn_q.weight");
	/* ranks agree but differ from the config's r */
	pair(t, 0, NX_LORA_Q, 8, DIM, DIM, 8);
	expect_err(peft_try(t, 2, cfg, &err), err, "has rank 8", "r = 4");
	/* shape not matching the base: A of k with 60 inputs (another hidden size) */
	pair(t, 0, NX_LORA_K, 4, 60, KV_DIM, 4);
	expect_err(peft_try(t, 2, cfg, &err), err, "k_proj.lora_A.weight' has shape [4, 60], expected [4, 64]",
		   "blk.0.attn_k.weight", "hidden size");
	/* B of k with 30 outputs */
	pair(t, 1, NX_LORA_K, 4, DIM, 30, 4);
	expect_err(peft_try(t, 2, cfg, &err), err, "layers.1.self_attn.k_proj.lora_B.weight' has shape [30, 4]",
		   "expected [32, 4]", "n_out of blk.1.attn_k.weight");
	/* down_proj A must have n_ff inputs */
	pair(t, 0, NX_LORA_DOWN, 4, DIM, DIM, 4);
	expect_err(peft_try(t, 2, cfg, &err), err, "down_proj.lora_A.weight' has shape [4, 64], expected [4, 128]");
	/* a whole adapter for a model of another hidden size */
	pair(t, 0, NX_LORA_Q, 4, 96, 96, 4);
	expect_err(peft_try(t, 2, cfg, &err), err, "expected [4, 64]", "hidden size");
	/* missing half */
	pair(t, 0, NX_LORA_V, 4, DIM, KV_DIM, 4);
	expect_err(peft_try(t, 1, cfg, &err), err, "v_proj.lora_A.weight' has no matching lora_B",
		   "blk.0.attn_v.weight");
	expect_err(peft_try(t + 1, 1, cfg, &err), err, "v_proj.lora_B.weight' has no matching lora_A");
	/* unknown module */
	pair(t, 0, NX_LORA_Q, 4, DIM, DIM, 4);
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.model.layers.0.self_attn.c_attn.lora_A.weight");
	expect_err(peft_try(t, 2, cfg, &err), err, "c_attn.lora_A.weight", "module 'self_attn.c_attn' is not supported");
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.model.layers.0.mlp.q_proj.lora_A.weight");
	expect_err(peft_try(t, 2, cfg, &err), err, "module 'mlp.q_proj'");
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.lm_head.lora_A.weight");
	expect_err(peft_try(t, 2, cfg, &err), err, "lm_head.lora_A.weight", "not a LoRA weight this loader understands");
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector");
	expect_err(peft_try(t, 2, cfg, &err), err, "lora_magnitude_vector", "not a LoRA weight");
	/* control characters never reach a message */
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.\\u001b[2Jlayers.0.self_attn.q_proj.lora_A.weight");
	expect_err(peft_try(t, 2, cfg, &err), err, "name of tensor 0 holds control characters");
	assert_null(strchr(err.msg, 0x1b));
	/* layer out of range, and odd layer numbers */
	pair(t, 2, NX_LORA_Q, 4, DIM, DIM, 4);
	expect_err(peft_try(t, 2, cfg, &err), err, "layers.2.self_attn.q_proj.lora_A.weight", "layer 2 is out of range",
		   "2 layers");
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.model.layers.01.self_attn.q_proj.lora_A.weight");
	expect_err(peft_try(t, 2, cfg, &err), err, "layers.01", "no layer number");
	snprintf(t[0].name, sizeof(t[0].name), "base_model.model.model.layers.99999999999.self_attn.q_proj.lora_A.weight");
	expect_err(peft_try(t, 2, cfg, &err), err, "no layer number");
	/* the same matrix twice under two prefixes */
	pair(t, 0, NX_LORA_Q, 4, DIM, DIM, 4);
	pair(t + 2, 0, NX_LORA_Q, 4, DIM, DIM, 4);
	snprintf(t[2].name, sizeof(t[2].name), "base_model.model.layers.0.self_attn.q_proj.lora_A.weight");
	snprintf(t[3].name, sizeof(t[3].name), "base_model.model.layers.0.self_attn.q_proj.lora_B.weight");
	expect_err(peft_try(t, 4, cfg, &err), err, "are both lora_A of blk.0.attn_q.weight");
	/* 3-D A */
	pair(t, 0, NX_LORA_Q, 4, DIM, DIM, 4);
	t[0].n_dims = 3, t[0].shape[2] = 1;
	expect_err(peft_try(t, 2, cfg, &err), err, "q_proj.lora_A.weight' has 3 dimensions");
	/* rank 0 */
	pair(t, 0, NX_LORA_Q, 0, DIM, DIM, 0);
	expect_err(peft_try(t, 2, cfg, &err), err, "has rank 0");
	/* no tensors at all */
	expect_err(peft_try(t, 0, cfg, &err), err, "no LoRA tensors");
	/* a module missing from target_modules */
	pair(t, 0, NX_LORA_Q, 4, DIM, DIM, 4);
	expect_err(peft_try(t, 2, "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"v_proj\"]}", &err), err,
		   "q_proj.lora_A.weight", "not in adapter_config.json's target_modules");
	expect_ok(peft_try(t, 2, "{\"r\":4,\"lora_alpha\":8,\"target_modules\":\"model.*proj\"}", &err), err);
}

static void test_peft_config(void **state)
{
	struct st_spec t[2];
	struct nx_err err;
	pair(t, 0, NX_LORA_Q, 4, DIM, DIM, 4);
	expect_err(peft_try(t, 2, "{\"r\":4,", &err), err, "adapter_config.json is not valid JSON");
	expect_err(peft_try(t, 2, "[]", &err), err, "not a JSON object");
	expect_err(peft_try(t, 2, "{\"lora_alpha\":8,\"target_modules\":[]}", &err), err, "'r' is missing");
	expect_err(peft_try(t, 2, "{\"r\":0,\"lora_alpha\":8,\"target_modules\":[]}", &err), err, "'r' is not an integer");
	expect_err(peft_try(t, 2, "{\"r\":\"4\",\"lora_alpha\":8,\"target_modules\":[]}", &err), err, "'r'");
	expect_err(peft_try(t, 2, "{\"r\":4,\"target_modules\":[]}", &err), err, "'lora_alpha' is missing");
	expect_err(peft_try(t, 2, "{\"r\":4,\"lora_alpha\":\"x\",\"target_modules\":[]}", &err), err, "'lora_alpha'");
	expect_err(peft_try(t, 2, "{\"r\":4,\"lora_alpha\":8}", &err), err, "'target_modules' is missing");
	expect_err(peft_try(t, 2, "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[1]}", &err), err, "target_modules[0]");
	expect_err(peft_try(t, 2, "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"rank_pattern\":{\"q_proj\":8}}",
			    &err), err, "rank_pattern", "not supported");
	expect_err(peft_try(t, 2, "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"alpha_pattern\":{\"q\":1}}",
			    &err), err, "alpha_pattern", "not supported");
	expect_err(peft_try(t, 2, CONFIG(4, 8, ",\"use_dora\":true"), &err), err, "use_dora", "DoRA");
	expect_err(peft_try(t, 2, CONFIG(4, 8, ",\"fan_in_fan_out\":true"), &err), err, "fan_in_fan_out");
	expect_err(peft_try(t, 2, CONFIG(4, 8, ",\"use_rslora\":1"), &err), err, "use_rslora");
	expect_err(peft_try(t, 2, "{\"peft_type\":\"IA3\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[]}", &err), err,
		   "peft_type");
	expect_ok(peft_try(t, 2, CONFIG(4, 8, ",\"use_dora\":false,\"fan_in_fan_out\":false,\"use_rslora\":null"), &err),
		  err);
}

static void test_non_finite(void **state)
{
	struct st_spec t[2];
	struct nx_err err;
	pair(t, 1, NX_LORA_UP, 4, DIM, N_FF, 4);
	struct buf b = {0};
	st_build(&b, t, 2, NULL);
	/* Put an inf into B (the second tensor, after A's 4*64 floats) at row 3, column 1. */
	size_t data0 = 8 + (size_t)(*(uint64_t *)b.p);
	float inf = INFINITY;
	memcpy(b.p + data0 + (4 * DIM + 3 * 4 + 1) * 4, &inf, 4);
	static struct nx_lora l;
	void *mem;
	expect_err(peft_load(&b, CONFIG(4, 8, ), &l, &mem, &err), err, "layers.1.mlp.up_proj.lora_B.weight",
		   "non-finite", "row 3, column 1");
	free(mem);
	buf_free(&b);
}

/* ---------------------------------------------------------------- GGUF adapters */

struct g_t {
	char name[96];
	int64_t ne0, ne1;
	enum nx_type type;
};

/* A GGUF LoRA: kvs given as (key, "s:value" | "f:value" | "u:value"), tensors filled by pattern. */
static void gguf_build(struct buf *b, const char *const *kv, int n_kv, const struct g_t *t, int n_t)
{
	put(b, "GGUF", 4);
	w_u32(b, 3);
	w_u64(b, (uint64_t)n_t);
	w_u64(b, (uint64_t)n_kv);
	for (int i = 0; i < n_kv; i++) {
		const char *v = kv[2 * i + 1];
		w_str(b, kv[2 * i]);
		if (v[0] == 's') {
			w_u32(b, GGUF_STRING);
			w_str(b, v + 2);
		} else if (v[0] == 'f') {
			w_u32(b, GGUF_F32);
			float f = strtof(v + 2, NULL);
			put(b, &f, 4);
		} else {
			w_u32(b, GGUF_U32);
			w_u32(b, (uint32_t)strtoul(v + 2, NULL, 10));
		}
	}
	uint64_t off = 0;
	for (int i = 0; i < n_t; i++) {
		w_str(b, t[i].name);
		w_u32(b, 2);
		w_u64(b, (uint64_t)t[i].ne0);
		w_u64(b, (uint64_t)t[i].ne1);
		w_u32(b, t[i].type);
		w_u64(b, off);
		off += ((uint64_t)nx_row_size(t[i].type, t[i].ne0) * t[i].ne1 + 31) / 32 * 32;
	}
	while (b->n % 32)
		put(b, "", 1);
	for (int i = 0; i < n_t; i++) {
		int64_t n = t[i].ne0 * t[i].ne1;
		float *f = malloc(sizeof(float) * (size_t)n + 4);
		for (int64_t j = 0; j < n; j++)
			f[j] = pattern((uint32_t)i, j);
		size_t bytes = (size_t)nx_row_size(t[i].type, t[i].ne0) * (size_t)t[i].ne1;
		uint8_t *q = malloc(bytes + 1);
		nx_type_ref(t[i].type)->quant(f, q, n);
		put(b, q, bytes);
		while (b->n % 32 && i + 1 < n_t)
			put(b, "", 1);
		free(f);
		free(q);
	}
}

static const char *const gguf_mod[NX_LORA_N_WHICH] = {
	"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};

static void gpair(struct g_t *t, int il, int w, int64_t a_ne0, int64_t a_ne1, int64_t b_ne0, int64_t b_ne1)
{
	snprintf(t[0].name, sizeof(t[0].name), "blk.%d.%s.weight.lora_a", il, gguf_mod[w]);
	snprintf(t[1].name, sizeof(t[1].name), "blk.%d.%s.weight.lora_b", il, gguf_mod[w]);
	t[0].ne0 = a_ne0, t[0].ne1 = a_ne1, t[0].type = NX_F16;
	t[1].ne0 = b_ne0, t[1].ne1 = b_ne1, t[1].type = NX_F16;
}

static const char *const good_kv[] = {
	"general.architecture", "s:llama", "general.type", "s:adapter", "adapter.type", "s:lora",
	"adapter.lora.alpha", "f:8",
};

static int gguf_try(const char *const *kv, int n_kv, const struct g_t *t, int n_t, struct nx_err *err)
{
	struct buf b = {0};
	gguf_build(&b, kv, n_kv, t, n_t);
	struct nx_lora_src src;
	int rc = nx_lora_parse_gguf(&src, b.p, b.n, &model, err);
	if (rc == 0)
		nx_lora_close(&src);
	buf_free(&b);
	return rc;
}

static void test_gguf_valid(void **state)
{
	struct g_t t[2 * N_LAYER * NX_LORA_N_WHICH];
	struct nx_err err;
	int n = 0;
	for (int il = 0; il < N_LAYER; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++, n += 2)
			gpair(&t[n], il, w, mat_in[w], 4, 4, mat_out[w]);
	t[0].type = t[1].type = NX_F32;
	t[2].type = t[3].type = NX_BF16;
	struct buf b = {0};
	gguf_build(&b, good_kv, 4, t, n);
	struct nx_lora_src src;
	expect_ok(nx_lora_parse_gguf(&src, b.p, b.n, &model, &err), err);
	static struct nx_lora l;
	size_t need = nx_lora_size(&src);
	void *mem = aligned_alloc(64, need);
	expect_ok(nx_lora_init(&l, mem, need, &src, &err), err);
	nx_lora_close(&src);
	assert_int_equal(l.n, N_LAYER * NX_LORA_N_WHICH);
	int i = 0;
	for (int il = 0; il < N_LAYER; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++, i += 2) {
			const struct nx_lora_t *x = nx_lora_get(&l, il, (enum nx_lora_which)w);
			assert_non_null(x);
			assert_true(x->scale == 2.0f);
			/* GGUF's A (ne [n_in, r]) is the same row-major (r, n_in) matrix as PEFT's. */
			for (int64_t j = 0; j < 4 * x->n_in; j++)
				assert_true(nx_lora_elt(x->dtype, x->a, (size_t)j) == pattern((uint32_t)i, j));
			for (int64_t j = 0; j < 4 * x->n_out; j++)
				assert_true(nx_lora_elt(x->dtype, x->b, (size_t)j) == pattern((uint32_t)i + 1, j));
		}
	free(mem);
	buf_free(&b);

	/* No alpha: the user's scale alone (llama.cpp). */
	gpair(t, 0, NX_LORA_Q, DIM, 4, 4, DIM);
	gguf_build(&b, good_kv, 3, t, 2);
	expect_ok(nx_lora_parse_gguf(&src, b.p, b.n, &model, &err), err);
	need = nx_lora_size(&src);
	mem = aligned_alloc(64, need);
	expect_ok(nx_lora_init(&l, mem, need, &src, &err), err);
	assert_true(nx_lora_get(&l, 0, NX_LORA_Q)->scale == 1.0f);
	nx_lora_close(&src);
	free(mem);
	buf_free(&b);
}

static void test_gguf_hostile(void **state)
{
	struct g_t t[4];
	struct nx_err err;
	gpair(t, 0, NX_LORA_Q, DIM, 4, 4, DIM);
	/* another architecture */
	const char *qwen[] = {"general.architecture", "s:qwen2", "general.type", "s:adapter", "adapter.type", "s:lora"};
	expect_err(gguf_try(qwen, 3, t, 2, &err), err, "architecture 'qwen2'", "model is 'llama'");
	/* another hidden size, declared */
	const char *hid[] = {"general.architecture", "s:llama", "general.type", "s:adapter", "adapter.type", "s:lora",
			     "llama.embedding_length", "u:128"};
	expect_err(gguf_try(hid, 4, t, 2, &err), err, "llama.embedding_length = 128", "hidden size 128", "64");
	/* another hidden size, by shape */
	gpair(t, 1, NX_LORA_UP, 128, 4, 4, N_FF);
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err, "'blk.1.ffn_up.weight.lora_a' has shape [128, 4], expected [64, 4]",
		   "n_in of blk.1.ffn_up.weight", "hidden size");
	/* B not matching the base */
	gpair(t, 0, NX_LORA_Q, DIM, 8, 8, 60);
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err,
		   "'blk.0.attn_q.weight.lora_b' has shape [8, 60], expected [8, 64] (rank 8 x n_out of blk.0.attn_q.weight");
	/* rank mismatch */
	gpair(t, 0, NX_LORA_V, DIM, 4, 8, KV_DIM);
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err, "rank mismatch", "'blk.0.attn_v.weight.lora_a' has rank 4",
		   "'blk.0.attn_v.weight.lora_b' has rank 8");
	/* missing half */
	gpair(t, 0, NX_LORA_O, DIM, 4, 4, DIM);
	expect_err(gguf_try(good_kv, 4, t + 1, 1, &err), err, "'blk.0.attn_output.weight.lora_b' has no matching lora_a");
	/* unknown module, and tensors that are not LoRA weights */
	gpair(t, 0, NX_LORA_Q, DIM, 4, 4, DIM);
	snprintf(t[0].name, sizeof(t[0].name), "blk.0.attn_qkv.weight.lora_a");
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err, "blk.0.attn_qkv.weight.lora_a", "module 'attn_qkv'");
	snprintf(t[0].name, sizeof(t[0].name), "token_embd.weight.lora_a");
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err, "token_embd.weight.lora_a", "not supported");
	snprintf(t[0].name, sizeof(t[0].name), "blk.0.attn_q.weight");
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err, "'blk.0.attn_q.weight' is not supported");
	snprintf(t[0].name, sizeof(t[0].name), "blk.0.attn_q\n.weight.lora_a");
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err, "name of tensor 0 holds control characters");
	/* layer out of range */
	gpair(t, 7, NX_LORA_Q, DIM, 4, 4, DIM);
	expect_err(gguf_try(good_kv, 4, t, 2, &err), err, "blk.7.attn_q.weight.lora_a", "layer 7 is out of range");
	/* not an adapter / not a LoRA / bad alpha */
	gpair(t, 0, NX_LORA_Q, DIM, 4, 4, DIM);
	expect_err(gguf_try(good_kv, 1, t, 2, &err), err, "general.type is missing", "expected 'adapter'");
	const char *model_kv[] = {"general.architecture", "s:llama", "general.type", "s:model"};
	expect_err(gguf_try(model_kv, 2, t, 2, &err), err, "general.type is 'model'");
	const char *ia3[] = {"general.architecture", "s:llama", "general.type", "s:adapter", "adapter.type", "s:ia3"};
	expect_err(gguf_try(ia3, 3, t, 2, &err), err, "adapter.type is 'ia3'");
	const char *na[] = {"general.architecture", "s:llama", "general.type", "s:adapter", "adapter.type", "s:lora",
			    "adapter.lora.alpha", "f:-1"};
	expect_err(gguf_try(na, 4, t, 2, &err), err, "adapter.lora.alpha = -1");
	const char *wt[] = {"general.architecture", "s:llama", "general.type", "s:adapter", "adapter.type", "s:lora",
			    "adapter.lora.alpha", "s:8"};
	expect_err(gguf_try(wt, 4, t, 2, &err), err, "adapter.lora.alpha");
	/* a broken GGUF is reported by the GGUF reader, prefixed */
	struct buf b = {0};
	gguf_build(&b, good_kv, 4, t, 2);
	struct nx_lora_src src;
	expect_err(nx_lora_parse_gguf(&src, b.p, b.n - 1, &model, &err), err, "lora: gguf:");
	buf_free(&b);
}

/* ---------------------------------------------------------------- files */

static void write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(p, 1, n, f), n);
	fclose(f);
}

static void test_open_files(void **state)
{
	char dir[] = "/tmp/nx-test-lora-XXXXXX", p[300], q[300];
	struct nx_err err;
	assert_non_null(mkdtemp(dir));
	static struct st_spec t[64];
	int n = peft_specs(t, 4, "F16");
	struct buf b = {0};
	st_build(&b, t, n, NULL);
	snprintf(p, sizeof(p), "%s/adapter_model.safetensors", dir);
	write_file(p, b.p, b.n);
	buf_free(&b);
	/* No config yet. */
	struct nx_lora *l;
	void *mem;
	expect_err(nx_lora_load(&l, &mem, dir, &model, &err), err, "adapter_config.json");
	const char *cfg = CONFIG(4, 16, );
	snprintf(q, sizeof(q), "%s/adapter_config.json", dir);
	write_file(q, cfg, strlen(cfg));
	expect_ok(nx_lora_load(&l, &mem, dir, &model, &err), err);
	assert_int_equal(l->n, N_LAYER * NX_LORA_N_WHICH);
	assert_true(nx_lora_get(l, 0, NX_LORA_Q)->scale == 4.0f);
	assert_string_equal(l->name, strrchr(dir, '/') + 1);
	free(l);
	free(mem);
	expect_ok(nx_lora_load(&l, &mem, p, &model, &err), err); /* the .safetensors path */
	free(l);
	free(mem);

	/* GGUF by magic, whatever its name. */
	struct g_t g[2];
	gpair(g, 1, NX_LORA_DOWN, N_FF, 2, 2, DIM);
	gguf_build(&b, good_kv, 4, g, 2);
	snprintf(p, sizeof(p), "%s/lora.bin", dir);
	write_file(p, b.p, b.n);
	buf_free(&b);
	expect_ok(nx_lora_load(&l, &mem, p, &model, &err), err);
	assert_int_equal(l->n, 1);
	assert_non_null(nx_lora_get(l, 1, NX_LORA_DOWN));
	free(l);
	free(mem);
	unlink(p);

	/* Only regular files. */
	snprintf(p, sizeof(p), "%s/fifo", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	expect_err(nx_lora_load(&l, &mem, p, &model, &err), err, "not a regular file");
	unlink(p);
	snprintf(p, sizeof(p), "%s/adapter_model.safetensors", dir);
	unlink(p);
	assert_int_equal(mkfifo(p, 0600), 0);
	expect_err(nx_lora_load(&l, &mem, dir, &model, &err), err, "not a regular file");
	unlink(p);
	expect_err(nx_lora_load(&l, &mem, "/nonexistent/lora", &model, &err), err, "cannot open");
	unlink(q);
	rmdir(dir);
}

/* ---------------------------------------------------------------- fold and delta */

static void test_fold(void **state)
{
	enum { R = 3 };
	static float a[R * N_FF], bm[DIM * R];
	for (int i = 0; i < R * N_FF; i++)
		a[i] = pattern(1, i) * 0.25f;
	for (int i = 0; i < DIM * R; i++)
		bm[i] = pattern(2, i) * 0.5f;
	/* W: ffn_down (DIM, N_FF), F32 */
	const struct nx_wt *w = &model.layers[0].w_down;
	struct nx_lora_t t = {.layer = 0, .which = NX_LORA_DOWN, .rank = R, .n_in = N_FF, .n_out = DIM, .scale = 1,
			      .a = a, .b = bm};
	const float s = 0.75f;
	float before[N_FF * N_FF];
	memcpy(before, wdata, sizeof(before));
	struct nx_err err;

	float *out = malloc((size_t)nx_fold_size(w, NX_F32));
	expect_ok(nx_fold_tensor(w, &t, s, NX_F32, out, &err), err);
	for (int r = 0; r < DIM; r++)
		for (int j = 0; j < N_FF; j++) {
			double d = 0;
			for (int k = 0; k < R; k++)
				d += (double)bm[r * R + k] * a[k * N_FF + j];
			float want = (float)((double)wdata[r * N_FF + j] + (double)s * d);
			assert_true(out[r * N_FF + j] == want);
		}
	assert_memory_equal(before, wdata, sizeof(before)); /* the base is never written */

	/* Banded folds give the same bytes as one pass. */
	for (enum nx_type ty = NX_F16; ty <= NX_Q8_0; ty = ty == NX_F16 ? NX_Q4_1 : ty == NX_Q4_1 ? NX_Q8_0 : NX_TYPE_COUNT) {
		size_t sz = (size_t)nx_fold_size(w, ty);
		uint8_t *one = malloc(sz), *banded = calloc(1, sz);
		expect_ok(nx_fold_tensor(w, &t, s, ty, one, &err), err);
		void *work = malloc(nx_fold_work_size(w));
		nx_fold_rows(w, &t, s, ty, banded, 40, DIM, work);
		nx_fold_rows(w, &t, s, ty, banded, 0, 17, work);
		nx_fold_rows(w, &t, s, ty, banded, 17, 40, work);
		assert_memory_equal(one, banded, sz);
		free(work);
		free(one);
		free(banded);
	}
	free(out);

	/* Types that cannot hold rows of 128 (k-quants need 256), unknown names, shape mismatches. */
	expect_err(nx_fold_check(w, &t, NX_Q4_K, &err), err, "rows of 128 elements do not fit q4_k blocks of 256");
	enum nx_type ty;
	expect_ok(nx_fold_type_parse("Q5_1", &ty, &err), err);
	assert_int_equal(ty, NX_Q5_1);
	expect_err(nx_fold_type_parse("q8_k", &ty, &err), err, "'q8_k'");
	expect_err(nx_fold_type_parse("iq2_xxs", &ty, &err), err, "unsupported");
	expect_ok(nx_fold_type_parse("IQ4_XS", &ty, &err), err);
	assert_int_equal(ty, NX_IQ4_XS);
	t.n_in = DIM;
	expect_err(nx_fold_check(w, &t, NX_F16, &err), err, "blk.0.ffn_down.weight");

	/* The arena is reserved with nx_fold_size_max: no fold, packed copy
	 * included, may take more. Here f32 (4 bytes a weight) is the widest. */
	int64_t most = nx_fold_size_max(w);
	assert_int_equal(most, nx_fold_size(w, NX_F32));
	for (uint32_t k = 0; k < NX_TYPE_COUNT; k++) {
		struct nx_err e2;
		if (nx_fold_type_parse(nx_type_name(k), &ty, &e2) < 0 || nx_fold_size(w, ty) < 0)
			continue;
		assert_true(nx_fold_size(w, ty) * (nx_pack_layout(ty) ? 2 : 1) <= most);
	}
}

static void test_delta(void **state)
{
	enum { R = 5, N = 3 };
	static float a[R * DIM], bm[N_FF * R], x[N * DIM], y[N * N_FF], y0[N * N_FF], u[N * R], u2[N * R];
	for (int i = 0; i < R * DIM; i++)
		a[i] = pattern(3, i);
	for (int i = 0; i < N_FF * R; i++)
		bm[i] = pattern(4, i);
	for (int i = 0; i < N * DIM; i++)
		x[i] = pattern(5, i);
	for (int i = 0; i < N * N_FF; i++)
		y[i] = y0[i] = pattern(6, i);
	struct nx_lora_t t = {.layer = 1, .which = NX_LORA_UP, .rank = R, .n_in = DIM, .n_out = N_FF, .scale = 2,
			      .a = a, .b = bm};
	const float s = 0.5f;
	assert_int_equal(nx_lora_delta_flops(&t), 2 * R * (DIM + N_FF));
	/* Only rows [10, 50) change, by s * B @ (A @ x); all inputs are small dyadic numbers, so f32 is exact. */
	nx_lora_delta(&t, s, x, DIM, N, y, N_FF, 10, 50, u);
	for (int i = 0; i < N; i++)
		for (int r = 0; r < N_FF; r++) {
			double d = 0;
			for (int k = 0; k < R; k++) {
				double ax = 0;
				for (int j = 0; j < DIM; j++)
					ax += (double)a[k * DIM + j] * x[i * DIM + j];
				d += bm[r * R + k] * ax;
			}
			double want = y0[i * N_FF + r] + (r >= 10 && r < 50 ? s * d : 0);
			assert_true(y[i * N_FF + r] == (float)want);
		}
	/* A @ x in two bands of k equals the whole. */
	nx_lora_delta_a(&t, x, DIM, N, 0, 2, u2, R);
	nx_lora_delta_a(&t, x, DIM, N, 2, R, u2, R);
	assert_memory_equal(u, u2, sizeof(u));

	/* Inexact values (rounding shows), rows of 100 (a tail under the mask): each u[i][k] is the same
	 * whichever range of k computes it (A's rows go four at a time where they can), it is
	 * nx_lora_dot_fast's, and within f32 rounding of the exact sum. */
	enum { RK = 9, NI = 100 };
	static float a2[RK * NI], x2[N * NI], w1[N * RK], w2[N * RK];
	rng_state = 99;
	for (int i = 0; i < RK * NI; i++)
		a2[i] = rng_sym() * 1.3f;
	for (int i = 0; i < N * NI; i++)
		x2[i] = rng_sym() * 3.0f;
	struct nx_lora_t t2 = {.layer = 0, .which = NX_LORA_Q, .rank = RK, .n_in = NI, .n_out = 1, .scale = 1, .a = a2,
			       .b = bm};
	nx_lora_delta_a(&t2, x2, NI, N, 0, RK, w1, RK);
	for (int k = 0; k < RK; k++)
		nx_lora_delta_a(&t2, x2, NI, N, k, k + 1, w2, RK);
	assert_memory_equal(w1, w2, sizeof(w1));
	for (int i = 0; i < N; i++)
		for (int k = 0; k < RK; k++) {
			double e = 0, mag = 0;
			for (int j = 0; j < NI; j++) {
				e += (double)a2[k * NI + j] * x2[i * NI + j];
				mag += fabs((double)a2[k * NI + j] * x2[i * NI + j]);
			}
			assert_true(w1[i * RK + k] == nx_lora_dot_fast(a2 + k * NI, x2 + i * NI, NI));
			assert_true(fabs(w1[i * RK + k] - e) <= 1e-6 * mag);
		}

	/* B @ u over any row range (sixteen rows at a time where they can): each row's value is
	 * nx_lora_delta_row's, bit for bit, at ranks below, at and above a vector's 16 lanes. */
	enum { NO = 100, RMAX = 70 };
	static float b2[NO * RMAX], u3[N * RMAX], y1[N * NO], y2[N * NO];
	static const int ranks[] = { 1, 3, 8, 16, 21, 64, 70 };
	for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++) {
		const int rk = ranks[ri];
		for (int i = 0; i < NO * rk; i++)
			b2[i] = rng_sym();
		for (int i = 0; i < N * rk; i++)
			u3[i] = rng_sym() * 2.0f;
		struct nx_lora_t t3 = {.layer = 0, .which = NX_LORA_O, .rank = rk, .n_in = 1, .n_out = NO, .scale = 1,
				       .a = a2, .b = b2};
		static const int cuts[][2] = { { 0, NO }, { 5, 37 }, { 16, 32 }, { 99, 100 }, { 0, 15 } };
		for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
			memset(y1, 0, sizeof(y1));
			memset(y2, 0, sizeof(y2));
			nx_lora_delta_b(&t3, u3, (size_t)rk, N, 0.75f, y1, NO, cuts[c][0], cuts[c][1]);
			for (int r = cuts[c][0]; r < cuts[c][1]; r++)
				for (int i = 0; i < N; i++)
					y2[i * NO + r] += 0.75f * nx_lora_delta_row(&t3, r, u3 + i * rk);
			if (memcmp(y1, y2, sizeof(y1)))
				fail_msg("rank %d rows [%d, %d): B @ u differs from the rows' dots", rk, cuts[c][0], cuts[c][1]);
		}
	}
}

/* A and B held as f16 or bf16 (the adapter file's own format) give the delta of their values held
 * as f32, bit for bit: A @ x over any range of A's rows and B @ u over any range of B's rows, at
 * ranks below, at and above sixteen lanes and rows with a tail. (make test-c runs this file again
 * with NX_KERN=avx2, for the plain-vector path.) */
static void test_delta_16bit(void **state)
{
	enum { N = 3, NI = 100, NO = 100, RMAX = 70 };
	static uint16_t a16[RMAX * NI], b16[NO * RMAX];
	static float a32[RMAX * NI], b32[NO * RMAX], x[N * NI], u[N * RMAX], w1[N * RMAX], w2[N * RMAX], y1[N * NO],
		y2[N * NO];
	static const int ranks[] = { 1, 4, 9, 16, 21, 64, 70 };
	rng_state = 7;
	for (int i = 0; i < N * NI; i++)
		x[i] = rng_sym() * 2.0f;
	for (int d = NX_LORA_F16; d <= NX_LORA_BF16; d++)
		for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++) {
			const int rk = ranks[ri];
			for (int i = 0; i < rk * NI; i++) {
				a16[i] = d == NX_LORA_F16 ? nx_f32_to_f16(rng_sym()) : nx_f32_to_bf16(rng_sym());
				a32[i] = nx_lora_elt((enum nx_lora_dtype)d, a16, (size_t)i);
			}
			for (int i = 0; i < NO * rk; i++) {
				b16[i] = d == NX_LORA_F16 ? nx_f32_to_f16(rng_sym()) : nx_f32_to_bf16(rng_sym());
				b32[i] = nx_lora_elt((enum nx_lora_dtype)d, b16, (size_t)i);
			}
			for (int i = 0; i < N * rk; i++)
				u[i] = rng_sym();
			struct nx_lora_t h = {.layer = 0, .which = NX_LORA_O, .rank = rk, .n_in = NI, .n_out = NO, .scale = 1,
					      .dtype = (enum nx_lora_dtype)d, .a = a16, .b = b16};
			struct nx_lora_t f = h;
			f.dtype = NX_LORA_F32;
			f.a = a32;
			f.b = b32;
			static const int kc[][2] = { { 0, RMAX }, { 1, 6 }, { 3, 4 }, { 5, RMAX } };
			for (size_t c = 0; c < sizeof(kc) / sizeof(kc[0]); c++) {
				const int k0 = kc[c][0] < rk ? kc[c][0] : rk, k1 = kc[c][1] < rk ? kc[c][1] : rk;
				memset(w1, 0, sizeof(w1));
				memset(w2, 0, sizeof(w2));
				nx_lora_delta_a(&h, x, NI, N, k0, k1, w1, RMAX);
				nx_lora_delta_a(&f, x, NI, N, k0, k1, w2, RMAX);
				if (memcmp(w1, w2, sizeof(w1)))
					fail_msg("dtype %d rank %d: A @ x rows [%d, %d) differ from f32's", d, rk, k0, k1);
			}
			static const int rc[][2] = { { 0, NO }, { 5, 37 }, { 99, 100 } };
			for (size_t c = 0; c < sizeof(rc) / sizeof(rc[0]); c++) {
				memset(y1, 0, sizeof(y1));
				memset(y2, 0, sizeof(y2));
				nx_lora_delta_b(&h, u, (size_t)rk, N, 0.75f, y1, NO, rc[c][0], rc[c][1]);
				nx_lora_delta_b(&f, u, (size_t)rk, N, 0.75f, y2, NO, rc[c][0], rc[c][1]);
				if (memcmp(y1, y2, sizeof(y1)))
					fail_msg("dtype %d rank %d: B @ u rows [%d, %d) differ from f32's", d, rk, rc[c][0], rc[c][1]);
				assert_true(nx_lora_delta_row(&h, rc[c][0], u) == nx_lora_delta_row(&f, rc[c][0], u));
			}
		}
}

/* B's tiles (nx_lora_t.bt, rows shorter than a cache line) give B @ u bit for bit as B's rows do, over
 * ranges that start on a tile (the tiles' path) and ranges that do not (the rows'), with a tail tile, at
 * ranks below, at and between one and two vectors' lanes, for f32, f16 and bf16. Row 3's products all
 * underflow to -0 and y starts at -0: the sign of a zero sum shows whether the tiles redo the rows'
 * masked tail (where 0 * 0 is added and -0 becomes +0). */
static void test_delta_tiles(void **state)
{
	enum { N = 2, NO = 100, RMAX = 31 };
	static uint16_t b16[NO * RMAX], bt16[112 * RMAX];
	static float b32[NO * RMAX], bt32[112 * RMAX], u[N * RMAX], y1[N * NO], y2[N * NO];
	static const int ranks[] = { 1, 3, 8, 9, 15, 16, 17, 20, 31 };
	static const int cuts[][2] = { { 0, NO }, { 16, 32 }, { 32, NO }, { 96, NO }, { 5, 37 } };
	if (!nx_lora_fast16())
		skip(); /* the tiles are the AVX-512 delta's */
	rng_state = 11;
	for (int d = NX_LORA_F32; d <= NX_LORA_BF16; d++)
		for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++) {
			const int rk = ranks[ri];
			if (!nx_lora_b_tiled(rk, (enum nx_lora_dtype)d))
				continue;
			/* row 3: the format's smallest value, u negative and small enough that every product of
			 * row 3 rounds to -0 */
			const float tiny = d == NX_LORA_F32 ? 0x1p-149f : d == NX_LORA_F16 ? 0x1p-24f : 0x1p-133f;
			const float us = d == NX_LORA_F32 ? 1.0f : d == NX_LORA_F16 ? 0x1p-126f : 0x1p-17f;
			for (int i = 0; i < NO * rk; i++) {
				const float v = i / rk == 3 ? tiny : rng_sym();
				b32[i] = v;
				b16[i] = d == NX_LORA_F16 ? nx_f32_to_f16(v) : nx_f32_to_bf16(v);
			}
			for (int i = 0; i < N * rk; i++)
				u[i] = -(0.25f + 0.2f * fabsf(rng_sym())) * us;
			struct nx_lora_t t = {.layer = 0, .which = NX_LORA_O, .rank = rk, .n_in = 1, .n_out = NO, .scale = 1,
					      .dtype = (enum nx_lora_dtype)d, .b = d == NX_LORA_F32 ? (void *)b32 : (void *)b16};
			void *bt = d == NX_LORA_F32 ? (void *)bt32 : (void *)bt16;
			nx_lora_b_tile(bt, t.b, NO, rk, t.dtype);
			for (int q = 0; q < 16; q++) /* tile 6: rows 96..99, then zeros */
				for (int k = 0; k < rk; k++) {
					const float want = 96 + q < NO ? nx_lora_elt(t.dtype, t.b, (size_t)((96 + q) * rk + k)) : 0.0f;
					assert_true(nx_lora_elt(t.dtype, bt, (size_t)((6 * rk + k) * 16 + q)) == want);
				}
			for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
				for (int i = 0; i < N * NO; i++)
					y1[i] = y2[i] = -0.0f;
				struct nx_lora_t tiled = t;
				tiled.bt = bt;
				nx_lora_delta_b(&tiled, u, (size_t)rk, N, 0.75f, y1, NO, cuts[c][0], cuts[c][1]);
				nx_lora_delta_b(&t, u, (size_t)rk, N, 0.75f, y2, NO, cuts[c][0], cuts[c][1]);
				if (memcmp(y1, y2, sizeof(y1)))
					fail_msg("dtype %d rank %d rows [%d, %d): B @ u from the tiles differs from the rows'", d,
						 rk, cuts[c][0], cuts[c][1]);
			}
			/* a slice of rows from a tile's start keeps the tiles, one from elsewhere has none */
			struct nx_lora_t tiled = t;
			tiled.bt = bt;
			assert_ptr_equal(nx_lora_b_rows(&tiled, 32, NO).bt, (uint8_t *)bt + 2 * nx_lora_b_tiles_size(16, rk, t.dtype));
			assert_null(nx_lora_b_rows(&tiled, 33, NO).bt);
		}
}

/* The float64 helpers of the fold and the report are, bit for bit, the loops they stand for: each
 * term in turn, each product rounded and then each sum (no fused multiply-add). The fold's row of B @ A
 * (nx_lora_ba_f64) from the sums already in acc, A held as f32, f16 or bf16, over column counts with and
 * without a tail past the vector width; the report's dots with every probe (nx_lora_dots_f64) for probe
 * counts around the vector width. */
static void test_f64_helpers(void **state)
{
	enum { RMAX = 70, NMAX = 200 };
	static uint16_t a16[RMAX * NMAX];
	static float a32[RMAX * NMAX];
	static double b[RMAX], got[NMAX], want[NMAX];
	static const int ns[] = { 1, 15, 31, 32, 33, 64, 100, 200 }, ranks[] = { 1, 3, 64, 70 };
	rng_state = 11;
	for (int d = NX_LORA_F32; d <= NX_LORA_BF16; d++)
		for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
			for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++) {
				const int n = ns[ni], rk = ranks[ri];
				for (int i = 0; i < rk * n; i++) {
					const float v = rng_sym() * 3.0f;
					a16[i] = d == NX_LORA_F16 ? nx_f32_to_f16(v) : nx_f32_to_bf16(v);
					a32[i] = d == NX_LORA_F32 ? v : nx_lora_elt((enum nx_lora_dtype)d, a16, (size_t)i);
				}
				for (int k = 0; k < rk; k++)
					b[k] = (double)rng_sym() / 3.0;
				for (int j = 0; j < n; j++)
					got[j] = want[j] = (double)rng_sym();
				for (int k = 0; k < rk; k++)
					for (int j = 0; j < n; j++) {
						volatile double p = b[k] * (double)a32[k * n + j]; /* rounded before the sum */
						want[j] = want[j] + p;
					}
				nx_lora_ba_f64((enum nx_lora_dtype)d, d == NX_LORA_F32 ? (const void *)a32 : (const void *)a16, n,
					       rk, b, got);
				if (memcmp(got, want, (size_t)n * sizeof(double)))
					fail_msg("dtype %d, %d columns, rank %d: B @ A differs from the float64 loop", d, n, rk);
			}
	static double d[NMAX], xt[NMAX * 40], dots[40];
	for (int n_x = 1; n_x <= 40; n_x += 3) {
		const int n = 150;
		for (int j = 0; j < n; j++)
			d[j] = (double)rng_sym() * 1e-3;
		for (int i = 0; i < n * n_x; i++)
			xt[i] = (double)rng_sym();
		nx_lora_dots_f64(d, xt, n, n_x, dots);
		for (int p = 0; p < n_x; p++) {
			double sum = 0;
			for (int j = 0; j < n; j++) {
				volatile double t = d[j] * xt[j * n_x + p]; /* rounded before the sum */
				sum = sum + t;
			}
			if (memcmp(&sum, &dots[p], sizeof(sum)))
				fail_msg("%d probes: dot %d differs from the float64 loop", n_x, p);
		}
	}
}

int main(void)
{
	make_model();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_st_valid),
		cmocka_unit_test(test_st_header_length),
		cmocka_unit_test(test_st_not_utf8_json),
		cmocka_unit_test(test_st_offsets),
		cmocka_unit_test(test_st_shape_dtype),
		cmocka_unit_test(test_st_open),
		cmocka_unit_test(test_peft_valid),
		cmocka_unit_test(test_peft_hostile),
		cmocka_unit_test(test_peft_config),
		cmocka_unit_test(test_non_finite),
		cmocka_unit_test(test_gguf_valid),
		cmocka_unit_test(test_gguf_hostile),
		cmocka_unit_test(test_open_files),
		cmocka_unit_test(test_fold),
		cmocka_unit_test(test_delta),
		cmocka_unit_test(test_delta_16bit),
		cmocka_unit_test(test_delta_tiles),
		cmocka_unit_test(test_f64_helpers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
