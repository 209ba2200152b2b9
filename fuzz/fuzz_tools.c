/* fuzz_tools.c - libFuzzer target: the reader of a model's tool calls (tok/tools.c) and the JSON-schema check of their arguments (tok/tool_schema.c).
 *
 * Input: byte 0 is a set of flags, the rest is a model's answer:
 *   bits 0, 7 convention: 0 Qwen (<tool_call> blocks), 1 Llama 3 (the whole answer),
 *             2 Mistral ("[TOOL_CALLS] [" lists), 3 Mistral Nemo ("[TOOL_CALLS][")
 *   bits 1-2  tool_choice: 0 auto, 1 required, 2 the named tool get_weather
 *   bit 3     parallel_tool_calls false
 *   bits 4-6  the answer is fed in pieces of this many bytes (0: at once), as tokens come
 * or, with flags 0xff, the rest is "schema\0value": both parsed as JSON and,
 * when the schema passes nx_tool_schema_check, the value validated.
 *
 * Properties, each an abort when broken:
 *   - the result does not depend on how the answer is cut into pieces;
 *   - every call names an offered tool and carries a JSON object;
 *   - an auto answer with no call comes back as its own text, byte for byte;
 *     with calls, the text released is no longer than the answer;
 *   - required / named: an answer the call's grammar (tok/tool_grammar.c)
 *     takes whole is one call the reader takes and its check passes, unless
 *     its JSON repeats a key (the grammar of a tool without parameters takes
 *     any object; the reader refuses repeated keys). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/util.h"
#include "sample/grammar.h"
#include "tok/tools.h"

static const char TOOLS[] =
	"[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
	"\"properties\":{\"city\":{\"type\":\"string\",\"pattern\":\"^[A-Z]\"},\"days\":{\"type\":\"integer\","
	"\"minimum\":1}},\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

static json_t *tools;
static struct nx_vocab_trie *bytes_trie; /* the 256 bytes, and an end of generation */
static const enum nx_tool_style styles[] = { NX_TOOLS_QWEN, NX_TOOLS_LLAMA3, NX_TOOLS_MISTRAL, NX_TOOLS_MISTRAL_TIGHT };
static char *call_gbnf[2][4]; /* [named][style]: the call grammars' text */

static int style_index(int flags)
{
	return (flags & 1) | ((flags >> 6) & 2);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	json_error_t je;
	tools = json_loads(TOOLS, 0, &je);
	if (!tools)
		return 1;
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
	struct nx_err err;
	FUZZ_CHECK(nx_vocab_trie_from_pieces(257, pieces, lens, eog, &bytes_trie, &err) == 0, "trie: %s", err.msg);
	for (int named = 0; named < 2; named++)
		for (int st = 0; st < 4; st++)
			FUZZ_CHECK(nx_tool_grammar(styles[st], tools,
						   named ? NX_TOOL_NAMED : NX_TOOL_REQUIRED, "get_weather", &call_gbnf[named][st],
						   &err) == 0 && call_gbnf[named][st], "tool grammar: %s", err.msg);
	return 0;
}

/* Whether the call grammar of flags' style and choice takes the answer whole
 * (a matcher takes its grammar over: compiled for each answer). */
static bool grammar_takes(int flags, const char *answer, size_t n)
{
	const char *gbnf = call_gbnf[((flags >> 1) & 3) == 2][style_index(flags)];
	struct nx_grammar *g;
	struct nx_gmatch *m;
	struct nx_err err;
	FUZZ_CHECK(nx_grammar_compile(gbnf, strlen(gbnf), &g, &err) == 0, "compile: %s", err.msg);
	FUZZ_CHECK(nx_gmatch_new(g, bytes_trie, &m, &err) == 0, "matcher: %s", err.msg);
	bool ok = nx_gmatch_accept_bytes(m, answer, n) == 0 && nx_gmatch_accepting(m);
	nx_gmatch_free(m);
	return ok;
}

struct outcome {
	char *text;
	size_t len;
	int n_calls;
	char *calls; /* names and arguments, one after another */
	size_t calls_len;
	bool failed;
};

static void add(char **s, size_t *len, const char *p, size_t n)
{
	char *q = realloc(*s, *len + n + 1);
	FUZZ_CHECK(q != NULL, "out of memory");
	if (n)
		memcpy(q + *len, p, n);
	*len += n;
	q[*len] = '\0';
	*s = q;
}

static void run(int flags, const char *answer, size_t n, size_t step, struct outcome *o)
{
	enum nx_tool_style style = styles[style_index(flags)];
	int c = (flags >> 1) & 3;
	enum nx_tool_choice choice = c == 1 ? NX_TOOL_REQUIRED : c == 2 ? NX_TOOL_NAMED : NX_TOOL_AUTO;
	const char *name = choice == NX_TOOL_NAMED ? "get_weather" : NULL;
	char *prefix = choice == NX_TOOL_AUTO ? NULL : nx_tool_prefix(style, name);
	struct nx_toolp p;
	struct nx_err err;
	FUZZ_CHECK(nx_toolp_init(&p, style, tools, choice, name, !(flags & 8), prefix, 1, &err) == 0, "init: %s",
		   err.msg);
	memset(o, 0, sizeof(*o));
	add(&o->text, &o->len, "", 0);
	add(&o->calls, &o->calls_len, "", 0);
	for (size_t i = 0; i < n && !nx_toolp_done(&p); i += step) {
		size_t k = i + step < n ? step : n - i;
		nx_toolp_feed(&p, answer + i, k);
		add(&o->text, &o->len, p.out, p.out_len);
	}
	size_t before = p.out_len;
	nx_toolp_finish(&p);
	add(&o->text, &o->len, p.out ? p.out + before : "", p.out_len - before);
	for (int i = 0; i < p.n_calls; i++) {
		const char *t = p.calls[i].name;
		FUZZ_CHECK(!strcmp(t, "get_weather") || !strcmp(t, "now"), "a call of '%s', not offered", t);
		json_error_t je;
		json_t *a = json_loads(p.calls[i].arguments, 0, &je);
		FUZZ_CHECK(json_is_object(a), "arguments of call %d are not an object: %s", i, p.calls[i].arguments);
		json_decref(a);
		add(&o->calls, &o->calls_len, t, strlen(t) + 1);
		add(&o->calls, &o->calls_len, p.calls[i].arguments, strlen(p.calls[i].arguments) + 1);
	}
	o->n_calls = p.n_calls;
	o->failed = p.failed;
	nx_toolp_free(&p);
	free(prefix);
}

static void schema_case(const uint8_t *data, size_t size)
{
	const char *s = (const char *)data, *nul = memchr(s, '\0', size);
	if (!nul)
		return;
	json_error_t je;
	json_t *schema = json_loadb(s, (size_t)(nul - s), JSON_DECODE_ANY, &je);
	json_t *value = json_loadb(nul + 1, size - (size_t)(nul - s) - 1, JSON_DECODE_ANY, &je);
	struct nx_err err;
	if (schema && value && nx_tool_schema_check(schema, "p", &err) == 0)
		(void)nx_tool_schema_validate(schema, value, &err);
	json_decref(schema);
	json_decref(value);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] == 0xff) {
		schema_case(data + 1, size - 1);
		return 0;
	}
	int flags = data[0];
	const char *answer = (const char *)data + 1;
	size_t n = size - 1, step = (size_t)((flags >> 4) & 7);
	struct outcome whole, cut;
	run(flags, answer, n, n ? n : 1, &whole);
	run(flags, answer, n, step ? step : 1, &cut);
	FUZZ_CHECK(whole.len == cut.len && !memcmp(whole.text, cut.text, whole.len), "the text depends on the pieces");
	FUZZ_CHECK(whole.n_calls == cut.n_calls && whole.calls_len == cut.calls_len &&
			   !memcmp(whole.calls, cut.calls, whole.calls_len) && whole.failed == cut.failed,
		   "the calls depend on the pieces");
	bool auto_choice = ((flags >> 1) & 3) == 0 || ((flags >> 1) & 3) == 3;
	if (auto_choice && whole.n_calls == 0)
		FUZZ_CHECK(whole.len == n && !memcmp(whole.text, answer, n), "an answer without calls lost text");
	if (auto_choice)
		FUZZ_CHECK(whole.len <= n, "more text released than the answer had");
	if (!auto_choice && grammar_takes(flags, answer, n)) {
		/* the call's JSON: the prefix's part of it, then the answer (Qwen: up to the close) */
		enum nx_tool_style style = styles[style_index(flags)];
		char *prefix = nx_tool_prefix(style, ((flags >> 1) & 3) == 2 ? "get_weather" : NULL);
		char *doc = NULL;
		size_t dlen = 0;
		const char *open = strchr(prefix, '{');
		add(&doc, &dlen, open, strlen(open));
		add(&doc, &dlen, answer, n);
		if (style == NX_TOOLS_QWEN)
			dlen -= strlen("\n</tool_call>");
		else if (style != NX_TOOLS_LLAMA3)
			dlen -= strlen("]"); /* Mistral: the list of this one call */
		json_error_t je;
		json_t *strict = json_loadb(doc, dlen, JSON_REJECT_DUPLICATES, &je), *loose = json_loadb(doc, dlen, 0, &je);
		FUZZ_CHECK(loose != NULL, "the grammar took JSON that does not parse: %s", doc);
		json_decref(loose);
		if (strict)
			FUZZ_CHECK(whole.n_calls == 1 && !whole.failed, "the grammar took a call the reader did not: %s (%s)",
				   doc, whole.failed ? "failed" : "no call");
		json_decref(strict);
		free(doc);
		free(prefix);
	}
	free(whole.text);
	free(whole.calls);
	free(cut.text);
	free(cut.calls);
	return 0;
}
