//! Following the shared session registry (`{ns}/sessions/`, see
//! [`HostOptions::with_registry`](super::HostOptions::with_registry)): a snapshot, then a watch
//! from the revision after it; each session put is hosted, each deleted is removed. A watch
//! that fails, ends or hears nothing for 5 s is opened again on the next endpoint from the
//! revision after the last event applied; one that etcd compacted past reads a new snapshot
//! and applies the difference.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::time::{Instant, MissedTickBehavior, sleep};
use uuid::Uuid;

use super::Inner;
use crate::backoff::Backoff;
use crate::etcd::{EtcdError, chain};
use crate::keys::id_under;

/// How often the watch asks for progress, and how long it may hear nothing before it is
/// opened again.
const PROGRESS: Duration = Duration::from_secs(1);
const SILENCE: Duration = Duration::from_secs(5);

/// Why one run of the watch ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("reading the registry failed")]
    Snapshot(#[source] EtcdError),
    #[error("opening the watch failed")]
    Open(#[source] EtcdError),
    #[error("opening the watch on {endpoint} timed out")]
    OpenTimedOut { endpoint: String },
    #[error("the watch on {endpoint} ended")]
    Closed { endpoint: String },
    #[error("the watch failed")]
    Failed(#[source] EtcdError),
    #[error("the watch on {endpoint} heard nothing for {SILENCE:?}")]
    Silent { endpoint: String },
    #[error("the watch on {endpoint} was cancelled ({reason:?})")]
    Cancelled { endpoint: String, reason: String },
    #[error("etcd compacted past the registry's revision (compact revision {compact_revision})")]
    Compacted { compact_revision: i64 },
}

/// What the host follows of the registry.
struct Followed {
    /// The sessions the registry added (and not removed since).
    sessions: HashSet<Uuid>,
    /// The revision applied; `None` until a snapshot is read (or after a compaction).
    revision: Option<i64>,
}

/// Follows the registry until the host stops.
pub(super) async fn follow(inner: Arc<Inner>) {
    let mut pauses = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let mut followed = Followed {
        sessions: HashSet::new(),
        revision: None,
    };
    loop {
        let ended = tokio::select! {
            ended = run(&inner, &mut followed, &mut pauses) => ended,
            _ = inner.shutdown.cancelled() => return,
        };
        tracing::debug!(reason = %chain(&ended), "the session registry's watch restarts");
        if let Ended::Compacted { .. } = ended {
            followed.revision = None;
        } else {
            inner.store.connection().rotate();
        }
        tokio::select! {
            _ = sleep(pauses.next()) => {}
            _ = inner.shutdown.cancelled() => return,
        }
    }
}

/// One run: a snapshot if none is applied, then the watch.
async fn run(inner: &Arc<Inner>, followed: &mut Followed, pauses: &mut Backoff) -> Ended {
    let connection = inner.store.connection();
    let prefix = inner.store.namespace().sessions_prefix();
    let revision = match followed.revision {
        Some(revision) => revision,
        None => {
            let (kvs, revision) = match connection
                .range_at_one_revision("session registry", &prefix)
                .await
            {
                Ok(read) => read,
                Err(error) => return Ended::Snapshot(error),
            };
            let now: HashSet<Uuid> = kvs
                .iter()
                .filter_map(|kv| id_under(&prefix, kv.key()))
                .collect();
            for gone in followed.sessions.difference(&now) {
                inner.remove(*gone);
            }
            for session in &now {
                inner.add_registered(*session);
            }
            followed.sessions = now;
            followed.revision = Some(revision);
            revision
        }
    };
    let (client, endpoint) = connection.stream_client();
    let open = async {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision.saturating_add(1));
        client
            .ready()
            .await?
            .watch(prefix.as_str(), Some(options))
            .await
    };
    let stream = match tokio::time::timeout(SILENCE, open).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Ended::Open(EtcdError::new("watch", &endpoint, error)),
        Err(_) => return Ended::OpenTimedOut { endpoint },
    };
    let (mut requests, mut responses) = stream.split();
    let mut progress = tokio::time::interval_at(
        crate::deadline::deadline(Instant::now(), PROGRESS),
        PROGRESS,
    );
    progress.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_heard = Instant::now();
    loop {
        let message = tokio::select! {
            message = responses.message() => message,
            _ = progress.tick() => {
                if last_heard.elapsed() >= SILENCE {
                    return Ended::Silent { endpoint };
                }
                if let Err(error) = requests.request_progress().await {
                    return Ended::Failed(EtcdError::new("watch", &endpoint, error));
                }
                continue;
            }
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => return Ended::Closed { endpoint },
            Err(error) => return Ended::Failed(EtcdError::new("watch", &endpoint, error)),
        };
        last_heard = Instant::now();
        pauses.reset();
        if response.canceled() {
            return match response.compact_revision() {
                0 => Ended::Cancelled {
                    endpoint,
                    reason: response.cancel_reason().to_owned(),
                },
                compact_revision => Ended::Compacted { compact_revision },
            };
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            followed.revision = followed.revision.max(Some(kv.mod_revision()));
            let Some(session) = id_under(&prefix, kv.key()) else {
                continue;
            };
            match event.event_type() {
                EventType::Put => {
                    followed.sessions.insert(session);
                    inner.add_registered(session);
                }
                EventType::Delete => {
                    followed.sessions.remove(&session);
                    inner.remove(session);
                }
            }
        }
    }
}
