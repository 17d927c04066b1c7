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

/* The template module of a node: elementwise, or the family of its op (templates/FAM.lua). */
static const char *template_of(const ir_node *n) {
    switch (n->kind) {
    case IR_EW: return "elementwise";
    case IR_OP: return (unsigned)n->op < FE_OP_COUNT && fe_ops[n->op].kind == FE_KERNEL ? fe_ops[n->op].fam : NULL;
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

typedef struct {
    const ir_prog *p;
    const ir_node *n;
    const char    *tpl;
    int            nparams;
    int            params[IR_MAX_IN + 1];
    int            dst_param, in_param[IR_MAX_IN];
    cg_kernel     *k;
} gen_ctx;

static void set_int_array(lua_State *L, const int64_t *v, int n, const char *field) {
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, (lua_Integer)v[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, field);
}

static void push_ref(lua_State *L, const ir_ref *r, int param) {
    lua_createtable(L, 0, 5);
    lua_pushstring(L, kiln_type_name(r->type));
    lua_setfield(L, -2, "type");
    set_int_array(L, r->ne, 4, "ne");
    set_int_array(L, r->st, 4, "st");
    lua_pushinteger(L, (lua_Integer)r->offs);
    lua_setfield(L, -2, "offs");
    lua_pushinteger(L, param);
    lua_setfield(L, -2, "param");
}

/* IR_OP: k.op, k.args (operand refs by parameter name; absent optional ones are nil), k.inputs
 * (all operands in order), k.params (scalars by name: floats as exact CUDA literals, ints as
 * integers, bools as booleans, types and enum values as names, I4 as a table of 4) and
 * k.values (floats as Lua numbers, for arithmetic at generation time). */
static void push_op_node(lua_State *L, const gen_ctx *g) {
    const ir_node *n = g->n;
    const fe_sig  *sig = fe_op_sig(n->op);
    lua_createtable(L, 0, 8);
    lua_pushliteral(L, "op");
    lua_setfield(L, -2, "kind");
    lua_pushstring(L, fe_ops[n->op].name);
    lua_setfield(L, -2, "op");
    push_ref(L, &n->dst, g->dst_param);
    lua_setfield(L, -2, "dst");
    lua_createtable(L, n->nin, 0);
    for (int i = 0; i < n->nin; i++) {
        push_ref(L, &n->in[i], g->in_param[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "inputs");
    lua_createtable(L, 0, sig->ntensor);
    for (int i = 0; i < sig->n; i++) {
        const fe_param *q = &sig->p[i];
        if (q->kind != FE_P_TENSOR || n->opd[q->slot] < 0) continue;
        push_ref(L, &n->in[n->opd[q->slot]], g->in_param[n->opd[q->slot]]);
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
    push_ref(L, &n->dst, g->dst_param);
    lua_setfield(L, -2, "dst");
    lua_createtable(L, n->nin, 0);
    for (int i = 0; i < n->nin; i++) {
        push_ref(L, &n->in[i], g->in_param[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "inputs");
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

/* Protected: builds the node table, calls the template, checks its result and fills g->k. */
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

    size_t name_len, src_len;
    if (lua_getfield(L, t, "name") != LUA_TSTRING) return luaL_error(L, "result.name is not a string");
    const char *name = lua_tolstring(L, -1, &name_len);
    if (!is_identifier(name, name_len))
        return luaL_error(L, "result.name '%s' is not a C identifier of 1 to %d characters", name,
                          (int)sizeof g->k->name - 1);
    if (lua_getfield(L, t, "source") != LUA_TSTRING) return luaL_error(L, "result.source is not a string");
    const char *src = lua_tolstring(L, -1, &src_len);
    if (src_len == 0 || strlen(src) != src_len)
        return luaL_error(L, "result.source is empty or contains a NUL byte");

    static const unsigned grid_max[3] = {2147483647u, 65535u, 65535u};
    static const unsigned block_max[3] = {1024u, 1024u, 64u};
    unsigned grid[3], block[3];
    get_dim3(L, t, "grid", grid_max, grid);
    get_dim3(L, t, "block", block_max, block);
    if ((unsigned long)block[0] * block[1] * block[2] > 1024)
        return luaL_error(L, "result.block has more than 1024 threads");
    lua_getfield(L, t, "smem");
    int isint;
    lua_Integer smem = lua_tointegerx(L, -1, &isint);
    if (lua_isnil(L, -1)) smem = 0, isint = 1;
    if (!isint || smem < 0 || smem > CG_MAX_SMEM)
        return luaL_error(L, "result.smem must be an integer in [0, %I]", (lua_Integer)CG_MAX_SMEM);

    /* Nothing below raises a Lua error. */
    char *copy = malloc(src_len + 1);
    if (!copy) return luaL_error(L, "out of host memory");
    memcpy(copy, src, src_len + 1);
    cg_kernel *k = g->k;
    memcpy(k->name, name, name_len + 1);
    k->source = copy;
    memcpy(k->grid, grid, sizeof grid);
    memcpy(k->block, block, sizeof block);
    k->smem = (unsigned)smem;
    k->nparams = g->nparams;
    memcpy(k->params, g->params, sizeof g->params);
    return 0;
}

static kiln_status check_ref(const ir_prog *p, const ir_ref *r, int node, const char *what) {
    if (r->buf < 0 || r->buf >= p->nbufs)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %s buffer %d out of range", node, what, r->buf);
    if ((unsigned)r->type >= KILN_TYPE_COUNT)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %s has a bad type", node, what);
    return NULL;
}

static int param_of(gen_ctx *g, int buf) {
    for (int i = 0; i < g->nparams; i++)
        if (g->params[i] == buf) return i;
    g->params[g->nparams] = buf;
    return g->nparams++;
}

kiln_status cg_generate(cg_lua *C, const ir_prog *p, int node, cg_kernel *k) {
    memset(k, 0, sizeof *k);
    k->node = node;
    if (!C || !p) return kb_error(KILN_ERR_INVALID, "cg_generate: NULL argument");
    if (node < 0 || node >= p->nnodes)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d out of range", node);
    const ir_node *n = &p->nodes[node];
    if (n->dead) return kb_error(KILN_ERR_INVALID, "codegen: node %d is dead", node);
    const char *tpl = template_of(n);
    if (!tpl) return kb_error(KILN_ERR_INVALID, "codegen: node %d has unknown kind %d", node, (int)n->kind);
    if (n->nin < 0 || n->nin > IR_MAX_IN)
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %d inputs", node, n->nin);
    if (n->kind == IR_EW && (n->ninstr < 1 || n->ninstr > IR_MAX_INSTR))
        return kb_error(KILN_ERR_INVALID, "codegen: node %d: %d instructions", node, n->ninstr);

    gen_ctx g = {.p = p, .n = n, .tpl = tpl, .k = k};
    kiln_status st = check_ref(p, &n->dst, node, "dst");
    if (st) return st;
    g.dst_param = param_of(&g, n->dst.buf);
    for (int i = 0; i < n->nin; i++) {
        char what[32];
        snprintf(what, sizeof what, "input %d", i);
        if ((st = check_ref(p, &n->in[i], node, what))) return st;
        g.in_param[i] = param_of(&g, n->in[i].buf);
    }
    for (int i = 0; n->kind == IR_EW && i < n->ninstr; i++) {
        const ir_instr *in = &n->ins[i];
        if ((unsigned)in->op >= FE_OP_COUNT ||
            (fe_ops[in->op].kind != FE_UNARY && fe_ops[in->op].kind != FE_BINARY && fe_ops[in->op].kind != FE_GLU))
            return kb_error(KILN_ERR_INVALID, "codegen: node %d: instruction %d is not elementwise", node, i);
        if ((unsigned)in->type >= KILN_TYPE_COUNT)
            return kb_error(KILN_ERR_INVALID, "codegen: node %d: instruction %d has a bad type", node, i);
    }

    lua_State *L = cg_lua_state(C);
    int top = lua_gettop(L);
    lua_pushcfunction(L, l_generate);
    lua_pushlightuserdata(L, &g);
    char what[96];
    snprintf(what, sizeof what, "codegen: template %s (node %d)", tpl, node);
    st = cg_lua_pcall(C, 1, 0, what);
    lua_settop(L, top);
    if (st) cg_kernel_clear(k), k->node = node;
    return st;
}

void cg_kernel_clear(cg_kernel *k) {
    if (!k) return;
    free(k->source);
    free(k->cubin);
    memset(k, 0, sizeof *k);
}
