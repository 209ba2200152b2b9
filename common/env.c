/* env.c - reads the environment variables of common/env.h once, before main. */
#include "common/env.h"

#include <stdlib.h>
#include <string.h>

static struct nx_env env;

/* The value, or NULL when unset or empty. */
static const char *value(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

static bool is(const char *name, const char *want)
{
	const char *v = getenv(name);
	return v && !strcmp(v, want);
}

void nx_env_read(struct nx_env *e)
{
	const char *spin = getenv("NXD_SPIN_US");
	*e = (struct nx_env){
		.kern = value("NX_KERN"),
		.huge = !is("NX_HUGE", "0"),
		.pack = !is("NX_PACK", "0"),
		.profile = is("NXD_PROFILE", "1"),
		.spin_us = spin ? strtol(spin, NULL, 10) : 20,
		.futex_thread = getenv("NXD_FUTEX_THREAD") != NULL,
		.seccomp_trap = getenv("NXD_SECCOMP_TRAP") != NULL,
		.test_worker_syscall = value("NXD_TEST_WORKER_SYSCALL"),
		.test_worker_scribble = value("NXD_TEST_WORKER_SCRIBBLE"),
		.journal = getenv("JOURNAL_STREAM") != NULL,
		.test_spec_shared = value("NXD_TEST_SPEC_SHARED") != NULL,
		.test_spec_fit = value("NXD_TEST_SPEC_FIT"),
		.test_amx_emulate = value("NXD_TEST_AMX_EMULATE") != NULL,
	};
}

/* Before main, so that no thread or worker ever reads the environment itself. */
__attribute__((constructor)) static void env_at_start(void)
{
	nx_env_read(&env);
}

const struct nx_env *nx_env(void)
{
	return &env;
}
