//! Acquisitions share transactions: many sessions acquired at once by one store go in fewer
//! etcd transactions than sessions, each with its own compares, so a session held elsewhere is
//! refused alone and every other is acquired.

mod common;

use leasehold::{AcquireError, Lease, Store, Uuid};

async fn acquire_together(store: &Store, sessions: &[Uuid]) -> Vec<Result<Lease, AcquireError>> {
    let acquisitions = sessions.iter().map(|session| store.acquire_lease(*session));
    futures_util::future::join_all(acquisitions).await
}

#[tokio::test(flavor = "multi_thread")]
async fn acquisitions_at_once_share_transactions_and_a_held_session_is_refused_alone() {
    const SESSIONS: usize = 32;
    let etcd = common::Etcd::start().await;
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    // b holds every fourth session.
    let mut held_by_b = Vec::new();
    for session in sessions.iter().step_by(4) {
        held_by_b.push(b.acquire_lease(*session).await.unwrap());
    }

    let before = common::txns(etcd.node.endpoint()).await;
    let acquired = acquire_together(&a, &sessions).await;
    let sent = common::txns(etcd.node.endpoint()).await - before;
    println!("{SESSIONS} acquisitions at once in {sent} etcd transactions");
    for (i, (session, acquired)) in sessions.iter().zip(&acquired).enumerate() {
        match acquired {
            Err(AcquireError::Held(held)) if i % 4 == 0 => {
                assert_eq!(held.holder_epoch, held_by_b[i / 4].epoch());
            }
            Ok(lease) if i % 4 != 0 => {
                assert_eq!(lease.session_id(), *session);
                assert!(lease.is_valid());
            }
            other => panic!("session {i}: {other:?}"),
        }
    }
    assert!(
        sent < (SESSIONS / 2) as f64,
        "{SESSIONS} acquisitions in {sent} transactions: they share them"
    );
    for lease in held_by_b {
        assert!(lease.is_valid(), "b keeps what it holds");
    }
}

/// As many acquisitions at once as a busy host makes: the transactions they share stay
/// within etcd's limits (etcd refuses a transaction of 127 acquisitions with its default
/// `--max-txn-ops` of 128).
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_acquisitions_at_once_are_all_acquired() {
    const SESSIONS: usize = 1000;
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let before = common::txns(etcd.node.endpoint()).await;
    let acquired = acquire_together(&store, &sessions).await;
    let sent = common::txns(etcd.node.endpoint()).await - before;
    println!("{SESSIONS} acquisitions at once in {sent} etcd transactions");
    for (session, acquired) in sessions.iter().zip(acquired) {
        let lease = acquired.unwrap_or_else(|error| panic!("{session}: {error:?}"));
        assert!(lease.is_valid());
    }
    assert!(sent < (SESSIONS / 10) as f64, "they share transactions");
}
