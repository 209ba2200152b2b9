/* cmd_info.c - the one-shot nxctl commands: tokenize, detokenize, status, shutdown. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/nxctl.h"
#include "proto/proto.h"

const char nxc_usage_tokenize[] =
	"usage: nxctl tokenize [--special] [--bos | --no-bos] TEXT|-\n\n"
	"Prints the token ids of TEXT (or of stdin with '-', one trailing newline removed),\n"
	"space-separated.\n\n"
	"  --special   parse special-token text such as <|im_start|> as special tokens\n"
	"  --bos       add the beginning-of-sequence token\n"
	"  --no-bos    do not add it (default: what the model asks for)\n";

const char nxc_usage_detokenize[] =
	"usage: nxctl detokenize [--no-special] [--raw-output] [--] ID...\n\n"
	"Prints the text of the token ids (separated by spaces or commas), control tokens\n"
	"such as <|im_end|> as their text. On a terminal, control characters in it are\n"
	"shown (ESC as ^[, U+009B as <U+009B>), not obeyed.\n\n"
	"  --no-special  leave control tokens out\n"
	"  --raw-output  write the text to a terminal as it is\n";

const char nxc_usage_shutdown[] =
	"usage: nxctl shutdown\n\n"
	"Asks nxd to stop: running generations end with reason \"shutdown\", then it exits.\n"
	"Only root, nxd's own user and members of its --admin-group may.\n";

const char nxc_usage_status[] =
	"usage: nxctl status [--profile] [--json]\n\n"
	"Shows the model, the workers and their state, slots in use, queued requests,\n"
	"tokens served, prompt tokens the prompt cache spared, recent throughput and\n"
	"uptime.\n\n"
	"  --profile  only where a forward step's time goes (matmul, logits, attention,\n"
	"             norm+quant, rope+kv, barrier, and supervisor: the wait for the\n"
	"             next step), averaged over the workers and the steps since nxd\n"
	"             started; nxd keeps these only when started with NXD_PROFILE=1\n"
	"             in its environment (off by default)\n"
	"  --json     print the raw status event (with --profile: its profile object)\n";

void nxc_chomp(char *s)
{
	size_t n = strlen(s);
	if (n && s[n - 1] == '\n')
		s[--n] = '\0';
	if (n && s[n - 1] == '\r')
		s[n - 1] = '\0';
}

char *nxc_read_all(int fd)
{
	size_t cap = 4096, len = 0;
	char *s = malloc(cap);
	while (s) {
		if (len + 1 == cap) {
			char *t = realloc(s, cap * 2);
			if (!t)
				break;
			s = t;
			cap *= 2;
		}
		ssize_t k = read(fd, s + len, cap - 1 - len);
		if (k == 0) {
			s[len] = '\0';
			return s;
		}
		if (k < 0) {
			nxc_msg("cannot read stdin: %m");
			break;
		}
		len += (size_t)k;
	}
	free(s);
	return NULL;
}

/* Sends req (stolen) on a fresh connection and waits for its answer: returns
 * the answer event (caller decrefs) or NULL with *exit_code set. */
static json_t *one_shot(struct nxc_ctx *ctx, json_t *req, int *exit_code)
{
	struct nxc_conn c;
	int rc = nxc_open(ctx, &c, NULL);
	if (rc) {
		json_decref(req);
		*exit_code = rc;
		return NULL;
	}
	int id = c.next_id++;
	json_object_set_new(req, "id", json_integer(id));
	*exit_code = NXC_EXIT_ERROR;
	if (nxc_send(&c, req)) {
		nxc_close(&c);
		return NULL;
	}
	for (;;) {
		json_t *ev;
		const char *raw;
		int k = nxc_next_event(&c, &ev, &raw);
		if (k == -2)
			continue;
		if (k == 0)
			nxc_msg("%s closed the connection before answering", c.path);
		if (k <= 0)
			break;
		json_t *evid = json_object_get(ev, "id");
		if (!nxc_ev_is(ev, id) && !json_is_null(evid)) {
			json_decref(ev);
			continue;
		}
		if (!strcmp(nxc_ev_name(ev), "error")) {
			nxc_print_error(ev);
			json_decref(ev);
			break;
		}
		if (json_is_null(evid)) { /* a null id is only for errors */
			json_decref(ev);
			continue;
		}
		nxc_close(&c);
		*exit_code = NXC_EXIT_OK;
		return ev;
	}
	nxc_close(&c);
	return NULL;
}

int nxc_cmd_tokenize(struct nxc_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{"special", no_argument, NULL, 's'}, {"bos", no_argument, NULL, 'b'},
		{"no-bos", no_argument, NULL, 'n'},  {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool special = false;
	int bos = -1;
	optind = 0;
	opterr = 0;
	int o;
	while ((o = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
		switch (o) {
		case 's': special = true; break;
		case 'b': bos = 1; break;
		case 'n': bos = 0; break;
		case 'h': return nxc_help(nxc_usage_tokenize);
		default: return nxc_usage_err("tokenize", "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (argc - optind != 1)
		return nxc_usage_err("tokenize", "wants one TEXT argument (or '-' for stdin), got %d",
				     argc - optind);
	bool from_stdin = !strcmp(argv[optind], "-");
	char *text = from_stdin ? nxc_read_all(0) : strdup(argv[optind]);
	if (!text)
		return NXC_EXIT_ERROR;
	if (from_stdin) /* as generate: "echo hi | nxctl tokenize -" is the ids of "hi" */
		nxc_chomp(text);
	json_t *s = json_string(text);
	free(text);
	if (!s)
		return nxc_usage_err("tokenize", "TEXT is not valid UTF-8");
	json_t *req = json_pack("{s:s, s:o, s:b}", "op", "tokenize", "text", s, "special", special);
	if (bos >= 0)
		json_object_set_new(req, "add_bos", json_boolean(bos));
	int rc;
	json_t *ev = one_shot(ctx, req, &rc);
	if (!ev)
		return rc;
	json_t *toks = json_object_get(ev, "tokens");
	if (!json_is_array(toks)) {
		nxc_msg("nxd answered tokenize without a 'tokens' array");
		json_decref(ev);
		return NXC_EXIT_ERROR;
	}
	for (size_t i = 0; i < json_array_size(toks); i++)
		nxc_printf("%s%lld", i ? " " : "", (long long)json_integer_value(json_array_get(toks, i)));
	nxc_printf("\n");
	json_decref(ev);
	return NXC_EXIT_OK;
}

int nxc_cmd_detokenize(struct nxc_ctx *ctx, int argc, char **argv)
{
	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
		return nxc_help(nxc_usage_detokenize);
	json_t *toks = json_array();
	bool special = true, options = true;
	for (int i = 1; i < argc; i++) {
		if (options && !strcmp(argv[i], "--")) {
			options = false; /* what follows are ids, "-1" among them */
			continue;
		}
		if (options && !strcmp(argv[i], "--raw-output")) {
			nxc_term_raw(&nxc_stdout);
			continue;
		}
		if (options && !strcmp(argv[i], "--no-special")) {
			special = false;
			continue;
		}
		if (options && argv[i][0] == '-' && argv[i][1] && (argv[i][1] < '0' || argv[i][1] > '9')) {
			json_decref(toks);
			return nxc_usage_err("detokenize", "unknown option '%s'", argv[i]);
		}
		/* "1 2,3" and "1" "2" "3" are the same list */
		char *copy = strdup(argv[i]), *save = NULL;
		for (char *t = strtok_r(copy, " ,\t\n", &save); t; t = strtok_r(NULL, " ,\t\n", &save)) {
			long long v;
			if (nxc_parse_int("detokenize", "token id", t, INT32_MIN, INT32_MAX, &v)) {
				free(copy);
				json_decref(toks);
				return NXC_EXIT_USAGE;
			}
			json_array_append_new(toks, json_integer(v));
		}
		free(copy);
	}
	if (json_array_size(toks) == 0) {
		json_decref(toks);
		return nxc_usage_err("detokenize", "wants at least one token ID");
	}
	int rc;
	json_t *ev = one_shot(ctx, json_pack("{s:s, s:o, s:b}", "op", "detokenize", "tokens", toks, "special", special),
			      &rc);
	if (!ev)
		return rc;
	json_t *text = json_object_get(ev, "text");
	if (!json_is_string(text)) {
		nxc_msg("nxd answered detokenize without a 'text' string");
		json_decref(ev);
		return NXC_EXIT_ERROR;
	}
	nxc_term_write(&nxc_stdout, json_string_value(text), json_string_length(text));
	nxc_term_end(&nxc_stdout);
	nxc_printf("\n");
	json_decref(ev);
	return NXC_EXIT_OK;
}

static void print_duration(double s)
{
	long long t = (long long)s;
	if (t >= 86400)
		nxc_printf("%lldd %02lldh%02lldm%02llds", t / 86400, t / 3600 % 24, t / 60 % 60, t % 60);
	else if (t >= 3600)
		nxc_printf("%lldh%02lldm%02llds", t / 3600, t / 60 % 60, t % 60);
	else if (t >= 60)
		nxc_printf("%lldm%02llds", t / 60, t % 60);
	else
		nxc_printf("%.1fs", s);
}

static const char *sget(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "?";
}

static long long iget(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

static double nget(json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

/* The per-phase split of status's profile object (ms_per_step: phase -> ms). */
static void print_profile(json_t *prof)
{
	json_t *ms = json_object_get(prof, "ms_per_step");
	double total = 0;
	const char *k;
	json_t *v;
	json_object_foreach(ms, k, v)
		total += json_number_value(v);
	nxc_printf("profile:   %.3f ms per step over %lld steps (mean of the workers)\n", total, iget(prof, "steps"));
	json_object_foreach(ms, k, v)
		nxc_printf("  %-11s %8.3f ms  %5.1f%%\n", k, json_number_value(v),
		       total > 0 ? 100 * json_number_value(v) / total : 0.0);
}

int nxc_cmd_status(struct nxc_ctx *ctx, int argc, char **argv)
{
	bool as_json = false, profile = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			as_json = true;
		else if (!strcmp(argv[i], "--profile"))
			profile = true;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return nxc_help(nxc_usage_status);
		else
			return nxc_usage_err("status", "unexpected argument '%s'", argv[i]);
	}
	int rc;
	json_t *ev = one_shot(ctx, json_pack("{s:s}", "op", "status"), &rc);
	if (!ev)
		return rc;
	json_t *prof = json_object_get(ev, "profile");
	const bool has_prof = json_is_object(json_object_get(prof, "ms_per_step"));
	if (profile && !has_prof) {
		fprintf(stderr, "nxctl: status: nxd keeps no per-phase times: start it with NXD_PROFILE=1 in its "
				"environment (systemd: Environment=NXD_PROFILE=1 in a drop-in for nxd.service)\n");
		json_decref(ev);
		return NXC_EXIT_ERROR;
	}
	if (profile && !as_json) {
		print_profile(prof);
		json_decref(ev);
		return NXC_EXIT_OK;
	}
	if (as_json) {
		/* nxd writes status numbers with 9 digits; jansson's 17 would add the double's binary tail */
		char *s = json_dumps(profile ? prof : ev, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
		nxc_print_json(s ? s : "{}", s ? strlen(s) : 2);
		free(s);
		json_decref(ev);
		return NXC_EXIT_OK;
	}
	nxc_printf("model:     %s (%s, %s), context %lld, vocabulary %lld, activations %s\n", sget(ev, "model"),
	       sget(ev, "arch"), sget(ev, "type"), iget(ev, "n_ctx"), iget(ev, "n_vocab"), sget(ev, "activations"));
	if (json_object_get(ev, "kv_type"))
		nxc_printf("kv cache:  %s, %.1f MiB\n", sget(ev, "kv_type"), nget(ev, "kv_bytes") / 1048576);
	if (json_object_get(ev, "chat_template"))
		nxc_printf("chat:      template %s, %s\n", sget(ev, "chat_template"),
			   json_is_true(json_object_get(ev, "tools")) ? "tool calls" : "no tool calls");
	json_t *ks = json_object_get(ev, "kernels");
	if (json_object_size(ks)) {
		nxc_printf("kernels:  ");
		const char *fam;
		json_t *set;
		json_object_foreach(ks, fam, set)
			nxc_printf(" %s %s", fam, json_is_string(set) ? json_string_value(set) : "?");
		nxc_printf("\n");
	}
	json_t *ws = json_object_get(ev, "workers");
	nxc_printf("workers:   %zu\n", json_array_size(ws));
	for (size_t i = 0; i < json_array_size(ws); i++) {
		json_t *w = json_array_get(ws, i);
		nxc_printf("  pid %-8lld cpu %-3lld %-10s restarts %lld\n", iget(w, "pid"), iget(w, "cpu"),
		       sget(w, "state"), iget(w, "restarts"));
	}
	json_t *sl = json_object_get(ev, "slots");
	nxc_printf("slots:     %lld of %lld used, %lld queued\n", iget(sl, "used"), iget(sl, "total"),
	       iget(sl, "queued"));
	json_t *sps = json_object_get(ev, "sequences_per_step");
	nxc_printf("tokens:    %lld served, %.1f tokens/s recently, %.2f sequences/step (max %lld)\n",
	       iget(ev, "tokens_served"), nget(ev, "tokens_per_s"), nget(sps, "mean"),
	       iget(sps, "max"));
	nxc_printf("cache:     %lld prompt tokens reused from earlier requests\n", iget(ev, "prompt_tokens_cached"));
	nxc_printf("steps:     %lld (%lld retried after a worker fault)\n", iget(ev, "steps"),
	       iget(ev, "steps_retried"));
	json_t *spec = json_object_get(ev, "speculate");
	if (spec) {
		nxc_printf("speculate: %s by default (k %lld), %lld of %lld drafted tokens accepted", sget(spec, "default"),
			   iget(spec, "k"), iget(spec, "accepted"), iget(spec, "drafted"));
		if (iget(spec, "drafted") > 0)
			nxc_printf(" (%.1f%%)", 100.0 * nget(spec, "acceptance"));
		nxc_printf("\n");
		const char *dm = json_string_value(json_object_get(spec, "draft_model"));
		json_t *dr = json_object_get(json_object_get(spec, "modes"), "draft");
		if (dm && *dm && dr)
			nxc_printf("           draft model %s: %lld steps, %lld of %lld drafted tokens accepted\n", dm,
				   iget(spec, "draft_steps"), iget(dr, "accepted"), iget(dr, "drafted"));
	}
	if (has_prof) /* nxd started with NXD_PROFILE=1 */
		print_profile(prof);
	nxc_printf("uptime:    ");
	print_duration(nget(ev, "uptime_s"));
	nxc_printf("\n");
	json_decref(ev);
	return NXC_EXIT_OK;
}

int nxc_cmd_shutdown(struct nxc_ctx *ctx, int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return nxc_help(nxc_usage_shutdown);
		return nxc_usage_err("shutdown", "unexpected argument '%s'", argv[i]);
	}
	int rc;
	json_t *ev = one_shot(ctx, json_pack("{s:s}", "op", "shutdown"), &rc);
	if (!ev)
		return rc;
	json_decref(ev);
	nxc_printf("nxd is shutting down\n");
	return NXC_EXIT_OK;
}
