/* nx-eval.c - test driver for the forward pass: runs a batching plan and dumps logits, or completes greedily.
 *
 *   nx-eval MODEL.gguf [--threads N] [--ctx C] < PLAN > LOGITS
 *   nx-eval MODEL.gguf [--threads N] [--ctx C] --generate N --prompt-ids 1,2,3
 *
 * PLAN (text, one directive a line; blank lines and '#' comments ignored):
 *   seq SLOT TOK TOK ...          a sequence living in KV slot SLOT (one sequence per slot)
 *   step SLOT:START:COUNT ...     one forward step holding tokens START..START+COUNT-1 of the
 *                                 sequence in SLOT (several chunks per step, several steps)
 * Each sequence's tokens must be covered by the steps exactly once, in order.
 * Every token asks for logits.
 *
 * LOGITS (stdout, binary): for each sequence in `seq` order, for each of its
 * positions in order, n_vocab little-endian float32 — i.e. a C-order float32
 * array (total tokens, n_vocab) with no header (n_vocab is in the model).
 *
 * --generate: prefills the prompt in one step, then decodes N tokens greedily
 * (argmax, lowest id on ties) and prints their ids on one line, space-separated.
 *
 * --lora ADAPTER[:SCALE] (repeatable, at most NX_LORA_MIX_MAX): every token carries
 * these adapters as a runtime delta (nx_tok_in.lora), each at its scale (default 1).
 *
 * --activations precise|fast: nxd's option of that name (nx_state_cfg.act_one_part).
 *
 * --kv-type f16|q8_0: nxd's option of that name (nx_state_cfg.kv_type).
 *
 * The pass runs as N bands on N pthreads meeting at a pthread barrier. Matrices
 * are packed for the tile kernels as in the daemon (model/repack.h); NX_PACK=0
 * in the environment keeps the plain layout and kernels. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/err.h"
#include "kern/cpu.h"
#include "kern/pack.h"
#include "shm/futex.h"
#include "lora/adapter.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/repack.h"
#include "sample/sampler.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("nx-eval: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* ---------------------------------------------------------------- engine */

struct engine {
	struct nx_model m;
	struct nx_state s;
	struct nx_scratch *sc; /* one per band */
	void *state_mem, **scratch_mem;
	void *pack_mem; /* packed copies of the matrices (model/repack.h), or NULL */
	int n_threads;
	struct nx_barrier bar; /* the daemon's barrier and work taking, so tests run them */
	_Atomic uint32_t no_abort;
	struct nx_lora_mix mix;   /* --lora adapters (heap: lora_l, lora_mem) */
	struct nx_lora *lora_l[NX_LORA_MIX_MAX];
	void *lora_mem[NX_LORA_MIX_MAX];
};

/* --lora arguments; tok_lora is what every token's nx_tok_in.lora gets (0 or 1). */
static const char *lora_args[NX_LORA_MIX_MAX];
static int n_lora_args, tok_lora;
static bool act_one_part; /* --activations fast */
static enum nx_kv_type kv_type; /* --kv-type */

struct band_arg {
	struct engine *e;
	const struct nx_tok_in *toks;
	int n, band;
};

static void barrier_wait(void *ctx)
{
	struct engine *e = ctx;
	nx_barrier_wait(&e->bar, &e->no_abort, 1000);
}

static bool take_rows(void *ctx, uint32_t tag, uint32_t band, uint32_t units, uint32_t chunk, uint32_t *u0,
		      uint32_t *u1)
{
	struct engine *e = ctx;
	return nx_barrier_take(&e->bar, tag, band, units, chunk, u0, u1);
}

static void *band_main(void *p)
{
	struct band_arg *a = p;
	struct nx_sync sync = {.barrier = barrier_wait, .take = take_rows, .ctx = a->e};
	nx_forward(&a->e->m, &a->e->s, a->toks, a->n, a->band, a->e->n_threads, &a->e->sc[a->band], &sync);
	return NULL;
}

static void run_step(struct engine *e, const struct nx_tok_in *toks, int n)
{
	pthread_t th[e->n_threads];
	struct band_arg arg[e->n_threads];
	for (int b = 0; b < e->n_threads; b++) {
		arg[b] = (struct band_arg){e, toks, n, b};
		if (b > 0 && pthread_create(&th[b], NULL, band_main, &arg[b]))
			die("pthread_create failed");
	}
	band_main(&arg[0]);
	for (int b = 1; b < e->n_threads; b++)
		pthread_join(th[b], NULL);
}

static void *alloc64(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) / 64 * 64);
	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

static void engine_init(struct engine *e, const struct gguf_file *g, int n_threads, struct nx_state_cfg cfg)
{
	memset(e, 0, sizeof(*e)); /* no_abort among the rest: a barrier would leave its step on a stale word */
	struct nx_err err = {{0}};
	if (nx_model_bind(&e->m, g, &err))
		die("%s", err.msg);
	size_t pack_size = nx_model_repack_size(&e->m);
	e->pack_mem = NULL;
	if (pack_size && nx_env()->pack) {
		e->pack_mem = alloc64(pack_size);
		if (nx_model_repack(&e->m, e->pack_mem, pack_size, &err))
			die("%s", err.msg);
	}
	e->n_threads = n_threads;
	if (nx_kv_type_check(&e->m.hp, cfg.kv_type, &err))
		die("%s", err.msg);
	size_t ss = nx_state_size(&e->m.hp, &cfg), sz = nx_scratch_size(&e->m.hp, &cfg);
	if (!ss || !sz)
		die("bad state config (batch %d, slots %d, ctx %d)", cfg.max_batch, cfg.n_slots, cfg.n_ctx);
	e->state_mem = alloc64(ss);
	if (nx_state_init(&e->s, e->state_mem, ss, &e->m.hp, &cfg, &err))
		die("%s", err.msg);
	e->sc = calloc(n_threads, sizeof(*e->sc));
	e->scratch_mem = calloc(n_threads, sizeof(void *));
	if (!e->sc || !e->scratch_mem)
		die("out of memory");
	for (int b = 0; b < n_threads; b++) {
		e->scratch_mem[b] = alloc64(sz);
		if (nx_scratch_init(&e->sc[b], e->scratch_mem[b], sz, &e->m.hp, &cfg, &err))
			die("%s", err.msg);
	}
	nx_barrier_init(&e->bar, n_threads);
	memset(&e->mix, 0, sizeof(e->mix));
	for (int i = 0; i < n_lora_args; i++) {
		char path[4096];
		float scale = 1.0f;
		snprintf(path, sizeof(path), "%s", lora_args[i]);
		char *colon = strrchr(path, ':'), *end;
		if (colon) {
			scale = strtof(colon + 1, &end);
			if (end == colon + 1 || *end)
				die("--lora %s: bad scale '%s'", lora_args[i], colon + 1);
			*colon = '\0';
		}
		if (nx_lora_load(&e->lora_l[i], &e->lora_mem[i], path, &e->m, &err))
			die("--lora %s: %s", path, err.msg);
		e->mix.l[i] = e->lora_l[i];
		e->mix.scale[i] = scale;
		e->mix.n = i + 1;
	}
	if (n_lora_args) {
		e->s.lora = &e->mix;
		e->s.n_lora = 1;
	}
}

static void engine_free(struct engine *e)
{
	for (int b = 0; b < e->n_threads; b++)
		free(e->scratch_mem[b]);
	free(e->scratch_mem);
	free(e->sc);
	free(e->state_mem);
	free(e->pack_mem);
	for (int i = 0; i < e->mix.n; i++) {
		free(e->lora_l[i]);
		free(e->lora_mem[i]);
	}
}

/* ---------------------------------------------------------------- plan */

struct seq {
	int slot;
	int n;          /* tokens */
	int32_t *toks;
	int done;       /* tokens already stepped */
	size_t out_row; /* first row of this sequence in the output */
};

struct chunk {
	int seq, start, count;
};

struct step {
	int n_chunks;
	struct chunk *chunks;
	int n_tokens;
};

static long parse_long(const char *s, const char *what, int line)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end)
		die("plan line %d: bad %s '%s'", line, what, s);
	return v;
}

static int find_slot(struct seq *seqs, int n_seqs, int slot)
{
	for (int i = 0; i < n_seqs; i++)
		if (seqs[i].slot == slot)
			return i;
	return -1;
}

/* The group maxima the bands wrote beside the first n logits rows are the rows'
 * (the daemon's greedy and top-k sampling read them): every plan a test runs checks it. */
static void check_group_max(const struct nx_state *s, int n, float *gm)
{
	const size_t ng = ((size_t)s->n_vocab + NX_SAMPLE_GROUP - 1) / NX_SAMPLE_GROUP;
	for (int r = 0; r < n; r++) {
		nx_sample_group_max(s->logits + (size_t)r * s->n_vocab, s->n_vocab, gm);
		if (memcmp(gm, s->logit_gmax + r * ng, ng * sizeof(float)))
			die("logits row %d: the group maxima written by the bands are not the row's", r);
	}
}

static void run_plan(const struct gguf_file *g, int n_threads, int ctx)
{
	struct seq *seqs = NULL;
	struct step *steps = NULL;
	int n_seqs = 0, n_steps = 0, line_no = 0;
	char *line = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, stdin) > 0) {
		line_no++;
		char *save, *w = strtok_r(line, " \t\r\n", &save);
		if (!w || w[0] == '#')
			continue;
		if (strcmp(w, "seq") == 0) {
			char *ws = strtok_r(NULL, " \t\r\n", &save);
			if (!ws)
				die("plan line %d: seq without a slot", line_no);
			long slot = parse_long(ws, "slot", line_no);
			if (slot < 0 || slot > 4096 || find_slot(seqs, n_seqs, (int)slot) >= 0)
				die("plan line %d: slot %ld out of range or used twice", line_no, slot);
			seqs = realloc(seqs, (n_seqs + 1) * sizeof(*seqs));
			struct seq *sq = &seqs[n_seqs++];
			*sq = (struct seq){.slot = (int)slot};
			while ((w = strtok_r(NULL, " \t\r\n", &save))) {
				sq->toks = realloc(sq->toks, (sq->n + 1) * sizeof(int32_t));
				long t = parse_long(w, "token", line_no);
				if (t < 0 || t > INT32_MAX)
					die("plan line %d: token %ld out of range", line_no, t);
				sq->toks[sq->n++] = (int32_t)t;
			}
			if (sq->n == 0)
				die("plan line %d: empty sequence", line_no);
		} else if (strcmp(w, "step") == 0) {
			steps = realloc(steps, (n_steps + 1) * sizeof(*steps));
			struct step *st = &steps[n_steps++];
			*st = (struct step){0};
			while ((w = strtok_r(NULL, " \t\r\n", &save))) {
				long slot, start, count;
				char tail;
				if (sscanf(w, "%ld:%ld:%ld%c", &slot, &start, &count, &tail) != 3)
					die("plan line %d: bad chunk '%s' (want SLOT:START:COUNT)", line_no, w);
				int si = find_slot(seqs, n_seqs, (int)slot);
				if (si < 0)
					die("plan line %d: no sequence in slot %ld", line_no, slot);
				struct seq *sq = &seqs[si];
				if (start != sq->done || count < 1 || count > sq->n - sq->done)
					die("plan line %d: chunk %s: sequence in slot %ld is at %d of %d", line_no, w, slot,
					    sq->done, sq->n);
				sq->done += (int)count;
				st->chunks = realloc(st->chunks, (st->n_chunks + 1) * sizeof(*st->chunks));
				st->chunks[st->n_chunks++] = (struct chunk){si, (int)start, (int)count};
				st->n_tokens += (int)count;
			}
			if (st->n_tokens == 0)
				die("plan line %d: empty step", line_no);
		} else {
			die("plan line %d: unknown directive '%s'", line_no, w);
		}
	}
	free(line);

	int max_batch = 1, max_slot = 0, max_len = 1;
	size_t rows = 0;
	for (int i = 0; i < n_seqs; i++) {
		if (seqs[i].done != seqs[i].n)
			die("plan: sequence in slot %d has %d tokens but steps cover %d", seqs[i].slot, seqs[i].n,
			    seqs[i].done);
		seqs[i].out_row = rows;
		rows += seqs[i].n;
		if (seqs[i].slot > max_slot)
			max_slot = seqs[i].slot;
		if (seqs[i].n > max_len)
			max_len = seqs[i].n;
	}
	for (int i = 0; i < n_steps; i++)
		if (steps[i].n_tokens > max_batch)
			max_batch = steps[i].n_tokens;
	if (ctx == 0)
		ctx = max_len;
	if (ctx < max_len)
		die("--ctx %d is shorter than the longest sequence (%d)", ctx, max_len);

	struct engine e;
	engine_init(&e, g, n_threads,
		    (struct nx_state_cfg){.max_batch = max_batch, .max_logits = max_batch, .n_slots = max_slot + 1,
					  .n_ctx = ctx, .act_one_part = act_one_part, .kv_type = kv_type});
	const int n_vocab = e.m.hp.n_vocab;
	for (int i = 0; i < n_seqs; i++)
		for (int j = 0; j < seqs[i].n; j++)
			if (seqs[i].toks[j] >= n_vocab)
				die("plan: token %d >= n_vocab %d", seqs[i].toks[j], n_vocab);

	float *out = malloc(rows * n_vocab * sizeof(float));
	struct nx_tok_in *toks = malloc(max_batch * sizeof(*toks));
	float *gm = malloc((n_vocab / NX_SAMPLE_GROUP + 1) * sizeof(float));
	if (!out || !toks || !gm)
		die("out of memory");
	for (int i = 0; i < n_steps; i++) {
		int n = 0;
		for (int c = 0; c < steps[i].n_chunks; c++) {
			struct chunk *ch = &steps[i].chunks[c];
			struct seq *sq = &seqs[ch->seq];
			for (int p = ch->start; p < ch->start + ch->count; p++, n++)
				toks[n] = (struct nx_tok_in){sq->toks[p], p, sq->slot, n, tok_lora};
		}
		run_step(&e, toks, n);
		check_group_max(&e.s, n, gm);
		n = 0;
		for (int c = 0; c < steps[i].n_chunks; c++) {
			struct chunk *ch = &steps[i].chunks[c];
			struct seq *sq = &seqs[ch->seq];
			for (int p = ch->start; p < ch->start + ch->count; p++, n++)
				memcpy(out + (sq->out_row + p) * n_vocab, e.s.logits + (size_t)n * n_vocab,
				       n_vocab * sizeof(float));
		}
	}
	if (fwrite(out, sizeof(float) * n_vocab, rows, stdout) != rows || fflush(stdout))
		die("writing logits: %s", strerror(errno));
	engine_free(&e);
	free(out);
	free(toks);
	free(gm);
	for (int i = 0; i < n_seqs; i++)
		free(seqs[i].toks);
	for (int i = 0; i < n_steps; i++)
		free(steps[i].chunks);
	free(seqs);
	free(steps);
}

/* ---------------------------------------------------------------- generate */

static int argmax(const float *x, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

static void generate(const struct gguf_file *g, int n_threads, int ctx, int n_gen, const char *ids)
{
	int32_t *prompt = NULL;
	int n_prompt = 0;
	char *dup = strdup(ids), *save;
	for (char *w = strtok_r(dup, ", \t\n", &save); w; w = strtok_r(NULL, ", \t\n", &save)) {
		prompt = realloc(prompt, (n_prompt + 1) * sizeof(int32_t));
		long t = parse_long(w, "prompt id", 0);
		if (t < 0 || t > INT32_MAX)
			die("prompt id %ld out of range", t);
		prompt[n_prompt++] = (int32_t)t;
	}
	free(dup);
	if (n_prompt == 0)
		die("--prompt-ids is empty");
	if (ctx == 0)
		ctx = n_prompt + n_gen;
	if (ctx < n_prompt + n_gen)
		die("--ctx %d is shorter than prompt + generated (%d)", ctx, n_prompt + n_gen);

	struct engine e;
	engine_init(&e, g, n_threads,
		    (struct nx_state_cfg){.max_batch = n_prompt, .max_logits = 1, .n_slots = 1, .n_ctx = ctx,
					  .act_one_part = act_one_part, .kv_type = kv_type});
	const int n_vocab = e.m.hp.n_vocab;
	struct nx_tok_in *toks = malloc(n_prompt * sizeof(*toks));
	for (int i = 0; i < n_prompt; i++) {
		if (prompt[i] >= n_vocab)
			die("prompt id %d >= n_vocab %d", prompt[i], n_vocab);
		toks[i] = (struct nx_tok_in){prompt[i], i, 0, i == n_prompt - 1 ? 0 : -1, tok_lora};
	}
	run_step(&e, toks, n_prompt);
	for (int i = 0; i < n_gen; i++) {
		int next = argmax(e.s.logits, n_vocab);
		printf("%s%d", i ? " " : "", next);
		if (i + 1 == n_gen)
			break;
		struct nx_tok_in t = {next, n_prompt + i, 0, 0, tok_lora};
		run_step(&e, &t, 1);
	}
	printf("\n");
	engine_free(&e);
	free(toks);
	free(prompt);
}

#define USAGE                                                                                              \
	"usage: nx-eval MODEL.gguf [--threads N] [--ctx C] [--lora ADAPTER[:SCALE]]... [--activations precise|fast] " \
	"[--kv-type f16|q8_0] " \
	"[--generate N --prompt-ids 1,2,3] < plan"

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
	const char *path = NULL, *ids = NULL;
	int n_threads = 1, ctx = 0, n_gen = -1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_val = i + 1 < argc;
		if (strcmp(a, "--threads") == 0 && has_val)
			n_threads = (int)parse_long(argv[++i], "--threads", 0);
		else if (strcmp(a, "--ctx") == 0 && has_val)
			ctx = (int)parse_long(argv[++i], "--ctx", 0);
		else if (strcmp(a, "--generate") == 0 && has_val)
			n_gen = (int)parse_long(argv[++i], "--generate", 0);
		else if (strcmp(a, "--prompt-ids") == 0 && has_val)
			ids = argv[++i];
		else if (strcmp(a, "--lora") == 0 && has_val) {
			if (n_lora_args == NX_LORA_MIX_MAX)
				die("at most %d --lora adapters", NX_LORA_MIX_MAX);
			lora_args[n_lora_args++] = argv[++i];
			tok_lora = 1;
		}
		else if (strcmp(a, "--activations") == 0 && has_val) {
			if (!nx_act_mode_parse(argv[++i], &act_one_part))
				die("--activations: '%s' is neither precise nor fast", argv[i]);
		}
		else if (strcmp(a, "--kv-type") == 0 && has_val) {
			if (!nx_kv_type_parse(argv[++i], &kv_type))
				die("--kv-type: '%s' is neither f16 nor q8_0", argv[i]);
		}
		else if (a[0] != '-' && !path)
			path = a;
		else
			die(USAGE);
	}
	if (!path)
		die(USAGE);
	if (n_threads < 1 || n_threads > 256)
		die("--threads %d out of range 1..256", n_threads);
	if (ctx < 0 || ctx > 1 << 20)
		die("--ctx %d out of range", ctx);

	struct gguf_mapped gm;
	struct nx_err err = {{0}};
	if (nx_kern_env_check(&err) < 0)
		fprintf(stderr, "nx-eval: warning: %s\n", err.msg);
	nx_cpu_amx_request(); /* before the kernels are chosen (kern/cpu.h) */
	if (nx_pack_kernel_amx(NX_Q8_0) && nx_pack_amx_check(&err) < 0)
		fprintf(stderr, "nx-eval: %s\n", err.msg);
	if (gguf_open(&gm, path, &err))
		die("%s", err.msg);
	if (n_gen >= 0) {
		if (!ids || n_gen < 1)
			die("--generate needs N >= 1 and --prompt-ids");
		generate(&gm.g, n_threads, ctx, n_gen, ids);
	} else {
		run_plan(&gm.g, n_threads, ctx);
	}
	gguf_close(&gm);
	return 0;
}
