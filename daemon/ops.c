/* ops.c - one request line: parse, check against the model's limits, answer (hello, status, tokenize, detokenize, cancel) or hand a generate to the scheduler. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include "common/splitmix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static void queue_alloc(struct nxd *d, struct nxd_conn *c, const char *id, char *line, size_t n)
{
	if (!line) {
		nxd_send_error(d, c, id, NXP_E_INTERNAL, "out of memory encoding the answer");
		return;
	}
	nxd_conn_queue(d, c, line, n);
	free(line);
}

/* ---------------------------------------------------------------- preparing (any thread) */

struct nxd_prep_ctx nxd_prep_ctx_of(const struct nxd *d)
{
	return (struct nxd_prep_ctx){
		.tok = d->model.tok,
		.tmpl = d->model.tmpl,
		.jinja = d->model.jinja,
		.max_piece = nx_tok_max_piece(d->model.tok),
		.lim = {
			.n_vocab = d->model.n_vocab,
			.n_ctx = d->o.n_ctx,
			.max_tokens = d->o.max_tokens ? d->o.max_tokens : d->o.n_ctx,
			.max_line = d->o.max_line,
		},
	};
}

static int prep_fail(struct nxd_prepared *p, enum nxp_code code, const char *what, const struct nx_err *err)
{
	struct nx_err e = *err;
	nx_err_prefix(&e, "%s", what);
	p->prep_rc = -1;
	p->prep_err.code = code;
	_Static_assert(sizeof(p->prep_err.msg) == sizeof(e.msg), "one message size");
	memcpy(p->prep_err.msg, e.msg, sizeof(e.msg));
	return -1;
}

/* Encodes text into a malloc'd token array (*out), growing once if needed. */
static int encode(const struct nx_tok *tk, const char *text, size_t len, bool special, bool add_bos, int32_t **out,
		  int *n_out, struct nx_err *err)
{
	size_t cap = len + 2, n = 0;
	int32_t *t = malloc(cap * sizeof(*t));
	if (!t)
		return nx_errf(err, "out of memory for %zu tokens", cap);
	size_t off = 0;
	int32_t bos = nx_tok_bos(tk);
	if (add_bos && bos >= 0)
		t[off++] = bos;
	if (nx_tok_encode(tk, text, len, special, t + off, cap - off, &n, err) < 0) {
		if (n <= cap - off) {
			free(t);
			return -1;
		}
		cap = n + off;
		int32_t *p = realloc(t, cap * sizeof(*t));
		if (!p) {
			free(t);
			return nx_errf(err, "out of memory for %zu tokens", cap);
		}
		t = p;
		if (nx_tok_encode(tk, text, len, special, t + off, cap - off, &n, err) < 0) {
			free(t);
			return -1;
		}
	}
	/* A template that writes BOS as text (Llama 2/3) must not get a second one. */
	if (off && n > 0 && t[off] == bos) {
		memmove(t, t + off, n * sizeof(*t));
		off = 0;
	}
	*out = t;
	*n_out = (int)(n + off);
	return 0;
}

/* Bytes of text the prompt carries before the template adds its own. */
static size_t prompt_bytes(const struct nxp_generate *g)
{
	size_t n = 0;
	if (g->input == NXP_IN_PROMPT)
		n = strlen(g->prompt) + (g->system && !g->raw ? strlen(g->system) : 0);
	else if (g->input == NXP_IN_MESSAGES)
		for (int i = 0; i < g->n_messages; i++)
			n += (g->messages[i].content ? strlen(g->messages[i].content) : 0) +
			     (g->messages[i].tool_calls ? strlen(g->messages[i].tool_calls) : 0);
	if (g->tools && g->tool_choice != NXP_TOOLS_NONE)
		n += strlen(g->tools);
	return n;
}

/* The tools a generate offers, once the template is known to have a
 * convention for them: the prefix that makes the answer start as a call
 * (tool_choice required or named), the grammar that holds the rest of that
 * call to its tool's schema, and the reader of its calls. */
static int prep_tools(const struct nxd_prep_ctx *x, const struct nxp_generate *g, char **prefix,
		      struct nx_grammar **call_grammar, struct nx_toolp **reader, struct nx_err *err)
{
	*prefix = NULL;
	*call_grammar = NULL;
	*reader = NULL;
	if (!g->tools || g->tool_choice == NXP_TOOLS_NONE)
		return 0;
	if (g->input == NXP_IN_TOKENS || g->raw)
		return nx_errf(err, "tools are offered through the chat template: send 'messages' or a prompt without "
			       "\"raw\"");
	enum nx_tool_style style = nx_chat_tool_style(x->tmpl, x->jinja);
	if (style == NX_TOOLS_NONE)
		return nx_errf(err, "field 'tools': the model's chat template (%s) has no tool-call convention nxd knows: "
			       "tools are rendered for Llama 3.1-3.3 (llama3.1) and Qwen2.5 / Qwen3 templates only",
			       nx_chat_tmpl_name(x->tmpl));
	json_error_t je;
	json_t *tools = json_loads(g->tools, 0, &je);
	enum nx_tool_choice choice = g->tool_choice == NXP_TOOLS_REQUIRED ? NX_TOOL_REQUIRED :
				     g->tool_choice == NXP_TOOLS_NAMED ? NX_TOOL_NAMED : NX_TOOL_AUTO;
	int rc = 0;
	if (!tools)
		rc = nx_errf(err, "out of memory");
	/* A call that must be made is checked against its tool's schema: a
	 * schema nxd cannot check is refused now, not after the answer. */
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters");
		const char *name = json_string_value(json_object_get(fn, "name"));
		char at[64];
		snprintf(at, sizeof(at), "tools[%zu].function.parameters", i);
		if (rc == 0 && params && (choice == NX_TOOL_REQUIRED || (choice == NX_TOOL_NAMED && !strcmp(name, g->tool_name))) &&
		    nx_tool_schema_check(params, at, err) < 0)
			rc = nx_err_prefix(err, "tool '%s': tool_choice asks for a call, whose arguments nxd checks", name);
	}
	/* The call's arguments follow the prefix: the grammar holds them (and,
	 * for "required", the name before them) to the called tool's schema as
	 * they are sampled; a schema it cannot hold them to is refused naming
	 * the tool. The reader's check after the call stays the last word. */
	if (rc == 0 && choice != NX_TOOL_AUTO && !(*prefix = nx_tool_prefix(style, choice == NX_TOOL_NAMED ? g->tool_name : NULL)))
		rc = nx_errf(err, "out of memory");
	char *gbnf = NULL;
	if (rc == 0 && nx_tool_grammar(style, tools, choice, g->tool_name, &gbnf, err) < 0)
		rc = -1;
	if (rc == 0 && gbnf && nx_grammar_compile(gbnf, strlen(gbnf), call_grammar, err) < 0)
		rc = nx_err_prefix(err, "the grammar of the call tool_choice asks for");
	free(gbnf);
	uint64_t seed = 0;
	if (rc == 0 && getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != sizeof(seed))
		seed = (uint64_t)(uintptr_t)g ^ 0x9e3779b97f4a7c15ull;
	if (rc == 0 && !(*reader = calloc(1, sizeof(**reader))))
		rc = nx_errf(err, "out of memory");
	if (rc == 0 && nx_toolp_init(*reader, style, tools, choice, g->tool_name, g->parallel_tool_calls, *prefix, seed,
				     err) < 0) {
		free(*reader);
		*reader = NULL;
		rc = -1;
	}
	json_decref(tools);
	if (rc) {
		free(*prefix);
		*prefix = NULL;
		nx_grammar_free(*call_grammar);
		*call_grammar = NULL;
	}
	return rc;
}

/* The prompt's tokens: chat template (unless raw or given as tokens), then
 * the tokenizer with special tokens parsed, BOS where the model wants one. */
static int prompt_tokens(const struct nxd_prep_ctx *x, const struct nxp_generate *g, int32_t **out, int *n_out,
			 struct nx_grammar **call_grammar, struct nx_toolp **reader, struct nx_err *err)
{
	const struct nx_tok *tk = x->tok;
	char *prefix = NULL;
	*reader = NULL;
	if (prep_tools(x, g, &prefix, call_grammar, reader, err) < 0)
		return -1;
	if (g->input == NXP_IN_TOKENS) {
		*out = malloc(((size_t)g->n_tokens + 1) * sizeof(int32_t));
		if (!*out)
			return nx_errf(err, "out of memory");
		memcpy(*out, g->tokens, (size_t)g->n_tokens * sizeof(int32_t));
		*n_out = g->n_tokens;
		return 0;
	}
	char *text = NULL;
	int rc;
	if (g->input == NXP_IN_PROMPT && g->raw) {
		rc = encode(tk, g->prompt, strlen(g->prompt), true, nx_tok_add_bos(tk), out, n_out, err);
		return rc;
	}
	struct nx_chat_turn *msgs = calloc((size_t)(g->input == NXP_IN_MESSAGES ? g->n_messages : 2), sizeof(*msgs));
	int n = 0;
	if (!msgs) {
		free(prefix);
		return nx_errf(err, "out of memory");
	}
	if (g->input == NXP_IN_PROMPT) {
		if (g->system)
			msgs[n++] = (struct nx_chat_turn){ "system", g->system, NULL, NULL };
		msgs[n++] = (struct nx_chat_turn){ "user", g->prompt, NULL, NULL };
	} else {
		for (int i = 0; i < g->n_messages; i++)
			msgs[n++] = (struct nx_chat_turn){ nxp_role_name(g->messages[i].role), g->messages[i].content,
							   g->messages[i].tool_calls, g->messages[i].tool_call_id };
	}
	struct nx_chat_opts co = {
		.add_generation_prompt = true,
		.thinking = g->think == NXP_THINK_OFF  ? NX_CHAT_THINK_OFF
			    : g->think == NXP_THINK_ON ? NX_CHAT_THINK_ON
						       : NX_CHAT_THINK_DEFAULT,
	};
	rc = nx_chat_render_turns(x->tmpl, x->jinja, msgs, n, *reader ? g->tools : NULL, prefix, &co, &text, err);
	free(msgs);
	free(prefix);
	if (rc < 0)
		return -1;
	rc = encode(tk, text, strlen(text), true, nx_tok_add_bos(tk), out, n_out, err);
	free(text);
	return rc;
}

static void prep_generate(const struct nxd_prep_ctx *x, struct nxd_prepared *p)
{
	const struct nxp_generate *g = &p->q.u.gen;
	struct nx_err err = {{0}};
	/* The cheap check first: every token is at most max_piece bytes of the
	 * text, so more bytes than n_ctx such tokens cannot fit, and a megabyte
	 * prompt is refused without a megabyte of tokenizer work. */
	size_t bytes = prompt_bytes(g);
	if (x->max_piece > 0 && bytes / x->max_piece >= (size_t)x->lim.n_ctx) {
		p->prep_rc = -1;
		p->prep_err.code = NXP_E_CONTEXT_OVERFLOW;
		snprintf(p->prep_err.msg, sizeof(p->prep_err.msg),
			 "the prompt is %zu bytes, at least %zu tokens; the context holds %d, and at least one position "
			 "must be left to generate", bytes, bytes / x->max_piece, x->lim.n_ctx);
		return;
	}
	if (prompt_tokens(x, g, &p->toks, &p->n_toks, &p->call_grammar, &p->tools, &err) < 0)
		prep_fail(p, NXP_E_BAD_REQUEST, "prompt", &err);
}

static void prep_tokenize(const struct nxd_prep_ctx *x, struct nxd_prepared *p)
{
	const struct nxp_tokenize *t = &p->q.u.tok;
	struct nx_err err = {{0}};
	bool bos = t->add_bos < 0 ? nx_tok_add_bos(x->tok) : t->add_bos == 1;
	if (encode(x->tok, t->text, strlen(t->text), t->special, bos, &p->toks, &p->n_toks, &err) < 0)
		prep_fail(p, NXP_E_BAD_REQUEST, "tokenize", &err);
	else /* the answer depends on nothing the loop holds: a megabyte of JSON is encoded here too */
		p->answer = nxp_enc_tokens_alloc(p->q.id, p->toks, p->n_toks, &p->answer_len);
}

static void prep_detokenize(const struct nxd_prep_ctx *x, struct nxd_prepared *p)
{
	const struct nxp_detokenize *dt = &p->q.u.detok;
	struct nx_err err = {{0}};
	size_t cap = (size_t)dt->n_tokens * 16 + 16, n = 0;
	const unsigned flags = NX_DETOK_STRIP | (dt->special ? NX_DETOK_SPECIAL : 0);
	char *text = malloc(cap);
	if (!text) {
		nx_errf(&err, "out of memory");
		prep_fail(p, NXP_E_INTERNAL, "detokenize", &err);
		return;
	}
	if (nx_tok_decode(x->tok, dt->tokens, (size_t)dt->n_tokens, flags, text, cap, &n, &err) < 0) {
		if (n > cap) {
			char *q = realloc(text, n);
			if (q) {
				text = q;
				cap = n;
			}
		}
		if (n > cap ||
		    nx_tok_decode(x->tok, dt->tokens, (size_t)dt->n_tokens, flags, text, cap, &n, &err) < 0) {
			free(text);
			prep_fail(p, NXP_E_BAD_REQUEST, "detokenize", &err);
			return;
		}
	}
	p->text = text;
	p->text_len = n;
	p->answer = nxp_enc_text_alloc(p->q.id, p->text, p->text_len, &p->answer_len);
}

void nxd_prepare(const struct nxd_prep_ctx *x, struct nxd_prepared *p, const char *line, size_t len)
{
	memset(p, 0, sizeof(*p));
	/* Blank lines (a client's "\r\n" keep-alive) are not requests. */
	size_t body = len;
	while (body && (line[body - 1] == '\n' || line[body - 1] == '\r'))
		body--;
	if (body == 0) {
		p->blank = true;
		return;
	}
	p->parse_rc = nxp_parse(line, len, &x->lim, &p->q, &p->parse_err);
	if (p->parse_rc < 0)
		return;
	switch (p->q.op) {
	case NXP_OP_GENERATE: prep_generate(x, p); break;
	case NXP_OP_TOKENIZE: prep_tokenize(x, p); break;
	case NXP_OP_DETOKENIZE: prep_detokenize(x, p); break;
	default: break;
	}
	/* Their answers depend on nothing the loop holds: encoded here too, a
	 * megabyte of JSON for a megabyte of text. */
	if (p->prep_rc < 0)
		return;
	switch (p->q.op) {
	case NXP_OP_TOKENIZE: p->answer = nxp_enc_tokens_alloc(p->q.id, p->toks, p->n_toks, &p->answer_len); break;
	case NXP_OP_DETOKENIZE: p->answer = nxp_enc_text_alloc(p->q.id, p->text, p->text_len, &p->answer_len); break;
	default: break;
	}
}

void nxd_prepared_free(struct nxd_prepared *p)
{
	nxp_request_free(&p->q);
	free(p->toks);
	free(p->text);
	free(p->answer);
	if (p->tools)
		nx_toolp_free(p->tools);
	free(p->tools);
	p->tools = NULL;
	nx_grammar_free(p->call_grammar);
	p->call_grammar = NULL;
	p->toks = NULL;
	p->text = NULL;
	p->answer = NULL;
}

/* ---------------------------------------------------------------- answering (the loop) */

static uint64_t fresh_seed(struct nxd *d)
{
	static uint64_t base;
	if (!base && getrandom(&base, sizeof(base), GRND_NONBLOCK) != sizeof(base))
		base = (uint64_t)nxd_now() * 0x9e3779b97f4a7c15ull ^ (uint64_t)d->pid;
	uint64_t x = base + 0x9e3779b97f4a7c15ull * d->seed_ctr++; /* the next value of base's splitmix64 stream */
	return nx_splitmix64(&x) >> 1; /* 0..2^63-1: the done event reports it, a request can send it back */
}

static void op_generate(struct nxd *d, struct nxd_conn *c, struct nxd_prepared *p)
{
	struct nxp_request *q = &p->q;
	struct nxp_generate *g = &q->u.gen;
	struct nxd_req *r = calloc(1, sizeof(*r));
	if (!r) {
		nxd_send_error(d, c, q->id, NXP_E_INTERNAL, "out of memory");
		return;
	}
	r->slot = -1;
	r->seq = ++d->req_seq;
	r->t_arrive = nxd_now();
	snprintf(r->id, sizeof(r->id), "%s", q->id);
	if (g->n_lora > 0 && nxd_lora_resolve(d, c, g, r) < 0) {
		nxd_req_free(r);
		return;
	}
	if (p->prep_rc < 0) {
		nxd_send_error(d, c, q->id, p->prep_err.code, "%s", p->prep_err.msg);
		nxd_req_free(r);
		return;
	}
	r->prompt = p->toks; /* taken over */
	r->n_prompt = p->n_toks;
	p->toks = NULL;
	if (r->n_prompt == 0) {
		nxd_send_error(d, c, q->id, NXP_E_BAD_REQUEST, "the prompt is empty (no tokens)");
		nxd_req_free(r);
		return;
	}
	if (r->n_prompt >= d->o.n_ctx) {
		nxd_send_error(d, c, q->id, NXP_E_CONTEXT_OVERFLOW,
			       "the prompt is %d tokens; the context holds %d, and at least one position must be left to generate",
			       r->n_prompt, d->o.n_ctx);
		nxd_req_free(r);
		return;
	}
	r->max_tokens = g->max_tokens;
	r->sp = g->sampling;
	if (!g->has_seed)
		r->sp.seed = fresh_seed(d);
	r->ignore_eos = g->ignore_eos;
	r->stream = g->stream;
	const enum nxp_spec_mode sm = g->spec_mode == NXP_SPEC_DEFAULT ? d->o.spec_mode : g->spec_mode;
	if (sm == NXP_SPEC_DRAFT && !nxd_draft_loaded(d)) {
		nxd_send_error(d, c, q->id, NXP_E_BAD_REQUEST,
			       "field 'speculate.mode': \"draft\" needs a draft model, and this daemon has none: start nxd with "
			       "--draft-model PATH, or use mode \"prompt\"");
		nxd_req_free(r);
		return;
	}
	r->spec_k = sm == NXP_SPEC_PROMPT || sm == NXP_SPEC_DRAFT ? (g->spec_k ? g->spec_k : d->o.spec_k) : 0;
	r->spec_mode = sm;
	for (int i = 0; i < g->n_stop; i++) {
		r->stop[i] = g->stop[i];
		g->stop[i] = NULL; /* taken over */
	}
	r->n_stop = g->n_stop;
	g->n_stop = 0;
	r->tools = p->tools; /* taken over */
	p->tools = NULL;
	if (g->grammar) {
		struct nx_err err = {{0}};
		struct nx_grammar *gr = g->grammar;
		g->grammar = NULL; /* the matcher takes it over */
		if (nx_gmatch_new(gr, d->model.trie, &r->gm, &err) < 0) {
			nxd_send_error(d, c, q->id, NXP_E_BAD_REQUEST, "field '%s': %s",
				       g->format == NXP_FMT_GRAMMAR ? "grammar" : "format", err.msg);
			nxd_req_free(r);
			return;
		}
	} else if (p->call_grammar) {
		struct nx_err err = {{0}};
		struct nx_grammar *gr = p->call_grammar;
		p->call_grammar = NULL; /* the matcher takes it over */
		if (nx_gmatch_new(gr, d->model.trie, &r->gm, &err) < 0) {
			nxd_send_error(d, c, q->id, NXP_E_INTERNAL, "field 'tool_choice': the call's grammar: %s", err.msg);
			nxd_req_free(r);
			return;
		}
	}
	if (!r->stream) {
		r->gen_toks = malloc((size_t)r->max_tokens * sizeof(int32_t));
		if (r->gen_toks && r->sp.n_logprobs > 0) {
			r->lp_self = malloc((size_t)r->max_tokens * sizeof(*r->lp_self));
			r->lp_off = calloc((size_t)r->max_tokens + 1, sizeof(*r->lp_off));
			if (!r->lp_self || !r->lp_off) {
				free(r->gen_toks);
				r->gen_toks = NULL;
			}
		}
		if (!r->gen_toks) {
			nxd_send_error(d, c, q->id, NXP_E_INTERNAL, "out of memory for %d tokens", r->max_tokens);
			nxd_req_free(r);
			return;
		}
	}
	r->conn = c;
	nxd_debug("client %d: generate %s: %d prompt tokens, max %d", c->idx, r->id, r->n_prompt, r->max_tokens);
	nxd_sched_submit(d, r);
}

static void op_tokenize(struct nxd *d, struct nxd_conn *c, struct nxd_prepared *p)
{
	if (p->prep_rc < 0) {
		nxd_send_error(d, c, p->q.id, p->prep_err.code, "%s", p->prep_err.msg);
		return;
	}
	queue_alloc(d, c, p->q.id, p->answer, p->answer_len);
	p->answer = NULL; /* freed by queue_alloc */
}

static void op_detokenize(struct nxd *d, struct nxd_conn *c, struct nxd_prepared *p)
{
	if (p->prep_rc < 0) {
		nxd_send_error(d, c, p->q.id, p->prep_err.code, "%s", p->prep_err.msg);
		return;
	}
	queue_alloc(d, c, p->q.id, p->answer, p->answer_len);
	p->answer = NULL; /* freed by queue_alloc */
}

static void op_status(struct nxd *d, struct nxd_conn *c, struct nxp_request *q)
{
	struct nxp_status st;
	struct nxp_worker_status *ws = calloc((size_t)d->n_workers, sizeof(*ws));
	if (!ws) {
		nxd_send_error(d, c, q->id, NXP_E_INTERNAL, "out of memory");
		return;
	}
	nxd_sched_status(d, &st, ws);
	/* The workers' counters are theirs to write: only shown, never trusted. */
	double prof_ms[NX_PROF_N + 1];
	static const char *prof_names[NX_PROF_N + 1];
	st.profile_ms = NULL;
	st.profile_names = prof_names;
	st.n_profile = 0;
	st.profile_steps = 0;
	if (d->shm.prof) {
		const uint64_t steps = d->shm.prof[0].steps;
		for (int p = 0; p < NX_PROF_N; p++) {
			double sum = 0;
			for (int i = 0; i < d->n_workers; i++)
				sum += (double)d->shm.prof[i].ticks[p];
			prof_names[p] = nx_prof_name(p);
			prof_ms[p] = steps ? sum * nx_prof_tick_ns() * 1e-6 / d->n_workers / (double)steps : 0;
		}
		/* and the workers' wait for the next step (sched.c prof_turn) */
		prof_names[NX_PROF_N] = "supervisor";
		prof_ms[NX_PROF_N] = d->prof_turns ? (double)d->prof_turn_ticks * nx_prof_tick_ns() * 1e-6 / (double)d->prof_turns : 0;
		st.profile_ms = prof_ms;
		st.n_profile = NX_PROF_N + 1;
		st.profile_steps = steps;
	}
	size_t len;
	char *line = nxp_enc_status_alloc(q->id, &st, &len);
	free(ws);
	queue_alloc(d, c, q->id, line, len);
}

/* Operations that change what every client gets (docs/reliability.md 25), and the
 * background jobs that share the daemon's one job thread and its CPUs with
 * them (a report, or a dry-run fold, grades the model in service for
 * seconds): only for admins (access.c), so no other client can keep an
 * admin's fold `busy` or slow everyone's streams. */
static bool is_admin_op(enum nxp_op op)
{
	return op == NXP_OP_LORA_LOAD || op == NXP_OP_LORA_UNLOAD || op == NXP_OP_LORA_FOLD ||
	       op == NXP_OP_LORA_UNFOLD || op == NXP_OP_LORA_REPORT || op == NXP_OP_SHUTDOWN;
}

static const char *admin_op_name(enum nxp_op op)
{
	switch (op) {
	case NXP_OP_LORA_LOAD: return "lora_load";
	case NXP_OP_LORA_UNLOAD: return "lora_unload";
	case NXP_OP_LORA_FOLD: return "lora_fold";
	case NXP_OP_LORA_UNFOLD: return "lora_unfold";
	case NXP_OP_LORA_REPORT: return "lora_report";
	case NXP_OP_SHUTDOWN: return "shutdown";
	default: return "?";
	}
}

void nxd_handle_line(struct nxd *d, struct nxd_conn *c, const char *line, size_t len)
{
	struct nxd_prepared p;
	struct nxd_prep_ctx x = nxd_prep_ctx_of(d);
	nxd_prepare(&x, &p, line, len);
	nxd_apply(d, c, &p);
	nxd_prepared_free(&p);
}

void nxd_apply(struct nxd *d, struct nxd_conn *c, struct nxd_prepared *p)
{
	struct nxp_request *q = &p->q;
	if (p->blank)
		return;
	if (p->parse_rc < 0) {
		nxd_send_error(d, c, q->id, p->parse_err.code, "%s", p->parse_err.msg);
		return;
	}
	if (d->phase == NXD_STOPPING && q->op != NXP_OP_STATUS && q->op != NXP_OP_HELLO) {
		nxd_send_error(d, c, q->id, NXP_E_SHUTTING_DOWN, "the daemon is shutting down");
		return;
	}
	if (is_admin_op(q->op)) {
		struct nx_err err = {{0}};
		if (nxd_access_check_admin(c, &err) < 0) {
			nxd_warn("client %d (pid %d, uid %d): '%s' refused: not an admin", c->idx, (int)c->cred.pid,
				 (int)c->cred.uid, admin_op_name(q->op));
			nxd_send_error(d, c, q->id, NXP_E_FORBIDDEN, "'%s' is for admins: %s", admin_op_name(q->op), err.msg);
				return;
		}
	}
	switch (q->op) {
	case NXP_OP_HELLO: {
		struct nxp_hello_info h = { .model = d->model.name, .arch = d->model.arch, .n_ctx = d->o.n_ctx,
					    .n_vocab = d->model.n_vocab,
					    .max_tokens = d->o.max_tokens ? d->o.max_tokens : d->o.n_ctx };
		char buf[2048];
		size_t n = nxp_enc_hello(buf, sizeof(buf), q->has_id ? q->id : NULL, &h);
		if (n < sizeof(buf))
			nxd_conn_queue(d, c, buf, n);
		break;
	}
	case NXP_OP_GENERATE:
		op_generate(d, c, p);
		break;
	case NXP_OP_TOKENIZE:
		op_tokenize(d, c, p);
		break;
	case NXP_OP_DETOKENIZE:
		op_detokenize(d, c, p);
		break;
	case NXP_OP_STATUS:
		op_status(d, c, q);
		break;
	case NXP_OP_CANCEL: {
		/* Only one's own requests (ids are per connection), the latest
		 * with that id if the client reused one. */
		struct nxd_req *r = nxd_sched_find(d, c, q->u.cancel.target);
		if (!r) {
			nxd_send_error(d, c, q->id, NXP_E_NOT_FOUND, "no running request with id %s on this connection",
				       q->u.cancel.target);
			break;
		}
		char buf[NXP_ID_MAX + 64];
		size_t n = nxp_enc_ok(buf, sizeof(buf), q->id);
		if (n < sizeof(buf))
			nxd_conn_queue(d, c, buf, n);
		nxd_sched_cancel(d, r, NXP_DONE_CANCELLED);
		break;
	}
	case NXP_OP_LORA_LOAD:
	case NXP_OP_LORA_LIST:
	case NXP_OP_LORA_UNLOAD:
	case NXP_OP_LORA_FOLD:
	case NXP_OP_LORA_UNFOLD:
	case NXP_OP_LORA_REPORT:
		nxd_lora_op(d, c, q);
		break;
	case NXP_OP_SHUTDOWN: {
		char buf[NXP_ID_MAX + 64], why[96];
		size_t n = nxp_enc_ok(buf, sizeof(buf), q->id);
		if (n < sizeof(buf))
			nxd_conn_queue(d, c, buf, n);
		snprintf(why, sizeof(why), "shutdown requested by uid %d, pid %d", (int)c->cred.uid, (int)c->cred.pid);
		nxd_begin_shutdown(d, why);
		break;
	}
	case NXP_OP_NONE:
		nxd_send_error(d, c, q->id, NXP_E_BAD_REQUEST, "no operation");
		break;
	}
}
