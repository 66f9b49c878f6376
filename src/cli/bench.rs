//! `leasehold bench`: what leasehold costs, against what it replaces, side by side.
//!
//! Each scenario runs leasehold's call and its baseline in the same process, interleaved round
//! by round (this machine and its etcd are shared, so absolute times drift; ratios hold
//! better), and reports the median round of each and their ratio. With no `--endpoints` it
//! starts a throwaway etcd, as `demo` does; with `--endpoints` it writes in a namespace of its
//! own beside `--namespace` and deletes it however the run ends ([`super::scratch`]). Progress
//! goes to stderr; results to stdout, as an aligned table, or with `--json` as one object per
//! line:
//!
//! ```text
//! {"scenario":"append","metric":"throughput","unit":"appends/s","ours":…,"baseline":…,
//!  "baseline_name":"raw txn, same puts","ratio":…,"better":"higher","p50_ms":…,"p99_ms":…}
//! ```
//!
//! `ratio` is ours / baseline; `better` says which way is good. `p50_ms` and `p99_ms` are
//! leasehold's per-operation latencies over all rounds; for `scale`, where the acquisitions
//! are pipelined, the gaps between one completion and the next.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use etcd_client::{Client, LockOptions, Txn, TxnOp};
use futures_util::StreamExt as _;
use leasehold::fault::FaultProxy;
use leasehold::{Connection, Journal, Lease, Namespace, Store, StoreOptions, Uuid};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::node::Timeline;
use super::scratch::Reached;
use super::{Common, Failure};

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// The scenario to run, or `all`.
    #[arg(value_enum)]
    scenario: Scenario,
    /// One JSON object per result line instead of a table.
    #[arg(long)]
    json: bool,
    /// Interleaved rounds per scenario (the median is reported), 1 to 1000.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Sessions held by the `scale` scenario, 1 to 1000000.
    #[arg(long, default_value_t = 10_000)]
    scale_sessions: usize,
}

/// The most rounds a scenario runs.
const MAX_ROUNDS: usize = 1000;

/// The most sessions the `scale` scenario holds.
const MAX_SCALE_SESSIONS: usize = 1_000_000;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
enum Scenario {
    All,
    Append,
    GroupCommit,
    Sessions,
    Acquire,
    Detect,
    HandoverGraceful,
    HandoverCrash,
    Scale,
}

impl Scenario {
    const EACH: [Scenario; 8] = [
        Scenario::Append,
        Scenario::GroupCommit,
        Scenario::Sessions,
        Scenario::Acquire,
        Scenario::Detect,
        Scenario::HandoverGraceful,
        Scenario::HandoverCrash,
        Scenario::Scale,
    ];
}

#[derive(Clone, Copy, Serialize)]
#[serde(rename_all = "lowercase")]
enum Better {
    Higher,
    Lower,
}

/// One result line.
#[derive(Serialize)]
struct Measurement {
    scenario: &'static str,
    metric: &'static str,
    unit: &'static str,
    ours: f64,
    baseline: f64,
    baseline_name: &'static str,
    ratio: f64,
    better: Better,
    p50_ms: f64,
    p99_ms: f64,
}

/// What the scenarios share: where etcd is, a namespace of the run's own, a raw client.
struct Bench {
    endpoints: Vec<String>,
    namespace: Namespace,
    raw: Client,
    rounds: usize,
    json: bool,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn percentile_ms(latencies: &mut [Duration], p: f64) -> f64 {
    latencies.sort();
    let Some(last) = latencies.len().checked_sub(1) else {
        return f64::NAN;
    };
    let i = ((last as f64) * p).round() as usize;
    latencies[i].as_secs_f64() * 1e3
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Ours and the baseline, per round, in the scenario's unit; and ours' per-operation latencies.
#[derive(Default)]
struct Rounds {
    ours: Vec<f64>,
    baseline: Vec<f64>,
    latencies: Vec<Duration>,
}

impl Bench {
    fn progress(&self, what: impl std::fmt::Display) {
        eprintln!("bench: {what}");
    }

    async fn store(&self, node: &str, ttl: u64) -> Result<Store, Failure> {
        self.store_on(self.endpoints.clone(), node, ttl).await
    }

    async fn store_on(
        &self,
        endpoints: Vec<String>,
        node: &str,
        ttl: u64,
    ) -> Result<Store, Failure> {
        let margin = Duration::from_millis(if ttl <= 3 { 500 } else { 1000 });
        let options = StoreOptions::new(endpoints)
            .with_namespace(self.namespace.clone())
            .with_node(node)
            .with_ttl(Duration::from_secs(ttl), margin);
        Store::connect(options).await.map_err(Failure::runtime)
    }

    async fn journal(&self, store: &Store) -> Result<(Lease, Journal), Failure> {
        let session = Uuid::new_v4();
        let lease = store
            .acquire_lease(session)
            .await
            .map_err(Failure::runtime)?;
        let journal = store
            .open_journal(session, Some(&lease))
            .await
            .map_err(Failure::runtime)?;
        Ok((lease, journal))
    }

    /// A raw txn of the puts an append of one event makes: a record and the tip.
    async fn raw_append(&self, key: &str, i: usize) -> Result<(), Failure> {
        let txn = Txn::new().and_then([
            TxnOp::put(format!("{key}/r/{i:020}"), vec![7u8; 64], None),
            TxnOp::put(format!("{key}/tip"), vec![7u8; 41], None),
        ]);
        self.raw
            .clone()
            .txn(txn)
            .await
            .map(drop)
            .map_err(Failure::runtime)
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        scenario: &'static str,
        metric: &'static str,
        unit: &'static str,
        baseline_name: &'static str,
        better: Better,
        mut rounds: Rounds,
    ) {
        let (ours, baseline) = (median(&mut rounds.ours), median(&mut rounds.baseline));
        let measurement = Measurement {
            scenario,
            metric,
            unit,
            ours,
            baseline,
            baseline_name,
            ratio: ours / baseline,
            better,
            p50_ms: percentile_ms(&mut rounds.latencies, 0.5),
            p99_ms: percentile_ms(&mut rounds.latencies, 0.99),
        };
        if self.json {
            println!(
                "{}",
                serde_json::to_string(&measurement).expect("plain numbers and strings")
            );
        } else {
            println!(
                "{:<18} {:<22} {:>12.1} {:<14} vs {:>12.1}  ratio {:>7.3} ({} is better)  p50 {:>8.2} ms  p99 {:>8.2} ms   baseline: {}",
                measurement.scenario,
                measurement.metric,
                measurement.ours,
                measurement.unit,
                measurement.baseline,
                measurement.ratio,
                match better {
                    Better::Higher => "higher",
                    Better::Lower => "lower",
                },
                measurement.p50_ms,
                measurement.p99_ms,
                measurement.baseline_name
            );
        }
    }

    /// Sequential fenced appends vs a raw txn with the same puts, one of each in turn (so that
    /// the machine's drift weighs on both alike).
    async fn append(&self) -> Result<(), Failure> {
        const PER: usize = 200;
        let store = self.store("bench-append", 10).await?;
        let (_lease, journal) = self.journal(&store).await?;
        let key = format!("{}bench/append", self.namespace.prefix());
        let mut rounds = Rounds::default();
        for round in 0..self.rounds {
            self.progress(format_args!("append: round {}/{}", round + 1, self.rounds));
            let (mut ours, mut baseline) = (Duration::ZERO, Duration::ZERO);
            for i in 0..PER {
                let started = Instant::now();
                journal
                    .append(vec![7u8; 64])
                    .await
                    .map_err(Failure::runtime)?;
                let took = started.elapsed();
                ours += took;
                rounds.latencies.push(took);
                let started = Instant::now();
                self.raw_append(&key, round * PER + i).await?;
                baseline += started.elapsed();
            }
            rounds.ours.push(PER as f64 / ours.as_secs_f64());
            rounds.baseline.push(PER as f64 / baseline.as_secs_f64());
        }
        store.close().await;
        self.report(
            "append",
            "throughput",
            "appends/s",
            "raw txn, same puts",
            Better::Higher,
            rounds,
        );
        Ok(())
    }

    /// 64 concurrent appenders on one journal vs sequential fenced appends.
    async fn group_commit(&self) -> Result<(), Failure> {
        const WRITERS: usize = 64;
        const EACH: usize = 20;
        const SEQUENTIAL: usize = 200;
        let store = self.store("bench-group", 10).await?;
        let (_lease, journal) = self.journal(&store).await?;
        let journal = Arc::new(journal);
        let mut rounds = Rounds::default();
        for round in 0..self.rounds {
            self.progress(format_args!(
                "group_commit: round {}/{}",
                round + 1,
                self.rounds
            ));
            let (rate, latencies) =
                appenders(std::iter::repeat_n(journal.clone(), WRITERS), EACH).await?;
            rounds.ours.push(rate);
            rounds.latencies.extend(latencies);
            let (sequential, _) = appenders(std::iter::once(journal.clone()), SEQUENTIAL).await?;
            rounds.baseline.push(sequential);
        }
        store.close().await;
        self.report(
            "group_commit",
            "throughput",
            "appends/s",
            "sequential fenced appends",
            Better::Higher,
            rounds,
        );
        Ok(())
    }

    /// 256 sessions, one writer each, vs 256 concurrent raw txns on one client.
    async fn sessions(&self) -> Result<(), Failure> {
        const SESSIONS: usize = 256;
        const EACH: usize = 10;
        let store = self.store("bench-sessions", 10).await?;
        self.progress(format_args!("sessions: opening {SESSIONS} journals"));
        let mut journals = Vec::with_capacity(SESSIONS);
        let mut leases = Vec::with_capacity(SESSIONS);
        for _ in 0..SESSIONS {
            let (lease, journal) = self.journal(&store).await?;
            leases.push(lease);
            journals.push(Arc::new(journal));
        }
        let prefix = format!("{}bench/sessions", self.namespace.prefix());
        let mut rounds = Rounds::default();
        for round in 0..self.rounds {
            self.progress(format_args!(
                "sessions: round {}/{}",
                round + 1,
                self.rounds
            ));
            let (rate, latencies) = appenders(journals.iter().cloned(), EACH).await?;
            rounds.ours.push(rate);
            rounds.latencies.extend(latencies);
            let started = Instant::now();
            let writers: Vec<_> = (0..SESSIONS)
                .map(|s| {
                    let (raw, key) = (self.raw.clone(), format!("{prefix}/{s}"));
                    AbortOnDropHandle::new(tokio::spawn(async move {
                        for i in 0..EACH {
                            let txn = Txn::new().and_then([
                                TxnOp::put(
                                    format!("{key}/r/{:020}", round * EACH + i),
                                    vec![7u8; 64],
                                    None,
                                ),
                                TxnOp::put(format!("{key}/tip"), vec![7u8; 41], None),
                            ]);
                            raw.clone().txn(txn).await?;
                        }
                        Ok::<_, etcd_client::Error>(())
                    }))
                })
                .collect();
            for writer in writers {
                writer
                    .await
                    .map_err(Failure::runtime)?
                    .map_err(Failure::runtime)?;
            }
            rounds
                .baseline
                .push((SESSIONS * EACH) as f64 / started.elapsed().as_secs_f64());
        }
        drop(journals);
        drop(leases);
        store.close().await;
        self.report(
            "sessions",
            "throughput",
            "appends/s",
            "256 concurrent raw txns",
            Better::Higher,
            rounds,
        );
        Ok(())
    }

    /// acquire + release vs etcd's lock + unlock on an existing lease, one cycle of each in
    /// turn (which goes first alternates), each side's median cycle reported.
    async fn acquire(&self) -> Result<(), Failure> {
        const PER: usize = 100;
        let store = self.store("bench-acquire", 10).await?;
        let lock_lease = self
            .raw
            .clone()
            .lease_grant(10, None)
            .await
            .map_err(Failure::runtime)?
            .id();
        let mut keeper = self
            .raw
            .clone()
            .lease_keep_alive(lock_lease)
            .await
            .map_err(Failure::runtime)?;
        let (mut ours, mut baseline) = (Vec::new(), Vec::new());
        for round in 0..self.rounds {
            self.progress(format_args!("acquire: round {}/{}", round + 1, self.rounds));
            let _ = keeper.0.keep_alive().await;
            for i in 0..PER {
                let lock = || async {
                    let name = format!("{}bench/lock/{round}/{i}", self.namespace.prefix());
                    let started = Instant::now();
                    let locked = self
                        .raw
                        .clone()
                        .lock(name, Some(LockOptions::new().with_lease(lock_lease)))
                        .await
                        .map_err(Failure::runtime)?;
                    self.raw
                        .clone()
                        .unlock(locked.key())
                        .await
                        .map_err(Failure::runtime)?;
                    Ok::<_, Failure>(started.elapsed())
                };
                if i % 2 == 1 {
                    baseline.push(lock().await?);
                }
                let started = Instant::now();
                let lease = store
                    .acquire_lease(Uuid::new_v4())
                    .await
                    .map_err(Failure::runtime)?;
                lease.release().await.map_err(Failure::runtime)?;
                ours.push(started.elapsed());
                if i % 2 == 0 {
                    baseline.push(lock().await?);
                }
            }
        }
        let _ = self.raw.clone().lease_revoke(lock_lease).await;
        store.close().await;
        let cycles = |latencies: &mut Vec<Duration>| vec![percentile_ms(latencies, 0.5)];
        let rounds = Rounds {
            ours: cycles(&mut ours),
            baseline: cycles(&mut baseline),
            latencies: ours,
        };
        self.report(
            "acquire",
            "acquire + release",
            "ms",
            "etcd lock + unlock",
            Better::Lower,
            rounds,
        );
        Ok(())
    }

    /// An outside delete of the owner key → `lost()`, vs a keepalive-only detector (etcd's Go
    /// `concurrency.Session`: renew every TTL/3, lost on a reply with TTL ≤ 0) whose lease is
    /// revoked from outside. 100 samples of each (a p99 of fewer is just the maximum); the
    /// baseline's run side by side, each on a lease of its own, since each takes up to TTL/3.
    async fn detect(&self) -> Result<(), Failure> {
        const TTL: i64 = 6;
        let samples = self.rounds.saturating_mul(20).max(100);
        let store = self.store("bench-detect", TTL as u64).await?;
        let mut rounds = Rounds::default();
        self.progress(format_args!(
            "detect: {samples} keepalive-only detectors, side by side"
        ));
        let detectors =
            futures_util::future::try_join_all((0..samples).map(|_| self.keepalive_detector(TTL)));
        let ours = async {
            let mut latencies = Vec::with_capacity(samples);
            for sample in 0..samples {
                if sample % 20 == 0 {
                    self.progress(format_args!("detect: sample {}/{samples}", sample + 1));
                }
                let lease = store
                    .acquire_lease(Uuid::new_v4())
                    .await
                    .map_err(Failure::runtime)?;
                let lost = lease.lost();
                let deleted = Instant::now();
                self.raw
                    .clone()
                    .delete(lease.owner_key(), None)
                    .await
                    .map_err(Failure::runtime)?;
                lost.await;
                latencies.push(deleted.elapsed());
            }
            Ok::<_, Failure>(latencies)
        };
        let (ours, baseline) = tokio::join!(ours, detectors);
        let ours = ours?;
        rounds.ours = ours.iter().copied().map(ms).collect();
        rounds.latencies = ours;
        rounds.baseline = baseline?.into_iter().map(ms).collect();
        store.close().await;
        // The tail is what bounds a stale writer's window: report p99s.
        let (mut ours, mut baseline) = (rounds.ours.clone(), rounds.baseline.clone());
        rounds.ours = vec![percentile(&mut ours, 0.99)];
        rounds.baseline = vec![percentile(&mut baseline, 0.99)];
        self.report(
            "detect",
            "loss detection p99",
            "ms",
            "keepalive-only detector, TTL 6 s",
            Better::Lower,
            rounds,
        );
        Ok(())
    }

    /// A keepalive-only detector: how long after its lease is revoked from outside it knows.
    fn keepalive_detector(&self, ttl: i64) -> impl Future<Output = Result<Duration, Failure>> {
        let raw = self.raw.clone();
        async move {
            let id = raw
                .clone()
                .lease_grant(ttl, None)
                .await
                .map_err(Failure::runtime)?
                .id();
            let (mut keeper, mut replies) = raw
                .clone()
                .lease_keep_alive(id)
                .await
                .map_err(Failure::runtime)?;
            let every = Duration::from_secs(ttl as u64) / 3;
            let detector = AbortOnDropHandle::new(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    if keeper.keep_alive().await.is_err() {
                        return Instant::now();
                    }
                    match replies.message().await {
                        Ok(Some(reply)) if reply.ttl() > 0 => {}
                        _ => return Instant::now(),
                    }
                }
            }));
            // Revoked at a random point of the renewal interval.
            let phase = (Uuid::new_v4().as_u128() % 1000) as u32;
            tokio::time::sleep(every * phase / 1000).await;
            let revoked = Instant::now();
            raw.clone()
                .lease_revoke(id)
                .await
                .map_err(Failure::runtime)?;
            let knew = detector.await.map_err(Failure::runtime)?;
            Ok(knew.saturating_duration_since(revoked))
        }
    }

    /// A graceful release → the standby's fence committed, vs one raw txn. Both start after
    /// the same pause (the standby needs one to be waiting): a request after 100 ms of quiet
    /// takes about twice what one right after another does, on a shared machine, so a
    /// baseline sent right after the handover would measure the pause, not leasehold.
    async fn handover_graceful(&self) -> Result<(), Failure> {
        const PAUSE: Duration = Duration::from_millis(100);
        let a = self.store("bench-handover-a", 10).await?;
        let b = Arc::new(self.store("bench-handover-b", 10).await?);
        let key = format!("{}bench/handover", self.namespace.prefix());
        let mut rounds = Rounds::default();
        let samples = self.rounds.max(10);
        for round in 0..samples {
            self.progress(format_args!(
                "handover_graceful: sample {}/{samples}",
                round + 1
            ));
            let session = Uuid::new_v4();
            let lease = a.acquire_lease(session).await.map_err(Failure::runtime)?;
            let standby = standby(&b, session);
            // The standby is waiting once its watch has the key (it acquires when it goes).
            tokio::time::sleep(PAUSE).await;
            let released = Instant::now();
            lease.release().await.map_err(Failure::runtime)?;
            let (_lease, _journal) = handed_over(standby).await?;
            let took = released.elapsed();
            rounds.latencies.push(took);
            rounds.ours.push(ms(took));
            tokio::time::sleep(PAUSE).await;
            let started = Instant::now();
            self.raw_append(&key, round).await?;
            rounds.baseline.push(ms(started.elapsed()));
        }
        a.close().await;
        b.close().await;
        self.report(
            "handover_graceful",
            "release to fence",
            "ms",
            "one raw txn, after the same pause",
            Better::Lower,
            rounds,
        );
        Ok(())
    }

    /// The owner's process gone without a release (its connection silenced for good) → the
    /// standby's fence committed, vs the TTL.
    async fn handover_crash(&self) -> Result<(), Failure> {
        const TTL: u64 = 3;
        let b = Arc::new(self.store("bench-crash-b", 10).await?);
        let mut rounds = Rounds::default();
        for round in 0..self.rounds {
            self.progress(format_args!(
                "handover_crash: round {}/{}",
                round + 1,
                self.rounds
            ));
            let proxy = FaultProxy::start(&self.endpoints[0])
                .await
                .map_err(Failure::runtime)?;
            let a = self
                .store_on(vec![proxy.endpoint()], "bench-crash-a", TTL)
                .await?;
            let session = Uuid::new_v4();
            let lease = a.acquire_lease(session).await.map_err(Failure::runtime)?;
            let standby = standby(&b, session);
            // Crash at a random point of the owner's renewal interval.
            let phase = (Uuid::new_v4().as_u128() % 1000) as u32;
            tokio::time::sleep(Duration::from_secs(TTL) / 3 * phase / 1000).await;
            proxy.blackhole();
            let crashed = Instant::now();
            let (_lease, _journal) = handed_over(standby).await?;
            let took = crashed.elapsed();
            rounds.latencies.push(took);
            rounds.ours.push(ms(took));
            rounds.baseline.push(ms(Duration::from_secs(TTL)));
            drop(lease);
            drop(a);
        }
        b.close().await;
        self.report(
            "handover_crash",
            "crash to fence",
            "ms",
            "the owner's TTL (3 s)",
            Better::Lower,
            rounds,
        );
        Ok(())
    }

    /// Many sessions on one node: keepalive requests etcd receives per second vs one lease
    /// per session renewed every TTL/3; and resident memory per held session.
    async fn scale(&self, sessions: usize) -> Result<(), Failure> {
        const TTL: u64 = 6;
        let endpoint = self.endpoints[0].clone();
        let keepalives = || async {
            leasehold::etcd_metric(
                &endpoint,
                "grpc_server_msg_received_total",
                &["grpc_method=\"LeaseKeepAlive\""],
            )
            .await
            .map_err(Failure::runtime)
            .map(|count| count.unwrap_or(0.0))
        };
        let store = self.store("bench-scale", TTL).await?;
        let before = resident_bytes();
        self.progress(format_args!("scale: acquiring {sessions} sessions"));
        let started = Instant::now();
        let mut acquired = futures_util::stream::iter(0..sessions)
            .map(|_| store.acquire_lease(Uuid::new_v4()))
            .buffer_unordered(256);
        let mut leases = Vec::with_capacity(sessions);
        let mut latencies = Vec::with_capacity(sessions);
        let mut last = Instant::now();
        while let Some(lease) = acquired.next().await {
            leases.push(lease.map_err(Failure::runtime)?);
            latencies.push(last.elapsed());
            last = Instant::now();
            if leases.len() % 1000 == 0 {
                self.progress(format_args!("scale: {} held", leases.len()));
            }
        }
        drop(acquired);
        let acquiring = started.elapsed();
        let after = resident_bytes();
        let per_session = after.saturating_sub(before) as f64 / sessions as f64 / 1024.0;
        let window = Duration::from_secs(3 * TTL);
        self.progress(format_args!(
            "scale: {sessions} acquired in {acquiring:?}; counting keepalives for {window:?}"
        ));
        let first = keepalives().await?;
        tokio::time::sleep(window).await;
        let received = keepalives().await? - first;
        let held = leases.iter().filter(|lease| lease.is_valid()).count();
        if held != sessions {
            return Err(Failure::message(
                format!("scale: only {held} of {sessions} sessions still held"),
                1,
            ));
        }
        let ours = received / window.as_secs_f64();
        let baseline = sessions as f64 * 3.0 / TTL as f64;
        drop(leases);
        store.close().await;
        self.report(
            "scale",
            "keepalive requests/s",
            "req/s",
            "one lease per session, renewed every TTL/3",
            Better::Lower,
            Rounds {
                ours: vec![ours],
                baseline: vec![baseline],
                latencies: latencies.clone(),
            },
        );
        self.report(
            "scale",
            "resident memory per held session",
            "KiB",
            "2 KiB budget",
            Better::Lower,
            Rounds {
                ours: vec![per_session],
                baseline: vec![2.0],
                latencies,
            },
        );
        Ok(())
    }
}

/// One writer task per journal in `writers` (the same journal may come more than once), each
/// making `each` appends one after the other; the appends/s of all of them together, and
/// their latencies.
async fn appenders(
    writers: impl Iterator<Item = Arc<Journal>>,
    each: usize,
) -> Result<(f64, Vec<Duration>), Failure> {
    let started = Instant::now();
    let tasks: Vec<_> = writers
        .map(|journal| {
            AbortOnDropHandle::new(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(each);
                for _ in 0..each {
                    let call = Instant::now();
                    journal.append(vec![7u8; 64]).await?;
                    latencies.push(call.elapsed());
                }
                Ok::<_, leasehold::JournalWriteError>(latencies)
            }))
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(
            task.await
                .map_err(Failure::runtime)?
                .map_err(Failure::runtime)?,
        );
    }
    Ok((all.len() as f64 / started.elapsed().as_secs_f64(), all))
}

type Standby =
    AbortOnDropHandle<Result<(Lease, Journal), Box<dyn std::error::Error + Send + Sync>>>;

/// A standby on `session` in `store`: acquires it once it is free and opens its journal.
fn standby(store: &Arc<Store>, session: Uuid) -> Standby {
    let store = store.clone();
    AbortOnDropHandle::new(tokio::spawn(async move {
        let lease = store
            .acquire_lease_wait(session, Duration::from_secs(30))
            .await?;
        let journal = store.open_journal(session, Some(&lease)).await?;
        Ok((lease, journal))
    }))
}

/// Waits until the standby's fence has committed.
async fn handed_over(standby: Standby) -> Result<(Lease, Journal), Failure> {
    standby
        .await
        .map_err(Failure::runtime)?
        .map_err(|error| Failure::message(super::chain(&*error), 1))
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let Some(last) = values.len().checked_sub(1) else {
        return f64::NAN;
    };
    values[((last as f64) * p).round() as usize]
}

/// This process's resident set, from /proc (0 where there is none).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

pub(crate) async fn run(common: &Common, args: &BenchArgs) -> Result<(), Failure> {
    if !(1..=MAX_ROUNDS).contains(&args.rounds) {
        return Err(Failure::message(
            format!("--rounds must be from 1 to {MAX_ROUNDS}"),
            2,
        ));
    }
    if !(1..=MAX_SCALE_SESSIONS).contains(&args.scale_sessions) {
        return Err(Failure::message(
            format!("--scale-sessions must be from 1 to {MAX_SCALE_SESSIONS}"),
            2,
        ));
    }
    if common.is_secured() {
        // The baselines are raw etcd-client calls on a plain connection.
        return Err(Failure::message(
            "bench measures a plain etcd: TLS and --user are not supported",
            2,
        ));
    }
    // A namespace of its own, beside --namespace; removed however the run ends, also on
    // SIGINT or SIGTERM (exit code 130).
    let namespace = super::scratch::namespace(common, "bench")?;
    let timeline = Timeline::on_stderr();
    let reached = Reached::default();
    let bench = bench(common, args, namespace.clone(), &timeline, &reached);
    super::scratch::run_then_remove(common, &namespace, &timeline, "bench", &reached, bench).await
}

/// The run: a throwaway etcd unless `--endpoints`, then each scenario in turn.
async fn bench(
    common: &Common,
    args: &BenchArgs,
    namespace: Namespace,
    timeline: &Timeline,
    reached: &Reached,
) -> Result<(), Failure> {
    let (endpoints, _etcd) = match &common.endpoints {
        Some(endpoints) => (endpoints.clone(), None),
        None => {
            let etcd = super::demo::start_etcd(timeline).await?;
            (vec![etcd.endpoint.clone()], Some(etcd))
        }
    };
    // etcd answers (within --connect-timeout) before the run writes anything.
    let options = common.connect_options(endpoints.clone())?;
    drop(
        Connection::connect(options)
            .await
            .map_err(Failure::connect)?,
    );
    reached.set();
    let raw = Client::connect(&endpoints, None)
        .await
        .map_err(Failure::usage)?;
    let bench = Bench {
        endpoints,
        namespace,
        raw,
        rounds: args.rounds,
        json: args.json,
    };
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => Scenario::EACH.to_vec(),
        one => vec![one],
    };
    for scenario in scenarios {
        match scenario {
            Scenario::All => unreachable!("expanded above"),
            Scenario::Append => bench.append().await?,
            Scenario::GroupCommit => bench.group_commit().await?,
            Scenario::Sessions => bench.sessions().await?,
            Scenario::Acquire => bench.acquire().await?,
            Scenario::Detect => bench.detect().await?,
            Scenario::HandoverGraceful => bench.handover_graceful().await?,
            Scenario::HandoverCrash => bench.handover_crash().await?,
            Scenario::Scale => bench.scale(args.scale_sessions).await?,
        }
    }
    Ok(())
}
