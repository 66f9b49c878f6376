//! Opening a journal: typed refusals, and the fence it appends.

mod common;

use std::error::Error as _;

use futures_util::TryStreamExt as _;
use leasehold::testing::{EtcdNode, random_namespace};
use leasehold::{
    JournalLeaseLostError, LeaseLostError, LossReason, NilLeaseError, OpenJournalError, Record,
};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn opening_without_a_valid_lease_of_the_session_is_refused_with_typed_errors() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let session = Uuid::new_v4();

    let error = store.open_journal(session, None).await.unwrap_err();
    assert!(
        matches!(&error, OpenJournalError::NilLease(NilLeaseError { session_id }) if *session_id == session),
        "{error:?}"
    );

    let other = store.acquire_lease(Uuid::new_v4()).await.unwrap();
    assert!(matches!(
        store.open_journal(session, Some(&other)).await,
        Err(OpenJournalError::WrongSession { .. })
    ));

    let lease = store.acquire_lease(session).await.unwrap();
    let _journal = store.open_journal(session, Some(&lease)).await.unwrap();
    assert!(matches!(
        store.open_journal(session, Some(&lease)).await,
        Err(OpenJournalError::AlreadyOpen { epoch }) if epoch == lease.epoch()
    ));

    let lost_session = Uuid::new_v4();
    let lost_lease = store.acquire_lease(lost_session).await.unwrap();
    lost_lease.release().await.unwrap();
    let error = store
        .open_journal(lost_session, Some(&lost_lease))
        .await
        .unwrap_err();
    // The chain: OpenJournalError → JournalLeaseLostError → LeaseLostError.
    let lost = error
        .source()
        .and_then(|e| e.downcast_ref::<JournalLeaseLostError>())
        .expect("JournalLeaseLostError");
    let cause = lost
        .source()
        .and_then(|e| e.downcast_ref::<LeaseLostError>())
        .expect("LeaseLostError");
    assert_eq!(cause.session_id, lost_session);
    assert_eq!(cause.reason, Some(LossReason::Released));
    // A failed open does not use up the lease's one journal; a lost lease stays refused.
    assert!(matches!(
        store.open_journal(lost_session, Some(&lost_lease)).await,
        Err(OpenJournalError::LeaseLost(_))
    ));
}

/// A session whose journal store a wrote and released, for store b to take over.
struct Handed {
    b: leasehold::Store,
    session: Uuid,
    /// a's lease, released.
    lease_a: leasehold::Lease,
    // Last: the container outlives the stores.
    etcd: EtcdNode,
}

/// Starts etcd and stores a and b; a opens a new session's journal, appends `batches` (one
/// call each) and releases the session.
async fn handed_from_a(batches: &[&[&str]]) -> Handed {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let (a, b) = (
        common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await,
        common::store(&[etcd.endpoint().to_owned()], &ns, "b", 10).await,
    );
    let session = Uuid::new_v4();
    let lease_a = a.acquire_lease(session).await.unwrap();
    let journal = a.open_journal(session, Some(&lease_a)).await.unwrap();
    for batch in batches {
        journal.append_batch(batch).await.unwrap();
    }
    lease_a.release().await.unwrap();
    Handed {
        b,
        session,
        lease_a,
        etcd,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn opening_appends_a_fence_that_event_replay_hides() {
    let Handed {
        etcd: _etcd,
        b,
        session,
        lease_a,
    } = handed_from_a(&[&["one"], &["two", "three"]]).await;

    let lease_b = b.acquire_lease(session).await.unwrap();
    let journal = b.open_journal(session, Some(&lease_b)).await.unwrap();
    let appended = journal.append("four").await.unwrap();
    assert_eq!((appended.first_seq, appended.last_seq), (6, 6));

    let records: Vec<Record> = b.replay_records(session).try_collect().await.unwrap();
    let seqs: Vec<u64> = records.iter().map(Record::seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    match (&records[0], &records[4]) {
        (Record::Fence(first), Record::Fence(second)) => {
            assert_eq!(first.epoch, lease_a.epoch());
            assert_eq!(first.previous, None, "a new journal");
            assert_eq!(second.epoch, lease_b.epoch());
            let previous = second.previous.expect("the previous tip");
            assert_eq!((previous.seq, previous.epoch), (4, lease_a.epoch()));
        }
        other => panic!("fences expected at 1 and 5, got {other:?}"),
    }

    let events: Vec<_> = b.replay(session).try_collect().await.unwrap();
    let payloads: Vec<&[u8]> = events.iter().map(|e| e.payload.as_slice()).collect();
    assert_eq!(payloads, [&b"one"[..], b"two", b"three", b"four"]);
    assert_eq!(events[3].epoch, lease_b.epoch());
}

/// The acquisition reads the tip in the transaction that creates the owner key, and the open
/// fences at that tip without reading it again. If the tip moved in between (here the new
/// owner deletes the finished journal), the fence's compare fails; the open then reads owner
/// and tip anew and fences at the tip as it is, instead of failing as fenced.
#[tokio::test(flavor = "multi_thread")]
async fn a_tip_that_moved_since_the_acquisition_is_read_again_by_the_open() {
    let Handed {
        etcd: _etcd,
        b,
        session,
        ..
    } = handed_from_a(&[&["one", "two"]]).await;

    // b's acquisition saw the tip at seq 3; then the journal goes, tip and all.
    let lease_b = b.acquire_lease(session).await.unwrap();
    let deleted = b.delete_journal(session, &lease_b).await.unwrap();
    assert!(deleted.keys > 0, "the journal was there: {deleted:?}");

    let journal = b
        .open_journal(session, Some(&lease_b))
        .await
        .expect("the open reads the moved tip and fences at it");
    let appended = journal.append("three").await.unwrap();
    assert_eq!((appended.first_seq, appended.last_seq), (2, 2));
    let records: Vec<Record> = b.replay_records(session).try_collect().await.unwrap();
    match records.as_slice() {
        [Record::Fence(fence), Record::Event(event)] => {
            assert_eq!((fence.seq, fence.epoch), (1, lease_b.epoch()));
            assert_eq!(fence.previous, None, "a journal started afresh");
            assert_eq!(event.payload, b"three");
        }
        other => panic!("a fence at 1 and one event expected, got {other:?}"),
    }
}
