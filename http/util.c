/* util.c - nxd-http's small helpers: growing buffers, the clock, log lines. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/nxh.h"

int nxh_log_level = NXH_LOG_INFO;

int nxh_buf_put(struct nxh_buf *b, const void *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -1;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0'; /* always a C string too */
	return 0;
}

int nxh_buf_printf(struct nxh_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -1;
	int rc = nxh_buf_put(b, s, (size_t)n);
	free(s);
	return rc;
}

size_t nxh_buf_left(const struct nxh_buf *b)
{
	return b->len - b->off;
}

void nxh_buf_take(struct nxh_buf *b, size_t n)
{
	b->off += n;
	if (b->off >= b->len) {
		b->off = b->len = 0;
		if (b->p)
			b->p[0] = '\0';
	} else if (b->off > 65536 && b->off * 2 > b->len) {
		/* Keep the unread part at the front once most of it was read. */
		memmove(b->p, b->p + b->off, b->len - b->off + 1);
		b->len -= b->off;
		b->off = 0;
	}
}

void nxh_buf_free(struct nxh_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

double nxh_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void nxh_log(int level, const char *fmt, ...)
{
	if (level > nxh_log_level)
		return;
	static const char *const names[] = { "error", "warn", "info", "debug" };
	char line[1024];
	int n = snprintf(line, sizeof(line), "nxd-http: %s: ", names[level]);
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (k < 0 ? 0 : (size_t)k);
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	fwrite(line, 1, len, stderr); /* one write per line: lines of two processes never mix */
	fflush(stderr);
}
