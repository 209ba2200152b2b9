/* stop.c - stop-string matcher with hold-back of partial matches (see stop.h). */
#define _GNU_SOURCE /* memmem */
#include "sample/stop.h"

#include <string.h>

int nx_stop_init(struct nx_stop *st, const char *const *strings, int n, struct nx_err *err)
{
	memset(st, 0, sizeof(*st));
	st->hit_index = -1;
	if (n < 0 || n > NX_STOP_MAX)
		return nx_errf(err, "stop: %d stop strings, at most %d allowed", n, NX_STOP_MAX);
	if (n > 0 && !strings)
		return nx_errf(err, "stop: %d stop strings but no array", n);
	for (int i = 0; i < n; i++) {
		if (!strings[i])
			return nx_errf(err, "stop: stop string %d is NULL", i);
		size_t l = strlen(strings[i]);
		if (l == 0)
			return nx_errf(err, "stop: stop string %d is empty", i);
		if (l > NX_STOP_MAX_LEN)
			return nx_errf(err, "stop: stop string %d is %zu bytes, at most %d allowed", i, l,
				       NX_STOP_MAX_LEN);
		memcpy(st->str[i], strings[i], l);
		st->len[i] = l;
		unsigned char b0 = (unsigned char)strings[i][0];
		st->first[b0 >> 3] |= (unsigned char)(1u << (b0 & 7));
		if (l > st->max_len)
			st->max_len = l;
	}
	st->n = n;
	return 0;
}

void nx_stop_reset(struct nx_stop *st)
{
	st->n_held = 0;
	st->hit = false;
	st->hit_index = -1;
}

/* Length of the longest tail of t that is a proper prefix of some stop string. */
static size_t partial_tail(const struct nx_stop *st, const char *t, size_t tl)
{
	size_t k = st->max_len > 0 ? st->max_len - 1 : 0;
	if (k > tl)
		k = tl;
	for (; k > 0; k--) {
		unsigned char b0 = (unsigned char)t[tl - k];
		if (!(st->first[b0 >> 3] & (1u << (b0 & 7))))
			continue; /* no stop string starts with this byte */
		for (int i = 0; i < st->n; i++)
			if (st->len[i] > k && memcmp(t + tl - k, st->str[i], k) == 0)
				return k;
	}
	return 0;
}

int nx_stop_feed(struct nx_stop *st, const char *piece, size_t len, char *out, size_t cap,
		 size_t *out_len)
{
	*out_len = 0;
	if (st->hit)
		return NX_STOP_HIT;
	if (cap < st->n_held || cap - st->n_held < len)
		return NX_STOP_ERR;

	/* out = held + piece: the whole undecided text, searched in place. */
	memcpy(out, st->held, st->n_held);
	if (len)
		memcpy(out + st->n_held, piece, len);
	size_t tl = st->n_held + len;

	size_t best_end = 0, best_start = 0;
	int best = -1;
	for (int i = 0; i < st->n; i++) {
		/* the first occurrence of a string is also its earliest end */
		const char *m = memmem(out, tl, st->str[i], st->len[i]);
		if (!m)
			continue;
		size_t start = (size_t)(m - out), end = start + st->len[i];
		if (best < 0 || end < best_end || (end == best_end && start < best_start)) {
			best = i;
			best_end = end;
			best_start = start;
		}
	}
	if (best >= 0) {
		st->hit = true;
		st->hit_index = best;
		st->n_held = 0;
		*out_len = best_start;
		return NX_STOP_HIT;
	}

	size_t h = partial_tail(st, out, tl);
	memcpy(st->held, out + tl - h, h);
	st->n_held = h;
	*out_len = tl - h;
	return NX_STOP_MORE;
}

int nx_stop_flush(struct nx_stop *st, char *out, size_t cap, size_t *out_len)
{
	*out_len = 0;
	if (st->hit)
		return NX_STOP_HIT;
	if (cap < st->n_held)
		return NX_STOP_ERR;
	memcpy(out, st->held, st->n_held);
	*out_len = st->n_held;
	st->n_held = 0;
	return NX_STOP_MORE;
}
