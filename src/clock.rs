//! The clock that lease validity is measured on: one that keeps running while the machine is
//! suspended.
//!
//! `tokio::time::Instant` reads CLOCK_MONOTONIC, which stops while a machine or VM is
//! suspended. etcd's clock does not: after a suspend longer than the TTL, etcd has expired the
//! node lease and another node may own its sessions, while a deadline on CLOCK_MONOTONIC has
//! not passed. So every instant that validity compares (keepalive send instants, deadlines,
//! "now") is read from [`now`]: the monotonic instant plus the time this process has spent
//! suspended, which is CLOCK_BOOTTIME − CLOCK_MONOTONIC, less what it was when the process
//! first asked. After a resume, `is_valid()` is false at once; the tokio timers that wake the
//! keepalive are still on CLOCK_MONOTONIC, so they fire as late as the suspend was long, and
//! [`sleep_until`] re-reads the clock every time it is armed.
//!
//! A hypervisor that pauses a VM (rather than suspending its guest) freezes both clocks: the
//! guest cannot see the pause, and its `is_valid()` stays true until the next renewal reply or
//! watch event says otherwise. The journal's compare-and-swap fence still holds: a stale
//! owner's appends fail their compare, whatever its clock says.
//!
//! Imports nothing of the crate but `deadline`.
//!
//! Where CLOCK_BOOTTIME does not exist (outside Linux) the suspended time reads as zero.
//! Tests move it forward with `suspend` (unit tests only), without moving tokio's clock.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Now, on the clock that runs while suspended (see the module docs).
pub(crate) fn now() -> Instant {
    let now = Instant::now();
    now.checked_add(suspended()).unwrap_or(now)
}

/// `instant` + `by`, saturating as [`deadline`](crate::deadline::deadline) does.
pub(crate) fn after(instant: Instant, by: Duration) -> Instant {
    crate::deadline::deadline(instant, by)
}

/// How long ago `instant` (read from [`now`]) was.
pub(crate) fn since(instant: Instant) -> Duration {
    now().saturating_duration_since(instant)
}

/// Sleeps until `deadline`, an instant read from [`now`]. Armed on tokio's clock, so a suspend
/// while it sleeps makes it fire late by as much; a caller that re-arms it after every event
/// (as a `select!` in a loop does) converts again each time.
pub(crate) async fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    let monotonic = deadline.checked_sub(suspended()).unwrap_or(now);
    tokio::time::sleep_until(monotonic).await;
}

/// How long this process has spent suspended so far; it never decreases.
fn suspended() -> Duration {
    static BASELINE: OnceLock<Duration> = OnceLock::new();
    static MOST: AtomicU64 = AtomicU64::new(0);
    let total = boot_minus_monotonic();
    let baseline = *BASELINE.get_or_init(|| total);
    let since = total.saturating_sub(baseline);
    // The two clocks are read one after the other: keep the largest seen, so jitter between
    // the reads never moves the clock backwards.
    let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
    let most = MOST.fetch_max(nanos, Ordering::AcqRel).max(nanos);
    Duration::from_nanos(most).saturating_add(test::suspended())
}

/// CLOCK_BOOTTIME − CLOCK_MONOTONIC: the time the machine has spent suspended since boot.
#[cfg(target_os = "linux")]
fn boot_minus_monotonic() -> Duration {
    use rustix::time::{ClockId, clock_gettime};
    let duration = |ts: rustix::time::Timespec| {
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(ts.tv_nsec).unwrap_or(0).min(999_999_999);
        Duration::new(secs, nanos)
    };
    let monotonic = duration(clock_gettime(ClockId::Monotonic));
    let boot = duration(clock_gettime(ClockId::Boottime));
    boot.saturating_sub(monotonic)
}

/// Without CLOCK_BOOTTIME, no suspend is seen.
#[cfg(not(target_os = "linux"))]
fn boot_minus_monotonic() -> Duration {
    Duration::ZERO
}

#[cfg(test)]
pub(crate) use test::suspend;

#[cfg(test)]
mod test {
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        /// Suspended time added by this thread's test (paused-time tests run on one thread).
        static SUSPENDED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    /// Moves the suspend-aware clock forward by `by`, as a suspend of the machine would,
    /// without moving tokio's clock; for this thread only.
    pub(crate) fn suspend(by: Duration) {
        SUSPENDED.with(|suspended| suspended.set(suspended.get().saturating_add(by)));
    }

    pub(super) fn suspended() -> Duration {
        SUSPENDED.with(Cell::get)
    }
}

#[cfg(not(test))]
mod test {
    use std::time::Duration;

    pub(super) fn suspended() -> Duration {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_suspend_moves_this_clock_and_not_tokios() {
        let (before, tokio_before) = (now(), Instant::now());
        suspend(Duration::from_secs(90));
        assert_eq!(Instant::now(), tokio_before, "tokio's clock stood still");
        assert!(now() >= before + Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_until_an_instant_of_this_clock_ends_there() {
        suspend(Duration::from_secs(5));
        let deadline = now() + Duration::from_secs(2);
        sleep_until(deadline).await;
        assert!(now() >= deadline);
        // A deadline that a suspend already passed ends at once.
        let deadline = now() + Duration::from_secs(2);
        suspend(Duration::from_secs(3));
        let started = Instant::now();
        sleep_until(deadline).await;
        assert_eq!(Instant::now(), started);
    }

    #[test]
    fn the_suspended_time_never_decreases() {
        let first = suspended();
        for _ in 0..1000 {
            assert!(suspended() >= first);
        }
    }
}
