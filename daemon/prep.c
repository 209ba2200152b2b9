/* prep.c - the expensive part of a request line (parsing, the chat template, the tokenizer) on a thread of its own, so no connection's long lines stall the event loop and the other clients' streams.
 *
 * loop.c hands a line here instead of preparing it inline when the line is
 * long or its connection has used up its inline budget for this read; the
 * connection is then paused (none of its later lines is read or handled)
 * until the answer is back, so its requests keep their order. One line per
 * connection at a time, served in arrival order: a connection that pipelines
 * a hundred expensive lines waits for its own, one after the other, while
 * another connection's line waits for at most the one in progress. The
 * thread runs under SCHED_IDLE: it gets a CPU only when nothing else wants
 * it, so a worker that yields while it waits at a barrier gets its CPU back
 * at once (a merely niced thread would take a slice of it at every yield).
 * Even so, the gaps between a busy daemon's steps are many, and a tokenizer
 * filling them all crowds the workers' caches: after a job during which
 * steps ran, the thread rests as long as the job took, so it uses at most
 * half a CPU while the daemon serves and all it can get while it is idle. Finished jobs come back through an eventfd the loop reads
 * (nxd_prep_collect); a job whose connection has gone meanwhile (its gen
 * moved on) is dropped. nxd_prepare reads only what is fixed for the
 * daemon's life (tokenizer, template, limits), never the loop's state. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PREP_NICE 19 /* where SCHED_IDLE is refused */

struct nxd_prep_job {
	struct nxd_prep_job *next;
	int conn;                 /* nxd.conns index ... */
	uint32_t conn_gen;        /* ... and its generation when submitted */
	char *line;               /* (len) owned */
	size_t len;
	struct nxd_prepared p;
};

struct nxd_prep_pool {
	pthread_t thread;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	struct nxd_prep_job *todo, **todo_tail; /* arrival order */
	struct nxd_prep_job *done, **done_tail;
	int efd;                  /* eventfd: counts finished jobs; the loop reads it */
	_Atomic uint32_t *step_gen; /* the control block's: moves while the daemon serves */
	uint64_t efd_val;         /* the loop's read buffer */
	struct nxd_prep_ctx ctx;  /* a copy: the thread reads nothing of struct nxd */
};

/* Sleeps as long as the CPU time from t0 to t1. */
static void rest(const struct timespec *t0, const struct timespec *t1)
{
	struct timespec d = { t1->tv_sec - t0->tv_sec, t1->tv_nsec - t0->tv_nsec };
	if (d.tv_nsec < 0) {
		d.tv_sec--;
		d.tv_nsec += 1000000000L;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &d, &d) == EINTR)
		;
}

static void *prep_main(void *arg)
{
	struct nxd_prep_pool *p = arg;
	struct sched_param sp = {0};
	if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) != 0)
		setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), PREP_NICE);
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->todo && !p->stop)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stop)
			break;
		struct nxd_prep_job *j = p->todo;
		p->todo = j->next;
		if (!p->todo)
			p->todo_tail = &p->todo;
		pthread_mutex_unlock(&p->mu);

		uint32_t gen0 = atomic_load(p->step_gen);
		struct timespec t0, t1;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
		nxd_prepare(&p->ctx, &j->p, j->line, j->len);
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
		free(j->line);
		j->line = NULL;
		bool busy = atomic_load(p->step_gen) != gen0;

		pthread_mutex_lock(&p->mu);
		j->next = NULL;
		*p->done_tail = j;
		p->done_tail = &j->next;
		/* One wake-up may collect many jobs: the loop takes the whole
		 * list, whatever the counter says. */
		uint64_t one = 1;
		if (write(p->efd, &one, sizeof(one)) < 0)
			nxd_debug("prep: eventfd write failed: %s", strerror(errno));
		if (busy) {
			pthread_mutex_unlock(&p->mu);
			rest(&t0, &t1);
			pthread_mutex_lock(&p->mu);
		}
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int nxd_prep_init(struct nxd *d, struct nx_err *err)
{
	struct nxd_prep_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return nx_errf(err, "prep: out of memory");
	d->prep = p;
	p->todo_tail = &p->todo;
	p->done_tail = &p->done;
	p->ctx = nxd_prep_ctx_of(d);
	p->step_gen = &d->shm.ctl->step_gen;
	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->efd < 0)
		return nx_errf(err, "prep: eventfd failed: %s", strerror(errno));
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	int rc = pthread_create(&p->thread, NULL, prep_main, p);
	if (rc)
		return nx_errf(err, "prep: cannot start the request thread: %s", strerror(rc));
	p->started = true;
	return 0;
}

static void free_list(struct nxd_prep_job *j)
{
	while (j) {
		struct nxd_prep_job *next = j->next;
		free(j->line);
		nxd_prepared_free(&j->p);
		free(j);
		j = next;
	}
}

void nxd_prep_free(struct nxd *d)
{
	struct nxd_prep_pool *p = d->prep;
	if (!p)
		return;
	if (p->started) {
		pthread_mutex_lock(&p->mu);
		p->stop = true;
		pthread_cond_signal(&p->cv);
		pthread_mutex_unlock(&p->mu);
		pthread_join(p->thread, NULL);
		pthread_mutex_destroy(&p->mu);
		pthread_cond_destroy(&p->cv);
	}
	free_list(p->todo);
	free_list(p->done);
	if (p->efd >= 0)
		close(p->efd);
	free(p);
	d->prep = NULL;
}

int nxd_prep_fd(const struct nxd *d, uint64_t **buf)
{
	*buf = &d->prep->efd_val;
	return d->prep->efd;
}

int nxd_prep_submit(struct nxd *d, struct nxd_conn *c, const char *line, size_t len)
{
	struct nxd_prep_pool *p = d->prep;
	struct nxd_prep_job *j = calloc(1, sizeof(*j));
	if (!j || !(j->line = malloc(len ? len : 1))) {
		free(j);
		return -1;
	}
	memcpy(j->line, line, len);
	j->len = len;
	j->conn = c->idx;
	j->conn_gen = c->gen;
	pthread_mutex_lock(&p->mu);
	*p->todo_tail = j;
	p->todo_tail = &j->next;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	c->prep_busy = true;
	return 0;
}

void nxd_prep_collect(struct nxd *d)
{
	struct nxd_prep_pool *p = d->prep;
	pthread_mutex_lock(&p->mu);
	struct nxd_prep_job *j = p->done;
	p->done = NULL;
	p->done_tail = &p->done;
	pthread_mutex_unlock(&p->mu);
	while (j) {
		struct nxd_prep_job *next = j->next;
		struct nxd_conn *c = &d->conns[j->conn];
		if (c->gen == j->conn_gen && c->fd >= 0 && c->prep_busy) {
			c->prep_busy = false;
			if (!c->closing)
				nxd_apply(d, c, &j->p);
			nxd_conn_resume(d, c);
		}
		nxd_prepared_free(&j->p);
		free(j);
		j = next;
	}
}
