/* stop.h - stop strings: watches generated text piece by piece, holds back what may begin a stop string, cuts at the first one.
 *
 * Feed every decoded piece. Text that cannot be part of a stop string is
 * released at once; the longest tail that is a proper prefix of some stop
 * string is held back until the next piece decides it, so a client never sees
 * half a stop string. When a stop string completes, the text before it is
 * released and the matcher reports NX_STOP_HIT; the stop string itself and
 * anything after it are dropped.
 *
 * "First" means the stop string that completes first in the stream (earliest
 * end; on a tie the longer one, which starts earlier), so the result does
 * not depend on how the text was cut into pieces.
 *
 * Plain data (strings copied in), no allocation: embed one per sequence. */
#ifndef NX_STOP_H
#define NX_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define NX_STOP_MAX 16      /* stop strings per matcher */
#define NX_STOP_MAX_LEN 256 /* bytes per stop string (the protocol allows 256) */

/* nx_stop_feed() / nx_stop_flush() results */
#define NX_STOP_MORE 0      /* no stop string yet: keep generating */
#define NX_STOP_HIT 1       /* a stop string completed: end the sequence */
#define NX_STOP_ERR (-1)    /* output buffer too small (nothing consumed) */

struct nx_stop {
	int n;
	size_t len[NX_STOP_MAX];
	char str[NX_STOP_MAX][NX_STOP_MAX_LEN];
	size_t max_len;           /* longest stop string */
	unsigned char first[32];  /* bit set of the first bytes of the stop strings */
	char held[NX_STOP_MAX_LEN]; /* text released to nobody yet: a proper prefix of some stop */
	size_t n_held;
	bool hit;
	int hit_index;            /* which string matched, -1 before a hit */
};

/* n strings (n may be 0: everything passes through). Each must be 1 to
 * NX_STOP_MAX_LEN bytes; they are copied. */
int nx_stop_init(struct nx_stop *st, const char *const *strings, int n, struct nx_err *err);

/* Forget the held text and any hit; keep the strings. */
void nx_stop_reset(struct nx_stop *st);

/* out needs room for len + NX_STOP_MAX_LEN bytes (the held text comes out
 * first); with less, NX_STOP_ERR. *out_len gets the bytes released (not
 * NUL-terminated). After a hit every feed returns NX_STOP_HIT and releases
 * nothing. */
int nx_stop_feed(struct nx_stop *st, const char *piece, size_t len, char *out, size_t cap,
		 size_t *out_len);

/* End of generation without a hit (EOS, length limit): release the held
 * text. out needs NX_STOP_MAX_LEN bytes. Returns NX_STOP_MORE, NX_STOP_HIT
 * when a stop had already been hit (nothing released), or NX_STOP_ERR. */
int nx_stop_flush(struct nx_stop *st, char *out, size_t cap, size_t *out_len);

#endif
