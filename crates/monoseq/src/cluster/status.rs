//! `monoseq cluster status`: asks any node for `GET /v1/cluster` and prints its nodes and
//! partitions as aligned tables (or the JSON as it came).

use anyhow::{Context, bail};

/// `monoseq cluster …`.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Show the nodes, their partitions, epochs and lease ages, as a node reads them from the
    /// database.
    Status {
        /// Any node of the cluster.
        #[arg(long, env = "MONOSEQ_URL")]
        url: String,
        /// A bearer token, when the nodes require one.
        #[arg(long, env = "MONOSEQ_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the node's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `monoseq cluster` command.
///
/// # Errors
///
/// When the node cannot be reached or answers with an error.
pub async fn run_command(command: ClusterCmd) -> anyhow::Result<()> {
    let ClusterCmd::Status { url, token, json } = command;
    let url = format!("{}/v1/cluster", url.trim_end_matches('/'));
    let mut request = reqwest::Client::new().get(&url);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let answer = request
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = answer.status();
    let body: serde_json::Value = answer
        .json()
        .await
        .with_context(|| format!("reading the answer of {url}"))?;
    if !status.is_success() {
        bail!(
            "{url} answered {status}: {}",
            body["message"].as_str().unwrap_or("no message")
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        print_status(&body);
    }
    Ok(())
}

fn print_status(v: &serde_json::Value) {
    if v["clustered"] == serde_json::json!(false) {
        println!("one node on embedded storage serves every partition");
        return;
    }
    // `Value`'s own formatting ignores widths: every cell becomes a string first.
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "(none)".to_owned(),
        other => other.to_string(),
    };
    println!(
        "{:<24} {:<32} {:>8} {:>6}  partitions",
        "node", "url", "seen ms", "alive"
    );
    for n in v["nodes"].as_array().into_iter().flatten() {
        println!(
            "{:<24} {:<32} {:>8} {:>6}  {}",
            text(&n["node_id"]),
            text(&n["url"]),
            text(&n["seen_ms_ago"]),
            text(&n["alive"]),
            text(&n["partitions"])
        );
    }
    println!();
    println!(
        "{:>9} {:<24} {:>6} {:>12}",
        "partition", "owner", "epoch", "lease age ms"
    );
    for p in v["partitions"].as_array().into_iter().flatten() {
        println!(
            "{:>9} {:<24} {:>6} {:>12}",
            text(&p["partition"]),
            text(&p["owner"]),
            text(&p["epoch"]),
            text(&p["lease_age_ms"])
        );
    }
}
