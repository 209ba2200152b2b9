/* sbuf.c - the growable string of sbuf.h. */
#include "common/sbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nx_sb_put(struct nx_sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t c = b->cap ? b->cap : 1024;
		while (c < b->n + n + 1) {
			if (c > SIZE_MAX / 2) {
				b->oom = true;
				return;
			}
			c *= 2;
		}
		char *q = realloc(b->s, c);
		if (!q) {
			b->oom = true;
			return;
		}
		b->s = q;
		b->cap = c;
	}
	memcpy(b->s + b->n, s, n);
	b->n += n;
	b->s[b->n] = '\0';
}

void nx_sb_str(struct nx_sbuf *b, const char *s)
{
	nx_sb_put(b, s, strlen(s));
}

void nx_sb_fmt(struct nx_sbuf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(tmp)) {
		b->oom = true;
		return;
	}
	nx_sb_put(b, tmp, (size_t)n);
}
