/* gguf.c - the validating GGUF v2/v3 reader: parse a byte range, check every field, map files read-only. */
#define _GNU_SOURCE /* qsort_r */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian fields with memcpy; a big-endian host needs byte swaps"
#endif

/* Smallest possible encodings, used to bound counts before allocating:
 * a kv is key length + one key byte + value type + a u8 value; a tensor info is
 * name length + one name byte + n_dims + one dimension + type + offset. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8)
#define MIN_ARRAY_BYTES (4 + 8) /* element type + count */

static const char *const vtype_names[] = {
	[GGUF_U8] = "u8",	[GGUF_I8] = "i8",     [GGUF_U16] = "u16",	[GGUF_I16] = "i16",
	[GGUF_U32] = "u32",	[GGUF_I32] = "i32",   [GGUF_F32] = "f32",	[GGUF_BOOL] = "bool",
	[GGUF_STRING] = "string", [GGUF_ARRAY] = "array", [GGUF_U64] = "u64", [GGUF_I64] = "i64",
	[GGUF_F64] = "f64",
};

const char *gguf_vtype_name(uint32_t t)
{
	return t <= GGUF_F64 ? vtype_names[t] : "?";
}

size_t gguf_vtype_size(enum gguf_vtype t)
{
	switch (t) {
	case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
	case GGUF_U16: case GGUF_I16: return 2;
	case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
	case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
	default: return 0;
	}
}

/* --- messages --------------------------------------------------------------- */

/* Renders a name from the file for a message: at most 80 bytes, anything but
 * printable ASCII as \xNN, so a hostile name cannot forge or garble a log line. */
static const char *show(char *buf, size_t n, const char *p, uint64_t len)
{
	size_t o = 0;
	uint64_t i;
	for (i = 0; i < len && i < 80 && o + 5 < n; i++) {
		unsigned char c = (unsigned char)p[i];
		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
			buf[o++] = (char)c;
		else
			o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
	}
	if (i < len && o + 4 < n) {
		memcpy(buf + o, "...", 3);
		o += 3;
	}
	buf[o] = '\0';
	return buf;
}

/* The reader: a cursor over the file plus where it is, for messages. */
struct rd {
	const uint8_t *b;
	size_t size;
	size_t pos;
	struct nx_err *err;
	const char *sect;	/* "key", "tensor", or NULL in the header */
	uint64_t idx, cnt;
	struct gguf_str name;	/* key / tensor name once read, len 0 before */
	int depth;		/* arrays entered; elem/nelem say which element of each */
	uint64_t elem[GGUF_MAX_NEST], nelem[GGUF_MAX_NEST];
};

static void where(const struct rd *r, char *buf, size_t n)
{
	char nm[400];
	int o;
	if (!r->sect) {
		snprintf(buf, n, "header");
		return;
	}
	if (r->name.len)
		o = snprintf(buf, n, "%s '%s'", r->sect, show(nm, sizeof(nm), r->name.p, r->name.len));
	else
		o = snprintf(buf, n, "%s %" PRIu64 " of %" PRIu64, r->sect, r->idx, r->cnt);
	for (int d = 0; d < r->depth && o >= 0 && (size_t)o < n; d++)
		o += snprintf(buf + o, n - (size_t)o, "%s element %" PRIu64 " of %" PRIu64,
			      d ? "," : "", r->elem[d], r->nelem[d]);
}

static int trunc_err(const struct rd *r, const char *field)
{
	char w[480];
	where(r, w, sizeof(w));
	return nx_errf(r->err, "gguf: truncated at byte %zu while reading %s (%s)", r->size, w, field);
}

/* "gguf: <where>: <message>" */
__attribute__((format(printf, 2, 3))) static int field_err(const struct rd *r, const char *fmt, ...)
{
	char w[480], m[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	where(r, w, sizeof(w));
	return nx_errf(r->err, "gguf: %s: %s", w, m);
}

/* --- primitive reads ---------------------------------------------------------- */

static size_t left(const struct rd *r)
{
	return r->size - r->pos;
}

static int rd_bytes(struct rd *r, void *dst, size_t n, const char *field)
{
	if (left(r) < n) {
		trunc_err(r, field);
		return -1; /* literal, so the compiler sees dst is set on success */
	}
	memcpy(dst, r->b + r->pos, n);
	r->pos += n;
	return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *field)
{
	return rd_bytes(r, v, sizeof(*v), field);
}

static int rd_u64(struct rd *r, uint64_t *v, const char *field)
{
	return rd_bytes(r, v, sizeof(*v), field);
}

/* A GGUF string: u64 length, then the bytes. what names it in messages. */
static int rd_str(struct rd *r, struct gguf_str *s, const char *what)
{
	char field[64];
	uint64_t len;
	snprintf(field, sizeof(field), "%s length", what);
	if (rd_u64(r, &len, field))
		return -1;
	if (len > left(r))
		return field_err(r, "%s length %" PRIu64 " runs past end of file (%zu bytes left of %zu)",
				 what, len, left(r), r->size);
	s->len = len;
	s->p = (const char *)r->b + r->pos;
	r->pos += (size_t)len;
	return 0;
}

/* --- values ----------------------------------------------------------------------- */

/* Widens a fixed-size scalar at p into v (type already set and valid). */
static void decode_scalar(struct gguf_value *v, const uint8_t *p)
{
	union {
		uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
		float f32; uint64_t u64; int64_t i64; double f64;
	} x;
	memcpy(&x, p, gguf_vtype_size(v->type));
	switch (v->type) {
	case GGUF_U8: v->u64 = x.u8; break;
	case GGUF_BOOL: v->u64 = x.u8; break;
	case GGUF_I8: v->i64 = x.i8; break;
	case GGUF_U16: v->u64 = x.u16; break;
	case GGUF_I16: v->i64 = x.i16; break;
	case GGUF_U32: v->u64 = x.u32; break;
	case GGUF_I32: v->i64 = x.i32; break;
	case GGUF_F32: v->f64 = x.f32; break;
	case GGUF_U64: v->u64 = x.u64; break;
	case GGUF_I64: v->i64 = x.i64; break;
	case GGUF_F64: v->f64 = x.f64; break;
	default: break;
	}
}

static int parse_value(struct rd *r, uint32_t type, struct gguf_value *out);

/* An array: element type, count, elements. Counts are checked against the
 * bytes left before anything is walked; strings and nested arrays are walked
 * once here so later readers can trust them. */
static int parse_array(struct rd *r, struct gguf_value *out)
{
	uint32_t et;
	uint64_t n, min, need;
	size_t start;

	if (r->depth >= GGUF_MAX_NEST)
		return field_err(r, "arrays nested deeper than %d", GGUF_MAX_NEST);
	if (rd_u32(r, &et, "array element type"))
		return -1;
	if (et > GGUF_F64)
		return field_err(r, "unknown array element type %" PRIu32, et);
	if (rd_u64(r, &n, "array count"))
		return -1;
	min = et == GGUF_STRING ? 8 : et == GGUF_ARRAY ? MIN_ARRAY_BYTES : gguf_vtype_size(et);
	if (__builtin_mul_overflow(n, min, &need) || need > left(r))
		return field_err(r, "array count %" PRIu64 " of %s exceeds what the %zu bytes left in the file can hold",
				 n, gguf_vtype_name(et), left(r));
	start = r->pos;
	if (et == GGUF_STRING || et == GGUF_ARRAY || et == GGUF_BOOL) {
		int d = r->depth;
		r->nelem[d] = n;
		r->depth++;
		for (uint64_t i = 0; i < n; i++) {
			r->elem[d] = i;
			if (parse_value(r, et, NULL)) {
				r->depth--;
				return -1;
			}
		}
		r->depth--;
	} else {
		r->pos += (size_t)need;
	}
	if (out) {
		out->arr.type = (enum gguf_vtype)et;
		out->arr.n = n;
		out->arr.data = r->b + start;
		out->arr.bytes = r->pos - start;
	}
	return 0;
}

/* One value of the given type at the cursor; out may be NULL (array elements). */
static int parse_value(struct rd *r, uint32_t type, struct gguf_value *out)
{
	uint8_t raw[8];
	size_t sz;

	if (type > GGUF_F64)
		return field_err(r, "unknown value type %" PRIu32, type);
	if (type == GGUF_STRING) {
		struct gguf_str s;
		if (rd_str(r, &s, "string"))
			return -1;
		if (out)
			out->str = s;
		return 0;
	}
	if (type == GGUF_ARRAY)
		return parse_array(r, out);
	sz = gguf_vtype_size((enum gguf_vtype)type);
	if (rd_bytes(r, raw, sz, gguf_vtype_name(type)))
		return -1;
	if (type == GGUF_BOOL && raw[0] > 1)
		return field_err(r, "bool value %u is not 0 or 1", raw[0]);
	if (out) {
		out->type = (enum gguf_vtype)type;
		decode_scalar(out, raw);
	}
	return 0;
}

/* Bytes a validated value of type t starting at p occupies (arrays: including their header). */
static uint64_t value_bytes(enum gguf_vtype t, const uint8_t *p)
{
	uint64_t len, n, off;
	uint32_t et;
	size_t sz;

	if (t == GGUF_STRING) {
		memcpy(&len, p, 8);
		return 8 + len;
	}
	if (t != GGUF_ARRAY)
		return gguf_vtype_size(t);
	memcpy(&et, p, 4);
	memcpy(&n, p + 4, 8);
	off = MIN_ARRAY_BYTES;
	sz = gguf_vtype_size((enum gguf_vtype)et);
	if (sz)
		return off + n * sz;
	for (uint64_t i = 0; i < n; i++)
		off += value_bytes((enum gguf_vtype)et, p + off);
	return off;
}

void gguf_arr_iter_init(struct gguf_arr_iter *it, const struct gguf_value *arr)
{
	it->arr = arr;
	it->i = 0;
	it->p = arr->type == GGUF_ARRAY ? arr->arr.data : NULL;
}

bool gguf_arr_next(struct gguf_arr_iter *it, struct gguf_value *out)
{
	const struct gguf_value *a = it->arr;
	enum gguf_vtype et;

	if (a->type != GGUF_ARRAY || it->i >= a->arr.n)
		return false;
	et = a->arr.type;
	memset(out, 0, sizeof(*out));
	out->type = et;
	if (et == GGUF_STRING) {
		memcpy(&out->str.len, it->p, 8);
		out->str.p = (const char *)it->p + 8;
	} else if (et == GGUF_ARRAY) {
		uint32_t inner;
		memcpy(&inner, it->p, 4);
		out->arr.type = (enum gguf_vtype)inner;
		memcpy(&out->arr.n, it->p + 4, 8);
		out->arr.data = it->p + MIN_ARRAY_BYTES;
		out->arr.bytes = value_bytes(GGUF_ARRAY, it->p) - MIN_ARRAY_BYTES;
	} else {
		decode_scalar(out, it->p);
	}
	it->p += value_bytes(et, it->p);
	it->i++;
	return true;
}

int gguf_arr_strings(const struct gguf_value *arr, struct gguf_str *out)
{
	const uint8_t *p;
	if (arr->type != GGUF_ARRAY || arr->arr.type != GGUF_STRING)
		return -1;
	p = arr->arr.data;
	for (uint64_t i = 0; i < arr->arr.n; i++) {
		memcpy(&out[i].len, p, 8);
		out[i].p = (const char *)p + 8;
		p += 8 + out[i].len;
	}
	return 0;
}

/* --- lookup --------------------------------------------------------------------- */

static int str_cmp(const struct gguf_str *a, const struct gguf_str *b)
{
	uint64_t n = a->len < b->len ? a->len : b->len;
	int c = n ? memcmp(a->p, b->p, (size_t)n) : 0;
	if (c)
		return c;
	return a->len < b->len ? -1 : a->len > b->len;
}

static int kv_order_cmp(const void *x, const void *y, void *ctx)
{
	const struct gguf_kv *kv = ctx;
	return str_cmp(&kv[*(const size_t *)x].key, &kv[*(const size_t *)y].key);
}

static int tensor_name_cmp(const void *x, const void *y, void *ctx)
{
	const struct gguf_tensor *t = ctx;
	return str_cmp(&t[*(const size_t *)x].name, &t[*(const size_t *)y].name);
}

static int tensor_offset_cmp(const void *x, const void *y, void *ctx)
{
	const struct gguf_tensor *t = ctx;
	uint64_t a = t[*(const size_t *)x].offset, b = t[*(const size_t *)y].offset;
	return a < b ? -1 : a > b;
}

/* Binary search of a name in order[] (sorted by get_name); -1 when absent. */
static int64_t find_sorted(const size_t *order, uint64_t n, const struct gguf_str *want,
			   const struct gguf_str *(*get_name)(const void *base, size_t i), const void *base)
{
	uint64_t lo = 0, hi = n;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int c = str_cmp(get_name(base, order[mid]), want);
		if (c == 0)
			return (int64_t)order[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

static const struct gguf_str *kv_name(const void *base, size_t i)
{
	return &((const struct gguf_kv *)base)[i].key;
}

static const struct gguf_str *tensor_name(const void *base, size_t i)
{
	return &((const struct gguf_tensor *)base)[i].name;
}

const struct gguf_value *gguf_get(const struct gguf_file *g, const char *key)
{
	struct gguf_str want = { strlen(key), key };
	if (g->kv_order) {
		int64_t i = find_sorted(g->kv_order, g->n_kv, &want, kv_name, g->kv);
		return i < 0 ? NULL : &g->kv[i].val;
	}
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (!str_cmp(&g->kv[i].key, &want))
			return &g->kv[i].val;
	return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name)
{
	struct gguf_str want = { strlen(name), name };
	if (g->tensor_order) {
		int64_t i = find_sorted(g->tensor_order, g->n_tensors, &want, tensor_name, g->tensors);
		return i < 0 ? NULL : &g->tensors[i];
	}
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (!str_cmp(&g->tensors[i].name, &want))
			return &g->tensors[i];
	return NULL;
}

/* --- the file --------------------------------------------------------------------- */

static size_t *identity_order(uint64_t n)
{
	size_t *o = malloc((n ? n : 1) * sizeof(*o));
	if (o)
		for (uint64_t i = 0; i < n; i++)
			o[i] = i;
	return o;
}

static int parse_header(struct gguf_file *g, struct rd *r)
{
	uint8_t magic[4];
	uint32_t v;
	size_t rest;

	if (r->size == 0)
		return nx_errf(r->err, "gguf: empty file");
	if (rd_bytes(r, magic, 4, "magic"))
		return -1;
	if (memcmp(magic, "GGUF", 4))
		return nx_errf(r->err, "gguf: bad magic %02x %02x %02x %02x (expected \"GGUF\"): not a GGUF file",
			       magic[0], magic[1], magic[2], magic[3]);
	if (rd_u32(r, &v, "version"))
		return -1;
	if (v > 0xffff && __builtin_bswap32(v) <= 0xffff)
		return nx_errf(r->err, "gguf: version reads as 0x%08" PRIx32
			       ": big-endian/byte-swapped GGUF not supported", v);
	if (v == 1)
		return nx_errf(r->err, "gguf: version 1 is not supported (32-bit counts); only versions 2 and 3");
	if (v != 2 && v != 3)
		return nx_errf(r->err, "gguf: unsupported version %" PRIu32 " (only versions 2 and 3)", v);
	g->version = v;
	if (rd_u64(r, &g->n_tensors, "n_tensors") || rd_u64(r, &g->n_kv, "n_kv"))
		return -1;
	/* Bound the counts by the bytes left before allocating anything for them. */
	rest = left(r);
	if (g->n_tensors > rest / MIN_TENSOR_BYTES)
		return nx_errf(r->err, "gguf: n_tensors %" PRIu64 " exceeds what a %zu-byte file can hold",
			       g->n_tensors, r->size);
	if (g->n_kv > rest / MIN_KV_BYTES)
		return nx_errf(r->err, "gguf: n_kv %" PRIu64 " exceeds what a %zu-byte file can hold",
			       g->n_kv, r->size);
	/* Both are bounded by rest, so this cannot overflow. */
	if (g->n_tensors * MIN_TENSOR_BYTES + g->n_kv * MIN_KV_BYTES > rest)
		return nx_errf(r->err, "gguf: n_kv %" PRIu64 " and n_tensors %" PRIu64
			       " together exceed what a %zu-byte file can hold", g->n_kv, g->n_tensors, r->size);
	return 0;
}

static int parse_kvs(struct gguf_file *g, struct rd *r)
{
	g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
	if (!g->kv)
		return nx_errf(r->err, "gguf: out of memory for %" PRIu64 " keys", g->n_kv);
	r->sect = "key";
	r->cnt = g->n_kv;
	for (uint64_t i = 0; i < g->n_kv; i++) {
		struct gguf_kv *kv = &g->kv[i];
		uint32_t type;
		r->idx = i;
		r->name.len = 0;
		if (rd_str(r, &kv->key, "key"))
			return -1;
		if (kv->key.len == 0)
			return field_err(r, "empty key name");
		r->name = kv->key;
		if (rd_u32(r, &type, "value type"))
			return -1;
		if (parse_value(r, type, &kv->val))
			return -1;
		kv->val.type = (enum gguf_vtype)type;
	}
	r->sect = NULL;
	r->name.len = 0;

	g->kv_order = identity_order(g->n_kv);
	if (!g->kv_order)
		return nx_errf(r->err, "gguf: out of memory for %" PRIu64 " keys", g->n_kv);
	qsort_r(g->kv_order, g->n_kv, sizeof(size_t), kv_order_cmp, g->kv);
	for (uint64_t i = 1; i < g->n_kv; i++) {
		size_t a = g->kv_order[i - 1], b = g->kv_order[i];
		if (!str_cmp(&g->kv[a].key, &g->kv[b].key)) {
			char nm[400];
			return nx_errf(r->err, "gguf: duplicate key '%s' (keys %zu and %zu)",
				       show(nm, sizeof(nm), g->kv[a].key.p, g->kv[a].key.len),
				       a < b ? a : b, a < b ? b : a);
		}
	}
	return 0;
}

static int parse_alignment(struct gguf_file *g, struct nx_err *err)
{
	const struct gguf_value *a = gguf_get(g, "general.alignment");
	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	if (!a)
		return 0;
	if (a->type != GGUF_U32)
		return nx_errf(err, "gguf: key 'general.alignment': expected u32, got %s", gguf_vtype_name(a->type));
	if (a->u64 == 0 || (a->u64 & (a->u64 - 1)) || a->u64 > GGUF_MAX_ALIGNMENT)
		return nx_errf(err, "gguf: key 'general.alignment': %" PRIu64
			       " must be a power of two between 1 and %u", a->u64, GGUF_MAX_ALIGNMENT);
	g->alignment = a->u64;
	return 0;
}

static const char *const ne_field[GGUF_MAX_DIMS] = { "ne[0]", "ne[1]", "ne[2]", "ne[3]" };

/* One tensor info: name, n_dims, ne[n_dims], type, offset. Shape, type and
 * size are checked here; the data range once data_offset is known. */
static int parse_tensor_info(struct rd *r, struct gguf_tensor *t)
{
	uint32_t type;
	uint64_t nel = 1, rows = 1, size;
	const struct nx_type_traits *tr;
	int64_t row;

	if (rd_str(r, &t->name, "tensor name"))
		return -1;
	if (t->name.len == 0)
		return field_err(r, "empty tensor name");
	r->name = t->name;
	if (rd_u32(r, &t->n_dims, "n_dims"))
		return -1;
	if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
		return field_err(r, "n_dims %" PRIu32 " is not between 1 and %d", t->n_dims, GGUF_MAX_DIMS);
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		uint64_t v = 1;
		if (d < t->n_dims && rd_u64(r, &v, ne_field[d]))
			return -1;
		if (v > INT64_MAX)
			return field_err(r, "ne[%" PRIu32 "] is negative (%" PRId64 ")", d, (int64_t)v);
		if (v == 0)
			return field_err(r, "ne[%" PRIu32 "] is 0", d);
		t->ne[d] = (int64_t)v;
	}
	if (rd_u32(r, &type, "type"))
		return -1;
	if (!strcmp(nx_type_name(type), "?")) /* kern/ knows every id GGUF defines */
		return field_err(r, "type %" PRIu32 " is out of range", type);
	if (!nx_type_supported(type))
		return field_err(r, "type %" PRIu32 " (%s) is not supported", type, nx_type_name(type));
	t->type = (enum nx_type)type;
	if (rd_u64(r, &t->offset, "offset"))
		return -1;

	for (int d = 0; d < GGUF_MAX_DIMS; d++)
		if (__builtin_mul_overflow(nel, (uint64_t)t->ne[d], &nel) || nel > INT64_MAX)
			return field_err(r, "shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
					 "] has more than 2^63-1 elements", t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
	tr = nx_type_ref(t->type);
	if (!tr || tr->blck <= 0)
		return field_err(r, "type %" PRIu32 " (%s) has no block layout", type, nx_type_name(type));
	if (t->ne[0] % tr->blck)
		return field_err(r, "ne[0] %" PRId64 " is not a multiple of the %s block size %" PRId64,
				 t->ne[0], nx_type_name(type), tr->blck);
	row = nx_row_size(t->type, t->ne[0]);
	rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3]; /* <= nel, no overflow */
	if (row < 0 || __builtin_mul_overflow((uint64_t)row, rows, &size) || size > INT64_MAX)
		return field_err(r, "size of shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
				 "] in %s overflows", t->ne[0], t->ne[1], t->ne[2], t->ne[3], nx_type_name(type));
	t->size = size;
	return 0;
}

static int parse_tensors(struct gguf_file *g, struct rd *r)
{
	char nm[400], nm2[400];

	g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
	if (!g->tensors)
		return nx_errf(r->err, "gguf: out of memory for %" PRIu64 " tensors", g->n_tensors);
	r->sect = "tensor";
	r->cnt = g->n_tensors;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		r->idx = i;
		r->name.len = 0;
		if (parse_tensor_info(r, &g->tensors[i]))
			return -1;
	}
	r->sect = NULL;
	r->name.len = 0;

	/* Data section: the end of the infos rounded up to the alignment. */
	if (__builtin_add_overflow((uint64_t)r->pos, g->alignment - 1, &g->data_offset))
		return nx_errf(r->err, "gguf: data offset overflows");
	g->data_offset &= ~(g->alignment - 1);

	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct gguf_tensor *t = &g->tensors[i];
		uint64_t start, end;
		show(nm, sizeof(nm), t->name.p, t->name.len);
		if (t->offset % g->alignment)
			return nx_errf(r->err, "gguf: tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
				       nm, t->offset, g->alignment);
		if (__builtin_add_overflow(g->data_offset, t->offset, &start) ||
		    __builtin_add_overflow(start, t->size, &end))
			return nx_errf(r->err, "gguf: tensor '%s': data [offset %" PRIu64 " + %" PRIu64 ", size %" PRIu64
				       "] overflows", nm, g->data_offset, t->offset, t->size);
		if (end > r->size)
			return nx_errf(r->err, "gguf: tensor '%s': data [offset %" PRIu64 ", size %" PRIu64
				       "] runs past end of file (size %zu)", nm, start, t->size, r->size);
		t->data = r->b + start;
	}

	/* Any order is fine, overlap is not: sort by offset, compare neighbours. */
	g->tensor_order = identity_order(g->n_tensors);
	if (!g->tensor_order)
		return nx_errf(r->err, "gguf: out of memory for %" PRIu64 " tensors", g->n_tensors);
	qsort_r(g->tensor_order, g->n_tensors, sizeof(size_t), tensor_offset_cmp, g->tensors);
	for (uint64_t i = 1; i < g->n_tensors; i++) {
		const struct gguf_tensor *a = &g->tensors[g->tensor_order[i - 1]];
		const struct gguf_tensor *b = &g->tensors[g->tensor_order[i]];
		if (a->offset + a->size > b->offset) /* both end inside the file: no overflow */
			return nx_errf(r->err, "gguf: tensor '%s' [offset %" PRIu64 ", size %" PRIu64
				       "] overlaps tensor '%s' [offset %" PRIu64 ", size %" PRIu64 "]",
				       show(nm, sizeof(nm), a->name.p, a->name.len), a->offset, a->size,
				       show(nm2, sizeof(nm2), b->name.p, b->name.len), b->offset, b->size);
	}

	/* Re-sort by name: duplicate check now, binary search later. */
	qsort_r(g->tensor_order, g->n_tensors, sizeof(size_t), tensor_name_cmp, g->tensors);
	for (uint64_t i = 1; i < g->n_tensors; i++) {
		size_t a = g->tensor_order[i - 1], b = g->tensor_order[i];
		if (!str_cmp(&g->tensors[a].name, &g->tensors[b].name))
			return nx_errf(r->err, "gguf: duplicate tensor name '%s' (tensors %zu and %zu)",
				       show(nm, sizeof(nm), g->tensors[a].name.p, g->tensors[a].name.len),
				       a < b ? a : b, a < b ? b : a);
	}
	return 0;
}

int gguf_parse(struct gguf_file *g, const void *base, size_t size, struct nx_err *err)
{
	struct rd r = { .b = base, .size = size, .err = err };

	memset(g, 0, sizeof(*g));
	g->base = base;
	g->size = size;
	if (parse_header(g, &r) || parse_kvs(g, &r) || parse_alignment(g, err) || parse_tensors(g, &r)) {
		gguf_free(g);
		return -1;
	}
	return 0;
}

void gguf_free(struct gguf_file *g)
{
	free(g->kv);
	free(g->tensors);
	free(g->kv_order);
	free(g->tensor_order);
	memset(g, 0, sizeof(*g));
}

/* --- typed getters ----------------------------------------------------------------- */

static int missing(const char *key, bool required, struct nx_err *err)
{
	return required ? nx_errf(err, "gguf: key '%s' missing", key) : 0;
}

static int wrong_type(const char *key, const char *want, const struct gguf_value *v, struct nx_err *err)
{
	if (v->type == GGUF_ARRAY)
		return nx_errf(err, "gguf: key '%s': expected %s, got array of %s", key, want,
			       gguf_vtype_name(v->arr.type));
	return nx_errf(err, "gguf: key '%s': expected %s, got %s", key, want, gguf_vtype_name(v->type));
}

static bool is_signed(enum gguf_vtype t)
{
	return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64;
}

static bool is_unsigned(enum gguf_vtype t)
{
	return t == GGUF_U8 || t == GGUF_U16 || t == GGUF_U32 || t == GGUF_U64;
}

int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out, bool required, struct nx_err *err)
{
	const struct gguf_value *v = gguf_get(g, key);
	if (!v)
		return missing(key, required, err);
	if (is_unsigned(v->type)) {
		if (v->u64 > UINT32_MAX)
			return nx_errf(err, "gguf: key '%s': value %" PRIu64 " (%s) does not fit in u32", key,
				       v->u64, gguf_vtype_name(v->type));
		*out = (uint32_t)v->u64;
		return 0;
	}
	if (is_signed(v->type)) {
		if (v->i64 < 0 || v->i64 > UINT32_MAX)
			return nx_errf(err, "gguf: key '%s': value %" PRId64 " (%s) does not fit in u32", key,
				       v->i64, gguf_vtype_name(v->type));
		*out = (uint32_t)v->i64;
		return 0;
	}
	return wrong_type(key, "u32", v, err);
}

int gguf_get_f32(const struct gguf_file *g, const char *key, float *out, bool required, struct nx_err *err)
{
	const struct gguf_value *v = gguf_get(g, key);
	if (!v)
		return missing(key, required, err);
	if (v->type != GGUF_F32 && v->type != GGUF_F64)
		return wrong_type(key, "f32", v, err);
	*out = (float)v->f64;
	return 0;
}

int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out, bool required, struct nx_err *err)
{
	const struct gguf_value *v = gguf_get(g, key);
	if (!v)
		return missing(key, required, err);
	if (v->type != GGUF_BOOL)
		return wrong_type(key, "bool", v, err);
	*out = v->u64 != 0;
	return 0;
}

int gguf_get_str(const struct gguf_file *g, const char *key, char **out, bool required, struct nx_err *err)
{
	const struct gguf_value *v = gguf_get(g, key);
	char *s;
	if (!v)
		return missing(key, required, err);
	if (v->type != GGUF_STRING)
		return wrong_type(key, "string", v, err);
	/* A NUL inside would silently cut the C string short. */
	if (memchr(v->str.p, '\0', (size_t)v->str.len))
		return nx_errf(err, "gguf: key '%s': string contains a NUL byte", key);
	s = malloc((size_t)v->str.len + 1);
	if (!s)
		return nx_errf(err, "gguf: key '%s': out of memory for a %" PRIu64 "-byte string", key, v->str.len);
	memcpy(s, v->str.p, (size_t)v->str.len);
	s[v->str.len] = '\0';
	*out = s;
	return 0;
}

int gguf_get_arr(const struct gguf_file *g, const char *key, enum gguf_vtype elem_type,
		 const struct gguf_value **out, bool required, struct nx_err *err)
{
	const struct gguf_value *v = gguf_get(g, key);
	char want[32];
	if (!v)
		return missing(key, required, err);
	if (v->type != GGUF_ARRAY || v->arr.type != elem_type) {
		snprintf(want, sizeof(want), "array of %s", gguf_vtype_name(elem_type));
		return wrong_type(key, want, v, err);
	}
	*out = v;
	return 0;
}

/* --- mapping a file ------------------------------------------------------------------ */

static const char *file_kind(mode_t m)
{
	if (S_ISDIR(m)) return "a directory";
	if (S_ISFIFO(m)) return "a FIFO";
	if (S_ISCHR(m)) return "a character device";
	if (S_ISBLK(m)) return "a block device";
	if (S_ISSOCK(m)) return "a socket";
	if (S_ISLNK(m)) return "a symlink";
	return "not a regular file";
}

int gguf_open(struct gguf_mapped *m, const char *path, struct nx_err *err)
{
	memset(m, 0, sizeof(*m));
	/* O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected below. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return nx_errf(err, "gguf: cannot open '%s': %s", path, strerror(errno));
	int rc = gguf_open_fd(m, fd, path, err);
	close(fd);
	return rc;
}

int gguf_open_fd(struct gguf_mapped *m, int fd, const char *name, struct nx_err *err)
{
	struct stat st;
	memset(m, 0, sizeof(*m));
	if (fstat(fd, &st))
		return nx_errf(err, "gguf: fstat '%s': %s", name, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return nx_errf(err, "gguf: '%s' is %s, not a regular file", name, file_kind(st.st_mode));
	if (st.st_size == 0)
		return nx_errf(err, "gguf: '%s' is an empty file", name);
	if ((uint64_t)st.st_size > SIZE_MAX)
		return nx_errf(err, "gguf: '%s' is too large to map", name);
	/* Shared read-only: every process that maps the model shares its page cache. */
	void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return nx_errf(err, "gguf: mmap '%s' (%jd bytes): %s", name, (intmax_t)st.st_size, strerror(errno));
	if (gguf_parse(&m->g, map, (size_t)st.st_size, err)) {
		munmap(map, (size_t)st.st_size);
		return nx_err_prefix(err, "%s", name);
	}
	m->map = map;
	m->map_size = (size_t)st.st_size;
	return 0;
}

void gguf_close(struct gguf_mapped *m)
{
	gguf_free(&m->g);
	if (m->map)
		munmap(m->map, m->map_size);
	memset(m, 0, sizeof(*m));
}
