/* nxctl.c - nxd's command-line client: global options, the command table, argument helpers. */
#define _GNU_SOURCE /* vasprintf */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/nxctl.h"
#include "common/version.h"
#include "proto/proto.h"

/* Adding a command: an entry here plus its function (see nxctl.h). */
static const struct nxc_cmd commands[] = {
	{"generate", nxc_cmd_generate, "generate text from a prompt, streamed", nxc_usage_generate},
	{"chat", nxc_cmd_chat, "interactive conversation", nxc_usage_chat},
	{"tokenize", nxc_cmd_tokenize, "print the token ids of a text", nxc_usage_tokenize},
	{"detokenize", nxc_cmd_detokenize, "print the text of token ids", nxc_usage_detokenize},
	{"status", nxc_cmd_status, "show the daemon's model, workers and load", nxc_usage_status},
	{"shutdown", nxc_cmd_shutdown, "stop the daemon (admins only)", nxc_usage_shutdown},
	{"lora-load", nxc_cmd_lora_load, "load a LoRA adapter", nxc_usage_lora_load},
	{"lora-list", nxc_cmd_lora_list, "list the loaded adapters", nxc_usage_lora_list},
	{"lora-unload", nxc_cmd_lora_unload, "unload an adapter", nxc_usage_lora_unload},
	{"lora-fold", nxc_cmd_lora_fold, "fold an adapter into the model (or grade it: --dry-run)", nxc_usage_lora_fold},
	{"lora-unfold", nxc_cmd_lora_unfold, "undo the latest fold", nxc_usage_lora_unfold},
	{"lora-report", nxc_cmd_lora_report, "accuracy of fold vs runtime delta on real activations",
	 nxc_usage_lora_report},
};

static void main_usage(FILE *f)
{
	fprintf(f, "usage: nxctl [--socket PATH] COMMAND [ARGS...]\n"
		   "       nxctl COMMAND --help\n"
		   "       nxctl --version\n\n"
		   "Talks to the nxd inference daemon over its Unix socket.\n\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\noptions:\n"
		   "  -s, --socket PATH  the daemon's socket; default $NXD_SOCKET, else\n"
		   "                     /run/nxd/nxd.sock as root, else $XDG_RUNTIME_DIR/nxd.sock\n"
		   "                     when it exists, else /run/nxd/nxd.sock\n"
		   "  -h, --help         this text\n"
		   "  -V, --version      the version and the protocol version\n\n"
		   "exit status: 0 done, 1 error reported by nxd (or the connection broke),\n"
		   "2 bad command line, 3 cannot connect (nxd not running), 130 interrupted.\n");
}

/* Messages carry the server's words (error messages, lines it sent): on a
 * terminal they go through nxc_stderr like the model's text does. */
void nxc_msg(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	fflush(stdout); /* keep streamed text and the message in order on a terminal */
	va_start(ap, fmt);
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	nxc_eprintf("nxctl: %s\n", n >= 0 ? s : fmt);
	free(n >= 0 ? s : NULL);
}

int nxc_usage_err(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	va_start(ap, fmt);
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	nxc_eprintf("nxctl: %s%s%s\nTry 'nxctl %s%s--help'.\n", cmd ? cmd : "", cmd ? ": " : "", n >= 0 ? s : fmt,
		    cmd ? cmd : "", cmd ? " " : "");
	free(n >= 0 ? s : NULL);
	return NXC_EXIT_USAGE;
}

int nxc_help(const char *usage)
{
	fputs(usage, stdout);
	return NXC_EXIT_OK;
}

int nxc_parse_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
		  long long *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	/* no upper bound (hi LLONG_MAX): a number past it is the largest, as nxd takes it */
	bool open_ended = hi == LLONG_MAX, over = errno == ERANGE && v == LLONG_MAX;
	if (!*s || *end || (errno && !(open_ended && over)))
		return nxc_usage_err(cmd, "%s wants an integer, got '%s'", flag, s);
	if (open_ended && v < lo)
		return nxc_usage_err(cmd, "%s must be at least %lld, got %lld", flag, lo, v);
	if (v < lo || v > hi)
		return nxc_usage_err(cmd, "%s must be in %lld..%lld, got %lld", flag, lo, hi, v);
	*out = v;
	return 0;
}

int nxc_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (!*s || *end || errno || *s == '-')
		return nxc_usage_err(cmd, "%s wants an integer in 0..%llu, got '%s'", flag,
				     (unsigned long long)INT64_MAX, s);
	/* the protocol carries seeds as JSON integers: int64 */
	if (v > (unsigned long long)INT64_MAX)
		return nxc_usage_err(cmd, "%s must be at most %lld, got %s", flag, (long long)INT64_MAX,
				     s);
	*out = v;
	return 0;
}

int nxc_parse_double(const char *cmd, const char *flag, const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (!*s || *end || errno || !isfinite(v))
		return nxc_usage_err(cmd, "%s wants a finite number, got '%s'", flag, s);
	*out = v;
	return 0;
}

/* An answer that could not be written (a full disk, a closed file) is no
 * answer: said on stderr, and the exit status is not 0. */
static int output_checked(int rc)
{
	errno = 0;
	if (fflush(stdout) == 0 && !ferror(stdout))
		return rc;
	fprintf(stderr, "nxctl: cannot write the output%s%s\n", errno ? ": " : "", errno ? strerror(errno) : "");
	return rc == NXC_EXIT_OK ? NXC_EXIT_ERROR : rc;
}

int main(int argc, char **argv)
{
	struct nxc_ctx ctx;
	memset(&ctx, 0, sizeof(ctx));
	int i = 1;
	/* Global options come before the command. */
	while (i < argc && argv[i][0] == '-') {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			main_usage(stdout);
			return NXC_EXIT_OK;
		} else if (!strcmp(a, "--version") || !strcmp(a, "-V")) {
			printf("nxctl %s (protocol %d)\n", NX_VERSION, NXP_VERSION);
			return NXC_EXIT_OK;
		} else if (!strcmp(a, "--socket") || !strcmp(a, "-s")) {
			if (i + 1 >= argc)
				return nxc_usage_err(NULL, "%s needs a PATH", a);
			ctx.socket = argv[++i];
		} else if (!strncmp(a, "--socket=", 9)) {
			ctx.socket = a + 9;
		} else {
			return nxc_usage_err(NULL, "unknown option '%s'", a);
		}
		if (!*ctx.socket)
			return nxc_usage_err(NULL, "--socket wants a path, got ''");
		i++;
	}
	if (i >= argc) {
		main_usage(stderr);
		return NXC_EXIT_USAGE;
	}
	for (size_t k = 0; k < sizeof(commands) / sizeof(commands[0]); k++)
		if (!strcmp(argv[i], commands[k].name))
			return output_checked(commands[k].run(&ctx, argc - i, argv + i));
	return nxc_usage_err(NULL, "unknown command '%s'", argv[i]);
}
