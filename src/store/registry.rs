//! What a store knows about the sessions it holds, is acquiring, or stands by for; and how
//! owner-key changes seen by its watch apply to them. Pure state: the watch task feeds it.
//!
//! An event applies to a lease only if its revision is greater than the lease's epoch. Events
//! for a session whose acquisition is under way are kept until the acquisition ends, so an
//! event that arrives before the acquiring call has registered its lease still applies to it.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::lease::{Epoch, LeaseState, LossReason};

/// A change of one owner key, as the watch (or a snapshot read) saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerEvent {
    /// The key was written at `revision`; it was created at `create_revision`. `ours` carries
    /// the nonce when the value was written by this store.
    Put {
        revision: i64,
        create_revision: i64,
        ours: Option<Uuid>,
    },
    /// The key was deleted at `revision` (or is absent in a snapshot at `revision`).
    Deleted { revision: i64 },
}

impl OwnerEvent {
    fn revision(&self) -> i64 {
        match *self {
            OwnerEvent::Put { revision, .. } | OwnerEvent::Deleted { revision } => revision,
        }
    }
}

/// What an event means for a lease of `epoch` that `released` or not: `None` if nothing.
pub(crate) fn verdict(epoch: Epoch, released: bool, event: &OwnerEvent) -> Option<LossReason> {
    if event.revision() <= epoch.revision() {
        return None;
    }
    match *event {
        // A DELETE carries no cause: ours if we released, else someone else's.
        OwnerEvent::Deleted { .. } if released => Some(LossReason::Released),
        OwnerEvent::Deleted { .. } => Some(LossReason::Revoked),
        OwnerEvent::Put {
            create_revision, ..
        } if create_revision != epoch.revision() => Some(LossReason::Overtaken),
        OwnerEvent::Put { .. } => None,
    }
}

#[derive(Default)]
struct Entry {
    held: Option<Arc<LeaseState>>,
    acquiring: u32,
    /// Events seen while an acquisition was under way (boxed: rarely any, and an entry per
    /// hosted session).
    #[expect(
        clippy::box_collection,
        reason = "8 bytes in every entry instead of 24, for a list that is mostly absent"
    )]
    seen: Option<Box<Vec<OwnerEvent>>>,
    /// The standbys: a hosted session has one, kept in the entry itself.
    waiters: SmallVec<[Arc<Notify>; 1]>,
    /// The last event the watch showed is another store's put (a hint for standbys: the
    /// session is held elsewhere until a delete, so trying to acquire it is futile).
    held_elsewhere: bool,
    /// The nonce of a key of ours whose release is under way, until the watch sees it
    /// deleted: a late event of its creation is not an orphan's (the release deletes it).
    releasing: Option<Uuid>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.held.is_none()
            && self.acquiring == 0
            && self.waiters.is_empty()
            && self.releasing.is_none()
    }

    /// Whether a key of ours with `nonce` that no lease adopted is an orphan.
    fn orphaned(&self, nonce: Uuid) -> bool {
        self.releasing != Some(nonce)
    }
}

/// A key this store wrote that no handle adopted: to be deleted, guarded by its nonce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Orphan {
    pub(crate) session: Uuid,
    pub(crate) nonce: Uuid,
}

/// The sessions of one store.
#[derive(Default)]
pub(crate) struct Registry {
    entries: HashMap<Uuid, Entry>,
}

impl Registry {
    /// An acquisition of `session` starts (before its transaction is sent).
    pub(crate) fn begin_acquire(&mut self, session: Uuid) {
        self.entries.entry(session).or_default().acquiring += 1;
    }

    /// An acquisition of `session` ended, holding `lease` or not. Events seen meanwhile apply
    /// to the lease; keys of ours among them that no lease adopted are returned as orphans.
    pub(crate) fn end_acquire(
        &mut self,
        session: Uuid,
        lease: Option<&Arc<LeaseState>>,
    ) -> Vec<Orphan> {
        let Some(entry) = self.entries.get_mut(&session) else {
            return Vec::new();
        };
        entry.acquiring = entry.acquiring.saturating_sub(1);
        if let Some(lease) = lease {
            // Its node lease was lost before it could be registered (the fan-out to held
            // leases has run already): lose it the same way.
            if let Some(reason) = lease.node.loss_reason() {
                lease.lose(reason);
            }
            for event in entry.seen.iter().flat_map(|seen| seen.iter()) {
                if let Some(reason) = verdict(lease.epoch, lease.released(), event) {
                    lease.lose(reason);
                }
            }
            // Two epochs of one session: the newer proves the older owner key is gone, even if
            // the watch has not said so yet. The older may be the one ending now, when two
            // acquisitions of the session overlapped and the later one was registered first.
            match entry.held.as_ref().map(|held| held.epoch.cmp(&lease.epoch)) {
                Some(Ordering::Less) => {
                    if let Some(older) = entry.held.take() {
                        older.lose(LossReason::Revoked);
                    }
                }
                Some(Ordering::Greater) => {
                    lease.lose(LossReason::Overtaken);
                }
                Some(Ordering::Equal) | None => {}
            }
            if lease.loss_reason().is_none() {
                entry.held = Some(lease.clone());
            }
        }
        let mut orphans = Vec::new();
        if entry.acquiring == 0 {
            let adopted = |nonce: Uuid| {
                lease.is_some_and(|lease| lease.nonce == nonce)
                    || entry.held.as_ref().is_some_and(|held| held.nonce == nonce)
            };
            // Taken, not drained: a held session keeps no event buffer.
            for event in entry.seen.take().map_or_else(Vec::new, |seen| *seen) {
                if let OwnerEvent::Put {
                    ours: Some(nonce), ..
                } = event
                    && !adopted(nonce)
                    && Some(nonce) != entry.releasing
                    && !orphans.iter().any(|o: &Orphan| o.nonce == nonce)
                {
                    orphans.push(Orphan { session, nonce });
                }
            }
        }
        if entry.is_empty() {
            self.entries.remove(&session);
        }
        orphans
    }

    /// Applies one owner-key change. Returns a key of ours that nothing adopted, if it is one.
    pub(crate) fn observe(&mut self, session: Uuid, event: OwnerEvent) -> Option<Orphan> {
        let Some(entry) = self.entries.get_mut(&session) else {
            // Nothing here cares; but a key of ours nobody holds or acquires is an orphan.
            return match event {
                OwnerEvent::Put {
                    ours: Some(nonce), ..
                } => Some(Orphan { session, nonce }),
                _ => None,
            };
        };
        if let Some(held) = &entry.held
            && let Some(reason) = verdict(held.epoch, held.released(), &event)
        {
            held.lose(reason);
            entry.held = None;
        }
        entry.held_elsewhere = matches!(event, OwnerEvent::Put { ours: None, .. });
        if matches!(event, OwnerEvent::Deleted { .. }) {
            // The key being released (if any) is gone.
            entry.releasing = None;
            for waiter in &entry.waiters {
                waiter.notify_one();
            }
        }
        let orphan = match event {
            OwnerEvent::Put {
                ours: Some(nonce),
                create_revision,
                ..
            } if entry.acquiring == 0
                && entry.orphaned(nonce)
                && entry
                    .held
                    .as_ref()
                    .is_none_or(|held| held.epoch.revision() != create_revision) =>
            {
                Some(Orphan { session, nonce })
            }
            _ => None,
        };
        if entry.acquiring > 0 {
            entry.seen.get_or_insert_with(Box::default).push(event);
        }
        if entry.is_empty() {
            self.entries.remove(&session);
        }
        orphan
    }

    /// Registers a standby for `session`; it is notified when the owner key is deleted.
    pub(crate) fn add_waiter(&mut self, session: Uuid, waiter: Arc<Notify>) {
        self.entries
            .entry(session)
            .or_default()
            .waiters
            .push(waiter);
    }

    pub(crate) fn remove_waiter(&mut self, session: Uuid, waiter: &Arc<Notify>) {
        if let Some(entry) = self.entries.get_mut(&session) {
            entry.waiters.retain(|w| !Arc::ptr_eq(w, waiter));
            if entry.is_empty() {
                self.entries.remove(&session);
            }
        }
    }

    /// Whether the last owner-key event the watch showed for `session` is another store's
    /// put (only known while something here cares about the session).
    pub(crate) fn held_elsewhere(&self, session: Uuid) -> bool {
        self.entries
            .get(&session)
            .is_some_and(|entry| entry.held_elsewhere)
    }

    /// Wakes the standbys of `session` (its move to this store became ready: the session may
    /// be free already, with no delete to come that would wake them).
    pub(crate) fn notify_waiters(&self, session: Uuid) {
        for waiter in self.entries.get(&session).iter().flat_map(|e| &e.waiters) {
            waiter.notify_one();
        }
    }

    /// Wakes every standby (after a watch restart: events may have been missed, so no session
    /// is known to be held elsewhere until the next event).
    pub(crate) fn notify_all_waiters(&mut self) {
        for entry in self.entries.values_mut() {
            entry.held_elsewhere = false;
            for waiter in &entry.waiters {
                waiter.notify_one();
            }
        }
    }

    /// Forgets a released lease.
    pub(crate) fn forget(&mut self, lease: &LeaseState) {
        if let Some(entry) = self.entries.get_mut(&lease.session) {
            if entry
                .held
                .as_ref()
                .is_some_and(|held| held.epoch == lease.epoch)
            {
                entry.held = None;
                // Its key goes by this release: until the watch sees it deleted, a late event
                // of its creation is not an orphan's.
                entry.releasing = Some(lease.nonce);
            }
            if entry.is_empty() {
                self.entries.remove(&lease.session);
            }
        }
    }

    /// Loses every held lease attached to node lease `node_id` (or all, for `None`).
    pub(crate) fn lose_all(&mut self, node_id: Option<i64>, reason: LossReason) {
        self.entries.retain(|_, entry| {
            if let Some(held) = &entry.held
                && node_id.is_none_or(|id| held.node.id == id)
            {
                held.lose(reason);
                entry.held = None;
            }
            !entry.is_empty()
        });
    }

    /// The sessions of interest for a snapshot: held, acquiring, or awaited.
    pub(crate) fn sessions(&self) -> Vec<Uuid> {
        self.entries.keys().copied().collect()
    }

    /// The number of leases held.
    pub(crate) fn held(&self) -> usize {
        self.entries.values().filter(|e| e.held.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::{Duration, Instant};

    use super::*;
    use crate::lease::NodeLease;

    fn lease(session: Uuid, epoch: u64, nonce: Uuid) -> Arc<LeaseState> {
        let node = Arc::new(NodeLease::new(1, Instant::now() + Duration::from_secs(60)));
        LeaseState::new(session, Epoch(epoch), "k".into(), nonce, node)
    }

    const fn put(revision: i64, create_revision: i64) -> OwnerEvent {
        OwnerEvent::Put {
            revision,
            create_revision,
            ours: None,
        }
    }

    /// A release forgets the lease before its delete; the watch may see the key's creation
    /// only after that. It is the released key, not an orphan to delete once more.
    #[tokio::test(start_paused = true)]
    async fn a_late_event_of_a_released_key_is_not_an_orphan() {
        let (session, nonce) = (Uuid::new_v4(), Uuid::new_v4());
        let mut registry = Registry::default();
        let held = lease(session, 10, nonce);
        registry.begin_acquire(session);
        assert!(registry.end_acquire(session, Some(&held)).is_empty());
        held.release();
        registry.forget(&held);
        assert_eq!(registry.held(), 0);

        let created = OwnerEvent::Put {
            revision: 10,
            create_revision: 10,
            ours: Some(nonce),
        };
        assert_eq!(registry.observe(session, created), None, "the released key");
        // A key of ours with another nonce is still an orphan.
        let other = Uuid::new_v4();
        let orphan = OwnerEvent::Put {
            revision: 12,
            create_revision: 12,
            ours: Some(other),
        };
        assert_eq!(
            registry.observe(session, orphan),
            Some(Orphan {
                session,
                nonce: other
            })
        );
        // Once the watch sees the delete, nothing is kept for the session.
        assert_eq!(
            registry.observe(session, OwnerEvent::Deleted { revision: 11 }),
            None
        );
        assert!(registry.sessions().is_empty());
        // And the same key seen again is news: an orphan.
        assert!(registry.observe(session, created).is_some());
    }

    #[test]
    fn only_events_after_the_epoch_apply() {
        let e = Epoch(10);
        assert_eq!(verdict(e, false, &put(10, 10)), None, "our own creation");
        assert_eq!(
            verdict(e, false, &OwnerEvent::Deleted { revision: 9 }),
            None
        );
        assert_eq!(
            verdict(e, false, &OwnerEvent::Deleted { revision: 11 }),
            Some(LossReason::Revoked)
        );
        assert_eq!(
            verdict(e, true, &OwnerEvent::Deleted { revision: 11 }),
            Some(LossReason::Released)
        );
        assert_eq!(verdict(e, false, &put(12, 12)), Some(LossReason::Overtaken));
        assert_eq!(
            verdict(e, false, &put(12, 10)),
            None,
            "a rewrite of our key"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_before_registration_still_applies() {
        let (session, nonce) = (Uuid::new_v4(), Uuid::new_v4());
        let mut registry = Registry::default();
        registry.begin_acquire(session);
        // The watch delivers our creation and a delete before the acquiring call returns.
        let ours = OwnerEvent::Put {
            revision: 5,
            create_revision: 5,
            ours: Some(nonce),
        };
        assert_eq!(registry.observe(session, ours), None);
        assert_eq!(
            registry.observe(session, OwnerEvent::Deleted { revision: 6 }),
            None
        );
        let held = lease(session, 5, nonce);
        assert_eq!(registry.end_acquire(session, Some(&held)), vec![]);
        assert_eq!(held.loss_reason(), Some(LossReason::Revoked));
        assert_eq!(registry.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_acquisition_of_the_same_session_loses_the_older_lease() {
        let session = Uuid::new_v4();
        let mut registry = Registry::default();
        let older = lease(session, 5, Uuid::new_v4());
        registry.begin_acquire(session);
        registry.end_acquire(session, Some(&older));
        // The older key was deleted at 7 (not yet seen); the session is acquired again at 9.
        let newer = lease(session, 9, Uuid::new_v4());
        registry.begin_acquire(session);
        registry.end_acquire(session, Some(&newer));
        assert_eq!(older.loss_reason(), Some(LossReason::Revoked));
        assert_eq!(newer.loss_reason(), None);
        assert_eq!(registry.held(), 1);
    }

    /// Two acquisitions of one session overlap: the older key (5) is deleted, the later
    /// acquisition creates 9 and is registered first. The older one, ending last, is
    /// overtaken and the newer stays held, whether or not the watch has seen the newer key's
    /// creation meanwhile; and that key, if seen, is not taken for an orphan.
    #[tokio::test(start_paused = true)]
    async fn an_older_acquisition_ending_after_a_newer_one_is_overtaken() {
        for seen in [false, true] {
            let session = Uuid::new_v4();
            let mut registry = Registry::default();
            let (older, newer) = (
                lease(session, 5, Uuid::new_v4()),
                lease(session, 9, Uuid::new_v4()),
            );
            registry.begin_acquire(session);
            registry.begin_acquire(session);
            if seen {
                let creation = OwnerEvent::Put {
                    revision: 9,
                    create_revision: 9,
                    ours: Some(newer.nonce),
                };
                assert_eq!(registry.observe(session, creation), None);
            }
            assert_eq!(registry.end_acquire(session, Some(&newer)), vec![]);
            assert_eq!(
                registry.end_acquire(session, Some(&older)),
                vec![],
                "seen {seen}"
            );
            assert_eq!(older.loss_reason(), Some(LossReason::Overtaken));
            assert_eq!(newer.loss_reason(), None, "seen {seen}");
            assert_eq!(registry.held(), 1);
            // The watch's later events still reach the newer lease.
            registry.observe(session, OwnerEvent::Deleted { revision: 12 });
            assert_eq!(
                newer.loss_reason(),
                Some(LossReason::Revoked),
                "seen {seen}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquisition_registered_after_its_node_lease_was_lost_is_lost() {
        let session = Uuid::new_v4();
        let mut registry = Registry::default();
        let late = lease(session, 5, Uuid::new_v4());
        registry.begin_acquire(session);
        late.node.mark_lost(LossReason::StoreClosed);
        registry.lose_all(None, LossReason::StoreClosed);
        registry.end_acquire(session, Some(&late));
        assert_eq!(late.loss_reason(), Some(LossReason::StoreClosed));
        assert_eq!(registry.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_lease_is_lost_when_overtaken_and_forgotten() {
        let session = Uuid::new_v4();
        let mut registry = Registry::default();
        registry.begin_acquire(session);
        let held = lease(session, 5, Uuid::new_v4());
        registry.end_acquire(session, Some(&held));
        assert_eq!(registry.held(), 1);
        assert_eq!(registry.observe(session, put(9, 9)), None);
        assert_eq!(held.loss_reason(), Some(LossReason::Overtaken));
        assert_eq!(registry.held(), 0);
        assert!(registry.sessions().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_of_ours_that_nothing_adopts_is_an_orphan() {
        let (session, nonce) = (Uuid::new_v4(), Uuid::new_v4());
        let mut registry = Registry::default();
        let ours = OwnerEvent::Put {
            revision: 5,
            create_revision: 5,
            ours: Some(nonce),
        };
        // Seen during an acquisition that then failed (its outcome stayed unknown).
        registry.begin_acquire(session);
        registry.observe(session, ours);
        assert_eq!(
            registry.end_acquire(session, None),
            vec![Orphan { session, nonce }]
        );
        // Seen after any acquisition ended (a late commit).
        assert_eq!(
            registry.observe(session, ours),
            Some(Orphan { session, nonce })
        );
        // Not an orphan while a lease holds it.
        registry.begin_acquire(session);
        let held = lease(session, 5, nonce);
        registry.end_acquire(session, Some(&held));
        assert_eq!(registry.observe(session, ours), None);
    }

    #[tokio::test(start_paused = true)]
    async fn standbys_wake_on_delete() {
        let session = Uuid::new_v4();
        let mut registry = Registry::default();
        let waiter = Arc::new(Notify::new());
        registry.add_waiter(session, waiter.clone());
        registry.observe(session, put(3, 3));
        registry.observe(session, OwnerEvent::Deleted { revision: 4 });
        tokio::time::timeout(Duration::from_millis(1), waiter.notified())
            .await
            .expect("notified");
        registry.remove_waiter(session, &waiter);
        assert!(registry.sessions().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn losing_the_node_lease_loses_its_leases_only() {
        let mut registry = Registry::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let held_a = lease(a, 5, Uuid::new_v4());
        let other_node = Arc::new(NodeLease::new(2, Instant::now() + Duration::from_secs(60)));
        let held_b = LeaseState::new(b, Epoch(6), "k".into(), Uuid::new_v4(), other_node);
        for (session, held) in [(a, &held_a), (b, &held_b)] {
            registry.begin_acquire(session);
            registry.end_acquire(session, Some(held));
        }
        registry.lose_all(Some(1), LossReason::Expired);
        assert_eq!(held_a.loss_reason(), Some(LossReason::Expired));
        assert_eq!(held_b.loss_reason(), None);
        registry.lose_all(None, LossReason::StoreClosed);
        assert_eq!(held_b.loss_reason(), Some(LossReason::StoreClosed));
    }

    fn ours(revision: i64, nonce: Uuid) -> OwnerEvent {
        OwnerEvent::Put {
            revision,
            create_revision: revision,
            ours: Some(nonce),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_unadopted_key_of_ours_seen_while_acquiring_is_an_orphan_once() {
        let session = Uuid::new_v4();
        let (first, second) = (Uuid::new_v4(), Uuid::new_v4());
        let mut registry = Registry::default();
        registry.begin_acquire(session);
        // Two keys of ours came and went while the acquisition was under way, the first seen
        // twice; the acquisition ends without a lease.
        registry.observe(session, ours(5, first));
        registry.observe(session, ours(5, first));
        registry.observe(session, OwnerEvent::Deleted { revision: 6 });
        registry.observe(session, ours(7, second));
        assert_eq!(
            registry.end_acquire(session, None),
            vec![
                Orphan {
                    session,
                    nonce: first
                },
                Orphan {
                    session,
                    nonce: second
                }
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_of_ours_seen_by_a_standby_is_an_orphan_and_not_kept() {
        let (session, nonce) = (Uuid::new_v4(), Uuid::new_v4());
        let mut registry = Registry::default();
        // Only a standby waits on the session: nothing acquires or holds it.
        registry.add_waiter(session, Arc::new(Notify::new()));
        assert_eq!(
            registry.observe(session, ours(5, nonce)),
            Some(Orphan { session, nonce })
        );
        assert!(
            registry.entries[&session].seen.is_none(),
            "events are kept only for an acquisition under way"
        );
    }
}
