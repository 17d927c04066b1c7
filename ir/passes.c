/* The pass pipeline, top to bottom. The verifier runs after every pass: it is cheap next to
 * code generation, and a broken invariant caught here names the pass that broke it. */
#include "ir_internal.h"

static kiln_status run(ir_prog *p, const char *name, kiln_status (*pass)(ir_prog *)) {
    kiln_status st = pass(p);
    if (!st) st = ir_verify(p);
    return st ? kb_wrap(st, "pass %s", name) : NULL;
}

kiln_status ir_run_passes(ir_prog *p, bool fuse) {
    kiln_status st = ir_verify(p);
    if (st) return kb_wrap(st, "lowering");
    if (fuse && (st = run(p, "ew_chain", ir_fuse_elementwise))) return st;
    return run(p, "memplan", ir_memplan);
}
