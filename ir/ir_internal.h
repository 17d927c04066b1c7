/* Helpers shared inside ir/. */
#ifndef KILN_IR_INTERNAL_H
#define KILN_IR_INTERNAL_H

#include "ir.h"

int      ir_add_buf(ir_prog *p, ir_buf_kind kind, kiln_type type, const int64_t ne[4], const char *name);
ir_node *ir_add_node(ir_prog *p); /* zeroed; pointer valid until the next add */
/* The contiguous full-buffer layout of buf. */
ir_ref   ir_natural_ref(const ir_prog *p, int buf);
/* Same elements in the same places (strides of size-1 dims do not matter). */
bool     ir_ref_equal(const ir_ref *a, const ir_ref *b);
bool     ir_ref_is_natural(const ir_prog *p, const ir_ref *r);
/* A live IR_OP node computing just its op: no epilogue, pairing, normalized b, fusion or second
 * output yet (what the matmul fusions start from). */
bool     ir_plain_op(const ir_node *n);
/* Puts n's graph nodes (src) in graph order, after a fusion merged several nodes' lists. */
void     ir_sort_sources(ir_node *n);
/* Index of the live node writing buf, or -1. */
int      ir_node_writing(const ir_prog *p, int buf);

/* States written in place by set_rows: nothing may read their old value (ir/state.c). */
kiln_status ir_check_states(const kiln_graph *g);

/* Operands of live nodes that read buf (a node reading it twice counts twice). */
int      ir_readers(const ir_prog *p, int buf);
/* The first live node after node `after` (-1: from the start) with an operand reading buf, or -1. */
int      ir_reader_after(const ir_prog *p, int buf, int after);
/* Whether every buffer node i reads is an input, a weight, or written by a live node before
 * node `before` (so node i's reads could move up to position `before`). */
bool     ir_operands_ready(const ir_prog *p, const ir_node *n, int before);
/* Whether a node at position `at` may read buffer buf: an input or weight, a state no node
 * writes, or written by an earlier node. */
bool     ir_buf_ready_at(const ir_prog *p, int buf, int at);
/* Whether operand k of n is in one of its tensor slots (else an epilogue's or a fusion's own). */
bool     ir_in_slot(const ir_node *n, int k);
/* Makes elementwise node ci the epilogue of IR_OP node oi (ir/absorb.c); oi may already carry
 * one. An operand of c reading buffer vals[v] (v < nvals; at most 2, and 2 only when oi is
 * paired with vals[1] its second value) becomes op value v: register nin + v, or, when oi
 * already has an epilogue, that epilogue's result (v = 0 only). c's other operands are added to
 * oi's. The merged node takes c's destination, c's graph nodes and the name `fusion`, and c
 * dies. Nothing changes and false is returned unless it is legal: each vals[v] is a temporary
 * read only by c, naturally and over exactly oi's output space; oi writes vals[0] naturally;
 * c's other operands are ready at oi; the limits on operands, instructions and nodes hold. */
/* Fuses the elementwise producer of elementwise node ci's operand k into ci when legal (the
 * rules of pass ew_chain, ir/fuse_elementwise.c), naming the result `fusion`. */
bool     ir_ew_fuse_producer(ir_prog *p, int ci, int k, const char *fusion);
bool     ir_absorb_ew(ir_prog *p, int oi, int ci, const int *vals, int nvals, const char *fusion);

/* Tails of a one-token q/k/v product (ir/tails.c; passes gemv_rope and head_rope). */
/* One element of an input, weight or state read in no special way: positions and ids. */
bool     ir_tail_one_preset(const ir_prog *p, const ir_ref *r);
/* r reads rows [*lo, *hi) of its f32 buffer as contiguous rows of one token ([ne0, heads, 1, 1],
 * static), at even offsets. */
bool     ir_tail_rows(const ir_ref *r, int64_t *lo, int64_t *hi);
/* The operand through which node c reads its rows if c can be a tail, else -1: a plain rope of
 * every element (mode 0 or neox, one static position, natural f32 frequency factors or none)
 * into an f32 dst, the same rope fused into a state's row in place (rope_set_rows), or a
 * set_rows of one row into a state in place; no epilogue or other fusion, not yet a tail. */
int      ir_tail_operand(const ir_prog *p, const ir_node *c);
/* Whether node n reads or writes buffer b (any operand, either output). */
bool     ir_touches(const ir_node *n, int b);
/* Node x may run after node t instead of before it: neither writes what the other reads or
 * writes (buffers are whole, distinct memory before the memory plan). */
bool     ir_commutes(const ir_node *x, const ir_node *t);
/* Moves nodes [lo, hi] so that nodes first[0..nfirst) (ascending, inside) come first, in order,
 * then the other live nodes, then the dead ones. The caller checked that the live nodes it
 * moves later commute with every node of first[] after them. */
kiln_status ir_gather(ir_prog *p, int lo, int hi, const int *first, int nfirst);

#endif
