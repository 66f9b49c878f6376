//! The `scale_hosted` scenario: one node hosting many sessions through `SessionHost`, as users
//! run it (a lease, a workspace root and a fenced journal each, one heartbeat a minute).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::fault::FaultProxy;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Uuid};
use tokio::time::Instant;

use super::scale::resident_bytes;
use super::{Bench, Better, Rounds};
use crate::cli::Failure;

/// The node lease's TTL of both nodes.
const TTL: u64 = 10;
/// How long the run waits for every session to be owned, at each step.
const PATIENCE: Duration = Duration::from_secs(300);

/// The size of a hosted session's work future (`heartbeat`'s), which `SessionHost` keeps in an
/// allocation of its own: the user's work, which the memory goal leaves out.
static WORK_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The work `SessionHost` runs on each session: `heartbeat`, its size noted.
fn work(rig: Arc<Rig>, stop: CancellationToken) -> impl Future<Output = ()> + Send {
    let work = heartbeat(rig, stop);
    WORK_BYTES.store(std::mem::size_of_val(&work), Ordering::Relaxed);
    work
}

/// A hosted session's work: a heartbeat now and one a minute, until stopped.
async fn heartbeat(rig: Arc<Rig>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = rig.journal().append("heartbeat") => {}
            _ = stop.cancelled() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

impl Bench {
    /// `sessions` sessions hosted by one node: resident memory per hosted session, time until
    /// all are owned, etcd transactions per owned session; then a second node joins, takes
    /// half, and the first dies (its connection blackholed): time until the survivor owns all.
    pub(super) async fn scale_hosted(&self, sessions: usize) -> Result<(), Failure> {
        let txns = || self.etcd_txns();
        let ids: Vec<Uuid> = (0..sessions).map(|_| Uuid::new_v4()).collect();
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
        let host_a = SessionHost::start(a.clone(), HostOptions::default(), ids.clone(), work);
        self.until("scale_hosted", sessions, || host_a.held_count())
            .await?;
        let owning = started.elapsed();
        let per_session = resident_bytes().saturating_sub(before) as f64 / sessions as f64;
        let work_bytes = WORK_BYTES.load(Ordering::Relaxed) as f64;
        let per_owned = (txns().await? - txns_before) / sessions as f64;
        self.progress(format_args!(
            "scale_hosted: {sessions} owned in {owning:?}, {per_session:.0} bytes resident each ({work_bytes} of them the work's future) and {per_owned:.2} txns each"
        ));

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
        Ok(())
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
