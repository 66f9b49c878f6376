//! Session hosts on one member over one set of sessions: three, `h0`, `h1` and `h2`, started and
//! balanced, as the move tests (the library's and the tool's) start from; or named as a test
//! needs (the admin's tests).

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
    /// Three hosts of `sessions`, `h0`, `h1` and `h2`, returned once each holds a third of them.
    pub(crate) async fn start(etcd: &Etcd, sessions: &[Uuid]) -> Self {
        let fleet = Self::named(etcd, &["h0", "h1", "h2"], sessions).await;
        fleet.balanced().await;
        fleet
    }

    /// A host of `sessions` for each of `names` (its store's node name), each on a store of
    /// its own, none settling; returned at once.
    pub(crate) async fn named(etcd: &Etcd, names: &[&str], sessions: &[Uuid]) -> Self {
        let (mut stores, mut hosts) = (Vec::new(), Vec::new());
        for name in names {
            let store = Arc::new(etcd.store(name, TTL).await);
            hosts.push(SessionHost::start(
                store.clone(),
                HostOptions::default().with_settle(Duration::ZERO),
                sessions.to_vec(),
                idle,
            ));
            stores.push(store);
        }
        Self {
            stores,
            hosts,
            sessions: sessions.len(),
        }
    }

    /// How many sessions each host holds.
    pub(crate) fn held(&self) -> Vec<usize> {
        self.hosts.iter().map(SessionHost::held_count).collect()
    }

    /// Waits (up to 30 s) until each of three hosts holds a third of the sessions.
    pub(crate) async fn balanced(&self) {
        let even = self.sessions / 3;
        self.holding(&format!("{even} sessions each"), &[even; 3])
            .await;
    }

    /// Waits (up to 30 s) until the hosts hold `counts` sessions, in order.
    pub(crate) async fn holding(&self, what: &str, counts: &[usize]) {
        wait_for(what, Duration::from_secs(30), || async {
            (self.held() == counts).then_some(())
        })
        .await
        .unwrap_or_else(|error| panic!("{error}: held {:?}", self.held()));
    }

    /// Shuts every host down, in order.
    pub(crate) async fn shutdown(&self) {
        for host in &self.hosts {
            host.shutdown().await;
        }
    }

    /// Whether host `host` owns `session` now.
    pub(crate) fn holds(&self, host: usize, session: Uuid) -> bool {
        self.hosts[host].rig(session).is_some()
    }
}
