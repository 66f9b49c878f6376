//! [`ConnectError`], why a connection could not be made (with the TLS probe that tells a refused
//! client certificate from a closed connection), and the member status the first request reads.

use super::error::{EtcdError, FailureClass};

/// [`Connection::connect`](super::Connection::connect) failed.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No endpoint was given. Permanent.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// An endpoint is not a usable URL. Permanent.
    #[error("invalid etcd endpoint {endpoint:?}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why etcd-client refused it.
        #[source]
        source: etcd_client::Error,
    },
    /// The TLS handshake was refused ([`EtcdError::is_tls`]): the member's certificate does
    /// not verify against the CA and server name given, or the member does not accept the
    /// client certificate ([`EtcdError::is_client_certificate_refused`]: none, expired, or
    /// signed by a CA it does not trust). Nothing was sent. Each endpoint was tried until the
    /// retry policy's deadline, since certificates may be rotating: transient while they are,
    /// permanent until the certificates or the TLS options are fixed.
    #[error("{} ({endpoints})", .source.tls_refusal())]
    Tls {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The refusal; [`EtcdError::is_tls`] holds.
        #[source]
        source: EtcdError,
    },
    /// No endpoint answered within the retry policy's deadline. Transient: etcd may come up.
    #[error("no etcd endpoint answered ({endpoints})")]
    Unreachable {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The last failure.
        #[source]
        source: EtcdError,
    },
    /// An endpoint answered and refused the credentials: a wrong user or password, or
    /// authentication not enabled on the cluster ([`EtcdError::is_auth_failed`]), or a
    /// permission the user lacks ([`EtcdError::is_permission_denied`]). Permanent.
    #[error("etcd refused the credentials ({endpoints})")]
    Refused {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// etcd's refusal.
        #[source]
        source: EtcdError,
    },
}

/// The error and its causes on one line, `error: cause: cause`: what a `main` that returns it
/// (through `?` and `Box<dyn Error>`) prints, rather than a dump of its fields.
impl std::fmt::Debug for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&super::error::chain(self))
    }
}

/// Whether a request failed because its connection closed, for no reason the error gives: on
/// a TLS connection, the member may have refused the client certificate. In TLS 1.3 the member
/// says so with an alert after the client's half of the handshake, and when the connection
/// ends before the request was handed to it, hyper reports only "connection closed"; a
/// timeout, a refused connection or a typed failure say more and are taken as they are.
pub(super) fn closed_without_a_reason(error: &EtcdError) -> bool {
    error.class() == FailureClass::OutcomeUnknown
        && !error.is_tls()
        && error.code() != Some(tonic::Code::DeadlineExceeded)
}

/// One TLS handshake with a member, outside tonic, to learn why a connection was refused.
pub(super) mod tls_probe {
    use std::io;
    use std::net::{TcpStream, ToSocketAddrs as _};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    use super::EtcdError;
    use crate::etcd::TlsOptions;

    /// Shakes hands with `endpoint` as the connection's clients do (same CA, client
    /// certificate, server name, ALPN) and waits for the member's verdict, sending nothing
    /// after the handshake, so that an alert it sends is read before the connection closes.
    /// The refusal as an [`EtcdError`] (a TLS failure), or `None` when the handshake is
    /// accepted or the probe itself cannot tell (no connection, a timeout).
    pub(in crate::etcd) async fn refusal(
        endpoint: &str,
        tls: &TlsOptions,
        timeout: Duration,
    ) -> Option<EtcdError> {
        let (host, port, name) = target(endpoint, tls)?;
        let config = client_config(tls)?;
        let deadline = crate::deadline::deadline(tokio::time::Instant::now(), timeout).into_std();
        let refused =
            tokio::task::spawn_blocking(move || handshake(&host, port, name, config, deadline))
                .await
                .ok()??;
        tracing::debug!(endpoint, error = %refused, "the TLS handshake is refused");
        let io = io::Error::new(io::ErrorKind::InvalidData, refused);
        Some(EtcdError::new(
            "TLS handshake",
            endpoint,
            etcd_client::Error::IoError(io),
        ))
    }

    /// The host and port to connect to, and the name to verify.
    fn target(endpoint: &str, tls: &TlsOptions) -> Option<(String, u16, ServerName<'static>)> {
        let uri: tonic::codegen::http::Uri = endpoint.parse().ok()?;
        let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(443);
        let name = tls.domain_name.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.to_owned()).ok()?;
        Some((host.to_owned(), port, name))
    }

    /// A rustls client configuration like tonic's: the CA as the only root, the client
    /// certificate if any, HTTP/2 by ALPN.
    fn client_config(tls: &TlsOptions) -> Option<Arc<rustls::ClientConfig>> {
        // The provider tonic's `tls-ring` connects with, so the probe sees what the connection
        // saw. rustls 0.23.48 deprecates it for lacking post-quantum key exchange; ring has no
        // other, and etcd's members offer none either.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(&tls.ca_pem) {
            roots.add(certificate.ok()?).ok()?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots);
        let mut config = match &tls.identity {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .ok()?;
                let key = PrivateKeyDer::from_pem_slice(key).ok()?;
                builder.with_client_auth_cert(chain, key).ok()?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Some(Arc::new(config))
    }

    /// The handshake, then reads until the member's verdict: the TLS error, if any.
    fn handshake(
        host: &str,
        port: u16,
        name: ServerName<'static>,
        config: Arc<rustls::ClientConfig>,
        deadline: Instant,
    ) -> Option<rustls::Error> {
        let left = || deadline.checked_duration_since(Instant::now());
        let address = (host, port).to_socket_addrs().ok()?.next()?;
        let mut socket = TcpStream::connect_timeout(&address, left()?).ok()?;
        let mut connection = rustls::ClientConnection::new(config, name).ok()?;
        loop {
            let left = left().filter(|left| !left.is_zero())?;
            socket.set_read_timeout(Some(left)).ok()?;
            socket.set_write_timeout(Some(left)).ok()?;
            match connection.complete_io(&mut socket) {
                // The connection ended with no alert, or the member waits for a request.
                Ok((0, 0)) if !connection.is_handshaking() => return None,
                Ok(_) => {}
                Err(error) => {
                    return error
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                        .cloned();
                }
            }
        }
    }
}

/// The status of the etcd member that answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    /// The endpoint that answered.
    pub endpoint: String,
    /// Its member ID.
    pub member_id: u64,
    /// The member ID of the leader it knows, 0 when it knows none.
    pub leader_id: u64,
    /// The cluster's current revision as seen by this member.
    pub revision: u64,
    /// The raft term.
    pub raft_term: u64,
    /// The etcd server version, e.g. `3.5.16`.
    pub version: String,
}

impl MemberStatus {
    /// Whether this member runs an etcd older than [`MINIMUM_ETCD`] (a version that does not
    /// parse is not called old).
    pub fn is_older_than_minimum(&self) -> bool {
        older_than_minimum(&self.version)
    }

    pub(crate) fn from_response(endpoint: String, status: &etcd_client::StatusResponse) -> Self {
        let header = status.header();
        Self {
            endpoint,
            member_id: header.map_or(0, |h| h.member_id()),
            leader_id: status.leader(),
            revision: header.map_or(0, |h| h.revision()).max(0) as u64,
            raft_term: status.raft_term(),
            version: status.version().to_owned(),
        }
    }
}

/// The oldest etcd release leasehold's guarantees hold on in full: 3.5.28 fixed stale
/// linearizable reads around a leader change or a process pause (the resolving read of an
/// append or acquisition whose outcome is unknown depends on them) and, with 3.5.23, a
/// renewal that succeeded after its lease was revoked. (Tenants isolated by RBAC need 3.5.30:
/// nested transactions could bypass permission checks before it.)
pub const MINIMUM_ETCD: (u64, u64, u64) = (3, 5, 28);

/// Whether `version` (`3.5.16`, possibly with a suffix) is older than [`MINIMUM_ETCD`]. A
/// version that does not parse is not called old.
fn older_than_minimum(version: &str) -> bool {
    parse_version(version).is_some_and(|version| version < MINIMUM_ETCD)
}

/// `version` (`3.5.16`, possibly with a suffix) as (major, minor, patch); `None` if it does not
/// parse.
pub(crate) fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version
        .split(['.', '-', '+'])
        .map(|part| part.parse::<u64>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) => Some((major, minor, patch)),
        _ => None,
    }
}

/// Warns that `member` runs an etcd older than [`MINIMUM_ETCD`], once per process for each
/// endpoint: a process that connects many times (a loop of commands, a store per test) says it
/// once.
pub(crate) fn warn_if_old(member: &MemberStatus) {
    if member.is_older_than_minimum() && first_warning(&member.endpoint) {
        let (major, minor, patch) = MINIMUM_ETCD;
        tracing::warn!(
            endpoint = %member.endpoint,
            version = %member.version,
            "etcd {} is older than {major}.{minor}.{patch}, which fixed stale linearizable reads around a leader change and a renewal after a revoke (docs/production.md, etcd versions; silenced by ConnectOptions::with_version_warning(false), the tool's --no-version-warning)",
            member.version
        );
    }
}

/// Whether this process has not warned of `endpoint`'s version yet; true once per endpoint.
fn first_warning(endpoint: &str) -> bool {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut warned = crate::sync::lock(&WARNED);
    if warned.iter().any(|known| known == endpoint) {
        return false;
    }
    warned.push(endpoint.to_owned());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_warning_is_given_once_per_endpoint() {
        assert!(first_warning("http://version-test-a:2379"));
        assert!(!first_warning("http://version-test-a:2379"));
        assert!(first_warning("http://version-test-b:2379"));
        assert!(!first_warning("http://version-test-a:2379"));
        assert!(!first_warning("http://version-test-b:2379"));
    }

    #[test]
    fn versions_before_the_minimum_are_old_and_garbage_is_not() {
        for old in ["3.4.23", "3.5.16", "3.5.27", "2.3.8", "3.5.0-rc.1"] {
            assert!(older_than_minimum(old), "{old}");
        }
        for fine in [
            "3.5.28",
            "3.5.30",
            "3.6.0",
            "4.0.0",
            "3.5.28+dirty",
            "",
            "v3",
            "3.x.1",
        ] {
            assert!(!older_than_minimum(fine), "{fine}");
        }
    }
}
