-- POSTs the command of command.lua with a workspace kind the server does not declare: the
-- server reads, parses and checks it, then answers 400 before any partition sees it (what a
-- command costs up to its partition's queue).
local counter = 0
request = function()
  counter = counter + 1
  local ws = (counter * 7919) % 1000 + 1
  local body = '{"ws":' .. ws .. ',"ws_kind":9,"command":"bench.Cmd","create":[{"raw_id":1,"kind":"CDoc","name":"bench.Doc","fields":{"n":' .. ws .. '}}],"argument":{"raw_id":2,"name":"bench.Arg","fields":{"doc":{"$raw":1}}}}'
  return wrk.format("POST", "/v1/commands", {["Content-Type"]="application/json"}, body)
end
