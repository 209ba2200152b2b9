/* nx-lora.c - LoRA adapters from the command line: inspect, grade fold vs runtime delta, write a merged GGUF.
 *
 *   nx-lora info   MODEL ADAPTER
 *       the adapter's rank, alpha, and per adapted matrix its shape, scale and
 *       an FNV-1a hash of A and B as f32 (equal hashes: equal adapters, e.g.
 *       the same adapter in PEFT and GGUF form)
 *   nx-lora report MODEL ADAPTER [--scale S] [--type keep|T[,T...]] [--probes N]
 *                  [--layers L[,L-M...]] [--seed N] [--prompt-ids 1,2,3] [--json]
 *       grades, per adapted matrix and in total, the fold to each type (default
 *       keep,f16) and the runtime delta against the exact float64 result on
 *       probe activations (lora/report.h says how); --json: one JSON object per
 *       tensor and a final {"total": ...} line instead of the table;
 *       --prompt-ids: the probes are the real hidden states of these tokens run
 *       through the model (every matmul's own input, lora/probe.h) instead of
 *       synthetic ones
 *   nx-lora fold   MODEL ADAPTER --out OUT.gguf [--type keep|T] [--scale S]
 *       writes MODEL with every adapted matrix folded (the daemon folds in
 *       memory instead; this is for users who want a merged file). Tensors the
 *       adapter does not touch are copied byte for byte; MODEL is only read.
 *
 * ADAPTER: a PEFT directory (adapter_model.safetensors + adapter_config.json),
 * that .safetensors file, or a GGUF LoRA. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "lora/adapter.h"
#include "lora/fold.h"
#include "lora/probe.h"
#include "lora/report.h"
#include "model/gguf.h"
#include "model/model.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("nx-lora: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static void usage(void)
{
	fputs("usage: nx-lora info MODEL ADAPTER\n"
	      "       nx-lora report MODEL ADAPTER [--scale S] [--type keep|T[,T...]] [--probes N] [--layers L[,L-M]] [--seed N]\n"
	      "                      [--prompt-ids 1,2,3] [--json]\n"
	      "       nx-lora fold MODEL ADAPTER --out OUT.gguf [--type keep|T] [--scale S]\n",
	      stderr);
	exit(2);
}

struct opts {
	float scale;
	const char *types;
	int probes;
	const char *layers;
	uint64_t seed;
	bool json;
	const char *out;
	const char *ids;  /* --prompt-ids: real hidden states as probes */
};

static double num(const char *s, const char *what)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end)
		die("%s: '%s' is not a number", what, s);
	return v;
}

/* --layers "0,3-5": marks layers in sel[]; NULL selects all. */
static void parse_layers(const char *s, bool *sel, int n_layer)
{
	for (int i = 0; i < n_layer; i++)
		sel[i] = s == NULL;
	if (!s)
		return;
	char *dup = strdup(s), *save = NULL;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *dash = strchr(tok, '-');
		int a, b;
		if (dash) {
			*dash = 0;
			a = (int)num(tok, "--layers");
			b = (int)num(dash + 1, "--layers");
		} else {
			a = b = (int)num(tok, "--layers");
		}
		if (a < 0 || b >= n_layer || a > b)
			die("--layers: %d-%d is out of range (the model has layers 0..%d)", a, b, n_layer - 1);
		for (int i = a; i <= b; i++)
			sel[i] = true;
	}
	free(dup);
}

/* "keep" -> the base type (marked by -1 here), else a type name. */
static int parse_types(const char *s, int *types, int max)
{
	char *dup = strdup(s), *save = NULL;
	int n = 0;
	struct nx_err err;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == max)
			die("--type: at most %d types", max);
		enum nx_type t;
		if (!strcmp(tok, "keep"))
			types[n++] = -1;
		else if (nx_fold_type_parse(tok, &t, &err))
			die("--type: %s", err.msg);
		else
			types[n++] = (int)t;
	}
	free(dup);
	if (n == 0)
		die("--type: no type given");
	return n;
}

/* FNV-1a of n values held as d, over their bytes as f32 (the same for an adapter held in any dtype). */
static uint64_t fnv1a(enum nx_lora_dtype d, const void *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		const float v = nx_lora_elt(d, p, i);
		uint8_t b[sizeof(float)];
		memcpy(b, &v, sizeof(v));
		for (size_t k = 0; k < sizeof(b); k++)
			h = (h ^ b[k]) * 0x100000001b3ull;
	}
	return h;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---------------------------------------------------------------- info */

static void cmd_info(const struct nx_model *m, const struct nx_lora *l)
{
	printf("adapter %s rank %d alpha %g rslora %d tensors %d\n", l->name, l->rank, l->alpha, l->rslora, l->n);
	for (int il = 0; il < m->hp.n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct nx_lora_t *t = nx_lora_get(l, il, (enum nx_lora_which)w);
			if (!t)
				continue;
			printf("blk.%d.%s.weight rank %d n_in %lld n_out %lld scale %.9g a %016llx b %016llx\n", il,
			       nx_lora_which_gguf(t->which), t->rank, (long long)t->n_in, (long long)t->n_out, t->scale,
			       (unsigned long long)fnv1a(t->dtype, t->a, (size_t)t->rank * t->n_in),
			       (unsigned long long)fnv1a(t->dtype, t->b, (size_t)t->rank * t->n_out));
		}
}

/* ---------------------------------------------------------------- report */

static void err_json(json_t *o, const char *key, const struct nx_grade_err *e)
{
	json_object_set_new(o, key, json_pack("{s:f,s:f}", "rel_rms", nx_grade_rel(e), "max_abs", e->max_abs));
}

static void cmd_report(const struct nx_model *m, const struct nx_lora *l, const struct opts *o)
{
	int types[NX_GRADE_MAX_TYPES];
	int n_types = parse_types(o->types ? o->types : "keep,f16", types, NX_GRADE_MAX_TYPES);
	bool sel[NX_MAX_LAYERS];
	parse_layers(o->layers, sel, m->hp.n_layer);
	if (o->probes < 1 || o->probes > 4096)
		die("--probes: %d is out of range 1..4096", o->probes);
	/* --prompt-ids: one forward pass over them captures every matmul's input. */
	struct nx_lora_probe_run pr = {0};
	if (o->ids) {
		int32_t ids[NX_LORA_PROBE_MAX];
		int n = 0;
		char *copy = strdup(o->ids), *save = NULL;
		for (char *t = strtok_r(copy, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
			if (n == NX_LORA_PROBE_MAX)
				die("--prompt-ids: at most %d tokens", NX_LORA_PROBE_MAX);
			ids[n++] = (int32_t)num(t, "--prompt-ids");
		}
		free(copy);
		struct nx_err err;
		if (nx_lora_probe_run(m, NULL, 1.0f, ids, n, 0, &pr, &err))
			die("--prompt-ids: %s", err.msg);
	}
	const int n_probe = pr.cap ? pr.n : o->probes;

	if (!o->json) {
		printf("# adapter %s: rank %d, alpha %g%s, user scale %g; %d probes per tensor\n", l->name, l->rank,
		       l->alpha, l->rslora ? " (rslora)" : "", o->scale, n_probe);
		if (pr.cap)
			printf("# probes are the real hidden states of the --prompt-ids tokens (each matrix's own input).\n");
		else
			printf("# probes are synthetic (token embeddings through each layer's own norms and weights); real\n"
			       "# hidden states: --prompt-ids.\n");
		printf("# Errors: relative RMS / max abs vs the exact float64 (dequant(W) + s*B@A) @ x. noise: the base\n"
		       "# type's own quantization error estimated by re-quantizing a row-permuted dequant(W)\n"
		       "# (lora/report.h). effect: |s*B@A@x| / |y|.\n");
		printf("%-26s %-5s %4s %8s", "tensor", "type", "rank", "effect");
		for (int i = 0; i < n_types; i++) {
			char h[40];
			snprintf(h, sizeof(h), "fold %s", types[i] < 0 ? "keep" : nx_type_name((uint32_t)types[i]));
			printf("  %-17s", h);
		}
		printf("  %-17s  %-8s %8s\n", "delta (f32)", "noise", "fold ms");
		printf("%-26s %-5s %4s %8s", "", "", "", "rel rms");
		for (int i = 0; i <= n_types; i++)
			printf("  %-8s %-8s", "rel rms", "max abs");
		printf("  %s\n", "rel rms");
	}
	struct nx_grade_err tot_fold[NX_GRADE_MAX_TYPES] = {{0}}, tot_delta = {0}, tot_noise = {0}, tot_eff = {0};
	double tot_ms = 0;
	int n_graded = 0;
	for (int il = 0; il < m->hp.n_layer; il++) {
		if (!sel[il])
			continue;
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct nx_lora_t *t = nx_lora_get(l, il, (enum nx_lora_which)w);
			if (!t)
				continue;
			const struct nx_wt *base = nx_lora_base(m, il, (enum nx_lora_which)w);
			enum nx_type tt[NX_GRADE_MAX_TYPES];
			for (int i = 0; i < n_types; i++)
				tt[i] = types[i] < 0 ? base->type : (enum nx_type)types[i];
			float *x = pr.cap ? NULL : malloc(sizeof(float) * (size_t)o->probes * base->n_in);
			struct nx_err err;
			struct nx_lora_grade g;
			if (!pr.cap && !x)
				die("out of memory");
			if ((!pr.cap && nx_lora_probe(m, il, (enum nx_lora_which)w, o->probes, o->seed, x, &err)) ||
			    nx_lora_grade_tensor(base, t, o->scale * t->scale,
						 pr.cap ? nx_lora_capture_rows(&m->hp, pr.cap, pr.n, il, (enum nx_lora_which)w) : x,
						 n_probe, tt, n_types, &g, &err))
				die("blk.%d.%s.weight: %s", il, nx_lora_which_gguf(t->which), err.msg);
			free(x);
			char name[64];
			snprintf(name, sizeof(name), "blk.%d.%s.weight", il, nx_lora_which_gguf(t->which));
			if (o->json) {
				json_t *j = json_pack("{s:s,s:s,s:i,s:f,s:f}", "tensor", name, "type",
						      nx_type_name(base->type), "rank", t->rank, "effect",
						      nx_grade_rel(&g.effect), "fold_ms", g.fold_ms);
				json_t *folds = json_array();
				for (int i = 0; i < n_types; i++) {
					json_t *f = json_pack("{s:s,s:f,s:f}", "type", nx_type_name(tt[i]), "rel_rms",
							      nx_grade_rel(&g.fold[i]), "max_abs", g.fold[i].max_abs);
					json_array_append_new(folds, f);
				}
				json_object_set_new(j, "fold", folds);
				err_json(j, "delta", &g.delta);
				err_json(j, "noise", &g.noise);
				char *s = json_dumps(j, JSON_COMPACT);
				puts(s);
				free(s);
				json_decref(j);
			} else {
				printf("%-26s %-5s %4d %8.2e", name, nx_type_name(base->type), t->rank, nx_grade_rel(&g.effect));
				for (int i = 0; i < n_types; i++)
					printf("  %8.2e %8.2e", nx_grade_rel(&g.fold[i]), g.fold[i].max_abs);
				printf("  %8.2e %8.2e  %8.2e %8.2f\n", nx_grade_rel(&g.delta), g.delta.max_abs,
				       nx_grade_rel(&g.noise), g.fold_ms);
			}
			for (int i = 0; i < n_types; i++)
				nx_grade_add(&tot_fold[i], &g.fold[i]);
			nx_grade_add(&tot_delta, &g.delta);
			nx_grade_add(&tot_noise, &g.noise);
			nx_grade_add(&tot_eff, &g.effect);
			tot_ms += g.fold_ms;
			n_graded++;
			fflush(stdout);
		}
	}
	free(pr.cap);
	if (n_graded == 0)
		die("no adapted tensor in the selected layers");
	if (o->json) {
		json_t *j = json_pack("{s:i,s:f,s:f}", "tensors", n_graded, "effect", nx_grade_rel(&tot_eff), "fold_ms",
				      tot_ms);
		json_t *folds = json_array();
		for (int i = 0; i < n_types; i++) {
			json_t *f = json_pack("{s:s,s:f,s:f}", "type", types[i] < 0 ? "keep" : nx_type_name((uint32_t)types[i]),
					      "rel_rms", nx_grade_rel(&tot_fold[i]), "max_abs", tot_fold[i].max_abs);
			json_array_append_new(folds, f);
		}
		json_object_set_new(j, "fold", folds);
		err_json(j, "delta", &tot_delta);
		err_json(j, "noise", &tot_noise);
		json_t *top = json_pack("{s:o}", "total", j);
		char *s = json_dumps(top, JSON_COMPACT);
		puts(s);
		free(s);
		json_decref(top);
	} else {
		char name[40];
		snprintf(name, sizeof(name), "total (%d tensors)", n_graded);
		printf("%-26s %-5s %4s %8.2e", name, "", "", nx_grade_rel(&tot_eff));
		for (int i = 0; i < n_types; i++)
			printf("  %8.2e %8.2e", nx_grade_rel(&tot_fold[i]), tot_fold[i].max_abs);
		printf("  %8.2e %8.2e  %8.2e %8.2f\n", nx_grade_rel(&tot_delta), tot_delta.max_abs,
		       nx_grade_rel(&tot_noise), tot_ms);
		for (int i = 0; i < n_types; i++)
			if (nx_grade_rel(&tot_fold[i]) > 0.5 * nx_grade_rel(&tot_eff))
				printf("# fold %s: its error is %.0f%% of the adapter's effect - that fold loses much of the adapter;\n"
				       "#   a wider type (f16, q8_0) or the runtime delta keeps it\n",
				       types[i] < 0 ? "keep" : nx_type_name((uint32_t)types[i]),
				       100 * nx_grade_rel(&tot_fold[i]) / nx_grade_rel(&tot_eff));
	}
}

/* ---------------------------------------------------------------- fold */

static void put(FILE *f, const void *p, size_t n, const char *out)
{
	if (n && fwrite(p, 1, n, f) != n)
		die("writing '%s': %s", out, strerror(errno));
}

static void put_u32(FILE *f, uint32_t v, const char *out) { put(f, &v, 4, out); }
static void put_u64(FILE *f, uint64_t v, const char *out) { put(f, &v, 8, out); }

static void pad(FILE *f, uint64_t *pos, uint64_t align, const char *out)
{
	static const uint8_t zero[64];
	while (*pos % align) {
		uint64_t n = align - *pos % align;
		if (n > sizeof(zero))
			n = sizeof(zero);
		put(f, zero, n, out);
		*pos += n;
	}
}

/* Which (layer, matrix) a model tensor name is, if it is one an adapter may change. */
static bool adaptable(const struct gguf_tensor *t, int *layer, enum nx_lora_which *which)
{
	char nm[128];
	if (t->name.len >= sizeof(nm))
		return false;
	memcpy(nm, t->name.p, t->name.len);
	nm[t->name.len] = 0;
	for (int w = 0; w < NX_LORA_N_WHICH; w++) {
		char want[64];
		int il, end = 0;
		snprintf(want, sizeof(want), "blk.%%d.%s.weight%%n", nx_lora_which_gguf((enum nx_lora_which)w));
		if (sscanf(nm, want, &il, &end) == 1 && end == (int)strlen(nm)) {
			*layer = il;
			*which = (enum nx_lora_which)w;
			return true;
		}
	}
	return false;
}

static void cmd_fold(const struct gguf_file *g, const struct nx_model *m, const struct nx_lora *l, const struct opts *o)
{
	if (!o->out)
		die("fold: --out OUT.gguf is required");
	int types[1];
	parse_types(o->types ? o->types : "keep", types, 1);
	if (g->n_tensors == 0)
		die("fold: the model has no tensors");

	struct out_t {
		enum nx_type type;
		const void *data;
		uint64_t size, offset;
		void *owned;
	} *ot = calloc(g->n_tensors, sizeof(*ot));
	if (!ot)
		die("out of memory");
	uint64_t off = 0;
	double total_ms = 0;
	int n_folded = 0;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->tensors[i];
		int il;
		enum nx_lora_which w;
		const struct nx_lora_t *lt = NULL;
		ot[i].type = t->type;
		ot[i].data = t->data;
		ot[i].size = t->size;
		if (adaptable(t, &il, &w) && (lt = nx_lora_get(l, il, w))) {
			const struct nx_wt *base = nx_lora_base(m, il, w);
			enum nx_type to = types[0] < 0 ? base->type : (enum nx_type)types[0];
			struct nx_err err;
			if (nx_fold_check(base, lt, to, &err))
				die("%s", err.msg);
			int64_t size = nx_fold_size(base, to);
			void *buf = size > 0 ? malloc((size_t)size) : NULL;
			if (!buf)
				die("fold: out of memory for blk.%d.%s.weight as %s", il, nx_lora_which_gguf(w), nx_type_name(to));
			double t0 = now_ms();
			if (nx_fold_tensor(base, lt, o->scale * lt->scale, to, buf, &err))
				die("%s", err.msg);
			total_ms += now_ms() - t0;
			ot[i].type = to;
			ot[i].data = ot[i].owned = buf;
			ot[i].size = (uint64_t)size;
			n_folded++;
		}
		ot[i].offset = off;
		off += (ot[i].size + g->alignment - 1) / g->alignment * g->alignment;
	}
	if (n_folded != l->n)
		die("fold: folded %d tensors, the adapter has %d", n_folded, l->n);

	FILE *f = fopen(o->out, "wb");
	if (!f)
		die("cannot create '%s': %s", o->out, strerror(errno));
	/* Header; metadata copied verbatim (it sits between the header and the first tensor info). */
	const uint8_t *kv_begin = g->base + 24;
	const uint8_t *kv_end = (const uint8_t *)g->tensors[0].name.p - 8;
	put(f, "GGUF", 4, o->out);
	put_u32(f, g->version, o->out);
	put_u64(f, g->n_tensors, o->out);
	put_u64(f, g->n_kv, o->out);
	put(f, kv_begin, (size_t)(kv_end - kv_begin), o->out);
	uint64_t pos = (uint64_t)(kv_end - g->base);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->tensors[i];
		put_u64(f, t->name.len, o->out);
		put(f, t->name.p, t->name.len, o->out);
		put_u32(f, t->n_dims, o->out);
		for (uint32_t d = 0; d < t->n_dims; d++)
			put_u64(f, (uint64_t)t->ne[d], o->out);
		put_u32(f, (uint32_t)ot[i].type, o->out);
		put_u64(f, ot[i].offset, o->out);
		pos += 8 + t->name.len + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
	}
	pad(f, &pos, g->alignment, o->out);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		put(f, ot[i].data, ot[i].size, o->out);
		pos += ot[i].size;
		if (i + 1 < g->n_tensors)
			pad(f, &pos, g->alignment, o->out);
		free(ot[i].owned);
	}
	if (fclose(f))
		die("writing '%s': %s", o->out, strerror(errno));
	free(ot);
	fprintf(stderr, "nx-lora: folded %d tensors (%s) in %.1f ms into %s\n", n_folded,
		types[0] < 0 ? "keep types" : nx_type_name((uint32_t)types[0]), total_ms, o->out);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
	if (argc < 4)
		usage();
	const char *cmd = argv[1], *model_path = argv[2], *adapter_path = argv[3];
	struct opts o = {.scale = 1.0f, .probes = 16, .seed = 1};
	for (int i = 4; i < argc; i++) {
		const char *a = argv[i];
		bool more = i + 1 < argc;
		if (!strcmp(a, "--json"))
			o.json = true;
		else if (!strcmp(a, "--scale") && more)
			o.scale = (float)num(argv[++i], "--scale");
		else if (!strcmp(a, "--type") && more)
			o.types = argv[++i];
		else if (!strcmp(a, "--probes") && more)
			o.probes = (int)num(argv[++i], "--probes");
		else if (!strcmp(a, "--layers") && more)
			o.layers = argv[++i];
		else if (!strcmp(a, "--seed") && more)
			o.seed = (uint64_t)num(argv[++i], "--seed");
		else if (!strcmp(a, "--out") && more)
			o.out = argv[++i];
		else if (!strcmp(a, "--prompt-ids") && more)
			o.ids = argv[++i];
		else
			usage();
	}
	if (!(o.scale == o.scale) || o.scale > 1e6f || o.scale < -1e6f)
		die("--scale: out of range");

	struct nx_err err;
	struct gguf_mapped gm;
	static struct nx_model m; /* large: keep it off the stack */
	if (gguf_open(&gm, model_path, &err) || nx_model_bind(&m, &gm.g, &err))
		die("%s", err.msg);
	struct nx_lora *l;
	void *mem;
	if (nx_lora_load(&l, &mem, adapter_path, &m, &err))
		die("%s", err.msg);

	if (!strcmp(cmd, "info"))
		cmd_info(&m, l);
	else if (!strcmp(cmd, "report"))
		cmd_report(&m, l, &o);
	else if (!strcmp(cmd, "fold"))
		cmd_fold(&gm.g, &m, l, &o);
	else
		usage();
	free(l);
	free(mem);
	gguf_close(&gm);
	return 0;
}
