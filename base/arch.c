/* GPU architecture names and which code runs where. One rule for the runtime (may this
 * program load?) and for bundles (which of its targets fits this GPU?). */
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

bool kb_arch_parse(const char *a, kb_arch *out) {
    if (!a) return false;
    kb_arch r = {0};
    if (strncmp(a, "sm_", 3) == 0) a += 3;
    else if (strncmp(a, "compute_", 8) == 0) a += 8, r.ptx = true;
    else return false;
    int nd = 0;
    while (a[nd] >= '0' && a[nd] <= '9') nd++;
    if (nd < 2 || nd > 3) return false;
    int v = atoi(a);
    r.major = v / 10;
    r.minor = v % 10;
    r.suffix = a[nd];
    if (r.suffix && (a[nd + 1] || (r.suffix != 'a' && r.suffix != 'f'))) return false;
    *out = r;
    return true;
}

/* Cubins run on their major version only: arch-specific ones ("a") on exactly their compute
 * capability, plain and family ("f") ones on any minor at least theirs. PTX is compiled by the
 * driver for any later GPU, except arch-specific PTX, which fits only its own. */
bool kb_arch_fits(const kb_arch *code, int cc_major, int cc_minor) {
    int want = code->major * 10 + code->minor, have = cc_major * 10 + cc_minor;
    if (code->suffix == 'a') return want == have;
    if (code->ptx) return want <= have;
    return code->major == cc_major && code->minor <= cc_minor;
}
