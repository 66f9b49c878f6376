//! The value of a move key (`{ns}/moves/{session}`, written by
//! [`Admin::move_session`](crate::Admin::move_session), attached to the target's node lease):
//!
//! ```text
//! leasehold-move/1 {target store} {nonce} asked
//! leasehold-move/1 {target store} {nonce} ready
//! ```
//!
//! `asked` is what the admin writes; the target's session host rewrites it as `ready` once it
//! stands by to take the session, and the holder gives the session up when it sees `ready`.
//! While the key exists, an acquisition of the session by any store but the target's fails
//! its compare ([`AcquireError::Moving`](super::AcquireError::Moving)), and the target's
//! acquisition deletes the key in its own transaction. The nonce names the admin's request (a
//! re-send of it finds its own key); the admin's own delete (when it stops waiting) is guarded
//! by the key's create revision.

use std::time::Duration;

use uuid::Uuid;

/// How long a target host keeps a move to it that has not completed before it withdraws it
/// (deletes the move key), so a move whose admin died, or whose holder never gives the session
/// up (a bare [`Store`](super::Store), or a host of an earlier release), does not keep the
/// session from everyone else for longer.
pub const MOVE_WITHDRAWN_AFTER: Duration = Duration::from_secs(60);

const V1: &str = "leasehold-move/1";

/// The transaction that asks for a move (step 1 of
/// [`Admin::move_session`](crate::Admin::move_session)): `asked` is put on the target's node
/// lease if the session is still owned at `owner_revision` (its owner key's create revision),
/// the target's host key is still as read (`host_lease`, `host_mod_revision`), the target is
/// not drained and no move of the session is under way; otherwise the move key is read back.
pub(crate) fn ask_txn(
    namespace: &crate::keys::Namespace,
    session: Uuid,
    owner_revision: i64,
    target: Uuid,
    (host_lease, host_mod_revision): (i64, i64),
    asked: &str,
) -> etcd_client::Txn {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let (owner, host) = (namespace.owner_key(session), namespace.host_key(target));
    let (drain, moving) = (namespace.drain_key(target), namespace.move_key(session));
    Txn::new()
        .when([
            Compare::create_revision(owner.as_str(), CompareOp::Equal, owner_revision),
            Compare::lease(host.as_str(), CompareOp::Equal, host_lease),
            Compare::mod_revision(host.as_str(), CompareOp::Equal, host_mod_revision),
            Compare::create_revision(drain.as_str(), CompareOp::Equal, 0),
            Compare::create_revision(moving.as_str(), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(
            moving.as_str(),
            asked,
            Some(PutOptions::new().with_lease(host_lease)),
        )])
        .or_else([TxnOp::get(moving.as_str(), None)])
}

/// A decoded move value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MoveValue {
    /// The store the session moves to.
    pub(crate) target: Uuid,
    /// The admin's request.
    pub(crate) nonce: Uuid,
    /// Whether the target stands by to take it.
    pub(crate) ready: bool,
}

impl MoveValue {
    pub(crate) fn encode(&self) -> String {
        let phase = if self.ready { "ready" } else { "asked" };
        format!("{V1} {} {} {phase}", self.target, self.nonce)
    }

    /// `None` for anything that is not a move value of a version this release reads.
    pub(crate) fn decode(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut fields = text.split(' ');
        if fields.next()? != V1 {
            return None;
        }
        let target = fields.next()?.parse().ok()?;
        let nonce = fields.next()?.parse().ok()?;
        let ready = match fields.next()? {
            "asked" => false,
            "ready" => true,
            _ => return None,
        };
        Some(Self {
            target,
            nonce,
            ready,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_the_rest() {
        for ready in [false, true] {
            let value = MoveValue {
                target: Uuid::now_v7(),
                nonce: Uuid::now_v7(),
                ready,
            };
            assert_eq!(MoveValue::decode(value.encode().as_bytes()), Some(value));
        }
        for bad in [
            &b""[..],
            b"leasehold-move/2 a b asked",
            b"leasehold-move/1 not-a-uuid 0 asked",
            b"leasehold-move/1",
            b"\xff\xfe",
        ] {
            assert_eq!(MoveValue::decode(bad), None, "{bad:?}");
        }
        let target = Uuid::now_v7();
        let nonce = Uuid::now_v7();
        let done = format!("{V1} {target} {nonce} done");
        assert_eq!(MoveValue::decode(done.as_bytes()), None);
    }
}
