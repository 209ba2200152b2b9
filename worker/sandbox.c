/* sandbox.c - the worker's seccomp allowlist, rlimits and fd hygiene. */
#define _GNU_SOURCE
#include "worker/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

/* Syscalls a worker makes after the filter is loaded. Found by running the
 * workers under `strace -f` through start-up, steps, aborts and exit (see
 * tests/py/test_daemon.py::test_worker_syscalls), not guessed:
 *   futex           step and barrier waits/wakes (arguments filtered below)
 *   write           log lines, to log_fd only
 *   exit_group/exit leaving
 *   rt_sigreturn, restart_syscall   kernel-driven around signals
 *   sched_yield, clock_nanosleep    harmless waits
 *   clock_gettime   the vDSO falls back to the syscall on some clock sources
 *   getpid          harmless */
static const int allowed_plain[] = {
	SCMP_SYS(exit), SCMP_SYS(exit_group), SCMP_SYS(rt_sigreturn), SCMP_SYS(restart_syscall),
	SCMP_SYS(sched_yield), SCMP_SYS(clock_nanosleep), SCMP_SYS(clock_gettime), SCMP_SYS(getpid),
};

int nxw_filter_build(struct nxw_filter *f, int log_fd, bool trap, struct nx_err *err)
{
	memset(f, 0, sizeof(*f));
	f->log_fd = log_fd;
	f->trap = trap;
	scmp_filter_ctx ctx = seccomp_init(trap ? SCMP_ACT_TRAP : SCMP_ACT_KILL_PROCESS);
	int rc = 0, mfd = -1;
	if (!ctx)
		return nx_errf(err, "seccomp: seccomp_init failed");
	for (size_t i = 0; i < sizeof(allowed_plain) / sizeof(allowed_plain[0]) && rc == 0; i++)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, allowed_plain[i], 0);
	/* futex: only the shared FUTEX_WAIT and FUTEX_WAKE. The op is an int, so
	 * compare its low 32 bits exactly: FUTEX_PRIVATE_FLAG (128), requeue, PI
	 * and every other op fall through to the default action. */
	if (rc == 0)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(futex), 1,
				      SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, FUTEX_WAIT));
	if (rc == 0)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(futex), 1,
				      SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, FUTEX_WAKE));
	if (rc == 0)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(write), 1,
				      SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, (scmp_datum_t)log_fd));
#if defined(__SANITIZE_ADDRESS__)
	/* ASan builds only: __asan_handle_no_return, run before the
	 * __builtin_longjmp that leaves an aborted step, asks sigaltstack(NULL,
	 * &old) where the stack is (found with NXD_SECCOMP_TRAP=1: syscall 131).
	 * A query only: setting a stack (arg0 != NULL) is still refused. */
	if (rc == 0)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(sigaltstack), 1, SCMP_A0(SCMP_CMP_EQ, 0));
#endif
	if (rc < 0) {
		seccomp_release(ctx);
		return nx_errf(err, "seccomp: adding a rule failed: %s", strerror(-rc));
	}
	/* Export the BPF once; every worker loads this program as is. */
	mfd = memfd_create("nxd-seccomp", MFD_CLOEXEC);
	if (mfd < 0) {
		seccomp_release(ctx);
		return nx_errf(err, "seccomp: memfd_create failed: %s", strerror(errno));
	}
	rc = seccomp_export_bpf(ctx, mfd);
	seccomp_release(ctx);
	if (rc < 0) {
		close(mfd);
		return nx_errf(err, "seccomp: seccomp_export_bpf failed: %s", strerror(-rc));
	}
	off_t len = lseek(mfd, 0, SEEK_END);
	if (len <= 0 || len % sizeof(struct sock_filter) || len / sizeof(struct sock_filter) > BPF_MAXINSNS) {
		close(mfd);
		return nx_errf(err, "seccomp: exported program has a bad size (%lld bytes)", (long long)len);
	}
	f->insns = malloc((size_t)len);
	if (!f->insns || pread(mfd, f->insns, (size_t)len, 0) != len) {
		free(f->insns);
		f->insns = NULL;
		close(mfd);
		return nx_errf(err, "seccomp: reading back the exported program failed");
	}
	f->len = (unsigned short)(len / sizeof(struct sock_filter));
	close(mfd);
	return 0;
}

void nxw_filter_free(struct nxw_filter *f)
{
	free(f->insns);
	f->insns = NULL;
	f->len = 0;
}

/* Debug mode (NXD_SECCOMP_TRAP=1): name the syscall, then die. Only write and
 * exit_group, both allowed. */
static int trap_log_fd = -1;
static void on_sigsys(int sig, siginfo_t *si, void *uc)
{
	char buf[96];
	int n = snprintf(buf, sizeof(buf), "nxw[%d]: seccomp: forbidden syscall %d\n", (int)getpid(),
			 si->si_syscall);
	if (n > 0 && write(trap_log_fd, buf, (size_t)n) < 0) {
		/* nothing left to report to */
	}
	_exit(128 + SIGSYS);
}

/* First in line for the OOM killer: a worker owns nothing that is lost with
 * it (its memory is the arena and the weights, which stay), and the
 * supervisor runs its step again and forks it anew, while the supervisor's
 * death would end every client's stream. Raising one's own score needs no
 * privilege; where it fails (no /proc) the worker still works, and says so. */
static void oom_first(int log_fd)
{
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd >= 0 && write(fd, "1000", 4) == 4) {
		close(fd);
		return;
	}
	int e = errno;
	if (fd >= 0)
		close(fd);
	dprintf(log_fd, "worker (pid %d): writing 1000 to /proc/self/oom_score_adj failed: %s; under memory "
		"pressure the kernel may kill the supervisor before a worker\n", (int)getpid(), strerror(e));
}

int nxw_sandbox_enter(const struct nxw_filter *f, pid_t parent, struct nx_err *err)
{
	oom_first(f->log_fd);
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		return nx_errf(err, "sandbox: prctl(PR_SET_PDEATHSIG) failed: %s", strerror(errno));
	/* The parent may have died between fork and the prctl: then nobody will
	 * send the signal, and we are already reparented. */
	if (getppid() != parent)
		return nx_errf(err, "sandbox: supervisor %d is gone", (int)parent);

	/* Nothing is open but the log: the worker never needs an fd (its memory
	 * was mapped before the fork), and a stray socket or the io_uring fd
	 * inherited from the supervisor would be a way out. */
	int lf = f->log_fd;
	if (lf > 0 && syscall(SYS_close_range, 0u, (unsigned)lf - 1, 0u) < 0)
		return nx_errf(err, "sandbox: close_range(0, %d) failed: %s", lf - 1, strerror(errno));
	if (syscall(SYS_close_range, (unsigned)lf + 1, ~0u, 0u) < 0)
		return nx_errf(err, "sandbox: close_range(%d, ~0) failed: %s", lf + 1, strerror(errno));

	/* NOFILE 0: no new fd can exist even if a syscall slipped through; the
	 * open log fd keeps working. FSIZE 0 is safe because the log fd is a
	 * pipe to the supervisor, not a file. CORE 0: a seccomp kill would
	 * otherwise dump the whole arena. NPROC 0: no fork (root is exempt, the
	 * filter still stops it). */
	static const struct { int res; const char *name; } lim[] = {
		{ RLIMIT_NOFILE, "RLIMIT_NOFILE" }, { RLIMIT_NPROC, "RLIMIT_NPROC" },
		{ RLIMIT_FSIZE, "RLIMIT_FSIZE" },   { RLIMIT_CORE, "RLIMIT_CORE" },
	};
	for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
		struct rlimit rl = { 0, 0 };
		if (setrlimit(lim[i].res, &rl) < 0)
			return nx_errf(err, "sandbox: setrlimit(%s, 0) failed: %s", lim[i].name, strerror(errno));
	}

	if (f->trap) {
		trap_log_fd = lf;
		struct sigaction sa = { .sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO };
		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGSYS, &sa, NULL) < 0)
			return nx_errf(err, "sandbox: sigaction(SIGSYS) failed: %s", strerror(errno));
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return nx_errf(err, "sandbox: prctl(PR_SET_NO_NEW_PRIVS) failed: %s", strerror(errno));
	struct sock_fprog prog = { .len = f->len, .filter = f->insns };
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
		return nx_errf(err, "sandbox: seccomp(SECCOMP_SET_MODE_FILTER) failed: %s", strerror(errno));
	return 0;
}
