/* model: the byte-level BPE tokenizer (tokenizer.c), its pre-tokenizer and text helpers
 * (tokenizer_pre.c) and the synthetic vocabulary of kiln gen-model (vocab_synth.c). Prefix km_.
 * docs/tokenizer.md says how all of it follows llama.cpp. */
#ifndef KILN_MODEL_TOKENIZER_H
#define KILN_MODEL_TOKENIZER_H

#include "kiln.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- tokenizer_pre.c ------------------------------------------------------------------------ */

/* The pre-tokenizers: how text is cut into words before BPE. */
typedef enum {
    KM_PRE_GPT2,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    KM_PRE_LLAMA3, /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                      ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    KM_PRE_QWEN2,  /* LLAMA3's with \p{N} (one digit a word) */
} km_pre;
/* "gpt2"/"gpt-2", "llama-bpe"/"llama3"/"llama-v3", "qwen2"; false for any other name. */
bool        km_pre_parse(const char *name, km_pre *out);
const char *km_pre_name(km_pre pre);

/* Character classes of the pre-tokenizer's patterns (Unicode general categories L*, N*, and the
 * White_Space property; everything else, unassigned included, is other). */
enum { KM_UC_OTHER, KM_UC_LETTER, KM_UC_NUMBER, KM_UC_SPACE };
int         km_uc_class(uint32_t cp);
const char *km_uc_version(void); /* of the table: "15.0.0" */

/* UTF-8 as llama.cpp reads it: a lead byte with enough continuation bytes decodes (overlong
 * forms and surrogates included); any other byte, and a 4-byte form past U+10FFFF, is one
 * U+FFFD. Writes at most len code points to cps and returns their count. */
size_t km_utf8_decode(const uint8_t *s, size_t len, uint32_t *cps);
/* Writes cp (at most U+10FFFF) as 1-4 bytes; returns the count. */
int    km_utf8_encode(uint32_t cp, uint8_t out[4]);

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the other 68 for
 * U+0100 + their rank among them. km_cp_to_byte is its inverse (-1 off the map). */
uint32_t km_byte_to_cp(uint8_t b);
int      km_cp_to_byte(uint32_t cp);

/* Cuts n code points (cls[i] = km_uc_class(cps[i])) into words: writes each word's end
 * (exclusive) to ends, in order, and returns the number of words (at most n). */
size_t km_pre_split(km_pre pre, const uint32_t *cps, const uint8_t *cls, size_t n, uint32_t *ends);

/* ---- tokenizer.c ----------------------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t      len;
} km_strv;

/* What kiln_tokenizer_new takes, with counted strings (kiln_tokenizer_from_gguf's point into
 * the file). pre NULL: gpt2. */
typedef struct {
    int64_t        n_tokens;
    const km_strv *tokens;
    const int32_t *types; /* or NULL: all normal */
    int64_t        n_merges;
    const km_strv *merges;
    const char    *pre;
    int32_t        bos, eos;
    bool           add_bos;
} km_vocab;
kiln_status km_tokenizer_build(const km_vocab *v, kiln_tokenizer **out);

/* The text of token id (not NUL-terminated; NULL if out of range) and its type. */
const char *km_token_text(const kiln_tokenizer *t, int32_t id, size_t *len);
int         km_token_type(const kiln_tokenizer *t, int32_t id);

/* ---- vocab_synth.c --------------------------------------------------------------------------- */

/* A synthetic vocabulary of exactly n_vocab tokens: the 256 byte tokens (id = byte), the tokens
 * of merges learned from km_synth_text() as pre-tokenized by llama-bpe, <|begin_of_text|> (bos)
 * and <|end_of_text|> (eos), then <|reserved_N|> (control) to n_vocab. Strings are in `blob`. */
typedef struct {
    int64_t      n_tokens, n_merges, n_learned; /* n_learned: tokens the merges added */
    const char **tokens;
    int32_t     *types;
    const char **merges;
    int32_t      bos, eos;
    char        *blob;
} km_synth;
kiln_status km_synth_make(int64_t n_vocab, km_synth *out);
void        km_synth_free(km_synth *s);
/* The built-in English text the merges are learned from (a few KB, NUL-terminated). */
const char *km_synth_text(void);

#endif
