//! NOSPACE, end to end: leasehold's own journals fill a small etcd until it raises its NOSPACE
//! alarm; the journals are trimmed under the alarm (by their owner, by an operator through
//! `Admin` and through `leasehold journal trim`), then history is compacted, the member
//! defragmented and the alarm disarmed, and the owners append again into sound journals.

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
