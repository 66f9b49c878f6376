//! The state a lease's handles share with the store's tasks.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;
use uuid::Uuid;

use super::{Epoch, LossReason};
use crate::clock;
use crate::hooks::OnceHooks;
use crate::metrics::Metrics;
use etcd_client::KeyValue;

/// One generation of a store's node lease, as its handles see it. The keepalive task moves the
/// deadline; readers need no lock.
#[derive(Debug)]
pub(crate) struct NodeLease {
    pub(crate) id: i64,
    origin: Instant,
    /// The validity deadline, in nanoseconds after `origin`.
    valid_until: AtomicU64,
    lost: AtomicBool,
    reason: std::sync::OnceLock<LossReason>,
    /// Where the leases of this generation are counted (set by the first handed out): kept
    /// here once, not in each lease.
    metrics: std::sync::OnceLock<Metrics>,
}

/// Its instants are on the suspend-aware clock ([`clock::now`]), as [`Validity`]'s are.
///
/// [`Validity`]: super::validity::Validity
impl NodeLease {
    pub(crate) fn new(id: i64, valid_until: Instant) -> Self {
        let origin = clock::now();
        let lease = Self {
            id,
            origin,
            valid_until: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            reason: std::sync::OnceLock::new(),
            metrics: std::sync::OnceLock::new(),
        };
        lease.set_valid_until(valid_until);
        lease
    }

    pub(crate) fn set_valid_until(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.origin).as_nanos();
        self.valid_until
            .fetch_max(nanos.min(u64::MAX as u128) as u64, Ordering::AcqRel);
    }

    pub(crate) fn valid_until(&self) -> Instant {
        let after = Duration::from_nanos(self.valid_until.load(Ordering::Acquire));
        self.origin.checked_add(after).unwrap_or(self.origin)
    }

    /// Marks this generation lost for good: it is never renewed again. The first reason
    /// sticks.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        let _ = self.reason.set(reason);
        self.lost.store(true, Ordering::Release);
    }

    /// Why this generation was lost, once it was.
    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.reason.get().copied()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Not lost and before its deadline, on the clock that runs while the machine is
    /// suspended. No I/O, no lock.
    pub(crate) fn is_valid(&self) -> bool {
        !self.is_lost() && clock::now() < self.valid_until()
    }
}

/// Resolves with the [`LossReason`] once a lease is lost; cheap to clone, and every clone can
/// be awaited (each resolves with the same reason). Like `tokio::sync::watch`, it observes the
/// latest state: awaiting it after the loss resolves at once.
pub struct Lost {
    state: Arc<LeaseState>,
    /// Registered for the loss's notification, while awaited (allocated only then: a lease
    /// is mostly held, not awaited by many).
    waiting: Option<Pin<Box<OwnedNotified>>>,
}

impl Clone for Lost {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            waiting: None,
        }
    }
}

impl std::fmt::Debug for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Lost")
            .field(&self.state.loss_reason())
            .finish()
    }
}

impl Future for Lost {
    type Output = LossReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LossReason> {
        let this = &mut *self;
        loop {
            if let Some(reason) = this.state.loss_reason() {
                this.waiting = None;
                return Poll::Ready(reason);
            }
            match &mut this.waiting {
                // Registered first, then the reason is looked at again: a loss recorded in
                // between is seen there, one after it notifies this registration.
                None => {
                    let mut notified = Box::pin(this.state.loss.clone().notified_owned());
                    notified.as_mut().enable();
                    this.waiting = Some(notified);
                }
                Some(notified) => {
                    std::task::ready!(notified.as_mut().poll(cx));
                    this.waiting = None;
                }
            }
        }
    }
}

/// What every handle of one lease shares.
#[derive(Debug)]
pub(crate) struct LeaseState {
    pub(crate) session: Uuid,
    pub(crate) epoch: Epoch,
    pub(crate) owner_key: String,
    /// The nonce written into the owner key's value by the acquisition.
    pub(crate) nonce: Uuid,
    pub(crate) node: Arc<NodeLease>,
    lost_flag: AtomicBool,
    released: AtomicBool,
    /// One journal per lease: 0 none, 1 opening, 2 opened.
    journal: std::sync::atomic::AtomicU8,
    /// Why the lease was lost, once it was: the first reason recorded.
    reason: std::sync::OnceLock<LossReason>,
    /// Notified once, when the reason is recorded.
    loss: Arc<Notify>,
    /// `COUNTED` once handed out and counted as held (its node lease then knows where), `LOST`
    /// once lost: the held gauge goes down once for each lease it went up for, whichever comes
    /// first.
    counting: std::sync::atomic::AtomicU8,
    /// The journal's tip key as the acquisition read it (`Some(None)`: there was none), in
    /// the transaction that created the owner key; the journal's open fences at it instead of
    /// reading it again. Taken by the open. Boxed: it lives only until the open.
    seen_tip: std::sync::Mutex<Option<Box<Option<KeyValue>>>>,
    /// What runs once, when the lease is lost (see [`on_loss`](Self::on_loss)).
    on_loss: OnceHooks<LossReason>,
}

const COUNTED: u8 = 1;
const LOST: u8 = 2;

impl LeaseState {
    pub(crate) fn new(
        session: Uuid,
        epoch: Epoch,
        owner_key: String,
        nonce: Uuid,
        node: Arc<NodeLease>,
    ) -> Arc<Self> {
        Arc::new(Self {
            session,
            epoch,
            owner_key,
            nonce,
            node,
            lost_flag: AtomicBool::new(false),
            released: AtomicBool::new(false),
            journal: std::sync::atomic::AtomicU8::new(0),
            reason: std::sync::OnceLock::new(),
            loss: Arc::new(Notify::new()),
            counting: std::sync::atomic::AtomicU8::new(0),
            seen_tip: std::sync::Mutex::new(None),
            on_loss: OnceHooks::default(),
        })
    }

    /// Counts the lease as acquired and held, once it is handed out.
    pub(crate) fn count_held(&self, metrics: &Metrics) {
        metrics.acquisition("acquired");
        let _ = self.node.metrics.set(metrics.clone());
        if self.counting.fetch_or(COUNTED, Ordering::AcqRel) & LOST == 0 {
            metrics.held();
        }
    }

    /// Records the loss; the first reason wins. Returns whether this call lost the lease.
    pub(crate) fn lose(&self, reason: LossReason) -> bool {
        // The flag goes first, so is_valid() is false before anyone can observe the reason.
        self.lost_flag.store(true, Ordering::Release);
        let first = self.reason.set(reason).is_ok();
        if first {
            self.loss.notify_waiters();
            self.on_loss.run(reason);
            tracing::info!(session = %self.session, epoch = %self.epoch, %reason, "lease lost");
            if self.counting.fetch_or(LOST, Ordering::AcqRel) & COUNTED != 0
                && let Some(metrics) = self.node.metrics.get()
            {
                metrics.lost(reason.label());
            }
        }
        first
    }

    /// Marks the lease released by its holder; true on the first call only.
    pub(crate) fn release(&self) -> bool {
        if self.released.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.lose(LossReason::Released);
        true
    }

    /// Claims the lease's one journal; false if a journal is open or opening.
    pub(crate) fn claim_journal(&self) -> bool {
        self.journal
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends the claim: `opened` keeps it for good; otherwise the lease may open again.
    pub(crate) fn settle_journal(&self, opened: bool) {
        self.journal
            .store(if opened { 2 } else { 0 }, Ordering::Release);
    }

    /// Runs `hook` once, when the lease is lost (at once if it is lost already), after the
    /// hooks added before it. It runs where the loss is recorded (the keepalive task, the
    /// owner watch, a release), possibly under the store's registry lock: it must neither
    /// block nor take a lock of the store's. What would otherwise be a task per lease waiting
    /// for the loss (a rig's workspace root, a host's session) is a hook.
    pub(crate) fn on_loss(&self, hook: impl FnOnce(LossReason) + Send + 'static) {
        self.on_loss.add(|| self.loss_reason(), hook);
    }

    /// Keeps the tip the acquisition read, for the journal's open.
    pub(crate) fn set_seen_tip(&self, seen: Option<KeyValue>) {
        *crate::sync::lock(&self.seen_tip) = Some(Box::new(seen));
    }

    /// The tip the acquisition read, once: the open that takes it fences at it.
    pub(crate) fn take_seen_tip(&self) -> Option<Option<KeyValue>> {
        crate::sync::lock(&self.seen_tip).take().map(|seen| *seen)
    }

    pub(crate) fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    pub(crate) fn is_valid(&self) -> bool {
        !self.lost_flag.load(Ordering::Acquire) && self.node.is_valid()
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.reason.get().copied()
    }

    pub(crate) fn lost(self: &Arc<Self>) -> Lost {
        Lost {
            state: self.clone(),
            waiting: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(valid_for: Duration) -> Arc<LeaseState> {
        let node = Arc::new(NodeLease::new(7, Instant::now() + valid_for));
        LeaseState::new(
            Uuid::nil(),
            Epoch(42),
            "ns/owners/x".into(),
            Uuid::nil(),
            node,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn validity_follows_the_node_lease_deadline() {
        let lease = state(Duration::from_secs(5));
        assert!(lease.is_valid());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            !lease.is_valid(),
            "invalid at the deadline, with no event at all"
        );
        lease
            .node
            .set_valid_until(Instant::now() + Duration::from_secs(1));
        assert!(lease.is_valid(), "a renewal extends it");
        lease.node.mark_lost(LossReason::Expired);
        assert!(!lease.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspend_longer_than_the_deadline_ends_validity_though_tokios_clock_stood_still() {
        let node = Arc::new(NodeLease::new(7, clock::now() + Duration::from_secs(5)));
        let lease = LeaseState::new(
            Uuid::nil(),
            Epoch(42),
            "ns/owners/x".into(),
            Uuid::nil(),
            node,
        );
        let before = Instant::now();
        clock::suspend(Duration::from_secs(4));
        assert!(lease.is_valid(), "4 s of the 5 s gone");
        clock::suspend(Duration::from_secs(2));
        assert_eq!(Instant::now(), before, "no monotonic time passed");
        assert!(
            !lease.is_valid(),
            "the machine was suspended past the deadline: etcd expired the lease meanwhile"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_loss_reason_wins_and_every_waiter_sees_it() {
        let lease = state(Duration::from_secs(5));
        let (a, b) = (lease.lost(), lease.lost());
        let early = tokio::spawn(a);
        assert!(lease.lose(LossReason::Overtaken));
        assert!(!lease.lose(LossReason::Revoked));
        assert!(!lease.is_valid());
        assert_eq!(early.await.unwrap(), LossReason::Overtaken);
        assert_eq!(b.await, LossReason::Overtaken);
        assert_eq!(
            lease.lost().await,
            LossReason::Overtaken,
            "late waiters resolve at once"
        );
        assert_eq!(lease.loss_reason(), Some(LossReason::Overtaken));
    }

    #[test]
    fn loss_hooks_run_once_in_order_and_at_once_once_lost() {
        let lease = state(Duration::from_secs(5));
        let ran = Arc::new(std::sync::Mutex::new(Vec::new()));
        for name in ["first", "second"] {
            let ran = ran.clone();
            lease.on_loss(move |reason| ran.lock().unwrap().push((name, reason)));
        }
        assert!(
            ran.lock().unwrap().is_empty(),
            "nothing runs before the loss"
        );
        assert!(lease.lose(LossReason::Overtaken));
        assert!(!lease.lose(LossReason::Expired));
        assert!(
            lease.release(),
            "a lost lease is released once all the same"
        );
        let ran_late = ran.clone();
        lease.on_loss(move |reason| ran_late.lock().unwrap().push(("late", reason)));
        assert_eq!(
            *ran.lock().unwrap(),
            [
                ("first", LossReason::Overtaken),
                ("second", LossReason::Overtaken),
                ("late", LossReason::Overtaken),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn release_is_idempotent_and_loses_the_lease_first() {
        let lease = state(Duration::from_secs(5));
        assert!(lease.release());
        assert!(!lease.is_valid());
        assert!(!lease.release());
        assert!(lease.released());
        assert_eq!(lease.lost().await, LossReason::Released);
    }
}
