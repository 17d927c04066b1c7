/* CPU reference of the sort family: argsort, argsort_top_k, top_k. */
#include "ir_internal.h"

kiln_status ir_ref_sort(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    (void)data;
    return kb_error(KILN_ERR_INVALID, "reference: %s is not implemented yet", fe_ops[n->op].name);
}
