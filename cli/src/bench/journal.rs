//! The journal scenarios: `append`, `group_commit`, `sessions`.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use leasehold::Journal;
use tokio::time::Instant;

use super::{Bench, Better, Rounds, timed_callers};
use crate::Failure;

impl Bench {
    /// Sequential fenced appends vs a raw txn with the same puts, one of each in turn (so that
    /// the machine's drift weighs on both alike).
    pub(super) async fn append(&self) -> Result<(), Failure> {
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
    pub(super) async fn group_commit(&self) -> Result<(), Failure> {
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
    pub(super) async fn sessions(&self) -> Result<(), Failure> {
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
            let (raw, prefix) = (self.raw.clone(), prefix.clone());
            let raw_txn = move |s: usize, i: usize| {
                let key = format!("{prefix}/{s}");
                let txn = Txn::new().and_then([
                    TxnOp::put(
                        format!("{key}/r/{:020}", round * EACH + i),
                        vec![7u8; 64],
                        None,
                    ),
                    TxnOp::put(format!("{key}/tip"), vec![7u8; 41], None),
                ]);
                let mut raw = raw.clone();
                async move { raw.txn(txn).await.map(drop) }
            };
            let (rate, _) = timed_callers(SESSIONS, EACH, raw_txn, Failure::runtime).await?;
            rounds.baseline.push(rate);
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
}

/// One writer task per journal in `writers` (the same journal may come more than once), each
/// making `each` appends one after the other; the appends/s of all of them together, and
/// their latencies.
pub(super) async fn appenders(
    writers: impl Iterator<Item = Arc<Journal>>,
    each: usize,
) -> Result<(f64, Vec<Duration>), Failure> {
    let writers: Arc<[Arc<Journal>]> = writers.collect();
    timed_callers(
        writers.len(),
        each,
        move |writer, _| {
            let journal = writers[writer].clone();
            async move { journal.append(vec![7u8; 64]).await.map(drop) }
        },
        Failure::runtime,
    )
    .await
}
