/* worker.c - a worker process: pin, protect, sandbox, then run its band of every step until told to quit. */
#define _GNU_SOURCE
#include "worker/worker.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "shm/arena.h"
#include "worker/test_hooks.h"

struct nxw {
	const struct nxw_spec *s;
	struct nxw_hooks hooks;
};

void nxw_log(const struct nxw_spec *s, const char *fmt, ...)
{
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "worker %d (pid %d): ", s->band, (int)getpid());
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
	if (write(s->log_fd, buf, (size_t)n) < 0) {
		/* the supervisor is not reading; the line is dropped, never waited for */
	}
}

_Static_assert(NX_SYNC_TAKE_UNITS <= NX_BARRIER_TAKE_UNITS, "forward's splits must fit the barrier's ranges");

static void step(void *arg, uint32_t band, uint32_t n_bands, int32_t n, void (*barrier)(void *),
		 nx_ctl_take_fn take, void *bctx)
{
	struct nxw *w = arg;
	const struct nxw_spec *s = w->s;
	nxw_hooks_step(&w->hooks, s);
	struct nx_sync sync = { .barrier = barrier, .take = take, .ctx = bctx };
	if (s->step_model && *s->step_model == NXW_STEP_DRAFT)
		nx_forward(s->draft_model, s->draft_state, s->toks, n, (int)band, (int)n_bands, s->draft_scratch, &sync);
	else
		nx_forward(s->model, s->state, s->toks, n, (int)band, (int)n_bands, s->scratch, &sync);
}

/* The supervisor blocks its signals for signalfd; a worker takes SIGTERM the
 * default way. A terminal's Ctrl-C (SIGINT to the whole process group) and
 * SIGHUP are the supervisor's to act on: it stops the workers itself.
 * SIGPIPE stays ignored. */
static void take_signals(void)
{
	signal(SIGINT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}

/* "nxd-worker-3" in ps/top (comm is 15 bytes at most), on its own CPU. */
static void name_and_pin(const struct nxw_spec *s)
{
	char comm[16];
	snprintf(comm, sizeof(comm), "nxd-worker-%d", s->band);
	prctl(PR_SET_NAME, comm, 0, 0, 0);

	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(s->cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0)
		nxw_log(s, "sched_setaffinity(cpu %d) failed: %s; running unpinned", s->cpu, strerror(errno));
}

/* The model struct is read-only from here on (the weights are already,
 * daemon/model.c): a stray write faults in this worker instead of
 * corrupting every step. */
static void protect(const struct nxw_spec *s)
{
	for (int i = 0; i < s->n_ro; i++) {
		uintptr_t a = (uintptr_t)s->ro[i].p & ~(uintptr_t)(NX_ARENA_ALIGN - 1);
		size_t len = s->ro[i].len + ((uintptr_t)s->ro[i].p - a);
		if (mprotect((void *)a, len, PROT_READ) < 0) {
			nxw_log(s, "mprotect(%zu bytes, PROT_READ) failed: %s", len, strerror(errno));
			_exit(70);
		}
	}
}

_Noreturn void nxw_main(const struct nxw_spec *s)
{
	struct nxw w = { .s = s };
	struct nx_err err = {{0}};

	take_signals();
	nxw_hooks_init(&w.hooks, s);
	name_and_pin(s);
	protect(s);

	atomic_store(&s->ctl->w[s->band].pid, (uint32_t)getpid());
	s->ctl->w[s->band].cpu = (uint32_t)s->cpu;

	if (nxw_sandbox_enter(s->filter, s->parent, &err) < 0) {
		nxw_log(s, "%s", err.msg);
		_exit(71);
	}
	/* Sandboxed: only futex, write(log), exit and a few harmless calls from here. */
	nxw_hooks_sandboxed(&w.hooks, s);

	nx_ctl_worker_loop(s->ctl, (uint32_t)s->band, s->seen_gen, step, &w);
	_exit(0);
}
