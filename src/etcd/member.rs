//! One endpoint of a [`Connection`](super::Connection): its unary client (replaced when an
//! attempt gets no answer), its client for long-lived streams and that client's token, and its
//! window of requests in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, KvClient};

use super::error::EtcdError;
use super::options::Credentials;

pub(super) struct Member {
    pub(super) endpoint: String,
    /// For unary requests: each bounded by the request timeout. Replaced by a fresh one
    /// (a new connection) when a write attempt gets no answer in time.
    pub(super) client: std::sync::Mutex<Unary>,
    /// For keepalive and watch streams, which live indefinitely: no request timeout.
    pub(super) streams: Client,
    /// When `streams` last authenticated (see [`StreamClient::ready`]).
    pub(super) stream_token: StreamToken,
    /// The unary requests this member may have in flight
    /// ([`ConnectOptions::max_in_flight`]); an attempt takes a permit before its timeout
    /// starts, and holds it until it is answered or has timed out.
    pub(super) window: tokio::sync::Semaphore,
    /// The window's size: its permits, whether taken or not.
    pub(super) window_size: AtomicUsize,
}

impl Member {
    pub(super) fn new(endpoint: String, client: Client, streams: Client, window: usize) -> Self {
        let window = window_size(window);
        Self {
            endpoint,
            client: std::sync::Mutex::new(Unary::new(client)),
            streams,
            stream_token: StreamToken::default(),
            window: tokio::sync::Semaphore::new(window),
            window_size: AtomicUsize::new(window),
        }
    }

    /// Makes the window `size` requests wide. Exact while no request is in flight; a permit
    /// taken now and not forgotten leaves the window that much wider.
    pub(super) fn resize_window(&self, size: usize) {
        let size = window_size(size);
        let was = self.window_size.swap(size, Ordering::AcqRel);
        if size > was {
            self.window.add_permits(size - was);
        } else {
            self.window.forget_permits(was - size);
        }
    }

    /// A place in this member's window, waiting at most `patience` while it is full; else the
    /// request fails unsent, for another endpoint or a later attempt to take.
    pub(super) async fn permit(
        &self,
        operation: &'static str,
        patience: Duration,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, EtcdError> {
        match tokio::time::timeout(patience, self.window.acquire()).await {
            Ok(permit) => Ok(permit.expect("a member's window is never closed")),
            Err(_) => Err(EtcdError::window_full(operation, &self.endpoint, patience)),
        }
    }
}

/// When a member's stream client last authenticated, shared by every opening on it; the lock
/// makes concurrent openings (hedged keepalive openings, a watch) share one authentication.
pub(super) type StreamToken = Arc<tokio::sync::Mutex<Option<tokio::time::Instant>>>;

/// How long a stream client's token is reused for new streams before it authenticates again.
/// Below etcd's shortest default token lifetime (5 minutes for simple tokens and JWTs); a token
/// that expired sooner (a shorter `--auth-token-ttl`) is refused at an opening, which makes
/// the next one authenticate ([`Connection::forget_stream_token`]).
pub(super) const STREAM_TOKEN_REUSE: Duration = Duration::from_secs(60);

/// A unary client, and whether it has authenticated (with credentials, it does so before its
/// first request; etcd-client then refreshes an expired token by itself).
pub(super) struct Unary {
    pub(super) client: Client,
    pub(super) authenticated: Arc<tokio::sync::OnceCell<()>>,
}

impl Unary {
    pub(super) fn new(client: Client) -> Self {
        Self {
            client,
            authenticated: Arc::new(tokio::sync::OnceCell::new()),
        }
    }
}

impl Member {
    /// `C` of the unary client, the client's authentication state, and (when `authenticate`
    /// and it has not authenticated yet) the whole client, to authenticate: all of the same
    /// client, which a reconnect may replace at any time.
    pub(super) fn unary<C: Part>(
        &self,
        authenticate: bool,
    ) -> (C, Arc<tokio::sync::OnceCell<()>>, Option<Client>) {
        let unary = crate::sync::lock(&self.client);
        let whole =
            (authenticate && !unary.authenticated.initialized()).then(|| unary.client.clone());
        (C::of(&unary.client), unary.authenticated.clone(), whole)
    }
}

/// A window of `size` requests, as a semaphore can hold it: at least 1.
pub(super) fn window_size(size: usize) -> usize {
    size.clamp(1, tokio::sync::Semaphore::MAX_PERMITS)
}

/// What a request is made with: the whole client, or only its KV part. An
/// `etcd_client::Client` is some 3.7 KiB (a client for every etcd service), its KV part 400
/// bytes; a request's future holds a copy, and futures are moved as they are awaited.
pub(crate) trait Part: Sized {
    /// This part of `client`.
    fn of(client: &Client) -> Self;
}

impl Part for Client {
    fn of(client: &Client) -> Self {
        client.clone()
    }
}

impl Part for KvClient {
    fn of(client: &Client) -> Self {
        client.kv_client()
    }
}

/// The client for a long-lived stream. A stream carries the token it was opened with, and a
/// watch opened with an expired one is cancelled; but authenticating costs the member a
/// bcrypt hash, and openings come often while a member is down (hedged every 250 ms, for every
/// node at once). So a member's stream token is reused for [`STREAM_TOKEN_REUSE`], and
/// forgotten as soon as etcd refuses a stream for it.
pub(crate) struct StreamClient {
    pub(super) client: Client,
    pub(super) credentials: Option<Arc<Credentials>>,
    pub(super) token: StreamToken,
}

impl StreamClient {
    /// The client, with a token when there are credentials: the member's current one, or a
    /// fresh one when it has none or it is older than [`STREAM_TOKEN_REUSE`].
    pub(crate) async fn ready(mut self) -> Result<Client, etcd_client::Error> {
        if let Some(credentials) = &self.credentials {
            let mut authenticated = self.token.lock().await;
            let fresh = authenticated.is_some_and(|at| at.elapsed() < STREAM_TOKEN_REUSE);
            if !fresh {
                *authenticated = None;
                self.client.update_user(Some(credentials.pair())).await?;
                *authenticated = Some(tokio::time::Instant::now());
            }
        }
        Ok(self.client)
    }
}
