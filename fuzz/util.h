/* util.h - helpers shared by the fuzz targets: property checks that abort, so libFuzzer records the input. */
#ifndef NX_FUZZ_UTIL_H
#define NX_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Aborts with a message on stderr when cond is false (a broken property, not a crash). */
#define FUZZ_CHECK(cond, ...) \
	do { \
		if (!(cond)) \
			fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
	} while (0)

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 4, 5)));

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF).
 * Returns true when valid; else *bad gets the offset of the first bad byte. */
bool fuzz_utf8_valid(const uint8_t *s, size_t n, size_t *bad);

/* Reads each byte of [p, p+n) so ASan sees any out-of-bounds range, and
 * returns a sum (keeps the reads from being optimized away). */
unsigned fuzz_touch(const void *p, size_t n);

/* A NUL-terminated heap copy of n bytes (aborts on out of memory). */
char *fuzz_strndup(const void *p, size_t n);

#endif
