/* nxd.h - the supervisor's state: options, model, arena layout, process table, connections, requests and slots.
 *
 * One struct nxd holds everything; the files of daemon/ each own a part:
 *   main.c    options, start-up and shutdown order
 *   model.c   model file -> private huge pages (io_uring reads) or MAP_SHARED mapping, validation
 *   shmem.c   arena layout (size / init per region)
 *   procs.c   worker process table: spawn, pidfds, deaths, back-off
 *   loop.c    io_uring event loop: accept, recv, send, signals, pidfds, the step futex
 *   conn.c    per-connection line buffer and output queue
 *   ops.c     requests: hello, generate, tokenize, detokenize, status, cancel
 *   sched.c   slots, queue, continuous batching, sampling and streaming
 *   access.c  socket group, admin rights, client paths, adapter limits
 *   guard.c   validating shared memory, repair after a scribbling worker, the step watchdog
 * The worker side is worker/worker.c (step loop) and worker/sandbox.c. */
#ifndef NXD_H
#define NXD_H

#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "common/env.h"
#include "common/err.h"
#include "daemon/log.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "proto/proto.h"
#include "sample/sampler.h"
#include "sample/stop.h"
#include "shm/arena.h"
#include "shm/ctl.h"
#include "shm/hugemem.h"
#include "tok/chat.h"
#include "tok/tokenizer.h"
#include "worker/sandbox.h"

#define NXD_VERSION "0.1.0"
#define NXD_MAX_SLOTS 256

/* ---------------------------------------------------------------- options */

struct nxd_opts {
	const char *model_path;
	char socket_path[108];
	int n_workers;        /* 0: online CPUs we may run on */
	int n_ctx;            /* 0: the model's training context */
	int n_slots;
	int n_batch;          /* token budget of one step */
	int max_queue;        /* requests waiting for a slot before `busy` */
	int max_clients;      /* connections before a refusal */
	size_t max_line;      /* request line limit */
	size_t out_limit;     /* per-connection queued output before the client is dropped */
	double idle_timeout;  /* s: a connection with nothing in flight and no bytes is closed */
	double line_timeout;  /* s: a started request line must be finished within this */
	int max_start_failures; /* worker start-up deaths in a row before giving up */
	double step_timeout;  /* s: the step watchdog's upper bound (guard.c) */
	const char *socket_group; /* access.c: group that may connect (socket mode 0660), or NULL */
	const char *admin_group;  /* access.c: group whose members may change the model, or NULL */
	int max_tokens;       /* a request's max_tokens limit (0: the context) */
	bool prompt_cache;    /* reuse a free slot's K/V for a prompt that starts with its tokens */
	bool act_one_part;    /* --activations fast: matmul inputs in one 8-bit part (nx_state_cfg) */
	int max_adapters;     /* adapters loaded at once (access.c: nxd_limits_check_adapter) */
	size_t max_adapter_mb; /* MiB of adapters in memory at once */
	bool use_mmap;
	int log_level;
};

/* ---------------------------------------------------------------- model */

struct nxd_model {
	const uint8_t *bytes;   /* the whole file: in `copy`, or the read-only mapping */
	size_t size;
	void *map;              /* --mmap: the MAP_SHARED mapping (bytes == map); else the plain rows' mapping */
	/* Copy mode: the file read into private memory on 2 MiB pages (shm/hugemem.h),
	 * packed, then read-only from the end of nxd_model_load on, before the first
	 * fork: the workers share its pages (copy-on-write that never copies). */
	struct nx_huge copy;
	struct gguf_file g;     /* parsed from bytes */
	struct nx_model m;      /* the supervisor's own copy; workers use the arena's */
	struct nx_tok *tok;
	char *name;             /* general.name, else the file name */
	const char *arch;
	char type[16];          /* most common weight type, e.g. "Q4_1" */
	char *jinja;            /* tokenizer.chat_template, or NULL */
	enum nx_chat_tmpl tmpl;
	int n_vocab;
};

/* ---------------------------------------------------------------- arena layout */

struct nxd_shm {
	struct nx_arena arena;
	struct nx_ctl *ctl;         /* control block (futex words) */
	struct nx_tok_in *toks;     /* (max_batch) the step descriptor's tokens */
	struct nx_model *model;     /* workers' copy of the bound model */
	struct nx_state *state_shared; /* workers' copy of the state struct */
	struct nx_scratch *scratch; /* (n_workers) per-worker scratch structs */
	struct nx_prof *prof;       /* (n_workers) NXD_PROFILE=1: each worker's time split; else NULL */
	struct nx_state state;      /* the supervisor's own copy: logits it reads */
	struct nx_state_cfg cfg;
	/* page ranges a worker maps read-only before its first step (the weights
	 * are read-only already: nxd_model.copy or the --mmap mapping) */
	struct { void *p; size_t len; } ro[1];
	int n_ro;
};

/* ---------------------------------------------------------------- processes */

enum nxd_pstate {
	NXD_P_EMPTY,    /* no process (shutdown) */
	NXD_P_STARTING, /* forked, not yet seen ready */
	NXD_P_READY,
	NXD_P_BACKOFF,  /* died at start; respawn at next_spawn */
	NXD_P_FAILED,   /* died at start too often: given up */
};

struct nxd_proc {
	int band;
	int cpu;
	pid_t pid;
	int pidfd;
	enum nxd_pstate st;
	int restarts;         /* respawns after the first start */
	int fails;            /* start-up deaths in a row */
	uint64_t spawns;      /* processes forked for this band */
	double spawned_at;    /* monotonic s */
	double next_spawn;
	char last_death[128]; /* "killed by seccomp (SIGSYS)" ... */
	bool killed;          /* SIGKILLed by the guard: its death is no start-up failure */
};

/* ---------------------------------------------------------------- connections */

struct nxd_conn {
	int idx;              /* index in nxd.conns */
	uint32_t gen;         /* bumped each time idx is reused: stale completions are dropped */
	int fd;
	struct ucred cred;    /* SO_PEERCRED at accept */
	signed char admin;    /* access.c: 0 not decided yet, 1 admin, -1 not */
	int inflight;         /* io_uring ops that reference this conn */
	bool recv_armed, send_armed;
	bool closing;         /* no more reads; close once inflight == 0 */
	double linger;        /* > 0: closing once the queued output is sent (since then) */
	/* input: a bounded line buffer */
	char *in;
	size_t in_len, in_cap;
	bool skipping;        /* dropping the rest of an oversized line */
	double t_rx;          /* last byte received */
	double t_line;        /* first byte of the current partial line, 0 if none */
	/* output: `out` collects events; `snd` is the buffer of the send in flight */
	char *out, *snd;
	size_t out_len, out_cap, snd_len, snd_off, snd_cap;
	int n_reqs;           /* requests (queued or in a slot) this connection owns */
};

/* ---------------------------------------------------------------- requests and slots */

struct nxd_lora_ent;          /* lora.c */
struct nxd_lora_reg;

struct nxd_req {
	struct nxd_req *next;     /* queue link */
	struct nxd_conn *conn;    /* NULL once the client went away */
	uint64_t seq;             /* arrival order (cancel picks the latest of an id) */
	char id[NXP_ID_MAX];
	int32_t *prompt;          /* (n_prompt) */
	int n_prompt;
	int max_tokens;
	struct nx_sample_params sp;
	char *stop[NXP_MAX_STOP];
	int n_stop;
	bool ignore_eos;
	bool stream;
	bool cancelled;           /* cancel op, disconnect, overflow, shutdown */
	enum nxp_reason cancel_reason;
	int slot;                 /* -1 while queued */
	int n_cached;             /* prompt tokens whose K/V came from the prompt cache */
	/* non-streamed results */
	int32_t *gen_toks;        /* (max_tokens) */
	char *text;
	size_t text_len, text_cap;
	int n_gen;                /* completion tokens (end-of-generation tokens not counted) */
	/* runtime LoRA: the adapters this request carries (lora.c counts their users) */
	struct nx_lora_mix lora_mix;
	struct nxd_lora_ent *lora_ent[NX_LORA_MIX_MAX];
	int n_lora;
	double t_arrive, t_admit, t_first, t_end; /* t_admit: its first prompt step */
};

struct nxd_slot {
	struct nxd_req *req;      /* NULL: free */
	int32_t *hist;            /* (n_ctx) prompt then generated tokens */
	int n_hist;               /* tokens known */
	int n_past;               /* tokens whose K/V are in the cache */
	int row;                  /* logits row in the running step, -1 */
	int chunk;                /* tokens this slot has in the running step */
	uint64_t admitted;        /* admission order: prefill goes first-come first-served */
	/* Prompt cache (sched.c: place): the K/V of hist[0 .. n_past), in use or
	 * freed since (a free slot keeps its n_past), are what the model in
	 * service computes for those tokens: no runtime LoRA delta, and no weight
	 * swap or worker fault since. False: nothing here may be reused. */
	bool kv_ok;
	uint64_t released;        /* when it was freed (admit_seq's clock): 0 never */
	/* A prompt whose beginning an older slot in use is still computing
	 * (sched.c: lender_ahead): that slot, its admission number, and how many
	 * of this prompt's first tokens it will hold. This slot computes none of
	 * them meanwhile; each plan copies what the lender has. -1: none. */
	int wait_src;
	uint64_t wait_admitted;
	int wait_len;
	struct nx_sampler smp;
	struct nx_detok detok;
	struct nx_stop stop;
};

#define NXD_STATS_WINDOW 256

struct nxd_stats {
	uint64_t steps, steps_retried, tokens_served, completion_tokens;
	uint64_t prompt_cached;   /* prompt tokens taken from the prompt cache instead of computed */
	/* recent steps: sequences in the step, completion tokens, end time */
	int seqs[NXD_STATS_WINDOW];
	int ntok[NXD_STATS_WINDOW];
	double t[NXD_STATS_WINDOW];
	unsigned head, count;
};

/* ---------------------------------------------------------------- the daemon */

enum nxd_step_state { NXD_STEP_IDLE, NXD_STEP_RUNNING, NXD_STEP_ABORTING };
enum nxd_phase { NXD_STARTING, NXD_SERVING, NXD_STOPPING };

struct nxd {
	struct nxd_opts o;
	struct nxd_model model;
	struct nxd_shm shm;
	struct nxw_filter filter;
	uint32_t spin;            /* pause iterations before a futex sleep */
	pid_t pid;
	double t_start;
	enum nxd_phase phase;
	bool exit_now;
	int exit_code;
	char fatal[256];          /* why the workers are given up on, for status */

	/* workers */
	struct nxd_proc *procs;   /* (n_workers) */
	int n_workers;
	unsigned char *live;      /* (n_workers) scratch for nx_ctl_acked */
	int wlog_rd, wlog_wr;     /* the workers' log pipe */
	char wlog_buf[4096];
	size_t wlog_len;
	const char *test_syscall; /* NXD_TEST_WORKER_SYSCALL */
	long test_syscall_step;

	/* step */
	enum nxd_step_state step_state;
	uint32_t step_gen;        /* last gen launched (the supervisor's own count) */
	int step_n;               /* tokens in the running step */
	int step_tries;           /* launches of the current step */
	double step_t0;

	/* io_uring loop */
	struct io_uring ring;
	int listen_fd;
	bool listen_activated;    /* from systemd: not ours to unlink */
	bool socket_created;
	bool accept_multishot, accept_armed;
	double accept_retry_at;   /* after an accept error (EMFILE...): not before this */
	double shutdown_deadline; /* stopping: exit by then even if clients do not read */
	double abort_t0;          /* when the running step was aborted */
	int sig_fd;
	struct signalfd_siginfo sig_buf;
	bool sig_armed;
	bool futex_uring;         /* IORING_OP_FUTEX_WAIT works; else the eventfd thread */
	bool bell_armed;
	uint32_t bell_seen;
	int bell_efd;
	uint64_t bell_efd_val;
	pthread_t bell_thread;
	bool bell_thread_on;
	struct __kernel_timespec tick_ts;
	bool tick_armed;
	bool wlog_armed;
	int ops_pending;          /* ring ops of the daemon itself (not conns) in flight */

	/* connections */
	struct nxd_conn *conns;   /* (max_clients) */
	int n_conns;

	/* scheduler */
	struct nxd_slot *slots;   /* (n_slots) */
	struct nxd_req *q_head, *q_tail;
	int n_queued;
	uint64_t admit_seq;
	uint64_t req_seq;
	uint64_t seed_ctr;
	char *piece;              /* detokenizer output, nx_detok_bound bytes */
	size_t piece_cap;
	char *released;           /* stop matcher output */
	size_t released_cap;
	char *line;               /* one encoded event */
	size_t line_cap;
	struct nx_logprob *top;   /* (NX_SAMPLE_MAX_LOGPROBS) */
	struct nxp_logprob *lp;
	struct nxd_stats stats;
	/* NXD_PROFILE: the workers' wait from one step's end to the next one's
	 * start when the next follows without a pause (the supervisor's turn:
	 * sampling, streaming, planning, waking them; sched.c prof_turn) */
	bool in_step_done;        /* a step launched now follows the one just done */
	bool step_follows;        /* the running step was launched so */
	uint64_t prof_last_end;   /* nx_prof ticks: the step before's end (its last worker) */
	uint64_t prof_turn_ticks, prof_turns;
	struct nxd_lora_reg *lora; /* lora.c: adapters, folds, the helper thread's job */

	/* guard.c: shared memory is checked against these, never trusted */
	bool ctl_dirty;           /* inconsistency found: workers killed; rewrite the block once all are gone */
	struct nx_tok_in *toks_copy;     /* (n_batch) the descriptor as we wrote it */
	struct nx_scratch *scratch_copy; /* (n_workers) the scratch structs as laid out */
	double wd_per_tok;        /* watchdog: decaying max of step seconds per token */
	uint64_t wd_steps;        /* steps measured */
	double step_limit;        /* s: the running step's watchdog */
};

double nxd_now(void); /* CLOCK_MONOTONIC seconds */

/* model.c */
int nxd_model_load(struct nxd *d, struct nx_err *err);
void nxd_model_free(struct nxd *d);

/* shmem.c */
int nxd_shm_setup(struct nxd *d, struct nx_err *err);
void nxd_shm_free(struct nxd *d);

/* procs.c */
int nxd_procs_init(struct nxd *d, struct nx_err *err);
int nxd_proc_spawn(struct nxd *d, int band);
void nxd_proc_died(struct nxd *d, int band);
void nxd_procs_tick(struct nxd *d, double now);
bool nxd_procs_all_live(const struct nxd *d);
bool nxd_procs_all_ready(struct nxd *d);
bool nxd_procs_failed(const struct nxd *d);
void nxd_procs_stop(struct nxd *d);

/* loop.c */
int nxd_loop_init(struct nxd *d, struct nx_err *err);
int nxd_loop_run(struct nxd *d);
void nxd_loop_free(struct nxd *d);
void nxd_arm_pidfd(struct nxd *d, int band);
void nxd_conn_flush(struct nxd *d, struct nxd_conn *c);
void nxd_conn_close(struct nxd *d, struct nxd_conn *c, const char *why);
/* Like nxd_conn_close, but the events already queued (an error saying why)
 * are sent first; bounded by a grace period. */
void nxd_conn_close_after_flush(struct nxd *d, struct nxd_conn *c, const char *why);
void nxd_begin_shutdown(struct nxd *d, const char *why);

/* conn.c */
int nxd_conn_queue(struct nxd *d, struct nxd_conn *c, const char *line, size_t len);
size_t nxd_conn_queued(const struct nxd_conn *c);
void nxd_conn_reset(struct nxd_conn *c);
void nxd_send_error(struct nxd *d, struct nxd_conn *c, const char *id, enum nxp_code code,
		    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ops.c */
void nxd_handle_line(struct nxd *d, struct nxd_conn *c, const char *line, size_t len);

/* sched.c */
int nxd_sched_init(struct nxd *d, struct nx_err *err);
void nxd_sched_free(struct nxd *d);
/* Admits (or queues) a parsed generate request; answers errors itself. */
void nxd_sched_submit(struct nxd *d, struct nxd_req *r);
/* Launches a step when none runs and there is work. */
void nxd_sched_pump(struct nxd *d);
/* The step finished (every live worker acked): sample, stream, plan on. */
void nxd_sched_step_done(struct nxd *d);
/* The step could not be completed (retries exhausted, workers failed). */
void nxd_sched_step_failed(struct nxd *d, const char *why);
/* The free slots' K/V no longer match their tokens (the weights changed, or
 * a step was aborted): nothing is reused from them. */
void nxd_sched_forget_prompts(struct nxd *d, const char *why);
/* Marks req cancelled; it ends at the next step boundary (or now if idle). */
void nxd_sched_cancel(struct nxd *d, struct nxd_req *r, enum nxp_reason reason);
/* A connection is going away: cancel and detach everything it owns. */
void nxd_sched_conn_gone(struct nxd *d, struct nxd_conn *c, enum nxp_reason reason);
/* Finds a request of c by id (cancel op), or NULL. */
struct nxd_req *nxd_sched_find(struct nxd *d, struct nxd_conn *c, const char *id);
/* Ends every request with reason (shutdown). */
void nxd_sched_end_all(struct nxd *d, enum nxp_reason reason);
/* Fails every request with an error event (workers given up on). */
void nxd_sched_fail_all(struct nxd *d, enum nxp_code code, const char *msg);
void nxd_sched_status(struct nxd *d, struct nxp_status *st, struct nxp_worker_status *ws);
void nxd_req_free(struct nxd_req *r);
int nxd_sched_slots_used(const struct nxd *d);

/* access.c - who may do what (RELIABILITY 17, 24, 25).
 *
 * For the LoRA ops (daemon/lora.c), already done in nxd_handle_line (ops.c)
 * before nxd_lora_op is called:
 *   - lora_load, lora_unload, lora_fold, lora_unfold and shutdown are refused
 *     with `forbidden` unless nxd_access_check_admin passes; a new op that
 *     changes what every client sees belongs in that list (is_admin_op);
 *   - lora_load's path goes through nxd_access_check_adapter_path: one
 *     message whatever the reason, and files the peer could not read itself
 *     are refused (a root daemon must not read /root/x for uid 1000).
 * Still for lora.c to do:
 *   - lora_load must call nxd_limits_check_adapter(n_loaded, bytes_loaded,
 *     bytes_new, err) before taking memory (--max-adapters, --max-adapter-mb)
 *     and answer NXP_E_BUSY with err.msg. */
int nxd_access_init(struct nxd *d, struct nx_err *err);
/* After bind: the socket's group (--socket-group) and mode 0660. */
int nxd_access_socket(const char *path, struct nx_err *err);
bool nxd_access_is_admin(struct nxd_conn *c);
/* 0 when c's peer is root, the daemon's uid or in --admin-group; else -1 and
 * err says who may (send it with NXP_E_FORBIDDEN). */
int nxd_access_check_admin(struct nxd_conn *c, struct nx_err *err);
/* 0 when path is an absolute path to a regular file (not in /proc, /sys...)
 * that the daemon and c's peer may both read; else -1 and err is
 * "cannot use 'PATH': not a readable regular file", whatever the reason. */
int nxd_access_check_path(const struct nxd_conn *c, const char *path, struct nx_err *err);
/* The same for an adapter: a file (plus adapter_config.json beside it, if
 * there is one) or a PEFT directory (its two files). */
int nxd_access_check_adapter_path(const struct nxd_conn *c, const char *path, struct nx_err *err);
/* The one answer for every path nxd will not use (missing, unreadable, not a
 * regular file, not an adapter): it must not tell these apart (RELIABILITY 17). */
#define NXD_PATH_REFUSED "cannot use '%s': not a readable regular file"
/* 0 when one more adapter of bytes_new fits --max-adapters and
 * --max-adapter-mb beside n_loaded adapters of bytes_loaded; else -1, err. */
int nxd_limits_check_adapter(int n_loaded, size_t bytes_loaded, size_t bytes_new, struct nx_err *err);

/* guard.c */
int nxd_guard_init(struct nxd *d, struct nx_err *err);
void nxd_guard_free(struct nxd *d);
/* Launches the planned step of n tokens under our own gen and a watchdog limit. */
void nxd_guard_launch(struct nxd *d, int n);
/* A step took dt s for n tokens: feeds the watchdog's estimate. */
void nxd_guard_step_done(struct nxd *d, double dt, int n);
double nxd_guard_step_limit(const struct nxd *d, int n);
/* Validates shared memory against our copies; on a mismatch kills every
 * worker (ctl_dirty) and returns false. */
bool nxd_guard_check(struct nxd *d);
/* ctl_dirty and every worker reaped: rewrites the block; true when clean. */
bool nxd_guard_repair(struct nxd *d);

/* lora.c */
int nxd_lora_init(struct nxd *d, struct nx_err *err);
void nxd_lora_free(struct nxd *d);
/* lora_load, lora_list, lora_unload, lora_fold, lora_unfold, lora_report. */
void nxd_lora_op(struct nxd *d, struct nxd_conn *c, struct nxp_request *q);
/* A generate's adapters into r (r->id set); on an unknown or folded one an
 * error event is sent and -1 returned. */
int nxd_lora_resolve(struct nxd *d, struct nxd_conn *c, const struct nxp_generate *g, struct nxd_req *r);
/* r is admitted into slot: its adapters go into the slot's mix entry. */
void nxd_lora_admit(struct nxd *d, struct nxd_req *r, int slot);
/* r ends: its adapters lose a user (called by nxd_req_free). */
void nxd_lora_release(struct nxd_req *r);
/* A step boundary (no step in flight, the next not yet planned): finished
 * folds are swapped in, unfolds applied, reports and progress sent. */
void nxd_lora_boundary(struct nxd *d);

/* worker/worker.c */
_Noreturn void nxw_main(struct nxd *d, int band, uint32_t seen_gen);

#endif
