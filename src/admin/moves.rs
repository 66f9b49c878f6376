//! [`Admin::move_session`]: moving an owned session to another session host in one graceful
//! handover; [`Admin::move_session_to_node`] names the target by its node name.
//!
//! See [`Admin::move_session`] for the protocol.

use std::time::Duration;

use etcd_client::{KeyValue, Txn, TxnOp};
use tokio::time::Instant;
use uuid::Uuid;

use super::hosts::listed;
use super::{Admin, HostLookupError};
use crate::etcd::{Delete, EtcdError, gets};
use crate::lease::Epoch;
use crate::store::{HostValue, MoveValue, OwnerValue, ask_txn};

/// How often [`Admin::move_session`] reads the owner and move keys while it waits.
const POLL: Duration = Duration::from_millis(20);

/// A completed move.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Moved {
    /// The session.
    pub session: Uuid,
    /// The store that held it before the move (`None` for a move found done already).
    pub from: Option<Uuid>,
    /// Its epoch there.
    pub from_epoch: Epoch,
    /// The store that holds it now.
    pub to: Uuid,
    /// Its epoch there (a new acquisition: above `from_epoch`).
    pub epoch: Epoch,
    /// The target held it already: nothing was written.
    pub already: bool,
}

/// A move was refused, or did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MoveError {
    /// The session has no owner: there is nothing to move (a host that wants it takes it).
    /// Nothing was written. Permanent until someone owns it.
    #[error("session {session} has no owner: nothing to move")]
    NotOwned {
        /// The session.
        session: Uuid,
    },
    /// No live session host has that store id. Nothing was written.
    #[error("no live session host with store {store}")]
    NotLive {
        /// The target store.
        store: Uuid,
    },
    /// The target is draining, or has a weight of 0: it takes no sessions. Nothing was
    /// written.
    #[error("the session host of store {store} takes no sessions (draining, or weight 0)")]
    TakesNone {
        /// The target store.
        store: Uuid,
    },
    /// Another move of the session is under way. Nothing was written. Transient: it ends when
    /// that move completes or is withdrawn.
    #[error("session {session} is already being moved to store {target}")]
    UnderWay {
        /// The session.
        session: Uuid,
        /// The store that move goes to.
        target: Uuid,
    },
    /// The owner or the target changed between the read and the write (a handover, a host
    /// that left or started draining). Nothing was written. Transient: asking again reads
    /// them anew.
    #[error("session {session} or its target changed while the move was asked for; ask again")]
    Changed {
        /// The session.
        session: Uuid,
    },
    /// The target withdrew the move before taking the session: it does not host the session,
    /// is at its maximum, drains, or is leaving. The session stays where it is.
    #[error("the session host of store {target} refused to take session {session}")]
    Refused {
        /// The session.
        session: Uuid,
        /// The target store.
        target: Uuid,
    },
    /// The move did not complete within the wait and was withdrawn (its key deleted); the
    /// session is wherever it was then. `ready` says whether the target had said it stands by
    /// (if so, the holder did not give the session up: a bare store, or a host of a release
    /// before moves).
    #[error("the move of session {session} to store {target} did not complete within {waited:?}")]
    TimedOut {
        /// The session.
        session: Uuid,
        /// The target store.
        target: Uuid,
        /// Whether the target had said it stands by.
        ready: bool,
        /// How long it was waited for.
        waited: Duration,
    },
    /// No live session host has that node name. Nothing was written. Permanent until such a
    /// host registers.
    #[error("no live session host named {node:?}")]
    NoSuchHost {
        /// The target node name.
        node: String,
    },
    /// Several live session hosts have that node name: name the target by its store id
    /// ([`move_session`](Admin::move_session)). Nothing was written.
    #[error(
        "{} live session hosts are named {node:?}: name the target by its store id ({})",
        .stores.len(),
        listed(.stores)
    )]
    Ambiguous {
        /// The target node name.
        node: String,
        /// The store ids of the hosts with that name, in order.
        stores: Vec<Uuid>,
    },
    /// etcd failed; the move may or may not have been asked for. Asking again is safe (a move
    /// under way is reported as such).
    #[error("the move request failed")]
    Etcd(#[source] EtcdError),
}

impl MoveError {
    /// Whether asking again may succeed without anything else changing first.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            MoveError::UnderWay { .. } | MoveError::Changed { .. } | MoveError::Etcd(_)
        )
    }
}

impl From<EtcdError> for MoveError {
    fn from(error: EtcdError) -> Self {
        MoveError::Etcd(error)
    }
}

impl From<HostLookupError> for MoveError {
    fn from(error: HostLookupError) -> Self {
        match error {
            HostLookupError::NoSuchHost { node } => MoveError::NoSuchHost { node },
            HostLookupError::Ambiguous { node, stores } => MoveError::Ambiguous { node, stores },
            HostLookupError::Etcd(error) => MoveError::Etcd(error),
        }
    }
}

impl Admin {
    /// Moves `session` to the session host of store `target` in one graceful handover, waiting
    /// at most `wait` for it to complete.
    ///
    /// A move is a key `{ns}/moves/{session}` attached to the target host's node lease (so it goes
    /// with the target's store), in three steps:
    ///
    /// 1. the admin reads the owner key, the target's host key, its drain key and the move key in
    ///    one transaction, checks them (the session is owned, by another store; the target is live,
    ///    not draining, of a weight above 0; no move of the session is under way) and writes the
    ///    move as *asked*, `if create_revision(owner) == epoch && lease(host) == as read &&
    ///    mod_revision(host) == as read && create_revision(drain) == 0 && create_revision(move) ==
    ///    0 then put(move, asked, lease = the host's lease)`;
    /// 2. the target host reads it at its next balance tick and, if it hosts the session and has
    ///    room below its maximum, rewrites it as *ready* (its standby on the session is already
    ///    waiting); otherwise it deletes it, which refuses the move;
    /// 3. the holder's host reads the ready move at its next balance tick and gives the session up
    ///    in order (last append, workspace root, lease). The owner key's delete wakes the target's
    ///    standby, whose acquisition compares the move key as it read it and deletes it in the
    ///    same transaction.
    ///
    /// From step 1 until the move key is gone, every acquisition of the session by another store
    /// fails its compare ([`AcquireError::Moving`](crate::AcquireError::Moving)), so no third node
    /// takes the session in between: the move is one handover, from the holder straight to the
    /// target. Hosts of releases before moves neither compare nor read the key: a fleet moves
    /// sessions once every host runs a release that does.
    ///
    /// The admin polls the owner and move keys until the target owns the session, the move key is
    /// gone without that (refused), or its wait runs out; then it deletes the move key, guarded by
    /// its create revision (its own), so the session is free for anyone again. A move whose admin
    /// died is withdrawn by the target host itself after
    /// [`MOVE_WITHDRAWN_AFTER`](crate::store::MOVE_WITHDRAWN_AFTER).
    ///
    /// The target keeps the moved session: if that takes it over its share, it gives one of its
    /// other sessions up, which a host with room (usually the one the session left) takes. So the
    /// balance holds, and the moved session stays where it was moved.
    pub async fn move_session(
        &self,
        session: Uuid,
        target: Uuid,
        wait: Duration,
    ) -> Result<Moved, MoveError> {
        let keys = MoveKeys::new(self, session, target);
        let plan = match self.plan_move(&keys).await? {
            Planned::Move(plan) => plan,
            Planned::Done(moved) => return Ok(moved),
        };
        let created = self.ask_move(&keys, &plan).await?;
        tracing::info!(%session, %target, "move asked for");
        let ready = match self.await_move(&keys, created, wait).await? {
            Awaited::Owned(epoch) => return Ok(plan.moved(epoch)),
            Awaited::TimedOut { ready } => ready,
        };
        if let Some(epoch) = self.withdraw_move(&keys, created).await? {
            return Ok(plan.moved(epoch));
        }
        Err(MoveError::TimedOut {
            session,
            target,
            ready,
            waited: wait,
        })
    }

    /// [`move_session`](Self::move_session) to the one live session host named `node` (see
    /// [`host_named`](Self::host_named)), waiting at most `wait`.
    /// [`NoSuchHost`](MoveError::NoSuchHost) or [`Ambiguous`](MoveError::Ambiguous) when the
    /// name does not name exactly one host; then nothing was written. The target's store id is
    /// the [`Moved::to`] of the move.
    pub async fn move_session_to_node(
        &self,
        session: Uuid,
        node: &str,
        wait: Duration,
    ) -> Result<Moved, MoveError> {
        let target = self.host_named(node).await?;
        self.move_session(session, target.store, wait).await
    }

    /// Step 1's read and checks: the owner, the target's host key and drain key, a move under
    /// way.
    async fn plan_move(&self, keys: &MoveKeys) -> Result<Planned, MoveError> {
        let (session, target) = (keys.session, keys.target);
        let all = [&keys.owner, &keys.host, &keys.drain, &keys.moving];
        let read = Txn::new().and_then(all.map(|key| TxnOp::get(key.as_str(), None)));
        let read = self
            .connection
            .read("move", |mut client: etcd_client::KvClient, _| {
                let read = read.clone();
                async move { client.txn(read).await }
            })
            .await?;
        let [owner, host, drain, moving] = read_four(&read);
        let owner = owner.ok_or(MoveError::NotOwned { session })?;
        let from = OwnerValue::decode(owner.value()).map(|value| value.store);
        let from_epoch = Epoch::from_revision(owner.create_revision());
        if from == Some(target) {
            return Ok(Planned::Done(Moved {
                session,
                from,
                from_epoch,
                to: target,
                epoch: from_epoch,
                already: true,
            }));
        }
        let host = host.ok_or(MoveError::NotLive { store: target })?;
        let quota = HostValue::decode(host.value());
        if drain.is_some() || quota.max == Some(0) || quota.weight == 0 {
            return Err(MoveError::TakesNone { store: target });
        }
        if let Some(moving) = moving {
            let target = MoveValue::decode(moving.value()).map_or(Uuid::nil(), |m| m.target);
            return Err(MoveError::UnderWay { session, target });
        }
        Ok(Planned::Move(Plan {
            session,
            target,
            from,
            from_epoch,
            owner,
            host,
        }))
    }

    /// Step 1's write: the move key, on the target's node lease, while all that `plan` read
    /// still holds. Its create revision.
    async fn ask_move(&self, keys: &MoveKeys, plan: &Plan) -> Result<i64, MoveError> {
        let host = &plan.host;
        let asked = MoveValue {
            target: keys.target,
            nonce: Uuid::now_v7(),
            ready: false,
        }
        .encode();
        let txn = ask_txn(
            &self.namespace,
            keys.session,
            plan.owner.create_revision(),
            keys.target,
            (host.lease(), host.mod_revision()),
            &asked,
        );
        let reply = self.send_idempotent("move", &txn).await?;
        if reply.succeeded() {
            return Ok(reply.header().map_or(0, |header| header.revision()));
        }
        // A re-send of ours whose first send committed finds our own key.
        match gets(&reply).next().flatten() {
            Some(kv) if kv.value() == asked.as_bytes() => Ok(kv.create_revision()),
            _ => Err(MoveError::Changed {
                session: keys.session,
            }),
        }
    }

    /// Waits until the target owns the session (its epoch there), the move key created at
    /// `created` went without that (refused), or `wait` ran out.
    async fn await_move(
        &self,
        keys: &MoveKeys,
        created: i64,
        wait: Duration,
    ) -> Result<Awaited, MoveError> {
        let until = Instant::now().checked_add(wait);
        let poll = Txn::new().and_then([
            TxnOp::get(keys.owner.as_str(), None),
            TxnOp::get(keys.moving.as_str(), None),
        ]);
        let mut ready = false;
        loop {
            let read = self
                .connection
                .read("move", |mut client: etcd_client::KvClient, _| {
                    let poll = poll.clone();
                    async move { client.txn(poll).await }
                })
                .await;
            if let Ok(read) = read {
                let mut got = gets(&read);
                let (owner, moving) = (got.next().flatten(), got.next().flatten());
                if let Some(owner) = &owner
                    && OwnerValue::decode(owner.value()).is_some_and(|v| v.store == keys.target)
                {
                    return Ok(Awaited::Owned(Epoch::from_revision(
                        owner.create_revision(),
                    )));
                }
                match moving.filter(|kv| kv.create_revision() == created) {
                    Some(kv) => ready |= MoveValue::decode(kv.value()).is_some_and(|m| m.ready),
                    None => {
                        return Err(MoveError::Refused {
                            session: keys.session,
                            target: keys.target,
                        });
                    }
                }
            }
            if until.is_some_and(|until| Instant::now() >= until) {
                return Ok(Awaited::TimedOut { ready });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Withdraws a move that timed out, so that the session is free for anyone again; the
    /// session's epoch at the target if the target took it all the same, between the last
    /// read and the withdrawal.
    async fn withdraw_move(
        &self,
        keys: &MoveKeys,
        created: i64,
    ) -> Result<Option<Epoch>, MoveError> {
        // A delete whose outcome stays unknown is left to the target, which withdraws its
        // moves after `MOVE_WITHDRAWN_AFTER`.
        let withdraw = Delete::created_at(keys.moving.as_str(), created).txn();
        if let Err(error) = self.send_idempotent("withdraw move", &withdraw).await {
            let session = keys.session;
            tracing::warn!(%session, %error, "the move's withdrawal is left to its target");
        }
        let owner = self.owner(keys.session).await?;
        Ok(owner
            .filter(|owner| owner.store == Some(keys.target))
            .map(|owner| owner.epoch))
    }
}

/// The four gets of the move's read, in order.
fn read_four(read: &etcd_client::TxnResponse) -> [Option<KeyValue>; 4] {
    let mut got = gets(read);
    std::array::from_fn(|_| got.next().flatten())
}

/// The keys a move reads and writes.
struct MoveKeys {
    session: Uuid,
    target: Uuid,
    owner: String,
    host: String,
    drain: String,
    moving: String,
}

impl MoveKeys {
    fn new(admin: &Admin, session: Uuid, target: Uuid) -> Self {
        let namespace = &admin.namespace;
        Self {
            session,
            target,
            owner: namespace.owner_key(session),
            host: namespace.host_key(target),
            drain: namespace.drain_key(target),
            moving: namespace.move_key(session),
        }
    }
}

/// What step 1's read found: a move to ask for, or one done already.
enum Planned {
    Move(Plan),
    Done(Moved),
}

/// A move step 1's read allows: the owner key and the target's host key as read.
struct Plan {
    session: Uuid,
    target: Uuid,
    from: Option<Uuid>,
    from_epoch: Epoch,
    owner: KeyValue,
    host: KeyValue,
}

impl Plan {
    /// The move, done: the target holds the session at `epoch`.
    fn moved(&self, epoch: Epoch) -> Moved {
        Moved {
            session: self.session,
            from: self.from,
            from_epoch: self.from_epoch,
            to: self.target,
            epoch,
            already: false,
        }
    }
}

/// What waiting for the target came to.
enum Awaited {
    /// The target owns the session, at this epoch.
    Owned(Epoch),
    /// The wait ran out; whether the target had said it was ready.
    TimedOut { ready: bool },
}
