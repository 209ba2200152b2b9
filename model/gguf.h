/* gguf.h - a validating reader for GGUF v2/v3 files held in one byte range.
 *
 * Everything is checked before any pointer into the file is formed: counts,
 * string lengths, array sizes, alignment, tensor shapes and data ranges, with
 * overflow-checked arithmetic. A bad file yields one error naming the field. */
#ifndef NX_GGUF_H
#define NX_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kern/quant.h"

enum gguf_vtype {
	GGUF_U8 = 0,
	GGUF_I8 = 1,
	GGUF_U16 = 2,
	GGUF_I16 = 3,
	GGUF_U32 = 4,
	GGUF_I32 = 5,
	GGUF_F32 = 6,
	GGUF_BOOL = 7,
	GGUF_STRING = 8,
	GGUF_ARRAY = 9,
	GGUF_U64 = 10,
	GGUF_I64 = 11,
	GGUF_F64 = 12,
};

struct gguf_str {
	uint64_t len;
	const char *p; /* points into the file; not NUL-terminated */
};

/* A metadata value. Arrays keep a pointer to their first element in the file
 * and are walked with gguf_arr_* helpers (elements may be strings or arrays). */
struct gguf_value {
	enum gguf_vtype type;
	union {
		uint64_t u64; /* all unsigned ints and bool, widened */
		int64_t i64;  /* all signed ints, widened */
		double f64;   /* f32 and f64, widened */
		struct gguf_str str;
		struct {
			enum gguf_vtype type; /* element type */
			uint64_t n;
			const uint8_t *data;  /* first element, in the file */
			uint64_t bytes;       /* bytes the whole array occupies */
		} arr;
	};
};

struct gguf_kv {
	struct gguf_str key;
	struct gguf_value val;
};

#define GGUF_MAX_DIMS 4

struct gguf_tensor {
	struct gguf_str name;
	uint32_t n_dims;
	int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (row length); unused dims are 1 */
	enum nx_type type;
	uint64_t offset;           /* relative to the data section */
	uint64_t size;             /* bytes */
	const void *data;          /* points into the file */
};

struct gguf_file {
	const uint8_t *base;
	size_t size;
	uint32_t version;
	uint64_t alignment;
	uint64_t n_kv;
	struct gguf_kv *kv;        /* n_kv entries, heap */
	uint64_t n_tensors;
	struct gguf_tensor *tensors; /* n_tensors entries, heap */
	uint64_t data_offset;      /* start of the tensor data section (aligned); may be past
				    * the end in a file with no tensors (vocab-only files) */
	/* Indices into kv / tensors sorted by key / name (duplicate check at parse,
	 * binary search in gguf_get / gguf_find_tensor; NULL means scan). */
	size_t *kv_order;
	size_t *tensor_order;
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ALIGNMENT (1u << 24) /* general.alignment must be a power of two <= this */
#define GGUF_MAX_NEST 8               /* arrays of arrays: deeper nesting is rejected */

/* Parses and validates [base, base+size). The range must outlive the gguf_file.
 * Returns 0, or -1 with err naming what is wrong (indices in messages count
 * from 0). Policy beyond the GGUF spec: keys and tensor names must be unique
 * and non-empty; every dimension > 0; bools 0 or 1; tensor data may appear in
 * any order but never overlaps and lies wholly inside the file. */
int gguf_parse(struct gguf_file *g, const void *base, size_t size, struct nx_err *err);
void gguf_free(struct gguf_file *g);

/* Looks a key up; NULL when absent. */
const struct gguf_value *gguf_get(const struct gguf_file *g, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

/* Typed getters: 0 on success; -1 with err naming the key when the key is
 * missing and required, or holds the wrong type (the message names both
 * types). A missing optional key returns 0 and leaves *out untouched, as does
 * any error. Integer getters accept any integer type whose value fits;
 * gguf_get_f32 accepts f32 and f64. */
int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out, bool required, struct nx_err *err);
int gguf_get_f32(const struct gguf_file *g, const char *key, float *out, bool required, struct nx_err *err);
int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out, bool required, struct nx_err *err);
/* Copies a string value into a NUL-terminated heap string (*out, caller frees). */
int gguf_get_str(const struct gguf_file *g, const char *key, char **out, bool required, struct nx_err *err);
/* Checks that key is an array of elem_type and returns it. */
int gguf_get_arr(const struct gguf_file *g, const char *key, enum gguf_vtype elem_type,
		 const struct gguf_value **out, bool required, struct nx_err *err);

/* Array walking. For fixed-size element types, element i is at data + i*size.
 * For string arrays, gguf_arr_strings fills out[0..n) in one pass (validated at parse). */
size_t gguf_vtype_size(enum gguf_vtype t); /* 0 for string/array */
int gguf_arr_strings(const struct gguf_value *arr, struct gguf_str *out);
/* "u8", "string", ...; "?" when out of range. */
const char *gguf_vtype_name(uint32_t t);

/* Walks any array (also of strings or of arrays) element by element:
 *   struct gguf_arr_iter it; struct gguf_value v;
 *   gguf_arr_iter_init(&it, arr); while (gguf_arr_next(&it, &v)) ...
 * Elements come out as values of the array's element type (nested arrays as
 * array values that can be walked the same way). */
struct gguf_arr_iter {
	const struct gguf_value *arr;
	uint64_t i;
	const uint8_t *p;
};
void gguf_arr_iter_init(struct gguf_arr_iter *it, const struct gguf_value *arr);
bool gguf_arr_next(struct gguf_arr_iter *it, struct gguf_value *out);

/* Maps a file read-only and parses it. */
struct gguf_mapped {
	struct gguf_file g;
	void *map;
	size_t map_size;
};
int gguf_open(struct gguf_mapped *m, const char *path, struct nx_err *err);
/* The same over a file already open (fd stays the caller's); name is for messages. */
int gguf_open_fd(struct gguf_mapped *m, int fd, const char *name, struct nx_err *err);
void gguf_close(struct gguf_mapped *m);

#endif
