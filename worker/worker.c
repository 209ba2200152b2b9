/* worker.c - a worker process: pin, protect, sandbox, then run its band of every step until told to quit. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

struct nxw {
	int band;
	int log_fd;
	const struct nx_model *model;   /* in the arena */
	struct nx_state *state;         /* in the arena */
	const struct nx_tok_in *toks;   /* the step descriptor */
	struct nx_scratch *scratch;     /* this worker's */
	const char *test_syscall;       /* test hook, see forbidden() */
	long test_step;                 /* call it in this step (1-based); 0: at start */
	long steps;
	struct nx_ctl *ctl;             /* for the scribble hook only */
	const char *scribble;           /* test hook, see scribble() */
	long scribble_step;
};

/* One line on the log pipe, prefixed with who we are. Only snprintf and write:
 * fine inside the sandbox. */
static void wlog(const struct nxw *w, const char *fmt, ...)
{
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "worker %d (pid %d): ", w->band, (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(buf))
		n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(buf) - 1)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(w->log_fd, buf, (size_t)n) < 0) {
		/* the supervisor is not reading; the line is dropped, never waited for */
	}
}

/* Test hook (NXD_TEST_WORKER_SYSCALL): a syscall the sandbox forbids, so the
 * tests can watch the filter kill the worker (SIGSYS) and the supervisor
 * replace it. */
static void forbidden(const struct nxw *w)
{
	const char *s = w->test_syscall;
	wlog(w, "test hook: calling forbidden syscall %s", s);
	if (!strcmp(s, "open"))
		syscall(SYS_openat, AT_FDCWD, "/etc/hostname", O_RDONLY);
	else if (!strcmp(s, "socket"))
		syscall(SYS_socket, AF_UNIX, SOCK_STREAM, 0);
	else if (!strcmp(s, "execve"))
		syscall(SYS_execve, "/bin/true", NULL, NULL);
	else if (!strcmp(s, "ptrace"))
		syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0);
	else
		syscall(SYS_getuid);
	wlog(w, "test hook: %s was allowed", s);
}

/* Test hook (NXD_TEST_WORKER_SCRIBBLE=FIELD[,FIELD...][:STEP]): the k-th
 * process of band 0, at the start of its STEP-th step (default 3), writes
 * garbage on the k-th FIELD where a buggy worker might, then hangs without a
 * syscall the sandbox forbids, so the supervisor has to notice by validating
 * what it reads (guard.c), not by a death. FIELD "hang" writes nothing: only
 * the step watchdog can tell. */
static void scribble(struct nxw *w)
{
	struct nx_ctl *c = w->ctl;
	const char *f = w->scribble;
	wlog(w, "test hook: scribbling on %s, then hanging", f);
	if (!strcmp(f, "step_gen"))
		atomic_fetch_add(&c->step_gen, 1000);
	else if (!strcmp(f, "step_n"))
		c->step_n = 0x7fff0000;
	else if (!strcmp(f, "ack_gen"))
		atomic_store(&c->w[w->band].ack_gen, 0xdeadbeefu);
	else if (!strcmp(f, "wstate"))
		atomic_store(&c->w[w->band].state, 77);
	else if (!strcmp(f, "abort"))
		atomic_store(&c->abort, 1);
	else if (!strcmp(f, "quit"))
		atomic_store(&c->quit, 1);
	else if (!strcmp(f, "done"))
		atomic_store(&c->done, 0xfffffff0u);
	else if (!strcmp(f, "barrier"))
		c->barrier.n = 0x7fffffff;
	else if (!strcmp(f, "n_workers"))
		c->n_workers = 0;
	else if (!strcmp(f, "toks"))
		((struct nx_tok_in *)w->toks)[0].pos = 0x7fffffff;
	else if (!strcmp(f, "state"))
		w->state->k_cache = (nx_f16 *)(uintptr_t)0x1000;
	else if (!strcmp(f, "scratch"))
		w->scratch->xn = (float *)(uintptr_t)0x1000;
	_Atomic uint32_t never = 0;
	for (;;)
		nx_futex_wait(&never, 0, NULL);
}

_Static_assert(NX_SYNC_TAKE_UNITS <= NX_BARRIER_TAKE_UNITS, "forward's splits must fit the barrier's ranges");

static void step(void *arg, uint32_t band, uint32_t n_bands, int32_t n, void (*barrier)(void *),
		 nx_ctl_take_fn take, void *bctx)
{
	struct nxw *w = arg;
	w->steps++;
	if (w->test_syscall && w->test_step > 0 && w->steps == w->test_step)
		forbidden(w);
	if (w->scribble && w->steps == w->scribble_step)
		scribble(w);
	struct nx_sync sync = { .barrier = barrier, .take = take, .ctx = bctx };
	nx_forward(w->model, w->state, w->toks, n, (int)band, (int)n_bands, w->scratch, &sync);
}

_Noreturn void nxw_main(struct nxd *d, int band, uint32_t seen_gen)
{
	struct nxd_proc *p = &d->procs[band];
	struct nxw w = {
		.band = band,
		.log_fd = d->wlog_wr,
		.model = d->shm.model,
		.state = d->shm.state_shared,
		.toks = d->shm.toks,
		.scratch = &d->shm.scratch[band],
		.test_step = -1,
	};
	struct nx_err err = {{0}};

	/* The supervisor blocks its signals for signalfd; a worker takes SIGTERM
	 * the default way. A terminal's Ctrl-C (SIGINT to the whole process
	 * group) and SIGHUP are the supervisor's to act on: it stops the workers
	 * itself. SIGPIPE stays ignored. */
	signal(SIGINT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	/* Test hook: band 0 only. "NAME" fails every start; "NAME:N" makes the
	 * first process of band 0 fail in its N-th step, "NAME:N+" every one. */
	if (d->test_syscall && band == 0) {
		static char name[32];
		const char *colon = strchr(d->test_syscall, ':');
		size_t len = colon ? (size_t)(colon - d->test_syscall) : strlen(d->test_syscall);
		snprintf(name, sizeof(name), "%.*s", (int)(len < sizeof(name) ? len : sizeof(name) - 1), d->test_syscall);
		if (!colon || !strcmp(colon + 1, "start")) {
			w.test_syscall = name;
			w.test_step = 0;
		} else if (p->spawns == 1 || strchr(colon, '+')) {
			w.test_syscall = name;
			w.test_step = d->test_syscall_step;
		}
	}

	/* "F1,F2,...[:STEP]": the k-th process of band 0 scribbles on Fk. */
	const char *sc = nx_env()->test_worker_scribble;
	if (sc && *sc && band == 0) {
		static char field[32];
		const char *colon = strchr(sc, ':'), *end = colon ? colon : sc + strlen(sc), *f = sc;
		for (uint64_t k = 1; k < p->spawns && f; k++) {
			const char *comma = memchr(f, ',', (size_t)(end - f));
			f = comma ? comma + 1 : NULL;
		}
		if (f) {
			const char *comma = memchr(f, ',', (size_t)(end - f));
			size_t len = (size_t)((comma ? comma : end) - f);
			snprintf(field, sizeof(field), "%.*s", (int)(len < sizeof(field) ? len : sizeof(field) - 1), f);
			w.scribble = field;
			w.scribble_step = colon ? strtol(colon + 1, NULL, 10) : 3;
		}
	}
	w.ctl = d->shm.ctl;

	/* "nxd-worker-3" in ps/top (comm is 15 bytes at most). */
	char comm[16];
	snprintf(comm, sizeof(comm), "nxd-worker-%d", band);
	prctl(PR_SET_NAME, comm, 0, 0, 0);

	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(p->cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0)
		wlog(&w, "sched_setaffinity(cpu %d) failed: %s; running unpinned", p->cpu, strerror(errno));

	/* The model struct is read-only from here on (the weights are already,
	 * daemon/model.c): a stray write faults in this worker instead of
	 * corrupting every step. */
	for (int i = 0; i < d->shm.n_ro; i++) {
		uintptr_t a = (uintptr_t)d->shm.ro[i].p & ~(uintptr_t)(NX_ARENA_ALIGN - 1);
		size_t len = d->shm.ro[i].len + ((uintptr_t)d->shm.ro[i].p - a);
		if (mprotect((void *)a, len, PROT_READ) < 0) {
			wlog(&w, "mprotect(%zu bytes, PROT_READ) failed: %s", len, strerror(errno));
			_exit(70);
		}
	}

	struct nx_ctl *ctl = d->shm.ctl;
	atomic_store(&ctl->w[band].pid, (uint32_t)getpid());
	ctl->w[band].cpu = (uint32_t)p->cpu;

	if (nxw_sandbox_enter(&d->filter, d->pid, &err) < 0) {
		wlog(&w, "%s", err.msg);
		_exit(71);
	}
	/* Sandboxed: only futex, write(log), exit and a few harmless calls from here. */
	if (w.test_syscall && w.test_step == 0)
		forbidden(&w);

	nx_ctl_worker_loop(ctl, (uint32_t)band, seen_gen, step, &w);
	_exit(0);
}
