/* hugemem.h - private anonymous memory on 2 MiB transparent huge pages, for data filled once and then only read (the weights).
 *
 * Why: a decode step streams every weight once, and on 4 KiB pages the
 * tile kernels lose a fifth of their bandwidth to TLB misses (SmolLM2 Q4_1,
 * one core: 15-19 GB/s on 4 KiB pages, 20-24 GB/s on 2 MiB pages).
 *
 * Why private and not the arena: the kernel gives shared memory (memfd,
 * MAP_SHARED|MAP_ANONYMOUS) huge pages only when
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it, and the
 * default is "never"; anonymous private memory only needs "madvise" (the
 * default) and MADV_HUGEPAGE. Filled before fork() and never written after,
 * such memory is shared by every forked child: copy-on-write copies nothing
 * that nobody writes, and fork() copies one page-table entry per 2 MiB.
 *
 * NX_HUGE_PAGE is the x86-64 PMD size; on a kernel whose THP size differs,
 * the region is still aligned and works, with whatever pages it is given. */
#ifndef NX_HUGEMEM_H
#define NX_HUGEMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define NX_HUGE_PAGE ((size_t)2 << 20)

struct nx_huge {
	uint8_t *p;    /* NX_HUGE_PAGE-aligned, zero-filled; NULL when unmapped */
	size_t len;    /* mapping length: the size asked for, rounded up to NX_HUGE_PAGE */
	bool advised;  /* MADV_HUGEPAGE was asked for and accepted */
	int advise_errno; /* why madvise(MADV_HUGEPAGE) failed, or 0 */
};

/* Maps size bytes (PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS) on a
 * huge-page boundary. huge: madvise(MADV_HUGEPAGE), else MADV_NOHUGEPAGE (4
 * KiB pages even where THP is "always", for comparisons). A failed madvise
 * is no error: the memory works on 4 KiB pages (see advised). */
int nx_huge_map(struct nx_huge *h, size_t size, bool huge, struct nx_err *err);
void nx_huge_unmap(struct nx_huge *h);

/* Bytes of [p, p+len) the kernel backs with huge pages (AnonHugePages of the
 * mappings in /proc/self/smaps), or -1 when smaps cannot be read. */
long long nx_huge_resident(const void *p, size_t len);

#endif
