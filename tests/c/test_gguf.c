/* test_gguf.c - the GGUF reader against hand-built good and hostile files (docs/reliability.md 1-10). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"

/* --- a small GGUF writer ------------------------------------------------------ */

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void w_u8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static void w_u16(struct buf *b, uint16_t v) { put(b, &v, 2); }
static void w_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void w_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void w_f32(struct buf *b, float v) { put(b, &v, 4); }
static void w_f64(struct buf *b, double v) { put(b, &v, 8); }

static void w_str(struct buf *b, const char *s)
{
	w_u64(b, strlen(s));
	put(b, s, strlen(s));
}

static void w_hdr(struct buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	put(b, "GGUF", 4);
	w_u32(b, version);
	w_u64(b, n_tensors);
	w_u64(b, n_kv);
}

/* key and value type; the caller writes the value */
static void w_kv(struct buf *b, const char *key, uint32_t type)
{
	w_str(b, key);
	w_u32(b, type);
}

static void kv_u32(struct buf *b, const char *key, uint32_t v)
{
	w_kv(b, key, GGUF_U32);
	w_u32(b, v);
}

static void kv_str(struct buf *b, const char *key, const char *v)
{
	w_kv(b, key, GGUF_STRING);
	w_str(b, v);
}

static void w_tinfo(struct buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
		    uint64_t offset)
{
	w_str(b, name);
	w_u32(b, n_dims);
	for (uint32_t d = 0; d < n_dims && d < 4; d++) /* hostile n_dims: write what the spec has */
		w_u64(b, ne[d]);
	w_u32(b, type);
	w_u64(b, offset);
}

static void w_pad(struct buf *b, size_t align)
{
	while (b->n % align)
		w_u8(b, 0);
}

static void w_zeros(struct buf *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		w_u8(b, (uint8_t)(i * 7));
}

struct tspec {
	const char *name;
	uint32_t n_dims;
	uint64_t ne[4];
	uint32_t type;
	uint64_t offset;
};

/* A file with one kv (general.architecture), an optional general.alignment,
 * the given tensor infos, padding and data_bytes of data. */
static void file_with_tensors(struct buf *b, const struct tspec *t, int n, uint64_t data_bytes, uint32_t align)
{
	w_hdr(b, 3, (uint64_t)n, align ? 2 : 1);
	kv_str(b, "general.architecture", "llama");
	if (align)
		kv_u32(b, "general.alignment", align);
	for (int i = 0; i < n; i++)
		w_tinfo(b, t[i].name, t[i].n_dims, t[i].ne, t[i].type, t[i].offset);
	w_pad(b, align ? align : 32);
	w_zeros(b, data_bytes);
}

/* A small valid file: 3 kvs and 2 tensors, ending exactly at the last tensor byte. */
static void small_valid(struct buf *b)
{
	w_hdr(b, 3, 2, 3);
	kv_str(b, "general.architecture", "llama");
	kv_u32(b, "llama.block_count", 2);
	w_kv(b, "tokenizer.ggml.tokens", GGUF_ARRAY);
	w_u32(b, GGUF_STRING);
	w_u64(b, 3);
	w_str(b, "a");
	w_str(b, "bc");
	w_str(b, "");
	w_tinfo(b, "a", 1, (uint64_t[]){ 8 }, NX_F32, 0);            /* 32 bytes */
	w_tinfo(b, "b", 2, (uint64_t[]){ 32, 2 }, NX_Q8_0, 32);      /* 2 * 34 bytes */
	w_pad(b, 32);
	w_zeros(b, 32 + 68);
}

/* Every value type, nested arrays and an empty array; no tensors. */
static void every_type(struct buf *b)
{
	w_hdr(b, 2, 0, 22);
	w_kv(b, "t.u8", GGUF_U8); w_u8(b, 255);
	w_kv(b, "t.i8", GGUF_I8); w_u8(b, 0x80);
	w_kv(b, "t.u16", GGUF_U16); w_u16(b, 65535);
	w_kv(b, "t.i16", GGUF_I16); w_u16(b, 0x8000);
	w_kv(b, "t.u32", GGUF_U32); w_u32(b, UINT32_MAX);
	w_kv(b, "t.i32", GGUF_I32); w_u32(b, 0x80000000u);
	w_kv(b, "t.f32", GGUF_F32); w_f32(b, 1.5f);
	w_kv(b, "t.bool", GGUF_BOOL); w_u8(b, 1);
	kv_str(b, "t.string", "hello, gguf");
	w_kv(b, "t.u64", GGUF_U64); w_u64(b, UINT64_MAX);
	w_kv(b, "t.i64", GGUF_I64); w_u64(b, (uint64_t)INT64_MIN);
	w_kv(b, "t.f64", GGUF_F64); w_f64(b, -2.25);
	w_kv(b, "t.small_i64", GGUF_I64); w_u64(b, 7);
	w_kv(b, "t.neg_i32", GGUF_I32); w_u32(b, (uint32_t)-5);
	/* arrays */
	w_kv(b, "a.u8", GGUF_ARRAY); w_u32(b, GGUF_U8); w_u64(b, 3); w_u8(b, 1); w_u8(b, 2); w_u8(b, 3);
	w_kv(b, "a.i16", GGUF_ARRAY); w_u32(b, GGUF_I16); w_u64(b, 2); w_u16(b, (uint16_t)-300); w_u16(b, 300);
	w_kv(b, "a.f32", GGUF_ARRAY); w_u32(b, GGUF_F32); w_u64(b, 2); w_f32(b, 0.25f); w_f32(b, -8.0f);
	w_kv(b, "a.bool", GGUF_ARRAY); w_u32(b, GGUF_BOOL); w_u64(b, 2); w_u8(b, 0); w_u8(b, 1);
	w_kv(b, "a.str", GGUF_ARRAY); w_u32(b, GGUF_STRING); w_u64(b, 3);
	w_str(b, "x"); w_str(b, ""); w_str(b, "yz");
	w_kv(b, "a.empty", GGUF_ARRAY); w_u32(b, GGUF_U64); w_u64(b, 0);
	/* [[1, 2], [], [3]] */
	w_kv(b, "a.nested", GGUF_ARRAY); w_u32(b, GGUF_ARRAY); w_u64(b, 3);
	w_u32(b, GGUF_U32); w_u64(b, 2); w_u32(b, 1); w_u32(b, 2);
	w_u32(b, GGUF_U32); w_u64(b, 0);
	w_u32(b, GGUF_U32); w_u64(b, 1); w_u32(b, 3);
	/* [["p", "qq"], [["deep"]]] : arrays of strings and of arrays */
	w_kv(b, "a.nested_str", GGUF_ARRAY); w_u32(b, GGUF_ARRAY); w_u64(b, 2);
	w_u32(b, GGUF_STRING); w_u64(b, 2); w_str(b, "p"); w_str(b, "qq");
	w_u32(b, GGUF_ARRAY); w_u64(b, 1);
	w_u32(b, GGUF_STRING); w_u64(b, 1); w_str(b, "deep");
}

/* --- assertions --------------------------------------------------------------- */

/* Parses from an exact-size heap copy (so a sanitizer sees any over-read) and
 * checks it fails with a message containing needle. */
static void expect_fail(const struct buf *b, const char *needle)
{
	struct gguf_file g;
	struct nx_err err = { { 0 } };
	uint8_t *c = malloc(b->n ? b->n : 1);
	int rc;
	assert_non_null(c);
	if (b->n)
		memcpy(c, b->p, b->n);
	rc = gguf_parse(&g, c, b->n, &err);
	free(c);
	if (rc != -1 || !strstr(err.msg, needle) || strncmp(err.msg, "gguf: ", 6))
		fail_msg("expected failure mentioning \"%s\", got rc=%d msg=\"%s\"", needle, rc, err.msg);
	assert_null(g.kv);
	assert_null(g.tensors);
}

static void expect_ok(struct gguf_file *g, const struct buf *b)
{
	struct nx_err err = { { 0 } };
	if (gguf_parse(g, b->p, b->n, &err))
		fail_msg("expected success, got \"%s\"", err.msg);
}

static void buf_free(struct buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* Overwrites bytes at off (for corrupting a valid file in place). */
static void poke(struct buf *b, size_t off, const void *d, size_t n)
{
	assert_true(off + n <= b->n);
	memcpy(b->p + off, d, n);
}

/* --- 1. magic, version, byte order -------------------------------------------- */

static void test_magic(void **s)
{
	struct buf b = { 0 };
	small_valid(&b);
	poke(&b, 0, "GGUG", 4);
	expect_fail(&b, "bad magic");
	buf_free(&b);

	expect_fail(&b, "empty file");
	w_u8(&b, 'G');
	expect_fail(&b, "(magic)");
	buf_free(&b);
}

static void test_version(void **s)
{
	uint32_t bad[] = { 0, 1, 4, 99, 0xffffffffu };
	const char *want[] = { "version 0", "version 1", "version 4", "version 99", "version 4294967295" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct buf b = { 0 };
		small_valid(&b);
		poke(&b, 4, &bad[i], 4);
		expect_fail(&b, want[i]);
		buf_free(&b);
	}
	/* version 2 parses like 3 */
	struct buf b = { 0 };
	struct gguf_file g;
	small_valid(&b);
	poke(&b, 4, &(uint32_t){ 2 }, 4);
	expect_ok(&g, &b);
	assert_int_equal(g.version, 2);
	gguf_free(&g);
	buf_free(&b);
}

static void test_byte_swapped(void **s)
{
	uint32_t swapped[] = { 0x03000000u, 0x02000000u };
	for (int i = 0; i < 2; i++) {
		struct buf b = { 0 };
		small_valid(&b);
		poke(&b, 4, &swapped[i], 4);
		expect_fail(&b, "big-endian/byte-swapped GGUF not supported");
		buf_free(&b);
	}
}

/* --- 2. counts ----------------------------------------------------------------- */

static void test_counts(void **s)
{
	uint64_t bad[] = { UINT64_MAX, INT64_MAX, SIZE_MAX / 8, 1u << 20 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct buf b = { 0 };
		char want[96];
		small_valid(&b);
		poke(&b, 8, &bad[i], 8);
		snprintf(want, sizeof(want), "n_tensors %" PRIu64 " exceeds what a %zu-byte file can hold", bad[i], b.n);
		expect_fail(&b, want);
		buf_free(&b);

		small_valid(&b);
		poke(&b, 16, &bad[i], 8);
		snprintf(want, sizeof(want), "n_kv %" PRIu64 " exceeds what a %zu-byte file can hold", bad[i], b.n);
		expect_fail(&b, want);
		buf_free(&b);
	}
	/* each alone fits, together they do not */
	struct buf b = { 0 };
	w_hdr(&b, 3, 3, 4);
	w_zeros(&b, 3 * 33 + 2 * 14);
	expect_fail(&b, "together exceed");
	buf_free(&b);
	/* more keys than present: runs into the end */
	w_hdr(&b, 3, 0, 3);
	kv_u32(&b, "k.a", 1);
	kv_u32(&b, "k.b", 2);
	w_zeros(&b, 14);
	expect_fail(&b, "key 2 of 3");
	buf_free(&b);
}

/* --- 3. strings ----------------------------------------------------------------- */

static void test_string_lengths(void **s)
{
	struct buf b = { 0 };

	/* key length 2^64-1 */
	w_hdr(&b, 3, 0, 1);
	w_u64(&b, UINT64_MAX);
	w_zeros(&b, 40);
	expect_fail(&b, "key 0 of 1: key length 18446744073709551615 runs past end of file");
	buf_free(&b);

	/* value string longer than the file */
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "general.name", GGUF_STRING);
	w_u64(&b, 100);
	put(&b, "short", 5);
	expect_fail(&b, "key 'general.name': string length 100 runs past end of file (5 bytes left");
	buf_free(&b);

	/* tiny file declaring a 1 GiB string */
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "general.name", GGUF_STRING);
	w_u64(&b, 1ull << 30);
	expect_fail(&b, "string length 1073741824 runs past end of file");
	buf_free(&b);

	/* a 2^64-1 string inside a string array names the element */
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "tokenizer.ggml.tokens", GGUF_ARRAY);
	w_u32(&b, GGUF_STRING);
	w_u64(&b, 3);
	w_str(&b, "ok");
	w_u64(&b, UINT64_MAX);
	w_zeros(&b, 16);
	expect_fail(&b, "key 'tokenizer.ggml.tokens' element 1 of 3: string length 18446744073709551615");
	buf_free(&b);

	/* tensor name length */
	w_hdr(&b, 3, 1, 0);
	w_u64(&b, UINT64_MAX);
	w_zeros(&b, 40);
	expect_fail(&b, "tensor 0 of 1: tensor name length 18446744073709551615 runs past end of file");
	buf_free(&b);

	/* empty key and tensor names */
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "", GGUF_U8);
	w_u8(&b, 1);
	w_zeros(&b, 8);
	expect_fail(&b, "key 0 of 1: empty key name");
	buf_free(&b);
	file_with_tensors(&b, &(struct tspec){ "", 1, { 8 }, NX_F32, 0 }, 1, 32, 0);
	expect_fail(&b, "tensor 0 of 1: empty tensor name");
	buf_free(&b);

	/* names from the file are escaped in messages */
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "bad\n\x1b[31mkey", GGUF_STRING);
	w_u64(&b, 1000);
	expect_fail(&b, "key 'bad\\x0a\\x1b[31mkey'");
	buf_free(&b);
}

/* --- 4. arrays, value types, duplicates --------------------------------------------- */

static void test_array_counts(void **s)
{
	struct buf b = { 0 };
	uint32_t types[] = { GGUF_U8, GGUF_U64, GGUF_STRING, GGUF_ARRAY, GGUF_BOOL };
	uint64_t counts[] = { UINT64_MAX, 1ull << 61, (1ull << 62) + 1, 1000 };
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		for (size_t j = 0; j < sizeof(counts) / sizeof(counts[0]); j++) {
			char want[128];
			w_hdr(&b, 3, 0, 1);
			w_kv(&b, "a.big", GGUF_ARRAY);
			w_u32(&b, types[i]);
			w_u64(&b, counts[j]);
			w_zeros(&b, 64);
			snprintf(want, sizeof(want), "key 'a.big': array count %" PRIu64 " of %s exceeds",
				 counts[j], gguf_vtype_name(types[i]));
			expect_fail(&b, want);
			buf_free(&b);
		}
	}
	/* a nested array whose inner count is huge names both levels */
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "a.nest", GGUF_ARRAY);
	w_u32(&b, GGUF_ARRAY);
	w_u64(&b, 2);
	w_u32(&b, GGUF_U8); w_u64(&b, 1); w_u8(&b, 9);
	w_u32(&b, GGUF_U32); w_u64(&b, UINT64_MAX / 2);
	w_zeros(&b, 8);
	expect_fail(&b, "key 'a.nest' element 1 of 2: array count 9223372036854775807 of u32 exceeds");
	buf_free(&b);
}

static void test_nested_arrays(void **s)
{
	struct buf b = { 0 };
	struct gguf_file g;
	const struct gguf_value *v;
	struct gguf_arr_iter it, in;
	struct gguf_value e, x;
	uint32_t want_n[] = { 2, 0, 1 };
	uint32_t want_v[] = { 1, 2, 3 };
	int k = 0;

	every_type(&b);
	expect_ok(&g, &b);
	assert_int_equal(gguf_get_arr(&g, "a.nested", GGUF_ARRAY, &v, true, NULL), 0);
	assert_int_equal(v->arr.n, 3);
	gguf_arr_iter_init(&it, v);
	for (int i = 0; gguf_arr_next(&it, &e); i++) {
		assert_int_equal(e.type, GGUF_ARRAY);
		assert_int_equal(e.arr.type, GGUF_U32);
		assert_int_equal(e.arr.n, want_n[i]);
		assert_int_equal(e.arr.bytes, 4 * want_n[i]);
		gguf_arr_iter_init(&in, &e);
		while (gguf_arr_next(&in, &x)) {
			assert_int_equal(x.type, GGUF_U32);
			assert_int_equal(x.u64, want_v[k++]);
		}
	}
	assert_int_equal(k, 3);

	/* [["p", "qq"], [["deep"]]] */
	assert_int_equal(gguf_get_arr(&g, "a.nested_str", GGUF_ARRAY, &v, true, NULL), 0);
	gguf_arr_iter_init(&it, v);
	assert_true(gguf_arr_next(&it, &e));
	assert_int_equal(e.arr.type, GGUF_STRING);
	struct gguf_str strs[2];
	assert_int_equal(gguf_arr_strings(&e, strs), 0);
	assert_int_equal(strs[0].len, 1);
	assert_memory_equal(strs[0].p, "p", 1);
	assert_int_equal(strs[1].len, 2);
	assert_memory_equal(strs[1].p, "qq", 2);
	assert_true(gguf_arr_next(&it, &e));
	assert_int_equal(e.arr.type, GGUF_ARRAY);
	gguf_arr_iter_init(&in, &e);
	assert_true(gguf_arr_next(&in, &x));
	assert_int_equal(x.arr.type, GGUF_STRING);
	assert_int_equal(gguf_arr_strings(&x, strs), 0);
	assert_int_equal(strs[0].len, 4);
	assert_memory_equal(strs[0].p, "deep", 4);
	assert_false(gguf_arr_next(&in, &x));
	assert_false(gguf_arr_next(&it, &e));
	gguf_free(&g);
	buf_free(&b);

	/* nesting deeper than GGUF_MAX_NEST is refused, at the limit it parses */
	for (int depth = GGUF_MAX_NEST; depth <= GGUF_MAX_NEST + 1; depth++) {
		w_hdr(&b, 3, 0, 1);
		w_kv(&b, "a.deep", GGUF_ARRAY);
		for (int d = 1; d < depth; d++) {
			w_u32(&b, GGUF_ARRAY);
			w_u64(&b, 1);
		}
		w_u32(&b, GGUF_U8);
		w_u64(&b, 1);
		w_u8(&b, 42);
		if (depth == GGUF_MAX_NEST) {
			expect_ok(&g, &b);
			gguf_free(&g);
		} else {
			expect_fail(&b, "arrays nested deeper than");
		}
		buf_free(&b);
	}
}

static void test_value_types(void **s)
{
	struct buf b = { 0 };
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "x.weird", 13);
	w_u64(&b, 0);
	expect_fail(&b, "key 'x.weird': unknown value type 13");
	buf_free(&b);

	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "x.weird", 0xffffffffu);
	w_u64(&b, 0);
	expect_fail(&b, "unknown value type 4294967295");
	buf_free(&b);

	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "x.arr", GGUF_ARRAY);
	w_u32(&b, 77);
	w_u64(&b, 1);
	w_u64(&b, 0);
	expect_fail(&b, "key 'x.arr': unknown array element type 77");
	buf_free(&b);

	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "x.flag", GGUF_BOOL);
	w_u8(&b, 2);
	expect_fail(&b, "key 'x.flag': bool value 2 is not 0 or 1");
	buf_free(&b);

	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "x.flags", GGUF_ARRAY);
	w_u32(&b, GGUF_BOOL);
	w_u64(&b, 3);
	w_u8(&b, 0);
	w_u8(&b, 1);
	w_u8(&b, 255);
	expect_fail(&b, "key 'x.flags' element 2 of 3: bool value 255");
	buf_free(&b);
}

static void test_duplicates(void **s)
{
	struct buf b = { 0 };
	w_hdr(&b, 3, 0, 3);
	kv_u32(&b, "llama.block_count", 30);
	kv_str(&b, "general.architecture", "llama");
	kv_str(&b, "llama.block_count", "thirty");
	expect_fail(&b, "duplicate key 'llama.block_count' (keys 0 and 2)");
	buf_free(&b);

	struct tspec t[] = {
		{ "blk.0.attn_q.weight", 1, { 8 }, NX_F32, 0 },
		{ "output_norm.weight", 1, { 8 }, NX_F32, 32 },
		{ "blk.0.attn_q.weight", 1, { 8 }, NX_F32, 64 },
	};
	file_with_tensors(&b, t, 3, 96, 0);
	expect_fail(&b, "duplicate tensor name 'blk.0.attn_q.weight' (tensors 0 and 2)");
	buf_free(&b);

	/* a key that is a prefix of another is not a duplicate */
	w_hdr(&b, 3, 0, 2);
	kv_u32(&b, "a.b", 1);
	kv_u32(&b, "a.bc", 2);
	struct gguf_file g;
	uint32_t v;
	expect_ok(&g, &b);
	assert_int_equal(gguf_get_u32(&g, "a.b", &v, true, NULL), 0);
	assert_int_equal(v, 1);
	assert_int_equal(gguf_get_u32(&g, "a.bc", &v, true, NULL), 0);
	assert_int_equal(v, 2);
	assert_null(gguf_get(&g, "a."));
	assert_null(gguf_get(&g, "a.bcd"));
	gguf_free(&g);
	buf_free(&b);
}

/* --- 5. alignment ------------------------------------------------------------------ */

static void test_alignment(void **s)
{
	struct buf b = { 0 };
	struct gguf_file g;
	uint32_t bad[] = { 0, 3, 48, 1u << 31, GGUF_MAX_ALIGNMENT * 2 };
	struct tspec t = { "w", 1, { 8 }, NX_F32, 0 };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[96];
		w_hdr(&b, 3, 1, 1);
		kv_u32(&b, "general.alignment", bad[i]);
		w_tinfo(&b, t.name, 1, t.ne, t.type, 0);
		w_zeros(&b, 64);
		snprintf(want, sizeof(want), "key 'general.alignment': %" PRIu32 " must be a power of two", bad[i]);
		expect_fail(&b, want);
		buf_free(&b);
	}

	w_hdr(&b, 3, 1, 1);
	kv_str(&b, "general.alignment", "32");
	w_tinfo(&b, t.name, 1, t.ne, t.type, 0);
	w_pad(&b, 32);
	w_zeros(&b, 32);
	expect_fail(&b, "key 'general.alignment': expected u32, got string");
	buf_free(&b);

	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "general.alignment", GGUF_U64);
	w_u64(&b, 32);
	expect_fail(&b, "key 'general.alignment': expected u32, got u64");
	buf_free(&b);

	/* a custom alignment moves the data section and is applied to offsets */
	struct tspec t2[] = { { "a", 1, { 8 }, NX_F32, 0 }, { "b", 1, { 8 }, NX_F32, 256 } };
	file_with_tensors(&b, t2, 2, 256 + 32, 256);
	expect_ok(&g, &b);
	assert_int_equal(g.alignment, 256);
	assert_int_equal(g.data_offset % 256, 0);
	assert_ptr_equal(g.tensors[1].data, b.p + g.data_offset + 256);
	gguf_free(&g);
	buf_free(&b);

	/* alignment 1 is legal: data right after the infos */
	file_with_tensors(&b, t2, 1, 32, 1);
	expect_ok(&g, &b);
	assert_int_equal(g.data_offset, b.n - 32);
	gguf_free(&g);
	buf_free(&b);

	/* default 32 */
	small_valid(&b);
	expect_ok(&g, &b);
	assert_int_equal(g.alignment, 32);
	gguf_free(&g);
	buf_free(&b);
}

/* --- 6-8. tensor infos -------------------------------------------------------------- */

static void one_tensor_fails(const struct tspec *t, uint64_t data, const char *want)
{
	struct buf b = { 0 };
	file_with_tensors(&b, t, 1, data, 0);
	expect_fail(&b, want);
	buf_free(&b);
}

static void test_n_dims(void **s)
{
	one_tensor_fails(&(struct tspec){ "blk.0.ffn_up.weight", 5, { 1, 1, 1, 1 }, NX_F32, 0 }, 64,
			 "tensor 'blk.0.ffn_up.weight': n_dims 5 is not between 1 and 4");
	one_tensor_fails(&(struct tspec){ "t", 0xffffffffu, { 1 }, NX_F32, 0 }, 64,
			 "tensor 't': n_dims 4294967295 is not between 1 and 4");
	one_tensor_fails(&(struct tspec){ "t", 0, { 0 }, NX_F32, 0 }, 64, "tensor 't': n_dims 0");
}

static void test_dims(void **s)
{
	one_tensor_fails(&(struct tspec){ "t", 2, { 8, (uint64_t)-1 }, NX_F32, 0 }, 64, "tensor 't': ne[1] is negative (-1)");
	one_tensor_fails(&(struct tspec){ "t", 1, { (uint64_t)INT64_MIN }, NX_F32, 0 }, 64, "ne[0] is negative");
	one_tensor_fails(&(struct tspec){ "t", 3, { 8, 2, 0 }, NX_F32, 0 }, 64, "tensor 't': ne[2] is 0");
	one_tensor_fails(&(struct tspec){ "t", 4, { INT64_MAX, 2, 1, 1 }, NX_F32, 0 }, 64,
			 "tensor 't': shape [9223372036854775807, 2, 1, 1] has more than 2^63-1 elements");
	one_tensor_fails(&(struct tspec){ "t", 2, { 1ull << 32, 1ull << 32 }, NX_F32, 0 }, 64,
			 "has more than 2^63-1 elements");
	one_tensor_fails(&(struct tspec){ "t", 4, { 1u << 16, 1u << 16, 1u << 16, 1u << 16 }, NX_F32, 0 }, 64,
			 "has more than 2^63-1 elements");
	/* fits in elements, but bytes overflow */
	one_tensor_fails(&(struct tspec){ "t", 2, { 1ull << 31, 1ull << 31 }, NX_F32, 0 }, 64,
			 "tensor 't': size of shape [2147483648, 2147483648, 1, 1] in f32 overflows");
	/* 2^42+1 elements of f32: a real size, far past the end of a small file */
	one_tensor_fails(&(struct tspec){ "t", 1, { (1ull << 42) + 1 }, NX_F32, 0 }, 64,
			 "size 17592186044420] runs past end of file");
	/* ... and of q4_1 it is not a whole number of blocks */
	char want[160];
	snprintf(want, sizeof(want), "tensor 't': ne[0] 4398046511105 is not a multiple of the %s block size 32",
		 nx_type_name(NX_Q4_1));
	one_tensor_fails(&(struct tspec){ "t", 1, { (1ull << 42) + 1 }, NX_Q4_1, 0 }, 64, want);
	snprintf(want, sizeof(want), "tensor 'blk.0.attn_k.weight': ne[0] 33 is not a multiple of the %s block size 32",
		 nx_type_name(NX_Q8_0));
	one_tensor_fails(&(struct tspec){ "blk.0.attn_k.weight", 2, { 33, 2 }, NX_Q8_0, 0 }, 64, want);
	snprintf(want, sizeof(want), "ne[0] 128 is not a multiple of the %s block size 256", nx_type_name(NX_Q4_K));
	one_tensor_fails(&(struct tspec){ "t", 1, { 128 }, NX_Q4_K, 0 }, 1024, want);
	/* 4 dims of sane sizes parse, with their size */
	struct buf b = { 0 };
	struct gguf_file g;
	file_with_tensors(&b, &(struct tspec){ "t4", 4, { 32, 2, 3, 4 }, NX_Q4_1, 0 }, 1, 20 * 24, 0);
	expect_ok(&g, &b);
	assert_int_equal(g.tensors[0].size, 20 * 24);
	assert_int_equal(g.tensors[0].ne[3], 4);
	gguf_free(&g);
	buf_free(&b);
	/* unused dims read as 1 */
	file_with_tensors(&b, &(struct tspec){ "t1", 1, { 8 }, NX_F32, 0 }, 1, 32, 0);
	expect_ok(&g, &b);
	assert_int_equal(g.tensors[0].ne[1], 1);
	assert_int_equal(g.tensors[0].ne[3], 1);
	gguf_free(&g);
	buf_free(&b);
}

static void test_tensor_type(void **s)
{
	one_tensor_fails(&(struct tspec){ "t", 1, { 256 }, 99, 0 }, 64, "tensor 't': type 99 is out of range");
	one_tensor_fails(&(struct tspec){ "t", 1, { 256 }, 1000, 0 }, 64, "type 1000 is out of range");
	one_tensor_fails(&(struct tspec){ "t", 1, { 256 }, 0xffffffffu, 0 }, 64, "type 4294967295 is out of range");
	char want[96];
	assert_false(nx_type_supported(16));
	snprintf(want, sizeof(want), "tensor 't': type 16 (%s) is not supported", nx_type_name(16));
	one_tensor_fails(&(struct tspec){ "t", 1, { 256 }, 16, 0 }, 1024, want);
}

/* --- 9. tensor data ranges ----------------------------------------------------------- */

static void test_tensor_data(void **s)
{
	struct buf b = { 0 };
	struct gguf_file g;

	/* overlapping (b starts inside a) */
	struct tspec ov[] = { { "a", 1, { 16 }, NX_F32, 0 }, { "b", 1, { 8 }, NX_F32, 32 } };
	file_with_tensors(&b, ov, 2, 64, 0);
	expect_fail(&b, "tensor 'a' [offset 0, size 64] overlaps tensor 'b' [offset 32, size 32]");
	buf_free(&b);

	/* same offset */
	struct tspec same[] = { { "a", 1, { 8 }, NX_F32, 0 }, { "b", 1, { 8 }, NX_F32, 0 } };
	file_with_tensors(&b, same, 2, 32, 0);
	expect_fail(&b, "overlaps");
	buf_free(&b);

	/* overlap found even when the infos are out of order */
	struct tspec ov2[] = { { "late", 1, { 8 }, NX_F32, 64 }, { "x", 1, { 8 }, NX_F32, 0 }, { "big", 1, { 24 }, NX_F32, 32 } };
	file_with_tensors(&b, ov2, 3, 128, 0);
	expect_fail(&b, "tensor 'big' [offset 32, size 96] overlaps tensor 'late'");
	buf_free(&b);

	/* out of order but disjoint: accepted */
	struct tspec ooo[] = { { "c", 1, { 8 }, NX_F32, 64 }, { "a", 1, { 8 }, NX_F32, 0 }, { "b", 1, { 8 }, NX_F32, 32 } };
	file_with_tensors(&b, ooo, 3, 96, 0);
	expect_ok(&g, &b);
	assert_ptr_equal(gguf_find_tensor(&g, "c")->data, b.p + g.data_offset + 64);
	assert_ptr_equal(gguf_find_tensor(&g, "a"), &g.tensors[1]);
	assert_null(gguf_find_tensor(&g, "d"));
	gguf_free(&g);
	buf_free(&b);

	/* offset not aligned */
	one_tensor_fails(&(struct tspec){ "t", 1, { 8 }, NX_F32, 4 }, 64, "tensor 't': offset 4 is not a multiple of the alignment 32");

	/* past the end by one byte */
	file_with_tensors(&b, &(struct tspec){ "blk.3.attn_q.weight", 1, { 8 }, NX_F32, 0 }, 1, 31, 0);
	char want[160];
	snprintf(want, sizeof(want), "tensor 'blk.3.attn_q.weight': data [offset %zu, size 32] runs past end of file (size %zu)",
		 b.n - 31, b.n);
	expect_fail(&b, want);
	buf_free(&b);

	/* offset far past the end, and offsets that overflow */
	one_tensor_fails(&(struct tspec){ "t", 1, { 8 }, NX_F32, 1ull << 40 }, 64, "runs past end of file");
	one_tensor_fails(&(struct tspec){ "t", 1, { 8 }, NX_F32, UINT64_MAX - 31 }, 64, "tensor 't': data [offset");
	one_tensor_fails(&(struct tspec){ "t", 1, { 8 }, NX_F32, UINT64_MAX - 31 }, 64, "overflows");
	one_tensor_fails(&(struct tspec){ "t", 1, { 1ull << 60 }, NX_F32, UINT64_MAX - 63 }, 64, "overflows");

	/* a tensor ending exactly at the end of the file is fine */
	file_with_tensors(&b, &(struct tspec){ "t", 1, { 8 }, NX_F32, 0 }, 1, 32, 0);
	expect_ok(&g, &b);
	assert_ptr_equal((const uint8_t *)g.tensors[0].data + 32, b.p + b.n);
	gguf_free(&g);
	buf_free(&b);
}

/* --- 10. truncation and mutation ------------------------------------------------------- */

static void truncate_everywhere(const struct buf *full)
{
	for (size_t n = 0; n < full->n; n++) {
		struct gguf_file g;
		struct nx_err err = { { 0 } };
		uint8_t *c = malloc(n ? n : 1); /* exact size: a sanitizer build sees any over-read */
		assert_non_null(c);
		memcpy(c, full->p, n);
		int rc = gguf_parse(&g, c, n, &err);
		free(c);
		if (rc != -1 || strncmp(err.msg, "gguf: ", 6))
			fail_msg("prefix of %zu bytes: rc=%d msg=\"%s\"", n, rc, err.msg);
	}
}

/* Whether some prefix of b fails with a message containing needle. */
static bool some_prefix_says(const struct buf *b, const char *needle)
{
	for (size_t n = 0; n < b->n; n++) {
		struct gguf_file g;
		struct nx_err err = { { 0 } };
		if (gguf_parse(&g, b->p, n, &err) == 0)
			fail_msg("prefix %zu parsed", n);
		if (strstr(err.msg, needle))
			return true;
	}
	print_message("no prefix said \"%s\"\n", needle);
	return false;
}

static void test_truncation(void **s)
{
	struct buf b = { 0 };
	struct gguf_file g;

	small_valid(&b);
	expect_ok(&g, &b);
	gguf_free(&g);
	truncate_everywhere(&b);
	/* the messages name what was being read */
	assert_true(some_prefix_says(&b, "truncated at byte 13 while reading header (n_tensors)"));
	assert_true(some_prefix_says(&b, "while reading tensor 1 of 2 (tensor name length)"));
	assert_true(some_prefix_says(&b, "while reading tensor 'a' (ne[0])"));
	assert_true(some_prefix_says(&b, "while reading tensor 'b' (ne[1])"));
	assert_true(some_prefix_says(&b, "while reading tensor 'b' (type)"));
	assert_true(some_prefix_says(&b, "while reading tensor 'b' (offset)"));
	assert_true(some_prefix_says(&b, "while reading key 'tokenizer.ggml.tokens' element 2 of 3 (string length)"));
	assert_true(some_prefix_says(&b, "while reading key 'tokenizer.ggml.tokens' (array count)"));
	struct buf p = { b.p, b.n - 1, b.n - 1 };
	expect_fail(&p, "tensor 'b': data [offset");
	buf_free(&b);

	/* exact positions: header 24 bytes, key length 8, key 20, type 4, string length 8 */
	w_hdr(&b, 3, 0, 1);
	kv_str(&b, "general.architecture", "llama");
	p = (struct buf){ b.p, 57, 57 };
	expect_fail(&p, "truncated at byte 57 while reading key 'general.architecture' (string length)");
	p.n = 54;
	expect_fail(&p, "truncated at byte 54 while reading key 'general.architecture' (value type)");
	p.n = 40;
	expect_fail(&p, "key 0 of 1: key length 20 runs past end of file (8 bytes left of 40)");
	buf_free(&b);
	w_hdr(&b, 3, 0, 3);
	kv_str(&b, "general.architecture", "llama");  /* 45 bytes */
	kv_u32(&b, "llama.block_count", 2);           /* 33 bytes */
	kv_u32(&b, "llama.context_length", 8);
	p = (struct buf){ b.p, 24 + 45 + 33 + 4, 24 + 45 + 33 + 4 };
	expect_fail(&p, "truncated at byte 106 while reading key 2 of 3 (key length)");
	buf_free(&b);

	every_type(&b);
	expect_ok(&g, &b);
	gguf_free(&g);
	truncate_everywhere(&b);
	assert_true(some_prefix_says(&b, "key 'a.nested_str' element 1 of 2, element 0 of 1: "
				     "array count 1 of string exceeds"));
	assert_true(some_prefix_says(&b, "key 'a.nested_str' element 1 of 2, element 0 of 1, element 0 of 1: "
				     "string length 4 runs past end of file"));
	assert_true(some_prefix_says(&b, "while reading key 'a.nested_str' element 0 of 2, element 1 of 2 "
				     "(string length)"));
	assert_true(some_prefix_says(&b, "while reading key 'a.nested' element 2 of 3 (array count)"));
	assert_true(some_prefix_says(&b, "while reading key 'a.nested_str' (array element type)"));
	buf_free(&b);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static volatile uint8_t sink;

/* Walks every value of a parsed file the way a consumer would. */
static void walk_value(const struct gguf_value *v, int depth)
{
	struct gguf_arr_iter it;
	struct gguf_value e;
	uint64_t n = 0;
	assert_true(depth <= GGUF_MAX_NEST);
	if (v->type != GGUF_ARRAY)
		return;
	gguf_arr_iter_init(&it, v);
	while (gguf_arr_next(&it, &e)) {
		if (e.type == GGUF_STRING) /* touch every byte: a sanitizer build catches a bad range */
			for (uint64_t k = 0; k < e.str.len; k++)
				sink ^= (uint8_t)e.str.p[k];
		walk_value(&e, depth + 1);
		n++;
	}
	assert_int_equal(n, v->arr.n);
	assert_ptr_equal(it.p, v->arr.data + v->arr.bytes);
}

/* Random byte flips of valid files: never a crash, and what parses can be walked. */
static void test_mutations(void **s)
{
	struct buf files[2] = { { 0 }, { 0 } };
	int ok = 0, bad = 0;
	small_valid(&files[0]);
	every_type(&files[1]);
	for (int iter = 0; iter < 20000; iter++) {
		const struct buf *f = &files[iter & 1];
		uint8_t *c = malloc(f->n);
		struct gguf_file g;
		struct nx_err err = { { 0 } };
		assert_non_null(c);
		memcpy(c, f->p, f->n);
		int flips = 1 + (int)(rng() % 3);
		for (int k = 0; k < flips; k++) {
			size_t at = rng() % f->n;
			uint64_t r = rng();
			/* mostly single bit flips, sometimes 0xff / 0x00 runs (big counts) */
			if (r % 4 == 0)
				memset(c + at, (r >> 8) & 1 ? 0xff : 0x00, at + 8 <= f->n ? 8 : f->n - at);
			else
				c[at] ^= (uint8_t)(1u << ((r >> 8) % 8));
		}
		if (gguf_parse(&g, c, f->n, &err) == 0) {
			ok++;
			for (uint64_t i = 0; i < g.n_kv; i++)
				walk_value(&g.kv[i].val, 0);
			for (uint64_t i = 0; i < g.n_tensors; i++) {
				const struct gguf_tensor *t = &g.tensors[i];
				assert_true((const uint8_t *)t->data >= c);
				assert_true((const uint8_t *)t->data + t->size <= c + f->n);
			}
			gguf_free(&g);
		} else {
			bad++;
			assert_true(strncmp(err.msg, "gguf: ", 6) == 0);
		}
		free(c);
	}
	assert_true(ok > 0 && bad > 0);
	buf_free(&files[0]);
	buf_free(&files[1]);
}

/* --- getters ------------------------------------------------------------------------------ */

static void test_getters_roundtrip(void **s)
{
	struct buf b = { 0 };
	struct gguf_file g;
	struct nx_err err = { { 0 } };
	const struct gguf_value *v;
	uint32_t u;
	float f;
	bool bo;
	char *str;

	every_type(&b);
	expect_ok(&g, &b);
	assert_int_equal(g.version, 2);
	assert_int_equal(g.n_kv, 22);
	assert_int_equal(g.n_tensors, 0);

	/* raw values, widened */
	assert_int_equal(gguf_get(&g, "t.u8")->u64, 255);
	assert_int_equal(gguf_get(&g, "t.i8")->i64, -128);
	assert_int_equal(gguf_get(&g, "t.u16")->u64, 65535);
	assert_int_equal(gguf_get(&g, "t.i16")->i64, -32768);
	assert_int_equal(gguf_get(&g, "t.u32")->u64, UINT32_MAX);
	assert_true(gguf_get(&g, "t.i32")->i64 == INT32_MIN);
	assert_true(gguf_get(&g, "t.f32")->f64 == 1.5);
	assert_int_equal(gguf_get(&g, "t.bool")->u64, 1);
	assert_true(gguf_get(&g, "t.u64")->u64 == UINT64_MAX);
	assert_true(gguf_get(&g, "t.i64")->i64 == INT64_MIN);
	assert_true(gguf_get(&g, "t.f64")->f64 == -2.25);
	assert_int_equal(g.kv[0].val.type, GGUF_U8);
	assert_int_equal(g.kv[21].val.type, GGUF_ARRAY);

	/* typed getters */
	assert_int_equal(gguf_get_u32(&g, "t.u8", &u, true, &err), 0);
	assert_int_equal(u, 255);
	assert_int_equal(gguf_get_u32(&g, "t.u32", &u, true, &err), 0);
	assert_int_equal(u, UINT32_MAX);
	assert_int_equal(gguf_get_u32(&g, "t.small_i64", &u, true, &err), 0);
	assert_int_equal(u, 7);
	assert_int_equal(gguf_get_f32(&g, "t.f32", &f, true, &err), 0);
	assert_true(f == 1.5f);
	assert_int_equal(gguf_get_f32(&g, "t.f64", &f, true, &err), 0);
	assert_true(f == -2.25f);
	assert_int_equal(gguf_get_bool(&g, "t.bool", &bo, true, &err), 0);
	assert_true(bo);
	assert_int_equal(gguf_get_str(&g, "t.string", &str, true, &err), 0);
	assert_string_equal(str, "hello, gguf");
	free(str);

	/* arrays */
	assert_int_equal(gguf_get_arr(&g, "a.u8", GGUF_U8, &v, true, &err), 0);
	assert_int_equal(v->arr.n, 3);
	assert_memory_equal(v->arr.data, "\1\2\3", 3);
	assert_int_equal(gguf_get_arr(&g, "a.i16", GGUF_I16, &v, true, &err), 0);
	int16_t i16[2];
	memcpy(i16, v->arr.data, 4);
	assert_int_equal(i16[0], -300);
	assert_int_equal(i16[1], 300);
	assert_int_equal(gguf_get_arr(&g, "a.f32", GGUF_F32, &v, true, &err), 0);
	struct gguf_arr_iter it;
	struct gguf_value e;
	gguf_arr_iter_init(&it, v);
	assert_true(gguf_arr_next(&it, &e) && e.type == GGUF_F32 && e.f64 == 0.25);
	assert_true(gguf_arr_next(&it, &e) && e.f64 == -8.0);
	assert_false(gguf_arr_next(&it, &e));
	assert_int_equal(gguf_get_arr(&g, "a.bool", GGUF_BOOL, &v, true, &err), 0);
	assert_int_equal(v->arr.bytes, 2);
	assert_int_equal(gguf_get_arr(&g, "a.empty", GGUF_U64, &v, true, &err), 0);
	assert_int_equal(v->arr.n, 0);
	gguf_arr_iter_init(&it, v);
	assert_false(gguf_arr_next(&it, &e));
	assert_int_equal(gguf_get_arr(&g, "a.str", GGUF_STRING, &v, true, &err), 0);
	struct gguf_str strs[3];
	assert_int_equal(gguf_arr_strings(v, strs), 0);
	assert_int_equal(strs[0].len, 1);
	assert_memory_equal(strs[0].p, "x", 1);
	assert_int_equal(strs[1].len, 0);
	assert_int_equal(strs[2].len, 2);
	assert_memory_equal(strs[2].p, "yz", 2);
	assert_int_equal(gguf_arr_strings(gguf_get(&g, "a.u8"), strs), -1);

	/* missing keys: optional leaves the output alone, required names the key */
	u = 1234;
	assert_int_equal(gguf_get_u32(&g, "nope", &u, false, &err), 0);
	assert_int_equal(u, 1234);
	str = NULL;
	assert_int_equal(gguf_get_str(&g, "nope", &str, false, &err), 0);
	assert_null(str);
	assert_int_equal(gguf_get_u32(&g, "llama.block_count", &u, true, &err), -1);
	assert_string_equal(err.msg, "gguf: key 'llama.block_count' missing");
	assert_int_equal(gguf_get_arr(&g, "nope", GGUF_U8, &v, true, &err), -1);
	assert_non_null(strstr(err.msg, "'nope' missing"));

	gguf_free(&g);
	assert_null(g.kv);
	buf_free(&b);
}

static void expect_getter_err(int rc, const struct nx_err *err, const char *want)
{
	if (rc != -1 || strcmp(err->msg, want))
		fail_msg("expected \"%s\", got rc=%d \"%s\"", want, rc, err->msg);
}

static void test_getters_wrong_type(void **s)
{
	struct buf b = { 0 };
	struct gguf_file g;
	struct nx_err err;
	const struct gguf_value *v;
	uint32_t u = 77;
	float f;
	bool bo;
	char *str = NULL;

	every_type(&b);
	/* a tokenizer array declared as u8 */
	expect_ok(&g, &b);
	expect_getter_err(gguf_get_arr(&g, "a.u8", GGUF_STRING, &v, true, &err), &err,
			  "gguf: key 'a.u8': expected array of string, got array of u8");
	expect_getter_err(gguf_get_arr(&g, "a.str", GGUF_F32, &v, true, &err), &err,
			  "gguf: key 'a.str': expected array of f32, got array of string");
	expect_getter_err(gguf_get_arr(&g, "t.string", GGUF_STRING, &v, true, &err), &err,
			  "gguf: key 't.string': expected array of string, got string");
	expect_getter_err(gguf_get_u32(&g, "t.string", &u, true, &err), &err,
			  "gguf: key 't.string': expected u32, got string");
	expect_getter_err(gguf_get_u32(&g, "t.f32", &u, true, &err), &err,
			  "gguf: key 't.f32': expected u32, got f32");
	expect_getter_err(gguf_get_u32(&g, "t.bool", &u, true, &err), &err,
			  "gguf: key 't.bool': expected u32, got bool");
	expect_getter_err(gguf_get_u32(&g, "a.u8", &u, true, &err), &err,
			  "gguf: key 'a.u8': expected u32, got array of u8");
	expect_getter_err(gguf_get_u32(&g, "t.neg_i32", &u, true, &err), &err,
			  "gguf: key 't.neg_i32': value -5 (i32) does not fit in u32");
	expect_getter_err(gguf_get_u32(&g, "t.u64", &u, true, &err), &err,
			  "gguf: key 't.u64': value 18446744073709551615 (u64) does not fit in u32");
	expect_getter_err(gguf_get_u32(&g, "t.i64", &u, false, &err), &err,
			  "gguf: key 't.i64': value -9223372036854775808 (i64) does not fit in u32");
	assert_int_equal(u, 77); /* untouched on error */
	expect_getter_err(gguf_get_f32(&g, "t.u32", &f, true, &err), &err,
			  "gguf: key 't.u32': expected f32, got u32");
	expect_getter_err(gguf_get_bool(&g, "t.u8", &bo, true, &err), &err,
			  "gguf: key 't.u8': expected bool, got u8");
	expect_getter_err(gguf_get_str(&g, "a.str", &str, true, &err), &err,
			  "gguf: key 'a.str': expected string, got array of string");
	assert_null(str);
	gguf_free(&g);
	buf_free(&b);

	/* a string with a NUL inside cannot become a C string */
	w_hdr(&b, 3, 0, 1);
	w_kv(&b, "general.name", GGUF_STRING);
	w_u64(&b, 3);
	put(&b, "a\0b", 3);
	expect_ok(&g, &b);
	expect_getter_err(gguf_get_str(&g, "general.name", &str, true, &err), &err,
			  "gguf: key 'general.name': string contains a NUL byte");
	gguf_free(&g);
	buf_free(&b);
}

/* --- files ---------------------------------------------------------------------------- */

static void test_open(void **s)
{
	char dir[] = "/tmp/test_gguf.XXXXXX", path[128];
	struct gguf_mapped m;
	struct nx_err err;
	struct buf b = { 0 };
	int fd;

	assert_non_null(mkdtemp(dir));

	snprintf(path, sizeof(path), "%s/fifo", dir);
	assert_int_equal(mkfifo(path, 0600), 0);
	assert_int_equal(gguf_open(&m, path, &err), -1); /* must not block waiting for a writer */
	assert_non_null(strstr(err.msg, "is a FIFO, not a regular file"));
	unlink(path);

	assert_int_equal(gguf_open(&m, dir, &err), -1);
	assert_non_null(strstr(err.msg, "is a directory, not a regular file"));
	assert_int_equal(gguf_open(&m, "/dev/null", &err), -1);
	assert_non_null(strstr(err.msg, "is a character device, not a regular file"));

	snprintf(path, sizeof(path), "%s/missing.gguf", dir);
	assert_int_equal(gguf_open(&m, path, &err), -1);
	assert_non_null(strstr(err.msg, "cannot open"));

	snprintf(path, sizeof(path), "%s/empty.gguf", dir);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(gguf_open(&m, path, &err), -1);
	assert_non_null(strstr(err.msg, "is an empty file"));

	/* a bad file: the path is named, the map released */
	snprintf(path, sizeof(path), "%s/bad.gguf", dir);
	small_valid(&b);
	poke(&b, 4, &(uint32_t){ 0x03000000u }, 4);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
	close(fd);
	assert_int_equal(gguf_open(&m, path, &err), -1);
	assert_non_null(strstr(err.msg, path));
	assert_non_null(strstr(err.msg, "byte-swapped"));
	assert_null(m.map);
	unlink(path);
	buf_free(&b);

	snprintf(path, sizeof(path), "%s/good.gguf", dir);
	small_valid(&b);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
	close(fd);
	if (gguf_open(&m, path, &err))
		fail_msg("%s", err.msg);
	assert_int_equal(m.map_size, b.n);
	assert_int_equal(m.g.n_tensors, 2);
	assert_memory_equal(gguf_find_tensor(&m.g, "b")->data, b.p + b.n - 68, 68);
	gguf_close(&m);
	assert_null(m.map);
	unlink(path);
	buf_free(&b);

	rmdir(dir);
}

/* The default model (NXD_MODEL), parsed for real. */
static void test_real_model(void **s)
{
	const char *path = getenv("NXD_MODEL");
	struct gguf_mapped m;
	struct nx_err err;
	uint32_t n_layer = 0;
	char *arch = NULL;
	const struct gguf_value *tokens;

	if (!path || !*path) {
		print_message("NXD_MODEL unset: skipping the real-model test\n");
		skip();
	}
	if (gguf_open(&m, path, &err))
		fail_msg("%s", err.msg);
	assert_int_equal(m.g.n_tensors, 272);
	assert_int_equal(gguf_get_u32(&m.g, "llama.block_count", &n_layer, true, &err), 0);
	assert_int_equal(n_layer, 30);
	assert_int_equal(gguf_get_str(&m.g, "general.architecture", &arch, true, &err), 0);
	assert_string_equal(arch, "llama");
	free(arch);
	assert_int_equal(gguf_get_arr(&m.g, "tokenizer.ggml.tokens", GGUF_STRING, &tokens, true, &err), 0);
	assert_int_equal(tokens->arr.n, 49152);
	struct gguf_str *strs = calloc(tokens->arr.n, sizeof(*strs));
	assert_non_null(strs);
	assert_int_equal(gguf_arr_strings(tokens, strs), 0);
	assert_int_equal(strs[0].len, strlen("<|endoftext|>"));
	assert_memory_equal(strs[0].p, "<|endoftext|>", strs[0].len);
	free(strs);
	/* read as floats it is refused, naming both types */
	assert_int_equal(gguf_get_arr(&m.g, "tokenizer.ggml.tokens", GGUF_F32, &tokens, true, &err), -1);
	assert_string_equal(err.msg, "gguf: key 'tokenizer.ggml.tokens': expected array of f32, got array of string");
	const struct gguf_tensor *t = gguf_find_tensor(&m.g, "blk.29.ffn_down.weight");
	assert_non_null(t);
	assert_int_equal(t->n_dims, 2);
	assert_non_null(gguf_find_tensor(&m.g, "token_embd.weight"));

	/* prefixes of the real file fail cleanly (sampled: the whole loop is O(n^2)) */
	size_t meta_end = (size_t)m.g.data_offset;
	for (size_t n = 0; n < m.map_size; n += n < meta_end ? 997 + n / 64 : m.map_size / 7) {
		struct gguf_file g;
		if (gguf_parse(&g, m.map, n, &err) == 0)
			fail_msg("prefix %zu of the model parsed", n);
	}
	gguf_close(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_magic),
		cmocka_unit_test(test_version),
		cmocka_unit_test(test_byte_swapped),
		cmocka_unit_test(test_counts),
		cmocka_unit_test(test_string_lengths),
		cmocka_unit_test(test_array_counts),
		cmocka_unit_test(test_nested_arrays),
		cmocka_unit_test(test_value_types),
		cmocka_unit_test(test_duplicates),
		cmocka_unit_test(test_alignment),
		cmocka_unit_test(test_n_dims),
		cmocka_unit_test(test_dims),
		cmocka_unit_test(test_tensor_type),
		cmocka_unit_test(test_tensor_data),
		cmocka_unit_test(test_truncation),
		cmocka_unit_test(test_mutations),
		cmocka_unit_test(test_getters_roundtrip),
		cmocka_unit_test(test_getters_wrong_type),
		cmocka_unit_test(test_open),
		cmocka_unit_test(test_real_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
