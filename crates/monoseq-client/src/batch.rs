//! [`Client::submit_batch`]: many commands per request (`POST /v1/commands/batch`), one
//! request per node owning their partitions, each command answered and retried on its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use monoseq_wire::{
    BatchAnswerBody, BatchBody, BatchCommandBody, BatchResultBody, ErrorBody, ErrorCode,
};
use reqwest::{StatusCode, header};

use crate::client::{Client, MOVED_CODES, Submitted};
use crate::error::ClientError;

/// A command to send again: after at least `wait`, and after a refresh of the view when its
/// partition `moved`.
#[derive(Default)]
struct Again {
    wait: Duration,
    moved: bool,
}

/// What one node answered to the commands it was sent.
enum NodeAnswer {
    /// One result per command sent, in order.
    Results(Vec<BatchResultBody>),
    /// No answer: the commands may have run.
    Unanswered(String),
    /// The whole batch was refused (nothing ran): malformed, too large, unauthorized.
    Refused(ClientError),
}

impl Client {
    /// Submits `commands` in one request per node that owns their partitions, and retries
    /// each command whose answer allows it — with its own `idempotency_key`, any transient
    /// refusal; without one, only answers that say it did not run — until every command is
    /// answered or `retry_timeout` passes. The results are in the order of `commands`.
    ///
    /// A command without a key that got no answer is not resent (it may have run): its result
    /// is [`ClientError::Unanswered`].
    ///
    /// # Errors
    ///
    /// A [`ClientError::Api`] refusing the whole batch (`invalid_batch`, `batch_too_large`,
    /// `unauthorized`, …): no command of it ran.
    pub async fn submit_batch(
        &self,
        commands: &[BatchCommandBody],
    ) -> Result<Vec<Result<Submitted, ClientError>>, ClientError> {
        let started = Instant::now();
        let mut results: Vec<Option<Result<Submitted, ClientError>>> =
            commands.iter().map(|_| None).collect();
        let mut attempts = vec![0u32; commands.len()];
        let mut pending: Vec<usize> = (0..commands.len()).collect();
        let mut failures = 0u32;
        while !pending.is_empty() {
            let by_node = self.group_by_node(commands, &pending).await;
            let answers = join_all(by_node.into_iter().map(|(node, items)| async move {
                let answer = self.send_batch(&node, commands, &items).await;
                (node, items, answer)
            }))
            .await;
            let mut retry = Vec::new();
            let mut floor = Duration::ZERO;
            let mut moved = false;
            for (node, items, answer) in answers {
                for &i in &items {
                    attempts[i] += 1;
                }
                let answer = match answer {
                    NodeAnswer::Refused(error) => return Err(error),
                    answer => answer,
                };
                self.settle(&node, commands, &items, answer, &attempts, &mut results)
                    .into_iter()
                    .for_each(|(i, again)| {
                        floor = floor.max(again.wait);
                        moved |= again.moved;
                        retry.push(i);
                    });
            }
            if retry.is_empty() {
                break;
            }
            failures += 1;
            let wait = floor + self.inner.backoff.jittered(failures);
            if started.elapsed() + wait > self.inner.retry_timeout {
                break;
            }
            tokio::time::sleep(wait).await;
            if moved {
                self.refresh_after_move().await;
            } else {
                let _ = self.refresh().await;
            }
            pending = retry;
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(ClientError::Protocol("a command got no result".into())))
            })
            .collect())
    }

    /// The commands `pending` by the node to send each to: its partition's owner, else a
    /// seed (which forwards it).
    async fn group_by_node(
        &self,
        commands: &[BatchCommandBody],
        pending: &[usize],
    ) -> BTreeMap<String, Vec<usize>> {
        if self.inner.view.stale(Instant::now()) {
            let _ = self.refresh().await;
        }
        let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for &i in pending {
            let partition = self.inner.view.partition_of(commands[i].ws);
            by_node
                .entry(self.inner.view.node_for(partition))
                .or_default()
                .push(i);
        }
        by_node
    }

    /// Records each command's result in `results`; answers the commands to retry, each with
    /// the least wait its answer asked for.
    fn settle(
        &self,
        node: &str,
        commands: &[BatchCommandBody],
        items: &[usize],
        answer: NodeAnswer,
        attempts: &[u32],
        results: &mut [Option<Result<Submitted, ClientError>>],
    ) -> Vec<(usize, Again)> {
        let mut retry = Vec::new();
        match answer {
            NodeAnswer::Results(answers) => {
                for (&i, result) in items.iter().zip(answers) {
                    let keyed = commands[i].idempotency_key.is_some();
                    if let Some(wait) = self.retry_wait(commands[i].ws, &result, keyed) {
                        retry.push((i, wait));
                    }
                    results[i] = Some(submitted(&commands[i], result, attempts[i]));
                }
            }
            NodeAnswer::Unanswered(reason) => {
                for &i in items {
                    if commands[i].idempotency_key.is_some() {
                        retry.push((i, Again::default()));
                    }
                    results[i] = Some(Err(ClientError::Unanswered {
                        node: node.to_owned(),
                        reason: reason.clone(),
                    }));
                }
            }
            NodeAnswer::Refused(_) => {}
        }
        retry
    }

    /// Whether a command with `result` is sent again, after how long at least.
    fn retry_wait(&self, ws: u64, result: &BatchResultBody, keyed: bool) -> Option<Again> {
        if result.status != StatusCode::SERVICE_UNAVAILABLE.as_u16() {
            return None;
        }
        let code = result.error.as_ref().map(|e| e.code);
        if !keyed && code == Some(ErrorCode::OwnerUnreachable) {
            return None;
        }
        if code.is_some_and(|c| MOVED_CODES.contains(&c)) {
            if let Some(partition) = self.inner.view.partition_of(ws) {
                self.inner.view.forget_owner(partition);
            }
            return Some(Again {
                wait: Duration::ZERO,
                moved: true,
            });
        }
        Some(Again {
            wait: Duration::from_secs(result.retry_after.unwrap_or(0)),
            moved: false,
        })
    }

    /// One request carrying the commands `items` to `node`.
    async fn send_batch(
        &self,
        node: &str,
        commands: &[BatchCommandBody],
        items: &[usize],
    ) -> NodeAnswer {
        let body = BatchBody {
            commands: items.iter().map(|&i| commands[i].clone()).collect(),
        };
        let body = match serde_json::to_vec(&body) {
            Ok(body) => body,
            Err(e) => return NodeAnswer::Refused(ClientError::Protocol(e.to_string())),
        };
        let sent = self
            .inner
            .http
            .post(format!("{node}/v1/commands/batch"))
            .timeout(self.inner.request_timeout)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => {
                if e.is_connect() {
                    self.inner.view.forget_node(node);
                    let _ = self.refresh().await;
                }
                return NodeAnswer::Unanswered(e.to_string());
            }
        };
        let status = response.status();
        match response.bytes().await {
            Ok(body) => node_answer(status, &body, items.len()),
            Err(e) => NodeAnswer::Unanswered(e.to_string()),
        }
    }
}

/// What a node's answer to a batch of `sent` commands says.
fn node_answer(status: StatusCode, body: &[u8], sent: usize) -> NodeAnswer {
    if status.is_success() {
        return match serde_json::from_slice::<BatchAnswerBody>(body) {
            Ok(answer) if answer.results.len() == sent => NodeAnswer::Results(answer.results),
            Ok(answer) => NodeAnswer::Refused(ClientError::Protocol(format!(
                "{} results for {sent} commands",
                answer.results.len()
            ))),
            Err(e) => NodeAnswer::Refused(ClientError::Protocol(format!(
                "a batch's answer not as documented ({e})"
            ))),
        };
    }
    let error = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => ClientError::of_body(status.as_u16(), e),
        Err(_) => ClientError::Protocol(format!("status {status} without an error body")),
    };
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // The whole request was turned away before any command ran (draining, too many
        // connections): every command is sent again.
        return NodeAnswer::Results(
            (0..sent)
                .map(|_| BatchResultBody::refused(status.as_u16(), to_body(&error), None))
                .collect(),
        );
    }
    NodeAnswer::Refused(error)
}

fn to_body(error: &ClientError) -> ErrorBody {
    ErrorBody {
        code: error.code(),
        message: error.to_string(),
        key: None,
        current_wlog_offset: error.current_wlog_offset(),
    }
}

/// A command's result as [`Client::submit`] would return it.
fn submitted(
    command: &BatchCommandBody,
    result: BatchResultBody,
    attempts: u32,
) -> Result<Submitted, ClientError> {
    match (result.outcome, result.error) {
        (Some(outcome), _) if result.status == 200 => Ok(Submitted {
            outcome,
            replayed: result.replayed,
            key: command.idempotency_key.clone().unwrap_or_default(),
            attempts,
        }),
        (_, Some(error)) => Err(ClientError::of_body(result.status, error)),
        _ => Err(ClientError::Protocol(format!(
            "a result with status {} and neither an outcome nor an error",
            result.status
        ))),
    }
}
