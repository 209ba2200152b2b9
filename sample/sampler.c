/* sampler.c - the token sampler: penalty, greedy, top-k, temperature, top-p, min-p, seeded draw (see sampler.h). */
#include "sample/sampler.h"

#include "common/splitmix.h"

#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct nx_sample_params nx_sample_params_default(void)
{
	return (struct nx_sample_params){
		.temperature = 0.8f,
		.top_k = 40,
		.top_p = 0.95f,
		.min_p = 0.05f,
		.repeat_penalty = 1.0f,
		.repeat_last_n = 64,
		.seed = 0,
		.n_logprobs = 0,
	};
}

int nx_sample_params_check(const struct nx_sample_params *p, struct nx_err *err)
{
	if (!p)
		return nx_errf(err, "sample: no parameters");
	/* Written as !(ok) so NaN fails every test. */
	if (!(p->temperature >= 0.0f) || isinf(p->temperature))
		return nx_errf(err, "sample: temperature %g must be a finite number >= 0 (0 is greedy)",
			       (double)p->temperature);
	if (p->top_k < 0)
		return nx_errf(err, "sample: top_k %d must be >= 0 (0 turns it off)", p->top_k);
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return nx_errf(err, "sample: top_p %g must be in (0, 1] (1 turns it off)", (double)p->top_p);
	if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
		return nx_errf(err, "sample: min_p %g must be in [0, 1] (0 turns it off)", (double)p->min_p);
	if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
		return nx_errf(err, "sample: repeat_penalty %g must be a finite number > 0 (1 turns it off)",
			       (double)p->repeat_penalty);
	if (p->repeat_last_n < 0)
		return nx_errf(err, "sample: repeat_last_n %d must be >= 0 (0 turns the penalty off)",
			       p->repeat_last_n);
	if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
		return nx_errf(err, "sample: presence_penalty %g must be in [-2, 2] (0 turns it off)",
			       (double)p->presence_penalty);
	if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
		return nx_errf(err, "sample: frequency_penalty %g must be in [-2, 2] (0 turns it off)",
			       (double)p->frequency_penalty);
	if (p->count_from < 0)
		return nx_errf(err, "sample: count_from %d must be >= 0", p->count_from);
	if (p->n_logprobs < 0 || p->n_logprobs > NX_SAMPLE_MAX_LOGPROBS)
		return nx_errf(err, "sample: n_logprobs %d must be in [0, %d]", p->n_logprobs,
			       NX_SAMPLE_MAX_LOGPROBS);
	return 0;
}

/* --- generator: xoshiro256** (Blackman & Vigna), seeded by splitmix64 ------ */

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* splitmix64 spreads any seed (0 included) over the 256-bit state, so the
 * state is never all zero in practice and nearby seeds give unrelated streams. */
void nx_rng_seed(uint64_t st[4], uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		st[i] = nx_splitmix64(&x);
}

uint64_t nx_rng_next(uint64_t s[4])
{
	const uint64_t result = rotl(s[1] * 5, 7) * 9;
	const uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double nx_rng_uniform(uint64_t st[4])
{
	return (double)(nx_rng_next(st) >> 11) * 0x1.0p-53;
}

/* --- passes over the whole vocabulary ---------------------------------- */

/* Four floats at a time with GCC's vector extensions (SSE2 on any x86-64).
 * These passes are most of the sampling time, and the daemon samples every
 * sequence between two steps while the workers wait: one scalar compare per
 * logit at a time took 61 us per token for SmolLM2's 49152 logits greedy and
 * 124 us with the default top-k 40, four times a step with 4 clients. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p)
{
	v4f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* m ? a : b per lane (m: all ones or zero) */
static inline v4f v4_sel(v4i m, v4f a, v4f b)
{
	return (v4f)((m & (v4i)a) | (~m & (v4i)b));
}

static inline int v4_any(v4i m)
{
	return (m[0] | m[1] | m[2] | m[3]) != 0;
}

/* A logit as the sampler sees it: NaN as -inf and +inf as FLT_MAX (the
 * finite largest value keeps the order and the arithmetic below finite). */
static inline float clean(float x)
{
	return x != x ? -INFINITY : x < FLT_MAX ? x : FLT_MAX;
}

static inline v4f v4_clean(v4f x)
{
	const v4f big = {FLT_MAX, FLT_MAX, FLT_MAX, FLT_MAX};
	const v4f ninf = -(v4f){INFINITY, INFINITY, INFINITY, INFINITY};
	return v4_sel(x != x, ninf, v4_sel(x > big, big, x));
}

/* w = clean(logits). */
static void sanitize(float *w, const float *logits, int n)
{
	int i = 0;
	for (; i + 4 <= n; i += 4) {
		const v4f y = v4_clean(v4_load(logits + i));
		memcpy(w + i, &y, sizeof(y));
	}
	for (; i < n; i++)
		w[i] = clean(logits[i]);
}

/* The lowest id of the largest value of w[0..n) (no NaN in w); -1 when every
 * value is -inf: the largest value, then the first id that has it. */
static int32_t first_max(const float *w, int n)
{
	float mx = -INFINITY;
	int i = 0;
	if (n >= 4) {
		v4f m = v4_load(w);
		for (i = 4; i + 4 <= n; i += 4) {
			const v4f x = v4_load(w + i);
			m = v4_sel(x > m, x, m);
		}
		for (int j = 0; j < 4; j++)
			mx = m[j] > mx ? m[j] : mx;
	}
	for (; i < n; i++)
		mx = w[i] > mx ? w[i] : mx;
	if (mx == -INFINITY)
		return -1;
	for (i = 0; i + 4 <= n; i += 4) {
		const v4f x = v4_load(w + i);
		if (v4_any(x == (v4f){mx, mx, mx, mx}))
			break;
	}
	for (; w[i] != mx; i++)
		;
	return i;
}

void nx_sample_group_max(const float *x, int n, float *gmax)
{
	int i = 0, g = 0;
	for (; i + NX_SAMPLE_GROUP <= n; i += NX_SAMPLE_GROUP, g++) {
		v4f m = v4_clean(v4_load(x + i));
		for (int k = 4; k < NX_SAMPLE_GROUP; k += 4) {
			const v4f y = v4_clean(v4_load(x + i + k));
			m = v4_sel(y > m, y, m);
		}
		float mx = m[0];
		for (int j = 1; j < 4; j++)
			mx = m[j] > mx ? m[j] : mx;
		gmax[g] = mx;
	}
	if (i < n) {
		float mx = -INFINITY;
		for (; i < n; i++)
			mx = clean(x[i]) > mx ? clean(x[i]) : mx;
		gmax[g] = mx;
	}
}

/* Greedy from the group maxima: the first id with the largest value, or -1
 * when the row must be scanned instead (no finite maximum, or the group gmax
 * points to does not hold it). gmax is copied before it is looked at: the
 * workers could change it under us. */
static int32_t grouped_first_max(struct nx_sampler *s, const float *logits, const float *gmax)
{
	const int n = s->n_vocab, ng = (n + NX_SAMPLE_GROUP - 1) / NX_SAMPLE_GROUP;
	sanitize(s->work, gmax, ng);
	const int32_t g = first_max(s->work, ng);
	if (g < 0)
		return -1;
	const float mx = s->work[g];
	const int end = (g + 1) * NX_SAMPLE_GROUP < n ? (g + 1) * NX_SAMPLE_GROUP : n;
	for (int i = g * NX_SAMPLE_GROUP; i < end; i++)
		if (clean(logits[i]) == mx)
			return i;
	return -1;
}

int32_t nx_sample_greedy(struct nx_sampler *s, const float *logits, const float *gmax)
{
	const int32_t tok = gmax ? grouped_first_max(s, logits, gmax) : -1;
	if (tok >= 0)
		return tok;
	sanitize(s->work, logits, s->n_vocab);
	return first_max(s->work, s->n_vocab);
}

/* --- ordering of candidate ids ----------------------------------------- */

/* A strict total order: larger logit first, equal logits by lower id. Being
 * total (no two ids compare equal) keeps selection and sorting deterministic
 * and stops all-equal rows from degrading the partition. */
static inline int before(const float *v, int32_t a, int32_t b)
{
	return v[a] > v[b] || (v[a] == v[b] && a < b);
}

static inline void swap_id(int32_t *a, int32_t *b)
{
	int32_t t = *a;
	*a = *b;
	*b = t;
}

/* Median of idx[lo], idx[mid], idx[hi] moved to idx[hi]; then Lomuto
 * partition. Returns the pivot's final position: everything left of it
 * comes before it. */
static int partition(int32_t *idx, int lo, int hi, const float *v)
{
	int mid = lo + (hi - lo) / 2;
	if (before(v, idx[mid], idx[lo]))
		swap_id(&idx[mid], &idx[lo]);
	if (before(v, idx[hi], idx[lo]))
		swap_id(&idx[hi], &idx[lo]);
	if (before(v, idx[hi], idx[mid]))
		swap_id(&idx[hi], &idx[mid]);
	/* now lo <= mid <= hi in the order: the median is at mid */
	swap_id(&idx[mid], &idx[hi]);
	int32_t piv = idx[hi];
	int store = lo;
	for (int i = lo; i < hi; i++)
		if (before(v, idx[i], piv))
			swap_id(&idx[i], &idx[store++]);
	swap_id(&idx[store], &idx[hi]);
	return store;
}

static void sift_down(int32_t *a, int root, int n, const float *v)
{
	for (;;) {
		int c = 2 * root + 1;
		if (c >= n)
			return;
		/* max-heap under before(): the root is the id that comes last */
		if (c + 1 < n && before(v, a[c], a[c + 1]))
			c++;
		if (!before(v, a[root], a[c]))
			return;
		swap_id(&a[root], &a[c]);
		root = c;
	}
}

static void heap_sort(int32_t *a, int n, const float *v)
{
	for (int i = n / 2 - 1; i >= 0; i--)
		sift_down(a, i, n, v);
	for (int end = n - 1; end > 0; end--) {
		swap_id(&a[0], &a[end]);
		sift_down(a, 0, end, v);
	}
}

static int depth_budget(int n)
{
	int d = 0;
	while (n > 1) {
		n >>= 1;
		d++;
	}
	return 2 * d + 4;
}

/* Introsort: quicksort, insertion sort on short ranges, heapsort when the
 * depth budget runs out. Our own rather than qsort_r, which may malloc. */
static void sort_rec(int32_t *a, int lo, int hi, int budget, const float *v)
{
	while (hi - lo > 16) {
		if (budget-- == 0) {
			heap_sort(a + lo, hi - lo + 1, v);
			return;
		}
		int p = partition(a, lo, hi, v);
		/* recurse into the smaller side, loop on the larger: stack depth O(log n) */
		if (p - lo < hi - p) {
			sort_rec(a, lo, p - 1, budget, v);
			lo = p + 1;
		} else {
			sort_rec(a, p + 1, hi, budget, v);
			hi = p - 1;
		}
	}
	for (int i = lo + 1; i <= hi; i++) {
		int32_t x = a[i];
		int j = i - 1;
		while (j >= lo && before(v, x, a[j])) {
			a[j + 1] = a[j];
			j--;
		}
		a[j + 1] = x;
	}
}

static void sort_ids(int32_t *a, int n, const float *v)
{
	if (n > 1)
		sort_rec(a, 0, n - 1, depth_budget(n), v);
}

/* Introselect: afterwards idx[0..k) holds the k ids that come first, in no
 * particular order. Expected O(n). */
static void select_top(int32_t *idx, int n, int k, const float *v)
{
	if (k <= 0 || k >= n)
		return;
	int lo = 0, hi = n - 1, budget = depth_budget(n);
	while (hi > lo) {
		if (budget-- == 0) {
			sort_ids(idx + lo, hi - lo + 1, v);
			return;
		}
		int p = partition(idx, lo, hi, v);
		if (p == k - 1 || p == k)
			return;
		if (p > k)
			hi = p - 1;
		else
			lo = p + 1;
	}
}

/* One pass: the k ids (finite logits only) that come first, into h[0..ret)
 * as a heap whose root is the one that comes last. Once the heap is full, a
 * later id comes before the root only with a larger logit (ties go to the
 * lower id), so most of the vocabulary costs one compare against a threshold,
 * eight at a time. */
static int heap_top(const float *w, int n, int k, int32_t *h)
{
	int c = 0;
	int32_t i = 0;
	for (; i < n && c < k; i++) {
		if (w[i] == -INFINITY)
			continue;
		int j = c++;
		while (j > 0) {
			int par = (j - 1) / 2;
			if (!before(w, h[par], i))
				break;
			h[j] = h[par];
			j = par;
		}
		h[j] = i;
	}
	if (c < k)
		return c;
	float thr = w[h[0]]; /* finite: -inf never enters */
	for (; i < n; i += 8) {
		const int m = n - i < 8 ? n - i : 8;
		const v4f t = {thr, thr, thr, thr};
		if (m == 8 && !v4_any((v4_load(w + i) > t) | (v4_load(w + i + 4) > t)))
			continue;
		for (int32_t j = i; j < i + m; j++)
			if (w[j] > thr) {
				h[0] = j;
				sift_down(h, 0, k, w);
				thr = w[h[0]];
			}
	}
	return c;
}

/* Rearranges idx[0..c) so that idx[0..ret) is the smallest prefix, in
 * before() order, whose weight (wt[id]) reaches target; all c when none does.
 * Quickselect on the cut: each partition sums the better side and recurses
 * into the side that holds the cut, so nothing is sorted but the last short
 * range. */
static int topp_select(int32_t *idx, int c, const float *w, const float *wt, double target)
{
	int lo = 0, hi = c - 1, budget = depth_budget(c);
	double acc = 0.0; /* weight of idx[0..lo), all kept */
	while (lo <= hi) {
		if (hi - lo < 16 || budget-- == 0) {
			sort_ids(idx + lo, hi - lo + 1, w);
			for (int i = lo; i <= hi; i++) {
				acc += wt[idx[i]];
				if (acc >= target)
					return i + 1;
			}
			return hi + 1;
		}
		int p = partition(idx, lo, hi, w);
		double left = 0.0;
		for (int i = lo; i < p; i++)
			left += wt[idx[i]];
		if (acc + left >= target) {
			hi = p - 1;
		} else if (acc + left + wt[idx[p]] >= target) {
			return p + 1;
		} else {
			acc += left + wt[idx[p]];
			lo = p + 1;
		}
	}
	return lo;
}

/* --- sampler ------------------------------------------------------------ */

int nx_sampler_reset(struct nx_sampler *s, const struct nx_sample_params *p, struct nx_err *err)
{
	if (nx_sample_params_check(p, err))
		return -1;
	s->p = *p;
	nx_rng_seed(s->rng, p->seed);
	s->last_logprob = 0.0f;
	return 0;
}

int nx_sampler_init(struct nx_sampler *s, int n_vocab, const struct nx_sample_params *p,
		    struct nx_err *err)
{
	memset(s, 0, sizeof(*s));
	if (n_vocab <= 0)
		return nx_errf(err, "sample: n_vocab %d must be > 0", n_vocab);
	if (nx_sample_params_check(p, err))
		return -1;
	size_t n = (size_t)n_vocab;
	s->work = malloc(n * sizeof(*s->work));
	s->idx = malloc(n * sizeof(*s->idx));
	s->weight = malloc(n * sizeof(*s->weight));
	s->stamp = calloc(n, sizeof(*s->stamp));
	s->count = malloc(n * sizeof(*s->count));
	if (!s->work || !s->idx || !s->weight || !s->stamp || !s->count) {
		nx_sampler_free(s);
		return nx_errf(err, "sample: out of memory for a sampler over %d tokens", n_vocab);
	}
	s->n_vocab = n_vocab;
	return nx_sampler_reset(s, p, err);
}

void nx_sampler_free(struct nx_sampler *s)
{
	free(s->work);
	free(s->idx);
	free(s->weight);
	free(s->stamp);
	free(s->count);
	memset(s, 0, sizeof(*s));
}

float nx_sampler_last_logprob(const struct nx_sampler *s)
{
	return s->last_logprob;
}

/* Whether apply_penalty changes anything. */
static bool penalty_applies(const struct nx_sampler *s, const int32_t *history, int n_history)
{
	return s->p.repeat_penalty != 1.0f && s->p.repeat_last_n != 0 && history && n_history > 0;
}

/* Whether the presence or frequency penalty changes anything. They may
 * raise logits (a negative penalty), so the grouped shortcuts stay off. */
static bool counts_apply(const struct nx_sampler *s, const int32_t *history, int n_history)
{
	return (s->p.presence_penalty != 0.0f || s->p.frequency_penalty != 0.0f) && history &&
	       n_history > s->p.count_from;
}

/* A fresh stamp generation: ids stamped with it were seen in this pass. */
static uint32_t next_gen(struct nx_sampler *s)
{
	if (++s->gen == 0) { /* wrapped: old stamps could collide */
		memset(s->stamp, 0, (size_t)s->n_vocab * sizeof(*s->stamp));
		s->gen = 1;
	}
	return s->gen;
}

/* OpenAI's definition: logit - frequency * count - presence * (count > 0),
 * count over the generated tokens; one pass counts, one subtracts once per id. */
static void apply_counts(struct nx_sampler *s, const int32_t *history, int n_history)
{
	if (!counts_apply(s, history, n_history))
		return;
	const double fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
	const uint32_t g = next_gen(s);
	for (int j = s->p.count_from; j < n_history; j++) {
		int32_t id = history[j];
		if (id < 0 || id >= s->n_vocab)
			continue;
		if (s->stamp[id] != g) {
			s->stamp[id] = g;
			s->count[id] = 0;
		}
		s->count[id]++;
	}
	const uint32_t g2 = next_gen(s);
	for (int j = s->p.count_from; j < n_history; j++) {
		int32_t id = history[j];
		if (id < 0 || id >= s->n_vocab || s->stamp[id] == g2)
			continue;
		s->stamp[id] = g2;
		s->work[id] = (float)((double)s->work[id] - fp * s->count[id] - pp);
	}
}

/* Divides positive logits by the penalty and multiplies negative ones, once
 * per distinct token among the last repeat_last_n of history; then the
 * presence and frequency penalties. */
static void apply_penalty(struct nx_sampler *s, const int32_t *history, int n_history)
{
	const float pen = s->p.repeat_penalty;
	if (!penalty_applies(s, history, n_history)) {
		apply_counts(s, history, n_history);
		return;
	}
	next_gen(s);
	int from = n_history > s->p.repeat_last_n ? n_history - s->p.repeat_last_n : 0;
	for (int j = from; j < n_history; j++) {
		int32_t id = history[j];
		if (id < 0 || id >= s->n_vocab || s->stamp[id] == s->gen)
			continue;
		s->stamp[id] = s->gen;
		float *x = &s->work[id];
		*x = *x > 0.0f ? *x / pen : *x * pen;
	}
	apply_counts(s, history, n_history);
}

/* The m most likely ids (finite logits only) with their log-softmax. */
static int top_logprobs(const struct nx_sampler *s, double lse, struct nx_logprob *top, int m)
{
	const float *w = s->work;
	int32_t best[NX_SAMPLE_MAX_LOGPROBS];
	int c = 0;
	for (int32_t i = 0; i < s->n_vocab; i++) {
		if (w[i] == -INFINITY)
			continue;
		if (c == m && !before(w, i, best[c - 1]))
			continue;
		int j = c < m ? c++ : m - 1;
		while (j > 0 && before(w, i, best[j - 1])) {
			best[j] = best[j - 1];
			j--;
		}
		best[j] = i;
	}
	for (int j = 0; j < c; j++)
		top[j] = (struct nx_logprob){ .id = best[j], .logprob = (float)(w[best[j]] - lse) };
	return c;
}

/* Top-k from the group maxima (0 < k <= NX_SAMPLE_HEAP_K): the k ids that
 * come first, in before() order, into idx[0..ret), with w (sanitized,
 * penalized) set at every id of the groups that can hold them; -1 when the
 * row must be scanned instead. Each of the k largest group maxima is an id at
 * least as good as the k-th largest of them, thr, so the k first ids all lie
 * in the groups whose maximum reaches thr. A penalty lowers logits (one that
 * raises them, repeat_penalty < 1, sends the row to the scan); the P ids it
 * touches can push at most P others up, so thr is taken over k + P groups.
 * A group that does not hold the maximum gmax gives it sends the row to the
 * scan too (one lower than it holds cannot be seen without the scan: a faulty
 * worker can hide a group, as it could write other logits). Memory: the
 * groups' maxima, then their logits side by side, in weight; the groups, the
 * heap's positions and the ids in idx. */
static int grouped_top_k(struct nx_sampler *s, const float *logits, const float *gmax, const int32_t *history,
			 int n_history, int k)
{
	enum { G = NX_SAMPLE_GROUP };
	const int n = s->n_vocab, ng = (n + G - 1) / G;
	float *w = s->work, *gw = s->weight;
	int32_t *idx = s->idx;
	int pen = 0;
	if (counts_apply(s, history, n_history))
		return -1;
	if (penalty_applies(s, history, n_history)) {
		if (s->p.repeat_penalty < 1.0f)
			return -1;
		pen = n_history < s->p.repeat_last_n ? n_history : s->p.repeat_last_n;
	}
	const int kk = k + pen, cap = 4 * kk; /* more groups than cap reach thr: many equal maxima, scan */
	if (kk >= ng || cap * G > n || cap + 2 * k > n)
		return -1;
	sanitize(gw, gmax, ng); /* a copy: the workers could change gmax under us */
	if (heap_top(gw, ng, kk, idx) < kk)
		return -1; /* fewer groups with a finite maximum */
	const float thr = gw[idx[0]];
	int m = 0;
	const v4f tv = {thr, thr, thr, thr};
	for (int g = 0; g < ng; g++) {
		if (ng - g >= 8 && !v4_any((v4_load(gw + g) >= tv) | (v4_load(gw + g + 4) >= tv))) {
			g += 7; /* none of these eight */
			continue;
		}
		if (gw[g] >= thr) {
			if (m == cap)
				return -1;
			idx[m++] = g;
		}
	}
	for (int i = 0; i < m; i++) {
		const int a = idx[i] * G, len = a + G < n ? G : n - a;
		sanitize(w + a, logits + a, len);
		float mx = -INFINITY;
		for (int j = 0; j < len; j++)
			mx = w[a + j] > mx ? w[a + j] : mx;
		if (mx != gw[idx[i]])
			return -1; /* a maximum the group does not hold would have raised thr */
	}
	apply_penalty(s, history, n_history);
	/* Each of the k best is >= thr: kk groups hold a token >= thr and at most
	 * pen of those are penalized (which only lowers a logit). So the heap sees
	 * only those (-inf it skips), which spares it most of its replacements. */
	for (int i = 0; i < m; i++)
		for (int j = 0; j < G; j++) {
			const int id = idx[i] * G + j;
			gw[i * G + j] = id < n && w[id] >= thr ? w[id] : -INFINITY;
		}
	/* positions follow ids, so heap_top's ties go to the lower id as before() does */
	int32_t *pos = idx + m, *ids = pos + k;
	const int c = heap_top(gw, m * G, k, pos);
	for (int i = 0; i < c; i++)
		ids[i] = idx[pos[i] / G] * G + pos[i] % G;
	memmove(idx, ids, (size_t)c * sizeof(*idx));
	sort_ids(idx, c, w);
	return c;
}

int32_t nx_sample(struct nx_sampler *s, const float *logits, const int32_t *history, int n_history,
		  struct nx_logprob *top, int *n_top)
{
	return nx_sample_grouped(s, logits, NULL, history, n_history, top, n_top);
}

static int32_t sample_row(struct nx_sampler *s, const float *logits, const float *gmax, const uint64_t *allowed,
			  const int32_t *history, int n_history, struct nx_logprob *top, int *n_top);

int32_t nx_sample_grouped(struct nx_sampler *s, const float *logits, const float *gmax, const int32_t *history,
			  int n_history, struct nx_logprob *top, int *n_top)
{
	return sample_row(s, logits, gmax, NULL, history, n_history, top, n_top);
}

int32_t nx_sample_masked(struct nx_sampler *s, const float *logits, const uint64_t *allowed, const int32_t *history,
			 int n_history, struct nx_logprob *top, int *n_top)
{
	return sample_row(s, logits, NULL, allowed, history, n_history, top, n_top);
}

/* Tokens outside the allowed set get -inf: every later pass (log-probs,
 * top-k, softmax) then sees the distribution renormalized over the allowed. */
static void apply_mask(float *w, int n, const uint64_t *allowed)
{
	for (int i = 0; i < n; i += 64) {
		const uint64_t m = allowed[i >> 6];
		const int len = n - i < 64 ? n - i : 64;
		if (m == UINT64_MAX && len == 64)
			continue;
		for (int j = 0; j < len; j++)
			if (!((m >> j) & 1))
				w[i + j] = -INFINITY;
	}
}

static int32_t sample_row(struct nx_sampler *s, const float *logits, const float *gmax, const uint64_t *allowed,
			  const int32_t *history, int n_history, struct nx_logprob *top, int *n_top)
{
	const struct nx_sample_params *p = &s->p;
	const int n = s->n_vocab;
	float *w = s->work, *wt = s->weight;
	int32_t *idx = s->idx;

	if (n_top)
		*n_top = 0;
	s->last_logprob = 0.0f;
	const float inv_t = p->temperature > 0.0f ? 1.0f / p->temperature : 0.0f;
	/* a subnormal temperature (1/T = inf) is greedy too: 0 * inf would make
	 * the best token's weight NaN below */
	const bool greedy = p->temperature == 0.0f || isinf(inv_t);
	const bool heap_k = p->top_k > 0 && p->top_k <= NX_SAMPLE_HEAP_K && p->top_k < n;
	if (gmax && greedy && !penalty_applies(s, history, n_history) && !counts_apply(s, history, n_history) &&
	    p->n_logprobs == 0) {
		const int32_t tok = grouped_first_max(s, logits, gmax);
		if (tok >= 0) {
			s->n_grouped++;
			return tok;
		}
	}

	/* The candidates idx[0..c) and the best token (w holds their logits). */
	int c = -1;
	int32_t best, tok;
	double lse = 0.0;
	if (gmax && !greedy && heap_k && p->n_logprobs == 0)
		c = grouped_top_k(s, logits, gmax, history, n_history, p->top_k);
	if (c > 0) {
		best = idx[0];
		s->n_grouped++;
	} else {
		sanitize(w, logits, n);
		apply_penalty(s, history, n_history);
		if (allowed)
			apply_mask(w, n, allowed);
		best = first_max(w, n);
		if (best < 0)
			return -1;
		if (p->n_logprobs > 0) {
			double z = 0.0;
			for (int i = 0; i < n; i++)
				z += exp((double)w[i] - w[best]);
			lse = w[best] + log(z);
			if (top && n_top)
				*n_top = top_logprobs(s, lse, top, p->n_logprobs < n ? p->n_logprobs : n);
		}
		tok = best;
		if (greedy)
			goto out;
		if (heap_k) {
			c = heap_top(w, n, p->top_k, idx);
			sort_ids(idx, c, w); /* the order grouped_top_k gives: the draw below depends on it */
		} else {
			c = 0;
			for (int32_t i = 0; i < n; i++)
				if (w[i] != -INFINITY)
					idx[c++] = i;
			if (p->top_k > 0 && p->top_k < c) {
				select_top(idx, c, p->top_k, w);
				c = p->top_k;
			}
		}
	}
	const float wmax = w[best];

	/* Weights relative to the best token (whose weight is exactly 1); the
	 * best token survives every filter below. */
	double z = 0.0;
	for (int i = 0; i < c; i++) {
		float e = expf((w[idx[i]] - wmax) * inv_t);
		wt[idx[i]] = e;
		z += e;
	}
	int keep = c;
	if (p->top_p < 1.0f)
		keep = topp_select(idx, c, w, wt, (double)p->top_p * z);

	/* min-p: p >= min_p * p_max, and p_max is weight 1 */
	double sum = 0.0;
	int k2 = 0;
	for (int i = 0; i < keep; i++) {
		float e = wt[idx[i]];
		if (e < p->min_p)
			continue;
		idx[k2++] = idx[i];
		sum += e;
	}

	double r = nx_rng_uniform(s->rng) * sum, cum = 0.0;
	tok = idx[k2 - 1];
	for (int i = 0; i < k2; i++) {
		cum += wt[idx[i]];
		if (r < cum) {
			tok = idx[i];
			break;
		}
	}
out:
	if (p->n_logprobs > 0)
		s->last_logprob = (float)(w[tok] - lse);
	return tok;
}
