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
//! are pipelined, the gaps between one completion and the next; for `scale_hosted`, the time
//! until all sessions were owned, and on its probe lines each journal's wait (see [`hosted`]);
//! for `directory`, each line's own (see [`directory`]); for `placement`, the time until every
//! host's load was within its band (see [`placement`]).

mod directory;
mod hosted;
mod journal;
mod lease;
mod moves;
mod placement;
mod scale;
mod sidecar;
mod sidecar_memory;

use std::time::Duration;

use clap::{Args, ValueEnum};
use etcd_client::{Client, Txn, TxnOp};
use leasehold::{Connection, Journal, Lease, Namespace, Store, StoreOptions, Uuid};
use serde::Serialize;

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
    /// Sessions held by the `scale` scenario and hosted by `scale_hosted` (default 10000),
    /// owner entries in the `directory` scenario's directory (default 100000), and request ids
    /// of `sidecar_memory` (default 50000); 1 to 1000000.
    #[arg(long)]
    scale_sessions: Option<usize>,
}

/// The sessions `scale` holds and `scale_hosted` hosts unless `--scale-sessions`.
const SCALE_SESSIONS: usize = 10_000;

/// The owner entries of the `directory` scenario unless `--scale-sessions`.
const DIRECTORY_ENTRIES: usize = 100_000;

/// The most rounds a scenario runs.
const MAX_ROUNDS: usize = 1000;

/// The most sessions (or directory entries) `--scale-sessions` takes.
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
    HandoverMove,
    HandoverCrash,
    Scale,
    ScaleHosted,
    SidecarAppend,
    SidecarMemory,
    Directory,
    Placement,
}

impl Scenario {
    const EACH: [Scenario; 14] = [
        Scenario::Append,
        Scenario::GroupCommit,
        Scenario::Sessions,
        Scenario::Acquire,
        Scenario::Detect,
        Scenario::HandoverGraceful,
        Scenario::HandoverMove,
        Scenario::HandoverCrash,
        Scenario::Scale,
        Scenario::ScaleHosted,
        Scenario::SidecarAppend,
        Scenario::SidecarMemory,
        Scenario::Directory,
        Scenario::Placement,
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

/// `callers` tasks at once, each making `each` calls of `call(caller, i)` one after the other:
/// the calls/s of all of them together, and each call's time. A call's error, as `failed`
/// makes it, ends the run.
async fn timed_callers<C, F, E>(
    callers: usize,
    each: usize,
    call: C,
    failed: fn(E) -> Failure,
) -> Result<(f64, Vec<Duration>), Failure>
where
    C: Fn(usize, usize) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: Send + 'static,
{
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let call = call.clone();
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(each);
                for i in 0..each {
                    let one = tokio::time::Instant::now();
                    call(caller, i).await?;
                    latencies.push(one.elapsed());
                }
                Ok::<_, E>(latencies)
            }))
        })
        .collect();
    let mut all = Vec::with_capacity(callers.saturating_mul(each));
    for task in tasks {
        all.extend(task.await.map_err(Failure::runtime)?.map_err(failed)?);
    }
    Ok((all.len() as f64 / started.elapsed().as_secs_f64(), all))
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

    /// How many transactions the first endpoint's member has started: etcd's own count.
    async fn etcd_txns(&self) -> Result<f64, Failure> {
        leasehold::etcd_metric(
            &self.endpoints[0],
            "grpc_server_started_total",
            &["grpc_method=\"Txn\"", "grpc_type=\"unary\""],
        )
        .await
        .map_err(Failure::runtime)
        .map(|count| count.unwrap_or(0.0))
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
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let Some(last) = values.len().checked_sub(1) else {
        return f64::NAN;
    };
    values[((last as f64) * p).round() as usize]
}

pub(crate) async fn run(common: &Common, args: &BenchArgs) -> Result<(), Failure> {
    if !(1..=MAX_ROUNDS).contains(&args.rounds) {
        return Err(Failure::message(
            format!("--rounds must be from 1 to {MAX_ROUNDS}"),
            2,
        ));
    }
    if let Some(sessions) = args.scale_sessions
        && !(1..=MAX_SCALE_SESSIONS).contains(&sessions)
    {
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
    let scale_sessions = args.scale_sessions.unwrap_or(SCALE_SESSIONS);
    for scenario in scenarios {
        match scenario {
            Scenario::All => unreachable!("expanded above"),
            Scenario::Append => bench.append().await?,
            Scenario::GroupCommit => bench.group_commit().await?,
            Scenario::Sessions => bench.sessions().await?,
            Scenario::Acquire => bench.acquire().await?,
            Scenario::Detect => bench.detect().await?,
            Scenario::HandoverGraceful => bench.handover_graceful().await?,
            Scenario::HandoverMove => bench.handover_move().await?,
            Scenario::HandoverCrash => bench.handover_crash().await?,
            Scenario::Scale => bench.scale(scale_sessions).await?,
            Scenario::ScaleHosted => bench.scale_hosted(scale_sessions).await?,
            Scenario::SidecarAppend => bench.sidecar_append().await?,
            Scenario::SidecarMemory => {
                let ids = args.scale_sessions.unwrap_or(sidecar_memory::REQUEST_IDS);
                bench.sidecar_memory(ids).await?
            }
            Scenario::Directory => {
                let entries = args.scale_sessions.unwrap_or(DIRECTORY_ENTRIES);
                bench.directory(entries).await?
            }
            Scenario::Placement => bench.placement().await?,
        }
    }
    Ok(())
}
