//! NOSPACE, end to end: leasehold's own journals fill a small etcd until it raises its NOSPACE
//! alarm; the journals are trimmed under the alarm (by their owner, by an operator through
//! `Admin` and through `leasehold journal trim`), then history is compacted, the member
//! defragmented and the alarm disarmed, and the owners append again into sound journals. And
//! the one write etcd applies past its quota and answers NOSPACE all the same (an append, an
//! acquisition) is reported as what it is: committed.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Output;
use std::time::Duration;

use common::nospace;
use leasehold::admin::Admin;
use leasehold::testing::{AppendHistory, check_journal};
use leasehold::{AcquireError, ConnectOptions, Connection, Journal, JournalWriteError, Uuid};

/// One record: 200 kB. Five of them are one append (about 1 MB, under etcd's 1.5 MiB).
const RECORD: usize = 200_000;

/// Appends five large records at a time to each journal in turn until etcd refuses one for
/// space; returns each journal's tip. Every call goes into the journal's history.
async fn fill(journals: &[&Journal], histories: &mut [AppendHistory]) -> Vec<u64> {
    let mut tips = vec![1; journals.len()];
    for round in 0.. {
        assert!(round < 200, "a 16 MiB etcd filled within 200 rounds");
        for (i, (journal, history)) in journals.iter().zip(histories.iter_mut()).enumerate() {
            let payloads: Vec<String> = (0..5)
                .map(|k| format!("fill {i} {round} {k} {}", "x".repeat(RECORD)))
                .collect();
            let result = journal.append_batch(&payloads).await;
            history.record(&payloads, &result);
            match result {
                Ok(appended) => tips[i] = appended.last_seq,
                Err(JournalWriteError::Etcd(error)) if error.is_no_space() => return tips,
                Err(other) => panic!("append {round} of journal {i}: {other:?}"),
            }
        }
    }
    unreachable!()
}

async fn admin(etcd: &common::Etcd) -> Admin {
    let connection = Connection::connect(ConnectOptions::new([etcd.node.endpoint()]))
        .await
        .unwrap();
    Admin::new(connection, etcd.ns.clone())
}

/// `leasehold` with the test's endpoint and namespace.
async fn leasehold(etcd: &common::Etcd, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", etcd.node.endpoint()])
        .args(["--namespace", etcd.ns.as_str()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn journals_that_filled_etcd_are_trimmed_under_nospace_and_their_owners_append_again() {
    let etcd = nospace::small_etcd().await;
    let store = etcd.store("a", 10).await;
    let admin = admin(&etcd).await;
    let (s1, s2) = (Uuid::new_v4(), Uuid::new_v4());
    let (l1, l2) = (
        store.acquire_lease(s1).await.unwrap(),
        store.acquire_lease(s2).await.unwrap(),
    );
    let j1 = store.open_journal(s1, Some(&l1)).await.unwrap();
    let j2 = store.open_journal(s2, Some(&l2)).await.unwrap();
    let mut histories = [AppendHistory::default(), AppendHistory::default()];

    // --- phase: the first journal is trimmed once while etcd takes puts: it has a base key
    let payloads = ["small 1", "small 2", "small 3"];
    let result = j1.append_batch(&payloads).await;
    histories[0].record(&payloads, &result);
    assert_eq!(j1.trim(3).await.unwrap().base, 3);
    assert!(common::create_revision(&etcd.raw, &etcd.ns.base_key(s1)).await > 0);

    // --- phase: two journals fill etcd; it raises NOSPACE and refuses their appends
    let tips = fill(&[&j1, &j2], &mut histories).await;
    assert!(nospace::nospace(&etcd.raw).await, "etcd raised NOSPACE");
    let full = nospace::db_size(&etcd.raw).await;
    println!(
        "etcd full at {full} bytes: tips {tips:?} ({} records of {RECORD} bytes)",
        tips[0] + tips[1]
    );
    let refused = j1.append("refused").await.unwrap_err();
    histories[0].record(&["refused"], &Err(refused.clone()));
    assert!(
        matches!(&refused, JournalWriteError::Etcd(error) if error.is_no_space()),
        "{refused:?}"
    );

    // --- phase: under the alarm, the owner trims one journal, an operator the other
    let trimmed = j1
        .trim(tips[0])
        .await
        .expect("the owner's trim under NOSPACE");
    assert_eq!((trimmed.base, trimmed.removed), (tips[0], tips[0] - 3));
    let trimmed = admin
        .trim(s2, tips[1])
        .await
        .expect("an operator's trim under NOSPACE");
    assert_eq!((trimmed.base, trimmed.removed), (tips[1], tips[1] - 1));
    assert!(
        nospace::nospace(&etcd.raw).await,
        "still raised: trims only delete"
    );
    for (session, tip) in [(s1, tips[0]), (s2, tips[1])] {
        // The journal keeps its last record, and reads as trimmed, not lost.
        assert_eq!(
            common::count(&etcd.raw, &etcd.ns.records_prefix(session)).await,
            1
        );
        let checked = admin.check(session).await.unwrap();
        assert!(checked.is_sound(), "{:?}", checked.violations);
        assert_eq!((checked.base, checked.records), (tip, 1));
        assert_eq!(admin.journal(session).await.unwrap().base, tip);
        let mut replay = store.replay_records(session);
        let first = futures_util::StreamExt::next(&mut replay).await.unwrap();
        assert_eq!((first.unwrap().seq(), replay.base()), (tip, tip));
        // No base key (etcd refused to put it): the journal starts at its first record.
        assert_eq!(
            common::create_revision(&etcd.raw, &etcd.ns.base_key(session)).await,
            0
        );
    }
    // Trimming as far again is done already.
    assert_eq!(j1.trim(tips[0]).await.unwrap().removed, 0);

    // --- phase: compact, defragment, disarm
    nospace::compact_and_defrag(&etcd.raw).await;
    let defragmented = nospace::db_size(&etcd.raw).await;
    println!("defragmented: {full} -> {defragmented} bytes");
    assert!(defragmented < full / 4, "{full} -> {defragmented}");
    nospace::disarm(&etcd.raw).await;
    assert!(!nospace::nospace(&etcd.raw).await);

    // --- phase: the owners append again, on the journals they had open all along
    for (journal, history) in [&j1, &j2].into_iter().zip(histories.iter_mut()) {
        let payload = format!("after the alarm {}", journal.session_id());
        let result = journal.append(&payload).await;
        history.record(&[&payload], &result);
        result.expect("appends resume once disarmed");
    }
    // A trim that etcd accepts records the base again; the journals are sound.
    j1.trim(tips[0]).await.unwrap();
    admin.trim(s2, tips[1]).await.unwrap();
    for ((session, tip), history) in [(s1, tips[0]), (s2, tips[1])].into_iter().zip(&histories) {
        assert!(
            common::create_revision(&etcd.raw, &etcd.ns.base_key(session)).await > 0,
            "the base key is written again"
        );
        let report = check_journal(&store, session, history).await.unwrap();
        assert_eq!(report.records, 2);
        let checked = admin.check(session).await.unwrap();
        assert!(checked.is_sound(), "{:?}", checked.violations);
        assert_eq!(checked.base, tip);
    }
    assert!(
        l1.is_valid() && l2.is_valid(),
        "no lease was lost on the way"
    );

    // --- a record lost below a base key is still a loss, not a trim
    etcd.raw
        .clone()
        .delete(etcd.ns.record_key(s1, tips[0]), None)
        .await
        .unwrap();
    let checked = admin.check(s1).await.unwrap();
    assert!(
        checked
            .violations
            .contains(&leasehold::journal::Violation::Gap {
                expected: tips[0],
                found: tips[0] + 1
            }),
        "{:?}",
        checked.violations
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_trims_a_journal_that_filled_etcd_with_leasehold_journal_trim() {
    let etcd = nospace::small_etcd().await;
    let store = etcd.store("a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    // A second store, connected while etcd still grants leases; it writes nothing yet.
    let other = etcd.store("b", 10).await;

    // --- phase: one journal fills etcd
    let tip = fill(&[&journal], &mut [AppendHistory::default()]).await[0];
    assert!(nospace::nospace(&etcd.raw).await, "etcd raised NOSPACE");
    // An acquisition refused for space raises the alarm of its own store.
    assert!(!*other.nospace_alarm().borrow());
    let refused = other.acquire_lease(Uuid::new_v4()).await.unwrap_err();
    assert!(
        matches!(&refused, AcquireError::Etcd(error) if error.is_no_space()),
        "{refused:?}"
    );
    assert!(*other.nospace_alarm().borrow(), "raised by the acquisition");

    // --- phase: `leasehold journal trim` under the alarm, and `leasehold check`
    let before = tip.to_string();
    let trim = leasehold(
        &etcd,
        &["journal", "trim", &session.to_string(), "--before", &before],
    )
    .await;
    assert_eq!(trim.status.code(), Some(0), "{}", text(&trim));
    let said = String::from_utf8_lossy(&trim.stdout);
    assert!(
        said.contains(&format!("removed {} records", tip - 1))
            && said.contains(&format!("starts at {tip}")),
        "{said}"
    );
    let check = leasehold(&etcd, &["check"]).await;
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));

    // --- phase: compact, defragment, disarm; the owner appends again
    nospace::compact_and_defrag(&etcd.raw).await;
    nospace::disarm(&etcd.raw).await;
    let appended = tokio::time::timeout(Duration::from_secs(10), journal.append("again"))
        .await
        .expect("answered")
        .expect("appends resume once disarmed");
    assert_eq!(appended.first_seq, tip + 1);
    // The other store's next acquisition is accepted, and clears its alarm.
    other.acquire_lease(Uuid::new_v4()).await.unwrap();
    assert!(
        !*other.nospace_alarm().borrow(),
        "cleared by an accepted acquisition"
    );
    let check = leasehold(&etcd, &["check"]).await;
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
}

/// Polls `check` every 2 ms for up to 2 s: whether it came true.
async fn soon<F: std::future::Future<Output = bool>>(mut check: impl FnMut() -> F) -> bool {
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < until {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

/// etcd started so that every write commits its backend at once (`--backend-batch-limit=1`):
/// its size, which its quota check reads, grows between two applies.
async fn committing_etcd() -> common::Etcd {
    nospace::small_etcd_with(&["--backend-batch-limit=1"]).await
}

/// Fills `etcd` (outside the namespace, under `filler/`) until, compacted and defragmented, it
/// has between `min` and `max` bytes of room below its quota; returns the room.
async fn room_between(etcd: &common::Etcd, min: i64, max: i64) -> i64 {
    let mut raw = etcd.raw.clone();
    let quota = nospace::QUOTA as i64;
    for filler in 0.. {
        assert!(
            filler < 1000,
            "etcd filled to between {min} and {max} bytes of room"
        );
        nospace::compact_and_defrag(&etcd.raw).await;
        let room = quota - nospace::db_size(&etcd.raw).await;
        if room < min {
            // Too full: free some (the deletes take effect with the next defrag).
            raw.delete(
                "filler/",
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        } else if room <= max {
            return room;
        } else {
            let value = (room - (min + max) / 2).clamp(1, 1024 * 1024) as usize;
            let alarmed = nospace::nospace(&etcd.raw).await;
            if let Err(error) = raw
                .put(format!("filler/{filler}"), vec![b'f'; value], None)
                .await
            {
                // A filler etcd took past its quota after all: free it all, and fill again.
                eprintln!(
                    "filler {filler} of {value} bytes, with {room} of room (alarm raised \
                     before: {alarmed}): {error}"
                );
                free(etcd).await;
            }
        }
    }
    unreachable!()
}

/// Makes etcd apply `write` (a write that puts) right after a raw put of `put` bytes, both
/// having passed etcd's quota check on the size before either: a defragmentation holds etcd's
/// applies back while the put and then `write` are proposed, in that order (etcd's
/// `proposals_pending` says each is waiting). `None` if the defragmentation ended before the put
/// waited, and `write` was not run (the put is `filler/race`, deleted again); else what `write`
/// came to, whether or not it was seen waiting behind the put: it ran, and may have applied.
async fn right_after_a_put<T>(
    etcd: &common::Etcd,
    put: usize,
    write: impl std::future::Future<Output = T>,
) -> Option<T> {
    let endpoint = etcd.node.endpoint().to_owned();
    let pending = || async {
        leasehold::testing::etcd_metric(&endpoint, "etcd_server_proposals_pending", &[])
            .await
            .unwrap()
            .unwrap_or(0.0)
    };
    let mut raw = etcd.raw.clone();
    let defrag = tokio::spawn({
        let mut raw = raw.clone();
        async move { raw.defragment().await }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let base = pending().await;
    let putting = tokio::spawn({
        let mut raw = raw.clone();
        async move { raw.put("filler/race", vec![b'p'; put], None).await }
    });
    let held = soon(|| async { pending().await > base || putting.is_finished() }).await;
    if !held || putting.is_finished() {
        eprintln!("the defragmentation ended before the put waited");
        let (_, _) = (defrag.await, putting.await);
        raw.delete("filler/race", None).await.unwrap();
        return None;
    }
    let (written, queued) = tokio::join!(write, soon(|| async { pending().await > base + 1.0 }));
    if !queued {
        eprintln!("the write was not seen waiting behind the put");
    }
    defrag.await.unwrap().expect("defrag");
    putting
        .await
        .unwrap()
        .expect("the put applies, answered before the alarm");
    Some(written)
}

/// Frees what `room_between` and `right_after_a_put` filled, and disarms the alarm.
async fn free(etcd: &common::Etcd) {
    etcd.raw
        .clone()
        .delete(
            "filler/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    nospace::compact_and_defrag(&etcd.raw).await;
    nospace::disarm(&etcd.raw).await;
}

/// etcd's quota applier applies the transaction that takes its backend past the quota, then
/// answers it NOSPACE and raises the alarm. An append answered so is committed: it is told so,
/// the journal knows its tip, and it appends on once space is freed. Its owner is never told
/// that a committed append failed, nor fenced by its own record.
///
/// The race is made certain (see `right_after_a_put`): the put grows the backend past what the
/// append's apply finds room for, though both passed the quota check.
#[tokio::test(flavor = "multi_thread")]
async fn an_append_etcd_applied_and_answered_nospace_is_committed_and_the_journal_appends_on() {
    const MIB: i64 = 1024 * 1024;
    let etcd = committing_etcd().await;
    let store = etcd.store("a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    let mut history = AppendHistory::default();
    let first = journal.append("first").await;
    history.record(&["first"], &first);
    let mut last_seq = first.unwrap().last_seq;
    let mut seen = None;
    for attempt in 0..8 {
        // --- phase: room for the put or the append, not for both
        let room = room_between(&etcd, MIB, MIB * 8 / 5).await;
        // Each attempt's payload its own (the checker tells calls apart by their payloads).
        let length = ((room * 3 / 5) as usize).min(1_000_000);
        let payload = format!("{attempt}{}", "a".repeat(length.saturating_sub(1)));
        // --- phase: both pass the quota check; the put applies first
        let written = right_after_a_put(&etcd, (room * 3 / 5) as usize, async {
            journal.append(payload.as_str()).await
        })
        .await;
        let Some(appended) = written else {
            continue;
        };
        history.record(&[payload.as_str()], &appended);
        let record = etcd.ns.record_key(session, last_seq + 1);
        let applied = etcd.raw.clone().get(record, None).await.unwrap().count() == 1;
        if applied && nospace::nospace(&etcd.raw).await {
            seen = Some((last_seq + 1, appended));
            break;
        }
        eprintln!(
            "attempt {attempt}: the append was not the one etcd applied past its quota \
             (applied {applied}, {appended:?})"
        );
        if applied {
            // Its record is the tip now, whatever the append was told (the history checks that).
            last_seq += 1;
        }
        free(&etcd).await;
    }
    let (first_seq, appended) = seen.expect("etcd applied an append past its quota");

    // --- phase: told committed, with etcd's alarm seen
    let appended = appended.expect("an append etcd applied is told committed");
    assert_eq!(appended.first_seq, first_seq);
    assert!(*store.nospace_alarm().borrow(), "etcd refuses puts now");

    // --- phase: space freed, the owner appends on after its record
    free(&etcd).await;
    let after = journal.append("after").await;
    history.record(&["after"], &after);
    assert_eq!(after.expect("appends go on").first_seq, first_seq + 1);
    // Every call is in the journal as it was told, and nothing else is.
    check_journal(&store, session, &history)
        .await
        .expect("the journal holds what its owner was told");
}

/// The same race for an acquisition: one etcd applied past its quota and answered NOSPACE is
/// the caller's lease, not an owner key of nobody's that keeps the session from everyone until
/// the node lease ends.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquisition_etcd_applied_and_answered_nospace_is_the_callers_lease() {
    let etcd = committing_etcd().await;
    let store = etcd.store("a", 10).await;
    let mut seen = None;
    for attempt in 0..8 {
        // --- phase: room for the put or the acquisition (a few hundred bytes), not both
        let room = room_between(&etcd, 12 * 1024, 20 * 1024).await;
        // The put's value fills whole pages of etcd's backend, so that it grows the backend by
        // at least its cost; its cost (its value, its key and 256 bytes) is below the room.
        let mut put = (room - 300 - 256 - 11) as usize;
        while !(put + 64).is_multiple_of(4096) && put > (room - 4000) as usize {
            put -= 1;
        }
        let session = Uuid::new_v4();
        let before = common::revision(&etcd.raw).await;
        let Some(acquired) = right_after_a_put(&etcd, put, store.acquire_lease(session)).await
        else {
            continue;
        };
        // From etcd's history: a store that lost track of its owner key deletes it.
        let applied = common::keys_put_since(&etcd.raw, before + 1)
            .await
            .contains(&etcd.ns.owner_key(session));
        if applied && nospace::nospace(&etcd.raw).await {
            seen = Some((session, acquired));
            break;
        }
        eprintln!(
            "attempt {attempt}: the acquisition was not the one etcd applied past its quota \
             (room {room}, put {put}, applied {applied}, {acquired:?})"
        );
        drop(acquired);
        free(&etcd).await;
    }
    let (session, acquired) = seen.expect("etcd applied an acquisition past its quota");
    let lease = acquired.expect("an acquisition etcd applied is the caller's lease");
    assert_eq!(lease.session_id(), session);
    assert!(lease.is_valid());
    assert_eq!(
        lease.epoch().get() as i64,
        common::create_revision(&etcd.raw, &etcd.ns.owner_key(session)).await,
        "the owner key etcd applied is this lease's"
    );
    assert!(*store.nospace_alarm().borrow(), "etcd refuses puts now");
    // Released, the session is free for the next owner.
    lease.release().await.unwrap();
    free(&etcd).await;
    let next = etcd.store("b", 10).await;
    next.acquire_lease(session).await.expect("free again");
}
