/* test_memlimit.c - reading RLIMIT_AS and the memory cgroup's limits: v2, v1 and hybrid mounts, the smallest on the way up, where the walk stops. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/memlimit.h"

/* A scratch tree: T/proc/{cgroup,mountinfo} and cgroup hierarchies below T. */
static char T[256];

static void put(const char *rel, const char *text)
{
	char path[512], dir[512];
	snprintf(path, sizeof(path), "%s/%s", T, rel);
	snprintf(dir, sizeof(dir), "%s", path);
	for (char *p = dir + strlen(T) + 1; (p = strchr(p, '/')); p++) {
		*p = 0;
		mkdir(dir, 0755);
		*p = '/';
	}
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* mountinfo lines for mounts at T/point (escaped as the kernel does: space is \040). */
static void mounts(const char *lines_fmt)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), lines_fmt, T, T, T, T);
	put("proc/mountinfo", buf);
}

static int setup(void **state)
{
	(void)state;
	snprintf(T, sizeof(T), "/tmp/test_memlimit.XXXXXX");
	return mkdtemp(T) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", T);
	return system(cmd) == 0 ? 0 : -1;
}

static struct nx_memlimit read_limits(void)
{
	char proc[300];
	snprintf(proc, sizeof(proc), "%s/proc", T);
	struct nx_memlimit ml;
	nx_memlimit_read(&ml, proc);
	return ml;
}

static void expect_file(const struct nx_cg_limit *l, const char *rel)
{
	char want[512];
	snprintf(want, sizeof(want), "%s/%s", T, rel);
	assert_string_equal(l->file, want);
}

/* v2: memory.max and memory.high from the cgroup up to the mount point, the smallest of each. */
static void test_v2_smallest_on_the_way_up(void **state)
{
	(void)state;
	put("proc/cgroup", "0::/system.slice/nxd.service\n");
	mounts("30 23 0:26 / %s/cg2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
	put("cg2/system.slice/memory.max", "300000000\n");
	put("cg2/system.slice/memory.high", "max\n");
	put("cg2/system.slice/nxd.service/memory.max", "max\n");
	put("cg2/system.slice/nxd.service/memory.high", "200000000\n");
	put("memory.max", "1\n"); /* above the mount point: not part of the hierarchy */
	struct nx_memlimit ml = read_limits();
	assert_int_equal(ml.max.bytes, 300000000);
	expect_file(&ml.max, "cg2/system.slice/memory.max");
	assert_int_equal(ml.high.bytes, 200000000);
	expect_file(&ml.high, "cg2/system.slice/nxd.service/memory.high");

	put("cg2/system.slice/nxd.service/memory.max", "100000000\n");
	ml = read_limits();
	assert_int_equal(ml.max.bytes, 100000000);
	expect_file(&ml.max, "cg2/system.slice/nxd.service/memory.max");
}

/* Hybrid: the memory controller on a v1 hierarchy, v2 mounted without it;
 * v1's "unlimited" (a huge number) is no limit; other controllers' lines are ignored. */
static void test_v1_hybrid(void **state)
{
	(void)state;
	put("proc/cgroup", "9:name=systemd:/\n4:cpu,cpuacct:/elsewhere\n3:memory:/jobs/7\n0::/\n");
	mounts("31 23 0:28 / %s/v1/cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
	       "35 23 0:32 / %s/v1/memory rw,relatime - cgroup cgroup rw,memory\n"
	       "41 23 0:38 / %s/unified rw,relatime - cgroup2 cgroup2 rw\n");
	put("v1/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put("v1/memory/jobs/memory.limit_in_bytes", "9223372036854771712\n");
	put("v1/memory/jobs/7/memory.limit_in_bytes", "67108864\n");
	put("v1/cpu/elsewhere/memory.limit_in_bytes", "1\n"); /* not the memory hierarchy */
	struct nx_memlimit ml = read_limits();
	assert_int_equal(ml.max.bytes, 67108864);
	expect_file(&ml.max, "v1/memory/jobs/7/memory.limit_in_bytes");
	assert_true(ml.high.bytes == NX_NO_LIMIT);

	put("v1/memory/jobs/7/memory.limit_in_bytes", "9223372036854771712\n");
	ml = read_limits();
	assert_true(ml.max.bytes == NX_NO_LIMIT);
}

/* A mount that shows a subtree (root "/lxc/c1"), at a path with a space:
 * the cgroup's directory is the mount point plus the path below that root. */
static void test_subtree_mount_and_escapes(void **state)
{
	(void)state;
	put("proc/cgroup", "0::/lxc/c1/app\n");
	mounts("50 23 0:40 /lxc/c1 %s/with\\040space rw - cgroup2 cgroup2 rw\n");
	put("with space/app/memory.max", "5000000\n");
	struct nx_memlimit ml = read_limits();
	assert_int_equal(ml.max.bytes, 5000000);
	expect_file(&ml.max, "with space/app/memory.max");

	/* A cgroup outside the mount's subtree is not visible there. */
	put("proc/cgroup", "0::/lxc/c2/app\n");
	ml = read_limits();
	assert_true(ml.max.bytes == NX_NO_LIMIT);
	/* Nor one above our namespace's root. */
	put("proc/cgroup", "0::/../../x\n");
	ml = read_limits();
	assert_true(ml.max.bytes == NX_NO_LIMIT);
}

/* Nothing readable: no limits, not an error. */
static void test_nothing_readable(void **state)
{
	(void)state;
	char proc[300];
	snprintf(proc, sizeof(proc), "%s/absent", T);
	struct nx_memlimit ml;
	nx_memlimit_read(&ml, proc);
	assert_true(ml.max.bytes == NX_NO_LIMIT && ml.high.bytes == NX_NO_LIMIT);
	put("proc/cgroup", "0::/a\n");
	mounts("30 23 0:26 / %s/cg2 rw - cgroup2 cgroup2 rw\n");
	put("cg2/a/memory.max", "garbage\n");
	ml = read_limits();
	assert_true(ml.max.bytes == NX_NO_LIMIT);
}

static void test_rlimit_as_and_vm_size(void **state)
{
	(void)state;
	struct rlimit old, rl;
	assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
	rl = old;
	rl.rlim_cur = (rlim_t)1 << 40;
	if (old.rlim_max != RLIM_INFINITY && old.rlim_max < rl.rlim_cur)
		rl.rlim_cur = old.rlim_max;
	assert_int_equal(setrlimit(RLIMIT_AS, &rl), 0);
	struct nx_memlimit ml;
	nx_memlimit_read(&ml, "/proc/self");
	assert_true(ml.as == (uint64_t)rl.rlim_cur);
	assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
	nx_memlimit_read(&ml, "/proc/self");
	assert_true(old.rlim_cur == RLIM_INFINITY ? ml.as == NX_NO_LIMIT : ml.as == (uint64_t)old.rlim_cur);
	/* What is mapped grows with a new mapping. */
	uint64_t before = nx_vm_size();
	void *p = malloc(64 << 20);
	assert_non_null(p);
	assert_true(before > 0 && nx_vm_size() >= before + (60 << 20));
	free(p);
}

/* MemAvailable in bytes, from a meminfo file; none readable or no such line: no limit. */
static void test_mem_available(void **state)
{
	(void)state;
	char path[400];
	snprintf(path, sizeof(path), "%s/meminfo", T);
	put("meminfo", "MemTotal:       24683584 kB\nMemFree:         1000 kB\nMemAvailable:   22975416 kB\n");
	assert_true(nx_mem_available(path) == 22975416ull * 1024);
	put("meminfo", "MemTotal:       24683584 kB\n");
	assert_true(nx_mem_available(path) == NX_NO_LIMIT);
	snprintf(path, sizeof(path), "%s/absent", T);
	assert_true(nx_mem_available(path) == NX_NO_LIMIT);
	uint64_t real = nx_mem_available("/proc/meminfo");
	assert_true(real > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_v2_smallest_on_the_way_up, setup, teardown),
		cmocka_unit_test_setup_teardown(test_v1_hybrid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_subtree_mount_and_escapes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nothing_readable, setup, teardown),
		cmocka_unit_test(test_rlimit_as_and_vm_size),
		cmocka_unit_test_setup_teardown(test_mem_available, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
