/* tok_internal.h - what tokenizer.c, bpe.c, spm.c and pretok.c share: the
 * tokenizer's tables, the hash maps built at load and the per-call scratch. */
#ifndef NX_TOK_INTERNAL_H
#define NX_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tok/tokenizer.h"

/* Token text -> id, open addressing over the tokenizer's own copy of the texts. */
struct nx_strmap {
	int32_t *slot; /* id, or -1 when empty */
	uint32_t mask; /* slots - 1 (a power of two) */
};

/* (left id, right id) -> merge rank and the merged token, for BPE. */
struct nx_pairmap {
	uint64_t *key; /* left << 32 | right; UINT64_MAX when empty */
	int32_t *rank;
	int32_t *merged;
	uint32_t mask;
};

#define NX_PRETOK_MAX_RE 6

/* A sequence of split regexes: each one splits every piece the previous left,
 * and the text between matches stays a piece of its own (llama.cpp's
 * unicode_regex_split, HF's Split with behavior Isolated). */
struct nx_pretok {
	int n_re;
	pcre2_code *re[NX_PRETOK_MAX_RE];
	unsigned flags; /* NX_PRE_* of its tokenizer.ggml.pre */
};

/* SentencePiece-style BPE (llama.cpp's byte_encode = false and escape_whitespaces). */
#define NX_PRE_RAW_UTF8      1u /* merges start from the text's UTF-8 characters, not GPT-2's
				 * byte stand-ins; a character without a token falls back to <0xXX> */
#define NX_PRE_ESCAPE_SPACES 2u /* ' ' is U+2581 in the vocabulary: escaped before splitting, back on decode */
#define NX_PRE_NEWLINE_RUNS  4u /* a piece of newlines only that is a token is taken whole (Gemma 4) */
#define NX_PRE_FORCE_BOS     8u /* BOS is added whatever tokenizer.ggml.add_bos_token says (Gemma 4) */

/* Special-token matcher: a byte trie over control, unknown and user-defined texts. */
struct nx_trie_node {
	int32_t child;   /* first child, -1 when none */
	int32_t sibling; /* next sibling, -1 when none */
	int32_t id;      /* token ending here, -1 when none */
	uint8_t byte;
};

struct nx_tok {
	enum nx_tok_kind kind;
	char pre_name[64];
	int32_t n_vocab;

	char *text;          /* all token texts back to back */
	uint32_t *text_off;  /* (n_vocab + 1): text of id i is text[text_off[i] .. text_off[i+1]) */
	float *score;        /* (n_vocab), SPM merge priority */
	uint8_t *type;       /* (n_vocab), enum nx_tok_type */
	uint8_t *eog;        /* (n_vocab), 1 for end-of-generation tokens */

	char *piece;         /* decoded bytes of every token back to back */
	uint32_t *piece_off; /* (n_vocab + 1) */
	size_t max_piece;

	struct nx_strmap map;

	int32_t bos, eos, eot, unk;
	bool add_bos;
	bool add_space_prefix; /* SPM: a ' ' before the text and after each special token */

	/* BPE */
	struct nx_pairmap merges;
	struct nx_pretok pre;
	bool ignore_merges;    /* a pre-token that is itself a token is taken whole (llama3) */
	bool drop_whitespace;  /* tokenizer.ggml.model = whitespace: whitespace ends a piece and is dropped */
	int32_t byte_tok[256]; /* BPE: token of the byte's stand-in character; SPM: <0xXX>; -1 if absent */

	struct nx_trie_node *trie; /* node 0 is the root */
	int32_t n_trie;
};

/* Growable per-call work space of an encode, so it allocates O(1) times (not the forward pass's nx_scratch). */
struct nx_tok_scratch {
	void *span;  size_t span_cap;  /* struct nx_span, two lists */
	void *sym;   size_t sym_cap;   /* symbols of the word being merged */
	void *heap;  size_t heap_cap;  /* merge candidates */
	char *buf;   size_t buf_cap;   /* SPM: escaped text */
	char *esc;   size_t esc_cap;   /* BPE with NX_PRE_ESCAPE_SPACES: escaped text */
	pcre2_match_data *md;
};

struct nx_span {
	uint32_t off, len;
};

/* Where encoded ids go: written while there is room, counted always. */
struct nx_emit {
	int32_t *out;
	size_t cap;
	size_t n;
};

static inline void nx_emit(struct nx_emit *e, int32_t id)
{
	if (e->n < e->cap)
		e->out[e->n] = id;
	e->n++;
}

/* Grows *p to hold at least n elements of size sz; -1 on overflow or no memory. */
int nx_tok_grow(void **p, size_t *cap, size_t n, size_t sz);

static inline const char *nx_tok_str(const struct nx_tok *t, int32_t id, size_t *len)
{
	*len = t->text_off[id + 1] - t->text_off[id];
	return t->text + t->text_off[id];
}

uint32_t nx_tok_hash(const void *p, size_t n);
int32_t nx_tok_map_get(const struct nx_tok *t, const char *s, size_t n);

/* pretok.c */
int nx_pretok_init(struct nx_pretok *p, const char *pre, bool *ignore_merges, bool *add_bos, struct nx_err *err);
void nx_pretok_free(struct nx_pretok *p);
/* Splits text[0..len) into pieces; *spans points into s->span, *n_spans pieces. */
int nx_pretok_split(const struct nx_pretok *p, const char *text, size_t len, struct nx_tok_scratch *s,
		    struct nx_span **spans, size_t *n_spans, struct nx_err *err);

/* bpe.c */
int nx_bpe_load(struct nx_tok *t, const struct gguf_file *g, struct nx_err *err);
int nx_bpe_encode(const struct nx_tok *t, const char *text, size_t len, struct nx_tok_scratch *s,
		  struct nx_emit *e, struct nx_err *err);
/* Byte-level stand-in characters back to bytes; writes at most len bytes. */
size_t nx_bpe_unmap(const char *text, size_t len, char *out);

/* spm.c */
int nx_spm_encode(const struct nx_tok *t, const char *text, size_t len, bool space_prefix,
		  struct nx_tok_scratch *s, struct nx_emit *e, struct nx_err *err);


/* A binary min-heap of merge candidates, shared by BPE (lowest rank first) and
 * SentencePiece (highest score first): BEFORE(a, b) says a merges first.
 * Defines static heap_push / heap_pop over an array of TYPE. */
#define NX_TOK_DEFINE_HEAP(TYPE, BEFORE)                                      \
	static void heap_push(TYPE *h, size_t *n, TYPE c)                     \
	{                                                                     \
		size_t i = (*n)++;                                            \
		while (i > 0) {                                               \
			size_t p = (i - 1) / 2;                               \
			if (!BEFORE(&c, &h[p]))                               \
				break;                                        \
			h[i] = h[p];                                          \
			i = p;                                                \
		}                                                             \
		h[i] = c;                                                     \
	}                                                                     \
	static TYPE heap_pop(TYPE *h, size_t *n)                              \
	{                                                                     \
		TYPE top = h[0], last = h[--(*n)];                            \
		size_t i = 0;                                                 \
		for (;;) {                                                    \
			size_t c = 2 * i + 1;                                 \
			if (c >= *n)                                          \
				break;                                        \
			if (c + 1 < *n && BEFORE(&h[c + 1], &h[c]))           \
				c++;                                          \
			if (!BEFORE(&h[c], &last))                            \
				break;                                        \
			h[i] = h[c];                                          \
			i = c;                                                \
		}                                                             \
		h[i] = last;                                                  \
		return top;                                                   \
	}

#endif
