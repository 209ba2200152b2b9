/* server.c - nxd-http's libmicrohttpd glue: routes, bodies, keys, limits and deadlines, answers and streams. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/nxh.h"
#include "proto/proto.h"

/* A declared body up to this many times --max-body is read and dropped
 * before its 413; a larger one is refused at once. */
#define DRAIN_FACTOR 8

// --- answers

/* msg and param may quote a client's value cut at a byte count, inside a
 * UTF-8 sequence: scrubbed, or json_pack would refuse the whole answer. */
static json_t *error_body(const char *type, const char *param, const char *code, const char *msg)
{
	char m[1024], p[256];
	snprintf(m, sizeof(m), "%s", msg);
	snprintf(p, sizeof(p), "%s", param ? param : "");
	return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", nxp_utf8_scrub(m), "type", type, "param",
			 param ? nxp_utf8_scrub(p) : NULL, "code", code);
}

void nxh_req_answer(struct nxh_req *r, unsigned status, json_t *body)
{
	if (r->state == NXH_Q_SENT || r->stream) { /* too late for a new status */
		json_decref(body);
		return;
	}
	json_decref(r->answer);
	r->answer = body;
	r->status = status;
	r->state = NXH_Q_READY;
}

static void nxh_req_swap_answer(struct nxh_req *r, json_t *body)
{
	json_decref(r->answer);
	r->answer = body;
}

static void vfail(struct nxh_req *r, unsigned status, const char *type, const char *param, const char *code,
		  const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	nxh_debug("%s %s: %u %s", r->route ? r->route->method : "-", r->path ? r->path : "-", status, msg);
	nxh_req_answer(r, status, error_body(type, param, code, msg));
}

void nxh_req_fail(struct nxh_req *r, unsigned status, const char *type, const char *param, const char *code,
		  const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(r, status, type, param, code, fmt, ap);
	va_end(ap);
}

void nxh_req_bad(struct nxh_req *r, const char *param, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(r, 400, "invalid_request_error", param, NULL, fmt, ap);
	va_end(ap);
}

/* nxd names the field its message is about: "field 'max_tokens' must be ...". */
static void param_of(const char *msg, char *out, size_t cap)
{
	out[0] = '\0';
	const char *s = msg ? strstr(msg, "field '") : NULL;
	if (!s)
		return;
	s += 7;
	size_t n = strcspn(s, "'");
	if (s[n] != '\'' || n >= cap)
		return;
	memcpy(out, s, n);
	out[n] = '\0';
}

void nxh_req_fail_event(struct nxh_req *r, json_t *ev)
{
	const char *code = json_string_value(json_object_get(ev, "code"));
	const char *msg = json_string_value(json_object_get(ev, "message"));
	code = code ? code : "internal";
	msg = msg ? msg : "nxd gave no message";
	static const struct { const char *code; unsigned status; const char *type; } map[] = {
		{ "parse_error", 400, "invalid_request_error" },
		{ "bad_request", 400, "invalid_request_error" },
		{ "out_of_range", 400, "invalid_request_error" },
		{ "context_overflow", 400, "invalid_request_error" },
		{ "unknown_op", 400, "invalid_request_error" },
		{ "too_large", 413, "invalid_request_error" },
		{ "busy", 429, "rate_limit_error" },
		{ "not_found", 404, "invalid_request_error" },
		{ "forbidden", 403, "permission_error" },
		{ "shutting_down", 503, "server_error" },
		{ "unavailable", 503, "server_error" },
		{ "unsupported_version", 502, "server_error" },
	};
	unsigned status = 500;
	const char *type = "server_error";
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(map[i].code, code)) {
			status = map[i].status;
			type = map[i].type;
		}
	char param[128];
	param_of(msg, param, sizeof(param));
	/* param is the client's field: nxd's names for what the OpenAI routes sent it are not */
	bool openai = r->gen.api == NXH_API_CHAT || r->gen.api == NXH_API_COMPLETION;
	if (openai && !strcmp(code, "context_overflow"))
		snprintf(param, sizeof(param), "%s", r->gen.api == NXH_API_COMPLETION ? "prompt" : "messages");
	else if (openai && !strcmp(param, "format"))
		snprintf(param, sizeof(param), "response_format");
	nxh_req_fail(r, status, type, param[0] ? param : NULL, nxh_api_code(code), "%s", msg);
}

const char *nxh_api_code(const char *code)
{
	if (!strcmp(code, "unavailable"))
		return "nxd_unreachable";
	if (!strcmp(code, "busy"))
		return "rate_limit_exceeded";
	if (!strcmp(code, "context_overflow"))
		return "context_length_exceeded"; /* OpenAI's: clients that trim a chat's history look for it */
	return code;
}

// --- suspending and waking

/* The client's fd is watched from the first suspend until the request ends,
 * edge-triggered, so a stream costs no epoll_ctl per token; a hang-up seen
 * while libmicrohttpd has the connection is kept for the next suspend. */
static void watch_add(struct nxh_req *r)
{
	if (r->watch_fd >= 0)
		return;
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	r->watch_fd = ci ? ci->connect_fd : -1;
	if (r->watch_fd < 0)
		return;
	r->watch.kind = NXH_IO_WATCH;
	/* Only a hang-up: a pipelined next request (EPOLLIN) is libmicrohttpd's. */
	struct epoll_event e = { .events = EPOLLRDHUP | EPOLLET, .data.ptr = &r->watch };
	if (epoll_ctl(nxh.epfd, EPOLL_CTL_ADD, r->watch_fd, &e) < 0) {
		nxh_warn("epoll_ctl(ADD, client %d) failed: %s", r->watch_fd, strerror(errno));
		r->watch_fd = -1;
	}
}

static void watch_del(struct nxh_req *r)
{
	if (r->watch_fd >= 0)
		epoll_ctl(nxh.epfd, EPOLL_CTL_DEL, r->watch_fd, NULL);
	r->watch_fd = -1;
}

static void suspend(struct nxh_req *r)
{
	if (r->suspended || r->client_gone)
		return;
	if (r->hung_up) {
		nxh_req_client_gone(r); /* libmicrohttpd asks again and sees client_gone */
		return;
	}
	MHD_suspend_connection(r->conn);
	r->suspended = true;
	watch_add(r);
}

static void resume(struct nxh_req *r)
{
	if (!r->suspended)
		return;
	r->suspended = false;
	MHD_resume_connection(r->conn);
}

void nxh_req_hung_up(struct nxh_req *r)
{
	if (r->suspended)
		nxh_req_client_gone(r);
	else
		r->hung_up = true;
}

void nxh_req_wake(struct nxh_req *r)
{
	resume(r);
}

void nxh_req_client_gone(struct nxh_req *r)
{
	r->client_gone = true;
	nxh_up_close(&r->up); /* nxd frees the slot at its next step */
	resume(r);            /* libmicrohttpd then sees the closed socket */
}

// --- streams

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct nxh_req *r = cls;
	(void)pos;
	if (r->client_gone)
		return MHD_CONTENT_READER_END_WITH_ERROR;
	size_t left = nxh_buf_left(&r->out);
	if (left) {
		size_t n = left < max ? left : max;
		memcpy(buf, r->out.p + r->out.off, n);
		nxh_buf_take(&r->out, n);
		nxh_up_resume_reading(r);
		return (ssize_t)n;
	}
	if (r->out_end) /* broken: no last chunk, so the client knows it is cut */
		return r->out_error ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
	suspend(r);
	return 0;
}

void nxh_req_answer_text(struct nxh_req *r, unsigned status, const char *content_type)
{
	if (r->state == NXH_Q_SENT || r->stream)
		return;
	json_decref(r->answer);
	r->answer = NULL;
	r->plain = true;
	r->status = status;
	r->content_type = content_type;
	r->state = NXH_Q_READY;
}

void nxh_req_stream_start(struct nxh_req *r, const char *content_type)
{
	if (r->state == NXH_Q_SENT || r->stream)
		return;
	json_decref(r->answer);
	r->answer = NULL;
	r->stream = true;
	r->status = 200;
	r->content_type = content_type;
	r->state = NXH_Q_READY;
}

void nxh_req_stream_put(struct nxh_req *r, const char *s, size_t n)
{
	if (r->out_end || r->client_gone)
		return;
	if (nxh_buf_put(&r->out, s, n)) {
		nxh_err("out of memory for a stream of %zu bytes", nxh_buf_left(&r->out));
		r->out_end = r->out_error = true;
	}
	nxh_req_wake(r);
}

void nxh_req_stream_end(struct nxh_req *r, bool error)
{
	r->out_end = true;
	r->out_error = error;
	nxh_req_wake(r);
}

// --- queueing the answer

static enum MHD_Result queue_answer(struct nxh_req *r)
{
	struct MHD_Response *resp;
	r->state = NXH_Q_SENT;
	if (r->stream) {
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, r, NULL);
		if (resp) {
			MHD_add_response_header(resp, "Content-Type", r->content_type);
			MHD_add_response_header(resp, "Cache-Control", "no-cache");
			MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* nginx: pass each event on */
		}
	} else if (r->plain) {
		resp = MHD_create_response_from_buffer(nxh_buf_left(&r->out), r->out.p ? r->out.p + r->out.off : "",
						       MHD_RESPMEM_MUST_COPY);
		if (resp)
			MHD_add_response_header(resp, "Content-Type", r->content_type);
	} else {
		bool ollama = r->route ? r->route->flags & NXH_R_OLLAMA : r->path && !strncmp(r->path, "/api/", 5);
		if (ollama && r->status >= 400) {
			/* ollama's clients read {"error": "..."} */
			json_t *m = json_object_get(json_object_get(r->answer, "error"), "message");
			if (m)
				nxh_req_swap_answer(r, json_pack("{s:O}", "error", m));
		}
		char *s = r->answer ? json_dumps(r->answer, r->answer_dump ? r->answer_dump : JSON_COMPACT) : NULL;
		if (!s) {
			s = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
				   "\"code\":null}}");
			r->status = 500;
		}
		size_t n = s ? strlen(s) : 0;
		if (s && n && s[n - 1] != '\n') {
			char *t = realloc(s, n + 2);
			if (t) {
				s = t;
				s[n++] = '\n';
				s[n] = '\0';
			}
		}
		resp = s ? MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE) : NULL;
		if (!resp)
			free(s);
		else
			MHD_add_response_header(resp, "Content-Type",
						r->content_type ? r->content_type : "application/json");
	}
	if (!resp)
		return MHD_NO;
	if (r->status == 401)
		MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
	if (r->status == 405 && r->allow)
		MHD_add_response_header(resp, "Allow", r->allow);
	if (r->status == 503 || r->status == 429)
		MHD_add_response_header(resp, "Retry-After", "1");
	if ((r->hc && r->hc->over_limit) || r->close)
		MHD_add_response_header(resp, "Connection", "close");
	enum MHD_Result ret = MHD_queue_response(r->conn, r->status, resp);
	MHD_destroy_response(resp);
	return ret;
}

// --- routes

/* The route of method and url, or NULL; *allow is then the method the URL
 * takes ("GET, HEAD" for GET), or NULL where no route has the URL. */
static const struct nxh_route *find_route(const char *method, const char *url, const char **allow)
{
	*allow = NULL;
	if (!strcmp(method, "HEAD"))
		method = "GET";
	for (size_t i = 0; i < nxh_n_routes; i++) {
		const struct nxh_route *rt = &nxh_routes[i];
		bool hit = rt->prefix ? !strncmp(url, rt->path, strlen(rt->path)) && url[strlen(rt->path)] :
					!strcmp(url, rt->path);
		if (!hit || ((rt->flags & NXH_R_ADMIN) && !nxh.have_admin))
			continue;
		if (!strcmp(rt->method, method))
			return rt;
		*allow = !strcmp(rt->method, "GET") ? "GET, HEAD" : rt->method;
	}
	return NULL;
}

struct header_walk {
	size_t bytes;             /* the headers' names and values, as sent */
	const char *length;       /* the first Content-Length */
	bool lengths_differ;      /* a second one says otherwise (RFC 9112 6.3: an error) */
};

static enum MHD_Result header_walk(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	(void)kind;
	struct header_walk *w = cls;
	w->bytes += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": ", CRLF */
	if (value && !strcasecmp(key, "Content-Length")) {
		if (w->length && strcmp(w->length, value))
			w->lengths_differ = true;
		w->length = w->length ? w->length : value;
	}
	return MHD_YES;
}

static const char *header(struct nxh_req *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* What can be refused from the headers alone. 0, or -1 with the answer set. */
static int check_headers(struct nxh_req *r, const char *method, const char *url)
{
	if (r->hc && r->hc->over_limit) {
		nxh_req_fail(r, 503, "server_error", NULL, "too_many_connections",
			     "too many connections (limit %u); try again later", nxh.o.max_connections);
		return -1;
	}
	/* The pool libmicrohttpd reads them into is larger (it holds its buffers too): the limit is this one. */
	struct header_walk hw = { 0 };
	MHD_get_connection_values(r->conn, MHD_HEADER_KIND, header_walk, &hw);
	if (hw.lengths_differ) {
		nxh_req_fail(r, 400, "invalid_request_error", NULL, "bad_request",
			     "the request has Content-Length headers that differ");
		r->close = true; /* where its body ends, and so the next request begins, is not known */
		return -1;
	}
	if (strlen(url) > nxh.o.max_header) {
		nxh_req_fail(r, 414, "invalid_request_error", NULL, "uri_too_long",
			     "the request URL of %zu bytes is over the limit of %zu bytes (--max-header)", strlen(url),
			     nxh.o.max_header);
		return -1;
	}
	if (hw.bytes > nxh.o.max_header) {
		nxh_req_fail(r, 431, "invalid_request_error", NULL, "headers_too_large",
			     "the request headers of %zu bytes are over the limit of %zu bytes (--max-header)", hw.bytes,
			     nxh.o.max_header);
		return -1;
	}
	r->route = find_route(method, url, &r->allow);
	if (!r->route) {
		if (r->allow)
			nxh_req_fail(r, 405, "invalid_request_error", NULL, "method_not_allowed",
				     "%s is not allowed on %s (it takes %s)", method, url, r->allow);
		else
			nxh_req_fail(r, 404, "invalid_request_error", NULL, "unknown_url", "Unknown request URL: %s %s",
				     method, url);
		return -1;
	}
	const char *auth = header(r, "Authorization");
	if (r->route->flags & NXH_R_ADMIN) {
		if (!nxh_keys_match(&nxh.admin_keys, auth)) {
			nxh_req_fail(r, 401, "invalid_request_error", NULL, "invalid_api_key",
				     auth ? "Incorrect admin key provided" :
					    "This endpoint needs an admin key: send \"Authorization: Bearer KEY\"");
			return -1;
		}
	} else if (nxh.have_keys && !(r->route->flags & NXH_R_OPEN) && !nxh_keys_match(&nxh.keys, auth)) {
		nxh_req_fail(r, 401, "invalid_request_error", NULL, "invalid_api_key",
			     auth ? "Incorrect API key provided" :
				    "You didn't provide an API key: send \"Authorization: Bearer KEY\"");
		return -1;
	}
	const char *cl = header(r, "Content-Length");
	if (cl) {
		char *end;
		errno = 0;
		unsigned long long n = strtoull(cl, &end, 10);
		if (errno || *end || end == cl || n > nxh.o.max_body * DRAIN_FACTOR) {
			nxh_req_fail(r, 413, "invalid_request_error", NULL, "body_too_large",
				     "the request body of %s bytes is over the limit of %zu bytes", cl, nxh.o.max_body);
			return -1;
		}
		/* Somewhat over the limit: read and drop the body, then answer. An
		 * answer while the client is still sending would be lost to the
		 * reset that closing a socket with unread bytes sends. */
		if (n > nxh.o.max_body)
			r->body_too_large = true;
	}
	return 0;
}

/* The body is in: parse it, let the route check it, go to nxd. */
static enum MHD_Result dispatch(struct nxh_req *r)
{
	if (r->body_too_large) {
		nxh_req_fail(r, 413, "invalid_request_error", NULL, "body_too_large",
			     "the request body is over the limit of %zu bytes", nxh.o.max_body);
		return queue_answer(r);
	}
	if (r->route->flags & NXH_R_JSON) {
		json_error_t je;
		r->json = r->body.len ? json_loadb(r->body.p, r->body.len, JSON_REJECT_DUPLICATES, &je) : NULL;
		if (!r->json) {
			if (r->body.len)
				nxh_req_bad(r, NULL, "the body is not valid JSON: %s at line %d, column %d", nxp_json_error(&je),
					    je.line, je.column);
			else
				nxh_req_bad(r, NULL, "the body must be a JSON object, and is empty");
			return queue_answer(r);
		}
		if (!json_is_object(r->json)) {
			nxh_req_bad(r, NULL, "the body must be a JSON object");
			return queue_answer(r);
		}
	}
	nxh_buf_free(&r->body);
	if (r->route->begin(r) < 0 || r->state == NXH_Q_READY)
		return queue_answer(r);
	if (nxh_up_start(r) < 0)
		return queue_answer(r);
	r->state = NXH_Q_WAITING;
	suspend(r);
	return MHD_YES;
}

static struct nxh_req *req_new(struct MHD_Connection *c, const char *url)
{
	struct nxh_req *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->conn = c;
	r->watch_fd = -1;
	r->up.fd = -1;
	r->path = strdup(url);
	r->t_start = nxh_now();
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	r->hc = ci ? ci->socket_context : NULL;
	if (r->hc) {
		r->hc->req = r;
		r->hc->in_request = true;
		r->hc->body_done = false;
		r->hc->phase_start = r->t_start;
	}
	nxh.in_flight++;
	return r;
}

static enum MHD_Result ahc(void *cls, struct MHD_Connection *c, const char *url, const char *method,
			   const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct nxh_req *r = *con_cls;
	(void)cls;
	(void)version;
	if (!r) {
		r = req_new(c, url);
		if (!r)
			return MHD_NO;
		*con_cls = r;
		if (nxh.stopping)
			nxh_req_fail(r, 503, "server_error", NULL, "shutting_down", "nxd-http is shutting down");
		else if (check_headers(r, method, url) == 0)
			return MHD_YES; /* the body (if any) comes next */
		return queue_answer(r);
	}
	if (r->state == NXH_Q_READING) {
		if (*upload_size) {
			if (!r->body_too_large && r->body.len + *upload_size > nxh.o.max_body) {
				r->body_too_large = true; /* chunked bodies have no Content-Length to check */
				nxh_buf_free(&r->body);
			}
			if (!r->body_too_large && nxh_buf_put(&r->body, upload, *upload_size))
				return MHD_NO;
			*upload_size = 0;
			return MHD_YES;
		}
		if (r->hc)
			r->hc->body_done = true;
		return dispatch(r);
	}
	if (*upload_size) { /* the rest of a body we answered before reading it */
		*upload_size = 0;
		return MHD_YES;
	}
	if (r->client_gone)
		return MHD_NO;
	if (r->state == NXH_Q_READY)
		return queue_answer(r);
	if (r->state == NXH_Q_WAITING)
		suspend(r); /* woken with nothing to say yet */
	return MHD_YES;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct nxh_req *r = *con_cls;
	(void)cls;
	(void)c;
	if (!r)
		return;
	*con_cls = NULL;
	unsigned status = r->state == NXH_Q_SENT ? r->status : 499; /* nginx's "client closed request" */
	if (r->client_gone || (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->stream && !r->out_end))
		status = 499;
	nxh_metrics_request(r->route ? r->route->metric : "other", status);
	if (r->up.fd >= 0)
		nxh_debug("%s: client gone; closing its nxd request %llu", r->path, (unsigned long long)r->up_id);
	nxh_up_close(&r->up);
	watch_del(r);
	if (r->hc) {
		r->hc->req = NULL;
		r->hc->in_request = false;
		r->hc->fresh = false;
		r->hc->phase_start = nxh_now();
	}
	nxh_gen_free(&r->gen);
	json_decref(r->json);
	json_decref(r->answer);
	nxh_buf_free(&r->body);
	nxh_buf_free(&r->out);
	free(r->path);
	free(r);
	nxh.in_flight--;
}

static void conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
			enum MHD_ConnectionNotificationCode code)
{
	(void)cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		struct nxh_conn *hc = calloc(1, sizeof(*hc));
		if (!hc)
			return;
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
		hc->conn = c;
		hc->fd = ci ? ci->connect_fd : -1;
		hc->fresh = true;
		hc->phase_start = nxh_now();
		hc->over_limit = nxh.n_conns >= nxh.o.max_connections;
		hc->next = nxh.conns;
		if (nxh.conns)
			nxh.conns->prev = hc;
		nxh.conns = hc;
		nxh.n_conns++;
		*socket_context = hc;
		return;
	}
	struct nxh_conn *hc = *socket_context;
	if (!hc)
		return;
	if (hc->prev)
		hc->prev->next = hc->next;
	else
		nxh.conns = hc->next;
	if (hc->next)
		hc->next->prev = hc->prev;
	nxh.n_conns--;
	free(hc);
	*socket_context = NULL;
}

// --- deadlines libmicrohttpd does not keep

/* A slow request line, headers or body: libmicrohttpd's idle timeout
 * restarts with every byte, so a client sending one byte a second would
 * hold its connection for ever. Those get a 408 and the connection closed. */
static void timeout(struct nxh_conn *hc, const char *what)
{
	static const char body[] = "{\"error\":{\"message\":\"request timeout: the request's %s took too long\","
				   "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"request_timeout\"}}\n";
	char b[512], all[1024];
	int n = snprintf(b, sizeof(b), body, what);
	int m = snprintf(all, sizeof(all),
			 "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
			 "Content-Length: %d\r\n\r\n%s",
			 n, b);
	nxh_debug("connection %d: %s too slow, closing", hc->fd, what);
	hc->killed = true;
	nxh_metrics_request("other", 408);
	/* libmicrohttpd has sent nothing on this connection yet. */
	if (send(hc->fd, all, (size_t)m, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		/* the client is gone or not reading: closing is all there is */
	}
	shutdown(hc->fd, SHUT_RDWR); /* libmicrohttpd sees the end and closes it */
}

void nxh_server_tick(double now)
{
	for (struct nxh_conn *hc = nxh.conns; hc; hc = hc->next) {
		if (hc->killed || hc->fd < 0)
			continue;
		double age = now - hc->phase_start;
		if (!hc->in_request && hc->fresh && age > nxh.o.header_timeout)
			timeout(hc, "headers");
		else if (!hc->in_request && !hc->fresh && age > nxh.o.idle_timeout + nxh.o.header_timeout)
			timeout(hc, "headers");
		else if (hc->in_request && !hc->body_done && hc->req && hc->req->state == NXH_Q_READING &&
			 age > nxh.o.body_timeout)
			timeout(hc, "body");
	}
}

// --- start and stop

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	char msg[512];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	msg[strcspn(msg, "\n")] = '\0';
	nxh_debug("libmicrohttpd: %s", msg);
}

int nxh_server_start(int listen_fd)
{
	nxh.mhd = MHD_start_daemon(
		MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL, NULL, ahc, NULL,
		MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, /* first: it covers the other options' messages */
		MHD_OPTION_LISTEN_SOCKET, listen_fd,
		/* Past max_connections a connection still gets its 503; past
		 * this, libmicrohttpd closes it at accept. */
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)(nxh.o.max_connections + 64),
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)nxh.o.idle_timeout,
		/* Request line and headers live in this pool: past it, 431 or 414. */
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(nxh.o.max_header + 16384),
		MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
		MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
		MHD_OPTION_NOTIFY_CONNECTION, conn_notify, NULL,
		MHD_OPTION_END);
	if (!nxh.mhd)
		return -1;
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(nxh.mhd, MHD_DAEMON_INFO_EPOLL_FD);
	if (!di)
		return -1;
	nxh.mhd_io.kind = NXH_IO_MHD;
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = &nxh.mhd_io };
	return epoll_ctl(nxh.epfd, EPOLL_CTL_ADD, di->epoll_fd, &e);
}

void nxh_server_stop(void)
{
	if (!nxh.mhd)
		return;
	/* Suspended connections must be resumed before the daemon stops. */
	for (struct nxh_conn *hc = nxh.conns; hc; hc = hc->next)
		if (hc->req && hc->req->suspended) {
			hc->req->client_gone = true;
			nxh_up_close(&hc->req->up);
			resume(hc->req);
		}
	MHD_run(nxh.mhd);
	MHD_stop_daemon(nxh.mhd);
	nxh.mhd = NULL;
}
