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

/* Encodes text into a malloc'd token array (*out), growing once if needed. */
static int encode(struct nxd *d, const char *text, size_t len, bool special, bool add_bos, int32_t **out,
		  int *n_out, struct nx_err *err)
{
	const struct nx_tok *tk = d->model.tok;
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

static uint64_t fresh_seed(struct nxd *d)
{
	static uint64_t base;
	if (!base && getrandom(&base, sizeof(base), GRND_NONBLOCK) != sizeof(base))
		base = (uint64_t)nxd_now() * 0x9e3779b97f4a7c15ull ^ (uint64_t)d->pid;
	uint64_t x = base + 0x9e3779b97f4a7c15ull * d->seed_ctr++; /* the next value of base's splitmix64 stream */
	return nx_splitmix64(&x);
}

/* The prompt's tokens: chat template (unless raw or given as tokens), then
 * the tokenizer with special tokens parsed, BOS where the model wants one. */
static int prompt_tokens(struct nxd *d, const struct nxp_generate *g, int32_t **out, int *n_out,
			 struct nx_err *err)
{
	const struct nx_tok *tk = d->model.tok;
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
		rc = encode(d, g->prompt, strlen(g->prompt), true, nx_tok_add_bos(tk), out, n_out, err);
		return rc;
	}
	struct nx_chat_msg *msgs = calloc((size_t)(g->input == NXP_IN_MESSAGES ? g->n_messages : 2), sizeof(*msgs));
	int n = 0;
	if (!msgs)
		return nx_errf(err, "out of memory");
	if (g->input == NXP_IN_PROMPT) {
		if (g->system)
			msgs[n++] = (struct nx_chat_msg){ "system", g->system };
		msgs[n++] = (struct nx_chat_msg){ "user", g->prompt };
	} else {
		for (int i = 0; i < g->n_messages; i++)
			msgs[n++] = (struct nx_chat_msg){ nxp_role_name(g->messages[i].role), g->messages[i].content };
	}
	rc = nx_chat_render(d->model.tmpl, d->model.jinja, msgs, n, true, &text, err);
	free(msgs);
	if (rc < 0)
		return -1;
	rc = encode(d, text, strlen(text), true, nx_tok_add_bos(tk), out, n_out, err);
	free(text);
	return rc;
}

static void op_generate(struct nxd *d, struct nxd_conn *c, struct nxp_request *q)
{
	struct nxp_generate *g = &q->u.gen;
	struct nx_err err = {{0}};
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
	if (prompt_tokens(d, g, &r->prompt, &r->n_prompt, &err) < 0) {
		nxd_send_error(d, c, q->id, NXP_E_BAD_REQUEST, "prompt: %s", err.msg);
		nxd_req_free(r);
		return;
	}
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
	for (int i = 0; i < g->n_stop; i++) {
		r->stop[i] = g->stop[i];
		g->stop[i] = NULL; /* taken over */
	}
	r->n_stop = g->n_stop;
	g->n_stop = 0;
	if (!r->stream) {
		r->gen_toks = malloc((size_t)r->max_tokens * sizeof(int32_t));
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

static void op_tokenize(struct nxd *d, struct nxd_conn *c, struct nxp_request *q)
{
	struct nx_err err = {{0}};
	int32_t *t = NULL;
	int n = 0;
	bool bos = q->u.tok.add_bos < 0 ? nx_tok_add_bos(d->model.tok) : q->u.tok.add_bos == 1;
	if (encode(d, q->u.tok.text, strlen(q->u.tok.text), q->u.tok.special, bos, &t, &n, &err) < 0) {
		nxd_send_error(d, c, q->id, NXP_E_BAD_REQUEST, "tokenize: %s", err.msg);
		return;
	}
	size_t len;
	char *line = nxp_enc_tokens_alloc(q->id, t, n, &len);
	free(t);
	queue_alloc(d, c, q->id, line, len);
}

static void op_detokenize(struct nxd *d, struct nxd_conn *c, struct nxp_request *q)
{
	struct nx_err err = {{0}};
	const struct nxp_detokenize *dt = &q->u.detok;
	size_t cap = (size_t)dt->n_tokens * 16 + 16, n = 0;
	char *text = malloc(cap);
	if (!text) {
		nxd_send_error(d, c, q->id, NXP_E_INTERNAL, "out of memory");
		return;
	}
	if (nx_tok_decode(d->model.tok, dt->tokens, (size_t)dt->n_tokens, NX_DETOK_STRIP, text, cap, &n, &err) < 0) {
		if (n > cap) {
			char *p = realloc(text, n);
			if (p) {
				text = p;
				cap = n;
			}
		}
		if (n > cap || nx_tok_decode(d->model.tok, dt->tokens, (size_t)dt->n_tokens, NX_DETOK_STRIP, text, cap,
					     &n, &err) < 0) {
			free(text);
			nxd_send_error(d, c, q->id, NXP_E_BAD_REQUEST, "detokenize: %s", err.msg);
			return;
		}
	}
	size_t len;
	char *line = nxp_enc_text_alloc(q->id, text, n, &len);
	free(text);
	queue_alloc(d, c, q->id, line, len);
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

/* Operations that change what every client gets (RELIABILITY 25): only for
 * admins (access.c). A dry-run fold changes nothing but costs a full grading. */
static bool is_admin_op(enum nxp_op op)
{
	return op == NXP_OP_LORA_LOAD || op == NXP_OP_LORA_UNLOAD || op == NXP_OP_LORA_FOLD ||
	       op == NXP_OP_LORA_UNFOLD || op == NXP_OP_SHUTDOWN;
}

static const char *admin_op_name(enum nxp_op op)
{
	switch (op) {
	case NXP_OP_LORA_LOAD: return "lora_load";
	case NXP_OP_LORA_UNLOAD: return "lora_unload";
	case NXP_OP_LORA_FOLD: return "lora_fold";
	case NXP_OP_LORA_UNFOLD: return "lora_unfold";
	case NXP_OP_SHUTDOWN: return "shutdown";
	default: return "?";
	}
}

void nxd_handle_line(struct nxd *d, struct nxd_conn *c, const char *line, size_t len)
{
	struct nxp_request q;
	struct nxp_error e;
	struct nxp_limits lim = {
		.n_vocab = d->model.n_vocab,
		.n_ctx = d->o.n_ctx,
		.max_tokens = d->o.max_tokens ? d->o.max_tokens : d->o.n_ctx,
		.max_line = d->o.max_line,
	};
	/* Blank lines (a client's "\r\n" keep-alive) are not requests. */
	size_t body = len;
	while (body && (line[body - 1] == '\n' || line[body - 1] == '\r'))
		body--;
	if (body == 0)
		return;
	if (nxp_parse(line, len, &lim, &q, &e) < 0) {
		nxd_send_error(d, c, q.id, e.code, "%s", e.msg);
		nxp_request_free(&q);
		return;
	}
	if (d->phase == NXD_STOPPING && q.op != NXP_OP_STATUS && q.op != NXP_OP_HELLO) {
		nxd_send_error(d, c, q.id, NXP_E_SHUTTING_DOWN, "the daemon is shutting down");
		nxp_request_free(&q);
		return;
	}
	if (is_admin_op(q.op)) {
		struct nx_err err = {{0}};
		if (nxd_access_check_admin(c, &err) < 0) {
			nxd_warn("client %d (pid %d, uid %d): '%s' refused: not an admin", c->idx, (int)c->cred.pid,
				 (int)c->cred.uid, admin_op_name(q.op));
			nxd_send_error(d, c, q.id, NXP_E_FORBIDDEN, "'%s' is for admins: %s", admin_op_name(q.op), err.msg);
			nxp_request_free(&q);
			return;
		}
		/* RELIABILITY 17: the same answer whether the file is missing, not
		 * the peer's to read, a FIFO, a device or in /proc. */
		if (q.op == NXP_OP_LORA_LOAD && nxd_access_check_adapter_path(c, q.u.lora.path, &err) < 0) {
			nxd_send_error(d, c, q.id, NXP_E_BAD_REQUEST, "%s", err.msg);
			nxp_request_free(&q);
			return;
		}
	}
	switch (q.op) {
	case NXP_OP_HELLO: {
		struct nxp_hello_info h = { .model = d->model.name, .arch = d->model.arch, .n_ctx = d->o.n_ctx,
					    .n_vocab = d->model.n_vocab };
		char buf[2048];
		size_t n = nxp_enc_hello(buf, sizeof(buf), q.has_id ? q.id : NULL, &h);
		if (n < sizeof(buf))
			nxd_conn_queue(d, c, buf, n);
		break;
	}
	case NXP_OP_GENERATE:
		op_generate(d, c, &q);
		break;
	case NXP_OP_TOKENIZE:
		op_tokenize(d, c, &q);
		break;
	case NXP_OP_DETOKENIZE:
		op_detokenize(d, c, &q);
		break;
	case NXP_OP_STATUS:
		op_status(d, c, &q);
		break;
	case NXP_OP_CANCEL: {
		/* Only one's own requests (ids are per connection), the latest
		 * with that id if the client reused one. */
		struct nxd_req *r = nxd_sched_find(d, c, q.u.cancel.target);
		if (!r) {
			nxd_send_error(d, c, q.id, NXP_E_NOT_FOUND, "no running request with id %s on this connection",
				       q.u.cancel.target);
			break;
		}
		char buf[NXP_ID_MAX + 64];
		size_t n = nxp_enc_ok(buf, sizeof(buf), q.id);
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
		nxd_lora_op(d, c, &q);
		break;
	case NXP_OP_SHUTDOWN: {
		char buf[NXP_ID_MAX + 64], why[96];
		size_t n = nxp_enc_ok(buf, sizeof(buf), q.id);
		if (n < sizeof(buf))
			nxd_conn_queue(d, c, buf, n);
		snprintf(why, sizeof(why), "shutdown requested by uid %d, pid %d", (int)c->cred.uid, (int)c->cred.pid);
		nxd_begin_shutdown(d, why);
		break;
	}
	case NXP_OP_NONE:
		nxd_send_error(d, c, q.id, NXP_E_BAD_REQUEST, "no operation");
		break;
	}
	nxp_request_free(&q);
}
