//! Balance: this host's key, the live hosts, the share each may hold, shedding what is over
//! it; and the leave (see the [module docs](super#balance)).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{GetOptions, KvClient, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use uuid::Uuid;

use super::settle::Members;
use super::{Inner, leave_bound, load, lock, moves};
pub(super) use shares::Quota;
use shares::weighted_shares;

mod by_load;
mod drain;
mod shares;
#[cfg(test)]
mod tests;
use crate::deadline::deadline;
use crate::etcd::Delete;
use crate::etcd::write::{self, Written};
use crate::keys::{id_under, prefix_end};
use crate::lease::NodeLease;
use crate::store::{HostValue, LoadValue};

impl Inner {
    /// Writes `key` (this host's key, or its joining key while it settles) with `value`,
    /// attached to the current node lease (returned, with whether a reply confirmed the put);
    /// with `settled`, the joining key is deleted in the same transaction. Not stopped by the
    /// host's leaving: it is re-sent until a reply settles it, the node lease stops being valid
    /// (then it is lost, and the key with it), or the store closes (which revokes the node
    /// lease), so no send of it is still on its way when the leave's delete goes out.
    async fn register(
        &self,
        key: &str,
        value: &str,
        settled: bool,
    ) -> Option<(Arc<NodeLease>, bool)> {
        let shared = self.store.shared();
        let node = shared.current_node().filter(|node| node.is_valid())?;
        let mut ops = vec![TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(node.id)),
        )];
        if settled {
            ops.push(TxnOp::delete(self.joining_key.as_str(), None));
        }
        let txn = Txn::new().and_then(ops);
        let written = write::send(
            &shared.connection,
            &shared.write,
            "host key",
            &txn,
            None,
            || node.is_valid(),
            &shared.shutdown,
        )
        .await;
        let replied = matches!(written, Written::Replied(_));
        Some((node, replied))
    }

    /// What this host's key should hold now: as its maximum, no more than the sessions it
    /// hosts (so it is not given a share it cannot fill; not when it follows the registry), and
    /// 0 while it drains.
    fn value_now(&self) -> String {
        let mut value = self.host_value.clone();
        // Hosts that follow the registry host the same sessions by construction.
        if !self.options.registry {
            let wanted = lock(&self.wanted).len();
            value.max = Some(value.max.map_or(wanted, |max| max.min(wanted)));
        }
        if self.is_draining() {
            value.max = Some(0);
        }
        value.encode()
    }

    /// The hosts, at one revision: the settled ones (under `{ns}/hosts/`, sorted by key) and
    /// those settling (under `{ns}/joining/`, by the host key each will have), each with its
    /// quota; and whether a drain of this host is asked for
    /// ([`Admin::drain`](crate::Admin::drain)), read in the same transaction.
    async fn live_hosts(&self) -> Option<Hosts> {
        let namespace = self.store.namespace();
        let prefix = namespace.hosts_prefix();
        let joining_prefix = namespace.joining_prefix();
        let moves_prefix = namespace.moves_prefix();
        let sets_prefix = namespace.sets_prefix();
        let loads_prefix = namespace.loads_prefix();
        let drain_key = namespace.drain_key(self.store.id());
        let range = |prefix: &str| Some(GetOptions::new().with_range(prefix_end(prefix)));
        let mut ops = vec![
            TxnOp::get(prefix.as_str(), range(&prefix)),
            TxnOp::get(drain_key.as_str(), None),
            TxnOp::get(joining_prefix.as_str(), range(&joining_prefix)),
            TxnOp::get(moves_prefix.as_str(), range(&moves_prefix)),
            TxnOp::get(loads_prefix.as_str(), range(&loads_prefix)),
        ];
        // The other hosts' sets matter only to a host with a fixed set (see `sets.rs`).
        if !self.options.registry {
            ops.push(TxnOp::get(sets_prefix.as_str(), range(&sets_prefix)));
        }
        let txn = Txn::new().and_then(ops);
        let read = self
            .store
            .connection()
            .read("list hosts", |mut client: KvClient, _| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            });
        let response = tokio::select! {
            response = read => response.ok()?,
            _ = self.leaving.cancelled() => return None,
            _ = self.shutdown.cancelled() => return None,
        };
        let mut gets = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            });
        let quota = |value: &[u8]| {
            let value = HostValue::decode(value);
            Quota {
                max: value.max,
                weight: value.weight,
            }
        };
        let settled_kvs = gets.next()?.kvs().to_vec();
        let settled = settled_kvs
            .iter()
            .map(|kv| (kv.key().to_vec(), quota(kv.value())))
            .collect();
        let keys = settled_kvs
            .iter()
            .filter_map(|kv| {
                Some((
                    id_under(&prefix, kv.key())?,
                    (kv.lease(), kv.mod_revision()),
                ))
            })
            .collect();
        let drain = gets
            .next()
            .and_then(|get| get.kvs().first().map(etcd_client::KeyValue::lease));
        let joining = gets.next().map_or_else(Vec::new, |get| {
            get.kvs()
                .iter()
                .filter_map(|kv| {
                    let store = id_under(&joining_prefix, kv.key())?;
                    Some((namespace.host_key(store).into_bytes(), quota(kv.value())))
                })
                .collect()
        });
        let moves = gets
            .next()
            .map_or_else(Vec::new, |get| moves::listed(&moves_prefix, get.kvs()));
        let loads = gets.next().map_or_else(HashMap::new, |get| {
            LoadValue::by_store(&loads_prefix, get.kvs())
                .into_iter()
                .map(|(store, value)| (store, value.load))
                .collect()
        });
        let sets = gets.next().map_or_else(Vec::new, |get| get.kvs().to_vec());
        Some(Hosts {
            settled,
            keys,
            joining,
            drain,
            moves,
            loads,
            sets,
        })
    }

    /// Sheds owned sessions until at most `cap` are held, those acquired through a move (or
    /// being moved away) last.
    /// A session on its way out (shed, moved, stopped, lost: its token cancelled) holds its
    /// slot until its shutdown ends, and counts as shed already: a tick that comes while the
    /// last shed is still under way sheds no more.
    fn shed_to(&self, cap: usize) {
        let owned = lock(&self.owned);
        let (leaving, staying): (Vec<_>, Vec<_>) = owned
            .iter()
            .partition(|(_, owned)| owned.token.is_cancelled());
        let held = self.slots.load(Ordering::Acquire);
        let excess = to_shed(held, leaving.len(), staying.len(), cap);
        if excess == 0 {
            return;
        }
        // Those out of their cooldown first, whose load is nearest what each should take away
        // for this host to reach its load target (the coldest first when it is there).
        let (load, target) = (self.load_now(), self.load_target());
        let each = if target.is_nan() {
            0.0
        } else {
            ((load - target) / excess as f64).max(0.0)
        };
        let cooldown = self.options.load.cooldown;
        // Those moved here, and those being moved away (their move gives them up), last.
        let moving_out = lock(&self.moving_out);
        let (moved, others): (Vec<_>, Vec<_>) = staying
            .into_iter()
            .partition(|(session, owned)| owned.moved_here || moving_out.contains(*session));
        drop(moving_out);
        let mut order: Vec<(Uuid, f64, bool)> = others
            .iter()
            .map(|(session, owned)| {
                let load = lock(&owned.meter).load();
                (**session, load, owned.since.elapsed() >= cooldown)
            })
            .collect();
        load::shed_order(&mut order, each);
        let others = order
            .iter()
            .filter_map(|(session, _, _)| owned.get(session));
        for owned in others
            .chain(moved.into_iter().map(|(_, owned)| owned))
            .take(excess)
        {
            owned.shed(None);
        }
    }

    /// This host's load at the last sample.
    pub(super) fn load_now(&self) -> f64 {
        f64::from_bits(self.load.load(Ordering::Acquire))
    }

    /// This host's load target as last computed (NaN when none was).
    fn load_target(&self) -> f64 {
        f64::from_bits(self.load_target.load(Ordering::Acquire))
    }
}

/// How many more sessions to shed when `held` slots are taken, `leaving` of them by sessions
/// already on their way out and `staying` by owned sessions that are not, and the cap is
/// `cap`. Only owned sessions are shed, and only those over the cap: a slot taken for an
/// acquisition still under way (a move's, say, which may yet fail) is shed for once it is
/// owned, not before.
fn to_shed(held: usize, leaving: usize, staying: usize, cap: usize) -> usize {
    let over = held.saturating_sub(leaving).saturating_sub(cap);
    over.min(staying.saturating_sub(cap))
}

/// A host's key and its quota.
type Listed = super::settle::Listed<Quota>;

/// The hosts as one read found them: see [`Inner::live_hosts`].
struct Hosts {
    settled: Vec<Listed>,
    /// Each settled host's key as read: its lease and mod revision (what a move to it
    /// compares).
    keys: HashMap<Uuid, (i64, i64)>,
    joining: Vec<Listed>,
    /// The node lease of the drain key asked for this host ([`Admin::drain`](crate::Admin::drain)), if there is one.
    drain: Option<i64>,
    /// The moves under way (see `moves.rs`).
    moves: Vec<moves::Listed>,
    /// The loads the hosts published, by store.
    loads: HashMap<Uuid, f64>,
    /// The hosts' set keys (see `sets.rs`).
    sets: Vec<etcd_client::KeyValue>,
}

/// Keeps this host's key alive and its cap current; sheds what is over the cap. A new host
/// first settles under its joining key, taking nothing. When the host starts leaving, deletes
/// its keys and ends. Registering and leaving are done here alone, one after the other, so the
/// delete always comes after the last put.
pub(super) async fn balance(inner: Arc<Inner>) {
    let mut balance = Balance::new(inner);
    loop {
        let joining = balance.settling.tick(Instant::now(), &balance.inner);
        let value = balance.register_host(joining).await;
        balance.register_set().await;
        balance.sample_loads();
        balance.publish_load().await;
        if balance.inner.leaving.is_cancelled() {
            break;
        }
        balance.count(joining, value).await;
        if balance.wait().await {
            break;
        }
    }
    let Balance { inner, keys, .. } = balance;
    inner.leave(keys).await;
    inner.left.cancel();
}

/// The balance's state between ticks.
struct Balance {
    inner: Arc<Inner>,
    /// How often it ticks.
    tick: Duration,
    settling: Settling,
    members: Members,
    /// What the last put of each key a reply confirmed wrote.
    confirmed: Confirmed,
    /// What was last sent to each key: see [`Sent`].
    keys: SentKeys,
    /// This host's set key (see `sets.rs`), and the other hosts' sets reported differing.
    set_key: String,
    sets_reported: HashMap<uuid::Uuid, u64>,
    /// The hosts counted at the last read, and this host's value then: the shares again from
    /// these when the wanted sessions change between reads.
    last: Option<Counted>,
    /// This host's load key, and the node lease and value of its last confirmed put, and
    /// when it was sent.
    load_key: String,
    load_confirmed: Option<(i64, String)>,
    load_sent_at: Option<Instant>,
    /// The node lease the drain key asked for this host was last read on.
    drain_lease: Option<i64>,
    /// The moves by load asked for lately, (session, target, load, when): those within the
    /// budget's interval count against it, and each is added to its target's published load
    /// until the target publishes again, and taken from this host's while it still holds the
    /// session.
    recent: Vec<(Uuid, Uuid, f64, Instant)>,
}

/// Whether a new host still settles under its joining key, taking nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settling {
    /// Its joining key not yet confirmed: the settle starts when it is.
    Unconfirmed { settle: Duration },
    /// Settling until then.
    Until(Instant),
    /// Settled (or told not to settle).
    Done,
}

impl Settling {
    fn new(settle: Duration) -> Self {
        if settle.is_zero() {
            Settling::Done
        } else {
            Settling::Unconfirmed { settle }
        }
    }

    /// At `now`: whether the host still settles (it ends when its time is up).
    fn tick(&mut self, now: Instant, inner: &Inner) -> bool {
        if let Settling::Until(until) = *self
            && now >= until
        {
            *self = Settling::Done;
            tracing::info!(
                node = inner.store.node(),
                "session host settled: taking sessions"
            );
        }
        *self != Settling::Done
    }

    /// A put of the joining key was confirmed at `now`: the settle starts, if it has not.
    fn confirmed(&mut self, now: Instant, inner: &Inner) {
        if let Settling::Unconfirmed { settle } = *self {
            *self = Settling::Until(deadline(now, settle));
            tracing::info!(
                node = inner.store.node(),
                settle = ?settle,
                "session host settling: it takes no session until the hosts it sees are stable"
            );
        }
    }

    /// When the balance must wake to end the settle, if it settles.
    fn until(self) -> Option<Instant> {
        match self {
            Settling::Until(until) => Some(until),
            _ => None,
        }
    }
}

/// The last put of the host key (or joining key) and of the set key a reply confirmed.
#[derive(Default)]
struct Confirmed {
    /// The node lease, key and value.
    host: Option<(i64, String, String)>,
    /// The node lease and value.
    set: Option<(i64, String)>,
}

/// The node lease and value of the last put sent to a key: the key, if it exists, is attached
/// to it and holds that value (or an earlier one, if that put was never applied).
type Sent = Option<(Arc<NodeLease>, String)>;

/// What was last sent to each of this host's keys: see [`Sent`]. The joining key's is kept
/// until a put of the host key, which deletes it, is confirmed.
#[derive(Default)]
struct SentKeys {
    host: Sent,
    joining: Sent,
    set: Sent,
    load: Sent,
}

/// The hosts counted at a read, the value of this host's key a reply confirmed then, and the
/// value it should hold.
struct Counted {
    hosts: Vec<Listed>,
    said: Option<String>,
    value: String,
}

impl Balance {
    fn new(inner: Arc<Inner>) -> Self {
        let settle = inner
            .options
            .settle
            .unwrap_or_else(|| inner.store.ttl().saturating_mul(2));
        Self {
            tick: (inner.store.ttl() / 3).min(Duration::from_secs(1)),
            settling: Settling::new(settle),
            members: Members::default(),
            confirmed: Confirmed::default(),
            keys: SentKeys::default(),
            set_key: inner.store.namespace().set_key(inner.store.id()),
            sets_reported: HashMap::new(),
            last: None,
            load_key: inner.store.namespace().load_key(inner.store.id()),
            load_confirmed: None,
            load_sent_at: None,
            drain_lease: None,
            recent: Vec::new(),
            inner,
        }
    }

    /// This host's key (its joining key while it settles), written again when its node lease
    /// or value changed since the last confirmed put. The value it should hold now.
    async fn register_host(&mut self, joining: bool) -> String {
        let inner = &self.inner;
        let key = if joining {
            &inner.joining_key
        } else {
            &inner.host_key
        };
        let value = inner.value_now();
        let Some(node) = inner.store.node_lease_id() else {
            return value;
        };
        if self.confirmed.host.as_ref() == Some(&(node, key.clone(), value.clone()))
            || inner.leaving.is_cancelled()
        {
            return value;
        }
        let settled = !joining && self.keys.joining.is_some();
        let Some((lease, replied)) = inner.register(key, &value, settled).await else {
            return value;
        };
        if replied {
            self.confirmed.host = Some((lease.id, key.clone(), value.clone()));
            if joining {
                self.settling.confirmed(Instant::now(), inner);
            } else {
                // That put deleted the joining key.
                self.keys.joining = None;
            }
        }
        let sent = Some((lease, value.clone()));
        if joining {
            self.keys.joining = sent;
        } else {
            self.keys.host = sent;
        }
        value
    }

    /// This host's set key (see `sets.rs`), the same way.
    async fn register_set(&mut self) {
        let inner = &self.inner;
        let (Some(node), Some(set)) = (inner.store.node_lease_id(), inner.set_value()) else {
            return;
        };
        if self.confirmed.set.as_ref() == Some(&(node, set.clone())) || inner.leaving.is_cancelled()
        {
            return;
        }
        let Some((lease, replied)) = inner.register(&self.set_key, &set, false).await else {
            return;
        };
        if replied {
            self.confirmed.set = Some((lease.id, set.clone()));
        }
        self.keys.set = Some((lease, set));
    }

    /// Reads the live hosts; follows a drain asked for and the moves; and, once settled, takes
    /// this host's share of the sessions (`value`: what its key should hold now).
    async fn count(&mut self, joining: bool, value: String) {
        let inner = self.inner.clone();
        let Some(hosts) = inner.live_hosts().await else {
            return;
        };
        inner.compare_sets(&hosts.sets, &mut self.sets_reported);
        let drain_asked = self.follow_drain(hosts.drain).await;
        if inner.drain_asked.swap(drain_asked, Ordering::AcqRel) != drain_asked {
            tracing::info!(
                node = inner.store.node(),
                drain_asked,
                "a drain of this host is asked for (or withdrawn)"
            );
            // The key is written again (its maximum) at the next tick.
            inner.recount.notify_one();
        }
        // A settling host takes nothing, and is no move's target (a move names a settled host)
        // nor holder.
        if joining {
            return;
        }
        inner.follow_moves(hosts.moves).await;
        let counted = Counted {
            hosts: self.members.count(hosts.settled, hosts.joining),
            said: (self.confirmed.host.as_ref())
                .filter(|(_, key, _)| *key == inner.host_key)
                .map(|(_, _, said)| said.clone()),
            value,
        };
        inner.take_share(counted.hosts.clone(), counted.said.as_ref(), &counted.value);
        self.move_by_load(&counted.hosts, &hosts.keys, &hosts.loads)
            .await;
        self.last = Some(counted);
    }

    /// Waits for the next tick (or the settle's end, or a recount asked for), taking the share
    /// again from the last count whenever the wanted sessions change. True when the host
    /// leaves.
    async fn wait(&self) -> bool {
        let inner = &self.inner;
        let tick = deadline(Instant::now(), self.tick);
        let wake = self.settling.until().map_or(tick, |until| until.min(tick));
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => return false,
                _ = inner.recount.notified() => return false,
                _ = inner.leaving.cancelled() => return true,
                // The wanted sessions changed: the shares again, from the hosts last read.
                _ = inner.resized.notified() => {
                    if let Some(last) = &self.last {
                        inner.take_share(last.hosts.clone(), last.said.as_ref(), &last.value);
                    }
                }
            }
        }
    }
}

impl Inner {
    /// Sets this host's cap to its share among the `counted` hosts and sheds what is over it;
    /// `said` is the value of the last put of its key a reply confirmed, `value` the one it
    /// should hold now.
    fn take_share(&self, mut counted: Vec<Listed>, said: Option<&String>, value: &str) {
        let wanted = lock(&self.wanted).len();
        let own = self.host_key.as_bytes();
        // Not (yet) listed: count itself, last.
        let rank = counted
            .iter()
            .position(|(key, _)| key == own)
            .unwrap_or_else(|| {
                let own_value = HostValue::decode(value.as_bytes());
                let quota = Quota {
                    max: own_value.max,
                    weight: own_value.weight,
                };
                counted.push((own.to_vec(), quota));
                counted.len() - 1
            });
        let quotas: Vec<Quota> = counted.iter().map(|(_, quota)| *quota).collect();
        let share = weighted_shares(wanted, &quotas)[rank];
        let draining = self.is_draining();
        let cap = match self.options.max_sessions {
            _ if draining => 0,
            Some(max) => share.min(max),
            None => share,
        };
        let live = counted.len();
        if self
            .cap
            .send_if_modified(|current| std::mem::replace(current, cap) != cap)
        {
            tracing::debug!(
                node = self.store.node(),
                live,
                wanted,
                cap,
                "session host share"
            );
        }
        // A drain sheds only once the key says so: the others then count this host out of
        // the balance, and have room for what it sheds.
        if !draining || said.is_some_and(|said| said == value) {
            self.shed_to(cap);
        }
    }
}

impl Inner {
    /// Hands this host's share over: takes no more sessions and deletes the host's key (put
    /// last on a node lease, with a value: `keys.host`), and its joining key if a put of the
    /// host key did not confirm its delete, so the other hosts' shares grow; and its set key
    /// and load key, and the moves to it it said it was ready for. Each delete
    /// is guarded by this host's value and tried for at most three write attempts here; one not
    /// confirmed by then is handed to the store's background deletes, which re-send it until it
    /// is confirmed or its node lease is lost (its end deletes the key).
    async fn leave(&self, keys: SentKeys) {
        self.cap.send_replace(0);
        let namespace = self.store.namespace();
        let set_key = namespace.set_key(self.store.id());
        let load_key = namespace.load_key(self.store.id());
        for (key, written) in [
            (&self.host_key, keys.host),
            (&self.joining_key, keys.joining),
            (&set_key, keys.set),
            (&load_key, keys.load),
        ] {
            if let Some((node, value)) = written.filter(|(node, _)| !node.is_lost()) {
                self.delete_key(key, node, &value).await;
            }
        }
        self.withdraw_moves().await;
    }

    /// Deletes `key` if it still holds `value`: see [`leave`](Self::leave).
    async fn delete_key(&self, key: &str, node: Arc<NodeLease>, value: &str) {
        let shared = self.store.shared();
        let delete = Delete::holding(key, value);
        let until = Instant::now().checked_add(leave_bound(&shared.write));
        let written = write::send(
            &shared.connection,
            &shared.write,
            "host key",
            &delete.txn(),
            None,
            || !node.is_lost() && until.is_none_or(|until| Instant::now() < until),
            &shared.shutdown,
        )
        .await;
        match written {
            Written::Replied(_) => {
                tracing::debug!(%key, "session host key deleted");
            }
            Written::Failed(error)
            | Written::Unknown(error)
            | Written::Refused { error, .. }
            | Written::Resolved { unknown: error, .. } => {
                tracing::warn!(%key, %error, "session host key delete deferred to the background");
                shared.delete_in_background(vec![delete], node);
            }
        }
    }
}
