//! Who owns which session, known locally and kept current by one watch: what a router needs to
//! send each request to its session's owner.
//!
//! An [`OwnerDirectory`] reads the namespace's owner keys and host keys at one revision (paged),
//! then watches both prefixes on one stream from the next revision. It answers
//! [`owner_of`](OwnerDirectory::owner_of) from a local map, without I/O, and streams
//! [changes](OwnerDirectory::changes) as it applies them.
//!
//! - **Never older than what it has applied.** The owner entries are exactly etcd's owner keys
//!   at [`revision`](OwnerDirectory::revision): every event up to it is applied, none after it.
//!   [`snapshot`](OwnerDirectory::snapshot) gives all of them with that revision, read under one
//!   lock.
//! - **Dead hosts first.** A [`SessionHost`](crate::SessionHost) registers a host key on its node
//!   lease and deletes it first when it leaves. When that key goes (the host left, or its node
//!   lease expired or was revoked), its sessions read
//!   [`host_alive = false`](Owner::host_alive) at once, before etcd deletes their owner keys
//!   (a leaving host releases them one by one; an expired lease deletes them in the same
//!   revision). Owners that register no host key (a bare [`Store`](crate::Store)) count as
//!   alive.
//! - **Resumed, never stale.** A watch that fails is re-opened from the revision after the last
//!   one applied, on the next endpoint, after a pause (100 ms doubling to 2 s). A watch that
//!   hears nothing for [`SILENCE`] (it asks etcd for progress every [`PROGRESS`]) is taken for
//!   cut off and re-opened. If etcd compacted past that revision meanwhile, the directory reads
//!   a new snapshot and applies the difference as changes, one per session and host that
//!   differs.
//! - **Lag**: [`lag`](OwnerDirectory::lag) tells the revision applied, the latest one heard of
//!   and how long etcd has been silent.
//!
//! Each entry takes about 64 bytes (a session id, an epoch, a lease, a revision and a shared
//! [`Node`]), besides the strings of each node, which its entries share.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use crate::etcd::{Connection, EtcdError};
use crate::keys::Namespace;
use crate::lease::Epoch;

mod state;
mod watch_loop;

use state::State;

/// How often the directory asks etcd for the progress of its watch.
pub const PROGRESS: Duration = Duration::from_secs(1);

/// How long a watch may hear nothing (no event, no progress) before it is re-opened.
pub const SILENCE: Duration = Duration::from_secs(5);

/// How many changes a subscriber may fall behind before it misses some (see
/// [`Change::Missed`]).
pub const CHANGES_BUFFERED: usize = 4096;

/// The node an owner key or host key names: shared by every entry of the same store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Node {
    /// The node's store instance (one per process); nil for an owner value leasehold did not
    /// write.
    pub store: Uuid,
    /// The node's name (empty for a value leasehold did not write).
    pub name: String,
    /// The address the node advertises
    /// ([`StoreOptions::with_advertise`](crate::StoreOptions::with_advertise)), if any.
    pub advertise: Option<String>,
    /// The node's metadata (empty if none).
    pub metadata: Vec<u8>,
}

/// A session's owner, as the directory knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owner {
    /// The session.
    pub session: Uuid,
    /// The owner's epoch: its owner key's create revision, when it acquired the session.
    pub epoch: Epoch,
    /// The node that owns it.
    pub node: Arc<Node>,
    /// The etcd lease the owner key is attached to (the owner's node lease).
    pub lease_id: i64,
    /// The owner key's mod revision, at which the directory learned this owner.
    pub revision: i64,
    /// `false` once the owner's host key is gone (the host left, or its node lease ended):
    /// send it nothing more, its sessions are about to be released.
    pub host_alive: bool,
}

/// A live host, as its host key shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveHost {
    /// The host's node.
    pub node: Arc<Node>,
    /// How many sessions its store owns.
    pub sessions: usize,
}

/// Every owner at one revision; see [`OwnerDirectory::snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The revision the owners are etcd's at.
    pub revision: i64,
    /// The owners, by session id.
    pub owners: Vec<Owner>,
}

/// One change the directory applied, in the order it applied them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// A session without an owner got one (at `owner.revision`).
    Acquired {
        /// The new owner.
        owner: Owner,
    },
    /// A session's owner changed without the directory seeing it free (a snapshot after a
    /// gap found a newer epoch), at `to.revision`.
    Moved {
        /// The owner before.
        from: Owner,
        /// The owner now.
        to: Owner,
    },
    /// A session's owner let go (released, revoked, or its node lease ended).
    Released {
        /// The owner that let go.
        owner: Owner,
        /// The revision of the owner key's delete.
        revision: i64,
    },
    /// A host registered.
    HostJoined {
        /// The host's node.
        node: Arc<Node>,
        /// The revision of its host key.
        revision: i64,
    },
    /// A host's key went: its `sessions` sessions now read `host_alive = false`.
    HostGone {
        /// The host's node.
        node: Arc<Node>,
        /// How many sessions it still owned.
        sessions: usize,
        /// The revision of the host key's delete.
        revision: i64,
    },
    /// This subscriber fell more than [`CHANGES_BUFFERED`] changes behind and missed
    /// `changes` of them; the directory itself is current (read it again).
    Missed {
        /// How many changes were missed.
        changes: u64,
    },
}

impl Change {
    /// The revision the change happened at (`None` for [`Missed`](Change::Missed)).
    pub fn revision(&self) -> Option<i64> {
        match self {
            Change::Acquired { owner } | Change::Moved { to: owner, .. } => Some(owner.revision),
            Change::Released { revision, .. }
            | Change::HostJoined { revision, .. }
            | Change::HostGone { revision, .. } => Some(*revision),
            Change::Missed { .. } => None,
        }
    }

    /// The session the change is about, if it is about one.
    pub fn session(&self) -> Option<Uuid> {
        match self {
            Change::Acquired { owner }
            | Change::Moved { to: owner, .. }
            | Change::Released { owner, .. } => Some(owner.session),
            _ => None,
        }
    }
}

/// How far behind etcd the directory is; see [`OwnerDirectory::lag`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lag {
    /// The revision the owner entries are etcd's at.
    pub applied: i64,
    /// The latest revision the directory heard of (any key's, not only owner keys').
    pub heard: i64,
    /// How long ago the directory last heard from etcd: it grows while it is cut off.
    pub silent_for: Duration,
}

/// The changes of a directory, from when [`OwnerDirectory::changes`] was called.
#[derive(Debug)]
pub struct Changes {
    receiver: broadcast::Receiver<Change>,
}

impl Changes {
    /// The next change; `None` once the directory is closed.
    pub async fn next(&mut self) -> Option<Change> {
        match self.receiver.recv().await {
            Ok(change) => Some(change),
            Err(broadcast::error::RecvError::Lagged(changes)) => Some(Change::Missed { changes }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// What the directory and its watch share.
#[derive(Debug)]
struct Shared {
    state: RwLock<State>,
    changes: broadcast::Sender<Change>,
    /// The owners' revision, for [`OwnerDirectory::wait_for`].
    applied: watch::Sender<i64>,
    heard: AtomicI64,
    heard_at: Mutex<Instant>,
    connection: Connection,
    namespace: Namespace,
    /// Whether a requested progress notification may advance the applied revision: only on
    /// etcd releases where it comes in order with the events (3.4.25, 3.5.8 and later).
    trust_progress: bool,
    stop: CancellationToken,
}

impl Shared {
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies `apply` to the state, then sends the changes it made in order.
    fn apply(&self, apply: impl FnOnce(&mut State) -> Vec<Change>) {
        let (changes, revision) = {
            let mut state = self.write();
            let changes = apply(&mut state);
            (changes, state.revision)
        };
        for change in changes {
            // No subscriber is not an error.
            let _ = self.changes.send(change);
        }
        self.applied.send_if_modified(|applied| {
            let advanced = revision > *applied;
            *applied = (*applied).max(revision);
            advanced
        });
    }

    fn heard(&self, revision: i64) {
        self.heard.fetch_max(revision, Ordering::Relaxed);
        *crate::sync::lock(&self.heard_at) = Instant::now();
    }
}

/// A local, watch-fed view of who owns which session; see the [module docs](self). Cheap to
/// clone; the watch stops when the last clone is dropped or [`close`](Self::close) is called.
///
/// # Examples
///
/// ```no_run
/// use leasehold::{OwnerDirectory, Store, StoreOptions, Uuid};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Store::connect(StoreOptions::new(["http://127.0.0.1:2379"])).await?;
/// // Where no store runs, `Admin::directory` starts one the same way.
/// let directory =
///     OwnerDirectory::start(store.connection().clone(), store.namespace().clone()).await?;
/// let session = Uuid::from_u128(7);
/// match directory.owner_of(session) {
///     Some(owner) if owner.host_alive => println!("send to {:?}", owner.node.advertise),
///     Some(_) => println!("its host is leaving: ask again shortly"),
///     None => println!("nobody owns {session}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct OwnerDirectory {
    shared: Arc<Shared>,
    _stop: Arc<DropGuard>,
}

impl OwnerDirectory {
    /// Reads the owner and host keys of `namespace` and starts following them. Returns once the
    /// first snapshot is read (its errors are returned; later ones are retried for as long as
    /// the directory lives).
    pub async fn start(connection: Connection, namespace: Namespace) -> Result<Self, EtcdError> {
        let version = connection.status().await?.version;
        let read = watch_loop::read_snapshot(&connection, &namespace).await?;
        let mut state = State::default();
        state.reset(read.revision, read.owners, read.hosts);
        let revision = state.revision;
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            state: RwLock::new(state),
            changes: broadcast::Sender::new(CHANGES_BUFFERED),
            applied: watch::Sender::new(revision),
            heard: AtomicI64::new(revision),
            heard_at: Mutex::new(Instant::now()),
            connection,
            namespace,
            trust_progress: progress_in_order(&version),
            stop: stop.clone(),
        });
        tokio::spawn(watch_loop::run(shared.clone()));
        Ok(Self {
            shared,
            _stop: Arc::new(stop.drop_guard()),
        })
    }

    /// `session`'s owner, if it has one; from the local map, without I/O.
    pub fn owner_of(&self, session: Uuid) -> Option<Owner> {
        self.shared.read().owner_of(session)
    }

    /// `session`'s owner with the revision the directory is etcd's owner keys at, read under
    /// one lock: the owner (or its absence) is etcd's at that revision.
    pub fn owner_at(&self, session: Uuid) -> (Option<Owner>, i64) {
        let state = self.shared.read();
        (state.owner_of(session), state.revision)
    }

    /// Every owner, with the revision they are etcd's at (read under one lock).
    pub fn snapshot(&self) -> Snapshot {
        let state = self.shared.read();
        Snapshot {
            revision: state.revision,
            owners: state.owners(),
        }
    }

    /// Every live host, by store id, with how many sessions each owns.
    pub fn hosts(&self) -> Vec<LiveHost> {
        self.shared
            .read()
            .hosts()
            .into_iter()
            .map(|(node, sessions)| LiveHost { node, sessions })
            .collect()
    }

    /// How many sessions have an owner.
    pub fn len(&self) -> usize {
        self.shared.read().len()
    }

    /// Whether no session has an owner.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The revision the owner entries are etcd's at.
    pub fn revision(&self) -> i64 {
        self.shared.read().revision
    }

    /// How far behind etcd the directory is.
    pub fn lag(&self) -> Lag {
        let heard_at = *crate::sync::lock(&self.shared.heard_at);
        let applied = self.revision();
        Lag {
            applied,
            heard: self.shared.heard.load(Ordering::Relaxed).max(applied),
            silent_for: heard_at.elapsed(),
        }
    }

    /// The changes the directory applies from now on.
    pub fn changes(&self) -> Changes {
        Changes {
            receiver: self.shared.changes.subscribe(),
        }
    }

    /// Waits until the directory has applied `revision` (e.g. the revision of an acquisition
    /// just made, to read one's own writes). Returns at once if it has.
    pub async fn wait_for(&self, revision: i64) {
        let mut applied = self.shared.applied.subscribe();
        // The sender lives as long as `self`.
        let _ = applied.wait_for(|applied| *applied >= revision).await;
    }

    /// The namespace it follows.
    pub fn namespace(&self) -> &Namespace {
        &self.shared.namespace
    }

    /// Stops the watch (for every clone); the map stays as it was.
    pub fn close(&self) {
        self.shared.stop.cancel();
    }
}

/// Whether etcd `version` sends requested progress notifications in order with the watch's
/// events (etcd-io/etcd#15220, fixed in 3.4.25 and 3.5.8): only then does one prove that every
/// event up to its revision has been delivered.
fn progress_in_order(version: &str) -> bool {
    match crate::etcd::parse_version(version) {
        Some((3, 4, patch)) => patch >= 25,
        Some((3, 5, patch)) => patch >= 8,
        Some((3, minor, _)) => minor > 5,
        Some((major, _, _)) => major > 3,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::progress_in_order;

    #[test]
    fn progress_is_trusted_only_where_etcd_sends_it_in_order() {
        let trusted: Vec<bool> = [
            "3.4.23", "3.4.25", "3.5.7", "3.5.8", "3.5.16", "3.6.0", "4.0.0", "3.5", "garbage",
        ]
        .iter()
        .map(|version| progress_in_order(version))
        .collect();
        assert_eq!(
            trusted,
            [false, true, false, true, true, true, true, false, false]
        );
    }
}
