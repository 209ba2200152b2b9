/* info.c - the answers that are not generations: models, tokenize / detokenize, health, the admin operations. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/nxh.h"
#include "proto/proto.h"

static bool is_event(const json_t *ev, const char *name)
{
	const char *s = json_string_value(json_object_get(ev, "event"));
	return s && !strcmp(s, name);
}

/* An error event (nxd's, or a lost connection) into the answer. */
static bool took_error(struct nxh_req *r, json_t *ev)
{
	if (!is_event(ev, "error"))
		return false;
	nxh_req_fail_event(r, ev);
	nxh_req_wake(r);
	return true;
}

int nxh_info_begin(struct nxh_req *r)
{
	(void)r;
	return 0;
}

// --- /v1/models, /v1/models/{id}

json_t *nxh_models_build(struct nxh_req *r, const json_t *hello)
{
	(void)r;
	(void)hello;
	return json_pack("{s:s}", "op", "lora_list");
}

static json_t *model_obj(const char *id, const char *parent)
{
	json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "model", "created", (json_int_t)nxh.started,
			      "owned_by", "nxd");
	if (parent)
		json_object_set_new(m, "parent", json_string(parent));
	return m;
}

void nxh_models_event(struct nxh_req *r, json_t *ev)
{
	if (took_error(r, ev))
		return;
	const char *served = nxh.o.model_id ? nxh.o.model_id : nxh.model.name[0] ? nxh.model.name : "nxd";
	json_t *data = json_array();
	json_array_append_new(data, model_obj(served, NULL));
	size_t i;
	json_t *a;
	/* Adapters are models too: naming one applies it as a runtime delta.
	 * A folded one is part of the served model already. */
	json_array_foreach(json_object_get(ev, "adapters"), i, a) {
		const char *name = json_string_value(json_object_get(a, "name"));
		if (name && !json_is_true(json_object_get(a, "folded")) && strcmp(name, served))
			json_array_append_new(data, model_obj(name, served));
	}
	const char *prefix = "/v1/models/";
	if (!strncmp(r->path, prefix, strlen(prefix))) {
		const char *want = r->path + strlen(prefix);
		json_array_foreach(data, i, a)
			if (!strcmp(json_string_value(json_object_get(a, "id")), want)) {
				nxh_req_answer(r, 200, json_incref(a));
				json_decref(data);
				nxh_req_wake(r);
				return;
			}
		json_decref(data);
		nxh_req_fail(r, 404, "invalid_request_error", "model", "model_not_found", "The model '%s' does not exist",
			     want);
		nxh_req_wake(r);
		return;
	}
	nxh_req_answer(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
	nxh_req_wake(r);
}

// --- /tokenize, /detokenize (vLLM's shapes)

static const char *const tokenize_known[] = { "model", "prompt", "add_special_tokens", NULL };
static const char *const detokenize_known[] = { "model", "tokens", NULL };

static int check_model(struct nxh_req *r)
{
	const char *m = NULL;
	bool has;
	if (nxh_get_str(r, r->json, "model", NULL, &m, &has))
		return -1;
	if (has && !(r->gen.model = strdup(m)))
		return -1;
	return 0;
}

int nxh_tokenize_begin(struct nxh_req *r)
{
	const char *text = NULL;
	bool has, add = true, has_add;
	if (nxh_only_fields(r, r->json, NULL, tokenize_known) || check_model(r) ||
	    nxh_get_str(r, r->json, "prompt", NULL, &text, &has) ||
	    nxh_get_bool(r, r->json, "add_special_tokens", NULL, &add, &has_add))
		return -1;
	if (!has) {
		nxh_req_bad(r, "prompt", "field 'prompt' is required");
		return -1;
	}
	/* Special-token text is parsed as such, as Hugging Face tokenizers do;
	 * add_special_tokens true is the model's own choice of a BOS. */
	r->gen.req = json_pack("{s:s, s:O, s:b}", "op", "tokenize", "text", json_object_get(r->json, "prompt"),
			       "special", 1);
	if (r->gen.req && !add)
		json_object_set_new(r->gen.req, "add_bos", json_false());
	return r->gen.req ? 0 : -1;
}

int nxh_detokenize_begin(struct nxh_req *r)
{
	if (nxh_only_fields(r, r->json, NULL, detokenize_known) || check_model(r))
		return -1;
	json_t *t = json_object_get(r->json, "tokens");
	if (!json_is_array(t)) {
		nxh_req_bad(r, "tokens", "field 'tokens' must be an array of token ids");
		return -1;
	}
	r->gen.req = json_pack("{s:s, s:O}", "op", "detokenize", "tokens", t); /* nxd checks each id */
	return r->gen.req ? 0 : -1;
}

json_t *nxh_tok_build(struct nxh_req *r, const json_t *hello)
{
	if (r->gen.model && strcmp(r->gen.model, nxh_model_id(hello))) {
		nxh_req_fail(r, 404, "invalid_request_error", "model", "model_not_found", "The model '%s' does not exist",
			     r->gen.model);
		return NULL;
	}
	return json_copy(r->gen.req);
}

void nxh_tok_event(struct nxh_req *r, json_t *ev)
{
	if (took_error(r, ev))
		return;
	if (is_event(ev, "tokens")) {
		json_t *t = json_object_get(ev, "tokens");
		nxh_req_answer(r, 200, json_pack("{s:I, s:I, s:O}", "count", (json_int_t)json_array_size(t),
						 "max_model_len", (json_int_t)nxh.model.n_ctx, "tokens", t));
	} else {
		nxh_req_answer(r, 200, json_pack("{s:O}", "prompt", json_object_get(ev, "text")));
	}
	nxh_req_wake(r);
}

// --- /health

json_t *nxh_status_build(struct nxh_req *r, const json_t *hello)
{
	(void)r;
	(void)hello;
	return json_pack("{s:s}", "op", "status");
}

/* The first worker that is not working, as "worker 1 (pid 42) is backoff". */
static bool workers_down(const json_t *st, char *why, size_t cap)
{
	size_t i;
	json_t *w;
	json_array_foreach(json_object_get(st, "workers"), i, w) {
		const char *s = json_string_value(json_object_get(w, "state"));
		if (s && strcmp(s, "idle") && strcmp(s, "busy")) {
			snprintf(why, cap, "worker %zu (pid %lld) is %s", i,
				 (long long)json_integer_value(json_object_get(w, "pid")), s);
			return true;
		}
	}
	return false;
}

void nxh_health_event(struct nxh_req *r, json_t *ev)
{
	if (is_event(ev, "error")) {
		const char *msg = json_string_value(json_object_get(ev, "message"));
		nxh_req_answer(r, 503, json_pack("{s:s, s:s}", "status", "unavailable", "reason", msg ? msg : "nxd error"));
		nxh_req_wake(r);
		return;
	}
	char why[256];
	if (workers_down(ev, why, sizeof(why)))
		nxh_req_answer(r, 503, json_pack("{s:s, s:s}", "status", "unavailable", "reason", why));
	else
		nxh_req_answer(r, 200, json_pack("{s:s, s:s, s:O, s:O}", "status", "ok", "model",
						 nxh.model.name, "slots", json_object_get(ev, "slots"), "uptime_s",
						 json_object_get(ev, "uptime_s")));
	nxh_req_wake(r);
}

// --- /admin/... (only with --admin-key-file): LoRA load / unload / fold / unfold, shutdown

static const struct {
	const char *path, *op;
	const char *const fields[6];
} admin_ops[] = {
	{ "/admin/lora/load", "lora_load", { "name", "path", "scale", NULL } },
	{ "/admin/lora/unload", "lora_unload", { "name", NULL } },
	{ "/admin/lora/fold", "lora_fold", { "name", "scale", "type", NULL } },
	{ "/admin/lora/unfold", "lora_unfold", { "name", NULL } },
	{ "/admin/shutdown", "shutdown", { NULL } },
};

int nxh_admin_begin(struct nxh_req *r)
{
	for (size_t i = 0; i < sizeof(admin_ops) / sizeof(admin_ops[0]); i++) {
		if (strcmp(r->path, admin_ops[i].path))
			continue;
		if (nxh_only_fields(r, r->json, NULL, admin_ops[i].fields))
			return -1;
		r->gen.req = json_copy(r->json);
		json_object_set_new(r->gen.req, "op", json_string(admin_ops[i].op));
		return 0;
	}
	nxh_req_fail(r, 404, "invalid_request_error", NULL, "unknown_url", "Unknown request URL: POST %s", r->path);
	return -1;
}

json_t *nxh_admin_build(struct nxh_req *r, const json_t *hello)
{
	(void)hello;
	return json_copy(r->gen.req);
}

void nxh_admin_event(struct nxh_req *r, json_t *ev)
{
	if (took_error(r, ev))
		return;
	if (is_event(ev, "progress"))
		return;
	json_t *a = json_copy(ev);
	json_object_del(a, "id");
	nxh_req_answer(r, 200, a);
	nxh_req_wake(r);
}
