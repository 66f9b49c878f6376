//! The node lease: granted once per generation, kept alive on one stream, replaced when lost.
//!
//! The keepalive task here does the I/O: it opens the stream, sends and reads renewals, and
//! sleeps; what to do when is decided by the state machine of `renewal.rs`, which it feeds.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::time::{Instant, sleep, timeout};

use super::StoreShared;
use super::renewal::{Action, Closed, Event, OpenFailure, State};
use crate::backoff::Backoff;
use crate::clock::{self, sleep_until};
use crate::etcd::{Connection, EtcdError};
use crate::lease::validity::{self, MarginError, Validity};
use crate::lease::{LossReason, NodeLease};

pub(super) enum GrantError {
    Etcd(EtcdError),
    Margin(MarginError),
}

/// Grants a node lease and checks the margin against the TTL etcd granted and the grant's
/// round trip.
pub(super) async fn grant(
    connection: &Connection,
    ttl: Duration,
    margin: Duration,
) -> Result<(Arc<NodeLease>, Validity), GrantError> {
    let sent = clock::now();
    // A grant whose outcome is unknown leaks at most a lease that expires by itself after its
    // TTL, with no key attached: granting is safe to retry.
    let (id, granted) = connection
        .read("grant", |mut client: etcd_client::Client, _| async move {
            let response = client.lease_grant(ttl.as_secs() as i64, None).await?;
            Ok((response.id(), response.ttl()))
        })
        .await
        .map_err(GrantError::Etcd)?;
    let granted = Duration::from_secs(granted.max(0) as u64);
    if let Err(error) = validity::check_margin(granted, margin, clock::since(sent)) {
        revoke(connection, id).await;
        return Err(GrantError::Margin(error));
    }
    let validity = Validity::granted(sent, granted, margin);
    Ok((
        Arc::new(NodeLease::new(id, validity.valid_until())),
        validity,
    ))
}

/// Revokes a node lease, best effort and bounded: deleting every key attached to it.
pub(super) async fn revoke(connection: &Connection, id: i64) {
    let revoked = timeout(
        Duration::from_secs(3),
        connection.write("revoke", |mut client: etcd_client::Client, _| async move {
            client.lease_revoke(id).await
        }),
    )
    .await;
    match revoked {
        Ok(Ok(_)) => tracing::debug!(lease = id, "node lease revoked"),
        Ok(Err(error)) => tracing::debug!(lease = id, %error, "revoking the node lease failed"),
        Err(_) => tracing::debug!(lease = id, "revoking the node lease timed out"),
    }
}

enum End {
    Lost(LossReason),
    Shutdown,
}

/// The keepalive task: keeps each generation of the node lease alive until it is lost, then
/// replaces it; on shutdown, loses every lease and revokes the node lease. Once etcd denies
/// the store's user its namespace (the owner watch's refusal), it loses every lease, lets the
/// node lease go and grants no other.
pub(super) async fn run(
    shared: Arc<StoreShared>,
    mut node: Arc<NodeLease>,
    mut validity: Validity,
) {
    loop {
        let end = tokio::select! {
            end = keep_alive(&shared, &node, validity) => end,
            () = shared.refusal.refused() => End::Lost(LossReason::PermissionDenied),
        };
        // Never renew this lease ID again: the server may still hold it, but our view of its
        // validity is gone.
        node.mark_lost(match end {
            End::Lost(reason) => reason,
            End::Shutdown => LossReason::StoreClosed,
        });
        shared.set_current_node(None);
        match end {
            End::Shutdown => {
                shared.lose_all(None, LossReason::StoreClosed);
                revoke(&shared.connection, node.id).await;
                return;
            }
            End::Lost(reason @ LossReason::PermissionDenied) => {
                // The owner watch has logged why. The keys attached to the lease go with it:
                // revoked, or (when etcd refuses the revoke too) expired, since it is never
                // renewed again.
                tracing::warn!(lease = node.id, %reason, "node lease let go; no fresh one is granted");
                shared.lose_all(Some(node.id), reason);
                revoke(&shared.connection, node.id).await;
                return;
            }
            End::Lost(reason) => {
                tracing::warn!(lease = node.id, %reason, "node lease lost; granting a fresh one");
                shared.lose_all(Some(node.id), reason);
                // Otherwise its owner keys would outlive every handle (zombie ownership).
                revoke(&shared.connection, node.id).await;
            }
        }
        let Some(fresh) = grant_fresh(&shared).await else {
            return;
        };
        (node, validity) = fresh;
    }
}

/// Grants a fresh node lease after one was lost, retrying until etcd grants one; `None` when
/// the store shuts down first.
async fn grant_fresh(shared: &StoreShared) -> Option<(Arc<NodeLease>, Validity)> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let granted = tokio::select! {
            granted = grant(&shared.connection, shared.ttl, shared.margin) => granted,
            _ = shared.shutdown.cancelled() => return None,
        };
        match granted {
            Ok((fresh, fresh_validity)) => {
                tracing::info!(lease = fresh.id, "fresh node lease granted");
                shared.set_current_node(Some(fresh.clone()));
                return Some((fresh, fresh_validity));
            }
            Err(GrantError::Etcd(error)) => {
                tracing::warn!(%error, "granting a fresh node lease failed; retrying");
            }
            Err(GrantError::Margin(error)) => {
                tracing::warn!(%error, "the granted TTL leaves no room for the margin; retrying");
            }
        }
        tokio::select! {
            _ = sleep(backoff.next()) => {}
            _ = shared.shutdown.cancelled() => return None,
        }
    }
}

/// The keepalive stream: the handle that sends renewals, and the replies.
struct Stream {
    keeper: etcd_client::LeaseKeeper,
    replies: etcd_client::LeaseKeepAliveStream,
    endpoint: String,
}

/// One opening of the keepalive stream, ended.
struct Opening {
    id: u64,
    endpoint: String,
    /// `Err` when it went unanswered for as long as it was given.
    outcome: Result<
        Result<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream), etcd_client::Error>,
        tokio::time::error::Elapsed,
    >,
}

impl Opening {
    /// What this opening's end means to the state machine, and its stream if it opened one.
    fn event(self) -> (Event, Option<Stream>) {
        let Opening {
            id,
            endpoint,
            outcome,
        } = self;
        let why = match outcome {
            Ok(Ok((keeper, replies))) => {
                let stream = Stream {
                    keeper,
                    replies,
                    endpoint,
                };
                return (Event::Opened { id }, Some(stream));
            }
            // etcd-client reports a TTL ≤ 0 on the opening reply this way: the lease is gone.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(message)))
                if message == "lease not found" =>
            {
                OpenFailure::LeaseGone
            }
            Ok(Err(error)) => {
                let error = EtcdError::new("keepalive", &endpoint, error);
                tracing::debug!(%endpoint, error = %crate::etcd::chain(&error), "opening the keepalive stream failed");
                if error.is_auth_failed() || error.is_permission_denied() {
                    OpenFailure::TokenRefused
                } else {
                    OpenFailure::Refused
                }
            }
            Err(_) => {
                tracing::debug!(%endpoint, "opening the keepalive stream stalled");
                OpenFailure::Stalled
            }
        };
        (Event::OpenFailed { id, why }, None)
    }
}

/// Keeps one node lease generation alive until it is lost or the store shuts down: feeds what
/// happens on the keepalive stream to [`State`] and does what it says (see `renewal.rs`).
async fn keep_alive(shared: &StoreShared, node: &NodeLease, validity: Validity) -> End {
    let connection = &shared.connection;
    let mut state = State::new(validity, connection.len(), clock::now());
    let mut shell = Shell {
        shared,
        node,
        openings: FuturesUnordered::new(),
        stream: None,
    };
    loop {
        let (event, arrived) = tokio::select! {
            _ = shared.shutdown.cancelled() => return End::Shutdown,
            () = wake(state.wake_at()) => {
                (Event::Wake { preferred: connection.preferred_index() }, None)
            }
            Some(opening) = shell.openings.next(), if !shell.openings.is_empty() => {
                opening.event()
            }
            reply = message(&mut shell.stream) => match reply {
                Ok(Some(reply)) => (Event::Replied { ttl_seconds: reply.ttl() }, None),
                Ok(None) | Err(_) => (Event::Ended, None),
            },
        };
        if let Some(reason) = shell.feed(&mut state, event, arrived).await {
            return End::Lost(reason);
        }
    }
}

/// Sleeps until `at`; forever when there is nothing to wake for.
async fn wake(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The stream's next reply; pending while there is no stream.
async fn message(
    stream: &mut Option<Stream>,
) -> Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error> {
    match stream {
        Some(stream) => stream.replies.message().await,
        None => std::future::pending().await,
    }
}

/// What the keepalive task holds while the state machine decides: the openings in flight and
/// the stream.
struct Shell<'a> {
    shared: &'a StoreShared,
    node: &'a NodeLease,
    openings: FuturesUnordered<BoxFuture<'static, Opening>>,
    stream: Option<Stream>,
}

impl Shell<'_> {
    /// Steps `state` with `event` (and with what the actions lead to), doing each action in
    /// order; `arrived` is the stream an [`Event::Opened`] brought. The loss reason once lost.
    async fn feed(
        &mut self,
        state: &mut State,
        event: Event,
        mut arrived: Option<Stream>,
    ) -> Option<LossReason> {
        let mut events = vec![event];
        while let Some(event) = events.pop() {
            for action in state.step(event, clock::now()) {
                match action {
                    Action::Lost(reason) => return Some(reason),
                    Action::Adopt { index, sent, .. } => self.adopt(index, sent, arrived.take()),
                    Action::Send => {
                        if !self.send().await {
                            events.push(Event::SendFailed);
                        }
                    }
                    action => self.act(action),
                }
            }
        }
        None
    }

    /// Does an action that needs no waiting.
    fn act(&mut self, action: Action) {
        let connection = &self.shared.connection;
        match action {
            Action::Open { id, index, within } => self.open(id, index, within),
            Action::Renewed {
                valid_until,
                answered,
            } => {
                self.node.set_valid_until(valid_until);
                if let Some(sent) = answered {
                    let now = clock::now();
                    self.shared.metrics.keepalive(
                        now.saturating_duration_since(sent),
                        valid_until.saturating_duration_since(now),
                    );
                }
            }
            Action::Rotate => connection.rotate(),
            Action::Close(why) => {
                let Some(Stream { endpoint, .. }) = self.stream.take() else {
                    return;
                };
                match why {
                    Closed::Unanswered => {
                        tracing::debug!(%endpoint, "keepalive unanswered for half an interval; re-opening")
                    }
                    Closed::Ended => {
                        tracing::debug!(%endpoint, "keepalive stream ended; re-opening")
                    }
                    Closed::SendFailed => {
                        tracing::debug!(%endpoint, "sending a keepalive failed; re-opening")
                    }
                }
            }
            Action::ForgetToken { index } => {
                // Its stream token expired: the next opening there authenticates.
                if let Some(endpoint) = connection.endpoints().get(index) {
                    connection.forget_stream_token(endpoint);
                }
            }
            Action::Adopt { .. } | Action::Send | Action::Lost(_) => {}
        }
    }

    /// Sends opening `id` to endpoint `index`, the opening request being itself a renewal.
    fn open(&mut self, id: u64, index: usize, within: Duration) {
        let (client, endpoint) = self.shared.connection.stream_client_at(index);
        let lease = self.node.id;
        let outcome = timeout(within, async move {
            client.ready().await?.lease_keep_alive(lease).await
        });
        self.openings.push(Box::pin(async move {
            Opening {
                id,
                endpoint,
                outcome: outcome.await,
            }
        }));
    }

    /// Makes `stream`, opened on endpoint `index` by a request sent at `sent`, the stream;
    /// dropping the other openings cancels them.
    fn adopt(&mut self, index: usize, sent: Instant, stream: Option<Stream>) {
        self.shared.connection.prefer(index);
        self.openings = FuturesUnordered::new();
        if let Some(stream) = &stream {
            tracing::debug!(endpoint = %stream.endpoint, took = ?clock::since(sent), "keepalive stream opened");
        }
        self.stream = stream;
    }

    /// Sends a keepalive on the stream; whether it went.
    async fn send(&mut self) -> bool {
        match &mut self.stream {
            Some(stream) => stream.keeper.keep_alive().await.is_ok(),
            None => false,
        }
    }
}
