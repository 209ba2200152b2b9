/* lora.c - the supervisor's LoRA registry: adapters in the arena, per-request runtime deltas, folds swapped in between steps, accuracy reports.
 *
 * Adapters. lora_load validates the file against the model (lora/adapter.h)
 * in the event loop, then the helper thread converts A and B into arena
 * blocks, with the struct nx_lora itself (a 39 MB adapter held the loop, and
 * every client's next token, for 66 ms): the entry is reserved but not usable
 * until the thread is done and the next step boundary registers it. Workers
 * reach an adapter through the per-slot mix table (nx_state.lora), no copy.
 * Adapters and folded tensors live in arena blocks (shm/blocks.h): freed
 * ones are reused and their pages given back, so load/unload cycles do not
 * grow the arena.
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
 * Fold. The arithmetic (lora/fold.h, f64 accumulation, requantization) runs on
 * one helper thread of the supervisor, never in the event loop: SmolLM2 at
 * rank 64 is seconds of work, and the loop must keep answering and the
 * workers keep stepping (the thread is niced, so under load serving keeps
 * the CPUs and the fold takes longer). The thread only reads the base
 * tensors and the adapter and writes fresh arena blocks nobody reads yet.
 * When it is done, the next step boundary (nxd_lora_boundary, called by the
 * scheduler with no step in flight, right before it plans and launches the
 * next one) swaps every folded tensor's nx_wt in the workers' nx_model and in
 * our own copy at once: a step sees all of the fold or none of it. The base
 * nx_wt is kept, so unfold puts it back (bit for bit: the base bytes were never
 * written) at a step boundary too, then frees the folded blocks. Folds stack:
 * a fold starts from the model as it is (earlier folds included), so only the
 * latest fold can be undone; unfolding another is refused. One job (load,
 * fold or report) runs at a time; model-changing requests during it get `busy`.
 *
 * Report. Also on the helper thread: the probe prompt runs through the model
 * in service with every matmul input captured (lora/probe.h), each adapted
 * matrix is graded (fold to the asked types, runtime delta, base
 * quantization noise) against the exact float64 result on those real
 * activations, and decode steps are timed with and without the delta. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <jansson.h>

#include "kern/pack.h"
#include "lora/adapter.h"
#include "lora/delta.h"
#include "lora/fold.h"
#include "lora/probe.h"
#include "model/repack.h"
#include "shm/blocks.h"

#define NXD_LORA_MAX 1024     /* adapters loaded at once: the table's size (--max-adapters is the limit) */
#define FOLD_ROWS 64          /* rows per nx_fold_rows call (progress granularity) */
#define PROGRESS_AFTER 0.2    /* s: jobs shorter than this send no progress events */
#define PROGRESS_EVERY 0.25   /* s between progress events */
#define PROBE_TIMING 8        /* runs of a decode step and of the delta, timed (the fastest counts) */

_Static_assert(NXP_MAX_LORA <= NX_LORA_MIX_MAX, "a request's adapters must fit one mix");

/* The default probe: ordinary prose, so the activations are the model's usual ones. */
static const char default_probe[] =
	"The old lighthouse keeper climbed the stairs every evening at dusk. In 1905, Albert Einstein "
	"published four papers that changed physics, on the photoelectric effect, Brownian motion, special "
	"relativity and the equivalence of mass and energy. Water boils at 100 degrees Celsius at sea level.";

struct nxd_fold_t {
	int layer;
	enum nx_lora_which which;
	struct nx_wt base;        /* what the model had: unfold puts it back */
	struct nx_wt folded;      /* data in the arena block below */
	void *mem;
	size_t size;
	void *pmem;               /* its packed copy (kern/pack.h) when the base has one, or NULL */
	size_t psize;
};

struct nxd_fold {
	struct nxd_lora_ent *ent;
	float scale;
	bool keep;                /* each tensor keeps its own type */
	enum nx_type type;
	int n;
	struct nxd_fold_t *t;     /* (n) heap */
	double ms;                /* the fold job's wall time */
};

struct nxd_lora_ent {
	bool used;
	char name[NXP_MAX_LORA_NAME + 1];
	char path[NXP_MAX_LORA_PATH + 1];
	float scale;              /* default user scale (lora_load) */
	struct nx_lora *l;        /* arena: what the workers read (through the mix table) */
	size_t l_size;
	struct nx_lora *own;      /* heap: our copy of *l, the only one we read (workers can write the arena) */
	void *mem;                /* arena: every A and B as held (lora/adapter.h) */
	size_t mem_size;
	int in_use;               /* requests carrying it, queued or running */
	int fold;                 /* position in the fold stack, -1 */
	bool busy;                /* a job reads it */
	bool loading;             /* the load job fills l and mem: not listed, not usable, own is NULL */
};

enum job_kind { JOB_NONE, JOB_LOAD, JOB_FOLD, JOB_REPORT };

static const char *const job_names[] = { "", "load", "fold", "report" };

/* Who asked: the connection (by index and generation: it may be gone) and the request id. */
struct asker {
	int conn;
	uint32_t gen;
	char id[NXP_ID_MAX];
};

struct job {
	enum job_kind kind;
	struct asker who;
	struct nxd_lora_ent *ent;
	pthread_t th;
	bool thread_on;
	_Atomic long done, total; /* progress units: rows (fold), matrices (report) */
	_Atomic int finished;
	volatile int stop;        /* shutdown: give up early */
	_Atomic uint32_t *bell;   /* the loop's bell (nx_ctl.bell): rung when the job ends */
	double t0, t_progress;
	long sent_done;
	/* load */
	struct nx_lora_src src;   /* validated by op_load; the thread converts and closes it */
	/* fold */
	struct nxd_fold fold;
	/* report */
	struct nx_model *run;     /* heap copy of the model in service: the probe runs on it */
	struct nx_model *base;    /* heap copy of what a fold would start from: grading is on it */
	int32_t *probe;
	int n_probe;
	struct nx_lora_report_opts ro;
	bool layers[NX_MAX_LAYERS];
	bool dry_run;
	json_t *result;           /* lora/probe.h's grades */
	struct nxp_lora_cost cost;
	int rc;
	char err[512];
};

struct nxd_lora_reg {
	struct nxd_lora_ent ent[NXD_LORA_MAX];
	struct nxd_fold stack[NXD_LORA_MAX];
	int n_stack;
	struct nx_lora_mix *mix;  /* (n_slots) arena: what nx_tok_in.lora = slot + 1 selects */
	struct nx_blocks blocks;  /* adapters' and folds' arena blocks */
	struct job job;
	/* an unfold waiting for the step in flight to end */
	bool unfold_pending;
	struct asker unfold_who;
};

/* ---------------------------------------------------------------- arena blocks */

static void *blk_alloc(struct nxd *d, size_t size, struct nx_err *err)
{
	return nx_blocks_alloc(&d->lora->blocks, size, err);
}

static void blk_free(struct nxd *d, void *p, size_t size)
{
	int rc = nx_blocks_free(&d->lora->blocks, p, size);
	if (rc == -ENOMEM)
		nxd_err("lora: out of memory for the arena's free list: %zu bytes leak", nx_blocks_round(size));
	else if (rc < 0)
		nxd_warn("lora: fallocate(PUNCH_HOLE, %zu bytes) failed: %s", nx_blocks_round(size), strerror(-rc));
}

/* ---------------------------------------------------------------- events */

static struct nxd_conn *asker_conn(struct nxd *d, const struct asker *a)
{
	if (a->conn < 0 || a->conn >= d->o.max_clients)
		return NULL;
	struct nxd_conn *c = &d->conns[a->conn];
	return c->fd >= 0 && c->gen == a->gen && !c->closing ? c : NULL;
}

static struct asker asker_of(struct nxd_conn *c, const char *id)
{
	struct asker a = {.conn = c->idx, .gen = c->gen};
	snprintf(a.id, sizeof(a.id), "%s", id);
	return a;
}

/* Queues a line an nxp_enc_*_alloc made (NULL: it ran out of memory). */
static void send_line(struct nxd *d, struct nxd_conn *c, const char *id, char *line, size_t n)
{
	if (!line) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory encoding the answer");
		return;
	}
	nxd_conn_queue(d, c, line, n);
	free(line);
}

static void send_ok(struct nxd *d, struct nxd_conn *c, const char *id)
{
	char buf[NXP_ID_MAX + 64];
	size_t n = nxp_enc_ok(buf, sizeof(buf), id);
	if (n < sizeof(buf))
		nxd_conn_queue(d, c, buf, n);
}

/* ---------------------------------------------------------------- registry */

static struct nxd_lora_ent *find(struct nxd *d, const char *name)
{
	for (int i = 0; i < NXD_LORA_MAX; i++)
		if (d->lora->ent[i].used && !strcmp(d->lora->ent[i].name, name))
			return &d->lora->ent[i];
	return NULL;
}

/* Where the model keeps (layer, which): ours or the workers' copy. */
static struct nx_wt *wt_of(struct nx_model *m, int layer, enum nx_lora_which w)
{
	return (struct nx_wt *)nx_lora_base(m, layer, w);
}

static struct nxp_fold_info fold_info(const struct nxd_fold *f, int order)
{
	size_t bytes = 0;
	for (int i = 0; i < f->n; i++)
		bytes += f->t[i].size + f->t[i].psize;
	return (struct nxp_fold_info){.type = f->keep ? "keep" : nx_type_name(f->type), .scale = (double)f->scale,
				      .order = order, .ms = f->ms, .tensors = f->n, .bytes = bytes};
}

/* What lora_loaded and lora_list say of e; *fi holds its fold, if any. */
static struct nxp_adapter_info adapter_info(struct nxd *d, const struct nxd_lora_ent *e, struct nxp_fold_info *fi)
{
	if (e->fold >= 0)
		*fi = fold_info(&d->lora->stack[e->fold], e->fold + 1);
	return (struct nxp_adapter_info){.name = e->name, .path = e->path, .rank = e->own->rank,
					 .alpha = (double)e->own->alpha, .rslora = e->own->rslora, .tensors = e->own->n,
					 .bytes = e->l_size + e->mem_size, .scale = (double)e->scale,
					 .fold = e->fold >= 0 ? fi : NULL, .in_use = e->in_use, .busy = e->busy};
}

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
 * workers' model points at them (plain rows and the packed copy, if any):
 * equal before a fold and after its unfold. */
static uint64_t weights_checksum(const struct nx_model *m)
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

static int lora_scale_ok(float s, struct nx_err *err)
{
	if (!(s >= -1e4f && s <= 1e4f))
		return nx_errf(err, "field 'scale' must be in -10000..10000, got %g", (double)s);
	return 0;
}

/* RELIABILITY 17: what is not a readable adapter file or PEFT directory gets
 * one message, whatever the reason (missing, no permission, a FIFO, a device,
 * /proc or /sys), so the answer does not tell which files exist. */
static bool job_running(struct nxd *d, struct nxd_conn *c, const char *id);
static int job_start(struct nxd *d, struct nx_err *err);

static void op_load(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_reg *g = d->lora;
	struct nx_err err = {{0}};
	if (find(d, o->name)) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "an adapter named '%s' is already loaded", o->name);
		return;
	}
	float scale = o->has_scale ? o->scale : 1.0f;
	if (lora_scale_ok(scale, &err)) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "%s", err.msg);
		return;
	}
	struct nxd_lora_ent *e = NULL;
	for (int i = 0; i < NXD_LORA_MAX && !e; i++)
		if (!g->ent[i].used)
			e = &g->ent[i];
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "%d adapters are loaded, the most nxd holds; unload one first",
			       NXD_LORA_MAX);
		return;
	}
	if (job_running(d, c, id))
		return;
	/* Opened as the client could open it, then parsed from what was opened
	 * (access.c): every error after this is about a file it may read. */
	struct nx_lora_files files;
	if (nxd_access_open_adapter(c, o->path, &files, &err) < 0) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "%s", err.msg);
		return;
	}
	struct nx_lora_src src;
	/* Validated against our own copy of the model: shapes are the base's
	 * whatever is folded (folds keep shapes). */
	int rc = nx_lora_open_files(&src, &files, &d->model.m, &err);
	nxd_access_close_adapter(&files);
	if (rc) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "adapter '%s': %s", o->name, err.msg);
		return;
	}
	size_t mem_size = nx_lora_size(&src);
	int n_loaded = 0;
	size_t bytes_loaded = 0;
	for (int i = 0; i < NXD_LORA_MAX; i++)
		if (g->ent[i].used) {
			n_loaded++;
			bytes_loaded += g->ent[i].mem_size + g->ent[i].l_size;
		}
	if (nxd_limits_check_adapter(n_loaded, bytes_loaded, mem_size + sizeof(struct nx_lora), &err) < 0) {
		nx_lora_close(&src);
		nxd_send_error(d, c, id, NXP_E_BUSY, "%s", err.msg);
		return;
	}
	memset(e, 0, sizeof(*e));
	e->fold = -1;
	e->l_size = sizeof(struct nx_lora);
	if (mem_size == 0 || !(e->l = blk_alloc(d, e->l_size, &err)) || !(e->mem = blk_alloc(d, mem_size, &err))) {
		if (!err.msg[0])
			nx_errf(&err, "its size overflows");
		nx_lora_close(&src);
		blk_free(d, e->l, e->l_size);
		/* A size that overflows is the file's fault; else the arena is full for now. */
		nxd_send_error(d, c, id, mem_size ? NXP_E_BUSY : NXP_E_BAD_REQUEST,
			       "adapter '%s': no room in the arena: %s", o->name, err.msg);
		memset(e, 0, sizeof(*e));
		return;
	}
	e->mem_size = mem_size;
	/* Reserved under its name (a second load of it is refused), converted on
	 * the helper thread, registered by load_done. */
	e->used = e->loading = true;
	e->scale = scale;
	snprintf(e->name, sizeof(e->name), "%s", o->name);
	snprintf(e->path, sizeof(e->path), "%s", o->path);
	struct job *j = &g->job;
	j->kind = JOB_LOAD;
	j->ent = e;
	j->who = asker_of(c, id);
	j->src = src;
	if (job_start(d, &err)) {
		nx_lora_close(&j->src);
		blk_free(d, e->l, e->l_size);
		blk_free(d, e->mem, e->mem_size);
		memset(e, 0, sizeof(*e));
		memset(j, 0, sizeof(*j));
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "adapter '%s': %s", o->name, err.msg);
	}
}

/* The load job ended: the adapter is usable from now on, or its blocks go back. */
static void load_done(struct nxd *d, struct job *j)
{
	struct nxd_lora_ent *e = j->ent;
	struct nxd_conn *c = asker_conn(d, &j->who);
	if (!j->rc && !(e->own = malloc(sizeof(*e->own)))) {
		snprintf(j->err, sizeof(j->err), "out of memory");
		j->rc = -2;
	}
	if (j->rc) {
		if (c)
			nxd_send_error(d, c, j->who.id, j->rc == -2 ? NXP_E_INTERNAL : NXP_E_BAD_REQUEST, "adapter '%s': %s",
				       e->name, j->err);
		blk_free(d, e->l, e->l_size);
		blk_free(d, e->mem, e->mem_size);
		memset(e, 0, sizeof(*e));
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
		send_line(d, c, j->who.id, line, n);
	}
}

static void op_list(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxp_adapter_info *ai = malloc(NXD_LORA_MAX * sizeof(*ai));
	struct nxp_fold_info *fi = malloc(NXD_LORA_MAX * sizeof(*fi));
	const char **folds = malloc(NXD_LORA_MAX * sizeof(*folds));
	if (!ai || !fi || !folds) {
		free(ai);
		free(fi);
		free(folds);
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory encoding the answer");
		return;
	}
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
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)weights_checksum(d->shm.model));
		l.checksum = hex;
	}
	struct nxp_lora_job_info job;
	if (g->job.kind != JOB_NONE) {
		job = (struct nxp_lora_job_info){.kind = job_names[g->job.kind], .adapter = g->job.ent->name,
						 .done = atomic_load(&g->job.done), .total = atomic_load(&g->job.total)};
		l.job = &job;
	}
	size_t n = 0;
	char *line = nxp_enc_lora_list_alloc(id, &l, &n);
	send_line(d, c, id, line, n);
	free(ai);
	free(fi);
	free(folds);
}

static void op_unload(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_ent *e = find(d, o->name);
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
	blk_free(d, e->mem, e->mem_size);
	blk_free(d, e->l, e->l_size);
	free(e->own);
	memset(e, 0, sizeof(*e));
	send_ok(d, c, id);
}

/* ---------------------------------------------------------------- jobs */

static double now_s(void)
{
	return nxd_now();
}

static void *job_main(void *arg)
{
	struct job *j = arg;
	/* Serving comes first: the fold takes the CPU time the workers leave. */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
	struct nx_err err = {{0}};
	double t0 = now_s();
	if (j->kind == JOB_LOAD) {
		struct nxd_lora_ent *e = j->ent;
		if (nx_lora_init(e->l, e->mem, e->mem_size, &j->src, &err)) {
			snprintf(j->err, sizeof(j->err), "%s", err.msg);
			j->rc = -1;
		}
		nx_lora_close(&j->src);
	} else if (j->kind == JOB_FOLD) {
		struct nxd_fold *f = &j->fold;
		const struct nx_lora *l = j->ent->own;
		size_t work_size = 0;
		for (int i = 0; i < f->n; i++)
			if (nx_fold_work_size(&f->t[i].base) > work_size)
				work_size = nx_fold_work_size(&f->t[i].base);
		void *work = malloc(work_size);
		if (!work) {
			snprintf(j->err, sizeof(j->err), "out of memory for the fold's %zu bytes of work memory", work_size);
			j->rc = -1;
		}
		for (int i = 0; work && i < f->n && !j->stop; i++) {
			struct nxd_fold_t *t = &f->t[i];
			const struct nx_lora_t *lt = nx_lora_get(l, t->layer, t->which);
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
		free(work);
		f->ms = (now_s() - t0) * 1e3;
	} else {
		struct nx_lora_probe_run pr;
		const struct nx_lora *l = j->ent->own;
		if (nx_lora_probe_run(j->run, l, j->ro.user_scale, j->probe, j->n_probe, PROBE_TIMING, &pr, &err)) {
			snprintf(j->err, sizeof(j->err), "%s", err.msg);
			j->rc = -1;
		} else {
			j->ro.cap = pr.cap;
			j->ro.n_probe = pr.n;
			double tg = now_s();
			j->result = nx_lora_report_json(j->base, l, &j->ro, &err);
			if (!j->result) {
				snprintf(j->err, sizeof(j->err), "%s", err.msg);
				j->rc = -1;
			} else {
				int64_t flops = 0;
				for (int il = 0; il < NX_MAX_LAYERS; il++)
					for (int w = 0; w < NX_LORA_N_WHICH; w++)
						if (nx_lora_get(l, il, (enum nx_lora_which)w))
							flops += nx_lora_delta_flops(nx_lora_get(l, il, (enum nx_lora_which)w));
				j->cost = (struct nxp_lora_cost){.base_ms_per_token = pr.base_ms_per_tok,
								 .delta_ms_per_token = pr.delta_ms_per_tok,
								 .delta_flops_per_token = flops, .threads = 1,
								 .grade_ms = (now_s() - tg) * 1e3};
			}
			free(pr.cap);
			j->ro.cap = NULL;
		}
	}
	atomic_store(&j->finished, 1);
	/* Wake the loop: idle, it would notice only at its next tick. */
	atomic_fetch_add(j->bell, 1);
	nx_futex_wake(j->bell, INT_MAX);
	return NULL;
}

static void report_progress(void *ctx, int done, int total)
{
	struct job *j = ctx;
	atomic_store(&j->total, total);
	atomic_store(&j->done, done);
}

static int job_start(struct nxd *d, struct nx_err *err)
{
	struct job *j = &d->lora->job;
	atomic_store(&j->finished, 0);
	j->stop = 0;
	j->bell = &d->shm.ctl->bell;
	j->t0 = j->t_progress = nxd_now();
	j->sent_done = -1;
	int rc = pthread_create(&j->th, NULL, job_main, j);
	if (rc)
		return nx_errf(err, "cannot start the helper thread: %s", strerror(rc));
	j->thread_on = true;
	j->ent->busy = true;
	return 0;
}

static void job_clear(struct job *j)
{
	if (j->thread_on)
		pthread_join(j->th, NULL);
	if (j->ent)
		j->ent->busy = false;
	free(j->fold.t);
	free(j->run);
	free(j->base);
	free(j->probe);
	json_decref(j->result);
	memset(j, 0, sizeof(*j));
}

static bool job_running(struct nxd *d, struct nxd_conn *c, const char *id)
{
	struct job *j = &d->lora->job;
	if (j->kind == JOB_NONE)
		return false;
	long tot = atomic_load(&j->total), done = atomic_load(&j->done);
	nxd_send_error(d, c, id, NXP_E_BUSY, "a %s of adapter '%s' is running (%.0f%% done); try again when it ends",
		       job_names[j->kind], j->ent->name, tot > 0 ? 100.0 * (double)done / tot : 0.0);
	return true;
}

/* "keep" (or "") -> *keep; else a fold type by name. */
static int parse_type(const char *s, bool *keep, enum nx_type *t, struct nx_err *err)
{
	*keep = !s[0] || !strcmp(s, "keep");
	if (*keep)
		return 0;
	return nx_fold_type_parse(s, t, err);
}

static void op_fold(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o);
static void op_report(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o,
		      bool dry_run);

static void op_fold(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_reg *g = d->lora;
	struct nx_err err = {{0}};
	struct nxd_lora_ent *e = find(d, o->name);
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", o->name);
		return;
	}
	if (o->dry_run) {
		op_report(d, c, id, o, true);
		return;
	}
	if (job_running(d, c, id))
		return;
	if (e->fold >= 0) {
		nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "adapter '%s' is already folded into the model", e->name);
		return;
	}
	if (e->in_use > 0) {
		nxd_send_error(d, c, id, NXP_E_BUSY,
			       "adapter '%s' is in use as a runtime delta by %d request%s: folding it would apply it twice "
			       "to them; fold it when they end",
			       e->name, e->in_use, e->in_use == 1 ? "" : "s");
		return;
	}
	if (g->n_stack >= NXD_LORA_MAX) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "%d folds are stacked already", g->n_stack);
		return;
	}
	struct job *j = &g->job;
	memset(j, 0, sizeof(*j));
	struct nxd_fold *f = &j->fold;
	f->ent = e;
	f->scale = o->has_scale ? o->scale : e->scale;
	if (lora_scale_ok(f->scale, &err) || parse_type(o->type, &f->keep, &f->type, &err)) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "%s", err.msg);
		return;
	}
	f->t = calloc((size_t)e->own->n, sizeof(*f->t));
	if (!f->t) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory");
		return;
	}
	/* Check every tensor before taking any memory: nothing changes on an error. */
	long rows = 0;
	size_t bytes = 0;
	for (int il = 0; il < d->model.m.hp.n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct nx_lora_t *lt = nx_lora_get(e->own, il, (enum nx_lora_which)w);
			if (!lt)
				continue;
			struct nxd_fold_t *t = &f->t[f->n++];
			t->layer = il;
			t->which = (enum nx_lora_which)w;
			/* From the workers' copy (read-only to them): what they run now,
			 * packed copies included. */
			t->base = *wt_of(d->shm.model, il, t->which);
			enum nx_type ty = f->keep ? t->base.type : f->type;
			if (nx_fold_check(&t->base, lt, ty, &err)) {
				nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "adapter '%s': blk.%d.%s.weight: %s", e->name, il,
					       nx_lora_which_gguf(t->which), err.msg);
				free(f->t);
				memset(j, 0, sizeof(*j));
				return;
			}
			t->size = (size_t)nx_fold_size(&t->base, ty);
			t->folded = (struct nx_wt){.type = ty, .n_in = t->base.n_in, .n_out = t->base.n_out,
						   .row_bytes = (size_t)nx_row_size(ty, t->base.n_in)};
			/* The engine runs this model's matrices packed: the folded one too, if it can. */
			t->psize = t->base.packed && nx_wt_packable(&t->folded) ? t->size : 0;
			rows += (long)t->base.n_out;
			bytes += nx_blocks_round(t->size);
		}
	for (int i = 0; i < f->n; i++) {
		if (!(f->t[i].mem = blk_alloc(d, f->t[i].size, &err)) ||
		    (f->t[i].psize && !(f->t[i].pmem = blk_alloc(d, f->t[i].psize, &err)))) {
			for (int k = 0; k <= i; k++) {
				blk_free(d, f->t[k].mem, f->t[k].size);
				blk_free(d, f->t[k].pmem, f->t[k].psize);
			}
			nxd_send_error(d, c, id, NXP_E_BUSY, "adapter '%s': no room in the arena for the fold: %s",
				       e->name, err.msg);
			free(f->t);
			memset(j, 0, sizeof(*j));
			return;
		}
		f->t[i].folded.data = f->t[i].mem;
		f->t[i].folded.packed = f->t[i].pmem;
		bytes += nx_blocks_round(f->t[i].psize);
	}
	j->kind = JOB_FOLD;
	j->who = asker_of(c, id);
	j->ent = e;
	atomic_store(&j->total, rows);
	if (job_start(d, &err)) {
		for (int i = 0; i < f->n; i++) {
			blk_free(d, f->t[i].mem, f->t[i].size);
			blk_free(d, f->t[i].pmem, f->t[i].psize);
		}
		free(f->t);
		memset(j, 0, sizeof(*j));
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "%s", err.msg);
		return;
	}
	nxd_info("lora: folding '%s' (scale %g, %s) into %d matrices, %.1f MiB", e->name, (double)f->scale,
		 f->keep ? "each tensor's own type" : nx_type_name(f->type), f->n, (double)bytes / 1048576);
}

static void op_report(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o, bool dry_run)
{
	struct nxd_lora_reg *g = d->lora;
	struct nx_err err = {{0}};
	struct nxd_lora_ent *e = find(d, o->name);
	if (!e) {
		nxd_send_error(d, c, id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", o->name);
		return;
	}
	if (job_running(d, c, id))
		return;
	struct job *j = &g->job;
	memset(j, 0, sizeof(*j));
	j->dry_run = dry_run;
	j->ro.user_scale = o->has_scale ? o->scale : e->scale;
	if (lora_scale_ok(j->ro.user_scale, &err)) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "%s", err.msg);
		return;
	}
	/* Fold types: the dry run's one, else the report's list (default keep, f16). */
	const char(*names)[NXP_MAX_TYPE_NAME] = o->types;
	int n_names = o->n_types;
	static const char defaults[2][NXP_MAX_TYPE_NAME] = {"keep", "f16"};
	if (dry_run) {
		names = (const char(*)[NXP_MAX_TYPE_NAME])o->type;
		n_names = 1;
	} else if (n_names == 0) {
		names = defaults;
		n_names = 2;
	}
	j->ro.n_types = n_names;
	for (int i = 0; i < n_names; i++) {
		bool keep;
		enum nx_type t = NX_F32;
		if (parse_type(names[i], &keep, &t, &err)) {
			nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "%s", err.msg);
			return;
		}
		j->ro.types[i] = keep ? -1 : (int)t;
	}
	const int n_layer = d->model.m.hp.n_layer;
	for (int i = 0; i < o->n_layers; i++) {
		if (o->layers[i] >= n_layer) {
			nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "field 'layers[%d]' must be in 0..%d, got %d", i,
				       n_layer - 1, o->layers[i]);
			return;
		}
		j->layers[o->layers[i]] = true;
	}
	if (o->n_layers)
		j->ro.layers = j->layers;
	long total = 0;
	for (int il = 0; il < n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++)
			total += (!o->n_layers || j->layers[il]) && nx_lora_get(e->own, il, (enum nx_lora_which)w);
	atomic_store(&j->total, total);
	/* The probe prompt's tokens (the tokenizer stays on this thread). */
	const char *text = o->prompt ? o->prompt : default_probe;
	size_t cap = strlen(text) + 2, n = 0;
	j->probe = malloc(cap * sizeof(int32_t));
	j->run = malloc(sizeof(struct nx_model));
	j->base = malloc(sizeof(struct nx_model));
	if (!j->probe || !j->run || !j->base) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory");
		job_clear(j);
		return;
	}
	size_t off = 0;
	if (nx_tok_add_bos(d->model.tok) && nx_tok_bos(d->model.tok) >= 0)
		j->probe[off++] = nx_tok_bos(d->model.tok);
	if (nx_tok_encode(d->model.tok, text, strlen(text), false, j->probe + off, cap - off, &n, &err) < 0) {
		/* Too small a guess (n says how many): once more with room for all. */
		int32_t *p = n > cap - off ? realloc(j->probe, (n + off) * sizeof(int32_t)) : NULL;
		if (p) {
			j->probe = p;
			cap = n + off;
		}
		if (!p || nx_tok_encode(d->model.tok, text, strlen(text), false, j->probe + off, cap - off, &n, &err) < 0) {
			nxd_send_error(d, c, id, NXP_E_BAD_REQUEST, "field 'prompt': %s", err.msg);
			job_clear(j);
			return;
		}
	}
	j->n_probe = (int)(n + off);
	if (j->n_probe < 1 || j->n_probe > NX_LORA_PROBE_MAX) {
		nxd_send_error(d, c, id, NXP_E_OUT_OF_RANGE, "field 'prompt' must be 1..%d tokens, got %d",
			       NX_LORA_PROBE_MAX, j->n_probe);
		job_clear(j);
		return;
	}
	/* The probe runs on the model in service; grading is on the weights a
	 * fold of this adapter starts from (for a folded adapter: its base). */
	memcpy(j->run, d->shm.model, sizeof(struct nx_model));
	memcpy(j->base, d->shm.model, sizeof(struct nx_model));
	if (e->fold >= 0) {
		const struct nxd_fold *f = &g->stack[e->fold];
		for (int i = 0; i < f->n; i++)
			*wt_of(j->base, f->t[i].layer, f->t[i].which) = f->t[i].base;
	}
	j->ro.progress = report_progress;
	j->ro.ctx = j;
	j->ro.stop = &j->stop;
	j->kind = JOB_REPORT;
	j->who = asker_of(c, id);
	j->ent = e;
	if (job_start(d, &err)) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "%s", err.msg);
		job_clear(j);
	}
}

/* Puts the fold on top of the stack back: at a step boundary only. */
static void unfold_top(struct nxd *d)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxd_fold *f = &g->stack[g->n_stack - 1];
	for (int i = 0; i < f->n; i++) {
		*wt_of(&d->model.m, f->t[i].layer, f->t[i].which) = f->t[i].base;
		*wt_of(d->shm.model, f->t[i].layer, f->t[i].which) = f->t[i].base;
	}
	for (int i = 0; i < f->n; i++) {
		blk_free(d, f->t[i].mem, f->t[i].size);
		blk_free(d, f->t[i].pmem, f->t[i].psize);
	}
	nxd_sched_forget_prompts(d, "weights unfolded");
	nxd_info("lora: unfolded '%s' (%d matrices back to their base)", f->ent->name, f->n);
	f->ent->fold = -1;
	free(f->t);
	memset(f, 0, sizeof(*f));
	g->n_stack--;
}

static void op_unfold(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxd_lora_ent *e = find(d, o->name);
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
	if (job_running(d, c, id))
		return;
	if (g->unfold_pending) {
		nxd_send_error(d, c, id, NXP_E_BUSY, "an unfold is already waiting for the step in flight");
		return;
	}
	g->unfold_pending = true;
	g->unfold_who = asker_of(c, id);
	if (nxd_step_idle(d))
		nxd_lora_boundary(d);
}

/* ---------------------------------------------------------------- boundary */

static void job_progress(struct nxd *d, struct job *j, double now)
{
	long done = atomic_load(&j->done), total = atomic_load(&j->total);
	if (j->kind == JOB_LOAD || /* short, and no count to report */
	    now - j->t0 < PROGRESS_AFTER || now - j->t_progress < PROGRESS_EVERY || done == j->sent_done)
		return;
	struct nxd_conn *c = asker_conn(d, &j->who);
	j->t_progress = now;
	j->sent_done = done;
	if (c) {
		size_t n = 0;
		char *line = nxp_enc_progress_alloc(j->who.id, done, total, job_names[j->kind], &n);
		send_line(d, c, j->who.id, line, n);
	}
}

static void job_finish(struct nxd *d, struct job *j)
{
	struct nxd_lora_reg *g = d->lora;
	struct nxd_conn *c = asker_conn(d, &j->who);
	if (j->thread_on) {
		pthread_join(j->th, NULL);
		j->thread_on = false;
	}
	if (j->kind == JOB_LOAD) {
		load_done(d, j);
	} else if (j->kind == JOB_FOLD) {
		struct nxd_fold *f = &j->fold;
		if (j->rc) {
			for (int i = 0; i < f->n; i++) {
				blk_free(d, f->t[i].mem, f->t[i].size);
				blk_free(d, f->t[i].pmem, f->t[i].psize);
			}
			if (c)
				nxd_send_error(d, c, j->who.id, NXP_E_INTERNAL, "fold of '%s': %s", f->ent->name, j->err);
		} else {
			/* The swap: every tensor of the fold in this one step boundary. */
			for (int i = 0; i < f->n; i++) {
				*wt_of(&d->model.m, f->t[i].layer, f->t[i].which) = f->t[i].folded;
				*wt_of(d->shm.model, f->t[i].layer, f->t[i].which) = f->t[i].folded;
			}
			nxd_sched_forget_prompts(d, "weights folded");
			g->stack[g->n_stack] = *f;
			f->ent->fold = g->n_stack++;
			f->t = NULL; /* the stack owns it now */
			nxd_info("lora: folded '%s' into %d matrices in %.0f ms (swapped in before step %u)", f->ent->name,
				 g->stack[f->ent->fold].n, g->stack[f->ent->fold].ms, d->step.gen + 1);
			if (c) {
				struct nxp_fold_info fi = fold_info(&g->stack[f->ent->fold], f->ent->fold + 1);
				size_t n = 0;
				char *line = nxp_enc_lora_folded_alloc(j->who.id, f->ent->name, &fi, &n);
				send_line(d, c, j->who.id, line, n);
			}
		}
	} else if (c) {
		if (j->rc) {
			nxd_send_error(d, c, j->who.id, NXP_E_INTERNAL, "report of '%s': %s", j->ent->name, j->err);
		} else {
			struct nxp_fold_info fi;
			if (j->ent->fold >= 0)
				fi = fold_info(&g->stack[j->ent->fold], j->ent->fold + 1);
			struct nxp_lora_report r = {.name = j->ent->name, .dry_run = j->dry_run, .report = j->result,
						    .cost = &j->cost, .fold = j->ent->fold >= 0 ? &fi : NULL};
			size_t n = 0;
			char *line = nxp_enc_lora_report_alloc(j->who.id, &r, &n);
			send_line(d, c, j->who.id, line, n);
		}
	}
	job_clear(j);
}

void nxd_lora_boundary(struct nxd *d)
{
	struct nxd_lora_reg *g = d->lora;
	if (!g || !nxd_step_idle(d))
		return;
	struct job *j = &g->job;
	if (j->kind != JOB_NONE) {
		if (atomic_load(&j->finished))
			job_finish(d, j);
		else
			job_progress(d, j, nxd_now());
	}
	if (g->unfold_pending) {
		g->unfold_pending = false;
		struct nxd_conn *c = asker_conn(d, &g->unfold_who);
		struct nxd_fold *f = &g->stack[g->n_stack - 1];
		size_t n = 0;
		char *line = c ? nxp_enc_lora_unfolded_alloc(g->unfold_who.id, f->ent->name, f->n, &n) : NULL;
		unfold_top(d);
		if (c)
			send_line(d, c, g->unfold_who.id, line, n);
	}
}

/* ---------------------------------------------------------------- requests */

int nxd_lora_resolve(struct nxd *d, struct nxd_conn *c, const struct nxp_generate *gen, struct nxd_req *r)
{
	for (int i = 0; i < gen->n_lora; i++) {
		const struct nxp_lora_ref *ref = &gen->lora[i];
		struct nxd_lora_ent *e = find(d, ref->name);
		struct nx_err err = {{0}};
		if (!e) {
			nxd_send_error(d, c, r->id, NXP_E_NOT_FOUND, "adapter '%s' is not loaded", ref->name);
			return -1;
		}
		if (e->loading) {
			nxd_send_error(d, c, r->id, NXP_E_BUSY, "adapter '%s' is still loading; try again once lora_load answers",
				       ref->name);
			return -1;
		}
		if (e->fold >= 0 || (e->busy && d->lora->job.kind == JOB_FOLD)) {
			nxd_send_error(d, c, r->id, NXP_E_BAD_REQUEST,
				       "adapter '%s' is %s the model: as a runtime delta too it would count twice", e->name,
				       e->fold >= 0 ? "folded into" : "being folded into");
			return -1;
		}
		float s = ref->has_scale ? ref->scale : e->scale;
		if (lora_scale_ok(s, &err)) {
			nxd_send_error(d, c, r->id, NXP_E_OUT_OF_RANGE, "lora[%d]: %s", i, err.msg);
			return -1;
		}
		r->lora_mix.l[i] = e->l;
		r->lora_mix.scale[i] = s;
	}
	for (int i = 0; i < gen->n_lora; i++) {
		r->lora_ent[i] = find(d, gen->lora[i].name);
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

void nxd_lora_op(struct nxd *d, struct nxd_conn *c, struct nxp_request *q)
{
	const struct nxp_lora_op *o = &q->u.lora;
	switch (q->op) {
	case NXP_OP_LORA_LOAD:
		op_load(d, c, q->id, o);
		break;
	case NXP_OP_LORA_LIST:
		op_list(d, c, q->id, o);
		break;
	case NXP_OP_LORA_UNLOAD:
		op_unload(d, c, q->id, o);
		break;
	case NXP_OP_LORA_FOLD:
		op_fold(d, c, q->id, o);
		break;
	case NXP_OP_LORA_UNFOLD:
		op_unfold(d, c, q->id, o);
		break;
	case NXP_OP_LORA_REPORT:
		op_report(d, c, q->id, o, false);
		break;
	default:
		nxd_send_error(d, c, q->id, NXP_E_INTERNAL, "not an adapter operation");
		break;
	}
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
	job_clear(&g->job);
	for (int i = 0; i < g->n_stack; i++)
		free(g->stack[i].t);
	for (int i = 0; i < NXD_LORA_MAX; i++)
		free(g->ent[i].own);
	nx_blocks_release(&g->blocks);
	free(g);
	d->lora = NULL;
}
