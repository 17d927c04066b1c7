/* The GGUF reader (docs/gguf.md). kiln_gguf_open maps the file and checks all of it before it
 * returns: the header, every key-value pair, every tensor info, the alignment, and each tensor's
 * bytes against the file and the other tensors. A malformed file is a KILN_ERR_FORMAT status
 * naming the file, the field and its byte offset. Afterwards the object is immutable: getters
 * fail only on a missing key or a type that does not fit, and may run on many threads.
 *
 * Layout (little-endian): "GGUF", u32 version (2 or 3), u64 n_tensors, u64 n_kv;
 * n_kv x (string key, u32 value type, value); n_tensors x (string name, u32 n_dims, n_dims x
 * i64 ne, u32 ggml type, u64 offset); zero padding to the alignment; the data section. A string
 * is a u64 length and its bytes; an array a u32 element type, a u64 count and the elements. */
#include "model/gguf.h"

#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The fewest bytes a key-value pair (key length, a 1-byte key, type, a 1-byte value) and a
 * tensor info (name length, a 1-byte name, n_dims, one extent, type, offset) can take: counts
 * are checked against them before anything is allocated. */
#define KV_MIN_BYTES (8 + 1 + 4 + 1)
#define TENSOR_MIN_BYTES (8 + 1 + 4 + 8 + 4 + 8)

/* ---- shared with the writer: growth and the name index ------------------------------------- */

bool km_grow(void **arr, int64_t *cap, int64_t n, size_t elem) {
    if (n < *cap) return true;
    int64_t c = *cap ? *cap * 2 : 64;
    void   *a = realloc(*arr, (size_t)c * elem);
    if (!a) return false;
    *arr = a;
    *cap = c;
    return true;
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3u;
    return h ^ (h >> 29);
}

static void slot_insert(km_slot *slot, size_t cap, km_slot v) {
    size_t h = (size_t)hash_name(v.name) & (cap - 1);
    while (slot[h].name) h = (h + 1) & (cap - 1);
    slot[h] = v;
}

bool km_index_put(km_index *x, const char *name, int64_t i, int64_t *found) {
    *found = km_index_get(x, name);
    if (*found >= 0) return true;
    if ((x->count + 1) * 2 > x->cap) { /* at most half full */
        size_t   cap = x->cap ? x->cap * 2 : 64;
        km_slot *s = calloc(cap, sizeof *s);
        if (!s) return false;
        for (size_t k = 0; k < x->cap; k++)
            if (x->slot[k].name) slot_insert(s, cap, x->slot[k]);
        free(x->slot);
        x->slot = s;
        x->cap = cap;
    }
    slot_insert(x->slot, x->cap, (km_slot){name, i});
    x->count++;
    return true;
}

int64_t km_index_get(const km_index *x, const char *name) {
    if (!x->cap) return -1;
    for (size_t h = (size_t)hash_name(name) & (x->cap - 1); x->slot[h].name; h = (h + 1) & (x->cap - 1))
        if (!strcmp(x->slot[h].name, name)) return x->slot[h].i;
    return -1;
}

void km_index_free(km_index *x) {
    free(x->slot);
    *x = (km_index){0};
}

/* ---- the object ---------------------------------------------------------------------------- */

typedef struct {
    char    *key;
    uint32_t type;     /* kiln_gguf_type */
    uint32_t elem;     /* arrays: the element type */
    uint64_t n;        /* arrays: the count; strings: the length */
    size_t   at_type;  /* file offset of the type field */
    size_t   at;       /* file offset of the value's bytes (after a string's length; an array's first element) */
    uint64_t *str_at;  /* string arrays: file offset of each element's length field */
} kv;

typedef struct {
    kiln_gguf_tensor t;
    size_t           at; /* file offset of the tensor's offset field */
} tensor;

struct kiln_gguf {
    char          *label;
    const uint8_t *base;
    size_t         size;
    bool           mapped; /* munmap base at close, else free it */
    uint32_t       version;
    size_t         alignment, data_offset;
    kv            *kv;
    int64_t        n_kv, cap_kv;
    km_index       kv_index;
    tensor        *tensors;
    int64_t        n_tensors, cap_tensors;
    km_index       tensor_index;
};

void kiln_gguf_close(kiln_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str_at);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].t.name);
    free(g->kv);
    free(g->tensors);
    km_index_free(&g->kv_index);
    km_index_free(&g->tensor_index);
    if (g->mapped && g->size) munmap((void *)g->base, g->size);
    else if (!g->mapped) free((void *)g->base);
    free(g->label);
    free(g);
}

/* ---- the parser ---------------------------------------------------------------------------- */

/* Where the parser is, for messages: "kv 12 ('tokenizer.ggml.tokens') array count at offset
 * 1234: ...". item is NULL in the header. */
typedef struct {
    kiln_gguf  *g;
    kb_reader   r;
    const char *item; /* "kv", "tensor" or NULL */
    int64_t     index;
    const char *name; /* the item's key or name once read */
    kiln_status st;
} parser;

/* s (NUL-terminated) for a message: at most 64 bytes, control bytes and quotes escaped. */
void km_quote(const char *s, char out[300]) {
    size_t o = 0, i = 0;
    for (; s[i] && i < 64; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') o += (size_t)snprintf(out + o, 5, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    if (s[i]) o += (size_t)snprintf(out + o, 4, "...");
    out[o] = 0;
}

static bool fail(parser *p, size_t at, const char *field, const char *fmt, ...) KB_PRINTF(4, 5);
static bool fail(parser *p, size_t at, const char *field, const char *fmt, ...) {
    if (p->st) return false;
    char    what[512], name[300] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (p->name) km_quote(p->name, name);
    char item[400] = "";
    if (p->item && p->name) snprintf(item, sizeof item, "%s %" PRId64 " ('%s') ", p->item, p->index, name);
    else if (p->item) snprintf(item, sizeof item, "%s %" PRId64 " ", p->item, p->index);
    p->st = kb_error(KILN_ERR_FORMAT, "%s: %s%s at offset %zu: %s", p->g->label, item, field, at, what);
    return false;
}

static bool oom(parser *p) {
    if (!p->st) p->st = kb_oom();
    return false;
}

static size_t left(const parser *p) { return p->r.len - p->r.pos; }

/* field at offset at needs `need` bytes, more than the file has left. */
static bool truncated(parser *p, size_t at, const char *field, size_t need) {
    return fail(p, at, field, "truncated: %zu bytes needed, %zu left in the file of %zu bytes", need, p->r.len - at,
                p->r.len);
}

static bool get_u32(parser *p, const char *field, uint32_t *v) {
    *v = kb_get_u32(&p->r, field);
    return p->r.err ? truncated(p, p->r.err_at, field, 4) : true;
}

static bool get_u64(parser *p, const char *field, uint64_t *v) {
    *v = kb_get_u64(&p->r, field);
    return p->r.err ? truncated(p, p->r.err_at, field, 8) : true;
}

/* A string: its u64 length, checked against the file, then the bytes (left in the file). */
static bool get_str(parser *p, const char *field, size_t *at, uint64_t *len) {
    char   f[64];
    size_t at_len = p->r.pos;
    snprintf(f, sizeof f, "%s length", field);
    if (!get_u64(p, f, len)) return false;
    if (*len > left(p))
        return fail(p, at_len, field, "length %" PRIu64 " runs past the end of the file (%zu bytes left)", *len,
                    left(p));
    *at = p->r.pos;
    p->r.pos += (size_t)*len;
    return true;
}

/* A key or tensor name: not empty, no NUL byte; *out a NUL-terminated copy. */
static bool get_name(parser *p, const char *field, char **out) {
    size_t   at_len = p->r.pos, at;
    uint64_t len;
    *out = NULL;
    if (!get_str(p, field, &at, &len)) return false;
    if (!len) return fail(p, at_len, field, "empty");
    const uint8_t *s = p->r.p + at, *nul = memchr(s, 0, (size_t)len);
    if (nul) return fail(p, at + (size_t)(nul - s), field, "contains a NUL byte");
    if (!(*out = malloc((size_t)len + 1))) return oom(p);
    memcpy(*out, s, (size_t)len);
    (*out)[len] = 0;
    return true;
}

static uint64_t load_le(const uint8_t *q, size_t n) {
    uint64_t v = 0;
    while (n--) v = v << 8 | q[n];
    return v;
}

/* n elements of a string array: each a length checked against the file, then its bytes. */
static bool get_str_array(parser *p, kv *e, size_t at_n) {
    if (e->n > left(p) / 8)
        return fail(p, at_n, "array count",
                    "%" PRIu64 " strings cannot fit in the %zu bytes left (each takes at least 8)", e->n, left(p));
    if (!(e->str_at = malloc((size_t)(e->n ? e->n : 1) * sizeof *e->str_at))) return oom(p);
    for (uint64_t i = 0; i < e->n; i++) {
        e->str_at[i] = p->r.pos;
        if (left(p) < 8) {
            char f[64];
            snprintf(f, sizeof f, "element %" PRIu64 " length", i);
            return truncated(p, p->r.pos, f, 8);
        }
        uint64_t len = load_le(p->r.p + p->r.pos, 8);
        p->r.pos += 8;
        if (len > left(p)) {
            char f[64];
            snprintf(f, sizeof f, "element %" PRIu64, i);
            return fail(p, p->r.pos - 8, f, "length %" PRIu64 " runs past the end of the file (%zu bytes left)",
                        len, left(p));
        }
        p->r.pos += (size_t)len;
    }
    return true;
}

/* n values of fixed-size type t (an array's elements, or one scalar when field is "value"). */
static bool get_values(parser *p, uint32_t t, uint64_t n, size_t at_n, const char *field) {
    size_t sz = km_gguf_value_size(t);
    if (n > left(p) / sz) {
        if (at_n == SIZE_MAX) return truncated(p, p->r.pos, field, sz);
        return fail(p, at_n, "array count",
                    "%" PRIu64 " elements of %zu bytes cannot fit in the %zu bytes left", n, sz, left(p));
    }
    const uint8_t *v = p->r.p + p->r.pos;
    for (uint64_t i = 0; t == KILN_GGUF_BOOL && i < n; i++)
        if (v[i] > 1) {
            char f[64];
            if (at_n == SIZE_MAX) snprintf(f, sizeof f, "%s", field);
            else snprintf(f, sizeof f, "element %" PRIu64, i);
            return fail(p, p->r.pos + (size_t)i, f, "bool value %u is neither 0 nor 1", v[i]);
        }
    p->r.pos += (size_t)(n * sz);
    return true;
}

static bool get_kv(parser *p, void *item) {
    kv    *e = item;
    size_t at_key = p->r.pos;
    if (!get_name(p, "key", &e->key)) return false;
    p->name = e->key;
    int64_t dup;
    if (!km_index_put(&p->g->kv_index, e->key, p->index, &dup)) return oom(p);
    if (dup >= 0) return fail(p, at_key, "key", "duplicate of kv %" PRId64, dup);
    e->at_type = p->r.pos;
    if (!get_u32(p, "type", &e->type)) return false;
    if (e->type == KILN_GGUF_ARRAY) {
        size_t at_elem = p->r.pos, at_n;
        if (!get_u32(p, "array element type", &e->elem)) return false;
        at_n = p->r.pos;
        if (!get_u64(p, "array count", &e->n)) return false;
        if (e->elem == KILN_GGUF_ARRAY) return fail(p, at_elem, "array element type", "nested arrays are not supported");
        if (e->elem >= KILN_GGUF_TYPE_COUNT)
            return fail(p, at_elem, "array element type", "unknown value type %" PRIu32 " (GGUF has 0 to 12)", e->elem);
        e->at = p->r.pos;
        return e->elem == KILN_GGUF_STRING ? get_str_array(p, e, at_n) : get_values(p, e->elem, e->n, at_n, NULL);
    }
    if (e->type >= KILN_GGUF_TYPE_COUNT)
        return fail(p, e->at_type, "type", "unknown value type %" PRIu32 " (GGUF has 0 to 12)", e->type);
    if (e->type == KILN_GGUF_STRING) return get_str(p, "value", &e->at, &e->n);
    e->at = p->r.pos;
    return get_values(p, e->type, 1, SIZE_MAX, "value");
}

static bool get_tensor(parser *p, void *item) {
    tensor           *e = item;
    kiln_gguf_tensor *t = &e->t;
    size_t            at_name = p->r.pos, at;
    char             *name;
    if (!get_name(p, "name", &name)) return false;
    t->name = p->name = name;
    int64_t dup;
    if (!km_index_put(&p->g->tensor_index, name, p->index, &dup)) return oom(p);
    if (dup >= 0) return fail(p, at_name, "name", "duplicate of tensor %" PRId64, dup);

    uint32_t n_dims;
    at = p->r.pos;
    if (!get_u32(p, "n_dims", &n_dims)) return false;
    if (n_dims < 1 || n_dims > KILN_MAX_DIMS)
        return fail(p, at, "n_dims", "%" PRIu32 " dimensions (a tensor has 1 to %d)", n_dims, KILN_MAX_DIMS);
    t->n_dims = (int)n_dims;
    int64_t nel = 1;
    size_t  at_ne0 = p->r.pos;
    for (int j = 0; j < KILN_MAX_DIMS; j++) {
        char     f[16];
        uint64_t v = 1;
        snprintf(f, sizeof f, "ne[%d]", j);
        at = p->r.pos;
        if (j < t->n_dims && !get_u64(p, f, &v)) return false;
        int64_t ne = (int64_t)v;
        if (ne < 1) return fail(p, at, f, "extent %" PRId64 " is not positive", ne);
        if (nel > INT64_MAX / ne)
            return fail(p, at, f, "the element count overflows (%" PRId64 " x %" PRId64 ")", nel, ne);
        nel *= ne;
        t->ne[j] = ne;
    }

    at = p->r.pos;
    if (!get_u32(p, "type", &t->ggml_type)) return false;
    const km_ggml_type *ty = km_ggml_type_info(t->ggml_type);
    if (!ty)
        return fail(p, at, "type", "unknown ggml type %" PRIu32 "%s", t->ggml_type,
                    km_ggml_type_removed(t->ggml_type) ? " (removed from ggml)" : "");
    t->type_name = ty->name;
    t->has_kiln_type = km_ggml_to_kiln(t->ggml_type, &t->type);
    if (!t->has_kiln_type) t->type = KILN_F32;
    if (t->ne[0] % ty->blck)
        return fail(p, at_ne0, "ne[0]", "%" PRId64 " is not a multiple of %s's block size %d", t->ne[0], ty->name,
                    (int)ty->blck);
    uint64_t blocks = (uint64_t)(nel / ty->blck);
    if (blocks > SIZE_MAX / (uint64_t)ty->size)
        return fail(p, at, "type", "the size in bytes of %" PRId64 " elements of %s overflows", nel, ty->name);
    t->bytes = (size_t)blocks * (size_t)ty->size;

    e->at = p->r.pos;
    return get_u64(p, "offset", &t->offset);
}

static bool get_header(parser *p, uint64_t *n_tensors, uint64_t *n_kv) {
    kiln_gguf *g = p->g;
    if (g->size < 4) return truncated(p, 0, "magic", 4);
    if (memcmp(g->base, KM_GGUF_MAGIC, 4)) {
        if (!memcmp(g->base, "FUGG", 4))
            return fail(p, 0, "magic", "'FUGG' is 'GGUF' byte-swapped: a big-endian file? kiln reads little-endian GGUF only");
        char m[5] = {0}, q[300];
        for (int i = 0; i < 4; i++) m[i] = g->base[i] ? (char)g->base[i] : '.';
        km_quote(m, q);
        return fail(p, 0, "magic", "'%s' is not 'GGUF': not a GGUF file", q);
    }
    p->r.pos = 4;
    if (!get_u32(p, "version", &g->version)) return false;
    if (g->version == 1)
        return fail(p, 4, "version", "GGUF version 1 is not supported (its counts are 32-bit): convert the file with a current llama.cpp");
    if (g->version != 2 && g->version != 3) {
        if (g->version && !(g->version & 0xffff))
            return fail(p, 4, "version", "version 0x%08" PRIx32 " looks byte-swapped: a big-endian file? kiln reads little-endian GGUF only",
                        g->version);
        return fail(p, 4, "version", "version %" PRIu32 " is not supported (kiln reads versions 2 and 3)", g->version);
    }
    size_t at_t = p->r.pos, at_kv;
    if (!get_u64(p, "n_tensors", n_tensors)) return false;
    at_kv = p->r.pos;
    if (!get_u64(p, "n_kv", n_kv)) return false;
    if (*n_kv > left(p) / KV_MIN_BYTES)
        return fail(p, at_kv, "n_kv", "%" PRIu64 " key-value pairs cannot fit in the %zu bytes left (each takes at least %d)",
                    *n_kv, left(p), KV_MIN_BYTES);
    if (*n_tensors > left(p) / TENSOR_MIN_BYTES)
        return fail(p, at_t, "n_tensors", "%" PRIu64 " tensor infos cannot fit in the %zu bytes left (each takes at least %d)",
                    *n_tensors, left(p), TENSOR_MIN_BYTES);
    return true;
}

/* general.alignment: u32, a nonzero power of 2; 32 without it. */
static bool get_alignment(parser *p) {
    kiln_gguf *g = p->g;
    int64_t    i = km_index_get(&g->kv_index, KM_GGUF_ALIGNMENT_KEY);
    g->alignment = KM_GGUF_DEFAULT_ALIGNMENT;
    if (i < 0) return true;
    const kv *e = &g->kv[i];
    p->item = "kv";
    p->index = i;
    p->name = e->key;
    if (e->type != KILN_GGUF_U32)
        return fail(p, e->at_type, "type", "%s has type %s; it must be u32", KM_GGUF_ALIGNMENT_KEY,
                    kiln_gguf_type_name((kiln_gguf_type)e->type));
    uint32_t a = (uint32_t)load_le(g->base + e->at, 4);
    if (!a || (a & (a - 1))) return fail(p, e->at, "value", "alignment %" PRIu32 " is not a power of 2", a);
    g->alignment = a;
    return true;
}

static int by_offset(const void *a, const void *b) {
    const tensor *x = *(tensor *const *)a, *y = *(tensor *const *)b;
    if (x->t.offset != y->t.offset) return x->t.offset < y->t.offset ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Each tensor aligned, inside the data section, and overlapping no other. */
static bool check_data(parser *p) {
    kiln_gguf *g = p->g;
    size_t     avail = g->size - g->data_offset;
    p->item = "tensor";
    for (int64_t i = 0; i < g->n_tensors; i++) {
        tensor *e = &g->tensors[i];
        p->index = i;
        p->name = e->t.name;
        if (e->t.offset % g->alignment)
            return fail(p, e->at, "offset", "data offset %" PRIu64 " is not a multiple of the alignment %zu",
                        e->t.offset, g->alignment);
        if (e->t.offset > avail || e->t.bytes > avail - e->t.offset)
            return fail(p, e->at, "offset",
                        "its %zu bytes at data offset %" PRIu64 " run past the end of the file (the data section "
                        "starts at %zu and has %zu bytes)",
                        e->t.bytes, e->t.offset, g->data_offset, avail);
        e->t.data = g->base + g->data_offset + e->t.offset;
    }
    if (g->n_tensors < 2) return true;
    tensor **order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order) return oom(p);
    for (int64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof *order, by_offset);
    for (int64_t k = 1; k < g->n_tensors; k++) {
        const tensor *a = order[k - 1], *b = order[k];
        if (a->t.offset + a->t.bytes <= b->t.offset) continue;
        char an[300];
        km_quote(a->t.name, an);
        p->index = b - g->tensors;
        p->name = b->t.name;
        fail(p, b->at, "offset",
             "bytes [%" PRIu64 ", %" PRIu64 ") overlap tensor %" PRId64 " ('%s') at [%" PRIu64 ", %" PRIu64 ")",
             b->t.offset, b->t.offset + b->t.bytes, (int64_t)(a - g->tensors), an, a->t.offset,
             a->t.offset + a->t.bytes);
        break;
    }
    free(order);
    return !p->st;
}

/* n items (key-value pairs or tensor infos) of `size` bytes each into *arr, read by get. An
 * item that failed is counted too: close frees what it holds. */
static bool get_items(parser *p, const char *item, uint64_t n, void **arr, int64_t *cap, int64_t *count, size_t size,
                      bool (*get)(parser *, void *)) {
    p->item = item;
    for (uint64_t i = 0; i < n; i++) {
        if (!km_grow(arr, cap, *count, size)) return oom(p);
        p->index = (int64_t)i;
        p->name = NULL;
        void *e = (char *)*arr + (size_t)*count * size;
        memset(e, 0, size);
        (*count)++;
        if (!get(p, e)) return false;
    }
    return true;
}

static kiln_status parse(kiln_gguf *g) {
    parser   p = {.g = g, .r = {.p = g->base, .len = g->size}};
    uint64_t n_tensors, n_kv;
    if (!get_header(&p, &n_tensors, &n_kv) ||
        !get_items(&p, "kv", n_kv, (void **)&g->kv, &g->cap_kv, &g->n_kv, sizeof *g->kv, get_kv) ||
        !get_alignment(&p) ||
        !get_items(&p, "tensor", n_tensors, (void **)&g->tensors, &g->cap_tensors, &g->n_tensors, sizeof *g->tensors,
                   get_tensor))
        return p.st;
    /* The data section starts at the next multiple of the alignment. ggml writes that padding
     * even when there are no tensors but does not need it then. */
    size_t end = p.r.pos, pad = (g->alignment - end % g->alignment) % g->alignment;
    if (pad > g->size - end) {
        if (n_tensors) {
            p.item = NULL;
            fail(&p, end, "padding before the data section",
                 "truncated: %zu bytes needed to reach the alignment %zu, %zu left", pad, g->alignment, g->size - end);
            return p.st;
        }
        pad = 0;
    }
    g->data_offset = end + pad;
    check_data(&p);
    return p.st;
}

/* Takes base (mapped or malloc'd, per mapped) and parses it; *out NULL on error. */
static kiln_status open_bytes(const uint8_t *base, size_t size, bool mapped, const char *label, kiln_gguf **out) {
    kiln_gguf *g = calloc(1, sizeof *g);
    char      *l = strdup(label);
    if (!g || !l) {
        free(g);
        free(l);
        if (mapped && size) munmap((void *)base, size);
        else if (!mapped) free((void *)base);
        return kb_oom();
    }
    *g = (kiln_gguf){.label = l, .base = base, .size = size, .mapped = mapped};
    kiln_status st = parse(g);
    if (st) {
        kiln_gguf_close(g);
        return st;
    }
    *out = g;
    return NULL;
}

kiln_status kiln_gguf_open(const char *path, kiln_gguf **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_gguf_open: NULL out");
    *out = NULL;
    if (!path) return kb_error(KILN_ERR_INVALID, "kiln_gguf_open: NULL path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kb_error(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return kb_error(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kb_error(KILN_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return kb_error(KILN_ERR_IO, "%s: too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void  *m = NULL;
    if (size) {
        m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int err = errno;
            close(fd);
            return kb_error(err == ENOMEM ? KILN_ERR_NOMEM : KILN_ERR_IO, "%s: cannot map: %s", path, strerror(err));
        }
    }
    close(fd);
    return open_bytes(m, size, true, path, out);
}

kiln_status kiln_gguf_open_memory(const void *data, size_t size, const char *label, kiln_gguf **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_gguf_open_memory: NULL out");
    *out = NULL;
    if (!data && size) return kb_error(KILN_ERR_INVALID, "kiln_gguf_open_memory: NULL data");
    void *copy = NULL;
    if (posix_memalign(&copy, 64, size ? size : 1) != 0) return kb_oom(); /* tensor data as aligned as in a mapping */
    if (size) memcpy(copy, data, size);
    return open_bytes(copy, size, false, label ? label : "<memory>", out);
}

/* ---- getters ------------------------------------------------------------------------------- */

uint32_t    kiln_gguf_version(const kiln_gguf *g) { return g ? g->version : 0; }
const char *km_gguf_label(const kiln_gguf *g) { return g ? g->label : "<no file>"; }
size_t   kiln_gguf_alignment(const kiln_gguf *g) { return g ? g->alignment : 0; }
size_t   kiln_gguf_data_offset(const kiln_gguf *g) { return g ? g->data_offset : 0; }
int64_t  kiln_gguf_kv_count(const kiln_gguf *g) { return g ? g->n_kv : 0; }
int64_t  kiln_gguf_tensor_count(const kiln_gguf *g) { return g ? g->n_tensors : 0; }

const char *kiln_gguf_kv_key(const kiln_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? g->kv[i].key : NULL;
}

kiln_gguf_type kiln_gguf_kv_type(const kiln_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? (kiln_gguf_type)g->kv[i].type : KILN_GGUF_TYPE_COUNT;
}

int64_t kiln_gguf_find_kv(const kiln_gguf *g, const char *key) {
    return g && key ? km_index_get(&g->kv_index, key) : -1;
}

int64_t kiln_gguf_find_tensor(const kiln_gguf *g, const char *name) {
    return g && name ? km_index_get(&g->tensor_index, name) : -1;
}

kiln_status kiln_gguf_tensor_info(const kiln_gguf *g, int64_t i, kiln_gguf_tensor *out) {
    if (!g || !out) return kb_error(KILN_ERR_INVALID, "kiln_gguf_tensor_info: NULL argument");
    if (i < 0 || i >= g->n_tensors)
        return kb_error(KILN_ERR_INVALID, "%s: no tensor %" PRId64 " (the file has %" PRId64 ")", g->label, i,
                        g->n_tensors);
    *out = g->tensors[i].t;
    return NULL;
}

static bool is_int(uint32_t t) {
    return t <= KILN_GGUF_I32 || t == KILN_GGUF_U64 || t == KILN_GGUF_I64 || t == KILN_GGUF_BOOL;
}

static bool is_signed(uint32_t t) {
    return t == KILN_GGUF_I8 || t == KILN_GGUF_I16 || t == KILN_GGUF_I32 || t == KILN_GGUF_I64;
}

/* A scalar integer (or bool) kv's value; *wide is set for a u64 above INT64_MAX. */
static int64_t int_value(const kiln_gguf *g, const kv *e, bool *wide) {
    size_t   sz = km_gguf_value_size(e->type);
    uint64_t u = load_le(g->base + e->at, sz);
    *wide = false;
    if (is_signed(e->type) && sz < 8 && (u >> (8 * sz - 1)) & 1) u |= ~(uint64_t)0 << (8 * sz); /* sign-extend */
    if (e->type == KILN_GGUF_U64 && u > INT64_MAX) *wide = true;
    return (int64_t)u;
}

static double float_value(const kiln_gguf *g, const kv *e) {
    if (e->type == KILN_GGUF_F32) {
        float f;
        memcpy(&f, g->base + e->at, 4);
        return f;
    }
    double d;
    memcpy(&d, g->base + e->at, 8);
    return d;
}

/* "u32 7", "string 'abc'", "an array of 3 u32", for messages. */
static void describe(const kiln_gguf *g, const kv *e, char out[400]) {
    const char *tn = kiln_gguf_type_name((kiln_gguf_type)e->type);
    bool        wide;
    if (e->type == KILN_GGUF_ARRAY) {
        snprintf(out, 400, "an array of %" PRIu64 " %s", e->n, kiln_gguf_type_name((kiln_gguf_type)e->elem));
    } else if (e->type == KILN_GGUF_STRING) {
        char s[65], q[300];
        size_t n = e->n < 64 ? (size_t)e->n : 64;
        memcpy(s, g->base + e->at, n);
        s[n] = 0; /* a NUL inside ends it early: fine for a message */
        km_quote(s, q);
        snprintf(out, 400, "string '%s%s'", q, e->n > 64 ? "..." : "");
    } else if (e->type == KILN_GGUF_BOOL) {
        snprintf(out, 400, "bool %s", g->base[e->at] ? "true" : "false");
    } else if (e->type == KILN_GGUF_F32 || e->type == KILN_GGUF_F64) {
        snprintf(out, 400, "%s %.17g", tn, float_value(g, e));
    } else {
        int64_t v = int_value(g, e, &wide);
        if (wide) snprintf(out, 400, "%s %" PRIu64, tn, (uint64_t)v);
        else snprintf(out, 400, "%s %" PRId64, tn, v);
    }
}

static kiln_status lookup(const kiln_gguf *g, const char *key, bool args_ok, const char *fn, const kv **e) {
    *e = NULL;
    if (!g || !key || !args_ok) return kb_error(KILN_ERR_INVALID, "%s: NULL argument", fn);
    int64_t i = km_index_get(&g->kv_index, key);
    if (i < 0) {
        char q[300];
        km_quote(key, q);
        return kb_error(KILN_ERR_NOT_FOUND, "%s: no key '%s'", g->label, q);
    }
    *e = &g->kv[i];
    return NULL;
}

static kiln_status mismatch(const kiln_gguf *g, const kv *e, const char *want) {
    char q[300], d[400];
    km_quote(e->key, q);
    describe(g, e, d);
    return kb_error(KILN_ERR_FORMAT, "%s: key '%s' is %s, not %s", g->label, q, d, want);
}

kiln_status kiln_gguf_get_int(const kiln_gguf *g, const char *key, int64_t *out) {
    const kv   *e;
    kiln_status st = lookup(g, key, out != NULL, "kiln_gguf_get_int", &e);
    if (st) return st;
    if (!is_int(e->type)) return mismatch(g, e, "an integer");
    bool    wide;
    int64_t v = int_value(g, e, &wide);
    if (wide) return mismatch(g, e, "an integer that fits in int64");
    *out = v;
    return NULL;
}

kiln_status kiln_gguf_get_float(const kiln_gguf *g, const char *key, double *out) {
    const kv   *e;
    kiln_status st = lookup(g, key, out != NULL, "kiln_gguf_get_float", &e);
    if (st) return st;
    if (e->type != KILN_GGUF_F32 && e->type != KILN_GGUF_F64) return mismatch(g, e, "a float (f32 or f64)");
    *out = float_value(g, e);
    return NULL;
}

kiln_status kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out) {
    const kv   *e;
    kiln_status st = lookup(g, key, out != NULL, "kiln_gguf_get_bool", &e);
    if (st) return st;
    if (e->type != KILN_GGUF_BOOL) return mismatch(g, e, "a bool");
    *out = g->base[e->at] != 0;
    return NULL;
}

kiln_status kiln_gguf_get_str(const kiln_gguf *g, const char *key, const char **s, size_t *len) {
    const kv   *e;
    kiln_status st = lookup(g, key, s && len, "kiln_gguf_get_str", &e);
    if (st) return st;
    if (e->type != KILN_GGUF_STRING) return mismatch(g, e, "a string");
    *s = (const char *)g->base + e->at;
    *len = (size_t)e->n;
    return NULL;
}

kiln_status kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_type *elem, uint64_t *n,
                              const void **data) {
    const kv   *e;
    kiln_status st = lookup(g, key, true, "kiln_gguf_get_arr", &e);
    if (st) return st;
    if (e->type != KILN_GGUF_ARRAY) return mismatch(g, e, "an array");
    if (elem) *elem = (kiln_gguf_type)e->elem;
    if (n) *n = e->n;
    if (data) *data = e->elem == KILN_GGUF_STRING ? NULL : g->base + e->at;
    return NULL;
}

kiln_status kiln_gguf_get_arr_str(const kiln_gguf *g, const char *key, uint64_t i, const char **s, size_t *len) {
    const kv   *e;
    kiln_status st = lookup(g, key, s && len, "kiln_gguf_get_arr_str", &e);
    if (st) return st;
    if (e->type != KILN_GGUF_ARRAY || e->elem != KILN_GGUF_STRING) return mismatch(g, e, "an array of strings");
    if (i >= e->n) {
        char q[300];
        km_quote(e->key, q);
        return kb_error(KILN_ERR_INVALID, "%s: key '%s' has %" PRIu64 " strings, no element %" PRIu64, g->label, q,
                        e->n, i);
    }
    const uint8_t *at = g->base + e->str_at[i];
    *len = (size_t)load_le(at, 8);
    *s = (const char *)at + 8;
    return NULL;
}
