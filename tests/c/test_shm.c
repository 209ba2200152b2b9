/* test_shm.c - the shared arena, futex barrier and step protocol, exercised by forked processes. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm/arena.h"
#include "shm/blocks.h"
#include "shm/ctl.h"
#include "shm/futex.h"

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Waits for pid and returns its exit code (or 128 + signal); fails the test after timeout_s. */
static int wait_exit(pid_t pid, double timeout_s)
{
	double t0 = now_s();
	for (;;) {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		assert_int_equal(r, 0);
		if (now_s() - t0 > timeout_s) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			fail_msg("process %d did not exit within %.1f s", (int)pid, timeout_s);
		}
		usleep(1000);
	}
}

static void test_size_arith(void **state)
{
	size_t s = SIZE_MAX - 10;
	assert_int_equal(nx_size_add(&s, 10), 0);
	assert_true(s == SIZE_MAX);
	assert_int_equal(nx_size_add(&s, 1), -1);
	s = SIZE_MAX / 2 + 1;
	assert_int_equal(nx_size_mul(&s, 2), -1);
	s = 4097;
	assert_int_equal(nx_size_align(&s, 4096), 0);
	assert_true(s == 8192);
	s = SIZE_MAX - 100;
	assert_int_equal(nx_size_align(&s, 4096), -1);
}

static void test_arena_grow_visible_after_fork(void **state)
{
	struct nx_arena a;
	struct nx_err err = {{0}};
	assert_int_equal(nx_arena_create(&a, "test-arena", (size_t)1 << 30, &err), 0);
	_Atomic uint32_t *flag = nx_arena_alloc(&a, 64, &err);
	assert_non_null(flag);
	assert_true(nx_arena_contains(&a, flag, 64));
	assert_false(nx_arena_contains(&a, (char *)flag + a.size, 1));

	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* The child only has the mapping from before the grow. */
		while (atomic_load(flag) == 0)
			nx_futex_wait(flag, 0, NULL);
		uint64_t *big = (uint64_t *)(a.base + atomic_load(flag));
		_exit(big[0] == 0x1234567890abcdefull && big[(1 << 24) / 8 - 1] == 42 ? 0 : 1);
	}
	/* Grow well past the first page, write, hand the offset over. */
	uint64_t *big = nx_arena_alloc(&a, (size_t)1 << 24, &err);
	assert_non_null(big);
	big[0] = 0x1234567890abcdefull;
	big[(1 << 24) / 8 - 1] = 42;
	atomic_store(flag, (uint32_t)nx_arena_offset(&a, big));
	nx_futex_wake(flag, 1);
	assert_int_equal(wait_exit(pid, 10), 0);

	/* The reservation is a hard limit, reported, not a crash. */
	assert_null(nx_arena_alloc(&a, (size_t)1 << 31, &err));
	assert_non_null(strstr(err.msg, "arena"));
	nx_arena_destroy(&a);
}

struct bar_shared {
	struct nx_barrier b;
	_Atomic uint32_t abort;
	_Atomic uint32_t slot[8];
};

static void test_barrier_processes(void **state)
{
	enum { N = 3, ROUNDS = 3000 };
	struct bar_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	nx_barrier_init(&sh->b, N);
	uint32_t spin = nx_spin_calibrate() * 5; /* ~5 us */
	pid_t pids[N];
	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			/* Alternate spinning and sleeping so both paths of the barrier run. */
			for (uint32_t r = 1; r <= ROUNDS; r++) {
				atomic_store(&sh->slot[i], r);
				if ((r + i) % 7 == 0)
					usleep(200);
				if (nx_barrier_wait(&sh->b, &sh->abort, r % 2 ? spin : 0))
					_exit(2);
				for (int j = 0; j < N; j++)
					if (atomic_load(&sh->slot[j]) != r)
						_exit(3);
				if (nx_barrier_wait(&sh->b, &sh->abort, spin))
					_exit(2);
			}
			_exit(0);
		}
	}
	for (int i = 0; i < N; i++)
		assert_int_equal(wait_exit(pids[i], 60), 0);
	munmap(sh, sizeof(*sh));
}

static void test_abort_wakes_waiters(void **state)
{
	enum { N = 3 };
	struct bar_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	nx_barrier_init(&sh->b, N);
	pid_t pids[N - 1];
	/* Only N-1 participants come: without the abort they would wait forever. */
	for (int i = 0; i < N - 1; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			atomic_fetch_add(&sh->slot[0], 1);
			int r = nx_barrier_wait(&sh->b, &sh->abort, i == 0 ? 0 : 1000);
			_exit(r == -1 ? 7 : 1);
		}
	}
	double t0 = now_s();
	while (atomic_load(&sh->slot[0]) < N - 1 && now_s() - t0 < 5)
		usleep(1000);
	usleep(50000); /* let both reach FUTEX_WAIT */
	atomic_store(&sh->abort, 1);
	nx_barrier_abort(&sh->b);
	for (int i = 0; i < N - 1; i++)
		assert_int_equal(wait_exit(pids[i], 5), 7);
	/* Arriving after the abort returns at once too. */
	assert_int_equal(nx_barrier_wait(&sh->b, &sh->abort, 0), -1);
	munmap(sh, sizeof(*sh));
}

/* --- the step protocol with a synthetic step */

#define NW 2
#define VEC 4096

struct step_shared {
	int64_t in[VEC];
	int64_t part[NW], part2[NW];
	int64_t out, out2;
	_Atomic uint32_t slow; /* > 0: the step spins through this many extra barriers */
	_Atomic uint32_t entered;
	_Atomic uint32_t lag;    /* band 1 sleeps after each piece it takes */
	_Atomic uint32_t stolen; /* pieces of band 1's range that band 0 took */
};

/* Each band sums its share of in[], barrier, band 0 adds the partial sums.
 * The sum is done twice, from two splits open at once (tag 0 taken in pieces
 * of at least 7, tag 1 of at least 5), so each element must be handed out exactly
 * once per split, every step, with no reset between steps. With lag set, band
 * 1 sleeps after each piece it takes, so band 0 has to take from the back of
 * band 1's range [m/2, m) (counted in stolen). */
static void sum_step(void *arg, uint32_t band, uint32_t n_bands, int32_t n, void (*barrier)(void *),
		     nx_ctl_take_fn take, void *bctx)
{
	struct step_shared *s = arg;
	atomic_fetch_add(&s->entered, 1);
	const int m = n < VEC ? n : VEC;
	const bool lag = atomic_load(&s->lag);
	int64_t acc = 0, acc2 = 0;
	uint32_t u0, u1;
	while (take(bctx, 0, band, (uint32_t)m, 7, &u0, &u1)) {
		for (uint32_t i = u0; i < u1; i++)
			acc += s->in[i];
		if (band == 0 && (int)u0 >= m / 2)
			atomic_fetch_add(&s->stolen, 1);
		if (band == 1 && lag)
			usleep(200);
	}
	while (take(bctx, 1, band, (uint32_t)m, 5, &u0, &u1))
		for (uint32_t i = u0; i < u1; i++)
			acc2 += s->in[i];
	s->part[band] = acc;
	s->part2[band] = acc2;
	barrier(bctx);
	for (uint32_t k = 0; k < atomic_load(&s->slow); k++) {
		usleep(100);
		barrier(bctx);
	}
	if (band == 0) {
		int64_t t = 0;
		int64_t t2 = 0;
		for (uint32_t b = 0; b < n_bands; b++) {
			t += s->part[b];
			t2 += s->part2[b];
		}
		s->out = t;
		s->out2 = t2;
	}
	barrier(bctx);
}

struct step_env {
	struct nx_arena a;
	struct nx_ctl *c;
	struct step_shared *s;
	pid_t pid[NW];
	unsigned char live[NW];
};

static pid_t spawn_step_worker(struct step_env *e, uint32_t band, uint32_t seen_gen)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(nx_ctl_worker_loop(e->c, band, seen_gen, sum_step, e->s) == 0 ? 0 : 1);
	return pid;
}

/* The supervisor's wait: until every live worker acked gen. */
static int wait_acked(struct step_env *e, uint32_t gen, double timeout_s)
{
	double t0 = now_s();
	while (!nx_ctl_acked(e->c, NW, gen, e->live)) {
		uint32_t b = atomic_load(&e->c->bell);
		if (nx_ctl_acked(e->c, NW, gen, e->live))
			break;
		struct timespec ts = { 0, 2000000 };
		nx_futex_wait(&e->c->bell, b, &ts);
		if (now_s() - t0 > timeout_s)
			return -1;
	}
	return 0;
}

static void test_step_protocol_and_retry(void **state)
{
	struct step_env e;
	struct nx_err err = {{0}};
	memset(&e, 0, sizeof(e));
	assert_int_equal(nx_arena_create(&e.a, "test-step", (size_t)1 << 26, &err), 0);
	void *cm = nx_arena_alloc(&e.a, nx_ctl_shm_size(NW), &err);
	assert_non_null(cm);
	e.c = nx_ctl_shm_init(cm, NW, VEC, nx_spin_calibrate() * 5);
	e.s = nx_arena_alloc(&e.a, sizeof(*e.s), &err);
	assert_non_null(e.s);
	for (int i = 0; i < NW; i++) {
		e.pid[i] = spawn_step_worker(&e, (uint32_t)i, 0);
		e.live[i] = 1;
	}
	/* Both report ready through the bell. */
	double t0 = now_s();
	while ((atomic_load(&e.c->w[0].state) != NXW_READY || atomic_load(&e.c->w[1].state) != NXW_READY) &&
	       now_s() - t0 < 5)
		usleep(1000);
	assert_int_equal(atomic_load(&e.c->w[1].state), NXW_READY);

	/* Many steps with different inputs, every tenth with band 1 lagging:
	 * each result exact, and band 0 took over part of band 1's range. */
	for (int step = 1; step <= 300; step++) {
		int n = 1 + (step * 37) % VEC;
		atomic_store(&e.s->lag, step % 10 == 0);
		atomic_store(&e.s->stolen, 0);
		int64_t want = 0;
		for (int i = 0; i < n; i++) {
			e.s->in[i] = (int64_t)step * 1000 + i;
			want += e.s->in[i];
		}
		uint32_t g = nx_ctl_launch(e.c, n);
		assert_int_equal(wait_acked(&e, g, 10), 0);
		assert_true(e.s->out == want);
		assert_true(e.s->out2 == want);
		if (step % 10 == 0 && n >= 1000) /* band 1 sleeps >= 14 ms */
			assert_true(atomic_load(&e.s->stolen) > 0);
	}
	assert_true(atomic_load(&e.c->w[0].steps) == 300);

	/* A worker killed mid-step: abort, survivors leave, respawn, same step again. */
	atomic_store(&e.s->slow, 100000); /* ~10 s of barriers unless aborted */
	atomic_store(&e.s->entered, 0);
	int n = VEC;
	int64_t want = 0;
	for (int i = 0; i < n; i++) {
		e.s->in[i] = 7 * i;
		want += e.s->in[i];
	}
	uint32_t g = nx_ctl_launch(e.c, n);
	while (atomic_load(&e.s->entered) < NW)
		usleep(1000);
	usleep(20000);
	kill(e.pid[1], SIGKILL);
	assert_int_equal(wait_exit(e.pid[1], 5), 128 + SIGKILL);
	e.live[1] = 0;
	t0 = now_s();
	nx_ctl_abort(e.c);
	assert_int_equal(wait_acked(&e, g, 5), 0);
	assert_true(now_s() - t0 < 2.0); /* the survivor left promptly */
	assert_true(atomic_load(&e.c->w[0].aborts) == 1);
	atomic_store(&e.s->slow, 0);
	e.pid[1] = spawn_step_worker(&e, 1, atomic_load(&e.c->step_gen));
	e.live[1] = 1;
	nx_ctl_reset(e.c, NW, VEC, nx_spin_calibrate() * 5);
	g = nx_ctl_launch(e.c, n);
	assert_int_equal(wait_acked(&e, g, 10), 0);
	assert_true(e.s->out == want);

	/* Quit: both exit 0. */
	nx_ctl_quit(e.c);
	for (int i = 0; i < NW; i++)
		assert_int_equal(wait_exit(e.pid[i], 5), 0);
	nx_arena_destroy(&e.a);
}

/* Bytes of memory the memfd holds (its pages, not its size). */
static long long memfd_bytes(int fd)
{
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	return (long long)st.st_blocks * 512;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static void test_blocks_reuse_merge_punch(void **state)
{
	const size_t P = NX_ARENA_ALIGN;
	struct nx_arena a;
	struct nx_blocks b;
	struct nx_err err = {{0}};
	assert_int_equal(nx_arena_create(&a, "test-blocks", (size_t)1 << 30, &err), 0);
	nx_blocks_init(&b, &a);
	assert_true(nx_blocks_round(1) == P && nx_blocks_round(P) == P && nx_blocks_round(P + 1) == 2 * P);

	/* Fresh blocks come one after the other from the arena, whole pages. */
	uint8_t *x = nx_blocks_alloc(&b, 1, &err), *y = nx_blocks_alloc(&b, 2 * P, &err),
		*z = nx_blocks_alloc(&b, P, &err), *w = nx_blocks_alloc(&b, P, &err);
	assert_non_null(x);
	assert_true(y == x + P && z == y + 2 * P && w == z + P);
	size_t used = a.used;
	memset(x, 1, P);
	memset(y, 2, 2 * P);
	memset(z, 3, P);
	long long held = memfd_bytes(a.fd);

	/* A freed block's pages go back to the kernel and read as zeros. */
	assert_int_equal(nx_blocks_free(&b, y, 2 * P), 0);
	assert_true(memfd_bytes(a.fd) <= held - (long long)(2 * P)); /* before reading faults them in again */
	assert_true(all_zero(y, 2 * P));
	assert_true(x[P - 1] == 1 && z[0] == 3);
	assert_true(b.n_free == 1 && b.free[0].off == (size_t)(y - a.base) && b.free[0].size == 2 * P);

	/* Reuse: first fit, from the start of the free range; the arena does not grow. */
	uint8_t *r = nx_blocks_alloc(&b, P, &err);
	assert_true(r == y && a.used == used);
	assert_true(b.n_free == 1 && b.free[0].off == (size_t)(y + P - a.base) && b.free[0].size == P);
	assert_int_equal(nx_blocks_free(&b, r, P), 0);
	assert_true(b.n_free == 1 && b.free[0].size == 2 * P); /* merged with the range after it */

	/* Freeing the blocks on either side merges all into one range. */
	assert_int_equal(nx_blocks_free(&b, z, P), 0);
	assert_true(b.n_free == 1 && b.free[0].size == 3 * P);
	assert_int_equal(nx_blocks_free(&b, x, 1), 0);
	assert_true(b.n_free == 1 && b.free[0].off == (size_t)(x - a.base) && b.free[0].size == 4 * P);
	assert_true(all_zero(x, 4 * P));

	/* Not adjacent: two ranges, sorted by offset. */
	uint8_t *big = nx_blocks_alloc(&b, 5 * P, &err); /* fits no free range: carved */
	assert_true(big == w + P && a.used == used + 5 * P);
	assert_int_equal(nx_blocks_free(&b, big, 5 * P), 0);
	assert_true(b.n_free == 2 && b.free[0].off < b.free[1].off);
	assert_int_equal(nx_blocks_free(&b, w, P), 0); /* the gap between them */
	assert_true(b.n_free == 1 && b.free[0].size == 10 * P);

	/* A block as big as everything freed is all of it, zero-filled. */
	uint8_t *all = nx_blocks_alloc(&b, 10 * P, &err);
	assert_true(all == x && b.n_free == 0 && a.used == used + 5 * P);
	assert_true(all_zero(all, 10 * P));
	assert_int_equal(nx_blocks_free(&b, NULL, P), 0);

	nx_blocks_release(&b);
	nx_arena_destroy(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_size_arith),
		cmocka_unit_test(test_arena_grow_visible_after_fork),
		cmocka_unit_test(test_blocks_reuse_merge_punch),
		cmocka_unit_test(test_barrier_processes),
		cmocka_unit_test(test_abort_wakes_waiters),
		cmocka_unit_test(test_step_protocol_and_retry),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
