/* test_hooks.c - the faults of test_hooks.h: parsed from the environment once per worker, committed at start or in a chosen step. */
#define _GNU_SOURCE
#include "worker/test_hooks.h"

#include "common/env.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>


void nxw_hooks_announce(void (*warn)(const char *what))
{
	char what[160];
	const char *v;
	if ((v = nx_env()->test_worker_syscall)) {
		snprintf(what, sizeof(what), "worker 0 will call forbidden syscall %s", v);
		warn(what);
	}
	if ((v = nx_env()->test_worker_scribble)) {
		snprintf(what, sizeof(what), "worker 0 will scribble on %s and hang", v);
		warn(what);
	}
}

static void copy_word(char *dst, size_t cap, const char *src, size_t len)
{
	snprintf(dst, cap, "%.*s", (int)(len < cap ? len : cap - 1), src);
}

/* "NAME" every start; "NAME:start" the same; "NAME:N" in step N of the first
 * process only; "NAME:N+" in step N of every process. */
static void init_syscall(struct nxw_hooks *h, const struct nxw_spec *s)
{
	const char *v = nx_env()->test_worker_syscall;
	if (!v || s->band != 0)
		return;
	const char *colon = strchr(v, ':');
	if (!colon || !strcmp(colon + 1, "start")) {
		copy_word(h->syscall, sizeof(h->syscall), v, colon ? (size_t)(colon - v) : strlen(v));
		h->syscall_step = 0;
	} else if (s->spawn == 1 || strchr(colon, '+')) {
		copy_word(h->syscall, sizeof(h->syscall), v, (size_t)(colon - v));
		h->syscall_step = strtol(colon + 1, NULL, 10);
	}
}

/* "F1,F2,...[:STEP]": the k-th process of band 0 scribbles on Fk. */
static void init_scribble(struct nxw_hooks *h, const struct nxw_spec *s)
{
	const char *v = nx_env()->test_worker_scribble;
	if (!v || s->band != 0)
		return;
	const char *colon = strchr(v, ':'), *end = colon ? colon : v + strlen(v), *f = v;
	for (uint64_t k = 1; k < s->spawn && f; k++) {
		const char *comma = memchr(f, ',', (size_t)(end - f));
		f = comma ? comma + 1 : NULL;
	}
	if (!f)
		return;
	const char *comma = memchr(f, ',', (size_t)(end - f));
	copy_word(h->scribble, sizeof(h->scribble), f, (size_t)((comma ? comma : end) - f));
	h->scribble_step = colon ? strtol(colon + 1, NULL, 10) : 3;
}

void nxw_hooks_init(struct nxw_hooks *h, const struct nxw_spec *s)
{
	*h = (struct nxw_hooks){ .syscall_step = -1, .scribble_step = -1 };
	init_syscall(h, s);
	init_scribble(h, s);
}

/* A syscall the sandbox forbids: the tests watch the filter kill the worker
 * (SIGSYS) and the supervisor replace it. */
static void forbidden(const struct nxw_hooks *h, const struct nxw_spec *s)
{
	const char *name = h->syscall;
	nxw_log(s, "test hook: calling forbidden syscall %s", name);
	if (!strcmp(name, "open"))
		syscall(SYS_openat, AT_FDCWD, "/etc/hostname", O_RDONLY);
	else if (!strcmp(name, "socket"))
		syscall(SYS_socket, AF_UNIX, SOCK_STREAM, 0);
	else if (!strcmp(name, "execve"))
		syscall(SYS_execve, "/bin/true", NULL, NULL);
	else if (!strcmp(name, "ptrace"))
		syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0);
	else
		syscall(SYS_getuid);
	nxw_log(s, "test hook: %s was allowed", name);
}

/* Garbage where a buggy worker might write it, then a hang without a
 * forbidden syscall: the supervisor has to notice by validating what it
 * reads (daemon/guard.c), not by a death. */
static _Noreturn void scribble(const struct nxw_hooks *h, const struct nxw_spec *s)
{
	struct nx_ctl *c = s->ctl;
	const char *f = h->scribble;
	nxw_log(s, "test hook: scribbling on %s, then hanging", f);
	if (!strcmp(f, "step_gen"))
		atomic_fetch_add(&c->step_gen, 1000);
	else if (!strcmp(f, "step_n"))
		c->step_n = 0x7fff0000;
	else if (!strcmp(f, "ack_gen"))
		atomic_store(&c->w[s->band].ack_gen, 0xdeadbeefu);
	else if (!strcmp(f, "wstate"))
		atomic_store(&c->w[s->band].state, 77);
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
		((struct nx_tok_in *)s->toks)[0].pos = 0x7fffffff;
	else if (!strcmp(f, "state"))
		s->state->k_cache = (nx_f16 *)(uintptr_t)0x1000;
	else if (!strcmp(f, "scratch"))
		s->scratch->xn = (float *)(uintptr_t)0x1000;
	else if (!strcmp(f, "step_model") && s->step_model)
		*(int32_t *)s->step_model = 0x7fff; /* the word is the supervisor's: a buggy worker's write */
	else if (!strcmp(f, "draft_state") && s->draft_state)
		s->draft_state->k_cache = (nx_f16 *)(uintptr_t)0x1000;
	else if (!strcmp(f, "draft_scratch") && s->draft_scratch)
		s->draft_scratch->xn = (float *)(uintptr_t)0x1000;
	_Atomic uint32_t never = 0;
	for (;;)
		nx_futex_wait(&never, 0, NULL);
}

void nxw_hooks_sandboxed(const struct nxw_hooks *h, const struct nxw_spec *s)
{
	if (h->syscall_step == 0)
		forbidden(h, s);
}

void nxw_hooks_step(struct nxw_hooks *h, const struct nxw_spec *s)
{
	h->steps++;
	if (h->syscall_step > 0 && h->steps == h->syscall_step)
		forbidden(h, s);
	if (h->scribble_step > 0 && h->steps == h->scribble_step)
		scribble(h, s);
}
