//! Errors shared by every operation, and the classification of etcd failures.
//!
//! Each operation has its own error enum built from struct errors; this module holds the parts
//! they share. An etcd failure is never stringified: [`EtcdError`] keeps the original error as
//! its [`source`](std::error::Error::source) and says what the failure means for the request
//! that met it ([`FailureClass`]): never sent, rejected, outcome unknown, or permanent.
//!
//! `Display` of every error shows its own layer only; walk `source()` for the causes (the
//! `leasehold` command prints the whole chain).

use std::fmt;

/// What a failed etcd request means for its effect, and whether retrying can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureClass {
    /// The request never reached etcd (no connection could be made). Nothing was applied;
    /// retrying, even a write, is safe and may succeed on another endpoint. Transient.
    NotSent,
    /// etcd refused the request without applying it (no leader, too many requests, a broken
    /// stream that will be re-opened). Retrying may succeed. Transient.
    Rejected,
    /// The request may or may not have been applied (client timeout, "request timed out",
    /// "leader changed", a dropped connection). A read may be retried; a write must be resolved
    /// before anything else is concluded. Outcome unknown.
    OutcomeUnknown,
    /// Retrying the same request fails the same way (invalid argument, too large, compacted,
    /// permission denied). Permanent.
    Permanent,
}

impl FailureClass {
    /// Whether an idempotent request (a read, a keepalive, a watch re-open) may be retried.
    pub fn retry_read(self) -> bool {
        self != FailureClass::Permanent
    }

    /// Whether a write may be sent again blindly: only when it certainly had no effect.
    pub fn retry_write(self) -> bool {
        matches!(self, FailureClass::NotSent | FailureClass::Rejected)
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureClass::NotSent => "not sent",
            FailureClass::Rejected => "rejected",
            FailureClass::OutcomeUnknown => "outcome unknown",
            FailureClass::Permanent => "permanent",
        })
    }
}

/// An etcd request failed. [`class`](Self::class) says whether retrying helps and whether a
/// write may have been applied; the original error is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error("etcd {operation} via {endpoint} failed ({class})")]
pub struct EtcdError {
    operation: &'static str,
    endpoint: String,
    class: FailureClass,
    code: Option<tonic::Code>,
    #[source]
    source: etcd_client::Error,
}

impl EtcdError {
    pub(crate) fn new(operation: &'static str, endpoint: &str, source: etcd_client::Error) -> Self {
        let (class, code) = classify(&source);
        Self {
            operation,
            endpoint: endpoint.to_owned(),
            class,
            code,
            source,
        }
    }

    /// What the failure means for the request; see [`FailureClass`].
    pub fn class(&self) -> FailureClass {
        self.class
    }

    /// The request that failed, e.g. `"get"`, `"txn"`.
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The endpoint the request was sent to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The gRPC status code, when etcd or the transport gave one.
    pub fn code(&self) -> Option<tonic::Code> {
        self.code
    }

    /// Whether the failure is etcd's "required revision has been compacted".
    pub fn is_compacted(&self) -> bool {
        status_message(&self.source).is_some_and(|m| m.contains(ETCD_COMPACTED))
    }
}

// etcd's canonical error descriptions (server/etcdserver/api/v3rpc/rpctypes). etcd reports these
// only as gRPC status messages; its own Go client maps them back by the same strings.
const ETCD_NO_LEADER: &str = "etcdserver: no leader";
const ETCD_TOO_MANY_REQUESTS: &str = "etcdserver: too many requests";
const ETCD_NOT_CAPABLE: &str = "etcdserver: not capable";
const ETCD_COMPACTED: &str = "required revision has been compacted";

fn status_message(error: &etcd_client::Error) -> Option<&str> {
    match error {
        etcd_client::Error::GRpcStatus(status) => Some(status.message()),
        _ => None,
    }
}

/// Classifies an etcd-client error for the request that met it.
pub(crate) fn classify(error: &etcd_client::Error) -> (FailureClass, Option<tonic::Code>) {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) => (classify_status(status), Some(status.code())),
        // Building the channel failed: nothing was sent.
        E::TransportError(_) => (FailureClass::NotSent, None),
        // A broken keepalive or watch stream: re-opening it is the retry.
        E::LeaseKeepAliveError(_) | E::WatchError(_) => (FailureClass::Rejected, None),
        E::IoError(_) | E::Internal(_) => (FailureClass::OutcomeUnknown, None),
        _ => (FailureClass::Permanent, None),
    }
}

fn classify_status(status: &tonic::Status) -> FailureClass {
    use tonic::Code;
    let message = status.message();
    match status.code() {
        Code::Unavailable if never_connected(status) => FailureClass::NotSent,
        Code::Unavailable
            if message.contains(ETCD_NO_LEADER)
                || message.contains(ETCD_TOO_MANY_REQUESTS)
                || message.contains(ETCD_NOT_CAPABLE) =>
        {
            FailureClass::Rejected
        }
        // "request timed out", "leader changed", a connection lost mid-request, client timeout
        // (etcd-client's `with_timeout` surfaces as Cancelled "Timeout expired"): the request
        // may have been proposed and may still commit.
        Code::Unavailable
        | Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Unknown
        | Code::Internal
        | Code::Aborted => FailureClass::OutcomeUnknown,
        Code::ResourceExhausted if message.contains(ETCD_TOO_MANY_REQUESTS) => {
            FailureClass::Rejected
        }
        _ => FailureClass::Permanent,
    }
}

/// Whether an `Unavailable` status comes from failing to open a connection, so the request was
/// never written to the wire. Decided from the typed cause chain (an `io::Error` raised while
/// connecting), not from message text.
fn never_connected(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    use std::io::ErrorKind;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
            );
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class_of(status: tonic::Status) -> FailureClass {
        classify(&etcd_client::Error::GRpcStatus(status)).0
    }

    #[test]
    fn etcd_write_outcomes_are_classified_as_the_protocol_needs() {
        use tonic::Status;
        assert_eq!(
            class_of(Status::unavailable("etcdserver: request timed out")),
            FailureClass::OutcomeUnknown
        );
        assert_eq!(
            class_of(Status::unavailable("etcdserver: leader changed")),
            FailureClass::OutcomeUnknown
        );
        assert_eq!(
            class_of(Status::cancelled("Timeout expired")),
            FailureClass::OutcomeUnknown
        );
        assert_eq!(
            class_of(Status::deadline_exceeded("x")),
            FailureClass::OutcomeUnknown
        );
        assert_eq!(
            class_of(Status::unavailable("etcdserver: no leader")),
            FailureClass::Rejected
        );
        assert_eq!(
            class_of(Status::invalid_argument("etcdserver: request is too large")),
            FailureClass::Permanent
        );
        assert_eq!(
            class_of(Status::out_of_range(
                "etcdserver: mvcc: required revision has been compacted"
            )),
            FailureClass::Permanent
        );
    }

    #[test]
    fn a_refused_connection_is_not_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let status = tonic::Status::from_error(Box::new(refused));
        assert_eq!(status.code(), tonic::Code::Unknown);
        // from_error keeps the io error as the source but picks no code: mimic tonic's
        // transport, which reports connect failures as Unavailable with the cause attached.
        let mut unavailable = tonic::Status::unavailable("error trying to connect");
        unavailable.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(class_of(unavailable), FailureClass::NotSent);
        assert!(FailureClass::NotSent.retry_write());
        assert!(!FailureClass::OutcomeUnknown.retry_write());
        assert!(FailureClass::OutcomeUnknown.retry_read());
        assert!(!FailureClass::Permanent.retry_read());
    }
}
