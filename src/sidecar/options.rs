//! [`SidecarOptions`]: how a sidecar serves its clients, and what bounds what a client can make
//! it hold.

use std::time::Duration;

/// How a [`Sidecar`](super::Sidecar) serves its clients, and the bounds on everything a client
/// controls. A call past a bound is refused (`RESOURCE_EXHAUSTED`, or `INVALID_ARGUMENT` for a
/// request id too long) and changes nothing; the sidecar holds, at these defaults, what
/// docs/sidecar.md's "Memory" says.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SidecarOptions {
    /// The HTTP/2 keepalive ping interval, and how long a client may take to answer a ping:
    /// a client that does not answer in time has its connection closed, and the sessions of
    /// its `Attach` streams released. Default 2 s.
    pub client_keepalive: Duration,
    /// The longest request id, in bytes (default 128).
    pub max_request_id: usize,
    /// The most `Attach` streams open at once (default 1,024).
    pub max_streams: usize,
    /// The most sessions one `Attach` stream owns or is acquiring at once (default 1,024).
    pub max_sessions_per_stream: usize,
    /// The most sessions all streams own or are acquiring at once (default 16,384).
    pub max_sessions: usize,
    /// The most `Replay` streams at once, following or not (each that follows is an etcd
    /// watch; default 256).
    pub max_replays: usize,
    /// The most `WatchOwners` streams at once (default 256).
    pub max_watches: usize,
    /// The most payload bytes of `Append` calls under way at once (default 64 MiB).
    pub max_bytes_in_flight: usize,
    /// How long a stream's event may wait for a client that stopped reading it before the
    /// stream is ended (its sessions released, in order). Default 10 s.
    pub stalled_reader: Duration,
    /// How long [`serve`](super::Sidecar::serve) goes on after its shutdown began (sessions
    /// released in order, streams ended, connections closed) before it returns anyway, with
    /// connections of clients that stopped reading still open. Default 10 s.
    pub shutdown_timeout: Duration,
}

impl Default for SidecarOptions {
    fn default() -> Self {
        Self {
            client_keepalive: Duration::from_secs(2),
            max_request_id: 128,
            max_streams: 1024,
            max_sessions_per_stream: 1024,
            max_sessions: 16_384,
            max_replays: 256,
            max_watches: 256,
            max_bytes_in_flight: 64 << 20,
            stalled_reader: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

impl SidecarOptions {
    /// Sets [`client_keepalive`](Self::client_keepalive).
    pub fn with_client_keepalive(mut self, keepalive: Duration) -> Self {
        self.client_keepalive = keepalive;
        self
    }

    /// Sets [`max_request_id`](Self::max_request_id).
    pub fn with_max_request_id(mut self, bytes: usize) -> Self {
        self.max_request_id = bytes;
        self
    }

    /// Sets [`max_streams`](Self::max_streams).
    pub fn with_max_streams(mut self, streams: usize) -> Self {
        self.max_streams = streams;
        self
    }

    /// Sets [`max_sessions_per_stream`](Self::max_sessions_per_stream).
    pub fn with_max_sessions_per_stream(mut self, sessions: usize) -> Self {
        self.max_sessions_per_stream = sessions;
        self
    }

    /// Sets [`max_sessions`](Self::max_sessions).
    pub fn with_max_sessions(mut self, sessions: usize) -> Self {
        self.max_sessions = sessions;
        self
    }

    /// Sets [`max_replays`](Self::max_replays).
    pub fn with_max_replays(mut self, replays: usize) -> Self {
        self.max_replays = replays;
        self
    }

    /// Sets [`max_watches`](Self::max_watches).
    pub fn with_max_watches(mut self, watches: usize) -> Self {
        self.max_watches = watches;
        self
    }

    /// Sets [`max_bytes_in_flight`](Self::max_bytes_in_flight).
    pub fn with_max_bytes_in_flight(mut self, bytes: usize) -> Self {
        self.max_bytes_in_flight = bytes;
        self
    }

    /// Sets [`stalled_reader`](Self::stalled_reader).
    pub fn with_stalled_reader(mut self, wait: Duration) -> Self {
        self.stalled_reader = wait;
        self
    }

    /// Sets [`shutdown_timeout`](Self::shutdown_timeout).
    pub fn with_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }
}
