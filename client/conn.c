/* conn.c - nxctl's side of the socket: connect, hello, send requests, read event lines, Ctrl-C without races. */
#define _GNU_SOURCE /* ppoll */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/nxctl.h"
#include "proto/proto.h"

#define NXC_MAX_EVENT ((size_t)256 << 20) /* a non-streamed done can carry a long text */

volatile sig_atomic_t nxc_interrupts;
static sigset_t wait_mask; /* the mask while waiting: SIGINT deliverable */

static void on_sigint(int sig)
{
	(void)sig;
	nxc_interrupts++;
}

void nxc_signals_init(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: ppoll must return EINTR */
	sigaction(SIGINT, &sa, NULL);
	sigset_t block;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &wait_mask);
	sigdelset(&wait_mask, SIGINT);
}

int nxc_wait_input(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (ppoll(&p, 1, NULL, &wait_mask) < 0)
		return errno == EINTR ? -2 : -1;
	return 0;
}

void nxc_reader_init(struct nxc_reader *r, int fd, size_t max)
{
	memset(r, 0, sizeof(*r));
	r->fd = fd;
	r->max = max;
}

void nxc_reader_free(struct nxc_reader *r)
{
	free(r->buf);
	r->buf = NULL;
}

int nxc_read_line(struct nxc_reader *r, char **line, size_t *len)
{
	for (;;) {
		char *nl = r->buf ? memchr(r->buf + r->start, '\n', r->end - r->start) : NULL;
		if (nl || (r->eof && r->end > r->start)) {
			char *s = r->buf + r->start;
			size_t n = nl ? (size_t)(nl - s) : r->end - r->start;
			s[n] = '\0'; /* over the '\n', or in the spare byte kept below */
			r->start += n + (nl ? 1 : 0);
			if (!nl)
				r->start = r->end;
			*line = s;
			*len = n;
			return 1;
		}
		if (r->eof)
			return 0;
		/* Make room: drop consumed bytes, grow when full (one byte spare for NUL). */
		if (r->start > 0) {
			memmove(r->buf, r->buf + r->start, r->end - r->start);
			r->end -= r->start;
			r->start = 0;
		}
		if (r->end + 1 >= r->cap) {
			if (r->end >= r->max) {
				errno = E2BIG;
				return -1;
			}
			size_t cap = r->cap ? r->cap * 2 : 4096;
			if (cap > r->max + 1)
				cap = r->max + 1;
			char *b = realloc(r->buf, cap);
			if (!b)
				return -1;
			r->buf = b;
			r->cap = cap;
		}
		int w = nxc_wait_input(r->fd);
		if (w < 0)
			return w;
		ssize_t k = read(r->fd, r->buf + r->end, r->cap - 1 - r->end);
		if (k < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -1;
		}
		if (k == 0)
			r->eof = true;
		r->end += (size_t)k;
	}
}

/* quiet: a failure is left for the caller to tell (errno kept). */
static int send_req(struct nxc_conn *c, json_t *req, bool quiet)
{
	char *s = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	size_t n = s ? strlen(s) : 0;
	char *line = s ? realloc(s, n + 2) : NULL;
	if (!line) {
		free(s);
		nxc_msg("cannot encode the request (out of memory)");
		return -1;
	}
	line[n++] = '\n';
	int rc = 0;
	for (size_t off = 0; off < n;) {
		ssize_t k = send(c->fd, line + off, n - off, MSG_NOSIGNAL);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (!quiet)
				nxc_msg("cannot send to %s: %s", c->path, strerror(errno));
			c->broken = true;
			rc = -1;
			break;
		}
		off += (size_t)k;
	}
	int e = errno;
	free(line);
	errno = e;
	return rc;
}

int nxc_send(struct nxc_conn *c, json_t *req)
{
	return send_req(c, req, false);
}

int nxc_next_event(struct nxc_conn *c, json_t **ev, const char **raw)
{
	char *line;
	size_t len;
	for (;;) {
		int rc = nxc_read_line(&c->rd, &line, &len);
		if (rc == -2)
			return rc;
		if (rc <= 0)
			c->broken = true;
		if (rc == 0)
			return 0;
		if (rc < 0) {
			nxc_msg("cannot read from %s: %s", c->path, strerror(errno));
			return -1;
		}
		if (len == 0)
			continue;
		json_error_t je;
		*ev = json_loadb(line, len, 0, &je);
		if (!*ev || !json_is_object(*ev)) {
			nxc_msg("nxd sent a line that is not a JSON object (%s): %.200s",
				*ev ? "not an object" : je.text, line);
			json_decref(*ev);
			*ev = NULL;
			c->broken = true;
			return -1;
		}
		*raw = line;
		return 1;
	}
}

const char *nxc_ev_name(json_t *ev)
{
	const char *s = json_string_value(json_object_get(ev, "event"));
	return s ? s : "";
}

bool nxc_ev_is(json_t *ev, int id)
{
	json_t *v = json_object_get(ev, "id");
	return json_is_integer(v) && json_integer_value(v) == id;
}

void nxc_print_error(json_t *ev)
{
	const char *msg = json_string_value(json_object_get(ev, "message"));
	const char *code = json_string_value(json_object_get(ev, "code"));
	nxc_msg("%s (%s)", msg ? msg : "error without a message", code ? code : "no code");
}

static int dial(struct nxc_conn *c)
{
	struct sockaddr_un a;
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	if (strlen(c->path) >= sizeof(a.sun_path)) {
		nxc_msg("cannot connect to %s: path longer than %zu bytes", c->path,
			sizeof(a.sun_path) - 1);
		return NXC_EXIT_NOCONN;
	}
	strcpy(a.sun_path, c->path);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		nxc_msg("socket(AF_UNIX) failed: %s", strerror(errno));
		return NXC_EXIT_ERROR;
	}
	int rc;
	do
		rc = connect(c->fd, (struct sockaddr *)&a, sizeof(a));
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		int err = errno;
		const char *hint = err == EACCES || err == EPERM ?
					   " (this user may not use the socket; the packaged units let root and group nxd in)" :
					   " (is nxd running?)";
		nxc_msg("cannot connect to %s: %s%s", c->path, strerror(err), hint);
		close(c->fd);
		c->fd = -1;
		return NXC_EXIT_NOCONN;
	}
	return 0;
}

int nxc_open(struct nxc_ctx *ctx, struct nxc_conn *c, json_t **hello_out)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->next_id = 1;
	if (!ctx->socket) {
		if (nxp_default_socket_path(ctx->socket_buf, sizeof(ctx->socket_buf))) {
			nxc_msg("the default socket path is too long (set --socket or NXD_SOCKET)");
			return NXC_EXIT_USAGE;
		}
		ctx->socket = ctx->socket_buf;
		/* A user without a daemon of their own talks to the system one (members
		 * of its socket group may): the per-user path only wins when it exists.
		 * A system socket this user may not reach (EACCES on /run/nxd) is still
		 * the one meant, so the error names it and the permission. */
		if (!getenv("NXD_SOCKET") && access(ctx->socket, F_OK) != 0 &&
		    (access(NXP_SYSTEM_SOCKET, F_OK) == 0 || errno == EACCES))
			ctx->socket = NXP_SYSTEM_SOCKET;
	}
	c->path = ctx->socket;
	int rc = dial(c);
	if (rc)
		return rc;
	nxc_reader_init(&c->rd, c->fd, NXC_MAX_EVENT);

	if (send_req(c, json_pack("{s:s, s:i}", "op", "hello", "version", NXP_VERSION), true)) {
		/* A daemon at its limit of clients writes why and closes at once:
		 * that line, when it came, says more than the broken pipe. */
		int e = errno;
		json_t *ev = NULL;
		const char *raw;
		if (nxc_next_event(c, &ev, &raw) > 0 && !strcmp(nxc_ev_name(ev), "error"))
			nxc_print_error(ev);
		else
			nxc_msg("cannot send to %s: %s", c->path, strerror(e));
		json_decref(ev);
		goto err;
	}
	for (;;) {
		json_t *ev;
		const char *raw;
		int k = nxc_next_event(c, &ev, &raw);
		if (k == -2) {
			if (nxc_interrupts) {
				nxc_close(c);
				return NXC_EXIT_INTR;
			}
			continue;
		}
		if (k == 0) {
			nxc_msg("%s closed the connection during the hello", c->path);
			goto err;
		}
		if (k < 0)
			goto err;
		const char *name = nxc_ev_name(ev);
		if (!strcmp(name, "error")) {
			nxc_print_error(ev);
			json_decref(ev);
			goto err;
		}
		if (!strcmp(name, "hello")) {
			json_t *v = json_object_get(ev, "version");
			if (!json_is_integer(v)) {
				nxc_msg("nxd at %s sent a hello whose 'version' is not an integer (got %s); nxctl "
					"speaks protocol version %d",
					c->path, nxp_json_type(v), NXP_VERSION);
				json_decref(ev);
				goto err;
			}
			if (json_integer_value(v) != NXP_VERSION) {
				nxc_msg("nxd at %s speaks protocol version %lld; nxctl speaks version %d", c->path,
					(long long)json_integer_value(v), NXP_VERSION);
				json_decref(ev);
				goto err;
			}
			if (hello_out)
				*hello_out = ev;
			else
				json_decref(ev);
			return 0;
		}
		json_decref(ev); /* nothing else is expected before hello; skip it */
	}
err:
	nxc_close(c);
	return NXC_EXIT_ERROR;
}

bool nxc_peer_gone(struct nxc_conn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLRDHUP };
	if (!c->broken && c->fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
		c->broken = true;
	return c->broken;
}

void nxc_close(struct nxc_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	nxc_reader_free(&c->rd);
}
