/* test_spec.c - speculation's cost rule (daemon/spec.c) on step times the test chooses: the step-time fit, how many drafts pay, the draft model's probes and where a request's acceptance of its drafts starts. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "daemon/spec.c"

/* The daemon's clock (daemon/main.c), here the test's. */
static double now_s = 1000;
double nxd_now(void)
{
	return now_s;
}

static struct nxd *daemon_new(void)
{
	struct nxd *d = calloc(1, sizeof(*d));
	assert_non_null(d);
	return d;
}

static void pin(struct nxd_spec_fit *f, double a, double b, double c)
{
	f->coef[0] = a, f->coef[1] = b, f->coef[2] = c;
	f->solved = f->pinned = true;
}

/* A slot decoding a request that speculates with k drafts, its draft model's cache behind by `behind`. */
struct seq {
	struct nxd_slot s;
	struct nxd_req r;
	int32_t hist[256];
};

static void seq_admit(const struct nxd *d, struct seq *q, int k, bool by_draft, int behind)
{
	memset(q, 0, sizeof(*q));
	q->r.spec_k = k;
	q->s.req = &q->r;
	q->s.hist = q->hist;
	q->s.n_hist = 100;
	nxd_spec_admit(d, &q->s, k);
	q->s.spec.by_draft = by_draft;
	q->s.spec.dpos = q->s.n_hist - behind;
}

static double p_of(const struct seq *q, int order)
{
	return q->s.spec.acc_w[order] / q->s.spec.seen_w[order];
}

/* One-token steps, steps verifying drafts (a logits row a token), prefill
 * chunks with their last row's logits and without, timed t = a + b n + c r. */
static void steps_of_every_shape(struct nxd *d, double a, double b, double c)
{
	const int shapes[][2] = { { 1, 1 }, { 2, 2 }, { 5, 5 }, { 9, 1 }, { 32, 0 } };
	for (int i = 0; i < 40; i++) {
		const int n = shapes[i % 5][0], r = shapes[i % 5][1];
		nxd_spec_fit_step(d, n, r, a + b * n + c * r);
	}
}

static void fit_solves_a_b_c(void **state)
{
	(void)state;
	struct nxd *d = daemon_new();
	const double a = 2e-3, b = 5e-4, c = 1e-4;
	steps_of_every_shape(d, a, b, c);
	const struct nxd_spec_fit *f = &d->stats.spec_fit;
	assert_true(f->solved);
	assert_float_equal(f->coef[0], a, 1e-12);
	assert_float_equal(f->coef[1], b, 1e-12);
	assert_float_equal(f->coef[2], c, 1e-12);
	free(d);
}

/* A long run of one-token steps (nobody drafting) cannot tell a from b and c:
 * the fit stays solved, what a draft costs stays as it was learnt, and a
 * step's time follows the host when it changes (here twice as slow). */
static void fit_keeps_what_a_draft_costs(void **state)
{
	(void)state;
	struct nxd *d = daemon_new();
	const double a = 2e-3, b = 5e-4, c = 1e-4;
	steps_of_every_shape(d, a, b, c);
	const struct nxd_spec_fit *f = &d->stats.spec_fit;
	for (int i = 0; i < 600; i++)
		nxd_spec_fit_step(d, 1, 1, a + b + c);
	/* on the way, the fit may fall back to t = a + b n (c in a): a draft then costs b */
	assert_true(f->solved);
	assert_float_equal(f->coef[0] + f->coef[1] + f->coef[2], a + b + c, 1e-9);
	assert_true(f->coef[1] + f->coef[2] > 0.8 * (b + c) && f->coef[1] + f->coef[2] < 1.2 * (b + c));
	const double slow = 2 * (a + b + c);
	for (int i = 0; i < 600; i++)
		nxd_spec_fit_step(d, 1, 1, slow);
	assert_true(f->solved);
	assert_float_equal(f->coef[0] + f->coef[1] + f->coef[2], slow, 1e-3 * slow);
	assert_true(f->coef[1] + f->coef[2] > 0.8 * (b + c) && f->coef[1] + f->coef[2] < 1.2 * (b + c));
	free(d);
}

/* Where a step is mostly reading the weights, drafts right half the time
 * ride; where a draft costs what its token would decoded alone, they do not
 * (one now and then: a probe). */
static void drafts_ride_where_they_pay(void **state)
{
	(void)state;
	struct nxd *d = daemon_new();
	struct seq q;
	pin(&d->stats.spec_fit, 1e-3, 1e-5, 0);
	seq_admit(d, &q, 8, false, 0);
	assert_float_equal(p_of(&q, 3), 0.5, 1e-12);
	assert_true(nxd_spec_worth(d, &q.s, 3, 8, 1, 1) > 1);

	pin(&d->stats.spec_fit, 0, 1e-3, 0);
	seq_admit(d, &q, 8, false, 0);
	int drafts = 0;
	for (int i = 0; i < 64; i++)
		drafts += nxd_spec_worth(d, &q.s, 3, 8, 1, 1);
	assert_true(drafts > 0 && drafts < 10);
	free(d);
}

/* A draft model whose step costs more than the model's cannot pay even
 * when always right: it is probed only once that costs NXD_SPEC_PROBE_COST
 * of the time since the draft model last ran, however many rounds pass. */
static void a_draft_that_cannot_pay_waits_for_time(void **state)
{
	(void)state;
	struct nxd *d = daemon_new();
	struct seq q;
	pin(&d->stats.spec_fit, 1e-3, 1e-5, 0);
	pin(&d->stats.draft_fit, 1, 1e-5, 0);
	d->stats.draft_fit.t_last = 1000;
	seq_admit(d, &q, 8, true, 1);
	now_s = 1010; /* a probe of ~1 s against 2% of 10 s */
	for (int i = 0; i < 1000; i++)
		assert_int_equal(nxd_spec_worth(d, &q.s, 0, 8, 1, 1), 0);
	now_s = 1051; /* 2% of 51 s */
	assert_int_equal(nxd_spec_worth(d, &q.s, 0, 8, 1, 1), 1);

	/* a draft step a tenth of the model's pays when right: it drafts */
	pin(&d->stats.draft_fit, 1e-4, 1e-6, 0);
	seq_admit(d, &q, 8, true, 1);
	q.s.spec.acc_w[0] = q.s.spec.seen_w[0] = 2; /* every draft right lately */
	assert_true(nxd_spec_worth(d, &q.s, 0, 8, 1, 1) > 1);
	free(d);
}

/* How often the draft model's drafts were kept carries to the next request;
 * prompt lookup's rate is each request's own and starts at 1/2. */
static void a_request_starts_from_the_draft_models_record(void **state)
{
	(void)state;
	struct nxd *d = daemon_new();
	struct seq q;
	seq_admit(d, &q, 4, true, 0);
	assert_float_equal(p_of(&q, 0), 0.5, 1e-12);
	for (int i = 0; i < 6; i++) {
		q.s.spec.n_draft = 4;
		nxd_spec_learn(d, &q.s, 4, 4);
	}
	seq_admit(d, &q, 4, true, 0);
	assert_true(p_of(&q, 0) > 0.9);
	for (int o = 1; o <= NXD_SPEC_NGRAM; o++)
		assert_float_equal(p_of(&q, o), 0.5, 1e-12);
	for (int i = 0; i < 12; i++) {
		q.s.spec.n_draft = 4;
		nxd_spec_learn(d, &q.s, 4, 0);
	}
	seq_admit(d, &q, 4, true, 0);
	assert_true(p_of(&q, 0) < 0.2);
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(fit_solves_a_b_c),
		cmocka_unit_test(fit_keeps_what_a_draft_costs),
		cmocka_unit_test(drafts_ride_where_they_pay),
		cmocka_unit_test(a_draft_that_cannot_pay_waits_for_time),
		cmocka_unit_test(a_request_starts_from_the_draft_models_record),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
