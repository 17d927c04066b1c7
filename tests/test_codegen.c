/* codegen: the Lua sandbox, the template engine, kernel generation and NVRTC (no GPU needed). */
#include "tests/support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

#include <nvrtc.h>

/* ---- hand-built IR ------------------------------------------------------------------------- */

static ir_instr I1(fe_op op, int a) { return (ir_instr){.op = op, .a = a, .type = KILN_F32}; }
static ir_instr I2(fe_op op, int a, int b) { return (ir_instr){.op = op, .a = a, .b = b, .type = KILN_F32}; }

/* A program of one node. */
static ir_prog *one(ir_ref dst, int nin, const ir_ref *in, int ninstr, const ir_instr *ins) {
    ir_prog *p = ts_prog_new(1);
    ts_ew_node(p, 0, dst, nin, in, ninstr, ins);
    return p;
}

static cg_lua *lua_new(void) {
    cg_lua *L;
    TS_OK(cg_lua_new(&L));
    return L;
}

/* Compiles src with kiln's options for sm_90a straight through NVRTC, to see its log: generated
 * code must compile without warnings (unused helpers, pointless comparisons, ...). */
/* Generates node 0 and compiles it for sm_90a and sm_80; checks common properties. */
static void gen_compile(ir_prog *p, cg_kernel *k) {
    ts_gen(p, k);
    ck_assert_msg(strstr(k->source, "#include") == NULL, "#include in source");
    ck_assert_ptr_nonnull(strstr(k->source, k->name));
    ts_kernel_compiles(k);
}

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
#define HAS(k, sub) ck_assert_msg(has((k)->source, sub), "missing \"%s\" in:\n%s", sub, (k)->source)
#define HASNT(k, sub) ck_assert_msg(!has((k)->source, sub), "unexpected \"%s\" in:\n%s", sub, (k)->source)

/* ---- the Lua sandbox and tpl --------------------------------------------------------------- */

static char *exec(cg_lua *L, const char *code) {
    char *r;
    TS_OK(cg_lua_exec(L, code, "test", &r));
    return r;
}

static void exec_eq(cg_lua *L, const char *code, const char *want) {
    char *r = exec(L, code);
    ck_assert_str_eq(r, want);
    free(r);
}

/* Runs code expecting a Lua error whose message contains want. */
static void exec_err(cg_lua *L, const char *code, const char *want) {
    char *r = NULL;
    kiln_status st = cg_lua_exec(L, code, "test", &r);
    ck_assert_msg(st != NULL, "no error from %s (got %s)", code, r ? r : "");
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_CODEGEN);
    ck_assert_msg(has(kiln_status_msg(st), want), "message \"%s\" lacks \"%s\"", kiln_status_msg(st), want);
    kiln_status_free(st);
}

START_TEST(sandbox) {
    cg_lua *L = lua_new();
    exec_eq(L,
            "return tostring(io) .. tostring(os) .. tostring(package) .. tostring(debug) .."
            " tostring(dofile) .. tostring(loadfile) .. tostring(math.random) .. tostring(math.randomseed)",
            "nilnilnilnilnilnilnilnil");
    exec_eq(L, "return type(string.format) .. type(table.concat) .. type(math.floor) .. type(utf8.char)",
            "functionfunctionfunctionfunction");
    /* load: text only */
    exec_eq(L, "return (load(string.dump(function() return 1 end)))", "nil");
    exec_eq(L, "return load('return 41 + 1')()", "42");
    exec_eq(L, "return load('return x', 'c', 'b', {x = 7})()", "7");
    /* require */
    exec_eq(L, "return require('tpl') == require('tpl')", "true");
    exec_err(L, "return require('../etc/passwd')", "bad module name");
    exec_err(L, "return require('no_such_template')", "not found");
    /* a runaway loop stops */
    exec_err(L, "while true do end", "budget");
    /* the state still works after errors */
    exec_eq(L, "return 1 + 1", "2");
    /* memory cap */
    exec_err(L, "local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 1000) .. i end", "memory");
    exec_eq(L, "collectgarbage() return 'ok'", "ok");
    cg_lua_free(L);
}
END_TEST

START_TEST(tpl_engine) {
    cg_lua *L = lua_new();
    exec_eq(L, "return require('tpl').render('a ${x} b\\n@ for i = 1, 3 do\\n  ${i},\\n@ end\\nend\\n', {x = 'X'})",
            "a X b\n  1,\n  2,\n  3,\nend\n");
    /* no trailing newline in, none out; empty text */
    exec_eq(L, "return require('tpl').render('x${y}', {y = 5}) .. '|' .. require('tpl').render('', {})", "x5|");
    /* globals as fallback, braces and strings inside ${} */
    exec_eq(L, "return require('tpl').render('${string.upper(s)} ${({a = \"}\"}).a} ${\"{\"}', {s = 'q'})",
            "Q } {");
    /* @ lines may be indented; assignments stay in the render */
    exec_eq(L, "local t = require('tpl') local r = t.render('  @ v = 3\\n${v}\\n', {}) return r .. tostring(v)",
            "3\nnil");
    /* errors name the template and its line */
    exec_err(L, "return require('tpl').render('one\\ntwo ${nope}\\n', {}, 'my.tpl:10')", "my.tpl:11:");
    exec_err(L, "return require('tpl').render('one\\ntwo ${nope}\\n', {})", "template:2:");
    exec_err(L, "return require('tpl').render('${1 / 2}', {})", "float");
    exec_err(L, "return require('tpl').render('${{}}', {})", "not a string or integer");
    exec_err(L, "return require('tpl').render('a\\n@ for\\n', {}, 'bad.tpl')", "bad.tpl:");
    exec_err(L, "return require('tpl').render('${x', {}, 'open.tpl')", "open.tpl:1: unterminated");
    /* define: lines are the file's lines */
    exec_err(L,
             "local tpl = require('tpl')\n"
             "local t = tpl.define [[\n"
             "first\n"
             "second ${missing.field}\n"
             "]]\n"
             "return t({})\n",
             "test:4:");
    exec_err(L, "local tpl = require('tpl')\nlocal t = tpl.define [[\n@ if then\n]]\n", "test:3:");
    exec_eq(L, "local tpl = require('tpl') return table.concat(tpl.sorted_keys({b = 1, a = 2, c = 3}), ',')",
            "a,b,c");
    cg_lua_free(L);
}
END_TEST

/* ---- generation ---------------------------------------------------------------------------- */

/* x * w (w broadcast over rows), silu: the usual fused node. */
static void mul_silu_node(ir_prog *p, int i, int out, int x, int w) {
    ir_ref in[2] = {ts_ref4(x, KILN_F32, 4096, 8, 1, 1), ts_ref4(w, KILN_F16, 4096, 1, 1, 1)};
    ir_instr ins[2] = {I2(FE_OP_MUL, 0, 1), I1(FE_OP_SILU, 2)};
    ts_ew_node(p, i, ts_ref4(out, KILN_F32, 4096, 8, 1, 1), 2, in, 2, ins);
}

START_TEST(determinism) {
    ir_prog *p = ts_prog_new(2);
    mul_silu_node(p, 0, 0, 1, 2);
    mul_silu_node(p, 1, 3, 4, 5);
    snprintf(p->bufs[4].name, sizeof p->bufs[4].name, "SECRETNAME_other_layer");

    cg_lua *L1 = lua_new(), *L2 = lua_new();
    cg_kernel ks[4];
    cg_kernel *a = &ks[0], *b = &ks[1], *c = &ks[2], *d = &ks[3];
    TS_OK(cg_generate(L1, p, 0, a));
    TS_OK(cg_generate(L1, p, 0, b)); /* same state again */
    TS_OK(cg_generate(L2, p, 0, c)); /* another state */
    TS_OK(cg_generate(L2, p, 1, d)); /* same node over other buffers */
    ck_assert_str_eq(a->name, "ew_mul_silu");
    for (cg_kernel *k = b; k <= d; k++) {
        ck_assert_str_eq(a->name, k->name);
        ck_assert_str_eq(a->source, k->source);
        ck_assert_mem_eq(a->grid, k->grid, sizeof a->grid);
        ck_assert_mem_eq(a->block, k->block, sizeof a->block);
    }
    ck_assert_int_eq(a->node, 0);
    ck_assert_int_eq(d->node, 1);
    ck_assert_int_eq(a->nparams, 3);
    ck_assert_int_eq(a->params[0], 0);
    ck_assert_int_eq(a->params[1], 1);
    ck_assert_int_eq(a->params[2], 2);
    ck_assert_int_eq(d->params[0], 3);
    ck_assert_int_eq(d->params[1], 4);
    ck_assert_int_eq(d->params[2], 5);
    ck_assert_uint_eq(a->grid[0], 4096 * 8 / 256);
    ck_assert_uint_eq(a->grid[1], 1);
    ck_assert_uint_eq(a->block[0], 256);
    ck_assert_uint_eq(a->smem, 0);
    HASNT(a, "SECRETNAME");
    HAS(a, "extern \"C\" __global__ void __launch_bounds__(256)");
    HAS(a, "ew_mul_silu(char *__restrict__ p0, const char *__restrict__ p1, const char *__restrict__ p2)");
    HAS(a, "kiln_f16_to_f32(in1[i0])"); /* broadcast row: coordinate 0 only */
    HAS(a, "in0[i]");                   /* same shape, contiguous: linear index */
    HAS(a, "out[i] = r3;");
    HASNT(a, "bf16");
    HASNT(a, "long long");
    for (cg_kernel *k = a; k <= d; k++) cg_kernel_clear(k);
    ck_assert_ptr_null(a->source);
    cg_lua_free(L1);
    cg_lua_free(L2);
    ts_prog_free(p);
}
END_TEST

START_TEST(params) {
    /* the same buffer read twice (x*x through two layouts) is one parameter */
    int64_t ne[4] = {64, 64, 1, 1}, st[4] = {64, 1, 4096, 4096};
    ir_ref in[2] = {ts_ref4(7, KILN_F32, 64, 64, 1, 1), ts_strided(7, KILN_F32, ne, st, 0)};
    ir_instr ins[1] = {I2(FE_OP_ADD, 0, 1)};
    ir_prog *p = one(ts_ref4(3, KILN_F32, 64, 64, 1, 1), 2, in, 1, ins);
    cg_kernel k;
    gen_compile(p, &k);
    ck_assert_int_eq(k.nparams, 2);
    ck_assert_int_eq(k.params[0], 3);
    ck_assert_int_eq(k.params[1], 7);
    HAS(&k, "(const float *)p1;");
    HASNT(&k, "p2");
    HAS(&k, "in1[i0 * 64u + i1]"); /* transposed */
    cg_kernel_clear(&k);
    ts_prog_free(p);

    /* in place: dst's buffer is also an input */
    ir_ref in2[1] = {ts_ref4(2, KILN_BF16, 100, 1, 1, 1)};
    ir_instr ins2[1] = {I1(FE_OP_NEG, 0)};
    p = one(ts_ref4(2, KILN_BF16, 100, 1, 1, 1), 1, in2, 1, ins2);
    gen_compile(p, &k);
    ck_assert_int_eq(k.nparams, 1);
    ck_assert_int_eq(k.params[0], 2);
    HAS(&k, "(char *__restrict__ p0)");
    HAS(&k, "(const unsigned short *)p0");
    ck_assert_uint_eq(k.grid[0], 1);
    cg_kernel_clear(&k);
    ts_prog_free(p);
}
END_TEST

/* Each op alone, with f32 in and out; checks its expression. */
START_TEST(each_op) {
    static const struct {
        fe_op       op;
        const char *expr;
    } cases[] = {
        {FE_OP_CONT, "const float r1 = r0;"},
        {FE_OP_ADD, "r0 + r1"},
        {FE_OP_SUB, "r0 - r1"},
        {FE_OP_MUL, "r0 * r1"},
        {FE_OP_DIV, "r0 / r1"},
        {FE_OP_SCALE, "r0 * 0.5f + (-2.0f)"},
        {FE_OP_NEG, "-r0"},
        {FE_OP_EXP, "expf(r0)"},
        {FE_OP_SQR, "r0 * r0"},
        {FE_OP_SQRT, "sqrtf(r0)"},
        {FE_OP_SILU, "r0 / (1.0f + expf(-r0))"},
        {FE_OP_GELU, "0.5f * r0 * (1.0f + tanhf(0.7978845608f * r0 * (1.0f + 0.044715f * r0 * r0)))"},
        {FE_OP_RELU, "r0 > 0.0f ? r0 : 0.0f"},
        {FE_OP_TANH, "tanhf(r0)"},
        {FE_OP_SIGMOID, "1.0f / (1.0f + expf(-r0))"},
        {FE_OP_ABS, "fabsf(r0)"},
        {FE_OP_SGN, "r0 > 0.0f ? 1.0f : (r0 < 0.0f ? -1.0f : 0.0f)"},
        {FE_OP_STEP, "r0 > 0.0f ? 1.0f : 0.0f"},
        {FE_OP_ELU, "r0 > 0.0f ? r0 : expm1f(r0)"},
        {FE_OP_LEAKY_RELU, "(r0 > 0.0f ? r0 : 0.0f) + 0.5f * (r0 < 0.0f ? r0 : 0.0f)"},
        {FE_OP_GELU_ERF, "0.5f * r0 * (1.0f + erff(r0 * 0.70710678f))"},
        {FE_OP_GELU_QUICK, "r0 * (1.0f / (1.0f + expf(-1.702f * r0)))"},
        {FE_OP_HARDSWISH, "r0 * fminf(1.0f, fmaxf(0.0f, (r0 + 3.0f) / 6.0f))"},
        {FE_OP_HARDSIGMOID, "fminf(1.0f, fmaxf(0.0f, (r0 + 3.0f) / 6.0f))"},
        {FE_OP_LOG, "logf(r0)"},
        {FE_OP_SIN, "sinf(r0)"},
        {FE_OP_COS, "cosf(r0)"},
        {FE_OP_SOFTPLUS, "r0 > 20.0f ? r0 : logf(1.0f + expf(r0))"},
        {FE_OP_CLAMP, "fmaxf(fminf(r0, -2.0f), 0.5f)"},
        {FE_OP_ADD1, "r0 + r1"},
        {FE_OP_REGLU, "r0 > 0.0f ? r0 * r1 : 0.0f"},
        {FE_OP_GEGLU, "(0.5f * r0 * (1.0f + tanhf(0.7978845608f * r0 * (1.0f + 0.044715f * r0 * r0)))) * r1"},
        {FE_OP_SWIGLU, "(r0 / (1.0f + expf(-r0))) * r1"},
        {FE_OP_GEGLU_ERF, "(0.5f * r0 * (1.0f + erff(r0 * 0.70710678f))) * r1"},
        {FE_OP_GEGLU_QUICK, "(r0 * (1.0f / (1.0f + expf(-1.702f * r0)))) * r1"},
        {FE_OP_SWIGLU_OAI, "(fminf(r0, -2.0f) / (1.0f + expf(0.5f * -fminf(r0, -2.0f)))) * (fminf(fmaxf(r1, -(-2.0f)), -2.0f) + 1.0f)"},
    };
    int seen = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fe_op op = cases[c].op;
        bool bin = fe_ops[op].nsrc == 2;
        ir_ref in[2] = {ts_ref4(1, KILN_F32, 33, 5, 1, 1), ts_ref4(2, KILN_F32, 33, 5, 1, 1)};
        ir_instr ins = bin ? I2(op, 0, 1) : I1(op, 0);
        ins.f[0] = 0.5f;
        ins.f[1] = -2.0f;
        ir_prog *p = one(ts_ref4(0, KILN_F32, 33, 5, 1, 1), bin ? 2 : 1, in, 1, &ins);
        cg_kernel k;
        gen_compile(p, &k);
        char want_name[32];
        snprintf(want_name, sizeof want_name, "ew_%s", fe_ops[op].name);
        ck_assert_str_eq(k.name, want_name);
        HAS(&k, cases[c].expr);
        HASNT(&k, "i0"); /* all linear */
        cg_kernel_clear(&k);
        ts_prog_free(p);
        seen++;
    }
    /* every elementwise op of FE_OPS is covered */
    int ew = 0;
    for (int op = 0; op < FE_OP_COUNT; op++)
        ew += fe_ops[op].kind == FE_UNARY || fe_ops[op].kind == FE_BINARY || fe_ops[op].kind == FE_GLU;
    ck_assert_int_eq(seen, ew);
}
END_TEST

START_TEST(float_literals) {
    static const struct {
        float       s, b;
        const char *want;
    } cases[] = {
        {0.5f, -2.0f, "r0 * 0.5f + (-2.0f)"},
        {3.0f, 0.0f, "r0 * 3.0f + 0.0f"},
        {0.1f, -0.0f, "r0 * 0.1f + (-0.0f)"}, {1.0f / 3, 0.0f, "r0 * 0.33333334f + 0.0f"},
        {1e-20f, 1e20f, "r0 * 1e-20f + 1e+20f"},
        {INFINITY, -INFINITY, "r0 * __int_as_float(0x7f800000) + __int_as_float(0xff800000)"},
        {NAN, 16777216.0f, "r0 * __int_as_float(0x7fc00000) + 16777216.0f"},
        {1.17549435e-38f, 1.40129846e-45f, "r0 * 1.1754944e-38f + 1e-45f"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ir_ref in = ts_ref4(1, KILN_F32, 8, 1, 1, 1);
        ir_instr ins = I1(FE_OP_SCALE, 0);
        ins.f[0] = cases[c].s;
        ins.f[1] = cases[c].b;
        ir_prog *p = one(ts_ref4(0, KILN_F32, 8, 1, 1, 1), 1, &in, 1, &ins);
        cg_kernel k;
        ts_gen(p, &k);
        HAS(&k, cases[c].want);
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
}
END_TEST

/* Types, broadcasting, strides, offsets, chains: generated and compiled for sm_90a and sm_80. */
START_TEST(spread_compiles) {
    const kiln_type T[3] = {KILN_F32, KILN_F16, KILN_BF16};
    /* every dst/input type pair through cont (conversion kernels) */
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            ir_ref in = ts_ref4(1, T[b], 17, 3, 2, 1);
            ir_instr ins = I1(FE_OP_CONT, 0);
            ir_prog *p = one(ts_ref4(0, T[a], 17, 3, 2, 1), 1, &in, 1, &ins);
            cg_kernel k;
            gen_compile(p, &k);
            if (T[a] == KILN_F16) HAS(&k, "kiln_f32_to_f16(r1)");
            if (T[a] == KILN_BF16) HAS(&k, "kiln_f32_to_bf16(r1)");
            if (T[b] == KILN_F16) HAS(&k, "kiln_f16_to_f32(in0[i])");
            if (T[b] == KILN_BF16) HAS(&k, "kiln_bf16_to_f32(in0[i])");
            if (T[a] != KILN_BF16 && T[b] != KILN_BF16) HASNT(&k, "bf16");
            if (T[a] != KILN_F16 && T[b] != KILN_F16) HASNT(&k, "_f16");
            cg_kernel_clear(&k);
            ts_prog_free(p);
        }

    /* broadcasting in every dim: ne 1 and proper divisors, mixed types, scalar */
    {
        ir_ref in[5] = {
            ts_ref4(1, KILN_F32, 6, 10, 4, 3),
            ts_ref4(2, KILN_F16, 6, 1, 1, 1),
            ts_ref4(3, KILN_BF16, 1, 10, 1, 3),
            ts_ref4(4, KILN_F32, 3, 5, 2, 1),
            ts_ref4(5, KILN_F16, 1, 1, 1, 1),
        };
        ir_instr ins[4] = {I2(FE_OP_ADD, 0, 1), I2(FE_OP_MUL, 5, 2), I2(FE_OP_SUB, 6, 3), I2(FE_OP_DIV, 7, 4)};
        ir_prog *p = one(ts_ref4(0, KILN_F16, 6, 10, 4, 3), 5, in, 4, ins);
        cg_kernel k;
        gen_compile(p, &k);
        ck_assert_str_eq(k.name, "ew_add_mul_sub_div");
        HAS(&k, "in0[i]");
        HAS(&k, "in1[i0]");
        HAS(&k, "in2[i1 + i3 * 10u]");
        HAS(&k, "in3[(i0 % 3u) + (i1 % 5u) * 3u + (i2 % 2u) * 15u]");
        HAS(&k, "in4[0]");
        HAS(&k, "const unsigned i3 = i / 240u;");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }

    /* strided, permuted, offset operands, strided dst, zero strides */
    {
        int64_t ne[4] = {8, 16, 4, 2};
        int64_t perm_st[4] = {64, 1, 16, 512}; /* dims 0 and 1 swapped */
        int64_t gap_st[4] = {1, 10, 200, 1000}; /* padded rows */
        int64_t zero_st[4] = {1, 0, 8, 32};     /* a zero stride: broadcast by layout */
        ir_ref in[3] = {ts_strided(1, KILN_F32, ne, perm_st, 5), ts_strided(2, KILN_BF16, ne, gap_st, 100),
                        ts_strided(3, KILN_F16, ne, zero_st, 0)};
        ir_instr ins[3] = {I2(FE_OP_MUL, 0, 1), I2(FE_OP_ADD, 3, 2), I1(FE_OP_RELU, 4)};
        ir_ref dst = ts_strided(0, KILN_F32, ne, gap_st, 7);
        ir_prog *p = one(dst, 3, in, 3, ins);
        cg_kernel k;
        gen_compile(p, &k);
        HAS(&k, "(const float *)p1 + 5;");
        HAS(&k, "(const unsigned short *)p2 + 100;");
        HAS(&k, "(float *)p0 + 7;");
        HAS(&k, "in0[i0 * 64u + i1 + i2 * 16u + i3 * 512u]");
        HAS(&k, "in2[i0 + i2 * 8u + i3 * 32u]");
        HAS(&k, "out[i0 + i1 * 10u + i2 * 200u + i3 * 1000u]");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }

    /* a long fused chain over every op, with intermediate roundings */
    {
        ir_ref in[2] = {ts_ref4(1, KILN_BF16, 300, 7, 1, 1), ts_ref4(2, KILN_F32, 300, 1, 1, 1)};
        ir_instr ins[IR_MAX_INSTR];
        int n = 0, r = 2;
        for (int rep = 0; rep < 4; rep++)
            for (int op = 0; op < FE_OP_COUNT; op++) {
                if (fe_ops[op].kind != FE_UNARY && fe_ops[op].kind != FE_BINARY) continue;
                if (n == IR_MAX_INSTR) break;
                ins[n] = fe_ops[op].kind == FE_BINARY ? I2((fe_op)op, r - 1, rep % 2) : I1((fe_op)op, r - 1);
                ins[n].f[0] = 1.5f;
                ins[n].f[1] = 0.25f;
                ins[n].type = T[n % 3];
                n++, r++;
            }
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 300, 7, 1, 1), 2, in, n, ins);
        cg_kernel k;
        gen_compile(p, &k);
        ck_assert_int_lt(strlen(k.name), 64);
        ck_assert_msg(strncmp(k.name, "ew_cont_add_sub_mul_div_add1_scale", 34) == 0, "%s", k.name);
        char suffix[16];
        snprintf(suffix, sizeof suffix, "_n%d", n);
        ck_assert_msg(has(k.name, suffix), "%s", k.name);
        HAS(&k, "kiln_round_f16(");
        HAS(&k, "kiln_round_bf16(");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }

    /* last result's type == dst's type: no extra rounding; different: rounded then converted */
    {
        ir_ref in = ts_ref4(1, KILN_F32, 10, 1, 1, 1);
        ir_instr ins[2] = {I1(FE_OP_EXP, 0), I1(FE_OP_SQRT, 1)};
        ins[0].type = KILN_F16;
        ins[1].type = KILN_F16;
        ir_prog *p = one(ts_ref4(0, KILN_F16, 10, 1, 1, 1), 1, &in, 2, ins);
        cg_kernel k;
        gen_compile(p, &k);
        HAS(&k, "const float r1 = kiln_round_f16(expf(r0));");
        HAS(&k, "const float r2 = sqrtf(r1);");
        HAS(&k, "out[i] = kiln_f32_to_f16(r2);");
        cg_kernel_clear(&k);
        p->nodes[0].ins[1].type = KILN_BF16;
        gen_compile(p, &k);
        HAS(&k, "const float r2 = kiln_round_bf16(sqrtf(r1));");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
}
END_TEST

START_TEST(wide_indices) {
    /* > 2^31 elements: 64-bit indexing (generated and compiled only) */
    {
        ir_ref in[2] = {ts_ref4(1, KILN_F16, 65536, 32768, 1, 1), ts_ref4(2, KILN_F32, 65536, 1, 1, 1)};
        ir_instr ins[1] = {I2(FE_OP_MUL, 0, 1)};
        ir_prog *p = one(ts_ref4(0, KILN_F16, 65536, 32768, 1, 1), 2, in, 1, ins);
        cg_kernel k;
        gen_compile(p, &k);
        HAS(&k, "const long long i = blockIdx.x * 256ll + threadIdx.x;");
        HAS(&k, "if (i >= 2147483648ll)");
        HAS(&k, "in1[i0]");
        ck_assert_uint_eq(k.grid[0], 2147483648u / 256);
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* few elements but a large offset */
    {
        ir_ref in = ts_ref4(1, KILN_F32, 1000, 1, 1, 1);
        in.offs = 3000000000ll;
        ir_instr ins = I1(FE_OP_SQR, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 1000, 1, 1, 1), 1, &in, 1, &ins);
        cg_kernel k;
        gen_compile(p, &k);
        HAS(&k, "long long");
        HAS(&k, "(const float *)p1 + 3000000000ll;");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* a large stride */
    {
        int64_t ne[4] = {2, 3, 1, 1}, st[4] = {1, 1500000000, 1, 1};
        ir_ref in = ts_strided(1, KILN_F32, ne, st, 0);
        ir_instr ins = I1(FE_OP_SQR, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 2, 3, 1, 1), 1, &in, 1, &ins);
        cg_kernel k;
        gen_compile(p, &k);
        HAS(&k, "in0[i0 + i1 * 1500000000ll]");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* more blocks than a grid holds: a grid-stride loop */
    {
        ir_ref in = ts_ref4(1, KILN_F32, 1 << 20, 1 << 20, 1, 1);
        ir_instr ins = I1(FE_OP_TANH, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 1 << 20, 1 << 20, 1, 1), 1, &in, 1, &ins);
        cg_kernel k;
        gen_compile(p, &k);
        HAS(&k, "for (long long i = blockIdx.x * 256ll + threadIdx.x; i < 1099511627776ll; i += gridDim.x * 256ll) {");
        ck_assert_uint_eq(k.grid[0], 1048576);
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* 2^31-1 elements still fit 32 bits */
    {
        ir_ref in = ts_ref4(1, KILN_F32, 2147483647, 1, 1, 1);
        ir_instr ins = I1(FE_OP_NEG, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 2147483647, 1, 1, 1), 1, &in, 1, &ins);
        cg_kernel k;
        ts_gen(p, &k);
        HASNT(&k, "long long");
        HAS(&k, "const unsigned i = blockIdx.x * 256u + threadIdx.x;");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* an empty index space */
    {
        ir_ref in = ts_ref4(1, KILN_F16, 0, 4, 1, 1);
        ir_instr ins = I1(FE_OP_NEG, 0);
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 0, 4, 1, 1), 1, &in, 1, &ins);
        cg_kernel k;
        gen_compile(p, &k);
        ck_assert_uint_eq(k.grid[0], 1);
        HAS(&k, "empty index space");
        HASNT(&k, "kiln_");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
}
END_TEST

/* Malformed nodes give errors, never bad code. */
START_TEST(invalid_nodes) {
    cg_lua *L = lua_new();
    cg_kernel k;
    ir_ref in = ts_ref4(1, KILN_F32, 8, 1, 1, 1);
    ir_instr ins = I1(FE_OP_NEG, 0);
    ir_prog *p = one(ts_ref4(0, KILN_F32, 8, 1, 1, 1), 1, &in, 1, &ins);
    ir_node *n = &p->nodes[0];
    kiln_status st;

#define EXPECT(code, sub)                                                                         \
    do {                                                                                          \
        st = cg_generate(L, p, 0, &k);                                                            \
        ck_assert_msg(st != NULL, "no error");                                                    \
        ck_assert_int_eq(kiln_status_code(st), code);                                             \
        ck_assert_msg(has(kiln_status_msg(st), sub), "\"%s\" lacks \"%s\"", kiln_status_msg(st), sub); \
        ck_assert_ptr_null(k.source);                                                             \
        kiln_status_free(st);                                                                     \
    } while (0)

    st = cg_generate(L, p, 1, &k);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);
    n->dead = true;
    EXPECT(KILN_ERR_INVALID, "dead");
    n->dead = false;
    n->ninstr = 0;
    EXPECT(KILN_ERR_INVALID, "instructions");
    n->ninstr = 1;
    n->ins[0].op = FE_OP_PERMUTE;
    EXPECT(KILN_ERR_INVALID, "not elementwise");
    n->ins[0].op = FE_OP_NEG;
    n->ins[0].a = 1; /* its own register */
    EXPECT(KILN_ERR_CODEGEN, "not an earlier register");
    n->ins[0].a = 0;
    n->in[0].buf = 99;
    EXPECT(KILN_ERR_INVALID, "out of range");
    n->in[0].buf = 1;
    n->in[0].type = KILN_I32;
    EXPECT(KILN_ERR_CODEGEN, "unsupported type i32");
    n->in[0].type = KILN_F32;
    n->in[0].ne[0] = 3; /* does not divide 8 */
    EXPECT(KILN_ERR_CODEGEN, "does not divide");
    n->in[0].ne[0] = 8;
    TS_OK(cg_generate(L, p, 0, &k));
    cg_kernel_clear(&k);
#undef EXPECT
    ts_prog_free(p);
    cg_lua_free(L);
}
END_TEST

/* ---- KILN_TEMPLATE_DIR --------------------------------------------------------------------- */

static const cg_template_file *embedded(const char *name) {
    for (int i = 0; i < cg_ntemplates; i++)
        if (strcmp(cg_templates[i].name, name) == 0) return &cg_templates[i];
    ck_abort_msg("no embedded template %s", name);
    return NULL;
}

/* Every op family but NONE names an embedded template (FE_FAMS: the name is the module codegen
 * requires for the family's nodes). */
START_TEST(families_have_templates) {
    for (int f = 0; f < FE_FAM_COUNT; f++) {
        if (f == FE_FAM_NONE) continue;
        ck_assert_msg(fe_fams[f].name[0], "family %d has no name", f);
        ck_assert_ptr_nonnull(embedded(fe_fams[f].name)); /* aborts naming it when missing */
    }
}
END_TEST

/* Writes text as dir/name.lua. */
static void write_tpl(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.lua", dir, name);
    TS_OK(kb_write_file(path, text, strlen(text)));
}

/* text with the first occurrence of from replaced by to (caller frees); *line gets its line. */
static char *replace(const char *text, const char *from, const char *to, int *line) {
    const char *at = strstr(text, from);
    ck_assert_msg(at != NULL, "\"%s\" not in template", from);
    if (line) {
        *line = 1;
        for (const char *s = text; s < at; s++) *line += *s == '\n';
    }
    kb_str b = {0};
    kb_str_addn(&b, text, (size_t)(at - text));
    kb_str_add(&b, to);
    kb_str_add(&b, at + strlen(from));
    return kb_str_take(&b);
}

/* Generates the mul+silu node with templates from dir; returns the status (k filled on success). */
static kiln_status gen_with_dir(const char *dir, cg_kernel *k) {
    setenv("KILN_TEMPLATE_DIR", dir, 1);
    cg_lua *L;
    kiln_status st = cg_lua_new(&L);
    unsetenv("KILN_TEMPLATE_DIR");
    if (st) return st;
    ir_prog *p = ts_prog_new(1);
    mul_silu_node(p, 0, 0, 1, 2);
    st = cg_generate(L, p, 0, k);
    ts_prog_free(p);
    cg_lua_free(L);
    return st;
}

static void expect_codegen_error(const char *dir, const char *sub1, const char *sub2) {
    cg_kernel k;
    kiln_status st = gen_with_dir(dir, &k);
    ck_assert_msg(st != NULL, "no error");
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_CODEGEN);
    ck_assert_msg(has(kiln_status_msg(st), sub1), "\"%s\" lacks \"%s\"", kiln_status_msg(st), sub1);
    if (sub2) ck_assert_msg(has(kiln_status_msg(st), sub2), "\"%s\" lacks \"%s\"", kiln_status_msg(st), sub2);
    kiln_status_free(st);
}

START_TEST(template_dir) {
    char *dir = ts_tmpdir();
    for (int i = 0; i < cg_ntemplates; i++) write_tpl(dir, cg_templates[i].name, cg_templates[i].text);
    const char *ew = embedded("elementwise")->text;

    /* unchanged copies: the same kernel */
    cg_kernel base, k;
    ir_prog *p = ts_prog_new(1);
    mul_silu_node(p, 0, 0, 1, 2);
    ts_gen(p, &base);
    ts_prog_free(p);
    TS_OK(gen_with_dir(dir, &k));
    ck_assert_str_eq(k.source, base.source);
    cg_kernel_clear(&k);

    /* a marker added to the template shows up; the embedded one is unaffected afterwards */
    char *marked = replace(ew, "extern \"C\"", "// KILN_TEST_MARKER\nextern \"C\"", NULL);
    write_tpl(dir, "elementwise", marked);
    TS_OK(gen_with_dir(dir, &k));
    HAS(&k, "// KILN_TEST_MARKER\nextern \"C\"");
    cg_kernel_clear(&k);
    p = ts_prog_new(1);
    mul_silu_node(p, 0, 0, 1, 2);
    ts_gen(p, &k);
    ck_assert_str_eq(k.source, base.source);
    cg_kernel_clear(&k);
    ts_prog_free(p);

    /* modules missing from the directory come from the embedded set */
    char *only = ts_tmpdir();
    write_tpl(only, "elementwise", marked);
    TS_OK(gen_with_dir(only, &k));
    HAS(&k, "KILN_TEST_MARKER");
    cg_kernel_clear(&k);
    ts_tmpdir_free(only);
    free(marked);

    /* a directory that does not exist is an error */
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    kiln_status st = gen_with_dir(missing, &k);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_IO);
    ck_assert(has(kiln_status_msg(st), "KILN_TEMPLATE_DIR"));
    kiln_status_free(st);

    cg_kernel_clear(&base);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(template_errors) {
    char *dir = ts_tmpdir();
    const char *ew = embedded("elementwise")->text;
    char want[64];
    int line;

    /* Lua syntax error */
    write_tpl(dir, "elementwise", "local tpl = require('tpl')\nlocal x = = 1\n");
    expect_codegen_error(dir, "elementwise.lua:2:", NULL);
    /* runtime error */
    write_tpl(dir, "elementwise", "return function(k)\n  local t\n  return t.x\nend\n");
    expect_codegen_error(dir, "elementwise.lua:3:", "attempt to index");
    /* an error inside the template text: the file's line */
    char *bad = replace(ew, "// kiln elementwise kernel ${name}", "// kiln elementwise kernel ${name.x.y}", &line);
    write_tpl(dir, "elementwise", bad);
    free(bad);
    snprintf(want, sizeof want, "elementwise.lua:%d:", line);
    expect_codegen_error(dir, want, "attempt to index");
    /* a syntax error in a template's @ line */
    bad = replace(ew, "@ for _, l in ipairs(notes) do", "@ for _, l in ipairs(notes) od", &line);
    write_tpl(dir, "elementwise", bad);
    free(bad);
    snprintf(want, sizeof want, "elementwise.lua:%d:", line);
    expect_codegen_error(dir, want, NULL);
    /* a nil in ${} */
    bad = replace(ew, "${name}(${params})", "${name}(${paramz})", &line);
    write_tpl(dir, "elementwise", bad);
    free(bad);
    snprintf(want, sizeof want, "elementwise.lua:%d:", line);
    expect_codegen_error(dir, want, "${paramz} is nil");
    /* an error in another module names that module */
    write_tpl(dir, "elementwise", ew);
    write_tpl(dir, "ops", "local M = {}\nM.mul = {arity = 2, expr = function(a, b) error('no mul here') end}\nreturn M\n");
    expect_codegen_error(dir, "ops.lua:2:", "no mul here");
    write_tpl(dir, "ops", embedded("ops")->text);

    /* bad results */
    static const struct {
        const char *ret, *msg;
    } results[] = {
        {"return 42", "not a function"},
        {"return function(k) return 'x' end", "not a table"},
        {"return function(k) return {name = '1bad', source = 's', grid = {1,1,1}, block = {1,1,1}} end",
         "not a C identifier"},
        {"return function(k) return {name = string.rep('a', 64), source = 's', grid = {1,1,1}, block = {1,1,1}} end",
         "not a C identifier"},
        {"return function(k) return {name = 'k', source = '', grid = {1,1,1}, block = {1,1,1}} end", "empty"},
        {"return function(k) return {name = 'k', source = 's', grid = {0,1,1}, block = {1,1,1}} end",
         "grid[1]"},
        {"return function(k) return {name = 'k', source = 's', grid = {1,1}, block = {1,1,1}} end", "3 entries"},
        {"return function(k) return {name = 'k', source = 's', grid = {1,1,1}, block = {64,32,1}} end",
         "1024 threads"},
        {"return function(k) return {name = 'k', source = 's', grid = {1,1,1}, block = {1.5,1,1}} end",
         "block[1]"},
        {"return function(k) return {name = 'k', source = 's', grid = {1,1,1}, block = {1,1,1}, smem = -1} end",
         "smem"},
        {"return function(k) while true do end end", "budget"},
        {"return function(k) return require('nonexistent') end", "not found"},
        {"return function(k) return io.open('x') end", "io"},
        {"return require('elementwise')", "cycle"},
    };
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++) {
        write_tpl(dir, "elementwise", results[i].ret);
        expect_codegen_error(dir, results[i].msg, NULL);
    }
    /* a minimal valid result is accepted as is */
    write_tpl(dir, "elementwise",
              "return function(k) return {name = 'k_' .. k.instrs[1].op, source = '//' .. k.dst.type,"
              " grid = {2,3,4}, block = {32,4,1}, smem = 128} end");
    cg_kernel k;
    TS_OK(gen_with_dir(dir, &k));
    ck_assert_str_eq(k.name, "k_mul");
    ck_assert_str_eq(k.source, "//f32");
    ck_assert_uint_eq(k.grid[2], 4);
    ck_assert_uint_eq(k.block[1], 4);
    ck_assert_uint_eq(k.smem, 128);
    cg_kernel_clear(&k);
    ts_tmpdir_free(dir);
}
END_TEST

/* Generates the mul+silu node's steps with templates from dir. */
static kiln_status steps_with_dir(const char *dir, cg_kernel **ks, int *n) {
    setenv("KILN_TEMPLATE_DIR", dir, 1);
    cg_lua *L;
    kiln_status st = cg_lua_new(&L);
    unsetenv("KILN_TEMPLATE_DIR");
    if (st) return st;
    ir_prog *p = ts_prog_new(1);
    mul_silu_node(p, 0, 0, 1, 2);
    st = cg_generate_steps(L, p, 0, ks, n);
    ts_prog_free(p);
    cg_lua_free(L);
    return st;
}

/* A result with several steps, scratch and a library GEMM (docs/templates.md, "Result"). The
 * node's buffers: p0 out f32 [4096, 8], p1 x f32 [4096, 8], p2 w f16 [4096]; p3 the scratch. */
#define GEMM_OK "{transa = true, m = 8, n = 8, k = 4096, a = {param = 1, ld = 4096, type = 'f32'}, " \
                "b = {param = 1, ld = 4096, type = 'f32'}, c = {param = 0, ld = 8, type = 'f32'}}"
START_TEST(template_steps) {
    char *dir = ts_tmpdir();
    write_tpl(dir, "elementwise",
              "return function(k) return {scratch = 131072, steps = {\n"
              "  {name = 'conv', source = '//conv ' .. k.nparams, grid = {2,1,1}, block = {32,1,1}},\n"
              "  {gemm = {transa = true, m = 8, n = 8, k = 4096, batch = 2,\n"
              "           a = {param = 3, offset = 0, ld = 4096, stride = 0, type = 'bf16'},\n"
              "           b = {param = 3, offset = 8192, ld = 4096, stride = 0, type = 'bf16'},\n"
              "           c = {param = 0, offset = 256, ld = 8, stride = 64, type = 'f32'}}}}} end\n");
    cg_kernel *ks = NULL;
    int n = 0;
    TS_OK(steps_with_dir(dir, &ks, &n));
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ks[0].kind, CG_LAUNCH);
    ck_assert_str_eq(ks[0].source, "//conv 3");
    ck_assert_int_eq(ks[0].nparams, 4);
    ck_assert_int_eq(ks[0].params[3], CG_PARAM_SCRATCH);
    ck_assert_int_eq(ks[1].kind, CG_GEMM);
    ck_assert_int_eq(ks[1].step, 1);
    ck_assert_int_eq(ks[1].nsteps, 2);
    ck_assert_uint_eq(ks[1].scratch, 131072);
    ck_assert(ks[1].gemm.ta && !ks[1].gemm.tb);
    ck_assert_int_eq(ks[1].gemm.batch, 2);
    ck_assert_int_eq(ks[1].gemm.a.type, KILN_BF16);
    ck_assert_int_eq(ks[1].gemm.b.offset, 8192);
    ck_assert_int_eq(ks[1].gemm.c.stride, 64);
    ck_assert_str_eq(ks[1].name, "gemm_bf16_tn");
    ck_assert(has(ks[1].source, "cublasGemmStridedBatchedEx"));
    for (int i = 0; i < n; i++) cg_kernel_clear(&ks[i]);
    free(ks);

    /* cg_generate refuses a node of several steps rather than dropping some */
    cg_kernel k;
    kiln_status st = gen_with_dir(dir, &k);
    ck_assert_msg(st && has(kiln_status_msg(st), "2 steps"), "%s", kiln_status_msg(st));
    kiln_status_free(st);

    static const struct {
        const char *ret, *msg;
    } bad[] = {
        {"return function(k) return {steps = {}} end", "1 to 64 steps"},
        {"return function(k) return {steps = {42}} end", "steps[1] is not a table"},
        {"return function(k) return {steps = 'x'} end", "not a table"},
        {"return function(k) return {scratch = -1, steps = {{gemm = " GEMM_OK "}}} end", "scratch"},
        /* the scratch parameter exists only when there is scratch */
        {"return function(k) local g = " GEMM_OK "; g.a.param = 3; return {steps = {{gemm = g}}} end", "param"},
        {"return function(k) local g = " GEMM_OK "; g.c.offset = 131072; return {steps = {{gemm = g}}} end",
         "reaches byte"},
        {"return function(k) local g = " GEMM_OK "; g.b.ld = 8; return {steps = {{gemm = g}}} end", "ld"},
        {"return function(k) local g = " GEMM_OK "; g.a.type = 'f16'; return {steps = {{gemm = g}}} end",
         "one type"},
        {"return function(k) local g = " GEMM_OK "; g.c.type = 'i32'; return {steps = {{gemm = g}}} end",
         "not f32, f16 or bf16"},
        {"return function(k) local g = " GEMM_OK "; g.m = nil; return {steps = {{gemm = g}}} end", "gemm.m"},
        {"return function(k) local g = " GEMM_OK "; g.batch = 2; g.c.stride = 32768; return {steps = {{gemm = g}}} end",
         "reaches byte"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_tpl(dir, "elementwise", bad[i].ret);
        st = steps_with_dir(dir, &ks, &n);
        ck_assert_msg(st != NULL, "case %zu: no error", i);
        ck_assert_msg(has(kiln_status_msg(st), bad[i].msg), "case %zu: \"%s\" lacks \"%s\"", i,
                      kiln_status_msg(st), bad[i].msg);
        kiln_status_free(st);
    }
    ts_tmpdir_free(dir);
}
END_TEST

/* The table given to templates, as documented in docs/templates.md. */
START_TEST(node_table) {
    char *dir = ts_tmpdir();
    write_tpl(dir, "elementwise",
              "local function ref(r)\n"
              "  return string.format('%s ne=%s st=%s offs=%d param=%d', r.type, table.concat(r.ne, ','),\n"
              "    table.concat(r.st, ','), r.offs, r.param)\n"
              "end\n"
              "return function(k)\n"
              "  local out = {k.kind, 'dst ' .. ref(k.dst)}\n"
              "  for i, r in ipairs(k.inputs) do out[#out + 1] = 'in ' .. ref(r) end\n"
              "  for i, s in ipairs(k.instrs) do\n"
              "    out[#out + 1] = string.format('%s a=%s b=%s f=%s,%s type=%s', s.op, s.a, s.b, s.f[1], s.f[2], s.type)\n"
              "  end\n"
              "  out[#out + 1] = 'nparams=' .. k.nparams\n"
              "  return {name = 'dump', source = table.concat(out, '\\n'), grid = {1,1,1}, block = {1,1,1}}\n"
              "end\n");
    setenv("KILN_TEMPLATE_DIR", dir, 1);
    cg_lua *L = lua_new();
    unsetenv("KILN_TEMPLATE_DIR");
    int64_t ne[4] = {4, 6, 1, 1}, st[4] = {6, 1, 24, 24};
    ir_ref in[3] = {ts_ref4(9, KILN_F16, 4, 6, 1, 1), ts_strided(4, KILN_BF16, ne, st, 12), ts_ref4(9, KILN_F32, 4, 1, 1, 1)};
    ir_instr ins[2] = {I2(FE_OP_ADD, 0, 1), I1(FE_OP_SCALE, 3)};
    ins[1].f[0] = 2.0f;
    ins[1].f[1] = -0.5f;
    ins[1].type = KILN_F16;
    ir_prog *p = one(ts_ref4(4, KILN_F32, 4, 6, 1, 1), 3, in, 2, ins);
    cg_kernel k;
    TS_OK(cg_generate(L, p, 0, &k));
    ck_assert_str_eq(k.source, "ew\n"
                               "dst f32 ne=4,6,1,1 st=1,4,24,24 offs=0 param=0\n"
                               "in f16 ne=4,6,1,1 st=1,4,24,24 offs=0 param=1\n"
                               "in bf16 ne=4,6,1,1 st=6,1,24,24 offs=12 param=0\n"
                               "in f32 ne=4,1,1,1 st=1,4,4,4 offs=0 param=1\n"
                               "add a=0 b=1 f=0.0f,0.0f type=f32\n"
                               "scale a=3 b=nil f=2.0f,-0.5f type=f16\n"
                               "nparams=2");
    cg_kernel_clear(&k);
    ts_prog_free(p);
    cg_lua_free(L);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- NVRTC --------------------------------------------------------------------------------- */

START_TEST(nvrtc_basics) {
    int major = 0, minor = -1;
    TS_OK(cg_nvrtc_version(&major, &minor));
    ck_assert_int_ge(major, 11);
    ck_assert_int_ge(minor, 0);

    const char *o1[CG_MAX_OPTS], *o2[CG_MAX_OPTS];
    int n = cg_nvrtc_options("sm_90a", o1);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(o1[0], "--gpu-architecture=sm_90a");
    ck_assert_str_eq(o1[1], "--std=c++17");
    ck_assert_str_eq(o1[2], "-default-device");
    ck_assert_int_eq(cg_nvrtc_options("sm_80", o2), 3);
    ck_assert_str_eq(o2[0], "--gpu-architecture=sm_80");
    ck_assert_int_eq(cg_nvrtc_options("sm_90a", o2), 3);
    ck_assert_ptr_eq(o1[0], o2[0]); /* stable */

    static const char *const bad[] = {"", "sm90", "sm_", "sm_90b", "compute_", "compute_9x", "SM_90", "sm_90a ",
                                      "sm_90aa", "sm_12345", "sm_-1", "--gpu-architecture=sm_90"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(cg_nvrtc_options(bad[i], o1), -1);
        void *cubin = (void *)1;
        size_t size = 1;
        kiln_status st = cg_nvrtc_compile("extern \"C\" __global__ void k() {}", "k", bad[i], &cubin, &size);
        ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
        ck_assert(has(kiln_status_msg(st), "architecture"));
        ck_assert_ptr_null(cubin);
        kiln_status_free(st);
    }
    ck_assert_int_eq(cg_nvrtc_options(NULL, o1), -1);

    /* a compile error carries the kernel name and NVRTC's log */
    void *cubin;
    size_t size;
    kiln_status st = cg_nvrtc_compile("extern \"C\" __global__ void broken_kernel(float *p) { p[0] = undefined_thing; }",
                                      "broken_kernel", "sm_80", &cubin, &size);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NVRTC);
    ck_assert_msg(has(kiln_status_msg(st), "broken_kernel") && has(kiln_status_msg(st), "undefined_thing"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);

    /* the same source gives the same cubin */
    const char *src = "extern \"C\" __global__ void same(float *p) { p[threadIdx.x] *= 2.0f; }";
    void *c1, *c2;
    size_t s1, s2;
    TS_OK(cg_nvrtc_compile(src, "same", "sm_90a", &c1, &s1));
    TS_OK(cg_nvrtc_compile(src, "same", "sm_90a", &c2, &s2));
    ck_assert_uint_eq(s1, s2);
    ck_assert_mem_eq(c1, c2, s1);
    free(c1);
    free(c2);
}
END_TEST

/* ---- through the real lowering ------------------------------------------------------------- */

/* Two identical layers built with the API give identical kernels. */
START_TEST(lowered_layers) {
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t ne[2] = {512, 4};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "SECRETNAME_x", 2, ne);
    kiln_tensor *h = x;
    for (int l = 0; l < 2; l++) {
        char name[64];
        snprintf(name, sizeof name, "SECRETNAME_w%d", l);
        kiln_tensor *w = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F16, name, 1, ne);
        h = kiln_silu(ctx, kiln_mul(ctx, h, w));
        snprintf(name, sizeof name, "SECRETNAME_h%d", l);
        kiln_set_name(ctx, h, name);
    }
    kiln_set_output(ctx, h, "SECRETNAME_y");
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_run_passes(p, false, NULL)); /* unfused: mul, silu, mul, silu */
    cg_lua *L = lua_new();
    cg_kernel ks[8];
    int nk = 0;
    for (int i = 0; i < p->nnodes && nk < 8; i++) {
        if (p->nodes[i].dead) continue;
        TS_OK(cg_generate(L, p, i, &ks[nk]));
        HASNT(&ks[nk], "SECRETNAME");
        nk++;
    }
    ck_assert_int_eq(nk, 4);
    for (int i = 0; i < 2; i++) {
        ck_assert_str_eq(ks[i].source, ks[i + 2].source);
        ck_assert_str_eq(ks[i].name, ks[i + 2].name);
    }
    ck_assert_str_eq(ks[0].name, "ew_mul");
    ck_assert_str_eq(ks[1].name, "ew_silu");
    void *cubin;
    size_t size;
    TS_OK(cg_nvrtc_compile(ks[0].source, ks[0].name, "sm_90a", &cubin, &size));
    free(cubin);
    for (int i = 0; i < nk; i++) cg_kernel_clear(&ks[i]);
    cg_lua_free(L);
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* Every generated kernel has the programmatic-dependent-launch prologue (the runtime launches
 * with it on sm_90+), once: the wait is the first statement of each __global__ function, so
 * nothing reads a predecessor's output early; only the decode attention kernel puts it after
 * its L2 prefetch of K and V, and reads nothing before it but the run-time dims (no indexing
 * but kdims[...], the shared-memory declaration and the prefetch's operand). The launch of the
 * next kernel follows the wait, but in the quantized GEMV (check_launch). Whole layers of
 * both example models (their attention is the prefill kernel), a decode attention and a
 * quantized GEMV. */
static void check_before_wait(const char *name, const char *from, const char *wait) {
    ck_assert_msg(strncmp(name, "fattn_dec_", 10) == 0, "kernel %s: no wait at the top", name);
    size_t n = (size_t)(wait - from);
    char  *pre = malloc(n + 1);
    memcpy(pre, from, n);
    pre[n] = 0;
    static const char *const allowed[] = {"kdims[", "kiln_smem[]", "[%0]"};
    for (int a = 0; a < 3; a++)
        for (char *q = strstr(pre, allowed[a]); q; q = strstr(q, allowed[a])) *strchr(q, '[') = '(';
    ck_assert_msg(!strchr(pre, '['), "kernel %s reads memory before the grid wait:\n%s", name, pre);
    ck_assert_msg(strstr(pre, "prefetch.global.L2"), "kernel %s: no prefetch before its grid wait", name);
    free(pre);
}

/* The launch of the next kernel, once per __global__ function between body and next (NULL: the
 * end), after the wait: right after it, or in the quantized GEMV (its launch mark, templates/
 * matmul.lua's QGEMV_PDL) after its last unit's products. */
static void check_launch(const char *name, const char *body, const char *next, const char *wait) {
    static const char launch[] = "griddepcontrol.launch_dependents;";
    const char       *l = strstr(body, launch);
    ck_assert_msg(l && (!next || l < next) && l > wait, "kernel %s: no launch_dependents after the wait", name);
    const char *again = strstr(l + 1, launch);
    ck_assert_msg(!again || (next && again > next), "kernel %s: two launch_dependents", name);
    if (strncmp(name, "mul_mat_qgemv_", 14) != 0) {
        ck_assert_msg(strncmp(strchr(wait, '\n') + 1, "    asm volatile(\"", 18) == 0 && strstr(wait, launch) == l &&
                          strchr(strchr(wait, '\n') + 1, '\n') > l, "kernel %s: the launch does not follow the wait", name);
        return;
    }
    const char *last = NULL;
    for (const char *q = strstr(body, "kiln_qwd_"); q && (!next || q < next); q = strstr(q + 1, "kiln_qwd_")) last = q;
    ck_assert_msg(last && l > last, "kernel %s: the launch comes before the last products", name);
}

START_TEST(grid_wait_prologue) {
    static const char *const files[] = {"examples/llama-layer.kg", "examples/qwen3moe-layer.kg",
                                        "bench/ops/flash_attn_dec_f16_512.kg", "bench/ops/mul_mat_gemv_q4_K_4096x14336.kg"};
    static const int         min_globals[] = {6, 6, 2, 1}, decs[] = {0, 0, 1, 0};
    static const char        pro[] = "{\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
                                     "    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n";
    int qgemv = 0;
    for (int f = 0; f < 4; f++) {
        char path[512], *text;
        snprintf(path, sizeof path, "%s/%s", ts_src_dir(), files[f]);
        text = ts_read_file(path, NULL);
        kiln_ctx     *ctx;
        kiln_graph   *g;
        char         *dir = ts_tmpdir();
        kiln_program *prog = ts_compile(text, "sm_90a", dir, 1, &ctx, &g);
        int           globals = 0, dec = 0;
        for (int i = 0; i < kiln_program_kernel_count(prog); i++) {
            const char *src = kiln_program_kernel_source(prog, i);
            for (const char *q = strstr(src, "__global__"); q; q = strstr(q + 1, "__global__")) {
                const char *body = strchr(q, '{'), *next = strstr(q + 1, "__global__");
                const char *wait = strstr(body, "griddepcontrol.wait;");
                ck_assert_msg(wait && (!next || wait < next), "%s kernel %s: no grid wait", files[f],
                              kiln_program_kernel_name(prog, i));
                const char *again = strstr(wait + 1, "griddepcontrol.wait;");
                ck_assert_msg(!again || (next && again > next), "%s kernel %s: two grid waits", files[f],
                              kiln_program_kernel_name(prog, i));
                if (strncmp(body, pro, strlen(pro)) != 0) {
                    check_before_wait(kiln_program_kernel_name(prog, i), body, wait);
                    dec++;
                }
                check_launch(kiln_program_kernel_name(prog, i), body, next, wait);
                qgemv += strncmp(kiln_program_kernel_name(prog, i), "mul_mat_qgemv_", 14) == 0;
                globals++;
            }
        }
        ck_assert_int_ge(globals, min_globals[f]);
        ck_assert_int_eq(dec, decs[f]);
        ts_compiled_free(prog, g, ctx);
        ts_tmpdir_free(dir);
        free(text);
    }
    ck_assert_int_ge(qgemv, 1);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("codegen",
                        TS_CASE("lua", 60), TS_TESTS(sandbox, tpl_engine),
                        TS_CASE("generate", 60),
                        TS_TESTS(determinism, grid_wait_prologue, float_literals, invalid_nodes, template_dir,
                                 families_have_templates, template_errors, template_steps, node_table),
                        TS_CASE("nvrtc", 600),
                        TS_TESTS(nvrtc_basics, params, each_op, spread_compiles, wide_indices, lowered_layers));
    return ts_main(s);
}
