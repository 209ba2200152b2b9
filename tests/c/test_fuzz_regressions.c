/* test_fuzz_regressions.c - the fuzz seeds and every input a fuzzer found, through the normal (non-fuzz) build.
 *
 * Seeds: fuzz/seeds.tsv (written by fuzz/make_seeds.py) says what each file of
 * fuzz/corpus/<target>/ must give - a success, or an error from a given stage
 * whose message contains given words (docs/reliability.md 1-14: every hostile file
 * gets an error naming what is wrong).
 * Regressions: tests/regressions/<target>/ holds minimized inputs that once
 * crashed or broke a property under fuzz/run. Each goes through the same
 * calls as its fuzz target and must end in a success or a clean error (a
 * message) - and in what tests/regressions/expect.tsv says (same columns as
 * seeds.tsv) when it is listed there; the full property checks run on them
 * again under ASan/UBSan in every `make fuzz-smoke`, which feeds these
 * directories to the fuzzers.
 * Runs from the repo root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern/quant.h"
#include "lora/adapter.h"
#include "lora/safetensors.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "proto/proto.h"
#include "tok/tokenizer.h"

/* The UTF-8 checker the fuzz targets use. */
#include "fuzz/util.c"

/* What fuzz_protocol.c parses with, and so what seeds.tsv expects. */
static const struct nxp_limits LIM = { .n_vocab = 1000, .n_ctx = 64, .max_tokens = 128, .max_line = 8192 };

/* fuzz_safetensors.c's two adapter configs. */
static const char *const PEFT_CONFIGS[2] = {
	"{\"r\":2,\"lora_alpha\":4,\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\",\"gate_proj\","
	"\"up_proj\",\"down_proj\"]}",
	"{\"r\":4,\"lora_alpha\":8,\"use_rslora\":true,\"target_modules\":\"all\"}",
};

static struct gguf_mapped base_file;
static struct nx_model base_model;

static uint8_t *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		print_error("cannot open %s\n", path);
		fail();
	}
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
	assert_non_null(p);
	assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	*n = (size_t)len;
	return p;
}

static void load_base_model(void)
{
	struct nx_err err;
	if (base_file.map)
		return;
	if (gguf_open(&base_file, "fuzz/data/tiny-llama.model", &err) || nx_model_bind(&base_model, &base_file.g, &err)) {
		print_error("fuzz/data/tiny-llama.model: %s\n", err.msg);
		fail();
	}
}

/* ------------------------------------------------------------- per target */

/* What one input gave at each stage: rc 0 / -1 (or 1 = not reached) and the message. */
struct stage {
	int rc;
	char msg[512];
};

enum { ST_PARSE, ST_MODEL, ST_TOK, ST_LORA, ST_N };
static const char *const stage_name[ST_N] = { "parse", "model", "tok", "lora" };

static void set(struct stage *s, int rc, const struct nx_err *err)
{
	s->rc = rc;
	snprintf(s->msg, sizeof(s->msg), "%s", rc ? err->msg : "");
}

/* A clean error: -1 and a message. */
static void expect_clean(const char *file, const struct stage *st)
{
	for (int i = 0; i < ST_N; i++) {
		if (st[i].rc == 0 || st[i].rc == 1)
			continue;
		if (st[i].rc != -1 || !st[i].msg[0]) {
			print_error("%s: %s returned %d with message '%s'\n", file, stage_name[i], st[i].rc, st[i].msg);
			fail();
		}
	}
}

static void walk_value(const struct gguf_value *v, int depth, unsigned *sum)
{
	assert_true(depth <= GGUF_MAX_NEST + 1);
	if (v->type == GGUF_STRING) {
		for (uint64_t i = 0; i < v->str.len; i++)
			*sum += (uint8_t)v->str.p[i];
	} else if (v->type == GGUF_ARRAY) {
		struct gguf_arr_iter it;
		struct gguf_value e;
		uint64_t n = 0;
		gguf_arr_iter_init(&it, v);
		while (gguf_arr_next(&it, &e)) {
			walk_value(&e, depth + 1, sum);
			n++;
		}
		assert_true(n == v->arr.n);
	}
}

static void barrier_none(void *ctx) { (void)ctx; }

/* One forward step of two tokens on a model that bound, as fuzz_gguf.c runs. */
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
	assert_true(smem && cmem);
	if (nx_state_init(&st, smem, ss, &m->hp, &cfg, &err) == 0 && nx_scratch_init(&sc, cmem, cs, &m->hp, &cfg, &err) == 0) {
		struct nx_tok_in toks[2] = { { .token = 0, .pos = 0, .slot = 0, .logits_row = 0 },
					     { .token = m->hp.n_vocab - 1, .pos = 1, .slot = 0, .logits_row = 1 } };
		struct nx_sync sync = { .barrier = barrier_none };
		nx_forward(m, &st, toks, 2, 0, 1, &sc, &sync);
	}
	free(smem);
	free(cmem);
}

/* gguf: parse, walk, bind (and one step), tokenizer, adapter - as fuzz_gguf.c does. */
static void run_gguf(const uint8_t *d, size_t n, struct stage *st)
{
	struct gguf_file g;
	struct nx_err err = { { 0 } };
	static struct nx_model m;
	unsigned sum = 0;

	for (int i = 0; i < ST_N; i++)
		st[i].rc = 1, st[i].msg[0] = 0;
	set(&st[ST_PARSE], gguf_parse(&g, d, n, &err), &err);
	if (st[ST_PARSE].rc)
		return;
	for (uint64_t i = 0; i < g.n_kv; i++)
		walk_value(&g.kv[i].val, 0, &sum);
	for (uint64_t i = 0; i < g.n_tensors; i++) {
		const uint8_t *p = g.tensors[i].data;
		assert_true(p >= d && g.tensors[i].size <= n && (size_t)(p - d) <= n - g.tensors[i].size);
		sum += p[0] + p[g.tensors[i].size - 1];
	}
	err.msg[0] = 0;
	set(&st[ST_MODEL], nx_model_bind(&m, &g, &err), &err);
	if (st[ST_MODEL].rc == 0)
		run_step(&m);
	struct nx_tok *t = NULL;
	err.msg[0] = 0;
	set(&st[ST_TOK], nx_tok_load(&t, &g, &err), &err);
	if (t)
		nx_tok_free(t);
	gguf_free(&g);

	struct nx_lora_src src;
	err.msg[0] = 0;
	set(&st[ST_LORA], nx_lora_parse_gguf(&src, d, n, &base_model, &err), &err);
	if (st[ST_LORA].rc == 0)
		nx_lora_close(&src);
	(void)sum;
}

/* safetensors: nx_st_parse, then the PEFT loader with either config; lora's
 * message is the first config's. */
static void run_safetensors(const uint8_t *d, size_t n, struct stage *st)
{
	struct nx_st_file f;
	struct nx_err err = { { 0 } };

	for (int i = 0; i < ST_N; i++)
		st[i].rc = 1, st[i].msg[0] = 0;
	set(&st[ST_PARSE], nx_st_parse(&f, d, n, &err), &err);
	if (st[ST_PARSE].rc)
		return;
	for (size_t i = 0; i < f.n_tensors; i++)
		assert_true(f.tensors[i].end <= n - 8 - f.header_len);
	nx_st_free(&f);
	for (int c = 1; c >= 0; c--) {
		struct nx_lora_src src;
		err.msg[0] = 0;
		int rc = nx_lora_parse_peft(&src, d, n, PEFT_CONFIGS[c], strlen(PEFT_CONFIGS[c]), &base_model, &err);
		if (rc == 0) {
			size_t sz = nx_lora_size(&src);
			void *mem = sz ? aligned_alloc(64, (sz + 63) & ~(size_t)63) : NULL;
			struct nx_lora *l = malloc(sizeof(*l));
			assert_non_null(l);
			if (mem) {
				err.msg[0] = 0;
				rc = nx_lora_init(l, mem, sz, &src, &err);
			}
			free(mem);
			free(l);
			nx_lora_close(&src);
		}
		if (c == 0 || rc == 0)
			set(&st[ST_LORA], rc, &err);
		if (rc == 0)
			break;
	}
}

/* One event line from the encoder must be JSON. */
static void check_event(const char *file, const char *line, size_t len)
{
	json_error_t je;
	assert_true(len > 0 && line[len - 1] == '\n');
	json_t *j = json_loadb(line, len - 1, 0, &je);
	if (!j) {
		print_error("%s: event is not JSON (%s): %s\n", file, je.text, line);
		fail();
	}
	json_decref(j);
}

/* protocol: parse with the limits and without; the error event must be JSON.
 * Returns the first parse's code (or -1 on success) in *code. */
static void run_protocol(const char *file, const uint8_t *d, size_t n, struct stage *st, int *code)
{
	char line[2048];
	for (int i = 0; i < ST_N; i++)
		st[i].rc = 1, st[i].msg[0] = 0;
	for (int pass = 0; pass < 2; pass++) {
		struct nxp_request r;
		struct nxp_error e = { 0 };
		int rc = nxp_parse((const char *)d, n, pass ? NULL : &LIM, &r, &e);
		if (pass == 0) {
			st[ST_PARSE].rc = rc;
			snprintf(st[ST_PARSE].msg, sizeof(st[ST_PARSE].msg), "%s", rc ? e.msg : "");
			*code = rc ? (int)e.code : -1;
		}
		size_t len = rc ? nxp_enc_error(line, sizeof(line), r.id, e.code, e.msg) : nxp_enc_ok(line, sizeof(line), r.id);
		assert_true(len < sizeof(line));
		check_event(file, line, len);
		nxp_request_free(&r);
	}
}

/* tokenizer (fuzz_tokenizer.c's input format): encode or ids, stream-decode, strict UTF-8 out. */
static struct nx_tok *toks[4];

static void load_toks(void)
{
	static const char *const paths[4] = { "fuzz/data/tiny-bpe.vocab", "fuzz/data/tiny-spm.vocab",
					      "../shared/data/vocab/ggml-vocab-gpt-2.gguf",
					      "../shared/data/vocab/ggml-vocab-llama-spm.gguf" };
	if (toks[0])
		return;
	for (int i = 0; i < 4; i++) {
		struct gguf_mapped m;
		struct nx_err err;
		if (gguf_open(&m, paths[i], &err) == 0) {
			if (nx_tok_load(&toks[i], &m.g, &err))
				toks[i] = NULL;
			gguf_close(&m);
		}
		if (!toks[i] && i >= 2)
			toks[i] = toks[i - 2];
		if (!toks[i]) {
			print_error("%s: cannot load: %s\n", paths[i], err.msg);
			fail();
		}
	}
}

static void run_tokenizer(const char *file, const uint8_t *d, size_t n)
{
	if (n < 1)
		return;
	const struct nx_tok *t = toks[d[0] & 3];
	unsigned flags = (d[0] & 8 ? NX_DETOK_SPECIAL : 0) | (d[0] & 16 ? NX_DETOK_STRIP : 0);
	size_t n_ids = 0;
	int32_t *ids = malloc((n + 16) * sizeof(*ids));
	struct nx_err err = { { 0 } };
	assert_non_null(ids);
	if (d[0] & 32) {
		for (size_t i = 0; i < (n - 1) / 2; i++) {
			int16_t v;
			memcpy(&v, d + 1 + 2 * i, 2);
			if (v >= 0 && v < nx_tok_n_vocab(t))
				ids[n_ids++] = v;
		}
	} else if (nx_tok_encode(t, (const char *)d + 1, n - 1, d[0] & 4, ids, n + 16, &n_ids, &err)) {
		if (!err.msg[0]) {
			print_error("%s: encode failed without a message\n", file);
			fail();
		}
		n_ids = 0;
	}
	size_t cap = n_ids * nx_detok_bound(t) + 16, len = 0;
	char *out = malloc(cap);
	assert_non_null(out);
	assert_int_equal(nx_tok_decode(t, ids, n_ids, flags, out, cap, &len, &err), 0);
	size_t bad = 0;
	if (!fuzz_utf8_valid((const uint8_t *)out, len, &bad)) {
		print_error("%s: decoded text is not UTF-8 at byte %zu\n", file, bad);
		fail();
	}
	free(out);
	free(ids);
}

/* ------------------------------------------------------------ expectations */

/* Runs one file of target and checks it against expect/words (the seeds.tsv
 * vocabulary; NULL expect: only a success or a clean error). Returns NULL
 * when it holds, else why not (details printed). */
static const char *check_one(const char *target, const char *path, const char *expect, const char *words)
{
	size_t size;
	uint8_t *d = slurp(path, &size);
	struct stage st[ST_N];
	int code = -1;
	const char *why = NULL;

	if (!words)
		words = "";
	if (!strcmp(target, "gguf")) {
		run_gguf(d, size, st);
		expect_clean(path, st);
		if (!expect) {
			/* clean is all */
		} else if (!strcmp(expect, "ok") && (st[ST_PARSE].rc || st[ST_MODEL].rc || st[ST_TOK].rc)) {
			why = "expected parse, model and tokenizer to load";
		} else if (!strcmp(expect, "ok-parse") && st[ST_PARSE].rc) {
			why = "expected gguf_parse to succeed";
		} else if (!strcmp(expect, "binds") && (st[ST_PARSE].rc || st[ST_MODEL].rc)) {
			why = "expected the model to bind";
		} else if (!strcmp(expect, "adapter") && (st[ST_PARSE].rc || st[ST_LORA].rc)) {
			why = "expected the adapter to load";
		} else {
			int want = !strcmp(expect, "error") ? ST_PARSE : !strcmp(expect, "model") ? ST_MODEL :
				   !strcmp(expect, "tok")   ? ST_TOK :
				   !strcmp(expect, "lora")  ? ST_LORA : -1;
			if (want >= 0 && (st[want].rc != -1 || !strstr(st[want].msg, words)))
				why = "expected an error from that stage naming the words";
			else if (want > ST_PARSE && st[ST_PARSE].rc)
				why = "expected gguf_parse to succeed";
		}
		if (why)
			print_error("%s: %s: %s '%s': parse %d '%s' / model %d '%s' / tok %d '%s' / lora %d '%s'\n", path,
				    why, expect, words, st[0].rc, st[0].msg, st[1].rc, st[1].msg, st[2].rc, st[2].msg,
				    st[3].rc, st[3].msg);
	} else if (!strcmp(target, "protocol")) {
		run_protocol(path, d, size, st, &code);
		if (expect && (!strcmp(expect, "ok") ? code != -1 : (code == -1 || strcmp(nxp_code_name(code), words))))
			why = "wrong outcome";
		if (why)
			print_error("%s: expected %s %s, got %s: %s\n", path, expect, words,
				    code == -1 ? "ok" : nxp_code_name(code), st[ST_PARSE].msg);
	} else if (!strcmp(target, "safetensors")) {
		run_safetensors(d, size, st);
		expect_clean(path, st);
		if (!expect)
			; /* clean is all */
		else if (!strcmp(expect, "ok") && (st[ST_PARSE].rc || st[ST_LORA].rc))
			why = "expected the file and the adapter to load";
		else if (!strcmp(expect, "lora") &&
			 (st[ST_PARSE].rc || st[ST_LORA].rc != -1 || !strstr(st[ST_LORA].msg, words)))
			why = "expected the adapter to fail naming the words";
		else if (!strcmp(expect, "error") && (st[ST_PARSE].rc != -1 || !strstr(st[ST_PARSE].msg, words)))
			why = "expected nx_st_parse to fail naming the words";
		if (why)
			print_error("%s: %s '%s': parse %d '%s' / lora %d '%s'\n", path, why, words, st[ST_PARSE].rc,
				    st[ST_PARSE].msg, st[ST_LORA].rc, st[ST_LORA].msg);
	} else if (!strcmp(target, "tokenizer")) {
		load_toks();
		run_tokenizer(path, d, size);
	} else {
		print_error("%s: unknown target %s\n", path, target);
		why = "unknown target";
	}
	free(d);
	return why;
}

/* One row of a table (target, file, expect, words); false at the end. */
static bool next_row(FILE *f, char *line, size_t cap, char **target, char **name, char **expect, char **words)
{
	while (fgets(line, (int)cap, f)) {
		if (line[0] == '#' || line[0] == '\n')
			continue;
		line[strcspn(line, "\n")] = 0;
		*target = strtok(line, "\t");
		*name = strtok(NULL, "\t");
		*expect = strtok(NULL, "\t");
		*words = strtok(NULL, "\t");
		assert_non_null(*expect);
		return true;
	}
	return false;
}

static void test_seeds(void **state)
{
	FILE *f = fopen("fuzz/seeds.tsv", "r");
	char line[1024], *target, *name, *expect, *words;
	int n = 0, bad = 0;

	assert_non_null(f);
	load_base_model();
	while (next_row(f, line, sizeof(line), &target, &name, &expect, &words)) {
		char path[512];
		snprintf(path, sizeof(path), "fuzz/corpus/%s/%s", target, name);
		bad += check_one(target, path, expect, words) != NULL;
		n++;
	}
	fclose(f);
	if (bad)
		fail_msg("%d of %d seeds did not give what fuzz/seeds.tsv says", bad, n);
	assert_true(n > 150); /* the table is all there */
}

/* ------------------------------------------------------------ regressions */

/* Feeds every file of tests/regressions/<target>/: each must succeed or fail
 * cleanly, and give what tests/regressions/expect.tsv says when it is listed
 * there. Skips when there are none. */
static void regressions(const char *target)
{
	char dir[256];
	snprintf(dir, sizeof(dir), "tests/regressions/%s", target);
	DIR *dp = opendir(dir);
	int n = 0, bad = 0;
	struct dirent *de;

	load_base_model();
	while (dp && (de = readdir(dp))) {
		if (de->d_name[0] == '.')
			continue;
		char path[512], line[1024], *t, *name, *expect = NULL, *words = NULL;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		FILE *f = fopen("tests/regressions/expect.tsv", "r");
		bool listed = false;
		while (f && !listed && next_row(f, line, sizeof(line), &t, &name, &expect, &words))
			listed = !strcmp(t, target) && !strcmp(name, de->d_name);
		if (f)
			fclose(f);
		bad += check_one(target, path, listed ? expect : NULL, listed ? words : NULL) != NULL;
		n++;
	}
	if (dp)
		closedir(dp);
	if (bad)
		fail_msg("%d of %d regression inputs of %s did not give what tests/regressions/expect.tsv says", bad, n,
			 target);
	if (n == 0)
		skip(); /* nothing found by that fuzzer yet */
}

static void test_regressions_gguf(void **state) { regressions("gguf"); }

/* fuzz_gguf found (tests/regressions/gguf/q8_0-quantize-nan-activation): a
 * model whose weights drive activations to NaN made the reference Q8_0
 * quantizer convert out-of-range floats to int8 (undefined; on x86 the low
 * byte of the int32, e.g. 15875 -> 3). A NaN hides from amax (NaN > x is
 * false), so the values before it can exceed 127 times the scale. Now they
 * saturate and NaN becomes 0. */
static void test_q8_0_nonfinite(void **state)
{
	const struct nx_type_traits *tr = nx_type_ref(NX_Q8_0);
	struct nx_block_q8_0 b;
	float x[QK8_0] = { 5.0f, -5.0f, NAN, 0.04f }; /* amax comes out 0.04 */

	tr->quant(x, &b, QK8_0);
	assert_int_equal(b.qs[0], 127);  /* 5 / (0.04 / 127) = 15875, saturated */
	assert_int_equal(b.qs[1], -128); /* -15875, saturated */
	assert_int_equal(b.qs[2], 0);    /* NaN */
	assert_int_equal(b.qs[3], 127);
	float y[QK8_0] = { INFINITY, 1.0f, -1.0f };
	tr->quant(y, &b, QK8_0); /* amax inf: scale inf, inverse 0, inf * 0 = NaN */
	for (int j = 0; j < 3; j++)
		assert_int_equal(b.qs[j], 0);
}
static void test_regressions_tokenizer(void **state) { regressions("tokenizer"); }
static void test_regressions_protocol(void **state) { regressions("protocol"); }
static void test_regressions_safetensors(void **state) { regressions("safetensors"); }

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_seeds),
		cmocka_unit_test(test_regressions_gguf),
		cmocka_unit_test(test_q8_0_nonfinite),
		cmocka_unit_test(test_regressions_tokenizer),
		cmocka_unit_test(test_regressions_protocol),
		cmocka_unit_test(test_regressions_safetensors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
