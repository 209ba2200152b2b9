/* hugemem.c - private anonymous memory on a 2 MiB boundary with MADV_HUGEPAGE, and how much of it the kernel put on huge pages. */
#define _GNU_SOURCE
#include "shm/hugemem.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "shm/arena.h"

int nx_huge_map(struct nx_huge *h, size_t size, bool huge, struct nx_err *err)
{
	memset(h, 0, sizeof(*h));
	size_t len = size, span;
	if (size == 0 || nx_size_align(&len, NX_HUGE_PAGE) < 0 || __builtin_add_overflow(len, NX_HUGE_PAGE, &span))
		return nx_errf(err, "hugemem: bad size %zu", size);
	/* One huge page more than needed, then the unaligned ends cut off: the
	 * kernel only uses a huge page for a whole aligned 2 MiB of the mapping. */
	uint8_t *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		return nx_errf(err, "hugemem: mmap(%zu bytes, MAP_PRIVATE|MAP_ANONYMOUS) failed: %s", span,
			       strerror(errno));
	uint8_t *p = (uint8_t *)(((uintptr_t)raw + NX_HUGE_PAGE - 1) & ~(uintptr_t)(NX_HUGE_PAGE - 1));
	if (p > raw)
		munmap(raw, (size_t)(p - raw));
	if (raw + span > p + len)
		munmap(p + len, (size_t)(raw + span - (p + len)));
	h->p = p;
	h->len = len;
	if (madvise(p, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) == 0)
		h->advised = huge;
	else if (huge)
		h->advise_errno = errno; /* EINVAL: a kernel without THP */
	return 0;
}

void nx_huge_unmap(struct nx_huge *h)
{
	if (h->p)
		munmap(h->p, h->len);
	memset(h, 0, sizeof(*h));
}

long long nx_huge_resident(const void *p, size_t len)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	if (!f)
		return -1;
	uintptr_t lo = (uintptr_t)p, hi = lo + len;
	bool in = false;
	long long total = 0;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		uintptr_t a, b;
		unsigned long long kb;
		/* "start-end perms ..." opens a mapping, its "Field: value" lines
		 * follow (no field name is hex digits then '-'). */
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &a, &b) == 2)
			in = a < hi && b > lo;
		else if (in && sscanf(line, "AnonHugePages: %llu kB", &kb) == 1)
			total += (long long)kb * 1024;
	}
	fclose(f);
	return total;
}
