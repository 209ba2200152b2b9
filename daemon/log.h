/* log.h - the supervisor's log: one line per event on stderr (the journal under systemd). */
#ifndef NXD_LOG_H
#define NXD_LOG_H

#include <stddef.h>

enum nxd_log_level { NXD_LOG_ERROR = 0, NXD_LOG_WARN, NXD_LOG_INFO, NXD_LOG_DEBUG };

void nxd_log_set_level(int level);
int nxd_log_level(void);
/* "error", "warn", "info", "debug" -> level; -1 when unknown. */
int nxd_log_parse_level(const char *s);

/* Writes "nxd: <level>: <message>\n" (or the sd-daemon "<N>" priority prefix
 * when stderr is the journal) in one write(2), so lines never interleave. */
void nxd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Passes a line a worker wrote to its log pipe through (already prefixed). */
void nxd_log_raw(int level, const char *line, size_t len);

#define nxd_err(...) nxd_log(NXD_LOG_ERROR, __VA_ARGS__)
#define nxd_warn(...) nxd_log(NXD_LOG_WARN, __VA_ARGS__)
#define nxd_info(...) nxd_log(NXD_LOG_INFO, __VA_ARGS__)
#define nxd_debug(...) nxd_log(NXD_LOG_DEBUG, __VA_ARGS__)

#endif
