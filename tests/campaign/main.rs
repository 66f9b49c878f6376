//! A fault campaign: many faults, at random and mixed, against nodes that own and append to
//! sessions continuously, then a checker that reads what is finally in etcd (the
//! invariants 1–8 of docs/protocol.md).
//!
//! - `short` (the default): part of the normal suite; every kind of fault at least once. One
//!   of its three nodes is a sidecar (`leasehold serve`'s service) with one gRPC client per
//!   session; its outages cut the sidecar from etcd, its clients from it, or both, in turn,
//!   or kill it (as SIGKILL would) and start it again, its clients retrying every call with
//!   its request id; the checker holds every acknowledged request id in the journal exactly
//!   once, and every request id at most once.
//! - `long`: `LEASEHOLD_CAMPAIGN=long cargo test --all-features --test campaign -- campaign
//!   --nocapture`, until 1,000 handovers.
//!
//! The seed is printed first; `LEASEHOLD_CAMPAIGN_SEED=<seed>` replays a run's schedule of
//! faults (the timing of a real cluster still varies). The run ends with one summary line:
//! `campaign: profile=… seed=… handovers=… appends_ok=… appends_unknown=… faults=…
//! violations=…`, and the faults counted by kind on the line before it.
//!
//! `the_checker_catches_broken_protocols` runs shorter campaigns against deliberately broken
//! appends ([`Mutant`]) and requires the checker to report violations for each.

mod check;
mod client;
mod faults;
mod history;
mod world;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use leasehold::testing::{EtcdCluster, Mutant, random_namespace};
use leasehold::{Admin, Store, StoreOptions, Uuid};
use rand::Rng as _;
use tokio::time::{Instant, sleep};

use faults::{Counts, Kind, Target};
use history::{Entry, History};
use world::{Node, NodeConfig};

/// One campaign's shape.
#[derive(Clone, Debug)]
struct Profile {
    name: &'static str,
    nodes: usize,
    /// How many of the nodes are sidecars (`leasehold serve`) with one gRPC client per session.
    sidecars: usize,
    sessions: usize,
    /// How long faults are injected (at least; a running outage finishes).
    duration: Duration,
    /// Stop injecting early once this many handovers happened.
    handovers: Option<u64>,
    /// The outages to draw from (each runs at least once first).
    outages: Vec<Kind>,
    /// How long a reply drop lasts, in seconds, drawn uniformly.
    reply_drop: (f64, f64),
    /// The pause between two operator actions (revoke, compaction, trim), drawn uniformly.
    operator_every: (f64, f64),
    /// The operator actions to draw from, revokes three times as often as the others.
    operations: Vec<Kind>,
    node: NodeConfig,
}

const TTL: Duration = Duration::from_secs(4);
const MARGIN: Duration = Duration::from_secs(1);

impl Profile {
    fn from_env() -> Self {
        match std::env::var("LEASEHOLD_CAMPAIGN").as_deref() {
            Ok("long") => Self::long(),
            Ok("short") | Err(_) => Self::short(),
            Ok(other) => panic!("LEASEHOLD_CAMPAIGN={other}: expected short or long"),
        }
    }

    fn short() -> Self {
        Self {
            name: "short",
            nodes: 3,
            sidecars: 1,
            sessions: 20,
            duration: Duration::from_secs(180),
            handovers: None,
            outages: Kind::ALL.into_iter().filter(|k| k.is_outage()).collect(),
            // Sometimes shorter than the lease's validity (re-sends settle the outcome),
            // sometimes longer (it stays unknown).
            reply_drop: (0.3, TTL.as_secs_f64() + 1.0),
            operator_every: (1.0, 3.0),
            operations: vec![Kind::Revoke, Kind::Compaction, Kind::Trim],
            node: NodeConfig {
                ttl: TTL,
                margin: MARGIN,
                pace: Duration::from_millis(50),
                mutant: Mutant::None,
                stop_grace: Duration::from_secs(3),
            },
        }
    }

    fn long() -> Self {
        Self {
            name: "long",
            duration: Duration::from_secs(3 * 3600),
            handovers: Some(1000),
            operator_every: (0.5, 2.0),
            ..Self::short()
        }
    }

    /// A broken protocol, under the faults that expose it: owners revoked while they append
    /// (as fast as they can), replies dropped long enough to leave outcomes unknown.
    fn mutant(mutant: Mutant) -> Self {
        Self {
            name: "mutant",
            duration: Duration::from_secs(45),
            // The mutants break the library's append path: host nodes exercise it hardest.
            sidecars: 0,
            // Mostly reply drops that outlast the lease's validity a little.
            outages: vec![
                Kind::ReplyDrop,
                Kind::ReplyDrop,
                Kind::ReplyDrop,
                Kind::Blackhole,
                Kind::Stall,
            ],
            reply_drop: (TTL.as_secs_f64() - 0.5, TTL.as_secs_f64() + 1.5),
            operator_every: (0.2, 0.6),
            operations: vec![Kind::Revoke],
            node: NodeConfig {
                pace: Duration::ZERO,
                mutant,
                // Long enough for an append whose outcome stayed unknown to come back to the
                // mutant, rather than be aborted with its work.
                stop_grace: Duration::from_secs(15),
                ..Self::short().node
            },
            ..Self::short()
        }
    }

    /// How long after a heal every session must have appended again (invariants 6 and 7 of docs/protocol.md):
    /// the TTL, etcd's election timeout (1 s), its 0.5 s expiry scan, and 3 s for a commit
    /// and a watch/acquire round trip on a loaded 2-core machine.
    fn bound(&self) -> Duration {
        self.node.ttl + Duration::from_millis(1000 + 500 + 3000)
    }
}

/// What a run came to.
struct Outcome {
    seed: u64,
    handovers: u64,
    appends_ok: u64,
    appends_unknown: u64,
    faults: Counts,
    violations: Vec<String>,
    /// The longest time from a heal until every session appended again.
    slowest_recovery: Duration,
}

impl Outcome {
    fn summary(&self, profile: &str) -> String {
        format!(
            "campaign: profile={profile} seed={} handovers={} appends_ok={} appends_unknown={} faults={} violations={}",
            self.seed,
            self.handovers,
            self.appends_ok,
            self.appends_unknown,
            self.faults.values().sum::<u64>(),
            self.violations.len()
        )
    }
}

fn seed() -> u64 {
    match std::env::var("LEASEHOLD_CAMPAIGN_SEED") {
        Ok(seed) => seed.parse().expect("LEASEHOLD_CAMPAIGN_SEED is a number"),
        Err(_) => rand::rng().random(),
    }
}

/// Panics anywhere in the process (a node's task included) are counted: invariant 8.
static PANICS: AtomicU64 = AtomicU64::new(0);

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// One campaign at a time in this process: each wants the machine's cores to itself.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until every session has an acknowledged append invoked after `since`; `Err` names
/// the sessions that did not within `bound`.
async fn progress(
    history: &History,
    sessions: &[Uuid],
    since: Instant,
    bound: Duration,
) -> Result<Duration, Vec<Uuid>> {
    let deadline = since + bound;
    loop {
        let progress = history.progress();
        let behind: Vec<Uuid> = sessions
            .iter()
            .copied()
            .filter(|s| progress.get(s).is_none_or(|at| *at < since))
            .collect();
        if behind.is_empty() {
            return Ok(since.elapsed());
        }
        if Instant::now() >= deadline {
            return Err(behind);
        }
        sleep(Duration::from_millis(50)).await;
    }
}

async fn run(cluster: &EtcdCluster, profile: &Profile, seed: u64) -> Outcome {
    count_panics();
    let panics_before = PANICS.load(Ordering::SeqCst);
    eprintln!(
        "campaign: profile={} seed={seed} mutant={:?}",
        profile.name, profile.node.mutant
    );
    let mut rng = faults::rng(seed);
    let namespace = random_namespace();
    let sessions: Vec<Uuid> = (0..profile.sessions).map(|_| Uuid::new_v4()).collect();
    let history = History::new();
    let mut nodes = Vec::new();
    for i in 0..profile.nodes {
        // The last `sidecars` nodes serve their sessions through a sidecar.
        let sidecar = i + profile.sidecars >= profile.nodes;
        let node = Node::start(
            i,
            cluster,
            &namespace,
            &sessions,
            &profile.node,
            &history,
            sidecar,
        )
        .await;
        eprintln!("campaign: node-{i}: {}", node.role());
        nodes.push(node);
    }
    let admin = Admin::new(world::connection(cluster).await, namespace.clone());
    let raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a raw client");
    let mut violations = Vec::new();
    let bound = profile.bound();

    // Every session owned and appending before the first fault.
    if let Err(behind) =
        progress(&history, &sessions, Instant::now(), Duration::from_secs(60)).await
    {
        violations.push(format!(
            "{} sessions never appended at the start: {behind:?}",
            behind.len()
        ));
    }

    let target = Target {
        cluster,
        nodes: &nodes,
        sessions: &sessions,
        admin: &admin,
        raw: raw.clone(),
        history: &history,
        ttl: profile.node.ttl,
        reply_drop: profile.reply_drop,
    };
    let counts = std::sync::Mutex::new(Counts::new());
    let count = |kind: Kind| *counts.lock().unwrap().entry(kind).or_default() += 1;
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let mut slowest_recovery = Duration::ZERO;
    let (outage_seed, operator_seed) = (rng.random(), rng.random());

    let outages = async {
        let mut rng = faults::rng(outage_seed);
        let mut first: Vec<Kind> = faults::first_outages(&mut rng);
        first.retain(|kind| profile.outages.contains(kind));
        let mut next = first.into_iter();
        loop {
            let enough = started.elapsed() >= profile.duration
                || profile.handovers.is_some_and(|h| history.handovers() >= h);
            let kind = match next.next() {
                Some(kind) => kind,
                None if enough => break,
                None => profile.outages[rng.random_range(0..profile.outages.len())],
            };
            target.outage(kind, &mut rng).await;
            count(kind);
            let healed = Instant::now();
            match progress(&history, &sessions, healed, bound).await {
                Ok(took) => slowest_recovery = slowest_recovery.max(took),
                Err(behind) => violations.push(format!(
                    "invariants 6/7: {} sessions made no acknowledged append within {bound:?} after {} healed: {behind:?}",
                    behind.len(),
                    kind.name()
                )),
            }
            sleep(Duration::from_secs_f64(rng.random_range(0.2..1.5))).await;
        }
        done.store(true, Ordering::SeqCst);
    };
    let operator = async {
        let mut rng = faults::rng(operator_seed);
        let mut next = profile.operations.clone().into_iter();
        while !done.load(Ordering::SeqCst) {
            let (from, to) = profile.operator_every;
            sleep(Duration::from_secs_f64(rng.random_range(from..to))).await;
            let kind = next.next().unwrap_or_else(|| {
                // Revokes three times as often as the other actions.
                let draw = rng.random_range(0..profile.operations.len() + 2);
                profile
                    .operations
                    .get(draw)
                    .copied()
                    .unwrap_or(Kind::Revoke)
            });
            if target.operate(kind, &mut rng).await {
                count(kind);
            }
        }
    };
    tokio::join!(outages, operator);

    // After the last heal: every session goes on within the bound, whoever owns it.
    let end = Instant::now();
    if let Err(behind) = progress(&history, &sessions, end, bound).await {
        violations.push(format!(
            "invariant 7: {} sessions made no acknowledged append within {bound:?} after the last fault: {behind:?}",
            behind.len()
        ));
    }
    for node in nodes {
        node.stop().await;
    }

    let checker = Store::connect(
        StoreOptions::new(cluster.endpoints())
            .with_namespace(namespace.clone())
            .with_node("checker"),
    )
    .await
    .expect("the checker connects");
    let findings = check::check(&checker, &raw, &sessions, &history).await;
    checker.close().await;
    let entries = history.entries();
    for finding in &findings {
        violations.push(finding.what.clone());
    }
    let by_node: Vec<String> = history
        .acquisitions_by_node()
        .iter()
        .map(|(node, n)| format!("node-{node}={n}"))
        .collect();
    let validated = history.validated.load(Ordering::Relaxed);
    let (requests, acknowledged) = history.request_counts();
    eprintln!(
        "campaign: acquisitions by node: {}; acknowledged appends through a sidecar: {}; request ids checked: {requests} ({acknowledged} acknowledged; answered by a retry: {} acknowledged, {} refused; acknowledged calls sent again: {}); Validate answers `current`: {validated} ({} of them asked after the ownership ended)",
        by_node.join(" "),
        history.sidecar_ok.load(Ordering::Relaxed),
        history.retried_ok.load(Ordering::Relaxed),
        history.retried_refused.load(Ordering::Relaxed),
        history.repeated.load(Ordering::Relaxed),
        history.validated_late.load(Ordering::Relaxed),
    );
    if profile.sidecars > 0 {
        let sidecar_node = profile.nodes - 1;
        if !history.acquisitions_by_node().contains_key(&sidecar_node)
            || history.sidecar_ok.load(Ordering::Relaxed) == 0
            || validated == 0
        {
            violations.push(format!(
                "the sidecar node (node-{sidecar_node}) never owned a session, appended and validated its epoch"
            ));
        }
    }
    let panics = PANICS.load(Ordering::SeqCst) - panics_before;
    if panics > 0 {
        violations.push(format!("invariant 8: {panics} panics (see above)"));
    }
    if !violations.is_empty() {
        print_slices(&history, &entries, &findings);
    }
    Outcome {
        seed,
        handovers: history.handovers(),
        appends_ok: history.calls_ok.load(Ordering::Relaxed),
        appends_unknown: history.calls_unknown.load(Ordering::Relaxed),
        faults: counts.into_inner().unwrap(),
        violations,
        slowest_recovery,
    }
}

/// The offending slices of history: each session with a finding, its lease changes and
/// revokes, and the faults around them.
fn print_slices(history: &History, entries: &[Entry], findings: &[check::Finding]) {
    let mut shown = BTreeMap::new();
    for finding in findings {
        if let Some(session) = finding.session {
            shown
                .entry(session)
                .or_insert_with(Vec::new)
                .push(&finding.what);
        }
    }
    for (session, what) in shown.iter().take(5) {
        eprintln!("campaign: --- session {session}:");
        for line in what.iter().take(10) {
            eprintln!("campaign:   {line}");
        }
        let mine: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.session() == Some(*session))
            .collect();
        let (from, to) = (mine.first().map(|e| e.at()), mine.last().map(|e| e.at()));
        for entry in entries {
            let near = matches!(entry, Entry::Fault { .. })
                && from.is_some_and(|f| entry.at() >= f)
                && to.is_some_and(|t| entry.at() <= t);
            if entry.session() == Some(*session) || near {
                eprintln!("campaign:   {:8.3}s {entry:?}", history.secs(entry.at()));
            }
        }
    }
}

fn print_outcome(profile: &Profile, outcome: &Outcome) {
    for violation in outcome.violations.iter().take(50) {
        eprintln!("campaign: VIOLATION {violation}");
    }
    if !outcome.violations.is_empty() {
        let by_request_id = outcome
            .violations
            .iter()
            .filter(|violation| violation.contains("request id"))
            .count();
        eprintln!(
            "campaign: {} violations, {by_request_id} of them by request id",
            outcome.violations.len()
        );
    }
    let by_kind: Vec<String> = outcome
        .faults
        .iter()
        .map(|(kind, n)| format!("{}={n}", kind.name()))
        .collect();
    println!(
        "campaign: faults by kind: {}; slowest recovery after a heal: {:.2?} (bound {:.2?})",
        by_kind.join(" "),
        outcome.slowest_recovery,
        profile.bound()
    );
    println!("{}", outcome.summary(profile.name));
}

#[tokio::test(flavor = "multi_thread")]
async fn campaign() {
    let _one = ONE_AT_A_TIME.lock().await;
    let profile = Profile::from_env();
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let outcome = run(&cluster, &profile, seed()).await;
    print_outcome(&profile, &outcome);
    assert!(
        outcome.violations.is_empty(),
        "{} violations (seed {})",
        outcome.violations.len(),
        outcome.seed
    );
    let missing: Vec<&str> = Kind::ALL
        .iter()
        .filter(|kind| !outcome.faults.contains_key(kind))
        .map(|kind| kind.name())
        .collect();
    assert!(missing.is_empty(), "no fault of kind {missing:?}");
    if profile.name == "short" {
        assert!(
            outcome.handovers >= 50,
            "only {} handovers",
            outcome.handovers
        );
        assert!(
            outcome.appends_ok >= 5000,
            "only {} acknowledged appends",
            outcome.appends_ok
        );
    } else {
        assert!(
            outcome.handovers >= 1000,
            "only {} handovers",
            outcome.handovers
        );
    }
}

/// Each broken protocol breaks the invariant it is expected to, and the checker says so:
/// recovering in place writes records of an epoch after a newer one's fence (2); re-applying
/// an unknown outcome commits an append twice (4); dropping the owner compare lets a revoked
/// owner commit after the delete (2, in revision order). `LEASEHOLD_CAMPAIGN_MUTANT` names one
/// mutant to run alone (`RecoverInPlace`, `BlindReapply`, `SkipOwnerCompare`).
#[tokio::test(flavor = "multi_thread")]
async fn the_checker_catches_broken_protocols() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let only = std::env::var("LEASEHOLD_CAMPAIGN_MUTANT").ok();
    let mut missed = Vec::new();
    for (mutant, expected) in [
        (Mutant::RecoverInPlace, "invariant 2"),
        (Mutant::BlindReapply, "invariant 4"),
        (Mutant::SkipOwnerCompare, "invariant 2"),
    ] {
        if only
            .as_deref()
            .is_some_and(|only| only != format!("{mutant:?}"))
        {
            continue;
        }
        let profile = Profile::mutant(mutant);
        let outcome = run(&cluster, &profile, seed()).await;
        print_outcome(&profile, &outcome);
        let caught = outcome
            .violations
            .iter()
            .filter(|violation| violation.starts_with(expected))
            .count();
        println!("campaign: {mutant:?}: {caught} violations of {expected}");
        if caught == 0 {
            missed.push(mutant);
        }
    }
    assert!(
        missed.is_empty(),
        "the checker found no expected violation with {missed:?}"
    );
}
