/* blocks.h - reusable blocks of the shared arena: a first-fit free list over its bump allocator, freed pages given back.
 *
 * For what comes and goes while the daemon serves (LoRA adapters, folded
 * tensors): a freed block's range goes on a free list sorted by offset and
 * merged with its neighbours, and its pages go back to the kernel
 * (FALLOC_FL_PUNCH_HOLE on the memfd), so load/unload cycles neither grow
 * the arena nor keep its memory. A reused range reads as zeros, like fresh
 * arena memory. Blocks are whole pages (NX_ARENA_ALIGN). Not thread-safe:
 * one owner allocates and frees. */
#ifndef NX_BLOCKS_H
#define NX_BLOCKS_H

#include <stddef.h>

#include "common/err.h"
#include "shm/arena.h"

struct nx_blocks {
	struct nx_arena *arena;
	struct nx_block_range { size_t off, size; } *free; /* (n_free) sorted by off, never adjacent */
	size_t n_free, cap_free;
};

/* The size a block of n bytes takes: n rounded up to a page. */
size_t nx_blocks_round(size_t n);

void nx_blocks_init(struct nx_blocks *b, struct nx_arena *arena);
/* Frees the free list itself (the arena keeps its memory). */
void nx_blocks_release(struct nx_blocks *b);

/* A zero-filled block of at least size bytes: the first free range that
 * fits, else carved from the arena. NULL with err set when the arena is full. */
void *nx_blocks_alloc(struct nx_blocks *b, size_t size, struct nx_err *err);

/* Gives back the block p of size bytes (as asked of nx_blocks_alloc; NULL
 * is a no-op). Returns 0; -ENOMEM when the free list cannot grow (the
 * range is never reused, its pages are given back all the same); another
 * negative errno when fallocate failed (the range is reused, its pages
 * stay). The caller says so: the block is gone either way. */
int nx_blocks_free(struct nx_blocks *b, void *p, size_t size);

#endif
