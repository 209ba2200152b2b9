/* test_proto.c - the protocol parser's error codes and messages, parsed request structs, and encoders checked by parsing their lines back with jansson. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "proto/proto.h"

static const struct nxp_limits LIM = {.n_vocab = 1000, .n_ctx = 64, .max_tokens = 512, .max_line = 0};

/* Parses line; expects failure with code, a message containing every
 * non-NULL needle, and returns nothing. */
static void check_err_(const char *line, enum nxp_code code, const char *n1, const char *n2,
		       const char *file, int lineno)
{
	struct nxp_request r;
	struct nxp_error e = {0};
	int rc = nxp_parse(line, strlen(line), &LIM, &r, &e);
	if (rc != -1 || e.code != code || (n1 && !strstr(e.msg, n1)) || (n2 && !strstr(e.msg, n2))) {
		print_error("%s:%d: request %.300s\n  want %s with '%s' '%s'\n  got rc %d %s: %s\n", file,
			    lineno, line, nxp_code_name(code), n1 ? n1 : "", n2 ? n2 : "", rc,
			    nxp_code_name(e.code), e.msg);
		nxp_request_free(&r);
		fail();
	}
	nxp_request_free(&r);
}
#define check_err(line, code, n1, n2) check_err_(line, code, n1, n2, __FILE__, __LINE__)

static void parse_ok_(const char *line, struct nxp_request *r, const char *file, int lineno)
{
	struct nxp_error e = {0};
	if (nxp_parse(line, strlen(line), &LIM, r, &e) != 0) {
		print_error("%s:%d: request %.300s\n  failed: %s: %s\n", file, lineno, line,
			    nxp_code_name(e.code), e.msg);
		fail();
	}
}
#define parse_ok(line, r) parse_ok_(line, r, __FILE__, __LINE__)

// --- errors

static void test_invalid_json(void **st)
{
	check_err("{", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
	check_err("not json", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
	check_err("", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
	check_err("{\"id\":1,\"op\":\"status\"} {}", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
	check_err("{'id':1}", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
	/* Not JSON at all: NaN, Infinity, numbers past double or int64. */
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"temperature\":NaN}",
		  NXP_E_PARSE_ERROR, "field 'temperature'", "NaN");
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"temperature\":Infinity}",
		  NXP_E_PARSE_ERROR, "field 'temperature'", "Infinity");
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"temperature\":1e999}",
		  NXP_E_PARSE_ERROR, "field 'temperature'", "1e999");
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"seed\":18446744073709551615}",
		  NXP_E_PARSE_ERROR, "field 'seed'", "too big integer");
	/* The key is only named when the bad token is its value: a ':' inside a
	 * string or an array element does not make one up. */
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"a:b\",\"x\" : NaN}",
		  NXP_E_PARSE_ERROR, "field 'x'", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"stop\":[NaN]}",
		  NXP_E_PARSE_ERROR, "invalid JSON at column 48: invalid token", NULL);
	check_err("{\"id\":99999999999999999999,\"op\":\"status\"}", NXP_E_PARSE_ERROR, "too big", NULL);
	/* Ambiguity and bytes that are not text. */
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"max_tokens\":1,\"max_tokens\":9}",
		  NXP_E_PARSE_ERROR, "duplicate", NULL);
	check_err("{\"id\":1,\"op\":\"tokenize\",\"text\":\"a\xff\"}", NXP_E_PARSE_ERROR, "0xff", NULL);
	check_err("{\"id\":1,\"op\":\"tokenize\",\"text\":\"a\\u0000b\"}", NXP_E_PARSE_ERROR, "u0000 (NUL)",
		  NULL);
	check_err("{\"id\":1,\"op\":\"tokenize\",\"text\":\"\\ud800\"}", NXP_E_PARSE_ERROR, "Unicode",
		  NULL);
	static const char nul_inside[] = "{\"id\":1,\"op\":\"status\"}\0{}";
	struct nxp_request r;
	struct nxp_error e;
	assert_int_equal(nxp_parse(nul_inside, sizeof(nul_inside) - 1, &LIM, &r, &e), -1);
	assert_int_equal(e.code, NXP_E_PARSE_ERROR);
	nxp_request_free(&r);
}

static void test_deep_nesting(void **st)
{
	/* 100000 nested arrays must be refused, not recursed into. */
	size_t n = 100000;
	char *s = malloc(2 * n + 64);
	size_t k = (size_t)sprintf(s, "{\"id\":1,\"op\":\"status\",\"x\":");
	memset(s + k, '[', n);
	memset(s + k + n, ']', n);
	strcpy(s + k + 2 * n, "}");
	check_err(s, NXP_E_PARSE_ERROR, "deeper than 1024 levels", "at byte 1050");
	free(s);
}

static void test_not_object(void **st)
{
	check_err("[]", NXP_E_PARSE_ERROR, "object", "array");
	check_err("[{\"id\":1,\"op\":\"status\"}]", NXP_E_PARSE_ERROR, "object", NULL);
	check_err("1", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
	check_err("\"status\"", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
	check_err("null", NXP_E_PARSE_ERROR, "invalid JSON", NULL);
}

static void test_too_large(void **st)
{
	struct nxp_limits lim = LIM;
	lim.max_line = 32;
	const char *line = "{\"id\":1,\"op\":\"tokenize\",\"text\":\"0123456789\"}";
	struct nxp_request r;
	struct nxp_error e;
	assert_int_equal(nxp_parse(line, strlen(line), &lim, &r, &e), -1);
	assert_int_equal(e.code, NXP_E_TOO_LARGE);
	assert_non_null(strstr(e.msg, "32"));
	assert_string_equal(r.id, "null");
	nxp_request_free(&r);
	/* The default limit (max_line 0) is NXP_MAX_LINE: a 1 MiB + 1 line fails. */
	size_t n = NXP_MAX_LINE + 1;
	char *big = malloc(n + 1);
	memset(big, ' ', n);
	big[n] = '\0';
	memcpy(big, "{\"id\":1,\"op\":\"status\"}", 22);
	assert_int_equal(nxp_parse(big, n, &LIM, &r, &e), -1);
	assert_int_equal(e.code, NXP_E_TOO_LARGE);
	nxp_request_free(&r);
	/* ...and exactly the limit, trailing '\n' not counted, is fine. */
	big[n - 1] = '\n';
	assert_int_equal(nxp_parse(big, n, &LIM, &r, &e), 0);
	nxp_request_free(&r);
	free(big);
}

static void test_op_and_id(void **st)
{
	check_err("{\"id\":1,\"op\":\"frobnicate\"}", NXP_E_UNKNOWN_OP, "'op'", "frobnicate");
	check_err("{\"id\":1,\"op\":\"GENERATE\"}", NXP_E_UNKNOWN_OP, "'op'", "GENERATE");
	check_err("{\"id\":1}", NXP_E_BAD_REQUEST, "'op'", "required");
	check_err("{\"id\":1,\"op\":7}", NXP_E_BAD_REQUEST, "'op'", "got integer");
	check_err("{\"id\":1,\"op\":null}", NXP_E_BAD_REQUEST, "'op'", "required");
	check_err("{\"op\":\"generate\",\"prompt\":\"x\"}", NXP_E_BAD_REQUEST, "'id'", "required");
	check_err("{\"op\":\"status\"}", NXP_E_BAD_REQUEST, "'id'", "required");
	check_err("{\"id\":null,\"op\":\"status\"}", NXP_E_BAD_REQUEST, "'id'", "required");
	check_err("{\"id\":1.5,\"op\":\"status\"}", NXP_E_BAD_REQUEST, "'id'", "got real");
	check_err("{\"id\":true,\"op\":\"status\"}", NXP_E_BAD_REQUEST, "'id'", "got boolean");
	check_err("{\"id\":[1],\"op\":\"status\"}", NXP_E_BAD_REQUEST, "'id'", "got array");
	check_err("{\"id\":{},\"op\":\"status\"}", NXP_E_BAD_REQUEST, "'id'", "got object");
	char line[600];
	snprintf(line, sizeof(line), "{\"id\":\"%0300d\",\"op\":\"status\"}", 0);
	check_err(line, NXP_E_OUT_OF_RANGE, "'id'", "255");
}

static void test_version(void **st)
{
	check_err("{\"op\":\"hello\",\"version\":2}", NXP_E_UNSUPPORTED_VERSION, "version 2", NULL);
	check_err("{\"op\":\"hello\",\"version\":0}", NXP_E_UNSUPPORTED_VERSION, "version 0", NULL);
	check_err("{\"id\":3,\"op\":\"status\",\"version\":7}", NXP_E_UNSUPPORTED_VERSION, "version 7",
		  NULL);
	check_err("{\"op\":\"hello\"}", NXP_E_BAD_REQUEST, "'version'", "required");
	check_err("{\"op\":\"hello\",\"version\":\"1\"}", NXP_E_BAD_REQUEST, "'version'", "got string");
	check_err("{\"op\":\"hello\",\"version\":1.5}", NXP_E_BAD_REQUEST, "'version'", "1.5");
}

#define GEN "{\"id\":1,\"op\":\"generate\",\"prompt\":\"hi\","

/* Every generate field with a value of the wrong type. */
static void test_generate_wrong_types(void **st)
{
	static const struct {
		const char *line, *needle;
	} cases[] = {
		{"{\"id\":1,\"op\":\"generate\",\"prompt\":5}", "field 'prompt' must be a string, got integer"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":\"hi\"}", "field 'messages' must be an array"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":{}}", "field 'messages' must be an array"},
		{"{\"id\":1,\"op\":\"generate\",\"tokens\":\"1 2\"}", "field 'tokens' must be an array"},
		{"{\"id\":1,\"op\":\"generate\",\"tokens\":[1,\"2\"]}", "field 'tokens[1]' must be an integer, got string"},
		{"{\"id\":1,\"op\":\"generate\",\"tokens\":[1,2.5]}", "field 'tokens[1]' must be an integer, got 2.5"},
		{GEN "\"system\":1}", "field 'system' must be a string, got integer"},
		{GEN "\"raw\":\"yes\"}", "field 'raw' must be a boolean, got string"},
		{GEN "\"max_tokens\":\"10\"}", "field 'max_tokens' must be an integer, got string"},
		{GEN "\"max_tokens\":1.5}", "field 'max_tokens' must be an integer, got 1.5"},
		{GEN "\"max_tokens\":true}", "field 'max_tokens' must be an integer, got boolean"},
		{GEN "\"temperature\":\"hot\"}", "field 'temperature' must be a number, got string"},
		{GEN "\"top_k\":1.5}", "field 'top_k' must be an integer, got 1.5"},
		{GEN "\"top_p\":[0.5]}", "field 'top_p' must be a number, got array"},
		{GEN "\"min_p\":{}}", "field 'min_p' must be a number, got object"},
		{GEN "\"repeat_penalty\":false}", "field 'repeat_penalty' must be a number, got boolean"},
		{GEN "\"repeat_last_n\":\"64\"}", "field 'repeat_last_n' must be an integer, got string"},
		{GEN "\"seed\":\"42\"}", "field 'seed' must be an integer, got string"},
		{GEN "\"seed\":0.5}", "field 'seed' must be an integer, got 0.5"},
		{GEN "\"stop\":5}", "field 'stop' must be an array of strings, got integer"},
		{GEN "\"stop\":[\"a\",5]}", "field 'stop[1]' must be a string, got integer"},
		{GEN "\"ignore_eos\":1}", "field 'ignore_eos' must be a boolean, got integer"},
		{GEN "\"stream\":\"no\"}", "field 'stream' must be a boolean, got string"},
		{GEN "\"logprobs\":true}", "field 'logprobs' must be an integer, got boolean"},
		{GEN "\"logprobs\":1.5}", "field 'logprobs' must be an integer, got 1.5"},
		{GEN "\"lora\":\"x\"}", "field 'lora' must be an array of objects, got string"},
		{GEN "\"lora\":[\"x\"]}", "field 'lora[0]' must be an object, got string"},
		{GEN "\"lora\":[{}]}", "field 'lora[0].name' is required"},
		{GEN "\"lora\":[{\"name\":3}]}", "field 'lora[0].name' must be a string, got integer"},
		{GEN "\"lora\":[{\"name\":\"a\",\"scale\":\"1\"}]}", "field 'lora[0].scale' must be a number, got string"},
		{GEN "\"lora\":[{\"name\":\"a\"},{\"name\":\"a\"}]}", "field 'lora[1].name' repeats adapter 'a'"},
		{GEN "\"speculate\":\"prompt\"}", "field 'speculate' must be an object, got string"},
		{GEN "\"speculate\":{\"mode\":\"lookahead\"}}", "field 'speculate.mode' must be \"off\", \"prompt\" or \"draft\", got \"lookahead\""},
		{GEN "\"speculate\":{\"mode\":true}}", "field 'speculate.mode' must be a string, got boolean"},
		{GEN "\"speculate\":{\"k\":\"4\"}}", "field 'speculate.k' must be an integer, got string"},
		{GEN "\"speculate\":{\"k\":2.5}}", "field 'speculate.k' must be an integer, got 2.5"},
		{GEN "\"speculate\":{\"mode\":\"prompt\",\"model\":\"d.gguf\"}}", "field 'speculate.model' is not supported"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":[\"hi\"]}", "field 'messages[0]' must be an object, got string"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\"}]}", "field 'messages[0].content' is required"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":[{\"content\":\"x\"}]}", "field 'messages[0].role' is required"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":1,\"content\":\"x\"}]}", "field 'messages[0].role' must be a string, got integer"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}", "field 'messages[0].content' must be a string, got array"},
		{"{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"function\",\"content\":\"b\"}]}",
		 "field 'messages[1].role' must be one of system, user, assistant, tool, got \"function\""},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_err(cases[i].line, NXP_E_BAD_REQUEST, cases[i].needle, NULL);
}

static void test_generate_inputs(void **st)
{
	check_err("{\"id\":1,\"op\":\"generate\"}", NXP_E_BAD_REQUEST, "'prompt'", "required");
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":null}", NXP_E_BAD_REQUEST, "'prompt'",
		  "required");
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"b\"}]}",
		  NXP_E_BAD_REQUEST, "exclusive", "'messages'");
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"a\",\"tokens\":[1]}", NXP_E_BAD_REQUEST,
		  "exclusive", "'tokens'");
	check_err("{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"b\"}],\"tokens\":[1]}",
		  NXP_E_BAD_REQUEST, "exclusive", NULL);
	check_err(GEN "\"raw\":true,\"system\":\"s\"}", NXP_E_BAD_REQUEST, "'system'", "'raw'");
	check_err("{\"id\":1,\"op\":\"generate\",\"tokens\":[1],\"raw\":true}", NXP_E_BAD_REQUEST,
		  "'raw'", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"tokens\":[1],\"system\":\"s\"}", NXP_E_BAD_REQUEST,
		  "'system'", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"messages\":[]}", NXP_E_OUT_OF_RANGE, "'messages'",
		  "got 0");
	check_err("{\"id\":1,\"op\":\"generate\",\"tokens\":[]}", NXP_E_OUT_OF_RANGE, "'tokens'",
		  "got 0");
}

static void test_generate_ranges(void **st)
{
	check_err(GEN "\"max_tokens\":0}", NXP_E_OUT_OF_RANGE,
		  "field 'max_tokens' must be at least 1 (more than 512 is taken as 512)", "got 0");
	check_err(GEN "\"max_tokens\":-1}", NXP_E_OUT_OF_RANGE, "'max_tokens'", "got -1");
	check_err(GEN "\"speculate\":{\"k\":0}}", NXP_E_OUT_OF_RANGE, "'speculate.k'", "got 0");
	check_err(GEN "\"speculate\":{\"k\":17}}", NXP_E_OUT_OF_RANGE, "'speculate.k'", "got 17");
	check_err(GEN "\"max_tokens\":1e300}", NXP_E_OUT_OF_RANGE, "'max_tokens'", "1e+300");
	check_err(GEN "\"temperature\":-1}", NXP_E_OUT_OF_RANGE, "'temperature'", "got -1");
	check_err(GEN "\"temperature\":-0.0001}", NXP_E_OUT_OF_RANGE, "'temperature'", NULL);
	check_err(GEN "\"temperature\":1e39}", NXP_E_OUT_OF_RANGE, "'temperature'", "32-bit float");
	check_err(GEN "\"top_p\":0}", NXP_E_OUT_OF_RANGE, "'top_p'", "got 0");
	check_err(GEN "\"top_p\":1.5}", NXP_E_OUT_OF_RANGE, "'top_p'", "got 1.5");
	check_err(GEN "\"top_p\":-0.5}", NXP_E_OUT_OF_RANGE, "'top_p'", NULL);
	check_err(GEN "\"min_p\":1.01}", NXP_E_OUT_OF_RANGE, "'min_p'", "1.01");
	check_err(GEN "\"min_p\":-1}", NXP_E_OUT_OF_RANGE, "'min_p'", NULL);
	check_err(GEN "\"repeat_penalty\":0}", NXP_E_OUT_OF_RANGE, "'repeat_penalty'", "got 0");
	check_err(GEN "\"repeat_penalty\":-2}", NXP_E_OUT_OF_RANGE, "'repeat_penalty'", NULL);
	check_err(GEN "\"repeat_last_n\":-1}", NXP_E_OUT_OF_RANGE, "'repeat_last_n'", "got -1");
	check_err(GEN "\"top_k\":-1}", NXP_E_OUT_OF_RANGE, "'top_k'", "got -1");
	check_err(GEN "\"top_k\":4294967296}", NXP_E_OUT_OF_RANGE, "'top_k'", NULL);
	check_err(GEN "\"seed\":-1}", NXP_E_OUT_OF_RANGE, "'seed'", "got -1");
	check_err(GEN "\"logprobs\":21}", NXP_E_OUT_OF_RANGE, "'logprobs'", "got 21");
	check_err(GEN "\"logprobs\":-1}", NXP_E_OUT_OF_RANGE, "'logprobs'", NULL);
	check_err(GEN "\"lora\":[{\"name\":\"a\",\"scale\":1e300}]}", NXP_E_OUT_OF_RANGE,
		  "'lora[0].scale'", NULL);
	check_err(GEN "\"lora\":[{\"name\":\"\"}]}", NXP_E_OUT_OF_RANGE, "'lora[0].name'", "got 0");
	check_err(GEN "\"lora\":[{\"name\":\"a\"},{\"name\":\"b\"},{\"name\":\"c\"},{\"name\":\"d\"},"
		      "{\"name\":\"e\"},{\"name\":\"f\"},{\"name\":\"g\"},{\"name\":\"h\"},{\"name\":\"i\"}]}",
		  NXP_E_OUT_OF_RANGE, "'lora'", "got 9");
	/* Token ids outside the vocabulary (n_vocab 1000). */
	check_err("{\"id\":1,\"op\":\"generate\",\"tokens\":[1,-1]}", NXP_E_OUT_OF_RANGE,
		  "field 'tokens[1]' must be in 0..999", "got -1");
	check_err("{\"id\":1,\"op\":\"generate\",\"tokens\":[1000]}", NXP_E_OUT_OF_RANGE,
		  "'tokens[0]'", "got 1000");
	check_err("{\"id\":1,\"op\":\"generate\",\"tokens\":[4294967297]}", NXP_E_OUT_OF_RANGE,
		  "'tokens[0]'", "got 4294967297");
	/* More prompt tokens than the context (n_ctx 64). */
	char line[1024];
	int k = sprintf(line, "{\"id\":1,\"op\":\"generate\",\"tokens\":[");
	for (int i = 0; i < 65; i++)
		k += sprintf(line + k, i ? ",%d" : "%d", i);
	strcpy(line + k, "]}");
	check_err(line, NXP_E_CONTEXT_OVERFLOW, "'tokens'", "65");
	/* Stop strings: at most 8, each 1..256 bytes. */
	check_err(GEN "\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}",
		  NXP_E_OUT_OF_RANGE, "field 'stop' must have at most 8 entries", "got 9");
	check_err(GEN "\"stop\":[\"\"]}", NXP_E_OUT_OF_RANGE, "'stop[0]'", "got 0");
	char longstop[400];
	snprintf(longstop, sizeof(longstop), GEN "\"stop\":[\"a\",\"%0257d\"]}", 0);
	check_err(longstop, NXP_E_OUT_OF_RANGE, "'stop[1]'", "got 257");
}

static void test_other_ops_errors(void **st)
{
	check_err("{\"id\":1,\"op\":\"tokenize\"}", NXP_E_BAD_REQUEST, "'text'", "required");
	check_err("{\"id\":1,\"op\":\"tokenize\",\"text\":5}", NXP_E_BAD_REQUEST,
		  "field 'text' must be a string, got integer", NULL);
	check_err("{\"id\":1,\"op\":\"tokenize\",\"text\":\"a\",\"special\":\"yes\"}", NXP_E_BAD_REQUEST,
		  "field 'special' must be a boolean, got string", NULL);
	check_err("{\"id\":1,\"op\":\"tokenize\",\"text\":\"a\",\"add_bos\":0}", NXP_E_BAD_REQUEST,
		  "field 'add_bos' must be a boolean, got integer", NULL);
	check_err("{\"id\":1,\"op\":\"detokenize\"}", NXP_E_BAD_REQUEST, "'tokens'", "required");
	check_err("{\"id\":1,\"op\":\"detokenize\",\"tokens\":\"x\"}", NXP_E_BAD_REQUEST,
		  "field 'tokens' must be an array", NULL);
	check_err("{\"id\":1,\"op\":\"detokenize\",\"tokens\":[5,null]}", NXP_E_BAD_REQUEST,
		  "field 'tokens[1]' must be an integer, got null", NULL);
	check_err("{\"id\":1,\"op\":\"detokenize\",\"tokens\":[5,1000]}", NXP_E_OUT_OF_RANGE,
		  "'tokens[1]'", "got 1000");
	check_err("{\"id\":1,\"op\":\"detokenize\",\"tokens\":[-7]}", NXP_E_OUT_OF_RANGE, "'tokens[0]'",
		  "got -7");
	check_err("{\"id\":1,\"op\":\"cancel\"}", NXP_E_BAD_REQUEST, "'target'", "required");
	check_err("{\"id\":1,\"op\":\"cancel\",\"target\":[]}", NXP_E_BAD_REQUEST,
		  "field 'target' must be a string or an integer, got array", NULL);
}

/* A field nxd does not take is refused by name, wherever it is; an unknown
 * field set to null is absent, as a known one is. */
static void test_unknown_fields_are_refused(void **st)
{
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"temprature\":0}", NXP_E_BAD_REQUEST,
		  "field 'temprature' is not one op 'generate' takes", "temperature");
	check_err("{\"id\":1,\"op\":\"status\",\"verbose\":true}", NXP_E_BAD_REQUEST,
		  "field 'verbose' is not one op 'status' takes", NULL);
	check_err("{\"id\":1,\"op\":\"tokenize\",\"text\":\"a\",\"add_eos\":true}", NXP_E_BAD_REQUEST, "'add_eos'",
		  "add_bos");
	check_err("{\"op\":\"hello\",\"version\":1,\"client\":\"x\"}", NXP_E_BAD_REQUEST, "'client'", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"bob\"}]}",
		  NXP_E_BAD_REQUEST, "field 'messages[0].name' is not one a message takes", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"lora\":[{\"name\":\"a\",\"weight\":1}]}",
		  NXP_E_BAD_REQUEST, "field 'lora[0].weight'", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"tools\":[{\"type\":\"function\",\"function\":"
		  "{\"name\":\"f\",\"parameter\":{}}}]}",
		  NXP_E_BAD_REQUEST, "field 'tools[0].function.parameter'", "parameters");
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"tools\":[{\"function\":{\"name\":\"f\"},\"x\":1}]}",
		  NXP_E_BAD_REQUEST, "field 'tools[0].x'", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"tools\":[{\"function\":{\"name\":\"f\"}}],"
		  "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\",\"args\":1}}}",
		  NXP_E_BAD_REQUEST, "field 'tool_choice.function.args'", NULL);
	check_err("{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
		  "\"function\":{\"name\":\"f\",\"arguments\":{}},\"extra\":1}]}]}",
		  NXP_E_BAD_REQUEST, "field 'messages[0].tool_calls[0].extra'", NULL);
	struct nxp_request r;
	parse_ok("{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"temprature\":null}", &r);
	nxp_request_free(&r);
	parse_ok("{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"index\":0,"
		 "\"id\":\"c\",\"type\":\"function\",\"function\":{\"index\":0,\"name\":\"f\",\"arguments\":\"{}\"}}]},"
		 "{\"role\":\"tool\",\"content\":\"1\",\"tool_call_id\":\"c\"}]}",
		 &r);
	nxp_request_free(&r);
}

/* The id comes back even when the rest of the request is wrong. */
static void test_id_kept_on_error(void **st)
{
	struct nxp_request r;
	struct nxp_error e;
	const char *line = "{\"id\":\"req-7\",\"op\":\"generate\",\"prompt\":\"x\",\"max_tokens\":0}";
	assert_int_equal(nxp_parse(line, strlen(line), &LIM, &r, &e), -1);
	assert_int_equal(e.code, NXP_E_OUT_OF_RANGE);
	assert_string_equal(r.id, "\"req-7\"");
	nxp_request_free(&r);
	assert_string_equal(r.id, "\"req-7\"");
	line = "{\"id\":42,\"op\":\"nope\"}";
	assert_int_equal(nxp_parse(line, strlen(line), &LIM, &r, &e), -1);
	assert_string_equal(r.id, "42");
	nxp_request_free(&r);
	line = "{\"op\":\"nope\"}";
	assert_int_equal(nxp_parse(line, strlen(line), &LIM, &r, &e), -1);
	assert_string_equal(r.id, "null");
	nxp_request_free(&r);
	/* Error found while copying messages: what was copied is freed (ASan/valgrind). */
	line = "{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
	       "{\"role\":\"user\",\"content\":\"b\"},{\"role\":\"x\",\"content\":\"c\"}],"
	       "\"stop\":[\"a\",\"b\",3]}";
	assert_int_equal(nxp_parse(line, strlen(line), &LIM, &r, &e), -1);
	nxp_request_free(&r);
}

// --- valid requests

static void test_generate_full(void **st)
{
	struct nxp_request r;
	parse_ok("{\"id\":\"g1\",\"op\":\"generate\",\"prompt\":\"Hello \\\"world\\\"\",\"system\":\"Be brief.\","
		 "\"max_tokens\":20,\"temperature\":0,\"top_k\":5,\"top_p\":0.5,\"min_p\":0.1,"
		 "\"repeat_penalty\":1.1,\"repeat_last_n\":32,\"seed\":9007199254740993,"
		 "\"stop\":[\"\\n\\n\",\"User:\"],\"ignore_eos\":true,\"stream\":true,\"logprobs\":3,"
		 "\"lora\":[{\"name\":\"style\",\"scale\":0.5},{\"name\":\"b\"}]}\r\n",
		 &r);
	assert_int_equal(r.op, NXP_OP_GENERATE);
	assert_string_equal(r.id, "\"g1\"");
	struct nxp_generate *g = &r.u.gen;
	assert_int_equal(g->input, NXP_IN_PROMPT);
	assert_string_equal(g->prompt, "Hello \"world\"");
	assert_string_equal(g->system, "Be brief.");
	assert_false(g->raw);
	assert_int_equal(g->max_tokens, 20);
	assert_true(g->sampling.temperature == 0.0f);
	assert_int_equal(g->sampling.top_k, 5);
	assert_true(g->sampling.top_p == 0.5f);
	assert_true(g->sampling.min_p == 0.1f);
	assert_true(g->sampling.repeat_penalty == 1.1f);
	assert_int_equal(g->sampling.repeat_last_n, 32);
	assert_true(g->has_seed);
	assert_true(g->sampling.seed == 9007199254740993ull); /* above 2^53: kept exact */
	assert_int_equal(g->n_stop, 2);
	assert_string_equal(g->stop[0], "\n\n");
	assert_string_equal(g->stop[1], "User:");
	assert_true(g->ignore_eos);
	assert_true(g->stream); /* stream false below */
	assert_int_equal(g->sampling.n_logprobs, 3);
	assert_int_equal(g->n_lora, 2);
	assert_string_equal(g->lora[0].name, "style");
	assert_true(g->lora[0].scale == 0.5f);
	assert_string_equal(g->lora[1].name, "b");
	assert_true(g->lora[1].scale == 1.0f);
	assert_int_equal(g->spec_mode, NXP_SPEC_DEFAULT); /* absent: the daemon's */
	assert_int_equal(g->spec_k, 0);
	nxp_request_free(&r);
	parse_ok(GEN "\"speculate\":{\"mode\":\"prompt\",\"k\":16}}", &r);
	assert_int_equal(r.u.gen.spec_mode, NXP_SPEC_PROMPT);
	assert_int_equal(r.u.gen.spec_k, 16);
	nxp_request_free(&r);
	parse_ok(GEN "\"speculate\":{\"mode\":\"off\"}}", &r);
	assert_int_equal(r.u.gen.spec_mode, NXP_SPEC_OFF);
	nxp_request_free(&r);
	parse_ok(GEN "\"stream\":false}", &r);
	assert_false(r.u.gen.stream);
	nxp_request_free(&r);
	parse_ok(GEN "\"speculate\":{\"mode\":\"draft\",\"k\":3}}", &r);
	assert_int_equal(r.u.gen.spec_mode, NXP_SPEC_DRAFT);
	assert_int_equal(r.u.gen.spec_k, 3);
	nxp_request_free(&r);
	assert_int_equal(r.op, NXP_OP_NONE);
	nxp_request_free(&r); /* twice is harmless */
}

static void test_generate_defaults(void **st)
{
	struct nxp_request r;
	/* Nulls count as absent; integral reals are integers. */
	parse_ok("{\"id\":7,\"op\":\"generate\",\"prompt\":\"x\",\"raw\":true,\"temperature\":null,"
		 "\"stop\":null,\"max_tokens\":null,\"top_k\":3.0}",
		 &r);
	struct nxp_generate *g = &r.u.gen;
	struct nx_sample_params d = nx_sample_params_default();
	assert_true(g->raw);
	assert_null(g->system);
	assert_true(g->stream);
	assert_false(g->ignore_eos);
	assert_false(g->has_seed);
	assert_int_equal(g->max_tokens, NXP_DEFAULT_MAX_TOKENS);
	assert_true(g->sampling.temperature == d.temperature);
	assert_true(g->sampling.top_p == d.top_p);
	assert_true(g->sampling.min_p == d.min_p);
	assert_int_equal(g->sampling.top_k, 3);
	assert_int_equal(g->sampling.n_logprobs, 0);
	assert_int_equal(g->n_stop, 0);
	assert_int_equal(g->n_lora, 0);
	assert_null(g->lora);
	nxp_request_free(&r);

	/* The default max_tokens never exceeds the limit; a single stop string is a list of one. */
	struct nxp_limits lim = {.n_vocab = 10, .n_ctx = 100, .max_tokens = 0};
	struct nxp_error e;
	const char *line = "{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"stop\":\"END\"}";
	assert_int_equal(nxp_parse(line, strlen(line), &lim, &r, &e), 0);
	assert_int_equal(r.u.gen.max_tokens, 100);
	assert_int_equal(r.u.gen.n_stop, 1);
	assert_string_equal(r.u.gen.stop[0], "END");
	nxp_request_free(&r);
	/* More than the limit is the limit (as OpenAI caps at the context), never a refusal. */
	line = "{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"max_tokens\":101}";
	assert_int_equal(nxp_parse(line, strlen(line), &lim, &r, &e), 0);
	assert_int_equal(r.u.gen.max_tokens, 100);
	nxp_request_free(&r);
	line = "{\"id\":1,\"op\":\"generate\",\"prompt\":\"x\",\"max_tokens\":9223372036854775807}";
	assert_int_equal(nxp_parse(line, strlen(line), &lim, &r, &e), 0);
	assert_int_equal(r.u.gen.max_tokens, 100);
	nxp_request_free(&r);
	/* Without limits, token ids are only checked against int32. */
	line = "{\"id\":1,\"op\":\"generate\",\"tokens\":[2147483647]}";
	assert_int_equal(nxp_parse(line, strlen(line), NULL, &r, &e), 0);
	assert_int_equal(r.u.gen.tokens[0], 2147483647);
	nxp_request_free(&r);
}

static void test_generate_messages_tokens(void **st)
{
	struct nxp_request r;
	parse_ok("{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
		 "{\"role\":\"user\",\"content\":\"caf\\u00e9 \xf0\x9f\x98\x80\"},{\"role\":\"assistant\",\"content\":\"\"}]}",
		 &r);
	struct nxp_generate *g = &r.u.gen;
	assert_int_equal(g->input, NXP_IN_MESSAGES);
	assert_int_equal(g->n_messages, 3);
	assert_int_equal(g->messages[0].role, NXP_ROLE_SYSTEM);
	assert_string_equal(g->messages[0].content, "S");
	assert_int_equal(g->messages[1].role, NXP_ROLE_USER);
	assert_string_equal(g->messages[1].content, "caf\xc3\xa9 \xf0\x9f\x98\x80");
	assert_int_equal(g->messages[2].role, NXP_ROLE_ASSISTANT);
	assert_string_equal(g->messages[2].content, "");
	assert_null(g->prompt);
	nxp_request_free(&r);

	parse_ok("{\"id\":1,\"op\":\"generate\",\"tokens\":[0,1,999,2.0],\"max_tokens\":512}", &r);
	assert_int_equal(r.u.gen.input, NXP_IN_TOKENS);
	assert_int_equal(r.u.gen.n_tokens, 4);
	assert_int_equal(r.u.gen.tokens[0], 0);
	assert_int_equal(r.u.gen.tokens[2], 999);
	assert_int_equal(r.u.gen.tokens[3], 2);
	assert_int_equal(r.u.gen.max_tokens, 512);
	nxp_request_free(&r);
}

static void test_other_ops(void **st)
{
	struct nxp_request r;
	parse_ok("{\"op\":\"hello\",\"version\":1}", &r);
	assert_int_equal(r.op, NXP_OP_HELLO);
	assert_false(r.has_id);
	assert_string_equal(r.id, "null");
	assert_int_equal(r.version, 1);
	nxp_request_free(&r);

	parse_ok("{\"id\":-3,\"op\":\"status\"}", &r);
	assert_int_equal(r.op, NXP_OP_STATUS);
	assert_string_equal(r.id, "-3");
	nxp_request_free(&r);

	parse_ok("{\"id\":\"t\",\"op\":\"tokenize\",\"text\":\"<|im_start|>hi\"}", &r);
	assert_int_equal(r.op, NXP_OP_TOKENIZE);
	assert_string_equal(r.u.tok.text, "<|im_start|>hi");
	assert_false(r.u.tok.special);
	assert_int_equal(r.u.tok.add_bos, -1);
	nxp_request_free(&r);
	parse_ok("{\"id\":\"t\",\"op\":\"tokenize\",\"text\":\"\",\"special\":true,\"add_bos\":false}", &r);
	assert_true(r.u.tok.special);
	assert_int_equal(r.u.tok.add_bos, 0);
	nxp_request_free(&r);

	parse_ok("{\"id\":\"d\",\"op\":\"detokenize\",\"tokens\":[]}", &r);
	assert_int_equal(r.op, NXP_OP_DETOKENIZE);
	assert_int_equal(r.u.detok.n_tokens, 0);
	nxp_request_free(&r);
	parse_ok("{\"id\":\"d\",\"op\":\"detokenize\",\"tokens\":[5,6]}", &r);
	assert_int_equal(r.u.detok.n_tokens, 2);
	assert_int_equal(r.u.detok.tokens[1], 6);
	nxp_request_free(&r);
}

/* Ids are echoed as canonical JSON text, so a cancel target compares equal
 * to the id it names whatever escapes either used. */
static void test_id_canonical(void **st)
{
	struct nxp_request a, b;
	parse_ok("{\"id\":\"caf\\u00e9 \\\"q\\\" \\/ \\u0001\",\"op\":\"status\"}", &a);
	parse_ok("{\"id\":9,\"op\":\"cancel\",\"target\":\"caf\xc3\xa9 \\\"q\\\" / \\u0001\"}", &b);
	assert_string_equal(a.id, "\"caf\xc3\xa9 \\\"q\\\" / \\u0001\"");
	assert_string_equal(a.id, b.u.cancel.target);
	nxp_request_free(&a);
	nxp_request_free(&b);
	parse_ok("{\"id\":9223372036854775807,\"op\":\"cancel\",\"target\":-9223372036854775808}", &a);
	assert_string_equal(a.id, "9223372036854775807");
	assert_string_equal(a.u.cancel.target, "-9223372036854775808");
	nxp_request_free(&a);
	parse_ok("{\"id\":\"\",\"op\":\"status\"}", &a);
	assert_string_equal(a.id, "\"\"");
	nxp_request_free(&a);
}

// --- encoders

static json_t *load_line(const char *buf, size_t n)
{
	assert_true(n > 0);
	assert_int_equal(buf[n - 1], '\n');
	assert_null(memchr(buf, '\n', n - 1)); /* exactly one line */
	json_error_t je;
	json_t *j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
	if (!j) {
		print_error("line does not parse: %s: %.*s\n", je.text, (int)n, buf);
		fail();
	}
	assert_true(json_is_object(j));
	return j;
}

static const char *jstr(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	assert_non_null(v);
	assert_true(json_is_string(v));
	return json_string_value(v);
}

static long long jint(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	assert_non_null(v);
	assert_true(json_is_integer(v));
	return json_integer_value(v);
}

static void test_json_str_tricky(void **st)
{
#define S(lit) lit, sizeof(lit) - 1
	static const struct {
		const char *in;
		size_t len;
		const char *decoded; /* what a JSON reader must see */
	} cases[] = {
		{S("plain"), "plain"},
		{S("q\"b\\s/"), "q\"b\\s/"},
		{S("\n\r\t\b\f\x01\x1f\x7f"), "\n\r\t\b\f\x01\x1f\x7f"},
		{S("a\0b"), NULL}, /* NUL: checked separately */
		{S("\xf0\x9f\x98\x80 caf\xc3\xa9 \xe2\x82\xac \xf4\x8f\xbf\xbf"),
		 "\xf0\x9f\x98\x80 caf\xc3\xa9 \xe2\x82\xac \xf4\x8f\xbf\xbf"},
		{S("a\xff" "b"), "a\xef\xbf\xbd" "b"},              /* invalid byte */
		{S("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd"},        /* truncated sequence */
		{S("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd"},        /* overlong '/' */
		{S("\xe0\x80\xaf"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong */
		{S("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate U+D800 */
		{S("\xf4\x90\x80\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
		{S("\xf5"), "\xef\xbf\xbd"},
		{S("\x80x"), "\xef\xbf\xbdx"},                      /* lone continuation */
		{S(""), ""},
	};
#undef S
	char buf[256], line[300];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t n = nxp_json_str(buf, sizeof(buf), cases[i].in, cases[i].len);
		assert_true(n < sizeof(buf));
		assert_int_equal(strlen(buf), n);
		snprintf(line, sizeof(line), "[%s]", buf);
		json_error_t je;
		json_t *j = json_loads(line, JSON_ALLOW_NUL, &je);
		if (!j) {
			print_error("case %zu: %s does not parse: %s\n", i, line, je.text);
			fail();
		}
		json_t *s = json_array_get(j, 0);
		if (cases[i].decoded) {
			assert_int_equal(json_string_length(s), strlen(cases[i].decoded));
			assert_memory_equal(json_string_value(s), cases[i].decoded, json_string_length(s));
		} else {
			assert_int_equal(json_string_length(s), 3);
			assert_memory_equal(json_string_value(s), "a\0b", 3);
		}
		json_decref(j);
	}
	/* Valid UTF-8 passes through unescaped. */
	nxp_json_str(buf, sizeof(buf), "\xf0\x9f\x98\x80", 4);
	assert_string_equal(buf, "\"\xf0\x9f\x98\x80\"");
	nxp_json_str(buf, sizeof(buf), "\x01", 1);
	assert_string_equal(buf, "\"\\u0001\"");
}

/* Random bytes always encode to a JSON string that parses. */
static void test_json_str_random(void **st)
{
	unsigned seed = 12345;
	unsigned char in[64];
	char out[64 * 6 + 8];
	for (int it = 0; it < 20000; it++) {
		size_t len = (size_t)(rand_r(&seed) % 64);
		for (size_t i = 0; i < len; i++) {
			/* bias towards the interesting bytes */
			int r = rand_r(&seed) % 4;
			in[i] = r == 0 ? (unsigned char)(rand_r(&seed) % 32) :
				r == 1 ? (unsigned char)(0x80 + rand_r(&seed) % 0x80) :
					 (unsigned char)rand_r(&seed);
		}
		size_t n = nxp_json_str(out, sizeof(out), (const char *)in, len);
		assert_true(n < sizeof(out));
		json_error_t je;
		json_t *j = json_loadb(out, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
		if (!j) {
			print_error("iteration %d: %s: %s\n", it, je.text, out);
			fail();
		}
		assert_true(json_is_string(j));
		json_decref(j);
	}
}

static void test_enc_token(void **st)
{
	char buf[512];
	size_t n = nxp_enc_token(buf, sizeof(buf), "\"a\\\"b\"", 123, "he said \"hi\"\n", 13, NULL, 0);
	json_t *j = load_line(buf, n);
	assert_string_equal(jstr(j, "id"), "a\"b");
	assert_string_equal(jstr(j, "event"), "token");
	assert_int_equal(jint(j, "token"), 123);
	assert_string_equal(jstr(j, "text"), "he said \"hi\"\n");
	assert_null(json_object_get(j, "logprobs"));
	json_decref(j);

	struct nxp_logprob lp[3] = {
		{.token = 5, .text = "\xe2\x82", .text_len = 2, .logprob = -0.25f},
		{.token = 6, .text = "x", .text_len = 1, .logprob = -INFINITY},
		{.token = 7, .text = NULL, .text_len = 0, .logprob = NAN},
	};
	n = nxp_enc_token(buf, sizeof(buf), "17", 5, "\xf0\x9f\x98\x80", 4, lp, 3);
	j = load_line(buf, n);
	assert_int_equal(jint(j, "id"), 17);
	assert_string_equal(jstr(j, "text"), "\xf0\x9f\x98\x80");
	json_t *a = json_object_get(j, "logprobs");
	assert_int_equal(json_array_size(a), 3);
	assert_int_equal(jint(json_array_get(a, 0), "token"), 5);
	assert_string_equal(jstr(json_array_get(a, 0), "text"), "\xef\xbf\xbd\xef\xbf\xbd");
	assert_true(json_real_value(json_object_get(json_array_get(a, 0), "logprob")) == -0.25);
	assert_true(json_is_null(json_object_get(json_array_get(a, 1), "logprob")));
	assert_true(json_is_null(json_object_get(json_array_get(a, 2), "logprob")));
	assert_string_equal(jstr(json_array_get(a, 2), "text"), "");
	json_decref(j);

	/* snprintf contract: the size needed comes back, the cut line is terminated. */
	char small[10];
	size_t need = nxp_enc_token(small, sizeof(small), "1", 2, "abc", 3, NULL, 0);
	assert_int_equal(need, strlen("{\"id\":1,\"event\":\"token\",\"token\":2,\"text\":\"abc\"}\n"));
	assert_int_equal(strlen(small), sizeof(small) - 1);
	assert_int_equal(nxp_enc_token(NULL, 0, "1", 2, "abc", 3, NULL, 0), need);
	char *exact = malloc(need + 1);
	assert_int_equal(nxp_enc_token(exact, need + 1, "1", 2, "abc", 3, NULL, 0), need);
	assert_string_equal(exact, "{\"id\":1,\"event\":\"token\",\"token\":2,\"text\":\"abc\"}\n");
	free(exact);
}

static void test_enc_done(void **st)
{
	char buf[512];
	int32_t toks[3] = {1, 2, 3};
	struct nxp_done d = {
		.reason = NXP_DONE_STOP, .text = "a\x01" "b\xff", .text_len = 4, .tokens = toks, .n_tokens = 3,
		.prompt_tokens = 10, .cached_tokens = 7, .completion_tokens = 3, .prefill_ms = 12.5, .decode_ms = 30,
		.tokens_per_s = 100.0,
	};
	size_t n = nxp_enc_done(buf, sizeof(buf), "\"x\"", &d);
	json_t *j = load_line(buf, n);
	assert_string_equal(jstr(j, "event"), "done");
	assert_string_equal(jstr(j, "reason"), "stop");
	assert_string_equal(jstr(j, "text"), "a\x01" "b\xef\xbf\xbd");
	json_t *t = json_object_get(j, "tokens");
	assert_int_equal(json_array_size(t), 3);
	assert_int_equal(json_integer_value(json_array_get(t, 2)), 3);
	json_t *u = json_object_get(j, "usage");
	assert_int_equal(jint(u, "prompt_tokens"), 10);
	assert_int_equal(jint(u, "cached_tokens"), 7);
	assert_int_equal(jint(u, "completion_tokens"), 3);
	json_t *tm = json_object_get(j, "timing");
	assert_true(json_number_value(json_object_get(tm, "prefill_ms")) == 12.5);
	assert_true(json_number_value(json_object_get(tm, "decode_ms")) == 30);
	assert_true(json_number_value(json_object_get(tm, "tokens_per_s")) == 100);
	assert_null(json_object_get(j, "logprobs"));
	json_decref(j);

	/* With logprobs: per token, its own and its alternatives (the second token has none) */
	const struct nxp_logprob self[3] = {{1, "a", 1, -0.5f}, {2, "b", 1, -1.0f}, {3, "c", 1, -0.25f}};
	const struct nxp_logprob alts[3] = {{1, "a", 1, -0.5f}, {9, "z", 1, -2.0f}, {3, "c", 1, -0.25f}};
	const int off[4] = {0, 2, 2, 3};
	d.lp_self = self;
	d.lp_alts = alts;
	d.lp_off = off;
	n = nxp_enc_done(buf, sizeof(buf), "\"x\"", &d);
	j = load_line(buf, n);
	json_t *lp = json_object_get(j, "logprobs");
	assert_int_equal(json_array_size(lp), 3);
	assert_string_equal(jstr(json_array_get(lp, 1), "piece"), "b");
	assert_true(json_number_value(json_object_get(json_array_get(lp, 1), "logprob")) == -1.0);
	assert_int_equal(json_array_size(json_object_get(json_array_get(lp, 0), "logprobs")), 2);
	assert_int_equal(json_array_size(json_object_get(json_array_get(lp, 1), "logprobs")), 0);
	assert_int_equal(jint(json_array_get(json_object_get(json_array_get(lp, 0), "logprobs"), 1), "token"), 9);
	json_decref(j);

	/* Streamed: no text, no tokens; every reason has its name. */
	static const char *reasons[] = {"eos", "length", "stop", "cancelled", "shutdown", "tool_calls"};
	for (int r = 0; r <= NXP_DONE_TOOL_CALLS; r++) {
		struct nxp_done s = {.reason = (enum nxp_reason)r, .decode_ms = NAN};
		n = nxp_enc_done(buf, sizeof(buf), "5", &s);
		j = load_line(buf, n);
		assert_string_equal(jstr(j, "reason"), reasons[r]);
		assert_null(json_object_get(j, "text"));
		assert_null(json_object_get(j, "tokens"));
		assert_true(json_is_null(json_object_get(json_object_get(j, "timing"), "decode_ms")));
		json_decref(j);
	}

	/* A big non-streamed answer through the allocating variant. */
	size_t big = 100000, len;
	char *text = malloc(big);
	for (size_t i = 0; i < big; i++)
		text[i] = "ab\"\\\n\x02"[i % 6];
	d.text = text;
	d.text_len = big;
	char *line = nxp_enc_done_alloc("1", &d, &len);
	assert_non_null(line);
	assert_int_equal(strlen(line), len);
	j = load_line(line, len);
	assert_int_equal(json_string_length(json_object_get(j, "text")), big);
	assert_memory_equal(jstr(j, "text"), text, big);
	json_decref(j);
	free(line);
	free(text);
}

static void test_enc_small_events(void **st)
{
	char buf[512];
	int32_t toks[] = {0, 49151, 7};
	size_t n = nxp_enc_tokens(buf, sizeof(buf), "\"t\"", toks, 3);
	json_t *j = load_line(buf, n);
	assert_string_equal(jstr(j, "event"), "tokens");
	assert_int_equal(json_array_size(json_object_get(j, "tokens")), 3);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(j, "tokens"), 1)), 49151);
	json_decref(j);
	n = nxp_enc_tokens(buf, sizeof(buf), "\"t\"", NULL, 0);
	j = load_line(buf, n);
	assert_int_equal(json_array_size(json_object_get(j, "tokens")), 0);
	json_decref(j);

	n = nxp_enc_text(buf, sizeof(buf), "4", "tab\there \\ \"", 12);
	j = load_line(buf, n);
	assert_string_equal(jstr(j, "event"), "text");
	assert_string_equal(jstr(j, "text"), "tab\there \\ \"");
	json_decref(j);

	n = nxp_enc_ok(buf, sizeof(buf), "\"c\"");
	assert_string_equal(buf, "{\"id\":\"c\",\"event\":\"ok\"}\n");

	n = nxp_enc_error(buf, sizeof(buf), NULL, NXP_E_TOO_LARGE, "line \"x\"\n too long");
	j = load_line(buf, n);
	assert_true(json_is_null(json_object_get(j, "id")));
	assert_string_equal(jstr(j, "event"), "error");
	assert_string_equal(jstr(j, "code"), "too_large");
	assert_string_equal(jstr(j, "message"), "line \"x\"\n too long");
	json_decref(j);

	static const char *codes[] = {"parse_error", "too_large", "bad_request", "unknown_op",
				      "out_of_range", "context_overflow", "busy", "not_found",
				      "forbidden", "shutting_down", "unsupported_version", "internal",
				      "invalid_tool_call"};
	assert_int_equal(sizeof(codes) / sizeof(codes[0]), NXP_E_COUNT);
	for (int c = 0; c < NXP_E_COUNT; c++)
		assert_string_equal(nxp_code_name((enum nxp_code)c), codes[c]);

	struct nxp_hello_info h = {.model = "SmolLM2 \"135M\"", .arch = "llama", .n_ctx = 8192,
				   .n_vocab = 49152};
	n = nxp_enc_hello(buf, sizeof(buf), NULL, &h);
	j = load_line(buf, n);
	assert_null(json_object_get(j, "id"));
	assert_string_equal(jstr(j, "event"), "hello");
	assert_int_equal(jint(j, "version"), NXP_VERSION);
	assert_string_equal(jstr(j, "server"), "nxd");
	assert_string_equal(jstr(j, "model"), "SmolLM2 \"135M\"");
	assert_string_equal(jstr(j, "arch"), "llama");
	assert_int_equal(jint(j, "n_ctx"), 8192);
	assert_int_equal(jint(j, "n_vocab"), 49152);
	json_decref(j);
	n = nxp_enc_hello(buf, sizeof(buf), "\"h\"", &h);
	j = load_line(buf, n);
	assert_string_equal(jstr(j, "id"), "h");
	json_decref(j);
}

static void test_enc_status(void **st)
{
	struct nxp_worker_status w[2] = {{.pid = 100, .cpu = 0, .state = "idle", .restarts = 0},
					 {.pid = 101, .cpu = 1, .state = "busy", .restarts = 2}};
	struct nxp_status s = {
		.model = "m", .arch = "llama", .type = "Q4_1", .n_ctx = 2048, .n_vocab = 49152,
		.workers = w, .n_workers = 2, .slots_total = 8, .slots_used = 3, .queued = 1,
		.tokens_served = 1ull << 40, .prompt_tokens_cached = 12345, .seqs_per_step_mean = 2.5, .seqs_per_step_max = 4,
		.tokens_per_s = 55.5, .uptime_s = 3600.25, .steps = 1000, .steps_retried = 1,
	};
	size_t len;
	char *line = nxp_enc_status_alloc("\"s\"", &s, &len);
	json_t *j = load_line(line, len);
	assert_string_equal(jstr(j, "event"), "status");
	assert_string_equal(jstr(j, "model"), "m");
	assert_string_equal(jstr(j, "type"), "Q4_1");
	assert_int_equal(jint(j, "n_ctx"), 2048);
	json_t *ws = json_object_get(j, "workers");
	assert_int_equal(json_array_size(ws), 2);
	assert_int_equal(jint(json_array_get(ws, 1), "pid"), 101);
	assert_int_equal(jint(json_array_get(ws, 1), "cpu"), 1);
	assert_string_equal(jstr(json_array_get(ws, 1), "state"), "busy");
	assert_int_equal(jint(json_array_get(ws, 1), "restarts"), 2);
	json_t *sl = json_object_get(j, "slots");
	assert_int_equal(jint(sl, "total"), 8);
	assert_int_equal(jint(sl, "used"), 3);
	assert_int_equal(jint(sl, "queued"), 1);
	assert_int_equal(jint(j, "tokens_served"), 1ll << 40);
	assert_int_equal(jint(j, "prompt_tokens_cached"), 12345);
	json_t *sps = json_object_get(j, "sequences_per_step");
	assert_true(json_number_value(json_object_get(sps, "mean")) == 2.5);
	assert_int_equal(jint(sps, "max"), 4);
	assert_true(json_number_value(json_object_get(j, "tokens_per_s")) == 55.5);
	assert_true(json_number_value(json_object_get(j, "uptime_s")) == 3600.25);
	assert_int_equal(jint(j, "steps"), 1000);
	assert_int_equal(jint(j, "steps_retried"), 1);
	json_decref(j);
	free(line);

	/* NULL strings become null, not a crash. */
	struct nxp_status empty = {0};
	char buf[512];
	size_t n = nxp_enc_status(buf, sizeof(buf), "1", &empty);
	j = load_line(buf, n);
	assert_true(json_is_null(json_object_get(j, "model")));
	json_decref(j);
}

/* Extreme numbers everywhere still give lines that parse, with the numbers exact. */
static void test_enc_big_numbers(void **st)
{
	struct nxp_worker_status w = {.pid = INT32_MAX, .cpu = INT32_MIN, .state = "busy",
				      .restarts = INT32_MAX};
	struct nxp_status s = {
		.model = "m", .arch = "a", .type = "t", .n_ctx = INT32_MAX, .n_vocab = INT32_MIN,
		.workers = &w, .n_workers = 1, .slots_total = INT32_MIN, .slots_used = INT32_MIN,
		.queued = INT32_MIN, .tokens_served = UINT64_MAX >> 1, .seqs_per_step_mean = -1e300,
		.seqs_per_step_max = INT32_MIN, .tokens_per_s = 1.5e308, .uptime_s = INFINITY,
		.steps = UINT64_MAX >> 1, .steps_retried = UINT64_MAX >> 1,
	};
	char buf[2048];
	size_t n = nxp_enc_status(buf, sizeof(buf), "-9223372036854775808", &s);
	assert_true(n < sizeof(buf));
	json_t *j = load_line(buf, n);
	assert_int_equal(jint(j, "n_vocab"), INT32_MIN);
	assert_int_equal(jint(j, "steps_retried"), (long long)(UINT64_MAX >> 1));
	assert_int_equal(jint(json_object_get(j, "slots"), "queued"), INT32_MIN);
	assert_true(json_number_value(json_object_get(j, "tokens_per_s")) == 1.5e308);
	assert_true(json_is_null(json_object_get(j, "uptime_s")));
	json_decref(j);

	struct nxp_done d = {.reason = NXP_DONE_LENGTH, .prompt_tokens = INT32_MIN,
			     .completion_tokens = INT32_MAX, .prefill_ms = -1e300, .decode_ms = 1e-300,
			     .tokens_per_s = 1.7e308};
	n = nxp_enc_done(buf, sizeof(buf), "\"x\"", &d);
	j = load_line(buf, n);
	assert_int_equal(jint(json_object_get(j, "usage"), "prompt_tokens"), INT32_MIN);
	assert_int_equal(jint(json_object_get(j, "usage"), "completion_tokens"), INT32_MAX);
	json_decref(j);

	struct nxp_logprob lp = {.token = INT32_MIN, .text = "x", .text_len = 1, .logprob = -FLT_MAX};
	n = nxp_enc_token(buf, sizeof(buf), "1", INT32_MAX, "y", 1, &lp, 1);
	j = load_line(buf, n);
	assert_int_equal(jint(j, "token"), INT32_MAX);
	json_decref(j);

	/* Every cut of a line is NUL-terminated inside the buffer and reports the same length. */
	size_t full = nxp_enc_done(buf, sizeof(buf), "\"x\"", &d);
	for (size_t cap = 1; cap <= full + 1; cap++) {
		char small[2048];
		memset(small, 'Z', sizeof(small));
		assert_int_equal(nxp_enc_done(small, cap, "\"x\"", &d), full);
		size_t got = strlen(small);
		assert_int_equal(got, cap - 1 < full ? cap - 1 : full);
		assert_memory_equal(small, buf, got);
		assert_int_equal(small[cap], 'Z'); /* nothing written past cap */
	}
}

/* Ids parsed from requests come back verbatim in every event. */
static double jreal(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	assert_non_null(v);
	assert_true(json_is_real(v));
	return json_real_value(v);
}

static void assert_line(char *line, size_t n, const char *want)
{
	assert_non_null(line);
	assert_string_equal(line, want);
	assert_int_equal(n, strlen(want));
	free(line);
}

static void test_enc_lora_events(void **st)
{
	size_t n = 0;
	char *line;
	/* The lines of docs/protocol.md, byte for byte (with numbers a double holds exactly). */
	struct nxp_adapter_info a = {.name = "sql", .path = "/srv/adapters/sql-r16.gguf", .rank = 16, .alpha = 32,
				     .tensors = 210, .bytes = 20512768, .scale = 1};
	line = nxp_enc_lora_loaded_alloc("1", &a, &n);
	assert_line(line, n,
		    "{\"id\":1,\"event\":\"lora_loaded\",\"adapter\":{\"name\":\"sql\",\"path\":\"/srv/adapters/sql-r16.gguf\","
		    "\"rank\":16,\"alpha\":32.0,\"rslora\":false,\"tensors\":210,\"bytes\":20512768,\"scale\":1.0,"
		    "\"folded\":false,\"in_use\":0,\"busy\":false}}\n");
	struct nxp_fold_info f = {.type = "f16", .scale = 1, .order = 1, .ms = 2210.5, .tensors = 210,
				  .bytes = 166068224};
	line = nxp_enc_lora_folded_alloc("3", "sql", &f, &n);
	assert_line(line, n,
		    "{\"id\":3,\"event\":\"lora_folded\",\"name\":\"sql\",\"type\":\"f16\",\"scale\":1.0,\"tensors\":210,"
		    "\"bytes\":166068224,\"ms\":2210.5,\"order\":1}\n");
	line = nxp_enc_progress_alloc("3", 1536000, 3932160, "fold", &n);
	assert_line(line, n,
		    "{\"id\":3,\"event\":\"progress\",\"done\":1536000,\"total\":3932160,\"stage\":\"fold\"}\n");
	line = nxp_enc_lora_unfolded_alloc("4", "sql", 210, &n);
	assert_line(line, n,
		    "{\"id\":4,\"event\":\"lora_unfolded\",\"name\":\"sql\",\"tensors\":210}\n");

	/* lora_list: a folded and a plain adapter, the stack, a checksum, the job. */
	struct nxp_fold_info f2 = {.type = "keep", .scale = 0.5, .order = 1, .ms = 12.5};
	struct nxp_adapter_info ads[2] = {
		{.name = "a \"q\"", .path = "/x/a", .rank = 8, .alpha = 16, .rslora = true, .tensors = 4, .bytes = 4096,
		 .scale = 0.5, .fold = &f2, .in_use = 0},
		{.name = "b", .path = "/x/b", .rank = 4, .alpha = 4, .tensors = 2, .bytes = (uint64_t)1 << 40,
		 .scale = -2, .in_use = 3, .busy = true},
	};
	const char *folds[] = {"a \"q\""};
	struct nxp_lora_job_info job = {.kind = "report", .adapter = "b", .done = 7, .total = 9};
	struct nxp_lora_list l = {.adapters = ads, .n_adapters = 2, .folds = folds, .n_folds = 1,
				  .checksum = "0123456789abcdef", .job = &job};
	line = nxp_enc_lora_list_alloc("\"l\"", &l, &n);
	assert_non_null(line);
	json_t *j = load_line(line, n);
	free(line);
	assert_string_equal(jstr(j, "id"), "l");
	assert_string_equal(jstr(j, "event"), "lora_list");
	json_t *list = json_object_get(j, "adapters");
	assert_int_equal(json_array_size(list), 2);
	json_t *e0 = json_array_get(list, 0), *e1 = json_array_get(list, 1);
	assert_string_equal(jstr(e0, "name"), "a \"q\"");
	assert_string_equal(jstr(e0, "path"), "/x/a");
	assert_int_equal(jint(e0, "rank"), 8);
	assert_true(jreal(e0, "alpha") == 16.0);
	assert_true(json_is_true(json_object_get(e0, "rslora")));
	assert_int_equal(jint(e0, "tensors"), 4);
	assert_int_equal(jint(e0, "bytes"), 4096);
	assert_true(jreal(e0, "scale") == 0.5);
	json_t *fo = json_object_get(e0, "folded");
	assert_true(json_is_object(fo));
	assert_string_equal(jstr(fo, "type"), "keep");
	assert_true(jreal(fo, "scale") == 0.5);
	assert_int_equal(jint(fo, "order"), 1);
	assert_true(jreal(fo, "ms") == 12.5);
	assert_int_equal(json_object_size(fo), 4);
	assert_int_equal(jint(e0, "in_use"), 0);
	assert_true(json_is_false(json_object_get(e0, "busy")));
	assert_int_equal(json_object_size(e0), 11);
	assert_true(json_is_false(json_object_get(e1, "folded")));
	assert_int_equal(jint(e1, "bytes"), (long long)1 << 40);
	assert_true(jreal(e1, "scale") == -2.0);
	assert_int_equal(jint(e1, "in_use"), 3);
	assert_true(json_is_true(json_object_get(e1, "busy")));
	json_t *fl = json_object_get(j, "folds");
	assert_int_equal(json_array_size(fl), 1);
	assert_string_equal(json_string_value(json_array_get(fl, 0)), "a \"q\"");
	assert_string_equal(jstr(j, "checksum"), "0123456789abcdef");
	json_t *jb = json_object_get(j, "job");
	assert_string_equal(jstr(jb, "kind"), "report");
	assert_string_equal(jstr(jb, "adapter"), "b");
	assert_int_equal(jint(jb, "done"), 7);
	assert_int_equal(jint(jb, "total"), 9);
	json_decref(j);
	/* Nothing loaded, nothing asked: empty arrays, no checksum, no job. */
	struct nxp_lora_list empty = {0};
	line = nxp_enc_lora_list_alloc(NULL, &empty, &n);
	assert_line(line, n, "{\"id\":null,\"event\":\"lora_list\",\"adapters\":[],\"folds\":[]}\n");

	/* lora_report: the report's own members, then cost and folded; the caller's object unchanged. */
	json_t *rep = json_pack("{s:i,s:[s]}", "probe_tokens", 51, "types", "keep");
	struct nxp_lora_cost cost = {.base_ms_per_token = 14.75, .delta_ms_per_token = 1.25,
				     .delta_flops_per_token = 4884480, .threads = 1, .grade_ms = 5120};
	struct nxp_lora_report r = {.name = "sql", .dry_run = true, .report = rep, .cost = &cost, .fold = &f};
	line = nxp_enc_lora_report_alloc("5", &r, &n);
	assert_int_equal(json_object_size(rep), 2);
	assert_line(line, n,
		    "{\"id\":5,\"event\":\"lora_report\",\"name\":\"sql\",\"dry_run\":true,\"report\":{\"probe_tokens\":51,"
		    "\"types\":[\"keep\"],\"cost\":{\"base_ms_per_token\":14.75,\"delta_ms_per_token\":1.25,"
		    "\"delta_flops_per_token\":4884480,\"threads\":1,\"grade_ms\":5120.0},"
		    "\"folded\":{\"type\":\"f16\",\"ms\":2210.5}}}\n");
	r = (struct nxp_lora_report){.name = "sql", .report = rep};
	line = nxp_enc_lora_report_alloc("5", &r, &n);
	assert_non_null(line);
	j = load_line(line, n);
	free(line);
	assert_true(json_is_false(json_object_get(j, "dry_run")));
	json_t *jr = json_object_get(j, "report");
	assert_int_equal(jint(jr, "probe_tokens"), 51);
	assert_null(json_object_get(jr, "cost"));
	assert_null(json_object_get(jr, "folded"));
	json_decref(j);
	json_decref(rep);
}

static void test_id_echo(void **st)
{
	static const char *ids[] = {"12", "-1", "\"abc\"", "\"\\u00e9\\\"\\n\"", "\"\xf0\x9f\x98\x80\""};
	static const char *want[] = {"12", "-1", "\"abc\"", "\"\xc3\xa9\\\"\\n\"", "\"\xf0\x9f\x98\x80\""};
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		char line[256], buf[256];
		struct nxp_request r;
		snprintf(line, sizeof(line), "{\"id\":%s,\"op\":\"status\"}", ids[i]);
		parse_ok(line, &r);
		assert_string_equal(r.id, want[i]);
		size_t n = nxp_enc_ok(buf, sizeof(buf), r.id);
		json_t *j = load_line(buf, n);
		json_t *orig = json_loads(ids[i], JSON_DECODE_ANY, NULL);
		assert_true(json_equal(json_object_get(j, "id"), orig));
		json_decref(orig);
		json_decref(j);
		nxp_request_free(&r);
	}
}

/* Mutated requests never crash the parser and always give a known code. */
static void test_parse_mutations(void **st)
{
	static const char *seeds[] = {
		GEN "\"max_tokens\":20,\"temperature\":0.5,\"stop\":[\"a\"],\"lora\":[{\"name\":\"x\"}]}",
		"{\"id\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
		"{\"id\":1,\"op\":\"generate\",\"tokens\":[1,2,3],\"logprobs\":2}",
		"{\"id\":\"x\",\"op\":\"detokenize\",\"tokens\":[1,2]}",
		"{\"id\":2,\"op\":\"cancel\",\"target\":\"x\"}",
	};
	unsigned seed = 777;
	char buf[512];
	for (int it = 0; it < 20000; it++) {
		const char *s = seeds[it % 5];
		size_t n = strlen(s);
		memcpy(buf, s, n);
		int muts = 1 + rand_r(&seed) % 4;
		for (int m = 0; m < muts; m++) {
			size_t pos = (size_t)rand_r(&seed) % n;
			static const char pick[] = "{}[]\",:0-1e.9 \\ntfu\x80\xff";
			buf[pos] = rand_r(&seed) % 3 ? pick[rand_r(&seed) % (sizeof(pick) - 1)] :
						       (char)rand_r(&seed);
		}
		struct nxp_request r;
		struct nxp_error e = {.code = NXP_E_COUNT};
		int rc = nxp_parse(buf, n, &LIM, &r, &e);
		if (rc) {
			assert_true(e.code < NXP_E_COUNT);
			assert_true(e.msg[0] != '\0');
		}
		assert_true(strlen(r.id) < NXP_ID_MAX);
		nxp_request_free(&r);
	}
}

// --- documented limits (docs/protocol.md), each at its value and one past it

/* A malloc'd string: head, then n copies of unit joined by sep, then tail. */
static char *repeat(const char *head, const char *unit, const char *sep, size_t n, const char *tail)
{
	size_t len = strlen(head) + n * (strlen(unit) + strlen(sep)) + strlen(tail) + 1;
	char *s = malloc(len), *p = s;
	p = stpcpy(p, head);
	for (size_t i = 0; i < n; i++)
		p = stpcpy(stpcpy(p, i ? sep : ""), unit);
	strcpy(p, tail);
	return s;
}

static void check_ok_(char *line, const char *file, int lineno)
{
	struct nxp_request r;
	parse_ok_(line, &r, file, lineno);
	nxp_request_free(&r);
	free(line);
}
#define check_ok(line) check_ok_(line, __FILE__, __LINE__)

static void check_err_free_(char *line, enum nxp_code code, const char *n1, const char *n2, const char *file,
			    int lineno)
{
	check_err_(line, code, n1, n2, file, lineno);
	free(line);
}
#define check_err_free(line, code, n1, n2) check_err_free_(line, code, n1, n2, __FILE__, __LINE__)

/* "Nesting deeper than 1024 levels gives parse_error": levels of arrays and
 * objects, the request object itself the first; whatever is innermost. */
static void test_depth_limit(void **st)
{
	static const char *inner[] = {"", "1", "\"s\"", "{}", "[]", "null"};
	for (size_t i = 0; i < sizeof(inner) / sizeof(inner[0]); i++) {
		/* an innermost container is a level too */
		size_t extra = inner[i][0] == '{' || inner[i][0] == '[';
		size_t arrays = 1024 - 1 - extra;
		/* at the limit it parses: then 'x' is refused as a field status does not take, not as too deep */
		char *head = repeat("{\"id\":1,\"op\":\"status\",\"x\":", "[", "", arrays, inner[i]);
		check_err_free(repeat(head, "]", "", arrays, "}"), NXP_E_BAD_REQUEST, "field 'x' is not one", NULL);
		free(head);
		head = repeat("{\"id\":1,\"op\":\"status\",\"x\":", "[", "", arrays + 1, inner[i]);
		check_err_free(repeat(head, "]", "", arrays + 1, "}"), NXP_E_PARSE_ERROR, "deeper than 1024 levels",
			       NULL);
		free(head);
	}
	/* Brackets inside strings are text, not nesting. */
	char *text = repeat("{\"id\":1,\"op\":\"tokenize\",\"text\":\"", "[{", "", 3000, "\\\"]\"}");
	check_ok(text);
	/* Objects count as arrays do. */
	char *head = repeat("{\"id\":1,\"op\":\"status\",\"x\":", "{\"a\":", "", 1024, "1");
	check_err_free(repeat(head, "}", "", 1024, "}"), NXP_E_PARSE_ERROR, "deeper than 1024", NULL);
	free(head);
	head = repeat("{\"id\":1,\"op\":\"status\",\"x\":", "{\"a\":", "", 1023, "1");
	check_err_free(repeat(head, "}", "", 1023, "}"), NXP_E_BAD_REQUEST, "field 'x' is not one", NULL);
	free(head);
}

/* Every number field stored as a float: its range is checked on the value
 * sent (a negative value is negative however small), and a value a 32-bit
 * float cannot hold (too big, or so small it would become 0) is refused as
 * out of range, saying so. */
static void test_float_fields(void **st)
{
	check_err(GEN "\"temperature\":-1e-300}", NXP_E_OUT_OF_RANGE,
		  "field 'temperature' must be >= 0 (0 is greedy), got -1e-300", NULL);
	check_err(GEN "\"min_p\":-1e-300}", NXP_E_OUT_OF_RANGE, "field 'min_p' must be in [0, 1], got -1e-300",
		  NULL);
	check_err(GEN "\"top_p\":1.0000000001}", NXP_E_OUT_OF_RANGE,
		  "field 'top_p' must be in (0, 1], got 1.0000000001", NULL);
	check_err(GEN "\"repeat_penalty\":-1e-300}", NXP_E_OUT_OF_RANGE, "'repeat_penalty' must be > 0", NULL);
	check_err(GEN "\"temperature\":3.5e38}", NXP_E_OUT_OF_RANGE,
		  "field 'temperature' is out of range for a 32-bit float (at most 3.4028235e+38), got 3.5e+38",
		  NULL);
	check_err(GEN "\"repeat_penalty\":1e300}", NXP_E_OUT_OF_RANGE, "'repeat_penalty' is out of range", "1e+300");
	check_err(GEN "\"top_p\":1e-50}", NXP_E_OUT_OF_RANGE,
		  "field 'top_p' is too close to 0 for a 32-bit float (at least 1.4e-45), got 1e-50", NULL);
	check_err(GEN "\"repeat_penalty\":1e-300}", NXP_E_OUT_OF_RANGE, "'repeat_penalty' is too close to 0",
		  NULL);
	check_err(GEN "\"temperature\":1e-50}", NXP_E_OUT_OF_RANGE, "'temperature' is too close to 0", NULL);
	check_err(GEN "\"lora\":[{\"name\":\"a\",\"scale\":3.5e38}]}", NXP_E_OUT_OF_RANGE,
		  "field 'lora[0].scale' is out of range for a 32-bit float", NULL);
	check_err(GEN "\"lora\":[{\"name\":\"a\",\"scale\":-1e-60}]}", NXP_E_OUT_OF_RANGE,
		  "field 'lora[0].scale' is too close to 0", NULL);
	check_err("{\"id\":1,\"op\":\"lora_load\",\"name\":\"a\",\"path\":\"/x\",\"scale\":-3.5e38}",
		  NXP_E_OUT_OF_RANGE, "field 'scale' is out of range for a 32-bit float", "-3.5e+38");
	check_err("{\"id\":1,\"op\":\"lora_fold\",\"name\":\"a\",\"scale\":1e39}", NXP_E_OUT_OF_RANGE,
		  "field 'scale' is out of range", NULL);
	check_err("{\"id\":1,\"op\":\"lora_report\",\"name\":\"a\",\"scale\":1e-46}", NXP_E_OUT_OF_RANGE,
		  "field 'scale' is too close to 0", NULL);

	/* The edges themselves are fine: the largest float, the smallest
	 * nonzero one, zero and -0 where 0 is allowed, a negative LoRA scale. */
	struct nxp_request r;
	parse_ok(GEN "\"temperature\":3.4028234e38,\"top_p\":1.4e-45,\"min_p\":-0.0,\"repeat_penalty\":1e-45,"
		     "\"lora\":[{\"name\":\"a\",\"scale\":-2.5}]}",
		 &r);
	assert_true(r.u.gen.sampling.temperature == FLT_MAX);
	assert_true(r.u.gen.sampling.top_p > 0.0f);
	assert_true(r.u.gen.sampling.min_p == 0.0f);
	assert_true(r.u.gen.sampling.repeat_penalty > 0.0f);
	assert_true(r.u.gen.lora[0].scale == -2.5f);
	nxp_request_free(&r);
	parse_ok(GEN "\"temperature\":-0.0,\"min_p\":0,\"top_p\":1}", &r);
	assert_true(r.u.gen.sampling.temperature == 0.0f);
	nxp_request_free(&r);
	parse_ok("{\"id\":1,\"op\":\"lora_load\",\"name\":\"a\",\"path\":\"/x\",\"scale\":-3.4e38}", &r);
	assert_true(r.u.lora.scale == -3.4e38f);
	nxp_request_free(&r);
}

static void test_documented_limits(void **st)
{
	/* id: at most 255 bytes of JSON text, quotes included */
	check_ok(repeat("{\"op\":\"status\",\"id\":\"", "a", "", 253, "\"}"));
	check_err_free(repeat("{\"op\":\"status\",\"id\":\"", "a", "", 254, "\"}"), NXP_E_OUT_OF_RANGE,
		       "at most 255 bytes", "got 256");
	/* an escape counts as written: \u0001 is 6 bytes */
	check_ok(repeat("{\"op\":\"status\",\"id\":\"", "\\u0001", "", 42, "a\"}"));
	check_err_free(repeat("{\"op\":\"status\",\"id\":\"", "\\u0001", "", 42, "ab\"}"), NXP_E_OUT_OF_RANGE,
		       "'id'", "got 256");
	/* stop: at most 8 strings of 1..256 bytes */
	check_ok(repeat(GEN "\"stop\":[", "\"s\"", ",", 8, "]}"));
	check_err_free(repeat(GEN "\"stop\":[", "\"s\"", ",", 9, "]}"), NXP_E_OUT_OF_RANGE, "at most 8 entries",
		       "got 9");
	check_ok(repeat(GEN "\"stop\":[\"", "x", "", 256, "\"]}"));
	check_err_free(repeat(GEN "\"stop\":[\"", "x", "", 257, "\"]}"), NXP_E_OUT_OF_RANGE,
		       "'stop[0]' must be 1..256 bytes", "got 257");
	/* logprobs: 0..20 */
	check_ok(strdup(GEN "\"logprobs\":20}"));
	check_err(GEN "\"logprobs\":21}", NXP_E_OUT_OF_RANGE, "'logprobs' must be in 0..20", NULL);
	/* messages: 1..4096 */
	const char *msg = "{\"role\":\"user\",\"content\":\"m\"}";
	check_ok(repeat("{\"id\":1,\"op\":\"generate\",\"messages\":[", msg, ",", 4096, "]}"));
	check_err_free(repeat("{\"id\":1,\"op\":\"generate\",\"messages\":[", msg, ",", 4097, "]}"),
		       NXP_E_OUT_OF_RANGE, "'messages' must have 1..4096 entries", "got 4097");
	check_err("{\"id\":1,\"op\":\"generate\",\"messages\":[]}", NXP_E_OUT_OF_RANGE, "'messages'", "got 0");
	/* tokens: 1..n_ctx (64 here) */
	check_ok(repeat("{\"id\":1,\"op\":\"generate\",\"tokens\":[", "7", ",", 64, "]}"));
	check_err_free(repeat("{\"id\":1,\"op\":\"generate\",\"tokens\":[", "7", ",", 65, "]}"),
		       NXP_E_CONTEXT_OVERFLOW, "65 tokens", "context of 64");
	check_err("{\"id\":1,\"op\":\"generate\",\"tokens\":[]}", NXP_E_OUT_OF_RANGE, "'tokens'", "got 0");
	/* max_tokens: at least 1; past the limit (512 here) capped */
	check_ok(strdup(GEN "\"max_tokens\":512}"));
	check_ok(strdup(GEN "\"max_tokens\":513}"));
	check_err(GEN "\"max_tokens\":0}", NXP_E_OUT_OF_RANGE, "must be at least 1", NULL);
	/* seed: 0..2^63-1; past int64 is not JSON the parser takes */
	check_ok(strdup(GEN "\"seed\":9223372036854775807}"));
	check_err(GEN "\"seed\":9223372036854775808}", NXP_E_PARSE_ERROR, "field 'seed'", NULL);
	/* integer fields without a stated maximum: at most 2^31-1 */
	check_ok(strdup(GEN "\"top_k\":2147483647,\"repeat_last_n\":2147483647}"));
	check_err(GEN "\"top_k\":2147483648}", NXP_E_OUT_OF_RANGE, "'top_k' must be in 0..2147483647", NULL);
	check_err(GEN "\"repeat_last_n\":2147483648}", NXP_E_OUT_OF_RANGE, "'repeat_last_n'", NULL);
	/* lora: at most 8 adapters, names 1..128 bytes */
	char *names = repeat(GEN "\"lora\":[", "{\"name\":\"a\"}", ",", 1, "");
	for (int i = 1; i < 9; i++) {
		char one[32];
		snprintf(one, sizeof(one), ",{\"name\":\"a%d\"}", i);
		names = realloc(names, strlen(names) + sizeof(one));
		strcat(names, one);
		char *line = repeat(names, "", "", 0, "]}");
		if (i < 8)
			check_ok(line);
		else
			check_err_free(line, NXP_E_OUT_OF_RANGE, "'lora' must have at most 8 entries", "got 9");
	}
	free(names);
	check_ok(repeat(GEN "\"lora\":[{\"name\":\"", "n", "", 128, "\"}]}"));
	check_err_free(repeat(GEN "\"lora\":[{\"name\":\"", "n", "", 129, "\"}]}"), NXP_E_OUT_OF_RANGE,
		       "'lora[0].name' must be 1..128 bytes", "got 129");
	/* adapter operations: name 1..128 bytes, path 1..4095 bytes */
	check_ok(repeat("{\"id\":1,\"op\":\"lora_unload\",\"name\":\"", "n", "", 128, "\"}"));
	check_err_free(repeat("{\"id\":1,\"op\":\"lora_unload\",\"name\":\"", "n", "", 129, "\"}"),
		       NXP_E_OUT_OF_RANGE, "'name' must be 1..128 bytes", "got 129");
	check_ok(repeat("{\"id\":1,\"op\":\"lora_load\",\"name\":\"a\",\"path\":\"/", "p", "", 4094, "\"}"));
	check_err_free(repeat("{\"id\":1,\"op\":\"lora_load\",\"name\":\"a\",\"path\":\"/", "p", "", 4095, "\"}"),
		       NXP_E_OUT_OF_RANGE, "'path' must be 1..4095 bytes", "got 4096");
	/* lora_report: types 1..8 names of 1..15 bytes, layers 1..1024 ids in 0..1023 */
	check_ok(repeat("{\"id\":1,\"op\":\"lora_report\",\"name\":\"a\",\"types\":[", "\"f16\"", ",", 8, "]}"));
	check_err_free(repeat("{\"id\":1,\"op\":\"lora_report\",\"name\":\"a\",\"types\":[", "\"f16\"", ",", 9, "]}"),
		       NXP_E_OUT_OF_RANGE, "'types' must have 1..8 entries", "got 9");
	check_ok(repeat("{\"id\":1,\"op\":\"lora_fold\",\"name\":\"a\",\"type\":\"", "t", "", 15, "\"}"));
	check_err_free(repeat("{\"id\":1,\"op\":\"lora_fold\",\"name\":\"a\",\"type\":\"", "t", "", 16, "\"}"),
		       NXP_E_OUT_OF_RANGE, "'type' must be 1..15 bytes", "got 16");
	check_ok(repeat("{\"id\":1,\"op\":\"lora_report\",\"name\":\"a\",\"layers\":[", "1023", ",", 1024, "]}"));
	check_err_free(repeat("{\"id\":1,\"op\":\"lora_report\",\"name\":\"a\",\"layers\":[", "0", ",", 1025, "]}"),
		       NXP_E_OUT_OF_RANGE, "'layers' must have 1..1024 entries", "got 1025");
	check_err("{\"id\":1,\"op\":\"lora_report\",\"name\":\"a\",\"layers\":[1024]}", NXP_E_OUT_OF_RANGE,
		  "'layers[0]' must be in 0..1023", NULL);
}

/* The line limit does not count the line end, and "\r\n" is as good as "\n". */
static void test_line_limit_line_ends(void **st)
{
	struct nxp_limits lim = LIM;
	lim.max_line = 64;
	static const char *ends[] = {"\n", "\r\n", ""};
	for (size_t i = 0; i < 3; i++) {
		for (size_t body = 64; body <= 65; body++) {
			char line[80];
			memset(line, ' ', body);
			memcpy(line, "{\"id\":1,\"op\":\"status\"}", 22);
			strcpy(line + body, ends[i]);
			struct nxp_request r;
			struct nxp_error e;
			int rc = nxp_parse(line, strlen(line), &lim, &r, &e);
			if (body == 64) {
				assert_int_equal(rc, 0);
			} else {
				assert_int_equal(rc, -1);
				assert_int_equal(e.code, NXP_E_TOO_LARGE);
				assert_string_equal(e.msg, "request line of 65 bytes is over the limit of 64 bytes");
			}
			nxp_request_free(&r);
		}
	}
}

static void test_socket_path(void **st)
{
	char buf[256];
	setenv("NXD_SOCKET", "/tmp/x/nxd.sock", 1);
	assert_int_equal(nxp_default_socket_path(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/tmp/x/nxd.sock");
	assert_int_equal(nxp_default_socket_path(buf, 5), -1);
	char longp[200];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = '\0';
	setenv("NXD_SOCKET", longp, 1);
	assert_int_equal(nxp_default_socket_path(buf, sizeof(buf)), -1); /* past sun_path */
	unsetenv("NXD_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	assert_int_equal(nxp_default_socket_path(buf, sizeof(buf)), 0);
	if (geteuid() == 0)
		assert_string_equal(buf, "/run/nxd/nxd.sock");
	else
		assert_string_equal(buf, "/run/user/1234/nxd.sock");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_invalid_json),
		cmocka_unit_test(test_deep_nesting),
		cmocka_unit_test(test_not_object),
		cmocka_unit_test(test_too_large),
		cmocka_unit_test(test_op_and_id),
		cmocka_unit_test(test_version),
		cmocka_unit_test(test_generate_wrong_types),
		cmocka_unit_test(test_generate_inputs),
		cmocka_unit_test(test_generate_ranges),
		cmocka_unit_test(test_other_ops_errors),
		cmocka_unit_test(test_unknown_fields_are_refused),
		cmocka_unit_test(test_id_kept_on_error),
		cmocka_unit_test(test_generate_full),
		cmocka_unit_test(test_generate_defaults),
		cmocka_unit_test(test_generate_messages_tokens),
		cmocka_unit_test(test_other_ops),
		cmocka_unit_test(test_id_canonical),
		cmocka_unit_test(test_json_str_tricky),
		cmocka_unit_test(test_json_str_random),
		cmocka_unit_test(test_enc_token),
		cmocka_unit_test(test_enc_done),
		cmocka_unit_test(test_enc_small_events),
		cmocka_unit_test(test_enc_status),
		cmocka_unit_test(test_enc_big_numbers),
		cmocka_unit_test(test_enc_lora_events),
		cmocka_unit_test(test_id_echo),
		cmocka_unit_test(test_parse_mutations),
		cmocka_unit_test(test_depth_limit),
		cmocka_unit_test(test_float_fields),
		cmocka_unit_test(test_documented_limits),
		cmocka_unit_test(test_line_limit_line_ends),
		cmocka_unit_test(test_socket_path),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
