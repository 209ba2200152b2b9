/* lora_fold.c - folding an adapter into the served weights and unfolding it, each swapped in at a step boundary.
 *
 * The arithmetic (lora/fold.h, f64 accumulation, requantization) runs as
 * the helper thread's fold job (lora_job.c), off the event loop. The job
 * only reads the base tensors and the adapter and writes fresh arena blocks
 * nobody reads yet. When it is done, the next step boundary swaps every
 * folded tensor's nx_wt in the workers' nx_model and in our own copy at
 * once: a step sees all of the fold or none of it. The base nx_wt is kept,
 * so unfold puts it back (bit for bit: the base bytes were never written)
 * at a step boundary too, then frees the folded blocks. Folds stack: a fold
 * starts from the model as it is (earlier folds included), so only the
 * latest fold can be undone; unfolding another is refused. */
#define _GNU_SOURCE
#include "daemon/lora_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern/pack.h"
#include "lora/fold.h"
#include "model/repack.h"

#define FOLD_ROWS 64          /* rows per nx_fold_rows call (progress granularity) */

int nxd_lora_parse_type(const char *s, bool *keep, enum nx_type *t, struct nx_err *err)
{
	*keep = !s[0] || !strcmp(s, "keep");
	if (*keep)
		return 0;
	return nx_fold_type_parse(s, t, err);
}

struct nxp_fold_info nxd_lora_fold_info(const struct nxd_fold *f, int order)
{
	size_t bytes = 0;
	for (int i = 0; i < f->n; i++)
		bytes += f->t[i].size + f->t[i].psize;
	return (struct nxp_fold_info){.type = f->keep ? "keep" : nx_type_name(f->type), .scale = (double)f->scale,
				      .order = order, .ms = f->ms, .tensors = f->n, .bytes = bytes};
}

/* ---------------------------------------------------------------- checksum */

static void hash_bytes(uint64_t h[4], const uint8_t *p, size_t n)
{
	size_t i = 0;
	for (; i + 32 <= n; i += 32)
		for (int k = 0; k < 4; k++) {
			uint64_t v;
			memcpy(&v, p + i + 8 * k, 8);
			h[k] = (h[k] ^ v) * 0x100000001b3ull;
			h[k] ^= h[k] >> 29;
		}
	for (; i < n; i++)
		h[0] = (h[0] ^ p[i]) * 0x100000001b3ull;
}

/* A fast checksum (64-bit, 4 lanes) of every adaptable matrix's bytes as the
 * workers' model points at them (plain rows and the packed copy, if any). */
uint64_t nxd_lora_checksum(const struct nx_model *m)
{
	uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};
	for (int il = 0; il < m->hp.n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct nx_wt *t = nx_lora_base(m, il, (enum nx_lora_which)w);
			hash_bytes(h, t->data, t->row_bytes * (size_t)t->n_out);
			if (t->packed)
				hash_bytes(h, t->packed, t->row_bytes * (size_t)t->n_out);
			h[1] ^= (uint64_t)il * 131 + (uint64_t)w; /* where one tensor ends */
		}
	return h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7);
}

/* ---------------------------------------------------------------- the fold job */

static void fold_blocks_free(struct nxd *d, struct nxd_fold *f)
{
	for (int i = 0; i < f->n; i++) {
		nxd_lora_blk_free(d, f->t[i].mem, f->t[i].size);
		nxd_lora_blk_free(d, f->t[i].pmem, f->t[i].psize);
	}
}

/* Fills f->t with every matrix e adapts, checked, with its sizes; the rows
 * to fold in *rows. Nothing is allocated in the arena yet. */
static int fold_plan(struct nxd *d, struct nxd_fold *f, long *rows, struct nx_err *err)
{
	const struct nx_lora *l = f->ent->own;
	for (int il = 0; il < d->model.m.hp.n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct nx_lora_t *lt = nx_lora_get(l, il, (enum nx_lora_which)w);
			if (!lt)
				continue;
			struct nxd_fold_t *t = &f->t[f->n++];
			t->layer = il;
			t->which = (enum nx_lora_which)w;
			/* From the workers' copy (read-only to them): what they run now,
			 * packed copies included. */
			t->base = *nxd_lora_wt(d->shm.model, il, t->which);
			enum nx_type ty = f->keep ? t->base.type : f->type;
			if (nx_fold_check(&t->base, lt, ty, err))
				return nx_err_prefix(err, "adapter '%s': blk.%d.%s.weight", f->ent->name, il,
						     nx_lora_which_gguf(t->which));
			t->size = (size_t)nx_fold_size(&t->base, ty);
			t->folded = (struct nx_wt){.type = ty, .n_in = t->base.n_in, .n_out = t->base.n_out,
						   .row_bytes = (size_t)nx_row_size(ty, t->base.n_in)};
			/* The engine runs this model's matrices packed: the folded one too, if it can. */
			t->psize = t->base.packed && nx_wt_packable(&t->folded) ? t->size : 0;
			*rows += (long)t->base.n_out;
		}
	return 0;
}

/* The arena blocks of every matrix (all or none); their bytes in *bytes. */
static int fold_alloc(struct nxd *d, struct nxd_fold *f, size_t *bytes, struct nx_err *err)
{
	for (int i = 0; i < f->n; i++) {
		struct nxd_fold_t *t = &f->t[i];
		if (!(t->mem = nxd_lora_blk_alloc(d, t->size, err)) ||
		    (t->psize && !(t->pmem = nxd_lora_blk_alloc(d, t->psize, err)))) {
			fold_blocks_free(d, f);
			return -1;
		}
		t->folded.data = t->mem;
		t->folded.packed = t->pmem;
		*bytes += nx_blocks_round(t->size) + nx_blocks_round(t->psize);
	}
	return 0;
}

/* Checks what the fold asks before the job is taken; sends the refusal. */
static bool fold_refused(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxd_lora_ent *e)
{
	if (nxd_lora_job_busy(d, c, id))
		return true;
	if (e->fold >= 0) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "adapter '%s' is already folded into the model", e->name);
		return true;
	}
	if (e->in_use > 0) {
		nxd_send_error(d, c, id, NXP_E_BUSY,
			       "adapter '%s' is in use as a runtime delta by %d request%s: folding it would apply it twice "
			       "to them; fold it when they end",
			       e->name, e->in_use, e->in_use == 1 ? "" : "s");
		return true;
	}
	if (d->lora->n_stack >= NXD_LORA_MAX) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "%d folds are stacked already", d->lora->n_stack);
		return true;
	}
	return false;
}

void nxd_lora_op_fold(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nx_err err = {{0}};
	struct nxd_lora_ent *e = nxd_lora_find(d, o->name);
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", o->name);
		return;
	}
	if (o->dry_run) {
		nxd_lora_op_report(d, c, id, o, true);
		return;
	}
	if (fold_refused(d, c, id, e))
		return;
	struct nxd_lora_job *j = &d->lora->job;
	memset(j, 0, sizeof(*j));
	j->kind = NXD_JOB_FOLD;
	struct nxd_fold *f = &j->u.fold;
	f->ent = e;
	f->scale = o->has_scale ? o->scale : e->scale;
	if (nxd_lora_scale_ok(f->scale, &err) || nxd_lora_parse_type(o->type, &f->keep, &f->type, &err)) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "%s", err.msg);
		nxd_lora_job_clear(d);
		return;
	}
	f->t = calloc((size_t)e->own->n, sizeof(*f->t));
	if (!f->t) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory");
		nxd_lora_job_clear(d);
		return;
	}
	/* Check every tensor before taking any memory: nothing changes on an error. */
	long rows = 0;
	size_t bytes = 0;
	if (fold_plan(d, f, &rows, &err)) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "%s", err.msg);
		nxd_lora_job_clear(d);
		return;
	}
	if (fold_alloc(d, f, &bytes, &err)) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "adapter '%s': no room in the arena for the fold: %s", e->name,
			       err.msg);
		nxd_lora_job_clear(d);
		return;
	}
	atomic_store(&j->total, rows);
	if (nxd_lora_job_start(d, c, id, e, &err)) {
		fold_blocks_free(d, f);
		nxd_lora_job_clear(d);
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "%s", err.msg);
		return;
	}
	nxd_info("lora: folding '%s' (scale %g, %s) into %d matrices, %.1f MiB", e->name, (double)f->scale,
		 f->keep ? "each tensor's own type" : nx_type_name(f->type), f->n, (double)bytes / 1048576);
}

/* One matrix, FOLD_ROWS rows at a time (the progress unit), then its packed copy. */
static void fold_one(struct nxd_lora_job *j, const struct nxd_fold *f, struct nxd_fold_t *t, void *work)
{
	const struct nx_lora_t *lt = nx_lora_get(f->ent->own, t->layer, t->which);
	for (int64_t r0 = 0; r0 < t->base.n_out && !j->stop; r0 += FOLD_ROWS) {
		int64_t r1 = r0 + FOLD_ROWS < t->base.n_out ? r0 + FOLD_ROWS : t->base.n_out;
		nx_fold_rows(&t->base, lt, f->scale * lt->scale, t->folded.type, t->mem, r0, r1, work);
		atomic_fetch_add(&j->done, (long)(r1 - r0));
	}
	/* The tile kernels' layout too, as the model had it for the base. */
	const size_t gb = NX_PACK_ROWS * t->folded.row_bytes;
	for (int64_t g0 = 0; t->pmem && g0 < t->base.n_out / NX_PACK_ROWS && !j->stop; g0++)
		nx_pack_group(t->folded.type, (const uint8_t *)t->mem + (size_t)g0 * gb, t->folded.row_bytes,
			      (uint8_t *)t->pmem + (size_t)g0 * gb, t->base.n_in);
}

void nxd_lora_fold_run(struct nxd_lora_job *j)
{
	struct nxd_fold *f = &j->u.fold;
	double t0 = nxd_now();
	size_t work_size = 0;
	for (int i = 0; i < f->n; i++)
		if (nx_fold_work_size(&f->t[i].base) > work_size)
			work_size = nx_fold_work_size(&f->t[i].base);
	void *work = malloc(work_size);
	if (!work)
		nxd_lora_job_fail(j, NXP_E_INTERNAL, "out of memory for the fold's %zu bytes of work memory", work_size);
	for (int i = 0; work && i < f->n && !j->stop; i++)
		fold_one(j, f, &f->t[i], work);
	free(work);
	f->ms = (nxd_now() - t0) * 1e3;
}

/* The swap: every tensor of the fold in this one step boundary. */
void nxd_lora_fold_finish(struct nxd *d, struct nxd_lora_job *j, struct nxd_conn *c)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxd_fold *f = &j->u.fold;
	if (j->failed) {
		fold_blocks_free(d, f);
		if (c)
			nxd_send_error(d, c, j->who.id, j->code, "fold of '%s': %s", f->ent->name, j->err);
		return;
	}
	for (int i = 0; i < f->n; i++) {
		*nxd_lora_wt(&d->model.m, f->t[i].layer, f->t[i].which) = f->t[i].folded;
		*nxd_lora_wt(d->shm.model, f->t[i].layer, f->t[i].which) = f->t[i].folded;
	}
	nxd_sched_forget_prompts(d, "weights folded");
	struct nxd_lora_ent *e = f->ent;
	g->stack[g->n_stack] = *f;
	e->fold = g->n_stack++;
	f->t = NULL; /* the stack owns it now */
	const struct nxd_fold *top = &g->stack[e->fold];
	nxd_info("lora: folded '%s' into %d matrices in %.0f ms (swapped in before step %u)", e->name, top->n, top->ms,
		 d->step.gen + 1);
	if (c) {
		struct nxp_fold_info fi = nxd_lora_fold_info(top, e->fold + 1);
		size_t n = 0;
		char *line = nxp_enc_lora_folded_alloc(j->who.id, e->name, &fi, &n);
		nxd_lora_send_line(d, c, j->who.id, line, n);
	}
}

void nxd_lora_fold_clear(struct nxd_lora_job *j)
{
	free(j->u.fold.t);
}

/* ---------------------------------------------------------------- unfold */

/* Puts the fold on top of the stack back: at a step boundary only. */
static void unfold_top(struct nxd *d)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxd_fold *f = &g->stack[g->n_stack - 1];
	for (int i = 0; i < f->n; i++) {
		*nxd_lora_wt(&d->model.m, f->t[i].layer, f->t[i].which) = f->t[i].base;
		*nxd_lora_wt(d->shm.model, f->t[i].layer, f->t[i].which) = f->t[i].base;
	}
	fold_blocks_free(d, f);
	nxd_sched_forget_prompts(d, "weights unfolded");
	nxd_info("lora: unfolded '%s' (%d matrices back to their base)", f->ent->name, f->n);
	f->ent->fold = -1;
	free(f->t);
	memset(f, 0, sizeof(*f));
	g->n_stack--;
}

void nxd_lora_op_unfold(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxd_lora_ent *e = nxd_lora_find(d, o->name);
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", o->name);
		return;
	}
	if (e->fold < 0) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "adapter '%s' is not folded", e->name);
		return;
	}
	if (e->fold != g->n_stack - 1) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST,
			       "adapter '%s' was folded before '%s': folds stack, so unfold '%s' first (only the latest "
			       "fold can be undone)",
			       e->name, g->stack[g->n_stack - 1].ent->name, g->stack[g->n_stack - 1].ent->name);
		return;
	}
	if (nxd_lora_job_busy(d, c, id))
		return;
	if (g->unfold_pending) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "an unfold is already waiting for the step in flight");
		return;
	}
	g->unfold_pending = true;
	g->unfold_who = nxd_lora_asker_of(c, id);
	if (nxd_step_idle(d))
		nxd_lora_boundary(d);
}

void nxd_lora_unfold_boundary(struct nxd *d)
{
	struct nxd_lora_reg *g = d->lora;
	if (!g->unfold_pending)
		return;
	g->unfold_pending = false;
	struct nxd_conn *c = nxd_lora_asker_conn(d, &g->unfold_who);
	struct nxd_fold *f = &g->stack[g->n_stack - 1];
	size_t n = 0;
	char *line = c ? nxp_enc_lora_unfolded_alloc(g->unfold_who.id, f->ent->name, f->n, &n) : NULL;
	unfold_top(d);
	if (c)
		nxd_lora_send_line(d, c, g->unfold_who.id, line, n);
}
