//! The etcd adapter: one [`Store`] per node.
//!
//! A store grants ONE etcd lease for its node (the *node lease*) and keeps it alive on one
//! keepalive stream; every owner key it creates is attached to that lease, so one store holding
//! a thousand sessions costs etcd one lease and one stream. It runs one watch on
//! `{ns}/owners/`, which tells it when one of its sessions is deleted or overtaken and wakes its
//! standby acquisitions.
//!
//! # Acquire
//!
//! One transaction: `if create_revision(owner) == 0 && create_revision(move) == 0 then put(owner,
//! value, lease = node lease), get(tip) else get(owner), get(move)`, where `move` is the
//! session's move key, present only while [`Admin::move_session`](crate::Admin::move_session)
//! moves it to another store (which alone may acquire it meanwhile:
//! [`AcquireError::Moving`] for the others). On success the epoch is the transaction's revision (the key's
//! `create_revision`), and the journal's tip as of that revision is kept for the journal's
//! open, which fences at it without reading it again; otherwise [`LeaseHeldError`] carries the holder's
//! epoch. The value holds this store's id and a fresh nonce, so an acquisition whose outcome is
//! unknown is re-sent byte-identical (the crate's one write path, while the node lease is
//! valid) and settled by reading the key back: our nonce means it was ours. A key of this store
//! that no handle adopts (an acquisition that gave up while its transaction was still in
//! flight) is deleted in the background, guarded by its value. See `acquire.rs`.
//!
//! Dropping the future of an acquisition cannot leave a committed owner key behind: a lease
//! built and not returned is dropped, which releases it; a transaction still in flight that
//! commits later writes a key no handle adopts, which the watch finds and deletes.
//!
//! # Release and background deletes
//!
//! A release deletes the owner key guarded by its epoch; what cannot be confirmed in the
//! foreground goes on in the background, in order (a rig's workspace root before its owner
//! key), queued once, until confirmed, until the node lease it is attached to is lost (which
//! deletes the keys anyway), the store closes, or a permanent error. See `cleanup.rs`.
//!
//! # Keepalive and the validity deadline
//!
//! See `lease::validity`: the deadline is the send instant of the request a reply answers plus
//! the granted TTL minus the safety margin; renewals go out every TTL/3. The keepalive's
//! decisions are a pure state machine (`renewal.rs`); `keepalive.rs` does its I/O. A stream that errs,
//! ends, or leaves a renewal unanswered for half an interval is re-opened on the next endpoint;
//! while no opening is answered, another goes to the next endpoint every 250 ms (a member can
//! hold a renewal for seconds after etcd's leader crashed, while another would answer it).
//! When the deadline passes with no renewal, or etcd says the lease is gone, every lease of the
//! node is lost ([`Expired`](crate::lease::LossReason::Expired),
//! [`KeepaliveFailed`](crate::lease::LossReason::KeepaliveFailed)), that lease ID is never renewed
//! again (it is revoked, best effort) and a fresh node lease is granted for later acquisitions.
//!
//! # Watch
//!
//! Every (re)start of the watch first reads all owner keys linearizably at a revision R and
//! reconciles the sessions it cares about with what it read, then watches from R + 1, so no
//! change is missed across a restart, a compaction or a member change. The watch is created
//! with `require_leader`, so a member cut off from the leader cancels it instead of stalling
//! it, and the store moves to another endpoint. A failed run is restarted after 100 ms,
//! doubling up to 2 s while runs keep failing, and back to 100 ms once a run was healthy (its
//! watch delivered, or stayed open for 10 s).
//!
//! # A namespace outside the user's roles
//!
//! When etcd denies the store's user the owner keys (permission denied: its roles do not cover
//! `{ns}/`), nothing the store holds can be watched, and retrying cannot help. The watch does
//! not restart: it logs the refusal once, at error level, with the namespace. Every lease of
//! the store is then lost ([`PermissionDenied`](crate::lease::LossReason::PermissionDenied)), its
//! node lease is no longer renewed (it is revoked, best effort, or expires by itself: owner
//! keys must not outlive the handles that were told they are lost), no fresh one is granted,
//! and every later [`Store::acquire_lease`] and [`Store::acquire_lease_wait`] fails at once
//! with the permission error ([`AcquireError::Etcd`], [`EtcdError::is_permission_denied`],
//! permanent). A role changed while the watch runs is found at the watch's next restart (etcd
//! checks a watch's permission when it is created). Fix the role, then connect a new store.

mod acquire;
mod cleanup;
mod error;
mod host_value;
mod journals;
mod keepalive;
mod move_value;
mod options;
mod owner_value;
mod owner_watch;
mod registry;
mod renewal;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::deadline::deadline;
use crate::etcd::shared::{SharedParts, SharedWrites};
use crate::etcd::write::WritePolicy;
use crate::etcd::{ConnectOptions, Connection, EtcdError};
use crate::journal::{Batcher, BatcherParts, JournalContext, JournalLimits, ReplayOptions};
use crate::keys::Namespace;
use crate::lease::{Lease, LossReason, NodeLease};
use crate::metrics::Metrics;
use cleanup::Cleanup;
pub use error::{AcquireError, LeaseHeldError, StoreError};
pub(crate) use host_value::{HostValue, LoadValue};
pub use move_value::MOVE_WITHDRAWN_AFTER;
pub(crate) use move_value::{MoveValue, ask_txn};
pub(crate) use options::bounded_write_policy;
pub use options::{MAX_ADVERTISE_LEN, MAX_METADATA_LEN, MAX_NODE_LEN, MAX_TTL_SECS, StoreOptions};
pub use owner_value::OwnerValue;
use registry::Registry;

/// The owner watch's permanent refusal: etcd denied the store's user the owner keys. Set
/// once; the keepalive and the acquisitions act on it (see the [module docs](self)).
#[derive(Default)]
pub(crate) struct Refusal {
    error: std::sync::OnceLock<EtcdError>,
    signal: CancellationToken,
}

impl Refusal {
    /// Records the refusal (the first one counts).
    pub(crate) fn refuse(&self, error: EtcdError) {
        let _ = self.error.set(error);
        self.signal.cancel();
    }

    /// The permission error, once refused.
    pub(crate) fn error(&self) -> Option<&EtcdError> {
        self.error.get()
    }

    /// Resolves once refused.
    pub(crate) async fn refused(&self) {
        self.signal.cancelled().await;
    }
}

/// What a store's handles and tasks share.
pub(crate) struct StoreShared {
    pub(crate) connection: Connection,
    pub(crate) namespace: Namespace,
    pub(crate) node: String,
    /// Where this node is reached, and a few bytes about it: written into its owner values.
    pub(crate) advertise: Option<String>,
    pub(crate) metadata: Vec<u8>,
    /// This store instance, written into its owner values.
    pub(crate) id: Uuid,
    pub(crate) ttl: Duration,
    pub(crate) margin: Duration,
    standby_recheck: Duration,
    request_timeout: Duration,
    pub(crate) write: WritePolicy,
    journal: JournalLimits,
    replay: ReplayOptions,
    current: Mutex<Option<Arc<NodeLease>>>,
    pub(crate) registry: Mutex<Registry>,
    cleanup: mpsc::UnboundedSender<Cleanup>,
    /// The names of cleanup jobs queued or running, so that none is queued twice.
    cleanups: cleanup::Claims,
    pub(crate) shutdown: CancellationToken,
    /// Set when etcd denies the store's user its namespace's owner keys.
    pub(crate) refusal: Refusal,
    pub(crate) tasks: TaskTracker,
    /// The journals' appends share transactions through it.
    batcher: Arc<Batcher>,
    /// Acquisitions, workspace roots and guarded deletes share transactions through it.
    pub(crate) shared_writes: Arc<SharedWrites>,
    /// What its journals share, made at the first open.
    journal_context: std::sync::OnceLock<Arc<JournalContext>>,
    pub(crate) metrics: Metrics,
    /// Names this store (node, namespace) in the logs: the parent of its tasks' and its
    /// calls' spans.
    span: tracing::Span,
}

/// One node's connection to leasehold on etcd: grants and keeps the node lease, watches owner
/// keys, acquires and releases session leases. See the [module docs](crate::store) for the
/// protocol.
///
/// Dropping the store closes it in the background; [`close`](Self::close) does the same and
/// waits for it.
pub struct Store {
    shared: Arc<StoreShared>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("namespace", &self.shared.namespace)
            .field("node", &self.shared.node)
            .field("node_lease", &self.node_lease_id())
            .finish()
    }
}

impl Store {
    /// Connects, grants the node lease and starts the keepalive and watch tasks.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use leasehold::{Namespace, Store, StoreOptions};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let options = StoreOptions::new(["http://127.0.0.1:2379"])
    ///     .with_namespace(Namespace::new("billing")?)
    ///     .with_node("node-a")
    ///     .with_ttl(Duration::from_secs(10), Duration::from_secs(1));
    /// let store = Store::connect(options).await?;
    /// println!("node lease {:?}, TTL {:?}", store.node_lease_id(), store.ttl());
    /// // Every lease the store holds is lost, and the node lease is revoked.
    /// store.close().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(options: StoreOptions) -> Result<Self, StoreError> {
        options.validate()?;
        let mut connect =
            ConnectOptions::new(options.endpoints.clone()).with_retry(options.retry.clone());
        connect.request_timeout = options.request_timeout;
        connect.tls = options.tls.clone();
        connect.credentials = options.credentials.clone();
        connect.max_in_flight = options.max_in_flight;
        connect.version_warning = options.version_warning;
        let connection = Connection::connect(connect)
            .await
            .map_err(StoreError::Connect)?;
        Self::start(connection, options).await
    }

    /// [`connect`](Self::connect) through an `etcd_client::Client` you built yourself (your
    /// own TLS, interceptors or authentication); see [`Connection::from_client`]. The options'
    /// `endpoints`, `tls` and `credentials` are ignored: the client has its own. Every request
    /// through it is bounded as through a store's own clients (`request_timeout`, `write`,
    /// `retry`), whether or not the client has a timeout of its own.
    pub async fn connect_with_client(
        client: etcd_client::Client,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        options.validate()?;
        let connection = Connection::from_client(client, options.retry.clone())
            .await
            .map_err(StoreError::Connect)?
            .with_request_timeout(options.request_timeout)
            .with_max_in_flight(options.max_in_flight);
        if options.version_warning {
            connection.warn_if_old();
        }
        Self::start(connection, options).await
    }

    /// Grants the node lease and starts the keepalive and watch tasks.
    async fn start(connection: Connection, options: StoreOptions) -> Result<Self, StoreError> {
        let (node, validity) = keepalive::grant(&connection, options.ttl, options.margin)
            .await
            .map_err(|error| match error {
                keepalive::GrantError::Etcd(e) => StoreError::Grant(e),
                keepalive::GrantError::Margin(e) => StoreError::Margin(e),
            })?;
        let (cleanup, cleanup_jobs) = mpsc::unbounded_channel();
        let write = bounded_write_policy(&options.write, options.request_timeout, options.ttl);
        let (shutdown, tasks) = (CancellationToken::new(), TaskTracker::new());
        let metrics = Metrics::new(&options.node, &options.namespace);
        let span = tracing::info_span!(
            parent: None,
            "store",
            node = %options.node,
            namespace = %options.namespace
        );
        let batcher = Batcher::new(BatcherParts {
            connection: connection.clone(),
            policy: write.clone(),
            limits: options.journal.clone(),
            metrics: metrics.clone(),
            stop: shutdown.clone(),
            tasks: tasks.clone(),
            span: span.clone(),
            // The seam of the test-only protocol mutants: the protocol as written, unless a
            // test turned a broken variant on.
            #[cfg(feature = "testing")]
            hook: options.mutant.hook(),
            #[cfg(not(feature = "testing"))]
            hook: None,
        });
        let shared_writes = SharedWrites::new(SharedParts {
            connection: connection.clone(),
            policy: write.clone(),
            slots: options.journal.in_flight,
            // etcd refused 127 operations of one transaction each, with --max-txn-ops 128:
            // half the limit leaves room.
            max_members: options.journal.max_txn_ops / 2,
            stop: shutdown.clone(),
            tasks: tasks.clone(),
        });
        let shared = Arc::new(StoreShared {
            shared_writes,
            metrics,
            span,
            connection,
            namespace: options.namespace,
            node: options.node,
            advertise: options.advertise,
            metadata: options.metadata,
            id: Uuid::new_v4(),
            ttl: validity.ttl(),
            margin: options.margin,
            standby_recheck: options.standby_recheck,
            request_timeout: options.request_timeout,
            write,
            journal: options.journal,
            replay: options.replay,
            current: Mutex::new(Some(node.clone())),
            registry: Mutex::new(Registry::default()),
            cleanup,
            cleanups: cleanup::Claims::default(),
            shutdown,
            refusal: Refusal::default(),
            tasks,
            batcher,
            journal_context: std::sync::OnceLock::new(),
        });
        let span = shared.span().clone();
        let _in_store = span.enter();
        tracing::info!(lease = node.id, ttl = ?shared.ttl, "store connected");
        // The store's tasks carry its node and namespace in every event they log.
        shared.tasks.spawn(
            keepalive::run(shared.clone(), node, validity)
                .instrument(tracing::info_span!(parent: &span, "keepalive")),
        );
        shared.tasks.spawn(
            owner_watch::run(shared.clone())
                .instrument(tracing::info_span!(parent: &span, "owner_watch")),
        );
        shared.tasks.spawn(
            cleanup::run(shared.clone(), cleanup_jobs)
                .instrument(tracing::info_span!(parent: &span, "cleanup")),
        );
        drop(_in_store);
        Ok(Self { shared })
    }

    /// The namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.shared.namespace
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// This store's instance id (one per process): the owner values and host key it writes
    /// name it, so a [`directory::Owner`](crate::directory::Owner) whose
    /// `node.store` is this id is this node.
    pub fn id(&self) -> Uuid {
        self.shared.id
    }

    /// The address this node advertises, if any (see
    /// [`StoreOptions::with_advertise`]).
    pub fn advertise(&self) -> Option<&str> {
        self.shared.advertise.as_deref()
    }

    /// The connection, for reads of your own (and tests).
    pub fn connection(&self) -> &Connection {
        &self.shared.connection
    }

    /// The ID of the current node lease, while there is one. It changes when a lost node
    /// lease is replaced.
    pub fn node_lease_id(&self) -> Option<i64> {
        self.shared.current_node().map(|node| node.id)
    }

    /// Whether the current node lease is valid (acquisitions need it).
    pub fn is_node_lease_valid(&self) -> bool {
        self.shared
            .current_node()
            .is_some_and(|node| node.is_valid())
    }

    /// Whether etcd refuses this store's writes for space, and when that changes: `true` from
    /// an append or acquisition etcd refused because its NOSPACE alarm is raised
    /// ([`EtcdError::is_no_space`](crate::etcd::EtcdError::is_no_space)) until the next one it
    /// accepts. Under the alarm etcd refuses every write that puts a key, for every tenant;
    /// trims and deletes of journals still pass (see [`Journal::trim`](crate::journal::Journal::trim)).
    /// Also the metrics `leasehold_nospace` and `leasehold_nospace_alarms_total`.
    pub fn nospace_alarm(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shared.metrics.nospace()
    }

    /// The metrics it records, under its labels.
    #[cfg(feature = "grpc")]
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The TTL etcd granted the node lease.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Resolves, with etcd's permission error, once etcd has denied this store's user the
    /// owner keys of its namespace (see [a namespace outside the user's
    /// roles](self#a-namespace-outside-the-users-roles)): from then on the store holds nothing
    /// and acquires nothing, so a process that only hosts sessions may as well stop.
    pub async fn refused(&self) -> EtcdError {
        self.shared.refusal.refused().await;
        self.shared
            .refusal
            .error()
            .cloned()
            .expect("the error is set before the signal")
    }

    /// The number of session leases held now.
    pub fn held_sessions(&self) -> usize {
        self.shared.registry().held()
    }

    /// Acquires `session` if nobody owns it. One transaction; see the module docs.
    ///
    /// Fails at once with the permission error ([`AcquireError::Etcd`],
    /// [`EtcdError::is_permission_denied`]) once etcd has denied the store's user its
    /// namespace's owner keys (see [a namespace outside the user's
    /// roles](self#a-namespace-outside-the-users-roles)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use leasehold::{AcquireError, Store, StoreOptions, Uuid};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Store::connect(StoreOptions::new(["http://127.0.0.1:2379"])).await?;
    /// let session = Uuid::new_v4();
    /// match store.acquire_lease(session).await {
    ///     Ok(lease) => {
    ///         println!("owning {session} at epoch {}", lease.epoch());
    ///         lease.release().await?;
    ///     }
    ///     Err(AcquireError::Held(held)) => println!("held at epoch {}", held.holder_epoch),
    ///     Err(error) => return Err(error.into()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_lease(&self, session: Uuid) -> Result<Lease, AcquireError> {
        self.acquire_gated(session, None, false).await
    }

    /// Acquires `session` as [`acquire_lease`](Self::acquire_lease) does, but only while it is
    /// in the shared registry ([`Admin::create_session`](crate::Admin::create_session)): the
    /// transaction also compares that the session's registry key exists, so once
    /// [`Admin::finish_session`](crate::Admin::finish_session) has removed it, no acquisition
    /// passes, however late its caller hears of the finish, and the journal the finish deletes
    /// is not fenced again. [`AcquireError::NotRegistered`] when it is not registered (nothing
    /// is written). Session hosts that follow the registry acquire its sessions this way.
    pub async fn acquire_registered(&self, session: Uuid) -> Result<Lease, AcquireError> {
        self.acquire_gated(session, None, true).await
    }

    /// Acquires `session` for a session host: as the target of its move if `moved` (the move
    /// key's `mod_revision` as read: the transaction compares it instead of its absence, and
    /// deletes it; see [`Admin::move_session`](crate::Admin::move_session)); only while it is
    /// registered if `registered` (see [`acquire_registered`](Self::acquire_registered)).
    pub(crate) async fn acquire_hosted(
        &self,
        session: Uuid,
        moved: Option<i64>,
        registered: bool,
    ) -> Result<Lease, AcquireError> {
        self.acquire_gated(session, moved, registered).await
    }

    #[tracing::instrument(name = "acquire", skip_all, parent = self.shared.span(), fields(%session, epoch = tracing::field::Empty))]
    async fn acquire_gated(
        &self,
        session: Uuid,
        moved: Option<i64>,
        registered: bool,
    ) -> Result<Lease, AcquireError> {
        if self.shared.shutdown.is_cancelled() {
            return Err(AcquireError::StoreClosed);
        }
        // In the caller's task: if this future is dropped mid-flight, what it may have
        // committed is an orphan the watch deletes (see the module docs).
        let acquired = self
            .shared
            .clone()
            .acquire(session, moved, registered)
            .await;
        if let Ok(lease) = &acquired {
            tracing::Span::current().record("epoch", tracing::field::display(lease.epoch()));
        }
        acquired
    }

    /// Acquires `session`, standing by while someone else holds it: woken by the owner key's
    /// delete (one watch event, then one transaction), with a slow re-check every
    /// `standby_recheck` as a backstop against a lost event: a read of the owner key (no raft
    /// proposal), the transaction sent again only once the key is gone. Gives up with
    /// [`AcquireError::TimedOut`] after `timeout`; `Duration::MAX` waits forever (a timeout
    /// longer than about 30 years waits that long). Dropping the future cancels it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use leasehold::{AcquireError, Store, StoreOptions, Uuid};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Store::connect(StoreOptions::new(["http://127.0.0.1:2379"])).await?;
    /// let session = Uuid::from_u128(7);
    /// // Stands by for at most a minute while another node owns the session.
    /// match store.acquire_lease_wait(session, Duration::from_secs(60)).await {
    ///     Ok(lease) => {
    ///         let reason = lease.lost().await;
    ///         println!("owned {session} at epoch {} until {reason}", lease.epoch());
    ///     }
    ///     Err(AcquireError::TimedOut { waited, .. }) => println!("still held after {waited:?}"),
    ///     Err(error) => return Err(error.into()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_lease_wait(
        &self,
        session: Uuid,
        timeout: Duration,
    ) -> Result<Lease, AcquireError> {
        let deadline = deadline(Instant::now(), timeout);
        let standby = Standby::register(&self.shared, session);
        let timed_out = || AcquireError::TimedOut {
            session_id: session,
            waited: timeout,
        };
        loop {
            // An attempt cut short by the deadline is safe: a lease nobody receives is
            // released.
            let attempt = tokio::time::timeout_at(deadline, self.acquire_lease(session)).await;
            match attempt.map_err(|_| timed_out())? {
                Ok(lease) => return Ok(lease),
                Err(error) if error.is_transient() => {
                    tracing::debug!(%session, %error, "standing by");
                }
                Err(error) => return Err(error),
            }
            loop {
                tokio::select! {
                    _ = standby.notified() => break,
                    _ = tokio::time::sleep(self.shared.standby_recheck) => {}
                    _ = tokio::time::sleep_until(deadline) => return Err(timed_out()),
                    _ = self.shared.shutdown.cancelled() => return Err(AcquireError::StoreClosed),
                }
                let held = tokio::time::timeout_at(deadline, self.owner_key_exists(session));
                // Gone, or the read failed: the transaction says.
                if !held.await.map_err(|_| timed_out())? {
                    break;
                }
            }
        }
    }

    /// Whether `session`'s owner key exists, from a linearizable read of its key alone; false
    /// if the read fails.
    async fn owner_key_exists(&self, session: Uuid) -> bool {
        let key = self.shared.namespace.owner_key(session);
        let read = self
            .shared
            .connection
            .read(
                "standby re-check",
                |mut client: etcd_client::KvClient, _| {
                    let options = etcd_client::GetOptions::new().with_keys_only();
                    let key = key.clone();
                    async move { client.get(key, Some(options)).await }
                },
            )
            .await;
        read.is_ok_and(|response| !response.kvs().is_empty())
    }

    /// Registers a standby on `session` (for the session host).
    pub(crate) fn standby(&self, session: Uuid) -> Standby {
        Standby::register(&self.shared, session)
    }

    /// How often a standby re-checks without a watch event.
    pub(crate) fn standby_recheck(&self) -> Duration {
        self.shared.standby_recheck
    }

    pub(crate) fn shared(&self) -> &Arc<StoreShared> {
        &self.shared
    }

    /// Closes the store: every lease it holds is lost ([`LossReason::StoreClosed`]), the node
    /// lease is revoked (which deletes every owner key attached to it) and the tasks end.
    /// Idempotent.
    pub async fn close(&self) {
        self.shared.shutdown.cancel();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Signal only: the keepalive task loses the leases and revokes the node lease.
        self.shared.shutdown.cancel();
        self.shared.tasks.close();
    }
}

/// A standby's registration: notified when the session's owner key is deleted (or the watch
/// restarted and may have missed it). Removed when dropped.
pub(crate) struct Standby {
    shared: Arc<StoreShared>,
    session: Uuid,
    waiter: Arc<Notify>,
}

impl Standby {
    pub(crate) fn register(shared: &Arc<StoreShared>, session: Uuid) -> Self {
        let waiter = Arc::new(Notify::new());
        shared.registry().add_waiter(session, waiter.clone());
        Self {
            shared: shared.clone(),
            session,
            waiter,
        }
    }

    /// The session stood by for.
    pub(crate) fn session(&self) -> Uuid {
        self.session
    }

    /// Resolves at the next notification (or at once if one came since the last wait).
    pub(crate) async fn notified(&self) {
        self.waiter.notified().await;
    }

    /// Whether the owner watch last showed the session's key put by another store: trying to
    /// acquire it would be refused until it is deleted (which notifies this standby). A hint
    /// only: the acquisition's compare decides.
    pub(crate) fn held_elsewhere(&self) -> bool {
        self.shared.registry().held_elsewhere(self.session)
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        self.shared
            .registry()
            .remove_waiter(self.session, &self.waiter);
    }
}

impl StoreShared {
    /// The owner value this store writes for its acquisition `nonce`.
    pub(crate) fn owner_value(&self, nonce: Uuid) -> Vec<u8> {
        OwnerValue::new(
            self.id,
            nonce,
            &self.node,
            self.advertise.as_deref(),
            &self.metadata,
        )
        .encode()
    }

    pub(crate) fn current_node(&self) -> Option<Arc<NodeLease>> {
        crate::sync::lock(&self.current).clone()
    }

    pub(crate) fn set_current_node(&self, node: Option<Arc<NodeLease>>) {
        *crate::sync::lock(&self.current) = node;
    }

    /// The registry (its state stays consistent: every mutation completes under the lock).
    pub(crate) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        crate::sync::lock(&self.registry)
    }

    /// The span naming this store: its node and namespace.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// What a journal of this store needs: one for all of them.
    pub(crate) fn journal_context(&self) -> Arc<JournalContext> {
        self.journal_context
            .get_or_init(|| {
                Arc::new(JournalContext {
                    span: self.span.clone(),
                    metrics: self.metrics.clone(),
                    connection: self.connection.clone(),
                    namespace: self.namespace.clone(),
                    limits: self.journal.clone(),
                    policy: self.write.clone(),
                    stop: self.shutdown.clone(),
                    batcher: self.batcher.clone(),
                    keys: crate::journal::KeyBudget::new(self.journal.max_keys),
                })
            })
            .clone()
    }

    /// Loses every lease of node lease `node_id` (all leases for `None`).
    pub(crate) fn lose_all(&self, node_id: Option<i64>, reason: LossReason) {
        self.registry().lose_all(node_id, reason);
    }
}
