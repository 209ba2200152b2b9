/* json_schema.c - a JSON-schema subset compiled to GBNF (grammar.h): every document the grammar accepts validates; anything else is refused by name.
 *
 * Exactness over reach: where the grammar would be wider than the schema it
 * is refused; where it is narrower (properties only in their declared order,
 * no additional properties, ASCII for \D \W \S), the documents it gives
 * still validate. Bounded integers get an exact decimal range grammar;
 * bounded numbers only with integer bounds (an integer part in range and a
 * fraction, or the bound itself with zeros), never an exponent. String
 * lengths count code points, so an escape is one character and \u escapes
 * of surrogates (two escapes, one character) are not generated. */
#include "common/sbuf.h"
#include "sample/grammar.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_MAX_DEPTH 64
#define RULE_NAME (NX_SCHEMA_PREFIX_MAX + 16) /* a rule's name: the prefix, "s", a number */
#define BOUND_MAX 1e15 /* integer bounds beyond this are refused (exactness of doubles) */


struct sc {
	struct nx_sbuf out;  /* the rules */
	int n_rules;
	const char *prefix;  /* of every rule name (nx_schema_to_gbnf_rules) */
	struct nx_err *err;
	int depth;
	bool failed;
};

static int serr(struct sc *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int serr(struct sc *c, const char *path, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->failed = true;
	return nx_errf(c->err, "schema%s%s: %s", *path ? " at " : "", path, msg);
}

/* A new rule name into name (RULE_NAME bytes): the prefix, "s" and a number; its body is appended by the caller
 * after "name ::= " and ended with "\n". */
static void rule_begin(struct sc *c, char name[RULE_NAME])
{
	snprintf(name, RULE_NAME, "%ss%d", c->prefix, ++c->n_rules);
	nx_sb_fmt(&c->out, "%s ::= ", name);
}

/* A GBNF literal of the bytes s[0..n). */
static void sb_lit(struct nx_sbuf *b, const char *s, size_t n)
{
	nx_sb_str(b, "\"");
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch == '"' || ch == '\\')
			nx_sb_fmt(b, "\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			nx_sb_fmt(b, "\\x%02X", ch);
		else
			nx_sb_put(b, (const char *)&ch, 1);
	}
	nx_sb_str(b, "\" ");
}

/* The compact JSON text of v, non-ASCII escaped, as a GBNF literal. */
static int sb_json_lit(struct sc *c, const json_t *v)
{
	char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
	if (!t) {
		c->out.oom = true;
		return -1;
	}
	sb_lit(&c->out, t, strlen(t));
	free(t);
	return 0;
}

/* --- decimal ranges ----------------------------------------------------------- */

/* Digits of a and b, the same count n: the GBNF of every n-digit string
 * between them (leading zeros allowed: this is a digit string's tail). */
static void digits_range(struct nx_sbuf *b, const char *a, const char *z, int n)
{
	if (n == 0)
		return;
	if (a[0] == z[0]) {
		nx_sb_fmt(b, "\"%c\" ", a[0]);
		digits_range(b, a + 1, z + 1, n - 1);
		return;
	}
	bool a_zeros = true, z_nines = true;
	for (int i = 1; i < n; i++) {
		a_zeros = a_zeros && a[i] == '0';
		z_nines = z_nines && z[i] == '9';
	}
	nx_sb_str(b, "( ");
	char lo = a_zeros ? a[0] : (char)(a[0] + 1), hi = z_nines ? z[0] : (char)(z[0] - 1);
	bool first = true;
	if (!a_zeros) {
		char nines[24];
		memset(nines, '9', (size_t)n - 1);
		nx_sb_fmt(b, "\"%c\" ", a[0]);
		digits_range(b, a + 1, nines, n - 1);
		first = false;
	}
	if (lo <= hi) {
		if (!first)
			nx_sb_str(b, "| ");
		nx_sb_fmt(b, "[%c-%c] ", lo, hi);
		if (n > 1)
			nx_sb_fmt(b, "[0-9]{%d} ", n - 1);
		first = false;
	}
	if (!z_nines) {
		char zeros[24];
		memset(zeros, '0', (size_t)n - 1);
		if (!first)
			nx_sb_str(b, "| ");
		nx_sb_fmt(b, "\"%c\" ", z[0]);
		digits_range(b, zeros, z + 1, n - 1);
	}
	nx_sb_str(b, ") ");
}

static int n_digits(uint64_t x)
{
	int n = 1;
	while (x >= 10) {
		x /= 10;
		n++;
	}
	return n;
}

/* Decimal naturals without leading zeros in lo..hi (hi_inf: no upper bound). */
static void nat_range(struct nx_sbuf *b, uint64_t lo, uint64_t hi, bool hi_inf)
{
	nx_sb_str(b, "( ");
	bool first = true;
	const int nl = n_digits(lo), nh = hi_inf ? 20 : n_digits(hi);
	for (int n = nl; n <= nh && n <= 16; n++) {
		/* the n-digit numbers of lo..hi */
		uint64_t p = 1;
		for (int i = 1; i < n; i++)
			p *= 10;
		uint64_t a = n == 1 ? 0 : p, z = p * 10 - 1;
		if (a < lo)
			a = lo;
		if (!hi_inf && z > hi)
			z = hi;
		if (a > z)
			continue;
		if (!first)
			nx_sb_str(b, "| ");
		first = false;
		if (hi_inf && n == nl && a == (n == 1 ? 0 : p)) {
			/* everything of n digits and more */
			if (n == 1 && a == 0)
				nx_sb_str(b, "\"0\" | [1-9] [0-9]* ");
			else
				nx_sb_fmt(b, "[1-9] [0-9]{%d,} ", n - 1);
			nx_sb_str(b, ") ");
			return;
		}
		char sa[24], sz[24];
		snprintf(sa, sizeof(sa), "%0*llu", n, (unsigned long long)a);
		snprintf(sz, sizeof(sz), "%0*llu", n, (unsigned long long)z);
		nx_sb_str(b, "( ");
		digits_range(b, sa, sz, n);
		nx_sb_str(b, ") ");
		if (hi_inf && n == nl) {
			/* and every longer number */
			nx_sb_fmt(b, "| [1-9] [0-9]{%d,} ", n);
			nx_sb_str(b, ") ");
			return;
		}
	}
	nx_sb_str(b, ") ");
}

/* --- schema bounds -------------------------------------------------------------- */

struct bound {
	bool has;
	double v;
	bool exclusive;
};

static int get_bound(struct sc *c, json_t *s, const char *key, const char *xkey, struct bound *b, const char *path)
{
	json_t *v = json_object_get(s, key), *x = json_object_get(s, xkey);
	memset(b, 0, sizeof(*b));
	if (x && json_is_boolean(x))
		return serr(c, path, "'%s' as a boolean (draft 4) is not supported; give it as a number", xkey);
	if (v && !json_is_number(v))
		return serr(c, path, "'%s' must be a number", key);
	if (x && !json_is_number(x))
		return serr(c, path, "'%s' must be a number", xkey);
	if (v) {
		b->has = true;
		b->v = json_number_value(v);
	}
	if (x) {
		double xv = json_number_value(x);
		bool lower = key[1] == 'i'; /* minimum */
		if (!b->has || (lower ? xv >= b->v : xv <= b->v)) {
			b->has = true;
			b->v = xv;
			b->exclusive = true;
		}
	}
	if (b->has && !(fabs(b->v) <= BOUND_MAX))
		return serr(c, path, "'%s' %g is beyond +-1e15, where bounds are not exact", b->exclusive ? xkey : key, b->v);
	return 0;
}

/* Integers lo..hi (each may be unbounded) as GBNF into the rule body. */
static void int_range(struct nx_sbuf *b, bool has_lo, int64_t lo, bool has_hi, int64_t hi)
{
	bool first = true;
	nx_sb_str(b, "( ");
	/* the non-negative part: max(lo, 0) .. hi */
	if (!has_hi || hi >= 0) {
		uint64_t a = has_lo && lo > 0 ? (uint64_t)lo : 0;
		nat_range(b, a, has_hi ? (uint64_t)hi : 0, !has_hi);
		first = false;
	}
	/* the negative part: "-" and a magnitude of max(-hi, 1) .. -lo */
	if (!has_lo || lo < 0) {
		uint64_t a = has_hi && hi < 0 ? (uint64_t)(-hi) : 1;
		if (!first)
			nx_sb_str(b, "| ");
		nx_sb_str(b, "\"-\" ");
		nat_range(b, a, has_lo ? (uint64_t)(-lo) : 0, !has_lo);
	}
	nx_sb_str(b, ") ");
}

/* A magnitude m of lo..hi (integers, hi may be unbounded), fraction allowed:
 * an integer part of lo..hi-1 and any fraction, or hi and zeros. */
static void frac_range(struct nx_sbuf *b, uint64_t lo, bool has_hi, uint64_t hi)
{
	nx_sb_str(b, "( ");
	if (!has_hi) {
		nat_range(b, lo, 0, true);
		nx_sb_str(b, "( \".\" [0-9]+ )? ");
	} else {
		if (hi > lo) {
			nx_sb_str(b, "( ");
			nat_range(b, lo, hi - 1, false);
			nx_sb_str(b, "( \".\" [0-9]+ )? ) | ");
		}
		nx_sb_fmt(b, "\"%llu\" ( \".\" \"0\"+ )? ", (unsigned long long)hi);
	}
	nx_sb_str(b, ") ");
}

/* --- regular expressions (ECMA-262 subset) -------------------------------------- */

struct rx {
	const char *s, *end;
	struct sc *c;
	const char *path;
	struct nx_sbuf *b;
	int depth;
};

struct cset {
	uint32_t (*r)[2];
	int n, cap;
	bool ascii_only; /* a Unicode-aware shorthand was negated: keep to ASCII (narrower, never wider) */
};

static int cs_add(struct cset *s, uint32_t lo, uint32_t hi)
{
	if (s->n == s->cap) {
		int c = s->cap ? s->cap * 2 : 16;
		void *q = realloc(s->r, (size_t)c * sizeof(*s->r));
		if (!q)
			return -1;
		s->r = q;
		s->cap = c;
	}
	s->r[s->n][0] = lo;
	s->r[s->n][1] = hi;
	s->n++;
	return 0;
}

static int cmp_r(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void cs_norm(struct cset *s)
{
	if (s->n > 1)
		qsort(s->r, (size_t)s->n, sizeof(*s->r), cmp_r);
	int m = 0;
	for (int i = 0; i < s->n; i++) {
		if (m && s->r[i][0] <= s->r[m - 1][1] + 1) {
			if (s->r[i][1] > s->r[m - 1][1])
				s->r[m - 1][1] = s->r[i][1];
		} else {
			s->r[m][0] = s->r[i][0];
			s->r[m][1] = s->r[i][1];
			m++;
		}
	}
	s->n = m;
}

static int cs_negate(struct cset *s)
{
	cs_norm(s);
	struct cset o = {0};
	uint32_t next = 0;
	for (int i = 0; i < s->n; i++) {
		if (s->r[i][0] > next && cs_add(&o, next, s->r[i][0] - 1))
			return -1;
		next = s->r[i][1] + 1;
	}
	if (next <= 0x10FFFF && cs_add(&o, next, 0x10FFFF))
		return -1;
	free(s->r);
	o.ascii_only = s->ascii_only;
	*s = o;
	return 0;
}

/* d w s (upper case: negated, kept to ASCII) */
static int cs_shorthand(struct cset *s, char k)
{
	struct cset t = {0};
	int rc = 0;
	switch (k | 0x20) {
	case 'd': rc = cs_add(&t, '0', '9'); break;
	case 'w': rc = cs_add(&t, '0', '9') || cs_add(&t, 'A', 'Z') || cs_add(&t, '_', '_') || cs_add(&t, 'a', 'z'); break;
	case 's': rc = cs_add(&t, '\t', '\r') || cs_add(&t, ' ', ' '); break;
	}
	if (!rc && k >= 'A' && k <= 'Z') {
		rc = cs_negate(&t);
		s->ascii_only = true;
	}
	for (int i = 0; !rc && i < t.n; i++)
		rc = cs_add(s, t.r[i][0], t.r[i][1]);
	free(t.r);
	return rc;
}

static void emit_cp_lit(struct nx_sbuf *b, uint32_t cp)
{
	/* the JSON encoding of one decoded character, as a GBNF literal */
	static const char esc[] = { ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't' };
	if (cp == '"')
		nx_sb_str(b, "\"\\\\\\\"\" ");
	else if (cp == '\\')
		nx_sb_str(b, "\"\\\\\\\\\" ");
	else if (cp < 0x20 && cp < sizeof(esc) && esc[cp])
		nx_sb_fmt(b, "\"\\\\%c\" ", esc[cp]);
	else if (cp < 0x20)
		nx_sb_fmt(b, "\"\\\\u00%02X\" ", cp);
	else if (cp < 0x7f && cp != '"' && cp != '\\')
		nx_sb_fmt(b, "\"%c\" ", (char)cp);
	else
		nx_sb_fmt(b, "\"\\U%08X\" ", cp);
}

/* A set of decoded characters as the GBNF of their JSON encodings. */
static void emit_cset(struct nx_sbuf *b, struct cset *s)
{
	cs_norm(s);
	nx_sb_str(b, "( ");
	bool any = false, first = true;
	/* the characters a JSON string holds as they are */
	for (int i = 0; i < s->n; i++) {
		uint32_t lo = s->r[i][0], hi = s->r[i][1];
		if (s->ascii_only && hi > 0x7f)
			hi = 0x7f;
		for (uint32_t a = lo; a <= hi;) {
			uint32_t z = hi;
			/* cut out the controls, '"', '\\', DEL kept, surrogates */
			if (a < 0x20) {
				a = 0x20;
				continue;
			}
			if (a == '"' || a == '\\') {
				a++;
				continue;
			}
			if (a >= 0xD800 && a <= 0xDFFF) {
				a = 0xE000;
				continue;
			}
			if (a < '"' && z >= '"')
				z = '"' - 1;
			else if (a < '\\' && z >= '\\')
				z = '\\' - 1;
			else if (a < 0xD800 && z >= 0xD800)
				z = 0xD7FF;
			if (!any) {
				nx_sb_str(b, "[");
				any = true;
			}
			nx_sb_fmt(b, "\\U%08X-\\U%08X", a, z);
			if (z == 0x10FFFF)
				break;
			a = z + 1;
		}
	}
	if (any) {
		nx_sb_str(b, "] ");
		first = false;
	}
	/* and those it holds escaped, but U+0000 (nx_grammar_json_gbnf: jansson refuses it) */
	for (int i = 0; i < s->n; i++)
		for (uint32_t cp = s->r[i][0]; cp <= s->r[i][1] && cp <= '\\'; cp++)
			if ((cp < 0x20 && cp > 0) || cp == '"' || cp == '\\') {
				if (!first)
					nx_sb_str(b, "| ");
				emit_cp_lit(b, cp);
				first = false;
			}
	if (first)
		nx_sb_str(b, "[^\\x00-\\U0010FFFF] "); /* not reached: an empty set, or U+0000 alone, is refused before */
	nx_sb_str(b, ") ");
}

/* The strings nxd's grammars write never hold U+0000 (nx_grammar_json_gbnf); a
 * class with more in it just loses it (emit_cset), one of it alone is refused. */
#define NUL_REFUSED "U+0000 is not supported (the JSON nxd writes never holds \\u0000)"

static int rx_err(struct rx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rx_err(struct rx *x, const char *fmt, ...)
{
	char msg[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return serr(x->c, x->path, "'pattern': %s", msg);
}

static int rx_cp(struct rx *x, uint32_t *cp)
{
	const unsigned char *s = (const unsigned char *)x->s;
	unsigned c = s[0];
	int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
	if (x->end - x->s < n)
		return rx_err(x, "invalid UTF-8");
	uint32_t v = n == 1 ? c : c & (0xFF >> (n + 1));
	for (int i = 1; i < n; i++)
		v = v << 6 | (s[i] & 0x3F);
	x->s += n;
	*cp = v;
	return 0;
}

static int rx_hex(struct rx *x, int n, uint32_t *v)
{
	*v = 0;
	for (int i = 0; i < n; i++) {
		if (x->s >= x->end)
			return rx_err(x, "escape needs %d hex digits", n);
		char ch = *x->s++;
		int h = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f' ? (ch | 0x20) - 'a' + 10 : -1;
		if (h < 0)
			return rx_err(x, "escape needs %d hex digits", n);
		*v = *v << 4 | (uint32_t)h;
	}
	return 0;
}

/* An escape after '\\': a character (*cp) or a shorthand class (into s,
 * returns 1). */
static int rx_escape(struct rx *x, uint32_t *cp, struct cset *s)
{
	if (x->s >= x->end)
		return rx_err(x, "the pattern ends with '\\'");
	char e = *x->s++;
	switch (e) {
	case 'd': case 'w': case 's': case 'D': case 'W': case 'S':
		return cs_shorthand(s, e) ? rx_err(x, "out of memory") : 1;
	case 'n': *cp = '\n'; return 0;
	case 'r': *cp = '\r'; return 0;
	case 't': *cp = '\t'; return 0;
	case 'f': *cp = '\f'; return 0;
	case 'v': *cp = '\v'; return 0;
	case '0': *cp = 0; return 0;
	case 'x': return rx_hex(x, 2, cp);
	case 'u':
		if (rx_hex(x, 4, cp))
			return -1;
		if (*cp >= 0xD800 && *cp <= 0xDFFF)
			return rx_err(x, "\\u escape of a surrogate is not supported");
		return 0;
	case 'b': case 'B': return rx_err(x, "word boundary '\\%c' is not supported", e);
	case 'p': case 'P': return rx_err(x, "Unicode property escape '\\%c' is not supported", e);
	case 'k': return rx_err(x, "backreference '\\k' is not supported");
	case 'c': return rx_err(x, "control escape '\\c' is not supported");
	default:
		if (e >= '1' && e <= '9')
			return rx_err(x, "backreference '\\%c' is not supported", e);
		if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
			return rx_err(x, "escape '\\%c' is not supported", e);
		x->s--;
		return rx_cp(x, cp);
	}
}

static int rx_class(struct rx *x, struct cset *s)
{
	bool neg = x->s < x->end && *x->s == '^';
	if (neg)
		x->s++;
	bool first = true;
	while (x->s < x->end && (*x->s != ']' || (first && false))) {
		first = false;
		uint32_t lo, hi;
		struct cset sh = {0};
		int k;
		if (*x->s == '\\') {
			x->s++;
			k = rx_escape(x, &lo, &sh);
		} else {
			if (*x->s == '[' && x->s + 1 < x->end && (x->s[1] == ':' || x->s[1] == '=' || x->s[1] == '.'))
				return rx_err(x, "POSIX class '[%c' is not supported", x->s[1]);
			k = rx_cp(x, &lo);
		}
		if (k < 0) {
			free(sh.r);
			return -1;
		}
		if (k == 1) {
			for (int i = 0; i < sh.n; i++)
				if (cs_add(s, sh.r[i][0], sh.r[i][1]))
					return rx_err(x, "out of memory");
			s->ascii_only = s->ascii_only || sh.ascii_only;
			free(sh.r);
			continue;
		}
		hi = lo;
		if (x->s + 1 < x->end && *x->s == '-' && x->s[1] != ']') {
			x->s++;
			if (*x->s == '\\') {
				x->s++;
				k = rx_escape(x, &hi, &sh);
				free(sh.r);
				if (k < 0)
					return -1;
				if (k == 1)
					return rx_err(x, "a class shorthand cannot end a range");
			} else if (rx_cp(x, &hi)) {
				return -1;
			}
			if (hi < lo)
				return rx_err(x, "range out of order in a character class");
		}
		if (cs_add(s, lo, hi))
			return rx_err(x, "out of memory");
	}
	if (x->s >= x->end)
		return rx_err(x, "unterminated character class");
	x->s++;
	if (neg) {
		/* a negated class with a Unicode-aware shorthand in it stays ASCII */
		bool had_short = s->ascii_only;
		if (cs_negate(s))
			return rx_err(x, "out of memory");
		s->ascii_only = s->ascii_only || had_short;
	}
	cs_norm(s);
	bool empty = s->n == 0;
	if (!empty && s->ascii_only)
		empty = s->r[0][0] > 0x7f;
	if (empty)
		return rx_err(x, "a character class that matches nothing");
	if (s->n == 1 && s->r[0][1] == 0)
		return rx_err(x, NUL_REFUSED);
	return 0;
}

static int rx_alt(struct rx *x);

static int rx_count(struct rx *x, long *v)
{
	long n = 0;
	int d = 0;
	while (x->s < x->end && *x->s >= '0' && *x->s <= '9') {
		n = n * 10 + (*x->s++ - '0');
		if (n > NX_GRAMMAR_MAX_REPEAT)
			return rx_err(x, "repetition count above %d", NX_GRAMMAR_MAX_REPEAT);
		d++;
	}
	*v = d ? n : -1;
	return 0;
}

static int rx_seq(struct rx *x)
{
	struct nx_sbuf *b = x->b;
	nx_sb_str(b, "( ");
	while (x->s < x->end && *x->s != '|' && *x->s != ')') {
		char ch = *x->s;
		if (ch == '(') {
			x->s++;
			if (x->s < x->end && *x->s == '?') {
				x->s++;
				if (x->s < x->end && *x->s == ':') {
					x->s++;
				} else if (x->s < x->end && (*x->s == '=' || *x->s == '!')) {
					return rx_err(x, "lookahead '(?%c' is not supported", *x->s);
				} else if (x->s + 1 < x->end && *x->s == '<' && (x->s[1] == '=' || x->s[1] == '!')) {
					return rx_err(x, "lookbehind '(?<%c' is not supported", x->s[1]);
				} else if (x->s < x->end && *x->s == '<') {
					while (x->s < x->end && *x->s != '>')
						x->s++;
					if (x->s >= x->end)
						return rx_err(x, "unterminated group name");
					x->s++;
				} else {
					return rx_err(x, "group '(?%c' (inline flags or an extension) is not supported",
						      x->s < x->end ? *x->s : ' ');
				}
			}
			if (++x->depth > 64)
				return rx_err(x, "groups nested more than 64 deep");
			if (rx_alt(x))
				return -1;
			x->depth--;
			if (x->s >= x->end || *x->s != ')')
				return rx_err(x, "unmatched '('");
			x->s++;
		} else if (ch == '[') {
			x->s++;
			struct cset s = {0};
			int rc = rx_class(x, &s);
			if (!rc)
				emit_cset(b, &s);
			free(s.r);
			if (rc)
				return -1;
		} else if (ch == '.') {
			x->s++;
			struct cset s = {0};
			/* ECMA-262: anything but a line terminator */
			if (cs_add(&s, '\n', '\n') || cs_add(&s, '\r', '\r') || cs_add(&s, 0x2028, 0x2029) || cs_negate(&s)) {
				free(s.r);
				return rx_err(x, "out of memory");
			}
			emit_cset(b, &s);
			free(s.r);
		} else if (ch == '\\') {
			x->s++;
			uint32_t cp;
			struct cset s = {0};
			int k = rx_escape(x, &cp, &s);
			if (k == 0 && !cp)
				k = rx_err(x, NUL_REFUSED);
			if (k == 1)
				emit_cset(b, &s);
			else if (k == 0)
				emit_cp_lit(b, cp);
			free(s.r);
			if (k < 0)
				return -1;
		} else if (ch == '^' || ch == '$') {
			return rx_err(x, "anchor '%c' is only supported at the start ('^') or end ('$') of the pattern", ch);
		} else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
			return rx_err(x, "'%c' has nothing before it to repeat", ch);
		} else {
			uint32_t cp;
			if (rx_cp(x, &cp))
				return -1;
			if (!cp)
				return rx_err(x, NUL_REFUSED);
			emit_cp_lit(b, cp);
		}
		/* a quantifier on what was just written */
		if (x->s < x->end && (*x->s == '*' || *x->s == '+' || *x->s == '?' || *x->s == '{')) {
			char q = *x->s++;
			if (q == '{') {
				long m, n;
				if (x->s < x->end && *x->s == ',')
					return rx_err(x, "'{,n}' is not a quantifier in ECMA-262 regular expressions");
				if (rx_count(x, &m))
					return -1;
				if (m < 0)
					return rx_err(x, "a literal '{' is not supported; escape it as '\\{'");
				n = m;
				if (x->s < x->end && *x->s == ',') {
					x->s++;
					if (rx_count(x, &n))
						return -1;
				}
				if (x->s >= x->end || *x->s != '}')
					return rx_err(x, "unterminated quantifier '{'");
				x->s++;
				if (n >= 0 && n < m)
					return rx_err(x, "quantifier {%ld,%ld} out of order", m, n);
				if (n < 0)
					nx_sb_fmt(b, "{%ld,} ", m);
				else
					nx_sb_fmt(b, "{%ld,%ld} ", m, n);
			} else {
				nx_sb_fmt(b, "%c ", q);
			}
			if (x->s < x->end && *x->s == '?')
				x->s++; /* lazy: the same language */
			if (x->s < x->end && (*x->s == '*' || *x->s == '+' || *x->s == '{'))
				return rx_err(x, "a quantifier cannot follow a quantifier");
		}
	}
	nx_sb_str(b, ") ");
	return 0;
}

static int rx_alt(struct rx *x)
{
	nx_sb_str(x->b, "( ");
	for (;;) {
		if (rx_seq(x))
			return -1;
		if (x->s < x->end && *x->s == '|') {
			x->s++;
			nx_sb_str(x->b, "| ");
			continue;
		}
		break;
	}
	nx_sb_str(x->b, ") ");
	return 0;
}

/* A string whose content matches pattern (searched, as JSON schema says). */
static int pattern_rule(struct sc *c, const char *pat, size_t len, const char *path, char name[RULE_NAME])
{
	struct nx_sbuf body = {0};
	struct rx x = { pat, pat + len, c, path, &body, 0 };
	bool start = len && pat[0] == '^';
	if (start)
		x.s++;
	bool end = false;
	if (x.end > x.s && x.end[-1] == '$') {
		/* not an escaped '$' */
		size_t bs = 0;
		for (const char *q = x.end - 2; q >= x.s && *q == '\\'; q--)
			bs++;
		if (bs % 2 == 0) {
			end = true;
			x.end--;
		}
	}
	int rc = rx_alt(&x);
	if (!rc && x.s < x.end)
		rc = rx_err(&x, "unmatched ')'");
	if (!rc && body.oom)
		rc = serr(c, path, "out of memory");
	if (rc) {
		free(body.s);
		return -1;
	}
	rule_begin(c, name);
	nx_sb_str(&c->out, "\"\\\"\" ");
	if (!start)
		nx_sb_str(&c->out, "char* ");
	nx_sb_put(&c->out, body.s, body.n);
	if (!end)
		nx_sb_str(&c->out, "char* ");
	nx_sb_str(&c->out, "\"\\\"\"\n");
	free(body.s);
	return 0;
}

/* --- schemas ---------------------------------------------------------------------- */

static const char *const annotations[] = {
	"title", "description", "$schema", "$id", "$comment", "default", "examples", "readOnly", "writeOnly",
	"deprecated", "$defs", "definitions", NULL,
};
static const char *const handled[] = {
	"type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems", "maxItems",
	"anyOf", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
	NULL,
};

static bool in(const char *const *list, const char *k)
{
	for (int i = 0; list[i]; i++)
		if (!strcmp(list[i], k))
			return true;
	return false;
}

static int gen(struct sc *c, json_t *s, const char *path, char name[RULE_NAME]);

static void sub_path(char *out, size_t cap, const char *path, const char *what)
{
	snprintf(out, cap, "%s%s%s", path, *path ? "." : "", what);
}

static int gen_object(struct sc *c, json_t *s, const char *path, char name[RULE_NAME])
{
	json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
	       *addl = json_object_get(s, "additionalProperties");
	if (props && !json_is_object(props))
		return serr(c, path, "'properties' must be an object");
	if (req && !json_is_array(req))
		return serr(c, path, "'required' must be an array of strings");
	if (addl && !json_is_object(addl) && !json_is_boolean(addl))
		return serr(c, path, "'additionalProperties' must be a schema");
	size_t n_req = req ? json_array_size(req) : 0;
	for (size_t i = 0; i < n_req; i++)
		if (!json_is_string(json_array_get(req, i)))
			return serr(c, path, "'required' must be an array of strings");
	if (!props && !n_req) {
		if (!addl || json_is_true(addl)) {
			snprintf(name, RULE_NAME, "object");
			return 0;
		}
		if (json_is_false(addl)) {
			rule_begin(c, name);
			nx_sb_str(&c->out, "\"{\" ws \"}\"\n");
			return 0;
		}
		/* a map: any keys, each value of the schema */
		char v[RULE_NAME], p2[256];
		sub_path(p2, sizeof(p2), path, "additionalProperties");
		if (gen(c, addl, p2, v))
			return -1;
		rule_begin(c, name);
		nx_sb_fmt(&c->out, "\"{\" ws ( string ws \":\" ws %s ws ( \",\" ws string ws \":\" ws %s ws )* )? \"}\"\n", v, v);
		return 0;
	}
	/* the properties in order: declared ones, then required ones not declared */
	size_t n_props = props ? json_object_size(props) : 0, n = 0;
	const char **keys = calloc(n_props + n_req + 1, sizeof(*keys));
	json_t **schemas = calloc(n_props + n_req + 1, sizeof(*schemas));
	bool *must = calloc(n_props + n_req + 1, sizeof(*must));
	char (*vals)[RULE_NAME] = calloc(n_props + n_req + 1, sizeof(*vals));
	int rc = 0;
	if (!keys || !schemas || !must || !vals) {
		rc = serr(c, path, "out of memory");
		goto out;
	}
	if (props) {
		const char *k;
		json_t *v;
		json_object_foreach(props, k, v) {
			keys[n] = k;
			schemas[n] = v;
			n++;
		}
	}
	for (size_t i = 0; i < n_req; i++) {
		const char *k = json_string_value(json_array_get(req, i));
		size_t j = 0;
		while (j < n && strcmp(keys[j], k))
			j++;
		if (j == n) {
			if (addl && json_is_false(addl)) {
				rc = serr(c, path, "required property '%s' is not in 'properties' and additionalProperties is false", k);
				goto out;
			}
			keys[n] = k;
			schemas[n] = addl && json_is_object(addl) ? addl : NULL;
			n++;
		}
		must[j] = true;
	}
	for (size_t i = 0; i < n; i++) {
		char p2[256];
		snprintf(p2, sizeof(p2), "%s%sproperties.%s", path, *path ? "." : "", keys[i]);
		if (!schemas[i])
			snprintf(vals[i], RULE_NAME, "value");
		else if (gen(c, schemas[i], p2, vals[i])) {
			rc = -1;
			goto out;
		}
	}
	/* kv_i; t_i: the rest from i when something came before; f_i: when nothing did */
	int base = c->n_rules;
	c->n_rules += 3 * (int)n + 2;
	struct nx_sbuf *o = &c->out;
	const char *const P = c->prefix;
	for (size_t i = 0; i < n; i++) {
		nx_sb_fmt(o, "%ss%d ::= ", P, base + 1 + (int)i);
		json_t *kj = json_string(keys[i]);
		if (!kj) {
			rc = serr(c, path, "property name '%s' is not valid UTF-8", keys[i]);
			goto out;
		}
		sb_json_lit(c, kj);
		json_decref(kj);
		nx_sb_fmt(o, "ws \":\" ws %s ws\n", vals[i]);
	}
	const int kv = base + 1, t = base + 1 + (int)n, f = t + (int)n + 1;
	for (size_t i = 0; i <= n; i++) {
		if (i == n) {
			nx_sb_fmt(o, "%ss%d ::= \"\"\n%ss%d ::= \"\"\n", P, t + (int)i, P, f + (int)i);
			break;
		}
		if (must[i]) {
			nx_sb_fmt(o, "%ss%d ::= \",\" ws %ss%d %ss%d\n", P, t + (int)i, P, kv + (int)i, P, t + (int)i + 1);
			nx_sb_fmt(o, "%ss%d ::= %ss%d %ss%d\n", P, f + (int)i, P, kv + (int)i, P, t + (int)i + 1);
		} else {
			nx_sb_fmt(o, "%ss%d ::= ( \",\" ws %ss%d )? %ss%d\n", P, t + (int)i, P, kv + (int)i, P, t + (int)i + 1);
			nx_sb_fmt(o, "%ss%d ::= %ss%d %ss%d | %ss%d\n", P, f + (int)i, P, kv + (int)i, P, t + (int)i + 1, P, f + (int)i + 1);
		}
	}
	rule_begin(c, name);
	nx_sb_fmt(o, "\"{\" ws %ss%d \"}\"\n", P, f);
out:
	free(keys);
	free(schemas);
	free(must);
	free(vals);
	return rc;
}

static int get_count(struct sc *c, json_t *s, const char *key, long *v, const char *path)
{
	json_t *j = json_object_get(s, key);
	*v = -1;
	if (!j)
		return 0;
	if (!json_is_integer(j) || json_integer_value(j) < 0)
		return serr(c, path, "'%s' must be a non-negative integer", key);
	if (json_integer_value(j) > NX_GRAMMAR_MAX_REPEAT)
		return serr(c, path, "'%s' %lld is above %d, the largest count supported", key,
			    (long long)json_integer_value(j), NX_GRAMMAR_MAX_REPEAT);
	*v = (long)json_integer_value(j);
	return 0;
}

static int gen_array(struct sc *c, json_t *s, const char *path, char name[RULE_NAME])
{
	json_t *items = json_object_get(s, "items");
	if (items && json_is_array(items))
		return serr(c, path, "'items' as an array (the tuple form) is not supported");
	long mn, mx;
	if (get_count(c, s, "minItems", &mn, path) || get_count(c, s, "maxItems", &mx, path))
		return -1;
	if (mn < 0)
		mn = 0;
	if (mx >= 0 && mx < mn)
		return serr(c, path, "maxItems %ld is below minItems %ld", mx, mn);
	char v[RULE_NAME], p2[256];
	sub_path(p2, sizeof(p2), path, "items");
	if (!items)
		snprintf(v, RULE_NAME, "value");
	else if (gen(c, items, p2, v))
		return -1;
	rule_begin(c, name);
	struct nx_sbuf *o = &c->out;
	if (mx == 0) {
		nx_sb_str(o, "\"[\" ws \"]\"\n");
		return 0;
	}
	nx_sb_fmt(o, "\"[\" ws ( %s ws ( \",\" ws %s ws )", v, v);
	long lo = mn > 0 ? mn - 1 : 0;
	if (mx < 0)
		nx_sb_fmt(o, "{%ld,} ", lo);
	else
		nx_sb_fmt(o, "{%ld,%ld} ", lo, mx - 1);
	nx_sb_fmt(o, ")%s \"]\"\n", mn == 0 ? "?" : "");
	return 0;
}

static int gen_string(struct sc *c, json_t *s, const char *path, char name[RULE_NAME])
{
	json_t *pat = json_object_get(s, "pattern");
	long mn, mx;
	if (get_count(c, s, "minLength", &mn, path) || get_count(c, s, "maxLength", &mx, path))
		return -1;
	if (pat) {
		if (!json_is_string(pat))
			return serr(c, path, "'pattern' must be a string");
		if (mn >= 0 || mx >= 0)
			return serr(c, path, "'pattern' together with minLength/maxLength is not supported");
		return pattern_rule(c, json_string_value(pat), json_string_length(pat), path, name);
	}
	if (mn < 0 && mx < 0) {
		snprintf(name, RULE_NAME, "string");
		return 0;
	}
	if (mn < 0)
		mn = 0;
	if (mx >= 0 && mx < mn)
		return serr(c, path, "maxLength %ld is below minLength %ld", mx, mn);
	rule_begin(c, name);
	if (mx < 0)
		nx_sb_fmt(&c->out, "\"\\\"\" char{%ld,} \"\\\"\"\n", mn);
	else
		nx_sb_fmt(&c->out, "\"\\\"\" char{%ld,%ld} \"\\\"\"\n", mn, mx);
	return 0;
}

static int gen_number(struct sc *c, json_t *s, const char *path, bool integer, char name[RULE_NAME])
{
	struct bound lo, hi;
	if (get_bound(c, s, "minimum", "exclusiveMinimum", &lo, path) ||
	    get_bound(c, s, "maximum", "exclusiveMaximum", &hi, path))
		return -1;
	if (!lo.has && !hi.has) {
		snprintf(name, RULE_NAME, integer ? "integer" : "number");
		return 0;
	}
	if (integer) {
		int64_t a = 0, z = 0;
		if (lo.has)
			a = lo.exclusive ? (int64_t)floor(lo.v) + 1 : (int64_t)ceil(lo.v);
		if (hi.has)
			z = hi.exclusive ? (int64_t)ceil(hi.v) - 1 : (int64_t)floor(hi.v);
		if (lo.has && hi.has && a > z)
			return serr(c, path, "no integer lies between the bounds %g and %g", lo.v, hi.v);
		rule_begin(c, name);
		int_range(&c->out, lo.has, a, hi.has, z);
		nx_sb_str(&c->out, "\n");
		return 0;
	}
	if ((lo.has && (lo.exclusive || lo.v != floor(lo.v))) || (hi.has && (hi.exclusive || hi.v != floor(hi.v))))
		return serr(c, path, "a number bound that is exclusive or not an integer is not supported "
				     "(integer bounds with 'minimum'/'maximum' are)");
	int64_t a = (int64_t)lo.v, z = (int64_t)hi.v;
	if (lo.has && hi.has && a > z)
		return serr(c, path, "minimum %g is above maximum %g", lo.v, hi.v);
	rule_begin(c, name);
	struct nx_sbuf *o = &c->out;
	nx_sb_str(o, "( ");
	bool first = true;
	if (!hi.has || z >= 0) { /* v >= 0: max(lo, 0) .. hi */
		frac_range(o, lo.has && a > 0 ? (uint64_t)a : 0, hi.has, hi.has ? (uint64_t)z : 0);
		first = false;
	}
	if (!lo.has || a < 0) { /* v < 0: "-" and a magnitude of max(-hi, 0) .. -lo */
		if (!first)
			nx_sb_str(o, "| ");
		nx_sb_str(o, "\"-\" ");
		frac_range(o, hi.has && z < 0 ? (uint64_t)(-z) : 0, lo.has, lo.has ? (uint64_t)(-a) : 0);
	}
	nx_sb_str(o, ")\n");
	return 0;
}

static bool type_fits(const json_t *v, const char *t)
{
	if (!strcmp(t, "integer"))
		return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
	if (!strcmp(t, "number"))
		return json_is_number(v);
	if (!strcmp(t, "string"))
		return json_is_string(v);
	if (!strcmp(t, "boolean"))
		return json_is_boolean(v);
	if (!strcmp(t, "null"))
		return json_is_null(v);
	if (!strcmp(t, "object"))
		return json_is_object(v);
	if (!strcmp(t, "array"))
		return json_is_array(v);
	return false;
}

static bool type_known(const char *t)
{
	return in((const char *const[]){ "integer", "number", "string", "boolean", "null", "object", "array", NULL }, t);
}

static int gen_type(struct sc *c, json_t *s, const char *t, const char *path, char name[RULE_NAME])
{
	if (!strcmp(t, "null")) {
		snprintf(name, RULE_NAME, "null");
		return 0;
	}
	if (!strcmp(t, "boolean")) {
		snprintf(name, RULE_NAME, "boolean");
		return 0;
	}
	if (!strcmp(t, "string"))
		return gen_string(c, s, path, name);
	if (!strcmp(t, "integer") || !strcmp(t, "number"))
		return gen_number(c, s, path, t[0] == 'i', name);
	if (!strcmp(t, "object"))
		return gen_object(c, s, path, name);
	return gen_array(c, s, path, name);
}

/* The type a schema without "type" is given by its keywords (narrower than
 * the schema, which would take any other type too); NULL: any value. */
static const char *implied_type(json_t *s)
{
	if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties"))
		return "object";
	if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
		return "array";
	if (json_object_get(s, "pattern") || json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
		return "string";
	if (json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
	    json_object_get(s, "exclusiveMaximum"))
		return "number";
	return NULL;
}

static int gen(struct sc *c, json_t *s, const char *path, char name[RULE_NAME])
{
	if (json_is_true(s)) {
		snprintf(name, RULE_NAME, "value");
		return 0;
	}
	if (json_is_false(s))
		return serr(c, path, "the schema false (nothing validates) cannot be generated");
	if (!json_is_object(s))
		return serr(c, path, "a schema must be an object or a boolean, got %s", json_is_array(s) ? "an array" : "a scalar");
	if (++c->depth > SCHEMA_MAX_DEPTH)
		return serr(c, path, "schemas nested more than %d deep", SCHEMA_MAX_DEPTH);
	const char *k;
	json_t *v;
	json_object_foreach(s, k, v) {
		if (!in(annotations, k) && !in(handled, k))
			return serr(c, path, "keyword '%s' is not supported", k);
	}
	json_t *type = json_object_get(s, "type"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"),
	       *any = json_object_get(s, "anyOf");
	const char *types[8];
	int n_types = 0;
	if (type) {
		if (json_is_string(type)) {
			types[n_types++] = json_string_value(type);
		} else if (json_is_array(type) && json_array_size(type) > 0 && json_array_size(type) <= 7) {
			for (size_t i = 0; i < json_array_size(type); i++) {
				json_t *t = json_array_get(type, i);
				if (!json_is_string(t))
					return serr(c, path, "'type' must be a string or an array of strings");
				types[n_types++] = json_string_value(t);
			}
		} else {
			return serr(c, path, "'type' must be a string or an array of 1 to 7 strings");
		}
		for (int i = 0; i < n_types; i++)
			if (!type_known(types[i]))
				return serr(c, path, "type '%s' is not a JSON schema type", types[i]);
	}
	if (en || cn || any) {
		json_object_foreach(s, k, v) {
			if (!in(annotations, k) && strcmp(k, "type") && strcmp(k, en ? "enum" : cn ? "const" : "anyOf"))
				return serr(c, path, "'%s' together with '%s' is not supported", en ? "enum" : cn ? "const" : "anyOf", k);
		}
	}
	if (en || cn) {
		if (en && !json_is_array(en))
			return serr(c, path, "'enum' must be an array");
		size_t n = en ? json_array_size(en) : 1;
		int kept = 0;
		rule_begin(c, name);
		for (size_t i = 0; i < n; i++) {
			json_t *x = en ? json_array_get(en, i) : cn;
			bool fits = n_types == 0;
			for (int t = 0; t < n_types && !fits; t++)
				fits = type_fits(x, types[t]);
			if (!fits)
				continue;
			if (kept++)
				nx_sb_str(&c->out, "| ");
			if (sb_json_lit(c, x))
				return serr(c, path, "out of memory");
		}
		nx_sb_str(&c->out, "\n");
		if (!kept)
			return serr(c, path, "no value of '%s' has the schema's type", en ? "enum" : "const");
		c->depth--;
		return 0;
	}
	if (any) {
		if (!json_is_array(any) || json_array_size(any) == 0)
			return serr(c, path, "'anyOf' must be a non-empty array of schemas");
		if (type)
			return serr(c, path, "'anyOf' together with 'type' is not supported");
		size_t n = json_array_size(any);
		char (*alts)[RULE_NAME] = calloc(n, sizeof(*alts));
		if (!alts)
			return serr(c, path, "out of memory");
		for (size_t i = 0; i < n; i++) {
			char p2[256];
			snprintf(p2, sizeof(p2), "%s%sanyOf[%zu]", path, *path ? "." : "", i);
			if (gen(c, json_array_get(any, i), p2, alts[i])) {
				free(alts);
				return -1;
			}
		}
		rule_begin(c, name);
		for (size_t i = 0; i < n; i++)
			nx_sb_fmt(&c->out, "%s%s ", i ? "| " : "", alts[i]);
		nx_sb_str(&c->out, "\n");
		free(alts);
		c->depth--;
		return 0;
	}
	if (n_types == 0) {
		const char *t = implied_type(s);
		if (!t) {
			snprintf(name, RULE_NAME, "value");
			c->depth--;
			return 0;
		}
		types[n_types++] = t;
	}
	if (n_types == 1) {
		int rc = gen_type(c, s, types[0], path, name);
		c->depth--;
		return rc;
	}
	char alts[8][RULE_NAME];
	for (int i = 0; i < n_types; i++)
		if (gen_type(c, s, types[i], path, alts[i]))
			return -1;
	rule_begin(c, name);
	for (int i = 0; i < n_types; i++)
		nx_sb_fmt(&c->out, "%s%s ", i ? "| " : "", alts[i]);
	nx_sb_str(&c->out, "\n");
	c->depth--;
	return 0;
}

static int schema_rules(const char *schema_json, size_t len, const char *prefix, struct sc *c, char root[RULE_NAME],
			struct nx_err *err)
{
	json_error_t je;
	json_t *s = json_loadb(schema_json, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
	if (!s)
		return nx_errf(err, "schema: not JSON: %s", je.text);
	*c = (struct sc){ .err = err, .prefix = prefix };
	int rc = gen(c, s, "", root);
	json_decref(s);
	if (rc || c->failed || c->out.oom) {
		if (!rc && !c->failed)
			nx_errf(err, "schema: out of memory");
		free(c->out.s);
		c->out.s = NULL;
		return -1;
	}
	return 0;
}

/* The JSON rules (but its root) and the typed ones schemas use. */
static void json_rules(struct nx_sbuf *g)
{
	nx_sb_str(g, strchr(nx_grammar_json_gbnf(), '\n') + 1);
	nx_sb_str(g, "boolean ::= \"true\" | \"false\"\nnull ::= \"null\"\n"
		  "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]* )\n");
}

int nx_schema_to_gbnf(const char *schema_json, size_t len, char **gbnf, struct nx_err *err)
{
	*gbnf = NULL;
	struct sc c;
	char root[RULE_NAME];
	if (schema_rules(schema_json, len, "", &c, root, err))
		return -1;
	struct nx_sbuf g = {0};
	nx_sb_fmt(&g, "root ::= %s\n", root);
	json_rules(&g);
	if (c.out.s)
		nx_sb_put(&g, c.out.s, c.out.n);
	free(c.out.s);
	if (g.oom) {
		free(g.s);
		return nx_errf(err, "schema: out of memory");
	}
	*gbnf = g.s;
	return 0;
}

int nx_schema_to_gbnf_rules(const char *schema_json, size_t len, const char *prefix, char **rules, char **root,
			    struct nx_err *err)
{
	*rules = *root = NULL;
	if (strlen(prefix) > NX_SCHEMA_PREFIX_MAX)
		return nx_errf(err, "schema: rule prefix '%s' is longer than %d bytes", prefix, NX_SCHEMA_PREFIX_MAX);
	struct sc c;
	char r[RULE_NAME];
	if (schema_rules(schema_json, len, prefix, &c, r, err))
		return -1;
	*rules = c.out.s ? c.out.s : strdup("");
	*root = strdup(r);
	if (!*rules || !*root) {
		free(*rules);
		free(*root);
		*rules = *root = NULL;
		return nx_errf(err, "schema: out of memory");
	}
	return 0;
}

char *nx_schema_gbnf_json_rules(void)
{
	struct nx_sbuf g = {0};
	json_rules(&g);
	if (g.oom) {
		free(g.s);
		return NULL;
	}
	return g.s;
}
