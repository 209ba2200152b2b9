/* main.c - nxd: options, start-up order (socket, model, arena, workers) and the way out. */
#define _GNU_SOURCE
#include "daemon/nxd.h"
#include "worker/test_hooks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double nxd_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void warn_test_hook(const char *what)
{
	nxd_warn("test hook: %s", what);
}

static const char usage[] =
	"usage: nxd -m PATH [options]\n"
	"\n"
	"Serves one GGUF model to local clients over a Unix socket (NDJSON, see docs/protocol.md).\n"
	"\n"
	"  -m, --model PATH     the GGUF model file (required)\n"
	"  -s, --socket PATH    socket to listen on (default: $NXD_SOCKET, else /run/nxd/nxd.sock\n"
	"                       for root, else $XDG_RUNTIME_DIR/nxd.sock)\n"
	"  -w, --workers N      worker processes, one per CPU (default: CPUs available; more\n"
	"                       than that share CPUs and slow every step, with a warning)\n"
	"  --ctx N              context length per sequence (default: the model's, less where its KV\n"
	"                       cache for --slots would not fit the memory available; at most the model's)\n"
	"  --slots N            sequences generated at once (default 4, at most 256)\n"
	"  --batch N            token budget of one forward step, >= --slots (default 32)\n"
	"  --mmap               map the weights from the file instead of loading them into the arena\n"
	"  --no-prompt-cache    compute every prompt whole, even where a free slot still holds\n"
	"                       the K/V of its first tokens (default: reuse them)\n"
	"  --activations A      how each matmul's input is quantized: precise (the default: two\n"
	"                       8-bit parts, logits within ~0.005 of the float result) or fast\n"
	"                       (one 8-bit part, as llama.cpp does: more tokens/s when several\n"
	"                       clients share a step; logits ~0.16 off on SmolLM2, top-1 ~97%\n"
	"                       the same)\n"
	"  --kv-type T          how the K/V cache stores each value: f16 (the default) or q8_0\n"
	"                       (8-bit blocks of 32 with an f16 scale, as llama.cpp's -ctk q8_0:\n"
	"                       about half the memory, so a longer default --ctx; logits further\n"
	"                       from the float result, docs/bench.md)\n"
	"  --chat-template NAME|FILE\n"
	"                       how chat requests (messages, or a prompt without \"raw\") become\n"
	"                       the prompt: raw, chatml, llama2, llama3, llama3.1, qwen3,\n"
	"                       mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken,\n"
	"                       deepseek-r1, phi3 or gemma; or a file holding a Jinja chat\n"
	"                       template, used in place of the model's and told apart as the\n"
	"                       model's would be\n"
	"                       (default: detected from the model's template; one nxd does not\n"
	"                       know leaves chat requests refused until this option names one)\n"
	"  --speculate MODE[:K] speculative decoding for requests that do not choose: off (the\n"
	"                       default), prompt (drafts looked up in the request's own prompt\n"
	"                       and output) or draft (the draft model's greedy continuation:\n"
	"                       --draft-model); up to K drafted tokens (1..16, default 8) are\n"
	"                       verified in one step, and the output is unchanged\n"
	"  --draft-model PATH   a small GGUF of the same vocabulary that drafts for speculate\n"
	"                       mode draft, run by the same workers beside the model\n"
	"  --log-level L        error, warn, info (default) or debug\n"
	"  --max-queue N        requests waiting for a slot before 'busy' (default 64)\n"
	"  --max-clients N      connections at once before a refusal (default 128)\n"
	"  --max-line BYTES     longest request line (default 1048576)\n"
	"  --out-limit BYTES    unread output per client before it is dropped (default 1048576)\n"
	"  --idle-timeout S     close a connection idle this long (default 600)\n"
	"  --line-timeout S     a request line must be complete this long after it began (default 60)\n"
	"  --step-timeout S     abort a forward step running longer than this, or than 20x its\n"
	"                       measured cost (at least 5 s), and run it again (default 60)\n"
	"  --max-tokens N       largest max_tokens a request gets; more is capped (default: the context)\n"
	"  --socket-group NAME  the socket's group: its members may connect (mode 0660)\n"
	"  --admin-group NAME   members may load, fold, unfold and unload adapters and shut\n"
	"                       the daemon down (besides root and the daemon's own user)\n"
	"  --max-adapters N     adapters loaded at once (default 16)\n"
	"  --max-adapter-mb MB  memory for loaded adapters (default 1024)\n"
	"  -h, --help           this text\n"
	"  -V, --version        the version and the protocol version\n";

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("nxd: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n(see nxd --help)\n", stderr);
	return 2;
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return bad("--%s must be an integer in %ld..%ld, got \"%s\"", opt, lo, hi, s);
	*out = v;
	return 0;
}

static int parse_secs(const char *opt, const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v <= 0 || v > 1e7)
		return bad("--%s must be a positive number of seconds, got \"%s\"", opt, s);
	*out = v;
	return 0;
}

/* The CPUs this process may run on (its affinity mask: taskset, systemd's
 * CPUAffinity=, a cpuset), as --workers' default counts them. */
static int cpus_available(void)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
	if (n <= 0)
		n = (int)sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? n : 1;
}

/* --speculate off | prompt | draft, each with :K */
static int parse_speculate(const char *s, struct nxd_opts *o)
{
	char mode[16];
	const char *colon = strchr(s, ':');
	size_t len = colon ? (size_t)(colon - s) : strlen(s);
	if (len >= sizeof(mode))
		len = sizeof(mode) - 1;
	memcpy(mode, s, len);
	mode[len] = '\0';
	if (!nxp_spec_mode_parse(mode, &o->spec_mode))
		return bad("--speculate: mode '%s' is not off, prompt or draft", mode);
	if (colon) {
		char *end;
		errno = 0;
		long k = strtol(colon + 1, &end, 10);
		if (errno || end == colon + 1 || *end || k < 1 || k > NXP_MAX_SPEC_K)
			return bad("--speculate: K must be 1..%d, got \"%s\"", NXP_MAX_SPEC_K, colon + 1);
		o->spec_k = (int)k;
	}
	return 0;
}

static int parse_args(struct nxd *d, int argc, char **argv)
{
	struct nxd_opts *o = &d->o;
	*o = (struct nxd_opts){
		.n_slots = 4,
		.n_batch = 0,
		.max_queue = 64,
		.max_clients = 128,
		.max_line = NXP_MAX_LINE,
		.out_limit = (size_t)1 << 20,
		.idle_timeout = 600,
		.line_timeout = 60,
		.max_start_failures = 5,
		.step_timeout = 60,
		.max_adapters = 16,
		.max_adapter_mb = 1024,
		.log_level = NXD_LOG_INFO,
		.prompt_cache = true,
		.spec_mode = NXP_SPEC_OFF,
		.spec_k = NXD_SPEC_K,
	};
	enum { O_MODEL = 256, O_SOCKET, O_WORKERS, O_CTX, O_SLOTS, O_BATCH, O_MMAP, O_LOG, O_QUEUE, O_CLIENTS,
	       O_LINE, O_OUT, O_IDLE, O_LTIME, O_HELP, O_VERSION, O_STIME, O_MAXTOK, O_SGROUP, O_AGROUP,
	       O_MAXAD, O_MAXADMB, O_NOCACHE, O_ACT, O_CHAT, O_SPEC, O_KV, O_DRAFT };
	static const struct option opts[] = {
		{ "model", required_argument, 0, O_MODEL },      { "socket", required_argument, 0, O_SOCKET },
		{ "workers", required_argument, 0, O_WORKERS },  { "ctx", required_argument, 0, O_CTX },
		{ "slots", required_argument, 0, O_SLOTS },      { "batch", required_argument, 0, O_BATCH },
		{ "mmap", no_argument, 0, O_MMAP },              { "log-level", required_argument, 0, O_LOG },
		{ "max-queue", required_argument, 0, O_QUEUE },  { "max-clients", required_argument, 0, O_CLIENTS },
		{ "max-line", required_argument, 0, O_LINE },    { "out-limit", required_argument, 0, O_OUT },
		{ "idle-timeout", required_argument, 0, O_IDLE }, { "line-timeout", required_argument, 0, O_LTIME },
		{ "help", no_argument, 0, O_HELP },              { "version", no_argument, 0, O_VERSION },
		{ "step-timeout", required_argument, 0, O_STIME },
		{ "max-tokens", required_argument, 0, O_MAXTOK },  { "socket-group", required_argument, 0, O_SGROUP },
		{ "admin-group", required_argument, 0, O_AGROUP }, { "max-adapters", required_argument, 0, O_MAXAD },
		{ "max-adapter-mb", required_argument, 0, O_MAXADMB },
		{ "no-prompt-cache", no_argument, 0, O_NOCACHE },
		{ "activations", required_argument, 0, O_ACT },
		{ "chat-template", required_argument, 0, O_CHAT },
		{ "kv-type", required_argument, 0, O_KV },
		{ "speculate", required_argument, 0, O_SPEC },
		{ "draft-model", required_argument, 0, O_DRAFT },
		{ 0, 0, 0, 0 },
	};
	bool socket_given = false;
	long v;
	int c;
	opterr = 0;
	/* ':' first: a missing value is ':', not '?' */
	while ((c = getopt_long(argc, argv, ":m:s:w:hV", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
		case O_MODEL: o->model_path = optarg; break;
		case 's':
		case O_SOCKET:
			if (strlen(optarg) >= sizeof(o->socket_path) || !optarg[0])
				return bad("--socket path must be 1..%zu bytes", sizeof(o->socket_path) - 1);
			snprintf(o->socket_path, sizeof(o->socket_path), "%s", optarg);
			socket_given = true;
			break;
		case 'w':
		case O_WORKERS:
			if (parse_long("workers", optarg, 1, NX_CTL_MAX_WORKERS, &v)) return 2;
			o->n_workers = (int)v;
			break;
		case O_CTX:
			if (parse_long("ctx", optarg, 2, 1 << 24, &v)) return 2;
			o->n_ctx = (int)v;
			break;
		case O_SLOTS:
			if (parse_long("slots", optarg, 1, NXD_MAX_SLOTS, &v)) return 2;
			o->n_slots = (int)v;
			break;
		case O_BATCH:
			if (parse_long("batch", optarg, 1, 65536, &v)) return 2;
			o->n_batch = (int)v;
			break;
		case O_MMAP: o->use_mmap = true; break;
		case O_LOG:
			if ((o->log_level = nxd_log_parse_level(optarg)) < 0)
				return bad("--log-level must be error, warn, info or debug, got \"%s\"", optarg);
			break;
		case O_QUEUE:
			if (parse_long("max-queue", optarg, 0, 1 << 20, &v)) return 2;
			o->max_queue = (int)v;
			break;
		case O_CLIENTS:
			if (parse_long("max-clients", optarg, 1, 1 << 16, &v)) return 2;
			o->max_clients = (int)v;
			break;
		case O_LINE:
			if (parse_long("max-line", optarg, 256, 1L << 30, &v)) return 2;
			o->max_line = (size_t)v;
			break;
		case O_OUT:
			if (parse_long("out-limit", optarg, 4096, 1L << 34, &v)) return 2;
			o->out_limit = (size_t)v;
			break;
		case O_IDLE:
			if (parse_secs("idle-timeout", optarg, &o->idle_timeout)) return 2;
			break;
		case O_LTIME:
			if (parse_secs("line-timeout", optarg, &o->line_timeout)) return 2;
			break;
		case O_STIME:
			if (parse_secs("step-timeout", optarg, &o->step_timeout)) return 2;
			break;
		case O_MAXTOK:
			if (parse_long("max-tokens", optarg, 1, 1 << 24, &v)) return 2;
			o->max_tokens = (int)v;
			break;
		case O_SGROUP:
		case O_AGROUP:
			if (!optarg[0])
				return bad("--%s needs a group name", c == O_SGROUP ? "socket-group" : "admin-group");
			*(c == O_SGROUP ? &o->socket_group : &o->admin_group) = optarg;
			break;
		case O_MAXAD:
			if (parse_long("max-adapters", optarg, 0, 1024, &v)) return 2;
			o->max_adapters = (int)v;
			break;
		case O_MAXADMB:
			if (parse_long("max-adapter-mb", optarg, 0, 1L << 24, &v)) return 2;
			o->max_adapter_mb = (size_t)v;
			break;
		case O_NOCACHE: o->prompt_cache = false; break;
		case O_ACT:
			if (!nx_act_mode_parse(optarg, &o->act_one_part))
				return bad("--activations: '%s' is neither precise nor fast", optarg);
			break;
		case O_KV:
			if (!nx_kv_type_parse(optarg, &o->kv_type))
				return bad("--kv-type: '%s' is neither f16 nor q8_0", optarg);
			break;
		case O_CHAT: {
			enum nx_chat_tmpl t;
			o->chat_template = o->chat_template_file = NULL;
			if (nx_chat_tmpl_parse(optarg, &t, NULL) == 0) {
				o->chat_template = optarg;
				break;
			}
			if (access(optarg, F_OK) != 0)
				return bad("--chat-template: '%s' is not one of %s, nor a template file (%s)", optarg,
					   nx_chat_tmpl_names(), strerror(errno));
			/* read now to refuse a bad one before the model loads; model.c reads it again */
			char *src;
			struct nx_err e;
			if (nx_chat_template_file(optarg, &src, &t, &e) < 0)
				return bad("--chat-template: %s", e.msg);
			free(src);
			o->chat_template_file = optarg;
			break;
		}
		case O_SPEC:
			if (parse_speculate(optarg, o))
				return 2;
			break;
		case O_DRAFT: o->draft_path = optarg; break;
		case 'h':
		case O_HELP:
			fputs(usage, stdout);
			exit(0);
		case 'V':
		case O_VERSION:
			printf("nxd %s (protocol %d)\n", NXD_VERSION, NXP_VERSION);
			exit(0);
		case ':':
			return bad("option %s needs a value", argv[optind - 1]);
		default:
			return bad("unknown option %s", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return bad("unexpected argument \"%s\"", argv[optind]);
	if (!o->model_path)
		return bad("--model PATH is required");
	if (o->spec_mode == NXP_SPEC_DRAFT && !o->draft_path)
		return bad("--speculate draft needs a draft model: give --draft-model PATH");
	/* 32 tokens per step: with kernels whose cost grows with every token
	 * (no weight reuse across a batch yet), a bigger budget does not make a
	 * prompt's prefill faster, it only makes every step of the decoders that
	 * share it longer (bench/clients.py --stall 400: longest decode gap
	 * ~1 s at 16, ~3.7 s at 64, ~7 s at 256 on a loaded 2-CPU machine); a
	 * smaller one adds per-step overhead (barriers, sampling, a wake-up). */
	if (o->n_batch == 0)
		o->n_batch = o->n_slots > 32 ? o->n_slots : 32;
	if (o->n_batch < o->n_slots)
		return bad("--batch (%d) must be at least --slots (%d): every sequence needs its decode token in each step",
			   o->n_batch, o->n_slots);
	if (!socket_given && nxp_default_socket_path(o->socket_path, sizeof(o->socket_path)) < 0)
		return bad("the default socket path does not fit a Unix socket address; give --socket");
	if (o->n_workers == 0) {
		o->n_workers = cpus_available();
		if (o->n_workers > NX_CTL_MAX_WORKERS)
			o->n_workers = NX_CTL_MAX_WORKERS;
	}
	return 0;
}

/* Workers past the CPUs share them: every barrier then waits for a worker
 * that is not running (81 vs 317 tok/s with 6 workers on 2 CPUs). */
static void check_workers(const struct nxd *d)
{
	int cpus = cpus_available();
	if (d->o.n_workers > cpus)
		nxd_warn("--workers %d is more than the %d CPU%s nxd may run on: workers share CPUs and every step "
			 "waits for one that is not running (decode measured 4x slower with 6 workers on 2 CPUs); "
			 "leave --workers out for one per CPU", d->o.n_workers, cpus, cpus == 1 ? "" : "s");
}

/* Every client is an fd: raise the soft limit to the hard one so
 * --max-clients is what refuses connections, not EMFILE. */
static void raise_nofile(struct nxd *d)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == rl.rlim_max)
		return;
	rlim_t want = (rlim_t)d->o.max_clients + 64;
	if (rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		nxd_warn("setrlimit(RLIMIT_NOFILE, %llu) failed: %s", (unsigned long long)rl.rlim_cur, strerror(errno));
	if (rl.rlim_cur < want)
		nxd_warn("only %llu file descriptors allowed; fewer than --max-clients %d connections may fit",
			 (unsigned long long)rl.rlim_cur, d->o.max_clients);
}

/* ---------------------------------------------------------------- dying with the socket gone
 *
 * SIGTERM, SIGINT and SIGHUP are read from the signalfd and end in an
 * orderly shutdown that removes the socket (loop.c). Every other signal that
 * would end the process (a crash, abort(), SIGQUIT, SIGUSR1...) runs
 * on_fatal first: it removes the socket this process bound, if the node at
 * the path is still that one, then dies of the same signal. SIGKILL (the
 * OOM killer's) cannot be seen: the next start replaces the stale socket. */

static const int fatal_sigs[] = {
	SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS, SIGQUIT, SIGUSR1, SIGUSR2,
	SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGIO, SIGPWR, SIGSTKFLT,
};

static struct {
	volatile sig_atomic_t armed;
	pid_t pid;         /* the supervisor: a forked child never removes it */
	dev_t dev;         /* the socket node as bound */
	ino_t ino;
	char path[sizeof(((struct nxd_opts *)0)->socket_path)];
} sock_owned;

static void on_fatal(int sig)
{
	struct stat st;
	if (sock_owned.armed && getpid() == sock_owned.pid && lstat(sock_owned.path, &st) == 0 &&
	    st.st_dev == sock_owned.dev && st.st_ino == sock_owned.ino)
		unlink(sock_owned.path);
	/* SA_RESETHAND made the default action current: the signal raised again
	 * ends the process when the handler returns, as it would have. */
	raise(sig);
}

/* In a forked worker: its signals are its own, dealt with the default way. */
static void fatal_handlers_off(void)
{
	sock_owned.armed = 0;
	for (size_t i = 0; i < sizeof(fatal_sigs) / sizeof(fatal_sigs[0]); i++)
		signal(fatal_sigs[i], SIG_DFL);
	for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
		signal(s, SIG_DFL);
}

static void fatal_handlers_on(struct nxd *d)
{
	struct stat st;
	if (!d->socket_created || d->listen_activated || lstat(d->o.socket_path, &st) < 0)
		return;
	sock_owned.pid = getpid();
	sock_owned.dev = st.st_dev;
	sock_owned.ino = st.st_ino;
	memcpy(sock_owned.path, d->o.socket_path, sizeof(sock_owned.path));
	sock_owned.armed = 1;
	pthread_atfork(NULL, NULL, fatal_handlers_off);
	struct sigaction sa = { .sa_handler = on_fatal, .sa_flags = SA_RESETHAND };
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(fatal_sigs) / sizeof(fatal_sigs[0]); i++)
		sigaction(fatal_sigs[i], &sa, NULL);
	for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
		sigaction(s, &sa, NULL);
}

/* The workers take oom_score_adj 1000 (worker/sandbox.c) and the supervisor
 * keeps the value it was started with (systemd: OOMScoreAdjust=), which
 * must be lower for the kernel to take a worker first. */
static void check_oom_score(void)
{
	FILE *f = fopen("/proc/self/oom_score_adj", "re");
	int adj = 0;
	if (!f)
		return;
	if (fscanf(f, "%d", &adj) == 1 && adj >= 1000)
		nxd_warn("oom_score_adj is %d, as high as the workers': under memory pressure the kernel may kill the "
			 "supervisor, and every stream with it, before a worker; start nxd with a lower one "
			 "(choom, systemd's OOMScoreAdjust=)", adj);
	fclose(f);
}

static int start(struct nxd *d, struct nx_err *err)
{
	raise_nofile(d);
	check_oom_score();
	check_workers(d);
	if (nxd_access_init(d, err) < 0)
		return -1;
	/* The socket first: a live daemon on it is reported before a second
	 * copy of the model is loaded, and SIGTERM is caught from here on. */
	if (nxd_loop_init(d, err) < 0)
		return -1;
	fatal_handlers_on(d);
	/* Past RLIMIT_FSIZE, ftruncate of the arena's memfd and writes to a log
	 * file fail with EFBIG, reported, instead of killing the daemon. */
	signal(SIGXFSZ, SIG_IGN);
	if (nxd_model_load(d, err) < 0)
		return -1;
	if (nx_kv_type_check(&d->model.m.hp, d->o.kv_type, err) < 0)
		return -1;
	if (nxd_draft_load(d, err) < 0)
		return -1;
	int n_ctx_train = d->model.m.hp.n_ctx_train;
	if (d->o.n_ctx == 0)
		nxd_mem_default_ctx(d);
	else if (n_ctx_train > 0 && d->o.n_ctx > n_ctx_train)
		return nx_errf(err, "--ctx %d is larger than the model's training context %d", d->o.n_ctx, n_ctx_train);
	if (nxd_shm_setup(d, err) < 0)
		return -1;
	/* The workers' log is a pipe, not the log file: RLIMIT_FSIZE 0 cannot
	 * hit it, and a flooding worker fills a pipe, not the disk. */
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0)
		return nx_errf(err, "pipe2 for the workers' log failed: %s", strerror(errno));
	d->wlog_rd = pfd[0];
	d->wlog_wr = pfd[1];
	bool trap = nx_env()->seccomp_trap;
	if (nxw_filter_build(&d->filter, d->wlog_wr, trap, err) < 0)
		return -1;
	if (nxd_sched_init(d, err) < 0 || nxd_procs_init(d, err) < 0 || nxd_step_init(d, err) < 0 ||
	    nxd_guard_init(d, err) < 0 || nxd_lora_init(d, err) < 0 || nxd_prep_init(d, err) < 0)
		return -1;
	for (int i = 0; i < d->n_workers; i++)
		if (nxd_proc_spawn(d, i) < 0)
			return nx_errf(err, "could not start worker %d", i);
	return 0;
}

int main(int argc, char **argv)
{
	static struct nxd daemon; /* large (nx_model copies): not on the stack */
	struct nxd *d = &daemon;
	int rc = parse_args(d, argc, argv);
	if (rc)
		return rc;
	nxd_log_set_level(d->o.log_level);
	d->pid = getpid();
	d->t_start = nxd_now();
	d->n_workers = d->o.n_workers;
	d->listen_fd = d->sock_lock_fd = d->sig_fd = d->bell_efd = d->wlog_rd = d->wlog_wr = -1;
	d->phase = NXD_STARTING;
	nxw_hooks_announce(warn_test_hook);
	/* Spin a little before a futex sleep: a sleep/wake round trip costs
	 * more than the few us by which the bands of one op usually differ, and
	 * a longer spin starves the supervisor (docs/bench.md, "Measurements
	 * behind choices"). After the spin a waiter polls longer but yields its
	 * CPU every few us (shm/futex.h: NX_YIELD_ROUNDS), which starves nobody. */
	long spin_us = nx_env()->spin_us;
	d->spin = (uint32_t)(spin_us < 0 ? 0 : spin_us > 10000 ? 10000 : spin_us) * nx_spin_calibrate();

	struct nx_err err = {{0}};
	if (start(d, &err) < 0) {
		nxd_err("%s", err.msg);
		rc = 1;
	} else {
		nxd_info("nxd %s: pid %d, model %s, %d workers, socket %s", NXD_VERSION, (int)d->pid, d->o.model_path,
			 d->n_workers, d->listen_activated ? "(from systemd)" : d->o.socket_path);
		rc = nxd_loop_run(d);
	}
	nxd_procs_stop(d);
	nxd_loop_free(d);
	nxd_prep_free(d);
	nxd_sched_free(d);
	nxd_lora_free(d);
	nxd_guard_free(d);
	nxw_filter_free(&d->filter);
	nxd_model_free(d);
	nxd_shm_free(d);
	nxd_step_free(d);
	free(d->procs);
	if (rc == 0)
		nxd_info("stopped");
	return rc;
}
