/* chat.c - chat template detection, default system prompt extraction and rendering (see chat.h). */
#include "tok/chat.h"
#include "tok/chat_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool has_literal(const char *jinja, const char *want);
static int phi3_variant(const char *jinja);

/* ChatML with Qwen3's handling of "<think>"; other "<think>" handling (a
 * generation prompt that opens "<think>" itself: QwQ, Qwen3's thinking-only
 * releases) is not guessed at. */
static enum nx_chat_tmpl detect_chatml(const char *jinja)
{
	if (strstr(jinja, "<|im_sep|>")) /* Phi-4's '<|im_start|>user<|im_sep|>...<|im_end|>': no newlines */
		return NX_CHAT_UNKNOWN;
	if (!strstr(jinja, "<think>"))
		return NX_CHAT_CHATML;
	if (strstr(jinja, "reasoning_content") && strstr(jinja, "last_query_index") &&
	    !has_literal(jinja, "<|im_start|>assistant\n<think>\n"))
		return NX_CHAT_QWEN3;
	return NX_CHAT_UNKNOWN;
}

static bool parse_default_system(const char *jinja, char **out);

#define DS_USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"           /* <｜User｜> */
#define DS_ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>" /* <｜Assistant｜> */
#define DS_BOS "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define DS_EOS "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"

/* Mistral's [INST] templates after v1: told apart by the spacing of their
 * literals and where the system message goes. */
static enum nx_chat_tmpl detect_mistral(const char *jinja)
{
	if (has_literal(jinja, "[SYSTEM_PROMPT] "))
		return NX_CHAT_MISTRAL_V7;
	if (has_literal(jinja, "[SYSTEM_PROMPT]")) {
		char *def = NULL;
		/* a default system prompt nxd cannot evaluate is not guessed at */
		if (strstr(jinja, "default_system_message") && !parse_default_system(jinja, &def))
			return NX_CHAT_UNKNOWN;
		free(def);
		return NX_CHAT_MISTRAL_V7_TEKKEN;
	}
	if (!has_literal(jinja, "[/INST]") || has_literal(jinja, " [/INST]") ||
	    !strstr(jinja, "loop.last and system_message is defined"))
		return NX_CHAT_UNKNOWN;
	if (has_literal(jinja, "[INST] "))
		return NX_CHAT_MISTRAL_V3;
	if (has_literal(jinja, "[INST]"))
		return NX_CHAT_MISTRAL_V3_TEKKEN;
	return NX_CHAT_UNKNOWN;
}

enum nx_chat_tmpl nx_chat_detect(const char *jinja)
{
	if (!jinja || !*jinja)
		return NX_CHAT_RAW;
	if (strstr(jinja, DS_USER) && strstr(jinja, DS_ASSISTANT) && strstr(jinja, "</think>"))
		return NX_CHAT_DEEPSEEK_R1;
	if (strstr(jinja, "<|im_start|>"))
		return detect_chatml(jinja);
	if (strstr(jinja, "<|start_header_id|>"))
		return strstr(jinja, "Cutting Knowledge Date") ? NX_CHAT_LLAMA31 : NX_CHAT_LLAMA3;
	/* Mistral's [INST] templates have no <<SYS>> and put no space or <s> where Llama 2's do */
	if (strstr(jinja, "[INST]") && strstr(jinja, "<<SYS>>"))
		return NX_CHAT_LLAMA2;
	if (strstr(jinja, "[INST]"))
		return detect_mistral(jinja);
	if (phi3_variant(jinja) >= 0)
		return NX_CHAT_PHI3;
	if (strstr(jinja, "<start_of_turn>"))
		return NX_CHAT_GEMMA;
	return NX_CHAT_UNKNOWN;
}

static const char *const tmpl_names[NX_CHAT_N_KNOWN] = {
	[NX_CHAT_RAW] = "raw",
	[NX_CHAT_CHATML] = "chatml",
	[NX_CHAT_LLAMA2] = "llama2",
	[NX_CHAT_LLAMA3] = "llama3",
	[NX_CHAT_LLAMA31] = "llama3.1",
	[NX_CHAT_QWEN3] = "qwen3",
	[NX_CHAT_MISTRAL_V3] = "mistral-v3",
	[NX_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
	[NX_CHAT_MISTRAL_V7] = "mistral-v7",
	[NX_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
	[NX_CHAT_DEEPSEEK_R1] = "deepseek-r1",
	[NX_CHAT_PHI3] = "phi3",
	[NX_CHAT_GEMMA] = "gemma",
};

const char *nx_chat_tmpl_name(enum nx_chat_tmpl t)
{
	if ((unsigned)t < NX_CHAT_N_KNOWN)
		return tmpl_names[t];
	return "unknown";
}

const char *nx_chat_tmpl_names(void)
{
	return "raw, chatml, llama2, llama3, llama3.1, qwen3, mistral-v3, mistral-v3-tekken, mistral-v7, "
	       "mistral-v7-tekken, deepseek-r1, phi3, gemma";
}

int nx_chat_tmpl_parse(const char *name, enum nx_chat_tmpl *out, struct nx_err *err)
{
	for (int i = 0; name && i < NX_CHAT_N_KNOWN; i++) {
		if (strcmp(name, tmpl_names[i]) == 0) {
			*out = (enum nx_chat_tmpl)i;
			return 0;
		}
	}
	return nx_errf(err, "chat: unknown template \"%.64s\"; expected one of %s", name ? name : "(null)",
		       nx_chat_tmpl_names());
}

int nx_chat_template_file(const char *path, char **src, enum nx_chat_tmpl *t, struct nx_err *err)
{
	enum { MAX_TEMPLATE = 1 << 20 };
	*src = NULL;
	FILE *f = fopen(path, "rb");
	if (!f)
		return nx_errf(err, "chat: cannot read the template file %s: %s", path, strerror(errno));
	char *buf = malloc(MAX_TEMPLATE + 1);
	size_t n = buf ? fread(buf, 1, MAX_TEMPLATE + 1, f) : 0;
	bool failed = !buf || ferror(f);
	fclose(f);
	if (failed) {
		free(buf);
		return nx_errf(err, "chat: cannot read the template file %s", path);
	}
	if (n > MAX_TEMPLATE) {
		free(buf);
		return nx_errf(err, "chat: the template file %s is over %d bytes", path, MAX_TEMPLATE);
	}
	if (memchr(buf, '\0', n)) {
		free(buf);
		return nx_errf(err, "chat: the template file %s holds a NUL byte: not a Jinja template", path);
	}
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	buf[n] = '\0';
	*t = nx_chat_detect(buf);
	if (*t == NX_CHAT_RAW) {
		free(buf);
		return nx_errf(err, "chat: the template file %s is empty (for no template, --chat-template raw)", path);
	}
	if (*t == NX_CHAT_UNKNOWN) {
		free(buf);
		return nx_errf(err, "chat: the template in %s is not one nxd can render (it renders %s)", path,
			       nx_chat_tmpl_names());
	}
	*src = buf;
	return 0;
}

/* --- Python str.strip(): the whitespace Jinja's trim and .strip() remove -- */

/* Length of the UTF-8 whitespace character (per Python's str.isspace) at s,
 * or 0. */
static size_t space_at(const unsigned char *s, size_t n)
{
	if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20)))
		return 1;
	if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
		return 2;
	if (n >= 3) {
		uint32_t c = ((uint32_t)s[0] << 16) | ((uint32_t)s[1] << 8) | s[2];
		if (c == 0xe19a80 /* U+1680 */ || (c >= 0xe28080 && c <= 0xe2808a) /* U+2000..200A */ ||
		    c == 0xe280a8 || c == 0xe280a9 /* U+2028, 2029 */ || c == 0xe280af /* U+202F */ ||
		    c == 0xe2819f /* U+205F */ || c == 0xe38080 /* U+3000 */)
			return 3;
	}
	return 0;
}

/* Length of the whitespace character ending at s[n-1], or 0. */
static size_t space_before(const unsigned char *s, size_t n)
{
	for (size_t k = 1; k <= 3 && k <= n; k++)
		if (space_at(s + n - k, k) == k)
			return k;
	return 0;
}

void sb_stripped(struct nx_sbuf *b, const char *s)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t n = strlen(s), k;
	while (n && (k = space_at(u, n))) {
		u += k;
		n -= k;
	}
	while (n && (k = space_before(u, n)))
		n -= k;
	nx_sb_put(b, (const char *)u, n);
}

/* --- string literals of the Jinja source --------------------------------- */

static void put_utf8(char **o, uint32_t c)
{
	unsigned char *p = (unsigned char *)*o;
	if (c < 0x80) {
		*p++ = (unsigned char)c;
	} else if (c < 0x800) {
		*p++ = (unsigned char)(0xc0 | (c >> 6));
		*p++ = (unsigned char)(0x80 | (c & 0x3f));
	} else if (c < 0x10000) {
		*p++ = (unsigned char)(0xe0 | (c >> 12));
		*p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
		*p++ = (unsigned char)(0x80 | (c & 0x3f));
	} else {
		*p++ = (unsigned char)(0xf0 | (c >> 18));
		*p++ = (unsigned char)(0x80 | ((c >> 12) & 0x3f));
		*p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
		*p++ = (unsigned char)(0x80 | (c & 0x3f));
	}
	*o = (char *)p;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decodes the literal body [s, e) the way Jinja does (Python's
 * unicode-escape) into out, which has room for e - s bytes: no escape decodes
 * to more bytes than it is written with. Returns the decoded length. */
static size_t decode_literal(const char *s, const char *e, char *out)
{
	char *o = out;
	while (s < e) {
		if (*s == '\r' && s + 1 < e && s[1] == '\n') { /* Jinja normalizes newlines */
			s++;
			continue;
		}
		if (*s != '\\' || s + 1 >= e) {
			*o++ = *s++;
			continue;
		}
		static const char esc[] = "nrtabfv\\'\"";
		static const char val[] = "\n\r\t\a\b\f\v\\'\"";
		char c = s[1];
		const char *k = c ? strchr(esc, c) : NULL;
		if (k) {
			*o++ = val[k - esc];
			s += 2;
			continue;
		}
		if (c == '\n') { /* backslash-newline is a line continuation: dropped */
			s += 2;
			continue;
		}
		if (c >= '0' && c <= '7') {
			uint32_t v = 0;
			const char *q = s + 1;
			for (int i = 0; i < 3 && q < e && *q >= '0' && *q <= '7'; i++)
				v = v * 8 + (uint32_t)(*q++ - '0');
			put_utf8(&o, v);
			s = q;
			continue;
		}
		int nd = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
		if (nd && e - (s + 2) >= nd) {
			uint32_t v = 0;
			int i;
			for (i = 0; i < nd && hexval(s[2 + i]) >= 0; i++)
				v = v * 16 + (uint32_t)hexval(s[2 + i]);
			if (i == nd && v <= 0x10ffff) {
				put_utf8(&o, v);
				s += 2 + nd;
				continue;
			}
		}
		/* unknown escape: Python keeps the backslash */
		*o++ = *s++;
	}
	return (size_t)(o - out);
}

struct lit {
	const char *open;  /* the opening quote in the source */
	const char *close; /* just past the closing quote */
	char *val;         /* decoded, NUL-terminated (in a scratch buffer) */
	size_t len;
};

/* Calls fn on each string literal inside {{ }} and {% %} tags, in order,
 * until it returns nonzero (that value is returned). scratch has room for
 * strlen(src) + 1 bytes. */
static int each_literal(const char *src, char *scratch, int (*fn)(const struct lit *, void *), void *ctx)
{
	const char *p = src;
	while ((p = strchr(p, '{'))) {
		if (p[1] == '#') {
			const char *e = strstr(p + 2, "#}");
			if (!e)
				return 0;
			p = e + 2;
			continue;
		}
		if (p[1] != '{' && p[1] != '%') {
			p++;
			continue;
		}
		const char *close = p[1] == '{' ? "}}" : "%}";
		p += 2;
		while (*p && strncmp(p, close, 2) != 0) {
			if (*p != '\'' && *p != '"') {
				p++;
				continue;
			}
			char q = *p;
			const char *b = p + 1, *e = b;
			while (*e && *e != q)
				e += (*e == '\\' && e[1]) ? 2 : 1;
			if (!*e)
				return 0; /* unterminated: nothing more to trust */
			struct lit l = { .open = p, .close = e + 1, .val = scratch };
			l.len = decode_literal(b, e, scratch);
			scratch[l.len] = '\0';
			int r = fn(&l, ctx);
			if (r)
				return r;
			p = e + 1;
		}
		if (*p)
			p += 2;
		else
			return 0;
	}
	return 0;
}

struct lit_eq {
	const char *want;
};

static int lit_eq_cb(const struct lit *l, void *ctx)
{
	const struct lit_eq *q = ctx;
	return l->len == strlen(q->want) && !memcmp(l->val, q->want, l->len);
}

/* Whether a string literal of the template's tags decodes to exactly want. */
bool has_literal(const char *jinja, const char *want)
{
	char *scratch = malloc(strlen(jinja) + 1);
	struct lit_eq q = { want };
	if (!scratch)
		return false;
	int hit = each_literal(jinja, scratch, lit_eq_cb, &q);
	free(scratch);
	return hit != 0;
}

/* --- templates told by their whole text ---------------------------------- */

static bool ident_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static bool jinja_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Appends literal value v (n bytes) to o between \1 and \2, escaping those two and \3 with \3. */
static char *put_canon_lit(char *o, const char *v, size_t n)
{
	*o++ = '\1';
	for (size_t i = 0; i < n; i++) {
		if (v[i] == '\1' || v[i] == '\2' || v[i] == '\3')
			*o++ = '\3';
		*o++ = v[i];
	}
	*o++ = '\2';
	return o;
}

/* The template as a canonical string (malloc'd), so that two spellings of one
 * template compare equal: text outside tags as it is; inside {{ }} and {% %}
 * whitespace dropped (one space kept between two identifier characters), and
 * each run of string literals joined by '+' as one literal of their decoded
 * value (so '<|user|>\n', "<|user|>\n" and '<|user|>' + '\n' are alike). */
static char *canonical(const char *src)
{
	const size_t n = strlen(src);
	char *out = malloc(2 * n + 3), *o = out, *val = malloc(n + 1);
	if (!out || !val) {
		free(out);
		free(val);
		return NULL;
	}
	const char *p = src;
	while (*p) {
		if (p[0] != '{' || (p[1] != '{' && p[1] != '%')) {
			*o++ = *p++;
			continue;
		}
		const char *close = p[1] == '{' ? "}}" : "%}";
		*o++ = *p++;
		*o++ = *p++;
		while (*p && strncmp(p, close, 2) != 0) {
			if (jinja_space(*p)) {
				while (jinja_space(*p))
					p++;
				if (o > out && ident_char(o[-1]) && ident_char(*p))
					*o++ = ' ';
				continue;
			}
			if (*p != '\'' && *p != '"') {
				*o++ = *p++;
				continue;
			}
			size_t vl = 0;
			for (;;) { /* a literal, and those joined to it by '+' */
				const char q = *p, *b = p + 1, *e = b;
				while (*e && *e != q)
					e += (*e == '\\' && e[1]) ? 2 : 1;
				if (!*e) { /* unterminated: the rest as it is (no template of ours is) */
					o = put_canon_lit(o, val, vl);
					strcpy(o, p);
					free(val);
					return out;
				}
				vl += decode_literal(b, e, val + vl);
				p = e + 1;
				const char *a = p;
				while (jinja_space(*a))
					a++;
				if (*a != '+')
					break;
				a++;
				while (jinja_space(*a))
					a++;
				if (*a != '\'' && *a != '"')
					break;
				p = a;
			}
			o = put_canon_lit(o, val, vl);
		}
		if (*p) {
			*o++ = *p++;
			*o++ = *p++;
		}
	}
	*o = '\0';
	free(val);
	return out;
}

/* Phi-3's templates: 0 renders every system message (Phi-3-mini-4k/128k-instruct's),
 * 1 leaves out an empty one (Phi-3.5-mini-instruct's, Phi-3-medium's later). */
static const char *const phi3_templates[] = {
	"{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
	"'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif "
	"message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor "
	"%}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
	"{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
	"message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
	"'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + "
	"'<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ "
	"eos_token }}{% endif %}",
};

/* Which of phi3_templates jinja is (its trailing whitespace aside), or -1. */
static int phi3_variant(const char *jinja)
{
	if (!strstr(jinja, "<|assistant|>") || !strstr(jinja, "<|end|>"))
		return -1;
	size_t n = strlen(jinja);
	while (n && jinja_space(jinja[n - 1]))
		n--;
	char *src = strndup(jinja, n), *c = src ? canonical(src) : NULL;
	int hit = -1;
	for (int i = 0; c && hit < 0 && i < (int)(sizeof(phi3_templates) / sizeof(phi3_templates[0])); i++) {
		char *k = canonical(phi3_templates[i]);
		if (k && !strcmp(c, k))
			hit = i;
		free(k);
	}
	free(c);
	free(src);
	return hit;
}

static const char *skip_ws_back(const char *p, const char *start)
{
	while (p > start && (p[-1] == ' ' || p[-1] == '\t' || p[-1] == '\n'))
		p--;
	return p;
}

/* Whether literal l is the whole right side of `{% set var = '...' %}`. */
static bool is_assignment(const char *src, const struct lit *l, const char *var)
{
	const char *b = skip_ws_back(l->open, src);
	if (b == src || b[-1] != '=')
		return false;
	b = skip_ws_back(b - 1, src);
	size_t vl = strlen(var);
	if ((size_t)(b - src) < vl || memcmp(b - vl, var, vl) != 0)
		return false;
	const char *a = l->close;
	while (*a == ' ' || *a == '\t' || *a == '\n')
		a++;
	return strncmp(a, "%}", 2) == 0 || strncmp(a, "-%}", 3) == 0; /* not an expression such as '...' + x */
}

struct assigned {
	const char *src, *var;
	char *val; /* malloc'd */
	bool oom;
};

static int assigned_cb(const struct lit *l, void *ctx)
{
	struct assigned *a = ctx;
	if (!is_assignment(a->src, l, a->var))
		return 0;
	a->val = malloc(l->len + 1);
	if (!a->val)
		a->oom = true;
	else
		memcpy(a->val, l->val, l->len + 1);
	return 1;
}

/* The first literal the template assigns to var, malloc'd, or NULL. */
static char *assigned_literal(const char *jinja, const char *var)
{
	char *scratch = malloc(strlen(jinja) + 1);
	struct assigned a = { jinja, var, NULL, false };
	if (!scratch)
		return NULL;
	each_literal(jinja, scratch, assigned_cb, &a);
	free(scratch);
	return a.val;
}

static bool starts_with(const char *s, size_t n, const char *pre)
{
	size_t l = strlen(pre);
	return n >= l && memcmp(s, pre, l) == 0;
}

static int default_cb(const struct lit *l, void *ctx)
{
	struct find_default *f = ctx;
	const char *head = NULL, *tail = NULL;
	if (f->t == NX_CHAT_CHATML) {
		head = "<|im_start|>system\n";
		tail = "<|im_end|>";
	} else if (f->t == NX_CHAT_LLAMA3) {
		head = "<|start_header_id|>system<|end_header_id|>\n\n";
		tail = "<|eot_id|>";
	}
	if (head) {
		/* one literal holding a whole system turn: the template's own default */
		if (!starts_with(l->val, l->len, head))
			return 0;
		size_t hl = strlen(head);
		const char *t = strstr(l->val + hl, tail);
		if (!t || t == l->val + hl)
			return 0;
		f->body_off = hl;
		f->body_len = (size_t)(t - (l->val + hl));
	} else {
		/* Llama 2: {% set system_message = '...' %} */
		if (!is_assignment(f->src, l, "system_message") || l->len == 0)
			return 0;
		f->body_off = 0;
		f->body_len = l->len;
	}
	f->lit = malloc(l->len + 1);
	if (!f->lit) {
		f->oom = true;
		return 1;
	}
	memcpy(f->lit, l->val, l->len + 1);
	return 1;
}

/* Finds the template's default system literal; f->lit stays NULL when none. */
int find_default(enum nx_chat_tmpl t, const char *jinja, struct find_default *f, struct nx_err *err)
{
	memset(f, 0, sizeof(*f));
	f->t = t;
	f->src = jinja;
	/* Llama 3.1 and Qwen3 insert no default system message */
	if (!jinja || (t != NX_CHAT_CHATML && t != NX_CHAT_LLAMA2 && t != NX_CHAT_LLAMA3))
		return 0;
	/* Llama 2 templates that gate the default on USE_DEFAULT_PROMPT never
	 * insert it under HF (the variable is undefined there). */
	if (t == NX_CHAT_LLAMA2 && strstr(jinja, "USE_DEFAULT_PROMPT"))
		return 0;
	char *scratch = malloc(strlen(jinja) + 1);
	if (!scratch)
		return nx_errf(err, "chat: out of memory reading the template");
	each_literal(jinja, scratch, default_cb, f);
	free(scratch);
	if (f->oom)
		return nx_errf(err, "chat: out of memory reading the template");
	return 0;
}

int nx_chat_default_system(enum nx_chat_tmpl t, const char *jinja, char **out, struct nx_err *err)
{
	struct find_default f;
	*out = NULL;
	if (find_default(t, jinja, &f, err))
		return -1;
	if (!f.lit)
		return 0;
	memmove(f.lit, f.lit + f.body_off, f.body_len);
	f.lit[f.body_len] = '\0';
	*out = f.lit;
	return 0;
}

/* --- rendering ------------------------------------------------------------ */

/* A system message after the first message, or a second one: the templates
 * below render it where it stands, as Hugging Face's do (DeepSeek R1's keeps
 * the last one's text, in front); Llama 2's and Mistral's v3 and Small 3.1
 * templates raise, and so does nxd. Gemma's takes one where the turns'
 * alternation allows (render_gemma). */
int check_late_system(enum nx_chat_tmpl t, int i, struct nx_err *err)
{
	if (i == 0 || (t != NX_CHAT_LLAMA2 && t != NX_CHAT_MISTRAL_V3 && t != NX_CHAT_MISTRAL_V3_TEKKEN &&
		       t != NX_CHAT_MISTRAL_V7_TEKKEN))
		return 0;
	return nx_errf(err, "chat: message %d has role \"system\"; the %s template takes a system message only first",
		       i, nx_chat_tmpl_name(t));
}

static int check_msgs(enum nx_chat_tmpl t, const struct nx_chat_msg *msgs, int n, struct nx_err *err)
{
	if (n <= 0 || !msgs)
		return nx_errf(err, "chat: no messages");
	for (int i = 0; i < n; i++) {
		const char *r = msgs[i].role;
		if (!r)
			return nx_errf(err, "chat: message %d has no role", i);
		if (!msgs[i].content)
			return nx_errf(err, "chat: message %d (%.32s) has no content", i, r);
		if (strcmp(r, "system") == 0) {
			if (check_late_system(t, i, err))
				return -1;
		} else if (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
			return nx_errf(err, "chat: message %d has unknown role \"%.64s\"; expected system, user or assistant",
				       i, r);
		}
	}
	return 0;
}

static void render_chatml(struct nx_sbuf *b, const struct find_default *f, const struct nx_chat_msg *m,
			  int n, bool gen)
{
	if (f->lit && strcmp(m[0].role, "system") != 0)
		nx_sb_str(b, f->lit);
	for (int i = 0; i < n; i++) {
		nx_sb_str(b, "<|im_start|>");
		nx_sb_str(b, m[i].role);
		nx_sb_str(b, "\n");
		nx_sb_str(b, m[i].content);
		nx_sb_str(b, "<|im_end|>\n");
	}
	if (gen)
		nx_sb_str(b, "<|im_start|>assistant\n");
}

/* Llama 3's turns from m[first] on, and the assistant header that asks for the answer. */
static void llama3_turns(struct nx_sbuf *b, const struct nx_chat_msg *m, int first, int n, bool gen)
{
	for (int i = first; i < n; i++) {
		nx_sb_str(b, "<|start_header_id|>");
		nx_sb_str(b, m[i].role);
		nx_sb_str(b, "<|end_header_id|>\n\n");
		sb_stripped(b, m[i].content);
		nx_sb_str(b, "<|eot_id|>");
	}
	if (gen)
		nx_sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_llama3(struct nx_sbuf *b, const struct find_default *f, const struct nx_chat_msg *m,
			  int n, bool gen)
{
	nx_sb_str(b, "<|begin_of_text|>");
	if (f->lit && strcmp(m[0].role, "system") != 0)
		nx_sb_str(b, f->lit);
	llama3_turns(b, m, 0, n, gen);
}

/* Llama 3.1's date line: the template's date_string, or today's when it asks strftime_now. */
void llama31_date(char *buf, size_t n, const char *jinja)
{
	char *lit = jinja && !strstr(jinja, "strftime_now") ? assigned_literal(jinja, "date_string") : NULL;
	time_t now = time(NULL);
	struct tm tm;
	if (lit)
		snprintf(buf, n, "%s", lit);
	else if (jinja && strstr(jinja, "strftime_now") && localtime_r(&now, &tm) && strftime(buf, n, "%d %b %Y", &tm))
		;
	else
		snprintf(buf, n, "26 Jul 2024");
	free(lit);
}

static void render_llama31(struct nx_sbuf *b, const char *jinja, const struct nx_chat_msg *m, int n, bool gen)
{
	char date[64];
	llama31_date(date, sizeof(date), jinja);
	nx_sb_str(b, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
		  "Today Date: ");
	nx_sb_str(b, date);
	nx_sb_str(b, "\n\n");
	int first = 0;
	if (strcmp(m[0].role, "system") == 0) {
		sb_stripped(b, m[0].content);
		first = 1;
	}
	nx_sb_str(b, "<|eot_id|>");
	llama3_turns(b, m, first, n, gen);
}

/* [s, e) without leading (lead) or trailing (trail) newlines: Python's lstrip / rstrip('\n'). */
void strip_nl(const char **s, const char **e, bool lead, bool trail)
{
	while (lead && *s < *e && **s == '\n')
		(*s)++;
	while (trail && *e > *s && (*e)[-1] == '\n')
		(*e)--;
}

const char *last_of(const char *s, const char *e, const char *pat)
{
	const size_t pl = strlen(pat);
	const char *hit = NULL;
	for (const char *p = s; p + pl <= e; p++)
		if (!memcmp(p, pat, pl))
			hit = p;
	return hit;
}

/* A Qwen3 assistant turn's reasoning [*r, *re) and content [*c, *ce), split as the template does. */
void qwen3_split(const char *content, const char **r, const char **re, const char **c, const char **ce)
{
	*c = content;
	*ce = content + strlen(content);
	*r = *re = "";
	const char *close = strstr(content, "</think>");
	if (close) {
		/* reasoning: before the first </think>, rstrip \n, after its last <think>, lstrip \n */
		const char *rs = content, *rend = close;
		strip_nl(&rs, &rend, false, true);
		const char *open = last_of(rs, rend, "<think>");
		*r = open ? open + strlen("<think>") : rs;
		*re = rend;
		strip_nl(r, re, true, false);
		/* content: after the last </think>, lstrip \n */
		*c = last_of(content, *ce, "</think>") + strlen("</think>");
		strip_nl(c, ce, true, false);
	}
}

/* One Qwen3 assistant turn: its reasoning split off the content as the template does. */
static void qwen3_assistant(struct nx_sbuf *b, const char *content, bool think)
{
	const char *c, *ce, *r, *re;
	qwen3_split(content, &r, &re, &c, &ce);
	nx_sb_str(b, "<|im_start|>assistant\n");
	if (think) {
		strip_nl(&r, &re, true, true);
		nx_sb_str(b, "<think>\n");
		nx_sb_put(b, r, (size_t)(re - r));
		nx_sb_str(b, "\n</think>\n\n");
		strip_nl(&c, &ce, true, false);
	}
	nx_sb_put(b, c, (size_t)(ce - c));
	nx_sb_str(b, "<|im_end|>\n");
}

bool is_tool_response(const char *s)
{
	size_t n = strlen(s), a = strlen("<tool_response>"), z = strlen("</tool_response>");
	return n >= a && n >= z && !memcmp(s, "<tool_response>", a) && !memcmp(s + n - z, "</tool_response>", z);
}

/* Whether an assistant turn has reasoning (a non-empty part before </think>, as qwen3_assistant cuts it). */
static bool has_reasoning(const char *content)
{
	const char *close = strstr(content, "</think>");
	if (!close)
		return false;
	const char *rs = content, *rend = close;
	strip_nl(&rs, &rend, false, true);
	const char *open = last_of(rs, rend, "<think>"), *r = open ? open + strlen("<think>") : rs;
	strip_nl(&r, &rend, true, false);
	return rend > r;
}

static void render_qwen3(struct nx_sbuf *b, const struct nx_chat_msg *m, int n, bool gen)
{
	int last_query = n - 1; /* the last user message that is not a tool's response */
	for (int i = n - 1; i >= 0; i--)
		if (!strcmp(m[i].role, "user") && !is_tool_response(m[i].content)) {
			last_query = i;
			break;
		}
	for (int i = 0; i < n; i++) {
		if (!strcmp(m[i].role, "assistant")) {
			qwen3_assistant(b, m[i].content, i > last_query && (i == n - 1 || has_reasoning(m[i].content)));
			continue;
		}
		nx_sb_str(b, "<|im_start|>");
		nx_sb_str(b, m[i].role);
		nx_sb_str(b, "\n");
		nx_sb_str(b, m[i].content);
		nx_sb_str(b, "<|im_end|>\n");
	}
	if (gen)
		nx_sb_str(b, "<|im_start|>assistant\n");
}

/* Phi-3's turns; skip_empty_system: Phi-3.5's template (phi3_variant 1). */
static void render_phi3(struct nx_sbuf *b, const char *jinja, const struct nx_chat_msg *m, int n, bool gen)
{
	const bool skip_empty_system = jinja && phi3_variant(jinja) == 1;
	for (int i = 0; i < n; i++) {
		if (skip_empty_system && !strcmp(m[i].role, "system") && !*m[i].content)
			continue;
		nx_sb_str(b, "<|");
		nx_sb_str(b, m[i].role);
		nx_sb_str(b, "|>\n");
		nx_sb_str(b, m[i].content);
		nx_sb_str(b, "<|end|>\n");
	}
	/* without a generation prompt the template ends on eos_token: Phi-3's, whose vocabulary has it */
	nx_sb_str(b, gen ? "<|assistant|>\n" : "<|endoftext|>");
}

static int render_llama2(struct nx_sbuf *b, const struct find_default *f, const struct nx_chat_msg *m,
			 int n, struct nx_err *err)
{
	const char *sys = NULL;
	int first = 0;
	if (strcmp(m[0].role, "system") == 0) {
		sys = m[0].content;
		first = 1;
	} else if (f->lit && !strstr(m[0].content, "<<SYS>>")) {
		sys = f->lit;
	}
	if (first == n)
		return nx_errf(err, "chat: the llama2 template needs a user message after the system message");
	for (int i = first; i < n; i++) {
		bool want_user = (i - first) % 2 == 0;
		if ((strcmp(m[i].role, "user") == 0) != want_user)
			return nx_errf(err, "chat: message %d has role \"%s\"; the llama2 template needs user and "
				       "assistant turns to alternate, starting with user", i, m[i].role);
	}
	struct nx_sbuf c = { 0 };
	for (int i = first; i < n; i++) {
		const char *content = m[i].content;
		if (i == first && sys) {
			c.n = 0;
			nx_sb_str(&c, "<<SYS>>\n");
			nx_sb_str(&c, sys);
			nx_sb_str(&c, "\n<</SYS>>\n\n");
			nx_sb_str(&c, content);
			if (c.oom)
				break;
			content = c.s;
		}
		if (strcmp(m[i].role, "user") == 0) {
			nx_sb_str(b, "<s>[INST] ");
			sb_stripped(b, content);
			nx_sb_str(b, " [/INST]");
		} else {
			nx_sb_str(b, " ");
			sb_stripped(b, content);
			nx_sb_str(b, " </s>");
		}
	}
	if (c.oom)
		b->oom = true;
	free(c.s);
	return 0;
}

/* --- Mistral ------------------------------------------------------------ */

/* User and assistant turns from m[first] on must alternate, user first (the templates raise otherwise). */
static int check_alternating(const struct nx_chat_msg *m, int first, int n, enum nx_chat_tmpl t, struct nx_err *err)
{
	for (int i = first; i < n; i++) {
		bool want_user = (i - first) % 2 == 0;
		if ((strcmp(m[i].role, "user") == 0) != want_user)
			return nx_errf(err, "chat: message %d has role \"%s\"; the %s template needs user and assistant "
				       "turns to alternate, starting with user", i, m[i].role, nx_chat_tmpl_name(t));
	}
	return 0;
}

static int render_mistral_v3(struct nx_sbuf *b, enum nx_chat_tmpl t, const struct nx_chat_msg *m, int n,
			     struct nx_err *err)
{
	bool tekken = t == NX_CHAT_MISTRAL_V3_TEKKEN;
	const char *sys = NULL;
	int first = 0;
	if (strcmp(m[0].role, "system") == 0) {
		sys = m[0].content;
		first = 1;
	}
	if (check_alternating(m, first, n, t, err))
		return -1;
	nx_sb_str(b, "<s>");
	for (int i = first; i < n; i++) {
		if (strcmp(m[i].role, "user") == 0) {
			nx_sb_str(b, tekken ? "[INST]" : "[INST] ");
			if (sys && i == n - 1) {
				nx_sb_str(b, sys);
				nx_sb_str(b, "\n\n");
			}
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "[/INST]");
		} else if (tekken) {
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "</s>");
		} else {
			nx_sb_str(b, " ");
			sb_stripped(b, m[i].content);
			nx_sb_str(b, "</s>");
		}
	}
	return 0;
}

static void render_mistral_v7(struct nx_sbuf *b, const struct nx_chat_msg *m, int n)
{
	nx_sb_str(b, "<s>");
	for (int i = 0; i < n; i++) {
		if (strcmp(m[i].role, "user") == 0) {
			nx_sb_str(b, "[INST] ");
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "[/INST]");
		} else if (strcmp(m[i].role, "system") == 0) {
			nx_sb_str(b, "[SYSTEM_PROMPT] ");
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "[/SYSTEM_PROMPT]");
		} else {
			nx_sb_str(b, " ");
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "</s>");
		}
	}
}

/* Skips a Jinja string literal starting at its quote *p; [*b, *e) is its body. */
static bool skip_literal(const char **p, const char **b, const char **e)
{
	char q = **p;
	const char *s = *p + 1;
	*b = s;
	while (*s && *s != q)
		s += (*s == '\\' && s[1]) ? 2 : 1;
	if (!*s)
		return false;
	*e = s;
	*p = s + 1;
	return true;
}

static const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* The strftime format of `set today = strftime_now("FMT")`, decoded into fmt. */
static bool today_format(const char *jinja, char *fmt, size_t cap)
{
	const char *p = strstr(jinja, "set today");
	if (!p)
		return false;
	p = skip_ws(p + strlen("set today"));
	if (*p != '=')
		return false;
	p = skip_ws(p + 1);
	if (strncmp(p, "strftime_now(", 13) != 0)
		return false;
	p = skip_ws(p + 13);
	const char *b, *e;
	if ((*p != '"' && *p != '\'') || !skip_literal(&p, &b, &e) || (size_t)(e - b) >= cap)
		return false;
	fmt[decode_literal(b, e, fmt)] = '\0';
	return *skip_ws(p) == ')';
}

bool parse_set_string(const char *jinja, const char *name, char **out)
{
	*out = NULL;
	char set[96];
	snprintf(set, sizeof(set), "set %s", name);
	const char *p = strstr(jinja, set);
	if (!p)
		return false;
	p = skip_ws(p + strlen(set));
	if (*p != '=')
		return false;
	struct nx_sbuf v = { 0 };
	nx_sb_put(&v, "", 0);
	char *tmp = malloc(strlen(jinja) + 1);
	bool ok = tmp != NULL;
	for (p = skip_ws(p + 1); ok; p = skip_ws(p + 1)) {
		const char *b, *e;
		if (*p == '"' || *p == '\'') {
			ok = skip_literal(&p, &b, &e);
			if (ok)
				nx_sb_put(&v, tmp, decode_literal(b, e, tmp));
		} else if (strncmp(p, "today", 5) == 0 && !(p[5] == '_' || (p[5] >= 'a' && p[5] <= 'z'))) {
			char fmt[64], date[128];
			time_t now = time(NULL);
			struct tm tm;
			ok = today_format(jinja, fmt, sizeof(fmt)) && localtime_r(&now, &tm) &&
			     strftime(date, sizeof(date), fmt, &tm) > 0;
			if (ok)
				nx_sb_str(&v, date);
			p += 5;
		} else {
			ok = false;
		}
		if (!ok)
			break;
		p = skip_ws(p);
		if (*p != '+')
			break;
	}
	ok = ok && !v.oom && (strncmp(p, "%}", 2) == 0 || strncmp(p, "-%}", 3) == 0);
	free(tmp);
	if (!ok) {
		free(v.s);
		return false;
	}
	*out = v.s;
	return true;
}

/* Mistral Small's `set default_system_message = "..." + today + "..."`. */
static bool parse_default_system(const char *jinja, char **out)
{
	return parse_set_string(jinja, "default_system_message", out);
}

static void render_mistral_v7_tekken(struct nx_sbuf *b, const char *jinja, const struct nx_chat_msg *m, int n)
{
	int first = 0;
	char *def = NULL;
	const char *sys = NULL;
	if (strcmp(m[0].role, "system") == 0) {
		sys = m[0].content;
		first = 1;
	} else if (jinja && parse_default_system(jinja, &def)) {
		sys = def;
	}
	/* Mistral Small 3.1's template means to check that the turns alternate,
	 * but its list of turns is set inside a loop, where Jinja keeps it: it
	 * checks nothing, and neither does nxd. */
	nx_sb_str(b, "<s>");
	if (sys) { /* without the template (--chat-template NAME) there is no default to put here */
		nx_sb_str(b, "[SYSTEM_PROMPT]");
		nx_sb_str(b, sys);
		nx_sb_str(b, "[/SYSTEM_PROMPT]");
	}
	free(def);
	for (int i = first; i < n; i++) {
		if (strcmp(m[i].role, "user") == 0) {
			nx_sb_str(b, "[INST]");
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "[/INST]");
		} else {
			nx_sb_str(b, m[i].content);
			nx_sb_str(b, "</s>");
		}
	}
}

/* --- DeepSeek R1 ---------------------------------------------------------- */

static void render_deepseek_r1(struct nx_sbuf *b, const char *jinja, const struct nx_chat_msg *m, int n, bool gen)
{
	nx_sb_str(b, DS_BOS);
	const char *sys = NULL; /* the template keeps the last system message's text, wherever it stood */
	for (int i = 0; i < n; i++)
		if (strcmp(m[i].role, "system") == 0)
			sys = m[i].content;
	if (sys)
		nx_sb_str(b, sys);
	for (int i = 0; i < n; i++) {
		if (strcmp(m[i].role, "system") == 0)
			continue;
		if (strcmp(m[i].role, "user") == 0) {
			nx_sb_str(b, DS_USER);
			nx_sb_str(b, m[i].content);
			continue;
		}
		/* content.split('</think>')[-1] */
		const char *c = m[i].content, *e = c + strlen(c), *cut = last_of(c, e, "</think>");
		nx_sb_str(b, DS_ASSISTANT);
		nx_sb_str(b, cut ? cut + strlen("</think>") : c);
		nx_sb_str(b, DS_EOS);
	}
	if (gen)
		nx_sb_str(b, !jinja || has_literal(jinja, DS_ASSISTANT "<think>\n") ? DS_ASSISTANT "<think>\n" : DS_ASSISTANT);
}

/* A thinking option the template cannot follow is refused, not dropped. */
int check_thinking(enum nx_chat_tmpl t, enum nx_chat_thinking th, struct nx_err *err)
{
	if (th == NX_CHAT_THINK_OFF && t != NX_CHAT_QWEN3)
		return nx_errf(err, "chat: \"think\": false needs a template that can turn thinking off (qwen3); the "
			       "model's is %s", nx_chat_tmpl_name(t));
	if (th == NX_CHAT_THINK_ON && t != NX_CHAT_QWEN3 && t != NX_CHAT_DEEPSEEK_R1)
		return nx_errf(err, "chat: \"think\": true needs a template that thinks (qwen3, deepseek-r1); the "
			       "model's is %s", nx_chat_tmpl_name(t));
	return 0;
}

/* Gemma 1, 2, 3 (chat.h). A template without Gemma 2's refusal folds the system message as Gemma 3's does. */
static int render_gemma(struct nx_sbuf *b, const char *jinja, const struct nx_chat_msg *m, int n, bool gen,
			struct nx_err *err)
{
	int first = 0;
	if (strcmp(m[0].role, "system") == 0) {
		if (jinja && strstr(jinja, "System role not supported"))
			return nx_errf(err, "chat: message 0 has role \"system\"; the model's gemma template does not take "
				       "one (\"System role not supported\")");
		first = 1;
	}
	if (check_alternating(m, first, n, NX_CHAT_GEMMA, err))
		return -1;
	if (!jinja || strstr(jinja, "bos_token")) /* Gemma 1's first template writes none: the tokenizer's BOS stands */
		nx_sb_str(b, "<bos>");
	for (int i = first; i < n; i++) {
		nx_sb_str(b, "<start_of_turn>");
		nx_sb_str(b, strcmp(m[i].role, "assistant") == 0 ? "model" : m[i].role);
		nx_sb_str(b, "\n");
		if (i == first && first == 1) {
			nx_sb_str(b, m[0].content);
			nx_sb_str(b, "\n\n");
		}
		sb_stripped(b, m[i].content);
		nx_sb_str(b, "<end_of_turn>\n");
	}
	if (gen)
		nx_sb_str(b, "<start_of_turn>model\n");
	return 0;
}

int nx_chat_render(enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_msg *msgs, int n,
		   bool add_generation_prompt, char **out, struct nx_err *err)
{
	struct nx_chat_opts o = { .add_generation_prompt = add_generation_prompt, .thinking = NX_CHAT_THINK_DEFAULT };
	return nx_chat_render_opts(t, jinja, msgs, n, &o, out, err);
}

int nx_chat_render_opts(enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_msg *msgs, int n,
			const struct nx_chat_opts *opts, char **out, struct nx_err *err)
{
	bool add_generation_prompt = opts->add_generation_prompt;
	*out = NULL;
	if ((unsigned)t >= NX_CHAT_N_KNOWN)
		return nx_errf(err, "chat: the model's chat template is not one nxd can render (it renders %s): start nxd "
			       "with --chat-template NAME, or send a prompt with \"raw\": true", nx_chat_tmpl_names());
	if (check_msgs(t, msgs, n, err) || check_thinking(t, opts->thinking, err))
		return -1;
	struct find_default f;
	if (find_default(t, jinja, &f, err))
		return -1;

	struct nx_sbuf b = { 0 };
	nx_sb_put(&b, "", 0); /* an empty render is still a string */
	int rc = 0;
	switch (t) {
	case NX_CHAT_RAW:
		for (int i = 0; i < n; i++)
			nx_sb_str(&b, msgs[i].content);
		break;
	case NX_CHAT_CHATML:
		render_chatml(&b, &f, msgs, n, add_generation_prompt);
		break;
	case NX_CHAT_LLAMA2:
		rc = render_llama2(&b, &f, msgs, n, err);
		break;
	case NX_CHAT_LLAMA3:
		render_llama3(&b, &f, msgs, n, add_generation_prompt);
		break;
	case NX_CHAT_LLAMA31:
		render_llama31(&b, jinja, msgs, n, add_generation_prompt);
		break;
	case NX_CHAT_QWEN3:
		render_qwen3(&b, msgs, n, add_generation_prompt);
		if (add_generation_prompt && opts->thinking == NX_CHAT_THINK_OFF)
			nx_sb_str(&b, "<think>\n\n</think>\n\n");
		break;
	case NX_CHAT_MISTRAL_V3:
	case NX_CHAT_MISTRAL_V3_TEKKEN:
		rc = render_mistral_v3(&b, t, msgs, n, err);
		break;
	case NX_CHAT_MISTRAL_V7:
		render_mistral_v7(&b, msgs, n);
		break;
	case NX_CHAT_MISTRAL_V7_TEKKEN:
		render_mistral_v7_tekken(&b, jinja, msgs, n);
		break;
	case NX_CHAT_DEEPSEEK_R1:
		render_deepseek_r1(&b, jinja, msgs, n, add_generation_prompt);
		break;
	case NX_CHAT_PHI3:
		render_phi3(&b, jinja, msgs, n, add_generation_prompt);
		break;
	case NX_CHAT_GEMMA:
		rc = render_gemma(&b, jinja, msgs, n, add_generation_prompt, err);
		break;
	default:
		break;
	}
	free(f.lit);
	if (rc == 0 && b.oom)
		rc = nx_errf(err, "chat: out of memory rendering %d messages", n);
	if (rc) {
		free(b.s);
		return -1;
	}
	*out = b.s;
	return 0;
}
