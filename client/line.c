/* line.c - what nxctl chat reads: on a terminal libedit's line editing and a history file, elsewhere plain lines. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <histedit.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#include "client/nxctl.h"
#include "proto/proto.h"

#define HISTORY_SIZE 1000

static volatile sig_atomic_t resized;

static void on_sigwinch(int sig)
{
	(void)sig;
	resized = 1;
}

/* libedit's own signal handling (EL_SIGNAL) would re-raise SIGINT to the
 * whole process group; instead it reads through this, which waits the way
 * every other read in nxctl does (nxc_wait_input), so a Ctrl-C at the
 * prompt ends el_gets with -1 and the caller drops the line. */
static int read_char(EditLine *el, wchar_t *wc)
{
	mbstate_t st;
	memset(&st, 0, sizeof(st));
	for (;;) {
		int w = nxc_wait_input(0);
		if (w == -2 && nxc_interrupts) {
			errno = EINTR;
			return -1;
		}
		if (w == -2) { /* SIGWINCH */
			if (resized)
				el_resize(el);
			resized = 0;
			continue;
		}
		if (w < 0)
			return -1;
		char b;
		ssize_t k = read(0, &b, 1);
		if (k == 0)
			return 0;
		if (k < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -1;
		}
		size_t r = mbrtowc(wc, &b, 1, &st);
		if (r == (size_t)-2)
			continue; /* the rest of a multi-byte character */
		if (r == (size_t)-1) { /* not in the locale's encoding: the byte as is */
			*wc = (unsigned char)b;
			memset(&st, 0, sizeof(st));
		}
		return 1;
	}
}

static char *prompt_of(EditLine *el)
{
	struct nxc_line *l = NULL;
	el_get(el, EL_CLIENTDATA, &l);
	return (char *)(l && l->prompt ? l->prompt : "");
}

/* $XDG_STATE_HOME/nxctl/history, else ~/.local/state/nxctl/history; the
 * directories made 0700 as needed. "" when there is no home. */
static void history_path(struct nxc_line *l)
{
	const char *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
	char dir[PATH_MAX - 16]; /* room for "/history" in hist_path */
	l->hist_path[0] = '\0';
	if (state && state[0] == '/') /* the spec: a relative path is ignored */
		snprintf(dir, sizeof(dir), "%s/nxctl", state);
	else if (home && home[0])
		snprintf(dir, sizeof(dir), "%s/.local/state/nxctl", home);
	else
		return;
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		mkdir(dir, 0700);
		*p = '/';
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return;
	snprintf(l->hist_path, sizeof(l->hist_path), "%s/history", dir);
	/* what one types may be private: the file is the user's alone */
	int fd = open(l->hist_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
}

static int editor_open(struct nxc_line *l)
{
	/* libedit edits characters, not bytes, by the locale's encoding: in the C
	 * locale (no LANG, or a LANG that is not installed) it drops or repeats
	 * the bytes of every non-ASCII character. nxd speaks UTF-8: fall back to it. */
	const char *loc = setlocale(LC_CTYPE, "");
	if (!loc || strcmp(nl_langinfo(CODESET), "UTF-8"))
		if (!setlocale(LC_CTYPE, "C.UTF-8"))
			setlocale(LC_CTYPE, "C.utf8");
	l->el = el_init("nxctl", stdin, stdout, stderr);
	l->hist = history_init();
	if (!l->el || !l->hist)
		return -1;
	HistEvent ev;
	history(l->hist, &ev, H_SETSIZE, HISTORY_SIZE);
	history(l->hist, &ev, H_SETUNIQUE, 1);
	history_path(l);
	if (l->hist_path[0])
		history(l->hist, &ev, H_LOAD, l->hist_path);
	el_set(l->el, EL_CLIENTDATA, l);
	el_set(l->el, EL_EDITOR, "emacs");
	el_set(l->el, EL_PROMPT, prompt_of);
	el_set(l->el, EL_HIST, history, l->hist);
	el_set(l->el, EL_GETCFN, read_char);
	el_source(l->el, NULL); /* ~/.editrc, as other libedit programs read it */
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigwinch;
	sigaction(SIGWINCH, &sa, NULL);
	return 0;
}

int nxc_line_open(struct nxc_line *l)
{
	memset(l, 0, sizeof(*l));
	l->tty = isatty(0) == 1;
	if (l->tty && isatty(1) == 1 && editor_open(l) == 0)
		return 0;
	if (l->el)
		el_end(l->el);
	if (l->hist)
		history_end(l->hist);
	l->el = NULL;
	l->hist = NULL;
	nxc_reader_init(&l->rd, 0, NXP_MAX_LINE);
	return 0;
}

void nxc_line_close(struct nxc_line *l)
{
	if (l->el)
		el_end(l->el);
	if (l->hist)
		history_end(l->hist);
	l->el = NULL;
	l->hist = NULL;
	nxc_reader_free(&l->rd);
	free(l->buf);
	l->buf = NULL;
}

/* Each line typed is kept at once, so a crash or a second window loses none. */
static void remember(struct nxc_line *l, const char *s)
{
	HistEvent ev;
	if (!*s)
		return;
	history(l->hist, &ev, H_ENTER, s);
	if (l->hist_path[0])
		history(l->hist, &ev, H_SAVE, l->hist_path);
}

static int edited_line(struct nxc_line *l, char **line, size_t *len)
{
	int n = 0;
	/* el_gets prints the prompt before it leaves cooked mode; keys typed
	 * in between would be echoed twice, a Ctrl-D would arrive as a NUL. */
	el_set(l->el, EL_PREP_TERM, 1);
	const char *s = el_gets(l->el, &n);
	if (!s && n < 0 && nxc_interrupts) {
		fputc('\n', stdout); /* the abandoned line stays on the screen, the next prompt below it */
		return -2;
	}
	if (!s || n <= 0)
		return n < 0 ? -1 : 0;
	size_t k = (size_t)n;
	if (k && s[k - 1] == '\n')
		k--;
	char *b = realloc(l->buf, k + 1);
	if (!b)
		return -1;
	memcpy(b, s, k);
	b[k] = '\0';
	l->buf = b;
	remember(l, b);
	*line = b;
	*len = k;
	return 1;
}

int nxc_line_read(struct nxc_line *l, const char *prompt, char **line, size_t *len)
{
	if (l->el) {
		l->prompt = prompt;
		return edited_line(l, line, len);
	}
	if (l->tty) {
		fputs(prompt, stdout);
		fflush(stdout);
	}
	int k = nxc_read_line(&l->rd, line, len);
	if (k == 1 && *len && (*line)[*len - 1] == '\r')
		(*line)[--*len] = '\0';
	return k;
}
