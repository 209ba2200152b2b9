/* tools.c - the model's tool calls read back out of its answer as it streams (see tools.h). */
#define _GNU_SOURCE /* memmem: model text may hold NUL bytes */
#include "tok/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/splitmix.h"

enum {
	ST_TEXT,    /* Qwen: plain text; buf holds a tail that may begin "<tool_call>" */
	ST_CALL,    /* Qwen: inside a block; buf holds "<tool_call>" and what follows */
	ST_START,   /* Llama: only whitespace so far (buf) */
	ST_ANSWER,  /* Llama: the answer opened as a call would; all of it is in buf */
	ST_PLAIN,   /* Llama: a plain answer, passed through */
	ST_MTEXT,   /* Mistral: plain text; buf holds a tail that may begin "[TOOL_CALLS]" */
	ST_MCALLS,  /* Mistral: buf holds "[TOOL_CALLS]", then whitespace and the JSON array read up to scan */
};

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>", MOPEN[] = "[TOOL_CALLS]";

static bool mistral(enum nx_tool_style s)
{
	return s == NX_TOOLS_MISTRAL || s == NX_TOOLS_MISTRAL_TIGHT;
}

static void grow(struct nx_toolp *p, char **s, size_t *len, size_t *cap, const char *add, size_t n)
{
	if (p->oom || n == 0)
		return;
	if (*len + n + 1 > *cap) {
		size_t c = *cap ? *cap : 256;
		while (c < *len + n + 1)
			c *= 2;
		char *q = realloc(*s, c);
		if (!q) {
			p->oom = true;
			return;
		}
		*s = q;
		*cap = c;
	}
	memcpy(*s + *len, add, n);
	*len += n;
	(*s)[*len] = '\0';
}

static void emit(struct nx_toolp *p, const char *s, size_t n)
{
	grow(p, &p->out, &p->out_len, &p->out_cap, s, n);
}

static void hold(struct nx_toolp *p, const char *s, size_t n)
{
	grow(p, &p->buf, &p->buf_len, &p->buf_cap, s, n);
}

static void drop(struct nx_toolp *p, size_t n)
{
	if (n == 0)
		return;
	memmove(p->buf, p->buf + n, p->buf_len - n);
	p->buf_len -= n;
	if (p->buf)
		p->buf[p->buf_len] = '\0';
}

int nx_toolp_init(struct nx_toolp *p, enum nx_tool_style style, const json_t *tools, enum nx_tool_choice choice,
		  const char *name, bool parallel, const char *prefix, uint64_t id_seed, struct nx_err *err)
{
	memset(p, 0, sizeof(*p));
	if (style == NX_TOOLS_NONE)
		return nx_errf(err, "tools: no tool convention");
	p->style = style;
	p->choice = choice;
	p->parallel = parallel;
	p->id_state = id_seed;
	p->state = style == NX_TOOLS_QWEN ? ST_TEXT : mistral(style) ? ST_MTEXT : ST_START;
	p->tools = json_deep_copy(tools);
	if (!p->tools)
		return nx_errf(err, "tools: out of memory");
	size_t k;
	json_t *tk;
	json_array_foreach(p->tools, k, tk) {
		json_t *fn = json_object_get(tk, "function"), *params = json_object_get(fn, "parameters");
		if (json_is_object(fn) && (!params || json_is_null(params)))
			json_object_set_new(fn, "parameters", json_loads(NX_TOOL_NO_PARAMS, 0, NULL));
	}
	if (choice == NX_TOOL_NAMED) {
		size_t i;
		json_t *t;
		json_array_foreach(p->tools, i, t) {
			json_t *fn = json_object_get(t, "function");
			if (name && !strcmp(json_string_value(json_object_get(fn, "name")) ?: "", name))
				p->schema = json_object_get(fn, "parameters");
		}
	}
	if (prefix)
		nx_toolp_feed(p, prefix, strlen(prefix));
	p->out_len = 0; /* the prefix is the prompt's: nothing of it is the model's text */
	return 0;
}

void nx_toolp_free(struct nx_toolp *p)
{
	json_decref(p->tools);
	free(p->buf);
	free(p->out);
	for (int i = 0; i < p->n_calls; i++) {
		free(p->calls[i].name);
		free(p->calls[i].arguments);
	}
	free(p->calls);
	memset(p, 0, sizeof(*p));
}

static const json_t *tool_named(const struct nx_toolp *p, const char *name)
{
	size_t i;
	json_t *t;
	json_array_foreach(p->tools, i, t) {
		json_t *fn = json_object_get(t, "function");
		const char *n = json_string_value(json_object_get(fn, "name"));
		if (n && !strcmp(n, name))
			return fn;
	}
	return NULL;
}

static void fail(struct nx_toolp *p, const char *fmt, const char *a, const char *b)
{
	if (p->failed)
		return;
	p->failed = true;
	snprintf(p->why, sizeof(p->why), fmt, a, b);
}

/* text [s, s+n) as a call: a JSON object with a "name" of an offered tool
 * and an object of arguments under args_key (or "arguments"). Appends the
 * call and returns true, or returns false leaving everything as it was. */
static bool take_call(struct nx_toolp *p, const char *s, size_t n, const char *args_key)
{
	json_error_t je;
	json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
	json_t *name = json_object_get(o, "name");
	json_t *args = json_object_get(o, args_key);
	if (!args)
		args = json_object_get(o, "arguments");
	const json_t *fn = json_is_string(name) ? tool_named(p, json_string_value(name)) : NULL;
	/* nothing else in the object but, as Llama 3.2 writes it, "type": "function" */
	json_t *type = json_object_get(o, "type");
	size_t keys = 2 + (json_is_string(type) && !strcmp(json_string_value(type), "function"));
	/* nor, as Mistral's history writes calls, an "id" (nxd gives the call its own) */
	keys += mistral(p->style) && json_is_string(json_object_get(o, "id"));
	bool ok = json_is_object(o) && fn && json_is_object(args) && json_object_size(o) == keys;
	if (!ok && p->choice != NX_TOOL_AUTO) {
		/* the call's grammar let it through, so it is the reader that cannot take it (a number past
		 * what jansson holds, 1e400 or 2^64): say so, rather than only that no call came */
		if (!o)
			fail(p, "the model's call could not be read: %.200s%s", je.text, "");
		else
			fail(p, "%s%s", "the model's call is not an object of a tool's name and an object of arguments", "");
		p->invalid |= !p->finishing; /* a whole block, not what the end of the answer left unfinished */
	}
	if (ok && p->choice != NX_TOOL_AUTO) {
		/* the call's grammar (tool_grammar.c) held the arguments to the
		 * tool's parameters as they were sampled; checked once complete
		 * all the same, the last word */
		const json_t *schema = p->choice == NX_TOOL_NAMED ? p->schema : json_object_get(fn, "parameters");
		struct nx_err ve;
		if (schema && nx_tool_schema_validate(schema, args, &ve) < 0) {
			fail(p, "the model's call of '%.64s' has arguments that do not match its parameters: %.300s",
			     json_string_value(name), ve.msg);
			p->invalid |= !p->finishing;
			ok = false;
		}
	}
	if (ok && p->n_calls == p->calls_cap) {
		int cap = p->calls_cap ? 2 * p->calls_cap : 4;
		struct nx_tool_call *c = realloc(p->calls, (size_t)cap * sizeof(*c));
		if (!c)
			ok = false, p->oom = true;
		else
			p->calls = c, p->calls_cap = cap;
	}
	if (ok) {
		struct nx_tool_call *c = &p->calls[p->n_calls];
		uint64_t a = nx_splitmix64(&p->id_state), b = nx_splitmix64(&p->id_state);
		if (mistral(p->style)) { /* v3's templates take ids of 9 characters, and no others */
			static const char ALNUM[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
			for (int k = 0; k < 9; k++, a /= 62)
				c->id[k] = ALNUM[a % 62];
			c->id[9] = '\0';
		} else {
			snprintf(c->id, sizeof(c->id), "call_%016llx%08llx", (unsigned long long)a,
				 (unsigned long long)(b & 0xffffffffu));
		}
		c->name = strdup(json_string_value(name));
		c->arguments = nx_tool_json(args, -1, true);
		if (!c->name || !c->arguments) {
			free(c->name);
			free(c->arguments);
			p->oom = true;
			ok = false;
		} else {
			p->n_calls++;
		}
	}
	json_decref(o);
	return ok;
}

/* Reads JSON text a byte at a time (p->in_str, p->esc): true when ch is
 * outside every string, and not a quote that opens or closes one. */
static bool outside_str(struct nx_toolp *p, char ch)
{
	if (p->in_str) {
		if (p->esc)
			p->esc = false;
		else if (ch == '\\')
			p->esc = true;
		else if (ch == '"')
			p->in_str = false;
		return false;
	}
	if (ch == '"') {
		p->in_str = true;
		return false;
	}
	return true;
}

/* Qwen: where the block in buf closes: its first CLOSE outside a JSON
 * string (a call's arguments may quote "</tool_call>"; the call grammar lets
 * them), read on from scan. False while the block may go on; at the end
 * without such a CLOSE, its first CLOSE at all (the JSON is broken: the
 * block is text up to there, as a reader taking the first CLOSE would have
 * it), or NULL: open to the end. */
static bool block_close(struct nx_toolp *p, bool end, const char **close)
{
	const size_t cl = sizeof(CLOSE) - 1;
	size_t i = p->scan;
	for (; i < p->buf_len; i++) {
		if (outside_str(p, p->buf[i]) && p->buf[i] == '<') {
			size_t have = p->buf_len - i < cl ? p->buf_len - i : cl;
			if (!memcmp(p->buf + i, CLOSE, have)) {
				if (have == cl) {
					*close = p->buf + i;
					return true;
				}
				break; /* CLOSE may be arriving */
			}
		}
	}
	p->scan = i;
	if (!end)
		return false;
	*close = memmem(p->buf + sizeof(OPEN) - 1, p->buf_len - (sizeof(OPEN) - 1), CLOSE, cl);
	return true;
}

/* Qwen: the blocks complete in buf become calls, text around them passes. */
static void qwen_scan(struct nx_toolp *p, bool end)
{
	for (;;) {
		if (nx_toolp_done(p)) {
			drop(p, p->buf_len);
			return;
		}
		if (p->state == ST_TEXT) {
			char *at = p->buf_len ? memmem(p->buf, p->buf_len, OPEN, sizeof(OPEN) - 1) : NULL;
			if (at) {
				emit(p, p->buf, (size_t)(at - p->buf));
				drop(p, (size_t)(at - p->buf));
				p->state = ST_CALL;
				p->scan = sizeof(OPEN) - 1;
				p->in_str = p->esc = false;
				continue;
			}
			/* keep the longest tail that may begin OPEN */
			size_t keep = 0;
			for (size_t k = sizeof(OPEN) - 2; k > 0 && !end; k--)
				if (k <= p->buf_len && !memcmp(p->buf + p->buf_len - k, OPEN, k)) {
					keep = k;
					break;
				}
			emit(p, p->buf, p->buf_len - keep);
			drop(p, p->buf_len - keep);
			return;
		}
		/* ST_CALL */
		if (nx_toolp_done(p)) { /* the answer ended with its call: what follows is not part of it */
			drop(p, p->buf_len);
			p->state = ST_TEXT;
			return;
		}
		const char *close = NULL;
		if (!block_close(p, end, &close))
			return;
		const char *body = p->buf + sizeof(OPEN) - 1;
		size_t blen = close ? (size_t)(close - body) : p->buf_len - (sizeof(OPEN) - 1);
		size_t whole = close ? (size_t)(close - p->buf) + sizeof(CLOSE) - 1 : p->buf_len;
		/* an unclosed block at the end is a call only when its JSON is whole */
		if (!take_call(p, body, blen, "arguments"))
			emit(p, p->buf, whole);
		drop(p, whole);
		p->state = ST_TEXT;
		if (!p->buf_len)
			return;
	}
}

/* Llama 3: a call is the whole answer; anything else is plain text. */
static void llama_scan(struct nx_toolp *p, bool end)
{
	if (p->state == ST_START) {
		size_t i = 0;
		while (i < p->buf_len && (p->buf[i] == ' ' || p->buf[i] == '\n' || p->buf[i] == '\t' || p->buf[i] == '\r'))
			i++;
		if (i < p->buf_len)
			p->state = p->buf[i] == '{' ? ST_ANSWER : ST_PLAIN;
	}
	if (p->state == ST_PLAIN || (p->state == ST_START && end)) {
		emit(p, p->buf, p->buf_len);
		drop(p, p->buf_len);
		p->state = ST_PLAIN;
		return;
	}
	if (p->state == ST_ANSWER && end) {
		if (!take_call(p, p->buf, p->buf_len, "parameters"))
			emit(p, p->buf, p->buf_len);
		drop(p, p->buf_len);
		p->state = ST_PLAIN;
	}
}

/* Mistral: [TOOL_CALLS] then a JSON array of calls, all of them well
 * formed or none taken; text around the block passes. */
static void mistral_scan(struct nx_toolp *p, bool end)
{
	const size_t mo = sizeof(MOPEN) - 1;
	for (;;) {
		if (nx_toolp_done(p)) { /* the answer ended with its calls: what follows is not part of it */
			drop(p, p->buf_len);
			p->state = ST_MTEXT;
			return;
		}
		if (p->state == ST_MTEXT) {
			char *at = p->buf_len ? memmem(p->buf, p->buf_len, MOPEN, mo) : NULL;
			if (at) {
				emit(p, p->buf, (size_t)(at - p->buf));
				drop(p, (size_t)(at - p->buf));
				p->state = ST_MCALLS;
				p->scan = mo;
				p->depth = 0;
				p->in_str = p->esc = false;
				continue;
			}
			size_t keep = 0;
			for (size_t k = mo - 1; k > 0 && !end; k--)
				if (k <= p->buf_len && !memcmp(p->buf + p->buf_len - k, MOPEN, k)) {
					keep = k;
					break;
				}
			emit(p, p->buf, p->buf_len - keep);
			drop(p, p->buf_len - keep);
			return;
		}
		/* ST_MCALLS: whitespace, then the array read to its closing bracket */
		size_t i = p->scan;
		bool closed = false;
		for (; i < p->buf_len && !closed; i++) {
			char ch = p->buf[i];
			if (p->depth == 0) {
				if (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r')
					continue;
				if (ch != '[')
					break; /* not a call list */
				p->depth = 1;
			} else if (!outside_str(p, ch)) {
				continue;
			} else if (ch == '[' || ch == '{') {
				p->depth++;
			} else if ((ch == ']' || ch == '}') && --p->depth == 0) {
				closed = true;
			}
		}
		p->scan = i;
		if (!closed && i == p->buf_len && !end)
			return; /* the block may go on */
		/* closed: [MOPEN, i) is the block; else what was read is not a call list (or was cut off) */
		bool taken = false;
		if (closed) {
			const char *arr = memchr(p->buf + mo, '[', i - mo);
			json_error_t je;
			json_t *a = json_loadb(arr, (size_t)(p->buf + i - arr), JSON_REJECT_DUPLICATES, &je);
			int before = p->n_calls;
			bool all = json_is_array(a) && json_array_size(a) > 0;
			for (size_t k = 0; all && k < json_array_size(a) && !nx_toolp_done(p); k++) {
				char *one = json_dumps(json_array_get(a, k), JSON_COMPACT | JSON_ENCODE_ANY);
				all = one && take_call(p, one, strlen(one), "arguments");
				free(one);
			}
			json_decref(a);
			if (!all) { /* none of the block's calls is one */
				for (int k = before; k < p->n_calls; k++) {
					free(p->calls[k].name);
					free(p->calls[k].arguments);
				}
				p->n_calls = before;
			}
			taken = all;
		}
		size_t whole = i;
		if (!taken) /* given back as text; a marker not followed by a list is text up to where it stopped */
			emit(p, p->buf, whole);
		drop(p, whole);
		p->state = ST_MTEXT;
		if (!p->buf_len)
			return;
	}
}

void nx_toolp_feed(struct nx_toolp *p, const char *s, size_t n)
{
	p->out_len = 0;
	if (p->out)
		p->out[0] = '\0';
	hold(p, s, n);
	if (p->style == NX_TOOLS_QWEN)
		qwen_scan(p, false);
	else if (mistral(p->style))
		mistral_scan(p, false);
	else
		llama_scan(p, false);
	if (p->choice != NX_TOOL_AUTO)
		p->out_len = 0; /* a call that must be made is a call or nothing: a block it rejects is no text */
}

void nx_toolp_finish(struct nx_toolp *p)
{
	p->finishing = true;
	if (p->style == NX_TOOLS_QWEN)
		qwen_scan(p, true);
	else if (mistral(p->style))
		mistral_scan(p, true);
	else
		llama_scan(p, true);
	if (p->choice != NX_TOOL_AUTO && p->n_calls == 0)
		fail(p, "%s%s", "tool_choice asks for a call and the model's answer is not a valid one",
		     p->oom ? " (out of memory)" : "");
	if (p->choice != NX_TOOL_AUTO)
		p->out_len = 0; /* an answer tool_choice makes a call is a call or nothing: no text */
}

bool nx_toolp_done(const struct nx_toolp *p)
{
	/* REQUIRED / NAMED: the call's grammar allows one call, then only the end */
	return ((!p->parallel || p->choice != NX_TOOL_AUTO) && p->n_calls > 0) || p->n_calls >= NX_TOOL_MAX_CALLS ||
	       p->failed;
}
