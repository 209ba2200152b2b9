/* guard.c - the supervisor's distrust of shared memory: control block and descriptor validation, repair after a scribbling worker, the step watchdog.
 *
 * Workers can write the whole arena but the model struct (the weights are
 * outside it, read-only in every process).
 * Whatever the supervisor reads back from it is checked against its own
 * copies on every look (nx_ctl_check, plus the descriptor, the workers' state
 * and scratch structs). An inconsistency means some worker wrote where it
 * must not, and we cannot tell which: every worker is killed, the block is
 * rewritten from the supervisor's values once they are all gone, and fresh
 * workers run the interrupted step again (RELIABILITY 21).
 *
 * A worker that wedges without writing anything is caught by the watchdog:
 * a step longer than WATCHDOG_FACTOR x its measured cost (never below
 * WATCHDOG_FLOOR, never above --step-timeout) is aborted. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WATCHDOG_FACTOR 20.0  /* x the slowest recent per-token step time */
#define WATCHDOG_FLOOR 5.0    /* s: no step is aborted sooner (a loaded 2-CPU machine stalls for seconds) */
#define WATCHDOG_WARMUP 8     /* steps measured before the estimate replaces --step-timeout */
#define WATCHDOG_DECAY 0.995  /* per step: the max forgets a slow spell over ~hundreds of steps */

int nxd_guard_init(struct nxd *d, struct nx_err *err)
{
	d->toks_copy = calloc((size_t)d->o.n_batch, sizeof(*d->toks_copy));
	d->scratch_copy = malloc((size_t)d->n_workers * sizeof(*d->scratch_copy));
	if (!d->toks_copy || !d->scratch_copy)
		return nx_errf(err, "guard: out of memory");
	memcpy(d->scratch_copy, d->shm.scratch, (size_t)d->n_workers * sizeof(*d->scratch_copy));
	memcpy(d->toks_copy, d->shm.toks, (size_t)d->o.n_batch * sizeof(*d->toks_copy));
	const char *sc = nx_env()->test_worker_scribble;
	if (sc && *sc)
		nxd_warn("test hook: worker 0 will scribble on %s and hang", sc);
	return 0;
}

void nxd_guard_free(struct nxd *d)
{
	free(d->toks_copy);
	free(d->scratch_copy);
	d->toks_copy = NULL;
	d->scratch_copy = NULL;
}

double nxd_guard_step_limit(const struct nxd *d, int n)
{
	double cap = d->o.step_timeout, floor = cap < WATCHDOG_FLOOR ? cap : WATCHDOG_FLOOR;
	if (d->wd_steps < WATCHDOG_WARMUP)
		return cap;
	double t = WATCHDOG_FACTOR * d->wd_per_tok * (n > 0 ? n : 1);
	return t < floor ? floor : t > cap ? cap : t;
}

void nxd_guard_launch(struct nxd *d, int n)
{
	/* Our copy of what the workers must find in the descriptor. */
	memcpy(d->toks_copy, d->shm.toks, (size_t)n * sizeof(*d->toks_copy));
	d->step_limit = nxd_guard_step_limit(d, n);
	d->step_gen++; /* our count, never the block's */
	nx_ctl_launch_gen(d->shm.ctl, n, d->step_gen);
}

void nxd_guard_step_done(struct nxd *d, double dt, int n)
{
	double per_tok = dt / (n > 0 ? n : 1);
	d->wd_per_tok *= WATCHDOG_DECAY;
	if (per_tok > d->wd_per_tok)
		d->wd_per_tok = per_tok;
	d->wd_steps++;
}

/* Kills every worker: we do not know which one wrote. */
static void trip(struct nxd *d, const char *why)
{
	nxd_err("control block inconsistent: %s; a worker wrote where it must not: killing and respawning every worker",
		why);
	d->ctl_dirty = true;
	nxd_sched_forget_prompts(d, "control block inconsistent");
	for (int i = 0; i < d->n_workers; i++) {
		struct nxd_proc *p = &d->procs[i];
		if (p->pid > 0) {
			p->killed = true;
			kill(p->pid, SIGKILL);
		}
	}
	/* The running step is dropped and retried once fresh workers are up. */
	if (d->step_state == NXD_STEP_RUNNING)
		d->step_state = NXD_STEP_ABORTING;
}

/* The fields nx_state_init / nx_scratch_init lay out, which no worker may
 * change. Others (the owner's lora / capture / prof settings, a band's cache
 * of what xq holds) are not the layout and are not compared. */
static bool state_same(const struct nx_state *a, const struct nx_state *b)
{
	return !memcmp(&a->cfg, &b->cfg, sizeof(a->cfg)) && a->dim == b->dim && a->kv_dim == b->kv_dim &&
	       a->q_dim == b->q_dim && a->n_ff == b->n_ff && a->n_vocab == b->n_vocab && a->n_layer == b->n_layer &&
	       a->x == b->x && a->q == b->q && a->k == b->k && a->v == b->v && a->att_out == b->att_out &&
	       a->hb == b->hb && a->k_cache == b->k_cache && a->v_cache == b->v_cache && a->logits == b->logits &&
	       a->logit_gmax == b->logit_gmax && a->att_part == b->att_part && a->att_ms == b->att_ms && a->lora_u == b->lora_u &&
	       a->lora == b->lora && a->n_lora == b->n_lora; /* lora.c sets both copies: the mix table */
}

static bool scratch_same(const struct nx_scratch *a, const struct nx_scratch *b)
{
	return a->xn == b->xn && a->xq == b->xq && a->xq_stride == b->xq_stride && a->xq_d == b->xq_d &&
	       a->xq_s == b->xq_s && a->xq_c == b->xq_c && a->xq_c16 == b->xq_c16 && a->att == b->att &&
	       a->att_in == b->att_in && a->rope == b->rope && a->lora_u == b->lora_u && a->lora_y == b->lora_y &&
	       a->act_one_part == b->act_one_part;
}

static void state_restore(struct nx_state *a, const struct nx_state *b)
{
	a->cfg = b->cfg;
	a->dim = b->dim, a->kv_dim = b->kv_dim, a->q_dim = b->q_dim, a->n_ff = b->n_ff;
	a->n_vocab = b->n_vocab, a->n_layer = b->n_layer;
	a->x = b->x, a->q = b->q, a->k = b->k, a->v = b->v, a->att_out = b->att_out, a->hb = b->hb;
	a->k_cache = b->k_cache, a->v_cache = b->v_cache, a->logits = b->logits, a->logit_gmax = b->logit_gmax;
	a->att_part = b->att_part, a->att_ms = b->att_ms, a->lora_u = b->lora_u;
	a->lora = b->lora, a->n_lora = b->n_lora;
}

static void scratch_restore(struct nx_scratch *a, const struct nx_scratch *b)
{
	a->xn = b->xn, a->xq = b->xq, a->xq_stride = b->xq_stride, a->att = b->att, a->att_in = b->att_in;
	a->xq_d = b->xq_d, a->xq_s = b->xq_s, a->xq_c = b->xq_c, a->xq_c16 = b->xq_c16;
	a->rope = b->rope;
	a->lora_u = b->lora_u, a->lora_y = b->lora_y;
	a->act_one_part = b->act_one_part;
	a->xq_src = NULL; /* forget what xq held */
}

bool nxd_guard_check(struct nxd *d)
{
	if (d->ctl_dirty)
		return false;
	char why[256];
	for (int i = 0; i < d->n_workers; i++)
		d->live[i] = d->procs[i].pid > 0;
	struct nx_ctl_expect e = {
		.n_workers = (uint32_t)d->n_workers,
		.max_batch = (uint32_t)d->o.n_batch,
		.spin = d->spin,
		.gen = d->step_gen,
		.step_n = d->step_n,
		.aborting = d->step_state == NXD_STEP_ABORTING,
		.live = d->live,
	};
	if (nx_ctl_check(d->shm.ctl, &e, why, sizeof(why)) < 0) {
		trip(d, why);
		return false;
	}
	/* The descriptor of the last step, the workers' state struct and their
	 * scratch structs: pointers and positions the workers follow. */
	if (d->step_n > 0 && memcmp(d->shm.toks, d->toks_copy, (size_t)d->step_n * sizeof(*d->toks_copy))) {
		for (int i = 0; i < d->step_n; i++)
			if (memcmp(&d->shm.toks[i], &d->toks_copy[i], sizeof(d->toks_copy[i]))) {
				snprintf(why, sizeof(why), "the step descriptor's token %d changed while the step ran", i);
				break;
			}
		trip(d, why);
		return false;
	}
	if (!state_same(d->shm.state_shared, &d->shm.state)) {
		trip(d, "the workers' state struct (activation and KV cache pointers) changed");
		return false;
	}
	for (int i = 0; i < d->n_workers; i++)
		if (!scratch_same(&d->shm.scratch[i], &d->scratch_copy[i])) {
			snprintf(why, sizeof(why), "worker %d's scratch struct (its buffer pointers) changed", i);
			trip(d, why);
			return false;
		}
	return true;
}

bool nxd_guard_repair(struct nxd *d)
{
	if (!d->ctl_dirty)
		return true;
	for (int i = 0; i < d->n_workers; i++)
		if (d->procs[i].pid > 0)
			return false; /* a killed worker not reaped yet */
	struct nx_ctl *ctl = d->shm.ctl;
	nx_ctl_repair(ctl, (uint32_t)d->n_workers, (uint32_t)d->o.n_batch, d->spin, d->step_gen);
	ctl->step_n = d->step_n;
	memcpy(d->shm.toks, d->toks_copy, (size_t)d->o.n_batch * sizeof(*d->toks_copy));
	state_restore(d->shm.state_shared, &d->shm.state);
	for (int i = 0; i < d->n_workers; i++)
		scratch_restore(&d->shm.scratch[i], &d->scratch_copy[i]);
	d->ctl_dirty = false;
	nxd_info("control block rewritten from the supervisor's copies; respawning the workers");
	return true;
}
