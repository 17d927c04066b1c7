/* codegen: the vector and tile shapes of the elementwise template (templates/elementwise.lua):
 * which layouts take which path, the fallbacks (alignment, small and 64-bit index spaces), and
 * that every kernel compiles for sm_90a and sm_80 without NVRTC warnings. No GPU needed. */
#include "tests/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

#include <nvrtc.h>

/* ---- hand-built IR (tests/support.h) ------------------------------------------------------- */

/* The transpose of a contiguous [ne1, ne0] tensor, seen as [ne0, ne1]. */
static ir_ref transposed(int buf, kiln_type t, int64_t ne0, int64_t ne1) {
    int64_t ne[4] = {ne0, ne1, 1, 1}, st[4] = {ne1, 1, ne0 * ne1, ne0 * ne1};
    return ts_strided(buf, t, ne, st, 0);
}

static ir_instr I1(fe_op op, int a) { return (ir_instr){.op = op, .a = a, .type = KILN_F32}; }
static ir_instr I2(fe_op op, int a, int b) { return (ir_instr){.op = op, .a = a, .b = b, .type = KILN_F32}; }

static ir_prog *one(ir_ref dst, int nin, const ir_ref *in, int ninstr, const ir_instr *ins) {
    ir_prog *p = ts_prog_new(1);
    ts_ew_node(p, 0, dst, nin, in, ninstr, ins);
    /* results stored as dst's type, like the lowering does for a single op */
    for (int j = 0; j < ninstr; j++) p->nodes[0].ins[j].type = dst.type;
    return p;
}

/* Generates node 0 of p (twice, in two Lua states: the sources must be equal) and compiles it
 * for sm_90a and sm_80. */
static void gen_compile(ir_prog *p, cg_kernel *k) {
    cg_kernel again;
    ts_gen(p, k);
    ts_gen(p, &again);
    ck_assert_str_eq(k->source, again.source);
    ck_assert_mem_eq(k->grid, again.grid, sizeof k->grid);
    ck_assert_mem_eq(k->block, again.block, sizeof k->block);
    cg_kernel_clear(&again);
    ts_kernel_compiles(k);
}

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
#define HAS(k, sub) ck_assert_msg(has((k)->source, sub), "missing \"%s\" in:\n%s", sub, (k)->source)
#define HASNT(k, sub) ck_assert_msg(!has((k)->source, sub), "unexpected \"%s\" in:\n%s", sub, (k)->source)

#define PLAIN "const unsigned i = blockIdx.x * 256u + threadIdx.x;\n    if (i >= "

/* ---- the vector shape, flat ------------------------------------------------------------------ */

START_TEST(flat) {
    cg_kernel k;
    /* bf16 silu, an element count not a multiple of 8: 16-byte vectors and a scalar tail */
    {
        ir_ref in = ts_ref4(1, KILN_BF16, 4097, 33, 1, 1);
        ir_instr ins = I1(FE_OP_SILU, 0);
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 4097, 33, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        int64_t groups = (4097 * 33 + 7) / 8;
        ck_assert_uint_eq(k.grid[0], (groups + 255) / 256);
        ck_assert_uint_eq(k.block[0], 256);
        HAS(&k, "struct alignas(16) kiln_u16x8 {");
        HAS(&k, "const kiln_u16x8 v0 = *(const kiln_u16x8 *)(in0 + e);");
        HAS(&k, "const float r0 = kiln_bf16_to_f32(v0.v[k]);");
        HAS(&k, "o.v[k] = kiln_f32_to_bf16(r1);");
        HAS(&k, "*(kiln_u16x8 *)(out + e) = o;");
        HAS(&k, "for (unsigned t = e; t < 135201u; t++) {"); /* the tail */
        HAS(&k, "const float r0 = kiln_bf16_to_f32(in0[t]);");
        HAS(&k, "out[t] = kiln_f32_to_bf16(r1);");
        HASNT(&k, "i0"); /* no coordinates */
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* f32: 4 per thread, no tail */
    {
        ir_ref in[2] = {ts_ref4(1, KILN_F32, 1024, 256, 1, 1), ts_ref4(2, KILN_F32, 1024, 256, 1, 1)};
        ir_instr ins = I2(FE_OP_ADD, 0, 1);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 1024, 256, 1, 1), 2, in, 1, &ins);
        gen_compile(p, &k);
        ck_assert_uint_eq(k.grid[0], 1024 * 256 / 4 / 256);
        HAS(&k, "kiln_f32x4");
        HAS(&k, "if (i >= 65536u)");
        HASNT(&k, "for (unsigned t");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* mixed types: f16 out, f32 and bf16 in, a broadcast scalar: 8 per thread (32 bytes of f32) */
    {
        ir_ref in[3] = {ts_ref4(1, KILN_F32, 512, 512, 1, 1), ts_ref4(2, KILN_BF16, 512, 512, 1, 1),
                        ts_ref4(3, KILN_F16, 1, 1, 1, 1)};
        ir_instr ins[2] = {I2(FE_OP_MUL, 0, 1), I2(FE_OP_ADD, 3, 2)};
        ir_prog *p = one(ts_ref4(0, KILN_F16, 512, 512, 1, 1), 3, in, 2, ins);
        gen_compile(p, &k);
        HAS(&k, "struct alignas(16) kiln_f32x8 {");
        HAS(&k, "const kiln_f32x8 v0 = *(const kiln_f32x8 *)(in0 + e);");
        HAS(&k, "const kiln_u16x8 v1 = *(const kiln_u16x8 *)(in1 + e);");
        HAS(&k, "const float r2 = kiln_f16_to_f32(in2[0]);"); /* once per thread */
        HAS(&k, "const float r3 = kiln_round_f16(r0 * r1);");
        HAS(&k, "*(kiln_u16x8 *)(out + e) = o;");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* a misaligned input (offset 3 elements) is read element by element, dst still vectors */
    {
        ir_ref in = ts_ref4(1, KILN_BF16, 1024, 128, 1, 1);
        in.offs = 3;
        ir_instr ins = I1(FE_OP_NEG, 0);
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 1024, 128, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "const float r0 = kiln_bf16_to_f32(in0[e + k]);");
        HAS(&k, "*(kiln_u16x8 *)(out + e) = o;");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* dst at 4 elements (8 bytes) of bf16: 4 per thread; at an odd element: the plain kernel */
    {
        ir_ref in = ts_ref4(1, KILN_BF16, 1024, 128, 1, 1);
        ir_instr ins = I1(FE_OP_NEG, 0);
        ir_ref dst = ts_ref4(0, KILN_BF16, 1024, 128, 1, 1);
        dst.offs = 4;
        ir_prog *p = one(dst, 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "struct alignas(8) kiln_u16x4 {");
        HAS(&k, "(in0 + e);"); /* in0 is aligned for 8 bytes too */
        cg_kernel_clear(&k);
        p->nodes[0].dst.offs = 5;
        gen_compile(p, &k);
        HAS(&k, PLAIN "131072u)");
        HASNT(&k, "kiln_u16x");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
}
END_TEST

/* ---- the vector shape, rows ------------------------------------------------------------------ */

START_TEST(rows) {
    cg_kernel k;
    /* row, column and scalar broadcasts, a tiled row, in 4 dims */
    {
        ir_ref in[5] = {
            ts_ref4(1, KILN_BF16, 64, 16, 32, 8), ts_ref4(2, KILN_F32, 64, 1, 32, 1), ts_ref4(3, KILN_F16, 1, 16, 1, 8),
            ts_ref4(4, KILN_F32, 1, 1, 1, 1), ts_ref4(5, KILN_BF16, 32, 1, 1, 1),
        };
        ir_instr ins[4] = {I2(FE_OP_ADD, 0, 1), I2(FE_OP_MUL, 5, 2), I2(FE_OP_SUB, 6, 3), I2(FE_OP_DIV, 7, 4)};
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 64, 16, 32, 8), 5, in, 4, ins);
        gen_compile(p, &k);
        ck_assert_uint_eq(k.grid[0], 64 * 16 * 32 * 8 / 8 / 256);
        HAS(&k, "(rows)");
        HAS(&k, "const unsigned e = i * 8u;");
        HAS(&k, "const unsigned i0 = e % 64u;");
        HAS(&k, "const kiln_u16x8 v0 = *(const kiln_u16x8 *)(in0 + e);");
        HAS(&k, "const kiln_f32x8 v1 = *(const kiln_f32x8 *)(in1 + i0 + i2 * 64u);");
        HAS(&k, "const float r2 = kiln_f16_to_f32(in2[i1 + i3 * 16u]);");
        HAS(&k, "const float r3 = in3[0];");
        HAS(&k, "const kiln_u16x8 v4 = *(const kiln_u16x8 *)(in4 + i0 % 32u);");
        HAS(&k, "*(kiln_u16x8 *)(out + e) = o;");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* ne0 = 4098: 2 per thread */
    {
        ir_ref in[2] = {ts_ref4(1, KILN_BF16, 4098, 64, 1, 1), ts_ref4(2, KILN_BF16, 4098, 1, 1, 1)};
        ir_instr ins = I2(FE_OP_ADD, 0, 1);
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 4098, 64, 1, 1), 2, in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "struct alignas(4) kiln_u16x2 {");
        HAS(&k, "*(const kiln_u16x2 *)(in1 + i0);");
        ck_assert_uint_eq(k.grid[0], (4098 * 64 / 2 + 255) / 256);
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* padded rows (a view): vectors when the row stride keeps 16-byte alignment, else elements */
    {
        int64_t ne[4] = {4096, 64, 1, 1}, st[4] = {1, 4104, 4104 * 64, 4104 * 64};
        ir_ref in = ts_strided(1, KILN_BF16, ne, st, 8);
        ir_instr ins = I1(FE_OP_SILU, 0);
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 4096, 64, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "const kiln_u16x8 v0 = *(const kiln_u16x8 *)(in0 + i0 + i1 * 4104u);");
        cg_kernel_clear(&k);
        p->nodes[0].in[0].offs = 3;
        gen_compile(p, &k);
        HAS(&k, "kiln_bf16_to_f32(in0[(i0 + k) + i1 * 4104u])");
        cg_kernel_clear(&k);
        p->nodes[0].in[0].offs = 8;
        p->nodes[0].in[0].st[1] = 4100; /* 8200 bytes: not a multiple of 16 */
        gen_compile(p, &k);
        HAS(&k, "kiln_bf16_to_f32(in0[(i0 + k) + i1 * 4100u])");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* zero strides: a row repeated by its layout is a vector at i0; a column by layout once */
    {
        int64_t ne[4] = {1024, 64, 1, 1}, zr[4] = {1, 0, 0, 0}, zc[4] = {0, 1, 0, 0};
        ir_ref in[2] = {ts_strided(1, KILN_F32, ne, zr, 0), ts_strided(2, KILN_F16, ne, zc, 0)};
        ir_instr ins = I2(FE_OP_MUL, 0, 1);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 1024, 64, 1, 1), 2, in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "const kiln_f32x4 v0 = *(const kiln_f32x4 *)(in0 + i0);");
        HAS(&k, "const float r1 = kiln_f16_to_f32(in1[i1]);");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* permuted dims above 0 (attention's head split): dim 0 stays contiguous, so vectors */
    {
        int64_t ne[4] = {128, 512, 32, 1}, st[4] = {1, 4096, 128, 128 * 32 * 512};
        ir_ref in = ts_strided(1, KILN_F16, ne, st, 0);
        ir_instr ins = I1(FE_OP_CONT, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F16, 128, 512, 32, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "const kiln_u16x8 v0 = *(const kiln_u16x8 *)(in0 + i0 + i1 * 4096u + i2 * 128u);");
        ck_assert_uint_eq(k.block[0], 256);
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
}
END_TEST

/* ---- the tile shape -------------------------------------------------------------------------- */

START_TEST(tiles) {
    cg_kernel k;
    /* a transposed copy: 64 x 64 tiles */
    {
        ir_ref in = transposed(1, KILN_F32, 1024, 512);
        ir_instr ins = I1(FE_OP_CONT, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 1024, 512, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        ck_assert_uint_eq(k.grid[0], (1024 / 64) * (512 / 64));
        ck_assert_uint_eq(k.block[0], 64);
        ck_assert_uint_eq(k.block[1], 4);
        ck_assert_uint_eq(k.smem, 0);
        HAS(&k, "__launch_bounds__(256)");
        HAS(&k, "__shared__ float s0[64][65];");
        HAS(&k, "const unsigned t0 = blockIdx.x % 16u * 64u;");
        HAS(&k, "const unsigned t1 = blockIdx.x / 16u * 64u;");
        HAS(&k, "for (unsigned k = 0; k < 64u; k += 4u) {");
        HAS(&k, "s0[threadIdx.y + k][threadIdx.x] = in0[i0 * 512u + i1];");
        HAS(&k, "__syncthreads();");
        HAS(&k, "const float r0 = s0[threadIdx.x][threadIdx.y + k];");
        HAS(&k, "out[i0 + i1 * 1024u] = r1;");
        HASNT(&k, "if (i0 <"); /* extents are multiples of 64: no guards */
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* three tiled inputs, or an extent below 64: 32 x 32 tiles */
    {
        ir_ref in[3] = {transposed(1, KILN_F32, 1024, 512), transposed(2, KILN_BF16, 1024, 512),
                        transposed(3, KILN_F16, 1024, 512)};
        ir_instr ins[2] = {I2(FE_OP_ADD, 0, 1), I2(FE_OP_MUL, 3, 2)};
        ir_prog *p = one(ts_ref4(0, KILN_F32, 1024, 512, 1, 1), 3, in, 2, ins);
        gen_compile(p, &k);
        ck_assert_uint_eq(k.grid[0], (1024 / 32) * (512 / 32));
        ck_assert_uint_eq(k.block[0], 32);
        ck_assert_uint_eq(k.block[1], 8);
        HAS(&k, "__shared__ float s2[32][33];");
        HAS(&k, "const unsigned t1 = blockIdx.x / 32u * 32u;");
        cg_kernel_clear(&k);
        ts_prog_free(p);
        in[0] = transposed(1, KILN_F32, 8192, 48);
        p = one(ts_ref4(0, KILN_F32, 8192, 48, 1, 1), 1, in, 1, ins);
        p->nodes[0].ins[0] = I1(FE_OP_CONT, 0);
        gen_compile(p, &k);
        HAS(&k, "__shared__ float s0[32][33];");
        HAS(&k, "if (i1 < 48u) {");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* ragged extents, bf16 in and f16 out, with a contiguous and a broadcast operand */
    {
        ir_ref in[3] = {transposed(1, KILN_BF16, 1000, 300), ts_ref4(2, KILN_F32, 1000, 300, 1, 1),
                        ts_ref4(3, KILN_F16, 1000, 1, 1, 1)};
        ir_instr ins[2] = {I2(FE_OP_ADD, 0, 1), I2(FE_OP_MUL, 3, 2)};
        ir_prog *p = one(ts_ref4(0, KILN_F16, 1000, 300, 1, 1), 3, in, 2, ins);
        gen_compile(p, &k);
        ck_assert_uint_eq(k.grid[0], 16 * 5);
        HAS(&k, "if (i0 < 1000u && i1 < 300u) {");
        HAS(&k, "s0[threadIdx.y + k][threadIdx.x] = kiln_bf16_to_f32(in0[i0 * 300u + i1]);");
        HAS(&k, "const float r1 = in1[i0 + i1 * 1000u];");
        HAS(&k, "const float r2 = kiln_f16_to_f32(in2[i0]);");
        HASNT(&k, "s1[");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* a 4-dim permute whose contiguous input dim lands on dst's dim 2; two tiled inputs */
    {
        int64_t ne[4] = {40, 50, 48, 3}, st[4] = {48, 1920, 1, 96000};
        ir_ref in[2] = {ts_strided(1, KILN_F32, ne, st, 0), ts_strided(2, KILN_F16, ne, st, 0)};
        ir_instr ins = I2(FE_OP_SUB, 0, 1);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 40, 50, 48, 3), 2, in, 1, &ins);
        gen_compile(p, &k);
        ck_assert_uint_eq(k.grid[0], 2 * 2 * 50 * 3);
        HAS(&k, "dims 0 and 2");
        HAS(&k, "const unsigned t2 = blockIdx.x / 2u % 2u * 32u;");
        HAS(&k, "const unsigned i1 = blockIdx.x / 4u % 50u;");
        HAS(&k, "const unsigned i3 = blockIdx.x / 200u;");
        HAS(&k, "__shared__ float s1[32][33];");
        HAS(&k, "if (i0 < 40u && i2 < 48u) {");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* 64-bit offsets: the tile shape with long long coordinates */
    {
        ir_ref in = transposed(1, KILN_F32, 512, 512);
        in.offs = 3000000000ll;
        ir_instr ins = I1(FE_OP_CONT, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 512, 512, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "const long long t0 = blockIdx.x % 8ll * 64ll;");
        HAS(&k, "__syncthreads();");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* a short fast dim (4) does not tile */
    {
        ir_ref in = transposed(1, KILN_F32, 65536, 4);
        ir_instr ins = I1(FE_OP_CONT, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 65536, 4, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HASNT(&k, "__shared__");
        HAS(&k, "in0[(i0 + k) * 4u + i1]");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
}
END_TEST

/* ---- what stays plain ------------------------------------------------------------------------ */

START_TEST(plain) {
    cg_kernel k;
    /* below the size threshold */
    {
        ir_ref in = ts_ref4(1, KILN_BF16, 256, 255, 1, 1);
        ir_instr ins = I1(FE_OP_SILU, 0);
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 256, 255, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, PLAIN "65280u)");
        HASNT(&k, "kiln_u16x");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* 64-bit index spaces keep one element per thread */
    {
        ir_ref in = ts_ref4(1, KILN_BF16, 65536, 32769, 1, 1);
        ir_instr ins = I1(FE_OP_NEG, 0);
        ir_prog *p = one(ts_ref4(0, KILN_BF16, 65536, 32769, 1, 1), 1, &in, 1, &ins);
        ts_gen(p, &k);
        HAS(&k, "const long long i = blockIdx.x * 256ll + threadIdx.x;");
        HASNT(&k, "kiln_u16x");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* a negative stride (reversed rows): signed 64-bit, plain */
    {
        int64_t ne[4] = {1024, 128, 1, 1}, st[4] = {1, -1024, 131072, 131072};
        ir_ref in = ts_strided(1, KILN_F32, ne, st, 127 * 1024);
        ir_instr ins = I1(FE_OP_SQR, 0);
        ir_prog *p = one(ts_ref4(0, KILN_F32, 1024, 128, 1, 1), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, "in0[i0 + i1 * -1024ll]");
        HASNT(&k, "kiln_f32x");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
    /* a strided dst along dim 0: plain */
    {
        int64_t ne[4] = {1024, 128, 1, 1}, st[4] = {128, 1, 131072, 131072};
        ir_ref in = ts_ref4(1, KILN_F32, 1024, 128, 1, 1);
        ir_instr ins = I1(FE_OP_SQR, 0);
        ir_prog *p = one(ts_strided(0, KILN_F32, ne, st, 0), 1, &in, 1, &ins);
        gen_compile(p, &k);
        HAS(&k, PLAIN "131072u)");
        HASNT(&k, "__shared__");
        cg_kernel_clear(&k);
        ts_prog_free(p);
    }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ew_vector",
                        TS_CASE("shapes", 600), TS_TESTS(flat, rows, tiles, plain));
    return ts_main(s);
}
