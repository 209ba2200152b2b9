/* spec.c - speculative decoding by prompt lookup: drafts from the request's own tokens, how many a step carries, back-off.
 *
 * (The other source of drafts, the draft model, is draft.c's: its drafts are
 * verified, backed off and costed by the same rules here and in sched.c.)
 *
 * Drafting. The last n tokens of a sequence (prompt and output, n = 3, 2,
 * then 1) are looked for earlier in it; the tokens that followed their latest
 * occurrence are the draft. Edited code, a continued list or a quoted passage
 * repeat their input, and that is where drafts are right.
 *
 * Verifying is sched.c's: the drafts ride after the sequence's decode token
 * in the same step, each wanting logits, and the rows are sampled in order;
 * a draft is kept while it equals the token drawn, and the first token that
 * differs (or the one after the last draft) is emitted as well. The forward
 * pass gives a token the same floats whatever else is in its step, so with
 * greedy decoding the tokens and logprobs are those of decoding one at a
 * time. With sampling, each row is sampled exactly as without speculation
 * (the same draws of the request's seeded generator, one per emitted token):
 * for a draft d proposed with certainty (a point-mass draft distribution q)
 * that is the speculative-sampling rule itself, accept with probability
 * min(1, p(d)/q(d)) = p(d) and else draw from p without d, renormalised,
 * and the same seed gives the same answer with speculation on or off. The
 * draft model's drafts are its argmax, a point-mass q as well (draft.c), so
 * the same holds for them whatever the draft model.
 *
 * Cost. A rejected draft costs its share of the step. A sequence whose drafts
 * keep failing drafts fewer (k_cur) and then not at all for a while (skip,
 * doubling up to NXD_SPEC_MAX_BACKOFF steps). Drafts never displace another
 * sequence's tokens (they are planned last), and in a step shared with other
 * sequences they may add at most NXD_SPEC_SHARED_COST of its time, by the
 * step-time fit t = a + b n + c r (tokens n, logits rows r) over recent
 * steps. The same fit says how many drafts pay: with p the sequence's recent
 * rate of accepted drafts from matches of that length (or from the draft
 * model, where a new request's starts from the recent requests'), m drafts
 * are expected to emit 1 + p + .. + p^m tokens in a step longer by m (b + c);
 * a step carries the m that emits the most tokens per second. Where a step's fixed
 * part a is small against a token's b + c (a model that computes rather than
 * waits on memory: its weights in cache) that takes a high p; where reading
 * the weights is most of a step (a DRAM-bound model) nearly any p pays. The
 * draft model's drafts go by the same rule (draft.c), a draft costing its
 * draft step as well, and drafting at all the catch-up of the draft's cache.
 *
 * Probes. A match whose drafts do not pay is passed over (a shorter one
 * may), and one draft of it is tried after 1, 2, 4 .. such matches: to see
 * whether p has changed, and to give the fit steps of that shape (a fit
 * wrong about drafts would otherwise never see one). The waits grow to
 * NXD_SPEC_MAX_BACKOFF, or further, to where a probe costs
 * NXD_SPEC_PROBE_COST of the steps between two; a probe dearer than a whole
 * step waits the longest at once. A draft model's probe also catches its
 * cache up on the tokens since it last ran, a cost no wait bounds; where its
 * drafts would not pay even were every one right (a draft model as big as
 * its target), probes only keep the fits true, and one rides once it costs
 * NXD_SPEC_PROBE_COST of the time since the draft model's last step. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define NXD_SPEC_MISSES 2           /* fully rejected drafts in a row before a back-off */
#define NXD_SPEC_MAX_BACKOFF 16     /* decode steps */
#define NXD_SPEC_SHARED_COST 0.05   /* of a shared step's time */
#define NXD_SPEC_FIT_DECAY 0.98     /* per step: the fit follows the last ~50 steps */
#define NXD_SPEC_P_DECAY 0.9        /* per verified step: p follows the last ~10 */
#define NXD_SPEC_PROBE_COST 0.02    /* of the steps between two probes, at the longest waits */
#define NXD_SPEC_MAX_PROBE_GAP 256  /* matches or rounds */

/* coef: the fit's a, b, c; false until the steps tell them. */
static bool fit_coef(const struct nxd_spec_fit *f, double coef[3])
{
	if (f->solved)
		memcpy(coef, f->coef, sizeof(f->coef));
	return f->solved;
}

int nxd_spec_init(struct nxd *d, struct nx_err *err)
{
	const char *pin = nx_env()->test_spec_fit;
	if (!pin)
		return 0;
	/* "A,B,C" (both fits) or "A,B,C/A',B',C'" (the model's / the draft model's) */
	struct nxd_spec_fit *fits[2] = { &d->stats.spec_fit, &d->stats.draft_fit };
	const char *two = strchr(pin, '/');
	for (int i = 0; i < 2; i++) {
		double *c = fits[i]->coef;
		if (sscanf(i && two ? two + 1 : pin, "%lf,%lf,%lf", &c[0], &c[1], &c[2]) != 3)
			return nx_errf(err, "NXD_TEST_SPEC_FIT '%s': not A,B,C[/A,B,C]", pin);
		fits[i]->solved = fits[i]->pinned = true;
	}
	return 0;
}

void nxd_spec_admit(const struct nxd *d, struct nxd_slot *s, int k)
{
	s->spec = (struct nxd_spec_slot){ .k_cur = k, .backoff = 1, .drow = -1 };
	for (int o = 0; o <= NXD_SPEC_NGRAM; o++) {
		s->spec.acc_w[o] = 1; /* p starts at 1/2 */
		s->spec.seen_w[o] = 2;
		s->spec.probe_gap[o] = 1;
	}
	/* How often prompt lookup is right is the request's own text's; how
	 * often a draft model is, its and the model's: that p starts where the
	 * recent requests left it, weighed as two drafts. */
	s->spec.acc_w[0] = 2 * (d->stats.draft_acc_w + 1) / (d->stats.draft_seen_w + 2);
}

/* The latest i < n_hist - n with hist[i .. i + n) == hist[n_hist - n ..), -1: none. */
static int lookup(const int32_t *hist, int n_hist, int n)
{
	const int32_t *suf = hist + n_hist - n;
	for (int i = n_hist - n - 1; i >= 0; i--)
		if (hist[i] == suf[0] && !memcmp(hist + i, suf, (size_t)n * sizeof(*hist)))
			return i;
	return -1;
}

/* Whether k drafts, every one right, emit more tokens a second than a step
 * without them: 1 + k tokens in a step longer by k drafts at per each and a
 * catch-up of the one token verification adds (that of the draft model). */
static bool pays_if_right(double t0, double per, double catch_up, int k)
{
	return (1 + k) * t0 > t0 + catch_up + per * k;
}

int nxd_spec_worth(const struct nxd *d, struct nxd_slot *s, int order, int m, int n, int rows)
{
	struct nxd_spec_slot *sp = &s->spec;
	double k[3], q[3];
	if (!fit_coef(&d->stats.spec_fit, k))
		return m;
	/* the step without these drafts, and what each adds: its verification,
	 * and for the draft model's a draft step of its own; drafting at all
	 * first catches the draft's cache up on the tokens it has not seen */
	const double t0 = k[0] + k[1] * n + k[2] * rows;
	double per = k[1] + k[2], fixed = 0;
	if (order == 0) {
		if (!fit_coef(&d->stats.draft_fit, q))
			return m;
		fixed = q[1] * (s->n_hist - sp->dpos);
		per += q[0] + q[1] + q[2];
	}
	if (!(t0 > 0) || !(per > 0))
		return m;
	const double p = sp->acc_w[order] / sp->seen_w[order];
	double gain = 1, pj = 1, best_rate = 1 / t0;
	int best = 0;
	for (int j = 1; j <= m; j++) {
		pj *= p;
		gain += pj;
		if (gain / (t0 + fixed + per * j) > best_rate) {
			best_rate = gain / (t0 + fixed + per * j);
			best = j;
		}
	}
	if (best > 0) {
		sp->probe_gap[order] = 1;
		return best;
	}
	/* no acceptance would make the draft model's drafts pay: a probe only
	 * keeps the fits true, and waiting does not make its catch-up cheaper */
	if (order == 0 && !pays_if_right(t0, per, q[1], s->req ? s->req->spec_k : m))
		return fixed + per <= NXD_SPEC_PROBE_COST * (nxd_now() - d->stats.draft_fit.t_last);
	if (sp->probe_wait[order] > 0) {
		sp->probe_wait[order]--;
		return 0;
	}
	/* the waits double up to where a probe costs NXD_SPEC_PROBE_COST of the steps between */
	double cap = (fixed + per) / (NXD_SPEC_PROBE_COST * t0);
	cap = cap < NXD_SPEC_MAX_BACKOFF ? NXD_SPEC_MAX_BACKOFF : cap > NXD_SPEC_MAX_PROBE_GAP ? NXD_SPEC_MAX_PROBE_GAP : cap;
	sp->probe_wait[order] = sp->probe_gap[order];
	sp->probe_gap[order] = 2 * sp->probe_gap[order] < cap ? 2 * sp->probe_gap[order] : (int)cap;
	if (fixed + per > t0) /* a probe dearer than a whole step: the longest wait at once */
		sp->probe_wait[order] = sp->probe_gap[order] = (int)cap;
	return 1;
}

int nxd_spec_draft(const struct nxd *d, struct nxd_slot *s, int max, int n_step, int rows)
{
	struct nxd_spec_slot *sp = &s->spec;
	sp->n_draft = 0;
	if (sp->skip > 0) {
		sp->skip--;
		return 0;
	}
	if (max > sp->k_cur)
		max = sp->k_cur;
	if (max > NXP_MAX_SPEC_K)
		max = NXP_MAX_SPEC_K;
	for (int n = NXD_SPEC_NGRAM; n >= 1 && max > 0; n--) {
		if (s->n_hist <= n)
			continue;
		const int i = lookup(s->hist, s->n_hist, n);
		if (i < 0)
			continue;
		int m = s->n_hist - (i + n);
		m = m < max ? m : max;
		if ((m = nxd_spec_worth(d, s, n, m, n_step, rows)) == 0)
			continue;
		sp->order = n;
		memcpy(sp->draft, s->hist + i + n, (size_t)m * sizeof(*sp->draft));
		sp->n_draft = m;
		break;
	}
	return sp->n_draft;
}

void nxd_spec_learn(struct nxd *d, struct nxd_slot *s, int seen, int accepted)
{
	struct nxd_spec_slot *sp = &s->spec;
	d->stats.spec_drafted += (uint64_t)seen;
	d->stats.spec_accepted += (uint64_t)accepted;
	d->stats.spec_mode_drafted[sp->by_draft] += (uint64_t)seen;
	d->stats.spec_mode_accepted[sp->by_draft] += (uint64_t)accepted;
	const int o = sp->by_draft ? 0 : sp->order;
	sp->acc_w[o] = NXD_SPEC_P_DECAY * sp->acc_w[o] + accepted;
	sp->seen_w[o] = NXD_SPEC_P_DECAY * sp->seen_w[o] + seen;
	if (o == 0) {
		d->stats.draft_acc_w = NXD_SPEC_P_DECAY * d->stats.draft_acc_w + accepted;
		d->stats.draft_seen_w = NXD_SPEC_P_DECAY * d->stats.draft_seen_w + seen;
	}
	if (s->req) {
		const int k = s->req->spec_k;
		if (accepted == sp->n_draft)
			sp->k_cur = 2 * sp->k_cur < k ? 2 * sp->k_cur : k;
		else
			sp->k_cur = accepted + 1 > sp->k_cur / 2 ? accepted + 1 : sp->k_cur / 2;
		if (accepted > 0) {
			sp->misses = 0;
			sp->backoff = 1;
		} else if (++sp->misses >= NXD_SPEC_MISSES) {
			sp->misses = 0;
			sp->skip = sp->backoff;
			sp->backoff = sp->backoff * 2 < NXD_SPEC_MAX_BACKOFF ? sp->backoff * 2 : NXD_SPEC_MAX_BACKOFF;
		}
	}
	sp->n_draft = 0;
}

/* The fit t = a + b n + c r of step seconds against its tokens n and its
 * logits rows r (a row costs the output head besides its token): decayed
 * least squares, the normal equations solved by Cramer's rule. */
static bool fit_solve(const struct nxd_spec_fit *f, double coef[3]);

/* One step into the fit, and a, b, c solved again (once a step, not at each use). */
static void fit_add(struct nxd_spec_fit *f, int n, int rows, double dt)
{
	const double c = NXD_SPEC_FIT_DECAY, x[3] = { 1, n, rows };
	f->t_last = nxd_now();
	for (int i = 0; i < 3; i++) {
		for (int j = 0; j < 3; j++)
			f->xx[i][j] = c * f->xx[i][j] + x[i] * x[j];
		f->xt[i] = c * f->xt[i] + x[i] * dt;
	}
	if (f->pinned)
		return;
	double coef[3];
	if (fit_solve(f, coef)) {
		memcpy(f->coef, coef, sizeof(coef));
		f->solved = true;
	} else if (f->solved) {
		/* steps all of one shape for a while (nothing drafted) no longer
		 * tell a, b, c apart: b and c stand as the earlier ones told them,
		 * and a follows the steps, so that a step's time keeps up */
		f->coef[0] = (f->xt[0] - f->coef[1] * f->xx[0][1] - f->coef[2] * f->xx[0][2]) / f->xx[0][0];
	}
}

void nxd_spec_fit_step(struct nxd *d, int n, int rows, double dt)
{
	fit_add(&d->stats.spec_fit, n, rows, dt);
}

void nxd_spec_fit_draft_step(struct nxd *d, int n, int rows, double dt)
{
	fit_add(&d->stats.draft_fit, n, rows, dt);
}

static double det3(const double m[3][3])
{
	return m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
	       m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
}

/* coef: a, b, c; false while the steps seen do not tell them apart. When
 * every step had a row per token (decoders only), n and r cannot be told
 * apart, and need not: a draft adds one of each, so t = a + b n is solved
 * alone (c = 0). */
static bool fit_solve(const struct nxd_spec_fit *f, double coef[3])
{
	const double w = f->xx[0][0], det = det3(f->xx);
	if (w < 8)
		return false;
	/* relative to the scale of the sums: steps of too few different shapes */
	if (fabs(det) > 1e-6 * f->xx[1][1] * f->xx[2][2] * w) {
		for (int k = 0; k < 3; k++) {
			double m[3][3];
			memcpy(m, f->xx, sizeof(m));
			for (int i = 0; i < 3; i++)
				m[i][k] = f->xt[i];
			coef[k] = det3(m) / det;
		}
		return true;
	}
	const double det2 = f->xx[0][0] * f->xx[1][1] - f->xx[0][1] * f->xx[1][0];
	if (!(det2 > 1e-3 * f->xx[1][1] * w))
		return false;
	coef[0] = (f->xt[0] * f->xx[1][1] - f->xx[0][1] * f->xt[1]) / det2;
	coef[1] = (f->xx[0][0] * f->xt[1] - f->xx[1][0] * f->xt[0]) / det2;
	coef[2] = 0;
	return true;
}

int nxd_spec_shared_budget(const struct nxd *d, int n, int rows)
{
	double k[3];
	if (!fit_coef(&d->stats.spec_fit, k))
		return 0;
	const double step = k[0] + k[1] * n + k[2] * rows, draft = k[1] + k[2];
	if (!(step > 0) || !(draft > 0))
		return 0;
	const double extra = NXD_SPEC_SHARED_COST * step / draft;
	return extra < 1 ? 0 : extra > NXP_MAX_SPEC_K ? NXP_MAX_SPEC_K : (int)extra;
}

/* A draft of the draft model costs a draft step of its own (charged whole
 * to it, as if it drafted alone: a + b + c of the draft's fit) and its
 * verification in the main step (b + c of the model's); a catch-up token
 * b of the draft's. */
bool nxd_spec_draft_costs(const struct nxd *d, int n, int rows, double *allow, double *per_draft, double *per_token)
{
	double k[3], q[3];
	if (!fit_coef(&d->stats.spec_fit, k) || !fit_coef(&d->stats.draft_fit, q))
		return false;
	const double step = k[0] + k[1] * n + k[2] * rows;
	*allow = NXD_SPEC_SHARED_COST * step;
	*per_draft = k[1] + k[2] + q[0] + q[1] + q[2];
	*per_token = q[1] > 0 ? q[1] : 0;
	return step > 0 && *per_draft > 0;
}
