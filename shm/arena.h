/* arena.h - the shared arena: one memfd mapped MAP_SHARED, carved into regions.
 *
 * Address space for the whole arena is reserved up front (MAP_NORESERVE: no
 * memory, only addresses; sized for the most the configuration can use,
 * daemon/shmem.c) and mapped before the workers are forked, so every process
 * sees it at the same address. Growing the arena is an ftruncate of the
 * memfd: the new pages appear in every process's existing mapping, no syscall
 * on their side. Touching the reservation past the current size is SIGBUS,
 * which is why nx_arena_alloc() grows before it hands a region out.
 *
 * Regions are carved PostgreSQL-style: each module has a size function and an
 * init function; sizes are added with overflow-checked helpers (nx_size_add,
 * nx_size_mul) so a huge configuration fails with a message instead of
 * wrapping around. */
#ifndef NX_ARENA_H
#define NX_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define NX_ARENA_ALIGN 4096 /* regions start on a page, so they can be mprotect()ed on their own */

struct nx_arena {
	int fd;           /* the memfd; -1 when closed */
	uint8_t *base;    /* start of the reservation */
	size_t reserved;  /* bytes of address space reserved (mapping length) */
	size_t size;      /* current memfd size (ftruncate), <= reserved */
	size_t used;      /* bytes handed out, <= size */
};

/* Overflow-checked size arithmetic: *acc += n / *acc *= n / round *acc up to
 * align (a power of two). Return 0, or -1 if the result does not fit a size_t. */
int nx_size_add(size_t *acc, size_t n);
int nx_size_mul(size_t *acc, size_t n);
int nx_size_align(size_t *acc, size_t align);

/* Creates the memfd (name shows in /proc/PID/maps as "memfd:name") and
 * reserves `reserve` bytes of address space; the memfd starts empty. */
int nx_arena_create(struct nx_arena *a, const char *name, size_t reserve, struct nx_err *err);
void nx_arena_destroy(struct nx_arena *a);

/* Grows the memfd to at least new_size (rounded up to a page). Never shrinks. */
int nx_arena_grow(struct nx_arena *a, size_t new_size, struct nx_err *err);

/* Hands out size bytes aligned to NX_ARENA_ALIGN (zero-filled: fresh memfd
 * pages), growing the memfd as needed. Returns NULL with err set when the
 * reservation is exhausted. */
void *nx_arena_alloc(struct nx_arena *a, size_t size, struct nx_err *err);

/* Offset of p in the arena, or SIZE_MAX if p does not point into [base, base+size). */
size_t nx_arena_offset(const struct nx_arena *a, const void *p);

/* True when [p, p+len) lies inside the arena's current size. */
bool nx_arena_contains(const struct nx_arena *a, const void *p, size_t len);

#endif
