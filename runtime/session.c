/* kiln_session: a compiled program loaded on one GPU — device buffers, modules, launches, and
 * the CUDA graph that replays them.
 *
 * Memory: every weight, state and large input or output has its own allocation; temporaries
 * live in one arena of ir->arena_bytes at the offsets ir_memplan chose; small inputs and outputs
 * live in the I/O windows (runtime/io.c). Launches are precomputed at creation (the
 * argument array of each kernel points at its buffers' device addresses), so a run is a CUDA
 * graph replay (or, with graphs off, one cuLaunchKernel per kernel) between two events.
 *
 * A session belongs to one thread at a time; each call makes the session's context current on
 * the calling thread. The session copies what it needs from the program, which may be freed
 * once kiln_session_new has returned. */
#include "runtime/session_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *kind_name(ir_buf_kind k) {
    switch (k) {
    case IR_BUF_INPUT: return "input";
    case IR_BUF_WEIGHT: return "weight";
    case IR_BUF_OUTPUT: return "output";
    case IR_BUF_TEMP: return "temporary";
    case IR_BUF_STATE: return "state";
    case IR_BUF_BLOCK: return "weight block";
    }
    return "buffer";
}

/* "f32 [4096, 8]" */
void rt_describe_buf(const ir_buf *b, char *out, size_t n) {
    int nd = 1;
    for (int i = 0; i < 4; i++)
        if (b->ne[i] != 1) nd = i + 1;
    int len = snprintf(out, n, "%s [", kiln_type_name(b->type));
    for (int i = 0; i < nd && len > 0 && (size_t)len < n; i++)
        len += snprintf(out + len, n - (size_t)len, "%s%lld", i ? ", " : "", (long long)b->ne[i]);
    if (len > 0 && (size_t)len < n) snprintf(out + len, n - (size_t)len, "]");
}

kiln_status rt_make_current(kiln_session *s) {
    rt_cures r = s->cu->CtxSetCurrent(s->ctx);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuCtxSetCurrent", "making device %d's context current", s->device);
    return NULL;
}

static kiln_status check_arch(kiln_session *s, const char *arch) {
    const rt_cuda_api *cu = s->cu;
    int cc_major = 0, cc_minor = 0;
    rt_cures r = cu->DeviceGetAttribute(&cc_major, RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                        s->dev);
    if (r == RT_CUDA_SUCCESS)
        r = cu->DeviceGetAttribute(&cc_minor, RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                   s->dev);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuDeviceGetAttribute",
                             "reading the compute capability of device %d", s->device);
    kb_arch code;
    if (!kb_arch_parse(arch, &code))
        return kb_error(KILN_ERR_INVALID, "kiln_session_new: the program's arch \"%s\" is not of "
                                          "the form sm_XY[a] or compute_XY[a]", arch);
    if (kb_arch_fits(&code, cc_major, cc_minor)) return NULL;
    char want[16];
    if (cc_major >= 9) snprintf(want, sizeof want, "sm_%d%da", cc_major, cc_minor);
    else snprintf(want, sizeof want, "sm_%d%d", cc_major, cc_minor);
    return kb_error(KILN_ERR_INVALID,
                    "kiln_session_new: the program was compiled for %s, which cannot run on device "
                    "%d (%s, compute capability %d.%d); compile it for this GPU with arch \"%s\"",
                    arch, s->device, s->dev_name, cc_major, cc_minor, want);
}

/* A variant's weight or state is the primary session's buffer of that name. */
static kiln_status share_buffer(kiln_session *s, int i) {
    const kiln_session *p = s->primary;
    const ir_buf       *b = &s->bufs[i];
    for (int j = 0; j < p->nbufs; j++) {
        const ir_buf *o = &p->bufs[j];
        if (o->kind != b->kind || strcmp(o->name, b->name) != 0) continue;
        if (o->bytes != b->bytes || o->type != b->type)
            return kb_error(KILN_ERR_INVALID, "kiln_session_new: %s '%s' differs between the general "
                                              "program and a specialized one",
                            kind_name(b->kind), b->name);
        s->dptr[i] = p->dptr[j];
        return NULL;
    }
    return kb_error(KILN_ERR_INVALID, "kiln_session_new: a specialized program has %s '%s', which the "
                                      "general one lacks",
                    kind_name(b->kind), b->name);
}

/* The named buffers (those a caller can set or get) sorted by name, then index: lookups by
 * name are a binary search, not a scan of a model's thousands of buffers per call. */
typedef struct {
    const char *name;
    int         i;
} name_ix;

static int cmp_name_ix(const void *a, const void *b) {
    const name_ix *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

static bool named_kind(ir_buf_kind k) { return k != IR_BUF_TEMP && k != IR_BUF_BLOCK; }

static kiln_status index_names(kiln_session *s) {
    name_ix *v = malloc(sizeof *v * (size_t)(s->nbufs ? s->nbufs : 1));
    if (!v || !(s->by_name = malloc(sizeof *s->by_name * (size_t)(s->nbufs ? s->nbufs : 1)))) {
        free(v);
        return kb_oom();
    }
    int n = 0;
    for (int i = 0; i < s->nbufs; i++)
        if (named_kind(s->bufs[i].kind)) v[n++] = (name_ix){s->bufs[i].name, i};
    qsort(v, (size_t)n, sizeof *v, cmp_name_ix);
    for (int k = 0; k < n; k++) s->by_name[k] = v[k].i;
    s->nnamed = n;
    free(v);
    return NULL;
}

/* The first buffer (lowest index) named name, or -1. */
int rt_buf_named(const kiln_session *s, const char *name) {
    int lo = 0, hi = s->nnamed;
    while (lo < hi) { /* the first entry not below name */
        int mid = lo + (hi - lo) / 2;
        if (strcmp(s->bufs[s->by_name[mid]].name, name) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < s->nnamed && strcmp(s->bufs[s->by_name[lo]].name, name) == 0 ? s->by_name[lo] : -1;
}

static kiln_status alloc_buffers(kiln_session *s, const ir_prog *ir) {
    const rt_cuda_api *cu = s->cu;
    s->nbufs = ir->nbufs;
    if (ir->nbufs > 0) {
        s->bufs = malloc(sizeof *s->bufs * (size_t)ir->nbufs);
        s->dptr = calloc((size_t)ir->nbufs, sizeof *s->dptr);
        s->owned = calloc((size_t)ir->nbufs, sizeof *s->owned);
        if (!s->bufs || !s->dptr || !s->owned) return kb_oom();
        memcpy(s->bufs, ir->bufs, sizeof *s->bufs * (size_t)ir->nbufs);
    }
    for (int i = 0; i < s->nbufs; i++) s->bufs[i].name[sizeof s->bufs[i].name - 1] = 0;
    kiln_status st = index_names(s);
    if (!st) st = rt_io_setup(s, ir);
    if (st) return st;
    s->arena_bytes = ir->arena_bytes;
    rt_cures r;
    if (s->arena_bytes > 0) {
        r = cu->MemAlloc(&s->arena, s->arena_bytes);
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuMemAlloc", "allocating the %zu-byte arena of temporaries",
                                 s->arena_bytes);
        r = cu->MemsetD8(s->arena, 0, s->arena_bytes);
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuMemsetD8", "clearing the arena of temporaries");
    }
    for (int i = 0; i < s->nbufs; i++) {
        ir_buf *b = &s->bufs[i];
        if (b->kind == IR_BUF_TEMP) {
            if (b->first < 0) continue; /* dead (fused away): not placed, never passed */
            if (b->offset > s->arena_bytes || b->bytes > s->arena_bytes - b->offset)
                return kb_error(KILN_ERR_INVALID,
                                "kiln_session_new: temporary '%s' (%zu bytes at offset %zu) lies "
                                "outside the %zu-byte arena (the memory plan is inconsistent)",
                                b->name, b->bytes, b->offset, s->arena_bytes);
            s->dptr[i] = s->arena ? s->arena + b->offset : 0;
            continue;
        }
        if (b->bytes == 0) continue; /* no memory; kernels touching it have nothing to do */
        if (b->block) continue;      /* the block's memory: below */
        if (rt_io_placed(s, i)) {
            s->dptr[i] = rt_io_dptr(s, i);
            continue;
        }
        if (s->primary && (b->kind == IR_BUF_WEIGHT || b->kind == IR_BUF_STATE || b->kind == IR_BUF_BLOCK)) {
            kiln_status st = share_buffer(s, i);
            if (st) return st;
            continue;
        }
        r = cu->MemAlloc(&s->dptr[i], b->bytes);
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuMemAlloc", "allocating %zu bytes for %s '%s'", b->bytes,
                                 kind_name(b->kind), b->name);
        s->owned[i] = true;
        r = cu->MemsetD8(s->dptr[i], 0, b->bytes);
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuMemsetD8", "clearing %s '%s'", kind_name(b->kind), b->name);
    }
    for (int i = 0; i < s->nbufs; i++)
        if (s->bufs[i].block) s->dptr[i] = s->dptr[s->bufs[i].block - 1] + s->bufs[i].offset;
    return NULL;
}

static kiln_status alloc_scratch(kiln_session *s, const kiln_program *p) {
    s->scratch_bytes = p->scratch_bytes;
    if (!s->scratch_bytes) return NULL;
    rt_cures r = s->cu->MemAlloc(&s->scratch, s->scratch_bytes);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemAlloc", "allocating the program's %zu bytes of scratch", s->scratch_bytes);
    return NULL;
}

/* cuBLAS may allocate its workspace on first use, which a stream capture forbids: give it its
 * own up front (32 MiB: what cuBLAS asks for on Hopper). */
#define RT_BLAS_WORKSPACE (32u << 20)

static kiln_status setup_blas(kiln_session *s, const kiln_program *p) {
    bool need = false;
    for (int i = 0; i < p->nkernels; i++) need |= p->kernels[i].kind == CG_GEMM;
    if (!need) return NULL;
    kiln_status st = rt_cublas_init(&s->blas);
    if (st) return st;
    int r = s->blas->Create(&s->blas_handle);
    if (r) return rt_cublas_error(r, "cublasCreate", "creating the session's cuBLAS handle");
    rt_cures cr = s->cu->MemAlloc(&s->blas_ws, RT_BLAS_WORKSPACE);
    if (cr != RT_CUDA_SUCCESS) return rt_cuda_error(cr, "cuMemAlloc", "allocating cuBLAS's workspace");
    if ((r = s->blas->SetStream(s->blas_handle, s->stream)))
        return rt_cublas_error(r, "cublasSetStream", "binding cuBLAS to the session's stream");
    if ((r = s->blas->SetWorkspace(s->blas_handle, (void *)(uintptr_t)s->blas_ws, RT_BLAS_WORKSPACE)))
        return rt_cublas_error(r, "cublasSetWorkspace", "giving cuBLAS its workspace");
    return NULL;
}

static int blas_type(kiln_type t) {
    return t == KILN_F16 ? RT_CUDA_R_16F : t == KILN_BF16 ? RT_CUDA_R_16BF : RT_CUDA_R_32F;
}

static kiln_status run_gemm(kiln_session *s, int i, const rt_launch *l) {
    const cg_gemm *g = &l->gemm;
    const float    one = 1.0f, zero = 0.0f;
    bool           dyn = g->n_sym >= 0 && g->n_sym < s->ndims;
    int            n = dyn ? g->n_mul * s->dims_host[g->n_sym] : g->n;
    if (dyn && s->dims_host[g->n_sym] <= g->n_above) return NULL; /* another step took this run */
    int r = s->blas->GemmStridedBatchedEx(
        s->blas_handle, g->ta ? RT_CUBLAS_OP_T : RT_CUBLAS_OP_N, g->tb ? RT_CUBLAS_OP_T : RT_CUBLAS_OP_N, g->m, n,
        g->k, &one, (const void *)(uintptr_t)l->gemm_ptr[0], blas_type(g->a.type), (int)g->a.ld, (long long)g->a.stride,
        (const void *)(uintptr_t)l->gemm_ptr[1], blas_type(g->b.type), (int)g->b.ld, (long long)g->b.stride, &zero,
        (void *)(uintptr_t)l->gemm_ptr[2], blas_type(g->c.type), (int)g->c.ld, (long long)g->c.stride, g->batch,
        RT_CUBLAS_COMPUTE_32F, RT_CUBLAS_GEMM_DEFAULT);
    if (!r) return NULL;
    char what[160];
    snprintf(what, sizeof what, "running step %d '%s' (m %d, n %d, k %d, batch %d)", i, l->name, g->m, n, g->k,
             g->batch);
    return rt_cublas_error(r, "cublasGemmStridedBatchedEx", what);
}

/* ncclAllReduce of step i on the session's stream: the values of this run (the count at the
 * run's dims), summed over the group's ranks. */
static kiln_status run_coll(kiln_session *s, int i, const rt_launch *l) {
    const cg_coll *c = &l->coll;
    if (!s->comm)
        return kb_error(KILN_ERR_INVALID, "kiln_session_run: step %d '%s' is an all_reduce over %d ranks: the program "
                                          "runs in a group of %d sessions (kiln_group_new), not alone",
                        i, l->name, c->ranks, c->ranks);
    bool    dyn = c->count_sym >= 0 && c->count_sym < s->ndims;
    int64_t n = dyn ? (int64_t)c->count_mul * s->dims_host[c->count_sym] : c->count;
    if (n > c->count) n = c->count; /* (a dim is never over its maximum: kiln_session_set_dim) */
    int r = s->nccl->AllReduce((const void *)(uintptr_t)l->coll_ptr[0], (void *)(uintptr_t)l->coll_ptr[1], (size_t)n,
                               RT_NCCL_FLOAT32, RT_NCCL_SUM, s->comm, s->stream);
    if (!r) return NULL;
    char what[160];
    snprintf(what, sizeof what, "running step %d '%s' (%lld floats) on rank %d of %d", i, l->name, (long long)n, s->rank,
             s->nranks);
    return rt_nccl_error(r, "ncclAllReduce", what);
}

void rt_library_ptrs(rt_launch *l) {
    if (l->kind == CG_GEMM) {
        const cg_mat *m[3] = {&l->gemm.a, &l->gemm.b, &l->gemm.c};
        for (int j = 0; j < 3; j++) l->gemm_ptr[j] = l->argv[m[j]->param] + (rt_cuptr)m[j]->offset;
    } else if (l->kind == CG_COLLECTIVE) {
        const cg_mat *m[2] = {&l->coll.src, &l->coll.dst};
        for (int j = 0; j < 2; j++) l->coll_ptr[j] = l->argv[m[j]->param] + (rt_cuptr)m[j]->offset;
    }
}

/* Step i's library call (CG_GEMM, CG_COLLECTIVE; l->kind set): its operands name parameters of
 * the step (a collective's, buffers: NCCL gets no scratch or dims), and their device addresses. */
static kiln_status library_operands(const cg_kernel *k, rt_launch *l, int i) {
    const cg_mat *m[3] = {&k->gemm.a, &k->gemm.b, &k->gemm.c};
    int           n = 3;
    if (k->kind == CG_COLLECTIVE) m[0] = &k->coll.src, m[1] = &k->coll.dst, n = 2;
    for (int j = 0; j < n; j++)
        if (m[j]->param < 0 || m[j]->param >= k->nparams || (k->kind == CG_COLLECTIVE && k->params[m[j]->param] < 0))
            return kb_error(KILN_ERR_INVALID, "kiln_session_new: step %d '%s': operand %d names parameter %d of %d", i,
                            l->name, j, m[j]->param, k->nparams);
    rt_library_ptrs(l);
    return NULL;
}

static kiln_status load_kernels(kiln_session *s, const kiln_program *p) {
    const rt_cuda_api *cu = s->cu;
    if (p->nkernels <= 0) return NULL;
    s->launches = calloc((size_t)p->nkernels, sizeof *s->launches);
    s->mods = calloc((size_t)p->nkernels, sizeof *s->mods);
    if (!s->launches || !s->mods) return kb_oom();
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        rt_launch       *l = &s->launches[i];
        snprintf(l->name, sizeof l->name, "%.*s", (int)sizeof k->name - 1, k->name);
        l->node = k->node;
        memcpy(l->grid, k->grid, sizeof l->grid);
        memcpy(l->block, k->block, sizeof l->block);
        l->smem = k->smem;
        l->empty = !k->grid[0] || !k->grid[1] || !k->grid[2];
        if (k->kind == CG_LAUNCH && !l->empty && (!k->block[0] || !k->block[1] || !k->block[2]))
            return kb_error(KILN_ERR_INVALID, "kiln_session_new: kernel %d '%s' has an empty block "
                                              "(%ux%ux%u)", i, l->name, k->block[0], k->block[1],
                            k->block[2]);
        if (k->nparams < 0 || k->nparams > IR_MAX_IN + 4)
            return kb_error(KILN_ERR_INVALID, "kiln_session_new: kernel %d '%s' has %d parameters",
                            i, l->name, k->nparams);
        l->nparams = k->nparams;
        for (int j = 0; j < k->nparams; j++) {
            int b = k->params[j];
            if (b == CG_PARAM_DIMS) {
                if (!s->dims_dev)
                    return kb_error(KILN_ERR_INVALID, "kiln_session_new: kernel %d '%s' reads symbolic "
                                                      "dims; the program has none", i, l->name);
                l->argv[j] = s->dims_dev;
                l->args[j] = &l->argv[j];
                l->pbuf[j] = RT_PBUF_DIMS;
                continue;
            }
            if (b == CG_PARAM_SCRATCH) {
                if (!s->scratch || k->scratch > s->scratch_bytes)
                    return kb_error(KILN_ERR_INVALID, "kiln_session_new: kernel %d '%s' wants %zu bytes of "
                                                      "scratch; the program has %zu", i, l->name, k->scratch,
                                    s->scratch_bytes);
                l->argv[j] = s->scratch;
                l->args[j] = &l->argv[j];
                l->pbuf[j] = RT_PBUF_SCRATCH;
                continue;
            }
            if (b < 0 || b >= s->nbufs)
                return kb_error(KILN_ERR_INVALID, "kiln_session_new: kernel %d '%s' parameter %d "
                                                  "names buffer %d of %d", i, l->name, j, b,
                                s->nbufs);
            if (s->bufs[b].kind == IR_BUF_TEMP && s->bufs[b].first < 0)
                return kb_error(KILN_ERR_INVALID, "kiln_session_new: kernel %d '%s' uses temporary "
                                                  "'%s', which the memory plan did not place",
                                i, l->name, s->bufs[b].name);
            l->argv[j] = s->dptr[b];
            l->args[j] = &l->argv[j];
            l->pbuf[j] = b;
        }
        l->kind = k->kind;
        if (k->kind == CG_GEMM) {
            l->gemm = k->gemm;
            kiln_status st = library_operands(k, l, i);
            if (st) return st;
            l->empty = !k->gemm.m || !k->gemm.n;
            /* A captured library call keeps its sizes: a varying one means plain launches. */
            if (k->gemm.n_sym >= 0) s->use_graphs = false;
            s->nlaunches++;
            continue;
        }
        if (k->kind == CG_COLLECTIVE) {
            l->coll = k->coll;
            kiln_status st = library_operands(k, l, i);
            if (st) return st;
            l->empty = false;
            if (k->coll.count_sym >= 0) s->use_graphs = false; /* (as a GEMM of varying size) */
            s->ncoll++;
            s->nlaunches++;
            continue;
        }

        /* One module per distinct cubin (kernels with equal keys have equal code). */
        rt_module *m = NULL;
        for (int j = 0; j < s->nmods; j++)
            if (strcmp(s->mods[j].key, k->key_hex) == 0) m = &s->mods[j];
        if (!m) {
            m = &s->mods[s->nmods];
            snprintf(m->key, sizeof m->key, "%s", k->key_hex);
            rt_cures r = cu->ModuleLoadData(&m->mod, k->cubin);
            if (r != RT_CUDA_SUCCESS) {
                int v = rt_driver_version();
                return rt_cuda_error(r, "cuModuleLoadData",
                                     "loading kernel %d '%s' (cubin of %zu bytes for %s, key %s) on "
                                     "device %d (%s; driver supports CUDA %d.%d)",
                                     i, l->name, k->cubin_size, p->arch, k->key_hex, s->device,
                                     s->dev_name, v / 1000, v % 1000 / 10);
            }
            s->nmods++;
        }
        rt_cures r = cu->ModuleGetFunction(&l->fn, m->mod, k->name);
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuModuleGetFunction",
                                 "looking up entry point '%s' of kernel %d in its cubin (key %s)",
                                 k->name, i, k->key_hex);
        /* Opt in whenever there is dynamic shared memory: the 48 KiB default limit counts
         * static plus dynamic, so a kernel under 48 KiB dynamic may still need it. */
        if (l->smem > 0) {
            r = cu->FuncSetAttribute(l->fn, RT_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     (int)l->smem);
            if (r != RT_CUDA_SUCCESS)
                return rt_cuda_error(r, "cuFuncSetAttribute",
                                     "allowing %u bytes of dynamic shared memory for kernel %d '%s'",
                                     l->smem, i, l->name);
        }
        s->nlaunches++;
    }
    return NULL;
}

/* Programmatic dependent launch (Hopper on): each kernel may be launched while its predecessor
 * drains, and waits in its first instruction (griddepcontrol.wait, which codegen puts at the top
 * of every kernel) until the predecessor has finished and its writes are visible. The kernel
 * boundaries of a decode step (hundreds of them) then cost less than a full launch each.
 * KILN_PDL=0 turns it off (the wait is then a no-op). */
/* An environment switch set to 0, off, no or false. */
static bool env_off(const char *name) {
    const char *e = getenv(name);
    return e && (!strcmp(e, "0") || !strcmp(e, "off") || !strcmp(e, "no") || !strcmp(e, "false"));
}

static bool pdl_enabled(const char *arch) {
    if (env_off("KILN_PDL")) return false;
    kb_arch a;
    return rt_cuda()->LaunchKernelEx && kb_arch_parse(arch, &a) && a.major >= 9;
}

static bool graphs_enabled(const kiln_session_opts *opts) {
    return !(opts && opts->no_cuda_graph) && !env_off("KILN_CUDA_GRAPHS");
}

/* The program's symbolic dims: names and maxima; their values live in the input window
 * (rt_io_setup), all at their maximum to begin with. */
static void setup_dims(kiln_session *s, const kiln_program *p) {
    const kiln_ctx *ctx = p->ir->g ? p->ir->g->ctx : NULL;
    s->ndims = ctx ? ctx->ndims : 0;
    for (int i = 0; i < s->ndims; i++) {
        snprintf(s->dim_name[i], sizeof s->dim_name[i], "%s", ctx->dims[i].name);
        s->dim_max[i] = ctx->dims[i].max;
    }
}

static kiln_status session_open(const kiln_program *p, const kiln_session_opts *opts,
                                kiln_session *primary, kiln_session **out);

kiln_status kiln_session_new(const kiln_program *p, const kiln_session_opts *opts,
                             kiln_session **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_session_new: out is NULL");
    *out = NULL;
    kiln_session *s;
    kiln_status   st = session_open(p, opts, NULL, &s);
    if (st) return st;
    if (p->nspec > 0) {
        s->spec = calloc((size_t)p->nspec, sizeof *s->spec);
        if (!s->spec) st = kb_oom();
    }
    for (int i = 0; !st && i < p->nspec; i++) {
        st = session_open(p->spec[i], opts, s, &s->spec[i]);
        if (!st) {
            s->spec_dim[i] = p->spec_dim[i];
            s->spec_val[i] = p->spec_val[i];
            s->nspec++;
        }
    }
    if (st) {
        kiln_session_free(s);
        return st;
    }
    *out = s;
    return NULL;
}

static kiln_status session_open(const kiln_program *p, const kiln_session_opts *opts,
                                kiln_session *primary, kiln_session **out) {
    *out = NULL;
    if (!p) return kb_error(KILN_ERR_INVALID, "kiln_session_new: program is NULL");
    if (!p->ir) return kb_error(KILN_ERR_INVALID, "kiln_session_new: program has no IR");
    if (p->nkernels > 0 && !p->kernels)
        return kb_error(KILN_ERR_INVALID, "kiln_session_new: program has no kernel table");
    int device = opts ? opts->device : 0;
    if (device < 0)
        return kb_error(KILN_ERR_INVALID, "kiln_session_new: device ordinal %d is negative", device);

    kiln_status st = rt_driver_init();
    if (st) return st;

    for (int i = 0; i < p->nkernels; i++)
        if (p->kernels[i].kind == CG_LAUNCH && (!p->kernels[i].cubin || !p->kernels[i].cubin_size))
            return kb_error(KILN_ERR_INVALID,
                            "kiln_session_new: kernel %d '%s' has no machine code: the program was "
                            "compiled with skip_nvrtc (sources only); compile it without "
                            "skip_nvrtc to run it",
                            i, p->kernels[i].name);

    kiln_session *s = calloc(1, sizeof *s);
    if (!s) return kb_oom();
    s->cu = rt_cuda();
    s->device = device;
    s->use_graphs = graphs_enabled(opts);
    if ((s->profile = rt_profile_wanted())) s->use_graphs = false;
    s->primary = primary;
    snprintf(s->arch, sizeof s->arch, "%s", p->arch);
    s->pdl = pdl_enabled(p->arch);
    const rt_cuda_api *cu = s->cu;
    rt_cures r;

    st = rt_device_pin(device, &s->dev);
    if (st) goto fail;
    r = cu->DeviceGetName(s->dev_name, (int)sizeof s->dev_name - 1, s->dev);
    if (r != RT_CUDA_SUCCESS) snprintf(s->dev_name, sizeof s->dev_name, "unknown GPU");
    st = check_arch(s, p->arch);
    if (st) goto fail;

    r = cu->DevicePrimaryCtxRetain(&s->ctx, s->dev);
    if (r != RT_CUDA_SUCCESS) {
        st = rt_cuda_error(r, "cuDevicePrimaryCtxRetain", "creating the context of device %d (%s)",
                           device, s->dev_name);
        goto fail;
    }
    s->ctx_retained = true;
    if ((st = rt_make_current(s))) goto fail;

    /* Variants share the primary's stream, so that an upload into a shared weight or state is
     * ordered before any variant's run without a synchronization. */
    if (primary) s->stream = primary->stream, s->stream_borrowed = true;
    else r = cu->StreamCreate(&s->stream, RT_CU_STREAM_NON_BLOCKING);
    if (!primary && r != RT_CUDA_SUCCESS) {
        st = rt_cuda_error(r, "cuStreamCreate", "creating the session's stream");
        goto fail;
    }
    r = cu->EventCreate(&s->ev_start, RT_CU_EVENT_DEFAULT);
    if (r == RT_CUDA_SUCCESS) r = cu->EventCreate(&s->ev_end, RT_CU_EVENT_DEFAULT);
    if (r != RT_CUDA_SUCCESS) {
        st = rt_cuda_error(r, "cuEventCreate", "creating the session's timing events");
        goto fail;
    }

    setup_dims(s, p);
    if ((st = alloc_buffers(s, p->ir))) goto fail;
    if ((st = alloc_scratch(s, p))) goto fail;
    if ((st = setup_blas(s, p))) goto fail;
    if ((st = load_kernels(s, p))) goto fail;

    /* The memsets ran on the legacy stream, which the non-blocking session stream does not
     * wait for. */
    r = cu->CtxSynchronize();
    if (r != RT_CUDA_SUCCESS) {
        st = rt_cuda_error(r, "cuCtxSynchronize", "clearing the session's device memory");
        goto fail;
    }
    *out = s;
    return NULL;

fail:
    kiln_session_free(s);
    return st;
}

void kiln_session_free(kiln_session *s) {
    if (!s) return;
    if (s->chain_unit) kiln_status_free(kiln_session_chain_end(s, NULL, 0));
    for (int i = 0; i < s->nspec; i++) kiln_session_free(s->spec[i]);
    free(s->spec);
    const rt_cuda_api *cu = s->cu;
    if (cu && s->ctx) {
        cu->CtxSetCurrent(s->ctx);
        if (s->stream) cu->StreamSynchronize(s->stream);
        rt_profile_report(s);
        rt_profile_free(s);
        if (s->exec) cu->GraphExecDestroy(s->exec);
        rt_chain_free(s);
        if (s->ev_start) cu->EventDestroy(s->ev_start);
        if (s->ev_end) cu->EventDestroy(s->ev_end);
        for (int i = 0; i < s->nmods; i++)
            if (s->mods[i].mod) cu->ModuleUnload(s->mods[i].mod);
        for (int i = 0; i < s->nbufs; i++)
            if (s->owned && s->owned[i] && s->dptr[i]) cu->MemFree(s->dptr[i]);
        if (s->arena) cu->MemFree(s->arena);
        if (s->blas_handle) s->blas->Destroy(s->blas_handle);
        if (s->blas_ws) cu->MemFree(s->blas_ws);
        if (s->scratch) cu->MemFree(s->scratch);
        rt_io_free(s);
        for (int i = 0; s->pinned && i < s->nbufs; i++)
            if (s->pinned[i]) cu->MemFreeHost(s->pinned[i]);
        if (s->stream && !s->stream_borrowed) cu->StreamDestroy(s->stream);
    }
    if (cu && s->ctx_retained) cu->DevicePrimaryCtxRelease(s->dev);
    free(s->launches);
    free(s->mods);
    free(s->bufs);
    free(s->dptr);
    free(s->owned);
    free(s->pinned);
    free(s->pin_busy);
    free(s->win_off);
    free(s->by_name);
    free(s->pend);
    free(s);
}

/* The names a caller may pass, for "not found" messages. */
static char *valid_names(const kiln_session *s, bool for_set) {
    kb_str b = {0};
    static const ir_buf_kind order[4] = {IR_BUF_INPUT, IR_BUF_WEIGHT, IR_BUF_STATE, IR_BUF_OUTPUT};
    int nkinds = for_set ? 3 : 4;
    for (int k = 0; k < nkinds; k++) {
        int n = 0;
        for (int i = 0; i < s->nbufs; i++) {
            if (s->bufs[i].kind != order[k]) continue;
            if (n == 0) kb_str_addf(&b, "%s%ss ", b.len ? "; " : "", kind_name(order[k]));
            kb_str_addf(&b, "%s'%s'", n ? ", " : "", s->bufs[i].name);
            n++;
        }
    }
    if (!b.len) kb_str_add(&b, "none");
    return kb_str_take(&b);
}

static kiln_status find_buf(const kiln_session *s, const char *fn, const char *name, bool for_set,
                            int *out) {
    int i = rt_buf_named(s, name);
    if (i >= 0) {
        if (for_set && s->bufs[i].kind == IR_BUF_OUTPUT)
            return kb_error(KILN_ERR_INVALID, "%s: '%s' is an output of the program; only inputs "
                                              "weights and states can be set", fn, name);
        *out = i;
        return NULL;
    }
    char *names = valid_names(s, for_set);
    kiln_status st = kb_error(KILN_ERR_NOT_FOUND, "%s: the program has no %s named '%s' (valid: %s)",
                              fn, for_set ? "input or weight" : "input, weight or output", name,
                              names ? names : "?");
    free(names);
    return st;
}

/* Buffer b's extents at the current values of its symbolic dims. */
static void current_ne(const kiln_session *s, const ir_buf *b, int64_t ne[4]) {
    for (int d = 0; d < 4; d++)
        ne[d] = b->sym[d] && b->sym[d] <= s->ndims ? s->dims_host[b->sym[d] - 1] : b->ne[d];
}

bool rt_buf_symbolic(const ir_buf *b) { return b->sym[0] | b->sym[1] | b->sym[2] | b->sym[3]; }

size_t rt_current_bytes(const kiln_session *s, const ir_buf *b) {
    int64_t ne[4];
    current_ne(s, b, ne);
    return kiln_row_size(b->type, ne[0]) * (size_t)(ne[1] * ne[2] * ne[3]);
}

static kiln_status check_bytes(const kiln_session *s, const char *fn, int i, size_t bytes) {
    const ir_buf *b = &s->bufs[i];
    size_t        want = rt_current_bytes(s, b);
    if (bytes == want) return NULL;
    char shape[128];
    rt_describe_buf(b, shape, sizeof shape);
    if (rt_buf_symbolic(b)) {
        int64_t ne[4];
        current_ne(s, b, ne);
        return kb_error(KILN_ERR_INVALID,
                        "%s: %s '%s' is %s at most; at the current dims it is [%lld, %lld, %lld, %lld], "
                        "%zu bytes contiguous; got %zu bytes (set the dims first)",
                        fn, kind_name(b->kind), b->name, shape, (long long)ne[0], (long long)ne[1],
                        (long long)ne[2], (long long)ne[3], want, bytes);
    }
    return kb_error(KILN_ERR_INVALID, "%s: %s '%s' is %s, %zu bytes contiguous; got %zu bytes", fn,
                    kind_name(b->kind), b->name, shape, b->bytes, bytes);
}

/* Between the caller's contiguous data at the current extents and the buffer's layout at the
 * maximum: row by row into (to_dev) or out of `padded`. Returns the bytes of padded that hold
 * data (a prefix: rows beyond are not touched). */
size_t rt_repack(const kiln_session *s, const ir_buf *b, void *padded, void *dense, bool to_dev) {
    int64_t ne[4];
    current_ne(s, b, ne);
    size_t es = kiln_type_size(b->type), row = (size_t)ne[0] * es, used = 0;
    for (int64_t i3 = 0; i3 < ne[3]; i3++)
        for (int64_t i2 = 0; i2 < ne[2]; i2++)
            for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                size_t off = (size_t)(((i3 * b->ne[2] + i2) * b->ne[1] + i1) * b->ne[0]) * es;
                char  *d = (char *)dense + (size_t)((i3 * ne[2] + i2) * ne[1] + i1) * row;
                if (to_dev) memcpy((char *)padded + off, d, row);
                else memcpy(d, (char *)padded + off, row);
                used = off + row;
            }
    return used;
}

size_t rt_host_copy(const kiln_session *s, int i, void *copy, void *data, size_t bytes, bool into_copy) {
    const ir_buf *b = &s->bufs[i];
    if (rt_buf_symbolic(b)) return rt_repack(s, b, copy, data, into_copy);
    if (into_copy) memcpy(copy, data, bytes);
    else memcpy(data, copy, bytes);
    return bytes;
}

/* The prefix of buffer b's padded layout that holds the current elements. */
static size_t padded_used(const kiln_session *s, const ir_buf *b) {
    int64_t ne[4];
    current_ne(s, b, ne);
    size_t es = kiln_type_size(b->type);
    return (size_t)((((ne[3] - 1) * b->ne[2] + ne[2] - 1) * b->ne[1] + ne[1] - 1) * b->ne[0] + ne[0]) * es;
}

/* Uploads up to this size (inputs too large for the input window, and states) go through a
 * pinned copy: a memcpy, then an async copy (for an input, at its session's next run), instead
 * of two synchronous driver calls. Larger ones (weights set one by one, whole caches) go
 * synchronously rather than pin their size in host memory. The size is the caller's: a decode
 * step's mask row is small even when the buffer holds the largest batch's mask (RT_PIN_MAX
 * bounds that buffer). */
#define RT_ASYNC_MAX ((size_t)4 << 20)
#define RT_PIN_MAX ((size_t)64 << 20)

/* Buffer i's pinned host copy, allocated at first use; NULL when that fails (*r says why, or
 * stays success when host memory ran out: callers fall back to pageable copies). */
static void *pinned_of(kiln_session *s, int i, rt_cures *r) {
    if (!s->pinned && !(s->pinned = calloc((size_t)s->nbufs, sizeof *s->pinned))) return NULL;
    if (!s->pin_busy && !(s->pin_busy = calloc((size_t)s->nbufs, sizeof *s->pin_busy))) return NULL;
    if (!s->pinned[i] && (*r = s->cu->MemAllocHost(&s->pinned[i], s->bufs[i].bytes)) != RT_CUDA_SUCCESS) {
        s->pinned[i] = NULL;
        return NULL;
    }
    return s->pinned[i];
}

static kiln_status upload_async(kiln_session *s, int i, const void *data, size_t bytes) {
    const ir_buf *b = &s->bufs[i];
    rt_cures      r = RT_CUDA_SUCCESS;
    if (!pinned_of(s, i, &r)) {
        if (r == RT_CUDA_SUCCESS) return kb_oom();
        return rt_cuda_error(r, "cuMemAllocHost", "allocating %zu pinned bytes for '%s'", b->bytes, b->name);
    }
    /* A copy from this pinned block may still be queued (the block was set twice without a run
     * between): wait for it. Runs end idle, so a step that sets each input once never waits. */
    if (s->pin_busy[i]) {
        if ((r = s->cu->StreamSynchronize(s->stream)) != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuStreamSynchronize", "before copying into '%s'", b->name);
        memset(s->pin_busy, 0, sizeof *s->pin_busy * (size_t)s->nbufs);
    }
    size_t n = rt_host_copy(s, i, s->pinned[i], (void *)data, bytes, true);
    if (b->kind == IR_BUF_INPUT) {
        /* An input is this session's own: its copy waits for this session's next run (queued
         * first there), so a variant's step does not pay for the primary's copy it never reads. */
        if (!s->pend && !(s->pend = calloc((size_t)s->nbufs, sizeof *s->pend))) return kb_oom();
        s->npend += !s->pend[i];
        s->pend[i] = n;
        return NULL;
    }
    if ((r = s->cu->MemcpyHtoDAsync(s->dptr[i], s->pinned[i], n, s->stream)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemcpyHtoDAsync", "copying %zu bytes into %s '%s'", n, kind_name(b->kind),
                             b->name);
    s->pin_busy[i] = true;
    return NULL;
}

/* The shared stream is idle: no pinned block of s, its primary or their variants is busy. */
void rt_pins_idle(kiln_session *s) {
    kiln_session *root = s->primary ? s->primary : s;
    for (int v = -1; v < root->nspec; v++) {
        kiln_session *u = v < 0 ? root : root->spec[v];
        if (u->pin_busy) memset(u->pin_busy, 0, sizeof *u->pin_busy * (size_t)u->nbufs);
    }
}

static kiln_status upload(kiln_session *s, int i, const void *data, size_t bytes) {
    const ir_buf *b = &s->bufs[i];
    if (rt_io_placed(s, i)) { /* the next run copies it in */
        rt_io_set(s, i, data, bytes);
        return NULL;
    }
    kiln_status st = rt_make_current(s);
    if (st) return st;
    if (bytes <= RT_ASYNC_MAX && b->bytes <= RT_PIN_MAX && b->kind != IR_BUF_WEIGHT)
        return upload_async(s, i, data, bytes);
    /* A chain's runs may still be queued on the session's stream, which the legacy stream of
     * the synchronous copy below does not wait for. */
    kiln_session *root = s->primary ? s->primary : s;
    rt_cures      r;
    if (root->chain_unit && (r = s->cu->StreamSynchronize(s->stream)) != RT_CUDA_SUCCESS) {
        s->broken = root->chain_unit->broken = true;
        return rt_cuda_error(r, "cuStreamSynchronize", "waiting for the chain's runs before copying into '%s'",
                             b->name);
    }
    void  *staging = NULL;
    size_t n = bytes;
    if (kb_quant_split(b->type)) { /* the device layout of q8_0, q4_0, q6_K (templates/quant.lua) */
        if (!(staging = malloc(bytes))) return kb_oom();
        kb_quant_to_device(b->type, data, staging, bytes);
        data = staging;
    } else if (rt_buf_symbolic(b)) {
        staging = calloc(1, b->bytes);
        if (!staging) return kb_oom();
        n = rt_repack(s, b, staging, (void *)data, true);
        data = staging;
    }
    r = s->cu->MemcpyHtoD(s->dptr[i], data, n);
    free(staging);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemcpyHtoD", "copying %zu bytes into %s '%s'", n, kind_name(b->kind),
                             b->name);
    /* The copy went through the legacy stream; make sure it has landed before the session
     * stream (which does not wait for the legacy one) reads the buffer. */
    r = s->cu->CtxSynchronize();
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuCtxSynchronize", "finishing the copy into '%s'", b->name);
    return NULL;
}

kiln_status kiln_session_set(kiln_session *s, const char *name, const void *data, size_t bytes) {
    static const char fn[] = "kiln_session_set";
    if (!s || !name) return kb_error(KILN_ERR_INVALID, "%s: %s is NULL", fn, s ? "name" : "session");
    int i;
    kiln_status st = find_buf(s, fn, name, true, &i);
    if (st) return st;
    if ((st = check_bytes(s, fn, i, bytes))) return st;
    if ((st = rt_chain_check_set(s, name))) return st;
    if (bytes == 0) return NULL;
    if (!data) return kb_error(KILN_ERR_INVALID, "%s: data for '%s' is NULL", fn, name);
    if ((st = upload(s, i, data, bytes))) return st;
    /* Variants have inputs of their own (their layouts may differ); weights and states are
     * shared. A variant whose fixed dims do not have the current values cannot run now, and
     * its input has another size: it is skipped. */
    for (int v = 0; v < s->nspec && s->bufs[i].kind == IR_BUF_INPUT; v++) {
        int j = rt_buf_named(s->spec[v], name);
        if (j < 0 || rt_current_bytes(s->spec[v], &s->spec[v]->bufs[j]) != bytes) continue;
        if ((st = upload(s->spec[v], j, data, bytes))) return st;
    }
    return NULL;
}

kiln_status kiln_session_get(kiln_session *s, const char *name, void *data, size_t bytes) {
    static const char fn[] = "kiln_session_get";
    if (!s || !name) return kb_error(KILN_ERR_INVALID, "%s: %s is NULL", fn, s ? "name" : "session");
    if (s->chain_unit)
        return kb_error(KILN_ERR_INVALID, "%s: '%s': a chain is open; its runs' outputs come from "
                                          "kiln_session_chain_run and _end", fn, name);
    int i;
    kiln_status st = find_buf(s, fn, name, false, &i);
    if (st) return st;
    if ((st = check_bytes(s, fn, i, bytes))) return st;
    if (bytes == 0) return NULL;
    if (!data) return kb_error(KILN_ERR_INVALID, "%s: data for '%s' is NULL", fn, name);
    /* An output comes from the variant that ran last. */
    kiln_session *u = s;
    if (s->bufs[i].kind == IR_BUF_OUTPUT && s->last && s->last != s) {
        int j = rt_buf_named(s->last, name);
        if (j >= 0) u = s->last, i = j;
    }
    if (rt_io_placed(u, i) && rt_io_get(u, i, data, bytes)) return NULL;
    if (u->pend && u->pend[i]) { /* set, not copied yet: the pinned copy holds it */
        rt_host_copy(u, i, u->pinned[i], data, bytes, false);
        return NULL;
    }
    if ((st = rt_make_current(u))) return st;
    const ir_buf *b = &u->bufs[i];
    void         *staging = NULL;
    size_t        n = bytes;
    if (rt_buf_symbolic(b) || kb_quant_split(b->type)) {
        staging = malloc(b->bytes);
        if (!staging) return kb_oom();
        n = rt_buf_symbolic(b) ? padded_used(u, b) : bytes;
    }
    rt_cures r = u->cu->StreamSynchronize(u->stream);
    /* Small outputs (logits) come through a pinned copy: a DMA straight into it instead of
     * the driver staging pageable memory in pieces. */
    void    *pin = NULL;
    rt_cures ra = RT_CUDA_SUCCESS; /* a failed pinned allocation falls back to pageable */
    if (!staging && b->bytes <= RT_ASYNC_MAX && r == RT_CUDA_SUCCESS && (pin = pinned_of(u, i, &ra)))
        r = u->cu->MemcpyDtoH(pin, u->dptr[i], n);
    if (pin && r == RT_CUDA_SUCCESS) memcpy(data, pin, n);
    else if (r == RT_CUDA_SUCCESS) r = u->cu->MemcpyDtoH(staging ? staging : data, u->dptr[i], n);
    if (r == RT_CUDA_SUCCESS && staging && kb_quant_split(b->type)) kb_quant_from_device(b->type, staging, data, n);
    else if (r == RT_CUDA_SUCCESS && staging) rt_repack(u, b, staging, data, false);
    free(staging);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemcpyDtoH", "copying %zu bytes out of %s '%s'", n, kind_name(b->kind),
                             name);
    return NULL;
}

/* Does the first `bytes` of b's data at the current dims sit at the start of its buffer as it
 * is? Yes when every dim inside the outermost one holding more than one element is at its
 * maximum (logits [n_vocab, n_tokens]: the first rows), or the buffer is not symbolic. */
static bool prefix_in_place(const kiln_session *s, const ir_buf *b) {
    if (!rt_buf_symbolic(b)) return true;
    int64_t ne[4];
    current_ne(s, b, ne);
    int outer = 0;
    for (int d = 0; d < 4; d++)
        if (ne[d] > 1) outer = d;
    for (int d = 0; d < outer; d++)
        if (ne[d] != b->ne[d]) return false;
    return true;
}

kiln_status kiln_session_get_prefix(kiln_session *s, const char *name, void *data, size_t bytes) {
    static const char fn[] = "kiln_session_get_prefix";
    if (!s || !name) return kb_error(KILN_ERR_INVALID, "%s: %s is NULL", fn, s ? "name" : "session");
    if (s->chain_unit) return kb_error(KILN_ERR_INVALID, "%s: '%s': a chain is open", fn, name);
    int         i;
    kiln_status st = find_buf(s, fn, name, false, &i);
    if (st) return st;
    kiln_session *u = s; /* an output comes from the variant that ran last */
    if (s->bufs[i].kind == IR_BUF_OUTPUT && s->last && s->last != s) {
        int j = rt_buf_named(s->last, name);
        if (j >= 0) u = s->last, i = j;
    }
    const ir_buf *b = &u->bufs[i];
    size_t        full = rt_current_bytes(u, b);
    if (bytes > full)
        return kb_error(KILN_ERR_INVALID, "%s: '%s' holds %zu bytes at the current dims; %zu asked", fn, name, full,
                        bytes);
    if (bytes == full) return kiln_session_get(s, name, data, bytes);
    if (bytes == 0) return NULL;
    if (!data) return kb_error(KILN_ERR_INVALID, "%s: data for '%s' is NULL", fn, name);
    bool placed = rt_io_placed(u, i);
    if (placed && b->kind == IR_BUF_OUTPUT && prefix_in_place(u, b) && rt_io_get_prefix(u, i, data, bytes)) return NULL;
    if (placed || b->kind != IR_BUF_OUTPUT || kb_quant_split(b->type) || !prefix_in_place(u, b)) {
        /* the general path: the whole of it, then the part asked */
        void *all = malloc(full);
        if (!all) return kb_oom();
        st = kiln_session_get(s, name, all, full);
        if (!st) memcpy(data, all, bytes);
        free(all);
        return st;
    }
    if ((st = rt_make_current(u))) return st;
    rt_cures r = u->cu->StreamSynchronize(u->stream);
    if (r == RT_CUDA_SUCCESS) r = u->cu->MemcpyDtoH(data, u->dptr[i], bytes);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemcpyDtoH", "copying the first %zu bytes out of output '%s'", bytes, name);
    return NULL;
}

kiln_status kiln_session_set_dim(kiln_session *s, const char *name, int64_t value) {
    if (!s || !name) return kb_error(KILN_ERR_INVALID, "kiln_session_set_dim: %s is NULL", s ? "name" : "session");
    int d = -1;
    for (int i = 0; i < s->ndims; i++)
        if (strcmp(s->dim_name[i], name) == 0) d = i;
    if (d < 0) {
        kb_str b = {0};
        for (int i = 0; i < s->ndims; i++) kb_str_addf(&b, "%s%s", i ? ", " : "", s->dim_name[i]);
        kiln_status st = kb_error(KILN_ERR_NOT_FOUND, "kiln_session_set_dim: the program has no symbolic dim "
                                                      "'%s' (it has: %s)", name, b.len ? b.s : "none");
        kb_str_free(&b);
        return st;
    }
    if (value < 1 || value > s->dim_max[d])
        return kb_error(KILN_ERR_INVALID, "kiln_session_set_dim: %s = %lld is out of range: 1 .. %lld (its "
                                          "maximum)", name, (long long)value, (long long)s->dim_max[d]);
    s->dims_host[d] = (int32_t)value;
    s->win_dirty = true;
    /* A variant whose maximum is smaller (kiln_dim_specialize_upto) keeps its last value when
     * this one is over it: it will not run, and its inputs, sized by its dims, are then not
     * uploaded (kiln_session_set compares the bytes), so nothing is written past its buffers. */
    for (int v = 0; v < s->nspec; v++) {
        kiln_session *u = s->spec[v];
        for (int i = 0; i < u->ndims; i++)
            if (strcmp(u->dim_name[i], name) == 0 && value <= u->dim_max[i])
                u->dims_host[i] = (int32_t)value, u->win_dirty = true;
    }
    return NULL;
}

kiln_status rt_launch_all(kiln_session *s, const char *doing) {
    bool prof = s->profile; /* profiled sessions never capture (use_graphs is off) */
    for (int i = 0; i < s->nlaunches; i++) {
        rt_launch *l = &s->launches[i];
        if (prof) {
            kiln_status st = rt_profile_mark(s, i);
            if (st) return st;
        }
        if (l->empty) continue;
        if (l->kind == CG_GEMM || l->kind == CG_COLLECTIVE) {
            kiln_status st = l->kind == CG_GEMM ? run_gemm(s, i, l) : run_coll(s, i, l);
            if (st) return st;
            continue;
        }
        rt_cures r;
        if (s->pdl) {
            rt_launch_attr   attr = {.id = RT_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, .v.value = 1};
            rt_launch_config cfg = {{l->grid[0], l->grid[1], l->grid[2]}, {l->block[0], l->block[1], l->block[2]},
                                    l->smem, s->stream, &attr, 1};
            r = s->cu->LaunchKernelEx(&cfg, l->fn, l->nparams ? l->args : NULL, NULL);
        } else {
            r = s->cu->LaunchKernel(l->fn, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2],
                                    l->smem, s->stream, l->nparams ? l->args : NULL, NULL);
        }
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuLaunchKernel",
                                 "%s kernel %d '%s' (grid %ux%ux%u, block %ux%ux%u, %u bytes "
                                 "shared memory)",
                                 doing, i, l->name, l->grid[0], l->grid[1], l->grid[2],
                                 l->block[0], l->block[1], l->block[2], l->smem);
    }
    return prof ? rt_profile_mark(s, s->nlaunches) : NULL;
}

kiln_status rt_capture(kiln_session *s, rt_cugraphexec *exec) {
    const rt_cuda_api *cu = s->cu;
    rt_cures r = cu->StreamBeginCapture(s->stream, RT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuStreamBeginCapture", "starting to capture the CUDA graph");
    kiln_status st = rt_launch_all(s, "capturing");
    rt_cugraph  g = NULL;
    r = cu->StreamEndCapture(s->stream, &g);
    if (st) {
        if (g) cu->GraphDestroy(g);
        return st;
    }
    if (r != RT_CUDA_SUCCESS) {
        if (g) cu->GraphDestroy(g);
        return rt_cuda_error(r, "cuStreamEndCapture", "capturing the CUDA graph of %d kernels",
                             s->nlaunches);
    }
    r = cu->GraphInstantiateWithFlags(exec, g, 0);
    cu->GraphDestroy(g); /* the executable graph does not need it */
    if (r != RT_CUDA_SUCCESS) {
        *exec = NULL;
        return rt_cuda_error(r, "cuGraphInstantiateWithFlags",
                             "instantiating the CUDA graph of %d kernels", s->nlaunches);
    }
    s->captures++;
    return NULL;
}

/* A group's sessions drop their graphs before the communicators go: a graph that captured NCCL's
 * kernels holds a reference on its communicator, and ncclCommDestroy waits until none is left
 * (NCCL 2.28: kiln run --tp 2 hung at its end). The session would capture again at its next run. */
void rt_drop_graphs(kiln_session *s) {
    for (int v = -1; s->cu && s->ctx && v < s->nspec; v++) {
        kiln_session *u = v < 0 ? s : s->spec[v];
        s->cu->CtxSetCurrent(u->ctx);
        if (u->stream) s->cu->StreamSynchronize(u->stream);
        if (u->exec) s->cu->GraphExecDestroy(u->exec);
        u->exec = NULL;
        u->warm = false; /* (a new capture comes after a plain run again) */
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static kiln_status run_unit(kiln_session *s, kiln_session_stats *stats);

/* The copies of inputs set since this session's last run (upload_async); with none, no scan
 * of the buffers. */
kiln_status rt_flush_pending(kiln_session *s) {
    for (int i = 0; s->npend > 0 && i < s->nbufs; i++) {
        if (!s->pend[i]) continue;
        rt_cures r = s->cu->MemcpyHtoDAsync(s->dptr[i], s->pinned[i], s->pend[i], s->stream);
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuMemcpyHtoDAsync", "copying %zu bytes into input '%s'", s->pend[i],
                                 s->bufs[i].name);
        s->pend[i] = 0;
        s->npend--;
        s->pin_busy[i] = true;
    }
    return NULL;
}

/* The session a run takes: a variant whose value matches, else one whose smaller maximum
 * (spec_val < 0: up to -spec_val) holds the value, else the general program. */
kiln_session *rt_unit(kiln_session *s, int *variant) {
    *variant = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int v = 0; v < s->nspec; v++) {
            int64_t have = s->dims_host[s->spec_dim[v]], sv = s->spec_val[v];
            if (pass == 0 ? sv > 0 && have == sv : sv < 0 && have <= -sv) {
                *variant = v + 1;
                return s->spec[v];
            }
        }
    return s;
}

kiln_status kiln_session_run(kiln_session *s) {
    if (!s) return kb_error(KILN_ERR_INVALID, "kiln_session_run: session is NULL");
    if (s->chain_unit)
        return kb_error(KILN_ERR_INVALID, "kiln_session_run: a chain is open (kiln_session_chain_end first)");
    int           variant;
    kiln_session *u = rt_unit(s, &variant);
    kiln_status   st = run_unit(u, &s->stats);
    if (st) return st;
    if (u != s) s->last_ms = u->last_ms;
    s->last = u;
    s->stats.variant = variant;
    return NULL;
}

static kiln_status run_unit(kiln_session *s, kiln_session_stats *stats) {
    double t0 = now_us();
    if (s->broken)
        return kb_error(KILN_ERR_CUDA, "kiln_session_run: an earlier run failed on the GPU and left "
                                       "the CUDA context unusable; create a new process");
    if (s->ncoll && !s->comm)
        return kb_error(KILN_ERR_INVALID, "kiln_session_run: the program has %d all_reduce steps: it runs in a group "
                                          "of sessions (kiln_group_new, kiln_group_run), not alone", s->ncoll);
    const rt_cuda_api *cu = s->cu;
    kiln_status        st = rt_make_current(s);
    if (st) return st;
    /* A group's rank runs its first run plain: NCCL makes a communicator's connections at its
     * first collective of each kind (NCCL_RUNTIME_CONNECT), which a stream capture forbids
     * (ncclAllReduce then fails with an internal error, seen with NCCL 2.28 on 2 H200s). */
    if (s->use_graphs && !s->exec && (!s->comm || s->warm)) {
        if ((st = rt_capture(s, &s->exec))) return st;
        stats->captures++;
    }

    s->out_fresh = false;
    if ((st = rt_flush_pending(s)) || (st = rt_io_copy_in(s))) return st;
    rt_cures r = cu->EventRecord(s->ev_start, s->stream);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuEventRecord", "starting the run's timer");
    if (s->exec) {
        r = cu->GraphLaunch(s->exec, s->stream);
        if (r != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuGraphLaunch", "launching the CUDA graph of %d kernels",
                                 s->nlaunches);
    } else if ((st = rt_launch_all(s, "launching"))) {
        cu->StreamSynchronize(s->stream);
        return st;
    }
    r = cu->EventRecord(s->ev_end, s->stream);
    if (r != RT_CUDA_SUCCESS) {
        cu->StreamSynchronize(s->stream);
        return rt_cuda_error(r, "cuEventRecord", "stopping the run's timer");
    }
    stats->host_us_last = now_us() - t0;
    r = cu->StreamSynchronize(s->stream);
    if (r != RT_CUDA_SUCCESS) {
        s->broken = true;
        return rt_cuda_error(r, "cuStreamSynchronize",
                             "waiting for the program's %d kernels on device %d (%s)%s", s->nlaunches,
                             s->device, s->dev_name,
                             s->exec ? "; to find the failing kernel, run with KILN_CUDA_GRAPHS=0 "
                                       "CUDA_LAUNCH_BLOCKING=1"
                                     : "; to find the failing kernel, run with "
                                       "CUDA_LAUNCH_BLOCKING=1");
    }
    rt_pins_idle(s);
    s->out_fresh = true;
    rt_profile_collect(s);
    float ms = 0;
    r = cu->EventElapsedTime(&ms, s->ev_start, s->ev_end);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuEventElapsedTime", "timing the run");
    s->last_ms = ms;
    stats->host_us_total += stats->host_us_last;
    stats->runs++;
    if (s->exec) stats->replays++;
    else stats->plain_runs++;
    s->warm = true;
    return NULL;
}

void kiln_session_get_stats(const kiln_session *s, kiln_session_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (s) *out = s->stats;
}

double kiln_session_last_ms(const kiln_session *s) { return s ? s->last_ms : 0.0; }

int kiln_session_captures(const kiln_session *s) { return s ? (int)s->stats.captures : 0; }
