/* nxd.h - the supervisor's state: options, model, arena layout, process table, connections, requests and slots.
 *
 * One struct nxd holds everything; the files of daemon/ each own a part:
 *   main.c    options, start-up and shutdown order
 *   daemon.c  the phases (starting, serving, stopping): what is decided after every batch of events
 *   model.c   model file -> private huge pages (io_uring reads) or MAP_SHARED mapping, validation
 *   shmem.c   arena layout (size / init per region), reservation, memory limits
 *   procs.c   worker process table: spawn, reap, back-off; reports deaths to step.c
 *   step.c    a forward step's lifecycle: launch, done / retry / failed, deaths, the watchdog
 *   loop.c    io_uring event loop, mechanism only: accept, recv, send, signals, pidfds, the step futex, timers
 *   conn.c    per-connection line buffer and output queue
 *   ops.c     requests: hello, generate, tokenize, detokenize, status, cancel
 *   prep.c    the thread that prepares long request lines off the loop
 *   sched.c   slots, queue, continuous batching, sampling and streaming
 *   spec.c    speculative decoding: prompt-lookup drafts, how many a step may carry, back-off
 *   draft.c   the draft model: its load and vocabulary check, its steps, the drafts it makes
 *   access.c  socket group, admin rights, client paths, adapter limits
 *   guard.c   checks of shared memory against our copies, and the rewrite from them
 *   lora.c         LoRA registry: load, list, unload, runtime deltas, the adapter ops, the step boundary
 *   lora_job.c     the LoRA helper thread: one job at a time, its kinds in one table
 *   lora_fold.c    fold and unfold, swapped in at step boundaries
 *   lora_report.c  accuracy reports (and a fold's dry run)
 *   lora_int.h     what the lora*.c files share
 * Workers are forked from a struct nxw_spec (worker/worker.h), never this
 * struct: worker/worker.c (step loop), worker/sandbox.c, worker/test_hooks.c. */
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
#include "lora/adapter.h"
#include "daemon/log.h"
#include "daemon/step.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "proto/proto.h"
#include "sample/grammar.h"
#include "sample/sampler.h"
#include "sample/stop.h"
#include "shm/arena.h"
#include "shm/ctl.h"
#include "shm/hugemem.h"
#include "tok/chat.h"
#include "tok/tokenizer.h"
#include "tok/tools.h"
#include "worker/worker.h"
#include "common/version.h"

#define NXD_VERSION NX_VERSION
#define NXD_MAX_SLOTS 256
#define NXD_SPEC_ROWS (2 * NXP_MAX_SPEC_K) /* logits rows for drafts in one step, beside one per sequence */
#define NXD_SPEC_K 8            /* --speculate prompt: drafts per step at most, when no :K is given */
#define NXD_SHUTDOWN_GRACE 3.0 /* s: time given to clients to read their last events */
#define NXD_SIG(sig) (1u << (sig)) /* a bit of nxd.signals */

/* ---------------------------------------------------------------- options */

struct nxd_opts {
	const char *model_path;
	const char *draft_path; /* --draft-model: a small model of the same vocabulary that drafts, or NULL */
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
	double step_timeout;  /* s: the step watchdog's upper bound (step.c) */
	const char *socket_group; /* access.c: group that may connect (socket mode 0660), or NULL */
	const char *admin_group;  /* access.c: group whose members may change the model, or NULL */
	int max_tokens;       /* a request's max_tokens limit (0: the context) */
	bool prompt_cache;    /* reuse a free slot's K/V for a prompt that starts with its tokens */
	bool act_one_part;    /* --activations fast: matmul inputs in one 8-bit part (nx_state_cfg) */
	enum nx_kv_type kv_type; /* --kv-type: how the K/V cache stores values (nx_state_cfg) */
	int max_adapters;     /* adapters loaded at once (access.c: nxd_limits_check_adapter) */
	size_t max_adapter_mb; /* MiB of adapters in memory at once */
	bool use_mmap;
	int log_level;
	const char *chat_template; /* --chat-template: a name of tok/chat.h, or NULL (detected from the model) */
	enum nxp_spec_mode spec_mode; /* --speculate: a request's mode when it gives none (off, prompt, draft) */
	int spec_k;           /* --speculate MODE:K: drafted tokens per step at most, when a request gives none */
	const char *chat_template_file; /* --chat-template FILE: a Jinja template read in place of the model's, or NULL */
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
	struct nx_vocab_trie *trie; /* the token pieces for constrained decoding (sample/grammar.h), read-only */
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
	/* --draft-model (draft.c), else NULL: its own model struct, state (K/V
	 * cache per slot, activations, a logits row per slot) and scratch */
	struct nx_model *draft_model;
	struct nx_state *draft_state_shared;
	struct nx_scratch *draft_scratch; /* (n_workers) */
	struct nx_state draft_state;      /* the supervisor's own copy */
	struct nx_state_cfg draft_cfg;
	int32_t *step_model;        /* which model the step runs (enum nxd_step_model); NULL without a draft model */
	/* page ranges a worker maps read-only before its first step (the weights
	 * are read-only already: nxd_model.copy or the --mmap mapping) */
	struct nxw_range ro[2];
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
	bool prep_busy;       /* a line of it is on the prep thread: its later lines wait (prep.c) */
};

/* ---------------------------------------------------------------- requests and slots */

struct nxd_lora_ent;          /* lora_int.h */
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
	struct nxp_logprob *lp_self, *lp_alts; /* with logprobs: per token, as proto.h's nxp_done has them */
	int *lp_off;              /* (max_tokens + 1) */
	int lp_alts_cap;
	char *text;
	size_t text_len, text_cap;
	int n_gen;                /* completion tokens (end-of-generation tokens not counted) */
	/* runtime LoRA: the adapters this request carries (lora.c counts their users) */
	struct nx_lora_mix lora_mix;
	struct nxd_lora_ent *lora_ent[NX_LORA_MIX_MAX];
	int n_lora;
	/* constrained decoding ("format", "grammar"): this sequence's matcher, or NULL */
	struct nx_gmatch *gm;
	double t_arrive, t_admit, t_first, t_end; /* t_admit: its first prompt step */
	/* speculative decoding (spec.c): k drafted tokens per step at most, 0: off */
	int spec_k;
	enum nxp_spec_mode spec_mode; /* with spec_k > 0: NXP_SPEC_PROMPT or NXP_SPEC_DRAFT */
	int spec_drafted, spec_accepted;
	/* tools offered (tok/tools.h): the answer read for calls as it comes, or NULL */
	struct nx_toolp *tools;
	int n_calls_sent;         /* streamed: tool_call events sent so far */
};

#define NXD_SPEC_NGRAM 3 /* longest suffix prompt lookup looks up (spec.c) */

/* A slot's speculation (spec.c): the drafts of the running step and how
 * many the next may carry. */
struct nxd_spec_slot {
	int32_t draft[NXP_MAX_SPEC_K]; /* fed at positions n_past + 1 .. in the running step */
	int n_draft;
	int draft_row;            /* logits row of draft[0]; draft[j]'s is draft_row + j */
	int k_cur;                /* drafts the next step may carry: grows on full runs, shrinks on misses */
	int misses;               /* steps in a row whose drafts were all rejected */
	int skip;                 /* decode steps left without drafting (back-off) */
	int backoff;              /* the next back-off's length */
	/* By the length of the n-gram matched (1 .. NXD_SPEC_NGRAM; [0]: the draft model's drafts): */
	double acc_w[NXD_SPEC_NGRAM + 1], seen_w[NXD_SPEC_NGRAM + 1]; /* drafts accepted / looked at, decayed: p */
	int probe_wait[NXD_SPEC_NGRAM + 1]; /* matches to pass over before drafting one whose drafts do not pay */
	int probe_gap[NXD_SPEC_NGRAM + 1];  /* the next such wait */
	int order;                /* the n-gram length of the running drafts */
	/* The draft model (draft.c). Its K/V cache of this slot holds
	 * hist[0 .. dpos) (positions are absolute, as in the model's); a round of
	 * draft steps before a main step catches it up to n_hist and then feeds
	 * each draft made to make the next. Kept with the slot like its K/V. */
	int dpos;
	int32_t ddraft[NXP_MAX_SPEC_K]; /* the drafts made this round */
	int n_ddraft;
	int want;                 /* drafts this round is to make (0: none) */
	int dchunk;               /* tokens it has in the running draft step */
	int drow;                 /* logits row of the running draft step, -1 */
	bool by_draft;            /* its drafts come from the draft model (else prompt lookup) */
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
	struct nxd_spec_slot spec;
};

#define NXD_STATS_WINDOW 256
#define NXD_STATS_SECONDS 10.0 /* status's "recent": the steps that began in the last this many seconds */

/* The draft steps before a main step (draft.c): none begun, running, done
 * (the drafts are made; the main step verifies them). */
enum nxd_round { NXD_ROUND_NONE, NXD_ROUND_DRAFTING, NXD_ROUND_READY };

/* Step seconds t against tokens n and logits rows r, t = a + b n + c r, for
 * what drafts cost the sequences beside them (spec.c): decayed sums of
 * x x^T and x t, x = (1, n, r). */
struct nxd_spec_fit {
	double xx[3][3], xt[3];
	double coef[3]; /* a, b, c solved from them after each step (spec.c) */
	bool solved;    /* false until the steps seen tell a, b, c apart (then b, c stay while later ones do not) */
	bool pinned;    /* coef set by NXD_TEST_SPEC_FIT, not by the steps */
	double t_last;  /* nxd_now() at the last step added, 0: none yet */
};

struct nxd_stats {
	uint64_t steps, steps_retried, tokens_served, completion_tokens;
	uint64_t prompt_cached;   /* prompt tokens taken from the prompt cache instead of computed */
	uint64_t spec_drafted, spec_accepted; /* draft tokens verified, and accepted */
	uint64_t spec_mode_drafted[2], spec_mode_accepted[2]; /* the same by source: [0] prompt, [1] draft model */
	struct nxd_spec_fit spec_fit;
	struct nxd_spec_fit draft_fit; /* the draft model's steps, the same way */
	/* the draft model's drafts in every request, counted as a slot counts its
	 * own (acc_w[0], seen_w[0]): where a new request's p of them starts */
	double draft_acc_w, draft_seen_w;
	uint64_t draft_steps;
	/* recent steps: sequences in the step, completion tokens, start time */
	int seqs[NXD_STATS_WINDOW];
	int ntok[NXD_STATS_WINDOW];
	double t0[NXD_STATS_WINDOW];
	unsigned head, count;
};

/* ---------------------------------------------------------------- the daemon */

enum nxd_phase { NXD_STARTING, NXD_SERVING, NXD_STOPPING };

struct nxd {
	struct nxd_opts o;
	struct nxd_model model;
	struct nxd_model draft;   /* --draft-model (draft.c); zero without */
	struct nxd_shm shm;
	struct nxw_filter filter;
	uint32_t spin;            /* pause iterations before a futex sleep */
	pid_t pid;
	double t_start;
	enum nxd_phase phase;     /* daemon.c's to change */
	double shutdown_deadline; /* stopping: exit by then even if clients do not read */
	bool exit_now;
	int exit_code;
	char fatal[256];          /* why the workers are given up on, for status */
	char ctx_note[256];       /* "" or why the default --ctx is below the model's (shmem.c), for the ready line */

	/* workers */
	struct nxd_proc *procs;   /* (n_workers) */
	int n_workers;
	int wlog_rd, wlog_wr;     /* the workers' log pipe */
	char wlog_buf[4096];
	size_t wlog_len;

	struct nxd_step step;     /* step.c's alone to write */

	/* io_uring loop */
	struct io_uring ring;
	int listen_fd;
	int sock_lock_fd;       /* the socket path's lock (loop.c lock_socket_path), -1 when activated */
	bool listen_activated;    /* from systemd: not ours to unlink */
	bool socket_created;
	bool accept_multishot, accept_armed;
	double accept_retry_at;   /* after an accept error (EMFILE...): not before this */
	int sig_fd;
	struct signalfd_siginfo sig_buf;
	bool sig_armed;
	uint32_t signals;         /* NXD_SIG bits received, for daemon.c to act on */
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
	bool prep_armed;

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
	int step_rows;            /* logits rows of the running step (sched.c plan) */
	enum nxd_round draft_round; /* draft.c: where the draft steps before the next main step are */
	/* NXD_PROFILE: the workers' wait from one step's end to the next one's
	 * start when the next follows without a pause (the supervisor's turn:
	 * sampling, streaming, planning, waking them; sched.c prof_turn) */
	bool in_step_done;        /* a step launched now follows the one just done */
	bool step_follows;        /* the running step was launched so */
	uint64_t prof_last_end;   /* nx_prof ticks: the step before's end (its last worker) */
	uint64_t prof_turn_ticks, prof_turns;
	struct nxd_lora_reg *lora; /* lora.c: adapters, folds, the helper thread's job */
	struct nxd_prep_pool *prep; /* prep.c: request lines prepared off the loop */

	/* guard.c: shared memory is checked against these, never trusted */
	struct nx_tok_in *toks_copy;     /* (n_batch) the descriptor as we wrote it */
	struct nx_scratch *scratch_copy; /* (n_workers) the scratch structs as laid out */
	struct nx_scratch *draft_scratch_copy; /* (n_workers) the draft model's, or NULL */
};

double nxd_now(void); /* CLOCK_MONOTONIC seconds */

/* model.c */
int nxd_model_load(struct nxd *d, struct nx_err *err);
/* The file at path into mo: read or mapped, parsed, bound and made read-only. */
int nxd_model_load_weights(struct nxd *d, struct nxd_model *mo, const char *path, struct nx_err *err);
void nxd_model_free(struct nxd *d);
void nxd_model_free_one(struct nxd_model *mo);

/* draft.c - the draft model (nxd --draft-model). Drafts are the draft's
 * greedy continuation, made in draft-model steps before a main step and
 * verified in it like prompt lookup's (spec.c, sched.c). */
/* Loads --draft-model (none: 0) through the model's loader and refuses one
 * whose vocabulary is not the model's, naming what differs. */
int nxd_draft_load(struct nxd *d, struct nx_err *err);
bool nxd_draft_loaded(const struct nxd *d);
/* The round of draft steps before the next main step: plans and launches
 * the next draft step and returns true, or false once the drafts are made. */
bool nxd_draft_pump(struct nxd *d);
/* A draft step finished: each sequence's next draft is the argmax of its row. */
void nxd_draft_step_done(struct nxd *d);
/* A request admitted into s whose first own tokens match what s held. */
void nxd_draft_admit(struct nxd_slot *s, int own);
/* The main step verified s's drafts: base = its decode token's position + 1,
 * accepted of them kept: what the draft cache still holds. */
void nxd_draft_verified(struct nxd_slot *s, int base, int accepted);
/* Copies up to max of s's drafts into s->spec.draft; how many. */
int nxd_draft_take(struct nxd_slot *s, int max);

/* shmem.c */
/* Before the model file of size bytes is read: it must fit RLIMIT_AS and
 * the memory cgroup; else -1, err names the limit, the need and the way out. */
int nxd_mem_check_model(struct nxd *d, size_t size, struct nx_err *err);
/* The default --ctx: the model's training context, or the largest multiple
 * of 256 below it whose KV cache for --slots fits MemAvailable and the
 * cgroup's limit with headroom (why: d->ctx_note). */
void nxd_mem_default_ctx(struct nxd *d);
/* Sizes every region from the configuration, checks the total against
 * RLIMIT_AS and the memory cgroup (memory.max refuses, memory.high warns),
 * reserves the arena (with room for adapters and folds) and carves it. */
int nxd_shm_setup(struct nxd *d, struct nx_err *err);
void nxd_shm_free(struct nxd *d);

/* procs.c */
int nxd_procs_init(struct nxd *d, struct nx_err *err);
int nxd_proc_spawn(struct nxd *d, int band);
/* band's pidfd is readable: reaps it, records why, reports the death to
 * step.c, schedules the respawn (back-off after start-up deaths). */
void nxd_proc_died(struct nxd *d, int band);
/* SIGKILLs band's process, if any; excused: its death is no start-up failure. */
void nxd_proc_kill(struct nxd *d, int band, bool excused);
/* Respawns the bands whose back-off is over. The caller knows it is safe:
 * no survivor inside an aborted step, the block not dirty. */
void nxd_procs_tick(struct nxd *d, double now);
/* Every worker completed a step: start-up is behind them. */
void nxd_procs_started(struct nxd *d);
bool nxd_procs_all_live(const struct nxd *d);
bool nxd_procs_all_gone(const struct nxd *d);
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
/* No new connections: the accept is cancelled and our socket file removed. */
void nxd_loop_stop_accepting(struct nxd *d);

/* daemon.c */
/* After every batch of events: signals, readiness, the step, the next plan. */
void nxd_after_events(struct nxd *d);
/* Stops accepting, ends every stream with a clear event, tells the workers
 * to quit; the loop exits once clients have read what is left. */
void nxd_begin_shutdown(struct nxd *d, const char *why);
/* c's prep job is done: handle the lines it has buffered, read on. */
void nxd_conn_resume(struct nxd *d, struct nxd_conn *c);

/* conn.c */
/* Queues one event line; a client over --out-limit, or one we have no memory
 * for, is closed instead (nothing for the caller to handle). */
void nxd_conn_queue(struct nxd *d, struct nxd_conn *c, const char *line, size_t len);
size_t nxd_conn_queued(const struct nxd_conn *c);
/* Every open connection has sent all that was queued for it. */
bool nxd_conns_drained(const struct nxd *d);
void nxd_conn_reset(struct nxd_conn *c);
void nxd_send_error(struct nxd *d, struct nxd_conn *c, const char *id, enum nxp_code code,
		    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ops.c - a request line in two parts. nxd_prepare does what reads nothing
 * the loop changes (parse; the chat template and tokenizer of generate,
 * tokenize and detokenize) and may run on the prep thread; nxd_apply does the
 * rest on the loop. */
struct nxd_prep_ctx {
	const struct nx_tok *tok;
	enum nx_chat_tmpl tmpl;
	const char *jinja;
	size_t max_piece;         /* the longest token's bytes: a cheap bound on a text's tokens */
	struct nxp_limits lim;
};
struct nxd_prepared {
	bool blank;               /* an empty line: no request, no answer */
	int parse_rc;             /* nxp_parse: < 0 and parse_err */
	struct nxp_error parse_err;
	struct nxp_request q;
	int prep_rc;              /* the template or tokenizer: < 0 and prep_err */
	struct nxp_error prep_err;
	int32_t *toks;            /* generate: the prompt; tokenize: the ids (n_toks) */
	int n_toks;
	char *text;               /* detokenize (text_len) */
	size_t text_len;
	char *answer;             /* tokenize, detokenize: the encoded answer line (answer_len), NULL when out of memory */
	size_t answer_len;
	struct nx_toolp *tools;   /* generate with tools: the reader of its calls (taken over by the request) */
	struct nx_grammar *call_grammar; /* tool_choice required or named: the call's grammar (taken over by the request's matcher) */
};
struct nxd_prep_ctx nxd_prep_ctx_of(const struct nxd *d);
void nxd_prepare(const struct nxd_prep_ctx *x, struct nxd_prepared *p, const char *line, size_t len);
void nxd_apply(struct nxd *d, struct nxd_conn *c, struct nxd_prepared *p);
void nxd_prepared_free(struct nxd_prepared *p);
/* Both at once, on the loop (a short line). */
void nxd_handle_line(struct nxd *d, struct nxd_conn *c, const char *line, size_t len);

/* prep.c - the prep thread */
int nxd_prep_init(struct nxd *d, struct nx_err *err);
void nxd_prep_free(struct nxd *d);
/* Copies the line to the thread and pauses c until its answer is applied;
 * -1 when out of memory (c is not paused). */
int nxd_prep_submit(struct nxd *d, struct nxd_conn *c, const char *line, size_t len);
/* The eventfd that counts finished jobs, and the buffer to read it into. */
int nxd_prep_fd(const struct nxd *d, uint64_t **buf);
/* Applies every finished job whose connection is still there and resumes it. */
void nxd_prep_collect(struct nxd *d);

/* sched.c */
int nxd_sched_init(struct nxd *d, struct nx_err *err);
void nxd_sched_free(struct nxd *d);
/* Admits (or queues) a parsed generate request; answers errors itself. */
void nxd_sched_submit(struct nxd *d, struct nxd_req *r);
/* Launches a step when none runs and there is work. */
void nxd_sched_pump(struct nxd *d);
/* The step finished (every live worker acked): sample, stream, plan on. */
void nxd_sched_step_done(struct nxd *d);
/* The step was aborted and cleaned up: counted, and planned again. */
void nxd_sched_step_retry(struct nxd *d);
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

/* spec.c - speculative decoding. A decoding sequence that speculates gets up
 * to k drafted tokens after its decode token, in what the step's token budget
 * and logits rows leave once every other sequence's tokens are placed; the
 * step's rows are sampled in order and a draft is kept while it equals the
 * token drawn (sched.c: nxd_sched_step_done). */
/* At start: the step-time fits NXD_TEST_SPEC_FIT pins, or -1 naming it when it cannot be read. */
int nxd_spec_init(struct nxd *d, struct nx_err *err);
/* A request admitted into s (its k, 0 for off). */
void nxd_spec_admit(const struct nxd *d, struct nxd_slot *s, int k);
/* Drafts for s's next step, at most max: the continuation of the latest
 * earlier occurrence of hist's last n tokens (n = 3, 2, 1), as many of them
 * as are expected to pay in a step of n tokens and rows logits rows so far,
 * or none while s backs off. Returns how many were written to s->spec.draft. */
int nxd_spec_draft(const struct nxd *d, struct nxd_slot *s, int max, int n, int rows);
/* Of m drafts s has at hand (order: the n-gram length they came from, 0 for
 * the draft model's), how many a main step of n tokens and rows rows so far
 * should carry: the count expected to emit the most tokens per second by the
 * step-time fits and s's recent acceptance; 0 when none pays, but 1 now and
 * then (a probe: has the acceptance changed?); m until the fits tell. */
int nxd_spec_worth(const struct nxd *d, struct nxd_slot *s, int order, int m, int n, int rows);
/* The step's verdict on s's drafts: seen of them were compared with the
 * tokens drawn (fewer than n_draft when the request ended first), accepted
 * of those kept. s->req is NULL when the request ended. */
void nxd_spec_learn(struct nxd *d, struct nxd_slot *s, int seen, int accepted);
/* Draft tokens a step of n tokens and rows logits rows with other
 * sequences in it may carry: what adds at most NXD_SPEC_SHARED_COST of the
 * step's time (0 until the step times tell). */
int nxd_spec_shared_budget(const struct nxd *d, int n, int rows);
/* A finished step of n tokens and rows logits rows took dt seconds. */
void nxd_spec_fit_step(struct nxd *d, int n, int rows, double dt);
/* The same for a draft-model step. */
void nxd_spec_fit_draft_step(struct nxd *d, int n, int rows, double dt);
/* What drafting with the draft model may cost beside other sequences in a
 * main step of n tokens and rows rows: *allow seconds (NXD_SPEC_SHARED_COST of
 * it), *per_draft seconds a draft costs (its draft step, its verification),
 * *per_token a catch-up token; false until the step times tell. */
bool nxd_spec_draft_costs(const struct nxd *d, int n, int rows, double *allow, double *per_draft, double *per_token);

/* access.c - who may do what (docs/reliability.md 17, 24, 25).
 *
 * For the LoRA ops (daemon/lora*.c):
 *   - lora_load, lora_unload, lora_fold, lora_unfold, lora_report and
 *     shutdown are refused with `forbidden` in nxd_handle_line (ops.c) unless
 *     nxd_access_check_admin passes; a new op that changes what every client
 *     sees, or spends the daemon's CPU on a background job, belongs in that
 *     list (is_admin_op);
 *   - lora_load opens its files with nxd_access_open_adapter: one message
 *     whatever the reason, and files the peer could not read itself are
 *     refused (a root daemon must not read /root/x for uid 1000);
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
/* Opens the adapter at path (a GGUF, a PEFT safetensors file with the
 * adapter_config.json beside it, or a PEFT directory) as c's peer could:
 * the path is walked once, each directory and file checked on what was
 * opened, never looked up by name again (access.c). 0 and the open files in
 * f (nxd_access_close_adapter closes them), or -1 and err is
 * NXD_PATH_REFUSED whatever the reason. */
int nxd_access_open_adapter(const struct nxd_conn *c, const char *path, struct nx_lora_files *f,
			    struct nx_err *err);
void nxd_access_close_adapter(struct nx_lora_files *f);
/* The one answer for every path nxd will not use (missing, unreadable, not a
 * regular file, not an adapter): it must not tell these apart (docs/reliability.md 17). */
#define NXD_PATH_REFUSED "cannot use '%s': not a readable regular file"
/* 0 when one more adapter of bytes_new fits --max-adapters and
 * --max-adapter-mb beside n_loaded adapters of bytes_loaded; else -1, err. */
int nxd_limits_check_adapter(int n_loaded, size_t bytes_loaded, size_t bytes_new, struct nx_err *err);

/* guard.c */
int nxd_guard_init(struct nxd *d, struct nx_err *err);
void nxd_guard_free(struct nxd *d);
/* The descriptor's first n tokens as written for the step being launched. */
void nxd_guard_keep_descriptor(struct nxd *d, int n);
/* Checks shared memory against our copies and what d->step says (gen,
 * tokens, aborting, the live set); false with why naming the first bad field. */
bool nxd_guard_check(const struct nxd *d, char *why, size_t cap);
/* Rewrites the block, the descriptor and the workers' structs from our
 * copies. Only with every worker gone. */
void nxd_guard_repair(struct nxd *d);

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

#endif
