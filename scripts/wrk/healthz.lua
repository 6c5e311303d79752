-- GETs /healthz: a request the server answers without reading a body or touching a partition
-- (what HTTP costs the server before any command work).
request = function()
  return wrk.format("GET", "/healthz")
end
