/* repack.c - nx_model_repack: the model's matrices into the tile kernels' packed layout, as a copy or in place. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "model/repack.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "kern/pack.h"

bool nx_wt_packable(const struct nx_wt *w)
{
	return w->data && nx_pack_fast(w->type) && w->n_out % NX_PACK_ROWS == 0 && w->n_in % 32 == 0 &&
	       (size_t)nx_row_size(w->type, w->n_in) == w->row_bytes;
}

/* Every matrix of the model, the embedding last (it may be the output's tensor). */
static int all_wts(struct nx_model *m, struct nx_wt **out)
{
	int n = 0;
	for (int il = 0; il < m->hp.n_layer; il++) {
		struct nx_layer *L = &m->layers[il];
		out[n++] = &L->wq;
		out[n++] = &L->wk;
		out[n++] = &L->wv;
		out[n++] = &L->wo;
		out[n++] = &L->w_gate;
		out[n++] = &L->w_up;
		out[n++] = &L->w_down;
		/* experts' stacked matrices: packed as one when each expert's rows are whole groups (moe.h: nx_moe_expert) */
		if (m->hp.n_expert) {
			out[n++] = &L->moe_router;
			if (m->hp.n_ff_exp % NX_PACK_ROWS == 0) {
				out[n++] = &L->moe_gate;
				out[n++] = &L->moe_up;
			}
			if (m->hp.dim % NX_PACK_ROWS == 0)
				out[n++] = &L->moe_down;
		}
		if (m->hp.n_ff_shexp) { /* qwen2moe's shared expert; its one-row gate never packs */
			out[n++] = &L->shexp_gate;
			out[n++] = &L->shexp_up;
			out[n++] = &L->shexp_down;
		}
	}
	out[n++] = &m->output;
	out[n++] = &m->tok_embd;
	return n;
}

#define MAX_WTS (14 * NX_MAX_LAYERS + 2)

/* The first of wts[0..i) with the same data as wts[i], or NULL. */
static struct nx_wt *earlier(struct nx_wt **wts, int i)
{
	for (int k = 0; k < i; k++)
		if (wts[k]->data == wts[i]->data)
			return wts[k];
	return NULL;
}

static size_t wt_bytes(const struct nx_wt *w)
{
	return (w->row_bytes * (size_t)w->n_out + 63) / 64 * 64;
}

size_t nx_model_repack_size(const struct nx_model *m)
{
	struct nx_wt *wts[MAX_WTS];
	int n = all_wts((struct nx_model *)m, wts);
	size_t total = 0;
	for (int i = 0; i < n; i++)
		if (nx_wt_packable(wts[i]) && !earlier(wts, i))
			total += wt_bytes(wts[i]);
	return total;
}

/* One matrix to pack: its plain rows at src (== dst: in place), packed to dst. */
struct pack_job {
	const struct nx_wt *w;
	const uint8_t *src;
	uint8_t *dst;
	int64_t g0; /* its first group in the count over all jobs */
};

struct pack_share {
	const struct pack_job *jobs;
	int n_jobs;
	int64_t g0, g1; /* this thread's groups of the count */
	size_t row_buf;   /* bytes of the largest group: in place, its rows are copied out first */
	bool failed;
};

/* Packs groups [g0, g1) of the count over the jobs: each is 16 rows, read and
 * written by this thread alone, so the threads need no lock. */
static void *pack_groups(void *arg)
{
	struct pack_share *sh = arg;
	uint8_t *rows = NULL;
	for (int j = 0; j < sh->n_jobs; j++) {
		const struct pack_job *jb = &sh->jobs[j];
		const struct nx_wt *w = jb->w;
		const int64_t n_g = w->n_out / NX_PACK_ROWS;
		const int64_t a = sh->g0 > jb->g0 ? sh->g0 - jb->g0 : 0, b = sh->g1 - jb->g0 < n_g ? sh->g1 - jb->g0 : n_g;
		const size_t gbytes = NX_PACK_ROWS * w->row_bytes;
		for (int64_t g = a; g < b; g++) {
			const uint8_t *src = jb->src + (size_t)g * gbytes;
			if (jb->src == jb->dst) {
				if (!rows && !(rows = malloc(sh->row_buf))) {
					sh->failed = true;
					return NULL;
				}
				memcpy(rows, src, gbytes);
				src = rows;
			}
			nx_pack_group(w->type, src, w->row_bytes, jb->dst + (size_t)g * gbytes, w->n_in);
		}
	}
	free(rows);
	return NULL;
}

/* Packs every job, its groups shared out in contiguous runs between the
 * CPUs this process may use (at most 8 threads; the caller's is one of them):
 * the daemon packs ~90 MB before it is ready. A run's result does not depend
 * on the thread that packs it. -1: out of memory. */
static int pack_jobs(struct pack_job *jobs, int n_jobs)
{
	int64_t total = 0;
	size_t row_buf = 0;
	for (int j = 0; j < n_jobs; j++) {
		jobs[j].g0 = total;
		total += jobs[j].w->n_out / NX_PACK_ROWS;
		if (NX_PACK_ROWS * jobs[j].w->row_bytes > row_buf)
			row_buf = NX_PACK_ROWS * jobs[j].w->row_bytes;
	}
	cpu_set_t cs;
	int n_thr = sched_getaffinity(0, sizeof(cs), &cs) == 0 ? CPU_COUNT(&cs) : 1;
	n_thr = n_thr < 1 ? 1 : n_thr > 8 ? 8 : n_thr;
	if (total < 64 * n_thr) /* too little to be worth a thread */
		n_thr = 1;
	struct pack_share sh[8];
	pthread_t th[8];
	bool started[8] = {false};
	for (int t = 0; t < n_thr; t++)
		sh[t] = (struct pack_share){.jobs = jobs, .n_jobs = n_jobs, .g0 = total * t / n_thr,
					    .g1 = total * (t + 1) / n_thr, .row_buf = row_buf};
	for (int t = 1; t < n_thr; t++)
		started[t] = pthread_create(&th[t], NULL, pack_groups, &sh[t]) == 0;
	pack_groups(&sh[0]);
	for (int t = 1; t < n_thr; t++) {
		if (started[t])
			pthread_join(th[t], NULL);
		else
			pack_groups(&sh[t]); /* no thread: this one does its share */
	}
	for (int t = 0; t < n_thr; t++)
		if (sh[t].failed)
			return -1;
	return 0;
}

int nx_model_repack(struct nx_model *m, void *dst, size_t size, struct nx_err *err)
{
	if (size < nx_model_repack_size(m) || (uintptr_t)dst % 64)
		return nx_errf(err, "repack: block of %zu bytes at %p, need %zu bytes 64-aligned", size, dst,
			       nx_model_repack_size(m));
	struct nx_wt *wts[MAX_WTS];
	struct pack_job jobs[MAX_WTS];
	int n = all_wts(m, wts), n_jobs = 0;
	uint8_t *p = dst;
	for (int i = 0; i < n; i++) {
		struct nx_wt *w = wts[i];
		if (!nx_wt_packable(w) || earlier(wts, i))
			continue;
		jobs[n_jobs++] = (struct pack_job){.w = w, .src = w->data, .dst = p};
		w->packed = p;
		p += wt_bytes(w);
	}
	if (pack_jobs(jobs, n_jobs))
		return nx_errf(err, "repack: out of memory");
	for (int i = 0; i < n; i++) {
		struct nx_wt *e = earlier(wts, i);
		if (e && nx_wt_packable(wts[i]))
			wts[i]->packed = e->packed;
	}
	return 0;
}

int nx_model_repack_inplace(struct nx_model *m, ptrdiff_t plain_delta, struct nx_err *err)
{
	struct nx_wt *wts[MAX_WTS];
	struct pack_job jobs[MAX_WTS];
	int n = all_wts(m, wts), n_jobs = 0;
	for (int i = 0; i < n; i++)
		if (nx_wt_packable(wts[i]) && !earlier(wts, i)) {
			uint8_t *base = (uint8_t *)(uintptr_t)wts[i]->data; /* the caller's own, writable bytes */
			jobs[n_jobs++] = (struct pack_job){.w = wts[i], .src = base, .dst = base};
		}
	if (pack_jobs(jobs, n_jobs))
		return nx_errf(err, "repack: out of memory");
	/* The pointers only now: the jobs above were told apart by them. */
	const void *orig[MAX_WTS];
	for (int i = 0; i < n; i++)
		orig[i] = wts[i]->data;
	for (int i = 0; i < n; i++) {
		struct nx_wt *w = wts[i];
		int e = -1;
		for (int k = 0; k < i; k++)
			if (orig[k] == orig[i])
				e = k;
		if (e >= 0) { /* the same tensor as an earlier matrix (tied output / embedding) */
			w->packed = wts[e]->packed;
			w->data = wts[e]->data;
			continue;
		}
		if (!nx_wt_packable(w))
			continue;
		w->packed = (void *)(uintptr_t)orig[i];
		w->data = (const uint8_t *)orig[i] + plain_delta;
	}
	return n_jobs;
}
