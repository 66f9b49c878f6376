//! The node lease: granted once per generation, kept alive on one stream, replaced when lost.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::time::{Instant, sleep, timeout};

use super::StoreShared;
use crate::clock::{self, sleep_until};
use crate::etcd::{Connection, EtcdError};
use crate::lease::validity::{self, MarginError, Renewal, Validity};
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
            end = keep_alive(&shared, &node, &mut validity) => end,
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
        let mut backoff = Duration::from_millis(100);
        loop {
            let granted = tokio::select! {
                granted = grant(&shared.connection, shared.ttl, shared.margin) => granted,
                _ = shared.shutdown.cancelled() => return,
            };
            match granted {
                Ok((fresh, fresh_validity)) => {
                    tracing::info!(lease = fresh.id, "fresh node lease granted");
                    (node, validity) = (fresh, fresh_validity);
                    shared.set_current_node(Some(node.clone()));
                    break;
                }
                Err(GrantError::Etcd(error)) => {
                    tracing::warn!(%error, "granting a fresh node lease failed; retrying");
                }
                Err(GrantError::Margin(error)) => {
                    tracing::warn!(%error, "the granted TTL leaves no room for the margin; retrying");
                }
            }
            tokio::select! {
                _ = sleep(backoff) => {}
                _ = shared.shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
}

/// How long an opening of the keepalive stream goes unanswered before another is sent, on the
/// next endpoint. etcd answers an opening in milliseconds, but after a leader crash a member
/// that still takes the dead leader for its leader holds the renewal until its dial to that
/// leader gives up (etcd's peer dial timeout: 1 s + the election timeout), even when a new
/// leader is elected meanwhile; an opening sent after the election is answered at once.
const HEDGE: Duration = Duration::from_millis(250);

/// How long after a failed opening (a member down, or without a leader) the next is sent.
const RETRY: Duration = Duration::from_millis(100);

/// At most this many openings are in flight at once.
const MAX_OPENINGS: usize = 8;

/// A keepalive stream whose opening etcd answered.
struct Opened {
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
    /// When its opening request was sent.
    sent: Instant,
    endpoint: String,
}

/// One opening of the keepalive stream, ended.
struct Opening {
    /// The endpoint's index, and the endpoint.
    index: usize,
    endpoint: String,
    sent: Instant,
    /// `Err` when it went unanswered for a renewal interval.
    outcome: Result<
        Result<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream), etcd_client::Error>,
        tokio::time::error::Elapsed,
    >,
}

/// Opens a keepalive stream for node lease `id`, the opening request being itself a renewal.
///
/// Openings are hedged: the first goes to the preferred endpoint, and while none is answered
/// another goes to the next endpoint every [`HEDGE`] (or [`RETRY`] after one failed), each
/// given up after `every`. The first one answered wins and its endpoint becomes preferred; the
/// others are dropped, which cancels them. `None` when etcd says the lease is gone. It runs
/// until a stream opens: the caller bounds it by the deadline.
async fn open(connection: &Connection, id: i64, every: Duration) -> Option<Opened> {
    let mut openings: FuturesUnordered<BoxFuture<'static, Opening>> = FuturesUnordered::new();
    let mut index = connection.preferred_index();
    let mut next = clock::now();
    loop {
        tokio::select! {
            () = sleep_until(next), if openings.len() < MAX_OPENINGS => {
                let (client, endpoint) = connection.stream_client_at(index);
                let sent = clock::now();
                let outcome = timeout(every, async move {
                    client.ready().await?.lease_keep_alive(id).await
                });
                openings.push(Box::pin(async move {
                    Opening { index, endpoint, sent, outcome: outcome.await }
                }));
                index = (index + 1) % connection.len();
                next = clock::later(HEDGE);
            }
            Some(Opening { index: at, endpoint, sent, outcome }) = openings.next(),
                if !openings.is_empty() =>
            {
                match outcome {
                    Ok(Ok((keeper, stream))) => {
                        connection.prefer(at);
                        return Some(Opened { keeper, stream, sent, endpoint });
                    }
                    // etcd-client reports a TTL ≤ 0 on the opening reply this way: the lease is
                    // gone.
                    Ok(Err(etcd_client::Error::LeaseKeepAliveError(message)))
                        if message == "lease not found" =>
                    {
                        return None;
                    }
                    Ok(Err(error)) => {
                        let error = EtcdError::new("keepalive", &endpoint, error);
                        if error.is_auth_failed() || error.is_permission_denied() {
                            // Its stream token expired: the next opening there authenticates.
                            connection.forget_stream_token(&endpoint);
                        }
                        tracing::debug!(%endpoint, error = %crate::etcd::chain(&error), "opening the keepalive stream failed");
                        next = next.min(clock::later(RETRY));
                    }
                    Err(_) => {
                        tracing::debug!(%endpoint, "opening the keepalive stream stalled");
                        next = clock::now();
                    }
                }
            }
        }
    }
}

/// Keeps one node lease generation alive until it is lost or the store shuts down.
async fn keep_alive(shared: &StoreShared, node: &NodeLease, validity: &mut Validity) -> End {
    let every = validity.renew_every();
    loop {
        // --- (re)open the stream; the opening request is itself a renewal.
        validity.stream_reset();
        let opened = tokio::select! {
            opened = open(&shared.connection, node.id, every) => opened,
            _ = sleep_until(validity.valid_until()) => return End::Lost(LossReason::Expired),
            _ = shared.shutdown.cancelled() => return End::Shutdown,
        };
        let Some(Opened {
            mut keeper,
            mut stream,
            sent,
            endpoint,
        }) = opened
        else {
            return End::Lost(LossReason::KeepaliveFailed);
        };
        tracing::debug!(%endpoint, took = ?clock::since(sent), "keepalive stream opened");
        // A renewal that arrives after the deadline passed must not revive the lease.
        if !validity.is_valid_at(clock::now()) {
            return End::Lost(LossReason::Expired);
        }
        // The opening reply renewed the lease with its TTL (etcd-client keeps only its ID).
        validity.sent(sent);
        if let Renewal::Renewed { valid_until } = validity.replied(validity.ttl().as_secs() as i64)
        {
            node.set_valid_until(valid_until);
        }

        // --- renew every TTL/3 until the stream fails or stalls
        let mut next = clock::after(sent, every);
        loop {
            // A renewal unanswered for half an interval means a stalled stream (etcd answers in
            // milliseconds): re-open it then, leaving most of the deadline's slack for the new
            // stream, rather than at the next renewal.
            let stalled = validity
                .oldest_outstanding()
                .map_or(validity.valid_until(), |oldest| {
                    clock::after(oldest, every / 2)
                });
            tokio::select! {
                _ = shared.shutdown.cancelled() => return End::Shutdown,
                _ = sleep_until(validity.valid_until()) => {
                    if !validity.is_valid_at(clock::now()) {
                        return End::Lost(LossReason::Expired);
                    }
                }
                _ = sleep_until(stalled), if validity.oldest_outstanding().is_some() => {
                    tracing::debug!(%endpoint, "keepalive unanswered for half an interval; re-opening");
                    shared.connection.rotate();
                    break;
                }
                _ = sleep_until(next) => {
                    let now = clock::now();
                    validity.sent(now);
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                    next = clock::after(now, every);
                }
                reply = stream.message() => match reply {
                    // A renewal that arrives after the deadline passed must not revive the lease.
                    Ok(Some(_)) if !validity.is_valid_at(clock::now()) => {
                        return End::Lost(LossReason::Expired);
                    }
                    Ok(Some(reply)) => {
                        // The reply answers the oldest request outstanding.
                        let answered = validity.oldest_outstanding();
                        match validity.replied(reply.ttl()) {
                            Renewal::Renewed { valid_until } => {
                                node.set_valid_until(valid_until);
                                let now = clock::now();
                                if let Some(sent) = answered {
                                    shared.metrics.keepalive(
                                        now.saturating_duration_since(sent),
                                        valid_until.saturating_duration_since(now),
                                    );
                                }
                            }
                            Renewal::Gone => return End::Lost(LossReason::KeepaliveFailed),
                            Renewal::Unexpected => {}
                        }
                    }
                    Ok(None) | Err(_) => {
                        tracing::debug!(%endpoint, "keepalive stream ended; re-opening");
                        shared.connection.rotate();
                        tokio::select! {
                            _ = sleep(Duration::from_millis(50)) => {}
                            _ = shared.shutdown.cancelled() => return End::Shutdown,
                        }
                        break;
                    }
                },
            }
        }
    }
}
