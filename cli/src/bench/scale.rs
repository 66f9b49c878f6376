//! The `scale` scenario: one store holding many bare leases.

use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::Uuid;
use tokio::time::Instant;

use super::{Bench, Better, Rounds};
use crate::Failure;

impl Bench {
    /// Many sessions on one node: keepalive requests etcd receives per second vs one lease
    /// per session renewed every TTL/3; and resident memory per held session.
    pub(super) async fn scale(&self, sessions: usize) -> Result<(), Failure> {
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

/// This process's resident set, from /proc (0 where there is none).
pub(super) fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}
