/* The CPU reference of topk_moe (IR_FUSED_TOPK_MOE). In progress: see issue 5. */
#include "ir_internal.h"

kiln_status ir_ref_moe(const ir_prog *p, const ir_node *n, void **data) {
    (void)p, (void)n, (void)data;
    return kb_error(KILN_ERR_INVALID, "reference: topk_moe is not implemented yet");
}
