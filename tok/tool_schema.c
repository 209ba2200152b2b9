/* tool_schema.c - a tool call's arguments checked against the tool's JSON schema (the keywords of draft 2020-12 that constrain plain JSON; the rest refused by name). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/tools.h"

#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

/* Keywords checked, and the annotations that constrain nothing. */
static const char *const checked[] = {
	"type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
	"uniqueItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
	"maxLength", "pattern", "anyOf", "oneOf", "allOf", "not", "minProperties", "maxProperties", NULL
};
static const char *const annotations[] = {
	"title", "description", "default", "examples", "$schema", "$id", "$comment", "format", "deprecated",
	"readOnly", "writeOnly", NULL
};

static bool in(const char *const *list, const char *k)
{
	for (; *list; list++)
		if (!strcmp(*list, k))
			return true;
	return false;
}

static int check_at(const json_t *s, const char *at, int depth, struct nx_err *err)
{
	if (json_is_boolean(s))
		return 0;
	if (!json_is_object(s))
		return nx_errf(err, "%s must be a JSON schema object, got another JSON value", at);
	if (depth > 64)
		return nx_errf(err, "%s nests schemas deeper than 64 levels", at);
	const char *k;
	json_t *v;
	char sub[256];
	json_object_foreach((json_t *)s, k, v) {
		if (in(annotations, k))
			continue;
		if (!in(checked, k))
			return nx_errf(err, "%s has the keyword '%.64s', which nxd does not check tool arguments against", at,
				       k);
		if (!strcmp(k, "properties")) {
			if (!json_is_object(v))
				return nx_errf(err, "%s.properties must be an object", at);
			const char *pk;
			json_t *pv;
			json_object_foreach(v, pk, pv) {
				snprintf(sub, sizeof(sub), "%s.properties.%.64s", at, pk);
				if (check_at(pv, sub, depth + 1, err))
					return -1;
			}
		} else if (!strcmp(k, "items") || !strcmp(k, "not") || !strcmp(k, "additionalProperties")) {
			snprintf(sub, sizeof(sub), "%s.%s", at, k);
			if (check_at(v, sub, depth + 1, err))
				return -1;
		} else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf") || !strcmp(k, "allOf")) {
			if (!json_is_array(v) || json_array_size(v) == 0)
				return nx_errf(err, "%s.%s must be a non-empty array of schemas", at, k);
			size_t i;
			json_t *e;
			json_array_foreach(v, i, e) {
				snprintf(sub, sizeof(sub), "%s.%s[%zu]", at, k, i);
				if (check_at(e, sub, depth + 1, err))
					return -1;
			}
		} else if (!strcmp(k, "type")) {
			static const char *const types[] = { "null", "boolean", "object", "array", "number", "string",
							     "integer", NULL };
			size_t n = json_is_array(v) ? json_array_size(v) : 1;
			for (size_t i = 0; i < n; i++) {
				const json_t *t = json_is_array(v) ? json_array_get(v, i) : v;
				if (!json_is_string(t) || !in(types, json_string_value(t)))
					return nx_errf(err, "%s.type must name JSON types (null, boolean, object, array, number, "
						       "string, integer)", at);
			}
		} else if (!strcmp(k, "required")) {
			size_t i;
			json_t *e;
			if (!json_is_array(v))
				return nx_errf(err, "%s.required must be an array of names", at);
			json_array_foreach(v, i, e)
				if (!json_is_string(e))
					return nx_errf(err, "%s.required must be an array of names", at);
		} else if (!strcmp(k, "enum")) {
			if (!json_is_array(v))
				return nx_errf(err, "%s.enum must be an array", at);
		} else if (!strcmp(k, "pattern")) {
			int ec;
			PCRE2_SIZE eo;
			if (!json_is_string(v))
				return nx_errf(err, "%s.pattern must be a string", at);
			pcre2_code *re = pcre2_compile((PCRE2_SPTR)json_string_value(v), json_string_length(v), PCRE2_UTF,
						       &ec, &eo, NULL);
			if (!re)
				return nx_errf(err, "%s.pattern is not a regular expression nxd can compile", at);
			pcre2_code_free(re);
		} else if (!strcmp(k, "const") || !strcmp(k, "uniqueItems")) {
			/* any value / a boolean: nothing to check further */
		} else if (!json_is_number(v)) {
			return nx_errf(err, "%s.%s must be a number", at, k);
		}
	}
	return 0;
}

int nx_tool_schema_check(const json_t *schema, const char *at, struct nx_err *err)
{
	return check_at(schema, at, 0, err);
}

// --- validation

static bool is_type(const json_t *v, const char *t)
{
	if (!strcmp(t, "null")) return json_is_null(v);
	if (!strcmp(t, "boolean")) return json_is_boolean(v);
	if (!strcmp(t, "object")) return json_is_object(v);
	if (!strcmp(t, "array")) return json_is_array(v);
	if (!strcmp(t, "string")) return json_is_string(v);
	if (!strcmp(t, "number")) return json_is_number(v);
	if (!strcmp(t, "integer"))
		return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
	return false;
}

/* JSON equality with 1 == 1.0, as JSON Schema's enum and const compare. */
static bool same(const json_t *a, const json_t *b)
{
	if (json_is_number(a) && json_is_number(b))
		return json_number_value(a) == json_number_value(b);
	if (json_typeof(a) != json_typeof(b))
		return false;
	if (json_is_array(a)) {
		if (json_array_size(a) != json_array_size(b))
			return false;
		for (size_t i = 0; i < json_array_size(a); i++)
			if (!same(json_array_get(a, i), json_array_get(b, i)))
				return false;
		return true;
	}
	if (json_is_object(a)) {
		if (json_object_size(a) != json_object_size(b))
			return false;
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)a, k, v) {
			json_t *w = json_object_get(b, k);
			if (!w || !same(v, w))
				return false;
		}
		return true;
	}
	return json_equal((json_t *)a, (json_t *)b);
}

static size_t utf8_chars(const char *s, size_t n)
{
	size_t c = 0;
	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xc0) != 0x80;
	return c;
}

static int bad(struct nx_err *err, const char *at, const char *why)
{
	return nx_errf(err, "at %s: %s", at, why);
}

static int valid_at(const json_t *s, const json_t *v, const char *at, struct nx_err *err)
{
	if (json_is_boolean(s))
		return json_is_true(s) ? 0 : bad(err, at, "no value is allowed here");
	char sub[256], why[160];
	const json_t *k;
	if ((k = json_object_get(s, "type"))) {
		bool ok = false;
		size_t n = json_is_array(k) ? json_array_size(k) : 1;
		for (size_t i = 0; i < n && !ok; i++)
			ok = is_type(v, json_string_value(json_is_array(k) ? json_array_get(k, i) : k));
		if (!ok)
			return bad(err, at, "the value is not of the schema's type");
	}
	if ((k = json_object_get(s, "const")) && !same(k, v))
		return bad(err, at, "the value is not the schema's const");
	if ((k = json_object_get(s, "enum"))) {
		bool ok = false;
		for (size_t i = 0; i < json_array_size(k) && !ok; i++)
			ok = same(json_array_get(k, i), v);
		if (!ok)
			return bad(err, at, "the value is not one of the schema's enum");
	}
	if (json_is_number(v)) {
		double x = json_number_value(v);
		const json_t *m;
		if ((m = json_object_get(s, "minimum")) && x < json_number_value(m))
			return bad(err, at, "the number is below the minimum");
		if ((m = json_object_get(s, "maximum")) && x > json_number_value(m))
			return bad(err, at, "the number is above the maximum");
		if ((m = json_object_get(s, "exclusiveMinimum")) && x <= json_number_value(m))
			return bad(err, at, "the number is not above the exclusive minimum");
		if ((m = json_object_get(s, "exclusiveMaximum")) && x >= json_number_value(m))
			return bad(err, at, "the number is not below the exclusive maximum");
		if ((m = json_object_get(s, "multipleOf")) && json_number_value(m) > 0) {
			double q = x / json_number_value(m);
			if (q != floor(q))
				return bad(err, at, "the number is not a multiple of multipleOf");
		}
	}
	if (json_is_string(v)) {
		size_t n = utf8_chars(json_string_value(v), json_string_length(v));
		const json_t *m;
		if ((m = json_object_get(s, "minLength")) && (double)n < json_number_value(m))
			return bad(err, at, "the string is shorter than minLength");
		if ((m = json_object_get(s, "maxLength")) && (double)n > json_number_value(m))
			return bad(err, at, "the string is longer than maxLength");
		if ((m = json_object_get(s, "pattern"))) {
			int ec;
			PCRE2_SIZE eo;
			pcre2_code *re = pcre2_compile((PCRE2_SPTR)json_string_value(m), json_string_length(m), PCRE2_UTF,
						       &ec, &eo, NULL);
			pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
			int rc = md ? pcre2_match(re, (PCRE2_SPTR)json_string_value(v), json_string_length(v), 0, 0, md, NULL)
				    : -1;
			pcre2_match_data_free(md);
			pcre2_code_free(re);
			if (rc < 0)
				return bad(err, at, "the string does not match the pattern");
		}
	}
	if (json_is_array(v)) {
		size_t n = json_array_size(v);
		const json_t *m;
		if ((m = json_object_get(s, "minItems")) && (double)n < json_number_value(m))
			return bad(err, at, "the array has fewer items than minItems");
		if ((m = json_object_get(s, "maxItems")) && (double)n > json_number_value(m))
			return bad(err, at, "the array has more items than maxItems");
		if (json_is_true(json_object_get(s, "uniqueItems")))
			for (size_t i = 0; i < n; i++)
				for (size_t j = i + 1; j < n; j++)
					if (same(json_array_get(v, i), json_array_get(v, j)))
						return bad(err, at, "the array's items are not unique");
		if ((m = json_object_get(s, "items")))
			for (size_t i = 0; i < n; i++) {
				snprintf(sub, sizeof(sub), "%s[%zu]", at, i);
				if (valid_at(m, json_array_get(v, i), sub, err))
					return -1;
			}
	}
	if (json_is_object(v)) {
		const json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
		const json_t *m;
		if ((m = json_object_get(s, "minProperties")) && (double)json_object_size(v) < json_number_value(m))
			return bad(err, at, "the object has fewer properties than minProperties");
		if ((m = json_object_get(s, "maxProperties")) && (double)json_object_size(v) > json_number_value(m))
			return bad(err, at, "the object has more properties than maxProperties");
		if ((m = json_object_get(s, "required")))
			for (size_t i = 0; i < json_array_size(m); i++) {
				const char *name = json_string_value(json_array_get(m, i));
				if (!json_object_get(v, name)) {
					snprintf(why, sizeof(why), "the required property '%.64s' is missing", name);
					return bad(err, at, why);
				}
			}
		const char *key;
		json_t *val;
		json_object_foreach((json_t *)v, key, val) {
			const json_t *ps = props ? json_object_get(props, key) : NULL;
			snprintf(sub, sizeof(sub), "%s.%.64s", at, key);
			if (!ps && addl && json_is_false(addl)) {
				snprintf(why, sizeof(why), "the property '%.64s' is not one the schema allows", key);
				return bad(err, at, why);
			}
			if ((ps || addl) && valid_at(ps ? ps : addl, val, sub, err))
				return -1;
		}
	}
	if ((k = json_object_get(s, "allOf")))
		for (size_t i = 0; i < json_array_size(k); i++)
			if (valid_at(json_array_get(k, i), v, at, err))
				return -1;
	for (int one = 0; one < 2; one++) {
		if (!(k = json_object_get(s, one ? "oneOf" : "anyOf")))
			continue;
		int n_ok = 0;
		struct nx_err sub_err;
		for (size_t i = 0; i < json_array_size(k); i++)
			n_ok += valid_at(json_array_get(k, i), v, at, &sub_err) == 0;
		if (n_ok == 0)
			return bad(err, at, one ? "the value matches none of oneOf" : "the value matches none of anyOf");
		if (one && n_ok > 1)
			return bad(err, at, "the value matches more than one of oneOf");
	}
	if ((k = json_object_get(s, "not"))) {
		struct nx_err sub_err;
		if (valid_at(k, v, at, &sub_err) == 0)
			return bad(err, at, "the value matches the schema under 'not'");
	}
	return 0;
}

int nx_tool_schema_validate(const json_t *schema, const json_t *v, struct nx_err *err)
{
	return valid_at(schema, v, "$", err);
}
