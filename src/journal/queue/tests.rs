//! The append queue's unit tests: how transactions are formed and what each call is told,
//! with no etcd (nothing is sent).

use std::time::Duration;

use tokio::time::Instant;

use super::writer::Broken;
use super::*;
use crate::journal::cas::tests::unknown;
use crate::journal::key::IdempotencyKey;
use crate::journal::keyed::KeyBudget;
use crate::journal::keyed::{Answering, Begun};
use crate::journal::{Record, record};
use crate::keys::Namespace;
use crate::lease::{Epoch, LeaseState, LossReason, NodeLease};

async fn batcher(limits: JournalLimits) -> Arc<Batcher> {
    Batcher::new(BatcherParts {
        connection: Connection::unconnected("http://127.0.0.1:1").await,
        policy: WritePolicy::default(),
        limits,
        metrics: Metrics::new("n", &Namespace::default()),
        stop: CancellationToken::new(),
        tasks: TaskTracker::new(),
        span: tracing::Span::none(),
        hook: None,
    })
}

/// Session `session`'s lease state and a journal writer under it, next at seq 1.
fn writer(session: u128) -> (Arc<LeaseState>, Arc<Writer>) {
    let valid_until = crate::deadline::deadline(Instant::now(), Duration::from_secs(60));
    let node = Arc::new(NodeLease::new(1, valid_until));
    let key = format!("ns/owners/{session}");
    let state = LeaseState::new(Uuid::from_u128(session), Epoch(40), key, Uuid::nil(), node);
    let ownership = Ownership::new(state.clone());
    let keys = KeyBudget::new(100);
    (
        state,
        Writer::new(ownership, Namespace::default(), 1, 5, &keys),
    )
}

/// Queues a call of `records` records on `writer`: where it found the journal, and the
/// receiver of its answer (a call whose receiver is dropped is withdrawn).
fn join(
    batcher: &Batcher,
    writer: &Arc<Writer>,
    records: usize,
) -> (Joined, oneshot::Receiver<Answer>) {
    let (reply, answer) = oneshot::channel();
    let payloads = vec![b"event".to_vec(); records];
    let records = Records::Events(payloads);
    let joined = batcher.join(writer, Call::new(records, reply)).unwrap();
    (joined, answer)
}

/// Queues a call of `records` records on `writer`; its answer comes on the receiver.
fn call(batcher: &Batcher, writer: &Arc<Writer>, records: usize) -> oneshot::Receiver<Answer> {
    join(batcher, writer, records).1
}

/// Queues a call of one record on `writer` (see `join`).
fn join_one(batcher: &Batcher, writer: &Arc<Writer>) -> (Joined, oneshot::Receiver<Answer>) {
    join(batcher, writer, 1)
}

/// Whether a call of one record to `writer` would join its queue now, or why not.
fn join_now(batcher: &Batcher, writer: &Arc<Writer>) -> Result<(), JournalWriteError> {
    let (reply, _answer) = oneshot::channel();
    let payloads = vec![b"e".to_vec()];
    batcher
        .join(writer, Call::new(Records::Events(payloads), reply))
        .map(|_| ())
}

fn sessions(members: &[Member]) -> Vec<u128> {
    members
        .iter()
        .map(|m| m.ownership().session_id().as_u128())
        .collect()
}

fn committed(revision: i64) -> Sent {
    Sent::Committed {
        revision,
        by_read: false,
        for_space: false,
    }
}

fn settle(batcher: &Batcher, members: Vec<Member>, sent: impl Fn() -> Sent) {
    for member in members {
        finish(batcher, member, sent());
    }
}

/// What the store's task does when `member`'s transaction came to `sent`.
fn finish(batcher: &Batcher, member: Member, sent: Sent) {
    let writer = member.writer.clone();
    batcher.finish(member, sent);
    batcher.land(&writer);
}

#[tokio::test]
async fn ready_journals_go_in_order_one_per_session_within_etcd_limits() {
    // Room for 3 members' compares (3 each) in 10 operations per branch.
    let batcher = batcher(JournalLimits::default().with_max_txn_ops(10)).await;
    let (_s1, w1) = writer(1);
    let (_s2, w2) = writer(2);
    let (_s1b, w1b) = writer(1); // a stale journal of session 1 and its successor
    let (_s3, w3) = writer(3);
    let (_s4, w4) = writer(4);
    let answers: Vec<_> = [&w1, &w2, &w1b, &w3, &w4]
        .into_iter()
        .map(|w| call(&batcher, w, 1))
        .collect();
    let first = batcher.take();
    assert_eq!(sessions(&first), [1, 2, 3]);
    // The journals in flight are not taken again; the rest go first next time.
    let second = batcher.take();
    assert_eq!(sessions(&second), [1, 4]);
    assert!(batcher.take().is_empty());
    settle(&batcher, first, || committed(60));
    settle(&batcher, second, || committed(61));
    for answer in answers {
        assert!(answer.await.unwrap().result.is_ok());
    }
}

#[tokio::test]
async fn one_journals_calls_share_one_append_within_its_limits_each_with_its_own_range() {
    // At most 4 records per append.
    let batcher = batcher(JournalLimits::default().with_max_txn_ops(5)).await;
    let (_state, w) = writer(1);
    let answers: Vec<_> = [2, 1, 2, 1].map(|n| call(&batcher, &w, n)).into();
    let members = batcher.take();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].records, 3, "the third call would make 5 records");
    assert!(w.state().in_flight);
    // While it is in flight, nothing more of this journal is taken.
    assert!(batcher.take().is_empty());
    settle(&batcher, members, || Sent::Committed {
        revision: 70,
        by_read: true,
        for_space: false,
    });
    // The rest is listed again, after the committed tip.
    let members = batcher.take();
    assert_eq!(members[0].records, 3);
    assert_eq!(members[0].first_seq, 4);
    let tip = |w: &Writer| {
        let state = w.state();
        (state.next_seq, state.tip_mod_revision)
    };
    assert_eq!(tip(&w), (4, 70));
    settle(&batcher, members, || committed(71));
    let mut ranges = Vec::new();
    for answer in answers {
        let answer = answer.await.unwrap();
        let appended = answer.result.unwrap();
        ranges.push((appended.first_seq, appended.last_seq, answer.by_read));
    }
    assert_eq!(
        ranges,
        [(1, 2, true), (3, 3, true), (4, 5, false), (6, 6, false)]
    );
    assert_eq!(w.state().next_seq, 7);

    // At most 3 records: a call of 1 and one of 3 go in separate appends.
    let batcher = self::batcher(JournalLimits::default().with_max_txn_ops(4)).await;
    let (_state, w) = writer(2);
    let _answers: Vec<_> = [1, 3].map(|n| call(&batcher, &w, n)).into();
    assert_eq!(batcher.take()[0].records, 1);
}

#[tokio::test]
async fn a_fenced_or_unknown_append_breaks_the_journal_and_refuses_the_calls_after_it() {
    let batcher = batcher(JournalLimits::default()).await;
    for (sent, expect) in [
        (Sent::Fenced { by_read: false }, "Fenced"),
        (Sent::Unknown(unknown()), "OutcomeUnknown"),
    ] {
        let (_state, w) = writer(1);
        let first = call(&batcher, &w, 1);
        let members = batcher.take();
        let waiting = call(&batcher, &w, 1);
        finish(&batcher, members.into_iter().next().unwrap(), sent);
        assert!(w.is_broken());
        let told = format!("{:?}", first.await.unwrap().result);
        assert!(told.starts_with(&format!("Err({expect}")), "{told}");
        // The call that waited is refused when its turn comes, without being sent.
        assert!(batcher.take().is_empty());
        let refused = waiting.await.unwrap().result;
        assert!(matches!(
            refused,
            Err(JournalWriteError::Fenced(_) | JournalWriteError::Indeterminate)
        ));
        // And a later call at once.
        assert!(join_now(&batcher, &w).is_err());
    }
}

#[tokio::test]
async fn a_call_whose_caller_went_away_before_a_transaction_took_it_is_never_sent() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    drop(call(&batcher, &w, 1));
    let kept = call(&batcher, &w, 2);
    let members = batcher.take();
    assert_eq!(members[0].records, 2);
    settle(&batcher, members, || committed(60));
    let appended = kept.await.unwrap().result.unwrap();
    assert_eq!((appended.first_seq, appended.last_seq), (1, 2));

    // Withdrawn alone: the journal leaves the ready list, nothing is sent.
    let (_state, w) = writer(2);
    drop(call(&batcher, &w, 1));
    assert!(batcher.take().is_empty());
    assert!(!w.state().listed);
}

#[tokio::test]
async fn a_lost_lease_refuses_the_waiting_calls_without_sending_and_breaks_the_journal() {
    let batcher = batcher(JournalLimits::default()).await;
    let (state, w) = writer(1);
    let waiting = call(&batcher, &w, 1);
    state.lose(LossReason::Overtaken);
    assert!(batcher.take().is_empty());
    assert!(matches!(
        waiting.await.unwrap().result,
        Err(JournalWriteError::LeaseLost(_))
    ));
    assert!(w.is_broken());
    assert!(matches!(
        join_now(&batcher, &w),
        Err(JournalWriteError::LeaseLost(_))
    ));
}

#[tokio::test]
async fn close_waits_for_the_append_in_flight_then_refuses() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    let first = call(&batcher, &w, 1);
    let members = batcher.take();
    let closing = tokio::spawn({
        let w = w.clone();
        async move { w.close().await }
    });
    tokio::task::yield_now().await;
    assert!(!closing.is_finished(), "an append is in flight");
    settle(&batcher, members, || committed(60));
    closing.await.unwrap();
    assert!(first.await.unwrap().result.is_ok());
    assert!(matches!(
        join_now(&batcher, &w),
        Err(JournalWriteError::Closed)
    ));
}

#[tokio::test]
async fn a_transaction_dropped_unsettled_leaves_its_journals_indeterminate() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    let first = call(&batcher, &w, 1);
    let members = batcher.take();
    let waiting = call(&batcher, &w, 1);
    drop(members);
    assert!(w.is_broken());
    assert!(!w.state().in_flight);
    assert!(first.await.is_err(), "its caller hears Indeterminate");
    assert!(matches!(
        waiting.await.unwrap().result,
        Err(JournalWriteError::Indeterminate)
    ));
}

#[tokio::test]
async fn a_journal_at_the_end_of_its_sequence_numbers_refuses_without_sending() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    w.state().next_seq = u64::MAX - 1;
    let answer = call(&batcher, &w, 2);
    assert!(batcher.take().is_empty());
    assert!(matches!(
        answer.await.unwrap().result,
        Err(JournalWriteError::SequenceExhausted { .. })
    ));
}

#[tokio::test]
async fn only_the_call_that_lists_its_journal_pumps() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    let mut answers = Vec::new();
    let mut join = || {
        let (joined, answer) = join_one(&batcher, &w);
        answers.push(answer);
        joined
    };
    assert_eq!(join(), Joined::Listed);
    assert_eq!(join(), Joined::Behind, "listed");
    assert_eq!(lock(&batcher.ready).len(), 1, "listed once");
    let members = batcher.take();
    assert_eq!(join(), Joined::Behind, "in flight");
    assert!(lock(&batcher.ready).is_empty(), "in flight, not listed");
    // Its transaction's end lists it again, for the call that waited (its task pumps).
    settle(&batcher, members, || committed(60));
    assert!(w.state().listed);
    assert_eq!(join(), Joined::Behind);
    let members = batcher.take();
    assert_eq!(members[0].records, 2);
    settle(&batcher, members, || committed(61));
    assert!(!w.state().listed && !w.state().in_flight);
    assert_eq!(join(), Joined::Listed, "idle again");
}

#[tokio::test]
async fn a_transaction_takes_journals_while_their_puts_fit_etcds_operations_limit() {
    // 20 operations: room for 6 members' compares, but 4 appends of 4 records put 20 keys
    // (each with its tip).
    let batcher = batcher(JournalLimits::default().with_max_txn_ops(20)).await;
    let writers: Vec<_> = (1..=5).map(writer).collect();
    let _answers: Vec<_> = writers.iter().map(|(_, w)| call(&batcher, w, 4)).collect();
    assert_eq!(sessions(&batcher.take()), [1, 2, 3, 4]);
    assert_eq!(sessions(&batcher.take()), [5]);
    // One operation fewer: the fourth append's five puts no longer fit.
    let batcher = self::batcher(JournalLimits::default().with_max_txn_ops(19)).await;
    let writers: Vec<_> = (1..=5).map(writer).collect();
    let _answers: Vec<_> = writers.iter().map(|(_, w)| call(&batcher, w, 4)).collect();
    assert_eq!(sessions(&batcher.take()), [1, 2, 3]);
}

#[tokio::test]
async fn a_transaction_takes_journals_while_their_compares_fit_etcds_operations_limit() {
    // 12 operations: 4 members' compares exactly; their puts (2 each) would allow 6.
    let batcher = batcher(JournalLimits::default().with_max_txn_ops(12)).await;
    let writers: Vec<_> = (1..=5).map(writer).collect();
    let _answers: Vec<_> = writers.iter().map(|(_, w)| call(&batcher, w, 1)).collect();
    assert_eq!(sessions(&batcher.take()), [1, 2, 3, 4]);
}

#[tokio::test]
async fn a_transaction_takes_journals_while_their_size_fits_etcds_request_limit() {
    let (_state, probe) = writer(1);
    let one = probe.encoded_size(&[b"event"], false);
    // Exactly three members' appends of one record each.
    let limits = JournalLimits::default().with_max_request_bytes(1024 + 3 * one);
    let batcher = batcher(limits).await;
    let writers: Vec<_> = (1..=4).map(writer).collect();
    let _answers: Vec<_> = writers.iter().map(|(_, w)| call(&batcher, w, 1)).collect();
    assert_eq!(sessions(&batcher.take()), [1, 2, 3]);
    assert_eq!(sessions(&batcher.take()), [4]);
}

#[tokio::test]
async fn one_journals_append_takes_calls_while_its_size_fits() {
    let (_state, probe) = writer(1);
    let (one, two) = (
        probe.encoded_size(&[b"event"], false),
        probe.encoded_size(&[b"event", b"event"], false),
    );
    let per_record = two - one;
    // Exactly the fixed part and three records.
    let limits = JournalLimits::default().with_max_request_bytes(1024 + one + 2 * per_record);
    let batcher = batcher(limits).await;
    let (_state, w) = writer(1);
    let _answers: Vec<_> = (0..4).map(|_| call(&batcher, &w, 1)).collect();
    let members = batcher.take();
    assert_eq!(members[0].records, 3);
    settle(&batcher, members, || committed(60));
    assert_eq!(batcher.take()[0].records, 1);
}

#[tokio::test(start_paused = true)]
async fn a_breaking_wakes_its_waiters_and_runs_its_hooks_once() {
    let broken = Arc::new(Broken::default());
    let ran = Arc::new(Mutex::new(Vec::new()));
    for name in ["first", "second"] {
        let ran = ran.clone();
        broken.on_set(move || ran.lock().unwrap().push(name));
    }
    let waiter = tokio::spawn({
        let broken = broken.clone();
        async move { broken.wait().await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiter.is_finished() && ran.lock().unwrap().is_empty());
    broken.set();
    broken.set();
    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("the waiter is woken")
        .unwrap();
    let late = ran.clone();
    broken.on_set(move || late.lock().unwrap().push("late"));
    assert_eq!(*ran.lock().unwrap(), ["first", "second", "late"]);
    broken.wait().await;
}

/// Queues a call of `records` records under idempotency key `id` on `writer`, as its key's
/// first call; its answer comes on the receiver.
fn call_keyed(
    batcher: &Batcher,
    writer: &Arc<Writer>,
    id: &str,
    records: usize,
) -> oneshot::Receiver<Answer> {
    let key = IdempotencyKey::new(id);
    let Begun::First(ticket) = writer.keys().begin(key, 0) else {
        panic!("{id} is new")
    };
    let (reply, answer) = oneshot::channel();
    let mut call = Call::new(Records::Keyed(key, vec![b"event".to_vec(); records]), reply);
    call.ticket = Some(ticket);
    batcher.join(writer, call).unwrap();
    answer
}

fn begun(writer: &Writer, id: &str) -> &'static str {
    match writer.keys().begin_answer(IdempotencyKey::new(id), 0) {
        Answering::Nothing => "nothing",
        Answering::Wait(_) => "wait",
        Answering::Committed(_) => "committed",
        Answering::Unknown => "unknown",
        Answering::Reused => "reused",
    }
}

#[tokio::test]
async fn a_keyed_call_carries_its_key_on_each_record_and_its_answer_goes_to_the_journals_keys() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    let plain = call(&batcher, &w, 1);
    let keyed = call_keyed(&batcher, &w, "k1", 2);
    assert_eq!(begun(&w, "k1"), "wait");
    let members = batcher.take();
    // Both calls share one append: the keyed call's records are its second and third, each
    // naming the whole keyed append.
    let mut seq = members[0].first_seq;
    let mut values: Vec<Record> = Vec::new();
    for call in &members[0].calls {
        for value in call.records.encode(seq, Epoch(40), Uuid::nil()) {
            values.push(record::decode_record(b"k", Some(seq), &value).unwrap());
            seq += 1;
        }
    }
    let ranges: Vec<_> = values
        .iter()
        .map(|r| match r {
            Record::Event(event) => event.keyed_append(),
            Record::Fence(_) => panic!("events only"),
        })
        .collect();
    assert_eq!(ranges, [None, Some((2, 3)), Some((2, 3))]);
    settle(&batcher, members, || committed(80));
    assert!(plain.await.unwrap().result.is_ok());
    let told = keyed.await.unwrap().result.unwrap();
    assert_eq!((told.first_seq, told.last_seq), (2, 3));
    assert!(matches!(
        w.keys().begin_answer(IdempotencyKey::new("k1"), 0),
        Answering::Committed(2)
    ));
}

#[tokio::test]
async fn a_keyed_call_withdrawn_frees_its_key_and_one_dropped_in_flight_leaves_it_unknown() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    // Its caller goes away before a transaction takes it: nothing was sent.
    drop(call_keyed(&batcher, &w, "gone", 1));
    let kept = call_keyed(&batcher, &w, "kept", 1);
    let members = batcher.take();
    assert_eq!(members[0].records, 1, "the withdrawn call is not sent");
    assert_eq!(begun(&w, "gone"), "nothing");
    // The transaction goes away unsettled (its runtime shut down): it may yet apply.
    drop(members);
    assert!(matches!(
        kept.await.map(|answer| answer.result),
        Err(_) | Ok(Err(JournalWriteError::Indeterminate))
    ));
    assert_eq!(begun(&w, "kept"), "unknown");
}

#[tokio::test]
async fn a_keyed_call_refused_or_fenced_frees_its_key() {
    let batcher = batcher(JournalLimits::default()).await;
    let (_state, w) = writer(1);
    let fenced = call_keyed(&batcher, &w, "f", 1);
    let members = batcher.take();
    let refused = call_keyed(&batcher, &w, "r", 1);
    settle(&batcher, members, || Sent::Fenced { by_read: false });
    assert!(matches!(
        fenced.await.unwrap().result,
        Err(JournalWriteError::Fenced(_))
    ));
    assert!(batcher.take().is_empty());
    assert!(refused.await.unwrap().result.is_err());
    assert_eq!((begun(&w, "f"), begun(&w, "r")), ("nothing", "nothing"));
}
