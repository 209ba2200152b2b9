/* main.c - nxd-http: options, the listening socket, the sandbox, the event loop and a clean stop. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "http/nxh.h"
#include "proto/proto.h"

struct nxh nxh;

static const char usage[] =
	"usage: nxd-http [options]\n"
	"An OpenAI-compatible HTTP gateway in front of nxd (a client of its Unix socket).\n"
	"  --socket PATH          nxd's socket (default: $NXD_SOCKET, /run/nxd/nxd.sock for root, else\n"
	"                         $XDG_RUNTIME_DIR/nxd.sock; as nxctl)\n"
	"  --listen ADDR:PORT     where to listen (default 127.0.0.1:8080; IPv6 as [::1]:8080); a socket\n"
	"                         passed by systemd (nxd-http.socket) is used instead\n"
	"  --api-key-file FILE    keys clients must send as \"Authorization: Bearer KEY\", one a line\n"
	"                         (every endpoint but /health); without it no key is asked for\n"
	"  --admin-key-file FILE  keys for /admin/... (LoRA load/unload/fold/unfold, shutdown); without it\n"
	"                         those endpoints do not exist\n"
	"  --model-id ID          the model id clients name (default: the model's name, from nxd)\n"
	"  --max-connections N    connections at once; past it 503 (default 512)\n"
	"  --max-body BYTES       largest request body; past it 413 (default 1048576)\n"
	"  --max-header BYTES     request line and headers; past it 431 (default 16384)\n"
	"  --idle-timeout S       close a connection without traffic for S seconds (default 60)\n"
	"  --header-timeout S     a new connection's headers must be in within S (default 10); else 408\n"
	"  --body-timeout S       a body must be in within S of its headers (default 30); else 408\n"
	"  --upstream-timeout S   nxd must answer its hello within S (default 5); else 503\n"
	"  --log-level L          error, warn, info or debug (default info)\n"
	"  --no-sandbox           do not enter the seccomp sandbox (debugging, strace)\n"
	"  --version, --help\n"
	"Environment: NXH_SECCOMP_TRAP=1 names a forbidden syscall instead of a silent kill.\n";

enum { O_SOCKET = 256, O_LISTEN, O_KEYS, O_ADMIN, O_MODEL_ID, O_MAXCONN, O_MAXBODY, O_MAXHDR, O_IDLE, O_HDRTO,
       O_BODYTO, O_UPTO, O_LOG, O_NOSANDBOX, O_VERSION, O_HELP };

static const struct option longopts[] = {
	{ "socket", required_argument, NULL, O_SOCKET }, { "listen", required_argument, NULL, O_LISTEN },
	{ "api-key-file", required_argument, NULL, O_KEYS }, { "admin-key-file", required_argument, NULL, O_ADMIN },
	{ "model-id", required_argument, NULL, O_MODEL_ID }, { "max-connections", required_argument, NULL, O_MAXCONN },
	{ "max-body", required_argument, NULL, O_MAXBODY }, { "max-header", required_argument, NULL, O_MAXHDR },
	{ "idle-timeout", required_argument, NULL, O_IDLE }, { "header-timeout", required_argument, NULL, O_HDRTO },
	{ "body-timeout", required_argument, NULL, O_BODYTO }, { "upstream-timeout", required_argument, NULL, O_UPTO },
	{ "log-level", required_argument, NULL, O_LOG }, { "no-sandbox", no_argument, NULL, O_NOSANDBOX },
	{ "version", no_argument, NULL, O_VERSION }, { "help", no_argument, NULL, O_HELP }, { NULL, 0, NULL, 0 },
};

static int bad_usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "nxd-http: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n(see nxd-http --help)\n");
	return 2;
}

static int num_arg(const char *flag, const char *s, unsigned long long lo, unsigned long long hi,
		   unsigned long long *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) {
		fprintf(stderr, "nxd-http: --%s must be an integer in %llu..%llu, got '%s'\n", flag, lo, hi, s);
		return 2;
	}
	*out = v;
	return 0;
}

static int parse_args(int argc, char **argv, struct nxh_opts *o)
{
	*o = (struct nxh_opts){ .listen = "127.0.0.1:8080", .max_connections = 512, .max_body = 1 << 20,
				.max_header = 16384, .idle_timeout = 60, .header_timeout = 10, .body_timeout = 30,
				.upstream_timeout = 5 };
	int c;
	unsigned long long v;
	opterr = 0; /* named below, with the hint nxd and nxctl give */
	while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
		int rc = 0;
		switch (c) {
		case O_SOCKET: o->socket = optarg; break;
		case O_LISTEN: o->listen = optarg; break;
		case O_KEYS: o->api_key_file = optarg; break;
		case O_ADMIN: o->admin_key_file = optarg; break;
		case O_MODEL_ID:
			if (!*optarg || strlen(optarg) > 255)
				return bad_usage("--model-id must be 1..255 bytes, got '%s'", optarg);
			o->model_id = optarg;
			break;
		case O_MAXCONN: rc = num_arg("max-connections", optarg, 1, 100000, &v); o->max_connections = (unsigned)v; break;
		case O_MAXBODY: rc = num_arg("max-body", optarg, 1024, (size_t)1 << 30, &v); o->max_body = v; break;
		case O_MAXHDR: rc = num_arg("max-header", optarg, 1024, 1 << 20, &v); o->max_header = v; break;
		case O_IDLE: rc = num_arg("idle-timeout", optarg, 1, 86400, &v); o->idle_timeout = (unsigned)v; break;
		case O_HDRTO: rc = num_arg("header-timeout", optarg, 1, 3600, &v); o->header_timeout = (unsigned)v; break;
		case O_BODYTO: rc = num_arg("body-timeout", optarg, 1, 3600, &v); o->body_timeout = (unsigned)v; break;
		case O_UPTO: rc = num_arg("upstream-timeout", optarg, 1, 3600, &v); o->upstream_timeout = (unsigned)v; break;
		case O_LOG: {
			static const char *const lv[] = { "error", "warn", "info", "debug" };
			int k = -1;
			for (int i = 0; i < 4; i++)
				if (!strcmp(optarg, lv[i]))
					k = i;
			if (k < 0)
				return bad_usage("--log-level must be error, warn, info or debug, got '%s'", optarg);
			nxh_log_level = k;
			break;
		}
		case O_NOSANDBOX: o->no_sandbox = true; break;
		case O_VERSION: printf("nxd-http %s (protocol %d)\n", NXH_VERSION, NXP_VERSION); exit(0);
		case O_HELP: fputs(usage, stdout); exit(0);
		case ':':
			fprintf(stderr, "nxd-http: %s needs a value\nTry 'nxd-http --help'.\n", argv[optind - 1]);
			return 2;
		default:
			fprintf(stderr, "nxd-http: unknown option '%s'\nTry 'nxd-http --help'.\n", argv[optind - 1]);
			return 2;
		}
		if (rc)
			return rc;
	}
	if (optind < argc)
		return bad_usage("unexpected argument '%s'", argv[optind]);
	if (!o->socket) {
		if (nxp_default_socket_path(o->socket_buf, sizeof(o->socket_buf)))
			return bad_usage("%s", "the default socket path is too long (set --socket or NXD_SOCKET)");
		o->socket = o->socket_buf;
	}
	const char *trap = getenv("NXH_SECCOMP_TRAP");
	o->seccomp_trap = trap && !strcmp(trap, "1");
	return 0;
}

/* "127.0.0.1:8080", "[::1]:8080", "0.0.0.0:80". */
static int open_listener(const char *spec, char *msg, size_t cap)
{
	char host[256];
	const char *port;
	if (spec[0] == '[') {
		const char *e = strchr(spec, ']');
		if (!e || e[1] != ':' || (size_t)(e - spec - 1) >= sizeof(host)) {
			snprintf(msg, cap, "--listen must be ADDR:PORT or [IPV6]:PORT, got '%s'", spec);
			return -2;
		}
		memcpy(host, spec + 1, (size_t)(e - spec - 1));
		host[e - spec - 1] = '\0';
		port = e + 2;
	} else {
		const char *e = strrchr(spec, ':');
		if (!e || e == spec || (size_t)(e - spec) >= sizeof(host) || memchr(spec, ':', (size_t)(e - spec))) {
			snprintf(msg, cap, "--listen must be ADDR:PORT or [IPV6]:PORT, got '%s'", spec);
			return -2;
		}
		memcpy(host, spec, (size_t)(e - spec));
		host[e - spec] = '\0';
		port = e + 1;
	}
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai;
	int rc = getaddrinfo(host, port, &hints, &ai);
	if (rc) {
		snprintf(msg, cap, "--listen '%s': %s (a numeric address and port)", spec, gai_strerror(rc));
		return -2;
	}
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (fd >= 0) {
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (ai->ai_family == AF_INET6) /* only the family named: [::] is not also 0.0.0.0 */
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	}
	if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
		snprintf(msg, cap, "cannot listen on %s: %s", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return -1;
	}
	freeaddrinfo(ai);
	return fd;
}

/* A TCP socket from systemd (nxd-http.socket), or ours. */
static int listener(char *msg, size_t cap, bool *activated)
{
	int n = sd_listen_fds(1);
	*activated = n > 0;
	if (n > 1) {
		snprintf(msg, cap, "systemd passed %d sockets; nxd-http takes one", n);
		return -1;
	}
	if (n == 1) {
		int fd = SD_LISTEN_FDS_START;
		if (sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1) <= 0 ||
		    (sd_is_socket(fd, AF_INET, SOCK_STREAM, 1) <= 0 && sd_is_socket(fd, AF_INET6, SOCK_STREAM, 1) <= 0)) {
			snprintf(msg, cap, "the socket systemd passed is not a listening TCP socket");
			return -1;
		}
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		return fd;
	}
	return open_listener(nxh.o.listen, msg, cap);
}

/* "127.0.0.1:41233": with port 0 the kernel picks one, and tests read it here. */
static void bound_name(int fd, char *out, size_t cap, bool activated)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char host[64] = "?", port[16] = "?";
	if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
		getnameinfo((struct sockaddr *)&ss, len, host, sizeof(host), port, sizeof(port),
			    NI_NUMERICHOST | NI_NUMERICSERV);
	snprintf(out, cap, ss.ss_family == AF_INET6 ? "[%s]:%s%s" : "%s:%s%s", host, port,
		 activated ? " (from systemd)" : "");
}

static int load_keys(char *msg, size_t cap)
{
	if (nxh.o.api_key_file) {
		if (nxh_keys_load(&nxh.keys, nxh.o.api_key_file, msg, cap))
			return -1;
		nxh.have_keys = true;
	}
	if (nxh.o.admin_key_file) {
		if (nxh_keys_load(&nxh.admin_keys, nxh.o.admin_key_file, msg, cap))
			return -1;
		nxh.have_admin = true;
	}
	return 0;
}

static int signals_open(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	nxh.sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	if (nxh.sig_fd < 0)
		return -1;
	nxh.sig_io.kind = NXH_IO_SIGNAL;
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = &nxh.sig_io };
	return epoll_ctl(nxh.epfd, EPOLL_CTL_ADD, nxh.sig_fd, &e);
}

/* Many connections need many fds: the soft limit goes up to the hard one. */
static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2 * (rlim_t)nxh.o.max_connections + 64)
		nxh_warn("RLIMIT_NOFILE is %llu: fewer than two fds per connection for --max-connections %u",
			 (unsigned long long)rl.rlim_cur, nxh.o.max_connections);
}

static void on_signal(double now, double *deadline)
{
	struct signalfd_siginfo si;
	while (read(nxh.sig_fd, &si, sizeof(si)) == sizeof(si)) {
		if (nxh.stopping)
			continue;
		nxh_info("signal %u: stopping (new connections refused, %u requests to finish)", si.ssi_signo,
			 nxh.in_flight);
		nxh.stopping = true;
		*deadline = now + 10;
		int lfd = MHD_quiesce_daemon(nxh.mhd);
		if (lfd >= 0)
			close(lfd);
	}
}

static void dispatch(struct epoll_event *e, double now, double *deadline)
{
	struct nxh_io *io = e->data.ptr;
	switch (io->kind) {
	case NXH_IO_MHD:
		break; /* MHD_run below */
	case NXH_IO_SIGNAL:
		on_signal(now, deadline);
		break;
	case NXH_IO_UPSTREAM:
		nxh_up_io((struct nxh_up *)io, e->events);
		break;
	case NXH_IO_WATCH: {
		struct nxh_req *r = (struct nxh_req *)((char *)io - offsetof(struct nxh_req, watch));
		nxh_req_hung_up(r);
		break;
	}
	}
}

static void tick(double now)
{
	nxh_server_tick(now);
	for (struct nxh_conn *hc = nxh.conns; hc; hc = hc->next)
		if (hc->req)
			nxh_up_tick(hc->req, now);
}

static void loop(void)
{
	double deadline = 0, last_tick = 0;
	while (!nxh.stopping || (nxh.in_flight > 0 && nxh_now() < deadline)) {
		MHD_UNSIGNED_LONG_LONG to;
		int ms = 250; /* the deadlines are checked this often */
		if (MHD_get_timeout(nxh.mhd, &to) == MHD_YES && to < (MHD_UNSIGNED_LONG_LONG)ms)
			ms = (int)to;
		struct epoll_event ev[64];
		int n = epoll_wait(nxh.epfd, ev, 64, ms);
		if (n < 0 && errno != EINTR) {
			nxh_err("epoll_wait failed: %s", strerror(errno));
			break;
		}
		double now = nxh_now();
		for (int i = 0; i < n; i++)
			dispatch(&ev[i], now, &deadline);
		if (now - last_tick >= 0.25) {
			tick(now);
			last_tick = now;
		}
		MHD_run(nxh.mhd);
	}
}

int main(int argc, char **argv)
{
	int rc = parse_args(argc, argv, &nxh.o);
	if (rc)
		return rc;
	char msg[512];
	if (load_keys(msg, sizeof(msg))) {
		nxh_err("%s", msg);
		return 2;
	}
	raise_nofile();
	uint64_t salt = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	if (getrandom(&salt, sizeof(salt), GRND_NONBLOCK) != sizeof(salt))
		nxh_debug("getrandom failed; response ids come from the clock");
	nxh.id_salt = salt;
	/* jansson seeds its hash tables from /dev/urandom on first use: now,
	 * while files can still be opened. */
	json_object_seed(0);
	tzset(); /* libmicrohttpd's Date header: /etc/localtime read now, not in the sandbox */
	nxh.started = (long long)time(NULL);
	nxh.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (nxh.epfd < 0 || signals_open() < 0) {
		nxh_err("epoll or signalfd failed: %s", strerror(errno));
		return 1;
	}
	bool activated;
	int lfd = listener(msg, sizeof(msg), &activated);
	if (lfd < 0) {
		nxh_err("%s", msg);
		return lfd == -2 ? 2 : 1;
	}
	char where[128];
	bound_name(lfd, where, sizeof(where), activated);
	if (nxh_server_start(lfd) < 0) {
		nxh_err("libmicrohttpd failed to start on %s", nxh.o.listen);
		return 1;
	}
	nxh_info("listening on %s for nxd at %s%s%s", where, nxh.o.socket, nxh.have_keys ? "; API keys required" : "", nxh.have_admin ? "; admin endpoints on" : "");
	if (!nxh.o.no_sandbox) {
		if (nxh_sandbox_enter(nxh.o.seccomp_trap, msg, sizeof(msg))) {
			nxh_err("%s", msg);
			return 1;
		}
		nxh_info("sandbox: seccomp filter on");
	}
	sd_notify(0, "READY=1");
	loop();
	sd_notify(0, "STOPPING=1");
	nxh_server_stop();
	nxh_info("stopped");
	return 0;
}
