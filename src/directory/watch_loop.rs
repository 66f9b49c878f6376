//! The directory's watch: owner keys and host keys on one stream, resumed from the revision
//! after the last one applied, re-snapshotted after a compaction.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Event, EventType, KeyValue, WatchOptions, WatchResponse};
use tokio::time::{Instant, MissedTickBehavior, sleep};

use super::state::{HostKey, OwnerKey};
use super::{PROGRESS, SILENCE, Shared};
use crate::backoff::Backoff;
use crate::etcd::{Connection, EtcdError, chain};
use crate::keys::{Namespace, id_under};
use crate::lease::Epoch;
use crate::store::{HostValue, OwnerValue};

/// The owner keys and host keys at one revision.
pub(super) struct Read {
    pub(super) revision: i64,
    pub(super) owners: Vec<OwnerKey>,
    pub(super) hosts: Vec<HostKey>,
}

/// Reads the owner keys at one revision (the first page's, linearizable), then the host keys
/// at that same revision.
pub(super) async fn read_snapshot(
    connection: &Connection,
    namespace: &Namespace,
) -> Result<Read, EtcdError> {
    let owners_prefix = namespace.owners_prefix();
    let hosts_prefix = namespace.hosts_prefix();
    let (owners, revision) = connection
        .range_at_one_revision("directory snapshot", &owners_prefix)
        .await?;
    let (hosts, _) = connection
        .range_at("directory snapshot", &hosts_prefix, revision)
        .await?;
    Ok(Read {
        revision,
        owners: owners
            .iter()
            .filter_map(|kv| owner_key(&owners_prefix, kv))
            .collect(),
        hosts: hosts
            .iter()
            .filter_map(|kv| host_key(&hosts_prefix, kv))
            .collect(),
    })
}

fn owner_key(prefix: &str, kv: &KeyValue) -> Option<OwnerKey> {
    Some(OwnerKey {
        session: id_under(prefix, kv.key())?,
        epoch: Epoch::from_revision(kv.create_revision()),
        revision: kv.mod_revision(),
        lease_id: kv.lease(),
        value: OwnerValue::decode(kv.value()),
    })
}

fn host_key(prefix: &str, kv: &KeyValue) -> Option<HostKey> {
    Some(HostKey {
        store: id_under(prefix, kv.key())?,
        revision: kv.mod_revision(),
        value: HostValue::decode(kv.value()),
    })
}

/// Why one run of the watch ended, other than the directory's close.
#[derive(Debug, thiserror::Error)]
enum Ended {
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
    #[error("etcd compacted past the directory's revision (compact revision {compact_revision})")]
    Compacted { compact_revision: i64 },
    #[error("reading a new snapshot failed")]
    Snapshot(#[source] EtcdError),
}

/// Follows the keys until the directory is closed.
pub(super) async fn run(shared: Arc<Shared>) {
    // 100 ms doubling to 2 s while runs keep failing; reset by every response heard.
    let mut pauses = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let mut compacted = false;
    loop {
        let ended = tokio::select! {
            ended = follow(&shared, &mut pauses, compacted) => ended,
            _ = shared.stop.cancelled() => return,
        };
        // A snapshot that failed is read again next run.
        compacted = matches!(ended, Ended::Compacted { .. } | Ended::Snapshot(_));
        tracing::debug!(
            namespace = %shared.namespace,
            reason = %chain(&ended),
            "the owner directory's watch restarts"
        );
        if !compacted {
            shared.connection.rotate();
            if let Ended::Open(error) | Ended::Failed(error) = &ended
                && (error.is_auth_failed() || error.is_permission_denied())
            {
                shared.connection.forget_stream_token(error.endpoint());
            }
        }
        tokio::select! {
            _ = sleep(pauses.next()) => {}
            _ = shared.stop.cancelled() => return,
        }
    }
}

/// One run: a new snapshot first if the last run was compacted away, then the watch.
async fn follow(shared: &Shared, pauses: &mut Backoff, resnapshot: bool) -> Ended {
    if resnapshot {
        match read_snapshot(&shared.connection, &shared.namespace).await {
            Ok(read) => {
                shared.heard(read.revision);
                shared.apply(|state| state.reset(read.revision, read.owners, read.hosts));
            }
            Err(error) => return Ended::Snapshot(error),
        }
    }
    let owners_prefix = shared.namespace.owners_prefix();
    let hosts_prefix = shared.namespace.hosts_prefix();
    let (owners_from, hosts_from) = {
        let state = shared.read();
        (
            state.revision.saturating_add(1),
            state.hosts_revision.saturating_add(1),
        )
    };
    let (client, endpoint) = shared.connection.stream_client();
    let open = async {
        let options = |from: i64| WatchOptions::new().with_prefix().with_start_revision(from);
        let mut stream = client
            .ready()
            .await?
            .watch(owners_prefix.as_str(), Some(options(owners_from)))
            .await?;
        stream
            .watch(hosts_prefix.as_str(), Some(options(hosts_from)))
            .await?;
        Ok::<_, etcd_client::Error>(stream)
    };
    let stream = match tokio::time::timeout(Duration::from_secs(5), open).await {
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
        let heard = response.header().map_or(0, |h| h.revision());
        shared.heard(heard);
        if response.canceled() {
            return match response.compact_revision() {
                0 => Ended::Cancelled {
                    endpoint,
                    reason: response.cancel_reason().to_owned(),
                },
                compact_revision => Ended::Compacted { compact_revision },
            };
        }
        apply(shared, &owners_prefix, &hosts_prefix, &response, heard);
    }
}

/// Applies one response: its events, or the progress it proves.
fn apply(
    shared: &Shared,
    owners_prefix: &str,
    hosts_prefix: &str,
    response: &WatchResponse,
    heard: i64,
) {
    let events = response.events();
    if events.is_empty() {
        // A requested progress notification (for every watch of the stream) proves that
        // every event up to its revision was delivered, where etcd sends it in order.
        if response.watch_id() == -1 && !response.created() && shared.trust_progress {
            shared.apply(|state| {
                state.revision = state.revision.max(heard);
                state.hosts_revision = state.hosts_revision.max(heard);
                Vec::new()
            });
        }
        return;
    }
    shared.apply(|state| {
        events
            .iter()
            .filter_map(|event| {
                let kv = event.kv()?;
                if kv.key().starts_with(owners_prefix.as_bytes()) {
                    owner_event(state, owners_prefix, event, kv)
                } else {
                    host_event(state, hosts_prefix, event, kv)
                }
            })
            .collect()
    });
}

fn owner_event(
    state: &mut super::State,
    prefix: &str,
    event: &Event,
    kv: &KeyValue,
) -> Option<super::Change> {
    state.revision = state.revision.max(kv.mod_revision());
    match event.event_type() {
        EventType::Put => state.put_owner(owner_key(prefix, kv)?),
        EventType::Delete => state.delete_owner(id_under(prefix, kv.key())?, kv.mod_revision()),
    }
}

fn host_event(
    state: &mut super::State,
    prefix: &str,
    event: &Event,
    kv: &KeyValue,
) -> Option<super::Change> {
    state.hosts_revision = state.hosts_revision.max(kv.mod_revision());
    match event.event_type() {
        EventType::Put => state.put_host(host_key(prefix, kv)?),
        EventType::Delete => state.delete_host(id_under(prefix, kv.key())?, kv.mod_revision()),
    }
}
