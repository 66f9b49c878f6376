//! `--metrics-addr`: Prometheus text at `/metrics`, `/healthz` (the process is up) and
//! `/readyz` (200 while the node lease is valid and etcd takes the node's writes; 503 while the
//! node lease is not valid, or while etcd refuses its writes for space: its NOSPACE alarm).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use leasehold::Store;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use super::Failure;

/// Installs the Prometheus recorder for the whole process (before anything is recorded) and
/// binds `addr`.
pub(crate) async fn install(
    addr: SocketAddr,
) -> Result<(PrometheusHandle, tokio::net::TcpListener), Failure> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|error| {
        Failure::message(
            format!("cannot listen on --metrics-addr {addr}: {error}"),
            2,
        )
    })?;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(Failure::runtime)?;
    leasehold::metrics::describe();
    Ok((handle, listener))
}

/// Serves the metrics and health of `store` on `listener` until `stop`; returns the address.
pub(crate) fn serve(
    handle: PrometheusHandle,
    listener: tokio::net::TcpListener,
    store: Arc<Store>,
    stop: CancellationToken,
) -> Result<SocketAddr, Failure> {
    let local = listener.local_addr().map_err(Failure::runtime)?;
    tokio::spawn(upkeep(handle.clone(), stop.clone()));
    let app = Router::new()
        .route("/metrics", get(move || async move { handle.render() }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                if !store.is_node_lease_valid() {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the node lease is not valid\n",
                    )
                } else if *store.nospace_alarm().borrow() {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "etcd refuses writes: its NOSPACE alarm is raised (trim, compact, \
                         defragment, disarm: see docs/production.md)\n",
                    )
                } else {
                    (StatusCode::OK, "ready\n")
                }
            }),
        );
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::warn!(%error, "the metrics endpoint stopped");
        }
    });
    Ok(local)
}

/// Drains histograms now and then, as the recorder asks of its owner.
async fn upkeep(handle: PrometheusHandle, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => handle.run_upkeep(),
            _ = stop.cancelled() => return,
        }
    }
}
