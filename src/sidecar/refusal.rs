//! What the sidecar answers instead of a result: a gRPC status with a `google.rpc.ErrorInfo`
//! (domain `leasehold`, one of [`REASONS`], metadata), a `RetryInfo` on UNAVAILABLE and
//! RESOURCE_EXHAUSTED, a `BadRequest` for malformed fields. Kept as plain data until it is
//! answered.
//!
//! [`REASONS`] is the one list of the reasons: a test holds the proto's comment and
//! docs/sidecar.md to it, and every reason the sidecar's code names to be in it.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::etcd::{EtcdError, FailureClass};
use crate::journal::{
    JournalWriteError, OpenJournalError, ReplayError, RetentionError, Unknowable,
};
use crate::lease::{Epoch, LossReason};

/// The `domain` of every `ErrorInfo` the sidecar sends.
pub const DOMAIN: &str = "leasehold";

/// Every `ErrorInfo` reason the sidecar sends (and `Failed.reason` of an acquisition).
pub const REASONS: &[&str] = &[
    "FENCED",
    "LEASE_LOST",
    "NOT_OWNER",
    "NOT_HOLDER",
    "OUTCOME_UNKNOWN",
    "ETCD_UNAVAILABLE",
    "TOO_LARGE",
    "TOO_MANY_RECORDS",
    "EMPTY",
    "SEQUENCE_EXHAUSTED",
    "PERMISSION_DENIED",
    "BEYOND_TIP",
    "OWNED",
    "UNDECODABLE",
    "COMPACTED",
    "TOO_MANY_STREAMS",
    "TOO_MANY_SESSIONS",
    "TOO_MANY_REPLAYS",
    "TOO_MANY_WATCHES",
    "TOO_MANY_BYTES_IN_FLIGHT",
    "REQUEST_IDS_EXHAUSTED",
    "INTERNAL",
];

/// How long a client waits before retrying an UNAVAILABLE call, as its `RetryInfo` says.
pub(crate) const RETRY_AFTER: Duration = Duration::from_millis(200);

/// A refusal, as data: turned into a [`Status`] when answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: Code,
    /// The `ErrorInfo` reason; `None` for a malformed field (a `BadRequest` instead).
    pub(crate) reason: Option<&'static str>,
    pub(crate) message: String,
    pub(crate) metadata: Vec<(&'static str, String)>,
    /// The malformed field, for a `BadRequest`.
    pub(crate) field: Option<&'static str>,
}

impl Refusal {
    fn new(code: Code, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: Some(reason),
            message: message.into(),
            metadata: Vec::new(),
            field: None,
        }
    }

    fn with(mut self, key: &'static str, value: impl ToString) -> Self {
        self.metadata.push((key, value.to_string()));
        self
    }

    /// A field that does not parse: INVALID_ARGUMENT with a `BadRequest`.
    pub(crate) fn malformed(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: Code::InvalidArgument,
            reason: None,
            message: message.into(),
            metadata: Vec::new(),
            field: Some(field),
        }
    }

    /// A request id reused for other records.
    pub(crate) fn reused() -> Self {
        Self::malformed(
            "request_id",
            "the request_id names an append of other records under this epoch",
        )
    }

    /// A request id past the sidecar's bound.
    pub(crate) fn request_id_too_long(length: usize, max: usize) -> Self {
        Self::malformed(
            "request_id",
            format!("the request_id is {length} bytes; at most {max}"),
        )
    }

    /// The call does not carry the live ownership's token.
    pub(crate) fn not_holder(session: uuid::Uuid, epoch: Epoch) -> Self {
        Refusal::new(
            Code::PermissionDenied,
            "NOT_HOLDER",
            format!(
                "session {session} epoch {epoch}: only the stream that holds the ownership \
                 writes, with its token (Acquired.token)"
            ),
        )
        .with("session", session)
        .with("epoch", epoch)
    }

    /// Past one of the sidecar's bounds: `reason`, and the bound's flag.
    pub(crate) fn exhausted(reason: &'static str, what: impl std::fmt::Display) -> Self {
        Refusal::new(Code::ResourceExhausted, reason, what.to_string())
    }

    /// Another owner fenced `epoch`: the session is owned at `owner` now.
    pub(crate) fn fenced(session: uuid::Uuid, epoch: Epoch, owner: Option<Epoch>) -> Self {
        let refusal = Refusal::new(
            Code::FailedPrecondition,
            "FENCED",
            format!("session {session} epoch {epoch} is fenced by a newer owner"),
        )
        .with("session", session)
        .with("epoch", epoch);
        match owner {
            Some(owner) => refusal.with("owner_epoch", owner),
            None => refusal,
        }
    }

    /// The lease of `epoch` was lost (`loss`: a [`LossReason`] label, or [`JOURNAL_BROKEN`]).
    pub(crate) fn lease_lost(session: uuid::Uuid, epoch: Epoch, loss: &str) -> Self {
        Refusal::new(
            Code::FailedPrecondition,
            "LEASE_LOST",
            format!("session {session} epoch {epoch}: the lease is lost ({loss})"),
        )
        .with("session", session)
        .with("epoch", epoch)
        .with("loss", loss)
    }

    /// This sidecar does not own `session` at `epoch`.
    pub(crate) fn not_owner(session: uuid::Uuid, epoch: Epoch, owner: Option<Epoch>) -> Self {
        let refusal = Refusal::new(
            Code::FailedPrecondition,
            "NOT_OWNER",
            format!("session {session} is not owned here at epoch {epoch}"),
        )
        .with("session", session)
        .with("epoch", epoch);
        match owner {
            Some(owner) => refusal.with("owner_epoch", owner),
            None => refusal,
        }
    }

    /// The journal cannot tell whether the append is in it (`why`); `gone`: for good.
    pub(crate) fn unknowable(session: uuid::Uuid, epoch: Epoch, why: Unknowable) -> Self {
        let refusal = Refusal::outcome_unknown(session, epoch, why);
        match why {
            Unknowable::Trimmed => refusal.with("gone", "trimmed"),
            Unknowable::NoFence => refusal.with("gone", "no_fence"),
            _ => refusal,
        }
    }

    /// What a failed read of a journal (a replay, a search for a request id) is for the
    /// client.
    pub(crate) fn of_read(error: &ReplayError) -> Self {
        let message = crate::etcd::chain(error);
        match error {
            ReplayError::Compacted { .. } => Refusal::new(Code::OutOfRange, "COMPACTED", message),
            ReplayError::Decode(_) => Refusal::new(Code::DataLoss, "UNDECODABLE", message),
            ReplayError::Etcd(error) => Refusal::etcd(error),
        }
    }

    /// What a failed trim or delete is for the client.
    pub(crate) fn of_retention(session: uuid::Uuid, epoch: Epoch, error: &RetentionError) -> Self {
        let message = crate::etcd::chain(error);
        match error {
            RetentionError::LeaseLost(lost) => Refusal::lease_lost(
                session,
                epoch,
                lost.source.reason.map_or("expired", loss_label),
            ),
            RetentionError::NotOwner { owner, .. } => match owner {
                Some(owner) if *owner > epoch => Refusal::fenced(session, epoch, Some(*owner)),
                owner => Refusal::not_owner(session, epoch, *owner),
            },
            RetentionError::Owned { owner, .. } => {
                Refusal::new(Code::FailedPrecondition, "OWNED", message)
                    .with("session", session)
                    .with("owner_epoch", owner)
            }
            RetentionError::BeyondTip { tip, .. } => {
                Refusal::new(Code::OutOfRange, "BEYOND_TIP", message).with("tip_seq", tip)
            }
            RetentionError::Decode(_) => Refusal::new(Code::DataLoss, "UNDECODABLE", message),
            RetentionError::Contended { .. } => Refusal::unavailable(message),
            RetentionError::Etcd(error) => Refusal::etcd(error),
        }
    }

    /// The append's outcome is unknown: retry with the same request id to settle it.
    pub(crate) fn outcome_unknown(session: uuid::Uuid, epoch: Epoch, why: impl ToString) -> Self {
        Refusal::new(
            Code::Unavailable,
            "OUTCOME_UNKNOWN",
            format!(
                "session {session} epoch {epoch}: the append may or may not have committed \
                 ({}); retry with the same request_id to learn which",
                why.to_string()
            ),
        )
        .with("session", session)
        .with("epoch", epoch)
    }

    /// etcd failed a request: UNAVAILABLE (or PERMISSION_DENIED), nothing applied.
    pub(crate) fn etcd(error: &EtcdError) -> Self {
        let message = crate::etcd::chain(error);
        if error.is_permission_denied() {
            return Refusal::new(Code::PermissionDenied, "PERMISSION_DENIED", message);
        }
        let refusal = Refusal::new(Code::Unavailable, "ETCD_UNAVAILABLE", message);
        match error.class() {
            FailureClass::Permanent => refusal.with("permanent", "true"),
            _ => refusal,
        }
    }

    /// UNAVAILABLE for a failure of the sidecar's own (its node lease, its shutdown): nothing
    /// was done, and retrying later may succeed.
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Refusal::new(Code::Unavailable, "ETCD_UNAVAILABLE", message)
    }

    /// What a failed journal open (the fence, once acquired) is for the client.
    pub(crate) fn of_open(session: uuid::Uuid, epoch: Epoch, error: &OpenJournalError) -> Self {
        let message = crate::etcd::chain(error);
        match error {
            OpenJournalError::Etcd(error) => Refusal::etcd(error),
            OpenJournalError::LeaseLost(lost) => Refusal::lease_lost(
                session,
                epoch,
                lost.source.reason.map_or("expired", loss_label),
            ),
            OpenJournalError::Fenced(_) => Refusal::fenced(session, epoch, None),
            OpenJournalError::SequenceExhausted { .. } => {
                Refusal::new(Code::FailedPrecondition, "SEQUENCE_EXHAUSTED", message)
            }
            OpenJournalError::OutcomeUnknown(_) => Refusal::unavailable(message),
            _ => Refusal::new(Code::Internal, "INTERNAL", message),
        }
    }

    /// What an append's error is for its caller.
    pub(crate) fn of_append(session: uuid::Uuid, epoch: Epoch, error: &JournalWriteError) -> Self {
        let message = crate::etcd::chain(error);
        let base = |code, reason| {
            Refusal::new(code, reason, message.clone())
                .with("session", session)
                .with("epoch", epoch)
        };
        match error {
            JournalWriteError::LeaseLost(lost) => Refusal::lease_lost(
                session,
                epoch,
                lost.source.reason.map_or("expired", loss_label),
            ),
            JournalWriteError::Fenced(_) => base(Code::FailedPrecondition, "FENCED"),
            JournalWriteError::Empty => base(Code::InvalidArgument, "EMPTY"),
            JournalWriteError::TooManyRecords { max, .. } => {
                base(Code::InvalidArgument, "TOO_MANY_RECORDS").with("max", max)
            }
            JournalWriteError::TooLarge { max, .. } => {
                base(Code::InvalidArgument, "TOO_LARGE").with("max", max)
            }
            JournalWriteError::SequenceExhausted { .. } => {
                base(Code::FailedPrecondition, "SEQUENCE_EXHAUSTED")
            }
            JournalWriteError::OutcomeUnknown(_) => {
                Refusal::outcome_unknown(session, epoch, message)
            }
            // The journal no longer knows its tip: this call's transaction went away unsettled,
            // or an earlier one's outcome stayed unknown. The session is given up, and the
            // retry learns from the journal whether the call is in it.
            JournalWriteError::Indeterminate => Refusal::outcome_unknown(session, epoch, message),
            JournalWriteError::Closed => Refusal::lease_lost(session, epoch, "released"),
            JournalWriteError::Etcd(error) => Refusal::etcd(error)
                .with("session", session)
                .with("epoch", epoch),
            JournalWriteError::KeyReused => Refusal::reused(),
            JournalWriteError::Trimmed { first_seq } => {
                Refusal::unknowable(session, epoch, Unknowable::Trimmed)
                    .with("first_seq", first_seq)
            }
            JournalWriteError::Undecodable(_) => {
                Refusal::new(Code::DataLoss, "UNDECODABLE", message)
            }
            JournalWriteError::KeysExhausted { max } => Refusal::exhausted(
                "REQUEST_IDS_EXHAUSTED",
                format!(
                    "the sidecar's owned sessions hold {max} request ids already \
                     (--max-request-ids): retry once sessions are released"
                ),
            ),
        }
    }

    /// The status, with its details.
    pub(crate) fn status(&self) -> Status {
        let mut details = match (self.reason, self.field) {
            (Some(reason), _) => {
                let metadata: HashMap<String, String> = self
                    .metadata
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), value.clone()))
                    .collect();
                ErrorDetails::with_error_info(reason, DOMAIN, metadata)
            }
            (None, Some(field)) => ErrorDetails::with_bad_request_violation(field, &self.message),
            (None, None) => ErrorDetails::new(),
        };
        if matches!(self.code, Code::Unavailable | Code::ResourceExhausted) {
            details.set_retry_info(Some(RETRY_AFTER));
        }
        Status::with_error_details(self.code, &self.message, details)
    }
}

/// The label a [`LossReason`] has on the wire (`Lost.reason`, the `loss` metadata).
pub(crate) fn loss_label(reason: LossReason) -> &'static str {
    reason.label()
}

/// `Lost.reason` when the sidecar gives a session up because its journal broke (fenced, or an
/// append whose outcome stayed unknown), its lease still held.
pub(crate) const JOURNAL_BROKEN: &str = "journal_broken";

/// Every `Lost.reason` the sidecar sends: each [`LossReason`]'s label, and [`JOURNAL_BROKEN`].
#[cfg(test)]
fn loss_reasons() -> impl Iterator<Item = &'static str> {
    LossReason::ALL
        .into_iter()
        .map(loss_label)
        .chain([JOURNAL_BROKEN])
}

/// A gRPC code as gRPC names it (`OK`, `FAILED_PRECONDITION`, …).
pub(crate) fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &str) -> String {
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
            .unwrap()
    }

    /// The words of the proto's comment on `Lost.reason`, and of docs/sidecar.md's row for
    /// `Lost`, that are in backquotes or lower snake case: exactly the reasons sent.
    #[test]
    fn every_loss_reason_is_in_the_proto_and_the_docs_and_they_name_no_other() {
        let sent: std::collections::BTreeSet<&str> = loss_reasons().collect();
        let proto = read("proto/leasehold/v1/leasehold.proto");
        let lost = &proto[proto.find("message Lost {").expect("the proto has Lost")..];
        let comment = lost[..lost.find("string reason").expect("Lost has a reason")]
            .lines()
            .filter_map(|line| line.trim().strip_prefix("//"))
            .collect::<Vec<_>>()
            .join(" ");
        let listed = |text: &str| -> std::collections::BTreeSet<String> {
            text.split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .filter(|word| sent.contains(word) || word.contains('_'))
                .map(str::to_owned)
                .collect()
        };
        let in_proto = listed(comment.split_once("Why:").expect("a list").1);
        let docs = read("docs/sidecar.md");
        let row = docs
            .lines()
            .find(|line| line.starts_with("| `Lost {"))
            .expect("docs/sidecar.md has a row for Lost");
        let in_docs: std::collections::BTreeSet<String> = row
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|quoted| !quoted.contains(' '))
            .map(str::to_owned)
            .collect();
        let sent: std::collections::BTreeSet<String> =
            sent.iter().map(|r| (*r).to_owned()).collect();
        assert_eq!(in_proto, sent, "the proto's comment on Lost.reason");
        assert_eq!(in_docs, sent, "docs/sidecar.md's row for Lost");
        // Labels are unique, and each reason reads as its label's words.
        assert_eq!(sent.len(), LossReason::ALL.len() + 1);
        for reason in LossReason::ALL {
            assert_eq!(reason.to_string().replace(' ', "_"), reason.label());
        }
    }

    #[test]
    fn every_reason_is_in_the_proto_and_the_docs_and_the_code_names_no_other() {
        let (proto, docs) = (
            read("proto/leasehold/v1/leasehold.proto"),
            read("docs/sidecar.md"),
        );
        for reason in REASONS {
            assert!(proto.contains(reason), "the proto's comment lacks {reason}");
            assert!(
                docs.contains(&format!("`{reason}`")),
                "docs/sidecar.md lacks `{reason}`"
            );
        }
        // Every name in capitals the sidecar's code writes is a reason or a gRPC code.
        let codes: Vec<&str> = (0..=16)
            .map(|code| code_label(Code::from_i32(code)))
            .collect();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sidecar");
        for file in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
            // The code, not its tests.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for quoted in code.split('"').skip(1).step_by(2) {
                let name = quoted.len() >= 4
                    && quoted.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
                if name {
                    assert!(
                        REASONS.contains(&quoted) || codes.contains(&quoted),
                        "{quoted} is neither a reason of REASONS nor a gRPC code"
                    );
                }
            }
        }
    }
}
