//! Moves ([`Admin::move_session`](crate::Admin::move_session), whose docs give the whole
//! protocol): at every balance tick a host reads the move keys with the host keys and plays its
//! part in each that concerns it:
//!
//! - a move **to** this host, *asked*: if the host hosts the session, is not draining, has a
//!   weight above 0 and room below its maximum, it rewrites the key as *ready* (its standby on
//!   the session is already waiting); otherwise it deletes the key, which refuses the move. The
//!   session's task may then take a slot over the host's share for it, and acquires it with
//!   the move's compare, which deletes the key. A move to this host still there after
//!   [`MOVE_WITHDRAWN_AFTER`] is withdrawn, as are all of them when the host leaves;
//! - a move **from** this host to another, *ready*: the session is given up in order
//!   ([`GiveUp::Moved`](super::GiveUp::Moved)); its task then stands by, its acquisitions
//!   refused while the move lasts.
//!
//! A session acquired through a move is kept when the host is over its share: the others
//! are shed first.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use tokio::time::Instant;
use uuid::Uuid;

use super::{Inner, leave_bound, lock};
use crate::etcd::Delete;
use crate::etcd::write::{self, WritePolicy, Written};
use crate::keys::id_under;
use crate::store::{MOVE_WITHDRAWN_AFTER, MoveValue};

/// Whether a write of the balance loop may go on: for three write attempts
/// ([`leave_bound`]), so that etcd being out of reach does not hold the loop up.
fn bounded(policy: &WritePolicy) -> impl Fn() -> bool + use<> {
    let until = Instant::now().checked_add(leave_bound(policy));
    move || until.is_none_or(|until| Instant::now() < until)
}

impl Inner {
    /// Sends a write of the balance loop (`operation`: what it is, for the logs), for at most
    /// three write attempts ([`bounded`]).
    pub(super) async fn write_bounded(&self, operation: &'static str, txn: &Txn) -> Written {
        let shared = self.store.shared();
        write::send(
            &shared.connection,
            &shared.write,
            operation,
            txn,
            None,
            bounded(&shared.write),
            &shared.shutdown,
        )
        .await
    }
}

/// A move to this host that it said it is ready for.
#[derive(Clone, Copy, Debug)]
pub(super) struct MoveIn {
    /// The move key's create revision (the admin's put) and mod revision (as read, or as this
    /// host's rewrite left it).
    pub(super) create_revision: i64,
    pub(super) mod_revision: i64,
    /// When this host first read it.
    pub(super) seen: Instant,
}

/// A move key as read: its session, value and key-value.
pub(super) struct Listed {
    session: Uuid,
    value: MoveValue,
    kv: KeyValue,
}

/// The move keys of a read of `{ns}/moves/`; keys that are not a session's move, or values
/// this release does not read, are skipped.
pub(super) fn listed(prefix: &str, kvs: &[KeyValue]) -> Vec<Listed> {
    kvs.iter()
        .filter_map(|kv| {
            Some(Listed {
                session: id_under(prefix, kv.key())?,
                value: MoveValue::decode(kv.value())?,
                kv: kv.clone(),
            })
        })
        .collect()
}

impl Inner {
    /// Plays this host's part in the moves read at this tick (see the module docs).
    pub(super) async fn follow_moves(&self, moves: Vec<Listed>) {
        let me = self.store.id();
        let mut seen_now = HashMap::new();
        let (mut said_ready, mut moving_out) = (Vec::new(), HashSet::new());
        for listed in moves {
            let Listed { session, value, kv } = listed;
            if value.target != me {
                moving_out.insert(session);
                if value.ready {
                    self.hand_over(session, value.target);
                }
                continue;
            }
            let first_seen = lock(&self.moves)
                .get(&session)
                .filter(|known| known.create_revision == kv.create_revision())
                .map(|known| known.seen);
            let seen = first_seen.unwrap_or_else(Instant::now);
            if let Some(why) = self.refuse_move(session, seen) {
                tracing::info!(%session, why, "move to this host withdrawn");
                self.delete_move(
                    session,
                    Delete::created_at(
                        self.store.namespace().move_key(session),
                        kv.create_revision(),
                    ),
                )
                .await;
                continue;
            }
            let mut mod_revision = kv.mod_revision();
            if !value.ready {
                let ready = MoveValue {
                    ready: true,
                    ..value
                };
                match self.say_ready(session, &kv, &ready).await {
                    Some(revision) => mod_revision = revision,
                    // Not confirmed: read again at the next tick.
                    None => continue,
                }
                tracing::info!(%session, "standing by to take a session moved here");
                said_ready.push(session);
            }
            seen_now.insert(
                session,
                MoveIn {
                    create_revision: kv.create_revision(),
                    mod_revision,
                    seen,
                },
            );
        }
        *lock(&self.moves) = seen_now;
        *lock(&self.moving_out) = moving_out;
        // A session freed before this host said it was ready (its holder shed it, or lost it)
        // has no delete to come that would wake its standby here: wake it now.
        let registry = self.store.shared().registry();
        for session in said_ready {
            registry.notify_waiters(session);
        }
    }

    /// Why this host cannot take `session` by a move first read at `seen`, if it cannot.
    fn refuse_move(&self, session: Uuid, seen: Instant) -> Option<&'static str> {
        if lock(&self.owned).contains_key(&session) {
            return Some("held here already");
        }
        if !lock(&self.wanted).contains_key(&session) {
            return Some("not hosted here");
        }
        if self.is_draining() || self.host_value.weight == 0 {
            return Some("this host takes no sessions");
        }
        if self
            .options
            .max_sessions
            .is_some_and(|max| self.slots.load(Ordering::Acquire) >= max)
        {
            return Some("this host is at its maximum");
        }
        if seen.elapsed() >= MOVE_WITHDRAWN_AFTER {
            return Some("not completed in time");
        }
        None
    }

    /// Rewrites a move to this host as ready, if it is still as read: the revision of the
    /// rewrite, once a reply confirms it (within three write attempts, so the balance loop is
    /// not held up; the next tick reads the move again).
    async fn say_ready(&self, session: Uuid, kv: &KeyValue, ready: &MoveValue) -> Option<i64> {
        let key = self.store.namespace().move_key(session);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::put(
                key.as_str(),
                ready.encode(),
                Some(PutOptions::new().with_lease(kv.lease())),
            )]);
        match self.write_bounded("move ready", &txn).await {
            Written::Replied(reply) if reply.succeeded() => reply.header().map(|h| h.revision()),
            _ => None,
        }
    }

    /// Deletes a move key (to this host) as `delete` guards it; a delete that does not go
    /// through (within three write attempts) is tried again at the next tick, or goes with the
    /// node lease.
    async fn delete_move(&self, session: Uuid, delete: Delete) {
        lock(&self.moves).remove(&session);
        let written = self.write_bounded("withdraw move", &delete.txn()).await;
        if !matches!(written, Written::Replied(_)) {
            tracing::debug!(%session, "a move's withdrawal was not confirmed");
        }
    }

    /// Withdraws every move to this host (it is leaving).
    pub(super) async fn withdraw_moves(&self) {
        let moves: Vec<(Uuid, MoveIn)> = lock(&self.moves).drain().collect();
        for (session, known) in moves {
            let key = self.store.namespace().move_key(session);
            self.delete_move(session, Delete::created_at(key, known.create_revision))
                .await;
        }
    }

    /// Asks for a move by load (step 1 of [`Admin::move_session`](crate::Admin::move_session),
    /// made by the holder itself): `planned.session`, owned here at `epoch` (its owner key's
    /// create revision), to the host whose key was read with `host_key` (its lease and mod
    /// revision). The target and this host then play their parts at their next ticks, as for
    /// any move. Whether a reply confirmed the move key (within three write attempts).
    pub(super) async fn ask_move(
        &self,
        planned: super::load::Move,
        epoch: i64,
        host_key: (i64, i64),
    ) -> bool {
        let asked = MoveValue {
            target: planned.to,
            nonce: Uuid::now_v7(),
            ready: false,
        }
        .encode();
        let txn = crate::store::ask_txn(
            self.store.namespace(),
            planned.session,
            epoch,
            planned.to,
            host_key,
            &asked,
        );
        let written = self.write_bounded("move by load", &txn).await;
        let asked_now = matches!(&written, Written::Replied(reply) if reply.succeeded());
        if asked_now {
            tracing::info!(
                session = %planned.session,
                load = planned.load,
                target = %planned.to,
                "moving a session by load"
            );
        }
        asked_now
    }

    /// Gives `session` up in order if this host holds it: it moves to `target`.
    fn hand_over(&self, session: Uuid, target: Uuid) {
        if let Some(owned) = lock(&self.owned).get(&session)
            && !owned.is_shed()
        {
            tracing::info!(%session, %target, "handing a session over to its move's target");
            owned.shed(Some(target));
        }
    }

    /// The `mod_revision` of a move of `session` to this host that it said it is ready for,
    /// if there is one: its acquisition compares it.
    pub(super) fn moved_here(&self, session: Uuid) -> Option<i64> {
        lock(&self.moves)
            .get(&session)
            .map(|known| known.mod_revision)
    }

    /// Takes a slot for a session moved here, over the share if need be, up to the host's
    /// maximum.
    pub(super) fn reserve_moved(&self, session: Uuid) -> bool {
        if self.moved_here(session).is_none() || self.is_draining() {
            return false;
        }
        let max = self.options.max_sessions.unwrap_or(usize::MAX);
        self.slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < max).then_some(held + 1)
            })
            .is_ok()
    }
}
