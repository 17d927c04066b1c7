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
/* Index of the live node writing buf, or -1. */
int      ir_node_writing(const ir_prog *p, int buf);

#endif
