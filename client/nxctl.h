/* nxctl.h - what the nxctl command files share: exit codes, the command table entry, the connection and event helpers. */
#ifndef NXCTL_H
#define NXCTL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* Exit codes (documented in `nxctl --help` and docs/protocol.md). */
enum {
	NXC_EXIT_OK = 0,
	NXC_EXIT_ERROR = 1,   /* an error event, or the daemon misbehaved / went away */
	NXC_EXIT_USAGE = 2,   /* bad command line */
	NXC_EXIT_NOCONN = 3,  /* cannot connect: the daemon is not running (or no access) */
	NXC_EXIT_INTR = 130,  /* interrupted by Ctrl-C */
};

struct nxc_ctx {
	const char *socket;   /* from --socket, or NULL: nxp_default_socket_path() */
	char socket_buf[256];
};

/* One entry per command: adding one is an entry in nxctl.c's table plus its function. */
struct nxc_cmd {
	const char *name;
	int (*run)(struct nxc_ctx *ctx, int argc, char **argv); /* argv[0] is the command name */
	const char *summary;  /* one line for `nxctl --help` */
	const char *usage;    /* full text for `nxctl CMD --help` */
};

int nxc_cmd_generate(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_chat(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_tokenize(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_detokenize(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_status(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_shutdown(struct nxc_ctx *ctx, int argc, char **argv);
extern const char nxc_usage_shutdown[];

extern const char nxc_usage_generate[], nxc_usage_chat[], nxc_usage_tokenize[],
	nxc_usage_detokenize[], nxc_usage_status[];

/* cmd_lora.c */
int nxc_cmd_lora_load(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_lora_list(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_lora_unload(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_lora_fold(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_lora_unfold(struct nxc_ctx *ctx, int argc, char **argv);
int nxc_cmd_lora_report(struct nxc_ctx *ctx, int argc, char **argv);
extern const char nxc_usage_lora_load[], nxc_usage_lora_list[], nxc_usage_lora_unload[], nxc_usage_lora_fold[],
	nxc_usage_lora_unfold[], nxc_usage_lora_report[];

// --- messages and argument helpers (nxctl.c)

/* "nxctl: ..." on stderr. */
void nxc_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "nxctl: CMD: ...", a hint to --help, and NXC_EXIT_USAGE (to return). */
int nxc_usage_err(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints usage text for --help and returns NXC_EXIT_OK. */
int nxc_help(const char *usage);

/* Strict numbers from flag values: the whole string must be the number. */
int nxc_parse_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
		  long long *out);
int nxc_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out);
int nxc_parse_double(const char *cmd, const char *flag, const char *s, double *out);

/* All of fd (stdin) as a NUL-terminated string, or NULL (message printed). */
char *nxc_read_all(int fd);
/* Removes one trailing line end ("\n" or "\r\n"). */
void nxc_chomp(char *s);

// --- terminal output (term.c)

/* Where model or server text is printed. On a terminal, control characters
 * are shown instead of obeyed, as less and cat -v show them: C0 and DEL in
 * caret notation (ESC ^[, BEL ^G, DEL ^?), C1 controls as <U+009B>, a byte
 * that is not UTF-8 as <FF>; '\n', '\t' and "\r\n" pass, a bare '\r' is
 * ^M. A JSON line (nxc_print_json) gets \u escapes for DEL and C1 instead,
 * so it still parses to the same value. Not a terminal, or after
 * nxc_term_raw: the bytes pass unchanged. State carries from one write to
 * the next, so a sequence cut between two events is still seen whole. */
struct nxc_term {
	int fd;               /* 1 or 2 */
	int filter;           /* -1 until the first write asks isatty */
	bool json;            /* writing a JSON line */
	bool cr;              /* a '\r' whose next byte is not known yet */
	unsigned char seq[4]; /* a UTF-8 sequence begun, need bytes long */
	size_t n_seq, need;
};
extern struct nxc_term nxc_stdout, nxc_stderr;

/* --raw-output: t's bytes pass unchanged even on a terminal. */
void nxc_term_raw(struct nxc_term *t);
void nxc_term_write(struct nxc_term *t, const char *s, size_t n);
/* The end of a text: what was held back (a '\r', part of a sequence) is shown. */
void nxc_term_end(struct nxc_term *t);
/* Formatted into nxc_stdout. */
void nxc_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A whole message into nxc_stderr. */
void nxc_eprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One JSON line and its '\n' into nxc_stdout. */
void nxc_print_json(const char *line, size_t len);
/* A line of nxctl's own about what happened (turns dropped, an answer cut)
 * on stderr: dim on a terminal (not with NO_COLOR or TERM=dumb), the text
 * still filtered. */
void nxc_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// --- generate and chat (cmd_generate.c)

/* The sampling flags' help, for generate and chat. */
#define NXC_SAMPLING_HELP                                                                              \
	"  -n, --max-tokens N     at most N tokens (default 256; past nxd's limit, its limit)\n"   \
	"  -t, --temp T           temperature (also --temperature), 0 = greedy (default 0.8)\n"                       \
	"      --top-k K          keep the K most likely tokens, 0 = off (default 40)\n"         \
	"      --top-p P          nucleus sampling mass in (0, 1] (default 0.95)\n"              \
	"      --min-p P          drop tokens below P x the best one's probability (default 0.05)\n" \
	"      --repeat-penalty R penalty on recent tokens, 1 = off (default 1.0)\n"             \
	"      --repeat-last-n N  how many recent tokens it looks at (default 64)\n"             \
	"      --seed S           random seed, 0..2^63-1 (default: a fresh one)\n"               \
	"      --stop STR         stop before STR (repeatable, at most 8)\n"                    \
	"      --ignore-eos       keep going past the end-of-sequence token\n"                  \
	"      --lora NAME[:SCALE] apply a loaded LoRA adapter to this request (repeatable)\n"   \
	"      --speculate MODE[:K] off, prompt or draft: speculative decoding, up to K drafts a step\n" \
	"                         (default: nxd's --speculate; the answer is the same)\n"      \
	"      --raw-output       write the text to a terminal as it is, control characters\n" \
	"                         and all (by default a terminal shows them: ESC as ^[, BEL\n" \
	"                         as ^G, U+009B as <U+009B>; pipes and files always get the\n" \
	"                         bytes unchanged)\n"


struct nxc_gen_args {
	json_t *params;       /* sampling and stop fields, copied into every request */
	const char *system;
	bool raw, json, tokens;
	bool raw_output;      /* --raw-output: no terminal filter on stdout */
	int n_stop;
	int first_arg;        /* argv index of the first PROMPT word */
};
/* The flags generate and chat share: 0, 1 after printing --help, another
 * value after a usage message. */
int nxc_gen_parse(const char *cmd, bool is_chat, int argc, char **argv, struct nxc_gen_args *ga);
/* "MODE" or "MODE:K" (--speculate, chat's /set speculate) as the request's
 * speculate object; NULL when MODE is not off, prompt or draft, or K is not
 * 1..NXP_MAX_SPEC_K. */
json_t *nxc_spec_value(const char *arg);
#define NXC_SPEC_RANGE "off, prompt or draft, or MODE:K with K in 1..16"

struct nxc_text {
	char *p;              /* NUL-terminated, or NULL while empty */
	size_t len, cap;
};
void nxc_text_add(struct nxc_text *b, const char *s, size_t n);

/* What came back for one generate. */
struct nxc_answer {
	struct nxc_text text; /* the answer as the model wrote it, whatever the terminal showed */
	json_t *done;         /* the done event, or NULL */
	json_t *error;        /* the error event, kept when keep_error (else printed) */
	bool keep_error;      /* in: the caller deals with an error event */
	bool hard;            /* a second Ctrl-C cut it short */
};
struct nxc_conn;
/* Sends req (stolen) as a new request and streams its events until done.
 * Returns an exit code; NXC_EXIT_INTR after a cancelled answer. */
int nxc_stream_answer(struct nxc_conn *c, json_t *req, bool json_mode, struct nxc_answer *ans);
void nxc_answer_free(struct nxc_answer *a);
/* For a done cut short (reason length), why: the context full, or
 * max_tokens; NULL otherwise. */
const char *nxc_cut_note(json_t *done, int n_ctx, char *buf, size_t cap);

// --- connection (conn.c)

/* Buffered reader of '\n'-terminated lines from a socket or stdin. */
struct nxc_reader {
	int fd;
	char *buf;
	size_t cap, start, end;
	size_t max;         /* longest line accepted */
	bool eof;
};

struct nxc_conn {
	int fd;
	const char *path;
	struct nxc_reader rd;
	int next_id;        /* request ids nxctl hands out: 1, 2, ... */
	bool broken;        /* a send or read failed, or nxd closed the connection */
};

/* Ctrl-C handling: SIGINT stays blocked except while waiting for input
 * (ppoll), so a Ctrl-C is never lost between a check and a blocking read. */
extern volatile sig_atomic_t nxc_interrupts;
void nxc_signals_init(void);
/* Waits until fd is readable, the one place SIGINT is let in: 0, -2 when a
 * signal came (check nxc_interrupts), -1 on error. */
int nxc_wait_input(int fd);

void nxc_reader_init(struct nxc_reader *r, int fd, size_t max);
void nxc_reader_free(struct nxc_reader *r);
/* 1: *line (NUL-terminated, '\n' removed, valid until the next call), 0: end
 * of input, -1: error (errno set; E2BIG for a line over max), -2: interrupted
 * by a signal (check nxc_interrupts). A last line without '\n' is returned. */
int nxc_read_line(struct nxc_reader *r, char **line, size_t *len);

/* Connects to ctx's socket and negotiates the protocol version (hello).
 * On failure prints the reason and returns NXC_EXIT_NOCONN or NXC_EXIT_ERROR;
 * 0 on success. hello_out (may be NULL) gets the hello event (caller decrefs). */
int nxc_open(struct nxc_ctx *ctx, struct nxc_conn *c, json_t **hello_out);
/* Whether the daemon closed the connection (or it broke): asked without
 * waiting, before a request that would otherwise go into a dead socket. */
bool nxc_peer_gone(struct nxc_conn *c);
void nxc_close(struct nxc_conn *c);

/* Sends one request (compact JSON + '\n'); steals req. 0 or -1 (message printed). */
int nxc_send(struct nxc_conn *c, json_t *req);

/* Next event: 1 with *ev (caller decrefs) and the raw line in *raw (valid until
 * the next call), 0 when the daemon closed the connection, -1 on error
 * (message printed), -2 when interrupted by a signal. */
int nxc_next_event(struct nxc_conn *c, json_t **ev, const char **raw);

/* The event's "event" field, or "" when absent. */
const char *nxc_ev_name(json_t *ev);
/* Whether ev's id equals the integer id (nxctl only uses integer ids). */
bool nxc_ev_is(json_t *ev, int id);
/* Prints an error event as "nxctl: <message> (<code>)". */
void nxc_print_error(json_t *ev);

// --- chat's input (line.c)

struct nxc_line {
	struct editline *el;  /* libedit on a terminal (stdin and stdout), else NULL */
	struct history *hist;
	char hist_path[4096]; /* PATH_MAX; "" without a history file */
	const char *prompt;
	bool tty;             /* stdin is a terminal */
	struct nxc_reader rd; /* without libedit: plain lines */
	char *buf;            /* the last edited line */
};
int nxc_line_open(struct nxc_line *l);
void nxc_line_close(struct nxc_line *l);
/* One line without its end: 1 with *line (valid until the next call), 0 at
 * the end of input (Ctrl-D), -2 after a Ctrl-C (the line is dropped), -1 on
 * error. Edited lines go into the history. */
int nxc_line_read(struct nxc_line *l, const char *prompt, char **line, size_t *len);

#endif
