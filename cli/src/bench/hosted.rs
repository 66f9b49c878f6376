//! The `scale_hosted` scenario: one node hosting many sessions through `SessionHost`, as users
//! run it (a lease, a workspace root and a fenced journal each, one heartbeat a minute).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::fault::FaultProxy;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Uuid};
use tokio::sync::watch;
use tokio::time::Instant;

use super::scale::resident_bytes;
use super::{Bench, Better, Rounds, ms};
use crate::Failure;

/// The node lease's TTL of both nodes.
const TTL: u64 = 10;
/// How long the run waits for every session to be owned, at each step.
const PATIENCE: Duration = Duration::from_secs(300);
/// How long a probe waits for every journal's answer.
const PROBE_PATIENCE: Duration = Duration::from_secs(120);

/// The size of a hosted session's work future (`heartbeat`'s), which `SessionHost` keeps in an
/// allocation of its own: the user's work, which the memory goal leaves out.
static WORK_BYTES: AtomicUsize = AtomicUsize::new(0);

/// How long a probe spreads its journals' appends over (each journal's own offset in it, from
/// its id), so that they come at a rate a node meets in use rather than all at once; the fault
/// starts a third of the way in.
const PROBE_SPREAD: Duration = Duration::from_secs(30);

/// Every hosted session's work listens for a probe: asked, it appends once, at its offset in
/// [`PROBE_SPREAD`], and notes how long the append took. A probe of every journal, quiet and
/// then through a fault, shows the longest any journal waited.
struct Probe {
    /// When the current probe was asked for.
    asked: watch::Sender<Instant>,
    /// Each journal's wait for the current probe's append.
    waits: Mutex<Vec<Duration>>,
    /// The current probe's appends that failed.
    failed: AtomicUsize,
    /// Works started: a session given up and owned again starts its work again.
    started: AtomicUsize,
}

impl Probe {
    fn new() -> Self {
        Self {
            asked: watch::Sender::new(Instant::now()),
            waits: Mutex::new(Vec::new()),
            failed: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
        }
    }

    fn waits(&self) -> std::sync::MutexGuard<'_, Vec<Duration>> {
        self.waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A hosted session's work: a heartbeat now and one a minute, and an append when probed,
/// until stopped.
async fn heartbeat(rig: Arc<Rig>, stop: CancellationToken, probe: Arc<Probe>) {
    probe.started.fetch_add(1, Ordering::Relaxed);
    let mut asked = probe.asked.subscribe();
    let offset = PROBE_SPREAD.mul_f64((rig.session_id().as_u128() % 1000) as f64 / 1000.0);
    let (mut due, mut probed) = (Instant::now(), false);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            Ok(()) = asked.changed() => {
                (due, probed) = (later(*asked.borrow(), offset), true);
                continue;
            }
            _ = stop.cancelled() => return,
        }
        let began = Instant::now();
        let appended = tokio::select! {
            appended = rig.journal().append(if probed { "probe" } else { "heartbeat" }) => appended,
            _ = stop.cancelled() => return,
        };
        if probed {
            match appended {
                Ok(_) => probe.waits().push(began.elapsed()),
                Err(_) => drop(probe.failed.fetch_add(1, Ordering::Relaxed)),
            }
        }
        (due, probed) = (later(Instant::now(), Duration::from_secs(60)), false);
    }
}

/// `at + after`, for the heartbeat's and the probe's offsets (at most a minute).
fn later(at: Instant, after: Duration) -> Instant {
    at.checked_add(after)
        .expect("a minute from an instant of this run")
}

impl Bench {
    /// `sessions` sessions hosted by one node: resident memory per hosted session, time until
    /// all are owned, etcd transactions per owned session; every journal probed (an append
    /// each, spread over [`PROBE_SPREAD`]) while quiet, through a reset of the node's
    /// connections (its watch and keepalive streams restart) and, on a cluster, through a
    /// leader change: the longest any journal waited; then a second node joins, takes half,
    /// and the first dies (its connection blackholed): time until the survivor owns all.
    pub(super) async fn scale_hosted(&self, sessions: usize) -> Result<(), Failure> {
        let txns = || self.etcd_txns();
        let ids: Vec<Uuid> = (0..sessions).map(|_| Uuid::new_v4()).collect();
        let probe = Arc::new(Probe::new());
        let work = {
            let probe = probe.clone();
            move |rig, stop| {
                let work = heartbeat(rig, stop, probe.clone());
                WORK_BYTES.store(std::mem::size_of_val(&work), Ordering::Relaxed);
                work
            }
        };
        let proxy = FaultProxy::start(&self.endpoints[0])
            .await
            .map_err(Failure::runtime)?;
        let a = Arc::new(
            self.store_on(vec![proxy.endpoint()], "bench-hosted-a", TTL)
                .await?,
        );

        // --- one node owns them all
        let (before, txns_before) = (resident_bytes(), txns().await?);
        self.progress(format_args!("scale_hosted: hosting {sessions} sessions"));
        let started = Instant::now();
        let host_a =
            SessionHost::start(a.clone(), HostOptions::default(), ids.clone(), work.clone());
        self.until("scale_hosted", sessions, || host_a.held_count())
            .await?;
        let owning = started.elapsed();
        let per_session = resident_bytes().saturating_sub(before) as f64 / sessions as f64;
        let work_bytes = WORK_BYTES.load(Ordering::Relaxed) as f64;
        let per_owned = (txns().await? - txns_before) / sessions as f64;
        self.progress(format_args!(
            "scale_hosted: {sessions} owned in {owning:?}, {per_session:.0} bytes resident each ({work_bytes} of them the work's future) and {per_owned:.2} txns each"
        ));

        // --- every journal probed: quiet, through a reset of the node's connections, through
        // a leader change
        let quiet = self
            .probe("quiet", &probe, &host_a, sessions, async { Ok(()) })
            .await?;
        let reset = self
            .probe(
                "a reset of the node's connections",
                &probe,
                &host_a,
                sessions,
                async {
                    let connections = proxy.open_connections();
                    proxy.cut();
                    self.progress(format_args!(
                        "scale_hosted: {connections} connection(s) cut"
                    ));
                    Ok(())
                },
            )
            .await?;
        let leader_change = if self.members().await?.len() > 1 {
            let change = self.move_leader();
            Some(
                self.probe("a leader change", &probe, &host_a, sessions, change)
                    .await?,
            )
        } else {
            self.progress(
                "scale_hosted: one etcd member, so no leader change (give --endpoints of a cluster)",
            );
            None
        };

        // --- a second node takes half; then the first dies
        let b = Arc::new(self.store("bench-hosted-b", TTL).await?);
        let host_b = SessionHost::start(b.clone(), HostOptions::default(), ids, work);
        self.until("scale_hosted: the second node", sessions / 2, || {
            host_b.held_count()
        })
        .await?;
        self.until("scale_hosted: both nodes", sessions, || {
            host_a.held_count() + host_b.held_count()
        })
        .await?;
        let (on_a, on_b) = (host_a.held_count(), host_b.held_count());
        self.progress(format_args!(
            "scale_hosted: {on_a} on the first node, {on_b} on the second; the first dies"
        ));
        proxy.blackhole();
        let died = Instant::now();
        self.until("scale_hosted: taken over", sessions, || host_b.held_count())
            .await?;
        let takeover = died.elapsed();
        self.progress(format_args!(
            "scale_hosted: the survivor owns all {sessions} after {takeover:?}"
        ));
        drop(host_a);
        host_b.shutdown().await;
        drop(host_b);
        for store in [a, b] {
            if let Some(store) = Arc::into_inner(store) {
                store.close().await;
            }
        }

        // Each line's latencies: the time until all were owned.
        let report = |metric, unit, baseline_name, ours: f64, baseline: f64| {
            self.report(
                "scale_hosted",
                metric,
                unit,
                baseline_name,
                Better::Lower,
                Rounds {
                    ours: vec![ours],
                    baseline: vec![baseline],
                    latencies: vec![owning],
                },
            );
        };
        report(
            "resident memory per hosted session",
            "KiB",
            "2 KiB budget (the work's future in)",
            per_session / 1024.0,
            2.0,
        );
        report(
            "resident memory per hosted session beyond its work's future",
            "KiB",
            "2 KiB budget",
            (per_session - work_bytes) / 1024.0,
            2.0,
        );
        report(
            "time until all are owned",
            "s",
            "60 s budget",
            owning.as_secs_f64(),
            60.0,
        );
        report(
            "etcd transactions per owned session",
            "txns",
            "one each: acquire, workspace root, fence, heartbeat",
            per_owned,
            4.0,
        );
        report(
            "a dead node's sessions owned by the survivor",
            "s",
            "TTL + 10 s",
            takeover.as_secs_f64(),
            (TTL + 10) as f64,
        );
        // Each probe's line: the longest wait against the TTL; its latencies, each journal's.
        let probes = [
            ("longest journal wait, quiet", Some(quiet)),
            ("longest journal wait, connections reset", Some(reset)),
            ("longest journal wait, leader change", leader_change),
        ];
        for (metric, probed) in probes {
            let Some(waits) = probed else { continue };
            self.report(
                "scale_hosted",
                metric,
                "ms",
                "the TTL",
                Better::Lower,
                Rounds {
                    ours: vec![waits.iter().max().map_or(f64::NAN, |wait| ms(*wait))],
                    baseline: vec![(TTL * 1000) as f64],
                    latencies: waits,
                },
            );
        }
        Ok(())
    }

    /// Asks every journal `host` owns for an append, spread over [`PROBE_SPREAD`], with
    /// `fault` started a third of the way in, and waits for every answer: each journal's
    /// wait for its append. Fails if a session was given up meanwhile, an append failed or a
    /// journal did not answer in time.
    async fn probe(
        &self,
        what: &str,
        probe: &Probe,
        host: &SessionHost,
        sessions: usize,
        fault: impl Future<Output = Result<(), Failure>>,
    ) -> Result<Vec<Duration>, Failure> {
        probe.waits().clear();
        probe.failed.store(0, Ordering::Relaxed);
        let started = probe.started.load(Ordering::Relaxed);
        let mut fewest_owned = host.held_count();
        self.progress(format_args!("scale_hosted: every journal probed, {what}"));
        let asked = Instant::now();
        probe.asked.send_replace(asked);
        let fault = async {
            tokio::time::sleep(PROBE_SPREAD / 3).await;
            fault.await
        };
        let (answered, faulted) = tokio::join!(
            async {
                loop {
                    fewest_owned = fewest_owned.min(host.held_count());
                    let answers = probe.waits().len() + probe.failed.load(Ordering::Relaxed);
                    if answers >= sessions || asked.elapsed() > PROBE_PATIENCE {
                        return answers;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            fault
        );
        faulted?;
        let waits = std::mem::take(&mut *probe.waits());
        let failed = probe.failed.load(Ordering::Relaxed);
        let owned_again = probe.started.load(Ordering::Relaxed) - started;
        let longest = waits.iter().max().copied().unwrap_or_default();
        self.progress(format_args!(
            "scale_hosted: {what}: {} of {sessions} journals appended, the longest after {longest:?}; {failed} failed, {owned_again} sessions owned again, at fewest {fewest_owned} owned",
            waits.len()
        ));
        if answered < sessions || failed > 0 || owned_again > 0 {
            return Err(Failure::message(
                format!(
                    "scale_hosted: {what}: {answered} of {sessions} journals answered, {failed} appends failed and {owned_again} sessions were given up and owned again"
                ),
                1,
            ));
        }
        Ok(waits)
    }

    /// The etcd cluster's members: each one's id and first client URL.
    async fn members(&self) -> Result<Vec<(u64, String)>, Failure> {
        let members = self
            .raw
            .clone()
            .member_list()
            .await
            .map_err(Failure::runtime)?;
        Ok(members
            .members()
            .iter()
            .filter(|member| !member.is_learner())
            .filter_map(|member| Some((member.id(), member.client_urls().first()?.clone())))
            .collect())
    }

    /// Moves the etcd cluster's leadership to another member, asking the leader again until a
    /// member other than the first leader leads (raft aborts a transfer to a member that lags).
    async fn move_leader(&self) -> Result<(), Failure> {
        let members = self.members().await?;
        let leader = || async {
            self.raw
                .clone()
                .status()
                .await
                .map(|status| status.leader())
        };
        let first = leader().await.map_err(Failure::runtime)?;
        let asked = Instant::now();
        loop {
            let leader = leader().await.unwrap_or(first);
            if leader != first && leader != 0 {
                self.progress(format_args!(
                    "scale_hosted: the leader moved from {first:x} to {leader:x} in {:?}",
                    asked.elapsed()
                ));
                return Ok(());
            }
            if asked.elapsed() > Duration::from_secs(30) {
                return Err(Failure::runtime_message(format!(
                    "scale_hosted: the leader {first:x} did not hand over within 30 s"
                )));
            }
            let to = members.iter().find(|(id, _)| *id != leader);
            let from = members.iter().find(|(id, _)| *id == leader);
            if let (Some((to, _)), Some((_, url))) = (to, from) {
                let options = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(1))
                    .with_timeout(Duration::from_secs(5));
                // etcd waits for the transfer without a deadline of its own: the client's
                // timeout bounds it.
                if let Ok(mut client) = etcd_client::Client::connect([url], Some(options)).await {
                    let _ = client.move_leader(*to).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `count()` reaches `sessions`, reporting progress every 5 s, for at most
    /// [`PATIENCE`].
    async fn until(
        &self,
        what: &str,
        sessions: usize,
        count: impl Fn() -> usize,
    ) -> Result<(), Failure> {
        let started = Instant::now();
        let mut said = Instant::now();
        loop {
            let now = count();
            if now >= sessions {
                return Ok(());
            }
            if started.elapsed() > PATIENCE {
                return Err(Failure::message(
                    format!("{what}: only {now} of {sessions} owned after {PATIENCE:?}"),
                    1,
                ));
            }
            if said.elapsed() >= Duration::from_secs(5) {
                self.progress(format_args!("{what}: {now} of {sessions} owned"));
                said = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
