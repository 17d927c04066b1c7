/* The byte-level BPE tokenizer (model/tokenizer.c, model/tokenizer_pre.c) and the synthetic
 * vocabulary of kiln gen-model (model/vocab_synth.c), no GPU:
 *  - the pre-tokenizers cut text as llama.cpp's split patterns do (GPT-2, Llama 3, Qwen2, DeepSeek
 *    LLM/Coder/V3, GPT-4o, Tekken, StarCoder, Falcon, default; several regexes in sequence):
 *    contractions, letters, numbers (Llama 3: groups of 1-3 digits; Qwen2: one digit), spaces
 *    and newlines, punctuation, other scripts and white space;
 *  - known tokenizations with a hand-made vocabulary (byte tokens and a few merges): merges by
 *    rank, leftmost first, never across words; llama-bpe keeps a word that is a token whole;
 *    merged text that is not a token falls back as llama.cpp does; bos;
 *  - special tokens (control, user-defined, unknown) match as whole strings, longest first;
 *    detokenize omits control tokens and keeps user-defined ones;
 *  - invalid UTF-8 becomes U+FFFD as in llama.cpp;
 *  - detokenize(tokenize(x)) == x for thousands of strings (random code points, random bytes made
 *    valid UTF-8) under every pre-tokenizer;
 *  - errors: a missing byte token names the byte, a bad merge names its index, duplicates,
 *    unknown pre-tokenizers, ids out of range;
 *  - the synthetic vocabulary has exactly n_vocab tokens (258 .. 152k), is deterministic, and
 *    round-trips; n_vocab < 258 is an error;
 *  - a vocabulary of 150k tokens and 280k merges builds and 1 MB of text round-trips (how fast:
 *    make perf-check, never asserted here);
 *  - GGUF: kiln_tokenizer_write_synthetic, written and read back, tokenizes as the vocabulary it
 *    came from; other tokenizer models and pre-tokenizers are refused by name.
 * SentencePiece ("llama"): tests/test_tokenizer_spm.c. */
#include "tests/support.h"

#include "base/base.h"
#include "model/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SP "\xC4\xA0" /* U+0120, the byte-to-unicode form of ' ' */
#define NL "\xC4\x8A" /* U+010A: '\n' */


/* ---- the pre-tokenizers ------------------------------------------------------------------------ */

/* text cut into words by pre, joined by '|' (caller frees) */
static char *words(km_pre pre, const char *text) {
    size_t    len = strlen(text);
    uint32_t *cps = malloc((len + 1) * sizeof *cps), *ends = malloc((len + 1) * sizeof *ends);
    uint8_t  *cls = malloc(len + 1);
    size_t    n = km_utf8_decode((const uint8_t *)text, len, cps);
    for (size_t i = 0; i < n; i++) cls[i] = (uint8_t)km_uc_class(cps[i]);
    size_t nw = km_pre_split(pre, cps, cls, n, ends), start = 0;
    kb_str b = {0};
    kb_str_add(&b, "");
    for (size_t w = 0; w < nw; w++) {
        if (w) kb_str_add(&b, "|");
        for (size_t i = start; i < ends[w]; i++) {
            uint8_t u[4];
            kb_str_addn(&b, (const char *)u, (size_t)km_utf8_encode(cps[i], u));
        }
        start = ends[w];
    }
    free(cps);
    free(ends);
    free(cls);
    return kb_str_take(&b);
}

static void expect_words(km_pre pre, const char *text, const char *want) {
    char *got = words(pre, text);
    ck_assert_msg(strcmp(got, want) == 0, "%s: '%s' cut as '%s', want '%s'", km_pre_name(pre), text, got, want);
    free(got);
}

START_TEST(gpt2_split) {
    km_pre p = KM_PRE_GPT2;
    expect_words(p, "Hello world", "Hello| world");
    expect_words(p, "it's we're they've I'm you'll he'd don't", "it|'s| we|'re| they|'ve| I|'m| you|'ll| he|'d| don|'t");
    expect_words(p, "IT'S", "IT|'|S"); /* GPT-2's contractions are lower case only */
    expect_words(p, "12345 abc123", "12345| abc|123");
    expect_words(p, "a  b   c", "a| | b|  | c");
    expect_words(p, "hi!!! (ok)", "hi|!!!| (|ok|)");
    expect_words(p, "a\n\nb \n c", "a|\n|\n|b| \n| c");
    expect_words(p, "end   ", "end|   ");
    expect_words(p, "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xD9\xA3\xD9\xA4", /* Latin, CJK, Arabic-Indic digits */
                 "caf\xC3\xA9| \xE4\xB8\xAD\xE6\x96\x87| \xD9\xA3\xD9\xA4");
    expect_words(p, "x\xC2\xA0y", "x|\xC2\xA0|y"); /* no-break space is white space, not ' ' */
    expect_words(p, "", "");
}
END_TEST

START_TEST(llama3_split) {
    km_pre p = KM_PRE_LLAMA3;
    expect_words(p, "Hello world", "Hello| world");
    expect_words(p, "IT'S we'RE don't", "IT|'S| we|'RE| don|'t"); /* any case */
    expect_words(p, "1234567 x12", "123|456|7| x|12");
    expect_words(p, "3.14159", "3|.|141|59");
    expect_words(p, "(hello) .com", "(hello|)| .|com");
    expect_words(p, "a  b", "a| | b");
    expect_words(p, "a \n\n b", "a| \n\n| b");
    expect_words(p, "x;\n\ny", "x|;\n\n|y");
    expect_words(p, "\tword", "\tword");
    expect_words(p, "\nword", "\n|word");
    expect_words(p, "end  ", "end|  ");
    expect_words(p, "\xE4\xB8\xAD\xE6\x96\x87\xEF\xBC\x8C\xE5\xA5\xBD", "\xE4\xB8\xAD\xE6\x96\x87|\xEF\xBC\x8C\xE5\xA5\xBD");
    expect_words(p, "\xF0\x9F\x98\x80\xF0\x9F\x98\x80 ok", "\xF0\x9F\x98\x80\xF0\x9F\x98\x80| ok");
}
END_TEST

START_TEST(qwen2_split) {
    km_pre p = KM_PRE_QWEN2;
    expect_words(p, "1234 x56", "1|2|3|4| x|5|6");
    expect_words(p, "IT'S (a) (b", "IT|'S| (|a|)| (|b");
    expect_words(p, "a \n b", "a| \n| b");
}
END_TEST

/* The patterns llama.cpp runs as several regexes in sequence (unicode_regex_split): each regex
 * cuts every piece the one before left into its matches and the text between them. Expected
 * words derived by hand from llama.cpp's regex lists (src/llama-vocab.cpp); the tricky ones
 * say why. */
START_TEST(deepseek_llm_split) {
    km_pre p = KM_PRE_DEEPSEEK_LLM; /* [\r\n], \s?[cased letters]+, \s?[!-/:-~ fullwidth “” 、。]+,
                                       \s+$, [CJK]+, \p{N}+ */
    expect_words(p, "Hello world", "Hello| world");
    /* contractions are not special: ' is left between two letter matches, then its own piece */
    expect_words(p, "it's IT'S", "it|'|s| IT|'|S");
    expect_words(p, "12345 abc123", "12345| abc|123"); /* digits: one run (\p{N}+) */
    /* the third regex's class has the ASCII letters but not é: "café" (one letter match) is cut
     * again into its match "caf" and the rest "é" */
    expect_words(p, "caf\xC3\xA9", "caf|\xC3\xA9");
    /* CJK: no cased letters; "，" (U+FF0C) and "。" (U+3002) are punctuation of the third regex */
    expect_words(p, "\xE4\xB8\xAD\xE6\x96\x87\xEF\xBC\x8C\xE5\xA5\xBD\xE3\x80\x82",
                 "\xE4\xB8\xAD\xE6\x96\x87|\xEF\xBC\x8C|\xE5\xA5\xBD|\xE3\x80\x82");
    /* newlines alone; the spaces before a newline end their piece (\s+$) */
    expect_words(p, "a  \n b  ", "a|  |\n| b|  ");
    expect_words(p, "a\r\n\nb", "a|\r|\n|\n|b");
    expect_words(p, "\xF0\x9F\x98\x80 ok!!", "\xF0\x9F\x98\x80| ok|!!"); /* the emoji matches nothing: a piece */
    /* U+3000 is white space (\s), so it leads the letters after it */
    expect_words(p, "x\xE3\x80\x80y", "x|\xE3\x80\x80y");
    /* Ω U+03A9 and ώ U+1F7D are both cased letters, one match of the second regex; but the CJK
     * class [ࠀ-一] is U+0800-U+4E00, so it cuts ώ off again */
    expect_words(p, "\xCE\xA9\xE1\xBD\xBD", "\xCE\xA9|\xE1\xBD\xBD");
}
END_TEST

START_TEST(deepseek_coder_split) {
    km_pre p = KM_PRE_DEEPSEEK_CODER; /* [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK]+, \p{N} */
    expect_words(p, "Hello, world!\n", "Hello|,| world|!|\n");
    /* = and + are symbols (\p{S}), not \p{P}: "=1+22" is left whole until \p{N} cuts it */
    expect_words(p, "x=1+22", "x|=|1|+|2|2");
    /* CJK are letters: " 中文" matches \s?\p{L}+, then [CJK]+ leaves the space alone */
    expect_words(p, "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87", "caf\xC3\xA9| |\xE4\xB8\xAD\xE6\x96\x87");
    expect_words(p, "it's (ok)", "it|'|s| (|ok|)");
    expect_words(p, "a   b", "a|  | b");
}
END_TEST

START_TEST(deepseek_v3_split) {
    km_pre p = KM_PRE_DEEPSEEK3; /* \p{N}{1,3}, [Han kana]+, then one regex for the rest */
    expect_words(p, "abc1234567", "abc|123|456|7");
    expect_words(p, "a.com don't", "a|.com| don|'t"); /* [ASCII punctuation][A-Za-z]+ */
    expect_words(p, "x .y", "x| .|y"); /* " ." is ' ?[\p{P}\p{S}]+' (a space is no ASCII punctuation) */
    expect_words(p, "\xE4\xB8\xAD\xE6\x96\x87\xE3\x81\xB2\xE3\x82\xAB ok", /* Han, hiragana, katakana: one run */
                 "\xE4\xB8\xAD\xE6\x96\x87\xE3\x81\xB2\xE3\x82\xAB| ok");
    expect_words(p, "e\xCC\x81t\xC3\xA9!\n\nx", "e\xCC\x81t\xC3\xA9|!\n\n|x"); /* marks join letters */
    /* U+0001 is neither letter, mark, punctuation nor symbol: unmatched, one piece; U+0002 leads x */
    expect_words(p, "\x01\x02x", "\x01|\x02x");
    /* \s*[\r\n]+; then "  b": \s+(?!\S) takes one space, the other leads b */
    expect_words(p, "a  \n\n  b", "a|  \n\n| | b");
}
END_TEST

START_TEST(gpt4o_split) {
    km_pre p = KM_PRE_GPT4O;
    /* upper case then lower case is one word; a contraction stays on its word; digits by 3 */
    expect_words(p, "HELLOworld it's don't IT'S 12345",
                 "HELLOworld| it's| don't| IT'S| |123|45");
    expect_words(p, "helloWorld XMLHttp", "hello|World| XMLHttp");
    /* llama.cpp tells case by ASCII only: É is both "upper" and "lower", so in "ÉAB" the first
     * alternative backtracks to "É" alone and "AB" is the second's (Python's regex: one word) */
    expect_words(p, " \xC3\x89" "AB", " \xC3\x89|AB");
    expect_words(p, "x;\n/\ny a/b", "x|;\n/\n|y| a|/b"); /* [\r\n/]* after punctuation */
    expect_words(p, "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80!", "\xE4\xB8\xAD\xE6\x96\x87| \xF0\x9F\x98\x80!");
    expect_words(p, "a \n\n b  ", "a| \n\n| b|  ");
}
END_TEST

START_TEST(tekken_split) {
    km_pre p = KM_PRE_TEKKEN; /* gpt-4o's without contractions, one digit a word */
    expect_words(p, "HELLOworld it's 12345", "HELLOworld| it|'s| |1|2|3|4|5");
    expect_words(p, "IT'S caf\xC3\xA9", "IT|'S| caf\xC3\xA9");
}
END_TEST

START_TEST(starcoder_falcon_default_split) {
    /* starcoder (smollm, command-r, refact, ...): \p{N}, then GPT-2's on each piece */
    expect_words(KM_PRE_STARCODER, "abc123 4567 it's", "abc|1|2|3| |4|5|6|7| it|'s");
    /* falcon: [\p{P}$+<=>^~|`]+, GPT-2's, [0-9]{3} (ASCII digits, leftovers stay) */
    expect_words(KM_PRE_FALCON, "hello, world! 12345 x", "hello|,| world|!| |123|45| x");
    expect_words(KM_PRE_FALCON, "a+=b`c", "a|+=|b|`|c");
    expect_words(KM_PRE_FALCON, "\xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6", "\xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6"); /* not [0-9] */
    /* default: [\p{P}$+<=>^~|]+ (no `), GPT-2's, \p{N}+, [0-9]{3} */
    expect_words(KM_PRE_DEFAULT, "x+1234 a`b", "x|+|123|4| a|`|b");
}
END_TEST

START_TEST(pre_names) {
    /* every name llama.cpp gives a pattern kiln has maps to it, with llama.cpp's flags */
    static const struct {
        const char *name;
        km_pre      pre;
        bool        ignore_merges, add_bos;
    } cases[] = {
        {"gpt2", KM_PRE_GPT2, false, false},          {"gpt-2", KM_PRE_GPT2, false, false},
        {"olmo", KM_PRE_GPT2, false, false},          {"mpt", KM_PRE_GPT2, false, false},
        {"llama-bpe", KM_PRE_LLAMA3, true, true},     {"llama3", KM_PRE_LLAMA3, true, true},
        {"pixtral", KM_PRE_LLAMA3, true, true},       {"dbrx", KM_PRE_LLAMA3, false, false},
        {"smaug-bpe", KM_PRE_LLAMA3, false, false},   {"qwen2", KM_PRE_QWEN2, false, false},
        {"stablelm2", KM_PRE_QWEN2, false, false},    {"deepseek-r1-qwen", KM_PRE_QWEN2, false, false},
        {"deepseek-llm", KM_PRE_DEEPSEEK_LLM, false, false},
        {"deepseek-coder", KM_PRE_DEEPSEEK_CODER, false, false},
        {"deepseek-v3", KM_PRE_DEEPSEEK3, false, false},
        {"gpt-4o", KM_PRE_GPT4O, false, false},       {"llama4", KM_PRE_GPT4O, false, false},
        {"tekken", KM_PRE_TEKKEN, true, true},        {"smollm", KM_PRE_STARCODER, false, false},
        {"starcoder", KM_PRE_STARCODER, false, false}, {"refact", KM_PRE_STARCODER, false, false},
        {"command-r", KM_PRE_STARCODER, false, false}, {"falcon", KM_PRE_FALCON, false, false},
        {"default", KM_PRE_DEFAULT, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        km_pre_spec sp;
        ck_assert_msg(km_pre_parse(cases[i].name, &sp), "%s", cases[i].name);
        ck_assert_int_eq(sp.pre, cases[i].pre);
        ck_assert_int_eq(sp.ignore_merges, cases[i].ignore_merges);
        ck_assert_int_eq(sp.add_bos, cases[i].add_bos);
    }
    km_pre_spec sp;
    ck_assert(!km_pre_parse("Tekken", &sp)); /* names are exact */
    ck_assert(!km_pre_parse("", &sp));
    /* the list names every name, each of which parses */
    char list[1024];
    km_pre_list(list, sizeof list);
    ck_assert_ptr_nonnull(strstr(list, "gpt2, gpt-2, "));
    ck_assert_ptr_nonnull(strstr(list, ", deepseek-llm, "));
    for (char *tok = strtok(list, ", "); tok; tok = strtok(NULL, ", "))
        ck_assert_msg(km_pre_parse(tok, &sp), "%s", tok);
    km_pre_list(list, 8); /* cut short, still a string */
    ck_assert_uint_lt(strlen(list), 8);
    for (int p = 0; p < KM_PRE_COUNT; p++) /* each pattern's own name is one of them */
        ck_assert_msg(km_pre_parse(km_pre_name((km_pre)p), &sp) && (int)sp.pre == p, "%d", p);
}
END_TEST

START_TEST(classes_and_utf8) {
    ck_assert_int_eq(km_uc_class('a'), KM_UC_LETTER);
    ck_assert_int_eq(km_uc_class('7'), KM_UC_NUMBER);
    ck_assert_int_eq(km_uc_class(' '), KM_UC_SPACE);
    ck_assert_int_eq(km_uc_class('\x1c'), KM_UC_OTHER); /* not White_Space */
    ck_assert_int_eq(km_uc_class(0x4E2D), KM_UC_LETTER);  /* CJK */
    ck_assert_int_eq(km_uc_class(0x2EBF0), KM_UC_LETTER); /* CJK extension I: Unicode 15.1 */
    ck_assert_int_eq(km_uc_class(0x0663), KM_UC_NUMBER);  /* Arabic-Indic three */
    ck_assert_int_eq(km_uc_class(0x2167), KM_UC_NUMBER);  /* Roman numeral eight (Nl) */
    ck_assert_int_eq(km_uc_class(0x3000), KM_UC_SPACE);
    ck_assert_int_eq(km_uc_class(0x0301), KM_UC_MARK);    /* a combining mark */
    ck_assert_int_eq(km_uc_class(0x1F600), KM_UC_SYMBOL); /* emoji are So */
    ck_assert_int_eq(km_uc_class('!'), KM_UC_PUNCT);
    ck_assert_int_eq(km_uc_class('$'), KM_UC_SYMBOL);
    ck_assert_int_eq(km_uc_class('~'), KM_UC_SYMBOL);
    ck_assert_int_eq(km_uc_class(0x3002), KM_UC_PUNCT); /* 。 */
    ck_assert_int_eq(km_uc_class(0x0085), KM_UC_SPACE); /* Cc, but White_Space */
    ck_assert_int_eq(km_uc_class(0x0001), KM_UC_OTHER);
    ck_assert_int_eq(km_uc_class(0x200B), KM_UC_OTHER); /* Cf */
    ck_assert_int_eq(km_uc_class(0xE000), KM_UC_OTHER); /* private use */
    ck_assert_int_eq(km_uc_class(0x10FFFF), KM_UC_OTHER);
    ck_assert_str_eq(km_uc_version(), "15.1.0");
    /* the byte map is a bijection onto printable characters */
    int seen[512] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = km_byte_to_cp((uint8_t)b);
        ck_assert_uint_lt(cp, 512);
        ck_assert_int_eq(seen[cp]++, 0);
        ck_assert_int_eq(km_cp_to_byte(cp), b);
    }
    ck_assert_uint_eq(km_byte_to_cp(' '), 0x120);
    ck_assert_uint_eq(km_byte_to_cp('\n'), 0x10A);
    ck_assert_int_eq(km_cp_to_byte(0x300), -1);
    /* llama.cpp's UTF-8: stray and truncated bytes are U+FFFD; overlong forms decode */
    uint32_t cps[16];
    ck_assert_uint_eq(km_utf8_decode((const uint8_t *)"a\xFF\x80\xC3", 4, cps), 4);
    ck_assert_uint_eq(cps[1], 0xFFFD);
    ck_assert_uint_eq(cps[2], 0xFFFD);
    ck_assert_uint_eq(cps[3], 0xFFFD);
    ck_assert_uint_eq(km_utf8_decode((const uint8_t *)"\xC0\xAF", 2, cps), 1);
    ck_assert_uint_eq(cps[0], '/');
    ck_assert_uint_eq(km_utf8_decode((const uint8_t *)"\xF4\x90\x80\x80", 4, cps), 4); /* past U+10FFFF */
    ck_assert_uint_eq(cps[0], 0xFFFD);
}
END_TEST

/* ---- a hand-made vocabulary --------------------------------------------------------------------- */

typedef struct {
    const char *text;
    int32_t     type;
} extra_tok;

/* 256 byte tokens, then the text each merge makes (when new and make_results), then extra. */
static kiln_tokenizer *hand_tok(const char *pre, const char *const *merges, int nm, bool make_results,
                                const extra_tok *extra, int ne, int32_t bos, bool add_bos) {
    int          cap = 256 + nm + ne;
    const char **toks = calloc((size_t)cap, sizeof *toks);
    int32_t     *types = calloc((size_t)cap, sizeof *types);
    char        *store = calloc((size_t)cap, 64);
    int          n = 0;
    for (int b = 0; b < 256; b++, n++) {
        uint8_t u[4];
        int     l = km_utf8_encode(km_byte_to_cp((uint8_t)b), u);
        memcpy(store + 64 * n, u, (size_t)l);
        toks[n] = store + 64 * n;
        types[n] = KILN_TOKEN_NORMAL;
    }
    for (int i = 0; make_results && i < nm; i++) {
        char *s = store + 64 * n;
        const char *sp = strchr(merges[i] + 1, ' ');
        snprintf(s, 64, "%.*s%s", (int)(sp - merges[i]), merges[i], sp + 1);
        int k = 0;
        while (k < n && strcmp(toks[k], s) != 0) k++;
        if (k < n) continue;
        toks[n] = s;
        types[n++] = KILN_TOKEN_NORMAL;
    }
    for (int i = 0; i < ne; i++, n++) {
        toks[n] = extra[i].text;
        types[n] = extra[i].type;
    }
    kiln_tokenizer_spec spec = {.n_tokens = n, .tokens = toks, .types = types, .n_merges = nm, .merges = merges,
                                .pre = pre, .bos = bos < 0 ? -1 : n - 1 - bos, .eos = -1, .add_bos = add_bos};
    kiln_tokenizer *t = NULL;
    TS_OK(kiln_tokenizer_new(&spec, &t));
    free(toks);
    free(types);
    free(store);
    return t;
}

/* The tokens of text, as their texts joined by '|' (caller frees). */
static char *tok_str(const kiln_tokenizer *t, const char *text) {
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, text, strlen(text), &ids, &n));
    kb_str b = {0};
    kb_str_add(&b, "");
    for (int64_t i = 0; i < n; i++) {
        size_t      l;
        const char *s = km_token_text(t, ids[i], &l);
        ck_assert_ptr_nonnull(s);
        if (i) kb_str_add(&b, "|");
        kb_str_addn(&b, s, l);
    }
    free(ids);
    return kb_str_take(&b);
}

static void expect_toks(const kiln_tokenizer *t, const char *text, const char *want) {
    char *got = tok_str(t, text);
    ck_assert_msg(strcmp(got, want) == 0, "'%s' tokenized as '%s', want '%s'", text, got, want);
    free(got);
}

static char *detok(const kiln_tokenizer *t, const char *text) {
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, text, strlen(text), &ids, &n));
    char *out;
    TS_OK(kiln_detokenize(t, ids, n, &out, NULL));
    free(ids);
    return out;
}

static const char *const hello_merges[] = {"h e", "l l", "he ll", "hell o", SP " w", SP "w o", SP "wo r", "l d", SP "wor ld"};

START_TEST(known_tokenizations) {
    kiln_tokenizer *t = hand_tok("gpt2", hello_merges, 9, true, NULL, 0, -1, false);
    expect_toks(t, "hello world", "hello|" SP "world");
    expect_toks(t, "hello, world!", "hello|,|" SP "world|!");
    expect_toks(t, "helloworld", "hello|w|o|r|ld"); /* "Ġw" needs the space */
    expect_toks(t, "  world", SP "|" SP "world");
    expect_toks(t, "hell\nworld", "hell|" NL "|w|o|r|ld");
    expect_toks(t, "", "");
    char *back = detok(t, "hello world\n");
    ck_assert_str_eq(back, "hello world\n");
    free(back);
    kiln_tokenizer_free(t);

    /* rank decides: "b c" before "a b" gives a|bc, the other order ab|c */
    static const char *const bc_first[] = {"b c", "a b"}, *const ab_first[] = {"a b", "b c"};
    t = hand_tok("gpt2", bc_first, 2, true, NULL, 0, -1, false);
    expect_toks(t, "abc", "a|bc");
    kiln_tokenizer_free(t);
    t = hand_tok("gpt2", ab_first, 2, true, NULL, 0, -1, false);
    expect_toks(t, "abc", "ab|c");
    kiln_tokenizer_free(t);

    /* equal ranks: leftmost first */
    static const char *const aa[] = {"a a"}, *const aaaa[] = {"a a", "aa aa"};
    t = hand_tok("gpt2", aa, 1, true, NULL, 0, -1, false);
    expect_toks(t, "aaa", "aa|a");
    expect_toks(t, "aaaaa", "aa|aa|a");
    kiln_tokenizer_free(t);
    t = hand_tok("gpt2", aaaa, 2, true, NULL, 0, -1, false);
    expect_toks(t, "aaaaaaa", "aaaa|aa|a");
    kiln_tokenizer_free(t);

    /* llama-bpe keeps a word that is a token whole, even with no merges to it; gpt2 does not */
    static const extra_tok zebra[] = {{SP "zebra", KILN_TOKEN_NORMAL}, {"<s>", KILN_TOKEN_CONTROL}};
    t = hand_tok("llama-bpe", hello_merges, 9, true, zebra, 2, 0, true);
    expect_toks(t, "a zebra", "<s>|a|" SP "zebra");
    expect_toks(t, "", "<s>");
    back = detok(t, "a zebra");
    ck_assert_str_eq(back, "a zebra");
    free(back);
    kiln_tokenizer_free(t);
    t = hand_tok("gpt2", hello_merges, 9, true, zebra, 2, -1, false);
    expect_toks(t, "a zebra", "a|" SP "|z|e|b|r|a");
    kiln_tokenizer_free(t);
    /* tekken keeps whole words too; dbrx has llama-bpe's pattern but not its ignore_merges */
    t = hand_tok("tekken", hello_merges, 9, true, zebra, 2, -1, false);
    expect_toks(t, "a zebra", "a|" SP "zebra");
    kiln_tokenizer_free(t);
    t = hand_tok("dbrx", hello_merges, 9, true, zebra, 2, -1, false);
    expect_toks(t, "a zebra", "a|" SP "|z|e|b|r|a");
    kiln_tokenizer_free(t);

    /* a merge whose text is not a token: each byte of it that is a one-byte token (llama.cpp) */
    static const char *const xy[] = {"x y"}, *const sx[] = {SP " x"};
    t = hand_tok("gpt2", xy, 1, false, NULL, 0, -1, false);
    expect_toks(t, "xyz", "x|y|z");
    kiln_tokenizer_free(t);
    t = hand_tok("gpt2", sx, 1, false, NULL, 0, -1, false);
    expect_toks(t, "a x", "a|x"); /* Ġ is two bytes, neither a token: dropped, as llama.cpp does */
    kiln_tokenizer_free(t);
}
END_TEST

START_TEST(merges_stay_in_words) {
    /* merges that would join across the pre-tokenizer's cuts never apply */
    static const char *const m[] = {"o " SP, "1 2", "2 3", "12 3", "123 4", "a '", "' s", "t '"};
    kiln_tokenizer *t = hand_tok("llama-bpe", m, 8, true, NULL, 0, -1, false);
    expect_toks(t, "go on", "g|o|" SP "|o|n");
    expect_toks(t, "1234", "123|4"); /* groups of three digits */
    expect_toks(t, "it's", "i|t|'s");
    kiln_tokenizer_free(t);
    t = hand_tok("qwen2", m, 8, true, NULL, 0, -1, false);
    expect_toks(t, "1234", "1|2|3|4");
    kiln_tokenizer_free(t);
    t = hand_tok("gpt2", m, 8, true, NULL, 0, -1, false);
    expect_toks(t, "1234", "1234");
    kiln_tokenizer_free(t);
}
END_TEST

START_TEST(special_tokens) {
    static const extra_tok sp[] = {{"<|bos|>", KILN_TOKEN_CONTROL},      {"<|eot|>", KILN_TOKEN_CONTROL},
                                   {"<tool>", KILN_TOKEN_USER_DEFINED},  {"bcd", KILN_TOKEN_USER_DEFINED},
                                   {"ab", KILN_TOKEN_USER_DEFINED},      {"<unk>", KILN_TOKEN_UNKNOWN},
                                   {"<|normal|>", KILN_TOKEN_NORMAL},    {"<|unused|>", KILN_TOKEN_UNUSED}};
    kiln_tokenizer *t = hand_tok("llama-bpe", hello_merges, 9, true, sp, 8, 7, true);
    ck_assert_int_eq(kiln_tokenizer_bos(t), (int32_t)kiln_tokenizer_n_vocab(t) - 8);
    expect_toks(t, "hello<|eot|> world", "<|bos|>|hello|<|eot|>|" SP "world");
    expect_toks(t, "<|eot|><|eot|>", "<|bos|>|<|eot|>|<|eot|>");
    expect_toks(t, "x<tool>y<unk>", "<|bos|>|x|<tool>|y|<unk>");
    /* longest first: "bcd" takes its place before "ab" looks */
    expect_toks(t, "abcd", "<|bos|>|a|bcd");
    expect_toks(t, "abab", "<|bos|>|ab|ab");
    /* normal and unused tokens are text */
    for (int k = 6; k < 8; k++) {
        int32_t *ids, id = (int32_t)kiln_tokenizer_n_vocab(t) - 8 + k;
        int64_t  n;
        TS_OK(kiln_tokenize(t, sp[k].text, strlen(sp[k].text), &ids, &n));
        ck_assert_int_eq(n, 1 + (int64_t)strlen(sp[k].text)); /* bos, then a byte each */
        for (int64_t i = 0; i < n; i++) ck_assert_int_ne(ids[i], id);
        free(ids);
    }
    /* detokenize: control and unknown omitted, user-defined as they are */
    char *back = detok(t, "hello<|eot|> <tool>bcd<unk>");
    ck_assert_str_eq(back, "hello <tool>bcd");
    free(back);
    kiln_tokenizer_free(t);
}
END_TEST

START_TEST(invalid_utf8) {
    kiln_tokenizer *t = hand_tok("gpt2", hello_merges, 9, true, NULL, 0, -1, false);
    char           *back = detok(t, "a\xFF" "b\xC3");
    ck_assert_str_eq(back, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
    free(back);
    back = detok(t, "x\xC0\xAFy"); /* overlong '/', read as llama.cpp reads it */
    ck_assert_str_eq(back, "x/y");
    free(back);
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, "a\0b", 3, &ids, &n)); /* a NUL is a byte like any other */
    ck_assert_int_eq(n, 3);
    char  *out;
    size_t len;
    TS_OK(kiln_detokenize(t, ids, n, &out, &len));
    ck_assert_uint_eq(len, 3);
    ck_assert_int_eq(out[0], 'a');
    ck_assert_int_eq(out[1], 0);
    ck_assert_int_eq(out[2], 'b');
    free(out);
    free(ids);
    kiln_tokenizer_free(t);
}
END_TEST

/* ---- round trips ------------------------------------------------------------------------------- */

/* Random bytes made valid UTF-8: every maximal invalid part becomes U+FFFD. */
static size_t make_valid(const uint8_t *in, size_t n, uint8_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint8_t  b = in[i];
        size_t   need = b < 0x80 ? 0 : b >= 0xC2 && b < 0xE0 ? 1 : b >= 0xE0 && b < 0xF0 ? 2 : b >= 0xF0 && b < 0xF5 ? 3 : 9;
        uint32_t cp = need == 0 ? b : need == 1 ? (b & 0x1Fu) : need == 2 ? (b & 0x0Fu) : (b & 0x07u);
        bool     ok = need < 9 && i + need < n;
        for (size_t j = 1; ok && j <= need; j++) {
            ok = (in[i + j] & 0xC0) == 0x80;
            cp = cp << 6 | (in[i + j] & 0x3Fu);
        }
        if (ok && need) ok = cp >= (need == 1 ? 0x80u : need == 2 ? 0x800u : 0x10000u) && cp <= 0x10FFFF &&
                            !(cp >= 0xD800 && cp <= 0xDFFF);
        if (!ok) {
            memcpy(out + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
            continue;
        }
        memcpy(out + k, in + i, need + 1);
        k += need + 1;
        i += need + 1;
    }
    return k;
}


static void round_trip(const kiln_tokenizer *t, const uint8_t *text, size_t len) {
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, (const char *)text, len, &ids, &n));
    char  *back;
    size_t blen;
    TS_OK(kiln_detokenize(t, ids, n, &back, &blen));
    ck_assert_msg(blen == len && memcmp(back, text, len) == 0 && back[len] == 0, "round trip of %zu bytes '%.*s' gave '%s'",
                  len, (int)len, (const char *)text, back);
    free(back);
    free(ids);
}

static kiln_tokenizer *synth_tok(int64_t n_vocab, const char *pre, km_synth *s) {
    TS_OK(km_synth_make(n_vocab, s));
    kiln_tokenizer_spec spec = {.n_tokens = s->n_tokens, .tokens = s->tokens, .types = s->types,
                                .n_merges = s->n_merges, .merges = s->merges, .pre = pre,
                                .bos = s->bos, .eos = s->eos, .add_bos = false};
    kiln_tokenizer *t;
    TS_OK(kiln_tokenizer_new(&spec, &t));
    return t;
}

static const char *const pres[] = {"gpt2",   "llama-bpe", "qwen2",     "deepseek-llm", "deepseek-coder", "deepseek-v3",
                                   "gpt-4o", "tekken",    "starcoder", "falcon",       "default"};

START_TEST(round_trips) {
    km_synth        s;
    kiln_tokenizer *t = synth_tok(4096, pres[_i], &s);
    uint64_t        r = 1234 + (uint64_t)_i;
    uint8_t         raw[256], text[1024];
    round_trip(t, (const uint8_t *)km_synth_text(), strlen(km_synth_text()));
    for (int it = 0; it < 3000; it++) {
        size_t n = ts_random_text(&r, text, 40);
        round_trip(t, text, n);
        size_t nb = ts_rng_next(&r) % 64;
        for (size_t i = 0; i < nb; i++) raw[i] = (uint8_t)ts_rng_next(&r);
        round_trip(t, text, make_valid(raw, nb, text));
    }
    kiln_tokenizer_free(t);
    km_synth_free(&s);
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------------- */

static void expect_error(kiln_status st, kiln_code code, const char *what) { ts_expect_status(st, code, what); }

START_TEST(errors) {
    const char *toks[300];
    char        store[300][8];
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        int     l = km_utf8_encode(km_byte_to_cp((uint8_t)b), u);
        memcpy(store[b], u, (size_t)l);
        store[b][l] = 0;
        toks[b] = store[b];
    }
    toks[256] = "ab";
    kiln_tokenizer     *t = NULL;
    kiln_tokenizer_spec spec = {.n_tokens = 257, .tokens = toks, .bos = -1, .eos = -1};
    TS_OK(kiln_tokenizer_new(&spec, &t));
    ck_assert_int_eq(kiln_tokenizer_n_vocab(t), 257);
    /* detokenize: ids out of range */
    int32_t bad[] = {97, 257};
    char   *text = NULL;
    expect_error(kiln_detokenize(t, bad, 2, &text, NULL), KILN_ERR_INVALID, "token id 257 at position 1");
    ck_assert_ptr_null(text);
    kiln_tokenizer_free(t);

    static const char *const m_unknown[] = {"a b", "ab zz"}, *const m_nospace[] = {"ab"}, *const m_first[] = {"qq a"};
    spec.merges = m_unknown;
    spec.n_merges = 2;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "merge 1 ('ab zz') names 'zz'");
    spec.merges = m_nospace;
    spec.n_merges = 1;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "merge 0 ('ab')");
    spec.merges = m_first;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "names 'qq'");
    spec.n_merges = 0;
    /* a byte without its token */
    toks[0] = "nul";
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "byte 0x00");
    toks[0] = store[0];
    toks[256] = "a"; /* duplicate of the byte token */
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_FORMAT, "duplicate token 'a'");
    toks[256] = "ab";
    spec.pre = "no-such-pre";
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_INVALID, "'no-such-pre' is not supported (kiln has gpt2, gpt-2,");
    spec.pre = NULL;
    spec.add_bos = true;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_INVALID, "add_bos");
    spec.bos = 257;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_INVALID, "bos 257");
    spec.bos = -1;
    spec.add_bos = false;
    spec.n_tokens = 200;
    expect_error(kiln_tokenizer_new(&spec, &t), KILN_ERR_INVALID, "has 200");
    expect_error(kiln_tokenizer_new(NULL, &t), KILN_ERR_INVALID, "spec");
    ck_assert_ptr_null(t);
    expect_error(kiln_tokenize(NULL, "x", 1, NULL, NULL), KILN_ERR_INVALID, "kiln_tokenize");
    /* an empty token is named as llama.cpp names it, and is text */
    toks[256] = "";
    spec.n_tokens = 257;
    TS_OK(kiln_tokenizer_new(&spec, &t));
    size_t l;
    ck_assert_str_eq(km_token_text(t, 256, &l), "[EMPTY_256]");
    kiln_tokenizer_free(t);
}
END_TEST

/* ---- the synthetic vocabulary ------------------------------------------------------------------ */

START_TEST(synthetic_vocab) {
    static const int64_t sizes[] = {258, 1024, 32000, 128256, 151936};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        km_synth        s, s2;
        kiln_tokenizer *t = synth_tok(sizes[k], "llama-bpe", &s);
        ck_assert_int_eq(kiln_tokenizer_n_vocab(t), sizes[k]);
        ck_assert_int_eq(s.n_learned, sizes[k] == 258 ? 0 : s.n_learned);
        ck_assert_int_eq(s.bos, 256 + s.n_learned);
        ck_assert_str_eq(s.tokens[s.bos], "<|begin_of_text|>");
        ck_assert_str_eq(s.tokens[s.eos], "<|end_of_text|>");
        ck_assert_int_eq(s.types[s.bos], KILN_TOKEN_CONTROL);
        if (sizes[k] > 258) ck_assert_str_eq(s.tokens[s.eos + 1], "<|reserved_0|>");
        if (sizes[k] >= 1024) ck_assert_int_ge(s.n_learned, 400); /* the text's merges, all of them */
        /* deterministic */
        TS_OK(km_synth_make(sizes[k], &s2));
        ck_assert_int_eq(s2.n_merges, s.n_merges);
        for (int64_t i = 0; i < s.n_tokens; i++) ck_assert_str_eq(s.tokens[i], s2.tokens[i]);
        for (int64_t i = 0; i < s.n_merges; i++) ck_assert_str_eq(s.merges[i], s2.merges[i]);
        km_synth_free(&s2);
        /* the text it learned from compresses; everything round-trips; specials match */
        const char *text = km_synth_text();
        int32_t    *ids;
        int64_t     n;
        TS_OK(kiln_tokenize(t, text, strlen(text), &ids, &n));
        if (sizes[k] >= 1024) ck_assert_int_lt(n, (int64_t)strlen(text) / 2);
        free(ids);
        round_trip(t, (const uint8_t *)text, strlen(text));
        const char *mixed = "numbers 1234567, caf\xC3\xA9, \xE4\xB8\xAD\xE6\x96\x87\n\n";
        round_trip(t, (const uint8_t *)mixed, strlen(mixed));
        char *back = detok(t, "<|begin_of_text|>hi<|reserved_0|>");
        ck_assert_str_eq(back, sizes[k] > 258 ? "hi" : "hi<|reserved_0|>");
        free(back);
        kiln_tokenizer_free(t);
        km_synth_free(&s);
    }
    km_synth s;
    expect_error(km_synth_make(257, &s), KILN_ERR_INVALID, "257");
}
END_TEST

/* ---- a large vocabulary --------------------------------------------------------------------------------------- */


/* A vocabulary of Llama 3's size (150k tokens, 280k merges) builds, and 1 MB of text of many
 * scripts round-trips through it. How fast: make perf-check (bench/perf_cpu.c). */
START_TEST(big_vocab_round_trip) {
    ts_vocab v;
    ts_big_vocab(150000, 280000, &v);
    kiln_tokenizer *t;
    TS_OK(kiln_tokenizer_new(&v.spec, &t));
    size_t   len;
    uint8_t *text = ts_big_text(1 << 20, &len);
    int32_t *ids;
    int64_t  n;
    TS_OK(kiln_tokenize(t, (const char *)text, len, &ids, &n));
    ck_assert_int_gt(n, 0);
    ck_assert_int_lt(n, (int64_t)len);
    char  *back;
    size_t blen;
    TS_OK(kiln_detokenize(t, ids, n, &back, &blen));
    ck_assert(blen == len && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    free(text);
    kiln_tokenizer_free(t);
    ts_vocab_free(&v);
}
END_TEST

/* ---- GGUF ---------------------------------------------------------------------------------------- */

START_TEST(gguf_round_trip) {
    char             *dir = ts_tmpdir();
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    TS_OK(kiln_tokenizer_write_synthetic(w, 32000));
    kiln_gguf      *g = ts_gguf_write_read(w, dir, "synth.gguf");
    kiln_tokenizer *t = NULL;
    TS_OK(kiln_tokenizer_from_gguf(g, &t));
    kiln_gguf_close(g);
    km_synth        s;
    kiln_tokenizer *ref = synth_tok(32000, "llama-bpe", &s);
    ck_assert_int_eq(kiln_tokenizer_n_vocab(t), 32000);
    ck_assert_int_eq(kiln_tokenizer_bos(t), s.bos);
    ck_assert_int_eq(kiln_tokenizer_eos(t), s.eos);
    const char *text = "The compiler reads 12345 tokens, doesn't it?\n\n<|end_of_text|>";
    int32_t    *a, *b;
    int64_t     na, nb;
    TS_OK(kiln_tokenize(t, text, strlen(text), &a, &na));
    TS_OK(kiln_tokenize(ref, text, strlen(text), &b, &nb));
    ck_assert_int_eq(na, nb + 1); /* add_bos_token is true in the file */
    ck_assert_int_eq(a[0], s.bos);
    for (int64_t i = 0; i < nb; i++) ck_assert_int_eq(a[i + 1], b[i]);
    ck_assert_int_eq(a[na - 1], s.eos);
    char *back;
    TS_OK(kiln_detokenize(t, a, na, &back, NULL));
    ck_assert_str_eq(back, "The compiler reads 12345 tokens, doesn't it?\n\n");
    free(back);
    free(a);
    free(b);
    kiln_tokenizer_free(t);
    kiln_tokenizer_free(ref);
    km_synth_free(&s);
    w = kiln_gguf_writer_new();
    expect_error(kiln_tokenizer_write_synthetic(w, 100), KILN_ERR_INVALID, "100");
    kiln_gguf_writer_free(w);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(gguf_refused) {
    char *dir = ts_tmpdir();
    static const char *const toks[] = {"a", "b"};
    struct {
        const char *model, *pre, *what;
    } cases[] = {
        {"t5", NULL, "'t5' (Unigram)"},
        {"bert", NULL, "'bert' (WordPiece)"},
        {NULL, NULL, "no tokenizer.ggml.model"},
        {"gpt2", NULL, "tokenizer.ggml.pre is missing"},
        {"gpt2", "no-such-pre", "tokenizer.ggml.pre 'no-such-pre' is not supported (kiln has gpt2, gpt-2,"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_gguf_writer *w = kiln_gguf_writer_new();
        if (cases[i].model) kiln_gguf_set_str(w, "tokenizer.ggml.model", cases[i].model);
        if (cases[i].pre) kiln_gguf_set_str(w, "tokenizer.ggml.pre", cases[i].pre);
        kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", 2, toks);
        kiln_gguf      *g = ts_gguf_write_read(w, dir, "bad.gguf");
        kiln_tokenizer *t = NULL;
        expect_error(kiln_tokenizer_from_gguf(g, &t), KILN_ERR_FORMAT, cases[i].what);
        ck_assert_ptr_null(t);
        kiln_gguf_close(g);
    }
    /* a synthetic vocabulary with broken keys */
    for (int k = 0; k < 3; k++) {
        kiln_gguf_writer *w = kiln_gguf_writer_new();
        TS_OK(kiln_tokenizer_write_synthetic(w, 1024));
        const char *what = NULL;
        if (k == 0) {
            kiln_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 5000);
            what = "tokenizer.ggml.bos_token_id is 5000";
        } else if (k == 1) {
            uint32_t ty[1024] = {0};
            kiln_gguf_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_U32, 1024, ty);
            what = "tokenizer.ggml.token_type";
        } else {
            static const char *const m[] = {"x nosuchtoken"};
            kiln_gguf_set_arr_str(w, "tokenizer.ggml.merges", 1, m);
            what = "merge 0";
        }
        kiln_gguf      *g = ts_gguf_write_read(w, dir, "bad.gguf");
        kiln_tokenizer *t = NULL;
        expect_error(kiln_tokenizer_from_gguf(g, &t), KILN_ERR_FORMAT, what);
        kiln_gguf_close(g);
    }
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("tokenizer",
                        TS_CASE("tokenizer", 60),
                        TS_TESTS(gpt2_split, llama3_split, qwen2_split, deepseek_llm_split, deepseek_coder_split,
                                 deepseek_v3_split, gpt4o_split, tekken_split, starcoder_falcon_default_split,
                                 pre_names, classes_and_utf8, known_tokenizations,
                                 merges_stay_in_words, special_tokens, invalid_utf8),
                        TS_LOOP(0, (int)(sizeof pres / sizeof pres[0]), round_trips),
                        TS_TESTS(errors, synthetic_vocab, big_vocab_round_trip, gguf_round_trip, gguf_refused));
    return ts_main(s);
}
