//! Group commit across sessions: the appends of one store's journals share transactions, and
//! each journal still learns its own truth. Each journal stays one chain with every
//! acknowledged append exactly once; a takeover of one session under shared transactions
//! fences that session's callers only; and when the replies of shared transactions are lost,
//! every caller of every session in them learns "committed".

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::GetOptions;
use leasehold::testing::{AppendHistory, FaultProxy, check_journal};
use leasehold::{Appended, Journal, JournalWriteError, Lease, Store, Uuid};

/// Writers hold it for reading during each call: the test pauses them all by taking it for
/// writing.
type Gate = Arc<tokio::sync::RwLock<()>>;

/// A writer task of session `.0`: the results of its calls.
type Writer = (
    usize,
    tokio::task::JoinHandle<Vec<Result<Appended, JournalWriteError>>>,
);

/// One held session: its lease, its journal and the history of calls made to it.
struct Held {
    session: Uuid,
    lease: Lease,
    journal: Arc<Journal>,
    history: Arc<Mutex<AppendHistory>>,
}

/// `sessions` sessions acquired and opened on `store`.
async fn hold(store: &Store, sessions: usize) -> Vec<Held> {
    let mut held = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let session = Uuid::new_v4();
        let lease = store.acquire_lease(session).await.unwrap();
        let journal = Arc::new(store.open_journal(session, Some(&lease)).await.unwrap());
        held.push(Held {
            session,
            lease,
            journal,
            history: Arc::default(),
        });
    }
    held
}

/// `writers` tasks per session, each appending one event per call until `stop` (or `calls`
/// calls, or its first error), every call noted in its session's history. Session `s`'s
/// writers pass `gate(s)` for each call.
fn write(
    held: &[Held],
    writers: usize,
    calls: Option<usize>,
    stop: &leasehold::CancellationToken,
    gate: impl Fn(usize) -> Gate,
) -> Vec<Writer> {
    let mut tasks = Vec::new();
    for (s, held) in held.iter().enumerate() {
        for w in 0..writers {
            let (journal, history) = (held.journal.clone(), held.history.clone());
            let (stop, gate) = (stop.clone(), gate(s));
            tasks.push((
                s,
                tokio::spawn(async move {
                    let mut results = Vec::new();
                    let mut n = 0;
                    while calls.is_none_or(|calls| n < calls) && !stop.is_cancelled() {
                        let _open = gate.read().await;
                        let payload = [format!("s{s}-w{w}-{n}")];
                        n += 1;
                        let call = history.lock().unwrap().invoke();
                        let result = journal.append_batch(&payload).await;
                        history.lock().unwrap().complete(call, &payload, &result);
                        let failed = result.is_err();
                        results.push(result);
                        if failed {
                            break;
                        }
                    }
                    results
                }),
            ));
        }
    }
    tasks
}

/// How the sessions' records were written: the transactions of each journal (its distinct
/// revisions) summed over the journals, and the distinct revisions of all of them together.
/// Fewer of the latter means journals shared transactions.
async fn transactions(raw: &etcd_client::Client, store: &Store, held: &[Held]) -> (usize, usize) {
    let mut per_journal = 0;
    let mut all = HashSet::new();
    for held in held {
        let prefix = format!("{}r/", store.namespace().journal_prefix(held.session));
        let records = raw
            .clone()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let revisions: HashSet<i64> = records.kvs().iter().map(|kv| kv.mod_revision()).collect();
        per_journal += revisions.len();
        all.extend(revisions);
    }
    (per_journal, all.len())
}

/// `check_journal` for every held session.
async fn check_all(store: &Store, held: &[Held]) -> u64 {
    let mut events = 0;
    for held in held {
        let history = held.history.lock().unwrap().clone();
        let report = check_journal(store, held.session, &history)
            .await
            .unwrap_or_else(|violation| panic!("session {}: {violation}", held.session));
        events += report.events;
    }
    events
}

#[tokio::test(flavor = "multi_thread")]
async fn appends_of_many_sessions_share_transactions_and_each_journal_stays_one_chain() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let held = hold(&store, 24).await;
    let stop = leasehold::CancellationToken::new();

    let mut calls = 0;
    let gate = Gate::default();
    for (_, task) in write(&held, 2, Some(30), &stop, |_| gate.clone()) {
        for result in task.await.unwrap() {
            result.expect("every append commits");
            calls += 1;
        }
    }
    let events = check_all(&store, &held).await;
    assert_eq!(events, calls);
    let (per_journal, shared) = transactions(&etcd.raw, &store, &held).await;
    println!(
        "{calls} calls on 24 sessions: {per_journal} journal transactions in {shared} etcd transactions ({:.1} journals per etcd transaction)",
        per_journal as f64 / shared as f64
    );
    assert!(
        shared * 2 < per_journal,
        "journals with appends waiting for a slot share transactions"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_takeover_of_one_session_under_shared_transactions_fences_only_its_callers() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let a = common::store(&[proxy.endpoint()], &etcd.ns, "a", 30).await;
    let b = etcd.store("b", 30).await;
    let held = hold(&a, 16).await;
    let stop = leasehold::CancellationToken::new();
    // Session 0's writers pass one gate, the others' another.
    let (gate_0, gate_others) = (Gate::default(), Gate::default());
    let tasks = write(&held, 2, None, &stop, |s| {
        if s == 0 { &gate_0 } else { &gate_others }.clone()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Pause the writers and cut a off from etcd. Let the others go: their transactions take
    // every slot (and are held), and the rest queue. Then session 0's: it queues behind them.
    // a still believes it owns every session.
    let (paused_0, paused_others) = (gate_0.write().await, gate_others.write().await);
    proxy.blackhole();
    drop(paused_others);
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(paused_0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // An admin hands session 0 to b, whose fence goes in; then a hears etcd again. When a slot
    // frees, the queued appends go in one shared transaction, session 0's among them: it can
    // never apply now.
    let taken = &held[0];
    etcd.raw
        .clone()
        .delete(taken.lease.owner_key(), None)
        .await
        .unwrap();
    let lease_b = b.acquire_lease(taken.session).await.unwrap();
    let journal_b = b.open_journal(taken.session, Some(&lease_b)).await.unwrap();
    assert!(taken.lease.is_valid(), "a does not know yet");
    proxy.heal();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.cancel();

    let mut outcomes: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for (s, task) in tasks {
        for result in task.await.unwrap() {
            let (ok, ended) = outcomes.entry(s).or_default();
            match (s, result) {
                (_, Ok(_)) => *ok += 1,
                (0, Err(JournalWriteError::Fenced(_) | JournalWriteError::LeaseLost(_))) => {
                    *ended += 1;
                }
                (s, Err(other)) => {
                    panic!("session {s} was not taken over, yet an append failed: {other:?}")
                }
            }
        }
    }
    let others: usize = outcomes.iter().skip(1).map(|(_, (ok, _))| ok).sum();
    println!(
        "session 0: {} committed, {} fenced; the 15 others: {others} committed, none failed",
        outcomes[&0].0, outcomes[&0].1
    );
    assert_eq!(outcomes[&0].1, 2, "both of session 0's writers end fenced");
    assert!(taken.journal.is_broken());

    let result = journal_b.append("b-1").await;
    taken.history.lock().unwrap().record(&["b-1"], &result);
    result.unwrap();
    let events = check_all(&a, &held).await;
    let history = taken.history.lock().unwrap().clone();
    let report = check_journal(&b, taken.session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.fence_epochs, [taken.lease.epoch(), lease_b.epoch()]);
    println!("{events} events checked");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_keeps_at_most_its_in_flight_transactions_and_the_waiting_appends_share_the_next() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let options = leasehold::StoreOptions::new([proxy.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node("a")
        .with_ttl(Duration::from_secs(30), Duration::from_secs(1))
        .with_journal_limits(leasehold::JournalLimits::default().with_in_flight(1));
    let a = Store::connect(options).await.unwrap();
    let held = hold(&a, 16).await;

    // The first append takes the one transaction in flight, and is held; the 15 others wait.
    proxy.blackhole();
    let appends: Vec<_> = held
        .iter()
        .map(|held| {
            let journal = held.journal.clone();
            tokio::spawn(async move { journal.append("e").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.heal();
    for (held, append) in held.iter().zip(appends) {
        let result = append.await.unwrap();
        held.history.lock().unwrap().record(&["e"], &result);
        result.expect("every append commits");
    }
    check_all(&a, &held).await;
    // Each journal: its fence (alone) and its append. The 16 appends: the first alone, then
    // the 15 that waited in one transaction.
    let (per_journal, all) = transactions(&etcd.raw, &a, &held).await;
    assert_eq!(per_journal, 32);
    assert_eq!(all, 16 + 2, "16 fences, then 2 append transactions");
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_replies_of_shared_transactions_resolve_to_committed_for_every_session() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let store = common::store(&[proxy.endpoint()], &etcd.ns, "a", 30).await;
    let held = hold(&store, 16).await;
    let stop = leasehold::CancellationToken::new();
    let gate = Gate::default();
    let tasks = write(&held, 2, None, &stop, |_| gate.clone());

    // With 32 writers on 16 sessions, shared transactions are always in flight.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.drop_replies();
        tokio::time::sleep(Duration::from_millis(700)).await;
        proxy.heal();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    let mut calls = 0;
    for (s, task) in tasks {
        for result in task.await.unwrap() {
            result.unwrap_or_else(|error| {
                panic!(
                    "session {s}: resolved as committed, never left unknown or failed: {error:?}"
                )
            });
            calls += 1;
        }
    }
    for held in &held {
        let history = held.history.lock().unwrap();
        assert_eq!(history.unknown() + history.failed(), 0);
    }
    let events = check_all(&store, &held).await;
    let (per_journal, shared) = transactions(&etcd.raw, &store, &held).await;
    println!(
        "{calls} calls, {events} events, {per_journal} journal transactions in {shared} etcd transactions, across 4 losses of replies"
    );
    assert!(shared * 4 < per_journal * 3, "transactions were shared");
}
