//! Unit tests of `check.rs`.

use super::*;
use crate::journal::Fence;

fn fence(seq: u64, epoch: u64, previous: Option<(u64, u64)>) -> Record {
    Record::Fence(Fence {
        seq,
        epoch: Epoch(epoch),
        previous: previous.map(|(seq, epoch)| Tip {
            seq,
            epoch: Epoch(epoch),
            nonce: Uuid::nil(),
        }),
        nonce: Uuid::from_u64_pair(epoch, seq),
    })
}

fn event(seq: u64, epoch: u64) -> Record {
    Record::Event(Event {
        seq,
        epoch: Epoch(epoch),
        payload: format!("e{seq}").into_bytes(),
        nonce: Uuid::from_u64_pair(epoch, seq),
        keyed: None,
    })
}

fn walk(base: u64, records: &[Record]) -> Vec<Violation> {
    let mut walker = Walker::new(base);
    for record in records {
        walker.step(record);
    }
    let tip = records.last().map(|last| Tip {
        seq: last.seq(),
        epoch: last.epoch(),
        nonce: last.nonce(),
    });
    walker.finish(tip);
    walker.violations
}

#[test]
fn a_sound_journal_and_its_trimmed_tail_pass() {
    let journal = [
        fence(1, 10, None),
        event(2, 10),
        event(3, 10),
        fence(4, 20, Some((3, 10))),
        event(5, 20),
    ];
    assert_eq!(walk(1, &journal), []);
    for base in 2..=5 {
        assert_eq!(
            walk(base, &journal[base as usize - 1..]),
            [],
            "trimmed to {base}"
        );
    }
}

#[test]
fn a_gap_below_the_base_is_a_trim_but_one_above_it_is_a_loss() {
    assert_eq!(
        walk(1, &[event(2, 10), event(3, 10)]),
        [
            Violation::FirstNotFence,
            Violation::Gap {
                expected: 1,
                found: 2
            },
            Violation::Unfenced {
                seq: 2,
                epoch: Epoch(10),
                fence: None
            },
            Violation::Unfenced {
                seq: 3,
                epoch: Epoch(10),
                fence: None
            }
        ]
    );
    assert_eq!(
        walk(3, &[event(3, 10), event(5, 10)]),
        [Violation::Gap {
            expected: 4,
            found: 5
        }]
    );
    // A record the trim should have removed.
    assert_eq!(
        walk(3, &[event(2, 10), event(3, 10)]),
        [Violation::Gap {
            expected: 3,
            found: 2
        }]
    );
}

#[test]
fn the_unfenced_head_of_a_trimmed_journal_is_one_epoch() {
    let violations = walk(
        2,
        &[event(2, 10), event(3, 11), fence(4, 20, Some((3, 11)))],
    );
    assert_eq!(
        violations,
        [Violation::Unfenced {
            seq: 3,
            epoch: Epoch(11),
            fence: None
        }]
    );
    // A later fence may not go below that epoch.
    let violations = walk(2, &[event(2, 10), fence(3, 9, Some((2, 10)))]);
    assert!(
        matches!(
            violations[..],
            [Violation::FenceNotIncreasing { seq: 3, .. }]
        ),
        "{violations:?}"
    );
    // The first fence kept must name the record just below the base.
    let violations = walk(4, &[fence(4, 20, Some((2, 10)))]);
    assert!(
        matches!(violations[..], [Violation::Fork { fence: 4, .. }]),
        "{violations:?}"
    );
}

#[test]
fn the_tip_must_name_the_last_record() {
    let mut walker = Walker::new(1);
    walker.step(&fence(1, 10, None));
    walker.finish(None);
    assert!(matches!(
        walker.violations[..],
        [Violation::TipMismatch { tip: None, .. }]
    ));
}

#[test]
fn a_tip_behind_the_last_record_is_named_so() {
    let tip = |seq, epoch| Tip {
        seq,
        epoch: Epoch(epoch),
        nonce: Uuid::from_u64_pair(epoch, seq),
    };
    let walked = |tip| {
        let mut walker = Walker::new(1);
        walker.step(&fence(1, 10, None));
        walker.step(&event(2, 10));
        walker.finish(Some(tip));
        walker.violations
    };
    assert_eq!(
        walked(tip(1, 10)),
        [Violation::TipBehind {
            tip: (1, Epoch(10)),
            last: (2, Epoch(10))
        }]
    );
    assert_eq!(walked(tip(2, 10)), []);
    // Ahead of the last record, or another record at its seq: a mismatch.
    for ahead in [tip(3, 10), tip(2, 11)] {
        assert!(
            matches!(walked(ahead)[..], [Violation::TipMismatch { .. }]),
            "{ahead:?}"
        );
    }
    let message = walked(tip(1, 10))[0].to_string();
    assert!(
        message.contains("behind") && message.contains("record 2"),
        "{message}"
    );
}
