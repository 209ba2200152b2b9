/* test_tools.c - the reader of a model's tool calls (tok/tools.c): calls taken only when whole and well formed, the same however the text is cut into tokens; the grammar of a call tool_choice asks for (tok/tool_grammar.c); and tool arguments against JSON schemas (tok/tool_schema.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample/grammar.h"
#include "tok/tools.h"

static const char TOOLS[] =
	"[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
	"\"properties\":{\"city\":{\"type\":\"string\",\"minLength\":2},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
	"\"required\":[\"city\"],\"additionalProperties\":false}}},"
	"{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

struct result {
	char text[4096];     /* the plain text released, in order */
	char calls[8][256];  /* "name args" */
	int n_calls;
	bool failed;
};

/* Reads answer cut into pieces of step bytes (0: all at once); feeding
 * stops once the reader says the answer is done, as the daemon stops. */
static void read_answer(enum nx_tool_style style, enum nx_tool_choice choice, const char *name, bool parallel,
			const char *answer, size_t step, struct result *res)
{
	json_error_t je;
	json_t *tools = json_loads(TOOLS, 0, &je);
	struct nx_toolp p;
	struct nx_err err;
	char *prefix = choice == NX_TOOL_AUTO ? NULL : nx_tool_prefix(style, name);
	assert_int_equal(nx_toolp_init(&p, style, tools, choice, name, parallel, prefix, 42, &err), 0);
	memset(res, 0, sizeof(*res));
	size_t n = strlen(answer), len = 0;
	for (size_t i = 0; i < n && !nx_toolp_done(&p); i += step ? step : n) {
		size_t k = step && i + step < n ? step : n - i;
		nx_toolp_feed(&p, answer + i, k);
		memcpy(res->text + len, p.out, p.out_len);
		len += p.out_len;
	}
	size_t before = p.out_len; /* finish adds to what the last feed released */
	nx_toolp_finish(&p);
	memcpy(res->text + len, p.out + before, p.out_len - before);
	len += p.out_len - before;
	res->text[len] = '\0';
	for (int i = 0; i < p.n_calls && i < 8; i++) {
		snprintf(res->calls[i], sizeof(res->calls[i]), "%s %s", p.calls[i].name, p.calls[i].arguments);
		if (style == NX_TOOLS_MISTRAL || style == NX_TOOLS_MISTRAL_TIGHT) { /* v3's templates: 9 characters */
			assert_int_equal(strlen(p.calls[i].id), 9);
			assert_int_equal(strspn(p.calls[i].id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"), 9);
		} else {
			assert_int_equal(strncmp(p.calls[i].id, "call_", 5), 0);
			assert_int_equal(strlen(p.calls[i].id), 5 + 24);
		}
	}
	res->n_calls = p.n_calls;
	res->failed = p.failed;
	nx_toolp_free(&p);
	free(prefix);
	json_decref(tools);
}

/* The same result for every way of cutting the answer. */
static void expect(enum nx_tool_style style, enum nx_tool_choice choice, const char *name, bool parallel,
		   const char *answer, const char *text, const char *const *calls, int n_calls, bool failed)
{
	for (size_t step = 0; step <= 13; step++) {
		struct result r;
		read_answer(style, choice, name, parallel, answer, step, &r);
		if ((text && strcmp(r.text, text)) || r.n_calls != n_calls || r.failed != failed)
			fail_msg("step %zu: answer %s\n  text %s (want %s), %d calls (want %d), failed %d", step, answer,
				 r.text, text ? text : "(any)", r.n_calls, n_calls, r.failed);
		for (int i = 0; i < n_calls; i++)
			assert_string_equal(r.calls[i], calls[i]);
	}
}

static void test_qwen_calls(void **state)
{
	(void)state;
	const char *one[] = { "get_weather {\"city\":\"Paris\"}" };
	expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, true,
	       "Let me see.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
	       "Let me see.\n", one, 1, false);
	const char *two[] = { "get_weather {\"city\":\"Paris\"}", "now {}" };
	const char *both = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
			   "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>";
	expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, true, both, "\n", two, 2, false);
	/* parallel_tool_calls false: the first call ends the answer */
	expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, false, both, "", two, 1, false);
	/* arguments may quote the close: the block ends where its JSON does */
	const char *quoting[] = { "get_weather {\"city\":\"Pari</tool_call>s \\\"x</tool_call>\"}" };
	const char *q = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
			"{\"city\": \"Pari</tool_call>s \\\"x</tool_call>\"}}\n</tool_call>";
	expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, true, q, "", quoting, 1, false);
	expect(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, true, q + strlen("<tool_call>\n{\"name\": \""), "", quoting, 1, false);
	/* text that only looks like the start of a call is text */
	expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, true, "a <tool_ b <tool_callx> c <tool_cal", "a <tool_ b <tool_callx> c <tool_cal",
	       NULL, 0, false);
}

static void test_malformed_calls_are_text(void **state)
{
	(void)state;
	static const char *const bad[] = {
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>",
		"<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{}\"}\n</tool_call>",
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}, \"extra\": 1}\n</tool_call>",
		"<tool_call>\n{\"name\": \"get_weather\", \"name\": \"now\", \"arguments\": {}}\n</tool_call>",
		"<tool_call>\n[\"get_weather\", {}]\n</tool_call>",
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
		"<tool_call>",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, true, bad[i], bad[i], NULL, 0, false);
	/* a good call after a bad one is still a call */
	char s[512];
	snprintf(s, sizeof(s), "%s<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>", bad[0]);
	const char *now[] = { "now {}" };
	expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, true, s, bad[0], now, 1, false);
	/* ... and after one whose string never ends: that block is text up to its first close */
	const char *open_str = "<tool_call>{\"name\": \"now\", \"arguments\": {\"x\": \"a}}</tool_call>";
	snprintf(s, sizeof(s), "%s <tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>", open_str);
	char text[512];
	snprintf(text, sizeof(text), "%s ", open_str);
	expect(NX_TOOLS_QWEN, NX_TOOL_AUTO, NULL, true, s, text, now, 1, false);
	/* Llama: the whole answer or nothing */
	expect(NX_TOOLS_LLAMA3, NX_TOOL_AUTO, NULL, true, "{\"name\": \"now\", \"parameters\": {}} and more",
	       "{\"name\": \"now\", \"parameters\": {}} and more", NULL, 0, false);
	expect(NX_TOOLS_LLAMA3, NX_TOOL_AUTO, NULL, true, "{\"name\": \"now\", \"parameters\": {",
	       "{\"name\": \"now\", \"parameters\": {", NULL, 0, false);
}

static void test_llama_calls(void **state)
{
	(void)state;
	const char *one[] = { "get_weather {\"city\":\"Paris\",\"unit\":\"c\"}" };
	expect(NX_TOOLS_LLAMA3, NX_TOOL_AUTO, NULL, true,
	       "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n", "", one, 1, false);
	expect(NX_TOOLS_LLAMA3, NX_TOOL_AUTO, NULL, true,
	       "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}",
	       "", one, 1, false);
	expect(NX_TOOLS_LLAMA3, NX_TOOL_AUTO, NULL, true, "{\"type\": \"tool\", \"name\": \"now\", \"parameters\": {}}",
	       "{\"type\": \"tool\", \"name\": \"now\", \"parameters\": {}}", NULL, 0, false);
	expect(NX_TOOLS_LLAMA3, NX_TOOL_AUTO, NULL, true, "Paris is {sunny}", "Paris is {sunny}", NULL, 0, false);
	expect(NX_TOOLS_LLAMA3, NX_TOOL_AUTO, NULL, true, " \n", " \n", NULL, 0, false);
}

static void test_forced_calls_are_checked(void **state)
{
	(void)state;
	const char *one[] = { "get_weather {\"city\":\"Paris\"}" };
	/* named: the prefix carries the name; the model writes the arguments */
	expect(NX_TOOLS_QWEN, NX_TOOL_NAMED, "get_weather", true, "{\"city\": \"Paris\"}}\n</tool_call>", "", one, 1, false);
	expect(NX_TOOLS_LLAMA3, NX_TOOL_NAMED, "get_weather", true, "{\"city\": \"Paris\"}}", "", one, 1, false);
	/* arguments against the schema: too short, not in the enum, an extra property, a missing one */
	static const char *const wrong[] = { "{\"city\": \"P\"}}\n</tool_call>", "{\"city\": \"Paris\", \"unit\": \"k\"}}\n</tool_call>",
					     "{\"city\": \"Paris\", \"x\": 1}}\n</tool_call>", "{}}\n</tool_call>" };
	for (size_t i = 0; i < 4; i++)
		expect(NX_TOOLS_QWEN, NX_TOOL_NAMED, "get_weather", true, wrong[i], NULL, NULL, 0, true);
	/* required: any tool, then its own schema */
	const char *now[] = { "now {}" };
	expect(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, true, "now\", \"arguments\": {}}\n</tool_call>", "", now, 1, false);
	/* a tool without parameters takes none: arguments other than {} do not validate */
	const char *none[] = { "now {}" };
	expect(NX_TOOLS_QWEN, NX_TOOL_NAMED, "now", true, "{}}\n</tool_call>", "", none, 1, false);
	expect(NX_TOOLS_QWEN, NX_TOOL_NAMED, "now", true, "{\"x\": 1}}\n</tool_call>", NULL, NULL, 0, true);
	/* no call at all */
	struct result r;
	read_answer(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, true, "x\", \"arguments\": {}}\n</tool_call>", 0, &r);
	assert_true(r.failed);
	assert_int_equal(r.n_calls, 0);
	assert_string_equal(r.text, ""); /* a call that must be made is a call or nothing: the block is no text */
	/* cut before it is whole (max_tokens): no call, and none of it given back as text */
	for (size_t step = 0; step <= 5; step++) {
		read_answer(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, true, "get_weather\", \"arguments\": {\"city\": \"Pa", step,
			    &r);
		assert_true(r.failed);
		assert_int_equal(r.n_calls, 0);
		assert_string_equal(r.text, "");
	}
}

static void test_mistral_calls(void **state)
{
	(void)state;
	const char *one[] = { "get_weather {\"city\":\"Paris\"}" };
	const char *two[] = { "get_weather {\"city\":\"Paris\"}", "now {}" };
	/* [TOOL_CALLS] then a JSON array, spaced (v3, Small 3.1) or not (Nemo); an "id" the model writes is allowed */
	expect(NX_TOOLS_MISTRAL, NX_TOOL_AUTO, NULL, true,
	       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", "", one, 1, false);
	expect(NX_TOOLS_MISTRAL_TIGHT, NX_TOOL_AUTO, NULL, true,
	       "[TOOL_CALLS][{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}},"
	       "{\"name\":\"now\",\"arguments\":{},\"id\":\"abcdefghi\"}]", "", two, 2, false);
	/* text before the block passes; brackets inside strings do not close it */
	const char *odd[] = { "get_weather {\"city\":\"]} [x\\\"\"}" };
	expect(NX_TOOLS_MISTRAL, NX_TOOL_AUTO, NULL, true,
	       "Sure. [TOOL_CALLS]\n [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"]} [x\\\"\"}}]",
	       "Sure. ", odd, 1, false);
	/* parallel_tool_calls false: the first call of the list ends the answer */
	expect(NX_TOOLS_MISTRAL, NX_TOOL_AUTO, NULL, false,
	       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
	       "{\"name\": \"now\", \"arguments\": {}}]", "", two, 1, false);
	/* a list with one bad call is no call at all, given back as text; a good block after it is one */
	static const char *const bad[] = {
		"[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
		"{\"name\": \"rm_rf\", \"arguments\": {}}]",
		"[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}, \"id\": 7}]",
		"[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": \"{}\"}]",
		"[TOOL_CALLS] []",
		"[TOOL_CALLS] {\"name\": \"now\", \"arguments\": {}}",
		"[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}",
		"[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}}]",
		"[TOOL_CALLS]now[ARGS]{}",
		"[TOOL_CALLS]",
		"a [TOOL_CALL b [TOOL_CALLS x",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect(NX_TOOLS_MISTRAL, NX_TOOL_AUTO, NULL, true, bad[i], bad[i], NULL, 0, false);
	char s[512];
	snprintf(s, sizeof(s), "%s[TOOL_CALLS] [{\"name\":\"now\",\"arguments\":{}}]", bad[0]);
	const char *now[] = { "now {}" };
	expect(NX_TOOLS_MISTRAL, NX_TOOL_AUTO, NULL, true, s, bad[0], now, 1, false);
	/* forced: the prefix opens the list (and names the tool); the schema checks the arguments */
	expect(NX_TOOLS_MISTRAL, NX_TOOL_NAMED, "get_weather", true, "{\"city\": \"Paris\"}}]", "", one, 1, false);
	expect(NX_TOOLS_MISTRAL_TIGHT, NX_TOOL_REQUIRED, NULL, true, "now\", \"arguments\": {}}]", "", now, 1, false);
	expect(NX_TOOLS_MISTRAL, NX_TOOL_NAMED, "get_weather", true, "{\"city\": \"P\"}}]", NULL, NULL, 0, true);
	expect(NX_TOOLS_MISTRAL, NX_TOOL_REQUIRED, NULL, true, "x\", \"arguments\": {}}]", NULL, NULL, 0, true);
}

static int validate(const char *schema, const char *value, char *why, size_t cap)
{
	json_error_t je;
	json_t *s = json_loads(schema, JSON_DECODE_ANY, &je), *v = json_loads(value, JSON_DECODE_ANY, &je);
	assert_non_null(s);
	assert_non_null(v);
	struct nx_err err = { { 0 } };
	assert_int_equal(nx_tool_schema_check(s, "p", &err), 0);
	int rc = nx_tool_schema_validate(s, v, &err);
	snprintf(why, cap, "%s", err.msg);
	json_decref(s);
	json_decref(v);
	return rc;
}

static void test_schema(void **state)
{
	(void)state;
	static const struct { const char *schema, *value; int ok; const char *why; } cases[] = {
		{ "{\"type\":\"integer\"}", "3", 0, NULL },
		{ "{\"type\":\"integer\"}", "3.0", 0, NULL },
		{ "{\"type\":\"integer\"}", "3.5", -1, "type" },
		{ "{\"type\":[\"string\",\"null\"]}", "null", 0, NULL },
		{ "{\"minimum\":1,\"exclusiveMaximum\":3}", "3", -1, "exclusive maximum" },
		{ "{\"multipleOf\":0.5}", "1.5", 0, NULL },
		{ "{\"enum\":[1,\"a\",[true]]}", "1.0", 0, NULL },
		{ "{\"enum\":[1,\"a\",[true]]}", "[false]", -1, "enum" },
		{ "{\"const\":{\"a\":[1,2]}}", "{\"a\":[1,2]}", 0, NULL },
		{ "{\"maxLength\":2}", "\"\xc3\xa9\xc3\xa9\"", 0, NULL }, /* two code points, four bytes */
		{ "{\"pattern\":\"^[a-z]+$\"}", "\"abc\"", 0, NULL },
		{ "{\"pattern\":\"^[a-z]+$\"}", "\"ab1\"", -1, "pattern" },
		{ "{\"items\":{\"type\":\"number\"},\"minItems\":2,\"uniqueItems\":true}", "[1,2]", 0, NULL },
		{ "{\"items\":{\"type\":\"number\"}}", "[1,\"x\"]", -1, "$[1]" },
		{ "{\"uniqueItems\":true}", "[1,1.0]", -1, "unique" },
		{ "{\"properties\":{\"a\":{\"properties\":{\"b\":{\"type\":\"string\"}}}}}", "{\"a\":{\"b\":1}}", -1, "$.a.b" },
		{ "{\"additionalProperties\":{\"type\":\"integer\"}}", "{\"x\":1,\"y\":\"2\"}", -1, "$.y" },
		{ "{\"anyOf\":[{\"type\":\"string\"},{\"minimum\":5}]}", "7", 0, NULL },
		{ "{\"oneOf\":[{\"type\":\"number\"},{\"minimum\":5}]}", "7", -1, "more than one" },
		{ "{\"allOf\":[{\"type\":\"number\"},{\"maximum\":5}]}", "7", -1, "maximum" },
		{ "{\"not\":{\"type\":\"null\"}}", "null", -1, "'not'" },
		{ "{\"minProperties\":1}", "{}", -1, "minProperties" },
		{ "false", "1", -1, "no value" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char why[512];
		int rc = validate(cases[i].schema, cases[i].value, why, sizeof(why));
		if (rc != cases[i].ok || (cases[i].why && !strstr(why, cases[i].why)))
			fail_msg("schema %s value %s: rc %d (want %d), '%s' (want '%s')", cases[i].schema, cases[i].value, rc,
				 cases[i].ok, why, cases[i].why ? cases[i].why : "");
	}
	/* keywords nxd cannot check are named */
	static const char *const refused[] = { "{\"$ref\":\"#/x\"}", "{\"properties\":{\"a\":{\"patternProperties\":{}}}}",
					       "{\"type\":\"float\"}", "{\"pattern\":\"(\"}", "{\"anyOf\":[]}" };
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		json_error_t je;
		json_t *s = json_loads(refused[i], 0, &je);
		struct nx_err err;
		assert_int_equal(nx_tool_schema_check(s, "tools[0].function.parameters", &err), -1);
		assert_non_null(strstr(err.msg, "tools[0].function.parameters"));
		json_decref(s);
	}
}

/* --- the grammar of a forced call (tool_grammar.c) */

/* A matcher of the call grammar over a vocabulary of the 256 bytes. */
static struct nx_gmatch *call_matcher(enum nx_tool_style style, enum nx_tool_choice choice, const char *name,
				      const char *tools_json, struct nx_vocab_trie **trie)
{
	static char bytes[256];
	static const char *pieces[257];
	static size_t lens[257];
	static bool eog[257];
	for (int i = 0; i < 256; i++) {
		bytes[i] = (char)i;
		pieces[i] = &bytes[i];
		lens[i] = 1;
	}
	eog[256] = true;
	struct nx_err err = { { 0 } };
	if (nx_vocab_trie_from_pieces(257, pieces, lens, eog, trie, &err))
		fail_msg("trie: %s", err.msg);
	json_error_t je;
	json_t *tools = json_loads(tools_json, 0, &je);
	char *gbnf = NULL;
	if (nx_tool_grammar(style, tools, choice, name, &gbnf, &err))
		fail_msg("tool grammar: %s", err.msg);
	json_decref(tools);
	assert_non_null(gbnf);
	struct nx_grammar *g;
	struct nx_gmatch *m;
	if (nx_grammar_compile(gbnf, strlen(gbnf), &g, &err))
		fail_msg("compile: %s\n%s", err.msg, gbnf);
	free(gbnf);
	if (nx_gmatch_new(g, *trie, &m, &err))
		fail_msg("matcher: %s", err.msg);
	return m;
}

/* Whether the grammar takes answer as a whole call (then the reader must
 * take it too, as the one call it is). */
static bool grammar_takes(enum nx_tool_style style, enum nx_tool_choice choice, const char *name, const char *answer)
{
	struct nx_vocab_trie *trie;
	struct nx_gmatch *m = call_matcher(style, choice, name, TOOLS, &trie);
	bool ok = nx_gmatch_accept_bytes(m, answer, strlen(answer)) == 0 && nx_gmatch_accepting(m);
	if (ok) {
		/* and nothing may follow but the end of generation */
		int n_allowed = -1;
		struct nx_err err;
		const uint64_t *mask = nx_gmatch_mask(m, &n_allowed, &err);
		assert_non_null(mask);
		assert_int_equal(n_allowed, 1);
		assert_true(mask[256 / 64] & (1ull << (256 % 64)));
		assert_int_equal(nx_gmatch_accept_token(m, 256), 0);
	}
	nx_gmatch_free(m);
	nx_vocab_trie_free(trie);
	if (ok) {
		struct result r;
		read_answer(style, choice, name, true, answer, 0, &r);
		if (r.n_calls != 1 || r.failed)
			fail_msg("the grammar takes %s, the reader does not (%d calls)", answer, r.n_calls);
	}
	return ok;
}

static void test_call_grammar(void **state)
{
	(void)state;
	/* Qwen, any tool: the name, the separator, the tool's own schema, the close */
	assert_true(grammar_takes(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL,
				  "get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>"));
	assert_true(grammar_takes(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, "now\", \"arguments\": {}}\n</tool_call>"));
	/* a tool without parameters takes none (OpenAI: an empty parameter list) */
	assert_false(grammar_takes(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL,
				   "now\", \"arguments\": {\"x\": [1, {\"y\": null}]}}\n</tool_call>"));
	assert_true(grammar_takes(NX_TOOLS_QWEN, NX_TOOL_NAMED, "now", "{ }}\n</tool_call>"));
	static const char *const wrong[] = {
		"send\", \"arguments\": {}}\n</tool_call>",                                 /* not offered */
		"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>",          /* minLength 2 */
		"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>",          /* city is required */
		"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"k\"}}\n</tool_call>", /* enum */
		"get_weather\", \"arguments\": {\"city\": \"Rome\", \"x\": 1}}\n</tool_call>", /* additional */
		"get_weather\",\"arguments\":{\"city\": \"Rome\"}}\n</tool_call>",        /* not the separator */
		"get_weather\", \"parameters\": {\"city\": \"Rome\"}}\n</tool_call>",     /* Llama's key */
		"now\", \"arguments\": {}}</tool_call>",                                    /* not the close */
		"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>",                     /* a second call */
		"now\", \"arguments\": []}\n</tool_call>",                                  /* not an object */
	};
	for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++)
		if (grammar_takes(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, wrong[i]))
			fail_msg("the grammar takes %s", wrong[i]);
	/* a named tool: the prefix holds the name and the separator */
	assert_true(grammar_takes(NX_TOOLS_QWEN, NX_TOOL_NAMED, "get_weather", "{\"city\": \"Rome\"}}\n</tool_call>"));
	assert_false(grammar_takes(NX_TOOLS_QWEN, NX_TOOL_NAMED, "now", "{\"city\": \"Rome\"}}\n</tool_call>"));
	assert_false(grammar_takes(NX_TOOLS_QWEN, NX_TOOL_NAMED, "get_weather", "{}}\n</tool_call>"));
	/* Llama 3: "parameters", and the call is the whole answer */
	assert_true(grammar_takes(NX_TOOLS_LLAMA3, NX_TOOL_REQUIRED, NULL,
				  "get_weather\", \"parameters\": {\"city\": \"Rome\"}}"));
	assert_false(grammar_takes(NX_TOOLS_LLAMA3, NX_TOOL_REQUIRED, NULL,
				   "get_weather\", \"arguments\": {\"city\": \"Rome\"}}"));
	assert_true(grammar_takes(NX_TOOLS_LLAMA3, NX_TOOL_NAMED, "get_weather", "{\"city\": \"Rome\", \"unit\": \"f\"}}"));
	assert_false(grammar_takes(NX_TOOLS_LLAMA3, NX_TOOL_NAMED, "get_weather", "{\"city\": \"Rome\"}}\n"));

	/* Mistral: one call in its list, with or without the id its history writes */
	assert_true(grammar_takes(NX_TOOLS_MISTRAL, NX_TOOL_REQUIRED, NULL,
				  "get_weather\", \"arguments\": {\"city\": \"Rome\"}}]"));
	assert_true(grammar_takes(NX_TOOLS_MISTRAL_TIGHT, NX_TOOL_NAMED, "get_weather",
				  "{\"city\": \"Rome\"}, \"id\": \"a1B2c3D4e\"}]"));
	assert_false(grammar_takes(NX_TOOLS_MISTRAL, NX_TOOL_NAMED, "get_weather", "{\"city\": \"Rome\"}, \"id\": \"a1\"}]"));
	assert_false(grammar_takes(NX_TOOLS_MISTRAL, NX_TOOL_NAMED, "get_weather",
				   "{\"city\": \"Rome\"}}, {\"name\": \"now\", \"arguments\": {}}]"));
	/* auto, and a family without a call grammar: none (the check alone) */
	json_error_t je;
	json_t *tools = json_loads(TOOLS, 0, &je);
	char *gbnf = (char *)1;
	struct nx_err err = { { 0 } };
	assert_int_equal(nx_tool_grammar(NX_TOOLS_QWEN, tools, NX_TOOL_AUTO, NULL, &gbnf, &err), 0);
	assert_null(gbnf);
	assert_int_equal(nx_tool_grammar(NX_TOOLS_NONE, tools, NX_TOOL_REQUIRED, NULL, &gbnf, &err), 0);
	assert_null(gbnf);
	json_decref(tools);
	/* a schema the compiler cannot hold arguments to: refused naming the tool and the keyword, when the
	 * call is asked for; a tool that is not the named one does not matter */
	tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"now\"}},"
			   "{\"type\":\"function\",\"function\":{\"name\":\"even\",\"parameters\":{\"type\":\"object\","
			   "\"properties\":{\"n\":{\"type\":\"integer\",\"multipleOf\":2}}}}}]", 0, &je);
	assert_non_null(tools);
	assert_int_equal(nx_tool_grammar(NX_TOOLS_QWEN, tools, NX_TOOL_REQUIRED, NULL, &gbnf, &err), -1);
	assert_non_null(strstr(err.msg, "tool 'even'"));
	assert_non_null(strstr(err.msg, "multipleOf"));
	assert_non_null(strstr(err.msg, "tools[1].function.parameters"));
	assert_int_equal(nx_tool_grammar(NX_TOOLS_QWEN, tools, NX_TOOL_NAMED, "even", &gbnf, &err), -1);
	assert_int_equal(nx_tool_grammar(NX_TOOLS_QWEN, tools, NX_TOOL_NAMED, "now", &gbnf, &err), 0);
	assert_non_null(gbnf);
	free(gbnf);
	json_decref(tools);
}

/* Several tools' schemas in one grammar: each tool's rules are its own even
 * when the schemas make the same rule numbers. */
static void test_call_grammar_keeps_schemas_apart(void **state)
{
	(void)state;
	static const char tools[] =
		"[{\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\",\"properties\":"
		"{\"v\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},\"required\":[\"v\"]}}},"
		"{\"function\":{\"name\":\"b\",\"parameters\":{\"type\":\"object\",\"properties\":"
		"{\"v\":{\"type\":\"string\",\"maxLength\":1}},\"required\":[\"v\"]}}}]";
	struct nx_vocab_trie *trie;
	static const struct { const char *answer; bool ok; } cases[] = {
		{ "a\", \"arguments\": {\"v\": 7}}\n</tool_call>", true },
		{ "b\", \"arguments\": {\"v\": \"7\"}}\n</tool_call>", true },
		{ "a\", \"arguments\": {\"v\": \"7\"}}\n</tool_call>", false },
		{ "b\", \"arguments\": {\"v\": 7}}\n</tool_call>", false },
		{ "a\", \"arguments\": {\"v\": 10}}\n</tool_call>", false },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct nx_gmatch *m = call_matcher(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, tools, &trie);
		bool ok = nx_gmatch_accept_bytes(m, cases[i].answer, strlen(cases[i].answer)) == 0 && nx_gmatch_accepting(m);
		if (ok != cases[i].ok)
			fail_msg("%s: %d", cases[i].answer, ok);
		nx_gmatch_free(m);
		nx_vocab_trie_free(trie);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qwen_calls),
		cmocka_unit_test(test_malformed_calls_are_text),
		cmocka_unit_test(test_llama_calls),
		cmocka_unit_test(test_forced_calls_are_checked),
		cmocka_unit_test(test_mistral_calls),
		cmocka_unit_test(test_schema),
		cmocka_unit_test(test_call_grammar),
		cmocka_unit_test(test_call_grammar_keeps_schemas_apart),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
