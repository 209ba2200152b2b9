/* tools.c - the tool fields of a generate request: the tools offered, tool_choice, and the calls and results in its messages (docs/protocol.md, "Tools"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proto/proto.h"

static int fail(struct nxp_error *e, enum nxp_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct nxp_error *e, enum nxp_code code, const char *fmt, ...)
{
	va_list ap;
	e->code = code;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return -1;
}

static json_t *field(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	return v && !json_is_null(v) ? v : NULL;
}

/* A tool's name: what templates write between quotes unescaped, so only
 * the characters OpenAI allows in one. */
static bool good_name(const char *s, size_t n)
{
	if (n < 1 || n > NXP_MAX_TOOL_NAME)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static int name_field(json_t *obj, const char *where, const char **out, struct nxp_error *e)
{
	json_t *n = field(obj, "name");
	if (!n)
		return fail(e, NXP_E_BAD_REQUEST, "field '%s.name' is required", where);
	if (!json_is_string(n))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s.name' must be a string, got %s", where, nxp_json_type(n));
	if (!good_name(json_string_value(n), json_string_length(n)))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s.name' must be 1..%d characters of a-z, A-Z, 0-9, _ and -",
			    where, NXP_MAX_TOOL_NAME);
	*out = json_string_value(n);
	return 0;
}

/* "type", when given, must be "function": the only kind of tool there is to call. */
static int function_type(json_t *obj, const char *where, struct nxp_error *e)
{
	json_t *t = field(obj, "type");
	if (t && (!json_is_string(t) || strcmp(json_string_value(t), "function")))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s.type' must be \"function\" (nxd calls function tools only)",
			    where);
	return 0;
}

static int parse_tool_list(json_t *tools, struct nxp_generate *g, struct nxp_error *e)
{
	if (!json_is_array(tools))
		return fail(e, NXP_E_BAD_REQUEST, "field 'tools' must be an array of tool objects, got %s",
			    nxp_json_type(tools));
	size_t n = json_array_size(tools);
	if (n > NXP_MAX_TOOLS)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'tools' must have at most %d entries, got %zu", NXP_MAX_TOOLS, n);
	if (n == 0)
		return 0; /* no tools offered */
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		char where[48];
		snprintf(where, sizeof(where), "tools[%zu]", i);
		if (!json_is_object(t))
			return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be an object, got %s", where, nxp_json_type(t));
		static const char *const tool_fields[] = { "type", "function", NULL };
		static const char *const function_fields[] = { "name", "description", "parameters", "strict", NULL };
		char dot[56];
		snprintf(dot, sizeof(dot), "%s.", where);
		if (nxp_only_fields(t, dot, tool_fields, "a tool", e) || function_type(t, where, e))
			return -1;
		json_t *fn = field(t, "function");
		if (!json_is_object(fn))
			return fail(e, NXP_E_BAD_REQUEST, "field '%s.function' must be an object {\"name\", \"description\", "
				    "\"parameters\"}", where);
		snprintf(where, sizeof(where), "tools[%zu].function", i);
		snprintf(dot, sizeof(dot), "%s.", where);
		if (nxp_only_fields(fn, dot, function_fields, "a tool's function", e))
			return -1;
		const char *name;
		if (name_field(fn, where, &name, e))
			return -1;
		for (size_t k = 0; k < i; k++)
			if (!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(tools, k), "function"),
								      "name")), name))
				return fail(e, NXP_E_BAD_REQUEST, "field '%s.name' repeats tool '%s'", where, name);
		json_t *d = field(fn, "description"), *p = field(fn, "parameters"), *strict = field(fn, "strict");
		if (d && !json_is_string(d))
			return fail(e, NXP_E_BAD_REQUEST, "field '%s.description' must be a string", where);
		if (p && !json_is_object(p))
			return fail(e, NXP_E_BAD_REQUEST, "field '%s.parameters' must be a JSON schema object", where);
		if (strict && !json_is_boolean(strict))
			return fail(e, NXP_E_BAD_REQUEST, "field '%s.strict' must be a boolean", where);
	}
	g->tools = json_dumps(tools, JSON_COMPACT);
	if (!g->tools)
		return fail(e, NXP_E_INTERNAL, "out of memory for field 'tools'");
	return 0;
}

static bool offered(const char *tools_json, const char *name)
{
	json_error_t je;
	json_t *a = json_loads(tools_json, 0, &je);
	bool hit = false;
	size_t i;
	json_t *t;
	json_array_foreach(a, i, t) {
		const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
		hit |= n && !strcmp(n, name);
	}
	json_decref(a);
	return hit;
}

/* strict: true asks that a call's arguments be held to the schema as they
 * are sampled: nxd does so for the call tool_choice asks for ("required" or
 * a name; a tool that is not the named one is never called), not for a call
 * the model may make on its own. */
static int strict_tools(json_t *tools, const struct nxp_generate *g, struct nxp_error *e)
{
	size_t i;
	json_t *t;
	if (!g->tools || g->tool_choice != NXP_TOOLS_AUTO)
		return 0;
	json_array_foreach(tools, i, t) {
		if (json_is_true(json_object_get(json_object_get(t, "function"), "strict")))
			return fail(e, NXP_E_BAD_REQUEST, "field 'tools[%zu].function.strict' is true and tool_choice is "
				    "\"auto\": arguments are held to the schema as they are sampled only in a call "
				    "tool_choice asks for (\"required\" or the tool's name); send strict false or leave "
				    "it out (a call the model makes on its own is read back unchecked)", i);
	}
	return 0;
}

int nxp_parse_tools(json_t *o, struct nxp_generate *g, struct nxp_error *e)
{
	g->parallel_tool_calls = true;
	json_t *tools = field(o, "tools"), *choice = field(o, "tool_choice"), *par = field(o, "parallel_tool_calls");
	if (tools && parse_tool_list(tools, g, e))
		return -1;
	if (par) {
		if (!json_is_boolean(par))
			return fail(e, NXP_E_BAD_REQUEST, "field 'parallel_tool_calls' must be a boolean, got %s",
				    nxp_json_type(par));
		g->parallel_tool_calls = json_is_true(par);
	}
	if (!choice)
		return strict_tools(tools, g, e);
	if (json_is_string(choice)) {
		const char *c = json_string_value(choice);
		if (!strcmp(c, "auto"))
			g->tool_choice = NXP_TOOLS_AUTO;
		else if (!strcmp(c, "none"))
			g->tool_choice = NXP_TOOLS_NONE;
		else if (!strcmp(c, "required"))
			g->tool_choice = NXP_TOOLS_REQUIRED;
		else
			return fail(e, NXP_E_BAD_REQUEST, "field 'tool_choice' must be \"none\", \"auto\", \"required\" or "
				    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
	} else if (json_is_object(choice)) {
		const char *name;
		static const char *const choice_fields[] = { "type", "function", NULL }, *const name_only[] = { "name", NULL };
		json_t *fn = field(choice, "function");
		if (nxp_only_fields(choice, "tool_choice.", choice_fields, "tool_choice", e) ||
		    function_type(choice, "tool_choice", e))
			return -1;
		if (!json_is_object(fn))
			return fail(e, NXP_E_BAD_REQUEST, "field 'tool_choice.function' must be an object {\"name\": ...}");
		if (nxp_only_fields(fn, "tool_choice.function.", name_only, "tool_choice's function", e))
			return -1;
		if (name_field(fn, "tool_choice.function", &name, e))
			return -1;
		if (!g->tools || !offered(g->tools, name))
			return fail(e, NXP_E_BAD_REQUEST, "field 'tool_choice.function.name' is '%s', not one of the tools "
				    "offered", name);
		g->tool_choice = NXP_TOOLS_NAMED;
		snprintf(g->tool_name, sizeof(g->tool_name), "%s", name);
	} else {
		return fail(e, NXP_E_BAD_REQUEST, "field 'tool_choice' must be a string or an object, got %s",
			    nxp_json_type(choice));
	}
	if (g->tool_choice == NXP_TOOLS_REQUIRED && !g->tools)
		return fail(e, NXP_E_BAD_REQUEST, "field 'tool_choice' is \"required\" and no tools are offered");
	return strict_tools(tools, g, e);
}

/* One call of an assistant message, as {"id", "name", "arguments": {...}}. */
static json_t *one_call(json_t *c, const char *where, struct nxp_error *e)
{
	char fw[96];
	if (!json_is_object(c))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be an object", where), NULL;
	/* index: the place a streamed call had, which a client may send back; the array's order is the calls' */
	static const char *const call_fields[] = { "id", "type", "function", "index", NULL };
	static const char *const function_fields[] = { "name", "arguments", "index", NULL };
	char dot[104];
	snprintf(dot, sizeof(dot), "%s.", where);
	if (nxp_only_fields(c, dot, call_fields, "a tool call", e) || function_type(c, where, e))
		return NULL;
	json_t *id = field(c, "id"), *fn = field(c, "function");
	if (id && !json_is_string(id))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s.id' must be a string", where), NULL;
	if (!json_is_object(fn))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s.function' must be an object {\"name\", \"arguments\"}", where),
		       NULL;
	snprintf(fw, sizeof(fw), "%s.function", where);
	snprintf(dot, sizeof(dot), "%s.", fw);
	if (nxp_only_fields(fn, dot, function_fields, "a tool call's function", e))
		return NULL;
	const char *name;
	if (name_field(fn, fw, &name, e))
		return NULL;
	json_t *args = field(fn, "arguments"), *obj = NULL;
	if (json_is_string(args)) { /* OpenAI: the object as JSON text */
		json_error_t je;
		obj = json_loadb(json_string_value(args), json_string_length(args), JSON_REJECT_DUPLICATES, &je);
		if (!json_is_object(obj)) {
			json_decref(obj);
			return fail(e, NXP_E_BAD_REQUEST, "field '%s.arguments' must be a JSON object, or a string holding "
				    "one; the string is not one", fw), NULL;
		}
	} else if (json_is_object(args)) {
		obj = json_incref(args);
	} else if (!args) {
		obj = json_object();
	} else {
		return fail(e, NXP_E_BAD_REQUEST, "field '%s.arguments' must be a JSON object, or a string holding one, "
			    "got %s", fw, nxp_json_type(args)), NULL;
	}
	json_t *out = json_pack("{s:s, s:s, s:o}", "id", id ? json_string_value(id) : "", "name", name, "arguments", obj);
	if (!out)
		fail(e, NXP_E_INTERNAL, "out of memory for field '%s'", where);
	return out;
}

int nxp_parse_message_tools(json_t *m, size_t i, struct nxp_message *msg, struct nxp_error *e)
{
	json_t *calls = field(m, "tool_calls"), *tcid = field(m, "tool_call_id");
	if (tcid) {
		if (msg->role != NXP_ROLE_TOOL)
			return fail(e, NXP_E_BAD_REQUEST, "field 'messages[%zu].tool_call_id' belongs to a tool message", i);
		if (!json_is_string(tcid))
			return fail(e, NXP_E_BAD_REQUEST, "field 'messages[%zu].tool_call_id' must be a string", i);
		msg->tool_call_id = strdup(json_string_value(tcid));
		if (!msg->tool_call_id)
			return fail(e, NXP_E_INTERNAL, "out of memory copying 'messages[%zu].tool_call_id'", i);
	}
	if (!calls)
		return 0;
	if (msg->role != NXP_ROLE_ASSISTANT)
		return fail(e, NXP_E_BAD_REQUEST, "field 'messages[%zu].tool_calls' belongs to an assistant message", i);
	if (!json_is_array(calls))
		return fail(e, NXP_E_BAD_REQUEST, "field 'messages[%zu].tool_calls' must be an array, got %s", i,
			    nxp_json_type(calls));
	size_t n = json_array_size(calls);
	if (n > NXP_MAX_TOOL_CALLS)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'messages[%zu].tool_calls' must have at most %d entries, got %zu",
			    i, NXP_MAX_TOOL_CALLS, n);
	if (n == 0)
		return 0;
	json_t *norm = json_array();
	if (!norm)
		return fail(e, NXP_E_INTERNAL, "out of memory");
	for (size_t k = 0; k < n; k++) {
		char where[64];
		snprintf(where, sizeof(where), "messages[%zu].tool_calls[%zu]", i, k);
		json_t *c = one_call(json_array_get(calls, k), where, e);
		if (!c) {
			json_decref(norm);
			return -1;
		}
		json_array_append_new(norm, c);
	}
	msg->tool_calls = json_dumps(norm, JSON_COMPACT);
	json_decref(norm);
	if (!msg->tool_calls)
		return fail(e, NXP_E_INTERNAL, "out of memory copying 'messages[%zu].tool_calls'", i);
	return 0;
}
