/* safetensors.h - a validating reader for safetensors files held in one byte range.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON (an
 * object: tensor name -> {dtype, shape, data_offsets}, plus an optional
 * "__metadata__" string map), then the data section. Offsets are relative to
 * the data section; tensors must tile it exactly: sorted by offset they start
 * at 0, each begins where the previous ended and the last ends at the end of
 * the file (docs/reliability.md 11). Everything is checked before a pointer into
 * the data is formed; an error names the tensor and the field. */
#ifndef NX_SAFETENSORS_H
#define NX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Header lengths at or above this are refused (the format's own limit). */
#define NX_ST_MAX_HEADER 100000000ull
#define NX_ST_MAX_DIMS 8

/* The dtypes we read; a file with any other dtype is rejected. */
enum nx_st_dtype {
	NX_ST_F32,
	NX_ST_F16,
	NX_ST_BF16,
};

struct nx_st_tensor {
	char *name;                       /* heap, NUL-terminated */
	enum nx_st_dtype dtype;
	int n_dims;                       /* 0 (a scalar) .. NX_ST_MAX_DIMS */
	int64_t shape[NX_ST_MAX_DIMS];    /* outermost first (row-major, as numpy) */
	int64_t n_elem;                   /* product of shape */
	uint64_t begin, end;              /* data_offsets, relative to the data section */
	const uint8_t *data;              /* base + 8 + N + begin; end - begin bytes; any alignment */
};

struct nx_st_meta {
	char *key, *val; /* heap */
};

struct nx_st_file {
	const uint8_t *base;
	size_t size;
	uint64_t header_len;
	size_t n_tensors;
	struct nx_st_tensor *tensors; /* in header order */
	size_t n_meta;
	struct nx_st_meta *meta;
};

/* Parses and validates [base, base+size); the range must outlive f.
 * Returns 0, or -1 with err naming the tensor and field at fault. */
int nx_st_parse(struct nx_st_file *f, const void *base, size_t size, struct nx_err *err);
void nx_st_free(struct nx_st_file *f);

const struct nx_st_tensor *nx_st_find(const struct nx_st_file *f, const char *name);
/* Value of a __metadata__ key, or NULL. */
const char *nx_st_meta_get(const struct nx_st_file *f, const char *key);

/* "F32", "F16", "BF16". */
const char *nx_st_dtype_name(enum nx_st_dtype t);
size_t nx_st_dtype_size(enum nx_st_dtype t);
/* Converts element i of tensor data in dtype t to float. */
float nx_st_elem(enum nx_st_dtype t, const uint8_t *data, int64_t i);

/* Maps a regular file read-only and parses it. */
struct nx_st_mapped {
	struct nx_st_file f;
	void *map;
	size_t map_size;
};
int nx_st_open(struct nx_st_mapped *m, const char *path, struct nx_err *err);
/* The same over a file already open (fd stays the caller's); name is for messages. */
int nx_st_open_fd(struct nx_st_mapped *m, int fd, const char *name, struct nx_err *err);
void nx_st_close(struct nx_st_mapped *m);

#endif
