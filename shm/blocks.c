/* blocks.c - arena blocks: first-fit allocation from a sorted free list, merging frees, hole punching. */
#define _GNU_SOURCE
#include "shm/blocks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t nx_blocks_round(size_t n)
{
	return (n + NX_ARENA_ALIGN - 1) / NX_ARENA_ALIGN * NX_ARENA_ALIGN;
}

void nx_blocks_init(struct nx_blocks *b, struct nx_arena *arena)
{
	memset(b, 0, sizeof(*b));
	b->arena = arena;
}

void nx_blocks_release(struct nx_blocks *b)
{
	free(b->free);
	b->free = NULL;
	b->n_free = b->cap_free = 0;
}

static void range_remove(struct nx_blocks *b, size_t i)
{
	memmove(&b->free[i], &b->free[i + 1], (b->n_free - i - 1) * sizeof(b->free[0]));
	b->n_free--;
}

void *nx_blocks_alloc(struct nx_blocks *b, size_t size, struct nx_err *err)
{
	size = nx_blocks_round(size);
	for (size_t i = 0; i < b->n_free; i++) {
		struct nx_block_range *r = &b->free[i];
		if (r->size < size)
			continue;
		void *p = b->arena->base + r->off;
		r->off += size;
		r->size -= size;
		if (r->size == 0)
			range_remove(b, i);
		return p;
	}
	return nx_arena_alloc(b->arena, size, err);
}

static int list_reserve(struct nx_blocks *b)
{
	if (b->n_free < b->cap_free)
		return 0;
	size_t cap = b->cap_free ? 2 * b->cap_free : 16;
	void *q = realloc(b->free, cap * sizeof(b->free[0]));
	if (!q)
		return -ENOMEM;
	b->free = q;
	b->cap_free = cap;
	return 0;
}

/* Puts [off, off+size) on the list at its place, merged with the ranges it touches. */
static void range_insert(struct nx_blocks *b, size_t off, size_t size)
{
	size_t i = 0;
	while (i < b->n_free && b->free[i].off < off)
		i++;
	memmove(&b->free[i + 1], &b->free[i], (b->n_free - i) * sizeof(b->free[0]));
	b->free[i] = (struct nx_block_range){off, size};
	b->n_free++;
	if (i + 1 < b->n_free && b->free[i].off + b->free[i].size == b->free[i + 1].off) {
		b->free[i].size += b->free[i + 1].size;
		range_remove(b, i + 1);
	}
	if (i > 0 && b->free[i - 1].off + b->free[i - 1].size == b->free[i].off) {
		b->free[i - 1].size += b->free[i].size;
		range_remove(b, i);
	}
}

int nx_blocks_free(struct nx_blocks *b, void *p, size_t size)
{
	if (!p)
		return 0;
	size = nx_blocks_round(size);
	size_t off = (size_t)((uint8_t *)p - b->arena->base);
	int rc = 0;
	/* The pages go back to the kernel; the range reads as zeros if reused. */
	if (fallocate(b->arena->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)size) < 0)
		rc = -errno;
	if (list_reserve(b) < 0)
		return -ENOMEM;
	range_insert(b, off, size);
	return rc;
}
