/* What the runners of a model's graph share: the host copies of its states (its KV caches),
 * which the CPU reference's runs read and write (zeroed at first, as a session's states are), a
 * reference run at the run's dims, and a run's position, cache-slot, mask and output-row inputs
 * (km_tp_run) for the reference or a session. For one sequence (model/gen.c), a tensor-parallel
 * rank (gen_tp.c), a pipeline stage (gen_pp.c). */
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

kiln_status km_ref_run(const kiln_ctx *ctx, int64_t nt, int64_t nkv, kiln_ref_get_fn get, kiln_ref_put_fn put,
                       void *user) {
    static const char *const names[2] = {"n_tokens", "n_kv"};
    const int64_t            values[2] = {nt, nkv};
    kiln_ctx                *bound = NULL;
    kiln_graph              *gr = NULL;
    kiln_status              st = kiln_ctx_bind(ctx, 2, names, values, &bound);
    if (!st) st = kiln_graph_new(bound, &gr);
    if (!st) st = kiln_reference(gr, get, put, user);
    kiln_graph_free(gr);
    kiln_ctx_free(bound);
    return st;
}

const void *km_run_input(const km_tp_run *in, bool intervals, const char *name) {
    if (!strcmp(name, "inp_pos")) return in->positions;
    if (!strcmp(name, "kv_idxs")) return in->slots;
    if (!strcmp(name, "kq_mask")) return intervals ? (const void *)in->iv : in->mask;
    if (!strcmp(name, "kq_mask_swa")) return intervals ? (const void *)in->iv_swa : in->mask_swa;
    if (!strcmp(name, "inp_out_ids")) return in->out_ids;
    return NULL;
}

kiln_status km_run_set_inputs(kiln_session *s, const km_tp_run *in, bool intervals, bool out_ids) {
    size_t      nt = (size_t)in->nt, mask = (size_t)(in->nt * in->nkv);
    kiln_status st = kiln_session_set_dim(s, "n_tokens", in->nt);
    if (!st) st = kiln_session_set_dim(s, "n_kv", in->nkv);
    if (!st) st = kiln_session_set(s, "inp_pos", in->positions, sizeof(int32_t) * nt);
    if (!st) st = kiln_session_set(s, "kv_idxs", in->slots, sizeof(int64_t) * nt);
    if (intervals) {
        if (!st) st = kiln_session_set(s, "kq_mask", in->iv, sizeof(int32_t) * 2 * nt);
        if (!st && in->iv_swa) st = kiln_session_set(s, "kq_mask_swa", in->iv_swa, sizeof(int32_t) * 2 * nt);
    } else {
        if (!st) st = kiln_session_set(s, "kq_mask", in->mask, sizeof(uint16_t) * mask);
        if (!st && in->mask_swa) st = kiln_session_set(s, "kq_mask_swa", in->mask_swa, sizeof(uint16_t) * mask);
    }
    if (!st && out_ids) st = kiln_session_set(s, "inp_out_ids", in->out_ids, sizeof(int32_t) * (size_t)in->n_out);
    return st;
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
