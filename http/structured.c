/* structured.c - OpenAI response_format and ollama format mapped onto nxd's "format" (docs/http.md, "Structured output"). */
#include "http/nxh.h"

#include <string.h>

/* OpenAI: absent, null or {"type":"text"}: free text; {"type":"json_object"}:
 * any JSON object; {"type":"json_schema","json_schema":{"name","schema",
 * "strict","description"}}: the schema. nxd's grammar never emits a property
 * the schema does not declare, so strict and non-strict both hold. */
int nxh_response_format(struct nxh_req *r, const json_t *b, json_t *q)
{
	const json_t *rf = json_object_get(b, "response_format");
	if (!rf || json_is_null(rf))
		return 0;
	if (!json_is_object(rf)) {
		nxh_req_bad(r, "response_format", "field 'response_format' must be an object with a 'type'");
		return -1;
	}
	const char *type = json_string_value(json_object_get(rf, "type"));
	if (!type) {
		nxh_req_bad(r, "response_format", "field 'response_format.type' must be \"text\", \"json_object\" or "
			    "\"json_schema\"");
		return -1;
	}
	if (!strcmp(type, "text") || !strcmp(type, "json_object")) {
		static const char *const known[] = { "type", NULL };
		if (nxh_only_fields(r, rf, "response_format.", known))
			return -1;
		if (type[0] == 'j')
			json_object_set_new(q, "format", json_pack("{s:s}", "type", "object"));
		return 0;
	}
	if (strcmp(type, "json_schema")) {
		nxh_req_bad(r, "response_format", "field 'response_format.type' must be \"text\", \"json_object\" or "
			    "\"json_schema\", got \"%.64s\"", type);
		return -1;
	}
	static const char *const known[] = { "type", "json_schema", NULL };
	static const char *const js_known[] = { "name", "schema", "strict", "description", NULL };
	if (nxh_only_fields(r, rf, "response_format.", known))
		return -1;
	const json_t *js = json_object_get(rf, "json_schema");
	if (!json_is_object(js)) {
		nxh_req_bad(r, "response_format", "field 'response_format.json_schema' must be an object with 'name' and "
			    "'schema'");
		return -1;
	}
	const char *name = NULL;
	bool strict = false, has;
	if (nxh_only_fields(r, js, "response_format.json_schema.", js_known) ||
	    nxh_get_str(r, js, "name", "response_format.json_schema.", &name, &has) ||
	    nxh_get_bool(r, js, "strict", "response_format.json_schema.", &strict, &has))
		return -1;
	if (!name) {
		nxh_req_bad(r, "response_format", "field 'response_format.json_schema.name' is required");
		return -1;
	}
	const json_t *schema = json_object_get(js, "schema");
	if (!schema || json_is_null(schema)) {
		json_object_set_new(q, "format", json_pack("{s:s}", "type", "object"));
		return 0;
	}
	if (!json_is_object(schema)) {
		nxh_req_bad(r, "response_format", "field 'response_format.json_schema.schema' must be a JSON schema object");
		return -1;
	}
	json_object_set_new(q, "format", json_deep_copy(schema)); /* nxd compiles it, or names what it cannot */
	return 0;
}

/* ollama: "json" (a JSON object, as ollama's own json mode), a schema, or
 * "" (free text). */
int nxh_ollama_format(struct nxh_req *r, const json_t *b, json_t *q)
{
	const json_t *f = json_object_get(b, "format");
	if (!f || json_is_null(f))
		return 0;
	if (json_is_string(f)) {
		const char *s = json_string_value(f);
		if (!*s)
			return 0;
		if (!strcmp(s, "json")) {
			json_object_set_new(q, "format", json_pack("{s:s}", "type", "object"));
			return 0;
		}
		nxh_req_bad(r, "format", "field 'format' must be \"json\" or a JSON schema object, got \"%.64s\"", s);
		return -1;
	}
	if (!json_is_object(f)) {
		nxh_req_bad(r, "format", "field 'format' must be \"json\" or a JSON schema object");
		return -1;
	}
	json_object_set_new(q, "format", json_deep_copy(f));
	return 0;
}
