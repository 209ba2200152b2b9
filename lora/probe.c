/* probe.c - captured hidden states of a probe prompt, the runtime delta's measured cost, and the graded report as JSON. */
#include "lora/probe.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lora/delta.h"
#include "model/forward.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *alloc64(size_t n)
{
	return aligned_alloc(64, (n + 63) / 64 * 64);
}

int nx_lora_probe_run(const struct nx_model *m, const struct nx_lora *l, float user_scale, const int32_t *tokens,
		      int n, int n_time, struct nx_lora_probe_run *r, struct nx_err *err)
{
	const struct nx_hparams *hp = &m->hp;
	memset(r, 0, sizeof(*r));
	if (n < 1 || n > NX_LORA_PROBE_MAX)
		return nx_errf(err, "probe: %d tokens, expected 1..%d", n, NX_LORA_PROBE_MAX);
	if (n_time < 0 || n_time > 64)
		return nx_errf(err, "probe: %d timing steps, expected 0..64", n_time);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
			return nx_errf(err, "probe: token %d at position %d is outside the vocabulary (%d)", tokens[i], i,
				       hp->n_vocab);
	struct nx_state_cfg cfg = {.max_batch = n, .max_logits = 1, .n_slots = 1, .n_ctx = n + n_time + 1};
	size_t ss = nx_state_size(hp, &cfg), sz = nx_scratch_size(hp, &cfg);
	size_t cap_n = nx_capture_layer(hp, n) * (size_t)hp->n_layer;
	if (!ss || !sz)
		return nx_errf(err, "probe: state for %d tokens does not fit", n);
	void *smem = alloc64(ss), *scmem = alloc64(sz);
	float *cap = malloc(cap_n * sizeof(float));
	struct nx_tok_in *toks = malloc((size_t)n * sizeof(*toks));
	struct nx_state s;
	struct nx_scratch sc;
	int rc = -1;
	if (!smem || !scmem || !cap || !toks) {
		nx_errf(err, "probe: out of memory for %d tokens", n);
		goto out;
	}
	if (nx_state_init(&s, smem, ss, hp, &cfg, err) || nx_scratch_init(&sc, scmem, sz, hp, &cfg, err))
		goto out;
	for (int i = 0; i < n; i++)
		toks[i] = (struct nx_tok_in){tokens[i], i, 0, i == n - 1 ? 0 : -1, 0};
	s.capture = cap;
	nx_forward(m, &s, toks, n, 0, 1, &sc, NULL);
	s.capture = NULL;

	/* Decode steps of one token through the model alone; the fastest counts. */
	double best = 0;
	for (int i = 0; i < n_time; i++) {
		struct nx_tok_in t = {tokens[n - 1], n + i, 0, 0, 0};
		double t0 = now_ms();
		nx_forward(m, &s, &t, 1, 0, 1, &sc, NULL);
		double dt = now_ms() - t0;
		if (best == 0 || dt < best)
			best = dt;
	}
	r->base_ms_per_tok = best;
	/* The delta alone, as a one-band forward pass runs it for one token: every
	 * adapted matrix on the last probe token's real input. Timed by itself
	 * (not as forward-with minus forward-without) so a busy machine cannot
	 * make it come out negative. */
	if (l) {
		float *y = calloc((size_t)hp->n_vocab > (size_t)4 * hp->n_ff ? (size_t)hp->n_vocab : (size_t)4 * hp->n_ff,
				  sizeof(float));
		if (!y) {
			nx_errf(err, "probe: out of memory");
			goto out;
		}
		best = 0;
		for (int i = 0; i < n_time; i++) {
			double t0 = now_ms();
			for (int il = 0; il < hp->n_layer; il++)
				for (int w = 0; w < NX_LORA_N_WHICH; w++) {
					const struct nx_lora_t *t = nx_lora_get(l, il, (enum nx_lora_which)w);
					if (!t)
						continue;
					const float *x = nx_lora_capture_rows(hp, cap, n, il, (enum nx_lora_which)w) +
							 (size_t)(n - 1) * t->n_in;
					nx_lora_delta(t, user_scale * t->scale, x, (size_t)t->n_in, 1, y, (size_t)t->n_out, 0,
						      t->n_out, sc.lora_u);
				}
			double dt = now_ms() - t0;
			if (best == 0 || dt < best)
				best = dt;
		}
		free(y);
		r->delta_ms_per_tok = best;
	}
	r->cap = cap;
	r->n = n;
	cap = NULL;
	rc = 0;
out:
	free(smem);
	free(scmem);
	free(cap);
	free(toks);
	return rc;
}

const float *nx_lora_capture_rows(const struct nx_hparams *hp, const float *cap, int n, int layer,
				  enum nx_lora_which which)
{
	static const enum nx_capture_kind kind[NX_LORA_N_WHICH] = {
		[NX_LORA_Q] = NX_CAP_ATTN,   [NX_LORA_K] = NX_CAP_ATTN,  [NX_LORA_V] = NX_CAP_ATTN,
		[NX_LORA_O] = NX_CAP_ATTN_OUT, [NX_LORA_GATE] = NX_CAP_FFN, [NX_LORA_UP] = NX_CAP_FFN,
		[NX_LORA_DOWN] = NX_CAP_FFN_HID,
	};
	return cap + nx_capture_off(hp, n, layer, kind[which]);
}

static json_t *err_obj(const struct nx_grade_err *e)
{
	return json_pack("{s:f,s:f}", "rel_rms", nx_grade_rel(e), "max_abs", e->max_abs);
}

static const char *type_label(int t)
{
	return t < 0 ? "keep" : nx_type_name((enum nx_type)t);
}

json_t *nx_lora_report_json(const struct nx_model *m, const struct nx_lora *l, const struct nx_lora_report_opts *o,
			    struct nx_err *err)
{
	if (o->n_types < 1 || o->n_types > NX_GRADE_MAX_TYPES) {
		nx_errf(err, "report: %d fold types, expected 1..%d", o->n_types, NX_GRADE_MAX_TYPES);
		return NULL;
	}
	if (!o->cap || o->n_probe < 1) {
		nx_errf(err, "report: no probe activations");
		return NULL;
	}
	int total = 0;
	for (int il = 0; il < m->hp.n_layer; il++)
		for (int w = 0; w < NX_LORA_N_WHICH; w++)
			total += (!o->layers || o->layers[il]) && nx_lora_get(l, il, (enum nx_lora_which)w);
	if (total == 0) {
		nx_errf(err, "report: the adapter changes no matrix in the selected layers");
		return NULL;
	}
	json_t *tensors = json_array(), *types = json_array();
	struct nx_grade_err tot_fold[NX_GRADE_MAX_TYPES], tot_delta = {0}, tot_noise = {0}, tot_eff = {0};
	memset(tot_fold, 0, sizeof(tot_fold));
	double tot_ms = 0;
	int done = 0;
	for (int i = 0; i < o->n_types; i++)
		json_array_append_new(types, json_string(type_label(o->types[i])));
	for (int il = 0; il < m->hp.n_layer; il++) {
		if (o->layers && !o->layers[il])
			continue;
		for (int w = 0; w < NX_LORA_N_WHICH; w++) {
			const struct nx_lora_t *t = nx_lora_get(l, il, (enum nx_lora_which)w);
			if (!t)
				continue;
			if (o->stop && *o->stop) {
				nx_errf(err, "report: stopped");
				goto fail;
			}
			const struct nx_wt *base = nx_lora_base(m, il, (enum nx_lora_which)w);
			enum nx_type tt[NX_GRADE_MAX_TYPES];
			for (int i = 0; i < o->n_types; i++)
				tt[i] = o->types[i] < 0 ? base->type : (enum nx_type)o->types[i];
			const float *x = nx_lora_capture_rows(&m->hp, o->cap, o->n_probe, il, (enum nx_lora_which)w);
			struct nx_lora_grade g;
			if (nx_lora_grade_tensor(base, t, o->user_scale * t->scale, x, o->n_probe, tt, o->n_types, &g, err)) {
				nx_err_prefix(err, "blk.%d.%s.weight", il, nx_lora_which_gguf(t->which));
				goto fail;
			}
			char name[64];
			snprintf(name, sizeof(name), "blk.%d.%s.weight", il, nx_lora_which_gguf(t->which));
			json_t *folds = json_array();
			for (int i = 0; i < o->n_types; i++) {
				json_t *f = err_obj(&g.fold[i]);
				json_object_set_new(f, "type", json_string(nx_type_name(tt[i])));
				json_array_append_new(folds, f);
				nx_grade_add(&tot_fold[i], &g.fold[i]);
			}
			json_array_append_new(tensors, json_pack("{s:s,s:s,s:i,s:f,s:f,s:o,s:o,s:o}", "tensor", name, "type",
								 nx_type_name(base->type), "rank", t->rank, "effect",
								 nx_grade_rel(&g.effect), "fold_ms", g.fold_ms, "fold", folds,
								 "delta", err_obj(&g.delta), "noise", err_obj(&g.noise)));
			nx_grade_add(&tot_delta, &g.delta);
			nx_grade_add(&tot_noise, &g.noise);
			nx_grade_add(&tot_eff, &g.effect);
			tot_ms += g.fold_ms;
			if (o->progress)
				o->progress(o->ctx, ++done, total);
		}
	}
	json_t *folds = json_array();
	for (int i = 0; i < o->n_types; i++) {
		json_t *f = err_obj(&tot_fold[i]);
		json_object_set_new(f, "type", json_string(type_label(o->types[i])));
		json_array_append_new(folds, f);
	}
	json_t *tot = json_pack("{s:i,s:f,s:f,s:o,s:o,s:o}", "tensors", done, "effect", nx_grade_rel(&tot_eff), "fold_ms",
				tot_ms, "fold", folds, "delta", err_obj(&tot_delta), "noise", err_obj(&tot_noise));
	return json_pack("{s:i,s:f,s:o,s:o,s:o}", "probe_tokens", o->n_probe, "scale", (double)o->user_scale, "types",
			 types, "tensors", tensors, "total", tot);
fail:
	json_decref(tensors);
	json_decref(types);
	return NULL;
}
