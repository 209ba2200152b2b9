/* chat.h - chat templates: detect the family from tokenizer.chat_template and render messages into the prompt text.
 *
 * No Jinja interpreter: the template source is only read to tell the family
 * (by its marker tokens) and to pull out a default system prompt. Each family
 * is rendered by hand to exactly what the Hugging Face template produces for
 * the same messages:
 *
 *   ChatML (Qwen2, SmolLM2):
 *     [default system]<|im_start|>{role}\n{content}<|im_end|>\n ...
 *     + "<|im_start|>assistant\n" with add_generation_prompt.
 *     Content is not trimmed. When the conversation has no system message
 *     and the template inserts one (a string literal
 *     '<|im_start|>system\n...<|im_end|>...' in the source, as in Qwen2's
 *     and SmolLM2's), that literal is inserted first, verbatim.
 *   Llama 2 (meta-llama/Llama-2-*-chat-hf):
 *     <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
 *     Each turn is strip()ped (Python whitespace); user and assistant must
 *     alternate starting with user (the HF template raises otherwise); no
 *     generation prompt is added (the template has none). A default system
 *     prompt is taken from `set system_message = '...'` when the template
 *     has one (not when it is gated on USE_DEFAULT_PROMPT, which HF leaves
 *     undefined).
 *   Llama 3 (Meta-Llama-3-*-Instruct):
 *     <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ...
 *     + "<|start_header_id|>assistant<|end_header_id|>\n\n" with
 *     add_generation_prompt. Content is trimmed (`| trim`).
 *   Llama 3.1 (Llama-3.1/3.2/3.3-*-Instruct: "Cutting Knowledge Date" in the
 *     template): as Llama 3, but the system turn always comes first and
 *     begins "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
 *     before the (trimmed) system message, if any. {date} is the template's
 *     `set date_string = "..."` (26 Jul 2024 in Meta's), or today's
 *     ("%d %b %Y", as Hugging Face's strftime_now gives it) when the
 *     template asks strftime_now (Llama 3.2's). Tools: tok/tools.h.
 *   Qwen3 (ChatML with reasoning_content and last_query_index): ChatML
 *     without a default system, and an assistant turn's "<think>...</think>"
 *     reasoning dropped (what follows "</think>", its leading newlines
 *     stripped), except an assistant turn after the last user message that
 *     is the last message or had reasoning: "<think>\n{reasoning}\n</think>\n\n"
 *     then the content. The generation prompt is "<|im_start|>assistant\n"
 *     (thinking on, enable_thinking undefined). Tools: tok/tools.h.
 *   Mistral v3 (Mistral-7B-Instruct-v0.3, Mistral-Large-2407):
 *     <s>[INST] {user}[/INST] {assistant}</s>[INST] {system}\n\n{user}[/INST]
 *     The system message goes into the last message when that is a user
 *     one (and nowhere else); assistant turns are trimmed; user and
 *     assistant must alternate after the system message; no generation
 *     prompt (the template has none).
 *   Mistral v3 tekken (Mistral-Nemo-Instruct-2407): as v3 without the
 *     spaces: "[INST]{user}[/INST]{assistant}</s>", nothing trimmed.
 *   Mistral v7 (Mistral-Large-Instruct-2411): <s> then each message in
 *     order: "[SYSTEM_PROMPT] {system}[/SYSTEM_PROMPT]",
 *     "[INST] {user}[/INST]", " {assistant}</s>".
 *   Mistral v7 tekken (Mistral-Small-3.x-24B-Instruct):
 *     <s>[SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT][INST]{user}[/INST]{assistant}</s>
 *     The system prompt is always there: the conversation's, else the
 *     template's default_system_message (its string literals and its
 *     `today`, strftime_now of the template's format), its lines joined
 *     as Jinja joins them (backslash-newline is nothing). Turns need not
 *     alternate (the template's check sets its list inside a loop, where
 *     Jinja drops it).
 *   DeepSeek R1 (the DeepSeek-R1 distills, DeepSeek-R1):
 *     <｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜>{answer}<｜end▁of▁sentence｜>
 *     An assistant turn keeps only what follows its last "</think>". The
 *     generation prompt is "<｜Assistant｜><think>\n" (or "<｜Assistant｜>"
 *     for the templates that do not open the reasoning themselves).
 *   Phi-3 (Phi-3-mini/-medium-*-instruct, Phi-3.5-mini-instruct: one of
 *     their templates, told apart from any other by its whole text, spelling
 *     of literals and spaces in tags aside):
 *     <|{role}|>\n{content}<|end|>\n ... + "<|assistant|>\n" with
 *     add_generation_prompt, else the eos_token "<|endoftext|>". Content is
 *     not trimmed; Phi-3.5's template leaves out an empty system message.
 *   Gemma (Gemma 1, 2 and 3 instruct: "<start_of_turn>" in the template):
 *     <bos><start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n{content}<end_of_turn>\n ...
 *     + "<start_of_turn>model\n" with add_generation_prompt; the assistant's
 *     role is "model", content is trimmed, user and assistant must alternate
 *     starting with user (the template raises otherwise). Gemma 3's folds a
 *     system message into the first turn: "{system}\n\n" (not trimmed)
 *     before its content; Gemma 2's raises "System role not supported", and
 *     so does nxd for a template that says so. The "<bos>" only where the
 *     template writes bos_token (the first gemma-7b-it template does not).
 *   Raw (no template in the file): the contents one after another, nothing
 *     added, for base models that just continue text.
 *   Unknown: a template that is none of these (a ChatML one that opens
 *     "<think>" itself, Phi-4's <|im_sep|> turns, SmolLM3's (its system turn
 *     built from metadata, a /think or /no_think switch and a default
 *     instruction), Mistral's [INST] without <<SYS>>, ...). Rendering it
 *     is an error naming nxd --chat-template: never a guess.
 *
 * BOS / EOS appear as text ("<s>", "</s>", "<|begin_of_text|>", "<bos>"): the
 * tokenizer must be run with special-token parsing on the rendered prompt,
 * and must not add another BOS of its own for Llama 2 / Llama 3 prompts.
 *
 * Roles are "system", "user" and "assistant"; a system message may only come
 * first. Anything else is an error naming the message and its role. */
#ifndef NX_CHAT_H
#define NX_CHAT_H

#include <stdbool.h>

#include "common/err.h"

enum nx_chat_tmpl {
	NX_CHAT_RAW,
	NX_CHAT_CHATML,
	NX_CHAT_LLAMA2,
	NX_CHAT_LLAMA3,
	NX_CHAT_LLAMA31,
	NX_CHAT_QWEN3,
	NX_CHAT_MISTRAL_V3,
	NX_CHAT_MISTRAL_V3_TEKKEN,
	NX_CHAT_MISTRAL_V7,
	NX_CHAT_MISTRAL_V7_TEKKEN,
	NX_CHAT_DEEPSEEK_R1,
	NX_CHAT_PHI3,
	NX_CHAT_GEMMA,
	NX_CHAT_N_KNOWN, /* the templates above can be rendered and named */
	NX_CHAT_UNKNOWN = NX_CHAT_N_KNOWN,
};

struct nx_chat_msg {
	const char *role;
	const char *content;
};

/* From the tokenizer.chat_template source (NULL or empty: RAW):
 * "<|im_start|>" -> ChatML, or Qwen3 (with "<think>", reasoning_content and
 * last_query_index, and no "<|im_start|>assistant\n<think>\n" literal),
 * "<|start_header_id|>" -> Llama 3, or Llama 3.1 (with "Cutting Knowledge
 * Date"), "[INST]" with "<<SYS>>" -> Llama 2; "[SYSTEM_PROMPT]" literals ->
 * Mistral v7 ("[SYSTEM_PROMPT] ") or v7 tekken ("[SYSTEM_PROMPT]"); "[INST]"
 * and "[/INST]" literals with the system message in the last user turn ->
 * Mistral v3 ("[INST] ") or v3 tekken ("[INST]"); "<｜User｜>" and
 * "<｜Assistant｜>" cutting "</think>" -> DeepSeek R1; Phi-3's or Phi-3.5's
 * template -> Phi-3; "<start_of_turn>" -> Gemma; anything else (ChatML with
 * other "<think>" handling or with "<|im_sep|>", Mistral v1's "[INST] ...
 * [/INST]") -> UNKNOWN. */
enum nx_chat_tmpl nx_chat_detect(const char *jinja);

/* "raw", "chatml", "llama2", "llama3", "llama3.1", "qwen3", "mistral-v3",
 * "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "deepseek-r1", "phi3",
 * "gemma"; "unknown". */
const char *nx_chat_tmpl_name(enum nx_chat_tmpl t);

/* The inverse of nx_chat_tmpl_name for the known ones (nxd --chat-template). */
int nx_chat_tmpl_parse(const char *name, enum nx_chat_tmpl *out, struct nx_err *err);

/* Reads a Jinja chat template from a file (nxd --chat-template FILE) and
 * tells its family as nx_chat_detect does; *src is its malloc'd text (one
 * trailing newline dropped, as Jinja drops it). A template of no family nxd
 * renders, an empty or unreadable file, is an error naming the file. */
int nx_chat_template_file(const char *path, char **src, enum nx_chat_tmpl *t, struct nx_err *err);

/* The known names, comma-separated ("raw, chatml, ..."), for messages. */
const char *nx_chat_tmpl_names(void);

/* The default system prompt text the template inserts when a conversation
 * has none: *out is a malloc'd string, or NULL when the template has none. */
int nx_chat_default_system(enum nx_chat_tmpl t, const char *jinja, char **out, struct nx_err *err);

/* Whether the model thinks before it answers, as a request asks it. */
enum nx_chat_thinking {
	NX_CHAT_THINK_DEFAULT, /* as the template does without enable_thinking */
	NX_CHAT_THINK_OFF,     /* Qwen3's enable_thinking=false: an empty <think></think> block opens the answer */
	NX_CHAT_THINK_ON,      /* enable_thinking=true: as the default, for templates that think */
};

struct nx_chat_opts {
	bool add_generation_prompt;
	enum nx_chat_thinking thinking; /* OFF needs a template with the switch (qwen3), ON one that thinks */
};

/* Renders n messages; *out is a malloc'd NUL-terminated string the caller
 * frees. jinja (may be NULL) is only read for the default system prompt and
 * Llama 3.1's date. UNKNOWN is an error naming nxd --chat-template. */
int nx_chat_render(enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_msg *msgs, int n,
		   bool add_generation_prompt, char **out, struct nx_err *err);

/* nx_chat_render with the request's options; a thinking option the template
 * has no switch for is an error naming the option. */
int nx_chat_render_opts(enum nx_chat_tmpl t, const char *jinja, const struct nx_chat_msg *msgs, int n,
			const struct nx_chat_opts *opts, char **out, struct nx_err *err);

#endif
