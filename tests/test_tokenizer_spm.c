/* The SentencePiece tokenizer (model/tokenizer_spm.c, tokenizer.ggml.model "llama") and its
 * synthetic vocabulary (model/vocab_synth.c), no GPU:
 *  - a corpus (ASCII, digits, runs of spaces and newlines at the start, inside and at the end,
 *    punctuation, contractions, accents, CJK, emoji, characters the vocabulary lacks, invalid
 *    UTF-8, special tokens in the text) on a hand-made vocabulary like Llama 2's: the ids are
 *    pinned, derived by hand from llama.cpp's llm_tokenizer_spm_session (a few derivations are
 *    written out below); without add_space_prefix; without byte tokens (the unknown token);
 *  - detokenize: U+2581 to space, byte tokens to bytes, user-defined as they are, control and
 *    unused as nothing, the space tokenize put in front dropped; decode(encode(x)) == x for the
 *    corpus and for thousands of random byte strings;
 *  - determinism; 1 MB of text tokenizes and round-trips (no timing asserted);
 *  - refusals with messages naming the key: scores or token types of the wrong count or type,
 *    bad token types, NaN scores, byte tokens missing or malformed, no unknown token;
 *  - GGUF: written and read back, llama.cpp's defaults for absent keys;
 *  - the synthetic vocabulary: n_vocab tokens laid out as Llama 2's, deterministic, too small
 *    refused; kiln gen-model --vocab spm, then kiln run --prompt --cpu end to end. */
#include "tests/support.h"

#include "base/base.h"
#include "model/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SP "\xE2\x96\x81" /* U+2581: SentencePiece's space */

/* ---- the hand-made vocabulary ------------------------------------------------------------------
 * As Llama 2's: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258 (byte b is 3 + b), then pieces.
 * Single characters score -1000 (they are never made by a merge, so their score only matters
 * when they are); the pieces' scores decide the merge order: the pair making the token of
 * highest score goes first, the leftmost of equal ones. */
enum { UNK = 0, BOS = 1, EOS = 2, N_HAND = 295 };
#define BYTE(b) (3 + (b))

typedef struct {
    const char *text;
    float       score;
    int32_t     type;
} hand_tok;

static const hand_tok hand[] = {
    /* 259 */ {SP, -1000, 1}, {"h", -1000, 1}, {"e", -1000, 1}, {"l", -1000, 1}, {"o", -1000, 1},
    /* 264 */ {"w", -1000, 1}, {"r", -1000, 1}, {"d", -1000, 1}, {"t", -1000, 1}, {",", -1000, 1},
    /* 269 */ {"'", -1000, 1}, {"s", -1000, 1}, {"1", -1000, 1}, {"2", -1000, 1}, {"\xC3\xA9", -1000, 1},
    /* 274 */ {"\xE6\x97\xA5", -1000, 1}, /* 日 */
    /* 275 */ {"he", -1, 1}, {"ll", -2, 1}, {SP "he", -3, 1}, {"llo", -4, 1}, {SP SP, -5, 1},
    /* 280 */ {SP "hello", -6, 1}, {SP "w", -7, 1}, {"or", -8, 1}, {SP "wor", -9, 1}, {"ld", -10, 1},
    /* 285 */ {SP "world", -11, 1}, {"'s", -12, 1}, {"12", -13, 1}, {SP SP SP SP, -14, 1}, {SP "t", -15, 1},
    /* 290 */ {"wo", -20, 1}, {"<tag>", 0, KILN_TOKEN_USER_DEFINED}, {"<unused>", 0, KILN_TOKEN_UNUSED},
    /* 293 */ {SP "1", -16, 1}, {SP "12", -17, 1},
};

typedef struct {
    const char *toks[N_HAND];
    char        names[256][8];
    int32_t     types[N_HAND];
    float       scores[N_HAND];
} hand_vocab;

static void hand_fill(hand_vocab *h) {
    static const char *const special[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        h->toks[i] = special[i];
        h->types[i] = i == 0 ? KILN_TOKEN_UNKNOWN : KILN_TOKEN_CONTROL;
        h->scores[i] = 0;
    }
    for (int b = 0; b < 256; b++) {
        snprintf(h->names[b], sizeof h->names[b], "<0x%02X>", b);
        h->toks[BYTE(b)] = h->names[b];
        h->types[BYTE(b)] = KILN_TOKEN_BYTE;
        h->scores[BYTE(b)] = 0;
    }
    for (int i = 0; i < (int)(sizeof hand / sizeof hand[0]); i++) {
        h->toks[259 + i] = hand[i].text;
        h->types[259 + i] = hand[i].type;
        h->scores[259 + i] = hand[i].score;
    }
}

static kiln_tokenizer_spec hand_spec(hand_vocab *h, bool prefix) {
    hand_fill(h);
    return (kiln_tokenizer_spec){.n_tokens = N_HAND, .tokens = h->toks, .types = h->types, .model = "llama",
                                 .scores = h->scores, .bos = BOS, .eos = EOS, .unk = UNK, .add_bos = true,
                                 .add_space_prefix = prefix};
}

static kiln_tokenizer *hand_tokenizer(bool prefix) {
    hand_vocab         *h = malloc(sizeof *h);
    kiln_tokenizer_spec spec = hand_spec(h, prefix);
    kiln_tokenizer     *t = NULL;
    TS_OK(kiln_tokenizer_new(&spec, &t));
    free(h); /* the tokenizer keeps its own copy */
    return t;
}

static void expect_ids(const kiln_tokenizer *t, const char *text, size_t len, const int32_t *want, int64_t n_want) {
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, text, len, &ids, &n));
    kb_str got = {0};
    kb_str_add(&got, "");
    for (int64_t i = 0; i < n; i++) kb_str_addf(&got, " %d", ids[i]);
    ck_assert_msg(n == n_want, "'%.*s': %lld ids (%s), want %lld", (int)len, text, (long long)n, got.s,
                  (long long)n_want);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(ids[i] == want[i], "'%.*s': id %lld is %d, want %d (got%s)", (int)len, text, (long long)i, ids[i],
                      want[i], got.s);
    kb_str_free(&got);
    free(ids);
}

static char *decode(const kiln_tokenizer *t, const int32_t *ids, int64_t n, size_t *len) {
    char *text = NULL;
    TS_OK(kiln_detokenize(t, ids, n, &text, len));
    return text;
}

/* ---- the corpus -------------------------------------------------------------------------------- */

typedef struct {
    const char *text;
    size_t      len; /* 0: strlen */
    int32_t     ids[12];
    int         n;
    bool        no_round_trip;
} corpus_case;

#define IDS(...) {__VA_ARGS__}, (sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

static const corpus_case corpus[] = {
    /* empty text: bos alone (no space is added to nothing) */
    {"", 0, IDS(BOS), false},
    /* "▁hello▁world": ▁ h e l l o: the pairs that are tokens are he -1, ll -2; he goes first,
     * making ▁he (-3) and nothing with l; then ll, making llo (-4); ▁he; llo; last ▁hello (-6).
     * ▁world likewise: ▁w (-7) before or (-8), then ▁wor (-9), ld (-10), ▁world (-11). */
    {"hello world", 0, IDS(BOS, 280, 285), false},
    /* H is no token: ▁ H e llo; H falls back to its byte <0x48> */
    {"Hello", 0, IDS(BOS, 259, BYTE('H'), 261, 278), false},
    /* leading space: "▁▁hello". ▁▁ (-5) scores below he, ll, ▁he (-3, from the second ▁) and llo,
     * so the second ▁ joins hello: ▁hello (-6) also beats ▁▁, which is stale by then: ▁ ▁hello */
    {" hello", 0, IDS(BOS, 259, 280), false},
    /* "▁hello▁▁world": ▁▁ (-5) beats ▁w (-7), so world loses its ▁: w or ld (or -8 before wo -20) */
    {"hello  world", 0, IDS(BOS, 280, 279, 264, 282, 284), false},
    {"hello world ", 0, IDS(BOS, 280, 285, 259), false}, /* the trailing space alone */
    {"  hello   world  ", 0, IDS(BOS, 279, 280, 279, 285, 279), false},
    /* a run of spaces: 5 ▁ (prefix and four): ▁▁ leftmost first, twice; then ▁▁▁▁ (-14) */
    {"    ", 0, IDS(BOS, 288, 259), false},
    /* newlines are no tokens here: byte fallback <0x0A>; the text after one has no ▁ */
    {"\n", 0, IDS(BOS, 259, BYTE('\n')), false},
    {"hello\nworld\n\n", 0, IDS(BOS, 280, BYTE('\n'), 264, 282, 284, BYTE('\n'), BYTE('\n')), false},
    /* digits and a contraction, "▁it's▁12▁121": 's (-12) first; then 12 (-13), leftmost first, at
     * both places, which makes ▁1 (-16) stale and queues ▁12 (-17) twice; i is no token */
    {"it's 12 121", 0, IDS(BOS, 259, BYTE('i'), 267, 286, 294, 294, 271), false},
    {"hello, world", 0, IDS(BOS, 280, 268, 285), false}, /* punctuation */
    /* accents: é is a token; c a f are not (bytes) */
    {"caf\xC3\xA9 \xC3\xA9t\xC3\xA9", 0, IDS(BOS, 259, BYTE('c'), BYTE('a'), BYTE('f'), 273, 259, 273, 267, 273), false},
    /* CJK: 日 is a token, 本 (E6 9C AC) is not: its three bytes */
    {"\xE6\x97\xA5\xE6\x9C\xAC", 0, IDS(BOS, 259, 274, BYTE(0xE6), BYTE(0x9C), BYTE(0xAC)), false},
    /* emoji 🙂: four bytes */
    {"\xF0\x9F\x99\x82", 0, IDS(BOS, 259, BYTE(0xF0), BYTE(0x9F), BYTE(0x99), BYTE(0x82)), false},
    /* invalid UTF-8: a lead byte takes the next byte whatever it is (llama.cpp's unicode_len_utf8):
     * one symbol C3 28, no token, two byte tokens (no U+FFFD, unlike BPE) */
    {"\xC3(", 0, IDS(BOS, 259, BYTE(0xC3), BYTE('(')), false},
    {"a\0b", 3, IDS(BOS, 259, BYTE('a'), BYTE(0), BYTE('b')), false}, /* NUL is a byte like any other */
    /* and the bytes it takes may be an escaped space: "▁ FF E2 96 81 hello" (FF says 4 bytes) is
     * ▁, the four bytes, then hello without its ▁. Decoded, the space comes back as E2 96 81 (byte
     * tokens are not unescaped): the one text that does not round-trip, in llama.cpp too. */
    {"\xFF hello", 0, IDS(BOS, 259, BYTE(0xFF), BYTE(0xE2), BYTE(0x96), BYTE(0x81), 275, 278), true},
    /* ties: ll at 1-2 and at 2-3 score the same; the leftmost goes first */
    {"lll", 0, IDS(BOS, 259, 276, 262), false},
    /* he (-1) before ▁t (-15): ▁ t he, then ▁t (▁the is no token) */
    {"the", 0, IDS(BOS, 289, 275), false},
    /* ▁w (-7) before wo (-20) */
    {"wow", 0, IDS(BOS, 281, 263, 264), false},
    /* special tokens in the text (user-defined, control) are their ids; the text after one gets
     * the ▁ prefix again, as at the start */
    {"hello<tag>world", 0, IDS(BOS, 280, 291, 285), false},
    {"</s>hello", 0, IDS(BOS, EOS, 280), false},
    {"<s><s>hello", 0, IDS(BOS, BOS, BOS, 280), false},
    /* an unused token's text is plain text */
    {"world<unused>", 0, IDS(BOS, 285, BYTE('<'), BYTE('u'), BYTE('n'), BYTE('u'), 270, 261, 266, BYTE('>')), false},
};
#define N_CORPUS ((int)(sizeof corpus / sizeof corpus[0]))

START_TEST(corpus_ids) {
    kiln_tokenizer    *t = hand_tokenizer(true);
    const corpus_case *c = &corpus[_i];
    expect_ids(t, c->text, c->len ? c->len : strlen(c->text), c->ids, c->n);
    kiln_tokenizer_free(t);
}
END_TEST

/* Without add_space_prefix (Gemma's files say so): no ▁ in front, and "world" alone is w or ld,
 * not ▁world: or (-8) before wo (-20). Without add_bos: no bos. */
START_TEST(no_space_prefix) {
    hand_vocab         *h = malloc(sizeof *h);
    kiln_tokenizer_spec spec = hand_spec(h, false);
    spec.add_bos = false;
    kiln_tokenizer *t = NULL;
    TS_OK(kiln_tokenizer_new(&spec, &t));
    free(h);
    expect_ids(t, "world", 5, (const int32_t[]){264, 282, 284}, 3);
    expect_ids(t, "hello world", 11, (const int32_t[]){275, 278, 285}, 3); /* he llo ▁world */
    expect_ids(t, "", 0, NULL, 0);
    int32_t ids[] = {275, 278, 285};
    size_t  len;
    char   *s = decode(t, ids, 3, &len);
    ck_assert_str_eq(s, "hello world"); /* nothing stripped */
    free(s);
    int32_t w[] = {285};
    s = decode(t, w, 1, &len);
    ck_assert_str_eq(s, " world");
    free(s);
    kiln_tokenizer_free(t);
}
END_TEST

/* A vocabulary without byte tokens: a character that is no token is the unknown token, one per
 * byte (llama.cpp throws there); and such a vocabulary without an unknown token is refused. */
START_TEST(unknown_without_byte_fallback) {
    static const char *const toks[] = {"<unk>", "<s>", "</s>", SP, "a", "b", "ab"};
    static const int32_t     types[] = {2, 3, 3, 1, 1, 1, 1};
    static const float       scores[] = {0, 0, 0, -100, -100, -100, -1};
    kiln_tokenizer_spec spec = {.n_tokens = 7, .tokens = toks, .types = types, .model = "llama", .scores = scores,
                                .bos = BOS, .eos = EOS, .unk = UNK, .add_bos = true, .add_space_prefix = true};
    kiln_tokenizer *t = NULL;
    TS_OK(kiln_tokenizer_new(&spec, &t));
    expect_ids(t, "abc", 3, (const int32_t[]){BOS, 3, 6, UNK}, 4);
    expect_ids(t, "a\xC3\xA9", 3, (const int32_t[]){BOS, 3, 4, UNK, UNK}, 5); /* é: two bytes, two unk */
    int32_t ids[] = {BOS, 3, 6, UNK};
    char   *s = decode(t, ids, 4, NULL);
    ck_assert_str_eq(s, "ab"); /* unknown: nothing; the ▁ after bos dropped */
    free(s);
    kiln_tokenizer_free(t);
    spec.unk = -1;
    kiln_status st = kiln_tokenizer_new(&spec, &t);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "no token for byte 0x00 ('<0x00>') and no unknown token"), "%s",
                  kiln_status_msg(st));
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_FORMAT);
    kiln_status_free(st);
    ck_assert_ptr_null(t);
}
END_TEST

/* ---- detokenizing ------------------------------------------------------------------------------ */

START_TEST(detokenize_rules) {
    kiln_tokenizer *t = hand_tokenizer(true);
    struct {
        int32_t     ids[6];
        int         n;
        const char *want;
    } cases[] = {
        {{BOS, 280, 285}, 3, "hello world"},       /* the ▁ after a leading bos dropped */
        {{280, 285}, 2, "hello world"},            /* or at the start */
        {{285}, 1, "world"},                       /* one token: its space is the prefix's */
        {{285, 280}, 2, "world hello"},            /* only the first */
        {{BOS, BOS, 280}, 3, " hello"},            /* the second bos (nothing) takes the strip */
        {{259, 259, 280}, 3, "  hello"},           /* ▁ alone loses its space */
        {{291, 280}, 2, "<tag> hello"},            /* user-defined: as it is */
        {{BOS, EOS, UNK, 292, 280}, 5, " hello"},   /* control, unknown, unused: nothing */
        {{BOS, BYTE(' '), 280}, 3, " hello"},      /* a byte token ' ' is a space too */
        {{BYTE(0xE6), BYTE(0x97), BYTE(0xA5)}, 3, "\xE6\x97\xA5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        char  *s = decode(t, cases[i].ids, cases[i].n, &len);
        ck_assert_msg(strcmp(s, cases[i].want) == 0 && len == strlen(cases[i].want), "case %zu: '%s', want '%s'", i, s,
                      cases[i].want);
        free(s);
    }
    int32_t bad[] = {BOS, N_HAND};
    char   *s = NULL;
    kiln_status st = kiln_detokenize(t, bad, 2, &s, NULL);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "token id 295 at position 1"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    kiln_tokenizer_free(t);
}
END_TEST

/* decode(encode(x)) == x for the corpus without special-token text, with and without the prefix */
START_TEST(corpus_round_trip) {
    for (int prefix = 0; prefix < 2; prefix++) {
        kiln_tokenizer *t = hand_tokenizer(prefix);
        for (int i = 0; i < N_CORPUS; i++) {
            const char *x = corpus[i].text;
            size_t      len = corpus[i].len ? corpus[i].len : strlen(x), blen;
            if ((memchr(x, '<', len) && !strstr(x, "<unused>")) || corpus[i].no_round_trip) continue;
            int32_t *ids;
            int64_t  n;
            TS_OK(kiln_tokenize(t, x, len, &ids, &n));
            char *back = decode(t, ids, n, &blen);
            ck_assert_msg(blen == len && memcmp(back, x, len) == 0, "prefix %d: '%.*s' came back as '%s'", prefix,
                          (int)len, x, back);
            free(back);
            free(ids);
        }
        kiln_tokenizer_free(t);
    }
}
END_TEST

/* Random text of many scripts, and random bytes without spaces (corpus: a lead byte may take an
 * escaped space with it), round-trip, twice the same. */
START_TEST(random_round_trip) {
    kiln_tokenizer *t = hand_tokenizer(_i);
    uint64_t        r = 11 + (uint64_t)_i;
    uint8_t         text[2048];
    for (int k = 0; k < 2000; k++) {
        size_t len = ts_random_text(&r, text, 60);
        for (size_t j = 0; k % 2 && j < len; j++)
            if ((text[j] = (uint8_t)ts_rng_next(&r)) == ' ') text[j] = '_';
        for (size_t j = 0; j < len; j++)
            if (text[j] == '<') text[j] = 'x'; /* no special-token text */
        int32_t *a, *b;
        int64_t  na, nb;
        TS_OK(kiln_tokenize(t, (const char *)text, len, &a, &na));
        TS_OK(kiln_tokenize(t, (const char *)text, len, &b, &nb));
        ck_assert(na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0);
        size_t blen;
        char  *back = decode(t, a, na, &blen);
        ck_assert_msg(blen == len && memcmp(back, text, len) == 0, "string %d of %zu bytes did not round-trip", k, len);
        free(back);
        free(a);
        free(b);
    }
    kiln_tokenizer_free(t);
}
END_TEST

/* ---- refusals ---------------------------------------------------------------------------------- */

static void expect_error(kiln_status st, kiln_code code, const char *what) { ts_expect_status(st, code, what); }

START_TEST(spec_refusals) {
    hand_vocab         *h = malloc(sizeof *h);
    kiln_tokenizer_spec spec = hand_spec(h, true);
    kiln_tokenizer     *t = NULL;
    h->types[270] = 9;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "token 270 ('s') has type 9 (tokenizer.ggml.token_type)");
    h->types[270] = -1;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "has type -1");
    hand_fill(h);
    h->scores[280] = NAN;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "token 280 ('" SP "hello') has a NaN score");
    hand_fill(h);
    h->toks[BYTE(0x41)] = "<0x41x"; /* a byte token of another form */
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "token 68 ('<0x41x') is of type byte but not");
    h->types[BYTE(0x41)] = KILN_TOKEN_NORMAL; /* then byte 0x41 has none */
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "byte tokens (byte fallback) but none for byte 0x41");
    hand_fill(h);
    h->toks[290] = "he"; /* a duplicate of 275 */
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "duplicate token 'he'");
    hand_fill(h);
    spec.unk = N_HAND;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_INVALID, "unk 295 is not a token id");
    spec.unk = UNK;
    spec.model = "t5";
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_INVALID, "model 't5' is not supported");
    spec.model = "llama";
    spec.bos = -1;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_INVALID, "add_bos is set but there is no bos token");
    ck_assert_ptr_null(t);
    free(h);
}
END_TEST

/* ---- GGUF -------------------------------------------------------------------------------------- */

/* The hand vocabulary's keys: tokens, scores, types, and (ids) bos/eos/unk and add_bos. */
static kiln_gguf_writer *hand_writer(hand_vocab *h, bool ids) {
    hand_fill(h);
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", N_HAND, h->toks);
    kiln_gguf_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_F32, N_HAND, h->scores);
    kiln_gguf_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_I32, N_HAND, h->types);
    if (ids) {
        kiln_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", BOS);
        kiln_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", EOS);
        kiln_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", UNK);
        kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    }
    return w;
}

START_TEST(gguf_read) {
    char       *dir = ts_tmpdir();
    hand_vocab *h = malloc(sizeof *h);
    /* without bos/eos/unk/add_bos/add_space_prefix keys: llama.cpp's defaults 1, 2, 0, true, true */
    for (int ids = 0; ids < 2; ids++) {
        kiln_gguf      *g = ts_gguf_write_read(hand_writer(h, ids), dir, "spm.gguf");
        kiln_tokenizer *t = NULL;
        TS_OK(kiln_tokenizer_from_gguf(g, &t));
        kiln_gguf_close(g);
        ck_assert_int_eq(kiln_tokenizer_n_vocab(t), N_HAND);
        ck_assert_int_eq(kiln_tokenizer_bos(t), BOS);
        ck_assert_int_eq(kiln_tokenizer_eos(t), EOS);
        for (int i = 0; i < N_CORPUS; i++)
            expect_ids(t, corpus[i].text, corpus[i].len ? corpus[i].len : strlen(corpus[i].text), corpus[i].ids,
                       corpus[i].n);
        kiln_tokenizer_free(t);
    }
    /* add_space_prefix false, add_bos false */
    kiln_gguf_writer *w = hand_writer(h, true);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    kiln_gguf      *g = ts_gguf_write_read(w, dir, "spm.gguf");
    kiln_tokenizer *t = NULL;
    TS_OK(kiln_tokenizer_from_gguf(g, &t));
    kiln_gguf_close(g);
    expect_ids(t, "world", 5, (const int32_t[]){264, 282, 284}, 3);
    kiln_tokenizer_free(t);
    free(h);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(gguf_refusals) {
    char       *dir = ts_tmpdir();
    hand_vocab *h = malloc(sizeof *h);
    float       three[3] = {0};
    int32_t     ity[N_HAND] = {0};
    for (int k = 0; k < 7; k++) {
        kiln_gguf_writer *w = hand_writer(h, true);
        const char       *what = NULL;
        switch (k) {
        case 0:
            kiln_gguf_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_F32, 3, three);
            what = "tokenizer.ggml.scores is 3 values of f32, not 295 of f32 (one per token)";
            break;
        case 1:
            kiln_gguf_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_I32, N_HAND, ity);
            what = "tokenizer.ggml.scores is 295 values of i32, not 295 of f32";
            break;
        case 2:
            kiln_gguf_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_I32, 3, ity);
            what = "tokenizer.ggml.token_type is 3 values of i32, not 295 of i32";
            break;
        case 3:
            h->types[259] = 7;
            kiln_gguf_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_I32, N_HAND, h->types);
            what = "has type 7 (tokenizer.ggml.token_type)";
            break;
        case 4:
            kiln_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 400);
            what = "tokenizer.ggml.unknown_token_id is 400, not a token id";
            break;
        case 5:
            kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", 0, h->toks);
            what = "tokenizer.ggml.tokens is empty";
            break;
        default:
            h->toks[BYTE(0xFF)] = "<0xFE>";
            kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", N_HAND, h->toks);
            what = "duplicate token '<0xFE>'";
            break;
        }
        kiln_gguf      *g = ts_gguf_write_read(w, dir, "bad.gguf");
        kiln_tokenizer *t = NULL;
        kiln_status     st = kiln_tokenizer_from_gguf(g, &t);
        char            file[4300];
        snprintf(file, sizeof file, "%s/bad.gguf: ", dir); /* every message names the file */
        ck_assert_msg(st && strstr(kiln_status_msg(st), file), "case %d: %s", k, st ? kiln_status_msg(st) : "no error");
        expect_error(st, KILN_ERR_FORMAT, what);
        ck_assert_ptr_null(t);
        kiln_gguf_close(g);
    }
    free(h);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- the synthetic vocabulary ----------------------------------------------------------------- */

static kiln_tokenizer *synth_tokenizer(const km_synth *s) {
    km_strv *tv = malloc((size_t)s->n_tokens * sizeof *tv);
    for (int64_t i = 0; i < s->n_tokens; i++) tv[i] = (km_strv){s->tokens[i], strlen(s->tokens[i])};
    km_vocab v = {.n_tokens = s->n_tokens, .tokens = tv, .types = s->types, .spm = true, .scores = s->scores,
                  .bos = s->bos, .eos = s->eos, .unk = s->unk, .add_bos = true, .add_space_prefix = true};
    kiln_tokenizer *t = NULL;
    TS_OK(km_tokenizer_build(&v, &t));
    free(tv);
    return t;
}

START_TEST(synthetic_vocab) {
    km_synth a, b;
    TS_OK(km_synth_spm_make(1024, &a));
    TS_OK(km_synth_spm_make(1024, &b));
    ck_assert_int_eq(a.n_tokens, 1024);
    ck_assert_int_eq(a.n_merges, 0);
    ck_assert_str_eq(a.tokens[0], "<unk>");
    ck_assert_str_eq(a.tokens[1], "<s>");
    ck_assert_str_eq(a.tokens[2], "</s>");
    ck_assert_str_eq(a.tokens[3], "<0x00>");
    ck_assert_str_eq(a.tokens[258], "<0xFF>");
    ck_assert_int_eq(a.types[0], KILN_TOKEN_UNKNOWN);
    ck_assert_int_eq(a.types[1], KILN_TOKEN_CONTROL);
    ck_assert_int_eq(a.types[258], KILN_TOKEN_BYTE);
    ck_assert_int_eq(a.types[259], KILN_TOKEN_NORMAL);
    ck_assert_int_eq(a.types[1023], KILN_TOKEN_UNUSED);
    ck_assert_msg(a.n_learned > 300, "%lld pieces learned", (long long)a.n_learned);
    for (int64_t i = 0; i < a.n_tokens; i++) { /* deterministic */
        ck_assert_str_eq(a.tokens[i], b.tokens[i]);
        ck_assert(a.scores[i] == b.scores[i] && a.types[i] == b.types[i]);
    }
    for (int64_t i = 260; i < 259 + a.n_learned; i++) ck_assert(a.scores[i] < a.scores[i - 1]);
    /* the text it was learned from takes far fewer tokens than bytes, and round-trips */
    kiln_tokenizer *t = synth_tokenizer(&a);
    const char     *x = km_synth_text();
    int32_t        *ids;
    int64_t         n;
    TS_OK(kiln_tokenize(t, x, strlen(x), &ids, &n));
    ck_assert_msg(n < (int64_t)strlen(x) / 3, "%lld tokens for %zu bytes", (long long)n, strlen(x));
    size_t blen;
    char  *back = decode(t, ids, n, &blen);
    ck_assert(blen == strlen(x) && memcmp(back, x, blen) == 0);
    free(back);
    free(ids);
    kiln_tokenizer_free(t);
    km_synth_free(&a);
    km_synth_free(&b);
    kiln_status st = km_synth_spm_make(300, &a);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "n_vocab 300: a synthetic SentencePiece vocabulary has "), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
}
END_TEST

/* 1 MB of text of many scripts, one piece (SentencePiece does not cut text into words): it
 * tokenizes (the heap keeps it O(n log n); how fast is not asserted) and round-trips. */
START_TEST(long_text) {
    km_synth s;
    TS_OK(km_synth_spm_make(4096, &s));
    kiln_tokenizer *t = synth_tokenizer(&s);
    size_t          len;
    uint8_t        *text = ts_big_text(1 << 20, &len);
    for (size_t j = 0; j < len; j++)
        if (text[j] == '<') text[j] = 'x';
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, (const char *)text, len, &ids, &n));
    ck_assert(n > 1000);
    size_t blen;
    char  *back = decode(t, ids, n, &blen);
    ck_assert(blen == len && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    free(text);
    kiln_tokenizer_free(t);
    km_synth_free(&s);
}
END_TEST

/* kiln gen-model --vocab spm writes a Llama-2-style vocabulary; kiln run --prompt tokenizes with
 * it, as the library does, and prints the prompt back. */
START_TEST(cli_end_to_end) {
    char *dir = ts_tmpdir(), path[4200], cmd[8800], *out = NULL;
    snprintf(path, sizeof path, "%s/spm.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s gen-model --arch llama --preset tiny --vocab spm -o %s", ts_kiln_bin(), path);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "SentencePiece vocabulary"), "%s", out);
    free(out);
    const char *prompt = "The compiler reads 12345 tokens, doesn't it? Caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC";
    snprintf(cmd, sizeof cmd, "%s run %s --prompt \"%s\" -n 3 --cpu", ts_kiln_bin(), path, prompt);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    kiln_gguf *g;
    TS_OK(kiln_gguf_open(path, &g));
    kiln_tokenizer *t = NULL;
    TS_OK(kiln_tokenizer_from_gguf(g, &t));
    kiln_gguf_close(g);
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, prompt, strlen(prompt), &ids, &n));
    ck_assert_int_eq(ids[0], 1);
    kb_str want = {0};
    kb_str_add(&want, "prompt:");
    for (int64_t i = 0; i < n; i++) kb_str_addf(&want, " %d", ids[i]);
    kb_str_add(&want, "\n");
    ck_assert_msg(strstr(out, want.s), "expected '%s' in:\n%s", want.s, out);
    char pt[512];
    snprintf(pt, sizeof pt, "prompt text: \"%s\"", prompt);
    ck_assert_msg(strstr(out, pt), "expected '%s' in:\n%s", pt, out);
    ck_assert_msg(strstr(out, "generated:") && strstr(out, "decode: 2 tokens"), "%s", out);
    kb_str_free(&want);
    free(ids);
    free(out);
    kiln_tokenizer_free(t);
    snprintf(cmd, sizeof cmd, "%s gen-model --preset tiny --vocab wordpiece -o %s", ts_kiln_bin(), path);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--vocab wants bpe or spm, got 'wordpiece'"), "%s", out);
    free(out);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("tokenizer_spm",
                        TS_CASE("tokenizer_spm", 120),
                        TS_LOOP(0, N_CORPUS, corpus_ids),
                        TS_TESTS(no_space_prefix, unknown_without_byte_fallback, detokenize_rules, corpus_round_trip),
                        TS_LOOP(0, 2, random_round_trip),
                        TS_TESTS(spec_refusals, gguf_read, gguf_refusals, synthetic_vocab, long_text, cli_end_to_end));
    return ts_main(s);
}
