//! `leasehold node`: a session host.
//!
//! Given a set of sessions, the node owns those it can and stands by on the rest (woken by the
//! watch, no polling). For each owned session it opens a [`Rig`] (lease, workspace root
//! `ws-{session}`, journal) and appends one heartbeat event per second. When a session is
//! lost it stands by again. On SIGTERM or SIGINT it shuts every session down in order (last
//! append, workspace root, lease) and exits 0.
//!
//! It prints one line per event, for people and scripts alike:
//!
//! ```text
//! [   0.512s] node-a acquired session=… epoch=…
//! [   7.020s] node-a lost session=… reason=expired
//! [   9.001s] node-a released session=…
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leasehold::{AcquireError, Namespace, Rig, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Common, Failure};

#[derive(Args)]
pub(crate) struct NodeArgs {
    /// Host sessions 0..N of the namespace (the same N sessions on every node).
    #[arg(long, conflicts_with = "session")]
    sessions: Option<u32>,
    /// Host this session (repeatable).
    #[arg(long)]
    session: Vec<Uuid>,
}

/// Session `i` of a namespace: the same on every node, different in every namespace.
pub(crate) fn numbered_session(namespace: &Namespace, i: u32) -> Uuid {
    // FNV-1a of the namespace: stable across builds and platforms.
    let hash = namespace
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    Uuid::from_u64_pair(hash, u64::from(i))
}

/// Prints timestamped lines.
#[derive(Clone)]
pub(crate) struct Timeline {
    start: Instant,
}

impl Timeline {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    pub(crate) fn say(&self, who: &str, what: impl std::fmt::Display) {
        let t = self.start.elapsed().as_secs_f64();
        println!("[{t:8.3}s] {who} {what}");
    }
}

pub(crate) async fn run(common: &Common, args: &NodeArgs) -> Result<(), Failure> {
    let sessions: Vec<Uuid> = match args.sessions {
        Some(n) => (0..n)
            .map(|i| numbered_session(&common.namespace, i))
            .collect(),
        None => args.session.clone(),
    };
    if sessions.is_empty() {
        return Err(Failure::message(
            "no sessions to host: give --sessions N or --session UUID",
            2,
        ));
    }
    let name = common
        .node
        .clone()
        .unwrap_or_else(|| format!("node-{}", std::process::id()));
    let store = Arc::new(common.store(common.endpoints(), &name).await?);
    let timeline = Timeline::new();
    timeline.say(
        &name,
        format_args!(
            "ready: {} sessions, namespace {}, node lease ttl {:?}",
            sessions.len(),
            common.namespace,
            store.ttl()
        ),
    );

    let shutdown = CancellationToken::new();
    let mut hosts = tokio::task::JoinSet::new();
    for session in sessions {
        hosts.spawn(host(
            store.clone(),
            session,
            name.clone(),
            timeline.clone(),
            shutdown.clone(),
        ));
    }
    wait_for_signal().await;
    timeline.say(&name, "shutting down");
    shutdown.cancel();
    while hosts.join_next().await.is_some() {}
    store.close().await;
    timeline.say(&name, "stopped");
    Ok(())
}

pub(crate) async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Owns `session` whenever it can, heartbeating into its journal, until shutdown.
async fn host(
    store: Arc<Store>,
    session: Uuid,
    name: String,
    timeline: Timeline,
    shutdown: CancellationToken,
) {
    let workspace = format!("ws-{session}");
    loop {
        let acquired = tokio::select! {
            acquired = store.acquire_lease_wait(session, Duration::from_secs(3600)) => acquired,
            _ = shutdown.cancelled() => return,
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(AcquireError::TimedOut { .. }) => continue,
            Err(AcquireError::StoreClosed) => return,
            Err(error) => {
                timeline.say(
                    &name,
                    format_args!("acquire session={session} failed: {error}"),
                );
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
        };
        let rig = match Rig::with_lease(&store, lease, &workspace).await {
            Ok(rig) => rig,
            Err(error) => {
                timeline.say(
                    &name,
                    format_args!("open session={session} failed: {}", super::chain(&error)),
                );
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
        };
        timeline.say(
            &name,
            format_args!("acquired session={session} epoch={}", rig.epoch()),
        );
        let lost = rig.lost();
        let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
        let mut beats = 0u64;
        loop {
            tokio::select! {
                reason = lost.clone() => {
                    timeline.say(&name, format_args!("lost session={session} reason={reason}"));
                    break;
                }
                _ = shutdown.cancelled() => {
                    match rig.shutdown().await {
                        Ok(()) => timeline.say(&name, format_args!("released session={session}")),
                        Err(error) => timeline.say(
                            &name,
                            format_args!("release session={session} deferred: {}", super::chain(&error)),
                        ),
                    }
                    return;
                }
                _ = heartbeat.tick() => {
                    beats += 1;
                    if let Err(error) = rig.journal().append(format!("heartbeat {name} {beats}")).await {
                        timeline.say(
                            &name,
                            format_args!("heartbeat session={session} failed: {}", super::chain(&error)),
                        );
                    }
                }
            }
        }
    }
}
