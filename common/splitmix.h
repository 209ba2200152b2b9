/* splitmix.h - splitmix64 (Steele, Lea, Flood; Vigna's constants): one 64-bit mixer for seeds and cheap streams. */
#ifndef NX_SPLITMIX_H
#define NX_SPLITMIX_H

#include <stdint.h>

/* Advances *x by the golden-ratio step and returns it mixed: any start (0
 * included) gives a well-spread, deterministic stream. Not for secrets. */
static inline uint64_t nx_splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#endif
