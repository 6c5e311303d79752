#!/usr/bin/env python3
"""Talk to a monoseq server with Python's standard library alone.

Submits commands with an Idempotency-Key, retrying as the API asks (a 503 after its
Retry-After, a lost connection at once, always with the same key, so a command is applied at
most once), reads them back (the event, the workspace's WLog, a record), and takes numbers of
a named sequence. The API is described in docs/openapi.json (also GET /v1/openapi.json).

    python3 examples/python/monoseq_example.py --url http://127.0.0.1:8080 [--token T]

Exits 0 when everything read back is what was written.
"""

import argparse
import json
import random
import sys
import time
import urllib.error
import urllib.request
import uuid

RETRY_FOR_S = 30.0  # bound on all the attempts of one call
BACKOFF_FIRST_S = 0.02
BACKOFF_MAX_S = 2.0


class ApiError(Exception):
    """The server refused the request: its status and stable code."""

    def __init__(self, status, body):
        self.status = status
        self.code = body.get("code", "?")
        super().__init__(f"HTTP {status} {self.code}: {body.get('message', '')}")


class Monoseq:
    def __init__(self, url, token=None, timeout_s=10.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _once(self, method, path, body=None, key=None):
        """One attempt: (status, headers, decoded JSON body or None)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Idempotency-Key", key)
        if self.token:
            request.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return answer.status, answer.headers, _json(answer.read())
        except urllib.error.HTTPError as answer:
            return answer.code, answer.headers, _json(answer.read())

    def call(self, method, path, body=None, key=None):
        """Retries a 503 after Retry-After (plus jitter) and a lost connection, within
        RETRY_FOR_S; answers the body of a success, None for a 204 or 404 not_found."""
        started = time.monotonic()
        failures = 0
        while True:
            try:
                status, headers, answer = self._once(method, path, body, key)
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                # No answer: the command may have been applied; the same key makes the
                # retry safe.
                status, headers, answer, error = None, {}, None, e
            else:
                error = None
                if 200 <= status < 300:
                    return answer
                if status == 404 and answer and answer.get("code") in ("not_found", "unknown_record"):
                    return None
                if status != 503:
                    raise ApiError(status, answer or {})
                error = ApiError(status, answer or {})
            failures += 1
            floor = float(headers.get("Retry-After", "0") or 0) if status == 503 else 0.0
            ceiling = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (failures - 1))
            wait = floor + random.uniform(0, ceiling)
            if time.monotonic() - started + wait > RETRY_FOR_S:
                raise error
            time.sleep(wait)

    def submit(self, command, key=None):
        """A command with its own key (kept for every retry): the answer and the key."""
        key = key or "py-" + uuid.uuid4().hex
        return self.call("POST", "/v1/commands", command, key), key


def _json(raw):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--token", default=None, help="a write token, if the server has tokens")
    parser.add_argument("--ws", type=int, default=42, help="the workspace to write in")
    args = parser.parse_args()
    api = Monoseq(args.url, args.token)

    info = api.call("GET", "/v1/info")
    print(f"server {info['version']}: {info['partitions']} partitions, storage {info['storage']}")

    order = {
        "ws": args.ws, "ws_kind": 1, "command": "shop.CreateOrder",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "shop.Order", "fields": {"total": 25}}],
        "argument": {"raw_id": 2, "name": "shop.OrderArg", "fields": {"order": {"$raw": 1}}},
    }
    first, key = api.submit(order)
    order_id = first["ids"]["1"]
    print(f"order {order_id}: partition {first['partition']}, PLog offset {first['plog_offset']}, "
          f"WLog offset {first['wlog_offset']}")

    # The same key again, as after a lost answer: the original answer, nothing written twice.
    again, _ = api.submit(order, key)
    assert again == first, (again, first)

    pay = {"ws": args.ws, "ws_kind": 1, "command": "shop.Pay",
           "update": [{"id": order_id, "fields": {"paid": True}}]}
    paid, _ = api.submit(pay)

    event = api.call("GET", f"/v1/partitions/{first['partition']}/events/{first['plog_offset']}")
    assert event["idempotency_key"] == key and event["command"] == "shop.CreateOrder", event
    record = api.call("GET", f"/v1/workspaces/{args.ws}/records/{order_id}")
    assert record["fields"] == {"total": 25, "paid": True}, record
    wlog = api.call("GET", f"/v1/workspaces/{args.ws}/wlog?from={first['wlog_offset']}&limit=10")
    commands = [e["command"] for e in wlog["events"]]
    assert commands == ["shop.CreateOrder", "shop.Pay"], commands
    assert wlog["events"][1]["wlog_offset"] == paid["wlog_offset"]
    print(f"read back: the event, the record {record['fields']}, the WLog {commands}")

    name = f"/v1/sequences/shop/invoice-{uuid.uuid4().hex[:8]}"
    invoice = api.call("POST", name + "/next", {"initial": 1000})["value"]
    block = api.call("POST", name + "/next", {"increment": 10})["value"]
    assert (invoice, block) == (1000, 1001), (invoice, block)
    print(f"invoice number {invoice}; then the block {block}..{block + 9}")
    missing = api.call("GET", f"/v1/partitions/{first['partition']}/events/999999")
    assert missing is None
    print("ok")


if __name__ == "__main__":
    try:
        main()
    except (ApiError, AssertionError, OSError) as e:
        print(f"monoseq example failed: {e!r}", file=sys.stderr)
        sys.exit(1)
