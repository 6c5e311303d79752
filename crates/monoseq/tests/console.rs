//! The web console (`/ui`) in a real browser: `tests/console/browser.py` drives Debian's
//! `chromium` headless with Playwright for Python against servers started here (one on the
//! embedded store; three nodes on PostgreSQL), and fails on the first check that does not
//! hold. `scripts/test` installs chromium and playwright when they are missing.

mod common;
mod security;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::node::Node;
use common::{AnswerLog, BIN, Backend, free_port};
use security::{READ, WRITE, both_tokens};

const CHROMIUM: &str = "/usr/bin/chromium";
const PARTITIONS: &str = "4";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/browser.py")
}

/// One browser run at a time: two at once would share the machine's CPU and slow each.
static BROWSER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the browser script with `env`; panics with its output when a check failed.
fn browse(env: &[(&str, String)]) -> String {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: scripts/test installs it (apt-get install chromium)"
    );
    let mut command = Command::new("python3");
    command
        .arg(script())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    if let Ok(dir) = std::env::var("CONSOLE_SHOTS") {
        command.env("CONSOLE_SHOTS", dir);
    }
    let out = command.output().expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the browser checks failed:\n{text}");
    println!("{text}");
    text
}

/// A server the browser script is told of by its PID: killed when dropped, also when a check
/// fails and the test unwinds.
struct Spawned(std::process::Child);

impl Spawned {
    /// `argv` (from [`serve_argv`]) started, its output dropped.
    fn serve(argv: &[String]) -> Spawned {
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn monoseq serve");
        Spawned(child)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `monoseq serve` as the browser script starts it again after killing it: same data, same
/// address, same answer log.
fn serve_argv(dir: &Path, port: u16, tokens: &Path, log: &Path) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        "env".into(),
        format!("MONOSEQ_ANSWER_LOG={}", log.display()),
        BIN.into(),
        "serve".into(),
        "--data-dir".into(),
    ];
    argv.push(dir.display().to_string());
    for a in [
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--partitions",
        PARTITIONS,
        "--tokens-file",
        &tokens.display().to_string(),
    ] {
        argv.push(a.to_owned());
    }
    argv
}

#[test]
fn the_console_in_a_browser_shows_live_events_escapes_values_and_survives_its_node_going_down() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = both_tokens(dir.path());
    let data = dir.path().join("data");
    let port = free_port();
    let answers = AnswerLog::new();
    let argv = serve_argv(&data, port, &tokens, &answers.path());
    let server = Spawned::serve(&argv);
    let url = format!("http://127.0.0.1:{port}");
    let out = browse(&[
        ("CONSOLE_MODE", "single".into()),
        ("CONSOLE_URL", url),
        ("CONSOLE_WRITE", WRITE.into()),
        ("CONSOLE_READ", READ.into()),
        ("CONSOLE_PARTITIONS", PARTITIONS.into()),
        ("CONSOLE_PID", server.0.id().to_string()),
        ("CONSOLE_RESTART", serde_json::to_string(&argv).unwrap()),
    ]);
    drop(server);
    assert!(out.contains("passed"), "{out}");
    answers.assert_conforms();
}

/// An admin token of the gap test's server (backups are administration).
const ADMIN: &str = "admin-token-0123456789abcdef-A1";

#[test]
fn numbers_lost_with_a_restore_show_as_a_gap_in_the_live_view_and_in_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = security::tokens_file(
        dir.path(),
        &format!("write {WRITE}\nread {READ}\nadmin {ADMIN}\n"),
    );
    let (live, backup) = (dir.path().join("live"), dir.path().join("backup"));
    let port = free_port();
    let answers = AnswerLog::new();
    let mut argv = serve_argv(&live, port, &tokens, &answers.path());
    argv.extend(["--backup-root".into(), dir.path().display().to_string()]);
    // The backup's own marks say nothing of what was acknowledged after it: every sequence
    // skips ahead, and the numbers between are retired (docs/backups.md).
    let mut restore = serve_argv(&backup, port, &tokens, &answers.path());
    restore.extend(["--skip-ahead".into(), "100".into()]);
    let url = format!("http://127.0.0.1:{port}");
    let backup_argv = [BIN, "backup", "--url", &url, "--to"]
        .map(str::to_owned)
        .into_iter()
        .chain([backup.display().to_string(), "--token".into(), ADMIN.into()])
        .collect::<Vec<_>>();
    let server = Spawned::serve(&argv);
    let out = browse(&[
        ("CONSOLE_MODE", "gap".into()),
        ("CONSOLE_URL", url),
        ("CONSOLE_WRITE", WRITE.into()),
        ("CONSOLE_READ", READ.into()),
        ("CONSOLE_PID", server.0.id().to_string()),
        (
            "CONSOLE_BACKUP",
            serde_json::to_string(&backup_argv).unwrap(),
        ),
        ("CONSOLE_RESTORE", serde_json::to_string(&restore).unwrap()),
    ]);
    drop(server);
    assert!(out.contains("one gap row"), "{out}");
    answers.assert_conforms();
}

#[test]
fn the_cluster_view_shows_a_new_owner_after_the_old_owner_is_killed() {
    let db = Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let tokens = both_tokens(dir.path());
    let tokens = tokens.to_str().unwrap();
    let args = ["--tokens-file", tokens];
    let nodes: Vec<Node> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| Node::start(&db, id, dir.path(), &args))
        .collect();
    let pids: serde_json::Map<String, serde_json::Value> = nodes
        .iter()
        .map(|n| (n.id.clone(), n.pid().into()))
        .collect();
    let out = browse(&[
        ("CONSOLE_MODE", "cluster".into()),
        ("CONSOLE_URL", nodes[0].url.clone()),
        ("CONSOLE_WRITE", WRITE.into()),
        ("CONSOLE_READ", READ.into()),
        ("CONSOLE_NODES", serde_json::Value::Object(pids).to_string()),
    ]);
    assert!(out.contains("a new owner"), "{out}");
    for n in nodes {
        n.terminate(Duration::from_secs(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_scope_answers_what_each_token_may_do_and_the_assets_need_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = both_tokens(dir.path());
    let args = ["--tokens-file", tokens.to_str().unwrap()];
    let server = common::Server::start(&dir.path().join("data"), &args);
    let client = reqwest::Client::new();
    let scope = |token: Option<&'static str>| {
        let mut r = client.get(format!("{}/v1/token", server.url));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap();
            (
                status,
                body["scope"].as_str().unwrap_or_default().to_owned(),
            )
        }
    };
    assert_eq!(scope(Some(READ)).await, (200, "read".to_owned()));
    assert_eq!(scope(Some(WRITE)).await, (200, "write".to_owned()));
    assert_eq!(scope(None).await.0, 401);
    let page = client
        .get(format!("{}/ui/", server.url))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200, "the page needs no token");
    assert_eq!(page.headers()["content-encoding"], "gzip");
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    let script = client
        .get(format!("{}/ui/app.js", server.url))
        .send()
        .await
        .unwrap();
    assert!(script.headers().get("content-encoding").is_none());
    let text = script.text().await.unwrap();
    assert!(
        !text.contains("innerHTML"),
        "the console writes values as text nodes only"
    );
}

/// `monoseq_follower_delay_seconds_count` of the node at `url`.
async fn delivered(http: &reqwest::Client, url: &str) -> u64 {
    common::metric(
        &common::metrics(http, url).await,
        "monoseq_follower_delay_seconds_count",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_through_a_node_that_does_not_own_its_partition_counts_in_the_follower_delay() {
    use common::sse::Sse;
    let db = Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let beat = ["--follower-heartbeat-ms", "200"];
    let a = Node::on(&db, "a", dir.path()).args(&beat).start();
    let b = Node::on(&db, "b", dir.path()).args(&beat).start();
    let http = common::keyed::client(Duration::from_secs(10));
    // Partition 0 (workspace 6 of 6 partitions) is followed through the node not owning it.
    let owners = common::keyed::balanced(&http, &a.url, &["a", "b"]).await;
    let (owner, relay) = if owners[&0].0 == "a" {
        (&a.url, &b.url)
    } else {
        (&b.url, &a.url)
    };
    // Balanced leases do not mean the owner serves yet: until it does, the relay answers 503
    // with Retry-After (`partition_unavailable`), and a follower tries again.
    let url = format!("{relay}/v1/partitions/0/events/stream?from=end");
    let opened = std::time::Instant::now();
    let mut tail = loop {
        let r = http.get(&url).send().await.unwrap();
        if r.status() == 200 {
            break Sse::from_response(r);
        }
        assert_eq!(r.status(), 503, "{url}");
        assert!(r.headers().contains_key("retry-after"), "{url}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(
            opened.elapsed() < Duration::from_secs(20),
            "the relay still refuses the tail: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // A heartbeat: the tail has caught up and takes what its hub hands out from now on.
    let first = tail
        .next(Duration::from_secs(20))
        .await
        .expect("a heartbeat");
    assert_eq!(first.event, "heartbeat", "{first:?}");
    let before = delivered(&http, relay).await;
    const EVENTS: u64 = 20;
    let commands: Vec<serde_json::Value> = (0..EVENTS)
        .map(|_| serde_json::json!({"ws": 6, "ws_kind": 1, "command": "test.Create"}))
        .collect();
    let r = http
        .post(format!("{owner}/v1/commands/batch"))
        .json(&serde_json::json!({ "commands": commands }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut got = 0;
    while got < EVENTS {
        let m = tail
            .next(Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("{got} of {EVENTS} events through the relaying node"));
        if m.event == "event" {
            got += 1;
        }
    }
    let counted = delivered(&http, relay).await - before;
    assert!(
        counted >= EVENTS,
        "the relaying node handed {EVENTS} events to its tail and observed {counted} delays"
    );
    drop(tail);
    a.terminate(Duration::from_secs(20));
    b.terminate(Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_counts_each_event_it_delivers_live_in_the_follower_delay() {
    use common::sse::Sse;
    let dir = tempfile::tempdir().unwrap();
    let http = common::keyed::client(Duration::from_secs(10));
    let server = common::Server::start_ready(&dir.path().join("data"), &[], &http).await;
    let url = &server.url;
    let mut stream = Sse::open(
        &http,
        &format!("{url}/v1/events/stream?partitions=all&from=end"),
        None,
    )
    .await;
    let post = || async {
        let body = serde_json::json!({"ws": 1, "ws_kind": 1, "command": "test.Create"});
        let r = http
            .post(format!("{url}/v1/commands"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    };
    // Until the stream delivers one (its reader knew the end before the command was written),
    // then five more: each event it delivers was written after it began reading.
    let (mut received, mut posted) = (0, 0);
    while received == 0 {
        assert!(
            posted < 50,
            "the subscription delivered none of {posted} events"
        );
        post().await;
        posted += 1;
        while let Some(m) = stream.next(Duration::from_millis(300)).await {
            received += u64::from(m.event == "event");
        }
    }
    let target = received + 5;
    for _ in 0..5 {
        post().await;
    }
    while received < target {
        let m = stream
            .next(Duration::from_secs(20))
            .await
            .expect("the subscription's next event");
        received += u64::from(m.event == "event");
    }
    while let Some(m) = stream.next(Duration::from_millis(300)).await {
        received += u64::from(m.event == "event");
    }
    assert_eq!(
        delivered(&http, url).await,
        received,
        "every event the subscription delivered live, and nothing else, is observed once"
    );
}
