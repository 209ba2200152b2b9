/* nx-tokenize - tokenize stdin with a GGUF model's vocabulary, or detokenize ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "tok/tokenizer.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: nx-tokenize MODEL.gguf [--special] [--ids] [--add-bos] < text\n"
		"       nx-tokenize MODEL.gguf --detok [--special] [--keep-space] < ids\n"
		"       nx-tokenize MODEL.gguf --info\n"
		"  (default)     one token per line: id and its piece, escaped\n"
		"  --ids         the ids only, space separated, on one line\n"
		"  --special     match control-token texts in the input / print control tokens\n"
		"  --add-bos     prepend BOS when the model asks for it\n"
		"  --detok       read whitespace-separated ids, print the text\n"
		"  --keep-space  with --detok: keep the leading space SentencePiece adds\n"
		"  --info        print the tokenizer's kind, pre-tokenizer and special ids\n");
}

static char *read_all(FILE *f, size_t *len)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		if (n == cap) {
			char *b = realloc(buf, cap *= 2);
			if (!b)
				break;
			buf = b;
		}
		size_t k = fread(buf + n, 1, cap - n, f);
		n += k;
		if (k == 0) {
			if (ferror(f))
				break;
			*len = n;
			return buf;
		}
	}
	free(buf);
	return NULL;
}

static void print_escaped(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		if (c == '\\' || c == '\'')
			printf("\\%c", c);
		else if (c == '\n')
			printf("\\n");
		else if (c == '\t')
			printf("\\t");
		else if (c < 0x20 || c == 0x7F)
			printf("\\x%02x", c);
		else
			putchar(c);
	}
}

static int do_detok(const struct nx_tok *t, const char *in, size_t len, unsigned flags)
{
	struct nx_detok d;
	struct nx_err err;
	size_t cap = nx_detok_bound(t), n;
	char *out = malloc(cap);
	if (!out)
		return 1;
	nx_detok_init(&d, t, flags);
	const char *p = in, *end = in + len;
	while (p < end) {
		while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ','))
			p++;
		if (p == end)
			break;
		char num[24];
		size_t k = 0;
		while (p < end && k + 1 < sizeof(num) && !strchr(" \n\t\r,", *p))
			num[k++] = *p++;
		num[k] = 0;
		char *e;
		errno = 0;
		long v = strtol(num, &e, 10);
		if (*e || errno || v < INT32_MIN || v > INT32_MAX) {
			fprintf(stderr, "nx-tokenize: not a token id: '%s'\n", num);
			free(out);
			return 1;
		}
		if (nx_detok_push(&d, (int32_t)v, out, cap, &n, &err)) {
			fprintf(stderr, "nx-tokenize: %s\n", err.msg);
			free(out);
			return 1;
		}
		fwrite(out, 1, n, stdout);
	}
	n = nx_detok_flush(&d, out, cap);
	fwrite(out, 1, n, stdout);
	free(out);
	return 0;
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	bool special = false, ids = false, detok = false, keep_space = false, add_bos = false, info = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--special"))
			special = true;
		else if (!strcmp(argv[i], "--ids"))
			ids = true;
		else if (!strcmp(argv[i], "--detok"))
			detok = true;
		else if (!strcmp(argv[i], "--keep-space"))
			keep_space = true;
		else if (!strcmp(argv[i], "--add-bos"))
			add_bos = true;
		else if (!strcmp(argv[i], "--info"))
			info = true;
		else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage();
			return 0;
		} else if (argv[i][0] == '-' || path) {
			usage();
			return 2;
		} else
			path = argv[i];
	}
	if (!path) {
		usage();
		return 2;
	}

	struct nx_err err;
	struct gguf_mapped m;
	struct nx_tok *t;
	if (gguf_open(&m, path, &err)) {
		fprintf(stderr, "nx-tokenize: %s: %s\n", path, err.msg);
		return 1;
	}
	if (nx_tok_load(&t, &m.g, &err)) {
		fprintf(stderr, "nx-tokenize: %s: %s\n", path, err.msg);
		gguf_close(&m);
		return 1;
	}
	gguf_close(&m); /* the tokenizer keeps its own copy */

	int rc = 0;
	if (info) {
		printf("kind %s\npre %s\nn_vocab %d\nbos %d\neos %d\neot %d\nadd_bos %d\nadd_space_prefix %d\n",
		       nx_tok_kind(t) == NX_TOK_BPE ? "bpe" : "spm", nx_tok_pre_name(t), nx_tok_n_vocab(t), nx_tok_bos(t),
		       nx_tok_eos(t), nx_tok_eot(t), nx_tok_add_bos(t), nx_tok_add_space_prefix(t));
		nx_tok_free(t);
		return 0;
	}

	size_t len;
	char *in = read_all(stdin, &len);
	if (!in) {
		fprintf(stderr, "nx-tokenize: reading stdin failed\n");
		nx_tok_free(t);
		return 1;
	}
	if (detok) {
		rc = do_detok(t, in, len, (special ? NX_DETOK_SPECIAL : 0) | (keep_space ? 0 : NX_DETOK_STRIP));
	} else {
		/* a token mostly covers a byte or more; when not, encode says how many it needs */
		size_t cap = len + 2, n = 0, off = add_bos && nx_tok_add_bos(t) ? 1 : 0;
		int32_t *out = malloc((cap + off) * sizeof(int32_t));
		int erc = out ? nx_tok_encode(t, in, len, special, out + off, cap, &n, &err) : -1;
		if (out && erc && n > cap) {
			int32_t *o2 = realloc(out, (n + off) * sizeof(int32_t));
			if (o2) {
				out = o2;
				cap = n;
				erc = nx_tok_encode(t, in, len, special, out + off, cap, &n, &err);
			}
		}
		if (out && off)
			out[0] = nx_tok_bos(t);
		if (!out || erc) {
			fprintf(stderr, "nx-tokenize: %s\n", out ? err.msg : "out of memory");
			rc = 1;
		} else {
			n += off;
			for (size_t i = 0; i < n; i++) {
				if (ids) {
					printf(i ? " %d" : "%d", out[i]);
				} else {
					size_t pl;
					const char *p = nx_tok_piece(t, out[i], true, &pl);
					printf("%d '", out[i]);
					print_escaped(p, pl);
					printf("'\n");
				}
			}
			if (ids)
				printf("\n");
		}
		free(out);
	}
	free(in);
	nx_tok_free(t);
	return rc;
}
