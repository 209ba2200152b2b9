/* ctl.h - the control block in the arena and the step protocol between the supervisor and its workers.
 *
 * One step:
 *   supervisor: writes the step descriptor, nx_ctl_launch(): done = 0,
 *               step_gen += 1, FUTEX_WAKE(step_gen).
 *   workers:    see step_gen move, run their band of the step, meeting at
 *               nx_ctl_barrier(); set ack_gen = step_gen; done += 1; the last
 *               one bumps `bell` and wakes it.
 *   supervisor: one FUTEX_WAIT on `bell` (io_uring) sees the step finish when
 *               every live worker has ack_gen == step_gen.
 *
 * A worker dies mid-step: the supervisor sets `abort` and releases the barrier
 * (nx_ctl_abort); every survivor leaves the step at its next barrier (a
 * longjmp back to the step loop: the step writes only scratch and KV rows at
 * its own positions, so nothing is left half-done that a retry does not
 * redo), acks, and rings the bell. When all survivors have acked, the
 * supervisor re-forks the dead worker, nx_ctl_reset()s the barrier and
 * launches the same step again.
 *
 * Workers trust this block; the supervisor does not: it only reads ack_gen,
 * state, pid and steps, and only to decide when to look again, never to index
 * its own memory. */
#ifndef NX_CTL_H
#define NX_CTL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "shm/futex.h"

#define NX_CTL_MAGIC 0x6e78646bu /* "nxdk" */
#define NX_CTL_MAX_WORKERS 1024

enum nx_wstate {
	NXW_STARTING = 0, /* forked, not yet sandboxed */
	NXW_READY = 1,    /* sandboxed, waiting for a step */
	NXW_RUNNING = 2,  /* inside a step */
};

/* One cache line per worker, so heartbeats do not bounce each other's lines. */
struct nx_ctl_worker {
	_Atomic uint32_t state;   /* enum nx_wstate */
	_Atomic uint32_t ack_gen; /* last step_gen finished or left */
	_Atomic uint32_t pid;     /* the worker's own view of its pid (logs only) */
	uint32_t cpu;             /* CPU it pinned itself to */
	_Atomic uint64_t steps;   /* heartbeat: steps completed */
	_Atomic uint64_t aborts;  /* steps left because of an abort */
} __attribute__((aligned(64)));

struct nx_ctl {
	uint32_t magic;
	uint32_t n_workers;
	uint32_t spin;            /* pause iterations before a futex sleep */
	uint32_t max_batch;       /* step_n is clamped to this */

	_Atomic uint32_t step_gen __attribute__((aligned(64))); /* bumped to start a step */
	_Atomic uint32_t quit;    /* workers exit when they see step_gen move with quit set */
	int32_t step_n;           /* tokens in the current step */

	_Atomic uint32_t abort __attribute__((aligned(64)));
	_Atomic uint32_t done __attribute__((aligned(64))); /* workers finished with step_gen */
	_Atomic uint32_t bell;    /* bumped (and woken) when the supervisor should look */

	struct nx_barrier barrier __attribute__((aligned(64)));

	struct nx_ctl_worker w[] __attribute__((aligned(64)));
};

/* Size of the control block for n workers (0 if n is out of range). */
size_t nx_ctl_shm_size(uint32_t n_workers);
/* Initializes the block in mem (zeroed arena memory of nx_ctl_shm_size bytes). */
struct nx_ctl *nx_ctl_shm_init(void *mem, uint32_t n_workers, uint32_t max_batch, uint32_t spin);

/* --- worker side */

/* How a step hands out work between two barriers: nx_barrier_take on the step's barrier. */
typedef bool (*nx_ctl_take_fn)(void *barrier_ctx, uint32_t tag, uint32_t band, uint32_t units, uint32_t chunk,
			       uint32_t *u0, uint32_t *u1);

/* One band of one step. barrier(barrier_ctx) must be called between
 * dependent ops; it does not return if the step is aborted. take(barrier_ctx,
 * ...) hands out work shared between two barriers (nx_barrier_take). */
typedef void (*nx_ctl_step_fn)(void *arg, uint32_t band, uint32_t n_bands, int32_t n,
			       void (*barrier)(void *), nx_ctl_take_fn take, void *barrier_ctx);

/* The worker's step loop: marks the worker ready, then runs fn for every
 * step_gen after seen_gen until quit. Returns 0 on quit. Issues no syscall but
 * futex. */
int nx_ctl_worker_loop(struct nx_ctl *c, uint32_t band, uint32_t seen_gen, nx_ctl_step_fn fn,
		       void *arg);

/* --- supervisor side */

/* Starts the next step (the descriptor is already written). Returns its gen. */
uint32_t nx_ctl_launch(struct nx_ctl *c, int32_t n);
/* True when every worker i < n_workers with live[i] has acked gen. n_workers
 * is the supervisor's own count, never the block's (which a worker could overwrite). */
int nx_ctl_acked(const struct nx_ctl *c, uint32_t n_workers, uint32_t gen, const unsigned char *live);
/* Sets abort and releases every waiter (barrier and step). */
void nx_ctl_abort(struct nx_ctl *c);
/* After an abort, once no live worker is inside the step: clears abort, done
 * and the barrier, and rewrites the block's constants, so the step can be
 * launched again. */
void nx_ctl_reset(struct nx_ctl *c, uint32_t n_workers, uint32_t max_batch, uint32_t spin);
/* Asks the workers to exit. */
void nx_ctl_quit(struct nx_ctl *c);

/* --- supervisor side: not trusting the block (docs/reliability.md 21) */

/* Like nx_ctl_launch, but the gen is the supervisor's own count, stored
 * rather than derived from the block's (which a worker may have overwritten). */
void nx_ctl_launch_gen(struct nx_ctl *c, int32_t n, uint32_t gen);

/* What the supervisor knows the block must hold. */
struct nx_ctl_expect {
	uint32_t n_workers, max_batch, spin;
	uint32_t gen;               /* last gen launched: every live ack_gen is gen or gen - 1 */
	int32_t step_n;             /* tokens of that step */
	int aborting;               /* the supervisor set abort (else abort must be 0) */
	const unsigned char *live;  /* (n_workers) bands with a process */
};

/* Checks every word of the block against e: constants, step_gen, step_n,
 * abort, quit, done, the barrier and each live worker's state and ack_gen.
 * 0 when consistent; -1 with why ("ack_gen of worker 0 is 3735928559,
 * expected 41 or 42") naming the first bad field. */
int nx_ctl_check(const struct nx_ctl *c, const struct nx_ctl_expect *e, char *why, size_t cap);

/* Rewrites the block from the supervisor's own values (step_n is the
 * caller's to rewrite with the descriptor). Only when no worker is alive;
 * the barrier's gen keeps counting (see nx_barrier_init). */
void nx_ctl_repair(struct nx_ctl *c, uint32_t n_workers, uint32_t max_batch, uint32_t spin, uint32_t gen);

#endif
