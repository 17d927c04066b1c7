/* Symbolic dims in the attention and softmax templates (templates/attn.lua, softmax.lua): graphs
 * with a run-time n_kv (decode) and n_q / n_tokens (prefill) generate kernels that take kdims,
 * compile with NVRTC for sm_90a and sm_80 without a warning, and do not depend on the values (two
 * compiles give the same sources; a graph bound to a value gives exactly the static kernel of
 * the same graph written with that extent). Unsupported symbolic dims are refused by name.
 * No GPU needed; tests/gpu/test_gpu_dyn_attn.c runs them. */
#include "tests/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

typedef struct {
    const char *kg;      /* symbolic graph: the dims first */
    const char *dim[2];  /* its dims */
    const char *kernel;  /* the main kernel's name */
    const char *want;    /* a substring of the main kernel's source */
    int         steps;
} dcase;

#define LLAMA_DEC                                                                                        \
    "dim n_kv <= 4096\ninput q: f32[64, 1, 32]\ninput cache_k: f16[512, n_kv]\ninput cache_v: f16[512, n_kv]\n" \
    "input kq_mask: f16[n_kv, 1]\nk_heads = view(cache_k, [64, 8, n_kv], [128, 1024], 0)\n"              \
    "v_heads = view(cache_v, [64, 8, n_kv], [128, 1024], 0)\nk = permute(k_heads, 0, 2, 1, 3)\n"        \
    "v = permute(v_heads, 0, 2, 1, 3)\n"

static const dcase CASES[] = {
    /* llama-layer decode: n_kv symbolic, split-KV over the maximum, split 0 finishing short runs */
    {LLAMA_DEC "output y = flash_attn_ext(q, k, v, kq_mask, scale=0.125)\n", {"n_kv"}, "fattn_dec_f16_d64_dyn",
     "if (nkv <= 128u)", 2},
    /* Llama-3-8B heads, bf16, sinks */
    {"dim n_kv <= 8192\ninput q: f32[128, 1, 32]\ninput k: bf16[128, n_kv, 8]\ninput v: bf16[128, n_kv, 8]\n"
     "input m: f16[n_kv, 1]\ninput s: f32[32]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.088, sinks=s)\n",
     {"n_kv"}, "fattn_dec_bf16_d128_dyn", "split * 256u >= nkv", 2},
    /* decode with 16-row tiles, n_q and n_kv symbolic, ALiBi */
    {"dim n_kv <= 2048\ndim n_q <= 4\ninput q: f32[128, n_q, 32]\ninput k: f16[128, n_kv, 8]\n"
     "input v: f16[128, n_kv, 8]\ninput m: f16[n_kv, n_q]\noutput y = flash_attn_ext(q, k, v, m, 0.125, 2, 0)\n",
     {"n_kv", "n_q"}, "fattn_dec_f16_d128_dyn", "nr = (unsigned)(kdims[1]) * 4u", 2},
    /* prefill: n_tokens and n_kv symbolic, causal-style mask, no splits at the maximum */
    {"dim n_kv <= 4096\ndim n_tokens <= 512\ninput q: f32[64, n_tokens, 32]\ninput k: f16[64, n_kv, 8]\n"
     "input v: f16[64, n_kv, 8]\ninput m: f16[n_kv, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.125)\n",
     {"n_kv", "n_tokens"}, "fattn_pre_f16_d64_dyn", "rt * 64u >= nr", 1},
    /* prefill with splits (and their combine), D 256, sinks */
    {"dim n_kv <= 300\ndim n_tokens <= 100\ninput q: f32[256, n_tokens, 4]\ninput k: bf16[256, n_kv, 2]\n"
     "input v: bf16[256, n_kv, 2]\ninput m: f16[n_kv, n_tokens]\ninput s: f32[4]\n"
     "output y = flash_attn_ext(q, k, v, m, 0.06, 0, 20, s)\n",
     {"n_kv", "n_tokens"}, "fattn_pre_bf16_d256_dyn", "Q from shared memory", 2},
    /* prefill, only n_tokens symbolic */
    {"dim n_tokens <= 64\ninput q: f32[64, n_tokens, 8]\ninput k: f16[64, 512, 8]\ninput v: f16[64, 512, 8]\n"
     "input m: f16[512, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m)\n",
     {"n_tokens"}, "fattn_pre_f16_d64_dyn", "nr - 1u", 2},
    /* FMA kernel: f32 K/V, sinks; odd head size with n_q */
    {"dim n_kv <= 4096\ninput q: f32[128, 1, 32]\ninput k: f32[128, n_kv, 8]\ninput v: f32[128, n_kv, 8]\n"
     "input m: f16[n_kv, 1]\ninput s: f32[32]\noutput y = flash_attn_ext(q, k, v, m, 0.088, 0, 0, s)\n",
     {"n_kv"}, "fattn_fma_f32_d128_dyn", "if (nkv <= 128u)", 2},
    {"dim n_kv <= 70\ndim n_q <= 20\ninput q: f32[40, n_q, 2]\ninput k: bf16[40, n_kv, 2]\ninput v: bf16[40, n_kv, 2]\n"
     "output y = flash_attn_ext(q, k, v, logit_softcap=5)\n",
     {"n_kv", "n_q"}, "fattn_fma_bf16_d40_dyn", "tanhf", 2},
    /* key intervals (kiln_batch): the decode kernel over each row tile's hull, blocks by the
     * live tiles and splits; the MLA widths; the FMA kernel over each row's own interval */
    {"dim n_kv <= 41472\ndim n_tokens <= 512\ninput q: f32[128, n_tokens, 32]\ninput k: f16[128, n_kv, 8]\n"
     "input v: f16[128, n_kv, 8]\ninput m: i32[2, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.088)\n",
     {"n_kv", "n_tokens"}, "fattn_dec_rg_f16_d128_dyn", "if (blockIdx.x >= ntile * ns)", 2},
    {"dim n_kv <= 4096\ndim n_tokens <= 64\ninput q: f32[64, n_tokens, 8]\ninput k: bf16[64, n_kv, 1]\n"
     "input v: bf16[64, n_kv, 1]\ninput m: i32[2, n_tokens]\ninput s: f32[8]\n"
     "output y = flash_attn_ext(q, k, v, m, 0.125, 0, 0, s)\n",
     {"n_kv", "n_tokens"}, "fattn_dec_rg_bf16_d64_dyn", "__any_sync", 2},
    {"dim n_kv <= 4096\ndim n_tokens <= 64\ninput q: f32[576, n_tokens, 16]\ninput k: f16[576, n_kv, 1]\n"
     "input v: f16[512, n_kv, 1]\ninput m: i32[2, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.07)\n",
     {"n_kv", "n_tokens"}, "fattn_dec_rg_f16_d576_512_dyn", "jend = min(jbeg + len, bhi)", 2},
    {"dim n_kv <= 1000\ndim n_tokens <= 16\ninput q: f32[128, n_tokens, 8]\ninput k: f32[128, n_kv, 2]\n"
     "input v: f32[128, n_kv, 2]\ninput m: i32[2, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m)\n",
     {"n_kv", "n_tokens"}, "fattn_fma_rg_f32_d128_dyn", "jbeg = lo", 1},
    /* softmax: the non-flash attention path (kq [n_kv, n_tokens, n_head], mask [n_kv, n_tokens]) */
    {"dim n_kv <= 4096\ninput kq: f32[n_kv, 1, 32]\ninput m: f16[n_kv, 1]\n"
     "output y = soft_max_ext(kq, m, scale=0.125)\n",
     {"n_kv"}, "soft_max_ext_f32_4096_dyn_mf16", "const unsigned nvr = (dn0 + 3u) / 4u;", 1},
    {"dim n_kv <= 4096\ndim n_tokens <= 512\ninput kq: f32[n_kv, n_tokens, 32]\ninput m: f16[n_kv, n_tokens]\n"
     "output y = soft_max_ext(kq, m, scale=0.125)\n",
     {"n_kv", "n_tokens"}, "soft_max_ext_f32_4096_dyn_mf16", "if (!(", 1},
    /* team kernel (short rows), rows symbolic in dims 1 and 2, sinks */
    {"dim n <= 100\ndim h <= 3\ninput a: f16[n, 7, h]\ninput s: f32[h]\noutput y = soft_max_ext(a, sinks=s)\n",
     {"n", "h"}, "soft_max_ext_f16_100_dyn_sinks", "__all_sync", 1},
    /* rows long enough for a cluster, plain soft_max */
    {"dim n <= 65536\ndim r <= 4\ninput a: bf16[n, r]\noutput y = soft_max(a)\n", {"n", "r"}, "soft_max_bf16_65536_dyn",
     "kiln_cluster_rank", 1},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static char *with_header(const char *kg) {
    size_t n = strlen(kg) + 32;
    char  *s = malloc(n);
    snprintf(s, n, "kiln-graph 1\n%s", kg);
    return s;
}

/* Every kernel of the symbolic graph takes kdims and compiles cleanly; the main one is named
 * and contains c->want. */
START_TEST(dyn_compile) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    const dcase       *c = &CASES[_i];
    char              *kg = with_header(c->kg);
    kiln_ctx          *ctx;
    kiln_graph        *g;
    kiln_program      *p = ts_compile(kg, "sm_90a", g_cache, 1, &ctx, &g);
    ts_named_step(p, c->kernel, c->steps, c->want, _i);
    for (int i = 0; i < kiln_program_kernel_count(p); i++) {
        const char *s = kiln_program_kernel_source(p, i);
        ck_assert_msg(strstr(s, "const int* __restrict__ kdims)"), "case %d step %d: no kdims parameter last", _i, i);
        for (int a = 0; a < 2; a++) ts_nvrtc_clean(s, kiln_program_kernel_name(p, i), archs[a]);
    }
    ts_compiled_free(p, g, ctx);
    free(kg);
}
END_TEST

/* The sources cannot depend on run-time values: compiling twice gives the same keys, and a graph
 * bound to two different values (kiln_ctx_bind) gives static kernels (no kdims) identical to
 * those of the same graph written with the value, and different from each other. */
static char **keys_of(const kiln_graph *g, int *n) {
    kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = g_cache, .skip_nvrtc = 1};
    kiln_program     *p = NULL;
    TS_OK(kiln_compile(g, &o, &p));
    *n = kiln_program_kernel_count(p);
    char **k = calloc(*n + 1, sizeof *k);
    for (int i = 0; i < *n; i++) {
        const char *src = kiln_program_kernel_source(p, i);
        k[i] = strdup(src);
    }
    kiln_program_free(p);
    return k;
}

static void free_keys(char **k, int n) {
    for (int i = 0; i < n; i++) free(k[i]);
    free(k);
}

/* The graph text with each use of dim `name` replaced by value and its declaration removed. */
static char *substitute(const char *kg, const char *const *names, const int64_t *values, int n) {
    size_t cap = strlen(kg) * 2 + 64, len = 0;
    char  *out = malloc(cap);
    len += (size_t)snprintf(out, cap, "kiln-graph 1\n");
    const char *s = kg;
    while (*s) {
        const char *eol = strchr(s, '\n');
        size_t      ll = eol ? (size_t)(eol - s) + 1 : strlen(s);
        if (strncmp(s, "dim ", 4) == 0) {
            s += ll;
            continue;
        }
        for (size_t i = 0; i < ll;) {
            int hit = -1;
            for (int d = 0; d < n && hit < 0; d++) {
                size_t nl = strlen(names[d]);
                if (i + nl > ll || strncmp(s + i, names[d], nl) != 0)
                    continue; /* also keeps s[i + nl] below inside the string */
                char before = i ? s[i - 1] : ' ', after = s[i + nl];
                if (!(before == '_' || (before >= 'a' && before <= 'z')) &&
                    !(after == '_' || (after >= 'a' && after <= 'z') || (after >= '0' && after <= '9')))
                    hit = d;
            }
            if (hit >= 0) {
                len += (size_t)snprintf(out + len, cap - len, "%lld", (long long)values[hit]);
                i += strlen(names[hit]);
            } else {
                out[len++] = s[i++];
            }
        }
        s += ll;
    }
    out[len] = 0;
    return out;
}

START_TEST(dyn_values) {
    const dcase *c = &CASES[_i];
    char        *kg = with_header(c->kg);
    int          nd = c->dim[1] ? 2 : 1;
    kiln_ctx    *ctx;
    kiln_graph  *g = ts_build(kg, &ctx);
    int    n1, n2;
    char **a = keys_of(g, &n1), **b = keys_of(g, &n2);
    ck_assert_int_eq(n1, n2);
    for (int i = 0; i < n1; i++) ck_assert_msg(strcmp(a[i], b[i]) == 0, "case %d: step %d differs between compiles", _i, i);
    char **bound[2];
    int    nb[2];
    for (int v = 0; v < 2; v++) {
        int64_t values[2];
        for (int d = 0; d < nd; d++) {
            int64_t max = kiln_ctx_dim_max(ctx, kiln_ctx_dim_find(ctx, c->dim[d]));
            values[d] = v == 0 ? 1 + max / 3 : max; /* a middle value, the maximum */
            if (v == 0 && values[d] == max) values[d] = 1;
        }
        kiln_ctx *bc = NULL;
        TS_OK(kiln_ctx_bind(ctx, nd, c->dim, values, &bc));
        kiln_graph *bg = NULL;
        TS_OK(kiln_graph_new(bc, &bg));
        bound[v] = keys_of(bg, &nb[v]);
        for (int i = 0; i < nb[v]; i++)
            ck_assert_msg(!strstr(bound[v][i], "kdims"), "case %d: bound graph step %d reads kdims", _i, i);
        /* the same graph written with the values: the same (static) sources */
        char       *lit = substitute(c->kg, c->dim, values, nd);
        kiln_ctx   *lc;
        kiln_graph *lg = ts_build(lit, &lc);
        int    nl;
        char **l = keys_of(lg, &nl);
        ck_assert_int_eq(nl, nb[v]);
        for (int i = 0; i < nl; i++)
            ck_assert_msg(strcmp(l[i], bound[v][i]) == 0, "case %d: bound and literal graphs differ (step %d):\n%s", _i, i, lit);
        free_keys(l, nl);
        ts_graph_free(lg, lc);
        free(lit);
        ts_graph_free(bg, bc);
    }
    int same = nb[0] == nb[1];
    for (int i = 0; same && i < nb[0]; i++) same = strcmp(bound[0][i], bound[1][i]) == 0;
    ck_assert_msg(!same, "case %d: static kernels at two values are identical", _i);
    free_keys(bound[0], nb[0]);
    free_keys(bound[1], nb[1]);
    free_keys(a, n1);
    free_keys(b, n2);
    ts_graph_free(g, ctx);
    free(kg);
}
END_TEST

/* Symbolic dims the templates do not support are refused with the template's reason. */
static void expect_refused(const char *kg, const char *needle) {
    char *text = with_header(kg);
    char *m = ts_refused_msg(text, g_cache, 0, "refusal");
    ck_assert_msg(strstr(m, needle), "message lacks \"%s\": %s", needle, m);
    free(m);
    free(text);
}

START_TEST(dyn_refused) {
    /* a symbolic head count (attention) */
    expect_refused("dim nh <= 32\ninput q: f32[64, 1, nh]\ninput k: f16[64, 10, 1]\ninput v: f16[64, 10, 1]\n"
                   "output y = flash_attn_ext(q, k, v)\n",
                   "symbolic dim nh on q dim 2 is not supported");
    /* ALiBi over a symbolic head count (softmax): the slopes depend on it */
    expect_refused("dim nh <= 32\ninput a: f32[64, 4, nh]\ninput m: f16[64, 4]\n"
                   "output y = soft_max_ext(a, m, max_bias=8)\n",
                   "ALiBi with a symbolic head count");
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("dyn_attn",
                        TS_CASE("symbolic", 240), TS_LOOP(0, NCASES, dyn_compile, dyn_values), TS_TESTS(dyn_refused));
    return ts_main_cache(s, "dyn-attn-test", &g_cache);
}
