/* The symbolic graphs of the rope, rows, moe and sort templates, shared by tests/test_dyn_rope.c
 * (generation, NVRTC, sources identical across values) and tests/gpu/test_gpu_dyn_rope.c (runs
 * at several values against the CPU reference of the graph bound to each). */
#ifndef KILN_TESTS_DYN_ROPE_CASES_H
#define KILN_TESTS_DYN_ROPE_CASES_H

typedef struct {
    const char *kg;
    const char *want; /* a substring of some kernel source (the template's symbolic path) */
    const char *dim;  /* the dim set to vals[] */
    int         vals[3];
} dyn_case;

#define RSR_HEAD                                                                                  \
    "dim n_tokens <= 64\ninput k: f32[128, 8, n_tokens]\ninput pos: i32[n_tokens]\n"              \
    "input kv_idxs: i64[n_tokens]\n"

static const dyn_case DYN_CASES[] = {
    /* 0: rope_ext normal, symbolic tokens */
    {"dim n_tokens <= 64\ninput x: f32[128, 8, n_tokens]\ninput pos: i32[n_tokens]\n"
     "output y = rope_ext(x, pos, n_dims=128, mode=0, n_ctx_orig=131072, freq_base=500000)\n",
     "past the run-time token count", "n_tokens", {1, 37, 64}},
    /* 1: rope_ext neox bf16, partial rotation, YaRN */
    {"dim n_tokens <= 40\ninput x: bf16[128, 4, n_tokens]\ninput pos: i32[n_tokens]\n"
     "output y = rope_ext(x, pos, n_dims=64, mode=2, n_ctx_orig=4096, freq_base=10000, freq_scale=0.25, "
     "ext_factor=1)\n",
     "past the run-time token count", "n_tokens", {1, 13, 40}},
    /* 2: rope_ext f16 with symbolic heads (a view of the first nh heads) */
    {"dim nh <= 32\ninput x: f16[64, nh, 5]\ninput pos: i32[5]\n"
     "output y = rope_ext(x, pos, n_dims=64, mode=2, freq_base=10000)\n",
     "nhead", "nh", {1, 17, 32}},
    /* 3: rope_set_rows into a state, in place (no copy blocks), symbolic tokens, repeated ids */
    {RSR_HEAD "state cache_k: f16[1024, 64]\n"
              "kr = rope_ext(k, pos, n_dims=128, mode=0, n_ctx_orig=131072, freq_base=500000)\n"
              "k_row = reshape(kr, [1024, n_tokens])\nk_cache = set_rows(cache_k, k_row, kv_idxs)\n"
              "output o = view(k_cache, [16], [], 0)\n",
     "in place: only the named rows", "n_tokens", {1, 9, 64}},
    /* 4: rope_set_rows, functional (the cache is an input), neox, bf16 cache */
    {RSR_HEAD "input cache_k: bf16[1024, 48]\n"
              "kr = rope_ext(k, pos, n_dims=128, mode=2, n_ctx_orig=131072, freq_base=500000)\n"
              "k_row = reshape(kr, [1024, n_tokens])\noutput k_cache = set_rows(cache_k, k_row, kv_idxs)\n",
     "copy blocks", "n_tokens", {1, 20, 64}},
    /* 5: get_rows with a symbolic ids count */
    {"dim n <= 64\nweight tab: bf16[256, 1000]\ninput ids: i32[n]\noutput y = get_rows(tab, ids)\n",
     "past a run-time extent", "n", {1, 30, 64}},
    /* 6: get_rows, 2-D ids with symbolic tokens (MoE weights [1, E, T] by ids [k, T]) */
    {"dim n_tokens <= 32\ninput p: f32[1, 64, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "output y = get_rows(p, ids)\n",
     "past a run-time extent", "n_tokens", {1, 5, 32}},
    /* 7: set_rows into a state, in place, symbolic source rows (f16 cache, i64 ids) */
    {"dim n <= 48\nstate c: f16[256, 16]\ninput b: f32[256, n]\ninput ids: i64[n]\n"
     "c2 = set_rows(c, b, ids)\noutput o = view(c2, [8], [], 0)\n",
     "set_rows_inplace", "n", {1, 7, 48}},
    /* 8: set_rows into a state, in place, over 3 matrices with broadcast ids (i32) */
    {"dim n <= 8\nstate c: bf16[64, 16, 3]\ninput b: f32[64, n, 3]\ninput ids: i32[n, 1]\n"
     "c2 = set_rows(c, b, ids)\noutput o = view(c2, [8], [], 0)\n",
     "set_rows_inplace", "n", {1, 3, 8}},
    /* 9: set_rows, functional, symbolic source rows */
    {"dim n <= 48\ninput c: f32[100, 20]\ninput b: f32[100, n]\ninput ids: i32[n]\n"
     "output c2 = set_rows(c, b, ids)\n",
     "(unsigned)(kdims[", "n", {1, 11, 48}},
    /* 10: concat along dim 0, symbolic rows */
    {"dim n <= 50\ninput a: f32[64, n]\ninput b: f32[32, n]\noutput y = concat(a, b, 0)\n", "past a run-time extent", "n",
     {1, 25, 50}},
    /* 11: pad with a symbolic dim 1 */
    {"dim n <= 40\ninput a: f16[30, n, 2]\noutput y = pad(a, lp0=1, rp0=1, lp2=1, rp3=2)\n", "past a run-time extent", "n",
     {1, 22, 40}},
    /* 12: add_id, symbolic tokens */
    {"dim n_tokens <= 32\ninput a: f32[96, 4, n_tokens]\ninput b: f32[96, 16]\ninput ids: i32[4, n_tokens]\n"
     "output y = add_id(a, b, ids)\n",
     "past a run-time extent", "n_tokens", {1, 9, 32}},
    /* 13: topk_moe (softmax routing, top 8 of 128, normalized), symbolic tokens */
    {"dim n_tokens <= 64\ninput logits: f32[128, n_tokens]\nprobs = soft_max(logits)\n"
     "output selected = argsort_top_k(probs, 8)\nprobs3 = reshape(probs, [1, 128, n_tokens])\n"
     "weights = get_rows(probs3, selected)\nweights2 = reshape(weights, [8, n_tokens])\n"
     "weights_sum = sum_rows(weights2)\noutput weights_n = div(weights2, weights_sum)\n",
     "past the run-time token count", "n_tokens", {1, 10, 64}},
    /* 14: argsort (the smem shape, several rows per block), symbolic rows */
    {"dim n <= 100\ninput a: f32[64, n]\noutput y = argsort(a, desc)\n", "kiln_row_ok", "n", {1, 45, 100}},
    /* 15: argsort_top_k (the warp shape), symbolic dims 1 and 2 */
    {"dim n <= 12\ninput a: f16[256, 5, n]\noutput y = argsort_top_k(a, 4)\n", "kiln_row_ok", "n", {1, 7, 12}},
    /* 16: argsort of long rows (the global shape) */
    {"dim n <= 6\ninput a: f32[8192, n]\noutput y = argsort(a)\n", "kiln_row_ok", "n", {1, 4, 6}},
    /* 17: top_k of long rows (the radix select shape) */
    {"dim n <= 6\ninput a: bf16[10000, n]\noutput y = top_k(a, 40)\n", "kiln_row_ok", "n", {1, 2, 6}},
};
#define DYN_NCASES ((int)(sizeof DYN_CASES / sizeof DYN_CASES[0]))

#endif
