/* safetensors.c - validating safetensors parser: header length, UTF-8 JSON header, dtypes, shapes and an exact tiling of the data section. */
#define _GNU_SOURCE /* qsort_r */
#include "lora/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kern/quant.h"

/* ---------------------------------------------------------------- helpers */

/* A name made safe to print: control bytes escaped, long names cut. */
static const char *show(char *buf, size_t n, const char *s)
{
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p && o + 8 < n; p++) {
		if (p - (const unsigned char *)s >= 120) {
			o += (size_t)snprintf(buf + o, n - o, "...");
			break;
		}
		if (*p < 0x20 || *p == 0x7f || *p == '\'' || *p == '\\')
			o += (size_t)snprintf(buf + o, n - o, "\\x%02x", *p);
		else
			buf[o++] = (char)*p;
	}
	buf[o < n ? o : n - 1] = 0;
	return buf;
}

/* Strict UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
 * Returns the offset of the first bad byte, or len when all is well. */
static size_t utf8_bad(const uint8_t *s, size_t len)
{
	size_t i = 0;
	while (i < len) {
		uint8_t c = s[i];
		size_t n;
		uint32_t cp, min;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			n = 1, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			n = 2, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			n = 3, cp = c & 0x07, min = 0x10000;
		} else {
			return i;
		}
		if (len - i <= n)
			return i;
		for (size_t k = 1; k <= n; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return i;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return i;
		i += n + 1;
	}
	return len;
}

static const struct {
	const char *name;
	int supported; /* 1 + enum nx_st_dtype, or 0 */
} dtypes[] = {
	{"F32", 1 + NX_ST_F32}, {"F16", 1 + NX_ST_F16}, {"BF16", 1 + NX_ST_BF16},
	/* Known to the format, not to us. */
	{"F64", 0}, {"I64", 0}, {"U64", 0}, {"I32", 0}, {"U32", 0}, {"I16", 0}, {"U16", 0},
	{"I8", 0}, {"U8", 0}, {"BOOL", 0}, {"F8_E4M3", 0}, {"F8_E5M2", 0}, {"F8_E8M0", 0},
	{"F6_E2M3", 0}, {"F6_E3M2", 0}, {"F4", 0}, {"C64", 0},
};

const char *nx_st_dtype_name(enum nx_st_dtype t)
{
	switch (t) {
	case NX_ST_F32: return "F32";
	case NX_ST_F16: return "F16";
	case NX_ST_BF16: return "BF16";
	}
	return "?";
}

size_t nx_st_dtype_size(enum nx_st_dtype t)
{
	return t == NX_ST_F32 ? 4 : 2;
}

float nx_st_elem(enum nx_st_dtype t, const uint8_t *data, int64_t i)
{
	/* memcpy: the data section has no alignment guarantee. Little-endian host (x86). */
	if (t == NX_ST_F32) {
		float f;
		memcpy(&f, data + 4 * i, 4);
		return f;
	}
	uint16_t h;
	memcpy(&h, data + 2 * i, 2);
	return t == NX_ST_F16 ? nx_f16_to_f32(h) : nx_bf16_to_f32(h);
}

/* ---------------------------------------------------------------- the header */

static int get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int parse_tensor(struct nx_st_tensor *t, const char *name, json_t *info, uint64_t data_size,
			struct nx_err *err)
{
	char nm[400];
	show(nm, sizeof(nm), name);
	if (!json_is_object(info))
		return nx_errf(err, "safetensors: tensor '%s': entry is not an object", nm);
	const char *key;
	json_t *v;
	json_object_foreach(info, key, v) {
		if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets")) {
			char k[400];
			return nx_errf(err, "safetensors: tensor '%s': unknown field '%s'", nm, show(k, sizeof(k), key));
		}
	}

	/* dtype */
	json_t *dt = json_object_get(info, "dtype");
	if (!dt)
		return nx_errf(err, "safetensors: tensor '%s': field 'dtype' is missing", nm);
	if (!json_is_string(dt))
		return nx_errf(err, "safetensors: tensor '%s': field 'dtype' is not a string", nm);
	const char *ds = json_string_value(dt);
	int found = -1;
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (!strcmp(ds, dtypes[i].name))
			found = (int)i;
	char d[64];
	if (found < 0)
		return nx_errf(err, "safetensors: tensor '%s': unknown dtype '%s'", nm, show(d, sizeof(d), ds));
	if (!dtypes[found].supported)
		return nx_errf(err, "safetensors: tensor '%s': dtype '%s' is not supported (F32, F16, BF16)", nm, ds);
	t->dtype = (enum nx_st_dtype)(dtypes[found].supported - 1);

	/* shape */
	json_t *sh = json_object_get(info, "shape");
	if (!sh)
		return nx_errf(err, "safetensors: tensor '%s': field 'shape' is missing", nm);
	if (!json_is_array(sh))
		return nx_errf(err, "safetensors: tensor '%s': field 'shape' is not an array", nm);
	if (json_array_size(sh) > NX_ST_MAX_DIMS)
		return nx_errf(err, "safetensors: tensor '%s': shape has %zu dimensions (at most %d)", nm,
			       json_array_size(sh), NX_ST_MAX_DIMS);
	t->n_dims = (int)json_array_size(sh);
	int64_t n = 1;
	for (int i = 0; i < t->n_dims; i++) {
		uint64_t x;
		if (get_u64(json_array_get(sh, (size_t)i), &x))
			return nx_errf(err, "safetensors: tensor '%s': shape[%d] is not a non-negative integer", nm, i);
		t->shape[i] = (int64_t)x; /* jansson integers are long long: x <= INT64_MAX */
		if (__builtin_mul_overflow(n, t->shape[i], &n))
			return nx_errf(err, "safetensors: tensor '%s': shape product overflows at shape[%d]", nm, i);
	}
	t->n_elem = n;
	uint64_t bytes;
	if (__builtin_mul_overflow((uint64_t)n, (uint64_t)nx_st_dtype_size(t->dtype), &bytes))
		return nx_errf(err, "safetensors: tensor '%s': shape x dtype size overflows", nm);

	/* data_offsets */
	json_t *off = json_object_get(info, "data_offsets");
	if (!off)
		return nx_errf(err, "safetensors: tensor '%s': field 'data_offsets' is missing", nm);
	if (!json_is_array(off) || json_array_size(off) != 2)
		return nx_errf(err, "safetensors: tensor '%s': field 'data_offsets' is not an array [begin, end]", nm);
	if (get_u64(json_array_get(off, 0), &t->begin) || get_u64(json_array_get(off, 1), &t->end))
		return nx_errf(err, "safetensors: tensor '%s': data_offsets are not non-negative integers", nm);
	if (t->begin > t->end)
		return nx_errf(err, "safetensors: tensor '%s': data_offsets [%llu, %llu] are reversed", nm,
			       (unsigned long long)t->begin, (unsigned long long)t->end);
	if (t->end > data_size)
		return nx_errf(err, "safetensors: tensor '%s': data_offsets [%llu, %llu] run past the data section (%llu bytes)",
			       nm, (unsigned long long)t->begin, (unsigned long long)t->end,
			       (unsigned long long)data_size);
	if (t->end - t->begin != bytes) {
		char shs[200];
		size_t o = (size_t)snprintf(shs, sizeof(shs), "[");
		for (int i = 0; i < t->n_dims && o < sizeof(shs); i++)
			o += (size_t)snprintf(shs + o, sizeof(shs) - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
		if (o < sizeof(shs))
			snprintf(shs + o, sizeof(shs) - o, "]");
		return nx_errf(err, "safetensors: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, but shape %s x %s needs %llu",
			       nm, (unsigned long long)t->begin, (unsigned long long)t->end,
			       (unsigned long long)(t->end - t->begin), shs, nx_st_dtype_name(t->dtype),
			       (unsigned long long)bytes);
	}
	t->name = strdup(name);
	if (!t->name)
		return nx_errf(err, "safetensors: out of memory");
	return 0;
}

static int parse_meta(struct nx_st_file *f, json_t *meta, struct nx_err *err)
{
	if (!json_is_object(meta))
		return nx_errf(err, "safetensors: __metadata__ is not an object");
	f->meta = calloc(json_object_size(meta) + 1, sizeof(*f->meta));
	if (!f->meta)
		return nx_errf(err, "safetensors: out of memory");
	const char *key;
	json_t *v;
	json_object_foreach(meta, key, v) {
		char k[400];
		if (!json_is_string(v))
			return nx_errf(err, "safetensors: __metadata__ '%s' is not a string", show(k, sizeof(k), key));
		struct nx_st_meta *m = &f->meta[f->n_meta++];
		m->key = strdup(key);
		m->val = strdup(json_string_value(v));
		if (!m->key || !m->val)
			return nx_errf(err, "safetensors: out of memory");
	}
	return 0;
}

static int cmp_offsets(const void *x, const void *y, void *ctx)
{
	const struct nx_st_tensor *t = ctx;
	const struct nx_st_tensor *a = &t[*(const size_t *)x], *b = &t[*(const size_t *)y];
	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	if (a->end != b->end)
		return a->end < b->end ? -1 : 1;
	return 0;
}

/* Sorted by offset, the tensors must tile [0, data_size): no gap, no overlap, nothing left over. */
static int check_tiling(const struct nx_st_file *f, uint64_t data_size, struct nx_err *err)
{
	size_t *ord = malloc((f->n_tensors + 1) * sizeof(size_t));
	if (!ord)
		return nx_errf(err, "safetensors: out of memory");
	for (size_t i = 0; i < f->n_tensors; i++)
		ord[i] = i;
	qsort_r(ord, f->n_tensors, sizeof(size_t), cmp_offsets, f->tensors);
	uint64_t at = 0;
	const struct nx_st_tensor *prev = NULL;
	int rc = 0;
	char nm[400], pn[400];
	for (size_t i = 0; i < f->n_tensors && rc == 0; i++) {
		const struct nx_st_tensor *t = &f->tensors[ord[i]];
		if (t->begin > at)
			rc = nx_errf(err, "safetensors: tensor '%s': data_offsets begin at %llu, leaving a gap of %llu bytes after %s%s%s",
				     show(nm, sizeof(nm), t->name), (unsigned long long)t->begin,
				     (unsigned long long)(t->begin - at), prev ? "tensor '" : "the start of the data section",
				     prev ? show(pn, sizeof(pn), prev->name) : "", prev ? "'" : "");
		else if (t->begin < at)
			rc = nx_errf(err, "safetensors: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' (ends at %llu)",
				     show(nm, sizeof(nm), t->name), (unsigned long long)t->begin,
				     (unsigned long long)t->end, show(pn, sizeof(pn), prev->name), (unsigned long long)at);
		at = t->end;
		prev = t;
	}
	if (rc == 0 && at != data_size)
		rc = nx_errf(err, "safetensors: the tensors end at data offset %llu%s%s%s, short of the data section's %llu bytes",
			     (unsigned long long)at, prev ? " (tensor '" : "", prev ? show(pn, sizeof(pn), prev->name) : "",
			     prev ? "')" : "", (unsigned long long)data_size);
	free(ord);
	return rc;
}

int nx_st_parse(struct nx_st_file *f, const void *base, size_t size, struct nx_err *err)
{
	memset(f, 0, sizeof(*f));
	f->base = base;
	f->size = size;
	if (size < 8)
		return nx_errf(err, "safetensors: file of %zu bytes is too short for the 8-byte header length", size);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | f->base[i];
	f->header_len = n;
	if (n >= NX_ST_MAX_HEADER)
		return nx_errf(err, "safetensors: header length %llu is not below the limit of %llu bytes",
			       (unsigned long long)n, NX_ST_MAX_HEADER);
	if (n > size - 8)
		return nx_errf(err, "safetensors: header length %llu runs past the end of the file (%zu bytes)",
			       (unsigned long long)n, size);
	if (n < 2)
		return nx_errf(err, "safetensors: header length %llu is too short for a JSON object", (unsigned long long)n);
	const uint8_t *h = f->base + 8;
	size_t bad = utf8_bad(h, (size_t)n);
	if (bad != n)
		return nx_errf(err, "safetensors: header is not UTF-8: invalid byte 0x%02x at header offset %zu", h[bad], bad);
	if (h[0] != '{')
		return nx_errf(err, "safetensors: header does not start with '{' (not a JSON object)");

	json_error_t je;
	json_t *root = json_loadb((const char *)h, (size_t)n, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return nx_errf(err, "safetensors: header is not valid JSON: %s (line %d, column %d)", je.text, je.line,
			       je.column);
	int rc = 0;
	if (!json_is_object(root)) {
		rc = nx_errf(err, "safetensors: header is not a JSON object");
		goto out;
	}
	uint64_t data_size = size - 8 - n;
	f->tensors = calloc(json_object_size(root) + 1, sizeof(*f->tensors));
	if (!f->tensors) {
		rc = nx_errf(err, "safetensors: out of memory");
		goto out;
	}
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "__metadata__")) {
			if ((rc = parse_meta(f, v, err)))
				goto out;
			continue;
		}
		if (!*key) {
			rc = nx_errf(err, "safetensors: a tensor has an empty name");
			goto out;
		}
		if ((rc = parse_tensor(&f->tensors[f->n_tensors], key, v, data_size, err)))
			goto out;
		f->n_tensors++;
	}
	if ((rc = check_tiling(f, data_size, err)))
		goto out;
	for (size_t i = 0; i < f->n_tensors; i++)
		f->tensors[i].data = f->base + 8 + n + f->tensors[i].begin;
out:
	json_decref(root);
	if (rc)
		nx_st_free(f);
	return rc;
}

void nx_st_free(struct nx_st_file *f)
{
	for (size_t i = 0; i < f->n_tensors; i++)
		free(f->tensors[i].name);
	for (size_t i = 0; i < f->n_meta; i++) {
		free(f->meta[i].key);
		free(f->meta[i].val);
	}
	free(f->tensors);
	free(f->meta);
	f->tensors = NULL;
	f->meta = NULL;
	f->n_tensors = f->n_meta = 0;
}

const struct nx_st_tensor *nx_st_find(const struct nx_st_file *f, const char *name)
{
	for (size_t i = 0; i < f->n_tensors; i++)
		if (!strcmp(f->tensors[i].name, name))
			return &f->tensors[i];
	return NULL;
}

const char *nx_st_meta_get(const struct nx_st_file *f, const char *key)
{
	for (size_t i = 0; i < f->n_meta; i++)
		if (!strcmp(f->meta[i].key, key))
			return f->meta[i].val;
	return NULL;
}

/* ---------------------------------------------------------------- files */

int nx_st_open(struct nx_st_mapped *m, const char *path, struct nx_err *err)
{
	memset(m, 0, sizeof(*m));
	/* O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected below. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return nx_errf(err, "safetensors: cannot open '%s': %s", path, strerror(errno));
	int rc = nx_st_open_fd(m, fd, path, err);
	close(fd);
	return rc;
}

int nx_st_open_fd(struct nx_st_mapped *m, int fd, const char *name, struct nx_err *err)
{
	struct stat st;
	memset(m, 0, sizeof(*m));
	if (fstat(fd, &st))
		return nx_errf(err, "safetensors: fstat '%s': %s", name, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return nx_errf(err, "safetensors: '%s' is not a regular file", name);
	if (st.st_size < 8)
		return nx_errf(err, "safetensors: '%s' has %jd bytes, too short for the 8-byte header length", name,
			       (intmax_t)st.st_size);
	void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return nx_errf(err, "safetensors: mmap '%s' (%jd bytes): %s", name, (intmax_t)st.st_size,
			       strerror(errno));
	if (nx_st_parse(&m->f, map, (size_t)st.st_size, err)) {
		munmap(map, (size_t)st.st_size);
		return nx_err_prefix(err, "%s", name);
	}
	m->map = map;
	m->map_size = (size_t)st.st_size;
	return 0;
}

void nx_st_close(struct nx_st_mapped *m)
{
	nx_st_free(&m->f);
	if (m->map)
		munmap(m->map, m->map_size);
	memset(m, 0, sizeof(*m));
}
