/* draft.c - speculative decoding with a draft model (nxd --draft-model): its load and vocabulary check, the round of draft steps before a main step, the drafts it makes.
 *
 * The draft model is a second, small GGUF read by the model's own loader
 * (model.c), laid out in the same arena with its own K/V cache per slot and
 * its own activations (shmem.c), and run by the same workers: a step's model
 * word says which model the workers run (step.h, worker/worker.c).
 *
 * A round. Before a main step, the decoding sequences that speculate with
 * the draft model run it greedily for up to k tokens, batched across them in
 * draft steps. Each sequence's first draft step catches its draft cache up on
 * the tokens it has not seen (the prompt after admission, the correction or
 * bonus token after a verification) as a prefill chunk, and the argmax of the
 * chunk's last row is its first draft; each later step feeds the draft just
 * made at the next position and takes the next argmax. The main step then
 * verifies them like prompt lookup's drafts (spec.c, sched.c). A rejected
 * draft's cache position is simply written again later: positions are
 * absolute, and the cache is said to hold only hist[0 .. dpos).
 *
 * Exactness. The drafts are the draft model's argmax: a point-mass draft
 * distribution, for which spec.c's acceptance rule is the speculative-
 * sampling rule itself; nothing the main model computes depends on them
 * beyond which rows a step has.
 *
 * Cost. In a main step shared with sequences that do not draft, the round's
 * draft steps and the verification of their drafts may add at most
 * NXD_SPEC_SHARED_COST of that step's time (spec.c: nxd_spec_draft_costs);
 * a sequence whose catch-up alone costs more does not draft beside them. The
 * back-off of spec.c holds as for prompt lookup. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool nxd_draft_loaded(const struct nxd *d)
{
	return d->draft.n_vocab > 0;
}

/* ---------------------------------------------------------------- loading */

/* "abc" or "ab..." for a message: at most 40 bytes, control bytes as '?'. */
static void piece_for_msg(const struct gguf_str *s, char *out, size_t cap)
{
	size_t n = s->len < 40 ? (size_t)s->len : 40, k = 0;
	for (size_t i = 0; i < n && k + 4 < cap; i++)
		out[k++] = (unsigned char)s->p[i] < 0x20 ? '?' : s->p[i];
	if (n < s->len && k + 4 < cap)
		out[k++] = '.', out[k++] = '.', out[k++] = '.';
	out[k] = '\0';
}

/* The token pieces of both files, one by one; then their types. */
static int same_tokens(const struct gguf_file *a, const struct gguf_file *b, const char *path, struct nx_err *err)
{
	const struct gguf_value *ta = NULL, *tb = NULL;
	if (gguf_get_arr(a, "tokenizer.ggml.tokens", GGUF_STRING, &ta, true, err) < 0 ||
	    gguf_get_arr(b, "tokenizer.ggml.tokens", GGUF_STRING, &tb, true, err) < 0)
		return nx_err_prefix(err, "--draft-model %s", path);
	if (ta->arr.n != tb->arr.n)
		return nx_errf(err, "--draft-model %s: its vocabulary is not the model's: %llu tokens "
			       "(tokenizer.ggml.tokens), the model has %llu", path, (unsigned long long)tb->arr.n,
			       (unsigned long long)ta->arr.n);
	struct gguf_str *sa = calloc((size_t)ta->arr.n + 1, sizeof(*sa)), *sb = calloc((size_t)tb->arr.n + 1, sizeof(*sb));
	int rc = 0;
	if (!sa || !sb) {
		rc = nx_errf(err, "--draft-model: out of memory comparing vocabularies");
		goto out;
	}
	if (gguf_arr_strings(ta, sa) < 0 || gguf_arr_strings(tb, sb) < 0) {
		rc = nx_errf(err, "--draft-model %s: tokenizer.ggml.tokens unreadable", path);
		goto out;
	}
	for (uint64_t i = 0; i < ta->arr.n; i++)
		if (sa[i].len != sb[i].len || memcmp(sa[i].p, sb[i].p, (size_t)sa[i].len)) {
			char pa[64], pb[64];
			piece_for_msg(&sa[i], pa, sizeof(pa));
			piece_for_msg(&sb[i], pb, sizeof(pb));
			rc = nx_errf(err, "--draft-model %s: its vocabulary is not the model's: token %llu is \"%s\", "
				     "the model's \"%s\" (tokenizer.ggml.tokens)", path, (unsigned long long)i, pb, pa);
			goto out;
		}
	const struct gguf_value *ya = gguf_get(a, "tokenizer.ggml.token_type"),
				*yb = gguf_get(b, "tokenizer.ggml.token_type");
	if (!ya != !yb) {
		rc = nx_errf(err, "--draft-model %s: its vocabulary is not the model's: tokenizer.ggml.token_type is "
			     "%s the draft, %s the model", path, yb ? "in" : "not in", ya ? "in" : "not in");
		goto out;
	}
	if (ya) {
		/* both are validated i32 arrays of n elements (nx_tok_load) */
		if (ya->type != GGUF_ARRAY || yb->type != GGUF_ARRAY || ya->arr.type != yb->arr.type ||
		    ya->arr.n != yb->arr.n) {
			rc = nx_errf(err, "--draft-model %s: its vocabulary is not the model's: tokenizer.ggml.token_type "
				     "differs in type or length", path);
			goto out;
		}
		const size_t w = gguf_vtype_size(ya->arr.type);
		for (uint64_t i = 0; w && i < ya->arr.n; i++)
			if (memcmp(ya->arr.data + i * w, yb->arr.data + i * w, w)) {
				char p[64];
				piece_for_msg(&sa[i], p, sizeof(p));
				rc = nx_errf(err, "--draft-model %s: its vocabulary is not the model's: token %llu (\"%s\") "
					     "has another type (tokenizer.ggml.token_type)", path, (unsigned long long)i, p);
				goto out;
			}
	}
out:
	free(sa);
	free(sb);
	return rc;
}

int nxd_draft_load(struct nxd *d, struct nx_err *err)
{
	const char *path = d->o.draft_path;
	struct nxd_model *dm = &d->draft;
	if (!path)
		return 0;
	if (nxd_model_load_weights(d, dm, path, err) < 0)
		return nx_err_prefix(err, "--draft-model");
	if (nx_tok_load(&dm->tok, &dm->g, err) < 0)
		return nx_err_prefix(err, "--draft-model %s: tokenizer", path);
	const int n_vocab = dm->m.hp.n_vocab;
	if (n_vocab != d->model.n_vocab)
		return nx_errf(err, "--draft-model %s: its vocabulary is not the model's: its output layer has %d rows, "
			       "the model's %d", path, n_vocab, d->model.n_vocab);
	if (nx_tok_n_vocab(dm->tok) != nx_tok_n_vocab(d->model.tok))
		return nx_errf(err, "--draft-model %s: its vocabulary is not the model's: its tokenizer has %d tokens, "
			       "the model's %d", path, (int)nx_tok_n_vocab(dm->tok), (int)nx_tok_n_vocab(d->model.tok));
	if (same_tokens(&d->model.g, &dm->g, path, err) < 0)
		return -1;
	if (nx_kv_type_check(&dm->m.hp, d->o.kv_type, err) < 0)
		return nx_err_prefix(err, "--draft-model %s", path);
	if (gguf_get_str(&dm->g, "general.name", &dm->name, false, err) < 0)
		dm->name = NULL;
	if (!dm->name) {
		const char *b = strrchr(path, '/');
		if (!(dm->name = strdup(b ? b + 1 : path)))
			return nx_errf(err, "--draft-model: out of memory");
	}
	dm->arch = nx_arch_name(dm->m.hp.arch);
	dm->n_vocab = n_vocab; /* from here on: loaded */
	nxd_info("draft model: %s (%s), %d layers, dim %d: the same vocabulary of %d tokens", dm->name, dm->arch,
		 dm->m.hp.n_layer, dm->m.hp.dim, n_vocab);
	return 0;
}

/* ---------------------------------------------------------------- a round */

static bool drafting(const struct nxd_slot *s)
{
	const struct nxd_req *r = s->req;
	return r && !r->cancelled && r->spec_k > 0 && r->spec_mode == NXP_SPEC_DRAFT && s->wait_src < 0 &&
	       s->n_hist - s->n_past == 1;
}

/* What the next main step will be, roughly: a token per decoder, prompt
 * chunks in the rest of the budget, a row per sequence. */
static void main_step_guess(const struct nxd *d, int *n, int *rows, bool *others)
{
	int dec = 0, pre = 0, seqs = 0;
	*others = false;
	for (int i = 0; i < d->o.n_slots; i++) {
		const struct nxd_slot *s = &d->slots[i];
		if (!s->req || s->req->cancelled || s->n_hist <= s->n_past)
			continue;
		const int pending = s->n_hist - s->n_past;
		seqs++;
		if (pending == 1)
			dec++;
		else
			pre += pending;
		if (!drafting(s))
			*others = true;
	}
	const int room = d->o.n_batch - dec;
	*n = dec + (pre < room ? pre : room);
	*rows = seqs;
}

/* Sets each drafting sequence's want for the round: its k, within the
 * context and max_tokens, and beside other sequences within what they may
 * be charged. */
static void round_begin(struct nxd *d)
{
	int n, rows;
	bool others;
	main_step_guess(d, &n, &rows, &others);
	others = others && !nx_env()->test_spec_shared;
	double allow = 0, per_draft = 0, per_token = 0;
	const bool costed = others && nxd_spec_draft_costs(d, n, rows, &allow, &per_draft, &per_token);
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		struct nxd_spec_slot *sp = &s->spec;
		sp->want = sp->n_ddraft = 0;
		if (!drafting(s))
			continue;
		/* drafts an abandoned round fed are not the sequence's tokens; and
		 * its first draft step needs the logits of its last token */
		if (sp->dpos > s->n_hist - 1)
			sp->dpos = s->n_hist - 1;
		if (sp->skip > 0) {
			sp->skip--;
			continue;
		}
		const struct nxd_req *r = s->req;
		int max = sp->k_cur < NXP_MAX_SPEC_K ? sp->k_cur : NXP_MAX_SPEC_K;
		/* drafts at positions n_past + 1 .. inside the context, and none past
		 * the last token max_tokens lets the request emit */
		max = max < d->o.n_ctx - 1 - s->n_past ? max : d->o.n_ctx - 1 - s->n_past;
		max = max < r->max_tokens - r->n_gen - 1 ? max : r->max_tokens - r->n_gen - 1;
		if (max <= 0 || (max = nxd_spec_worth(d, s, 0, max, n, rows)) == 0)
			continue;
		if (others) {
			if (!costed)
				continue; /* until the step times tell what a draft costs */
			const double catch_up = per_token * (s->n_hist - sp->dpos);
			const int fit = per_draft > 0 ? (int)((allow - catch_up) / per_draft) : 0;
			if (fit <= 0)
				continue;
			max = max < fit ? max : fit;
			allow -= catch_up + per_draft * max;
		}
		sp->want = max;
	}
}

/* The next draft step of the round into the descriptor: each sequence that
 * wants more drafts its catch-up chunk (within the budget) or its last
 * draft. Returns its tokens. */
static int plan_draft(struct nxd *d, int *n_rows)
{
	struct nx_tok_in *t = d->shm.toks;
	int n = 0, rows = 0;
	const int budget = d->o.n_batch, max_rows = d->shm.draft_cfg.max_logits;
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		struct nxd_spec_slot *sp = &s->spec;
		sp->dchunk = 0;
		sp->drow = -1;
		if (sp->want <= sp->n_ddraft || !drafting(s) || n >= budget || rows >= max_rows)
			continue;
		if (sp->dpos < s->n_hist) {
			const int pending = s->n_hist - sp->dpos, take = pending < budget - n ? pending : budget - n;
			for (int j = 0; j < take; j++)
				t[n++] = (struct nx_tok_in){ s->hist[sp->dpos + j], sp->dpos + j, i, -1, 0 };
			sp->dchunk = take;
			if (take == pending) {
				t[n - 1].logits_row = rows;
				sp->drow = rows++;
			}
		} else {
			/* caught up: dpos == n_hist + n_ddraft - 1, the last draft's position */
			t[n++] = (struct nx_tok_in){ sp->ddraft[sp->n_ddraft - 1], sp->dpos, i, rows, 0 };
			sp->dchunk = 1;
			sp->drow = rows++;
		}
	}
	*n_rows = rows;
	return n;
}

bool nxd_draft_pump(struct nxd *d)
{
	if (!nxd_draft_loaded(d))
		return false;
	if (d->draft_round == NXD_ROUND_NONE) {
		round_begin(d);
		d->draft_round = NXD_ROUND_DRAFTING;
	}
	if (d->draft_round == NXD_ROUND_DRAFTING) {
		int n = plan_draft(d, &d->step_rows);
		if (n > 0) {
			d->step_follows = d->in_step_done;
			nxd_step_launch_draft(d, n);
			return true;
		}
		d->draft_round = NXD_ROUND_READY;
	}
	return false;
}

void nxd_draft_step_done(struct nxd *d)
{
	const double t1 = nxd_now();
	const int n_vocab = d->draft.n_vocab, n_groups = (n_vocab + NX_SAMPLE_GROUP - 1) / NX_SAMPLE_GROUP;
	for (int i = 0; i < d->o.n_slots; i++) {
		struct nxd_slot *s = &d->slots[i];
		struct nxd_spec_slot *sp = &s->spec;
		if (sp->dchunk == 0)
			continue;
		sp->dpos += sp->dchunk;
		sp->dchunk = 0;
		const int row = sp->drow;
		sp->drow = -1;
		if (row < 0 || !s->req)
			continue;
		/* the supervisor's own pointers, never the workers' copies of them; the
		 * slot's sampler lends its scratch (the same vocabulary) */
		const int32_t tok = nx_sample_greedy(&s->smp, d->shm.draft_state.logits + (size_t)row * (size_t)n_vocab,
						     d->shm.draft_state.logit_gmax + (size_t)row * (size_t)n_groups);
		if (tok < 0) {
			sp->want = sp->n_ddraft; /* no logit above -inf: no draft */
			continue;
		}
		sp->ddraft[sp->n_ddraft++] = tok;
		/* nothing follows the end of the answer */
		if (!s->req->ignore_eos && nx_tok_is_eog(d->model.tok, tok))
			sp->want = sp->n_ddraft;
	}
	d->stats.draft_steps++;
	nxd_spec_fit_draft_step(d, d->step.n, d->step_rows, t1 - d->step.t0);
}

/* ---------------------------------------------------------------- the slot's side */

void nxd_draft_admit(struct nxd_slot *s, int own)
{
	s->spec.dpos = s->spec.dpos < own ? s->spec.dpos : own;
}

int nxd_draft_take(struct nxd_slot *s, int max)
{
	struct nxd_spec_slot *sp = &s->spec;
	const int m = sp->n_ddraft < max ? sp->n_ddraft : max;
	memcpy(sp->draft, sp->ddraft, (size_t)(m > 0 ? m : 0) * sizeof(*sp->draft));
	sp->n_draft = m > 0 ? m : 0;
	return sp->n_draft;
}

void nxd_draft_verified(struct nxd_slot *s, int base, int accepted)
{
	/* positions base + j hold draft j, right while it was accepted */
	struct nxd_spec_slot *sp = &s->spec;
	if (sp->dpos > base + accepted)
		sp->dpos = base + accepted;
	if (sp->dpos > s->n_hist)
		sp->dpos = s->n_hist;
	sp->n_ddraft = sp->want = 0;
}
