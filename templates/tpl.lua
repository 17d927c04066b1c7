-- tpl: kiln's template engine (docs/templates.md).
--
-- A template is text in which
--   * a line whose first non-blank character is '@' is a Lua statement (the rest of the line), and
--   * every other line is emitted verbatim, with each ${expr} replaced by the value of the Lua
--     expression expr (a string or an integer; anything else is an error, so that a stray float,
--     nil or table never reaches generated code silently).
-- Names in statements and expressions resolve in the env table given to render, then in the
-- global table. Assignments to undeclared names go to a scratch table private to one render.
--
-- Each template is translated to one Lua function, line for line, so that Lua's error messages
-- give the template's own name and line. Translations are cached: each distinct text compiles once.

local M = {}

local G = _G
local cache = {}

-- Splits "name:line" (as produced by here) into name and first line.
local function parse_origin(origin)
    if origin == nil then return "template", 1 end
    local name, line = string.match(origin, "^(.*):(%d+)$")
    if name then return name, tonumber(line) end
    return origin, 1
end

-- Index of the '}' closing a ${ whose expression starts at i; braces and quoted strings nest.
local function closing_brace(line, i, name, lnum)
    local depth, open_quote = 1, nil
    while i <= #line do
        local c = line:sub(i, i)
        if open_quote then
            if c == "\\" then
                i = i + 1
            elseif c == open_quote then
                open_quote = nil
            end
        elseif c == '"' or c == "'" then
            open_quote = c
        elseif c == "{" then
            depth = depth + 1
        elseif c == "}" then
            depth = depth - 1
            if depth == 0 then return i end
        end
        i = i + 1
    end
    error(string.format("%s:%d: unterminated ${ in template", name, lnum), 0)
end

-- A Lua string literal for s, on one line (%q writes a newline as a backslash and a newline).
local function quote(s)
    return (string.format("%q", s):gsub("\\\n", "\\n"))
end

-- Lua code for one text line: a call of _put with its literal pieces and expressions.
local function text_line(line, newline, name, lnum)
    local parts, pos = {}, 1
    while true do
        local s = line:find("${", pos, true)
        if not s then break end
        if s > pos then parts[#parts + 1] = quote(line:sub(pos, s - 1)) end
        local e = closing_brace(line, s + 2, name, lnum)
        local expr = line:sub(s + 2, e - 1)
        if expr:match("^%s*$") then
            error(string.format("%s:%d: empty ${} in template", name, lnum), 0)
        end
        parts[#parts + 1] = "_str((" .. expr .. "), " .. quote(expr) .. ")"
        pos = e + 1
    end
    local rest = line:sub(pos) .. (newline and "\n" or "")
    if rest ~= "" then parts[#parts + 1] = quote(rest) end
    if #parts == 0 then return "" end
    return "_put(" .. table.concat(parts, ", ") .. ")"
end

-- Translates template text to Lua source whose line N is the template's line N (shifted so that
-- the template's first line is line `first` of the chunk).
local function translate(text, name, first)
    local lines = {}
    for l in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
    local ends_with_newline = text:sub(-1) == "\n"
    if ends_with_newline then lines[#lines] = nil end
    local code = {}
    for i, l in ipairs(lines) do
        local stmt = l:match("^%s*@(.*)$")
        if stmt then
            code[i] = stmt
        else
            code[i] = text_line(l, ends_with_newline or i < #lines, name, first + i - 1)
        end
    end
    if #code == 0 then code[1] = "" end
    code[1] = "local _ENV, _put, _str = ...; " .. code[1]
    return string.rep("\n", first - 1) .. table.concat(code, "\n") .. "\n"
end

-- tostring for ${}: strings and integers only.
local function str(v, expr)
    local t = math.type(v)
    if type(v) == "string" then return v end
    if t == "integer" then return tostring(v) end
    if t == "float" then
        error(string.format("${%s} is the float %s: templates emit integers or pre-formatted strings",
            expr, tostring(v)), 2)
    end
    error(string.format("${%s} is %s, not a string or integer", expr, tostring(v)), 2)
end

-- The compiled function for text (cached).
local function compile(text, origin)
    local key = (origin or "") .. "\0" .. text
    local fn = cache[key]
    if fn then return fn end
    local name, first = parse_origin(origin)
    local code = translate(text, name, first)
    local f, err = load(code, "=" .. name, "t")
    if not f then error(err, 0) end
    cache[key] = f
    return f
end

local function run(fn, env)
    local buf, n = {}, 0
    local function put(...)
        for i = 1, select("#", ...) do
            n = n + 1
            buf[n] = (select(i, ...))
        end
    end
    local scope = setmetatable({}, {
        __index = function(_, k)
            if env ~= nil then
                local v = env[k]
                if v ~= nil then return v end
            end
            return G[k]
        end,
    })
    fn(scope, put, str)
    return table.concat(buf)
end

-- Renders text with env. origin ("file.lua:LINE", optional) names the template in errors: LINE is
-- the file line of the template's first line.
function M.render(text, env, origin)
    return run(compile(text, origin), env)
end

-- The position "file:line" of the code that called the function calling here (level 3). Uses
-- the position Lua's error() attaches, since the debug library is not available.
function M.here(level)
    local _, e = pcall(error, "", (level or 1) + 2)
    return (tostring(e):gsub(":?%s*$", ""))
end

-- Compiles a template now (syntax errors surface when the module loads) and returns a function
-- env -> string. Written as `local t = tpl.define [[` followed by a newline, the template's lines
-- are numbered as the file's lines in errors.
function M.define(text, origin)
    if origin == nil then
        local name, line = parse_origin(M.here(2))
        origin = name .. ":" .. (line + 1)
    end
    local fn = compile(text, origin)
    return function(env) return run(fn, env) end
end

-- Helpers for templates.

-- Keys of t in sorted order (pairs order is not deterministic between runs).
function M.sorted_keys(t)
    local ks = {}
    for k in pairs(t) do ks[#ks + 1] = k end
    table.sort(ks)
    return ks
end

-- Joins the results of f(v, i) over the array t with sep.
function M.map_join(t, sep, f)
    local out = {}
    for i, v in ipairs(t) do out[i] = f and f(v, i) or v end
    return table.concat(out, sep)
end

return M
