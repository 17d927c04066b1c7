/* model/ internals of the GGUF reader and writer (docs/gguf.md): ggml's tensor type table, the
 * sizes of GGUF value types, and a string index shared by both; shape helpers of model/. Prefix
 * km_. */
#ifndef KILN_MODEL_GGUF_H
#define KILN_MODEL_GGUF_H

#include "kiln.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The file stores numbers little-endian and getters hand out pointers into it. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln's GGUF reader and writer assume a little-endian host"
#endif

#define KM_GGUF_MAGIC "GGUF"
#define KM_GGUF_VERSION 3           /* what the writer writes */
#define KM_GGUF_DEFAULT_ALIGNMENT 32
#define KM_GGUF_ALIGNMENT_KEY "general.alignment"

/* One ggml tensor type: blck elements take size bytes. */
typedef struct {
    const char *name; /* ggml's name: "f32", "q4_K", ... */
    int32_t     blck;
    int32_t     size;
} km_ggml_type;

/* The type with file code t, or NULL when ggml has none (never had one, or removed it). */
const km_ggml_type *km_ggml_type_info(uint32_t t);
/* Whether code t was a type ggml has since removed (4, 5, 31-33, 36-38), for messages. */
bool km_ggml_type_removed(uint32_t t);
/* The kiln type of ggml code t (f32, f16, bf16, i32, i64), false for any other. */
bool km_ggml_to_kiln(uint32_t t, kiln_type *out);
/* The ggml code of kiln type t. */
uint32_t km_ggml_from_kiln(kiln_type t);

/* Bytes of one value of a fixed-size GGUF type; 0 for string, array and unknown types. */
size_t km_gguf_value_size(uint32_t t);

/* Makes room for one more element in the array *arr of capacity *cap holding n, doubling.
 * Returns false when out of memory (*arr unchanged). */
bool km_grow(void **arr, int64_t *cap, int64_t n, size_t elem);

/* A hash index from NUL-terminated names to int64 indices (tensor names, keys). Names are not
 * copied: they must outlive the index and not move. */
typedef struct {
    const char *name;
    int64_t     i;
} km_slot;
typedef struct {
    km_slot *slot; /* cap slots, name NULL when empty */
    size_t   cap, count;
} km_index;
/* Adds name -> i unless name is there already; *found gets the index it had (-1 when it was
 * not there). Returns false when out of memory. */
bool    km_index_put(km_index *x, const char *name, int64_t i, int64_t *found);
int64_t km_index_get(const km_index *x, const char *name); /* -1 when absent */
void    km_index_free(km_index *x);

/* The path (or kiln_gguf_open_memory's label) g was opened with: every message of model/ about
 * a GGUF's keys or tensors starts with it. */
const char *km_gguf_label(const kiln_gguf *g);

/* Checks that g holds every tensor a model of hp (read from g's keys and checked by
 * kiln_model_check) needs, with the type and shape hp implies, layer by layer up to
 * block_count, and no layer past it: an error naming the file, the tensor, both shapes and the
 * key behind the extent that differs (model/hparams.c). Work is bounded by the tensors the file
 * holds, whatever the keys say. */
/* s (NUL-terminated, e.g. a name read from a file) for a message: at most 64 bytes, control
 * bytes, quotes and backslashes written \xNN, "..." when cut. */
void km_quote(const char *s, char out[300]);

kiln_status km_check_tensors(const kiln_gguf *g, const kiln_model_hparams *hp);

/* Dims of a shape without its trailing 1s (at least 1), and "[128, 256]" of its first nd. */
int  km_n_dims(const int64_t ne[4]);
void km_shape_text(const int64_t ne[4], int nd, char *out, size_t n);

/* ---- random models without a file (model/random.c) ------------------------------------------
 * The weights kiln_model_write_random would write for (hp, seed), made where they are needed;
 * with quant_blocks, quantized weights are instead random blocks made on the device
 * (kiln_model_random_blocks). */
typedef struct km_random km_random;
kiln_status km_random_new(const kiln_model_hparams *hp, uint64_t seed, bool quant_blocks, km_random **out);
void        km_random_free(km_random *r);
/* How to make weight `name` (of this type and shape) on the device: kiln_session_fill_weights. */
kiln_status km_random_init(km_random *r, const char *name, kiln_type type, const int64_t ne[4],
                           kiln_weight_init *out);
/* Weight `name` in host memory (made on first use, owned by r); NULL when the model has no such
 * weight of this type and size, or it is a quantized weight of quant_blocks (made on the device
 * only). */
const void *km_random_host(km_random *r, const char *name, kiln_type type, int64_t n);
/* km_random_init for a tensor-parallel rank's weight `name` of shape ne (its share's): the
 * whole weight's generator (key, scale, base) over the rank's elements, made on the device;
 * values of the same distribution, not the whole weight's slice. rope_freqs (whole on every
 * rank) is computed as km_random_init does; a quantized weight needs quant_blocks
 * (kiln_model_random_blocks), else an error naming it. */
kiln_status km_random_init_rank(km_random *r, const char *name, kiln_type type, const int64_t ne[4],
                                kiln_weight_init *out);
/* NULL when `name` is a weight of the model with this type and shape; else an error naming it. */
kiln_status km_random_check(const km_random *r, const char *name, kiln_type type, const int64_t ne[4]);

#endif
