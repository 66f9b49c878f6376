//! A multi-node HTTP service that sends each request to its session's owner.
//!
//! Every process hosts the same sessions (`Uuid::from_u128(1..=N)`) with a [`SessionHost`], so
//! the sessions are spread over the processes, and follows who owns what with an
//! [`OwnerDirectory`]. `POST /sessions/{id}` appends the request's body to the session's
//! journal, wherever the request lands:
//!
//! - the session is owned here: append, and answer `200` with
//!   `{"node", "session", "epoch", "seq"}`;
//! - another node owns it: forward the request to the address that node advertises, once
//!   (marked `x-leasehold-forwarded`, so that two nodes whose directories disagree for a
//!   moment never bounce it back and forth), and relay its answer;
//! - no such session (not one of the N): `404`;
//! - nobody can take it now (no owner, its host is gone, its rig is being opened, or the
//!   forward failed): `503` with `Retry-After: 1`.
//!
//! All but the first is [`HttpRouter`]'s: one call in the handler.
//!
//! `GET /sessions/{id}/owner` tells what the directory says of the session (`404` if nobody
//! owns it).
//!
//! ```text
//! cargo run --example router -- --endpoints http://127.0.0.1:2379 --node a --listen 127.0.0.1:31501
//! cargo run --example router -- --endpoints http://127.0.0.1:2379 --node b --listen 127.0.0.1:31502
//! curl -d hello http://127.0.0.1:31501/sessions/00000000-0000-0000-0000-000000000001
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use leasehold::{
    CancellationToken, HostOptions, HttpRouter, JournalWriteError, Namespace, OwnerDirectory, Rig,
    Routed, SessionHost, Store, StoreOptions, Uuid,
};
use serde_json::json;
use tracing_subscriber::EnvFilter;

/// The largest body appended as one record (the journal's own limit is larger).
const MAX_BODY: usize = 1 << 20;

#[derive(Parser)]
struct Args {
    /// etcd client URLs, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    endpoints: Vec<String>,
    /// The namespace every process of the service shares.
    #[arg(long, default_value = Namespace::DEFAULT)]
    namespace: String,
    /// This process's name.
    #[arg(long)]
    node: String,
    /// Where to serve HTTP (port 0: any free port); advertised to the other nodes.
    #[arg(long, default_value = "127.0.0.1:31501")]
    listen: SocketAddr,
    /// How many sessions the service has: 1 to N, the same on every node.
    #[arg(long, default_value_t = 30)]
    sessions: u128,
    /// The node lease's TTL in seconds: how long a killed node's sessions stay its own.
    #[arg(long, default_value_t = 10)]
    ttl: u64,
}

/// What every request handler shares.
struct App {
    node: String,
    host: SessionHost,
    router: HttpRouter,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // leasehold's own log lines on stderr: warnings unless RUST_LOG says otherwise.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // Bound first, so that the address advertised is the one served (also with port 0).
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let listen = listener.local_addr()?;
    let ttl = Duration::from_secs(args.ttl);
    let options = StoreOptions::new(args.endpoints)
        .with_namespace(Namespace::new(args.namespace)?)
        .with_node(&args.node)
        .with_advertise(format!("http://{listen}"))
        // The margin kept off every validity deadline: a sixth of the TTL, at most the default 1 s.
        .with_ttl(ttl, (ttl / 6).min(Duration::from_secs(1)));
    let store = Arc::new(Store::connect(options).await?);
    // The work on an owned session is only to be there: requests append to its journal.
    let sessions = (1..=args.sessions).map(Uuid::from_u128);
    let host = SessionHost::start(store.clone(), HostOptions::default(), sessions, idle);
    let directory =
        OwnerDirectory::start(store.connection().clone(), store.namespace().clone()).await?;
    let app = Arc::new(App {
        node: args.node,
        host,
        // A forwarded append may be re-sent by its owner for as long as its lease is valid, a
        // TTL at most.
        router: HttpRouter::new(directory).with_timeout(ttl),
    });
    let router = Router::new()
        .route("/sessions/{id}", post(append))
        .route("/sessions/{id}/owner", get(owner))
        .with_state(app.clone());

    let stop = CancellationToken::new();
    let server =
        axum::serve(listener, router).with_graceful_shutdown(stop.clone().cancelled_owned());
    let server = tokio::spawn(server.into_future());
    println!("listening on {listen} as {}", app.node);

    stopped().await;
    // Hand the sessions over while still serving: meanwhile their requests are forwarded to
    // the new owners (or answered 503, to be retried). Then stop serving, then the store.
    app.host.shutdown().await;
    stop.cancel();
    server.await??;
    store.close().await;
    Ok(())
}

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// `POST /sessions/{id}`: the body appended to the session's journal, by its owner.
async fn append(
    State(app): State<Arc<App>>,
    Path(session): Path<Uuid>,
    request: Request,
) -> Response {
    let (rig, request) = match app.router.route(&app.host, session, request).await {
        Routed::Here(rig, request) => (rig, request),
        // Forwarded to the owner and its answer relayed; or 404, or 503 to be retried.
        Routed::Answered(response) => return response.map(Body::from),
    };
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(error) => return (StatusCode::PAYLOAD_TOO_LARGE, format!("{error}\n")).into_response(),
    };
    match rig.journal().append(&body).await {
        Ok(appended) => answer(json!({
            "node": app.node,
            "session": session,
            "epoch": rig.epoch().get(),
            "seq": appended.last_seq,
        })),
        Err(error @ JournalWriteError::TooLarge { .. }) => {
            (StatusCode::PAYLOAD_TOO_LARGE, format!("{error}\n")).into_response()
        }
        // The session was lost meanwhile, or etcd failed: its next owner takes a retry.
        Err(error) => unavailable(error),
    }
}

/// `GET /sessions/{id}/owner`: what this node's directory says, without I/O.
async fn owner(State(app): State<Arc<App>>, Path(session): Path<Uuid>) -> Response {
    match app.router.directory().owner_of(session) {
        Some(owner) => answer(json!({
            "session": session,
            "node": owner.node.name,
            "advertise": owner.node.advertise,
            "epoch": owner.epoch.get(),
            "host_alive": owner.host_alive,
        })),
        None => (StatusCode::NOT_FOUND, "nobody owns the session\n").into_response(),
    }
}

fn answer(body: serde_json::Value) -> Response {
    let json = HeaderValue::from_static("application/json");
    ([(header::CONTENT_TYPE, json)], body.to_string()).into_response()
}

/// `503 Service Unavailable`, to be retried in a second.
fn unavailable(why: impl std::fmt::Display) -> Response {
    let retry = HeaderValue::from_static("1");
    let status = StatusCode::SERVICE_UNAVAILABLE;
    (status, [(header::RETRY_AFTER, retry)], format!("{why}\n")).into_response()
}

/// SIGTERM or ctrl-c.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
