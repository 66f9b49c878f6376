//! Batches at etcd's limits go through; one record or one byte more is refused before sending.

mod common;

use std::time::Duration;

use leasehold::JournalWriteError;
use leasehold::testing::{EtcdNode, FaultProxy, random_namespace};
use uuid::Uuid;

/// Waits for an append that must be refused before anything is sent.
async fn refused<T>(append: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(1), append)
        .await
        .expect("refused at once, without sending")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_at_the_limits_commits_and_one_more_record_or_byte_is_refused_before_sending() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let store = common::store(&[proxy.endpoint()], &ns, "a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    let limits = journal.limits().clone();
    assert_eq!(
        (limits.max_records(), limits.max_bytes()),
        (127, 1_572_864 - 1024)
    );

    // 127 records whose encoded append is exactly the largest allowed.
    let n = limits.max_records();
    let empty = vec![Vec::new(); n];
    let spare = limits.max_bytes() - journal.encoded_size(&empty);
    let mut payloads: Vec<Vec<u8>> = (0..n)
        .map(|i| vec![b'a' + (i % 26) as u8; spare / n])
        .collect();
    payloads[0].extend(vec![b'z'; spare % n]);
    assert_eq!(journal.encoded_size(&payloads), limits.max_bytes());

    // --- one byte more: refused before sending. The store's link to etcd is closed, so
    // anything sent would be re-sent for as long as the lease is valid; only a refusal made
    // before sending returns at once.
    proxy.reject();
    let mut too_large = payloads.clone();
    too_large[n - 1].push(b'!');
    match refused(journal.append_batch(&too_large)).await {
        Err(JournalWriteError::TooLarge { bytes, max }) => {
            assert_eq!((bytes, max), (limits.max_bytes() + 1, limits.max_bytes()));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // --- one record more: refused before sending
    let too_many = vec![b"x".to_vec(); n + 1];
    match refused(journal.append_batch(&too_many)).await {
        Err(JournalWriteError::TooManyRecords { count, max }) => {
            assert_eq!((count, max), (128, 127))
        }
        other => panic!("expected TooManyRecords, got {other:?}"),
    }
    assert!(matches!(
        refused(journal.append_batch::<&[u8]>(&[])).await,
        Err(JournalWriteError::Empty)
    ));
    proxy.heal();

    // --- exactly at the limits: etcd takes it
    let appended = journal.append_batch(&payloads).await.expect("fits etcd");
    assert_eq!((appended.first_seq, appended.last_seq), (2, 128));
}
