//! How one generation of the node lease is kept alive: a pure state machine, no I/O.
//!
//! The keepalive task (`keepalive.rs`) feeds it what happened ([`Event`]: an opening of the
//! keepalive stream answered or failed, a reply, a failed send, the stream's end, a timer) and
//! performs what it answers ([`Action`]); [`State::wake_at`] says when the next timer is due.
//!
//! The protocol, on one stream per generation:
//!
//! 1. **Openings.** An opening of the keepalive stream is itself a renewal. The first of a round
//!    goes to the connection's preferred endpoint; while none is answered another goes to the
//!    next endpoint every [`HEDGE`] (or [`RETRY`] after one failed, at once after one stalled),
//!    at most [`MAX_OPENINGS`] at a time, each given up after a renewal interval. The first one
//!    answered is the stream, and its endpoint becomes preferred.
//! 2. **Renewals.** Every TTL/3 from the send instant of the last request, one keepalive on the
//!    stream. Each reply renews the deadline from the send instant of the request it answers
//!    (see [`Validity`]), never from its arrival.
//! 3. **Re-opening.** A renewal unanswered for half an interval means a stalled stream (etcd
//!    answers in milliseconds): it is re-opened then on the next endpoint, leaving most of the
//!    deadline's slack to the new stream. A stream that ends is re-opened on the next endpoint
//!    after [`PAUSE`]; one whose send fails is re-opened at once. A re-opened stream forgets the
//!    requests sent on the old one.
//! 4. **Loss.** The deadline passing with no renewal, or a reply (an opening's answer
//!    included) that arrives after it, loses the lease as
//!    [`Expired`](LossReason::Expired): a late renewal never revives it. etcd saying the lease is
//!    gone (`lease not found` on an opening, a reply TTL ≤ 0 or below the grant) loses it as
//!    [`KeepaliveFailed`](LossReason::KeepaliveFailed). After a loss the state does nothing more.

use std::time::Duration;

use tokio::time::Instant;

use crate::clock;
use crate::lease::LossReason;
use crate::lease::validity::{Renewal, Validity};

/// How long an opening of the keepalive stream goes unanswered before another is sent, on the
/// next endpoint. etcd answers an opening in milliseconds, but after a leader crash a member
/// that still takes the dead leader for its leader holds the renewal until its dial to that
/// leader gives up (etcd's peer dial timeout: 1 s + the election timeout), even when a new
/// leader is elected meanwhile; an opening sent after the election is answered at once.
pub(super) const HEDGE: Duration = Duration::from_millis(250);

/// How long after a failed opening (a member down, or without a leader) the next is sent.
pub(super) const RETRY: Duration = Duration::from_millis(100);

/// At most this many openings are in flight at once.
pub(super) const MAX_OPENINGS: usize = 8;

/// How long after the stream ended it is re-opened: a member that ends every stream it opens
/// is not asked again in a tight loop.
pub(super) const PAUSE: Duration = Duration::from_millis(50);

/// What happened, as the keepalive task saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Event {
    /// [`State::wake_at`] passed. `preferred` is the connection's preferred endpoint now,
    /// where a round of openings starts.
    Wake { preferred: usize },
    /// Opening `id` was answered: its stream is open.
    Opened { id: u64 },
    /// Opening `id` ended without a stream.
    OpenFailed { id: u64, why: OpenFailure },
    /// A keepalive reply arrived on the stream, carrying `ttl_seconds`.
    Replied { ttl_seconds: i64 },
    /// A keepalive could not be sent on the stream.
    SendFailed,
    /// The stream ended or failed.
    Ended,
}

/// Why an opening of the keepalive stream gave no stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpenFailure {
    /// etcd said `lease not found`: the node lease is gone.
    LeaseGone,
    /// etcd refused the stream's authentication token (expired, or revoked).
    TokenRefused,
    /// Any other failure (a member down, or without a leader).
    Refused,
    /// Unanswered for a renewal interval.
    Stalled,
}

/// Why the stream is dropped, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closed {
    /// A renewal went unanswered for half an interval.
    Unanswered,
    /// The stream ended or failed.
    Ended,
    /// A keepalive could not be sent on it.
    SendFailed,
}

/// What the keepalive task is to do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Send opening `id` of the keepalive stream to endpoint `index`, given up (reported as
    /// [`OpenFailure::Stalled`]) when unanswered `within`.
    Open {
        id: u64,
        index: usize,
        within: Duration,
    },
    /// Opening `id`'s stream, opened on endpoint `index` by a request sent at `sent`, is the
    /// stream now: make that endpoint preferred and drop every other opening.
    Adopt {
        id: u64,
        index: usize,
        sent: Instant,
    },
    /// Send a keepalive on the stream.
    Send,
    /// The lease is valid until `valid_until`. `answered` is the send instant of the renewal
    /// whose reply moved it (none for an opening's answer), for the round-trip metric.
    Renewed {
        valid_until: Instant,
        answered: Option<Instant>,
    },
    /// Move the connection's preferred endpoint on to the next one.
    Rotate,
    /// Drop the stream; a round of openings follows.
    Close(Closed),
    /// The next opening on endpoint `index` authenticates afresh.
    ForgetToken { index: usize },
    /// This generation of the node lease is lost.
    Lost(LossReason),
}

/// One opening in flight.
#[derive(Clone, Copy, Debug)]
struct Opening {
    id: u64,
    index: usize,
    sent: Instant,
}

/// Where the generation stands.
#[derive(Debug)]
enum Phase {
    /// No stream: a round of openings starts at `at`.
    Idle { at: Instant },
    /// Openings in flight, none answered; the next goes to endpoint `index` at `next`.
    Opening {
        openings: Vec<Opening>,
        index: usize,
        next: Instant,
    },
    /// The stream is open; the next renewal goes out at `next`.
    Open { next: Instant },
    /// Lost: nothing more to do.
    Lost,
}

/// The keepalive of one node lease generation (see the [module docs](self)).
#[derive(Debug)]
pub(super) struct State {
    validity: Validity,
    /// The renewal interval: TTL/3.
    every: Duration,
    /// The number of endpoints.
    endpoints: usize,
    next_id: u64,
    phase: Phase,
}

impl State {
    /// A generation granted with `validity`, on `endpoints` endpoints; its first round of
    /// openings is due at `now`.
    pub(super) fn new(validity: Validity, endpoints: usize, now: Instant) -> Self {
        Self {
            every: validity.renew_every(),
            validity,
            endpoints: endpoints.max(1),
            next_id: 0,
            phase: Phase::Idle { at: now },
        }
    }

    /// When the task must send [`Event::Wake`] at the latest; `None` once lost.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        let due = match &self.phase {
            Phase::Lost => return None,
            Phase::Idle { at } => Some(*at),
            Phase::Opening { openings, next, .. } => {
                (openings.len() < MAX_OPENINGS).then_some(*next)
            }
            Phase::Open { next } => Some(self.stalled_at().map_or(*next, |at| at.min(*next))),
        };
        let deadline = self.validity.valid_until();
        Some(due.map_or(deadline, |due| due.min(deadline)))
    }

    /// Takes in `event`, seen at `now`, and says what to do.
    pub(super) fn step(&mut self, event: Event, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if matches!(self.phase, Phase::Lost) {
            return actions;
        }
        match event {
            Event::Wake { preferred } => self.wake(preferred, now, &mut actions),
            Event::Opened { id } => self.opened(id, now, &mut actions),
            Event::OpenFailed { id, why } => self.open_failed(id, why, now, &mut actions),
            Event::Replied { ttl_seconds } => self.replied(ttl_seconds, now, &mut actions),
            Event::SendFailed => self.close(Closed::SendFailed, now, &mut actions),
            Event::Ended => self.close(Closed::Ended, now, &mut actions),
        }
        actions
    }

    /// When the oldest renewal still unanswered counts as stalled.
    fn stalled_at(&self) -> Option<Instant> {
        let oldest = self.validity.oldest_outstanding()?;
        Some(clock::after(oldest, self.every / 2))
    }

    fn wake(&mut self, preferred: usize, now: Instant, actions: &mut Vec<Action>) {
        if !self.validity.is_valid_at(now) {
            self.lose(LossReason::Expired, actions);
            return;
        }
        match self.phase {
            Phase::Idle { at } if now >= at => {
                // Replies on the new stream answer only requests sent on it.
                self.validity.stream_reset();
                self.phase = Phase::Opening {
                    openings: Vec::new(),
                    index: preferred % self.endpoints,
                    next: now,
                };
                self.hedge(now, actions);
            }
            Phase::Opening { .. } => self.hedge(now, actions),
            Phase::Open { .. } if self.stalled_at().is_some_and(|at| now >= at) => {
                self.close(Closed::Unanswered, now, actions);
            }
            Phase::Open { ref mut next } if now >= *next => {
                *next = clock::after(now, self.every);
                self.validity.sent(now);
                actions.push(Action::Send);
            }
            _ => {}
        }
    }

    /// Sends the next opening if it is due and there is room for it.
    fn hedge(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Phase::Opening {
            openings,
            index,
            next,
        } = &mut self.phase
        else {
            return;
        };
        if now < *next || openings.len() >= MAX_OPENINGS {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        openings.push(Opening {
            id,
            index: *index,
            sent: now,
        });
        actions.push(Action::Open {
            id,
            index: *index,
            within: self.every,
        });
        *index = (*index + 1) % self.endpoints;
        *next = clock::after(now, HEDGE);
    }

    fn opened(&mut self, id: u64, now: Instant, actions: &mut Vec<Action>) {
        let Phase::Opening { openings, .. } = &self.phase else {
            return;
        };
        let Some(&Opening { index, sent, .. }) = openings.iter().find(|o| o.id == id) else {
            return;
        };
        actions.push(Action::Adopt { id, index, sent });
        if !self.in_time(now, actions) {
            return;
        }
        // The opening renewed the lease with the granted TTL (etcd-client keeps only its ID).
        self.validity.sent(sent);
        if let Renewal::Renewed { valid_until } =
            self.validity.replied(self.validity.ttl().as_secs() as i64)
        {
            actions.push(Action::Renewed {
                valid_until,
                answered: None,
            });
        }
        self.phase = Phase::Open {
            next: clock::after(sent, self.every),
        };
    }

    fn open_failed(&mut self, id: u64, why: OpenFailure, now: Instant, actions: &mut Vec<Action>) {
        let Phase::Opening { openings, next, .. } = &mut self.phase else {
            return;
        };
        let Some(at) = openings.iter().position(|o| o.id == id) else {
            return;
        };
        let opening = openings.remove(at);
        match why {
            OpenFailure::LeaseGone => self.lose(LossReason::KeepaliveFailed, actions),
            OpenFailure::TokenRefused => {
                actions.push(Action::ForgetToken {
                    index: opening.index,
                });
                *next = (*next).min(clock::after(now, RETRY));
            }
            OpenFailure::Refused => *next = (*next).min(clock::after(now, RETRY)),
            OpenFailure::Stalled => *next = now,
        }
    }

    fn replied(&mut self, ttl_seconds: i64, now: Instant, actions: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::Open { .. }) || !self.in_time(now, actions) {
            return;
        }
        // etcd answers one stream in order: the reply answers the oldest request outstanding.
        let answered = self.validity.oldest_outstanding();
        match self.validity.replied(ttl_seconds) {
            Renewal::Renewed { valid_until } => actions.push(Action::Renewed {
                valid_until,
                answered,
            }),
            Renewal::Gone => self.lose(LossReason::KeepaliveFailed, actions),
            Renewal::Unexpected => {}
        }
    }

    /// Whether a renewal arriving at `now` may renew: one that arrives after the deadline
    /// passed must not revive the lease, so it loses it instead.
    fn in_time(&mut self, now: Instant, actions: &mut Vec<Action>) -> bool {
        if self.validity.is_valid_at(now) {
            return true;
        }
        self.lose(LossReason::Expired, actions);
        false
    }

    /// Drops the open stream; the next round of openings starts on the next endpoint, except
    /// after a failed send (the stream broke on our side, not the member's).
    fn close(&mut self, why: Closed, now: Instant, actions: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::Open { .. }) {
            return;
        }
        let at = match why {
            Closed::Ended => clock::after(now, PAUSE),
            Closed::Unanswered | Closed::SendFailed => now,
        };
        if why != Closed::SendFailed {
            actions.push(Action::Rotate);
        }
        actions.push(Action::Close(why));
        self.phase = Phase::Idle { at };
    }

    fn lose(&mut self, reason: LossReason, actions: &mut Vec<Action>) {
        self.phase = Phase::Lost;
        actions.push(Action::Lost(reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(9);
    const MARGIN: Duration = Duration::from_secs(1);
    const ENDPOINTS: usize = 3;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// A generation granted at `t0` (valid until t0 + 8 s, renewing every 3 s) on three
    /// endpoints.
    fn granted(t0: Instant) -> State {
        State::new(Validity::granted(t0, TTL, MARGIN), ENDPOINTS, t0)
    }

    fn wake(state: &mut State, preferred: usize, at: Instant) -> Vec<Action> {
        state.step(Event::Wake { preferred }, at)
    }

    /// The ids and endpoints of the openings among `actions`.
    fn openings(actions: &[Action]) -> Vec<(u64, usize)> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Open { id, index, .. } => Some((*id, *index)),
                _ => None,
            })
            .collect()
    }

    /// A generation whose first opening, sent at t0 to endpoint 0, was answered at t0 + 20 ms.
    fn open(t0: Instant) -> State {
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        state.step(Event::Opened { id: 0 }, t0 + ms(20));
        state
    }

    #[test]
    fn a_generation_opens_its_stream_at_once_on_the_preferred_endpoint() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        assert_eq!(state.wake_at(), Some(t0));
        assert_eq!(
            wake(&mut state, 1, t0),
            [Action::Open {
                id: 0,
                index: 1,
                within: Duration::from_secs(3)
            }]
        );
    }

    #[test]
    fn an_unanswered_opening_is_hedged_on_the_next_endpoint_every_250_ms() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        assert_eq!(openings(&wake(&mut state, 1, t0)), [(0, 1)]);
        assert_eq!(state.wake_at(), Some(t0 + HEDGE));
        assert_eq!(openings(&wake(&mut state, 0, t0 + ms(250))), [(1, 2)]);
        assert_eq!(openings(&wake(&mut state, 0, t0 + ms(500))), [(2, 0)]);
        assert_eq!(state.wake_at(), Some(t0 + ms(750)));
    }

    #[test]
    fn no_more_than_one_hedge_goes_out_per_250_ms() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        assert_eq!(wake(&mut state, 0, t0 + ms(249)), []);
        assert_eq!(openings(&wake(&mut state, 0, t0 + ms(250))), [(1, 1)]);
        // Woken again early (another event), nothing more goes out before the next 250 ms.
        assert_eq!(wake(&mut state, 0, t0 + ms(250)), []);
        assert_eq!(wake(&mut state, 0, t0 + ms(499)), []);
        assert_eq!(state.wake_at(), Some(t0 + ms(500)));
    }

    #[test]
    fn no_more_than_eight_openings_are_in_flight() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        let mut sent = 0;
        for hedge in 0..12 {
            sent += openings(&wake(&mut state, 0, t0 + HEDGE * hedge)).len();
        }
        assert_eq!(sent, MAX_OPENINGS);
        assert_eq!(
            state.wake_at(),
            Some(t0 + Duration::from_secs(8)),
            "only the deadline"
        );
        // One fails: the hedge held back since 2 s goes out at once.
        let failed = t0 + ms(3_000);
        let why = OpenFailure::Refused;
        assert_eq!(state.step(Event::OpenFailed { id: 3, why }, failed), []);
        assert_eq!(state.wake_at(), Some(t0 + ms(2_000)));
        assert_eq!(openings(&wake(&mut state, 0, failed)), [(8, 2)]);
    }

    #[test]
    fn a_failed_opening_brings_the_next_forward_to_100_ms_later() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        let why = OpenFailure::Refused;
        assert_eq!(
            state.step(Event::OpenFailed { id: 0, why }, t0 + ms(10)),
            []
        );
        assert_eq!(state.wake_at(), Some(t0 + ms(110)));
        assert_eq!(openings(&wake(&mut state, 0, t0 + ms(110))), [(1, 1)]);
    }

    #[test]
    fn a_failed_opening_does_not_delay_a_hedge_due_sooner() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        let why = OpenFailure::Refused;
        state.step(Event::OpenFailed { id: 0, why }, t0 + ms(200));
        assert_eq!(state.wake_at(), Some(t0 + HEDGE));
    }

    #[test]
    fn a_stalled_opening_is_replaced_at_once_on_the_next_endpoint() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 2, t0);
        let stalled = t0 + TTL / 3;
        let why = OpenFailure::Stalled;
        assert_eq!(state.step(Event::OpenFailed { id: 0, why }, stalled), []);
        assert_eq!(state.wake_at(), Some(stalled));
        assert_eq!(openings(&wake(&mut state, 2, stalled)), [(1, 0)]);
    }

    #[test]
    fn a_refused_stream_token_is_forgotten_at_its_endpoint() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 2, t0);
        let why = OpenFailure::TokenRefused;
        assert_eq!(
            state.step(Event::OpenFailed { id: 0, why }, t0 + ms(5)),
            [Action::ForgetToken { index: 2 }]
        );
        assert_eq!(state.wake_at(), Some(t0 + ms(105)));
    }

    #[test]
    fn lease_not_found_on_an_opening_loses_the_lease_as_keepalive_failed() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        let why = OpenFailure::LeaseGone;
        assert_eq!(
            state.step(Event::OpenFailed { id: 0, why }, t0 + ms(5)),
            [Action::Lost(LossReason::KeepaliveFailed)]
        );
        assert_eq!(state.wake_at(), None);
    }

    #[test]
    fn the_first_opening_answered_is_adopted_and_renews_from_its_own_send_instant() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        let hedged = t0 + HEDGE;
        wake(&mut state, 0, hedged);
        // The hedge, sent at 250 ms to endpoint 1, is answered at 2 s; the first never is.
        assert_eq!(
            state.step(Event::Opened { id: 1 }, t0 + ms(2_000)),
            [
                Action::Adopt {
                    id: 1,
                    index: 1,
                    sent: hedged
                },
                Action::Renewed {
                    valid_until: hedged + TTL - MARGIN,
                    answered: None
                }
            ]
        );
        assert_eq!(state.step(Event::Opened { id: 0 }, t0 + ms(2_100)), []);
        assert_eq!(state.wake_at(), Some(hedged + TTL / 3), "the first renewal");
    }

    #[test]
    fn an_opening_answered_after_the_deadline_does_not_revive_the_lease() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        let late = t0 + TTL - MARGIN;
        assert_eq!(
            state.step(Event::Opened { id: 0 }, late),
            [
                Action::Adopt {
                    id: 0,
                    index: 0,
                    sent: t0
                },
                Action::Lost(LossReason::Expired)
            ]
        );
        assert_eq!(state.wake_at(), None);
    }

    #[test]
    fn renewals_go_out_every_third_of_the_ttl_from_the_last_send() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let first = t0 + ms(3_000);
        assert_eq!(state.wake_at(), Some(first));
        assert_eq!(wake(&mut state, 0, first - ms(1)), []);
        assert_eq!(wake(&mut state, 0, first), [Action::Send]);
        assert_eq!(wake(&mut state, 0, first), [], "one renewal per interval");
        state.step(Event::Replied { ttl_seconds: 9 }, first + ms(30));
        assert_eq!(state.wake_at(), Some(first + ms(3_000)));
    }

    #[test]
    fn a_renewal_reply_renews_from_the_send_instant_of_the_request_it_answers() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let sent = t0 + ms(3_000);
        wake(&mut state, 0, sent);
        assert_eq!(
            state.step(Event::Replied { ttl_seconds: 9 }, sent + ms(400)),
            [Action::Renewed {
                valid_until: sent + TTL - MARGIN,
                answered: Some(sent)
            }]
        );
    }

    #[test]
    fn a_renewal_reply_after_the_deadline_does_not_revive_the_lease() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let sent = t0 + ms(3_000);
        wake(&mut state, 0, sent);
        // Anchored at its send instant the reply would carry the deadline to 11 s: it arrives
        // at 8 s, when the deadline of the opening (t0 + 8 s) has passed.
        assert_eq!(
            state.step(Event::Replied { ttl_seconds: 9 }, t0 + TTL - MARGIN),
            [Action::Lost(LossReason::Expired)]
        );
        assert_eq!(state.step(Event::Replied { ttl_seconds: 9 }, sent), []);
    }

    #[test]
    fn the_deadline_passing_without_a_renewal_loses_the_lease_as_expired() {
        let t0 = Instant::now();
        let mut state = granted(t0);
        wake(&mut state, 0, t0);
        let deadline = t0 + TTL - MARGIN;
        assert_eq!(openings(&wake(&mut state, 0, deadline - ms(1))).len(), 1);
        assert_eq!(
            wake(&mut state, 0, deadline),
            [Action::Lost(LossReason::Expired)]
        );
        assert_eq!(state.wake_at(), None);
        assert_eq!(state.step(Event::Opened { id: 0 }, deadline), []);
    }

    #[test]
    fn a_reply_with_a_ttl_at_or_below_zero_or_the_grant_loses_the_lease_as_keepalive_failed() {
        for ttl_seconds in [0, -1, 8] {
            let t0 = Instant::now();
            let mut state = open(t0);
            wake(&mut state, 0, t0 + ms(3_000));
            assert_eq!(
                state.step(Event::Replied { ttl_seconds }, t0 + ms(3_010)),
                [Action::Lost(LossReason::KeepaliveFailed)],
                "reply TTL {ttl_seconds}"
            );
        }
    }

    #[test]
    fn a_reply_that_answers_no_request_is_ignored() {
        let t0 = Instant::now();
        let mut state = open(t0);
        assert_eq!(
            state.step(Event::Replied { ttl_seconds: 9 }, t0 + ms(30)),
            []
        );
        assert_eq!(state.wake_at(), Some(t0 + ms(3_000)));
    }

    #[test]
    fn a_renewal_unanswered_for_half_an_interval_reopens_on_the_next_endpoint() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let sent = t0 + ms(3_000);
        wake(&mut state, 0, sent);
        let stalled = sent + ms(1_500);
        assert_eq!(state.wake_at(), Some(stalled));
        assert_eq!(wake(&mut state, 0, stalled - ms(1)), []);
        assert_eq!(
            wake(&mut state, 0, stalled),
            [Action::Rotate, Action::Close(Closed::Unanswered)]
        );
        // The connection's preferred endpoint moved on to 1; the round starts there at once.
        assert_eq!(state.wake_at(), Some(stalled));
        assert_eq!(openings(&wake(&mut state, 1, stalled)), [(1, 1)]);
    }

    #[test]
    fn an_answered_renewal_does_not_reopen_the_stream() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let sent = t0 + ms(3_000);
        wake(&mut state, 0, sent);
        state.step(Event::Replied { ttl_seconds: 9 }, sent + ms(1_499));
        assert_eq!(state.wake_at(), Some(sent + ms(3_000)));
        assert_eq!(wake(&mut state, 0, sent + ms(1_500)), []);
    }

    #[test]
    fn a_reopened_stream_forgets_the_requests_sent_on_the_old_one() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let sent = t0 + ms(3_000);
        wake(&mut state, 0, sent);
        let stalled = sent + ms(1_500);
        wake(&mut state, 0, stalled);
        wake(&mut state, 1, stalled);
        // The new stream's opening answers itself, not the renewal sent at 3 s.
        assert_eq!(
            state.step(Event::Opened { id: 1 }, stalled + ms(10))[1],
            Action::Renewed {
                valid_until: stalled + TTL - MARGIN,
                answered: None
            }
        );
        assert_eq!(
            state.wake_at(),
            Some(stalled + ms(3_000)),
            "nothing outstanding"
        );
    }

    #[test]
    fn an_ended_stream_reopens_on_the_next_endpoint_after_50_ms() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let ended = t0 + ms(1_000);
        assert_eq!(
            state.step(Event::Ended, ended),
            [Action::Rotate, Action::Close(Closed::Ended)]
        );
        assert_eq!(state.wake_at(), Some(ended + PAUSE));
        assert_eq!(wake(&mut state, 1, ended + ms(49)), []);
        assert_eq!(openings(&wake(&mut state, 1, ended + PAUSE)), [(1, 1)]);
    }

    #[test]
    fn a_failed_send_reopens_at_once_without_moving_the_endpoint() {
        let t0 = Instant::now();
        let mut state = open(t0);
        let sent = t0 + ms(3_000);
        wake(&mut state, 0, sent);
        assert_eq!(
            state.step(Event::SendFailed, sent),
            [Action::Close(Closed::SendFailed)]
        );
        assert_eq!(state.wake_at(), Some(sent));
        assert_eq!(openings(&wake(&mut state, 0, sent)), [(1, 0)]);
    }
}
