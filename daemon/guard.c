/* guard.c - the supervisor's distrust of shared memory: the control block, the step descriptor and the workers' structs checked against our own copies, and rewritten from them.
 *
 * Workers can write the whole arena but the model struct (the weights are
 * outside it, read-only in every process).
 * Whatever the supervisor reads back from it is checked against its own
 * copies on every look (nx_ctl_check, plus the descriptor, the workers' state
 * and scratch structs). An inconsistency means some worker wrote where it
 * must not; what follows (kill them all, repair, retry) is step.c's to do.
 * These are checks only: nothing here kills, aborts or decides. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nxd_guard_init(struct nxd *d, struct nx_err *err)
{
	d->toks_copy = calloc((size_t)d->o.n_batch, sizeof(*d->toks_copy));
	d->scratch_copy = malloc((size_t)d->n_workers * sizeof(*d->scratch_copy));
	if (!d->toks_copy || !d->scratch_copy)
		return nx_errf(err, "guard: out of memory");
	memcpy(d->scratch_copy, d->shm.scratch, (size_t)d->n_workers * sizeof(*d->scratch_copy));
	memcpy(d->toks_copy, d->shm.toks, (size_t)d->o.n_batch * sizeof(*d->toks_copy));
	if (d->shm.draft_scratch) {
		d->draft_scratch_copy = malloc((size_t)d->n_workers * sizeof(*d->draft_scratch_copy));
		if (!d->draft_scratch_copy)
			return nx_errf(err, "guard: out of memory");
		memcpy(d->draft_scratch_copy, d->shm.draft_scratch, (size_t)d->n_workers * sizeof(*d->draft_scratch_copy));
	}
	return 0;
}

void nxd_guard_free(struct nxd *d)
{
	free(d->toks_copy);
	free(d->scratch_copy);
	free(d->draft_scratch_copy);
	d->toks_copy = NULL;
	d->scratch_copy = NULL;
	d->draft_scratch_copy = NULL;
}

void nxd_guard_keep_descriptor(struct nxd *d, int n)
{
	memcpy(d->toks_copy, d->shm.toks, (size_t)n * sizeof(*d->toks_copy));
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
	       a->moe_logits == b->moe_logits && a->moe_h == b->moe_h &&
	       a->lora == b->lora && a->n_lora == b->n_lora; /* lora.c sets both copies: the mix table */
}

static bool scratch_same(const struct nx_scratch *a, const struct nx_scratch *b)
{
	return a->xn == b->xn && a->xq == b->xq && a->xq_stride == b->xq_stride && a->xq_d == b->xq_d &&
	       a->xq_s == b->xq_s && a->xq_c == b->xq_c && a->xq_c16 == b->xq_c16 && a->att == b->att &&
	       a->att_in == b->att_in && a->rope == b->rope && a->lora_u == b->lora_u && a->lora_y == b->lora_y &&
	       a->act_one_part == b->act_one_part && a->moe_x == b->moe_x && a->moe_y == b->moe_y &&
	       a->route.expert == b->route.expert && a->route.off == b->route.off &&
	       a->route.row_tok == b->route.row_tok && a->route.row_w == b->route.row_w &&
	       a->route.tok_sel == b->route.tok_sel && a->route.tok_w == b->route.tok_w &&
	       a->route.count == b->route.count; /* not n_active: each layer's */
}

static void state_restore(struct nx_state *a, const struct nx_state *b)
{
	a->cfg = b->cfg;
	a->dim = b->dim, a->kv_dim = b->kv_dim, a->q_dim = b->q_dim, a->n_ff = b->n_ff;
	a->n_vocab = b->n_vocab, a->n_layer = b->n_layer;
	a->x = b->x, a->q = b->q, a->k = b->k, a->v = b->v, a->att_out = b->att_out, a->hb = b->hb;
	a->k_cache = b->k_cache, a->v_cache = b->v_cache, a->logits = b->logits, a->logit_gmax = b->logit_gmax;
	a->att_part = b->att_part, a->att_ms = b->att_ms, a->lora_u = b->lora_u;
	a->moe_logits = b->moe_logits, a->moe_h = b->moe_h;
	a->lora = b->lora, a->n_lora = b->n_lora;
}

static void scratch_restore(struct nx_scratch *a, const struct nx_scratch *b)
{
	a->xn = b->xn, a->xq = b->xq, a->xq_stride = b->xq_stride, a->att = b->att, a->att_in = b->att_in;
	a->xq_d = b->xq_d, a->xq_s = b->xq_s, a->xq_c = b->xq_c, a->xq_c16 = b->xq_c16;
	a->rope = b->rope;
	a->lora_u = b->lora_u, a->lora_y = b->lora_y;
	a->act_one_part = b->act_one_part;
	a->moe_x = b->moe_x, a->moe_y = b->moe_y, a->route = b->route;
	a->xq_src = NULL; /* forget what xq held */
}

bool nxd_guard_check(const struct nxd *d, char *why, size_t cap)
{
	const struct nxd_step *st = &d->step;
	struct nx_ctl_expect e = {
		.n_workers = (uint32_t)d->n_workers,
		.max_batch = (uint32_t)d->o.n_batch,
		.spin = d->spin,
		.gen = st->gen,
		.step_n = st->n,
		.aborting = st->state == NXD_STEP_ABORTING,
		.live = st->live,
	};
	if (nx_ctl_check(d->shm.ctl, &e, why, cap) < 0)
		return false;
	/* The descriptor of the last step, the workers' state struct and their
	 * scratch structs: pointers and positions the workers follow. */
	if (st->n > 0 && memcmp(d->shm.toks, d->toks_copy, (size_t)st->n * sizeof(*d->toks_copy))) {
		for (int i = 0; i < st->n; i++)
			if (memcmp(&d->shm.toks[i], &d->toks_copy[i], sizeof(d->toks_copy[i]))) {
				snprintf(why, cap, "the step descriptor's token %d changed while the step ran", i);
				break;
			}
		return false;
	}
	if (!state_same(d->shm.state_shared, &d->shm.state)) {
		snprintf(why, cap, "the workers' state struct (activation and KV cache pointers) changed");
		return false;
	}
	for (int i = 0; i < d->n_workers; i++)
		if (!scratch_same(&d->shm.scratch[i], &d->scratch_copy[i])) {
			snprintf(why, cap, "worker %d's scratch struct (its buffer pointers) changed", i);
			return false;
		}
	if (!d->shm.step_model)
		return true;
	/* --draft-model: which model the step runs, and the draft's structs */
	if (*d->shm.step_model != (int32_t)st->model) {
		snprintf(why, cap, "the step's model word is %d, expected %d", (int)*d->shm.step_model, (int)st->model);
		return false;
	}
	if (!state_same(d->shm.draft_state_shared, &d->shm.draft_state)) {
		snprintf(why, cap, "the workers' draft-model state struct changed");
		return false;
	}
	for (int i = 0; i < d->n_workers; i++)
		if (!scratch_same(&d->shm.draft_scratch[i], &d->draft_scratch_copy[i])) {
			snprintf(why, cap, "worker %d's draft-model scratch struct changed", i);
			return false;
		}
	return true;
}

void nxd_guard_repair(struct nxd *d)
{
	struct nx_ctl *ctl = d->shm.ctl;
	nx_ctl_repair(ctl, (uint32_t)d->n_workers, (uint32_t)d->o.n_batch, d->spin, d->step.gen);
	ctl->step_n = d->step.n;
	memcpy(d->shm.toks, d->toks_copy, (size_t)d->o.n_batch * sizeof(*d->toks_copy));
	state_restore(d->shm.state_shared, &d->shm.state);
	for (int i = 0; i < d->n_workers; i++)
		scratch_restore(&d->shm.scratch[i], &d->scratch_copy[i]);
	if (d->shm.step_model) {
		*d->shm.step_model = (int32_t)d->step.model;
		state_restore(d->shm.draft_state_shared, &d->shm.draft_state);
		for (int i = 0; i < d->n_workers; i++)
			scratch_restore(&d->shm.draft_scratch[i], &d->draft_scratch_copy[i]);
	}
	nxd_info("control block rewritten from the supervisor's copies; respawning the workers");
}
