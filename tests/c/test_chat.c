/* test_chat.c - chat template detection, default system prompts and rendering, checked against what the Hugging Face templates render. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tok/chat.h"

/* Real tokenizer.chat_template sources. SMOLLM2 is the default model's, as
 * stored in its GGUF (test_model_template checks that when NXD_MODEL is
 * set); QWEN2 is Qwen2-*-Instruct's; LLAMA3 Meta-Llama-3-8B-Instruct's;
 * LLAMA2 Llama-2-7b-chat-hf's (with its '\\n' escapes kept as Jinja
 * escapes, as in tokenizer_config.json). LLAMA2_DEF is LLAMA2 with a default
 * system prompt (the shape older Llama 2 templates had), written with
 * escapes to exercise literal decoding. The expected strings below were
 * produced by rendering these sources with jinja2 3.1 (bos/eos tokens as
 * the models define them). */
static const char SMOLLM2_TMPL[] =
	"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char QWEN2_TMPL[] =
	"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char LLAMA3_TMPL[] =
	"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static const char LLAMA2_TMPL[] =
	"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char LLAMA2_DEF_TMPL[] =
	"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif not '<<SYS>>' in messages[0]['content'] %}{% set loop_messages = messages %}{% set system_message = 'Be brief.\\nDon\\'t make things up.' %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static char *render(enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_msg *m, int n, bool gen)
{
	struct nx_err err = { { 0 } };
	char *out = (char *)1;
	if (nx_chat_render(t, jinja, m, n, gen, &out, &err))
		fail_msg("nx_chat_render(%s): %s", nx_chat_tmpl_name(t), err.msg);
	assert_non_null(out);
	return out;
}

static void expect_render(const char *jinja, const struct nx_chat_msg *m, int n, bool gen, const char *want)
{
	char *got = render(nx_chat_detect(jinja), jinja, m, n, gen);
	if (strcmp(got, want) != 0)
		fail_msg("rendered\n[%s]\nwant\n[%s]", got, want);
	free(got);
}

static const struct nx_chat_msg conv_a[] = { { "user", "Hello!" } };
static const struct nx_chat_msg conv_b[] = {
	{ "system", "You are terse." }, { "user", "Hi" }, { "assistant", "Hello." }, { "user", "Bye" },
};
static const struct nx_chat_msg conv_c[] = { { "user", "  padded \n" }, { "assistant", "\tok  " } };

static void test_detect(void **state)
{
	(void)state;
	assert_int_equal(nx_chat_detect(SMOLLM2_TMPL), NX_CHAT_CHATML);
	assert_int_equal(nx_chat_detect(QWEN2_TMPL), NX_CHAT_CHATML);
	assert_int_equal(nx_chat_detect(LLAMA3_TMPL), NX_CHAT_LLAMA3);
	assert_int_equal(nx_chat_detect(LLAMA2_TMPL), NX_CHAT_LLAMA2);
	assert_int_equal(nx_chat_detect(LLAMA2_DEF_TMPL), NX_CHAT_LLAMA2);
	assert_int_equal(nx_chat_detect(NULL), NX_CHAT_RAW);
	assert_int_equal(nx_chat_detect(""), NX_CHAT_RAW);
	/* a template of no family nxd renders is unknown, not raw: rendering it is an error */
	assert_int_equal(nx_chat_detect("{% for m in messages %}{{ m['content'] }}{% endfor %}"), NX_CHAT_UNKNOWN);
	assert_int_equal(nx_chat_detect("[INST] {{ m }} [/INST]"), NX_CHAT_UNKNOWN); /* Mistral's: no <<SYS>> */
	assert_int_equal(nx_chat_detect("{{ '<|im_start|>assistant\\n<think>\\n' }} reasoning_content last_query_index"),
			 NX_CHAT_UNKNOWN);
	/* Phi-3's template (with its newlines as escapes) is phi3; Phi-4's <|im_sep|> turns are not ChatML */
	assert_int_equal(nx_chat_detect("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + "
					"message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + "
					"message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + "
					"message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
					"'<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"),
			 NX_CHAT_PHI3);
	assert_int_equal(nx_chat_detect("{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}"), NX_CHAT_UNKNOWN);
	assert_int_equal(nx_chat_detect("{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{{ '<|assistant|>\\n' }}"),
			 NX_CHAT_UNKNOWN);
	assert_string_equal(nx_chat_tmpl_name(NX_CHAT_UNKNOWN), "unknown");

	for (int t = NX_CHAT_RAW; t < NX_CHAT_N_KNOWN; t++) {
		enum nx_chat_tmpl back = NX_CHAT_RAW;
		assert_int_equal(nx_chat_tmpl_parse(nx_chat_tmpl_name((enum nx_chat_tmpl)t), &back, NULL), 0);
		assert_int_equal(back, t);
	}
	assert_string_equal(nx_chat_tmpl_name(NX_CHAT_CHATML), "chatml");
	struct nx_err err = { { 0 } };
	enum nx_chat_tmpl t;
	assert_int_equal(nx_chat_tmpl_parse("vicuna", &t, &err), -1);
	assert_non_null(strstr(err.msg, "\"vicuna\""));
	assert_int_equal(nx_chat_tmpl_parse("unknown", &t, &err), -1);
}

static void expect_default(enum nx_chat_tmpl t, const char *jinja, const char *want)
{
	char *got = (char *)1;
	struct nx_err err = { { 0 } };
	if (nx_chat_default_system(t, jinja, &got, &err))
		fail_msg("nx_chat_default_system: %s", err.msg);
	if (!want) {
		if (got)
			fail_msg("expected no default system prompt, got [%s]", got);
		return;
	}
	if (!got)
		fail_msg("expected default system prompt [%s], got none", want);
	assert_string_equal(got, want);
	free(got);
}

static void test_default_system(void **state)
{
	(void)state;
	expect_default(NX_CHAT_CHATML, SMOLLM2_TMPL,
		       "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
	expect_default(NX_CHAT_CHATML, QWEN2_TMPL, "You are a helpful assistant.");
	expect_default(NX_CHAT_LLAMA3, LLAMA3_TMPL, NULL);
	expect_default(NX_CHAT_LLAMA2, LLAMA2_TMPL, NULL);
	expect_default(NX_CHAT_LLAMA2, LLAMA2_DEF_TMPL, "Be brief.\nDon't make things up.");
	expect_default(NX_CHAT_CHATML, NULL, NULL);
	expect_default(NX_CHAT_RAW, SMOLLM2_TMPL, NULL);
	/* plain ChatML with no default */
	expect_default(NX_CHAT_CHATML,
		       "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
		       "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
		       NULL);
	/* Jinja escapes inside the literal are decoded like Jinja does */
	expect_default(NX_CHAT_CHATML, "{{ \"<|im_start|>system\\nCaf\\u00e9 \\x41\\101 \\\"q\\\"<|im_end|>\\n\" }}",
		       "Caf\xc3\xa9 AA \"q\"");
	/* a literal outside a tag, or in a comment, is not template output */
	expect_default(NX_CHAT_CHATML, "'<|im_start|>system\nNo<|im_end|>' {# '<|im_start|>system\nNo<|im_end|>' #}",
		       NULL);
	/* Llama 2 defaults gated on USE_DEFAULT_PROMPT are never used by HF */
	expect_default(NX_CHAT_LLAMA2,
		       "{% if USE_DEFAULT_PROMPT == true %}{% set system_message = 'DEFAULT' %}{% endif %}[INST]", NULL);
	/* an expression that starts with a literal is not a default */
	expect_default(NX_CHAT_LLAMA2, "{% set system_message = '<<SYS>>\\n' + messages[0]['content'] %}[INST]", NULL);
}

static void test_render_chatml(void **state)
{
	(void)state;
	/* SmolLM2: its default system prompt goes in when the conversation has none */
	expect_render(SMOLLM2_TMPL, conv_a, 1, true,
		      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
		      "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
	expect_render(SMOLLM2_TMPL, conv_b, 4, true,
		      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
		      "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
	expect_render(SMOLLM2_TMPL, conv_c, 2, false,
		      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
		      "<|im_start|>user\n  padded \n<|im_end|>\n<|im_start|>assistant\n\tok  <|im_end|>\n");
	expect_render(QWEN2_TMPL, conv_a, 1, true,
		      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
		      "<|im_start|>assistant\n");
	expect_render(QWEN2_TMPL, conv_b, 4, false,
		      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
		      "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n");
	/* ChatML forced without a template source: no default to insert */
	char *s = render(NX_CHAT_CHATML, NULL, conv_a, 1, true);
	assert_string_equal(s, "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
	free(s);
}

static void test_render_llama3(void **state)
{
	(void)state;
	expect_render(LLAMA3_TMPL, conv_a, 1, true,
		      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
		      "<|start_header_id|>assistant<|end_header_id|>\n\n");
	expect_render(LLAMA3_TMPL, conv_b, 4, true,
		      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
		      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
		      "Hello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
		      "<|start_header_id|>assistant<|end_header_id|>\n\n");
	/* content is trimmed (| trim) */
	expect_render(LLAMA3_TMPL, conv_c, 2, false,
		      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|>"
		      "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>");
	/* Python's strip() also removes Unicode spaces (U+3000, U+00A0) */
	const struct nx_chat_msg u[] = { { "user", "\xe3\x80\x80wide\xc2\xa0" } };
	expect_render(LLAMA3_TMPL, u, 1, false,
		      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nwide<|eot_id|>");
}

static void test_render_llama2(void **state)
{
	(void)state;
	/* no generation prompt: the template has none */
	expect_render(LLAMA2_TMPL, conv_a, 1, true, "<s>[INST] Hello! [/INST]");
	expect_render(LLAMA2_TMPL, conv_b, 4, true,
		      "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
	expect_render(LLAMA2_TMPL, conv_c, 2, false, "<s>[INST] padded [/INST] ok </s>");
	expect_render(LLAMA2_DEF_TMPL, conv_a, 1, true,
		      "<s>[INST] <<SYS>>\nBe brief.\nDon't make things up.\n<</SYS>>\n\nHello! [/INST]");
	expect_render(LLAMA2_DEF_TMPL, conv_b, 4, true,
		      "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
	/* the whole first turn is stripped, so the user's leading spaces stay */
	expect_render(LLAMA2_DEF_TMPL, conv_c, 2, false,
		      "<s>[INST] <<SYS>>\nBe brief.\nDon't make things up.\n<</SYS>>\n\n  padded [/INST] ok </s>");
}

static void test_render_raw(void **state)
{
	(void)state;
	char *s = render(NX_CHAT_RAW, NULL, conv_b, 4, true);
	assert_string_equal(s, "You are terse.HiHello.Bye");
	free(s);
	const struct nx_chat_msg e[] = { { "user", "" } };
	s = render(NX_CHAT_RAW, NULL, e, 1, false);
	assert_string_equal(s, "");
	free(s);
}

static void expect_error(enum nx_chat_tmpl t, const struct nx_chat_msg *m, int n, const char *a, const char *b)
{
	struct nx_err err = { { 0 } };
	char *out = (char *)1;
	assert_int_equal(nx_chat_render(t, NULL, m, n, true, &out, &err), -1);
	assert_null(out);
	if (!strstr(err.msg, a) || (b && !strstr(err.msg, b)))
		fail_msg("error [%s] should mention [%s] and [%s]", err.msg, a, b ? b : "");
}

static void test_bad_messages(void **state)
{
	(void)state;
	const struct nx_chat_msg tool[] = { { "user", "hi" }, { "tool", "42" } };
	for (int t = NX_CHAT_RAW; t < NX_CHAT_N_KNOWN; t++)
		expect_error((enum nx_chat_tmpl)t, tool, 2, "message 1", "\"tool\"");
	expect_error(NX_CHAT_UNKNOWN, conv_a, 1, "not one nxd can render", "--chat-template NAME");
	const struct nx_chat_msg late_sys[] = { { "user", "hi" }, { "assistant", "yo" }, { "system", "be nice" } };
	/* where the template raises on it (ChatML and most others render it in place: test_chat_templates.py) */
	expect_error(NX_CHAT_LLAMA2, late_sys, 3, "message 2", "the llama2 template takes a system message only first");
	expect_error(NX_CHAT_MISTRAL_V3, late_sys, 3, "message 2", "system message only first");
	const struct nx_chat_msg no_content[] = { { "user", NULL } };
	expect_error(NX_CHAT_LLAMA3, no_content, 1, "message 0", "no content");
	const struct nx_chat_msg no_role[] = { { NULL, "x" } };
	expect_error(NX_CHAT_LLAMA3, no_role, 1, "message 0", "no role");
	expect_error(NX_CHAT_CHATML, conv_a, 0, "no messages", NULL);
	/* Llama 2 needs user/assistant alternation, as its template raises */
	const struct nx_chat_msg uu[] = { { "system", "s" }, { "user", "a" }, { "user", "b" } };
	expect_error(NX_CHAT_LLAMA2, uu, 3, "message 2", "alternate");
	const struct nx_chat_msg a_first[] = { { "assistant", "a" } };
	expect_error(NX_CHAT_LLAMA2, a_first, 1, "message 0", "alternate");
	const struct nx_chat_msg only_sys[] = { { "system", "s" } };
	expect_error(NX_CHAT_LLAMA2, only_sys, 1, "needs a user message", NULL);
	/* ChatML and Llama 3 do not require alternation (their templates do not) */
	char *s = render(NX_CHAT_CHATML, NULL, uu, 3, false);
	assert_string_equal(s, "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n");
	free(s);
	/* a long unknown role is cut in the message, not overflowed */
	char big[2000];
	memset(big, 'r', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	const struct nx_chat_msg huge[] = { { big, "x" } };
	expect_error(NX_CHAT_CHATML, huge, 1, "message 0", "rrrr");
	/* an out-of-range template value is refused like an unknown one */
	struct nx_err err = { { 0 } };
	char *out;
	assert_int_equal(nx_chat_render((enum nx_chat_tmpl)42, NULL, conv_a, 1, true, &out, &err), -1);
	assert_non_null(strstr(err.msg, "not one nxd can render"));
}

/* tokenizer.chat_template comes from an untrusted file: junk made of the
 * scanner's own delimiters (unterminated tags, strings, escapes at the very
 * end) must be read without crossing the string's end. Run under ASan to
 * see it; here it must at least not crash and keep the results sane. */
static void test_junk_templates(void **state)
{
	(void)state;
	static const char *const bits[] = {
		"{{", "}}", "{%", "%}", "{#", "#}", "'", "\"", "\\", "\\u12", "\\x4", "\\U0011ffff", "\\777",
		"<|im_start|>system\n", "<|im_end|>", "system_message", " = ", "-%}", "[INST]",
		"<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>", "a", "\n",
	};
	const int nb = (int)(sizeof(bits) / sizeof(bits[0]));
	uint64_t r = 0x1234567;
	char tmpl[512];
	for (int round = 0; round < 3000; round++) {
		size_t len = 0;
		int parts = 1 + (int)(r % 24);
		for (int i = 0; i < parts; i++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			const char *b = bits[(r >> 33) % (uint64_t)nb];
			size_t bl = strlen(b);
			if (len + bl >= sizeof(tmpl))
				break;
			memcpy(tmpl + len, b, bl);
			len += bl;
		}
		tmpl[len] = '\0';
		/* the copy is exactly len + 1 bytes, so ASan sees any over-read */
		char *t = malloc(len + 1);
		assert_non_null(t);
		memcpy(t, tmpl, len + 1);
		enum nx_chat_tmpl kind = nx_chat_detect(t);
		for (int k = NX_CHAT_RAW; k < NX_CHAT_N_KNOWN; k++) {
			char *def = NULL;
			assert_int_equal(nx_chat_default_system((enum nx_chat_tmpl)k, t, &def, NULL), 0);
			if (def)
				assert_true(strlen(def) <= len);
			free(def);
		}
		char *out = NULL;
		assert_int_equal(nx_chat_render(kind, t, conv_a, 1, true, &out, NULL), kind == NX_CHAT_UNKNOWN ? -1 : 0);
		assert_true(kind == NX_CHAT_UNKNOWN ? out == NULL : out != NULL);
		free(out);
		free(t);
	}
}

/* The SMOLLM2 fixture is the default model's tokenizer.chat_template, byte
 * for byte (GGUF stores strings raw, so the bytes appear in the file). */
static void test_model_template(void **state)
{
	(void)state;
	/* NXD_MODEL, else where scripts/fetch-model caches it */
	char def[1024];
	const char *path = getenv("NXD_MODEL");
	if (!path || !*path) {
		const char *cache = getenv("NXD_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
		if (cache && *cache)
			snprintf(def, sizeof(def), "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
		else if (xdg && *xdg)
			snprintf(def, sizeof(def), "%s/nxd/models/SmolLM2-135M-Instruct.Q4_1.gguf", xdg);
		else
			snprintf(def, sizeof(def), "%s/.cache/nxd/models/SmolLM2-135M-Instruct.Q4_1.gguf",
				 home ? home : "");
		path = def;
	}
	FILE *f = fopen(path, "rb");
	if (!f) {
		if (getenv("NXD_MODEL") && *getenv("NXD_MODEL"))
			fail_msg("NXD_MODEL=%s cannot be opened", path);
		print_message("no model at %s (run scripts/fetch-model): skipping\n", path);
		skip();
	}
	/* metadata comes first; 8 MiB is far past it for this model */
	size_t cap = 8u << 20;
	char *buf = malloc(cap);
	assert_non_null(buf);
	size_t n = fread(buf, 1, cap, f);
	fclose(f);
	const char *hit = memmem(buf, n, SMOLLM2_TMPL, sizeof(SMOLLM2_TMPL) - 1);
	free(buf);
	if (!hit)
		fail_msg("the SmolLM2 fixture does not appear in %s", path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_detect),
		cmocka_unit_test(test_default_system),
		cmocka_unit_test(test_render_chatml),
		cmocka_unit_test(test_render_llama3),
		cmocka_unit_test(test_render_llama2),
		cmocka_unit_test(test_render_raw),
		cmocka_unit_test(test_bad_messages),
		cmocka_unit_test(test_junk_templates),
		cmocka_unit_test(test_model_template),
	};
	return cmocka_run_group_tests_name("chat", tests, NULL, NULL);
}
