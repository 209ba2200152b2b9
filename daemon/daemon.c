/* daemon.c - the daemon's phases (starting, serving, stopping) and what it decides after every batch of events; loop.c is the mechanism that calls it.
 *
 * As nginx's master cycle acts on the flags its signal handlers set, this
 * acts on what the loop recorded (signals) and on what it finds by looking
 * (worker readiness, the step, drained clients), in a fixed order. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <signal.h>
#include <systemd/sd-daemon.h>

/* Every stream ends with a clear event; then the workers go. */
void nxd_begin_shutdown(struct nxd *d, const char *why)
{
	if (d->phase == NXD_STOPPING)
		return;
	nxd_info("shutting down (%s)", why);
	enum nxd_phase was = d->phase;
	d->phase = NXD_STOPPING;
	sd_notify(0, "STOPPING=1");
	nxd_loop_stop_accepting(d);
	nxd_sched_end_all(d, NXP_DONE_SHUTDOWN);
	if (was != NXD_STARTING)
		nxd_step_shutdown(d);
	d->exit_code = 0;
}

static void on_signals(struct nxd *d)
{
	uint32_t sig = d->signals;
	d->signals = 0;
	if (sig & NXD_SIG(SIGTERM))
		nxd_begin_shutdown(d, "SIGTERM");
	else if (sig & NXD_SIG(SIGINT))
		nxd_begin_shutdown(d, "SIGINT");
	if (sig & NXD_SIG(SIGHUP))
		nxd_info("SIGHUP: nothing to reload (the model is fixed for the daemon's life)");
}

/* Starting: every worker ready is the daemon ready; a band given up on is
 * a start-up failure. */
static void starting(struct nxd *d, double now, bool ready)
{
	if (nxd_procs_failed(d)) {
		nxd_err("cannot start: %s", d->fatal);
		d->exit_code = 1;
		d->exit_now = true;
		return;
	}
	if (!ready)
		return;
	d->phase = NXD_SERVING;
	const struct nx_model *m = &d->model.m;
	if (m->rope_long) /* one set for the daemon's context (model/model.h: nx_model_rope_factors) */
		nxd_info("rope: LongRoPE's %s factors (%d positions per slot, original context %d)",
			 nx_model_rope_factors(m, d->o.n_ctx) == m->rope_long ? "long" : "short", d->o.n_ctx,
			 m->hp.rope_orig_ctx);
	nxd_info("ready: listening on %s, %d workers, %d slots x %d positions%s%s%s, %d tokens per step, %s "
		 "activations, %s K/V cache of %.1f MiB (started in %.2f s)",
		 d->listen_activated ? "the socket from systemd" : d->o.socket_path,
		 d->n_workers, d->o.n_slots, d->o.n_ctx, d->ctx_note[0] ? " (" : "", d->ctx_note, d->ctx_note[0] ? ")" : "",
		 d->o.n_batch, nx_act_mode_name(d->o.act_one_part), nx_kv_type_name(d->o.kv_type),
		 (double)nx_kv_cache_bytes(&d->model.m.hp, &d->shm.cfg) / 1048576, now - d->t_start);
	sd_notifyf(0, "READY=1\nSTATUS=serving %s with %d workers\nMAINPID=%d", d->model.name, d->n_workers,
		   (int)d->pid);
}

/* Stopping: out once every client has read its last events, or the grace
 * period is over. */
static void stopping(struct nxd *d, double now)
{
	if (d->shutdown_deadline == 0)
		d->shutdown_deadline = now + NXD_SHUTDOWN_GRACE;
	if (nxd_conns_drained(d) || now > d->shutdown_deadline)
		d->exit_now = true;
}

/* Serving: the step's news goes to the scheduler, which plans the next. */
static void serving(struct nxd *d, double now)
{
	const char *why = NULL;
	switch (nxd_step_poll(d, now, &why)) {
	case NXD_STEP_REPAIRING:
		return;
	case NXD_STEP_DONE:
		nxd_sched_step_done(d);
		break;
	case NXD_STEP_RETRY:
		nxd_sched_step_retry(d);
		break;
	case NXD_STEP_FAILED:
		nxd_sched_step_failed(d, why);
		break;
	case NXD_STEP_NONE:
		break;
	}
	if (nxd_procs_failed(d))
		nxd_sched_fail_all(d, NXP_E_INTERNAL, d->fatal);
	nxd_sched_pump(d);
}

void nxd_after_events(struct nxd *d)
{
	double now = nxd_now();
	on_signals(d);
	bool ready = nxd_procs_all_ready(d);
	if (d->phase == NXD_STARTING)
		starting(d, now, ready);
	if (d->exit_now)
		return;
	if (d->phase == NXD_STOPPING)
		stopping(d, now);
	else if (d->phase == NXD_STARTING)
		nxd_procs_tick(d, now); /* back-off respawns */
	else
		serving(d, now);
}
