//! Appends with an idempotency key (`Journal::append_with_key`) are exactly-once, decided by the
//! journal's records: a retry after any number of other keys, from many callers at once, after
//! its transaction's outcome was lost, after the journal that made it is gone, is answered the
//! first call's sequence numbers, and appends nothing; `Store::find_append` tells not appended
//! only when no transaction can put it there any more.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::{
    Appended, Found, IdempotencyKey, JournalLimits, JournalWriteError, Unknowable, Uuid,
};

fn key(id: &str) -> IdempotencyKey {
    IdempotencyKey::new(id)
}

/// The payloads of `session`'s events, in order, each with the key of its append.
async fn events(store: &leasehold::Store, session: Uuid) -> Vec<(String, Option<IdempotencyKey>)> {
    use futures_util::StreamExt as _;
    store
        .replay(session)
        .map(|event| {
            let event = event.unwrap();
            let payload = String::from_utf8(event.payload.clone()).unwrap();
            (payload, event.idempotency_key())
        })
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_after_any_number_of_other_keys_is_answered_and_appends_nothing() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();

    // --- phase: the first call, then 1,200 other keys, then its retry
    let first = journal
        .append_with_key(key("r0"), &[&b"first"[..], b"call"])
        .await
        .unwrap();
    assert_eq!((first.first_seq, first.last_seq), (2, 3));
    for i in 1..=1200 {
        journal
            .append_with_key(key(&format!("r{i}")), &[format!("e{i}")])
            .await
            .unwrap();
    }
    let retried = journal
        .append_with_key(key("r0"), &[&b"first"[..], b"call"])
        .await
        .unwrap();
    assert_eq!(
        retried, first,
        "the first call's answer, read from its records"
    );
    // The key for other records: refused, nothing appended.
    let reused = journal.append_with_key(key("r0"), &[b"other"]).await;
    assert!(
        matches!(reused, Err(JournalWriteError::KeyReused)),
        "{reused:?}"
    );
    let seen = events(&store, session).await;
    assert_eq!(seen.len(), 2 + 1200);
    assert_eq!(seen[0], ("first".to_owned(), Some(key("r0"))));
    assert_eq!(journal.next_seq(), 4 + 1200);

    // --- phase: many callers with one key at once: one append, every caller told it
    let journal = Arc::new(journal);
    let calls = (0..16).map(|_| {
        let journal = journal.clone();
        tokio::spawn(async move { journal.append_with_key(key("same"), &[b"once"]).await })
    });
    let answers: Vec<Appended> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|answer| answer.unwrap().unwrap())
        .collect();
    assert!(
        answers.iter().all(|answer| *answer == answers[0]),
        "{answers:?}"
    );
    let seen = events(&store, session).await;
    assert_eq!(seen.iter().filter(|(p, _)| p == "once").count(), 1);
    // Without a key, nothing is deduplicated: a call is a call.
    journal.append(b"plain").await.unwrap();
    journal.append(b"plain").await.unwrap();
    let seen = events(&store, session).await;
    assert_eq!(
        seen.iter()
            .filter(|(p, k)| p == "plain" && k.is_none())
            .count(),
        2
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_append_is_found_in_the_records_after_its_journal_is_gone() {
    let etcd = common::Etcd::start().await;
    let (one, two) = (etcd.store("one", 10).await, etcd.store("two", 10).await);
    let session = Uuid::new_v4();

    // --- phase: node one appends, then lets go; node two owns the session and appends
    let lease = one.acquire_lease(session).await.unwrap();
    let epoch = lease.epoch();
    let journal = one.open_journal(session, Some(&lease)).await.unwrap();
    let committed = journal
        .append_with_key(key("k1"), &[b"a", b"b"])
        .await
        .unwrap();
    journal.append_with_key(key("k2"), &[b"c"]).await.unwrap();

    // While one still owns it, a key it never appended may yet come: the records cannot tell.
    let pending = two.find_append(session, epoch, key("k9"), &[b"x"]).await;
    assert_eq!(pending.unwrap(), Found::Unknown(Unknowable::StillOwned));
    journal.close().await;
    lease.release().await.unwrap();
    drop(journal);
    let lease = two
        .acquire_lease_wait(session, Duration::from_secs(10))
        .await
        .unwrap();
    let newer = two.open_journal(session, Some(&lease)).await.unwrap();
    for i in 0..50 {
        newer.append(format!("later {i}")).await.unwrap();
    }

    // --- phase: the first owner's retries, answered by anyone from the records
    for store in [&one, &two] {
        let found = store
            .find_append(session, epoch, key("k1"), &[b"a", b"b"])
            .await;
        assert_eq!(found.unwrap(), Found::Appended(committed));
        // A key the epoch never appended: not in the journal, and never will be (the owner
        // key no longer has that epoch).
        let absent = store.find_append(session, epoch, key("k9"), &[b"x"]).await;
        assert_eq!(absent.unwrap(), Found::NotAppended);
        let reused = store
            .find_append(session, epoch, key("k1"), &[b"z", b"b"])
            .await;
        assert!(matches!(
            reused.unwrap(),
            Found::Reused {
                first_seq: 2,
                last_seq: 3
            }
        ));
    }
    // Another epoch's key is not this epoch's.
    let elsewhere = two
        .find_append(session, lease.epoch(), key("k1"), &[b"a", b"b"])
        .await;
    assert_eq!(elsewhere.unwrap(), Found::Unknown(Unknowable::StillOwned));

    // --- phase: trimmed past the first epoch's records: the evidence is gone for good
    newer.trim(newer.next_seq() - 1).await.unwrap();
    let trimmed = two
        .find_append(session, epoch, key("k1"), &[b"a", b"b"])
        .await;
    assert_eq!(trimmed.unwrap(), Found::Unknown(Unknowable::Trimmed));
    // A session with no journal at all.
    let nothing = two
        .find_append(Uuid::new_v4(), epoch, key("k1"), &[b"a"])
        .await;
    assert_eq!(nothing.unwrap(), Found::Unknown(Unknowable::NoFence));
    one.close().await;
    two.close().await;
}

/// Calls that shared one transaction (all but one not first in it), whose outcome was lost:
/// the journal breaks, and each call's retry is answered from the records, committed, at its
/// own place, once. (On one thread: the test sets the fault between two turns of the store's
/// task.)
#[tokio::test]
async fn an_unknown_outcome_of_calls_in_a_shared_transaction_is_found_by_their_retries() {
    let a = common::ProxiedJournal::start(3).await;
    let epoch = a.lease.epoch();

    // --- phase: x, y and z wait behind an append in flight; they go in the next transaction
    a.proxy.hold_replies();
    let ahead = a.append("ahead");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let calls: Vec<_> = ["x", "y", "z"]
        .into_iter()
        .map(|id| {
            let journal = a.journal.clone();
            tokio::spawn(async move { journal.append_with_key(key(id), &[id.as_bytes()]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.proxy.heal();
    ahead.await.unwrap().expect("the append ahead commits");
    // --- phase: their transaction commits; its replies are lost until the lease ends
    a.proxy.drop_replies();
    for call in calls {
        let told = call.await.unwrap();
        assert!(
            matches!(told, Err(JournalWriteError::OutcomeUnknown(_))),
            "{told:?}"
        );
    }
    // The journal no longer knows its tip: a retry on it is refused, never sent.
    let again = a.journal.append_with_key(key("y"), &[b"y"]).await;
    assert!(
        matches!(again, Err(JournalWriteError::Indeterminate)),
        "{again:?}"
    );

    // --- phase: etcd answers again; the lease is gone: the records answer each call
    a.proxy.heal();
    let other = a.etcd.store("other", 10).await;
    let lease = other
        .acquire_lease_wait(a.session, Duration::from_secs(20))
        .await
        .unwrap();
    let next = other.open_journal(a.session, Some(&lease)).await.unwrap();
    let mut seqs = Vec::new();
    for id in ["x", "y", "z"] {
        let found = other
            .find_append(a.session, epoch, key(id), &[id.as_bytes()])
            .await
            .unwrap();
        let Found::Appended(appended) = found else {
            panic!("{id}: {found:?}")
        };
        seqs.push(appended.first_seq);
    }
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        [3, 4, 5],
        "each call at its own place in the one transaction"
    );
    assert_eq!(next.next_seq(), 7, "the next owner's fence after them");
    let records = {
        use futures_util::StreamExt as _;
        let records: Vec<_> = other.replay_records(a.session).collect().await;
        records.into_iter().map(Result::unwrap).collect::<Vec<_>>()
    };
    let nonces: Vec<_> = records[2..5].iter().map(leasehold::Record::nonce).collect();
    assert!(
        nonces.iter().all(|nonce| *nonce == nonces[0]),
        "x, y and z shared one transaction"
    );
    let seen = events(&other, a.session).await;
    assert_eq!(seen.len(), 4, "ahead, x, y, z: each once");
    other.close().await;
}

/// Keys take places of the store's budget until their journal goes; past it, appends with a
/// new key are refused, and a known key is still answered.
#[tokio::test(flavor = "multi_thread")]
async fn the_stores_budget_bounds_the_keys_of_its_open_journals() {
    let etcd = common::Etcd::start().await;
    let options = leasehold::StoreOptions::new([etcd.node.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node("a")
        .with_ttl(Duration::from_secs(10), Duration::from_secs(1))
        .with_journal_limits(JournalLimits::default().with_max_keys(3));
    let store = leasehold::Store::connect(options).await.unwrap();
    let (s1, s2) = (Uuid::new_v4(), Uuid::new_v4());
    let l1 = store.acquire_lease(s1).await.unwrap();
    let j1 = store.open_journal(s1, Some(&l1)).await.unwrap();
    let l2 = store.acquire_lease(s2).await.unwrap();
    let j2 = store.open_journal(s2, Some(&l2)).await.unwrap();
    for id in ["a", "b"] {
        j1.append_with_key(key(id), &[id]).await.unwrap();
    }
    j2.append_with_key(key("c"), &[b"c"]).await.unwrap();
    let refused = j2.append_with_key(key("d"), &[b"d"]).await;
    assert!(
        matches!(refused, Err(JournalWriteError::KeysExhausted { max: 3 })),
        "{refused:?}"
    );
    assert!(j1.append_with_key(key("a"), &[b"a"]).await.is_ok());
    // A journal closed and dropped gives its places back.
    j1.close().await;
    drop(j1);
    j2.append_with_key(key("d"), &[b"d"]).await.unwrap();
    assert_eq!(events(&store, s2).await.len(), 2);
    store.close().await;
}
