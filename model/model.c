/* kiln_model: a GGUF file with the hyperparameters read from it, and its weights bound by name
 * to a graph of kiln_build_model. */
#include "base/base.h"
#include "model/arch.h"
#include "model/gguf.h"

#include <stdlib.h>
#include <string.h>

struct kiln_model {
    kiln_gguf         *gguf;   /* NULL for a random model */
    km_random         *random; /* kiln_model_random: weights made where they are needed */
    kiln_model_hparams hp;
};

/* Tensors of a type kiln lacks (q3_K, iq4_xs, ...) are refused up front, with the first one's
 * name: loading would otherwise fail later at a weight kiln cannot compute with. */
static kiln_status refuse_unknown_types(const kiln_gguf *g) {
    int64_t n = kiln_gguf_tensor_count(g);
    for (int64_t i = 0; i < n; i++) {
        kiln_gguf_tensor t;
        kiln_status st = kiln_gguf_tensor_info(g, i, &t);
        if (st) return st;
        if (t.has_kiln_type) continue;
        char q[300];
        km_quote(t.name, q);
        return kb_error(KILN_ERR_FORMAT, "%s: tensor '%s' is %s; kiln runs %s", km_gguf_label(g), q, t.type_name,
                        km_weight_type_list());
    }
    return NULL;
}

/* Every check of a GGUF model before anything is built from it: types kiln lacks, then the
 * keys (kiln_model_hparams_from_gguf, which bounds them), then the tensors against the keys, so
 * that a header that claims more than the file holds is refused at once. Each message starts
 * with the file's path. */
kiln_status kiln_model_from_gguf(kiln_gguf *g, kiln_model **out) {
    if (out) *out = NULL;
    if (!g || !out) {
        kiln_gguf_close(g);
        return kb_error(KILN_ERR_INVALID, "kiln_model_from_gguf: NULL argument");
    }
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) {
        kiln_gguf_close(g);
        return kb_oom();
    }
    m->gguf = g;
    kiln_status st = refuse_unknown_types(g);
    if (!st) st = kiln_model_hparams_from_gguf(g, &m->hp);
    if (!st) st = km_check_tensors(g, &m->hp);
    if (st) {
        kiln_model_close(m);
        return st;
    }
    *out = m;
    return NULL;
}

kiln_status kiln_model_open(const char *path, kiln_model **out) {
    if (out) *out = NULL;
    if (!path || !out) return kb_error(KILN_ERR_INVALID, "kiln_model_open: NULL argument");
    kiln_gguf  *g;
    kiln_status st = kiln_gguf_open(path, &g);
    return st ? st : kiln_model_from_gguf(g, out); /* both name the file in their messages */
}

static kiln_status random_model(const char *fn, const kiln_model_hparams *hp, uint64_t seed, bool quant_blocks,
                                kiln_model **out) {
    if (out) *out = NULL;
    if (!hp || !out) return kb_error(KILN_ERR_INVALID, "%s: NULL argument", fn);
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kb_oom();
    m->hp = *hp;
    kiln_status st = km_random_new(hp, seed, quant_blocks, &m->random);
    if (st) {
        free(m);
        return st;
    }
    *out = m;
    return NULL;
}

kiln_status kiln_model_random(const kiln_model_hparams *hp, uint64_t seed, kiln_model **out) {
    return random_model("kiln_model_random", hp, seed, false, out);
}

kiln_status kiln_model_random_blocks(const kiln_model_hparams *hp, uint64_t seed, kiln_model **out) {
    return random_model("kiln_model_random_blocks", hp, seed, true, out);
}

void kiln_model_close(kiln_model *m) {
    if (!m) return;
    km_random_free(m->random);
    kiln_gguf_close(m->gguf);
    free(m);
}

const kiln_model_hparams *kiln_model_get_hparams(const kiln_model *m) { return m ? &m->hp : NULL; }
const kiln_gguf          *kiln_model_gguf(const kiln_model *m) { return m ? m->gguf : NULL; }

void km_shape_text(const int64_t ne[4], int nd, char *out, size_t n) {
    int len = snprintf(out, n, "[");
    for (int i = 0; i < nd && len > 0 && (size_t)len < n; i++)
        len += snprintf(out + len, n - (size_t)len, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (len > 0 && (size_t)len < n) snprintf(out + len, n - (size_t)len, "]");
}

int km_n_dims(const int64_t ne[4]) {
    int nd = 1;
    for (int i = 0; i < 4; i++)
        if (ne[i] != 1) nd = i + 1;
    return nd;
}

static kiln_status check_weight(const kiln_model *m, const kiln_tensor *w) {
    const char *name = kiln_tensor_name(w), *file = km_gguf_label(m->gguf);
    int64_t     i = kiln_gguf_find_tensor(m->gguf, name);
    int64_t     want[4];
    for (int d = 0; d < 4; d++) want[d] = kiln_tensor_ne(w, d);
    char ws[96], fs[96];
    km_shape_text(want, km_n_dims(want), ws, sizeof ws);
    if (i < 0)
        return kb_error(KILN_ERR_NOT_FOUND, "%s: no tensor '%s' (%s %s), which the %s graph needs", file, name,
                        kiln_type_name(kiln_tensor_type(w)), ws, m->hp.arch);
    kiln_gguf_tensor t;
    kiln_status st = kiln_gguf_tensor_info(m->gguf, i, &t);
    if (st) return st;
    km_shape_text(t.ne, t.n_dims, fs, sizeof fs);
    if (memcmp(t.ne, want, sizeof want) != 0)
        return kb_error(KILN_ERR_SHAPE, "%s: tensor '%s' is %s in the file; the graph needs %s", file, name, fs, ws);
    if (!t.has_kiln_type || t.type != kiln_tensor_type(w))
        return kb_error(KILN_ERR_SHAPE, "%s: tensor '%s' is %s in the file; the graph needs %s (kiln_model_build "
                                        "makes a graph with the file's types)", file, name, t.type_name,
                        kiln_type_name(kiln_tensor_type(w)));
    return NULL;
}

kiln_status kiln_model_build(kiln_ctx *ctx, const kiln_model *m, const kiln_build_opts *o) {
    if (!ctx || !m) return kb_error(KILN_ERR_INVALID, "kiln_model_build: NULL argument");
    return km_build(ctx, &m->hp, o, m->gguf);
}

kiln_status kiln_model_check_weights(const kiln_model *m, const kiln_graph *g) {
    if (!m || !g) return kb_error(KILN_ERR_INVALID, "kiln_model_check_weights: NULL argument");
    for (int i = 0; i < kiln_graph_size(g); i++) {
        const kiln_tensor *t = kiln_graph_node(g, i);
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        int64_t ne[4];
        for (int d = 0; d < 4; d++) ne[d] = kiln_tensor_ne(t, d);
        kiln_status st = m->random ? km_random_check(m->random, kiln_tensor_name(t), kiln_tensor_type(t), ne)
                                   : check_weight(m, t);
        if (st) return st;
    }
    return NULL;
}

const void *kiln_model_weight(const kiln_model *m, const char *name, kiln_type type, int64_t n) {
    if (!m || !name) return NULL;
    if (m->random) return km_random_host(m->random, name, type, n); /* a cache: logically const */
    int64_t i = kiln_gguf_find_tensor(m->gguf, name);
    kiln_gguf_tensor t;
    if (i < 0 || kiln_gguf_tensor_info(m->gguf, i, &t) || !t.has_kiln_type || t.type != type) return NULL;
    int64_t count = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    return count == n ? t.data : NULL;
}

static const void *file_weight(void *user, const char *name, kiln_type type, size_t bytes) {
    return kiln_model_weight(user, name, type, (int64_t)(bytes / kiln_type_size(type)) * kiln_type_block(type));
}

static kiln_status random_init(void *user, const char *name, kiln_type type, const int64_t ne[4],
                               kiln_weight_init *out) {
    return km_random_init(user, name, type, ne, out);
}

static kiln_status random_init_rank(void *user, const char *name, kiln_type type, const int64_t ne[4],
                                    kiln_weight_init *out) {
    return km_random_init_rank(user, name, type, ne, out);
}

kiln_status km_model_fill_rank(const kiln_model *m, kiln_session *s) {
    if (!m || !s || !m->random) return kb_error(KILN_ERR_INVALID, "km_model_fill_rank: not a random model");
    return kiln_session_fill_weights(s, random_init_rank, m->random);
}

kiln_status kiln_model_load(const kiln_model *m, kiln_session *s,
                            void (*progress)(void *user, uint64_t done, uint64_t total), void *user) {
    if (!m || !s) return kb_error(KILN_ERR_INVALID, "kiln_model_load: NULL argument");
    if (m->random) return kiln_session_fill_weights(s, random_init, m->random);
    return kiln_session_load_weights(s, file_weight, (void *)m, progress, user);
}
