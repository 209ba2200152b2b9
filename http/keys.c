/* keys.c - API keys: read once at start, compared in constant time. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "http/nxh.h"

static int add_key(struct nxh_keys *k, const char *s, size_t n, int line, const char *path, char *msg,
		   size_t cap)
{
	if (n > NXH_MAX_KEY) {
		snprintf(msg, cap, "%s:%d: a key longer than %d bytes", path, line, NXH_MAX_KEY);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c <= ' ' || c >= 127) {
			snprintf(msg, cap, "%s:%d: a key holds a space or a byte outside printable ASCII", path, line);
			return -1;
		}
	}
	if (k->n == NXH_MAX_KEYS) {
		snprintf(msg, cap, "%s: more than %d keys", path, NXH_MAX_KEYS);
		return -1;
	}
	memset(k->key[k->n], 0, sizeof(k->key[k->n]));
	memcpy(k->key[k->n], s, n);
	k->len[k->n++] = n;
	return 0;
}

int nxh_keys_load(struct nxh_keys *k, const char *path, char *msg, size_t cap)
{
	memset(k, 0, sizeof(*k));
	FILE *f = fopen(path, "re");
	if (!f) {
		snprintf(msg, cap, "cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	char buf[4096];
	int line = 0, rc = 0;
	while (rc == 0 && fgets(buf, sizeof(buf), f)) {
		line++;
		size_t n = strcspn(buf, "\r\n");
		if (buf[n] == '\0' && !feof(f)) {
			snprintf(msg, cap, "%s:%d: line too long", path, line);
			rc = -1;
			break;
		}
		buf[n] = '\0';
		const char *s = buf;
		while (*s == ' ' || *s == '\t')
			s++;
		n = strlen(s);
		while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
			n--;
		if (n == 0 || s[0] == '#')
			continue;
		rc = add_key(k, s, n, line, path, msg, cap);
	}
	fclose(f);
	if (rc == 0 && k->n == 0) {
		snprintf(msg, cap, "%s holds no key", path);
		rc = -1;
	}
	return rc;
}

/* Every key is compared over all NXH_MAX_KEY + 1 bytes, padded with zeros,
 * and the lengths are part of the difference: no early exit anywhere, so the
 * time says nothing about how much of a key was right, nor about its length. */
static unsigned diff_key(const unsigned char *key, size_t key_len, const unsigned char *given, size_t len)
{
	unsigned d = (unsigned)(key_len ^ len);
	for (size_t i = 0; i <= NXH_MAX_KEY; i++)
		d |= key[i] ^ given[i];
	return d;
}

bool nxh_keys_match(const struct nxh_keys *k, const char *auth)
{
	if (!auth || strncasecmp(auth, "Bearer ", 7) != 0)
		return false;
	const char *s = auth + 7;
	while (*s == ' ')
		s++;
	size_t n = strlen(s);
	while (n && s[n - 1] == ' ')
		n--;
	if (n == 0 || n > NXH_MAX_KEY)
		return false; /* the length of one's own guess is no secret */
	unsigned char given[NXH_MAX_KEY + 1] = { 0 };
	memcpy(given, s, n);
	unsigned ok = 0;
	for (int i = 0; i < k->n; i++)
		ok |= diff_key(k->key[i], k->len[i], given, n) == 0;
	return ok != 0;
}
