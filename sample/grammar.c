/* grammar.c - GBNF parser and compiler, the lazily determinized stack matcher, the vocabulary trie and the token mask (see grammar.h). */
#include "sample/grammar.h"

#include "tok/tokenizer.h"

#include <pthread.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ compiled form */

/* One flat array of elements: rule r's alternatives start at rule_start[r],
 * separated by E_ALT, ended by E_END. */
enum { E_END, E_ALT, E_REF, E_CHAR };

struct elem {
	uint8_t type;
	int32_t v; /* E_REF: rule id; E_CHAR: class id */
};

struct cclass {
	int32_t first, n; /* ranges rng[first .. first + n), sorted, merged */
	bool neg;
};

struct nx_grammar {
	struct elem *el;
	int32_t n_el;
	int32_t *rule_start;
	int32_t n_rules;
	int32_t root;
	struct cclass *cls;
	int32_t n_cls;
	uint32_t (*rng)[2];
	int32_t n_rng;
};

void nx_grammar_free(struct nx_grammar *g)
{
	if (!g)
		return;
	free(g->el);
	free(g->rule_start);
	free(g->cls);
	free(g->rng);
	free(g);
}

/* ------------------------------------------------------------ parser */

struct vec_el {
	struct elem *a;
	int32_t n, cap;
};

struct prule {
	char *name;           /* NULL: generated */
	struct vec_el body;
	bool defined;
	int line, col;        /* first use, for "used but not defined" */
};

struct parser {
	const char *s, *end, *line_start;
	int line;
	struct prule *rules;
	int32_t n_rules, cap_rules;
	struct cclass *cls;
	int32_t n_cls, cap_cls;
	uint32_t (*rng)[2];
	int32_t n_rng, cap_rng;
	size_t n_elems;
	struct nx_err *err;
	int depth;
};

static int perr(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(struct parser *p, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return nx_errf(p->err, "grammar: %s at %d:%d", msg, p->line, (int)(p->s - p->line_start) + 1);
}

static int grow(void **a, int32_t *cap, int32_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	int32_t c = *cap ? *cap : 16;
	while (c < need) {
		if (c > INT32_MAX / 2)
			return -1;
		c *= 2;
	}
	void *q = realloc(*a, (size_t)c * size);
	if (!q)
		return -1;
	*a = q;
	*cap = c;
	return 0;
}

static int push_el(struct parser *p, struct vec_el *v, int type, int32_t val)
{
	if (++p->n_elems > NX_GRAMMAR_MAX_ELEMS)
		return perr(p, "the grammar is too large (more than %u elements once repetitions are expanded)",
			    NX_GRAMMAR_MAX_ELEMS);
	if (grow((void **)&v->a, &v->cap, v->n + 1, sizeof(*v->a)))
		return perr(p, "out of memory");
	v->a[v->n++] = (struct elem){ (uint8_t)type, val };
	return 0;
}

static int32_t new_rule(struct parser *p, const char *name, size_t len)
{
	if (grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof(*p->rules)))
		return -1;
	struct prule *r = &p->rules[p->n_rules];
	memset(r, 0, sizeof(*r));
	if (name) {
		r->name = strndup(name, len);
		if (!r->name)
			return -1;
	}
	r->line = p->line;
	r->col = (int)(p->s - p->line_start) + 1;
	return p->n_rules++;
}

static int32_t rule_id(struct parser *p, const char *name, size_t len)
{
	for (int32_t i = 0; i < p->n_rules; i++)
		if (p->rules[i].name && strlen(p->rules[i].name) == len && !memcmp(p->rules[i].name, name, len))
			return i;
	return new_rule(p, name, len);
}

static int cmp_rng(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* A class from rng[first .. n_rng): sorted and merged in place. */
static int32_t end_class(struct parser *p, int32_t first, bool neg)
{
	int32_t n = p->n_rng - first;
	if (n > 1)
		qsort(p->rng + first, (size_t)n, sizeof(*p->rng), cmp_rng);
	int32_t m = 0;
	for (int32_t i = 0; i < n; i++) {
		uint32_t *r = p->rng[first + i];
		if (m > 0 && r[0] <= p->rng[first + m - 1][1] + 1) {
			if (r[1] > p->rng[first + m - 1][1])
				p->rng[first + m - 1][1] = r[1];
		} else {
			p->rng[first + m][0] = r[0];
			p->rng[first + m][1] = r[1];
			m++;
		}
	}
	p->n_rng = first + m;
	if (grow((void **)&p->cls, &p->cap_cls, p->n_cls + 1, sizeof(*p->cls)))
		return -1;
	p->cls[p->n_cls] = (struct cclass){ first, m, neg };
	return p->n_cls++;
}

static int add_range(struct parser *p, uint32_t lo, uint32_t hi)
{
	if (grow((void **)&p->rng, &p->cap_rng, p->n_rng + 1, sizeof(*p->rng)))
		return -1;
	p->rng[p->n_rng][0] = lo;
	p->rng[p->n_rng][1] = hi;
	p->n_rng++;
	return 0;
}

/* One UTF-8 code point of the grammar text; -1 on invalid UTF-8. */
static int64_t utf8_next(struct parser *p)
{
	const unsigned char *s = (const unsigned char *)p->s;
	size_t left = (size_t)(p->end - p->s);
	if (!left)
		return -1;
	unsigned c = s[0];
	int n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
	if (!n || (size_t)n > left)
		return -1;
	uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
	for (int i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return -1;
		cp = cp << 6 | (s[i] & 0x3F);
	}
	static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return -1;
	p->s += n;
	return cp;
}

static int hexval(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A character of a literal or class, escapes decoded; -1 with the error set. */
static int64_t parse_char(struct parser *p)
{
	if (p->s >= p->end)
		return perr(p, "unexpected end of the grammar"), -1;
	if (*p->s != '\\') {
		int64_t c = utf8_next(p);
		if (c < 0)
			return perr(p, "invalid UTF-8"), -1;
		return c;
	}
	p->s++;
	if (p->s >= p->end)
		return perr(p, "unexpected end of the grammar after '\\'"), -1;
	char e = *p->s++;
	switch (e) {
	case 'n': return '\n';
	case 'r': return '\r';
	case 't': return '\t';
	case '\\': case '"': case '[': case ']': case '-': case '/': case '\'': case '^': return e;
	case 'x': case 'u': case 'U': {
		int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
		uint32_t v = 0;
		for (int i = 0; i < n; i++) {
			int h = p->s < p->end ? hexval(*p->s) : -1;
			if (h < 0)
				return perr(p, "escape \\%c needs %d hex digits", e, n), -1;
			v = v << 4 | (uint32_t)h;
			p->s++;
		}
		if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
			return perr(p, "escape \\%c gives U+%X, which is not a Unicode scalar value", e, v), -1;
		return v;
	}
	default:
		p->s--;
		return perr(p, "unknown escape '\\%c'", e), -1;
	}
}

/* Spaces and comments; newlines too when newline_ok. */
static void skip_space(struct parser *p, bool newline_ok)
{
	while (p->s < p->end) {
		char c = *p->s;
		if (c == ' ' || c == '\t') {
			p->s++;
		} else if (c == '#') {
			while (p->s < p->end && *p->s != '\n')
				p->s++;
		} else if (newline_ok && (c == '\n' || c == '\r')) {
			if (c == '\n') {
				p->line++;
				p->line_start = p->s + 1;
			}
			p->s++;
		} else {
			break;
		}
	}
}

static bool is_word(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static size_t name_len(const struct parser *p)
{
	size_t n = 0;
	while (p->s + n < p->end && is_word(p->s[n]))
		n++;
	return n;
}

static int parse_alternates(struct parser *p, int32_t rule, bool nested);

/* Repeats the one element last (the last symbol) min..max times (max -1:
 * unbounded) at the end of v. */
static int repeat(struct parser *p, struct vec_el *v, struct elem last, long min, long max)
{
	for (long i = 0; i < min; i++)
		if (push_el(p, v, last.type, last.v))
			return -1;
	if (max < 0) {
		/* s ::= last s | "" */
		int32_t s = new_rule(p, NULL, 0);
		if (s < 0)
			return perr(p, "out of memory");
		struct vec_el *b = &p->rules[s].body;
		if (push_el(p, b, last.type, last.v) || push_el(p, b, E_REF, s) || push_el(p, b, E_ALT, 0) ||
		    push_el(p, b, E_END, 0))
			return -1;
		p->rules[s].defined = true;
		return push_el(p, v, E_REF, s);
	}
	/* o1 ::= last | "";  ok ::= last o(k-1) | "" */
	int32_t prev = -1;
	for (long k = 0; k < max - min; k++) {
		int32_t o = new_rule(p, NULL, 0);
		if (o < 0)
			return perr(p, "out of memory");
		struct vec_el *b = &p->rules[o].body;
		if (push_el(p, b, last.type, last.v) || (prev >= 0 && push_el(p, b, E_REF, prev)) ||
		    push_el(p, b, E_ALT, 0) || push_el(p, b, E_END, 0))
			return -1;
		p->rules[o].defined = true;
		prev = o;
	}
	return prev >= 0 ? push_el(p, v, E_REF, prev) : 0;
}

static int parse_count(struct parser *p, long *out)
{
	long v = 0;
	size_t n = 0;
	while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
		v = v * 10 + (*p->s++ - '0');
		if (v > NX_GRAMMAR_MAX_REPEAT)
			return perr(p, "repetition count above %d", NX_GRAMMAR_MAX_REPEAT);
		n++;
	}
	*out = n ? v : -1;
	return 0;
}

static int parse_sequence(struct parser *p, struct vec_el *v, bool nested)
{
	int32_t last_start = -1; /* where the last symbol begins in v */
	while (p->s < p->end) {
		char c = *p->s;
		if (c == '"') {
			p->s++;
			last_start = v->n;
			while (p->s < p->end && *p->s != '"') {
				int64_t ch = parse_char(p);
				if (ch < 0)
					return -1;
				int32_t first = p->n_rng;
				if (add_range(p, (uint32_t)ch, (uint32_t)ch))
					return perr(p, "out of memory");
				int32_t k = end_class(p, first, false);
				if (k < 0 || push_el(p, v, E_CHAR, k))
					return k < 0 ? perr(p, "out of memory") : -1;
			}
			if (p->s >= p->end)
				return perr(p, "unterminated literal");
			p->s++;
			if (v->n == last_start)
				last_start = -1; /* "" is nothing to repeat */
		} else if (c == '[') {
			p->s++;
			bool neg = p->s < p->end && *p->s == '^';
			if (neg)
				p->s++;
			int32_t first = p->n_rng;
			while (p->s < p->end && *p->s != ']') {
				int64_t lo = parse_char(p), hi = lo;
				if (lo < 0)
					return -1;
				if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
					p->s++;
					hi = parse_char(p);
					if (hi < 0)
						return -1;
					if (hi < lo)
						return perr(p, "character range U+%X-U+%X is reversed", (unsigned)lo, (unsigned)hi);
				}
				if (add_range(p, (uint32_t)lo, (uint32_t)hi))
					return perr(p, "out of memory");
			}
			if (p->s >= p->end)
				return perr(p, "unterminated character class");
			p->s++;
			if (p->n_rng == first && !neg)
				return perr(p, "empty character class [] matches nothing");
			int32_t k = end_class(p, first, neg);
			if (k < 0)
				return perr(p, "out of memory");
			if (neg && p->cls[k].n == 1 && p->rng[first][0] == 0 && p->rng[first][1] >= 0x10FFFF)
				return perr(p, "character class matches nothing");
			last_start = v->n;
			if (push_el(p, v, E_CHAR, k))
				return -1;
		} else if (c == '.') {
			p->s++;
			int32_t first = p->n_rng;
			if (add_range(p, 0, 0x10FFFF))
				return perr(p, "out of memory");
			int32_t k = end_class(p, first, false);
			if (k < 0)
				return perr(p, "out of memory");
			last_start = v->n;
			if (push_el(p, v, E_CHAR, k))
				return -1;
		} else if (c == '(') {
			p->s++;
			if (++p->depth > 256)
				return perr(p, "groups nested more than 256 deep");
			int32_t g = new_rule(p, NULL, 0);
			if (g < 0)
				return perr(p, "out of memory");
			skip_space(p, true);
			if (parse_alternates(p, g, true))
				return -1;
			p->depth--;
			if (p->s >= p->end || *p->s != ')')
				return perr(p, "expected ')'");
			p->s++;
			p->rules[g].defined = true;
			last_start = v->n;
			if (push_el(p, v, E_REF, g))
				return -1;
		} else if (is_word(c)) {
			size_t n = name_len(p);
			/* the next rule's definition: this one has ended */
			const char *q = p->s + n;
			while (q < p->end && (*q == ' ' || *q == '\t'))
				q++;
			if (q + 2 < p->end && q[0] == ':' && q[1] == ':' && q[2] == '=')
				return perr(p, "rule '%.*s' begins in the middle of another (one rule per line)", (int)n, p->s);
			int32_t r = rule_id(p, p->s, n);
			if (r < 0)
				return perr(p, "out of memory");
			p->s += n;
			last_start = v->n;
			if (push_el(p, v, E_REF, r))
				return -1;
		} else if (c == '*' || c == '+' || c == '?' || c == '{') {
			if (last_start < 0)
				return perr(p, "'%c' has nothing before it to repeat", c);
			long min = 0, max = -1;
			p->s++;
			if (c == '+')
				min = 1;
			else if (c == '?')
				max = 1;
			else if (c == '{') {
				skip_space(p, false);
				if (parse_count(p, &min))
					return -1;
				skip_space(p, false);
				if (p->s < p->end && *p->s == ',') {
					p->s++;
					skip_space(p, false);
					if (parse_count(p, &max))
						return -1;
					if (min < 0)
						min = 0;
				} else {
					if (min < 0)
						return perr(p, "'{' needs a count");
					max = min;
				}
				skip_space(p, false);
				if (p->s >= p->end || *p->s != '}')
					return perr(p, "expected '}'");
				p->s++;
				if (max >= 0 && max < min)
					return perr(p, "repetition {%ld,%ld} has max below min", min, max);
			}
			/* the last symbol as one element: a literal of several characters becomes a rule */
			struct elem last;
			if (v->n - last_start == 1) {
				last = v->a[last_start];
			} else {
				int32_t g = new_rule(p, NULL, 0);
				if (g < 0)
					return perr(p, "out of memory");
				struct vec_el *b = &p->rules[g].body;
				for (int32_t i = last_start; i < v->n; i++)
					if (push_el(p, b, v->a[i].type, v->a[i].v))
						return -1;
				if (push_el(p, b, E_END, 0))
					return -1;
				p->rules[g].defined = true;
				last = (struct elem){ E_REF, g };
			}
			p->n_elems -= (size_t)(v->n - last_start);
			v->n = last_start;
			if (repeat(p, v, last, min, max))
				return -1;
			last_start = -1;
		} else if (c == '<') {
			return perr(p, "token references (<...>) are not supported");
		} else {
			break;
		}
		skip_space(p, nested);
	}
	return 0;
}

/* rule's body: sequences separated by '|', each ended by E_ALT / E_END.
 * rules[] may move while a sequence is parsed (groups add rules), so each
 * sequence is parsed into its own vector first. */
static int parse_alternates(struct parser *p, int32_t rule, bool nested)
{
	for (;;) {
		struct vec_el seq = {0};
		if (parse_sequence(p, &seq, nested)) {
			free(seq.a);
			return -1;
		}
		struct vec_el *b = &p->rules[rule].body;
		if (grow((void **)&b->a, &b->cap, b->n + seq.n + 1, sizeof(*b->a))) {
			free(seq.a);
			return perr(p, "out of memory");
		}
		if (seq.n)
			memcpy(b->a + b->n, seq.a, (size_t)seq.n * sizeof(*b->a));
		b->n += seq.n;
		free(seq.a);
		bool more = p->s < p->end && *p->s == '|';
		if (push_el(p, b, more ? E_ALT : E_END, 0))
			return -1;
		if (!more)
			return 0;
		p->s++;
		skip_space(p, true);
	}
}

static void parser_free(struct parser *p)
{
	for (int32_t i = 0; i < p->n_rules; i++) {
		free(p->rules[i].name);
		free(p->rules[i].body.a);
	}
	free(p->rules);
	free(p->cls);
	free(p->rng);
}

static const char *rule_label(const struct parser *p, int32_t r, char *buf, size_t cap)
{
	if (p->rules[r].name)
		return p->rules[r].name;
	snprintf(buf, cap, "(a group or repetition, generated rule %d)", r);
	return buf;
}

/* Nullable rules (fixpoint), then the rules each one reaches in leftmost
 * position: a cycle there is left recursion, which the matcher cannot
 * expand. */
static int check_rules(struct parser *p)
{
	const int32_t n = p->n_rules;
	bool *nullable = calloc((size_t)n, 1);
	int32_t *depth = malloc((size_t)n * sizeof(*depth));
	int32_t *stack = malloc((size_t)n * 2 * sizeof(*stack));
	if (!nullable || !depth || !stack) {
		free(nullable);
		free(depth);
		free(stack);
		return perr(p, "out of memory");
	}
	for (bool changed = true; changed;) {
		changed = false;
		for (int32_t r = 0; r < n; r++) {
			if (nullable[r])
				continue;
			const struct vec_el *b = &p->rules[r].body;
			bool alt_null = true;
			for (int32_t i = 0; i < b->n; i++) {
				const struct elem e = b->a[i];
				if (e.type == E_ALT || e.type == E_END) {
					if (alt_null) {
						nullable[r] = changed = true;
						break;
					}
					alt_null = true;
				} else if (e.type == E_CHAR || (e.type == E_REF && !nullable[e.v])) {
					alt_null = false;
				}
			}
		}
	}
	/* depth: -2 unvisited, -1 on the DFS path, 0 done */
	for (int32_t r = 0; r < n; r++)
		depth[r] = -2;
	int rc = 0;
	char lb[64];
	for (int32_t r0 = 0; r0 < n && !rc; r0++) {
		if (depth[r0] != -2)
			continue;
		/* iterative DFS: stack of (rule, element index) */
		int32_t sp = 0;
		stack[sp++] = r0;
		stack[sp++] = 0;
		depth[r0] = -1;
		while (sp && !rc) {
			int32_t r = stack[sp - 2], i = stack[sp - 1];
			const struct vec_el *b = &p->rules[r].body;
			/* the next leftmost reference of r from element i on */
			int32_t next = -1;
			while (i < b->n) {
				const struct elem e = b->a[i++];
				if (e.type == E_REF) {
					next = e.v;
					/* what follows is leftmost too only if this is nullable */
					if (!nullable[e.v])
						while (i < b->n && b->a[i].type != E_ALT && b->a[i].type != E_END)
							i++;
					break;
				}
				if (e.type == E_CHAR)
					while (i < b->n && b->a[i].type != E_ALT && b->a[i].type != E_END)
						i++;
			}
			stack[sp - 1] = i;
			if (next < 0) {
				depth[r] = 0; /* done */
				sp -= 2;
				continue;
			}
			if (depth[next] == -1) {
				rc = perr(p, "rule '%s' is left-recursive (it can reach itself before matching a character)",
					  rule_label(p, next, lb, sizeof(lb)));
			} else if (depth[next] == -2) {
				depth[next] = -1;
				stack[sp++] = next;
				stack[sp++] = 0;
			}
		}
	}
	free(nullable);
	free(depth);
	free(stack);
	return rc;
}

int nx_grammar_compile(const char *text, size_t len, struct nx_grammar **out, struct nx_err *err)
{
	*out = NULL;
	struct parser p = { .s = text, .end = text + len, .line_start = text, .line = 1, .err = err };
	if (!text)
		return nx_errf(err, "grammar: no text");
	skip_space(&p, true);
	while (p.s < p.end) {
		size_t n = name_len(&p);
		if (!n) {
			perr(&p, "expected a rule name");
			goto fail;
		}
		int32_t r = rule_id(&p, p.s, n);
		if (r < 0) {
			perr(&p, "out of memory");
			goto fail;
		}
		if (p.rules[r].defined) {
			perr(&p, "rule '%.*s' is defined twice", (int)n, p.s);
			goto fail;
		}
		p.s += n;
		skip_space(&p, false);
		if (p.end - p.s < 3 || memcmp(p.s, "::=", 3)) {
			perr(&p, "expected '::=' after rule name '%s'", p.rules[r].name);
			goto fail;
		}
		p.s += 3;
		skip_space(&p, true);
		p.rules[r].defined = true;
		if (parse_alternates(&p, r, false))
			goto fail;
		if (p.s < p.end && *p.s != '\n' && *p.s != '\r') {
			if (*p.s == ')')
				perr(&p, "unmatched ')'");
			else
				perr(&p, "unexpected '%c'", *p.s);
			goto fail;
		}
		skip_space(&p, true);
	}
	int32_t root = -1;
	for (int32_t i = 0; i < p.n_rules; i++) {
		if (!p.rules[i].defined) {
			nx_errf(err, "grammar: rule '%s' is used at %d:%d but not defined", p.rules[i].name, p.rules[i].line,
				p.rules[i].col);
			goto fail;
		}
		if (p.rules[i].name && !strcmp(p.rules[i].name, "root"))
			root = i;
	}
	if (root < 0) {
		nx_errf(err, "grammar: no rule 'root' (where the grammar starts)");
		goto fail;
	}
	if (check_rules(&p))
		goto fail;

	struct nx_grammar *g = calloc(1, sizeof(*g));
	if (!g) {
		nx_errf(err, "grammar: out of memory");
		goto fail;
	}
	size_t total = 0;
	for (int32_t i = 0; i < p.n_rules; i++)
		total += (size_t)p.rules[i].body.n;
	g->el = malloc((total + 1) * sizeof(*g->el));
	g->rule_start = malloc((size_t)p.n_rules * sizeof(*g->rule_start));
	if (!g->el || !g->rule_start) {
		nx_grammar_free(g);
		nx_errf(err, "grammar: out of memory");
		goto fail;
	}
	int32_t k = 0;
	for (int32_t i = 0; i < p.n_rules; i++) {
		g->rule_start[i] = k;
		memcpy(g->el + k, p.rules[i].body.a, (size_t)p.rules[i].body.n * sizeof(*g->el));
		k += p.rules[i].body.n;
	}
	g->el[k] = (struct elem){ E_END, 0 };
	g->n_el = k;
	g->n_rules = p.n_rules;
	g->root = root;
	g->cls = p.cls;
	g->n_cls = p.n_cls;
	g->rng = p.rng;
	g->n_rng = p.n_rng;
	p.cls = NULL;
	p.rng = NULL;
	parser_free(&p);
	*out = g;
	return 0;
fail:
	parser_free(&p);
	return -1;
}

/* ------------------------------------------------------------ vocabulary trie */

/* Nodes in preorder: node i's subtree is i .. end[i) and its byte is the
 * last of its prefix, so a walk goes down the array and jumps over a dead
 * subtree in one step. */
struct nx_vocab_trie {
	int n_vocab;
	int32_t n_nodes, max_depth;
	uint8_t *byte;
	int32_t *depth, *end, *tok_first;
	int32_t *tok_next;  /* (n_vocab) further tokens with the same piece */
	const char **piece; /* (n_vocab) the bytes a token stands for; NULL: never allowed as text */
	size_t *piece_len;
	bool *is_eog;       /* (n_vocab) */
	int32_t *eog;       /* end-of-generation ids */
	int n_eog;
};

static const struct nx_vocab_trie *sort_trie;

static int cmp_piece(const void *a, const void *b)
{
	const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	const size_t la = sort_trie->piece_len[x], lb = sort_trie->piece_len[y];
	int c = memcmp(sort_trie->piece[x], sort_trie->piece[y], la < lb ? la : lb);
	if (c)
		return c;
	if (la != lb)
		return la < lb ? -1 : 1;
	return x < y ? -1 : 1;
}

void nx_vocab_trie_free(struct nx_vocab_trie *t)
{
	if (!t)
		return;
	free(t->byte);
	free(t->depth);
	free(t->end);
	free(t->tok_first);
	free(t->tok_next);
	free(t->piece);
	free(t->piece_len);
	free(t->is_eog);
	free(t->eog);
	free(t);
}

int nx_vocab_trie_n_vocab(const struct nx_vocab_trie *t)
{
	return t->n_vocab;
}

static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

int nx_vocab_trie_from_pieces(int n, const char *const *pieces, const size_t *lens, const bool *is_eog,
			      struct nx_vocab_trie **out, struct nx_err *err)
{
	*out = NULL;
	struct nx_vocab_trie *t = calloc(1, sizeof(*t));
	int32_t *ids = malloc(((size_t)n + 1) * sizeof(*ids));
	int32_t *open = NULL;
	size_t cap = 1, maxp = 0;
	int32_t n_ids = 0;
	if (!t || !ids || n <= 0)
		goto oom;
	t->n_vocab = n;
	t->tok_next = malloc((size_t)n * sizeof(*t->tok_next));
	t->eog = malloc((size_t)n * sizeof(*t->eog));
	t->piece = calloc((size_t)n, sizeof(*t->piece));
	t->piece_len = calloc((size_t)n, sizeof(*t->piece_len));
	t->is_eog = calloc((size_t)n, sizeof(*t->is_eog));
	if (!t->tok_next || !t->eog || !t->piece || !t->piece_len || !t->is_eog)
		goto oom;
	for (int32_t i = 0; i < n; i++) {
		t->tok_next[i] = -1;
		if (is_eog && is_eog[i]) {
			t->is_eog[i] = true;
			t->eog[t->n_eog++] = i;
			continue;
		}
		if (!pieces[i] || lens[i] == 0 || lens[i] > (1u << 20))
			continue;
		t->piece[i] = pieces[i];
		t->piece_len[i] = lens[i];
		ids[n_ids++] = i;
		cap += lens[i];
		maxp = lens[i] > maxp ? lens[i] : maxp;
	}
	pthread_mutex_lock(&sort_lock); /* qsort has no context argument */
	sort_trie = t;
	qsort(ids, (size_t)n_ids, sizeof(*ids), cmp_piece);
	pthread_mutex_unlock(&sort_lock);
	if (cap > INT32_MAX)
		goto oom;
	t->byte = malloc(cap);
	t->depth = malloc(cap * sizeof(int32_t));
	t->end = malloc(cap * sizeof(int32_t));
	t->tok_first = malloc(cap * sizeof(int32_t));
	open = malloc((maxp + 1) * sizeof(*open));
	if (!t->byte || !t->depth || !t->end || !t->tok_first || !open)
		goto oom;
	int32_t nn = 1, cur = 0; /* node 0: the root, depth 0 */
	t->byte[0] = 0;
	t->depth[0] = 0;
	t->tok_first[0] = -1;
	open[0] = 0;
	const char *prev = NULL;
	size_t prev_len = 0;
	int32_t last_node = -1;
	for (int32_t k = 0; k < n_ids; k++) {
		const char *s = t->piece[ids[k]];
		const size_t len = t->piece_len[ids[k]];
		size_t l = 0;
		while (prev && l < len && l < prev_len && s[l] == prev[l])
			l++;
		if (prev && l == len && len == prev_len) {
			/* the same piece as the one before: chain it */
			int32_t j = t->tok_first[last_node];
			while (t->tok_next[j] >= 0)
				j = t->tok_next[j];
			t->tok_next[j] = ids[k];
			continue;
		}
		for (; cur > (int32_t)l; cur--)
			t->end[open[cur]] = nn;
		for (size_t dd = l + 1; dd <= len; dd++) {
			t->byte[nn] = (uint8_t)s[dd - 1];
			t->depth[nn] = (int32_t)dd;
			t->tok_first[nn] = -1;
			open[dd] = nn;
			nn++;
		}
		cur = (int32_t)len;
		last_node = open[len];
		t->tok_first[last_node] = ids[k];
		prev = s;
		prev_len = len;
	}
	for (; cur >= 0; cur--)
		t->end[open[cur]] = nn;
	t->max_depth = (int32_t)maxp;
	t->n_nodes = nn;
	free(open);
	free(ids);
	*out = t;
	return 0;
oom:
	free(open);
	free(ids);
	nx_vocab_trie_free(t);
	return nx_errf(err, "grammar: out of memory for the vocabulary trie of %d tokens", n);
}

int nx_vocab_trie_build(const struct nx_tok *tok, int n_logits, struct nx_vocab_trie **out, struct nx_err *err)
{
	const int nt = nx_tok_n_vocab(tok), n = n_logits > nt ? n_logits : nt;
	const char **pieces = calloc((size_t)n + 1, sizeof(*pieces));
	size_t *lens = calloc((size_t)n + 1, sizeof(*lens));
	bool *eog = calloc((size_t)n + 1, sizeof(*eog));
	int rc;
	if (!pieces || !lens || !eog) {
		rc = nx_errf(err, "grammar: out of memory for the vocabulary trie of %d tokens", n);
	} else {
		for (int32_t i = 0; i < nt; i++) {
			eog[i] = nx_tok_is_eog(tok, i);
			if (!eog[i] && !nx_tok_is_control(tok, i))
				pieces[i] = nx_tok_piece(tok, i, false, &lens[i]);
		}
		rc = nx_vocab_trie_from_pieces(n, pieces, lens, eog, out, err);
	}
	free(pieces);
	free(lens);
	free(eog);
	return rc;
}

/* ------------------------------------------------------------ the matcher */

#define FRAME_EMPTY 0           /* the empty stack: the grammar may end here */
#define MAX_EXPAND_DEPTH 4096   /* rule references expanded inside one another */
#define MAX_SET 65536           /* stacks in one state */
#define EXPAND_BUDGET (1 << 20) /* expansion calls for one character: an ambiguous grammar's paths are bounded */
#define MASK_CACHE 32           /* masks kept, by state */
/* Past these between two tokens the tables are flushed (the current state kept). */
#define FLUSH_FRAMES (1 << 18)
#define FLUSH_STATES (1 << 16)
#define FLUSH_TRANS (1 << 19)
#define FLUSH_POOL (1 << 21)

struct frame {
	int32_t pos, parent;
};

struct gset {
	int64_t off;
	int32_t n;
	uint32_t h;
};

struct gstate {
	int32_t set;
	uint32_t part;   /* an unfinished UTF-8 sequence: its bytes, the first lowest */
	uint8_t n_part, need;
};

struct mask_ent {
	int32_t state;
	int n_allowed;
	uint64_t *bits;
};

struct nx_gmatch {
	struct nx_grammar *g;
	const struct nx_vocab_trie *t;
	int32_t *alt_off, *alt_pos; /* rule r's alternatives begin at alt_pos[alt_off[r] .. alt_off[r + 1]) */
	struct frame *fr;
	int32_t n_fr, cap_fr;
	int32_t *fr_tab;
	uint32_t fr_cap;
	int32_t *pool;
	int64_t n_pool, cap_pool;
	struct gset *sets;
	int32_t n_sets, cap_sets;
	int32_t *set_tab;
	uint32_t set_cap;
	struct gstate *st;
	int32_t n_st, cap_st;
	int32_t *st_tab;
	uint32_t st_cap;
	uint64_t *tr_key;   /* (state << 8 | byte) + 1; 0 empty */
	int32_t *tr_val;    /* next state, -1 dead */
	size_t n_tr, tr_cap;
	int32_t *buf;       /* expansion output */
	int32_t n_buf, cap_buf;
	int32_t *walk;      /* (max_depth + 1) states of the trie walk */
	int32_t cur;
	int32_t budget;     /* expand calls left for the character being matched */
	bool overflow, oom;
	struct mask_ent mc[MASK_CACHE];
	int mc_next;
	int words;
	struct nx_gmatch_stats stats;
};

static inline uint32_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return (uint32_t)x;
}

/* Open-addressed tables of ids (-1 empty), doubled at half load. */
static int tab_grow(int32_t **tab, uint32_t *cap, int32_t n, uint32_t (*hash)(const struct nx_gmatch *, int32_t),
		    const struct nx_gmatch *m)
{
	if ((uint32_t)n * 2 < *cap)
		return 0;
	uint32_t nc = *cap ? *cap * 2 : 1024;
	int32_t *t = malloc((size_t)nc * sizeof(*t));
	if (!t)
		return -1;
	memset(t, 0xff, (size_t)nc * sizeof(*t));
	for (int32_t id = 0; id < n; id++) {
		uint32_t i = hash(m, id) & (nc - 1);
		while (t[i] >= 0)
			i = (i + 1) & (nc - 1);
		t[i] = id;
	}
	free(*tab);
	*tab = t;
	*cap = nc;
	return 0;
}

static uint32_t fr_hash(const struct nx_gmatch *m, int32_t id)
{
	return mix((uint64_t)(uint32_t)m->fr[id].pos << 32 | (uint32_t)m->fr[id].parent);
}

static uint32_t set_hash(const struct nx_gmatch *m, int32_t id)
{
	return m->sets[id].h;
}

static uint32_t st_hash_of(const struct gstate *s)
{
	return mix((uint64_t)(uint32_t)s->set << 32 ^ (uint64_t)s->part << 3 ^ (uint64_t)s->n_part << 1 ^
		   (uint64_t)s->need << 40);
}

static uint32_t st_hash(const struct nx_gmatch *m, int32_t id)
{
	return st_hash_of(&m->st[id]);
}

static int32_t intern_frame(struct nx_gmatch *m, int32_t pos, int32_t parent)
{
	if (tab_grow(&m->fr_tab, &m->fr_cap, m->n_fr, fr_hash, m) ||
	    grow((void **)&m->fr, &m->cap_fr, m->n_fr + 1, sizeof(*m->fr))) {
		m->oom = true;
		return FRAME_EMPTY;
	}
	uint32_t i = mix((uint64_t)(uint32_t)pos << 32 | (uint32_t)parent) & (m->fr_cap - 1);
	for (; m->fr_tab[i] >= 0; i = (i + 1) & (m->fr_cap - 1)) {
		const struct frame *f = &m->fr[m->fr_tab[i]];
		if (f->pos == pos && f->parent == parent)
			return m->fr_tab[i];
	}
	m->fr[m->n_fr] = (struct frame){ pos, parent };
	m->fr_tab[i] = m->n_fr;
	return m->n_fr++;
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return x < y ? -1 : x > y;
}

/* The set of m->buf[0 .. n_buf) (sorted, deduplicated here); -1 on failure. */
static int32_t intern_buf(struct nx_gmatch *m)
{
	qsort(m->buf, (size_t)m->n_buf, sizeof(*m->buf), cmp_i32);
	int32_t n = 0;
	for (int32_t i = 0; i < m->n_buf; i++)
		if (n == 0 || m->buf[i] != m->buf[n - 1])
			m->buf[n++] = m->buf[i];
	uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(n + 1);
	for (int32_t i = 0; i < n; i++)
		h = (h ^ (uint32_t)m->buf[i]) * 0x100000001b3ull;
	const uint32_t hh = mix(h);
	if (tab_grow(&m->set_tab, &m->set_cap, m->n_sets, set_hash, m) ||
	    grow((void **)&m->sets, &m->cap_sets, m->n_sets + 1, sizeof(*m->sets))) {
		m->oom = true;
		return -1;
	}
	uint32_t i = hh & (m->set_cap - 1);
	for (; m->set_tab[i] >= 0; i = (i + 1) & (m->set_cap - 1)) {
		const struct gset *s = &m->sets[m->set_tab[i]];
		if (s->h == hh && s->n == n && !memcmp(m->pool + s->off, m->buf, (size_t)n * sizeof(int32_t)))
			return m->set_tab[i];
	}
	if (m->n_pool + n > m->cap_pool) {
		int64_t c = m->cap_pool ? m->cap_pool : 4096;
		while (c < m->n_pool + n)
			c *= 2;
		int32_t *q = realloc(m->pool, (size_t)c * sizeof(*q));
		if (!q) {
			m->oom = true;
			return -1;
		}
		m->pool = q;
		m->cap_pool = c;
	}
	memcpy(m->pool + m->n_pool, m->buf, (size_t)n * sizeof(int32_t));
	m->sets[m->n_sets] = (struct gset){ m->n_pool, n, hh };
	m->n_pool += n;
	m->set_tab[i] = m->n_sets;
	return m->n_sets++;
}

static int32_t intern_state(struct nx_gmatch *m, struct gstate s)
{
	if (tab_grow(&m->st_tab, &m->st_cap, m->n_st, st_hash, m) ||
	    grow((void **)&m->st, &m->cap_st, m->n_st + 1, sizeof(*m->st))) {
		m->oom = true;
		return -1;
	}
	uint32_t i = st_hash_of(&s) & (m->st_cap - 1);
	for (; m->st_tab[i] >= 0; i = (i + 1) & (m->st_cap - 1)) {
		const struct gstate *o = &m->st[m->st_tab[i]];
		if (o->set == s.set && o->part == s.part && o->n_part == s.n_part && o->need == s.need)
			return m->st_tab[i];
	}
	m->st[m->n_st] = s;
	m->st_tab[i] = m->n_st;
	m->stats.states++;
	return m->n_st++;
}

static void buf_push(struct nx_gmatch *m, int32_t f)
{
	if (m->n_buf >= MAX_SET) {
		m->overflow = true;
		return;
	}
	if (grow((void **)&m->buf, &m->cap_buf, m->n_buf + 1, sizeof(*m->buf))) {
		m->oom = true;
		return;
	}
	m->buf[m->n_buf++] = f;
}

/* The stacks that continue at pos under parent, each down to its next
 * character, into buf. */
static void expand(struct nx_gmatch *m, int32_t pos, int32_t parent, int depth)
{
	if (depth > MAX_EXPAND_DEPTH || --m->budget < 0) {
		m->overflow = true;
		return;
	}
	const struct elem *el = m->g->el;
	switch (el[pos].type) {
	case E_CHAR:
		buf_push(m, intern_frame(m, pos, parent));
		return;
	case E_END:
	case E_ALT:
		if (parent == FRAME_EMPTY) {
			buf_push(m, FRAME_EMPTY);
		} else {
			const struct frame f = m->fr[parent];
			expand(m, f.pos, f.parent, depth + 1);
		}
		return;
	case E_REF: {
		/* a reference that ends its alternative pushes nothing */
		int32_t ret = parent;
		if (el[pos + 1].type == E_CHAR || el[pos + 1].type == E_REF)
			ret = intern_frame(m, pos + 1, parent);
		const int32_t r = el[pos].v;
		for (int32_t a = m->alt_off[r]; a < m->alt_off[r + 1] && !m->overflow && !m->oom; a++)
			expand(m, m->alt_pos[a], ret, depth + 1);
		return;
	}
	}
}

static bool cls_meets(const struct nx_grammar *g, int32_t c, uint32_t lo, uint32_t hi)
{
	const struct cclass *k = &g->cls[c];
	if (k->n == 0)
		return k->neg; /* [^] is any character */
	const uint32_t(*r)[2] = g->rng + k->first;
	if (!k->neg) {
		for (int32_t i = 0; i < k->n; i++)
			if (r[i][0] <= hi && r[i][1] >= lo)
				return true;
		return false;
	}
	for (int32_t i = 0; i < k->n; i++)
		if (r[i][0] <= lo && r[i][1] >= hi)
			return false; /* every code point of lo..hi is excluded */
	return true;
}

/* The set after code point cp; -1: no stack takes it. */
static int32_t advance(struct nx_gmatch *m, int32_t set, uint32_t cp)
{
	const struct gset s = m->sets[set];
	m->n_buf = 0;
	m->budget = EXPAND_BUDGET;
	for (int32_t i = 0; i < s.n; i++) {
		const int32_t f = m->pool[s.off + i];
		if (f == FRAME_EMPTY)
			continue;
		const struct frame fr = m->fr[f];
		if (cls_meets(m->g, m->g->el[fr.pos].v, cp, cp))
			expand(m, fr.pos + 1, fr.parent, 0);
		if (m->overflow || m->oom)
			return -1;
	}
	if (m->n_buf == 0)
		return -1;
	return intern_buf(m);
}

/* Some stack takes a code point of lo..hi (an unfinished sequence). */
static bool viable(struct nx_gmatch *m, int32_t set, uint32_t lo, uint32_t hi)
{
	const struct gset s = m->sets[set];
	for (int32_t i = 0; i < s.n; i++) {
		const int32_t f = m->pool[s.off + i];
		if (f != FRAME_EMPTY && cls_meets(m->g, m->g->el[m->fr[f].pos].v, lo, hi))
			return true;
	}
	return false;
}

/* The state after byte b, computed. */
static int32_t step_slow(struct nx_gmatch *m, int32_t sid, uint8_t b)
{
	const struct gstate s = m->st[sid];
	struct gstate n = { s.set, 0, 0, 0 };
	if (s.need == 0) {
		if (b < 0x80) {
			n.set = advance(m, s.set, b);
			return n.set < 0 ? -1 : intern_state(m, n);
		}
		int need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
		if (!need)
			return -1;
		n.part = b;
		n.n_part = 1;
		n.need = (uint8_t)need;
	} else {
		if ((b & 0xC0) != 0x80)
			return -1;
		n = s;
		n.part |= (uint32_t)b << (8 * n.n_part);
		n.n_part++;
	}
	/* the code points the bytes so far can still become */
	uint32_t cp = (n.part & 0xFF) & (0xFF >> (n.need + 1));
	for (int i = 1; i < n.n_part; i++)
		cp = cp << 6 | ((n.part >> (8 * i)) & 0x3F);
	const int rest = n.need - n.n_part;
	uint32_t lo = cp << (6 * rest), hi = lo | ((1u << (6 * rest)) - 1);
	static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	if (lo < min[n.need])
		lo = min[n.need];
	if (hi > 0x10FFFF)
		hi = 0x10FFFF;
	if (lo > hi)
		return -1;
	if (rest == 0) {
		if (lo >= 0xD800 && lo <= 0xDFFF)
			return -1;
		struct gstate c = { advance(m, s.set, lo), 0, 0, 0 };
		return c.set < 0 ? -1 : intern_state(m, c);
	}
	if (!viable(m, s.set, lo, hi))
		return -1;
	return intern_state(m, n);
}

static int tr_grow(struct nx_gmatch *m)
{
	if ((m->n_tr + 1) * 2 < m->tr_cap)
		return 0;
	size_t nc = m->tr_cap ? m->tr_cap * 2 : 4096;
	uint64_t *k = calloc(nc, sizeof(*k));
	int32_t *v = malloc(nc * sizeof(*v));
	if (!k || !v) {
		free(k);
		free(v);
		return -1;
	}
	for (size_t i = 0; i < m->tr_cap; i++)
		if (m->tr_key[i]) {
			size_t j = mix(m->tr_key[i]) & (nc - 1);
			while (k[j])
				j = (j + 1) & (nc - 1);
			k[j] = m->tr_key[i];
			v[j] = m->tr_val[i];
		}
	free(m->tr_key);
	free(m->tr_val);
	m->tr_key = k;
	m->tr_val = v;
	m->tr_cap = nc;
	return 0;
}

/* The state after byte b, from the cache when it has been computed; -1 dead
 * (or a failure: m->oom / m->overflow). */
static inline int32_t step(struct nx_gmatch *m, int32_t sid, uint8_t b)
{
	const uint64_t key = ((uint64_t)(uint32_t)sid << 8 | b) + 1;
	size_t i = m->tr_cap ? mix(key) & (m->tr_cap - 1) : 0;
	if (m->tr_cap)
		for (; m->tr_key[i]; i = (i + 1) & (m->tr_cap - 1))
			if (m->tr_key[i] == key)
				return m->tr_val[i];
	const int32_t nsid = step_slow(m, sid, b);
	if (m->oom || m->overflow)
		return -1;
	if (tr_grow(m)) {
		m->oom = true;
		return -1;
	}
	i = mix(key) & (m->tr_cap - 1);
	while (m->tr_key[i])
		i = (i + 1) & (m->tr_cap - 1);
	m->tr_key[i] = key;
	m->tr_val[i] = nsid;
	m->n_tr++;
	return nsid;
}

static void reset_tables(struct nx_gmatch *m)
{
	m->n_fr = 1; /* FRAME_EMPTY */
	m->fr[0] = (struct frame){ -1, -1 };
	if (m->fr_tab)
		memset(m->fr_tab, 0xff, (size_t)m->fr_cap * sizeof(*m->fr_tab));
	m->n_pool = 0;
	m->n_sets = 0;
	if (m->set_tab)
		memset(m->set_tab, 0xff, (size_t)m->set_cap * sizeof(*m->set_tab));
	m->n_st = 0;
	if (m->st_tab)
		memset(m->st_tab, 0xff, (size_t)m->st_cap * sizeof(*m->st_tab));
	m->n_tr = 0;
	if (m->tr_key)
		memset(m->tr_key, 0, m->tr_cap * sizeof(*m->tr_key));
	for (int i = 0; i < MASK_CACHE; i++)
		m->mc[i].state = -1;
}

/* Past the bounds: everything but the current state is forgotten. */
static int flush(struct nx_gmatch *m)
{
	const struct gstate cur = m->st[m->cur];
	const struct gset s = m->sets[cur.set];
	/* the stacks as position lists, bottom last: n, positions... per stack */
	size_t cap = 16, n = 0;
	int32_t *save = malloc(cap * sizeof(*save));
	if (!save)
		return -1;
	for (int32_t i = 0; i < s.n; i++) {
		int32_t f = m->pool[s.off + i], len = 0;
		for (int32_t g = f; g != FRAME_EMPTY; g = m->fr[g].parent)
			len++;
		if (n + (size_t)len + 1 > cap) {
			while (n + (size_t)len + 1 > cap)
				cap *= 2;
			int32_t *q = realloc(save, cap * sizeof(*q));
			if (!q) {
				free(save);
				return -1;
			}
			save = q;
		}
		save[n++] = len;
		for (int32_t g = f; g != FRAME_EMPTY; g = m->fr[g].parent)
			save[n++] = m->fr[g].pos;
	}
	reset_tables(m);
	m->n_buf = 0;
	for (size_t k = 0; k < n;) {
		int32_t len = save[k++], f = FRAME_EMPTY;
		for (int32_t j = len - 1; j >= 0; j--)
			f = intern_frame(m, save[k + j], f);
		k += (size_t)len;
		buf_push(m, f);
	}
	free(save);
	struct gstate ns = cur;
	ns.set = intern_buf(m);
	if (m->oom || ns.set < 0)
		return -1;
	m->cur = intern_state(m, ns);
	m->stats.flushes++;
	return m->cur < 0 ? -1 : 0;
}

void nx_gmatch_free(struct nx_gmatch *m)
{
	if (!m)
		return;
	nx_grammar_free(m->g);
	free(m->alt_off);
	free(m->alt_pos);
	free(m->fr);
	free(m->fr_tab);
	free(m->pool);
	free(m->sets);
	free(m->set_tab);
	free(m->st);
	free(m->st_tab);
	free(m->tr_key);
	free(m->tr_val);
	free(m->buf);
	free(m->walk);
	for (int i = 0; i < MASK_CACHE; i++)
		free(m->mc[i].bits);
	free(m);
}

int nx_gmatch_new(struct nx_grammar *g, const struct nx_vocab_trie *t, struct nx_gmatch **out, struct nx_err *err)
{
	*out = NULL;
	struct nx_gmatch *m = calloc(1, sizeof(*m));
	if (!m) {
		nx_grammar_free(g);
		return nx_errf(err, "grammar: out of memory");
	}
	m->g = g;
	m->t = t;
	m->words = (t->n_vocab + 63) / 64;
	m->alt_off = malloc(((size_t)g->n_rules + 1) * sizeof(int32_t));
	m->alt_pos = malloc(((size_t)g->n_el + 1) * sizeof(int32_t));
	m->walk = malloc(((size_t)t->max_depth + 1) * sizeof(int32_t));
	if (!m->alt_off || !m->alt_pos || !m->walk ||
	    grow((void **)&m->fr, &m->cap_fr, 1, sizeof(*m->fr)))
		goto oom;
	int32_t k = 0;
	for (int32_t r = 0; r < g->n_rules; r++) {
		m->alt_off[r] = k;
		int32_t p = g->rule_start[r];
		m->alt_pos[k++] = p;
		for (; g->el[p].type != E_END; p++)
			if (g->el[p].type == E_ALT)
				m->alt_pos[k++] = p + 1;
	}
	m->alt_off[g->n_rules] = k;
	reset_tables(m);
	m->n_buf = 0;
	m->budget = EXPAND_BUDGET;
	for (int32_t a = m->alt_off[g->root]; a < m->alt_off[g->root + 1]; a++)
		expand(m, m->alt_pos[a], FRAME_EMPTY, 0);
	if (m->overflow) {
		nx_gmatch_free(m);
		return nx_errf(err, "grammar: the start of the grammar expands to more than %d stacks, or nests rules more "
				    "than %d deep (an ambiguous grammar)", MAX_SET, MAX_EXPAND_DEPTH);
	}
	struct gstate s0 = { intern_buf(m), 0, 0, 0 };
	if (m->oom || s0.set < 0 || (m->cur = intern_state(m, s0)) < 0)
		goto oom;
	*out = m;
	return 0;
oom:
	nx_gmatch_free(m);
	return nx_errf(err, "grammar: out of memory for the matcher");
}

static bool state_accepting(const struct nx_gmatch *m, int32_t sid)
{
	const struct gstate s = m->st[sid];
	const struct gset set = m->sets[s.set];
	return s.need == 0 && set.n > 0 && m->pool[set.off] == FRAME_EMPTY;
}

int nx_gmatch_peek_tokens(struct nx_gmatch *m, const int32_t *ids, int n)
{
	const struct nx_vocab_trie *t = m->t;
	int32_t cur = m->cur;
	for (int k = 0; k < n; k++) {
		const int32_t id = ids[k];
		if (id < 0 || id >= t->n_vocab)
			return k;
		if (t->is_eog[id])
			return state_accepting(m, cur) ? k + 1 : k; /* nothing follows an end */
		if (!t->piece[id])
			return k;
		int32_t s = cur;
		for (size_t i = 0; i < t->piece_len[id] && s >= 0; i++)
			s = step(m, s, (uint8_t)t->piece[id][i]);
		if (s < 0)
			return k;
		cur = s;
	}
	return n;
}

bool nx_gmatch_accepting(const struct nx_gmatch *m)
{
	const struct gstate s = m->st[m->cur];
	const struct gset set = m->sets[s.set];
	return s.need == 0 && set.n > 0 && m->pool[set.off] == FRAME_EMPTY;
}

static int fail_state(struct nx_gmatch *m, struct nx_err *err)
{
	if (m->overflow)
		return nx_errf(err, "grammar: a state of the grammar holds more than %d stacks, nests rules more than "
				    "%d deep or has more than %d ways to reach them (an ambiguous grammar)", MAX_SET,
			       MAX_EXPAND_DEPTH, EXPAND_BUDGET);
	return nx_errf(err, "grammar: out of memory for the matcher");
}

const uint64_t *nx_gmatch_mask(struct nx_gmatch *m, int *n_allowed, struct nx_err *err)
{
	for (int i = 0; i < MASK_CACHE; i++)
		if (m->mc[i].state == m->cur) {
			m->stats.mask_hits++;
			*n_allowed = m->mc[i].n_allowed;
			return m->mc[i].bits;
		}
	struct mask_ent *e = &m->mc[m->mc_next];
	m->mc_next = (m->mc_next + 1) % MASK_CACHE;
	e->state = -1;
	if (!e->bits && !(e->bits = malloc((size_t)m->words * sizeof(uint64_t)))) {
		nx_errf(err, "grammar: out of memory for a token mask");
		return NULL;
	}
	uint64_t *bits = e->bits;
	memset(bits, 0, (size_t)m->words * sizeof(uint64_t));
	const struct nx_vocab_trie *t = m->t;
	int n = 0;
	int32_t *walk = m->walk;
	walk[0] = m->cur;
	for (int32_t i = 1; i < t->n_nodes; i++) {
		const int32_t s = step(m, walk[t->depth[i] - 1], t->byte[i]);
		if (s < 0) {
			if (m->oom || m->overflow) {
				fail_state(m, err);
				return NULL;
			}
			i = t->end[i] - 1; /* the whole subtree is dead */
			continue;
		}
		walk[t->depth[i]] = s;
		for (int32_t id = t->tok_first[i]; id >= 0; id = t->tok_next[id]) {
			bits[id >> 6] |= 1ull << (id & 63);
			n++;
		}
	}
	if (nx_gmatch_accepting(m))
		for (int i = 0; i < t->n_eog; i++) {
			bits[t->eog[i] >> 6] |= 1ull << (t->eog[i] & 63);
			n++;
		}
	m->stats.walks++;
	e->state = m->cur;
	e->n_allowed = n;
	*n_allowed = n;
	return bits;
}

static int move_bytes(struct nx_gmatch *m, const char *s, size_t len)
{
	int32_t cur = m->cur;
	for (size_t i = 0; i < len; i++) {
		cur = step(m, cur, (uint8_t)s[i]);
		if (cur < 0)
			return -1;
	}
	m->cur = cur;
	if (m->n_fr > FLUSH_FRAMES || m->n_st > FLUSH_STATES || m->n_tr > FLUSH_TRANS || m->n_pool > FLUSH_POOL)
		return flush(m);
	return 0;
}

int nx_gmatch_accept_bytes(struct nx_gmatch *m, const char *s, size_t len)
{
	return move_bytes(m, s, len);
}

int nx_gmatch_accept_token(struct nx_gmatch *m, int32_t id)
{
	const struct nx_vocab_trie *t = m->t;
	if (id < 0 || id >= t->n_vocab)
		return -1;
	if (t->is_eog[id])
		return nx_gmatch_accepting(m) ? 0 : -1;
	if (!t->piece[id])
		return -1;
	return move_bytes(m, t->piece[id], t->piece_len[id]);
}

void nx_gmatch_stats(const struct nx_gmatch *m, struct nx_gmatch_stats *st)
{
	*st = m->stats;
}

/* ------------------------------------------------------------ JSON */

/* JSON as RFC 8259 has it, less what jansson refuses to read (it reads the
 * tool calls a grammar forces, and clients in C read the rest): \u escapes
 * of a lone surrogate or of U+0000. */
const char *nx_grammar_json_gbnf(void)
{
	return "root ::= value\n"
	       "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
	       "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
	       "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
	       "string ::= \"\\\"\" char* \"\\\"\"\n"
	       "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [1-9a-cA-CeEfF] hex hex hex | [dD] [0-7] hex hex | \"0\" hex3-not-000 ) )\n"
	       "hex3-not-000 ::= [1-9a-fA-F] hex hex | \"0\" ( [1-9a-fA-F] hex | \"0\" [1-9a-fA-F] )\n"
	       "hex ::= [0-9a-fA-F]\n"
	       "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
	       "ws ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n";
}
