#!/usr/bin/env python3
"""A projector over monoseq's log, with Python's standard library alone.

Follows one partition's PLog in order (long-polling page reads: `wait_ms`), applies each
event to a small projection (events and records created per workspace, in a JSON file), and
keeps its consumer position on the server with compare-and-set, so a restart resumes exactly
after the last event it applied, and two copies of it never both advance the same position.
Gaps (numbers retired by an operator's accepted loss) are skipped explicitly.

    python3 examples/python/projector.py --url http://127.0.0.1:8080 --partition 0 \
        --consumer orders-view --state view.json [--max-events N] [--idle-exit-s S]

The projection is saved before the position is stored: after a crash between the two, the
events since the stored position are applied again, so `apply` is idempotent (it keeps the
last PLog offset applied per workspace and skips what it has seen). A server that does not
answer, or answers 503 (restarting, a partition moving between nodes), is asked again after a
pause, said once per outage; a position write whose answer was lost is sent again, and a 409
that shows the lost write's own offset counts as stored.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

PAGE = 500          # entries per page read
WAIT_MS = 1000      # long poll: how long an empty page waits for an event
PAUSE_S = (0.1, 5)  # pause after a failed request: first, longest (doubling between)


class Conflict(Exception):
    """Another copy of this consumer stored a position first."""


def request(url, method="GET", body=None, token=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    r = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        r.add_header("Content-Type", "application/json")
    if token:
        r.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(r, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as answer:
        return answer.code, json.loads(answer.read() or b"null")
    except (urllib.error.URLError, OSError) as e:
        return None, str(getattr(e, "reason", e))  # no answer: refused, reset, timed out


def patiently(url, method="GET", body=None, token=None):
    """`request`, asked again while the server does not answer or answers 503."""
    pause, said = PAUSE_S[0], False
    while True:
        status, answer = request(url, method, body, token)
        if status is not None and status != 503:
            if said:
                print("the server answers again", flush=True)
            return status, answer
        if not said:
            why = answer if status is None else f"503 {answer.get('code')}"
            print(f"no answer from {url} ({why}); asking again", flush=True)
            said = True
        time.sleep(pause)
        pause = min(pause * 2, PAUSE_S[1])


def load(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"workspaces": {}, "events": 0}


def save(path, view):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(view, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def apply(view, event):
    """The projection: per workspace, events seen and records created (idempotent)."""
    ws = view["workspaces"].setdefault(str(event["ws"]), {"events": 0, "created": 0, "last": 0})
    if event["plog_offset"] <= ws["last"]:
        return
    ws["events"] += 1
    ws["created"] += len(event["created"])
    ws["last"] = event["plog_offset"]
    view["events"] += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--token", default=None)
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--consumer", default="python-projector")
    p.add_argument("--state", default="projection.json")
    p.add_argument("--max-events", type=int, default=None, help="stop after this many events")
    p.add_argument("--idle-exit-s", type=float, default=None,
                   help="stop after this long without a new event")
    a = p.parse_args()
    base = a.url.rstrip("/")
    position_url = (f"{base}/v1/consumers/{urllib.parse.quote(a.consumer, safe='')}"
                    f"/partitions/{a.partition}")

    status, body = patiently(position_url, token=a.token)
    stored = body["offset"] if status == 200 else None
    if status not in (200, 404):
        sys.exit(f"reading the position failed: {status} {body}")
    view = load(a.state)
    next_offset = (stored or 0) + 1
    print(f"resuming partition {a.partition} at offset {next_offset}", flush=True)

    applied, idle = 0, 0.0
    while a.max_events is None or applied < a.max_events:
        page_url = (f"{base}/v1/partitions/{a.partition}/events?from={next_offset}"
                    f"&limit={PAGE}&wait_ms={WAIT_MS}")
        status, page = patiently(page_url, token=a.token)
        if status != 200:
            sys.exit(f"reading the partition failed: {status} {page}")
        entries = page["events"]
        if a.max_events is not None:
            entries = entries[: a.max_events - applied]
        if not entries:
            idle += WAIT_MS / 1000
            if a.idle_exit_s is not None and idle >= a.idle_exit_s:
                break
            continue
        idle = 0.0
        for entry in entries:
            if "gap" in entry:
                gap = entry["gap"]
                print(f"gap {gap['from']}..{gap['to']} ({gap['reason']}): nothing there", flush=True)
                next_offset = gap["to"] + 1
                continue
            apply(view, entry)
            applied += 1
            next_offset = entry["plog_offset"] + 1
        save(a.state, view)
        body = {"offset": next_offset - 1}
        if stored is not None:
            body["expected"] = stored
        status, answer = patiently(position_url, "PUT", body, token=a.token)
        if status == 409 and answer.get("current") != body["offset"]:
            raise Conflict(f"another copy of consumer {a.consumer} stored {answer.get('current')}")
        # (A 409 naming this very offset: an earlier attempt was stored, its answer lost.)
        if status not in (200, 409):
            sys.exit(f"storing the position failed: {status} {answer}")
        stored = next_offset - 1

    print(f"applied {applied} events; position {stored}; "
          f"{view['events']} events in the projection", flush=True)


if __name__ == "__main__":
    main()
