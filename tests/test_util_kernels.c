/* The runtime's utility kernels (templates/util.lua through codegen/util.c): the random weight
 * fill of kiln_session_fill_weights and the L2 flush of the bench. No GPU: the template gives
 * exactly the kernels the runtime compiled before (the same cubins, so the device computes
 * what it did, bit for bit), NVRTC compiles them without a warning, their keys are stable, and
 * the kernel cache keeps them (a second call loads the cubin). tests/gpu/test_gpu_model.c
 * (device_fill_equals_file) and tests/gpu/test_gpu_util.c run them. */
#include "tests/support.h"

#include "codegen/codegen.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The kernels as runtime/fill.c and runtime/device.c held them as C strings (before issue 24):
 * the template's source must end with exactly this text. */
static const char old_fill[] =
    "extern \"C\" __global__ void kiln_fill_uniform(void *dst, unsigned long long n, int type,\n"
    "                                               unsigned long long key, float scale, float base)\n"
    "{\n"
    "    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;\n"
    "    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) {\n"
    "        unsigned long long z = key + e * 0x9e3779b97f4a7c15ull;\n"
    "        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;\n"
    "        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;\n"
    "        z ^= z >> 31;\n"
    "        float u = __fadd_rn(__fmul_rn((float)(z >> 40), 1.0f / 8388608.0f), -1.0f);\n"
    "        float v = __fadd_rn(base, __fmul_rn(scale, u));\n"
    "        unsigned short h;\n"
    "        if (type == 0) {\n"
    "            ((float *)dst)[e] = v;\n"
    "            continue;\n"
    "        }\n"
    "        if (type == 1) asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));\n"
    "        else asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));\n"
    "        ((unsigned short *)dst)[e] = h;\n"
    "    }\n"
    "}\n";

static const char old_flush[] =
    "extern \"C\" __global__ void kiln_l2_read(const uint4 *p, unsigned long long n, unsigned *sink)\n"
    "{\n"
    "    unsigned acc = 0;\n"
    "    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;\n"
    "    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {\n"
    "        uint4 v = p[i];\n"
    "        acc ^= v.x ^ v.y ^ v.z ^ v.w;\n"
    "    }\n"
    "    if (acc == 0x9e3779b9u) *sink = acc; /* never (the buffer holds zeros): keeps the loads */\n"
    "}\n";

/* Each kernel: its template name, entry point, former source and launch (grid: the most blocks). */
static const struct {
    const char *kernel, *name, *old;
    unsigned    grid, block;
} kernels[] = {
    {"fill_uniform", "kiln_fill_uniform", old_fill, 8192, 256},
    {"l2_read", "kiln_l2_read", old_flush, 1024, 256},
};
#define NKERNELS (int)(sizeof kernels / sizeof kernels[0])

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static cg_kernel generate(const char *kernel) {
    cg_lua *L = NULL;
    TS_OK(cg_lua_new(&L));
    cg_kernel k;
    TS_OK(cg_generate_util(L, kernel, &k));
    cg_lua_free(L);
    return k;
}

/* The template gives the former kernels, byte for byte after its header comment, with the
 * launch the runtime used, and no grid-wait prologue (they are launched plainly). */
START_TEST(sources_are_the_former_kernels) {
    cg_kernel k = generate(kernels[_i].kernel);
    ck_assert_str_eq(k.name, kernels[_i].name);
    ck_assert_msg(ends_with(k.source, kernels[_i].old), "%s: source is not the former kernel:\n%s", k.name, k.source);
    ck_assert_msg(strncmp(k.source, "// kiln utility kernel ", 23) == 0, "%s: no header comment:\n%s", k.name, k.source);
    ck_assert_ptr_null(strstr(k.source, "griddepcontrol"));
    ck_assert_uint_eq(k.grid[0], kernels[_i].grid);
    ck_assert_uint_eq(k.block[0], kernels[_i].block);
    ck_assert_uint_eq(k.grid[1] * k.grid[2] * k.block[1] * k.block[2], 1);
    ck_assert_uint_eq(k.smem, 0);
    ck_assert_int_eq(k.kind, CG_LAUNCH);
    ck_assert_int_eq(k.node, -1);
    cg_kernel_clear(&k);
}
END_TEST

/* The header comment changes no code: the cubin is the one the former source gave. */
START_TEST(cubins_are_the_former_kernels) {
    static const char *const archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        cg_kernel k = generate(kernels[_i].kernel);
        void     *now, *before;
        size_t    n_now, n_before;
        TS_OK(cg_nvrtc_compile(k.source, k.name, archs[a], &now, &n_now));
        TS_OK(cg_nvrtc_compile(kernels[_i].old, k.name, archs[a], &before, &n_before));
        ck_assert_msg(n_now == n_before && memcmp(now, before, n_now) == 0, "%s (%s): the cubin differs from the former "
                      "kernel's (%zu vs %zu bytes)", k.name, archs[a], n_now, n_before);
        free(now);
        free(before);
        cg_kernel_clear(&k);
    }
}
END_TEST

START_TEST(nvrtc_clean) {
    static const char *const archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        cg_kernel k = generate(kernels[_i].kernel);
        ts_nvrtc_clean(k.source, k.name, archs[a]);
        cg_kernel_clear(&k);
    }
}
END_TEST

/* A kernel's key is kiln_compile's key of its source (same options, arch and versions), the
 * same in every Lua state and call; it differs between the kernels and between archs. */
START_TEST(keys_are_stable) {
    char *dir = ts_tmpdir();
    char  key[NKERNELS][2][33];
    for (int i = 0; i < NKERNELS; i++)
        for (int a = 0; a < 2; a++) {
            const char *arch = a ? "sm_80" : "sm_90a";
            cg_kernel   k, again;
            TS_OK(cg_util_kernel(kernels[i].kernel, arch, dir, &k));
            TS_OK(cg_util_kernel(kernels[i].kernel, arch, dir, &again));
            ck_assert_str_eq(k.key_hex, again.key_hex);
            ck_assert_str_eq(k.source, again.source);
            const char *opts[CG_MAX_OPTS];
            int         nopts = cg_nvrtc_options(arch, opts), major, minor;
            TS_OK(cg_nvrtc_version(&major, &minor));
            char want[33];
            kc_key_hex(kc_kernel_key(k.source, opts, nopts, arch, major, minor, CG_CODEGEN_VERSION), want);
            ck_assert_str_eq(k.key_hex, want);
            strcpy(key[i][a], k.key_hex);
            cg_kernel_clear(&k);
            cg_kernel_clear(&again);
        }
    ck_assert_str_ne(key[0][0], key[0][1]);
    ck_assert_str_ne(key[0][0], key[1][0]);
    ck_assert_str_ne(key[1][0], key[1][1]);
    ts_tmpdir_free(dir);
}
END_TEST

static int find_kernel(void *user, const kc_entry *e) {
    const char **want = user;
    if (e->kind == KC_CUBIN && e->meta && strncmp(e->meta, want[0], strlen(want[0])) == 0 && e->meta[strlen(want[0])] == '\n')
        want[1] = "found";
    return 0;
}

/* The first call compiles and stores the cubin (an entry named after the kernel, at its key);
 * the second loads that cubin from the cache. */
START_TEST(second_call_hits_the_cache) {
    char     *dir = ts_tmpdir();
    cg_kernel k, again;
    TS_OK(cg_util_kernel(kernels[_i].kernel, "sm_90a", dir, &k));
    ck_assert(!k.from_cache);
    ck_assert(k.cubin && k.cubin_size > 0);
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_key   key;
    memcpy(key.b, k.key, 16);
    char       *path = kc_entry_path(&c, KC_CUBIN, key);
    struct stat sb;
    ck_assert_msg(stat(path, &sb) == 0, "no cache entry %s", path);
    char meta_line[80];
    snprintf(meta_line, sizeof meta_line, "kernel %s", kernels[_i].name);
    const char *want[2] = {meta_line, NULL};
    TS_OK(kc_walk(&c, true, find_kernel, want));
    ck_assert_msg(want[1], "no entry whose meta says '%s'", meta_line);

    TS_OK(cg_util_kernel(kernels[_i].kernel, "sm_90a", dir, &again));
    ck_assert(again.from_cache);
    ck_assert_uint_eq(again.cubin_size, k.cubin_size);
    ck_assert(memcmp(again.cubin, k.cubin, k.cubin_size) == 0);
    free(path);
    cg_kernel_clear(&k);
    cg_kernel_clear(&again);
    ts_tmpdir_free(dir);
}
END_TEST

/* The runtime passes no directory: the default one (here the test's KILN_CACHE_DIR) is used,
 * and KILN_CACHE=off compiles without touching it. */
START_TEST(default_dir_and_cache_off) {
    char *dir = ts_tmpdir();
    setenv("KILN_CACHE_DIR", dir, 1);
    setenv("KILN_CACHE", "off", 1);
    cg_kernel k;
    TS_OK(cg_util_kernel("l2_read", "sm_80", NULL, &k));
    ck_assert(!k.from_cache && k.cubin);
    cg_kernel_clear(&k);
    struct stat sb;
    char        sub[4200];
    snprintf(sub, sizeof sub, "%s/kernels", dir);
    ck_assert_msg(stat(sub, &sb) != 0, "KILN_CACHE=off wrote %s", sub);
    unsetenv("KILN_CACHE");
    TS_OK(cg_util_kernel("l2_read", "sm_80", NULL, &k));
    ck_assert(!k.from_cache);
    cg_kernel_clear(&k);
    ck_assert_msg(stat(sub, &sb) == 0, "nothing stored in the default directory %s", dir);
    TS_OK(cg_util_kernel("l2_read", "sm_80", NULL, &k));
    ck_assert(k.from_cache);
    cg_kernel_clear(&k);
    ts_tmpdir_free(dir);
}
END_TEST

static void expect_error(kiln_status st, kiln_code code, const char *what) { ts_expect_status(st, code, what); }

START_TEST(bad_requests_are_errors) {
    char     *dir = ts_tmpdir();
    cg_kernel k;
    expect_error(cg_util_kernel("memset", "sm_90a", dir, &k), KILN_ERR_CODEGEN, "unknown utility kernel memset");
    ck_assert_ptr_null(k.source);
    expect_error(cg_util_kernel("fill_uniform", "sm_9x", dir, &k), KILN_ERR_INVALID, "sm_9x");
    expect_error(cg_util_kernel(NULL, "sm_90a", dir, &k), KILN_ERR_INVALID, "NULL");
    expect_error(cg_generate_util(NULL, "l2_read", &k), KILN_ERR_INVALID, "NULL");
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("util_kernels",
                        TS_CASE("util_kernels", 120),
                        TS_LOOP(0, NKERNELS, sources_are_the_former_kernels, cubins_are_the_former_kernels,
                                             nvrtc_clean),
                        TS_TESTS(keys_are_stable), TS_LOOP(0, NKERNELS, second_call_hits_the_cache),
                        TS_TESTS(default_dir_and_cache_off, bad_requests_are_errors));
    return ts_main_isolated(s, "util_kernels");
}
