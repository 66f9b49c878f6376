//! [`EtcdError`], and the classification of etcd failures.
//!
//! Each operation has its own error, defined beside the code that raises it (`journal::error`,
//! `store::error`, `lease::error`); an etcd failure inside one is never stringified:
//! [`EtcdError`] keeps the original error as its [`source`](std::error::Error::source) and
//! says what the failure means for the request that met it ([`FailureClass`]): never sent,
//! rejected, outcome unknown, or permanent.
//!
//! `Display` of every error shows its own layer only; walk `source()` for the causes (the
//! `leasehold` command prints the whole chain).

use std::fmt;
use std::time::Duration;

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
#[derive(Clone, Debug, thiserror::Error)]
#[error("etcd {operation} via {endpoint} failed ({class})")]
pub struct EtcdError {
    operation: &'static str,
    endpoint: String,
    class: FailureClass,
    code: Option<tonic::Code>,
    /// Shared, so that every caller of a coalesced append gets the same error.
    #[source]
    source: std::sync::Arc<etcd_client::Error>,
}

impl EtcdError {
    pub(crate) fn new(operation: &'static str, endpoint: &str, source: etcd_client::Error) -> Self {
        let (class, code) = classify(&source);
        Self {
            operation,
            endpoint: endpoint.to_owned(),
            class,
            code,
            source: std::sync::Arc::new(source),
        }
    }

    /// An attempt that got no answer within `after`: it may still be applied.
    pub(crate) fn timed_out(operation: &'static str, endpoint: &str, after: Duration) -> Self {
        let status = tonic::Status::deadline_exceeded(format!("no answer within {after:?}"));
        Self::new(operation, endpoint, etcd_client::Error::GRpcStatus(status))
    }

    /// A request never sent: `endpoint`'s window of requests in flight
    /// ([`ConnectOptions::max_in_flight`](crate::ConnectOptions::max_in_flight)) stayed full
    /// for `after`. Certainly not applied; the next endpoint may have room.
    pub(crate) fn window_full(operation: &'static str, endpoint: &str, after: Duration) -> Self {
        let status = tonic::Status::unavailable(format!(
            "not sent: the window of requests in flight stayed full for {after:?}"
        ));
        Self {
            class: FailureClass::NotSent,
            ..Self::new(operation, endpoint, etcd_client::Error::GRpcStatus(status))
        }
    }

    /// An attempt abandoned because the store shut down: it may still be applied.
    pub(crate) fn stopped(operation: &'static str) -> Self {
        let status = tonic::Status::cancelled("the store is shutting down");
        Self::new(operation, "(none)", etcd_client::Error::GRpcStatus(status))
    }

    /// A write whose outcome can no longer be read (the evidence is gone): it may have been
    /// applied, for good.
    pub(crate) fn unreadable(operation: &'static str, why: String) -> Self {
        let status = tonic::Status::aborted(why);
        Self::new(operation, "(none)", etcd_client::Error::GRpcStatus(status))
    }

    /// etcd's refusal for space (its NOSPACE answer), for tests of what meets it.
    #[cfg(test)]
    pub(crate) fn no_space(operation: &'static str) -> Self {
        let status = tonic::Status::resource_exhausted(ETCD_NO_SPACE);
        Self::new(
            operation,
            "http://e",
            etcd_client::Error::GRpcStatus(status),
        )
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

    /// Whether etcd's reply exceeded the client's decode limit (tonic's "decoded message
    /// length too large", 4 MiB): the request was answered, but the answer is lost; a request
    /// that reads less is answered.
    pub(crate) fn is_reply_too_large(&self) -> bool {
        use std::error::Error as _;
        self.code == Some(tonic::Code::OutOfRange)
            && self
                .source()
                .is_some_and(|source| source.to_string().contains("message length too large"))
    }

    /// Whether the failure is etcd's "requested lease not found" (the lease expired or was
    /// revoked).
    pub fn is_lease_not_found(&self) -> bool {
        status_message(&self.source).is_some_and(|m| m.contains(ETCD_LEASE_NOT_FOUND))
    }

    /// Whether the failure is etcd's "required revision has been compacted".
    pub fn is_compacted(&self) -> bool {
        status_message(&self.source).is_some_and(|m| m.contains(ETCD_COMPACTED))
    }

    /// Whether etcd refused the write for space (etcd's "mvcc: database space exceeded"): its
    /// backend reached `--quota-backend-bytes` and its NOSPACE alarm is raised (this write
    /// raised it, or it was raised already). Until an operator clears the alarm, etcd refuses
    /// every write that puts a key or grants a lease, for every tenant of the cluster;
    /// transactions that only delete, reads and lease renewals still pass. Permanent until then
    /// (class [`Permanent`](FailureClass::Permanent)).
    ///
    /// It does not say that the write was not applied: etcd applies the write that takes its
    /// backend past the quota, then answers it this way (its quota applier); the writes after
    /// it are refused unapplied. leasehold's write path reads what such a write came to
    /// before it reports anything.
    pub fn is_no_space(&self) -> bool {
        self.code == Some(tonic::Code::ResourceExhausted)
            && status_message(&self.source).is_some_and(|m| m.contains(ETCD_NO_SPACE))
    }

    /// Whether etcd refused the request because the user lacks the permission (etcd's
    /// "permission denied": e.g. a key outside the prefixes its roles grant). Permanent.
    pub fn is_permission_denied(&self) -> bool {
        self.code == Some(tonic::Code::PermissionDenied)
    }

    /// Whether etcd refused the credentials: a wrong user name or password, a token it does
    /// not accept (etcd-client has already tried a fresh one), or authentication that is not
    /// enabled on the cluster. Permanent.
    pub fn is_auth_failed(&self) -> bool {
        is_auth_failure(&self.source)
    }

    /// Whether the failure is a TLS failure: a member's certificate the CA does not sign, or
    /// that is expired or for another name; or a client certificate the member requires and
    /// was not given, or does not accept (expired, signed by a CA it does not trust). A
    /// handshake that failed sent nothing (class [`NotSent`](FailureClass::NotSent): another
    /// endpoint may accept the connection).
    pub fn is_tls(&self) -> bool {
        tls_error(&self.source).is_some()
    }

    /// Whether the member refused the client certificate in the TLS handshake: none was
    /// given where it requires one (`--client-cert-auth`), or it is expired, or signed by a CA
    /// the member does not trust. Implies [`is_tls`](Self::is_tls).
    pub fn is_client_certificate_refused(&self) -> bool {
        tls_error(&self.source).is_some_and(|tls| client_certificate_refused(&tls))
    }

    /// One line saying which side refused the TLS handshake, for a TLS failure.
    pub(crate) fn tls_refusal(&self) -> &'static str {
        match tls_error(&self.source) {
            Some(tls) if client_certificate_refused(&tls) => {
                "etcd refused the TLS handshake: the client certificate is missing, expired \
                 or not signed by a CA it trusts"
            }
            Some(rustls::Error::InvalidCertificate(_)) => {
                "the TLS handshake was refused: the member's certificate does not verify \
                 against the CA and server name given"
            }
            _ => "the TLS handshake with etcd failed",
        }
    }
}

// etcd's canonical error descriptions (server/etcdserver/api/v3rpc/rpctypes). etcd reports these
// only as gRPC status messages; its own Go client maps them back by the same strings.
const ETCD_NO_LEADER: &str = "etcdserver: no leader";
const ETCD_TOO_MANY_REQUESTS: &str = "etcdserver: too many requests";
const ETCD_NOT_CAPABLE: &str = "etcdserver: not capable";
const ETCD_COMPACTED: &str = "required revision has been compacted";
const ETCD_LEASE_NOT_FOUND: &str = "requested lease not found";
/// etcd's `ErrGRPCNoSpace` (`codes.ResourceExhausted`): the NOSPACE alarm is raised, or this
/// write would raise it.
const ETCD_NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
// The authentication failures (status code, message): the credentials are refused.
const ETCD_AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
const ETCD_AUTH_NOT_ENABLED: &str = "etcdserver: authentication is not enabled";
const ETCD_USER_EMPTY: &str = "etcdserver: user name is empty";
const ETCD_USER_NOT_FOUND: &str = "etcdserver: user name not found";
// The auth store changed while the request was checked; it was not applied, and may pass when
// sent again (etcd's own client retries it).
const ETCD_AUTH_OLD_REVISION: &str = "etcdserver: revision of auth store is old";

/// Whether `error` is etcd refusing the credentials (see [`EtcdError::is_auth_failed`]).
fn is_auth_failure(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    let message = status.message();
    match status.code() {
        // "etcdserver: invalid auth token"
        Code::Unauthenticated => true,
        Code::InvalidArgument | Code::FailedPrecondition => [
            ETCD_AUTH_FAILED,
            ETCD_AUTH_NOT_ENABLED,
            ETCD_USER_EMPTY,
            ETCD_USER_NOT_FOUND,
        ]
        .iter()
        .any(|known| message.contains(known)),
        _ => false,
    }
}

/// The TLS error in `error`'s cause chain, if any. rustls reports through `io::Error`, whose
/// `source()` skips the error it wraps, so each `io::Error` is looked into as well.
///
/// A fatal alert the member sends after the client's half of the handshake (TLS 1.3: a
/// client certificate it refuses) reaches a request through h2, which hands a connection's
/// error to each of its streams by re-creating the `io::Error` from its kind and message: the
/// rustls error's type is lost there, and only its `Display` is left. Such an error is
/// recognised only when its message is exactly what rustls writes for one of the alerts (the
/// comparison uses rustls's own rendering, never a copy of its text).
fn tls_error(error: &etcd_client::Error) -> Option<rustls::Error> {
    use etcd_client::Error as E;
    // etcd-client's error has no `source()`: start from what it wraps.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match error {
        E::GRpcStatus(status) => Some(status),
        E::TransportError(error) => Some(error),
        E::IoError(error) => Some(error),
        _ => None,
    };
    while let Some(error) = cause {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls.clone());
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls.clone());
            }
            if io.kind() == std::io::ErrorKind::InvalidData
                && let Some(alert) = alert_named_by(&inner.to_string())
            {
                return Some(rustls::Error::AlertReceived(alert));
            }
        }
        cause = error.source();
    }
    None
}

/// The alert whose rustls error (`Error::AlertReceived`) displays exactly as `message`.
fn alert_named_by(message: &str) -> Option<rustls::AlertDescription> {
    (0..=u8::MAX)
        .map(rustls::AlertDescription::from)
        .find(|&alert| rustls::Error::AlertReceived(alert).to_string() == message)
}

/// Whether the member refused the client certificate: the alerts a TLS server sends when it
/// verifies one (RFC 8446 §6.2; Go's `crypto/tls`, which etcd uses, sends
/// `certificate_required` for a missing one, `certificate_expired`, `unknown_ca`,
/// `bad_certificate` for the rest).
fn client_certificate_refused(tls: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        tls,
        rustls::Error::AlertReceived(
            A::CertificateRequired
                | A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
        )
    )
}

/// Whether the TLS failure is a refused handshake, so that no request on that connection was
/// served: the client refused the member's certificate, or the member refused the client's
/// (a server verifies it before it serves anything, also in TLS 1.3 where the client may
/// already have sent a request). Other alerts (a record that fails to decrypt, say) may end
/// a connection that served requests.
fn refused_handshake(tls: &rustls::Error) -> bool {
    use rustls::Error as E;
    client_certificate_refused(tls)
        || matches!(
            tls,
            E::InvalidCertificate(_)
                | E::NoCertificatesPresented
                | E::UnsupportedNameType
                | E::PeerIncompatible(_)
                | E::AlertReceived(
                    rustls::AlertDescription::HandshakeFailure
                        | rustls::AlertDescription::ProtocolVersion
                        | rustls::AlertDescription::InsufficientSecurity
                )
        )
}

fn status_message(error: &etcd_client::Error) -> Option<&str> {
    match error {
        etcd_client::Error::GRpcStatus(status) => Some(status.message()),
        _ => None,
    }
}

/// `error: cause: cause`, one line (for logs and messages).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        line.push_str(": ");
        line.push_str(&next.to_string());
        cause = next.source();
    }
    line
}

/// Classifies an etcd-client error for the request that met it.
pub(crate) fn classify(error: &etcd_client::Error) -> (FailureClass, Option<tonic::Code>) {
    use etcd_client::Error as E;
    let code = match error {
        E::GRpcStatus(status) => Some(status.code()),
        _ => None,
    };
    // A TLS handshake that failed while connecting (`Unavailable`), or that the member
    // refused: nothing on that connection was served. (A client certificate refused after the
    // client's half of a TLS 1.3 handshake comes as `Unknown`, not as `Unavailable`.)
    if let Some(tls) = tls_error(error)
        && (code == Some(tonic::Code::Unavailable) || refused_handshake(&tls))
    {
        return (FailureClass::NotSent, code);
    }
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
        Code::InvalidArgument if message.contains(ETCD_AUTH_OLD_REVISION) => FailureClass::Rejected,
        // The client's own HTTP/2 layer ended the stream: a GOAWAY (h2's
        // `too_many_internal_resets` comes as ResourceExhausted), a reset. Not etcd's verdict,
        // whatever the code, and the request may have been sent.
        _ if from_transport(status) => FailureClass::OutcomeUnknown,
        // Permission denied, credentials refused, invalid token (etcd-client already tried a
        // fresh one): the same request fails the same way. Never retried.
        _ => FailureClass::Permanent,
    }
}

/// Whether the client's transport made `status` rather than etcd: tonic gives a status it makes
/// from an h2 or hyper error that error as its source; one read from etcd's trailers has none.
fn from_transport(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    status.source().is_some()
}

/// Whether an `Unavailable` status comes from failing to open a connection, so the request was
/// never written to the wire. Decided from the typed cause chain: tonic wraps every failure of
/// its connector (TCP connect, connect timeout, TLS handshake) in [`tonic::ConnectError`], and
/// nothing else. An `io::Error` alone says nothing: an established socket reports
/// `HostUnreachable` or `NetworkUnreachable` too, after the request may have been sent.
fn never_connected(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    while let Some(error) = cause {
        if error.is::<tonic::ConnectError>() {
            return true;
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
    fn a_connection_its_own_http2_layer_closed_is_outcome_unknown_not_permanent() {
        use std::sync::Arc;
        use tonic::Status;
        // What tonic makes of h2's GOAWAY(ENHANCE_YOUR_CALM, too_many_internal_resets).
        let mut goaway = Status::resource_exhausted(
            "h2 protocol error: connection error detected: too_many_internal_resets",
        );
        goaway.set_source(Arc::new(std::io::Error::other("GoAway(ENHANCE_YOUR_CALM)")));
        assert_eq!(class_of(goaway), FailureClass::OutcomeUnknown);
        let mut inadequate = Status::permission_denied("h2 protocol error: INADEQUATE_SECURITY");
        inadequate.set_source(Arc::new(std::io::Error::other("INADEQUATE_SECURITY")));
        assert_eq!(class_of(inadequate), FailureClass::OutcomeUnknown);
        // etcd's own refusals, read from its trailers, carry no source.
        assert_eq!(
            class_of(Status::resource_exhausted(
                "etcdserver: mvcc: database space exceeded"
            )),
            FailureClass::Permanent
        );
        assert_eq!(
            class_of(Status::permission_denied("etcdserver: permission denied")),
            FailureClass::Permanent
        );
    }

    #[test]
    fn a_write_refused_for_space_is_permanent_and_typed() {
        use tonic::Status;
        let error = |status| EtcdError::new("txn", "e", etcd_client::Error::GRpcStatus(status));
        let full = error(Status::resource_exhausted(
            "etcdserver: mvcc: database space exceeded",
        ));
        assert_eq!(full.class(), FailureClass::Permanent);
        assert!(full.is_no_space() && !full.class().retry_write());
        // etcd's other ResourceExhausted: not space.
        let busy = error(Status::resource_exhausted("etcdserver: too many requests"));
        assert!(!busy.is_no_space());
        // The same words under another code are not etcd's refusal.
        assert!(!error(Status::unknown("etcdserver: mvcc: database space exceeded")).is_no_space());
    }

    #[test]
    fn refused_credentials_and_permissions_are_permanent_and_typed() {
        use tonic::Status;
        let error = |status| EtcdError::new("txn", "e", etcd_client::Error::GRpcStatus(status));
        let denied = error(Status::permission_denied("etcdserver: permission denied"));
        assert_eq!(denied.class(), FailureClass::Permanent);
        assert!(denied.is_permission_denied() && !denied.is_auth_failed());
        for refused in [
            Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            Status::unauthenticated("etcdserver: invalid auth token"),
            Status::failed_precondition("etcdserver: authentication is not enabled"),
            Status::invalid_argument("etcdserver: user name is empty"),
            Status::failed_precondition("etcdserver: user name not found"),
        ] {
            let refused = error(refused);
            assert_eq!(refused.class(), FailureClass::Permanent, "{refused:?}");
            assert!(refused.is_auth_failed(), "{refused:?}");
            assert!(!refused.is_permission_denied() && !refused.is_tls());
        }
        // Not an authentication failure: a request etcd finds too large.
        let large = error(Status::invalid_argument("etcdserver: request is too large"));
        assert!(!large.is_auth_failed() && !large.is_permission_denied());
        // The auth store moved under the request: not applied, may pass when sent again.
        let old = error(Status::invalid_argument(
            "etcdserver: revision of auth store is old",
        ));
        assert_eq!(old.class(), FailureClass::Rejected);
        assert!(old.class().retry_write());
    }

    #[test]
    fn a_tls_failure_while_connecting_is_not_sent_and_typed() {
        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
        );
        let mut status = tonic::Status::unavailable("error trying to connect");
        status.set_source(std::sync::Arc::new(tls));
        let error = EtcdError::new("status", "e", etcd_client::Error::GRpcStatus(status));
        assert!(error.is_tls());
        assert_eq!(error.class(), FailureClass::NotSent);
        let plain = EtcdError::new(
            "status",
            "e",
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("x")),
        );
        assert!(!plain.is_tls());
    }

    /// A transport error as tonic reports it: `status` caused by `io`.
    fn transport_failure(status: tonic::Status, io: std::io::Error) -> EtcdError {
        let mut status = status;
        status.set_source(std::sync::Arc::new(io));
        EtcdError::new("status", "e", etcd_client::Error::GRpcStatus(status))
    }

    #[test]
    fn a_client_certificate_refused_by_the_member_is_not_sent_and_typed() {
        use rustls::AlertDescription as A;
        for alert in [A::CertificateRequired, A::CertificateExpired, A::UnknownCA] {
            // As h2 hands it to a stream: an io error re-created from the kind and the
            // message, the rustls error's type gone.
            let message = rustls::Error::AlertReceived(alert).to_string();
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, message);
            let error = transport_failure(tonic::Status::unknown("transport error"), io);
            assert!(error.is_tls(), "{alert:?}");
            assert!(error.is_client_certificate_refused(), "{alert:?}");
            assert_eq!(error.class(), FailureClass::NotSent, "{alert:?}");
            assert!(error.tls_refusal().contains("client certificate"));
            // Typed, as a handshake of leasehold's own reports it.
            let io = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::AlertReceived(alert),
            );
            let error = EtcdError::new("TLS handshake", "e", etcd_client::Error::IoError(io));
            assert!(error.is_client_certificate_refused(), "{alert:?}");
            assert_eq!(error.class(), FailureClass::NotSent, "{alert:?}");
        }
        // An alert that may end a connection that served requests: TLS, outcome unknown.
        let message = rustls::Error::AlertReceived(A::BadRecordMac).to_string();
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, message);
        let error = transport_failure(tonic::Status::unknown("transport error"), io);
        assert!(error.is_tls() && !error.is_client_certificate_refused());
        assert_eq!(error.class(), FailureClass::OutcomeUnknown);
        // Text that only looks like an alert is not one.
        for text in [
            "received fatal alert: CertificateRequired, and more",
            "fatal alert",
        ] {
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, text);
            let error = transport_failure(tonic::Status::unknown("transport error"), io);
            assert!(!error.is_tls(), "{text}");
        }
        let message = rustls::Error::AlertReceived(A::CertificateRequired).to_string();
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, message);
        let error = transport_failure(tonic::Status::unknown("transport error"), io);
        assert!(
            !error.is_tls(),
            "only an InvalidData error carries a TLS failure"
        );
    }

    #[test]
    fn a_refused_connection_is_not_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let status = tonic::Status::from_error(Box::new(refused));
        assert_eq!(status.code(), tonic::Code::Unknown);
        // from_error keeps the io error as the source but picks no code: mimic tonic's
        // transport, which reports a failed connect as Unavailable "tcp connect error" with
        // its connector's error (wrapped in tonic::ConnectError) as the cause.
        let connect = |kind| {
            let mut unavailable = tonic::Status::unavailable("tcp connect error");
            unavailable.set_source(std::sync::Arc::new(tonic::ConnectError(Box::new(
                std::io::Error::from(kind),
            ))));
            unavailable
        };
        assert_eq!(
            class_of(connect(std::io::ErrorKind::ConnectionRefused)),
            FailureClass::NotSent
        );
        assert_eq!(
            class_of(connect(std::io::ErrorKind::TimedOut)),
            FailureClass::NotSent
        );
        // The same io errors from an established connection (no connect error around them):
        // the request may have been sent.
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::HostUnreachable,
            std::io::ErrorKind::NetworkUnreachable,
        ] {
            let mut unavailable = tonic::Status::unavailable("transport error");
            unavailable.set_source(std::sync::Arc::new(std::io::Error::from(kind)));
            assert_eq!(
                class_of(unavailable),
                FailureClass::OutcomeUnknown,
                "{kind:?}"
            );
        }
        assert!(FailureClass::NotSent.retry_write());
        assert!(!FailureClass::OutcomeUnknown.retry_write());
        assert!(FailureClass::OutcomeUnknown.retry_read());
        assert!(!FailureClass::Permanent.retry_read());
    }
}
