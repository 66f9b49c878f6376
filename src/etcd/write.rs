//! The one write path: send a transaction, re-send it byte-identical while its outcome is
//! unknown, then resolve what stays unknown by reading.
//!
//! Every write leasehold makes (acquire, fence, append, workspace root, guarded deletes) goes
//! through [`send`], alone or in a transaction shared with others (the append queue's,
//! `etcd::shared`'s), with one policy:
//!
//! - The first attempt goes to the preferred endpoint and is bounded by a short timeout
//!   ([`WritePolicy::attempt_timeout`], 1 s by default): etcd's own server-side timeout is
//!   5 s + 2 × the election timeout, so a proposal that a follower forwarded to a leader that
//!   just died would otherwise wait that long, lost.
//! - After a failed attempt the same transaction (same nonce, same compares) is sent again to
//!   the next endpoint, after a jittered, growing pause if it failed fast (none if it got no
//!   answer in time: it has waited already), each re-send bounded by
//!   [`WritePolicy::resend_timeout`] (250 ms by default): once a send went unanswered the
//!   cluster is likely electing, and a shorter wait finds the new leader sooner (a re-send in
//!   flight when the new leader is elected waits out its timeout; measured after leader kills,
//!   `tests/liveness_leader_kills.rs`: the next append comes 250 ms after the election at
//!   worst, against 500 ms with a 500 ms re-send timeout). After [`PATIENT_AFTER`] re-sends in a
//!   row got no answer in time, each waits twice as long as the one before (up to the first
//!   attempt's timeout): a cluster that answers slowly rather than not at all still gets
//!   through. Re-sending is always safe: every transaction leasehold writes carries compares
//!   under which at most one of its sends can ever apply.
//! - It goes on for as long as the caller's condition holds (a journal: while its lease is
//!   valid; an acquisition: while the node lease is), and never past the policy's
//!   [deadline](WritePolicy::deadline) (three TTLs by default): a cluster that keeps refusing
//!   or dropping one transaction while renewals get through does not hold its caller forever.
//!   When the condition fails or the deadline passes and some send's outcome is unknown, one
//!   linearizable read (the caller's) settles it where it can.
//! - etcd's NOSPACE refusal is final, yet it does not say whether the send applied: etcd's
//!   quota applier (`quotaApplierV3`) *applies* the transaction that takes the backend past
//!   `--quota-backend-bytes`, then answers it NOSPACE and raises the alarm; the ones after it
//!   are refused unapplied. So a send refused for space is never re-sent and never reported
//!   as certainly not applied: the caller's read, made after the refusal, says which it was
//!   ([`Written::Refused`]). No send refused so is pending any more, so what that read does not
//!   show never applied, unless an earlier send's outcome was unknown (then it is resolved as
//!   any unknown outcome is).
//!
//! The decision after each attempt is [`next`], a pure function of what the sends so far came
//! to and what this one came to; it is unit-tested for every pair.

use std::time::Duration;

use etcd_client::{Txn, TxnResponse};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::connection::Connection;
use super::error::{EtcdError, FailureClass};
use crate::backoff::Backoff;
use crate::deadline::FOREVER;

/// How writes are sent and re-sent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WritePolicy {
    /// How long the first attempt may take before its outcome counts as unknown. Default 1 s.
    pub attempt_timeout: Duration,
    /// How long each re-send may take (after 8 unanswered re-sends in a row,
    /// twice as long each time, up to `attempt_timeout`). Default 250 ms.
    pub resend_timeout: Duration,
    /// The pause after the first failed attempt; it doubles (with jitter) after each. Default
    /// 20 ms.
    pub initial_backoff: Duration,
    /// The longest pause between attempts before jitter (taken as `initial_backoff` when
    /// shorter). Default 100 ms.
    pub max_backoff: Duration,
    /// No re-send starts once this much time has passed since the first attempt, however
    /// long the caller's condition (a valid lease) holds: an outcome still unknown is then
    /// settled by reading, and a write certainly not applied fails. `None` (the default): three
    /// times the store's node lease TTL.
    pub deadline: Option<Duration>,
}

impl Default for WritePolicy {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(1),
            resend_timeout: Duration::from_millis(250),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            deadline: None,
        }
    }
}

impl WritePolicy {
    /// Sets how long the first attempt may take.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// Sets how long each re-send may take.
    pub fn with_resend_timeout(mut self, timeout: Duration) -> Self {
        self.resend_timeout = timeout;
        self
    }

    /// Sets the first pause between attempts and the longest.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Sets how long a write is re-sent in all (see [`deadline`](Self::deadline)).
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The pauses between one write's attempts: jittered, from `initial_backoff` doubling up
    /// to `max_backoff` (at least `initial_backoff`), fresh for each write.
    fn backoff(&self) -> Backoff {
        Backoff::new(self.initial_backoff, self.max_backoff).with_jitter()
    }
}

/// After this many re-sends in a row got no answer in time, each waits twice as long as the
/// one before (see the module docs): 2 s of silence at the default re-send timeout, longer than
/// a leader's death takes to notice.
pub(crate) const PATIENT_AFTER: u32 = 8;

/// The timeout of the next re-send, after `timed_out` re-sends in a row got no answer in time.
fn resend_timeout(policy: &WritePolicy, timed_out: u32) -> Duration {
    let first = policy.resend_timeout.min(policy.attempt_timeout);
    let doublings = timed_out.saturating_sub(PATIENT_AFTER - 1).min(16);
    first
        .saturating_mul(1 << doublings)
        .min(policy.attempt_timeout.max(first))
}

/// How one write paces its sends after the first (see the module docs): no pause after an
/// attempt that got no answer in time (it has waited already), a backoff after a fast failure;
/// each re-send bounded by [`resend_timeout`], which grows once [`PATIENT_AFTER`] re-sends in a
/// row got no answer.
struct Pacing<'a> {
    policy: &'a WritePolicy,
    backoff: Backoff,
    /// Re-sends made so far.
    resends: u32,
    /// How many re-sends in a row (the last ones) got no answer in time.
    timed_out: u32,
}

impl<'a> Pacing<'a> {
    fn new(policy: &'a WritePolicy) -> Self {
        Self {
            policy,
            backoff: policy.backoff(),
            resends: 0,
            timed_out: 0,
        }
    }

    /// A send failed (`unanswered`: it got no answer in time) and the same transaction goes
    /// again: the pause before the re-send, and the re-send's timeout.
    fn resend(&mut self, unanswered: bool) -> (Duration, Duration) {
        let pause = if unanswered {
            Duration::ZERO
        } else {
            self.backoff.next()
        };
        // Only re-sends count (the first attempt has a timeout of its own).
        if self.resends > 0 {
            self.timed_out = if unanswered {
                self.timed_out.saturating_add(1)
            } else {
                0
            };
        }
        self.resends = self.resends.saturating_add(1);
        (pause, resend_timeout(self.policy, self.timed_out))
    }
}

/// What the sends of one transaction have come to so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sends {
    /// Every send so far was certainly not applied (or none was made yet).
    NoneApplied,
    /// Some send's outcome is unknown: it may have been applied, or may still be.
    MaybeApplied,
}

/// What one attempt came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// etcd answered: the transaction applied, or its compare failed (the reply says which).
    Replied,
    /// Certainly not applied: no connection could be made, or etcd refused it (no leader).
    NotApplied,
    /// Maybe applied: a timeout, a lost connection, "request timed out", "leader changed".
    Unknown,
    /// Refused, and sending it again would be refused the same way.
    Permanent,
    /// Refused for space (etcd's NOSPACE), which is final but may have applied it (see the
    /// module docs): only a read, made after it, can say.
    RefusedForSpace,
}

impl Attempt {
    fn of(error: &EtcdError) -> Self {
        if error.is_no_space() {
            return Attempt::RefusedForSpace;
        }
        match error.class() {
            FailureClass::NotSent | FailureClass::Rejected => Attempt::NotApplied,
            FailureClass::OutcomeUnknown => Attempt::Unknown,
            FailureClass::Permanent => Attempt::Permanent,
        }
    }
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Take etcd's reply: the caller reads from it whether this or an earlier send applied.
    Accept,
    /// Send the same transaction again; the sends now stand at this.
    Resend(Sends),
    /// Certainly not applied, and not to be sent again: report this attempt's failure.
    Fail,
    /// Maybe applied, and not to be sent again: settle it by reading.
    Resolve,
    /// Refused for space, and no send before it may have applied: read once. This send is no
    /// longer pending, so what the read does not show never applied.
    Check,
}

/// The decision table. `go_on` is the caller's condition (e.g. the lease is still valid).
pub(crate) fn next(sends: Sends, attempt: Attempt, go_on: bool) -> Next {
    use Attempt as A;
    use Sends as S;
    match (sends, attempt, go_on) {
        // A reply is the truth, whatever came before: a failed compare after an unknown send
        // is resolved by the `else` branch the caller built into the transaction.
        (_, A::Replied, _) => Next::Accept,
        (S::NoneApplied, A::NotApplied, true) => Next::Resend(S::NoneApplied),
        (S::NoneApplied, A::NotApplied, false) => Next::Fail,
        (S::NoneApplied, A::Permanent, _) => Next::Fail,
        (S::NoneApplied, A::RefusedForSpace, _) => Next::Check,
        (_, A::Unknown, true) => Next::Resend(S::MaybeApplied),
        (S::MaybeApplied, A::NotApplied, true) => Next::Resend(S::MaybeApplied),
        // An earlier send may have applied: only a read can say.
        (S::MaybeApplied, A::NotApplied | A::Permanent | A::RefusedForSpace, _) => Next::Resolve,
        (_, A::Unknown, false) => Next::Resolve,
    }
}

/// etcd's answer to one of a write's sends; it reads as the `TxnResponse` it holds.
#[derive(Debug)]
pub(crate) struct Reply {
    response: TxnResponse,
    /// What the sends before this one came to: if none may have applied, a failed compare
    /// means the write never applied, whatever the `else` branch shows.
    before: Sends,
}

impl Reply {
    /// `response`, a part of this reply (one operation of a shared transaction), read as this
    /// reply is.
    pub(crate) fn part(&self, response: TxnResponse) -> Self {
        Self {
            response,
            before: self.before,
        }
    }

    /// Whether an earlier send may have applied (its outcome was unknown).
    pub(crate) fn after_unknown(&self) -> bool {
        self.before == Sends::MaybeApplied
    }

    /// A reply that came after a send whose outcome was unknown.
    #[cfg(test)]
    pub(crate) fn after_unknown_send(response: TxnResponse) -> Self {
        Self {
            response,
            before: Sends::MaybeApplied,
        }
    }
}

impl std::ops::Deref for Reply {
    type Target = TxnResponse;

    fn deref(&self) -> &TxnResponse {
        &self.response
    }
}

/// The reply to a write's first send.
impl From<TxnResponse> for Reply {
    fn from(response: TxnResponse) -> Self {
        Self {
            response,
            before: Sends::NoneApplied,
        }
    }
}

/// What a write came to.
#[derive(Debug)]
pub(crate) enum Written {
    /// etcd answered one of the sends: read the reply (succeeded, or the compare failed and
    /// the `else` branch shows why).
    Replied(Reply),
    /// The sends stayed unknown until the caller's condition failed; the resolving read
    /// answered with this. `unknown` is the first failure that may have applied.
    Resolved {
        read: TxnResponse,
        unknown: EtcdError,
    },
    /// The outcome stays unknown: no read was given, or it failed too.
    Unknown(EtcdError),
    /// etcd refused a send for space (`error`, its NOSPACE), and no send before it may have
    /// applied. That refusal is final but does not say whether the send applied (see the
    /// module docs); `read` is the caller's resolving read, made after it (`None`: none was
    /// given, or it failed). What the read does not show never applied, and never will.
    Refused {
        error: EtcdError,
        read: Option<TxnResponse>,
    },
    /// Certainly not applied.
    Failed(EtcdError),
}

/// What one write's sends have come to, and what it does after a failed one: the decisions of
/// [`send`], kept apart from its I/O so that each rule is unit-tested.
struct Sending<'a> {
    sends: Sends,
    /// The first failure that may have applied: what an outcome left unknown reports.
    unknown: Option<EtcdError>,
    pacing: Pacing<'a>,
    /// The endpoint of the next send: after a failure the next one, whatever other writes do.
    endpoint: usize,
    endpoints: usize,
    /// The next send's timeout.
    timeout: Duration,
    /// The write's deadline: no send after it.
    give_up: Instant,
}

/// What a write does after a failed send.
#[derive(Debug)]
enum Step {
    /// Send again, after this pause, to [`Sending::endpoint`] within [`Sending::timeout`].
    Resend { pause: Duration },
    /// Certainly not applied: report this failure.
    Fail(EtcdError),
    /// Maybe applied: settle it by reading; report this failure if the read cannot.
    Resolve(EtcdError),
    /// Refused for space, no earlier send maybe applied: read once (see [`Next::Check`]).
    Check(EtcdError),
}

impl<'a> Sending<'a> {
    /// A write that starts `now`, first sent to `endpoint` of `endpoints`.
    fn new(policy: &'a WritePolicy, now: Instant, endpoint: usize, endpoints: usize) -> Self {
        Self {
            sends: Sends::NoneApplied,
            unknown: None,
            pacing: Pacing::new(policy),
            endpoint,
            endpoints: endpoints.max(1),
            timeout: policy.attempt_timeout,
            give_up: crate::deadline::deadline(now, policy.deadline.unwrap_or(FOREVER)),
        }
    }

    /// Whether the write may go on after a send that failed at `now`: not once `abandoned`,
    /// not at or past its deadline, and then only while the caller's condition holds (asked
    /// last, and only then).
    fn goes_on(&self, now: Instant, abandoned: bool, go_on: impl FnOnce() -> bool) -> bool {
        !abandoned && now < self.give_up && go_on()
    }

    /// A send failed with `error`. `abandoned`: it was cut short mid-flight (the store shut
    /// down), so it may have applied whatever the error; `go_on`: the caller's condition and
    /// the write's deadline still hold (never once abandoned).
    fn failed(&mut self, error: EtcdError, abandoned: bool, go_on: bool) -> Step {
        let kind = if abandoned {
            Attempt::Unknown
        } else {
            Attempt::of(&error)
        };
        match next(self.sends, kind, go_on) {
            Next::Accept => unreachable!("only a reply is accepted"),
            Next::Resend(now) => {
                self.sends = now;
                let unanswered = error.code() == Some(tonic::Code::DeadlineExceeded);
                let pause;
                (pause, self.timeout) = self.pacing.resend(unanswered);
                if kind == Attempt::Unknown {
                    // The first unknown failure is the one that may have applied.
                    self.unknown.get_or_insert(error);
                }
                self.endpoint = (self.endpoint + 1) % self.endpoints;
                Step::Resend { pause }
            }
            Next::Fail => Step::Fail(error),
            Next::Resolve => Step::Resolve(self.unknown.take().unwrap_or(error)),
            Next::Check => Step::Check(error),
        }
    }
}

/// Sends `txn` as the module docs say. `resolve`, a read-only transaction, settles an unknown
/// outcome once `go_on` fails; `stop` (the store's shutdown) ends the attempts at once.
pub(crate) async fn send(
    connection: &Connection,
    policy: &WritePolicy,
    operation: &'static str,
    txn: &Txn,
    resolve: Option<&Txn>,
    go_on: impl Fn() -> bool,
    stop: &CancellationToken,
) -> Written {
    let mut sending = Sending::new(
        policy,
        Instant::now(),
        connection.preferred_index(),
        connection.len(),
    );
    loop {
        let attempt = tokio::select! {
            attempt = connection.attempt_on(sending.endpoint, operation, sending.timeout, |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            }) => attempt,
            _ = stop.cancelled() => Err(EtcdError::stopped(operation)),
        };
        let error = match attempt {
            Ok(response) => {
                debug_assert_eq!(next(sending.sends, Attempt::Replied, true), Next::Accept);
                return Written::Replied(Reply {
                    response,
                    before: sending.sends,
                });
            }
            Err(error) => error,
        };
        let abandoned = stop.is_cancelled();
        let go = sending.goes_on(Instant::now(), abandoned, &go_on);
        let shown = error.to_string();
        match sending.failed(error, abandoned, go) {
            Step::Resend { pause } => {
                tracing::debug!(operation, error = %shown, sends = ?sending.sends, "write failed; sending the same transaction again");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.cancelled() => {}
                }
            }
            Step::Fail(error) => return Written::Failed(error),
            Step::Resolve(unknown) => {
                let Some(read) = resolve else {
                    return Written::Unknown(unknown);
                };
                return match read_once(connection, policy, read, stop).await {
                    Ok(read) => Written::Resolved { read, unknown },
                    Err(_) => Written::Unknown(unknown),
                };
            }
            Step::Check(error) => {
                let read = match resolve {
                    Some(read) => read_once(connection, policy, read, stop).await.ok(),
                    None => None,
                };
                return Written::Refused { error, read };
            }
        }
    }
}

/// How many attempts a resolving read makes: two per endpoint, so that each is tried twice.
fn read_attempts(endpoints: usize) -> usize {
    endpoints.max(1) * 2
}

/// A resolving read's attempts: at least [`read_attempts`], and more for as long as that many
/// could take at their whole timeout, so that an attempt that failed at once (on a connection
/// that had just been closed, say) leaves its time to the next.
struct ReadBudget {
    attempts: usize,
    made: usize,
    until: Instant,
}

impl ReadBudget {
    /// The budget of a read that starts `now` over `endpoints`, each attempt within `timeout`.
    fn new(now: Instant, endpoints: usize, timeout: Duration) -> Self {
        let attempts = read_attempts(endpoints);
        let budget = timeout.saturating_mul(u32::try_from(attempts).unwrap_or(u32::MAX));
        Self {
            attempts,
            made: 0,
            until: crate::deadline::deadline(now, budget),
        }
    }

    /// Whether another attempt is made at `now`; counts it if so.
    fn another(&mut self, now: Instant) -> bool {
        if self.made < self.attempts || now < self.until {
            self.made += 1;
            true
        } else {
            false
        }
    }
}

/// Whether a resolving read that failed with `error` is tried again: not when it would fail
/// the same way.
fn read_again(error: &EtcdError) -> bool {
    error.class() != FailureClass::Permanent
}

/// The pause after a resolving read's failed attempt, before the next: a connection the
/// failure closed is dialled again meanwhile.
const READ_PAUSE: Duration = Duration::from_millis(50);

/// The resolving read: linearizable, a few attempts across the endpoints, bounded as
/// [`ReadBudget`] says. The error is the last attempt's.
pub(crate) async fn read_once(
    connection: &Connection,
    policy: &WritePolicy,
    read: &Txn,
    stop: &CancellationToken,
) -> Result<TxnResponse, EtcdError> {
    const OPERATION: &str = "resolving read";
    let mut budget = ReadBudget::new(
        Instant::now(),
        connection.endpoints().len(),
        policy.attempt_timeout,
    );
    let mut last = EtcdError::stopped(OPERATION);
    while budget.another(Instant::now()) {
        let attempt = tokio::select! {
            attempt = connection.attempt(OPERATION, policy.attempt_timeout, |mut client| {
                let read = read.clone();
                async move { client.txn(read).await }
            }) => attempt,
            _ = stop.cancelled() => return Err(EtcdError::stopped(OPERATION)),
        };
        match attempt {
            Ok(response) => return Ok(response),
            Err(error) if !read_again(&error) => return Err(error),
            Err(error) => {
                last = error;
                connection.rotate();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(READ_PAUSE) => {}
            _ = stop.cancelled() => return Err(EtcdError::stopped(OPERATION)),
        }
    }
    Err(last)
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
