/* test_env.c - the environment variables' meanings (common/env.h): defaults, the values that switch, empty values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/env.h"

static const char *const names[] = {
	"NX_KERN", "NX_HUGE", "NX_PACK", "NXD_PROFILE", "NXD_SPIN_US", "NXD_FUTEX_THREAD", "NXD_SECCOMP_TRAP",
	"NXD_TEST_WORKER_SYSCALL", "NXD_TEST_WORKER_SCRIBBLE", "JOURNAL_STREAM",
};

static void clear(void)
{
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unsetenv(names[i]);
}

static struct nx_env read_env(void)
{
	struct nx_env e;
	nx_env_read(&e);
	return e;
}

/* Nothing set: huge pages, packing, no profile, a 20 us spin, no hooks. */
static void test_defaults(void **state)
{
	clear();
	const struct nx_env e = read_env();
	assert_null(e.kern);
	assert_true(e.huge);
	assert_true(e.pack);
	assert_false(e.profile);
	assert_int_equal(e.spin_us, 20);
	assert_false(e.futex_thread);
	assert_false(e.seccomp_trap);
	assert_null(e.test_worker_syscall);
	assert_null(e.test_worker_scribble);
	assert_false(e.journal);
}

/* Only "0" turns huge pages and packing off, only "1" the profile on. */
static void test_switches(void **state)
{
	clear();
	static const char *const vals[] = { "0", "1", "", "no", "00" };
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		setenv("NX_HUGE", vals[i], 1);
		setenv("NX_PACK", vals[i], 1);
		setenv("NXD_PROFILE", vals[i], 1);
		const struct nx_env e = read_env();
		const bool zero = !strcmp(vals[i], "0"), one = !strcmp(vals[i], "1");
		assert_int_equal(e.huge, !zero);
		assert_int_equal(e.pack, !zero);
		assert_int_equal(e.profile, one);
	}
	clear();
}

/* The presence flags count an empty value as set; the strings treat it as unset. */
static void test_presence_and_strings(void **state)
{
	clear();
	setenv("NXD_FUTEX_THREAD", "", 1);
	setenv("NXD_SECCOMP_TRAP", "", 1);
	setenv("JOURNAL_STREAM", "8:123", 1);
	setenv("NXD_TEST_WORKER_SYSCALL", "", 1);
	setenv("NX_KERN", "", 1);
	struct nx_env e = read_env();
	assert_true(e.futex_thread && e.seccomp_trap && e.journal);
	assert_null(e.test_worker_syscall);
	assert_null(e.kern);
	setenv("NXD_TEST_WORKER_SYSCALL", "open:3", 1);
	setenv("NXD_TEST_WORKER_SCRIBBLE", "step_gen,hang:25", 1);
	setenv("NX_KERN", "avx2", 1);
	e = read_env();
	assert_string_equal(e.test_worker_syscall, "open:3");
	assert_string_equal(e.test_worker_scribble, "step_gen,hang:25");
	assert_string_equal(e.kern, "avx2");
	clear();
}

/* NXD_SPIN_US as strtol reads it: the daemon clamps, this does not. */
static void test_spin(void **state)
{
	clear();
	static const struct { const char *v; long want; } cases[] = {
		{ "0", 0 }, { "50", 50 }, { "-5", -5 }, { "99999", 99999 }, { "abc", 0 }, { "", 0 }, { "7us", 7 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		setenv("NXD_SPIN_US", cases[i].v, 1);
		assert_int_equal(read_env().spin_us, cases[i].want);
	}
	clear();
}

/* nx_env() is what the process started with, read before main: later changes do not reach it. */
static void test_read_at_start(void **state)
{
	const struct nx_env before = *nx_env();
	setenv("NX_PACK", before.pack ? "0" : "1", 1);
	assert_int_equal(nx_env()->pack, before.pack);
	assert_ptr_equal(nx_env(), nx_env());
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_at_start),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_switches),
		cmocka_unit_test(test_presence_and_strings),
		cmocka_unit_test(test_spin),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
