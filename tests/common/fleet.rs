//! Three session hosts, `h0`, `h1` and `h2`, over one set of sessions, started and balanced:
//! what the move tests (the library's and the tool's) start from.

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Store, Uuid};

use super::Etcd;

/// The node lease's TTL of the fleet's stores, in seconds.
pub(crate) const TTL: u64 = 3;

/// The work on an owned session: only to be there.
pub(crate) async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

pub(crate) struct Fleet {
    pub(crate) stores: Vec<Arc<Store>>,
    pub(crate) hosts: Vec<SessionHost>,
    sessions: usize,
}

impl Fleet {
    /// Three hosts of `sessions`, returned once each holds a third of them.
    pub(crate) async fn start(etcd: &Etcd, sessions: &[Uuid]) -> Self {
        let mut stores = Vec::new();
        let mut hosts = Vec::new();
        for i in 0..3 {
            let store = Arc::new(etcd.store(&format!("h{i}"), TTL).await);
            hosts.push(SessionHost::start(
                store.clone(),
                HostOptions::default().with_settle(Duration::ZERO),
                sessions.to_vec(),
                idle,
            ));
            stores.push(store);
        }
        let fleet = Self {
            stores,
            hosts,
            sessions: sessions.len(),
        };
        fleet.balanced().await;
        fleet
    }

    /// How many sessions each host holds.
    pub(crate) fn held(&self) -> Vec<usize> {
        self.hosts.iter().map(SessionHost::held_count).collect()
    }

    /// Waits (up to 30 s) until each host holds a third of the sessions.
    pub(crate) async fn balanced(&self) {
        let even = self.sessions / 3;
        wait_for(
            &format!("{even} sessions each"),
            Duration::from_secs(30),
            || async { (self.held() == [even; 3]).then_some(()) },
        )
        .await
        .unwrap();
    }

    /// Whether host `host` owns `session` now.
    pub(crate) fn holds(&self, host: usize, session: Uuid) -> bool {
        self.hosts[host].rig(session).is_some()
    }
}
