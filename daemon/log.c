/* log.c - leveled log lines on stderr, journal-aware. */
#include "daemon/log.h"

#include "common/env.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int log_level = NXD_LOG_INFO;
static int journal = -1; /* -1: not yet known */

static const char *const level_names[] = { "error", "warn", "info", "debug" };
/* sd-daemon(3) priorities: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */
static const int level_prio[] = { 3, 4, 6, 7 };

void nxd_log_set_level(int level)
{
	log_level = level;
}

int nxd_log_level(void)
{
	return log_level;
}

int nxd_log_parse_level(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, level_names[i]))
			return i;
	if (!strcmp(s, "warning"))
		return NXD_LOG_WARN;
	return -1;
}

static void emit(int level, const char *msg, size_t len)
{
	char line[2048];
	int n;
	if (journal < 0)
		journal = nx_env()->journal;
	if (len > sizeof(line) - 64)
		len = sizeof(line) - 64;
	if (journal)
		n = snprintf(line, sizeof(line), "<%d>%.*s\n", level_prio[level], (int)len, msg);
	else
		n = snprintf(line, sizeof(line), "nxd: %s: %.*s\n", level_names[level], (int)len, msg);
	if (n > 0 && write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* stderr is gone; nothing better to do */
	}
}

void nxd_log(int level, const char *fmt, ...)
{
	if (level > log_level)
		return;
	char msg[1536];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	emit(level, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
}

void nxd_log_raw(int level, const char *line, size_t len)
{
	if (level > log_level)
		return;
	emit(level, line, len);
}
