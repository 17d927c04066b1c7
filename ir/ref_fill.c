/* CPU reference of the fill family: arange, fill, diag_mask_inf, tri. */
#include "ir_internal.h"

kiln_status ir_ref_fill(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    (void)data;
    return kb_error(KILN_ERR_INVALID, "reference: %s is not implemented yet", fe_ops[n->op].name);
}
