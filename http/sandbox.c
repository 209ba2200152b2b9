/* sandbox.c - what nxd-http locks itself into once it listens: no new privileges, rlimits, a seccomp allowlist. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/nxh.h"

/* What the loop calls after start-up, found with `strace -f` through the
 * tests (tests/py/test_http.py::test_gateway_syscalls), not guessed:
 *   epoll_*            the loop; libmicrohttpd's own epoll fd
 *   accept4            new HTTP connections (libmicrohttpd)
 *   recvfrom, sendto, sendmsg, read, write, writev   sockets, the
 *                      eventfd libmicrohttpd wakes itself with, stderr
 *   socket (AF_UNIX only), connect   one socket to nxd per request
 *   setsockopt, getsockopt, getsockname, getpeername, fcntl, ioctl
 *                      libmicrohttpd on accepted sockets (nodelay, cork, nonblock)
 *   close, shutdown    ends of connections
 *   brk, mmap, munmap, mremap, madvise, mprotect   malloc; never PROT_EXEC
 *   clock_gettime, gettimeofday   the vDSO's fallbacks
 *   futex, rt_sigprocmask, rt_sigreturn, restart_syscall, sched_yield
 *   exit, exit_group   leaving
 * Nothing opens a file, runs a program, forks or makes a TCP socket. */
static const int allowed_plain[] = {
	SCMP_SYS(epoll_wait), SCMP_SYS(epoll_pwait), SCMP_SYS(epoll_ctl), SCMP_SYS(accept4), SCMP_SYS(accept),
	SCMP_SYS(recvfrom), SCMP_SYS(recvmsg), SCMP_SYS(sendto), SCMP_SYS(sendmsg), SCMP_SYS(read), SCMP_SYS(write),
	SCMP_SYS(readv), SCMP_SYS(writev), SCMP_SYS(connect), SCMP_SYS(setsockopt), SCMP_SYS(getsockopt),
	SCMP_SYS(getsockname), SCMP_SYS(getpeername), SCMP_SYS(fcntl), SCMP_SYS(ioctl), SCMP_SYS(close),
	SCMP_SYS(shutdown), SCMP_SYS(brk), SCMP_SYS(munmap), SCMP_SYS(mremap), SCMP_SYS(madvise),
	SCMP_SYS(clock_gettime), SCMP_SYS(gettimeofday), SCMP_SYS(futex), SCMP_SYS(rt_sigprocmask),
	SCMP_SYS(rt_sigreturn), SCMP_SYS(restart_syscall), SCMP_SYS(sched_yield), SCMP_SYS(exit),
	SCMP_SYS(exit_group), SCMP_SYS(getpid),
};

static int trap_fd = 2;
static void on_sigsys(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	char buf[96];
	int n = snprintf(buf, sizeof(buf), "nxd-http: seccomp: forbidden syscall %d\n", si->si_syscall);
	if (n > 0 && write(trap_fd, buf, (size_t)n) < 0) {
		/* nothing left to report to */
	}
	_exit(128 + SIGSYS);
}

static int rules(scmp_filter_ctx ctx)
{
	int rc = 0;
	for (size_t i = 0; i < sizeof(allowed_plain) / sizeof(allowed_plain[0]) && rc == 0; i++)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, allowed_plain[i], 0);
	/* Sockets to nxd only: a compromised gateway opens no TCP or raw socket. */
	if (rc == 0)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, AF_UNIX));
	/* Memory for malloc, never executable. */
	if (rc == 0)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1,
				      SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
	if (rc == 0)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mprotect), 1,
				      SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
	return rc;
}

int nxh_sandbox_enter(bool trap, char *msg, size_t cap)
{
	/* CORE 0: a crash dumps no request bodies or keys. NPROC 0: no fork
	 * (root is exempt; the filter stops it anyway). */
	struct rlimit zero = { 0, 0 };
	if (setrlimit(RLIMIT_CORE, &zero) < 0 || setrlimit(RLIMIT_NPROC, &zero) < 0) {
		snprintf(msg, cap, "sandbox: setrlimit failed: %s", strerror(errno));
		return -1;
	}
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		snprintf(msg, cap, "sandbox: prctl failed: %s", strerror(errno));
		return -1;
	}
	if (trap) {
		struct sigaction sa = { .sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO };
		sigemptyset(&sa.sa_mask);
		sigaction(SIGSYS, &sa, NULL);
	}
	scmp_filter_ctx ctx = seccomp_init(trap ? SCMP_ACT_TRAP : SCMP_ACT_KILL_PROCESS);
	if (!ctx) {
		snprintf(msg, cap, "sandbox: seccomp_init failed");
		return -1;
	}
	int rc = rules(ctx);
	if (rc == 0)
		rc = seccomp_load(ctx);
	seccomp_release(ctx);
	if (rc < 0) {
		snprintf(msg, cap, "sandbox: loading the seccomp filter failed: %s", strerror(-rc));
		return -1;
	}
	return 0;
}
