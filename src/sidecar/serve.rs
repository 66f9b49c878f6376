//! Serving the sidecar: the service, health and reflection on one listener, and a shutdown
//! that ends within [`SidecarOptions::shutdown_timeout`](super::SidecarOptions).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio_util::sync::CancellationToken;

use super::{Sidecar, proto};
use crate::store::Store;

impl Sidecar {
    /// Serves the service, health (`SERVING` only while the node lease is valid, for `""` and
    /// `leasehold.v1.Leasehold`) and reflection (v1 and v1alpha) on `incoming` until
    /// `shutdown` resolves; then [`shutdown`](Self::shutdown)s, releasing every attached
    /// session in order, and returns once every stream has ended and every connection closed,
    /// or [`SidecarOptions::shutdown_timeout`](super::SidecarOptions::shutdown_timeout) after
    /// `shutdown` resolved, whichever comes first: a client that stopped reading its stream
    /// does not hold it up.
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
        let (this, stopping) = (self.clone(), CancellationToken::new());
        let shutting = stopping.clone();
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
                shutting.cancel();
                // Streams end once their sessions are released; then the server stops.
                this.shutdown().await;
            });
        // From the shutdown's start, the server has `shutdown_timeout` to close its
        // connections; a client that stopped reading keeps its own open past it.
        let timeout = self.inner.options.shutdown_timeout;
        let bounded = async {
            stopping.cancelled().await;
            tokio::time::sleep(timeout).await;
        };
        let served = tokio::select! {
            served = served => served,
            () = bounded => {
                tracing::warn!(?timeout, "connections still open at the end of the shutdown: closed");
                Ok(())
            }
        };
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
