/* Symbolic dims in the rope, rows, moe and sort templates on the GPU: each graph of
 * tests/dyn_rope_cases.h run at three values (1, a middle value, the maximum) with
 * `kiln run --dim NAME=V --check` (outputs and states against the CPU reference of the graph
 * bound to V), with the CUDA graph and with plain launches; then rope_set_rows into an f16
 * [1024, 4096] cache timed: in place (a state) at n_tokens = 1 and 512, static and symbolic,
 * against the functional kernel that copies the cache (printed, not asserted). */
#include "tests/gpu/gpu_support.h"
#include "tests/dyn_rope_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(runs_match_reference) {
    run_case_at_values("dyn_rope", _i, DYN_CASES[_i].kg, DYN_CASES[_i].dim, DYN_CASES[_i].vals);
}
END_TEST


/* K of n tokens (8 kv heads of 128, normal rope) into an f16 [1024, 4096] cache. */
static void rsr_graph(char *kg, size_t len, const char *n, int state) {
    snprintf(kg, len,
             "%s%s"
             "input k: f32[128, 8, %s]\ninput pos: i32[%s]\ninput kv_idxs: i64[%s]\n"
             "%s cache_k: f16[1024, 4096]\n"
             "kr = rope_ext(k, pos, n_dims=128, mode=0, n_ctx_orig=131072, freq_base=500000)\n"
             "k_row = reshape(kr, [1024, %s])\n%sk_cache = set_rows(cache_k, k_row, kv_idxs)\n%s",
             strcmp(n, "n_tokens") ? "" : "dim n_tokens <= 512\n", "", n, n, n, state ? "state" : "input", n,
             state ? "" : "output ", state ? "output o = view(k_cache, [16], [], 0)\n" : "");
}

/* n distinct cache rows (the ids of kiln run's random inputs repeat, and a row named twice is
 * written once). */
static char *ids_file(const char *dir, int n) {
    char *path = malloc(strlen(dir) + 32);
    ck_assert_ptr_nonnull(path);
    sprintf(path, "%s/ids%d.bin", dir, n);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        long long v = (long long)i * 7 % 4096;
        fwrite(&v, sizeof v, 1, f);
    }
    fclose(f);
    return path;
}

START_TEST(bench_rope_set_rows) {
    need_gpu();
    char *dir = ts_tmpdir();
    char  kg[1024];
    /* the 16-element output read back from the state, alone */
    char  *tiny = write_kg(dir, "tiny", "state cache_k: f16[1024, 4096]\noutput o = view(cache_k, [16], [], 0)\n");
    double t_tiny = run_median_ms(tiny, "--iters 300");
    printf("bench: the 16-element read-back of the state alone: %.4f ms\n", t_tiny);
    rsr_graph(kg, sizeof kg, "n_tokens", 1);
    char *sym = write_kg(dir, "sym", kg);
    static const int ns[2] = {1, 512};
    for (int i = 0; i < 2; i++) {
        char nn[16];
        snprintf(nn, sizeof nn, "%d", ns[i]);
        rsr_graph(kg, sizeof kg, nn, 0);
        char *fun = write_kg(dir, "functional", kg);
        rsr_graph(kg, sizeof kg, nn, 1);
        char *inp = write_kg(dir, "inplace", kg);
        char *ids = ids_file(dir, ns[i]);
        double t_fun = run_median_ms(fun, "--input kv_idxs=%s --iters 300", ids);
        double t_inp = run_median_ms(inp, "--input kv_idxs=%s --iters 300", ids);
        double t_sym = run_median_ms(sym, "--dim n_tokens=%d --input kv_idxs=%s --iters 300", ns[i], ids);
        printf("bench rope_set_rows f16 [1024, 4096] cache, n_tokens=%d: functional (copies the cache) %.4f ms; "
               "in place %.4f ms, symbolic n_tokens <= 512 in place %.4f ms (both + the read-back, %.4f ms alone)\n",
               ns[i], t_fun, t_inp, t_sym, t_tiny);
        ck_assert_msg(t_fun > 0 && t_inp > 0 && t_sym > 0, "n=%d: a run failed", ns[i]);
        free(fun);
        free(inp);
        free(ids);
    }
    free(sym);
    free(tiny);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_dyn_rope",
                        TS_CASE("runs", 900), TS_LOOP(0, DYN_NCASES, runs_match_reference),
                        TS_CASE("bench", 900), TS_TESTS(bench_rope_set_rows));
    return ts_main_cache(s, "gpu-dyn-rope", &g_cache_dir);
}
