-- POSTs batches of N commands (env BATCH, default 100) to /v1/commands/batch, spread over
-- 1000 workspaces. Each response carries N results; commands/s = requests/s × N.
local n = tonumber(os.getenv("BATCH") or "100")
local counter = 0
request = function()
  local items = {}
  for i = 1, n do
    counter = counter + 1
    local ws = (counter * 7919) % 1000 + 1
    items[i] = '{"ws":' .. ws .. ',"ws_kind":1,"command":"bench.Cmd","create":[{"raw_id":1,"kind":"CDoc","name":"bench.Doc","fields":{"n":' .. ws .. '}}],"argument":{"raw_id":2,"name":"bench.Arg","fields":{"doc":{"$raw":1}}}}'
  end
  local body = '{"commands":[' .. table.concat(items, ",") .. ']}'
  return wrk.format("POST", "/v1/commands/batch", {["Content-Type"]="application/json"}, body)
end
