/* gguf-dump.c - print a GGUF file's version, metadata and tensor table, or the reason it is rejected. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "model/gguf.h"

#define MAX_SHOWN_ELEMS 8   /* array elements printed before "..." */
#define MAX_SHOWN_CHARS 120 /* string bytes printed before "..." */

/* Prints up to max bytes of a string from the file, escaping what a terminal
 * would interpret; returns the columns used. */
static int print_esc(const char *p, uint64_t len, uint64_t max)
{
	int cols = 0;
	for (uint64_t i = 0; i < len && i < max; i++) {
		unsigned char c = (unsigned char)p[i];
		if (c == '"' || c == '\\')
			cols += printf("\\%c", c);
		else if (c == '\n')
			cols += printf("\\n");
		else if (c == '\t')
			cols += printf("\\t");
		else if (c < 0x20 || c == 0x7f)
			cols += printf("\\x%02x", c);
		else
			cols += putchar(c) != EOF; /* UTF-8 passes through */
	}
	if (len > max)
		cols += printf("...(%" PRIu64 " bytes)", len);
	return cols;
}

static void print_str(const char *p, uint64_t len)
{
	putchar('"');
	print_esc(p, len, MAX_SHOWN_CHARS);
	putchar('"');
}

static void print_value(const struct gguf_value *v)
{
	switch (v->type) {
	case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64:
		printf("%" PRIu64, v->u64);
		break;
	case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
		printf("%" PRId64, v->i64);
		break;
	case GGUF_F32: case GGUF_F64:
		printf("%.9g", v->f64);
		break;
	case GGUF_BOOL:
		fputs(v->u64 ? "true" : "false", stdout);
		break;
	case GGUF_STRING:
		print_str(v->str.p, v->str.len);
		break;
	case GGUF_ARRAY: {
		struct gguf_arr_iter it;
		struct gguf_value e;
		printf("[%s x %" PRIu64 "] [", gguf_vtype_name(v->arr.type), v->arr.n);
		gguf_arr_iter_init(&it, v);
		while (it.i < MAX_SHOWN_ELEMS && gguf_arr_next(&it, &e)) {
			if (it.i > 1)
				fputs(", ", stdout);
			print_value(&e);
		}
		if (v->arr.n > MAX_SHOWN_ELEMS)
			fputs(", ...", stdout);
		putchar(']');
		break;
	}
	}
}

int main(int argc, char **argv)
{
	struct gguf_mapped m;
	struct nx_err err;
	const struct gguf_file *g;

	if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fprintf(stderr, "usage: gguf-dump FILE\n");
		return 2;
	}
	if (gguf_open(&m, argv[1], &err)) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	g = &m.g;
	printf("GGUF version %" PRIu32 ", %zu bytes, alignment %" PRIu64 ", data at %" PRIu64 "\n",
	       g->version, g->size, g->alignment, g->data_offset);

	printf("metadata: %" PRIu64 " keys\n", g->n_kv);
	for (uint64_t i = 0; i < g->n_kv; i++) {
		const struct gguf_kv *kv = &g->kv[i];
		fputs("  ", stdout);
		print_esc(kv->key.p, kv->key.len, 256);
		printf(": %s = ", gguf_vtype_name(kv->val.type));
		print_value(&kv->val);
		putchar('\n');
	}

	printf("tensors: %" PRIu64 "\n", g->n_tensors);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->tensors[i];
		printf("  %5" PRIu64 " ", i);
		for (int cols = print_esc(t->name.p, t->name.len, 256); cols < 32; cols++)
			putchar(' ');
		printf(" %-5s [", nx_type_name(t->type));
		for (uint32_t d = 0; d < t->n_dims; d++)
			printf(d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
		printf("] offset %" PRIu64 " size %" PRIu64 "\n", t->offset, t->size);
	}
	gguf_close(&m);
	return 0;
}
