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
 * more than that), then go on polling for NX_YIELD_ROUNDS times as long while
 * handing the CPU to anything else runnable every few microseconds
 * (sched_yield), and only then sleep. */
#ifndef NX_FUTEX_H
#define NX_FUTEX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* FUTEX_WAIT on a shared word: sleeps while *w == val. Returns 0 when woken
 * (or the word already differed, or a signal interrupted the sleep), -1 with
 * errno ETIMEDOUT after timeout (NULL: none). */
int nx_futex_wait(_Atomic uint32_t *w, uint32_t val, const struct timespec *timeout);
/* FUTEX_WAKE on a shared word: wakes up to n sleepers; returns how many woke or -1. */
int nx_futex_wake(_Atomic uint32_t *w, int n);

/* A waiter's polling after its spin: NX_YIELD_ROUNDS x spin iterations, every
 * NX_YIELD_EVERY-th a sched_yield instead of a pause. */
#define NX_YIELD_ROUNDS 10
#define NX_YIELD_EVERY 64

/* Spins (pause) up to spin iterations, polls with yields (above), then sleeps, until *w != val or, if
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
/* Participants with a work range of their own (nx_barrier_take); at least
 * NX_CTL_MAX_WORKERS (checked in shm/ctl.c). */
#define NX_BARRIER_RANGES 1024
/* Most units one nx_barrier_take split can have (15-bit range bounds). */
#define NX_BARRIER_TAKE_UNITS 0x7fff

struct nx_barrier {
	_Atomic uint32_t count;    /* arrivals in the current round */
	_Atomic uint32_t gen;      /* round number; the futex word */
	_Atomic uint32_t sleepers; /* processes in (or entering) FUTEX_WAIT on gen */
	uint32_t n;                /* participants */
	/* Work handed out between two rounds (nx_barrier_take): participant i's
	 * range of the split under each tag: round << 32 | 1 << 31 | front << 15 | back.
	 * One cache line per participant: its own takes never bounce a line
	 * between CPUs, nor slow the spinners on gen. */
	struct {
		_Atomic uint64_t tag[NX_BARRIER_TAGS];
	} range[NX_BARRIER_RANGES] __attribute__((aligned(64)));
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

/* Hands out work shared by every participant between the same two rounds of
 * b, under one tag (< NX_BARRIER_TAGS: several splits in use at the same time).
 * The work is `units` units (<= NX_BARRIER_TAKE_UNITS) in n contiguous ranges,
 * range i = [units * i / n, units * (i + 1) / n) belonging to participant i.
 * Participant `self` takes from the front of its own range, half of what is
 * left at a time (at least `chunk` units); once that is empty, the same from
 * the back of the others'. So each one reads its range in order when the
 * machine leaves it alone, and one that runs slower than the others (a
 * smaller core, a busy sibling) leaves the end of its range to them instead of
 * holding them at the next round. Sets [*u0, *u1) and returns true, or returns
 * false once every range is empty. Every caller of a split must pass the same
 * units. No reset is needed: the round number (gen) is part of each range's
 * key, and it cannot move while a participant is still between the two rounds. */
bool nx_barrier_take(struct nx_barrier *b, uint32_t tag, uint32_t self, uint32_t units, uint32_t chunk,
		     uint32_t *u0, uint32_t *u1);

#endif
