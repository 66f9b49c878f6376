//! `leasehold node`: a session host.
//!
//! A thin command over [`SessionHost`]: given a set of sessions, the node owns its share of
//! them (⌈sessions / live nodes⌉, at most `--max-sessions`) and stands by on the rest (woken
//! by the watch, no polling). For each owned session it opens a [`Rig`] (lease, workspace root
//! `ws-{session}`, journal) and appends one heartbeat event per second (`--interval`). With
//! `--keep N` it trims each journal it owns back to its last N records in the background, so
//! that journals do not fill a shared etcd. When a session is
//! lost, or its journal breaks, it shuts the rig down in order and stands by again. On SIGTERM
//! or SIGINT it shuts every session down in order (last append, workspace root, lease) and
//! exits 0.
//!
//! The heartbeat of beat `n` under epoch `e` is the event `heartbeat {node} epoch={e} beat={n}`:
//! unique within its journal, since every ownership of a session has an epoch of its own.
//!
//! It prints one line per event, for people and scripts alike:
//!
//! ```text
//! [   0.512s] node-a acquired session=… epoch=…
//! [   7.020s] node-a lost session=… reason=expired
//! [   9.001s] node-a released session=…
//! ```
//!
//! When etcd's NOSPACE alarm stops its writes it says so once, at WARN on stderr (how many
//! sessions it blocks and the operator's way out), `/readyz` answers 503 and the metrics
//! `leasehold_nospace` and `leasehold_nospace_alarms_total` show it; the heartbeats go on
//! failing until etcd takes writes again, then resume by themselves, and it says that too.
//!
//! With `--print-appends` it also prints one line per heartbeat append, once its result is
//! known: enough to rebuild the payload and hold the journal to what the node was told.
//!
//! ```text
//! [   1.514s] node-a appended session=… epoch=… seq=… beat=…
//! [   8.002s] node-a heartbeat session=… epoch=… beat=… failed: …
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leasehold::{GiveUp, HostEvent, HostOptions, Namespace, Rig, SessionHost};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Common, Failure};

#[derive(Args)]
pub(crate) struct NodeArgs {
    /// Host sessions 0..N of the namespace (the same N sessions on every node), N at most
    /// 1000000.
    #[arg(
        long,
        conflicts_with = "session",
        value_parser = clap::value_parser!(u32).range(..=i64::from(MAX_SESSIONS))
    )]
    sessions: Option<u32>,
    /// Host this session (repeatable).
    #[arg(long)]
    session: Vec<Uuid>,
    /// Host every session of the shared registry (`leasehold sessions create`), as they are
    /// created and finished; with --sessions or --session, those too.
    #[arg(long)]
    registry: bool,
    /// Hold at most this many sessions, whatever the balance allows.
    #[arg(long)]
    max_sessions: Option<usize>,
    /// This node's weight in the balance, 0 to 1000: its share of the sessions is proportional
    /// to it among the live nodes (0 takes none).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(..=1000))]
    weight: u32,
    /// How long this node waits, registered but taking nothing, before it takes any session,
    /// e.g. `10s`, `0s` (no settling): nodes started together see each other before any takes
    /// a share, and a node that joins and leaves within it moves nothing. Default: twice the
    /// TTL.
    #[arg(long, value_parser = humantime::parse_duration)]
    settle: Option<Duration>,
    /// Print a line for every acknowledged heartbeat append: its session, epoch, sequence
    /// number and beat (the payload is `heartbeat {node} epoch={epoch} beat={beat}`).
    #[arg(long)]
    print_appends: bool,
    /// The time between two heartbeats of a session, e.g. `1s`, `50ms`.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// Keep only the last N records of each journal this node owns: trimmed back to N in the
    /// background once a journal holds half a trim batch more (a batch is N/2 records, at
    /// least 8), so that a journal holds at most N + one batch while trims keep up.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    keep: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics, with /healthz (the process is up) and
    /// /readyz (503 while the node lease is not valid or etcd refuses writes for space), e.g.
    /// `127.0.0.1:9464`.
    #[arg(long, value_name = "ADDR", env = "LEASEHOLD_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

/// The most sessions `--sessions` numbers.
const MAX_SESSIONS: u32 = 1_000_000;

fn parse_interval(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(interval) if interval >= Duration::from_millis(1) => Ok(interval),
        Ok(_) => Err("at least 1ms".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

/// How many records beyond `keep` a journal may hold (while trims keep up).
pub(crate) fn trim_batch(keep: u64) -> u64 {
    (keep / 2).max(8)
}

/// Where to trim a journal whose last record is `last` and whose base is `base` to keep its
/// last `keep` records: `None` while it holds no more than `keep` and half a trim batch.
fn trim_before(last: u64, base: u64, keep: u64) -> Option<u64> {
    let next = last.saturating_add(1);
    (next.saturating_sub(base) > keep.saturating_add(trim_batch(keep) / 2))
        .then(|| next.saturating_sub(keep))
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
    /// On stderr (when stdout carries results), else on stdout.
    stderr: bool,
}

impl Timeline {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            stderr: false,
        }
    }

    /// A timeline printed on stderr.
    pub(crate) fn on_stderr() -> Self {
        Self {
            start: Instant::now(),
            stderr: true,
        }
    }

    /// The time since the timeline started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub(crate) fn say(&self, who: &str, what: impl std::fmt::Display) {
        let t = self.elapsed().as_secs_f64();
        if self.stderr {
            eprintln!("[{t:8.3}s] {who} {what}");
        } else {
            println!("[{t:8.3}s] {who} {what}");
        }
    }
}

/// What `node` and `serve` start from: the node's name, its store, a timeline, and the metrics
/// endpoint (`--metrics-addr`), served until `metrics` is dropped.
pub(crate) struct Started {
    pub(crate) name: String,
    pub(crate) store: Arc<leasehold::Store>,
    pub(crate) timeline: Timeline,
    pub(crate) metrics: tokio_util::sync::DropGuard,
}

/// Connects the node's store (named by `--node`, else `node-{pid}`), and serves its metrics
/// at `metrics_addr` if given (the recorder installed before the store records anything).
pub(crate) async fn start(
    common: &Common,
    metrics_addr: Option<std::net::SocketAddr>,
    options: impl FnOnce(leasehold::StoreOptions) -> leasehold::StoreOptions,
) -> Result<Started, Failure> {
    let name = common
        .node
        .clone()
        .unwrap_or_else(|| format!("node-{}", std::process::id()));
    let exporter = match metrics_addr {
        Some(addr) => Some(super::serve::install(addr).await?),
        None => None,
    };
    let options = options(common.store_options(common.endpoints(), &name)?);
    let store = Arc::new(
        leasehold::Store::connect(options)
            .await
            .map_err(super::store_failure)?,
    );
    let timeline = Timeline::new();
    let serving = CancellationToken::new();
    if let Some((handle, listener)) = exporter {
        let local = super::serve::serve(handle, listener, store.clone(), serving.clone())?;
        timeline.say(&name, format_args!("metrics at http://{local}/metrics"));
    }
    Ok(Started {
        name,
        store,
        timeline,
        metrics: serving.drop_guard(),
    })
}

pub(crate) async fn run(common: &Common, args: &NodeArgs) -> Result<(), Failure> {
    let sessions: Vec<Uuid> = match args.sessions {
        Some(n) => (0..n)
            .map(|i| numbered_session(&common.namespace, i))
            .collect(),
        None => args.session.clone(),
    };
    if sessions.is_empty() && !args.registry {
        return Err(Failure::message(
            "no sessions to host: give --sessions N, --session UUID or --registry",
            2,
        ));
    }
    let Started {
        name,
        store,
        timeline,
        metrics: _metrics,
    } = start(common, args.metrics_addr, |options| options).await?;
    timeline.say(
        &name,
        format_args!(
            "ready: {} sessions{}, namespace {}, node lease ttl {:?}",
            sessions.len(),
            if args.registry {
                " and the registry's"
            } else {
                ""
            },
            common.namespace,
            store.ttl()
        ),
    );

    let mut options = HostOptions::default().with_weight(args.weight);
    if let Some(settle) = args.settle {
        options = options.with_settle(settle);
    }
    // A first run would look stuck for the settle otherwise: say it.
    let settle = args.settle.unwrap_or_else(|| store.ttl().saturating_mul(2));
    if !settle.is_zero() {
        timeline.say(
            &name,
            format_args!(
                "settling for {settle:?}: no session is taken until the nodes it sees are stable (--settle)"
            ),
        );
    }
    if args.registry {
        options = options.with_registry();
    }
    if let Some(max) = args.max_sessions {
        options = options.with_max_sessions(max);
    }
    let work = {
        let beats = Beats {
            name: name.clone(),
            timeline: timeline.clone(),
            print_appends: args.print_appends,
            interval: args.interval,
            keep: args.keep,
        };
        move |rig, stop| heartbeat(rig, stop, beats.clone())
    };
    let host = SessionHost::start(store.clone(), options, sessions, work);
    let printer = tokio::spawn(print_events(host.events(), name.clone(), timeline.clone()));
    // A namespace outside the user's roles: the store can hold nothing, so the node stops.
    let refused = tokio::select! {
        () = wait_for_signal() => None,
        error = store.refused() => Some(error),
        () = say_nospace(&store, &host) => None,
    };
    timeline.say(&name, "shutting down");
    host.shutdown().await;
    drop(host);
    let _ = printer.await;
    store.close().await;
    timeline.say(&name, "stopped");
    match refused {
        None => Ok(()),
        Some(error) => Err(Failure::message(
            format!(
                "the user's roles do not cover namespace {}: {}",
                common.namespace,
                super::chain(&error)
            ),
            1,
        )),
    }
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

/// Says once at WARN when etcd's NOSPACE alarm stops this node's writes, and once when etcd
/// takes them again (etcd itself logs its "alarm disarmed" at WARN). Never returns.
async fn say_nospace(store: &leasehold::Store, host: &SessionHost) {
    let mut nospace = store.nospace_alarm();
    let mut since: Option<Instant> = None;
    while nospace.changed().await.is_ok() {
        let raised = *nospace.borrow_and_update();
        match (raised, since) {
            (true, None) => {
                since = Some(Instant::now());
                let sessions = host.held_count();
                tracing::warn!(
                    sessions,
                    "etcd raised its NOSPACE alarm (its database reached \
                     --quota-backend-bytes): it refuses every write of every tenant, so the \
                     {sessions} sessions this node owns cannot append and no session can be \
                     acquired. The way out: trim or delete journals (leasehold journal trim, \
                     leasehold journal delete), compact etcd's history, defragment each member, \
                     then disarm the alarm (etcdctl alarm disarm); see docs/production.md, \
                     \"Quota and the NOSPACE alarm\". Appends resume by themselves once the \
                     alarm is disarmed."
                );
            }
            (false, Some(raised)) => {
                since = None;
                tracing::warn!(
                    "etcd takes writes again after {:.1?} of NOSPACE: appends resume",
                    raised.elapsed()
                );
            }
            _ => {}
        }
    }
    // The store outlives this node's run: its sender is never dropped while we wait.
    std::future::pending().await
}

/// One line per host event.
async fn print_events(
    mut events: tokio::sync::broadcast::Receiver<HostEvent>,
    name: String,
    timeline: Timeline,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(HostEvent::Acquired { session, epoch }) => {
                timeline.say(
                    &name,
                    format_args!("acquired session={session} epoch={epoch}"),
                );
            }
            Ok(HostEvent::GaveUp {
                session,
                why,
                result,
                ..
            }) => {
                match why {
                    GiveUp::Lost(reason) => {
                        timeline.say(
                            &name,
                            format_args!("lost session={session} reason={reason}"),
                        );
                    }
                    GiveUp::Stopped | GiveUp::Shed => {}
                    GiveUp::Moved { to } => {
                        timeline.say(&name, format_args!("moved session={session} to={to}"))
                    }
                    other => {
                        timeline.say(&name, format_args!("gave up session={session} why={other}"))
                    }
                }
                match result {
                    Ok(()) => timeline.say(&name, format_args!("released session={session}")),
                    Err(error) => timeline.say(
                        &name,
                        format_args!(
                            "release session={session} deferred: {}",
                            super::chain(&*error)
                        ),
                    ),
                }
            }
            Ok(HostEvent::OpenFailed { session, error }) => timeline.say(
                &name,
                format_args!("open session={session} failed: {}", super::chain(&*error)),
            ),
            Ok(HostEvent::Quarantined {
                session,
                failures,
                retry_in,
                ..
            }) => timeline.say(
                &name,
                format_args!(
                    "quarantined session={session} failures={failures} retry_in={retry_in:?}"
                ),
            ),
            Ok(_) => {}
            Err(RecvError::Lagged(missed)) => {
                timeline.say(&name, format_args!("({missed} events not shown)"));
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// What each owned session's work does.
#[derive(Clone)]
struct Beats {
    name: String,
    timeline: Timeline,
    print_appends: bool,
    interval: Duration,
    keep: Option<u64>,
}

/// The work on each owned session: one heartbeat event per interval into its journal, and,
/// with `--keep`, the trimming of its oldest records beside it.
async fn heartbeat(rig: Arc<Rig>, stop: CancellationToken, beats: Beats) {
    let Some(keep) = beats.keep else {
        return append_beats(&rig, &stop, &beats, None).await;
    };
    let (tip, tips) = tokio::sync::watch::channel(0u64);
    // Boxed: a trim's future is large, and only `--keep` needs it.
    let trim = Box::pin(keep_last(&rig, keep, tips, &stop, &beats));
    tokio::join!(append_beats(&rig, &stop, &beats, Some(tip)), trim);
}

async fn append_beats(
    rig: &Rig,
    stop: &CancellationToken,
    beats: &Beats,
    tip: Option<tokio::sync::watch::Sender<u64>>,
) {
    let Beats {
        name,
        timeline,
        print_appends,
        ..
    } = beats;
    let (session, epoch) = (rig.session_id(), rig.epoch());
    let mut beat = 0u64;
    let mut tick = tokio::time::interval(beats.interval);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        beat += 1;
        match rig
            .journal()
            .append(format!("heartbeat {name} epoch={epoch} beat={beat}"))
            .await
        {
            Ok(appended) => {
                if let Some(tip) = &tip {
                    tip.send_replace(appended.last_seq);
                }
                if *print_appends {
                    timeline.say(
                        name,
                        format_args!(
                            "appended session={session} epoch={epoch} seq={} beat={beat}",
                            appended.first_seq
                        ),
                    );
                }
            }
            Err(error) => timeline.say(
                name,
                format_args!(
                    "heartbeat session={session} epoch={epoch} beat={beat} failed: {}",
                    super::chain(&error)
                ),
            ),
        }
    }
}

/// Trims the journal back to its last `keep` records whenever it holds half a batch more: the
/// other half is room for the appends made while a trim is under way. A trim never fences the
/// appends beside it.
async fn keep_last(
    rig: &Rig,
    keep: u64,
    mut tips: tokio::sync::watch::Receiver<u64>,
    stop: &CancellationToken,
    beats: &Beats,
) {
    // Unknown until the first trim says; 1 at worst makes the first trim come early.
    let mut base = 1u64;
    loop {
        tokio::select! {
            changed = tips.changed() => if changed.is_err() { return },
            _ = stop.cancelled() => return,
        }
        let last = *tips.borrow_and_update();
        let Some(before) = trim_before(last, base, keep) else {
            continue;
        };
        match rig.journal().trim(before).await {
            Ok(trimmed) => base = trimmed.base,
            Err(error) => {
                beats.timeline.say(
                    &beats.name,
                    format_args!(
                        "trim session={} failed: {}",
                        rig.session_id(),
                        super::chain(&error)
                    ),
                );
                // The journal's own failure (fenced, lease lost) ends the session soon; a
                // transient one is tried again at the next heartbeat.
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any tip, base and `--keep`: a trim point or none, never an overflow; a trim keeps
        /// at least `keep` records and removes some.
        #[test]
        fn any_keep_finds_a_trim_point_without_overflow(
            last in proptest::prelude::any::<u64>(),
            base in proptest::prelude::any::<u64>(),
            keep in 1..=u64::MAX,
        ) {
            if let Some(before) = trim_before(last, base, keep) {
                proptest::prop_assert!(before > base);
                proptest::prop_assert!(u128::from(last) + 1 - u128::from(before) >= u128::from(keep.min(last)));
            }
        }
    }

    #[test]
    fn a_journal_is_trimmed_once_it_holds_half_a_batch_more_than_kept() {
        // keep 100: batch 50, trimmed past 125 records.
        assert_eq!(trim_before(125, 1, 100), None);
        assert_eq!(trim_before(126, 1, 100), Some(27));
        assert_eq!(trim_before(u64::MAX, 1, u64::MAX), None);
        assert_eq!(trim_before(u64::MAX, 1, 10), Some(u64::MAX - 10));
    }
}
