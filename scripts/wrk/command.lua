-- POSTs one command per request to /v1/commands, spread over 1000 workspaces. WS_KIND sets
-- the workspace kind (default 1): an undeclared one (scripts/bench http-floor gives 9) has the
-- server read, parse and check each command, then answer 400 before any partition sees it.
local kind = os.getenv("WS_KIND") or "1"
local counter = 0
request = function()
  counter = counter + 1
  local ws = (counter * 7919) % 1000 + 1
  local body = '{"ws":' .. ws .. ',"ws_kind":' .. kind .. ',"command":"bench.Cmd","create":[{"raw_id":1,"kind":"CDoc","name":"bench.Doc","fields":{"n":' .. ws .. '}}],"argument":{"raw_id":2,"name":"bench.Arg","fields":{"doc":{"$raw":1}}}}'
  return wrk.format("POST", "/v1/commands", {["Content-Type"]="application/json"}, body)
end
