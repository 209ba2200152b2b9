/* lora_events.c - the LoRA operations' events (lora_loaded, lora_list, lora_folded, lora_unfolded, lora_report, progress).
 *
 * Built with jansson, not the fixed-buffer writer of proto.c: they are rare,
 * their size has no useful bound (a list of every adapter, a report of every
 * matrix), and lora_report carries the JSON that lora/probe.h builds. */
#include "proto/proto.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* {"id":..,"event":name, ...body's members} and '\n' as a malloc'd line;
 * body is stolen. NULL on out of memory. */
static char *event_line(const char *id, const char *name, json_t *body, size_t *len_out)
{
	if (!body)
		return NULL;
	json_t *o = json_object();
	json_t *jid = json_loads(id ? id : "null", JSON_DECODE_ANY, NULL);
	char *s = NULL;
	if (o && !json_object_set_new(o, "id", jid ? jid : json_null()) &&
	    !json_object_set_new(o, "event", json_string(name)) && !json_object_update(o, body))
		s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	json_decref(body);
	if (!s)
		return NULL;
	size_t n = strlen(s);
	char *line = realloc(s, n + 2);
	if (!line) {
		free(s);
		return NULL;
	}
	line[n] = '\n';
	line[n + 1] = '\0';
	if (len_out)
		*len_out = n + 1;
	return line;
}

static json_t *adapter_json(const struct nxp_adapter_info *a)
{
	const struct nxp_fold_info *f = a->fold;
	json_t *folded = f ? json_pack("{s:s,s:f,s:i,s:f}", "type", f->type, "scale", f->scale, "order", f->order,
				       "ms", f->ms)
			   : json_false();
	if (!folded)
		return NULL;
	return json_pack("{s:s,s:s,s:i,s:f,s:b,s:i,s:I,s:f,s:o,s:i,s:b}", "name", a->name, "path", a->path, "rank",
			 a->rank, "alpha", a->alpha, "rslora", a->rslora, "tensors", a->tensors, "bytes",
			 (json_int_t)a->bytes, "scale", a->scale, "folded", folded, "in_use", a->in_use, "busy", a->busy);
}

char *nxp_enc_lora_loaded_alloc(const char *id, const struct nxp_adapter_info *a, size_t *len_out)
{
	json_t *adapter = adapter_json(a);
	return event_line(id, "lora_loaded", adapter ? json_pack("{s:o}", "adapter", adapter) : NULL, len_out);
}

char *nxp_enc_lora_list_alloc(const char *id, const struct nxp_lora_list *l, size_t *len_out)
{
	json_t *list = json_array(), *folds = json_array();
	bool ok = list && folds;
	/* json_array_append_new fails on a NULL value: out of memory below. */
	for (int i = 0; ok && i < l->n_adapters; i++)
		ok = !json_array_append_new(list, adapter_json(&l->adapters[i]));
	for (int i = 0; ok && i < l->n_folds; i++)
		ok = !json_array_append_new(folds, json_string(l->folds[i]));
	if (!ok) {
		json_decref(list);
		json_decref(folds);
		return NULL;
	}
	json_t *body = json_pack("{s:o,s:o}", "adapters", list, "folds", folds);
	if (body && l->checksum && json_object_set_new(body, "checksum", json_string(l->checksum)))
		goto fail;
	if (body && l->job &&
	    json_object_set_new(body, "job",
				json_pack("{s:s,s:s,s:I,s:I}", "kind", l->job->kind, "adapter", l->job->adapter, "done",
					  (json_int_t)l->job->done, "total", (json_int_t)l->job->total)))
		goto fail;
	return event_line(id, "lora_list", body, len_out);
fail:
	json_decref(body);
	return NULL;
}

char *nxp_enc_lora_folded_alloc(const char *id, const char *name, const struct nxp_fold_info *f, size_t *len_out)
{
	return event_line(id, "lora_folded",
			  json_pack("{s:s,s:s,s:f,s:i,s:I,s:f,s:i}", "name", name, "type", f->type, "scale", f->scale,
				    "tensors", f->tensors, "bytes", (json_int_t)f->bytes, "ms", f->ms, "order", f->order),
			  len_out);
}

char *nxp_enc_lora_unfolded_alloc(const char *id, const char *name, int tensors, size_t *len_out)
{
	return event_line(id, "lora_unfolded", json_pack("{s:s,s:i}", "name", name, "tensors", tensors), len_out);
}

char *nxp_enc_progress_alloc(const char *id, int64_t done, int64_t total, const char *stage, size_t *len_out)
{
	return event_line(id, "progress",
			  json_pack("{s:I,s:I,s:s}", "done", (json_int_t)done, "total", (json_int_t)total, "stage", stage),
			  len_out);
}

/* The report with cost and folded added after its own members (a shallow
 * copy: the caller's object is not changed). */
static json_t *report_json(const struct nxp_lora_report *r)
{
	json_t *rep = json_copy((json_t *)r->report);
	if (!rep)
		return NULL;
	const struct nxp_lora_cost *c = r->cost;
	if (c && json_object_set_new(rep, "cost",
				     json_pack("{s:f,s:f,s:I,s:i,s:f}", "base_ms_per_token", c->base_ms_per_token,
					       "delta_ms_per_token", c->delta_ms_per_token, "delta_flops_per_token",
					       (json_int_t)c->delta_flops_per_token, "threads", c->threads, "grade_ms",
					       c->grade_ms)))
		goto fail;
	if (r->fold &&
	    json_object_set_new(rep, "folded", json_pack("{s:s,s:f}", "type", r->fold->type, "ms", r->fold->ms)))
		goto fail;
	return rep;
fail:
	json_decref(rep);
	return NULL;
}

char *nxp_enc_lora_report_alloc(const char *id, const struct nxp_lora_report *r, size_t *len_out)
{
	json_t *rep = report_json(r);
	return event_line(id, "lora_report",
			  rep ? json_pack("{s:s,s:b,s:o}", "name", r->name, "dry_run", r->dry_run, "report", rep) : NULL,
			  len_out);
}
