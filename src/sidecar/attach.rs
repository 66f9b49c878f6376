//! One `Attach` stream: the sessions it owns, for as long as it lasts.
//!
//! The stream's task reads the client's requests, runs its acquisitions (each on its own, so
//! that a standby never holds up a release), watches each owned lease, and answers on the
//! response stream. When the client's side ends (closed, cancelled, or its connection closed
//! for unanswered keepalive pings), or the sidecar shuts down, it releases every session it
//! owns, all at once, and ends.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tonic::Status;
use uuid::Uuid;

use super::proto::{self, AttachRequest, AttachResponse, attach_request, attach_response};
use super::refusal::{Refusal, loss_label};
use super::requests::Requests;
use super::{Owned, Sidecar, parse_session};
use crate::lease::Epoch;
use crate::metrics::Metrics;
use crate::store::AcquireError;

type Sender = mpsc::Sender<Result<AttachResponse, Status>>;

/// What one acquisition came to.
enum Acquisition {
    Owned(Arc<Owned>),
    Held { epoch: Epoch, node: String },
    Failed(Refusal),
}

/// The `Acquired` event of a session this stream owns: its epoch, the fence's place, and how
/// long its lease stays valid from now without a renewal.
fn acquired(owned: &Owned) -> attach_response::Event {
    let valid_for = owned
        .lease
        .state()
        .node
        .valid_until()
        .saturating_duration_since(crate::clock::now());
    attach_response::Event::Acquired(proto::Acquired {
        session: owned.lease.session_id().to_string(),
        epoch: owned.lease.epoch().get(),
        tip_seq: owned.journal.next_seq().saturating_sub(1),
        valid_for_ms: u32::try_from(valid_for.as_millis()).unwrap_or(u32::MAX),
    })
}

/// Runs stream `stream` until its client's side ends or the sidecar shuts down.
pub(super) async fn run(
    sidecar: Sidecar,
    stream: u64,
    peer: Option<SocketAddr>,
    mut requests: tonic::Streaming<AttachRequest>,
    sender: Sender,
) {
    let peer = peer.map_or_else(|| "local".to_owned(), |peer| peer.to_string());
    tracing::info!(stream, %peer, "attached");
    let _open = Open::new(sidecar.inner.store.metrics().clone());
    let stop = sidecar.inner.stop.clone();
    // Owned sessions, in the order they were acquired.
    let mut owned: Vec<Arc<Owned>> = Vec::new();
    let mut acquiring: HashSet<Uuid> = HashSet::new();
    let mut acquisitions: FuturesUnordered<BoxFuture<'static, (Uuid, Acquisition)>> =
        FuturesUnordered::new();
    let mut losses: FuturesUnordered<BoxFuture<'static, (Uuid, Epoch, &'static str)>> =
        FuturesUnordered::new();
    let why = loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break "the sidecar is shutting down",
            () = sender.closed() => break "the client went away",
            Some((session, epoch, loss)) = losses.next() => {
                let Some(at) = owned.iter().position(|o| o.lease.session_id() == session && o.lease.epoch() == epoch) else {
                    continue;
                };
                let lost = owned.remove(at);
                sidecar.inner.end(session, epoch, loss);
                tracing::info!(stream, %session, %epoch, loss, "lost");
                // A broken journal with a valid lease: give the session up.
                tokio::spawn(async move {
                    let _ = lost.lease.release().await;
                    lost.journal.close().await;
                });
                let event = attach_response::Event::Lost(proto::Lost {
                    session: session.to_string(),
                    reason: loss.to_owned(),
                    epoch: epoch.get(),
                });
                if !send(&sender, event).await {
                    break "the client went away";
                }
            }
            Some((session, acquisition)) = acquisitions.next() => {
                let wanted = acquiring.remove(&session);
                let event = match acquisition {
                    Acquisition::Owned(session_owned) if !wanted => {
                        // Released while it was being acquired: let it go at once.
                        sidecar.inner.end(session, session_owned.lease.epoch(), "released");
                        release(session_owned).await;
                        continue;
                    }
                    Acquisition::Owned(session_owned) => {
                        let event = acquired(&session_owned);
                        losses.push(watch_loss(&session_owned));
                        sidecar.inner.own(session, session_owned.clone());
                        let epoch = session_owned.lease.epoch();
                        let tip_seq = session_owned.journal.next_seq().saturating_sub(1);
                        owned.push(session_owned);
                        tracing::info!(stream, %session, %epoch, tip_seq, "acquired");
                        event
                    }
                    Acquisition::Held { .. } | Acquisition::Failed(_) if !wanted => continue,
                    Acquisition::Held { epoch, node } => attach_response::Event::Held(proto::Held {
                        session: session.to_string(),
                        holder_epoch: epoch.get(),
                        holder_node: node,
                    }),
                    Acquisition::Failed(refusal) => {
                        tracing::info!(stream, %session, reason = refusal.reason, "acquisition failed");
                        attach_response::Event::Failed(proto::Failed {
                            session: session.to_string(),
                            reason: refusal.reason.unwrap_or("INVALID_ARGUMENT").to_owned(),
                            message: refusal.message,
                            retryable: refusal.code == tonic::Code::Unavailable,
                        })
                    }
                };
                if !send(&sender, event).await {
                    break "the client went away";
                }
            }
            request = requests.message() => {
                let request = match request {
                    Ok(Some(request)) => request,
                    Ok(None) => break "the client ended the stream",
                    Err(_) => break "the client's stream failed",
                };
                match request.request {
                    Some(attach_request::Request::Acquire(acquire)) => {
                        let session = match parse_session(&acquire.session) {
                            Ok(session) => session,
                            Err(refusal) => {
                                let _ = sender.send(Err(refusal.status())).await;
                                break "a malformed request";
                            }
                        };
                        if let Some(held) = owned.iter().find(|o| o.lease.session_id() == session) {
                            // Owned by this stream already: answered again.
                            if !send(&sender, acquired(held)).await {
                                break "the client went away";
                            }
                            continue;
                        }
                        if !acquiring.insert(session) {
                            continue;
                        }
                        let wait = acquire.wait.then(|| match acquire.wait_ms {
                            0 => Duration::MAX,
                            ms => Duration::from_millis(u64::from(ms)),
                        });
                        acquisitions.push(Box::pin(acquire_one(sidecar.clone(), stream, session, wait)));
                    }
                    Some(attach_request::Request::Release(release_request)) => {
                        let session = match parse_session(&release_request.session) {
                            Ok(session) => session,
                            Err(refusal) => {
                                let _ = sender.send(Err(refusal.status())).await;
                                break "a malformed request";
                            }
                        };
                        acquiring.remove(&session);
                        if let Some(at) = owned.iter().position(|o| o.lease.session_id() == session) {
                            let released = owned.remove(at);
                            sidecar.inner.end(session, released.lease.epoch(), "released");
                            tracing::info!(stream, %session, epoch = %released.lease.epoch(), "released");
                            release(released).await;
                        }
                        let event = attach_response::Event::Released(proto::Released {
                            session: session.to_string(),
                        });
                        if !send(&sender, event).await {
                            break "the client went away";
                        }
                    }
                    None => {
                        let refusal = Refusal::malformed("request", "an AttachRequest with neither acquire nor release");
                        let _ = sender.send(Err(refusal.status())).await;
                        break "a malformed request";
                    }
                }
            }
        }
    };
    // Every session at once: each release marks its lease lost before deleting its owner
    // key, so no instant has a successor owner while this stream's lease reads as valid.
    let count = owned.len();
    for session_owned in &owned {
        sidecar.inner.end(
            session_owned.lease.session_id(),
            session_owned.lease.epoch(),
            "released",
        );
    }
    futures_util::future::join_all(owned.into_iter().map(release)).await;
    // Acquisitions still running: their leases are released as they come.
    drop(acquisitions);
    tracing::info!(stream, %peer, released = count, why, "detached");
}

/// A stream open, in the streams gauge for as long as it lives.
struct Open(Metrics);

impl Open {
    fn new(metrics: Metrics) -> Self {
        metrics.sidecar_stream(1.0);
        Self(metrics)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.sidecar_stream(-1.0);
    }
}

/// Sends `event`; false once the client is gone.
async fn send(sender: &Sender, event: attach_response::Event) -> bool {
    sender
        .send(Ok(AttachResponse { event: Some(event) }))
        .await
        .is_ok()
}

/// Releases `owned`'s lease (which fences nothing: the next owner's fence does), then closes
/// its journal.
async fn release(owned: Arc<Owned>) {
    if let Err(error) = owned.lease.release().await {
        tracing::debug!(session = %owned.lease.session_id(), %error, "release deferred");
    }
    owned.journal.close().await;
}

/// Resolves with the session, its epoch and why, once its lease is lost or its journal broken.
fn watch_loss(owned: &Arc<Owned>) -> BoxFuture<'static, (Uuid, Epoch, &'static str)> {
    let owned = owned.clone();
    Box::pin(async move {
        let (session, epoch) = (owned.lease.session_id(), owned.lease.epoch());
        let lost = owned.lease.lost();
        tokio::select! {
            reason = lost => (session, epoch, loss_label(reason)),
            () = owned.journal.broken() => (session, epoch, "journal_broken"),
        }
    })
}

/// Acquires `session` (standing by for up to `wait`, if given) and opens its journal.
async fn acquire_one(
    sidecar: Sidecar,
    stream: u64,
    session: Uuid,
    wait: Option<Duration>,
) -> (Uuid, Acquisition) {
    let store = sidecar.inner.store.clone();
    let acquired = match wait {
        None => store.acquire_lease(session).await,
        Some(timeout) => {
            let stop = sidecar.inner.stop.clone();
            tokio::select! {
                acquired = store.acquire_lease_wait(session, timeout) => acquired,
                () = stop.cancelled() => Err(AcquireError::StoreClosed),
            }
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(AcquireError::Held(held)) => {
            let node = holder_node(&sidecar, session, held.holder_epoch).await;
            return (
                session,
                Acquisition::Held {
                    epoch: held.holder_epoch,
                    node,
                },
            );
        }
        // Moving to another node: refused as held, by nobody yet.
        Err(AcquireError::TimedOut { .. } | AcquireError::Moving { .. }) => {
            let holder = sidecar.owner(session).await.ok().flatten();
            let (epoch, node) = holder.unwrap_or((Epoch(0), String::new()));
            return (session, Acquisition::Held { epoch, node });
        }
        Err(error) => return (session, Acquisition::Failed(of_acquire(&error))),
    };
    let journal = match store.open_journal(session, Some(&lease)).await {
        Ok(journal) => journal,
        Err(error) => {
            tracing::info!(stream, %session, error = %crate::etcd::chain(&error), "the fence failed");
            let _ = lease.release().await;
            let refusal = match &error {
                crate::journal::OpenJournalError::Etcd(error) => Refusal::etcd(error),
                _ => Refusal::of_open(session, lease.epoch(), &error),
            };
            return (session, Acquisition::Failed(refusal));
        }
    };
    let owned = Owned {
        lease,
        journal,
        requests: Arc::new(Requests::default()),
    };
    (session, Acquisition::Owned(Arc::new(owned)))
}

/// The holder's node name, if its owner key still has `epoch`.
async fn holder_node(sidecar: &Sidecar, session: Uuid, epoch: Epoch) -> String {
    match sidecar.owner(session).await {
        Ok(Some((owner, node))) if owner == epoch => node,
        _ => String::new(),
    }
}

/// What a failed acquisition is for the client.
fn of_acquire(error: &AcquireError) -> Refusal {
    match error {
        AcquireError::Etcd(error) | AcquireError::OutcomeUnknown(error) => Refusal::etcd(error),
        AcquireError::NodeLeaseInvalid => {
            Refusal::unavailable("the sidecar's node lease is not valid; retry")
        }
        AcquireError::StoreClosed => Refusal::unavailable("the sidecar is shutting down"),
        AcquireError::Lost(reason) => Refusal::unavailable(format!(
            "the session was lost while it was acquired ({}); retry",
            loss_label(*reason)
        )),
        other => Refusal::unavailable(crate::etcd::chain(other)),
    }
}
