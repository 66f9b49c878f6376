//! One `Attach` stream: the sessions it owns, for as long as it lasts.
//!
//! The stream's task reads the client's requests, runs its acquisitions (each on its own, so
//! that a standby never holds up a release), watches each owned lease, and answers on the
//! response stream. When the client's side ends (closed, cancelled, or its connection closed
//! for unanswered keepalive pings), the client stops reading for
//! [`stalled_reader`](super::SidecarOptions::stalled_reader), or the sidecar shuts down, it
//! releases every session it owns, all at once, each in order: its journal closed (the appends
//! under way finish), then its lease.

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
use super::refusal::{JOURNAL_BROKEN, Refusal, loss_label};
use super::token::Token;
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

/// Why a stream ends.
type Ended = &'static str;

/// The `Acquired` event of a session this stream owns: its epoch, the fence's place, how long
/// its lease stays valid from now without a renewal, and its token.
fn acquired(owned: &Owned) -> attach_response::Event {
    let valid_for = owned
        .lease
        .state()
        .node
        .valid_until()
        .saturating_duration_since(crate::clock::now());
    attach_response::Event::Acquired(proto::Acquired {
        session: owned.session().to_string(),
        epoch: owned.epoch().get(),
        tip_seq: owned.journal.next_seq().saturating_sub(1),
        valid_for_ms: u32::try_from(valid_for.as_millis()).unwrap_or(u32::MAX),
        token: owned.token.to_vec(),
    })
}

/// One stream's state: what it owns and is acquiring, and where its answers go.
struct Stream {
    sidecar: Sidecar,
    id: u64,
    sender: Sender,
    /// Owned sessions, in the order they were acquired.
    owned: Vec<Arc<Owned>>,
    acquiring: HashSet<Uuid>,
    acquisitions: FuturesUnordered<BoxFuture<'static, (Uuid, Acquisition)>>,
    losses: FuturesUnordered<BoxFuture<'static, (Arc<Owned>, &'static str)>>,
}

/// Runs stream `id` until its client's side ends or the sidecar shuts down.
pub(super) async fn run(
    sidecar: Sidecar,
    id: u64,
    peer: Option<SocketAddr>,
    mut requests: tonic::Streaming<AttachRequest>,
    sender: Sender,
) {
    let peer = peer.map_or_else(|| "local".to_owned(), |peer| peer.to_string());
    tracing::info!(stream = id, %peer, "attached");
    let _open = Open::new(sidecar.inner.store.metrics().clone());
    let stop = sidecar.inner.stop.clone();
    let mut stream = Stream {
        sidecar,
        id,
        sender,
        owned: Vec::new(),
        acquiring: HashSet::new(),
        acquisitions: FuturesUnordered::new(),
        losses: FuturesUnordered::new(),
    };
    let why = loop {
        let step = tokio::select! {
            biased;
            () = stop.cancelled() => Err("the sidecar is shutting down"),
            () = stream.sender.closed() => Err("the client went away"),
            Some((owned, loss)) = stream.losses.next() => stream.lost(owned, loss).await,
            Some((session, acquisition)) = stream.acquisitions.next() => {
                stream.acquired(session, acquisition).await
            }
            request = requests.message() => match request {
                Ok(Some(request)) => stream.request(request).await,
                Ok(None) => Err("the client ended the stream"),
                Err(_) => Err("the client's stream failed"),
            },
        };
        if let Err(why) = step {
            break why;
        }
    };
    let released = stream.release_all().await;
    tracing::info!(stream = id, %peer, released, why, "detached");
}

impl Stream {
    /// Sends `event`; ends the stream once the client is gone or has stopped reading.
    async fn send(&mut self, event: attach_response::Event) -> Result<(), Ended> {
        let message = Ok(AttachResponse { event: Some(event) });
        self.send_message(message).await
    }

    async fn send_message(&mut self, message: Result<AttachResponse, Status>) -> Result<(), Ended> {
        let stalled = self.sidecar.inner.options.stalled_reader;
        tokio::select! {
            sent = self.sender.send(message) => sent.map_err(|_| "the client went away"),
            () = tokio::time::sleep(stalled) => Err("the client stopped reading its stream"),
            () = self.sidecar.inner.stop.cancelled() => Err("the sidecar is shutting down"),
        }
    }

    /// Ends the stream with a malformed request's status.
    async fn malformed(&mut self, refusal: Refusal) -> Result<(), Ended> {
        let _ = self.send_message(Err(refusal.status())).await;
        Err("a malformed request")
    }

    async fn request(&mut self, request: AttachRequest) -> Result<(), Ended> {
        match request.request {
            Some(attach_request::Request::Acquire(acquire)) => {
                match parse_session(&acquire.session) {
                    Ok(session) => self.acquire(session, &acquire).await,
                    Err(refusal) => self.malformed(refusal).await,
                }
            }
            Some(attach_request::Request::Release(release)) => {
                match parse_session(&release.session) {
                    Ok(session) => self.release(session).await,
                    Err(refusal) => self.malformed(refusal).await,
                }
            }
            None => {
                let refusal = Refusal::malformed(
                    "request",
                    "an AttachRequest with neither acquire nor release",
                );
                self.malformed(refusal).await
            }
        }
    }

    async fn acquire(&mut self, session: Uuid, acquire: &proto::Acquire) -> Result<(), Ended> {
        if let Some(held) = self.owned.iter().find(|o| o.session() == session) {
            // Owned by this stream already: answered again.
            return self.send(acquired(held)).await;
        }
        if self.acquiring.contains(&session) {
            return Ok(());
        }
        let max = self.sidecar.inner.options.max_sessions_per_stream;
        if self.owned.len() + self.acquiring.len() >= max {
            let event = attach_response::Event::Failed(proto::Failed {
                session: session.to_string(),
                reason: "TOO_MANY_SESSIONS".to_owned(),
                message: format!(
                    "this stream owns or acquires {max} sessions already \
                     (--max-sessions-per-stream): release one, or attach another stream"
                ),
                retryable: false,
            });
            return self.send(event).await;
        }
        let inner = &self.sidecar.inner;
        let Ok(place) = inner.bounds.sessions.clone().try_acquire_owned() else {
            let event = attach_response::Event::Failed(proto::Failed {
                session: session.to_string(),
                reason: "TOO_MANY_SESSIONS".to_owned(),
                message: format!(
                    "the sidecar's streams own or acquire {} sessions already (--max-sessions): \
                     retry once some are released",
                    inner.options.max_sessions
                ),
                retryable: true,
            });
            return self.send(event).await;
        };
        self.acquiring.insert(session);
        let wait = acquire.wait.then(|| match acquire.wait_ms {
            0 => Duration::MAX,
            ms => Duration::from_millis(u64::from(ms)),
        });
        let acquisition = acquire_one(self.sidecar.clone(), self.id, session, wait, place);
        self.acquisitions.push(Box::pin(acquisition));
        Ok(())
    }

    async fn acquired(&mut self, session: Uuid, acquisition: Acquisition) -> Result<(), Ended> {
        let wanted = self.acquiring.remove(&session);
        let event = match acquisition {
            Acquisition::Owned(owned) if !wanted => {
                // Released while it was being acquired: let it go at once.
                release(&self.sidecar, owned, "released").await;
                return Ok(());
            }
            Acquisition::Owned(owned) => {
                let event = acquired(&owned);
                self.losses.push(watch_loss(&owned));
                self.sidecar.inner.own(owned.clone());
                let (epoch, tip_seq) = (owned.epoch(), owned.journal.next_seq() - 1);
                tracing::info!(stream = self.id, %session, %epoch, tip_seq, "acquired");
                self.owned.push(owned);
                event
            }
            Acquisition::Held { .. } | Acquisition::Failed(_) if !wanted => return Ok(()),
            Acquisition::Held { epoch, node } => attach_response::Event::Held(proto::Held {
                session: session.to_string(),
                holder_epoch: epoch.get(),
                holder_node: node,
            }),
            Acquisition::Failed(refusal) => {
                tracing::info!(stream = self.id, %session, reason = refusal.reason, "acquisition failed");
                attach_response::Event::Failed(proto::Failed {
                    session: session.to_string(),
                    reason: refusal.reason.unwrap_or("INVALID_ARGUMENT").to_owned(),
                    message: refusal.message,
                    retryable: refusal.code == tonic::Code::Unavailable,
                })
            }
        };
        self.send(event).await
    }

    async fn release(&mut self, session: Uuid) -> Result<(), Ended> {
        self.acquiring.remove(&session);
        if let Some(at) = self.owned.iter().position(|o| o.session() == session) {
            let owned = self.owned.remove(at);
            tracing::info!(stream = self.id, %session, epoch = %owned.epoch(), "released");
            release(&self.sidecar, owned, "released").await;
        }
        let event = attach_response::Event::Released(proto::Released {
            session: session.to_string(),
        });
        self.send(event).await
    }

    /// `owned`'s lease was lost, or its journal broke (with a valid lease): give it up.
    async fn lost(&mut self, owned: Arc<Owned>, loss: &'static str) -> Result<(), Ended> {
        let Some(at) = self.owned.iter().position(|o| Arc::ptr_eq(o, &owned)) else {
            return Ok(());
        };
        self.owned.remove(at);
        let (session, epoch) = (owned.session(), owned.epoch());
        tracing::info!(stream = self.id, %session, %epoch, loss, "lost");
        // Not awaited: the client hears of the loss at once.
        tokio::spawn(release(&self.sidecar, owned, loss));
        let event = attach_response::Event::Lost(proto::Lost {
            session: session.to_string(),
            reason: loss.to_owned(),
            epoch: epoch.get(),
        });
        self.send(event).await
    }

    /// Releases every session the stream owns, all at once; how many.
    async fn release_all(self) -> usize {
        let count = self.owned.len();
        let sidecar = &self.sidecar;
        // Each release marks its ownership ended before anything else: no write is taken for
        // it from then on.
        let releases = self
            .owned
            .into_iter()
            .map(|owned| release(sidecar, owned, "released"));
        futures_util::future::join_all(releases).await;
        // Acquisitions still running: their leases are released as they come.
        drop(self.acquisitions);
        count
    }
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

/// Ends `owned`'s ownership here (for `loss`), then releases it in order: its journal closed
/// (the appends under way finish), then its lease (which fences nothing: the next owner's
/// fence does).
fn release(sidecar: &Sidecar, owned: Arc<Owned>, loss: &'static str) -> BoxFuture<'static, ()> {
    sidecar.inner.end(&owned, loss);
    let sidecar = sidecar.clone();
    Box::pin(async move {
        owned.journal.close().await;
        if let Err(error) = owned.lease.release().await {
            tracing::debug!(session = %owned.session(), %error, "release deferred");
        }
        sidecar.inner.released(&owned);
    })
}

/// Resolves with the ownership and why, once its lease is lost or its journal broken.
fn watch_loss(owned: &Arc<Owned>) -> BoxFuture<'static, (Arc<Owned>, &'static str)> {
    let owned = owned.clone();
    Box::pin(async move {
        let loss = tokio::select! {
            reason = owned.lease.lost() => loss_label(reason),
            () = owned.journal.broken() => JOURNAL_BROKEN,
        };
        (owned, loss)
    })
}

/// Acquires `session` (standing by for up to `wait`, if given) and opens its journal.
async fn acquire_one(
    sidecar: Sidecar,
    stream: u64,
    session: Uuid,
    wait: Option<Duration>,
    place: tokio::sync::OwnedSemaphorePermit,
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
        token: Token::new(),
        _place: place,
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
