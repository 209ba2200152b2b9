/* ctl.c - control block layout, the worker's step loop and the supervisor's step calls. */
#include "shm/ctl.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

_Static_assert(NX_CTL_MAX_WORKERS <= NX_BARRIER_RANGES, "every worker needs a work range of its own");

size_t nx_ctl_shm_size(uint32_t n_workers)
{
	if (n_workers == 0 || n_workers > NX_CTL_MAX_WORKERS)
		return 0;
	return sizeof(struct nx_ctl) + (size_t)n_workers * sizeof(struct nx_ctl_worker);
}

struct nx_ctl *nx_ctl_shm_init(void *mem, uint32_t n_workers, uint32_t max_batch, uint32_t spin)
{
	struct nx_ctl *c = mem;
	memset(c, 0, nx_ctl_shm_size(n_workers));
	c->magic = NX_CTL_MAGIC;
	c->n_workers = n_workers;
	c->spin = spin;
	c->max_batch = max_batch;
	nx_barrier_init(&c->barrier, n_workers);
	return c;
}

/* --- worker side */

struct step_run {
	struct nx_ctl *c;
	/* __builtin_setjmp buffer: a pure register save, unlike glibc's longjmp,
	 * which may call sigaltstack (a syscall the sandbox does not allow). */
	void *jb[5];
};

static void step_barrier(void *ctx)
{
	struct step_run *r = ctx;
	if (nx_barrier_wait(&r->c->barrier, &r->c->abort, r->c->spin) < 0)
		__builtin_longjmp(r->jb, 1);
}

static bool step_take(void *ctx, uint32_t tag, uint32_t band, uint32_t units, uint32_t chunk, uint32_t *u0,
		      uint32_t *u1)
{
	struct step_run *r = ctx;
	return nx_barrier_take(&r->c->barrier, tag, band, units, chunk, u0, u1);
}

/* Runs fn for one step; returns 1 if it was left because of an abort. Kept
 * out of line so __builtin_longjmp lands in a frame of its own. */
static __attribute__((noinline)) int run_one(struct step_run *r, nx_ctl_step_fn fn, void *arg,
					     uint32_t band, int32_t n)
{
	if (__builtin_setjmp(r->jb))
		return 1;
	fn(arg, band, r->c->n_workers, n, step_barrier, step_take, r);
	return 0;
}

int nx_ctl_worker_loop(struct nx_ctl *c, uint32_t band, uint32_t seen_gen, nx_ctl_step_fn fn,
		       void *arg)
{
	struct nx_ctl_worker *me = &c->w[band];
	struct step_run r = { .c = c };

	atomic_store(&me->ack_gen, seen_gen);
	atomic_store(&me->state, NXW_READY);
	atomic_fetch_add(&c->bell, 1);
	nx_futex_wake(&c->bell, INT_MAX);

	for (;;) {
		uint32_t g = nx_futex_wait_change(&c->step_gen, seen_gen, NULL, c->spin);
		seen_gen = g;
		if (atomic_load(&c->quit))
			return 0;
		int32_t n = c->step_n;
		if (n < 0 || (uint32_t)n > c->max_batch)
			n = 0;
		atomic_store(&me->state, NXW_RUNNING);
		int aborted = run_one(&r, fn, arg, band, n);
		atomic_store(&me->state, NXW_READY);
		if (aborted)
			atomic_fetch_add(&me->aborts, 1);
		else
			atomic_fetch_add(&me->steps, 1);
		/* ack_gen before done: when the supervisor is woken, whoever
		 * counted itself into done has acked. (A late increment can leak
		 * into the next step's count; the >= below keeps that harmless.) */
		atomic_store(&me->ack_gen, g);
		/* The last one to finish wakes the supervisor; on an abort everyone
		 * does, since the dead worker will never be last. */
		if (atomic_fetch_add(&c->done, 1) + 1 >= c->n_workers || aborted || atomic_load(&c->abort)) {
			atomic_fetch_add(&c->bell, 1);
			nx_futex_wake(&c->bell, INT_MAX);
		}
	}
}

/* --- supervisor side */

uint32_t nx_ctl_launch(struct nx_ctl *c, int32_t n)
{
	c->step_n = n;
	atomic_store(&c->done, 0);
	uint32_t g = atomic_fetch_add(&c->step_gen, 1) + 1;
	nx_futex_wake(&c->step_gen, INT_MAX);
	return g;
}

int nx_ctl_acked(const struct nx_ctl *c, uint32_t n_workers, uint32_t gen, const unsigned char *live)
{
	for (uint32_t i = 0; i < n_workers; i++)
		if (live[i] && atomic_load(&c->w[i].ack_gen) != gen)
			return 0;
	return 1;
}

void nx_ctl_abort(struct nx_ctl *c)
{
	atomic_store(&c->abort, 1);
	nx_barrier_abort(&c->barrier);
}

void nx_ctl_reset(struct nx_ctl *c, uint32_t n_workers, uint32_t max_batch, uint32_t spin)
{
	/* Rewrite the constants too, from the supervisor's own copies: a worker
	 * that died may have scribbled on them. */
	c->magic = NX_CTL_MAGIC;
	c->n_workers = n_workers;
	c->max_batch = max_batch;
	c->spin = spin;
	atomic_store(&c->quit, 0);
	nx_barrier_init(&c->barrier, n_workers);
	atomic_store(&c->done, 0);
	atomic_store(&c->abort, 0);
}

void nx_ctl_quit(struct nx_ctl *c)
{
	atomic_store(&c->quit, 1);
	atomic_fetch_add(&c->step_gen, 1);
	nx_futex_wake(&c->step_gen, INT_MAX);
}

/* --- supervisor side: not trusting the block */

void nx_ctl_launch_gen(struct nx_ctl *c, int32_t n, uint32_t gen)
{
	c->step_n = n;
	atomic_store(&c->done, 0);
	atomic_store(&c->step_gen, gen);
	nx_futex_wake(&c->step_gen, INT_MAX);
}

int nx_ctl_check(const struct nx_ctl *c, const struct nx_ctl_expect *e, char *why, size_t cap)
{
#define BAD(...) do { snprintf(why, cap, __VA_ARGS__); return -1; } while (0)
	/* Snapshots: a value is read once, so the message shows what was judged. */
	uint32_t v;
	if ((v = c->magic) != NX_CTL_MAGIC)
		BAD("magic is 0x%08x, expected 0x%08x", v, NX_CTL_MAGIC);
	if ((v = c->n_workers) != e->n_workers)
		BAD("n_workers is %u, expected %u", v, e->n_workers);
	if ((v = c->max_batch) != e->max_batch)
		BAD("max_batch is %u, expected %u", v, e->max_batch);
	if ((v = c->spin) != e->spin)
		BAD("spin is %u, expected %u", v, e->spin);
	if ((v = atomic_load(&c->step_gen)) != e->gen)
		BAD("step_gen is %u, expected %u", v, e->gen);
	int32_t sn = c->step_n;
	if (sn != e->step_n)
		BAD("step_n is %d, expected %d", sn, e->step_n);
	if ((v = atomic_load(&c->quit)) != 0)
		BAD("quit is %u, expected 0", v);
	if (!e->aborting && (v = atomic_load(&c->abort)) != 0)
		BAD("abort is %u, but no step was aborted", v);
	/* A worker's late increment can leak into the next step's count (see
	 * nx_ctl_worker_loop): at most n of each. */
	if ((v = atomic_load(&c->done)) > 2 * e->n_workers)
		BAD("done is %u, more than 2 x %u workers", v, e->n_workers);
	if ((v = c->barrier.n) != e->n_workers)
		BAD("barrier.n is %u, expected %u", v, e->n_workers);
	if ((v = atomic_load(&c->barrier.count)) > e->n_workers)
		BAD("barrier.count is %u, more than %u workers", v, e->n_workers);
	if ((v = atomic_load(&c->barrier.sleepers)) > e->n_workers)
		BAD("barrier.sleepers is %u, more than %u workers", v, e->n_workers);
	for (uint32_t i = 0; i < e->n_workers; i++) {
		if (!e->live[i])
			continue;
		if ((v = atomic_load(&c->w[i].state)) > NXW_RUNNING)
			BAD("state of worker %u is %u, not a worker state", i, v);
		if ((v = atomic_load(&c->w[i].ack_gen)) != e->gen && v != e->gen - 1)
			BAD("ack_gen of worker %u is %u, expected %u or %u", i, v, e->gen - 1, e->gen);
	}
	return 0;
#undef BAD
}

void nx_ctl_repair(struct nx_ctl *c, uint32_t n_workers, uint32_t max_batch, uint32_t spin, uint32_t gen)
{
	nx_ctl_reset(c, n_workers, max_batch, spin);
	atomic_store(&c->step_gen, gen);
	for (uint32_t i = 0; i < n_workers; i++) {
		atomic_store(&c->w[i].state, NXW_STARTING);
		atomic_store(&c->w[i].ack_gen, gen);
	}
}
