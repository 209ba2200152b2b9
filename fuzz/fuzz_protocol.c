/* fuzz_protocol.c - libFuzzer target: one request line through nxp_parse, then every event encoder on what it parsed.
 *
 * The input is one request line. It is parsed twice: with the limits
 * n_vocab 1000, n_ctx 64, max_tokens 128, max_line 8192 (what fuzz/seeds.tsv
 * expects), and with none. Properties, each an abort when broken:
 *   - a failure has a known code and a message, and req.id is always valid
 *     JSON (null, an integer or a string) shorter than NXP_ID_MAX;
 *   - a success obeys every documented bound (counts, lengths, ranges);
 *   - every event encoded from the request's strings and numbers (error, hello,
 *     token with logprobs, done, tokens, text, status, ok) is one line of
 *     JSON, an object whose "id" equals the request's id, and obeys the
 *     snprintf contract: a short buffer gets a NUL-terminated prefix and the
 *     same length; the _alloc variants give the same line;
 *   - nxp_json_str of the raw input is a JSON string that decodes to the
 *     input whenever the input is valid UTF-8. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/util.h"
#include "proto/proto.h"

static const struct nxp_limits LIM = { .n_vocab = 1000, .n_ctx = 64, .max_tokens = 128, .max_line = 8192 };

/* Checks one encoded line: JSON object, "event" set, "id" as given (NULL id: null or absent). */
static void check_line(const char *what, const char *line, size_t n, const char *id)
{
	json_error_t je;

	FUZZ_CHECK(n >= 3 && line[n - 1] == '\n' && strlen(line) == n, "%s: line of %zu bytes not ending in \\n",
		   what, n);
	FUZZ_CHECK(memchr(line, '\n', n - 1) == NULL, "%s: newline inside the line", what);
	size_t bad = 0;
	FUZZ_CHECK(fuzz_utf8_valid((const uint8_t *)line, n, &bad), "%s: invalid UTF-8 at byte %zu", what, bad);
	json_t *j = json_loadb(line, n - 1, JSON_REJECT_DUPLICATES, &je);
	FUZZ_CHECK(j && json_is_object(j), "%s: not a JSON object (%s): %.300s", what, j ? "not an object" : je.text,
		   line);
	json_t *ev = json_object_get(j, "event");
	FUZZ_CHECK(json_is_string(ev), "%s: no \"event\": %.300s", what, line);
	json_t *jid = json_object_get(j, "id");
	if (id) {
		json_t *want = json_loads(id, JSON_DECODE_ANY, &je);
		FUZZ_CHECK(want, "%s: id '%s' is not JSON", what, id);
		FUZZ_CHECK(jid && json_equal(jid, want), "%s: id %s came back as something else: %.300s", what, id, line);
		json_decref(want);
	} else if (strcmp(json_string_value(ev), "hello") != 0) {
		FUZZ_CHECK(jid && json_is_null(jid), "%s: NULL id not written as null: %.300s", what, line);
	}
	json_decref(j);
}

/* Runs an encoder expression (using buf and cap) into a 16-byte buffer, then
 * into one of the size it asked for; checks both and the line. */
#define ENC(what, id, expr) \
	do { \
		char small_[16], *buf = small_; \
		size_t cap = sizeof(small_); \
		size_t n1_ = (expr); \
		FUZZ_CHECK(strlen(small_) == (n1_ < cap ? n1_ : cap - 1), "%s: short buffer not cut at its end", what); \
		buf = malloc(n1_ + 1); \
		if (!buf) \
			abort(); \
		cap = n1_ + 1; \
		size_t n2_ = (expr); \
		FUZZ_CHECK(n2_ == n1_, "%s: length %zu, then %zu", what, n1_, n2_); \
		FUZZ_CHECK(!memcmp(buf, small_, strlen(small_)), "%s: short buffer is not a prefix", what); \
		check_line(what, buf, n2_, id); \
		free(buf); \
	} while (0)

static void check_alloc(const char *what, char *line, size_t len, const char *id)
{
	FUZZ_CHECK(line != NULL, "%s: out of memory", what);
	FUZZ_CHECK(strlen(line) == len, "%s: length %zu, strlen %zu", what, len, strlen(line));
	check_line(what, line, len, id);
	free(line);
}

static void check_json_str(const char *s, size_t len)
{
	size_t n = nxp_json_str(NULL, 0, s, len);
	char *buf = malloc(n + 1);
	if (!buf)
		abort();
	FUZZ_CHECK(nxp_json_str(buf, n + 1, s, len) == n, "json_str: length changed");
	FUZZ_CHECK(strlen(buf) == n, "json_str: NUL inside");
	json_error_t je;
	json_t *j = json_loadb(buf, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
	FUZZ_CHECK(json_is_string(j), "json_str: not a JSON string (%s): %.300s", j ? "other type" : je.text, buf);
	if (fuzz_utf8_valid((const uint8_t *)s, len, NULL))
		FUZZ_CHECK(json_string_length(j) == len && !memcmp(json_string_value(j), s, len),
			   "json_str: valid UTF-8 did not round-trip: %.300s", buf);
	json_decref(j);
	free(buf);
}

static void check_request(const struct nxp_request *r, const struct nxp_limits *lim)
{
	FUZZ_CHECK(r->op > NXP_OP_NONE, "op %d", r->op);
	if (r->op == NXP_OP_GENERATE) {
		const struct nxp_generate *g = &r->u.gen;
		int max = lim ? lim->max_tokens : INT32_MAX;
		FUZZ_CHECK(g->max_tokens >= 1 && g->max_tokens <= max, "max_tokens %d", g->max_tokens);
		FUZZ_CHECK(g->n_stop >= 0 && g->n_stop <= NXP_MAX_STOP, "n_stop %d", g->n_stop);
		for (int i = 0; i < g->n_stop; i++)
			FUZZ_CHECK(g->stop[i] && strlen(g->stop[i]) >= 1 && strlen(g->stop[i]) <= NXP_MAX_STOP_LEN,
				   "stop %d", i);
		FUZZ_CHECK(g->n_lora >= 0 && g->n_lora <= NXP_MAX_LORA, "n_lora %d", g->n_lora);
		for (int i = 0; i < g->n_lora; i++) {
			size_t l = strlen(g->lora[i].name);
			FUZZ_CHECK(l >= 1 && l <= NXP_MAX_LORA_NAME && isfinite(g->lora[i].scale), "lora %d", i);
			for (int k = 0; k < i; k++)
				FUZZ_CHECK(strcmp(g->lora[i].name, g->lora[k].name), "lora %d repeats %d", i, k);
		}
		FUZZ_CHECK(g->sampling.n_logprobs >= 0 && g->sampling.n_logprobs <= NXP_MAX_LOGPROBS, "logprobs %d",
			   g->sampling.n_logprobs);
		FUZZ_CHECK(isfinite(g->sampling.temperature) && g->sampling.temperature >= 0, "temperature");
		switch (g->input) {
		case NXP_IN_PROMPT:
			FUZZ_CHECK(g->prompt != NULL, "prompt input without a prompt");
			break;
		case NXP_IN_MESSAGES:
			FUZZ_CHECK(g->n_messages >= 1 && g->n_messages <= NXP_MAX_MESSAGES && g->messages,
				   "n_messages %d", g->n_messages);
			for (int i = 0; i < g->n_messages; i++)
				FUZZ_CHECK((g->messages[i].content ||
					    (g->messages[i].tool_calls && g->messages[i].role == NXP_ROLE_ASSISTANT)) &&
						   g->messages[i].role <= NXP_ROLE_TOOL,
					   "message %d", i);
			break;
		case NXP_IN_TOKENS:
			FUZZ_CHECK(g->n_tokens >= 1 && g->tokens, "n_tokens %d", g->n_tokens);
			if (lim)
				FUZZ_CHECK(g->n_tokens <= lim->n_ctx, "n_tokens %d > n_ctx", g->n_tokens);
			for (int i = 0; i < g->n_tokens; i++)
				FUZZ_CHECK(g->tokens[i] >= 0 && (!lim || g->tokens[i] < lim->n_vocab), "token %d = %d", i,
					   g->tokens[i]);
			break;
		default:
			FUZZ_CHECK(0, "input kind %d", g->input);
		}
	} else if (r->op == NXP_OP_DETOKENIZE) {
		FUZZ_CHECK(r->u.detok.n_tokens >= 0 && (r->u.detok.n_tokens == 0 || r->u.detok.tokens), "n_tokens %d",
			   r->u.detok.n_tokens);
		for (int i = 0; i < r->u.detok.n_tokens; i++)
			FUZZ_CHECK(r->u.detok.tokens[i] >= 0 && (!lim || r->u.detok.tokens[i] < lim->n_vocab),
				   "token %d = %d", i, r->u.detok.tokens[i]);
	} else if (r->op == NXP_OP_TOKENIZE) {
		FUZZ_CHECK(r->u.tok.text && r->u.tok.add_bos >= -1 && r->u.tok.add_bos <= 1, "tokenize fields");
	} else if (r->op >= NXP_OP_LORA_LOAD && r->op <= NXP_OP_LORA_REPORT) {
		const struct nxp_lora_op *l = &r->u.lora;
		if (r->op != NXP_OP_LORA_LIST)
			FUZZ_CHECK(l->name && strlen(l->name) >= 1 && strlen(l->name) <= NXP_MAX_LORA_NAME, "lora op name");
		if (r->op == NXP_OP_LORA_LOAD)
			FUZZ_CHECK(l->path != NULL, "lora_load without a path");
		FUZZ_CHECK(!l->has_scale || isfinite(l->scale), "lora op scale");
		FUZZ_CHECK(l->n_types >= 0 && l->n_types <= NXP_MAX_FOLD_TYPES, "n_types %d", l->n_types);
		FUZZ_CHECK(memchr(l->type, 0, sizeof(l->type)) != NULL, "type not terminated");
		FUZZ_CHECK(l->n_layers >= 0 && (l->n_layers == 0 || l->layers), "n_layers %d", l->n_layers);
	} else if (r->op == NXP_OP_CANCEL) {
		json_error_t je;
		json_t *t = json_loads(r->u.cancel.target, JSON_DECODE_ANY, &je);
		FUZZ_CHECK(t && (json_is_integer(t) || json_is_string(t)), "cancel target '%s'", r->u.cancel.target);
		json_decref(t);
	}
}

/* Every encoder, fed with what the request carries. */
static void encode_events(const struct nxp_request *r)
{
	const char *id = r->id;
	const char *text = "", *t2 = "x";
	size_t tlen = 0;
	const int32_t *toks = NULL;
	int n_toks = 0;
	double num = 0;

	if (r->op == NXP_OP_GENERATE) {
		const struct nxp_generate *g = &r->u.gen;
		if (g->prompt)
			text = g->prompt;
		if (g->n_messages)
			text = g->messages[g->n_messages - 1].content;
		if (g->system)
			t2 = g->system;
		if (g->n_stop)
			t2 = g->stop[0];
		toks = g->tokens, n_toks = g->n_tokens;
		num = g->sampling.temperature * 1e300 + g->max_tokens;
	} else if (r->op == NXP_OP_TOKENIZE) {
		text = r->u.tok.text;
	} else if (r->op == NXP_OP_DETOKENIZE) {
		toks = r->u.detok.tokens, n_toks = r->u.detok.n_tokens;
	} else if (r->op == NXP_OP_CANCEL) {
		text = r->u.cancel.target;
	} else if (r->op >= NXP_OP_LORA_LOAD && r->op <= NXP_OP_LORA_REPORT) {
		if (r->u.lora.name)
			text = r->u.lora.name;
		if (r->u.lora.path)
			t2 = r->u.lora.path;
		else if (r->u.lora.prompt)
			t2 = r->u.lora.prompt;
	}
	tlen = strlen(text);

	struct nxp_hello_info h = { .model = text, .arch = t2, .n_ctx = n_toks, .n_vocab = INT32_MAX };
	ENC("hello", id, nxp_enc_hello(buf, cap, id, &h));
	ENC("hello no id", NULL, nxp_enc_hello(buf, cap, NULL, &h));

	struct nxp_logprob lp[3] = {
		{ .token = 1, .text = text, .text_len = tlen, .logprob = (float)-num },
		{ .token = INT32_MAX, .text = t2, .text_len = strlen(t2), .logprob = NAN },
		{ .token = 0, .text = text, .text_len = tlen > 1 ? tlen - 1 : 0, .logprob = -INFINITY },
	};
	ENC("token", id, nxp_enc_token(buf, cap, id, n_toks, text, tlen, lp, 3));
	ENC("token no lp", id, nxp_enc_token(buf, cap, id, -1, t2, strlen(t2), NULL, 0));

	struct nxp_done d = { .reason = (enum nxp_reason)(tlen % 5), .text = text, .text_len = tlen, .tokens = toks,
			      .n_tokens = n_toks, .prompt_tokens = n_toks, .completion_tokens = (int)tlen,
			      .prefill_ms = num, .decode_ms = NAN, .tokens_per_s = INFINITY };
	ENC("done", id, nxp_enc_done(buf, cap, id, &d));
	size_t len = 0;
	check_alloc("done alloc", nxp_enc_done_alloc(id, &d, &len), len, id);
	d.text = NULL, d.tokens = NULL;
	ENC("done streamed", NULL, nxp_enc_done(buf, cap, NULL, &d));

	ENC("tokens", id, nxp_enc_tokens(buf, cap, id, toks, n_toks));
	check_alloc("tokens alloc", nxp_enc_tokens_alloc(id, toks, n_toks, &len), len, id);
	ENC("text", id, nxp_enc_text(buf, cap, id, text, tlen));
	check_alloc("text alloc", nxp_enc_text_alloc(id, text, tlen, &len), len, id);

	struct nxp_worker_status ws[2] = { { 1, 0, text, 0 }, { 2, -1, t2, INT32_MAX } };
	struct nxp_status st = { .model = text, .arch = t2, .type = t2, .n_ctx = 1, .n_vocab = n_toks,
				 .workers = ws, .n_workers = 2, .slots_total = 8, .queued = (int)tlen,
				 .tokens_served = INT64_MAX, /* jansson (and so nxctl) stops at INT64_MAX */ .seqs_per_step_mean = num, .tokens_per_s = NAN,
				 .uptime_s = -num, .steps = 1, .steps_retried = 0 };
	ENC("status", id, nxp_enc_status(buf, cap, id, &st));
	check_alloc("status alloc", nxp_enc_status_alloc(id, &st, &len), len, id);
	ENC("ok", id, nxp_enc_ok(buf, cap, id));
	ENC("error with text", id, nxp_enc_error(buf, cap, id, (enum nxp_code)(tlen % NXP_E_COUNT), text));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *line = (const char *)data;

	for (int pass = 0; pass < 2; pass++) {
		const struct nxp_limits *lim = pass == 0 ? &LIM : NULL;
		struct nxp_request req;
		struct nxp_error e;
		memset(&e, 0, sizeof(e));
		int rc = nxp_parse(line, size, lim, &req, &e);

		size_t idl = strnlen(req.id, NXP_ID_MAX);
		FUZZ_CHECK(idl > 0 && idl < NXP_ID_MAX, "id of %zu bytes", idl);
		json_error_t je;
		json_t *jid = json_loads(req.id, JSON_DECODE_ANY, &je);
		FUZZ_CHECK(jid && (json_is_null(jid) || json_is_integer(jid) || json_is_string(jid)),
			   "req.id '%s' is not null, an integer or a string", req.id);
		FUZZ_CHECK(req.has_id == !json_is_null(jid) || rc != 0, "has_id %d with id %s", req.has_id, req.id);
		json_decref(jid);

		if (rc) {
			FUZZ_CHECK(rc == -1, "nxp_parse returned %d", rc);
			FUZZ_CHECK(e.code >= 0 && e.code < NXP_E_COUNT, "error code %d", e.code);
			FUZZ_CHECK(e.msg[0] && strnlen(e.msg, sizeof(e.msg)) < sizeof(e.msg), "error without a message");
			ENC("error", req.id, nxp_enc_error(buf, cap, req.id, e.code, e.msg));
		} else {
			check_request(&req, lim);
			encode_events(&req);
		}
		nxp_request_free(&req);
		nxp_request_free(&req); /* documented safe twice */
	}
	check_json_str(line, size);
	return 0;
}
