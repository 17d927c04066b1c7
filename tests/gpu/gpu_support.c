/* Shared by the GPU test programs; see gpu_support.h. */
#include "tests/gpu/gpu_support.h"

#include "codegen/codegen.h"
#include "runtime/runtime.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *g_cache_dir; /* shared by all tests (forked children inherit the path) */
char  g_arch[24];

/* ---- helpers ------------------------------------------------------------------------------- */

void need_gpu(void) {
    kiln_status st = rt_driver_init();
    ck_assert_msg(st == NULL,
                  "the GPU tests need an NVIDIA GPU and driver, and this machine has none: %s",
                  kiln_status_msg(st));
    if (!g_arch[0]) {
        char a[16];
        TS_OK(rt_device_arch(0, a));
        /* sm_90 devices get kiln's default, the arch-specific sm_90a. */
        snprintf(g_arch, sizeof g_arch, "%s%s", a, strcmp(a, "sm_90") == 0 ? "a" : "");
    }
}


uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
int   rng_int(rng_t *r, int lo, int hi) { return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1)); }

void random_ew_shape(rng_t *r, int64_t ne[4]) {
    static const int64_t pick[] = {1, 1, 2, 3, 7, 16, 33, 64, 129, 4097};
    int nd = rng_int(r, 1, 4);
    for (int i = 0; i < 4; i++) {
        if (i >= nd) ne[i] = 1;
        else if (rng_int(r, 0, 3) == 0) ne[i] = rng_int(r, 1, 40);
        else ne[i] = pick[rng_int(r, 0, (int)(sizeof pick / sizeof pick[0]) - 1)];
    }
    for (int i = 3; i >= 0; i--)
        while (ne[0] * ne[1] * ne[2] * ne[3] > (1 << 19) && ne[i] > 1) ne[i] = (ne[i] + 1) / 2;
}
float rng_float(rng_t *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next(r) >> 40) * (1.0 / 16777216.0));
}

const kiln_type FLOAT_TYPES[3] = {KILN_F32, KILN_F16, KILN_BF16};

/* Host data of the leaves (by name) and the reference's outputs. */



void fill(void *p, kiln_type t, int64_t n, uint64_t seed, fill_kind k) {
    kb_fill_random(p, t, n, seed);
    if (k == FILL_ANY) return;
    for (int64_t i = 0; i < n; i++) {
        float v = kb_load_f32(p, t, i);
        if (k == FILL_POSITIVE) v = fabsf(v);
        else if (k == FILL_LOG_DOMAIN) v = fabsf(v) + 0.25f; /* log(0) is -inf: keep away */
        else v = (v < 0 ? -0.5f : 0.5f) + v; /* [-1.5, -0.5) U [0.5, 1.5) */
        kb_store_f32(p, t, i, v);
    }
}

hdata *hset_add(hset *h, const char *name, kiln_type t, int64_t n) {
    ck_assert_int_lt(h->nin, MAX_DATA);
    hdata *d = &h->in[h->nin++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->type = t;
    d->n = n;
    d->data = malloc(n ? kiln_row_size(t, n) : 1);
    ck_assert_ptr_nonnull(d->data);
    return d;
}

void hset_clear_out(hset *h) {
    for (int i = 0; i < h->nout; i++) free(h->out[i].data);
    h->nout = 0;
}

void hset_free(hset *h) {
    for (int i = 0; i < h->nin; i++) free(h->in[i].data);
    h->nin = 0;
    hset_clear_out(h);
}

void gpu_free(kiln_session *s, kiln_program *p, kiln_graph *g, hset *h, kiln_ctx *ctx) {
    kiln_session_free(s);
    kiln_program_free(p);
    kiln_graph_free(g);
    hset_free(h);
    kiln_ctx_free(ctx);
}

static bool program_has_dynamic_gemm(const kiln_program *p) {
    for (int i = 0; i < p->nkernels; i++)
        if (p->kernels[i].kind == CG_GEMM && p->kernels[i].gemm.n_sym >= 0) return true;
    return false;
}

void scale_weights(const kiln_graph *g, hset *h) {
    for (int i = 0; i < g->n; i++) {
        const kiln_tensor *t = g->nodes[i];
        if (t->role != KILN_ROLE_WEIGHT || t->ne[1] == 1 || (t->type != KILN_F32 && t->type != KILN_F16 && t->type != KILN_BF16))
            continue;
        for (int k = 0; k < h->nin; k++) {
            hdata *d = &h->in[k];
            if (strcmp(d->name, t->name) != 0) continue;
            float s = 1.0f / sqrtf((float)t->ne[0]);
            for (int64_t j = 0; j < d->n; j++) kb_store_f32(d->data, d->type, j, s * kb_load_f32(d->data, d->type, j));
        }
    }
}

const void *ref_get(void *user, const char *name, kiln_type type, int64_t n) {
    hset *h = user;
    for (int i = 0; i < h->nin; i++) {
        if (strcmp(h->in[i].name, name) != 0) continue;
        ck_assert_msg(h->in[i].type == type && h->in[i].n == n,
                      "reference asked for %s as %s x %lld, test has %s x %lld", name,
                      kiln_type_name(type), (long long)n, kiln_type_name(h->in[i].type),
                      (long long)h->in[i].n);
        h->in[i].requested = true;
        return h->in[i].data;
    }
    ck_abort_msg("reference asked for unknown leaf '%s'", name);
    return NULL;
}

void ref_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    hset *h = user;
    ck_assert_int_lt(h->nout, MAX_DATA);
    hdata *d = &h->out[h->nout++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->type = type;
    d->n = n;
    size_t bytes = kiln_row_size(type, n);
    d->data = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(d->data);
    memcpy(d->data, data, bytes);
}

/* NMSE of out against ref; *bad_at is the first index where out is NaN (or -1), *ref_nonfinite
 * whether ref holds an infinity or NaN; either pointer may be NULL. */
double nmse(const void *out, const void *ref, kiln_type t, int64_t n, int64_t *bad_at,
                   bool *ref_nonfinite) {
    double  num = 0, den = 0;
    int64_t bad = -1;
    bool    nonfinite = false;
    for (int64_t i = 0; i < n; i++) {
        double o = kb_load_f32(out, t, i), r = kb_load_f32(ref, t, i);
        if (!isfinite(r)) nonfinite = true;
        if (isnan(o) && bad < 0) bad = i;
        num += (o - r) * (o - r);
        den += r * r;
    }
    if (bad_at) *bad_at = bad; /* (either may be NULL) */
    if (ref_nonfinite) *ref_nonfinite = nonfinite;
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return num / den;
}

double lowp_tol(kiln_type t, double f32_tol) {
    switch (t) {
    case KILN_F16: return FUSED_TOL_F16 > f32_tol ? FUSED_TOL_F16 : f32_tol;
    case KILN_BF16: return FUSED_TOL_BF16 > f32_tol ? FUSED_TOL_BF16 : f32_tol;
    default: return f32_tol;
    }
}

/* The lowest precision float type among the graph's tensors. */
kiln_type lowest_precision(const kiln_graph *g) {
    kiln_type t = KILN_F32;
    for (int i = 0; i < g->n; i++) {
        kiln_type u = g->nodes[i]->type;
        if (u == KILN_BF16) t = KILN_BF16;
        else if (u == KILN_F16 && t == KILN_F32) t = KILN_F16;
    }
    return t;
}

kiln_program *compile(const kiln_graph *g, int no_fuse) {
    kiln_compile_opts o = {0};
    o.cache_dir = g_cache_dir;
    o.arch = g_arch;
    o.no_fuse = no_fuse;
    kiln_program *p = NULL;
    TS_OK(kiln_compile(g, &o, &p));
    return p;
}


/* Runs the reference (h->out), compiles and runs g on the GPU with h's inputs, and compares
 * every output. Returns the worst NMSE. */
double check_graph(const kiln_graph *g, hset *h, const cmp_opts *c) {
    hset_clear_out(h);
    for (int i = 0; i < h->nin; i++) h->in[i].requested = false;
    TS_OK(kiln_reference(g, ref_get, ref_put, h));
    ck_assert_msg(h->nout > 0, "%s: the reference produced no output", c->label);

    kiln_program     *p = compile(g, c->no_fuse);
    kiln_session     *s = NULL;
    kiln_session_opts so = {.no_cuda_graph = c->no_graph, .device = 0};
    TS_OK(kiln_session_new(p, &so, &s));
    for (int i = 0; i < h->nin; i++) {
        if (!h->in[i].requested) continue;
        TS_OK(kiln_session_set(s, h->in[i].name, h->in[i].data,
                               kiln_row_size(h->in[i].type, h->in[i].n)));
    }
    TS_OK(kiln_session_run(s));
    /* One capture with graphs on, except for a program whose library GEMM takes its size at
     * run time (a symbolic n): it launches plainly, by design (docs/templates.md). */
    kiln_session_stats ss;
    kiln_session_get_stats(s, &ss);
    bool plain_by_design = !c->no_graph && ss.plain_runs == 1 && program_has_dynamic_gemm(p);
    ck_assert_msg(kiln_session_captures(s) == (c->no_graph || plain_by_design ? 0 : 1), "%s: captures %d", c->label,
                  kiln_session_captures(s));

    kiln_type low = lowest_precision(g);
    double    worst = 0;
    for (int i = 0; i < h->nout; i++) {
        hdata *r = &h->out[i];
        size_t bytes = kiln_row_size(r->type, r->n);
        void  *out = malloc(bytes ? bytes : 1);
        ck_assert_ptr_nonnull(out);
        TS_OK(kiln_session_get(s, r->name, out, bytes));
        int64_t bad;
        bool    ref_nonfinite;
        double  e = nmse(out, r->data, r->type, r->n, &bad, &ref_nonfinite);
        double  tol = c->fused_tol ? lowp_tol(low, c->tol_f32) : c->tol_f32;
        ck_assert_msg(!ref_nonfinite, "%s: output '%s': the reference has inf/NaN (test inputs "
                                      "out of the op's domain)", c->label, r->name);
        if (bad >= 0)
            ck_abort_msg("%s: output '%s' (%s, %lld elements): NaN at element %lld (reference "
                         "%g)", c->label, r->name, kiln_type_name(r->type), (long long)r->n,
                         (long long)bad, kb_load_f32(r->data, r->type, bad));
        if (!(e <= tol)) {
            /* Show the worst element to help debugging. */
            int64_t wi = 0;
            double  wd = -1;
            for (int64_t j = 0; j < r->n; j++) {
                double d = fabs((double)kb_load_f32(out, r->type, j) - kb_load_f32(r->data, r->type, j));
                if (d > wd) wd = d, wi = j;
            }
            ck_abort_msg("%s: output '%s' (%s, %lld elements): NMSE %.3g > tolerance %.3g "
                         "(worst element %lld: gpu %.8g, reference %.8g)", c->label, r->name,
                         kiln_type_name(r->type), (long long)r->n, e, tol, (long long)wi,
                         kb_load_f32(out, r->type, wi), kb_load_f32(r->data, r->type, wi));
        }
        if (e > worst) worst = e;
        free(out);
    }
    kiln_session_free(s);
    kiln_program_free(p);
    return worst;
}

double check_and_free(kiln_graph *g, hset *h, kiln_ctx *ctx, const cmp_opts *c) {
    double e = check_graph(g, h, c);
    gpu_free(NULL, NULL, g, h, ctx);
    return e;
}

void shape_str(const int64_t ne[4], char *out, size_t n) {
    snprintf(out, n, "[%lld, %lld, %lld, %lld]", (long long)ne[0], (long long)ne[1],
             (long long)ne[2], (long long)ne[3]);
}

/* ---- operands with layouts ------------------------------------------------------------------ */

const char *LAYOUT_NAMES[LAY_COUNT] = {"plain", "permuted", "transposed", "viewed",
                                               "reshaped"};

/* A tensor of logical shape ne and type t, read through `lay` from a new leaf `name` whose
 * host data is added to h. */
kiln_tensor *operand(kiln_ctx *ctx, hset *h, rng_t *r, const char *name, kiln_type t,
                            const int64_t ne[4], layout lay, fill_kind fk, uint64_t seed,
                            char *desc, size_t desc_n) {
    kiln_role    role = rng_int(r, 0, 1) ? KILN_ROLE_INPUT : KILN_ROLE_WEIGHT;
    int64_t      src[4] = {ne[0], ne[1], ne[2], ne[3]};
    kiln_tensor *leaf = NULL, *x = NULL;
    char         extra[96] = "";
    switch (lay) {
    case LAY_PLAIN:
        x = leaf = kiln_new_tensor(ctx, role, t, name, 4, src);
        break;
    case LAY_PERMUTE: {
        int p[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) {
            int j = rng_int(r, 0, i), tmp = p[i];
            p[i] = p[j];
            p[j] = tmp;
        }
        for (int i = 0; i < 4; i++) src[i] = ne[p[i]]; /* permute puts src dim i at p[i] */
        leaf = kiln_new_tensor(ctx, role, t, name, 4, src);
        x = kiln_permute(ctx, leaf, p[0], p[1], p[2], p[3]);
        snprintf(extra, sizeof extra, " axes %d%d%d%d", p[0], p[1], p[2], p[3]);
        break;
    }
    case LAY_TRANSPOSE:
        src[0] = ne[1];
        src[1] = ne[0];
        leaf = kiln_new_tensor(ctx, role, t, name, 4, src);
        x = kiln_transpose(ctx, leaf);
        break;
    case LAY_VIEW: {
        int pad0 = rng_int(r, 0, 3), pad1 = rng_int(r, 0, 2);
        src[0] += pad0;
        src[1] += pad1;
        leaf = kiln_new_tensor(ctx, role, t, name, 4, src);
        if (!leaf) break;
        size_t nb[3] = {kiln_tensor_nb(leaf, 1), kiln_tensor_nb(leaf, 2), kiln_tensor_nb(leaf, 3)};
        int    o0 = rng_int(r, 0, pad0), o1 = rng_int(r, 0, pad1);
        size_t offs = (size_t)o0 * kiln_type_size(t) + (size_t)o1 * nb[0];
        x = kiln_view(ctx, leaf, 4, ne, nb, offs);
        snprintf(extra, sizeof extra, " of %lldx%lld at (%d,%d)", (long long)src[0],
                 (long long)src[1], o0, o1);
        break;
    }
    case LAY_RESHAPE: {
        int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
        leaf = kiln_new_tensor(ctx, role, t, name, 1, &n);
        x = kiln_reshape(ctx, leaf, 4, ne);
        break;
    }
    default: ck_abort_msg("bad layout");
    }
    int64_t n = src[0] * src[1] * src[2] * src[3];
    if (lay == LAY_RESHAPE) n = ne[0] * ne[1] * ne[2] * ne[3];
    hdata *d = hset_add(h, name, t, n);
    fill(d->data, t, n, seed, fk);
    char s[96];
    shape_str(ne, s, sizeof s);
    snprintf(desc, desc_n, "%s %s %s%s", name, s, LAYOUT_NAMES[lay], extra);
    return x;
}

char *write_kg(const char *dir, const char *name, const char *kg) {
    char *path = malloc(strlen(dir) + strlen(name) + 8);
    ck_assert_ptr_nonnull(path);
    sprintf(path, "%s/%s.kg", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s%s", strncmp(kg, "kiln-graph", 10) ? "kiln-graph 1\n" : "", kg);
    fclose(f);
    return path;
}

double median_ms(const char *cmd) {
    char  *out = NULL;
    double ms = -1;
    if (ts_run(cmd, &out) == 0 && out) {
        const char *m = strstr(out, "median ");
        if (m) ms = atof(m + 7);
    }
    free(out);
    return ms;
}

void run_check(const char *path, const char *args, const char *label) {
    for (int plain = 0; plain < 2; plain++) {
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s run %s %s --check --iters 3 --cache-dir %s%s 2>&1", ts_kiln_bin(), path, args,
                 g_cache_dir, plain ? " --no-cuda-graph" : "");
        int         rc = ts_run(cmd, &out);
        const char *chk = out ? strstr(out, "check ") : NULL;
        if (rc != 0 || !chk || strstr(out, "FAILED")) fprintf(stderr, "%s: %s\n%s\n", label, cmd, out ? out : "");
        ck_assert_msg(rc == 0 && chk && !strstr(out, "FAILED"), "%s %s%s: failed (output on stderr)", label, args,
                      plain ? " plain" : "");
        printf("%s %s%s:\n%s", label, args, plain ? " plain" : "", chk);
        free(out);
    }
}

double run_median_ms(const char *path, const char *args_fmt, ...) {
    char    args[1024], cmd[2048];
    va_list ap;
    va_start(ap, args_fmt);
    vsnprintf(args, sizeof args, args_fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s run %s %s --cache-dir %s 2>&1", ts_kiln_bin(), path, args, g_cache_dir);
    return median_ms(cmd);
}

void run_case_at_values(const char *what, int i, const char *kg, const char *dim, const int vals[3]) {
    need_gpu();
    char label[64];
    snprintf(label, sizeof label, "%s case %d", what, i);
    run_check_at_values(kg, dim, vals, 3, label);
}

void run_check_at_values(const char *kg, const char *dim, const int *vals, int nvals, const char *label) {
    char *dir = ts_tmpdir();
    char *path = write_kg(dir, "g", kg);
    for (int v = 0; v < nvals; v++) {
        char args[160];
        snprintf(args, sizeof args, "--dim %s=%d", dim, vals[v]);
        run_check(path, args, label);
    }
    free(path);
    ts_tmpdir_free(dir);
}

/* Inputs and weights of g at random; i32 leaves are expert ids: slot u of each token takes a
 * distinct expert. */
static void fill_leaves_ids(const kiln_graph *g, hset *h, uint64_t seed) {
    rng_t r = {seed};
    for (int i = 0; i < g->n; i++) {
        const kiln_tensor *t = g->nodes[i];
        if (t->role != KILN_ROLE_INPUT && t->role != KILN_ROLE_WEIGHT) continue;
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        hdata  *d = hset_add(h, t->name, t->type, n);
        if (t->type == KILN_I32) { /* expert ids: slot u of each token takes a distinct expert */
            for (int64_t k = 0; k < n; k++) ((int32_t *)d->data)[k] = (int32_t)((k % t->ne[0]) * 7 + rng_int(&r, 0, 6));
        } else {
            fill(d->data, t->type, n, seed * 7 + (uint64_t)i, FILL_ANY);
        }
    }
}

void check_kg_fused(const char *kg, const char *what, double tol, uint64_t seed) {
    need_gpu();
    kiln_ctx   *ctx = ts_parse(kg);
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    hset h = {0};
    fill_leaves_ids(g, &h, seed);
    for (int no_fuse = 0; no_fuse <= 1; no_fuse++) {
        char label[4096];
        snprintf(label, sizeof label, "%s%s:\n%s", what, no_fuse ? " (unfused)" : " (fused)", kg);
        cmp_opts co = {.label = label, .tol_f32 = tol, .fused_tol = true, .no_fuse = no_fuse};
        double   e = check_graph(g, &h, &co);
        printf("%-52s %s nmse %.3g\n", what, no_fuse ? "unfused" : "fused  ", e);
    }
    hset_free(&h);
    ts_graph_free(g, ctx);
}

void fused_run_check(const char *kg, const char *const *want, const char *const *absent, const char *label) {
    char *dir = ts_tmpdir(), *path = write_kg(dir, "g", kg), cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", ts_kiln_bin(), path);
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    for (int i = 0; want[i]; i++) ck_assert_msg(strstr(out, want[i]), "%s: no '%s':\n%s", label, want[i], out);
    for (int i = 0; absent && absent[i]; i++)
        ck_assert_msg(!strstr(out, absent[i]), "%s: '%s' is left:\n%s", label, absent[i], out);
    free(out);
    run_check(path, "", label);
    free(path);
    ts_tmpdir_free(dir);
}
