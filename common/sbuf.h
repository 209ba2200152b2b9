/* sbuf.h - a growable NUL-terminated string for text built once (grammars, schemas, chat prompts), not per token.
 *
 * Running out of memory sticks (oom): the builder checks once at the end. */
#ifndef NX_SBUF_H
#define NX_SBUF_H

#include <stdbool.h>
#include <stddef.h>

struct nx_sbuf {
	char *s;     /* NUL-terminated, malloc'd; NULL while empty */
	size_t n, cap;
	bool oom;
};

void nx_sb_put(struct nx_sbuf *b, const char *s, size_t n);
void nx_sb_str(struct nx_sbuf *b, const char *s);
/* At most 511 bytes of formatted text; longer is oom. */
void nx_sb_fmt(struct nx_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
