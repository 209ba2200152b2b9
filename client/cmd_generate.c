/* cmd_generate.c - nxctl generate, and what chat shares with it: sampling flags, streaming an answer, Ctrl-C as cancel. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/nxctl.h"
#include "proto/proto.h"

const char nxc_usage_generate[] =
	"usage: nxctl generate [OPTIONS] PROMPT|-\n\n"
	"Streams the model's answer to PROMPT (one user message through the model's chat\n"
	"template). With '-', or without PROMPT when stdin is not a terminal, the prompt\n"
	"is read from stdin (one trailing newline removed). Several PROMPT words are\n"
	"joined with spaces. Ctrl-C cancels the request and waits for it to end; a\n"
	"second Ctrl-C exits at once.\n\n" NXC_SAMPLING_HELP
	"      --system TEXT      system message before the prompt\n"
	"      --raw              send PROMPT as is, without the chat template\n"
	"      --tokens           PROMPT is a list of token ids (\"1 2 3\" or \"1,2,3\"), used as is\n"
	"      --tools FILE       offer the model the tools of FILE, a JSON array of OpenAI tool\n"
	"                         objects; each call it makes is printed as a JSON line\n"
	"      --tool-choice C    auto, none, required, or the name of the tool to call\n"
	"      --logprobs N       ask for the N (0..20) most likely alternatives per token\n"
	"                         (shown with --json)\n"
	"      --json             print every event line from nxd as it arrives\n\n"
	"exit status: 0 done, 1 error from nxd, 2 bad arguments, 3 nxd not running,\n"
	"130 cancelled with Ctrl-C.\n";

enum {
	O_TOPK = 256, O_TOPP, O_MINP, O_RPEN, O_RLAST, O_SEED, O_STOP, O_IGNORE_EOS, O_SYSTEM,
	O_RAW, O_JSON, O_LOGPROBS, O_TOKENS, O_LORA, O_RAW_OUTPUT, O_SPEC, O_TOOLS, O_TOOL_CHOICE,
};

static const struct option gen_opts[] = {
	{"max-tokens", required_argument, NULL, 'n'},
	{"temp", required_argument, NULL, 't'},
	{"temperature", required_argument, NULL, 't'},
	{"top-k", required_argument, NULL, O_TOPK},
	{"top-p", required_argument, NULL, O_TOPP},
	{"min-p", required_argument, NULL, O_MINP},
	{"repeat-penalty", required_argument, NULL, O_RPEN},
	{"repeat-last-n", required_argument, NULL, O_RLAST},
	{"seed", required_argument, NULL, O_SEED},
	{"stop", required_argument, NULL, O_STOP},
	{"ignore-eos", no_argument, NULL, O_IGNORE_EOS},
	{"system", required_argument, NULL, O_SYSTEM},
	{"raw", no_argument, NULL, O_RAW},
	{"json", no_argument, NULL, O_JSON},
	{"logprobs", required_argument, NULL, O_LOGPROBS},
	{"tokens", no_argument, NULL, O_TOKENS},
	{"lora", required_argument, NULL, O_LORA},
	{"speculate", required_argument, NULL, O_SPEC},
	{"raw-output", no_argument, NULL, O_RAW_OUTPUT},
	{"tools", required_argument, NULL, O_TOOLS},
	{"tool-choice", required_argument, NULL, O_TOOL_CHOICE},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* The long name of option o, for messages. */
static const char *opt_name(int o)
{
	for (const struct option *p = gen_opts; p->name; p++)
		if (p->val == o)
			return p->name;
	return "?";
}

static int set_num_int(json_t *params, const char *cmd, const char *key, const char *flag,
		       const char *val, long long lo, long long hi)
{
	long long v;
	if (nxc_parse_int(cmd, flag, val, lo, hi, &v))
		return -1;
	json_object_set_new(params, key, json_integer(v));
	return 0;
}

static int set_num_real(json_t *params, const char *cmd, const char *key, const char *flag,
			const char *val)
{
	double v;
	if (nxc_parse_double(cmd, flag, val, &v))
		return -1;
	json_object_set_new(params, key, json_real(v));
	return 0;
}

_Static_assert(NXP_MAX_SPEC_K == 16, "NXC_SPEC_RANGE names 1..16");

json_t *nxc_spec_value(const char *arg)
{
	char mode[16], *end;
	const char *colon = strchr(arg, ':');
	const size_t len = colon ? (size_t)(colon - arg) : strlen(arg);
	enum nxp_spec_mode m;
	if (len >= sizeof(mode))
		return NULL;
	memcpy(mode, arg, len);
	mode[len] = '\0';
	if (!nxp_spec_mode_parse(mode, &m))
		return NULL;
	long k = 0;
	if (colon) {
		errno = 0;
		k = strtol(colon + 1, &end, 10);
		if (!isdigit((unsigned char)colon[1]) || *end || errno || k < 1 || k > NXP_MAX_SPEC_K)
			return NULL;
	}
	json_t *sp = json_object();
	json_object_set_new(sp, "mode", json_string(mode));
	if (colon)
		json_object_set_new(sp, "k", json_integer(k));
	return sp;
}

/* Ranges that depend on the model (max_tokens, top_p...) are left to nxd,
 * which names the field. */
int nxc_gen_parse(const char *cmd, bool is_chat, int argc, char **argv, struct nxc_gen_args *ga)
{
	memset(ga, 0, sizeof(*ga));
	ga->params = json_object();
	optind = 0;
	opterr = 0;
	int o;
	/* GNU permutation: flags may follow the PROMPT; "--" ends them. */
	while ((o = getopt_long(argc, argv, ":n:t:h", gen_opts, NULL)) != -1) {
		char flag[48];
		snprintf(flag, sizeof(flag), "--%s", opt_name(o));
		switch (o) {
		case 'h':
			nxc_help(is_chat ? nxc_usage_chat : nxc_usage_generate);
			return 1;
		case ':':
			return nxc_usage_err(cmd, "%s needs a value", argv[optind - 1]);
		case '?':
			return nxc_usage_err(cmd, "unknown option '%s'", argv[optind - 1]);
		case 'n':
			if (set_num_int(ga->params, cmd, "max_tokens", flag, optarg, 1, INT64_MAX))
				return -1;
			break;
		case 't':
			if (set_num_real(ga->params, cmd, "temperature", flag, optarg))
				return -1;
			break;
		case O_TOPK:
			if (set_num_int(ga->params, cmd, "top_k", flag, optarg, 0, INT32_MAX))
				return -1;
			break;
		case O_TOPP:
			if (set_num_real(ga->params, cmd, "top_p", flag, optarg))
				return -1;
			break;
		case O_MINP:
			if (set_num_real(ga->params, cmd, "min_p", flag, optarg))
				return -1;
			break;
		case O_RPEN:
			if (set_num_real(ga->params, cmd, "repeat_penalty", flag, optarg))
				return -1;
			break;
		case O_RLAST:
			if (set_num_int(ga->params, cmd, "repeat_last_n", flag, optarg, 0, INT32_MAX))
				return -1;
			break;
		case O_LOGPROBS:
			if (set_num_int(ga->params, cmd, "logprobs", flag, optarg, 0, NXP_MAX_LOGPROBS))
				return -1;
			break;
		case O_SEED: {
			unsigned long long s;
			if (nxc_parse_u64(cmd, flag, optarg, &s))
				return -1;
			json_object_set_new(ga->params, "seed", json_integer((json_int_t)s));
			break;
		}
		case O_STOP: {
			json_t *stop = json_object_get(ga->params, "stop");
			json_t *s = json_string(optarg);
			if (!s || !*optarg) {
				json_decref(s);
				return nxc_usage_err(cmd, "--stop wants a non-empty UTF-8 string, got '%s'",
						     optarg);
			}
			if (strlen(optarg) > NXP_MAX_STOP_LEN) {
				json_decref(s);
				return nxc_usage_err(cmd, "--stop strings are at most %d bytes, got %zu",
						     NXP_MAX_STOP_LEN, strlen(optarg));
			}
			if (++ga->n_stop > NXP_MAX_STOP) {
				json_decref(s);
				return nxc_usage_err(cmd, "at most %d --stop strings", NXP_MAX_STOP);
			}
			if (!stop)
				json_object_set_new(ga->params, "stop", stop = json_array());
			json_array_append_new(stop, s);
			break;
		}
		case O_LORA: {
			/* NAME or NAME:SCALE */
			char *name = strdup(optarg), *colon = strrchr(name, ':');
			json_t *a = json_object();
			if (colon) {
				double sc;
				*colon = '\0';
				if (nxc_parse_double(cmd, "--lora SCALE", colon + 1, &sc)) {
					free(name);
					json_decref(a);
					return -1;
				}
				json_object_set_new(a, "scale", json_real(sc));
			}
			json_t *js = json_string(name);
			free(name);
			if (!js || !json_string_length(js)) {
				json_decref(js);
				json_decref(a);
				return nxc_usage_err(cmd, "--lora wants NAME or NAME:SCALE, got '%s'", optarg);
			}
			json_object_set_new(a, "name", js);
			json_t *list = json_object_get(ga->params, "lora");
			if (!list)
				json_object_set_new(ga->params, "lora", list = json_array());
			json_array_append_new(list, a);
			break;
		}
		case O_IGNORE_EOS:
			json_object_set_new(ga->params, "ignore_eos", json_true());
			break;
		case O_SPEC: {
			json_t *sp = nxc_spec_value(optarg);
			if (!sp)
				return nxc_usage_err(cmd, "--speculate wants " NXC_SPEC_RANGE ", got '%s'", optarg);
			json_object_set_new(ga->params, "speculate", sp);
			break;
		}
		case O_RAW_OUTPUT:
			ga->raw_output = true;
			break;
		case O_SYSTEM:
			ga->system = optarg;
			break;
		case O_TOOLS: {
			if (is_chat)
				return nxc_usage_err(cmd, "%s is not a chat option", argv[optind - 1]);
			json_error_t je;
			json_t *tools = json_load_file(optarg, 0, &je);
			if (!json_is_array(tools)) {
				json_decref(tools);
				return nxc_usage_err(cmd, "--tools %s: %s", optarg,
						     je.text[0] ? je.text : "not a JSON array of tool objects");
			}
			json_object_set_new(ga->params, "tools", tools); /* nxd checks each tool */
			break;
		}
		case O_TOOL_CHOICE: {
			if (is_chat)
				return nxc_usage_err(cmd, "%s is not a chat option", argv[optind - 1]);
			const char *c = optarg;
			json_t *v = !strcmp(c, "auto") || !strcmp(c, "none") || !strcmp(c, "required") ?
					    json_string(c) :
					    json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", c);
			if (!v)
				return nxc_usage_err(cmd, "--tool-choice is not valid UTF-8");
			json_object_set_new(ga->params, "tool_choice", v);
			break;
		}
		case O_RAW:
		case O_JSON:
		case O_TOKENS:
			if (is_chat)
				return nxc_usage_err(cmd, "%s is not a chat option", argv[optind - 1]);
			if (o == O_RAW)
				ga->raw = true;
			else if (o == O_JSON)
				ga->json = true;
			else
				ga->tokens = true;
			break;
		}
	}
	ga->first_arg = optind;
	if (ga->raw_output)
		nxc_term_raw(&nxc_stdout);
	return 0;
}

// --- streaming one answer

/* Ends the answer's line: what the terminal filter held back is shown first. */
static void end_line(void)
{
	nxc_term_end(&nxc_stdout);
	nxc_term_write(&nxc_stdout, "\n", 1);
}

void nxc_text_add(struct nxc_text *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return; /* the printed text is complete; only chat history loses it */
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void nxc_answer_free(struct nxc_answer *a)
{
	free(a->text.p);
	json_decref(a->done);
	json_decref(a->error);
	a->text = (struct nxc_text){0};
	a->done = a->error = NULL;
}

const char *nxc_cut_note(json_t *done, int n_ctx, char *buf, size_t cap)
{
	const char *reason = json_string_value(json_object_get(done, "reason"));
	if (!reason || strcmp(reason, "length"))
		return NULL;
	json_t *u = json_object_get(done, "usage");
	long long p = json_integer_value(json_object_get(u, "prompt_tokens"));
	long long n = json_integer_value(json_object_get(u, "completion_tokens"));
	if (n_ctx > 0 && p + n >= n_ctx)
		snprintf(buf, cap, "(the answer was cut: the context of %d tokens is full)", n_ctx);
	else
		snprintf(buf, cap, "(the answer was cut at %lld tokens by max_tokens)", n);
	return buf;
}

int nxc_stream_answer(struct nxc_conn *c, json_t *req, bool json_mode, struct nxc_answer *ans)
{
	int id = c->next_id++, cancel_id = -1;
	bool at_line_start = true;
	bool after_call = false; /* the last line out is a tool call's, ended */
	ans->hard = false;
	json_object_set_new(req, "id", json_integer(id));
	if (nxc_send(c, req))
		return NXC_EXIT_ERROR;
	for (;;) {
		json_t *ev;
		const char *raw;
		int k = nxc_next_event(c, &ev, &raw);
		if (k == -2) {
			if (nxc_interrupts >= 2) {
				if (!json_mode && !at_line_start)
					end_line();
				ans->hard = true;
				return NXC_EXIT_INTR;
			}
			if (nxc_interrupts == 1 && cancel_id < 0) {
				cancel_id = c->next_id++;
				if (nxc_send(c, json_pack("{s:i, s:s, s:i}", "id", cancel_id, "op", "cancel",
							  "target", id)))
					return NXC_EXIT_ERROR;
			}
			continue;
		}
		if (k == 0) {
			if (!json_mode && !at_line_start)
				end_line();
			nxc_msg("%s closed the connection before the answer was done", c->path);
			return NXC_EXIT_ERROR;
		}
		if (k < 0)
			return NXC_EXIT_ERROR;
		if (json_mode) {
			nxc_print_json(raw, strlen(raw));
			fflush(stdout);
		}
		const char *name = nxc_ev_name(ev);
		json_t *evid = json_object_get(ev, "id");
		if (nxc_ev_is(ev, cancel_id) || (!nxc_ev_is(ev, id) && !json_is_null(evid))) {
			/* the cancel's own answer (ok, or not_found when the answer had
			 * already ended), or something that is not ours */
			json_decref(ev);
			continue;
		}
		if (!strcmp(name, "token")) {
			json_t *t = json_object_get(ev, "text");
			if (json_is_string(t)) {
				size_t n = json_string_length(t);
				if (!json_mode && n) {
					nxc_term_write(&nxc_stdout, json_string_value(t), n);
					fflush(stdout);
					at_line_start = json_string_value(t)[n - 1] == '\n';
					after_call = false;
				}
				nxc_text_add(&ans->text, json_string_value(t), n);
			}
		} else if (!strcmp(name, "tool_call") && !json_mode) {
			/* a call the model made: one JSON line, for a program to run it */
			char *s = json_dumps(json_object_get(ev, "tool_call"), JSON_COMPACT);
			if (!at_line_start)
				end_line();
			if (s)
				printf("%s\n", s);
			fflush(stdout);
			at_line_start = after_call = true;
			free(s);
		} else if (!strcmp(name, "done")) {
			const char *reason = json_string_value(json_object_get(ev, "reason"));
			json_t *t = json_object_get(ev, "text"); /* only when not streamed */
			if (json_is_string(t) && !json_mode)
				nxc_term_write(&nxc_stdout, json_string_value(t), json_string_length(t));
			if (json_is_string(t))
				nxc_text_add(&ans->text, json_string_value(t), json_string_length(t));
			if (!json_mode && !after_call)
				end_line();
			fflush(stdout);
			int rc = NXC_EXIT_OK;
			if (reason && !strcmp(reason, "cancelled")) {
				rc = NXC_EXIT_INTR;
				if (cancel_id < 0) {
					nxc_msg("nxd cancelled the request");
					rc = NXC_EXIT_ERROR;
				}
			} else if (reason && !strcmp(reason, "shutdown")) {
				nxc_msg("nxd is shutting down; the answer is incomplete");
				rc = NXC_EXIT_ERROR;
			}
			ans->done = ev;
			return rc;
		} else if (!strcmp(name, "error")) {
			if (!json_mode && !at_line_start)
				end_line();
			if (ans->keep_error) {
				ans->error = ev;
				return NXC_EXIT_ERROR;
			}
			nxc_print_error(ev);
			json_decref(ev);
			return NXC_EXIT_ERROR;
		}
		json_decref(ev);
	}
}

// --- generate

/* "1 2,3" -> [1,2,3]; NULL after a usage message. */
static json_t *token_list(const char *s)
{
	json_t *a = json_array();
	char *copy = strdup(s), *save = NULL;
	for (char *t = strtok_r(copy, " ,\t\n", &save); t; t = strtok_r(NULL, " ,\t\n", &save)) {
		long long v;
		if (nxc_parse_int("generate", "--tokens id", t, INT32_MIN, INT32_MAX, &v)) {
			json_decref(a);
			a = NULL;
			break;
		}
		json_array_append_new(a, json_integer(v));
	}
	free(copy);
	if (a && json_array_size(a) == 0) {
		json_decref(a);
		nxc_usage_err("generate", "--tokens wants at least one token id");
		return NULL;
	}
	return a;
}

int nxc_cmd_generate(struct nxc_ctx *ctx, int argc, char **argv)
{
	struct nxc_gen_args ga;
	int rc = nxc_gen_parse("generate", false, argc, argv, &ga);
	if (rc) {
		json_decref(ga.params);
		return rc == 1 ? NXC_EXIT_OK : NXC_EXIT_USAGE;
	}
	json_t *req = ga.params;
	char *prompt = NULL;
	int n_words = argc - ga.first_arg;
	if (n_words == 1 && !strcmp(argv[ga.first_arg], "-"))
		n_words = 0;
	else if (n_words == 0 && isatty(0)) {
		json_decref(req);
		return nxc_usage_err("generate", "no PROMPT given (pass it as an argument, or '-' for stdin)");
	}
	if (n_words == 0) {
		prompt = nxc_read_all(0);
		if (!prompt) {
			json_decref(req);
			return NXC_EXIT_ERROR;
		}
		nxc_chomp(prompt);
	} else {
		size_t n = 0;
		for (int i = ga.first_arg; i < argc; i++)
			n += strlen(argv[i]) + 1;
		prompt = calloc(1, n + 1);
		for (int i = ga.first_arg; i < argc; i++) {
			if (i > ga.first_arg)
				strcat(prompt, " ");
			strcat(prompt, argv[i]);
		}
	}

	if (!*prompt) {
		free(prompt);
		json_decref(req);
		return nxc_usage_err("generate", "the prompt is empty%s", n_words ? "" : " (nothing on stdin)");
	}
	if (ga.tokens) {
		if (ga.raw || ga.system) {
			free(prompt);
			json_decref(req);
			return nxc_usage_err("generate", "--tokens cannot be combined with %s",
					     ga.raw ? "--raw" : "--system");
		}
		json_t *toks = token_list(prompt);
		free(prompt);
		if (!toks) {
			json_decref(req);
			return NXC_EXIT_USAGE;
		}
		json_object_set_new(req, "tokens", toks);
	} else {
		json_t *p = json_string(prompt);
		free(prompt);
		if (!p) {
			json_decref(req);
			return nxc_usage_err("generate", "the prompt is not valid UTF-8");
		}
		json_object_set_new(req, "prompt", p);
		if (ga.raw)
			json_object_set_new(req, "raw", json_true());
		if (ga.system) {
			json_t *s = json_string(ga.system);
			if (!s) {
				json_decref(req);
				return nxc_usage_err("generate", "--system is not valid UTF-8");
			}
			json_object_set_new(req, "system", s);
		}
	}
	json_object_set_new(req, "op", json_string("generate"));
	json_object_set_new(req, "stream", json_true());

	nxc_signals_init();
	struct nxc_conn c;
	json_t *hello = NULL;
	rc = nxc_open(ctx, &c, &hello);
	if (rc) {
		json_decref(req);
		return rc;
	}
	struct nxc_answer ans = {0};
	rc = nxc_stream_answer(&c, req, ga.json, &ans);
	char note[128];
	/* on a terminal, say why the answer stopped short; pipes get the text alone */
	if (rc == NXC_EXIT_OK && !ga.json && isatty(2) &&
	    nxc_cut_note(ans.done, (int)json_integer_value(json_object_get(hello, "n_ctx")), note, sizeof(note)))
		nxc_note("%s", note);
	nxc_answer_free(&ans);
	json_decref(hello);
	nxc_close(&c);
	return rc;
}

