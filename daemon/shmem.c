/* shmem.c - the arena's layout and reservation: each region's size added up with overflow checks (PostgreSQL's ipci.c), the whole checked against RLIMIT_AS and the memory cgroup, then reserved, carved and initialized.
 *
 * What the configuration can use, and how each part is counted:
 *   fixed     control block, step descriptor, model struct, state (activations,
 *             logits, the KV cache for --slots x --ctx), per-worker scratch,
 *             profile, the LoRA mix table: carved at start; all of it can be
 *             touched (the KV cache page by page, as sequences grow)
 *   adapters  --max-adapter-mb, plus each adapter's struct (--max-adapters)
 *   folds     a fold writes a new copy of every tensor it adapts (and of its
 *             packed copy), and folds stack: at most --max-adapters of them,
 *             each at most every adaptable tensor at its widest fold type
 * The reservation is fixed + (adapters + folds) and a quarter more of the
 * latter for the free list's fragmentation (lora.c reuses freed blocks first
 * fit). Address space only: pages exist where written. */
#include "daemon/nxd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora/adapter.h"
#include "lora/fold.h"
#include "shm/memlimit.h"

/* Address space the supervisor maps after the arena: heap, thread stacks and
 * their malloc arenas, a report's model copies. */
#define AS_MARGIN ((size_t)160 << 20)
/* Memory touched besides the model and the arena: code, libc, the tokenizer's
 * tables, the scheduler's buffers; and each worker's own stack, page tables
 * and copy-on-write pages (tests/py/test_daemon_memory.py bounds both). */
#define RSS_BASE ((size_t)48 << 20)
#define RSS_WORKER ((size_t)8 << 20)

#define MIB(n) ((double)(n) / 1048576)

struct plan {
	size_t ctl, toks, state, scratch, scratch_structs, prof, mix;
	size_t draft_state, draft_scratch; /* --draft-model: its state block, one band's scratch (else 0) */
	size_t kv;       /* of state: the KV cache */
	size_t fixed;    /* every region carved at start */
	size_t adapters; /* --max-adapter-mb and the adapters' structs */
	size_t folds;    /* --max-adapters folds at their widest */
	size_t optional; /* what is reserved for adapters and folds */
};

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

/* The K and V caches: (n_slots, n_layer, n_head_kv, n_ctx) rows of head_dim values each, as
 * --kv-type stores them (model/forward.h). */
static size_t kv_bytes(const struct nx_hparams *hp, const struct nx_state_cfg *cfg)
{
	const size_t n = nx_kv_cache_bytes(hp, cfg);
	return n ? n : SIZE_MAX;
}

static int plan_fixed(struct nxd *d, struct plan *p, struct nx_err *err)
{
	struct nxd_shm *sh = &d->shm;
	const struct nx_hparams *hp = &d->model.m.hp;
	p->ctl = nx_ctl_shm_size((uint32_t)d->n_workers);
	p->state = nx_state_size(hp, &sh->cfg);
	p->scratch = nx_scratch_size(hp, &sh->cfg);
	p->kv = kv_bytes(hp, &sh->cfg);
	if (p->ctl == 0)
		return nx_errf(err, "arena: %d workers is out of range (1..%d)", d->n_workers, NX_CTL_MAX_WORKERS);
	if (p->state == 0 || p->scratch == 0)
		return nx_errf(err, "arena: state for %d slots x %d positions, %d tokens per step does not fit",
			       sh->cfg.n_slots, sh->cfg.n_ctx, sh->cfg.max_batch);
	/* NXD_PROFILE=1: the workers time the phases of every step (a TSC read per
	 * phase change, no syscall); `nxctl status` shows the split. */
	p->prof = nx_env()->profile ? (size_t)d->n_workers * sizeof(struct nx_prof) : 0;
	if (mul((size_t)d->o.n_batch, sizeof(struct nx_tok_in), &p->toks, "the step descriptor", err) ||
	    mul((size_t)d->n_workers, sizeof(struct nx_scratch), &p->scratch_structs, "scratch structs", err) ||
	    mul((size_t)d->o.n_slots, sizeof(struct nx_lora_mix), &p->mix, "the LoRA mix table", err))
		return -1;
	p->fixed = 0;
	if (add(&p->fixed, p->ctl, "the control block", err) || add(&p->fixed, p->toks, "the step descriptor", err) ||
	    add(&p->fixed, sizeof(struct nx_model), "the model", err) ||
	    add(&p->fixed, sizeof(struct nx_state), "the state", err) ||
	    add(&p->fixed, p->state, "activations and KV cache", err) ||
	    add(&p->fixed, p->scratch_structs, "scratch structs", err) || add(&p->fixed, p->prof, "the profile", err) ||
	    add(&p->fixed, p->mix, "the LoRA mix table", err))
		return -1;
	for (int i = 0; i < d->n_workers; i++)
		if (add(&p->fixed, p->scratch, "worker scratch", err))
			return -1;
	p->draft_state = p->draft_scratch = 0;
	if (!nxd_draft_loaded(d))
		return 0;
	/* The draft model's own: its model struct, state (its K/V cache for
	 * every slot) and per-worker scratch, and the step's model word. */
	const struct nx_hparams *dhp = &d->draft.m.hp;
	p->draft_state = nx_state_size(dhp, &sh->draft_cfg);
	p->draft_scratch = nx_scratch_size(dhp, &sh->draft_cfg);
	const size_t dkv = kv_bytes(dhp, &sh->draft_cfg);
	if (p->draft_state == 0 || p->draft_scratch == 0 || dkv == SIZE_MAX)
		return nx_errf(err, "arena: the draft model's state for %d slots x %d positions does not fit",
			       sh->cfg.n_slots, sh->cfg.n_ctx);
	if (add(&p->fixed, sizeof(struct nx_model), "the draft model", err) ||
	    add(&p->fixed, sizeof(struct nx_state), "the draft model's state", err) ||
	    add(&p->fixed, p->draft_state, "the draft model's activations and KV cache", err) ||
	    add(&p->fixed, (size_t)d->n_workers * sizeof(struct nx_scratch), "the draft model's scratch structs", err) ||
	    add(&p->fixed, sizeof(int32_t), "the step's model word", err))
		return -1;
	for (int i = 0; i < d->n_workers; i++)
		if (add(&p->fixed, p->draft_scratch, "worker scratch for the draft model", err))
			return -1;
	return 0;
}

/* One fold at its largest: a new block (and a packed one) for every tensor
 * an adapter can target, each rounded up to pages like lora.c's blocks. */
static int fold_bound(const struct nx_model *m, size_t *out, struct nx_err *err)
{
	*out = 0;
	for (int il = 0; il < m->hp.n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct nx_wt *t = nx_lora_base(m, il, (enum nx_lora_which)w);
			int64_t n = t ? nx_fold_size_max(t) : -1;
			if (n < 0)
				continue; /* no fold can produce it, so none will */
			size_t b = (size_t)n;
			if (nx_size_align(&b, NX_ARENA_ALIGN) || nx_size_add(&b, NX_ARENA_ALIGN) || nx_size_add(out, b))
				return nx_errf(err, "arena: size overflow computing the room for a fold");
		}
	return 0;
}

static int plan_lora(struct nxd *d, struct plan *p, struct nx_err *err)
{
	size_t one_fold, per_struct = sizeof(struct nx_lora), n = (size_t)d->o.max_adapters;
	if (fold_bound(&d->model.m, &one_fold, err) < 0)
		return -1;
	/* An adapter is two blocks (its struct, its A and B), each page-rounded. */
	if (nx_size_align(&per_struct, NX_ARENA_ALIGN) || nx_size_add(&per_struct, 2 * NX_ARENA_ALIGN))
		return nx_errf(err, "arena: size overflow computing the room for adapters");
	p->adapters = d->o.max_adapter_mb;
	p->folds = one_fold;
	if (nx_size_mul(&p->adapters, (size_t)1 << 20) || nx_size_mul(&per_struct, n) ||
	    nx_size_add(&p->adapters, per_struct) || nx_size_mul(&p->folds, n))
		return nx_errf(err, "arena: size overflow computing the room for %zu adapters of %zu MiB", n,
			       d->o.max_adapter_mb);
	if (n == 0)
		p->adapters = p->folds = 0;
	size_t slack = p->adapters / 4;
	p->optional = p->adapters;
	if (nx_size_add(&slack, p->folds / 4) || nx_size_add(&p->optional, p->folds) || nx_size_add(&p->optional, slack))
		return nx_errf(err, "arena: size overflow computing the room for adapters and folds");
	return 0;
}

/* What the options of the fixed part are; every message that refuses names them. */
static const char *const lower_fixed = "lower --ctx or --slots (the KV cache), --batch or --workers";

/* Memory the configuration will touch for sure, in bytes: the model when it
 * is read into private memory (--mmap: page cache, which the kernel can drop
 * and read again), the fixed regions, the processes' own. */
static size_t touched(const struct nxd *d, const struct plan *p)
{
	size_t n = d->o.use_mmap ? 0 : d->model.copy.len;
	if (!d->o.use_mmap && nx_size_add(&n, d->draft.copy.len)) /* --draft-model's, 0 without */
		return SIZE_MAX;
	if (nx_size_add(&n, p->fixed) || nx_size_add(&n, RSS_BASE) ||
	    nx_size_add(&n, RSS_WORKER * (size_t)d->n_workers))
		return SIZE_MAX;
	return n;
}

static int check_cgroup(struct nxd *d, const struct plan *p, const struct nx_memlimit *ml, struct nx_err *err)
{
	const struct nxd_opts *o = &d->o;
	size_t need = touched(d, p), model = d->model.size + d->draft.size, act = p->fixed - (p->kv < p->fixed ? p->kv : 0);
	if (need > ml->max.bytes)
		return nx_errf(err,
			       "memory: the cgroup's limit %s is %.1f MiB, and this configuration needs %.1f MiB: "
			       "the model %.1f MiB%s, the KV cache %.1f MiB (--slots %d x --ctx %d), activations and "
			       "scratch %.1f MiB, the processes %.0f MiB; %s%s, or raise the limit",
			       ml->max.file, MIB(ml->max.bytes), MIB(need), MIB(o->use_mmap ? 0 : d->model.copy.len + d->draft.copy.len),
			       o->use_mmap ? " (--mmap: page cache, not counted)" : "", MIB(p->kv), o->n_slots, o->n_ctx,
			       MIB(act), MIB(RSS_BASE + RSS_WORKER * (size_t)d->n_workers), lower_fixed,
			       o->use_mmap ? "" : ", use --mmap");
	if (o->use_mmap && ml->max.bytes != NX_NO_LIMIT && need + model > ml->max.bytes)
		nxd_warn("memory: the weights (%.1f MiB, --mmap) do not fit %s (%.1f MiB) beside the rest (%.1f MiB): "
			 "the kernel will read them from the file again and again",
			 MIB(model), ml->max.file, MIB(ml->max.bytes), MIB(need));
	else if (ml->max.bytes != NX_NO_LIMIT && need + p->adapters > ml->max.bytes)
		nxd_warn("memory: %s (%.1f MiB) leaves %.1f MiB for adapters and folds, less than --max-adapter-mb %zu: "
			 "loading that much would make the kernel kill a worker; lower --max-adapter-mb",
			 ml->max.file, MIB(ml->max.bytes), MIB(ml->max.bytes - need), o->max_adapter_mb);
	if (need > ml->high.bytes)
		nxd_warn("memory: this configuration needs %.1f MiB, more than %s (%.1f MiB): the kernel will "
			 "throttle nxd and reclaim its memory all the time; %s, or raise the limit",
			 MIB(need), ml->high.file, MIB(ml->high.bytes), lower_fixed);
	return 0;
}

/* Address space the model takes: its private copy and the file's mapping. */
static size_t model_as(const struct nxd *d)
{
	return d->model.copy.len + (d->model.map ? d->model.size : 0) + d->draft.copy.len +
	       (d->draft.map ? d->draft.size : 0);
}

/* The fixed part must fit RLIMIT_AS beside what is mapped already; adapters
 * and folds get what is left, up to what they can use. */
static int check_as(struct nxd *d, struct plan *p, const struct nx_memlimit *ml, struct nx_err *err)
{
	if (ml->as == NX_NO_LIMIT)
		return 0;
	const struct nxd_opts *o = &d->o;
	uint64_t vm = nx_vm_size(), need = vm;
	if (__builtin_add_overflow(need, (uint64_t)AS_MARGIN, &need) ||
	    __builtin_add_overflow(need, (uint64_t)p->fixed, &need) || need > ml->as)
		return nx_errf(err,
			       "memory: RLIMIT_AS (address space) is %.1f MiB, and nxd needs %.1f MiB of it: %.1f MiB "
			       "mapped already (the model's %.1f MiB included), the arena's %.1f MiB (the KV cache "
			       "%.1f MiB for --slots %d x --ctx %d) and %.0f MiB for heap and threads; %s, or raise the "
			       "limit (ulimit -v, prlimit --as, LimitAS=)",
			       MIB(ml->as), MIB(need), MIB(vm), MIB(model_as(d)), MIB(p->fixed), MIB(p->kv), o->n_slots,
			       o->n_ctx, MIB(AS_MARGIN), lower_fixed);
	uint64_t room = (ml->as - need) & ~(uint64_t)(NX_ARENA_ALIGN - 1);
	if (room < p->optional) {
		nxd_warn("memory: RLIMIT_AS (%.1f MiB) leaves %.1f MiB of address space for adapters and folded tensors, "
			 "of the %.1f MiB that --max-adapters %d and --max-adapter-mb %zu can take: a load or fold past "
			 "it is refused",
			 MIB(ml->as), MIB(room), MIB(p->optional), o->max_adapters, o->max_adapter_mb);
		p->optional = (size_t)room;
	}
	return 0;
}

int nxd_mem_check_model(struct nxd *d, size_t size, struct nx_err *err)
{
	struct nx_memlimit ml;
	nx_memlimit_read(&ml, "/proc/self");
	bool copy = !d->o.use_mmap;
	/* Copy mode maps the file twice: the private copy on 2 MiB pages (one
	 * more for alignment) and the plain rows' read-only mapping. */
	size_t as_need = size, huge = size;
	if (copy && (nx_size_align(&huge, NX_HUGE_PAGE) || nx_size_add(&huge, NX_HUGE_PAGE) || nx_size_add(&as_need, huge)))
		return nx_errf(err, "model: size overflow (%zu bytes)", size);
	uint64_t vm = nx_vm_size(), need = vm;
	if (ml.as != NX_NO_LIMIT && (__builtin_add_overflow(need, (uint64_t)as_need + AS_MARGIN, &need) || need > ml.as))
		return nx_errf(err,
			       "memory: RLIMIT_AS (address space) is %.1f MiB, and loading the model needs %.1f MiB of it: "
			       "%.1f MiB mapped already, the model's %.1f MiB (%s) and %.0f MiB for heap and threads; raise "
			       "the limit (ulimit -v, prlimit --as, LimitAS=)%s",
			       MIB(ml.as), MIB(need), MIB(vm), MIB(as_need),
			       copy ? "read into memory, and mapped for its plain rows" : "mapped", MIB(AS_MARGIN),
			       copy ? ", or use --mmap (mapped once)" : "");
	size_t touch = size;
	if (copy && (nx_size_add(&touch, RSS_BASE) || touch > ml.max.bytes))
		return nx_errf(err,
			       "memory: the cgroup's limit %s is %.1f MiB, and the model alone needs %.1f MiB (read into "
			       "memory) plus %.0f MiB for the daemon; raise the limit, or use --mmap (the weights then stay "
			       "page cache, read from the file again whenever the kernel drops them)",
			       ml.max.file, MIB(ml.max.bytes), MIB(size), MIB(RSS_BASE));
	return 0;
}

/* --draft-model: its regions, laid out like the model's. */
static int carve_draft(struct nxd *d, const struct plan *p, struct nx_err *err)
{
	struct nxd_shm *sh = &d->shm;
	const struct nx_hparams *hp = &d->draft.m.hp;
	void *q;
	if (!(sh->draft_model = nx_arena_alloc(&sh->arena, sizeof(struct nx_model), err)))
		return -1;
	memcpy(sh->draft_model, &d->draft.m, sizeof(struct nx_model));
	if (!(sh->draft_state_shared = nx_arena_alloc(&sh->arena, sizeof(struct nx_state), err)))
		return -1;
	if (!(q = nx_arena_alloc(&sh->arena, p->draft_state, err)))
		return -1;
	if (nx_state_init(&sh->draft_state, q, p->draft_state, hp, &sh->draft_cfg, err) < 0)
		return nx_err_prefix(err, "arena: the draft model");
	memcpy(sh->draft_state_shared, &sh->draft_state, sizeof(struct nx_state));
	if (!(sh->draft_scratch = nx_arena_alloc(&sh->arena, (size_t)d->n_workers * sizeof(struct nx_scratch), err)))
		return -1;
	for (int i = 0; i < d->n_workers; i++) {
		if (!(q = nx_arena_alloc(&sh->arena, p->draft_scratch, err)))
			return -1;
		if (nx_scratch_init(&sh->draft_scratch[i], q, p->draft_scratch, hp, &sh->draft_cfg, err) < 0)
			return nx_err_prefix(err, "arena: worker %d scratch for the draft model", i);
	}
	if (!(sh->step_model = nx_arena_alloc(&sh->arena, sizeof(int32_t), err)))
		return -1;
	*sh->step_model = NXD_STEP_MAIN;
	/* the draft's model struct is read-only in the workers as the model's is */
	sh->ro[sh->n_ro].p = sh->draft_model;
	sh->ro[sh->n_ro++].len = sizeof(struct nx_model);
	return 0;
}

static int carve(struct nxd *d, const struct plan *p, struct nx_err *err)
{
	struct nxd_shm *sh = &d->shm;
	const struct nx_hparams *hp = &d->model.m.hp;
	void *q;
	if (!(q = nx_arena_alloc(&sh->arena, p->ctl, err)))
		return -1;
	sh->ctl = nx_ctl_shm_init(q, (uint32_t)d->n_workers, (uint32_t)d->o.n_batch, d->spin);
	if (!(sh->toks = nx_arena_alloc(&sh->arena, p->toks, err)))
		return -1;
	if (!(sh->model = nx_arena_alloc(&sh->arena, sizeof(struct nx_model), err)))
		return -1;
	memcpy(sh->model, &d->model.m, sizeof(struct nx_model));
	if (!(sh->state_shared = nx_arena_alloc(&sh->arena, sizeof(struct nx_state), err)))
		return -1;
	if (!(q = nx_arena_alloc(&sh->arena, p->state, err)))
		return -1;
	if (nx_state_init(&sh->state, q, p->state, hp, &sh->cfg, err) < 0)
		return nx_err_prefix(err, "arena");
	memcpy(sh->state_shared, &sh->state, sizeof(struct nx_state));
	if (!(sh->scratch = nx_arena_alloc(&sh->arena, p->scratch_structs, err)))
		return -1;
	for (int i = 0; i < d->n_workers; i++) {
		if (!(q = nx_arena_alloc(&sh->arena, p->scratch, err)))
			return -1;
		if (nx_scratch_init(&sh->scratch[i], q, p->scratch, hp, &sh->cfg, err) < 0)
			return nx_err_prefix(err, "arena: worker %d scratch", i);
	}
	sh->prof = NULL;
	if (p->prof) {
		if (!(sh->prof = nx_arena_alloc(&sh->arena, p->prof, err)))
			return -1;
		memset(sh->prof, 0, p->prof);
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
	return nxd_draft_loaded(d) ? carve_draft(d, p, err) : 0;
}

static void set_cfg(struct nxd *d)
{
	d->shm.cfg = (struct nx_state_cfg){
		.max_batch = d->o.n_batch,
		/* a row per sequence, and rows for the drafts speculation adds (sched.c plan) */
		.max_logits = d->o.n_slots + NXD_SPEC_ROWS < d->o.n_batch ? d->o.n_slots + NXD_SPEC_ROWS : d->o.n_batch,
		.n_slots = d->o.n_slots,
		.n_ctx = d->o.n_ctx,
		.act_one_part = d->o.act_one_part,
		.kv_type = d->o.kv_type,
	};
	/* the draft model's steps: a prompt chunk or a draft per sequence, a
	 * logits row per sequence */
	d->shm.draft_cfg = d->shm.cfg;
	d->shm.draft_cfg.max_logits = d->o.n_slots;
}

/* Memory the configuration adds to what is resident once the model is
 * loaded: the arena's fixed part (the KV cache page by page as contexts
 * fill) and the processes' own. */
static size_t to_come(const struct nxd *d, const struct plan *p)
{
	size_t n = p->fixed;
	if (nx_size_add(&n, RSS_BASE) || nx_size_add(&n, RSS_WORKER * (size_t)d->n_workers))
		return SIZE_MAX;
	return n;
}

/* An explicit --ctx / --slots whose memory the system does not have now is
 * refused, naming both: the kernel would kill a worker as the contexts fill. */
static int check_available(const struct nxd *d, const struct plan *p, uint64_t avail, struct nx_err *err)
{
	if (avail == NX_NO_LIMIT) /* a /proc without meminfo (systemd's ProcSubset=pid): the check cannot be made */
		nxd_warn("memory: /proc/meminfo gives no MemAvailable; the KV cache (%.1f MiB) is not checked against "
			 "what the system has free", MIB(p->kv));
	if (avail == NX_NO_LIMIT || to_come(d, p) <= avail)
		return 0;
	return nx_errf(err,
		       "memory: --slots %d x --ctx %d take %.1f MiB of KV cache (%.1f MiB with activations, scratch and "
		       "the processes), more than the %.1f MiB the system has available (MemAvailable); %s",
		       d->o.n_slots, d->o.n_ctx, MIB(p->kv), MIB(to_come(d, p)), MIB(avail), lower_fixed);
}

/* What the default context leaves free: a quarter of MemAvailable for the
 * rest of the machine, an eighth of the cgroup's limit for what these
 * counts miss (page cache and kernel memory charged to the cgroup). */
#define AVAIL_USE(b) ((b) / 4 * 3)
#define CGROUP_USE(b) ((b) / 8 * 7)

/* Which limit --slots x n_ctx exceeds with the default's headroom: NULL when none. */
static const char *over_limit(struct nxd *d, int n_ctx, const struct nx_memlimit *ml, uint64_t avail)
{
	struct plan p;
	d->o.n_ctx = n_ctx;
	set_cfg(d);
	if (plan_fixed(d, &p, NULL) < 0)
		return "the arena's size";
	if (avail != NX_NO_LIMIT && to_come(d, &p) > AVAIL_USE(avail))
		return "MemAvailable";
	if (ml->max.bytes != NX_NO_LIMIT && touched(d, &p) > CGROUP_USE(ml->max.bytes))
		return ml->max.file;
	return NULL;
}

#define CTX_STEP 256 /* a capped context is a multiple of this (attention's span) */

void nxd_mem_default_ctx(struct nxd *d)
{
	const int train = d->model.m.hp.n_ctx_train > 0 ? d->model.m.hp.n_ctx_train : 2048;
	struct nx_memlimit ml;
	nx_memlimit_read(&ml, "/proc/self");
	const uint64_t avail = nx_mem_available("/proc/meminfo");
	d->ctx_note[0] = '\0';
	const char *over = over_limit(d, train, &ml, avail);
	if (!over) {
		d->o.n_ctx = train;
		return;
	}
	/* the largest multiple of CTX_STEP that fits: the need grows with n_ctx */
	int lo = 0, hi = train / CTX_STEP;
	while (lo < hi) {
		const int mid = (lo + hi + 1) / 2;
		if (over_limit(d, mid * CTX_STEP, &ml, avail))
			hi = mid - 1;
		else
			lo = mid;
	}
	/* nothing fits with headroom: the smallest, which nxd_shm_setup refuses if it cannot fit at all */
	d->o.n_ctx = lo > 0 ? lo * CTX_STEP : train < CTX_STEP ? train : CTX_STEP;
	const uint64_t limit = over == ml.max.file ? ml.max.bytes : avail;
	snprintf(d->ctx_note, sizeof(d->ctx_note), "the model's context %d capped: %d slots of it would not fit %.160s "
		 "(%.1f MiB) with headroom", train, d->o.n_slots, over, MIB(limit));
	nxd_info("memory: --ctx %d by default, %s; --ctx or --slots set it", d->o.n_ctx, d->ctx_note);
}

int nxd_shm_setup(struct nxd *d, struct nx_err *err)
{
	struct nxd_shm *sh = &d->shm;
	set_cfg(d);
	/* Sizes first, so an impossible configuration fails before anything is mapped. */
	struct plan p;
	struct nx_memlimit ml;
	if (plan_fixed(d, &p, err) < 0 || plan_lora(d, &p, err) < 0)
		return -1;
	nx_memlimit_read(&ml, "/proc/self");
	if (check_cgroup(d, &p, &ml, err) < 0 || check_available(d, &p, nx_mem_available("/proc/meminfo"), err) < 0 ||
	    check_as(d, &p, &ml, err) < 0)
		return -1;
	size_t reserve = p.fixed;
	if (nx_size_add(&reserve, p.optional))
		return nx_errf(err, "arena: size overflow adding the room for adapters and folds");
	if (nx_arena_create(&sh->arena, "nxd-arena", reserve, err) < 0)
		return -1;
	nxd_info("arena: %.1f MiB (KV cache %.1f MiB, activations %.1f MiB, scratch %.1f MiB x %d); %.1f MiB "
		 "reserved for adapters and folds (--max-adapters %d, --max-adapter-mb %zu)",
		 MIB(p.fixed), MIB(p.kv), MIB(p.state - (p.kv < p.state ? p.kv : 0)), MIB(p.scratch), d->n_workers,
		 MIB(p.optional), d->o.max_adapters, d->o.max_adapter_mb);
	if (p.draft_state)
		nxd_info("arena: of it the draft model's: state %.1f MiB (its KV cache %.1f MiB), scratch %.1f MiB x %d",
			 MIB(p.draft_state), MIB(nx_kv_cache_bytes(&d->draft.m.hp, &sh->draft_cfg)), MIB(p.draft_scratch),
			 d->n_workers);
	if (ml.max.bytes != NX_NO_LIMIT)
		nxd_info("memory: up to %.1f MiB touched (the KV cache as the contexts fill) within %s (%.1f MiB)",
			 MIB(touched(d, &p)), ml.max.file, MIB(ml.max.bytes));
	return carve(d, &p, err);
}

void nxd_shm_free(struct nxd *d)
{
	nx_arena_destroy(&d->shm.arena);
}
