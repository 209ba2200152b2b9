/* nxh.h - nxd-http, the HTTP gateway (one more client of nxd's socket): what its files share.
 *
 * One thread, one epoll loop (main.c): libmicrohttpd runs in "external"
 * mode with its epoll fd in our set, next to one Unix socket to nxd per
 * HTTP request in flight (upstream.c). A request becomes: connect, hello,
 * one protocol request, its events; closing that socket is how a request is
 * cancelled (nxd ends a vanished client's requests at the next step). A
 * connection that waits for nxd is suspended in libmicrohttpd, and its fd
 * is watched for a hang-up (libmicrohttpd does not look at suspended
 * connections), so a client that goes away is noticed at once.
 *
 * Files: main.c (options, start-up, loop, shutdown), server.c (libmicrohttpd
 * glue: routes, bodies, keys, limits, responses), upstream.c (the nxd
 * socket), openai.c (the OpenAI API), ollama.c (the ollama API), info.c
 * (models, tokenize, health), metrics.c (/metrics), sandbox.c (seccomp). */
#ifndef NXH_H
#define NXH_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>
#include <microhttpd.h>

#define NXH_VERSION "0.1.0"
#define NXH_MAX_KEY 255            /* bytes of an API key */
#define NXH_MAX_KEYS 64            /* keys per file */
#define NXH_UP_MAX_EVENT ((size_t)16 << 20) /* longest event line taken from nxd */
#define NXH_OUT_HIGH ((size_t)1 << 20)      /* unsent bytes past which nxd's socket is not read */

// --- growing byte buffers (util.c)

struct nxh_buf {
	char *p;
	size_t len, cap;
	size_t off;  /* bytes consumed from the front */
};

int nxh_buf_put(struct nxh_buf *b, const void *s, size_t n); /* 0, or -1 out of memory */
int nxh_buf_printf(struct nxh_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
size_t nxh_buf_left(const struct nxh_buf *b);               /* len - off */
void nxh_buf_take(struct nxh_buf *b, size_t n);              /* consumes n, compacts when empty */
void nxh_buf_free(struct nxh_buf *b);

double nxh_now(void);                                        /* CLOCK_MONOTONIC seconds */

// --- logging (util.c): "nxd-http: ..." on stderr

enum { NXH_LOG_ERROR, NXH_LOG_WARN, NXH_LOG_INFO, NXH_LOG_DEBUG };
extern int nxh_log_level;
void nxh_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define nxh_err(...) nxh_log(NXH_LOG_ERROR, __VA_ARGS__)
#define nxh_warn(...) nxh_log(NXH_LOG_WARN, __VA_ARGS__)
#define nxh_info(...) nxh_log(NXH_LOG_INFO, __VA_ARGS__)
#define nxh_debug(...) nxh_log(NXH_LOG_DEBUG, __VA_ARGS__)

// --- options (main.c)

struct nxh_opts {
	const char *socket;          /* nxd's socket */
	char socket_buf[256];
	const char *listen;          /* "ADDR:PORT", "[V6]:PORT" */
	const char *api_key_file;    /* keys for every endpoint but /health */
	const char *admin_key_file;  /* keys for /admin/...; without it those routes do not exist */
	const char *model_id;        /* the id clients name; NULL: the model's name from nxd */
	unsigned max_connections;    /* past it: 503 and the connection is closed */
	size_t max_body;             /* bytes; past it 413 */
	size_t max_header;           /* bytes of request line + headers; past it 431 (libmicrohttpd) */
	unsigned idle_timeout;       /* s without traffic on a connection */
	unsigned header_timeout;     /* s for a new connection's request line and headers */
	unsigned body_timeout;       /* s for a request's body once its headers are in */
	unsigned upstream_timeout;   /* s for nxd's hello */
	bool no_sandbox;             /* tests under strace, debugging */
	bool seccomp_trap;           /* name a forbidden syscall instead of dying silently */
};

// --- API keys (keys.c)

struct nxh_keys {
	unsigned char key[NXH_MAX_KEYS][NXH_MAX_KEY + 1]; /* zero-padded */
	size_t len[NXH_MAX_KEYS];
	int n;
};

/* Reads one key a line ('#' comments and blank lines skipped). 0, or -1 with msg. */
int nxh_keys_load(struct nxh_keys *k, const char *path, char *msg, size_t msg_cap);
/* Whether the "Authorization" header value carries one of the keys as
 * "Bearer KEY". Time depends on the number of keys, never on their bytes. */
bool nxh_keys_match(const struct nxh_keys *k, const char *authorization);

// --- epoll registrations: every fd in the loop points at one of these

enum nxh_io_kind { NXH_IO_MHD, NXH_IO_SIGNAL, NXH_IO_UPSTREAM, NXH_IO_WATCH };
struct nxh_io {
	enum nxh_io_kind kind;
};

/* What nxd's last hello said. */
struct nxh_model {
	char name[256];      /* the model's name */
	char arch[64];
	int n_ctx, n_vocab, max_tokens;
	bool known;
};

// --- a request to nxd (upstream.c)

enum nxh_up_state { NXH_UP_NONE, NXH_UP_HELLO, NXH_UP_RUNNING, NXH_UP_CLOSED };

struct nxh_up {
	struct nxh_io io;        /* NXH_IO_UPSTREAM */
	int fd;
	enum nxh_up_state state;
	struct nxh_buf in, out;
	double deadline;         /* for the hello; 0 once it came */
	uint32_t events;         /* what epoll watches now */
	bool paused;             /* not read while the HTTP client has NXH_OUT_HIGH unsent */
};

struct nxh_req;

/* A route: what turns a body into one protocol request, and its events into
 * the HTTP answer. begin runs once the body is in (r->body parsed when the
 * route takes JSON): 0 to go to nxd, or -1 with the answer set (an error).
 * build runs on nxd's hello: the request line (id and op included), or NULL
 * with the answer set. event gets every event of that request. */
struct nxh_route {
	const char *method;      /* "GET", "POST" */
	const char *path;        /* exact, or a prefix ending in '/' when prefix is set */
	bool prefix;
	unsigned flags;
	const char *metric;      /* endpoint label in /metrics */
	int (*begin)(struct nxh_req *r);
	json_t *(*build)(struct nxh_req *r, const json_t *hello);
	void (*event)(struct nxh_req *r, json_t *ev);
};

/* nxd writes a logprob, a float, with 9 significant digits; jansson's
 * default of 17 would print the double's binary tail after them. For the
 * OpenAI answers, whose only reals are logprobs; not for ollama's, whose tool
 * arguments carry the model's own numbers. */
#define NXH_DUMP_LOGPROBS (JSON_COMPACT | JSON_REAL_PRECISION(9))

enum {
	NXH_R_JSON = 1,     /* the body must be a JSON object */
	NXH_R_OPEN = 2,     /* no API key needed (/health) */
	NXH_R_ADMIN = 4,    /* an admin key is needed; absent unless --admin-key-file */
	NXH_R_OLLAMA = 8,   /* errors in ollama's shape: {"error": "message"} */
};

/* What a generate request is turned back into. */
enum nxh_api { NXH_API_CHAT, NXH_API_COMPLETION, NXH_API_OLLAMA_CHAT, NXH_API_OLLAMA_GENERATE };

struct nxh_gen {
	enum nxh_api api;
	json_t *req;             /* the generate fields (no id, op, max_tokens default) */
	char *model;             /* as the client named it */
	bool as_adapter;         /* model names an adapter, not the served model */
	bool stream, include_usage, started;
	bool has_max_tokens;
	bool logprobs;           /* per-token log-probabilities asked for */
	int top_logprobs;        /* alternatives per token (0..20) */
	char id[48];             /* "chatcmpl-..." */
	long long created;
	struct nxh_buf text;     /* the whole text (non-streamed answers) */
	struct nxh_buf sse_head; /* a streamed chunk's serialised start, up to its choices (sse_text) */
	json_t *lp;              /* logprobs gathered (non-streamed answers) */
	size_t text_offset;      /* completions' logprobs: characters (code points) of text so far */
	int n_tokens;            /* token events seen */
	json_t *tool_calls;      /* the calls nxd made of the answer (non-streamed answers), in the API's shape */
	double t_last;           /* the previous token event, for the per-token latency */
};

enum nxh_req_state {
	NXH_Q_READING,   /* headers in, body coming */
	NXH_Q_WAITING,   /* waiting for nxd (suspended) */
	NXH_Q_READY,     /* the answer (or the stream's start) is there to queue */
	NXH_Q_SENT,      /* a response is queued */
};

struct nxh_conn;

struct nxh_req {
	struct MHD_Connection *conn;
	struct nxh_conn *hc;
	const struct nxh_route *route;
	char *path;              /* the URL path, owned */
	enum nxh_req_state state;
	struct nxh_buf body;
	bool body_too_large;
	json_t *json;            /* the body, parsed */
	bool suspended, client_gone;
	struct nxh_io watch;     /* NXH_IO_WATCH: the client's fd, from the first suspend to the end */
	int watch_fd;
	bool hung_up;            /* the watch saw a hang-up while libmicrohttpd had the connection */
	double t_start, t_first;

	/* The answer: a JSON body with a status, or a stream. */
	unsigned status;
	const char *allow;       /* a 405's Allow header: the method the URL takes */
	bool close;              /* the connection closes after the answer */
	json_t *answer;
	size_t answer_dump;      /* json_dumps flags for answer: JSON_COMPACT unless set (NXH_DUMP_LOGPROBS) */
	bool stream;             /* an SSE / NDJSON stream follows the headers */
	bool plain;              /* the answer is the text in out (/metrics), not JSON */
	const char *content_type;
	struct nxh_buf out;      /* stream bytes not yet taken by libmicrohttpd */
	bool out_end, out_error; /* the stream is complete / broken */

	struct nxh_up up;
	uint64_t up_id;          /* the protocol request id */
	struct nxh_gen gen;
	long long upstream_status; /* status ops: for /health and /metrics */
};

/* One HTTP connection (libmicrohttpd's socket context). */
struct nxh_conn {
	struct nxh_conn *prev, *next;
	struct MHD_Connection *conn;
	int fd;
	double phase_start;      /* when the current deadline began */
	bool fresh;              /* no request finished on it yet */
	bool in_request;         /* between the first call of a request and its end */
	bool body_done;
	bool over_limit;         /* opened past --max-connections: its request gets 503 */
	bool killed;             /* timed out: shut down, libmicrohttpd closes it next */
	struct nxh_req *req;
};

// --- the gateway's state (main.c): one per process

struct nxh {
	struct nxh_opts o;
	struct MHD_Daemon *mhd;
	int epfd;
	struct nxh_io mhd_io, sig_io;
	int sig_fd;
	struct nxh_keys keys, admin_keys;
	bool have_keys, have_admin;
	struct nxh_model model;
	struct nxh_conn *conns;  /* every open connection, for the deadlines */
	unsigned n_conns;
	uint64_t next_id;
	uint64_t id_salt;        /* random at start: response ids differ between runs */
	long long started;       /* wall clock at start (the models' "created") */
	bool stopping;
	unsigned in_flight;      /* requests between their first call and completion */
};

extern struct nxh nxh;

// --- server.c

int nxh_server_start(int listen_fd);
void nxh_server_stop(void);
/* Deadlines: slow headers and bodies get 408; called from the loop. */
void nxh_server_tick(double now);
/* The request is ready (answer or stream start) or has more stream bytes. */
void nxh_req_wake(struct nxh_req *r);
/* The client's fd showed a hang-up: gone now if suspended, else at the next suspend. */
void nxh_req_hung_up(struct nxh_req *r);
/* The client is gone: its nxd request is closed and libmicrohttpd ends the connection. */
void nxh_req_client_gone(struct nxh_req *r);
/* An OpenAI error object as the answer: {"error":{"message","type","param","code"}}. */
void nxh_req_fail(struct nxh_req *r, unsigned status, const char *type, const char *param, const char *code,
		  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A 400 invalid_request_error naming param. */
void nxh_req_bad(struct nxh_req *r, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* structured.c: OpenAI "response_format", ollama "format" -> the nxd request's "format" (q). */
int nxh_response_format(struct nxh_req *r, const json_t *b, json_t *q);
int nxh_ollama_format(struct nxh_req *r, const json_t *b, json_t *q);
/* The answer: status and a JSON body (stolen). */
void nxh_req_answer(struct nxh_req *r, unsigned status, json_t *body);
/* A text answer (out's bytes are the body). */
void nxh_req_answer_text(struct nxh_req *r, unsigned status, const char *content_type);
/* Starts a stream (SSE or NDJSON): headers go out with the first bytes. */
void nxh_req_stream_start(struct nxh_req *r, const char *content_type);
/* Appends stream bytes; the stream ends with nxh_req_stream_end. */
void nxh_req_stream_put(struct nxh_req *r, const char *s, size_t n);
void nxh_req_stream_end(struct nxh_req *r, bool error);
/* An nxd error event into the HTTP status and OpenAI error it means. */
void nxh_req_fail_event(struct nxh_req *r, json_t *ev);
/* The error code an API client reads for nxd's code (unavailable: nxd_unreachable, busy:
 * rate_limit_exceeded, context_overflow: context_length_exceeded; others as they are). */
const char *nxh_api_code(const char *code);

// --- upstream.c

/* Connects to nxd and sends hello; the route's build is called on the
 * answer. 0, or -1 with a 503 answer set (nxd unreachable). */
int nxh_up_start(struct nxh_req *r);
/* Closes the socket: nxd cancels whatever runs on it at its next step. */
void nxh_up_close(struct nxh_up *u);
void nxh_up_io(struct nxh_up *u, uint32_t events);
/* Reading resumes once the client took the bytes (stream drained). */
void nxh_up_resume_reading(struct nxh_req *r);
void nxh_up_tick(struct nxh_req *r, double now);

// --- openai.c / ollama.c / info.c: the routes

extern const struct nxh_route nxh_routes[];
extern const size_t nxh_n_routes;

int nxh_chat_begin(struct nxh_req *r);
int nxh_completion_begin(struct nxh_req *r);
json_t *nxh_gen_build(struct nxh_req *r, const json_t *hello);
void nxh_model_not_found(struct nxh_req *r); /* 404 in the API's words (OpenAI or ollama) */
void nxh_gen_event(struct nxh_req *r, json_t *ev);
void nxh_gen_free(struct nxh_gen *g);
/* The id clients name for the served model. */
const char *nxh_model_id(const json_t *hello);

int nxh_ollama_chat_begin(struct nxh_req *r);
int nxh_ollama_generate_begin(struct nxh_req *r);
int nxh_ollama_plain_begin(struct nxh_req *r);
int nxh_ollama_show_begin(struct nxh_req *r);
json_t *nxh_ollama_info_build(struct nxh_req *r, const json_t *hello);
void nxh_ollama_info_event(struct nxh_req *r, json_t *ev);
void nxh_ollama_gen_event(struct nxh_req *r, json_t *ev);

int nxh_info_begin(struct nxh_req *r);
json_t *nxh_models_build(struct nxh_req *r, const json_t *hello);
void nxh_models_event(struct nxh_req *r, json_t *ev);
int nxh_tokenize_begin(struct nxh_req *r);
int nxh_detokenize_begin(struct nxh_req *r);
json_t *nxh_tok_build(struct nxh_req *r, const json_t *hello);
void nxh_tok_event(struct nxh_req *r, json_t *ev);
json_t *nxh_status_build(struct nxh_req *r, const json_t *hello);
void nxh_health_event(struct nxh_req *r, json_t *ev);
int nxh_admin_begin(struct nxh_req *r);
json_t *nxh_admin_build(struct nxh_req *r, const json_t *hello);
void nxh_admin_event(struct nxh_req *r, json_t *ev);

/* Field checks shared by the API files: each sets a 400 naming the field
 * and returns -1, or returns 0. A null value counts as absent (0, *present false). */
int nxh_only_fields(struct nxh_req *r, const json_t *obj, const char *where, const char *const *known);
int nxh_get_bool(struct nxh_req *r, const json_t *obj, const char *key, const char *where, bool *out, bool *present);
int nxh_get_int(struct nxh_req *r, const json_t *obj, const char *key, const char *where, long long lo, long long hi,
		long long *out, bool *present);
int nxh_get_num(struct nxh_req *r, const json_t *obj, const char *key, const char *where, double lo, double hi,
		double *out, bool *present);
int nxh_get_str(struct nxh_req *r, const json_t *obj, const char *key, const char *where, const char **out,
		bool *present);

// --- metrics.c

void nxh_metrics_request(const char *endpoint, unsigned status);
void nxh_metrics_tokens(int prompt, int completion);
void nxh_metrics_ttft(double s);
void nxh_metrics_token_gap(double s);
void nxh_metrics_upstream_error(void);
json_t *nxh_metrics_build(struct nxh_req *r, const json_t *hello);
void nxh_metrics_event(struct nxh_req *r, json_t *ev);

// --- sandbox.c

/* After start-up: no new privileges, rlimits, and a seccomp allowlist of
 * what the loop needs (socket() only for AF_UNIX). 0, or -1 with msg. */
int nxh_sandbox_enter(bool trap, char *msg, size_t msg_cap);

#endif
