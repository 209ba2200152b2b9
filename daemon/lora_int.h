/* lora_int.h - what the supervisor's LoRA files share: adapter entries, the fold stack, the helper thread's job.
 *
 *   lora.c         the registry: load, list, unload; runtime deltas; the op table; the step boundary
 *   lora_job.c     the helper thread: one job at a time, its kinds in one table, progress, who asked
 *   lora_fold.c    fold and unfold: the fold job, the swaps at step boundaries, the weights' checksum
 *   lora_report.c  the accuracy report (and a fold's dry run): the probe, the grading job
 *
 * Everything here runs on the event loop's thread but a job's run function
 * (struct nxd_lora_job below says what that one may touch). */
#ifndef NXD_LORA_INT_H
#define NXD_LORA_INT_H

#include <stdatomic.h>

#include <jansson.h>

#include "daemon/nxd.h"
#include "lora/adapter.h"
#include "lora/probe.h"
#include "shm/blocks.h"

#define NXD_LORA_MAX 1024     /* adapters loaded at once: the table's size (--max-adapters is the limit) */

/* ---------------------------------------------------------------- adapters and folds */

/* One matrix of a fold. */
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

/* ---------------------------------------------------------------- the job */

enum nxd_lora_job_kind { NXD_JOB_NONE, NXD_JOB_LOAD, NXD_JOB_FOLD, NXD_JOB_REPORT, NXD_JOB_COUNT };

/* Who asked: the connection (by index and generation: it may be gone) and the request id. */
struct nxd_lora_asker {
	int conn;
	uint32_t gen;
	char id[NXP_ID_MAX];
};

/* The report's inputs (made by its op) and result (made by its run). */
struct nxd_lora_report_job {
	struct nx_model *run;     /* heap copy of the model in service: the probe runs on it */
	struct nx_model *base;    /* heap copy of what a fold would start from: grading is on it */
	int32_t *probe;           /* (n_probe) the probe prompt's tokens */
	int n_probe;
	struct nx_lora_report_opts ro;
	bool layers[NX_MAX_LAYERS];
	bool dry_run;
	json_t *result;           /* lora/probe.h's grades */
	struct nxp_lora_cost cost;
};

/* The one job of the helper thread. An op takes it (kind != NXD_JOB_NONE)
 * from when it starts filling it until nxd_lora_job_clear. The run (on the
 * thread) reads what the op set up, writes its part of the union, the arena
 * blocks its op reserved, the progress counters and failed/code/err, and
 * nothing else of the registry: the rest is the loop's until the finish. */
struct nxd_lora_job {
	enum nxd_lora_job_kind kind;
	struct nxd_lora_asker who;
	struct nxd_lora_ent *ent;
	pthread_t th;
	bool thread_on;
	_Atomic long done, total; /* progress units: rows (fold), matrices (report) */
	_Atomic int finished;
	volatile int stop;        /* shutdown: give up early */
	_Atomic uint32_t *bell;   /* the loop's bell (nx_ctl.bell): rung when the job ends */
	double t0, t_progress;
	long sent_done;
	/* how the run ended: failed, with the answer's code and message */
	bool failed;
	enum nxp_code code;
	char err[512];
	union {
		struct nx_lora_src src;   /* load: validated by its op; the run converts and closes it */
		struct nxd_fold fold;
		struct nxd_lora_report_job report;
	} u;
};

/* ---------------------------------------------------------------- the registry */

struct nxd_lora_reg {
	struct nxd_lora_ent ent[NXD_LORA_MAX];
	struct nxd_fold stack[NXD_LORA_MAX];
	int n_stack;
	struct nx_lora_mix *mix;  /* (n_slots) arena: what nx_tok_in.lora = slot + 1 selects */
	struct nx_blocks blocks;  /* adapters' and folds' arena blocks */
	struct nxd_lora_job job;
	/* an unfold waiting for the step in flight to end */
	bool unfold_pending;
	struct nxd_lora_asker unfold_who;
};

/* lora.c */
struct nxd_lora_ent *nxd_lora_find(struct nxd *d, const char *name);
/* The nx_wt where model m (ours or the workers' copy) keeps (layer, w). */
struct nx_wt *nxd_lora_wt(struct nx_model *m, int layer, enum nx_lora_which w);
int nxd_lora_scale_ok(float s, struct nx_err *err);
void *nxd_lora_blk_alloc(struct nxd *d, size_t size, struct nx_err *err);
void nxd_lora_blk_free(struct nxd *d, void *p, size_t size);
/* The load job. */
void nxd_lora_load_run(struct nxd_lora_job *j);
void nxd_lora_load_finish(struct nxd *d, struct nxd_lora_job *j, struct nxd_conn *c);

/* lora_job.c */
struct nxd_lora_asker nxd_lora_asker_of(struct nxd_conn *c, const char *id);
/* The asker's connection, or NULL when it is gone (closed, or its slot reused). */
struct nxd_conn *nxd_lora_asker_conn(struct nxd *d, const struct nxd_lora_asker *a);
/* Queues a line an nxp_enc_*_alloc made (NULL: it ran out of memory, said with an error). */
void nxd_lora_send_line(struct nxd *d, struct nxd_conn *c, const char *id, char *line, size_t n);
const char *nxd_lora_job_name(enum nxd_lora_job_kind kind);
/* True, with a busy error sent, when a job holds the helper thread. */
bool nxd_lora_job_busy(struct nxd *d, struct nxd_conn *c, const char *id);
/* Starts the thread on the job the op filled in (d->lora->job, its kind set), for
 * the request id of c about e. On failure (err set) the op undoes what it did. */
int nxd_lora_job_start(struct nxd *d, struct nxd_conn *c, const char *id, struct nxd_lora_ent *e, struct nx_err *err);
/* Ends the job: joins the thread, frees what the job holds, frees the slot. */
void nxd_lora_job_clear(struct nxd *d);
/* From the thread: the run failed; its answer will be code with this message. */
void nxd_lora_job_fail(struct nxd_lora_job *j, enum nxp_code code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* At a step boundary: a job that ended is finished, a running one reports progress. */
void nxd_lora_job_boundary(struct nxd *d);

/* lora_fold.c */
void nxd_lora_op_fold(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o);
void nxd_lora_op_unfold(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o);
/* At a step boundary: the unfold waiting, if any. */
void nxd_lora_unfold_boundary(struct nxd *d);
/* "keep" (or "") -> *keep; else a fold type by name. */
int nxd_lora_parse_type(const char *s, bool *keep, enum nx_type *t, struct nx_err *err);
/* What the events say of a fold at place order (1 = the first) of the stack. */
struct nxp_fold_info nxd_lora_fold_info(const struct nxd_fold *f, int order);
/* A checksum of the weights the workers read: equal before a fold and after its unfold. */
uint64_t nxd_lora_checksum(const struct nx_model *m);
void nxd_lora_fold_run(struct nxd_lora_job *j);
void nxd_lora_fold_finish(struct nxd *d, struct nxd_lora_job *j, struct nxd_conn *c);
void nxd_lora_fold_clear(struct nxd_lora_job *j);

/* lora_report.c */
void nxd_lora_op_report(struct nxd *d, struct nxd_conn *c, const char *id, const struct nxp_lora_op *o,
			bool dry_run);
void nxd_lora_report_run(struct nxd_lora_job *j);
void nxd_lora_report_finish(struct nxd *d, struct nxd_lora_job *j, struct nxd_conn *c);
void nxd_lora_report_clear(struct nxd_lora_job *j);

#endif
