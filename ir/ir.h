/* ir: the graph lowered to kernels over buffers; passes; the CPU reference evaluator.
 * Prefix ir_.
 *
 * After lowering, every value lives in a buffer (an input, a weight, an output, or a temporary
 * in the arena), views are gone — folded into the strided layouts (ir_ref) through which nodes
 * read and write buffers — and each node is one kernel. */
#ifndef KILN_IR_H
#define KILN_IR_H

#include "frontend/frontend.h"

#define IR_MAX_IN 32     /* distinct operands of one kernel (a MoE expert sum reads 17) */
#define IR_MAX_INSTR 64  /* instructions of one fused elementwise kernel */
#define IR_ALIGN 256     /* byte alignment of every arena placement */

/* IR_BUF_STATE: memory that persists across runs (kiln's KILN_ROLE_STATE); it holds a value
 * before the program runs, like an input, and at most one node (an in-place set_rows) writes it.
 * IR_BUF_BLOCK: weights placed side by side (pass mul_mat_cat) so that one kernel reads them as
 * one matrix. It has no data or name of its own for callers: its members are the weights whose
 * `block` names it, each at its byte `offset`; they are loaded by their own names. */
typedef enum { IR_BUF_INPUT, IR_BUF_WEIGHT, IR_BUF_OUTPUT, IR_BUF_TEMP, IR_BUF_STATE, IR_BUF_BLOCK } ir_buf_kind;

typedef struct {
    ir_buf_kind kind;
    kiln_type   type;
    int64_t     ne[4];  /* natural (contiguous) shape; a symbolic dim at its maximum */
    uint8_t     sym[4]; /* symbolic dims (index + 1 into the graph's dims; 0: static) */
    size_t      bytes;
    char        name[FE_MAX_NAME]; /* graph name of the tensor that owns it */
    size_t      offset; /* TEMP: byte offset in the arena, set by ir_memplan; WEIGHT in a block:
                           byte offset in the block */
    int         block;  /* WEIGHT: index + 1 of the IR_BUF_BLOCK holding it (0: memory of its own) */
    int         first, last; /* TEMP: first and last node using it, set by ir_memplan */
} ir_buf;

/* A strided view of a buffer. Strides and offset count elements of `type`. */
typedef struct {
    int       buf;
    kiln_type type;
    int64_t   ne[4];  /* a symbolic dim's extent is its maximum ... */
    int64_t   st[4];
    int64_t   offs;
    uint8_t   sym[4]; /* ... and sym[d] names it (index + 1 into the graph's dims; 0: static).
                         Kernels iterate such a dim up to its run-time value only. */
} ir_ref;

/* One step of an elementwise kernel. Registers 0..nin-1 hold the kernel's loaded inputs (in[i]
 * read at the output coordinate, broadcast by modulo); register nin+k holds instruction k's
 * result. Binary ops read a and b; unary ops read a; SCALE uses f[0], f[1]; CONT is identity.
 * The last instruction's result is stored to dst. All arithmetic is f32, and each result is
 * rounded to `type` (a no-op for f32): the type the graph stored that value in, so a fused
 * kernel computes exactly what the unfused graph computes. */
typedef struct {
    fe_op     op;
    int       a, b;
    float     f[2];
    kiln_type type;
} ir_instr;

/* Fused IR_OP nodes whose computation is more than an op plus an elementwise epilogue. */
typedef enum {
    IR_FUSED_NONE,
    /* topk_moe (ir/fuse_topk_moe.c): MoE routing of one token row in one kernel. The node's op
     * is argsort_top_k (slot 0 = the logits); dst = the selected experts' weights, dst2 = their
     * ids (i32 [k, rows]). Template family "moe", reference ir/ref_moe.c. */
    IR_FUSED_TOPK_MOE,
    /* rope_set_rows (ir/fuse_rope_set_rows.c): the node's op is rope_ext over its own slots;
     * its result (of op_type, contiguous, shape of slot 0) is not stored but scattered: dst is
     * set_rows(in[scatter.a_in], rope result viewed as rows of scatter.b_ne, in[scatter.ids_in]). */
    IR_FUSED_ROPE_SET_ROWS,
} ir_fused;

/* Gating of topk_moe: what turns a logit into the probability that is selected and weighted. */
typedef enum { IR_GATE_SOFTMAX, IR_GATE_SIGMOID } ir_gate;

typedef struct {
    ir_gate gating;
    bool    delayed;   /* top-k of the raw logits, then softmax over the k selected (no gating) */
    int     k;         /* experts selected per row */
    int     bias_in;   /* operand of a selection bias added to the probabilities (selection only), or -1 */
    bool    norm;      /* weights divided by their sum ... */
    bool    clamp;     /* ... clamped first to [clamp_lo, clamp_hi] */
    float   clamp_lo, clamp_hi;
    bool    scaled;    /* weights multiplied by scale (ggml_scale) */
    float   scale;
} ir_moe;

typedef struct {
    int     a_in, ids_in; /* operands: the tensor whose rows are replaced, the row ids */
    int64_t b_ne[4];      /* the rope result's shape as set_rows reads it (rows of b_ne[0]) */
} ir_scatter;

/* IR_EW: an elementwise kernel (instructions over operands read at the output coordinate).
 * IR_OP: one graph op of kind FE_KERNEL, instantiated from the template of its family
 * (fe_fams[fe_ops[op].fam].name) and evaluated by the reference of that family (ir_ref_of). */
typedef enum { IR_EW, IR_OP } ir_kind;

typedef struct {
    ir_kind  kind;
    bool     dead;  /* removed by a pass; skipped everywhere */
    ir_ref   dst;   /* dst.ne is the kernel's index space */
    int      nin;
    ir_ref   in[IR_MAX_IN];
    int      ninstr;
    ir_instr ins[IR_MAX_INSTR];
    /* IR_OP only: the op, its parameters as the graph tensor holds them (signature order), and
     * for each tensor parameter slot the index of its operand in in[], or -1 when absent. */
    fe_op    op;
    int32_t  ip[FE_MAX_IP];
    float    fp[FE_MAX_FP];
    int      opd[FE_MAX_SRC];
    /* IR_OP only: an optional elementwise epilogue, ins[0..ninstr) (fusion passes attach the
     * elementwise kernel that consumed the op's result). At each output coordinate register
     * nin holds the op's value rounded to op_type (the type the unfused graph stored it in),
     * registers 0..nin-1 the operands read at that coordinate (meaningful for the epilogue's
     * own operands, those in no slot of opd, which broadcast onto dst like IR_EW inputs), and
     * register nin+1+k instruction k's result; the last one is stored to dst. */
    kiln_type op_type;
    /* IR_OP only, mul_mat_glu: the op runs a second time with operand in[pair_in] in place of
     * tensor slot 0 (the weight); that value is epilogue register nin+1 (rounded to op_type)
     * and the instructions' registers start at nin+2. */
    bool     paired;
    int      pair_in;
    /* IR_OP mul_mat only, rms_norm_gemv: b is normalized on the way in, as the rms_norm_mul
     * node this replaced computed it: b' = rms_norm(b, bnorm_eps) * in[bnorm_w] (one column;
     * ir/fuse_rms_norm_gemv.c). in[bnorm_w] is in no slot and no epilogue register reads it. */
    bool     bnorm;
    int      bnorm_w;
    float    bnorm_eps;
    /* IR_OP mul_mat_id only, passes mul_mat_glu and mul_mat_id_bias: epilogue operand k (bit k)
     * is read through the node's ids, as ggml's add_id reads its bias: at output coordinate
     * (i0, i1, i2) the element (i0, ids[i1, i2]) of a [ne0, experts] operand (0 for an id out of
     * range, whose rows mul_mat_id leaves at zero). gpt-oss's per-expert biases. */
    uint32_t by_id;
    /* IR_OP only: a fusion that changes what the node computes beyond an epilogue. */
    ir_fused fused;
    ir_moe   moe;              /* IR_FUSED_TOPK_MOE */
    ir_scatter scatter;        /* IR_FUSED_ROPE_SET_ROWS */
    bool     has_dst2;         /* a second output (topk_moe: the selected expert ids) */
    ir_ref   dst2;
    /* Index + 1 of the earlier node (with only other tails of it between) whose kernel also
     * computes this node; 0: a kernel of its own. Pass gemv_rope: the host is a one-column
     * mul_mat whose store computes the tail, which reads the host's result (not stored) and
     * inputs, weights or its own state in place. Pass head_rope: the host is the first of a run
     * of per-head norms, ropes and cache rows (templates/heads.lua). The IR, memory plan aside
     * (the group is one step), treats a tail as a node like any other. */
    int      host;
    int      nsrc;             /* graph nodes this kernel implements (tensor ids), in order */
    int      src[IR_MAX_INSTR];
    const char *fusion;        /* NULL, or the name of the pass that fused it */
} ir_node;

typedef struct ir_prog {
    const kiln_graph *g;
    ir_buf  *bufs;
    int      nbufs, capbufs;
    ir_node *nodes;
    int      nnodes, capnodes;
    size_t   arena_bytes; /* set by ir_memplan */
    char    *pool; /* an IR read from a plan (codegen/plan_ir.c): its nodes' fusion names */
} ir_prog;

kiln_status ir_lower(const kiln_graph *g, ir_prog **out);
void        ir_prog_free(ir_prog *p);
/* Checks the invariants every pass must keep (operands in range, buffers written before read,
 * layouts inside their buffers). Run after every pass in tests. */
kiln_status ir_verify(const ir_prog *p);

/* Passes, in pipeline order (see ir_run_passes). */
kiln_status ir_fuse_get_rows_one(ir_prog *p);  /* ir/fuse_get_rows_one.c */
kiln_status ir_fuse_rope_set_rows(ir_prog *p); /* ir/fuse_rope_set_rows.c */
kiln_status ir_fuse_topk_moe(ir_prog *p);      /* ir/fuse_topk_moe.c */
kiln_status ir_fuse_mul_mat_glu(ir_prog *p);   /* ir/fuse_mul_mat_glu.c */
kiln_status ir_fuse_mul_mat_id_bias(ir_prog *p); /* ir/fuse_mul_mat_id_bias.c */
kiln_status ir_fuse_rms_norm_mul(ir_prog *p);  /* ir/fuse_rms_norm_mul.c */
kiln_status ir_fuse_add_chain(ir_prog *p);     /* ir/fuse_add_chain.c */
kiln_status ir_fuse_mul_mat_cat(ir_prog *p);   /* ir/fuse_mul_mat_cat.c */
kiln_status ir_fuse_rms_norm_gemv(ir_prog *p); /* ir/fuse_rms_norm_gemv.c */
kiln_status ir_fuse_elementwise(ir_prog *p);   /* ir/fuse_elementwise.c */
kiln_status ir_fuse_gemv_rope(ir_prog *p);     /* ir/fuse_gemv_rope.c */
kiln_status ir_fuse_head_rope(ir_prog *p);     /* ir/fuse_head_rope.c */
kiln_status ir_memplan(ir_prog *p);          /* ir/memplan.c */
/* The fusion passes, in pipeline order, by the names users give --no-fuse=NAME. */
typedef struct {
    const char *name;
    kiln_status (*run)(ir_prog *p);
    const char *what; /* one line for --help and errors */
} ir_fusion;
extern const ir_fusion ir_fusions[];
extern const int       ir_nfusions;
/* Runs the pipeline: every fusion pass unless !fuse or its name is in `skip` (comma-separated
 * pass names, NULL for none; an unknown name is an error listing the valid ones), then memplan. */
kiln_status ir_run_passes(ir_prog *p, bool fuse, const char *skip);
/* NULL when every comma-separated name in list is a fusion pass; else an error naming the
 * unknown one and listing the passes. */
kiln_status ir_check_fusion_list(const char *list);

/* Deterministic text: nodes, layouts, fusions, memory plan. */
void ir_print(const ir_prog *p, kb_str *out);
/* Name of graph tensor `id` for messages and dumps. */
const char *ir_node_name(const ir_prog *p, int tensor_id);

/* CPU evaluation of p's live nodes. data[i] is host memory for buffer i (bufs[i].bytes each),
 * inputs and weights filled in by the caller; temporaries and outputs are written, and weight
 * blocks assembled from their members. */
kiln_status ir_eval(const ir_prog *p, void **data);
/* Scalar semantics of one elementwise op in f32 (also the reference of the generated code). */
float ir_apply(const ir_instr *in, float a, float b);

/* The CPU reference of IR_OP nodes, one function per op family (ir/ref_<family name>.c),
 * dispatched on fe_ops[n->op].fam. Each reads n's operands from data[n->in[k].buf] through their
 * layouts and writes n->dst; it may assume the node passed ir_verify and the frontend's shape
 * rules. */
typedef kiln_status (*ir_ref_fn)(const ir_prog *p, const ir_node *n, void **data);
/* The reference of fam's IR_OP nodes (ir/eval.c); NULL for the families that make none (leaves
 * and views; elementwise ops, which are IR_EW nodes evaluated through ir_apply). */
ir_ref_fn   ir_ref_of(fe_fam fam);
kiln_status ir_ref_rows(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_norm(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_softmax(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_rope(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_reduce(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_sort(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_fill(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_matmul(const ir_prog *p, const ir_node *n, void **data); /* mul_mat, mul_mat_id */
kiln_status ir_ref_attn(const ir_prog *p, const ir_node *n, void **data);
kiln_status ir_ref_sample(const ir_prog *p, const ir_node *n, void **data); /* kiln_sample's code */
kiln_status ir_ref_collective(const ir_prog *p, const ir_node *n, void **data); /* all_reduce: a group's */
kiln_status ir_ref_moe(const ir_prog *p, const ir_node *n, void **data); /* IR_FUSED_TOPK_MOE */
/* Whether a buffer of this kind holds its value before the program runs and no node writes it. */
static inline bool ir_buf_preset(ir_buf_kind k) {
    return k == IR_BUF_INPUT || k == IR_BUF_WEIGHT || k == IR_BUF_BLOCK;
}
/* Whether reference r has no symbolic dim (its extents are those it was compiled with). */
static inline bool ir_ref_static(const ir_ref *r) { return !(r->sym[0] | r->sym[1] | r->sym[2] | r->sym[3]); }

/* Number of op values an IR_OP epilogue sees (registers nin..nin+n-1): 2 when paired, else 1. */
static inline int ir_op_values(const ir_node *n) { return n->paired ? 2 : 1; }

/* The first tail of host node h after node `after` (pass gemv_rope: a host's tails follow it,
 * only dead nodes between), or -1. All of them:
 *   for (int j = ir_next_tail(p, h, h); j >= 0; j = ir_next_tail(p, h, j)) */
int ir_next_tail(const ir_prog *p, int h, int after);
/* Whether node i launches a kernel of its own: live and not computed by a host (pass gemv_rope). */
static inline bool ir_launches(const ir_prog *p, int i) { return !p->nodes[i].dead && !p->nodes[i].host; }

/* Element offset of r at coordinates c (each taken modulo r's extent: broadcasting). */
int64_t ir_offset_at(const ir_ref *r, const int64_t c[4]);
/* The operand of tensor slot `slot` of an IR_OP node, or NULL when absent. */
const ir_ref *ir_operand(const ir_node *n, int slot);

#endif
