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
    } = start(common, args.metrics_addr).await?;
    let sidecar = Sidecar::new(
        store.clone(),
        SidecarOptions::default().with_client_keepalive(args.client_keepalive),
    );
    let stop = async {
        tokio::select! {
            () = wait_for_signal() => {}
            _ = store.refused() => {
                tracing::warn!("etcd denies this node's user the namespace: stopping");
            }
        }
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
    sidecar.shutdown().await;
    store.close().await;
    timeline.say(&name, "stopped");
    served.map_err(|error| Failure::message(format!("serving failed: {error}"), 1))
}
