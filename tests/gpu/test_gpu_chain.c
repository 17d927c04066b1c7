/* Chained runs (kiln_session_chain_*): output `next` of each run fed on the device into input
 * `tok` of the next. The graph picks next = argmax(table[tok] + bias), so every step's value
 * depends on the step before, and bias (set at some steps, kept at others) checks that inputs
 * persist from run to run through the two input twins. The chain's outputs must equal the
 * host's own walk, for chains of 1, 2 and 7 runs of the n = 1 variant and 5 runs of the
 * general program at n = 2, with the CUDA graph and plain launches; a weight set in the
 * middle of a chain reaches the runs queued after it. Misuse is refused with a message. */
#include "tests/gpu/gpu_support.h"

#include <stdio.h>
#include <string.h>

#define V 16

static const char *const KG = "dim n <= 4 specialize 1\n"
                              "input tok: i32[n]\n"
                              "input bias: f32[16]\n"
                              "weight table: f32[16, 16]\n"
                              "row = get_rows(table, tok)\n"
                              "s = add(row, bias)\n"
                              "output next = argmax(s)\n";

static float g_table[V * V];

/* The host's pick after token t with bias b: the last of equal maxima, as ggml's argmax. */
static int32_t pick(int32_t t, const float *b) {
    int32_t best = 0;
    for (int j = 1; j < V; j++)
        if (g_table[t * V + j] + b[j] >= g_table[t * V + best] + b[best]) best = j;
    return best;
}

static void make_bias(float *b, int step) {
    for (int j = 0; j < V; j++) b[j] = (float)((j * 7 + step * 3) % V) * 0.25f;
}

static kiln_session *open_session(kiln_program **p, kiln_graph **g, kiln_ctx **ctx, bool no_graph) {
    *ctx = ts_parse(KG);
    TS_OK(kiln_graph_new(*ctx, g));
    *p = compile(*g, 0);
    kiln_session_opts o = {.no_cuda_graph = no_graph};
    kiln_session     *s;
    TS_OK(kiln_session_new(*p, &o, &s));
    for (int i = 0; i < V * V; i++) g_table[i] = (float)((i * 2654435761u >> 7) % 1000) / 100.0f;
    TS_OK(kiln_session_set(s, "table", g_table, sizeof g_table));
    TS_OK(kiln_session_set_dim(s, "n", 1));
    return s;
}

/* A chain of n runs of `rows` tokens (n = rows) from tokens first; bias changes at even steps
 * only. */
static void chain_once(kiln_session *s, const int32_t *first, int rows, int n, const char *label) {
    float   bias[V];
    int32_t want[16][2], got_v[16][2], t[2] = {first[0], rows > 1 ? first[1] : 0};
    size_t  bytes = sizeof(int32_t) * (size_t)rows;
    TS_OK(kiln_session_set_dim(s, "n", rows));
    make_bias(bias, 0);
    TS_OK(kiln_session_set(s, "bias", bias, sizeof bias));
    TS_OK(kiln_session_set(s, "tok", first, bytes));
    TS_OK(kiln_session_chain_begin(s, "next", "tok"));
    for (int i = 0; i < n; i++) {
        if (i % 2 == 0) {
            make_bias(bias, i);
            TS_OK(kiln_session_set(s, "bias", bias, sizeof bias));
        }
        if (i == 3) { /* a weight set mid-chain (a synchronous copy) reaches run 3 on, not before (runs
                         this short seldom overlap the set, so this does not prove the wait) */
            for (int j = 0; j < V * V; j++) g_table[j] = 10.0f - g_table[j];
            TS_OK(kiln_session_set(s, "table", g_table, sizeof g_table));
        }
        for (int r = 0; r < rows; r++) want[i][r] = t[r] = pick(t[r], bias);
        bool got = true;
        TS_OK(kiln_session_chain_run(s, got_v[i ? i - 1 : 0], bytes, &got));
        ck_assert_msg(got == (i > 0), "%s: run %d: got %d", label, i, got);
        if (got) ck_assert_double_gt(kiln_session_last_ms(s), 0);
    }
    TS_OK(kiln_session_chain_end(s, got_v[n - 1], bytes));
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++)
            ck_assert_msg(got_v[i][r] == want[i][r], "%s: chain of %d, %d rows, run %d row %d: %d, the host's walk %d",
                          label, n, rows, i, r, got_v[i][r], want[i][r]);
    /* After the chain: get gives the last output, and a plain run reads it as tok. */
    int32_t last[2] = {-1, -1}, after[2] = {-1, -1};
    TS_OK(kiln_session_get(s, "next", last, bytes));
    TS_OK(kiln_session_run(s));
    TS_OK(kiln_session_get(s, "next", after, bytes));
    for (int r = 0; r < rows; r++) {
        ck_assert_int_eq(last[r], want[n - 1][r]);
        ck_assert_int_eq(after[r], pick(want[n - 1][r], bias));
    }
}

static void chains(bool no_graph) {
    need_gpu();
    kiln_program *p;
    kiln_graph   *g;
    kiln_ctx     *ctx;
    kiln_session *s = open_session(&p, &g, &ctx, no_graph);
    const char   *label = no_graph ? "plain launches" : "CUDA graph";
    const int32_t a[1] = {3}, b[1] = {5}, c[1] = {11}, d[2] = {2, 9};
    chain_once(s, a, 1, 1, label);
    chain_once(s, b, 1, 2, label);
    chain_once(s, c, 1, 7, label);
    kiln_session_stats st;
    kiln_session_get_stats(s, &st);
    ck_assert_int_eq(st.variant, 1); /* the n = 1 program ran */
    chain_once(s, d, 2, 5, label);   /* the general program, at n = 2 */
    kiln_session_get_stats(s, &st);
    ck_assert_int_eq(st.variant, 0);
    printf("%s: chains of 1, 2, 7 runs (n = 1) and 5 runs (n = 2) agree with the host; %lld runs, %lld captures\n",
           label, (long long)st.runs, (long long)st.captures);
    kiln_session_free(s);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}

START_TEST(chain_matches_host_graph) { chains(false); }
END_TEST

START_TEST(chain_matches_host_plain) { chains(true); }
END_TEST

/* Every weight (the table) uploaded as it is. */
static kiln_status table_init(void *user, const char *name, kiln_type type, const int64_t ne[4], kiln_weight_init *out) {
    out->host = g_table;
    return NULL;
}

static void expect_err(kiln_status e, const char *part) {
    ck_assert_msg(e && strstr(kiln_status_msg(e), part), "want '%s', got: %s", part, e ? kiln_status_msg(e) : "success");
    kiln_status_free(e);
}

START_TEST(chain_misuse) {
    need_gpu();
    kiln_program *p;
    kiln_graph   *g;
    kiln_ctx     *ctx;
    kiln_session *s = open_session(&p, &g, &ctx, false);
    int32_t       t = 1, out;
    float         bias[V];
    make_bias(bias, 0);
    TS_OK(kiln_session_set(s, "bias", bias, sizeof bias));
    TS_OK(kiln_session_set(s, "tok", &t, sizeof t));
    expect_err(kiln_session_chain_run(s, &out, sizeof out, NULL), "no chain is open");
    expect_err(kiln_session_chain_end(s, NULL, 0), "no chain is open");
    expect_err(kiln_session_chain_begin(s, "bias", "tok"), "no output named 'bias'");
    expect_err(kiln_session_chain_begin(s, "next", "table"), "no input named 'table'");
    expect_err(kiln_session_chain_begin(s, "next", "bias"), "must have one size");
    TS_OK(kiln_session_chain_begin(s, "next", "tok"));
    expect_err(kiln_session_chain_begin(s, "next", "tok"), "already open");
    TS_OK(kiln_session_set(s, "tok", &t, sizeof t)); /* before the first run: allowed */
    TS_OK(kiln_session_chain_run(s, &out, sizeof out, NULL));
    expect_err(kiln_session_set(s, "tok", &t, sizeof t), "fed by the open chain from 'next'");
    expect_err(kiln_session_run(s), "a chain is open");
    expect_err(kiln_session_get(s, "next", &out, sizeof out), "a chain is open");
    expect_err(kiln_session_fill_weights(s, table_init, NULL), "a chain is open");
    expect_err(kiln_session_chain_run(s, &out, 2, NULL), "is 4 bytes");
    TS_OK(kiln_session_set_dim(s, "n", 2));
    expect_err(kiln_session_chain_run(s, &out, sizeof out, NULL), "the dims changed since the chain began");
    TS_OK(kiln_session_set_dim(s, "n", 1));
    TS_OK(kiln_session_chain_end(s, &out, sizeof out));
    ck_assert_int_eq(out, pick(1, bias));
    /* An empty chain, and one left open, are fine to end and to free. */
    TS_OK(kiln_session_chain_begin(s, "next", "tok"));
    out = -7;
    TS_OK(kiln_session_chain_end(s, &out, sizeof out));
    ck_assert_int_eq(out, -7);
    TS_OK(kiln_session_chain_begin(s, "next", "tok"));
    TS_OK(kiln_session_chain_run(s, NULL, 0, NULL));
    kiln_session_free(s);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_chain",
                        TS_CASE("all", 300),
                        TS_TESTS(chain_matches_host_graph, chain_matches_host_plain, chain_misuse));
    return ts_main_cache(s, "gpu-chain", &g_cache_dir);
}
