/* tool_grammar.c - the grammar of the rest of an answer that tool_choice makes a call: the tool's name, the family's separator, arguments held to the tool's parameters schema, the family's close (see tools.h). */
#include "tok/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sbuf.h"
#include "sample/grammar.h"

/* s as a GBNF literal. */
static void gbnf_lit(struct nx_sbuf *b, const char *s)
{
	nx_sb_str(b, "\"");
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		char e[8];
		if (ch == '"' || ch == '\\')
			snprintf(e, sizeof(e), "\\%c", ch);
		else if (ch == '\n')
			snprintf(e, sizeof(e), "\\n");
		else if (ch < 0x20 || ch == 0x7f)
			snprintf(e, sizeof(e), "\\x%02X", ch);
		else
			e[0] = (char)ch, e[1] = '\0';
		nx_sb_str(b, e);
	}
	nx_sb_str(b, "\" ");
}

/* GBNF of what the family writes after a call's arguments object, as its
 * template renders a call (chat_tools.c); NULL: a family nxd has no call
 * grammar for. Mistral's history gives each call an "id" of 9 letters and
 * digits after its arguments: the model may write one (the reader takes it
 * and gives the call nxd's own), then the list closes on this one call. */
static const char *call_close(enum nx_tool_style s)
{
	switch (s) {
	case NX_TOOLS_QWEN: return "\"}\\n</tool_call>\"";
	case NX_TOOLS_LLAMA3: return "\"}\"";
	case NX_TOOLS_MISTRAL:
	case NX_TOOLS_MISTRAL_TIGHT: return "( \", \\\"id\\\": \\\"\" [a-zA-Z0-9]{9} \"\\\"\" )? \"}]\"";
	default: return NULL;
	}
}

/* The bytes between the answer's forced start for "required" (which ends
 * where the name begins) and the arguments: the name and the separator,
 * taken from nx_tool_prefix itself so the two cannot disagree. */
static char *name_and_separator(enum nx_tool_style s, const char *name)
{
	char *any = nx_tool_prefix(s, NULL), *one = nx_tool_prefix(s, name), *out = NULL;
	size_t n = any ? strlen(any) : 0;
	if (any && one && !strncmp(one, any, n) && !strncmp(one + n, name, strlen(name)))
		out = strdup(one + n);
	free(any);
	free(one);
	return out;
}

int nx_tool_grammar(enum nx_tool_style style, const json_t *tools, enum nx_tool_choice choice, const char *name,
		    char **gbnf, struct nx_err *err)
{
	*gbnf = NULL;
	const char *close = call_close(style);
	if (choice == NX_TOOL_AUTO || !close)
		return 0;
	struct nx_sbuf rules = { 0 }, root = { 0 };
	nx_sb_str(&root, "root ::= ");
	int rc = 0, n_alt = 0;
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters");
		const char *tn = json_string_value(json_object_get(fn, "name"));
		if (!tn || (choice == NX_TOOL_NAMED && strcmp(tn, name)))
			continue;
		char prefix[NX_SCHEMA_PREFIX_MAX + 1], *args_rules = NULL, *args_root = NULL;
		snprintf(prefix, sizeof(prefix), "t%d-", (int)i); /* i < NXP_MAX_TOOLS */
		const json_t *ptype = json_object_get(params, "type");
		if (json_is_string(ptype) && strcmp(json_string_value(ptype), "object")) {
			rc = nx_errf(err, "tool '%s' (tools[%zu].function.parameters): its type is '%.32s', but a call's "
				     "arguments are an object, so tool_choice could never get a call of it", tn, i,
				     json_string_value(ptype));
			break;
		}
		{
			char *schema = params && !json_is_null(params) ? json_dumps(params, JSON_COMPACT)
								       : strdup(NX_TOOL_NO_PARAMS);
			if (!schema) {
				rc = nx_errf(err, "out of memory");
				break;
			}
			struct nx_err e = {{0}};
			rc = nx_schema_to_gbnf_rules(schema, strlen(schema), prefix, &args_rules, &args_root, &e);
			free(schema);
			if (rc) {
				rc = nx_errf(err, "tool '%s' (tools[%zu].function.parameters): its arguments cannot be held to "
					     "the schema as they are sampled, which tool_choice asking for a call needs: %s",
					     tn, i, e.msg);
				break;
			}
			nx_sb_str(&rules, args_rules);
		}
		nx_sb_str(&root, n_alt++ ? "| " : "( ");
		if (choice == NX_TOOL_REQUIRED) {
			/* the forced start stops where the name begins */
			char *ns = name_and_separator(style, tn);
			if (!ns) {
				free(args_rules);
				free(args_root);
				rc = nx_errf(err, "out of memory");
				break;
			}
			gbnf_lit(&root, ns);
			free(ns);
		}
		nx_sb_str(&root, args_root);
		nx_sb_str(&root, " ");
		free(args_rules);
		free(args_root);
	}
	if (rc == 0 && n_alt == 0)
		rc = nx_errf(err, "tool_choice names no tool offered");
	char *json_rules = rc == 0 ? nx_schema_gbnf_json_rules() : NULL;
	if (rc == 0 && !json_rules)
		rc = nx_errf(err, "out of memory");
	if (rc == 0) {
		nx_sb_str(&root, ") ");
		nx_sb_str(&root, close);
		nx_sb_str(&root, "\n");
		nx_sb_str(&root, json_rules);
		nx_sb_put(&root, rules.s ? rules.s : "", rules.n);
		if (root.oom || rules.oom)
			rc = nx_errf(err, "out of memory");
	}
	free(json_rules);
	free(rules.s);
	if (rc) {
		free(root.s);
		return -1;
	}
	*gbnf = root.s;
	return 0;
}
