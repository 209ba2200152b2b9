/* memlimit.h - the memory this process may use: RLIMIT_AS, the memory cgroup limits from its cgroup up to the root, and what the system has available.
 *
 * cgroup v2: memory.max (above it the kernel OOM-kills) and memory.high
 * (above it the kernel throttles and reclaims); v1: memory.limit_in_bytes.
 * Every level of the tree limits everything below it, so the smallest
 * value on the way up is the one that counts. The cgroup comes from
 * /proc/self/cgroup and where its hierarchy is mounted from
 * /proc/self/mountinfo, never from a fixed path: v2, v1 and hybrid systems
 * mount them in different places, and a container sees its own root. */
#ifndef NX_MEMLIMIT_H
#define NX_MEMLIMIT_H

#include <stdbool.h>
#include <stdint.h>

#define NX_NO_LIMIT UINT64_MAX

struct nx_cg_limit {
	uint64_t bytes;  /* NX_NO_LIMIT: none on the way up */
	char file[1024]; /* the file that set it, e.g. /sys/fs/cgroup/system.slice/nxd.service/memory.max */
};

struct nx_memlimit {
	uint64_t as;             /* RLIMIT_AS soft limit in bytes; NX_NO_LIMIT: unlimited */
	struct nx_cg_limit max;  /* memory.max (v2) or memory.limit_in_bytes (v1) */
	struct nx_cg_limit high; /* memory.high (v2 only) */
};

/* Reads RLIMIT_AS (getrlimit) and the cgroup limits, with "cgroup" and
 * "mountinfo" taken from proc_dir ("/proc/self"; a test passes a directory
 * of its own). What cannot be read counts as no limit: a machine without a
 * memory controller has none. */
void nx_memlimit_read(struct nx_memlimit *ml, const char *proc_dir);

/* Memory the system can give without swapping now (MemAvailable of a
 * /proc/meminfo file, "/proc/meminfo"), in bytes; NX_NO_LIMIT if unknown. */
uint64_t nx_mem_available(const char *meminfo);

/* Bytes of address space this process has mapped now (VmSize in
 * /proc/self/status; what RLIMIT_AS is compared with), or 0 if unknown. */
uint64_t nx_vm_size(void);

#endif
