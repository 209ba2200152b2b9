/* err.c - formatting of nx_err messages. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int nx_errf(struct nx_err *err, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return -1;
}

int nx_err_prefix(struct nx_err *err, const char *fmt, ...)
{
	if (err) {
		char pre[256], old[sizeof(err->msg)];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(pre, sizeof(pre), fmt, ap);
		va_end(ap);
		memcpy(old, err->msg, sizeof(old));
		/* Truncation is acceptable: the message stays a readable prefix. */
		int n = snprintf(err->msg, sizeof(err->msg), "%s: ", pre);
		if (n >= 0 && (size_t)n < sizeof(err->msg))
			snprintf(err->msg + n, sizeof(err->msg) - (size_t)n, "%.*s", (int)(sizeof(err->msg) - (size_t)n - 1), old);
	}
	return -1;
}
