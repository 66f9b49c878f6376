//! A model check of leasehold's protocol: every reachable state of two owners, one session,
//! three appends, an unreliable network and an etcd whose leases expire, checked against
//! invariants 1–5 of the protocol (docs/protocol.md), with the `stateright` crate.
//!
//! # What is modelled
//!
//! | model | code |
//! | --- | --- |
//! | `Etcd`: one revision counter; the owner key (`create_revision` = epoch, holder and attempt, its lease's expiry); the tip (`seq`, `epoch`, `nonce`, `mod_revision`); the records `r/{seq}` | etcd, the keys of `keys.rs` |
//! | `Etcd::acquire`: `if create_revision(owner) == 0 then put(owner) else get(owner)`. A new key's `create_revision` is the next revision: epochs strictly increase. The owner adopts a key of its own attempt (an earlier send committed) | `store/acquire.rs` |
//! | `Etcd::keep_alive`, `Action::Expire`: a lease is granted with a TTL and renewed while it has not expired; after its expiry, etcd's expiry scan (at any later step) deletes the owner key, at a new revision | etcd's lessor, `store/keepalive.rs`, `store/renewal.rs` |
//! | `LeaseView::valid_until`: the send instant of the request a reply answers + TTL − margin, anchored at the acquisition's first send; `Owner::is_valid` is `now < valid_until`; a lease found gone is never valid again | `lease/validity.rs` (`Validity`) |
//! | `Phase::Opening`, `Msg::OpenRead`: read the owner key and the tip, check the epoch, then append `Fence { epoch, previous tip }` at the tip (the implementation reads the tip in the acquisition's own transaction: the interleaving where nothing happens between acquire and read; a tip moved since is read again) | `journal/fence.rs` (`open`) |
//! | `Etcd::compare_holds`, `Etcd::append`: `if mod_revision(tip) == last seen && create_revision(owner) == epoch && create_revision(r/{first}) == 0 then put(r/{first}), put(tip) else get(r/{first})` | `journal/cas.rs` (`AppendTxn::build`) |
//! | `Action::Timeout` while `Sending`: re-send the byte-identical transaction while the lease is valid; once it is not, resolve by reading | `etcd/write.rs` (`send`, `next`) |
//! | `State::receive` of `Msg::Appended` and `Msg::ResolvingRead`: the reply (or its `else` branch), or the resolving read of `r/{first}` and the owner key, decides committed, fenced or unknown | `journal/cas.rs` (`AppendTxn::settle`) |
//! | `State::settle`, `State::give_up`: a committed append moves the journal on; a fenced or indeterminate journal (or a lease past its deadline) makes its owner give the session up — the lease is lost first, then the guarded delete goes out — and stand by. It never re-reads the tip to go on under the same epoch | `journal/queue/writer.rs` (`Writer::settle`), `lease/handle.rs` (`release`), `host/session.rs` |
//! | `Told`: what the caller of each append was told: acknowledged, failed (fenced) or outcome unknown | `JournalWriteError` |
//!
//! The network holds every request and reply in flight. Any of them can be delivered at any
//! step, so each can be delayed past anything else and they arrive in any order. A message
//! never delivered is a lost one: no property looks at the network, so every state reachable
//! with a loss is reachable with that message still in flight, and a timeout fires whether or
//! not the reply is coming. Duplicates come from re-sends: each timeout puts the byte-identical
//! transaction (or acquisition) in flight again, so etcd sees it again after the first one was
//! applied or failed, and possibly after its sender has moved on; a duplicated reply is
//! ignored by an owner that already acted on the first.
//!
//! # What is abstracted away
//!
//! - One clock. Owners and etcd read one logical clock that ticks up to a horizon; a local
//!   clock that drifts within the safety margin behaves alike, so the margin is 0.
//! - The node lease is folded into the acquisition: the acquiring transaction grants the lease,
//!   and the local deadline is anchored at the acquisition's first send. A keepalive request
//!   can be delayed or lost; its reply is taken when etcd renews (the deadline it sets depends
//!   only on the send instant, so a slower reply only comes later, and a lost one is as if the
//!   request was lost). Owners renew in the last tick of validity: that gives the latest
//!   deadline a renewal can give.
//! - Reads (the open's read, the resolving read, the tip's re-read) are answered when sent (a
//!   linearizable read takes effect at one instant) and their replies are delayed like any
//!   other. A read whose reply was lost and is sent again is the same as one sent later.
//! - One record per append. Group commit puts several payloads in one transaction, which
//!   commits or not as one; encodings, endpoints, backoff and attempt timeouts are not modelled.
//! - The owner watch is not modelled: it only makes a loss known before the deadline does.
//!   Neither are operator actions (`Admin::revoke`, trims): they delete keys while the holder's
//!   deadline still runs, which invariant 5 leaves out.
//! - Errors that prove a send was never applied (refused connection, no leader) are not
//!   modelled: every failed attempt is outcome-unknown, the harder case.
//!
//! Bounds: two owners with one acquisition attempt each, three appends, a TTL of 2 ticks and a
//! horizon of 3. Messages nobody can act on any more (a reply its addressee no longer waits
//! for; a transaction that can never apply and whose sender moved on; a delete or keepalive for
//! a key that is gone) are dropped, as if lost. The owners are interchangeable, so the full
//! check explores one of each pair of states that differ only by the owners' ids (symmetry
//! reduction), depth first.
//!
//! # Invariants (docs/protocol.md)
//!
//! 1. One chain: records `1..=n` without gaps, each fence right after the tip it names, the
//!    tip at the last record.
//! 2. No record of epoch e commits after a fence of epoch e' > e (revision order).
//! 3. The epochs of fences strictly increase (revision order).
//! 4. Every acknowledged append is present exactly once, an outcome-unknown append at most once,
//!    and (a committed append is never reported as failed, never applied twice) an
//!    append reported failed is absent, and none is present twice.
//! 5. No lease is valid on an owner while the owner key has a newer epoch, or another owner's
//!    lease of a newer epoch is valid.
//!
//! The check also asserts that the model reaches what makes it interesting: a handover, an
//! append committed under the second epoch, an append whose outcome stayed unknown, and an
//! append that was fenced.
//!
//! # Mutants
//!
//! [`Protocol`] names three mistakes. Each yields a counterexample, found breadth first (so a
//! short one), printed with `cargo test --all-features --test model_protocol -- --nocapture`.
//! All three first break invariant 4, the contract with the caller: in each counterexample the
//! chain is whole (no other invariant is broken), and the caller is told the wrong thing.
//!
//! A narrower recovery in place, one that re-reads the tip only when the `else` branch shows
//! another writer's record, yields no counterexample (checked once over its 314,208 states, not
//! kept as a test): after a handover the owner-key compare fails every retry under the old
//! epoch, and while its lease is valid an owner cannot meet such a record. Staying fenced is a
//! second line of defence behind that compare.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

/// Which protocol the owners follow: leasehold's, or one with a known mistake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// leasehold's protocol.
    Correct,
    /// After a failed compare the journal re-reads the tip and retries the append at it, under
    /// its same epoch, instead of settling by the `else` branch (our record: committed;
    /// anything else: fenced for good, give the session up).
    RecoverInPlace,
    /// An append whose send timed out is applied again as a fresh append (a new nonce) at the
    /// journal's next sequence number, instead of re-sending the byte-identical transaction.
    BlindReapply,
    /// The append transaction omits `create_revision(owner key) == epoch`.
    SkipOwnerCompare,
}

type Time = u8;
type Rev = u8;
type Seq = u8;
type Nonce = u8;
type OwnerId = u8;

const OWNERS: usize = 2;
const APPENDS: usize = 3;
/// The lease TTL etcd grants, in ticks.
const TTL: Time = 2;
/// The safety margin below the TTL (see "one clock" in the module docs).
const MARGIN: Time = 0;
/// The clock stops here.
const HORIZON: Time = 3;
/// Acquisition attempts per owner.
const ATTEMPTS: u8 = 1;
/// Nonces handed out at most: the correct protocol needs one per fence and one per append
/// (4 + 3); the mutants that make new transactions stop there.
const NONCES: Nonce = 10;

// --- etcd -----------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct OwnerKey {
    create_revision: Rev,
    holder: OwnerId,
    attempt: u8,
    expires_at: Time,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct TipKey {
    seq: Seq,
    epoch: Rev,
    nonce: Nonce,
    mod_revision: Rev,
}

/// What a record holds besides its header.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Body {
    /// The fence, with the tip it was appended at (seq, nonce).
    Fence { previous: Option<(Seq, Nonce)> },
    /// A user event: which of the appends it carries.
    Event(u8),
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct RecordKey {
    seq: Seq,
    epoch: Rev,
    nonce: Nonce,
    body: Body,
    create_revision: Rev,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Etcd {
    revision: Rev,
    owner_key: Option<OwnerKey>,
    tip: Option<TipKey>,
    /// In key order.
    records: Vec<RecordKey>,
    /// Every owner key ever created: its epoch and holder, in revision order.
    created: Vec<(Rev, OwnerId)>,
}

/// An append transaction as the owner built it (`AppendTxn::build`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Txn {
    nonce: Nonce,
    epoch: Rev,
    seq: Seq,
    expected_tip: Rev,
    body: Body,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum TxnReply {
    Applied {
        revision: Rev,
    },
    /// The compare failed; the `else` branch read `r/{first}`: its nonce and revision.
    CompareFailed {
        first: Option<(Nonce, Rev)>,
    },
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum AcquireReply {
    Applied {
        epoch: Rev,
    },
    /// The compare failed; the `else` branch read the owner key.
    Held {
        key: OwnerKey,
    },
}

impl Etcd {
    fn tip_mod_revision(&self) -> Rev {
        self.tip.map_or(0, |tip| tip.mod_revision)
    }

    fn record(&self, seq: Seq) -> Option<&RecordKey> {
        self.records.iter().find(|record| record.seq == seq)
    }

    fn owner_epoch(&self) -> Option<Rev> {
        self.owner_key.map(|key| key.create_revision)
    }

    fn next_revision(&mut self) -> Rev {
        self.revision += 1;
        self.revision
    }

    fn acquire(&mut self, now: Time, holder: OwnerId, attempt: u8) -> AcquireReply {
        match self.owner_key {
            Some(key) => AcquireReply::Held { key },
            None => {
                let epoch = self.next_revision();
                self.owner_key = Some(OwnerKey {
                    create_revision: epoch,
                    holder,
                    attempt,
                    expires_at: now + TTL,
                });
                self.created.push((epoch, holder));
                AcquireReply::Applied { epoch }
            }
        }
    }

    /// Renews the lease of the owner key of `epoch`, unless it has expired or is gone.
    fn keep_alive(&mut self, now: Time, epoch: Rev) -> bool {
        match &mut self.owner_key {
            Some(key) if key.create_revision == epoch && now < key.expires_at => {
                key.expires_at = key.expires_at.max(now + TTL);
                true
            }
            _ => false,
        }
    }

    /// Deletes the owner key if it still has `epoch` (a guarded delete, or the lease's expiry).
    fn delete_owner(&mut self, epoch: Rev) {
        if self.owner_epoch() == Some(epoch) {
            self.next_revision();
            self.owner_key = None;
        }
    }

    fn compare_holds(&self, txn: &Txn, protocol: Protocol) -> bool {
        self.tip_mod_revision() == txn.expected_tip
            && (protocol == Protocol::SkipOwnerCompare || self.owner_epoch() == Some(txn.epoch))
            && self.record(txn.seq).is_none()
    }

    fn append(&mut self, txn: &Txn, protocol: Protocol) -> TxnReply {
        if !self.compare_holds(txn, protocol) {
            let first = self.record(txn.seq).map(|r| (r.nonce, r.create_revision));
            return TxnReply::CompareFailed { first };
        }
        let revision = self.next_revision();
        let record = RecordKey {
            seq: txn.seq,
            epoch: txn.epoch,
            nonce: txn.nonce,
            body: txn.body,
            create_revision: revision,
        };
        let at = self.records.partition_point(|r| r.seq < txn.seq);
        self.records.insert(at, record);
        self.tip = Some(TipKey {
            seq: txn.seq,
            epoch: txn.epoch,
            nonce: txn.nonce,
            mod_revision: revision,
        });
        TxnReply::Applied { revision }
    }
}

// --- the network ----------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Msg {
    // owner → etcd
    Acquire {
        owner: OwnerId,
        attempt: u8,
    },
    KeepAlive {
        owner: OwnerId,
        epoch: Rev,
        sent_at: Time,
    },
    Append {
        owner: OwnerId,
        txn: Txn,
    },
    /// The guarded delete of a release: `if create_revision(owner) == epoch then delete`.
    Delete {
        epoch: Rev,
    },
    // etcd → owner
    Acquired {
        owner: OwnerId,
        attempt: u8,
        reply: AcquireReply,
    },
    Appended {
        owner: OwnerId,
        nonce: Nonce,
        reply: TxnReply,
    },
    /// The open's read of the owner key and the tip.
    OpenRead {
        owner: OwnerId,
        epoch: Rev,
        owner_epoch: Option<Rev>,
        tip: Option<TipKey>,
    },
    /// The resolving read of `r/{first}` and the owner key.
    ResolvingRead {
        owner: OwnerId,
        nonce: Nonce,
        first: Option<(Nonce, Rev)>,
        owner_epoch: Option<Rev>,
    },
    /// `RecoverInPlace` only: the re-read of the tip.
    TipRead {
        owner: OwnerId,
        nonce: Nonce,
        tip: Option<TipKey>,
    },
}

// --- the owners -----------------------------------------------------------------------------

/// An owner's view of its lease.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct LeaseView {
    epoch: Rev,
    /// Send instant of the request the last renewal answered + TTL − margin; 0 once lost.
    valid_until: Time,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Holds nothing; may acquire.
    Standby,
    /// The acquiring transaction is out (sent first at `first_sent`).
    Acquiring { attempt: u8, first_sent: Time },
    /// Opening the journal: the read of the owner key and the tip is to be made, or its reply
    /// is on its way.
    Opening,
    /// The fence or an append is out.
    Sending(Txn),
    /// The lease is no longer valid and the outcome is unknown: the resolving read is to be
    /// made, or its reply is on its way.
    Resolving(Txn),
    /// `RecoverInPlace` only: the tip is to be re-read, or its reply is on its way, to retry
    /// this append's payload.
    Rereading(Txn),
    /// The journal is open: the next sequence number and the tip's `mod_revision` it last saw.
    Open {
        next_seq: Seq,
        tip_mod_revision: Rev,
    },
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Owner {
    lease: Option<LeaseView>,
    phase: Phase,
    attempts: u8,
}

impl Owner {
    fn is_valid(&self, now: Time) -> bool {
        self.lease.is_some_and(|lease| now < lease.valid_until)
    }

    fn epoch(&self) -> Option<Rev> {
        self.lease.map(|lease| lease.epoch)
    }
}

/// What the caller of each append was told.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Told {
    NotAppended,
    Pending,
    Acknowledged,
    Failed,
    Unknown,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct State {
    now: Time,
    etcd: Etcd,
    network: BTreeSet<Msg>,
    owners: [Owner; OWNERS],
    told: [Told; APPENDS],
    /// Nonces handed out so far.
    nonces: Nonce,
}

/// What a sent transaction came to (`cas::Sent`).
enum Sent {
    Committed { revision: Rev },
    Fenced,
    Unknown,
}

impl State {
    fn owner(&mut self, owner: OwnerId) -> &mut Owner {
        &mut self.owners[usize::from(owner)]
    }

    fn fresh_nonce(&mut self) -> Nonce {
        self.nonces += 1;
        self.nonces
    }

    fn next_append(&self) -> Option<u8> {
        self.told
            .iter()
            .position(|told| *told == Told::NotAppended)
            .map(|at| at as u8)
    }

    /// Whether a read's reply to `owner` is in flight.
    fn read_in_flight(&self, owner: OwnerId) -> bool {
        self.network.iter().any(|msg| {
            matches!(*msg, Msg::OpenRead { owner: o, .. } | Msg::ResolvingRead { owner: o, .. } | Msg::TipRead { owner: o, .. } if o == owner)
        })
    }

    fn keep_alive_in_flight(&self, owner: OwnerId) -> bool {
        self.network
            .iter()
            .any(|msg| matches!(*msg, Msg::KeepAlive { owner: o, .. } if o == owner))
    }

    /// Gives the session up: the lease is lost first, then the guarded delete goes out.
    fn give_up(&mut self, owner: OwnerId) {
        let owner = self.owner(owner);
        let lease = owner.lease.take();
        owner.phase = Phase::Standby;
        if let Some(lease) = lease {
            self.network.insert(Msg::Delete { epoch: lease.epoch });
        }
    }

    /// The journal's reaction to what a transaction came to.
    fn settle(&mut self, owner: OwnerId, txn: Txn, sent: Sent) {
        let told = match sent {
            Sent::Committed { revision } => {
                self.owner(owner).phase = Phase::Open {
                    next_seq: txn.seq + 1,
                    tip_mod_revision: revision,
                };
                Told::Acknowledged
            }
            // Fenced for good, or indeterminate: the owner gives the session up and stands by.
            Sent::Fenced => {
                self.give_up(owner);
                Told::Failed
            }
            Sent::Unknown => {
                self.give_up(owner);
                Told::Unknown
            }
        };
        if let Body::Event(append) = txn.body {
            self.told[usize::from(append)] = told;
        }
    }

    /// Sends a new transaction.
    fn send(&mut self, owner: OwnerId, txn: Txn) {
        self.owner(owner).phase = Phase::Sending(txn);
        self.network.insert(Msg::Append { owner, txn });
    }

    /// An owner's linearizable read: etcd answers it now; the reply may take its time.
    fn read(&mut self, o: OwnerId) {
        let etcd = &self.etcd;
        let owner_epoch = etcd.owner_epoch();
        let reply = match self.owners[usize::from(o)].phase {
            Phase::Opening => Msg::OpenRead {
                owner: o,
                epoch: self.owners[usize::from(o)]
                    .epoch()
                    .expect("opening under a lease"),
                owner_epoch,
                tip: etcd.tip,
            },
            Phase::Resolving(txn) => Msg::ResolvingRead {
                owner: o,
                nonce: txn.nonce,
                first: etcd.record(txn.seq).map(|r| (r.nonce, r.create_revision)),
                owner_epoch,
            },
            Phase::Rereading(txn) => Msg::TipRead {
                owner: o,
                nonce: txn.nonce,
                tip: etcd.tip,
            },
            phase => unreachable!("nothing to read while {phase:?}"),
        };
        self.network.insert(reply);
    }

    /// etcd handles a request, and answers it.
    fn serve(&mut self, msg: Msg, protocol: Protocol) {
        let now = self.now;
        let etcd = &mut self.etcd;
        let reply = match msg {
            Msg::Acquire { owner, attempt } => Msg::Acquired {
                owner,
                attempt,
                reply: etcd.acquire(now, owner, attempt),
            },
            Msg::Append { owner, txn } => Msg::Appended {
                owner,
                nonce: txn.nonce,
                reply: etcd.append(&txn, protocol),
            },
            Msg::Delete { epoch } => return etcd.delete_owner(epoch),
            // The renewal's reply is taken at once (see the module docs).
            Msg::KeepAlive {
                owner: o,
                epoch,
                sent_at,
            } => {
                let renewed = etcd.keep_alive(now, epoch);
                let owner = self.owner(o);
                if owner.epoch() == Some(epoch) && owner.is_valid(now) {
                    let lease = owner.lease.as_mut().expect("valid");
                    lease.valid_until = if renewed {
                        lease.valid_until.max(sent_at + TTL - MARGIN)
                    } else {
                        // The server no longer has the lease: lost, for good.
                        0
                    };
                }
                return;
            }
            _ => unreachable!("{msg:?} is a reply"),
        };
        self.network.insert(reply);
    }

    /// An owner receives a reply. Replies it no longer waits for were dropped (see `tidy`).
    fn receive(&mut self, msg: Msg, protocol: Protocol) {
        let now = self.now;
        match msg {
            Msg::Acquired {
                owner: o,
                attempt,
                reply,
            } => {
                let Phase::Acquiring { first_sent, .. } = self.owner(o).phase else {
                    unreachable!("kept only while acquiring");
                };
                // Our own key (an earlier send committed) is adopted; any other is held.
                let epoch = match reply {
                    AcquireReply::Applied { epoch } => epoch,
                    AcquireReply::Held { key } if (key.holder, key.attempt) == (o, attempt) => {
                        key.create_revision
                    }
                    AcquireReply::Held { .. } => {
                        self.owner(o).phase = Phase::Standby;
                        return;
                    }
                };
                let owner = self.owner(o);
                owner.lease = Some(LeaseView {
                    epoch,
                    valid_until: (first_sent + TTL).saturating_sub(MARGIN),
                });
                if owner.is_valid(now) {
                    owner.phase = Phase::Opening;
                } else {
                    self.give_up(o);
                }
            }
            Msg::OpenRead {
                owner: o,
                epoch,
                owner_epoch,
                tip,
            } => {
                if owner_epoch != Some(epoch) {
                    // Fenced before the fence: the open fails.
                    self.give_up(o);
                    return;
                }
                // Sent as the write path sends a first attempt: without a second look at the
                // deadline (the open checked it before reading).
                let txn = Txn {
                    nonce: self.fresh_nonce(),
                    epoch,
                    seq: tip.map_or(1, |tip| tip.seq + 1),
                    expected_tip: tip.map_or(0, |tip| tip.mod_revision),
                    body: Body::Fence {
                        previous: tip.map(|tip| (tip.seq, tip.nonce)),
                    },
                };
                self.send(o, txn);
            }
            Msg::Appended {
                owner: o, reply, ..
            } => {
                let Phase::Sending(txn) = self.owner(o).phase else {
                    unreachable!("kept only while sending");
                };
                let sent = match reply {
                    TxnReply::Applied { revision } => Sent::Committed { revision },
                    TxnReply::CompareFailed { .. }
                        if protocol == Protocol::RecoverInPlace
                            && matches!(txn.body, Body::Event(_)) =>
                    {
                        self.owner(o).phase = Phase::Rereading(txn);
                        return;
                    }
                    TxnReply::CompareFailed {
                        first: Some((nonce, revision)),
                    } if nonce == txn.nonce => Sent::Committed { revision },
                    TxnReply::CompareFailed { .. } => Sent::Fenced,
                };
                self.settle(o, txn, sent);
            }
            Msg::ResolvingRead {
                owner: o,
                first,
                owner_epoch,
                ..
            } => {
                let Phase::Resolving(txn) = self.owner(o).phase else {
                    unreachable!("kept only while resolving");
                };
                let sent = match first {
                    Some((nonce, revision)) if nonce == txn.nonce => Sent::Committed { revision },
                    Some(_) => Sent::Fenced,
                    None if owner_epoch != Some(txn.epoch) => Sent::Fenced,
                    None => Sent::Unknown,
                };
                self.settle(o, txn, sent);
            }
            Msg::TipRead { owner: o, tip, .. } => {
                let Phase::Rereading(txn) = self.owner(o).phase else {
                    unreachable!("kept only while re-reading");
                };
                if self.owner(o).is_valid(now) && self.nonces < NONCES {
                    let retry = Txn {
                        nonce: self.fresh_nonce(),
                        seq: tip.map_or(1, |tip| tip.seq + 1),
                        expected_tip: tip.map_or(0, |tip| tip.mod_revision),
                        ..txn
                    };
                    self.send(o, retry);
                } else {
                    // The retry is refused locally: the lease is no longer valid.
                    self.settle(o, txn, Sent::Fenced);
                }
            }
            _ => unreachable!("{msg:?} is a request"),
        }
    }

    /// Drops the messages nobody can act on any more: a reply its addressee no longer waits
    /// for, a request whose reply would be dropped and which can no longer change etcd.
    fn tidy(&mut self, protocol: Protocol) {
        let now = self.now;
        let (owners, etcd) = (&self.owners, &self.etcd);
        let phase = |o: OwnerId| owners[usize::from(o)].phase;
        let sending = |o: OwnerId, nonce: Nonce| matches!(phase(o), Phase::Sending(txn) if txn.nonce == nonce);
        let holds_valid = |o: OwnerId, epoch: Rev| {
            let owner = &owners[usize::from(o)];
            owner.epoch() == Some(epoch) && owner.is_valid(now)
        };
        self.network.retain(|msg| match *msg {
            // An acquisition can create a key whenever there is none: kept until delivered.
            Msg::Acquire { .. } => true,
            Msg::KeepAlive { owner, epoch, .. } => {
                etcd.owner_epoch() == Some(epoch) || holds_valid(owner, epoch)
            }
            // A compare that fails now fails for ever: the tip's mod_revision only grows, an
            // owner key's create_revision never comes back, records are never deleted.
            Msg::Append { owner, txn } => {
                etcd.compare_holds(&txn, protocol) || sending(owner, txn.nonce)
            }
            Msg::Delete { epoch } => etcd.owner_epoch() == Some(epoch),
            Msg::Acquired { owner, attempt, .. } => {
                matches!(phase(owner), Phase::Acquiring { attempt: a, .. } if a == attempt)
            }
            Msg::Appended { owner, nonce, .. } => sending(owner, nonce),
            Msg::OpenRead { owner, epoch, .. } => {
                phase(owner) == Phase::Opening && owners[usize::from(owner)].epoch() == Some(epoch)
            }
            Msg::ResolvingRead { owner, nonce, .. } => {
                matches!(phase(owner), Phase::Resolving(t) if t.nonce == nonce)
            }
            Msg::TipRead { owner, nonce, .. } => {
                matches!(phase(owner), Phase::Rereading(t) if t.nonce == nonce)
            }
        });
    }
}

/// The other owner's id.
fn other(owner: OwnerId) -> OwnerId {
    1 - owner
}

impl Msg {
    fn swapped(mut self) -> Self {
        match &mut self {
            Msg::Acquire { owner, .. }
            | Msg::KeepAlive { owner, .. }
            | Msg::Append { owner, .. }
            | Msg::Acquired { owner, .. }
            | Msg::Appended { owner, .. }
            | Msg::OpenRead { owner, .. }
            | Msg::ResolvingRead { owner, .. }
            | Msg::TipRead { owner, .. } => *owner = other(*owner),
            Msg::Delete { .. } => {}
        }
        if let Msg::Acquired {
            reply: AcquireReply::Held { key },
            ..
        } = &mut self
        {
            key.holder = other(key.holder);
        }
        self
    }
}

impl State {
    /// The same state with the owners' ids exchanged.
    fn swapped(&self) -> State {
        let mut state = self.clone();
        state.owners.swap(0, 1);
        if let Some(key) = &mut state.etcd.owner_key {
            key.holder = other(key.holder);
        }
        for (_, holder) in &mut state.etcd.created {
            *holder = other(*holder);
        }
        state.network = self.network.iter().map(|msg| msg.swapped()).collect();
        state
    }

    /// The owners run the same protocol: a state and its swapped twin behave alike, and the
    /// check explores one of them (symmetry reduction).
    fn representative(&self) -> State {
        match self.owners[0].cmp(&self.owners[1]) {
            Ordering::Less => self.clone(),
            Ordering::Greater => self.swapped(),
            Ordering::Equal => self.clone().min(self.swapped()),
        }
    }
}

fn is_request(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::Acquire { .. } | Msg::KeepAlive { .. } | Msg::Append { .. } | Msg::Delete { .. }
    )
}

// --- the model ------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    /// The clock ticks.
    Tick,
    /// etcd's expiry scan revokes the expired lease of the owner key, deleting the key.
    Expire,
    /// A message arrives.
    Deliver(Msg),
    /// A standby owner sends an acquiring transaction.
    Acquire(OwnerId),
    /// An owner sends a keepalive for its lease.
    KeepAlive(OwnerId),
    /// An owner reads what it waits to read (the open's read, the resolving read, the tip).
    Read(OwnerId),
    /// An owner with an open journal appends the next payload.
    Append(OwnerId),
    /// The transaction an owner waits on timed out: its outcome is unknown.
    Timeout(OwnerId),
    /// An owner gives up: releases an open journal's lease (shutdown, or after its deadline
    /// passed), abandons an acquisition, or ends a resolving read that keeps failing.
    GiveUp(OwnerId),
}

struct Leasehold {
    protocol: Protocol,
}

impl Model for Leasehold {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let owner = Owner {
            lease: None,
            phase: Phase::Standby,
            attempts: 0,
        };
        vec![State {
            now: 0,
            etcd: Etcd::default(),
            network: BTreeSet::new(),
            owners: [owner; OWNERS],
            told: [Told::NotAppended; APPENDS],
            nonces: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < HORIZON {
            actions.push(Action::Tick);
        }
        if state
            .etcd
            .owner_key
            .is_some_and(|key| key.expires_at <= state.now)
        {
            actions.push(Action::Expire);
        }
        actions.extend(state.network.iter().map(|msg| Action::Deliver(*msg)));
        for (o, owner) in state.owners.iter().enumerate() {
            let o = o as OwnerId;
            match owner.phase {
                Phase::Standby if owner.attempts < ATTEMPTS => actions.push(Action::Acquire(o)),
                Phase::Standby => {}
                Phase::Acquiring { .. } => {
                    actions.extend([Action::Timeout(o), Action::GiveUp(o)]);
                }
                Phase::Opening | Phase::Rereading(_) if !state.read_in_flight(o) => {
                    actions.push(Action::Read(o));
                }
                Phase::Opening | Phase::Rereading(_) => {}
                Phase::Sending(_) => actions.push(Action::Timeout(o)),
                Phase::Resolving(_) => {
                    if !state.read_in_flight(o) {
                        actions.push(Action::Read(o));
                    }
                    actions.push(Action::GiveUp(o));
                }
                Phase::Open { .. } => {
                    if owner.is_valid(state.now) && state.next_append().is_some() {
                        actions.push(Action::Append(o));
                    }
                    actions.push(Action::GiveUp(o));
                }
            }
            // Renewing in the last tick of validity gives the latest deadline a renewal can give.
            if owner
                .lease
                .is_some_and(|lease| lease.valid_until == state.now + 1)
                && !state.keep_alive_in_flight(o)
            {
                actions.push(Action::KeepAlive(o));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let now = state.now;
        match action {
            Action::Tick => state.now += 1,
            Action::Expire => {
                let key = state.etcd.owner_key.expect("enabled with a key");
                state.etcd.delete_owner(key.create_revision);
            }
            Action::Deliver(msg) => {
                state.network.remove(&msg);
                if is_request(&msg) {
                    state.serve(msg, self.protocol);
                } else {
                    state.receive(msg, self.protocol);
                }
            }
            Action::Acquire(o) => {
                let owner = state.owner(o);
                owner.attempts += 1;
                let attempt = owner.attempts;
                owner.phase = Phase::Acquiring {
                    attempt,
                    first_sent: now,
                };
                state.network.insert(Msg::Acquire { owner: o, attempt });
            }
            Action::KeepAlive(o) => {
                let epoch = state.owners[usize::from(o)].epoch().expect("has a lease");
                state.network.insert(Msg::KeepAlive {
                    owner: o,
                    epoch,
                    sent_at: now,
                });
            }
            Action::Read(o) => state.read(o),
            Action::Append(o) => {
                let owner = state.owners[usize::from(o)];
                let Phase::Open {
                    next_seq,
                    tip_mod_revision,
                } = owner.phase
                else {
                    unreachable!("enabled when open");
                };
                let append = state.next_append().expect("enabled with one left");
                state.told[usize::from(append)] = Told::Pending;
                let txn = Txn {
                    nonce: state.fresh_nonce(),
                    epoch: owner.epoch().expect("open under a lease"),
                    seq: next_seq,
                    expected_tip: tip_mod_revision,
                    body: Body::Event(append),
                };
                state.send(o, txn);
            }
            Action::Timeout(o) => {
                let owner = state.owners[usize::from(o)];
                match owner.phase {
                    Phase::Acquiring { attempt, .. } => {
                        state.network.insert(Msg::Acquire { owner: o, attempt });
                    }
                    Phase::Sending(txn) if owner.is_valid(now) => {
                        if self.protocol == Protocol::BlindReapply
                            && matches!(txn.body, Body::Event(_))
                            && state.nonces < NONCES
                        {
                            let fresh = Txn {
                                nonce: state.fresh_nonce(),
                                ..txn
                            };
                            state.send(o, fresh);
                        } else {
                            // The byte-identical transaction, again.
                            state.network.insert(Msg::Append { owner: o, txn });
                        }
                    }
                    // The lease is no longer valid: settle it by reading.
                    Phase::Sending(txn) => state.owner(o).phase = Phase::Resolving(txn),
                    phase => unreachable!("nothing to time out while {phase:?}"),
                }
            }
            Action::GiveUp(o) => match state.owners[usize::from(o)].phase {
                Phase::Resolving(txn) => state.settle(o, txn, Sent::Unknown),
                Phase::Acquiring { .. } | Phase::Open { .. } => state.give_up(o),
                phase => unreachable!("cannot give up while {phase:?}"),
            },
        }
        state.tidy(self.protocol);
        (state != *last).then_some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_CHAIN, |_, s: &State| one_chain(s).is_none()),
            Property::always(NO_RECORD_AFTER_NEWER_FENCE, |_, s: &State| {
                no_record_after_newer_fence(s).is_none()
            }),
            Property::always(FENCE_EPOCHS_INCREASE, |_, s: &State| {
                fence_epochs_increase(s).is_none()
            }),
            Property::always(APPENDS_AS_TOLD, |_, s: &State| appends_as_told(s).is_none()),
            Property::always(NO_VALID_LEASE_BESIDE_NEWER, |_, s: &State| {
                no_valid_lease_beside_newer(s).is_none()
            }),
            Property::sometimes(HANDOVER, |_, s: &State| {
                s.etcd.created.windows(2).any(|pair| pair[0].1 != pair[1].1)
            }),
            Property::sometimes(APPEND_UNDER_SECOND_EPOCH, |_, s: &State| {
                let second = s.etcd.created.get(1).map(|(epoch, _)| *epoch);
                s.etcd
                    .records
                    .iter()
                    .any(|r| matches!(r.body, Body::Event(_)) && Some(r.epoch) == second)
            }),
            Property::sometimes(UNKNOWN_OUTCOME, |_, s: &State| {
                s.told.contains(&Told::Unknown)
            }),
            Property::sometimes(STALE_APPEND_FENCED, |_, s: &State| {
                s.told.contains(&Told::Failed)
            }),
        ]
    }
}

// --- the invariants -------------------------------------------------------------------------

const ONE_CHAIN: &str = "1. one chain: gapless, no fork";
const NO_RECORD_AFTER_NEWER_FENCE: &str = "2. no record of an epoch after a newer fence";
const FENCE_EPOCHS_INCREASE: &str = "3. fence epochs strictly increase";
const APPENDS_AS_TOLD: &str = "4. acknowledged once, unknown at most once, failed never";
const NO_VALID_LEASE_BESIDE_NEWER: &str = "5. no valid lease beside a newer epoch";
const ALWAYS: [&str; 5] = [
    ONE_CHAIN,
    NO_RECORD_AFTER_NEWER_FENCE,
    FENCE_EPOCHS_INCREASE,
    APPENDS_AS_TOLD,
    NO_VALID_LEASE_BESIDE_NEWER,
];

const HANDOVER: &str = "a handover happened";
const APPEND_UNDER_SECOND_EPOCH: &str = "an append committed under the second epoch";
const UNKNOWN_OUTCOME: &str = "an append's outcome stayed unknown";
const STALE_APPEND_FENCED: &str = "an append was fenced";
const SOMETIMES: [&str; 4] = [
    HANDOVER,
    APPEND_UNDER_SECOND_EPOCH,
    UNKNOWN_OUTCOME,
    STALE_APPEND_FENCED,
];

// Each returns what is wrong, if anything.

fn one_chain(s: &State) -> Option<String> {
    let records = &s.etcd.records;
    for (at, record) in records.iter().enumerate() {
        if usize::from(record.seq) != at + 1 {
            return Some(format!("a gap before seq {}", record.seq));
        }
        if let Body::Fence { previous } = record.body {
            let before = at
                .checked_sub(1)
                .map(|i| (records[i].seq, records[i].nonce));
            if previous != before {
                return Some(format!(
                    "the fence at {} names {previous:?}, not {before:?}",
                    record.seq
                ));
            }
        }
    }
    let last = records.last().map(|r| (r.seq, r.nonce));
    let tip = s.etcd.tip.map(|t| (t.seq, t.nonce));
    (tip != last).then(|| format!("the tip {tip:?} is not the last record {last:?}"))
}

fn fences(s: &State) -> impl Iterator<Item = &RecordKey> {
    s.etcd
        .records
        .iter()
        .filter(|r| matches!(r.body, Body::Fence { .. }))
}

fn no_record_after_newer_fence(s: &State) -> Option<String> {
    s.etcd.records.iter().find_map(|record| {
        fences(s)
            .find(|f| f.epoch > record.epoch && f.create_revision < record.create_revision)
            .map(|fence| {
                format!(
                    "seq {} of epoch {} committed at revision {}, after the fence of epoch {} at {}",
                    record.seq,
                    record.epoch,
                    record.create_revision,
                    fence.epoch,
                    fence.create_revision
                )
            })
    })
}

fn fence_epochs_increase(s: &State) -> Option<String> {
    fences(s).find_map(|later| {
        fences(s)
            .find(|f| f.create_revision < later.create_revision && f.epoch >= later.epoch)
            .map(|earlier| {
                format!(
                    "the fence of epoch {} follows one of epoch {}",
                    later.epoch, earlier.epoch
                )
            })
    })
}

fn appends_as_told(s: &State) -> Option<String> {
    s.told.iter().enumerate().find_map(|(append, told)| {
        let present = s
            .etcd
            .records
            .iter()
            .filter(|r| r.body == Body::Event(append as u8))
            .count();
        let wrong = match told {
            _ if present > 1 => true,
            Told::Acknowledged => present != 1,
            Told::Failed => present != 0,
            Told::NotAppended | Told::Pending | Told::Unknown => false,
        };
        wrong.then(|| format!("append {append} is present {present} times; it was told {told:?}"))
    })
}

fn no_valid_lease_beside_newer(s: &State) -> Option<String> {
    s.owners.iter().enumerate().find_map(|(o, owner)| {
        let epoch = owner.epoch().filter(|_| owner.is_valid(s.now))?;
        let key = s.etcd.owner_epoch().filter(|key| *key > epoch);
        let other = s.owners.iter().enumerate().find_map(|(p, other)| {
            (p != o && other.is_valid(s.now))
                .then(|| other.epoch())
                .flatten()
                .filter(|e| *e > epoch)
        });
        key.or(other).map(|newer| {
            format!("owner {o}'s lease of epoch {epoch} is valid beside epoch {newer}")
        })
    })
}

/// What broke in `state`, property by property.
fn what_broke(state: &State) -> Vec<String> {
    [
        one_chain(state),
        no_record_after_newer_fence(state),
        fence_epochs_increase(state),
        appends_as_told(state),
        no_valid_lease_beside_newer(state),
    ]
    .into_iter()
    .flatten()
    .collect()
}

// --- the checks -----------------------------------------------------------------------------

/// What a check found.
struct Run {
    discoveries: HashMap<&'static str, Path<State, Action>>,
    done: bool,
}

fn report(protocol: Protocol, checker: &impl Checker<Leasehold>, started: Instant) -> Run {
    println!(
        "{protocol:?}: {} states ({} unique), depth {}, in {:.2?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed(),
    );
    Run {
        discoveries: checker.discoveries(),
        done: checker.is_done(),
    }
}

/// Every reachable state, depth first, one of each pair of swapped twins.
fn check_all(protocol: Protocol) -> Run {
    let started = Instant::now();
    let checker = Leasehold { protocol }
        .checker()
        .symmetry_fn(State::representative)
        .spawn_dfs()
        .join();
    report(protocol, &checker, started)
}

/// Breadth first until the first counterexample (so a short one).
fn check_until_broken(protocol: Protocol) -> Run {
    let started = Instant::now();
    let checker = Leasehold { protocol }
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    report(protocol, &checker, started)
}

fn describe(path: &Path<State, Action>) -> String {
    let last = path.last_state();
    format!(
        "{path}last state: {last:#?}\nwhat broke: {:?}",
        what_broke(last)
    )
}

#[test]
fn the_protocol_keeps_invariants_1_to_5() {
    let run = check_all(Protocol::Correct);
    assert!(run.done, "the check ran to the end");
    for name in ALWAYS {
        if let Some(path) = run.discoveries.get(name) {
            panic!("counterexample to \"{name}\":\n{}", describe(path));
        }
    }
    for name in SOMETIMES {
        let path = run.discoveries.get(name);
        let path = path.unwrap_or_else(|| panic!("never reached: \"{name}\""));
        let steps = path.clone().into_actions().len();
        println!("\"{name}\": reached, an example in {steps} steps");
    }
}

/// Checks `protocol` until the first counterexample, asserts that it breaks `broken`, prints
/// it, and returns its path.
fn counterexample(protocol: Protocol, broken: &'static str) -> Path<State, Action> {
    let run = check_until_broken(protocol);
    let found: Vec<&str> = ALWAYS
        .into_iter()
        .filter(|name| run.discoveries.contains_key(name))
        .collect();
    assert_eq!(found, [broken], "{protocol:?} breaks {found:?}");
    let path = run.discoveries[broken].clone();
    println!(
        "{protocol:?} breaks \"{broken}\" in {} steps:\n{}",
        path.clone().into_actions().len(),
        describe(&path)
    );
    path
}

#[test]
fn recovering_in_place_applies_an_append_twice() {
    let path = counterexample(Protocol::RecoverInPlace, APPENDS_AS_TOLD);
    let broke = what_broke(path.last_state());
    assert!(broke[0].contains("present 2 times"), "{broke:?}");
}

#[test]
fn reapplying_an_unknown_append_blindly_reports_a_committed_append_as_failed() {
    let path = counterexample(Protocol::BlindReapply, APPENDS_AS_TOLD);
    let broke = what_broke(path.last_state());
    assert!(
        broke[0].contains("present 1 times; it was told Failed"),
        "{broke:?}"
    );
}

#[test]
fn without_the_owner_compare_an_append_settled_as_fenced_commits_later() {
    let path = counterexample(Protocol::SkipOwnerCompare, APPENDS_AS_TOLD);
    let broke = what_broke(path.last_state());
    assert!(
        broke[0].contains("present 1 times; it was told Failed"),
        "{broke:?}"
    );
}
