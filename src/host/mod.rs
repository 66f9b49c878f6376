//! [`SessionHost`]: keeps a set of sessions owned and worked on, across a cluster of hosts.
//!
//! A host is given the sessions it should host (a fixed set, changed later with
//! [`add`](SessionHost::add) and [`remove`](SessionHost::remove)). For each it runs one task:
//!
//! 1. wait for a free slot (see *Balance*);
//! 2. acquire the session; if it is held elsewhere, stand by (woken by the owner key's
//!    delete, with the store's slow re-check as a backstop) and go to 1 (at most 512 sessions
//!    of a host acquire and open at once: the store sends a window of requests at a time
//!    anyway, and each costs a few KiB while it runs);
//! 3. open a [`Rig`] (lease, workspace root, fenced journal) and run the user's
//!    `work(rig, token)` (polled in the session's task: a work that panics counts as one that
//!    returned);
//! 4. when the lease is lost, the journal breaks ([`Journal::broken`]: fenced, or an append
//!    whose outcome could not be settled), the user's work returns, the host sheds the
//!    session, or the session is removed: cancel `token`, give the work
//!    [`HostOptions::stop_grace`] to return (then drop it, as an abort would), shut the rig
//!    down in order (last append, workspace root, lease) and go to 1.
//!
//! So no session stays on a state no event will change: a broken journal is given up and
//! opened again under a new lease, by this host or another.
//!
//! # A session that cannot be opened
//!
//! When the rig cannot be opened (its workspace root is held, or the journal cannot be fenced:
//! a tip behind its last record, a tip that does not decode, a sequence at its end), the lease
//! is released and the session is tried again after a pause: [`HostOptions::retry_pause`] at
//! first, doubling with each failure in a row, jittered (up to as much again), capped at
//! [`HostOptions::max_retry_pause`], and back to the start once it opens. At the third
//! failure in a row the session is *quarantined*: a [`HostEvent::Quarantined`], a WARN line
//! naming the session and the failure, and the store's `leasehold_sessions_quarantined` gauge
//! (see [`metrics`](crate::metrics)) until it opens or is no longer hosted here. So a journal
//! that no owner can open costs the cluster a few acquisitions a minute, not two a second
//! (each with its writes, and a release that wakes the other hosts); `leasehold check` names
//! what is wrong with it.
//!
//! # Balance
//!
//! Every host keeps a key `{ns}/hosts/{store}` attached to its node lease, holding its
//! [`HostOptions::max_sessions`], so the live hosts are visible to all and a dead host's key
//! goes with its lease. Every tick (TTL/3, at most 1 s) a host lists them and computes every
//! host's share the same way: as even as the maxima allow (shares below a maximum differ by at
//! most one, the earlier hosts in key order taking the extra ones), adding up to the wanted
//! sessions (or to the sum of the maxima). A host over its share sheds the difference, in
//! order, so a host that joins gets its share without anyone restarting, a capped host's
//! remainder goes to the others, and a host that leaves (its key is deleted first) hands its
//! sessions over at once. A session takes a slot of the share from its acquisition on, so
//! acquisitions in flight and rigs being opened count against the share too, and a host at its
//! share does not take a session that another host just shed. A standby holds no slot: a
//! session found held elsewhere gives its slot back before it stands by (as does one whose
//! acquisition or open failed, for its pause), so standbys never keep a host from owning its
//! share. A session freed while a host is full makes it list the hosts again at once.
//!
//! A host's key carries as its maximum no more than the sessions it hosts, so a host given
//! fewer sessions than the others (or whose sessions were [removed](SessionHost::remove)) is not
//! given a share it cannot fill: a host that removed all of its sessions counts as a maximum of
//! 0, and the others own them.
//!
//! A session on its way out (shed, moved, stopped or lost, its shutdown under way) keeps its
//! slot until the shutdown ends, and counts as shed already: a tick that comes meanwhile sheds
//! no more, so a host over its share sheds exactly the difference once, and a rolling restart
//! moves each session at most once per change (`cli/tests/cli_node_restart.rs`: 900
//! acquisitions over three restarts of three nodes and 300 sessions, the fewest possible).
//!
//! # Load
//!
//! Sessions are not alike: a few busy ones may cost more than all the idle ones together. Each
//! owned session has a *load*: what its work reports with [`Rig::set_load`] (in units of the
//! application's choosing, the same for every session of the namespace), or, until it reports
//! one, its appends per second. At every balance tick the host samples each session's load and
//! smooths it (an average over time whose weights halve every [`LoadBalance::half_life`], 30 s
//! by default: a burst of a few seconds barely moves it, a session that stays busy shows within
//! a minute; each interval counts by its length, so the first milliseconds after an acquisition
//! count for as little as they last). Its own load is the sum. It publishes that in `{ns}/loads/{store}` (on its node
//! lease), with the loads of its hottest sessions ([`LoadBalance::published_sessions`], 16), at most once per
//! [`LoadBalance::publish_every`] (5 s), and only when it changed: at most 12 etcd writes a
//! minute per host, of under 1 KiB each. [`SessionHost::load`] and
//! [`SessionHost::session_loads`] show it here, [`Admin::hosts`](crate::Admin::hosts) (`leasehold
//! hosts`) for every host and [`Admin::owners`](crate::Admin::owners) (`leasehold owners`) for
//! each host's hottest sessions.
//!
//! The count shares above stay as they are; load is balanced on top of them, by moves. Each
//! host's *target* is its weight's share of the hosts' total load. At each tick a host whose
//! load is over its target, while it or another host is off its target by more than
//! [`LoadBalance::band`] (10 %), asks for a move ([`Admin::move_session`](crate::Admin::move_session)'s
//! protocol, asked by the holder itself) of one of its sessions to the host furthest below its
//! target: the session whose move best closes both gaps, the coldest of those that close as
//! much. A session whose load exceeds both gaps together is never moved (a session heavier
//! than a host's share stays where it is: moving it would only move the excess; its host
//! moves its lighter hot sessions off instead). The target
//! takes the session over its share of the count and sheds one of its own, chosen among those
//! out of their cooldown, the coldest first; the host the session left, now under its share,
//! takes it. So a move by load is a swap, two graceful handovers, each fenced as always, and
//! the counts stay as they were. The decision is a pure function of the published loads
//! (`load.rs`, tested on tables and on a simulated fleet).
//!
//! Moves are bounded: at most [`LoadBalance::budget`] (2) per host per
//! [`LoadBalance::budget_interval`] (10 s), and a session acquired less than
//! [`LoadBalance::cooldown`] (2 min) ago is not moved by load and is the last a host over its
//! share of the count sheds. A move stays in the mover's view of its target's load until the
//! target publishes again, and out of its view of its own from the ask on, though it holds the
//! session until the handover: a host plans no move for load it is already moving. Where no session reports a load and all append alike (or none
//! appends), every host is within its band and nothing moves: the count alone places.
//! `tests/host_load.rs` measures it: three hosts, 300 sessions placed by count, then 30 of them
//! 20 times as heavy as the rest (uneven across the hosts); with a 1 s half-life and publication,
//! every host is within its band after 8.5 to 14 s, in 10 to 22 moves, each session moved at most
//! once per cooldown.
//!
//! # Joining
//!
//! A new host first *settles*: for [`HostOptions::settle`] (default twice the store's TTL) from
//! its first confirmed put, its key is `{ns}/joining/{store}` instead (the same value, attached
//! to the node lease), and it takes nothing. The settled hosts do not count it, so none sheds a
//! session to it: a host that joins and leaves again within its settle period moves nothing.
//! Once settled, it writes its key under `{ns}/hosts/` and deletes the joining key in one
//! transaction; the others count it from their next tick and shed its share to it.
//!
//! The first share a host takes once settled counts, besides the settled hosts, every host it
//! sees still settling (until each settles or goes), so hosts started together, or within a
//! settle period of each other, each take their own share from the start instead of the first
//! taking everything and shedding it again. A host that leaves is counted out at once, settled
//! or not. Hosts of earlier releases do not read `{ns}/joining/` and count a new host from its
//! settle's end, as these do.
//!
//! # Weights
//!
//! A host's [`HostOptions::weight`] (default 1) is written into its key (host value version
//! 3, only when it is not 1), and shares are proportional to the weights: `left · weight /
//! Σ weights`, rounded down, the earlier hosts taking one more each until all are given, a
//! host whose maximum is below that taking its maximum. Weight 0 takes nothing.
//!
//! # Fixed sets that differ
//!
//! Every host counts in the shares of every set, so hosts given different fixed sets can leave
//! sessions unowned (those only some hosts host, while they fill their share with others). A
//! host with a fixed set writes a digest of it to `{ns}/sets/{store}` (on its node lease) and
//! compares the others' at each tick: each host whose set differs is reported once per change,
//! with a WARN line and a [`HostEvent::SetDiffers`]. Hosts that follow the registry agree by
//! construction and write none.
//!
//! # Moves
//!
//! A host reads the moves under way ([`Admin::move_session`](crate::Admin::move_session)) at
//! each tick: as a move's target it says it stands by (or withdraws the move if it cannot take
//! the session), then takes the session, over its share if need be, as soon as its holder
//! releases it; as the holder it gives the session up in order ([`GiveUp::Moved`]) once the
//! target stands by. A session acquired through a move is the last this host sheds.
//!
//! # Draining
//!
//! [`drain`](SessionHost::drain) empties a host without stopping it: the host rewrites its key
//! with a maximum of 0, and once a reply confirms it, sheds every session in order. The other
//! hosts, listing the keys, leave it out of the shares (a maximum of 0 takes none), so their
//! shares grow as its sessions are freed, and their standbys take each after one watch event.
//! While draining the host takes nothing; [`undrain`](SessionHost::undrain) writes its maximum
//! back, and its share returns as the others shed. Hosts of earlier releases read the drain the
//! same way (it is only a maximum), and `Admin::hosts` shows it (`draining`).
//!
//! # Leaving
//!
//! A host leaves when it is shut down or dropped (its store may live on: the key would
//! otherwise outlive the host with the node lease, and its share would never be owned). One
//! task, the balance loop, both writes the key and deletes it, one after the other:
//!
//! - the put is `put({ns}/hosts/{store}, value, lease = node lease)`, the value carrying a
//!   nonce of this host. It is re-sent until a reply settles it, the node lease stops being
//!   valid (the key then goes with the lease) or the store closes (which revokes the lease);
//!   the host's leaving does not cut it short, so no put is still on its way when the delete
//!   is sent;
//! - the delete is `if value(key) == this host's value then delete(key)`, tried for three
//!   write attempts ([`WritePolicy::attempt_timeout`](crate::WritePolicy::attempt_timeout));
//!   one not confirmed by then is handed to the store's background deletes, which re-send it
//!   until it is confirmed, the node lease is lost (its end deletes the key) or the store
//!   closes.
//!
//! Its set key (see *Fixed sets that differ*) goes the same way, and so do the moves to it that it
//! said it was ready for ([`Admin::move_session`](crate::Admin::move_session)).
//!
//! [`shutdown`](SessionHost::shutdown) waits for the delete (at most those three attempts)
//! before it shuts the sessions down; dropping the host signals the same and waits for
//! nothing.
//!
//! [`Journal::broken`]: crate::Journal::broken

mod balance;
mod http;
mod load;
mod moves;
mod options;
mod registry;
mod route;
mod session;
mod sets;
mod settle;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::sync::{Notify, broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::lease::Epoch;
use crate::rig::Rig;
use crate::store::HostValue;
use crate::store::Store;
use balance::balance;
pub use http::{FORWARDED_HEADER, HttpRouter, Routed};
use options::Work;
pub use options::{GiveUp, HostEvent, HostOptions, LoadBalance, MAX_PUBLISHED_SESSIONS};
pub use route::{NotOwner, Route};
use session::host_session;

/// How many [`HostEvent`]s a receiver of [`SessionHost::events`] may fall behind by before it
/// misses some.
pub const HOST_EVENTS_BUFFERED: usize = 1024;

/// The events of a [`SessionHost`], from when [`events`](SessionHost::events) was called: a
/// `tokio` broadcast receiver holding up to [`HOST_EVENTS_BUFFERED`] events. A receiver that
/// falls further behind gets `Err(RecvError::Lagged(n))` once (it missed the `n` oldest) and
/// then the events after them; `recv` returns `Err(RecvError::Closed)` only once the host is
/// gone. So a loop `while let Ok(event) = events.recv().await` stops at the first lag: match
/// `Lagged` and go on (and re-read [`held`](SessionHost::held) for what was missed).
pub type HostEvents = broadcast::Receiver<HostEvent>;

/// Keeps sessions owned and worked on; see the [module docs](self).
///
/// Dropping the host stops its tasks in the background (its key deleted, each session shut
/// down in order); [`shutdown`](Self::shutdown) does the same and waits for it.
pub struct SessionHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SessionHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHost")
            .field("node", &self.inner.store.node())
            .field("held", &self.held_count())
            .field("cap", &*self.inner.cap.borrow())
            .finish()
    }
}

struct Inner {
    store: Arc<Store>,
    options: HostOptions,
    work: Work,
    /// The wanted sessions, each with the token that stops its task.
    wanted: Mutex<HashMap<Uuid, CancellationToken>>,
    /// The digest of the wanted sessions (see `sets.rs`), kept with them.
    set_digest: std::sync::atomic::AtomicU64,
    /// The owned sessions, each with its rig and the token that sheds it.
    owned: Mutex<HashMap<Uuid, Owned>>,
    /// Sessions held, being acquired or being opened (a standby gives its slot back): what
    /// the cap bounds.
    slots: AtomicUsize,
    /// The sessions acquiring and opening now take one each (bounded: see `session.rs`).
    opening: tokio::sync::Semaphore,
    /// The sessions shutting down now take one each (bounded the same way).
    closing: tokio::sync::Semaphore,
    /// The most sessions this host may hold now.
    cap: watch::Sender<usize>,
    /// Bumped whenever a slot frees up (what `drain` waits for).
    freed: watch::Sender<()>,
    /// Wakes one session waiting for a slot whenever a slot frees up.
    slot_freed: Notify,
    /// Asks the balance loop to count the live hosts now (a session was freed while this
    /// host had no slot for it: maybe a host left).
    recount: Notify,
    /// Tells the balance loop that the wanted sessions changed: it computes the shares again
    /// from the hosts it last read, with no request.
    resized: Notify,
    events: broadcast::Sender<HostEvent>,
    host_key: String,
    /// `{ns}/joining/{store}`: where this host registers while it settles.
    joining_key: String,
    /// What this host writes into its key: unique to this host (it carries a nonce), so the
    /// leave's delete, guarded by it, deletes this host's registration and no other. While
    /// draining, its maximum is written as 0.
    host_value: HostValue,
    /// The moves to this host it said it is ready for, as the last balance tick read them.
    moves: Mutex<HashMap<Uuid, moves::MoveIn>>,
    /// The sessions hosted only because the registry has them (not given to `start` or
    /// `add`): acquired only while the registry has them (`Store::acquire_registered`).
    registered: Mutex<std::collections::HashSet<Uuid>>,
    /// The sessions being moved to other hosts, as the last balance tick read them: a shed
    /// leaves them to their move.
    moving_out: Mutex<std::collections::HashSet<Uuid>>,
    /// Set by [`SessionHost::drain`], cleared by [`SessionHost::undrain`].
    draining: std::sync::atomic::AtomicBool,
    /// This host's load (the sum of its sessions' at the last sample) and its target (its
    /// weight's share of the hosts' total, as last computed; NaN when none is), as `f64` bits.
    load: std::sync::atomic::AtomicU64,
    load_target: std::sync::atomic::AtomicU64,
    /// Logs the first session this host takes, once.
    first_taken: std::sync::Once,
    /// Whether a drain is asked for through etcd ([`Admin::drain`](crate::Admin::drain)), as
    /// the last balance tick read it.
    drain_asked: std::sync::atomic::AtomicBool,
    /// Cancelled when the host starts leaving: the balance loop registers no more and deletes
    /// the host's key.
    leaving: CancellationToken,
    /// Cancelled once the balance loop has left: the key's delete is confirmed, or it goes on
    /// in the background.
    left: CancellationToken,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

/// An owned session: its rig, and its work's token, which gives it up once cancelled.
struct Owned {
    rig: Arc<Rig>,
    token: CancellationToken,
    /// Set before `token` is cancelled when the session is shed.
    shed: std::sync::atomic::AtomicBool,
    /// Set before `shed` when the session is given up to a move's target.
    moved_to: std::sync::OnceLock<Uuid>,
    /// Acquired through a move: shed only once no other session is left to shed.
    moved_here: bool,
    /// When this host acquired it (its cooldown runs from then).
    since: tokio::time::Instant,
    /// Its load, sampled at every balance tick.
    meter: Mutex<load::Meter>,
}

impl Owned {
    fn is_shed(&self) -> bool {
        self.shed.load(Ordering::Acquire)
    }

    /// Gives the session up to another host (to `target`, for a move).
    fn shed(&self, target: Option<Uuid>) {
        if let Some(target) = target {
            let _ = self.moved_to.set(target);
        }
        self.shed.store(true, Ordering::Release);
        self.token.cancel();
    }
}

impl Inner {
    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire) || self.drain_asked.load(Ordering::Acquire)
    }
}

/// How long a leave's delete (or a write of a move, in the balance loop) is tried in the
/// foreground: three write attempts (saturating: a huge attempt timeout means no bound).
fn leave_bound(policy: &crate::etcd::WritePolicy) -> Duration {
    policy.attempt_timeout.saturating_mul(3)
}

use crate::sync::lock;

impl SessionHost {
    /// Starts hosting `sessions` on `store`, running `work` for each session it owns.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Store, StoreOptions};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Arc::new(Store::connect(StoreOptions::new(["http://127.0.0.1:2379"])).await?);
    /// // The same sessions on every host: each host owns its share of them.
    /// let sessions = (1..=30).map(leasehold::Uuid::from_u128);
    /// let work = |rig: Arc<Rig>, stop: CancellationToken| async move {
    ///     // Until the host gives the session up; a broken journal makes it do so.
    ///     while !stop.is_cancelled() {
    ///         let _ = rig.journal().append(b"tick").await;
    ///         tokio::time::sleep(Duration::from_secs(1)).await;
    ///     }
    /// };
    /// let host = SessionHost::start(store.clone(), HostOptions::default(), sessions, work);
    /// tokio::signal::ctrl_c().await?;
    /// // Hands every session over in order; the store stays open through it.
    /// host.shutdown().await;
    /// store.close().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn start<F, Fut>(
        store: Arc<Store>,
        options: HostOptions,
        sessions: impl IntoIterator<Item = Uuid>,
        work: F,
    ) -> Self
    where
        F: Fn(Arc<Rig>, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let host_key = store.namespace().host_key(store.shared().id);
        let joining_key = store.namespace().joining_key(store.shared().id);
        let host_value = HostValue {
            max: options.max_sessions,
            weight: options.weight,
            nonce: Uuid::now_v7(),
            node: store.node().to_owned(),
            advertise: store.advertise().map(str::to_owned),
            metadata: store.shared().metadata.clone(),
        };
        let inner = Arc::new(Inner {
            store,
            options,
            work: Arc::new(move |rig, token| work(rig, token).boxed()),
            wanted: Mutex::new(HashMap::new()),
            set_digest: std::sync::atomic::AtomicU64::new(0),
            owned: Mutex::new(HashMap::new()),
            slots: AtomicUsize::new(0),
            opening: tokio::sync::Semaphore::new(session::OPENING_AT_ONCE),
            closing: tokio::sync::Semaphore::new(session::OPENING_AT_ONCE),
            // Nothing is taken before the first count of live hosts.
            cap: watch::Sender::new(0),
            freed: watch::Sender::new(()),
            slot_freed: Notify::new(),
            recount: Notify::new(),
            resized: Notify::new(),
            events: broadcast::Sender::new(HOST_EVENTS_BUFFERED),
            host_key,
            joining_key,
            host_value,
            moves: Mutex::new(HashMap::new()),
            moving_out: Mutex::new(std::collections::HashSet::new()),
            registered: Mutex::new(std::collections::HashSet::new()),
            draining: std::sync::atomic::AtomicBool::new(false),
            first_taken: std::sync::Once::new(),
            load: std::sync::atomic::AtomicU64::new(0f64.to_bits()),
            load_target: std::sync::atomic::AtomicU64::new(f64::NAN.to_bits()),
            drain_asked: std::sync::atomic::AtomicBool::new(false),
            leaving: CancellationToken::new(),
            left: CancellationToken::new(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let host = Self { inner };
        for session in sessions {
            host.add(session);
        }
        // Its key's first value counts the sessions it was started with.
        host.inner.tasks.spawn(balance(host.inner.clone()));
        if host.inner.options.registry {
            host.inner.tasks.spawn(registry::follow(host.inner.clone()));
        }
        host
    }

    /// Hosts `session` too (nothing happens if it is hosted already).
    pub fn add(&self, session: Uuid) {
        // Hosted for itself now, whatever the registry says.
        lock(&self.inner.registered).remove(&session);
        self.inner.add(session);
    }

    /// Stops hosting `session`: if it is owned, its rig is shut down in order. Only this host
    /// stops: the others that host it take it (this host's key counts no more sessions than
    /// it hosts, so their shares grow to cover it).
    pub fn remove(&self, session: Uuid) {
        self.inner.remove(session);
    }

    /// Whether this host hosts `session`: one of its fixed sessions, one [`add`](Self::add)ed,
    /// or, for a host of the registry, one registered as of the last registry event it saw.
    pub fn hosts(&self, session: Uuid) -> bool {
        lock(&self.inner.wanted).contains_key(&session)
    }

    /// The sessions this host owns now, each with its lease's epoch, in no order.
    pub fn held(&self) -> Vec<(Uuid, Epoch)> {
        lock(&self.inner.owned)
            .iter()
            .map(|(session, owned)| (*session, owned.rig.epoch()))
            .collect()
    }

    /// The rig of `session`, if this host owns it now: what a request handler for the session
    /// works with, without a map of its own. It may be lost at any moment after (see
    /// [`Rig::lost`] and [`Rig::is_valid`]); its journal's appends are fenced all the same.
    pub fn rig(&self, session: Uuid) -> Option<Arc<Rig>> {
        lock(&self.inner.owned)
            .get(&session)
            .map(|owned| owned.rig.clone())
    }

    /// Hands every owned session over, in order, and takes no new ones, without stopping the
    /// host or its store; returns once it holds none. The host's key says so (its maximum
    /// written as 0) before the first session is shed, so the other hosts' shares grow at once
    /// and each shed session is taken by a standby after one watch event. Dropping the future
    /// does not stop the drain; [`undrain`](Self::undrain) does.
    pub async fn drain(&self) {
        let inner = &self.inner;
        inner.draining.store(true, Ordering::Release);
        inner.recount.notify_one();
        let mut freed = inner.freed.subscribe();
        while inner.slots.load(Ordering::Acquire) > 0 && inner.is_draining() {
            // A slot frees as each session's shutdown completes; the timeout is a backstop.
            let _ = tokio::time::timeout(Duration::from_millis(100), freed.changed()).await;
        }
    }

    /// Takes this host's share back after a [`drain`](Self::drain) (a drain asked for through
    /// etcd goes on until it is withdrawn: [`Admin::undrain`](crate::Admin::undrain)).
    pub fn undrain(&self) {
        self.inner.draining.store(false, Ordering::Release);
        self.inner.recount.notify_one();
    }

    /// Whether the host is draining: by [`drain`](Self::drain), or because a drain is asked
    /// for through etcd ([`Admin::drain`](crate::Admin::drain), `leasehold drain`).
    pub fn is_draining(&self) -> bool {
        self.inner.is_draining()
    }

    /// The number of sessions this host owns now.
    pub fn held_count(&self) -> usize {
        lock(&self.inner.owned).len()
    }

    /// This host's load: the sum of its sessions' smoothed loads at the last balance tick (see
    /// the [load docs](self#load)).
    pub fn load(&self) -> f64 {
        f64::from_bits(self.inner.load.load(Ordering::Acquire))
    }

    /// Each owned session's smoothed load at the last balance tick.
    pub fn session_loads(&self) -> Vec<(Uuid, f64)> {
        lock(&self.inner.owned)
            .iter()
            .map(|(session, owned)| (*session, lock(&owned.meter).load()))
            .collect()
    }

    /// The most sessions this host may hold now (its share).
    pub fn cap(&self) -> usize {
        *self.inner.cap.borrow()
    }

    /// What happens to the hosted sessions, from now on: see [`HostEvents`] for how many are
    /// buffered and what a receiver that falls behind is told.
    pub fn events(&self) -> HostEvents {
        self.inner.events.subscribe()
    }

    /// Stops hosting: the host's key is deleted (so others take its share at once), then every
    /// owned session is shut down in order. Idempotent.
    ///
    /// The delete is waited for at most three write attempts
    /// ([`WritePolicy::attempt_timeout`](crate::WritePolicy::attempt_timeout)); one not
    /// confirmed by then goes on in the background until it is, or until the node lease the
    /// key is attached to is gone (which deletes the key too).
    pub async fn shutdown(&self) {
        self.inner.leaving.cancel();
        let bound = leave_bound(&self.inner.store.shared().write);
        let _ = tokio::time::timeout(bound, self.inner.left.cancelled()).await;
        self.inner.shutdown.cancel();
        self.inner.stop_owned(None);
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl Drop for SessionHost {
    /// Signals only: the balance task deletes the host's key (in the background if it must),
    /// and every session task shuts its session down in order.
    fn drop(&mut self) {
        self.inner.leaving.cancel();
        self.inner.shutdown.cancel();
        self.inner.stop_owned(None);
        self.inner.tasks.close();
    }
}

impl Inner {
    fn add(self: &Arc<Self>, session: Uuid) {
        if self.shutdown.is_cancelled() {
            return;
        }
        let mut wanted = lock(&self.wanted);
        if wanted.contains_key(&session) {
            return;
        }
        let stop = self.shutdown.child_token();
        wanted.insert(session, stop.clone());
        self.set_digest
            .fetch_add(sets::digest_of(session), Ordering::AcqRel);
        drop(wanted);
        self.tasks.spawn(host_session(self.clone(), session, stop));
        self.resized.notify_one();
    }

    /// Hosts `session` because the registry has it (see `registered`), unless it is hosted
    /// already.
    fn add_registered(self: &Arc<Self>, session: Uuid) {
        if !lock(&self.wanted).contains_key(&session) {
            lock(&self.registered).insert(session);
            self.add(session);
        }
    }

    /// Whether `session` is hosted only because the registry has it.
    fn is_registered_only(&self, session: Uuid) -> bool {
        lock(&self.registered).contains(&session)
    }

    fn remove(&self, session: Uuid) {
        lock(&self.registered).remove(&session);
        let mut wanted = lock(&self.wanted);
        if let Some(stop) = wanted.remove(&session) {
            self.set_digest
                .fetch_sub(sets::digest_of(session), Ordering::AcqRel);
            drop(wanted);
            stop.cancel();
            self.stop_owned(Some(session));
            self.resized.notify_one();
        }
    }

    /// Cancels the work's token of owned `session` (of every owned session, for `None`), once
    /// its stop token is cancelled. A session owned after that sees its stop cancelled when it
    /// registers as owned (see `session::run`): its work's token is not a child of its stop
    /// token, which would cost a list of children per session.
    fn stop_owned(&self, session: Option<Uuid>) {
        let owned = lock(&self.owned);
        match session {
            Some(session) => owned.get(&session).iter().for_each(|o| o.token.cancel()),
            None => owned.values().for_each(|o| o.token.cancel()),
        }
    }

    fn emit(&self, event: HostEvent) {
        let _ = self.events.send(event);
    }

    /// Takes a slot if the cap allows.
    fn reserve(&self) -> bool {
        let cap = *self.cap.borrow();
        self.slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < cap).then_some(held + 1)
            })
            .is_ok()
    }

    fn unreserve(&self) {
        self.slots.fetch_sub(1, Ordering::AcqRel);
        self.slot_freed.notify_one();
        self.freed.send_replace(());
    }

    /// A session woken for a freed slot did not take it: wakes the next one, if a slot is
    /// still free.
    fn pass_slot_on(&self) {
        if self.slots.load(Ordering::Acquire) < *self.cap.borrow() {
            self.slot_freed.notify_one();
        }
    }
}
