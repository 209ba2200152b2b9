/* sampler.h - picks the next token from a row of logits: repetition penalty, greedy, top-k, temperature, top-p, min-p, seeded draw.
 *
 * One sampler per sequence, owned by the supervisor. Every buffer is sized for
 * n_vocab at init, so nx_sample() never allocates; the daemon embeds one
 * struct nx_sampler per slot and calls nx_sampler_reset() for each request.
 *
 * Order (llama.cpp's classic chain, also HF's warper order):
 *   1. repetition penalty over the distinct tokens among the last
 *      repeat_last_n of history: a positive logit is divided by the penalty,
 *      a negative one multiplied (llama.cpp / CTRL paper); then OpenAI's
 *      presence and frequency penalties over the generated tokens
 *      (history[count_from..]): logit - frequency_penalty * count -
 *      presence_penalty * (count > 0), count = how often the id was drawn;
 *   2. temperature == 0: greedy, argmax, ties to the lowest id;
 *   3. top-k (k == 0: off), by partial selection, not a full sort;
 *   4. softmax of the survivors at the temperature;
 *   5. top-p: the smallest prefix, in descending probability, whose sum is
 *      >= top_p (1: off);
 *   6. min-p: keep p >= min_p * p_max (0: off);
 *   7. renormalize and draw with the sampler's own xoshiro256** generator,
 *      seeded through splitmix64, so a (seed, sequence of calls) pair always
 *      gives the same tokens.
 *
 * Nothing sorts the vocabulary. Top-k with k <= NX_SAMPLE_HEAP_K keeps a
 * k-entry heap in one pass over the logits (most tokens cost one compare),
 * then sorts the k; larger k uses quickselect. With the workers' group maxima
 * (nx_sample_grouped) greedy and top-k read a few groups instead of the row. Top-p uses a quickselect that partitions by
 * logit and sums the probability mass on the better side, recursing into the
 * side that holds the cut: expected O(n), and the kept set is exactly the
 * smallest prefix in (logit desc, id asc) order, left unordered (the draw
 * does not need an order). Ties between equal logits go to the lower id
 * everywhere, so results never depend on memory order.
 *
 * Log-probabilities (n_logprobs > 0): the n most likely tokens of the
 * log-softmax of the full vocabulary after the penalties, at
 * temperature 1 and before any truncation: what the model (with the penalty
 * applied) believes, not what the truncated sampler would draw.
 *
 * Non-finite logits are not trusted (workers write them into shared memory):
 * NaN counts as -inf and +inf as FLT_MAX. A row with no finite logit at all
 * makes nx_sample() return -1. */
#ifndef NX_SAMPLER_H
#define NX_SAMPLER_H

#include <stdint.h>

#include "common/err.h"

#define NX_SAMPLE_MAX_LOGPROBS 20
#define NX_SAMPLE_HEAP_K 256

/* Defaults (llama.cpp-like): temperature 0.8, top_k 40, top_p 0.95,
 * min_p 0.05, repeat_penalty 1.0 (off), repeat_last_n 64, seed 0 (every
 * value is a valid seed; the daemon picks a fresh one when a client gives
 * none), n_logprobs 0. Greedy decoding is temperature 0. */
struct nx_sample_params {
	float temperature;    /* >= 0, finite; 0 = greedy */
	int top_k;            /* >= 0; 0 = off */
	float top_p;          /* (0, 1]; 1 = off */
	float min_p;          /* [0, 1]; 0 = off */
	float repeat_penalty; /* > 0; 1 = off */
	int repeat_last_n;    /* >= 0 tokens of history penalized; 0 = off */
	float presence_penalty;  /* [-2, 2]; 0 = off */
	float frequency_penalty; /* [-2, 2]; 0 = off */
	int count_from;       /* >= 0: history index of the first generated token, where those two count from */
	uint64_t seed;
	int n_logprobs;       /* [0, NX_SAMPLE_MAX_LOGPROBS] */
};

struct nx_logprob {
	int32_t id;
	float logprob;        /* natural log */
};

struct nx_sampler {
	int n_vocab;
	struct nx_sample_params p;
	uint64_t rng[4];      /* xoshiro256** state */
	float *work;          /* (n_vocab) logits after sanitizing and penalty */
	int32_t *idx;         /* (n_vocab) candidate ids, partially ordered */
	float *weight;        /* (n_vocab) by token id: exp((logit - max) / T) of candidates */
	uint32_t *stamp;      /* (n_vocab) penalty dedupe: stamp[id] == gen means seen this call */
	uint32_t *count;      /* (n_vocab) presence/frequency: draws of id, valid where stamp[id] is this call's */
	uint32_t gen;
	float last_logprob;   /* log-softmax of the last token drawn (n_logprobs > 0) */
	uint64_t n_grouped;   /* calls nx_sample_grouped answered from the group maxima */
};

/* The documented defaults. */
struct nx_sample_params nx_sample_params_default(void);

/* 0, or -1 with a message naming the field and its value. */
int nx_sample_params_check(const struct nx_sample_params *p, struct nx_err *err);

/* Allocates the per-vocabulary buffers and seeds the generator. */
int nx_sampler_init(struct nx_sampler *s, int n_vocab, const struct nx_sample_params *p,
		    struct nx_err *err);
void nx_sampler_free(struct nx_sampler *s);

/* New parameters and a reseeded generator for the next request; no allocation. */
int nx_sampler_reset(struct nx_sampler *s, const struct nx_sample_params *p, struct nx_err *err);

/* logits: (n_vocab). history: the sequence so far (prompt and generated),
 * ids outside [0, n_vocab) are ignored. top: room for p.n_logprobs entries
 * (may be NULL when n_logprobs == 0); *n_top gets how many were written,
 * most likely first. Returns the token id, or -1 when no logit is finite. */
int32_t nx_sample(struct nx_sampler *s, const float *logits, const int32_t *history, int n_history,
		  struct nx_logprob *top, int *n_top);

/* Logits rows are written by the workers, who also write each row's group
 * maxima: one value per NX_SAMPLE_GROUP ids. Greedy decoding and top-k then
 * read those and the few groups that can hold the answer instead of the
 * whole row (the supervisor's pass over 49152 logits written on other cores
 * was the largest part of its turn between two steps). */
#define NX_SAMPLE_GROUP 16

/* gmax[g] = the largest of x[16g .. min(16g + 16, n)), NaN counting as -inf
 * and +inf as FLT_MAX, for g < ceil(n / 16). */
void nx_sample_group_max(const float *x, int n, float *gmax);

/* nx_sample, given the row's group maxima gmax (ceil(n_vocab / 16) values,
 * or NULL). Without log-probs, greedy without a penalty reads gmax and the
 * first group holding their largest value; top-k (k <= NX_SAMPLE_HEAP_K, a
 * penalty >= 1) the groups whose maxima are among the k + P largest (P ids
 * penalized). When a group it reads does not hold the maximum gmax gives it
 * (a faulty worker), when many groups tie, and otherwise, it scans the row as
 * nx_sample does. Tokens and draws are nx_sample's whenever gmax is right. */
int32_t nx_sample_grouped(struct nx_sampler *s, const float *logits, const float *gmax, const int32_t *history,
			  int n_history, struct nx_logprob *top, int *n_top);

/* The greedy token of a row, whatever s's parameters: nx_sample's at
 * temperature 0 without a penalty (the lowest id of the largest logit), from
 * the group maxima gmax as nx_sample_grouped reads them (or NULL: the row),
 * -1 when every logit is NaN or -inf. Uses s only for scratch: a draft model's
 * argmax, a benchmark's decode loop. */
int32_t nx_sample_greedy(struct nx_sampler *s, const float *logits, const float *gmax);

/* Constrained decoding (sample/grammar.h): only the ids whose bit is set in
 * allowed (ceil(n_vocab / 64) words) can be drawn. The mask is applied after
 * the penalties and before everything else, so the draw, top-k, top-p and
 * min-p, and the log-probabilities see the distribution renormalized over the
 * allowed tokens. Never the group maxima: they do not know the mask. */
int32_t nx_sample_masked(struct nx_sampler *s, const float *logits, const uint64_t *allowed, const int32_t *history,
			 int n_history, struct nx_logprob *top, int *n_top);

/* The log-probability (same distribution as top[]) of the token the last
 * nx_sample() returned; only computed when n_logprobs > 0, else 0. */
float nx_sampler_last_logprob(const struct nx_sampler *s);

/* The generator on its own (tests, and anything else that needs the stream). */
void nx_rng_seed(uint64_t st[4], uint64_t seed);
uint64_t nx_rng_next(uint64_t st[4]);
double nx_rng_uniform(uint64_t st[4]); /* [0, 1) with 53 random bits */

#endif
