//! How to reach etcd: endpoints, timeouts, retries, TLS and credentials.

use std::time::Duration;

use zeroize::Zeroizing;

/// How long and how often idempotent requests are retried.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// No retry starts after this much time has passed since the first attempt.
    /// `Duration::MAX` retries forever (a deadline longer than about 30 years is that far).
    pub deadline: Duration,
    /// The pause after the first full round of endpoints has failed; doubled after each round.
    pub initial_backoff: Duration,
    /// The longest pause between rounds (taken as `initial_backoff` when shorter).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// Sets how long a request is retried in all.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the first pause between retries and the longest.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }
}

/// Where and how to connect.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Client URLs of etcd members, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// How long opening one connection may take.
    pub connect_timeout: Duration,
    /// How long one unary request may take before it fails as outcome unknown.
    pub request_timeout: Duration,
    /// Retries of idempotent requests, and of writes that were certainly not applied.
    pub retry: RetryPolicy,
    /// TLS for `https://` endpoints: the CA to trust, and a client certificate when etcd asks
    /// for one. `None`: `http://` endpoints.
    pub tls: Option<TlsOptions>,
    /// A user and password for etcd's authentication (`etcdctl --user`). `None`: no
    /// authentication.
    pub credentials: Option<Credentials>,
    /// How many unary requests may be in flight on one endpoint's connection at once; more
    /// wait their turn (in order) before their attempt's timeout starts. However many
    /// sessions a store hosts, etcd sees at most this many of its requests at a time, and
    /// few attempts are cancelled (each cancelled one counts towards the reset limit at which
    /// the HTTP/2 layer closes a connection). At least 1.
    pub max_in_flight: usize,
    /// Whether connecting warns (at WARN, once per process for each endpoint) when the member
    /// that answers runs an etcd older than [`MINIMUM_ETCD`](crate::MINIMUM_ETCD). Default
    /// true.
    pub version_warning: bool,
}

impl ConnectOptions {
    /// [`max_in_flight`](Self::max_in_flight) unless set: enough to keep a member busy (a
    /// batched transaction carries many sessions), few enough that a member which stalls has
    /// no more than this many attempts cancelled by their timeouts.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = 128;

    /// Options for `endpoints`, with the defaults: 3 s to connect, 5 s a request, and the
    /// default [`RetryPolicy`].
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            tls: None,
            credentials: None,
            max_in_flight: Self::DEFAULT_MAX_IN_FLIGHT,
            version_warning: true,
        }
    }

    /// Connects over TLS (`https://` endpoints) with `tls`.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticates as `user` with `password`: every client gets a token when it first
    /// connects, and a fresh one whenever etcd reports the token expired or invalid.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::new(user, password));
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets how long opening one connection may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long one unary request may take.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets whether connecting warns of an etcd older than
    /// [`MINIMUM_ETCD`](crate::MINIMUM_ETCD) (see [`version_warning`](Self::version_warning)):
    /// `false` for a test suite or a fleet that runs such an etcd knowingly.
    pub fn with_version_warning(mut self, warn: bool) -> Self {
        self.version_warning = warn;
        self
    }

    /// Sets how many unary requests may be in flight on one endpoint's connection (see
    /// [`max_in_flight`](Self::max_in_flight)); 0 counts as 1.
    pub fn with_max_in_flight(mut self, requests: usize) -> Self {
        self.max_in_flight = requests;
        self
    }
}

/// TLS settings for `https://` endpoints (etcd's `--cert-file`, `--key-file`,
/// `--trusted-ca-file`, `--client-cert-auth`; `etcdctl --cacert --cert --key`).
///
/// The members' certificates must chain to the CA given here (the system's roots are not
/// used); their names must match the endpoint's host, or the name set with
/// [`with_domain_name`](Self::with_domain_name). `Debug` never shows the private key.
#[derive(Clone)]
#[non_exhaustive]
pub struct TlsOptions {
    pub(super) ca_pem: Vec<u8>,
    pub(super) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(super) domain_name: Option<String>,
}

impl TlsOptions {
    /// Trusts the CA certificate(s) in `ca_pem` (PEM) for the members' certificates.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            identity: None,
            domain_name: None,
        }
    }

    /// Presents a client certificate (PEM) and its private key (PEM), for members that
    /// require one (`--client-cert-auth`).
    pub fn with_client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks the members' certificates against `name` instead of each endpoint's host.
    pub fn with_domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain_name = Some(name.into());
        self
    }

    /// Whether a client certificate is presented.
    pub fn has_client_identity(&self) -> bool {
        self.identity.is_some()
    }

    pub(crate) fn to_etcd(&self) -> etcd_client::TlsOptions {
        let mut tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.domain_name {
            tls = tls.domain_name(name.clone());
        }
        tls
    }
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field(
                "client_identity",
                &self.identity.as_ref().map(|_| "(certificate and key)"),
            )
            .field("domain_name", &self.domain_name)
            .finish()
    }
}

/// A user name and password for etcd's authentication.
///
/// The password is held in a [`Zeroizing`] buffer: it is overwritten with zeros when the
/// credentials (and every clone of them) are dropped. `Debug` never shows it, and there is no
/// accessor for it. etcd-client is handed a copy of its own whenever a client authenticates
/// (it keeps it to fetch fresh tokens), and that copy is not wiped.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: Zeroizing<String>,
}

impl Credentials {
    /// `user`, authenticated with `password`. The string given is moved in, not copied, so
    /// the only copy left to wipe is the one held here.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: Zeroizing::new(password.into()),
        }
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The user and a copy of the password, as etcd-client takes them.
    pub(crate) fn pair(&self) -> (String, String) {
        (self.user.clone(), self.password.as_str().to_owned())
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"(redacted)")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_wiped_on_drop_and_never_shown() {
        let credentials = Credentials::new("alice", "s3cret-for-debug");
        // Held in a buffer that zeroes itself when dropped.
        let _: &Zeroizing<String> = &credentials.password;
        assert_eq!(credentials.pair().1, "s3cret-for-debug");
        let options = ConnectOptions::new(["http://e"]).with_user("alice", "s3cret-for-debug");
        for shown in [format!("{credentials:?}"), format!("{options:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("alice"), "{shown}");
        }
    }
}
