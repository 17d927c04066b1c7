/* The host copies of a graph's states (its KV caches) that the CPU reference's runs read and
 * write: one sequence's (model/gen.c), a tensor-parallel rank's (gen_tp.c), a pipeline stage's
 * (gen_pp.c). Zeroed at first, as a session's states are. */
#include "base/base.h"
#include "model/arch.h"

#include <stdlib.h>
#include <string.h>

kiln_status km_host_states(const kiln_graph *gr, km_host_state **out, int *n) {
    int count = 0;
    *n = 0;
    for (int i = 0; i < kiln_graph_size(gr); i++) count += kiln_tensor_role(kiln_graph_node(gr, i)) == KILN_ROLE_STATE;
    if (!(*out = calloc((size_t)count + 1, sizeof **out))) return kb_oom();
    for (int i = 0; i < kiln_graph_size(gr); i++) {
        const kiln_tensor *t = kiln_graph_node(gr, i);
        if (kiln_tensor_role(t) != KILN_ROLE_STATE) continue;
        km_host_state *s = &(*out)[(*n)++];
        s->name = kiln_tensor_name(t);
        s->bytes = (size_t)kiln_tensor_nelements(t) * kiln_type_size(kiln_tensor_type(t));
        if (!(s->data = calloc(1, s->bytes))) return kb_oom();
    }
    return NULL;
}

void km_host_states_free(km_host_state *s, int n) {
    for (int i = 0; s && i < n; i++) free(s[i].data);
    free(s);
}

bool km_host_state_io(km_host_state *s, int n, const char *name, void *data, size_t bytes, bool write) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].name, name) && s[i].bytes == bytes) {
            if (write) memcpy(s[i].data, data, bytes);
            else memcpy(data, s[i].data, bytes);
            return true;
        }
    return false;
}
