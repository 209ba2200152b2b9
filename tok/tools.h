/* tools.h - tool calling: each family's convention for offering tools and showing calls and results in the prompt (tok/chat_tools.c), the model's calls read back out of its answer (tok/tools.c), and a call's arguments checked against the tool's JSON schema (tok/tool_schema.c).
 *
 * Three conventions, as the families' own templates write them:
 *
 *   Qwen (Qwen2.5's ChatML template, which has <tools>, <tool_call> and
 *     <tool_response> in it, and Qwen3's): the tools are listed in the
 *     system turn inside <tools></tools>, one JSON object a line; the model
 *     answers with blocks
 *       <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 *     and tool results come back as a user turn of
 *     <tool_response>\n...\n</tool_response> blocks.
 *   Llama 3 (Llama 3.1 / 3.2 / 3.3's template, tools in the first user
 *     message, its default): "Environment: ipython" in the system turn, the
 *     tools (JSON, indent 4) in the first user turn; the whole answer is one
 *     JSON object {"name": ..., "parameters": {...}}; one call per turn; tool
 *     results are "ipython" turns holding the result as a JSON string.
 *
 *   Mistral (Mistral 7B Instruct v0.3's and Nemo's v3 templates, Mistral
 *     Small 3.1's v7 tekken one): the tools, as
 *     [AVAILABLE_TOOLS] [{"type": "function", "function": {...}}, ...][/AVAILABLE_TOOLS],
 *     before the last user turn (and any user turn equal to it, as the
 *     templates compare them); the model answers
 *       [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
 *     ([TOOL_CALLS] a control token); a call in the history is written back
 *     with its id, {"name": ..., "arguments": {...}, "id": "..."}, and a
 *     result as [TOOL_RESULTS] {"content": ..., "call_id": "..."}[/TOOL_RESULTS].
 *     Nemo's template has no space after the markers. v3's templates need
 *     ids of 9 characters (they raise otherwise, and so does nxd); Small
 *     3.1's takes an id of at least 9 by its last 9 and puts its tool
 *     instruction (parallel_tool_prompt) before the system prompt. nxd's
 *     call ids for these models are 9 letters and digits (take_call), so a
 *     conversation sent back as nxd gave it renders.
 *
 * Every other family has none (Mistral Large 2411's v7 template and the
 * later tekken ones with [TOOL_CALLS]name[ARGS]{...} among them): tools, tool messages and assistant calls are
 * refused for it, naming it. JSON is written into the prompt as the
 * templates' tojson writes it (Python's json.dumps: ", " and ": ", keys in
 * the order given, non-ASCII as is), so the prompt is the one the model was
 * trained on to the byte.
 *
 * tool_choice "required" or a named tool makes the answer start as a call
 * (nx_tool_prefix), holds the rest of it to a grammar (nx_tool_grammar:
 * the name, the family's separator, the tool's parameters schema, the
 * family's close), which daemon/ops.c prep_tools gives the request's
 * sampler, and checks its arguments once complete all the same (take_call
 * in tools.c, against the called tool's parameters): the check stays the
 * last word. */
#ifndef NX_TOOLS_H
#define NX_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"
#include "tok/chat.h"

enum nx_tool_style {
	NX_TOOLS_NONE,   /* the family has no tool convention */
	NX_TOOLS_QWEN,
	NX_TOOLS_LLAMA3,
	NX_TOOLS_MISTRAL,       /* "[TOOL_CALLS] [" */
	NX_TOOLS_MISTRAL_TIGHT, /* Nemo's "[TOOL_CALLS][": no space after the markers */
};

/* The family's convention: Llama 3.1 and Qwen3 have one; ChatML only when
 * the template itself has Qwen2.5's tool markers (SmolLM2's and Qwen2's
 * have none); Mistral v3, v3 tekken and v7 tekken only when the template
 * has the markers as the convention above spells them. */
enum nx_tool_style nx_chat_tool_style(enum nx_chat_tmpl t, const char *jinja);

/* A message of a conversation that may carry tools. */
struct nx_chat_turn {
	const char *role;     /* system, user, assistant, tool */
	const char *content;  /* NULL: an assistant turn of calls only */
	const char *calls;    /* assistant: JSON text of [{"id": s, "name": s, "arguments": {...}}, ...] ("id" optional), or NULL */
	const char *call_id;  /* tool: the id of the call it answers, or NULL */
};

/* Renders turns with the tools offered (tools_json: JSON text of an array
 * of OpenAI tool objects {"type": "function", "function": {...}}, written
 * into the prompt as given; NULL: none), then the generation prompt, then
 * prefix (NULL: none) - the start of the answer the model is made to
 * continue (nx_tool_prefix). opts as nx_chat_render_opts takes them (NULL:
 * the generation prompt, thinking as the template does). A family without a
 * convention refuses tools, tool turns and calls, naming itself; without any
 * of them this is nx_chat_render_opts. *out is malloc'd. */
int nx_chat_render_turns(enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_turn *turns, int n,
			 const char *tools_json, const char *prefix, const struct nx_chat_opts *opts, char **out,
			 struct nx_err *err);

/* The start of an answer that is a call (tool_choice "required": name
 * NULL) or a call of one tool (name): the answer's first bytes, put after
 * the generation prompt so the model continues a call. malloc'd. */
char *nx_tool_prefix(enum nx_tool_style s, const char *name);

/* Writes v as Python's json.dumps(v, ensure_ascii=False, indent=indent)
 * does (indent < 0: none; compact: "," and ":" separators instead), for
 * templates' tojson. malloc'd, NULL when out of memory. */
char *nx_tool_json(const json_t *v, int indent, bool compact);

// --- the model's answer read back into calls (tok/tools.c)

#define NX_TOOL_MAX_CALLS 128 /* calls one answer may make: the answer ends at the last */

enum nx_tool_choice {
	NX_TOOL_AUTO,     /* the model may call a tool or answer */
	NX_TOOL_REQUIRED, /* the answer must be a call, of any tool */
	NX_TOOL_NAMED,    /* the answer must be a call of one tool */
};

struct nx_tool_call {
	char id[32];      /* "call_" and 24 hex digits; Mistral: 9 of A-Z a-z 0-9 */
	char *name;
	char *arguments;  /* the arguments object as compact JSON text */
};

/* A tool offered without parameters takes none (OpenAI: "omitting parameters
 * defines a function with an empty parameter list"): its arguments are {}. */
#define NX_TOOL_NO_PARAMS "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}"

/* Reads an answer as it streams: text outside calls passes through (held
 * back only while it could be the start of a call), a call is kept when it
 * is complete and well formed; a malformed or unfinished one, or a call of a
 * tool not offered, is given back as plain text, never made into a call. */
struct nx_toolp {
	enum nx_tool_style style;
	enum nx_tool_choice choice;
	bool parallel;            /* false: the first call ends the answer */
	json_t *tools;            /* the tools offered (array, owned) */
	const json_t *schema;     /* NAMED / REQUIRED: the called tool's parameters, checked on each call */
	int state;                /* tools.c */
	char *buf;                /* text not yet decided on: a call's start, a call, a Llama answer (buf_len) */
	size_t buf_len, buf_cap;
	char *out;                /* plain text released by the last feed / finish (out_len) */
	size_t out_len, out_cap;
	struct nx_tool_call *calls; /* (n_calls) in order */
	int n_calls, calls_cap;
	size_t scan;              /* bytes of buf read so far: into the call's JSON array (Mistral), its block (Qwen) */
	int depth;                /* Mistral: the array's brackets open there */
	bool in_str, esc;         /* inside a JSON string there, after a backslash */
	uint64_t id_state;        /* call ids: a splitmix64 stream */
	bool failed;              /* REQUIRED / NAMED: the answer is not a valid call (why) */
	bool invalid;             /* ... because a whole call was refused; failed without it: the
				   * answer ended before a call was whole (max_tokens, a stop string) */
	bool finishing;           /* in nx_toolp_finish: what is read is what the end left */
	char why[512];
	bool oom;
};

/* tools: the request's array of tool objects (copied); choice NAMED needs
 * name. prefix is what nx_tool_prefix gave the prompt: fed first, as if the
 * model had written it. */
int nx_toolp_init(struct nx_toolp *p, enum nx_tool_style style, const json_t *tools, enum nx_tool_choice choice,
		  const char *name, bool parallel, const char *prefix, uint64_t id_seed, struct nx_err *err);
void nx_toolp_free(struct nx_toolp *p);
/* Feeds the next text of the answer; p->out / out_len is then the plain
 * text it releases (may be empty), and p->n_calls may have grown. */
void nx_toolp_feed(struct nx_toolp *p, const char *s, size_t n);
/* The answer ended: releases what was held back (added to p->out) and, for
 * REQUIRED / NAMED, sets failed when no valid call was made. REQUIRED / NAMED release no text, from feed or finish: such
 * an answer is a call or nothing. */
void nx_toolp_finish(struct nx_toolp *p);
/* Whether the answer ends here: a call completed and parallel is false or
 * tool_choice asked for it, the answer made NX_TOOL_MAX_CALLS calls, or a
 * required call failed. */
bool nx_toolp_done(const struct nx_toolp *p);

// --- the grammar of a call tool_choice asks for (tok/tool_grammar.c)

/* The GBNF of the rest of an answer that is a call (choice REQUIRED or
 * NAMED), after nx_tool_prefix(s, choice NAMED ? name : NULL): for
 * REQUIRED, an alternation over tools of each one's name and the
 * separator; the arguments under the tool's parameters schema
 * (nx_schema_to_gbnf_rules; NX_TOOL_NO_PARAMS when it has none); then the close
 * the family writes (Qwen "}\n</tool_call>", Llama "}", Mistral an optional
 * "id" as its history writes calls and "}]"), after which only
 * the end of generation is allowed: one call, also when parallel calls are
 * allowed. *gbnf is malloc'd; NULL with 0 for AUTO or a family nxd has no
 * call grammar for (the check alone then). A schema the compiler refuses:
 * -1 naming the tool and the construct (tok/tool_grammar.c). */
int nx_tool_grammar(enum nx_tool_style s, const json_t *tools, enum nx_tool_choice choice, const char *name,
		    char **gbnf, struct nx_err *err);

// --- arguments against a schema (tok/tool_schema.c)

/* Whether nxd can check instances against schema: every keyword it has is
 * one nx_tool_schema_validate implements or an annotation; otherwise an
 * error naming the keyword and where it is (at: "tools[0].function.parameters"). */
int nx_tool_schema_check(const json_t *schema, const char *at, struct nx_err *err);
/* 0 when v validates against schema (one nx_tool_schema_check accepts);
 * else -1 and an error naming where ("$.city") and why. */
int nx_tool_schema_validate(const json_t *schema, const json_t *v, struct nx_err *err);

#endif
