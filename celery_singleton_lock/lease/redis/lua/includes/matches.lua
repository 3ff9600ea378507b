-- Whether a token has a given shape: starts with `prefix` and ends with `suffix`.
-- Shared by acquire.lua and release_matching.lua; not a script by itself.
local function matches(value, prefix, suffix)
  return type(value) == 'string' and #value >= #prefix + #suffix
    and string.sub(value, 1, #prefix) == prefix
    and string.sub(value, #value - #suffix + 1) == suffix
end
