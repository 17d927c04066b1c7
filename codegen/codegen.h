/* codegen: embedded Lua 5.4, templates, kernel instantiation, NVRTC, and the compile driver.
 * Prefix cg_. */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "cache/cache.h"
#include "ir/ir.h"

/* Bumped whenever generated code can change for the same IR; part of every kernel key. */
#define CG_CODEGEN_VERSION 1
/* Format of serialized programs (codegen/plan.c); part of every program key. */
#define CG_PLAN_VERSION 5

/* One operand of a library GEMM step: a kernel parameter (a buffer, or the scratch) plus a
 * byte offset, its element type, leading dimension and batch stride (both in elements). */
typedef struct {
    int       param;
    int64_t   offset;
    kiln_type type;
    int64_t   ld, stride;
} cg_mat;

/* C = op(A)·op(B) in cuBLAS's column-major terms, `batch` times (cublasGemmStridedBatchedEx
 * with alpha 1, beta 0, f32 accumulation). */
typedef struct {
    bool   ta, tb;
    int    m, n, k, batch;
    cg_mat a, b, c;
    int    n_sym, n_mul; /* n_sym >= 0: n is n_mul times symbolic dim n_sym's run-time value
                            (n is its maximum) */
    int    n_above;      /* n_sym >= 0: no call while that value is n_above or less (another step
                            of the node computed the product; 0: always called) */
} cg_gemm;

/* dst = the sum of src over the group's `ranks` programs (ncclAllReduce, f32, in place when
 * src and dst are one address): `count` contiguous values, or with count_sym >= 0 the first
 * count_mul times symbolic dim count_sym's run-time value (count is the maximum). src and dst
 * are kernel parameters with byte offsets (cg_mat's param and offset; the other fields 0). */
typedef struct {
    int     ranks;
    int64_t count;
    int     count_sym, count_mul;
    cg_mat  src, dst;
} cg_coll;

typedef enum { CG_LAUNCH, CG_GEMM, CG_COLLECTIVE } cg_step_kind;

/* A kernel parameter that is not a buffer: the node's scratch space (see cg_kernel.scratch). */
#define CG_PARAM_SCRATCH (-1)
/* ... or the device array of the symbolic dims' run-time values (int32, by slot), the last
 * parameter of every kernel of a node with symbolic dims (k.dims_arg). */
#define CG_PARAM_DIMS (-2)

/* One step of a program: a generated kernel launch, a library GEMM, or a collective (NCCL). A
 * node gives one or more steps, run in order (docs/templates.md, "Result"). */
typedef struct {
    cg_step_kind kind;
    int      node;           /* ir node it implements */
    int      step, nsteps;   /* this step's index among its node's steps, and their count */
    char     name[64];       /* entry point (content-derived, e.g. "ew_mul_silu") */
    char    *source;         /* CUDA C translation unit with its header comment; for CG_GEMM and
                                CG_COLLECTIVE a comment describing the call (what the key hashes) */
    unsigned grid[3], block[3];
    unsigned smem;
    int      nparams;        /* kernel parameters: device pointers of these buffers, in order;
                                CG_PARAM_SCRATCH for the node's scratch */
    int      params[IR_MAX_IN + 4]; /* dst, dst2, operands, scratch, dims */
    size_t   scratch;        /* bytes of scratch the node's steps share (0: none) */
    cg_gemm  gemm;           /* CG_GEMM */
    cg_coll  coll;           /* CG_COLLECTIVE */
    uint8_t  key[16];        /* kernel cache key */
    char     key_hex[33];
    void    *cubin;          /* NULL with skip_nvrtc, and for CG_GEMM and CG_COLLECTIVE */
    size_t   cubin_size;
    bool     from_cache;
    /* Kernels with one key have one source and one code: all but the first borrow them (a
     * 32-layer model has ~1000 kernels and ~30 distinct ones). cg_kernel_clear frees only
     * what is not borrowed. */
    bool     source_borrowed, cubin_borrowed;
} cg_kernel;

/* Lua state with the templates loaded: embedded at build time, or read from $KILN_TEMPLATE_DIR
 * when that is set (for template development). */
typedef struct cg_lua cg_lua;
kiln_status cg_lua_new(cg_lua **out);
void        cg_lua_free(cg_lua *L);

/* Lower-level access (codegen/lua.c), used by generate.c and tests. The sandbox has the base,
 * string, table, math and utf8 libraries only (no io, os, package, debug, dofile, loadfile,
 * math.random; load accepts text only), kiln's require, a memory cap and an instruction budget
 * per protected call. */
struct lua_State;
struct lua_State *cg_lua_state(cg_lua *L);
/* lua_pcall of the function below nargs arguments on the stack, with a fresh instruction budget;
 * a Lua error becomes KILN_ERR_CODEGEN "<what>: <Lua message>" (with the template file:line)
 * and leaves nothing of the call on the stack. */
kiln_status cg_lua_pcall(cg_lua *L, int nargs, int nresults, const char *what);
/* Runs Lua source `code` (named `name` in errors) in the sandbox; *result (caller frees) is
 * tostring of its first result, "nil" when it returns nothing. */
kiln_status cg_lua_exec(cg_lua *L, const char *code, const char *name, char **result);

/* Instantiates the template for ir node `node` into k (name, source, launch config, params).
 * Deterministic: the same IR gives byte-identical source. k->source is owned by k. */
kiln_status cg_generate(cg_lua *L, const ir_prog *p, int node, cg_kernel *k);
/* The same for any number of steps: *out (caller frees each with cg_kernel_clear, then the
 * array) receives the node's *n steps in launch order. */
kiln_status cg_generate_steps(cg_lua *L, const ir_prog *p, int node, cg_kernel **out, int *n);
void        cg_kernel_clear(cg_kernel *k);

/* A runtime utility kernel (templates/util.lua; kernel "fill_uniform" or "l2_read"): k gets its
 * name, source (no grid-wait prologue: launched plainly), block and grid, the most blocks its
 * caller launches (docs/templates.md, "Utility kernels"); k->node is -1. */
kiln_status cg_generate_util(cg_lua *L, const char *kernel, cg_kernel *k);
/* The same, keyed and compiled for arch through the kernel cache as a program's kernels are
 * (codegen/util.c): cache_dir NULL is the default directory (kc_default_dir; none found: no
 * cache), and $KILN_CACHE applies. k also gets key, key_hex, cubin and from_cache. The caller
 * frees with cg_kernel_clear. */
kiln_status cg_util_kernel(const char *kernel, const char *arch, const char *cache_dir, cg_kernel *k);

/* NVRTC, linked dynamically. The options used for arch go into the kernel key too. */
#define CG_MAX_OPTS 8
int         cg_nvrtc_options(const char *arch, const char *opts[CG_MAX_OPTS]); /* returns count */
kiln_status cg_nvrtc_version(int *major, int *minor);
/* Compiles src for arch ("sm_90a") to a cubin (malloc'd). On failure the status holds the log. */
kiln_status cg_nvrtc_compile(const char *src, const char *name, const char *arch, void **cubin,
                             size_t *size);

/* What a kernel's key and code depend on besides its source: the target and NVRTC. */
typedef struct {
    const char        *arch;
    const char *const *opts; /* cg_nvrtc_options(arch) */
    int                nopts;
    int                nvrtc_major, nvrtc_minor;
} cg_target;
/* Sets k->key and k->key_hex from k->source and t (kc_kernel_key). */
void        cg_kernel_key(cg_kernel *k, const cg_target *t);
/* k's cubin (key set): from cache c (k->from_cache), else compiled by NVRTC (*compiled) and
 * stored in c with meta saying what the key was made of. *corrupt counts a corrupt entry met. */
kiln_status cg_kernel_code(cg_kernel *k, const cg_target *t, kc_cache *c, bool *compiled, int *corrupt);

/* The program object (codegen/program.c), which compile.c and plan.c both build on.
 * A new program for g (arch recorded) with its IR lowered and the passes of o run: what both
 * compiling and loading a serialized program start from. */
kiln_status cg_lower(const kiln_graph *g, const kiln_compile_opts *o, const char *arch, kiln_program **out);
/* g with dim d fixed to v: a new context and graph (the caller frees both). */
/* A program over ir (which it takes, freed on failure too), with no kernels yet. */
kiln_status cg_program_from_ir(ir_prog *ir, const char *arch, kiln_program **out);
/* The graph of a specialization: dim d fixed to v (v > 0), or symbolic up to -v (v < 0: a
 * kiln_dim_specialize_upto variant, kiln_ctx_cap). text: g's context printed (kiln_print),
 * which a program's specializations share, or NULL (printed here). */
kiln_status cg_bind_graph(const kiln_graph *g, const char *text, int d, int64_t v, kiln_ctx **bctx,
                          kiln_graph **bg);
/* "n_tokens = 1" or "n_tokens <= 64": specialization v of dim d, for listings. */
const char *cg_spec_label(const kiln_ctx *ctx, int d, int64_t v, char *buf, size_t len);
/* Appends sp, the program of p's graph with dim d fixed to v (v < 0: up to -v), to p's
 * specializations (p->spec has room); sp takes the bound context and graph it was lowered from. */
void        cg_program_add_spec(kiln_program *p, int d, int64_t v, kiln_program *sp, kiln_ctx *bctx, kiln_graph *bg);
/* One variant's text (its IR and launches, without its specializations): what
 * kiln_program_describe prints for each variant and a dump's program.txt holds. */
void        cg_describe_one(const kiln_program *p, kb_str *out);

/* What the keys of a compile are made of besides the graph and the sources. */
typedef struct {
    int  nvrtc_major, nvrtc_minor;
    char options[512];         /* NVRTC options, space-separated (kernel keys) */
    char program_options[512]; /* compile options (program keys) */
} cg_env_info;
/* The program key kiln_compile uses for g with options o for arch, what it is made of, and the
 * canonical graph text it hashes (*graph_text, caller frees). */
kiln_status cg_program_key(const kiln_graph *g, const kiln_compile_opts *o, const char *arch, kc_key *key,
                           cg_env_info *env, char **graph_text);

/* Serialized programs (codegen/plan.c): the lowered IR (codegen/plan_ir.c), the kernel table,
 * the distinct cubins (or PTX) and the specializations. cg_plan_read lowers the graph again and
 * requires the fingerprint of that IR (XXH3-64 of ir_print) to be the plan's (a bundle, which a
 * caller pairs with a graph); cg_plan_read_keyed takes the plan's IR as it is (a program-cache
 * entry, whose key already names this graph, these options and this kiln build, and whose
 * checksum its store verified). Both check every length, count and index, so a damaged or
 * foreign plan is an error (KILN_ERR_FORMAT), never a crash. */
uint64_t    cg_ir_fingerprint(const ir_prog *ir);
kiln_status cg_plan_write(const kiln_program *p, kb_str *out);
kiln_status cg_plan_read(const void *data, size_t size, const kiln_graph *g, const kiln_compile_opts *o,
                         kiln_program **out);
/* text: g's context printed (the program key's text), which the specializations bind anew. */
kiln_status cg_plan_read_keyed(const void *data, size_t size, const kiln_graph *g, const char *text,
                               const kiln_compile_opts *o, kiln_program **out);
/* codegen/plan_ir.c: an IR into a plan, and back (over graph g, checked and verified). */
void        cg_ir_write(kb_str *b, const ir_prog *p);
kiln_status cg_ir_read(kb_reader *r, const kiln_graph *g, ir_prog **out);

/* The embedded templates: generated at build time from templates/ (build/gen/templates.c). */
typedef struct {
    const char *name; /* file name without ".lua" */
    const char *text;
    size_t      len;
} cg_template_file;
extern const cg_template_file cg_templates[];
extern const int cg_ntemplates;

struct kiln_program {
    ir_prog           *ir;
    cg_kernel         *kernels; /* steps, in launch order */
    int                nkernels;
    size_t             scratch_bytes; /* the largest scratch of any node (shared: one stream) */
    char               arch[16];
    kiln_compile_stats stats;
    /* Specializations (kiln_dim_specialize): spec[i] is the graph with its dim spec_dim[i] (an
     * index into this graph's dims) fixed to spec_val[i], or for spec_val[i] < 0 symbolic up to
     * -spec_val[i] (kiln_dim_specialize_upto), compiled on its own; it owns that graph
     * (own_ctx, own_graph). */
    struct kiln_program **spec;
    int                   nspec;
    int                   spec_dim[KILN_MAX_SYMS * 4];
    int64_t               spec_val[KILN_MAX_SYMS * 4];
    kiln_ctx             *own_ctx;
    kiln_graph           *own_graph;
};

#endif
