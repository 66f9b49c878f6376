//! Deliberately broken variants of the append protocol, for showing that a checker catches
//! them. Only the test harness can turn one on ([`StoreOptions::with_mutant`], with the
//! `testing` feature); a store built any other way runs the protocol as written.
//!
//! [`StoreOptions::with_mutant`]: crate::StoreOptions::with_mutant

/// A broken variant of the journal's append, or none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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

use super::super::cas::{COMPARED, Compared, Sent};
use super::super::fence::owner_and_tip;
use super::super::record::decode_tip;
use super::{Batcher, Hook, Member, build};
use crate::etcd::write;

/// Where a mutant sends its append again: after the tip as it is now, with the owner compare
/// it takes.
struct Again {
    first_seq: u64,
    tip_mod_revision: i64,
    guard: Compare,
}

impl Mutant {
    /// The hook the store's append queue sends through instead of the protocol; `None` for
    /// [`Mutant::None`], the protocol as written.
    pub(crate) fn hook(self) -> Option<Box<dyn Hook>> {
        (self != Mutant::None).then(|| Box::new(self) as Box<dyn Hook>)
    }

    /// Sends the appends of `members` as this mutant breaks the protocol, each on its own, and
    /// says what each came to.
    async fn send_all(self, batcher: &Batcher, members: &mut [Member]) -> Vec<Sent> {
        let mut sent = Vec::with_capacity(members.len());
        for member in members.iter_mut() {
            sent.push(self.send_one(batcher, member).await);
        }
        sent
    }

    async fn send_one(self, batcher: &Batcher, member: &mut Member) -> Sent {
        if self == Mutant::SkipOwnerCompare {
            skip_owner_compare(member);
        }
        loop {
            let sent = match self {
                Mutant::BlindReapply => send_once(batcher, member).await,
                _ => batcher.alone(member).await,
            };
            match self.again(batcher, member, &sent).await {
                Some(again) => remake(member, again),
                None => return sent,
            }
        }
    }

    /// Whether and where this mutant sends an append again after `sent`; `None` for the ones
    /// that never do.
    async fn again(self, batcher: &Batcher, member: &Member, sent: &Sent) -> Option<Again> {
        match (self, sent) {
            (Mutant::RecoverInPlace, Sent::Fenced { .. })
            | (Mutant::BlindReapply, Sent::Unknown(_)) => {}
            _ => return None,
        }
        let ownership = member.ownership();
        let read = owner_and_tip(
            &batcher.connection,
            &member.writer.namespace,
            ownership,
            "mutant re-read",
        );
        let (owner, tip) = read.await.ok()?;
        let (owner, tip) = (owner?, tip?);
        let seq = decode_tip(tip.key(), tip.value()).ok()?.seq;
        let guard = match self {
            // The owner key as it is now, whoever holds it.
            Mutant::RecoverInPlace => Compare::create_revision(
                ownership.owner_key(),
                CompareOp::Equal,
                owner.create_revision(),
            ),
            _ => ownership.guard(),
        };
        Some(Again {
            first_seq: seq.checked_add(1)?,
            tip_mod_revision: tip.mod_revision(),
            guard,
        })
    }
}

impl Hook for Mutant {
    fn send<'a>(
        &'a self,
        batcher: &'a Batcher,
        members: &'a mut [Member],
    ) -> futures_util::future::BoxFuture<'a, Vec<Sent>> {
        Box::pin(self.send_all(batcher, members))
    }
}

/// Leaves the owner key's compare out of `member`'s append.
fn skip_owner_compare(member: &mut Member) {
    let owner = COMPARED.iter().position(|c| *c == Compared::Owner);
    member
        .append
        .compares
        .remove(owner.expect("an append compares the owner key"));
    // (The append's else branch and resolving read name keys, not compares: they stand.)
}

/// Makes `member`'s append anew, under a new nonce, as `again` says.
fn remake(member: &mut Member, again: Again) {
    member.append = build(
        &member.writer,
        &member.calls,
        again.first_seq,
        again.tip_mod_revision,
        again.guard,
    );
    member.first_seq = again.first_seq;
}

/// Sends `member`'s append once, and never settles an unknown outcome by reading.
async fn send_once(batcher: &Batcher, member: &Member) -> Sent {
    let written = write::send(
        &batcher.connection,
        &batcher.policy,
        "append",
        &member.append.txn(),
        None,
        || false,
        &batcher.stop,
    )
    .await;
    member.append.settle(written)
}
