"""The web console in a real browser: Debian's chromium, headless, driven by Playwright for
Python, against servers that `tests/console.rs` started. Never downloads a browser.

Environment (set by tests/console.rs):
  CONSOLE_MODE      "single" (one embedded server) or "cluster" (three nodes on PostgreSQL)
  CONSOLE_URL       the node whose console is opened
  CONSOLE_WRITE, CONSOLE_READ   tokens
  CONSOLE_PARTITIONS            partition count
  CONSOLE_PID       (single) the server's pid, killed to check the "node down" message
  CONSOLE_RESTART   (single) JSON argv that starts the server again on the same address
  CONSOLE_NODES     (cluster) JSON {node_id: pid}
  CONSOLE_BACKUP    (gap) JSON argv of `monoseq backup` into a directory under --backup-root
  CONSOLE_RESTORE   (gap) JSON argv that starts the server on that backup, same address
  CONSOLE_SHOTS     a directory for screenshots of each view (optional)

Prints one line per check and per figure; exits non-zero on the first failed check.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
URL = os.environ["CONSOLE_URL"]
WRITE = os.environ["CONSOLE_WRITE"]
READ = os.environ["CONSOLE_READ"]
PARTITIONS = int(os.environ.get("CONSOLE_PARTITIONS", "4"))
SHOTS = os.environ.get("CONSOLE_SHOTS")
FIRST_LOAD_MAX = 300_000
LIVE_WINDOW = 200
PASSED = []


def check(name, ok, detail=""):
    if not ok:
        print(f"FAILED: {name}: {detail}", flush=True)
        sys.exit(1)
    PASSED.append(name)
    print(f"ok: {name}{': ' + detail if detail else ''}", flush=True)


def figure(name, value):
    print(f"figure: {name} = {value}", flush=True)


def api(method, path, token, body=None, url=URL):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.startswith(("{", "[")) else text)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def command(ws, fields):
    return {"ws": ws, "ws_kind": 1, "command": "test.Create",
            "create": [{"raw_id": 1, "kind": "CDoc", "name": "test.Doc", "fields": fields}]}


def submit(ws, fields, url=URL):
    status, body = api("POST", "/v1/commands", WRITE, command(ws, fields), url)
    assert status == 200, (status, body)
    return body


def wait_for(page, expression, arg=None, timeout=10_000):
    """Polls `expression` (a function of `arg`) in the page until it is true; page.evaluate
    runs outside the console's content security policy, which refuses Playwright's own
    wait_for_function."""
    deadline = time.monotonic() + timeout / 1000
    while True:
        if page.evaluate(expression, arg):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {timeout} ms: {expression}")
        time.sleep(0.01)


def shot(page, name):
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, f"console-{name}.png"), full_page=False)


def login(page, token):
    page.goto(URL + "/ui/")
    page.wait_for_selector("#login", timeout=10_000)
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#cluster table", timeout=10_000)


def new_page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    return context, page


# ------------------------------------------------------------------------- single server

def first_load_and_login(browser):
    context, page = new_page(browser)
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    moved = {"bytes": 0}
    cdp.on("Network.loadingFinished", lambda e: moved.__setitem__("bytes", moved["bytes"] + e["encodedDataLength"]))
    encodings = {}
    page.on("response", lambda r: encodings.__setitem__(r.url.split("/")[-1], r.headers.get("content-encoding")))
    page.goto(URL + "/ui/")
    page.wait_for_selector("#login", timeout=10_000)
    check("no token: the login view, not data", page.locator("#cluster").count() == 0
          and page.locator("#login input#token").count() == 1, page.inner_text("#main")[:200])
    status, _ = api("GET", "/v1/cluster", None)
    check("no token: the API answers 401", status == 401, str(status))
    shot(page, "login")
    page.fill("#token", WRITE)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#cluster table", timeout=10_000)
    page.wait_for_timeout(300)
    figure("first load, login and cluster view, bytes transferred", moved["bytes"])
    check("first load at most 300 KB", moved["bytes"] <= FIRST_LOAD_MAX, f"{moved['bytes']} bytes")
    check("the script is sent gzip-compressed", encodings.get("app.js") == "gzip", str(encodings))
    rows = page.locator("#cluster tbody tr").count()
    check("the cluster view lists the partitions", rows >= PARTITIONS, f"{rows} rows")
    shot(page, "cluster")
    return context, page


def escaped(page):
    hostile = "<script>window.__xss=1</script><img src=x onerror=\"window.__xss=2\">"
    out = submit(1, {"note": hostile})
    page.goto(f"{URL}/ui/#/partition/{out['partition']}/{out['plog_offset']}")
    page.wait_for_selector("#events table", timeout=10_000)
    text = page.inner_text("#events")
    check("an event holding <script> shows it as text", "<script>window.__xss=1</script>" in text, text[:300])
    check("and runs nothing", page.evaluate("window.__xss === undefined")
          and page.locator("#events script, #events img").count() == 0)
    shot(page, "partition")


def live_within_a_second(page):
    p = 2
    page.goto(f"{URL}/ui/#/partition/{p}/live")
    wait_for(page, "document.getElementById('live-status') && "
                           "document.getElementById('live-status').textContent.startsWith('following live')",
                           timeout=10_000)
    out = submit(p, {"live": 1})
    acked = time.monotonic()
    wait_for(page, 
        "(o) => [...document.querySelectorAll('#live tbody tr td:first-child')].some((td) => td.textContent === String(o))",
        arg=out["plog_offset"], timeout=1_000)
    check("a command submitted over HTTP appears in the live view within a second", True,
          f"{(time.monotonic() - acked) * 1000:.0f} ms after its answer")


LIVE_RATE = 2_000          # events/s the live view must keep up with
LIVE_SECONDS = 5           # how long the load offers them


def keeps_up(page):
    """At least 2 000 events/s for 5 s into the followed partition, in batches: the view gets
    every one (its count, and its next offset at the partition's end) and keeps its window."""
    p = 3
    page.goto(f"{URL}/ui/#/partition/{p}/live")
    wait_for(page, "document.getElementById('live-status').textContent.startsWith('following live')",
                           timeout=10_000)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")

    def heap():
        cdp.send("HeapProfiler.collectGarbage")
        return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}["JSHeapUsedSize"]

    before = heap()
    # 25 % above the figure, on a schedule that answers cannot slow: one sender per batch,
    # each sending when it is due, so that what is offered does not wait for what is written.
    per_batch = 250
    batches = LIVE_RATE * 5 // 4 * LIVE_SECONDS // per_batch
    sent, lock = {"n": 0, "refused": 0, "busy": 0, "at": []}, threading.Lock()
    started = time.monotonic()

    def load(i):
        time.sleep(max(0.0, started + i * LIVE_SECONDS / batches - time.monotonic()))
        commands = [command(p + PARTITIONS * (i * per_batch + k + 1), {"k": k}) for k in range(per_batch)]
        with lock:
            sent["at"].append(time.monotonic())
        # A command answered 503 (busy: the partition's queue is full) wrote nothing: it is
        # sent again after its Retry-After, as a client would, at most 10 times.
        for _ in range(10):
            try:
                status, answer = api("POST", "/v1/commands/batch", WRITE, {"commands": commands})
            except OSError:  # unanswered within the client's timeout: whether it ran is unknown
                break
            if status != 200:
                break
            again = [c for c, r in zip(commands, answer["results"]) if r["status"] == 503]
            with lock:
                sent["n"] += sum(1 for r in answer["results"] if r["status"] == 200)
                sent["busy"] += len(again)
            commands = again
            if not commands:
                break
            time.sleep(max(r.get("retry_after", 1) for r in answer["results"] if r["status"] == 503))
        with lock:
            sent["refused"] += len(commands)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(batches)]
    for t in threads:
        t.start()
    peak = before
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        peak = max(peak, heap())
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    # Offered: the events sent per second of sending (the last batch's second counted whole).
    sending = max(sent["at"]) - min(sent["at"]) + LIVE_SECONDS / batches
    offered = batches * per_batch / sending
    _, end = api("GET", f"/v1/partitions/{p}/events?from=end", READ)
    end = end["end"]
    wait_for(page, "(e) => document.getElementById('live-status').textContent.includes(`next offset ${e};`)",
             arg=end, timeout=20_000)
    after = heap()
    got = page.evaluate("document.getElementById('live-status').textContent")
    rows = page.locator("#live tbody tr").count()
    figure("live view: events offered per second (sent, in batches)",
           f"{offered:.0f} ({batches * per_batch} in {sending:.2f} s, {batches} batches of {per_batch})")
    figure("live view: events written per second (first batch sent to last answer)",
           f"{sent['n'] / seconds:.0f} ({sent['n']} in {seconds:.2f} s)")
    figure("live view: commands answered busy and sent again", sent["busy"])
    figure("live view: JS heap before, peak, after (MB)", f"{before / 1e6:.1f}, {peak / 1e6:.1f}, {after / 1e6:.1f}")
    figure("live view status", got)
    check("the load offered at least 2 000 events/s", offered >= LIVE_RATE and sent["refused"] == 0,
          f"{offered:.0f} events/s, {sent['refused']} refused")
    received = int(got.split(":")[1].split("events")[0].strip()) if "events received" in got else 0
    check("the live view received every event offered, up to the partition's end",
          received >= sent["n"], f"{received} of {sent['n']}, end {end}")
    check("the live view keeps a bounded window", rows == LIVE_WINDOW, f"{rows} rows")
    check("the tab's heap stays bounded under 2 000 events/s", peak - before < 32e6 and after < 64e6,
          f"before {before / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB")


def consumers_view(browser, page):
    """A consumer's lag is shown and falls as it reads. Where the server lists its consumers
    (GET /v1/consumers), a write token also gets a delete button and a read token none; else
    the consumer is named in the view and its positions read by name."""
    name = "console-test"
    p = 1
    for _ in range(5):
        submit(p, {"for": "lag"})
    status, _ = api("PUT", f"/v1/consumers/{name}/partitions/{p}", WRITE, {"offset": 1})
    check("a consumer position is stored", status in (200, 204), str(status))
    listed = api("GET", "/v1/consumers", READ)[0] != 404
    page.goto(f"{URL}/ui/#/consumers")
    if not listed:
        print("note: GET /v1/consumers is not on this server: the consumer is named in the view",
              flush=True)
        page.wait_for_selector("#consumer-form:not([hidden])", timeout=10_000)
        page.fill("#consumer-name", name)
        page.click("#consumer-form button")
    cell = f"td.lag[data-consumer='{name}'][data-partition='{p}']"
    page.wait_for_selector(cell, timeout=10_000)
    first = int(page.inner_text(cell))
    check("a consumer's lag is shown", first > 0, str(first))
    status, _ = api("PUT", f"/v1/consumers/{name}/partitions/{p}", WRITE,
                    {"offset": first, "expected": 1})
    check("the consumer reads on", status in (200, 204), str(status))
    wait_for(page, f"(f) => Number(document.querySelector(\"{cell}\").textContent) < f",
             arg=first, timeout=5_000)
    check("and its lag falls as it reads", True, f"{first} -> {page.inner_text(cell)}")
    shot(page, "consumers")
    if not listed:
        return
    check("a write token sees the delete button",
          page.locator(f"button[data-consumer='{name}']").count() == 1)
    context, reader = new_page(browser)
    login(reader, READ)
    reader.goto(f"{URL}/ui/#/consumers")
    reader.wait_for_selector(cell, timeout=10_000)
    check("a read token sees no delete button", reader.locator("button.danger").count() == 0)
    context.close()
    button = page.locator(f"button[data-consumer='{name}']")
    button.click()
    # The view is drawn again every second: the arming must outlive the button
    # that was clicked, or a redraw between the two clicks swallows the delete.
    button.evaluate("(b) => { b.dataset.drawn = 'before'; }")
    wait_for(page, "(n) => { const b = document.querySelector(`button[data-consumer='${n}']`);"
             " return b && b.dataset.drawn !== 'before'; }", arg=name, timeout=5_000)
    check("the first click's arming survives a redraw",
          button.inner_text().startswith("Really delete"), button.inner_text())
    button.click()
    wait_for(page, "(n) => !document.querySelector(`button[data-consumer='${n}']`) || "
             "document.querySelector(`button[data-consumer='${n}']`).textContent === 'deleted'",
             arg=name, timeout=5_000)
    _, listing = api("GET", "/v1/consumers", READ)
    check("a write token deletes the consumer from the view (asked twice)",
          all(c["name"] != name for c in listing["consumers"]), str(listing)[:300])


def read_token_refused(browser):
    status, body = api("DELETE", "/v1/consumers/console-test", READ)
    check("the API refuses a read token's delete", status == 403, f"{status} {body}")
    context, page = new_page(browser)
    login(page, READ)
    page.goto(f"{URL}/ui/#/consumers")
    page.wait_for_selector("#consumers", timeout=10_000)
    page.wait_for_timeout(1_200)
    check("a read token's consumers view has no delete button", page.locator("button.danger").count() == 0)
    context.close()


def other_views(page):
    out = submit(5, {"view": "workspace"})
    page.goto(f"{URL}/ui/#/workspace/5")
    page.wait_for_selector("#wlog table", timeout=10_000)
    page.fill("#record-id", str(min(int(v) for v in out["ids"].values())))
    page.click("#record-id ~ button")
    page.wait_for_selector("#record pre", timeout=10_000)
    check("the workspace view shows its WLog and a record", "test.Doc" in page.inner_text("#record"))
    shot(page, "workspace")
    api("POST", "/v1/sequences/console/orders/next", WRITE, {})
    page.goto(f"{URL}/ui/#/sequences")
    page.fill("#sequence", "console/orders")
    page.click("#sequence ~ button")
    wait_for(page, "document.getElementById('sequence-values').textContent.includes('console/orders')",
                           timeout=5_000)
    shot(page, "sequences")
    page.goto(f"{URL}/ui/#/health")
    page.wait_for_selector("#health table", timeout=10_000)
    page.wait_for_timeout(2_200)
    p50 = page.inner_text("td[data-latency='commands (ok)']")
    check("the health view shows p50 from the histograms", p50 not in ("—", ""), p50)
    if api("GET", "/v1/info", READ)[1]["storage"] == "embedded":
        engine = page.inner_text("#engine-memtables")
        shown = re.fullmatch(r"\d+\.\d [KM]iB, \d+ waiting for their flush", engine)
        check("the health view shows the embedded engine's memtables", shown, engine)
    shot(page, "health")


def node_down_and_back(page):
    pid = int(os.environ["CONSOLE_PID"])
    restart = json.loads(os.environ["CONSOLE_RESTART"])
    page.goto(f"{URL}/ui/#/cluster")
    page.wait_for_selector("#cluster table", timeout=10_000)
    os.kill(pid, signal.SIGKILL)
    page.wait_for_selector("#banner:not([hidden])", timeout=6_000)
    banner = page.inner_text("#banner")
    check("a node down shows a clear message", "Node unreachable" in banner, banner)
    check("and not a blank screen", page.locator("#cluster table").count() == 1)
    shot(page, "node-down")
    log = tempfile.TemporaryFile()
    child = subprocess.Popen(restart, stdout=subprocess.DEVNULL, stderr=log)
    try:
        try:
            page.wait_for_selector("#banner[hidden]", state="attached", timeout=30_000)
        except Exception:
            log.seek(0)
            print(f"the restarted server's log:\n{log.read().decode()[-3000:]}", flush=True)
            raise
        page.wait_for_selector("#cluster table", timeout=10_000)
        check("the console recovers when the node is back", True)
    finally:
        child.kill()
        child.wait()


def single():
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            context, page = first_load_and_login(browser)
            escaped(page)
            live_within_a_second(page)
            other_views(page)
            read_token_refused(browser)
            consumers_view(browser, page)
            keeps_up(page)
            node_down_and_back(page)
        finally:
            browser.close()


# ------------------------------------------------------------------------- a gap

def rows_of(page, box):
    """The rows of the events table in `box`: [offset cell, class, text]."""
    return page.evaluate("(box) => [...document.querySelectorAll(`#${box} tbody tr`)].map((tr) =>"
                         " [tr.cells[0].textContent, tr.className, tr.textContent])", box)


def ready():
    try:
        return api("GET", "/readyz", READ)[0] == 200
    except OSError:
        return False


def gap():
    """Numbers lost with a restore are a gap: the live view, whose node is killed and started
    again on a backup taken before its last events, shows the retired offsets as one gap row
    when it resumes, and a page read shows the gap in its place between the events."""
    pid = int(os.environ["CONSOLE_PID"])
    p, ws = 1, 1
    deadline = time.monotonic() + 30
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{URL} not ready within 30 s")
        time.sleep(0.1)
    for i in range(5):
        submit(ws, {"before_backup": i})
    out = subprocess.run(json.loads(os.environ["CONSOLE_BACKUP"]), capture_output=True, text=True)
    check("a backup of the partition's first 5 events", out.returncode == 0, out.stderr[-500:])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        log = tempfile.TemporaryFile()
        child = None
        try:
            _, page = new_page(browser)
            login(page, READ)
            page.goto(f"{URL}/ui/#/partition/{p}/live")
            wait_for(page, "document.getElementById('live-status').textContent.startsWith('following live')")
            lost = [submit(ws, {"lost_with_the_restore": i})["plog_offset"] for i in range(3)]
            wait_for(page, "(o) => [...document.querySelectorAll('#live tbody tr td:first-child')]"
                     ".some((td) => td.textContent === String(o))", arg=lost[-1])
            os.kill(pid, signal.SIGKILL)
            # The killed server's socket closes once it is gone: until then a start on its
            # address would be refused.
            deadline = time.monotonic() + 10
            while ready() and time.monotonic() < deadline:
                time.sleep(0.05)
            child = None
            for _ in range(20):
                child = subprocess.Popen(json.loads(os.environ["CONSOLE_RESTORE"]),
                                         stdout=subprocess.DEVNULL, stderr=log)
                try:
                    child.wait(timeout=0.5)  # a refused start ends at once
                except subprocess.TimeoutExpired:
                    break
            deadline = time.monotonic() + 30
            while True:
                try:
                    after = submit(ws, {"after_the_restore": 1})["plog_offset"]
                    break
                except (OSError, AssertionError):
                    if time.monotonic() > deadline or child.poll() is not None:
                        log.seek(0)
                        print(f"the restored server's log:\n{log.read().decode()[-3000:]}", flush=True)
                        raise
                    time.sleep(0.2)
            check("the restored server skips the lost numbers", after > lost[-1] + 1,
                  f"lost {lost}, next event {after}")
            wait_for(page, "(o) => [...document.querySelectorAll('#live tbody tr td:first-child')]"
                     ".some((td) => td.textContent === String(o))", arg=after, timeout=30_000)
            live = rows_of(page, "live")
            gaps = [r for r in live if r[1] == "gap"]
            check("the live view shows the retired offsets as one gap row", len(gaps) == 1
                  and gaps[0][0].endswith(f"–{after - 1}") and "hold no events (restore)" in gaps[0][2],
                  str([f"{r[0]} {r[1]}" for r in live[:6]]))
            check("and the event after it", live[0][0] == str(after) and live[1][1] == "gap",
                  str([f"{r[0]} {r[1]}" for r in live[:3]]))
            page.goto(f"{URL}/ui/#/partition/{p}/1")
            wait_for(page, "document.getElementById('live') === null && "
                     "document.querySelector('#events tbody tr td') !== null")
            paged = rows_of(page, "events")
            want = [str(o) for o in range(1, 6)] + [f"{lost[0]}–{after - 1}", str(after)]
            check("a page shows the events, the gap in its place, and the event after it",
                  [r[0] for r in paged] == want and paged[5][1] == "gap"
                  and f"gap: offsets {lost[0]} to {after - 1} hold no events (restore)" in paged[5][2],
                  str([r[0] for r in paged]))
            page.goto(f"{URL}/ui/#/partition/{p}/5")
            wait_for(page, "document.querySelector('#events tbody tr td') !== null && "
                     "document.querySelector('#events tbody tr td').textContent === '5'")
            shot(page, "partition-gap")
        finally:
            browser.close()
            if child is not None:
                child.kill()
                child.wait()


# ------------------------------------------------------------------------- three nodes

def cluster():
    nodes = json.loads(os.environ["CONSOLE_NODES"])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            _, page = new_page(browser)
            login(page, READ)
            wait_for(page, 
                "document.querySelectorAll('#cluster td[data-owner-of]').length > 0 && "
                "[...document.querySelectorAll('#cluster td[data-owner-of]')].every((td) => td.textContent !== '—')",
                timeout=20_000)
            owners = page.evaluate("Object.fromEntries([...document.querySelectorAll('#cluster td[data-owner-of]')]"
                                   ".map((td) => [td.dataset.ownerOf, td.textContent]))")
            shot(page, "cluster-three-nodes")
            here = [n for n in nodes if n != "n1"]
            victim = next(n for n in here if n in owners.values())
            moved = [p for p, o in owners.items() if o == victim]
            os.kill(nodes[victim], signal.SIGKILL)
            killed = time.monotonic()
            wait_for(page, 
                "([ps, v]) => ps.every((p) => { const td = document.querySelector(`#cluster td[data-owner-of='${p}']`);"
                " return td && td.textContent !== v && td.textContent !== '—'; })",
                arg=[moved, victim], timeout=30_000)
            after = page.evaluate("Object.fromEntries([...document.querySelectorAll('#cluster td[data-owner-of]')]"
                                  ".map((td) => [td.dataset.ownerOf, td.textContent]))")
            check("the cluster view shows a new owner after the old owner is SIGKILLed", True,
                  f"{victim}'s partitions {moved} now {[after[p] for p in moved]}, "
                  f"{time.monotonic() - killed:.1f} s after the kill")
            shot(page, "cluster-after-kill")
        finally:
            browser.close()


if __name__ == "__main__":
    if os.environ.get("CONSOLE_MODE") == "cluster":
        cluster()
    elif os.environ.get("CONSOLE_MODE") == "gap":
        gap()
    else:
        single()
    print(f"console browser checks: {len(PASSED)} passed", flush=True)
