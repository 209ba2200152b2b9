/* pretok.c - BPE pre-tokenizers: the split regexes each tokenizer.ggml.pre names,
 * compiled once with PCRE2 (UTF + Unicode properties) and applied in sequence. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* The regex lists follow llama.cpp's llm_tokenizer_bpe; where llama.cpp spells
 * out case-insensitive contractions because std::regex lacks (?i:), the
 * original pattern from the model's tokenizer.json is used (PCRE2 has it). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                  \
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
	"|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                \
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
	"|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                     \
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"          \
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"         \
	"[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" \
	"|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                                    \
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"          \
	"|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"         \
	"|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK Unified Ideographs, U+0800..U+4E00 and Hangul, as DeepSeek's tokenizer.json has them. */
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

struct pre_def {
	const char *names;       /* tokenizer.ggml.pre values, '|'-separated */
	bool ignore_merges;
	bool add_bos;            /* default of tokenizer.ggml.add_bos_token */
	const char *re[NX_PRETOK_MAX_RE];
};

static const struct pre_def pre_defs[] = {
	/* llama.cpp's fallback list for "default": punctuation runs, GPT-2, digit runs, digit triples */
	{"default", false, false,
	 {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
	{"gpt-2|phi-2|jina-es|jina-de|jina-v2-es|jina-v2-de|jina-v1-en|jina-v2-code|roberta-bpe|gigachat"
	 "|a.x-4.0|mellum|mpt|olmo|jais|trillion|granite-docling|exaone4",
	 false, false, {RE_GPT2}},
	{"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2", true, true, {RE_LLAMA3}},
	{"dbrx|smaug-bpe|chatglm-bpe|glm4", false, false, {RE_LLAMA3}},
	/* digits one by one, then GPT-2 (HF: Digits(individual_digits) + ByteLevel) */
	{"smollm|starcoder|refact|command-r|codeshell|exaone|minerva-7b", false, false, {"\\p{N}", RE_GPT2}},
	{"qwen2|deepseek-r1-qwen|stablelm2|megrez|hunyuan", false, false, {RE_QWEN2}},
	{"deepseek-coder", false, false, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
	{"falcon", false, false,
	 {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
	{"bloom|poro-chat|gpt3-finnish", false, false,
	 {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"}},
	{"gpt-4o|llama4", false, false, {RE_GPT4O}},
	{"tekken", true, true, {RE_TEKKEN}},
};

static bool name_in(const char *names, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = names; *p;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		if (len == n && memcmp(p, name, n) == 0)
			return true;
		if (!bar)
			break;
		p = bar + 1;
	}
	return false;
}

int nx_pretok_init(struct nx_pretok *p, const char *pre, bool *ignore_merges, bool *add_bos, struct nx_err *err)
{
	const struct pre_def *def = NULL;
	memset(p, 0, sizeof(*p));
	for (size_t i = 0; i < sizeof(pre_defs) / sizeof(pre_defs[0]); i++) {
		if (name_in(pre_defs[i].names, pre)) {
			def = &pre_defs[i];
			break;
		}
	}
	if (!def)
		return nx_errf(err, "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre '%s'", pre);
	*ignore_merges = def->ignore_merges;
	*add_bos = def->add_bos;
	for (int i = 0; i < NX_PRETOK_MAX_RE && def->re[i]; i++) {
		int code;
		PCRE2_SIZE at;
		/* MATCH_INVALID_UTF: invalid bytes in the input never match and end up
		 * as pieces of their own (then byte tokens) instead of failing the call. */
		pcre2_code *re = pcre2_compile((PCRE2_SPTR)def->re[i], PCRE2_ZERO_TERMINATED,
					       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
					       &code, &at, NULL);
		if (!re) {
			PCRE2_UCHAR msg[128];
			pcre2_get_error_message(code, msg, sizeof(msg));
			nx_pretok_free(p);
			return nx_errf(err, "tokenizer: pre-tokenizer '%s' regex %d at %zu: %s", pre, i, (size_t)at,
				       (const char *)msg);
		}
		/* JIT is an optimisation only: without it the interpreter matches the same. */
		pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
		p->re[p->n_re++] = re;
	}
	return 0;
}

void nx_pretok_free(struct nx_pretok *p)
{
	for (int i = 0; i < p->n_re; i++)
		pcre2_code_free(p->re[i]);
	p->n_re = 0;
}

/* Length of the UTF-8 sequence that starts with byte c, 1 for a stray byte. */
static size_t utf8_len(uint8_t c)
{
	static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
	return len[c >> 4];
}

int nx_pretok_split(const struct nx_pretok *p, const char *text, size_t len, struct nx_tok_scratch *s,
		    struct nx_span **spans, size_t *n_spans, struct nx_err *err)
{
	*n_spans = 0;
	if (len == 0)
		return 0;
	if (len > UINT32_MAX)
		return nx_errf(err, "tokenizer: text of %zu bytes is too long", len);
	/* Pieces are never empty, so each list holds at most len of them. */
	if (nx_tok_grow(&s->span, &s->span_cap, 2 * len, sizeof(struct nx_span)))
		return nx_errf(err, "tokenizer: out of memory for %zu bytes of text", len);
	if (!s->md && !(s->md = pcre2_match_data_create(1, NULL)))
		return nx_errf(err, "tokenizer: out of memory for regex match data");
	struct nx_span *cur = s->span, *next = cur + len;
	size_t n_cur = 1, n_next;
	cur[0] = (struct nx_span){0, (uint32_t)len};

	for (int r = 0; r < p->n_re; r++) {
		n_next = 0;
		for (size_t i = 0; i < n_cur; i++) {
			const char *sub = text + cur[i].off;
			size_t sub_len = cur[i].len, pos = 0, last = 0;
			while (pos < sub_len) {
				int rc = pcre2_match(p->re[r], (PCRE2_SPTR)sub, sub_len, pos, 0, s->md, NULL);
				if (rc == PCRE2_ERROR_NOMATCH)
					break;
				if (rc < 0) {
					PCRE2_UCHAR msg[128];
					pcre2_get_error_message(rc, msg, sizeof(msg));
					return nx_errf(err, "tokenizer: pre-tokenizer match failed: %s", (const char *)msg);
				}
				PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
				size_t m0 = ov[0], m1 = ov[1];
				if (m1 == m0) { /* an empty match splits nothing: move one character on */
					if (m0 >= sub_len)
						break;
					pos = m0 + utf8_len((uint8_t)sub[m0]);
					continue;
				}
				if (m0 > last)
					next[n_next++] = (struct nx_span){(uint32_t)(cur[i].off + last), (uint32_t)(m0 - last)};
				next[n_next++] = (struct nx_span){(uint32_t)(cur[i].off + m0), (uint32_t)(m1 - m0)};
				last = pos = m1;
			}
			if (last < sub_len)
				next[n_next++] = (struct nx_span){(uint32_t)(cur[i].off + last), (uint32_t)(sub_len - last)};
		}
		struct nx_span *tmp = cur;
		cur = next;
		next = tmp;
		n_cur = n_next;
	}
	*spans = cur;
	*n_spans = n_cur;
	return 0;
}
