/* The .kg text format: kiln_parse, kiln_load, kiln_print (docs/graph-format.md). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "frontend/frontend.h"
#include "tests/support.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static char *print_ctx(const kiln_ctx *ctx) {
    char *text = NULL;
    TS_OK(kiln_print(ctx, &text));
    ck_assert_ptr_nonnull(text);
    return text;
}

/* Two contexts hold the same graph: same tensors in the same order with the same ops, types,
 * roles, names, shapes, strides, operands, aliasing and parameters. (Source positions and the
 * named flag may differ: they say how a tensor was made, not what it is.) */
static void assert_same_graph(const kiln_ctx *a, const kiln_ctx *b) {
    ck_assert_int_eq(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        const kiln_tensor *x = a->t[i], *y = b->t[i];
        ck_assert_str_eq(x->name, y->name);
        ck_assert_int_eq(x->id, y->id);
        ck_assert_int_eq(x->op, y->op);
        ck_assert_int_eq(x->type, y->type);
        ck_assert_int_eq(x->role, y->role);
        ck_assert_int_eq(x->n_dims, y->n_dims);
        for (int d = 0; d < 4; d++) {
            ck_assert_int_eq(x->ne[d], y->ne[d]);
            ck_assert_uint_eq(x->nb[d], y->nb[d]);
            ck_assert_int_eq(x->ip[d], y->ip[d]);
        }
        for (int s = 0; s < FE_MAX_SRC; s++) {
            ck_assert_int_eq(x->src[s] != NULL, y->src[s] != NULL);
            if (x->src[s]) ck_assert_int_eq(x->src[s]->id, y->src[s]->id);
        }
        ck_assert_int_eq(x->view_src != NULL, y->view_src != NULL);
        if (x->view_src) ck_assert_int_eq(x->view_src->id, y->view_src->id);
        ck_assert_uint_eq(x->view_offs, y->view_offs);
        ck_assert_uint_eq(x->op_offs, y->op_offs);
        ck_assert_msg(memcmp(x->fp, y->fp, sizeof x->fp) == 0 ||
                          (x->fp[0] != x->fp[0] && y->fp[0] != y->fp[0]), /* any nan is nan */
                      "scale params of '%s' differ", x->name);
    }
}

/* parse(text) printed, parsed again, printed again: same graph, same bytes. Returns the first
 * print (caller frees). */
static char *roundtrip(const char *text, const char *what) {
    kiln_ctx *c1 = kiln_ctx_new();
    kiln_status st = kiln_parse(c1, text, strlen(text), "test.kg");
    ck_assert_msg(st == NULL, "%s: %s", what, kiln_status_msg(st));
    char *p1 = print_ctx(c1);
    kiln_ctx *c2 = kiln_ctx_new();
    st = kiln_parse(c2, p1, strlen(p1), "printed.kg");
    ck_assert_msg(st == NULL, "%s: printed text does not parse: %s\n%s", what, kiln_status_msg(st), p1);
    assert_same_graph(c1, c2);
    char *p2 = print_ctx(c2);
    ck_assert_msg(strcmp(p1, p2) == 0, "%s: print is not stable:\n%s---\n%s", what, p1, p2);
    free(p2);
    kiln_ctx_free(c1);
    kiln_ctx_free(c2);
    return p1;
}

/* The error of parsing text (which must fail); caller frees. */
static kiln_status parse_err(const char *text) {
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_status st = kiln_parse(ctx, text, strlen(text), "test.kg");
    ck_assert_msg(st != NULL, "parsing should fail:\n%s", text);
    /* The failure is also the context's error, as a builder's would be. */
    kiln_status again = kiln_ctx_status(ctx);
    ck_assert_str_eq(kiln_status_msg(again), kiln_status_msg(st));
    kiln_status_free(again);
    kiln_ctx_free(ctx);
    return st;
}

/* ---- round trips ------------------------------------------------------------------------- */

START_TEST(examples_roundtrip) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/examples", ts_src_dir());
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s (set KILN_SRC)", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".kg") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        kiln_ctx *ctx = kiln_ctx_new();
        kiln_status st = kiln_load(ctx, path);
        ck_assert_msg(st == NULL, "%s", kiln_status_msg(st));
        ck_assert_int_gt(ctx->n, 0);
        /* Every example is a complete graph: it has an output and kiln_graph_new accepts it. */
        kiln_graph *g = NULL;
        TS_OK(kiln_graph_new(ctx, &g));
        kiln_graph_free(g);
        char *p0 = print_ctx(ctx);
        char *p1 = roundtrip(p0, path);
        ck_assert_str_eq(p0, p1);
        free(p0);
        free(p1);
        kiln_ctx_free(ctx);
        n++;
    }
    closedir(d);
    ck_assert_int_ge(n, 3);
}
END_TEST

static const char *inline_graphs[] = {
    /* no header, odd spacing, comments, CRLF */
    "input x: f32[8]\r\n  a =neg( x )# c\r\noutput b=add(a,x)\r\n",
    /* no final newline */
    "input x: f32[8, 2]\noutput y = relu(x)",
    /* scale in every spelling */
    "input x: f32[4]\n"
    "a = scale(x, 2)\nb = scale(a, -0.5, 1e-3)\nc = scale(b, inf, -inf)\nd = scale(c, nan)\n"
    "e = scale(d, 0x1p-3, 1.0e+10)\nf = scale(e, 1e-40, -0)\noutput g = scale(f, 3.14159265358979, .5)\n",
    /* keywords and float spellings as names */
    "input input: f32[4]\nweight weight: f32[4]\noutput output = add(input, weight)\n"
    "inf = neg(output)\nnan = scale(inf, inf, nan)\n_0 = neg(nan)\na.b_c = neg(_0)\n",
    /* trailing ones are kept, leading ones too */
    "input a: f32[4, 1, 1]\ninput b: f16[1, 1, 4]\ninput c: bf16[1]\ninput d: i32[2, 3, 4, 5]\n"
    "input e: i64[7]\nx = mul(a, a)\n",
    /* views of views */
    "input x: f32[6, 4, 2]\nr = reshape(x, [24, 2])\nt = transpose(r)\np = permute(t, 0, 1, 3, 2)\n"
    "c = cont(p)\nv = view(c, [3, 2], [48], 8)\nw = view(v, [2], [], 4)\nv4 = view(x, [2, 2, 2, 2], [24, 48, 96], 0)\n"
    "output y = cont(w)\n",
    /* empty graphs */
    "",
    "# nothing\n\n   \n",
    "kiln-graph 1\n",
    "# the header may follow comments\n\nkiln-graph 1 # version\ninput x: f32[3]\n",
};

START_TEST(inline_roundtrip) {
    for (size_t i = 0; i < sizeof inline_graphs / sizeof *inline_graphs; i++) {
        char what[32];
        snprintf(what, sizeof what, "inline graph %zu", i);
        free(roundtrip(inline_graphs[i], what));
    }
}
END_TEST

START_TEST(canonical_text) {
    const char *in = "# comment\n"
                     "input  x : f32 [ 4096 , 8 ]   # trailing comment\n"
                     "weight w: f16[4096]\n"
                     "\n"
                     "a=mul( x,w )\n"
                     "g = gelu(a)\n"
                     "s = scale(g, 0.1)\n"
                     "r = reshape(s, [64, 512])\n"
                     "p = permute(r, 1, 0, 2, 3)\n"
                     "t = transpose(r)\n"
                     "v = view(x, [64, 8], [16384], 0)\n"
                     "c = cont(p)\n"
                     "z = scale(c, nan, -inf)\n"
                     "output y = add(c, c)\n";
    const char *want = "kiln-graph 1\n"
                       "input x: f32[4096, 8]\n"
                       "weight w: f16[4096]\n"
                       "a = mul(x, w)\n"
                       "g = gelu(a)\n"
                       "s = scale(g, 0.1, 0)\n"
                       "r = reshape(s, [64, 512])\n"
                       "p = permute(r, 1, 0, 2, 3)\n"
                       "t = transpose(r)\n"
                       "v = view(x, [64, 8], [16384], 0)\n"
                       "c = cont(p)\n"
                       "z = scale(c, nan, -inf)\n"
                       "output y = add(c, c)\n";
    char *got = roundtrip(in, "canonical");
    ck_assert_str_eq(got, want);
    free(got);

    kiln_ctx *ctx = ts_parse(in);
    kiln_tensor *v = fe_find(ctx, "v");
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(v->op, FE_OP_VIEW);
    ck_assert_int_eq(v->line, 11);
    ck_assert_int_eq(v->col, 5); /* builders get the op's position */
    ck_assert_int_eq(fe_find(ctx, "y")->role, KILN_ROLE_OUTPUT);
    ck_assert_int_eq(fe_find(ctx, "w")->role, KILN_ROLE_WEIGHT);
    ck_assert_float_eq(fe_find(ctx, "s")->fp[0], 0.1f);
    ck_assert_ptr_null(ctx->file); /* the parser's location does not outlive it */
    kiln_ctx_free(ctx);
}
END_TEST

/* Graphs built through the C API print with their auto names, and parse back. */
START_TEST(print_c_api_graph) {
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t ne[2] = {16, 2};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 2, ne);
    kiln_tensor *b = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_BF16, "b", 1, ne);
    kiln_tensor *y = kiln_scale(ctx, kiln_silu(ctx, kiln_add(ctx, x, b)), 2.0f, 0.0f);
    kiln_set_output(ctx, y, NULL);
    TS_OK(kiln_ctx_status(ctx));
    char *text = print_ctx(ctx);
    ck_assert_str_eq(text, "kiln-graph 1\n"
                           "input x: f32[16, 2]\n"
                           "weight b: bf16[16]\n"
                           "_2 = add(x, b)\n"
                           "_3 = silu(_2)\n"
                           "output _4 = scale(_3, 2, 0)\n");
    kiln_ctx *back = ts_parse(text);
    assert_same_graph(ctx, back);
    free(text);
    kiln_ctx_free(back);
    kiln_ctx_free(ctx);
}
END_TEST

/* What text cannot say is an error of kiln_print, not text that fails to parse. */
START_TEST(print_refuses_unspellable) {
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t ne[1] = {4};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "_1", 1, ne);
    kiln_neg(ctx, x); /* auto-named _1 too */
    TS_OK(kiln_ctx_status(ctx));
    char *text = (char *)1;
    kiln_status st = kiln_print(ctx, &text);
    ck_assert_ptr_null(text);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "'_1'"));
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}
END_TEST

/* Duplicated names (auto names meeting user names) are refused by kiln_graph_new and kiln_print,
 * which report the name first in byte order and, for print, its two lowest ids. */
START_TEST(duplicate_names_reported) {
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[1] = {4};
    kiln_tensor *x4 = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "_4", 1, ne); /* id 0 */
    kiln_tensor *x2 = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "_2", 1, ne); /* id 1 */
    kiln_tensor *a = kiln_neg(ctx, kiln_neg(ctx, kiln_neg(ctx, x4)));              /* ids 2 (_2), 3, 4 (_4) */
    kiln_set_output(ctx, kiln_add(ctx, a, x2), "y");
    TS_OK(kiln_ctx_status(ctx));
    kiln_graph *g = NULL;
    ts_expect_status(kiln_graph_new(ctx, &g), KILN_ERR_INVALID, "two tensors are named '_2'");
    char       *text = NULL;
    kiln_status st = kiln_print(ctx, &text);
    ck_assert_ptr_null(text);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "tensors 1 and 2 are both named '_2'"), "%s",
                  st ? kiln_status_msg(st) : "no error");
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}
END_TEST

/* The builders of text and records the printer and the plan reader lean on: kb_fmt_i64 prints
 * as "%lld" (the extremes too), kb_str_addf gives snprintf's text whether it fits the room left
 * or must grow (lengths around the buffer's doublings), and the little-endian readers give back
 * what the writers put, byte order fixed. */
START_TEST(text_and_record_builders) {
    static const int64_t vals[] = {0, 7, -7, 10, -10, 1234567890123LL, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        char got[24], want[32];
        snprintf(want, sizeof want, "%lld", (long long)vals[i]);
        ck_assert_str_eq(kb_fmt_i64(vals[i], got), want);
    }
    kb_str  b = {0};
    char   *want = calloc(1, 1 << 16);
    size_t  wl = 0;
    ck_assert_ptr_nonnull(want);
    for (int n = 0; n < 700; n += 7) { /* pieces of 0 .. 693 characters, '%d' and '%s' mixed */
        char piece[800];
        memset(piece, 'a' + n % 26, (size_t)n);
        piece[n] = 0;
        kb_str_addf(&b, "%d:%s|", n, piece);
        wl += (size_t)snprintf(want + wl, (1 << 16) - wl, "%d:%s|", n, piece);
        ck_assert_uint_eq(b.len, wl);
        ck_assert_int_eq(b.s[b.len], 0);
        kb_str_add_i64(&b, -n);
        wl += (size_t)snprintf(want + wl, (1 << 16) - wl, "%d", -n);
    }
    char *text = kb_str_take(&b);
    ck_assert_str_eq(text, want);
    free(text), free(want);
    kb_str r = {0};
    kb_put_u32(&r, 0x11223344u);
    kb_put_u64(&r, 0x0102030405060708ull);
    static const uint8_t le[12] = {0x44, 0x33, 0x22, 0x11, 8, 7, 6, 5, 4, 3, 2, 1};
    ck_assert_uint_eq(r.len, 12);
    ck_assert(!memcmp(r.s, le, 12));
    kb_reader rd = {.p = (const uint8_t *)r.s, .len = r.len};
    ck_assert_uint_eq(kb_get_u32(&rd, "u32"), 0x11223344u);
    ck_assert(kb_get_u64(&rd, "u64") == 0x0102030405060708ull);
    ck_assert_ptr_null(rd.err);
    ck_assert(kb_get_u32(&rd, "past the end") == 0 && rd.err);
    kb_str_free(&r);
}
END_TEST

/* Every op of the table except leaf has a spelling, and it builds that op. */
/* Every op of FE_OPS, parsed from text and printed back canonically. */
START_TEST(every_op_parses) {
    static const struct {
        fe_op       op;
        const char *args;
    } special[] = {
        {FE_OP_RESHAPE, "a, [12]"},
        {FE_OP_VIEW, "a, [2, 2], [16], 4"},
        {FE_OP_PERMUTE, "a, 1, 0, 2, 3"},
        {FE_OP_SCALE, "a, 1.5, -2"},
        {FE_OP_LEAKY_RELU, "a, 0.01"},
        {FE_OP_CLAMP, "a, -1, 1"},
        {FE_OP_ADD1, "a, s"},
        {FE_OP_REGLU, "a"},
        {FE_OP_GEGLU, "a, swapped=true"},
        {FE_OP_SWIGLU, "a, b=a"},
        {FE_OP_GEGLU_ERF, "a, swapped=false"},
        {FE_OP_GEGLU_QUICK, "a"},
        {FE_OP_SWIGLU_OAI, "a, swapped=true, alpha=1.5, limit=6"},
        {FE_OP_CPY, "a, h"},
        {FE_OP_DUP, "a"},
        {FE_OP_CAST, "a, bf16"},
        {FE_OP_REPEAT, "b, a"},
        {FE_OP_GET_ROWS, "a, i"},
        {FE_OP_SET_ROWS, "a, r, i"},
        {FE_OP_CONCAT, "a, a, 1"},
        {FE_OP_PAD, "a, 1, 2, 0, 1"},
        {FE_OP_ADD_ID, "a, e, j"},
        {FE_OP_NORM, "a, 1e-05"},
        {FE_OP_RMS_NORM, "a, 1e-06"},
        {FE_OP_L2_NORM, "a, 1e-12"},
        {FE_OP_GROUP_NORM, "a, 1, 1e-05"},
        {FE_OP_SOFT_MAX_EXT, "a, mask=m, scale=0.5, max_bias=0, sinks=k"},
        {FE_OP_ROPE_EXT, "a, p, n_dims=4, mode=2"},
        {FE_OP_ARGSORT, "a, desc"},
        {FE_OP_ARGSORT_TOP_K, "a, 2"},
        {FE_OP_TOP_K, "a, 2"},
        {FE_OP_ARANGE, "0, 10, 1"},
        {FE_OP_FILL, "a, 2"},
        {FE_OP_DIAG_MASK_INF, "q, 1"},
        {FE_OP_TRI, "q, lower"},
        {FE_OP_MUL_MAT_ID, "x, b, i"},
        {FE_OP_FLASH_ATTN_EXT, "a, a, a, scale=0.5, logit_softcap=30, sinks=k"},
        {FE_OP_SAMPLE, "b, p, seed_lo=7, seed_hi=-2, temp=0.5, top_k=3"},
        {FE_OP_ALL_REDUCE, "a, 2"},
    };
    for (int op = 0; op < FE_OP_COUNT; op++) {
        if (op == FE_OP_LEAF) continue;
        const char *args = fe_ops[op].nsrc == 2 ? "a, b" : "a";
        for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
            if ((int)special[i].op == op) args = special[i].args;
        char text[512];
        snprintf(text, sizeof text,
                 "input a: f32[4, 3]\ninput b: f32[4]\ninput s: f32[1]\ninput h: f16[12]\n"
                 "input i: i32[2]\ninput j: i32[3]\ninput r: f32[4, 2]\ninput e: f32[4, 5]\n"
                 "input m: f16[4, 3]\ninput k: f32[1]\ninput p: i32[1]\ninput q: f32[3, 3]\n"
                 "input x: f32[4, 3, 2]\n"
                 "output y = %s(%s)\n",
                 fe_ops[op].name, args);
        kiln_ctx *ctx = ts_parse(text);
        kiln_tensor *y = fe_find(ctx, "y");
        ck_assert_ptr_nonnull(y);
        ck_assert_msg(y->op == (fe_op)op, "%s built op %d", fe_ops[op].name, (int)y->op);
        kiln_ctx_free(ctx);
        free(roundtrip(text, fe_ops[op].name));
    }
}
END_TEST

/* Every row of FE_OPS has a signature the printer and parser agree on: its tensor parameters
 * are the op's nsrc, and the usage line names every parameter. */
START_TEST(signatures_match_table) {
    for (int op = 0; op < FE_OP_COUNT; op++) {
        const fe_sig *sig = fe_op_sig((fe_op)op);
        ck_assert_msg(sig->ntensor == fe_ops[op].nsrc, "%s: signature has %d tensors, table says %d",
                      fe_ops[op].name, sig->ntensor, fe_ops[op].nsrc);
        ck_assert_int_le(sig->nint, FE_MAX_IP);
        ck_assert_int_le(sig->nfloat, FE_MAX_FP);
        char usage[512];
        fe_op_usage((fe_op)op, usage, sizeof usage);
        for (int i = 0; i < sig->n; i++) {
            ck_assert_msg(sig->p[i].name[0], "%s: parameter %d has no name", fe_ops[op].name, i);
            ck_assert_msg(strstr(usage, sig->p[i].name), "%s: usage '%s' lacks %s", fe_ops[op].name, usage,
                          sig->p[i].name);
        }
    }
}
END_TEST

/* FE_FAMS and the families of FE_OPS: NONE alone has no name, every other family serves some
 * op, and the shape-rule dispatch gives a rule exactly to the kinds fe_build infers. */
START_TEST(families_match_table) {
    for (int f = 0; f < FE_FAM_COUNT; f++) {
        const char *name = fe_fams[f].name;
        ck_assert_msg((f == FE_FAM_NONE) == !name[0], "family %d: name '%s'", f, name);
        for (const char *c = name; *c; c++)
            ck_assert_msg((*c >= 'a' && *c <= 'z') || *c == '_', "family %s: not a module name", name);
        int ops = 0;
        for (int op = 0; op < FE_OP_COUNT; op++) ops += fe_ops[op].fam == (fe_fam)f;
        ck_assert_msg(ops > 0, "family %d (%s) serves no op", f, name);
    }
    for (int op = 0; op < FE_OP_COUNT; op++) {
        fe_kind k = fe_ops[op].kind;
        bool    inferred = k == FE_GLU || k == FE_COPY || k == FE_KERNEL;
        ck_assert_msg((fe_infer_of((fe_op)op) != NULL) == inferred, "op %s: shape rule %s", fe_ops[op].name,
                      inferred ? "missing" : "unexpected");
    }
    ck_assert_ptr_null(fe_infer_of(FE_OP_COUNT));
}
END_TEST

/* name=value arguments: any order after the positional ones, defaults filled in, and errors. */
START_TEST(keyword_arguments) {
    const char *text = "input a: f32[4, 3]\noutput y = scale(a, b=2, s=3)\n";
    kiln_ctx *ctx = ts_parse(text);
    kiln_tensor *y = fe_find(ctx, "y");
    ck_assert_float_eq(y->fp[0], 3.0f);
    ck_assert_float_eq(y->fp[1], 2.0f);
    kiln_ctx_free(ctx);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"input a: f32[4]\ny = scale(a, q=2)\n", "scale has no parameter 'q'"},
        {"input a: f32[4]\ny = scale(a, s=2, s=3)\n", "parameter 's' is given twice"},
        {"input a: f32[4]\ny = scale(a, b=2)\n", "missing parameter 's'"},
        {"input a: f32[4]\ny = scale(a, s=2, 3)\n", "positional argument after a name=value"},
        {"input a: f32[4]\ny = argsort(a, sideways)\n", "must be one of the names"},
        {"input a: f32[4]\ny = cast(a, f64)\n", "must be a type"},
        {"input a: f32[4]\ny = swiglu(a, swapped=maybe)\n", "must be true or false"},
        {"input a: f32[4]\ny = soft_max_ext(a, 0.5)\n", "name a tensor there"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_ctx *c = kiln_ctx_new();
        kiln_status st = kiln_parse(c, bad[i].text, strlen(bad[i].text), "k.kg");
        ck_assert_msg(st && strstr(kiln_status_msg(st), bad[i].want), "case %zu: want '%s' in '%s'", i,
                      bad[i].want, kiln_status_msg(st));
        kiln_status_free(st);
        kiln_ctx_free(c);
    }
}
END_TEST

/* Parsing into a context that has tensors: they are operands, and their names are taken. */
START_TEST(parse_into_nonempty_ctx) {
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t ne[1] = {8};
    kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 1, ne);
    const char *more = "output y = neg(x)\n";
    TS_OK(kiln_parse(ctx, more, strlen(more), "more.kg"));
    ck_assert_int_eq(ctx->n, 2);
    ck_assert_ptr_eq(fe_find(ctx, "y")->src[0], fe_find(ctx, "x"));
    const char *dup = "x = neg(y)\n";
    kiln_status st = kiln_parse(ctx, dup, strlen(dup), "dup.kg");
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "dup.kg:1:1: error: duplicate name 'x'"));
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------ */

#define PRE "input x: f32[4, 3]\ninput y: f32[4, 3]\n" /* lines 1 and 2 */

static const struct {
    const char *text, *where, *word;
} errors[] = {
    {PRE "a = foo(x)\n", "test.kg:3:5: error: ", "unknown op 'foo'"},
    {PRE "a = ad(x, y)\n", "test.kg:3:5: error: ", "did you mean 'add'"},
    {PRE "a = leaf()\n", "test.kg:3:5: error: ", "not an op"},
    {PRE "input z: f64[4]\n", "test.kg:3:10: error: ", "unknown type 'f64'"},
    {PRE "input z: [4]\n", "test.kg:3:10: error: ", "type"},
    {PRE "a = add(x, q)\n", "test.kg:3:12: error: ", "undefined name 'q'"},
    {PRE "x = neg(y)\n", "test.kg:3:1: error: ", "duplicate name 'x': first defined at line 1"},
    {PRE "input y: f32[4]\n", "test.kg:3:7: error: ", "duplicate name 'y'"},
    {PRE "a = add(x)\n", "test.kg:3:10: error: ", "add takes 2 operands, got 1"},
    {PRE "a = add(x, y, x)\n", "test.kg:3:15: error: ", "add takes 2 operands, got 3"},
    {PRE "a = add(x, 2)\n", "test.kg:3:12: error: ", "add takes 2 operands"},
    {PRE "a = neg(x, y)\n", "test.kg:3:12: error: ", "neg takes 1 operand, got 2"},
    {PRE "a = neg(x, 2)\n", "test.kg:3:12: error: ", "no parameters"},
    {PRE "a = scale(x)\n", "test.kg:3:12: error: ", "wrong number of arguments to scale"},
    {PRE "a = scale(x, 1, 2, 3)\n", "test.kg:3:20: error: ", "wrong number of arguments"},
    {PRE "a = permute(x, 1, 0)\n", "test.kg:3:20: error: ", "permute(a, ax0, ax1, ax2, ax3)"},
    {PRE "a = reshape(x, 12)\n", "test.kg:3:16: error: ", "must be a list"},
    {PRE "a = reshape(x, [12\n", "test.kg:3:19: error: ", "missing ']'"},
    {PRE "a = reshape(x, [12", "test.kg:3:19: error: ", "end of file"},
    {PRE "input z: f32[4, 3\n", "test.kg:3:18: error: ", "missing ']'"},
    {PRE "a = neg(x\n", "test.kg:3:10: error: ", "missing ')'"},
    {PRE "a = neg(x y)\n", "test.kg:3:11: error: ", "missing ')'"},
    {PRE "a = add(x, $y)\n", "test.kg:3:12: error: ", "unexpected character '$'"},
    {PRE "@\n", "test.kg:3:1: error: ", "unexpected character '@'"},
    {PRE "a = neg(x)\x01\n", "test.kg:3:11: error: ", "character '\\x01'"},
    {PRE "a = neg(x) y\n", "test.kg:3:12: error: ", "trailing junk"},
    {PRE "a neg(x)\n", "test.kg:3:3: error: ", "expected '=' after 'a'"},
    {PRE "a\n", "test.kg:3:2: error: ", "expected '='"},
    {PRE "a: f32[4]\n", "test.kg:3:2: error: ", "'input' or 'weight'"},
    {PRE "a = neg x\n", "test.kg:3:9: error: ", "expected '('"},
    {PRE "a = (x)\n", "test.kg:3:5: error: ", "expected an op name"},
    {PRE "= neg(x)\n", "test.kg:3:1: error: ", "expected a statement"},
    {PRE "input z: f32[1, 2, 3, 4, 5]\n", "test.kg:3:26: error: ", "too many dims"},
    {PRE "a = reshape(x, [1, 1, 1, 3, 4])\n", "test.kg:3:29: error: ", "too many dims"},
    {PRE "input z: f32[]\n", "test.kg:3:13: error: ", "empty shape"},
    {PRE "a = reshape(x, [])\n", "test.kg:3:16: error: ", "empty shape"},
    {PRE "input z: f32[4x]\n", "test.kg:3:14: error: ", "bad number"},
    {PRE "input z: f32[2.5]\n", "test.kg:3:14: error: ", "bad number"},
    {PRE "input z: f32[99999999999999999999]\n", "test.kg:3:14: error: ", "out of range"},
    {PRE "a = scale(x, 1.2.3)\n", "test.kg:3:14: error: ", "bad number"},
    {PRE "a = scale(x, 1e99)\n", "test.kg:3:14: error: ", "out of range"},
    {PRE "a = scale(x, [1])\n", "test.kg:3:14: error: ", "must be a number"},
    {PRE "a = permute(x, 1.5, 0, 2, 3)\n", "test.kg:3:16: error: ", "bad number"},
    {PRE "a = view(x, [4, 3], [], 0)\n", "test.kg:3:21: error: ", "takes 1 stride"},
    {PRE "a = view(x, [4, 3], [-16], 0)\n", "test.kg:3:21: error: ", "negative"},
    {PRE "a = view(x, [4, 3], [16], -4)\n", "test.kg:3:27: error: ", "negative"},
    {PRE "a = neg(x, x, x, x, x, x, x, x, x)\n", "test.kg:3:12: error: ", "neg takes 1 operand, got 9"},
    {PRE "a = neg(x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x)\n", "test.kg:3:57: error: ", "too many arguments"},
    {PRE "kiln-graph 1\n", "test.kg:3:1: error: ", "header must come before"},
    {"kiln-graph 2\n", "test.kg:1:12: error: ", "unsupported format version 2"},
    {"kiln-graph\n", "test.kg:1:11: error: ", "format version"},
    {"input x: f32[4]\n\n\n# c\n  y = neg(z)\n", "test.kg:5:11: error: ", "undefined name 'z'"},
    {"input aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa: f32[4]\n",
     "test.kg:1:7: error: ", "too long"},
};

START_TEST(parse_errors) {
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++) {
        kiln_status st = parse_err(errors[i].text);
        const char *msg = kiln_status_msg(st);
        ck_assert_msg(kiln_status_code(st) == KILN_ERR_PARSE, "case %zu: code %s: %s", i,
                      kiln_code_name(kiln_status_code(st)), msg);
        ck_assert_msg(strncmp(msg, errors[i].where, strlen(errors[i].where)) == 0,
                      "case %zu: want prefix '%s', got '%s'", i, errors[i].where, msg);
        ck_assert_msg(strstr(msg, errors[i].word) != NULL, "case %zu: want '%s' in '%s'", i,
                      errors[i].word, msg);
        kiln_status_free(st);
    }
}
END_TEST

/* Shape errors come from the builders, located at the statement's op. */
START_TEST(builder_errors_located) {
    static const struct {
        const char *text, *where, *op;
    } cases[] = {
        {"input x: f32[3, 4]\ninput y: f32[4, 4]\nz = add(x, y)\n", "test.kg:3:5: ", "add"},
        {"input x: f32[3, 4]\n# comment\n\n  output z = reshape(x, [5])\n", "test.kg:4:14: ", "reshape"},
        {"input x: f32[3, 4]\nz = permute(x, 0, 0, 1, 2)\n", "test.kg:2:5: ", "permute"},
        {"input x: f32[3, 4]\nz = view(x, [3, 4], [12], 4)\n", "test.kg:2:5: ", "view"},
        {"input x: i32[3]\nz = exp(x)\n", "test.kg:2:5: ", "exp"},
        {"input x: f32[0]\n", "test.kg:1:7: ", "dim"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_status st = parse_err(cases[i].text);
        const char *msg = kiln_status_msg(st);
        ck_assert_msg(strncmp(msg, cases[i].where, strlen(cases[i].where)) == 0,
                      "case %zu: want prefix '%s', got '%s'", i, cases[i].where, msg);
        ck_assert_msg(strstr(msg, cases[i].op) != NULL, "case %zu: want '%s' in '%s'", i, cases[i].op, msg);
        kiln_status_free(st);
    }
}
END_TEST

START_TEST(load_file) {
    char *dir = ts_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/g.kg", dir);
    const char *text = "input x: f32[2]\nz = nope(x)\n";
    TS_OK(kb_write_file(path, text, strlen(text)));
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_status st = kiln_load(ctx, path);
    char want[4300];
    snprintf(want, sizeof want, "%s:2:5: error: unknown op 'nope'", path);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_PARSE);
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), want));
    kiln_status_free(st);
    kiln_ctx_free(ctx);

    snprintf(path, sizeof path, "%s/missing.kg", dir);
    ctx = kiln_ctx_new();
    st = kiln_load(ctx, path);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_IO);
    kiln_status_free(st);
    kiln_ctx_free(ctx);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- robustness -------------------------------------------------------------------------- */

/* Texts with NUL bytes, no terminator, huge tokens and lines: errors, never crashes. The
 * buffers are exactly as long as the text so that ASan sees any read past the end. */
START_TEST(hostile_input) {
    static const char nul[] = "input x: f32[4]\na = neg(x)\0b = neg(a)\n";
    char *buf = malloc(sizeof nul - 1);
    memcpy(buf, nul, sizeof nul - 1);
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_status st = kiln_parse(ctx, buf, sizeof nul - 1, "test.kg");
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "test.kg:2:11: error: unexpected character '\\x00'"));
    kiln_status_free(st);
    kiln_ctx_free(ctx);
    free(buf);

    /* Every prefix of a valid text, unterminated. */
    const char *full = "kiln-graph 1\ninput x: f32[4, 2]\nv = view(x, [2, 2], [8], 4)\ns = scale(v, -1e-3, inf)\n";
    for (size_t n = 0; n <= strlen(full); n++) {
        buf = malloc(n ? n : 1);
        memcpy(buf, full, n);
        ctx = kiln_ctx_new();
        st = kiln_parse(ctx, buf, n, "test.kg");
        if (st) ck_assert_msg(strncmp(kiln_status_msg(st), "test.kg:", 8) == 0, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        kiln_ctx_free(ctx);
        free(buf);
    }

    /* Megabyte tokens: a name, a number, an op, a type, a comment. */
    size_t big = 1 << 20;
    const char *shapes[] = {"input %s: f32[4]\n", "input x: f32[%s]\n", "input x: f32[4]\ny = %s(x)\n",
                            "input x: %s[4]\n", "# %s\n", "input x: f32[4]\ny = scale(x, %s)\n"};
    char *tok = malloc(big + 1);
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        memset(tok, k == 1 || k == 5 ? '9' : 'a', big);
        tok[big] = 0;
        buf = malloc(big + 64);
        snprintf(buf, big + 64, shapes[k], tok);
        ctx = kiln_ctx_new();
        st = kiln_parse(ctx, buf, strlen(buf), "test.kg");
        if (k == 4) ck_assert_ptr_null(st);
        else ck_assert_msg(strncmp(kiln_status_msg(st), "test.kg:", 8) == 0, "%.200s", kiln_status_msg(st));
        ck_assert_uint_lt(strlen(kiln_status_msg(st)), 1000); /* messages quote tokens shortened */
        kiln_status_free(st);
        kiln_ctx_free(ctx);
        free(buf);
    }
    free(tok);
}
END_TEST

/* Random edits of valid graphs: each result parses or fails with a located error; whatever
 * parses round-trips. */
START_TEST(fuzz_mutations) {
    const char *seeds[] = {
        "kiln-graph 1\ninput x: f32[8, 4]\nweight w: f16[8]\na = mul(x, w)\nb = scale(a, 0.5, -1)\n"
        "r = reshape(b, [4, 8])\nt = transpose(r)\np = permute(x, 1, 0, 2, 3)\nc = cont(p)\n"
        "v = view(x, [4, 2], [64], 16)\nz = add(c, v)\noutput y = add(t, x)\n",
        inline_graphs[3],
        inline_graphs[5],
    };
    const char alphabet[] = "xyzabw01234[](),:=# \n\t.-+e_$\x01\xff";
    uint64_t s = 0x9e3779b97f4a7c15u;
    int ok = 0;
    for (int iter = 0; iter < 4000; iter++) {
        const char *seed = seeds[iter % 3];
        size_t n = strlen(seed);
        char *buf = malloc(n + 8);
        memcpy(buf, seed, n);
        int edits = 1 + iter % 3;
        for (int e = 0; e < edits; e++) {
            s = s * 6364136223846793005u + 1442695040888963407u;
            uint64_t r = s >> 16;
            size_t pos = (size_t)(r % (n ? n : 1));
            char c = alphabet[(r >> 20) % (sizeof alphabet - 1)];
            switch ((r >> 40) % 3) {
            case 0: if (n) buf[pos] = c; break;
            case 1: memmove(buf + pos + 1, buf + pos, n - pos); buf[pos] = c; n++; break;
            case 2: if (n) { memmove(buf + pos, buf + pos + 1, n - pos - 1); n--; } break;
            }
        }
        kiln_ctx *ctx = kiln_ctx_new();
        kiln_status st = kiln_parse(ctx, buf, n, "test.kg");
        if (st) {
            ck_assert_msg(strncmp(kiln_status_msg(st), "test.kg:", 8) == 0, "unlocated: %s", kiln_status_msg(st));
            kiln_status_free(st);
        } else {
            ok++;
            char *p = print_ctx(ctx);
            free(roundtrip(p, "mutant"));
            free(p);
        }
        kiln_ctx_free(ctx);
        free(buf);
    }
    ck_assert_int_gt(ok, 100);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("format",
                        TS_CASE("format", 60),
                        TS_TESTS(examples_roundtrip, inline_roundtrip, canonical_text, print_c_api_graph,
                                 print_refuses_unspellable, duplicate_names_reported, text_and_record_builders,
                                 every_op_parses, signatures_match_table,
                                 families_match_table, keyword_arguments, parse_into_nonempty_ctx, parse_errors,
                                 builder_errors_located, load_file, hostile_input, fuzz_mutations));
    return ts_main(s);
}
