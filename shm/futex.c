/* futex.c - shared futex wait/wake, spin-then-sleep waits and the barrier. */
#define _GNU_SOURCE
#include "shm/futex.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	atomic_signal_fence(memory_order_seq_cst);
#endif
}

int nx_futex_wait(_Atomic uint32_t *w, uint32_t val, const struct timespec *timeout)
{
	/* FUTEX_WAIT, not FUTEX_WAIT_PRIVATE: the word is shared between processes. */
	long r = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, timeout, NULL, 0);
	if (r < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	return r < 0 ? -1 : 0;
}

int nx_futex_wake(_Atomic uint32_t *w, int n)
{
	return (int)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* Polls *w for a change (or *abort) before a waiter sleeps: spin pause
 * iterations, then NX_YIELD_ROUNDS times as many with a sched_yield every
 * NX_YIELD_EVERY-th. Why the yields: a sleeping waiter costs its waker a
 * wake-up (an IPI on a VM) and itself the time to run again once its CPU has
 * gone idle, and a step's waits are often longer than the spin because the
 * supervisor and its clients take their turn on the workers' CPUs between
 * steps. A yielding waiter keeps its CPU awake yet gives it to them at once
 * (docs/bench.md). True when *w moved (or abort is set). */
static bool poll_change(const _Atomic uint32_t *w, uint32_t val, const _Atomic uint32_t *abort, uint32_t spin)
{
	const uint64_t n = (uint64_t)spin * (1 + NX_YIELD_ROUNDS);
	for (uint64_t i = 0; i < n; i++) {
		if (atomic_load_explicit(w, memory_order_acquire) != val)
			return true;
		if (abort && atomic_load_explicit(abort, memory_order_relaxed))
			return true;
		if (i >= spin && (i - spin) % NX_YIELD_EVERY == NX_YIELD_EVERY - 1)
			sched_yield();
		else
			cpu_relax();
	}
	return false;
}

uint32_t nx_futex_wait_change(_Atomic uint32_t *w, uint32_t val, const _Atomic uint32_t *abort,
			      uint32_t spin)
{
	uint32_t v;
	if (poll_change(w, val, abort, spin))
		return atomic_load(w); /* still val if only abort was set */
	for (;;) {
		if ((v = atomic_load(w)) != val)
			return v;
		if (abort && atomic_load(abort))
			return val;
		nx_futex_wait(w, val, NULL);
	}
}

uint32_t nx_spin_calibrate(void)
{
	struct timespec t0, t1;
	uint32_t iters = 20000;
	uint64_t best = UINT64_MAX;
	/* Best of a few runs: the shortest is the one least disturbed by the scheduler. */
	for (int run = 0; run < 5; run++) {
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (uint32_t i = 0; i < iters; i++)
			cpu_relax();
		clock_gettime(CLOCK_MONOTONIC, &t1);
		uint64_t ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)(t1.tv_nsec - t0.tv_nsec);
		if (ns < best)
			best = ns;
	}
	if (best == 0)
		best = 1;
	uint64_t per_us = (uint64_t)iters * 1000u / best;
	return per_us < 1 ? 1 : per_us > 100000 ? 100000 : (uint32_t)per_us;
}

void nx_barrier_init(struct nx_barrier *b, uint32_t n)
{
	atomic_store(&b->count, 0);
	atomic_store(&b->sleepers, 0);
	b->n = n;
	/* gen keeps counting across re-inits: a waiter left over from an aborted
	 * round compares against an old value and does not go back to sleep. */
}

int nx_barrier_wait(struct nx_barrier *b, const _Atomic uint32_t *abort, uint32_t spin)
{
	if (atomic_load(abort))
		return -1;
	uint32_t g = atomic_load(&b->gen);
	if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
		atomic_store(&b->count, 0);
		atomic_store(&b->gen, g + 1); /* seq_cst: ordered before the sleepers load below */
		if (atomic_load(&b->sleepers))
			nx_futex_wake(&b->gen, INT_MAX);
		return 0;
	}
	if (poll_change(&b->gen, g, abort, spin))
		goto moved;
	/* Announce the sleep before re-checking gen inside FUTEX_WAIT: either the
	 * last arrival sees sleepers > 0 and wakes, or FUTEX_WAIT sees the new gen. */
	atomic_fetch_add(&b->sleepers, 1);
	while (atomic_load(&b->gen) == g && !atomic_load(abort))
		nx_futex_wait(&b->gen, g, NULL);
	atomic_fetch_sub(&b->sleepers, 1);
moved:
	/* gen also moves on abort (nx_barrier_abort), so check which it was. */
	return atomic_load(abort) ? -1 : 0;
}

/* Marks a range word as written (round 0 must not read the arena's zeros as an empty range). */
#define TAKE_SET ((uint64_t)1 << 31)

/* Takes half of range r's untaken units (at least chunk, at most all), from
 * its front (its owner) or its back (anyone else), as one compare-and-swap on
 * the range's word. */
static bool range_take(struct nx_barrier *b, uint32_t tag, uint32_t r, uint32_t units, uint32_t chunk, bool front,
		       uint32_t *u0, uint32_t *u1)
{
	_Atomic uint64_t *w = &b->range[r].tag[tag % NX_BARRIER_TAGS];
	const uint32_t g = atomic_load(&b->gen);
	uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
	for (;;) {
		uint32_t f, k; /* the range's untaken units [f, k) */
		if (v >> 32 == g && (v & TAKE_SET)) {
			f = (uint32_t)(v >> 15) & NX_BARRIER_TAKE_UNITS;
			k = (uint32_t)v & NX_BARRIER_TAKE_UNITS;
		} else { /* first touch this round: the whole range */
			f = (uint32_t)((uint64_t)units * r / b->n);
			k = (uint32_t)((uint64_t)units * (r + 1) / b->n);
		}
		if (f >= k)
			return false;
		/* Half of what is left, at least chunk: few takes per range, and the
		 * last ones small, so the participants finish close together. */
		uint32_t c = (k - f + 1) / 2, a, z;
		if (c < chunk)
			c = chunk < k - f ? chunk : k - f;
		if (front) {
			a = f;
			z = f = f + c;
		} else {
			z = k;
			a = k = k - c;
		}
		const uint64_t next = (uint64_t)g << 32 | TAKE_SET | (uint64_t)f << 15 | k;
		/* Relaxed: takes only split the work; the barriers order the data. */
		if (atomic_compare_exchange_weak_explicit(w, &v, next, memory_order_relaxed, memory_order_relaxed)) {
			*u0 = a;
			*u1 = z;
			return true;
		}
	}
}

bool nx_barrier_take(struct nx_barrier *b, uint32_t tag, uint32_t self, uint32_t units, uint32_t chunk,
		     uint32_t *u0, uint32_t *u1)
{
	const uint32_t n = b->n;
	if (n == 0 || n > NX_BARRIER_RANGES || self >= n || units > NX_BARRIER_TAKE_UNITS)
		return false;
	if (chunk == 0)
		chunk = 1;
	if (range_take(b, tag, self, units, chunk, true, u0, u1))
		return true;
	for (uint32_t i = 1; i < n; i++)
		if (range_take(b, tag, (self + i) % n, units, chunk, false, u0, u1))
			return true;
	return false;
}

void nx_barrier_abort(struct nx_barrier *b)
{
	atomic_fetch_add(&b->gen, 1);
	nx_futex_wake(&b->gen, INT_MAX);
}
