/* step.c - a forward step's lifecycle (step.h): launch, poll, a worker's death, the watchdog, the abort and its retry.
 *
 * A worker that wedges without writing anything is caught by the watchdog:
 * a step longer than WATCHDOG_FACTOR x its measured cost (never below
 * WATCHDOG_FLOOR, never above --step-timeout) is aborted. A worker that
 * writes where it must not is caught by guard.c's checks on every look:
 * every worker is killed, the block is rewritten from our copies once they
 * are all gone, and fresh workers run the interrupted step again
 * (docs/reliability.md 21). */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <stdio.h>
#include <stdlib.h>

#define ABORT_GRACE 5.0       /* s: survivors that do not leave an aborted step by then are killed */
#define MAX_STEP_TRIES 3      /* aborts of one step before its sequences are failed (< max start failures) */
#define WATCHDOG_FACTOR 20.0  /* x the slowest recent per-token step time */
#define WATCHDOG_FLOOR 5.0    /* s: no step is aborted sooner (a loaded 2-CPU machine stalls for seconds) */
#define WATCHDOG_WARMUP 8     /* steps measured before the estimate replaces --step-timeout */
#define WATCHDOG_DECAY 0.995  /* per step: the max forgets a slow spell over ~hundreds of steps */

int nxd_step_init(struct nxd *d, struct nx_err *err)
{
	d->step.live = calloc((size_t)d->n_workers, 1);
	if (!d->step.live)
		return nx_errf(err, "step: out of memory for %d workers", d->n_workers);
	return 0;
}

void nxd_step_free(struct nxd *d)
{
	free(d->step.live);
	d->step.live = NULL;
}

bool nxd_step_idle(const struct nxd *d)
{
	return d->step.state == NXD_STEP_IDLE;
}

bool nxd_step_running(const struct nxd *d)
{
	return d->step.state == NXD_STEP_RUNNING;
}

bool nxd_step_can_launch(const struct nxd *d)
{
	return d->step.state == NXD_STEP_IDLE && !d->step.dirty && nxd_procs_all_live(d) && !nxd_procs_failed(d);
}

/* ---------------------------------------------------------------- the watchdog */

static double watchdog_limit(const struct nxd_step *s, double cap, int n)
{
	double floor = cap < WATCHDOG_FLOOR ? cap : WATCHDOG_FLOOR;
	if (s->wd_steps < WATCHDOG_WARMUP)
		return cap;
	double t = WATCHDOG_FACTOR * s->wd_per_tok * (n > 0 ? n : 1);
	return t < floor ? floor : t > cap ? cap : t;
}

/* A step took dt s for n tokens. */
static void watchdog_learn(struct nxd_step *s, double dt, int n)
{
	double per_tok = dt / (n > 0 ? n : 1);
	s->wd_per_tok *= WATCHDOG_DECAY;
	if (per_tok > s->wd_per_tok)
		s->wd_per_tok = per_tok;
	s->wd_steps++;
}

/* ---------------------------------------------------------------- launch and abort */

_Static_assert(NXD_STEP_DRAFT == NXW_STEP_DRAFT, "the workers read the step's model word as step.h writes it");

static void launch(struct nxd *d, int n, enum nxd_step_model model)
{
	struct nxd_step *s = &d->step;
	s->n = n;
	s->model = model;
	if (d->shm.step_model)
		*d->shm.step_model = (int32_t)model; /* guard.c checks it against s->model */
	s->t0 = nxd_now();
	s->state = NXD_STEP_RUNNING;
	nxd_guard_keep_descriptor(d, n); /* what the workers must find in it */
	s->limit = watchdog_limit(s, d->o.step_timeout, n);
	s->gen++;
	nx_ctl_launch_gen(d->shm.ctl, n, s->gen);
}

void nxd_step_launch(struct nxd *d, int n)
{
	launch(d, n, NXD_STEP_MAIN);
}

void nxd_step_launch_draft(struct nxd *d, int n)
{
	launch(d, n, NXD_STEP_DRAFT);
}

/* Releases the survivors of the running step; it runs again once every band
 * has a process and nobody is inside it. */
static void abort_running(struct nxd *d)
{
	nx_ctl_abort(d->shm.ctl);
	d->step.state = NXD_STEP_ABORTING;
}

void nxd_step_worker_died(struct nxd *d)
{
	/* It may have written anywhere in the arena on its way out. */
	nxd_sched_forget_prompts(d, "a worker died");
	/* A step in flight cannot finish without it. */
	if (d->step.state == NXD_STEP_RUNNING)
		abort_running(d);
}

void nxd_step_shutdown(struct nxd *d)
{
	if (d->shm.ctl) {
		nx_ctl_abort(d->shm.ctl);
		nx_ctl_quit(d->shm.ctl);
	}
	d->step.state = NXD_STEP_IDLE;
}

/* guard.c found the block inconsistent: we cannot tell which worker wrote,
 * so every one is killed; the running step is dropped (its block is
 * rewritten, not aborted) and retried once fresh workers are up. */
static void trip(struct nxd *d, const char *why)
{
	nxd_err("control block inconsistent: %s; a worker wrote where it must not: killing and respawning every worker",
		why);
	d->step.dirty = true;
	nxd_sched_forget_prompts(d, "control block inconsistent");
	for (int i = 0; i < d->n_workers; i++)
		nxd_proc_kill(d, i, true);
	if (d->step.state == NXD_STEP_RUNNING)
		d->step.state = NXD_STEP_ABORTING;
}

/* ---------------------------------------------------------------- poll */

static void live_update(struct nxd *d)
{
	for (int i = 0; i < d->n_workers; i++)
		d->step.live[i] = d->procs[i].pid > 0;
}

static bool acked(const struct nxd *d)
{
	return nx_ctl_acked(d->shm.ctl, (uint32_t)d->n_workers, d->step.gen, d->step.live);
}

static enum nxd_step_event finished(struct nxd *d, double now)
{
	struct nxd_step *s = &d->step;
	s->state = NXD_STEP_IDLE;
	s->tries = 0;
	nxd_procs_started(d); /* a completed step: start-up is behind them */
	watchdog_learn(s, now - s->t0, s->n);
	return NXD_STEP_DONE;
}

/* A survivor stuck outside any barrier: kill it; its death is handled like
 * any other. */
static void kill_stuck(struct nxd *d)
{
	const struct nxd_step *s = &d->step;
	for (int i = 0; i < d->n_workers; i++)
		if (s->live[i] && atomic_load(&d->shm.ctl->w[i].ack_gen) != s->gen && d->procs[i].pid > 0) {
			nxd_err("worker %d (pid %d) did not leave the aborted step; killing it", i, (int)d->procs[i].pid);
			nxd_proc_kill(d, i, false);
		}
}

static enum nxd_step_event poll_abort(struct nxd *d, double now, const char **why)
{
	struct nxd_step *s = &d->step;
	struct nx_ctl *ctl = d->shm.ctl;
	if (s->abort_t0 == 0)
		s->abort_t0 = now;
	if (!acked(d)) {
		if (now - s->abort_t0 > ABORT_GRACE) {
			kill_stuck(d);
			s->abort_t0 = now;
		}
		return NXD_STEP_NONE;
	}
	nxd_procs_tick(d, now); /* respawn the dead now that nobody is inside the step */
	if (nxd_procs_failed(d)) {
		s->state = NXD_STEP_IDLE;
		s->abort_t0 = 0;
		nx_ctl_reset(ctl, (uint32_t)d->n_workers, (uint32_t)d->o.n_batch, d->spin);
		*why = d->fatal;
		return NXD_STEP_FAILED;
	}
	if (!nxd_procs_all_live(d))
		return NXD_STEP_NONE; /* a band waits for its respawn */
	/* Survivors are out, every band has a process: the step can run again
	 * from the slots' unchanged state. A step that keeps killing workers is
	 * not retried forever: its sequences get an error, the others go on. */
	nx_ctl_reset(ctl, (uint32_t)d->n_workers, (uint32_t)d->o.n_batch, d->spin);
	s->state = NXD_STEP_IDLE;
	s->abort_t0 = 0;
	if (++s->tries < MAX_STEP_TRIES)
		return NXD_STEP_RETRY;
	nxd_err("step %u was aborted %d times in a row; failing its sequences", s->gen, s->tries);
	s->tries = 0;
	*why = "this request's step failed repeatedly (a worker died each time)";
	return NXD_STEP_FAILED;
}

enum nxd_step_event nxd_step_poll(struct nxd *d, double now, const char **why)
{
	struct nxd_step *s = &d->step;
	/* Shared memory is validated before anything read from it is acted on;
	 * after a worker scribbled, nothing goes on until the block is rewritten. */
	if (!s->dirty) {
		char what[256];
		live_update(d);
		if (!nxd_guard_check(d, what, sizeof(what)))
			trip(d, what);
	}
	if (s->dirty) {
		if (!nxd_procs_all_gone(d))
			return NXD_STEP_REPAIRING; /* the killed workers are not all reaped yet */
		nxd_guard_repair(d);
		s->dirty = false;
	}

	live_update(d);
	if (s->state == NXD_STEP_RUNNING) {
		if (acked(d) && nxd_procs_all_live(d))
			return finished(d, now);
		if (now - s->t0 > s->limit) {
			nxd_err("step watchdog: step %u (%d tokens) has run %.1f s, over its limit of %.1f s: aborting it",
				s->gen, s->n, now - s->t0, s->limit);
			abort_running(d);
			nxd_sched_forget_prompts(d, "step aborted");
		}
	}
	if (s->state == NXD_STEP_ABORTING)
		return poll_abort(d, now, why);
	s->abort_t0 = 0;
	nxd_procs_tick(d, now);
	return NXD_STEP_NONE;
}
