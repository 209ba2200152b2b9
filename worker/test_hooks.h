/* test_hooks.h - faults the tests make a worker commit on purpose; nothing happens unless the environment asks.
 *
 *   NXD_TEST_WORKER_SYSCALL=NAME       band 0 calls a syscall the sandbox forbids (open, socket,
 *                                      execve, ptrace; else getuid) at every start
 *   NXD_TEST_WORKER_SYSCALL=NAME:N     ... in the N-th step of band 0's first process
 *   NXD_TEST_WORKER_SYSCALL=NAME:N+    ... in the N-th step of each of band 0's processes
 *   NXD_TEST_WORKER_SCRIBBLE=F1,F2,...[:STEP]
 *                                      band 0's k-th process writes garbage on field Fk at the
 *                                      start of its STEP-th step (default 3), then hangs; "hang"
 *                                      writes nothing (only the step watchdog can tell)
 *
 * The tests watch the supervisor survive them: seccomp kills (docs/reliability.md
 * 22), a block a worker scribbled on (21), a silent hang (the watchdog). */
#ifndef NXW_TEST_HOOKS_H
#define NXW_TEST_HOOKS_H

#include "worker/worker.h"

struct nxw_hooks {
	char syscall[32];
	long syscall_step;  /* the step it is called in (1-based); 0: just inside the sandbox; -1: none */
	char scribble[32];  /* the field */
	long scribble_step; /* the step it is written in (1-based); -1: none */
	long steps;         /* steps this process has begun */
};

/* The supervisor at start: what the environment asks, one line each through
 * warn ("worker 0 will ..."), so a log shows the faults were wanted. */
void nxw_hooks_announce(void (*warn)(const char *what));
/* A new worker, before the sandbox: the hooks armed for this process. */
void nxw_hooks_init(struct nxw_hooks *h, const struct nxw_spec *s);
/* Just inside the sandbox. */
void nxw_hooks_sandboxed(const struct nxw_hooks *h, const struct nxw_spec *s);
/* At the start of each step. */
void nxw_hooks_step(struct nxw_hooks *h, const struct nxw_spec *s);

#endif
