//! [`HostOptions`], and what a host tells: [`HostEvent`], [`GiveUp`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::lease::{Epoch, LossReason};
use crate::rig::{Rig, RigError};

/// The user's work on one owned session: runs until `token` is cancelled (or returns earlier
/// on its own, which gives the session up).
pub(super) type Work =
    Arc<dyn Fn(Arc<Rig>, CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>;

/// The workspace id of a session.
pub(super) type WorkspaceOf = Arc<dyn Fn(Uuid) -> String + Send + Sync>;

/// How a [`SessionHost`](super::SessionHost) runs.
#[derive(Clone)]
#[non_exhaustive]
pub struct HostOptions {
    /// The most sessions this host holds, whatever the balance allows. Default: no limit.
    pub max_sessions: Option<usize>,
    /// This host's weight in the balance: its share is proportional to it among the live hosts
    /// (0 takes no sessions, as a drained host). Default 1.
    pub weight: u32,
    /// How long a new host waits, registered under `{ns}/joining/`, before it takes any session
    /// (see the [host docs](super#joining)): long enough that hosts started together see each
    /// other before any takes a share, and that a host which joins and leaves again within it
    /// moves nothing. `None` (the default): twice the store's TTL. Zero: no settling.
    pub settle: Option<Duration>,
    /// Whether the host follows the shared session registry (`{ns}/sessions/`, see
    /// [`Admin::create_session`](crate::Admin::create_session)): every registered session is
    /// hosted from the snapshot or watch event that shows it, and removed when it is finished,
    /// besides the sessions given to [`start`](super::SessionHost::start) and
    /// [`add`](super::SessionHost::add). Default: false (a fixed set).
    pub registry: bool,
    /// How long the user's work may take to return once its token is cancelled before it is
    /// dropped (aborted). Default 5 s.
    pub stop_grace: Duration,
    /// The pause after a session could not be opened (e.g. its workspace root is held), before
    /// it is tried again. It doubles, with jitter, with each failure in a row, up to
    /// [`max_retry_pause`](Self::max_retry_pause). Default 500 ms.
    pub retry_pause: Duration,
    /// The longest pause between two attempts to open a session that keeps failing (before
    /// jitter, which adds up to as much again). Default 60 s.
    pub max_retry_pause: Duration,
    /// How the host measures its sessions' load and balances by it (see the
    /// [load docs](super#load)).
    pub load: LoadBalance,
    pub(super) workspace: WorkspaceOf,
}

/// How a [`SessionHost`](super::SessionHost) measures load and balances by it (see the
/// [load docs](super#load)). The defaults suit sessions whose load changes over minutes (an
/// agent's conversation, a stream's partition): a burst of a few seconds moves nothing, a
/// session that stays busy is seen within a minute, and a fleet out of balance moves at most
/// 12 sessions a minute per host, none of them twice within 2 minutes.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LoadBalance {
    /// Whether the host moves sessions by load. Off, it still measures and publishes its
    /// load (for `leasehold hosts`), and balances by count alone. Default: on.
    pub enabled: bool,
    /// The half-life of the smoothing: a second of load this long ago counts for half as much
    /// as a second of it now. Default 30 s.
    pub half_life: Duration,
    /// How far over its target a host may be before it moves anything, as a fraction of the
    /// target (the hysteresis). Default 0.1.
    pub band: f64,
    /// How often at most the host writes its load to etcd: one write per this interval, and
    /// only when it changed. Default 5 s (at most 12 writes a minute per host).
    pub publish_every: Duration,
    /// The churn budget: at most this many moves by load per host per
    /// [`budget_interval`](Self::budget_interval). Default 2.
    pub budget: usize,
    /// See [`budget`](Self::budget). Default 10 s.
    pub budget_interval: Duration,
    /// A session acquired less than this long ago is not moved by load, and is the last a
    /// host over its share of the count sheds. Default 2 min.
    pub cooldown: Duration,
    /// How many of its sessions' loads a host publishes with its own: its hottest, none idle
    /// ([`Admin::owners`](crate::Admin::owners) and `leasehold owners` show them), at most
    /// [`MAX_PUBLISHED_SESSIONS`]. Each adds some 45 bytes to every publication, which every
    /// host reads at each balance tick. Default 16.
    pub published_sessions: usize,
}

/// The most sessions' loads a host publishes with its own (see
/// [`LoadBalance::published_sessions`]): some 45 KB a publication.
pub const MAX_PUBLISHED_SESSIONS: usize = 1000;

impl Default for LoadBalance {
    fn default() -> Self {
        Self {
            enabled: true,
            half_life: Duration::from_secs(30),
            band: 0.1,
            publish_every: Duration::from_secs(5),
            budget: 2,
            budget_interval: Duration::from_secs(10),
            cooldown: Duration::from_secs(120),
            published_sessions: 16,
        }
    }
}

impl LoadBalance {
    /// Measures and publishes load, and moves nothing by it.
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// Sets the [`half_life`](Self::half_life) of the smoothing.
    pub fn with_half_life(mut self, half_life: Duration) -> Self {
        self.half_life = half_life;
        self
    }

    /// Sets the [`band`](Self::band) (clamped to at least 0).
    pub fn with_band(mut self, band: f64) -> Self {
        self.band = if band.is_finite() { band.max(0.0) } else { 0.0 };
        self
    }

    /// Sets how often at most the load is [published](Self::publish_every).
    pub fn with_publish_every(mut self, every: Duration) -> Self {
        self.publish_every = every;
        self
    }

    /// Sets the churn budget: at most `moves` moves by load per `interval`.
    pub fn with_budget(mut self, moves: usize, interval: Duration) -> Self {
        self.budget = moves;
        self.budget_interval = interval;
        self
    }

    /// Sets the [`cooldown`](Self::cooldown).
    pub fn with_cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// Sets how many of its sessions' loads a host [publishes](Self::published_sessions)
    /// (clamped to [`MAX_PUBLISHED_SESSIONS`]).
    pub fn with_published_sessions(mut self, sessions: usize) -> Self {
        self.published_sessions = sessions.min(MAX_PUBLISHED_SESSIONS);
        self
    }
}

impl std::fmt::Debug for HostOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostOptions")
            .field("max_sessions", &self.max_sessions)
            .field("weight", &self.weight)
            .field("settle", &self.settle)
            .field("registry", &self.registry)
            .field("stop_grace", &self.stop_grace)
            .field("retry_pause", &self.retry_pause)
            .field("max_retry_pause", &self.max_retry_pause)
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            max_sessions: None,
            weight: 1,
            settle: None,
            registry: false,
            stop_grace: Duration::from_secs(5),
            retry_pause: Duration::from_millis(500),
            max_retry_pause: Duration::from_secs(60),
            load: LoadBalance::default(),
            workspace: Arc::new(|session| format!("ws-{session}")),
        }
    }
}

impl HostOptions {
    /// Caps the sessions this host holds.
    pub fn with_max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = Some(max);
        self
    }

    /// Sets this host's [`weight`](Self::weight) in the balance. Hosts of releases before
    /// weights read a host whose weight is not 1 as one of weight 1 and no maximum: give hosts
    /// weights once every host reads them.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Sets how long a new host [settles](Self::settle) before it takes any session.
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = Some(settle);
        self
    }

    /// Makes the host follow the shared session registry (see [`registry`](Self::registry)).
    pub fn with_registry(mut self) -> Self {
        self.registry = true;
        self
    }

    /// Sets the grace period of the user's work.
    pub fn with_stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Sets the pause after a failed open.
    pub fn with_retry_pause(mut self, pause: Duration) -> Self {
        self.retry_pause = pause;
        self
    }

    /// Sets the longest pause between attempts to open a session that keeps failing.
    pub fn with_max_retry_pause(mut self, pause: Duration) -> Self {
        self.max_retry_pause = pause;
        self
    }

    /// Sets how the host measures load and balances by it.
    pub fn with_load_balance(mut self, load: LoadBalance) -> Self {
        self.load = load;
        self
    }

    /// Names each session's workspace root (default `ws-{session}`). The id must be valid for
    /// [`Rig::open`]: 1 to [`MAX_WORKSPACE_LEN`](crate::rig::MAX_WORKSPACE_LEN) (128) bytes of
    /// ASCII letters, digits, `-`, `_` and `.`.
    pub fn with_workspace(
        mut self,
        workspace: impl Fn(Uuid) -> String + Send + Sync + 'static,
    ) -> Self {
        self.workspace = Arc::new(workspace);
        self
    }
}

/// Why a host gave an owned session up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// The lease was lost (also when the work returned because it saw the loss).
    Lost(LossReason),
    /// The journal broke (fenced, or an append's outcome could not be settled; also when the
    /// work returned because it saw the journal break).
    JournalBroken,
    /// The user's work returned on its own (or cancelled the token it was given), its lease
    /// valid and its journal sound.
    WorkDone,
    /// The host is over its share and handed the session over.
    Shed,
    /// The session is being moved to another host
    /// ([`Admin::move_session`](crate::Admin::move_session)) and was handed over to it.
    Moved {
        /// The store it moves to.
        to: Uuid,
    },
    /// The session was removed from the host, or the host shut down.
    Stopped,
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveUp::Lost(reason) => write!(f, "lost ({reason})"),
            GiveUp::JournalBroken => f.write_str("journal broken"),
            GiveUp::WorkDone => f.write_str("work done"),
            GiveUp::Shed => f.write_str("shed to another host"),
            GiveUp::Moved { to } => write!(f, "moved to store {to}"),
            GiveUp::Stopped => f.write_str("stopped"),
        }
    }
}

/// What happened to a hosted session, as [`SessionHost::events`](super::SessionHost::events) reports it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum HostEvent {
    /// The session is owned, its rig open, the work started.
    Acquired {
        /// The session.
        session: Uuid,
        /// The epoch.
        epoch: Epoch,
    },
    /// The session was given up and its rig shut down; `result` says whether every delete of
    /// the shutdown was confirmed (else they go on in the background, in order).
    GaveUp {
        /// The session.
        session: Uuid,
        /// The epoch it was owned at.
        epoch: Epoch,
        /// Why.
        why: GiveUp,
        /// The shutdown's outcome.
        result: Result<(), Arc<RigError>>,
    },
    /// The session was acquired but its rig could not be opened; it is tried again after a
    /// pause (see [`HostOptions::retry_pause`]).
    OpenFailed {
        /// The session.
        session: Uuid,
        /// Why.
        error: Arc<RigError>,
    },
    /// The session failed to open 3 times in a row (reported then, and at each failure after
    /// that, after its [`OpenFailed`](Self::OpenFailed)): it is quarantined, tried again only
    /// after pauses that keep doubling up to [`HostOptions::max_retry_pause`] (e.g. its
    /// journal's tip is behind its last record, or does not decode: see `leasehold check`).
    /// It stays quarantined until it opens again ([`Acquired`](Self::Acquired)) or the host
    /// stops hosting it.
    Quarantined {
        /// The session.
        session: Uuid,
        /// The failed opens in a row.
        failures: u32,
        /// The pause before the next attempt.
        retry_in: Duration,
        /// The last failure.
        error: Arc<RigError>,
    },
    /// Another host (of store `store`) hosts a different fixed set of sessions than this one
    /// (reported once per change of its set, with a WARN line): the balance counts every
    /// host for every set, so sessions that only some hosts host may go unowned. Give every
    /// host the same set, or have them follow the registry
    /// ([`HostOptions::with_registry`]).
    SetDiffers {
        /// The other host's store.
        store: Uuid,
        /// How many sessions its set holds.
        sessions: usize,
    },
}
