/* Tests of AOT bundles (issue 7, codegen/bundle.c): round trip for several archs, which target
 * a GPU gets (cubin of its major version, else PTX), refusal when nothing fits, deterministic
 * writing, damage (truncation, bit flips) and foreign bundles (another kiln version, another
 * graph) refused with messages that say why, and the cli (compile -o, inspect, run --bundle).
 *
 * CPU only: NVRTC compiles, nothing runs. main() points KILN_CACHE_DIR at a temporary directory
 * (shared by the tests: later ones start warm). */
#include "tests/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Two kernels: the general one and the n = 1 specialization. */
static const char *kg_spec = "kiln-graph 1\n"
                             "dim n <= 8 specialize 1\n"
                             "input x: f32[64, n]\n"
                             "weight w: f32[64]\n"
                             "y0 = mul(x, w)\n"
                             "output y = silu(y0)\n";

/* ---- helpers -------------------------------------------------------------------------------- */

typedef struct {
    kiln_ctx   *ctx;
    kiln_graph *g;
} parsed;

static parsed parse(const char *kg) {
    parsed p = {ts_parse(kg), NULL};
    TS_OK(kiln_graph_new(p.ctx, &p.g));
    return p;
}

static void parsed_free(parsed *p) {
    kiln_graph_free(p->g);
    kiln_ctx_free(p->ctx);
}

static void write_bundle(const char *kg, int narchs, const char *const *archs, const char *path) {
    parsed            p = parse(kg);
    kiln_compile_opts o = {0};
    TS_OK(kiln_bundle_write(p.g, &o, narchs, archs, path));
    parsed_free(&p);
}

static void write_all(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    ck_assert_int_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* The last 20 bytes: "SUM " + XXH3-128 (canonical) of every byte before them. */
static void reseal(char *data, size_t n) {
    ck_assert_uint_gt(n, 20);
    ck_assert_int_eq(memcmp(data + n - 20, "SUM ", 4), 0);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, n - 20));
    memcpy(data + n - 16, c.digest, 16);
}

static char *find_bytes(char *data, size_t n, const char *what) {
    size_t wl = strlen(what);
    for (size_t i = 0; i + wl <= n; i++)
        if (!memcmp(data + i, what, wl)) return data + i;
    return NULL;
}

/* Opening path must fail with KILN_ERR_FORMAT and a message naming the file (and `want`). */
static void expect_refused(const char *path, const char *want, const char *what) {
    kiln_bundle *b = (kiln_bundle *)1;
    kiln_status  st = kiln_bundle_open(path, &b);
    ck_assert_msg(st != NULL, "%s: bundle opened", what);
    ck_assert_ptr_null(b);
    ck_assert_msg(kiln_status_code(st) == KILN_ERR_FORMAT, "%s: %s (%s)", what, kiln_code_name(kiln_status_code(st)),
                  kiln_status_msg(st));
    ck_assert_msg(strstr(kiln_status_msg(st), path), "%s: message does not name the file: %s", what, kiln_status_msg(st));
    ck_assert_msg(!want || strstr(kiln_status_msg(st), want), "%s: message lacks '%s': %s", what, want,
                  kiln_status_msg(st));
    kiln_status_free(st);
}

static char *first_line_of_describe(const kiln_program *p) {
    char *t = NULL;
    TS_OK(kiln_program_describe(p, &t));
    t[strcspn(t, "\n")] = 0;
    return t;
}

static const char *const two_archs[] = {"sm_90a", "sm_80"};

/* ---- round trip ----------------------------------------------------------------------------- */

/* The program for device arch dev: its first describe line names `want`. */
static kiln_program *program_for(const kiln_bundle *b, const parsed *p, const char *dev, const char *want) {
    kiln_program *prog = NULL;
    TS_OK(kiln_bundle_program(b, p->g, dev, &prog));
    char *line = first_line_of_describe(prog), expect[64];
    snprintf(expect, sizeof expect, "kiln %s program for %s", KILN_VERSION, want);
    ck_assert_msg(!strcmp(line, expect), "device %s: got '%s', expected '%s'", dev, line, expect);
    free(line);
    return prog;
}

START_TEST(round_trip) {
    char *dir = ts_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/g.kiln", dir);
    write_bundle(kg_spec, 2, two_archs, path);
    kiln_bundle *b = NULL;
    TS_OK(kiln_bundle_open(path, &b));
    ck_assert_str_eq(kiln_bundle_graph_text(b), kg_spec); /* kg_spec is in canonical form */
    char *text = NULL;
    TS_OK(kiln_bundle_describe(b, &text));
    static const char *const targets[] = {"target sm_90a: cubins", "target compute_90a: PTX", "target sm_80: cubins",
                                          "target compute_80: PTX"};
    for (int i = 0; i < 4; i++) ck_assert_msg(strstr(text, targets[i]), "describe lacks '%s':\n%s", targets[i], text);
    ck_assert_msg(strstr(text, "checksum ok") && strstr(text, "kiln " KILN_VERSION), "describe:\n%s", text);
    ck_assert_msg(strstr(text, "targets sm_90a compute_90a sm_80 compute_80"), "signature targets:\n%s", text);
    int verified = 0;
    for (const char *s = text; (s = strstr(s, "verified against the graph")); s++) verified++;
    ck_assert_msg(verified == 4, "%d targets verified:\n%s", verified, text);
    ck_assert_msg(strstr(text, "2 kernels in 2 programs"), "the specialization is missing:\n%s", text);
    free(text);

    parsed p = parse(kiln_bundle_graph_text(b));
    /* sm_90a: the same program kiln_compile gives. */
    kiln_program *bp = program_for(b, &p, "sm_90a", "sm_90a");
    parsed        q = parse(kg_spec);
    kiln_compile_opts o = {.arch = "sm_90a"};
    kiln_program *cp = NULL;
    TS_OK(kiln_compile(q.g, &o, &cp));
    char *d1 = NULL, *d2 = NULL;
    TS_OK(kiln_program_describe(bp, &d1));
    TS_OK(kiln_program_describe(cp, &d2));
    ck_assert_msg(!strcmp(d1, d2), "bundle program differs from kiln_compile's:\n%s\n----\n%s", d1, d2);
    ck_assert_msg(strstr(d1, "specialization 1: n = 1"), "no specialization:\n%s", d1);
    free(d1);
    free(d2);
    ck_assert_int_eq(kiln_program_kernel_count(bp), kiln_program_kernel_count(cp));
    for (int i = 0; i < kiln_program_kernel_count(cp); i++) {
        ck_assert_str_eq(kiln_program_kernel_source(bp, i), kiln_program_kernel_source(cp, i));
        ck_assert_str_eq(kiln_program_kernel_key(bp, i), kiln_program_kernel_key(cp, i));
        ck_assert_str_eq(kiln_program_kernel_name(bp, i), kiln_program_kernel_name(cp, i));
    }
    kiln_program_free(bp);
    kiln_program_free(cp);
    parsed_free(&q);

    /* Later GPUs of a major version take its cubins; other majors the portable PTX. */
    static const struct {
        const char *dev, *want;
    } picks[] = {{"sm_80", "sm_80"},         {"sm_86", "sm_80"},         {"sm_89", "sm_80"},
                 {"sm_90", "sm_90a"},        {"sm_100a", "compute_80"}, {"sm_120", "compute_80"},
                 {"sm_103", "compute_80"}};
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) kiln_program_free(program_for(b, &p, picks[i].dev, picks[i].want));

    /* Older than every target: refused, naming what the bundle has. */
    kiln_program *none = (kiln_program *)1;
    kiln_status   st = kiln_bundle_program(b, p.g, "sm_75", &none);
    ck_assert_msg(st && kiln_status_code(st) == KILN_ERR_FORMAT, "sm_75: %s", kiln_status_msg(st));
    ck_assert_ptr_null(none);
    kiln_status_free(st);
    parsed_free(&p);
    kiln_bundle_free(b);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(other_arch_refused) {
    char *dir = ts_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/only90.kiln", dir);
    const char *arch = "sm_90a";
    write_bundle(kg_spec, 1, &arch, path);
    kiln_bundle *b = NULL;
    TS_OK(kiln_bundle_open(path, &b));
    parsed        p = parse(kiln_bundle_graph_text(b));
    kiln_program *prog = (kiln_program *)1;
    kiln_status   st = kiln_bundle_program(b, p.g, "sm_80", &prog);
    ck_assert_msg(st != NULL, "an sm_90a bundle ran on sm_80");
    ck_assert_ptr_null(prog);
    const char *m = kiln_status_msg(st);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_FORMAT);
    ck_assert_msg(strstr(m, "sm_90a") && strstr(m, "compute_90a") && strstr(m, "rebuild") && strstr(m, "sm_80") &&
                      strstr(m, path),
                  "message: %s", m);
    kiln_status_free(st);
    /* and sm_90a itself is fine */
    kiln_program_free(program_for(b, &p, "sm_90a", "sm_90a"));
    /* arch names that are not GPUs are argument errors */
    st = kiln_bundle_program(b, p.g, "compute_90a", &prog);
    ck_assert_msg(st && kiln_status_code(st) == KILN_ERR_INVALID, "compute_90a as a device: %s", kiln_status_msg(st));
    kiln_status_free(st);
    parsed_free(&p);
    kiln_bundle_free(b);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(writing_is_deterministic) {
    char *dir = ts_tmpdir(), cache[4200], a[4200], b[4200];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(a, sizeof a, "%s/a.kiln", dir);
    snprintf(b, sizeof b, "%s/b.kiln", dir);
    parsed            p = parse(kg_spec);
    kiln_compile_opts o = {.cache_dir = cache};
    TS_OK(kiln_bundle_write(p.g, &o, 2, two_archs, a)); /* cold: NVRTC */
    TS_OK(kiln_bundle_write(p.g, &o, 2, two_archs, b)); /* warm: the program cache */
    parsed_free(&p);
    size_t na, nb;
    char  *da = ts_read_file(a, &na), *db = ts_read_file(b, &nb);
    ck_assert_uint_eq(na, nb);
    ck_assert_msg(memcmp(da, db, na) == 0, "two writes of one graph differ");
    free(da);
    free(db);
    /* no temporary file left beside it */
    char *out = NULL, cmd[4400];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c tmp", dir);
    ts_run(cmd, &out);
    ck_assert_msg(atoi(out) == 0, "temporary files left: %s", out);
    free(out);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- damage and foreign bundles ------------------------------------------------------------- */

/* A bundle of kg_spec at path, its bytes in data, and bad: where altered copies go. */
typedef struct {
    char  *dir, path[4200], bad[4200];
    char  *data;
    size_t n;
} fixture;

static fixture fixture_new(int narchs, const char *bad_name) {
    fixture f = {.dir = ts_tmpdir()};
    snprintf(f.path, sizeof f.path, "%s/g.kiln", f.dir);
    snprintf(f.bad, sizeof f.bad, "%s/%s", f.dir, bad_name);
    write_bundle(kg_spec, narchs, two_archs, f.path);
    f.data = ts_read_file(f.path, &f.n);
    return f;
}

static void fixture_free(fixture *f) {
    free(f->data);
    ts_rmtree(f->dir);
    free(f->dir);
}

START_TEST(damage_detected) {
    fixture f = fixture_new(2, "bad.kiln");
    char    what[96];
    /* Truncated at every 1/16 of the file, and by its last byte. */
    for (int k = 0; k <= 16; k++) {
        size_t at = k < 16 ? f.n * (size_t)k / 16 : f.n - 1;
        write_all(f.bad, f.data, at);
        snprintf(what, sizeof what, "truncated to %zu of %zu bytes", at, f.n);
        expect_refused(f.bad, NULL, what);
    }
    /* One bit flipped, at 97 places spread over the file and at its first and last bytes. */
    for (int k = 0; k <= 98; k++) {
        size_t at = k == 97 ? 0 : k == 98 ? f.n - 1 : (f.n * (size_t)k) / 97 + (size_t)k % 7;
        f.data[at] ^= (char)(1 << (k % 8));
        write_all(f.bad, f.data, f.n);
        f.data[at] ^= (char)(1 << (k % 8));
        snprintf(what, sizeof what, "bit %d of byte %zu flipped", k % 8, at);
        expect_refused(f.bad, at == 0 ? "not a kiln bundle" : "damaged", what);
    }
    /* Extra bytes at the end. */
    char *longer = malloc(f.n + 1);
    memcpy(longer, f.data, f.n);
    longer[f.n] = 0;
    write_all(f.bad, longer, f.n + 1);
    expect_refused(f.bad, NULL, "one byte appended");
    free(longer);
    /* The original still opens. */
    kiln_bundle *b = NULL;
    TS_OK(kiln_bundle_open(f.path, &b));
    kiln_bundle_free(b);
    fixture_free(&f);
}
END_TEST

/* Everything a reader does with an opened bundle; errors are fine, crashes are not. */
static void use_bundle(const kiln_bundle *b) {
    char       *text = NULL;
    kiln_status st = kiln_bundle_describe(b, &text);
    free(text);
    kiln_status_free(st);
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_graph *g = NULL;
    st = kiln_parse(ctx, kiln_bundle_graph_text(b), strlen(kiln_bundle_graph_text(b)), "bundle");
    if (!st) st = kiln_graph_new(ctx, &g);
    kiln_status_free(st);
    for (int i = 0; g && i < 2; i++) {
        kiln_program *p = NULL;
        kiln_status_free(kiln_bundle_program(b, g, two_archs[i], &p));
        kiln_program_free(p);
    }
    ts_graph_free(g, ctx);
}

/* Flips resealed with a valid checksum reach the parser and the plan reader: never a crash
 * (run the ASan build too); what is refused is refused as a format error. */
START_TEST(resealed_damage_never_crashes) {
    fixture f = fixture_new(2, "bad.kiln");
    int     refused = 0, opened = 0;
    char   *copy = malloc(f.n);
    for (size_t at = 0; at + 20 < f.n; at += at < 400 ? 1 : 97) {
        memcpy(copy, f.data, f.n);
        copy[at] ^= (char)0x41;
        reseal(copy, f.n);
        write_all(f.bad, copy, f.n);
        kiln_bundle *b = NULL;
        kiln_status  st = kiln_bundle_open(f.bad, &b);
        if (st) {
            ck_assert_msg(kiln_status_code(st) == KILN_ERR_FORMAT, "byte %zu: %s: %s", at,
                          kiln_code_name(kiln_status_code(st)), kiln_status_msg(st));
            kiln_status_free(st);
            refused++;
            continue;
        }
        opened++;
        use_bundle(b);
        kiln_bundle_free(b);
    }
    free(copy);
    ck_assert_int_gt(refused, 100); /* the header, signature and graph are checked */
    ck_assert_int_gt(opened, 0);    /* cubin bytes are not (they are the driver's business) */
    fixture_free(&f);
}
END_TEST

START_TEST(foreign_version_refused) {
    fixture f = fixture_new(1, "old.kiln");
    char   *v = find_bytes(f.data, f.n, "kiln " KILN_VERSION "\n");
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(strlen("kiln 0.0.9\n"), strlen("kiln " KILN_VERSION "\n"));
    memcpy(v, "kiln 0.0.9\n", strlen("kiln 0.0.9\n"));
    reseal(f.data, f.n);
    write_all(f.bad, f.data, f.n);
    expect_refused(f.bad, "kiln 0.0.9", "another version");
    kiln_bundle *b = NULL;
    kiln_status  st = kiln_bundle_open(f.bad, &b);
    ck_assert_msg(strstr(kiln_status_msg(st), "kiln " KILN_VERSION) && strstr(kiln_status_msg(st), "rebuild"),
                  "message: %s", kiln_status_msg(st));
    kiln_status_free(st);
    fixture_free(&f);
}
END_TEST

/* The GRPH section's text (within data). */
static char *graph_section(char *data, size_t n, size_t *len) {
    char *t = find_bytes(data, n, "GRPH");
    ck_assert_ptr_nonnull(t);
    uint64_t l = 0;
    for (int i = 7; i >= 0; i--) l = (l << 8) | (uint8_t)t[4 + i];
    *len = (size_t)l;
    return t + 12;
}

START_TEST(other_graph_refused) {
    fixture f = fixture_new(1, "swapped.kiln");
    size_t  glen;
    char   *graph = graph_section(f.data, f.n, &glen);
    ck_assert_uint_eq(glen, strlen(kg_spec));
    ck_assert_int_eq(memcmp(graph, kg_spec, glen), 0);
    char *op = find_bytes(graph, glen, "silu(y0)");
    ck_assert_ptr_nonnull(op);
    memcpy(op, "relu", 4);
    reseal(f.data, f.n);
    write_all(f.bad, f.data, f.n);
    expect_refused(f.bad, "signature", "graph swapped");

    /* The signature made to match too: the programs' IR fingerprints still refuse it. */
    char               gh[33];
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(graph, glen));
    for (int i = 0; i < 16; i++) snprintf(gh + 2 * i, 3, "%02x", c.digest[i]);
    char *field = find_bytes(f.data, f.n, "graph-xxh3 ");
    ck_assert_ptr_nonnull(field);
    memcpy(field + 11, gh, 32);
    reseal(f.data, f.n);
    write_all(f.bad, f.data, f.n);
    kiln_bundle *b = NULL;
    TS_OK(kiln_bundle_open(f.bad, &b));
    ck_assert_ptr_nonnull(strstr(kiln_bundle_graph_text(b), "relu(y0)"));
    char       *text = NULL;
    kiln_status st = kiln_bundle_describe(b, &text);
    ck_assert_msg(st && kiln_status_code(st) == KILN_ERR_FORMAT && strstr(kiln_status_msg(st), "does not match"),
                  "describe of a swapped graph: %s", st ? kiln_status_msg(st) : text);
    kiln_status_free(st);
    parsed        p = parse(kiln_bundle_graph_text(b));
    kiln_program *prog = (kiln_program *)1;
    st = kiln_bundle_program(b, p.g, "sm_90a", &prog);
    ck_assert_msg(st && kiln_status_code(st) == KILN_ERR_FORMAT && strstr(kiln_status_msg(st), "fingerprint"),
                  "program of a swapped graph: %s", kiln_status_msg(st));
    ck_assert_ptr_null(prog);
    kiln_status_free(st);
    parsed_free(&p);
    kiln_bundle_free(b);
    fixture_free(&f);
}
END_TEST

/* ---- the cli -------------------------------------------------------------------------------- */

static bool have_gpu(void) {
    char        arch[16];
    kiln_status st = kiln_device_arch(0, arch, sizeof arch);
    kiln_status_free(st);
    return st == NULL;
}

START_TEST(cli_bundles) {
    char *dir = ts_tmpdir(), g[4200], f[4200], bad[4200], cmd[16000];
    snprintf(g, sizeof g, "%s/g.kg", dir);
    snprintf(f, sizeof f, "%s/g.kiln", dir);
    snprintf(bad, sizeof bad, "%s/bad.kiln", dir);
    FILE *fp = fopen(g, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(kg_spec, fp);
    fclose(fp);
    const char *kiln = ts_kiln_bin();
    char       *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' compile '%s' -o '%s' --arch sm_90a,sm_80", kiln, g, f);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s:\n%s", cmd, out);
    ck_assert_msg(strstr(out, "wrote bundle") && strstr(out, "sm_90a sm_80"), "%s", out);
    free(out);

    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", kiln, f);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s:\n%s", cmd, out);
    ck_assert_msg(strstr(out, "checksum ok") && strstr(out, "target compute_80"), "%s", out);
    free(out);

    size_t n;
    char  *data = ts_read_file(f, &n);
    data[n / 2] ^= 4;
    write_all(bad, data, n);
    free(data);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", kiln, bad);
    ck_assert_msg(ts_run(cmd, &out) == 1, "%s:\n%s", cmd, out);
    ck_assert_msg(strstr(out, "damaged") && strstr(out, bad), "%s", out);
    free(out);

    /* Without a GPU: exit 3 (no GPU), not a usage error. */
    snprintf(cmd, sizeof cmd, "'%s' run --bundle '%s' --iters 1", kiln, f);
    int rc = ts_run(cmd, &out);
    if (have_gpu()) ck_assert_msg(rc == 0, "%s: exit %d\n%s", cmd, rc, out);
    else ck_assert_msg(rc == 3, "%s: exit %d, expected 3 (no GPU)\n%s", cmd, rc, out);
    free(out);

    snprintf(cmd, sizeof cmd, "'%s' run '%s' --bundle '%s'", kiln, g, f);
    rc = ts_run(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, "not both"), "%s: exit %d\n%s", cmd, rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' compile '%s' --bundle '%s'", kiln, g, f);
    rc = ts_run(cmd, &out);
    ck_assert_msg(rc == 2, "%s: exit %d\n%s", cmd, rc, out);
    free(out);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("bundle",
                        TS_CASE("bundle", 120),
                        TS_TESTS(round_trip, other_arch_refused, writing_is_deterministic, damage_detected,
                                 resealed_damage_never_crashes, foreign_version_refused, other_graph_refused,
                                 cli_bundles));
    return ts_main_isolated(s, "bundle");
}
