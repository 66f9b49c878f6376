//! Group commit across sessions: the appends of one store's journals share transactions, and
//! each journal still learns its own truth. Each journal stays one chain with every
//! acknowledged append exactly once; a takeover of one session under shared transactions
//! fences that session's callers only; and when the replies of shared transactions are lost,
//! every caller of every session in them learns "committed"; and when a successor trims the
//! records of a shared transaction whose reply was lost, no caller is told "fenced". The
//! fences of journals opened together share transactions too, and one that cannot be written
//! does not stop the others.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::GetOptions;
use leasehold::testing::{AppendHistory, FaultProxy, check_journal, wait_for};
use leasehold::{Appended, Journal, JournalLimits, JournalWriteError, Lease, Store, Uuid};

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

/// Store a, through `proxy`, with one append transaction in flight: the appends that wait for
/// it share the next.
async fn one_slot_store(etcd: &common::Etcd, proxy: &FaultProxy) -> Store {
    let options = leasehold::StoreOptions::new([proxy.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node("a")
        .with_ttl(Duration::from_secs(30), Duration::from_secs(1))
        .with_journal_limits(JournalLimits::default().with_in_flight(1));
    Store::connect(options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_keeps_at_most_its_in_flight_transactions_and_the_waiting_appends_share_the_next() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let a = one_slot_store(&etcd, &proxy).await;
    let held = hold(&a, 16).await;
    // The last fence's transaction keeps the slot for a turn after its answer.
    tokio::time::sleep(Duration::from_millis(100)).await;

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

#[tokio::test(flavor = "multi_thread")]
async fn a_shared_transaction_that_committed_unheard_is_never_told_fenced_after_a_successor_trims_it()
 {
    committed_unheard_then_trimmed(Settled::ByReply).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shared_transaction_that_committed_unheard_and_trimmed_is_never_told_fenced_by_the_resolving_read()
 {
    committed_unheard_then_trimmed(Settled::ByRead).await;
}

/// How the writer of a committed shared transaction hears of it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    /// Its leases still valid, a re-send's reply (the compare failed) tells.
    ByReply,
    /// Its leases released locally first, the resolving read tells.
    ByRead,
}

/// A store whose `sessions` sessions' 3-record batches (`s{i}-1`..`s{i}-3`, seq 2..4 after
/// the fence) went in one shared transaction that committed while its reply was lost; it goes
/// on re-sending while the leases are valid, and hears nothing until `proxy` heals.
struct Unheard {
    etcd: common::Etcd,
    proxy: FaultProxy,
    a: Store,
    held: Vec<Held>,
    appends: Vec<tokio::task::JoinHandle<Result<Appended, JournalWriteError>>>,
    /// The plug's append and its release, to be awaited after the heal.
    plug: tokio::task::JoinHandle<()>,
}

async fn committed_unheard(sessions: usize) -> Unheard {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let a = one_slot_store(&etcd, &proxy).await;
    let mut held = hold(&a, sessions + 1).await;
    let plug = held.pop().expect("one more held");

    // --- phase: a's one slot is taken by an append whose reply is lost; the sessions' 3-record
    // batches queue behind it.
    proxy.drop_replies();
    let plug_append = {
        let journal = plug.journal.clone();
        tokio::spawn(async move {
            let _ = journal.append("plug").await;
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let appends: Vec<_> = held
        .iter()
        .enumerate()
        .map(|(s, held)| {
            let (journal, history) = (held.journal.clone(), held.history.clone());
            tokio::spawn(async move {
                let payload = [format!("s{s}-1"), format!("s{s}-2"), format!("s{s}-3")];
                let call = history.lock().unwrap().invoke();
                let result = journal.append_batch(&payload).await;
                history.lock().unwrap().complete(call, &payload, &result);
                result
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // --- phase: the plug's lease ends, so its append settles (unknown) and frees the slot. The
    // batches go in one shared transaction, which commits; its reply is lost, and a goes
    // on re-sending it while the leases are valid.
    let release = tokio::spawn(async move { plug.lease.release().await });
    let plug = tokio::spawn(async move {
        plug_append.await.unwrap();
        release.await.unwrap().unwrap();
    });
    let mut tips = Vec::new();
    for held in &held {
        tips.push(a.namespace().tip_key(held.session));
    }
    let raw = etcd.raw.clone();
    wait_for(
        "the shared transaction committed",
        Duration::from_secs(20),
        || {
            let (mut raw, tips) = (raw.clone(), tips.clone());
            async move {
                for tip in tips {
                    let kv = raw
                        .get(tip.as_str(), None)
                        .await
                        .ok()?
                        .kvs()
                        .first()?
                        .clone();
                    let tip = leasehold::Tip::decode(kv.key(), kv.value()).ok()?;
                    (tip.seq == 4).then_some(())?;
                }
                Some(())
            }
        },
    )
    .await
    .unwrap();
    let revision_of = |kv: &etcd_client::KeyValue| kv.mod_revision();
    let mut batch_revisions = HashSet::new();
    for held in &held {
        let key = a.namespace().record_key(held.session, 2);
        let got = etcd.raw.clone().get(key, None).await.unwrap();
        batch_revisions.insert(revision_of(&got.kvs()[0]));
    }
    assert_eq!(
        batch_revisions.len(),
        1,
        "the 12 batches shared one transaction"
    );
    Unheard {
        etcd,
        proxy,
        a,
        held,
        appends,
        plug,
    }
}

/// Twelve sessions' 3-record batches share one transaction, which commits while its reply is
/// lost; an operator revokes the sessions, a successor takes each over, fences and trims the
/// batch's first record; then the writer hears etcd again, as `settled` says. No caller may be
/// told "fenced", and every journal passes the checker.
async fn committed_unheard_then_trimmed(settled: Settled) {
    let Unheard {
        etcd,
        proxy,
        a: _a,
        held,
        appends,
        plug,
    } = committed_unheard(12).await;
    let b = etcd.store("b", 30).await;

    // --- phase: an operator revokes the 12 sessions; b takes each over, fences, and trims
    // the first record of a's batch. a hears none of it.
    let mut successors = Vec::new();
    for held in &held {
        etcd.raw
            .clone()
            .delete(held.lease.owner_key(), None)
            .await
            .unwrap();
        let lease = b.acquire_lease(held.session).await.unwrap();
        let journal = b.open_journal(held.session, Some(&lease)).await.unwrap();
        let trimmed = journal.trim(3).await.unwrap();
        assert_eq!(trimmed.base, 3, "a's fence and first record trimmed");
        successors.push((lease, journal));
    }
    assert!(
        held.iter().all(|held| held.lease.is_valid()),
        "a does not know yet"
    );

    // --- phase: a hears etcd again. Whatever its re-sends or its resolving read now show,
    // each of the 12 calls committed: none may be told it failed.
    if settled == Settled::ByRead {
        // The leases end locally: the re-send in flight (at most 500 ms) fails, and the
        // resolving read starts (1 s per attempt). Healing within its first attempt closes
        // that attempt's connection; the next attempt is answered.
        let releases = futures_util::future::join_all(held.iter().map(|held| held.lease.release()));
        tokio::select! {
            _ = releases => panic!("a's releases cannot be confirmed while its replies are lost"),
            _ = tokio::time::sleep(Duration::from_millis(650)) => {}
        }
        assert!(held.iter().all(|held| !held.lease.is_valid()));
    }
    proxy.heal();
    let mut told = BTreeMap::<&str, usize>::new();
    for (s, append) in appends.into_iter().enumerate() {
        let result = append.await.unwrap();
        let kind = match &result {
            Ok(_) => "committed",
            Err(JournalWriteError::OutcomeUnknown(_)) => "unknown",
            Err(other) => panic!("session {s}: its batch committed, yet it was told {other:?}"),
        };
        *told.entry(kind).or_default() += 1;
    }
    println!("12 callers of a committed shared transaction were told: {told:?}");
    plug.await.unwrap();

    // Each journal goes on under b, and is one chain with the batch's two last records in it.
    for (held, (_, journal)) in held.iter().zip(&successors) {
        let result = journal.append(format!("b-{}", held.session)).await;
        held.history
            .lock()
            .unwrap()
            .record(&[format!("b-{}", held.session)], &result);
        result.unwrap();
        let history = held.history.lock().unwrap().clone();
        let report = check_journal(&b, held.session, &history)
            .await
            .unwrap_or_else(|violation| panic!("{violation}"));
        assert_eq!(
            report.fence_epochs.len(),
            1,
            "a's fence is trimmed, b's stands"
        );
    }
}

/// Three of four sessions' journals are deleted and made anew with a 1.4 MiB record in the
/// place of the shared transaction's first record: what the re-sends' `else` branch and the
/// shared resolving read show is over the client's 4 MiB decode limit. Read member by member,
/// the intact session's record is the writer's own: the shared transaction committed, and
/// every caller is told so.
#[tokio::test(flavor = "multi_thread")]
async fn a_shared_outcome_too_large_to_read_at_once_is_read_member_by_member() {
    let Unheard {
        etcd,
        proxy,
        a,
        held,
        appends,
        plug,
    } = committed_unheard(4).await;

    // --- phase: an operator deletes three journals; each is made anew with a large record
    // where the batch's first record was.
    let large = vec![b'x'; 1_400 * 1024];
    for held in &held[1..] {
        let mut raw = etcd.raw.clone();
        let prefix = a.namespace().journal_prefix(held.session);
        raw.delete(
            prefix,
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
        raw.put(
            a.namespace().record_key(held.session, 2),
            large.clone(),
            None,
        )
        .await
        .unwrap();
    }

    // --- phase: a hears etcd again, and its leases end (the resolving read decides).
    let releases = futures_util::future::join_all(held.iter().map(|held| held.lease.release()));
    tokio::select! {
        _ = releases => panic!("a's releases cannot be confirmed while its replies are lost"),
        _ = tokio::time::sleep(Duration::from_millis(650)) => {}
    }
    proxy.heal();
    for (s, append) in appends.into_iter().enumerate() {
        let appended = append.await.unwrap().unwrap_or_else(|error| {
            panic!("session {s}: its batch committed, yet it was told {error:?}")
        });
        assert_eq!(
            (appended.first_seq, appended.last_seq),
            (2, 4),
            "session {s}"
        );
    }
    plug.await.unwrap();
    let history = held[0].history.lock().unwrap().clone();
    check_journal(&a, held[0].session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
}

/// Leases on `sessions` fresh sessions, acquired one after the other.
async fn leases(store: &Store, sessions: usize) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.unwrap());
    }
    leases
}

/// Opens the journals of `leases` all at once.
async fn open_together(
    store: &Store,
    leases: &[Lease],
) -> Vec<Result<Journal, leasehold::OpenJournalError>> {
    let opens = leases
        .iter()
        .map(|lease| store.open_journal(lease.session_id(), Some(lease)));
    futures_util::future::join_all(opens).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fences_of_journals_opened_together_share_transactions() {
    const SESSIONS: usize = 32;
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let leases = leases(&store, SESSIONS).await;

    let before = common::txns(etcd.node.endpoint()).await;
    let journals = open_together(&store, &leases).await;
    let sent = common::txns(etcd.node.endpoint()).await - before;
    println!("{SESSIONS} journals opened together in {sent} etcd transactions");
    let journals: Vec<Journal> = journals
        .into_iter()
        .map(|opened| opened.expect("every journal opens"))
        .collect();
    assert!(
        sent < (SESSIONS / 2) as f64,
        "{SESSIONS} fences in {sent} transactions: they share them"
    );
    // Each journal is one chain: its fence, then what it appends.
    for (lease, journal) in leases.iter().zip(&journals) {
        assert_eq!(journal.next_seq(), 2);
        let mut history = AppendHistory::default();
        let payload = ["after the fence"];
        let call = history.invoke();
        let result = journal.append_batch(&payload).await;
        history.complete(call, &payload, &result);
        let report = check_journal(&store, lease.session_id(), &history).await;
        let report = report.unwrap_or_else(|violation| panic!("{violation}"));
        assert_eq!(report.fence_epochs, [lease.epoch()]);
        assert_eq!((report.records, report.events), (2, 1));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_journal_whose_fence_cannot_be_written_does_not_stop_the_others_opened_with_it() {
    const SESSIONS: usize = 32;
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let leases = leases(&store, SESSIONS).await;

    // One session's tip is overwritten with bytes that do not decode, after its lease read it:
    // its fence's compare fails, and the tip it then reads is garbage.
    let broken = leases[SESSIONS / 2].session_id();
    let tip = store.namespace().tip_key(broken);
    etcd.raw
        .clone()
        .put(tip, b"garbage".to_vec(), None)
        .await
        .unwrap();

    let opened = open_together(&store, &leases).await;
    for (lease, opened) in leases.iter().zip(&opened) {
        match opened {
            Err(leasehold::OpenJournalError::Decode(_)) if lease.session_id() == broken => {}
            Ok(journal) if lease.session_id() != broken => {
                journal.append("after the fence").await.unwrap();
            }
            other => panic!("{}: {other:?}", lease.session_id()),
        }
    }
}
