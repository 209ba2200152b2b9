/* test_sampler.c - the sampler (greedy, seeds, top-k/top-p/min-p, temperature statistics, penalty, log-probs) and the stop-string matcher. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample/sampler.h"
#include "sample/stop.h"

/* --- helpers ----------------------------------------------------------- */

static struct nx_sample_params plain(float temperature, uint64_t seed)
{
	struct nx_sample_params p = nx_sample_params_default();
	p.temperature = temperature;
	p.top_k = 0;
	p.top_p = 1.0f;
	p.min_p = 0.0f;
	p.repeat_penalty = 1.0f;
	p.seed = seed;
	return p;
}

static void init_ok(struct nx_sampler *s, int n, const struct nx_sample_params *p)
{
	struct nx_err err = { { 0 } };
	int rc = nx_sampler_init(s, n, p, &err);
	if (rc)
		fail_msg("nx_sampler_init: %s", err.msg);
}

/* A test-local generator so the logits do not depend on the sampler's. */
static uint64_t lcg_state;
static float frand(void)
{
	lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((lcg_state >> 40) & 0xffffff) / (float)0x1000000;
}

static int argmax(const float *v, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return b;
}

/* Rank of id in v by (value desc, id asc): 0 is the best. */
static int rank_of(const float *v, int n, int id)
{
	int r = 0;
	for (int i = 0; i < n; i++)
		if (v[i] > v[id] || (v[i] == v[id] && i < id))
			r++;
	return r;
}

/* --- parameters --------------------------------------------------------- */

static void expect_bad(struct nx_sample_params p, const char *field, const char *value)
{
	struct nx_err err = { { 0 } };
	assert_int_equal(nx_sample_params_check(&p, &err), -1);
	if (!strstr(err.msg, field) || !strstr(err.msg, value))
		fail_msg("error \"%s\" should name %s and %s", err.msg, field, value);
	/* init refuses the same parameters and leaves nothing allocated */
	struct nx_sampler s;
	assert_int_equal(nx_sampler_init(&s, 8, &p, &err), -1);
	assert_null(s.work);
}

static void test_params(void **state)
{
	(void)state;
	struct nx_sample_params d = nx_sample_params_default();
	struct nx_err err = { { 0 } };
	assert_int_equal(nx_sample_params_check(&d, &err), 0);
	assert_true(d.temperature > 0.0f && d.top_k > 0 && d.top_p < 1.0f && d.min_p > 0.0f);
	struct nx_sample_params g = d;
	g.temperature = 0.0f; /* greedy is valid */
	assert_int_equal(nx_sample_params_check(&g, &err), 0);

	struct nx_sample_params p;
	p = d; p.temperature = -0.5f; expect_bad(p, "temperature", "-0.5");
	p = d; p.temperature = NAN; expect_bad(p, "temperature", "nan");
	p = d; p.temperature = INFINITY; expect_bad(p, "temperature", "inf");
	p = d; p.top_p = 0.0f; expect_bad(p, "top_p", "0");
	p = d; p.top_p = 1.5f; expect_bad(p, "top_p", "1.5");
	p = d; p.top_p = NAN; expect_bad(p, "top_p", "nan");
	p = d; p.min_p = -0.25f; expect_bad(p, "min_p", "-0.25");
	p = d; p.min_p = 2.0f; expect_bad(p, "min_p", "2");
	p = d; p.min_p = NAN; expect_bad(p, "min_p", "nan");
	p = d; p.top_k = -3; expect_bad(p, "top_k", "-3");
	p = d; p.repeat_penalty = 0.0f; expect_bad(p, "repeat_penalty", "0");
	p = d; p.repeat_penalty = -1.0f; expect_bad(p, "repeat_penalty", "-1");
	p = d; p.repeat_penalty = NAN; expect_bad(p, "repeat_penalty", "nan");
	p = d; p.repeat_last_n = -1; expect_bad(p, "repeat_last_n", "-1");
	p = d; p.n_logprobs = -2; expect_bad(p, "n_logprobs", "-2");
	p = d; p.n_logprobs = NX_SAMPLE_MAX_LOGPROBS + 1; expect_bad(p, "n_logprobs", "21");

	struct nx_sampler s;
	assert_int_equal(nx_sampler_init(&s, 0, &d, &err), -1);
	assert_non_null(strstr(err.msg, "n_vocab"));

	/* reset validates too and keeps the old parameters on failure */
	init_ok(&s, 4, &d);
	p = d; p.top_p = -1.0f;
	assert_int_equal(nx_sampler_reset(&s, &p, &err), -1);
	assert_true(s.p.top_p == d.top_p);
	nx_sampler_free(&s);
}

/* --- generator ----------------------------------------------------------- */

static void test_rng_vectors(void **state)
{
	(void)state;
	/* reference outputs of xoshiro256** from state {1, 2, 3, 4} */
	uint64_t st[4] = { 1, 2, 3, 4 };
	assert_true(nx_rng_next(st) == 11520ull);
	assert_true(nx_rng_next(st) == 0ull);
	assert_true(nx_rng_next(st) == 1509978240ull);
	assert_true(nx_rng_next(st) == 1215971899390074240ull);
	/* splitmix64's first output for seed 0 */
	nx_rng_seed(st, 0);
	assert_true(st[0] == 0xe220a8397b1dcdafull);
	for (int i = 0; i < 1000; i++) {
		double u = nx_rng_uniform(st);
		assert_true(u >= 0.0 && u < 1.0);
	}
}

/* --- greedy ------------------------------------------------------------- */

static void test_greedy(void **state)
{
	(void)state;
	enum { N = 1000 };
	static float logits[N];
	struct nx_sample_params p = plain(0.0f, 1);
	struct nx_sampler s;
	init_ok(&s, N, &p);
	lcg_state = 11;
	for (int round = 0; round < 20; round++) {
		for (int i = 0; i < N; i++)
			logits[i] = frand() * 20.0f - 10.0f;
		assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), argmax(logits, N));
	}
	/* ties go to the lowest id */
	for (int i = 0; i < N; i++)
		logits[i] = 0.0f;
	logits[700] = logits[300] = logits[999] = 5.0f;
	assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), 300);
	nx_sampler_free(&s);
}

/* --- seeds -------------------------------------------------------------- */

static void draw_seq(uint64_t seed, int32_t *out, int n_draw)
{
	enum { N = 64 };
	float logits[N];
	for (int i = 0; i < N; i++)
		logits[i] = (float)(i % 7) * 0.3f; /* a flat-ish distribution */
	struct nx_sample_params p = plain(1.0f, seed);
	struct nx_sampler s;
	init_ok(&s, N, &p);
	for (int i = 0; i < n_draw; i++)
		out[i] = nx_sample(&s, logits, NULL, 0, NULL, NULL);
	nx_sampler_free(&s);
}

static void test_seeds(void **state)
{
	(void)state;
	int32_t a[100], b[100], c[100];
	draw_seq(42, a, 100);
	draw_seq(42, b, 100);
	draw_seq(43, c, 100);
	assert_memory_equal(a, b, sizeof(a));
	int same = 0;
	for (int i = 0; i < 100; i++)
		same += a[i] == c[i];
	assert_true(same < 30); /* ~100/64*... by chance; identical streams would give 100 */

	/* reset reseeds: the stream starts over */
	enum { N = 64 };
	float logits[N];
	for (int i = 0; i < N; i++)
		logits[i] = (float)(i % 7) * 0.3f;
	struct nx_sample_params p = plain(1.0f, 42);
	struct nx_sampler s;
	init_ok(&s, N, &p);
	for (int i = 0; i < 37; i++)
		nx_sample(&s, logits, NULL, 0, NULL, NULL);
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	for (int i = 0; i < 100; i++)
		assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), a[i]);
	nx_sampler_free(&s);
}

/* --- truncation --------------------------------------------------------- */

static void test_topk1_is_greedy(void **state)
{
	(void)state;
	enum { N = 5000 };
	static float logits[N];
	struct nx_sample_params p = plain(1.5f, 7);
	p.top_k = 1;
	struct nx_sampler s;
	init_ok(&s, N, &p);
	lcg_state = 5;
	for (int round = 0; round < 50; round++) {
		for (int i = 0; i < N; i++)
			logits[i] = frand() * 4.0f;
		assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), argmax(logits, N));
	}
	nx_sampler_free(&s);
}

static void test_tiny_top_p_and_full_min_p(void **state)
{
	(void)state;
	enum { N = 3000 };
	static float logits[N];
	struct nx_sampler s;
	struct nx_sample_params tp = plain(2.0f, 9);
	tp.top_p = 1e-6f;
	struct nx_sample_params mp = plain(2.0f, 9);
	mp.min_p = 1.0f;
	lcg_state = 99;
	for (int round = 0; round < 30; round++) {
		for (int i = 0; i < N; i++)
			logits[i] = frand() * 3.0f;
		int want = argmax(logits, N);
		init_ok(&s, N, &tp);
		assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), want);
		nx_sampler_free(&s);
		init_ok(&s, N, &mp);
		assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), want);
		nx_sampler_free(&s);
	}
}

/* Top-k with many tied logits: every draw is among the k first by
 * (value desc, id asc). k = 5 takes the heap path (each of the 5 shows up),
 * k = 300 the quickselect path. */
static void test_top_k_set(void **state)
{
	(void)state;
	enum { N = 20000 };
	static float logits[N];
	static int seen[300];
	lcg_state = 1234;
	for (int i = 0; i < N; i++)
		logits[i] = floorf(frand() * 50.0f); /* 50 distinct values: lots of ties */
	const int ks[2] = { 5, 300 };
	assert_true(ks[0] <= NX_SAMPLE_HEAP_K && ks[1] > NX_SAMPLE_HEAP_K);
	for (int ki = 0; ki < 2; ki++) {
		int k = ks[ki];
		struct nx_sample_params p = plain(5.0f, 3); /* hot: flattens the top */
		p.top_k = k;
		struct nx_sampler s;
		init_ok(&s, N, &p);
		memset(seen, 0, sizeof(seen));
		for (int d = 0; d < 3000; d++) {
			int t = nx_sample(&s, logits, NULL, 0, NULL, NULL);
			int r = rank_of(logits, N, t);
			if (r >= k)
				fail_msg("top_k %d, draw %d: token %d has rank %d", k, d, t, r);
			seen[r]++;
		}
		int distinct = 0;
		for (int r = 0; r < k; r++)
			distinct += seen[r] > 0;
		assert_true(distinct >= k * 9 / 10);
		nx_sampler_free(&s);
	}
}

/* Top-p cuts at exactly the right rank, even deep into a run of tied
 * logits (ties ordered by id): one strong token plus N-1 equal ones. */
static void test_top_p_exact_cut(void **state)
{
	(void)state;
	enum { N = 6000, TOP = 4321, WANT_OTHERS = 1500 };
	static float logits[N];
	for (int i = 0; i < N; i++)
		logits[i] = 0.0f;
	logits[TOP] = 6.0f;
	double e = exp(6.0), z = e + (N - 1);
	/* mass of the strong token plus 1500.5 of the others: the set is the
	 * strong token and the 1501 lowest ids among the rest */
	struct nx_sample_params p = plain(1.0f, 77);
	p.top_p = (float)((e + WANT_OTHERS + 0.5) / z);
	struct nx_sampler s;
	init_ok(&s, N, &p);
	int max_other = -1, n_top = 0;
	for (int d = 0; d < 3000; d++) {
		int t = nx_sample(&s, logits, NULL, 0, NULL, NULL);
		if (t == TOP) {
			n_top++;
			continue;
		}
		if (t > WANT_OTHERS) /* ids 0..1500 (TOP is above them) */
			fail_msg("draw %d: token %d is outside the top-p set", d, t);
		if (t > max_other)
			max_other = t;
	}
	assert_true(max_other > WANT_OTHERS - 20); /* the set really reaches that far */
	assert_true(n_top > 0);

	/* a top-p just under the strong token's mass: that token only */
	p.top_p = (float)(e / z) * 0.999f;
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	for (int d = 0; d < 200; d++)
		assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), TOP);
	nx_sampler_free(&s);
}

static void test_min_p_filter(void **state)
{
	(void)state;
	/* probabilities 0.5, 0.3, 0.15, 0.05 at T=1; min_p 0.25 keeps p >= 0.125:
	 * ids 0, 1, 2 only */
	float logits[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
	struct nx_sample_params p = plain(1.0f, 5);
	p.min_p = 0.25f;
	struct nx_sampler s;
	init_ok(&s, 4, &p);
	int cnt[4] = { 0 };
	for (int d = 0; d < 5000; d++)
		cnt[nx_sample(&s, logits, NULL, 0, NULL, NULL)]++;
	assert_int_equal(cnt[3], 0);
	assert_true(cnt[0] > 0 && cnt[1] > 0 && cnt[2] > 0);
	nx_sampler_free(&s);
}

/* --- temperature statistics --------------------------------------------- */

/* Pearson chi-square of counts against the distribution q. */
static double chi2(const int *cnt, const double *q, int k, int n)
{
	double x = 0.0;
	for (int i = 0; i < k; i++) {
		double e = q[i] * n;
		x += (cnt[i] - e) * (cnt[i] - e) / e;
	}
	return x;
}

static void draw_counts(float temperature, uint64_t seed, const float *logits, int *cnt, int n_draw)
{
	struct nx_sample_params p = plain(temperature, seed);
	struct nx_sampler s;
	init_ok(&s, 4, &p);
	memset(cnt, 0, 4 * sizeof(*cnt));
	for (int d = 0; d < n_draw; d++) {
		int t = nx_sample(&s, logits, NULL, 0, NULL, NULL);
		assert_true(t >= 0 && t < 4);
		cnt[t]++;
	}
	nx_sampler_free(&s);
}

static void test_temperature_statistics(void **state)
{
	(void)state;
	enum { DRAWS = 20000 };
	const double base[4] = { 0.1, 0.2, 0.3, 0.4 };
	float logits[4];
	for (int i = 0; i < 4; i++)
		logits[i] = (float)log(base[i]);
	/* chi-square with 3 degrees of freedom: P(X > 16.27) = 0.001 */
	const double crit = 16.27;

	int cnt[4];
	double sharp[4], flat[4], zs = 0, zf = 0;
	for (int i = 0; i < 4; i++) {
		sharp[i] = pow(base[i], 1.0 / 0.5);
		flat[i] = pow(base[i], 1.0 / 2.0);
		zs += sharp[i];
		zf += flat[i];
	}
	for (int i = 0; i < 4; i++) {
		sharp[i] /= zs;
		flat[i] /= zf;
	}

	draw_counts(1.0f, 2024, logits, cnt, DRAWS);
	assert_true(chi2(cnt, base, 4, DRAWS) < crit);

	draw_counts(0.5f, 2024, logits, cnt, DRAWS);
	double x_sharp = chi2(cnt, sharp, 4, DRAWS), x_vs_base = chi2(cnt, base, 4, DRAWS);
	if (!(x_sharp < crit && x_vs_base > 100.0))
		fail_msg("T=0.5: chi2 vs p^2 = %.2f (want < %.2f), vs p = %.2f (want > 100)", x_sharp, crit,
			 x_vs_base);
	assert_true(cnt[3] > cnt[2] && cnt[2] > cnt[1] && cnt[1] > cnt[0]);

	draw_counts(2.0f, 2024, logits, cnt, DRAWS);
	assert_true(chi2(cnt, flat, 4, DRAWS) < crit);
	assert_true(chi2(cnt, base, 4, DRAWS) > 100.0);
}

/* The truncated, renormalized distribution computed the slow way: sort
 * everything by (logit desc, id asc), cut top-k, weigh at the temperature,
 * cut top-p, cut min-p. */
static void reference_dist(const float *l, int n, const struct nx_sample_params *p, double *q)
{
	int order[64];
	for (int i = 0; i < n; i++)
		order[i] = i;
	for (int i = 1; i < n; i++) /* insertion sort: n is tiny */
		for (int j = i; j > 0 && (l[order[j]] > l[order[j - 1]] ||
					  (l[order[j]] == l[order[j - 1]] && order[j] < order[j - 1])); j--) {
			int t = order[j];
			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	int c = p->top_k > 0 && p->top_k < n ? p->top_k : n;
	double wt[64], z = 0.0;
	for (int r = 0; r < c; r++) {
		wt[r] = exp((l[order[r]] - l[order[0]]) / p->temperature);
		z += wt[r];
	}
	int keep = c;
	if (p->top_p < 1.0f) {
		double cum = 0.0;
		for (keep = 0; keep < c;) {
			cum += wt[keep++] / z;
			if (cum >= p->top_p)
				break;
		}
	}
	double s = 0.0;
	for (int i = 0; i < n; i++)
		q[i] = 0.0;
	for (int r = 0; r < keep; r++)
		if (wt[r] >= p->min_p) {
			q[order[r]] = wt[r];
			s += wt[r];
		}
	for (int i = 0; i < n; i++)
		q[i] /= s;
}

/* Draws from a small vocabulary and compares with reference_dist(): nothing
 * outside the kept set, and a chi-square within the P = 0.001 bound. */
static void check_against_reference(const float *l, int n, const struct nx_sample_params *p, int draws,
				    const char *label)
{
	/* chi-square critical values at P = 0.001 for 1..40 degrees of freedom */
	static const double crit[41] = { 0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88,
		29.59, 31.26, 32.91, 34.53, 36.12, 37.70, 39.25, 40.79, 42.31, 43.82, 45.31, 46.80, 48.27,
		49.73, 51.18, 52.62, 54.05, 55.48, 56.89, 58.30, 59.70, 61.10, 62.49, 63.87, 65.25, 66.62,
		67.99, 69.35, 70.70, 72.06, 73.40 };
	double q[64];
	int cnt[64] = { 0 };
	assert_true(n <= 41);
	reference_dist(l, n, p, q);
	struct nx_sampler s;
	init_ok(&s, n, p);
	for (int d = 0; d < draws; d++)
		cnt[nx_sample(&s, l, NULL, 0, NULL, NULL)]++;
	nx_sampler_free(&s);
	double x = 0.0;
	int df = -1;
	for (int i = 0; i < n; i++) {
		if (q[i] == 0.0) {
			if (cnt[i])
				fail_msg("%s: token %d drawn %d times, outside the kept set", label, i, cnt[i]);
			continue;
		}
		if (cnt[i] == 0 && q[i] * draws > 20.0)
			fail_msg("%s: token %d never drawn, expected %.0f times", label, i, q[i] * draws);
		df++;
		double e = q[i] * draws;
		x += (cnt[i] - e) * (cnt[i] - e) / e;
	}
	if (df > 0 && x > crit[df])
		fail_msg("%s: chi2 %.2f > %.2f with %d degrees of freedom", label, x, crit[df], df);
}

static void test_truncated_distribution(void **state)
{
	(void)state;
	enum { N = 12 };
	/* with ties, so the (logit, id) order matters at the cuts */
	const float l[N] = { 1.0f, 2.5f, 0.3f, 2.5f, -1.0f, 1.8f, 0.9f, 1.0f, 3.1f, -0.2f, 1.0f, 0.1f };
	struct {
		float t;
		int k;
		float top_p, min_p;
	} cases[] = {
		{ 1.0f, 5, 1.0f, 0.0f },  { 1.0f, 0, 0.7f, 0.0f },  { 0.7f, 8, 0.9f, 0.1f },
		{ 1.5f, 0, 1.0f, 0.2f },  { 2.0f, 7, 0.95f, 0.0f }, { 1.0f, 4, 0.5f, 0.0f },
		{ 1.0f, 0, 0.999f, 0.0f },
	};
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		struct nx_sample_params p = plain(cases[ci].t, 100 + ci);
		p.top_k = cases[ci].k;
		p.top_p = cases[ci].top_p;
		p.min_p = cases[ci].min_p;
		char label[32];
		snprintf(label, sizeof(label), "case %zu", ci);
		check_against_reference(l, N, &p, 20000, label);
	}

	/* 33 tokens: top-p partitions (ranges over 16) and the first pivot,
	 * the median of ids 0, 16 and 32, is token 16 at rank 9, placed so that
	 * the top-p cut falls exactly on it (cumulative 0.694 before it, 0.737
	 * with it at T = 3). */
	enum { M = 33 };
	float m[M];
	for (int i = 0; i < M; i++)
		m[i] = 1.0f;
	m[0] = 10.0f;
	for (int i = 1; i <= 8; i++)
		m[i] = 6.0f;
	m[16] = 5.0f;
	m[32] = 0.0f;
	struct nx_sample_params p = plain(3.0f, 55);
	p.top_p = 0.715f;
	double q[64];
	reference_dist(m, M, &p, q);
	assert_true(q[16] > 0.0 && q[17] == 0.0); /* the fixture does what it says */
	check_against_reference(m, M, &p, 10000, "cut at the pivot");
}

/* --- repetition penalty -------------------------------------------------- */

static void test_repeat_penalty(void **state)
{
	(void)state;
	float logits[5] = { 2.0f, 1.9f, -1.0f, -1.1f, -5.0f };
	struct nx_sample_params p = plain(0.0f, 1);
	p.repeat_penalty = 1.2f;
	p.repeat_last_n = 3;
	struct nx_sampler s;
	init_ok(&s, 5, &p);

	assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), 0);
	int32_t h1[] = { 0 };
	/* 2.0 / 1.2 = 1.67 < 1.9 */
	assert_int_equal(nx_sample(&s, logits, h1, 1, NULL, NULL), 1);
	/* outside the last 3 tokens: not penalized */
	int32_t h2[] = { 0, 4, 4, 4 };
	assert_int_equal(nx_sample(&s, logits, h2, 4, NULL, NULL), 0);
	/* a repeated token is penalized once, not per occurrence */
	float l2[2] = { 2.0f, 1.5f };
	struct nx_sampler s2;
	init_ok(&s2, 2, &p);
	int32_t h3[] = { 0, 0, 0 };
	assert_int_equal(nx_sample(&s2, l2, h3, 3, NULL, NULL), 0); /* 1.67 > 1.5; thrice would be 1.16 */
	nx_sampler_free(&s2);
	/* negative logits are multiplied: -1.0 * 1.2 = -1.2 < -1.1 */
	float l3[3] = { -1.0f, -1.1f, -9.0f };
	struct nx_sampler s3;
	init_ok(&s3, 3, &p);
	int32_t h4[] = { 0 };
	assert_int_equal(nx_sample(&s3, l3, h4, 1, NULL, NULL), 1);
	/* ids outside the vocabulary in history are ignored */
	int32_t h5[] = { -1, 3, 99 };
	assert_int_equal(nx_sample(&s3, l3, h5, 3, NULL, NULL), 0);
	nx_sampler_free(&s3);
	/* the caller's logits are not modified */
	assert_true(logits[0] == 2.0f);
	/* penalty off: repeat_penalty 1 */
	p.repeat_penalty = 1.0f;
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	assert_int_equal(nx_sample(&s, logits, h1, 1, NULL, NULL), 0);
	/* many calls: the dedupe stamps never leak between calls */
	p.repeat_penalty = 1.2f;
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	for (int i = 0; i < 1000; i++) {
		assert_int_equal(nx_sample(&s, logits, h1, 1, NULL, NULL), 1);
		assert_int_equal(nx_sample(&s, logits, NULL, 0, NULL, NULL), 0);
	}
	nx_sampler_free(&s);
}

/* OpenAI's presence and frequency penalties, against values worked out by
 * hand from its documented definition:
 *   mu[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty
 * where c[j] counts how often token j was drawn before: the generated tokens
 * only (history[count_from..]), not the prompt. */
static void test_presence_frequency_penalties(void **state)
{
	(void)state;
	const float logits[6] = { 1.0f, 0.5f, 0.2f, -0.3f, 0.9f, 0.0f };
	/* prompt 4 4 4, then drawn 0 0 1 0 2: c = {3, 1, 1, 0, 0, 0} */
	const int32_t hist[] = { 4, 4, 4, 0, 0, 1, 0, 2 };
	struct nx_sample_params p = plain(0.0f, 1);
	p.presence_penalty = 0.5f;
	p.frequency_penalty = 0.25f;
	p.count_from = 3;
	p.n_logprobs = 6;
	/* by hand: 1.0 - 0.75 - 0.5, 0.5 - 0.25 - 0.5, 0.2 - 0.25 - 0.5, then untouched */
	const double want[6] = { -0.25, -0.25, -0.55, -0.3, 0.9, 0.0 };
	double z = 0;
	for (int i = 0; i < 6; i++)
		z += exp(want[i]);
	struct nx_sampler s;
	init_ok(&s, 6, &p);
	struct nx_logprob top[6];
	int n_top = 0;
	assert_int_equal(nx_sample(&s, logits, hist, 8, top, &n_top), 4); /* the prompt's token is not penalized */
	assert_int_equal(n_top, 6);
	for (int i = 0; i < n_top; i++)
		assert_true(fabs(top[i].logprob - (want[top[i].id] - log(z))) < 1e-6);
	/* the order: 4 (0.9), 5 (0.0), 0 and 1 tied at -0.25 (lower id first), 3, 2 */
	const int32_t order[6] = { 4, 5, 0, 1, 3, 2 };
	for (int i = 0; i < 6; i++)
		assert_int_equal(top[i].id, order[i]);
	/* the same row twice: counts are per call, never carried over */
	assert_int_equal(nx_sample(&s, logits, hist, 8, top, &n_top), 4);
	assert_true(fabs(top[0].logprob - (0.9 - log(z))) < 1e-6);
	/* no generated token yet: nothing changes */
	assert_int_equal(nx_sample(&s, logits, hist, 3, top, &n_top), 0);
	nx_sampler_free(&s);

	/* A negative penalty raises the drawn tokens: with gmax (the workers'
	 * group maxima) the shortcuts must not pick the unpenalized maximum. */
	enum { N = 64 };
	float l[N], gmax[N / NX_SAMPLE_GROUP];
	for (int i = 0; i < N; i++)
		l[i] = -1.0f - 0.01f * (float)i;
	l[10] = 2.0f;
	nx_sample_group_max(l, N, gmax);
	const int32_t h2[] = { 50, 50, 50 }; /* id 50: -1.5 + 3 * 1.2 = 2.1 > 2.0 */
	struct nx_sample_params q = plain(0.0f, 1);
	q.frequency_penalty = -1.2f;
	struct nx_sampler s2;
	init_ok(&s2, N, &q);
	assert_int_equal(nx_sample_grouped(&s2, l, gmax, h2, 3, NULL, NULL), 50);
	q.temperature = 1e-3f; /* sampled with top-k: the grouped top-k must not skip id 50 either */
	q.top_k = 2;
	assert_int_equal(nx_sampler_reset(&s2, &q, NULL), 0);
	assert_int_equal(nx_sample_grouped(&s2, l, gmax, h2, 3, NULL, NULL), 50);
	q.frequency_penalty = 0.0f;
	q.presence_penalty = 2.0f; /* -1.5 - 2: and once, not per occurrence */
	assert_int_equal(nx_sampler_reset(&s2, &q, NULL), 0);
	assert_int_equal(nx_sample_grouped(&s2, l, gmax, h2, 3, NULL, NULL), 10);
	nx_sampler_free(&s2);

	/* Ranges: [-2, 2], as OpenAI's. */
	struct nx_err err;
	q.presence_penalty = 2.5f;
	assert_int_equal(nx_sample_params_check(&q, &err), -1);
	assert_non_null(strstr(err.msg, "presence_penalty"));
	q.presence_penalty = 0.0f;
	q.frequency_penalty = -2.01f;
	assert_int_equal(nx_sample_params_check(&q, &err), -1);
	q.frequency_penalty = NAN;
	assert_int_equal(nx_sample_params_check(&q, &err), -1);
}

/* --- log-probabilities --------------------------------------------------- */

static void test_logprobs(void **state)
{
	(void)state;
	enum { N = 500 };
	static float logits[N];
	lcg_state = 777;
	for (int i = 0; i < N; i++)
		logits[i] = frand() * 8.0f - 4.0f;
	logits[123] = logits[45]; /* a tie: the lower id comes first */
	double mx = -1e30, z = 0.0;
	for (int i = 0; i < N; i++)
		mx = fmax(mx, logits[i]);
	for (int i = 0; i < N; i++)
		z += exp(logits[i] - mx);
	double lse = mx + log(z);

	struct nx_sample_params p = plain(0.7f, 3);
	p.n_logprobs = 5;
	p.top_k = 10;
	struct nx_sampler s;
	init_ok(&s, N, &p);
	struct nx_logprob top[NX_SAMPLE_MAX_LOGPROBS];
	int n_top = -1;
	int t = nx_sample(&s, logits, NULL, 0, top, &n_top);
	assert_int_equal(n_top, 5);
	for (int j = 0; j < 5; j++) {
		assert_int_equal(rank_of(logits, N, top[j].id), j);
		/* log-softmax of the full distribution at temperature 1 */
		assert_true(fabs(top[j].logprob - (logits[top[j].id] - lse)) < 1e-4);
	}
	assert_true(fabs(nx_sampler_last_logprob(&s) - (logits[t] - lse)) < 1e-4);

	/* n_logprobs 0: nothing written */
	p.n_logprobs = 0;
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	n_top = -1;
	nx_sample(&s, logits, NULL, 0, top, &n_top);
	assert_int_equal(n_top, 0);
	nx_sampler_free(&s);

	/* fewer tokens than asked for */
	float small[3] = { 1.0f, 3.0f, 2.0f };
	p.n_logprobs = 10;
	p.temperature = 0.0f;
	init_ok(&s, 3, &p);
	assert_int_equal(nx_sample(&s, small, NULL, 0, top, &n_top), 1);
	assert_int_equal(n_top, 3);
	assert_int_equal(top[0].id, 1);
	assert_int_equal(top[1].id, 2);
	assert_int_equal(top[2].id, 0);
	assert_true(top[0].logprob > top[1].logprob && top[1].logprob > top[2].logprob);
	nx_sampler_free(&s);
}

/* --- untrusted logits ---------------------------------------------------- */

static void test_non_finite_logits(void **state)
{
	(void)state;
	float l[6] = { NAN, 1.0f, NAN, 0.5f, -INFINITY, NAN };
	struct nx_sample_params p = plain(1.0f, 8);
	struct nx_sampler s;
	init_ok(&s, 6, &p);
	for (int d = 0; d < 500; d++) {
		int t = nx_sample(&s, l, NULL, 0, NULL, NULL);
		assert_true(t == 1 || t == 3);
	}
	float inf[6] = { 1.0f, INFINITY, 2.0f, INFINITY, NAN, -1.0f };
	for (int d = 0; d < 100; d++) {
		int t = nx_sample(&s, inf, NULL, 0, NULL, NULL);
		assert_true(t == 1 || t == 3);
	}
	float none[6] = { NAN, -INFINITY, NAN, NAN, -INFINITY, NAN };
	assert_int_equal(nx_sample(&s, none, NULL, 0, NULL, NULL), -1);
	p.temperature = 0.0f;
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	assert_int_equal(nx_sample(&s, none, NULL, 0, NULL, NULL), -1);
	assert_int_equal(nx_sample(&s, l, NULL, 0, NULL, NULL), 1);
	/* a subnormal temperature behaves as greedy instead of producing NaN */
	p.temperature = 1e-45f;
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	assert_int_equal(nx_sample(&s, l, NULL, 0, NULL, NULL), 1);
	nx_sampler_free(&s);
}

/* The passes over the vocabulary go four and eight logits at a time: every
 * length (tails of 1-7), maxima and top-k members in the tail or the first
 * lanes, ties, NaN and infinities give what a one-at-a-time scan gives.
 * Reference: NaN counts as -inf, +inf as the largest finite value, ties go to
 * the lower id. */
static float clean(float x)
{
	return x != x ? -INFINITY : x == INFINITY ? 3.4028235e38f : x;
}

static void test_vocab_lengths(void **state)
{
	(void)state;
	enum { NMAX = 1003, K = 3 };
	static float l[NMAX], c[NMAX];
	static int seen[NMAX];
	lcg_state = 77;
	for (int n = 1; n <= NMAX; n += n < 40 ? 1 : 321) {
		for (int round = 0; round < 12; round++) {
			for (int i = 0; i < n; i++) {
				float r = frand();
				l[i] = floorf(r * 8.0f); /* few values: many ties */
				if (round % 3 == 1 && r < 0.05f)
					l[i] = NAN;
				if (round % 3 == 2 && r > 0.97f)
					l[i] = r > 0.985f ? INFINITY : -INFINITY;
			}
			if (round == 11)
				l[n - 1] = 100.0f; /* the best in the last, possibly tail, lane */
			int finite = 0;
			for (int i = 0; i < n; i++) {
				c[i] = clean(l[i]);
				finite += c[i] != -INFINITY;
			}
			struct nx_sample_params p = plain(0.0f, 5);
			struct nx_sampler s;
			init_ok(&s, n, &p);
			int want = -1;
			for (int i = 0; i < n; i++)
				if (c[i] != -INFINITY && (want < 0 || c[i] > c[want]))
					want = i;
			int got = nx_sample(&s, l, NULL, 0, NULL, NULL);
			if (got != want)
				fail_msg("n %d round %d: greedy %d, a scan gives %d", n, round, got, want);
			/* top-k, hot: only the K first by (value, id) are ever drawn, and all of them */
			p = plain(1000.0f, 5);
			p.top_k = K;
			assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
			memset(seen, 0, sizeof(int) * (size_t)n);
			for (int d = 0; d < 60 && finite > 0; d++) {
				int t = nx_sample(&s, l, NULL, 0, NULL, NULL);
				assert_true(t >= 0 && t < n && c[t] != -INFINITY);
				if (rank_of(c, n, t) >= K)
					fail_msg("n %d round %d: top-%d drew %d of rank %d", n, round, K, t, rank_of(c, n, t));
				seen[t] = 1;
			}
			int distinct = 0, inf = 0;
			for (int i = 0; i < n; i++) {
				distinct += seen[i];
				inf += l[i] == INFINITY;
			}
			if (!inf) /* with one, every other weight is e^-huge = 0 */
				assert_int_equal(distinct, finite < K ? finite : K);
			nx_sampler_free(&s);
		}
	}
}

/* Group maxima (what the workers write beside each logits row) and greedy
 * from them: nx_sample_group_max against its definition, and
 * nx_sample_grouped gives nx_sample's token for every length (a partial last
 * group), ties across and within groups, NaN and infinities; with wrong
 * maxima (a faulty worker) it still gives nx_sample's token; with a penalty,
 * log-probs or a temperature it does what nx_sample does, draw for draw.
 * nx_sample_greedy gives that greedy token whatever its sampler's parameters. */
static void test_grouped_greedy(void **state)
{
	(void)state;
	enum { NMAX = 1003, G = NX_SAMPLE_GROUP };
	static float l[NMAX], gm[NMAX / G + 1], bad[NMAX / G + 1];
	lcg_state = 91;
	for (int n = 1; n <= NMAX; n += n < 70 ? 1 : 311) {
		const int ng = (n + G - 1) / G;
		for (int round = 0; round < 16; round++) {
			for (int i = 0; i < n; i++) {
				float r = frand();
				l[i] = floorf(r * 6.0f); /* few values: ties within and across groups */
				if (round % 4 == 1 && r < 0.1f)
					l[i] = NAN;
				if (round % 4 == 2 && r > 0.95f)
					l[i] = r > 0.975f ? INFINITY : -INFINITY;
				if (round % 4 == 3)
					l[i] = r < 0.9f ? -INFINITY : NAN; /* mostly or wholly no finite logit */
			}
			nx_sample_group_max(l, n, gm);
			for (int g = 0; g < ng; g++) {
				float want = -INFINITY;
				for (int i = g * G; i < n && i < (g + 1) * G; i++)
					want = clean(l[i]) > want ? clean(l[i]) : want;
				if (gm[g] != want && !(isnan(gm[g]) && isnan(want)))
					fail_msg("n %d round %d: group %d max %g, want %g", n, round, g, gm[g], want);
			}
			struct nx_sample_params p = plain(0.0f, 3);
			struct nx_sampler s;
			init_ok(&s, n, &p);
			const int want = nx_sample(&s, l, NULL, 0, NULL, NULL);
			int got = nx_sample_grouped(&s, l, gm, NULL, 0, NULL, NULL);
			if (got != want)
				fail_msg("n %d round %d: grouped greedy %d, nx_sample %d", n, round, got, want);
			assert_int_equal(s.n_grouped, want >= 0); /* from the maxima whenever a logit is finite */
			/* nx_sample_greedy: that token from the maxima or the row, whatever the sampler's parameters */
			struct nx_sample_params hot = plain(0.9f, 5);
			hot.repeat_penalty = 3.0f;
			hot.top_k = 2;
			struct nx_sampler t;
			init_ok(&t, n, &hot);
			assert_int_equal(nx_sample_greedy(&t, l, gm), want);
			assert_int_equal(nx_sample_greedy(&t, l, NULL), want);
			/* wrong maxima: one the group does not hold makes it scan the row;
			 * a lower one (NaN counts as -inf) can hide the group, which only a
			 * worker that could as well have written other logits can do: the
			 * answer is still an id of the row or -1 */
			const float lies[] = { INFINITY, 1000.0f, -INFINITY, NAN, -1.0f };
			for (size_t k = 0; k < sizeof(lies) / sizeof(lies[0]); k++) {
				const int lg = (int)(k * 7) % ng;
				for (int g = 0; g < ng; g++)
					bad[g] = g == lg ? lies[k] : gm[g];
				got = nx_sample_grouped(&s, l, bad, NULL, 0, NULL, NULL);
				if (clean(lies[k]) > gm[lg] ? got != want : got < -1 || got >= n)
					fail_msg("n %d round %d lie %zu: grouped greedy %d, nx_sample %d", n, round, k, got, want);
				got = nx_sample_greedy(&t, l, bad);
				if (clean(lies[k]) > gm[lg] ? got != want : got < -1 || got >= n)
					fail_msg("n %d round %d lie %zu: nx_sample_greedy %d, nx_sample %d", n, round, k, got, want);
			}
			nx_sampler_free(&t);
			nx_sampler_free(&s);
		}
	}
	/* the paths that do not take the shortcut: same tokens, same draws */
	enum { N = 300 };
	static float v[N], g2[N / G + 1];
	static const int32_t hist[] = { 5, 17, 17, 250 };
	for (int i = 0; i < N; i++)
		v[i] = 4.0f * frand();
	v[17] = 9.0f; /* the best, penalized below */
	nx_sample_group_max(v, N, g2);
	struct nx_sample_params ps[4] = { plain(0.0f, 1), plain(0.0f, 1), plain(0.7f, 42), plain(0.0f, 1) };
	ps[1].repeat_penalty = 20.0f;
	ps[2].top_k = 20;
	ps[3].n_logprobs = 3;
	for (int k = 0; k < 4; k++) {
		struct nx_sampler a, b;
		init_ok(&a, N, &ps[k]);
		init_ok(&b, N, &ps[k]);
		struct nx_logprob ta[3], tb[3];
		int na = 0, nb = 0;
		for (int d = 0; d < 50; d++) {
			const int x = nx_sample(&a, v, hist, 4, ta, &na);
			const int y = nx_sample_grouped(&b, v, g2, hist, 4, tb, &nb);
			assert_int_equal(x, y);
			assert_int_equal(na, nb);
			if (k == 1)
				assert_int_not_equal(x, 17);
		}
		nx_sampler_free(&a);
		nx_sampler_free(&b);
	}
}

/* Top-k from the group maxima draws what the scan draws, draw for draw: any k
 * up to NX_SAMPLE_HEAP_K, top-p, min-p, temperatures, a penalty on the best
 * tokens (and one below 1, which scans), ties within and across groups, NaN
 * and infinities, a partial last group; maxima above what a group holds make
 * it scan; lower ones (a faulty worker) still give an id of the row. */
static void test_grouped_top_k(void **state)
{
	(void)state;
	enum { NMAX = 49152, G = NX_SAMPLE_GROUP };
	static float l[NMAX], gm[NMAX / G + 1];
	static const int sizes[] = { 100, 1003, 4096, NMAX };
	static const int ks[] = { 1, 5, 40, 256 };
	int32_t hist[64];
	lcg_state = 123;
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		const int n = sizes[si], ng = (n + G - 1) / G;
		for (int round = 0; round < 8; round++) {
			for (int i = 0; i < n; i++) {
				float r = frand();
				l[i] = round % 2 ? floorf(r * 10.0f) : 8.0f * r * r * r; /* ties / a long tail */
				if (round % 4 == 2 && r < 0.05f)
					l[i] = NAN;
				if (round % 4 == 3 && r > 0.995f)
					l[i] = r > 0.998f ? INFINITY : -INFINITY;
			}
			nx_sample_group_max(l, n, gm);
			for (int h = 0; h < 64; h++) /* mostly the best tokens, so the penalty changes the top */
				hist[h] = h % 2 ? (int)(frand() * n) : argmax(l, n) + h / 2 < n ? argmax(l, n) + h / 2 : h;
			for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
				for (int v = 0; v < 4; v++) {
					struct nx_sample_params p = plain(v == 3 ? 2.0f : 0.8f, 1000 + round);
					p.top_k = ks[ki];
					p.top_p = v == 1 ? 0.9f : 1.0f;
					p.min_p = v == 2 ? 0.05f : 0.0f;
					p.repeat_penalty = v == 2 ? 1.3f : v == 3 ? 0.8f : 1.0f;
					struct nx_sampler a, b;
					init_ok(&a, n, &p);
					init_ok(&b, n, &p);
					for (int d = 0; d < 12; d++) {
						const int x = nx_sample(&a, l, hist, 64, NULL, NULL);
						const int y = nx_sample_grouped(&b, l, gm, hist, 64, NULL, NULL);
						if (x != y)
							fail_msg("n %d round %d k %d variant %d draw %d: grouped %d, scan %d", n,
								 round, ks[ki], v, d, y, x);
					}
					/* the shortcut was taken on a vocabulary of real size without
					 * ties everywhere (a penalty below 1 always scans) */
					if (n == NMAX && round % 2 == 0 && (v == 3) == (b.n_grouped > 0))
						fail_msg("n %d round %d k %d variant %d: %llu of 12 from the group maxima", n,
							 round, ks[ki], v, (unsigned long long)b.n_grouped);
					nx_sampler_free(&a);
					nx_sampler_free(&b);
				}
			}
			/* wrong maxima */
			struct nx_sample_params p = plain(0.8f, 7);
			p.top_k = 40;
			struct nx_sampler a, b;
			init_ok(&a, n, &p);
			init_ok(&b, n, &p);
			static float bad[NMAX / G + 1];
			for (int g = 0; g < ng; g++)
				bad[g] = g % 3 == 0 && gm[g] < 1e30f ? 1e30f : gm[g]; /* above what the group holds */
			for (int d = 0; d < 12; d++) {
				const int y = nx_sample_grouped(&b, l, bad, NULL, 0, NULL, NULL), x = nx_sample(&a, l, NULL, 0, NULL, NULL);
				if (x != y)
					fail_msg("n %d round %d draw %d: raised maxima: grouped %d, scan %d", n, round, d, y, x);
			}
			for (int g = 0; g < ng; g++)
				bad[g] = g % 2 ? -INFINITY : NAN;
			for (int d = 0; d < 12; d++) {
				const int y = nx_sample_grouped(&b, l, bad, NULL, 0, NULL, NULL);
				assert_true(y >= -1 && y < n);
			}
			nx_sampler_free(&a);
			nx_sampler_free(&b);
		}
	}
}

/* Default parameters on a vocabulary the size of SmolLM2's: every draw is
 * in the top 40; then top-p alone over the whole vocabulary. */
static void test_defaults_large_vocab(void **state)
{
	(void)state;
	enum { N = 49152 };
	float *logits = malloc(N * sizeof(float));
	assert_non_null(logits);
	lcg_state = 4242;
	for (int i = 0; i < N; i++)
		logits[i] = frand() * 10.0f;
	struct nx_sample_params p = nx_sample_params_default();
	p.seed = 1;
	struct nx_sampler s;
	init_ok(&s, N, &p);
	for (int d = 0; d < 200; d++) {
		int t = nx_sample(&s, logits, NULL, 0, NULL, NULL);
		assert_true(t >= 0 && rank_of(logits, N, t) < 40);
	}
	/* top-p alone over the whole vocabulary */
	p.top_k = 0;
	assert_int_equal(nx_sampler_reset(&s, &p, NULL), 0);
	double mx = 10.0, z = 0.0;
	for (int i = 0; i < N; i++)
		z += exp((logits[i] - mx) / p.temperature);
	for (int d = 0; d < 100; d++) {
		int t = nx_sample(&s, logits, NULL, 0, NULL, NULL);
		/* the mass of the tokens ranked above t is below top_p */
		double above = 0.0;
		for (int i = 0; i < N; i++)
			if (logits[i] > logits[t] || (logits[i] == logits[t] && i < t))
				above += exp((logits[i] - mx) / p.temperature);
		assert_true(above / z < p.top_p);
	}
	nx_sampler_free(&s);
	free(logits);
}

/* --- stop strings -------------------------------------------------------- */

struct feed_out {
	char text[4096];
	size_t len;
	int rc;
};

static int feed(struct nx_stop *st, const char *piece, struct feed_out *o)
{
	char buf[1024];
	size_t n = 0;
	int rc = nx_stop_feed(st, piece, strlen(piece), buf, sizeof(buf), &n);
	assert_true(rc != NX_STOP_ERR);
	memcpy(o->text + o->len, buf, n);
	o->len += n;
	o->text[o->len] = '\0';
	o->rc = rc;
	return rc;
}

static void stop_init_ok(struct nx_stop *st, const char *const *s, int n)
{
	struct nx_err err = { { 0 } };
	if (nx_stop_init(st, s, n, &err))
		fail_msg("nx_stop_init: %s", err.msg);
}

static void test_stop_across_pieces(void **state)
{
	(void)state;
	const char *stops[] = { "</s>" };
	struct nx_stop st;
	stop_init_ok(&st, stops, 1);
	struct feed_out o = { .len = 0 };
	assert_int_equal(feed(&st, "Hello <", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "Hello ");
	assert_int_equal(feed(&st, "/", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "Hello ");
	assert_int_equal(feed(&st, "s> and more", &o), NX_STOP_HIT);
	assert_string_equal(o.text, "Hello ");
	assert_int_equal(st.hit_index, 0);
	/* after a hit nothing more comes out */
	assert_int_equal(feed(&st, "tail", &o), NX_STOP_HIT);
	assert_string_equal(o.text, "Hello ");
	char buf[NX_STOP_MAX_LEN];
	size_t n = 99;
	assert_int_equal(nx_stop_flush(&st, buf, sizeof(buf), &n), NX_STOP_HIT);
	assert_int_equal(n, 0);
}

static void test_stop_holdback_release(void **state)
{
	(void)state;
	const char *stops[] = { "STOP" };
	struct nx_stop st;
	stop_init_ok(&st, stops, 1);
	struct feed_out o = { .len = 0 };
	assert_int_equal(feed(&st, "go ST", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "go "); /* "ST" held */
	assert_int_equal(feed(&st, "O", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "go ");
	assert_int_equal(feed(&st, "RM", &o), NX_STOP_MORE); /* not a stop after all */
	assert_string_equal(o.text, "go STORM");
	/* a held tail at the end of generation is released by flush */
	assert_int_equal(feed(&st, " ST", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "go STORM ");
	char buf[NX_STOP_MAX_LEN];
	size_t n = 0;
	assert_int_equal(nx_stop_flush(&st, buf, sizeof(buf), &n), NX_STOP_MORE);
	assert_int_equal(n, 2);
	assert_memory_equal(buf, "ST", 2);
	/* a held prefix that restarts: "SSTOP" holds "S", then "S" again, then hits */
	nx_stop_reset(&st);
	struct feed_out o2 = { .len = 0 };
	assert_int_equal(feed(&st, "S", &o2), NX_STOP_MORE);
	assert_int_equal(feed(&st, "S", &o2), NX_STOP_MORE);
	assert_string_equal(o2.text, "S");
	assert_int_equal(feed(&st, "TOP", &o2), NX_STOP_HIT);
	assert_string_equal(o2.text, "S");
}

static void test_stop_multiple(void **state)
{
	(void)state;
	const char *stops[] = { "\n\n", "User:" };
	struct nx_stop st;
	stop_init_ok(&st, stops, 2);
	struct feed_out o = { .len = 0 };
	assert_int_equal(feed(&st, "Hi there\n", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "Hi there");
	assert_int_equal(feed(&st, "Us", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "Hi there\n");
	assert_int_equal(feed(&st, "er: hello", &o), NX_STOP_HIT);
	assert_string_equal(o.text, "Hi there\n");
	assert_int_equal(st.hit_index, 1);

	/* the stop that completes first wins, however the text was cut:
	 * "bc" ends before "abcd" does */
	const char *s2[] = { "abcd", "bc" };
	stop_init_ok(&st, s2, 2);
	struct feed_out w = { .len = 0 };
	assert_int_equal(feed(&st, "xabcd", &w), NX_STOP_HIT);
	assert_string_equal(w.text, "xa");
	assert_int_equal(st.hit_index, 1);
}

static void test_stop_at_start(void **state)
{
	(void)state;
	const char *stops[] = { "<|im_end|>", "###" };
	struct nx_stop st;
	stop_init_ok(&st, stops, 2);
	struct feed_out o = { .len = 0 };
	assert_int_equal(feed(&st, "<|im_end|>", &o), NX_STOP_HIT);
	assert_int_equal(o.len, 0);
	assert_int_equal(st.hit_index, 0);
	nx_stop_reset(&st);
	struct feed_out o2 = { .len = 0 };
	assert_int_equal(feed(&st, "#", &o2), NX_STOP_MORE);
	assert_int_equal(feed(&st, "#", &o2), NX_STOP_MORE);
	assert_int_equal(feed(&st, "#", &o2), NX_STOP_HIT);
	assert_int_equal(o2.len, 0);
}

/* Feeding the same text in random pieces always gives the same output,
 * which equals the text up to the first-completing stop, and never contains
 * any stop string. */
static void test_stop_chunking_invariant(void **state)
{
	(void)state;
	const char *stops[] = { "abc", "bca", "cc", "aaaa" };
	char text[200];
	lcg_state = 31337;
	for (int round = 0; round < 300; round++) {
		int tl = 1 + (int)(frand() * 60);
		for (int i = 0; i < tl; i++)
			text[i] = "abc"[(int)(frand() * 3) % 3];
		text[tl] = '\0';
		/* reference: the earliest end, then the earliest start */
		size_t cut = (size_t)tl;
		size_t best_end = SIZE_MAX;
		for (int k = 0; k < 4; k++) {
			const char *m = strstr(text, stops[k]);
			if (!m)
				continue;
			size_t st0 = (size_t)(m - text), end = st0 + strlen(stops[k]);
			if (end < best_end || (end == best_end && st0 < cut)) {
				best_end = end;
				cut = st0;
			}
		}
		for (int trial = 0; trial < 5; trial++) {
			struct nx_stop st;
			stop_init_ok(&st, stops, 4);
			struct feed_out o = { .len = 0 };
			int pos = 0, rc = NX_STOP_MORE;
			while (pos < tl && rc == NX_STOP_MORE) {
				int n = trial == 0 ? 1 : 1 + (int)(frand() * 5);
				if (n > tl - pos)
					n = tl - pos;
				char piece[8];
				memcpy(piece, text + pos, (size_t)n);
				piece[n] = '\0';
				rc = feed(&st, piece, &o);
				pos += n;
			}
			if (rc == NX_STOP_MORE) {
				char buf[NX_STOP_MAX_LEN];
				size_t n = 0;
				assert_int_equal(nx_stop_flush(&st, buf, sizeof(buf), &n), NX_STOP_MORE);
				memcpy(o.text + o.len, buf, n);
				o.len += n;
				o.text[o.len] = '\0';
			}
			assert_int_equal(rc == NX_STOP_HIT, best_end != SIZE_MAX);
			if (o.len != cut || memcmp(o.text, text, cut) != 0)
				fail_msg("text \"%s\" trial %d: got \"%s\", want the first %zu bytes", text, trial,
					 o.text, cut);
		}
	}
}

/* The protocol's stop strings (docs/protocol.md: at most 8, each 1..256
 * bytes) fit the matcher: the longest is held back piece by piece until it
 * completes, and one byte more is refused. */
static void test_stop_protocol_limit(void **state)
{
	(void)state;
	char s256[257], s257[258], other[257];
	memset(s256, 'q', 256);
	s256[255] = 'Z';
	s256[256] = '\0';
	memset(s257, 'q', 257);
	s257[257] = '\0';
	memset(other, 'q', 256);
	other[256] = '\0';
	const char *stops[8] = { s256, other, "a", "b", "c", "d", "e", "f" };
	struct nx_stop st;
	stop_init_ok(&st, stops, 8);
	struct feed_out o = { .len = 0 };
	assert_int_equal(feed(&st, "x", &o), NX_STOP_MORE);
	/* 255 bytes that begin both long strings: all held, one at a time */
	for (int i = 0; i < 255; i++)
		assert_int_equal(feed(&st, "q", &o), NX_STOP_MORE);
	assert_string_equal(o.text, "x");
	assert_int_equal(st.n_held, 255);
	assert_int_equal(feed(&st, "Zy", &o), NX_STOP_HIT);
	assert_int_equal(st.hit_index, 0);
	assert_string_equal(o.text, "x");

	/* a 256-byte run that is not quite a stop string comes out whole */
	nx_stop_reset(&st);
	struct feed_out p = { .len = 0 };
	char near[257];
	memcpy(near, s256, 257);
	near[255] = 'Y';
	assert_int_equal(feed(&st, near, &p), NX_STOP_MORE);
	assert_int_equal(st.n_held, 0);
	assert_int_equal(p.len, 256);
	assert_memory_equal(p.text, near, 256);

	const char *toolong[] = { "ok", s257 };
	struct nx_err err = { { 0 } };
	assert_int_equal(nx_stop_init(&st, toolong, 2, &err), -1);
	assert_string_equal(err.msg, "stop: stop string 1 is 257 bytes, at most 256 allowed");
}

static void test_stop_errors(void **state)
{
	(void)state;
	struct nx_stop st;
	struct nx_err err = { { 0 } };
	const char *many[NX_STOP_MAX + 1];
	for (int i = 0; i <= NX_STOP_MAX; i++)
		many[i] = "x";
	assert_int_equal(nx_stop_init(&st, many, NX_STOP_MAX + 1, &err), -1);
	assert_non_null(strstr(err.msg, "17"));
	const char *empty[] = { "ok", "" };
	assert_int_equal(nx_stop_init(&st, empty, 2, &err), -1);
	assert_non_null(strstr(err.msg, "stop string 1 is empty"));
	char longs[NX_STOP_MAX_LEN + 2];
	memset(longs, 'a', sizeof(longs) - 1);
	longs[sizeof(longs) - 1] = '\0';
	const char *toolong[] = { longs };
	assert_int_equal(nx_stop_init(&st, toolong, 1, &err), -1);
	char want[64];
	snprintf(want, sizeof(want), "%d bytes", NX_STOP_MAX_LEN + 1);
	assert_non_null(strstr(err.msg, want));

	/* the longest allowed string works */
	longs[NX_STOP_MAX_LEN] = '\0';
	stop_init_ok(&st, toolong, 1);
	struct feed_out o = { .len = 0 };
	assert_int_equal(feed(&st, "zz", &o), NX_STOP_MORE);
	assert_int_equal(feed(&st, longs, &o), NX_STOP_HIT);
	assert_string_equal(o.text, "zz");

	/* an output buffer that cannot hold held + piece: refused, nothing consumed */
	const char *s1[] = { "abc" };
	stop_init_ok(&st, s1, 1);
	char out[4];
	size_t n = 0;
	assert_int_equal(nx_stop_feed(&st, "xxab", 4, out, sizeof(out), &n), NX_STOP_MORE);
	assert_int_equal(n, 2);
	assert_int_equal(nx_stop_feed(&st, "xyz", 3, out, sizeof(out), &n), NX_STOP_ERR);
	assert_int_equal(nx_stop_feed(&st, "c", 1, out, sizeof(out), &n), NX_STOP_HIT);
	assert_int_equal(n, 0);

	/* no stop strings: everything passes straight through */
	stop_init_ok(&st, NULL, 0);
	struct feed_out p = { .len = 0 };
	assert_int_equal(feed(&st, "any thing", &p), NX_STOP_MORE);
	assert_string_equal(p.text, "any thing");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_params),
		cmocka_unit_test(test_rng_vectors),
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_seeds),
		cmocka_unit_test(test_topk1_is_greedy),
		cmocka_unit_test(test_tiny_top_p_and_full_min_p),
		cmocka_unit_test(test_top_k_set),
		cmocka_unit_test(test_top_p_exact_cut),
		cmocka_unit_test(test_min_p_filter),
		cmocka_unit_test(test_truncated_distribution),
		cmocka_unit_test(test_temperature_statistics),
		cmocka_unit_test(test_repeat_penalty),
		cmocka_unit_test(test_presence_frequency_penalties),
		cmocka_unit_test(test_logprobs),
		cmocka_unit_test(test_non_finite_logits),
		cmocka_unit_test(test_vocab_lengths),
		cmocka_unit_test(test_grouped_greedy),
		cmocka_unit_test(test_grouped_top_k),
		cmocka_unit_test(test_defaults_large_vocab),
		cmocka_unit_test(test_stop_across_pieces),
		cmocka_unit_test(test_stop_holdback_release),
		cmocka_unit_test(test_stop_multiple),
		cmocka_unit_test(test_stop_at_start),
		cmocka_unit_test(test_stop_chunking_invariant),
		cmocka_unit_test(test_stop_errors),
		cmocka_unit_test(test_stop_protocol_limit),
	};
	return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
