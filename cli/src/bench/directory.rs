//! The `directory` scenario: an [`OwnerDirectory`] over many owner keys, against what a router
//! builds by hand from the same keys.
//!
//! The owner keys are written straight into namespaces of the scenario's own under the
//! bench's (`{bench namespace}/directory` and `…/directory-by-hand`, which nothing else uses
//! meanwhile and which the run's removal covers), by raw transactions of up to 128 puts: no
//! lease, values in the format [`OwnerValue::decode`] reads, spread over [`STORES`] stores,
//! each with a node name and an advertised address. Three lines, in this order:
//!
//! - **lookups**: `owner_of` of existing sessions in a shuffled order, on one thread, against
//!   the same lookups in a std `HashMap<Uuid, (u64, Arc<str>)>` (SipHash) behind a std
//!   `RwLock`, each lookup taking the read lock and cloning what it finds. Each round is
//!   [`SLICES`] slices of [`SLICE`] lookups of each side in turn (which goes first
//!   alternates), so that a neighbour's burst of CPU lands on both alike. Latencies: each
//!   slice's mean time per lookup.
//! - **propagation**: sequential acquisitions by a [`Store`] in the directory's namespace
//!   (beside its entries; the store has followed the namespace since before they were
//!   written, as a running node would), each timed from just before it is sent until the
//!   directory's [`changes`](OwnerDirectory::changes) deliver its [`Change::Acquired`], and
//!   until a raw etcd watch of the same prefix, on the bench's own client in the same process,
//!   delivers the put of its owner key; each round's p50 of each. Each is released, and both
//!   have heard of it, before the next is sent. Latencies: the directory's, over all rounds.
//! - **memory per entry**: the growth of the process's resident set while a directory,
//!   started on the empty namespace, takes in the keys as they are written, per entry;
//!   against the same growth while a raw etcd watch fills a std
//!   `HashMap<Uuid, (i64, String, String)>` (epoch, node, address: owned strings, as a
//!   hand-rolled router keeps them) with the same keys written into the other namespace.
//!   Filled by watch, neither counts a snapshot's read buffers, which the allocator keeps
//!   after they are freed. The directory goes first and is kept meanwhile: it pays for the
//!   writer's buffers and the store's watch, and neither reuses memory the other freed. One
//!   measurement of each (freed memory the allocator keeps would be reused by a second).
//!   Latencies: how long the directory took to hold every key, writing included.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use etcd_client::{EventType, Txn, TxnOp, WatchOptions};
use futures_util::StreamExt as _;
use leasehold::directory::Change;
use leasehold::{
    ConnectOptions, Connection, Namespace, OwnerDirectory, OwnerValue, Store, StoreOptions, Uuid,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::scale::resident_bytes;
use super::{Bench, Better, Rounds, percentile_ms};
use crate::Failure;

/// The stores (nodes) the written owner keys are spread over.
const STORES: usize = 16;

/// Puts per transaction: etcd's default `--max-txn-ops`.
const PUTS_PER_TXN: usize = 128;

/// Transactions in flight while the keys are written.
const TXNS_IN_FLIGHT: usize = 8;

/// Lookups per slice of one side; [`SLICES`] of each side per round.
const SLICE: usize = 50_000;

/// Slices of each side per round.
const SLICES: usize = 40;

/// Acquisitions per round of the propagation line.
const ACQUISITIONS: usize = 200;

/// How long one acquisition's events may take to arrive before the scenario fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// How long writing the keys and taking them in may take before the scenario fails.
const FILL_PATIENCE: Duration = Duration::from_secs(300);

/// One owner key's event as a watcher saw it: its session, whether it was a put, and when.
type Seen = (Uuid, bool, Instant);

impl Bench {
    /// `entries` owner keys: memory per entry, lookups per second and propagation, each
    /// against what a router would build by hand (see the [module docs](self)).
    pub(super) async fn directory(&self, entries: usize) -> Result<(), Failure> {
        let under = |name: &str| {
            Namespace::new(format!("{}/{name}", self.namespace.as_str())).map_err(Failure::usage)
        };
        let (namespace, by_hand_namespace) = (under("directory")?, under("directory-by-hand")?);
        let stores: Vec<(Uuid, String, String)> = (0..STORES)
            .map(|i| {
                (
                    Uuid::new_v4(),
                    format!("bench-directory-{i:02}"),
                    format!("http://10.0.0.{}:31501", i + 1),
                )
            })
            .collect();
        let ids: Vec<Uuid> = (0..entries).map(|_| Uuid::new_v4()).collect();

        // The store that acquires in the propagation line follows the namespace from the start,
        // as a node that was running would: its snapshot is read before the keys are written.
        let store = Store::connect(
            StoreOptions::new(self.endpoints.clone())
                .with_namespace(namespace.clone())
                .with_node("bench-directory")
                .with_ttl(Duration::from_secs(10), Duration::from_secs(1)),
        )
        .await
        .map_err(Failure::runtime)?;

        // --- memory: the directory first (it pays for the writer's buffers, and for the
        // store's watch of the same keys), kept meanwhile
        let connection = Connection::connect(ConnectOptions::new(self.endpoints.clone()))
            .await
            .map_err(Failure::connect)?;
        let directory = OwnerDirectory::start(connection, namespace.clone())
            .await
            .map_err(Failure::runtime)?;
        let before = resident_bytes();
        let started = Instant::now();
        self.write_owner_keys(&namespace, &ids, &stores).await?;
        while directory.len() < entries {
            if started.elapsed() > FILL_PATIENCE {
                return Err(Failure::message(
                    format!(
                        "directory: only {} of {entries} entries after {:?}",
                        directory.len(),
                        FILL_PATIENCE
                    ),
                    1,
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let directory_took = started.elapsed();
        let directory_bytes = resident_bytes().saturating_sub(before);
        let by_hand = self.by_hand(&by_hand_namespace, &ids, &stores).await?;
        let per_entry = |bytes: u64| bytes as f64 / entries as f64;
        self.progress(format_args!(
            "directory: {:.1} B per entry, filled in {directory_took:?}; by hand {:.1} B, in {:?}",
            per_entry(directory_bytes),
            per_entry(by_hand.bytes),
            by_hand.took
        ));
        let memory = Rounds {
            ours: vec![per_entry(directory_bytes)],
            baseline: vec![per_entry(by_hand.bytes)],
            latencies: vec![directory_took],
        };

        // --- lookups
        let lookups = self.lookups(&directory, ids).await?;

        // --- propagation
        let propagation = self.propagation(&store, &directory).await?;
        store.close().await;
        directory.close();
        drop(directory);
        for namespace in [namespace, by_hand_namespace] {
            self.raw
                .clone()
                .delete(
                    namespace.prefix(),
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                )
                .await
                .map_err(Failure::runtime)?;
        }

        self.report(
            "directory",
            "owner_of lookups",
            "lookups/s",
            "std HashMap behind a std RwLock",
            Better::Higher,
            lookups,
        );
        self.report(
            "directory",
            "acquisition to update p50",
            "ms",
            "a raw etcd watch of the owner keys",
            Better::Lower,
            propagation,
        );
        self.report(
            "directory",
            "resident memory per entry",
            "B",
            "HashMap of owned strings, by a raw watch",
            Better::Lower,
            memory,
        );
        Ok(())
    }

    /// Writes an owner key for each of `ids` under `namespace` with raw transactions, their
    /// values naming `stores` in turn.
    async fn write_owner_keys(
        &self,
        namespace: &Namespace,
        ids: &[Uuid],
        stores: &[(Uuid, String, String)],
    ) -> Result<(), Failure> {
        let entries = ids.len();
        self.progress(format_args!(
            "directory: writing {entries} owner keys under {namespace}"
        ));
        let txn = |chunk: usize, sessions: &[Uuid]| -> Result<Txn, Failure> {
            let puts = sessions
                .iter()
                .enumerate()
                .map(|(j, session)| {
                    let (store, node, advertise) = &stores[(chunk * PUTS_PER_TXN + j) % STORES];
                    let text = format!(
                        "leasehold-owner/2 {store} {} {advertise} - {node}",
                        Uuid::now_v7()
                    );
                    // Written as leasehold writes them: what it decodes, it encodes the same.
                    let value = OwnerValue::decode(text.as_bytes())
                        .ok_or_else(|| {
                            Failure::message("directory: an owner value did not decode", 1)
                        })?
                        .encode();
                    Ok(TxnOp::put(namespace.owner_key(*session), value, None))
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            Ok(Txn::new().and_then(puts))
        };
        let started = Instant::now();
        // Each transaction is built when it is sent: the writer holds a few at a time.
        let mut written = futures_util::stream::iter(ids.chunks(PUTS_PER_TXN).enumerate())
            .map(|(chunk, sessions)| {
                let (txn, mut raw) = (txn(chunk, sessions), self.raw.clone());
                async move { raw.txn(txn?).await.map_err(Failure::runtime) }
            })
            .buffer_unordered(TXNS_IN_FLIGHT);
        let mut done = 0;
        while let Some(result) = written.next().await {
            result?;
            done += 1;
            if done % 200 == 0 {
                self.progress(format_args!(
                    "directory: {} keys written",
                    (done * PUTS_PER_TXN).min(entries)
                ));
            }
        }
        self.progress(format_args!(
            "directory: {entries} keys written in {:?}",
            started.elapsed()
        ));
        Ok(())
    }

    /// What a router builds by hand: a raw watch of `namespace`'s owner keys feeding a std
    /// `HashMap` of owned strings, while the same keys as the directory's are written there.
    /// Returns the process's resident growth meanwhile, and how long it took.
    async fn by_hand(
        &self,
        namespace: &Namespace,
        ids: &[Uuid],
        stores: &[(Uuid, String, String)],
    ) -> Result<ByHand, Failure> {
        let entries = ids.len();
        let prefix = namespace.owners_prefix();
        let mut stream = self.raw_watch(&prefix).await?;
        let before = resident_bytes();
        let started = Instant::now();
        let filled = AbortOnDropHandle::new(tokio::spawn(async move {
            let mut map: HashMap<Uuid, (i64, String, String)> = HashMap::new();
            while map.len() < entries {
                let Ok(Some(response)) = stream.message().await else {
                    return map;
                };
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let Some(session) = session_under(&prefix, kv.key()) else {
                        continue;
                    };
                    match event.event_type() {
                        EventType::Put => {
                            if let Some(value) = OwnerValue::decode(kv.value()) {
                                let advertise = value.advertise.unwrap_or_default();
                                map.insert(session, (kv.create_revision(), value.node, advertise));
                            }
                        }
                        EventType::Delete => {
                            map.remove(&session);
                        }
                    }
                }
            }
            map
        }));
        self.write_owner_keys(namespace, ids, stores).await?;
        let map = tokio::time::timeout(FILL_PATIENCE, filled)
            .await
            .map_err(|_| {
                Failure::message(
                    format!(
                        "directory: the hand-rolled map not filled within {:?}",
                        FILL_PATIENCE
                    ),
                    1,
                )
            })?
            .map_err(Failure::runtime)?;
        let (took, bytes) = (started.elapsed(), resident_bytes().saturating_sub(before));
        if map.len() != entries {
            return Err(Failure::message(
                format!(
                    "directory: the raw watch ended with {} of {entries} keys",
                    map.len()
                ),
                1,
            ));
        }
        drop(map);
        Ok(ByHand { took, bytes })
    }

    /// A raw etcd watch of `prefix` on the bench's own client, once etcd has created it.
    async fn raw_watch(&self, prefix: &str) -> Result<etcd_client::WatchStream, Failure> {
        let mut stream = self
            .raw
            .clone()
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await
            .map_err(Failure::runtime)?;
        match stream.message().await.map_err(Failure::runtime)? {
            Some(response) if response.created() => Ok(stream),
            other => Err(Failure::message(
                format!("directory: the raw watch did not open: {other:?}"),
                1,
            )),
        }
    }

    /// `owner_of` over every entry in a shuffled order, against a std `HashMap` of the same
    /// sessions behind a std `RwLock`: slices of each in turn, on this thread.
    async fn lookups(
        &self,
        directory: &OwnerDirectory,
        mut ids: Vec<Uuid>,
    ) -> Result<Rounds, Failure> {
        // The order is shuffled once, here (a xorshift, Fisher-Yates): the timed loops only
        // step through it.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for i in (1..ids.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ids.swap(i, (state % (i as u64 + 1)) as usize);
        }
        // The baseline's values: the epoch and the node name, shared per node as the
        // directory shares its nodes.
        let mut nodes: HashMap<Uuid, Arc<str>> = HashMap::new();
        let mut plain: HashMap<Uuid, (u64, Arc<str>)> = HashMap::with_capacity(ids.len());
        for session in &ids {
            let owner = directory
                .owner_of(*session)
                .ok_or_else(|| Failure::message(format!("directory: {session} has no owner"), 1))?;
            let name = nodes
                .entry(owner.node.store)
                .or_insert_with(|| Arc::from(owner.node.name.as_str()))
                .clone();
            plain.insert(*session, (owner.epoch.get(), name));
        }
        let plain = RwLock::new(plain);
        let mut rounds = Rounds::default();
        for round in 0..self.rounds {
            self.progress(format_args!(
                "directory: lookups, round {}/{}",
                round + 1,
                self.rounds
            ));
            // Slices of each side in turn, which goes first alternating, on one thread: a
            // neighbour's burst of CPU lands on both alike.
            let slices = tokio::task::block_in_place(|| {
                let mut slices = Vec::with_capacity(SLICES);
                let mut at = 0;
                for slice in 0..SLICES {
                    let ours = || {
                        timed(&ids, at, |session| {
                            black_box(directory.owner_of(session));
                        })
                    };
                    let baseline = || {
                        timed(&ids, at, |session| {
                            let map = plain
                                .read()
                                .unwrap_or_else(|poisoned| poisoned.into_inner());
                            black_box(map.get(&session).cloned());
                        })
                    };
                    let (ours, baseline) = if (round + slice) % 2 == 0 {
                        let ours = ours();
                        (ours, baseline())
                    } else {
                        let baseline = baseline();
                        (ours(), baseline)
                    };
                    slices.push((ours, baseline));
                    at = (at + SLICE) % ids.len();
                }
                slices
            });
            let (ours, baseline): (Duration, Duration) = slices.iter().fold(
                (Duration::ZERO, Duration::ZERO),
                |(a, b), (ours, baseline)| (a + *ours, b + *baseline),
            );
            let lookups = (SLICE * SLICES) as f64;
            rounds.ours.push(lookups / ours.as_secs_f64());
            rounds.baseline.push(lookups / baseline.as_secs_f64());
            rounds
                .latencies
                .extend(slices.iter().map(|(ours, _)| *ours / SLICE as u32));
        }
        Ok(rounds)
    }

    /// Sequential acquisitions by `store`, each timed until `directory` and a raw watch of the
    /// same owner keys have delivered it.
    async fn propagation(
        &self,
        store: &Store,
        directory: &OwnerDirectory,
    ) -> Result<Rounds, Failure> {
        let namespace = store.namespace();
        // The directory's changes, as they are delivered.
        let (ours_sender, mut ours_seen) = mpsc::unbounded_channel::<Seen>();
        let mut changes = directory.changes();
        let _ours = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Some(change) = changes.next().await {
                let now = Instant::now();
                let seen = match change {
                    Change::Acquired { owner } => (owner.session, true, now),
                    Change::Released { owner, .. } => (owner.session, false, now),
                    _ => continue,
                };
                if ours_sender.send(seen).is_err() {
                    return;
                }
            }
        }));

        // A raw watch of the same prefix, on the bench's own client.
        let prefix = namespace.owners_prefix();
        let mut stream = self.raw_watch(&prefix).await?;
        let (raw_sender, mut raw_seen) = mpsc::unbounded_channel::<Seen>();
        let _raw = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Ok(Some(response)) = stream.message().await {
                let now = Instant::now();
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let Some(session) = session_under(&prefix, kv.key()) else {
                        continue;
                    };
                    let put = matches!(event.event_type(), EventType::Put);
                    if raw_sender.send((session, put, now)).is_err() {
                        return;
                    }
                }
            }
        }));

        let mut rounds = Rounds::default();
        for round in 0..self.rounds {
            self.progress(format_args!(
                "directory: propagation, round {}/{}",
                round + 1,
                self.rounds
            ));
            let (mut ours, mut baseline) = (
                Vec::with_capacity(ACQUISITIONS),
                Vec::with_capacity(ACQUISITIONS),
            );
            for _ in 0..ACQUISITIONS {
                let session = Uuid::new_v4();
                let sent = Instant::now();
                let lease = store
                    .acquire_lease(session)
                    .await
                    .map_err(Failure::runtime)?;
                let by_directory = seen(&mut ours_seen, session, true, "the directory").await?;
                let by_watch = seen(&mut raw_seen, session, true, "the raw watch").await?;
                ours.push(by_directory.saturating_duration_since(sent));
                baseline.push(by_watch.saturating_duration_since(sent));
                // Both have heard of the release before the next acquisition is sent.
                lease.release().await.map_err(Failure::runtime)?;
                seen(&mut ours_seen, session, false, "the directory").await?;
                seen(&mut raw_seen, session, false, "the raw watch").await?;
            }
            rounds.latencies.extend_from_slice(&ours);
            rounds.ours.push(percentile_ms(&mut ours, 0.5));
            rounds.baseline.push(percentile_ms(&mut baseline, 0.5));
            self.progress(format_args!(
                "directory: p50 {:.3} ms, p99 {:.3} ms; the raw watch's {:.3} ms, {:.3} ms",
                rounds.ours[round],
                percentile_ms(&mut ours, 0.99),
                rounds.baseline[round],
                percentile_ms(&mut baseline, 0.99)
            ));
        }
        Ok(rounds)
    }
}

/// The hand-rolled map's cost: the resident growth while it was filled, and how long that took.
struct ByHand {
    took: Duration,
    bytes: u64,
}

/// The session an owner key names under `prefix`; `None` for keys that are not owner keys.
fn session_under(prefix: &str, key: &[u8]) -> Option<Uuid> {
    std::str::from_utf8(key)
        .ok()?
        .strip_prefix(prefix)?
        .parse()
        .ok()
}

/// How long `lookup` takes over [`SLICE`] sessions of `ids`, in their order from `at`, again
/// from the start at their end.
fn timed(ids: &[Uuid], at: usize, mut lookup: impl FnMut(Uuid)) -> Duration {
    let started = std::time::Instant::now();
    let mut i = at;
    for _ in 0..SLICE {
        lookup(black_box(ids[i]));
        i += 1;
        if i == ids.len() {
            i = 0;
        }
    }
    started.elapsed()
}

/// When `what` delivered `session`'s put (or delete), skipping what it delivered before.
async fn seen(
    events: &mut mpsc::UnboundedReceiver<Seen>,
    session: Uuid,
    put: bool,
    what: &str,
) -> Result<Instant, Failure> {
    let wait = async {
        while let Some((seen, was_put, at)) = events.recv().await {
            if seen == session && was_put == put {
                return Some(at);
            }
        }
        None
    };
    match tokio::time::timeout(PATIENCE, wait).await {
        Ok(Some(at)) => Ok(at),
        Ok(None) => Err(Failure::message(
            format!("directory: {what} ended before delivering {session}"),
            1,
        )),
        Err(_) => Err(Failure::message(
            format!("directory: {what} did not deliver {session} within {PATIENCE:?}"),
            1,
        )),
    }
}
