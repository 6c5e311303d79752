//! `monoseq cluster status`: asks any node for `GET /v1/cluster` and prints its nodes and
//! partitions as aligned tables (or the JSON as it came).

use anyhow::{Context, bail};
use monoseq_wire::{ClusterBody, ErrorBody};

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
    let bytes = answer
        .bytes()
        .await
        .with_context(|| format!("reading the answer of {url}"))?;
    if !status.is_success() {
        let message = serde_json::from_slice::<ErrorBody>(&bytes)
            .map_or_else(|_| "no message".to_owned(), |e| e.message);
        bail!("{url} answered {status}: {message}");
    }
    if json {
        let body: serde_json::Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("reading the answer of {url}"))?;
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        let body: ClusterBody = serde_json::from_slice(&bytes)
            .with_context(|| format!("reading the answer of {url} as a cluster view"))?;
        print_status(&body);
    }
    Ok(())
}

fn print_status(body: &ClusterBody) {
    let ClusterBody::Clustered {
        nodes, partitions, ..
    } = body
    else {
        println!("one node on embedded storage serves every partition");
        return;
    };
    let list = |partitions: &[u32]| serde_json::to_string(partitions).unwrap_or_default();
    println!(
        "{:<24} {:<32} {:>8} {:>6}  partitions",
        "node", "url", "seen ms", "alive"
    );
    for n in nodes {
        println!(
            "{:<24} {:<32} {:>8} {:>6}  {}",
            n.node_id,
            n.url,
            n.seen_ms_ago,
            n.alive,
            list(&n.partitions)
        );
    }
    println!();
    println!(
        "{:>9} {:<24} {:>6} {:>12}",
        "partition", "owner", "epoch", "lease age ms"
    );
    for p in partitions {
        println!(
            "{:>9} {:<24} {:>6} {:>12}",
            p.partition,
            p.owner.as_deref().unwrap_or("(none)"),
            p.epoch,
            p.lease_age_ms
        );
    }
}
