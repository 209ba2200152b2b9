/* cmd_lora.c - the adapter commands: lora-load, lora-list, lora-unload, lora-fold, lora-unfold, lora-report. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/nxctl.h"
#include "proto/proto.h"

const char nxc_usage_lora_load[] =
	"usage: nxctl lora-load NAME PATH [--scale S]\n\n"
	"Loads a LoRA adapter into the daemon under NAME (A-Z a-z 0-9 . _ -), validated\n"
	"against the model. PATH: a GGUF LoRA (llama.cpp's convert_lora_to_gguf.py), a PEFT\n"
	"directory (adapter_model.safetensors + adapter_config.json) or that .safetensors;\n"
	"a relative PATH is taken from the current directory.\n\n"
	"  --scale S   the adapter's default scale (requests and folds may give their own; 1)\n";

const char nxc_usage_lora_list[] =
	"usage: nxctl lora-list [--json] [--checksum]\n\n"
	"Lists the loaded adapters: name, rank, alpha, adapted matrices, memory, whether\n"
	"it is folded into the model (order, type), requests using it, and its path.\n\n"
	"  --json       print the raw lora_list event\n"
	"  --checksum   also print a checksum of the weights the model uses now\n";

const char nxc_usage_lora_unload[] =
	"usage: nxctl lora-unload NAME\n\n"
	"Unloads an adapter. Refused while it is folded (lora-unfold first) or while\n"
	"requests use it.\n";

const char nxc_usage_lora_fold[] =
	"usage: nxctl lora-fold NAME [--scale S] [--type auto|keep|f16|q8_0|...] [--dry-run [--prompt TEXT]\n"
	"                        [--layers L,..]] [--json]\n\n"
	"Folds the adapter into the served model: every adapted matrix becomes\n"
	"quant(dequant(W) + scale * alpha/r * B@A), for every client, with no per-token\n"
	"cost. The base is kept: lora-unfold restores it bit for bit. Folds stack: only\n"
	"the latest one can be unfolded. Progress is shown while it runs.\n\n"
	"Requantized to a 4-bit base's own type, a fold can lose most of an adapter.\n"
	"So, without --type, nxctl first grades the fold to keep and to q8_0 on a probe\n"
	"prompt (as lora-report does) and folds to the first whose error is at most a\n"
	"quarter of the adapter's effect, else to f16, saying which and why.\n\n"
	"  --scale S      default: the adapter's load scale\n"
	"  --type T       auto (the default, above), keep (each matrix's own type), or a\n"
	"                 weight type (f16, q8_0...): folds at once, without grading\n"
	"  --dry-run      change nothing: print the accuracy report of this fold instead\n"
	"  --prompt TEXT  with --dry-run: the probe prompt whose hidden states are graded\n"
	"  --layers L,..  with --dry-run: only these layers (e.g. 0,3-5)\n"
	"  --json         print the final event as JSON\n";

const char nxc_usage_lora_unfold[] =
	"usage: nxctl lora-unfold NAME\n\n"
	"Puts the model back as it was before NAME's fold (bit for bit). Only the latest\n"
	"fold can be undone.\n";

const char nxc_usage_lora_report[] =
	"usage: nxctl lora-report NAME [--scale S] [--types keep,f16,...] [--prompt TEXT] [--layers L,..] [--json]\n\n"
	"Grades the fold (to each type) and the runtime delta against the exact float64\n"
	"result, on the real hidden states of a probe prompt (each adapted matrix's own\n"
	"input): relative RMS and max abs error, the adapter's effect, the base type's\n"
	"own quantization noise; fold time and the runtime delta's measured cost per token.\n\n"
	"  --types T,..   fold types to grade (default keep,f16)\n"
	"  --prompt TEXT  probe prompt (default: a built-in paragraph)\n"
	"  --layers L,..  only these layers (e.g. 0,3-5)\n"
	"  --json         print the lora_report event\n";

/* Relative paths are the caller's: the daemon's working directory is not. */
static json_t *abs_path(const char *p)
{
	char buf[PATH_MAX];
	if (realpath(p, buf))
		return json_string(buf);
	if (p[0] != '/' && getcwd(buf, sizeof(buf))) {
		size_t n = strlen(buf);
		snprintf(buf + n, sizeof(buf) - n, "/%s", p);
		return json_string(buf);
	}
	return json_string(p);
}

/* "0,3-5" -> [0,3,4,5]; NULL on a bad list. */
static json_t *layer_list(const char *cmd, const char *s)
{
	json_t *a = json_array();
	char *copy = strdup(s), *save = NULL;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		long long lo, hi;
		char *dash = strchr(t, '-');
		if (dash)
			*dash = '\0';
		if (nxc_parse_int(cmd, "--layers", t, 0, 1023, &lo) ||
		    nxc_parse_int(cmd, "--layers", dash ? dash + 1 : t, lo, 1023, &hi)) {
			free(copy);
			json_decref(a);
			return NULL;
		}
		for (long long i = lo; i <= hi; i++)
			json_array_append_new(a, json_integer(i));
	}
	free(copy);
	return a;
}

/* Sends req (stolen) and waits for its final event, showing progress events
 * on stderr. Returns the final event (caller decrefs) or NULL with *rc set. */
static json_t *run_op(struct nxc_ctx *ctx, json_t *req, const char *what, int *rc)
{
	struct nxc_conn c;
	*rc = nxc_open(ctx, &c, NULL);
	if (*rc) {
		json_decref(req);
		return NULL;
	}
	int id = c.next_id++;
	json_object_set_new(req, "id", json_integer(id));
	*rc = NXC_EXIT_ERROR;
	bool tty = isatty(2), shown = false;
	json_t *out = NULL;
	if (nxc_send(&c, req))
		goto done;
	for (;;) {
		json_t *ev;
		const char *raw;
		int k = nxc_next_event(&c, &ev, &raw);
		if (k == -2) {
			if (nxc_interrupts) {
				/* The daemon finishes the job anyway: it is not tied to this connection. */
				nxc_msg("interrupted; the daemon goes on with the %s", what);
				*rc = NXC_EXIT_INTR;
				break;
			}
			continue;
		}
		if (k == 0)
			nxc_msg("%s closed the connection before answering", c.path);
		if (k <= 0)
			break;
		if (!nxc_ev_is(ev, id) && !json_is_null(json_object_get(ev, "id"))) {
			json_decref(ev);
			continue;
		}
		const char *name = nxc_ev_name(ev);
		if (!strcmp(name, "progress")) {
			long long dn = json_integer_value(json_object_get(ev, "done"));
			long long tot = json_integer_value(json_object_get(ev, "total"));
			fprintf(stderr, "%s%s: %lld of %lld (%.0f%%)%s", tty ? "\r" : "", what, dn, tot,
				tot > 0 ? 100.0 * (double)dn / (double)tot : 0.0, tty ? "" : "\n");
			fflush(stderr);
			shown = true;
			json_decref(ev);
			continue;
		}
		if (shown && tty)
			fputc('\n', stderr);
		shown = false;
		if (!strcmp(name, "error")) {
			nxc_print_error(ev);
			json_decref(ev);
			break;
		}
		*rc = NXC_EXIT_OK;
		out = ev;
		break;
	}
done:
	if (shown && tty)
		fputc('\n', stderr);
	nxc_close(&c);
	return out;
}

static void print_json(json_t *ev)
{
	char *s = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
	nxc_print_json(s ? s : "{}", s ? strlen(s) : 2);
	free(s);
}

static const char *sget(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "?";
}

static double nget(json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static long long iget(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

static bool help_asked(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return true;
	return false;
}

int nxc_cmd_lora_load(struct nxc_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {{"scale", required_argument, NULL, 's'}, {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	double scale = 1;
	bool has_scale = false;
	optind = 0;
	opterr = 0;
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 'h')
			return nxc_help(nxc_usage_lora_load);
		if (o != 's')
			return nxc_usage_err("lora-load", "unknown option '%s'", argv[optind - 1]);
		if (nxc_parse_double("lora-load", "--scale", optarg, &scale))
			return NXC_EXIT_USAGE;
		has_scale = true;
	}
	if (argc - optind != 2)
		return nxc_usage_err("lora-load", "wants NAME and PATH, got %d arguments", argc - optind);
	json_t *req = json_pack("{s:s,s:s,s:o}", "op", "lora_load", "name", argv[optind], "path",
				abs_path(argv[optind + 1]));
	if (has_scale)
		json_object_set_new(req, "scale", json_real(scale));
	int rc;
	json_t *ev = run_op(ctx, req, "lora-load", &rc);
	if (!ev)
		return rc;
	json_t *a = json_object_get(ev, "adapter");
	nxc_printf("loaded %s: rank %lld, alpha %g, %lld matrices, %.1f MiB\n", sget(a, "name"), iget(a, "rank"),
	       nget(a, "alpha"), iget(a, "tensors"), nget(a, "bytes") / 1048576);
	json_decref(ev);
	return NXC_EXIT_OK;
}

int nxc_cmd_lora_list(struct nxc_ctx *ctx, int argc, char **argv)
{
	bool as_json = false, checksum = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			as_json = true;
		else if (!strcmp(argv[i], "--checksum"))
			checksum = true;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return nxc_help(nxc_usage_lora_list);
		else
			return nxc_usage_err("lora-list", "unexpected argument '%s'", argv[i]);
	}
	int rc;
	json_t *ev = run_op(ctx, json_pack("{s:s,s:b}", "op", "lora_list", "checksum", checksum), "lora-list", &rc);
	if (!ev)
		return rc;
	if (as_json) {
		print_json(ev);
		json_decref(ev);
		return NXC_EXIT_OK;
	}
	json_t *list = json_object_get(ev, "adapters");
	if (json_array_size(list) == 0)
		nxc_printf("no adapters loaded\n");
	else
		nxc_printf("%-20s %5s %7s %7s %9s %-14s %6s  %s\n", "NAME", "RANK", "ALPHA", "MATRICES", "MEMORY", "FOLDED",
		       "IN USE", "PATH");
	for (size_t i = 0; i < json_array_size(list); i++) {
		json_t *a = json_array_get(list, i), *f = json_object_get(a, "folded");
		char folded[32] = "no";
		if (json_is_object(f))
			snprintf(folded, sizeof(folded), "#%lld %s", iget(f, "order"), sget(f, "type"));
		nxc_printf("%-20s %5lld %7g %7lld %7.1fMi %-14s %6lld  %s\n", sget(a, "name"), iget(a, "rank"), nget(a, "alpha"),
		       iget(a, "tensors"), nget(a, "bytes") / 1048576, folded, iget(a, "in_use"), sget(a, "path"));
	}
	json_t *job = json_object_get(ev, "job");
	if (job)
		nxc_printf("running: %s of %s, %lld of %lld\n", sget(job, "kind"), sget(job, "adapter"), iget(job, "done"),
		       iget(job, "total"));
	if (json_object_get(ev, "checksum"))
		nxc_printf("weights checksum: %s\n", sget(ev, "checksum"));
	json_decref(ev);
	return NXC_EXIT_OK;
}

static int name_only(struct nxc_ctx *ctx, int argc, char **argv, const char *cmd, const char *op, const char *usage,
		     json_t **out)
{
	if (help_asked(argc, argv))
		return nxc_help(usage);
	if (argc != 2 || argv[1][0] == '-')
		return nxc_usage_err(cmd, "wants one NAME");
	int rc;
	*out = run_op(ctx, json_pack("{s:s,s:s}", "op", op, "name", argv[1]), cmd, &rc);
	return rc;
}

int nxc_cmd_lora_unload(struct nxc_ctx *ctx, int argc, char **argv)
{
	json_t *ev = NULL;
	int rc = name_only(ctx, argc, argv, "lora-unload", "lora_unload", nxc_usage_lora_unload, &ev);
	if (ev)
		nxc_printf("unloaded %s\n", argv[1]);
	json_decref(ev);
	return rc;
}

int nxc_cmd_lora_unfold(struct nxc_ctx *ctx, int argc, char **argv)
{
	json_t *ev = NULL;
	int rc = name_only(ctx, argc, argv, "lora-unfold", "lora_unfold", nxc_usage_lora_unfold, &ev);
	if (ev)
		nxc_printf("unfolded %s: %lld matrices back to their base\n", sget(ev, "name"), iget(ev, "tensors"));
	json_decref(ev);
	return rc;
}

static void print_err_pair(json_t *e)
{
	nxc_printf("  %8.2e %8.2e", nget(e, "rel_rms"), nget(e, "max_abs"));
}

/* The accuracy report as a table (the columns of tools/nx-lora report). */
static void print_report(json_t *ev)
{
	json_t *r = json_object_get(ev, "report"), *types = json_object_get(r, "types");
	json_t *cost = json_object_get(r, "cost"), *tot = json_object_get(r, "total");
	nxc_printf("# adapter %s, scale %g: fold and runtime delta vs the exact float64 (dequant(W) + s*B@A) @ x,\n"
	       "# x = the real hidden states of a %lld-token probe prompt (each matrix's own input).\n"
	       "# rel rms / max abs error; effect = |s*B@A@x| / |y|; noise = the base type's own quantization error.\n",
	       sget(ev, "name"), nget(r, "scale"), iget(r, "probe_tokens"));
	nxc_printf("%-26s %-5s %4s %8s", "tensor", "type", "rank", "effect");
	for (size_t i = 0; i < json_array_size(types); i++) {
		char h[40];
		snprintf(h, sizeof(h), "fold %s", json_string_value(json_array_get(types, i)));
		nxc_printf("  %-17s", h);
	}
	nxc_printf("  %-17s  %-8s %8s\n", "delta (f32)", "noise", "fold ms");
	json_t *ts = json_object_get(r, "tensors");
	for (size_t k = 0; k <= json_array_size(ts); k++) {
		json_t *t = k < json_array_size(ts) ? json_array_get(ts, k) : tot;
		char name[48];
		if (t == tot)
			snprintf(name, sizeof(name), "total (%lld matrices)", iget(tot, "tensors"));
		else
			snprintf(name, sizeof(name), "%s", sget(t, "tensor"));
		char rank[16] = "";
		if (t != tot)
			snprintf(rank, sizeof(rank), "%lld", iget(t, "rank"));
		nxc_printf("%-26s %-5s %4s %8.2e", name, t == tot ? "" : sget(t, "type"), rank, nget(t, "effect"));
		json_t *folds = json_object_get(t, "fold");
		for (size_t i = 0; i < json_array_size(folds); i++)
			print_err_pair(json_array_get(folds, i));
		print_err_pair(json_object_get(t, "delta"));
		nxc_printf("  %8.2e %8.1f\n", nget(json_object_get(t, "noise"), "rel_rms"), nget(t, "fold_ms"));
	}
	json_t *folds = json_object_get(tot, "fold");
	for (size_t i = 0; i < json_array_size(folds); i++) {
		json_t *f = json_array_get(folds, i);
		if (nget(f, "rel_rms") > 0.5 * nget(tot, "effect"))
			nxc_printf("# fold %s: its error is %.0f%% of the adapter's effect - that fold loses much of the adapter;\n"
			       "#   a wider type (f16, q8_0) or the runtime delta keeps it\n",
			       sget(f, "type"), 100 * nget(f, "rel_rms") / nget(tot, "effect"));
	}
	json_t *fd = json_object_get(r, "folded");
	if (fd)
		nxc_printf("# folded now (%s): the fold took %.0f ms\n", sget(fd, "type"), nget(fd, "ms"));
	nxc_printf("# fold time (to %s, one thread, from the grading): %.0f ms\n",
	       json_string_value(json_array_get(types, 0)), nget(tot, "fold_ms"));
	nxc_printf("# runtime delta: %.3f ms per token on one thread, %.1f Mflop (a decode step of the model: %.2f ms)\n",
	       nget(cost, "delta_ms_per_token"), nget(cost, "delta_flops_per_token") / 1e6,
	       nget(cost, "base_ms_per_token"));
}

/* The options lora-fold --dry-run and lora-report share. */
static int probe_opts(const char *cmd, int o, const char *arg, json_t *req)
{
	if (o == 'p') {
		json_object_set_new(req, "prompt", json_string(arg));
		return 0;
	}
	json_t *l = layer_list(cmd, arg);
	if (!l)
		return NXC_EXIT_USAGE;
	json_object_set_new(req, "layers", l);
	return 0;
}

// --- lora-fold --type auto

/* What a fold's error may be, as a share of the adapter's effect, for auto
 * to take that type: the 4-bit refold of a trained adapter is ~100%
 * (top-1 agreement with the exact merged model 47%), q8_0 ~10%, f16 ~0. */
#define AUTO_MAX_SHARE 0.25

static const char *const auto_types[] = {"keep", "q8_0"};

/* The grading auto decides on: a lora_report of keep and q8_0 with the
 * fold's own scale, prompt and layers. NULL with *rc set on failure. */
static json_t *auto_grade(struct nxc_ctx *ctx, json_t *fold_req, int *rc)
{
	json_t *req = json_pack("{s:s, s:O, s:[s,s]}", "op", "lora_report", "name", json_object_get(fold_req, "name"),
				"types", auto_types[0], auto_types[1]);
	const char *keys[] = {"scale", "prompt", "layers"};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (json_object_get(fold_req, keys[i]))
			json_object_set(req, keys[i], json_object_get(fold_req, keys[i]));
	return run_op(ctx, req, "lora-fold: grading keep and q8_0", rc);
}

/* The narrowest type whose fold keeps the adapter, from the report; why in
 * one line for stderr. */
static const char *auto_choose(json_t *report, char *why, size_t cap)
{
	json_t *tot = json_object_get(json_object_get(report, "report"), "total");
	json_t *folds = json_object_get(tot, "fold");
	double effect = nget(tot, "effect"), share[2];
	for (int i = 0; i < 2; i++)
		share[i] = effect > 0 ? nget(json_array_get(folds, i), "rel_rms") / effect : 0;
	if (share[0] <= AUTO_MAX_SHARE) {
		snprintf(why, cap, "a fold to the base's own type is off by %.0f%% of the adapter's effect: folding as is "
			 "(keep)", 100 * share[0]);
		return "keep";
	}
	const char *t = share[1] <= AUTO_MAX_SHARE ? "q8_0" : "f16";
	snprintf(why, cap, "a fold to the base's own type would be off by %.0f%% of the adapter's effect, to q8_0 by "
		 "%.0f%%: folding to %s (--type keep folds as is)", 100 * share[0], 100 * share[1], t);
	return t;
}

int nxc_cmd_lora_fold(struct nxc_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{"scale", required_argument, NULL, 's'}, {"type", required_argument, NULL, 't'},
		{"dry-run", no_argument, NULL, 'd'},     {"json", no_argument, NULL, 'j'},
		{"prompt", required_argument, NULL, 'p'}, {"layers", required_argument, NULL, 'l'},
		{"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
	};
	json_t *req = json_pack("{s:s}", "op", "lora_fold");
	bool as_json = false, dry = false;
	optind = 0;
	opterr = 0;
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		double v;
		switch (o) {
		case 's':
			if (nxc_parse_double("lora-fold", "--scale", optarg, &v))
				goto usage;
			json_object_set_new(req, "scale", json_real(v));
			break;
		case 't':
			json_object_set_new(req, "type", json_string(optarg));
			break;
		case 'd':
			dry = true;
			break;
		case 'j':
			as_json = true;
			break;
		case 'p':
		case 'l':
			if (probe_opts("lora-fold", o, optarg, req))
				goto usage;
			break;
		case 'h':
			json_decref(req);
			return nxc_help(nxc_usage_lora_fold);
		default:
			json_decref(req);
			return nxc_usage_err("lora-fold", "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (argc - optind != 1) {
		json_decref(req);
		return nxc_usage_err("lora-fold", "wants one NAME");
	}
	if ((json_object_get(req, "prompt") || json_object_get(req, "layers")) && !dry) {
		json_decref(req);
		return nxc_usage_err("lora-fold", "--prompt and --layers go with --dry-run");
	}
	json_object_set_new(req, "name", json_string(argv[optind]));
	json_object_set_new(req, "dry_run", json_boolean(dry));
	json_t *ty = json_object_get(req, "type");
	int rc;
	if (!ty || !strcmp(json_string_value(ty), "auto")) {
		char why[256];
		json_t *grade = auto_grade(ctx, req, &rc);
		if (!grade) {
			json_decref(req);
			return rc;
		}
		const char *chosen = auto_choose(grade, why, sizeof(why));
		if (dry) { /* the grading was the dry run */
			if (as_json)
				print_json(grade);
			else
				print_report(grade);
			nxc_printf("# lora-fold without --type: %s\n", why);
			json_decref(grade);
			json_decref(req);
			return NXC_EXIT_OK;
		}
		json_decref(grade);
		nxc_msg("lora-fold: %s", why);
		json_object_set_new(req, "type", json_string(chosen));
	}
	json_t *ev = run_op(ctx, req, dry ? "lora-fold --dry-run" : "lora-fold", &rc);
	if (!ev)
		return rc;
	if (as_json)
		print_json(ev);
	else if (dry)
		print_report(ev);
	else
		nxc_printf("folded %s (%s, scale %g): %lld matrices, %.1f MiB, %.0f ms; fold #%lld\n", sget(ev, "name"),
		       sget(ev, "type"), nget(ev, "scale"), iget(ev, "tensors"), nget(ev, "bytes") / 1048576, nget(ev, "ms"),
		       iget(ev, "order"));
	json_decref(ev);
	return NXC_EXIT_OK;
usage:
	json_decref(req);
	return NXC_EXIT_USAGE;
}

int nxc_cmd_lora_report(struct nxc_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{"scale", required_argument, NULL, 's'}, {"types", required_argument, NULL, 't'},
		{"json", no_argument, NULL, 'j'},        {"prompt", required_argument, NULL, 'p'},
		{"layers", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	json_t *req = json_pack("{s:s}", "op", "lora_report");
	bool as_json = false;
	optind = 0;
	opterr = 0;
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		double v;
		switch (o) {
		case 's':
			if (nxc_parse_double("lora-report", "--scale", optarg, &v))
				goto usage;
			json_object_set_new(req, "scale", json_real(v));
			break;
		case 't': {
			json_t *a = json_array();
			char *copy = strdup(optarg), *save = NULL;
			for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
				json_array_append_new(a, json_string(t));
			free(copy);
			json_object_set_new(req, "types", a);
			break;
		}
		case 'j':
			as_json = true;
			break;
		case 'p':
		case 'l':
			if (probe_opts("lora-report", o, optarg, req))
				goto usage;
			break;
		case 'h':
			json_decref(req);
			return nxc_help(nxc_usage_lora_report);
		default:
			json_decref(req);
			return nxc_usage_err("lora-report", "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (argc - optind != 1) {
		json_decref(req);
		return nxc_usage_err("lora-report", "wants one NAME");
	}
	json_object_set_new(req, "name", json_string(argv[optind]));
	int rc;
	json_t *ev = run_op(ctx, req, "lora-report", &rc);
	if (!ev)
		return rc;
	if (as_json)
		print_json(ev);
	else
		print_report(ev);
	json_decref(ev);
	return NXC_EXIT_OK;
usage:
	json_decref(req);
	return NXC_EXIT_USAGE;
}
