/* test_term.c - nxctl's terminal filter (client/term.c): control characters shown in caret and <U+XXXX> notation, state kept across writes. */
#define _GNU_SOURCE /* vasprintf, open_memstream, in term.c and here */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client/term.c" /* nxctl's objects are not in libnx */

/* Runs the pieces through a filtering nxc_stdout and returns what came out
 * (caller frees). end: nxc_term_end after the last piece. */
static char *filtered(bool json, bool end, const char *const *pieces, int n)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&buf, &len), *saved = stdout;
	stdout = mem;
	struct nxc_term keep = nxc_stdout;
	nxc_stdout.filter = 1;
	nxc_stdout.json = json;
	for (int i = 0; i < n; i++)
		nxc_term_write(&nxc_stdout, pieces[i], strlen(pieces[i]));
	if (end)
		nxc_term_end(&nxc_stdout);
	nxc_stdout = keep;
	stdout = saved;
	fclose(mem);
	return buf;
}

#define CHECK(json, end, want, ...)                                                                 \
	do {                                                                                       \
		const char *p_[] = {__VA_ARGS__};                                                  \
		char *got_ = filtered(json, end, p_, (int)(sizeof(p_) / sizeof(p_[0])));           \
		assert_string_equal(got_, want);                                                   \
		free(got_);                                                                        \
	} while (0)

static void test_controls(void **st)
{
	CHECK(false, true, "^[]0;title^G^[[2J", "\x1b]0;title\x07\x1b[2J");
	CHECK(false, true, "^A^H^K^L^Z^_^?", "\x01\x08\x0b\x0c\x1a\x1f\x7f");
	CHECK(false, true, "a\tb\nc \xc3\xa9 \xf0\x9f\x98\x80 \xc2\xa0", "a\tb\nc \xc3\xa9 \xf0\x9f\x98\x80 \xc2\xa0");
	CHECK(false, true, "<U+0080><U+009B>31m<U+009F>", "\xc2\x80\xc2\x9b" "31m\xc2\x9f");
	CHECK(true, true, "\\u009b\\u007f ^[", "\xc2\x9b\x7f \x1b");
}

static void test_carriage_return(void **st)
{
	CHECK(false, true, "a\r\nb", "a\r\nb");
	CHECK(false, true, "a\r\nb", "a\r", "\nb");       /* "\r\n" cut between two events */
	CHECK(false, true, "a^Mb", "a\r", "b");           /* a bare '\r' would overwrite the line */
	CHECK(false, true, "^M^M\r\n", "\r\r", "\r\n");
	CHECK(false, true, "a^M", "a\r");                 /* the end shows what was held */
	CHECK(false, false, "a", "a\r");                  /* ...and not before */
}

static void test_utf8_across_writes(void **st)
{
	CHECK(false, true, "<U+009B>[2J", "\xc2", "\x9b[2J");
	CHECK(false, true, "\xf0\x9f\x98\x80!", "\xf0", "\x9f\x98", "\x80!");
	CHECK(false, true, "x<E2><82>", "x\xe2\x82"); /* cut short at the end */
	CHECK(false, true, "<FF><C0><C2>A", "\xff\xc0\xc2", "A");
	CHECK(false, true, "<E0><80><80>", "\xe0\x80\x80");         /* overlong */
	CHECK(false, true, "<ED><A0><80>", "\xed\xa0\x80");         /* surrogate */
	CHECK(false, true, "<F4><90><80><80>", "\xf4\x90\x80\x80"); /* past U+10FFFF */
	CHECK(false, true, "<E2>^[", "\xe2\x1b");                   /* a control ends a sequence */
}

static void test_not_filtering(void **st)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&buf, &len), *saved = stdout;
	stdout = mem;
	struct nxc_term t = {.fd = 1, .filter = -1};
	nxc_term_raw(&t);
	nxc_term_write(&t, "\x1b[2J\r\xc2\x9b", 7);
	nxc_term_end(&t);
	stdout = saved;
	fclose(mem);
	assert_int_equal(len, 7);
	assert_memory_equal(buf, "\x1b[2J\r\xc2\x9b", 7);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_controls),
		cmocka_unit_test(test_carriage_return),
		cmocka_unit_test(test_utf8_across_writes),
		cmocka_unit_test(test_not_filtering),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
