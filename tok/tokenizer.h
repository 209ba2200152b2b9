/* tokenizer.h - text <-> token ids for the vocabularies GGUF files carry:
 * `gpt2` BPE (byte-level, or SentencePiece-style as `gemma4` and `whitespace`) and
 * `llama` SentencePiece, plus a streaming detokenizer.
 *
 * A tokenizer is built once from a parsed GGUF (it copies what it needs, so the
 * file may be unmapped afterwards) and is then read-only: every function taking
 * a const struct nx_tok * may be called from several threads at once. */
#ifndef NX_TOKENIZER_H
#define NX_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/gguf.h"

struct nx_tok;

enum nx_tok_kind {
	NX_TOK_BPE, /* tokenizer.ggml.model = gpt2, gemma4, whitespace: BPE with merges, byte-level or
		     * (pre gemma4, sarvam-moe, whitespace) over raw UTF-8 with <0xXX> fallback */
	NX_TOK_SPM, /* tokenizer.ggml.model = llama: SentencePiece, score-ordered merges, <0xXX> byte fallback */
};

/* GGUF tokenizer.ggml.token_type values. */
enum nx_tok_type {
	NX_TT_NORMAL = 1,
	NX_TT_UNKNOWN = 2,
	NX_TT_CONTROL = 3,
	NX_TT_USER = 4, /* user-defined: always split out of the input like a special token */
	NX_TT_UNUSED = 5,
	NX_TT_BYTE = 6, /* SPM <0xXX> */
};

/* Reads tokenizer.ggml.* from g: vocabulary, types, scores, merges, special ids.
 * An unknown tokenizer.ggml.model or tokenizer.ggml.pre is an error naming it. */
int nx_tok_load(struct nx_tok **t, const struct gguf_file *g, struct nx_err *err);
void nx_tok_free(struct nx_tok *t);

/* Encodes len bytes of text (UTF-8; invalid bytes are kept as byte tokens; a
 * byte the vocabulary has no token for is dropped, as HF and llama.cpp do).
 * No BOS is added: the caller prepends nx_tok_bos() when nx_tok_add_bos().
 * With parse_special, texts of control tokens in the input map to their ids;
 * user-defined tokens are always matched. *n_out is the number of tokens the
 * text needs; when that exceeds cap only the first cap are written and the
 * call fails, so a caller can retry with a buffer of *n_out. Texts longer than
 * NX_TOK_MAX_TEXT are refused. */
#define NX_TOK_MAX_TEXT (256u << 20) /* bytes one encode call takes */
int nx_tok_encode(const struct nx_tok *t, const char *text, size_t len, bool parse_special,
		  int32_t *out, size_t cap, size_t *n_out, struct nx_err *err);

enum nx_tok_kind nx_tok_kind(const struct nx_tok *t);
const char *nx_tok_pre_name(const struct nx_tok *t); /* tokenizer.ggml.pre as read ("default" if absent) */
int32_t nx_tok_n_vocab(const struct nx_tok *t);
int32_t nx_tok_bos(const struct nx_tok *t); /* -1 when the vocabulary has none */
int32_t nx_tok_eos(const struct nx_tok *t); /* -1 when none */
int32_t nx_tok_eot(const struct nx_tok *t); /* end of turn (<|im_end|>, <|eot_id|>...); -1 when none */
bool nx_tok_add_bos(const struct nx_tok *t);
bool nx_tok_add_space_prefix(const struct nx_tok *t);
/* End of generation: EOS, EOT and the other end tokens the vocabulary has. */
bool nx_tok_is_eog(const struct nx_tok *t, int32_t id);
bool nx_tok_is_control(const struct nx_tok *t, int32_t id);
/* The token_type of id (enum nx_tok_type); 0 when id is out of range. */
int nx_tok_type(const struct nx_tok *t, int32_t id);
/* Id of the token whose vocabulary text is exactly text[0..len), or -1. */
int32_t nx_tok_find(const struct nx_tok *t, const char *text, size_t len);
/* The vocabulary text of id (not NUL-terminated); NULL when out of range. */
const char *nx_tok_text(const struct nx_tok *t, int32_t id, size_t *len);

/* The raw bytes id stands for: byte-level BPE decoded back to bytes, SPM and
 * SentencePiece-style BPE with U+2581 turned into ' ', <0xXX> into that byte,
 * whitespace BPE as its text. Control, unknown and unused tokens give nothing
 * unless special, then their text. The bytes need not be valid UTF-8 on their
 * own. NULL when id is out of range. */
const char *nx_tok_piece(const struct nx_tok *t, int32_t id, bool special, size_t *len);
size_t nx_tok_max_piece(const struct nx_tok *t); /* longest piece, special or not */

/* --- streaming detokenizer ---------------------------------------------------
 * Turns tokens into text one at a time and only ever emits whole UTF-8
 * sequences: up to 3 bytes of an unfinished sequence wait for the next token.
 * A byte that cannot be part of valid UTF-8 becomes U+FFFD as soon as that is
 * certain (one U+FFFD per maximal invalid subpart, like Python's
 * errors="replace"); an unfinished sequence left at the end becomes U+FFFD at
 * flush. Plain data, no allocation: keep one per stream. */

#define NX_DETOK_SPECIAL 1u /* render control tokens as their text */
#define NX_DETOK_STRIP   2u /* drop the leading space of the first text token when
			     * the tokenizer adds a space prefix (SPM): for decoding
			     * a sequence that was encoded from the start of a text */

struct nx_detok {
	const struct nx_tok *tok;
	unsigned flags;
	bool strip;      /* still to drop the first leading space */
	uint8_t n_pend;  /* bytes of an unfinished UTF-8 sequence in pend */
	uint8_t need;    /* its full length (2..4) */
	uint8_t pend[4];
};

void nx_detok_init(struct nx_detok *d, const struct nx_tok *t, unsigned flags);
/* Bytes one push or flush may write at most: size out buffers with it. */
size_t nx_detok_bound(const struct nx_tok *t);
/* Feeds token id and writes the text now complete to out (*n_out bytes).
 * Fails on an id out of range or cap < nx_detok_bound(). */
int nx_detok_push(struct nx_detok *d, int32_t id, char *out, size_t cap, size_t *n_out, struct nx_err *err);
/* Ends the stream: an unfinished sequence becomes U+FFFD. Writes at most 3 bytes. */
size_t nx_detok_flush(struct nx_detok *d, char *out, size_t cap);

/* Decodes a whole sequence with a fresh detokenizer (flags as above) and
 * flushes it. *n_out is the length the text needs; like nx_tok_encode, when
 * it exceeds cap the output is cut and the call fails. No NUL is written. */
int nx_tok_decode(const struct nx_tok *t, const int32_t *ids, size_t n, unsigned flags,
		  char *out, size_t cap, size_t *n_out, struct nx_err *err);

#endif
