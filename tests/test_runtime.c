/* Runtime tests that need no GPU: argument validation, and the errors a machine without a CUDA
 * driver or device gets. On a machine with a GPU the no-driver assertions are skipped with a
 * note (tests/gpu/ covers that case), except the one that forces a missing driver. */
#include "tests/support.h"

#include "runtime/runtime.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* x: f32 [64, 4] input, w: f32 [64] weight, y = silu(x * w), through the .kg parser. */
static kiln_ctx *small_graph(kiln_graph **g) {
    kiln_ctx *ctx = ts_parse("kiln-graph 1\n"
                             "input x: f32[64, 4]\n"
                             "weight w: f32[64]\n"
                             "m = mul(x, w)\n"
                             "output y = silu(m)\n");
    TS_OK(kiln_graph_new(ctx, g));
    return ctx;
}

static kiln_program *compile_small(kiln_ctx **ctx, kiln_graph **g, char **cache, int skip_nvrtc) {
    *ctx = small_graph(g);
    *cache = ts_tmpdir();
    kiln_compile_opts opts = {0};
    opts.cache_dir = *cache;
    opts.skip_nvrtc = skip_nvrtc;
    kiln_program *p = NULL;
    TS_OK(kiln_compile(*g, &opts, &p));
    ck_assert_ptr_nonnull(p);
    return p;
}

static void free_small(kiln_ctx *ctx, kiln_graph *g, kiln_program *p, char *cache) {
    ts_compiled_free(p, g, ctx);
    ts_tmpdir_free(cache);
}

static bool have_gpu(void) {
    kiln_status st = rt_driver_init();
    bool        ok = st == NULL;
    kiln_status_free(st);
    return ok;
}

static void expect_code(kiln_status st, kiln_code code, const char *what) {
    ck_assert_msg(st != NULL, "%s: expected %s, got success", what, kiln_code_name(code));
    ck_assert_msg(kiln_status_code(st) == code, "%s: expected %s, got %s: %s", what,
                  kiln_code_name(code), kiln_code_name(kiln_status_code(st)), kiln_status_msg(st));
    ck_assert_msg(kiln_status_msg(st)[0] != 0, "%s: empty message", what);
    kiln_status_free(st);
}

START_TEST(test_null_args) {
    kiln_session *s = (kiln_session *)&s; /* must be reset to NULL on failure */
    expect_code(kiln_session_new(NULL, NULL, &s), KILN_ERR_INVALID, "session_new(NULL program)");
    ck_assert_ptr_null(s);
    expect_code(kiln_session_new(NULL, NULL, NULL), KILN_ERR_INVALID, "session_new(out NULL)");
    float v[4] = {0};
    expect_code(kiln_session_set(NULL, "x", v, sizeof v), KILN_ERR_INVALID, "session_set(NULL)");
    expect_code(kiln_session_get(NULL, "x", v, sizeof v), KILN_ERR_INVALID, "session_get(NULL)");
    expect_code(kiln_session_run(NULL), KILN_ERR_INVALID, "session_run(NULL)");
    kiln_session_free(NULL);
    ck_assert(kiln_session_last_ms(NULL) == 0.0);
    ck_assert_int_eq(kiln_session_captures(NULL), 0);
    char arch[16];
    expect_code(rt_device_arch(0, NULL), KILN_ERR_INVALID, "rt_device_arch(out NULL)");
    (void)arch;
}
END_TEST

START_TEST(test_null_out_with_program) {
    kiln_ctx   *ctx;
    kiln_graph *g;
    char       *cache;
    kiln_program *p = compile_small(&ctx, &g, &cache, 1);
    expect_code(kiln_session_new(p, NULL, NULL), KILN_ERR_INVALID, "session_new(p, out NULL)");
    kiln_session_opts o = {.device = -1};
    kiln_session     *s = NULL;
    expect_code(kiln_session_new(p, &o, &s), KILN_ERR_INVALID, "session_new(device -1)");
    ck_assert_ptr_null(s);
    free_small(ctx, g, p, cache);
}
END_TEST

START_TEST(test_no_gpu) {
    if (have_gpu()) {
        printf("note: test_no_gpu: a CUDA driver and GPU are present; the no-GPU assertion is "
               "skipped (tests/gpu covers sessions)\n");
        return;
    }
    kiln_ctx   *ctx;
    kiln_graph *g;
    char       *cache;
    kiln_program *p = compile_small(&ctx, &g, &cache, 0);
    kiln_session *s = (kiln_session *)&s;
    kiln_status   st = kiln_session_new(p, NULL, &s);
    ck_assert_ptr_null(s);
    ck_assert_msg(kiln_status_code(st) == KILN_ERR_NO_GPU, "expected no-gpu, got %s: %s",
                  kiln_code_name(kiln_status_code(st)), kiln_status_msg(st));
    ck_assert_msg(strstr(kiln_status_msg(st), "driver") != NULL,
                  "the message should mention the driver: %s", kiln_status_msg(st));
    kiln_status_free(st);

    /* The same answer every time (the failed initialisation is remembered). */
    st = kiln_session_new(p, NULL, &s);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NO_GPU);
    kiln_status_free(st);
    char arch[16];
    st = rt_device_arch(0, arch);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NO_GPU);
    kiln_status_free(st);
    int n = -1; /* kiln_device_count: the same answer, and 0 devices */
    st = kiln_device_count(&n);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NO_GPU);
    ck_assert_int_eq(n, 0);
    kiln_status_free(st);
    st = kiln_device_count(NULL);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);

    /* A sources-only program on a machine without a GPU: no GPU is the first problem. */
    kiln_program *src_only = NULL;
    kiln_compile_opts opts = {.cache_dir = cache, .skip_nvrtc = 1};
    TS_OK(kiln_compile(g, &opts, &src_only));
    st = kiln_session_new(src_only, NULL, &s);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NO_GPU);
    kiln_status_free(st);
    kiln_program_free(src_only);
    free_small(ctx, g, p, cache);
}
END_TEST

/* $KILN_LIBCUDA names the driver library to load (a test hook); a path that does not exist
 * behaves like a machine without a driver, GPU or not. Only meaningful while the driver has
 * not been initialised in this process, so only in fork mode (each test a fresh child). */
START_TEST(test_forced_missing_driver) {
    const char *fork_env = getenv("CK_FORK");
    if (fork_env && strcmp(fork_env, "no") == 0) {
        printf("note: test_forced_missing_driver skipped with CK_FORK=no\n");
        return;
    }
    setenv("KILN_LIBCUDA", "/nonexistent/kiln-test/libcuda.so.1", 1);
    kiln_status st = rt_driver_init();
    ck_assert_msg(kiln_status_code(st) == KILN_ERR_NO_GPU, "expected no-gpu, got %s: %s",
                  kiln_code_name(kiln_status_code(st)), kiln_status_msg(st));
    ck_assert_msg(strstr(kiln_status_msg(st), "no CUDA driver found") != NULL &&
                      strstr(kiln_status_msg(st), "/nonexistent/kiln-test/libcuda.so.1") != NULL,
                  "message: %s", kiln_status_msg(st));
    kiln_status_free(st);
    ck_assert_ptr_null(rt_cuda());

    kiln_ctx   *ctx;
    kiln_graph *g;
    char       *cache;
    kiln_program *p = compile_small(&ctx, &g, &cache, 1);
    kiln_session *s = NULL;
    st = kiln_session_new(p, NULL, &s);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NO_GPU);
    ck_assert_msg(strstr(kiln_status_msg(st), "driver") != NULL, "message: %s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    free_small(ctx, g, p, cache);
    unsetenv("KILN_LIBCUDA");
}
END_TEST

static void *init_thread(void *arg) {
    kiln_status *out = arg;
    *out = rt_driver_init();
    return NULL;
}

/* rt_driver_init from many threads at once gives one consistent answer. */
START_TEST(test_init_threads) {
#define NT 8
    pthread_t   th[NT];
    kiln_status st[NT];
    for (int i = 0; i < NT; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, init_thread, &st[i]), 0);
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    for (int i = 1; i < NT; i++) {
        ck_assert_int_eq(kiln_status_code(st[i]), kiln_status_code(st[0]));
        ck_assert_str_eq(kiln_status_msg(st[i]), kiln_status_msg(st[0]));
    }
    for (int i = 0; i < NT; i++) kiln_status_free(st[i]);
#undef NT
}
END_TEST

/* NCCL (runtime/nccl.c) through dlopen: where it is missing, KILN_ERR_NO_GPU naming the library
 * tried and what to install; where it loads, its version is NCCL 2's. Either way NVLink multicast
 * is off in the process afterwards (NCCL_NVLS_ENABLE=0, which a value set before would keep). */
START_TEST(test_nccl_loads_or_says_what_is_missing) {
    unsetenv("NCCL_NVLS_ENABLE");
    setenv("KILN_NCCL_LIB", "/nonexistent/libnccl-kiln-test.so.2", 1);
    const rt_nccl_api *api = NULL;
    kiln_status        st = rt_nccl_init(&api);
    ck_assert_str_eq(getenv("NCCL_NVLS_ENABLE"), "0");
    if (st) {
        ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NO_GPU);
        ck_assert_msg(strstr(kiln_status_msg(st), "cannot load NCCL (/nonexistent/libnccl-kiln-test.so.2: ") &&
                          strstr(kiln_status_msg(st), "libnccl2"), "%s", kiln_status_msg(st));
        ck_assert_ptr_null(api);
        kiln_status_free(st);
    } else { /* a machine with NCCL: the fallback names found it */
        int v = 0;
        ck_assert_int_eq(api->GetVersion(&v), 0);
        ck_assert_int_ge(v, 20000);
    }
    unsetenv("KILN_NCCL_LIB");
}
END_TEST

/* ---- rt_ranks (runtime/ranks.c: kiln_group's runs) ----------------------------------------- */

enum { RANKS = 4, RUNS = 300 };

typedef struct {
    int   calls[RANKS]; /* each rank's calls, written by its own thread only */
    int   fail_rank, fail_run, fails;
    int   run;          /* the run in progress (set by the caller between runs) */
    pthread_barrier_t meet; /* every rank inside one call at once, as an all_reduce needs */
    bool  barrier;
} ranks_data;

static kiln_status rank_fn(void *user, int rank) {
    ranks_data *d = user;
    d->calls[rank]++;
    if (d->barrier) pthread_barrier_wait(&d->meet); /* deadlocks unless all ranks run at once */
    if (rank == d->fail_rank && d->run == d->fail_run) return kb_error(KILN_ERR_CUDA, "rank %d gave up", rank);
    return NULL;
}

static void rank_fail(void *user, int rank) {
    ranks_data *d = user;
    ck_assert_int_eq(rank, d->fail_rank);
    d->fails++;
}

/* Every run calls every rank once, all of them at once (a barrier of all four inside the call
 * would hang otherwise); 300 runs in a row; the first failure calls fail once, the run returns
 * that rank's error, and later runs fail at once naming it, calling no rank. */
START_TEST(ranks_run_together) {
    ranks_data d = {.fail_rank = 2, .fail_run = RUNS, .barrier = true};
    pthread_barrier_init(&d.meet, NULL, RANKS);
    rt_ranks *p;
    TS_OK(rt_ranks_new(RANKS, rank_fn, rank_fail, &d, &p));
    for (d.run = 0; d.run < RUNS; d.run++) {
        int failed;
        TS_OK(rt_ranks_run(p, &failed));
        ck_assert_int_eq(failed, -1);
        for (int r = 0; r < RANKS; r++) ck_assert_int_eq(d.calls[r], d.run + 1);
    }
    ck_assert_int_eq(rt_ranks_broken(p), -1);
    int failed;
    kiln_status st = rt_ranks_run(p, &failed); /* run RUNS: rank 2 fails */
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(failed, 2);
    ck_assert_msg(strstr(kiln_status_msg(st), "rank 2 gave up"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    ck_assert_int_eq(d.fails, 1);
    ck_assert_int_eq(rt_ranks_broken(p), 2);
    ts_expect_status(rt_ranks_run(p, &failed), KILN_ERR_INVALID, "rank 2 failed in an earlier run");
    for (int r = 0; r < RANKS; r++) ck_assert_int_eq(d.calls[r], RUNS + 1); /* the refused run called none */
    ck_assert_int_eq(d.fails, 1);
    rt_ranks_free(p);
    pthread_barrier_destroy(&d.meet);
    /* rank 0 (the caller's thread) failing, one rank alone, bad arguments */
    d = (ranks_data){.fail_rank = 0, .fail_run = 0};
    TS_OK(rt_ranks_new(3, rank_fn, rank_fail, &d, &p));
    st = rt_ranks_run(p, &failed);
    ck_assert_msg(st && failed == 0 && strstr(kiln_status_msg(st), "rank 0 gave up"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    rt_ranks_free(p);
    d = (ranks_data){.fail_rank = -1};
    TS_OK(rt_ranks_new(1, rank_fn, NULL, &d, &p));
    TS_OK(rt_ranks_run(p, &failed));
    ck_assert_int_eq(d.calls[0], 1);
    rt_ranks_free(p);
    ts_expect_status(rt_ranks_new(0, rank_fn, NULL, &d, &p), KILN_ERR_INVALID, "0 ranks");
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("runtime",
                        TS_CASE("cpu", 60),
                        TS_TESTS(test_null_args, test_null_out_with_program, test_no_gpu, test_forced_missing_driver,
                                 test_init_threads, test_nccl_loads_or_says_what_is_missing, ranks_run_together));
    return ts_main(s);
}
