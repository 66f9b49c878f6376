//! The balance by load: sampling the sessions' loads, publishing the host's, asking for moves (see the [host docs](crate::host#load)).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use tokio::time::Instant;
use uuid::Uuid;

use super::super::{load, lock};
use super::{Balance, Listed};
use crate::host::MAX_PUBLISHED_SESSIONS;
use crate::keys::id_under;
use crate::store::LoadValue;

impl Balance {
    /// Samples every owned session's load; this host's is their sum.
    pub(super) fn sample_loads(&self) {
        let inner = &self.inner;
        let (now, half_life) = (Instant::now(), inner.options.load.half_life);
        let total: f64 = lock(&inner.owned)
            .values()
            .map(|owned| {
                let seq = owned.rig.journal().next_seq();
                let reported = owned.rig.reported_load();
                lock(&owned.meter).sample(reported, seq, now, half_life)
            })
            .sum();
        inner
            .load
            .store(load::published(total).to_bits(), Ordering::Release);
    }

    /// Writes this host's load to its load key, at most once per
    /// [`publish_every`](crate::LoadBalance::publish_every), and only when it changed (or the
    /// node lease did).
    pub(super) async fn publish_load(&mut self) {
        let inner = &self.inner;
        let Some(node) = inner.store.node_lease_id() else {
            return;
        };
        let (sessions, hottest) = {
            let owned = lock(&inner.owned);
            let loads = owned
                .iter()
                .map(|(session, owned)| (*session, load::published(lock(&owned.meter).load())));
            let shown = inner.options.load.published_sessions;
            (
                owned.len(),
                load::hottest(loads, shown.min(MAX_PUBLISHED_SESSIONS)),
            )
        };
        let value = LoadValue {
            load: inner.load_now(),
            sessions,
            nonce: inner.host_value.nonce,
            hottest,
        }
        .encode();
        let every = inner.options.load.publish_every;
        let due = self.load_sent_at.is_none_or(|at| at.elapsed() >= every);
        let same = self
            .load_confirmed
            .as_ref()
            .is_some_and(|(lease, said)| *lease == node && *said == value);
        let lease_changed = self
            .load_confirmed
            .as_ref()
            .is_some_and(|(lease, _)| *lease != node);
        if same || inner.leaving.is_cancelled() || !(due || lease_changed) {
            return;
        }
        self.load_sent_at = Some(Instant::now());
        let Some((lease, replied)) = inner.register(&self.load_key, &value, false).await else {
            return;
        };
        if replied {
            self.load_confirmed = Some((lease.id, value.clone()));
        }
        self.keys.load = Some((lease, value));
    }

    /// Asks for moves by load (see the [load docs](super#load)): as many as [`load::plan`]
    /// finds, within the churn budget, of sessions out of their cooldown and not being moved.
    pub(super) async fn move_by_load(
        &mut self,
        counted: &[Listed],
        keys: &HashMap<Uuid, (i64, i64)>,
        loads: &HashMap<Uuid, f64>,
    ) {
        let inner = self.inner.clone();
        let options = &inner.options.load;
        let now = Instant::now();
        let moving_out = lock(&inner.moving_out).clone();
        let Some((mut hosts, mine)) = self.hosts_by_load(counted, keys, loads, &moving_out, now)
        else {
            return;
        };
        let target = load::targets(&hosts)[mine];
        inner.load_target.store(target.to_bits(), Ordering::Release);
        if !options.enabled || inner.is_draining() {
            return;
        }
        let made = self
            .recent
            .iter()
            .filter(|(_, _, _, at)| now.duration_since(*at) < options.budget_interval)
            .count();
        let left = options.budget.saturating_sub(made);
        if left == 0 {
            return;
        }
        let mut movable: Vec<(load::SessionLoad, i64)> = lock(&inner.owned)
            .iter()
            .filter(|(session, owned)| {
                !owned.token.is_cancelled()
                    && owned.since.elapsed() >= options.cooldown
                    && !moving_out.contains(session)
            })
            .map(|(session, owned)| {
                let load = lock(&owned.meter).load();
                let epoch = owned.rig.epoch().revision();
                (
                    load::SessionLoad {
                        session: *session,
                        load,
                    },
                    epoch,
                )
            })
            .collect();
        for _ in 0..left {
            let sessions: Vec<load::SessionLoad> = movable.iter().map(|(s, _)| *s).collect();
            let Some(planned) = load::plan(mine, &hosts, &sessions, options.band) else {
                break;
            };
            let at = movable
                .iter()
                .position(|(s, _)| s.session == planned.session)
                .expect("planned from these");
            let (_, epoch) = movable.swap_remove(at);
            let Some(&host_key) = keys.get(&planned.to) else {
                break;
            };
            if !inner.ask_move(planned, epoch, host_key).await {
                // The target's key changed (it published, or left): the next tick reads it.
                break;
            }
            self.recent
                .push((planned.session, planned.to, planned.load, Instant::now()));
            hosts[mine].load -= planned.load;
            if let Some(host) = hosts.iter_mut().find(|host| host.store == planned.to) {
                host.load += planned.load;
            }
        }
    }

    /// This host's load without the sessions it is handing over: those being moved away (by
    /// load lately, `moved`, or by an operator's move, `moving_out`), or shed. They are still
    /// held, and still sampled, until their handover ends; counted, they would make this host
    /// look over its target by what it already moves, and ask for moves beyond those it needs.
    fn staying_load(&self, moved: &[Uuid], moving_out: &HashSet<Uuid>) -> f64 {
        let inner = &self.inner;
        let leaving: f64 = lock(&inner.owned)
            .iter()
            .filter(|(session, owned)| {
                owned.token.is_cancelled()
                    || moving_out.contains(*session)
                    || moved.contains(*session)
            })
            .map(|(_, owned)| lock(&owned.meter).load())
            .sum();
        (inner.load_now() - leaving).max(0.0)
    }

    /// The hosts counted, as the balance by load sees them (this host's load its own now, less
    /// what it is handing over, the others' as published, plus what was moved to them lately),
    /// and this host's index.
    fn hosts_by_load(
        &mut self,
        counted: &[Listed],
        keys: &HashMap<Uuid, (i64, i64)>,
        loads: &HashMap<Uuid, f64>,
        moving_out: &HashSet<Uuid>,
        now: Instant,
    ) -> Option<(Vec<load::HostLoad>, usize)> {
        let inner = &self.inner;
        // What was moved lately is not in the targets' published loads yet: the target says it
        // is ready at its next tick, this host hands over at its next, the target samples the
        // session at the tick after it acquired it and publishes within `publish_every`.
        let options = &inner.options.load;
        let fresh = options.publish_every + self.tick * 4;
        self.recent
            .retain(|(_, _, _, at)| now.duration_since(*at) < fresh.max(options.budget_interval));
        let unpublished: Vec<(Uuid, Uuid, f64)> = self
            .recent
            .iter()
            .filter(|(_, _, _, at)| now.duration_since(*at) < fresh)
            .map(|&(session, to, load, _)| (session, to, load))
            .collect();
        let moved: Vec<Uuid> = unpublished.iter().map(|(session, ..)| *session).collect();
        let prefix = inner.store.namespace().hosts_prefix();
        let me = inner.store.id();
        let staying = self.staying_load(&moved, moving_out);
        let mut hosts: Vec<load::HostLoad> = counted
            .iter()
            .filter_map(|(key, quota)| {
                let store = id_under(&prefix, key)?;
                let load = if store == me {
                    staying
                } else {
                    loads.get(&store).copied().unwrap_or(0.0)
                };
                Some(load::HostLoad {
                    store,
                    load,
                    weight: quota.weight,
                    takes: quota.max != Some(0) && quota.weight > 0 && keys.contains_key(&store),
                })
            })
            .collect();
        for (_, to, load) in &unpublished {
            if let Some(host) = hosts.iter_mut().find(|host| host.store == *to) {
                host.load += load;
            }
        }
        let mine = hosts.iter().position(|host| host.store == me)?;
        Some((hosts, mine))
    }
}
