//! [`Backoff`]: the pause before each retry, for every retry loop leasehold runs.
//!
//! One rule for all of them, so that each loop says only its numbers and when it starts over:
//!
//! - **Growth.** The first pause is `initial`; each later one is twice the one before, until
//!   it reaches `max`: `initial`, 2 × `initial`, 4 × `initial`, … , `max`, `max`, … The doubling
//!   is exact and saturating (integer nanoseconds, not floating point), so a deterministic
//!   schedule is the same to the nanosecond on every run, and `Duration::MAX` doubles to
//!   itself instead of overflowing.
//! - **Bound.** No pause before jitter exceeds `max`; a `max` below `initial` counts as
//!   `initial` (the bound is at least the first pause). With jitter, each pause is drawn at
//!   random from [nominal, 2 × nominal): never shorter than the schedule says, less than twice
//!   as long (saturating at `Duration::MAX`). Jitter is `backon`'s, so that many clients that
//!   failed together do not retry together.
//! - **Reset.** Only [`reset`](Backoff::reset) starts the schedule over at `initial`; the loop
//!   decides when (after a write, a request, a healthy watch run, a session that opened). A
//!   `Backoff` never runs out.
//!
//! Its users, and their numbers:
//!
//! - the write path (`etcd/write.rs`): jittered, from [`WritePolicy`](crate::WritePolicy)'s
//!   backoff (20 ms to 100 ms by default), fresh for each write;
//! - requests through `Connection` (`etcd/connection.rs`): deterministic, from
//!   [`RetryPolicy`](crate::RetryPolicy)'s backoff (50 ms to 1 s by default), a pause after each
//!   full round of endpoints, fresh for each request;
//! - the owner watch (`store/owner_watch.rs`) and a followed journal (`admin.rs`):
//!   deterministic, 100 ms to 2 s, reset after a healthy run;
//! - a session host's failed opens (`host/session.rs`): jittered, from
//!   [`HostOptions`](crate::HostOptions)'s retry pauses (500 ms to 60 s by default), reset when
//!   the session opens.
//!
//! Imports nothing of the crate.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};

/// A growing, bounded pause between retries, optionally jittered: see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    initial: Duration,
    /// The bound before jitter: at least `initial`.
    max: Duration,
    /// The next pause before jitter.
    nominal: Duration,
    jitter: bool,
}

impl Backoff {
    /// A deterministic backoff from `initial`, doubling up to `max` (at least `initial`).
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            nominal: initial,
            jitter: false,
        }
    }

    /// The same schedule, each pause drawn from [nominal, 2 × nominal).
    pub(crate) fn with_jitter(mut self) -> Self {
        self.jitter = true;
        self
    }

    /// The pause before the next retry; the schedule moves on by one.
    pub(crate) fn next(&mut self) -> Duration {
        let nominal = self.nominal;
        self.nominal = nominal.saturating_mul(2).min(self.max);
        if self.jitter {
            jittered(nominal)
        } else {
            nominal
        }
    }

    /// Starts the schedule over: the next pause is `initial` again.
    pub(crate) fn reset(&mut self) {
        self.nominal = self.initial;
    }
}

/// A `Backoff` is an endless iterator of pauses, so it is also a `backon` backoff.
impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Backoff::next(self))
    }
}

/// `pause` plus, at random, up to as much again (saturating): `backon`'s jitter, which adds
/// to its first pause a uniformly drawn fraction of it.
/// The pause after `failures` failures in a row (1 or more) of a [`Backoff`] from `initial`
/// doubling up to `max`, jittered if asked: what that many calls of [`Backoff::next`] give
/// last, with no state kept between failures but their count.
pub(crate) fn nth(initial: Duration, max: Duration, failures: u32, jitter: bool) -> Duration {
    let doublings = failures.saturating_sub(1);
    let nominal = initial
        .saturating_mul(2u32.saturating_pow(doublings))
        .min(max.max(initial));
    if jitter { jittered(nominal) } else { nominal }
}

fn jittered(pause: Duration) -> Duration {
    ExponentialBuilder::new()
        .with_min_delay(pause)
        .with_jitter()
        .build()
        .next()
        .unwrap_or(pause)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::any_duration;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn pauses(backoff: &mut Backoff, n: usize) -> Vec<Duration> {
        (0..n).map(|_| backoff.next()).collect()
    }

    #[test]
    fn nth_is_what_as_many_calls_of_next_give_last() {
        for (initial, max) in [(ms(100), ms(2000)), (ms(50), ms(1000)), (ms(7), ms(3))] {
            let mut backoff = Backoff::new(initial, max);
            for failures in 1..=40 {
                assert_eq!(
                    nth(initial, max, failures, false),
                    backoff.next(),
                    "{initial:?} {max:?}, failure {failures}"
                );
            }
        }
        assert_eq!(nth(Duration::MAX, Duration::MAX, 64, false), Duration::MAX);
    }

    #[test]
    fn it_doubles_exactly_from_the_first_pause_up_to_the_bound() {
        let mut backoff = Backoff::new(ms(100), Duration::from_secs(2));
        assert_eq!(
            pauses(&mut backoff, 8),
            [100, 200, 400, 800, 1600, 2000, 2000, 2000].map(ms)
        );
        // Not a power-of-two fraction of a second either: still exact.
        let mut backoff = Backoff::new(ms(50), Duration::from_secs(1));
        assert_eq!(
            pauses(&mut backoff, 7),
            [50, 100, 200, 400, 800, 1000, 1000].map(ms)
        );
    }

    #[test]
    fn reset_starts_the_schedule_over_and_only_reset_does() {
        let fresh = Backoff::new(ms(100), Duration::from_secs(2));
        let mut backoff = fresh.clone();
        assert_eq!(pauses(&mut backoff, 3), [100, 200, 400].map(ms));
        backoff.reset();
        assert_eq!(pauses(&mut backoff, 2), [100, 200].map(ms));
        // It never runs out: a thousand pauses later it is still at the bound.
        assert_eq!(backoff.by_ref().nth(1000), Some(Duration::from_secs(2)));
        backoff.reset();
        assert_eq!(backoff, fresh);
    }

    #[test]
    fn a_bound_below_the_first_pause_is_the_first_pause() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::ZERO);
        assert_eq!(pauses(&mut backoff, 3), [Duration::from_secs(1); 3]);
        let mut zero = Backoff::new(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(pauses(&mut zero, 3), [Duration::ZERO; 3], "zero stays zero");
    }

    #[test]
    fn jitter_draws_each_pause_from_nominal_to_twice_nominal() {
        let (initial, max) = (ms(20), ms(100));
        let mut jittered = Backoff::new(initial, max).with_jitter();
        let mut schedule = Backoff::new(initial, max);
        let mut moved = false;
        for i in 0..200 {
            let (pause, nominal) = (jittered.next(), schedule.next());
            assert!(
                nominal <= pause && pause < nominal * 2,
                "pause {i}: {pause:?}, nominal {nominal:?}"
            );
            moved |= pause != nominal;
        }
        assert!(moved, "jitter moves some pause off the schedule");
        jittered.reset();
        assert!(jittered.next() < initial * 2, "reset with jitter too");
    }

    proptest::proptest! {
        /// Any first pause and bound, the extremes included: no overflow; every pause within
        /// [first, bound] before jitter and at most twice that with it (saturating); the
        /// schedule never shrinks, reaches its bound, and starts over at the first on reset.
        #[test]
        fn any_first_pause_and_bound_stay_bounded_without_overflow(
            initial in any_duration(),
            max in any_duration(),
        ) {
            let bound = max.max(initial);
            let mut plain = Backoff::new(initial, max);
            let mut jittered = Backoff::new(initial, max).with_jitter();
            let mut last = Duration::ZERO;
            for _ in 0..100 {
                let (pause, noisy) = (plain.next(), jittered.next());
                proptest::prop_assert!(initial <= pause && pause <= bound);
                proptest::prop_assert!(pause >= last, "it never shrinks");
                proptest::prop_assert!(pause <= noisy && noisy <= pause.saturating_mul(2));
                last = pause;
            }
            if !initial.is_zero() {
                proptest::prop_assert_eq!(last, bound, "a hundred doublings reach any bound");
            }
            plain.reset();
            proptest::prop_assert_eq!(plain.next(), initial);
        }
    }
}
