/* env.h - the environment variables that configure the engine and the daemon, read once at start into one struct. */
#ifndef NX_ENV_H
#define NX_ENV_H

#include <stdbool.h>

/* Every variable nxd, its workers and the tools read (docs/nxd.8, ENVIRONMENT),
 * but the client's socket path (NXD_SOCKET, XDG_RUNTIME_DIR: proto/proto.c)
 * and systemd's own (LISTEN_FDS, NOTIFY_SOCKET: libsystemd):
 *
 *   variable                  field                 meaning
 *   NX_KERN                   kern                  the strongest kernel set to use: ref, avx2, avx512 or amx
 *                                                   (kern/cpu.h applies it); unset: the strongest the CPU runs
 *   NX_HUGE                   huge                  "0": the weights on 4 KiB pages; else 2 MiB ones
 *   NX_PACK                   pack                  "0": no tile-kernel layout (model/repack.h); else packed
 *   NXD_PROFILE               profile               "1": workers time the phases of every step
 *   NXD_SPIN_US               spin_us               microseconds a waiter spins before the futex (default 20;
 *                                                   strtol's value, the daemon clamps it to 0..10000)
 *   NXD_FUTEX_THREAD          futex_thread          set (any value): wait for steps on a helper thread, not
 *                                                   io_uring's futex op (test hook)
 *   NXD_SECCOMP_TRAP          seccomp_trap          set (any value): a worker's forbidden syscall is named
 *                                                   in the log before the worker dies (debugging)
 *   NXD_TEST_WORKER_SYSCALL   test_worker_syscall   "NAME[:STEP][+]": worker 0 calls a forbidden syscall
 *   NXD_TEST_WORKER_SCRIBBLE  test_worker_scribble  "F1,F2,...[:STEP]": worker 0 scribbles on a field and hangs
 *   NXD_TEST_SPEC_SHARED      test_spec_shared      set (any value): drafts beside other sequences are not held
 *                                                   to NXD_SPEC_SHARED_COST (test hook: mixed steps)
 *   NXD_TEST_SPEC_FIT         test_spec_fit         "A,B,C[/A',B',C']": the step-time fit t = A + B n + C r
 *                                                   (seconds) that speculation's cost rules use instead of the
 *                                                   measured one; after "/" the draft model's (else the same)
 *                                                   (test hook: a compute- or a bandwidth-bound host)
 *   NXD_TEST_AMX_EMULATE      test_amx_emulate      set (any value): where the pack family runs avx512 (no
 *                                                   AMX), steps of many tokens take the AMX kernels with each
 *                                                   tile instruction emulated (test hook: kern/pack_amx.c)
 *   JOURNAL_STREAM            journal               set by systemd: log lines carry <priority> prefixes
 *
 * The strings are getenv's; NULL when unset or empty. */
struct nx_env {
	const char *kern;
	bool huge;
	bool pack;
	bool profile;
	long spin_us;
	bool futex_thread;
	bool seccomp_trap;
	const char *test_worker_syscall;
	const char *test_worker_scribble;
	bool journal;
	bool test_spec_shared;
	const char *test_spec_fit;
	bool test_amx_emulate;
};

/* The process's, read before main (a constructor): the same in every thread,
 * and in every worker, which inherits it with the fork. */
const struct nx_env *nx_env(void);

/* Reads the environment into e as nx_env() does (for tests). */
void nx_env_read(struct nx_env *e);

#endif
