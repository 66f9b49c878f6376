//! Unit tests of `write.rs`.

use super::*;

const SENDS: [Sends; 2] = [Sends::NoneApplied, Sends::MaybeApplied];
const ATTEMPTS: [Attempt; 5] = [
    Attempt::Replied,
    Attempt::NotApplied,
    Attempt::Unknown,
    Attempt::Permanent,
    Attempt::RefusedForSpace,
];

/// The table, spelled out: (sends so far, this attempt, go on) → next.
fn expected(sends: Sends, attempt: Attempt, go_on: bool) -> Next {
    use Attempt as A;
    use Sends as S;
    match (sends, attempt, go_on) {
        (S::NoneApplied, A::Replied, _) => Next::Accept,
        (S::NoneApplied, A::NotApplied, true) => Next::Resend(S::NoneApplied),
        (S::NoneApplied, A::NotApplied, false) => Next::Fail,
        (S::NoneApplied, A::Unknown, true) => Next::Resend(S::MaybeApplied),
        (S::NoneApplied, A::Unknown, false) => Next::Resolve,
        (S::NoneApplied, A::Permanent, _) => Next::Fail,
        (S::NoneApplied, A::RefusedForSpace, _) => Next::Check,
        (S::MaybeApplied, A::Replied, _) => Next::Accept,
        (S::MaybeApplied, A::NotApplied, true) => Next::Resend(S::MaybeApplied),
        (S::MaybeApplied, A::NotApplied, false) => Next::Resolve,
        (S::MaybeApplied, A::Unknown, true) => Next::Resend(S::MaybeApplied),
        (S::MaybeApplied, A::Unknown, false) => Next::Resolve,
        (S::MaybeApplied, A::Permanent, _) => Next::Resolve,
        (S::MaybeApplied, A::RefusedForSpace, _) => Next::Resolve,
    }
}

#[test]
fn every_pair_of_first_and_later_outcome_is_decided() {
    // First sends (from NoneApplied), then every re-send outcome after each of them.
    for first in ATTEMPTS {
        for go_on in [true, false] {
            assert_eq!(
                next(Sends::NoneApplied, first, go_on),
                expected(Sends::NoneApplied, first, go_on),
                "first {first:?}, go on {go_on}"
            );
        }
        let Next::Resend(after_first) = next(Sends::NoneApplied, first, true) else {
            continue;
        };
        for resend in ATTEMPTS {
            for go_on in [true, false] {
                assert_eq!(
                    next(after_first, resend, go_on),
                    expected(after_first, resend, go_on),
                    "first {first:?}, re-send {resend:?}, go on {go_on}"
                );
            }
        }
    }
    for sends in SENDS {
        for attempt in ATTEMPTS {
            for go_on in [true, false] {
                assert_eq!(next(sends, attempt, go_on), expected(sends, attempt, go_on));
            }
        }
    }
}

#[test]
fn a_write_that_may_have_applied_is_never_reported_as_failed() {
    for attempt in ATTEMPTS {
        for go_on in [true, false] {
            assert_ne!(next(Sends::MaybeApplied, attempt, go_on), Next::Fail);
        }
    }
    // And once maybe applied, it stays so.
    for attempt in ATTEMPTS {
        if let Next::Resend(sends) = next(Sends::MaybeApplied, attempt, true) {
            assert_eq!(sends, Sends::MaybeApplied);
        }
    }
}

/// etcd applies the transaction that crosses its quota and answers it NOSPACE: a refusal
/// for space is never taken as certainly not applied, nor sent again.
#[test]
fn a_write_refused_for_space_is_read_never_failed_nor_re_sent() {
    for sends in SENDS {
        for go_on in [true, false] {
            let next = next(sends, Attempt::RefusedForSpace, go_on);
            assert!(matches!(next, Next::Check | Next::Resolve), "{next:?}");
        }
    }
    assert_eq!(
        Attempt::of(&EtcdError::no_space("append")),
        Attempt::RefusedForSpace
    );
}

#[test]
fn a_valid_lease_keeps_an_unknown_write_going() {
    for sends in SENDS {
        assert_eq!(
            next(sends, Attempt::Unknown, true),
            Next::Resend(Sends::MaybeApplied)
        );
        assert_eq!(next(sends, Attempt::Unknown, false), Next::Resolve);
    }
}

#[test]
fn re_sends_are_short_until_a_run_of_them_goes_unanswered_then_double_up_to_the_first() {
    let policy = WritePolicy::default();
    let ms = Duration::from_millis;
    for timed_out in 0..PATIENT_AFTER {
        assert_eq!(resend_timeout(&policy, timed_out), ms(250), "{timed_out}");
    }
    assert_eq!(resend_timeout(&policy, PATIENT_AFTER), ms(500));
    assert_eq!(resend_timeout(&policy, PATIENT_AFTER + 1), ms(1000));
    assert_eq!(
        resend_timeout(&policy, PATIENT_AFTER + 2),
        ms(1000),
        "capped"
    );
    assert_eq!(resend_timeout(&policy, u32::MAX), ms(1000));
    // Extremes neither panic nor exceed the first attempt's timeout.
    let huge = WritePolicy::default()
        .with_resend_timeout(Duration::MAX)
        .with_attempt_timeout(Duration::MAX);
    assert_eq!(resend_timeout(&huge, u32::MAX), Duration::MAX);
    let zero = WritePolicy::default().with_resend_timeout(Duration::ZERO);
    assert_eq!(resend_timeout(&zero, u32::MAX), Duration::ZERO);
}

/// Re-sends after sends that got no answer go at once, each within the re-send timeout,
/// which doubles once PATIENT_AFTER re-sends in a row got none (the first attempt, with a
/// timeout of its own, does not count); a fast failure backs off and starts the count over.
#[test]
fn re_sends_are_paced_by_what_the_sends_before_them_met() {
    let ms = Duration::from_millis;
    let policy = WritePolicy::default();
    let mut pacing = Pacing::new(&policy);
    // The first attempt and PATIENT_AFTER - 1 re-sends got no answer: still 250 ms each.
    for _ in 0..PATIENT_AFTER {
        assert_eq!(pacing.resend(true), (Duration::ZERO, ms(250)));
    }
    assert_eq!(pacing.resend(true), (Duration::ZERO, ms(500)));
    assert_eq!(pacing.resend(true), (Duration::ZERO, ms(1000)));
    // A fast failure: a pause of the policy's backoff (jittered up to as much again), and
    // the count starts over.
    let (pause, timeout) = pacing.resend(false);
    assert!(
        policy.initial_backoff <= pause && pause < policy.initial_backoff * 2,
        "{pause:?}"
    );
    assert_eq!(timeout, ms(250));
    for _ in 1..PATIENT_AFTER {
        assert_eq!(pacing.resend(true), (Duration::ZERO, ms(250)));
    }
    assert_eq!(pacing.resend(true), (Duration::ZERO, ms(500)));
}

fn status(code: tonic::Code, message: &str) -> EtcdError {
    EtcdError::new(
        "append",
        "http://e",
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message)),
    )
}

/// A send that got no answer in time is sent again at once, to the next endpoint; one that
/// failed fast, after a pause. The first failure that may have applied is the one an
/// outcome left unknown reports.
#[test]
fn a_write_sends_again_to_the_next_endpoint_and_reports_its_first_unknown_failure() {
    let policy = WritePolicy::default();
    let unavailable = || status(tonic::Code::Unavailable, "etcdserver: no leader");
    let timed_out = |n: u32| status(tonic::Code::DeadlineExceeded, &format!("timeout {n}"));
    let mut sending = Sending::new(&policy, Instant::now(), 2, 3);
    assert_eq!(
        (sending.endpoint, sending.timeout),
        (2, policy.attempt_timeout)
    );
    // Refused, not applied: a pause, the next endpoint (round the list).
    let Step::Resend { pause } = sending.failed(unavailable(), false, true) else {
        panic!("sent again");
    };
    assert!(pause >= policy.initial_backoff, "{pause:?}");
    assert_eq!(sending.endpoint, 0);
    assert!(sending.unknown.is_none(), "not applied");
    // No answer in time: at once, the re-send timeout; this one may have applied.
    let Step::Resend { pause } = sending.failed(timed_out(1), false, true) else {
        panic!("sent again");
    };
    assert_eq!(pause, Duration::ZERO);
    assert_eq!(
        (sending.endpoint, sending.timeout),
        (1, policy.resend_timeout)
    );
    assert!(matches!(
        sending.failed(timed_out(2), false, true),
        Step::Resend { .. }
    ));
    // The caller's condition fails: settled by reading, reporting the first unknown one.
    match sending.failed(unavailable(), false, false) {
        Step::Resolve(error) => {
            assert!(format!("{error:?}").contains("timeout 1"), "{error:?}")
        }
        step => panic!("{step:?}"),
    }
    // Refused, never maybe applied, and no going on: failed with its own error.
    let mut sending = Sending::new(&policy, Instant::now(), 0, 1);
    assert!(matches!(
        sending.failed(unavailable(), false, true),
        Step::Resend { .. }
    ));
    assert_eq!(sending.endpoint, 0, "one endpoint");
    match sending.failed(unavailable(), false, false) {
        Step::Fail(error) => assert!(format!("{error:?}").contains("no leader"), "{error:?}"),
        step => panic!("{step:?}"),
    }
    // Cut short by the store's shutdown: maybe applied, whatever it met.
    let mut sending = Sending::new(&policy, Instant::now(), 0, 1);
    match sending.failed(unavailable(), true, false) {
        Step::Resolve(error) => {
            assert!(format!("{error:?}").contains("no leader"), "{error:?}")
        }
        step => panic!("{step:?}"),
    }
    // Refused for space on the first send: read once.
    let space = EtcdError::no_space("append");
    let mut sending = Sending::new(&policy, Instant::now(), 0, 1);
    assert!(matches!(sending.failed(space, false, true), Step::Check(_)));
}

#[test]
fn a_resolving_read_tries_each_endpoint_twice_unless_it_would_fail_the_same_way() {
    assert_eq!(read_attempts(0), 2);
    assert_eq!(read_attempts(1), 2);
    assert_eq!(read_attempts(3), 6);
    assert!(read_again(&status(
        tonic::Code::Unavailable,
        "etcdserver: no leader"
    )));
    assert!(read_again(&EtcdError::timed_out(
        "resolving read",
        "http://e",
        Duration::from_secs(1)
    )));
    assert!(!read_again(&status(
        tonic::Code::PermissionDenied,
        "etcdserver: permission denied"
    )));
}

/// A write goes on while its deadline is ahead, not at it; never once abandoned; and asks the
/// caller's condition only when nothing else has ended it.
#[test]
fn a_write_goes_on_until_its_deadline_not_at_it() {
    let start = Instant::now();
    let deadline = Duration::from_secs(2);
    let policy = WritePolicy::default().with_deadline(deadline);
    let sending = Sending::new(&policy, start, 0, 1);
    let just_before = start + deadline - Duration::from_nanos(1);
    assert!(sending.goes_on(start, false, || true));
    assert!(sending.goes_on(just_before, false, || true));
    assert!(!sending.goes_on(start + deadline, false, || true), "at it");
    assert!(
        !sending.goes_on(start, false, || false),
        "the caller's condition"
    );
    let not_asked = || panic!("the condition is asked only while the write may go on");
    assert!(!sending.goes_on(start, true, not_asked), "abandoned");
    assert!(!sending.goes_on(start + deadline, false, not_asked));
    // No deadline: on for as long as the caller's condition holds.
    let forever = WritePolicy::default();
    let sending = Sending::new(&forever, start, 0, 1);
    assert!(sending.goes_on(start + Duration::from_secs(86_400 * 365), false, || true));
}

/// A resolving read makes its attempts however little time they took, and more while the
/// time that many could take at their whole timeout lasts; none after both are spent.
#[test]
fn a_resolving_read_makes_its_attempts_then_goes_on_while_their_time_lasts() {
    let start = Instant::now();
    let timeout = Duration::from_secs(1);
    // One endpoint: two attempts, two seconds.
    let at_end = start + timeout * 2;
    let mut budget = ReadBudget::new(start, 1, timeout);
    assert!(budget.another(at_end), "the first attempt, however late");
    assert!(budget.another(at_end), "the second");
    assert!(!budget.another(at_end), "both made, the time spent");
    assert!(!budget.another(at_end + timeout));
    // Attempts that failed at once leave their time to more.
    let mut budget = ReadBudget::new(start, 1, timeout);
    let early = start + Duration::from_millis(100);
    for n in 0..5 {
        assert!(budget.another(early), "attempt {n} while time is left");
    }
    assert!(!budget.another(at_end), "none once the time is spent");
    // Three endpoints: six attempts.
    let mut budget = ReadBudget::new(start, 3, timeout);
    let late = start + timeout * 6;
    assert_eq!((0..10).filter(|_| budget.another(late)).count(), 6);
}

#[test]
fn the_backoff_grows_with_jitter_and_stays_bounded() {
    let policy = WritePolicy::default();
    let pauses: Vec<Duration> = policy.backoff().take(20).collect();
    assert_eq!(pauses.len(), 20, "it never runs out");
    assert!(pauses.iter().all(|p| *p <= policy.max_backoff * 2));
    assert!(pauses[10] >= policy.initial_backoff * 4);
}
