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
 * shutdown (RELIABILITY 25). Everyone who can open the socket (mode 0660,
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

int nxd_access_check_path(const struct nxd_conn *c, const char *path, struct nx_err *err)
{
	char real[PATH_MAX];
	struct stat st, fst;
	struct statfs fs;
	int fd = -1;
	/* One answer for every reason, so that it does not tell which files exist. */
	if (!path || path[0] != '/' || !realpath(path, real) || stat(real, &st) < 0 || !S_ISREG(st.st_mode))
		goto no;
	if (statfs(real, &fs) < 0 || fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC ||
	    fs.f_type == DEBUGFS_MAGIC || fs.f_type == TRACEFS_MAGIC || fs.f_type == SECURITYFS_MAGIC)
		goto no;
	/* The daemon can read it, and it is still the file we looked at. */
	fd = open(real, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0 || fstat(fd, &fst) < 0 || fst.st_dev != st.st_dev || fst.st_ino != st.st_ino)
		goto no;
	close(fd);
	fd = -1;
	/* And the peer could have read it itself: a client must not make a root
	 * daemon read a file for it that it may not read. */
	gid_t g[256];
	int n = peer_groups(c, g, 256);
	uid_t uid = c->cred.uid;
	if (uid == (uid_t)-1 || !peer_may(&st, uid, g, n, S_IRUSR))
		goto no;
	for (char *slash = strrchr(real, '/'); slash; slash = strrchr(real, '/')) {
		/* Every directory on the way must be searchable for it. */
		*slash = '\0';
		struct stat ds;
		if (stat(real[0] ? real : "/", &ds) < 0 || !peer_may(&ds, uid, g, n, S_IXUSR))
			goto no;
		if (!real[0])
			break;
	}
	return 0;
no:
	if (fd >= 0)
		close(fd);
	return nx_errf(err, NXD_PATH_REFUSED, path ? path : "");
}

int nxd_access_check_adapter_path(const struct nxd_conn *c, const char *path, struct nx_err *err)
{
	struct stat st;
	char p[PATH_MAX + 32];
	if (path && path[0] == '/' && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		/* A PEFT directory: the two files nx_lora_open reads from it. */
		static const char *const files[] = { "adapter_model.safetensors", "adapter_config.json" };
		for (int i = 0; i < 2; i++) {
			if ((size_t)snprintf(p, sizeof(p), "%s/%s", path, files[i]) >= sizeof(p) ||
			    nxd_access_check_path(c, p, err) < 0)
				goto no;
		}
		return 0;
	}
	if (nxd_access_check_path(c, path, err) < 0)
		goto no;
	/* A PEFT safetensors file named directly: its config beside it is read too. */
	snprintf(p, sizeof(p), "%s", path);
	char *slash = strrchr(p, '/');
	snprintf(slash + 1, sizeof(p) - (size_t)(slash + 1 - p), "adapter_config.json");
	if (lstat(p, &st) == 0 && nxd_access_check_path(c, p, err) < 0)
		goto no;
	return 0;
no:
	return nx_errf(err, NXD_PATH_REFUSED, path ? path : "");
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
