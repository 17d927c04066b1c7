/* Shared by the GPU test programs (tests/gpu/test_*.c): GPU detection, a seeded RNG, host data
 * of the leaves, the CPU reference, compile + run + compare by NMSE (check_graph), shapes and
 * operand layouts (operand). Test-only code; names are unprefixed for brevity. */
#ifndef KILN_TEST_GPU_SUPPORT_H
#define KILN_TEST_GPU_SUPPORT_H

#include "tests/support.h"

#include "frontend/frontend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FUSED_TOL_F16 0.0

#define FUSED_TOL_BF16 0.0

typedef struct {
    uint64_t s;
} rng_t;

#define MAX_DATA 32

typedef struct {
    char      name[FE_MAX_NAME];
    kiln_type type;
    int64_t   n;
    void     *data;
    bool      requested; /* asked for by the reference */
} hdata;

typedef struct {
    hdata in[MAX_DATA];
    int   nin;
    hdata out[MAX_DATA];
    int   nout;
} hset;

typedef enum { FILL_ANY, FILL_POSITIVE, FILL_AWAY_FROM_ZERO, FILL_LOG_DOMAIN } fill_kind;

typedef struct {
    const char *label;   /* printed on failure */
    double      tol_f32; /* tolerance for outputs when the graph is all f32 */
    bool        fused_tol; /* f16/bf16 graphs: use the fused (intermediate-rounding) tolerances */
    int         no_fuse;
    bool        no_graph;
} cmp_opts;

typedef enum { LAY_PLAIN, LAY_PERMUTE, LAY_TRANSPOSE, LAY_VIEW, LAY_RESHAPE, LAY_COUNT } layout;

extern char *g_cache_dir; /* set by main: a temporary kernel cache shared by all tests */
extern char  g_arch[24];  /* set by need_gpu */
extern const kiln_type FLOAT_TYPES[3];
extern const char *LAYOUT_NAMES[LAY_COUNT];

void need_gpu(void);
uint64_t rng_next(rng_t *r);
int   rng_int(rng_t *r, int lo, int hi);
/* A random shape of 1 to 4 dims (extents 1..40 or edge sizes such as 7, 129, 4097), halved
 * from the last dim until it has at most 2^19 elements. */
void  random_ew_shape(rng_t *r, int64_t ne[4]);
float rng_float(rng_t *r, float lo, float hi);
void fill(void *p, kiln_type t, int64_t n, uint64_t seed, fill_kind k);
hdata *hset_add(hset *h, const char *name, kiln_type t, int64_t n);
void hset_clear_out(hset *h);
/* Scales every weight matrix (ne1 > 1) of g in h by 1/sqrt(ne0), as a model's initialization
 * does: whole layers then keep activations and attention logits in a realistic range (with
 * weights in [-1, 1) the logits reach thousands and the softmax amplifies rounding). */
void scale_weights(const kiln_graph *g, hset *h);
/* Graph text kg as DIR/NAME.kg (a "kiln-graph 1" header is added when missing); caller frees. */
char *write_kg(const char *dir, const char *name, const char *kg);
/* The median GPU time `kiln run` printed for cmd, or -1. */
double median_ms(const char *cmd);
/* median_ms of `kiln run PATH ARGS --cache-dir <g_cache_dir>`, ARGS formatted from args_fmt. */
double run_median_ms(const char *path, const char *args_fmt, ...) KB_PRINTF(2, 3);
/* `kiln run PATH ARGS --check` with the CUDA graph and with plain launches: asserts success and
 * no FAILED check, prints the check lines under `label`. */
void run_check(const char *path, const char *args, const char *label);
/* Graph text kg in a new folder: `kiln inspect` must print every line of want (NULL-terminated)
 * and none of absent (NULL-terminated, or NULL), then run_check of it. */
void fused_run_check(const char *kg, const char *const *want, const char *const *absent, const char *label);
/* run_check of kg with --dim DIM=V at each of the nvals values. */
void run_check_at_values(const char *kg, const char *dim, const int *vals, int nvals, const char *label);
/* The body of a loop test over symbolic cases: needs a GPU, then run_check_at_values of kg at the
 * three vals under the label "WHAT case I". */
void run_case_at_values(const char *what, int i, const char *kg, const char *dim, const int vals[3]);
void hset_free(hset *h);
/* Frees what a GPU test made, in the order each depends on the next: session, program, graph,
 * h's data, context. Any of s, p, g, ctx may be NULL. */
void gpu_free(kiln_session *s, kiln_program *p, kiln_graph *g, hset *h, kiln_ctx *ctx);
const void *ref_get(void *user, const char *name, kiln_type type, int64_t n);
void ref_put(void *user, const char *name, kiln_type type, int64_t n, const void *data);
double nmse(const void *out, const void *ref, kiln_type t, int64_t n, int64_t *bad_at, bool *ref_nonfinite);
double lowp_tol(kiln_type t, double f32_tol);
kiln_type lowest_precision(const kiln_graph *g);
kiln_program *compile(const kiln_graph *g, int no_fuse);
/* Runs the reference (into h->out), compiles g, runs it on the GPU with h's inputs and compares
 * every output by NMSE against c's tolerance; a failure names c->label, the output, and the
 * worst element. Returns the worst NMSE. */
double check_graph(const kiln_graph *g, hset *h, const cmp_opts *c);
/* check_graph, then gpu_free of g, h and ctx: the end of most op tests. Returns the worst NMSE. */
double check_and_free(kiln_graph *g, hset *h, kiln_ctx *ctx, const cmp_opts *c);
void shape_str(const int64_t ne[4], char *out, size_t n);
/* kg compiled fused and unfused (--no-fuse), each run on the GPU against kiln_reference with
 * f32 tolerance tol (fused tolerances for f16/bf16), on leaves filled from seed; prints both. */
void check_kg_fused(const char *kg, const char *what, double tol, uint64_t seed);
/* A tensor of logical shape ne and type t read through layout lay from a new leaf `name`
 * (input or weight at random), its random data (fill kind fk) added to h; desc describes it. */
kiln_tensor *operand(kiln_ctx *ctx, hset *h, rng_t *r, const char *name, kiln_type t, const int64_t ne[4], layout lay, fill_kind fk, uint64_t seed, char *desc, size_t desc_n);

#endif
