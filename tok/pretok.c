/* pretok.c - BPE pre-tokenizers: the split regexes each tokenizer.ggml.pre names,
 * compiled once with PCRE2 (UTF + Unicode properties) and applied in sequence. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* The regex lists follow llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp),
 * one row per pre-tokenizer type it has, with the tokenizer.ggml.pre values
 * its loader maps to that type. Where llama.cpp rewrites a tokenizer.json
 * pattern because std::regex lacks it ((?i:), possessive quantifiers, \p{Lu},
 * class intersection) or replaces it by a hand-written splitter, the model's
 * own pattern is used: PCRE2 has all of them. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define RE_LLAMA3                                                                           \
	RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
			"|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                         \
	RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
			"|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* o200k's words (tiktoken): upper case then lower ("Hello"), or an upper-case run ("HTML" of "HTMLParser"). */
#define RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_GPT4O                                                                                              \
	"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER \
	"+" RE_LOWER "*" RE_CONTRACTIONS "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                                          \
	"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER "*" \
	"|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Kimi K2 (tokenization_kimi.py): as gpt-4o with Han runs split out and kept
 * out of the letter classes ([...&&[^\p{Han}]] written as a lookahead).
 * sc:Han is the Script property, as Oniguruma's \p{Han}: PCRE2's plain
 * \p{Han} also takes the characters whose Script_Extensions name Han (U+301D). */
#define RE_K2_UPPER "(?:(?!\\p{sc:Han})" RE_UPPER ")"
#define RE_K2_LOWER "(?:(?!\\p{sc:Han})" RE_LOWER ")"
#define RE_KIMI_K2                                                                                              \
	"\\p{sc:Han}+|[^\\r\\n\\p{L}\\p{N}]?" RE_K2_UPPER "*" RE_K2_LOWER "+" RE_CONTRACTIONS                        \
	"?|[^\\r\\n\\p{L}\\p{N}]?" RE_K2_UPPER "+" RE_K2_LOWER "*" RE_CONTRACTIONS "?|\\p{N}{1,3}"              \
	"| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* BLOOM: anything but whitespace and a few sentence marks, with an optional space before. */
#define RE_BLOOM " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"
/* CJK Unified Ideographs, U+0800..U+4E00 and Hangul, as DeepSeek's tokenizer.json has them. */
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* Han, Hiragana and Katakana runs (DeepSeek V3, Hunyuan, Spark). */
#define RE_HAN_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
/* DeepSeek V3's word rule: an ASCII mark glued to ASCII letters, letters with
 * their marks, punctuation and symbol runs. */
#define RE_DEEPSEEK3_HEAD "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
/* Digit runs in threes from the right: 1234567 -> 1 234 567 (an empty match splits). */
#define RE_DIGITS_BY_3 "(?=(?:\\p{N}{3})+(?!\\p{N}))"
#define RE_DEEPSEEK3 RE_DEEPSEEK3_HEAD "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek LLM: the letters of its tokenizer.json (the cased ones of Unicode), written as code points. */
#define RE_DEEPSEEK_LETTERS \
	"A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-" \
	"\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}" \
	"\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}" \
	"\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-" \
	"\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}" \
	"\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-" \
	"\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-" \
	"\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-" \
	"\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}" \
	"\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}" \
	"\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-" \
	"\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-" \
	"\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}" \
	"\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-" \
	"\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-" \
	"\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-" \
	"\\x{118DF}\\x{1E900}-\\x{1E943}"

struct pre_def {
	const char *names;       /* tokenizer.ggml.pre values, '|'-separated */
	bool ignore_merges;      /* a piece that is itself a token is taken whole */
	bool add_bos;            /* default of tokenizer.ggml.add_bos_token */
	const char *re[NX_PRETOK_MAX_RE];
};

/* One row per llama.cpp pre-tokenizer type (LLAMA_VOCAB_PRE_TYPE_*, named in
 * the comment); types with the same regexes stay rows of their own, as
 * llama.cpp keeps them. clean_spaces, which llama.cpp also sets per type,
 * only changes its detokenizer's output, not tokens. */
static const struct pre_def pre_defs[] = {
	/* DEFAULT: llama.cpp's list when the file names none: punctuation runs, GPT-2, digit runs, digit triples */
	{"default", false, false,
	 {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
	/* MINICPM5 */
	{"minicpm5", true, false,
	 {"\\p{N}{1,3}", RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
			 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
	/* LLAMA3 */
	{"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", true, true, {RE_LLAMA3}},
	/* DEEPSEEK_LLM */
	{"deepseek-llm", false, false,
	 {"[\\r\\n]", "\\s?[" RE_DEEPSEEK_LETTERS "]+",
	  "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+", "\\s+$", RE_CJK,
	  "\\p{N}+"}},
	/* DEEPSEEK_CODER */
	{"deepseek-coder", false, false, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
	/* DEEPSEEK3_LLM (HUNYUAN_DENSE, JOYAI_LLM, HY_V4 share its regexes) */
	{"deepseek-v3", false, false, {"\\p{N}{1,3}", RE_HAN_KANA, RE_DEEPSEEK3}},
	{"hunyuan-dense", false, false, {"\\p{N}{1,3}", RE_HAN_KANA, RE_DEEPSEEK3}},
	{"hy_v4", false, false, {"\\p{N}{1,3}", RE_HAN_KANA, RE_DEEPSEEK3}},
	{"joyai-llm", false, false, {"\\p{N}{1,3}", RE_HAN_KANA, RE_DEEPSEEK3}},
	/* SPARK2_5 */
	{"spark2_5", false, false,
	 {"\\p{N}{1,3}", RE_HAN_KANA, RE_DEEPSEEK3_HEAD "| ?[\\p{P}\\p{S}]+|[\\r\\n]|\\s+(?!\\S)|\\s+", "\\p{N}"}},
	/* YOUTU: Hangul, CJK marks, Bopomofo and Han/kana runs, then tekken's words with contractions */
	{"youtu", true, false,
	 {"[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+"
	  "|[\\x{FF01}\\x{2026}\\x{201C}\\x{201D}\\x{2018}\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}\\x{FF0C}\\x{3001}-\\x{303F}"
	  "\\x{FE30}-\\x{FE4F}]+|[\\x{3105}-\\x{312F}]+|" RE_HAN_KANA,
	  "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+"
	  RE_LOWER "*" RE_CONTRACTIONS "?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
	/* FALCON */
	{"falcon", false, false, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
	/* MPT */
	{"mpt", false, false, {RE_GPT2}},
	/* STARCODER (REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2 share its regexes):
	 * digits one by one, then GPT-2 (HF: Digits(individual_digits) + ByteLevel) */
	{"starcoder", false, false, {"\\p{N}", RE_GPT2}},
	/* GPT2 */
	{"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert"
	 "|jina-v1-en|jina-v2-code|roberta-bpe|exaone4",
	 false, false, {RE_GPT2}},
	/* JAIS2: llama3's with whitespace runs cut in powers of two */
	{"jais-2", false, false,
	 {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
			  "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)"
			  "|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"}},
	/* REFACT, COMMAND_R */
	{"refact", false, false, {"\\p{N}", RE_GPT2}},
	{"command-r", false, false, {"\\p{N}", RE_GPT2}},
	/* QWEN2 */
	{"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez", false, false, {RE_QWEN2}},
	/* QWEN35: letters keep their combining marks */
	{"qwen35", false, false,
	 {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
			  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
	/* STABLELM2, OLMO, DBRX, SMAUG */
	{"stablelm2", false, false, {RE_QWEN2}},
	{"olmo", false, false, {RE_GPT2}},
	{"dbrx", false, false, {RE_LLAMA3}},
	{"smaug-bpe", false, false, {RE_LLAMA3}},
	/* PORO */
	{"poro-chat", false, false, {RE_BLOOM}},
	/* CHATGLM4 (llama.cpp also clears its default BOS, which nxd never sets for BPE) */
	{"glm4|chatglm-bpe", false, false, {RE_LLAMA3}},
	/* VIKING */
	{"viking", false, false, {RE_BLOOM, "\\p{N}"}},
	/* JAIS */
	{"jais", false, false, {RE_GPT2}},
	/* TEKKEN */
	{"tekken", true, true, {RE_TEKKEN}},
	/* SMOLLM, CODESHELL */
	{"smollm", false, false, {"\\p{N}", RE_GPT2}},
	{"codeshell", false, false, {"\\p{N}", RE_GPT2}},
	/* BLOOM, GPT3_FINNISH */
	{"bloom", false, false, {RE_BLOOM}},
	{"gpt3-finnish", false, false, {RE_BLOOM}},
	/* EXAONE */
	{"exaone", false, false, {"\\p{N}", RE_GPT2}},
	/* EXAONE_MOE */
	{"exaone-moe", false, false,
	 {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
			  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
	/* CHAMELEON: sentinel and image tokens, tabs / newlines / 2 or 4 spaces, digits, each punctuation mark, GPT-2 */
	{"chameleon", false, true,
	 {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
	  "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2}},
	/* MINERVA */
	{"minerva-7b", false, false, {"\\p{N}", RE_GPT2}},
	/* GPT4O (MINIMAX_M2 shares its regexes) */
	{"gpt-4o|llama4|kanana2|talkie", false, false, {RE_GPT4O}},
	/* TINY_AYA: digit runs in threes from the right, then gpt-4o */
	{"tiny_aya|cohere2moe", false, false, {"\\d{1,3}(?=(?:\\d{3})*\\b)", RE_GPT4O}},
	/* SUPERBPE: digit runs, cut in threes from the right */
	{"superbpe", false, false, {"\\p{N}+", "(?=(\\d{3})+(?!\\d))"}},
	/* TRILLION, GRANITE_DOCLING */
	{"trillion", false, false, {RE_GPT2}},
	{"granite-docling", false, false, {RE_GPT2}},
	/* BAILINGMOE: its tokenizer.json's possessive quantifiers, which PCRE2 has */
	{"bailingmoe|bailingmoe2|llada-moe", false, false,
	 {"'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]"
	  "|\\s+(?!\\S)|\\s+"}},
	/* SEED_CODER */
	{"seed-coder", false, false,
	 {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+"
			  "|\\s+(?!\\S)|\\s+"}},
	/* HUNYUAN */
	{"hunyuan", false, false, {RE_QWEN2}},
	/* KIMI_K2 (llama.cpp's hand-written splitter of the same pattern) */
	{"kimi-k2", false, false, {RE_KIMI_K2}},
	/* UFAKZEKA: qwen2's without the English contractions */
	{"ufakzeka", false, false,
	 {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
	/* GROK_2 */
	{"grok-2", false, false, {RE_QWEN2}},
	/* AFMOE: digit runs cut in threes from the right (llama.cpp's hand-written
	 * \p{AFMoE_digits}), CJK and South-East Asian scripts, DeepSeek V3's words */
	{"afmoe", false, false,
	 {"\\p{N}+", RE_DIGITS_BY_3,
	  "[\\x{4E00}-\\x{9FFF}\\x{3400}-\\x{4DBF}\\x{F900}-\\x{FAFF}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}"
	  "\\x{FF65}-\\x{FF9F}\\x{2F00}-\\x{2FDF}\\x{0E40}-\\x{0E7F}\\x{0E80}-\\x{0EFF}\\x{1780}-\\x{17FF}"
	  "\\x{1000}-\\x{109F}\\x{AA60}-\\x{AA7F}\\x{A9E0}-\\x{A9FF}\\x{AC00}-\\x{D7AF}\\x{1100}-\\x{11FF}]+",
	  RE_DEEPSEEK3}},
	/* LAGUNA: lines and newline runs, then qwen2's */
	{"laguna", false, false, {"[^\\n]+|[\\n]+", RE_QWEN2}},
	/* MINIMAX_M2 */
	{"minimax-m2", false, false, {RE_GPT4O}},
	/* SOLAR_OPEN */
	{"solar-open", false, false, {RE_QWEN2}},
	/* MELLUM2 */
	{"mellum2", false, false, {"\\p{N}", RE_GPT2}},
};

/* SentencePiece-style BPE rows (llama.cpp's byte_encode = false types), with
 * the NX_PRE_* flags that tell them from byte-level BPE. */
struct spm_style_def {
	struct pre_def def;
	unsigned flags;
};

static const struct spm_style_def spm_style_defs[] = {
	/* GEMMA4: BPE over the raw UTF-8 of the text with its spaces written U+2581,
	 * cut only between newline runs and the rest; a newline run that is a token
	 * is that token; BOS always (llama.cpp's workaround for Gemma 4 files that
	 * say add_bos_token = false). */
	{{"gemma4|granite-embed-multi-311m", false, true, {"[^\\n]+|[\\n]+"}},
	 NX_PRE_RAW_UTF8 | NX_PRE_ESCAPE_SPACES | NX_PRE_NEWLINE_RUNS | NX_PRE_FORCE_BOS},
	/* SARVAM_MOE: Gemma 4's shape without its newline-run rule and forced BOS */
	{{"sarvam-moe", false, false, {"[^\\n]+|[\\n]+"}}, NX_PRE_RAW_UTF8 | NX_PRE_ESCAPE_SPACES},
	/* WHITESPACE (jina-embeddings-v2-base-zh): non-space runs, raw UTF-8 pieces;
	 * tokenizer.ggml.model = whitespace also drops the whitespace (bpe.c) */
	{{"whitespace", false, false, {"\\S+"}}, NX_PRE_RAW_UTF8},
};

/* Pre-tokenizer values llama.cpp knows that nxd refuses by name:
 * granite-embed-multi-97m's split is known only as llama.cpp's rewrite of it
 * (lookaheads reading every letter but a-z as upper case), which is not the
 * model's own tokenizer.json pattern for non-ASCII letters; nxd does not guess. */
static const char *const pre_unimplemented = "granite-embed-multi-97m";

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
	for (size_t i = 0; !def && i < sizeof(spm_style_defs) / sizeof(spm_style_defs[0]); i++) {
		if (name_in(spm_style_defs[i].def.names, pre)) {
			def = &spm_style_defs[i].def;
			p->flags = spm_style_defs[i].flags;
		}
	}
	if (!def && name_in(pre_unimplemented, pre))
		return nx_errf(err, "tokenizer: pre-tokenizer tokenizer.ggml.pre '%s' is not implemented", pre);
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
				if (m1 == m0) { /* an empty match only cuts there (superbpe's digit groups) */
					if (m0 >= sub_len)
						break;
					if (m0 > last) {
						next[n_next++] = (struct nx_span){(uint32_t)(cur[i].off + last), (uint32_t)(m0 - last)};
						last = m0;
					}
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
