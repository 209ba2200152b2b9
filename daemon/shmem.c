/* shmem.c - the arena's layout: each region's size added up with overflow checks, then carved and initialized (PostgreSQL's ipci.c). */
#include "daemon/nxd.h"

#include <stdlib.h>
#include <string.h>

static int add(size_t *total, size_t n, const char *what, struct nx_err *err)
{
	if (nx_size_add(total, n) < 0 || nx_size_align(total, NX_ARENA_ALIGN) < 0)
		return nx_errf(err, "arena: size overflow adding %s (%zu bytes)", what, n);
	return 0;
}

static int mul(size_t a, size_t b, size_t *out, const char *what, struct nx_err *err)
{
	*out = a;
	if (nx_size_mul(out, b) < 0)
		return nx_errf(err, "arena: size overflow computing %s (%zu x %zu)", what, a, b);
	return 0;
}

int nxd_shm_setup(struct nxd *d, struct nx_err *err)
{
	struct nxd_shm *sh = &d->shm;
	const struct nx_hparams *hp = &d->model.m.hp;
	sh->cfg = (struct nx_state_cfg){
		.max_batch = d->o.n_batch,
		.max_logits = d->o.n_slots, /* one row per sequence per step at most */
		.n_slots = d->o.n_slots,
		.n_ctx = d->o.n_ctx,
		.act_one_part = d->o.act_one_part,
	};

	/* Sizes first, so an impossible configuration fails before anything is carved. */
	size_t ctl_size = nx_ctl_shm_size((uint32_t)d->n_workers);
	size_t state_size = nx_state_size(hp, &sh->cfg);
	size_t scratch_size = nx_scratch_size(hp, &sh->cfg);
	size_t toks_size, scratch_structs, total = 0;
	if (ctl_size == 0)
		return nx_errf(err, "arena: %d workers is out of range (1..%d)", d->n_workers, NX_CTL_MAX_WORKERS);
	if (state_size == 0 || scratch_size == 0)
		return nx_errf(err, "arena: state for %d slots x %d positions, %d tokens per step does not fit",
			       sh->cfg.n_slots, sh->cfg.n_ctx, sh->cfg.max_batch);
	if (mul((size_t)d->o.n_batch, sizeof(struct nx_tok_in), &toks_size, "the step descriptor", err) ||
	    mul((size_t)d->n_workers, sizeof(struct nx_scratch), &scratch_structs, "scratch structs", err))
		return -1;
	if (add(&total, ctl_size, "the control block", err) || add(&total, toks_size, "the step descriptor", err) ||
	    add(&total, sizeof(struct nx_model), "the model", err) ||
	    add(&total, sizeof(struct nx_state), "the state", err) || add(&total, state_size, "activations and KV cache", err) ||
	    add(&total, scratch_structs, "scratch structs", err))
		return -1;
	for (int i = 0; i < d->n_workers; i++)
		if (add(&total, scratch_size, "worker scratch", err))
			return -1;
	nxd_info("arena: %.1f MiB (KV cache and activations %.1f MiB, scratch %.1f MiB x %d)",
		 (double)total / 1048576, (double)state_size / 1048576, (double)scratch_size / 1048576,
		 d->n_workers);

	void *p;
	if (!(p = nx_arena_alloc(&sh->arena, ctl_size, err)))
		return -1;
	sh->ctl = nx_ctl_shm_init(p, (uint32_t)d->n_workers, (uint32_t)d->o.n_batch, d->spin);
	if (!(sh->toks = nx_arena_alloc(&sh->arena, toks_size, err)))
		return -1;
	if (!(sh->model = nx_arena_alloc(&sh->arena, sizeof(struct nx_model), err)))
		return -1;
	memcpy(sh->model, &d->model.m, sizeof(struct nx_model));
	if (!(sh->state_shared = nx_arena_alloc(&sh->arena, sizeof(struct nx_state), err)))
		return -1;
	if (!(p = nx_arena_alloc(&sh->arena, state_size, err)))
		return -1;
	if (nx_state_init(&sh->state, p, state_size, hp, &sh->cfg, err) < 0)
		return nx_err_prefix(err, "arena");
	memcpy(sh->state_shared, &sh->state, sizeof(struct nx_state));
	if (!(sh->scratch = nx_arena_alloc(&sh->arena, scratch_structs, err)))
		return -1;
	for (int i = 0; i < d->n_workers; i++) {
		if (!(p = nx_arena_alloc(&sh->arena, scratch_size, err)))
			return -1;
		if (nx_scratch_init(&sh->scratch[i], p, scratch_size, hp, &sh->cfg, err) < 0)
			return nx_err_prefix(err, "arena: worker %d scratch", i);
	}
	/* NXD_PROFILE=1: the workers time the phases of every step (a TSC read per
	 * phase change, no syscall); `nxctl status` shows the split. */
	sh->prof = NULL;
	if (nx_env()->profile) {
		if (!(sh->prof = nx_arena_alloc(&sh->arena, (size_t)d->n_workers * sizeof(struct nx_prof), err)))
			return -1;
		memset(sh->prof, 0, (size_t)d->n_workers * sizeof(struct nx_prof));
		for (int i = 0; i < d->n_workers; i++)
			sh->scratch[i].prof = &sh->prof[i];
		nx_prof_tick_ns(); /* measured here, before the workers exist */
		nxd_info("profile: on (NXD_PROFILE=1): per-phase times in status");
	}

	/* What workers only read: the model struct (page-aligned). The weights
	 * are not in the arena and read-only already (daemon/model.c). */
	sh->n_ro = 0;
	sh->ro[sh->n_ro].p = sh->model;
	sh->ro[sh->n_ro++].len = sizeof(struct nx_model);
	nxd_info("arena: %.1f MiB in use of %.0f GiB reserved", (double)sh->arena.size / 1048576,
		 (double)sh->arena.reserved / (1 << 30));
	return 0;
}

void nxd_shm_free(struct nxd *d)
{
	nx_arena_destroy(&d->shm.arena);
}
