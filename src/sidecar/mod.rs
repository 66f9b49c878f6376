//! The gRPC sidecar behind `leasehold serve`: fenced session journals for any language.
//!
//! One [`Sidecar`] holds one [`Store`] (one node lease, one keepalive stream, one owner watch)
//! for all of its clients, and serves the `leasehold.v1.Leasehold` service of
//! `proto/leasehold/v1/leasehold.proto` (the contract, documented field by field), with
//! `grpc.health.v1.Health` and server reflection beside it.
//!
//! - **Ownership is scoped to an `Attach` stream.** A session acquired through a stream is
//!   released when the stream ends, is cancelled, or its client stops answering HTTP/2
//!   keepalive pings ([`SidecarOptions::client_keepalive`]): every session it holds, at once,
//!   each in order (its journal closed, the appends under way finished, then its lease). A
//!   dead or frozen client never leaves an owner behind in the sidecar. An acquired session's
//!   journal is fenced before `Acquired` is sent.
//! - **Authority is the holder's, not the epoch's.** Each ownership has a token (128 bits from
//!   the operating system's CSPRNG, compared in constant time, never logged) sent only to the
//!   stream that acquired it; every write for the holder carries
//!   it, and a write without it writes nothing. Etcd's compare-and-swap refuses a stale owner
//!   besides. Appends of one session from many calls share transactions (group commit).
//! - **Exactly-once is decided by the journal.** An append's request id is written into its
//!   records ([`Journal::append_with_key`]); a retry is answered from the journal: by the live
//!   ownership's journal, or, for an ownership no longer live here, by reading the records
//!   ([`Store::find_append`]). Memory never decides an answer.
//! - **Everything a client controls is bounded** ([`SidecarOptions`]); a client that stops
//!   reading holds up nothing but itself.
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

mod append;
mod attach;
mod options;
mod owners;
pub(crate) mod refusal;
mod replay;
mod serve;
mod token;

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::Stream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::journal::Journal;
use crate::lease::{Epoch, Lease};
use crate::store::Store;
use proto::leasehold_server::{Leasehold, LeaseholdServer};
use proto::{
    AppendRequest, AppendResponse, AttachRequest, AttachResponse, DeleteRequest, DeleteResponse,
    OwnerChange, OwnerRequest, OwnerResponse, ReplayRequest, ReplayResponse, TrimRequest,
    TrimResponse, ValidateRequest, ValidateResponse, WatchOwnersRequest,
};
use refusal::Refusal;
use token::Token;

pub use options::SidecarOptions;
pub use refusal::{DOMAIN, REASONS};

/// How many ended ownerships (a session at an epoch, released or lost) the sidecar remembers
/// the loss reason of, to say why an append under one is refused.
const ENDED: usize = 10_000;

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
    /// The holder's authority to write.
    token: Token,
    /// Its place among the sessions the sidecar owns ([`SidecarOptions::max_sessions`]).
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl Owned {
    fn session(&self) -> Uuid {
        self.lease.session_id()
    }

    fn epoch(&self) -> Epoch {
        self.lease.epoch()
    }
}

struct Inner {
    store: Arc<Store>,
    options: SidecarOptions,
    sessions: Mutex<Sessions>,
    /// Cancelled by [`Sidecar::shutdown`]: every stream releases its sessions and ends.
    stop: CancellationToken,
    streams: TaskTracker,
    /// The bounds on what clients hold at once (see [`SidecarOptions`]).
    bounds: Bounds,
    /// The owner directory of `Owner` and `WatchOwners`, started by the first of them.
    directory: tokio::sync::OnceCell<crate::directory::OwnerDirectory>,
}

/// A semaphore per bound of [`SidecarOptions`] that counts what is held at once.
struct Bounds {
    streams: Arc<Semaphore>,
    sessions: Arc<Semaphore>,
    replays: Arc<Semaphore>,
    watches: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
}

impl Bounds {
    fn new(options: &SidecarOptions) -> Self {
        let permits = |n: usize| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)));
        Self {
            streams: permits(options.max_streams),
            sessions: permits(options.max_sessions),
            replays: permits(options.max_replays),
            watches: permits(options.max_watches),
            bytes: permits(options.max_bytes_in_flight),
        }
    }
}

/// Takes `n` places of `bound`, or refuses with `reason`, saying `what` is bounded by `flag`.
fn hold(
    bound: &Arc<Semaphore>,
    n: usize,
    reason: &'static str,
    what: &str,
) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    bound
        .clone()
        .try_acquire_many_owned(n)
        .map_err(|_| Refusal::exhausted(reason, format!("{what}: retry later")).status())
}

#[derive(Default)]
struct Sessions {
    owned: HashMap<Uuid, Arc<Owned>>,
    /// Ownerships that ended here and are being released: their journals answer what their
    /// appends came to until their owner keys are gone.
    releasing: HashMap<(Uuid, Epoch), Arc<Owned>>,
    /// The last [`ENDED`] ownerships that ended, by session and epoch, with why, oldest first
    /// in `ended_order`; and each of their sessions' newest ended epoch.
    ended: HashMap<(Uuid, Epoch), &'static str>,
    ended_order: VecDeque<(Uuid, Epoch)>,
    newest_ended: HashMap<Uuid, Epoch>,
    next_stream: u64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Sessions> {
        crate::sync::lock(&self.sessions)
    }

    /// Records `owned` as the session's owner here.
    fn own(&self, owned: Arc<Owned>) {
        if self.lock().owned.insert(owned.session(), owned).is_none() {
            self.store.metrics().sidecar_session(1.0);
        }
    }

    /// Records that `owned`'s ownership ended, for `loss`: no write is taken for it from now
    /// on, and its journal answers for its appends until [`released`](Self::released).
    fn end(&self, owned: &Arc<Owned>, loss: &'static str) {
        let (session, epoch) = (owned.session(), owned.epoch());
        let mut sessions = self.lock();
        if !sessions
            .owned
            .get(&session)
            .is_some_and(|held| Arc::ptr_eq(held, owned))
        {
            return;
        }
        sessions.owned.remove(&session);
        self.store.metrics().sidecar_session(-1.0);
        sessions.releasing.insert((session, epoch), owned.clone());
        sessions.ended.insert((session, epoch), loss);
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

    /// `owned`'s journal is closed and its lease released: the journal's records answer for
    /// its appends from now on.
    fn released(&self, owned: &Owned) {
        self.lock()
            .releasing
            .remove(&(owned.session(), owned.epoch()));
    }
}

/// Where a write under `(session, epoch)` stands here.
enum Standing {
    /// Owned at that epoch through a stream.
    Owned(Arc<Owned>),
    /// Ended at that epoch, and being released: refused, but its journal still answers for
    /// its appends.
    Releasing(Arc<Owned>, Refusal),
    /// Not owned here at that epoch.
    Refused(Refusal),
}

impl Sidecar {
    /// A sidecar over `store`. The store stays the caller's: close it after
    /// [`shutdown`](Self::shutdown).
    pub fn new(store: Arc<Store>, options: SidecarOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                bounds: Bounds::new(&options),
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

    /// Releases every session its clients own (each in order: its journal closed, the appends
    /// under way finished, then its lease), ends their streams, and waits for them.
    /// Idempotent.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        self.inner.streams.close();
        self.inner.streams.wait().await;
    }

    /// Where a write under `(session, epoch)` stands.
    fn standing(&self, session: Uuid, epoch: Epoch) -> Standing {
        let sessions = self.inner.lock();
        let newer = |owner: Option<Epoch>| owner.filter(|owner| *owner > epoch);
        let owner = sessions.owned.get(&session).map(|owned| owned.epoch());
        if let Some(owned) = sessions.owned.get(&session)
            && owned.epoch() == epoch
        {
            return Standing::Owned(owned.clone());
        }
        let refusal = match (sessions.ended.get(&(session, epoch)), newer(owner)) {
            (_, Some(owner)) => Refusal::fenced(session, epoch, Some(owner)),
            (Some(loss), None) => Refusal::lease_lost(session, epoch, loss),
            (None, None)
                if sessions
                    .newest_ended
                    .get(&session)
                    .is_some_and(|newest| *newest > epoch) =>
            {
                Refusal::fenced(session, epoch, None)
            }
            (None, None) => Refusal::not_owner(session, epoch, owner),
        };
        match sessions.releasing.get(&(session, epoch)) {
            Some(releasing) => Standing::Releasing(releasing.clone(), refusal),
            None => Standing::Refused(refusal),
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

    async fn trim(&self, request: Request<TrimRequest>) -> Result<Response<TrimResponse>, Status> {
        let answered = self.trim_call(request.into_inner()).await;
        self.record("trim", &answered);
        answered
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let answered = self.delete_call(request.into_inner()).await;
        self.record("delete", &answered);
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
        let open = hold(
            &self.inner.bounds.streams,
            1,
            "TOO_MANY_STREAMS",
            &format!(
                "{} Attach streams are open (--max-streams)",
                self.inner.options.max_streams
            ),
        )?;
        let peer = request.remote_addr();
        let requests = request.into_inner();
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let stream = {
            let mut sessions = self.inner.lock();
            sessions.next_stream += 1;
            sessions.next_stream
        };
        let run = attach::run(self.clone(), stream, peer, requests, sender);
        self.inner.streams.spawn(async move {
            run.await;
            drop(open);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    fn replay_call(
        &self,
        request: ReplayRequest,
    ) -> Result<Response<<Self as Leasehold>::ReplayStream>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let open = hold(
            &self.inner.bounds.replays,
            1,
            "TOO_MANY_REPLAYS",
            &format!(
                "{} Replay streams are open (--max-replays)",
                self.inner.options.max_replays
            ),
        )?;
        let store = self.inner.store.clone();
        let stop = self.inner.stop.clone();
        // Records wait for a slow client in its own stream's buffer: a page, then 8 records.
        let (sender, receiver) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            replay::replay(store, session, request, sender, stop).await;
            drop(open);
        });
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
