/* lora_report.c - an adapter's accuracy report (lora_report, and lora_fold's dry run) as a job of the helper thread.
 *
 * The probe prompt runs through the model in service with every matmul
 * input captured (lora/probe.h), each adapted matrix is graded (fold to the
 * asked types, runtime delta, base quantization noise) against the exact
 * float64 result on those real activations, and decode steps are timed with
 * and without the delta. The op tokenizes the probe and copies the models
 * the job reads (the tokenizer and the registry stay on the loop's thread);
 * the job changes nothing the daemon serves. */
#define _GNU_SOURCE
#include "daemon/lora_int.h"

#include <stdlib.h>
#include <string.h>

#include "lora/delta.h"

#define PROBE_TIMING 8        /* runs of a decode step and of the delta, timed (the fastest counts) */

/* The default probe: ordinary prose, so the activations are the model's usual ones. */
static const char default_probe[] =
	"The old lighthouse keeper climbed the stairs every evening at dusk. In 1905, Albert Einstein "
	"published four papers that changed physics, on the photoelectric effect, Brownian motion, special "
	"relativity and the equivalence of mass and energy. Water boils at 100 degrees Celsius at sea level.";

static void report_progress(void *ctx, int done, int total)
{
	struct nxd_lora_job *j = ctx;
	atomic_store(&j->total, total);
	atomic_store(&j->done, done);
}

/* Fold types: the dry run's one, else the report's list (default keep, f16). */
static int report_types(struct nxd_lora_report_job *r, const struct nxp_lora_op *o, bool dry_run,
			struct nx_err *err)
{
	static const char defaults[2][NXP_MAX_TYPE_NAME] = {"keep", "f16"};
	const char(*names)[NXP_MAX_TYPE_NAME] = o->types;
	int n_names = o->n_types;
	if (dry_run) {
		names = (const char(*)[NXP_MAX_TYPE_NAME])o->type;
		n_names = 1;
	} else if (n_names == 0) {
		names = defaults;
		n_names = 2;
	}
	r->ro.n_types = n_names;
	for (int i = 0; i < n_names; i++) {
		bool keep;
		enum nx_type t = NX_F32;
		if (nxd_lora_parse_type(names[i], &keep, &t, err))
			return -1;
		r->ro.types[i] = keep ? -1 : (int)t;
	}
	return 0;
}

/* The layers asked (none: all); the matrices they adapt, the progress total, in *total. */
static int report_layers(struct nxd *d, struct nxd_lora_report_job *r, const struct nxp_lora_op *o,
			 const struct nx_lora *l, long *total, struct nx_err *err)
{
	const int n_layer = d->model.m.hp.n_layer;
	for (int i = 0; i < o->n_layers; i++) {
		if (o->layers[i] >= n_layer)
			return nx_errf(err, "field 'layers[%d]' must be in 0..%d, got %d", i, n_layer - 1, o->layers[i]);
		r->layers[o->layers[i]] = true;
	}
	if (o->n_layers)
		r->ro.layers = r->layers;
	*total = 0;
	for (int il = 0; il < n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++)
			*total += (!o->n_layers || r->layers[il]) && nx_lora_get(l, il, (enum nx_lora_which)w);
	return 0;
}

/* The probe prompt's tokens into r->probe; sends the error itself. */
static int report_probe(struct nxd *d, struct nxd_conn *c, const char *id, struct nxd_lora_report_job *r,
			const char *text)
{
	struct nx_err err = {{0}};
	size_t cap = strlen(text) + 2, n = 0, off = 0;
	if (!(r->probe = malloc(cap * sizeof(int32_t)))) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory");
		return -1;
	}
	if (nx_tok_add_bos(d->model.tok) && nx_tok_bos(d->model.tok) >= 0)
		r->probe[off++] = nx_tok_bos(d->model.tok);
	if (nx_tok_encode(d->model.tok, text, strlen(text), false, r->probe + off, cap - off, &n, &err) < 0) {
		/* Too small a guess (n says how many): once more with room for all. */
		int32_t *p = n > cap - off ? realloc(r->probe, (n + off) * sizeof(int32_t)) : NULL;
		if (p) {
			r->probe = p;
			cap = n + off;
		}
		if (!p || nx_tok_encode(d->model.tok, text, strlen(text), false, r->probe + off, cap - off, &n, &err) < 0) {
			nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "field 'prompt': %s", err.msg);
			return -1;
		}
	}
	r->n_probe = (int)(n + off);
	if (r->n_probe < 1 || r->n_probe > NX_LORA_PROBE_MAX) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "field 'prompt' must be 1..%d tokens, got %d",
			       NX_LORA_PROBE_MAX, r->n_probe);
		return -1;
	}
	return 0;
}

/* The probe runs on the model in service; grading is on the weights a fold
 * of this adapter starts from (for a folded adapter: its base). */
static int report_models(struct nxd *d, struct nxd_lora_report_job *r, const struct nxd_lora_ent *e)
{
	r->run = malloc(sizeof(struct nx_model));
	r->base = malloc(sizeof(struct nx_model));
	if (!r->run || !r->base)
		return -1;
	memcpy(r->run, d->shm.model, sizeof(struct nx_model));
	memcpy(r->base, d->shm.model, sizeof(struct nx_model));
	if (e->fold >= 0) {
		const struct nxd_fold *f = &d->lora->stack[e->fold];
		for (int i = 0; i < f->n; i++)
			*nxd_lora_wt(r->base, f->t[i].layer, f->t[i].which) = f->t[i].base;
	}
	return 0;
}

void nxd_lora_op_report(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o,
			bool dry_run)
{
	struct nx_err err = {{0}};
	struct nxd_lora_ent *e = nxd_lora_find(d, o->name);
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", o->name);
		return;
	}
	if (nxd_lora_job_busy(d, c, id))
		return;
	struct nxd_lora_job *j = &d->lora->job;
	memset(j, 0, sizeof(*j));
	j->kind = NXD_JOB_REPORT;
	struct nxd_lora_report_job *r = &j->u.report;
	r->dry_run = dry_run;
	r->ro.user_scale = o->has_scale ? o->scale : e->scale;
	long total = 0;
	if (nxd_lora_scale_ok(r->ro.user_scale, &err) || report_types(r, o, dry_run, &err) ||
	    report_layers(d, r, o, e->own, &total, &err)) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "%s", err.msg);
		nxd_lora_job_clear(d);
		return;
	}
	atomic_store(&j->total, total);
	if (report_probe(d, c, id, r, o->prompt ? o->prompt : default_probe)) {
		nxd_lora_job_clear(d);
		return;
	}
	if (report_models(d, r, e)) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory");
		nxd_lora_job_clear(d);
		return;
	}
	r->ro.progress = report_progress;
	r->ro.ctx = j;
	r->ro.stop = &j->stop;
	if (nxd_lora_job_start(d, c, id, e, &err)) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "%s", err.msg);
		nxd_lora_job_clear(d);
	}
}

/* Every adapted matrix's delta, in flops for one token. */
static int64_t delta_flops(const struct nx_lora *l)
{
	int64_t flops = 0;
	for (int il = 0; il < NX_MAX_LAYERS; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++)
			if (nx_lora_get(l, il, (enum nx_lora_which)w))
				flops += nx_lora_delta_flops(nx_lora_get(l, il, (enum nx_lora_which)w));
	return flops;
}

void nxd_lora_report_run(struct nxd_lora_job *j)
{
	struct nxd_lora_report_job *r = &j->u.report;
	const struct nx_lora *l = j->ent->own;
	struct nx_lora_probe_run pr;
	struct nx_err err = {{0}};
	/* what fails here but memory is the request's: layers the adapter leaves alone, a type the rows do not fit */
	if (nx_lora_probe_run(r->run, l, r->ro.user_scale, r->probe, r->n_probe, PROBE_TIMING, &pr, &err)) {
		nxd_lora_job_fail(j, strstr(err.msg, "out of memory") ? NXP_E_INTERNAL : NXP_E_BAD_REQUEST, "%s", err.msg);
		return;
	}
	r->ro.cap = pr.cap;
	r->ro.n_probe = pr.n;
	double tg = nxd_now();
	r->result = nx_lora_report_json(r->base, l, &r->ro, &err);
	if (!r->result)
		nxd_lora_job_fail(j, strstr(err.msg, "out of memory") ? NXP_E_INTERNAL : NXP_E_BAD_REQUEST, "%s", err.msg);
	else
		r->cost = (struct nxp_lora_cost){.base_ms_per_token = pr.base_ms_per_tok,
						 .delta_ms_per_token = pr.delta_ms_per_tok,
						 .delta_flops_per_token = delta_flops(l), .threads = 1,
						 .grade_ms = (nxd_now() - tg) * 1e3};
	free(pr.cap);
	r->ro.cap = NULL;
}

void nxd_lora_report_finish(struct nxd *d, struct nxd_lora_job *j, struct nxd_conn *c)
{
	const struct nxd_lora_ent *e = j->ent;
	struct nxd_lora_report_job *r = &j->u.report;
	if (!c)
		return;
	if (j->failed) {
		nxd_send_error(d, c, j->who.id, j->code, "report of '%s': %s", e->name, j->err);
		return;
	}
	struct nxp_fold_info fi;
	if (e->fold >= 0)
		fi = nxd_lora_fold_info(&d->lora->stack[e->fold], e->fold + 1);
	struct nxp_lora_report rep = {.name = e->name, .dry_run = r->dry_run, .report = r->result, .cost = &r->cost,
				      .fold = e->fold >= 0 ? &fi : NULL};
	size_t n = 0;
	char *line = nxp_enc_lora_report_alloc(j->who.id, &rep, &n);
	nxd_lora_send_line(d, c, j->who.id, line, n);
}

void nxd_lora_report_clear(struct nxd_lora_job *j)
{
	struct nxd_lora_report_job *r = &j->u.report;
	free(r->run);
	free(r->base);
	free(r->probe);
	json_decref(r->result);
}
