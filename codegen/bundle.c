/* AOT bundles (docs/bundles.md): one file holding a graph, its compiled programs for several
 * targets (cubins per sm_ arch, PTX per compute_ arch) and a signature of what built it,
 * closed by a checksum over every byte. Reading needs neither NVRTC nor a GPU.
 *
 *   "KILNBNDL" | u32 format | u32 sections | sections: 4-byte tag + blob (u64 length + bytes)
 *   | "SUM " + XXH3-128 of every byte before it
 *
 * Sections, in order: SIGN (signature text), GRPH (graph text), OPTS (compile options), then
 * one PROG per target (arch name + serialized program, codegen/plan.c). */
#include "codegen/codegen.h"

#include "cache/cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define BUNDLE_FORMAT 1
#define MAX_TARGETS 16
static const char bundle_magic[8] = {'K', 'I', 'L', 'N', 'B', 'N', 'D', 'L'};

typedef struct {
    char        arch[16];
    const void *plan; /* into data */
    size_t      plan_size;
} bundle_target;

struct kiln_bundle {
    char         *path;
    void         *data; /* the whole file */
    size_t        size;
    char         *sign, *graph, *opts;
    int           ntargets;
    bundle_target t[MAX_TARGETS];
    int           no_fuse;
    char          no_fuse_passes[512];
};

/* ---- writing ----------------------------------------------------------------------------- */

static void put_section(kb_str *b, const char tag[4], const void *data, size_t n) {
    kb_str_addn(b, tag, 4);
    kb_put_blob(b, data, n);
}

/* The canonical (big-endian) XXH3-128 of data as 32 hex digits, like cache keys. */
static void hex128(const void *data, size_t n, char out[33]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(n ? data : "", n));
    kc_key k;
    memcpy(k.b, c.digest, 16);
    kc_key_hex(k, out);
}

static char *signature(const kiln_compile_opts *o, const char *graph, char targets[][16], int n) {
    int  major = 0, minor = 0;
    char gh[33];
    kiln_status_free(cg_nvrtc_version(&major, &minor));
    hex128(graph, strlen(graph), gh);
    kb_str s = {0};
    kb_str_addf(&s, "kiln %s\nbuild %s\nbundle-format %d\nplan-format %d\nnvrtc %d.%d\ntargets", KILN_VERSION,
                kiln_build_id(), BUNDLE_FORMAT, CG_PLAN_VERSION, major, minor);
    for (int i = 0; i < n; i++) kb_str_addf(&s, " %s", targets[i]);
    kb_str_addf(&s, "\ngraph-xxh3 %s\noptions no_fuse=%d no_fuse_passes=%s\n", gh, o->no_fuse ? 1 : 0,
                o->no_fuse_passes ? o->no_fuse_passes : "");
    return kb_str_take(&s);
}

/* sm_XY[a] gives a cubin target and its PTX twin compute_XY[a]. */
static kiln_status list_targets(int narchs, const char *const *archs, char out[][16], int *n) {
    *n = 0;
    for (int i = 0; i < narchs; i++) {
        kb_arch     a;
        kiln_status st = kiln_check_arch(archs[i]); /* before any compile: sm_75 fails fast */
        if (st) return st;
        if (!kb_arch_parse(archs[i], &a) || a.ptx)
            return kb_error(KILN_ERR_INVALID, "bundle arch '%s' is not of the form sm_XY or sm_XYa (e.g. sm_90a, sm_80)",
                            archs[i]);
        for (int j = 0; j < i; j++)
            if (!strcmp(archs[j], archs[i])) return kb_error(KILN_ERR_INVALID, "bundle arch '%s' given twice", archs[i]);
        if (*n + 2 > MAX_TARGETS) return kb_error(KILN_ERR_INVALID, "a bundle holds at most %d archs", MAX_TARGETS / 2);
        snprintf(out[(*n)++], 16, "%s", archs[i]);
        snprintf(out[(*n)++], 16, "compute_%s", archs[i] + 3);
    }
    if (!*n) return kb_error(KILN_ERR_INVALID, "a bundle needs at least one arch");
    return NULL;
}

static kiln_status add_program(kb_str *b, const kiln_graph *g, const kiln_compile_opts *opts, const char *arch) {
    kiln_compile_opts o = *opts;
    o.arch = arch;
    o.dump_dir = arch[0] == 's' ? o.dump_dir : NULL; /* dumps of the first (cubin) target only */
    kiln_program *p;
    kiln_status   st = kiln_compile(g, &o, &p);
    if (st) return kb_wrap(st, "compiling for %s", arch);
    kb_str entry = {0};
    kb_put_cstr(&entry, arch);
    st = cg_plan_write(p, &entry);
    if (!st && entry.oom) st = kb_oom();
    if (!st) put_section(b, "PROG", entry.s, entry.len);
    kb_str_free(&entry);
    kiln_program_free(p);
    return st;
}

/* Written to a temporary file beside path, then renamed: a reader never sees half a bundle. */
static kiln_status write_atomic(const char *path, const void *data, size_t n) {
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0) return kb_oom();
    kiln_status st = kb_write_file(tmp, data, n);
    if (!st && rename(tmp, path) != 0)
        st = kb_error(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
    free(tmp);
    return st;
}

kiln_status kiln_bundle_write(const kiln_graph *g, const kiln_compile_opts *opts, int narchs, const char *const *archs,
                              const char *path) {
    if (!g || !path || (narchs && !archs)) return kb_error(KILN_ERR_INVALID, "kiln_bundle_write: NULL argument");
    kiln_compile_opts o = opts ? *opts : (kiln_compile_opts){0};
    if (o.skip_nvrtc) return kb_error(KILN_ERR_INVALID, "kiln_bundle_write: a bundle needs compiled code (skip_nvrtc set)");
    const char *def = "sm_90a";
    char        targets[MAX_TARGETS][16];
    int         n;
    kiln_status st = list_targets(narchs ? narchs : 1, narchs ? archs : &def, targets, &n);
    char       *graph = NULL, *sign = NULL;
    if (!st) st = kiln_print(g->ctx, &graph);
    if (!st && !(sign = signature(&o, graph, targets, n))) st = kb_oom();
    kb_str b = {0};
    if (!st) {
        kb_str_addn(&b, bundle_magic, 8);
        kb_put_u32(&b, BUNDLE_FORMAT);
        kb_put_u32(&b, (uint32_t)(3 + n));
        put_section(&b, "SIGN", sign, strlen(sign));
        put_section(&b, "GRPH", graph, strlen(graph));
        char opt[600];
        snprintf(opt, sizeof opt, "no_fuse=%d\nno_fuse_passes=%s\n", o.no_fuse ? 1 : 0, o.no_fuse_passes ? o.no_fuse_passes : "");
        put_section(&b, "OPTS", opt, strlen(opt));
    }
    for (int i = 0; !st && i < n; i++) st = add_program(&b, g, &o, targets[i]);
    if (!st) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(b.s, b.len));
        kb_str_addn(&b, "SUM ", 4);
        kb_str_addn(&b, (const char *)c.digest, 16);
        st = b.oom ? kb_oom() : write_atomic(path, b.s, b.len);
    }
    kb_str_free(&b);
    free(graph);
    free(sign);
    return st;
}

/* ---- reading ----------------------------------------------------------------------------- */

void kiln_bundle_free(kiln_bundle *b) {
    if (!b) return;
    free(b->path);
    free(b->data);
    free(b->sign);
    free(b->graph);
    free(b->opts);
    free(b);
}

static kiln_status bad(const kiln_bundle *b, const char *fmt, const char *what, size_t at) {
    return kb_error(KILN_ERR_FORMAT, "%s: not a valid kiln bundle: %s %s (byte %zu)", b->path, what, fmt, at);
}

static kiln_status check_checksum(const kiln_bundle *b) {
    if (b->size < 8 + 4 + 4 + 20 || memcmp(b->data, bundle_magic, 8) != 0)
        return kb_error(KILN_ERR_FORMAT, "%s: not a kiln bundle (%s)", b->path,
                        b->size < 8 || memcmp(b->data, bundle_magic, 8) ? "bad magic" : "too short");
    const uint8_t *end = (const uint8_t *)b->data + b->size - 20;
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(b->data, b->size - 20));
    if (memcmp(end, "SUM ", 4) != 0 || memcmp(end + 4, c.digest, 16) != 0)
        return kb_error(KILN_ERR_FORMAT, "%s: the bundle is damaged (checksum mismatch: truncated or modified)", b->path);
    return NULL;
}

static kiln_status read_sections(kiln_bundle *b) {
    kb_reader r = {.p = b->data, .len = b->size - 20, .pos = 8};
    uint32_t  format = kb_get_u32(&r, "format");
    if (format != BUNDLE_FORMAT)
        return kb_error(KILN_ERR_FORMAT, "%s: bundle format %u; this kiln %s reads format %d", b->path, format,
                        KILN_VERSION, BUNDLE_FORMAT);
    uint32_t n = kb_get_u32(&r, "section count");
    char     tag[5] = {0}; /* outlives the loop: a failed read keeps it as r.err, reported below */
    for (uint32_t i = 0; i < n && !r.err; i++) {
        const void *t = r.len - r.pos >= 4 ? r.p + r.pos : NULL;
        if (!t) return bad(b, "is missing", "a section tag", r.pos);
        memcpy(tag, t, 4);
        r.pos += 4;
        size_t      len;
        size_t      at = r.pos;
        const char *data = kb_get_blob(&r, &len, tag);
        if (r.err) break;
        char **text = !strcmp(tag, "SIGN") ? &b->sign : !strcmp(tag, "GRPH") ? &b->graph : !strcmp(tag, "OPTS") ? &b->opts : NULL;
        if (text) {
            if (*text || memchr(data, 0, len)) return bad(b, "is repeated or holds a NUL", tag, at);
            if (!(*text = strndup(data, len))) return kb_oom();
        } else if (!strcmp(tag, "PROG")) {
            if (b->ntargets == MAX_TARGETS) return bad(b, "exceeds the limit", "the target count", at);
            kb_reader pr = {.p = (const uint8_t *)data, .len = len};
            bundle_target *bt = &b->t[b->ntargets++];
            kb_get_str_into(&pr, bt->arch, sizeof bt->arch, "arch");
            if (pr.err) return bad(b, "has no valid arch", "a program", at);
            bt->plan = data + pr.pos;
            bt->plan_size = len - pr.pos;
        } else {
            return bad(b, "is unknown", tag, at);
        }
    }
    if (r.err) return bad(b, "is truncated", r.err, r.err_at);
    if (r.pos != r.len) return bad(b, "precede the checksum", "stray bytes", r.pos);
    if (!b->sign || !b->graph || !b->opts || !b->ntargets) return bad(b, "is missing", "a section", r.pos);
    return NULL;
}

/* The signature must name this kiln version and plan format, this graph and these targets. */
static kiln_status check_signature(kiln_bundle *b) {
    char v[256], plan[16], gh[64], want[33], targets[512];
    if (!kb_text_field(b->sign, "kiln", v, sizeof v) || !kb_text_field(b->sign, "plan-format", plan, sizeof plan) ||
        !kb_text_field(b->sign, "graph-xxh3", gh, sizeof gh) || !kb_text_field(b->sign, "targets", targets, sizeof targets))
        return kb_error(KILN_ERR_FORMAT, "%s: the bundle's signature is incomplete", b->path);
    if (strcmp(v, KILN_VERSION) != 0)
        return kb_error(KILN_ERR_FORMAT, "%s: the bundle was built by kiln %s; this is kiln %s, which does not run "
                                         "other versions' bundles: rebuild it with 'kiln compile GRAPH -o FILE'",
                        b->path, v, KILN_VERSION);
    if (atoi(plan) != CG_PLAN_VERSION)
        return kb_error(KILN_ERR_FORMAT, "%s: the bundle's programs are in format %s; this kiln reads format %d: rebuild it",
                        b->path, plan, CG_PLAN_VERSION);
    hex128(b->graph, strlen(b->graph), want);
    if (strcmp(gh, want) != 0) return kb_error(KILN_ERR_FORMAT, "%s: the bundle's graph does not match its signature", b->path);
    kb_str t = {0};
    for (int i = 0; i < b->ntargets; i++) kb_str_addf(&t, "%s%s", i ? " " : "", b->t[i].arch);
    bool same = t.s && !strcmp(t.s, targets);
    kb_str_free(&t);
    if (!same) return kb_error(KILN_ERR_FORMAT, "%s: the bundle's programs are not the targets it was signed for (%s)", b->path, targets);
    return NULL;
}

static kiln_status read_opts(kiln_bundle *b) {
    const char *p = strstr(b->opts, "no_fuse_passes=");
    if (strncmp(b->opts, "no_fuse=", 8) != 0 || !p) return kb_error(KILN_ERR_FORMAT, "%s: the bundle's options are malformed", b->path);
    b->no_fuse = atoi(b->opts + 8);
    const char *e = strchr(p, '\n');
    size_t      n = e ? (size_t)(e - p - 15) : strlen(p + 15);
    if (n >= sizeof b->no_fuse_passes) return kb_error(KILN_ERR_FORMAT, "%s: the bundle's options are malformed", b->path);
    memcpy(b->no_fuse_passes, p + 15, n);
    b->no_fuse_passes[n] = 0;
    return NULL;
}

kiln_status kiln_bundle_open(const char *path, kiln_bundle **out) {
    if (!path || !out) return kb_error(KILN_ERR_INVALID, "kiln_bundle_open: NULL argument");
    *out = NULL;
    kiln_bundle *b = calloc(1, sizeof *b);
    if (!b || !(b->path = strdup(path))) {
        free(b);
        return kb_oom();
    }
    char       *data;
    kiln_status st = kb_read_file(path, &data, &b->size);
    b->data = data;
    if (!st) st = check_checksum(b);
    if (!st) st = read_sections(b);
    if (!st) st = check_signature(b);
    if (!st) st = read_opts(b);
    if (st) {
        kiln_bundle_free(b);
        return st;
    }
    *out = b;
    return NULL;
}

const char *kiln_bundle_graph_text(const kiln_bundle *b) { return b ? b->graph : NULL; }

static kiln_compile_opts bundle_opts(const kiln_bundle *b) {
    return (kiln_compile_opts){.no_fuse = b->no_fuse, .no_fuse_passes = b->no_fuse_passes[0] ? b->no_fuse_passes : NULL};
}

/* The best target for a GPU: a fitting cubin (the highest), else fitting PTX (the highest). */
static int pick_target(const kiln_bundle *b, int cc_major, int cc_minor) {
    int best = -1, best_rank = -1;
    for (int i = 0; i < b->ntargets; i++) {
        kb_arch a;
        if (!kb_arch_parse(b->t[i].arch, &a) || !kb_arch_fits(&a, cc_major, cc_minor)) continue;
        int rank = (a.ptx ? 0 : 10000) + a.major * 100 + a.minor * 10 + (a.suffix == 'a');
        if (rank > best_rank) best = i, best_rank = rank;
    }
    return best;
}

kiln_status kiln_bundle_program(const kiln_bundle *b, const kiln_graph *g, const char *device_arch, kiln_program **out) {
    if (!b || !g || !device_arch || !out) return kb_error(KILN_ERR_INVALID, "kiln_bundle_program: NULL argument");
    *out = NULL;
    kb_arch dev;
    if (!kb_arch_parse(device_arch, &dev) || dev.ptx)
        return kb_error(KILN_ERR_INVALID, "kiln_bundle_program: '%s' is not a GPU arch (sm_XY)", device_arch);
    int i = pick_target(b, dev.major, dev.minor);
    if (i < 0) {
        kb_str t = {0};
        for (int j = 0; j < b->ntargets; j++) kb_str_addf(&t, "%s%s", j ? ", " : "", b->t[j].arch);
        kiln_status st = kb_error(KILN_ERR_FORMAT,
                                  "%s: the bundle has code for %s, none of which runs on this GPU (%s, compute capability "
                                  "%d.%d): rebuild it with --arch %s",
                                  b->path, t.s ? t.s : "nothing", device_arch, dev.major, dev.minor, device_arch);
        kb_str_free(&t);
        return st;
    }
    kiln_compile_opts o = bundle_opts(b);
    kiln_status       st = cg_plan_read(b->t[i].plan, b->t[i].plan_size, g, &o, out);
    return st ? kb_wrap(st, "%s: program for %s", b->path, b->t[i].arch) : NULL;
}

static const char *target_kind(const char *arch) {
    kb_arch a;
    if (!kb_arch_parse(arch, &a)) return "unknown";
    if (!a.ptx) return "cubins";
    return a.suffix == 'a' ? "PTX (for this exact arch only)" : "PTX (the driver compiles it for this and later GPUs)";
}

/* Every program is read against the bundle's graph: the structure of each, and that this kiln
 * lowers the graph to the IR each was built for. */
kiln_status kiln_bundle_describe(const kiln_bundle *b, char **text) {
    if (!b || !text) return kb_error(KILN_ERR_INVALID, "kiln_bundle_describe: NULL argument");
    *text = NULL;
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_graph *g = NULL;
    kiln_status st = ctx ? kiln_parse(ctx, b->graph, strlen(b->graph), "bundle graph") : kb_oom();
    if (!st) st = kiln_graph_new(ctx, &g);
    kb_str o = {0};
    kb_str_addf(&o, "bundle %s: %zu bytes, checksum ok\n%s", b->path, b->size, b->sign);
    kiln_compile_opts opts = bundle_opts(b);
    for (int i = 0; !st && i < b->ntargets; i++) {
        kiln_program *p;
        st = cg_plan_read(b->t[i].plan, b->t[i].plan_size, g, &opts, &p);
        if (st) {
            st = kb_wrap(st, "%s: program for %s", b->path, b->t[i].arch);
            break;
        }
        int kernels = p->nkernels;
        for (int v = 0; v < p->nspec; v++) kernels += p->spec[v]->nkernels;
        kb_str_addf(&o, "target %s: %s, %d kernels in %d program%s, %zu bytes, verified against the graph\n",
                    b->t[i].arch, target_kind(b->t[i].arch),
                    kernels, 1 + p->nspec, p->nspec ? "s" : "", b->t[i].plan_size);
        kiln_program_free(p);
    }
    if (!st) kb_str_addf(&o, "graph (%zu bytes):\n%s", strlen(b->graph), b->graph);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    if (st) {
        kb_str_free(&o);
        return st;
    }
    *text = kb_str_take(&o);
    return *text ? NULL : kb_oom();
}
