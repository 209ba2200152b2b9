/* ollama.c - the core of ollama's API (/api/chat, /api/generate, /api/tags, /api/ps, /api/version), NDJSON streams. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/nxh.h"

/* ollama's defaults (api/types.go DefaultOptions) where they differ from nxd's. */
static const struct { const char *ollama, *nxd; double def; bool integer; } options[] = {
	{ "temperature", "temperature", 0.8, false }, { "top_p", "top_p", 0.9, false },
	{ "top_k", "top_k", 40, true },                { "min_p", "min_p", 0.0, false },
	{ "repeat_penalty", "repeat_penalty", 1.1, false }, { "repeat_last_n", "repeat_last_n", 64, true },
	{ "presence_penalty", "presence_penalty", 0, false }, { "frequency_penalty", "frequency_penalty", 0, false },
	{ "seed", "seed", -1, true }, { "num_predict", "max_tokens", -1, true },
};

static int take_options(struct nxh_req *r, const json_t *o, struct nxh_gen *g)
{
	const char *known[sizeof(options) / sizeof(options[0]) + 2];
	size_t n = 0;
	for (; n < sizeof(options) / sizeof(options[0]); n++)
		known[n] = options[n].ollama;
	known[n++] = "stop";
	known[n] = NULL;
	if (o && !json_is_null(o) && !json_is_object(o)) {
		nxh_req_bad(r, "options", "field 'options' must be an object");
		return -1;
	}
	if (o && json_is_object(o) && nxh_only_fields(r, o, "options.", known))
		return -1;
	for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
		double v = options[i].def;
		bool has = false;
		if (options[i].integer) {
			long long x = (long long)v;
			if (o && nxh_get_int(r, o, options[i].ollama, "options.", INT64_MIN, INT64_MAX, &x, &has))
				return -1;
			if (!strcmp(options[i].nxd, "seed") && x < 0)
				continue; /* -1: a fresh seed */
			if (!strcmp(options[i].nxd, "max_tokens")) {
				if (x < 0)
					continue; /* -1, -2: until the end or the context is full */
				if (x == 0) {
					nxh_req_bad(r, "options.num_predict", "field 'options.num_predict' must not be 0");
					return -1;
				}
				g->has_max_tokens = true;
			}
			json_object_set_new(g->req, options[i].nxd, json_integer(x));
		} else {
			if (o && nxh_get_num(r, o, options[i].ollama, "options.", -1e30, 1e30, &v, &has))
				return -1;
			if (!strcmp(options[i].nxd, "top_p") && v == 0)
				v = 1e-30; /* only the most likely token, as OpenAI's 0 */
			json_object_set_new(g->req, options[i].nxd, json_real(v));
		}
	}
	json_t *stop = o ? json_object_get(o, "stop") : NULL;
	if (stop && !json_is_null(stop))
		json_object_set(g->req, "stop", stop);
	return 0;
}

/* think: false is the chat template's switch, nxd's "think" (a template
 * without it is nxd's bad_request). true asks ollama to answer the thinking
 * apart, in message.thinking, which the gateway does not: refused by name. */
static int think_field(struct nxh_req *r, const json_t *b, struct nxh_gen *g)
{
	const json_t *t = json_object_get(b, "think");
	if (!t || json_is_null(t))
		return 0;
	if (!json_is_false(t)) {
		nxh_req_bad(r, "think", "field 'think' may only be false (the template's switch that turns thinking off): "
				       "nxd-http does not answer the thinking apart from the content");
		return -1;
	}
	json_object_set_new(g->req, "think", json_false());
	return 0;
}

static void iso_now(char *buf, size_t cap);

/* keep_alive: how long ollama keeps a model loaded after a request. nxd
 * serves its model for its whole life, which any duration but zero keeps
 * to; zero (unload now) it cannot do: refused by name. A Go duration
 * ("10m", "1h30m", "-1") or seconds. */
static int keep_alive_field(struct nxh_req *r, const json_t *b)
{
	const json_t *k = json_object_get(b, "keep_alive");
	if (!k || json_is_null(k))
		return 0;
	bool zero = json_is_number(k) && json_number_value(k) == 0, ok = json_is_number(k);
	if (json_is_string(k)) {
		const char *s = json_string_value(k);
		zero = ok = *s != '\0';
		while (ok && *s) {
			char *end;
			double v = strtod(s, &end);
			ok = end != s;
			zero = zero && v == 0;
			for (s = end; ok && *s && strchr("nsum\xc2\xb5h", *s); s++) /* ns us µs ms s m h */
				;
		}
	}
	if (!ok) {
		nxh_req_bad(r, "keep_alive", "field 'keep_alive' must be a duration (\"10m\", \"1h\", -1) or seconds");
		return -1;
	}
	if (zero) {
		nxh_req_bad(r, "keep_alive", "field 'keep_alive' is 0 (unload the model now): nxd serves its model for its "
					    "whole life and cannot unload it");
		return -1;
	}
	return 0;
}

/* A generate without a prompt, or a chat without messages: ollama's way of
 * loading a model before use (ollama run does it). The model is loaded. */
static bool load_only(struct nxh_req *r, struct nxh_gen *g)
{
	const json_t *b = r->json;
	const json_t *p = json_object_get(b, "prompt"), *m = json_object_get(b, "messages"),
		     *sys = json_object_get(b, "system");
	/* a prompt, messages or system of the wrong type is no load: the request's own checks name it */
	bool empty = g->api == NXH_API_OLLAMA_GENERATE
			     ? (!p || json_is_null(p) || (json_is_string(p) && !json_string_length(p))) &&
				       (!sys || json_is_null(sys))
			     : !m || json_is_null(m) || (json_is_array(m) && !json_array_size(m));
	if (!empty)
		return false;
	const char *id = nxh.o.model_id ? nxh.o.model_id : nxh.model.name;
	if (!id || strcmp(g->model, id)) {
		nxh_model_not_found(r);
		return true;
	}
	char now[64];
	iso_now(now, sizeof(now));
	json_t *o = json_pack("{s:s, s:s, s:b, s:s}", "model", g->model, "created_at", now, "done", 1, "done_reason",
			      "load");
	if (g->api == NXH_API_OLLAMA_GENERATE)
		json_object_set_new(o, "response", json_string(""));
	else
		json_object_set_new(o, "message", json_pack("{s:s, s:s}", "role", "assistant", "content", ""));
	nxh_req_answer(r, 200, o);
	return true;
}

static int common(struct nxh_req *r, struct nxh_gen *g, const char *const *known)
{
	const json_t *b = r->json;
	g->req = json_object();
	g->stream = true; /* ollama streams unless told not to */
	const char *m = NULL;
	bool has;
	if (nxh_only_fields(r, b, NULL, known) || nxh_get_str(r, b, "model", NULL, &m, &has) ||
	    nxh_get_bool(r, b, "stream", NULL, &g->stream, &has))
		return -1;
	if (!m) {
		nxh_req_bad(r, "model", "field 'model' is required (GET /api/tags lists it)");
		return -1;
	}
	if (nxh_ollama_format(r, b, g->req) || think_field(r, b, g) || keep_alive_field(r, b))
		return -1;
	size_t n = strlen(m);
	if (n > 7 && !strcmp(m + n - 7, ":latest")) /* ollama's default tag */
		n -= 7;
	g->model = strndup(m, n);
	return take_options(r, json_object_get(b, "options"), g);
}

int nxh_ollama_chat_begin(struct nxh_req *r)
{
	static const char *const known[] = { "model", "messages", "stream", "options", "format", "tools", "think",
					     "keep_alive", NULL };
	struct nxh_gen *g = &r->gen;
	g->api = NXH_API_OLLAMA_CHAT;
	if (common(r, g, known))
		return -1;
	if (load_only(r, g))
		return r->status == 200 ? 0 : -1;
	json_t *msgs = json_object_get(r->json, "messages");
	if (!json_is_array(msgs) || !json_array_size(msgs)) {
		nxh_req_bad(r, "messages", "field 'messages' must be a non-empty array of messages");
		return -1;
	}
	size_t i;
	json_t *msg;
	json_array_foreach(msgs, i, msg) {
		static const char *const mk[] = { "role", "content", "tool_calls", "tool_name", NULL };
		char where[48];
		snprintf(where, sizeof(where), "messages[%zu].", i);
		if (!json_is_object(msg)) {
			nxh_req_bad(r, "messages", "field 'messages[%zu]' must be an object", i);
			return -1;
		}
		if (nxh_only_fields(r, msg, where, mk))
			return -1; /* images, thinking... */
	}
	/* tool_name names the tool a result comes from: the templates nxd
	 * renders have no place for it (they go by order), so it is dropped */
	json_t *out = json_deep_copy(msgs);
	json_array_foreach(out, i, msg)
		json_object_del(msg, "tool_name");
	json_object_set_new(g->req, "messages", out); /* nxd checks roles, contents and calls */
	json_t *tools = json_object_get(r->json, "tools");
	if (tools && !json_is_null(tools))
		json_object_set(g->req, "tools", tools);
	return 0;
}

int nxh_ollama_generate_begin(struct nxh_req *r)
{
	static const char *const known[] = { "model", "prompt", "system", "raw", "stream", "options", "format", "think",
					     "keep_alive", NULL };
	struct nxh_gen *g = &r->gen;
	g->api = NXH_API_OLLAMA_GENERATE;
	if (common(r, g, known))
		return -1;
	if (load_only(r, g))
		return r->status == 200 ? 0 : -1;
	const char *p = NULL, *sys = NULL;
	bool has, raw = false;
	if (nxh_get_str(r, r->json, "prompt", NULL, &p, &has) || nxh_get_str(r, r->json, "system", NULL, &sys, &has) ||
	    nxh_get_bool(r, r->json, "raw", NULL, &raw, &has))
		return -1;
	if (!p) {
		nxh_req_bad(r, "prompt", "field 'prompt' is required");
		return -1;
	}
	if (raw && sys) {
		nxh_req_bad(r, "system", "field 'system' cannot be used with 'raw'");
		return -1;
	}
	json_object_set_new(g->req, "prompt", json_string(p));
	if (sys)
		json_object_set_new(g->req, "system", json_string(sys));
	if (raw)
		json_object_set_new(g->req, "raw", json_true());
	return 0;
}

int nxh_ollama_plain_begin(struct nxh_req *r)
{
	if (!strcmp(r->path, "/api/version")) {
		nxh_req_answer(r, 200, json_pack("{s:s}", "version", NXH_VERSION));
		return 0;
	}
	return 0;
}

/* /api/show {"model"} (or the older "name"): what ollama's clients ask of a
 * model before they use it (`ollama run`, `ollama show`). Only the served
 * model is there to show. */
int nxh_ollama_show_begin(struct nxh_req *r)
{
	static const char *const known[] = { "model", "name", "verbose", NULL };
	const char *m = NULL, *name = NULL;
	bool has, verbose;
	if (nxh_only_fields(r, r->json, NULL, known) || nxh_get_str(r, r->json, "model", NULL, &m, &has) ||
	    nxh_get_str(r, r->json, "name", NULL, &name, &has) || nxh_get_bool(r, r->json, "verbose", NULL, &verbose, &has))
		return -1;
	m = m ? m : name;
	if (!m) {
		nxh_req_bad(r, "model", "field 'model' is required (GET /api/tags lists it)");
		return -1;
	}
	const char *id = nxh.o.model_id ? nxh.o.model_id : nxh.model.name;
	size_t n = strlen(m);
	if (n > 7 && !strcmp(m + n - 7, ":latest")) /* ollama's default tag */
		n -= 7;
	if (!id || strlen(id) != n || strncmp(m, id, n)) {
		nxh_req_fail(r, 404, "invalid_request_error", "model", "model_not_found", "model '%s' not found", m);
		return -1;
	}
	return 0;
}

static void iso_now(char *buf, size_t cap)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, cap - n, ".%09ldZ", ts.tv_nsec);
}

// --- /api/tags, /api/ps

json_t *nxh_ollama_info_build(struct nxh_req *r, const json_t *hello)
{
	(void)r;
	(void)hello;
	return json_pack("{s:s}", "op", "status");
}

void nxh_ollama_info_event(struct nxh_req *r, json_t *ev)
{
	const char *name = json_string_value(json_object_get(ev, "event"));
	if (!name || strcmp(name, "status")) {
		nxh_req_fail_event(r, ev);
		nxh_req_wake(r);
		return;
	}
	char now[64];
	iso_now(now, sizeof(now));
	const char *id = nxh.o.model_id ? nxh.o.model_id : nxh.model.name;
	const char *arch = json_string_value(json_object_get(ev, "arch"));
	const char *type = json_string_value(json_object_get(ev, "type"));
	if (!strcmp(r->path, "/api/show")) {
		/* model_info as the GGUF names it: clients read <arch>.context_length for num_ctx (here the
		 * context nxd serves); no Go template to give, and no system prompt or parameters of a Modelfile */
		char ctx_key[96];
		snprintf(ctx_key, sizeof(ctx_key), "%s.context_length", arch ? arch : "general");
		json_t *caps = json_pack("[s]", "completion");
		if (json_is_true(json_object_get(ev, "tools")))
			json_array_append_new(caps, json_string("tools"));
		json_t *show = json_pack("{s:s, s:s, s:s, s:{s:s, s:s, s:s, s:[s], s:s, s:s}, s:{s:s, s:O}, s:o, s:s}",
					 "modelfile", "", "parameters", "", "template", "", "details", "parent_model", "",
					 "format", "gguf", "family", arch ? arch : "", "families", arch ? arch : "",
					 "parameter_size", "", "quantization_level", type ? type : "", "model_info",
					 "general.architecture", arch ? arch : "", ctx_key,
					 json_object_get(ev, "n_ctx") ? json_object_get(ev, "n_ctx") : json_null(),
					 "capabilities", caps, "modified_at", now);
		nxh_req_answer(r, 200, show);
		nxh_req_wake(r);
		return;
	}
	json_t *m = json_pack("{s:s, s:s, s:s, s:I, s:s, s:{s:s, s:s, s:[s], s:s, s:s}}", "name", id, "model", id,
			      "modified_at", now, "size", (json_int_t)0, "digest", "", "details", "format", "gguf",
			      "family", arch ? arch : "", "families", arch ? arch : "", "parameter_size", "",
			      "quantization_level", type ? type : "");
	if (!strcmp(r->path, "/api/ps")) {
		json_object_set_new(m, "expires_at", json_string("2318-01-01T00:00:00Z")); /* never unloaded */
		json_object_set_new(m, "size_vram", json_integer(0));
	}
	nxh_req_answer(r, 200, json_pack("{s:[o]}", "models", m));
	nxh_req_wake(r);
}

// --- generation events

static void line(struct nxh_req *r, json_t *obj)
{
	char *s = json_dumps(obj, JSON_COMPACT);
	json_decref(obj);
	if (!s) {
		nxh_req_stream_end(r, true);
		return;
	}
	nxh_req_stream_put(r, s, strlen(s));
	nxh_req_stream_put(r, "\n", 1);
	free(s);
}

static json_t *piece_obj(struct nxh_req *r, const char *text)
{
	struct nxh_gen *g = &r->gen;
	char now[64];
	iso_now(now, sizeof(now));
	json_t *o = json_pack("{s:s, s:s}", "model", g->model, "created_at", now);
	if (g->api == NXH_API_OLLAMA_CHAT)
		json_object_set_new(o, "message", json_pack("{s:s, s:s}", "role", "assistant", "content", text));
	else
		json_object_set_new(o, "response", json_string(text));
	return o;
}

/* A call nxd read out of the answer, as ollama writes one: the arguments as an object. */
static json_t *ollama_call(const json_t *ev)
{
	json_t *tc = json_object_get(ev, "tool_call");
	const char *id = json_string_value(json_object_get(tc, "id"));
	const char *name = json_string_value(json_object_get(tc, "name"));
	const char *args = json_string_value(json_object_get(tc, "arguments"));
	json_error_t je;
	json_t *a = args ? json_loads(args, 0, &je) : NULL;
	if (!id || !name || !json_is_object(a)) {
		json_decref(a);
		return NULL;
	}
	return json_pack("{s:s, s:{s:I, s:s, s:o}}", "id", id, "function", "index",
			 json_integer_value(json_object_get(ev, "index")), "name", name, "arguments", a);
}

static void on_done(struct nxh_req *r, json_t *ev)
{
	struct nxh_gen *g = &r->gen;
	const char *reason = json_string_value(json_object_get(ev, "reason"));
	reason = reason ? reason : "";
	json_t *u = json_object_get(ev, "usage"), *t = json_object_get(ev, "timing");
	int pt = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
	int ct = (int)json_integer_value(json_object_get(u, "completion_tokens"));
	nxh_metrics_tokens(pt, ct);
	if (!strcmp(reason, "shutdown") || !strcmp(reason, "cancelled")) {
		if (g->started && g->stream) {
			line(r, json_pack("{s:s}", "error", "nxd is shutting down; the answer is incomplete"));
			nxh_req_stream_end(r, true);
		} else {
			nxh_req_fail(r, 503, "server_error", NULL, "shutting_down", "nxd is shutting down");
			nxh_req_wake(r);
		}
		return;
	}
	json_t *o = piece_obj(r, g->stream ? "" : (g->text.p ? g->text.p : ""));
	double total = nxh_now() - r->t_start;
	if (g->tool_calls)
		json_object_set(json_object_get(o, "message"), "tool_calls", g->tool_calls);
	json_object_set_new(o, "done", json_true());
	json_object_set_new(o, "done_reason", json_string(!strcmp(reason, "length") ? "length" : "stop"));
	json_object_set_new(o, "total_duration", json_integer((json_int_t)(total * 1e9)));
	json_object_set_new(o, "load_duration", json_integer(0));
	json_object_set_new(o, "prompt_eval_count", json_integer(pt));
	json_object_set_new(o, "prompt_eval_duration",
			    json_integer((json_int_t)(json_number_value(json_object_get(t, "prefill_ms")) * 1e6)));
	json_object_set_new(o, "eval_count", json_integer(ct));
	json_object_set_new(o, "eval_duration",
			    json_integer((json_int_t)(json_number_value(json_object_get(t, "decode_ms")) * 1e6)));
	if (!g->stream) {
		nxh_req_answer(r, 200, o);
		nxh_req_wake(r);
		return;
	}
	if (!g->started) {
		g->started = true;
		nxh_req_stream_start(r, "application/x-ndjson");
	}
	line(r, o);
	nxh_req_stream_end(r, false);
}

void nxh_ollama_gen_event(struct nxh_req *r, json_t *ev)
{
	struct nxh_gen *g = &r->gen;
	const char *name = json_string_value(json_object_get(ev, "event"));
	if (!name)
		return;
	if (!strcmp(name, "error")) {
		if (g->started && g->stream) {
			line(r, json_pack("{s:O}", "error", json_object_get(ev, "message")));
			nxh_req_stream_end(r, true);
			return;
		}
		if (g->as_adapter && !strcmp(json_string_value(json_object_get(ev, "code")) ?: "", "not_found"))
			nxh_model_not_found(r);
		else
			nxh_req_fail_event(r, ev);
		nxh_req_wake(r);
		return;
	}
	if (!strcmp(name, "done")) {
		on_done(r, ev);
		return;
	}
	if (!strcmp(name, "tool_call")) {
		json_t *call = ollama_call(ev);
		if (!call)
			return;
		if (!g->stream) {
			if (!g->tool_calls)
				g->tool_calls = json_array();
			json_array_append_new(g->tool_calls, call);
			return;
		}
		/* streamed: a message of its own, as ollama sends a call */
		if (!g->started) {
			g->started = true;
			r->t_first = nxh_now();
			nxh_req_stream_start(r, "application/x-ndjson");
		}
		json_t *o = piece_obj(r, "");
		json_object_set_new(json_object_get(o, "message"), "tool_calls", json_pack("[o]", call));
		json_object_set_new(o, "done", json_false());
		line(r, o);
		return;
	}
	if (strcmp(name, "token"))
		return;
	double now = nxh_now();
	if (!g->started) {
		g->started = true;
		r->t_first = now;
		nxh_metrics_ttft(now - r->t_start);
		if (g->stream)
			nxh_req_stream_start(r, "application/x-ndjson");
	} else if (g->t_last > 0) {
		nxh_metrics_token_gap(now - g->t_last);
	}
	g->t_last = now;
	const char *text = json_string_value(json_object_get(ev, "text"));
	text = text ? text : "";
	if (!g->stream) {
		nxh_buf_put(&g->text, text, strlen(text));
		return;
	}
	if (!*text)
		return;
	json_t *o = piece_obj(r, text);
	json_object_set_new(o, "done", json_false());
	line(r, o);
}
