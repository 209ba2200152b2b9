/* proto.h - the nxd wire protocol: newline-delimited JSON requests parsed into
 * structs, and events encoded into lines (docs/protocol.md is the spec).
 *
 * Parsing (nxp_parse) allocates: the request owns copies of its strings and
 * arrays until nxp_request_free. Encoding never allocates: every nxp_enc_*
 * works like snprintf - it writes at most cap bytes (always NUL-terminated
 * when cap > 0) and returns the length the whole line needs, trailing '\n'
 * included, NUL excluded; a return value >= cap means the line was cut and
 * must be encoded again into a larger buffer. The *_alloc variants return a
 * malloc'd line for the rare big events (non-streamed done, tokens); the
 * LoRA events (proto/lora_events.c) come only as malloc'd lines. */
#ifndef NXP_PROTO_H
#define NXP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sample/sampler.h"

struct nx_grammar;

#define NXP_VERSION        1
#define NXP_MAX_LINE       ((size_t)1 << 20) /* default request line limit (bytes, '\n' excluded) */
#define NXP_ID_MAX         256               /* JSON text of an id, NUL included */
#define NXP_MAX_STOP       8                 /* stop strings per request */
#define NXP_MAX_STOP_LEN   256               /* bytes per stop string */
#define NXP_MAX_LOGPROBS   NX_SAMPLE_MAX_LOGPROBS
#define NXP_MAX_MESSAGES   4096
#define NXP_MAX_LORA       8
#define NXP_MAX_LORA_NAME  128               /* bytes */
#define NXP_DEFAULT_MAX_TOKENS 256
#define NXP_MAX_LORA_PATH  4095              /* bytes */
#define NXP_MAX_FOLD_TYPES 8                 /* lora_report "types" */
#define NXP_MAX_TYPE_NAME  16                /* "keep", "f16", "q8_0"... NUL included */
#define NXP_MAX_LAYERS     1024              /* lora_report "layers": ids 0..1023 (the daemon checks n_layer) */
#define NXP_MAX_DEPTH      1024              /* levels of arrays and objects, the request itself the first */
#define NXP_MAX_TOOLS      128               /* tools offered per request */
#define NXP_MAX_TOOL_NAME  64                /* bytes of a tool's name, [A-Za-z0-9_-] */
#define NXP_MAX_TOOL_CALLS 128               /* calls per assistant message */
#define NXP_MAX_SPEC_K     16                /* "speculate.k": drafted tokens per step at most */

/* Operations. NXP_OP_NONE is what a zeroed request holds (safe to free).
 * Adding an op: an enum entry here, a member in nxp_request's union, an entry
 * (name, parser) in the op table of proto.c and its case in nxp_request_free. */
enum nxp_op {
	NXP_OP_NONE = 0,
	NXP_OP_HELLO,
	NXP_OP_GENERATE,
	NXP_OP_TOKENIZE,
	NXP_OP_DETOKENIZE,
	NXP_OP_STATUS,
	NXP_OP_CANCEL,
	NXP_OP_LORA_LOAD,
	NXP_OP_LORA_LIST,
	NXP_OP_LORA_UNLOAD,
	NXP_OP_LORA_FOLD,
	NXP_OP_LORA_UNFOLD,
	NXP_OP_LORA_REPORT,
	NXP_OP_SHUTDOWN,   /* admin only (daemon/access.c) */
};

/* Stable error codes; nxp_code_name gives the wire string ("bad_request"...). */
enum nxp_code {
	NXP_E_PARSE_ERROR = 0,     /* not JSON, or not an object */
	NXP_E_TOO_LARGE,           /* line longer than the limit */
	NXP_E_BAD_REQUEST,         /* missing or wrong-typed field, conflicting fields */
	NXP_E_UNKNOWN_OP,
	NXP_E_OUT_OF_RANGE,        /* a number or a length outside its range */
	NXP_E_CONTEXT_OVERFLOW,    /* the prompt does not fit the context */
	NXP_E_BUSY,                /* queue full */
	NXP_E_NOT_FOUND,           /* cancel target, adapter... */
	NXP_E_FORBIDDEN,
	NXP_E_SHUTTING_DOWN,
	NXP_E_UNSUPPORTED_VERSION,
	NXP_E_INTERNAL,
	NXP_E_INVALID_TOOL_CALL,   /* tool_choice asked for a call and the model's answer is not a valid one */
	NXP_E_COUNT
};

const char *nxp_code_name(enum nxp_code code);

struct nxp_error {
	enum nxp_code code;
	char msg[512]; /* names the field and the value: "field 'max_tokens' must be in 1..4096, got 0" */
};

/* What the parser checks numbers against. Zero fields mean "no limit known"
 * except max_line (0 -> NXP_MAX_LINE) and max_tokens (0 -> n_ctx, or
 * INT32_MAX when n_ctx is 0 too). */
struct nxp_limits {
	int n_vocab;      /* token ids must be < n_vocab */
	int n_ctx;        /* a "tokens" prompt longer than this is context_overflow */
	int max_tokens;   /* upper bound of "max_tokens" */
	size_t max_line;  /* longer lines are too_large */
};

// --- requests

enum nxp_input { NXP_IN_PROMPT, NXP_IN_MESSAGES, NXP_IN_TOKENS };
enum nxp_role { NXP_ROLE_SYSTEM, NXP_ROLE_USER, NXP_ROLE_ASSISTANT, NXP_ROLE_TOOL };

const char *nxp_role_name(enum nxp_role role);

struct nxp_message {
	enum nxp_role role;
	char *content; /* owned, valid UTF-8 without NUL (jansson guarantees both); NULL only for an
			  assistant message of tool calls alone */
	char *tool_calls; /* assistant: owned JSON text [{"id","name","arguments":{...}}, ...], or NULL */
	char *tool_call_id; /* tool: owned, or NULL */
};

/* tool_choice (docs/protocol.md, "Tools"). */
enum nxp_tool_choice { NXP_TOOLS_AUTO, NXP_TOOLS_NONE, NXP_TOOLS_REQUIRED, NXP_TOOLS_NAMED };

struct nxp_lora_ref {
	char *name;    /* owned */
	float scale;   /* default 1.0, finite */
	bool has_scale; /* "scale" was given (else the daemon uses the adapter's load scale) */
};

enum nxp_think { NXP_THINK_DEFAULT, NXP_THINK_OFF, NXP_THINK_ON };

/* Speculative decoding of a generate ("speculate", docs/protocol.md). */
enum nxp_spec_mode {
	NXP_SPEC_DEFAULT, /* no "speculate.mode": the daemon's --speculate */
	NXP_SPEC_OFF,
	NXP_SPEC_PROMPT,  /* drafts by prompt lookup: n-grams of the request's own prompt and output */
	NXP_SPEC_DRAFT,   /* drafts by the daemon's draft model (nxd --draft-model), greedily */
};

const char *nxp_spec_mode_name(enum nxp_spec_mode m);
/* "off" / "prompt" / "draft" -> *m; false for anything else. */
bool nxp_spec_mode_parse(const char *s, enum nxp_spec_mode *m);

struct nxp_generate {
	enum nxp_input input;
	char *prompt;                 /* NXP_IN_PROMPT: owned */
	bool raw;                     /* prompt used as is, without the chat template */
	char *system;                 /* optional system text (prompt mode, not raw); owned or NULL */
	enum nxp_think think;         /* "think": the chat template's thinking switch (default: not given) */
	struct nxp_message *messages; /* NXP_IN_MESSAGES: (n_messages) owned */
	int n_messages;
	int32_t *tokens;              /* NXP_IN_TOKENS: (n_tokens) owned, each in [0, n_vocab) */
	int n_tokens;
	int max_tokens;               /* 1..limit */
	/* Starts from nx_sample_params_default() and passed nx_sample_params_check;
	 * n_logprobs is the request's "logprobs" (0..20). */
	struct nx_sample_params sampling;
	bool has_seed;                /* no "seed": the daemon picks one */
	char *stop[NXP_MAX_STOP];     /* owned, each 1..NXP_MAX_STOP_LEN bytes */
	int n_stop;
	bool ignore_eos;
	bool stream;                  /* default true */
	struct nxp_lora_ref *lora;    /* (n_lora) owned */
	int n_lora;
	/* tools (proto/tools.c): the tool objects offered, as owned compact JSON
	 * text of an array ({"type": "function", "function": {...}}), or NULL */
	char *tools;
	enum nxp_tool_choice tool_choice; /* AUTO unless given; given only with tools */
	char tool_name[NXP_MAX_TOOL_NAME + 1]; /* NXP_TOOLS_NAMED: the tool */
	bool parallel_tool_calls;     /* default true */
	enum nxp_spec_mode spec_mode; /* "speculate.mode" */
	int spec_k;                   /* "speculate.k": 1..NXP_MAX_SPEC_K, 0: the daemon's */
	/* Constrained decoding: "format" or "grammar", compiled (owned; the
	 * daemon takes it over), NULL when neither was given. */
	enum nxp_format { NXP_FMT_NONE, NXP_FMT_JSON, NXP_FMT_SCHEMA, NXP_FMT_GRAMMAR } format;
	struct nx_grammar *grammar;
};

struct nxp_tokenize {
	char *text;    /* owned */
	bool special;  /* parse special-token text (e.g. "<|im_start|>") as special tokens */
	int add_bos;   /* -1 = the model's default, 0 = no, 1 = yes */
};

struct nxp_detokenize {
	int32_t *tokens; /* (n_tokens) owned, each in [0, n_vocab) */
	int n_tokens;
	bool special;    /* control tokens as their text (default), or dropped */
};

struct nxp_cancel {
	char target[NXP_ID_MAX]; /* JSON text of the target's id, comparable with nxp_request.id */
};

/* The adapter operations (docs/protocol.md, "LoRA adapters"). Only names
 * and shapes are checked here; the daemon checks against what is loaded. */
struct nxp_lora_op {
	char *name;                   /* owned; required by all but lora_list */
	char *path;                   /* lora_load: owned */
	float scale;                  /* lora_load / lora_fold / lora_report "scale" */
	bool has_scale;
	char type[NXP_MAX_TYPE_NAME]; /* lora_fold "type"; "" when absent (the daemon's default: keep) */
	bool dry_run;                 /* lora_fold: grade the fold, change nothing */
	char types[NXP_MAX_FOLD_TYPES][NXP_MAX_TYPE_NAME]; /* lora_report "types" */
	int n_types;
	char *prompt;                 /* lora_report / dry run: probe text; owned or NULL */
	int *layers;                  /* lora_report: (n_layers) owned, or NULL for all */
	int n_layers;
	bool checksum;                /* lora_list: add a checksum of the weights the workers see */
};

struct nxp_request {
	enum nxp_op op;
	/* The id as compact JSON text ("7", "\"a\\\"b\""), to be echoed verbatim
	 * and compared with strcmp. "null" when absent or unusable. Always set by
	 * nxp_parse, even when it fails, so the error event can carry it. */
	char id[NXP_ID_MAX];
	bool has_id;
	int version;   /* the request's "version", 0 when absent */
	union {
		struct nxp_generate gen;
		struct nxp_tokenize tok;
		struct nxp_detokenize detok;
		struct nxp_cancel cancel;
		struct nxp_lora_op lora;
	} u;
};

/* Parses one request line (len bytes; a trailing '\n' or "\r\n" is allowed).
 * On success fills *req and returns 0. On failure returns -1 with e->code and
 * e->msg set and req->id set (or "null") for the error event; *req still needs
 * nxp_request_free, which is always safe after nxp_parse. lim may be NULL
 * (no vocabulary/context checks). Unknown fields are ignored. */
int nxp_parse(const char *line, size_t len, const struct nxp_limits *lim, struct nxp_request *req,
	      struct nxp_error *e);
/* Frees what the request owns and zeroes it, except id, which stays valid so
 * an error or final event can still be addressed. Safe to call twice. */
void nxp_request_free(struct nxp_request *req);

// --- events (daemon -> client)

enum nxp_reason {
	NXP_DONE_EOS,        /* end-of-sequence token */
	NXP_DONE_LENGTH,     /* max_tokens reached, or the context is full */
	NXP_DONE_STOP,       /* a stop string matched (the text ends before it) */
	NXP_DONE_CANCELLED,  /* a cancel request, or the client went away */
	NXP_DONE_SHUTDOWN,   /* the daemon is stopping */
	NXP_DONE_TOOL_CALLS, /* the answer ended (eos, a stop string, or its one call with parallel_tool_calls false) with tool calls */
};

const char *nxp_reason_name(enum nxp_reason reason);

struct nxp_hello_info {
	const char *model;   /* model name (general.name, else the file name) */
	const char *arch;    /* "llama", "qwen2" */
	int n_ctx;
	int n_vocab;
	int max_tokens;      /* the largest "max_tokens" a request may ask for; 0: omitted */
};

struct nxp_logprob {
	int32_t token;
	const char *text;    /* piece bytes; may be a partial UTF-8 sequence (escaped as \ufffd) */
	size_t text_len;
	float logprob;       /* non-finite values are written as null */
};

/* A tool call the model made (docs/protocol.md, "Tools"). */
struct nxp_tool_call {
	const char *id;         /* "call_..." */
	const char *name;
	const char *arguments;  /* JSON text of the arguments object */
};

struct nxp_done {
	enum nxp_reason reason;
	const struct nxp_tool_call *tool_calls; /* (n_tool_calls), only for non-streamed requests; NULL to omit */
	int n_tool_calls;
	const char *text;       /* full text, only for non-streamed requests; NULL to omit */
	size_t text_len;
	const int32_t *tokens;  /* (n_tokens) generated ids, only for non-streamed requests; NULL to omit */
	int n_tokens;
	/* non-streamed requests that ask for logprobs, per token as its event would carry them: the
	 * token's own (lp_self[i]), then its alternatives lp_alts[lp_off[i] .. lp_off[i + 1]); NULL to omit */
	const struct nxp_logprob *lp_self, *lp_alts;
	const int *lp_off;      /* (n_tokens + 1) */
	int prompt_tokens;
	int cached_tokens;      /* of prompt_tokens, those whose K/V came from the prompt cache */
	int completion_tokens;
	double prefill_ms;
	double decode_ms;
	double tokens_per_s;    /* completion tokens / decode seconds */
	bool constrained;       /* a "format" or "grammar" request: "incomplete" is written */
	bool incomplete;        /* the text is not a complete document of the grammar */
	bool has_seed;          /* seed is written: the one the sampler used, so the answer can be asked for again */
	uint64_t seed;          /* 0..2^63-1, a JSON integer a request's "seed" accepts */
	bool speculated;        /* "speculate" is written: the request ran with speculation on */
	const char *spec_mode;  /* and by which drafts: "prompt" or "draft" (NULL: not written) */
	int spec_drafted;       /* draft tokens verified */
	int spec_accepted;      /* of those, the ones the model agreed with */
};

struct nxp_worker_status {
	int pid;
	int cpu;               /* pinned CPU, -1 if not pinned */
	const char *state;     /* "starting", "idle", "busy", "dead", "backoff"... */
	int restarts;
};

/* Filled by the daemon for the status event. */
struct nxp_status {
	const char *model;
	const char *arch;
	const char *type;      /* dominant weight type, e.g. "Q4_1" */
	const char *activations; /* "precise" or "fast" (nxd --activations) */
	const char *kv_type;   /* "f16" or "q8_0" (nxd --kv-type) */
	const char *chat_template; /* the template's name (tok/chat.h), "unknown" where nxd renders none */
	bool tools;            /* the template has a tool-call convention nxd renders */
	/* the kernel set each family of kernels runs (kern/cpu.h): family[i] runs kset[i] */
	const char *const *kernel_family, *const *kernel_set;
	int n_kernels;
	uint64_t kv_bytes;     /* the K and V caches of every slot, as laid out (filled page by page) */
	int n_ctx;
	int n_vocab;
	const struct nxp_worker_status *workers; /* (n_workers) */
	int n_workers;
	int slots_total;
	int slots_used;
	int queued;            /* requests waiting for a slot */
	uint64_t tokens_served;    /* prompt + completion tokens since start */
	uint64_t prompt_tokens_cached; /* prompt tokens taken from the prompt cache since start */
	double seqs_per_step_mean; /* sequences per step, recent window */
	int seqs_per_step_max;
	double tokens_per_s;       /* completion tokens per second, recent window */
	double uptime_s;
	uint64_t steps;            /* forward steps run */
	uint64_t steps_retried;    /* steps run again after a worker died */
	const char *spec_default;  /* the daemon's --speculate mode, "off", "prompt" or "draft" */
	int spec_k;                /* and its k */
	uint64_t spec_drafted;     /* draft tokens verified since start */
	uint64_t spec_accepted;    /* of those, accepted */
	/* the same by drafting source ([0] prompt lookup, [1] the draft model) */
	uint64_t spec_mode_drafted[2], spec_mode_accepted[2];
	const char *draft_model;   /* nxd --draft-model: its name; NULL: none loaded */
	uint64_t draft_steps;      /* the draft model's steps run */
	/* nxd with NXD_PROFILE=1: where a step's time goes, per phase (model/forward.h:
	 * nx_prof), in ms per step averaged over the workers; profile NULL: not profiled. */
	const double *profile_ms;        /* (n_profile) */
	const char *const *profile_names; /* (n_profile) plain ASCII names */
	int n_profile;
	uint64_t profile_steps;          /* steps counted (worker 0's count) */
};

/* id: JSON text from nxp_request.id; NULL writes "id":null (hello: omitted). */
size_t nxp_enc_hello(char *buf, size_t cap, const char *id, const struct nxp_hello_info *h);
/* The per-token event; lp may be NULL when n_lp is 0. Never allocates. */
size_t nxp_enc_token(char *buf, size_t cap, const char *id, int32_t token, const char *text,
		     size_t text_len, const struct nxp_logprob *lp, int n_lp);
/* The same, with the drawn token's own piece and log-probability ("piece",
 * "logprob") when self is not NULL: a request asking for logprobs gets them
 * even when the draw is not among the alternatives. */
size_t nxp_enc_token_lp(char *buf, size_t cap, const char *id, int32_t token, const char *text,
			size_t text_len, const struct nxp_logprob *self, const struct nxp_logprob *lp, int n_lp);
size_t nxp_enc_done(char *buf, size_t cap, const char *id, const struct nxp_done *d);
/* A streamed request's tool call, once complete: index counts its calls from 0. */
size_t nxp_enc_tool_call(char *buf, size_t cap, const char *id, int index, const struct nxp_tool_call *c);
char *nxp_enc_tool_call_alloc(const char *id, int index, const struct nxp_tool_call *c, size_t *len_out);
size_t nxp_enc_tokens(char *buf, size_t cap, const char *id, const int32_t *tokens, int n);
size_t nxp_enc_text(char *buf, size_t cap, const char *id, const char *text, size_t text_len);
size_t nxp_enc_status(char *buf, size_t cap, const char *id, const struct nxp_status *s);
size_t nxp_enc_ok(char *buf, size_t cap, const char *id);
size_t nxp_enc_error(char *buf, size_t cap, const char *id, enum nxp_code code, const char *msg);

/* malloc'd lines (NULL on out of memory); *len_out (may be NULL) gets the length. */
char *nxp_enc_done_alloc(const char *id, const struct nxp_done *d, size_t *len_out);
char *nxp_enc_tokens_alloc(const char *id, const int32_t *tokens, int n, size_t *len_out);
char *nxp_enc_text_alloc(const char *id, const char *text, size_t text_len, size_t *len_out);
char *nxp_enc_status_alloc(const char *id, const struct nxp_status *s, size_t *len_out);

/* Writes s[0..len) as a JSON string literal (quotes included) into buf, same
 * snprintf contract, no '\n'. Valid UTF-8 passes through, invalid bytes
 * become \ufffd, control characters are escaped. */
size_t nxp_json_str(char *buf, size_t cap, const char *s, size_t len);

/* Drops from s, in place, every byte that is not part of a valid UTF-8
 * sequence (as nxp_json_str judges them): what is left of a value cut at a
 * byte count ("%.64s") can then go into a JSON string. Returns s. */
char *nxp_utf8_scrub(char *s);

// --- LoRA events (proto/lora_events.c): malloc'd lines like the *_alloc above

struct json_t; /* jansson's */
/* "string", "integer"... of a JSON value for messages; "nothing" for NULL. */
const char *nxp_json_type(const struct json_t *v);
/* Every key of object o that is not null must be one of known (NULL-ended):
 * a field nxd does not implement is refused, naming it (where prefixes it:
 * "messages[2].") and what takes which fields, never ignored. 0 or -1. */
int nxp_only_fields(struct json_t *o, const char *where, const char *const *known, const char *what,
		    struct nxp_error *e);
struct json_error_t; /* jansson's */
/* What jansson's parse error je says, for a client: its own text, but for
 * the few that name jansson's flags (\u0000 in a string). */
const char *nxp_json_error(const struct json_error_t *je);

/* A fold in the stack (lora_folded; an adapter's "folded"). */
struct nxp_fold_info {
	const char *type;      /* "keep" (each matrix its own type) or a weight type's name */
	double scale;
	int order;             /* place in the fold stack, 1 = the first */
	double ms;             /* the fold's wall time */
	int tensors;           /* matrices folded (lora_folded only) */
	uint64_t bytes;        /* their arena bytes (lora_folded only) */
};

/* A loaded adapter (lora_loaded, lora_list). */
struct nxp_adapter_info {
	const char *name;
	const char *path;
	int rank;
	double alpha;
	bool rslora;
	int tensors;           /* adapted matrices */
	uint64_t bytes;        /* in the arena */
	double scale;          /* the load scale */
	const struct nxp_fold_info *fold; /* NULL: not folded */
	int in_use;            /* requests carrying it as a runtime delta */
	bool busy;             /* a job reads it */
};

/* The job running (lora_list's "job"). */
struct nxp_lora_job_info {
	const char *kind;      /* "load", "fold", "report" */
	const char *adapter;
	int64_t done, total;   /* progress units */
};

struct nxp_lora_list {
	const struct nxp_adapter_info *adapters; /* (n_adapters) */
	int n_adapters;
	const char *const *folds; /* (n_folds) adapter names, the first fold first */
	int n_folds;
	const char *checksum;  /* hex text of the weights' checksum, or NULL: omitted */
	const struct nxp_lora_job_info *job; /* NULL: none, omitted */
};

/* lora_report's "cost": a decode step with and without the runtime delta. */
struct nxp_lora_cost {
	double base_ms_per_token;
	double delta_ms_per_token;
	int64_t delta_flops_per_token;
	int threads;
	double grade_ms;
};

struct nxp_lora_report {
	const char *name;
	bool dry_run;
	const struct json_t *report; /* lora/probe.h nx_lora_report_json's object; not changed */
	const struct nxp_lora_cost *cost; /* added to the report as "cost", or NULL */
	const struct nxp_fold_info *fold; /* the adapter's fold, added as "folded" (type, ms), or NULL */
};

char *nxp_enc_lora_loaded_alloc(const char *id, const struct nxp_adapter_info *a, size_t *len_out);
char *nxp_enc_lora_list_alloc(const char *id, const struct nxp_lora_list *l, size_t *len_out);
char *nxp_enc_lora_folded_alloc(const char *id, const char *name, const struct nxp_fold_info *f, size_t *len_out);
char *nxp_enc_lora_unfolded_alloc(const char *id, const char *name, int tensors, size_t *len_out);
char *nxp_enc_lora_report_alloc(const char *id, const struct nxp_lora_report *r, size_t *len_out);
/* A job's progress: done of total units so far, stage its kind. */
char *nxp_enc_progress_alloc(const char *id, int64_t done, int64_t total, const char *stage, size_t *len_out);

// --- tools (proto/tools.c): parse_generate's and parse_messages' tool fields

struct json_t;
/* "tools", "tool_choice", "parallel_tool_calls" of a generate request. */
int nxp_parse_tools(struct json_t *o, struct nxp_generate *g, struct nxp_error *e);
/* messages[i]'s "tool_calls" (assistant) and "tool_call_id" (tool). */
int nxp_parse_message_tools(struct json_t *m, size_t i, struct nxp_message *msg, struct nxp_error *e);

// --- socket path

/* Where the system daemon listens (systemd/nxd.socket). */
#define NXP_SYSTEM_SOCKET "/run/nxd/nxd.sock"

/* The socket both nxd and nxctl use when none is given on the command line:
 * $NXD_SOCKET, else /run/nxd/nxd.sock for root (euid 0), else
 * $XDG_RUNTIME_DIR/nxd.sock, else /run/user/<uid>/nxd.sock.
 * Returns 0, or -1 when the path does not fit cap or sun_path (108 bytes). */
int nxp_default_socket_path(char *buf, size_t cap);

#endif
