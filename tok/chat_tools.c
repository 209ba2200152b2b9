/* chat_tools.c - conversations with tools rendered as each family's template does (see tools.h), and JSON written as the templates' tojson writes it. */
#include "tok/tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/chat_int.h"

/* Mistral Small 3.1's tool instruction, which its template puts before the
 * system prompt: a template that has tools without it in the shape nxd
 * reads is not guessed at. */
static bool mistral_tool_prompt_ok(enum nx_chat_tmpl t, const char *jinja)
{
	if (t != NX_CHAT_MISTRAL_V7_TEKKEN)
		return !strstr(jinja, "parallel_tool_prompt");
	char *p = NULL;
	bool ok = parse_set_string(jinja, "parallel_tool_prompt", &p);
	free(p);
	return ok;
}

enum nx_tool_style nx_chat_tool_style(enum nx_chat_tmpl t, const char *jinja)
{
	switch (t) {
	case NX_CHAT_LLAMA31:
		return NX_TOOLS_LLAMA3;
	case NX_CHAT_QWEN3:
		return NX_TOOLS_QWEN;
	case NX_CHAT_CHATML:
		/* Qwen2.5's template; SmolLM2's and Qwen2's have no tools */
		if (jinja && strstr(jinja, "<tools>") && strstr(jinja, "<tool_call>") && strstr(jinja, "<tool_response>"))
			return NX_TOOLS_QWEN;
		return NX_TOOLS_NONE;
	case NX_CHAT_MISTRAL_V3:
	case NX_CHAT_MISTRAL_V7_TEKKEN:
		return jinja && has_literal(jinja, "[AVAILABLE_TOOLS] [") && has_literal(jinja, "[TOOL_CALLS] [") &&
			       has_literal(jinja, "[TOOL_RESULTS] {\"content\": ") && mistral_tool_prompt_ok(t, jinja)
			       ? NX_TOOLS_MISTRAL : NX_TOOLS_NONE;
	case NX_CHAT_MISTRAL_V3_TEKKEN:
		return jinja && has_literal(jinja, "[AVAILABLE_TOOLS][") && has_literal(jinja, "[TOOL_CALLS][") &&
			       has_literal(jinja, "[TOOL_RESULTS]{\"content\": ") ? NX_TOOLS_MISTRAL_TIGHT : NX_TOOLS_NONE;
	default:
		return NX_TOOLS_NONE;
	}
}

char *nx_tool_prefix(enum nx_tool_style s, const char *name)
{
	struct nx_sbuf b = { 0 };
	nx_sb_put(&b, "", 0);
	if (s == NX_TOOLS_QWEN)
		nx_sb_str(&b, "<tool_call>\n");
	else if (s == NX_TOOLS_MISTRAL)
		nx_sb_str(&b, "[TOOL_CALLS] [");
	else if (s == NX_TOOLS_MISTRAL_TIGHT)
		nx_sb_str(&b, "[TOOL_CALLS][");
	nx_sb_str(&b, "{\"name\": \"");
	if (name) {
		nx_sb_str(&b, name); /* tool names are [A-Za-z0-9_-] (proto.c) */
		nx_sb_str(&b, s == NX_TOOLS_LLAMA3 ? "\", \"parameters\": " : "\", \"arguments\": ");
	}
	if (b.oom) {
		free(b.s);
		return NULL;
	}
	return b.s;
}

/* --- Python's json.dumps ------------------------------------------------- */

static void json_string_py(struct nx_sbuf *b, const char *s, size_t n)
{
	nx_sb_str(b, "\"");
	size_t run = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		const char *esc = NULL;
		char u[8];
		switch (c) {
		case '"': esc = "\\\""; break;
		case '\\': esc = "\\\\"; break;
		case '\n': esc = "\\n"; break;
		case '\r': esc = "\\r"; break;
		case '\t': esc = "\\t"; break;
		case '\b': esc = "\\b"; break;
		case '\f': esc = "\\f"; break;
		default:
			if (c < 0x20) {
				snprintf(u, sizeof(u), "\\u%04x", c);
				esc = u;
			}
		}
		if (!esc)
			continue;
		nx_sb_put(b, s + run, i - run);
		nx_sb_str(b, esc);
		run = i + 1;
	}
	nx_sb_put(b, s + run, n - run);
	nx_sb_str(b, "\"");
}

/* repr(float): the shortest digits that read back as x, in fixed notation
 * when the decimal exponent is in [-4, 16) (".0" added to an integer), else
 * as d.ddde+XX. */
static void json_real_py(struct nx_sbuf *b, double x)
{
	char e[40], digits[24];
	int exp10 = 0;
	for (int prec = 0; prec < 17; prec++) {
		snprintf(e, sizeof(e), "%.*e", prec, x);
		if (strtod(e, NULL) == x)
			break;
	}
	/* e: [-]d[.ddd]e[+-]XX */
	const char *p = e;
	bool neg = *p == '-';
	if (neg)
		p++;
	size_t nd = 0;
	for (; *p && *p != 'e'; p++)
		if (*p != '.' && nd < sizeof(digits) - 1)
			digits[nd++] = *p;
	digits[nd] = '\0';
	if (*p == 'e')
		exp10 = atoi(p + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		digits[--nd] = '\0';
	char out[64];
	size_t o = 0;
	if (neg)
		out[o++] = '-';
	if (exp10 >= -4 && exp10 < 16) {
		if (exp10 < 0) {
			out[o++] = '0';
			out[o++] = '.';
			for (int k = -1; k > exp10; k--)
				out[o++] = '0';
			for (size_t k = 0; k < nd; k++)
				out[o++] = digits[k];
		} else {
			for (int k = 0; k <= exp10; k++)
				out[o++] = (size_t)k < nd ? digits[k] : '0';
			out[o++] = '.';
			if (nd > (size_t)exp10 + 1)
				for (size_t k = (size_t)exp10 + 1; k < nd; k++)
					out[o++] = digits[k];
			else
				out[o++] = '0';
		}
		out[o] = '\0';
	} else {
		out[o++] = digits[0];
		if (nd > 1) {
			out[o++] = '.';
			for (size_t k = 1; k < nd; k++)
				out[o++] = digits[k];
		}
		snprintf(out + o, sizeof(out) - o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
	}
	nx_sb_str(b, out);
}

static void newline_indent(struct nx_sbuf *b, int indent, int level)
{
	nx_sb_str(b, "\n");
	for (int i = 0; i < indent * level; i++)
		nx_sb_str(b, " ");
}

static void json_py(struct nx_sbuf *b, const json_t *v, int indent, bool compact, int level)
{
	const char *item_sep = compact || indent >= 0 ? "," : ", ", *key_sep = compact ? ":" : ": ";
	char num[32];
	switch (json_typeof(v)) {
	case JSON_OBJECT: {
		if (json_object_size(v) == 0) {
			nx_sb_str(b, "{}");
			break;
		}
		nx_sb_str(b, "{");
		const char *key;
		json_t *val;
		bool first = true;
		json_object_foreach((json_t *)v, key, val) {
			if (!first)
				nx_sb_str(b, item_sep);
			first = false;
			if (indent >= 0)
				newline_indent(b, indent, level + 1);
			json_string_py(b, key, strlen(key));
			nx_sb_str(b, key_sep);
			json_py(b, val, indent, compact, level + 1);
		}
		if (indent >= 0)
			newline_indent(b, indent, level);
		nx_sb_str(b, "}");
		break;
	}
	case JSON_ARRAY: {
		if (json_array_size(v) == 0) {
			nx_sb_str(b, "[]");
			break;
		}
		nx_sb_str(b, "[");
		size_t i;
		json_t *val;
		json_array_foreach(v, i, val) {
			if (i)
				nx_sb_str(b, item_sep);
			if (indent >= 0)
				newline_indent(b, indent, level + 1);
			json_py(b, val, indent, compact, level + 1);
		}
		if (indent >= 0)
			newline_indent(b, indent, level);
		nx_sb_str(b, "]");
		break;
	}
	case JSON_STRING:
		json_string_py(b, json_string_value(v), json_string_length(v));
		break;
	case JSON_INTEGER:
		snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		nx_sb_str(b, num);
		break;
	case JSON_REAL:
		json_real_py(b, json_real_value(v));
		break;
	case JSON_TRUE: nx_sb_str(b, "true"); break;
	case JSON_FALSE: nx_sb_str(b, "false"); break;
	case JSON_NULL: nx_sb_str(b, "null"); break;
	}
}

char *nx_tool_json(const json_t *v, int indent, bool compact)
{
	struct nx_sbuf b = { 0 };
	nx_sb_put(&b, "", 0);
	json_py(&b, v, indent, compact, 0);
	if (b.oom) {
		free(b.s);
		return NULL;
	}
	return b.s;
}

static void sb_json(struct nx_sbuf *b, const json_t *v, int indent)
{
	char *s = nx_tool_json(v, indent, false);
	if (!s)
		b->oom = true;
	else
		nx_sb_str(b, s);
	free(s);
}

/* --- conversations with tools -------------------------------------------- */

static bool is_role(const struct nx_chat_turn *m, const char *role)
{
	return !strcmp(m->role, role);
}

/* Roles, content and calls as the tool conventions need them: a call list
 * only on assistant turns, content on every turn but those. */
static int check_turns(enum nx_chat_tmpl t, const struct nx_chat_turn *m, int n, json_t **calls, struct nx_err *err)
{
	if (n <= 0 || !m)
		return nx_errf(err, "chat: no messages");
	for (int i = 0; i < n; i++) {
		if (!m[i].role)
			return nx_errf(err, "chat: message %d has no role", i);
		if (!is_role(&m[i], "system") && !is_role(&m[i], "user") && !is_role(&m[i], "assistant") &&
		    !is_role(&m[i], "tool"))
			return nx_errf(err, "chat: message %d has unknown role \"%.64s\"; expected system, user, assistant "
				       "or tool", i, m[i].role);
		if (is_role(&m[i], "system") && check_late_system(t, i, err))
			return -1;
		if (m[i].calls && !is_role(&m[i], "assistant"))
			return nx_errf(err, "chat: message %d (%s) carries tool calls; only assistant messages do", i,
				       m[i].role);
		if (m[i].calls) {
			json_error_t je;
			calls[i] = json_loads(m[i].calls, 0, &je);
			if (!json_is_array(calls[i]) || json_array_size(calls[i]) == 0)
				return nx_errf(err, "chat: message %d: its tool calls are not a non-empty JSON array", i);
			size_t k;
			json_t *c;
			json_array_foreach(calls[i], k, c)
				if (!json_is_string(json_object_get(c, "name")) ||
				    !json_is_object(json_object_get(c, "arguments")))
					return nx_errf(err, "chat: message %d: tool call %zu needs a name and an arguments "
						       "object", i, k);
		} else if (!m[i].content) {
			return nx_errf(err, "chat: message %d (%s) has no content", i, m[i].role);
		}
	}
	return 0;
}

/* Qwen's tools listing in its system turn, from "# Tools" to the turn's end. */
static void qwen_tools_listing(struct nx_sbuf *b, const json_t *tools)
{
	nx_sb_str(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
		  "provided with function signatures within <tools></tools> XML tags:\n<tools>");
	size_t k;
	json_t *t;
	json_array_foreach(tools, k, t) {
		nx_sb_str(b, "\n");
		sb_json(b, t, -1);
	}
	nx_sb_str(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
		  "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
		  "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
}

/* Tool message i: consecutive ones share one user turn of <tool_response> blocks. */
static void qwen_tool_response(struct nx_sbuf *b, const struct nx_chat_turn *m, int n, int i, const char *content)
{
	if (i == 0 || !is_role(&m[i - 1], "tool"))
		nx_sb_str(b, "<|im_start|>user");
	nx_sb_str(b, "\n<tool_response>\n");
	nx_sb_str(b, content);
	nx_sb_str(b, "\n</tool_response>");
	if (i == n - 1 || !is_role(&m[i + 1], "tool"))
		nx_sb_str(b, "<|im_end|>\n");
}

/* One of an assistant turn's calls as a <tool_call> block. */
static void qwen_call(struct nx_sbuf *b, const json_t *call)
{
	nx_sb_str(b, "<tool_call>\n{\"name\": \"");
	nx_sb_str(b, json_string_value(json_object_get(call, "name")));
	nx_sb_str(b, "\", \"arguments\": ");
	sb_json(b, json_object_get(call, "arguments"), -1);
	nx_sb_str(b, "}\n</tool_call>");
}

/* Qwen2.5 (ChatML): the system turn carries the tools; with none, the
 * template's default system turn stands in for a missing one. */
static void render_qwen25(struct nx_sbuf *b, const struct find_default *f, const struct nx_chat_turn *m, int n,
			  json_t **calls, const json_t *tools, bool gen)
{
	bool sys = is_role(&m[0], "system");
	if (tools) {
		nx_sb_str(b, "<|im_start|>system\n");
		if (sys)
			nx_sb_str(b, m[0].content);
		else if (f->lit)
			nx_sb_put(b, f->lit + f->body_off, f->body_len);
		nx_sb_str(b, "\n\n");
		qwen_tools_listing(b, tools);
	} else if (sys) {
		nx_sb_str(b, "<|im_start|>system\n");
		nx_sb_str(b, m[0].content);
		nx_sb_str(b, "<|im_end|>\n");
	} else if (f->lit) {
		nx_sb_str(b, f->lit);
	}
	for (int i = sys ? 1 : 0; i < n; i++) {
		if (is_role(&m[i], "tool")) {
			qwen_tool_response(b, m, n, i, m[i].content);
		} else if (calls[i]) {
			nx_sb_str(b, "<|im_start|>assistant");
			if (m[i].content && *m[i].content) {
				nx_sb_str(b, "\n");
				nx_sb_str(b, m[i].content);
			}
			size_t k;
			json_t *c;
			json_array_foreach(calls[i], k, c) {
				nx_sb_str(b, "\n");
				qwen_call(b, c);
			}
			nx_sb_str(b, "<|im_end|>\n");
		} else {
			nx_sb_str(b, "<|im_start|>");
			nx_sb_str(b, m[i].role);
			nx_sb_str(b, "\n");
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "<|im_end|>\n");
		}
	}
	if (gen)
		nx_sb_str(b, "<|im_start|>assistant\n");
}

/* Qwen3: as Qwen2.5 without a default system turn, and with its handling of
 * reasoning in the assistant turns after the last question (chat.c). */
static void render_qwen3_tools(struct nx_sbuf *b, const struct nx_chat_turn *m, int n, json_t **calls,
			       const json_t *tools, bool gen)
{
	bool sys = is_role(&m[0], "system");
	if (tools) {
		nx_sb_str(b, "<|im_start|>system\n");
		if (sys) {
			nx_sb_str(b, m[0].content);
			nx_sb_str(b, "\n\n");
		}
		qwen_tools_listing(b, tools);
	} else if (sys) {
		nx_sb_str(b, "<|im_start|>system\n");
		nx_sb_str(b, m[0].content);
		nx_sb_str(b, "<|im_end|>\n");
	}
	int last_query = n - 1; /* the last user message that is not a tool's response */
	for (int i = n - 1; i >= 0; i--)
		if (is_role(&m[i], "user") && !is_tool_response(m[i].content)) {
			last_query = i;
			break;
		}
	for (int i = sys ? 1 : 0; i < n; i++) {
		const char *content = m[i].content ? m[i].content : "";
		if (is_role(&m[i], "tool")) {
			qwen_tool_response(b, m, n, i, content);
			continue;
		}
		if (!is_role(&m[i], "assistant")) {
			nx_sb_str(b, "<|im_start|>");
			nx_sb_str(b, m[i].role);
			nx_sb_str(b, "\n");
			nx_sb_str(b, content);
			nx_sb_str(b, "<|im_end|>\n");
			continue;
		}
		const char *r, *re, *c, *ce;
		qwen3_split(content, &r, &re, &c, &ce);
		nx_sb_str(b, "<|im_start|>assistant\n");
		if (i > last_query && (i == n - 1 || re > r)) {
			const char *cs = c;
			strip_nl(&r, &re, true, true);
			nx_sb_str(b, "<think>\n");
			nx_sb_put(b, r, (size_t)(re - r));
			nx_sb_str(b, "\n</think>\n\n");
			strip_nl(&cs, &ce, true, false);
			nx_sb_put(b, cs, (size_t)(ce - cs));
		} else {
			nx_sb_put(b, c, (size_t)(ce - c));
		}
		bool has_content = c < ce; /* the template tests its content before the lstrip above */
		if (calls[i]) {
			size_t k;
			json_t *call;
			json_array_foreach(calls[i], k, call) {
				if (k > 0 || has_content)
					nx_sb_str(b, "\n");
				qwen_call(b, call);
			}
		}
		nx_sb_str(b, "<|im_end|>\n");
	}
	if (gen)
		nx_sb_str(b, "<|im_start|>assistant\n");
}

/* Llama 3.1: tools go in the first user message (tools_in_user_message,
 * the template's default); an assistant call is one JSON object; a tool's
 * result is an ipython turn holding it as a JSON string (the template's
 * `content is iterable` is true of a string). */
static int render_llama31_tools(struct nx_sbuf *b, const char *jinja, const struct nx_chat_turn *m, int n,
				json_t **calls, const json_t *tools, bool gen, struct nx_err *err)
{
	char date[64];
	llama31_date(date, sizeof(date), jinja);
	nx_sb_str(b, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n");
	if (tools)
		nx_sb_str(b, "Environment: ipython\n");
	nx_sb_str(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
	nx_sb_str(b, date);
	nx_sb_str(b, "\n\n");
	int i = 0;
	if (is_role(&m[0], "system")) {
		sb_stripped(b, m[0].content);
		i = 1;
	}
	nx_sb_str(b, "<|eot_id|>");
	if (tools) {
		if (i == n)
			return nx_errf(err, "chat: the llama3.1 template puts the tools in the first user message, and there "
				       "is none");
		if (!is_role(&m[i], "user"))
			return nx_errf(err, "chat: message %d has role \"%s\"; the llama3.1 template puts the tools in the "
				       "first user message, so the conversation must go on with one", i, m[i].role);
		nx_sb_str(b, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with "
			  "a JSON for a function call with its proper arguments that best answers the given prompt.\n\n"
			  "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and "
			  "its value}.Do not use variables.\n\n");
		size_t k;
		json_t *t;
		json_array_foreach(tools, k, t) {
			sb_json(b, t, 4);
			nx_sb_str(b, "\n\n");
		}
		sb_stripped(b, m[i].content);
		nx_sb_str(b, "<|eot_id|>");
		i++;
	}
	for (; i < n; i++) {
		if (is_role(&m[i], "tool")) {
			json_t *s = json_string(m[i].content);
			nx_sb_str(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
			if (!s)
				b->oom = true;
			else
				sb_json(b, s, -1);
			json_decref(s);
			nx_sb_str(b, "<|eot_id|>");
		} else if (calls[i]) {
			if (json_array_size(calls[i]) != 1)
				return nx_errf(err, "chat: message %d has %zu tool calls; the llama3.1 template takes one call "
					       "per assistant message", i, json_array_size(calls[i]));
			json_t *c = json_array_get(calls[i], 0);
			nx_sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
			nx_sb_str(b, json_string_value(json_object_get(c, "name")));
			nx_sb_str(b, "\", \"parameters\": ");
			sb_json(b, json_object_get(c, "arguments"), -1);
			nx_sb_str(b, "}<|eot_id|>");
		} else {
			nx_sb_str(b, "<|start_header_id|>");
			nx_sb_str(b, m[i].role);
			nx_sb_str(b, "<|end_header_id|>\n\n");
			sb_stripped(b, m[i].content);
			nx_sb_str(b, "<|eot_id|>");
		}
	}
	if (gen)
		nx_sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
	return 0;
}

/* --- Mistral ------------------------------------------------------------- */

/* Jinja's |length of a string: its code points. */
static size_t code_points(const char *s)
{
	size_t n = 0;
	for (; *s; s++)
		n += ((unsigned char)*s & 0xc0) != 0x80;
	return n;
}

/* s without its first code points, all but the last keep (Jinja's s[-keep:]). */
static const char *last_code_points(const char *s, size_t keep)
{
	for (size_t skip = code_points(s) - keep; skip > 0; skip--)
		for (s++; ((unsigned char)*s & 0xc0) == 0x80; s++)
			;
	return s;
}

/* A call's or a result's id as the template takes it: v3's exactly 9
 * characters, Small 3.1's at least 9, of which it writes the last 9. */
static const char *mistral_id(const char *id, bool v3)
{
	size_t n = id ? code_points(id) : 0;
	if (v3 ? n != 9 : n < 9)
		return NULL;
	return v3 ? id : last_code_points(id, 9);
}

/* The tools as the templates list them: each function's keys but "return",
 * a string value between quotes as it is (the templates do not escape it),
 * any other value as tojson writes it. */
static void mistral_tools(struct nx_sbuf *b, const json_t *tools, bool tight)
{
	nx_sb_str(b, tight ? "[AVAILABLE_TOOLS][" : "[AVAILABLE_TOOLS] [");
	size_t k;
	json_t *t;
	json_array_foreach(tools, k, t) {
		const char *key;
		json_t *val;
		bool first = true;
		nx_sb_str(b, "{\"type\": \"function\", \"function\": {");
		json_object_foreach(json_object_get(t, "function"), key, val) {
			if (!strcmp(key, "return"))
				continue;
			if (!first)
				nx_sb_str(b, ", ");
			first = false;
			nx_sb_str(b, "\"");
			nx_sb_str(b, key);
			if (json_is_string(val)) {
				nx_sb_str(b, "\": \"");
				nx_sb_put(b, json_string_value(val), json_string_length(val));
				nx_sb_str(b, "\"");
			} else {
				nx_sb_str(b, "\": ");
				sb_json(b, val, -1);
			}
		}
		nx_sb_str(b, "}}");
		nx_sb_str(b, k + 1 < json_array_size(tools) ? ", " : "]");
	}
	nx_sb_str(b, "[/AVAILABLE_TOOLS]");
}

/* Mistral v3, v3 tekken (tight) and v7 tekken: the conversation with the
 * tools before the last user turn, calls and results with their ids. No
 * generation prompt: the templates have none. */
static int render_mistral_tools(struct nx_sbuf *b, enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_turn *m,
				int n, json_t **calls, const json_t *tools, struct nx_err *err)
{
	static const char ID_RULE_V3[] = "needs tool call ids of 9 characters (\"Tool call IDs should be alphanumeric "
					 "strings with length 9!\"); nxd's own ids for it are 9";
	static const char ID_RULE_V7[] = "needs tool call ids of at least 9 characters (\"Tool call IDs should be "
					 "alphanumeric strings with length >= 9!\")";
	bool tight = t == NX_CHAT_MISTRAL_V3_TEKKEN, v3 = t != NX_CHAT_MISTRAL_V7_TEKKEN;
	const char *name = nx_chat_tmpl_name(t);
	int first = is_role(&m[0], "system") ? 1 : 0, last_user = -1;
	const char *sys = first ? m[0].content : NULL;
	char *def = NULL, *tool_prompt = NULL;
	int rc = 0;
	for (int i = first; i < n; i++)
		if (is_role(&m[i], "user"))
			last_user = i;
	nx_sb_str(b, "<s>");
	if (v3) {
		/* user and assistant turns alternate, calls and results aside */
		int k = 0;
		for (int i = first; i < n; i++) {
			if (is_role(&m[i], "tool") || calls[i])
				continue;
			if (is_role(&m[i], "user") != (k % 2 == 0))
				return nx_errf(err, "chat: message %d has role \"%s\"; the %s template needs user and assistant "
					       "turns to alternate, starting with user (tool calls and results aside)", i,
					       m[i].role, name);
			k++;
		}
	} else {
		if (!sys && parse_set_string(jinja, "default_system_message", &def))
			sys = def;
		if (tools && !parse_set_string(jinja, "parallel_tool_prompt", &tool_prompt))
			b->oom = true; /* nx_chat_tool_style read it: only memory can fail here */
		/* the template joins them with "\<newline>\<newline>": nothing, in Jinja */
		nx_sb_str(b, "[SYSTEM_PROMPT]");
		if (tool_prompt)
			nx_sb_str(b, tool_prompt);
		if (sys)
			nx_sb_str(b, sys);
		nx_sb_str(b, "[/SYSTEM_PROMPT]");
	}
	for (int i = first; i < n && rc == 0; i++) {
		if (is_role(&m[i], "user")) {
			/* the templates test message == user_messages[-1]: a turn equal to the last one gets them too */
			if (tools && !strcmp(m[i].content, m[last_user].content))
				mistral_tools(b, tools, tight);
			nx_sb_str(b, v3 && !tight ? "[INST] " : "[INST]");
			if (v3 && sys && i == n - 1) {
				nx_sb_str(b, sys);
				nx_sb_str(b, "\n\n");
			}
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "[/INST]");
		} else if (calls[i]) { /* the turn's content, if any, is not written */
			nx_sb_str(b, tight ? "[TOOL_CALLS][" : "[TOOL_CALLS] [");
			size_t k;
			json_t *c;
			json_array_foreach(calls[i], k, c) {
				const char *id = json_string_value(json_object_get(c, "id")), *w = mistral_id(id, v3);
				if (!w) {
					rc = nx_errf(err, "chat: message %d: tool call %zu has id \"%.40s\"; the %s template %s", i,
						     k, id ? id : "", name, v3 ? ID_RULE_V3 : ID_RULE_V7);
					break;
				}
				nx_sb_str(b, "{\"name\": \"");
				nx_sb_str(b, json_string_value(json_object_get(c, "name")));
				nx_sb_str(b, "\", \"arguments\": ");
				sb_json(b, json_object_get(c, "arguments"), -1);
				nx_sb_str(b, ", \"id\": \"");
				nx_sb_str(b, w);
				nx_sb_str(b, k + 1 < json_array_size(calls[i]) ? "\"}, " : "\"}]</s>");
			}
		} else if (is_role(&m[i], "assistant")) {
			if (v3 && !tight) {
				nx_sb_str(b, " ");
				sb_stripped(b, m[i].content);
			} else {
				nx_sb_str(b, m[i].content);
			}
			nx_sb_str(b, "</s>");
		} else { /* tool */
			const char *w = mistral_id(m[i].call_id, v3);
			if (!w) {
				rc = nx_errf(err, "chat: message %d (tool) answers call id \"%.40s\"; the %s template %s", i,
					     m[i].call_id ? m[i].call_id : "", name, v3 ? ID_RULE_V3 : ID_RULE_V7);
				break;
			}
			nx_sb_str(b, tight ? "[TOOL_RESULTS]{\"content\": " : "[TOOL_RESULTS] {\"content\": ");
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, ", \"call_id\": \"");
			nx_sb_str(b, w);
			nx_sb_str(b, "\"}[/TOOL_RESULTS]");
		}
	}
	free(def);
	free(tool_prompt);
	return rc;
}

int nx_chat_render_turns(enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_turn *turns, int n,
			 const char *tools_json, const char *prefix, const struct nx_chat_opts *opts, char **out,
			 struct nx_err *err)
{
	static const struct nx_chat_opts defaults = { .add_generation_prompt = true, .thinking = NX_CHAT_THINK_DEFAULT };
	if (!opts)
		opts = &defaults;
	*out = NULL;
	bool tooled = tools_json != NULL || prefix != NULL;
	for (int i = 0; i < n && turns && !tooled; i++)
		tooled = turns[i].calls || (turns[i].role && !strcmp(turns[i].role, "tool"));
	if (!tooled) {
		struct nx_chat_msg *msgs = calloc(n > 0 ? (size_t)n : 1, sizeof(*msgs));
		if (!msgs)
			return nx_errf(err, "chat: out of memory");
		for (int i = 0; i < n; i++)
			msgs[i] = (struct nx_chat_msg){ turns[i].role, turns[i].content };
		int rc = nx_chat_render_opts(t, jinja, msgs, n, opts, out, err);
		free(msgs);
		return rc;
	}
	enum nx_tool_style style = nx_chat_tool_style(t, jinja);
	if (style == NX_TOOLS_NONE)
		return nx_errf(err, "chat: the model's chat template (%s) has no tool-call convention nxd knows: tools, "
			       "tool messages and assistant tool calls are rendered for Llama 3.1-3.3 (llama3.1), "
			       "Qwen2.5 / Qwen3 and Mistral v3 / Nemo / Small 3.1 templates only", nx_chat_tmpl_name(t));

	json_t *tools = NULL, **calls = calloc(n > 0 ? (size_t)n : 1, sizeof(*calls));
	struct find_default f = { 0 };
	struct nx_sbuf b = { 0 };
	int rc = -1;
	if (!calls) {
		nx_errf(err, "chat: out of memory");
		goto out;
	}
	if (check_turns(t, turns, n, calls, err) || check_thinking(t, opts->thinking, err))
		goto out;
	if (tools_json) {
		json_error_t je;
		tools = json_loads(tools_json, 0, &je);
		if (!json_is_array(tools)) {
			nx_errf(err, "chat: the tools are not a JSON array");
			goto out;
		}
	}
	if (find_default(t, jinja, &f, err))
		goto out;
	nx_sb_put(&b, "", 0);
	rc = 0;
	bool gen = opts->add_generation_prompt;
	if (t == NX_CHAT_LLAMA31) {
		rc = render_llama31_tools(&b, jinja, turns, n, calls, tools, gen, err);
	} else if (style == NX_TOOLS_MISTRAL || style == NX_TOOLS_MISTRAL_TIGHT) {
		rc = render_mistral_tools(&b, t, jinja, turns, n, calls, tools, err);
	} else if (t == NX_CHAT_QWEN3) {
		render_qwen3_tools(&b, turns, n, calls, tools, gen);
		if (gen && opts->thinking == NX_CHAT_THINK_OFF) /* enable_thinking false, as chat.c renders it */
			nx_sb_str(&b, "<think>\n\n</think>\n\n");
	} else {
		render_qwen25(&b, &f, turns, n, calls, tools, gen);
	}
	if (prefix)
		nx_sb_str(&b, prefix);
	if (rc == 0 && b.oom)
		rc = nx_errf(err, "chat: out of memory rendering %d messages", n);
out:
	for (int i = 0; calls && i < n; i++)
		json_decref(calls[i]);
	free(calls);
	json_decref(tools);
	free(f.lit);
	if (rc) {
		free(b.s);
		return -1;
	}
	*out = b.s;
	return 0;
}
