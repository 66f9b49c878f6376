//! The gRPC sidecar behind `leasehold serve`: fenced session journals for any language.
//!
//! One [`Sidecar`] holds one [`Store`] (one node lease, one keepalive stream, one owner watch)
//! for all of its clients, and serves the `leasehold.v1.Leasehold` service of
//! `proto/leasehold/v1/leasehold.proto` (the contract, documented field by field), with
//! `grpc.health.v1.Health` and server reflection beside it.
//!
//! - **Ownership is scoped to an `Attach` stream.** A session acquired through a stream is
//!   released when the stream ends, is cancelled, or its client stops answering HTTP/2
//!   keepalive pings ([`SidecarOptions::client_keepalive`]): every session it holds, at once.
//!   A dead or frozen client never leaves an owner behind in the sidecar. An acquired
//!   session's journal is fenced before `Acquired` is sent.
//! - **Appends carry `(session, epoch)`**, and the sidecar appends them only while it owns the
//!   session at that epoch through some stream; etcd's compare-and-swap refuses a stale owner
//!   besides. Appends of one session from many calls share transactions (group commit).
//! - **A request id makes a retry exactly-once** (see [`requests`]): the retry answers what
//!   the first call came to, or settles its unknown outcome by reading the record at the
//!   call's place, and never appends twice.
//! - **Errors** are gRPC codes with a `google.rpc.ErrorInfo` (domain `leasehold`); see the
//!   proto.

pub mod proto {
    //! The messages and service of `proto/leasehold/v1/leasehold.proto`, generated, with the
    //! client for Rust callers (`leasehold_client::LeaseholdClient`).
    #![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
    tonic::include_proto!("leasehold.v1");

    /// The encoded file descriptors of the proto, as server reflection serves them.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("leasehold_descriptor");
}

mod attach;
mod owners;
pub(crate) mod refusal;
mod replay;
pub mod requests;
mod settle;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::journal::Journal;
use crate::lease::{Epoch, Lease};
use crate::store::Store;
use proto::leasehold_server::{Leasehold, LeaseholdServer};
use proto::{
    AppendRequest, AppendResponse, AttachRequest, AttachResponse, OwnerChange, OwnerRequest,
    OwnerResponse, ReplayRequest, ReplayResponse, ValidateRequest, ValidateResponse,
    WatchOwnersRequest,
};
use refusal::Refusal;
use requests::{Begun, Outcome, Requests};

pub use refusal::DOMAIN;

/// How many ended ownerships (a session at an epoch, released or lost) the sidecar remembers,
/// with their loss reason and their requests: an append under such an epoch is refused
/// `LEASE_LOST`, and a retry of one of its requests still answers what it came to, whoever
/// owns the session since.
const ENDED: usize = 10_000;

/// How a [`Sidecar`] serves its clients.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SidecarOptions {
    /// The HTTP/2 keepalive ping interval, and how long a client may take to answer a ping:
    /// a client that does not answer in time has its connection closed, and the sessions of
    /// its `Attach` streams released. Default 2 s.
    pub client_keepalive: Duration,
}

impl Default for SidecarOptions {
    fn default() -> Self {
        Self {
            client_keepalive: Duration::from_secs(2),
        }
    }
}

impl SidecarOptions {
    /// Sets [`client_keepalive`](Self::client_keepalive).
    pub fn with_client_keepalive(mut self, keepalive: Duration) -> Self {
        self.client_keepalive = keepalive;
        self
    }
}

/// The sidecar: one store serving many clients over gRPC. Cheap to clone.
#[derive(Clone)]
pub struct Sidecar {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sidecar")
            .field("node", &self.inner.store.node())
            .field("owned", &self.inner.lock().owned.len())
            .finish()
    }
}

/// A session owned through one of the sidecar's streams.
pub(crate) struct Owned {
    lease: Lease,
    journal: Journal,
    requests: Arc<Requests>,
}

/// An ownership that ended here (released or lost): why, and its requests.
struct Ended {
    loss: &'static str,
    requests: Arc<Requests>,
}

struct Inner {
    store: Arc<Store>,
    options: SidecarOptions,
    sessions: Mutex<Sessions>,
    /// Cancelled by [`Sidecar::shutdown`]: every stream releases its sessions and ends.
    stop: CancellationToken,
    streams: TaskTracker,
    /// The owner directory of `Owner` and `WatchOwners`, started by the first of them.
    directory: tokio::sync::OnceCell<crate::directory::OwnerDirectory>,
}

#[derive(Default)]
struct Sessions {
    owned: HashMap<Uuid, Arc<Owned>>,
    /// The last [`ENDED`] ownerships that ended, by session and epoch, oldest first in
    /// `ended_order`; and each of their sessions' newest ended epoch.
    ended: HashMap<(Uuid, Epoch), Ended>,
    ended_order: VecDeque<(Uuid, Epoch)>,
    newest_ended: HashMap<Uuid, Epoch>,
    next_stream: u64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Sessions> {
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `owned` as the session's owner here.
    fn own(&self, session: Uuid, owned: Arc<Owned>) {
        if self.lock().owned.insert(session, owned).is_none() {
            self.store.metrics().sidecar_session(1.0);
        }
    }

    /// Records that `session`'s ownership at `epoch` ended, for `loss`.
    fn end(&self, session: Uuid, epoch: Epoch, loss: &'static str) {
        let mut sessions = self.lock();
        let Some(owned) = sessions.owned.get(&session) else {
            return;
        };
        if owned.lease.epoch() != epoch {
            return;
        }
        let owned = sessions.owned.remove(&session).expect("looked up above");
        self.store.metrics().sidecar_session(-1.0);
        let requests = owned.requests.clone();
        sessions
            .ended
            .insert((session, epoch), Ended { loss, requests });
        let newest = sessions.newest_ended.entry(session).or_insert(epoch);
        *newest = (*newest).max(epoch);
        sessions.ended_order.push_back((session, epoch));
        while sessions.ended_order.len() > ENDED {
            let Some((oldest, at)) = sessions.ended_order.pop_front() else {
                break;
            };
            sessions.ended.remove(&(oldest, at));
            if sessions.newest_ended.get(&oldest) == Some(&at) {
                sessions.newest_ended.remove(&oldest);
            }
        }
    }
}

/// Where an append under `(session, epoch)` stands here.
enum Standing {
    /// Owned at that epoch.
    Owned(Arc<Owned>),
    /// Ended at that epoch: refused, but its requests are remembered.
    Ended(Arc<Requests>, Refusal),
    /// Never owned here at that epoch.
    Refused(Refusal),
}

impl Sidecar {
    /// A sidecar over `store`. The store stays the caller's: close it after
    /// [`shutdown`](Self::shutdown).
    pub fn new(store: Arc<Store>, options: SidecarOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                options,
                sessions: Mutex::new(Sessions::default()),
                stop: CancellationToken::new(),
                streams: TaskTracker::new(),
                directory: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// The store it serves.
    pub fn store(&self) -> &Arc<Store> {
        &self.inner.store
    }

    /// How many sessions its clients own now.
    pub fn owned_sessions(&self) -> usize {
        self.inner.lock().owned.len()
    }

    /// The `leasehold.v1.Leasehold` service, to add to a tonic server of the caller's.
    pub fn service(&self) -> LeaseholdServer<Sidecar> {
        LeaseholdServer::new(self.clone())
            .max_decoding_message_size(4 * 1024 * 1024)
            .max_encoding_message_size(4 * 1024 * 1024)
    }

    /// Serves the service, health (`SERVING` only while the node lease is valid, for `""` and
    /// `leasehold.v1.Leasehold`) and reflection (v1 and v1alpha) on `incoming` until
    /// `shutdown` resolves; then [`shutdown`](Self::shutdown)s, releasing every attached
    /// session, and returns once every stream has ended.
    pub async fn serve<I, IO, IE>(
        &self,
        incoming: I,
        tls: Option<tonic::transport::ServerTlsConfig>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error>
    where
        I: Stream<Item = Result<IO, IE>> + Send,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let keepalive = self.inner.options.client_keepalive;
        let (reporter, health) = tonic_health::server::health_reporter();
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .expect("the generated descriptors are valid");
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .expect("the generated descriptors are valid");
        // Both names answer from the first connection on (never NOT_FOUND).
        let serving = self.inner.store.is_node_lease_valid();
        set_health(&reporter, serving).await;
        let reporting = tokio::spawn(report_health(
            self.inner.store.clone(),
            reporter,
            serving,
            self.inner.stop.clone(),
        ));
        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive))
            .http2_keepalive_timeout(Some(keepalive));
        if let Some(tls) = tls {
            builder = builder.tls_config(tls)?;
        }
        let stop = self.inner.stop.clone();
        let this = self.clone();
        let served = builder
            .add_service(health)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(self.service())
            .serve_with_incoming_shutdown(incoming, async move {
                tokio::select! {
                    () = shutdown => {}
                    () = stop.cancelled() => {}
                }
                // Streams end once their sessions are released; then the server stops.
                this.shutdown().await;
            })
            .await;
        reporting.abort();
        served
    }

    /// [`serve`](Self::serve) on a TCP listener, each connection with `TCP_NODELAY` (without
    /// it, a small reply waits for the client's delayed ACK: some 40 ms on Linux).
    pub async fn serve_tcp(
        &self,
        listener: tokio::net::TcpListener,
        tls: Option<tonic::transport::ServerTlsConfig>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        use futures_util::StreamExt as _;
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
            let stream = accepted?;
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(stream)
        });
        self.serve(incoming, tls, shutdown).await
    }

    /// Releases every session its clients own, ends their streams, and waits for them.
    /// Idempotent.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        self.inner.streams.close();
        self.inner.streams.wait().await;
    }

    /// Where an append under `(session, epoch)` stands.
    fn standing(&self, session: Uuid, epoch: Epoch) -> Standing {
        let sessions = self.inner.lock();
        if let Some(ended) = sessions.ended.get(&(session, epoch)) {
            // Its remembered requests answer their retries; anything else is refused, FENCED
            // if the session has a newer owner here.
            let newer = sessions
                .owned
                .get(&session)
                .map(|owned| owned.lease.epoch())
                .filter(|owner| *owner > epoch);
            let refusal = match newer {
                Some(owner) => Refusal::fenced(session, epoch, Some(owner)),
                None => Refusal::lease_lost(session, epoch, ended.loss),
            };
            return Standing::Ended(ended.requests.clone(), refusal);
        }
        if let Some(owned) = sessions.owned.get(&session) {
            let owner = owned.lease.epoch();
            if owner == epoch {
                return Standing::Owned(owned.clone());
            }
            if owner > epoch {
                return Standing::Refused(Refusal::fenced(session, epoch, Some(owner)));
            }
            return Standing::Refused(Refusal::not_owner(session, epoch, Some(owner)));
        }
        if sessions
            .newest_ended
            .get(&session)
            .is_some_and(|newest| *newest > epoch)
        {
            return Standing::Refused(Refusal::fenced(session, epoch, None));
        }
        Standing::Refused(Refusal::not_owner(session, epoch, None))
    }

    /// Appends `payloads` to `owned`'s journal: the outcome to remember.
    async fn append_to(owned: &Owned, payloads: &[Vec<u8>]) -> Outcome {
        let (session, epoch) = (owned.lease.session_id(), owned.lease.epoch());
        match owned.journal.append_batch_placed(payloads).await {
            (Ok(appended), _) => Outcome::Appended(AppendResponse {
                first_seq: appended.first_seq,
                last_seq: appended.last_seq,
                revision: appended.revision,
            }),
            (
                Err(crate::journal::JournalWriteError::OutcomeUnknown(_)),
                Some((first_seq, last_seq)),
            ) => Outcome::Unknown {
                first_seq,
                last_seq,
            },
            (Err(error), _) => Outcome::Refused(Refusal::of_append(session, epoch, &error)),
        }
    }
}

/// Parses a session id: INVALID_ARGUMENT with a `BadRequest` if it is not a UUID.
fn parse_session(text: &str) -> Result<Uuid, Refusal> {
    text.parse().map_err(|error| {
        Refusal::malformed(
            "session",
            format!("session {text:?} is not a UUID: {error}"),
        )
    })
}

/// Keeps the health service's answer in step with the node lease: `SERVING` while it is
/// valid, `NOT_SERVING` otherwise.
async fn report_health(
    store: Arc<Store>,
    reporter: tonic_health::server::HealthReporter,
    mut serving: bool,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = stop.cancelled() => {
                set_health(&reporter, false).await;
                return;
            }
        }
        let now = store.is_node_lease_valid();
        if now != serving {
            set_health(&reporter, now).await;
            serving = now;
        }
    }
}

/// `SERVING` or `NOT_SERVING`, for the server as a whole (`""`) and for the service.
async fn set_health(reporter: &tonic_health::server::HealthReporter, serving: bool) {
    let status = if serving {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status("leasehold.v1.Leasehold", status)
        .await;
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Leasehold for Sidecar {
    type AttachStream = BoxStream<AttachResponse>;
    type ReplayStream = BoxStream<ReplayResponse>;
    type WatchOwnersStream = BoxStream<OwnerChange>;

    async fn attach(
        &self,
        request: Request<tonic::Streaming<AttachRequest>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let answered = self.attach_call(request);
        self.record("attach", &answered);
        answered
    }

    async fn append(
        &self,
        request: Request<AppendRequest>,
    ) -> Result<Response<AppendResponse>, Status> {
        let answered = self.append_call(request.into_inner()).await;
        self.record("append", &answered);
        answered
    }

    async fn replay(
        &self,
        request: Request<ReplayRequest>,
    ) -> Result<Response<Self::ReplayStream>, Status> {
        let answered = self.replay_call(request.into_inner());
        self.record("replay", &answered);
        answered
    }

    async fn validate(
        &self,
        request: Request<ValidateRequest>,
    ) -> Result<Response<ValidateResponse>, Status> {
        let answered = self.validate_call(request.into_inner()).await;
        self.record("validate", &answered);
        answered
    }

    async fn owner(
        &self,
        request: Request<OwnerRequest>,
    ) -> Result<Response<OwnerResponse>, Status> {
        let answered = self.owner_call(request.into_inner()).await;
        self.record("owner", &answered);
        answered
    }

    async fn watch_owners(
        &self,
        request: Request<WatchOwnersRequest>,
    ) -> Result<Response<Self::WatchOwnersStream>, Status> {
        let answered = self.watch_owners_call(request.into_inner()).await;
        self.record("watch_owners", &answered);
        answered
    }
}

impl Sidecar {
    /// Counts a call of `rpc` under the code it was answered with.
    fn record<T>(&self, rpc: &'static str, answered: &Result<T, Status>) {
        let code = answered
            .as_ref()
            .map_or_else(Status::code, |_| tonic::Code::Ok);
        let metrics = self.inner.store.metrics();
        metrics.sidecar_call(rpc, refusal::code_label(code));
    }

    fn attach_call(
        &self,
        request: Request<tonic::Streaming<AttachRequest>>,
    ) -> Result<Response<<Self as Leasehold>::AttachStream>, Status> {
        if self.inner.stop.is_cancelled() {
            return Err(Status::unavailable("the sidecar is shutting down"));
        }
        let peer = request.remote_addr();
        let requests = request.into_inner();
        let (sender, receiver) = mpsc::channel(64);
        let stream = {
            let mut sessions = self.inner.lock();
            sessions.next_stream += 1;
            sessions.next_stream
        };
        self.inner
            .streams
            .spawn(attach::run(self.clone(), stream, peer, requests, sender));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn append_call(
        &self,
        request: AppendRequest,
    ) -> Result<Response<AppendResponse>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let epoch = Epoch(request.epoch);
        let (owned, requests) = match self.standing(session, epoch) {
            Standing::Owned(owned) => {
                let requests = owned.requests.clone();
                (Some(owned), Some(requests))
            }
            Standing::Ended(requests, refusal) => {
                if request.request_id.is_empty() {
                    return Err(refusal.status());
                }
                // A retry of a request made while the session was owned is still answered.
                let _ = refusal;
                (None, Some(requests))
            }
            Standing::Refused(refusal) => return Err(refusal.status()),
        };
        let answer = |outcome: Outcome| match outcome {
            Outcome::Appended(response) => Ok(Response::new(response)),
            Outcome::Refused(refusal) => Err(refusal.status()),
            Outcome::Unknown { .. } => Err(Refusal::outcome_unknown(
                session,
                epoch,
                "the transaction's outcome stayed unknown",
            )
            .status()),
        };
        let (Some(requests), false) = (requests, request.request_id.is_empty()) else {
            let owned = owned.expect("a session without requests is owned");
            return answer(Self::append_to(&owned, &request.payloads).await);
        };
        let id = request.request_id.as_str();
        let mut retry = false;
        let first = match requests.begin(id, requests::digest(&request.payloads)) {
            Begun::Reused => return Err(Refusal::reused(id).status()),
            Begun::First(sender) => {
                let Some(owned) = owned else {
                    // Ended, and this id was never seen: not appended.
                    let refusal = match self.standing(session, epoch) {
                        Standing::Ended(_, refusal) | Standing::Refused(refusal) => refusal,
                        Standing::Owned(_) => Refusal::not_owner(session, epoch, None),
                    };
                    requests.finish(&sender, Outcome::Refused(refusal.clone()));
                    return Err(refusal.status());
                };
                // On a task of its own: a caller that goes away (its deadline passed, its
                // connection closed) does not take the outcome with it, and its retry finds it.
                let outcome = sender.subscribe();
                let (requests, payloads) = (requests.clone(), request.payloads);
                tokio::spawn(async move {
                    let appended = Self::append_to(&owned, &payloads).await;
                    requests.finish(&sender, appended);
                });
                outcome
            }
            Begun::Retry(first) => {
                retry = true;
                first
            }
        };
        let Some(outcome) = requests::outcome_of(first).await else {
            // Only a runtime shutting down drops the task before it finishes.
            return Err(
                Refusal::outcome_unknown(session, epoch, "the sidecar is shutting down").status(),
            );
        };
        let (outcome, how) = match outcome {
            Outcome::Unknown {
                first_seq,
                last_seq,
            } => {
                let (settled, fin) = self.settle(session, epoch, (first_seq, last_seq)).await;
                if fin {
                    requests.settled(id, settled.clone());
                }
                (settled, if fin { "settled" } else { "unknown" })
            }
            outcome => (outcome, "remembered"),
        };
        if retry {
            self.inner.store.metrics().sidecar_retry(how);
        }
        answer(outcome)
    }

    fn replay_call(
        &self,
        request: ReplayRequest,
    ) -> Result<Response<<Self as Leasehold>::ReplayStream>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let store = self.inner.store.clone();
        let stop = self.inner.stop.clone();
        let (sender, receiver) = mpsc::channel(64);
        tokio::spawn(replay::replay(store, session, request, sender, stop));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn validate_call(
        &self,
        request: ValidateRequest,
    ) -> Result<Response<ValidateResponse>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let owner = self.owner(session).await.map_err(|r| r.status())?;
        let owner_epoch = owner.map_or(0, |(epoch, _)| epoch.get());
        Ok(Response::new(ValidateResponse {
            current: owner_epoch != 0 && owner_epoch == request.epoch,
            owner_epoch,
        }))
    }
}
