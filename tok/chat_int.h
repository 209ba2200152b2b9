/* chat_int.h - what tok/chat.c shares with tok/chat_tools.c: the families' common pieces. Not an interface of the engine. */
#ifndef NX_CHAT_INT_H
#define NX_CHAT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "common/sbuf.h"
#include "tok/chat.h"

/* s with Python's str.strip() whitespace removed (Jinja's trim). */
void sb_stripped(struct nx_sbuf *b, const char *s);

/* The template's default system turn (ChatML, Llama 2, Llama 3). */
struct find_default {
	enum nx_chat_tmpl t;
	const char *src;
	char *lit;        /* the whole literal, malloc'd (ChatML, Llama 3) */
	size_t body_off, body_len;
	bool oom;
};
int find_default(enum nx_chat_tmpl t, const char *jinja, struct find_default *f, struct nx_err *err);

/* Llama 3.1's "Today Date: " value. */
void llama31_date(char *buf, size_t n, const char *jinja);

/* [s, e) without leading (lead) or trailing (trail) newlines. */
void strip_nl(const char **s, const char **e, bool lead, bool trail);
/* Qwen3: an assistant turn's reasoning and content, as its template splits them. */
void qwen3_split(const char *content, const char **r, const char **re, const char **c, const char **ce);
/* A thinking option the template cannot follow is an error naming it. */
int check_thinking(enum nx_chat_tmpl t, enum nx_chat_thinking th, struct nx_err *err);
/* A system message at i > 0 where template t cannot take one: -1 with err set (chat.c). */
int check_late_system(enum nx_chat_tmpl t, int i, struct nx_err *err);

/* Whether a string literal of the template's tags decodes to exactly want. */
bool has_literal(const char *jinja, const char *want);

/* Mistral Small's `set NAME = "..." + today + "..."`: string literals and
 * `today` joined by +, evaluated as Jinja does; false when the template has
 * it in another shape. *out is malloc'd. */
bool parse_set_string(const char *jinja, const char *name, char **out);

/* Qwen3: a user turn that is "<tool_response>...</tool_response>". */
bool is_tool_response(const char *s);

#endif
