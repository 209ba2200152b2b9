/* lora_job.c - the LoRA helper thread: one job at a time (load, fold or report), its kinds in one table, progress and answers.
 *
 * The work of a load, a fold or a report (seconds for a fold or a report of
 * a big adapter) runs on one helper thread of the supervisor, never in the
 * event loop: the loop must keep answering and the workers keep stepping.
 * The thread is niced, so under load serving keeps the CPUs and the job
 * takes longer. It only reads what its op prepared and writes arena blocks
 * nobody reads yet; when it ends it rings the loop's bell, and the next step
 * boundary (nxd_lora_boundary, no step in flight) joins it and runs the
 * kind's finish, which changes the registry and the model and answers. One
 * job runs at a time; a request that would start another meanwhile gets
 * `busy` with the running job's progress. */
#define _GNU_SOURCE
#include "daemon/lora_int.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PROGRESS_AFTER 0.2    /* s: jobs shorter than this send no progress events */
#define PROGRESS_EVERY 0.25   /* s between progress events */

/* A kind of job: run on the helper thread, finish at the step boundary after
 * it (c: the asker, NULL when gone), clear whatever the job holds, run or not. */
struct job_kind {
	const char *name;         /* progress "stage", lora_list's job "kind", busy messages */
	bool progress;            /* sends progress events (a load is short and has no count) */
	void (*run)(struct nxd_lora_job *j);
	void (*finish)(struct nxd *d, struct nxd_lora_job *j, struct nxd_conn *c);
	void (*clear)(struct nxd_lora_job *j);
};

static const struct job_kind kinds[NXD_JOB_COUNT] = {
	[NXD_JOB_NONE] = {""},
	[NXD_JOB_LOAD] = {"load", false, nxd_lora_load_run, nxd_lora_load_finish, NULL},
	[NXD_JOB_FOLD] = {"fold", true, nxd_lora_fold_run, nxd_lora_fold_finish, nxd_lora_fold_clear},
	[NXD_JOB_REPORT] = {"report", true, nxd_lora_report_run, nxd_lora_report_finish, nxd_lora_report_clear},
};

const char *nxd_lora_job_name(enum nxd_lora_job_kind kind)
{
	return kinds[kind].name;
}

/* ---------------------------------------------------------------- answers */

struct nxd_lora_asker nxd_lora_asker_of(struct nxd_conn *c, const char *id)
{
	struct nxd_lora_asker a = {.conn = c->idx, .gen = c->gen};
	snprintf(a.id, sizeof(a.id), "%s", id);
	return a;
}

struct nxd_conn *nxd_lora_asker_conn(struct nxd *d, const struct nxd_lora_asker *a)
{
	if (a->conn < 0 || a->conn >= d->o.max_clients)
		return NULL;
	struct nxd_conn *c = &d->conns[a->conn];
	return c->fd >= 0 && c->gen == a->gen && !c->closing ? c : NULL;
}

void nxd_lora_send_line(struct nxd *d, struct nxd_conn *c, const char *id, char *line, size_t n)
{
	if (!line) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory encoding the answer");
		return;
	}
	nxd_conn_queue(d, c, line, n);
	free(line);
}

/* ---------------------------------------------------------------- the thread */

void nxd_lora_job_fail(struct nxd_lora_job *j, enum nxp_code code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(j->err, sizeof(j->err), fmt, ap);
	va_end(ap);
	j->failed = true;
	j->code = code;
}

static void *job_main(void *arg)
{
	struct nxd_lora_job *j = arg;
	/* Serving comes first: the job takes the CPU time the workers leave. */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
	kinds[j->kind].run(j);
	atomic_store(&j->finished, 1);
	/* Wake the loop: idle, it would notice only at its next tick. */
	atomic_fetch_add(j->bell, 1);
	nx_futex_wake(j->bell, INT_MAX);
	return NULL;
}

int nxd_lora_job_start(struct nxd *d, struct nxd_conn *c, const char *id, struct nxd_lora_ent *e, struct nx_err *err)
{
	struct nxd_lora_job *j = &d->lora->job;
	j->who = nxd_lora_asker_of(c, id);
	j->ent = e;
	atomic_store(&j->finished, 0);
	j->stop = 0;
	j->bell = &d->shm.ctl->bell;
	j->t0 = j->t_progress = nxd_now();
	j->sent_done = -1;
	int rc = pthread_create(&j->th, NULL, job_main, j);
	if (rc)
		return nx_errf(err, "cannot start the helper thread: %s", strerror(rc));
	j->thread_on = true;
	e->busy = true;
	return 0;
}

void nxd_lora_job_clear(struct nxd *d)
{
	struct nxd_lora_job *j = &d->lora->job;
	if (j->thread_on)
		pthread_join(j->th, NULL);
	if (kinds[j->kind].clear)
		kinds[j->kind].clear(j);
	if (j->ent)
		j->ent->busy = false;
	memset(j, 0, sizeof(*j));
}

bool nxd_lora_job_busy(struct nxd *d, struct nxd_conn *c, const char *id)
{
	struct nxd_lora_job *j = &d->lora->job;
	if (j->kind == NXD_JOB_NONE)
		return false;
	long tot = atomic_load(&j->total), done = atomic_load(&j->done);
	nxd_send_error(d, c, id, NXP_E_BUSY, "a %s of adapter '%s' is running (%.0f%% done); try again when it ends",
		       kinds[j->kind].name, j->ent->name, tot > 0 ? 100.0 * (double)done / tot : 0.0);
	return true;
}

/* ---------------------------------------------------------------- the boundary */

static void job_progress(struct nxd *d, struct nxd_lora_job *j, double now)
{
	long done = atomic_load(&j->done), total = atomic_load(&j->total);
	if (!kinds[j->kind].progress || now - j->t0 < PROGRESS_AFTER || now - j->t_progress < PROGRESS_EVERY ||
	    done == j->sent_done)
		return;
	struct nxd_conn *c = nxd_lora_asker_conn(d, &j->who);
	j->t_progress = now;
	j->sent_done = done;
	if (c) {
		size_t n = 0;
		char *line = nxp_enc_progress_alloc(j->who.id, done, total, kinds[j->kind].name, &n);
		nxd_lora_send_line(d, c, j->who.id, line, n);
	}
}

static void job_finish(struct nxd *d, struct nxd_lora_job *j)
{
	if (j->thread_on) {
		pthread_join(j->th, NULL);
		j->thread_on = false;
	}
	kinds[j->kind].finish(d, j, nxd_lora_asker_conn(d, &j->who));
	nxd_lora_job_clear(d);
}

void nxd_lora_job_boundary(struct nxd *d)
{
	struct nxd_lora_job *j = &d->lora->job;
	if (j->kind == NXD_JOB_NONE)
		return;
	if (atomic_load(&j->finished))
		job_finish(d, j);
	else
		job_progress(d, j, nxd_now());
}
