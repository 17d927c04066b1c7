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

#endif
