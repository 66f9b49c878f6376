//! The store's one watch on `{ns}/owners/`: snapshot, reconcile, then follow.
//!
//! A run that fails is restarted (see [`RestartBackoff`]), except when etcd denies the
//! store's user the owner keys (permission denied: its roles do not cover the namespace).
//! That is permanent: the watch logs it once, at error level, records it as the store's
//! [refusal](super::Refusal) and stops. The keepalive then loses every lease of the store
//! ([`LossReason::PermissionDenied`](crate::lease::LossReason::PermissionDenied)) and lets the node
//! lease go, and every acquisition fails with that permission error.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, KeyValue, WatchOptions};
use tokio::time::{Instant, sleep};
use uuid::Uuid;

use super::StoreShared;
use super::owner_value::OwnerValue;
use super::registry::OwnerEvent;
use crate::backoff::Backoff;
use crate::etcd::{EtcdError, chain};

/// The owner keys at one revision.
struct Snapshot {
    revision: i64,
    owners: HashMap<Uuid, OwnerEvent>,
}

impl Snapshot {
    /// What the snapshot says of `session`, as one event at the snapshot's revision: a watch
    /// restarted from here cannot have missed anything earlier that this event does not
    /// account for (a delete shows as absence, a re-creation as a newer create_revision).
    fn event_for(&self, session: Uuid) -> OwnerEvent {
        match self.owners.get(&session) {
            Some(&OwnerEvent::Put {
                create_revision,
                ours,
                ..
            }) => OwnerEvent::Put {
                revision: self.revision,
                create_revision,
                ours,
            },
            _ => OwnerEvent::Deleted {
                revision: self.revision,
            },
        }
    }
}

/// The pause before each restart of the owner watch, a deterministic [`Backoff`]: 100 ms
/// after the first failure, doubling up to 2 s while runs keep failing; back to 100 ms after a run that was healthy,
/// so that one blip long ago does not make every later restart wait the longest pause. A run
/// was healthy when its watch was established (etcd said it is created) and then delivered a
/// response (events or a progress notification), or stayed established for
/// [`STEADY`](Self::STEADY).
#[derive(Debug)]
struct RestartBackoff {
    pauses: Backoff,
    /// When this run's watch was opened.
    opened: Option<Instant>,
    /// Whether this run's watch delivered a response.
    delivered: bool,
}

impl RestartBackoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(2);
    /// How long a watch that delivers nothing (a quiet namespace) must stay open to count as
    /// healthy.
    const STEADY: Duration = Duration::from_secs(10);

    fn new() -> Self {
        Self {
            pauses: Backoff::new(Self::FIRST, Self::MAX),
            opened: None,
            delivered: false,
        }
    }

    /// The run's watch is established.
    fn opened(&mut self, now: Instant) {
        self.opened = Some(now);
    }

    /// The run's watch delivered a response.
    fn delivered(&mut self) {
        self.delivered = true;
    }

    /// The run ended at `now` and the watch restarts: how long to wait first. The next run
    /// starts afresh.
    fn pause(&mut self, now: Instant) -> Duration {
        let healthy = self
            .opened
            .is_some_and(|opened| self.delivered || now.duration_since(opened) >= Self::STEADY);
        if healthy {
            self.pauses.reset();
        }
        let pause = self.pauses.next();
        self.opened = None;
        self.delivered = false;
        pause
    }
}

/// Why a run of the watch ended, other than the store's shutdown.
#[derive(Debug, thiserror::Error)]
enum Restart {
    #[error("reading the owner keys failed")]
    Snapshot(#[source] EtcdError),
    #[error("opening the watch failed")]
    Open(#[source] EtcdError),
    #[error("opening the watch on {endpoint} timed out")]
    OpenTimedOut { endpoint: String },
    #[error("the watch on {endpoint} ended")]
    Ended { endpoint: String },
    #[error("the watch failed")]
    Failed(#[source] EtcdError),
    /// Compaction, "no leader" under require_leader, a permission refused at creation: a new
    /// snapshot covers the gap (and says, typed, whether the permission is missing).
    #[error(
        "the watch on {endpoint} was cancelled (compact revision {compact_revision}, reason {reason:?})"
    )]
    Cancelled {
        endpoint: String,
        compact_revision: i64,
        reason: String,
    },
}

impl Restart {
    /// The endpoint whose stream token etcd refused, if this run ended so: a watch created with
    /// an expired token is cancelled as "permission denied" (etcd checks the stream's token at
    /// each creation), and an opening refused for its credentials. Whether the permission is
    /// really missing, the snapshot of the next run says.
    fn token_refused(&self) -> Option<&str> {
        match self {
            Restart::Cancelled {
                endpoint, reason, ..
            } if reason.contains("permission denied") || reason.contains("auth") => Some(endpoint),
            Restart::Open(error) | Restart::Failed(error)
                if error.is_auth_failed() || error.is_permission_denied() =>
            {
                Some(error.endpoint())
            }
            _ => None,
        }
    }

    /// The permission error, when etcd denies the store's user the owner keys: permanent.
    fn permission_denied(&self) -> Option<&EtcdError> {
        match self {
            Restart::Snapshot(error) | Restart::Open(error) | Restart::Failed(error)
                if error.is_permission_denied() =>
            {
                Some(error)
            }
            _ => None,
        }
    }
}

pub(super) async fn run(shared: Arc<StoreShared>) {
    let mut backoff = RestartBackoff::new();
    loop {
        if shared.shutdown.is_cancelled() {
            return;
        }
        match follow(&shared, &mut backoff).await {
            Ok(()) => return,
            Err(restart) => {
                if let Some(denied) = restart.permission_denied() {
                    tracing::error!(
                        namespace = %shared.namespace,
                        prefix = %shared.namespace.owners_prefix(),
                        error = %chain(&restart),
                        "etcd denies this store's user the namespace's owner keys: its roles do \
                         not cover the namespace. The owner watch stops, every lease of this \
                         store is lost and acquisitions fail; grant the role readwrite on the \
                         namespace's prefix and start the store again"
                    );
                    shared.refusal.refuse(denied.clone());
                    return;
                }
                if let Some(endpoint) = restart.token_refused() {
                    shared.connection.forget_stream_token(endpoint);
                }
                tracing::debug!(reason = %chain(&restart), "owner watch restarting");
                shared.metrics.watch_restart();
                shared.connection.rotate();
            }
        }
        tokio::select! {
            _ = sleep(backoff.pause(Instant::now())) => {}
            _ = shared.shutdown.cancelled() => return,
        }
    }
}

/// One run of the watch: returns `Ok` on shutdown, `Err` when it must restart. Tells
/// `backoff` when the watch is open and when it delivers.
async fn follow(shared: &StoreShared, backoff: &mut RestartBackoff) -> Result<(), Restart> {
    let snapshot = tokio::select! {
        snapshot = read_snapshot(shared) => snapshot.map_err(Restart::Snapshot)?,
        _ = shared.shutdown.cancelled() => return Ok(()),
    };
    reconcile(shared, &snapshot);

    let prefix = shared.namespace.owners_prefix();
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(snapshot.revision.saturating_add(1))
        .with_progress_notify();
    let (client, endpoint) = shared.connection.stream_client();
    let open = async {
        client
            .ready()
            .await?
            .watch(prefix.as_str(), Some(options))
            .await
    };
    let mut stream = tokio::select! {
        opened = tokio::time::timeout(Duration::from_secs(5), open) => {
            match opened {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return Err(Restart::Open(EtcdError::new("watch", &endpoint, error))),
                Err(_) => return Err(Restart::OpenTimedOut { endpoint }),
            }
        }
        _ = shared.shutdown.cancelled() => return Ok(()),
    };
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            _ = shared.shutdown.cancelled() => return Ok(()),
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => return Err(Restart::Ended { endpoint }),
            Err(error) => return Err(Restart::Failed(EtcdError::new("watch", &endpoint, error))),
        };
        if response.canceled() {
            return Err(Restart::Cancelled {
                compact_revision: response.compact_revision(),
                reason: response.cancel_reason().to_owned(),
                endpoint,
            });
        }
        // etcd's first response says the watch is created; the later ones deliver.
        if response.created() {
            backoff.opened(Instant::now());
        } else {
            backoff.delivered();
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let Some(session) = session_of(shared, kv) else {
                continue;
            };
            let owner_event = match event.event_type() {
                EventType::Put => put_event(shared, kv),
                EventType::Delete => OwnerEvent::Deleted {
                    revision: kv.mod_revision(),
                },
            };
            observe(shared, session, owner_event);
        }
    }
}

/// Reads every owner key at one revision (the first page's, linearizable), page by page.
async fn read_snapshot(shared: &StoreShared) -> Result<Snapshot, EtcdError> {
    let (kvs, revision) = shared
        .connection
        .range_at_one_revision("owners snapshot", &shared.namespace.owners_prefix())
        .await?;
    let owners = kvs
        .iter()
        .filter_map(|kv| Some((session_of(shared, kv)?, put_event(shared, kv))))
        .collect();
    Ok(Snapshot { revision, owners })
}

/// Applies a snapshot to every session the store cares about, as if each had one event at the
/// snapshot's revision; wakes every standby (an event may have been missed).
fn reconcile(shared: &StoreShared, snapshot: &Snapshot) {
    let mut orphans = Vec::new();
    {
        let mut registry = shared.registry();
        let mut seen = std::collections::HashSet::new();
        for session in registry.sessions() {
            seen.insert(session);
            orphans.extend(registry.observe(session, snapshot.event_for(session)));
        }
        // Keys of ours that nothing here cares about are orphans too.
        for (session, event) in &snapshot.owners {
            if !seen.contains(session)
                && let OwnerEvent::Put { ours: Some(_), .. } = event
            {
                orphans.extend(registry.observe(*session, *event));
            }
        }
        registry.notify_all_waiters();
    }
    for orphan in orphans {
        shared.delete_orphan(orphan);
    }
}

fn observe(shared: &StoreShared, session: Uuid, event: OwnerEvent) {
    let orphan = shared.registry().observe(session, event);
    if let Some(orphan) = orphan {
        shared.delete_orphan(orphan);
    }
}

fn session_of(shared: &StoreShared, kv: &KeyValue) -> Option<Uuid> {
    crate::keys::id_under(&shared.namespace.owners_prefix(), kv.key())
}

fn put_event(shared: &StoreShared, kv: &KeyValue) -> OwnerEvent {
    let ours = OwnerValue::decode(kv.value())
        .filter(|owner| owner.store == shared.id)
        .map(|owner| owner.nonce);
    OwnerEvent::Put {
        revision: kv.mod_revision(),
        create_revision: kv.create_revision(),
        ours,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::time::{Duration, Instant};

    use super::*;
    use crate::lease::{Epoch, LeaseState, LossReason, NodeLease};
    use crate::store::registry::Registry;

    fn held(registry: &mut Registry, session: Uuid, epoch: u64) -> Arc<LeaseState> {
        let node = Arc::new(NodeLease::new(1, Instant::now() + Duration::from_secs(60)));
        let lease = LeaseState::new(session, Epoch(epoch), "k".into(), Uuid::new_v4(), node);
        registry.begin_acquire(session);
        registry.end_acquire(session, Some(&lease));
        lease
    }

    /// A watch restarted after a compaction (or any gap) re-reads the owner keys: what changed
    /// meanwhile is found from the snapshot alone.
    #[tokio::test(start_paused = true)]
    async fn a_snapshot_after_a_gap_finds_what_the_watch_missed() {
        let (kept, deleted, overtaken, later) = (
            Uuid::new_v4(),
            Uuid::new_v4(),
            Uuid::new_v4(),
            Uuid::new_v4(),
        );
        let mut registry = Registry::default();
        let leases = [
            held(&mut registry, kept, 10),
            held(&mut registry, deleted, 11),
            held(&mut registry, overtaken, 12),
            // Acquired after the snapshot's revision: nothing in it applies.
            held(&mut registry, later, 40),
        ];
        let put = |create_revision| OwnerEvent::Put {
            revision: create_revision,
            create_revision,
            ours: None,
        };
        let snapshot = Snapshot {
            revision: 30,
            owners: [(kept, put(10)), (overtaken, put(25))].into(),
        };
        for session in registry.sessions() {
            registry.observe(session, snapshot.event_for(session));
        }
        let reasons: Vec<_> = leases.iter().map(|l| l.loss_reason()).collect();
        assert_eq!(
            reasons,
            vec![
                None,
                Some(LossReason::Revoked),
                Some(LossReason::Overtaken),
                None
            ]
        );
        assert_eq!(registry.held(), 2);
    }

    /// The pauses of `restarts` failed runs in a row (no watch opened), from `backoff`.
    fn failing(backoff: &mut RestartBackoff, restarts: usize) -> Vec<Duration> {
        (0..restarts)
            .map(|_| backoff.pause(Instant::now()))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_restart_backoff_grows_while_runs_fail_and_resets_after_a_healthy_one() {
        let ms = Duration::from_millis;
        let mut backoff = RestartBackoff::new();
        // --- phase: a blip; every run fails before its watch opens
        assert_eq!(
            failing(&mut backoff, 7),
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000)
            ]
        );

        // --- phase: a watch opens and delivers, then fails much later: back to 100 ms
        backoff.opened(Instant::now());
        tokio::time::advance(ms(500)).await;
        backoff.delivered();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(backoff.pause(Instant::now()), ms(100));
        assert_eq!(failing(&mut backoff, 3), [ms(200), ms(400), ms(800)]);

        // --- phase: opened but silent and short-lived (cancelled at once): no reset
        backoff.opened(Instant::now());
        tokio::time::advance(ms(300)).await;
        assert_eq!(backoff.pause(Instant::now()), ms(1600));

        // --- phase: opened, silent, but up for STEADY (a quiet namespace): reset
        backoff.opened(Instant::now());
        tokio::time::advance(RestartBackoff::STEADY).await;
        assert_eq!(backoff.pause(Instant::now()), ms(100));

        // --- phase: each run starts afresh: what the healthy run did is not carried over
        assert_eq!(failing(&mut backoff, 2), [ms(200), ms(400)]);
    }
}
