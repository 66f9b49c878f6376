//! [`StoreOptions`]: how a store connects and keeps its leases, validated before it connects.

use std::time::Duration;

use uuid::Uuid;

use super::StoreError;
use crate::deadline::FOREVER;
use crate::etcd::{Credentials, RetryPolicy, TlsOptions, WritePolicy};
#[cfg(feature = "testing")]
use crate::journal::mutant::Mutant;
use crate::journal::{JournalLimits, ReplayOptions};
use crate::keys::Namespace;
use crate::lease::validity;

/// etcd's largest lease TTL, in seconds.
pub const MAX_TTL_SECS: u64 = 9_000_000_000;

/// How a [`Store`](super::Store) connects and keeps its leases.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreOptions {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// The namespace all keys live under.
    pub namespace: Namespace,
    /// This node's name, written into owner keys for people to read.
    pub node: String,
    /// Where this node can be reached (its own gRPC or HTTP address), written into its owner
    /// keys and its host key for routers to read; see [`with_advertise`](Self::with_advertise).
    /// Default none.
    pub advertise: Option<String>,
    /// A few bytes about this node (a zone, a version), written beside `advertise`; at most
    /// [`MAX_METADATA_LEN`] bytes. Default none.
    pub metadata: Vec<u8>,
    /// The node lease's TTL: whole seconds, at least 2 (etcd's minimum). Default 10 s.
    pub ttl: Duration,
    /// Subtracted from every validity deadline; must be below 2·TTL/3 minus a round trip.
    /// Default 1 s.
    pub margin: Duration,
    /// How often a standby acquisition re-checks without a watch event (a backstop against a
    /// lost event, not a poll). Default 5 s.
    pub standby_recheck: Duration,
    /// How long one attempt of a read may take (also through a client of your own, see
    /// [`connect_with_client`](super::Store::connect_with_client)), and how long a foreground delete
    /// (a release) is re-sent before it is left to the background. Default 5 s.
    pub request_timeout: Duration,
    /// How writes are sent and re-sent (attempt timeout, backoff, deadline); see
    /// [`WritePolicy`]. An attempt never waits longer than `request_timeout`, and a write is
    /// re-sent for at most its deadline, three times `ttl` unless set.
    pub write: WritePolicy,
    /// Retries of idempotent requests.
    pub retry: RetryPolicy,
    /// etcd's limits, checked before each journal append.
    pub journal: JournalLimits,
    /// How replays page through journals.
    pub replay: ReplayOptions,
    /// TLS for `https://` endpoints; see [`TlsOptions`].
    pub tls: Option<TlsOptions>,
    /// etcd's authentication: a user and password; see [`Credentials`].
    pub credentials: Option<Credentials>,
    /// How many requests may be in flight on the connection to one endpoint at once, however
    /// many sessions the store hosts; see [`ConnectOptions::max_in_flight`]. Default
    /// [`ConnectOptions::DEFAULT_MAX_IN_FLIGHT`].
    ///
    /// [`ConnectOptions::max_in_flight`]: crate::etcd::ConnectOptions::max_in_flight
    /// [`ConnectOptions::DEFAULT_MAX_IN_FLIGHT`]: crate::etcd::ConnectOptions::DEFAULT_MAX_IN_FLIGHT
    pub max_in_flight: usize,
    /// Whether connecting warns of an etcd older than [`MINIMUM_ETCD`](crate::MINIMUM_ETCD)
    /// (at WARN, once per process for each endpoint); see
    /// [`with_version_warning`](Self::with_version_warning). Default true.
    pub version_warning: bool,
    /// A deliberately broken append, for tests of checkers; see
    /// [`with_mutant`](Self::with_mutant).
    #[cfg(feature = "testing")]
    pub(crate) mutant: Mutant,
}

impl StoreOptions {
    /// Options with the defaults, for `endpoints`, the default namespace and the host's name.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            namespace: Namespace::default(),
            node: default_node_name(),
            advertise: None,
            metadata: Vec::new(),
            ttl: Duration::from_secs(10),
            margin: Duration::from_secs(1),
            standby_recheck: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            write: WritePolicy::default(),
            retry: RetryPolicy::default(),
            journal: JournalLimits::default(),
            replay: ReplayOptions::default(),
            tls: None,
            credentials: None,
            max_in_flight: crate::etcd::ConnectOptions::DEFAULT_MAX_IN_FLIGHT,
            version_warning: true,
            #[cfg(feature = "testing")]
            mutant: Mutant::None,
        }
    }

    /// Replaces the etcd client URLs (e.g. to send one node through a fault proxy while
    /// keeping the rest of its options).
    pub fn with_endpoints<S: Into<String>>(
        mut self,
        endpoints: impl IntoIterator<Item = S>,
    ) -> Self {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// Connects over TLS (`https://` endpoints) with `tls`.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticates as `user` with `password` (etcd's token authentication; an expired
    /// token is replaced by a fresh one, so it never costs a lease).
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::new(user, password));
        self
    }

    /// Sets the namespace.
    pub fn with_namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = namespace;
        self
    }

    /// Sets the node name.
    pub fn with_node(mut self, node: impl Into<String>) -> Self {
        self.node = node.into();
        self
    }

    /// Sets the address this node is reached at: a URL with a scheme and a host (such as
    /// `http://10.0.0.7:31501`), at most [`MAX_ADVERTISE_LEN`] bytes. Its owner keys (value
    /// version 2, see [`OwnerValue`](crate::store::OwnerValue)) and its host key carry it, so
    /// that a request for a session can be sent to the node that owns it.
    ///
    /// In a rolling upgrade from a release that writes only version 1: such releases read a
    /// version 2 owner key as held by someone else (as it is) and a version 2 host key as a
    /// host without [`max_sessions`](crate::HostOptions::max_sessions); so with capped hosts,
    /// advertise once every host runs a release that reads version 2.
    pub fn with_advertise(mut self, url: impl Into<String>) -> Self {
        self.advertise = Some(url.into());
        self
    }

    /// Sets a few bytes about this node (at most [`MAX_METADATA_LEN`]), carried beside the
    /// advertised address.
    pub fn with_metadata(mut self, metadata: impl Into<Vec<u8>>) -> Self {
        self.metadata = metadata.into();
        self
    }

    /// Sets the node lease's TTL and the safety margin.
    pub fn with_ttl(mut self, ttl: Duration, margin: Duration) -> Self {
        self.ttl = ttl;
        self.margin = margin;
        self
    }

    /// Sets how often a standby re-checks without a watch event.
    pub fn with_standby_recheck(mut self, every: Duration) -> Self {
        self.standby_recheck = every;
        self
    }

    /// Sets how long one read may take (and a foreground delete is re-sent).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets how many requests may be in flight on the connection to one endpoint at once
    /// (see [`max_in_flight`](Self::max_in_flight)); 0 counts as 1.
    pub fn with_max_in_flight(mut self, requests: usize) -> Self {
        self.max_in_flight = requests;
        self
    }

    /// Sets whether connecting warns of an etcd older than
    /// [`MINIMUM_ETCD`](crate::MINIMUM_ETCD): `false` for a test suite or a fleet that runs
    /// such an etcd knowingly.
    pub fn with_version_warning(mut self, warn: bool) -> Self {
        self.version_warning = warn;
        self
    }

    /// Sets how writes are sent and re-sent.
    pub fn with_write_policy(mut self, write: WritePolicy) -> Self {
        self.write = write;
        self
    }

    /// Sets the retries of idempotent requests.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets etcd's limits as the journals check them.
    pub fn with_journal_limits(mut self, limits: JournalLimits) -> Self {
        self.journal = limits;
        self
    }

    /// Sets how replays page through journals.
    pub fn with_replay(mut self, replay: ReplayOptions) -> Self {
        self.replay = replay;
        self
    }

    /// Turns on a deliberately broken variant of the append protocol, to show that a checker
    /// catches what it breaks. Never for production: the invariants do not hold under it.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub fn with_mutant(mut self, mutant: Mutant) -> Self {
        self.mutant = mutant;
        self
    }

    pub(super) fn validate(&self) -> Result<(), StoreError> {
        if self.ttl < Duration::from_secs(2)
            || self.ttl > Duration::from_secs(MAX_TTL_SECS)
            || self.ttl.subsec_nanos() != 0
        {
            return Err(StoreError::InvalidTtl { ttl: self.ttl });
        }
        if self.node.is_empty()
            || self.node.len() > MAX_NODE_LEN
            || self.node.contains(['\n', '\r'])
        {
            return Err(StoreError::InvalidNode {
                node: self.node.clone(),
            });
        }
        if let Some(advertise) = &self.advertise
            && !advertisable(advertise)
        {
            return Err(StoreError::InvalidAdvertise {
                advertise: advertise.clone(),
            });
        }
        if self.metadata.len() > MAX_METADATA_LEN {
            return Err(StoreError::InvalidMetadata {
                len: self.metadata.len(),
            });
        }
        if self.write.attempt_timeout.is_zero() || self.write.resend_timeout.is_zero() {
            return Err(StoreError::InvalidWritePolicy {
                policy: self.write.clone(),
            });
        }
        if !self.journal.usable() {
            return Err(StoreError::InvalidJournalLimits {
                limits: self.journal.clone(),
            });
        }
        validity::check_margin(self.ttl, self.margin, Duration::ZERO)?;
        Ok(())
    }
}

/// The write policy a store uses: no attempt waits longer than `request_timeout`; re-sends
/// end at the policy's deadline, three TTLs when it has none; and no timeout, pause or deadline
/// longer than [`FOREVER`] (about 30 years, forever in practice), so that the deadlines made of
/// them, even a few times over, fit the clock.
pub(crate) fn bounded_write_policy(
    write: &WritePolicy,
    request_timeout: Duration,
    ttl: Duration,
) -> WritePolicy {
    let bounded = |d: Duration| d.min(request_timeout).min(FOREVER);
    let deadline = write
        .deadline
        .unwrap_or(ttl.saturating_mul(WRITE_DEADLINE_TTLS));
    WritePolicy {
        attempt_timeout: bounded(write.attempt_timeout),
        resend_timeout: bounded(write.resend_timeout),
        initial_backoff: write.initial_backoff.min(FOREVER),
        max_backoff: write.max_backoff.min(FOREVER),
        deadline: Some(deadline.min(FOREVER)),
    }
}

/// A store's writes are re-sent for at most this many node lease TTLs, unless
/// [`WritePolicy::deadline`] says otherwise.
const WRITE_DEADLINE_TTLS: u32 = 3;

/// The longest node name, in bytes: it is written into every owner key and host key.
pub const MAX_NODE_LEN: usize = 256;

/// The longest advertised address, in bytes.
pub const MAX_ADVERTISE_LEN: usize = 256;

/// The most metadata bytes a node carries in its keys.
pub const MAX_METADATA_LEN: usize = 256;

/// Whether `url` can be advertised: a URL with a scheme and a host, no longer than
/// [`MAX_ADVERTISE_LEN`], without spaces or control characters (the owner value is separated
/// by spaces), and not `-` (which stands for none).
fn advertisable(url: &str) -> bool {
    url.len() <= MAX_ADVERTISE_LEN
        && !url.chars().any(|c| c.is_whitespace() || c.is_control())
        && url
            .parse::<http::Uri>()
            .is_ok_and(|uri| uri.scheme().is_some() && uri.host().is_some_and(|h| !h.is_empty()))
}

fn default_node_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("node-{}", &Uuid::new_v4().simple().to_string()[..8]))
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::deadline::{any_duration, deadline};
    use crate::journal::{self, MAX_IN_FLIGHT};

    proptest::proptest! {
        /// Any TTL and margin: validated into a typed error or accepted, never a panic.
        #[test]
        fn any_ttl_and_margin_is_validated_without_panic(
            secs in proptest::prelude::any::<u64>(),
            nanos in 0u32..1_000_000_000,
            margin_secs in proptest::prelude::any::<u64>(),
        ) {
            let options = StoreOptions::new(["http://127.0.0.1:2379"]).with_ttl(
                Duration::new(secs, nanos),
                Duration::from_secs(margin_secs),
            );
            let result = options.validate();
            let mut zero = StoreOptions::new(["http://127.0.0.1:2379"]);
            zero.write.resend_timeout = Duration::ZERO;
            let refused = matches!(zero.validate(), Err(StoreError::InvalidWritePolicy { .. }));
            proptest::prop_assert!(refused);
            if !(2..=MAX_TTL_SECS).contains(&secs) || nanos != 0 {
                let invalid = matches!(result, Err(StoreError::InvalidTtl { .. }));
                proptest::prop_assert!(invalid);
            }
        }
    }

    fn any_count() -> impl proptest::strategy::Strategy<Value = usize> {
        use proptest::prelude::*;
        prop_oneof![
            Just(0),
            Just(usize::MAX),
            Just(MAX_IN_FLIGHT),
            any::<usize>(),
            0usize..256
        ]
    }

    proptest::proptest! {
        /// Any durations in the store's options (its write policy's and retry policy's too):
        /// validated into a typed error or accepted, never a panic; and the deadlines the store
        /// makes of them fit the clock, even three attempts over. `Duration::MAX` waits
        /// forever, not at once.
        #[test]
        fn any_store_durations_make_deadlines_without_panic(
            [standby, request, attempt, resend, initial, max, retry_deadline, wait]
                in proptest::array::uniform8(any_duration()),
            write_deadline in proptest::option::of(any_duration()),
            ttl in any_duration(),
        ) {
            let mut write = WritePolicy::default()
                .with_attempt_timeout(attempt)
                .with_resend_timeout(resend)
                .with_backoff(initial, max);
            write.deadline = write_deadline;
            let options = StoreOptions::new(["http://127.0.0.1:2379"])
                .with_standby_recheck(standby)
                .with_request_timeout(request)
                .with_write_policy(write)
                .with_retry(RetryPolicy::default().with_deadline(retry_deadline));
            let _ = options.validate();
            let _ = format!("{options:?}");
            let bounded = bounded_write_policy(&options.write, options.request_timeout, ttl);
            proptest::prop_assert!(bounded.attempt_timeout <= attempt.min(request));
            // Re-sends end: at the policy's deadline, or three TTLs.
            let resends = bounded.deadline.expect("a store's writes have a deadline");
            proptest::prop_assert!(resends <= write_deadline.unwrap_or(ttl.saturating_mul(3)));
            proptest::prop_assert!(bounded.resend_timeout <= resend.min(request));
            let now = Instant::now();
            // What the store's tasks add to the clock: three attempts, a backoff.
            let thrice = bounded.attempt_timeout.checked_mul(3);
            proptest::prop_assert!(thrice.and_then(|t| now.checked_add(t)).is_some());
            proptest::prop_assert!(now.checked_add(bounded.max_backoff).is_some());
            proptest::prop_assert!(now.checked_add(resends).is_some());
            // A foreground delete's and a standby acquisition's deadlines.
            for timeout in [options.request_timeout, wait] {
                let until = deadline(now, timeout);
                proptest::prop_assert!(until >= now);
                if timeout == Duration::MAX {
                    proptest::prop_assert_eq!(until - now, FOREVER);
                }
            }
        }

        /// Any journal limits: validated or refused with a typed error; accepted ones give
        /// the batcher a semaphore it can make.
        #[test]
        fn any_journal_limits_are_validated_without_panic(
            [ops, bytes, headroom, in_flight] in proptest::array::uniform4(any_count()),
        ) {
            let limits = JournalLimits::default()
                .with_max_txn_ops(ops)
                .with_max_request_bytes(bytes)
                .with_headroom(headroom)
                .with_in_flight(in_flight);
            let _ = (limits.max_records(), limits.max_bytes());
            let options = StoreOptions::new(["http://127.0.0.1:2379"]).with_journal_limits(limits);
            match options.validate() {
                Ok(()) => drop(tokio::sync::Semaphore::new(in_flight)),
                Err(error) => {
                    let typed = matches!(error, StoreError::InvalidJournalLimits { .. });
                    proptest::prop_assert!(typed);
                    proptest::prop_assert!(ops < journal::MIN_TXN_OPS || !(1..=MAX_IN_FLIGHT).contains(&in_flight));
                }
            }
        }
    }

    #[test]
    fn journal_limits_leave_room_for_an_append_and_one_transaction_in_flight() {
        let limits = |limits: JournalLimits| {
            StoreOptions::new(["http://127.0.0.1:2379"])
                .with_journal_limits(limits)
                .validate()
        };
        assert!(limits(JournalLimits::default()).is_ok());
        assert!(
            limits(
                JournalLimits::default()
                    .with_max_txn_ops(3)
                    .with_in_flight(1)
            )
            .is_ok()
        );
        for bad in [
            JournalLimits::default().with_max_txn_ops(2),
            JournalLimits::default().with_in_flight(0),
            JournalLimits::default().with_in_flight(MAX_IN_FLIGHT + 1),
        ] {
            assert!(
                matches!(
                    limits(bad.clone()),
                    Err(StoreError::InvalidJournalLimits { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn node_names_are_one_line_of_at_most_256_bytes() {
        let node = |name: &str| StoreOptions::new(["http://127.0.0.1:2379"]).with_node(name);
        assert!(node("node-a").validate().is_ok());
        assert!(node(&"n".repeat(MAX_NODE_LEN)).validate().is_ok());
        for bad in ["", "a\nb", "a\rb", &"n".repeat(MAX_NODE_LEN + 1)] {
            assert!(
                matches!(node(bad).validate(), Err(StoreError::InvalidNode { .. })),
                "{bad:?}"
            );
        }
    }
}
