//! The faults, scheduled at random from the run's seed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{CompactionOptions, Compare, CompareOp, Txn, TxnOp};
use leasehold::testing::EtcdCluster;
use leasehold::{Admin, Uuid};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use rand::{Rng as _, SeedableRng as _};
use tokio::time::{Instant, sleep};

use crate::history::{Entry, History};
use crate::world::Node;

/// Every kind of fault the campaign injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// etcd's leader killed (SIGKILL), restarted later.
    LeaderKill,
    /// A follower killed, restarted later.
    FollowerKill,
    /// A member cut off from its peers, healed later.
    Partition,
    /// Leadership moved to another member.
    LeaderMove,
    /// One node's network to every member blackholed for longer than its TTL.
    Blackhole,
    /// One node's runtime frozen (a stop-the-world pause), then resumed.
    Stall,
    /// One node's connections closed, and new ones refused, for a moment.
    Blip,
    /// One node's replies dropped (requests still reach etcd): appends in flight end unknown.
    ReplyDrop,
    /// An operator deletes a session's owner key.
    Revoke,
    /// etcd's history compacted up to the current revision.
    Compaction,
    /// An operator trims a journal.
    Trim,
    /// A sidecar node killed (its process gone at once, as SIGKILL does: nothing released, its
    /// node lease left to expire) and started again on the same address; its clients retry
    /// every call with its request id.
    SidecarRestart,
}

impl Kind {
    pub(crate) const ALL: [Kind; 12] = [
        Kind::LeaderKill,
        Kind::FollowerKill,
        Kind::Partition,
        Kind::LeaderMove,
        Kind::Blackhole,
        Kind::Stall,
        Kind::Blip,
        Kind::ReplyDrop,
        Kind::Revoke,
        Kind::Compaction,
        Kind::Trim,
        Kind::SidecarRestart,
    ];

    /// Faults that take the cluster or a node away for a while; one at a time, each followed
    /// by a progress check. The rest are operator actions, run alongside.
    pub(crate) fn is_outage(self) -> bool {
        !matches!(self, Kind::Revoke | Kind::Compaction | Kind::Trim)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::LeaderKill => "leader_kill",
            Kind::FollowerKill => "follower_kill",
            Kind::Partition => "partition",
            Kind::LeaderMove => "leader_move",
            Kind::Blackhole => "blackhole",
            Kind::Stall => "stall",
            Kind::Blip => "blip",
            Kind::ReplyDrop => "reply_drop",
            Kind::Revoke => "revoke",
            Kind::Compaction => "compaction",
            Kind::Trim => "trim",
            Kind::SidecarRestart => "sidecar_restart",
        }
    }
}

/// How many faults of each kind ran.
pub(crate) type Counts = BTreeMap<Kind, u64>;

/// What the faults act on.
pub(crate) struct Target<'a> {
    pub(crate) cluster: &'a EtcdCluster,
    pub(crate) nodes: &'a [Node],
    pub(crate) sessions: &'a [Uuid],
    pub(crate) admin: &'a Admin,
    pub(crate) raw: etcd_client::Client,
    pub(crate) history: &'a Arc<History>,
    pub(crate) ttl: Duration,
    /// How long replies are dropped, in seconds (drawn uniformly).
    pub(crate) reply_drop: (f64, f64),
}

fn secs(rng: &mut StdRng, from: f64, to: f64) -> Duration {
    Duration::from_secs_f64(rng.random_range(from..to))
}

impl Target<'_> {
    fn note(&self, what: String, healed: bool) {
        eprintln!(
            "campaign: {:7.2}s {} {what}",
            self.history.secs(Instant::now()),
            if healed { "heal " } else { "fault" }
        );
        self.history.note(Entry::Fault {
            at: Instant::now(),
            what,
            healed,
        });
    }

    /// Runs one outage: inject, hold, heal. Returns when it has healed, i.e. when the
    /// progress bound starts.
    pub(crate) async fn outage(&self, kind: Kind, rng: &mut StdRng) {
        let cluster = self.cluster;
        match kind {
            Kind::LeaderKill | Kind::FollowerKill => {
                let leader = cluster.leader().await.expect("a leader");
                let member = if kind == Kind::LeaderKill {
                    leader
                } else {
                    (leader + rng.random_range(1..cluster.len())) % cluster.len()
                };
                self.note(format!("{} member {member}", kind.name()), false);
                cluster.kill(member).await.expect("kill");
                sleep(secs(rng, 1.0, 4.0)).await;
                cluster.restart(member).await.expect("restart");
                self.note(format!("{} member {member} restarted", kind.name()), true);
            }
            Kind::Partition => {
                let member = rng.random_range(0..cluster.len());
                self.note(format!("partition member {member}"), false);
                cluster.partition(member).await.expect("partition");
                sleep(secs(rng, 1.0, 5.0)).await;
                cluster.heal(member).await.expect("heal");
                cluster.wait_ready(member).await.expect("caught up");
                self.note(format!("partition member {member} healed"), true);
            }
            Kind::LeaderMove => {
                let leader = cluster.leader().await.expect("a leader");
                let to = (leader + rng.random_range(1..cluster.len())) % cluster.len();
                self.note(format!("leader_move {leader} -> {to}"), false);
                cluster.move_leader(to).await.expect("move leader");
                self.note(format!("leader_move {leader} -> {to} done"), true);
            }
            Kind::Blackhole => {
                let node = &self.nodes[rng.random_range(0..self.nodes.len())];
                let hold = self.ttl + secs(rng, 0.5, 3.0);
                self.note(
                    format!("blackhole node-{} for {hold:.1?}", node.index),
                    false,
                );
                node.blackhole();
                sleep(hold).await;
                node.heal();
                self.note(format!("blackhole node-{}", node.index), true);
            }
            Kind::Stall => {
                let node = &self.nodes[rng.random_range(0..self.nodes.len())];
                let pause = secs(rng, 0.5, self.ttl.as_secs_f64() + 2.0);
                self.note(format!("stall node-{} for {pause:.1?}", node.index), false);
                node.stall(pause);
                sleep(pause).await;
                self.note(format!("stall node-{}", node.index), true);
            }
            Kind::Blip => {
                let node = &self.nodes[rng.random_range(0..self.nodes.len())];
                let hold = secs(rng, 0.1, 1.0);
                self.note(format!("blip node-{} for {hold:.1?}", node.index), false);
                node.reject();
                sleep(hold).await;
                node.heal();
                self.note(format!("blip node-{}", node.index), true);
            }
            Kind::ReplyDrop => {
                let node = &self.nodes[rng.random_range(0..self.nodes.len())];
                let hold = secs(rng, self.reply_drop.0, self.reply_drop.1);
                self.note(
                    format!("reply_drop node-{} for {hold:.1?}", node.index),
                    false,
                );
                node.drop_replies();
                sleep(hold).await;
                node.heal();
                self.note(format!("reply_drop node-{}", node.index), true);
            }
            Kind::SidecarRestart => {
                let sidecars: Vec<&Node> = self.nodes.iter().filter(|n| n.is_sidecar()).collect();
                let Some(node) = sidecars.choose(rng) else {
                    self.note("sidecar_restart: no sidecar node".to_owned(), true);
                    return;
                };
                let down = secs(rng, 0.2, 2.0);
                self.note(
                    format!(
                        "sidecar_restart node-{} killed, down {down:.1?}",
                        node.index
                    ),
                    false,
                );
                node.kill_and_restart_sidecar(down).await;
                self.note(
                    format!("sidecar_restart node-{} started again", node.index),
                    true,
                );
            }
            Kind::Revoke | Kind::Compaction | Kind::Trim => {
                unreachable!("operator actions are not outages")
            }
        }
    }

    /// Runs one operator action; `false` if there was nothing to act on (or etcd refused,
    /// e.g. during an outage): it does not count.
    pub(crate) async fn operate(&self, kind: Kind, rng: &mut StdRng) -> bool {
        let session = self.sessions[rng.random_range(0..self.sessions.len())];
        match kind {
            Kind::Revoke => self.revoke(session).await,
            Kind::Compaction => {
                let mut raw = self.raw.clone();
                let Ok(now) = raw.get("campaign-probe", None).await else {
                    return false;
                };
                let revision = now.header().map_or(0, |h| h.revision());
                let done = raw
                    .compact(revision, Some(CompactionOptions::new().with_physical()))
                    .await
                    .is_ok();
                if done {
                    self.note(format!("compaction at revision {revision}"), false);
                }
                done
            }
            Kind::Trim => {
                let Ok(info) = self.admin.journal(session).await else {
                    return false;
                };
                let Some(tip) = info.tip else { return false };
                // Keep about half of what is there.
                let before = info.base + (tip.seq - info.base) / 2;
                if before <= info.base {
                    return false;
                }
                let trimmed = self.admin.trim(session, before).await.is_ok();
                if trimmed {
                    self.note(format!("trim {session} before {before}"), false);
                }
                trimmed
            }
            _ => unreachable!("outages are not operator actions"),
        }
    }

    /// Deletes `session`'s owner key at the epoch it has, noting the revision of the delete
    /// (the checker holds every record of that epoch to have committed before it).
    async fn revoke(&self, session: Uuid) -> bool {
        let mut raw = self.raw.clone();
        let key = self.admin.namespace().owner_key(session);
        let Ok(read) = raw.get(key.as_str(), None).await else {
            return false;
        };
        let Some(owner) = read.kvs().first() else {
            return false;
        };
        let epoch = owner.create_revision();
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                epoch,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        match raw.txn(txn).await {
            Ok(reply) if reply.succeeded() => {
                let revision = reply.header().map_or(0, |h| h.revision());
                self.history.note(Entry::Revoked {
                    at: Instant::now(),
                    session,
                    epoch: leasehold::Epoch(epoch as u64),
                    revision,
                });
                self.note(format!("revoke {session} at epoch {epoch}"), false);
                true
            }
            _ => false,
        }
    }
}

/// The order of the first outages: every kind once, shuffled; then any at random.
pub(crate) fn first_outages(rng: &mut StdRng) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = Kind::ALL.into_iter().filter(|k| k.is_outage()).collect();
    kinds.shuffle(rng);
    kinds
}

pub(crate) fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}
