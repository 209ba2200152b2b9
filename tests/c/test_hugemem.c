/* test_hugemem.c - private memory on 2 MiB pages: alignment, the 4 KiB opt-out, and sharing with a forked child. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/hugemem.h"

#define SIZE ((size_t)8 << 20) /* four huge pages */

/* True unless /sys/kernel/mm/transparent_hugepage/enabled is "[never]" (or absent). */
static bool thp_available(void)
{
	char buf[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	if (!f)
		return false;
	bool ok = fgets(buf, sizeof(buf), f) && !strstr(buf, "[never]");
	fclose(f);
	return ok;
}

static void fill(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 2654435761u >> 24);
}

static bool same(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(i * 2654435761u >> 24))
			return false;
	return true;
}

static void test_map_aligned_zeroed(void **state)
{
	struct nx_huge h;
	struct nx_err err = {{0}};
	assert_int_equal(nx_huge_map(&h, SIZE + 1, true, &err), 0);
	assert_int_equal((uintptr_t)h.p % NX_HUGE_PAGE, 0);
	assert_true(h.len == SIZE + NX_HUGE_PAGE);
	for (size_t i = 0; i < h.len; i += 4096)
		assert_int_equal(h.p[i], 0);
	h.p[h.len - 1] = 1; /* the whole rounded length is ours */
	nx_huge_unmap(&h);
	assert_null(h.p);
	assert_int_equal(nx_huge_map(&h, 0, true, &err), -1);
	assert_non_null(strstr(err.msg, "bad size"));
}

static void test_small_pages_when_asked(void **state)
{
	struct nx_huge h;
	struct nx_err err = {{0}};
	assert_int_equal(nx_huge_map(&h, SIZE, false, &err), 0);
	assert_false(h.advised);
	fill(h.p, SIZE);
	/* MADV_NOHUGEPAGE: none, even where THP is "always". */
	assert_true(nx_huge_resident(h.p, h.len) == 0);
	nx_huge_unmap(&h);
}

/* The daemon's use: filled, made read-only, then forked; the child reads the
 * same bytes from the same huge pages, and nothing is copied. */
static void test_huge_pages_shared_by_fork(void **state)
{
	if (!thp_available())
		skip();
	struct nx_huge h;
	struct nx_err err = {{0}};
	assert_int_equal(nx_huge_map(&h, SIZE, true, &err), 0);
	assert_true(h.advised);
	fill(h.p, SIZE);
	long long huge = nx_huge_resident(h.p, h.len);
	assert_true(huge >= (long long)NX_HUGE_PAGE && huge <= (long long)h.len);
	assert_int_equal(mprotect(h.p, h.len, PROT_READ), 0);
	assert_true(nx_huge_resident(h.p, h.len) == huge); /* mprotect of whole huge pages splits none */
	/* Another region's pages are not counted. */
	assert_true(nx_huge_resident(h.p + h.len, NX_HUGE_PAGE) == 0);

	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(!same(h.p, SIZE) ? 1 : nx_huge_resident(h.p, h.len) != huge ? 2 : 0);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_true(same(h.p, SIZE));
	nx_huge_unmap(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_map_aligned_zeroed),
		cmocka_unit_test(test_small_pages_when_asked),
		cmocka_unit_test(test_huge_pages_shared_by_fork),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
