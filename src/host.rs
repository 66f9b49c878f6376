//! [`SessionHost`]: keeps a set of sessions owned and worked on, across a cluster of hosts.
//!
//! A host is given the sessions it should host (a fixed set, changed later with
//! [`add`](SessionHost::add) and [`remove`](SessionHost::remove)). For each it runs one task:
//!
//! 1. wait for a free slot (see *Balance*);
//! 2. acquire the session; if it is held elsewhere, stand by (woken by the owner key's
//!    delete, with the store's slow re-check as a backstop) and go to 1;
//! 3. open a [`Rig`] (lease, workspace root, fenced journal) and run the user's
//!    `work(rig, token)`;
//! 4. when the lease is lost, the journal breaks ([`Journal::broken`]: fenced, or an append
//!    whose outcome could not be settled), the user's work returns, the host sheds the
//!    session, or the session is removed: cancel `token`, give the work
//!    [`HostOptions::stop_grace`] to return (then abort it), shut the rig down in order (last
//!    append, workspace root, lease) and go to 1.
//!
//! So no session stays on a state no event will change: a broken journal is given up and
//! opened again under a new lease, by this host or another.
//!
//! # A session that cannot be opened
//!
//! When the rig cannot be opened (its workspace root is held, or the journal cannot be fenced:
//! a tip behind its last record, a tip that does not decode, a sequence at its end), the lease
//! is released and the session is tried again after a pause: [`HostOptions::retry_pause`] at
//! first, doubling with each failure in a row, jittered (up to as much again), capped at
//! [`HostOptions::max_retry_pause`], and back to the start once it opens. At the third
//! failure in a row the session is *quarantined*: a [`HostEvent::Quarantined`], a WARN line
//! naming the session and the failure, and the store's `leasehold_sessions_quarantined` gauge
//! (see [`metrics`](crate::metrics)) until it opens or is no longer hosted here. So a journal
//! that no owner can open costs the cluster a few acquisitions a minute, not two a second
//! (each with its writes, and a release that wakes the other hosts); `leasehold check` names
//! what is wrong with it.
//!
//! # Balance
//!
//! Every host keeps a key `{ns}/hosts/{store}` attached to its node lease, holding its
//! [`HostOptions::max_sessions`], so the live hosts are visible to all and a dead host's key
//! goes with its lease. Every tick (TTL/3, at most 1 s) a host lists them and computes every
//! host's share the same way: as even as the maxima allow (shares below a maximum differ by at
//! most one, the earlier hosts in key order taking the extra ones), adding up to the wanted
//! sessions (or to the sum of the maxima). A host over its share sheds the difference, in
//! order, so a host that joins gets its share without anyone restarting, a capped host's
//! remainder goes to the others, and a host that leaves (its key is deleted first) hands its
//! sessions over at once. A session takes a slot of the share from its acquisition on, so
//! acquisitions in flight and rigs being opened count against the share too, and a host at its
//! share does not take a session that another host just shed. A standby holds no slot: a
//! session found held elsewhere gives its slot back before it stands by (as does one whose
//! acquisition or open failed, for its pause), so standbys never keep a host from owning its
//! share. A session freed while a host is full makes it list the hosts again at once.
//!
//! # Leaving
//!
//! A host leaves when it is shut down or dropped (its store may live on: the key would
//! otherwise outlive the host with the node lease, and its share would never be owned). One
//! task, the balance loop, both writes the key and deletes it, one after the other:
//!
//! - the put is `put({ns}/hosts/{store}, value, lease = node lease)`, the value carrying a
//!   nonce of this host. It is re-sent until a reply settles it, the node lease stops being
//!   valid (the key then goes with the lease) or the store closes (which revokes the lease);
//!   the host's leaving does not cut it short, so no put is still on its way when the delete
//!   is sent;
//! - the delete is `if value(key) == this host's value then delete(key)`, tried for three
//!   write attempts ([`WritePolicy::attempt_timeout`](crate::WritePolicy::attempt_timeout));
//!   one not confirmed by then is handed to the store's background deletes, which re-send it
//!   until it is confirmed, the node lease is lost (its end deletes the key) or the store
//!   closes.
//!
//! [`shutdown`](SessionHost::shutdown) waits for the delete (at most those three attempts)
//! before it shuts the sessions down; dropping the host signals the same and waits for
//! nothing.
//!
//! [`Journal::broken`]: crate::Journal::broken

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{GetOptions, KvClient, PutOptions, Txn, TxnOp};
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::etcd::Delete;
use crate::etcd::write::{self, WritePolicy, Written};
use crate::keys::prefix_end;
use crate::lease::{Epoch, LossReason, NodeLease};
use crate::metrics::Metrics;
use crate::rig::{Rig, RigError};
use crate::store::Store;

/// The user's work on one owned session: runs until `token` is cancelled (or returns earlier
/// on its own, which gives the session up).
type Work = Arc<dyn Fn(Arc<Rig>, CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>;

/// The workspace id of a session.
type WorkspaceOf = Arc<dyn Fn(Uuid) -> String + Send + Sync>;

/// How a [`SessionHost`] runs.
#[derive(Clone)]
#[non_exhaustive]
pub struct HostOptions {
    /// The most sessions this host holds, whatever the balance allows. Default: no limit.
    pub max_sessions: Option<usize>,
    /// How long the user's work may take to return once its token is cancelled before it is
    /// aborted. Default 5 s.
    pub stop_grace: Duration,
    /// The pause after a session could not be opened (e.g. its workspace root is held), before
    /// it is tried again. It doubles, with jitter, with each failure in a row, up to
    /// [`max_retry_pause`](Self::max_retry_pause). Default 500 ms.
    pub retry_pause: Duration,
    /// The longest pause between two attempts to open a session that keeps failing (before
    /// jitter, which adds up to as much again). Default 60 s.
    pub max_retry_pause: Duration,
    workspace: WorkspaceOf,
}

impl std::fmt::Debug for HostOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostOptions")
            .field("max_sessions", &self.max_sessions)
            .field("stop_grace", &self.stop_grace)
            .field("retry_pause", &self.retry_pause)
            .field("max_retry_pause", &self.max_retry_pause)
            .finish_non_exhaustive()
    }
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            max_sessions: None,
            stop_grace: Duration::from_secs(5),
            retry_pause: Duration::from_millis(500),
            max_retry_pause: Duration::from_secs(60),
            workspace: Arc::new(|session| format!("ws-{session}")),
        }
    }
}

impl HostOptions {
    /// Caps the sessions this host holds.
    pub fn with_max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = Some(max);
        self
    }

    /// Sets the grace period of the user's work.
    pub fn with_stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Sets the pause after a failed open.
    pub fn with_retry_pause(mut self, pause: Duration) -> Self {
        self.retry_pause = pause;
        self
    }

    /// Sets the longest pause between attempts to open a session that keeps failing.
    pub fn with_max_retry_pause(mut self, pause: Duration) -> Self {
        self.max_retry_pause = pause;
        self
    }

    /// Names each session's workspace root (default `ws-{session}`). The id must be valid for
    /// [`Rig::open`]: 1 to [`MAX_WORKSPACE_LEN`](crate::rig::MAX_WORKSPACE_LEN) (128) bytes of
    /// ASCII letters, digits, `-`, `_` and `.`.
    pub fn with_workspace(
        mut self,
        workspace: impl Fn(Uuid) -> String + Send + Sync + 'static,
    ) -> Self {
        self.workspace = Arc::new(workspace);
        self
    }
}

/// Why a host gave an owned session up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// The lease was lost.
    Lost(LossReason),
    /// The journal broke (fenced, or an append's outcome could not be settled).
    JournalBroken,
    /// The user's work returned on its own.
    WorkDone,
    /// The host is over its share and handed the session over.
    Shed,
    /// The session was removed from the host, or the host shut down.
    Stopped,
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveUp::Lost(reason) => write!(f, "lost ({reason})"),
            GiveUp::JournalBroken => f.write_str("journal broken"),
            GiveUp::WorkDone => f.write_str("work done"),
            GiveUp::Shed => f.write_str("shed to another host"),
            GiveUp::Stopped => f.write_str("stopped"),
        }
    }
}

/// What happened to a hosted session, as [`SessionHost::events`] reports it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum HostEvent {
    /// The session is owned, its rig open, the work started.
    Acquired {
        /// The session.
        session: Uuid,
        /// The epoch.
        epoch: Epoch,
    },
    /// The session was given up and its rig shut down; `result` says whether every delete of
    /// the shutdown was confirmed (else they go on in the background, in order).
    GaveUp {
        /// The session.
        session: Uuid,
        /// The epoch it was owned at.
        epoch: Epoch,
        /// Why.
        why: GiveUp,
        /// The shutdown's outcome.
        result: Result<(), Arc<RigError>>,
    },
    /// The session was acquired but its rig could not be opened; it is tried again after a
    /// pause (see [`HostOptions::retry_pause`]).
    OpenFailed {
        /// The session.
        session: Uuid,
        /// Why.
        error: Arc<RigError>,
    },
    /// The session failed to open 3 times in a row (reported then, and at each failure after
    /// that, after its [`OpenFailed`](Self::OpenFailed)): it is quarantined, tried again only
    /// after pauses that keep doubling up to [`HostOptions::max_retry_pause`] (e.g. its
    /// journal's tip is behind its last record, or does not decode: see `leasehold check`).
    /// It stays quarantined until it opens again ([`Acquired`](Self::Acquired)) or the host
    /// stops hosting it.
    Quarantined {
        /// The session.
        session: Uuid,
        /// The failed opens in a row.
        failures: u32,
        /// The pause before the next attempt.
        retry_in: Duration,
        /// The last failure.
        error: Arc<RigError>,
    },
}

/// After this many failed opens in a row, a session is quarantined (see
/// [`HostEvent::Quarantined`]).
const QUARANTINE_AFTER: u32 = 3;

/// Keeps sessions owned and worked on; see the [module docs](self).
///
/// Dropping the host stops its tasks in the background (its key deleted, each session shut
/// down in order); [`shutdown`](Self::shutdown) does the same and waits for it.
pub struct SessionHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SessionHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHost")
            .field("node", &self.inner.store.node())
            .field("held", &self.held_count())
            .field("cap", &*self.inner.cap.borrow())
            .finish()
    }
}

struct Inner {
    store: Arc<Store>,
    options: HostOptions,
    work: Work,
    /// The wanted sessions, each with the token that stops its task.
    wanted: Mutex<HashMap<Uuid, CancellationToken>>,
    /// The owned sessions, each with the token that sheds it.
    owned: Mutex<HashMap<Uuid, CancellationToken>>,
    /// Sessions held, being acquired or being opened (a standby gives its slot back): what
    /// the cap bounds.
    slots: AtomicUsize,
    /// The most sessions this host may hold now.
    cap: watch::Sender<usize>,
    /// Bumped whenever a slot frees up.
    freed: watch::Sender<()>,
    /// Asks the balance loop to count the live hosts now (a session was freed while this
    /// host had no slot for it: maybe a host left).
    recount: Notify,
    events: broadcast::Sender<HostEvent>,
    host_key: String,
    /// What this host writes into its key: unique to this host (it carries a nonce), so the
    /// leave's delete, guarded by it, deletes this host's registration and no other.
    host_value: String,
    /// Cancelled when the host starts leaving: the balance loop registers no more and deletes
    /// the host's key.
    leaving: CancellationToken,
    /// Cancelled once the balance loop has left: the key's delete is confirmed, or it goes on
    /// in the background.
    left: CancellationToken,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SessionHost {
    /// Starts hosting `sessions` on `store`, running `work` for each session it owns.
    pub fn start<F, Fut>(
        store: Arc<Store>,
        options: HostOptions,
        sessions: impl IntoIterator<Item = Uuid>,
        work: F,
    ) -> Self
    where
        F: Fn(Arc<Rig>, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let host_key = store.namespace().host_key(store.shared().id);
        let host_value = HostValue {
            max: options.max_sessions,
            nonce: Uuid::new_v4(),
            node: store.node().to_owned(),
        }
        .encode();
        let inner = Arc::new(Inner {
            store,
            options,
            work: Arc::new(move |rig, token| work(rig, token).boxed()),
            wanted: Mutex::new(HashMap::new()),
            owned: Mutex::new(HashMap::new()),
            slots: AtomicUsize::new(0),
            // Nothing is taken before the first count of live hosts.
            cap: watch::Sender::new(0),
            freed: watch::Sender::new(()),
            recount: Notify::new(),
            events: broadcast::Sender::new(1024),
            host_key,
            host_value,
            leaving: CancellationToken::new(),
            left: CancellationToken::new(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        inner.tasks.spawn(balance(inner.clone()));
        let host = Self { inner };
        for session in sessions {
            host.add(session);
        }
        host
    }

    /// Hosts `session` too (nothing happens if it is hosted already).
    pub fn add(&self, session: Uuid) {
        let inner = &self.inner;
        if inner.shutdown.is_cancelled() {
            return;
        }
        let mut wanted = lock(&inner.wanted);
        if wanted.contains_key(&session) {
            return;
        }
        let stop = inner.shutdown.child_token();
        wanted.insert(session, stop.clone());
        inner
            .tasks
            .spawn(host_session(inner.clone(), session, stop));
    }

    /// Stops hosting `session`: if it is owned, its rig is shut down in order.
    pub fn remove(&self, session: Uuid) {
        if let Some(stop) = lock(&self.inner.wanted).remove(&session) {
            stop.cancel();
        }
    }

    /// The sessions this host owns now.
    pub fn held(&self) -> Vec<Uuid> {
        lock(&self.inner.owned).keys().copied().collect()
    }

    /// The number of sessions this host owns now.
    pub fn held_count(&self) -> usize {
        lock(&self.inner.owned).len()
    }

    /// The most sessions this host may hold now (its share).
    pub fn cap(&self) -> usize {
        *self.inner.cap.borrow()
    }

    /// What happens to the hosted sessions, from now on.
    pub fn events(&self) -> broadcast::Receiver<HostEvent> {
        self.inner.events.subscribe()
    }

    /// Stops hosting: the host's key is deleted (so others take its share at once), then every
    /// owned session is shut down in order. Idempotent.
    ///
    /// The delete is waited for at most three write attempts
    /// ([`WritePolicy::attempt_timeout`](crate::WritePolicy::attempt_timeout)); one not
    /// confirmed by then goes on in the background until it is, or until the node lease the
    /// key is attached to is gone (which deletes the key too).
    pub async fn shutdown(&self) {
        self.inner.leaving.cancel();
        let bound = leave_bound(&self.inner.store.shared().write);
        let _ = tokio::time::timeout(bound, self.inner.left.cancelled()).await;
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl Drop for SessionHost {
    /// Signals only: the balance task deletes the host's key (in the background if it must),
    /// and every session task shuts its session down in order.
    fn drop(&mut self) {
        self.inner.leaving.cancel();
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
    }
}

impl Inner {
    fn emit(&self, event: HostEvent) {
        let _ = self.events.send(event);
    }

    /// Takes a slot if the cap allows.
    fn reserve(&self) -> bool {
        let cap = *self.cap.borrow();
        self.slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < cap).then_some(held + 1)
            })
            .is_ok()
    }

    fn unreserve(&self) {
        self.slots.fetch_sub(1, Ordering::AcqRel);
        self.freed.send_replace(());
    }

    /// Writes this host's key, attached to the current node lease (returned, with whether a
    /// reply confirmed the put). Not stopped by the host's leaving: it is re-sent until a reply
    /// settles it, the node lease stops being valid (then it is lost, and the key with it), or
    /// the store closes (which revokes the node lease), so no send of it is still on its way
    /// when the leave's delete goes out.
    async fn register(&self) -> Option<(Arc<NodeLease>, bool)> {
        let shared = self.store.shared();
        let node = shared.current_node().filter(|node| node.is_valid())?;
        let txn = Txn::new().and_then([TxnOp::put(
            self.host_key.as_str(),
            self.host_value.as_str(),
            Some(PutOptions::new().with_lease(node.id)),
        )]);
        let written = write::send(
            &shared.connection,
            &shared.write,
            "host key",
            &txn,
            None,
            || node.is_valid(),
            &shared.shutdown,
        )
        .await;
        let replied = matches!(written, Written::Replied(_));
        Some((node, replied))
    }

    /// The live hosts, sorted by key, at one revision: each key and its maximum.
    async fn live_hosts(&self) -> Option<Vec<(Vec<u8>, Option<usize>)>> {
        let prefix = self.store.namespace().hosts_prefix();
        let options = GetOptions::new().with_range(prefix_end(&prefix));
        let read = self
            .store
            .connection()
            .read("list hosts", |mut client: KvClient, _| {
                let (prefix, options) = (prefix.clone(), options.clone());
                async move { client.get(prefix, Some(options)).await }
            });
        let response = tokio::select! {
            response = read => response.ok()?,
            _ = self.leaving.cancelled() => return None,
            _ = self.shutdown.cancelled() => return None,
        };
        Some(
            response
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), HostValue::decode(kv.value()).max))
                .collect(),
        )
    }

    /// Sheds owned sessions until at most `cap` are held.
    fn shed_to(&self, cap: usize) {
        let owned = lock(&self.owned);
        let excess = self.slots.load(Ordering::Acquire).saturating_sub(cap);
        for shed in owned.values().filter(|t| !t.is_cancelled()).take(excess) {
            shed.cancel();
        }
    }
}

/// Keeps this host's key alive and its cap current; sheds what is over the cap. When the host
/// starts leaving, deletes the host's key and ends. Registering and leaving are done here
/// alone, one after the other, so the delete always comes after the last put.
async fn balance(inner: Arc<Inner>) {
    let tick = (inner.store.ttl() / 3).min(Duration::from_secs(1));
    let mut registered_on = None;
    // The node lease of the last put sent: the key, if it exists, is attached to it.
    let mut written_on: Option<Arc<NodeLease>> = None;
    loop {
        let node = inner.store.node_lease_id();
        if node.is_some()
            && registered_on != node
            && !inner.leaving.is_cancelled()
            && let Some((lease, replied)) = inner.register().await
        {
            if replied {
                registered_on = Some(lease.id);
            }
            written_on = Some(lease);
        }
        if inner.leaving.is_cancelled() {
            break;
        }
        if let Some(mut hosts) = inner.live_hosts().await {
            let wanted = lock(&inner.wanted).len();
            let own = inner.host_key.as_bytes();
            // Not (yet) listed: count itself, last.
            let rank = hosts
                .iter()
                .position(|(key, _)| key == own)
                .unwrap_or_else(|| {
                    hosts.push((own.to_vec(), inner.options.max_sessions));
                    hosts.len() - 1
                });
            let maxima: Vec<Option<usize>> = hosts.iter().map(|(_, max)| *max).collect();
            let share = shares(wanted, &maxima)[rank];
            let cap = inner
                .options
                .max_sessions
                .map_or(share, |max| share.min(max));
            let live = hosts.len();
            if inner
                .cap
                .send_if_modified(|current| std::mem::replace(current, cap) != cap)
            {
                tracing::debug!(
                    node = inner.store.node(),
                    live,
                    wanted,
                    cap,
                    "session host share"
                );
            }
            inner.shed_to(cap);
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = inner.recount.notified() => {}
            _ = inner.leaving.cancelled() => break,
        }
    }
    inner.leave(written_on).await;
    inner.left.cancel();
}

impl Inner {
    /// Hands this host's share over: takes no more sessions and deletes the host's key (put
    /// last on `node`), so the other hosts' shares grow. The delete is guarded by this host's
    /// value and tried for at most three write attempts here; one not confirmed by then is
    /// handed to the store's background deletes, which re-send it until it is confirmed or
    /// `node` is lost (its end deletes the key).
    async fn leave(&self, node: Option<Arc<NodeLease>>) {
        self.cap.send_replace(0);
        let Some(node) = node.filter(|node| !node.is_lost()) else {
            return;
        };
        let shared = self.store.shared();
        let delete = Delete::holding(self.host_key.as_str(), self.host_value.as_str());
        let until = Instant::now().checked_add(leave_bound(&shared.write));
        let written = write::send(
            &shared.connection,
            &shared.write,
            "host key",
            &delete.txn(),
            None,
            || !node.is_lost() && until.is_none_or(|until| Instant::now() < until),
            &shared.shutdown,
        )
        .await;
        match written {
            Written::Replied(_) => {
                tracing::debug!(key = %self.host_key, "session host key deleted");
            }
            Written::Failed(error)
            | Written::Unknown(error)
            | Written::Resolved { unknown: error, .. } => {
                tracing::warn!(key = %self.host_key, %error, "session host key delete deferred to the background");
                shared.delete_in_background(vec![delete], node);
            }
        }
    }
}

/// How long a leave's delete is tried in the foreground: three write attempts (saturating: a
/// huge attempt timeout means no bound).
fn leave_bound(policy: &WritePolicy) -> Duration {
    policy.attempt_timeout.saturating_mul(3)
}

/// The shares of `wanted` sessions among hosts (in key order) with these maxima: as even as
/// the maxima allow (shares of hosts below their maximum differ by at most one, the earlier
/// hosts taking the extra ones), adding up to `wanted` or to the sum of the maxima, whichever
/// is less. Every host computes the same shares from the same list.
fn shares(wanted: usize, maxima: &[Option<usize>]) -> Vec<usize> {
    let mut shares = vec![0; maxima.len()];
    let mut open: Vec<usize> = (0..maxima.len()).collect();
    let mut left = wanted;
    while !open.is_empty() {
        let (base, extra) = (left / open.len(), left % open.len());
        let fair = |rank: usize| base + usize::from(rank < extra);
        // Hosts whose maximum is below their fair share take their maximum; the rest share
        // what is left.
        let full: Vec<usize> = open
            .iter()
            .enumerate()
            .filter(|&(rank, &host)| maxima[host].is_some_and(|max| max < fair(rank)))
            .map(|(_, &host)| host)
            .collect();
        if full.is_empty() {
            for (rank, &host) in open.iter().enumerate() {
                shares[host] = fair(rank);
            }
            break;
        }
        for &host in &full {
            let max = maxima[host].unwrap_or(0);
            shares[host] = max;
            left -= max;
        }
        open.retain(|host| !full.contains(host));
    }
    shares
}

/// What a host's key holds: its maximum, the host's nonce (which makes the value unique to
/// the host, for the leave's guarded delete) and its node's name.
struct HostValue {
    max: Option<usize>,
    nonce: Uuid,
    node: String,
}

impl HostValue {
    const PREFIX: &'static str = "leasehold-host/1";

    /// `leasehold-host/1 {max or -} {nonce} {node}`. (Hosts that wrote no nonce read the
    /// nonce as part of the node's name, which only names the host.)
    fn encode(&self) -> String {
        let max = self
            .max
            .map_or_else(|| "-".to_owned(), |max| max.to_string());
        format!("{} {max} {} {}", Self::PREFIX, self.nonce, self.node)
    }

    /// Anything unreadable counts as a host without a maximum.
    fn decode(value: &[u8]) -> Self {
        let text = String::from_utf8_lossy(value);
        let mut parts = text.splitn(4, ' ');
        let known = parts.next() == Some(Self::PREFIX);
        let max = parts
            .next()
            .filter(|_| known)
            .and_then(|max| max.parse().ok());
        let nonce = parts
            .next()
            .and_then(|nonce| nonce.parse().ok())
            .unwrap_or_default();
        let node = parts.next().unwrap_or_default().to_owned();
        Self { max, nonce, node }
    }
}

/// One session's task: see the module docs.
async fn host_session(inner: Arc<Inner>, session: Uuid, stop: CancellationToken) {
    let standby = inner.store.standby(session);
    let mut freed = inner.freed.subscribe();
    let mut cap = inner.cap.subscribe();
    let mut failures = OpenFailures::new(&inner.options, inner.store.shared().metrics.clone());
    loop {
        // --- 1. a free slot
        loop {
            if stop.is_cancelled() {
                return;
            }
            freed.borrow_and_update();
            cap.borrow_and_update();
            if inner.reserve() {
                break;
            }
            tokio::select! {
                _ = freed.changed() => {}
                _ = cap.changed() => {}
                // Freed while this host is full: maybe a host left; count again now.
                _ = standby.notified() => inner.recount.notify_one(),
                _ = stop.cancelled() => return,
            }
        }
        // --- 2. acquire, or stand by
        let acquired = tokio::select! {
            acquired = inner.store.acquire_lease(session) => acquired,
            _ = stop.cancelled() => {
                inner.unreserve();
                return;
            }
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(error) if error.is_transient() => {
                inner.unreserve();
                tokio::select! {
                    _ = standby.notified() => {}
                    _ = tokio::time::sleep(inner.store.standby_recheck()) => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            }
            Err(error) => {
                inner.unreserve();
                tracing::warn!(%session, %error, "session host cannot acquire");
                if inner.store.shared().shutdown.is_cancelled() {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(inner.options.retry_pause) => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            }
        };
        // --- 3. and 4. open, work, give up in order
        let workspace = (inner.options.workspace)(session);
        match Rig::with_lease(&inner.store, lease, &workspace).await {
            Ok(rig) => {
                if failures.opened() {
                    tracing::info!(%session, "quarantined session opened again");
                }
                run(&inner, Arc::new(rig), &stop).await;
            }
            Err(error) => {
                let error = Arc::new(error);
                inner.emit(HostEvent::OpenFailed {
                    session,
                    error: error.clone(),
                });
                let (pause, quarantined) = failures.failed();
                if quarantined {
                    let (failures, why) = (failures.count, crate::etcd::chain(&*error));
                    tracing::warn!(%session, failures, retry_in = ?pause, %why, "session quarantined: it keeps failing to open; retrying with backoff");
                    inner.emit(HostEvent::Quarantined {
                        session,
                        failures,
                        retry_in: pause,
                        error,
                    });
                } else {
                    tracing::debug!(%session, failures = failures.count, retry_in = ?pause, error = %crate::etcd::chain(&*error), "session failed to open");
                }
                inner.unreserve();
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            }
        }
        inner.unreserve();
    }
}

/// A session's failed opens in a row, the pause before its next attempt (exponential from
/// [`HostOptions::retry_pause`], jittered, capped at [`HostOptions::max_retry_pause`]) and its
/// quarantine, which the store's metrics count while it lasts.
struct OpenFailures {
    count: u32,
    backoff: backon::ExponentialBackoff,
    first: Duration,
    max: Duration,
    metrics: Metrics,
    quarantined: bool,
}

impl OpenFailures {
    fn new(options: &HostOptions, metrics: Metrics) -> Self {
        let (first, max) = (options.retry_pause, options.max_retry_pause);
        Self {
            count: 0,
            backoff: Self::backoff(first, max),
            first,
            max,
            metrics,
            quarantined: false,
        }
    }

    fn backoff(first: Duration, max: Duration) -> backon::ExponentialBackoff {
        use backon::BackoffBuilder as _;
        backon::ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(max.max(first))
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// One more failure: the pause before the next attempt, and whether the session was
    /// quarantined now or is still (a warning each time).
    fn failed(&mut self) -> (Duration, bool) {
        self.count = self.count.saturating_add(1);
        let pause = self.backoff.next().unwrap_or(self.max);
        if self.count >= QUARANTINE_AFTER && !self.quarantined {
            self.quarantined = true;
            self.metrics.quarantined(1.0);
        }
        (pause, self.quarantined)
    }

    /// The session opened: the count starts over. True if it was quarantined.
    fn opened(&mut self) -> bool {
        self.count = 0;
        self.backoff = Self::backoff(self.first, self.max);
        let quarantined = std::mem::take(&mut self.quarantined);
        if quarantined {
            self.metrics.quarantined(-1.0);
        }
        quarantined
    }
}

impl Drop for OpenFailures {
    /// The session is no longer hosted here: no longer quarantined here either.
    fn drop(&mut self) {
        if self.quarantined {
            self.metrics.quarantined(-1.0);
        }
    }
}

/// Runs the user's work on an owned session until it must be given up, then shuts the rig down
/// in order.
async fn run(inner: &Inner, rig: Arc<Rig>, stop: &CancellationToken) {
    let (session, epoch) = (rig.session_id(), rig.epoch());
    let shed = CancellationToken::new();
    lock(&inner.owned).insert(session, shed.clone());
    inner.emit(HostEvent::Acquired { session, epoch });
    let token = CancellationToken::new();
    let mut work = tokio::spawn((inner.work)(rig.clone(), token.clone()));
    let why = tokio::select! {
        reason = rig.lost() => GiveUp::Lost(reason),
        () = rig.journal().broken() => GiveUp::JournalBroken,
        _ = shed.cancelled() => GiveUp::Shed,
        _ = stop.cancelled() => GiveUp::Stopped,
        _ = &mut work => GiveUp::WorkDone,
    };
    token.cancel();
    if !work.is_finished()
        && tokio::time::timeout(inner.options.stop_grace, &mut work)
            .await
            .is_err()
    {
        tracing::warn!(%session, "the session's work did not stop within its grace period; aborting it");
        work.abort();
    }
    let result = rig.shutdown().await.map_err(Arc::new);
    lock(&inner.owned).remove(&session);
    tracing::info!(%session, %epoch, %why, "session given up");
    inner.emit(HostEvent::GaveUp {
        session,
        epoch,
        why,
        result,
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{HostOptions, HostValue, OpenFailures, leave_bound, shares};
    use crate::etcd::WritePolicy;
    use crate::keys::Namespace;
    use crate::metrics::Metrics;

    fn failures(first: Duration, max: Duration) -> OpenFailures {
        let options = HostOptions::default()
            .with_retry_pause(first)
            .with_max_retry_pause(max);
        OpenFailures::new(&options, Metrics::new("n", &Namespace::new("ns").unwrap()))
    }

    #[test]
    fn failed_opens_back_off_to_the_cap_and_quarantine_from_the_third() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut open = failures(first, max);
        let mut nominal = first;
        for failure in 1..=12 {
            let (pause, quarantined) = open.failed();
            assert!(
                nominal <= pause && pause < nominal * 2,
                "failure {failure}: {pause:?}, nominal {nominal:?}"
            );
            assert_eq!(quarantined, failure >= 3, "failure {failure}");
            nominal = (nominal * 2).min(max);
        }
        assert!(open.opened(), "it was quarantined");
        assert!(!open.opened());
        let (pause, quarantined) = open.failed();
        assert!(pause < first * 2 && !quarantined, "it starts over");
    }

    #[test]
    fn a_huge_attempt_timeout_leaves_without_a_bound_and_without_overflow() {
        let policy = WritePolicy::default().with_attempt_timeout(Duration::MAX);
        assert_eq!(leave_bound(&policy), Duration::MAX);
        assert!(
            tokio::time::Instant::now()
                .checked_add(leave_bound(&policy))
                .is_none()
        );
        let policy = WritePolicy::default().with_attempt_timeout(Duration::from_secs(1));
        assert_eq!(leave_bound(&policy), Duration::from_secs(3));
    }

    #[test]
    fn huge_retry_pauses_saturate() {
        let mut open = failures(Duration::MAX, Duration::MAX);
        for _ in 0..5 {
            assert_eq!(open.failed().0, Duration::MAX);
        }
        let mut open = failures(Duration::from_secs(1), Duration::ZERO);
        assert!(
            open.failed().0 >= Duration::from_secs(1),
            "the cap is at least the first"
        );
    }

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        for wanted in 0..40 {
            for live in 1..7usize {
                let shares = shares(wanted, &vec![None; live]);
                assert_eq!(shares.iter().sum::<usize>(), wanted, "{wanted} over {live}");
                let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(max - min <= 1, "{wanted} over {live}: {shares:?}");
                assert!(
                    shares.windows(2).all(|w| w[0] >= w[1]),
                    "earlier hosts first"
                );
            }
        }
    }

    #[test]
    fn a_capped_host_leaves_the_rest_to_the_others() {
        assert_eq!(shares(10, &[Some(3), None]), [3, 7]);
        assert_eq!(shares(10, &[None, Some(3), None]), [4, 3, 3]);
        assert_eq!(
            shares(10, &[Some(2), Some(2)]),
            [2, 2],
            "no more than the maxima"
        );
        assert_eq!(
            shares(30, &[Some(0), None, None, Some(20)]),
            [0, 10, 10, 10]
        );
        // Any maxima: never above a maximum, the total as large as it can be.
        for wanted in 0..25 {
            for a in 0..6 {
                for b in 0..6 {
                    let maxima = [Some(a), None, Some(b), None];
                    let got = shares(wanted, &maxima);
                    assert_eq!(
                        got.iter().sum::<usize>(),
                        wanted,
                        "{wanted} {maxima:?}: {got:?}"
                    );
                    assert!(got[0] <= a && got[2] <= b);
                    let maxima = [Some(a), Some(b)];
                    let got = shares(wanted, &maxima);
                    assert_eq!(
                        got.iter().sum::<usize>(),
                        wanted.min(a + b),
                        "{wanted} {maxima:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn host_values_round_trip_and_garbage_has_no_maximum() {
        for max in [None, Some(0), Some(12)] {
            let nonce = uuid::Uuid::new_v4();
            let value = HostValue {
                max,
                nonce,
                node: "node a".into(),
            }
            .encode();
            let decoded = HostValue::decode(value.as_bytes());
            assert_eq!(
                (decoded.max, decoded.nonce, decoded.node.as_str()),
                (max, nonce, "node a")
            );
        }
        assert_eq!(HostValue::decode(b"\xff 3 x").max, None);
        assert_eq!(HostValue::decode(b"").max, None);
    }
}
