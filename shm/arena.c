/* arena.c - the memfd-backed shared arena: reserve, grow by ftruncate, carve. */
#define _GNU_SOURCE
#include "shm/arena.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int nx_size_add(size_t *acc, size_t n)
{
	return __builtin_add_overflow(*acc, n, acc) ? -1 : 0;
}

int nx_size_mul(size_t *acc, size_t n)
{
	return __builtin_mul_overflow(*acc, n, acc) ? -1 : 0;
}

int nx_size_align(size_t *acc, size_t align)
{
	size_t v;
	if (__builtin_add_overflow(*acc, align - 1, &v))
		return -1;
	*acc = v & ~(align - 1);
	return 0;
}

int nx_arena_create(struct nx_arena *a, const char *name, size_t reserve, struct nx_err *err)
{
	memset(a, 0, sizeof(*a));
	a->fd = -1;
	if (reserve == 0 || nx_size_align(&reserve, NX_ARENA_ALIGN) < 0)
		return nx_errf(err, "arena: bad reservation size %zu", reserve);
	/* MFD_CLOEXEC: the workers get the mapping by fork, never the fd. */
	a->fd = memfd_create(name, MFD_CLOEXEC);
	if (a->fd < 0)
		return nx_errf(err, "arena: memfd_create(\"%s\") failed: %s", name, strerror(errno));
	/* Mapping past the end of the file is allowed; those pages fault (SIGBUS)
	 * until ftruncate makes them part of the file. MAP_NORESERVE: no swap
	 * accounting for the reservation, only for what is really used. */
	void *p = mmap(NULL, reserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		close(a->fd);
		a->fd = -1;
		return nx_errf(err, "arena: mmap(%zu bytes, MAP_SHARED|MAP_NORESERVE) failed: %s", reserve,
			       strerror(e));
	}
	a->base = p;
	a->reserved = reserve;
	return 0;
}

void nx_arena_destroy(struct nx_arena *a)
{
	if (a->base)
		munmap(a->base, a->reserved);
	if (a->fd >= 0)
		close(a->fd);
	memset(a, 0, sizeof(*a));
	a->fd = -1;
}

int nx_arena_grow(struct nx_arena *a, size_t new_size, struct nx_err *err)
{
	if (new_size <= a->size)
		return 0;
	if (nx_size_align(&new_size, NX_ARENA_ALIGN) < 0 || new_size > a->reserved)
		return nx_errf(err, "arena: %zu bytes needed, only %zu reserved", new_size, a->reserved);
	if (ftruncate(a->fd, (off_t)new_size) < 0) {
		int e = errno;
		return nx_errf(err, "arena: ftruncate(%zu) failed: %s%s", new_size, strerror(e),
			       e == EFBIG ? " (RLIMIT_FSIZE, ulimit -f, counts: the arena is a memfd)" : "");
	}
	a->size = new_size;
	return 0;
}

void *nx_arena_alloc(struct nx_arena *a, size_t size, struct nx_err *err)
{
	size_t off = a->used, end = off;
	if (nx_size_align(&off, NX_ARENA_ALIGN) < 0 || (end = off, nx_size_add(&end, size) < 0) ||
	    end > a->reserved) {
		nx_errf(err, "arena: %.1f MiB more do not fit its reservation (%.1f of %.1f MiB in use)",
			(double)size / 1048576, (double)a->used / 1048576, (double)a->reserved / 1048576);
		return NULL;
	}
	if (nx_arena_grow(a, end, err) < 0)
		return NULL;
	a->used = end;
	return a->base + off;
}

size_t nx_arena_offset(const struct nx_arena *a, const void *p)
{
	const uint8_t *q = p;
	if (!a->base || q < a->base || q >= a->base + a->size)
		return SIZE_MAX;
	return (size_t)(q - a->base);
}

bool nx_arena_contains(const struct nx_arena *a, const void *p, size_t len)
{
	size_t off = nx_arena_offset(a, p);
	return off != SIZE_MAX && len <= a->size - off;
}
