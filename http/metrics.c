/* metrics.c - /metrics: the gateway's counters and histograms, and nxd's status, as Prometheus text. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "http/nxh.h"

#define MAX_SERIES 128

static struct {
	struct { const char *endpoint; unsigned status; unsigned long long n; } req[MAX_SERIES];
	int n_req;
	unsigned long long prompt_tokens, completion_tokens, upstream_errors;
} m;

struct hist {
	const char *name, *help;
	int n;
	double le[16];
	unsigned long long count[16];   /* per bucket, not cumulative */
	unsigned long long total;
	double sum;
};

static struct hist ttft = {
	"nxd_http_time_to_first_token_seconds", "Time from a generation request to its first token.", 13,
	{ 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120 }, { 0 }, 0, 0
};
static struct hist gap = {
	"nxd_http_time_per_output_token_seconds", "Time between two tokens of one generation.", 12,
	{ 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5 }, { 0 }, 0, 0
};

static void observe(struct hist *h, double v)
{
	int i = 0;
	while (i < h->n && v > h->le[i])
		i++;
	if (i < h->n)
		h->count[i]++;
	h->total++;
	h->sum += v;
}

void nxh_metrics_request(const char *endpoint, unsigned status)
{
	for (int i = 0; i < m.n_req; i++)
		if (m.req[i].status == status && !strcmp(m.req[i].endpoint, endpoint)) {
			m.req[i].n++;
			return;
		}
	/* Endpoints are the routes' fixed names and statuses a short list, so
	 * the table does not fill; if it did, the last row takes the rest. */
	int i = m.n_req < MAX_SERIES ? m.n_req++ : MAX_SERIES - 1;
	m.req[i].endpoint = endpoint;
	m.req[i].status = status;
	m.req[i].n++;
}

void nxh_metrics_tokens(int prompt, int completion)
{
	m.prompt_tokens += prompt > 0 ? (unsigned)prompt : 0;
	m.completion_tokens += completion > 0 ? (unsigned)completion : 0;
}

void nxh_metrics_ttft(double s)
{
	observe(&ttft, s);
}

void nxh_metrics_token_gap(double s)
{
	observe(&gap, s);
}

void nxh_metrics_upstream_error(void)
{
	m.upstream_errors++;
}

json_t *nxh_metrics_build(struct nxh_req *r, const json_t *hello)
{
	(void)r;
	(void)hello;
	return json_pack("{s:s}", "op", "status");
}

static void head(struct nxh_buf *b, const char *name, const char *type, const char *help)
{
	nxh_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist_out(struct nxh_buf *b, const struct hist *h)
{
	head(b, h->name, "histogram", h->help);
	unsigned long long cum = 0;
	for (int i = 0; i < h->n; i++) {
		cum += h->count[i];
		nxh_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->le[i], cum);
	}
	nxh_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", h->name, h->total, h->name,
		       h->sum, h->name, h->total);
}

static void gateway(struct nxh_buf *b)
{
	head(b, "nxd_http_requests_total", "counter", "HTTP requests answered, by endpoint and status (499: the client left).");
	for (int i = 0; i < m.n_req; i++)
		nxh_buf_printf(b, "nxd_http_requests_total{endpoint=\"%s\",status=\"%u\"} %llu\n", m.req[i].endpoint,
			       m.req[i].status, m.req[i].n);
	head(b, "nxd_http_prompt_tokens_total", "counter", "Prompt tokens of the generations served through the gateway.");
	nxh_buf_printf(b, "nxd_http_prompt_tokens_total %llu\n", m.prompt_tokens);
	head(b, "nxd_http_completion_tokens_total", "counter", "Tokens generated for requests through the gateway.");
	nxh_buf_printf(b, "nxd_http_completion_tokens_total %llu\n", m.completion_tokens);
	head(b, "nxd_http_upstream_errors_total", "counter", "Requests that found nxd unreachable or lost it.");
	nxh_buf_printf(b, "nxd_http_upstream_errors_total %llu\n", m.upstream_errors);
	head(b, "nxd_http_connections", "gauge", "Open HTTP connections.");
	nxh_buf_printf(b, "nxd_http_connections %u\n", nxh.n_conns);
	head(b, "nxd_http_requests_in_flight", "gauge", "HTTP requests being read, waiting for nxd or answered.");
	nxh_buf_printf(b, "nxd_http_requests_in_flight %u\n", nxh.in_flight);
	hist_out(b, &ttft);
	hist_out(b, &gap);
}

static double num(const json_t *o, const char *key)
{
	return json_number_value(json_object_get(o, key));
}

static void gauge(struct nxh_buf *b, const char *name, const char *type, const char *help, double v)
{
	head(b, name, type, help);
	nxh_buf_printf(b, "%s %.17g\n", name, v);
}

/* Label values from nxd (phase names) are plain ASCII, but escape anyway. */
static void label(struct nxh_buf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			nxh_buf_put(b, "\\", 1);
		if (*s == '\n')
			nxh_buf_put(b, "\\n", 2);
		else
			nxh_buf_put(b, s, 1);
	}
}

static void daemon_status(struct nxh_buf *b, const json_t *st)
{
	const json_t *slots = json_object_get(st, "slots");
	gauge(b, "nxd_queue_length", "gauge", "Requests waiting for a slot.", num(slots, "queued"));
	gauge(b, "nxd_slots_in_use", "gauge", "Slots generating.", num(slots, "used"));
	gauge(b, "nxd_slots", "gauge", "Slots (sequences generated at once).", num(slots, "total"));
	gauge(b, "nxd_tokens_served_total", "counter", "Prompt and completion tokens served since start (all clients).",
	      num(st, "tokens_served"));
	gauge(b, "nxd_prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prompt cache.",
	      num(st, "prompt_tokens_cached"));
	gauge(b, "nxd_steps_total", "counter", "Forward steps run.", num(st, "steps"));
	gauge(b, "nxd_steps_retried_total", "counter", "Steps run again after a worker died.", num(st, "steps_retried"));
	gauge(b, "nxd_tokens_per_second", "gauge", "Completion tokens per second, recent window.",
	      num(st, "tokens_per_s"));
	gauge(b, "nxd_uptime_seconds", "gauge", "Seconds since nxd started.", num(st, "uptime_s"));
	const json_t *spec = json_object_get(st, "speculate");
	if (spec) {
		gauge(b, "nxd_speculative_drafted_total", "counter", "Draft tokens verified by speculative decoding.",
		      num(spec, "drafted"));
		gauge(b, "nxd_speculative_accepted_total", "counter", "Draft tokens the model agreed with and kept.",
		      num(spec, "accepted"));
		/* by source of drafts: prompt lookup, the draft model (nxd --draft-model) */
		const json_t *modes = json_object_get(spec, "modes");
		static const char *const src[] = { "prompt", "draft" };
		head(b, "nxd_speculative_drafted_by_source_total", "counter", "Draft tokens verified, by source of drafts.");
		for (int k = 0; modes && k < 2; k++)
			nxh_buf_printf(b, "nxd_speculative_drafted_by_source_total{source=\"%s\"} %.17g\n", src[k],
				       num(json_object_get(modes, src[k]), "drafted"));
		head(b, "nxd_speculative_accepted_by_source_total", "counter", "Draft tokens kept, by source of drafts.");
		for (int k = 0; modes && k < 2; k++)
			nxh_buf_printf(b, "nxd_speculative_accepted_by_source_total{source=\"%s\"} %.17g\n", src[k],
				       num(json_object_get(modes, src[k]), "accepted"));
	}
	head(b, "nxd_worker_restarts_total", "counter", "Times each worker was started again.");
	size_t i;
	json_t *w;
	json_array_foreach(json_object_get(st, "workers"), i, w)
		nxh_buf_printf(b, "nxd_worker_restarts_total{worker=\"%zu\"} %.17g\n", i, num(w, "restarts"));
	json_t *prof = json_object_get(st, "profile");
	if (!prof)
		return;
	head(b, "nxd_step_phase_milliseconds", "gauge",
	     "Where a step's time goes, ms per step averaged over the workers (nxd with NXD_PROFILE=1).");
	const char *k;
	json_t *v;
	json_object_foreach(json_object_get(prof, "ms_per_step"), k, v) {
		nxh_buf_put(b, "nxd_step_phase_milliseconds{phase=\"", 35);
		label(b, k);
		nxh_buf_printf(b, "\"} %.17g\n", json_number_value(v));
	}
	gauge(b, "nxd_profiled_steps_total", "counter", "Steps the profile counts.", num(prof, "steps"));
}

void nxh_metrics_event(struct nxh_req *r, json_t *ev)
{
	const char *name = json_string_value(json_object_get(ev, "event"));
	bool up = name && !strcmp(name, "status");
	nxh_buf_free(&r->out);
	gateway(&r->out);
	gauge(&r->out, "nxd_up", "gauge", "1 when nxd answered the gateway's status request.", up);
	if (up)
		daemon_status(&r->out, ev);
	nxh_req_answer_text(r, 200, "text/plain; version=0.0.4; charset=utf-8");
	nxh_req_wake(r);
}
