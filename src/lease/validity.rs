//! The validity deadline of a node lease: pure state, no I/O, driven by the keepalive task.
//!
//! etcd answers the keepalive requests of one stream in order, so the reply in hand answers the
//! oldest request still outstanding. Each request's send instant is pushed on a FIFO when it is
//! sent and popped by the reply that answers it, and the deadline becomes
//!
//! ```text
//! valid_until = send instant of the answered request + granted TTL − safety margin
//! ```
//!
//! Anchoring at the send instant, not at receipt (as etcd's Go client does), keeps the local
//! view inside the server's: the server renewed the lease no earlier than it received the
//! request, which is no earlier than it was sent. The deadline never moves backwards. A reply
//! with TTL ≤ 0 says the server no longer has the lease. A reply with a TTL below the granted
//! one means the server's expiry is nearer than this view assumed (etcd sets it to renewal
//! time + that TTL), so the lease is treated as lost rather than kept on a deadline the server
//! does not share; a TTL above the granted one is capped at it. When the stream is re-opened the FIFO
//! is cleared: replies on the new stream answer only requests sent on it.
//!
//! The margin must leave room for renewal: with renewals every TTL/3, the reply to the next
//! renewal arrives at the latest one round trip after TTL/3, so the deadline must lie beyond
//! that: margin < 2·TTL/3 − round trip.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// What a keepalive reply did to the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The deadline moved (or stayed, if the answered request was older than the last one).
    Renewed { valid_until: Instant },
    /// The server says the lease is gone (TTL ≤ 0), or renewed it for less than the granted
    /// TTL: either way this view of its validity no longer holds.
    Gone,
    /// A reply that answers no request we know of (none outstanding): ignored.
    Unexpected,
}

/// The margin leaves no room to renew before the deadline; permanent for these settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "safety margin {margin:?} leaves no room to renew a {ttl:?} lease: it must be below 2·TTL/3 − a round trip ({limit:?})"
)]
pub struct MarginError {
    /// The margin asked for.
    pub margin: Duration,
    /// The TTL in force (as etcd granted it).
    pub ttl: Duration,
    /// The largest margin that would be accepted.
    pub limit: Duration,
}

/// Checks `margin < 2·ttl/3 − round_trip`.
pub(crate) fn check_margin(
    ttl: Duration,
    margin: Duration,
    round_trip: Duration,
) -> Result<(), MarginError> {
    let limit = (ttl.saturating_mul(2) / 3).saturating_sub(round_trip);
    if margin < limit {
        Ok(())
    } else {
        Err(MarginError { margin, ttl, limit })
    }
}

/// The deadline state of one node lease.
#[derive(Debug)]
pub(crate) struct Validity {
    ttl: Duration,
    margin: Duration,
    outstanding: VecDeque<Instant>,
    valid_until: Instant,
}

impl Validity {
    /// A lease granted by a request sent at `sent`, with the TTL etcd granted.
    pub(crate) fn granted(sent: Instant, ttl: Duration, margin: Duration) -> Self {
        Self {
            ttl,
            margin,
            outstanding: VecDeque::new(),
            valid_until: sent
                .checked_add(ttl)
                .and_then(|until| until.checked_sub(margin))
                .unwrap_or(sent),
        }
    }

    /// The TTL etcd granted.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often to renew: every TTL/3.
    pub(crate) fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// The instant the lease stops being valid unless renewed.
    pub(crate) fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Whether the lease is valid at `now`.
    pub(crate) fn is_valid_at(&self, now: Instant) -> bool {
        now < self.valid_until
    }

    /// A keepalive request was sent at `now`.
    pub(crate) fn sent(&mut self, now: Instant) {
        self.outstanding.push_back(now);
    }

    /// The send instant of the oldest request not yet answered.
    pub(crate) fn oldest_outstanding(&self) -> Option<Instant> {
        self.outstanding.front().copied()
    }

    /// A keepalive reply arrived carrying `ttl_seconds`.
    pub(crate) fn replied(&mut self, ttl_seconds: i64) -> Renewal {
        let Some(sent) = self.outstanding.pop_front() else {
            return Renewal::Unexpected;
        };
        if ttl_seconds <= 0 {
            return Renewal::Gone;
        }
        let ttl = Duration::from_secs(ttl_seconds.unsigned_abs());
        if ttl < self.ttl {
            return Renewal::Gone;
        }
        if let Some(until) = sent
            .checked_add(ttl.min(self.ttl))
            .and_then(|until| until.checked_sub(self.margin))
        {
            self.valid_until = self.valid_until.max(until);
        }
        Renewal::Renewed {
            valid_until: self.valid_until,
        }
    }

    /// The keepalive stream was re-opened: no reply will answer the old requests.
    pub(crate) fn stream_reset(&mut self) {
        self.outstanding.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(9);
    const MARGIN: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_grant_is_valid_until_its_send_instant_plus_ttl_minus_margin() {
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await; // the grant's round trip
        let validity = Validity::granted(sent, TTL, MARGIN);
        assert_eq!(validity.valid_until(), sent + Duration::from_secs(8));
        assert_eq!(validity.renew_every(), Duration::from_secs(3));
        assert!(validity.is_valid_at(Instant::now()));
        tokio::time::advance(Duration::from_millis(7_699)).await;
        assert!(validity.is_valid_at(Instant::now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            !validity.is_valid_at(Instant::now()),
            "expires without renewal"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_renews_from_the_send_instant_of_the_request_it_answers() {
        let start = Instant::now();
        let mut validity = Validity::granted(start, TTL, MARGIN);
        tokio::time::advance(Duration::from_secs(3)).await;
        validity.sent(Instant::now()); // t = 3
        tokio::time::advance(Duration::from_secs(3)).await;
        validity.sent(Instant::now()); // t = 6, the first still unanswered
        tokio::time::advance(Duration::from_secs(1)).await;
        // t = 7: a late reply answers the request of t = 3, not the one of t = 6.
        assert_eq!(
            validity.replied(9),
            Renewal::Renewed {
                valid_until: start + Duration::from_secs(3 + 9 - 1)
            }
        );
        assert_eq!(
            validity.oldest_outstanding(),
            Some(start + Duration::from_secs(6))
        );
        assert_eq!(
            validity.replied(9),
            Renewal::Renewed {
                valid_until: start + Duration::from_secs(6 + 9 - 1)
            }
        );
        assert_eq!(validity.replied(9), Renewal::Unexpected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_arriving_after_the_deadline_does_not_revive_the_lease() {
        let start = Instant::now();
        let mut validity = Validity::granted(start, TTL, MARGIN);
        tokio::time::advance(Duration::from_millis(500)).await;
        validity.sent(Instant::now());
        // The reply was held up in the network past the deadline (t = 8).
        tokio::time::advance(Duration::from_millis(8500)).await;
        let now = Instant::now();
        assert!(!validity.is_valid_at(now));
        assert_eq!(
            validity.replied(9),
            Renewal::Renewed {
                valid_until: start + Duration::from_millis(500 + 9000 - 1000)
            }
        );
        assert!(
            !validity.is_valid_at(now),
            "anchored at the send instant, the renewal ended before it arrived"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_never_moves_backwards() {
        let start = Instant::now();
        let mut validity = Validity::granted(start, TTL, MARGIN);
        tokio::time::advance(Duration::from_secs(3)).await;
        validity.sent(Instant::now());
        validity.sent(start); // answered second: an older anchor moves nothing
        validity.replied(9);
        assert_eq!(validity.valid_until(), start + Duration::from_secs(11));
        validity.replied(9);
        assert_eq!(validity.valid_until(), start + Duration::from_secs(11));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_ttl_below_the_grant_loses_the_lease() {
        let start = Instant::now();
        let mut validity = Validity::granted(start, TTL, MARGIN);
        validity.sent(start);
        // etcd renewed for less than it granted: its expiry is nearer than our deadline.
        assert_eq!(validity.replied(2), Renewal::Gone);
        validity.sent(start);
        assert_eq!(validity.replied(8), Renewal::Gone);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_ttl_above_the_grant_is_capped_at_it() {
        let start = Instant::now();
        let mut validity = Validity::granted(start, TTL, MARGIN);
        validity.sent(start);
        assert_eq!(
            validity.replied(i64::MAX),
            Renewal::Renewed {
                valid_until: start + Duration::from_secs(8)
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_ttl_reply_means_the_lease_is_gone() {
        let mut validity = Validity::granted(Instant::now(), TTL, MARGIN);
        validity.sent(Instant::now());
        assert_eq!(validity.replied(0), Renewal::Gone);
        validity.sent(Instant::now());
        assert_eq!(validity.replied(-1), Renewal::Gone);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_stream_forgets_unanswered_requests() {
        let start = Instant::now();
        let mut validity = Validity::granted(start, TTL, MARGIN);
        validity.sent(start);
        validity.stream_reset();
        assert_eq!(validity.oldest_outstanding(), None);
        assert_eq!(validity.replied(9), Renewal::Unexpected);
        tokio::time::advance(Duration::from_secs(1)).await;
        validity.sent(Instant::now());
        assert_eq!(
            validity.replied(9),
            Renewal::Renewed {
                valid_until: start + Duration::from_secs(1 + 9 - 1)
            }
        );
    }

    proptest::proptest! {
        /// Any TTL, margin, round trip and reply TTL: no panic, and a reply below the grant
        /// loses the lease.
        #[test]
        fn no_ttl_margin_or_reply_panics(
            ttl in proptest::prelude::any::<u64>(),
            margin_nanos in proptest::prelude::any::<u64>(),
            rtt_nanos in proptest::prelude::any::<u64>(),
            reply in proptest::prelude::any::<i64>(),
        ) {
            let (ttl, margin) = (Duration::from_secs(ttl), Duration::from_nanos(margin_nanos));
            let _ = check_margin(ttl, margin, Duration::from_nanos(rtt_nanos));
            let now = Instant::now();
            let mut validity = Validity::granted(now, ttl, margin);
            let _ = validity.is_valid_at(now);
            validity.sent(now);
            let renewal = validity.replied(reply);
            if reply <= 0 || reply.unsigned_abs() < ttl.as_secs() {
                proptest::prop_assert_eq!(renewal, Renewal::Gone);
            } else {
                let is_renewed = matches!(renewal, Renewal::Renewed { .. });
                proptest::prop_assert!(is_renewed);
            }
        }
    }

    #[test]
    fn the_margin_must_leave_room_to_renew() {
        let rtt = Duration::from_millis(100);
        assert!(check_margin(TTL, Duration::from_secs(5), rtt).is_ok());
        let error = check_margin(TTL, Duration::from_millis(5_900), rtt).unwrap_err();
        assert_eq!(error.limit, Duration::from_millis(5_900));
        // etcd's 2 s minimum TTL leaves at most 1.33 s minus a round trip.
        assert!(check_margin(Duration::from_secs(2), Duration::from_secs(1), rtt).is_ok());
        assert!(check_margin(Duration::from_secs(2), Duration::from_millis(1_300), rtt).is_err());
    }
}
