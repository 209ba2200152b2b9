/* conn.c - a connection's output queue: events appended while one send is in flight, bounded so a client that never reads cannot pin memory. */
#include "daemon/nxd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t nxd_conn_queued(const struct nxd_conn *c)
{
	return c->out_len + (c->snd_len - c->snd_off);
}

bool nxd_conns_drained(const struct nxd *d)
{
	for (int i = 0; i < d->o.max_clients; i++) {
		const struct nxd_conn *c = &d->conns[i];
		if (c->fd >= 0 && !c->closing && nxd_conn_queued(c) > 0)
			return false;
	}
	return true;
}

void nxd_conn_reset(struct nxd_conn *c)
{
	free(c->in);
	free(c->out);
	free(c->snd);
	int idx = c->idx;
	uint32_t gen = c->gen;
	memset(c, 0, sizeof(*c));
	c->idx = idx;
	c->gen = gen + 1;
	c->fd = -1;
}

/* Appends one event line. Over the output limit the client is not keeping
 * up, and without memory for it nothing more can be sent: either way its
 * requests are cancelled and the connection closed here, so it costs the
 * others nothing and the caller has nothing left to do. */
void nxd_conn_queue(struct nxd *d, struct nxd_conn *c, const char *line, size_t len)
{
	if (c->closing)
		return;
	/* One event always fits an empty queue, however big (a long
	 * non-streamed result): the limit is on what piles up unread. */
	if (nxd_conn_queued(c) > 0 && nxd_conn_queued(c) + len > d->o.out_limit) {
		nxd_warn("client %d (pid %d): %zu bytes of output not read, over the limit of %zu; dropping it",
			 c->idx, (int)c->cred.pid, nxd_conn_queued(c) + len, d->o.out_limit);
		nxd_conn_close(d, c, "output queue over the limit");
		return;
	}
	if (c->out_len + len > c->out_cap) {
		size_t cap = c->out_cap ? c->out_cap : 4096;
		while (cap < c->out_len + len)
			cap *= 2;
		char *p = realloc(c->out, cap);
		if (!p) {
			nxd_err("client %d: out of memory for %zu bytes of output", c->idx, cap);
			nxd_conn_close(d, c, "out of memory");
			return;
		}
		c->out = p;
		c->out_cap = cap;
	}
	memcpy(c->out + c->out_len, line, len);
	c->out_len += len;
	nxd_conn_flush(d, c);
}

void nxd_send_error(struct nxd *d, struct nxd_conn *c, const char *id, enum nxp_code code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* An error line is at most the message escaped (6x) plus the id: fits. */
	char line[8192];
	size_t n = nxp_enc_error(line, sizeof(line), id ? id : "null", code, msg);
	if (n >= sizeof(line))
		n = nxp_enc_error(line, sizeof(line), "null", code, "error message too long");
	nxd_debug("client %d: error %s: %s", c->idx, nxp_code_name(code), msg);
	nxd_conn_queue(d, c, line, n);
}
