/* The GGUF writer (docs/gguf.md): version 3, keys and tensors in the order added, tensors at
 * offsets that are multiples of the alignment (general.alignment, else 32), each followed by
 * zero padding to it, as ggml writes them. Values are serialized when set; kiln_gguf_write
 * builds the header in memory (a 150k-token vocabulary is a few MB), then streams header and
 * tensor data through one buffer of at most CHUNK bytes into PATH.tmp.PID, renamed over PATH at
 * the end. Setters record the first error; kiln_gguf_write returns it. */
#include "model/gguf.h"

#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The write buffer, and the most a fill call produces at once (a multiple of every type size). */
#define CHUNK ((size_t)32 << 20)

typedef struct {
    char    *key;
    uint32_t type;
    kb_str   val; /* the value as in the file, after the type field */
} wkv;

typedef struct {
    char     *name;
    kiln_type type;
    int       n_dims;
    int64_t   ne[KILN_MAX_DIMS];
    size_t    bytes;
    void     *data; /* a copy, or NULL: produced by fill */
} wtensor;

struct kiln_gguf_writer {
    wkv        *kv;
    int64_t     n_kv, cap_kv;
    km_index    kv_index;
    wtensor    *t;
    int64_t     n_t, cap_t;
    km_index    t_index;
    kiln_status err; /* the first error */
};

kiln_gguf_writer *kiln_gguf_writer_new(void) { return calloc(1, sizeof(kiln_gguf_writer)); }

void kiln_gguf_writer_free(kiln_gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        kb_str_free(&w->kv[i].val);
    }
    for (int64_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->kv);
    free(w->t);
    km_index_free(&w->kv_index);
    km_index_free(&w->t_index);
    kiln_status_free(w->err);
    free(w);
}

static void record(kiln_gguf_writer *w, kiln_status st) {
    if (!w->err) w->err = st;
    else kiln_status_free(st);
}

/* key's value, emptied and given type (a new key is appended); NULL after recording an error. */
static kb_str *value_slot(kiln_gguf_writer *w, const char *fn, const char *key, uint32_t type) {
    if (!key || !*key) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: empty key", fn));
        return NULL;
    }
    if (!strcmp(key, KM_GGUF_ALIGNMENT_KEY) && type != KILN_GGUF_U32) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: %s must be a u32, not %s", fn, key,
                           kiln_gguf_type_name((kiln_gguf_type)type)));
        return NULL;
    }
    int64_t i = km_index_get(&w->kv_index, key), found;
    if (i < 0) {
        char *k = strdup(key);
        if (!k || !km_grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv) ||
            !km_index_put(&w->kv_index, k, w->n_kv, &found)) {
            free(k);
            record(w, kb_oom());
            return NULL;
        }
        i = w->n_kv++;
        w->kv[i] = (wkv){.key = k};
    }
    kb_str_free(&w->kv[i].val);
    w->kv[i].type = type;
    return &w->kv[i].val;
}

static void check_oom(kiln_gguf_writer *w, const kb_str *b) {
    if (b->oom) record(w, kb_oom());
}

/* n values of fixed-size type t at v, checked: bools must be 0 or 1. */
static bool check_bools(kiln_gguf_writer *w, const char *fn, const char *key, uint32_t t, uint64_t n, const void *v) {
    const uint8_t *b = v;
    for (uint64_t i = 0; t == KILN_GGUF_BOOL && i < n; i++)
        if (b[i] > 1) {
            record(w, kb_error(KILN_ERR_INVALID, "%s: key '%s': bool element %" PRIu64 " is %u, not 0 or 1", fn,
                               key ? key : "", i, b[i]));
            return false;
        }
    return true;
}

void kiln_gguf_set_scalar(kiln_gguf_writer *w, const char *key, kiln_gguf_type type, const void *v) {
    static const char fn[] = "kiln_gguf_set_scalar";
    if (!w) return;
    size_t sz = km_gguf_value_size(type);
    if (!sz) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: key '%s': type %s is not a numeric or bool type", fn,
                           key ? key : "", kiln_gguf_type_name(type)));
        return;
    }
    if (!v) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: key '%s': NULL value", fn, key ? key : ""));
        return;
    }
    if (!check_bools(w, fn, key, type, 1, v)) return;
    if (type == KILN_GGUF_U32 && key && !strcmp(key, KM_GGUF_ALIGNMENT_KEY)) {
        uint32_t a;
        memcpy(&a, v, 4);
        if (!a || (a & (a - 1))) {
            record(w, kb_error(KILN_ERR_INVALID, "%s: %s %" PRIu32 " is not a power of 2", fn, key, a));
            return;
        }
    }
    kb_str *b = value_slot(w, fn, key, type);
    if (!b) return;
    kb_str_addn(b, v, sz);
    check_oom(w, b);
}

void kiln_gguf_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v) { kiln_gguf_set_scalar(w, key, KILN_GGUF_U32, &v); }
void kiln_gguf_set_i32(kiln_gguf_writer *w, const char *key, int32_t v) { kiln_gguf_set_scalar(w, key, KILN_GGUF_I32, &v); }
void kiln_gguf_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v) { kiln_gguf_set_scalar(w, key, KILN_GGUF_U64, &v); }
void kiln_gguf_set_f32(kiln_gguf_writer *w, const char *key, float v) { kiln_gguf_set_scalar(w, key, KILN_GGUF_F32, &v); }

void kiln_gguf_set_bool(kiln_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    kiln_gguf_set_scalar(w, key, KILN_GGUF_BOOL, &b);
}

void kiln_gguf_set_str(kiln_gguf_writer *w, const char *key, const char *v) {
    if (!w) return;
    if (!v) {
        record(w, kb_error(KILN_ERR_INVALID, "kiln_gguf_set_str: key '%s': NULL value", key ? key : ""));
        return;
    }
    kb_str *b = value_slot(w, "kiln_gguf_set_str", key, KILN_GGUF_STRING);
    if (!b) return;
    kb_put_cstr(b, v);
    check_oom(w, b);
}

void kiln_gguf_set_arr(kiln_gguf_writer *w, const char *key, kiln_gguf_type elem, uint64_t n, const void *data) {
    static const char fn[] = "kiln_gguf_set_arr";
    if (!w) return;
    size_t sz = km_gguf_value_size(elem);
    if (!sz) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: key '%s': element type %s is not numeric or bool (string arrays: "
                           "kiln_gguf_set_arr_str)", fn, key ? key : "", kiln_gguf_type_name(elem)));
        return;
    }
    if ((n && !data) || n > SIZE_MAX / sz) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: key '%s': %s", fn, key ? key : "",
                           n && !data ? "NULL data" : "too many elements"));
        return;
    }
    if (!check_bools(w, fn, key, elem, n, data)) return;
    kb_str *b = value_slot(w, fn, key, KILN_GGUF_ARRAY);
    if (!b) return;
    kb_put_u32(b, elem);
    kb_put_u64(b, n);
    if (n) kb_str_addn(b, data, (size_t)n * sz);
    check_oom(w, b);
}

void kiln_gguf_set_arr_str(kiln_gguf_writer *w, const char *key, uint64_t n, const char *const *v) {
    static const char fn[] = "kiln_gguf_set_arr_str";
    if (!w) return;
    for (uint64_t i = 0; i < n; i++)
        if (!v || !v[i]) {
            record(w, kb_error(KILN_ERR_INVALID, "%s: key '%s': element %" PRIu64 " is NULL", fn, key ? key : "", i));
            return;
        }
    kb_str *b = value_slot(w, fn, key, KILN_GGUF_ARRAY);
    if (!b) return;
    kb_put_u32(b, KILN_GGUF_STRING);
    kb_put_u64(b, n);
    for (uint64_t i = 0; i < n; i++) kb_put_cstr(b, v[i]);
    check_oom(w, b);
}

void kiln_gguf_add_tensor(kiln_gguf_writer *w, const char *name, kiln_type type, int n_dims, const int64_t *ne,
                          const void *data) {
    static const char fn[] = "kiln_gguf_add_tensor";
    if (!w) return;
    if (!name || !*name) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: empty tensor name", fn));
        return;
    }
    if ((unsigned)type >= KILN_TYPE_COUNT || n_dims < 1 || n_dims > KILN_MAX_DIMS || !ne) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: tensor '%s': %s", fn, name,
                           (unsigned)type >= KILN_TYPE_COUNT ? "unknown type"
                           : !ne                             ? "NULL extents"
                                                             : "a tensor has 1 to 4 dims"));
        return;
    }
    wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    uint64_t nel = 1, limit = (uint64_t)INT64_MAX / kiln_type_size(type);
    for (int j = 0; j < n_dims; j++) {
        if (ne[j] < 1 || (uint64_t)ne[j] > limit / nel) {
            record(w, kb_error(KILN_ERR_INVALID, "%s: tensor '%s': ne[%d] = %" PRId64 " %s", fn, name, j, ne[j],
                               ne[j] < 1 ? "is not positive" : "makes the size overflow"));
            return;
        }
        nel *= (uint64_t)ne[j];
        t.ne[j] = ne[j];
    }
    if (ne[0] % kiln_type_block(type) != 0) {
        record(w, kb_error(KILN_ERR_INVALID,
                           "%s: tensor '%s' has rows of %" PRId64 " elements; %s holds rows of whole "
                           "%" PRId64 "-element blocks",
                           fn, name, ne[0], kiln_type_name(type), kiln_type_block(type)));
        return;
    }
    t.bytes = kiln_row_size(type, ne[0]) * (size_t)(nel / (uint64_t)ne[0]);
    if (km_index_get(&w->t_index, name) >= 0) {
        record(w, kb_error(KILN_ERR_INVALID, "%s: duplicate tensor '%s'", fn, name));
        return;
    }
    int64_t found;
    t.name = strdup(name);
    t.data = data ? malloc(t.bytes) : NULL;
    if (!t.name || (data && !t.data) || !km_grow((void **)&w->t, &w->cap_t, w->n_t, sizeof *w->t) ||
        !km_index_put(&w->t_index, t.name, w->n_t, &found)) {
        free(t.name);
        free(t.data);
        record(w, kb_oom());
        return;
    }
    if (data) memcpy(t.data, data, t.bytes);
    w->t[w->n_t++] = t;
}

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct {
    int         fd;
    const char *tmp;
    uint8_t    *buf;
    size_t      cap, len;
    uint64_t    done, total;
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *user;
} out;

static kiln_status flush(out *o) {
    for (size_t off = 0; off < o->len;) {
        ssize_t n = write(o->fd, o->buf + off, o->len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return kb_error(KILN_ERR_IO, "%s: write failed: %s", o->tmp, n < 0 ? strerror(errno) : "no progress");
        off += (size_t)n;
    }
    o->done += o->len;
    o->len = 0;
    if (o->progress) o->progress(o->user, o->done, o->total);
    return NULL;
}

/* n bytes from p, or n zeros when p is NULL. */
static kiln_status emit(out *o, const void *p, size_t n) {
    const uint8_t *s = p;
    while (n) {
        if (o->len == o->cap) {
            kiln_status st = flush(o);
            if (st) return st;
        }
        size_t k = n < o->cap - o->len ? n : o->cap - o->len;
        if (s) {
            memcpy(o->buf + o->len, s, k);
            s += k;
        } else {
            memset(o->buf + o->len, 0, k);
        }
        o->len += k;
        n -= k;
    }
    return NULL;
}

static uint64_t pad_to(uint64_t n, uint64_t align) { return (align - n % align) % align; }

/* Tensor i's bytes through fill, in chunks of at most the buffer's size cut to whole elements
 * (whole blocks of a quantized type, 18 to 210 bytes: a quantizer fills whole blocks), each
 * into an emptied buffer unless the rest fits where the buffer stands. */
static kiln_status fill_tensor(out *o, const wtensor *t, int64_t i, kiln_gguf_fill_fn fill, void *user) {
    size_t unit = kiln_type_size(t->type), most = o->cap / unit * unit;
    for (size_t off = 0; off < t->bytes;) {
        size_t rest = t->bytes - off, n = rest < most ? rest : most;
        if (o->cap - o->len < n) {
            kiln_status st = flush(o);
            if (st) return st;
        }
        memset(o->buf + o->len, 0, n); /* what fill leaves unwritten is zero, not stale */
        kiln_status st = fill(user, i, t->name, off, o->buf + o->len, n);
        if (st) return kb_wrap(st, "tensor %" PRId64 " ('%s')", i, t->name);
        o->len += n;
        off += n;
    }
    return NULL;
}

/* The header: magic, version, counts, key-value pairs, tensor infos, padding. */
static void put_header(const kiln_gguf_writer *w, uint64_t align, kb_str *h) {
    kb_str_addn(h, KM_GGUF_MAGIC, 4);
    kb_put_u32(h, KM_GGUF_VERSION);
    kb_put_u64(h, (uint64_t)w->n_t);
    kb_put_u64(h, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        kb_put_cstr(h, w->kv[i].key);
        kb_put_u32(h, w->kv[i].type);
        kb_str_addn(h, w->kv[i].val.s, w->kv[i].val.len);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        kb_put_cstr(h, t->name);
        kb_put_u32(h, (uint32_t)t->n_dims);
        for (int j = 0; j < t->n_dims; j++) kb_put_u64(h, (uint64_t)t->ne[j]);
        kb_put_u32(h, km_ggml_from_kiln(t->type));
        kb_put_u64(h, off);
        off += t->bytes + pad_to(t->bytes, align);
    }
    static const char zero[256];
    for (size_t n = (size_t)pad_to(h->len, align); n;) { /* align may be up to 2^31 */
        size_t k = n < sizeof zero ? n : sizeof zero;
        kb_str_addn(h, zero, k);
        n -= k;
    }
}

static kiln_status write_body(const kiln_gguf_writer *w, out *o, const kb_str *h, uint64_t align,
                              kiln_gguf_fill_fn fill, void *user) {
    kiln_status st = emit(o, h->s, h->len);
    for (int64_t i = 0; !st && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        st = t->data ? emit(o, t->data, t->bytes) : fill_tensor(o, t, i, fill, user);
        if (!st) st = emit(o, NULL, (size_t)pad_to(t->bytes, align));
    }
    return st ? st : flush(o);
}

kiln_status kiln_gguf_write(kiln_gguf_writer *w, const char *path, kiln_gguf_fill_fn fill, void *user,
                            void (*progress)(void *user, uint64_t done, uint64_t total)) {
    if (!w || !path) return kb_error(KILN_ERR_INVALID, "kiln_gguf_write: NULL argument");
    if (w->err) return kb_wrap(kb_status_copy(w->err), "writing %s", path); /* a setter's, recorded */
    uint64_t align = KM_GGUF_DEFAULT_ALIGNMENT, total;
    int64_t  ai = km_index_get(&w->kv_index, KM_GGUF_ALIGNMENT_KEY);
    if (ai >= 0) {
        uint32_t a;
        memcpy(&a, w->kv[ai].val.s, 4);
        align = a;
    }
    for (int64_t i = 0; i < w->n_t; i++)
        if (!w->t[i].data && !fill)
            return kb_error(KILN_ERR_INVALID, "writing %s: tensor %" PRId64 " ('%s') has no data and there is no fill "
                                              "callback", path, i, w->t[i].name);
    kb_str h = {0};
    put_header(w, align, &h);
    if (h.oom) {
        kb_str_free(&h);
        return kb_oom();
    }
    total = h.len;
    for (int64_t i = 0; i < w->n_t; i++) total += w->t[i].bytes + pad_to(w->t[i].bytes, align);

    out   o = {.fd = -1, .total = total, .progress = progress, .user = user};
    char *tmp = NULL;
    o.cap = total < CHUNK ? (size_t)(total + 7) / 8 * 8 : CHUNK;
    o.buf = calloc(1, o.cap);
    kiln_status st = NULL;
    if (!o.buf || asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0) {
        tmp = NULL;
        st = kb_oom();
    } else if ((o.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0) {
        st = kb_error(KILN_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        o.tmp = tmp;
        st = write_body(w, &o, &h, align, fill, user);
        if (close(o.fd) != 0 && !st) st = kb_error(KILN_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        if (!st && rename(tmp, path) != 0)
            st = kb_error(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (st) unlink(tmp);
    }
    if (st) st = kb_wrap(st, "writing %s", path);
    free(tmp);
    free(o.buf);
    kb_str_free(&h);
    return st;
}
