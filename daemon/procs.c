/* procs.c - the worker process table: fork, pidfd, reaping, back-off, giving up (nginx's ngx_process.c).
 *
 * A death is reported to step.c, which decides what it means for the step
 * in flight; nothing here knows about steps. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#define BACKOFF_BASE 0.1   /* s: first respawn delay after a start-up death, doubled each time */
#define FAST_DEATH 1.0     /* s: a death this soon after the fork counts as a start-up failure */

static int pidfd_open(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Worker i goes on the i-th CPU we are allowed to run on (wrapping). */
static int cpu_for_band(int band)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return band;
	int n = CPU_COUNT(&set);
	if (n <= 0)
		return band;
	int want = band % n;
	for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set) && k++ == want)
			return c;
	return band;
}

int nxd_procs_init(struct nxd *d, struct nx_err *err)
{
	d->procs = calloc((size_t)d->n_workers, sizeof(*d->procs));
	if (!d->procs)
		return nx_errf(err, "procs: out of memory for %d workers", d->n_workers);
	for (int i = 0; i < d->n_workers; i++) {
		d->procs[i].band = i;
		d->procs[i].cpu = cpu_for_band(i);
		d->procs[i].pidfd = -1;
		d->procs[i].st = NXD_P_EMPTY;
	}
	return 0;
}

/* What the band's new process gets: its slice of the arena, never the daemon. */
static struct nxw_spec worker_spec(const struct nxd *d, int band)
{
	const struct nxd_proc *p = &d->procs[band];
	return (struct nxw_spec){
		.band = band,
		.cpu = p->cpu,
		.spawn = p->spawns,
		.seen_gen = d->step.gen,
		.log_fd = d->wlog_wr,
		.parent = d->pid,
		.filter = &d->filter,
		.model = d->shm.model,
		.state = d->shm.state_shared,
		.toks = d->shm.toks,
		.scratch = &d->shm.scratch[band],
		.ctl = d->shm.ctl,
		.draft_model = d->shm.draft_model,
		.draft_state = d->shm.draft_state_shared,
		.draft_scratch = d->shm.draft_scratch ? &d->shm.draft_scratch[band] : NULL,
		.step_model = d->shm.step_model,
		.ro = d->shm.ro,
		.n_ro = d->shm.n_ro,
	};
}

int nxd_proc_spawn(struct nxd *d, int band)
{
	struct nxd_proc *p = &d->procs[band];
	struct nx_ctl_worker *w = &d->shm.ctl->w[band];
	/* The new worker starts from the supervisor's gen: a step launched
	 * after this fork is one it runs. */
	atomic_store(&w->state, NXW_STARTING);
	atomic_store(&w->ack_gen, d->step.gen);
	atomic_store(&w->pid, 0);
	p->killed = false;
	p->spawns++;
	const struct nxw_spec spec = worker_spec(d, band);
	pid_t pid = fork();
	if (pid < 0) {
		nxd_err("worker %d: fork failed: %s", band, strerror(errno));
		return -1;
	}
	if (pid == 0)
		nxw_main(&spec);
	int fd = pidfd_open(pid);
	if (fd < 0) {
		/* Without a pidfd the death would go unseen: do not run blind. */
		nxd_err("worker %d: pidfd_open(%d) failed: %s", band, (int)pid, strerror(errno));
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return -1;
	}
	p->pid = pid;
	p->pidfd = fd;
	p->st = NXD_P_STARTING;
	p->spawned_at = nxd_now();
	nxd_debug("worker %d: forked pid %d (cpu %d)", band, (int)pid, p->cpu);
	nxd_arm_pidfd(d, band);
	return 0;
}

static void describe(const siginfo_t *si, char *buf, size_t cap)
{
	if (si->si_code == CLD_EXITED)
		snprintf(buf, cap, "exited with status %d", si->si_status);
	else if (si->si_status == SIGSYS)
		snprintf(buf, cap, "killed by seccomp (SIGSYS)");
	else
		snprintf(buf, cap, "killed by signal %d (%s)%s", si->si_status, strsignal(si->si_status),
			 si->si_code == CLD_DUMPED ? ", core dumped" : "");
}

void nxd_proc_died(struct nxd *d, int band)
{
	struct nxd_proc *p = &d->procs[band];
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	/* Reap through the pidfd: no SIGCHLD handler, no waitpid(-1) racing. */
	if (waitid((idtype_t)P_PIDFD, (id_t)p->pidfd, &si, WEXITED | WNOHANG) < 0 || si.si_pid == 0) {
		nxd_warn("worker %d: pidfd readable but waitid found no exit (%s)", band, strerror(errno));
		nxd_arm_pidfd(d, band);
		return;
	}
	close(p->pidfd);
	p->pidfd = -1;
	describe(&si, p->last_death, sizeof(p->last_death));
	pid_t pid = p->pid;
	p->pid = 0;
	bool was_ready = p->st == NXD_P_READY;
	double age = nxd_now() - p->spawned_at;

	if (d->phase == NXD_STOPPING) {
		nxd_debug("worker %d (pid %d) %s", band, (int)pid, p->last_death);
		p->st = NXD_P_EMPTY;
		return;
	}
	nxd_warn("worker %d (pid %d) %s%s", band, (int)pid, p->last_death, nxd_step_running(d) ? " during a step" : "");
	nxd_step_worker_died(d);

	if ((!was_ready || age < FAST_DEATH) && !p->killed) {
		/* Dying at start again and again is not fixed by respawning at once. */
		p->fails++;
		if (p->fails >= d->o.max_start_failures) {
			p->st = NXD_P_FAILED;
			snprintf(d->fatal, sizeof(d->fatal), "worker %d failed to start %d times in a row (last: %s)",
				 band, p->fails, p->last_death);
			nxd_err("%s; giving up", d->fatal);
			return;
		}
		double delay = BACKOFF_BASE * (double)(1u << (p->fails - 1));
		p->st = NXD_P_BACKOFF;
		p->next_spawn = nxd_now() + delay;
		nxd_warn("worker %d: start-up failure %d of %d, respawning in %.1f s", band, p->fails,
			 d->o.max_start_failures, delay);
		return;
	}
	p->st = NXD_P_BACKOFF;
	p->next_spawn = 0; /* at once (step.c's next tick, once no survivor is inside a step) */
}

void nxd_proc_kill(struct nxd *d, int band, bool excused)
{
	struct nxd_proc *p = &d->procs[band];
	if (p->pid <= 0)
		return;
	if (excused)
		p->killed = true;
	kill(p->pid, SIGKILL);
}

void nxd_procs_tick(struct nxd *d, double now)
{
	if (d->phase == NXD_STOPPING)
		return;
	for (int i = 0; i < d->n_workers; i++) {
		struct nxd_proc *p = &d->procs[i];
		if (p->st != NXD_P_BACKOFF || now < p->next_spawn)
			continue;
		if (p->spawns > 0)
			p->restarts++;
		if (nxd_proc_spawn(d, i) < 0) {
			p->fails++;
			p->st = p->fails >= d->o.max_start_failures ? NXD_P_FAILED : NXD_P_BACKOFF;
			p->next_spawn = now + BACKOFF_BASE * (double)(1u << (p->fails > 8 ? 8 : p->fails));
			if (p->st == NXD_P_FAILED)
				snprintf(d->fatal, sizeof(d->fatal), "worker %d could not be forked", i);
			continue;
		}
		nxd_info("worker %d: respawned as pid %d (restart %d)", i, (int)p->pid, p->restarts);
	}
}

void nxd_procs_started(struct nxd *d)
{
	for (int i = 0; i < d->n_workers; i++)
		d->procs[i].fails = 0;
}

bool nxd_procs_all_live(const struct nxd *d)
{
	for (int i = 0; i < d->n_workers; i++)
		if (d->procs[i].pid <= 0)
			return false;
	return true;
}

bool nxd_procs_all_gone(const struct nxd *d)
{
	for (int i = 0; i < d->n_workers; i++)
		if (d->procs[i].pid > 0)
			return false;
	return true;
}

/* Promotes STARTING workers that report ready (the shared state is only a
 * hint: the truth is the pidfd). */
bool nxd_procs_all_ready(struct nxd *d)
{
	bool all = true;
	for (int i = 0; i < d->n_workers; i++) {
		struct nxd_proc *p = &d->procs[i];
		if (p->st == NXD_P_STARTING && atomic_load(&d->shm.ctl->w[i].state) != NXW_STARTING) {
			p->st = NXD_P_READY;
			nxd_debug("worker %d (pid %d) ready on cpu %d", i, (int)p->pid, p->cpu);
		}
		if (p->st != NXD_P_READY)
			all = false;
	}
	return all;
}

bool nxd_procs_failed(const struct nxd *d)
{
	for (int i = 0; i < d->n_workers; i++)
		if (d->procs[i].st == NXD_P_FAILED)
			return true;
	return false;
}

/* Stops every worker: quit word first (they leave between steps), SIGKILL
 * for any still there after a grace period. Blocking, at exit only. */
void nxd_procs_stop(struct nxd *d)
{
	if (!d->procs)
		return;
	if (d->shm.ctl) {
		nx_ctl_abort(d->shm.ctl);
		nx_ctl_quit(d->shm.ctl);
	}
	double t0 = nxd_now();
	for (;;) {
		bool any = false;
		for (int i = 0; i < d->n_workers; i++) {
			struct nxd_proc *p = &d->procs[i];
			if (p->pid <= 0)
				continue;
			siginfo_t si;
			memset(&si, 0, sizeof(si));
			if (waitid((idtype_t)P_PIDFD, (id_t)p->pidfd, &si, WEXITED | WNOHANG) == 0 && si.si_pid) {
				close(p->pidfd);
				p->pidfd = -1;
				p->pid = 0;
				p->st = NXD_P_EMPTY;
				continue;
			}
			any = true;
			if (nxd_now() - t0 > 2.0) {
				nxd_warn("worker %d (pid %d) did not quit; killing it", i, (int)p->pid);
				kill(p->pid, SIGKILL);
			}
		}
		if (!any)
			break;
		usleep(2000);
	}
}
