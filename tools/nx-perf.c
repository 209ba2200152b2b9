/* nx-perf.c - throughput benchmark of the forward pass: decode and prefill tokens/s with persistent bands.
 *
 *   nx-perf MODEL.gguf [--threads N] [--reps R] [--decode G] [--seqs S] [--prefill C,C...]
 *                      [--prompt P] [--spin-us U] [--profile] [--plain] [--small-pages] [--cpu-time]
 *                      [--activations precise|fast] [--kv-type f16|q8_0]
 *
 * Runs the pass the way the daemon does: N bands on N threads pinned one per
 * CPU, started once, meeting at the daemon's spin-then-futex barrier
 * (shm/futex.h), the weights in private memory (read, not mapped) on 2 MiB
 * pages like the daemon's (shm/hugemem.h; --small-pages: 4 KiB pages, what
 * NX_HUGE=0 gives the daemon), activations and KV cache on 4 KiB pages like
 * the daemon's arena.
 *   decode  - S sequences (one KV slot each) prefilled with P tokens, then G
 *             steps of one token per sequence (greedy): S*G / seconds.
 *   prefill - for each chunk size C: a prompt of 512 tokens (at least C) fed in
 *             steps of C tokens, logits of the last one: tokens / seconds.
 * Each figure is printed for every rep, then the median and the best.
 * Matrices are packed for the tile kernels (model/repack.h) as in the daemon,
 * unless --plain. --profile adds the time split of each band (nx_prof, model/forward.h).
 * --activations, --kv-type: nxd's options of those names (nx_state_cfg.act_one_part, kv_type). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kern/cpu.h"
#include "kern/pack.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/repack.h"
#include "sample/sampler.h"
#include "shm/futex.h"
#include "shm/hugemem.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("nx-perf: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* --cpu-time: the process's CPU time instead of the wall clock, and rates
 * scaled by the thread count: what the run would give on an idle machine,
 * less robust to spinning but not to other processes' load. */
static clockid_t clk = CLOCK_MONOTONIC;
static double cpu_scale = 1;

static double now(void)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- engine */

struct engine {
	struct nx_model m;
	struct nx_state s;
	struct nx_scratch *sc;
	struct nx_prof *prof;
	int n_threads;
	uint32_t spin;
	/* the step: what the bands run when step_gen moves */
	const struct nx_tok_in *toks;
	int n;
	_Atomic uint32_t step_gen, done, quit, abort;
	struct nx_barrier bar;
	struct nx_sampler smp; /* only its scratch: greedy */
};

struct band_arg {
	struct engine *e;
	int band;
};

static void barrier_wait(void *ctx)
{
	struct engine *e = ctx;
	nx_barrier_wait(&e->bar, &e->abort, e->spin);
}

/* --static-bands: no work taking, each band computes its fixed rows. */
static bool static_bands;

static bool take_rows(void *ctx, uint32_t tag, uint32_t band, uint32_t units, uint32_t chunk, uint32_t *u0,
		      uint32_t *u1)
{
	struct engine *e = ctx;
	return nx_barrier_take(&e->bar, tag, band, units, chunk, u0, u1);
}

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

static void *band_main(void *p)
{
	struct band_arg *a = p;
	struct engine *e = a->e;
	struct nx_sync sync = {.barrier = barrier_wait, .take = static_bands ? NULL : take_rows, .ctx = e};
	pin(a->band);
	uint32_t seen = 0;
	for (;;) {
		seen = nx_futex_wait_change(&e->step_gen, seen, NULL, e->spin);
		if (atomic_load(&e->quit))
			return NULL;
		nx_forward(&e->m, &e->s, e->toks, e->n, a->band, e->n_threads, &e->sc[a->band], &sync);
		atomic_fetch_add(&e->done, 1);
	}
}

static void run_step(struct engine *e, const struct nx_tok_in *toks, int n)
{
	e->toks = toks;
	e->n = n;
	atomic_store(&e->done, 0);
	atomic_fetch_add(&e->step_gen, 1);
	nx_futex_wake(&e->step_gen, 1 << 30);
	struct nx_sync sync = {.barrier = barrier_wait, .take = static_bands ? NULL : take_rows, .ctx = e};
	nx_forward(&e->m, &e->s, toks, n, 0, e->n_threads, &e->sc[0], &sync);
	/* The pass ends with a barrier (every band is past its last write); wait
	 * for the others to leave it too, so their profile counters are final. */
	while (atomic_load(&e->done) < (uint32_t)e->n_threads - 1)
		__builtin_ia32_pause();
}

/* The weights: the file and the packed copy, each on its own huge-page
 * mapping (never freed). */
static bool small_pages;
static struct nx_huge weights[2];
static int n_weights;

static void *alloc_weights(size_t n)
{
	struct nx_err err = {{0}};
	if (n_weights == 2 || nx_huge_map(&weights[n_weights], n, !small_pages, &err))
		die("weights: %s", n_weights == 2 ? "more than two blocks" : err.msg);
	return weights[n_weights++].p;
}

static void *alloc64(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) / 64 * 64);
	if (!p)
		die("out of memory (%zu bytes)", n);
	memset(p, 0, (n + 63) / 64 * 64);
	return p;
}

static void engine_init(struct engine *e, const struct gguf_file *g, int n_threads, struct nx_state_cfg cfg,
			uint32_t spin, bool profile, bool plain, pthread_t *th, struct band_arg *args)
{
	struct nx_err err = {{0}};
	memset(e, 0, sizeof(*e));
	if (nx_model_bind(&e->m, g, &err))
		die("%s", err.msg);
	size_t ps = nx_model_repack_size(&e->m);
	if (!plain && ps && nx_model_repack(&e->m, alloc_weights(ps), ps, &err))
		die("%s", err.msg);
	printf("packed for the tile kernels: %.1f MiB%s\n", plain ? 0.0 : ps / 1048576.0, plain ? " (--plain)" : "");
	long long huge = 0, len = 0;
	for (int i = 0; i < n_weights; i++) {
		long long r = nx_huge_resident(weights[i].p, weights[i].len);
		huge += r > 0 ? r : 0;
		len += (long long)weights[i].len;
	}
	printf("weights on 2 MiB pages: %.1f of %.1f MiB%s\n", huge / 1048576.0, len / 1048576.0,
	       small_pages ? " (--small-pages)" : "");
	e->n_threads = n_threads;
	e->spin = spin;
	if (nx_kv_type_check(&e->m.hp, cfg.kv_type, &err))
		die("%s", err.msg);
	size_t ss = nx_state_size(&e->m.hp, &cfg), sz = nx_scratch_size(&e->m.hp, &cfg);
	if (!ss || !sz)
		die("bad state config");
	if (nx_state_init(&e->s, alloc64(ss), ss, &e->m.hp, &cfg, &err))
		die("%s", err.msg);
	const struct nx_sample_params any = nx_sample_params_default(); /* greedy() ignores them */
	if (nx_sampler_init(&e->smp, e->m.hp.n_vocab, &any, &err))
		die("%s", err.msg);
	e->sc = calloc(n_threads, sizeof(*e->sc));
	e->prof = alloc64(n_threads * sizeof(*e->prof));
	for (int b = 0; b < n_threads; b++) {
		if (nx_scratch_init(&e->sc[b], alloc64(sz), sz, &e->m.hp, &cfg, &err))
			die("%s", err.msg);
		e->sc[b].prof = profile ? &e->prof[b] : NULL;
	}
	nx_barrier_init(&e->bar, n_threads);
	pin(0);
	for (int b = 1; b < n_threads; b++) {
		args[b] = (struct band_arg){e, b};
		if (pthread_create(&th[b], NULL, band_main, &args[b]))
			die("pthread_create failed");
	}
}

static void engine_stop(struct engine *e, pthread_t *th)
{
	atomic_store(&e->quit, 1);
	atomic_fetch_add(&e->step_gen, 1);
	nx_futex_wake(&e->step_gen, 1 << 30);
	for (int b = 1; b < e->n_threads; b++)
		pthread_join(th[b], NULL);
}

/* ---------------------------------------------------------------- runs */

/* Logits row's greedy token, picked as nxd picks it (from the group maxima
 * the bands wrote): a scan of the whole row would add its time to every
 * sequence's step. Token 0 when no logit is above -inf (a broken model still
 * gets timed). */
static int greedy(struct engine *e, int row)
{
	const int n_vocab = e->m.hp.n_vocab, n_groups = (n_vocab + NX_SAMPLE_GROUP - 1) / NX_SAMPLE_GROUP;
	const int tok = nx_sample_greedy(&e->smp, e->s.logits + (size_t)row * n_vocab,
					 e->s.logit_gmax + (size_t)row * n_groups);
	return tok < 0 ? 0 : tok;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n)
{
	printf("%-16s", what);
	for (int i = 0; i < n; i++)
		printf(" %7.1f", v[i]);
	qsort(v, n, sizeof(double), cmp_double);
	printf("   median %7.1f  best %7.1f tok/s\n", n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v[n - 1]);
	fflush(stdout);
}

static void prof_reset(struct engine *e)
{
	memset(e->prof, 0, e->n_threads * sizeof(*e->prof));
}

static void prof_print(struct engine *e, const char *what, double tokens)
{
	if (!e->sc[0].prof)
		return;
	printf("  profile %s (us per token, per band):\n", what);
	for (int p = 0; p < NX_PROF_N; p++) {
		printf("    %-10s", nx_prof_name(p));
		for (int b = 0; b < e->n_threads; b++)
			printf(" %9.2f", e->prof[b].ticks[p] * nx_prof_tick_ns() * 1e-3 / tokens);
		printf("\n");
	}
}

/* S sequences of P prompt tokens, then G decode steps of S tokens. */
static double decode(struct engine *e, int S, int P, int G)
{
	const int n_vocab = e->m.hp.n_vocab;
	struct nx_tok_in toks[S * P];
	int next[S];
	memset(toks, 0, sizeof(toks));
	for (int s = 0; s < S; s++)
		for (int i = 0; i < P; i++)
			toks[s * P + i] = (struct nx_tok_in){(int32_t)((1 + 7 * i + 131 * s) % n_vocab), i, s,
							     i == P - 1 ? s : -1, 0};
	run_step(e, toks, S * P);
	for (int s = 0; s < S; s++)
		next[s] = greedy(e, s);
	prof_reset(e);
	double t0 = now();
	for (int g = 0; g < G; g++) {
		for (int s = 0; s < S; s++)
			toks[s] = (struct nx_tok_in){next[s], P + g, s, s, 0};
		run_step(e, toks, S);
		for (int s = 0; s < S; s++)
			next[s] = greedy(e, s);
	}
	return cpu_scale * S * G / (now() - t0);
}

/* A prompt of L tokens in steps of C, logits of the last only. */
static double prefill(struct engine *e, int L, int C)
{
	const int n_vocab = e->m.hp.n_vocab;
	struct nx_tok_in toks[C];
	prof_reset(e);
	double t0 = now();
	for (int a = 0; a < L; a += C) {
		int n = L - a < C ? L - a : C;
		for (int i = 0; i < n; i++)
			toks[i] = (struct nx_tok_in){(int32_t)((3 + 11 * (a + i)) % n_vocab), a + i, 0,
						     a + i == L - 1 ? 0 : -1, 0};
		run_step(e, toks, n);
	}
	double t = now() - t0;
	(void)greedy(e, 0);
	return cpu_scale * L / t;
}

/* ---------------------------------------------------------------- main */

static long parse_long(const char *s, const char *what)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end)
		die("bad %s '%s'", what, s);
	return v;
}

int main(int argc, char **argv)
{
	const char *path = NULL, *chunks = "128,512";
	int n_threads = 2, reps = 5, G = 64, S = 1, P = 16;
	long spin_us = 20;
	bool profile = false, plain = false, act_one_part = false;
	enum nx_kv_type kv_type = NX_KV_F16;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool v = i + 1 < argc;
		if (!strcmp(a, "--threads") && v)
			n_threads = (int)parse_long(argv[++i], a);
		else if (!strcmp(a, "--reps") && v)
			reps = (int)parse_long(argv[++i], a);
		else if (!strcmp(a, "--decode") && v)
			G = (int)parse_long(argv[++i], a);
		else if (!strcmp(a, "--seqs") && v)
			S = (int)parse_long(argv[++i], a);
		else if (!strcmp(a, "--prompt") && v)
			P = (int)parse_long(argv[++i], a);
		else if (!strcmp(a, "--prefill") && v)
			chunks = argv[++i];
		else if (!strcmp(a, "--spin-us") && v)
			spin_us = parse_long(argv[++i], a);
		else if (!strcmp(a, "--profile"))
			profile = true;
		else if (!strcmp(a, "--static-bands"))
			static_bands = true;
		else if (!strcmp(a, "--plain"))
			plain = true;
		else if (!strcmp(a, "--small-pages"))
			small_pages = true;
		else if (!strcmp(a, "--activations") && v) {
			if (!nx_act_mode_parse(argv[++i], &act_one_part))
				die("--activations: '%s' is neither precise nor fast", argv[i]);
		} else if (!strcmp(a, "--kv-type") && v) {
			if (!nx_kv_type_parse(argv[++i], &kv_type))
				die("--kv-type: '%s' is neither f16 nor q8_0", argv[i]);
		} else if (!strcmp(a, "--cpu-time"))
			clk = CLOCK_PROCESS_CPUTIME_ID;
		else if (a[0] != '-' && !path)
			path = a;
		else
			die("usage: nx-perf MODEL.gguf [--threads N] [--reps R] [--decode G] [--seqs S] [--prefill C,C] "
			    "[--prompt P] [--spin-us U] [--profile] [--plain] [--small-pages] [--static-bands] [--cpu-time] "
			    "[--activations precise|fast] [--kv-type f16|q8_0]");
	}
	if (!path || n_threads < 1 || n_threads > 64 || reps < 1 || reps > 100 || G < 0 || S < 1 || S > 64 ||
	    P < 1 || P > 16384)
		die("bad arguments (see the usage)");
	struct nx_err kerr = {{0}};
	if (nx_kern_env_check(&kerr) < 0)
		fprintf(stderr, "nx-perf: warning: %s\n", kerr.msg);
	nx_cpu_amx_request(); /* before the kernels are chosen (kern/cpu.h) */
	if (nx_pack_kernel_amx(NX_Q8_0) && nx_pack_amx_check(&kerr) < 0)
		fprintf(stderr, "nx-perf: %s\n", kerr.msg);

	if (clk != CLOCK_MONOTONIC)
		cpu_scale = n_threads;
	/* The weights in private memory, like the daemon's copy mode (not a file mapping). */
	FILE *f = fopen(path, "rb");
	if (!f)
		die("cannot open %s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	size_t size = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	void *bytes = alloc_weights(size);
	if (fread(bytes, 1, size, f) != size)
		die("reading %s failed", path);
	fclose(f);
	struct gguf_file g;
	struct nx_err err = {{0}};
	if (gguf_parse(&g, bytes, size, &err))
		die("%s", err.msg);

	int C[8], n_c = 0, max_c = 1;
	char *dup = strdup(!strcmp(chunks, "0") ? "" : chunks), *save;
	for (char *w = strtok_r(dup, ",", &save); w && n_c < 8; w = strtok_r(NULL, ",", &save)) {
		C[n_c] = (int)parse_long(w, "--prefill chunk");
		if (C[n_c] < 1 || C[n_c] > 4096)
			die("chunk %d out of range", C[n_c]);
		if (C[n_c] > max_c)
			max_c = C[n_c];
		n_c++;
	}
	free(dup);
	int L = max_c > 512 ? max_c : 512;
	int batch = S * P > max_c ? S * P : max_c;
	int ctx = L > P + G ? L : P + G;
	struct engine e;
	pthread_t th[64];
	struct band_arg args[64];
	engine_init(&e, &g, n_threads,
		    (struct nx_state_cfg){.max_batch = batch, .max_logits = S, .n_slots = S, .n_ctx = ctx,
					  .act_one_part = act_one_part, .kv_type = kv_type},
		    (uint32_t)spin_us * nx_spin_calibrate(),
		    profile, plain, th, args);
	printf("%s: %d threads, %d reps\n", path, n_threads, reps);

	double v[100];
	if (G > 0) {
		char what[64];
		snprintf(what, sizeof(what), "decode x%d", S);
		decode(&e, S, P, 8 < G ? 8 : G); /* warm-up */
		for (int r = 0; r < reps; r++)
			v[r] = decode(&e, S, P, G);
		prof_print(&e, what, (double)S * G);
		report(what, v, reps);
	}
	for (int c = 0; c < n_c; c++) {
		char what[64];
		snprintf(what, sizeof(what), "prefill %d/%d", C[c], L);
		prefill(&e, C[c], C[c]); /* warm-up */
		for (int r = 0; r < reps; r++)
			v[r] = prefill(&e, L, C[c]);
		prof_print(&e, what, L);
		report(what, v, reps);
	}
	engine_stop(&e, th);
	gguf_free(&g);
	return 0;
}
