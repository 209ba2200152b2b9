/* sandbox.h - what a worker locks itself into before its first step.
 *
 * The seccomp filter is built once in the supervisor (libseccomp allocates;
 * a failure is a start-up error there, not a dying worker) and exported as
 * BPF; each forked worker loads the same program with one seccomp(2) call. */
#ifndef NXW_SANDBOX_H
#define NXW_SANDBOX_H

#include <linux/filter.h>
#include <stdbool.h>
#include <sys/types.h>

#include "common/err.h"

struct nxw_filter {
	struct sock_filter *insns;
	unsigned short len;
	int log_fd;  /* the only fd write(2) is allowed on */
	bool trap;   /* debug: SIGSYS handler names the syscall instead of a silent kill */
};

/* Builds the allowlist: futex (FUTEX_WAIT / FUTEX_WAKE only, shared),
 * exit, exit_group, rt_sigreturn, restart_syscall, sched_yield,
 * clock_nanosleep, clock_gettime, getpid, write(log_fd). Everything else:
 * SCMP_ACT_KILL_PROCESS (or SCMP_ACT_TRAP when trap is set). */
int nxw_filter_build(struct nxw_filter *f, int log_fd, bool trap, struct nx_err *err);
void nxw_filter_free(struct nxw_filter *f);

/* Runs in the forked worker, after every mapping is in place: oom_score_adj
 * 1000 (the OOM killer takes a worker before the supervisor), parent-death
 * signal (and a getppid() check against parent, for a parent that died
 * before the prctl), every fd but log_fd closed, rlimits NOFILE / NPROC /
 * FSIZE / CORE at 0, no_new_privs, then the filter. */
int nxw_sandbox_enter(const struct nxw_filter *f, pid_t parent, struct nx_err *err);

#endif
