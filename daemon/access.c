/* access.c - who may do what: the socket's group and mode, admin rights of a peer, paths that clients name, and the adapter limits.
 *
 * Identity comes from the kernel, never from the request: SO_PEERCRED (uid,
 * gid, taken at connect) and SO_PEERGROUPS (the peer's supplementary groups
 * at connect). Neither can be changed by the peer afterwards, and neither
 * looks a pid up later (a pid can be reused; /proc/<pid>/status could then
 * describe another process). The group database (getgrouplist of the uid)
 * is consulted too, so a user just added to the admin group counts before
 * logging in again.
 *
 * Admins are root, the daemon's own uid and members of --admin-group. They
 * alone change what every client sees: adapter load/unload/fold/unfold and
 * shutdown (docs/reliability.md 25). Everyone who can open the socket (mode 0660,
 * owner and --socket-group) may generate, tokenize, look at status. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/magic.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "lora/adapter.h"
#include <unistd.h>

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

#define MAX_GROUPS 4096 /* NGROUPS_MAX on Linux is 65536; more than this is not worth a lookup */

static struct {
	uid_t owner;               /* the daemon's effective uid */
	bool socket_group_set, admin_group_set;
	gid_t socket_gid, admin_gid;
	char socket_group[64], admin_group[64];
	int max_adapters;
	size_t max_adapter_bytes;
} acc;

static int group_gid(const char *name, gid_t *gid, struct nx_err *err)
{
	struct group gr, *res = NULL;
	char buf[16384];
	int rc = getgrnam_r(name, &gr, buf, sizeof(buf), &res);
	if (rc == 0 && res) {
		*gid = gr.gr_gid;
		return 0;
	}
	/* A number is taken as a gid (containers often have groups without names). */
	char *end;
	errno = 0;
	unsigned long v = strtoul(name, &end, 10);
	if (*name && !*end && !errno && v < (gid_t)-1) {
		*gid = (gid_t)v;
		return 0;
	}
	return nx_errf(err, "group '%s' does not exist%s%s", name, rc ? ": " : "", rc ? strerror(rc) : "");
}

int nxd_access_init(struct nxd *d, struct nx_err *err)
{
	acc.owner = geteuid();
	acc.max_adapters = d->o.max_adapters;
	acc.max_adapter_bytes = (size_t)d->o.max_adapter_mb << 20;
	if (d->o.socket_group) {
		if (group_gid(d->o.socket_group, &acc.socket_gid, err) < 0)
			return nx_err_prefix(err, "--socket-group");
		acc.socket_group_set = true;
		snprintf(acc.socket_group, sizeof(acc.socket_group), "%s", d->o.socket_group);
	}
	if (d->o.admin_group) {
		if (group_gid(d->o.admin_group, &acc.admin_gid, err) < 0)
			return nx_err_prefix(err, "--admin-group");
		acc.admin_group_set = true;
		snprintf(acc.admin_group, sizeof(acc.admin_group), "%s", d->o.admin_group);
	}
	return 0;
}

int nxd_access_socket(const char *path, struct nx_err *err)
{
	/* Group first, then the mode: never a moment with group access for the
	 * wrong group. The socket was bound under umask 0117 (already 0660). */
	if (acc.socket_group_set && chown(path, (uid_t)-1, acc.socket_gid) < 0)
		return nx_errf(err, "socket: chown(%s, group '%s' = %u) failed: %s", path, acc.socket_group,
			       (unsigned)acc.socket_gid, strerror(errno));
	if (chmod(path, 0660) < 0)
		return nx_errf(err, "socket: chmod(%s, 0660) failed: %s", path, strerror(errno));
	if (acc.socket_group_set)
		nxd_info("socket: group '%s' (gid %u) may connect", acc.socket_group, (unsigned)acc.socket_gid);
	return 0;
}

/* The peer's groups: its gid and its supplementary groups, both as they were
 * at connect (SO_PEERCRED, SO_PEERGROUPS). Returns how many were written to
 * out (at most cap). */
static int peer_groups(const struct nxd_conn *c, gid_t *out, int cap)
{
	int n = 0;
	if (c->cred.gid != (gid_t)-1 && n < cap)
		out[n++] = c->cred.gid;
	socklen_t len = (socklen_t)((cap - n) * (int)sizeof(gid_t));
	if (c->fd >= 0 && len > 0 && getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, out + n, &len) == 0)
		n += (int)(len / sizeof(gid_t));
	return n;
}

static bool in_list(gid_t g, const gid_t *list, int n)
{
	for (int i = 0; i < n; i++)
		if (list[i] == g)
			return true;
	return false;
}

/* Whether the group database lists uid in gid (primary or supplementary). */
static bool db_member(uid_t uid, gid_t gid)
{
	struct passwd pw, *res = NULL;
	char buf[16384];
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res)
		return false;
	if (pw.pw_gid == gid)
		return true;
	int n = 64;
	gid_t *g = NULL;
	for (int tries = 0; tries < 4; tries++) {
		gid_t *p = realloc(g, (size_t)n * sizeof(*g));
		if (!p)
			break;
		g = p;
		int want = n;
		if (getgrouplist(pw.pw_name, pw.pw_gid, g, &want) >= 0) {
			bool in = in_list(gid, g, want);
			free(g);
			return in;
		}
		if (want <= n || want > MAX_GROUPS)
			break;
		n = want;
	}
	free(g);
	return false;
}

bool nxd_access_is_admin(struct nxd_conn *c)
{
	if (c->admin)
		return c->admin > 0;
	bool yes = false;
	uid_t uid = c->cred.uid;
	if (uid == (uid_t)-1) {
		yes = false; /* credentials unknown: never an admin */
	} else if (uid == 0 || uid == acc.owner) {
		yes = true;
	} else if (acc.admin_group_set) {
		gid_t g[256];
		int n = peer_groups(c, g, 256);
		yes = in_list(acc.admin_gid, g, n) || db_member(uid, acc.admin_gid);
	}
	c->admin = yes ? 1 : -1; /* decided once per connection: credentials do not change */
	return yes;
}

int nxd_access_check_admin(struct nxd_conn *c, struct nx_err *err)
{
	if (nxd_access_is_admin(c))
		return 0;
	if (acc.admin_group_set)
		return nx_errf(err, "only root, the daemon's user (uid %u) and members of group '%s' may do this; "
			       "uid %d (pid %d) is none of them", (unsigned)acc.owner, acc.admin_group,
			       (int)c->cred.uid, (int)c->cred.pid);
	return nx_errf(err, "only root and the daemon's user (uid %u) may do this (no --admin-group is set); "
		       "uid %d (pid %d) is neither", (unsigned)acc.owner, (int)c->cred.uid, (int)c->cred.pid);
}

/* ---------------------------------------------------------------- paths */

/* What mode bit (of S_IRUSR/S_IXUSR...) applies to the peer for st: owner,
 * group or other, the way the kernel picks (no ACLs). */
static bool peer_may(const struct stat *st, uid_t uid, const gid_t *g, int n, mode_t usr_bit)
{
	if (uid == 0)
		return true;
	if (st->st_uid == uid)
		return st->st_mode & usr_bit;
	if (in_list(st->st_gid, g, n))
		return st->st_mode & (usr_bit >> 3);
	return st->st_mode & (usr_bit >> 6);
}

/* Paths are resolved here, one component at a time, as the kernel would for
 * the peer: every directory is opened (O_PATH, never followed by name again)
 * and must be searchable for the peer before anything is looked up in it;
 * a symlink is read from the link just opened and its target resolved the
 * same way; the file itself is opened once, checked on what was opened
 * (fstat, fstatfs) and handed on as the descriptor. Nothing is ever looked
 * up twice, so swapping a link or a directory between two steps cannot make
 * the daemon read a file the peer could not (docs/reliability.md 26). */

#define MAX_LINKS 40 /* the kernel's own limit (MAXSYMLINKS) */

struct walk {
	uid_t uid;
	gid_t g[256];
	int n;
	int links;
};

static bool walk_may(const struct walk *w, int fd, mode_t bit, struct stat *st)
{
	return fstat(fd, st) == 0 && peer_may(st, w->uid, w->g, w->n, bit);
}

static bool special_fs(int fd)
{
	struct statfs fs;
	return fstatfs(fd, &fs) < 0 || fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC ||
	       fs.f_type == DEBUGFS_MAGIC || fs.f_type == TRACEFS_MAGIC || fs.f_type == SECURITYFS_MAGIC;
}

static int open_root(const struct walk *w)
{
	struct stat st;
	int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0 && !walk_may(w, fd, S_IXUSR, &st)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Resolves path from the directory dirfd (searchable for the peer; an
 * absolute path starts from /). Returns an fd: a directory (O_PATH) or a
 * regular file opened for reading; -1 for anything else or anything the peer
 * may not reach or read. dirfd stays the caller's. */
static int walk_at(struct walk *w, int dirfd, const char *path)
{
	char buf[2 * PATH_MAX];
	if (strlen(path) >= sizeof(buf))
		return -1;
	snprintf(buf, sizeof(buf), "%s", path);
	char *p = buf;
	int cur = p[0] == '/' ? open_root(w) : fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	while (cur >= 0) {
		while (*p == '/')
			p++;
		if (!*p)
			return cur; /* a directory */
		char *comp = p;
		while (*p && *p != '/')
			p++;
		bool last = true;
		for (char *q = p; *q; q++)
			if (*q != '/')
				last = false;
		if (*p)
			*p++ = '\0';
		if (!strcmp(comp, "."))
			continue;
		struct stat st;
		int fd = openat(cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &st) < 0)
			goto fail_fd;
		if (S_ISLNK(st.st_mode)) {
			char target[PATH_MAX];
			ssize_t len = ++w->links > MAX_LINKS ? -1 : readlinkat(fd, "", target, sizeof(target) - 1);
			close(fd);
			if (len <= 0)
				goto fail;
			target[len] = '\0';
			/* The target, then what was left of the path after the link. */
			char next[2 * PATH_MAX];
			if ((size_t)snprintf(next, sizeof(next), "%s/%s", target, p) >= sizeof(next))
				goto fail;
			snprintf(buf, sizeof(buf), "%s", next);
			p = buf;
			if (*p == '/') {
				close(cur);
				cur = open_root(w);
			}
			continue;
		}
		if (S_ISDIR(st.st_mode)) {
			if (!peer_may(&st, w->uid, w->g, w->n, S_IXUSR))
				goto fail_fd;
			close(cur);
			cur = fd;
			continue;
		}
		if (!last || !S_ISREG(st.st_mode) || !peer_may(&st, w->uid, w->g, w->n, S_IRUSR))
			goto fail_fd;
		/* Opened for reading by the name just checked, and refused unless
		 * it is still the same inode: a swap in between loses the race. */
		int rfd = openat(cur, comp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
		struct stat rst;
		if (rfd < 0 || fstat(rfd, &rst) < 0 || rst.st_dev != st.st_dev || rst.st_ino != st.st_ino ||
		    !S_ISREG(rst.st_mode) || special_fs(rfd)) {
			if (rfd >= 0)
				close(rfd);
			goto fail_fd;
		}
		close(fd);
		close(cur);
		return rfd;
	fail_fd:
		if (fd >= 0)
			close(fd);
	fail:
		close(cur);
		return -1;
	}
	return -1;
}

static void walk_init(struct walk *w, const struct nxd_conn *c)
{
	memset(w, 0, sizeof(*w));
	w->uid = c->cred.uid;
	w->n = peer_groups(c, w->g, 256);
}

static bool is_dir(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A regular file from dirfd, or -1 (a directory there is no file). */
static int walk_file(struct walk *w, int dirfd, const char *path)
{
	int fd = walk_at(w, dirfd, path);
	if (fd >= 0 && is_dir(fd)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

int nxd_access_open_adapter(const struct nxd_conn *c, const char *path, struct nx_lora_files *f,
			    struct nx_err *err)
{
	f->name = path;
	f->data_fd = f->config_fd = -1;
	if (!path || path[0] != '/' || c->cred.uid == (uid_t)-1)
		goto no;
	struct walk w;
	walk_init(&w, c);
	/* The directory the name is in, then the name in it: a PEFT
	 * safetensors file named directly has its config beside that name. */
	char dir[PATH_MAX];
	if (strlen(path) >= sizeof(dir))
		goto no;
	snprintf(dir, sizeof(dir), "%s", path);
	size_t l = strlen(dir);
	while (l > 1 && dir[l - 1] == '/')
		dir[--l] = '\0';
	char *slash = strrchr(dir, '/');
	const char *base = slash + 1;
	*slash = '\0';
	int dfd = walk_at(&w, AT_FDCWD, dir[0] ? dir : "/");
	if (dfd < 0)
		goto no;
	if (!is_dir(dfd)) {
		close(dfd);
		goto no;
	}
	int fd = walk_at(&w, dfd, base[0] ? base : ".");
	if (fd >= 0 && is_dir(fd)) {
		/* A PEFT directory: the two files in it. */
		f->data_fd = walk_file(&w, fd, "adapter_model.safetensors");
		f->config_fd = f->data_fd >= 0 ? walk_file(&w, fd, "adapter_config.json") : -1;
		close(fd);
	} else if (fd >= 0) {
		f->data_fd = fd;
		if (!nx_lora_fd_is_gguf(fd))
			f->config_fd = walk_file(&w, dfd, "adapter_config.json");
		else
			f->config_fd = -2; /* none needed */
	}
	close(dfd);
	if (f->data_fd >= 0 && f->config_fd != -1) {
		if (f->config_fd == -2)
			f->config_fd = -1;
		return 0;
	}
	nxd_access_close_adapter(f);
no:
	return nx_errf(err, NXD_PATH_REFUSED, path ? path : "");
}

void nxd_access_close_adapter(struct nx_lora_files *f)
{
	if (f->data_fd >= 0)
		close(f->data_fd);
	if (f->config_fd >= 0)
		close(f->config_fd);
	f->data_fd = f->config_fd = -1;
}

/* ---------------------------------------------------------------- limits */

int nxd_limits_check_adapter(int n_loaded, size_t bytes_loaded, size_t bytes_new, struct nx_err *err)
{
	if (n_loaded >= acc.max_adapters)
		return nx_errf(err, "%d adapters are loaded, the limit (--max-adapters %d); unload one first", n_loaded,
			       acc.max_adapters);
	if (bytes_new > acc.max_adapter_bytes || bytes_loaded > acc.max_adapter_bytes - bytes_new)
		return nx_errf(err, "the adapter needs %.1f MiB and %.1f MiB are in use by adapters; the limit is "
			       "--max-adapter-mb %zu", (double)bytes_new / 1048576, (double)bytes_loaded / 1048576,
			       acc.max_adapter_bytes >> 20);
	return 0;
}
