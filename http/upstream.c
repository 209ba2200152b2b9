/* upstream.c - one Unix socket to nxd per HTTP request: connect, hello, the request, its events. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "http/nxh.h"
#include "proto/proto.h"

#define req_of(u) ((struct nxh_req *)((char *)(u) - offsetof(struct nxh_req, up)))

static void set_events(struct nxh_up *u)
{
	uint32_t ev = 0;
	if (!u->paused)
		ev |= EPOLLIN;
	if (nxh_buf_left(&u->out))
		ev |= EPOLLOUT;
	if (ev == u->events)
		return;
	struct epoll_event e = { .events = ev, .data.ptr = &u->io };
	if (epoll_ctl(nxh.epfd, EPOLL_CTL_MOD, u->fd, &e) < 0)
		nxh_err("epoll_ctl(MOD, nxd socket %d) failed: %s", u->fd, strerror(errno));
	u->events = ev;
}

/* Hands the route an "unavailable" error event for r, as if nxd had sent it. */
static void answer_unavailable(struct nxh_req *r, const char *msg)
{
	nxh_metrics_upstream_error();
	json_t *ev = json_pack("{s:I, s:s, s:s, s:s}", "id", (json_int_t)r->up_id, "event", "error", "code",
			       "unavailable", "message", msg);
	if (ev)
		r->route->event(r, ev);
	json_decref(ev);
}

/* A made-up error event: the request ends as if nxd had answered it. */
static void lost(struct nxh_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lost(struct nxh_req *r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	nxh_up_close(&r->up);
	answer_unavailable(r, msg);
}

/* Before anything was sent: the same made-up error, so every route answers
 * an unreachable nxd its own way (503 for the APIs, "unavailable" for /health). */
static int unreachable(struct nxh_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int unreachable(struct nxh_req *r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r->up.fd >= 0)
		close(r->up.fd);
	r->up.fd = -1;
	r->up.state = NXH_UP_CLOSED;
	nxh_buf_free(&r->up.out);
	answer_unavailable(r, msg);
	return -1;
}

static int queue_line(struct nxh_up *u, json_t *req)
{
	char *s = json_dumps(req, JSON_COMPACT);
	int rc = s ? 0 : -1;
	if (s && (nxh_buf_put(&u->out, s, strlen(s)) || nxh_buf_put(&u->out, "\n", 1)))
		rc = -1;
	free(s);
	return rc;
}

int nxh_up_start(struct nxh_req *r)
{
	struct nxh_up *u = &r->up;
	u->io.kind = NXH_IO_UPSTREAM;
	u->fd = -1;
	r->up_id = ++nxh.next_id;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(nxh.o.socket) >= sizeof(a.sun_path))
		return unreachable(r, "nxd's socket path is too long");
	strcpy(a.sun_path, nxh.o.socket);
	u->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (u->fd < 0)
		return unreachable(r, "socket(AF_UNIX) failed: %s", strerror(errno));
	/* A Unix connect completes at once, or EAGAIN when nxd's backlog is
	 * full: then there is no room for us either. */
	if (connect(u->fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		return unreachable(r, "nxd is unreachable at %s: %s", nxh.o.socket, strerror(errno));
	json_t *hello = json_pack("{s:s, s:i}", "op", "hello", "version", NXP_VERSION);
	int rc = hello ? queue_line(u, hello) : -1;
	json_decref(hello);
	if (rc)
		return unreachable(r, "out of memory");
	u->state = NXH_UP_HELLO;
	u->deadline = nxh_now() + nxh.o.upstream_timeout;
	u->events = EPOLLIN | EPOLLOUT;
	struct epoll_event e = { .events = u->events, .data.ptr = &u->io };
	if (epoll_ctl(nxh.epfd, EPOLL_CTL_ADD, u->fd, &e) < 0)
		return unreachable(r, "epoll_ctl(ADD, nxd socket) failed: %s", strerror(errno));
	return 0;
}

void nxh_up_close(struct nxh_up *u)
{
	if (u->fd >= 0) {
		epoll_ctl(nxh.epfd, EPOLL_CTL_DEL, u->fd, NULL);
		close(u->fd);
	}
	u->fd = -1;
	u->state = NXH_UP_CLOSED;
	nxh_buf_free(&u->in);
	nxh_buf_free(&u->out);
}

static void remember_hello(const json_t *ev)
{
	struct nxh_model *m = &nxh.model;
	const char *name = json_string_value(json_object_get(ev, "model"));
	const char *arch = json_string_value(json_object_get(ev, "arch"));
	snprintf(m->name, sizeof(m->name), "%s", name ? name : "");
	snprintf(m->arch, sizeof(m->arch), "%s", arch ? arch : "");
	m->n_ctx = (int)json_integer_value(json_object_get(ev, "n_ctx"));
	m->n_vocab = (int)json_integer_value(json_object_get(ev, "n_vocab"));
	m->max_tokens = (int)json_integer_value(json_object_get(ev, "max_tokens"));
	if (m->max_tokens <= 0)
		m->max_tokens = m->n_ctx;
	m->known = true;
}

static void on_hello(struct nxh_req *r, json_t *ev)
{
	struct nxh_up *u = &r->up;
	const char *name = json_string_value(json_object_get(ev, "event"));
	if (!name || strcmp(name, "hello")) {
		if (name && !strcmp(name, "error")) { /* busy: too many connections */
			nxh_up_close(u);
			r->route->event(r, ev);
			return;
		}
		lost(r, "nxd answered the hello with '%s'", name ? name : "no event");
		return;
	}
	json_int_t v = json_integer_value(json_object_get(ev, "version"));
	if (v != NXP_VERSION) {
		lost(r, "nxd speaks protocol version %lld; nxd-http speaks version %d", (long long)v, NXP_VERSION);
		return;
	}
	remember_hello(ev);
	u->deadline = 0;
	json_t *req = r->route->build(r, ev);
	if (!req) { /* the answer is set */
		nxh_up_close(u);
		nxh_req_wake(r);
		return;
	}
	json_object_set_new(req, "id", json_integer((json_int_t)r->up_id));
	int rc = queue_line(u, req);
	json_decref(req);
	if (rc) {
		nxh_up_close(u);
		nxh_req_fail(r, 500, "server_error", NULL, NULL, "out of memory");
		nxh_req_wake(r);
		return;
	}
	u->state = NXH_UP_RUNNING;
}

static bool is_final(const char *name)
{
	return strcmp(name, "token") && strcmp(name, "progress") && strcmp(name, "tool_call");
}

/* One line from nxd. Returns false once the request is over. */
static bool on_line(struct nxh_req *r, const char *line, size_t len)
{
	json_error_t je;
	json_t *ev = json_loadb(line, len, 0, &je);
	if (!ev || !json_is_object(ev)) {
		json_decref(ev);
		lost(r, "nxd sent a line that is not a JSON object: %s", je.text);
		return false;
	}
	bool more = true;
	if (r->up.state == NXH_UP_HELLO) {
		on_hello(r, ev);
		more = r->up.state == NXH_UP_RUNNING;
	} else {
		const char *name = json_string_value(json_object_get(ev, "event"));
		json_t *id = json_object_get(ev, "id");
		if (!name) {
			lost(r, "nxd sent an event without a name");
			more = false;
		} else if (json_is_integer(id) && (uint64_t)json_integer_value(id) == r->up_id) {
			more = !is_final(name);
			if (!more)
				nxh_up_close(&r->up); /* before the answer: nothing runs on it now */
			r->route->event(r, ev);
		} else if (!strcmp(name, "error")) { /* id null: a line nxd could not parse */
			nxh_up_close(&r->up);
			r->route->event(r, ev);
			more = false;
		}
	}
	json_decref(ev);
	return more;
}

static void drain_lines(struct nxh_req *r)
{
	struct nxh_up *u = &r->up;
	while (u->state == NXH_UP_HELLO || u->state == NXH_UP_RUNNING) {
		char *s = u->in.p + u->in.off;
		char *nl = memchr(s, '\n', nxh_buf_left(&u->in));
		if (!nl)
			return;
		size_t n = (size_t)(nl - s);
		/* on_line parses the line before anything can close u (and free in). */
		bool more = on_line(r, s, n);
		if (u->state == NXH_UP_CLOSED || !more)
			return;
		nxh_buf_take(&u->in, n + 1);
	}
}

static void do_read(struct nxh_req *r)
{
	struct nxh_up *u = &r->up;
	for (int rounds = 0; rounds < 16 && u->fd >= 0 && !u->paused; rounds++) {
		char buf[65536];
		ssize_t k = recv(u->fd, buf, sizeof(buf), 0);
		if (k < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (k <= 0) {
			lost(r, k == 0 ? "nxd closed the connection before the answer was complete" :
					 "reading from nxd failed");
			return;
		}
		if (nxh_buf_left(&u->in) + (size_t)k > NXH_UP_MAX_EVENT) {
			lost(r, "nxd sent an event longer than %zu bytes", NXH_UP_MAX_EVENT);
			return;
		}
		if (nxh_buf_put(&u->in, buf, (size_t)k)) {
			lost(r, "out of memory reading from nxd");
			return;
		}
		drain_lines(r);
		if ((size_t)k < sizeof(buf))
			return;
	}
}

static void do_write(struct nxh_req *r)
{
	struct nxh_up *u = &r->up;
	while (u->fd >= 0 && nxh_buf_left(&u->out)) {
		ssize_t k = send(u->fd, u->out.p + u->out.off, nxh_buf_left(&u->out), MSG_NOSIGNAL);
		if (k < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (k < 0) {
			lost(r, "sending to nxd failed: %s", strerror(errno));
			return;
		}
		nxh_buf_take(&u->out, (size_t)k);
	}
}

void nxh_up_io(struct nxh_up *u, uint32_t events)
{
	struct nxh_req *r = req_of(u);
	if (u->fd < 0)
		return;
	if (events & EPOLLOUT)
		do_write(r);
	if (u->fd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		do_read(r);
	if (u->fd >= 0 && u->paused && (events & (EPOLLHUP | EPOLLERR)))
		lost(r, "nxd closed the connection");
	if (u->fd >= 0) {
		/* Events were queued for the client: stop reading past the mark. */
		u->paused = nxh_buf_left(&r->out) > NXH_OUT_HIGH;
		set_events(u);
	}
}

void nxh_up_resume_reading(struct nxh_req *r)
{
	struct nxh_up *u = &r->up;
	if (u->fd < 0 || !u->paused || nxh_buf_left(&r->out) > NXH_OUT_HIGH / 2)
		return;
	u->paused = false;
	set_events(u);
}

void nxh_up_tick(struct nxh_req *r, double now)
{
	struct nxh_up *u = &r->up;
	if (u->fd >= 0 && u->state == NXH_UP_HELLO && u->deadline && now > u->deadline)
		lost(r, "nxd did not answer within %u s (starting, or overloaded)", nxh.o.upstream_timeout);
}
