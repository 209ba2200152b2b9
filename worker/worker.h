/* worker.h - a worker as the supervisor starts it: the small spec it is forked with, and its entry point.
 *
 * A worker is handed only what its step loop uses, never the supervisor's
 * struct (nginx passes ngx_spawn_process a proc and its data). Every pointer
 * is into memory mapped before the fork: the arena, or the read-only weights. */
#ifndef NXW_WORKER_H
#define NXW_WORKER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "model/forward.h"
#include "shm/ctl.h"
#include "worker/sandbox.h"

/* *nxw_spec.step_model of a step that runs the draft model. */
#define NXW_STEP_DRAFT 1

/* Pages a worker maps read-only before its first step. */
struct nxw_range {
	void *p;
	size_t len;
};

struct nxw_spec {
	int band;                        /* its band of every op, of ctl->n_workers */
	int cpu;                         /* the CPU it pins itself to */
	uint64_t spawn;                  /* the band's n-th process: 1 first, 2 its first respawn... (test hooks) */
	uint32_t seen_gen;               /* the supervisor's last step gen at the fork: it runs the next one */
	int log_fd;                      /* the workers' log pipe: the one fd it keeps */
	pid_t parent;                    /* the supervisor (the sandbox's parent-death check) */
	const struct nxw_filter *filter; /* the seccomp program, built by the supervisor */
	const struct nx_model *model;    /* the arena's copy of the bound model */
	struct nx_state *state;          /* the arena's state: activations, KV cache, logits */
	const struct nx_tok_in *toks;    /* (max_batch) the step descriptor */
	struct nx_scratch *scratch;      /* this band's scratch */
	struct nx_ctl *ctl;              /* the control block */
	/* nxd --draft-model: the draft model, its state and this band's scratch for
	 * it, and the word that says which model a step runs; else all NULL */
	const struct nx_model *draft_model;
	struct nx_state *draft_state;
	struct nx_scratch *draft_scratch;
	const int32_t *step_model;       /* 0: the model, 1: the draft model (daemon/step.h) */
	const struct nxw_range *ro;      /* (n_ro) mapped read-only before the sandbox */
	int n_ro;
};

/* The forked child: pin, protect, sandbox, then run its band of every step
 * until told to quit. Never returns. */
_Noreturn void nxw_main(const struct nxw_spec *s);

/* Inside a worker: one line on the log pipe, "worker B (pid P): ...". Only
 * snprintf and write: fine in the sandbox. */
void nxw_log(const struct nxw_spec *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
