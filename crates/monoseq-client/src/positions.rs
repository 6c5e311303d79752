//! Consumer positions through the client: read one ([`Client::position`]) or all of a
//! consumer's ([`Client::positions`]), and set one by compare-and-set
//! ([`Client::set_position`], [`Client::force_position`] to move it back); list every
//! consumer with its lag ([`Client::consumers`]) and delete one ([`Client::delete_consumer`]).
//! Any node answers; a `PUT` that got no answer, or a 503, is sent again, and a retry refused
//! with `position_conflict` because the stored position already is the one it sets counts as
//! done (the earlier attempt was applied, and its answer lost).

use std::time::{Duration, Instant};

use monoseq_wire::{
    ConsumersBody, DeletedConsumerBody, ErrorCode, PartitionPositionBody, PositionBeyondEndBody,
    PositionBody, PositionConflictBody, PositionsBody, PutPositionBody, RemovedPositionBody,
};
use reqwest::{Method, StatusCode};

use crate::client::{Answer, Client};
use crate::error::ClientError;

impl Client {
    /// The position of `consumer` on `partition`: the PLog offset it has processed; `None`
    /// when it has set none there.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`]: `bad_request` for a name that is not 1 to 255 printable ASCII
    /// characters, `no_such_partition`, `corrupted`, a 503 past the retries;
    /// [`ClientError::Transport`].
    pub async fn position(
        &self,
        consumer: &str,
        partition: u32,
    ) -> Result<Option<u64>, ClientError> {
        let path = format!(
            "/v1/consumers/{}/partitions/{partition}",
            path_segment(consumer)
        );
        match self.read::<PositionBody>(&path).await {
            Ok(p) => Ok(p.map(|p| p.offset)),
            Err(e) if e.code() == ErrorCode::UnknownConsumer => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every position of `consumer`, in partition order; empty when it has none.
    ///
    /// # Errors
    ///
    /// As [`Client::position`].
    pub async fn positions(
        &self,
        consumer: &str,
    ) -> Result<Vec<PartitionPositionBody>, ClientError> {
        let path = format!("/v1/consumers/{}", path_segment(consumer));
        match self.read::<PositionsBody>(&path).await {
            Ok(p) => Ok(p.map(|p| p.partitions).unwrap_or_default()),
            Err(e) if e.code() == ErrorCode::UnknownConsumer => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// One page of every consumer's positions, each with its partition's end and the lag, in
    /// name then partition order, starting after consumer `after` (`None`: the first page).
    /// When [`ConsumersBody::truncated`], ask again with the last name listed.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`]: `bad_request` for an `after` that is not a consumer name, a 503
    /// past the retries; [`ClientError::Transport`].
    pub async fn consumers(&self, after: Option<&str>) -> Result<ConsumersBody, ClientError> {
        let path = match after {
            Some(name) => format!("/v1/consumers?after={}", path_segment(name)),
            None => "/v1/consumers".to_owned(),
        };
        self.read::<ConsumersBody>(&path)
            .await?
            .ok_or_else(|| ClientError::Protocol("GET /v1/consumers answered not found".to_owned()))
    }

    /// Deletes every position of `consumer` (and its lag series), answering what was deleted:
    /// empty when it had none. Sent once (a delete that got no answer is reported, not sent
    /// again: read [`Client::positions`] to tell).
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`]: `consumer_active` when its positions kept being set while they
    /// were deleted (stop the consumer first), `partition_held` when the consumer is a
    /// consumer group one of whose members holds a partition (stop the group's members
    /// first), `bad_request`, a 503;
    /// [`ClientError::Transport`].
    pub async fn delete_consumer(
        &self,
        consumer: &str,
    ) -> Result<Vec<RemovedPositionBody>, ClientError> {
        let node = self.inner.view.any_node();
        let url = format!("{node}/v1/consumers/{}", path_segment(consumer));
        let answer = self
            .send(Method::DELETE, &url, None)
            .await
            .map_err(ClientError::Transport)?;
        if answer.status.is_success() {
            return Ok(answer.decode::<DeletedConsumerBody>()?.removed);
        }
        match answer.error() {
            e if e.code() == ErrorCode::UnknownConsumer => Ok(Vec::new()),
            e => Err(e),
        }
    }

    /// Sets the position of `consumer` on `partition` to `offset` if it is `expected` (what
    /// the caller read; `None`: it has none yet). Of several callers expecting the same
    /// position exactly one succeeds. A position never moves back this way: see
    /// [`Client::force_position`].
    ///
    /// # Errors
    ///
    /// [`ClientError::PositionConflict`] with the stored position when it is not `expected`
    /// (`position_conflict`) or above `offset` (`position_backwards`);
    /// [`ClientError::PositionBeyondEnd`] when `offset` is at or beyond the partition's end
    /// (a position is the offset of the last event processed); [`ClientError::Api`]
    /// `partition_held` when `consumer` is a consumer group and one of its members holds the
    /// partition (only the member's commits move it then); else as [`Client::position`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(client: monoseq_client::Client) -> Result<(), monoseq_client::ClientError> {
    /// let done = client.position("projector", 0).await?;
    /// // ... process the events after `done` up to offset 500 ...
    /// match client.set_position("projector", 0, 500, done).await {
    ///     Ok(()) => {}
    ///     Err(monoseq_client::ClientError::PositionConflict { current, .. }) => {
    ///         // Another instance moved it to `current`: stop, or continue from there.
    ///         let _ = current;
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_position(
        &self,
        consumer: &str,
        partition: u32,
        offset: u64,
        expected: Option<u64>,
    ) -> Result<(), ClientError> {
        self.put_position(consumer, partition, offset, expected, false)
            .await
    }

    /// As [`Client::set_position`], but `offset` may be below `expected`: a consumer
    /// rewinding to process events again. Still only if the stored position is `expected`.
    ///
    /// # Errors
    ///
    /// As [`Client::set_position`] (never `position_backwards`).
    pub async fn force_position(
        &self,
        consumer: &str,
        partition: u32,
        offset: u64,
        expected: Option<u64>,
    ) -> Result<(), ClientError> {
        self.put_position(consumer, partition, offset, expected, true)
            .await
    }

    async fn put_position(
        &self,
        consumer: &str,
        partition: u32,
        offset: u64,
        expected: Option<u64>,
        force: bool,
    ) -> Result<(), ClientError> {
        let body = serde_json::to_vec(&PutPositionBody {
            offset,
            expected,
            force,
        })
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let body = bytes::Bytes::from(body);
        let path = format!(
            "/v1/consumers/{}/partitions/{partition}",
            path_segment(consumer)
        );
        let started = Instant::now();
        let mut failures = 0u32;
        // An earlier attempt may have been applied (no answer, or a 503 after the write left).
        let mut maybe_applied = false;
        loop {
            let node = self.inner.view.any_node();
            let sent = self
                .send(Method::PUT, &format!("{node}{path}"), Some((&body, None)))
                .await;
            let (error, floor) = match sent {
                Ok(a) if a.status.is_success() => return Ok(()),
                Ok(a) if a.status == StatusCode::CONFLICT => {
                    return refused_put(&a, offset, maybe_applied, (consumer, partition));
                }
                Ok(a) if a.status == StatusCode::SERVICE_UNAVAILABLE => {
                    maybe_applied = true;
                    (a.error(), a.retry_after.unwrap_or_default())
                }
                Ok(a) => return Err(a.error()),
                Err(e) => {
                    maybe_applied = true;
                    if e.is_connect() {
                        self.inner.view.forget_node(&node);
                    }
                    (ClientError::Transport(e), Duration::ZERO)
                }
            };
            failures += 1;
            self.wait_or_fail(started, floor, failures, error).await?;
        }
    }
}

/// What a `409` to a position's `PUT` of `offset` means: a refusal, or, when an earlier
/// attempt may have been applied (`maybe_applied`) and the stored position is the one it sets
/// (`position_conflict` with `current` = `offset`), success (that attempt landed and its
/// answer was lost).
fn refused_put(
    a: &Answer,
    offset: u64,
    maybe_applied: bool,
    (consumer, partition): (&str, u32),
) -> Result<(), ClientError> {
    if a.error().code() == ErrorCode::PartitionHeld {
        return Err(a.error());
    }
    if a.error().code() == ErrorCode::PositionBeyondEnd {
        let refused: PositionBeyondEndBody = a.decode()?;
        return Err(ClientError::PositionBeyondEnd {
            message: refused.message,
            end: refused.end,
        });
    }
    let conflict: PositionConflictBody = a.decode()?;
    if maybe_applied
        && conflict.code == ErrorCode::PositionConflict
        && conflict.current == Some(offset)
    {
        tracing::debug!(
            consumer,
            partition,
            offset,
            "a retried position is stored already: an earlier attempt applied it"
        );
        return Ok(());
    }
    debug_assert!(
        [ErrorCode::PositionConflict, ErrorCode::PositionBackwards].contains(&conflict.code)
    );
    Err(ClientError::PositionConflict {
        code: conflict.code,
        message: conflict.message,
        current: conflict.current,
    })
}

/// `name` as one path segment: every byte but the URL's unreserved characters
/// percent-encoded (a consumer name may hold `/`, `?`, `%` or a space).
pub(crate) fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::path_segment;

    #[test]
    fn a_consumer_name_travels_as_one_path_segment() {
        assert_eq!(path_segment("orders-v2.x_~"), "orders-v2.x_~");
        assert_eq!(path_segment("a/b c%?#"), "a%2Fb%20c%25%3F%23");
    }
}
