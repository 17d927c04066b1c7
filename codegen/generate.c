/* Kernel instantiation: an IR node becomes a Lua table (docs/templates.md), its template turns
 * that into CUDA source and a launch configuration, and the result is checked and copied into a
 * cg_kernel.
 *
 * The table holds only what the code depends on — types, shapes, strides, offsets, parameter
 * slots, instructions — never buffer ids or graph names, so identical nodes over different
 * buffers give byte-identical sources (one cache entry). */
#include "codegen/codegen.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#define CG_MAX_SMEM (227u * 1024u)

/* The template module of a node: the elementwise family's, a fusion's own (topk_moe: moe), or
 * that of its op's family (templates/NAME.lua, NAME from FE_FAMS). */
static const char *template_of(const ir_prog *p, int node) {
    const ir_node *n = &p->nodes[node];
    switch (n->kind) {
    case IR_EW: return fe_fams[FE_FAM_EW].name;
    case IR_OP:
        if (n->fused == IR_FUSED_TOPK_MOE) return "moe";
        /* the first of a head_rope run: one kernel for the run (a GEMV computes its own tails) */
        if (n->op != FE_OP_MUL_MAT && ir_next_tail(p, node, node) >= 0) return "heads";
        if ((unsigned)n->op >= FE_OP_COUNT || fe_ops[n->op].kind != FE_KERNEL) return NULL;
        return fe_fams[fe_ops[n->op].fam].name;
    }
    return NULL;
}

/* A float as an exact CUDA f32 literal: the shortest decimal text that reads back the same. */
static void float_literal(float v, char out[48]) {
    if (isnan(v)) {
        strcpy(out, "__int_as_float(0x7fc00000)");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)");
        return;
    }
    char buf[40];
    kb_format_float(v, buf);
    /* The decimal separator is locale-dependent: normalize it. */
    bool point = false;
    for (char *s = buf; *s; s++) {
        if (*s == 'e') point = true;
        else if (!isdigit((unsigned char)*s) && *s != '-' && *s != '+') {
            *s = '.';
            point = true;
        }
    }
    snprintf(out, 48, "%s%sf", buf, point ? "" : ".0");
}

typedef struct gen_ctx gen_ctx;
struct gen_ctx {
    const ir_prog *p;
    const ir_node *n;
    const char    *tpl;
    int            nparams;
    int            params[IR_MAX_IN + 2];
    int            dst_param, dst2_param, in_param[IR_MAX_IN];
    int            node;
    cg_kernel     *steps; /* CG_MAX_STEPS of them */
    int            nsteps;
    bool           uses[KILN_MAX_SYMS + 1]; /* symbolic dims the node's refs have (by index + 1) */
    bool           dynamic;
    gen_ctx       *tails; /* pass gemv_rope: the nodes this one's store computes (k.tail) */
    int            ntails;
    bool           overflow; /* more distinct buffers than params holds */
};

/* The graph's context, whose dims the syms index (NULL for hand-built test programs). */
static const kiln_ctx *dims_ctx(const gen_ctx *g) { return g->p->g ? g->p->g->ctx : NULL; }

static const char *sym_name(const gen_ctx *g, int s) {
    const kiln_ctx *ctx = dims_ctx(g);
    return ctx && s > 0 && s <= ctx->ndims ? ctx->dims[s - 1].name : "?";
}

/* k.dims = { {name =, max =, slot =}, ... } for the symbolic dims the node uses, and k.dims_arg,
 * the parameter declaration its kernels end with (empty when there are none). */
static void push_dims(lua_State *L, const gen_ctx *g) {
    const kiln_ctx *ctx = dims_ctx(g);
    lua_createtable(L, 0, 0);
    int n = 0;
    for (int s = 1; ctx && s <= ctx->ndims; s++) {
        if (!g->uses[s]) continue;
        lua_createtable(L, 0, 3);
        lua_pushstring(L, ctx->dims[s - 1].name);
        lua_setfield(L, -2, "name");
        lua_pushinteger(L, (lua_Integer)ctx->dims[s - 1].max);
        lua_setfield(L, -2, "max");
        lua_pushinteger(L, s - 1);
        lua_setfield(L, -2, "slot");
        lua_rawseti(L, -2, ++n);
    }
    lua_setfield(L, -2, "dims");
    lua_pushstring(L, g->dynamic ? ", const int* __restrict__ kdims" : "");
    lua_setfield(L, -2, "dims_arg");
}

static void set_int_array(lua_State *L, const int64_t *v, int n, const char *field) {
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, (lua_Integer)v[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, field);
}


/* A ref: type, ne (symbolic dims at their maximum), st, offs, param, and dyn/sym: for each
 * symbolic dim d, dyn[d+1] is the C expression of its run-time extent ("kdims[SLOT]") and
 * sym[d+1] its name (docs/templates.md, "Symbolic dims"). */
static void push_ref(lua_State *L, const gen_ctx *g, const ir_ref *r, int param) {
    lua_createtable(L, 0, 7);
    lua_createtable(L, 0, 0);
    lua_createtable(L, 0, 0);
    for (int d = 0; d < 4; d++) {
        if (!r->sym[d]) continue;
        lua_pushfstring(L, "kdims[%d]", (int)r->sym[d] - 1);
        lua_rawseti(L, -3, d + 1);
        lua_pushstring(L, sym_name(g, r->sym[d]));
        lua_rawseti(L, -2, d + 1);
    }
    lua_setfield(L, -3, "sym");
    lua_setfield(L, -2, "dyn");
    lua_pushstring(L, kiln_type_name(r->type));
    lua_setfield(L, -2, "type");
    set_int_array(L, r->ne, 4, "ne");
    set_int_array(L, r->st, 4, "st");
    lua_pushinteger(L, (lua_Integer)r->offs);
    lua_setfield(L, -2, "offs");
    lua_pushinteger(L, param);
    lua_setfield(L, -2, "param");
    /* A quantized operand's kernels locate the scales of the tiled layout's last tile
     * (templates/quant.lua): they need the buffer's size. */
    if (kiln_type_is_quantized(r->type) && param >= 0 && param < g->nparams) {
        lua_pushinteger(L, (lua_Integer)g->p->bufs[g->params[param]].bytes);
        lua_setfield(L, -2, "bytes");
    }
}

/* n's instructions as the table k.instrs (IR_EW) or k.epilogue.instrs (IR_OP) of the table on
 * top of the stack. */
static void push_instrs(lua_State *L, const ir_node *n) {
    lua_createtable(L, n->ninstr, 0);
    for (int i = 0; i < n->ninstr; i++) {
        const ir_instr *in = &n->ins[i];
        lua_createtable(L, 0, 5);
        lua_pushstring(L, fe_ops[in->op].name);
        lua_setfield(L, -2, "op");
        lua_pushinteger(L, in->a);
        lua_setfield(L, -2, "a");
        if (fe_ops[in->op].nsrc > 1) {
            lua_pushinteger(L, in->b);
            lua_setfield(L, -2, "b");
        }
        lua_createtable(L, 2, 0);
        for (int j = 0; j < 2; j++) {
            char lit[48];
            float_literal(in->f[j], lit);
            lua_pushstring(L, lit);
            lua_rawseti(L, -2, j + 1);
        }
        lua_setfield(L, -2, "f");
        lua_pushstring(L, kiln_type_name(in->type));
        lua_setfield(L, -2, "type");
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "instrs");
}

static void set_float(lua_State *L, float v, const char *field) {
    char lit[48];
    float_literal(v, lit);
    lua_pushstring(L, lit);
    lua_setfield(L, -2, field);
}

static void set_bool(lua_State *L, bool v, const char *field) {
    lua_pushboolean(L, v);
    lua_setfield(L, -2, field);
}

/* What paired and fused nodes add to k (docs/templates.md, "Fused nodes"): k.pair (the second
 * weight), k.dst2 (a second output), k.bnorm (b's norm: w, eps), k.fused (the fusion's name) and
 * k.moe or k.set_rows. */
static void push_fused(lua_State *L, const gen_ctx *g) {
    const ir_node *n = g->n;
    if (n->paired) {
        push_ref(L, g, &n->in[n->pair_in], g->in_param[n->pair_in]);
        lua_setfield(L, -2, "pair");
    }
    if (n->has_dst2) {
        push_ref(L, g, &n->dst2, g->dst2_param);
        lua_setfield(L, -2, "dst2");
    }
    if (n->bnorm) {
        lua_createtable(L, 0, 2);
        push_ref(L, g, &n->in[n->bnorm_w], g->in_param[n->bnorm_w]);
        lua_setfield(L, -2, "w");
        set_float(L, n->bnorm_eps, "eps");
        lua_setfield(L, -2, "bnorm");
    }
    if (n->fused == IR_FUSED_TOPK_MOE) {
        const ir_moe *m = &n->moe;
        lua_pushliteral(L, "topk_moe");
        lua_setfield(L, -2, "fused");
        lua_createtable(L, 0, 12);
        lua_pushinteger(L, m->k);
        lua_setfield(L, -2, "k");
        lua_pushstring(L, m->gating == IR_GATE_SIGMOID ? "sigmoid" : "softmax");
        lua_setfield(L, -2, "gating");
        set_bool(L, m->delayed, "delayed");
        if (m->bias_in >= 0) {
            push_ref(L, g, &n->in[m->bias_in], g->in_param[m->bias_in]);
            lua_setfield(L, -2, "bias");
        }
        set_bool(L, m->norm, "norm");
        set_bool(L, m->clamp, "clamp");
        set_float(L, m->clamp_lo, "clamp_lo");
        set_float(L, m->clamp_hi, "clamp_hi");
        set_bool(L, m->scaled, "scaled");
        set_float(L, m->scale, "scale");
        lua_pushstring(L, kiln_type_name(n->op_type));
        lua_setfield(L, -2, "type");
        lua_setfield(L, -2, "moe");
    }
    if (n->fused == IR_FUSED_ROPE_SET_ROWS) {
        lua_pushliteral(L, "rope_set_rows");
        lua_setfield(L, -2, "fused");
        lua_createtable(L, 0, 4);
        push_ref(L, g, &n->in[n->scatter.a_in], g->in_param[n->scatter.a_in]);
        lua_setfield(L, -2, "a");
        push_ref(L, g, &n->in[n->scatter.ids_in], g->in_param[n->scatter.ids_in]);
        lua_setfield(L, -2, "ids");
        set_int_array(L, n->scatter.b_ne, 4, "b_ne");
        set_bool(L, n->in[n->scatter.a_in].buf == n->dst.buf, "in_place");
        lua_pushstring(L, kiln_type_name(n->op_type));
        lua_setfield(L, -2, "type");
        lua_setfield(L, -2, "set_rows");
    }
}

/* The node's dst and its inputs (k.dst, k.inputs) into the table on top of the stack. */
static void push_dst_inputs(lua_State *L, const gen_ctx *g, const ir_node *n) {
    push_ref(L, g, &n->dst, g->dst_param);
    lua_setfield(L, -2, "dst");
    lua_createtable(L, n->nin, 0);
    for (int i = 0; i < n->nin; i++) {
        push_ref(L, g, &n->in[i], g->in_param[i]);
        if (n->by_id >> i & 1u) { /* read through the ids (ir.h): templates/epilogue.lua */
            lua_pushboolean(L, 1);
            lua_setfield(L, -2, "by_id");
        }
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "inputs");
}

/* IR_OP: k.op, k.args (operand refs by parameter name; absent optional ones are nil), k.inputs
 * (all operands in order), k.params (scalars by name: floats as exact CUDA literals, ints as
 * integers, bools as booleans, types and enum values as names, I4 as a table of 4) and
 * k.values (floats as Lua numbers, for arithmetic at generation time). */
static void push_node(lua_State *L, const gen_ctx *g); /* (a tail may be elementwise: pass head_rope) */

static void push_op_node(lua_State *L, const gen_ctx *g) {
    const ir_node *n = g->n;
    const fe_sig  *sig = fe_op_sig(n->op);
    lua_createtable(L, 0, 8);
    lua_pushliteral(L, "op");
    lua_setfield(L, -2, "kind");
    lua_pushstring(L, fe_ops[n->op].name);
    lua_setfield(L, -2, "op");
    push_dst_inputs(L, g, n);
    lua_createtable(L, 0, sig->ntensor);
    for (int i = 0; i < sig->n; i++) {
        const fe_param *q = &sig->p[i];
        if (q->kind != FE_P_TENSOR || n->opd[q->slot] < 0) continue;
        push_ref(L, g, &n->in[n->opd[q->slot]], g->in_param[n->opd[q->slot]]);
        lua_setfield(L, -2, q->name);
    }
    lua_setfield(L, -2, "args");
    lua_createtable(L, 0, sig->n);
    lua_createtable(L, 0, sig->nfloat);
    int params = lua_gettop(L) - 1, values = lua_gettop(L);
    for (int i = 0; i < sig->n; i++) {
        const fe_param *q = &sig->p[i];
        char lit[48];
        int32_t v = q->slot < FE_MAX_IP ? n->ip[q->slot] : 0;
        switch (q->kind) {
        case FE_P_TENSOR:
        case FE_P_LIST: continue;
        case FE_P_FLOAT:
            float_literal(n->fp[q->slot], lit);
            lua_pushstring(L, lit);
            lua_pushnumber(L, (lua_Number)n->fp[q->slot]);
            lua_setfield(L, values, q->name);
            break;
        case FE_P_BOOL: lua_pushboolean(L, v != 0); break;
        case FE_P_TYPE: lua_pushstring(L, kiln_type_name((kiln_type)v)); break;
        case FE_P_ENUM:
            if (v >= 0 && v < q->nenum) lua_pushstring(L, q->enums[v]);
            else lua_pushinteger(L, v);
            break;
        case FE_P_INT4:
            lua_createtable(L, 4, 0);
            for (int k = 0; k < 4; k++) {
                lua_pushinteger(L, n->ip[q->slot + k]);
                lua_rawseti(L, -2, k + 1);
            }
            break;
        default: lua_pushinteger(L, v); break;
        }
        lua_setfield(L, params, q->name);
    }
    lua_setfield(L, params - 1, "values");
    lua_setfield(L, -2, "params");
    if (n->ninstr > 0) {
        /* registers: 0..nin-1 operands at the output coordinate, nin the op's value rounded
         * to op_type, nin+1+k instruction k (docs/templates.md, "Epilogues") */
        lua_createtable(L, 0, 2);
        lua_pushstring(L, kiln_type_name(n->op_type));
        lua_setfield(L, -2, "op_type");
        lua_pushinteger(L, ir_op_values(n));
        lua_setfield(L, -2, "values");
        push_instrs(L, n);
        lua_setfield(L, -2, "epilogue");
    }
    push_fused(L, g);
    if (n->op == FE_OP_SET_ROWS && n->opd[0] >= 0) set_bool(L, n->in[n->opd[0]].buf == n->dst.buf, "in_place");
    if (g->ntails > 0) {
        lua_createtable(L, g->ntails, 0);
        for (int t = 0; t < g->ntails; t++) {
            push_node(L, &g->tails[t]);
            lua_rawseti(L, -2, t + 1);
        }
        lua_setfield(L, -2, "tail");
    }
    push_dims(L, g);
    lua_pushinteger(L, g->nparams);
    lua_setfield(L, -2, "nparams");
}

static void push_node(lua_State *L, const gen_ctx *g) {
    const ir_node *n = g->n;
    if (n->kind == IR_OP) {
        push_op_node(L, g);
        return;
    }
    lua_createtable(L, 0, 5);
    lua_pushliteral(L, "ew");
    lua_setfield(L, -2, "kind");
    push_dst_inputs(L, g, n);
    push_instrs(L, n);
    push_dims(L, g);
    lua_pushinteger(L, g->nparams);
    lua_setfield(L, -2, "nparams");
}

static bool is_identifier(const char *s, size_t len) {
    if (len == 0 || len >= sizeof ((cg_kernel *)0)->name) return false;
    if (!(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
    for (size_t i = 1; i < len; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return false;
    return true;
}

/* Reads t[1..3] (the table at index t) as integers in [1, max[i]]. */
static void get_dim3(lua_State *L, int t, const char *field, const unsigned max[3], unsigned out[3]) {
    if (lua_getfield(L, t, field) != LUA_TTABLE)
        luaL_error(L, "result.%s is a %s, not a table {x, y, z}", field, luaL_typename(L, -1));
    if (lua_rawlen(L, -1) != 3) luaL_error(L, "result.%s must have 3 entries", field);
    for (int i = 0; i < 3; i++) {
        lua_rawgeti(L, -1, i + 1);
        int isint;
        lua_Integer v = lua_tointegerx(L, -1, &isint);
        if (!isint || lua_type(L, -1) != LUA_TNUMBER || v < 1 || (lua_Unsigned)v > max[i])
            luaL_error(L, "result.%s[%d] must be an integer in [1, %I]", field, i + 1, (lua_Integer)max[i]);
        out[i] = (unsigned)v;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

#define CG_MAX_STEPS 64
#define CG_MAX_SCRATCH ((lua_Integer)1 << 36)

static lua_Integer get_int(lua_State *L, int t, const char *field, lua_Integer dflt, lua_Integer lo,
                           lua_Integer hi, const char *what) {
    lua_getfield(L, t, field);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        if (dflt < lo) luaL_error(L, "%s.%s is missing", what, field);
        return dflt;
    }
    int isint;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint || lua_type(L, -1) != LUA_TNUMBER || v < lo || v > hi)
        luaL_error(L, "%s.%s must be an integer in [%I, %I]", what, field, lo, hi);
    lua_pop(L, 1);
    return v;
}

static char *copy_string(lua_State *L, const char *s, size_t len) {
    char *c = malloc(len + 1);
    if (!c) luaL_error(L, "out of host memory");
    memcpy(c, s, len + 1);
    return c;
}

/* The kernel's source with the programmatic-dependent-launch instructions in every __global__
 * function (runtime/session.c launches with it on sm_90+): wait until the previous kernel has
 * finished and its writes are visible, then let the next kernel start launching (it will wait
 * in turn). Both go at the top, so that the semantics are those of plain stream order and what
 * overlaps is the launch of one kernel with the tail of the previous; or the wait goes where the
 * function says CG_GRID_WAIT_MARK, when what comes before it reads nothing an earlier kernel of
 * the graph writes (docs/templates.md, "Result"), and the launch where it says CG_LAUNCH_MARK
 * (a place every thread reaches: the next kernel's blocks then take the SMs this one's leave,
 * instead of competing with its last wave). On older archs, or launched without the attribute,
 * both instructions do nothing. */
#define CG_GRID_WAIT_MARK "/* kiln: grid wait here */"
#define CG_LAUNCH_MARK    "/* kiln: launch dependents here */"
#define CG_PDL_IF         "\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
#define CG_PDL_WAIT       "    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
#define CG_PDL_LAUNCH     "    asm volatile(\"griddepcontrol.launch_dependents;\");\n"
#define CG_PDL_ENDIF      "#endif\n"

/* Appends n bytes of s to the buffer at *o (sized by the caller). */
static void put_bytes(char **o, const char *s, size_t n) {
    memcpy(*o, s, n);
    *o += n;
}

/* The mark's position in [from, to) (to NULL: the end), or NULL. */
static const char *mark_in(const char *from, const char *to, const char *mark) {
    const char *m = strstr(from, mark);
    return m && (!to || m < to) ? m : NULL;
}

static char *with_grid_wait(lua_State *L, const char *src, size_t len) {
    int n = 0;
    for (const char *p = strstr(src, "__global__"); p; p = strstr(p + 1, "__global__")) n++;
    size_t extra = sizeof CG_PDL_IF + sizeof CG_PDL_WAIT + sizeof CG_PDL_LAUNCH + sizeof CG_PDL_ENDIF;
    char  *out = malloc(len + (size_t)n * 2 * extra + 1);
    if (!out) luaL_error(L, "out of host memory");
    char       *o = out;
    const char *p = src;
    for (const char *g; (g = strstr(p, "__global__"));) {
        const char *at = strchr(g, '{'), *next = strstr(g + 1, "__global__");
        if (!at) break;
        const char *wait = mark_in(at, next, CG_GRID_WAIT_MARK), *launch = mark_in(at, next, CG_LAUNCH_MARK);
        if (launch && wait && launch < wait) launch = NULL; /* a launch before the wait: at the wait */
        /* the wait (and the launch, when it has no mark of its own) */
        const char *w = wait ? wait : at + 1;
        put_bytes(&o, p, (size_t)(w - p));
        put_bytes(&o, CG_PDL_IF + (wait ? 1 : 0), sizeof CG_PDL_IF - 1 - (wait ? 1 : 0));
        put_bytes(&o, CG_PDL_WAIT, sizeof CG_PDL_WAIT - 1);
        if (!launch) put_bytes(&o, CG_PDL_LAUNCH, sizeof CG_PDL_LAUNCH - 1);
        put_bytes(&o, CG_PDL_ENDIF, sizeof CG_PDL_ENDIF - 1);
        p = wait ? wait + sizeof CG_GRID_WAIT_MARK - 1 : w;
        if (launch) {
            put_bytes(&o, p, (size_t)(launch - p));
            put_bytes(&o, CG_PDL_IF + 1, sizeof CG_PDL_IF - 2);
            put_bytes(&o, CG_PDL_LAUNCH, sizeof CG_PDL_LAUNCH - 1);
            put_bytes(&o, CG_PDL_ENDIF, sizeof CG_PDL_ENDIF - 1);
            p = launch + sizeof CG_LAUNCH_MARK - 1;
        }
    }
    size_t rest = strlen(p);
    memcpy(o, p, rest + 1);
    return out;
}

/* The step table at index t is a launch: name, source, grid, block, smem. grid_wait: put the
 * programmatic-dependent-launch prologue in (a program's kernels; not the runtime's utility
 * kernels, which are launched plainly). */
static void read_launch(lua_State *L, int t, cg_kernel *k, bool grid_wait) {
    size_t name_len, src_len;
    if (lua_getfield(L, t, "name") != LUA_TSTRING) luaL_error(L, "result.name is not a string");
    const char *name = lua_tolstring(L, -1, &name_len);
    if (!is_identifier(name, name_len))
        luaL_error(L, "result.name '%s' is not a C identifier of 1 to %d characters", name, (int)sizeof k->name - 1);
    if (lua_getfield(L, t, "source") != LUA_TSTRING) luaL_error(L, "result.source is not a string");
    const char *src = lua_tolstring(L, -1, &src_len);
    if (src_len == 0 || strlen(src) != src_len) luaL_error(L, "result.source is empty or contains a NUL byte");
    static const unsigned grid_max[3] = {2147483647u, 65535u, 65535u};
    static const unsigned block_max[3] = {1024u, 1024u, 64u};
    get_dim3(L, t, "grid", grid_max, k->grid);
    get_dim3(L, t, "block", block_max, k->block);
    if ((unsigned long)k->block[0] * k->block[1] * k->block[2] > 1024)
        luaL_error(L, "result.block has more than 1024 threads");
    k->smem = (unsigned)get_int(L, t, "smem", 0, 0, CG_MAX_SMEM, "result");
    k->kind = CG_LAUNCH;
    memcpy(k->name, name, name_len + 1);
    k->source = grid_wait ? with_grid_wait(L, src, src_len) : copy_string(L, src, src_len);
    lua_pop(L, 2);
}

/* Bytes behind kernel parameter `param` of node g->n (a buffer, or the scratch). */
static int64_t param_bytes(const gen_ctx *g, int param, size_t scratch) {
    if (param == g->nparams) return (int64_t)scratch;
    return (int64_t)g->p->bufs[g->params[param]].bytes;
}

static void read_mat(lua_State *L, int t, const char *field, const gen_ctx *g, size_t scratch, int rows,
                     int cols, int batch, cg_mat *m) {
    char what[32];
    snprintf(what, sizeof what, "gemm.%s", field);
    if (lua_getfield(L, t, field) != LUA_TTABLE) luaL_error(L, "%s is not a table", what);
    int mt = lua_gettop(L);
    int nparams = g->nparams + (scratch > 0);
    m->param = (int)get_int(L, mt, "param", -1, 0, nparams - 1, what);
    m->offset = get_int(L, mt, "offset", 0, 0, (lua_Integer)1 << 48, what);
    m->ld = get_int(L, mt, "ld", -1, rows > 1 ? rows : 1, (lua_Integer)1 << 40, what);
    m->stride = get_int(L, mt, "stride", 0, 0, (lua_Integer)1 << 48, what);
    if (lua_getfield(L, mt, "type") != LUA_TSTRING) luaL_error(L, "%s.type is not a string", what);
    const char *tn = lua_tostring(L, -1);
    if (strcmp(tn, "f32") == 0) m->type = KILN_F32;
    else if (strcmp(tn, "f16") == 0) m->type = KILN_F16;
    else if (strcmp(tn, "bf16") == 0) m->type = KILN_BF16;
    else luaL_error(L, "%s.type '%s' is not f32, f16 or bf16", what, tn);
    int64_t es = (int64_t)kiln_type_size(m->type);
    if (m->offset % es) luaL_error(L, "%s.offset %I is not a multiple of the element size", what, (lua_Integer)m->offset);
    /* The last element the call touches must lie inside the parameter's memory. */
    int64_t last = m->offset / es + (int64_t)(rows - 1) + (int64_t)(cols - 1) * m->ld + (int64_t)(batch - 1) * m->stride;
    if (rows > 0 && cols > 0 && (last + 1) * es > param_bytes(g, m->param, scratch))
        luaL_error(L, "%s reaches byte %I of parameter %d, which has %I", what, (lua_Integer)((last + 1) * es),
                   m->param, (lua_Integer)param_bytes(g, m->param, scratch));
    lua_pop(L, 2);
}

static bool get_bool(lua_State *L, int t, const char *field) {
    lua_getfield(L, t, field);
    bool v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* gemm.n_dyn = {slot = S, mul = M}: n is M times symbolic dim S's run-time value (n above is
 * the maximum, which the bounds checks used). */
static void read_n_dyn(lua_State *L, int gt, const gen_ctx *g, cg_gemm *m) {
    m->n_sym = -1;
    m->n_mul = 0;
    m->n_above = 0;
    if (lua_getfield(L, gt, "n_dyn") == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    if (!lua_istable(L, -1)) luaL_error(L, "gemm.n_dyn is not a table {slot =, mul =}");
    int t = lua_gettop(L);
    const kiln_ctx *ctx = dims_ctx(g);
    if (!ctx) luaL_error(L, "gemm.n_dyn in a program without symbolic dims");
    m->n_sym = (int)get_int(L, t, "slot", -1, 0, ctx->ndims - 1, "gemm.n_dyn");
    m->n_mul = (int)get_int(L, t, "mul", 1, 1, 2147483647, "gemm.n_dyn");
    m->n_above = (int)get_int(L, t, "above", 0, 0, 2147483647, "gemm.n_dyn");
    if (!g->uses[m->n_sym + 1]) luaL_error(L, "gemm.n_dyn: the node does not use symbolic dim slot %d", m->n_sym);
    if ((int64_t)m->n_mul * ctx->dims[m->n_sym].max > m->n)
        luaL_error(L, "gemm.n_dyn: %d x max(%s) exceeds n = %d", m->n_mul, ctx->dims[m->n_sym].name, m->n);
    lua_pop(L, 1);
}

/* The step table at index t has a gemm table: a library call (cg_gemm). */
static void read_gemm(lua_State *L, int t, const gen_ctx *g, size_t scratch, cg_kernel *k) {
    lua_getfield(L, t, "gemm");
    int gt = lua_gettop(L);
    cg_gemm *m = &k->gemm;
    m->ta = get_bool(L, gt, "transa");
    m->tb = get_bool(L, gt, "transb");
    m->m = (int)get_int(L, gt, "m", -1, 0, 2147483647, "gemm");
    m->n = (int)get_int(L, gt, "n", -1, 0, 2147483647, "gemm");
    m->k = (int)get_int(L, gt, "k", -1, 0, 2147483647, "gemm");
    m->batch = (int)get_int(L, gt, "batch", 1, 1, 2147483647, "gemm");
    read_mat(L, gt, "a", g, scratch, m->ta ? m->k : m->m, m->ta ? m->m : m->k, m->batch, &m->a);
    read_mat(L, gt, "b", g, scratch, m->tb ? m->n : m->k, m->tb ? m->k : m->n, m->batch, &m->b);
    read_mat(L, gt, "c", g, scratch, m->m, m->n, m->batch, &m->c);
    read_n_dyn(L, gt, g, m);
    if (m->a.type != m->b.type || m->c.type != KILN_F32)
        luaL_error(L, "gemm: a and b must have one type and c must be f32 (got %s, %s, %s)",
                   kiln_type_name(m->a.type), kiln_type_name(m->b.type), kiln_type_name(m->c.type));
    lua_pop(L, 1);
    k->kind = CG_GEMM;
    snprintf(k->name, sizeof k->name, "gemm_%s_%s%s", kiln_type_name(m->a.type), m->ta ? "t" : "n", m->tb ? "t" : "n");
    char src[768];
    snprintf(src, sizeof src,
             "/* cublasGemmStridedBatchedEx(op_a %s, op_b %s, m %d, n %d, k %d, batch %d,\n"
             " *   a: p%d + %lld bytes, %s, ld %lld, stride %lld;\n"
             " *   b: p%d + %lld bytes, %s, ld %lld, stride %lld;\n"
             " *   c: p%d + %lld bytes, %s, ld %lld, stride %lld; alpha 1, beta 0, compute f32) */\n",
             m->ta ? "T" : "N", m->tb ? "T" : "N", m->m, m->n, m->k, m->batch, m->a.param, (long long)m->a.offset,
             kiln_type_name(m->a.type), (long long)m->a.ld, (long long)m->a.stride, m->b.param, (long long)m->b.offset,
             kiln_type_name(m->b.type), (long long)m->b.ld, (long long)m->b.stride, m->c.param, (long long)m->c.offset,
             kiln_type_name(m->c.type), (long long)m->c.ld, (long long)m->c.stride);
    size_t len = strlen(src);
    if (m->n_sym >= 0)
        snprintf(src + len, sizeof src - len, "/* n = %d * kdims[%d] at run time (at most %d)%s */\n", m->n_mul,
                 m->n_sym, m->n, m->n_above ? "; no call while kdims is at most n_above" : "");
    len = strlen(src);
    if (m->n_above) snprintf(src + len, sizeof src - len, "/* n_above = %d */\n", m->n_above);
    k->source = copy_string(L, src, strlen(src));
}

/* collective.src / .dst = {param =, offset =}: count f32 values at the byte offset of a buffer
 * parameter, inside it. */
static void read_coll_ref(lua_State *L, int t, const char *field, const gen_ctx *g, int64_t count, cg_mat *m) {
    char what[32];
    snprintf(what, sizeof what, "collective.%s", field);
    if (lua_getfield(L, t, field) != LUA_TTABLE) luaL_error(L, "%s is not a table", what);
    int mt = lua_gettop(L);
    *m = (cg_mat){.type = KILN_F32};
    m->param = (int)get_int(L, mt, "param", -1, 0, g->nparams - 1, what);
    m->offset = get_int(L, mt, "offset", 0, 0, (lua_Integer)1 << 48, what);
    if (m->offset % 4) luaL_error(L, "%s.offset %I is not a multiple of 4", what, (lua_Integer)m->offset);
    if (m->offset + count * 4 > param_bytes(g, m->param, 0))
        luaL_error(L, "%s reaches byte %I of parameter %d, which has %I", what, (lua_Integer)(m->offset + count * 4),
                   m->param, (lua_Integer)param_bytes(g, m->param, 0));
    lua_pop(L, 1);
}

/* The step table at index t has a collective table: an NCCL call (cg_coll). */
static void read_coll(lua_State *L, int t, const gen_ctx *g, cg_kernel *k) {
    lua_getfield(L, t, "collective");
    int      ct = lua_gettop(L);
    cg_coll *c = &k->coll;
    if (lua_getfield(L, ct, "op") != LUA_TSTRING || strcmp(lua_tostring(L, -1), "sum") != 0)
        luaL_error(L, "collective.op must be \"sum\"");
    lua_pop(L, 1);
    c->ranks = (int)get_int(L, ct, "ranks", -1, 2, 64, "collective");
    c->count = get_int(L, ct, "count", -1, 1, (lua_Integer)1 << 40, "collective");
    c->count_sym = -1;
    c->count_mul = 0;
    if (lua_getfield(L, ct, "count_dyn") != LUA_TNIL) {
        if (!lua_istable(L, -1)) luaL_error(L, "collective.count_dyn is not a table {slot =, mul =}");
        int             dt = lua_gettop(L);
        const kiln_ctx *ctx = dims_ctx(g);
        if (!ctx) luaL_error(L, "collective.count_dyn in a program without symbolic dims");
        c->count_sym = (int)get_int(L, dt, "slot", -1, 0, ctx->ndims - 1, "collective.count_dyn");
        c->count_mul = (int)get_int(L, dt, "mul", 1, 1, 2147483647, "collective.count_dyn");
        if (!g->uses[c->count_sym + 1])
            luaL_error(L, "collective.count_dyn: the node does not use symbolic dim slot %d", c->count_sym);
        if ((int64_t)c->count_mul * ctx->dims[c->count_sym].max > c->count)
            luaL_error(L, "collective.count_dyn: %d x max(%s) exceeds count %I", c->count_mul,
                       ctx->dims[c->count_sym].name, (lua_Integer)c->count);
    }
    lua_pop(L, 1);
    read_coll_ref(L, ct, "src", g, c->count, &c->src);
    read_coll_ref(L, ct, "dst", g, c->count, &c->dst);
    lua_pop(L, 1);
    k->kind = CG_COLLECTIVE;
    snprintf(k->name, sizeof k->name, "all_reduce_f32_%d", c->ranks);
    char src[320];
    snprintf(src, sizeof src,
             "/* ncclAllReduce(send p%d + %lld bytes, recv p%d + %lld bytes, count %lld, ncclFloat32, ncclSum)\n"
             " *   over the %d ranks of the session's group, on its stream */\n",
             c->src.param, (long long)c->src.offset, c->dst.param, (long long)c->dst.offset, (long long)c->count, c->ranks);
    size_t len = strlen(src);
    if (c->count_sym >= 0)
        snprintf(src + len, sizeof src - len, "/* count = %d * kdims[%d] at run time (at most %lld) */\n", c->count_mul,
                 c->count_sym, (long long)c->count);
    k->source = copy_string(L, src, strlen(src));
}

/* Whether the template of IR_OP node n applies its elementwise epilogue (k.epilogue): the
 * epilogue column of FE_FAMS. The fused topk_moe template (moe.lua) does not. */
static bool applies_epilogues(const ir_node *n) {
    return n->fused != IR_FUSED_TOPK_MOE && fe_fams[fe_ops[n->op].fam].epilogue;
}

/* "n_kv" or "n_kv, n_tokens": the symbolic dims the node uses, for messages. */
static const char *first_sym(const gen_ctx *g) {
    static _Thread_local char buf[160];
    buf[0] = 0;
    for (int s = 1; s <= KILN_MAX_SYMS; s++)
        if (g->uses[s]) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", buf[0] ? ", " : "", sym_name(g, s));
    return buf;
}

/* Protected: builds the node table, calls the template, checks its result and fills the steps
 * in g->steps. The result is one launch table, or {steps = {...}, scratch = bytes}. */
static int l_generate(lua_State *L) {
    gen_ctx *g = lua_touserdata(L, 1);
    lua_settop(L, 0);
    lua_getglobal(L, "require");
    lua_pushstring(L, g->tpl);
    lua_call(L, 1, 1);
    if (!lua_isfunction(L, -1))
        return luaL_error(L, "template %s.lua returns a %s, not a function", g->tpl, luaL_typename(L, -1));
    push_node(L, g);
    lua_call(L, 1, 1);
    int t = lua_gettop(L);
    if (!lua_istable(L, t))
        return luaL_error(L, "template %s.lua: result is a %s, not a table", g->tpl, luaL_typename(L, t));
    size_t scratch = (size_t)get_int(L, t, "scratch", 0, 0, CG_MAX_SCRATCH, "result");
    int    n = 1, list = 0;
    if (lua_getfield(L, t, "steps") == LUA_TTABLE) {
        list = lua_gettop(L);
        n = (int)lua_rawlen(L, list);
        if (n < 1 || n > CG_MAX_STEPS) return luaL_error(L, "result.steps must hold 1 to %d steps", CG_MAX_STEPS);
    } else if (!lua_isnil(L, -1)) {
        return luaL_error(L, "result.steps is a %s, not a table", luaL_typename(L, -1));
    }
    if (g->n->kind == IR_OP && g->n->ninstr > 0 && (lua_getfield(L, t, "epilogue"), !lua_toboolean(L, -1)))
        return luaL_error(L, "template %s.lua does not apply the elementwise epilogue of its node "
                             "(a fusion attached one): its result must say epilogue = true", g->tpl);
    if (g->n->bnorm && (lua_getfield(L, t, "bnorm"), !lua_toboolean(L, -1)))
        return luaL_error(L, "template %s.lua does not normalize b as its node asks (pass rms_norm_gemv): its "
                             "result must say bnorm = true", g->tpl);
    if (g->n->paired && (lua_getfield(L, t, "paired"), !lua_toboolean(L, -1)))
        return luaL_error(L, "template %s.lua does not compute the paired weight of its node (a fusion paired "
                             "it): its result must say paired = true", g->tpl);
    if (g->n->fused) {
        const char *want = g->n->fused == IR_FUSED_TOPK_MOE ? "topk_moe" : "rope_set_rows";
        lua_getfield(L, t, "fused");
        const char *said = lua_tostring(L, -1);
        if (!said || strcmp(said, want) != 0)
            return luaL_error(L, "template %s.lua does not implement fusion %s: its result must say fused = \"%s\"",
                              g->tpl, want, want);
    }
    if (g->ntails > 0 && (lua_getfield(L, t, "tail"), !lua_toboolean(L, -1)))
        return luaL_error(L, "template %s.lua does not compute the tails of its node (passes gemv_rope, head_rope): "
                             "its result must say tail = true", g->tpl);
    if (g->dynamic && (lua_getfield(L, t, "dynamic"), !lua_toboolean(L, -1)))
        return luaL_error(L, "template %s.lua does not support symbolic dims (%s here): its result must say "
                             "dynamic = true (docs/templates.md, \"Symbolic dims\")",
                          g->tpl, first_sym(g));
    for (int i = 0; i < n; i++) {
        if (list && lua_rawgeti(L, list, i + 1) != LUA_TTABLE) return luaL_error(L, "result.steps[%d] is not a table", i + 1);
        int s = list ? lua_gettop(L) : t;
        cg_kernel *k = &g->steps[i];
        g->nsteps = i + 1;
        k->node = g->node;
        k->step = i;
        k->nsteps = n;
        k->scratch = scratch;
        k->nparams = g->nparams;
        memcpy(k->params, g->params, sizeof g->params);
        if (scratch > 0) k->params[k->nparams++] = CG_PARAM_SCRATCH;
        lua_getfield(L, s, "gemm");
        bool gemm = !lua_isnil(L, -1);
        lua_getfield(L, s, "collective");
        bool coll = !lua_isnil(L, -1);
        lua_pop(L, 2);
        if (gemm && coll) return luaL_error(L, "result.steps[%d] has both a gemm and a collective table", i + 1);
        if (gemm) read_gemm(L, s, g, scratch, k);
        else if (coll) read_coll(L, s, g, k);
        else read_launch(L, s, k, true);
        if (!gemm && !coll && g->dynamic) k->params[k->nparams++] = CG_PARAM_DIMS;
        if (list) lua_pop(L, 1);
    }
    return 0;
}

static kiln_status check_ref(const ir_prog *p, const ir_ref *r, int node, const char *what) {
    if (r->buf < 0 || r->buf >= p->nbufs)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %s buffer %d out of range", node, what, r->buf);
    if ((unsigned)r->type >= KILN_TYPE_COUNT)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %s has a bad type", node, what);
    return NULL;
}

static void note_syms(gen_ctx *g, const ir_ref *r) {
    for (int d = 0; d < 4; d++)
        if (r->sym[d] && r->sym[d] <= KILN_MAX_SYMS) {
            g->uses[r->sym[d]] = true;
            g->dynamic = true;
        }
}

static int param_of(gen_ctx *g, int buf) {
    for (int i = 0; i < g->nparams; i++)
        if (g->params[i] == buf) return i;
    if (g->nparams == (int)(sizeof g->params / sizeof g->params[0])) {
        g->overflow = true;
        return 0;
    }
    g->params[g->nparams] = buf;
    return g->nparams++;
}

/* The tails of host node `node` (passes gemv_rope, head_rope) as contexts whose params are the
 * host's. */
static kiln_status bind_tails(gen_ctx *g, gen_ctx *tails) {
    const ir_prog *p = g->p;
    for (int j = ir_next_tail(p, g->node, g->node); j >= 0; j = ir_next_tail(p, g->node, j)) {
        if (g->ntails == IR_MAX_IN)
            return kb_error(KILN_ERR_CODEGEN, "codegen: node %d: more than %d tails", g->node, IR_MAX_IN);
        const ir_node *n = &p->nodes[j];
        gen_ctx       *t = &tails[g->ntails++];
        *t = (gen_ctx){.p = p, .n = n, .tpl = g->tpl, .node = j};
        kiln_status st = check_ref(p, &n->dst, j, "dst");
        if (st) return st;
        note_syms(g, &n->dst);
        t->dst_param = param_of(g, n->dst.buf);
        t->dst2_param = -1;
        for (int i = 0; i < n->nin; i++) {
            if ((st = check_ref(p, &n->in[i], j, "input"))) return st;
            note_syms(g, &n->in[i]);
            t->in_param[i] = param_of(g, n->in[i].buf);
        }
    }
    for (int t = 0; t < g->ntails; t++) tails[t].nparams = g->nparams;
    return NULL;
}

kiln_status cg_generate_steps(cg_lua *C, const ir_prog *p, int node, cg_kernel **out, int *nout) {
    if (!C || !p || !out || !nout) return kb_error(KILN_ERR_INVALID, "cg_generate: NULL argument");
    *out = NULL;
    *nout = 0;
    if (node < 0 || node >= p->nnodes)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d out of range", node);
    const ir_node *n = &p->nodes[node];
    if (n->dead) return kb_error(KILN_ERR_INVALID, "codegen: node %d is dead", node);
    if (n->host)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d is computed by node %d's kernel (pass gemv_rope or head_rope)", node,
                        n->host - 1);
    const char *tpl = template_of(p, node);
    if (!tpl) return kb_error(KILN_ERR_INVALID, "codegen: node %d has unknown kind %d", node, (int)n->kind);
    if (n->nin < 0 || n->nin > IR_MAX_IN)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %d inputs", node, n->nin);
    if (n->kind == IR_EW && (n->ninstr < 1 || n->ninstr > IR_MAX_INSTR))
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %d instructions", node, n->ninstr);

    if (n->kind == IR_OP && (n->ninstr > 0 || n->paired) && !applies_epilogues(n))
        return kb_error(KILN_ERR_CODEGEN,
                        "codegen: node %d (%s): template %s.lua does not apply the elementwise epilogue a fusion "
                        "attached (families that do: the epilogue column of FE_FAMS in frontend/frontend.h)",
                        node, fe_ops[n->op].name, tpl);
    gen_ctx g = {.p = p, .n = n, .tpl = tpl, .node = node};
    kiln_status st = check_ref(p, &n->dst, node, "dst");
    if (st) return st;
    note_syms(&g, &n->dst);
    if (n->has_dst2) note_syms(&g, &n->dst2);
    for (int i = 0; i < n->nin; i++) note_syms(&g, &n->in[i]);
    g.dst_param = param_of(&g, n->dst.buf);
    g.dst2_param = -1;
    if (n->has_dst2) {
        if ((st = check_ref(p, &n->dst2, node, "dst2"))) return st;
        g.dst2_param = param_of(&g, n->dst2.buf);
    }
    for (int i = 0; i < n->nin; i++) {
        char what[32];
        snprintf(what, sizeof what, "input %d", i);
        if ((st = check_ref(p, &n->in[i], node, what))) return st;
        g.in_param[i] = param_of(&g, n->in[i].buf);
    }
    gen_ctx tails[IR_MAX_IN];
    g.tails = tails;
    if ((st = bind_tails(&g, tails))) return st;
    if (g.overflow)
        return kb_error(KILN_ERR_CODEGEN, "codegen: node %d reads and writes more than %d buffers", node,
                        (int)(sizeof g.params / sizeof g.params[0]));
    for (int i = 0; i < n->ninstr; i++) {
        const ir_instr *in = &n->ins[i];
        if ((unsigned)in->op >= FE_OP_COUNT ||
            (fe_ops[in->op].kind != FE_UNARY && fe_ops[in->op].kind != FE_BINARY && fe_ops[in->op].kind != FE_GLU))
            return kb_error(KILN_ERR_INVALID, "codegen: node %d: instruction %d is not elementwise", node, i);
        if ((unsigned)in->type >= KILN_TYPE_COUNT)
            return kb_error(KILN_ERR_INVALID, "codegen: node %d: instruction %d has a bad type", node, i);
    }

    g.steps = calloc(CG_MAX_STEPS, sizeof *g.steps);
    if (!g.steps) return kb_oom();
    lua_State *L = cg_lua_state(C);
    int top = lua_gettop(L);
    lua_pushcfunction(L, l_generate);
    lua_pushlightuserdata(L, &g);
    char what[96];
    snprintf(what, sizeof what, "codegen: template %s (node %d)", tpl, node);
    st = cg_lua_pcall(C, 1, 0, what);
    lua_settop(L, top);
    if (st) {
        for (int i = 0; i < g.nsteps; i++) cg_kernel_clear(&g.steps[i]);
        free(g.steps);
        return st;
    }
    *out = g.steps;
    *nout = g.nsteps;
    return NULL;
}

kiln_status cg_generate(cg_lua *C, const ir_prog *p, int node, cg_kernel *k) {
    if (!k) return kb_error(KILN_ERR_INVALID, "cg_generate: NULL argument");
    memset(k, 0, sizeof *k);
    k->node = node;
    cg_kernel  *steps;
    int         n;
    kiln_status st = cg_generate_steps(C, p, node, &steps, &n);
    if (st) return st;
    if (n == 1) {
        *k = steps[0];
        free(steps);
        return NULL;
    }
    for (int i = 0; i < n; i++) cg_kernel_clear(&steps[i]);
    free(steps);
    return kb_error(KILN_ERR_CODEGEN, "codegen: node %d gives %d steps; use cg_generate_steps", node, n);
}

/* Protected: calls templates/util.lua with {kind = "util", kernel = NAME} and reads its launch. */
static int l_generate_util(lua_State *L) {
    cg_kernel  *k = lua_touserdata(L, 1);
    const char *kernel = lua_touserdata(L, 2);
    lua_settop(L, 0);
    lua_getglobal(L, "require");
    lua_pushliteral(L, "util");
    lua_call(L, 1, 1);
    if (!lua_isfunction(L, -1)) return luaL_error(L, "template util.lua returns a %s, not a function", luaL_typename(L, -1));
    lua_createtable(L, 0, 2);
    lua_pushliteral(L, "util");
    lua_setfield(L, -2, "kind");
    lua_pushstring(L, kernel);
    lua_setfield(L, -2, "kernel");
    lua_call(L, 1, 1);
    if (!lua_istable(L, -1)) return luaL_error(L, "template util.lua: result is a %s, not a table", luaL_typename(L, -1));
    read_launch(L, lua_gettop(L), k, false);
    return 0;
}

kiln_status cg_generate_util(cg_lua *C, const char *kernel, cg_kernel *k) {
    if (!C || !kernel || !k) return kb_error(KILN_ERR_INVALID, "cg_generate_util: NULL argument");
    memset(k, 0, sizeof *k);
    k->node = -1;
    lua_State *L = cg_lua_state(C);
    int        top = lua_gettop(L);
    lua_pushcfunction(L, l_generate_util);
    lua_pushlightuserdata(L, k);
    lua_pushlightuserdata(L, (void *)kernel);
    char what[96];
    snprintf(what, sizeof what, "codegen: utility kernel %.40s", kernel);
    kiln_status st = cg_lua_pcall(C, 2, 0, what);
    lua_settop(L, top);
    if (st) cg_kernel_clear(k);
    return st;
}

void cg_kernel_clear(cg_kernel *k) {
    if (!k) return;
    if (!k->source_borrowed) free(k->source);
    if (!k->cubin_borrowed) free(k->cubin);
    memset(k, 0, sizeof *k);
}
