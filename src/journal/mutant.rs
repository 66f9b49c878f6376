//! Deliberately broken variants of the append protocol, for showing that a checker catches
//! them. Only the test harness can turn one on ([`StoreOptions::with_mutant`], with the
//! `testing` feature); a store built any other way runs the protocol as written.
//!
//! [`StoreOptions::with_mutant`]: crate::StoreOptions::with_mutant

/// A broken variant of the journal's append, or none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
// Without the harness only `None` is ever built, and nothing outside names the type.
#[cfg_attr(not(feature = "testing"), allow(dead_code, unreachable_pub))]
pub enum Mutant {
    /// The protocol as written.
    #[default]
    None,
    /// After a failed compare (fenced), the writer takes the tip and the owner key as they
    /// are now and sends the append again, as if its view had merely been stale: it
    /// "recovers in place" instead of giving the session up.
    RecoverInPlace,
    /// An append whose first send times out is sent again as a new append after the tip as
    /// it is now, instead of being re-sent unchanged and its outcome settled by reading.
    BlindReapply,
    /// The append transaction leaves out the owner key's compare (fences keep it).
    SkipOwnerCompare,
}

use etcd_client::{Compare, CompareOp};

use super::JournalContext;
use super::cas::{AppendTxn, Sent};
use super::fence::owner_and_tip;
use super::record::decode_tip;
use crate::lease::Ownership;

/// Where a mutant sends its append again: after the tip as it is now, with the owner compare
/// it takes (`None`: none).
pub(crate) struct Again {
    pub(crate) first_seq: u64,
    pub(crate) tip_mod_revision: i64,
    pub(crate) guard: Option<Compare>,
}

impl Mutant {
    /// The owner compare an append takes: none for [`Mutant::SkipOwnerCompare`].
    pub(crate) fn guard(self, ownership: &Ownership) -> Option<Compare> {
        (self != Mutant::SkipOwnerCompare).then(|| ownership.guard())
    }

    /// Sends `append`: as the protocol says, or once and without settling an unknown
    /// outcome for [`Mutant::BlindReapply`]. Also says whether a resolving read settled the
    /// outcome (see [`AppendTxn::send_telling_how`]).
    pub(crate) async fn send(
        self,
        append: AppendTxn,
        context: &JournalContext,
        ownership: &Ownership,
    ) -> (Sent, bool) {
        let (connection, policy, stop) = (&context.connection, &context.policy, &context.stop);
        match self {
            Mutant::BlindReapply => (append.send_once(connection, policy, stop).await, false),
            _ => context.batcher.send(append, ownership).await,
        }
    }

    /// Whether and where this mutant sends an append again after `sent`; `None` for the
    /// protocol as written, which never does.
    pub(crate) async fn again(
        self,
        context: &JournalContext,
        ownership: &Ownership,
        sent: &Sent,
    ) -> Option<Again> {
        match (self, sent) {
            (Mutant::RecoverInPlace, Sent::Fenced) | (Mutant::BlindReapply, Sent::Unknown(_)) => {}
            _ => return None,
        }
        let (owner, tip) = owner_and_tip(context, ownership, "mutant re-read")
            .await
            .ok()?;
        let (owner, tip) = (owner?, tip?);
        let seq = decode_tip(tip.key(), tip.value()).ok()?.seq;
        let guard = match self {
            // The owner key as it is now, whoever holds it.
            Mutant::RecoverInPlace => Some(Compare::create_revision(
                ownership.owner_key(),
                CompareOp::Equal,
                owner.create_revision(),
            )),
            _ => Some(ownership.guard()),
        };
        Some(Again {
            first_seq: seq.checked_add(1)?,
            tip_mod_revision: tip.mod_revision(),
            guard,
        })
    }
}
