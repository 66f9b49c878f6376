//! Deadlines that saturate: any `Duration` a caller gives, `Duration::MAX` included, makes a
//! deadline, never an overflow. (The pauses between retries are `backoff.rs`'s.)
//!
//! `Duration::MAX` is the way to say "wait forever", so a timeout too long to add to the clock
//! is a deadline about 30 years away (as tokio's own `sleep` and `timeout` do): never reached
//! in practice, and far enough inside every platform's clock that adding to it again, or
//! comparing with it, stays safe. Imports nothing of the crate.

use std::time::Duration;

use tokio::time::Instant;

/// About 30 years: what a longer wait waits instead (forever, in practice). 1000 years
/// overflows the clock on some platforms, 100 on others.
pub(crate) const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The instant `timeout` after `now`; a timeout longer than [`FOREVER`] waits that long.
pub(crate) fn deadline(now: Instant, timeout: Duration) -> Instant {
    // A clock within 30 years of its end does not exist; `now` keeps this total.
    now.checked_add(timeout.min(FOREVER)).unwrap_or(now)
}

/// Any duration a caller may give, the extremes included: for property tests of what takes
/// one.
#[cfg(test)]
pub(crate) fn any_duration() -> impl proptest::strategy::Strategy<Value = Duration> {
    use proptest::prelude::*;
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(FOREVER),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..1_000_000_000_000).prop_map(Duration::from_nanos),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any timeout makes a deadline no earlier than `now`, exactly `timeout` later when
        /// it is at most [`FOREVER`], and [`FOREVER`] later when it is longer.
        #[test]
        fn any_timeout_makes_a_deadline(timeout in any_duration()) {
            let now = Instant::now();
            let at = deadline(now, timeout);
            proptest::prop_assert_eq!(at - now, timeout.min(FOREVER));
            // What callers do with a deadline: compare, measure what is left, add a pause.
            proptest::prop_assert!(at >= now);
            let _ = at.saturating_duration_since(Instant::now());
            proptest::prop_assert!(at.checked_add(FOREVER).is_some());
        }
    }

    /// "Wait forever" means forever, not an immediate timeout.
    #[test]
    fn duration_max_waits_forever() {
        let now = Instant::now();
        let waits = deadline(now, Duration::MAX) - now;
        assert!(waits >= Duration::from_secs(86_400 * 365 * 29), "{waits:?}");
    }
}
