/* kiln_cache_explain: for each kernel of a graph's program, whether the cache holds it and,
 * when not, which input of its key differs from the nearest entry that is cached — so that a
 * user who expected a warm start learns why it was cold (another arch, another NVRTC, a
 * template change that altered line 12 of the source ...). */
#include "codegen/codegen.h"

#include "cache/cache.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An entry's meta (written by compile.c): "key value" lines, then "--- NAME" and a body. */
typedef struct {
    char       *text;
    const char *body;
    kc_key      key;
    char        key_hex[33];
} meta_entry;

typedef struct {
    meta_entry *e;
    int         n, cap;
    kc_kind     kind;
} meta_list;

static const char *meta_body(const char *meta) {
    const char *s = strncmp(meta, "--- ", 4) == 0 ? meta : strstr(meta, "\n--- ");
    if (!s) return "";
    const char *nl = strchr(s + 1, '\n');
    return nl ? nl + 1 : "";
}

static int collect(void *user, const kc_entry *e) {
    meta_list *l = user;
    if (e->kind != l->kind || !e->meta) return 0;
    if (l->n == l->cap) {
        int         cap = l->cap ? 2 * l->cap : 64;
        meta_entry *ne = realloc(l->e, (size_t)cap * sizeof *ne);
        if (!ne) return 1;
        l->e = ne;
        l->cap = cap;
    }
    meta_entry *m = &l->e[l->n];
    if (!(m->text = strdup(e->meta))) return 1;
    m->body = meta_body(m->text);
    m->key = e->key;
    memcpy(m->key_hex, e->key_hex, 33);
    l->n++;
    return 0;
}

static void free_list(meta_list *l) {
    for (int i = 0; i < l->n; i++) free(l->e[i].text);
    free(l->e);
}

/* A key input compared: its name in the meta, and our value. */
typedef struct {
    const char *name;
    char        ours[512];
} field;

static void set_field(field *f, const char *name, const char *fmt, ...) KB_PRINTF(3, 4);
static void set_field(field *f, const char *name, const char *fmt, ...) {
    f->name = name;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->ours, sizeof f->ours, fmt, ap);
    va_end(ap);
}

/* Where two texts first differ: "line L: cached `...`, now `...`". */
static void first_difference(const char *cached, const char *now, kb_str *o) {
    int         line = 1;
    const char *a = cached, *b = now;
    const char *la = a, *lb = b;
    while (*a && *a == *b) {
        if (*a == '\n') line++, la = a + 1, lb = b + 1;
        a++, b++;
    }
    int na = (int)strcspn(la, "\n"), nb = (int)strcspn(lb, "\n");
    kb_str_addf(o, "line %d: cached `%.*s`%s, now `%.*s`%s", line, na > 100 ? 100 : na, la, na > 100 ? "..." : "",
                nb > 100 ? 100 : nb, lb, nb > 100 ? "..." : "");
}

/* Differing fields (and the body) between our inputs and entry m; returns their count. */
static int compare(const field *ours, int nf, const char *body_name, const char *body, const meta_entry *m, kb_str *why) {
    int diff = 0;
    for (int i = 0; i < nf; i++) {
        char theirs[512];
        kb_text_field(m->text, ours[i].name, theirs, sizeof theirs);
        if (!strcmp(theirs, ours[i].ours)) continue;
        if (why) kb_str_addf(why, "%s%s (cached %s, now %s)", diff ? "; " : "", ours[i].name, theirs, ours[i].ours);
        diff++;
    }
    if (strcmp(m->body, body) != 0) {
        if (why) {
            kb_str_addf(why, "%s%s (", diff ? "; " : "", body_name);
            first_difference(m->body, body, why);
            kb_str_add(why, ")");
        }
        diff++;
    }
    return diff;
}

static size_t common_prefix(const char *a, const char *b) {
    size_t n = 0;
    while (a[n] && a[n] == b[n]) n++;
    return n;
}

/* The entry with the fewest differing inputs; ties go to the same name, then to the longer
 * common prefix of the body. -1 when the list is empty. */
static int nearest(const meta_list *l, const field *f, int nf, const char *name, const char *body) {
    int    best = -1, best_diff = 0;
    bool   best_name = false;
    size_t best_common = 0;
    for (int i = 0; i < l->n; i++) {
        int    d = compare(f, nf, "", body, &l->e[i], NULL);
        char   first[128];
        size_t fl = strcspn(l->e[i].text, "\n");
        snprintf(first, sizeof first, "%.*s", (int)(fl < 127 ? fl : 127), l->e[i].text);
        bool   same = strcmp(first, name) == 0;
        size_t common = common_prefix(l->e[i].body, body);
        if (best < 0 || d < best_diff || (d == best_diff && (same > best_name || (same == best_name && common > best_common)))) {
            best = i, best_diff = d, best_name = same, best_common = common;
        }
    }
    return best;
}

static void explain_miss(kb_str *o, const meta_list *l, const field *f, int nf, const char *name, const char *body_name,
                         const char *body, const char *what) {
    int i = nearest(l, f, nf, name, body);
    if (i < 0) {
        kb_str_addf(o, "not cached; the cache holds no %s to compare with\n", what);
        return;
    }
    kb_str why = {0};
    compare(f, nf, body_name, body, &l->e[i], &why);
    size_t fl = strcspn(l->e[i].text, "\n");
    kb_str_addf(o, "not cached; nearest cached %s %.8s (%.*s) differs in: %s\n", what, l->e[i].key_hex, (int)fl,
                l->e[i].text, why.s ? why.s : "nothing (a key collision?)");
    kb_str_free(&why);
}

static bool cached(const kc_cache *c, kc_kind kind, const uint8_t key[16]) {
    kc_key k;
    memcpy(k.b, key, 16);
    void       *data = NULL;
    size_t      n;
    kiln_status st = kc_get(c, kind, k, &data, &n, NULL);
    bool        hit = !st && data;
    kiln_status_free(st);
    free(data);
    return hit;
}

static void explain_kernels(kb_str *o, const kc_cache *c, const kiln_program *p, const cg_env_info *env,
                            const meta_list *kl, int *nmiss, int *ndistinct, const char *variant) {
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        bool             seen = false;
        for (int j = 0; j < i && !seen; j++) seen = !memcmp(p->kernels[j].key, k->key, 16);
        if (k->kind != CG_LAUNCH || seen) continue;
        (*ndistinct)++;
        kb_str_addf(o, "  %sk%d %s %.8s: ", variant, i, k->name, k->key_hex);
        if (cached(c, KC_CUBIN, k->key)) {
            kb_str_add(o, "cached\n");
            continue;
        }
        (*nmiss)++;
        field f[5];
        set_field(&f[0], "kiln", "%s", KILN_VERSION);
        set_field(&f[1], "codegen", "%d", CG_CODEGEN_VERSION);
        set_field(&f[2], "nvrtc", "%d.%d", env->nvrtc_major, env->nvrtc_minor);
        set_field(&f[3], "arch", "%s", p->arch);
        set_field(&f[4], "options", "%s", env->options);
        char name[80];
        snprintf(name, sizeof name, "kernel %s", k->name);
        explain_miss(o, kl, f, 5, name, "source", k->source, "kernel");
    }
}

kiln_status kiln_cache_explain(const kiln_graph *g, const kiln_compile_opts *opts, char **text) {
    if (!g || !text) return kb_error(KILN_ERR_INVALID, "kiln_cache_explain: NULL argument");
    *text = NULL;
    kiln_compile_opts o = opts ? *opts : (kiln_compile_opts){0};
    o.skip_nvrtc = 1;
    o.no_program_cache = 1;
    o.dump_dir = "";
    kc_cache    c = {.mode = KILN_CACHE_READONLY};
    kiln_program *p = NULL;
    cg_env_info env;
    kc_key      pkey;
    char       *graph = NULL;
    kiln_status st = kc_default_dir(o.cache_dir, &c.dir);
    if (!st) st = kiln_compile(g, &o, &p);
    if (!st) st = cg_program_key(g, &o, p->arch, &pkey, &env, &graph);
    meta_list   kl = {.kind = KC_CUBIN}, pl = {.kind = KC_PROGRAM};
    if (!st) st = kc_walk(&c, true, collect, &kl);
    if (!st) st = kc_walk(&c, true, collect, &pl);
    kb_str out = {0};
    if (!st) {
        char hex[33];
        kc_key_hex(pkey, hex);
        kb_str_addf(&out, "cache %s, arch %s, nvrtc %d.%d\nprogram %.8s: ", c.dir, p->arch, env.nvrtc_major,
                    env.nvrtc_minor, hex);
        if (cached(&c, KC_PROGRAM, pkey.b)) kb_str_add(&out, "cached (a run loads it without Lua or NVRTC)\n");
        else {
            field f[5];
            set_field(&f[0], "kiln", "%s build %s", KILN_VERSION, kiln_build_id());
            set_field(&f[1], "plan", "%d", CG_PLAN_VERSION);
            set_field(&f[2], "nvrtc", "%d.%d", env.nvrtc_major, env.nvrtc_minor);
            set_field(&f[3], "arch", "%s", p->arch);
            set_field(&f[4], "options", "%s", env.program_options);
            explain_miss(&out, &pl, f, 5, "program", "graph", graph, "program");
        }
        int  nmiss = 0, ndistinct = 0;
        kb_str ks = {0};
        explain_kernels(&ks, &c, p, &env, &kl, &nmiss, &ndistinct, "");
        for (int v = 0; v < p->nspec; v++) {
            char prefix[96], label[FE_MAX_NAME + 32];
            snprintf(prefix, sizeof prefix, "[%s] ", cg_spec_label(g->ctx, p->spec_dim[v], p->spec_val[v], label, sizeof label));
            explain_kernels(&ks, &c, p->spec[v], &env, &kl, &nmiss, &ndistinct, prefix);
        }
        kb_str_addf(&out, "kernels: %d distinct, %d cached, %d not cached\n", ndistinct, ndistinct - nmiss, nmiss);
        if (ks.s) kb_str_add(&out, ks.s);
        kb_str_free(&ks);
    }
    free_list(&kl);
    free_list(&pl);
    free(graph);
    free(c.dir);
    kiln_program_free(p);
    if (st) {
        kb_str_free(&out);
        return st;
    }
    *text = kb_str_take(&out);
    return *text ? NULL : kb_oom();
}
