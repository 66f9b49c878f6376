//! An agent runtime: each session is a long-running agent whose state lives in its journal.
//!
//! Every process hosts the same sessions with a [`SessionHost`], so the sessions are spread
//! over the processes. On each session it owns, the process replays the journal to rebuild the
//! agent's state (the steps done so far, and how many owners took them), then appends one step
//! every 500 ms, `{"step": n, "node": "..."}`, until the session is taken away, the journal is
//! fenced, or the process stops. On Ctrl-C it hands its sessions over in order, then closes the
//! store.
//!
//! ```text
//! LEASEHOLD_NODE=a cargo run --example agent_runtime
//! LEASEHOLD_NODE=b cargo run --example agent_runtime     # in a second terminal
//! ```
//!
//! A process takes sessions once it has settled (twice the TTL, 10 s), so the second one then
//! takes half of them from the first, each resuming at the step where the first left off; stop
//! either one and the other takes them all back. The sessions are the UUIDs given as arguments
//! (the same on every process), else `Uuid::from_u128(1..=6)`; `LEASEHOLD_ENDPOINTS`
//! (comma-separated, default `http://127.0.0.1:2379`) and `LEASEHOLD_NAMESPACE` (default
//! `agent-runtime`) say where they live. Each owned session adds two events a second to its
//! journal: `leasehold journal trim` (or `Journal::trim`) keeps journals short.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt as _;
use leasehold::{
    CancellationToken, Epoch, HostEvent, HostEvents, HostOptions, JournalWriteError, Namespace,
    ReplayError, Rig, SessionHost, Store, StoreOptions, Uuid,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

/// How often an agent takes a step.
const STEP_EVERY: Duration = Duration::from_millis(500);

/// One event in a session's journal.
#[derive(Serialize, Deserialize)]
struct Step {
    step: u64,
    node: String,
}

/// An agent's state, rebuilt from its journal by whichever process owns the session.
#[derive(Default)]
struct AgentState {
    steps: u64,
    /// How many owners took steps: each ownership of a session has an epoch of its own.
    owners: u64,
    epoch: Option<Epoch>,
}

impl AgentState {
    fn apply(&mut self, step: &Step, epoch: Epoch) {
        self.steps = step.step;
        if self.epoch != Some(epoch) {
            self.owners += 1;
            self.epoch = Some(epoch);
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // This example's lines from INFO, leasehold's own from WARN, unless RUST_LOG says otherwise.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,leasehold=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).init();

    let endpoints =
        std::env::var("LEASEHOLD_ENDPOINTS").unwrap_or_else(|_| "http://127.0.0.1:2379".to_owned());
    let namespace =
        std::env::var("LEASEHOLD_NAMESPACE").unwrap_or_else(|_| "agent-runtime".to_owned());
    let mut options = StoreOptions::new(endpoints.split(',').map(str::trim))
        .with_namespace(Namespace::new(namespace)?)
        // A killed process's sessions stay its own until its node lease expires: 5 s here.
        .with_ttl(Duration::from_secs(5), Duration::from_secs(1));
    // Else named after $HOSTNAME (the same in both terminals) or at random; only for logs.
    if let Ok(node) = std::env::var("LEASEHOLD_NODE") {
        options = options.with_node(node);
    }
    let args = std::env::args().skip(1);
    let mut sessions = args.map(|a| a.parse()).collect::<Result<Vec<Uuid>, _>>()?;
    if sessions.is_empty() {
        sessions = (1..=6).map(Uuid::from_u128).collect();
    }

    let store = Arc::new(Store::connect(options).await?);
    info!(node = store.node(), sessions = sessions.len(), "connected");
    let work = {
        let store = store.clone();
        move |rig, stop| run_agent(store.clone(), rig, stop)
    };
    let host = SessionHost::start(store.clone(), HostOptions::default(), sessions, work);
    let logger = tokio::spawn(log_events(host.events()));

    // The host does not watch for signals. (Under an orchestrator, wait for SIGTERM too, as
    // examples/router.rs does.)
    tokio::signal::ctrl_c().await?;
    info!("shutting down");
    // Deletes the host key, so the other processes take the sessions at once, then stops each
    // agent and releases its session in order. The store stays open through it.
    host.shutdown().await;
    // The last handle on the host: its events end, and the logger with them.
    drop(host);
    logger.await?;
    // Revokes the node lease, last.
    store.close().await;
    Ok(())
}

/// The work on one owned session: rebuild the state, then take a step every [`STEP_EVERY`].
async fn run_agent(store: Arc<Store>, rig: Arc<Rig>, stop: CancellationToken) {
    let (session, epoch) = (rig.session_id(), rig.epoch());
    let mut lost = rig.lost();
    // Retried while the session is owned: a replay fails while etcd is unavailable, when its
    // snapshot is compacted, or on a record that does not decode (`leasehold check` names it);
    // none of these is mended by a handover.
    let mut state = loop {
        match replay(&store, session).await {
            Ok(state) => break state,
            Err(error) => warn!(%session, error = %chain(&error), "replay failed; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = stop.cancelled() => return,
        }
    };
    info!(%session, %epoch, steps = state.steps, owners = state.owners, "resumed");
    let mut tick = tokio::time::interval(STEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
            // The host sees the loss too, and logs why it gave the session up.
            _ = &mut lost => return,
        }
        let step = Step {
            step: state.steps + 1,
            node: store.node().to_owned(),
        };
        let payload = serde_json::to_vec(&step).expect("a step encodes as JSON");
        // Awaited even if `stop` comes meanwhile: the host gives the work `stop_grace` (5 s) to
        // return, and an append settles before the session is released either way.
        match rig.journal().append(payload).await {
            Ok(_) => state.apply(&step, epoch),
            // Refused by etcd and not applied: the journal can go on. The state did not move,
            // so the next tick takes the same step again.
            Err(JournalWriteError::Etcd(error)) => {
                warn!(%session, step = step.step, error = %chain(&error), "step not recorded");
            }
            // Fenced, lease lost, outcome unknown, closed: this ownership of the session is
            // over. Resending could write a step twice (an append whose outcome is unknown may
            // have committed); the host opens the session again under a new lease, here or
            // on another process, and that owner replays what committed.
            Err(error) => {
                warn!(%session, %epoch, error = %chain(&error), "giving the session up");
                return;
            }
        }
    }
}

/// The state as of now. The rig's fence committed before the work started, so no older owner
/// can append after this snapshot: it holds every step there will ever be before ours.
async fn replay(store: &Store, session: Uuid) -> Result<AgentState, ReplayError> {
    let mut state = AgentState::default();
    let mut events = pin!(store.replay(session));
    while let Some(event) = events.try_next().await? {
        match serde_json::from_slice::<Step>(&event.payload) {
            Ok(step) => state.apply(&step, event.epoch),
            Err(error) => warn!(%session, seq = event.seq, %error, "not a step; skipped"),
        }
    }
    Ok(state)
}

/// Logs what the host does with its sessions, until the host is gone.
async fn log_events(mut events: HostEvents) {
    loop {
        match events.recv().await {
            Ok(HostEvent::Acquired { session, epoch }) => info!(%session, %epoch, "acquired"),
            Ok(HostEvent::GaveUp {
                session,
                epoch,
                why,
                result,
            }) => match result {
                Ok(()) => info!(%session, %epoch, %why, "released"),
                Err(error) => warn!(%session, %why, error = %chain(&*error), "release deferred"),
            },
            Ok(HostEvent::OpenFailed { session, error }) => {
                warn!(%session, error = %chain(&*error), "open failed");
            }
            // The host logs a warning with the failure and the next attempt too.
            Ok(HostEvent::Quarantined { session, .. }) => warn!(%session, "quarantined"),
            Ok(_) => {}
            // Only this log missed some events; the host goes on all the same.
            Err(RecvError::Lagged(missed)) => warn!(missed, "host events not logged"),
            Err(RecvError::Closed) => return,
        }
    }
}

/// An error and its causes, `: `-separated (the top-level message alone is often generic).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    for cause in std::iter::successors(error.source(), |cause| cause.source()) {
        text = format!("{text}: {cause}");
    }
    text
}
