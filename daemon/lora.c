/* lora.c - the supervisor's LoRA registry: adapters loaded into the arena, runtime deltas per request, the adapter ops and the step boundary.
 *
 * Adapters. lora_load validates the file against the model (lora/adapter.h)
 * in the event loop, then the helper thread's load job (lora_job.c) converts
 * A and B into arena blocks, with the struct nx_lora itself, so a big
 * adapter does not hold every client's next token: the entry is reserved
 * but not usable until the job is done and the next step boundary registers
 * it. Workers reach an adapter through the per-slot mix table
 * (nx_state.lora), no copy. Adapters and folded tensors live in arena
 * blocks (shm/blocks.h): freed ones are reused and their pages given back,
 * so load/unload cycles do not grow the arena.
 *
 * Trust. Workers can write the arena, so the supervisor reads only its own
 * heap copy of each struct nx_lora (the arena one and the mix table are for
 * the workers); a scribbled A/B pointer there can crash a worker, never us.
 *
 * Runtime delta. A generate naming adapters gets a struct nx_lora_mix; at
 * admission it is written to its slot's entry of the mix table (the slot is
 * free, so no step in flight reads it) and every token the scheduler plans
 * for the slot carries lora = slot + 1. Adapters in use cannot be unloaded
 * or folded (in_use counts the requests, queued or running).
 *
 * Step boundary. nxd_lora_boundary is called by the scheduler with no step
 * in flight, right before it plans and launches the next one: what changes
 * the model the workers read (a fold's swap, an unfold) happens there only.
 * Folds: lora_fold.c; reports: lora_report.c. */
#define _GNU_SOURCE
#include "daemon/lora_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(NXP_MAX_LORA <= NX_LORA_MIX_MAX, "a request's adapters must fit one mix");

/* ---------------------------------------------------------------- shared */

void *nxd_lora_blk_alloc(struct nxd *d, size_t size, struct nx_err *err)
{
	return nx_blocks_alloc(&d->lora->blocks, size, err);
}

void nxd_lora_blk_free(struct nxd *d, void *p, size_t size)
{
	int rc = nx_blocks_free(&d->lora->blocks, p, size);
	if (rc == -ENOMEM)
		nxd_err("lora: out of memory for the arena's free list: %zu bytes leak", nx_blocks_round(size));
	else if (rc < 0)
		nxd_warn("lora: fallocate(PUNCH_HOLE, %zu bytes) failed: %s", nx_blocks_round(size), strerror(-rc));
}

struct nxd_lora_ent *nxd_lora_find(struct nxd *d, const char *name)
{
	for (int i = 0; i < NXD_LORA_MAX; i++)
		if (d->lora->ent[i].used && !strcmp(d->lora->ent[i].name, name))
			return &d->lora->ent[i];
	return NULL;
}

struct nx_wt *nxd_lora_wt(struct nx_model *m, int layer, enum nx_lora_which w)
{
	return (struct nx_wt *)nx_lora_base(m, layer, w);
}

int nxd_lora_scale_ok(float s, struct nx_err *err)
{
	if (!(s >= -1e4f && s <= 1e4f))
		return nx_errf(err, "field 'scale' must be in -10000..10000, got %g", (double)s);
	return 0;
}

/* What lora_loaded and lora_list say of e; *fi holds its fold, if any. */
static struct nxp_adapter_info adapter_info(struct nxd *d, const struct nxd_lora_ent *e, struct nxp_fold_info *fi)
{
	if (e->fold >= 0)
		*fi = nxd_lora_fold_info(&d->lora->stack[e->fold], e->fold + 1);
	return (struct nxp_adapter_info){.name = e->name, .path = e->path, .rank = e->own->rank,
					 .alpha = (double)e->own->alpha, .rslora = e->own->rslora, .tensors = e->own->n,
					 .bytes = e->l_size + e->mem_size, .scale = (double)e->scale,
					 .fold = e->fold >= 0 ? fi : NULL, .in_use = e->in_use, .busy = e->busy};
}

/* ---------------------------------------------------------------- load */

/* A free entry for the adapter lora_load names, or NULL with the refusal sent. */
static struct nxd_lora_ent *load_slot(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_reg *g = d->lora;
	if (nxd_lora_find(d, o->name)) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "an adapter named '%s' is already loaded", o->name);
		return NULL;
	}
	struct nx_err err = {{0}};
	if (nxd_lora_scale_ok(o->has_scale ? o->scale : 1.0f, &err)) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "%s", err.msg);
		return NULL;
	}
	struct nxd_lora_ent *e = NULL;
	for (int i = 0; i < NXD_LORA_MAX && !e; i++)
		if (!g->ent[i].used)
			e = &g->ent[i];
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "%d adapters are loaded, the most nxd holds; unload one first",
			       NXD_LORA_MAX);
		return NULL;
	}
	return nxd_lora_job_busy(d, c, id) ? NULL : e;
}

/* The adapter file opened and checked against the model, within the limits;
 * the refusal sent on an error. */
static int load_open(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o,
		     struct nx_lora_src *src)
{
	struct nxd_lora_reg *g = d->lora;
	struct nx_err err = {{0}};
	/* Opened as the client could open it, then parsed from what was opened
	 * (access.c): every error after this is about a file it may read. */
	struct nx_lora_files files;
	if (nxd_access_open_adapter(c, o->path, &files, &err) < 0) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "%s", err.msg);
		return -1;
	}
	/* Validated against our own copy of the model: shapes are the base's
	 * whatever is folded (folds keep shapes). */
	int rc = nx_lora_open_files(src, &files, &d->model.m, &err);
	nxd_access_close_adapter(&files);
	if (rc) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "adapter '%s': %s", o->name, err.msg);
		return -1;
	}
	int n_loaded = 0;
	size_t bytes_loaded = 0;
	for (int i = 0; i < NXD_LORA_MAX; i++)
		if (g->ent[i].used) {
			n_loaded++;
			bytes_loaded += g->ent[i].mem_size + g->ent[i].l_size;
		}
	if (nxd_limits_check_adapter(n_loaded, bytes_loaded, nx_lora_size(src) + sizeof(struct nx_lora), &err) < 0) {
		nx_lora_close(src);
		nxd_send_error(d, c, id, NXP_E_BUSY, "%s", err.msg);
		return -1;
	}
	return 0;
}

static void load_blocks_free(struct nxd *d, struct nxd_lora_ent *e)
{
	nxd_lora_blk_free(d, e->l, e->l_size);
	nxd_lora_blk_free(d, e->mem, e->mem_size);
	memset(e, 0, sizeof(*e));
}

static void op_load(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nx_err err = {{0}};
	struct nxd_lora_ent *e = load_slot(d, c, id, o);
	struct nx_lora_src src;
	if (!e || load_open(d, c, id, o, &src))
		return;
	size_t mem_size = nx_lora_size(&src);
	memset(e, 0, sizeof(*e));
	e->fold = -1;
	e->l_size = sizeof(struct nx_lora);
	if (mem_size == 0 || !(e->l = nxd_lora_blk_alloc(d, e->l_size, &err)) ||
	    !(e->mem = nxd_lora_blk_alloc(d, mem_size, &err))) {
		if (!err.msg[0])
			nx_errf(&err, "its size overflows");
		nx_lora_close(&src);
		/* A size that overflows is the file's fault; else the arena is full for now. */
		nxd_send_error(d, c, id, mem_size ? NXP_E_BUSY : NXP_E_BAD_REQUEST,
			       "adapter '%s': no room in the arena: %s", o->name, err.msg);
		load_blocks_free(d, e);
		return;
	}
	e->mem_size = mem_size;
	/* Reserved under its name (a second load of it is refused), converted by
	 * the load job, registered by its finish. */
	e->used = e->loading = true;
	e->scale = o->has_scale ? o->scale : 1.0f;
	snprintf(e->name, sizeof(e->name), "%s", o->name);
	snprintf(e->path, sizeof(e->path), "%s", o->path);
	struct nxd_lora_job *j = &d->lora->job;
	j->kind = NXD_JOB_LOAD;
	j->u.src = src;
	if (nxd_lora_job_start(d, c, id, e, &err)) {
		nx_lora_close(&j->u.src);
		load_blocks_free(d, e);
		nxd_lora_job_clear(d);
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "adapter '%s': %s", o->name, err.msg);
	}
}

void nxd_lora_load_run(struct nxd_lora_job *j)
{
	struct nxd_lora_ent *e = j->ent;
	struct nx_err err = {{0}};
	/* What the file holds can still be wrong (a value, not a shape): the client's error. */
	if (nx_lora_init(e->l, e->mem, e->mem_size, &j->u.src, &err))
		nxd_lora_job_fail(j, NXP_E_BAD_REQUEST, "%s", err.msg);
	nx_lora_close(&j->u.src);
}

/* The load job ended: the adapter is usable from now on, or its blocks go back. */
void nxd_lora_load_finish(struct nxd *d, struct nxd_lora_job *j, struct nxd_conn *c)
{
	struct nxd_lora_ent *e = j->ent;
	if (!j->failed && !(e->own = malloc(sizeof(*e->own))))
		nxd_lora_job_fail(j, NXP_E_INTERNAL, "out of memory");
	if (j->failed) {
		if (c)
			nxd_send_error(d, c, j->who.id, j->code, "adapter '%s': %s", e->name, j->err);
		load_blocks_free(d, e);
		j->ent = NULL;
		return;
	}
	memcpy(e->own, e->l, sizeof(*e->own));
	e->loading = false;
	nxd_info("lora: loaded '%s' from %s: rank %d, alpha %g, %d matrices, %.1f MiB in the arena (%.0f ms)", e->name,
		 e->path, e->own->rank, (double)e->own->alpha, e->own->n, (double)(e->mem_size + e->l_size) / 1048576,
		 (nxd_now() - j->t0) * 1e3);
	if (c) {
		struct nxp_fold_info fi;
		struct nxp_adapter_info ai = adapter_info(d, e, &fi);
		size_t n = 0;
		char *line = nxp_enc_lora_loaded_alloc(j->who.id, &ai, &n);
		nxd_lora_send_line(d, c, j->who.id, line, n);
	}
}

/* ---------------------------------------------------------------- list, unload */

static void list_send(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o,
		      struct nxp_adapter_info *ai, struct nxp_fold_info *fi, const char **folds)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxp_lora_list l = {.adapters = ai, .folds = folds, .n_folds = g->n_stack};
	for (int i = 0; i < NXD_LORA_MAX; i++)
		if (g->ent[i].used && !g->ent[i].loading) { /* a loading one shows as the job below */
			ai[l.n_adapters] = adapter_info(d, &g->ent[i], &fi[l.n_adapters]);
			l.n_adapters++;
		}
	for (int i = 0; i < g->n_stack; i++)
		folds[i] = g->stack[i].ent->name;
	char hex[20];
	if (o->checksum) {
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)nxd_lora_checksum(d->shm.model));
		l.checksum = hex;
	}
	struct nxp_lora_job_info job;
	if (g->job.kind != NXD_JOB_NONE) {
		job = (struct nxp_lora_job_info){.kind = nxd_lora_job_name(g->job.kind), .adapter = g->job.ent->name,
						 .done = atomic_load(&g->job.done), .total = atomic_load(&g->job.total)};
		l.job = &job;
	}
	size_t n = 0;
	char *line = nxp_enc_lora_list_alloc(id, &l, &n);
	nxd_lora_send_line(d, c, id, line, n);
}

static void op_list(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxp_adapter_info *ai = malloc(NXD_LORA_MAX * sizeof(*ai));
	struct nxp_fold_info *fi = malloc(NXD_LORA_MAX * sizeof(*fi));
	const char **folds = malloc(NXD_LORA_MAX * sizeof(*folds));
	if (ai && fi && folds)
		list_send(d, c, id, o, ai, fi, folds);
	else
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory encoding the answer");
	free(ai);
	free(fi);
	free(folds);
}

static void op_unload(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_ent *e = nxd_lora_find(d, o->name);
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", o->name);
		return;
	}
	if (e->fold >= 0) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "adapter '%s' is folded into the model; unfold it first",
			       e->name);
		return;
	}
	if (e->loading) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "adapter '%s' is still loading; unload it once lora_load answers",
			       e->name);
		return;
	}
	if (e->in_use > 0) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "adapter '%s' is in use by %d request%s; unload it when they end",
			       e->name, e->in_use, e->in_use == 1 ? "" : "s");
		return;
	}
	if (e->busy) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "adapter '%s' is being folded or graded; unload it when that ends",
			       e->name);
		return;
	}
	nxd_info("lora: unloaded '%s'", e->name);
	free(e->own);
	load_blocks_free(d, e);
	char buf[NXP_ID_MAX + 64];
	size_t n = nxp_enc_ok(buf, sizeof(buf), id);
	if (n < sizeof(buf))
		nxd_conn_queue(d, c, buf, n);
}

/* ---------------------------------------------------------------- ops and the boundary */

static void op_report(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	nxd_lora_op_report(d, c, id, o, false);
}

typedef void (*lora_op_fn)(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o);

static const lora_op_fn lora_ops[] = {
	[NXP_OP_LORA_LOAD] = op_load,
	[NXP_OP_LORA_LIST] = op_list,
	[NXP_OP_LORA_UNLOAD] = op_unload,
	[NXP_OP_LORA_FOLD] = nxd_lora_op_fold,
	[NXP_OP_LORA_UNFOLD] = nxd_lora_op_unfold,
	[NXP_OP_LORA_REPORT] = op_report,
};

void nxd_lora_op(struct nxd *d, struct nxd_conn *c, struct nxp_request *q)
{
	if ((size_t)q->op >= sizeof(lora_ops) / sizeof(lora_ops[0]) || !lora_ops[q->op]) {
		nxd_send_error(d, c, q->id, NXP_E_INTERNAL, "not an adapter operation");
		return;
	}
	lora_ops[q->op](d, c, q->id, &q->u.lora);
}

void nxd_lora_boundary(struct nxd *d)
{
	if (!d->lora || !nxd_step_idle(d))
		return;
	nxd_lora_job_boundary(d);
	nxd_lora_unfold_boundary(d);
}

/* ---------------------------------------------------------------- requests */

/* The entry generate's lora[i] names, usable as a runtime delta with scale *s;
 * NULL with the refusal sent. */
static struct nxd_lora_ent *delta_ent(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_ref *ref,
				      int i, float *s)
{
	struct nxd_lora_ent *e = nxd_lora_find(d, ref->name);
	struct nx_err err = {{0}};
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", ref->name);
		return NULL;
	}
	if (e->loading) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "adapter '%s' is still loading; try again once lora_load answers",
			       ref->name);
		return NULL;
	}
	if (e->fold >= 0 || (e->busy && d->lora->job.kind == NXD_JOB_FOLD)) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST,
			       "adapter '%s' is %s the model: as a runtime delta too it would count twice", e->name,
			       e->fold >= 0 ? "folded into" : "being folded into");
		return NULL;
	}
	*s = ref->has_scale ? ref->scale : e->scale;
	if (nxd_lora_scale_ok(*s, &err)) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "lora[%d]: %s", i, err.msg);
		return NULL;
	}
	return e;
}

int nxd_lora_resolve(struct nxd *d, struct nxd_conn *c, const struct nxp_generate *gen, struct nxd_req *r)
{
	struct nxd_lora_ent *ents[NX_LORA_MIX_MAX];
	for (int i = 0; i < gen->n_lora; i++) {
		float s;
		if (!(ents[i] = delta_ent(d, c, r->id, &gen->lora[i], i, &s)))
			return -1;
		r->lora_mix.l[i] = ents[i]->l;
		r->lora_mix.scale[i] = s;
	}
	for (int i = 0; i < gen->n_lora; i++) {
		r->lora_ent[i] = ents[i];
		r->lora_ent[i]->in_use++;
	}
	r->lora_mix.n = r->n_lora = gen->n_lora;
	return 0;
}

void nxd_lora_release(struct nxd_req *r)
{
	for (int i = 0; i < r->n_lora; i++)
		if (r->lora_ent[i])
			r->lora_ent[i]->in_use--;
	r->n_lora = 0;
}

void nxd_lora_admit(struct nxd *d, struct nxd_req *r, int slot)
{
	/* The slot is free: no step in flight has a token that reads its entry. */
	if (d->lora && r->n_lora > 0)
		d->lora->mix[slot] = r->lora_mix;
}

/* ---------------------------------------------------------------- life */

int nxd_lora_init(struct nxd *d, struct nx_err *err)
{
	d->lora = calloc(1, sizeof(*d->lora));
	if (!d->lora)
		return nx_errf(err, "lora: out of memory");
	nx_blocks_init(&d->lora->blocks, &d->shm.arena);
	size_t size = (size_t)d->o.n_slots * sizeof(struct nx_lora_mix);
	d->lora->mix = nx_arena_alloc(&d->shm.arena, size, err);
	if (!d->lora->mix)
		return nx_err_prefix(err, "lora: mix table");
	/* Workers find it through their state struct; ours mirrors it. */
	d->shm.state.lora = d->shm.state_shared->lora = d->lora->mix;
	d->shm.state.n_lora = d->shm.state_shared->n_lora = d->o.n_slots;
	return 0;
}

void nxd_lora_free(struct nxd *d)
{
	struct nxd_lora_reg *g = d->lora;
	if (!g)
		return;
	g->job.stop = 1;
	nxd_lora_job_clear(d);
	for (int i = 0; i < g->n_stack; i++)
		free(g->stack[i].t);
	for (int i = 0; i < NXD_LORA_MAX; i++)
		free(g->ent[i].own);
	nx_blocks_release(&g->blocks);
	free(g);
	d->lora = NULL;
}
