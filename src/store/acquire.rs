//! The acquire protocol.
//!
//! One transaction: `if create_revision(owner) == 0 && create_revision(move) == 0 then put(owner,
//! value, lease = node lease), get(tip) else get(owner), get(move)`, sent through the crate's one
//! write path and re-sent while the node lease is valid (`move` is the session's move key,
//! `{ns}/moves/{session}`, which exists only while [`Admin::move_session`] moves it). The
//! acquisitions (and workspace roots and guarded deletes) a store has ready at once share an
//! etcd transaction, each as an operation of its own with its own compares (`etcd::shared`):
//! sessions acquired together may have one epoch, which is still each one's owner key's
//! `create_revision`, greater than every earlier epoch of that session. What it came to:
//!
//! - applied: the epoch is the reply's revision (the key's `create_revision`), and the tip read
//!   in the same transaction is kept for the journal's open, which fences at it without
//!   reading it again (see [`SeenTip`]);
//! - compare failed: the `else` branch read the owner key. Our store id and nonce mean an
//!   earlier send committed: adopt it. Anything else: [`LeaseHeldError`] with the holder's
//!   epoch;
//! - compare failed on the move key alone: the session is free but being moved. To another
//!   store: [`AcquireError::Moving`], and no store but the target's can take it until the move
//!   ends. To this store: sent again as the move's own acquisition, `if create_revision(owner) ==
//!   0 && mod_revision(move) == as read then put(owner, …), get(tip), delete(move)`, so the
//!   move ends with the acquisition that completes it (the session host sends that one first,
//!   from the move it read);
//! - unknown until the node lease stopped being valid: one read of the owner key settles it the
//!   same way, or leaves it unknown when the key is absent (a late commit is then found by the
//!   watch as a key nobody adopted, and deleted).
//!
//! The acquisition is registered with the registry while it is under way, so watch events for
//! its session that arrive before it returns still apply to the lease it returns. A lease that
//! was lost meanwhile is not handed out: the caller gets [`AcquireError::Lost`].
//!
//! [`Admin::move_session`]: crate::Admin::move_session

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnResponse};
use uuid::Uuid;

use super::owner_value::OwnerValue;
use super::{MoveValue, StoreShared};
use crate::etcd::write::Written;
use crate::etcd::{EtcdError, gets};
use crate::lease::{Epoch, Lease, LeaseState, LossReason, NodeLease};
use crate::metrics::Put;
use crate::store::{AcquireError, LeaseHeldError};

/// An acquisition under way, registered so that watch events for its session are kept for it.
/// Ends its registration also if the acquisition is dropped or panics.
struct Acquiring<'a> {
    shared: &'a StoreShared,
    session: Uuid,
    ended: bool,
}

impl<'a> Acquiring<'a> {
    fn begin(shared: &'a StoreShared, session: Uuid) -> Self {
        shared.registry().begin_acquire(session);
        Self {
            shared,
            session,
            ended: false,
        }
    }

    fn end(mut self, lease: Option<&Arc<LeaseState>>) {
        self.ended = true;
        self.finish(lease);
    }

    fn finish(&self, lease: Option<&Arc<LeaseState>>) {
        let orphans = self.shared.registry().end_acquire(self.session, lease);
        for orphan in orphans {
            self.shared.delete_orphan(orphan);
        }
    }
}

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.finish(None);
        }
    }
}

/// Whether an acquired lease may be handed out: never one that was lost while it was being
/// registered (the watch saw its key deleted or overtaken, or its node lease was lost).
fn hand_out(loss: Option<LossReason>) -> Result<(), AcquireError> {
    match loss {
        None => Ok(()),
        Some(LossReason::StoreClosed) => Err(AcquireError::StoreClosed),
        Some(LossReason::Expired | LossReason::KeepaliveFailed) => {
            Err(AcquireError::NodeLeaseInvalid)
        }
        Some(reason) => Err(AcquireError::Lost(reason)),
    }
}

impl StoreShared {
    /// Acquires `session`; `moved`: the `mod_revision` of a move of it to this store, as read,
    /// which the first send compares (and deletes) instead of comparing that there is none.
    /// With `registered`, only while the session is in the registry (`{ns}/sessions/`): the
    /// transaction compares that its key exists.
    pub(super) async fn acquire(
        self: Arc<Self>,
        session: Uuid,
        moved: Option<i64>,
        registered: bool,
    ) -> Result<Lease, AcquireError> {
        let metrics = self.metrics.clone();
        let gate = moved.map_or(Gate::NoMove, |mod_revision| Gate::Move { mod_revision });
        let acquired = self.acquire_once(session, gate, registered).await;
        match &acquired {
            Ok(lease) => lease.state().count_held(&metrics),
            Err(AcquireError::Held(_) | AcquireError::Moving { .. }) => metrics.acquisition("held"),
            Err(_) => metrics.acquisition("failed"),
        }
        acquired
    }

    async fn acquire_once(
        self: Arc<Self>,
        session: Uuid,
        mut gate: Gate,
        registered: bool,
    ) -> Result<Lease, AcquireError> {
        // The store's user may not see its namespace: permanent (see the owner watch).
        self.refused()?;
        let node = self
            .current_node()
            .filter(|node| node.is_valid())
            .ok_or(AcquireError::NodeLeaseInvalid)?;
        let key = self.namespace.owner_key(session);
        let nonce = Uuid::now_v7();
        let acquiring = Acquiring::begin(&self, session);
        // A move found in the way changes the compare; a session whose move keeps changing
        // under the acquisition is reported as moving, not chased.
        let mut chase = Chase::default();
        let outcome = loop {
            let written = self
                .send_acquire(session, nonce, &node, gate, registered)
                .await;
            match self.settle(session, nonce, gate, registered, written) {
                Ok(acquired) => break Ok(acquired),
                Err(Settled::Failed(error)) => break Err(error),
                Err(Settled::Gate(next)) => match chase.again(next, session, self.id) {
                    Ok(next) => gate = next,
                    Err(moving) => break Err(moving),
                },
            }
        };
        let state = outcome.as_ref().ok().map(|(epoch, seen)| {
            let state = LeaseState::new(session, *epoch, key.clone(), nonce, node.clone());
            if let Some(seen) = seen {
                state.set_seen_tip(seen.clone());
            }
            state
        });
        acquiring.end(state.as_ref());
        let (epoch, state) = match (outcome, state) {
            (Ok((epoch, _)), Some(state)) => (epoch, state),
            (Err(error), _) => return Err(error),
            (Ok(_), None) => unreachable!("a state is made for every epoch"),
        };
        let lease = Lease::new(state, self.clone());
        // Lost while it was being registered: the lease is dropped here, which releases it.
        if let Err(error) = hand_out(lease.loss_reason()) {
            self.refused()?;
            return Err(error);
        }
        tracing::debug!(%session, %epoch, "acquired");
        Ok(lease)
    }

    /// Sends the acquire transaction (see the module docs) through the one write path;
    /// `gate` says what it compares of the session's move key; with `registered`, it also
    /// compares that the session's registry key exists.
    async fn send_acquire(
        &self,
        session: Uuid,
        nonce: Uuid,
        node: &Arc<NodeLease>,
        gate: Gate,
        registered: bool,
    ) -> Written {
        let key = self.namespace.owner_key(session);
        let tip_key = self.namespace.tip_key(session);
        let move_key = self.namespace.move_key(session);
        let value = self.owner_value(nonce);
        let owner_absent = Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
        let put = TxnOp::put(
            key.as_str(),
            value,
            Some(PutOptions::new().with_lease(node.id)),
        );
        let get_tip = TxnOp::get(tip_key.as_str(), None);
        let session_key = self.namespace.session_key(session);
        let mut compares = vec![owner_absent];
        let mut otherwise = vec![
            TxnOp::get(key.as_str(), None),
            TxnOp::get(move_key.as_str(), None),
        ];
        if registered {
            compares.push(Compare::create_revision(
                session_key.as_str(),
                CompareOp::Greater,
                0,
            ));
            otherwise.push(TxnOp::get(session_key.as_str(), None));
        }
        let txn = match gate {
            // No move under way.
            Gate::NoMove => {
                compares.push(Compare::create_revision(
                    move_key.as_str(),
                    CompareOp::Equal,
                    0,
                ));
                Txn::new().when(compares).and_then([put, get_tip])
            }
            // The move to this store, as read: it ends with this acquisition.
            Gate::Move { mod_revision } => {
                compares.push(Compare::mod_revision(
                    move_key.as_str(),
                    CompareOp::Equal,
                    mod_revision,
                ));
                Txn::new().when(compares).and_then([
                    put,
                    get_tip,
                    TxnOp::delete(move_key.as_str(), None),
                ])
            }
        }
        .or_else(otherwise);
        let resolve = Txn::new().and_then([TxnOp::get(key.as_str(), None)]);
        // Shared with the store's other acquisitions and lifecycle writes ready at once, each
        // with its own compares (see `etcd::shared`).
        let node = node.clone();
        let written = self
            .shared_writes
            .send("acquire", key, txn, Some(resolve), move || node.is_valid())
            .await;
        match &written {
            // The acquire transaction puts: etcd answered it (applied, or its compare failed),
            // which it does only while it accepts puts.
            Written::Replied(_) => self.metrics.written(Put::Accepted),
            // Applied or not, etcd refuses puts now.
            Written::Refused { .. } => self.metrics.written(Put::RefusedForSpace),
            // Refused otherwise (a refusal for space is `Refused`), or a read settled it, or
            // nothing did: the next write says.
            Written::Failed(_) | Written::Resolved { .. } | Written::Unknown(_) => {}
        }
        written
    }

    /// The owner watch's refusal, if etcd denied the store's user the owner keys.
    fn refused(&self) -> Result<(), AcquireError> {
        match self.refusal.error() {
            Some(denied) => Err(AcquireError::Etcd(denied.clone())),
            None => Ok(()),
        }
    }

    /// Reads what the acquisition came to (see the module docs): the epoch, and the tip when
    /// this send's own transaction read it (an adopted earlier send did not, for us); or a
    /// move of the session under way, to this store or another.
    fn settle(
        &self,
        session: Uuid,
        nonce: Uuid,
        gate: Gate,
        registered: bool,
        written: Written,
    ) -> Result<(Epoch, Option<Option<KeyValue>>), Settled> {
        let holder = |response: &TxnResponse| gets(response).next().flatten();
        let adopted = |epoch| (epoch, None);
        match written {
            Written::Replied(response) if response.succeeded() => {
                let epoch = Epoch(response.header().map_or(0, |h| h.revision()).max(0) as u64);
                // The tip as read, `None` inside when there is none.
                Ok((epoch, gets(&response).next()))
            }
            Written::Replied(response) => {
                if let Some(holder) = holder(&response) {
                    return Ok(adopted(self.adopt_or_held(session, nonce, &holder)?));
                }
                // Not held, and not in the registry: finished (or never registered).
                if registered && gets(&response).nth(2).flatten().is_none() {
                    return Err(AcquireError::NotRegistered {
                        session_id: session,
                    }
                    .into());
                }
                // Not held: the move key failed the compare.
                let moving = gets(&response).nth(1).flatten().map(|moving| InTheWay {
                    target: MoveValue::decode(moving.value()).map(|value| value.target),
                    mod_revision: moving.mod_revision(),
                });
                Err(in_the_way(self.id, session, gate, moving))
            }
            Written::Resolved { read, unknown } => match holder(&read) {
                Some(holder) => Ok(adopted(self.adopt_or_held(session, nonce, &holder)?)),
                None => Err(AcquireError::OutcomeUnknown(unknown).into()),
            },
            // Refused for space: final, though etcd answers so the transaction that took it
            // past its quota after applying it. The read after it says which: ours, adopt it;
            // none, it never applied and never will.
            Written::Refused {
                error,
                read: Some(read),
            } => match holder(&read) {
                Some(holder) => Ok(adopted(self.adopt_or_held(session, nonce, &holder)?)),
                None => Err(AcquireError::Etcd(error).into()),
            },
            Written::Refused { error, read: None } | Written::Unknown(error) => {
                Err(AcquireError::OutcomeUnknown(error).into())
            }
            // The node lease was replaced between the check and the transaction.
            Written::Failed(error) if error.is_lease_not_found() => {
                Err(AcquireError::NodeLeaseInvalid.into())
            }
            Written::Failed(error) => Err(AcquireError::Etcd(error).into()),
        }
    }

    /// Our nonce: an earlier send of this acquisition committed, adopt it. Else it is held.
    fn adopt_or_held(
        &self,
        session: Uuid,
        nonce: Uuid,
        holder: &KeyValue,
    ) -> Result<Epoch, Settled> {
        let epoch = Epoch(holder.create_revision().max(0) as u64);
        if OwnerValue::decode(holder.value())
            .is_some_and(|owner| owner.store == self.id && owner.nonce == nonce)
        {
            return Ok(epoch);
        }
        Err(Settled::Failed(AcquireError::Held(LeaseHeldError {
            session_id: session,
            holder_epoch: epoch,
        })))
    }
}

/// What an acquire transaction compares of the session's move key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// That there is none.
    NoMove,
    /// That the move to this store is as read (its `mod_revision`); the transaction deletes it.
    Move { mod_revision: i64 },
}

/// The session's move key as the `else` branch of a send read it, when the session was free.
struct InTheWay {
    /// The store it moves to; `None`: a value this release does not read, which names no
    /// store of it.
    target: Option<Uuid>,
    mod_revision: i64,
}

/// What a send whose compare failed with the session free comes to (store `id`, acquiring
/// `session` with `gate`): the move key in the way (`None`: there is none). A move to this
/// store: sent again in its name. To another: [`AcquireError::Moving`]. No move key while the
/// send compared one: the move ended (the admin withdrew it), sent again comparing that there
/// is none.
fn in_the_way(id: Uuid, session: Uuid, gate: Gate, moving: Option<InTheWay>) -> Settled {
    match moving {
        Some(InTheWay {
            target: Some(target),
            mod_revision,
        }) if target == id => Settled::Gate(Gate::Move { mod_revision }),
        Some(InTheWay { target, .. }) => Settled::Failed(AcquireError::Moving {
            session_id: session,
            target: target.unwrap_or(Uuid::nil()),
        }),
        None if gate != Gate::NoMove => Settled::Gate(Gate::NoMove),
        // The compare saw a key that the get, in the same transaction, did not: etcd never
        // does this. Report it rather than guess.
        None => Settled::Failed(AcquireError::Etcd(EtcdError::new(
            "acquire",
            "(txn)",
            etcd_client::Error::Internal("a compared key vanished inside a txn".into()),
        ))),
    }
}

/// How many times one acquisition is sent again because the move key was not as it compared:
/// a move that keeps changing under it is reported, not chased for ever.
#[derive(Default)]
struct Chase {
    resent: u32,
}

impl Chase {
    /// At most this many sends in all.
    const SENDS: u32 = 3;

    /// After a send of store `id`'s acquisition of `session` that met the move key not as it
    /// compared: the gate it is sent again with (`next`, counted), or, once the move changed
    /// under every send, [`AcquireError::Moving`] to this store.
    fn again(&mut self, next: Gate, session: Uuid, id: Uuid) -> Result<Gate, AcquireError> {
        if self.resent + 1 < Self::SENDS {
            self.resent += 1;
            Ok(next)
        } else {
            Err(AcquireError::Moving {
                session_id: session,
                target: id,
            })
        }
    }
}

/// An acquisition that did not come to an epoch.
#[derive(Debug)]
enum Settled {
    /// The move key is not as this send compared it: send again, comparing this.
    Gate(Gate),
    Failed(AcquireError),
}

impl From<AcquireError> for Settled {
    fn from(error: AcquireError) -> Self {
        Settled::Failed(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One acquisition makes at most three sends: the first and two re-sends, each with the
    /// gate the send before it found; then the session is reported moving, to this store.
    #[test]
    fn a_move_that_keeps_changing_is_chased_twice_then_reported() {
        let (us, session) = (Uuid::new_v4(), Uuid::new_v4());
        let mut chase = Chase::default();
        for mod_revision in [7, 9] {
            let next = Gate::Move { mod_revision };
            assert_eq!(chase.again(next, session, us).unwrap(), next);
        }
        for _ in 0..2 {
            match chase.again(Gate::NoMove, session, us) {
                Err(AcquireError::Moving { session_id, target }) => {
                    assert_eq!((session_id, target), (session, us))
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// The move key in the way of a free session decides what its acquisition does next.
    #[test]
    fn a_move_in_the_way_is_acquired_in_its_name_waited_for_or_left_behind() {
        let (us, other, session) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let moving = |target, mod_revision| {
            Some(InTheWay {
                target,
                mod_revision,
            })
        };
        let gated = Gate::Move { mod_revision: 7 };
        for gate in [Gate::NoMove, gated] {
            // To this store: sent again, comparing the move as read now.
            assert!(
                matches!(
                    in_the_way(us, session, gate, moving(Some(us), 9)),
                    Settled::Gate(Gate::Move { mod_revision: 9 })
                ),
                "{gate:?}"
            );
            // To another store, or one this release cannot read: moving, to that store.
            match in_the_way(us, session, gate, moving(Some(other), 9)) {
                Settled::Failed(AcquireError::Moving { session_id, target }) => {
                    assert_eq!((session_id, target), (session, other))
                }
                settled => panic!("{settled:?}"),
            }
            match in_the_way(us, session, gate, moving(None, 9)) {
                Settled::Failed(AcquireError::Moving { target, .. }) => {
                    assert_eq!(target, Uuid::nil())
                }
                settled => panic!("{settled:?}"),
            }
        }
        // The move the send compared has ended: sent again, comparing that there is none.
        assert!(matches!(
            in_the_way(us, session, gated, None),
            Settled::Gate(Gate::NoMove)
        ));
        // No move key, and the send compared that there was none: etcd never does this.
        assert!(matches!(
            in_the_way(us, session, Gate::NoMove, None),
            Settled::Failed(AcquireError::Etcd(_))
        ));
    }

    #[test]
    fn a_lease_lost_while_it_was_registered_is_never_handed_out() {
        assert!(hand_out(None).is_ok());
        for reason in [
            LossReason::Released,
            LossReason::Revoked,
            LossReason::Overtaken,
            LossReason::Expired,
            LossReason::KeepaliveFailed,
            LossReason::StoreClosed,
            LossReason::PermissionDenied,
        ] {
            let refused = hand_out(Some(reason)).unwrap_err();
            // A standby goes on standing by, except when the store is closed.
            assert_eq!(
                refused.is_transient(),
                reason != LossReason::StoreClosed,
                "{reason}: {refused:?}"
            );
        }
    }
}
