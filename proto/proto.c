/* proto.c - nxd protocol: request lines parsed and validated with jansson, event lines written without allocating. */
#include "proto/proto.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/err.h"
#include "sample/grammar.h"
#include "sample/stop.h"

/* The daemon hands a request's stop strings to the matcher as they are. */
_Static_assert(NXP_MAX_STOP <= NX_STOP_MAX && NXP_MAX_STOP_LEN <= NX_STOP_MAX_LEN,
	       "the stop matcher must hold what the protocol allows");

// --- names

static const char *const code_names[NXP_E_COUNT] = {
	[NXP_E_PARSE_ERROR] = "parse_error",
	[NXP_E_TOO_LARGE] = "too_large",
	[NXP_E_BAD_REQUEST] = "bad_request",
	[NXP_E_UNKNOWN_OP] = "unknown_op",
	[NXP_E_OUT_OF_RANGE] = "out_of_range",
	[NXP_E_CONTEXT_OVERFLOW] = "context_overflow",
	[NXP_E_BUSY] = "busy",
	[NXP_E_NOT_FOUND] = "not_found",
	[NXP_E_FORBIDDEN] = "forbidden",
	[NXP_E_SHUTTING_DOWN] = "shutting_down",
	[NXP_E_UNSUPPORTED_VERSION] = "unsupported_version",
	[NXP_E_INTERNAL] = "internal",
	[NXP_E_INVALID_TOOL_CALL] = "invalid_tool_call",
};

const char *nxp_code_name(enum nxp_code code)
{
	if ((unsigned)code >= NXP_E_COUNT)
		return "internal";
	return code_names[code];
}

static const char *const role_names[] = {
	[NXP_ROLE_SYSTEM] = "system",
	[NXP_ROLE_USER] = "user",
	[NXP_ROLE_ASSISTANT] = "assistant",
	[NXP_ROLE_TOOL] = "tool",
};

const char *nxp_role_name(enum nxp_role role)
{
	if ((unsigned)role > NXP_ROLE_TOOL)
		return "user";
	return role_names[role];
}

static const char *const reason_names[] = {
	[NXP_DONE_EOS] = "eos",
	[NXP_DONE_LENGTH] = "length",
	[NXP_DONE_STOP] = "stop",
	[NXP_DONE_CANCELLED] = "cancelled",
	[NXP_DONE_SHUTDOWN] = "shutdown",
	[NXP_DONE_TOOL_CALLS] = "tool_calls",
};

const char *nxp_reason_name(enum nxp_reason reason)
{
	if ((unsigned)reason > NXP_DONE_TOOL_CALLS)
		return "eos";
	return reason_names[reason];
}

// --- writer: snprintf semantics over a caller buffer

/* len counts every byte the line needs, even those that did not fit, so the
 * caller learns the size to retry with. */
struct wr {
	char *p;
	size_t cap;
	size_t len;
};

static void w_put(struct wr *w, const char *s, size_t n)
{
	if (w->len < w->cap) {
		size_t room = w->cap - w->len;
		memcpy(w->p + w->len, s, n < room ? n : room);
	}
	w->len += n;
}

static void w_str(struct wr *w, const char *s)
{
	w_put(w, s, strlen(s));
}

static void w_ch(struct wr *w, char c)
{
	if (w->len < w->cap)
		w->p[w->len] = c;
	w->len++;
}

/* Formats straight into the buffer: vsnprintf already has the contract we
 * need (writes what fits, returns the full length). */
static void __attribute__((format(printf, 2, 3))) w_fmt(struct wr *w, const char *fmt, ...)
{
	size_t room = w->len < w->cap ? w->cap - w->len : 0;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(room ? w->p + w->len : NULL, room, fmt, ap);
	va_end(ap);
	if (n > 0)
		w->len += (size_t)n;
}

/* A finite double as a JSON number; NaN and infinities (not JSON) as null. */
static void w_num(struct wr *w, double v)
{
	if (!isfinite(v))
		w_str(w, "null");
	else
		w_fmt(w, "%.9g", v);
}

static size_t w_end(struct wr *w)
{
	if (w->cap > 0)
		w->p[w->len < w->cap ? w->len : w->cap - 1] = '\0';
	return w->len;
}

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), or 0 if the bytes there are invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	if (c < 0x80)
		return 1;
	size_t need;
	unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
	if (c >= 0xC2 && c <= 0xDF) {
		need = 2;
	} else if (c >= 0xE0 && c <= 0xEF) {
		need = 3;
		if (c == 0xE0)
			lo = 0xA0; /* overlong */
		else if (c == 0xED)
			hi = 0x9F; /* surrogates */
	} else if (c >= 0xF0 && c <= 0xF4) {
		need = 4;
		if (c == 0xF0)
			lo = 0x90; /* overlong */
		else if (c == 0xF4)
			hi = 0x8F; /* > U+10FFFF */
	} else {
		return 0;
	}
	if (n < need || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < need; i++)
		if ((s[i] & 0xC0) != 0x80)
			return 0;
	return need;
}

char *nxp_utf8_scrub(char *s)
{
	unsigned char *u = (unsigned char *)s, *out = u;
	size_t n = strlen(s);
	for (size_t i = 0; i < n;) {
		size_t k = utf8_seq(u + i, n - i);
		if (!k) {
			i++;
			continue;
		}
		memmove(out, u + i, k);
		out += k;
		i += k;
	}
	*out = '\0';
	return s;
}

static void w_jstr(struct wr *w, const char *str, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	if (!str) {
		str = "";
		len = 0;
	}
	const unsigned char *s = (const unsigned char *)str;
	w_ch(w, '"');
	size_t i = 0, run = 0; /* s[run..i) are bytes to copy as they are */
	while (i < len) {
		unsigned char c = s[i];
		const char *esc = NULL;
		char ubuf[7];
		size_t adv = 1;
		if (c >= 0x20 && c != '"' && c != '\\' && c < 0x7F) {
			i++;
			continue;
		}
		if (c >= 0x80) {
			adv = utf8_seq(s + i, len - i);
			if (adv) {
				i += adv;
				continue;
			}
			esc = "\\ufffd";
			adv = 1;
		} else if (c == '"') {
			esc = "\\\"";
		} else if (c == '\\') {
			esc = "\\\\";
		} else if (c == '\n') {
			esc = "\\n";
		} else if (c == '\r') {
			esc = "\\r";
		} else if (c == '\t') {
			esc = "\\t";
		} else if (c == '\b') {
			esc = "\\b";
		} else if (c == '\f') {
			esc = "\\f";
		} else { /* other controls and DEL */
			memcpy(ubuf, "\\u00", 4);
			ubuf[4] = hex[c >> 4];
			ubuf[5] = hex[c & 15];
			ubuf[6] = '\0';
			esc = ubuf;
		}
		w_put(w, str + run, i - run);
		w_str(w, esc);
		i += adv;
		run = i;
	}
	w_put(w, str + run, i - run);
	w_ch(w, '"');
}

size_t nxp_json_str(char *buf, size_t cap, const char *s, size_t len)
{
	struct wr w = {buf, cap, 0};
	w_jstr(&w, s, len);
	return w_end(&w);
}

// --- encoders

/* {"id":<id>,"event":"<name>" - every event starts this way. */
static void w_head(struct wr *w, const char *id, const char *event)
{
	w_str(w, "{\"id\":");
	w_str(w, id ? id : "null");
	w_str(w, ",\"event\":\"");
	w_str(w, event);
	w_ch(w, '"');
}

static size_t w_tail(struct wr *w)
{
	w_str(w, "}\n");
	return w_end(w);
}

size_t nxp_enc_hello(char *buf, size_t cap, const char *id, const struct nxp_hello_info *h)
{
	struct wr w = {buf, cap, 0};
	w_ch(&w, '{');
	if (id) {
		w_str(&w, "\"id\":");
		w_str(&w, id);
		w_ch(&w, ',');
	}
	w_fmt(&w, "\"event\":\"hello\",\"version\":%d,\"server\":\"nxd\",\"model\":", NXP_VERSION);
	const char *model = h->model ? h->model : "";
	w_jstr(&w, model, strlen(model));
	w_str(&w, ",\"arch\":");
	const char *arch = h->arch ? h->arch : "";
	w_jstr(&w, arch, strlen(arch));
	w_fmt(&w, ",\"n_ctx\":%d,\"n_vocab\":%d", h->n_ctx, h->n_vocab);
	if (h->max_tokens > 0)
		w_fmt(&w, ",\"max_tokens\":%d", h->max_tokens);
	return w_tail(&w);
}

size_t nxp_enc_token(char *buf, size_t cap, const char *id, int32_t token, const char *text,
		     size_t text_len, const struct nxp_logprob *lp, int n_lp)
{
	return nxp_enc_token_lp(buf, cap, id, token, text, text_len, NULL, lp, n_lp);
}

size_t nxp_enc_token_lp(char *buf, size_t cap, const char *id, int32_t token, const char *text,
			size_t text_len, const struct nxp_logprob *self, const struct nxp_logprob *lp, int n_lp)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "token");
	w_fmt(&w, ",\"token\":%" PRId32 ",\"text\":", token);
	w_jstr(&w, text ? text : "", text ? text_len : 0);
	if (self) {
		w_str(&w, ",\"piece\":");
		w_jstr(&w, self->text ? self->text : "", self->text ? self->text_len : 0);
		w_str(&w, ",\"logprob\":");
		w_num(&w, self->logprob);
	}
	if (lp && n_lp > 0) {
		w_str(&w, ",\"logprobs\":[");
		for (int i = 0; i < n_lp; i++) {
			w_fmt(&w, "%s{\"token\":%" PRId32 ",\"text\":", i ? "," : "", lp[i].token);
			w_jstr(&w, lp[i].text ? lp[i].text : "", lp[i].text ? lp[i].text_len : 0);
			w_str(&w, ",\"logprob\":");
			w_num(&w, lp[i].logprob);
			w_ch(&w, '}');
		}
		w_ch(&w, ']');
	}
	return w_tail(&w);
}

static void w_ids(struct wr *w, const int32_t *tokens, int n)
{
	w_ch(w, '[');
	for (int i = 0; i < n; i++)
		w_fmt(w, i ? ",%" PRId32 : "%" PRId32, tokens[i]);
	w_ch(w, ']');
}

/* {"id":"call_...","name":"...","arguments":"{...}"}: the arguments as a
 * JSON string, as OpenAI carries them. */
static void w_tool_call(struct wr *w, const struct nxp_tool_call *c)
{
	w_str(w, "{\"id\":");
	w_jstr(w, c->id, strlen(c->id));
	w_str(w, ",\"name\":");
	w_jstr(w, c->name, strlen(c->name));
	w_str(w, ",\"arguments\":");
	w_jstr(w, c->arguments, strlen(c->arguments));
	w_ch(w, '}');
}

size_t nxp_enc_tool_call(char *buf, size_t cap, const char *id, int index, const struct nxp_tool_call *c)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "tool_call");
	w_fmt(&w, ",\"index\":%d,\"tool_call\":", index);
	w_tool_call(&w, c);
	return w_tail(&w);
}

size_t nxp_enc_done(char *buf, size_t cap, const char *id, const struct nxp_done *d)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "done");
	w_str(&w, ",\"reason\":\"");
	w_str(&w, nxp_reason_name(d->reason));
	w_ch(&w, '"');
	if (d->tool_calls) {
		w_str(&w, ",\"tool_calls\":[");
		for (int i = 0; i < d->n_tool_calls; i++) {
			if (i)
				w_ch(&w, ',');
			w_tool_call(&w, &d->tool_calls[i]);
		}
		w_ch(&w, ']');
	}
	if (d->text) {
		w_str(&w, ",\"text\":");
		w_jstr(&w, d->text, d->text_len);
	}
	if (d->tokens) {
		w_str(&w, ",\"tokens\":");
		w_ids(&w, d->tokens, d->n_tokens);
	}
	if (d->tokens && d->lp_self) {
		w_str(&w, ",\"logprobs\":[");
		for (int i = 0; i < d->n_tokens; i++) {
			const struct nxp_logprob *s = &d->lp_self[i];
			w_fmt(&w, "%s{\"token\":%" PRId32 ",\"piece\":", i ? "," : "", s->token);
			w_jstr(&w, s->text ? s->text : "", s->text ? s->text_len : 0);
			w_str(&w, ",\"logprob\":");
			w_num(&w, s->logprob);
			w_str(&w, ",\"logprobs\":[");
			for (int k = d->lp_off[i]; k < d->lp_off[i + 1]; k++) {
				const struct nxp_logprob *a = &d->lp_alts[k];
				w_fmt(&w, "%s{\"token\":%" PRId32 ",\"text\":", k > d->lp_off[i] ? "," : "", a->token);
				w_jstr(&w, a->text ? a->text : "", a->text ? a->text_len : 0);
				w_str(&w, ",\"logprob\":");
				w_num(&w, a->logprob);
				w_ch(&w, '}');
			}
			w_str(&w, "]}");
		}
		w_ch(&w, ']');
	}
	if (d->constrained)
		w_str(&w, d->incomplete ? ",\"incomplete\":true" : ",\"incomplete\":false");
	if (d->has_seed)
		w_fmt(&w, ",\"seed\":%llu", (unsigned long long)d->seed);
	if (d->speculated) {
		w_str(&w, ",\"speculate\":{");
		if (d->spec_mode) {
			w_str(&w, "\"mode\":");
			w_jstr(&w, d->spec_mode, strlen(d->spec_mode));
			w_ch(&w, ',');
		}
		w_fmt(&w, "\"drafted\":%d,\"accepted\":%d}", d->spec_drafted, d->spec_accepted);
	}
	w_fmt(&w, ",\"usage\":{\"prompt_tokens\":%d,\"cached_tokens\":%d,\"completion_tokens\":%d}",
	      d->prompt_tokens, d->cached_tokens, d->completion_tokens);
	w_str(&w, ",\"timing\":{\"prefill_ms\":");
	w_num(&w, d->prefill_ms);
	w_str(&w, ",\"decode_ms\":");
	w_num(&w, d->decode_ms);
	w_str(&w, ",\"tokens_per_s\":");
	w_num(&w, d->tokens_per_s);
	w_ch(&w, '}');
	return w_tail(&w);
}

size_t nxp_enc_tokens(char *buf, size_t cap, const char *id, const int32_t *tokens, int n)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "tokens");
	w_str(&w, ",\"tokens\":");
	w_ids(&w, tokens, n);
	return w_tail(&w);
}

size_t nxp_enc_text(char *buf, size_t cap, const char *id, const char *text, size_t text_len)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "text");
	w_str(&w, ",\"text\":");
	w_jstr(&w, text ? text : "", text ? text_len : 0);
	return w_tail(&w);
}

static void w_key_str(struct wr *w, const char *key, const char *val)
{
	w_fmt(w, ",\"%s\":", key);
	if (val)
		w_jstr(w, val, strlen(val));
	else
		w_str(w, "null");
}

size_t nxp_enc_status(char *buf, size_t cap, const char *id, const struct nxp_status *s)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "status");
	w_key_str(&w, "model", s->model);
	w_key_str(&w, "arch", s->arch);
	w_key_str(&w, "type", s->type);
	w_key_str(&w, "activations", s->activations);
	w_key_str(&w, "kv_type", s->kv_type);
	if (s->chat_template) {
		w_key_str(&w, "chat_template", s->chat_template);
		w_fmt(&w, ",\"tools\":%s", s->tools ? "true" : "false");
	}
	w_fmt(&w, ",\"kv_bytes\":%llu", (unsigned long long)s->kv_bytes);
	w_str(&w, ",\"kernels\":{");
	for (int i = 0; i < s->n_kernels; i++) {
		w_fmt(&w, "%s", i ? "," : "");
		w_jstr(&w, s->kernel_family[i], strlen(s->kernel_family[i]));
		w_ch(&w, ':');
		w_jstr(&w, s->kernel_set[i], strlen(s->kernel_set[i]));
	}
	w_ch(&w, '}');
	w_fmt(&w, ",\"n_ctx\":%d,\"n_vocab\":%d,\"workers\":[", s->n_ctx, s->n_vocab);
	for (int i = 0; i < s->n_workers; i++) {
		const struct nxp_worker_status *ws = &s->workers[i];
		w_fmt(&w, "%s{\"pid\":%d,\"cpu\":%d,\"state\":", i ? "," : "", ws->pid, ws->cpu);
		const char *st = ws->state ? ws->state : "unknown";
		w_jstr(&w, st, strlen(st));
		w_fmt(&w, ",\"restarts\":%d}", ws->restarts);
	}
	w_fmt(&w, "],\"slots\":{\"total\":%d,\"used\":%d,\"queued\":%d}", s->slots_total, s->slots_used,
	      s->queued);
	w_fmt(&w, ",\"tokens_served\":%" PRIu64, s->tokens_served);
	w_fmt(&w, ",\"prompt_tokens_cached\":%" PRIu64, s->prompt_tokens_cached);
	w_str(&w, ",\"sequences_per_step\":{\"mean\":");
	w_num(&w, s->seqs_per_step_mean);
	w_fmt(&w, ",\"max\":%d}", s->seqs_per_step_max);
	w_str(&w, ",\"tokens_per_s\":");
	w_num(&w, s->tokens_per_s);
	w_str(&w, ",\"uptime_s\":");
	w_num(&w, s->uptime_s);
	w_fmt(&w, ",\"steps\":%" PRIu64 ",\"steps_retried\":%" PRIu64, s->steps, s->steps_retried);
	if (s->spec_default) {
		w_str(&w, ",\"speculate\":{");
		w_str(&w, "\"default\":");
		w_jstr(&w, s->spec_default, strlen(s->spec_default));
		w_fmt(&w, ",\"k\":%d,\"drafted\":%" PRIu64 ",\"accepted\":%" PRIu64 ",\"acceptance\":", s->spec_k,
		      s->spec_drafted, s->spec_accepted);
		w_num(&w, s->spec_drafted ? (double)s->spec_accepted / (double)s->spec_drafted : NAN);
		static const char *const modes[2] = { "prompt", "draft" };
		w_str(&w, ",\"modes\":{");
		for (int i = 0; i < 2; i++) {
			w_fmt(&w, "%s\"%s\":{\"drafted\":%" PRIu64 ",\"accepted\":%" PRIu64 ",\"acceptance\":", i ? "," : "",
			      modes[i], s->spec_mode_drafted[i], s->spec_mode_accepted[i]);
			w_num(&w, s->spec_mode_drafted[i] ? (double)s->spec_mode_accepted[i] / (double)s->spec_mode_drafted[i]
							  : NAN);
			w_ch(&w, '}');
		}
		w_str(&w, "},\"draft_model\":");
		if (s->draft_model)
			w_jstr(&w, s->draft_model, strlen(s->draft_model));
		else
			w_str(&w, "null");
		w_fmt(&w, ",\"draft_steps\":%" PRIu64, s->draft_steps);
		w_ch(&w, '}');
	}
	if (s->profile_ms && s->n_profile > 0) {
		w_fmt(&w, ",\"profile\":{\"steps\":%" PRIu64 ",\"ms_per_step\":{", s->profile_steps);
		for (int i = 0; i < s->n_profile; i++) {
			if (i)
				w_str(&w, ",");
			w_jstr(&w, s->profile_names[i], strlen(s->profile_names[i]));
			w_str(&w, ":");
			w_num(&w, s->profile_ms[i]);
		}
		w_str(&w, "}}");
	}
	return w_tail(&w);
}

size_t nxp_enc_ok(char *buf, size_t cap, const char *id)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "ok");
	return w_tail(&w);
}

size_t nxp_enc_error(char *buf, size_t cap, const char *id, enum nxp_code code, const char *msg)
{
	struct wr w = {buf, cap, 0};
	w_head(&w, id, "error");
	w_str(&w, ",\"code\":\"");
	w_str(&w, nxp_code_name(code));
	w_str(&w, "\",\"message\":");
	msg = msg ? msg : "";
	w_jstr(&w, msg, strlen(msg));
	return w_tail(&w);
}

/* Runs an encoder twice: once to size, once into an exact buffer. */
#define ENC_ALLOC(call_with_buf_cap)                                                               \
	do {                                                                                       \
		char *buf = NULL;                                                                  \
		size_t cap = 0;                                                                    \
		size_t n = (call_with_buf_cap);                                                    \
		cap = n + 1;                                                                       \
		buf = malloc(cap);                                                                 \
		if (!buf)                                                                          \
			return NULL;                                                               \
		(call_with_buf_cap);                                                               \
		if (len_out)                                                                       \
			*len_out = n;                                                              \
		return buf;                                                                        \
	} while (0)

char *nxp_enc_done_alloc(const char *id, const struct nxp_done *d, size_t *len_out)
{
	ENC_ALLOC(nxp_enc_done(buf, cap, id, d));
}

char *nxp_enc_tool_call_alloc(const char *id, int index, const struct nxp_tool_call *c, size_t *len_out)
{
	ENC_ALLOC(nxp_enc_tool_call(buf, cap, id, index, c));
}

char *nxp_enc_tokens_alloc(const char *id, const int32_t *tokens, int n_tok, size_t *len_out)
{
	ENC_ALLOC(nxp_enc_tokens(buf, cap, id, tokens, n_tok));
}

char *nxp_enc_text_alloc(const char *id, const char *text, size_t text_len, size_t *len_out)
{
	ENC_ALLOC(nxp_enc_text(buf, cap, id, text, text_len));
}

char *nxp_enc_status_alloc(const char *id, const struct nxp_status *s, size_t *len_out)
{
	ENC_ALLOC(nxp_enc_status(buf, cap, id, s));
}

// --- parsing helpers

static int fail(struct nxp_error *e, enum nxp_code code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct nxp_error *e, enum nxp_code code, const char *fmt, ...)
{
	if (e) {
		va_list ap;
		va_start(ap, fmt);
		e->code = code;
		vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
		va_end(ap);
	}
	return -1;
}

const char *nxp_json_error(const json_error_t *je)
{
	if (json_error_code(je) == json_error_null_character)
		return "a string holds \\u0000 (NUL), which nxd does not take";
	return je->text;
}

const char *nxp_json_type(const json_t *v)
{
	if (!v)
		return "nothing";
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "object";
	case JSON_ARRAY: return "array";
	case JSON_STRING: return "string";
	case JSON_INTEGER: return "integer";
	case JSON_REAL: return "real";
	case JSON_TRUE:
	case JSON_FALSE: return "boolean";
	case JSON_NULL: return "null";
	}
	return "value";
}

/* A short quoted rendering of a string value for messages ("abc", cut at 40 bytes). */
static const char *short_str(const char *s, char *buf, size_t cap)
{
	char cut[44];
	size_t n = strlen(s);
	if (n > 40) {
		memcpy(cut, s, 40);
		memcpy(cut + 40, "...", 4);
		s = cut;
		n = 43;
	}
	nxp_json_str(buf, cap, s, n);
	return buf;
}

int nxp_only_fields(json_t *o, const char *where, const char *const *known, const char *what, struct nxp_error *e)
{
	const char *key;
	json_t *v;
	json_object_foreach(o, key, v) {
		size_t i = 0;
		while (known[i] && strcmp(known[i], key))
			i++;
		if (known[i] || json_is_null(v))
			continue;
		char list[320] = "";
		for (size_t k = 0, n = 0; known[k] && n < sizeof(list); k++)
			n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", k ? ", " : "", known[k]);
		return fail(e, NXP_E_BAD_REQUEST, "field '%s%.64s' is not one %s takes (it takes %s)", where, key, what,
			    list);
	}
	return 0;
}

/* A field that is missing or null counts as absent (optional fields keep
 * their defaults), so clients may send null for "not set". */
static json_t *field(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	return v && !json_is_null(v) ? v : NULL;
}

/* Reads an integer-valued number in [lo, hi]. Reals with an integral value
 * (2.0) are accepted, 1.5 is not: JSON itself does not tell them apart and
 * some encoders write every number as a double. */
static int get_int(const json_t *v, const char *name, long long lo, long long hi, long long *out,
		   struct nxp_error *e)
{
	long long x;
	if (json_is_integer(v)) {
		x = json_integer_value(v);
	} else if (json_is_real(v)) {
		double d = json_real_value(v);
		if (d != floor(d))
			return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be an integer, got %.17g", name, d);
		if (!(d >= (double)LLONG_MIN && d < (double)LLONG_MAX))
			return fail(e, NXP_E_OUT_OF_RANGE, "field '%s' must be in %lld..%lld, got %.17g",
				    name, lo, hi, d);
		x = (long long)d;
	} else {
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be an integer, got %s", name,
			    nxp_json_type(v));
	}
	if (x < lo || x > hi)
		return fail(e, NXP_E_OUT_OF_RANGE, "field '%s' must be in %lld..%lld, got %lld", name, lo,
			    hi, x);
	*out = x;
	return 0;
}

static int opt_int(json_t *obj, const char *name, long long lo, long long hi, int *out,
		   struct nxp_error *e)
{
	json_t *v = field(obj, name);
	long long x;
	if (!v)
		return 0;
	if (get_int(v, name, lo, hi, &x, e))
		return -1;
	*out = (int)x;
	return 0;
}

/* The range of a number field, checked on the value as sent, before it
 * becomes a float: -1e-300 is negative even though it rounds to -0. */
struct real_rule {
	double lo, hi;
	bool lo_open, hi_open;
	const char *text; /* "must be in (0, 1]"; unused when the range is everything */
};

static const struct real_rule R_TEMPERATURE = {0, HUGE_VAL, false, false, "must be >= 0 (0 is greedy)"};
static const struct real_rule R_TOP_P = {0, 1, true, false, "must be in (0, 1]"};
static const struct real_rule R_MIN_P = {0, 1, false, false, "must be in [0, 1]"};
static const struct real_rule R_PENALTY = {0, HUGE_VAL, true, false, "must be > 0 (1 is off)"};
static const struct real_rule R_SCALE = {-HUGE_VAL, HUGE_VAL, false, false, NULL};
static const struct real_rule R_COUNT_PENALTY = {-2, 2, false, false, "must be in [-2, 2] (0 is off)"};

/* The shortest text that reads back as d, so a message shows the value
 * that was sent ("1.0000000001", where %g would say "1"). */
static const char *real_text(double d, char buf[32])
{
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, 32, "%.*g", prec, d);
		if (strtod(buf, NULL) == d)
			break;
	}
	return buf;
}

/* A number held as a float: in the field's range, and one a float can
 * hold, neither rounding to infinity nor a nonzero value rounding to 0. */
static int get_float(const json_t *v, const char *name, const struct real_rule *rule, float *out,
		     struct nxp_error *e)
{
	char got[32];
	if (!json_is_number(v))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be a number, got %s", name, nxp_json_type(v));
	double d = json_number_value(v);
	if (!isfinite(d)) /* jansson refuses these already */
		return fail(e, NXP_E_OUT_OF_RANGE, "field '%s' must be a finite number, got %s", name,
			    real_text(d, got));
	if (d < rule->lo || d > rule->hi || (rule->lo_open && d == rule->lo) || (rule->hi_open && d == rule->hi))
		return fail(e, NXP_E_OUT_OF_RANGE, "field '%s' %s, got %s", name, rule->text, real_text(d, got));
	float f = (float)d; /* IEEE rounding: what is out of reach becomes inf or 0 */
	if (isinf(f))
		return fail(e, NXP_E_OUT_OF_RANGE,
			    "field '%s' is out of range for a 32-bit float (at most %.8g), got %s", name,
			    (double)FLT_MAX, real_text(d, got));
	if (f == 0.0f && d != 0.0)
		return fail(e, NXP_E_OUT_OF_RANGE,
			    "field '%s' is too close to 0 for a 32-bit float (at least %.2g), got %s", name,
			    (double)FLT_TRUE_MIN, real_text(d, got));
	*out = f;
	return 0;
}

static int opt_float(json_t *obj, const char *name, const struct real_rule *rule, float *out, bool *present,
		     struct nxp_error *e)
{
	json_t *v = field(obj, name);
	if (present)
		*present = v != NULL;
	return v ? get_float(v, name, rule, out, e) : 0;
}

static int opt_bool(json_t *obj, const char *name, bool *out, bool *present, struct nxp_error *e)
{
	json_t *v = field(obj, name);
	if (present)
		*present = v != NULL;
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be a boolean, got %s", name,
			    nxp_json_type(v));
	*out = json_is_true(v);
	return 0;
}

/* An owned copy of a string field; *out stays NULL when absent. */
static int opt_str(json_t *obj, const char *name, char **out, struct nxp_error *e)
{
	json_t *v = field(obj, name);
	if (!v)
		return 0;
	if (!json_is_string(v))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be a string, got %s", name,
			    nxp_json_type(v));
	*out = strdup(json_string_value(v));
	if (!*out)
		return fail(e, NXP_E_INTERNAL, "out of memory copying field '%s'", name);
	return 0;
}

static int req_str(json_t *obj, const char *name, char **out, struct nxp_error *e)
{
	if (!field(obj, name))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' is required", name);
	return opt_str(obj, name, out, e);
}

/* An id (request id or cancel target) as compact JSON text. */
static int id_text(const json_t *v, const char *name, char out[NXP_ID_MAX], struct nxp_error *e)
{
	if (json_is_integer(v)) {
		snprintf(out, NXP_ID_MAX, "%lld", (long long)json_integer_value(v));
		return 0;
	}
	if (!json_is_string(v))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be a string or an integer, got %s",
			    name, nxp_json_type(v));
	char tmp[NXP_ID_MAX];
	size_t n = nxp_json_str(tmp, sizeof(tmp), json_string_value(v), json_string_length(v));
	if (n >= NXP_ID_MAX)
		return fail(e, NXP_E_OUT_OF_RANGE,
			    "field '%s' must be at most %d bytes as JSON text, got %zu", name,
			    NXP_ID_MAX - 1, n);
	memcpy(out, tmp, n + 1);
	return 0;
}

/* An array of token ids in [0, n_vocab). */
static int token_array(json_t *v, const char *name, const struct nxp_limits *lim, int32_t **out,
		       int *n_out, struct nxp_error *e)
{
	if (!json_is_array(v))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be an array of integers, got %s",
			    name, nxp_json_type(v));
	size_t n = json_array_size(v);
	if (n > INT_MAX)
		return fail(e, NXP_E_OUT_OF_RANGE, "field '%s' has too many entries (%zu)", name, n);
	long long hi = lim && lim->n_vocab > 0 ? lim->n_vocab - 1 : INT32_MAX;
	int32_t *t = malloc((n ? n : 1) * sizeof(*t));
	if (!t)
		return fail(e, NXP_E_INTERNAL, "out of memory for field '%s' (%zu entries)", name, n);
	for (size_t i = 0; i < n; i++) {
		char el[64];
		long long x;
		snprintf(el, sizeof(el), "%s[%zu]", name, i);
		if (get_int(json_array_get(v, i), el, 0, hi, &x, e)) {
			free(t);
			return -1;
		}
		t[i] = (int32_t)x;
	}
	*out = t;
	*n_out = (int)n;
	return 0;
}

// --- ops

static int parse_hello(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
		       struct nxp_error *e)
{
	/* "version" itself was checked by nxp_parse; hello is where it is required. */
	if (!field(o, "version"))
		return fail(e, NXP_E_BAD_REQUEST, "field 'version' is required for op 'hello'");
	return 0;
}

static int parse_status(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
			struct nxp_error *e)
{
	return 0;
}

static int parse_cancel(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
			struct nxp_error *e)
{
	json_t *v = field(o, "target");
	if (!v)
		return fail(e, NXP_E_BAD_REQUEST, "field 'target' is required for op 'cancel'");
	return id_text(v, "target", r->u.cancel.target, e);
}

static int parse_tokenize(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
			  struct nxp_error *e)
{
	struct nxp_tokenize *t = &r->u.tok;
	bool add_bos = false, has_bos = false;
	t->add_bos = -1;
	if (req_str(o, "text", &t->text, e) || opt_bool(o, "special", &t->special, NULL, e) ||
	    opt_bool(o, "add_bos", &add_bos, &has_bos, e))
		return -1;
	if (has_bos)
		t->add_bos = add_bos;
	return 0;
}

static int parse_detokenize(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
			    struct nxp_error *e)
{
	json_t *v = field(o, "tokens");
	if (!v)
		return fail(e, NXP_E_BAD_REQUEST, "field 'tokens' is required for op 'detokenize'");
	r->u.detok.special = true;
	if (opt_bool(o, "special", &r->u.detok.special, NULL, e))
		return -1;
	return token_array(v, "tokens", lim, &r->u.detok.tokens, &r->u.detok.n_tokens, e);
}

static int parse_messages(json_t *v, struct nxp_generate *g, struct nxp_error *e)
{
	if (!json_is_array(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'messages' must be an array of objects, got %s",
			    nxp_json_type(v));
	size_t n = json_array_size(v);
	if (n < 1 || n > NXP_MAX_MESSAGES)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'messages' must have 1..%d entries, got %zu",
			    NXP_MAX_MESSAGES, n);
	g->messages = calloc(n, sizeof(*g->messages));
	if (!g->messages)
		return fail(e, NXP_E_INTERNAL, "out of memory for field 'messages'");
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(v, i);
		json_t *role = json_is_object(m) ? field(m, "role") : NULL;
		json_t *content = json_is_object(m) ? field(m, "content") : NULL;
		char sb[64];
		if (!json_is_object(m))
			return fail(e, NXP_E_BAD_REQUEST, "field 'messages[%zu]' must be an object, got %s",
				    i, nxp_json_type(m));
		static const char *const message_fields[] = { "role", "content", "tool_calls", "tool_call_id", NULL };
		char where[40];
		snprintf(where, sizeof(where), "messages[%zu].", i);
		if (nxp_only_fields(m, where, message_fields, "a message", e))
			return -1;
		if (!role)
			return fail(e, NXP_E_BAD_REQUEST, "field 'messages[%zu].role' is required", i);
		if (!json_is_string(role))
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'messages[%zu].role' must be a string, got %s", i,
				    nxp_json_type(role));
		const char *rs = json_string_value(role);
		int ri = -1;
		for (int k = 0; k <= NXP_ROLE_TOOL; k++)
			if (!strcmp(rs, role_names[k]))
				ri = k;
		if (ri < 0)
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'messages[%zu].role' must be one of system, user, assistant, tool, got %s",
				    i, short_str(rs, sb, sizeof(sb)));
		g->messages[i].role = (enum nxp_role)ri;
		g->n_messages = (int)i + 1; /* so free() sees what was copied so far */
		if (nxp_parse_message_tools(m, i, &g->messages[i], e))
			return -1;
		if (!content && g->messages[i].tool_calls)
			continue; /* an assistant message of calls alone */
		if (!content)
			return fail(e, NXP_E_BAD_REQUEST, "field 'messages[%zu].content' is required", i);
		if (!json_is_string(content))
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'messages[%zu].content' must be a string, got %s", i,
				    nxp_json_type(content));
		g->messages[i].content = strdup(json_string_value(content));
		if (!g->messages[i].content)
			return fail(e, NXP_E_INTERNAL, "out of memory copying 'messages[%zu].content'", i);
	}
	return 0;
}

static int parse_stop(json_t *v, struct nxp_generate *g, struct nxp_error *e)
{
	/* A single string is shorthand for a one-entry list. */
	bool single = json_is_string(v);
	if (!single && !json_is_array(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'stop' must be an array of strings, got %s",
			    nxp_json_type(v));
	size_t n = single ? 1 : json_array_size(v);
	if (n > NXP_MAX_STOP)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'stop' must have at most %d entries, got %zu",
			    NXP_MAX_STOP, n);
	for (size_t i = 0; i < n; i++) {
		json_t *s = single ? v : json_array_get(v, i);
		if (!json_is_string(s))
			return fail(e, NXP_E_BAD_REQUEST, "field 'stop[%zu]' must be a string, got %s", i,
				    nxp_json_type(s));
		size_t len = json_string_length(s);
		if (len < 1 || len > NXP_MAX_STOP_LEN)
			return fail(e, NXP_E_OUT_OF_RANGE,
				    "field 'stop[%zu]' must be 1..%d bytes long, got %zu", i,
				    NXP_MAX_STOP_LEN, len);
		g->stop[i] = strdup(json_string_value(s));
		g->n_stop = (int)i + 1;
		if (!g->stop[i])
			return fail(e, NXP_E_INTERNAL, "out of memory copying 'stop[%zu]'", i);
	}
	return 0;
}

static int parse_lora(json_t *v, struct nxp_generate *g, struct nxp_error *e)
{
	if (!json_is_array(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'lora' must be an array of objects, got %s",
			    nxp_json_type(v));
	size_t n = json_array_size(v);
	if (n > NXP_MAX_LORA)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'lora' must have at most %d entries, got %zu",
			    NXP_MAX_LORA, n);
	if (n == 0)
		return 0;
	g->lora = calloc(n, sizeof(*g->lora));
	if (!g->lora)
		return fail(e, NXP_E_INTERNAL, "out of memory for field 'lora'");
	for (size_t i = 0; i < n; i++) {
		json_t *a = json_array_get(v, i);
		if (!json_is_object(a))
			return fail(e, NXP_E_BAD_REQUEST, "field 'lora[%zu]' must be an object, got %s", i,
				    nxp_json_type(a));
		static const char *const lora_fields[] = { "name", "scale", NULL };
		char where[24];
		snprintf(where, sizeof(where), "lora[%zu].", i);
		if (nxp_only_fields(a, where, lora_fields, "an adapter entry", e))
			return -1;
		json_t *nm = field(a, "name");
		if (!nm)
			return fail(e, NXP_E_BAD_REQUEST, "field 'lora[%zu].name' is required", i);
		if (!json_is_string(nm))
			return fail(e, NXP_E_BAD_REQUEST, "field 'lora[%zu].name' must be a string, got %s",
				    i, nxp_json_type(nm));
		size_t len = json_string_length(nm);
		if (len < 1 || len > NXP_MAX_LORA_NAME)
			return fail(e, NXP_E_OUT_OF_RANGE,
				    "field 'lora[%zu].name' must be 1..%d bytes long, got %zu", i,
				    NXP_MAX_LORA_NAME, len);
		for (size_t k = 0; k < i; k++)
			if (!strcmp(g->lora[k].name, json_string_value(nm)))
				return fail(e, NXP_E_BAD_REQUEST,
					    "field 'lora[%zu].name' repeats adapter '%s'", i, g->lora[k].name);
		g->lora[i].scale = 1.0f;
		json_t *sc = field(a, "scale");
		if (sc) {
			char nm_scale[32];
			snprintf(nm_scale, sizeof(nm_scale), "lora[%zu].scale", i);
			if (get_float(sc, nm_scale, &R_SCALE, &g->lora[i].scale, e))
				return -1;
			g->lora[i].has_scale = true;
		}
		g->lora[i].name = strdup(json_string_value(nm));
		g->n_lora = (int)i + 1;
		if (!g->lora[i].name)
			return fail(e, NXP_E_INTERNAL, "out of memory copying 'lora[%zu].name'", i);
	}
	return 0;
}

const char *nxp_spec_mode_name(enum nxp_spec_mode m)
{
	return m == NXP_SPEC_PROMPT ? "prompt" : m == NXP_SPEC_DRAFT ? "draft" : "off";
}

bool nxp_spec_mode_parse(const char *s, enum nxp_spec_mode *m)
{
	if (!strcmp(s, "off"))
		*m = NXP_SPEC_OFF;
	else if (!strcmp(s, "prompt"))
		*m = NXP_SPEC_PROMPT;
	else if (!strcmp(s, "draft"))
		*m = NXP_SPEC_DRAFT;
	else
		return false;
	return true;
}

/* "speculate": {"mode": "off" | "prompt" | "draft", "k": 1..NXP_MAX_SPEC_K}.
 * A key nxd does not know is refused, not ignored: the
 * client would believe it in effect. */
static int parse_speculate(json_t *v, struct nxp_generate *g, struct nxp_error *e)
{
	if (!json_is_object(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'speculate' must be an object, got %s", nxp_json_type(v));
	const char *key;
	json_t *val;
	json_object_foreach(v, key, val) {
		if (strcmp(key, "mode") && strcmp(key, "k"))
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'speculate.%s' is not supported (speculate takes 'mode' and 'k')", key);
	}
	json_t *mode = field(v, "mode");
	if (mode) {
		if (!json_is_string(mode))
			return fail(e, NXP_E_BAD_REQUEST, "field 'speculate.mode' must be a string, got %s",
				    nxp_json_type(mode));
		if (!nxp_spec_mode_parse(json_string_value(mode), &g->spec_mode))
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'speculate.mode' must be \"off\", \"prompt\" or \"draft\", got \"%.64s\"",
				    json_string_value(mode));
	}
	json_t *k = field(v, "k");
	long long kk;
	if (k) {
		if (get_int(k, "speculate.k", 1, NXP_MAX_SPEC_K, &kk, e))
			return -1;
		g->spec_k = (int)kk;
	}
	return 0;
}

/* "format" ("json" or a JSON schema) or "grammar" (GBNF text), compiled
 * here: what cannot be compiled is refused naming the construct. */
static int parse_constraint(json_t *o, struct nxp_generate *g, struct nxp_error *e)
{
	json_t *fmt = field(o, "format"), *gr = field(o, "grammar");
	if (!fmt && !gr)
		return 0;
	if (fmt && gr)
		return fail(e, NXP_E_BAD_REQUEST, "fields 'format' and 'grammar' cannot be used together");
	if (g->ignore_eos)
		return fail(e, NXP_E_BAD_REQUEST,
			    "field 'ignore_eos' cannot be used with '%s': the grammar decides where the output ends",
			    fmt ? "format" : "grammar");
	struct nx_err err = {{0}};
	char *text = NULL;
	const char *src;
	size_t len;
	if (gr) {
		if (!json_is_string(gr))
			return fail(e, NXP_E_BAD_REQUEST, "field 'grammar' must be a string of GBNF rules, got %s",
				    nxp_json_type(gr));
		src = json_string_value(gr);
		len = json_string_length(gr);
		g->format = NXP_FMT_GRAMMAR;
	} else if (json_is_string(fmt)) {
		if (strcmp(json_string_value(fmt), "json"))
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'format' must be \"json\" or a JSON schema object, got the string \"%.64s\"",
				    json_string_value(fmt));
		src = nx_grammar_json_gbnf();
		len = strlen(src);
		g->format = NXP_FMT_JSON;
	} else if (json_is_object(fmt) || json_is_boolean(fmt)) {
		char *schema = json_dumps(fmt, JSON_COMPACT | JSON_ENCODE_ANY);
		if (!schema)
			return fail(e, NXP_E_INTERNAL, "out of memory copying 'format'");
		int rc = nx_schema_to_gbnf(schema, strlen(schema), &text, &err);
		free(schema);
		if (rc)
			return fail(e, NXP_E_BAD_REQUEST, "field 'format': %s", err.msg);
		src = text;
		len = strlen(text);
		g->format = NXP_FMT_SCHEMA;
	} else {
		return fail(e, NXP_E_BAD_REQUEST, "field 'format' must be \"json\" or a JSON schema object, got %s",
			    nxp_json_type(fmt));
	}
	int rc = nx_grammar_compile(src, len, &g->grammar, &err);
	free(text);
	if (rc)
		return fail(e, NXP_E_BAD_REQUEST, "field '%s': %s", gr ? "grammar" : "format", err.msg);
	return 0;
}

static int parse_generate(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
			  struct nxp_error *e)
{
	struct nxp_generate *g = &r->u.gen;
	json_t *prompt = field(o, "prompt"), *messages = field(o, "messages"),
	       *tokens = field(o, "tokens");
	int n_in = !!prompt + !!messages + !!tokens;

	g->stream = true;
	g->sampling = nx_sample_params_default();
	if (n_in == 0)
		return fail(e, NXP_E_BAD_REQUEST,
			    "one of the fields 'prompt', 'messages' or 'tokens' is required");
	if (n_in > 1)
		return fail(e, NXP_E_BAD_REQUEST,
			    "fields 'prompt', 'messages' and 'tokens' are exclusive, got %s%s%s",
			    prompt ? "'prompt' " : "", messages ? "'messages' " : "",
			    tokens ? "'tokens'" : "");

	bool think = false, has_think = false;
	if (opt_bool(o, "raw", &g->raw, NULL, e) || opt_str(o, "system", &g->system, e) ||
	    opt_bool(o, "think", &think, &has_think, e))
		return -1;
	g->think = !has_think ? NXP_THINK_DEFAULT : think ? NXP_THINK_ON : NXP_THINK_OFF;
	if (has_think && (tokens || g->raw))
		return fail(e, NXP_E_BAD_REQUEST,
			    "field 'think' applies only to 'messages' and to a 'prompt' without 'raw': the chat template "
			    "turns thinking on or off");
	if (prompt) {
		g->input = NXP_IN_PROMPT;
		if (opt_str(o, "prompt", &g->prompt, e))
			return -1;
		if (g->raw && g->system)
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'system' cannot be used with 'raw': a raw prompt has no template");
	} else {
		if (g->raw)
			return fail(e, NXP_E_BAD_REQUEST, "field 'raw' applies only to 'prompt'");
		if (g->system)
			return fail(e, NXP_E_BAD_REQUEST,
				    "field 'system' applies only to 'prompt'; put a system message in 'messages'");
	}
	if (messages) {
		g->input = NXP_IN_MESSAGES;
		if (parse_messages(messages, g, e))
			return -1;
	}
	if (tokens) {
		g->input = NXP_IN_TOKENS;
		if (token_array(tokens, "tokens", lim, &g->tokens, &g->n_tokens, e))
			return -1;
		if (g->n_tokens < 1)
			return fail(e, NXP_E_OUT_OF_RANGE, "field 'tokens' must have at least 1 entry, got 0");
		if (lim && lim->n_ctx > 0 && g->n_tokens > lim->n_ctx)
			return fail(e, NXP_E_CONTEXT_OVERFLOW,
				    "field 'tokens' has %d tokens, more than the context of %d", g->n_tokens,
				    lim->n_ctx);
	}

	/* max_tokens: at least 1; more than the limit is the limit, as the
	 * default is (a client asking for "as much as fits" is not wrong). */
	long long mt_hi = INT32_MAX, mt = NXP_DEFAULT_MAX_TOKENS;
	if (lim && lim->max_tokens > 0)
		mt_hi = lim->max_tokens;
	else if (lim && lim->n_ctx > 0)
		mt_hi = lim->n_ctx;
	json_t *mtv = field(o, "max_tokens");
	if (mtv && get_int(mtv, "max_tokens", LLONG_MIN, LLONG_MAX, &mt, e))
		return -1;
	if (mt < 1)
		return fail(e, NXP_E_OUT_OF_RANGE,
			    "field 'max_tokens' must be at least 1 (more than %lld is taken as %lld), got %lld", mt_hi,
			    mt_hi, mt);
	g->max_tokens = (int)(mt < mt_hi ? mt : mt_hi);

	/* Sampling: each range checked on the value sent (get_float, opt_int);
	 * the sampler's own check below agrees and stays the last word. */
	struct nx_sample_params *sp = &g->sampling;
	if (opt_float(o, "temperature", &R_TEMPERATURE, &sp->temperature, NULL, e) ||
	    opt_int(o, "top_k", 0, INT32_MAX, &sp->top_k, e) ||
	    opt_float(o, "top_p", &R_TOP_P, &sp->top_p, NULL, e) ||
	    opt_float(o, "min_p", &R_MIN_P, &sp->min_p, NULL, e) ||
	    opt_float(o, "repeat_penalty", &R_PENALTY, &sp->repeat_penalty, NULL, e) ||
	    opt_int(o, "repeat_last_n", 0, INT32_MAX, &sp->repeat_last_n, e) ||
	    opt_float(o, "presence_penalty", &R_COUNT_PENALTY, &sp->presence_penalty, NULL, e) ||
	    opt_float(o, "frequency_penalty", &R_COUNT_PENALTY, &sp->frequency_penalty, NULL, e) ||
	    opt_int(o, "logprobs", 0, NXP_MAX_LOGPROBS, &sp->n_logprobs, e))
		return -1;
	json_t *seed = field(o, "seed");
	if (seed) {
		long long s;
		/* jansson holds integers as int64, so the seed range is 0..2^63-1. */
		if (get_int(seed, "seed", 0, LLONG_MAX, &s, e))
			return -1;
		sp->seed = (uint64_t)s;
		g->has_seed = true;
	}
	struct nx_err se;
	if (nx_sample_params_check(sp, &se))
		return fail(e, NXP_E_OUT_OF_RANGE, "%s", se.msg);

	json_t *stop = field(o, "stop"), *lora = field(o, "lora");
	if (stop && parse_stop(stop, g, e))
		return -1;
	if (opt_bool(o, "ignore_eos", &g->ignore_eos, NULL, e) ||
	    opt_bool(o, "stream", &g->stream, NULL, e))
		return -1;
	if (lora && parse_lora(lora, g, e))
		return -1;
	json_t *spec = field(o, "speculate");
	if (spec && parse_speculate(spec, g, e))
		return -1;
	if (nxp_parse_tools(o, g, e) || parse_constraint(o, g, e))
		return -1;
	/* A grammar would have to admit the family's tool-call syntax as well;
	 * not one nxd writes, so the two are not combined. */
	if (g->tools && g->grammar)
		return fail(e, NXP_E_BAD_REQUEST, "field 'tools' cannot be used with '%s'",
			    g->format == NXP_FMT_GRAMMAR ? "grammar" : "format");
	if (g->tools && g->ignore_eos && (g->tool_choice == NXP_TOOLS_REQUIRED || g->tool_choice == NXP_TOOLS_NAMED))
		return fail(e, NXP_E_BAD_REQUEST, "field 'ignore_eos' cannot be used with a 'tool_choice' that asks for a "
			    "call: the call's grammar decides where the answer ends");
	return 0;
}

/* An adapter name: 1..NXP_MAX_LORA_NAME bytes of [A-Za-z0-9._-] (names show
 * up in listings and logs; a name that needs escaping helps nobody). */
static int lora_name(json_t *o, struct nxp_lora_op *l, const char *op, struct nxp_error *e)
{
	json_t *v = field(o, "name");
	if (!v)
		return fail(e, NXP_E_BAD_REQUEST, "field 'name' is required for op '%s'", op);
	if (!json_is_string(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'name' must be a string, got %s", nxp_json_type(v));
	const char *s = json_string_value(v);
	size_t len = json_string_length(v);
	if (len < 1 || len > NXP_MAX_LORA_NAME)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'name' must be 1..%d bytes long, got %zu",
			    NXP_MAX_LORA_NAME, len);
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-')) {
			char sb[64];
			return fail(e, NXP_E_BAD_REQUEST, "field 'name' may only hold A-Z a-z 0-9 . _ -, got %s",
				    short_str(s, sb, sizeof(sb)));
		}
	}
	return opt_str(o, "name", &l->name, e);
}

static int type_name_field(json_t *v, const char *name, char out[NXP_MAX_TYPE_NAME], struct nxp_error *e)
{
	if (!json_is_string(v))
		return fail(e, NXP_E_BAD_REQUEST, "field '%s' must be a string, got %s", name, nxp_json_type(v));
	size_t len = json_string_length(v);
	if (len < 1 || len >= NXP_MAX_TYPE_NAME)
		return fail(e, NXP_E_OUT_OF_RANGE, "field '%s' must be 1..%d bytes long, got %zu", name,
			    NXP_MAX_TYPE_NAME - 1, len);
	memcpy(out, json_string_value(v), len + 1);
	return 0;
}

static int lora_scale(json_t *o, struct nxp_lora_op *l, struct nxp_error *e)
{
	return opt_float(o, "scale", &R_SCALE, &l->scale, &l->has_scale, e);
}

static int parse_lora_load(json_t *o, const struct nxp_limits *lim, struct nxp_request *r, struct nxp_error *e)
{
	struct nxp_lora_op *l = &r->u.lora;
	if (lora_name(o, l, "lora_load", e))
		return -1;
	json_t *v = field(o, "path");
	if (!v)
		return fail(e, NXP_E_BAD_REQUEST, "field 'path' is required for op 'lora_load'");
	if (!json_is_string(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'path' must be a string, got %s", nxp_json_type(v));
	if (json_string_length(v) < 1 || json_string_length(v) > NXP_MAX_LORA_PATH)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'path' must be 1..%d bytes long, got %zu", NXP_MAX_LORA_PATH,
			    json_string_length(v));
	return opt_str(o, "path", &l->path, e) || lora_scale(o, l, e) ? -1 : 0;
}

static int parse_lora_list(json_t *o, const struct nxp_limits *lim, struct nxp_request *r, struct nxp_error *e)
{
	return opt_bool(o, "checksum", &r->u.lora.checksum, NULL, e);
}

static int parse_lora_unload(json_t *o, const struct nxp_limits *lim, struct nxp_request *r, struct nxp_error *e)
{
	return lora_name(o, &r->u.lora, "lora_unload", e);
}

static int parse_lora_unfold(json_t *o, const struct nxp_limits *lim, struct nxp_request *r, struct nxp_error *e)
{
	return lora_name(o, &r->u.lora, "lora_unfold", e);
}

/* "prompt" (probe text) and "layers" (which layers to grade) of a report. */
static int lora_probe_fields(json_t *o, struct nxp_lora_op *l, struct nxp_error *e)
{
	if (opt_str(o, "prompt", &l->prompt, e))
		return -1;
	json_t *v = field(o, "layers");
	if (!v)
		return 0;
	if (!json_is_array(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'layers' must be an array of integers, got %s", nxp_json_type(v));
	size_t n = json_array_size(v);
	if (n < 1 || n > NXP_MAX_LAYERS)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'layers' must have 1..%d entries, got %zu", NXP_MAX_LAYERS, n);
	l->layers = calloc(n, sizeof(int));
	if (!l->layers)
		return fail(e, NXP_E_INTERNAL, "out of memory for field 'layers'");
	for (size_t i = 0; i < n; i++) {
		char nm[32];
		long long x;
		snprintf(nm, sizeof(nm), "layers[%zu]", i);
		if (get_int(json_array_get(v, i), nm, 0, NXP_MAX_LAYERS - 1, &x, e))
			return -1;
		l->layers[i] = (int)x;
		l->n_layers = (int)i + 1;
	}
	return 0;
}

static int parse_lora_fold(json_t *o, const struct nxp_limits *lim, struct nxp_request *r, struct nxp_error *e)
{
	struct nxp_lora_op *l = &r->u.lora;
	json_t *v;
	if (lora_name(o, l, "lora_fold", e) || lora_scale(o, l, e) || opt_bool(o, "dry_run", &l->dry_run, NULL, e))
		return -1;
	if ((v = field(o, "type")) && type_name_field(v, "type", l->type, e))
		return -1;
	return lora_probe_fields(o, l, e);
}

static int parse_lora_report(json_t *o, const struct nxp_limits *lim, struct nxp_request *r, struct nxp_error *e)
{
	struct nxp_lora_op *l = &r->u.lora;
	if (lora_name(o, l, "lora_report", e) || lora_scale(o, l, e) || lora_probe_fields(o, l, e))
		return -1;
	json_t *v = field(o, "types");
	if (!v)
		return 0;
	if (json_is_string(v)) {
		l->n_types = 1;
		return type_name_field(v, "types", l->types[0], e);
	}
	if (!json_is_array(v))
		return fail(e, NXP_E_BAD_REQUEST, "field 'types' must be a string or an array of strings, got %s",
			    nxp_json_type(v));
	size_t n = json_array_size(v);
	if (n < 1 || n > NXP_MAX_FOLD_TYPES)
		return fail(e, NXP_E_OUT_OF_RANGE, "field 'types' must have 1..%d entries, got %zu", NXP_MAX_FOLD_TYPES,
			    n);
	for (size_t i = 0; i < n; i++) {
		char nm[32];
		snprintf(nm, sizeof(nm), "types[%zu]", i);
		if (type_name_field(json_array_get(v, i), nm, l->types[i], e))
			return -1;
		l->n_types = (int)i + 1;
	}
	return 0;
}

typedef int (*op_parse_fn)(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
			   struct nxp_error *e);

/* The fields each op takes (with id, op and version, which every op may
 * carry): any other is refused by name (nxp_only_fields). */
#define COMMON_FIELDS "id", "op", "version"
static const char *const no_fields[] = { COMMON_FIELDS, NULL };
static const char *const generate_fields[] = {
	COMMON_FIELDS, "prompt", "messages", "tokens", "raw", "system", "think", "max_tokens", "temperature", "top_k",
	"top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "logprobs", "seed",
	"stop", "ignore_eos", "stream", "lora", "speculate", "tools", "tool_choice", "parallel_tool_calls", "format",
	"grammar", NULL
};
static const char *const tokenize_fields[] = { COMMON_FIELDS, "text", "special", "add_bos", NULL };
static const char *const detokenize_fields[] = { COMMON_FIELDS, "tokens", "special", NULL };
static const char *const cancel_fields[] = { COMMON_FIELDS, "target", NULL };
static const char *const lora_load_fields[] = { COMMON_FIELDS, "name", "path", "scale", NULL };
static const char *const lora_list_fields[] = { COMMON_FIELDS, "checksum", NULL };
static const char *const lora_name_fields[] = { COMMON_FIELDS, "name", NULL };
static const char *const lora_fold_fields[] = { COMMON_FIELDS, "name", "scale", "dry_run", "type", "prompt", "layers",
						NULL };
static const char *const lora_report_fields[] = { COMMON_FIELDS, "name", "scale", "prompt", "layers", "types", NULL };

static const struct {
	const char *name;
	enum nxp_op op;
	bool id_required;
	op_parse_fn parse;
	const char *const *fields;
} op_table[] = {
	{"hello", NXP_OP_HELLO, false, parse_hello, no_fields},
	{"generate", NXP_OP_GENERATE, true, parse_generate, generate_fields},
	{"tokenize", NXP_OP_TOKENIZE, true, parse_tokenize, tokenize_fields},
	{"detokenize", NXP_OP_DETOKENIZE, true, parse_detokenize, detokenize_fields},
	{"status", NXP_OP_STATUS, true, parse_status, no_fields},
	{"cancel", NXP_OP_CANCEL, true, parse_cancel, cancel_fields},
	{"lora_load", NXP_OP_LORA_LOAD, true, parse_lora_load, lora_load_fields},
	{"lora_list", NXP_OP_LORA_LIST, true, parse_lora_list, lora_list_fields},
	{"lora_unload", NXP_OP_LORA_UNLOAD, true, parse_lora_unload, lora_name_fields},
	{"lora_fold", NXP_OP_LORA_FOLD, true, parse_lora_fold, lora_fold_fields},
	{"lora_unfold", NXP_OP_LORA_UNFOLD, true, parse_lora_unfold, lora_name_fields},
	{"lora_report", NXP_OP_LORA_REPORT, true, parse_lora_report, lora_report_fields},
	{"shutdown", NXP_OP_SHUTDOWN, true, parse_status, no_fields},
};

static int parse_obj(json_t *o, const struct nxp_limits *lim, struct nxp_request *r,
		     struct nxp_error *e)
{
	json_t *id = field(o, "id");
	if (id) {
		if (id_text(id, "id", r->id, e))
			return -1;
		r->has_id = true;
	}

	json_t *ver = field(o, "version");
	if (ver) {
		long long v;
		if (get_int(ver, "version", INT_MIN, INT_MAX, &v, e))
			return -1;
		r->version = (int)v;
		if (v != NXP_VERSION)
			return fail(e, NXP_E_UNSUPPORTED_VERSION,
				    "protocol version %lld is not supported; this server speaks version %d",
				    v, NXP_VERSION);
	}

	json_t *op = field(o, "op");
	if (!op)
		return fail(e, NXP_E_BAD_REQUEST, "field 'op' is required");
	if (!json_is_string(op))
		return fail(e, NXP_E_BAD_REQUEST, "field 'op' must be a string, got %s", nxp_json_type(op));
	const char *name = json_string_value(op);
	for (size_t i = 0; i < sizeof(op_table) / sizeof(op_table[0]); i++) {
		if (strcmp(name, op_table[i].name))
			continue;
		if (op_table[i].id_required && !r->has_id)
			return fail(e, NXP_E_BAD_REQUEST, "field 'id' is required for op '%s'", name);
		r->op = op_table[i].op;
		char what[48];
		snprintf(what, sizeof(what), "op '%s'", name);
		if (nxp_only_fields(o, "", op_table[i].fields, what, e))
			return -1;
		return op_table[i].parse(o, lim, r, e);
	}
	char sb[64];
	return fail(e, NXP_E_UNKNOWN_OP, "field 'op' names no known operation, got %s",
		    short_str(name, sb, sizeof(sb)));
}

/* When jansson stops inside a bare value ("temperature":NaN, "seed":1e999),
 * the key right before it names the field: finds it, or returns 0. Only
 * plain keys ([A-Za-z0-9_]) and values without quotes or commas count, so a
 * ':' inside some string is never mistaken for one. */
static int key_before(const char *s, size_t len, size_t pos, char *key, size_t cap)
{
	if (pos > len)
		pos = len;
	size_t i = pos;
	while (i > 0 && s[i - 1] != ':') {
		char c = s[i - 1];
		if (c == '"' || c == ',' || c == '{' || c == '[' || c == '}' || c == ']')
			return 0;
		i--;
	}
	if (i == 0)
		return 0;
	i--; /* at ':' */
	while (i > 0 && (s[i - 1] == ' ' || s[i - 1] == '\t' || s[i - 1] == '\r' || s[i - 1] == '\n'))
		i--;
	if (i == 0 || s[i - 1] != '"')
		return 0;
	size_t end = --i, start = end;
	while (start > 0 && s[start - 1] != '"') {
		char c = s[start - 1];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
			return 0;
		start--;
	}
	if (start == 0 || end == start || end - start >= cap)
		return 0;
	memcpy(key, s + start, end - start);
	key[end - start] = '\0';
	return 1;
}

/* jansson counts every value as a level, the innermost number too, and
 * stops at JSON_PARSER_MAX_DEPTH: a limit that is not one nesting depth
 * (2048 empty arrays pass, 2048 around a number do not). The request's own
 * limit is checked first and sits below jansson's, so jansson's never decides. */
_Static_assert(NXP_MAX_DEPTH + 1 < JSON_PARSER_MAX_DEPTH, "jansson must parse what NXP_MAX_DEPTH lets through");

/* Offset of the first '[' or '{' nested deeper than max, or -1. Brackets in
 * strings are text; malformed JSON is left for jansson to name. */
static long too_deep(const char *s, size_t n, int max)
{
	int depth = 0;
	bool in_str = false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = false;
		} else if (c == '"') {
			in_str = true;
		} else if (c == '[' || c == '{') {
			if (++depth > max)
				return (long)i;
		} else if ((c == ']' || c == '}') && depth > 0) {
			depth--;
		}
	}
	return -1;
}

int nxp_parse(const char *line, size_t len, const struct nxp_limits *lim, struct nxp_request *req,
	      struct nxp_error *e)
{
	memset(req, 0, sizeof(*req));
	strcpy(req->id, "null");
	size_t max_line = lim && lim->max_line ? lim->max_line : NXP_MAX_LINE;
	size_t body = len;
	if (body && line[body - 1] == '\n')
		body--;
	if (body && line[body - 1] == '\r')
		body--;
	if (body > max_line)
		return fail(e, NXP_E_TOO_LARGE, "request line of %zu bytes is over the limit of %zu bytes",
			    body, max_line);

	long deep = too_deep(line, body, NXP_MAX_DEPTH);
	if (deep >= 0)
		return fail(e, NXP_E_PARSE_ERROR,
			    "request nested deeper than %d levels of arrays and objects (at byte %ld)", NXP_MAX_DEPTH,
			    deep + 1);

	json_error_t jerr;
	/* Duplicate keys are refused: two readers could otherwise disagree on
	 * which "max_tokens" counts. jansson also refuses NaN, Infinity, numbers
	 * that overflow a double (1e999) or int64, invalid UTF-8 and \u0000. */
	json_t *o = json_loadb(line, body, JSON_REJECT_DUPLICATES, &jerr);
	if (!o) {
		char key[64];
		if (jerr.position >= 0 && key_before(line, body, (size_t)jerr.position, key, sizeof(key)))
			return fail(e, NXP_E_PARSE_ERROR, "invalid JSON at column %d, field '%s': %s",
				    jerr.column, key, nxp_json_error(&jerr));
		return fail(e, NXP_E_PARSE_ERROR, "invalid JSON at column %d: %s", jerr.column,
			    nxp_json_error(&jerr));
	}
	int rc;
	if (!json_is_object(o))
		rc = fail(e, NXP_E_PARSE_ERROR, "a request must be a JSON object, got %s", nxp_json_type(o));
	else
		rc = parse_obj(o, lim, req, e);
	json_decref(o);
	return rc;
}

void nxp_request_free(struct nxp_request *req)
{
	if (!req)
		return;
	switch (req->op) {
	case NXP_OP_GENERATE: {
		struct nxp_generate *g = &req->u.gen;
		free(g->prompt);
		free(g->system);
		for (int i = 0; i < g->n_messages; i++) {
			free(g->messages[i].content);
			free(g->messages[i].tool_calls);
			free(g->messages[i].tool_call_id);
		}
		free(g->messages);
		free(g->tools);
		free(g->tokens);
		for (int i = 0; i < g->n_stop; i++)
			free(g->stop[i]);
		for (int i = 0; i < g->n_lora; i++)
			free(g->lora[i].name);
		free(g->lora);
		nx_grammar_free(g->grammar);
		break;
	}
	case NXP_OP_TOKENIZE:
		free(req->u.tok.text);
		break;
	case NXP_OP_DETOKENIZE:
		free(req->u.detok.tokens);
		break;
	case NXP_OP_LORA_LOAD:
	case NXP_OP_LORA_LIST:
	case NXP_OP_LORA_UNLOAD:
	case NXP_OP_LORA_FOLD:
	case NXP_OP_LORA_UNFOLD:
	case NXP_OP_LORA_REPORT:
		free(req->u.lora.name);
		free(req->u.lora.path);
		free(req->u.lora.prompt);
		free(req->u.lora.layers);
		break;
	case NXP_OP_NONE:
	case NXP_OP_HELLO:
	case NXP_OP_STATUS:
	case NXP_OP_CANCEL:
	case NXP_OP_SHUTDOWN:
		break;
	}
	char id[NXP_ID_MAX];
	memcpy(id, req->id, sizeof(id));
	memset(req, 0, sizeof(*req));
	memcpy(req->id, id, sizeof(id)); /* the id may still be needed for the reply */
	req->id[NXP_ID_MAX - 1] = '\0';
}

// --- socket path

int nxp_default_socket_path(char *buf, size_t cap)
{
	const size_t sun_max = 108; /* sizeof(((struct sockaddr_un *)0)->sun_path) on Linux */
	const char *env = getenv("NXD_SOCKET");
	int n;
	if (env && *env)
		n = snprintf(buf, cap, "%s", env);
	else if (geteuid() == 0)
		n = snprintf(buf, cap, "%s", NXP_SYSTEM_SOCKET);
	else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		n = snprintf(buf, cap, "%s/nxd.sock", env);
	else
		n = snprintf(buf, cap, "/run/user/%u/nxd.sock", (unsigned)geteuid());
	if (n < 0 || (size_t)n >= cap || (size_t)n >= sun_max) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}
