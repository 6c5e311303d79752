//! The stable codes of every error answer, in one enum: the server answers with them, the client
//! decides on them, and the OpenAPI document lists them (a test holds the three equal). On the
//! wire each is its snake_case string, unchanged since it was first given; a code this build does
//! not know (a newer server's) reads as [`ErrorCode::Unrecognized`], never as an error.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! codes {
    (
        server { $($(#[doc = $doc:literal])+ $variant:ident = $text:literal,)+ }
        client { $($(#[doc = $cdoc:literal])+ $cvariant:ident = $ctext:literal,)+ }
    ) => {
        /// The stable code of an error: what a program decides on. The server answers with the
        /// codes of [`ErrorCode::ALL`]; the client adds its own for calls no server answered.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[doc = $doc])+ $variant,)+
            $($(#[doc = $cdoc])+ $cvariant,)+
            /// A code this build does not know: a newer server's. Decide on the HTTP status.
            Unrecognized,
        }

        impl ErrorCode {
            /// Every code a server of this build can answer, in the order they are declared.
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant,)+];

            /// The code as the wire spells it (`unrecognized` for [`ErrorCode::Unrecognized`],
            /// which no server sends).
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $text,)+
                    $(ErrorCode::$cvariant => $ctext,)+
                    ErrorCode::Unrecognized => "unrecognized",
                }
            }

            /// The code spelled `text`, or [`ErrorCode::Unrecognized`].
            #[must_use]
            pub fn parse(text: &str) -> ErrorCode {
                match text {
                    $($text => ErrorCode::$variant,)+
                    $($ctext => ErrorCode::$cvariant,)+
                    _ => ErrorCode::Unrecognized,
                }
            }
        }
    };
}

codes! {
    server {
        /// The request is malformed: a parameter, header or body field is missing or out of range.
        BadRequest = "bad_request",
        /// The body is not the JSON the operation takes.
        MalformedJson = "malformed_json",
        /// The body is larger than the operation accepts.
        TooLarge = "too_large",
        /// A batch holds more commands than one batch may.
        BatchTooLarge = "batch_too_large",
        /// A batch's body is not a list of commands.
        InvalidBatch = "invalid_batch",
        /// The body did not arrive within the server's time for it.
        BodyTimeout = "body_timeout",
        /// The body's media type is not the one the operation takes (`Content-Type`).
        ContentType = "content_type",
        /// No such resource (route, event, record, sequence).
        NotFound = "not_found",
        /// The resource exists but not with this method.
        MethodNotAllowed = "method_not_allowed",
        /// No valid token was given.
        Unauthorized = "unauthorized",
        /// The token is valid but its scope does not allow the operation.
        Forbidden = "forbidden",
        /// A peer node's request did not carry the cluster's node token.
        NodeUnauthorized = "node_unauthorized",
        /// The server is answering as many requests at once as it may; retry.
        Overloaded = "overloaded",
        /// The server holds as many connections as it may.
        TooManyConnections = "too_many_connections",
        /// The partition has as many followers as it may.
        TooManyFollowers = "too_many_followers",
        /// A follower fell further behind than its bounded buffer: the stream's last message.
        SlowFollower = "slow_follower",
        /// The server is not ready to answer yet (storage opening, partitions not served).
        NotReady = "not_ready",
        /// The operation is unavailable on this node right now; retry.
        Unavailable = "unavailable",
        /// The server is stopping.
        ShuttingDown = "shutting_down",
        /// The partition's writer is saturated; nothing was written, retry later.
        Busy = "busy",
        /// No partition with that number exists.
        NoSuchPartition = "no_such_partition",
        /// The partition is not served anywhere right now (moving, refused, recovering); retry.
        PartitionUnavailable = "partition_unavailable",
        /// The partition is served by another node, which could not be reached; retry.
        OwnerUnreachable = "owner_unreachable",
        /// This node does not serve the partition; send the request to its owner.
        NotOwner = "not_owner",
        /// The command is not valid.
        InvalidCommand = "invalid_command",
        /// The command names a workspace kind that does not exist.
        UnknownWorkspaceKind = "unknown_workspace_kind",
        /// The command updates a record that does not exist.
        UnknownRecord = "unknown_record",
        /// A number would go backwards or repeat: the partition refuses to write it.
        SequenceViolation = "sequence_violation",
        /// The partition's numbers are used up.
        SequenceExhausted = "sequence_exhausted",
        /// The command's expected WLog offset is not where the workspace's WLog ends.
        WlogConflict = "wlog_conflict",
        /// An idempotency key was reused for a different request.
        IdempotencyKeyReused = "idempotency_key_reused",
        /// An idempotency key is not 1–255 printable ASCII characters.
        InvalidIdempotencyKey = "invalid_idempotency_key",
        /// The storage cannot be written or read right now; retry.
        StorageUnavailable = "storage_unavailable",
        /// Stored bytes are damaged; the answer's `key` names where.
        Corrupted = "corrupted",
        /// Something the server did not expect; its log says what.
        Internal = "internal",
        /// Backups are not configured on this server.
        BackupsDisabled = "backups_disabled",
        /// A backup is already running.
        BackupRunning = "backup_running",
        /// The backup failed; the answer says why.
        BackupFailed = "backup_failed",
        /// The server has no tokens, so it refuses administration unless started with
        /// `--admin-on-loopback`.
        AdminOnLoopbackOff = "admin_on_loopback_off",
        /// The backup's path is empty.
        BackupPathEmpty = "backup_path_empty",
        /// The backup's path is not absolute.
        BackupPathRelative = "backup_path_relative",
        /// The backup's path holds `.`, `..` or another part that is not a plain name.
        BackupPathNotNormal = "backup_path_not_normal",
        /// The backup's path is outside the configured backup root.
        BackupPathOutsideRoot = "backup_path_outside_root",
        /// The backup's path leaves the backup root through a link.
        BackupPathLeavesRoot = "backup_path_leaves_root",
        /// The backup's path is inside the data directory.
        BackupPathInDataDir = "backup_path_in_data_dir",
        /// The backup's path already exists.
        BackupPathExists = "backup_path_exists",
        /// The backup's path is a file.
        BackupPathIsFile = "backup_path_is_file",
        /// The backup's path's parent directory does not exist.
        BackupPathParentMissing = "backup_path_parent_missing",
        /// A position write expected another current position.
        PositionConflict = "position_conflict",
        /// A position write would move the position backwards without `force`.
        PositionBackwards = "position_backwards",
        /// A position at or beyond the partition's end.
        PositionBeyondEnd = "position_beyond_end",
        /// No consumer or group of that name holds positions.
        UnknownConsumer = "unknown_consumer",
        /// The consumer is being followed and cannot be deleted now.
        ConsumerActive = "consumer_active",
        /// A group's position cannot be set or deleted while a member holds the partition:
        /// only the member's commits move it then.
        PartitionHeld = "partition_held",
        /// The node hosting a member's session did not answer a heartbeat or leave relayed to
        /// it; retry.
        HostUnreachable = "host_unreachable",
        /// The group has live members and cannot be deleted now.
        GroupActive = "group_active",
        /// A member's commit or heartbeat carries a generation that no longer holds the partition.
        StaleGeneration = "stale_generation",
        /// No session of that name in the group (it ended or expired).
        UnknownSession = "unknown_session",
        /// The group has as many members as it may.
        GroupFull = "group_full",
        /// No group of that name.
        UnknownGroup = "unknown_group",
        /// A named sequence's address (scope and name) is not valid.
        InvalidAddress = "invalid_address",
        /// A named sequence's value is out of range.
        InvalidValue = "invalid_value",
        /// A named sequence's increment is out of range.
        InvalidIncrement = "invalid_increment",
        /// A named sequence's metadata is too large.
        InvalidMetadata = "invalid_metadata",
        /// A named sequence would pass its largest value.
        Overflow = "overflow",
        /// A named sequence's stored bytes cannot be read.
        InvalidStored = "invalid_stored",
        /// No named-sequence operation of that name.
        UnknownOperation = "unknown_operation",
    }
    client {
        /// The client got no answer (connection refused, reset, timed out): a write may or may not
        /// have happened.
        Transport = "transport",
        /// The client got an answer the API does not document.
        Protocol = "protocol",
        /// The client cannot be built as asked (a URL, the token, the CA certificate).
        Config = "config",
        /// The client's token cannot be sent in an HTTP header.
        InvalidToken = "invalid_token",
        /// The servers redirected the call more times in a row than the client follows.
        Redirect = "redirect",
        /// A group member's session ended because another session of the same member name
        /// replaced it.
        Replaced = "replaced",
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ErrorCode, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Ok(ErrorCode::parse(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_as_itself() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), *code);
        }
    }

    #[test]
    fn codes_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "{text} declared twice");
            assert!(
                text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{text}"
            );
        }
    }

    #[test]
    fn a_newer_servers_code_reads_as_unrecognized() {
        let code: ErrorCode = serde_json::from_str("\"a_code_from_the_future\"").unwrap();
        assert_eq!(code, ErrorCode::Unrecognized);
    }
}
