/* openai.c - the OpenAI API: /v1/chat/completions and /v1/completions into nxd's generate, and its events back. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/nxh.h"
#include "proto/proto.h"

const char *nxh_model_id(const json_t *hello)
{
	if (nxh.o.model_id)
		return nxh.o.model_id;
	const char *m = json_string_value(json_object_get(hello, "model"));
	return m && *m ? m : "nxd";
}

static void new_id(struct nxh_gen *g, const char *prefix)
{
	uint64_t x = (++nxh.next_id) * 0x9e3779b97f4a7c15ull ^ nxh.id_salt;
	x ^= x >> 31;
	snprintf(g->id, sizeof(g->id), "%s%016llx%08x", prefix, (unsigned long long)x,
		 (unsigned)(nxh.next_id & 0xffffffffu));
	g->created = (long long)time(NULL);
}

void nxh_gen_free(struct nxh_gen *g)
{
	json_decref(g->req);
	json_decref(g->lp);
	json_decref(g->tool_calls);
	free(g->model);
	nxh_buf_free(&g->text);
	nxh_buf_free(&g->sse_head);
	memset(g, 0, sizeof(*g));
}

// --- request fields shared by chat and completions

/* Each field the gateway passes to nxd is set in g->req here, with OpenAI's
 * defaults where nxd's differ (temperature 1, no top-k / min-p truncation). */
static int sampling(struct nxh_req *r, const json_t *b, struct nxh_gen *g)
{
	double x;
	long long n;
	bool has;
	json_t *q = g->req;
	x = 1.0;
	if (nxh_get_num(r, b, "temperature", NULL, 0, 2, &x, &has))
		return -1;
	json_object_set_new(q, "temperature", json_real(x));
	x = 1.0;
	if (nxh_get_num(r, b, "top_p", NULL, 0, 1, &x, &has))
		return -1;
	/* OpenAI allows 0: keep only the most likely token. nxd's smallest
	 * top_p does exactly that (the top token alone passes any p > 0). */
	json_object_set_new(q, "top_p", json_real(x > 0 ? x : 1e-30));
	n = 0;
	if (nxh_get_int(r, b, "top_k", NULL, 0, INT32_MAX, &n, &has))
		return -1;
	json_object_set_new(q, "top_k", json_integer(n));
	x = 0;
	if (nxh_get_num(r, b, "min_p", NULL, 0, 1, &x, &has))
		return -1;
	json_object_set_new(q, "min_p", json_real(x));
	if (nxh_get_num(r, b, "repeat_penalty", NULL, 0, 1e30, &x, &has))
		return -1;
	if (has)
		json_object_set_new(q, "repeat_penalty", json_real(x));
	if (nxh_get_int(r, b, "repeat_last_n", NULL, 0, INT32_MAX, &n, &has))
		return -1;
	if (has)
		json_object_set_new(q, "repeat_last_n", json_integer(n));
	bool ignore = false;
	if (nxh_get_bool(r, b, "ignore_eos", NULL, &ignore, &has))
		return -1;
	if (has && ignore) /* vLLM's and llama-server's name: generate max_tokens whatever comes */
		json_object_set_new(q, "ignore_eos", json_true());
	if (nxh_get_int(r, b, "seed", NULL, INT64_MIN, INT64_MAX, &n, &has))
		return -1;
	if (has) {
		if (n < 0) {
			nxh_req_bad(r, "seed", "field 'seed' must be >= 0 for nxd, got %lld", n);
			return -1;
		}
		json_object_set_new(q, "seed", json_integer(n));
	}
	static const char *const pens[] = { "presence_penalty", "frequency_penalty" };
	for (int i = 0; i < 2; i++) {
		x = 0;
		if (nxh_get_num(r, b, pens[i], NULL, -2, 2, &x, &has))
			return -1;
		if (has && x != 0)
			json_object_set_new(q, pens[i], json_real(x));
	}
	if (nxh_get_int(r, b, "n", NULL, INT32_MIN, INT32_MAX, &n, &has))
		return -1;
	if (has && n != 1) {
		nxh_req_bad(r, "n", "field 'n' must be 1: nxd-http generates one choice per request, got %lld", n);
		return -1;
	}
	json_t *stop = json_object_get(b, "stop");
	if (stop && !json_is_null(stop)) {
		if (!json_is_string(stop) && !json_is_array(stop)) {
			nxh_req_bad(r, "stop", "field 'stop' must be a string or an array of strings");
			return -1;
		}
		json_object_set(q, "stop", stop); /* nxd checks the count and lengths */
	}
	json_t *lora = json_object_get(b, "lora");
	if (lora && !json_is_null(lora)) {
		if (!json_is_array(lora)) {
			nxh_req_bad(r, "lora", "field 'lora' must be an array of {\"name\", \"scale\"}");
			return -1;
		}
		json_object_set_new(q, "lora", json_deep_copy(lora));
	}
	json_t *spec = json_object_get(b, "speculate");
	if (spec && !json_is_null(spec)) {
		if (!json_is_object(spec)) {
			nxh_req_bad(r, "speculate", "field 'speculate' must be an object {\"mode\", \"k\"}");
			return -1;
		}
		json_object_set_new(q, "speculate", json_deep_copy(spec)); /* nxd checks its keys and values */
	}
	return 0;
}

static int max_tokens(struct nxh_req *r, const json_t *b, struct nxh_gen *g)
{
	long long a = 0, c = 0;
	bool has_a, has_c;
	if (nxh_get_int(r, b, "max_tokens", NULL, 1, INT32_MAX, &a, &has_a) ||
	    nxh_get_int(r, b, "max_completion_tokens", NULL, 1, INT32_MAX, &c, &has_c))
		return -1;
	if (has_a && has_c && a != c) {
		nxh_req_bad(r, "max_completion_tokens",
			    "fields 'max_tokens' (%lld) and 'max_completion_tokens' (%lld) disagree", a, c);
		return -1;
	}
	if (has_a || has_c) {
		g->has_max_tokens = true;
		json_object_set_new(g->req, "max_tokens", json_integer(has_c ? c : a));
	}
	return 0;
}

static int stream_fields(struct nxh_req *r, const json_t *b, struct nxh_gen *g)
{
	bool has;
	if (nxh_get_bool(r, b, "stream", NULL, &g->stream, &has))
		return -1;
	json_t *so = json_object_get(b, "stream_options");
	if (!so || json_is_null(so))
		return 0;
	if (!g->stream) {
		nxh_req_bad(r, "stream_options", "field 'stream_options' is only allowed when 'stream' is true");
		return -1;
	}
	if (!json_is_object(so)) {
		nxh_req_bad(r, "stream_options", "field 'stream_options' must be an object");
		return -1;
	}
	static const char *const known[] = { "include_usage", "include_obfuscation", NULL };
	bool obf = false;
	if (nxh_only_fields(r, so, "stream_options.", known) ||
	    nxh_get_bool(r, so, "include_usage", "stream_options.", &g->include_usage, &has) ||
	    nxh_get_bool(r, so, "include_obfuscation", "stream_options.", &obf, &has))
		return -1;
	if (obf) { /* false is what nxd-http does anyway: no padding in chunks */
		nxh_req_bad(r, "stream_options.include_obfuscation",
			    "field 'stream_options.include_obfuscation' is not supported by nxd-http");
		return -1;
	}
	return 0;
}

static int model_field(struct nxh_req *r, const json_t *b, struct nxh_gen *g)
{
	const char *m = NULL;
	bool has;
	if (nxh_get_str(r, b, "model", NULL, &m, &has))
		return -1;
	if (!has) {
		nxh_req_bad(r, "model", "field 'model' is required (GET /v1/models lists the ids)");
		return -1;
	}
	g->model = strdup(m);
	return g->model ? 0 : -1;
}

// --- chat messages

/* A message's content: a string, or an array of text parts (joined with
 * '\n', as vLLM does). Other parts (images, audio) are refused by name. */
static json_t *content_text(struct nxh_req *r, const json_t *c, int i)
{
	char f[96];
	snprintf(f, sizeof(f), "messages[%d].content", i);
	if (json_is_string(c))
		return json_incref((json_t *)c);
	if (!json_is_array(c)) {
		nxh_req_bad(r, f, "field '%s' must be a string or an array of text parts", f);
		return NULL;
	}
	struct nxh_buf t = { 0 };
	size_t k;
	json_t *part;
	json_array_foreach(c, k, part) {
		char pf[128];
		snprintf(pf, sizeof(pf), "%s[%zu].", f, k);
		static const char *const known[] = { "type", "text", NULL };
		const char *type = NULL, *text = NULL;
		bool has_type, has_text;
		if (!json_is_object(part)) {
			nxh_req_bad(r, f, "field '%s[%zu]' must be an object {\"type\": \"text\", \"text\": ...}", f, k);
			goto err;
		}
		if (nxh_get_str(r, part, "type", pf, &type, &has_type))
			goto err;
		if (!has_type || strcmp(type, "text")) {
			nxh_req_bad(r, f, "field '%stype' must be \"text\" (nxd serves a text model), got %s%s%s", pf,
				    type ? "\"" : "", type ? type : "nothing", type ? "\"" : "");
			goto err;
		}
		if (nxh_only_fields(r, part, pf, known) || nxh_get_str(r, part, "text", pf, &text, &has_text))
			goto err;
		if (!has_text) {
			nxh_req_bad(r, f, "field '%stext' is required", pf);
			goto err;
		}
		if ((k && nxh_buf_put(&t, "\n", 1)) || nxh_buf_put(&t, text, strlen(text)))
			goto err;
	}
	json_t *s = json_stringn(t.p ? t.p : "", t.len);
	nxh_buf_free(&t);
	return s;
err:
	nxh_buf_free(&t);
	return NULL;
}

/* An assistant message's tool calls, for nxd to check: an array, passed on. */
static int message_tool_fields(struct nxh_req *r, const json_t *m, size_t i, const char *role, json_t *out)
{
	json_t *calls = json_object_get(m, "tool_calls"), *id = json_object_get(m, "tool_call_id");
	json_t *name = json_object_get(m, "name");
	if (name && !json_is_null(name) && strcmp(role, "tool")) {
		/* a participant's name: no template nxd renders has a place for it */
		char f[48];
		snprintf(f, sizeof(f), "messages[%zu].name", i);
		nxh_req_bad(r, f, "field '%s' is not supported by nxd-http on a %s message", f, role);
		return -1;
	}
	if (calls && !json_is_null(calls)) {
		if (strcmp(role, "assistant") || !json_is_array(calls)) {
			nxh_req_bad(r, "messages", "field 'messages[%zu].tool_calls' must be an array, on an assistant "
				    "message", i);
			return -1;
		}
		json_object_set(out, "tool_calls", calls); /* nxd checks each call */
	}
	if (id && !json_is_null(id)) {
		if (strcmp(role, "tool") || !json_is_string(id)) {
			nxh_req_bad(r, "messages", "field 'messages[%zu].tool_call_id' must be a string, on a tool message",
				    i);
			return -1;
		}
		json_object_set(out, "tool_call_id", id);
	}
	return 0;
}

static json_t *chat_messages(struct nxh_req *r, const json_t *msgs)
{
	if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
		nxh_req_bad(r, "messages", "field 'messages' must be a non-empty array of messages");
		return NULL;
	}
	json_t *out = json_array();
	size_t i;
	json_t *m;
	json_array_foreach(msgs, i, m) {
		char where[48];
		snprintf(where, sizeof(where), "messages[%zu].", i);
		static const char *const known[] = { "role", "content", "name", "tool_calls", "tool_call_id", NULL };
		const char *role = NULL;
		bool has;
		if (!json_is_object(m)) {
			nxh_req_bad(r, "messages", "field 'messages[%zu]' must be an object", i);
			goto err;
		}
		if (nxh_get_str(r, m, "role", where, &role, &has))
			goto err;
		if (!has) {
			nxh_req_bad(r, "messages", "field 'messages[%zu].role' is required", i);
			goto err;
		}
		/* OpenAI's "developer" is the system message of newer models. */
		if (!strcmp(role, "developer"))
			role = "system";
		if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool")) {
			nxh_req_bad(r, "messages",
				    "field 'messages[%zu].role' must be one of system, developer, user, assistant, tool, got "
				    "\"%s\"", i, role);
			goto err;
		}
		if (nxh_only_fields(r, m, where, known))
			goto err;
		json_t *c = json_object_get(m, "content"), *calls = json_object_get(m, "tool_calls");
		json_t *one = json_pack("{s:s}", "role", role);
		if (message_tool_fields(r, m, i, role, one)) {
			json_decref(one);
			goto err;
		}
		bool calls_only = json_array_size(calls) > 0 && (!c || json_is_null(c));
		if (!calls_only && (!c || json_is_null(c))) {
			json_decref(one);
			nxh_req_bad(r, "messages", "field 'messages[%zu].content' is required", i);
			goto err;
		}
		json_t *text = calls_only ? NULL : content_text(r, c, (int)i);
		if (!calls_only && !text) {
			json_decref(one);
			goto err;
		}
		if (text)
			json_object_set_new(one, "content", text);
		json_array_append_new(out, one);
	}
	return out;
err:
	json_decref(out);
	return NULL;
}

static const char *const chat_known[] = {
	"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n",
	"logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "stream", "stream_options",
	"response_format", "tools", "tool_choice", "parallel_tool_calls",
	/* nxd's own */
	"top_k", "min_p", "repeat_penalty", "repeat_last_n", "ignore_eos", "lora",
	/* the chat template's arguments, as vLLM and llama.cpp's server take them */
	"chat_template_kwargs", "speculate", NULL
};

/* tools, tool_choice and parallel_tool_calls go to nxd as they are: it
 * checks them against the model's chat template. */
static int tool_fields(struct nxh_req *r, const json_t *b, struct nxh_gen *g)
{
	static const char *const keys[] = { "tools", "tool_choice", "parallel_tool_calls" };
	for (int i = 0; i < 3; i++) {
		json_t *v = json_object_get(b, keys[i]);
		if (v && !json_is_null(v))
			json_object_set(g->req, keys[i], v);
	}
	return 0;
}

/* chat_template_kwargs: only enable_thinking, which is nxd's "think". */
static int template_kwargs(struct nxh_req *r, const json_t *b, struct nxh_gen *g)
{
	static const char *const known[] = { "enable_thinking", NULL };
	json_t *k = json_object_get(b, "chat_template_kwargs");
	bool think, has;
	if (!k || json_is_null(k))
		return 0;
	if (!json_is_object(k)) {
		nxh_req_bad(r, "chat_template_kwargs", "field 'chat_template_kwargs' must be an object");
		return -1;
	}
	if (nxh_only_fields(r, k, "chat_template_kwargs.", known) ||
	    nxh_get_bool(r, k, "enable_thinking", "chat_template_kwargs.", &think, &has))
		return -1;
	if (has)
		json_object_set_new(g->req, "think", json_boolean(think));
	return 0;
}

int nxh_chat_begin(struct nxh_req *r)
{
	struct nxh_gen *g = &r->gen;
	const json_t *b = r->json;
	g->api = NXH_API_CHAT;
	r->answer_dump = NXH_DUMP_LOGPROBS;
	g->req = json_object();
	if (nxh_only_fields(r, b, NULL, chat_known) || model_field(r, b, g))
		return -1;
	json_t *msgs = chat_messages(r, json_object_get(b, "messages"));
	if (!msgs)
		return -1;
	json_object_set_new(g->req, "messages", msgs);
	if (max_tokens(r, b, g) || sampling(r, b, g) || stream_fields(r, b, g) || tool_fields(r, b, g) ||
	    template_kwargs(r, b, g) || nxh_response_format(r, b, g->req))
		return -1;
	/* nxd refuses the pair too, but names its own field ('format') */
	if (json_array_size(json_object_get(g->req, "tools")) && json_object_get(g->req, "format")) {
		nxh_req_bad(r, "response_format", "field 'response_format' (other than {\"type\": \"text\"}) cannot be "
			    "used with 'tools': the answer's grammar would have to admit the tool calls as well");
		return -1;
	}
	bool has_lp, has_top;
	long long top = 0;
	if (nxh_get_bool(r, b, "logprobs", NULL, &g->logprobs, &has_lp) ||
	    nxh_get_int(r, b, "top_logprobs", NULL, 0, NXP_MAX_LOGPROBS, &top, &has_top))
		return -1;
	if (has_top && !g->logprobs) {
		nxh_req_bad(r, "top_logprobs", "field 'top_logprobs' needs 'logprobs' set to true");
		return -1;
	}
	g->top_logprobs = (int)top;
	if (g->logprobs) /* nxd sends the drawn token's own logprob with at least one alternative */
		json_object_set_new(g->req, "logprobs", json_integer(top > 0 ? top : 1));
	new_id(g, "chatcmpl-");
	return 0;
}

static const char *const completion_known[] = {
	"model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "logprobs",
	"presence_penalty", "frequency_penalty", "stream", "stream_options", "echo", "best_of",
	"top_k", "min_p", "repeat_penalty", "repeat_last_n", "ignore_eos", "lora", "speculate", NULL
};

/* One prompt: a string, an array of token ids, or an array holding one of those. */
static int completion_prompt(struct nxh_req *r, const json_t *p, json_t *q)
{
	if (json_is_array(p) && json_array_size(p) == 1 &&
	    (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
		p = json_array_get(p, 0);
	if (json_is_string(p)) {
		json_object_set(q, "prompt", (json_t *)p);
		json_object_set_new(q, "raw", json_true()); /* a completion has no chat template */
		return 0;
	}
	if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
		json_object_set(q, "tokens", (json_t *)p); /* nxd checks every id */
		return 0;
	}
	const json_t *first = json_array_get(p, 0);
	if (json_is_array(p) && json_array_size(p) > 1 && (json_is_string(first) || json_is_array(first))) {
		nxh_req_bad(r, "prompt", "field 'prompt' holds %zu prompts; nxd-http serves one per request",
			    json_array_size(p));
		return -1;
	}
	nxh_req_bad(r, "prompt", "field 'prompt' must be a string or a non-empty array of token ids (integers)");
	return -1;
}

int nxh_completion_begin(struct nxh_req *r)
{
	struct nxh_gen *g = &r->gen;
	const json_t *b = r->json;
	g->api = NXH_API_COMPLETION;
	r->answer_dump = NXH_DUMP_LOGPROBS;
	g->req = json_object();
	if (nxh_only_fields(r, b, NULL, completion_known) || model_field(r, b, g))
		return -1;
	json_t *p = json_object_get(b, "prompt");
	if (!p || json_is_null(p)) {
		nxh_req_bad(r, "prompt", "field 'prompt' is required");
		return -1;
	}
	if (completion_prompt(r, p, g->req) || max_tokens(r, b, g) || sampling(r, b, g) || stream_fields(r, b, g))
		return -1;
	if (!g->has_max_tokens) { /* OpenAI's default for completions */
		g->has_max_tokens = true;
		json_object_set_new(g->req, "max_tokens", json_integer(16));
	}
	bool echo = false, has;
	long long best_of = 1, lp = 0;
	if (nxh_get_bool(r, b, "echo", NULL, &echo, &has) ||
	    nxh_get_int(r, b, "best_of", NULL, INT32_MIN, INT32_MAX, &best_of, &has) ||
	    nxh_get_int(r, b, "logprobs", NULL, 0, NXP_MAX_LOGPROBS, &lp, &g->logprobs))
		return -1;
	if (echo) {
		nxh_req_bad(r, "echo", "field 'echo' must be false: nxd-http does not echo the prompt");
		return -1;
	}
	if (best_of != 1) {
		nxh_req_bad(r, "best_of", "field 'best_of' must be 1, got %lld", best_of);
		return -1;
	}
	g->top_logprobs = (int)lp;
	if (g->logprobs)
		json_object_set_new(g->req, "logprobs", json_integer(lp > 0 ? lp : 1));
	new_id(g, "cmpl-");
	return 0;
}

/* The generate line, once nxd's hello says which model it serves. */
/* The request's model is neither the served one nor a loaded adapter. */
void nxh_model_not_found(struct nxh_req *r)
{
	const struct nxh_gen *g = &r->gen;
	if (g->api == NXH_API_OLLAMA_CHAT || g->api == NXH_API_OLLAMA_GENERATE)
		nxh_req_fail(r, 404, "invalid_request_error", "model", "model_not_found", "model '%s' not found",
			     g->model);
	else
		nxh_req_fail(r, 404, "invalid_request_error", "model", "model_not_found",
			     "The model '%s' does not exist: it is neither the served model nor a loaded adapter "
			     "(GET /v1/models lists them)", g->model);
}

json_t *nxh_gen_build(struct nxh_req *r, const json_t *hello)
{
	struct nxh_gen *g = &r->gen;
	json_t *q = json_copy(g->req);
	if (!q)
		return NULL;
	json_object_set_new(q, "op", json_string("generate"));
	json_object_set_new(q, "stream", json_true()); /* always: first-token time, and cancels on hang-up */
	if (!g->has_max_tokens)
		json_object_set_new(q, "max_tokens", json_integer(nxh.model.max_tokens > 0 ? nxh.model.max_tokens : 256));
	if (g->model && strcmp(g->model, nxh_model_id(hello))) {
		/* Not the served model: an adapter's name (GET /v1/models lists them). */
		g->as_adapter = true;
		size_t n = strlen(g->model);
		if (!n || n > NXP_MAX_LORA_NAME) { /* no adapter has such a name: nxd would refuse lora[0].name */
			json_decref(q);
			nxh_model_not_found(r);
			return NULL;
		}
		json_t *lora = json_object_get(q, "lora");
		json_t *l = lora ? json_deep_copy(lora) : json_array();
		json_array_insert_new(l, 0, json_pack("{s:s}", "name", g->model));
		json_object_set_new(q, "lora", l);
	}
	return q;
}

// --- events back into OpenAI's shapes

static json_t *bytes_of(const char *s)
{
	json_t *a = json_array();
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		json_array_append_new(a, json_integer(*p));
	return a;
}

static double lp_value(const json_t *v)
{
	return json_is_number(v) ? json_number_value(v) : -9999.0; /* OpenAI's stand-in for -inf */
}

/* Chat: {"token","logprob","bytes","top_logprobs":[...]} for the drawn token. */
static json_t *chat_lp_entry(const struct nxh_gen *g, const json_t *ev)
{
	const char *piece = json_string_value(json_object_get(ev, "piece"));
	if (!piece)
		return NULL;
	json_t *top = json_array();
	json_t *alts = json_object_get(ev, "logprobs");
	for (size_t i = 0; i < json_array_size(alts) && (int)i < g->top_logprobs; i++) {
		json_t *a = json_array_get(alts, i);
		const char *t = json_string_value(json_object_get(a, "text"));
		json_array_append_new(top, json_pack("{s:s, s:f, s:o}", "token", t ? t : "", "logprob",
						     lp_value(json_object_get(a, "logprob")), "bytes",
						     bytes_of(t ? t : "")));
	}
	return json_pack("{s:s, s:f, s:o, s:o}", "token", piece, "logprob", lp_value(json_object_get(ev, "logprob")),
			 "bytes", bytes_of(piece), "top_logprobs", top);
}

/* Completions: the four parallel arrays, for one token. */
static json_t *completion_lp_entry(struct nxh_gen *g, const json_t *ev)
{
	const char *piece = json_string_value(json_object_get(ev, "piece"));
	if (!piece)
		return NULL;
	json_t *top = json_object();
	json_t *alts = json_object_get(ev, "logprobs");
	for (size_t i = 0; i < json_array_size(alts) && (int)i < g->top_logprobs; i++) {
		json_t *a = json_array_get(alts, i);
		const char *t = json_string_value(json_object_get(a, "text"));
		if (!json_object_get(top, t ? t : "")) /* two ids with one text: the likelier one */
			json_object_set_new(top, t ? t : "", json_real(lp_value(json_object_get(a, "logprob"))));
	}
	return json_pack("{s:[s], s:[f], s:[o], s:[I]}", "tokens", piece, "token_logprobs",
			 lp_value(json_object_get(ev, "logprob")), "top_logprobs", top, "text_offset",
			 (json_int_t)g->text_offset);
}

static void lp_gather(struct nxh_gen *g, json_t *e)
{
	if (g->api == NXH_API_CHAT) {
		if (!g->lp)
			g->lp = json_array();
		json_array_append(g->lp, e);
		return;
	}
	if (!g->lp)
		g->lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
	static const char *const keys[] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
	for (int i = 0; i < 4; i++)
		json_array_extend(json_object_get(g->lp, keys[i]), json_object_get(e, keys[i]));
}

static json_t *usage_of(const json_t *done)
{
	json_t *u = json_object_get(done, "usage");
	json_int_t p = json_integer_value(json_object_get(u, "prompt_tokens"));
	json_int_t c = json_integer_value(json_object_get(u, "completion_tokens"));
	json_int_t k = json_integer_value(json_object_get(u, "cached_tokens"));
	return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", p, "completion_tokens", c, "total_tokens", p + c,
			 "prompt_tokens_details", "cached_tokens", k);
}

static json_t *chunk_head(const struct nxh_gen *g)
{
	return json_pack("{s:s, s:s, s:I, s:s}", "id", g->id, "object",
			 g->api == NXH_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			 (json_int_t)g->created, "model", g->model);
}

static void sse(struct nxh_req *r, json_t *obj)
{
	char *s = json_dumps(obj, NXH_DUMP_LOGPROBS);
	json_decref(obj);
	if (!s) {
		nxh_req_stream_end(r, true);
		return;
	}
	struct nxh_buf b = { 0 };
	if (nxh_buf_put(&b, "data: ", 6) || nxh_buf_put(&b, s, strlen(s)) || nxh_buf_put(&b, "\n\n", 2))
		nxh_req_stream_end(r, true);
	else
		nxh_req_stream_put(r, b.p, b.len);
	free(s);
	nxh_buf_free(&b);
}

/* A chunk of text alone, the most of a stream: the bytes sse_choice would
 * write, put together without building and freeing its JSON tree per token.
 * False when the chunk's start cannot be had (out of memory): sse_choice
 * then. */
static bool sse_text(struct nxh_req *r, const char *text)
{
	struct nxh_gen *g = &r->gen;
	struct nxh_buf *h = &g->sse_head;
	if (!h->len) {
		static const char choices[] = ",\"choices\":[{\"index\":0,";
		json_t *head = chunk_head(g);
		char *s = head ? json_dumps(head, JSON_COMPACT) : NULL; /* {"id":...,"model":"..."} */
		json_decref(head);
		bool ok = s && nxh_buf_put(h, "data: ", 6) == 0 && nxh_buf_put(h, s, strlen(s) - 1) == 0 &&
			  nxh_buf_put(h, choices, sizeof(choices) - 1) == 0;
		free(s);
		if (!ok) {
			nxh_buf_free(h);
			return false;
		}
	}
	const size_t n = strlen(text);
	char lit[4096];
	if (6 * n + 3 > sizeof(lit))
		return false;
	nxp_json_str(lit, sizeof(lit), text, n);
	char tail[128];
	snprintf(tail, sizeof(tail), "%s,\"logprobs\":null,\"finish_reason\":null}]%s}\n\n",
		 g->api == NXH_API_CHAT ? "}" : "", g->include_usage ? ",\"usage\":null" : "");
	const char *field = g->api == NXH_API_CHAT ? "\"delta\":{\"content\":" : "\"text\":";
	struct nxh_buf b = { 0 };
	if (nxh_buf_put(&b, h->p, h->len) || nxh_buf_put(&b, field, strlen(field)) || nxh_buf_put(&b, lit, strlen(lit)) ||
	    nxh_buf_put(&b, tail, strlen(tail)))
		nxh_req_stream_end(r, true);
	else
		nxh_req_stream_put(r, b.p, b.len);
	nxh_buf_free(&b);
	return true;
}

/* One streamed choice: delta text (chat) or text (completions), with its
 * logprobs entry and finish_reason, each possibly null. */
static void sse_choice(struct nxh_req *r, json_t *delta_or_text, json_t *lp, const char *finish)
{
	struct nxh_gen *g = &r->gen;
	json_t *c = json_pack("{s:i}", "index", 0);
	if (g->api == NXH_API_CHAT) {
		json_object_set_new(c, "delta", delta_or_text);
		json_object_set_new(c, "logprobs", lp ? json_pack("{s:o, s:n}", "content", lp, "refusal") : json_null());
	} else {
		json_object_set_new(c, "text", delta_or_text);
		json_object_set_new(c, "logprobs", lp ? lp : json_null());
	}
	json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
	json_t *ch = chunk_head(g);
	json_object_set_new(ch, "choices", json_pack("[o]", c));
	if (g->include_usage)
		json_object_set_new(ch, "usage", json_null());
	sse(r, ch);
}

static void start(struct nxh_req *r)
{
	struct nxh_gen *g = &r->gen;
	if (g->started)
		return;
	g->started = true;
	r->t_first = nxh_now();
	nxh_metrics_ttft(r->t_first - r->t_start);
	if (!g->stream)
		return;
	nxh_req_stream_start(r, "text/event-stream");
	if (g->api == NXH_API_CHAT) /* the first chunk carries the role */
		sse_choice(r, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, NULL);
}

/* An error after the stream began: an error event, then the stream is cut
 * (no [DONE]), which the openai package raises as an APIError. */
static void stream_error(struct nxh_req *r, const char *code, const char *msg)
{
	sse(r, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", "server_error", "param", "code",
			 code));
	nxh_req_stream_end(r, true);
}

static void on_error(struct nxh_req *r, json_t *ev)
{
	struct nxh_gen *g = &r->gen;
	const char *code = json_string_value(json_object_get(ev, "code"));
	const char *msg = json_string_value(json_object_get(ev, "message"));
	if (g->started && g->stream) {
		stream_error(r, nxh_api_code(code ? code : "internal"), msg ? msg : "nxd gave no message");
		return;
	}
	if (g->as_adapter && code && !strcmp(code, "not_found"))
		nxh_model_not_found(r);
	else
		nxh_req_fail_event(r, ev);
	nxh_req_wake(r);
}

static void on_token(struct nxh_req *r, json_t *ev)
{
	struct nxh_gen *g = &r->gen;
	double now = nxh_now();
	if (g->started && g->t_last > 0)
		nxh_metrics_token_gap(now - g->t_last);
	g->t_last = now;
	start(r);
	g->n_tokens++;
	const char *text = json_string_value(json_object_get(ev, "text"));
	text = text ? text : "";
	json_t *e = NULL;
	if (g->logprobs)
		e = g->api == NXH_API_CHAT ? chat_lp_entry(g, ev) : completion_lp_entry(g, ev);
	for (const char *c = text; *c; c++) /* characters, as OpenAI's offsets into the text count */
		g->text_offset += ((unsigned char)*c & 0xc0) != 0x80;
	if (g->stream) {
		if (!*text && !e) /* held back: maybe the start of a stop string */
			return;
		if (!e && sse_text(r, text))
			return;
		json_t *t = g->api == NXH_API_CHAT ? json_pack("{s:s}", "content", text) : json_string(text);
		sse_choice(r, t, e ? (g->api == NXH_API_CHAT ? json_pack("[o]", e) : e) : NULL, NULL);
		return;
	}
	nxh_buf_put(&g->text, text, strlen(text));
	if (e) {
		lp_gather(g, e);
		json_decref(e);
	}
}

/* A call nxd read out of the answer: OpenAI's streamed pieces (the id and
 * name, then the arguments), or gathered for the whole answer. */
static void on_tool_call(struct nxh_req *r, json_t *ev)
{
	struct nxh_gen *g = &r->gen;
	json_t *tc = json_object_get(ev, "tool_call");
	json_int_t index = json_integer_value(json_object_get(ev, "index"));
	const char *id = json_string_value(json_object_get(tc, "id"));
	const char *name = json_string_value(json_object_get(tc, "name"));
	const char *args = json_string_value(json_object_get(tc, "arguments"));
	if (!id || !name || !args)
		return;
	start(r);
	if (!g->stream) {
		if (!g->tool_calls)
			g->tool_calls = json_array();
		json_array_append_new(g->tool_calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
							      "function", "name", name, "arguments", args));
		return;
	}
	sse_choice(r, json_pack("{s:[{s:I, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", index, "id", id, "type",
				"function", "function", "name", name, "arguments", ""), NULL, NULL);
	sse_choice(r, json_pack("{s:[{s:I, s:{s:s}}]}", "tool_calls", "index", index, "function", "arguments", args), NULL,
		   NULL);
}

static void answer(struct nxh_req *r, const char *finish, json_t *usage)
{
	struct nxh_gen *g = &r->gen;
	json_t *c = json_pack("{s:i}", "index", 0);
	json_t *text = json_stringn(g->text.p ? g->text.p : "", g->text.len);
	if (g->api == NXH_API_CHAT) {
		/* a message of calls alone has no content, as OpenAI's */
		/* calls and no text but the newlines between them: OpenAI's content is then null */
		if (g->tool_calls && strspn(g->text.p ? g->text.p : "", " \t\r\n") == g->text.len) {
			json_decref(text);
			text = json_null();
		}
		json_t *m = json_pack("{s:s, s:o, s:n}", "role", "assistant", "content", text, "refusal");
		if (g->tool_calls)
			json_object_set(m, "tool_calls", g->tool_calls);
		json_object_set_new(c, "message", m);
		json_t *content = g->lp ? json_incref(g->lp) : json_array();
		if (g->logprobs)
			json_object_set_new(c, "logprobs", json_pack("{s:o, s:n}", "content", content, "refusal"));
		else
			json_object_set_new(c, "logprobs", (json_decref(content), json_null()));
	} else {
		json_object_set_new(c, "text", text);
		json_object_set(c, "logprobs", g->logprobs && g->lp ? g->lp : json_null());
	}
	json_object_set_new(c, "finish_reason", json_string(finish));
	json_t *a = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", g->id, "object",
			      g->api == NXH_API_CHAT ? "chat.completion" : "text_completion", "created",
			      (json_int_t)g->created, "model", g->model, "choices", c, "usage", usage);
	nxh_req_answer(r, 200, a);
	nxh_req_wake(r);
}

static void on_done(struct nxh_req *r, json_t *ev)
{
	struct nxh_gen *g = &r->gen;
	const char *reason = json_string_value(json_object_get(ev, "reason"));
	reason = reason ? reason : "";
	json_t *u = json_object_get(ev, "usage");
	nxh_metrics_tokens((int)json_integer_value(json_object_get(u, "prompt_tokens")),
			   (int)json_integer_value(json_object_get(u, "completion_tokens")));
	if (!strcmp(reason, "shutdown") || !strcmp(reason, "cancelled")) {
		const char *msg = !strcmp(reason, "shutdown") ? "nxd is shutting down; the answer is incomplete" :
								"nxd cancelled the request";
		if (g->started && g->stream) {
			stream_error(r, "shutting_down", msg);
		} else {
			nxh_req_fail(r, 503, "server_error", NULL, "shutting_down", "%s", msg);
			nxh_req_wake(r);
		}
		return;
	}
	/* eos and a stop string are both "stop" to OpenAI. */
	const char *finish = !strcmp(reason, "length") ? "length" : !strcmp(reason, "tool_calls") ? "tool_calls" : "stop";
	start(r);
	if (!g->stream) {
		answer(r, finish, usage_of(ev));
		return;
	}
	sse_choice(r, g->api == NXH_API_CHAT ? json_object() : json_string(""), NULL, finish);
	if (g->include_usage) {
		json_t *ch = chunk_head(g);
		json_object_set_new(ch, "choices", json_array());
		json_object_set_new(ch, "usage", usage_of(ev));
		sse(r, ch);
	}
	nxh_req_stream_put(r, "data: [DONE]\n\n", 14);
	nxh_req_stream_end(r, false);
}

void nxh_gen_event(struct nxh_req *r, json_t *ev)
{
	const char *name = json_string_value(json_object_get(ev, "event"));
	if (!name)
		return;
	if (!strcmp(name, "token"))
		on_token(r, ev);
	else if (!strcmp(name, "tool_call"))
		on_tool_call(r, ev);
	else if (!strcmp(name, "done"))
		on_done(r, ev);
	else if (!strcmp(name, "error"))
		on_error(r, ev);
}
