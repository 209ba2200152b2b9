/* futex.h - futex waits and wakes on shared memory, and the barrier the workers meet at.
 *
 * Every word here lives in the shared arena and is used by several processes,
 * so the futex ops are the shared ones (FUTEX_WAIT / FUTEX_WAKE, never
 * FUTEX_PRIVATE_FLAG: a private futex is keyed by (mm, address) and a wake in
 * one process would never reach a sleeper in another). The worker's seccomp
 * filter allows exactly these two ops.
 *
 * Waits spin for a bounded number of iterations first (a step's barriers are
 * usually a few microseconds apart and a futex sleep/wake round trip costs
 * more than that), then sleep. */
#ifndef NX_FUTEX_H
#define NX_FUTEX_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* FUTEX_WAIT on a shared word: sleeps while *w == val. Returns 0 when woken
 * (or the word already differed, or a signal interrupted the sleep), -1 with
 * errno ETIMEDOUT after timeout (NULL: none). */
int nx_futex_wait(_Atomic uint32_t *w, uint32_t val, const struct timespec *timeout);
/* FUTEX_WAKE on a shared word: wakes up to n sleepers; returns how many woke or -1. */
int nx_futex_wake(_Atomic uint32_t *w, int n);

/* Spins (pause) up to spin iterations, then sleeps, until *w != val or, if
 * abort is non-NULL, *abort != 0. Returns the new value of *w (val when it
 * returned because of abort). abort must be a word whose setter also changes
 * *w or wakes its sleepers (see nx_barrier_abort). */
uint32_t nx_futex_wait_change(_Atomic uint32_t *w, uint32_t val, const _Atomic uint32_t *abort,
			      uint32_t spin);

/* Measures pause-loop iterations per microsecond on this CPU (a few ms of
 * calibration); run once in the supervisor before forking. Never below 1. */
uint32_t nx_spin_calibrate(void);

/* A reusable barrier for n processes over shared memory. Generation counting
 * (the sense-reversing barrier with a counter instead of one sense bit): the
 * last arrival resets count and bumps gen; the others wait for gen to move.
 * `sleepers` lets the last arrival skip the FUTEX_WAKE syscall when everyone
 * is still spinning (the usual case). */
#define NX_BARRIER_TAGS 8

struct nx_barrier {
	_Atomic uint32_t count;    /* arrivals in the current round */
	_Atomic uint32_t gen;      /* round number; the futex word */
	_Atomic uint32_t sleepers; /* processes in (or entering) FUTEX_WAIT on gen */
	uint32_t n;                /* participants */
	/* Work handed out between two rounds (nx_barrier_claim), one pool per
	 * tag: round << 32 | units claimed so far. Their own line: claims do not
	 * slow the spinners on gen. */
	_Atomic uint64_t work[NX_BARRIER_TAGS] __attribute__((aligned(64)));
};

void nx_barrier_init(struct nx_barrier *b, uint32_t n);

/* Waits until all n participants have arrived. Returns 0, or -1 when *abort
 * became non-zero before the round completed (the caller leaves its step; the
 * barrier must then be re-initialized before it is used again). */
int nx_barrier_wait(struct nx_barrier *b, const _Atomic uint32_t *abort, uint32_t spin);

/* Releases every waiter of b after the caller has set the abort word: bumps
 * gen (so a waiter between its abort check and FUTEX_WAIT does not sleep on a
 * stale value) and wakes all sleepers. Used by the supervisor only. */
void nx_barrier_abort(struct nx_barrier *b);

/* Claims the next `units` units of a pool of work shared by every participant
 * between the same two rounds of b under the same tag (< NX_BARRIER_TAGS: several
 * pools per round, in use at the same time). Returns the first claimed unit's index in the pool: 0 for the first
 * claim of the round, then counting up; the caller stops once it is past the
 * pool's end. No reset is needed: the round number (gen) is part of the key,
 * and it cannot move while a participant is still between the two rounds. */
uint32_t nx_barrier_claim(struct nx_barrier *b, uint32_t tag, uint32_t units);

#endif
