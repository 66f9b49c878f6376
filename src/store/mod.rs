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
//! One transaction: `if create_revision(owner) == 0 then put(owner, value, lease = node lease)
//! else get(owner)`. On success the epoch is the transaction's revision (the key's
//! `create_revision`); otherwise [`LeaseHeldError`] carries the holder's epoch. The value holds
//! this store's id and a fresh nonce. An acquisition whose outcome is unknown is resolved by
//! re-sending the byte-identical transaction: at most one of the two can commit, and a failed
//! compare reads the key back in the same transaction — our nonce means it was ours. A key of
//! this store that no handle adopts (an acquisition that gave up while its transaction was
//! still in flight) is deleted in the background, guarded by its value.
//!
//! Acquisitions run on a task of the store, so dropping the future of an acquisition cannot
//! leave a committed owner key behind: a lease nobody receives is released.
//!
//! # Keepalive and the validity deadline
//!
//! See `lease::validity`: the deadline is the send instant of the request a reply answers plus
//! the granted TTL minus the safety margin; renewals go out every TTL/3. A stream that errs,
//! ends, or leaves a renewal unanswered for a whole interval is re-opened on the next endpoint.
//! When the deadline passes with no renewal, or etcd says the lease is gone, every lease of the
//! node is lost ([`Expired`](crate::LossReason::Expired),
//! [`KeepaliveFailed`](crate::LossReason::KeepaliveFailed)), that lease ID is never renewed
//! again (it is revoked, best effort) and a fresh node lease is granted for later acquisitions.
//!
//! # Watch
//!
//! Every (re)start of the watch first reads all owner keys linearizably at a revision R and
//! reconciles the sessions it cares about with what it read, then watches from R + 1, so no
//! change is missed across a restart, a compaction or a member change. The watch is created
//! with `require_leader`, so a member cut off from the leader cancels it instead of stalling
//! it, and the store moves to another endpoint.

mod cleanup;
mod keepalive;
mod owner_value;
mod owner_watch;
mod registry;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::connection::{ConnectOptions, Connection, RetryPolicy};
use crate::error::{
    AcquireError, AppendError, EtcdError, FailureClass, JournalLeaseLostError, LeaseHeldError,
    NilLeaseError, OpenJournalError, ReleaseError, StoreError,
};
use crate::journal::{
    self, AppendTxn, Event, Journal, JournalLimits, Record, Replay, ReplayOptions, Sent, Tip,
};
use crate::keys::Namespace;
use crate::lease::{Epoch, Lease, LeaseState, LossReason, NodeLease, validity};
use cleanup::Cleanup;
use owner_value::OwnerValue;
use registry::{Orphan, Registry};

/// How a [`Store`] connects and keeps its leases.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// The namespace all keys live under.
    pub namespace: Namespace,
    /// This node's name, written into owner keys for people to read.
    pub node: String,
    /// The node lease's TTL: whole seconds, at least 2 (etcd's minimum). Default 10 s.
    pub ttl: Duration,
    /// Subtracted from every validity deadline; must be below 2·TTL/3 minus a round trip.
    /// Default 1 s.
    pub margin: Duration,
    /// How often a standby acquisition re-checks without a watch event (a backstop against a
    /// lost event, not a poll). Default 5 s.
    pub standby_recheck: Duration,
    /// How long one unary etcd request may take. Default 5 s.
    pub request_timeout: Duration,
    /// Retries of idempotent requests.
    pub retry: RetryPolicy,
    /// etcd's limits, checked before each journal append.
    pub journal: JournalLimits,
    /// How replays page through journals.
    pub replay: ReplayOptions,
}

impl StoreOptions {
    /// Options with the defaults, for `endpoints`, the default namespace and the host's name.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            namespace: Namespace::default(),
            node: default_node_name(),
            ttl: Duration::from_secs(10),
            margin: Duration::from_secs(1),
            standby_recheck: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            journal: JournalLimits::default(),
            replay: ReplayOptions::default(),
        }
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

    /// Sets the node lease's TTL and the safety margin.
    pub fn with_ttl(mut self, ttl: Duration, margin: Duration) -> Self {
        self.ttl = ttl;
        self.margin = margin;
        self
    }

    fn validate(&self) -> Result<(), StoreError> {
        if self.ttl < Duration::from_secs(2) || self.ttl.subsec_nanos() != 0 {
            return Err(StoreError::InvalidTtl { ttl: self.ttl });
        }
        if self.node.is_empty() || self.node.contains(['\n', '\r']) {
            return Err(StoreError::InvalidNode {
                node: self.node.clone(),
            });
        }
        validity::check_margin(self.ttl, self.margin, Duration::ZERO)?;
        Ok(())
    }
}

fn default_node_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("node-{}", &Uuid::new_v4().simple().to_string()[..8]))
}

/// What a store's handles and tasks share.
pub(crate) struct StoreShared {
    pub(crate) connection: Connection,
    pub(crate) namespace: Namespace,
    pub(crate) node: String,
    /// This store instance, written into its owner values.
    pub(crate) id: Uuid,
    pub(crate) ttl: Duration,
    pub(crate) margin: Duration,
    standby_recheck: Duration,
    journal: JournalLimits,
    replay: ReplayOptions,
    current: Mutex<Option<Arc<NodeLease>>>,
    pub(crate) registry: Mutex<Registry>,
    cleanup: mpsc::UnboundedSender<Cleanup>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tasks: TaskTracker,
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
    pub async fn connect(options: StoreOptions) -> Result<Self, StoreError> {
        options.validate()?;
        let mut connect = ConnectOptions::new(options.endpoints.clone()).with_retry(options.retry);
        connect.request_timeout = options.request_timeout;
        let connection = Connection::connect(connect)
            .await
            .map_err(StoreError::Connect)?;
        let (node, validity) = keepalive::grant(&connection, options.ttl, options.margin)
            .await
            .map_err(|error| match error {
                keepalive::GrantError::Etcd(e) => StoreError::Grant(e),
                keepalive::GrantError::Margin(e) => StoreError::Margin(e),
            })?;
        let (cleanup, cleanup_jobs) = mpsc::unbounded_channel();
        let shared = Arc::new(StoreShared {
            connection,
            namespace: options.namespace,
            node: options.node,
            id: Uuid::new_v4(),
            ttl: validity.ttl(),
            margin: options.margin,
            standby_recheck: options.standby_recheck,
            journal: options.journal,
            replay: options.replay,
            current: Mutex::new(Some(node.clone())),
            registry: Mutex::new(Registry::default()),
            cleanup,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        tracing::info!(node = %shared.node, lease = node.id, ttl = ?shared.ttl, "store connected");
        shared
            .tasks
            .spawn(keepalive::run(shared.clone(), node, validity));
        shared.tasks.spawn(owner_watch::run(shared.clone()));
        shared
            .tasks
            .spawn(cleanup::run(shared.clone(), cleanup_jobs));
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

    /// The TTL etcd granted the node lease.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The number of session leases held now.
    pub fn held_sessions(&self) -> usize {
        self.shared.registry().held()
    }

    /// Acquires `session` if nobody owns it. One transaction; see the module docs.
    pub async fn acquire_lease(&self, session: Uuid) -> Result<Lease, AcquireError> {
        if self.shared.shutdown.is_cancelled() {
            return Err(AcquireError::StoreClosed);
        }
        let shared = self.shared.clone();
        // On a task of the store: if this future is dropped, the task still finishes and a
        // lease nobody receives is dropped, which releases it.
        let attempt = self
            .shared
            .tasks
            .spawn(async move { shared.clone().acquire(session).await });
        match attempt.await {
            Ok(result) => result,
            Err(_) => Err(AcquireError::StoreClosed),
        }
    }

    /// Acquires `session`, standing by while someone else holds it: woken by the owner key's
    /// delete (one watch event, then one transaction), with a slow re-check every
    /// `standby_recheck` as a backstop against a lost event. Gives up with
    /// [`AcquireError::TimedOut`] after `timeout`; dropping the future cancels it.
    pub async fn acquire_lease_wait(
        &self,
        session: Uuid,
        timeout: Duration,
    ) -> Result<Lease, AcquireError> {
        let deadline = Instant::now() + timeout;
        let waiter = Arc::new(Notify::new());
        let _standby = Standby::register(&self.shared, session, waiter.clone());
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
                Err(AcquireError::Held(_) | AcquireError::NodeLeaseInvalid) => {}
                Err(AcquireError::OutcomeUnknown(e) | AcquireError::Etcd(e))
                    if e.class() != FailureClass::Permanent => {}
                Err(error) => return Err(error),
            }
            tokio::select! {
                _ = waiter.notified() => {}
                _ = tokio::time::sleep(self.shared.standby_recheck) => {}
                _ = tokio::time::sleep_until(deadline) => return Err(timed_out()),
                _ = self.shared.shutdown.cancelled() => return Err(AcquireError::StoreClosed),
            }
        }
    }

    /// Opens `session`'s journal for appending under `lease`: appends a fence at the current
    /// tip and returns once it has committed. See the [`journal`](mod@crate::journal) module.
    ///
    /// `None` fails with [`NilLeaseError`]; a lease of another session, or a second open with
    /// the same lease, with typed errors too (one journal per lease, so fence epochs strictly
    /// increase).
    pub async fn open_journal(
        &self,
        session: Uuid,
        lease: Option<&Lease>,
    ) -> Result<Journal, OpenJournalError> {
        let lease = lease.ok_or(OpenJournalError::NilLease(NilLeaseError {
            session_id: session,
        }))?;
        if lease.session_id() != session {
            return Err(OpenJournalError::WrongSession {
                session_id: session,
                lease_session: lease.session_id(),
            });
        }
        if !Arc::ptr_eq(lease.store(), &self.shared) {
            return Err(OpenJournalError::ForeignLease);
        }
        let state = lease.state().clone();
        if !state.claim_journal() {
            return Err(OpenJournalError::AlreadyOpen {
                epoch: lease.epoch(),
            });
        }
        let opened = self.fence(lease).await;
        // A fence whose outcome is unknown may have committed: never fence again with this
        // epoch.
        state.settle_journal(!matches!(
            opened,
            Err(OpenJournalError::Etcd(_)
                | OpenJournalError::LeaseLost(_)
                | OpenJournalError::Decode(_))
        ));
        opened
    }

    async fn fence(&self, lease: &Lease) -> Result<Journal, OpenJournalError> {
        let ownership = lease.ownership();
        let lost = |source| OpenJournalError::LeaseLost(JournalLeaseLostError { source });
        ownership.check().map_err(lost)?;
        let (session, epoch) = (lease.session_id(), lease.epoch());
        let fenced = || {
            OpenJournalError::Fenced(AppendError {
                session_id: session,
                epoch,
            })
        };
        let namespace = &self.shared.namespace;
        let tip_key = namespace.tip_key(session);
        let read = Txn::new().and_then([
            TxnOp::get(lease.owner_key(), None),
            TxnOp::get(tip_key.as_str(), None),
        ]);
        let response = self
            .shared
            .connection
            .read("open journal", |mut client, _| {
                let read = read.clone();
                async move { client.txn(read).await }
            })
            .await
            .map_err(OpenJournalError::Etcd)?;
        let mut gets = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
                _ => None,
            });
        let (owner, tip) = (gets.next().flatten(), gets.next().flatten());
        if owner.as_ref().map(|kv| kv.create_revision()) != Some(epoch.revision()) {
            return Err(fenced());
        }
        let (previous, tip_mod_revision) = match &tip {
            Some(kv) => (
                Some(journal::decode_tip(kv.key(), kv.value()).map_err(OpenJournalError::Decode)?),
                kv.mod_revision(),
            ),
            None => (None, 0),
        };
        let seq = previous.map_or(1, |tip| tip.seq + 1);
        let nonce = Uuid::new_v4();
        let fence = AppendTxn::build(
            namespace,
            &ownership,
            seq,
            vec![journal::encode_fence(seq, epoch, nonce, previous)],
            journal::encode_tip(&Tip { seq, epoch, nonce }),
            tip_mod_revision,
        );
        let first_key = namespace.record_key(session, seq);
        match journal::send_resolving(&self.shared.connection, &fence.txn, &first_key, nonce).await
        {
            Sent::Committed { revision } => {
                tracing::info!(%session, %epoch, seq, "journal fenced and open");
                Ok(Journal::new(
                    ownership,
                    self.shared.connection.clone(),
                    namespace.clone(),
                    self.shared.journal.clone(),
                    seq + 1,
                    revision,
                ))
            }
            Sent::Fenced => Err(fenced()),
            Sent::Unknown(error) => Err(OpenJournalError::OutcomeUnknown(error)),
            Sent::Failed(error) => Err(OpenJournalError::Etcd(error)),
        }
    }

    /// Replays `session`'s events (fences hidden) at one snapshot revision. Needs no lease.
    pub fn replay(
        &self,
        session: Uuid,
    ) -> impl futures_util::Stream<Item = Result<Event, crate::ReplayError>> + Send + 'static {
        use futures_util::StreamExt as _;
        self.replay_records(session)
            .filter_map(|record| async move {
                match record {
                    Ok(Record::Event(event)) => Some(Ok(event)),
                    Ok(Record::Fence(_)) => None,
                    Err(error) => Some(Err(error)),
                }
            })
    }

    /// Replays all of `session`'s records, fences included (for maintenance and index
    /// hydration), at one snapshot revision. Needs no lease.
    pub fn replay_records(&self, session: Uuid) -> Replay {
        self.replay_with(session, self.shared.replay.clone())
    }

    /// [`replay_records`](Self::replay_records) with other paging.
    pub fn replay_with(&self, session: Uuid, options: ReplayOptions) -> Replay {
        Replay::new(
            self.shared.connection.clone(),
            self.shared.namespace.records_prefix(session),
            options,
        )
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

/// Removes a standby's registration when its acquisition ends or is dropped.
struct Standby<'a> {
    shared: &'a StoreShared,
    session: Uuid,
    waiter: Arc<Notify>,
}

impl<'a> Standby<'a> {
    fn register(shared: &'a StoreShared, session: Uuid, waiter: Arc<Notify>) -> Self {
        shared.registry().add_waiter(session, waiter.clone());
        Self {
            shared,
            session,
            waiter,
        }
    }
}

impl Drop for Standby<'_> {
    fn drop(&mut self) {
        self.shared
            .registry()
            .remove_waiter(self.session, &self.waiter);
    }
}

/// `if create_revision(key) == create_revision then delete(key)`: removes exactly the key
/// that was created then, never a successor's.
pub(crate) fn guarded_delete_txn(key: &str, create_revision: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            key,
            CompareOp::Equal,
            create_revision,
        )])
        .and_then([TxnOp::delete(key, None)])
}

/// How many times an acquisition with an unknown outcome is re-sent.
const RESENDS: u32 = 2;

/// An acquisition under way, registered so that watch events for its session are kept for it.
/// Ends its registration also if the acquisition is dropped or panics.
struct Acquiring<'a> {
    shared: &'a StoreShared,
    session: Uuid,
    ended: bool,
}

impl<'a> Acquiring<'a> {
    fn begin(shared: &'a StoreShared, session: Uuid) -> Self {
        shared.registry().begin_acquire(session);
        Self {
            shared,
            session,
            ended: false,
        }
    }

    fn end(mut self, lease: Option<&Arc<LeaseState>>) {
        self.ended = true;
        let orphans = self.shared.registry().end_acquire(self.session, lease);
        for orphan in orphans {
            self.shared.delete_orphan(orphan);
        }
    }
}

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let orphans = self.shared.registry().end_acquire(self.session, None);
            for orphan in orphans {
                self.shared.delete_orphan(orphan);
            }
        }
    }
}

impl StoreShared {
    pub(crate) fn current_node(&self) -> Option<Arc<NodeLease>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_current_node(&self, node: Option<Arc<NodeLease>>) {
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = node;
    }

    /// The registry, also after a panic elsewhere poisoned its lock (its state stays
    /// consistent: every mutation completes under the lock).
    pub(crate) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn acquire(self: Arc<Self>, session: Uuid) -> Result<Lease, AcquireError> {
        let node = self
            .current_node()
            .filter(|node| node.is_valid())
            .ok_or(AcquireError::NodeLeaseInvalid)?;
        let key = self.namespace.owner_key(session);
        let nonce = Uuid::new_v4();
        let value = OwnerValue {
            store: self.id,
            nonce,
            node: self.node.clone(),
        }
        .encode();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_lease(node.id)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);

        let acquiring = Acquiring::begin(&self, session);
        let outcome = self.send_acquire(session, &key, &txn, nonce).await;
        let state = outcome
            .as_ref()
            .ok()
            .map(|epoch| LeaseState::new(session, *epoch, key.clone(), nonce, node.clone()));
        acquiring.end(state.as_ref());
        match (outcome, state) {
            (Ok(epoch), Some(state)) => {
                let lease = Lease::new(state, self.clone());
                // Lost while it was being registered: a dropped lease is released.
                match lease.loss_reason() {
                    Some(LossReason::StoreClosed) => Err(AcquireError::StoreClosed),
                    Some(LossReason::Expired | LossReason::KeepaliveFailed) => {
                        Err(AcquireError::NodeLeaseInvalid)
                    }
                    _ => {
                        tracing::debug!(%session, %epoch, "acquired");
                        Ok(lease)
                    }
                }
            }
            (Err(error), _) => Err(error),
            (Ok(_), None) => unreachable!("a state is made for every epoch"),
        }
    }

    /// Sends the acquisition, re-sending it while its outcome is unknown; resolves what stays
    /// unknown by reading the owner key.
    async fn send_acquire(
        &self,
        session: Uuid,
        key: &str,
        txn: &Txn,
        nonce: Uuid,
    ) -> Result<Epoch, AcquireError> {
        let mut unknown: Option<EtcdError> = None;
        let mut attempts = 0;
        let response = loop {
            let sent = self
                .connection
                .write("acquire", |mut client, _| {
                    let txn = txn.clone();
                    async move { client.txn(txn).await }
                })
                .await;
            match sent {
                Ok(response) => break response,
                Err(error) if error.is_lease_not_found() => {
                    // The node lease was replaced between the check and the transaction.
                    return Err(AcquireError::NodeLeaseInvalid);
                }
                Err(error)
                    if error.class() == FailureClass::OutcomeUnknown && attempts < RESENDS =>
                {
                    attempts += 1;
                    tracing::debug!(%session, %error, "acquisition outcome unknown; re-sending it");
                    unknown = Some(error);
                    self.connection.rotate();
                    tokio::time::sleep(Duration::from_millis(100 * attempts as u64)).await;
                }
                // Still unknown, or a definite failure after an unknown one that may yet
                // commit: read what etcd has.
                Err(error)
                    if error.class() == FailureClass::OutcomeUnknown || unknown.is_some() =>
                {
                    return self.resolve_by_read(session, key, nonce, error).await;
                }
                Err(error) => return Err(AcquireError::Etcd(error)),
            }
        };
        if response.succeeded() {
            let revision = response.header().map_or(0, |h| h.revision());
            return Ok(Epoch(revision as u64));
        }
        let holder = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
        match holder {
            Some(holder) => self.adopt_or_held(session, nonce, &holder),
            // The compare saw a key that the get, in the same transaction, did not: etcd never
            // does this. Report it rather than guess.
            None => Err(AcquireError::Etcd(EtcdError::new(
                "acquire",
                "(txn)",
                etcd_client::Error::Internal("owner key vanished inside a txn".into()),
            ))),
        }
    }

    /// Our nonce: an earlier send of this acquisition committed, adopt it. Else it is held.
    fn adopt_or_held(
        &self,
        session: Uuid,
        nonce: Uuid,
        holder: &etcd_client::KeyValue,
    ) -> Result<Epoch, AcquireError> {
        let epoch = Epoch(holder.create_revision() as u64);
        if OwnerValue::decode(holder.value())
            .is_some_and(|owner| owner.store == self.id && owner.nonce == nonce)
        {
            return Ok(epoch);
        }
        Err(AcquireError::Held(LeaseHeldError {
            session_id: session,
            holder_epoch: epoch,
        }))
    }

    /// A linearizable read of the owner key settles an acquisition whose sends stayed unknown:
    /// ours, someone else's, or (still) absent, in which case a late commit is found by the
    /// watch as a key nobody adopted, and deleted.
    async fn resolve_by_read(
        &self,
        session: Uuid,
        key: &str,
        nonce: Uuid,
        error: EtcdError,
    ) -> Result<Epoch, AcquireError> {
        let read = self
            .connection
            .read("acquire resolution", |mut client, _| async move {
                client.get(key, None).await
            })
            .await;
        match read {
            Ok(response) => match response.kvs().first() {
                Some(holder) => self.adopt_or_held(session, nonce, holder),
                None => Err(AcquireError::OutcomeUnknown(error)),
            },
            Err(_) => Err(AcquireError::OutcomeUnknown(error)),
        }
    }

    /// Deletes `key` if it still has `create_revision` (an owner key at its epoch, a workspace
    /// root); true if it did.
    pub(crate) async fn guarded_delete(
        &self,
        key: &str,
        create_revision: i64,
    ) -> Result<bool, EtcdError> {
        let txn = guarded_delete_txn(key, create_revision);
        self.connection
            .write("guarded delete", |mut client, _| {
                let txn = txn.clone();
                async move { client.txn(txn).await.map(|r| r.succeeded()) }
            })
            .await
    }

    /// Releases a lease whose state is already marked released.
    pub(crate) async fn release(&self, state: &Arc<LeaseState>) -> Result<(), ReleaseError> {
        self.registry().forget(state);
        match self
            .guarded_delete(&state.owner_key, state.epoch.revision())
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => {
                tracing::warn!(session = %state.session, %error, "release deferred to the background");
                self.release_in_background(state);
                Err(ReleaseError::Deferred(error))
            }
        }
    }

    /// Releases a dropped lease from the cleanup task.
    pub(crate) fn release_in_background(&self, state: &Arc<LeaseState>) {
        self.registry().forget(state);
        self.delete_guarded_in_background(
            state.owner_key.clone(),
            state.epoch.revision(),
            state.node.clone(),
        );
    }

    /// Deletes `key` in the background if it still has `create_revision`; retried until
    /// confirmed or `node` (which the key is attached to) is lost.
    pub(crate) fn delete_guarded_in_background(
        &self,
        key: String,
        create_revision: i64,
        node: Arc<NodeLease>,
    ) {
        let _ = self.cleanup.send(Cleanup::Guarded {
            key,
            create_revision,
            node,
        });
    }

    pub(crate) fn delete_orphan(&self, orphan: Orphan) {
        tracing::info!(session = %orphan.session, "deleting an owner key of ours that no lease adopted");
        let _ = self.cleanup.send(Cleanup::Orphan(orphan));
    }

    /// Loses every lease of node lease `node_id` (all leases for `None`).
    pub(crate) fn lose_all(&self, node_id: Option<i64>, reason: LossReason) {
        self.registry().lose_all(node_id, reason);
    }
}
