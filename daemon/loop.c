/* loop.c - the supervisor's io_uring event loop: accept, recv, send, hang-ups, signals, worker pidfds, the step futex and a tick.
 *
 * Mechanism only: after every batch of completions it calls
 * nxd_after_events (daemon.c), which holds the policy (phases, the step's
 * results, shutdown). Signals are noted in nxd.signals, not acted on here.
 *
 * Nothing here blocks on a client: every socket operation is a ring op, and
 * a connection's buffers stay alive until every op that points into them has
 * completed (conn->inflight). Completions carry (kind, index, generation) in
 * user_data, so a completion for a connection slot that has been reused since
 * is recognised and dropped. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#define RING_ENTRIES 1024
#define TICK_NS 100000000LL /* 100 ms housekeeping */
/* A line longer than this, or past this many bytes of lines from one read,
 * is prepared on the prep thread (prep.c), not on the loop; so is every line
 * a connection had buffered while it waited for the thread. */
#define PREP_INLINE_LINE 2048
#define PREP_INLINE_BUDGET 8192

#ifndef IORING_OP_FUTEX_WAIT
#define IORING_OP_FUTEX_WAIT 51 /* kernel 6.7 uapi; liburing 2.3's header predates it */
#endif
#ifndef FUTEX2_SIZE_U32
#define FUTEX2_SIZE_U32 0x02
#endif
#ifndef FUTEX_BITSET_MATCH_ANY
#define FUTEX_BITSET_MATCH_ANY 0xffffffff
#endif

/* user_data: | kind:8 | index:24 | generation:32 | */
enum ud_kind {
	UD_ACCEPT = 1, UD_RECV, UD_SEND, UD_HUP, UD_CANCEL, UD_SIGNAL, UD_PIDFD, UD_BELL, UD_EFD, UD_TICK, UD_WLOG,
	UD_PREP,
};

static inline uint64_t ud_make(unsigned kind, unsigned idx, uint32_t gen)
{
	return ((uint64_t)kind << 56) | ((uint64_t)(idx & 0xffffffu) << 32) | gen;
}
static inline unsigned ud_kind(uint64_t u) { return (unsigned)(u >> 56); }
static inline unsigned ud_idx(uint64_t u) { return (unsigned)(u >> 32) & 0xffffffu; }
static inline uint32_t ud_gen(uint64_t u) { return (uint32_t)u; }

static struct io_uring_sqe *sqe_get(struct nxd *d)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
	if (!sqe) {
		io_uring_submit(&d->ring);
		sqe = io_uring_get_sqe(&d->ring);
	}
	return sqe; /* NULL only if the kernel took nothing: callers treat as fatal */
}

static struct io_uring_sqe *sqe_must(struct nxd *d)
{
	struct io_uring_sqe *sqe = sqe_get(d);
	if (!sqe) {
		nxd_err("io_uring: no submission queue entry available");
		abort();
	}
	return sqe;
}

/* ---------------------------------------------------------------- socket */

/* Two daemons started at once on one stale socket would both replace it,
 * the second unlinking the first's fresh one. A lock file beside the socket,
 * held by the supervisor for its life, makes the probe, the replacement and
 * the bind one step: a POSIX record lock, so the forked workers do not hold
 * it and it is gone with the process however that ends. The file stays
 * behind (removing it would race with the next start's open). */
static int lock_socket_path(struct nxd *d, const char *path, struct nx_err *err)
{
	char lp[sizeof(d->o.socket_path) + 8];
	snprintf(lp, sizeof(lp), "%s.lock", path);
	int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return nx_errf(err, "socket: cannot open the lock file %s: %s", lp, strerror(errno));
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	if (fcntl(fd, F_SETLK, &fl) < 0) {
		int e = errno;
		struct flock who = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
		pid_t pid = fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK ? who.l_pid : 0;
		close(fd);
		if (e == EACCES || e == EAGAIN)
			return nx_errf(err, "socket: %s belongs to another nxd (pid %d holds %s); not taking it over",
				       path, (int)pid, lp);
		return nx_errf(err, "socket: locking %s failed: %s", lp, strerror(e));
	}
	d->sock_lock_fd = fd;
	return 0;
}

static int bind_socket(struct nxd *d, struct nx_err *err)
{
	const char *path = d->o.socket_path;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (!path[0] || strlen(path) >= sizeof(sa.sun_path))
		return nx_errf(err, "socket: path \"%s\" is empty or longer than %zu bytes", path,
			       sizeof(sa.sun_path) - 1);
	/* Never an abstract socket: those have no permissions. */
	strcpy(sa.sun_path, path);

	/* The directory of the default path (/run/nxd) may not exist yet. */
	char dir[sizeof(sa.sun_path)];
	snprintf(dir, sizeof(dir), "%s", path);
	char *dn = dirname(dir);
	if (access(dn, F_OK) < 0 && errno == ENOENT && mkdir(dn, 0755) < 0)
		return nx_errf(err, "socket: creating directory %s failed: %s", dn, strerror(errno));
	if (lock_socket_path(d, path, err) < 0)
		return -1;

	struct stat st;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return nx_errf(err, "socket: %s exists and is not a socket; not replacing it", path);
		/* Someone answering there is a live daemon: do not steal its socket.
		 * ECONNREFUSED means nobody listens: a stale leftover of a killed nxd.
		 * A killed nxd's listener can still take connections for a moment
		 * after the process is gone (its io_uring lets go of the socket
		 * asynchronously), so only a socket that keeps answering for about a
		 * second counts as in use. */
		int rc, e;
		for (int tries = 0;; tries++) {
			int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (probe < 0)
				return nx_errf(err, "socket: socket() failed: %s", strerror(errno));
			rc = connect(probe, (struct sockaddr *)&sa, sizeof(sa));
			e = errno;
			close(probe);
			if (rc != 0 || tries == 20)
				break;
			usleep(50000);
		}
		if (rc == 0)
			return nx_errf(err, "socket: %s is in use by a running daemon; not taking it over", path);
		if (e != ECONNREFUSED)
			return nx_errf(err, "socket: cannot tell whether %s is in use: connect: %s", path, strerror(e));
		if (unlink(path) < 0)
			return nx_errf(err, "socket: removing stale %s failed: %s", path, strerror(errno));
		nxd_info("socket: replaced stale %s (nobody was listening)", path);
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return nx_errf(err, "socket: socket() failed: %s", strerror(errno));
	/* Mode 0660 from the start (umask during bind), not after a chmod race. */
	mode_t old = umask(0117);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	umask(old);
	if (rc < 0) {
		close(fd);
		return nx_errf(err, "socket: bind(%s) failed: %s", path, strerror(e));
	}
	d->socket_created = true;
	if (nxd_access_socket(path, err) < 0) {
		close(fd);
		return -1;
	}
	if (listen(fd, 128) < 0) {
		e = errno;
		close(fd);
		return nx_errf(err, "socket: listen(%s) failed: %s", path, strerror(e));
	}
	d->listen_fd = fd;
	/* Bound, and connections queue, but "listening" is said once the
	 * model is loaded and the workers are ready (daemon.c). */
	nxd_info("socket: bound %s (mode 0660); connections wait until nxd is ready", path);
	return 0;
}

static int setup_listen(struct nxd *d, struct nx_err *err)
{
	int n = sd_listen_fds(1);
	if (n < 0)
		return nx_errf(err, "socket: sd_listen_fds failed: %s", strerror(-n));
	if (n > 0) {
		int fd = SD_LISTEN_FDS_START;
		if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0)
			return nx_errf(err, "socket: the socket passed by systemd (fd %d) is not a listening AF_UNIX stream socket", fd);
		/* An abstract (or unnamed) socket has no file mode: anyone on the
		 * host could connect, whatever --socket-group says. */
		struct sockaddr_un sa;
		socklen_t sl = sizeof(sa);
		if (getsockname(fd, (struct sockaddr *)&sa, &sl) < 0 || sl <= offsetof(struct sockaddr_un, sun_path) ||
		    sa.sun_path[0] == '\0')
			return nx_errf(err, "socket: the socket passed by systemd (fd %d) is an abstract or unnamed socket, "
				       "which no file mode protects; give ListenStream= a path (e.g. /run/nxd/nxd.sock)", fd);
		if (n > 1)
			nxd_warn("socket: systemd passed %d sockets; serving on the first", n);
		for (int i = 1; i < n; i++)
			close(SD_LISTEN_FDS_START + i);
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		d->listen_fd = fd;
		d->listen_activated = true;
		nxd_info("socket: using the socket passed by systemd (fd %d)", fd);
		return 0;
	}
	return bind_socket(d, err);
}

/* ---------------------------------------------------------------- arming */

static void arm_accept(struct nxd *d)
{
	if (d->accept_armed || d->listen_fd < 0 || d->phase != NXD_SERVING || nxd_now() < d->accept_retry_at)
		return;
	struct io_uring_sqe *sqe = sqe_must(d);
	if (d->accept_multishot)
		io_uring_prep_multishot_accept(sqe, d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	else
		io_uring_prep_accept(sqe, d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, ud_make(UD_ACCEPT, 0, 0));
	d->accept_armed = true;
}

static void arm_signal(struct nxd *d)
{
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_read(sqe, d->sig_fd, &d->sig_buf, sizeof(d->sig_buf), 0);
	io_uring_sqe_set_data64(sqe, ud_make(UD_SIGNAL, 0, 0));
	d->sig_armed = true;
}

static void arm_tick(struct nxd *d)
{
	struct io_uring_sqe *sqe = sqe_must(d);
	d->tick_ts.tv_sec = 0;
	d->tick_ts.tv_nsec = TICK_NS;
	io_uring_prep_timeout(sqe, &d->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, ud_make(UD_TICK, 0, 0));
	d->tick_armed = true;
}

static void arm_wlog(struct nxd *d)
{
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_read(sqe, d->wlog_rd, d->wlog_buf + d->wlog_len, (unsigned)(sizeof(d->wlog_buf) - d->wlog_len), 0);
	io_uring_sqe_set_data64(sqe, ud_make(UD_WLOG, 0, 0));
	d->wlog_armed = true;
}

static void arm_prep(struct nxd *d)
{
	if (d->prep_armed || !d->prep)
		return;
	uint64_t *buf;
	int fd = nxd_prep_fd(d, &buf);
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_read(sqe, fd, buf, sizeof(*buf), 0);
	io_uring_sqe_set_data64(sqe, ud_make(UD_PREP, 0, 0));
	d->prep_armed = true;
}

void nxd_arm_pidfd(struct nxd *d, int band)
{
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_poll_add(sqe, d->procs[band].pidfd, POLLIN);
	/* The generation tells this process's pidfd from a later one's. */
	io_uring_sqe_set_data64(sqe, ud_make(UD_PIDFD, (unsigned)band, (uint32_t)d->procs[band].spawns));
}

/* One FUTEX_WAIT on the bell as a ring op: the loop sleeps in one place for
 * sockets and steps alike. The sqe is filled by hand (liburing 2.3 has no
 * helper): fd = futex2 flags (32-bit, shared), addr = word, addr2 = expected
 * value, addr3 = wake mask. */
static void arm_bell(struct nxd *d)
{
	if (d->bell_armed)
		return;
	struct io_uring_sqe *sqe = sqe_must(d);
	if (d->futex_uring) {
		io_uring_prep_rw(IORING_OP_FUTEX_WAIT, sqe, FUTEX2_SIZE_U32, (void *)&d->shm.ctl->bell, 0,
				 d->bell_seen);
		sqe->addr3 = FUTEX_BITSET_MATCH_ANY;
		io_uring_sqe_set_data64(sqe, ud_make(UD_BELL, 0, 0));
	} else {
		io_uring_prep_read(sqe, d->bell_efd, &d->bell_efd_val, sizeof(d->bell_efd_val), 0);
		io_uring_sqe_set_data64(sqe, ud_make(UD_EFD, 0, 0));
	}
	d->bell_armed = true;
}

/* Fallback when the kernel has no IORING_OP_FUTEX_WAIT: a thread sleeps on
 * the bell with futex(2) and turns each change into an eventfd count. */
static void *bell_thread(void *arg)
{
	struct nxd *d = arg;
	uint32_t seen = atomic_load(&d->shm.ctl->bell);
	for (;;) {
		nx_futex_wait(&d->shm.ctl->bell, seen, NULL);
		uint32_t b = atomic_load(&d->shm.ctl->bell);
		if (b != seen) {
			seen = b;
			uint64_t one = 1;
			if (write(d->bell_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
				nxd_err("bell: eventfd write failed: %s", strerror(errno));
		}
	}
	return NULL;
}

static int start_bell_thread(struct nxd *d)
{
	d->bell_efd = eventfd(0, EFD_CLOEXEC);
	if (d->bell_efd < 0) {
		nxd_err("bell: eventfd failed: %s", strerror(errno));
		return -1;
	}
	int rc = pthread_create(&d->bell_thread, NULL, bell_thread, d);
	if (rc) {
		nxd_err("bell: pthread_create failed: %s", strerror(rc));
		return -1;
	}
	d->bell_thread_on = true;
	d->futex_uring = false;
	return 0;
}

/* ---------------------------------------------------------------- connections */

static struct nxd_conn *conn_get(struct nxd *d, uint64_t u)
{
	unsigned idx = ud_idx(u);
	if (idx >= (unsigned)d->o.max_clients)
		return NULL;
	struct nxd_conn *c = &d->conns[idx];
	return c->gen == ud_gen(u) && c->fd >= 0 ? c : NULL;
}

/* A connection paused for the prep thread has no recv in flight: its
 * buffer is moved when it resumes, under a recv the kernel would write into
 * the old place. */
static void conn_arm_recv(struct nxd *d, struct nxd_conn *c)
{
	if (c->recv_armed || c->prep_busy || c->closing || c->linger > 0)
		return;
	size_t max = d->o.max_line + 2; /* the line and its "\r\n" */
	if (c->in_len == c->in_cap && c->in_cap < max) {
		size_t cap = c->in_cap ? c->in_cap * 2 : 4096;
		if (cap > max)
			cap = max;
		char *p = realloc(c->in, cap);
		if (!p) {
			nxd_conn_close(d, c, "out of memory for its input");
			return;
		}
		c->in = p;
		c->in_cap = cap;
	}
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_recv(sqe, c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
	io_uring_sqe_set_data64(sqe, ud_make(UD_RECV, (unsigned)c->idx, c->gen));
	c->recv_armed = true;
	c->inflight++;
}

void nxd_conn_flush(struct nxd *d, struct nxd_conn *c)
{
	if (c->send_armed || c->fd < 0)
		return;
	if (c->snd_off == c->snd_len) {
		if (c->out_len == 0)
			return;
		/* Swap: the collected events become the buffer in flight; the
		 * kernel never sees a buffer that realloc may move. */
		char *p = c->snd;
		size_t cap = c->snd_cap;
		c->snd = c->out;
		c->snd_cap = c->out_cap;
		c->snd_len = c->out_len;
		c->snd_off = 0;
		c->out = p;
		c->out_cap = cap;
		c->out_len = 0;
	}
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_send(sqe, c->fd, c->snd + c->snd_off, c->snd_len - c->snd_off, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, ud_make(UD_SEND, (unsigned)c->idx, c->gen));
	c->send_armed = true;
	c->inflight++;
}

static void conn_maybe_free(struct nxd *d, struct nxd_conn *c)
{
	if (!c->closing || c->inflight > 0 || c->fd < 0)
		return;
	close(c->fd);
	nxd_debug("client %d: closed", c->idx);
	nxd_conn_reset(c);
	d->n_conns--;
}

void nxd_conn_close(struct nxd *d, struct nxd_conn *c, const char *why)
{
	if (c->closing || c->fd < 0)
		return;
	c->closing = true;
	nxd_debug("client %d: closing (%s)", c->idx, why);
	/* Requests are only marked: they end at the next step boundary. */
	nxd_sched_conn_gone(d, c, NXP_DONE_CANCELLED);
	/* Both directions down: a pending recv sees EOF, a send stuck on a full
	 * socket fails, the hang-up poll fires; then the fd can be closed. */
	shutdown(c->fd, SHUT_RDWR);
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_cancel_fd(sqe, c->fd, IORING_ASYNC_CANCEL_ALL);
	io_uring_sqe_set_data64(sqe, ud_make(UD_CANCEL, (unsigned)c->idx, c->gen));
	c->inflight++;
}

void nxd_conn_close_after_flush(struct nxd *d, struct nxd_conn *c, const char *why)
{
	if (c->closing || c->linger > 0)
		return;
	if (nxd_conn_queued(c) == 0) {
		nxd_conn_close(d, c, why);
		return;
	}
	nxd_debug("client %d: closing once its output is sent (%s)", c->idx, why);
	nxd_sched_conn_gone(d, c, NXP_DONE_CANCELLED);
	c->linger = nxd_now();
}

/* Handles the complete lines in c's buffer: short ones here, while they fit
 * budget bytes, the others on the prep thread, after which c is paused until
 * nxd_conn_resume. */
static void conn_lines(struct nxd *d, struct nxd_conn *c, size_t old_len, size_t budget)
{
	size_t start = 0, scan = old_len, inline_bytes = 0;
	while (!c->prep_busy) {
		char *nl = memchr(c->in + scan, '\n', c->in_len - scan);
		if (!nl)
			break;
		size_t end = (size_t)(nl - c->in), n = end - start + 1;
		if (c->skipping) {
			c->skipping = false; /* the end of the oversized line: drop it */
		} else if (n <= PREP_INLINE_LINE && inline_bytes + n <= budget) {
			nxd_handle_line(d, c, c->in + start, n);
			inline_bytes += n;
		} else if (nxd_prep_submit(d, c, c->in + start, n) < 0) {
			nxd_send_error(d, c, NULL, NXP_E_INTERNAL, "out of memory for a request line of %zu bytes", n);
		}
		start = scan = end + 1;
		if (c->closing || c->linger > 0)
			return;
	}
	if (start > 0) {
		memmove(c->in, c->in + start, c->in_len - start);
		c->in_len -= start;
	}
	if (c->prep_busy) {
		c->t_line = 0; /* waiting for us, not dribbling */
		return;
	}
	c->t_line = c->in_len > 0 ? (c->t_line ? c->t_line : nxd_now()) : 0;
	if (c->skipping) {
		c->in_len = 0; /* still inside the oversized line */
		c->t_line = 0;
	} else if (c->in_len >= d->o.max_line + 2) {
		/* A full buffer without a '\n' holds more than the limit even if it
		 * ends in the '\r' of "\r\n": answer once, then skip to the next
		 * newline; the connection stays usable. A line that fits the buffer
		 * with its '\n' but not the limit is nxp_parse's too_large. */
		nxd_send_error(d, c, NULL, NXP_E_TOO_LARGE, "request line longer than the limit of %zu bytes",
			       d->o.max_line);
		c->skipping = true;
		c->in_len = 0;
		c->t_line = 0;
	}
}

void nxd_conn_resume(struct nxd *d, struct nxd_conn *c)
{
	if (c->closing || c->linger > 0)
		return;
	conn_lines(d, c, 0, 0);
	if (c->closing || c->linger > 0)
		return;
	if (c->t_rx < 0 && c->n_reqs == 0 && !c->prep_busy && nxd_conn_queued(c) == 0)
		nxd_conn_close(d, c, "all answers sent"); /* half-closed, nothing more to wait for */
	else if (c->t_rx >= 0)
		conn_arm_recv(d, c);
}

static void on_accept(struct nxd *d, struct io_uring_cqe *cqe)
{
	if (!(cqe->flags & IORING_CQE_F_MORE))
		d->accept_armed = false;
	if (cqe->res < 0) {
		if (cqe->res == -EINVAL && d->accept_multishot) {
			nxd_info("loop: multishot accept not supported; using single-shot accept");
			d->accept_multishot = false;
		} else if (cqe->res != -ECANCELED) {
			/* Out of fds or memory: retrying at once would spin. */
			nxd_warn("accept failed: %s; retrying in 100 ms", strerror(-cqe->res));
			d->accept_retry_at = nxd_now() + 0.1;
		}
		return;
	}
	int fd = cqe->res;
	if (d->phase != NXD_SERVING) {
		close(fd);
		return;
	}
	struct nxd_conn *c = NULL;
	for (int i = 0; i < d->o.max_clients; i++)
		if (d->conns[i].fd < 0) {
			c = &d->conns[i];
			break;
		}
	if (!c) {
		/* Past the limit: a clear refusal, then close. A fresh socket's
		 * buffer is empty, so this non-blocking send does not fail. */
		char line[512];
		char msg[128];
		snprintf(msg, sizeof(msg), "too many connections (limit %d); try again later", d->o.max_clients);
		size_t n = nxp_enc_error(line, sizeof(line), "null", NXP_E_BUSY, msg);
		if (send(fd, line, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
			nxd_debug("refusal send failed: %s", strerror(errno));
		close(fd);
		nxd_warn("refused a connection: %s", msg);
		return;
	}
	c->fd = fd;
	socklen_t len = sizeof(c->cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &len) < 0) {
		c->cred.pid = 0;
		c->cred.uid = (uid_t)-1;
		c->cred.gid = (gid_t)-1;
	}
	c->t_rx = nxd_now();
	d->n_conns++;
	nxd_debug("client %d: connected (pid %d, uid %d)", c->idx, (int)c->cred.pid, (int)c->cred.uid);
	/* A hang-up poll for the whole life of the connection: a client that
	 * vanishes frees its slots even when we have nothing to send it. */
	struct io_uring_sqe *sqe = sqe_must(d);
	io_uring_prep_poll_add(sqe, fd, POLLHUP | POLLERR);
	io_uring_sqe_set_data64(sqe, ud_make(UD_HUP, (unsigned)c->idx, c->gen));
	c->inflight++;
	conn_arm_recv(d, c);
}

static void on_recv(struct nxd *d, struct nxd_conn *c, int res)
{
	c->recv_armed = false;
	if (c->linger > 0)
		return; /* on its way out: input is not read any more */
	if (res == 0 && c->in_len > 0 && !c->skipping) {
		/* A last request without its '\n': the end of the input ends the line. */
		char *p = c->in_len < c->in_cap ? c->in : realloc(c->in, c->in_len + 1);
		if (p) {
			if (p != c->in) {
				c->in = p;
				c->in_cap = c->in_len + 1;
			}
			c->in[c->in_len++] = '\n';
			conn_lines(d, c, c->in_len - 1, PREP_INLINE_BUDGET);
			if (c->closing || c->linger > 0)
				return;
		}
	}
	if (res <= 0) {
		if (res < 0 && res != -ECONNRESET && res != -ECANCELED)
			nxd_debug("client %d: recv failed: %s", c->idx, strerror(-res));
		/* EOF may be a half-close after the last request: answers still go
		 * out. A full close shows up as a hang-up (or a failed send). */
		if (res < 0)
			nxd_conn_close(d, c, "recv error");
		else if (c->n_reqs == 0 && !c->prep_busy)
			nxd_conn_close_after_flush(d, c, "end of input"); /* answers already queued still go */
		else
			c->t_rx = -1; /* no more input: only waits for its answers */
		return;
	}
	c->t_rx = nxd_now();
	size_t old = c->in_len;
	c->in_len += (size_t)res;
	conn_lines(d, c, old, PREP_INLINE_BUDGET);
	if (!c->closing && !c->prep_busy)
		conn_arm_recv(d, c);
}

static void on_send(struct nxd *d, struct nxd_conn *c, int res)
{
	c->send_armed = false;
	if (res < 0) {
		if (res != -EPIPE && res != -ECONNRESET && res != -ECANCELED)
			nxd_debug("client %d: send failed: %s", c->idx, strerror(-res));
		nxd_conn_close(d, c, "send failed (client gone)");
		return;
	}
	c->snd_off += (size_t)res;
	nxd_conn_flush(d, c);
	if (c->linger > 0 && nxd_conn_queued(c) == 0) {
		nxd_conn_close(d, c, "output sent");
		return;
	}
	/* Half-closed client with nothing left to wait for. */
	if (c->t_rx < 0 && c->n_reqs == 0 && !c->prep_busy && nxd_conn_queued(c) == 0)
		nxd_conn_close(d, c, "all answers sent");
}

/* ---------------------------------------------------------------- workers' log */

static void on_wlog(struct nxd *d, int res)
{
	d->wlog_armed = false;
	if (res <= 0) {
		if (res < 0 && res != -EAGAIN && res != -EINTR)
			nxd_warn("workers' log pipe: read failed: %s", strerror(-res));
		if (res == 0 || (res < 0 && res != -EAGAIN && res != -EINTR))
			return; /* pipe gone: stop reading */
		arm_wlog(d);
		return;
	}
	d->wlog_len += (size_t)res;
	size_t start = 0;
	for (;;) {
		char *nl = memchr(d->wlog_buf + start, '\n', d->wlog_len - start);
		if (!nl)
			break;
		nxd_log_raw(NXD_LOG_WARN, d->wlog_buf + start, (size_t)(nl - (d->wlog_buf + start)));
		start = (size_t)(nl - d->wlog_buf) + 1;
	}
	if (start == 0 && d->wlog_len == sizeof(d->wlog_buf)) {
		nxd_log_raw(NXD_LOG_WARN, d->wlog_buf, d->wlog_len); /* an overlong line: pass it cut */
		start = d->wlog_len;
	}
	memmove(d->wlog_buf, d->wlog_buf + start, d->wlog_len - start);
	d->wlog_len -= start;
	arm_wlog(d);
}

/* ---------------------------------------------------------------- shutdown */

void nxd_loop_stop_accepting(struct nxd *d)
{
	if (d->accept_armed) {
		struct io_uring_sqe *sqe = sqe_must(d);
		io_uring_prep_cancel64(sqe, ud_make(UD_ACCEPT, 0, 0), 0);
		io_uring_sqe_set_data64(sqe, ud_make(UD_CANCEL, 0xffffff, 0));
	}
	if (d->socket_created && !d->listen_activated) {
		unlink(d->o.socket_path);
		d->socket_created = false;
	}
}

static void on_tick(struct nxd *d)
{
	double now = nxd_now();
	/* Clients that hold a connection without using it, or dribble a line. */
	for (int i = 0; i < d->o.max_clients; i++) {
		struct nxd_conn *c = &d->conns[i];
		if (c->fd < 0 || c->closing)
			continue;
		if (c->linger > 0) {
			if (now - c->linger > NXD_SHUTDOWN_GRACE)
				nxd_conn_close(d, c, "output not read in time");
		} else if (c->t_line > 0 && now - c->t_line > d->o.line_timeout) {
			nxd_send_error(d, c, NULL, NXP_E_BAD_REQUEST, "request line not finished within %.0f s",
				       d->o.line_timeout);
			nxd_conn_close_after_flush(d, c, "line timeout");
		} else if (c->n_reqs == 0 && !c->prep_busy && nxd_conn_queued(c) == 0 && c->t_rx > 0 &&
			   now - c->t_rx > d->o.idle_timeout) {
			nxd_conn_close(d, c, "idle timeout");
		}
	}
}

/* ---------------------------------------------------------------- the loop */

static void dispatch(struct nxd *d, struct io_uring_cqe *cqe)
{
	uint64_t u = io_uring_cqe_get_data64(cqe);
	int res = cqe->res;
	struct nxd_conn *c;
	switch (ud_kind(u)) {
	case UD_ACCEPT:
		on_accept(d, cqe);
		break;
	case UD_RECV:
	case UD_SEND:
	case UD_HUP:
	case UD_CANCEL:
		if (ud_idx(u) == 0xffffff)
			break; /* the accept cancel */
		c = conn_get(d, u);
		if (!c)
			break;
		c->inflight--;
		if (ud_kind(u) == UD_RECV)
			on_recv(d, c, res);
		else if (ud_kind(u) == UD_SEND)
			on_send(d, c, res);
		else if (ud_kind(u) == UD_HUP && res > 0 && (res & (POLLHUP | POLLERR)))
			nxd_conn_close(d, c, "client hung up");
		/* io_uring also reports POLLRDHUP (always in its poll mask): the
		 * client only half-closed; its answers still go out, and a full
		 * close later shows up as a failed send. */
		conn_maybe_free(d, c);
		break;
	case UD_SIGNAL:
		d->sig_armed = false;
		/* Only noted: daemon.c acts on it once this batch is through. */
		if (res == (int)sizeof(d->sig_buf) && d->sig_buf.ssi_signo < 32)
			d->signals |= NXD_SIG(d->sig_buf.ssi_signo);
		arm_signal(d);
		break;
	case UD_PIDFD: {
		unsigned band = ud_idx(u);
		if (band < (unsigned)d->n_workers && d->procs[band].pidfd >= 0 &&
		    (uint32_t)d->procs[band].spawns == ud_gen(u))
			nxd_proc_died(d, (int)band);
		break;
	}
	case UD_BELL:
		d->bell_armed = false;
		if (res == -EINVAL || res == -EOPNOTSUPP || res == -ENOSYS) {
			nxd_warn("loop: the kernel refused IORING_OP_FUTEX_WAIT (%s); waiting on steps with a helper thread",
				 strerror(-res));
			if (start_bell_thread(d) < 0) {
				d->exit_code = 1;
				d->exit_now = true;
			}
		}
		break;
	case UD_EFD:
		d->bell_armed = false;
		break;
	case UD_TICK:
		d->tick_armed = false;
		on_tick(d);
		arm_tick(d);
		break;
	case UD_WLOG:
		on_wlog(d, res);
		break;
	case UD_PREP:
		d->prep_armed = false;
		nxd_prep_collect(d);
		arm_prep(d);
		break;
	}
}

int nxd_loop_init(struct nxd *d, struct nx_err *err)
{
	d->listen_fd = -1;
	d->sock_lock_fd = -1;
	d->sig_fd = -1;
	d->bell_efd = -1;
	d->conns = calloc((size_t)d->o.max_clients, sizeof(*d->conns));
	if (!d->conns)
		return nx_errf(err, "loop: out of memory for %d connections", d->o.max_clients);
	for (int i = 0; i < d->o.max_clients; i++) {
		d->conns[i].idx = i;
		d->conns[i].fd = -1;
	}
	struct io_uring_params p;
	memset(&p, 0, sizeof(p));
	int rc = io_uring_queue_init_params(RING_ENTRIES, &d->ring, &p);
	if (rc < 0)
		return nx_errf(err, "loop: io_uring_queue_init failed: %s", strerror(-rc));
	d->accept_multishot = true;

	/* The step futex as a ring op when the kernel has it (6.7+). */
	struct io_uring_probe *probe = io_uring_get_probe_ring(&d->ring);
	d->futex_uring = probe && probe->last_op >= IORING_OP_FUTEX_WAIT &&
			 (probe->ops[IORING_OP_FUTEX_WAIT].flags & IO_URING_OP_SUPPORTED);
	if (probe)
		io_uring_free_probe(probe);
	if (nx_env()->futex_thread)
		d->futex_uring = false; /* test hook: exercise the fallback */

	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return nx_errf(err, "loop: sigprocmask failed: %s", strerror(errno));
	d->sig_fd = signalfd(-1, &set, SFD_CLOEXEC);
	if (d->sig_fd < 0)
		return nx_errf(err, "loop: signalfd failed: %s", strerror(errno));
	signal(SIGPIPE, SIG_IGN);
	return setup_listen(d, err);
}

int nxd_loop_run(struct nxd *d)
{
	if (!d->futex_uring && !d->bell_thread_on && start_bell_thread(d) < 0)
		return 1;
	nxd_info("loop: io_uring, step completion via %s",
		 d->futex_uring ? "IORING_OP_FUTEX_WAIT" : "a futex thread and an eventfd");
	arm_signal(d);
	arm_tick(d);
	arm_wlog(d);
	arm_prep(d);
	while (!d->exit_now) {
		/* Read the bell before looking, arm with that value after: a
		 * change in between makes the wait return at once, so no
		 * wake-up is lost. */
		if (!d->bell_armed)
			d->bell_seen = atomic_load(&d->shm.ctl->bell);
		nxd_after_events(d);
		if (d->exit_now)
			break;
		arm_accept(d);
		if (d->phase != NXD_STOPPING)
			arm_bell(d);
		int rc = io_uring_submit_and_wait(&d->ring, 1);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
			nxd_err("loop: io_uring_submit_and_wait failed: %s", strerror(-rc));
			return 1;
		}
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;
		io_uring_for_each_cqe(&d->ring, head, cqe)
		{
			dispatch(d, cqe);
			n++;
		}
		io_uring_cq_advance(&d->ring, n);
	}
	return d->exit_code;
}

void nxd_loop_free(struct nxd *d)
{
	if (d->conns) {
		for (int i = 0; i < d->o.max_clients; i++)
			if (d->conns[i].fd >= 0) {
				close(d->conns[i].fd);
				nxd_conn_reset(&d->conns[i]);
			}
		free(d->conns);
		d->conns = NULL;
	}
	if (d->ring.ring_fd > 0)
		io_uring_queue_exit(&d->ring);
	if (d->listen_fd >= 0)
		close(d->listen_fd);
	if (d->socket_created && !d->listen_activated)
		unlink(d->o.socket_path);
	if (d->sock_lock_fd >= 0)
		close(d->sock_lock_fd); /* after the unlink: the next start may bind at once */
	if (d->sig_fd >= 0)
		close(d->sig_fd);
}
