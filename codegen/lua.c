/* The Lua 5.4 state in which templates run (docs/templates.md).
 *
 * Sandbox: only the base, string, table, math and utf8 libraries; no file access (dofile,
 * loadfile removed, no io/os/package/debug), no randomness (math.random removed), load accepts
 * text chunks only. require resolves a module name to the templates embedded at build time
 * (cg_templates[]) or, when $KILN_TEMPLATE_DIR is set, to $KILN_TEMPLATE_DIR/<name>.lua first.
 * A memory cap and an instruction budget per call keep a runaway template from hanging or
 * exhausting the compiler. */
#include "codegen/codegen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#define CG_LUA_MEM_LIMIT ((size_t)512 << 20) /* bytes the Lua heap may hold */
#define CG_LUA_HOOK_EVERY 10000              /* VM instructions between budget checks */
#define CG_LUA_BUDGET 20000                  /* checks per call: 2e8 instructions */

#define REG_LOADED "kiln.loaded"   /* registry: module name -> value */
#define REG_LOADING "kiln.loading" /* registry: module name -> true while it loads */

struct cg_lua {
    lua_State *L;
    char      *dir; /* $KILN_TEMPLATE_DIR or NULL */
    size_t     mem;
    long       ticks;
};

static cg_lua *owner(lua_State *L) { return *(cg_lua **)lua_getextraspace(L); }

static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    cg_lua *c = ud;
    if (ptr == NULL) osize = 0;
    if (nsize == 0) {
        free(ptr);
        c->mem -= osize;
        return NULL;
    }
    if (nsize > osize && c->mem - osize + nsize > CG_LUA_MEM_LIMIT) return NULL;
    void *p = realloc(ptr, nsize);
    if (p) c->mem = c->mem - osize + nsize;
    return p;
}

static int l_panic(lua_State *L) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "kiln: unprotected Lua error: %s\n", msg ? msg : "?");
    abort();
}

static void l_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    cg_lua *c = owner(L);
    if (++c->ticks > CG_LUA_BUDGET)
        luaL_error(L, "template exceeded its instruction budget (%d instructions)",
                   CG_LUA_BUDGET * CG_LUA_HOOK_EVERY);
}

/* print, to stderr: template output never depends on it. */
static int l_print(lua_State *L) {
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = luaL_tolstring(L, i, &len);
        if (i > 1) fputc('\t', stderr);
        fwrite(s, 1, len, stderr);
        lua_pop(L, 1);
    }
    fputc('\n', stderr);
    return 0;
}

/* load(chunk [, chunkname [, mode [, env]]]) with mode forced to "t". */
static int l_load(lua_State *L) {
    int n = lua_gettop(L);
    if (n < 3) {
        lua_settop(L, 3);
        n = 3;
    }
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
}

static bool valid_module_name(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

/* Pushes the loaded chunk of module name, or raises an error. */
static void load_module(lua_State *L, const char *name) {
    cg_lua *c = owner(L);
    if (c->dir) {
        size_t plen = strlen(c->dir) + strlen(name) + 8;
        char *path = lua_newuserdatauv(L, plen, 0); /* freed by the GC, even on error */
        snprintf(path, plen, "%s/%s.lua", c->dir, name);
        FILE *f = fopen(path, "rb");
        if (f) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            char buf[4096];
            size_t n;
            while ((n = fread(buf, 1, sizeof buf, f)) > 0) luaL_addlstring(&b, buf, n);
            int err = ferror(f);
            fclose(f);
            if (err) luaL_error(L, "cannot read template %s", path);
            luaL_pushresult(&b);
            lua_pushfstring(L, "@%s", path);
            size_t len;
            const char *text = lua_tolstring(L, -2, &len);
            if (luaL_loadbufferx(L, text, len, lua_tostring(L, -1), "t") != LUA_OK) lua_error(L);
            lua_replace(L, -4); /* chunk over the userdata; drop text and chunk name */
            lua_pop(L, 2);
            return;
        }
        if (errno != ENOENT) luaL_error(L, "cannot open template %s: %s", path, strerror(errno));
        lua_pop(L, 1);
        /* not overridden: fall back to the embedded template */
    }
    for (int i = 0; i < cg_ntemplates; i++) {
        if (strcmp(cg_templates[i].name, name) != 0) continue;
        lua_pushfstring(L, "@templates/%s.lua", name);
        if (luaL_loadbufferx(L, cg_templates[i].text, cg_templates[i].len, lua_tostring(L, -1), "t") !=
            LUA_OK)
            lua_error(L);
        lua_remove(L, -2);
        return;
    }
    luaL_error(L, "module '%s' not found: no template %s.lua%s%s", name, name,
               c->dir ? " in KILN_TEMPLATE_DIR=" : "", c->dir ? c->dir : " embedded");
}

/* require(name): each module runs once per state; its result (true if none) is kept. */
static int l_require(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    if (!valid_module_name(name))
        return luaL_error(L, "require: bad module name '%s' (letters, digits and _ only)", name);
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, REG_LOADED); /* 2 */
    if (lua_getfield(L, 2, name) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, REG_LOADING); /* 3 */
    if (lua_getfield(L, 3, name) != LUA_TNIL)
        return luaL_error(L, "require: module '%s' requires itself (cycle)", name);
    lua_pop(L, 1);
    lua_pushboolean(L, 1);
    lua_setfield(L, 3, name);
    load_module(L, name);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushnil(L);
    lua_setfield(L, 3, name);
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, name);
    return 1;
}

static int l_setup(lua_State *L) {
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},       {LUA_STRLIBNAME, luaopen_string},
        {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
        {LUA_UTF8LIBNAME, luaopen_utf8},
    };
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        luaL_requiref(L, libs[i].name, libs[i].func, 1);
        lua_pop(L, 1);
    }
    static const char *const removed[] = {"dofile", "loadfile"};
    for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++) {
        lua_pushnil(L);
        lua_setglobal(L, removed[i]);
    }
    lua_getglobal(L, LUA_MATHLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, "random");
    lua_pushnil(L);
    lua_setfield(L, -2, "randomseed");
    lua_pop(L, 1);
    lua_pushcfunction(L, l_print);
    lua_setglobal(L, "print");
    lua_getglobal(L, "load");
    lua_pushcclosure(L, l_load, 1);
    lua_setglobal(L, "load");
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_LOADED);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_LOADING);
    lua_pushcfunction(L, l_require);
    lua_setglobal(L, "require");
    return 0;
}

kiln_status cg_lua_new(cg_lua **out) {
    *out = NULL;
    cg_lua *c = calloc(1, sizeof *c);
    if (!c) return kb_oom();
    const char *dir = getenv("KILN_TEMPLATE_DIR");
    if (dir && *dir) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            free(c);
            return kb_error(KILN_ERR_IO, "KILN_TEMPLATE_DIR=%s: not a directory", dir);
        }
        c->dir = strdup(dir);
        if (!c->dir) {
            free(c);
            return kb_oom();
        }
    }
    c->L = lua_newstate(l_alloc, c);
    if (!c->L) {
        free(c->dir);
        free(c);
        return kb_oom();
    }
    *(cg_lua **)lua_getextraspace(c->L) = c;
    lua_atpanic(c->L, l_panic);
    lua_pushcfunction(c->L, l_setup);
    kiln_status st = cg_lua_pcall(c, 0, 0, "starting Lua");
    if (st) {
        cg_lua_free(c);
        return st;
    }
    *out = c;
    return NULL;
}

void cg_lua_free(cg_lua *c) {
    if (!c) return;
    if (c->L) lua_close(c->L);
    free(c->dir);
    free(c);
}

struct lua_State *cg_lua_state(cg_lua *c) { return c->L; }

kiln_status cg_lua_pcall(cg_lua *c, int nargs, int nresults, const char *what) {
    lua_State *L = c->L;
    c->ticks = 0;
    lua_sethook(L, l_hook, LUA_MASKCOUNT, CG_LUA_HOOK_EVERY);
    int rc = lua_pcall(L, nargs, nresults, 0);
    lua_sethook(L, NULL, 0, 0);
    if (rc == LUA_OK) return NULL;
    kiln_status st;
    if (rc == LUA_ERRMEM) {
        st = kb_error(KILN_ERR_CODEGEN, "%s: Lua ran out of memory (templates may use %zu MiB)",
                      what, CG_LUA_MEM_LIMIT >> 20);
    } else {
        const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (msg) st = kb_error(KILN_ERR_CODEGEN, "%s: %s", what, msg);
        else st = kb_error(KILN_ERR_CODEGEN, "%s: error object is a %s value", what, luaL_typename(L, -1));
    }
    lua_pop(L, 1);
    return st;
}

static int l_exec(lua_State *L) {
    const char *code = lua_touserdata(L, 1);
    const char *name = lua_touserdata(L, 2);
    lua_settop(L, 0);
    lua_pushfstring(L, "=%s", name);
    if (luaL_loadbufferx(L, code, strlen(code), lua_tostring(L, 1), "t") != LUA_OK) lua_error(L);
    lua_call(L, 0, 1);
    luaL_tolstring(L, -1, NULL);
    return 1;
}

kiln_status cg_lua_exec(cg_lua *c, const char *code, const char *name, char **result) {
    *result = NULL;
    lua_State *L = c->L;
    int top = lua_gettop(L);
    lua_pushcfunction(L, l_exec);
    lua_pushlightuserdata(L, (void *)code);
    lua_pushlightuserdata(L, (void *)(name ? name : "chunk"));
    kiln_status st = cg_lua_pcall(c, 2, 1, name ? name : "chunk");
    if (!st) {
        *result = strdup(lua_tostring(L, -1));
        if (!*result) st = kb_oom();
    }
    lua_settop(L, top);
    return st;
}
