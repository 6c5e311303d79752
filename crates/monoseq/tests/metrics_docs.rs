//! The metrics a server exposes, `docs/operating.md` and the Grafana dashboard agree: every
//! series the docs or a dashboard query name exists on a running server, and every series the
//! server exposes is in the docs' table of metrics.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::Server;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The metric names (`monoseq_…`) in `text`; not a Rust path (`monoseq_core::…`) or a file
/// (`monoseq_example.py`).
fn names(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("monoseq_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let before = rest[..at].chars().next_back();
        let after = &tail[end..];
        let code = after.starts_with("::") || after.starts_with(".py");
        if !code && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            found.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    found
}

/// Every family of a `/metrics` text with its type (`# TYPE name type`).
fn families(metrics: &str) -> BTreeMap<String, String> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_owned(), t.to_owned()))
        .collect()
}

/// The name a family's samples are queried by: a counter's ends in `_total`.
fn queried(name: &str, kind: &str) -> String {
    if kind == "counter" {
        format!("{name}_total")
    } else {
        name.to_owned()
    }
}

/// The names a query may use for the server's families (a histogram's by its sample suffixes).
fn usable(families: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for (name, kind) in families {
        all.insert(queried(name, kind));
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                all.insert(format!("{name}{suffix}"));
            }
        }
    }
    all
}

/// `docs/operating.md`'s section "### Metrics", up to the next heading of its level or above.
fn metrics_section(doc: &str) -> &str {
    let start = doc
        .find("### Metrics")
        .expect("docs/operating.md has a ### Metrics section");
    let rest = &doc[start + 3..];
    let end = rest
        .find("\n## ")
        .or_else(|| rest.find("\n### "))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// What is wrong between the server's families and the names in the docs and dashboard.
fn mismatches(families: &BTreeMap<String, String>, doc: &str, dashboard: &str) -> Vec<String> {
    let usable = usable(families);
    let mut found = Vec::new();
    for name in names(doc).difference(&usable) {
        found.push(format!(
            "docs/operating.md names {name}, which the server does not expose"
        ));
    }
    for name in names(dashboard).difference(&usable) {
        found.push(format!(
            "the dashboard queries {name}, which the server does not expose"
        ));
    }
    let documented = names(metrics_section(doc));
    for (name, kind) in families {
        let name = queried(name, kind);
        if !documented.contains(&name) {
            found.push(format!(
                "{name} is exposed but not in docs/operating.md's ### Metrics"
            ));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_or_dashboard_series_exists_and_every_exposed_series_is_documented() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &client).await;
    let body = serde_json::json!({"ws": 1, "ws_kind": 1, "command": "test.Create"});
    let r = client
        .post(format!("{}/v1/commands", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A stored position, so that the consumer lag series exist.
    let r = client
        .put(format!("{}/v1/consumers/docs/partitions/1", server.url))
        .json(&serde_json::json!({"offset": 0}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let metrics = common::metrics(&client, &server.url).await;
    let families = families(&metrics);
    for histogram in [
        "monoseq_command_duration_seconds",
        "monoseq_group_commands",
        "monoseq_group_write_duration_seconds",
        "monoseq_group_sync_duration_seconds",
        "monoseq_forward_duration_seconds",
        "monoseq_page_read_duration_seconds",
        "monoseq_follower_delay_seconds",
    ] {
        assert_eq!(
            families.get(histogram).map(String::as_str),
            Some("histogram"),
            "{histogram} is not a histogram of /metrics:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("monoseq_command_duration_seconds_count{outcome=\"ok\"} 1"),
        "the command was not observed:\n{metrics}"
    );
    for group in [
        "commands",
        "write_duration_seconds",
        "sync_duration_seconds",
    ] {
        assert!(
            metrics.contains(&format!("monoseq_group_{group}_count 1\n")),
            "the group was not observed in monoseq_group_{group}:\n{metrics}"
        );
    }
    batch_commands_are_observed(&client, &server.url).await;
    let doc = std::fs::read_to_string(root().join("docs/operating.md")).unwrap();
    let dashboard = std::fs::read_to_string(root().join("docs/grafana/monoseq.json")).unwrap();
    let found = mismatches(&families, &doc, &dashboard);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A batch of three commands and one malformed: each is observed in the command latency
/// histogram by its outcome, as three single commands and a refused one would be (the server
/// answered one single command before).
async fn batch_commands_are_observed(client: &reqwest::Client, url: &str) {
    let command = |ws: u64| serde_json::json!({"ws": ws, "ws_kind": 1, "command": "test.Create"});
    let batch = serde_json::json!({
        "commands": [command(1), command(2), command(3), {"ws": "not a number"}]
    });
    let r = client
        .post(format!("{url}/v1/commands/batch"))
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer: serde_json::Value = r.json().await.unwrap();
    let statuses: Vec<u64> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 200, 200, 400], "{answer}");
    let metrics = common::metrics(client, url).await;
    for (outcome, count) in [("ok", 4), ("invalid_command", 1)] {
        let series =
            format!("monoseq_command_duration_seconds_count{{outcome=\"{outcome}\"}} {count}\n");
        assert!(
            metrics.contains(&series),
            "the batch's commands were not observed ({series}):\n{metrics}"
        );
    }
}

#[test]
fn a_missing_documented_or_queried_series_and_an_undocumented_one_are_each_reported() {
    let families: BTreeMap<String, String> = [
        ("monoseq_a".to_owned(), "counter".to_owned()),
        ("monoseq_b".to_owned(), "histogram".to_owned()),
        ("monoseq_c".to_owned(), "gauge".to_owned()),
    ]
    .into();
    let doc = "intro monoseq_gone monoseq_core::X monoseq_example.py\n### Metrics\n| `monoseq_a_total` | `monoseq_b` |\n## Next\n\
               monoseq_c later";
    let dashboard = r#"{"expr": "rate(monoseq_b_bucket[5m]) + monoseq_missing"}"#;
    let found = mismatches(&families, doc, dashboard);
    assert_eq!(
        found,
        [
            "docs/operating.md names monoseq_gone, which the server does not expose",
            "the dashboard queries monoseq_missing, which the server does not expose",
            "monoseq_c is exposed but not in docs/operating.md's ### Metrics",
        ]
    );
}
