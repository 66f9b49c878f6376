//! One session's task: stand by, acquire, open the rig, run the user's work, give up in order,
//! back off and quarantine a session that cannot be opened (see the [module docs](super)).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, CatchUnwind};
use tokio::sync::{SemaphorePermit, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{GiveUp, HostEvent, HostOptions, Inner, Owned, lock};
use crate::backoff;
use crate::lease::Lease;
use crate::metrics::Metrics;
use crate::rig::{Rig, RigError};
use crate::store::AcquireError;
use crate::store::Standby;

/// After this many failed opens in a row, a session is quarantined (see
/// [`HostEvent::Quarantined`]).
const QUARANTINE_AFTER: u32 = 3;

/// How many sessions of one host acquire and open at once (see step 2 of `Idle::open`), and
/// how many shut down at once (`give_up`).
pub(super) const OPENING_AT_ONCE: usize = 512;

/// One session's task: see the module docs.
///
/// The task lives as long as the session is hosted here, and a future is as large as its
/// largest step; so the steps that run once per ownership (waiting for a slot, acquiring,
/// opening: several KiB) are boxed while they run, and what stays is the running session's
/// state (232 bytes; its task 384). Not an `async fn`: the session's state is made before the
/// `async` block, which keeps what it captures as it is, where an `async fn` would keep its
/// arguments and what it made of them.
pub(super) fn host_session(
    inner: Arc<Inner>,
    session: Uuid,
    stop: CancellationToken,
) -> impl Future<Output = ()> + Send {
    // Made here, not in the `async` block: the block keeps what it captures for as long as it
    // lives, and the session's id is the standby's.
    let mut idle = Idle {
        standby: inner.store.standby(session),
        failures: OpenFailures::default(),
        freed_elsewhere: false,
    };
    async move {
        loop {
            let Some((rig, moved_here)) = Box::pin(idle.open(&inner, &stop)).await else {
                idle.failures.forget(&inner.store.shared().metrics);
                return;
            };
            // Gives the slot back (see `give_up`).
            run(&inner, rig, moved_here, &stop).await;
        }
    }
}

/// What a hosted session keeps between ownerships.
struct Idle {
    standby: Standby,
    failures: OpenFailures,
    /// The standby was woken (the session freed) since the last slot it was given.
    freed_elsewhere: bool,
}

impl Idle {
    /// Steps 1 to 3: waits for a slot, acquires the session (as a move's target, if it is
    /// one) and opens its rig, until one opens (holding a slot) or the session is stopped
    /// (`None`). Whether the session came through a move, with the rig.
    async fn open(&mut self, inner: &Inner, stop: &CancellationToken) -> Option<(Arc<Rig>, bool)> {
        let session = self.standby.session();
        let mut cap = inner.cap.subscribe();
        loop {
            self.take_slot(inner, &mut cap, stop).await?;
            let Acquired::Held {
                lease,
                opening,
                moved,
            } = self.acquire(inner, stop).await?
            else {
                continue;
            };
            // --- 3. open
            let workspace = (inner.options.workspace)(session);
            let opened = Box::pin(Rig::with_lease(&inner.store, lease, &workspace)).await;
            drop(opening);
            let pause = match opened {
                Ok(rig) => {
                    if self.failures.opened(&inner.store.shared().metrics) {
                        tracing::info!(%session, "quarantined session opened again");
                    }
                    return Some((Arc::new(rig), moved));
                }
                Err(error) => self.failed_to_open(inner, Arc::new(error)),
            };
            inner.unreserve();
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.cancelled() => return None,
            }
        }
    }

    /// Step 1: waits for a free slot and takes it; `None` once the session is stopped. A
    /// freed slot wakes one waiting session (not all of them: a host shedding 50,000 sessions
    /// would wake every waiting one 50,000 times); one woken that does not take the slot
    /// passes the wake-up on.
    async fn take_slot(
        &mut self,
        inner: &Inner,
        cap: &mut watch::Receiver<usize>,
        stop: &CancellationToken,
    ) -> Option<()> {
        let session = self.standby.session();
        let mut woken = false;
        loop {
            if stop.is_cancelled() {
                if woken {
                    inner.pass_slot_on();
                }
                return None;
            }
            cap.borrow_and_update();
            if self.standby.held_elsewhere() {
                if std::mem::take(&mut woken) {
                    inner.pass_slot_on();
                }
                // Held elsewhere: a slot taken for it would go to a refused acquisition
                // (while an unowned session waits for it). Stand by for the delete.
                self.freed_elsewhere |= stand_by(&self.standby, inner, stop).await?;
                continue;
            }
            if inner.reserve() || inner.reserve_moved(session) {
                return Some(());
            }
            // No slot was free after all: there is nothing to pass on.
            woken = false;
            if std::mem::take(&mut self.freed_elsewhere) {
                // Freed while this host is full (the wake-up was taken while standing by, in
                // step 2): maybe a host left; count again now, not at the next tick.
                inner.recount.notify_one();
            }
            tokio::select! {
                // A wake-up taken here and then dropped (the stop won the race) is passed on
                // by `Notify` itself.
                () = inner.slot_freed.notified() => woken = true,
                _ = cap.changed() => {}
                // Freed while this host is full: maybe a host left; count again now.
                _ = self.standby.notified() => inner.recount.notify_one(),
                _ = stop.cancelled() => return None,
            }
        }
    }

    /// Step 2, holding a slot: acquires the session (as a move's target, if it is one), or
    /// stands by and gives the slot back. At most `OPENING_AT_ONCE` sessions
    /// acquire and open at once, each in a boxed future of a few KiB that lives only while it
    /// runs: a host started over many sessions holds them all at once otherwise (the store
    /// sends a window of requests at a time). `None` once the session is stopped (the slot
    /// given back).
    async fn acquire<'a>(
        &mut self,
        inner: &'a Inner,
        stop: &CancellationToken,
    ) -> Option<Acquired<'a>> {
        let session = self.standby.session();
        let opening = tokio::select! {
            permit = inner.opening.acquire() => permit.expect("the semaphore is never closed"),
            _ = stop.cancelled() => {
                inner.unreserve();
                return None;
            }
        };
        let moved = inner.moved_here(session);
        // A session hosted for the registry's sake only is acquired only while the registry
        // has it: a host that hears late of its finish takes it no more.
        let registered = inner.is_registered_only(session);
        let acquire = Box::pin(inner.store.acquire_hosted(session, moved, registered));
        let acquired = tokio::select! {
            acquired = acquire => acquired,
            _ = stop.cancelled() => {
                inner.unreserve();
                return None;
            }
        };
        let error = match acquired {
            Ok(lease) => {
                let moved = moved.is_some();
                return Some(Acquired::Held {
                    lease,
                    opening,
                    moved,
                });
            }
            Err(error) => error,
        };
        drop(opening);
        inner.unreserve();
        if error.is_transient() {
            self.freed_elsewhere |= stand_by(&self.standby, inner, stop).await?;
            return Some(Acquired::Again);
        }
        if let AcquireError::NotRegistered { .. } = error {
            // Finished: the registry's watch removes it here soon.
            tracing::debug!(%session, "session host cannot acquire: not in the registry");
        } else {
            tracing::warn!(%session, %error, "session host cannot acquire");
        }
        if inner.store.shared().shutdown.is_cancelled() {
            return None;
        }
        tokio::select! {
            _ = tokio::time::sleep(inner.options.retry_pause) => {}
            _ = stop.cancelled() => return None,
        }
        Some(Acquired::Again)
    }

    /// Step 3 failed with `error`: counts the failure (quarantining a session that keeps
    /// failing) and says how long to pause before the next attempt.
    fn failed_to_open(&mut self, inner: &Inner, error: Arc<RigError>) -> Duration {
        let session = self.standby.session();
        inner.emit(HostEvent::OpenFailed {
            session,
            error: error.clone(),
        });
        let failures = &mut self.failures;
        let (pause, quarantined) = failures.failed(&inner.options, &inner.store.shared().metrics);
        if quarantined {
            let (failures, why) = (failures.count, crate::etcd::chain(&*error));
            tracing::warn!(%session, failures, retry_in = ?pause, %why, "session quarantined: it keeps failing to open; retrying with backoff");
            inner.emit(HostEvent::Quarantined {
                session,
                failures,
                retry_in: pause,
                error,
            });
        } else {
            tracing::debug!(%session, failures = failures.count, retry_in = ?pause, error = %crate::etcd::chain(&*error), "session failed to open");
        }
        pause
    }
}

/// What step 2 came to: the session's lease, with the permit to open it, or another try.
enum Acquired<'a> {
    Held {
        lease: Lease,
        opening: SemaphorePermit<'a>,
        /// It came through a move.
        moved: bool,
    },
    Again,
}

/// Stands by for the owner key's delete, with the store's slow re-check as a backstop: whether
/// the delete woke it, or `None` once the session is stopped.
async fn stand_by(standby: &Standby, inner: &Inner, stop: &CancellationToken) -> Option<bool> {
    tokio::select! {
        _ = standby.notified() => Some(true),
        _ = tokio::time::sleep(inner.store.standby_recheck()) => Some(false),
        _ = stop.cancelled() => None,
    }
}

/// A session's failed opens in a row, the pause before its next attempt (a jittered backoff
/// from [`HostOptions::retry_pause`] doubling up to [`HostOptions::max_retry_pause`], reset when
/// the session opens: computed from the count, so that a session keeps no backoff state) and
/// its quarantine, which the store's metrics count while it lasts (`forget` ends it when the
/// session is no longer hosted here).
#[derive(Default)]
struct OpenFailures {
    count: u32,
    quarantined: bool,
}

impl OpenFailures {
    /// One more failure: the pause before the next attempt, and whether the session was
    /// quarantined now or is still (a warning each time).
    fn failed(&mut self, options: &HostOptions, metrics: &Metrics) -> (Duration, bool) {
        self.count = self.count.saturating_add(1);
        let (first, max) = (options.retry_pause, options.max_retry_pause);
        let pause = backoff::nth(first, max, self.count, true);
        if self.count >= QUARANTINE_AFTER && !self.quarantined {
            self.quarantined = true;
            metrics.quarantined(1.0);
        }
        (pause, self.quarantined)
    }

    /// The session opened: the count starts over. True if it was quarantined.
    fn opened(&mut self, metrics: &Metrics) -> bool {
        self.count = 0;
        self.forget(metrics)
    }

    /// No longer quarantined (the session opened, or is no longer hosted here). True if it
    /// was.
    fn forget(&mut self, metrics: &Metrics) -> bool {
        let quarantined = std::mem::take(&mut self.quarantined);
        if quarantined {
            metrics.quarantined(-1.0);
        }
        quarantined
    }
}

/// Runs the user's work on an owned session until it must be given up, then shuts the rig down
/// in order.
///
/// One token stops the work, whatever gives the session up: the session's stop (`stop_owned`
/// cancels it), a shed (the balance loop cancels it), a loss or the journal's breaking (hooks
/// cancel it).
/// Why is read off the session once it is cancelled or the work returned. So an owned session
/// waits on one registration, not one per reason; and its work is polled here, in the
/// session's task, not in a task of its own (a work that panics is caught here: the session is
/// given up as if the work had returned).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would keep its arguments twice in its state"
)]
fn run<'a>(
    inner: &'a Inner,
    rig: Arc<Rig>,
    moved_here: bool,
    stop: &'a CancellationToken,
) -> impl Future<Output = ()> + Send + 'a {
    async move {
        let (session, epoch) = (rig.session_id(), rig.epoch());
        let token = CancellationToken::new();
        let on_loss = token.clone();
        rig.on_loss(move |_| on_loss.cancel());
        let on_broken = token.clone();
        rig.journal().on_broken(move || on_broken.cancel());
        let acquired_at = tokio::time::Instant::now();
        let owned = Owned {
            rig: rig.clone(),
            token: token.clone(),
            shed: std::sync::atomic::AtomicBool::new(false),
            moved_to: std::sync::OnceLock::new(),
            moved_here,
            since: acquired_at,
            meter: std::sync::Mutex::new(super::load::Meter::new(
                rig.journal().next_seq(),
                acquired_at,
            )),
        };
        {
            let mut owned_sessions = lock(&inner.owned);
            owned_sessions.insert(session, owned);
            // Stopped before it was registered as owned: `stop_owned` did not see it.
            if stop.is_cancelled() {
                token.cancel();
            }
        }
        inner.emit(HostEvent::Acquired { session, epoch });
        inner.first_taken.call_once(|| {
            let node = inner.store.node();
            tracing::info!(node, %session, %epoch, "session host took its first session");
        });
        let mut work = AssertUnwindSafe((inner.work)(rig.clone(), token.clone())).catch_unwind();
        let returned = tokio::select! {
            () = token.cancelled() => false,
            returned = &mut work => {
                if returned.is_err() {
                    tracing::warn!(session = %rig.session_id(), "the session's work panicked");
                }
                true
            }
        };
        let why = why(inner, &rig, stop);
        token.cancel();
        let work = (!returned).then_some(work);
        // Boxed: it runs once, at the end (see `host_session`).
        Box::pin(give_up(inner, rig, work, why)).await;
    }
}

/// Why an owned session is given up, once its token was cancelled, its journal broke or its
/// work returned. A lost lease also breaks the journal once an append finds it lost: the loss
/// is the reason, so it is looked at first; a lease past its deadline is about to be signalled
/// lost, as expired. Work that returned by itself gives the session up as
/// [`GiveUp::WorkDone`], and so does work that cancelled its own token.
fn why(inner: &Inner, rig: &Rig, stop: &CancellationToken) -> GiveUp {
    if let Some(reason) = rig.ownership().loss_reason() {
        return GiveUp::Lost(reason);
    }
    if !rig.is_valid() {
        return GiveUp::Lost(crate::lease::LossReason::Expired);
    }
    if rig.journal().is_broken() {
        return GiveUp::JournalBroken;
    }
    let shed = lock(&inner.owned)
        .get(&rig.session_id())
        .filter(|owned| owned.is_shed())
        .map(|owned| owned.moved_to.get().copied());
    match shed {
        Some(Some(to)) => GiveUp::Moved { to },
        Some(None) => GiveUp::Shed,
        None if stop.is_cancelled() => GiveUp::Stopped,
        None => GiveUp::WorkDone,
    }
}

/// The user's work on a session, as `run` polls it.
type WorkFuture = CatchUnwind<AssertUnwindSafe<BoxFuture<'static, ()>>>;

/// Gives the session up in order: the work, if it has not returned, stops (within its grace
/// period, or it is dropped), the rig shuts down, and the host says so.
async fn give_up(inner: &Inner, rig: Arc<Rig>, work: Option<WorkFuture>, why: GiveUp) {
    let (session, epoch) = (rig.session_id(), rig.epoch());
    if let Some(work) = work {
        match tokio::time::timeout(inner.options.stop_grace, work).await {
            Err(_) => {
                tracing::warn!(%session, "the session's work did not stop within its grace period; aborting it");
            }
            Ok(Err(_)) => tracing::warn!(%session, "the session's work panicked"),
            Ok(Ok(())) => {}
        }
    }
    // As many shut down at once as open at once: a host shedding half of 100,000 sessions
    // would otherwise queue 100,000 deletes behind the store's window, long enough for some
    // to fail unsent.
    let result = {
        let _closing = inner.closing.acquire().await;
        rig.shutdown().await.map_err(Arc::new)
    };
    // Its slot is given back as it leaves the owned sessions, under one lock: a shed counts
    // a session on its way out (its token cancelled) as shed already, until its slot is free.
    {
        let mut owned = lock(&inner.owned);
        owned.remove(&session);
        inner.unreserve();
    }
    tracing::info!(%session, %epoch, %why, "session given up");
    inner.emit(HostEvent::GaveUp {
        session,
        epoch,
        why,
        result,
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::OpenFailures;
    use crate::host::HostOptions;
    use crate::keys::Namespace;
    use crate::metrics::Metrics;

    fn failures(first: Duration, max: Duration) -> (OpenFailures, HostOptions) {
        let options = HostOptions::default()
            .with_retry_pause(first)
            .with_max_retry_pause(max);
        (OpenFailures::default(), options)
    }

    fn metrics() -> Metrics {
        Metrics::new("n", &Namespace::new("ns").unwrap())
    }

    #[test]
    fn failed_opens_back_off_to_the_cap_and_quarantine_from_the_third() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let (mut open, options) = failures(first, max);
        let mut nominal = first;
        for failure in 1..=12 {
            let (pause, quarantined) = open.failed(&options, &metrics());
            assert!(
                nominal <= pause && pause < nominal * 2,
                "failure {failure}: {pause:?}, nominal {nominal:?}"
            );
            assert_eq!(quarantined, failure >= 3, "failure {failure}");
            nominal = (nominal * 2).min(max);
        }
        assert!(open.opened(&metrics()), "it was quarantined");
        assert!(!open.opened(&metrics()));
        let (pause, quarantined) = open.failed(&options, &metrics());
        assert!(pause < first * 2 && !quarantined, "it starts over");
    }

    #[test]
    fn huge_retry_pauses_saturate() {
        let (mut open, options) = failures(Duration::MAX, Duration::MAX);
        for _ in 0..5 {
            assert_eq!(open.failed(&options, &metrics()).0, Duration::MAX);
        }
        let (mut open, options) = failures(Duration::from_secs(1), Duration::ZERO);
        assert!(
            open.failed(&options, &metrics()).0 >= Duration::from_secs(1),
            "the cap is at least the first"
        );
    }
}
