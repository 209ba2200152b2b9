/* term.c - what nxctl writes where a person reads it: on a terminal, control characters from the model or the server are shown, not obeyed. */
#define _GNU_SOURCE /* vasprintf */
#include <stdarg.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "client/nxctl.h"

struct nxc_term nxc_stdout = {.fd = 1, .filter = -1}, nxc_stderr = {.fd = 2, .filter = -1};

static FILE *term_file(const struct nxc_term *t)
{
	return t->fd == 2 ? stderr : stdout;
}

static bool term_filters(struct nxc_term *t)
{
	if (t->filter < 0)
		t->filter = isatty(t->fd) == 1;
	return t->filter;
}

void nxc_term_raw(struct nxc_term *t)
{
	t->filter = 0;
}

static void put(const struct nxc_term *t, const char *s, size_t n)
{
	fwrite(s, 1, n, term_file(t));
}

/* C0 and DEL in caret notation, as less and cat -v show them: ESC is ^[. */
static void show_caret(const struct nxc_term *t, unsigned char c)
{
	char b[2] = {'^', c == 0x7f ? '?' : (char)(c + 0x40)};
	put(t, b, 2);
}

/* A C1 control (U+0080..U+009F) or, in a JSON line, DEL: as text, or as the
 * JSON escape of the same character so the line keeps its meaning. */
static void show_code_point(const struct nxc_term *t, unsigned cp)
{
	char b[16];
	int n = snprintf(b, sizeof(b), t->json ? "\\u%04x" : "<U+%04X>", cp);
	put(t, b, (size_t)n);
}

/* A byte that begins no valid UTF-8 sequence. */
static void show_byte(const struct nxc_term *t, unsigned char c)
{
	char b[8];
	int n = snprintf(b, sizeof(b), "<%02X>", c);
	put(t, b, (size_t)n);
}

static void drop_partial(struct nxc_term *t)
{
	for (size_t i = 0; i < t->n_seq; i++)
		show_byte(t, t->seq[i]);
	t->n_seq = 0;
}

/* Bytes a UTF-8 sequence led by c has (RFC 3629), and the range of its
 * second byte (no overlongs, surrogates or code points past U+10FFFF); 0
 * when c leads none. */
static size_t utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
	*lo = 0x80;
	*hi = 0xBF;
	if (c >= 0xC2 && c <= 0xDF)
		return 2;
	if (c >= 0xE0 && c <= 0xEF) {
		if (c == 0xE0)
			*lo = 0xA0;
		else if (c == 0xED)
			*hi = 0x9F;
		return 3;
	}
	if (c >= 0xF0 && c <= 0xF4) {
		if (c == 0xF0)
			*lo = 0x90;
		else if (c == 0xF4)
			*hi = 0x8F;
		return 4;
	}
	return 0;
}

/* The sequence in t->seq is complete: C1 controls are shown, the rest passes. */
static void emit_sequence(struct nxc_term *t)
{
	if (t->need == 2 && t->seq[0] == 0xC2 && t->seq[1] <= 0x9F)
		show_code_point(t, t->seq[1]);
	else
		put(t, (const char *)t->seq, t->n_seq);
	t->n_seq = 0;
}

/* A byte that continues the sequence in t->seq, if it can. */
static bool continue_sequence(struct nxc_term *t, unsigned char c)
{
	unsigned char lo, hi;
	utf8_lead(t->seq[0], &lo, &hi);
	if (t->n_seq > 1) {
		lo = 0x80;
		hi = 0xBF;
	}
	if (c < lo || c > hi)
		return false;
	t->seq[t->n_seq++] = c;
	if (t->n_seq == t->need)
		emit_sequence(t);
	return true;
}

static bool plain(unsigned char c)
{
	return (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t';
}

static void filter_byte(struct nxc_term *t, unsigned char c)
{
	if (t->cr) { /* "\r\n" is a line end; any other '\r' could overwrite the line */
		t->cr = false;
		if (c == '\n') {
			put(t, "\r\n", 2);
			return;
		}
		show_caret(t, '\r');
	}
	if (t->n_seq) {
		if (continue_sequence(t, c))
			return;
		drop_partial(t);
	}
	if (plain(c)) {
		put(t, (const char *)&c, 1);
	} else if (c == '\r') {
		t->cr = true;
	} else if (c == 0x7f && t->json) {
		show_code_point(t, c);
	} else if (c < 0x80) {
		show_caret(t, c);
	} else {
		unsigned char lo, hi;
		t->need = utf8_lead(c, &lo, &hi);
		if (!t->need) {
			show_byte(t, c);
			return;
		}
		t->seq[0] = c;
		t->n_seq = 1;
	}
}

void nxc_term_write(struct nxc_term *t, const char *s, size_t n)
{
	if (!term_filters(t)) {
		put(t, s, n);
		return;
	}
	size_t i = 0;
	while (i < n) {
		/* Plain ASCII text goes out in runs; everything else byte by byte. */
		size_t run = i;
		if (!t->cr && !t->n_seq)
			while (run < n && plain((unsigned char)s[run]))
				run++;
		if (run > i) {
			put(t, s + i, run - i);
			i = run;
		} else {
			filter_byte(t, (unsigned char)s[i++]);
		}
	}
}

void nxc_term_end(struct nxc_term *t)
{
	if (t->cr)
		show_caret(t, '\r');
	t->cr = false;
	drop_partial(t);
}

static void term_vprintf(struct nxc_term *t, const char *fmt, va_list ap)
{
	char *s = NULL;
	int n = vasprintf(&s, fmt, ap);
	if (n > 0)
		nxc_term_write(t, s, (size_t)n);
	free(s);
}

void nxc_printf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	term_vprintf(&nxc_stdout, fmt, ap);
	va_end(ap);
}

void nxc_eprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	term_vprintf(&nxc_stderr, fmt, ap);
	va_end(ap);
	nxc_term_end(&nxc_stderr);
}

void nxc_print_json(const char *line, size_t len)
{
	nxc_stdout.json = true;
	nxc_term_write(&nxc_stdout, line, len);
	nxc_term_end(&nxc_stdout);
	nxc_stdout.json = false;
	put(&nxc_stdout, "\n", 1);
}

/* Our own escape sequences: the filter is for what others wrote. */
static bool note_dim(struct nxc_term *t)
{
	const char *term = getenv("TERM");
	return term_filters(t) && !getenv("NO_COLOR") && !(term && !strcmp(term, "dumb"));
}

void nxc_note(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout); /* after the answer it is about */
	bool dim = note_dim(&nxc_stderr);
	if (dim)
		put(&nxc_stderr, "\033[2m", 4);
	va_start(ap, fmt);
	term_vprintf(&nxc_stderr, fmt, ap);
	va_end(ap);
	nxc_term_end(&nxc_stderr);
	if (dim)
		put(&nxc_stderr, "\033[0m", 4);
	put(&nxc_stderr, "\n", 1);
}
