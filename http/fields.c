/* fields.c - typed reads of request fields, each refusal a 400 naming the field. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "http/nxh.h"

static const char *type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "a value";
}

/* "messages[0].content" from where ("messages[0]." or "") and key. */
static const char *field(char *buf, size_t cap, const char *where, const char *key)
{
	snprintf(buf, cap, "%s%s", where ? where : "", key);
	return buf;
}

int nxh_only_fields(struct nxh_req *r, const json_t *obj, const char *where, const char *const *known)
{
	const char *key;
	json_t *v;
	json_object_foreach((json_t *)obj, key, v) {
		if (json_is_null(v))
			continue;
		bool ok = false;
		for (size_t i = 0; known[i] && !ok; i++)
			ok = !strcmp(known[i], key);
		if (!ok) {
			char f[256];
			field(f, sizeof(f), where, key);
			nxh_req_bad(r, f, "field '%s' is not supported by nxd-http", f);
			return -1;
		}
	}
	return 0;
}

static json_t *get(const json_t *obj, const char *key, bool *present)
{
	json_t *v = json_object_get(obj, key);
	if (json_is_null(v))
		v = NULL;
	if (present)
		*present = v != NULL;
	return v;
}

int nxh_get_bool(struct nxh_req *r, const json_t *obj, const char *key, const char *where, bool *out, bool *present)
{
	json_t *v = get(obj, key, present);
	if (!v)
		return 0;
	if (!json_is_boolean(v)) {
		char f[256];
		nxh_req_bad(r, field(f, sizeof(f), where, key), "field '%s' must be a boolean, got %s", f,
			    type_name(v));
		return -1;
	}
	*out = json_is_true(v);
	return 0;
}

int nxh_get_int(struct nxh_req *r, const json_t *obj, const char *key, const char *where, long long lo, long long hi,
		long long *out, bool *present)
{
	json_t *v = get(obj, key, present);
	if (!v)
		return 0;
	char f[256];
	field(f, sizeof(f), where, key);
	long long x;
	if (json_is_integer(v)) {
		x = json_integer_value(v);
	} else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
		   fabs(json_real_value(v)) < 9e18) {
		x = (long long)json_real_value(v); /* 2.0: some encoders write every number as a double */
	} else {
		nxh_req_bad(r, f, "field '%s' must be an integer, got %s", f, type_name(v));
		return -1;
	}
	if (x < lo || x > hi) {
		nxh_req_bad(r, f, "field '%s' must be in %lld..%lld, got %lld", f, lo, hi, x);
		return -1;
	}
	*out = x;
	return 0;
}

int nxh_get_num(struct nxh_req *r, const json_t *obj, const char *key, const char *where, double lo, double hi,
		double *out, bool *present)
{
	json_t *v = get(obj, key, present);
	if (!v)
		return 0;
	char f[256];
	field(f, sizeof(f), where, key);
	if (!json_is_number(v)) {
		nxh_req_bad(r, f, "field '%s' must be a number, got %s", f, type_name(v));
		return -1;
	}
	double x = json_number_value(v);
	if (!(x >= lo && x <= hi)) {
		nxh_req_bad(r, f, "field '%s' must be in [%g, %g], got %g", f, lo, hi, x);
		return -1;
	}
	*out = x;
	return 0;
}

int nxh_get_str(struct nxh_req *r, const json_t *obj, const char *key, const char *where, const char **out,
		bool *present)
{
	json_t *v = get(obj, key, present);
	if (!v)
		return 0;
	if (!json_is_string(v)) {
		char f[256];
		nxh_req_bad(r, field(f, sizeof(f), where, key), "field '%s' must be a string, got %s", f,
			    type_name(v));
		return -1;
	}
	*out = json_string_value(v);
	return 0;
}
