//! [`Connection`]: a connection to an etcd cluster that fails over between endpoints.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, KvClient};
use tokio::time::Instant;

use super::connect::{ConnectError, MemberStatus, closed_without_a_reason, tls_probe, warn_if_old};
use super::error::{EtcdError, FailureClass};
use super::member::{Member, Part, StreamClient, Unary};
use super::options::{ConnectOptions, Credentials, RetryPolicy, TlsOptions};
use crate::backoff::Backoff;
use crate::deadline::deadline;

/// The keys [`Connection::delete_prefix`] deletes per request: a page read with keys only is at
/// most about 1 MiB for keys of 200 bytes, and etcd applies the delete well within a request
/// timeout.
const DELETE_PAGE: usize = 5_000;

/// A connection to one etcd cluster, failing over between its endpoints; cheap to clone.
///
/// etcd-client balances one channel over all endpoints but never fails over: with one member
/// down, about one call in N fails with `Unavailable`, and nothing retries it. [`Connection`]
/// keeps one client per endpoint instead and applies a [`RetryPolicy`]:
///
/// - **Idempotent requests** (reads, and the re-opening of keepalive and watch streams) are
///   retried on the next endpoint after any failure that is not [`Permanent`], with exponential
///   backoff after each full round of endpoints, until the policy's deadline.
/// - **Writes are never retried blindly.** A write is sent again only when the failure proves it
///   had no effect ([`NotSent`]: no connection could be made; [`Rejected`]: e.g. "no leader").
///   An [`OutcomeUnknown`] failure is returned to the caller, who must resolve it (the journal
///   does so by re-sending the byte-identical transaction).
///
/// The endpoint that last answered is preferred for the next request, so a dead member costs
/// one failed attempt, not one in N.
///
/// [`Permanent`]: crate::FailureClass::Permanent
/// [`NotSent`]: crate::FailureClass::NotSent
/// [`Rejected`]: crate::FailureClass::Rejected
/// [`OutcomeUnknown`]: crate::FailureClass::OutcomeUnknown
#[derive(Clone)]
pub struct Connection {
    members: Arc<[Member]>,
    preferred: Arc<AtomicUsize>,
    retry: RetryPolicy,
    /// How unary clients are built (for replacing one); `None` for a client the user built,
    /// which is used as it is.
    client_options: Option<etcd_client::ConnectOptions>,
    /// Who the clients authenticate as.
    credentials: Option<Arc<Credentials>>,
    /// The member that answered the first status request, if one was made.
    answered: Option<Arc<MemberStatus>>,
    /// How long one attempt of a request made through [`call`](Self::call) may take, whatever
    /// client it goes through (a client built by the user may have no timeout of its own).
    request_timeout: Duration,
}

/// The request timeout of a connection through a client the user built, until
/// [`Connection::with_request_timeout`] sets another: the same as [`ConnectOptions::new`]'s.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("endpoints", &self.endpoints())
            .field("retry", &self.retry)
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl Connection {
    /// Connects to the cluster and checks that at least one endpoint answers (a `status`
    /// request, retried within the policy's deadline).
    pub async fn connect(options: ConnectOptions) -> Result<Self, ConnectError> {
        if options.endpoints.is_empty() {
            return Err(ConnectError::NoEndpoints);
        }
        // The TLS options and credentials show no key and no password.
        tracing::debug!(?options, "connecting to etcd");
        let stream_options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            // HTTP/2 pings find dead connections; etcd drops clients that ping more often than
            // every 5 s (`--grpc-keepalive-min-time`). Only while a request or stream is open:
            // etcd takes a ping on a connection with none for a strike, and closes the
            // connection (`GOAWAY too_many_pings`) after the third, about 40 s into idleness
            // (tests/connection_idle_pings.rs). An idle connection needs no pings: each
            // request is bounded by its timeout, and one that gets no answer reconnects.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(false)
            // A member cut off from the leader fails fast with "no leader" (definitely not
            // applied) instead of stalling, and cancels watches rather than starving them.
            .with_require_leader(true)
            // With credentials: a token etcd no longer accepts is replaced and the request
            // sent again (it was refused, so it was not applied).
            .with_auto_token_refresh(options.credentials.is_some());
        let stream_options = match &options.tls {
            Some(tls) => stream_options.with_tls(tls.to_etcd()),
            None => stream_options,
        };
        let client_options = stream_options.clone().with_timeout(options.request_timeout);
        let mut members = Vec::with_capacity(options.endpoints.len());
        for endpoint in &options.endpoints {
            // etcd-client dials lazily: this validates the URL and opens nothing yet. The
            // credentials are not given here (etcd-client would authenticate at once, and a
            // member that is down would fail the connect): each client authenticates before its
            // first request instead.
            let invalid = |source| ConnectError::InvalidEndpoint {
                endpoint: endpoint.clone(),
                source,
            };
            let client = Client::connect([endpoint.as_str()], Some(client_options.clone()))
                .await
                .map_err(invalid)?;
            let streams = Client::connect([endpoint.as_str()], Some(stream_options.clone()))
                .await
                .map_err(invalid)?;
            members.push(Member::new(
                endpoint.clone(),
                client,
                streams,
                options.max_in_flight,
            ));
        }
        let connection = Self {
            members: members.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            retry: options.retry,
            client_options: Some(client_options),
            credentials: options.credentials.map(Arc::new),
            answered: None,
            request_timeout: options.request_timeout,
        };
        let connection = connection
            .answering(
                options.endpoints.join(","),
                options.tls.as_ref(),
                options.connect_timeout,
            )
            .await?;
        if options.version_warning {
            connection.warn_if_old();
        }
        Ok(connection)
    }

    /// A connection to `endpoint` that has dialled nothing yet (etcd-client dials lazily),
    /// for unit tests that never send.
    #[cfg(test)]
    pub(crate) async fn unconnected(endpoint: &str) -> Self {
        let client = Client::connect([endpoint], None)
            .await
            .expect("etcd-client dials lazily");
        Self::through(endpoint.to_owned(), client, RetryPolicy::default())
    }

    /// A connection through `client`, an `etcd_client::Client` you built yourself (your own
    /// TLS, interceptors or authentication), checked like [`connect`](Self::connect)'s. It
    /// counts as one endpoint: etcd-client balances it over the members it was given, and no
    /// request fails over to another client. leasehold never replaces it, and authenticates
    /// nothing (the client carries its own credentials).
    ///
    /// Every request leasehold makes through it is bounded by leasehold itself: each attempt
    /// of a read or a write by the request timeout (5 s, or
    /// [`with_request_timeout`](Self::with_request_timeout)), writes by the
    /// [`WritePolicy`](crate::WritePolicy), reads by the retry policy's deadline, stream
    /// openings by their own timeouts. A timeout set on the client with etcd-client's
    /// `with_timeout` bounds its requests too (the shorter wins); it is not needed.
    pub async fn from_client(client: Client, retry: RetryPolicy) -> Result<Self, ConnectError> {
        let endpoint = "your etcd client".to_owned();
        Self::through(endpoint.clone(), client, retry)
            .answering(endpoint, None, Duration::from_secs(3))
            .await
    }

    /// A connection through `client` alone, named `endpoint`, not yet checked.
    fn through(endpoint: String, client: Client, retry: RetryPolicy) -> Self {
        Self {
            members: vec![Member::new(
                endpoint,
                client.clone(),
                client,
                ConnectOptions::DEFAULT_MAX_IN_FLIGHT,
            )]
            .into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            retry,
            client_options: None,
            credentials: None,
            answered: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// Sets how many unary requests may be in flight on one endpoint's connection at once
    /// ([`ConnectOptions::max_in_flight`]; 0 counts as 1), for this connection and its clones.
    /// Meant for a connection being built (as [`from_client`](Self::from_client)'s is):
    /// requests in flight meanwhile may leave the window wider than asked.
    pub fn with_max_in_flight(self, requests: usize) -> Self {
        for member in self.members.iter() {
            member.resize_window(requests);
        }
        self
    }

    /// Sets how long one attempt of a request may take before it fails as outcome unknown
    /// (a read is then retried, within the retry policy's deadline; a write is not).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// This connection, once some endpoint has answered a `status` request (retried within the
    /// policy's deadline); else why none did.
    async fn answering(
        self,
        endpoints: String,
        tls: Option<&TlsOptions>,
        connect_timeout: Duration,
    ) -> Result<Self, ConnectError> {
        let connection = self;
        // Bounded by the retry deadline also when an endpoint accepts connections and then
        // says nothing (a blackhole), where each attempt would wait for the request timeout.
        let deadline = connection.retry.deadline;
        let answered = tokio::time::timeout(deadline, connection.status())
            .await
            .unwrap_or_else(|_| Err(EtcdError::timed_out("status", &endpoints, deadline)));
        let source = match answered {
            Ok(member) => {
                return Ok(Self {
                    answered: Some(Arc::new(member)),
                    ..connection
                });
            }
            Err(source) => source,
        };
        let source = match tls {
            Some(tls) if closed_without_a_reason(&source) => {
                tls_probe::refusal(source.endpoint(), tls, connect_timeout)
                    .await
                    .unwrap_or(source)
            }
            _ => source,
        };
        Err(if source.is_tls() {
            ConnectError::Tls { endpoints, source }
        } else if source.is_auth_failed() || source.is_permission_denied() {
            ConnectError::Refused { endpoints, source }
        } else {
            ConnectError::Unreachable { endpoints, source }
        })
    }

    /// Warns (once per process for each endpoint) if the member that answered the first status
    /// request runs an etcd older than [`MINIMUM_ETCD`].
    pub(crate) fn warn_if_old(&self) {
        if let Some(member) = &self.answered {
            warn_if_old(member);
        }
    }

    /// The endpoints, in the order given.
    pub fn endpoints(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.endpoint.as_str()).collect()
    }

    /// The retry policy in force.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The status of whichever member answers first.
    pub async fn status(&self) -> Result<MemberStatus, EtcdError> {
        self.read("status", |mut client: Client, endpoint| async move {
            let status = client.status().await?;
            Ok(MemberStatus::from_response(endpoint, &status))
        })
        .await
    }

    /// A linearizable read of one key's value.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, EtcdError> {
        let key = key.as_ref();
        self.read("get", |mut client: KvClient, _| async move {
            let response = client.get(key, None).await?;
            Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
        })
        .await
    }

    /// Writes one key, unconditionally; returns the revision of the write. Retried only when
    /// the failure proves the write was not applied.
    pub async fn put(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<u64, EtcdError> {
        let (key, value) = (key.as_ref(), value.as_ref());
        self.write("put", |mut client: KvClient, _| async move {
            let response = client.put(key, value, None).await?;
            Ok(response.header().map_or(0, |h| h.revision()).max(0) as u64)
        })
        .await
    }

    /// Deletes every key under `prefix`, 5,000 keys per request, telling `deleted` how many are
    /// gone after each; returns how many in all. For a namespace that nothing uses any more
    /// (the demo's or the bench's own, when it ran against a cluster of yours).
    ///
    /// One request deleting a whole namespace can outlast its attempt's timeout (900,000 keys
    /// on three members took longer than 5 s), so each request reads the next page's keys
    /// (keys only) and deletes from the first up to the last of them. The last deletes the
    /// rest of the prefix, keys written meanwhile included. A delete is sent once (a write):
    /// one whose outcome stays unknown ends it with that error, and the keys not yet deleted
    /// stay.
    pub async fn delete_prefix(
        &self,
        prefix: &str,
        mut deleted: impl FnMut(u64),
    ) -> Result<u64, EtcdError> {
        let end = crate::keys::prefix_end(prefix);
        let limit = i64::try_from(DELETE_PAGE).unwrap_or(i64::MAX);
        let mut from = prefix.as_bytes().to_vec();
        let mut total = 0u64;
        loop {
            let (start, end) = (&from, &end);
            // The page's last key, if any follow it.
            let last = self
                .read(
                    "delete prefix: a page",
                    |mut client: KvClient, _| async move {
                        let options = etcd_client::GetOptions::new()
                            .with_range(end.clone())
                            .with_keys_only()
                            .with_limit(limit);
                        let page = client.get(start.clone(), Some(options)).await?;
                        let last = page.kvs().last().filter(|_| page.more());
                        Ok(last.map(|kv| kv.key().to_vec()))
                    },
                )
                .await?;
            // Up to and with the last key: the smallest key after it is the key and a zero byte.
            let until = last.map_or_else(|| end.clone(), |key| [key, vec![0]].concat());
            let through = &until;
            let gone = self
                .write("delete prefix", |mut client: KvClient, _| async move {
                    let options = etcd_client::DeleteOptions::new().with_range(through.clone());
                    let response = client.delete(start.clone(), Some(options)).await?;
                    Ok(response.deleted().max(0) as u64)
                })
                .await?;
            total = total.saturating_add(gone);
            deleted(total);
            if until == *end {
                return Ok(total);
            }
            from = until;
        }
    }

    /// The client for long-lived streams of the preferred endpoint, and that endpoint.
    pub(crate) fn stream_client(&self) -> (StreamClient, String) {
        self.stream_client_at(self.preferred_index())
    }

    /// The client for long-lived streams of endpoint `index` (modulo the number of
    /// endpoints), and that endpoint.
    pub(crate) fn stream_client_at(&self, index: usize) -> (StreamClient, String) {
        let member = &self.members[index % self.members.len()];
        let client = StreamClient {
            client: member.streams.clone(),
            credentials: self.credentials.clone(),
            token: member.stream_token.clone(),
        };
        (client, member.endpoint.clone())
    }

    /// Makes the next stream opened on `endpoint` authenticate first: etcd refused a stream
    /// for its token (expired, or revoked by a change of the auth store).
    pub(crate) fn forget_stream_token(&self, endpoint: &str) {
        if let Some(member) = self.members.iter().find(|m| m.endpoint == endpoint)
            && let Ok(mut authenticated) = member.stream_token.try_lock()
        {
            *authenticated = None;
        }
    }

    /// Makes endpoint `index` (modulo the number of endpoints) the preferred one: it has just
    /// answered.
    pub(crate) fn prefer(&self, index: usize) {
        self.preferred
            .store(index % self.members.len(), Ordering::Relaxed);
    }

    /// The unary client of `member`, authenticated first when there are credentials and it
    /// has not yet (a failed authentication is this request's failure, and the next request
    /// tries again).
    async fn unary<C: Part>(&self, member: &Member) -> Result<C, etcd_client::Error> {
        let (part, authenticated, whole) = member.unary(self.credentials.is_some());
        if let (Some(credentials), Some(mut client)) = (&self.credentials, whole) {
            // Every part of the client shares its token.
            authenticated
                .get_or_try_init(
                    || async move { client.update_user(Some(credentials.pair())).await },
                )
                .await?;
        }
        Ok(part)
    }

    /// Moves the preference to the next endpoint (after a stream failed or stalled on this
    /// one).
    pub(crate) fn rotate(&self) {
        let n = self.members.len();
        let _ = self
            .preferred
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| Some((i + 1) % n));
    }

    /// One attempt on the preferred endpoint, bounded by `timeout` (which then counts as an
    /// unknown outcome). The endpoint becomes preferred when it answers; the caller decides
    /// what a failure means and whether to [`rotate`](Self::rotate).
    pub(crate) async fn attempt<T, F, Fut>(
        &self,
        operation: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnOnce(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.attempt_on(self.preferred_index(), operation, timeout, f)
            .await
    }

    /// The index of the preferred endpoint.
    pub(crate) fn preferred_index(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.members.len()
    }

    /// The number of endpoints.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// [`attempt`](Self::attempt) on endpoint `index` (modulo the number of endpoints).
    pub(crate) async fn attempt_on<T, F, Fut>(
        &self,
        index: usize,
        operation: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnOnce(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let index = index % self.members.len();
        let member = &self.members[index];
        // Waiting for the window is not part of the attempt: its timeout starts once in.
        let _permit = member.permit(operation, timeout).await?;
        // On the heap (once in the window, not while waiting): a request's future is some
        // 6 KiB, and every future that holds it is moved as it is awaited.
        let attempt = Box::pin(async { f(self.unary(member).await?).await });
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(value)) => {
                self.preferred.store(index, Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(source)) => Err(EtcdError::new(operation, &member.endpoint, source)),
            Err(_) => {
                // On the heap: connecting is a large future, and a rare one.
                Box::pin(self.reconnect(member)).await;
                Err(EtcdError::timed_out(operation, &member.endpoint, timeout))
            }
        }
    }

    /// Gives `member` a fresh unary client, so that its next request opens a new connection.
    /// A connection that got no answer may be dead without knowing it (a host that vanished
    /// behind a network fault sends no reset, and HTTP/2 pings notice only after 15 s); a new
    /// connection to a member that is gone fails at once or within the connect timeout, and
    /// one to a member that is alive opens in a moment. Requests in flight on the old
    /// connection are not disturbed.
    async fn reconnect(&self, member: &Member) {
        let endpoint = member.endpoint.as_str();
        let Some(options) = &self.client_options else {
            return;
        };
        match Client::connect([endpoint], Some(options.clone())).await {
            Ok(client) => {
                *crate::sync::lock(&member.client) = Unary::new(client);
                tracing::debug!(
                    endpoint,
                    "no answer in time; the next request connects anew"
                );
            }
            Err(error) => tracing::debug!(endpoint, %error, "reconnecting failed"),
        }
    }

    /// Runs an idempotent request, failing over between endpoints (see [`Connection`]). Each
    /// attempt is bounded by the request timeout, and no retry starts after the retry policy's
    /// deadline: it returns within the deadline plus one request timeout.
    pub(crate) async fn read<C: Part, T, F, Fut>(
        &self,
        operation: &'static str,
        f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(C, String) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call(operation, FailureClass::retry_read, f).await
    }

    /// Runs a write, re-sending it only while its failures prove it was not applied; each
    /// attempt bounded by the request timeout, as [`read`](Self::read)'s.
    pub(crate) async fn write<C: Part, T, F, Fut>(
        &self,
        operation: &'static str,
        f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(C, String) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call(operation, FailureClass::retry_write, f).await
    }

    async fn call<C: Part, T, F, Fut>(
        &self,
        operation: &'static str,
        may_retry: fn(FailureClass) -> bool,
        mut f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(C, String) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        let deadline = deadline(Instant::now(), self.retry.deadline);
        // A pause after each full round of endpoints: deterministic, doubling up to the
        // policy's longest.
        let mut backoff = Backoff::new(self.retry.initial_backoff, self.retry.max_backoff);
        let first = self.preferred.load(Ordering::Relaxed);
        let mut attempt = 0usize;
        loop {
            let index = (first + attempt) % n;
            let member = &self.members[index];
            let answered = match member.permit(operation, self.request_timeout).await {
                Err(full) => Err(full),
                Ok(_permit) => {
                    let sent = Box::pin(async {
                        f(self.unary(member).await?, member.endpoint.clone()).await
                    });
                    // Bounded here whatever the client is: one built by the user may have no
                    // timeout.
                    match tokio::time::timeout(self.request_timeout, sent).await {
                        Ok(answered) => {
                            answered.map_err(|e| EtcdError::new(operation, &member.endpoint, e))
                        }
                        Err(_) => {
                            Box::pin(self.reconnect(member)).await;
                            Err(EtcdError::timed_out(
                                operation,
                                &member.endpoint,
                                self.request_timeout,
                            ))
                        }
                    }
                }
            };
            match answered {
                Ok(value) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(value);
                }
                Err(error) => {
                    attempt += 1;
                    let pause = if attempt.is_multiple_of(n) {
                        backoff.next()
                    } else {
                        Duration::ZERO
                    };
                    if !may_retry(error.class()) || !pause_fits(pause, Instant::now(), deadline) {
                        return Err(error);
                    }
                    tracing::debug!(
                        operation,
                        endpoint = %member.endpoint,
                        class = %error.class(),
                        attempt,
                        "etcd request failed; retrying on the next endpoint"
                    );
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }
}

/// Whether a retry that first pauses for `pause` still starts before `deadline`.
fn pause_fits(pause: Duration, now: Instant, deadline: Instant) -> bool {
    deadline.saturating_duration_since(now) > pause
}

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;
