//! `leasehold serve`: the gRPC sidecar (see `leasehold::sidecar` and docs/sidecar.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use leasehold::sidecar::{Sidecar, SidecarOptions};

use super::node::{Started, start, wait_for_signal};
use super::{Common, Failure};

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Where to listen: a TCP address (`127.0.0.1:50051`, `[::]:50051`) or a Unix socket path
    /// (`unix:/run/leasehold.sock`; a stale socket file there is replaced).
    #[arg(long, value_name = "ADDR", env = "LEASEHOLD_LISTEN")]
    listen: String,
    /// The HTTP/2 keepalive ping interval towards clients, and how long a client may take to
    /// answer one: a client that does not answer in time loses every session its Attach
    /// streams hold; from 100ms to 1h, e.g. `2s`, `500ms`.
    #[arg(long, default_value = "2s", value_parser = parse_keepalive)]
    client_keepalive: Duration,
    /// TLS on the listener: the server's certificate chain (PEM file); with --listen-key.
    #[arg(long, value_name = "PATH", requires = "listen_key")]
    listen_cert: Option<PathBuf>,
    /// TLS on the listener: the certificate's private key (PEM file).
    #[arg(long, value_name = "PATH", requires = "listen_cert")]
    listen_key: Option<PathBuf>,
    /// TLS on the listener: require client certificates signed by this CA (PEM file).
    #[arg(long, value_name = "PATH", requires = "listen_cert")]
    listen_client_ca: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics, with /healthz and /readyz, as `node`
    /// does, e.g. `127.0.0.1:9464`.
    #[arg(long, value_name = "ADDR", env = "LEASEHOLD_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// The longest request id an Append takes, in bytes; longer ones are refused
    /// INVALID_ARGUMENT.
    #[arg(long, value_name = "BYTES", default_value_t = 128)]
    max_request_id: usize,
    /// The most request ids the owned sessions' journals hold together (each about 50 bytes,
    /// until its ownership ends); past it, appends with a new request id are refused
    /// RESOURCE_EXHAUSTED (REQUEST_IDS_EXHAUSTED).
    #[arg(long, value_name = "IDS", default_value_t = 1_000_000)]
    max_request_ids: usize,
    /// The most Attach streams open at once; past it, RESOURCE_EXHAUSTED (TOO_MANY_STREAMS).
    #[arg(long, value_name = "STREAMS", default_value_t = 1024)]
    max_streams: usize,
    /// The most sessions one Attach stream owns or acquires at once; past it, the Acquire is
    /// answered Failed (TOO_MANY_SESSIONS).
    #[arg(long, value_name = "SESSIONS", default_value_t = 1024)]
    max_sessions_per_stream: usize,
    /// The most sessions all Attach streams own or acquire at once; past it, the Acquire is
    /// answered Failed (TOO_MANY_SESSIONS, retryable).
    #[arg(long, value_name = "SESSIONS", default_value_t = 16_384)]
    max_sessions: usize,
    /// The most Replay streams at once, following or not; past it, RESOURCE_EXHAUSTED
    /// (TOO_MANY_REPLAYS).
    #[arg(long, value_name = "STREAMS", default_value_t = 256)]
    max_replays: usize,
    /// The most WatchOwners streams at once; past it, RESOURCE_EXHAUSTED (TOO_MANY_WATCHES).
    #[arg(long, value_name = "STREAMS", default_value_t = 256)]
    max_watches: usize,
    /// The most payload bytes of Append calls under way at once; past it, RESOURCE_EXHAUSTED
    /// (TOO_MANY_BYTES_IN_FLIGHT).
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    max_bytes_in_flight: usize,
    /// How long after SIGTERM or SIGINT the process exits at the latest: its sessions are
    /// released in order within it when etcd answers (those that are not are freed by the
    /// node lease's TTL), and connections of clients that stopped reading are closed; e.g.
    /// `10s`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_shutdown)]
    shutdown_timeout: Duration,
}

fn parse_shutdown(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(timeout) if timeout <= Duration::from_secs(3600) => Ok(timeout),
        Ok(_) => Err("at most 1h".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

impl ServeArgs {
    fn options(&self) -> SidecarOptions {
        SidecarOptions::default()
            .with_client_keepalive(self.client_keepalive)
            .with_max_request_id(self.max_request_id)
            .with_max_streams(self.max_streams)
            .with_max_sessions_per_stream(self.max_sessions_per_stream)
            .with_max_sessions(self.max_sessions)
            .with_max_replays(self.max_replays)
            .with_max_watches(self.max_watches)
            .with_max_bytes_in_flight(self.max_bytes_in_flight)
            .with_shutdown_timeout(self.shutdown_timeout)
    }
}

fn parse_keepalive(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(keepalive)
            if (Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&keepalive) =>
        {
            Ok(keepalive)
        }
        Ok(_) => Err("from 100ms to 1h".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

/// Where `--listen` points.
enum Listen {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

fn parse_listen(text: &str) -> Result<Listen, Failure> {
    if let Some(path) = text.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(Failure::message("--listen unix: needs a socket path", 2));
        }
        return Ok(Listen::Unix(PathBuf::from(path)));
    }
    text.parse().map(Listen::Tcp).map_err(|error| {
        Failure::message(
            format!(
                "--listen {text:?} is neither an address (host:port, by IP) nor unix:PATH: {error}"
            ),
            2,
        )
    })
}

fn read_pem(flag: &str, path: &PathBuf) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|error| {
        Failure::message(format!("cannot read {flag} {}: {error}", path.display()), 2)
    })
}

fn tls(args: &ServeArgs) -> Result<Option<tonic::transport::ServerTlsConfig>, Failure> {
    let (Some(cert), Some(key)) = (&args.listen_cert, &args.listen_key) else {
        return Ok(None);
    };
    let identity = tonic::transport::Identity::from_pem(
        read_pem("--listen-cert", cert)?,
        read_pem("--listen-key", key)?,
    );
    let mut config = tonic::transport::ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &args.listen_client_ca {
        config = config.client_ca_root(tonic::transport::Certificate::from_pem(read_pem(
            "--listen-client-ca",
            ca,
        )?));
    }
    Ok(Some(config))
}

pub(crate) async fn run(common: &Common, args: &ServeArgs) -> Result<(), Failure> {
    let listen = parse_listen(&args.listen)?;
    let tls = tls(args)?;
    let Started {
        name,
        store,
        timeline,
        metrics: _metrics,
    } = start(common, args.metrics_addr, |mut options| {
        options.journal = options.journal.with_max_keys(args.max_request_ids);
        options
    })
    .await?;
    let sidecar = Sidecar::new(store.clone(), args.options());
    // Set when the shutdown begins: the process exits within --shutdown-timeout of it.
    let stopping = std::sync::OnceLock::new();
    let stop = async {
        tokio::select! {
            () = wait_for_signal() => {}
            _ = store.refused() => {
                tracing::warn!("etcd denies this node's user the namespace: stopping");
            }
        }
        let _ = stopping.set(tokio::time::Instant::now());
    };
    let served = match listen {
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|error| {
                Failure::message(format!("cannot listen on --listen {addr}: {error}"), 2)
            })?;
            let local = listener.local_addr().map_err(Failure::runtime)?;
            timeline.say(
                &name,
                format_args!(
                    "serving leasehold.v1.Leasehold on {local}, namespace {}, node lease ttl {:?}",
                    common.namespace,
                    store.ttl()
                ),
            );
            sidecar.serve_tcp(listener, tls, stop).await
        }
        Listen::Unix(path) => {
            // A socket file left by an earlier run is replaced; anything else is not.
            if let Ok(meta) = std::fs::symlink_metadata(&path)
                && std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type())
            {
                let _ = std::fs::remove_file(&path);
            }
            let listener = tokio::net::UnixListener::bind(&path).map_err(|error| {
                Failure::message(
                    format!("cannot listen on --listen unix:{}: {error}", path.display()),
                    2,
                )
            })?;
            timeline.say(
                &name,
                format_args!(
                    "serving leasehold.v1.Leasehold on unix:{}, namespace {}, node lease ttl {:?}",
                    path.display(),
                    common.namespace,
                    store.ttl()
                ),
            );
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let served = sidecar.serve(incoming, tls, stop).await;
            let _ = std::fs::remove_file(&path);
            served
        }
    };
    timeline.say(&name, "shutting down");
    let began = stopping
        .get()
        .copied()
        .unwrap_or_else(tokio::time::Instant::now);
    let closed = tokio::time::timeout_at(began + args.shutdown_timeout, async {
        sidecar.shutdown().await;
        store.close().await;
    })
    .await;
    if closed.is_err() {
        timeline.say(
            &name,
            "sessions still being released at --shutdown-timeout: their node lease's TTL frees them",
        );
    }
    timeline.say(&name, "stopped");
    served.map_err(|error| Failure::message(format!("serving failed: {error}"), 1))
}
