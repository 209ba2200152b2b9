/* test_tokenizer.c - tokenizer tests: ggml's vocabulary test pairs, small
 * hand-built vocabularies (merge order, scores, special tokens, load errors)
 * and the streaming detokenizer's UTF-8 handling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "tok/tokenizer.h"

#define VOCAB_DIR "../shared/data/vocab/"

/* --------------------------------------------------- a GGUF built in memory */

struct gb {
	uint8_t *p;
	size_t n, cap;
	uint64_t n_kv;
};

static void gb_put(struct gb *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 256;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void gb_u32(struct gb *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(struct gb *b, uint64_t v) { gb_put(b, &v, 8); }

static void gb_str(struct gb *b, const char *s)
{
	gb_u64(b, strlen(s));
	gb_put(b, s, strlen(s));
}

static void gb_init(struct gb *b)
{
	memset(b, 0, sizeof(*b));
	gb_put(b, "GGUF", 4);
	gb_u32(b, 3);
	gb_u64(b, 0); /* tensors */
	gb_u64(b, 0); /* kv count, patched by gb_done */
}

static void gb_key(struct gb *b, const char *key, uint32_t type)
{
	gb_str(b, key);
	gb_u32(b, type);
	b->n_kv++;
}

static void kv_str(struct gb *b, const char *key, const char *v)
{
	gb_key(b, key, GGUF_STRING);
	gb_str(b, v);
}

static void kv_u32(struct gb *b, const char *key, uint32_t v)
{
	gb_key(b, key, GGUF_U32);
	gb_u32(b, v);
}

static void kv_bool(struct gb *b, const char *key, bool v)
{
	uint8_t x = v;
	gb_key(b, key, GGUF_BOOL);
	gb_put(b, &x, 1);
}

static void kv_strs(struct gb *b, const char *key, const char *const *v, size_t n)
{
	gb_key(b, key, GGUF_ARRAY);
	gb_u32(b, GGUF_STRING);
	gb_u64(b, n);
	for (size_t i = 0; i < n; i++)
		gb_str(b, v[i]);
}

static void kv_i32s(struct gb *b, const char *key, const int32_t *v, size_t n)
{
	gb_key(b, key, GGUF_ARRAY);
	gb_u32(b, GGUF_I32);
	gb_u64(b, n);
	gb_put(b, v, 4 * n);
}

static void kv_f32s(struct gb *b, const char *key, const float *v, size_t n)
{
	gb_key(b, key, GGUF_ARRAY);
	gb_u32(b, GGUF_F32);
	gb_u64(b, n);
	gb_put(b, v, 4 * n);
}

/* Parses the built file and loads a tokenizer from it; returns load's result. */
static int gb_load(struct gb *b, struct gguf_file *g, struct nx_tok **t, struct nx_err *err)
{
	memcpy(b->p + 16, &b->n_kv, 8);
	int rc = gguf_parse(g, b->p, b->n, err);
	assert_int_equal(rc, 0);
	rc = nx_tok_load(t, g, err);
	gguf_free(g);
	free(b->p); /* the tokenizer keeps its own copy of everything */
	b->p = NULL;
	return rc;
}

#define G_SPACE "\xC4\xA0" /* GPT-2's stand-in for ' ' (U+0120) */

/* A tiny byte-level BPE vocabulary. ranks: order of the merges array. */
static struct nx_tok *tiny_bpe(const char *const *merges, size_t n_merges, const char *pre)
{
	static const char *const toks[] = {
		"a", "b", "c", G_SPACE, "ab", "bc", "abc", G_SPACE "a", "<|x|>", "<|x|>y", "<u>", "1", "12",
		"2", "<", "|", ">", "x",
	};
	static const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 4, 1, 1, 1, 1, 1, 1, 1};
	struct gb b;
	struct gguf_file g;
	struct nx_tok *t = NULL;
	struct nx_err err = {{0}};
	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_str(&b, "tokenizer.ggml.pre", pre);
	kv_strs(&b, "tokenizer.ggml.tokens", toks, sizeof(toks) / sizeof(toks[0]));
	kv_i32s(&b, "tokenizer.ggml.token_type", types, sizeof(types) / sizeof(types[0]));
	kv_strs(&b, "tokenizer.ggml.merges", merges, n_merges);
	if (gb_load(&b, &g, &t, &err))
		fail_msg("tiny bpe: %s", err.msg);
	return t;
}

static void expect_ids(const struct nx_tok *t, const char *text, bool special, const int32_t *want, size_t n_want)
{
	int32_t out[256];
	size_t n;
	struct nx_err err;
	if (nx_tok_encode(t, text, strlen(text), special, out, 256, &n, &err))
		fail_msg("encode '%s': %s", text, err.msg);
	if (n != n_want || memcmp(out, want, n * sizeof(int32_t)) != 0) {
		char got[512] = "", exp[512] = "";
		for (size_t i = 0; i < n; i++)
			snprintf(got + strlen(got), sizeof(got) - strlen(got), " %d", out[i]);
		for (size_t i = 0; i < n_want; i++)
			snprintf(exp + strlen(exp), sizeof(exp) - strlen(exp), " %d", want[i]);
		fail_msg("encode '%s': got [%s ] want [%s ]", text, got, exp);
	}
}

#define EXPECT(t, text, special, ...)                                                        \
	do {                                                                                 \
		static const int32_t w_[] = {__VA_ARGS__};                                  \
		expect_ids(t, text, special, w_, sizeof(w_) / sizeof(w_[0]));                \
	} while (0)

/* ----------------------------------------------------------- vocab pairs */

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = 0;
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* Every .inp/.out pair of one ggml vocabulary, encoded without BOS, must match
 * exactly; decoding the ids must give the input back. */
static void run_vocab_pairs(const char *name)
{
	char path[512];
	size_t inp_len, out_len;
	snprintf(path, sizeof(path), VOCAB_DIR "%s.gguf", name);
	struct gguf_mapped m;
	struct nx_err err;
	FILE *probe = fopen(path, "rb");
	if (!probe) {
		print_message("SKIP: %s absent (../shared/data/vocab not here)\n", path);
		skip();
	}
	fclose(probe);
	if (gguf_open(&m, path, &err))
		fail_msg("%s: %s", path, err.msg);
	struct nx_tok *t;
	if (nx_tok_load(&t, &m.g, &err))
		fail_msg("%s: %s", path, err.msg);
	gguf_close(&m);

	snprintf(path, sizeof(path), VOCAB_DIR "%s.gguf.inp", name);
	char *inp = slurp(path, &inp_len);
	snprintf(path, sizeof(path), VOCAB_DIR "%s.gguf.out", name);
	char *outs = slurp(path, &out_len);
	assert_non_null(inp);
	assert_non_null(outs);

	static const char sep[] = "\n__ggml_vocab_test__\n";
	char *p = inp, *o = outs;
	int n_pairs = 0;
	int32_t *ids = malloc(65536 * sizeof(int32_t));
	char *text = malloc(1 << 20);
	assert_non_null(ids);
	assert_non_null(text);
	for (;;) {
		char *end = strstr(p, sep);
		if (!end)
			break;
		size_t len = (size_t)(end - p);
		char *eol = strchr(o, '\n');
		assert_non_null(eol);
		*eol = 0;

		size_t n;
		if (nx_tok_encode(t, p, len, false, ids, 65536, &n, &err))
			fail_msg("%s pair %d: %s", name, n_pairs, err.msg);
		char got[16384] = "";
		for (size_t i = 0; i < n; i++)
			snprintf(got + strlen(got), sizeof(got) - strlen(got), " %d", ids[i]);
		if (strcmp(got, o) != 0)
			fail_msg("%s pair %d '%.*s':\n got [%s]\nwant [%s]", name, n_pairs, (int)len, p, got, o);

		size_t tl;
		if (nx_tok_decode(t, ids, n, NX_DETOK_STRIP, text, 1 << 20, &tl, &err))
			fail_msg("%s pair %d decode: %s", name, n_pairs, err.msg);
		if (tl != len || memcmp(text, p, len) != 0)
			fail_msg("%s pair %d: decode gives '%.*s' for '%.*s'", name, n_pairs, (int)tl, text, (int)len, p);
		n_pairs++;
		p = end + strlen(sep);
		o = eol + 1;
	}
	print_message("%s: %d pairs match\n", name, n_pairs);
	assert_true(n_pairs >= 40);
	free(ids);
	free(text);
	free(inp);
	free(outs);
	nx_tok_free(t);
}

static void test_vocab_gpt2(void **state) { run_vocab_pairs("ggml-vocab-gpt-2"); }
static void test_vocab_llama_spm(void **state) { run_vocab_pairs("ggml-vocab-llama-spm"); }
static void test_vocab_llama_bpe(void **state) { run_vocab_pairs("ggml-vocab-llama-bpe"); }
static void test_vocab_qwen2(void **state) { run_vocab_pairs("ggml-vocab-qwen2"); }

/* ----------------------------------------------------------- BPE merging */

enum { A, B, C, SP, AB, BC, ABC, SPA, X, XY, U, D1, D12, D2, LT, BAR, GT, LX };

static void test_bpe_merge_rank(void **state)
{
	/* "a b" before "b c": abc -> ab c -> abc */
	static const char *const m1[] = {"a b", "ab c", "b c"};
	struct nx_tok *t = tiny_bpe(m1, 3, "gpt-2");
	EXPECT(t, "abc", false, ABC);
	EXPECT(t, "abc ab", false, ABC, SP, AB); /* " ab": no Ġ+a merge listed, so Ġ ab */
	EXPECT(t, "cab", false, C, AB);
	nx_tok_free(t);

	/* "b c" first: abc -> a bc, and "ab c" never gets its chance */
	static const char *const m2[] = {"b c", "a b", "ab c"};
	t = tiny_bpe(m2, 3, "gpt-2");
	EXPECT(t, "abc", false, A, BC);
	nx_tok_free(t);

	static const char *const m3[] = {G_SPACE " a", "a b"};
	t = tiny_bpe(m3, 2, "gpt-2");
	EXPECT(t, " ab", false, SPA, B);
	EXPECT(t, "abab", false, AB, AB);
	nx_tok_free(t);
}

static void test_bpe_pretokenizer(void **state)
{
	static const char *const m[] = {"1 2", "a b"};
	/* gpt-2 keeps a digit run together, smollm splits digits one by one */
	struct nx_tok *t = tiny_bpe(m, 2, "gpt-2");
	EXPECT(t, "12", false, D12);
	EXPECT(t, "ab12", false, AB, D12);
	assert_string_equal(nx_tok_pre_name(t), "gpt-2");
	nx_tok_free(t);
	t = tiny_bpe(m, 2, "smollm");
	EXPECT(t, "12", false, D1, D2);
	nx_tok_free(t);
	/* every supported name loads, so every regex compiles under PCRE2 */
	static const char *const names[] = {
		"default", "gpt-2", "phi-2", "mpt", "olmo", "llama3", "llama-bpe", "llama-v3", "dbrx", "smaug-bpe",
		"chatglm-bpe", "smollm", "starcoder", "refact", "command-r", "qwen2", "deepseek-r1-qwen", "stablelm2",
		"deepseek-coder", "falcon", "bloom", "poro-chat", "gpt-4o", "llama4", "tekken",
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		t = tiny_bpe(m, 2, names[i]);
		EXPECT(t, "ab", false, AB);
		assert_string_equal(nx_tok_pre_name(t), names[i]);
		nx_tok_free(t);
	}
	/* llama3: a whole pre-token that is a token skips the merges (none listed for abc) */
	static const char *const m0[] = {"a b"};
	t = tiny_bpe(m0, 1, "llama-bpe");
	EXPECT(t, "abc", false, ABC);
	assert_true(nx_tok_add_bos(t) == false); /* no BOS in this vocabulary: default cannot apply */
	nx_tok_free(t);
}

/* ------------------------------------------------------- special tokens */

static void test_special_split(void **state)
{
	static const char *const m[] = {"a b", "ab c"};
	struct nx_tok *t = tiny_bpe(m, 2, "gpt-2");
	/* control tokens only with parse_special; leftmost-longest: "<|x|>y" beats "<|x|>" */
	EXPECT(t, "a<|x|>b", true, A, X, B);
	EXPECT(t, "a<|x|>yb", true, A, XY, B);
	EXPECT(t, "<|x|><|x|>", true, X, X);
	/* user-defined tokens are split out either way */
	EXPECT(t, "a<u>b", false, A, U, B);
	EXPECT(t, "a<u>b", true, A, U, B);
	assert_true(nx_tok_is_control(t, X));
	assert_false(nx_tok_is_control(t, U));
	assert_int_equal(nx_tok_type(t, U), NX_TT_USER);
	assert_int_equal(nx_tok_find(t, "<|x|>", 5), X);
	assert_int_equal(nx_tok_find(t, "nope", 4), -1);

	/* without parse_special the control text is plain text */
	EXPECT(t, "<|x|>", false, LT, BAR, LX, BAR, GT);

	/* pieces: control tokens are empty unless asked for, user-defined are their text */
	size_t len;
	const char *p = nx_tok_piece(t, X, false, &len);
	assert_int_equal(len, 0);
	p = nx_tok_piece(t, X, true, &len);
	assert_int_equal(len, 5);
	assert_memory_equal(p, "<|x|>", 5);
	p = nx_tok_piece(t, U, false, &len);
	assert_int_equal(len, 3);
	p = nx_tok_piece(t, SPA, false, &len);
	assert_int_equal(len, 2);
	assert_memory_equal(p, " a", 2);
	assert_null(nx_tok_piece(t, 999, false, &len));
	nx_tok_free(t);
}

/* --------------------------------------------------------------- SPM */

#define SPM_SP "\xE2\x96\x81" /* U+2581 */

/* <unk> <s> </s>, 256 byte tokens, then a few pieces with scores. */
static struct nx_tok *tiny_spm(bool *with_prefix)
{
	static const char *words[] = {SPM_SP, "h", "e", "l", "o", "he", "ll", "hell", "hello", SPM_SP "hello",
				      "lo", "<ctl>", "x", "y", "z", "xy", "yz"};
	static const float wscore[] = {-10, -10, -10, -10, -10, -1, -2, -3, -4, -5, -6, 0, -10, -10, -10, -3, -2};
	enum { NW = sizeof(words) / sizeof(words[0]) };
	const char *toks[3 + 256 + NW];
	char hex[256][8];
	int32_t types[3 + 256 + NW];
	float scores[3 + 256 + NW];
	size_t n = 0;
	toks[n] = "<unk>", types[n] = 2, scores[n++] = 0;
	toks[n] = "<s>", types[n] = 3, scores[n++] = 0;
	toks[n] = "</s>", types[n] = 3, scores[n++] = 0;
	for (int i = 0; i < 256; i++) {
		snprintf(hex[i], sizeof(hex[i]), "<0x%02X>", i);
		toks[n] = hex[i], types[n] = 6, scores[n++] = 0;
	}
	for (int i = 0; i < NW; i++)
		toks[n] = words[i], types[n] = i == 11 ? 3 : 1, scores[n++] = wscore[i];
	struct gb b;
	struct gguf_file g;
	struct nx_tok *t = NULL;
	struct nx_err err = {{0}};
	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, n);
	kv_i32s(&b, "tokenizer.ggml.token_type", types, n);
	kv_f32s(&b, "tokenizer.ggml.scores", scores, n);
	if (with_prefix)
		kv_bool(&b, "tokenizer.ggml.add_space_prefix", *with_prefix);
	if (gb_load(&b, &g, &t, &err))
		fail_msg("tiny spm: %s", err.msg);
	return t;
}

#define W(i) (3 + 256 + (i)) /* id of words[i] */
#define BYTE(b) (3 + (b))

static void test_spm_encode(void **state)
{
	struct nx_tok *t = tiny_spm(NULL);
	assert_true(nx_tok_add_bos(t));
	assert_true(nx_tok_add_space_prefix(t));
	assert_int_equal(nx_tok_bos(t), 1);
	assert_int_equal(nx_tok_eos(t), 2);
	assert_true(nx_tok_is_eog(t, 2));
	/* ▁ h e l l o: he, ll, hell, hello, ▁hello; "lo" (-6) never gets its turn */
	EXPECT(t, "hello", false, W(9));
	/* "hel" is no token: ▁ he l */
	EXPECT(t, "hel", false, W(0), W(5), W(3));
	/* best score first, not leftmost: yz (-2) before xy (-3) */
	EXPECT(t, "xyz", false, W(0), W(12), W(16));
	/* unknown characters fall back to bytes: é = C3 A9 */
	EXPECT(t, "h\xC3\xA9", false, W(0), W(1), BYTE(0xC3), BYTE(0xA9));
	/* typed "<0x41>" and "<s>" text never merge into byte or control tokens */
	EXPECT(t, "<0x41><s>", false, W(0), BYTE('<'), BYTE('0'), W(12), BYTE('4'), BYTE('1'), BYTE('>'),
	       BYTE('<'), BYTE('s'), BYTE('>'));
	/* a special token is followed by a fresh space prefix */
	EXPECT(t, "<ctl>hello", true, W(11), W(9));
	nx_tok_free(t);

	bool no = false;
	t = tiny_spm(&no);
	assert_false(nx_tok_add_space_prefix(t));
	EXPECT(t, "hello", false, W(8));
	nx_tok_free(t);
}

/* ---------------------------------------------------------- load errors */

static void expect_load_error(struct gb *b, const char *needle)
{
	struct gguf_file g;
	struct nx_tok *t = (struct nx_tok *)1;
	struct nx_err err = {{0}};
	assert_int_equal(gb_load(b, &g, &t, &err), -1);
	assert_null(t);
	if (!strstr(err.msg, needle))
		fail_msg("error '%s' does not name '%s'", err.msg, needle);
}

static void test_load_errors(void **state)
{
	static const char *const toks[] = {"a", "b", "ab"};
	static const char *const dup[] = {"a", "b", "a"};
	static const char *const merges[] = {"a b"};
	static const int32_t short_types[] = {1, 1};
	struct gb b;

	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "bert-ish");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
	expect_load_error(&b, "'bert-ish'");

	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_str(&b, "tokenizer.ggml.pre", "no-such-pre");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
	kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
	expect_load_error(&b, "'no-such-pre'");

	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
	expect_load_error(&b, "tokenizer.ggml.merges");

	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_strs(&b, "tokenizer.ggml.tokens", dup, 3);
	kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
	expect_load_error(&b, "same text");

	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
	kv_i32s(&b, "tokenizer.ggml.token_type", short_types, 2);
	expect_load_error(&b, "tokenizer.ggml.token_type");

	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "llama");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
	kv_u32(&b, "tokenizer.ggml.eos_token_id", 1);
	kv_f32s(&b, "tokenizer.ggml.scores", (const float[]){0, 0}, 2);
	expect_load_error(&b, "tokenizer.ggml.scores");

	/* add_bos with no BOS anywhere (gpt2 has no default) */
	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
	kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
	kv_bool(&b, "tokenizer.ggml.add_bos_token", true);
	expect_load_error(&b, "BOS");

	gb_init(&b);
	expect_load_error(&b, "tokenizer.ggml.model");

	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_u32(&b, "tokenizer.ggml.tokens", 3);
	expect_load_error(&b, "tokenizer.ggml.tokens");
}

static void test_eot_detection(void **state)
{
	/* <|im_end|> typed normal: found as EOT, made control, ends generation */
	static const char *const toks[] = {"a", "b", "ab", "<|endoftext|>", "<|im_end|>"};
	static const char *const merges[] = {"a b"};
	struct gb b;
	struct gguf_file g;
	struct nx_tok *t;
	struct nx_err err;
	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
	kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
	kv_u32(&b, "tokenizer.ggml.eos_token_id", 3);
	kv_u32(&b, "tokenizer.ggml.bos_token_id", 99); /* out of range: ignored */
	assert_int_equal(gb_load(&b, &g, &t, &err), 0);
	assert_int_equal(nx_tok_eos(t), 3);
	assert_int_equal(nx_tok_bos(t), -1);
	assert_int_equal(nx_tok_eot(t), 4);
	assert_true(nx_tok_is_eog(t, 3));
	assert_true(nx_tok_is_eog(t, 4));
	assert_false(nx_tok_is_eog(t, 2));
	assert_false(nx_tok_is_eog(t, -1));
	assert_true(nx_tok_is_control(t, 4));
	EXPECT(t, "ab<|im_end|>", true, 2, 4);
	nx_tok_free(t);

	/* an explicit eot_token_id wins over detection */
	gb_init(&b);
	kv_str(&b, "tokenizer.ggml.model", "gpt2");
	kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
	kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
	kv_u32(&b, "tokenizer.ggml.eot_token_id", 3);
	assert_int_equal(gb_load(&b, &g, &t, &err), 0);
	assert_int_equal(nx_tok_eot(t), 3);
	nx_tok_free(t);
}

/* ---------------------------------------------------------- detokenizer */

static void push(struct nx_detok *d, int32_t id, const char *want, size_t want_len)
{
	char out[4096];
	size_t n;
	struct nx_err err;
	assert_true(nx_detok_bound(d->tok) <= sizeof(out));
	if (nx_detok_push(d, id, out, sizeof(out), &n, &err))
		fail_msg("push %d: %s", id, err.msg);
	if (n != want_len || memcmp(out, want, n) != 0)
		fail_msg("push %d: got '%.*s' (%zu bytes), want '%.*s' (%zu bytes)", id, (int)n, out, n, (int)want_len,
			 want, want_len);
}

#define PUSH(d, id, lit) push(d, id, lit, sizeof(lit) - 1)
#define FFFD "\xEF\xBF\xBD"

static void test_detok_utf8(void **state)
{
	struct nx_tok *t = tiny_spm(NULL);
	struct nx_detok d;
	char out[8];

	/* 中 = E4 B8 AD split over three byte tokens: nothing until it is whole */
	nx_detok_init(&d, t, 0);
	PUSH(&d, BYTE(0xE4), "");
	PUSH(&d, BYTE(0xB8), "");
	PUSH(&d, BYTE(0xAD), "\xE4\xB8\xAD");
	/* 🙂 = F0 9F 99 82, the last byte arriving with a text token */
	PUSH(&d, BYTE(0xF0), "");
	PUSH(&d, BYTE(0x9F), "");
	PUSH(&d, BYTE(0x99), "");
	PUSH(&d, BYTE(0x82), "\xF0\x9F\x99\x82");
	assert_int_equal(nx_detok_flush(&d, out, sizeof(out)), 0);

	/* a sequence cut short by ASCII: U+FFFD as soon as that is known, then the byte */
	nx_detok_init(&d, t, 0);
	PUSH(&d, BYTE(0xE4), "");
	PUSH(&d, BYTE(0x41), FFFD "A");
	/* bytes that never start a sequence */
	PUSH(&d, BYTE(0xFF), FFFD);
	PUSH(&d, BYTE(0x80), FFFD);
	PUSH(&d, BYTE(0xC0), FFFD);
	/* a surrogate (ED A0 80) is three invalid subparts, as Python's "replace" says */
	PUSH(&d, BYTE(0xED), "");
	PUSH(&d, BYTE(0xA0), FFFD FFFD);
	PUSH(&d, BYTE(0x80), FFFD);
	/* overlong E0 80: invalid at the second byte */
	PUSH(&d, BYTE(0xE0), "");
	PUSH(&d, BYTE(0x80), FFFD FFFD);
	/* unfinished at the end: flush gives one U+FFFD for the whole prefix */
	PUSH(&d, BYTE(0xF0), "");
	PUSH(&d, BYTE(0x9F), "");
	assert_int_equal(nx_detok_flush(&d, out, sizeof(out)), 3);
	assert_memory_equal(out, FFFD, 3);
	assert_int_equal(nx_detok_flush(&d, out, sizeof(out)), 0);

	/* a multi-byte sequence interrupted by a new lead byte */
	nx_detok_init(&d, t, 0);
	PUSH(&d, BYTE(0xE4), "");
	PUSH(&d, BYTE(0xE4), FFFD);
	PUSH(&d, BYTE(0xB8), "");
	PUSH(&d, BYTE(0xAD), "\xE4\xB8\xAD");
	nx_tok_free(t);
}

static void test_detok_strip_and_special(void **state)
{
	struct nx_tok *t = tiny_spm(NULL);
	struct nx_detok d;

	/* SPM: the space prefix the encoder added is dropped once, at the start */
	nx_detok_init(&d, t, NX_DETOK_STRIP);
	PUSH(&d, 1, ""); /* <s>: control, not rendered, does not count as the start */
	PUSH(&d, W(9), "hello");
	PUSH(&d, W(9), " hello");
	nx_detok_init(&d, t, 0); /* a continuation keeps its space */
	PUSH(&d, W(9), " hello");
	nx_detok_init(&d, t, NX_DETOK_SPECIAL | NX_DETOK_STRIP);
	PUSH(&d, 1, "<s>");
	PUSH(&d, W(9), "hello");

	/* errors: id out of range, buffer below the bound */
	char small[4];
	size_t n;
	struct nx_err err;
	nx_detok_init(&d, t, 0);
	assert_int_equal(nx_detok_push(&d, -1, small, sizeof(small), &n, &err), -1);
	char big[4096];
	assert_int_equal(nx_detok_push(&d, nx_tok_n_vocab(t), big, sizeof(big), &n, &err), -1);
	assert_non_null(strstr(err.msg, "outside the vocabulary"));
	assert_int_equal(nx_detok_push(&d, W(9), small, sizeof(small), &n, &err), -1);

	/* whole-sequence decode, and its too-small buffer */
	int32_t ids[] = {W(9), W(0), BYTE(0xE4), BYTE(0xB8), BYTE(0xAD), BYTE(0xE4)};
	char text[64];
	assert_int_equal(nx_tok_decode(t, ids, 6, NX_DETOK_STRIP, text, sizeof(text), &n, &err), 0);
	assert_int_equal(n, 5 + 1 + 3 + 3);
	assert_memory_equal(text, "hello \xE4\xB8\xAD" FFFD, n);
	assert_int_equal(nx_tok_decode(t, ids, 6, NX_DETOK_STRIP, text, 7, &n, &err), -1);
	assert_int_equal(n, 12);
	assert_memory_equal(text, "hello ", 6);
	nx_tok_free(t);
}

/* ----------------------------------------------------- capacity and speed */

static void test_encode_cap(void **state)
{
	static const char *const m[] = {"a b", "ab c"};
	struct nx_tok *t = tiny_bpe(m, 2, "gpt-2");
	int32_t out[4] = {-7, -7, -7, -7};
	size_t n;
	struct nx_err err;
	/* "abc abc abc" needs 5 tokens: abc Ġ abc Ġ abc... (Ġa merges absent) */
	assert_int_equal(nx_tok_encode(t, "abc abc abc", 11, false, out, 2, &n, &err), -1);
	assert_int_equal(n, 5);
	assert_int_equal(out[0], ABC);
	assert_int_equal(out[1], SP);
	assert_int_equal(out[2], -7); /* nothing written past cap */
	assert_non_null(strstr(err.msg, "5 tokens"));
	assert_int_equal(nx_tok_encode(t, "", 0, false, out, 0, &n, &err), 0);
	assert_int_equal(n, 0);
	/* refused before a byte is read */
	assert_int_equal(nx_tok_encode(t, "x", (size_t)NX_TOK_MAX_TEXT + 1, false, out, 4, &n, &err), -1);
	assert_non_null(strstr(err.msg, "limit"));
	nx_tok_free(t);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One 256 KiB "word" must not take quadratic time (BPE per piece, SPM whole text). */
static void test_long_input_fast(void **state)
{
	size_t len = 256 * 1024;
	char *text = malloc(len);
	int32_t *out = malloc(len * sizeof(int32_t));
	assert_non_null(text);
	assert_non_null(out);
	for (size_t i = 0; i < len; i++)
		text[i] = "abc"[i % 3];
	static const char *const m[] = {"a b", "ab c"};
	struct nx_tok *t = tiny_bpe(m, 2, "gpt-2");
	size_t n;
	struct nx_err err;
	double t0 = now();
	assert_int_equal(nx_tok_encode(t, text, len, false, out, len, &n, &err), 0);
	double dt_bpe = now() - t0;
	assert_true(n > len / 3 - 2 && n <= len / 3 + 1);
	nx_tok_free(t);

	for (size_t i = 0; i < len; i++)
		text[i] = "hello "[i % 6];
	t = tiny_spm(NULL);
	t0 = now();
	assert_int_equal(nx_tok_encode(t, text, len, false, out, len, &n, &err), 0);
	double dt_spm = now() - t0;
	nx_tok_free(t);
	print_message("256 KiB: bpe %.3f s, spm %.3f s\n", dt_bpe, dt_spm);
	assert_true(dt_bpe < 2.0);
	assert_true(dt_spm < 2.0);
	free(text);
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vocab_gpt2),
		cmocka_unit_test(test_vocab_llama_spm),
		cmocka_unit_test(test_vocab_llama_bpe),
		cmocka_unit_test(test_vocab_qwen2),
		cmocka_unit_test(test_bpe_merge_rank),
		cmocka_unit_test(test_bpe_pretokenizer),
		cmocka_unit_test(test_special_split),
		cmocka_unit_test(test_spm_encode),
		cmocka_unit_test(test_load_errors),
		cmocka_unit_test(test_eot_detection),
		cmocka_unit_test(test_detok_utf8),
		cmocka_unit_test(test_detok_strip_and_special),
		cmocka_unit_test(test_encode_cap),
		cmocka_unit_test(test_long_input_fast),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
