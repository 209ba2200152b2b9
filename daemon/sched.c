/* sched.c - continuous batching: requests -> slots, one step = a decode token per generating sequence + prompt chunks up to the token budget; sampling and streaming.
 *
 * A slot's state is two counters over its token history: n_hist (tokens
 * known: the prompt, then each sampled token) and n_past (tokens whose K/V
 * are in the cache). A step feeds hist[n_past .. n_past + chunk) and asks for
 * logits only when the chunk reaches n_hist, i.e. when the next token is due.
 * Decode (1 pending token) goes first, then prompts in arrival order fill the
 * rest of the budget, so a long prompt is cut into chunks and never holds the
 * decoders back for more than one step.
 *
 * Only step completion advances n_past; an aborted step changes nothing, so
 * re-planning after a worker death runs exactly the same positions again.
 *
 * Prompt cache. A freed slot keeps its K/V and the tokens they belong to
 * (hist, n_past); a request whose prompt begins with those tokens is admitted
 * there with n_past already past them, so a chat's next turn computes only
 * what is new. A prompt that shares a longer beginning with another slot,
 * free or in use (the same long instruction for many clients), gets those
 * positions' K/V copied from it; if that slot is still computing them
 * (prompts sent together), the younger one waits and copies them as they
 * come (lender_ahead, catch_up). Reuse is exact: a token's arithmetic does not
 * depend on the batch around it (model/forward.h), so its K/V are the floats a
 * whole prompt would give; only K/V of the model in service without a runtime
 * LoRA delta are reused (kv_ok), and a weight swap (fold, unfold), a worker's
 * death or an aborted step makes every slot's unusable. */
#define _GNU_SOURCE
#include "daemon/nxd.h"
#include "kern/cpu.h"
#include "kern/pack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct nxd_conn *live_conn(struct nxd_req *r)
{
	return r->conn && !r->conn->closing ? r->conn : NULL;
}

void nxd_req_free(struct nxd_req *r)
{
	if (!r)
		return;
	nxd_lora_release(r);
	free(r->prompt);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->gen_toks);
	free(r->lp_self);
	free(r->lp_alts);
	free(r->lp_off);
	free(r->text);
	nx_gmatch_free(r->gm);
	if (r->tools)
		nx_toolp_free(r->tools);
	free(r->tools);
	free(r);
}

int nxd_sched_init(struct nxd *d, struct nx_err *err)
{
	int n_vocab = d->model.n_vocab;
	d->slots = calloc((size_t)d->o.n_slots, sizeof(*d->slots));
	if (!d->slots)
		return nx_errf(err, "sched: out of memory");
	struct nx_sample_params sp = nx_sample_params_default();
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		s->row = -1;
		s->wait_src = -1;
		s->hist = malloc((size_t)d->o.n_ctx * sizeof(int32_t));
		if (!s->hist)
			return nx_errf(err, "sched: out of memory for slot %d's history", i);
		if (nx_sampler_init(&s->smp, n_vocab, &sp, err) < 0)
			return nx_err_prefix(err, "sched: slot %d", i);
	}
	d->piece_cap = nx_detok_bound(d->model.tok) + 8;
	d->released_cap = d->piece_cap + 2 * NX_STOP_MAX_LEN + 8;
	/* One token event: its text escaped (<= 6 bytes per byte) plus up to
	 * NX_SAMPLE_MAX_LOGPROBS alternatives and the drawn token, with their pieces. */
	size_t maxp = nx_tok_max_piece(d->model.tok) + 8;
	d->line_cap = 4096 + 6 * d->released_cap + (NX_SAMPLE_MAX_LOGPROBS + 1) * (128 + 6 * maxp);
	d->piece = malloc(d->piece_cap);
	d->released = malloc(d->released_cap);
	d->line = malloc(d->line_cap);
	d->top = calloc(NX_SAMPLE_MAX_LOGPROBS, sizeof(*d->top));
	d->lp = calloc(NX_SAMPLE_MAX_LOGPROBS + 1, sizeof(*d->lp)); /* + the chosen token */
	if (!d->piece || !d->released || !d->line || !d->top || !d->lp)
		return nx_errf(err, "sched: out of memory");
	return nxd_spec_init(d, err);
}

void nxd_sched_free(struct nxd *d)
{
	if (d->slots) {
		for (int i = 0; i < d->o.n_slots; i++) {
			nxd_req_free(d->slots[i].req);
			free(d->slots[i].hist);
			nx_sampler_free(&d->slots[i].smp);
		}
		free(d->slots);
		d->slots = NULL;
	}
	while (d->q_head) {
		struct nxd_req *r = d->q_head;
		d->q_head = r->next;
		nxd_req_free(r);
	}
	free(d->piece);
	free(d->released);
	free(d->line);
	free(d->top);
	free(d->lp);
}

int nxd_sched_slots_used(const struct nxd *d)
{
	int n = 0;
	for (int i = 0; i < d->o.n_slots; i++)
		n += d->slots[i].req != NULL;
	return n;
}

/* ---------------------------------------------------------------- ending requests */

/* The done event, then the request is gone. */
static void finish(struct nxd *d, struct nxd_req *r, enum nxp_reason reason)
{
	struct nxd_conn *c = live_conn(r);
	r->t_end = nxd_now();
	bool ended = reason != NXP_DONE_CANCELLED && reason != NXP_DONE_SHUTDOWN;
	bool cut_short = reason == NXP_DONE_LENGTH || reason == NXP_DONE_STOP;
	if (c && ended && r->tools && r->tools->failed && !(cut_short && !r->tools->invalid)) {
		/* tool_choice asked for a call and the answer is not a valid one; one
		 * the length limit or a stop string cut before a call was whole is
		 * done with that reason and incomplete, as a format's document is */
		nxd_send_error(d, c, r->id, NXP_E_INVALID_TOOL_CALL, "%s", r->tools->why);
		c = NULL;
	}
	_Static_assert(NX_TOOL_MAX_CALLS <= NXP_MAX_TOOL_CALLS, "an answer's calls fit the protocol's");
	struct nxp_tool_call calls[NX_TOOL_MAX_CALLS];
	int n_calls = 0;
	for (int i = 0; r->tools && !r->stream && i < r->tools->n_calls && i < NX_TOOL_MAX_CALLS; i++)
		calls[n_calls++] = (struct nxp_tool_call){ r->tools->calls[i].id, r->tools->calls[i].name,
							   r->tools->calls[i].arguments };
	if (c) {
		/* prefill: first prompt step -> first token; decode: the rest.
		 * NAN (null on the wire) for what never happened. */
		double prefill = r->t_first > 0 && r->t_admit > 0 ? r->t_first - r->t_admit : NAN;
		double decode = r->t_first > 0 ? r->t_end - r->t_first : NAN;
		struct nxp_done dn = {
			.reason = reason,
			.tool_calls = n_calls > 0 ? calls : NULL,
			.n_tool_calls = n_calls,
			.text = r->stream ? NULL : (r->text ? r->text : ""),
			.text_len = r->stream ? 0 : r->text_len,
			.tokens = r->stream ? NULL : r->gen_toks,
			.n_tokens = r->stream ? 0 : r->n_gen,
			.lp_self = r->stream ? NULL : r->lp_self,
			.lp_alts = r->lp_alts,
			.lp_off = r->lp_off,
			.prompt_tokens = r->n_prompt,
			.cached_tokens = r->n_cached,
			.completion_tokens = r->n_gen,
			.prefill_ms = prefill * 1e3,
			.decode_ms = decode * 1e3,
			/* docs/protocol.md: the tokens after the first (which came from the prefill) / decode seconds */
			.tokens_per_s = decode > 0 && r->n_gen > 1 ? (r->n_gen - 1) / decode : NAN,
			.has_seed = true,
			.seed = r->sp.seed,
			.speculated = r->spec_k > 0,
			.spec_mode = r->spec_k > 0 ? nxp_spec_mode_name(r->spec_mode) : NULL,
			.spec_drafted = r->spec_drafted,
			.spec_accepted = r->spec_accepted,
			/* a document cut by a stop string, the length limit or a cancel is no document */
			.constrained = r->gm != NULL,
			.incomplete = r->gm && (reason == NXP_DONE_STOP || !nx_gmatch_accepting(r->gm)),
		};
		if (r->stream) {
			size_t n = nxp_enc_done(d->line, d->line_cap, r->id, &dn);
			if (n < d->line_cap)
				nxd_conn_queue(d, c, d->line, n);
		} else {
			size_t n;
			char *line = nxp_enc_done_alloc(r->id, &dn, &n);
			if (line)
				nxd_conn_queue(d, c, line, n);
			else
				nxd_send_error(d, c, r->id, NXP_E_INTERNAL, "out of memory encoding the result");
			free(line);
		}
	}
	if (r->conn)
		r->conn->n_reqs--;
	/* A half-closed client whose last answer this was. */
	if (c && c->t_rx < 0 && c->n_reqs == 0 && nxd_conn_queued(c) == 0)
		nxd_conn_close(d, c, "all answers sent");
	nxd_req_free(r);
}

/* Ends a request with an error event instead of done. */
static void fail_req(struct nxd *d, struct nxd_req *r, enum nxp_code code, const char *msg)
{
	struct nxd_conn *c = live_conn(r);
	if (c)
		nxd_send_error(d, c, r->id, code, "%s", msg);
	if (r->conn)
		r->conn->n_reqs--;
	nxd_req_free(r);
}

/* Frees the slot, keeping hist[0 .. n_past) and their K/V for the prompt
 * cache; keep false: the request failed, nothing of it is reused. */
static void slot_release(struct nxd *d, struct nxd_slot *s, bool keep)
{
	s->kv_ok = s->kv_ok && keep;
	s->released = ++d->admit_seq;
	s->req = NULL;
	s->row = -1;
	s->chunk = 0;
	s->wait_src = -1;
}

/* Ends cancelled requests that are not part of a running step. */
static void reap(struct nxd *d)
{
	bool running = !nxd_step_idle(d);
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		if (s->req && s->req->cancelled && !(running && s->chunk > 0)) {
			struct nxd_req *r = s->req;
			slot_release(d, s, true);
			finish(d, r, r->cancel_reason);
		}
	}
	struct nxd_req **pp = &d->q_head;
	d->q_tail = NULL;
	while (*pp) {
		struct nxd_req *r = *pp;
		if (r->cancelled) {
			*pp = r->next;
			d->n_queued--;
			finish(d, r, r->cancel_reason);
		} else {
			d->q_tail = r;
			pp = &r->next;
		}
	}
}

void nxd_sched_cancel(struct nxd *d, struct nxd_req *r, enum nxp_reason reason)
{
	if (r->cancelled)
		return;
	r->cancelled = true;
	r->cancel_reason = reason;
}

void nxd_sched_conn_gone(struct nxd *d, struct nxd_conn *c, enum nxp_reason reason)
{
	/* Marked and detached only: the caller may be in the middle of a loop
	 * over these very requests. */
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_req *r = d->slots[i].req;
		if (r && r->conn == c) {
			nxd_sched_cancel(d, r, reason);
			r->conn = NULL;
			c->n_reqs--;
		}
	}
	for (struct nxd_req *r = d->q_head; r; r = r->next)
		if (r->conn == c) {
			nxd_sched_cancel(d, r, reason);
			r->conn = NULL;
			c->n_reqs--;
		}
}

struct nxd_req *nxd_sched_find(struct nxd *d, struct nxd_conn *c, const char *id)
{
	struct nxd_req *best = NULL;
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_req *r = d->slots[i].req;
		if (r && r->conn == c && !r->cancelled && !strcmp(r->id, id) && (!best || r->seq > best->seq))
			best = r;
	}
	for (struct nxd_req *r = d->q_head; r; r = r->next)
		if (r->conn == c && !r->cancelled && !strcmp(r->id, id) && (!best || r->seq > best->seq))
			best = r;
	return best;
}

void nxd_sched_end_all(struct nxd *d, enum nxp_reason reason)
{
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		if (s->req) {
			struct nxd_req *r = s->req;
			slot_release(d, s, true);
			finish(d, r, reason);
		}
	}
	while (d->q_head) {
		struct nxd_req *r = d->q_head;
		d->q_head = r->next;
		finish(d, r, reason);
	}
	d->q_tail = NULL;
	d->n_queued = 0;
}

void nxd_sched_fail_all(struct nxd *d, enum nxp_code code, const char *msg)
{
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		if (s->req) {
			struct nxd_req *r = s->req;
			slot_release(d, s, false);
			fail_req(d, r, code, msg);
		}
	}
	while (d->q_head) {
		struct nxd_req *r = d->q_head;
		d->q_head = r->next;
		fail_req(d, r, code, msg);
	}
	d->q_tail = NULL;
	d->n_queued = 0;
}

void nxd_sched_forget_prompts(struct nxd *d, const char *why)
{
	int n = 0;
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		n += s->kv_ok && s->n_past > 0;
		s->kv_ok = false;
	}
	if (n)
		nxd_debug("prompt cache: forgot %d slots' tokens (%s)", n, why);
}

void nxd_sched_step_failed(struct nxd *d, const char *why)
{
	nxd_sched_forget_prompts(d, "a step failed");
	/* The sequences of the step that cannot be computed get an error; the
	 * rest keep their place. */
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		if (s->req && (s->chunk > 0 || s->spec.dchunk > 0)) {
			struct nxd_req *r = s->req;
			slot_release(d, s, false);
			fail_req(d, r, NXP_E_INTERNAL, why);
		}
		s->chunk = 0;
		s->row = -1;
		s->spec.n_draft = 0;
		s->spec.dchunk = 0;
		s->spec.drow = -1;
	}
	d->draft_round = NXD_ROUND_NONE; /* the drafts made are dropped; the next round begins afresh */
}

void nxd_sched_step_retry(struct nxd *d)
{
	d->stats.steps_retried++;
	nxd_sched_pump(d);
}

/* ---------------------------------------------------------------- admission */

/* Tokens at the start of r's prompt that slot s's first `upto` tokens
 * match and whose K/V it may lend: never r's last prompt token, whose logits
 * are needed. */
static int prefix_upto(const struct nxd *d, const struct nxd_slot *s, const struct nxd_req *r, int upto)
{
	if (!d->o.prompt_cache || r->n_lora || !s->kv_ok)
		return 0;
	const int n = upto < r->n_prompt - 1 ? upto : r->n_prompt - 1;
	int k = 0;
	while (k < n && s->hist[k] == r->prompt[k])
		k++;
	return k;
}

/* Tokens at the start of r's prompt whose K/V slot s holds and may lend. */
static int shared_prefix(const struct nxd *d, const struct nxd_slot *s, const struct nxd_req *r)
{
	return prefix_upto(d, s, r, s->n_past);
}

/* Where a request goes: the free slot, the prompt tokens whose K/V it holds
 * already (own), the tokens the request skips (reuse: own, or more copied
 * from slot src's positions [own, reuse)). slot -1: none free. */
struct place {
	int slot, own, reuse, src;
};

/* The slot: a free one whose tokens r's prompt continues furthest, as long
 * as it keeps at least half of them (a chat's next turn); else the free one
 * freed longest ago, so that a new conversation does not throw away a recent
 * one's cache for a shared instruction. The lender: any other slot, free or
 * in use, that holds a longer beginning of the prompt. */
static struct place place(struct nxd *d, const struct nxd_req *r)
{
	struct place p = { .slot = -1, .src = -1 };
	int k[NXD_MAX_SLOTS], oldest = -1;
	for (int i = 0; i < d->o.n_slots; i++) {
		const struct nxd_slot *s = &d->slots[i];
		k[i] = shared_prefix(d, s, r);
		if (s->req)
			continue;
		if (oldest < 0 || s->released < d->slots[oldest].released)
			oldest = i;
		if (k[i] > p.own && 2 * k[i] >= s->n_past) {
			p.slot = i;
			p.own = k[i];
		}
	}
	if (p.slot < 0 && oldest >= 0) {
		p.slot = oldest;
		p.own = k[oldest];
	}
	p.reuse = p.own;
	for (int i = 0; p.slot >= 0 && i < d->o.n_slots; i++)
		if (i != p.slot && k[i] > p.reuse) {
			p.reuse = k[i];
			p.src = i;
		}
	return p;
}

/* A slot in use that will hold more of r's prompt than place() found (p.reuse
 * tokens) but has not computed it yet: a prompt still in its prefill, or the
 * token a decoder feeds next. Prompts with the same long instruction that
 * arrive together are computed once that way, not once each: the younger ones
 * wait (plan) and take the older one's K/V as it goes. The slot with the most
 * tokens, the oldest of equals; -1: none. *len: how many. */
static int lender_ahead(const struct nxd *d, const struct nxd_req *r, struct place p, int *len)
{
	int best = -1;
	*len = p.reuse;
	for (int i = 0; i < d->o.n_slots; i++) {
		const struct nxd_slot *s = &d->slots[i];
		if (i == p.slot || !s->req || s->req->cancelled)
			continue;
		const int k = prefix_upto(d, s, r, s->n_hist);
		if (k > s->n_past && (k > *len || (k == *len && best >= 0 && s->admitted < d->slots[best].admitted))) {
			best = i;
			*len = k;
		}
	}
	return best;
}

static int admit(struct nxd *d, struct nxd_req *r, struct place p)
{
	struct nxd_slot *s = &d->slots[p.slot];
	struct nx_err err = {{0}};
	struct nx_sample_params sp = r->sp;
	sp.count_from = r->n_prompt; /* presence / frequency count the generated tokens */
	if (nx_sampler_reset(&s->smp, &sp, &err) < 0 ||
	    nx_stop_init(&s->stop, (const char *const *)r->stop, r->n_stop, &err) < 0) {
		fail_req(d, r, NXP_E_OUT_OF_RANGE, err.msg);
		return -1;
	}
	/* Mistral's [TOOL_CALLS] is a control token, which the answer's text
	 * leaves out: its reader of calls has to see it */
	bool marks = r->tools && (r->tools->style == NX_TOOLS_MISTRAL || r->tools->style == NX_TOOLS_MISTRAL_TIGHT);
	nx_detok_init(&s->detok, d->model.tok, marks ? NX_DETOK_SPECIAL : 0);
	/* Positions past what this slot holds of r's prompt come from src: a
	 * free slot, or one in use whose positions below n_past no step writes. */
	if (p.src >= 0)
		nx_state_copy_kv(&d->shm.state, d->model.m.hp.head_dim, p.slot, p.src, p.own, p.reuse);
	memcpy(s->hist, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
	s->n_hist = r->n_prompt;
	s->n_past = p.reuse; /* hist[0 .. reuse) are the prompt's first tokens: their K/V are in place */
	s->kv_ok = r->n_lora == 0;
	r->n_cached = p.reuse;
	d->stats.prompt_cached += (uint64_t)p.reuse;
	s->row = -1;
	s->chunk = 0;
	s->admitted = d->admit_seq++;
	s->wait_src = lender_ahead(d, r, p, &s->wait_len);
	if (s->wait_src >= 0)
		s->wait_admitted = d->slots[s->wait_src].admitted;
	s->req = r;
	r->slot = p.slot;
	const int dpos = s->spec.dpos; /* the draft model's cache is the slot's, like its K/V */
	nxd_spec_admit(d, s, r->spec_k);
	s->spec.by_draft = r->spec_k > 0 && r->spec_mode == NXP_SPEC_DRAFT;
	s->spec.dpos = dpos;
	nxd_draft_admit(s, p.own);
	nxd_lora_admit(d, r, p.slot);
	return 0;
}

static void admit_queued(struct nxd *d)
{
	struct place p;
	while (d->q_head && (p = place(d, d->q_head)).slot >= 0) {
		struct nxd_req *r = d->q_head;
		d->q_head = r->next;
		if (!d->q_head)
			d->q_tail = NULL;
		d->n_queued--;
		r->next = NULL;
		admit(d, r, p);
	}
}

void nxd_sched_submit(struct nxd *d, struct nxd_req *r)
{
	struct nxd_conn *c = r->conn;
	c->n_reqs++;
	if (d->phase != NXD_SERVING) {
		fail_req(d, r, NXP_E_SHUTTING_DOWN, "the daemon is shutting down");
		return;
	}
	if (nxd_procs_failed(d)) {
		fail_req(d, r, NXP_E_INTERNAL, d->fatal);
		return;
	}
	const struct place p = d->q_head ? (struct place){ .slot = -1 } : place(d, r);
	if (p.slot >= 0) {
		admit(d, r, p);
	} else if (d->n_queued < d->o.max_queue) {
		r->next = NULL;
		if (d->q_tail)
			d->q_tail->next = r;
		else
			d->q_head = r;
		d->q_tail = r;
		d->n_queued++;
	} else {
		char msg[160];
		snprintf(msg, sizeof(msg), "all %d slots are busy and %d requests are queued; try again later",
			 d->o.n_slots, d->n_queued);
		fail_req(d, r, NXP_E_BUSY, msg);
		return;
	}
	nxd_sched_pump(d);
}

/* ---------------------------------------------------------------- planning */

static int cmp_admitted(const void *a, const void *b)
{
	const struct nxd_slot *x = *(struct nxd_slot *const *)a, *y = *(struct nxd_slot *const *)b;
	return x->admitted < y->admitted ? -1 : x->admitted > y->admitted;
}

/* A slot waiting for its lender (lender_ahead): copies the K/V the lender has
 * computed since the last step (between steps: no step writes them), and
 * stops waiting once it has them all, or when the lender's tokens are no
 * longer the ones it promised (its request ended and the slot went to another,
 * a weight swap or a fault made them unusable). */
static void catch_up(struct nxd *d, struct nxd_slot *s)
{
	const struct nxd_slot *src = &d->slots[s->wait_src];
	const int si = (int)(s - d->slots);
	if (src->admitted != s->wait_admitted || !src->kv_ok || !s->kv_ok) {
		nxd_debug("prompt cache: slot %d computes its prompt from %d on: slot %d's tokens are gone", si,
			  s->n_past, s->wait_src);
		s->wait_src = -1;
		return;
	}
	const int have = src->n_past < s->wait_len ? src->n_past : s->wait_len;
	if (have > s->n_past) {
		nx_state_copy_kv(&d->shm.state, d->model.m.hp.head_dim, si, s->wait_src, s->n_past, have);
		s->req->n_cached += have - s->n_past;
		d->stats.prompt_cached += (uint64_t)(have - s->n_past);
		s->n_past = have;
	}
	if (s->n_past >= s->wait_len) {
		s->wait_src = -1;
	} else if (!src->req || src->req->cancelled) {
		nxd_debug("prompt cache: slot %d computes its prompt from %d on: slot %d's request ended", si,
			  s->n_past, s->wait_src);
		s->wait_src = -1;
	}
}

static int plan(struct nxd *d, int *n_rows)
{
	struct nx_tok_in *t = d->shm.toks;
	int n = 0, rows = 0, budget = d->o.n_batch;
	struct nxd_slot *pre[NXD_MAX_SLOTS], *spec[NXD_MAX_SLOTS];
	int n_pre = 0, n_spec = 0, n_seqs = 0;
	/* Decoders first: one token each, each wants its logits. */
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		s->chunk = 0;
		s->row = -1;
		s->spec.n_draft = 0;
		if (!s->req || s->req->cancelled)
			continue;
		if (s->wait_src >= 0)
			catch_up(d, s);
		int pending = s->n_hist - s->n_past;
		if (pending == 1) {
			if (s->req->t_admit == 0)
				s->req->t_admit = nxd_now(); /* a one-token prompt */
			t[n] = (struct nx_tok_in){ s->hist[s->n_past], s->n_past, i, rows, s->req->n_lora ? i + 1 : 0 };
			s->row = rows++;
			s->chunk = 1;
			n++;
			n_seqs++;
			if (s->req->spec_k > 0)
				spec[n_spec++] = s;
		} else if (pending > 1 && s->wait_src < 0 && n_pre < (int)(sizeof(pre) / sizeof(pre[0]))) {
			pre[n_pre++] = s;
		}
	}
	/* Then prompts, oldest first, cut to what is left of the budget. */
	qsort(pre, (size_t)n_pre, sizeof(pre[0]), cmp_admitted);
	for (int k = 0; k < n_pre && n < budget; k++) {
		struct nxd_slot *s = pre[k];
		int si = (int)(s - d->slots);
		int pending = s->n_hist - s->n_past;
		int take = pending < budget - n ? pending : budget - n;
		for (int j = 0; j < take; j++) {
			int pos = s->n_past + j;
			t[n++] = (struct nx_tok_in){ s->hist[pos], pos, si, -1, s->req->n_lora ? si + 1 : 0 };
		}
		s->chunk = take;
		n_seqs++;
		if (s->req->t_admit == 0)
			s->req->t_admit = nxd_now(); /* its first prompt step */
		if (take == pending) {
			t[n - 1].logits_row = rows;
			s->row = rows++;
		}
	}
	/* Last, drafts of the speculating decoders in what is left: never in
	 * place of another sequence's tokens, and in a step shared with other
	 * sequences only as many as cost them little. */
	int shared = n_spec < n_seqs && !nx_env()->test_spec_shared ? nxd_spec_shared_budget(d, n, rows) : budget;
	for (int k = 0; k < n_spec && n < budget && rows < d->shm.cfg.max_logits; k++) {
		struct nxd_slot *s = spec[k];
		const struct nxd_req *r = s->req;
		const int si = (int)(s - d->slots);
		/* the draft model's drafts were held to what they may cost beside
		 * other sequences when they were made (draft.c round_begin) */
		const bool by_draft = r->spec_mode == NXP_SPEC_DRAFT;
		if (!by_draft && shared <= 0)
			continue;
		int max = budget - n;
		max = max < d->shm.cfg.max_logits - rows ? max : d->shm.cfg.max_logits - rows;
		if (!by_draft)
			max = max < shared ? max : shared;
		/* positions n_past + 1 .. n_past + max, inside the context; and no
		 * draft past the last token max_tokens lets the request emit */
		max = max < d->o.n_ctx - 1 - s->n_past ? max : d->o.n_ctx - 1 - s->n_past;
		max = max < r->max_tokens - r->n_gen - 1 ? max : r->max_tokens - r->n_gen - 1;
		if (max <= 0 || (by_draft ? nxd_draft_take(s, max) : nxd_spec_draft(d, s, max, n, rows)) == 0)
			continue;
		s->spec.draft_row = rows;
		for (int j = 0; j < s->spec.n_draft; j++)
			t[n++] = (struct nx_tok_in){ s->spec.draft[j], s->n_past + 1 + j, si, rows++,
						     r->n_lora ? si + 1 : 0 };
		if (n_spec < n_seqs)
			shared -= s->spec.n_draft;
	}
	*n_rows = rows;
	return n;
}

void nxd_sched_pump(struct nxd *d)
{
	if (d->phase != NXD_SERVING || !nxd_step_idle(d))
		return;
	nxd_lora_boundary(d); /* folds swap in here, between two steps */
	reap(d);
	admit_queued(d);
	if (!nxd_step_can_launch(d))
		return;
	if (nxd_draft_pump(d))
		return; /* a draft step of the round before the main step */
	int n = plan(d, &d->step_rows);
	if (n == 0)
		return;
	d->step_follows = d->in_step_done;
	nxd_step_launch(d, n);
}

/* ---------------------------------------------------------------- results */

static void stats_step(struct nxd *d, int seqs, int ntok, int n_prompt, double t0, double t1)
{
	struct nxd_stats *st = &d->stats;
	st->steps++;
	st->tokens_served += (uint64_t)n_prompt + (uint64_t)ntok;
	st->completion_tokens += (uint64_t)ntok;
	unsigned i = st->head;
	st->seqs[i] = seqs;
	st->ntok[i] = ntok;
	st->t0[i] = t0;
	st->head = (i + 1) % NXD_STATS_WINDOW;
	if (st->count < NXD_STATS_WINDOW)
		st->count++;
}

/* Feeds the text just released to the request's reader of tool calls: the
 * answer ends early once a call is all parallel_tool_calls false allows, or
 * once tool_choice's call has failed (text held back for a stop string then
 * is dropped: nothing after the call belongs to the answer); an answer that
 * ends with calls ends for them. */
static void read_tool_calls(struct nxd_req *r, const char *s, size_t n, bool *end, enum nxp_reason *reason)
{
	struct nx_toolp *tp = r->tools;
	nx_toolp_feed(tp, s, n);
	if (!*end && nx_toolp_done(tp)) {
		*end = true;
		*reason = NXP_DONE_TOOL_CALLS;
	}
	if (*end) {
		nx_toolp_finish(tp);
		/* the length limit on the token that completed the answer's last call: it ended for the calls */
		if (tp->n_calls > 0 && (*reason == NXP_DONE_EOS || *reason == NXP_DONE_STOP ||
					(*reason == NXP_DONE_LENGTH && nx_toolp_done(tp))))
			*reason = NXP_DONE_TOOL_CALLS;
	}
}

/* A streamed request's tool calls completed since the last token. */
static void send_tool_calls(struct nxd *d, struct nxd_conn *c, struct nxd_req *r)
{
	for (; r->n_calls_sent < r->tools->n_calls; r->n_calls_sent++) {
		const struct nx_tool_call *tc = &r->tools->calls[r->n_calls_sent];
		struct nxp_tool_call call = { tc->id, tc->name, tc->arguments };
		size_t n;
		char *line = nxp_enc_tool_call_alloc(r->id, r->n_calls_sent, &call, &n);
		if (line)
			nxd_conn_queue(d, c, line, n);
		free(line);
	}
}

/* A non-streamed request's logprobs of its n_gen-th token (counted already),
 * as the token's event would have carried them: kept for the done event.
 * Out of memory, the token keeps its own and loses its alternatives. */
static void keep_logprobs(struct nxd_req *r, const struct nxp_logprob *self, const struct nxp_logprob *alts, int n)
{
	const int i = r->n_gen - 1, at = r->lp_off[i];
	r->lp_self[i] = *self;
	if (at + n > r->lp_alts_cap) {
		int cap = r->lp_alts_cap ? 2 * r->lp_alts_cap : 64 * (n > 0 ? n : 1);
		while (cap < at + n)
			cap *= 2;
		struct nxp_logprob *p = realloc(r->lp_alts, (size_t)cap * sizeof(*p));
		if (p) {
			r->lp_alts = p;
			r->lp_alts_cap = cap;
		} else {
			n = 0;
		}
	}
	if (n)
		memcpy(r->lp_alts + at, alts, (size_t)n * sizeof(*alts));
	r->lp_off[i + 1] = at + n;
}

/* d->lp for a token event: the n_top most likely tokens, then the chosen one
 * when a draw took it from outside them, so its own logprob is always there. */
/* Streams one sampled token and decides whether the sequence ends (false:
 * it did, the request is gone). An
 * end-of-generation token is not part of the answer: no text, not counted,
 * not in `tokens`; it only ends the sequence (reason eos). */
static bool on_token(struct nxd *d, struct nxd_slot *s, int32_t tok, int n_top)
{
	struct nxd_req *r = s->req;
	struct nxd_conn *c = live_conn(r);
	const struct nx_tok *tk = d->model.tok;
	if (r->t_first == 0)
		r->t_first = nxd_now();
	bool eog = !r->ignore_eos && nx_tok_is_eog(tk, tok);
	if (!eog) {
		if (!r->stream)
			r->gen_toks[r->n_gen] = tok;
		r->n_gen++;
	}

	size_t plen = 0, rlen = 0, more = 0;
	struct nx_err err;
	if (!eog && nx_detok_push(&s->detok, tok, d->piece, d->piece_cap, &plen, &err) < 0)
		plen = 0; /* tok came from the sampler over n_vocab: cannot be out of range */
	int st = nx_stop_feed(&s->stop, d->piece, plen, d->released, d->released_cap, &rlen);
	enum nxp_reason reason = NXP_DONE_LENGTH;
	bool end = true;
	if (st == NX_STOP_HIT)
		reason = NXP_DONE_STOP;
	else if (eog)
		reason = NXP_DONE_EOS;
	else if (r->n_gen >= r->max_tokens || s->n_hist >= d->o.n_ctx)
		reason = NXP_DONE_LENGTH; /* max_tokens, or no position left to feed tok */
	else
		end = false;
	if (end && st != NX_STOP_HIT) {
		/* Release what was held back: an unfinished UTF-8 sequence (as
		 * U+FFFD) and a tail that could have begun a stop string. */
		size_t fl = nx_detok_flush(&s->detok, d->piece, d->piece_cap);
		size_t r2 = 0;
		if (fl && nx_stop_feed(&s->stop, d->piece, fl, d->released + rlen, d->released_cap - rlen, &r2) ==
				  NX_STOP_HIT)
			reason = NXP_DONE_STOP;
		rlen += r2;
		if (reason != NXP_DONE_STOP && nx_stop_flush(&s->stop, d->released + rlen, d->released_cap - rlen, &more) ==
						      NX_STOP_MORE)
			rlen += more;
	}
	/* The answer's text, or with tools what of it is not a call. */
	const char *txt = d->released;
	size_t tlen = rlen;
	if (r->tools) {
		read_tool_calls(r, d->released, rlen, &end, &reason);
		txt = r->tools->out;
		tlen = r->tools->out_len;
	}
	/* The alternatives (d->lp, n_lp) and the drawn token's own piece and
	 * log-probability, for clients that report per-token logprobs (an
	 * end-of-generation token carries only held-back text, so it gets none). */
	int n_lp = 0;
	for (int k = 0; k < n_top && k < NX_SAMPLE_MAX_LOGPROBS; k++) {
		size_t len = 0;
		const char *p = nx_tok_piece(tk, d->top[k].id, true, &len);
		d->lp[n_lp++] = (struct nxp_logprob){ d->top[k].id, p, p ? len : 0, d->top[k].logprob };
	}
	struct nxp_logprob self = { tok, NULL, 0, nx_sampler_last_logprob(&s->smp) };
	if (r->sp.n_logprobs > 0 && !eog)
		self.text = nx_tok_piece(tk, tok, true, &self.text_len);
	if (!r->stream && r->lp_self && !eog)
		keep_logprobs(r, &self, d->lp, n_lp);
	if (r->stream) {
		/* An end-of-generation token gets an event only to carry text that
		 * was held back (rare: a stop-string prefix, a cut UTF-8 sequence). */
		if (c && (!eog || tlen > 0)) {
			size_t n = nxp_enc_token_lp(d->line, d->line_cap, r->id, tok, txt, tlen,
						    r->sp.n_logprobs > 0 && !eog ? &self : NULL, d->lp, n_lp);
			char *big = NULL;
			if (n < d->line_cap) {
				nxd_conn_queue(d, c, d->line, n);
			} else if ((big = malloc(n + 1))) {
				/* text the reader of tool calls held back (a malformed call, a
				 * Llama answer that opened as a call), released at once */
				nxp_enc_token_lp(big, n + 1, r->id, tok, txt, tlen, r->sp.n_logprobs > 0 && !eog ? &self : NULL,
						 d->lp, n_lp);
				nxd_conn_queue(d, c, big, n);
				free(big);
			}
		}
		if (c && r->tools)
			send_tool_calls(d, c, r);
	} else if (tlen) {
		if (r->text_len + tlen + 1 > r->text_cap) {
			size_t cap = r->text_cap ? r->text_cap : 256;
			while (cap < r->text_len + tlen + 1)
				cap *= 2;
			char *p = realloc(r->text, cap);
			if (p) {
				r->text = p;
				r->text_cap = cap;
			}
		}
		if (r->text_len + tlen + 1 <= r->text_cap) {
			memcpy(r->text + r->text_len, txt, tlen);
			r->text_len += tlen;
			r->text[r->text_len] = '\0';
		}
	}
	if (!end) {
		s->hist[s->n_hist++] = tok;
		return true;
	}
	slot_release(d, s, true);
	finish(d, r, reason);
	return false;
}

/* NXD_PROFILE: the time from the step before's end (its last worker) to
 * this one's start (the workers' mean), when this one followed it without a
 * pause. The counters are the workers' to write: only shown, and a turn of
 * a second or more is left out. */
static void prof_turn(struct nxd *d)
{
	uint64_t end = 0, begin = 0;
	for (int i = 0; i < d->n_workers; i++) {
		const struct nx_prof *p = &d->shm.prof[i];
		end = p->end > end ? p->end : end;
		begin += p->begin / (uint64_t)d->n_workers;
	}
	const uint64_t last = d->prof_last_end;
	d->prof_last_end = end;
	if (!d->step_follows || !last || begin <= last || (double)(begin - last) * nx_prof_tick_ns() >= 1e9)
		return;
	d->prof_turn_ticks += begin - last;
	d->prof_turns++;
}

/* Draws the token of logits row `row` for s's request: under its grammar's
 * mask when it has one (and moves the grammar on by the token). The row of a
 * kept draft is drawn the same way, so drafts and grammars compose. On a
 * failure the request has ended and -1 is returned. */
static int32_t sample_row(struct nxd *d, struct nxd_slot *s, int row, int *n_top)
{
	struct nxd_req *r = s->req;
	const int n_vocab = d->model.n_vocab;
	const size_t n_groups = ((size_t)n_vocab + NX_SAMPLE_GROUP - 1) / NX_SAMPLE_GROUP;
	const float *logits = d->shm.state.logits + (size_t)row * (size_t)n_vocab; /* the supervisor's own pointer */
	struct nx_logprob *top = r->sp.n_logprobs > 0 ? d->top : NULL;
	int32_t tok;
	if (r->gm) {
		/* constrained: only tokens that keep the output a prefix of the grammar */
		struct nx_err err = {{0}};
		int n_allowed = 0;
		const uint64_t *allowed = nx_gmatch_mask(r->gm, &n_allowed, &err);
		if (!allowed || n_allowed == 0) {
			/* a state past the matcher's bounds is the request's grammar's (an ambiguous one) */
			bool oom = !allowed && strstr(err.msg, "out of memory");
			slot_release(d, s, false);
			fail_req(d, r, oom ? NXP_E_INTERNAL : NXP_E_BAD_REQUEST,
				 allowed ? "the grammar allows no token of this model's vocabulary here" : err.msg);
			return -1;
		}
		tok = nx_sample_masked(&s->smp, logits, allowed, s->hist, s->n_hist, top, n_top);
		if (tok >= 0 && tok < n_vocab && nx_gmatch_accept_token(r->gm, tok) < 0) {
			slot_release(d, s, false);
			fail_req(d, r, NXP_E_INTERNAL, "the grammar's matcher failed (out of memory, or its state grew past its bounds)");
			return -1;
		}
	} else {
		tok = nx_sample_grouped(&s->smp, logits, d->shm.state.logit_gmax + (size_t)row * n_groups, s->hist,
					s->n_hist, top, n_top);
	}
	if (tok < 0 || tok >= n_vocab) {
		slot_release(d, s, false);
		fail_req(d, r, NXP_E_INTERNAL, "the step produced no finite logit");
		return -1;
	}
	return tok;
}

void nxd_sched_step_done(struct nxd *d)
{
	if (d->step.model == NXD_STEP_DRAFT) {
		nxd_draft_step_done(d);
		d->in_step_done = true;
		nxd_sched_pump(d);
		d->in_step_done = false;
		return;
	}
	double t1 = nxd_now();
	if (d->shm.prof)
		prof_turn(d);
	int seqs = 0, ntok = 0, n_prompt = 0;
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		if (!s->req || s->chunk == 0)
			continue;
		seqs++;
		if (s->n_past < s->req->n_prompt) {
			int left = s->req->n_prompt - s->n_past;
			n_prompt += s->chunk < left ? s->chunk : left;
		}
		s->n_past += s->chunk;
		s->chunk = 0;
		const int base = s->n_past; /* where its first draft was fed */
		int row = s->row;
		s->row = -1;
		if (s->req->cancelled || row < 0) {
			nxd_draft_verified(s, base, 0);
			continue;
		}
		/* The sampler copies what it looks at (the row, or its group
		 * maxima and the few groups greedy and top-k need) and treats NaN
		 * and inf as the workers' fault, not ours. */
		int n_top = 0;
		struct nxd_req *r = s->req;
		int32_t tok = sample_row(d, s, row, &n_top);
		if (tok < 0) {
			nxd_draft_verified(s, base, 0);
			continue;
		}
		ntok++;
		bool live = on_token(d, s, tok, n_top);
		/* Drafts: each kept while it is the token drawn, and its row then
		 * gives the next token (spec.c). A request's counts are taken
		 * before the token that may end it, for its done event. */
		const int n_draft = s->spec.n_draft;
		int seen = 0, acc = 0;
		while (live && seen < n_draft) {
			seen++;
			r->spec_drafted++;
			if (tok != s->spec.draft[acc])
				break;
			r->spec_accepted++;
			s->n_past++; /* the draft's K/V are the drawn token's */
			row = s->spec.draft_row + acc++;
			if ((tok = sample_row(d, s, row, &n_top)) < 0)
				break;
			ntok++;
			live = on_token(d, s, tok, n_top);
		}
		if (n_draft > 0)
			nxd_spec_learn(d, s, seen, acc);
		nxd_draft_verified(s, base, acc);
	}
	d->draft_round = NXD_ROUND_NONE; /* the next main step gets drafts made for it */
	stats_step(d, seqs, ntok, n_prompt, d->step.t0, t1);
	nxd_spec_fit_step(d, d->step.n, d->step_rows, t1 - d->step.t0);
	d->in_step_done = true;
	nxd_sched_pump(d);
	d->in_step_done = false;
}

/* Each family of kernels and the set it runs (kern/cpu.h), the pack family as its kernels run. */
static void kernels_status(struct nxp_status *st)
{
	static const char *family[NX_KFAM_N], *set[NX_KFAM_N];
	for (int f = 0; f < NX_KFAM_N; f++) {
		family[f] = nx_kfamily_name((enum nx_kfamily)f);
		set[f] = f == NX_KFAM_PACK ? nx_pack_kernels_name() : nx_kset_name(nx_kern_set((enum nx_kfamily)f));
	}
	st->kernel_family = family;
	st->kernel_set = set;
	st->n_kernels = NX_KFAM_N;
}

void nxd_sched_status(struct nxd *d, struct nxp_status *st, struct nxp_worker_status *ws)
{
	/* Over wall time, from the first recent step to now: the gaps between
	 * steps count, and an idle daemon's rate falls to 0. */
	const struct nxd_stats *s = &d->stats;
	const double now = nxd_now();
	double sum = 0, first = now;
	int mx = 0, ntok = 0, n = 0;
	for (unsigned k = 0; k < s->count; k++) {
		if (s->t0[k] < now - NXD_STATS_SECONDS)
			continue;
		n++;
		sum += s->seqs[k];
		if (s->seqs[k] > mx)
			mx = s->seqs[k];
		ntok += s->ntok[k];
		if (s->t0[k] < first)
			first = s->t0[k];
	}
	const double dt = now - first;
	for (int i = 0; i < d->n_workers; i++) {
		const struct nxd_proc *p = &d->procs[i];
		static const char *const names[] = {
			[NXD_P_EMPTY] = "stopped", [NXD_P_STARTING] = "starting", [NXD_P_READY] = "idle",
			[NXD_P_BACKOFF] = "backoff", [NXD_P_FAILED] = "failed",
		};
		const char *state = names[p->st];
		if (p->st == NXD_P_READY && !nxd_step_idle(d))
			state = "busy";
		ws[i] = (struct nxp_worker_status){ .pid = (int)p->pid, .cpu = p->cpu, .state = state,
						    .restarts = p->restarts };
	}
	*st = (struct nxp_status){
		.model = d->model.name,
		.arch = d->model.arch,
		.type = d->model.type,
		.activations = nx_act_mode_name(d->o.act_one_part),
		.kv_type = nx_kv_type_name(d->o.kv_type),
		.chat_template = nx_chat_tmpl_name(d->model.tmpl),
		.tools = nx_chat_tool_style(d->model.tmpl, d->model.jinja) != NX_TOOLS_NONE,
		.kv_bytes = nx_kv_cache_bytes(&d->model.m.hp, &d->shm.cfg),
		.n_ctx = d->o.n_ctx,
		.n_vocab = d->model.n_vocab,
		.workers = ws,
		.n_workers = d->n_workers,
		.slots_total = d->o.n_slots,
		.slots_used = nxd_sched_slots_used(d),
		.queued = d->n_queued,
		.tokens_served = s->tokens_served,
		.prompt_tokens_cached = s->prompt_cached,
		.seqs_per_step_mean = n ? sum / n : 0,
		.seqs_per_step_max = mx,
		.tokens_per_s = dt > 0 ? ntok / dt : 0,
		.uptime_s = nxd_now() - d->t_start,
		.steps = s->steps,
		.steps_retried = s->steps_retried,
		.spec_default = nxp_spec_mode_name(d->o.spec_mode),
		.spec_k = d->o.spec_k,
		.spec_drafted = s->spec_drafted,
		.spec_accepted = s->spec_accepted,
		.spec_mode_drafted = { s->spec_mode_drafted[0], s->spec_mode_drafted[1] },
		.spec_mode_accepted = { s->spec_mode_accepted[0], s->spec_mode_accepted[1] },
		.draft_model = nxd_draft_loaded(d) ? d->draft.name : NULL,
		.draft_steps = s->draft_steps,
	};
	kernels_status(st);
}
