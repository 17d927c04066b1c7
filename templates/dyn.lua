-- dyn: helpers shared by the templates for symbolic dims (docs/templates.md: ref.dyn).

local M = {}

-- The C expression (int) of r's run-time extent in dim d (1-based), or nil when static.
function M.ext(r, d) return r and r.dyn and r.dyn[d] or nil end

-- The first of r's dynamic dims (1-based) that is not in the set `allowed`, or nil.
function M.disallowed(r, allowed)
    for d = 1, 4 do
        if M.ext(r, d) and not allowed[d] then return d end
    end
    return nil
end

-- Lines declaring r1..r3, the coordinates of row `row` (a C variable) over rows of extents ne
-- (dims 2..4) whose run-time extents are dy.ext[d] where symbolic, and the coordinate names by
-- dim (nil for dims of extent 1).
function M.row_coords(ne, dy)
    local last = 1
    for d = 2, 4 do if ne[d] > 1 then last = d end end
    local lines, coords = {}, {}
    local sconst, sdyn = 1, {}
    for d = 2, 4 do
        if ne[d] > 1 then
            local f = {}
            if sconst > 1 then f[#f + 1] = sconst .. "u" end
            for _, x in ipairs(sdyn) do f[#f + 1] = x end
            local e = "row"
            if #f == 1 then e = e .. " / " .. f[1]
            elseif #f > 1 then e = e .. " / (" .. table.concat(f, " * ") .. ")" end
            if d < last then
                if #f > 0 then e = "(" .. e .. ")" end
                e = e .. " % " .. (dy.ext[d] or (ne[d] .. "u"))
            end
            lines[#lines + 1] = string.format("const unsigned r%d = %s;", d - 1, e)
            coords[d] = "r" .. (d - 1)
        end
        if dy.ext[d] then sdyn[#sdyn + 1] = dy.ext[d] else sconst = sconst * ne[d] end
    end
    return lines, coords
end

return M
