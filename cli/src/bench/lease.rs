//! The lease scenarios: `acquire`, `detect`, `handover_graceful`, `handover_crash`.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::LockOptions;
use leasehold::fault::FaultProxy;
use leasehold::{Journal, Lease, Store, Uuid};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::{Bench, Better, Rounds, ms, percentile, percentile_ms};
use crate::Failure;

impl Bench {
    /// acquire + release vs etcd's lock + unlock on an existing lease, one cycle of each in
    /// turn (which goes first alternates), each side's median cycle reported.
    pub(super) async fn acquire(&self) -> Result<(), Failure> {
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
    pub(super) async fn detect(&self) -> Result<(), Failure> {
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
    pub(super) async fn handover_graceful(&self) -> Result<(), Failure> {
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
    pub(super) async fn handover_crash(&self) -> Result<(), Failure> {
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
        .map_err(|error| Failure::message(crate::chain(&*error), 1))
}
