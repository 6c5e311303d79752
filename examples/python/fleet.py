#!/usr/bin/env python3
"""A projector fleet's member over monoseq's consumer groups, with Python's standard library.

Run one process per member, each with its own --member name, all with one --group: the group
spreads the partitions over the live members, and when one dies (SIGKILL included) its
partitions go to the others within its session timeout plus a second, delivered from the
group's committed position on. Each event processed is appended as one JSON line
(`{"member", "partition", "offset", "ws"}`) to --log and committed; an event processed but
not committed before a rebalance is delivered again (to this member or another): processing
must be idempotent, as `projector.py`'s is.

    python3 examples/python/fleet.py --url http://127.0.0.1:8080 --group orders-view \
        --member a --log a.jsonl [--session-timeout-ms 10000] [--idle-exit-s S]

The session is one Server-Sent Events stream (`GET /v1/groups/{g}/stream?member=M`):
`joined` names the session and how often to send a heartbeat (a thread does, to the same
node), `assigned` and `revoked` give and take partitions, `event` carries a partition's
event. A commit refused `409 stale_generation` means the partition was taken: stop
processing it. A lost stream or session is joined again after a pause, said once per outage.
"""

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from projector import PAUSE_S, request

STREAM_TIMEOUT_S = 30  # longest silence of a session's stream (it sends heartbeats meanwhile)


def messages(answer):
    """The SSE messages of an open stream: (event, data as JSON)."""
    event, data = "message", []
    for raw in answer:
        line = raw.decode().rstrip("\r\n")
        if line == "":
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def heartbeats(url, session, every_s, token, stop):
    """Sends the session's heartbeats until `stop` is set or the server no longer knows it."""
    while not stop.wait(every_s):
        status, _ = request(url, "POST", {"session": session}, token, timeout=every_s)
        if status == 409:
            return


class Member:
    def __init__(self, a):
        self.a = a
        self.base = a.url.rstrip("/")
        self.group = urllib.parse.quote(a.group, safe="")
        self.log = open(a.log, "a")
        self.processed = 0
        self.last_event = time.monotonic()
        self.joined = False  # a session was joined since the last outage

    def session(self):
        """One session, until its stream ends; True when the member should stop."""
        a = self.a
        url = (f"{self.base}/v1/groups/{self.group}/stream?member="
               f"{urllib.parse.quote(a.member, safe='')}&session_timeout_ms={a.session_timeout_ms}")
        r = urllib.request.Request(url, headers={"Accept": "text/event-stream"})
        if a.token:
            r.add_header("Authorization", "Bearer " + a.token)
        stop = threading.Event()
        try:
            with urllib.request.urlopen(r, timeout=STREAM_TIMEOUT_S) as answer:
                return self.follow(answer, stop)
        finally:
            stop.set()

    def follow(self, answer, stop):
        session, generation, held = None, 0, set()
        for event, data in messages(answer):
            if event == "joined":
                session = data["session"]
                self.joined = True
                every = data["heartbeat_ms"] / 1000
                hb = f"{self.base}/v1/groups/{self.group}/heartbeat"
                threading.Thread(target=heartbeats, daemon=True,
                                 args=(hb, session, every, self.a.token, stop)).start()
                print(f"{self.a.member}: joined as session {session}", flush=True)
            elif event == "assigned":
                generation = data["generation"]
                held |= {p["partition"] for p in data["partitions"]}
                print(f"{self.a.member}: given {sorted(held)}", flush=True)
            elif event == "revoked":
                generation = data["generation"]
                held -= set(data["partitions"])
                print(f"{self.a.member}: {data['partitions']} taken; holding {sorted(held)}",
                      flush=True)
            elif event == "event" and data["partition"] in held:
                self.process(data["partition"], data["event"])
                if not self.commit(session, generation, data["partition"],
                                   data["event"]["plog_offset"]):
                    held.discard(data["partition"])
            elif event == "session_ended":
                print(f"{self.a.member}: session ended ({data['reason']}): {data['message']}",
                      flush=True)
                return data["reason"] == "left"
            if self.idle():
                return True
        return False

    def process(self, partition, event):
        """The projection: one line per event processed (idempotent consumers dedupe here)."""
        line = {"member": self.a.member, "partition": partition,
                "offset": event["plog_offset"], "ws": event["ws"]}
        self.log.write(json.dumps(line) + "\n")
        self.log.flush()
        self.processed += 1
        self.last_event = time.monotonic()

    def commit(self, session, generation, partition, offset):
        """Commits one offset; False when the partition was taken (stale_generation)."""
        body = {"session": session, "generation": generation,
                "positions": [{"partition": partition, "offset": offset}]}
        status, answer = request(f"{self.base}/v1/groups/{self.group}/commit", "POST", body,
                                 self.a.token)
        if status == 409 and answer.get("code") == "stale_generation":
            print(f"{self.a.member}: partition {partition} was taken; not committed", flush=True)
            return False
        # No answer or a 503: the next commit of the partition carries a later offset.
        return True

    def idle(self):
        s = self.a.idle_exit_s
        return s is not None and time.monotonic() - self.last_event >= s


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--token", default=None)
    p.add_argument("--group", default="python-fleet")
    p.add_argument("--member", required=True)
    p.add_argument("--log", required=True, help="file the processed events are appended to")
    p.add_argument("--session-timeout-ms", type=int, default=10000)
    p.add_argument("--idle-exit-s", type=float, default=None,
                   help="leave and stop after this long without a new event")
    a = p.parse_args()
    member = Member(a)
    pause, said = PAUSE_S[0], False
    while True:
        try:
            if member.session():
                break
            why = "the session's stream closed"
        except urllib.error.HTTPError as e:
            if e.code != 503:
                sys.exit(f"{a.member}: joining failed: {e.code} {e.read().decode()}")
            why = f"503 {e.read().decode()}"
        except (urllib.error.URLError, OSError) as e:
            why = str(getattr(e, "reason", e))
        if member.idle():
            break
        if member.joined:
            member.joined, pause, said = False, PAUSE_S[0], False
        if not said:
            print(f"{a.member}: {why}; joining again", flush=True)
            said = True
        time.sleep(pause)
        pause = min(pause * 2, PAUSE_S[1])
    print(f"{a.member}: processed {member.processed} events", flush=True)


if __name__ == "__main__":
    main()
