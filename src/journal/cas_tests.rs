//! Unit tests of `cas.rs`.

use std::time::Duration;

use etcd_client::proto::{
    PbKeyValue, PbRangeResponse, PbResponseHeader, PbResponseOp, PbTxnOpResponse, PbTxnResponse,
};

use super::*;
use crate::etcd::write::Reply;
use crate::journal::record::{Tip, encode_event, encode_tip};

const EPOCH: Epoch = Epoch(40);

fn append(nonce: Uuid) -> AppendTxn {
    AppendTxn {
        compares: Vec::new(),
        puts: Vec::new(),
        first_key: "ns/journals/s/r/00000000000000000007".into(),
        first_seq: 7,
        tip_key: "ns/journals/s/tip".into(),
        tip_mod_revision: 5,
        owner_key: "ns/owners/s".into(),
        nonce,
        epoch: EPOCH,
        size: 0,
    }
}

/// The tip at `seq`, written with `nonce` at revision 55.
pub(in crate::journal) fn tip(seq: u64, nonce: Uuid) -> PbKeyValue {
    PbKeyValue {
        key: b"ns/journals/s/tip".to_vec(),
        value: encode_tip(&Tip {
            seq,
            epoch: EPOCH,
            nonce,
        }),
        create_revision: 3,
        mod_revision: 55,
        version: 9,
        lease: 0,
    }
}

/// A record at seq 7 written with `nonce`, committed at revision 50.
fn record(nonce: Uuid) -> PbKeyValue {
    PbKeyValue {
        key: b"ns/journals/s/r/00000000000000000007".to_vec(),
        value: encode_event(7, EPOCH, nonce, b"event"),
        create_revision: 50,
        mod_revision: 50,
        version: 1,
        lease: 0,
    }
}

pub(in crate::journal) fn owner(create_revision: i64) -> PbKeyValue {
    PbKeyValue {
        key: b"ns/owners/s".to_vec(),
        create_revision,
        ..PbKeyValue::default()
    }
}

/// A reply: `succeeded`, at revision 60, with one get per entry of `gets`.
pub(in crate::journal) fn reply(succeeded: bool, gets: Vec<Option<PbKeyValue>>) -> TxnResponse {
    TxnResponse(PbTxnResponse {
        header: Some(PbResponseHeader {
            revision: 60,
            ..PbResponseHeader::default()
        }),
        succeeded,
        responses: gets
            .into_iter()
            .map(|kv| PbResponseOp {
                response: Some(PbTxnOpResponse::ResponseRange(PbRangeResponse {
                    kvs: kv.into_iter().collect(),
                    ..PbRangeResponse::default()
                })),
            })
            .collect(),
    })
}

pub(in crate::journal) fn unknown() -> EtcdError {
    EtcdError::timed_out("append", "http://e", Duration::from_secs(1))
}

fn settled(written: Written) -> String {
    let ours = Uuid::from_u128(1);
    format!("{:?}", append(ours).settle(written))
}

#[test]
fn an_outcome_told_by_read_keeps_its_own_read_too() {
    for (own, later, expect) in [
        (false, false, false),
        (true, false, true),
        (false, true, true),
    ] {
        let committed = Sent::Committed {
            revision: 60,
            by_read: own,
            for_space: own,
        };
        assert_eq!(committed.for_space(), own, "kept");
        let committed = committed.told_by_read(later);
        assert_eq!(committed.by_read(), expect);
        assert_eq!(committed.for_space(), own);
        let fenced = Sent::Fenced { by_read: own };
        assert_eq!(fenced.told_by_read(later).by_read(), expect);
    }
}

#[test]
fn a_reply_settles_by_its_compare_and_else_branch() {
    let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
    // A reply after a send whose outcome was unknown: the `else` branch tells.
    let failed = |first, tip| {
        let reply = Reply::after_unknown_send(reply(false, vec![first, tip]));
        settled(Written::Replied(reply))
    };
    assert_eq!(
        settled(Written::Replied(reply(true, vec![]).into())),
        "Committed { revision: 60, by_read: false, for_space: false }"
    );
    // The compare failed: an earlier send of ours committed the first record...
    assert_eq!(
        failed(Some(record(ours)), Some(tip(9, theirs))),
        "Committed { revision: 50, by_read: false, for_space: false }"
    );
    // ...or, its first record trimmed since, the tip is still ours.
    assert_eq!(
        failed(None, Some(tip(9, ours))),
        "Committed { revision: 55, by_read: false, for_space: false }"
    );
    // Someone else's record is there, or none is and the tip is short of it: fenced.
    assert_eq!(
        failed(Some(record(theirs)), Some(tip(9, theirs))),
        "Fenced { by_read: false }"
    );
    assert_eq!(
        failed(None, Some(tip(6, theirs))),
        "Fenced { by_read: false }"
    );
    // None is, but the tip is past it: a trim removed whoever's record it was. Unknown.
    let trimmed = failed(None, Some(tip(7, theirs)));
    assert!(trimmed.starts_with("Unknown("), "{trimmed}");
    assert!(trimmed.contains("record 7 was trimmed"), "{trimmed}");
    // The journal was deleted since the append read its tip (at revision 5): no tip, or
    // a new one (and whatever record is there now). Unknown too.
    let renewed = |seq| {
        let mut tip = tip(seq, theirs);
        tip.create_revision = 6;
        Some(tip)
    };
    assert!(failed(None, None).starts_with("Unknown("));
    assert!(failed(None, renewed(1)).starts_with("Unknown("));
    assert!(failed(Some(record(theirs)), renewed(7)).starts_with("Unknown("));
    // A tip created at the very revision the append read it at is the tip it read.
    let same = {
        let mut tip = tip(6, theirs);
        tip.create_revision = 5;
        Some(tip)
    };
    assert_eq!(failed(None, same), "Fenced { by_read: false }");
    // An append to a journal with no tip yet (its first fence), after an unknown send:
    // no tip now, or another's, may be its own committed and the journal deleted (and
    // created again) since. Unknown too; after a first send that failed, fenced.
    let first = AppendTxn {
        tip_mod_revision: 0,
        first_seq: 1,
        ..append(ours)
    };
    let first = |read| format!("{:?}", first.settle(Written::Replied(read)));
    let after_unknown = |read| first(Reply::after_unknown_send(read));
    assert!(after_unknown(reply(false, vec![None, None])).starts_with("Unknown("));
    let theirs_first = Some(record(theirs));
    assert!(
        after_unknown(reply(
            false,
            vec![theirs_first.clone(), Some(tip(1, theirs))]
        ))
        .starts_with("Unknown(")
    );
    assert_eq!(
        first(reply(false, vec![None, None]).into()),
        "Fenced { by_read: false }"
    );
    assert_eq!(
        first(reply(false, vec![theirs_first, Some(tip(1, theirs))]).into()),
        "Fenced { by_read: false }"
    );
    // A reply to the first send (or after sends that certainly did not apply): it never
    // applied, whatever is gone.
    let first_send = |first, tip| settled(Written::Replied(reply(false, vec![first, tip]).into()));
    assert_eq!(first_send(None, None), "Fenced { by_read: false }");
    assert_eq!(
        first_send(None, Some(tip(7, theirs))),
        "Fenced { by_read: false }"
    );
}

#[test]
fn a_resolving_read_settles_by_the_first_record_the_tip_then_the_owner_key() {
    let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let resolved = |first, tip, owner| {
        settled(Written::Resolved {
            read: reply(true, vec![first, tip, owner]),
            unknown: unknown(),
        })
    };
    let epoch = EPOCH.revision();
    // Our record is there, or our tip: committed, whoever owns the session now.
    assert_eq!(
        resolved(Some(record(ours)), None, None),
        "Committed { revision: 50, by_read: true, for_space: false }"
    );
    assert_eq!(
        resolved(None, Some(tip(9, ours)), None),
        "Committed { revision: 55, by_read: true, for_space: false }"
    );
    // Another writer's record took its place: it can never commit.
    assert_eq!(
        resolved(
            Some(record(theirs)),
            Some(tip(7, theirs)),
            Some(owner(epoch))
        ),
        "Fenced { by_read: true }"
    );
    // No record ever, and the owner key is gone or newer: it can never commit either.
    assert_eq!(
        resolved(None, Some(tip(6, theirs)), None),
        "Fenced { by_read: true }"
    );
    assert_eq!(
        resolved(None, Some(tip(6, theirs)), Some(owner(epoch + 1))),
        "Fenced { by_read: true }"
    );
    // No record yet while the owner key is still ours: it may still commit.
    assert!(resolved(None, Some(tip(6, theirs)), Some(owner(epoch))).starts_with("Unknown("));
    // The journal is gone: whether the append committed before it went is, too.
    assert!(resolved(None, None, None).starts_with("Unknown("));
    // A record was there and is trimmed, the tip another's: whose it was is gone.
    assert!(resolved(None, Some(tip(8, theirs)), None).starts_with("Unknown("));
}

#[test]
fn only_an_outcome_the_resolving_read_settles_counts_as_resolved() {
    let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let how = |written| append(ours).settle(written).by_read();
    let read = |first: Option<PbKeyValue>, owner: Option<PbKeyValue>| Written::Resolved {
        read: reply(true, vec![first, Some(tip(6, theirs)), owner]),
        unknown: unknown(),
    };
    // Settled by the read: committed, or fenced.
    assert!(how(read(Some(record(ours)), None)));
    assert!(how(read(Some(record(theirs)), None)));
    assert!(how(read(None, None)));
    // The read could not settle it.
    assert!(!how(read(None, Some(owner(EPOCH.revision())))));
    // A reply settled it, or nothing did.
    assert!(!how(Written::Replied(reply(true, vec![]).into())));
    let earlier = Reply::after_unknown_send(reply(false, vec![Some(record(ours)), None]));
    assert!(!how(Written::Replied(earlier)));
    assert!(!how(Written::Unknown(unknown())));
    assert!(!how(Written::Failed(unknown())));
}

/// etcd applies the transaction that takes it past its quota and answers it NOSPACE; the
/// read made after that final answer says what it came to.
#[test]
fn a_send_refused_for_space_is_settled_by_the_read_after_it() {
    let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let space = || EtcdError::no_space("append");
    let refused = |first, tip, owner| {
        settled(Written::Refused {
            error: space(),
            read: Some(reply(true, vec![first, tip, owner])),
        })
    };
    let epoch = EPOCH.revision();
    // It applied: committed, and etcd refuses puts now.
    assert_eq!(
        refused(Some(record(ours)), Some(tip(7, ours)), Some(owner(epoch))),
        "Committed { revision: 50, by_read: true, for_space: true }"
    );
    assert_eq!(
        refused(None, Some(tip(9, ours)), Some(owner(epoch))),
        "Committed { revision: 55, by_read: true, for_space: true }"
    );
    // It did not, and never will: the refusal was final. The journal stays open.
    let failed = refused(None, Some(tip(6, theirs)), Some(owner(epoch)));
    assert!(
        failed.starts_with("Failed(") && failed.contains("space"),
        "{failed}"
    );
    // Another's record in its place, or its owner key moved on: fenced.
    assert_eq!(
        refused(
            Some(record(theirs)),
            Some(tip(7, theirs)),
            Some(owner(epoch))
        ),
        "Fenced { by_read: true }"
    );
    assert_eq!(
        refused(None, Some(tip(6, theirs)), Some(owner(epoch + 1))),
        "Fenced { by_read: true }"
    );
    // Its place may have been trimmed: whose record it was is gone.
    assert!(refused(None, Some(tip(8, theirs)), Some(owner(epoch))).starts_with("Unknown("));
    // No read: unknown, never failed.
    let unread = settled(Written::Refused {
        error: space(),
        read: None,
    });
    assert!(unread.starts_with("Unknown("), "{unread}");
}

#[test]
fn no_answer_stays_unknown_and_a_refusal_stays_failed() {
    assert!(settled(Written::Unknown(unknown())).starts_with("Unknown("));
    assert!(settled(Written::Failed(unknown())).starts_with("Failed("));
}

#[test]
fn the_size_estimate_counts_every_key_and_value_once_plus_fixed_overheads() {
    // 64 for the transaction, 24 per compare, 32 per put, 24 per get.
    assert_eq!(estimate_size([], [], []), 64);
    assert_eq!(estimate_size([10], [], []), 64 + 10 + 24);
    assert_eq!(estimate_size([], [(10, 100)], []), 64 + 10 + 100 + 32);
    assert_eq!(estimate_size([], [], [10]), 64 + 10 + 24);
    assert_eq!(
        estimate_size([1, 2, 3], [(4, 5), (6, 7)], [8]),
        64 + (1 + 24) + (2 + 24) + (3 + 24) + (4 + 5 + 32) + (6 + 7 + 32) + (8 + 24)
    );
}
