/* test_tools.c - the reader of a model's tool calls (tok/tools.c): calls taken only when whole and well formed, the same however the text is cut into tokens; and tool arguments against JSON schemas (tok/tool_schema.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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
	/* no call at all */
	struct result r;
	read_answer(NX_TOOLS_QWEN, NX_TOOL_REQUIRED, NULL, true, "x\", \"arguments\": {}}\n</tool_call>", 0, &r);
	assert_true(r.failed);
	assert_int_equal(r.n_calls, 0);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qwen_calls),
		cmocka_unit_test(test_malformed_calls_are_text),
		cmocka_unit_test(test_llama_calls),
		cmocka_unit_test(test_forced_calls_are_checked),
		cmocka_unit_test(test_mistral_calls),
		cmocka_unit_test(test_schema),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
