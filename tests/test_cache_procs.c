/* The cache shared by many processes (8 `kiln compile`s of one graph into one empty directory;
 * 8 writers of one key while readers read), and the `kiln cache` command's output and exit
 * codes. */
#include "tests/support.h"

#include "base/base.h"
#include "cache/cache.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------- */

static char kiln_path[4096];

/* The kiln binary beside the test's build directory (build/tests/X -> build/kiln), so that an
 * ASan build tests its own kiln; $KILN_BIN when that is missing. */
static const char *kiln_bin(void) {
    if (kiln_path[0]) return kiln_path;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        snprintf(kiln_path, sizeof kiln_path, "%s/../kiln", dirname(self));
        if (access(kiln_path, X_OK) == 0) return kiln_path;
    }
    const char *b = ts_kiln_bin();
    if (b[0] == '/') snprintf(kiln_path, sizeof kiln_path, "%s", b);
    else snprintf(kiln_path, sizeof kiln_path, "%s/%s", ts_src_dir(), b);
    return kiln_path;
}

/* Runs `kiln ARGS` with the cache in dir (through $KILN_CACHE_DIR); output in *out. */
static int kiln_in(const char *dir, const char *env, const char *args, char **out) {
    kb_str b = {0};
    kb_str_addf(&b, "KILN_CACHE_DIR='%s' %s '%s' %s", dir, env ? env : "", kiln_bin(), args);
    char *cmd = kb_str_take(&b);
    int rc = ts_run(cmd, out);
    free(cmd);
    return rc;
}

static char *path_join(const char *dir, const char *name) {
    kb_str b = {0};
    kb_str_addf(&b, "%s/%s", dir, name);
    return kb_str_take(&b);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static kc_key key_n(int n) {
    char src[64];
    snprintf(src, sizeof src, "__global__ void k%d() {}", n);
    return kc_kernel_key(src, NULL, 0, "sm_90a", 12, 4, 1);
}

static void fill_payload(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(seed >> 56);
    }
}

typedef struct {
    int good, bad, other;
} tally;

static int count_entry(void *user, const kc_entry *e) {
    tally *t = user;
    if (e->corrupt) t->bad++;
    else if (e->meta) t->good++;
    else t->other++;
    return 0;
}

/* ---- 8 compiles of one graph into one empty cache ------------------------------------------ */

enum { PROCS = 8, GRAPH_KERNELS = 4 };

static const char *graph_text = "kiln-graph 1\n"
                                "input x: f32[256, 4]\n"
                                "output y1 = silu(x)\n"
                                "output y2 = gelu(x)\n"
                                "output y3 = tanh(x)\n"
                                "output y4 = sqr(x)\n";

/* Forks a `kiln compile` that waits for the start pipe to close, so that all begin at once. */
static pid_t spawn_compile(const char *graph, const char *cache, const char *log, int start_fd, int start_wr) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (start_wr >= 0) close(start_wr); /* else we would wait for ourselves */
    char c;
    while (read(start_fd, &c, 1) > 0) {
    }
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(100);
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    execl(kiln_bin(), kiln_bin(), "compile", graph, "--cache-dir", cache, (char *)NULL);
    _exit(101);
}

/* The compile's summary: "compiled 4 kernels (4 distinct: N new, C from cache)", or with
 * cached < 0 either that or "loaded 4 kernels (4 distinct) from the program cache" (another
 * process stored the whole program first); cached == PROGRAM_HIT wants the latter. */
enum { ANY = -1, PROGRAM_HIT = -2 };

static void expect_compile_line(const char *log, int fresh, int cached) {
    char *text;
    size_t len;
    TS_OK(kb_read_file(log, &text, &len));
    char want[128], loaded[128];
    snprintf(want, sizeof want, "compiled %d kernels (%d distinct: %d new, %d from cache)", GRAPH_KERNELS,
             GRAPH_KERNELS, fresh, cached);
    if (cached == ANY) snprintf(want, sizeof want, "compiled %d kernels (%d distinct: ", GRAPH_KERNELS, GRAPH_KERNELS);
    snprintf(loaded, sizeof loaded, "loaded %d kernels (%d distinct) from the program cache", GRAPH_KERNELS,
             GRAPH_KERNELS);
    bool ok = cached == PROGRAM_HIT ? strstr(text, loaded) != NULL
                                    : strstr(text, want) || (cached == ANY && strstr(text, loaded));
    ck_assert_msg(ok, "%s: want '%s' in:\n%s", log, cached == PROGRAM_HIT ? loaded : want, text);
    ck_assert_msg(!strstr(text, "corrupt"), "%s:\n%s", log, text);
    free(text);
}

/* Runs one more `kiln compile` of graph into cache and checks its summary line. */
static void compile_again(const char *work, const char *graph, const char *cache, int fresh, int cached) {
    char *log = path_join(work, "again.txt");
    int never[2];
    ck_assert_int_eq(pipe(never), 0);
    close(never[1]);
    pid_t pid = spawn_compile(graph, cache, log, never[0], -1);
    close(never[0]);
    int status = 0;
    ck_assert(pid > 0 && waitpid(pid, &status, 0) == pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    expect_compile_line(log, fresh, cached);
    free(log);
}

START_TEST(eight_compiles_share_one_empty_cache) {
    char *work = ts_tmpdir();
    char *cache = path_join(work, "cache"), *graph = path_join(work, "g.kg");
    TS_OK(kb_write_file(graph, graph_text, strlen(graph_text)));
    int start[2];
    ck_assert_int_eq(pipe(start), 0);
    pid_t pids[PROCS];
    char *logs[PROCS];
    for (int i = 0; i < PROCS; i++) {
        char name[32];
        snprintf(name, sizeof name, "out%d.txt", i);
        logs[i] = path_join(work, name);
        pids[i] = spawn_compile(graph, cache, logs[i], start[0], start[1]);
        ck_assert(pids[i] > 0);
    }
    close(start[0]);
    close(start[1]); /* go */
    for (int i = 0; i < PROCS; i++) {
        int status = 0;
        ck_assert(waitpid(pids[i], &status, 0) == pids[i]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "compile %d: status %d", i, status);
        expect_compile_line(logs[i], ANY, ANY);
    }

    /* Every entry (the kernels and the program) verifies, through the command and through the
     * API; no temporary files. */
    char *out = NULL;
    kb_str b = {0};
    kb_str_addf(&b, "cache verify --cache-dir '%s'", cache);
    char *args = kb_str_take(&b);
    ck_assert_msg(kiln_in(work, NULL, args, &out) == 0, "%s", out);
    char want[64];
    snprintf(want, sizeof want, "verified %d entries: %d good, 0 bad\n", GRAPH_KERNELS + 1, GRAPH_KERNELS + 1);
    ck_assert_msg(strstr(out, want) && !strstr(out, "temporary"), "%s", out);
    free(out);
    kc_cache c = {.dir = cache, .mode = KILN_CACHE_READONLY};
    tally t = {0};
    TS_OK(kc_walk(&c, true, count_entry, &t));
    ck_assert_int_eq(t.good, GRAPH_KERNELS + 1);
    ck_assert_int_eq(t.bad + t.other, 0);
    int tmps = -1;
    TS_OK(kc_tmp_files(&c, 0, false, &tmps, NULL));
    ck_assert_int_eq(tmps, 0);

    /* A ninth compile is all hits: the whole program; without it, every kernel. */
    compile_again(work, graph, cache, 0, PROGRAM_HIT);
    char *programs = path_join(cache, "programs");
    ts_tmpdir_free(programs);
    compile_again(work, graph, cache, 0, GRAPH_KERNELS);

    for (int i = 0; i < PROCS; i++) free(logs[i]);
    free(args);
    free(graph);
    free(cache);
    ts_tmpdir_free(work);
}
END_TEST

/* ---- 8 writers of one key, and readers ------------------------------------------------------ */

enum { WRITERS = 8, READERS = 4, ROUNDS = 60 };

/* Payloads say who wrote them and how long they are, so a reader can check it got one writer's
 * whole payload. */
static size_t make_payload(uint8_t *buf, int writer, int round) {
    size_t n = 64 + (size_t)((writer * 7919 + round * 104729) % 20000);
    buf[0] = (uint8_t)writer;
    buf[1] = (uint8_t)round;
    fill_payload(buf + 2, n - 2, (uint64_t)(writer * 1000 + round));
    return n;
}

static uint8_t want_buf[64 + 20000];

static int payload_ok(const uint8_t *p, size_t n) {
    if (n < 2 || p[0] >= WRITERS || p[1] >= ROUNDS) return 0;
    size_t wn = make_payload(want_buf, p[0], p[1]);
    return wn == n && memcmp(want_buf, p, n) == 0;
}

static int writer_main(const char *dir, int w) {
    kc_cache c = {.dir = (char *)dir, .mode = KILN_CACHE_ON};
    static uint8_t buf[64 + 20000];
    for (int r = 0; r < ROUNDS; r++) {
        char meta[64];
        snprintf(meta, sizeof meta, "writer %d round %d", w, r);
        size_t n = make_payload(buf, w, r);
        kiln_status st = kc_put(&c, w % 2 ? KC_PROGRAM : KC_CUBIN, key_n(7), meta, buf, n);
        if (st) return 10;
    }
    return 0;
}

/* Reads both kinds of the shared key until the writers are done (done_path exists); every hit
 * must be a whole payload, nothing may look corrupt. Exit 0 only if it saw hits. */
static int reader_main(const char *dir, const char *done_path) {
    kc_cache c = {.dir = (char *)dir, .mode = KILN_CACHE_ON, .log = NULL};
    int hits = 0;
    for (int i = 0; !file_exists(done_path) || i < 200; i++) {
        void *data = NULL;
        size_t size = 0;
        int corrupt = 0;
        kiln_status st = kc_get(&c, i % 2 ? KC_PROGRAM : KC_CUBIN, key_n(7), &data, &size, &corrupt);
        if (st) return 20;
        if (corrupt) return 21;
        if (data && !payload_ok(data, size)) return 22;
        hits += data != NULL;
        free(data);
    }
    return hits ? 0 : 23;
}

START_TEST(one_key_many_writers_and_readers) {
    char *work = ts_tmpdir();
    char *dir = path_join(work, "cache"), *done = path_join(work, "done");
    pid_t readers[READERS], writers[WRITERS];
    for (int i = 0; i < READERS; i++)
        if ((readers[i] = fork()) == 0) _exit(reader_main(dir, done));
    for (int w = 0; w < WRITERS; w++)
        if ((writers[w] = fork()) == 0) _exit(writer_main(dir, w));
    for (int w = 0; w < WRITERS; w++) {
        int status = 0;
        ck_assert(writers[w] > 0 && waitpid(writers[w], &status, 0) == writers[w]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d: status %d", w, status);
    }
    TS_OK(kb_write_file(done, "", 0));
    for (int i = 0; i < READERS; i++) {
        int status = 0;
        ck_assert(readers[i] > 0 && waitpid(readers[i], &status, 0) == readers[i]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "reader %d: status %d", i, status);
    }
    /* Exactly the two entries, each one writer's last round, whole; no temporary files left. */
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    tally t = {0};
    TS_OK(kc_walk(&c, true, count_entry, &t));
    ck_assert_int_eq(t.good, 2);
    ck_assert_int_eq(t.bad + t.other, 0);
    for (int k = 0; k < 2; k++) {
        void *data = NULL;
        size_t size = 0;
        TS_OK(kc_get(&c, k ? KC_PROGRAM : KC_CUBIN, key_n(7), &data, &size, NULL));
        ck_assert(data && payload_ok(data, size));
        ck_assert_int_eq(((uint8_t *)data)[1], ROUNDS - 1);
        ck_assert_int_eq(((uint8_t *)data)[0] % 2, k);
        free(data);
    }
    int tmps = -1;
    TS_OK(kc_tmp_files(&c, 0, false, &tmps, NULL));
    ck_assert_int_eq(tmps, 0);
    free(dir);
    free(done);
    ts_tmpdir_free(work);
}
END_TEST

/* ---- kiln cache ----------------------------------------------------------------------------- */

static char *cli_dir;

static void cli_setup(void) { cli_dir = ts_tmpdir(); }
static void cli_teardown(void) {
    ts_tmpdir_free(cli_dir);
}

/* Two kernels and one program, with meta; returns the total bytes. */
static uint64_t populate(kc_cache *c) {
    uint8_t payload[3000];
    fill_payload(payload, sizeof payload, 3);
    TS_OK(kc_put(c, KC_CUBIN, key_n(1), "kernel silu_f32\nsource 100 bytes", payload, 1000));
    TS_OK(kc_put(c, KC_CUBIN, key_n(2), NULL, payload, 2000));
    TS_OK(kc_put(c, KC_PROGRAM, key_n(3), "program decode", payload, 3000));
    uint64_t total = 0;
    for (int i = 1; i <= 3; i++) {
        char *p = kc_entry_path(c, i == 3 ? KC_PROGRAM : KC_CUBIN, key_n(i));
        struct stat st;
        ck_assert_int_eq(stat(p, &st), 0);
        total += (uint64_t)st.st_size;
        free(p);
    }
    return total;
}

static void expect_out(int rc, int want_rc, char *out, const char *const *needles) {
    ck_assert_msg(rc == want_rc, "exit %d, want %d:\n%s", rc, want_rc, out);
    for (int i = 0; needles[i]; i++) ck_assert_msg(strstr(out, needles[i]), "want '%s' in:\n%s", needles[i], out);
    free(out);
}

/* Runs `kiln ARGS` (with env) on the test's cache; checks the exit status and that the output
 * holds each of the strings that follow. */
#define EXPECT(env, args, want_rc, ...)                                                   \
    do {                                                                                 \
        char *out_ = NULL;                                                               \
        int rc_ = kiln_in(cli_dir, env, args, &out_);                                    \
        expect_out(rc_, want_rc, out_, (const char *const[]){__VA_ARGS__, NULL});        \
    } while (0)

START_TEST(cache_ls_and_stats) {
    kc_cache c = {.dir = cli_dir, .mode = KILN_CACHE_ON};
    char *out;
    EXPECT(NULL, "cache ls", 0, "0 entries, 0 bytes");
    EXPECT(NULL, "cache stats", 0, "total:           0 entries", "oldest use:      -\n");
    EXPECT(NULL, "cache stats --cache-dir /nonexistent/kiln", 0, "/nonexistent/kiln (does not exist yet)");
    uint64_t total = populate(&c);
    char h1[33], h2[33], h3[33], line[160], sum[64];
    kc_key_hex(key_n(1), h1);
    kc_key_hex(key_n(2), h2);
    kc_key_hex(key_n(3), h3);
    snprintf(sum, sizeof sum, "3 entries, %llu bytes", (unsigned long long)total);
    snprintf(line, sizeof line, "kernel   %s       %4d  ", h1, 80 + 32 + 1000);
    int rc = kiln_in(cli_dir, NULL, "cache ls", &out);
    ck_assert_msg(strstr(out, line), "want '%s' in:\n%s", line, out);
    expect_out(rc, 0, out, (const char *const[]){"KIND     KEY", "  kernel silu_f32\n", "  -\n", "  program decode\n", h2, h3, sum, NULL});
    rc = kiln_in(cli_dir, NULL, "cache ls --programs", &out);
    ck_assert_msg(!strstr(out, h1) && !strstr(out, h2), "%s", out);
    expect_out(rc, 0, out, (const char *const[]){h3, "1 entry, 3", NULL});
    rc = kiln_in(cli_dir, NULL, "cache ls --kernels", &out);
    ck_assert_msg(!strstr(out, h3), "%s", out);
    expect_out(rc, 0, out, (const char *const[]){h1, h2, "2 entries, 3", NULL});

    /* Oldest and newest use come from the entries' mtimes. */
    char *p = kc_entry_path(&c, KC_CUBIN, key_n(2));
    struct timespec ts[2] = {{.tv_sec = 1700000000}, {.tv_sec = 1700000000}};
    ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
    free(p);
    snprintf(sum, sizeof sum, "total:           3 entries, %llu bytes", (unsigned long long)total);
    EXPECT("KILN_CACHE_MAX=1M", "cache stats", 0, "cache directory: ", cli_dir,
           "kernels:         2 entries", "programs:        1 entry,", sum, "limit:           1048576 bytes (1.0 MiB",
           "% used", "oldest use:      2023-11-14T22:13:20Z", "temporary files: 0");
    EXPECT("KILN_CACHE_MAX=0", "cache stats", 0, "limit:           none");
    EXPECT("KILN_CACHE_MAX=huge", "cache stats", 1, "KILN_CACHE_MAX", "'huge'");
}
END_TEST

START_TEST(cache_verify_and_repair) {
    kc_cache c = {.dir = cli_dir, .mode = KILN_CACHE_ON};
    populate(&c);
    EXPECT(NULL, "cache verify", 0, "verified 3 entries: 3 good, 0 bad\n");
    /* Damage one entry's payload; plant an old and a young temporary file. */
    char *bad = kc_entry_path(&c, KC_PROGRAM, key_n(3));
    char *raw;
    size_t len;
    TS_OK(kb_read_file(bad, &raw, &len));
    raw[len - 1] ^= 1;
    TS_OK(kb_write_file(bad, raw, len));
    free(raw);
    char *sub = strdup(bad);
    *strrchr(sub, '/') = 0;
    char *old_tmp = path_join(sub, ".tmp.1.old"), *young_tmp = path_join(sub, ".tmp.1.young");
    TS_OK(kb_write_file(old_tmp, "x", 1));
    TS_OK(kb_write_file(young_tmp, "x", 1));
    struct timespec ts[2] = {{.tv_sec = time(NULL) - 7200}, {.tv_sec = time(NULL) - 7200}};
    ck_assert_int_eq(utimensat(AT_FDCWD, old_tmp, ts, 0), 0);

    char want[4200];
    snprintf(want, sizeof want, "bad: %s: payload checksum mismatch\n", bad);
    EXPECT(NULL, "cache verify", 1, want, "verified 3 entries: 2 good, 1 bad\n",
           "temporary files: 2", "1 older than an hour");
    ck_assert(file_exists(bad) && file_exists(old_tmp));
    EXPECT(NULL, "cache verify --repair", 0, want, "removed 1 bad entry\n",
           "1 older than an hour: removed");
    ck_assert(!file_exists(bad) && !file_exists(old_tmp) && file_exists(young_tmp));
    EXPECT(NULL, "cache verify", 0, "verified 2 entries: 2 good, 0 bad\n");
    free(sub);
    free(old_tmp);
    free(young_tmp);
    free(bad);
}
END_TEST

START_TEST(cache_clear_evict_and_usage) {
    kc_cache c = {.dir = cli_dir, .mode = KILN_CACHE_ON};
    uint64_t total = populate(&c);
    char want[256];
    /* --cache-dir wins over $KILN_CACHE_DIR. */
    char *other = path_join(cli_dir, "other");
    kb_str b = {0};
    kb_str_addf(&b, "cache ls --cache-dir '%s'", other);
    char *args = kb_str_take(&b);
    EXPECT(NULL, args, 0, "0 entries");
    free(args);
    /* Evicting to a limit below the size of all: the oldest goes (the kernel of key 1). */
    char *p1 = kc_entry_path(&c, KC_CUBIN, key_n(1));
    struct timespec ts[2] = {{.tv_sec = 1000}, {.tv_sec = 1000}};
    ck_assert_int_eq(utimensat(AT_FDCWD, p1, ts, 0), 0);
    snprintf(want, sizeof want, "evicted 1 entry; %llu bytes", (unsigned long long)(total - (80 + 32 + 1000)));
    EXPECT(NULL, "cache evict --max 6k", 0, want, "limit 6.0 KiB");
    ck_assert(!file_exists(p1));
    EXPECT(NULL, "cache evict --max 6x", 2, "--max", "'6x'");
    snprintf(want, sizeof want, "removed 2 entries (%llu bytes", (unsigned long long)(total - (80 + 32 + 1000)));
    EXPECT(NULL, "cache clear", 0, want, "0 temporary files from ", cli_dir);
    EXPECT(NULL, "cache ls", 0, "0 entries, 0 bytes");
    free(p1);
    free(other);

    /* Usage errors exit 2 (explain, tools/cmd_cache_explain.c, parses its own). */
    EXPECT(NULL, "cache", 2, "give a subcommand");
    EXPECT(NULL, "cache frob", 2, "unknown subcommand 'frob'");
    EXPECT(NULL, "cache ls --repair", 2, "--repair is for verify");
    EXPECT(NULL, "cache ls --bogus", 2, "unknown option '--bogus'");
    EXPECT(NULL, "cache ls --cache-dir", 2, "needs a value");
    EXPECT(NULL, "cache explain", 2, "no graph file given");
    EXPECT(NULL, "help cache", 0, "verify [--repair]", "KILN_CACHE_MAX");
    EXPECT(NULL, "cache --help", 0, "usage: kiln cache");
    EXPECT(NULL, "--help", 0, "cache SUB", "KILN_CACHE_MAX");
    /* A cache directory that is a file: the error names the path. */
    EXPECT(NULL, "cache ls --cache-dir /dev/null", 1, "/dev/null");
    EXPECT(NULL, "cache verify --cache-dir /dev/null", 1, "/dev/null");
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("cache_procs",
                        TS_CASE("processes", 120),
                        TS_TESTS(eight_compiles_share_one_empty_cache, one_key_many_writers_and_readers),
                        TS_CASE_FIXTURE("cli", 60, cli_setup, cli_teardown),
                        TS_TESTS(cache_ls_and_stats, cache_verify_and_repair, cache_clear_evict_and_usage));
    return ts_main(s);
}
