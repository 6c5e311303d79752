//! Asking the other nodes of a cluster: whether they are ready (`/readyz`, [`Readiness`]) and
//! their high-water marks (`/v1/marks`), with this node's token ([`Prober`], made by the
//! forwarder on its pooled client); and what to do when a peer refuses that token
//! ([`NODE_TOKEN_HINT`]). Used by the cluster's driver and marks, and by forwarding.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::{HeaderValue, header};
use monoseq_wire::ErrorCode;

/// A peer's answer to a readiness probe ([`Prober::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The partitions it named not ready; none when it is ready.
    Unready(BTreeSet<u32>),
    /// It refused this node's token, with this status (401 or 403).
    TokenRefused(u16),
}

/// What to do when another node refuses this node's token.
pub const NODE_TOKEN_HINT: &str =
    "give every node a --node-token-file holding a write token the others accept";

/// Asks other nodes whether they are ready (`/readyz`) and for their high-water marks.
#[derive(Clone)]
pub struct Prober {
    client: reqwest::Client,
    authorization: Option<HeaderValue>,
}

impl Prober {
    /// A prober sending its requests on `client`, presenting `authorization` (`Authorization`)
    /// when the peers require a token.
    pub(crate) fn new(client: reqwest::Client, authorization: Option<HeaderValue>) -> Prober {
        Prober {
            client,
            authorization,
        }
    }

    /// `GET url path` within `timeout`, with this node's token.
    fn get(&self, url: &str, path: &str, timeout: Duration) -> reqwest::RequestBuilder {
        let request = self.client.get(format!("{url}{path}")).timeout(timeout);
        match &self.authorization {
            Some(auth) => request.header(header::AUTHORIZATION, auth.clone()),
            None => request,
        }
    }

    /// What the node at `url` answers to `GET /readyz`: the partitions it says it cannot
    /// answer yet (none when it is ready), or that it refuses this node's token; `None` when
    /// it did not answer within `timeout`, or not with a readiness answer (it is starting or
    /// stopping).
    pub async fn readiness(&self, url: &str, timeout: Duration) -> Option<Readiness> {
        let answer = self.get(url, "/readyz", timeout).send().await.ok()?;
        let status = answer.status();
        if status.is_success() {
            return Some(Readiness::Unready(BTreeSet::new()));
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Some(Readiness::TokenRefused(status.as_u16()));
        }
        if status != reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return None;
        }
        let body: monoseq_wire::NotReadyBody = answer.json().await.ok()?;
        let partitions = body
            .partitions
            .filter(|_| body.code == ErrorCode::NotReady)?;
        Some(Readiness::Unready(
            partitions.iter().map(|p| p.partition).collect(),
        ))
    }

    /// The high-water marks of the node at `url` (`GET /v1/marks`), within `timeout`.
    ///
    /// # Errors
    ///
    /// When the node does not answer in time, or not with its marks.
    pub async fn marks(
        &self,
        url: &str,
        timeout: Duration,
    ) -> anyhow::Result<monoseq_wire::MarksBody> {
        let answer = self.get(url, "/v1/marks", timeout).send().await?;
        let status = answer.status();
        if !status.is_success() {
            anyhow::bail!("{url}/v1/marks answered {status}");
        }
        Ok(answer.json().await?)
    }
}
