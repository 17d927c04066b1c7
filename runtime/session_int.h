/* The kiln_session structure, shared by the files of runtime/ that implement its API
 * (session.c: creation, runs, inputs and outputs; weights.c: bulk weight upload). */
#ifndef KILN_RT_SESSION_H
#define KILN_RT_SESSION_H

#include "runtime/runtime.h"

#include "codegen/codegen.h"

enum { RT_PBUF_SCRATCH = -1, RT_PBUF_DIMS = -2 };

typedef struct {
    char     name[64];
    int      node;
    cg_step_kind kind;
    cg_gemm  gemm;           /* CG_GEMM: the call; a/b/c device addresses below */
    rt_cuptr gemm_ptr[3];
    cg_coll  coll;           /* CG_COLLECTIVE: the call; src/dst device addresses below */
    rt_cuptr coll_ptr[2];
    rt_cufn  fn;
    unsigned grid[3], block[3], smem;
    int      nparams;
    bool     empty; /* a zero grid dimension: nothing to do (zero-element tensors) */
    rt_cuptr argv[IR_MAX_IN + 4];
    void    *args[IR_MAX_IN + 4]; /* args[i] = &argv[i], as cuLaunchKernel wants */
    int      pbuf[IR_MAX_IN + 4]; /* the buffer each parameter points into, or RT_PBUF_* */
} rt_launch;

typedef struct {
    char     key[33];
    rt_cumod mod;
} rt_module;

struct kiln_session {
    const rt_cuda_api *cu;
    int                device;
    rt_cudev           dev;
    rt_cuctx           ctx;
    bool               ctx_retained;
    char               dev_name[128];
    char               arch[16];
    rt_custream        stream; /* a variant uses its primary's: all work of a session is ordered */
    bool               stream_borrowed;
    rt_cuevent         ev_start, ev_end;

    int       nbufs;
    ir_buf   *bufs;  /* copied from the program */
    rt_cuptr *dptr;  /* device address of each buffer (0 for zero-size ones) */
    bool     *owned; /* dptr[i] is its own allocation (not in the arena) */
    void    **pinned; /* small inputs and states: pinned host copies that uploads go through */
    bool     *pin_busy; /* pinned[i] is the source of a copy that may still be queued */
    size_t   *pend;     /* bytes of pinned[i] (an input) to copy at this session's next run */
    int       npend;    /* entries of pend that are not 0 */
    rt_cuptr  arena;
    size_t    arena_bytes;
    rt_cuptr  scratch;     /* the program's scratch (one stream: nodes take turns) */
    size_t    scratch_bytes;

    /* Collectives (runtime/group.c): the communicator of this session's rank in its group
     * (kiln_group_new sets it, on the variants too); NULL for a session alone, whose program
     * then must have no CG_COLLECTIVE step. */
    const rt_nccl_api *nccl;
    rt_nccl_comm       comm;
    int                rank, nranks;
    int                ncoll; /* CG_COLLECTIVE steps of the program */

    const rt_cublas_api *blas; /* set when the program has library GEMM steps */
    rt_cublas            blas_handle;
    rt_cuptr             blas_ws;

    rt_module *mods;
    int        nmods;
    rt_launch *launches; /* launch order; never reallocated after creation (args point in) */
    int        nlaunches;

    bool           use_graphs;
    bool           warm; /* a group's rank: a first run was plain (see run_unit) */
    bool           pdl; /* kernels launched with programmatic stream serialization (sm_90+) */
    rt_cugraphexec exec;
    int            captures;
    double         last_ms;
    bool           broken; /* a kernel failed: the context is unusable */

    /* Symbolic dims: their names and maxima (copied from the program's graph), their values
     * for the next run in pinned host memory, and the device copy kernels read (kdims), which
     * every run refreshes first (in a captured graph: a copy node reading the pinned memory). */
    int       ndims;
    char      dim_name[KILN_MAX_SYMS][FE_MAX_NAME];
    int64_t   dim_max[KILN_MAX_SYMS];
    int32_t  *dims_host;
    rt_cuptr  dims_dev;

    /* Specialized variants (kiln_dim_specialize): sessions of their own that share this one's
     * weights and states; spec_dim/spec_val say when each runs. */
    kiln_session **spec;
    int            nspec;
    int            spec_dim[KILN_MAX_SYMS * 4];
    int64_t        spec_val[KILN_MAX_SYMS * 4];
    kiln_session  *primary; /* for a variant: the session it belongs to */
    kiln_session  *last;    /* the session (this one or a variant) that ran last */

    /* The I/O windows (runtime/io.c): small inputs (and the dims' values) in a device block
     * with a pinned host twin, copied in before a run when it changed; tiny outputs in mapped
     * host memory. */
    rt_cuptr  win_dev[2];
    void     *win_host[2];
    size_t    win_bytes[2];
    size_t   *win_off;   /* per buffer: its offset in its window + 1 (0: its own allocation) */
    bool      out_fresh; /* the output twin holds the last run's outputs */
    bool      win_dirty; /* the input twin changed since its last copy */
    int      *by_name;   /* indices of the named buffers (not temporaries or blocks), by name */
    int       nnamed;

    /* Chained runs (runtime/chain.c): on the session the caller holds, the unit (itself or a
     * variant) whose chain is open; on a unit, its chain's twins, graphs and events. */
    kiln_session    *chain_unit;
    struct rt_chain *chain;
    /* KILN_PROFILE (runtime/profile.c): an event after each launch, time per launch summed. */
    bool        profile;
    rt_cuevent *prof_ev; /* nlaunches + 1 */
    double     *prof_ms;
    int64_t     prof_runs;
    int64_t     prof_seen; /* runs collected or skipped (KILN_PROFILE_SKIP) */
    kiln_session_stats stats;
};

/* "f32 [4096, 8]": b's type and shape, for messages. */
void rt_describe_buf(const ir_buf *b, char *out, size_t n);
/* KILN_PROFILE (runtime/profile.c). */
bool        rt_profile_wanted(void);
kiln_status rt_profile_mark(kiln_session *s, int i); /* event i: before launch i (i = nlaunches: the end) */
void        rt_profile_collect(kiln_session *s);     /* after a run's sync: add up its times */
void        rt_profile_report(kiln_session *s);      /* the table, on stderr */
void        rt_profile_free(kiln_session *s);
/* The I/O windows (runtime/io.c). */
enum { RT_WIN_IN, RT_WIN_OUT };
kiln_status rt_io_setup(kiln_session *s, const ir_prog *ir); /* buffers copied, dims known */
bool        rt_io_placed(const kiln_session *s, int i);
rt_cuptr    rt_io_dptr(const kiln_session *s, int i);
kiln_status rt_io_copy_in(kiln_session *s); /* before a run: the input window, if it changed */
void        rt_io_set(kiln_session *s, int i, const void *data, size_t bytes);
bool        rt_io_get(kiln_session *s, int i, void *data, size_t bytes); /* false: read the device */
void        rt_io_free(kiln_session *s);
/* Buffer b has a symbolic dim; rt_repack moves its current elements between the caller's
 * contiguous data (dense) and the layout at the maximum (padded), returning the bytes used. */
bool   rt_buf_symbolic(const ir_buf *b);
size_t rt_repack(const kiln_session *s, const ir_buf *b, void *padded, void *dense, bool to_dev);
/* Buffer i's current elements between the caller's data and a host copy in the device layout
 * (a pinned twin): repacked when it has a symbolic dim, else one memcpy of bytes. Returns the
 * bytes of the copy that hold data. */
bool   rt_io_get_prefix(kiln_session *s, int i, void *data, size_t bytes); /* io.c */
size_t rt_host_copy(const kiln_session *s, int i, void *copy, void *data, size_t bytes, bool into_copy);
/* Shared by session.c and chain.c. */
int           rt_buf_named(const kiln_session *s, const char *name); /* -1: none */
size_t        rt_current_bytes(const kiln_session *s, const ir_buf *b); /* at the current dims */
kiln_session *rt_unit(kiln_session *s, int *variant); /* the unit a run at the current dims runs */
kiln_status   rt_launch_all(kiln_session *s, const char *doing);
kiln_status   rt_capture(kiln_session *s, rt_cugraphexec *exec); /* s's launches as they are now */
void          rt_drop_graphs(kiln_session *s); /* s's and its variants' CUDA graphs destroyed */
kiln_status   rt_flush_pending(kiln_session *s); /* queues the copies of inputs set outside the window */
void          rt_pins_idle(kiln_session *s);     /* the stream is idle: no pinned block is busy */
/* Chained runs (runtime/chain.c). */
kiln_status rt_chain_check_set(kiln_session *s, const char *name); /* an error for the fed input */
void        rt_chain_free(kiln_session *s);
/* Library steps (CG_GEMM, CG_COLLECTIVE): their operands' device addresses from the launch's
 * current argv (after a chain redirects it). */
void rt_library_ptrs(rt_launch *l);
/* Makes s's context current on the calling thread. */
kiln_status rt_make_current(kiln_session *s);

#endif
