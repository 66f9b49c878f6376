//! The `handover_move` scenario: a session moved between two session hosts
//! (`Admin::move_session`), timed from the holder's release (its owner key's delete, seen on a
//! watch of this process) to the target's fence (the journal's tip put after it), against one
//! raw transaction after the same pause, as `handover_graceful` is. The admin's whole call,
//! which waits for both hosts' balance ticks, is printed beside it.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use leasehold::admin::Admin;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Uuid};
use tokio::time::Instant;

use super::{Bench, Better, Rounds, ms};
use crate::Failure;

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

impl Bench {
    pub(super) async fn handover_move(&self) -> Result<(), Failure> {
        const PAUSE: Duration = Duration::from_millis(100);
        let sessions = [Uuid::new_v4(), Uuid::new_v4()];
        let stores = [
            Arc::new(self.store("bench-move-a", 10).await?),
            Arc::new(self.store("bench-move-b", 10).await?),
        ];
        let options = || HostOptions::default().with_settle(Duration::ZERO);
        let hosts = stores
            .iter()
            .map(|store| SessionHost::start(store.clone(), options(), sessions, idle))
            .collect::<Vec<_>>();
        let admin = Admin::new(stores[0].connection().clone(), self.namespace.clone());
        let one_each = || hosts.iter().all(|host| host.held_count() == 1);
        let key = format!("{}bench/move", self.namespace.prefix());
        let mut rounds = Rounds::default();
        let mut calls = Vec::new();
        let samples = self.rounds.max(10);
        for round in 0..samples {
            self.progress(format_args!(
                "handover_move: sample {}/{samples}",
                round + 1
            ));
            let settled = Instant::now();
            while !one_each() {
                if settled.elapsed() > Duration::from_secs(30) {
                    return Err(Failure::runtime_message("the hosts did not hold one each"));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Each way in turn.
            let (from, to) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
            let Some((session, _)) = hosts[from].held().first().copied() else {
                continue;
            };
            let owner_key = self.namespace.owner_key(session);
            let tip_key = self.namespace.tip_key(session);
            let options = WatchOptions::new().with_prefix();
            let mut watch = self
                .raw
                .clone()
                .watch(self.namespace.prefix(), Some(options))
                .await
                .map_err(Failure::runtime)?;
            tokio::time::sleep(PAUSE).await;
            let started = Instant::now();
            let moving = admin.move_session(session, stores[to].id(), Duration::from_secs(30));
            let watching = async {
                let mut released = None;
                while let Ok(Some(response)) = watch.message().await {
                    let now = Instant::now();
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        match (event.event_type(), released) {
                            (EventType::Delete, None) if kv.key() == owner_key.as_bytes() => {
                                released = Some(now);
                            }
                            (EventType::Put, Some(at)) if kv.key() == tip_key.as_bytes() => {
                                return Some(now - at);
                            }
                            _ => {}
                        }
                    }
                }
                None
            };
            let (moved, handover) = tokio::join!(moving, watching);
            moved.map_err(Failure::runtime)?;
            calls.push(started.elapsed());
            let handover = handover
                .ok_or_else(|| Failure::runtime_message("the watch ended before the fence"))?;
            rounds.latencies.push(handover);
            rounds.ours.push(ms(handover));
            tokio::time::sleep(PAUSE).await;
            let started = Instant::now();
            self.raw_append(&key, round).await?;
            rounds.baseline.push(ms(started.elapsed()));
        }
        for host in &hosts {
            host.shutdown().await;
        }
        for store in &stores {
            store.close().await;
        }
        calls.sort();
        if let Some(median) = calls.get(calls.len() / 2) {
            self.progress(format_args!(
                "handover_move: the admin's call (both hosts' balance ticks, then the handover) took {median:?} (median)"
            ));
        }
        self.report(
            "handover_move",
            "release to fence",
            "ms",
            "one raw txn, after the same pause",
            Better::Lower,
            rounds,
        );
        Ok(())
    }
}
