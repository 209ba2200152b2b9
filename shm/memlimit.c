/* memlimit.c - RLIMIT_AS and the memory cgroup's limits (v2 memory.max / memory.high, v1 memory.limit_in_bytes), the smallest from the process's cgroup up. */
#define _GNU_SOURCE
#include "shm/memlimit.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define MAX_FIELDS 64
#define V1_UNLIMITED ((uint64_t)1 << 62) /* v1 shows "no limit" as a huge page count times the page size */

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s)
{
	char *w = s;
	for (const char *r = s; *r;) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' &&
		    r[3] <= '7') {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 4;
		} else {
			*w++ = *r++;
		}
	}
	*w = 0;
}

/* True when the comma-separated list holds item. */
static bool has_item(const char *list, const char *item)
{
	size_t n = strlen(item);
	for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, item, n) && (p[n] == ',' || p[n] == 0))
			return true;
	return false;
}

/* Splits line at spaces in place; returns the number of fields. */
static int split(char *line, char **f)
{
	int n = 0;
	char *save = NULL;
	for (char *t = strtok_r(line, " \n", &save); t && n < MAX_FIELDS; t = strtok_r(NULL, " \n", &save))
		f[n++] = t;
	return n;
}

/* The directory of cgroup `path` in the hierarchy (v2, or v1's memory one)
 * as mounted here, and its mount point (the walk stops there). False when
 * no mount shows that cgroup. */
static bool cg_dir(const char *proc_dir, bool v2, const char *path, char *dir, size_t dir_len, char *top,
		   size_t top_len)
{
	char fn[512];
	snprintf(fn, sizeof(fn), "%s/mountinfo", proc_dir);
	FILE *f = fopen(fn, "re");
	if (!f)
		return false;
	char *line = NULL, *fld[MAX_FIELDS];
	size_t cap = 0;
	bool found = false;
	while (!found && getline(&line, &cap, f) > 0) {
		/* id parent major:minor root mount-point options [optional...] - fstype source super-options */
		int n = split(line, fld), sep = 6;
		while (sep < n && strcmp(fld[sep], "-"))
			sep++;
		if (sep + 1 >= n)
			continue;
		const char *fstype = fld[sep + 1], *sopts = sep + 3 < n ? fld[sep + 3] : "";
		if (v2 ? strcmp(fstype, "cgroup2") != 0 : strcmp(fstype, "cgroup") != 0 || !has_item(sopts, "memory"))
			continue;
		char *root = fld[3], *point = fld[4];
		unescape(root);
		unescape(point);
		/* The mount shows the subtree at root: path must be inside it. */
		size_t rn = strcmp(root, "/") ? strlen(root) : 0;
		if (rn && (strncmp(path, root, rn) || (path[rn] != '/' && path[rn] != 0)))
			continue;
		const char *rel = path + rn;
		if (!strcmp(rel, "/"))
			rel = "";
		int a = snprintf(dir, dir_len, "%s%s", point, rel), b = snprintf(top, top_len, "%s", point);
		found = a > 0 && (size_t)a < dir_len && b > 0 && (size_t)b < top_len;
	}
	free(line);
	fclose(f);
	return found;
}

/* Lowers lim to the value in dir/name when that is smaller ("max": none). */
static void take(struct nx_cg_limit *lim, const char *dir, const char *name)
{
	char fn[sizeof(lim->file)], buf[64];
	int n = snprintf(fn, sizeof(fn), "%s/%s", dir, name);
	if (n < 0 || (size_t)n >= sizeof(fn))
		return;
	FILE *f = fopen(fn, "re");
	if (!f)
		return;
	bool ok = fgets(buf, sizeof(buf), f) != NULL;
	fclose(f);
	char *end;
	unsigned long long v = ok ? strtoull(buf, &end, 10) : 0;
	if (!ok || end == buf || (*end && *end != '\n') || v >= V1_UNLIMITED)
		return; /* "max", unreadable, or v1's "unlimited" */
	if ((uint64_t)v < lim->bytes) {
		lim->bytes = (uint64_t)v;
		memcpy(lim->file, fn, sizeof(fn));
	}
}

/* Reads the limits of dir and every directory above it up to top. */
static void walk(struct nx_memlimit *ml, bool v2, char *dir, const char *top)
{
	size_t tn = strlen(top);
	for (;;) {
		if (v2) {
			take(&ml->max, dir, "memory.max");
			take(&ml->high, dir, "memory.high");
		} else {
			take(&ml->max, dir, "memory.limit_in_bytes");
		}
		char *s = strrchr(dir, '/');
		if (strlen(dir) <= tn || !s || (size_t)(s - dir) < tn)
			break;
		*s = 0;
	}
}

void nx_memlimit_read(struct nx_memlimit *ml, const char *proc_dir)
{
	memset(ml, 0, sizeof(*ml));
	ml->as = ml->max.bytes = ml->high.bytes = NX_NO_LIMIT;
	struct rlimit rl;
	if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		ml->as = (uint64_t)rl.rlim_cur;

	char fn[512];
	snprintf(fn, sizeof(fn), "%s/cgroup", proc_dir);
	FILE *f = fopen(fn, "re");
	if (!f)
		return;
	char *line = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, f) > 0) {
		/* hierarchy-id:controllers:path; v2 is "0::path" */
		line[strcspn(line, "\n")] = 0;
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c1 = *c2 = 0;
		const char *ctrls = c1 + 1, *path = c2 + 1;
		bool v2 = !strcmp(line, "0") && !*ctrls;
		if ((!v2 && !has_item(ctrls, "memory")) || path[0] != '/' || strstr(path, "/.."))
			continue; /* another controller, or a cgroup outside our namespace's view */
		char dir[1024], top[512];
		if (cg_dir(proc_dir, v2, path, dir, sizeof(dir), top, sizeof(top)))
			walk(ml, v2, dir, top);
	}
	free(line);
	fclose(f);
}

uint64_t nx_vm_size(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f)
		return 0;
	char line[256];
	uint64_t kb = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmSize: %" SCNu64 " kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

uint64_t nx_mem_available(const char *meminfo)
{
	FILE *f = fopen(meminfo, "re");
	if (!f)
		return NX_NO_LIMIT;
	char line[256];
	uint64_t kb = 0;
	bool found = false;
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1;
	fclose(f);
	return found ? kb * 1024 : NX_NO_LIMIT;
}
