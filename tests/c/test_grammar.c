/* test_grammar.c - the GBNF compiler, the stack matcher, the trie-walk token mask (against a token-by-token check) and the JSON-schema compiler (exact ranges, refusals). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample/grammar.h"
#include "sample/sampler.h"

#include <math.h>

/* --- a vocabulary: every byte, some longer pieces, and an end token ------- */

static const char *const extra[] = {
	"{\"", "\":", "\",", "\"}", "true", "false", "null", "  ", "\n  ", "12", "345", "-1", ".5", "e+", "ab", "abc",
	"bcd", "name", "\"name\"", "é", "\xC3", "\xA9", "日本", "\xE6\x97", "\xA5", "x\"", "\\n", "\\u00", "\\ud83d",
	"}", "]", "[{", "}]", "},{", ", ", ": ", "0000", "999", "\"a\"", "\"b\"",
};
#define N_EXTRA ((int)(sizeof(extra) / sizeof(extra[0])))
#define N_VOCAB (256 + N_EXTRA + 2)
#define EOS_ID (256 + N_EXTRA)
#define CTRL_ID (256 + N_EXTRA + 1) /* a control token: no piece */

static char bytes[256];
static const char *pieces[N_VOCAB];
static size_t lens[N_VOCAB];
static bool eog[N_VOCAB];
static struct nx_vocab_trie *trie;

static int setup_vocab(void **state)
{
	for (int i = 0; i < 256; i++) {
		bytes[i] = (char)i;
		pieces[i] = &bytes[i];
		lens[i] = 1;
	}
	for (int i = 0; i < N_EXTRA; i++) {
		pieces[256 + i] = extra[i];
		lens[256 + i] = strlen(extra[i]);
	}
	eog[EOS_ID] = true;
	struct nx_err err = { { 0 } };
	if (nx_vocab_trie_from_pieces(N_VOCAB, pieces, lens, eog, &trie, &err))
		fail_msg("trie: %s", err.msg);
	return 0;
}

static int teardown_vocab(void **state)
{
	nx_vocab_trie_free(trie);
	return 0;
}

static struct nx_gmatch *matcher_of(const char *gbnf)
{
	struct nx_grammar *g;
	struct nx_gmatch *m;
	struct nx_err err = { { 0 } };
	if (nx_grammar_compile(gbnf, strlen(gbnf), &g, &err))
		fail_msg("compile: %s\n%s", err.msg, gbnf);
	if (nx_gmatch_new(g, trie, &m, &err))
		fail_msg("matcher: %s", err.msg);
	return m;
}

static char *schema_gbnf(const char *schema)
{
	char *gbnf = NULL;
	struct nx_err err = { { 0 } };
	if (nx_schema_to_gbnf(schema, strlen(schema), &gbnf, &err))
		fail_msg("schema %s: %s", schema, err.msg);
	return gbnf;
}

/* Whether text is a complete document of the grammar. */
static bool full(const char *gbnf, const char *text, size_t len)
{
	struct nx_gmatch *m = matcher_of(gbnf);
	bool ok = nx_gmatch_accept_bytes(m, text, len) == 0 && nx_gmatch_accepting(m);
	nx_gmatch_free(m);
	return ok;
}

static bool fulls(const char *gbnf, const char *text)
{
	return full(gbnf, text, strlen(text));
}

/* Whether text is a prefix some document continues. */
static bool prefix(const char *gbnf, const char *text)
{
	struct nx_gmatch *m = matcher_of(gbnf);
	bool ok = nx_gmatch_accept_bytes(m, text, strlen(text)) == 0;
	nx_gmatch_free(m);
	return ok;
}

static void compile_fails(const char *gbnf, const char *needle)
{
	struct nx_grammar *g = NULL;
	struct nx_err err = { { 0 } };
	if (nx_grammar_compile(gbnf, strlen(gbnf), &g, &err) == 0) {
		nx_grammar_free(g);
		fail_msg("compiled, but should fail naming '%s':\n%s", needle, gbnf);
	}
	if (!strstr(err.msg, needle))
		fail_msg("error '%s' does not name '%s'", err.msg, needle);
}

static void schema_fails(const char *schema, const char *needle)
{
	char *gbnf = NULL;
	struct nx_err err = { { 0 } };
	if (nx_schema_to_gbnf(schema, strlen(schema), &gbnf, &err) == 0) {
		free(gbnf);
		fail_msg("schema compiled, but should fail naming '%s': %s", needle, schema);
	}
	if (!strstr(err.msg, needle))
		fail_msg("error '%s' does not name '%s'", err.msg, needle);
}

/* --- GBNF ----------------------------------------------------------------- */

static void test_gbnf_constructs(void **state)
{
	const char *g = "root ::= greet ( \" \" name )? \"!\"{1,3}\n"
			"greet ::= \"hi\" | \"hello\"  # a comment\n"
			"name ::= [A-Z] [a-z]* | \"you\"\n";
	assert_true(fulls(g, "hi!"));
	assert_true(fulls(g, "hello Bob!!!"));
	assert_true(fulls(g, "hi you!!"));
	assert_false(fulls(g, "hi!!!!"));
	assert_false(fulls(g, "hi bob!"));
	assert_false(fulls(g, "hello"));
	assert_true(prefix(g, "hello B"));
	assert_false(prefix(g, "hex"));

	const char *r = "root ::= \"a\"{2} \"b\"{1,} \"c\"{,2} \"d\"{0,}\n";
	assert_true(fulls(r, "aab"));
	assert_true(fulls(r, "aabbbccddd"));
	assert_false(fulls(r, "ab"));
	assert_false(fulls(r, "aabccc"));

	/* a multi-character literal repeated as a whole */
	const char *lit = "root ::= \"ab\"+ \"c\"\n";
	assert_true(fulls(lit, "ababc"));
	assert_false(fulls(lit, "abbc"));

	/* classes: negation, escapes, any character, multi-line groups */
	const char *cl = "root ::= [^\"\\\\\\n] . [\\x41-\\x43\\u00e9] (\n  \"x\" |\n  \"y\"\n)\n";
	assert_true(fulls(cl, "q\"Ax"));
	assert_true(fulls(cl, "é\xE6\x97\xA5\xC3\xA9y"));
	assert_false(fulls(cl, "\"aAx"));
	assert_false(fulls(cl, "qqDx"));

	/* an empty negated class is any character (a fuzzer's find: it once read a NULL range list) */
	assert_true(fulls("root ::= [^]+\n", "a\xC3\xA9"));
}

static void test_gbnf_utf8(void **state)
{
	const char *g = "root ::= [α-ω]+\n";
	assert_true(fulls(g, "αβγ"));
	assert_false(fulls(g, "αa"));
	/* a cut sequence is a prefix only when the class can complete it */
	assert_true(prefix(g, "\xCE"));
	assert_false(prefix(g, "\xC3"));
	assert_false(prefix(g, "\xCE\x41"));
	/* invalid UTF-8 never matches, even under a negated class */
	const char *any = "root ::= [^a]*\n";
	assert_false(prefix(any, "\xC0\x80"));
	assert_false(prefix(any, "\xED\xA0\x80")); /* a surrogate */
	assert_true(prefix(any, "\xF0\x9F\x98\x80"));
}

static void test_gbnf_refusals(void **state)
{
	compile_fails("root ::= foo\n", "'foo' is used");
	compile_fails("start ::= \"a\"\n", "no rule 'root'");
	compile_fails("root ::= root \"a\" | \"b\"\n", "left-recursive");
	compile_fails("root ::= x\nx ::= \"b\"? root \"a\"\n", "left-recursive");
	compile_fails("root ::= <[1000]>\n", "token references");
	compile_fails("root ::= \"\\q\"\n", "unknown escape");
	compile_fails("root ::= \"abc\n", "unterminated literal");
	compile_fails("root ::= []\n", "empty character class");
	compile_fails("root ::= \"a\"{3,2}\n", "max below min");
	compile_fails("root ::= \"a\"{10001}\n", "repetition count");
	compile_fails("root ::= ( \"a\"\n", "expected ')'");
	compile_fails("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice");
	compile_fails("root ::= * \"a\"\n", "nothing before it");
	compile_fails("root ::= \"a\" )\n", "unmatched ')'");
}

/* --- the mask against a token-by-token check -------------------------------- */

static void check_masks(const char *gbnf, const char *const *texts, int n_texts)
{
	for (int k = 0; k < n_texts; k++) {
		const char *pre = texts[k];
		struct nx_gmatch *m = matcher_of(gbnf);
		if (nx_gmatch_accept_bytes(m, pre, strlen(pre)))
			fail_msg("prefix '%s' rejected", pre);
		int n_allowed = 0, n_brute = 0;
		struct nx_err err = { { 0 } };
		const uint64_t *mask = nx_gmatch_mask(m, &n_allowed, &err);
		assert_non_null(mask);
		for (int id = 0; id < N_VOCAB; id++) {
			struct nx_gmatch *b = matcher_of(gbnf);
			assert_int_equal(nx_gmatch_accept_bytes(b, pre, strlen(pre)), 0);
			bool ok = nx_gmatch_accept_token(b, id) == 0;
			nx_gmatch_free(b);
			bool in_mask = (mask[id >> 6] >> (id & 63)) & 1;
			if (ok != in_mask)
				fail_msg("after '%s': token %d (%.*s) allowed %d, mask %d", pre, id, (int)lens[id],
					 pieces[id] ? pieces[id] : "", ok, in_mask);
			n_brute += ok;
		}
		assert_int_equal(n_allowed, n_brute);
		/* the same mask again, from the cache */
		struct nx_gmatch_stats st;
		nx_gmatch_mask(m, &n_allowed, &err);
		nx_gmatch_stats(m, &st);
		assert_int_equal(st.mask_hits, 1);
		nx_gmatch_free(m);
	}
}

static void test_mask_matches_tokens(void **state)
{
	const char *const json_pre[] = { "", "{", "{\"", "{\"a", "{\"a\":", "{\"a\": [1", "{\"a\": [1, 2.", "[\"\xC3",
					 "[\"\\", "[\"\\u", "[\"\\ud", "\"x\"", "{\"a\": tr", "[1, {} " };
	check_masks(nx_grammar_json_gbnf(), json_pre, (int)(sizeof(json_pre) / sizeof(json_pre[0])));
	const char *const g_pre[] = { "", "a", "ab", "abc", "abcb" };
	check_masks("root ::= \"a\" ( \"bc\" | \"b\" [a-d]* ) \"!\"?\n", g_pre, 5);
}

static void test_eos_only_when_complete(void **state)
{
	struct nx_gmatch *m = matcher_of("root ::= \"ab\" \"c\"?\n");
	int n;
	struct nx_err err = { { 0 } };
	const uint64_t *mask = nx_gmatch_mask(m, &n, &err);
	assert_false((mask[EOS_ID >> 6] >> (EOS_ID & 63)) & 1);
	assert_int_equal(nx_gmatch_accept_token(m, EOS_ID), -1);
	assert_int_equal(nx_gmatch_accept_token(m, CTRL_ID), -1);
	assert_int_equal(nx_gmatch_accept_token(m, 256 + 14), 0); /* "ab" */
	assert_true(nx_gmatch_accepting(m));
	mask = nx_gmatch_mask(m, &n, &err);
	assert_true((mask[EOS_ID >> 6] >> (EOS_ID & 63)) & 1);
	assert_true((mask['c' >> 6] >> ('c' & 63)) & 1);
	assert_int_equal(n, 2);
	assert_int_equal(nx_gmatch_accept_token(m, 'c'), 0);
	mask = nx_gmatch_mask(m, &n, &err);
	assert_int_equal(n, 1); /* only the end */
	nx_gmatch_free(m);

	/* a draft checked without moving: "ab" "c" <end> "x" -> 3 allowed, then the end stops the count */
	m = matcher_of("root ::= \"ab\" \"c\"?\n");
	const int32_t draft[] = { 256 + 14, 'c', EOS_ID, 'x' };
	assert_int_equal(nx_gmatch_peek_tokens(m, draft, 4), 3);
	const int32_t bad[] = { 'a', 'x' };
	assert_int_equal(nx_gmatch_peek_tokens(m, bad, 2), 1);
	assert_false(nx_gmatch_accepting(m)); /* unmoved */
	assert_int_equal(nx_gmatch_accept_token(m, 'a'), 0);
	nx_gmatch_free(m);
}

/* --- JSON --------------------------------------------------------------------- */

static void test_json_any(void **state)
{
	const char *g = nx_grammar_json_gbnf();
	const char *ok[] = { "{}", "[]", "0", "-0.5e+10", "\"a\\u00e9\\n\"", "{\"a\": [1, true, null, {\"b\": \"c\"}]}",
			     "[\n  1,\n  2\n]", "\"日本\"", "\"\\u0001\\u0010\\u0100\\u1000\\uFFFF\\ue000\"" };
	/* a lone surrogate and U+0000 are JSON, but jansson refuses them (a forced tool call would not be read) */
	const char *bad[] = { "{", "01", "[1,]", "{\"a\" 1}", "\"\\x\"", "\"a\nb\"", "{'a': 1}", "tru", "1.", "\"\\ud83d\"",
			      "\"\\u0000\"", "{\"z\":\"\\u0000e9\"}", "[1] x" };
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!fulls(g, ok[i]))
			fail_msg("rejected %s", ok[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (fulls(g, bad[i]))
			fail_msg("accepted %s", bad[i]);
}

/* --- JSON schema ----------------------------------------------------------------- */

static void test_schema_integer_ranges_exact(void **state)
{
	const struct { const char *schema; long lo, hi; } cases[] = {
		{ "{\"type\":\"integer\",\"minimum\":-15,\"maximum\":123}", -15, 123 },
		{ "{\"type\":\"integer\",\"minimum\":7,\"maximum\":7}", 7, 7 },
		{ "{\"type\":\"integer\",\"minimum\":0,\"maximum\":1000}", 0, 1000 },
		{ "{\"type\":\"integer\",\"exclusiveMinimum\":-101,\"exclusiveMaximum\":-9}", -100, -10 },
		{ "{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":99.5}", 2, 99 },
		{ "{\"type\":\"integer\",\"minimum\":19}", 19, 100000 },
		{ "{\"type\":\"integer\",\"maximum\":-3}", -100000, -3 },
		{ "{\"type\":\"integer\",\"minimum\":190,\"maximum\":2099}", 190, 2099 },
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		char *g = schema_gbnf(cases[k].schema);
		for (long v = -2500; v <= 2500; v++) {
			char t[32];
			snprintf(t, sizeof(t), "%ld", v);
			bool want = v >= cases[k].lo && v <= cases[k].hi;
			if (fulls(g, t) != want)
				fail_msg("%s: %ld %s", cases[k].schema, v, want ? "rejected" : "accepted");
		}
		assert_false(fulls(g, "007"));
		assert_false(fulls(g, "-0"));
		free(g);
	}
}

static void test_schema_number_ranges(void **state)
{
	char *g = schema_gbnf("{\"type\":\"number\",\"minimum\":-5,\"maximum\":2}");
	const char *ok[] = { "-5", "-5.0", "-4.99", "0", "-0.5", "1.75", "2", "2.000", "-0" };
	const char *bad[] = { "-5.01", "2.01", "3", "-6", "1e0", "02" };
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!fulls(g, ok[i]))
			fail_msg("rejected %s", ok[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (fulls(g, bad[i]))
			fail_msg("accepted %s", bad[i]);
	free(g);
	g = schema_gbnf("{\"type\":\"number\",\"minimum\":10}");
	assert_true(fulls(g, "10"));
	assert_true(fulls(g, "123456.5"));
	assert_false(fulls(g, "9.99"));
	assert_false(fulls(g, "-11"));
	free(g);
}

static void test_schema_strings(void **state)
{
	char *g = schema_gbnf("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
	assert_true(fulls(g, "\"ab\""));
	assert_true(fulls(g, "\"a\\nb\""));
	assert_true(fulls(g, "\"日本\""));
	assert_false(fulls(g, "\"a\""));
	assert_false(fulls(g, "\"abcd\""));
	free(g);
	g = schema_gbnf("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,4}$\"}");
	assert_true(fulls(g, "\"AB-123\""));
	assert_true(fulls(g, "\"XY-1234\""));
	assert_false(fulls(g, "\"AB-12\""));
	assert_false(fulls(g, "\"ab-123\""));
	assert_false(fulls(g, "\"AB-123x\""));
	free(g);
	/* unanchored: a search, so anything around it */
	g = schema_gbnf("{\"type\":\"string\",\"pattern\":\"(cat|dog)s?\"}");
	assert_true(fulls(g, "\"my dogs\""));
	assert_true(fulls(g, "\"cat\""));
	assert_false(fulls(g, "\"cow\""));
	free(g);
	/* quote and backslash in a pattern come out escaped */
	g = schema_gbnf("{\"type\":\"string\",\"pattern\":\"^[\\\"\\\\\\\\]+$\"}");
	assert_true(fulls(g, "\"\\\"\\\\\""));
	assert_false(fulls(g, "\"\"\""));
	free(g);
	/* controls come out escaped, U+0000 never (nx_grammar_json_gbnf) */
	g = schema_gbnf("{\"type\":\"string\",\"pattern\":\"^[\\\\x00-\\\\x1f]+$\"}");
	assert_true(fulls(g, "\"\\n\\u0001\\u001F\""));
	assert_false(fulls(g, "\"\\u0000\""));
	free(g);
}

static void test_schema_objects_arrays(void **state)
{
	char *g = schema_gbnf("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"},"
			      "\"c\":{\"enum\":[\"x\",2,null]}},\"required\":[\"b\"]}");
	assert_true(fulls(g, "{\"b\": true}"));
	assert_true(fulls(g, "{\"a\": 1, \"b\": false, \"c\": \"x\"}"));
	assert_true(fulls(g, "{\"b\":true,\"c\":null}"));
	assert_false(fulls(g, "{\"a\": 1}"));
	assert_false(fulls(g, "{}"));
	assert_false(fulls(g, "{\"b\": true, \"c\": 3}"));
	assert_false(fulls(g, "{\"b\": true, \"d\": 3}"));
	assert_false(fulls(g, "{, \"b\": true}"));
	free(g);
	g = schema_gbnf("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"}}}");
	assert_true(fulls(g, "{}"));
	assert_true(fulls(g, "{\"b\": null}"));
	assert_true(fulls(g, "{\"a\": null, \"b\": null}"));
	assert_false(fulls(g, "{\"a\": null,}"));
	free(g);
	g = schema_gbnf("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"const\":\"q\"},\"minItems\":2,\"maxItems\":3}");
	assert_true(fulls(g, "[\"q\", \"q\"]"));
	assert_true(fulls(g, "[\"q\",\"q\",\"q\"]"));
	assert_false(fulls(g, "[\"q\"]"));
	assert_false(fulls(g, "[\"q\",\"q\",\"q\",\"q\"]"));
	free(g);
	g = schema_gbnf("{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5,\"maximum\":6},{\"type\":\"array\",\"maxItems\":0}],"
			"\"title\":\"t\"}");
	assert_true(fulls(g, "5"));
	assert_true(fulls(g, "[]"));
	assert_false(fulls(g, "7"));
	assert_false(fulls(g, "[1]"));
	free(g);
	g = schema_gbnf("{\"type\":[\"string\",\"null\"],\"maxLength\":1}");
	assert_true(fulls(g, "null"));
	assert_true(fulls(g, "\"a\""));
	assert_false(fulls(g, "\"ab\""));
	free(g);
}

static void test_schema_refusals(void **state)
{
	schema_fails("{\"$ref\":\"#/$defs/a\"}", "'$ref'");
	schema_fails("{\"type\":\"object\",\"patternProperties\":{}}", "'patternProperties'");
	schema_fails("{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems'");
	schema_fails("{\"oneOf\":[{},{}]}", "'oneOf'");
	schema_fails("{\"allOf\":[{}]}", "'allOf'");
	schema_fails("{\"type\":\"string\",\"format\":\"email\"}", "'format'");
	schema_fails("{\"type\":\"number\",\"multipleOf\":3}", "'multipleOf'");
	schema_fails("{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "lookahead");
	schema_fails("{\"type\":\"string\",\"pattern\":\"(?<!a)b\"}", "lookbehind");
	schema_fails("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreference");
	schema_fails("{\"type\":\"string\",\"pattern\":\"\\\\bword\"}", "word boundary");
	schema_fails("{\"type\":\"string\",\"pattern\":\"a^b\"}", "anchor");
	schema_fails("{\"type\":\"string\",\"pattern\":\"^\\\\x00$\"}", "U+0000");
	schema_fails("{\"type\":\"string\",\"pattern\":\"a\\\\u0000\"}", "U+0000");
	schema_fails("{\"type\":\"string\",\"pattern\":\"^[\\\\x00]+$\"}", "U+0000");
	schema_fails("{\"type\":\"number\",\"minimum\":0.5}", "not an integer");
	schema_fails("{\"type\":\"number\",\"exclusiveMinimum\":0}", "exclusive");
	schema_fails("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer");
	schema_fails("{\"type\":\"array\",\"items\":[{}]}", "tuple");
	schema_fails("{\"type\":\"string\",\"maxLength\":100000}", "maxLength");
	schema_fails("{\"type\":\"strin\"}", "type 'strin'");
	schema_fails("false", "false");
	schema_fails("{\"enum\":[1,2],\"minimum\":1}", "together with 'minimum'");
	schema_fails("{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}", "properties.a");
	schema_fails("{\"type\":\"integer\",\"exclusiveMinimum\":true}", "draft 4");
	schema_fails("{", "not JSON");
}

static void test_ambiguous_grammar_bounded(void **state)
{
	/* 2^40 ways to reach the same stacks: refused within its bounds, not expanded for ever */
	struct nx_grammar *g;
	struct nx_gmatch *m = NULL;
	struct nx_err err = { { 0 } };
	const char *amb = "root ::= ( \"a\"? | \"b\"? | \"\" ){40} \"c\"\n";
	assert_int_equal(nx_grammar_compile(amb, strlen(amb), &g, &err), 0);
	int rc = nx_gmatch_new(g, trie, &m, &err);
	if (rc == 0) {
		int n;
		const uint64_t *mask = nx_gmatch_mask(m, &n, &err);
		assert_null(mask);
		nx_gmatch_free(m);
	}
	assert_non_null(strstr(err.msg, "ambiguous"));
}

/* --- the sampler under a mask ---------------------------------------------------- */

static void test_masked_sampler_renormalises(void **state)
{
	enum { N = 100 };
	float logits[N];
	for (int i = 0; i < N; i++)
		logits[i] = (float)((i * 37) % 17) / 4.0f;
	uint64_t allowed[2] = { 0, 0 };
	const int ids[] = { 3, 10, 64, 65, 99 };
	double z = 0;
	for (int k = 0; k < 5; k++) {
		allowed[ids[k] >> 6] |= 1ull << (ids[k] & 63);
		z += exp(logits[ids[k]]);
	}
	struct nx_sample_params p = nx_sample_params_default();
	p.temperature = 1.0f;
	p.top_k = 0;
	p.top_p = 1.0f;
	p.min_p = 0.0f;
	p.n_logprobs = 20;
	p.seed = 42;
	struct nx_sampler s;
	struct nx_err err = { { 0 } };
	assert_int_equal(nx_sampler_init(&s, N, &p, &err), 0);
	int count[N] = { 0 };
	const int draws = 20000;
	for (int d = 0; d < draws; d++) {
		struct nx_logprob top[20];
		int n_top = 0;
		int32_t t = nx_sample_masked(&s, logits, allowed, NULL, 0, top, &n_top);
		assert_true((allowed[t >> 6] >> (t & 63)) & 1);
		count[t]++;
		if (d == 0) {
			/* log-probabilities of the allowed tokens only, renormalised over them */
			assert_int_equal(n_top, 5);
			for (int k = 0; k < n_top; k++)
				assert_true(fabs(top[k].logprob - (logits[top[k].id] - log(z))) < 1e-4);
			assert_true(fabs(nx_sampler_last_logprob(&s) - (logits[t] - log(z))) < 1e-4);
		}
	}
	for (int k = 0; k < 5; k++) {
		double want = exp(logits[ids[k]]) / z, got = (double)count[ids[k]] / draws;
		if (fabs(got - want) > 4 * sqrt(want * (1 - want) / draws) + 1e-3)
			fail_msg("token %d drawn %.4f of the time, want %.4f", ids[k], got, want);
	}
	nx_sampler_free(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gbnf_constructs),
		cmocka_unit_test(test_gbnf_utf8),
		cmocka_unit_test(test_gbnf_refusals),
		cmocka_unit_test(test_mask_matches_tokens),
		cmocka_unit_test(test_eos_only_when_complete),
		cmocka_unit_test(test_json_any),
		cmocka_unit_test(test_schema_integer_ranges_exact),
		cmocka_unit_test(test_schema_number_ranges),
		cmocka_unit_test(test_schema_strings),
		cmocka_unit_test(test_schema_objects_arrays),
		cmocka_unit_test(test_schema_refusals),
		cmocka_unit_test(test_masked_sampler_renormalises),
		cmocka_unit_test(test_ambiguous_grammar_bounded),
	};
	return cmocka_run_group_tests(tests, setup_vocab, teardown_vocab);
}
