/* grammar.h - constrained decoding: GBNF grammars compiled to a stack matcher over UTF-8 bytes, and the token mask it gives a sampler.
 *
 * Syntax (llama.cpp's GBNF): `name ::= alternatives` rules, one per line
 * (inside parentheses and after `|` a rule goes on over newlines), `#`
 * comments, "literals" and [character classes] ([^...] negated, ranges a-z)
 * with the escapes \n \r \t \\ \" \[ \] \- \/ \xHH \uHHHH \UHHHHHHHH, `.` for
 * any character, ( groups ), and the postfix operators ? * + {m} {m,} {m,n}
 * {,n}. The grammar starts at `root`. Characters are Unicode code points,
 * matched against the UTF-8 the detokenizer writes. Refused, with a message
 * naming the construct: token references (<...>), undefined rules,
 * left-recursive rules, empty character classes, repetition counts above
 * NX_GRAMMAR_MAX_REPEAT.
 *
 * Matching. A position in the grammar is a stack of frames (the element to
 * match next, then where each enclosing rule goes on); a rule reference that
 * ends its alternative pushes nothing, so `x*` and right recursion keep the
 * stack flat. The matcher's state is the set of stacks consistent with the
 * text so far, plus an unfinished UTF-8 sequence. Frames, stack sets and
 * states are interned, so equal states have equal ids, and the byte
 * transitions between states are computed once and cached: a lazily built
 * deterministic automaton. The tables are flushed (keeping the current
 * state) when they pass their bound between two tokens.
 *
 * Masking. The vocabulary's token pieces form a trie (nx_vocab_trie, built
 * once per model, read-only and shared). The allowed tokens of a state are
 * found by walking the trie in preorder, following the cached transitions
 * and skipping every subtree whose prefix is dead, so the cost is the live
 * prefixes, not the vocabulary's bytes. Each state's mask is cached too: a
 * loop (inside a string, a run of digits) costs one walk. End-of-generation
 * tokens are allowed exactly when the text so far is a complete document;
 * other control tokens never are.
 *
 * Ownership: a compiled nx_grammar is immutable. A matcher (nx_gmatch) takes
 * over a grammar and belongs to one sequence. */
#ifndef NX_GRAMMAR_H
#define NX_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define NX_GRAMMAR_MAX_REPEAT 10000      /* the largest m or n of {m,n} */
#define NX_GRAMMAR_MAX_ELEMS (1u << 22)  /* elements of one compiled grammar */

struct nx_grammar;
struct nx_vocab_trie;
struct nx_gmatch;
struct nx_tok;

/* Compiles GBNF text (len bytes). -1 with a message naming the construct
 * and where (line:column) it is. */
int nx_grammar_compile(const char *text, size_t len, struct nx_grammar **out, struct nx_err *err);
void nx_grammar_free(struct nx_grammar *g);

/* The GBNF of any JSON value (RFC 8259), the `format: "json"` mode; the
 * rules json_schema.c builds on. */
const char *nx_grammar_json_gbnf(void);

/* --- JSON schema (json_schema.c) --------------------------------------------
 * A JSON schema (schema_json: its JSON text) compiled to GBNF text
 * (malloc'd). Every document the grammar accepts validates against the
 * schema; what the compiler cannot do exactly is refused naming the keyword
 * or construct (docs/protocol.md lists the subset). */
int nx_schema_to_gbnf(const char *schema_json, size_t len, char **gbnf, struct nx_err *err);

/* --- the vocabulary trie ------------------------------------------------------ */

/* Over the pieces (nx_tok_piece, no specials) of every token but control
 * ones; end-of-generation ids are kept aside. Masks cover n_logits ids (the
 * output layer may have more rows than the tokenizer has tokens: those are
 * never allowed). */
int nx_vocab_trie_build(const struct nx_tok *tok, int n_logits, struct nx_vocab_trie **out, struct nx_err *err);
/* The same over given pieces (tests, fuzzing): pieces[i] (lens[i] bytes, NULL
 * or 0: never text) must outlive the trie; is_eog may be NULL. */
int nx_vocab_trie_from_pieces(int n, const char *const *pieces, const size_t *lens, const bool *is_eog,
			      struct nx_vocab_trie **out, struct nx_err *err);
void nx_vocab_trie_free(struct nx_vocab_trie *t);
int nx_vocab_trie_n_vocab(const struct nx_vocab_trie *t);

/* --- the matcher -------------------------------------------------------------- */

/* Takes over g (freed with the matcher, or here on failure). */
int nx_gmatch_new(struct nx_grammar *g, const struct nx_vocab_trie *t, struct nx_gmatch **out, struct nx_err *err);
void nx_gmatch_free(struct nx_gmatch *m);

/* The tokens allowed next: bit id of ceil(n_vocab / 64) words. Valid until
 * the next call on m. NULL on out of memory (err says so). *n_allowed: how
 * many bits are set. */
const uint64_t *nx_gmatch_mask(struct nx_gmatch *m, int *n_allowed, struct nx_err *err);

/* Moves on by token id's piece (an end-of-generation token: only checked
 * against acceptance). -1 when the grammar does not allow it; the state is
 * then unchanged. */
int nx_gmatch_accept_token(struct nx_gmatch *m, int32_t id);

/* How many of ids[0..n), in order from the current state, the grammar
 * allows (speculative drafts are checked so); the state does not move (an
 * end-of-generation token ends the count). */
int nx_gmatch_peek_tokens(struct nx_gmatch *m, const int32_t *ids, int n);

/* Moves on by raw bytes (tests, and text that does not come as tokens). -1
 * when the grammar does not allow them; the state is then unchanged. */
int nx_gmatch_accept_bytes(struct nx_gmatch *m, const char *s, size_t len);

/* The text so far is a complete document of the grammar. */
bool nx_gmatch_accepting(const struct nx_gmatch *m);

/* Counters for tests and the bench: mask walks, mask cache hits, flushes. */
struct nx_gmatch_stats {
	uint64_t walks, mask_hits, flushes, states;
};
void nx_gmatch_stats(const struct nx_gmatch *m, struct nx_gmatch_stats *st);

#endif
