//! End-to-end over real HTTP with a real client against the real binary: commands and reading
//! them back, bad input, health, readiness, metrics, graceful shutdown and restart, and the
//! data directory's guards (lock, fixed partition count).

mod common;

use std::time::Duration;

use common::{Backend, Server, run};
use serde_json::{Value, json};

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client
        .post(format!("{url}/v1/commands"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = client.get(url).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn order(ws: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "app.CreateOrder",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Order", "fields": {"total": 10}}],
        "argument": {"raw_id": 2, "name": "app.Arg", "fields": {"order": {"$raw": 1}},
                     "children": [{"raw_id": 3, "name": "app.Line"}]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_acknowledged_read_back_and_survive_a_graceful_restart() {
    acknowledged_read_back_and_restarted(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_commands_are_acknowledged_read_back_and_survive_a_graceful_restart() {
    acknowledged_read_back_and_restarted(Backend::postgres()).await;
}

async fn acknowledged_read_back_and_restarted(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let mut args: Vec<String> = vec!["--partitions".into(), "4".into()];
    args.extend(backend.args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start_ready(dir.path(), &args, &client).await;
    let url = server.url.clone();

    let (status, out) = post(&client, &url, &order(6)).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["partition"], 2);
    assert_eq!(out["plog_offset"], 1);
    assert_eq!(out["wlog_offset"], 1);
    let order_id = out["ids"]["1"].as_u64().unwrap();
    assert_eq!(order_id, 322_685_000_131_072);
    assert_eq!(out["ids"]["2"], 322_680_000_131_072u64);

    let (status, event) = get(&client, &format!("{url}/v1/partitions/2/events/1")).await;
    assert_eq!(status, 200);
    assert_eq!(event["ws"], 6);
    assert_eq!(event["argument"]["fields"]["order"], order_id);
    let (status, record) = get(
        &client,
        &format!("{url}/v1/workspaces/6/records/{order_id}"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(record["fields"]["total"], 10);
    let update = json!({"ws": 6, "ws_kind": 1, "command": "app.Pay",
                        "update": [{"id": order_id, "fields": {"paid": true}}]});
    let (status, out) = post(&client, &url, &update).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["wlog_offset"], 2);
    let (_, wlog) = get(
        &client,
        &format!("{url}/v1/workspaces/6/wlog?from=1&limit=10"),
    )
    .await;
    let events = wlog["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["command"], "app.Pay");

    let (status, _) = get(&client, &format!("{url}/v1/partitions/2/events/99")).await;
    assert_eq!(status, 404);
    let health = client.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "monoseq_commands_total{code=\"ok\"} 2",
        "monoseq_backlog_values",
        "monoseq_checkpoint_lag_events",
        "monoseq_cache_hit_ratio",
        "monoseq_actualization_duration_seconds",
        "monoseq_actualization_replayed_events",
    ] {
        assert!(metrics.contains(name), "metrics lack {name}:\n{metrics}");
    }
    if let Backend::Postgres(_) = backend {
        // PostgreSQL has no engine of ours to show.
        assert!(!metrics.contains("monoseq_engine_"), "{metrics}");
    }

    // SIGTERM: a clean, bounded exit; a restart continues every sequence.
    let status = server.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    let server = Server::start_ready(dir.path(), &args, &client).await;
    let (status, out) = post(&client, &server.url, &order(6)).await;
    assert_eq!(status, 200);
    assert_eq!(out["plog_offset"], 3);
    assert_eq!(out["wlog_offset"], 3);
    assert_eq!(out["ids"]["1"], order_id + 1);
    let (status, info) = get(&client, &format!("{}/v1/info", server.url)).await;
    assert_eq!(status, 200);
    assert_eq!(info["partitions"], 4);
    let kind = match backend {
        Backend::Embedded => "embedded",
        Backend::Postgres(_) => "postgres://",
    };
    assert!(
        info["storage"].as_str().unwrap().starts_with(kind),
        "{info}"
    );
    server.terminate(Duration::from_secs(15));

    let verify = backend.verify(dir.path());
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_show_what_the_embedded_engine_holds_in_memory_and_does_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "1"], &client).await;
    let (status, _) = post(&client, &server.url, &order(1)).await;
    assert_eq!(status, 200);
    let metrics = client
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')
                .map(|v| v.parse::<f64>().unwrap())
        })
    };
    // The command's WLog entry and record sit in the active memtable.
    assert!(
        value("monoseq_engine_memtable_bytes").unwrap() > 0.0,
        "{metrics}"
    );
    assert_eq!(
        value("monoseq_engine_cache_capacity_bytes"),
        Some(monoseq_kv::CACHE_BYTES_DEFAULT as f64)
    );
    for name in [
        "monoseq_engine_sealed_memtables",
        "monoseq_engine_cache_bytes",
        "monoseq_engine_tables",
        "monoseq_engine_level0_tables",
        "monoseq_engine_flushes_pending",
        "monoseq_engine_compactions_running",
        "monoseq_engine_compactions",
        "monoseq_engine_compaction_seconds",
        "monoseq_engine_journals",
    ] {
        assert!(value(name).is_some(), "metrics lack {name}:\n{metrics}");
    }
    assert!(
        value("monoseq_engine_journals").unwrap() >= 1.0,
        "{metrics}"
    );
    // Table block reads, by kind and source (counted in crates/monoseq-kv/tests/fjall_settings.rs).
    for block in ["data", "index", "filter"] {
        for from in ["cache", "file"] {
            let name = format!("monoseq_engine_block_reads{{block=\"{block}\",from=\"{from}\"}}");
            assert!(value(&name).is_some(), "metrics lack {name}:\n{metrics}");
        }
        let name = format!("monoseq_engine_block_read_bytes{{block=\"{block}\"}}");
        assert!(value(&name).is_some(), "metrics lack {name}:\n{metrics}");
    }
    server.terminate(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_4xx_with_a_clear_message_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "1"], &client).await;
    let url = &server.url;
    let raw = |body: &'static str| {
        client
            .post(format!("{url}/v1/commands"))
            .header("content-type", "application/json")
            .body(body)
    };
    let r = raw("{\"ws\": 1,").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "malformed_json");

    let big = format!(
        "{{\"ws\": 1, \"ws_kind\": 1, \"command\": \"{}\"}}",
        "x".repeat(2 * 1024 * 1024)
    );
    // Its own connection: the server answers before reading the whole body, then closes.
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/commands"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "too_large");

    let cases = [
        (
            json!({"ws": 1, "ws_kind": 42, "command": "c"}),
            400,
            "unknown_workspace_kind",
        ),
        (json!({"ws": 1, "ws_kind": 1}), 400, "invalid_command"),
        (
            json!({"ws": 1, "ws_kind": 1, "command": "c", "create": [
                {"raw_id": 5, "kind": "CDoc", "name": "a"},
                {"raw_id": 5, "kind": "CRecord", "name": "b"}]}),
            400,
            "invalid_command",
        ),
        (
            json!({"ws": 1, "ws_kind": 1, "command": "c", "create": [
                {"raw_id": 1, "kind": "CDoc", "name": "a", "fields": {"parent": {"$raw": 9}}}]}),
            400,
            "invalid_command",
        ),
        (
            json!({"ws": 1, "ws_kind": 1, "command": "c",
                   "update": [{"id": 322685000131072u64, "fields": {"x": 1}}]}),
            404,
            "unknown_record",
        ),
    ];
    for (body, status, code) in cases {
        let (got, answer) = post(&client, url, &body).await;
        assert_eq!(
            (got, answer["code"].as_str().unwrap()),
            (status, code),
            "{body}: {answer}"
        );
        assert!(!answer["message"].as_str().unwrap().is_empty());
    }
    // Nothing was written: the first good command still gets every first number.
    let (status, out) = post(&client, url, &order(1)).await;
    assert_eq!(status, 200);
    assert_eq!(out["plog_offset"], 1);
    assert_eq!(out["ids"]["1"], 322_685_000_131_072u64);
    // Bad paths, a partition that does not exist and a wrong method are JSON errors too.
    for (path, status, code) in [
        ("/v1/partitions/x/events/1", 400, "bad_request"),
        ("/v1/workspaces/-1/records/5", 400, "bad_request"),
        ("/v1/workspaces/seven/wlog", 400, "bad_request"),
        ("/v1/partitions/999/events/1", 404, "no_such_partition"),
    ] {
        let (got, answer) = get(&client, &format!("{url}{path}")).await;
        assert_eq!(
            (got, answer["code"].as_str()),
            (status, Some(code)),
            "{path}: {answer}"
        );
    }
    let r = client
        .get(format!("{url}/v1/commands"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let answer: Value = r.json().await.expect("a JSON error");
    assert_eq!(answer["code"], "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_a_partition_count_runs_with_the_one_the_data_directory_holds() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "3"], &client).await;
    let (status, _) = post(&client, &server.url, &order(5)).await;
    assert_eq!(status, 200);
    server.terminate(Duration::from_secs(15));

    // No --partitions: the default (8) would be refused; the recorded 3 routes workspace 5 to
    // partition 2 again, where its second event follows the first.
    let server = Server::start_ready(dir.path(), &[], &client).await;
    let (status, out) = post(&client, &server.url, &order(5)).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["plog_offset"], 2);
    let (status, _) = get(&client, &format!("{}/v1/partitions/2/events/2", server.url)).await;
    assert_eq!(status, 200);
    server.terminate(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_data_directory_and_a_changed_partition_count_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &client).await;
    let second = run(&["verify", "--data-dir", dir.path().to_str().unwrap()]);
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("locked"), "{err}");
    server.terminate(Duration::from_secs(15));

    let wrong = run(&[
        "serve",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--partitions",
        "5",
    ]);
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("holds 4 partitions"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_sequences_answer_over_http_and_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &client).await;
    let url = server.url.clone();
    let seq = |args: &[&str]| {
        let mut all = vec!["seq", "--url", &url];
        all.extend_from_slice(args);
        let out = run(&all);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )
    };
    assert_eq!(
        seq(&["next", "orders/invoice", "--initial", "1000"]).1,
        "1000"
    );
    assert_eq!(
        seq(&["next", "orders/invoice", "--increment", "10"]).1,
        "1001"
    );
    assert_eq!(seq(&["increment", "orders/invoice"]).1, "1012");
    assert_eq!(seq(&["get", "orders/invoice"]).1, "1012");
    assert_eq!(seq(&["exists", "orders/invoice"]).1, "true");
    let (ok, _, err) = seq(&["next", "../etc"]);
    assert!(!ok && err.contains("path"), "{err}");
    let (ok, _, err) = seq(&["reset", "orders/invoice", "-5"]);
    assert!(!ok, "a negative reset was accepted: {err}");
    assert_eq!(
        seq(&["get", "orders/invoice"]).1,
        "1012",
        "a refused reset changed the value"
    );
    // The HTTP API of the same server sees the same sequence.
    let r: Value = client
        .post(format!("{url}/v1/sequences/orders/invoice/next"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["value"], 1012);
    let r: Value = client
        .get(format!("{url}/v1/sequences/orders/invoice/value"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["value"], 1013);
    server.terminate(Duration::from_secs(15));
    // Locally on the data directory, with the server stopped.
    let local = run(&[
        "seq",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "get",
        "orders/invoice",
    ]);
    assert_eq!(String::from_utf8_lossy(&local.stdout).trim(), "1013");
}

/// `--named-cache 10`: `next` over a real connection takes its numbers from the server's block
/// (`get` answers the block's next one, another process reads the reserved ceiling), and after
/// a crash the restarted server continues above the ceiling: the rest of the block is a gap,
/// no number comes twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_next_with_a_cache_skips_the_unused_block_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let args = ["--partitions", "2", "--named-cache", "10"];
    let next = |url: String| {
        let client = client.clone();
        async move {
            let r = client
                .post(format!("{url}/v1/sequences/orders/id/next"))
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
            r.json::<Value>().await.unwrap()["value"].as_u64().unwrap()
        }
    };
    let server = Server::start_ready(dir.path(), &args, &client).await;
    for expected in 1..=3 {
        assert_eq!(next(server.url.clone()).await, expected);
    }
    let (status, value) = get(
        &client,
        &format!("{}/v1/sequences/orders/id/value", server.url),
    )
    .await;
    assert_eq!((status, value["value"].as_u64()), (200, Some(4)));
    server.kill();
    let stored = run(&[
        "seq",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "get",
        "orders/id",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&stored.stdout).trim(),
        "11",
        "the stored value is the reserved ceiling"
    );
    let server = Server::start_ready(dir.path(), &args, &client).await;
    assert_eq!(next(server.url.clone()).await, 11, "4..=10 are a gap");
    assert_eq!(next(server.url.clone()).await, 12);
    server.terminate(Duration::from_secs(15));
}

/// The log of a server started on `partitions` partitions, read once it is ready; the server is
/// killed.
async fn startup_log(partitions: u32) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let data = dir.path().join("data");
    let partitions = partitions.to_string();
    let server = Server::try_start(&data, &["--partitions", &partitions], &log).expect("started");
    server.ready(&reqwest::Client::new()).await;
    let text = std::fs::read_to_string(&log).unwrap();
    server.kill();
    text
}

/// The value of `field` (its name with `=`) in a log line.
fn log_field<'a>(line: &'a str, field: &str) -> &'a str {
    line.split(field)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {field} in {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_opened_line_says_how_long_the_engine_and_the_data_directory_took_to_open() {
    let text = startup_log(2).await;
    let line = text
        .lines()
        .find(|l| l.contains("store opened"))
        .unwrap_or_else(|| panic!("no store opened line:\n{text}"));
    for field in ["engine_open_ms=", "data_dir_open_ms="] {
        let ms = log_field(line, field);
        let (whole, decimals) = ms
            .split_once('.')
            .unwrap_or_else(|| panic!("{ms} in {line}"));
        assert!(
            whole.parse::<u64>().is_ok() && decimals.len() == 1,
            "{ms} in {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_actualization_log_line_names_its_partition_and_durations_have_fixed_precision() {
    let text = startup_log(4).await;
    let started: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("sequencer actualization started"))
        .collect();
    assert_eq!(started.len(), 4, "{text}");
    for p in 0..4 {
        assert!(
            started
                .iter()
                .any(|l| l.contains(&format!("partition{{partition={p}}}"))),
            "no actualization line names partition {p}:\n{text}"
        );
    }
    let ended: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("sequencer actualization ended"))
        .collect();
    assert_eq!(ended.len(), 4, "{text}");
    for line in ended {
        let ms = log_field(line, "duration_ms=");
        let decimals = ms.split('.').nth(1).map_or(0, str::len);
        assert_eq!(decimals, 1, "duration {ms} in {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_a_method_it_does_not_take_405_with_allow() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "1"], &client).await;
    let document: Value = serde_json::from_str(common::openapi::DOCUMENT).unwrap();
    let paths = document["paths"].as_object().unwrap();
    for (template, operations) in paths {
        let mut path = template.clone();
        for (param, value) in [
            ("{scope}", "orders"),
            ("{name}", "id"),
            ("{partition}", "0"),
            ("{offset}", "1"),
            ("{ws}", "1"),
            ("{id}", "1"),
        ] {
            path = path.replace(param, value);
        }
        let documented: Vec<String> = operations
            .as_object()
            .unwrap()
            .keys()
            .filter(|m| ["get", "post", "put", "delete", "patch"].contains(&m.as_str()))
            .map(|m| m.to_uppercase())
            .collect();
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            if documented.iter().any(|m| m == method) {
                continue;
            }
            let r = client
                .request(method.parse().unwrap(), format!("{}{path}", server.url))
                .send()
                .await
                .unwrap();
            if path.starts_with("/v1/admin/") {
                // The admin scope's token check answers before the route does (403 here, a
                // server without an admin token).
                assert_eq!(r.status(), 403, "{method} {path}");
                continue;
            }
            let allow = r
                .headers()
                .get("allow")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let allowed: Vec<&str> = allow.split(',').map(str::trim).collect();
            assert_eq!(r.status(), 405, "{method} {path}");
            assert!(
                documented.iter().all(|m| allowed.contains(&m.as_str())),
                "{method} {path}: Allow {allow:?} does not name {documented:?}"
            );
        }
    }
}
