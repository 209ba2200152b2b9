/* err.h - one clear error message carried from where a failure is found to the boundary that reports it. */
#ifndef NX_ERR_H
#define NX_ERR_H

#include <stddef.h>

struct nx_err {
	char msg[512];
};

/* Formats msg into err (if non-NULL) and returns -1, so callers can write
 * `return nx_errf(err, "gguf: ...", ...);`. */
int nx_errf(struct nx_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (context added on the way up). */
int nx_err_prefix(struct nx_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
