/* step.h - the one owner of a forward step's lifecycle: launch, done / retry / failed, a worker's death, the watchdog, repair after a scribble.
 *
 *            launch(plan)            every live worker acked
 *   IDLE ----------------> RUNNING -------------------------> IDLE   (poll: DONE)
 *                             |
 *     a worker died, the      |  abort word set, survivors released
 *     watchdog, a scribble    v
 *                          ABORTING --- survivors out, dead respawned ---> IDLE (poll: RETRY,
 *                                       (one stuck past ABORT_GRACE is killed)  or FAILED after
 *                                                                               MAX_STEP_TRIES)
 * A step writes only scratch and the K/V rows at its own positions, so a
 * retry runs the same plan again and gives the same result. Nobody else
 * writes this state: sched.c launches a plan and consumes what poll returns,
 * procs.c reports deaths, guard.c only checks what the workers wrote. */
#ifndef NXD_STEP_H
#define NXD_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

struct nxd;

enum nxd_step_state { NXD_STEP_IDLE, NXD_STEP_RUNNING, NXD_STEP_ABORTING };

/* Which model a step runs (nxd --draft-model: the draft model's steps). */
enum nxd_step_model { NXD_STEP_MAIN, NXD_STEP_DRAFT };

/* What a poll found, for the caller to hand to the scheduler. */
enum nxd_step_event {
	NXD_STEP_NONE,      /* nothing new */
	NXD_STEP_DONE,      /* the step finished: its logits are ready */
	NXD_STEP_RETRY,     /* aborted and cleaned up: plan the same step again */
	NXD_STEP_FAILED,    /* aborted for good: its sequences get the reason */
	NXD_STEP_REPAIRING, /* a worker scribbled: nothing goes on until the block is rewritten */
};

struct nxd_step {
	enum nxd_step_state state;
	uint32_t gen;           /* last gen launched (our own count, never the block's) */
	int n;                  /* tokens in the running (or last) step */
	enum nxd_step_model model; /* and which model it runs */
	int tries;              /* aborts of the current step in a row */
	double t0;              /* s: when it was launched */
	double limit;           /* s: its watchdog limit */
	double abort_t0;        /* s: when it was aborted, or 0 */
	bool dirty;             /* the block is inconsistent: every worker killed; rewritten once all are gone */
	unsigned char *live;    /* (n_workers) bands with a process, as of the last look */
	double wd_per_tok;      /* the watchdog's estimate: decaying max of step seconds per token */
	uint64_t wd_steps;      /* steps measured */
};

int nxd_step_init(struct nxd *d, struct nx_err *err);
void nxd_step_free(struct nxd *d);
/* The plan of n tokens is in the step descriptor: run it. */
void nxd_step_launch(struct nxd *d, int n);
/* The same through the draft model (draft.c). */
void nxd_step_launch_draft(struct nxd *d, int n);
/* Looks at the workers (after every batch of events, and at least every
 * tick): validates the block, sees the step finish, runs the watchdog,
 * cleans up an aborted step and respawns the dead. *why: a FAILED step's
 * reason. */
enum nxd_step_event nxd_step_poll(struct nxd *d, double now, const char **why);
/* A worker died (procs.c): its band cannot finish a step in flight. */
void nxd_step_worker_died(struct nxd *d);
/* Shutdown: the step in flight is abandoned and the workers told to quit. */
void nxd_step_shutdown(struct nxd *d);

/* No step in flight: a boundary (folds swap in, cancelled requests end). */
bool nxd_step_idle(const struct nxd *d);
/* A step is computing (for the log and status; not aborting). */
bool nxd_step_running(const struct nxd *d);
/* A plan may be launched now: no step, no repair, every band has a worker. */
bool nxd_step_can_launch(const struct nxd *d);

#endif
