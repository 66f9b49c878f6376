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
//! - nobody can take it now (no owner, its host is gone, its rig is being opened, or the
//!   forward failed): `503` with `Retry-After: 1`.
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
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold::directory::Owner;
use leasehold::{
    CancellationToken, HostOptions, JournalWriteError, Namespace, OwnerDirectory, Rig, Route,
    SessionHost, Store, StoreOptions, Uuid,
};
use serde_json::json;
use tracing_subscriber::EnvFilter;

/// Set on a request one node forwards to another: it is never forwarded a second time.
const FORWARDED: &str = "x-leasehold-forwarded";

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
    directory: OwnerDirectory,
    client: Client<HttpConnector, Full<Bytes>>,
    /// The longest a forwarded request may take: an owner's append may be re-sent for as long
    /// as its lease is valid, at most a TTL.
    forward_timeout: Duration,
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
        directory,
        client: Client::builder(TokioExecutor::new()).build_http(),
        forward_timeout: ttl,
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
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match app.host.route(session, &app.directory) {
        Route::Here(rig) => match rig.journal().append(&body).await {
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
        },
        Route::There(owner) if !headers.contains_key(FORWARDED) => {
            forward(&app, &owner, body).await.unwrap_or_else(|error| {
                unavailable(format!("forwarding to {:?}: {error}", owner.node.name))
            })
        }
        // Forwarded here, yet not owned here: this node's directory lags the sender's (or the
        // other way round). Retrying lets the two catch up.
        Route::There(owner) => {
            unavailable(format!("forwarded, but owned by {:?}", owner.node.name))
        }
        Route::Nobody => unavailable("no node can take the session now"),
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends the request on to `owner`, and its answer back.
async fn forward(app: &App, owner: &Owner, body: Bytes) -> Result<Response, BoxError> {
    let base = owner
        .node
        .advertise
        .as_deref()
        .ok_or("it advertises no address")?;
    // The address may carry a path of its own (`https://n1.internal:8443/svc/`).
    let base = base.trim_end_matches('/');
    let request = hyper::Request::post(format!("{base}/sessions/{}", owner.session))
        .header(FORWARDED, &app.node)
        .body(Full::new(body))?;
    let send = async {
        let (parts, body) = app.client.request(request).await?.into_parts();
        Ok::<_, BoxError>((parts, body.collect().await?.to_bytes()))
    };
    let (parts, body) = tokio::time::timeout(app.forward_timeout, send)
        .await
        .map_err(|_| "no answer in time")??;
    // The status and the body, and the headers that say what they are; not the hop's own.
    let mut relayed = Response::new(Body::from(body));
    *relayed.status_mut() = parts.status;
    for name in [header::CONTENT_TYPE, header::RETRY_AFTER] {
        if let Some(value) = parts.headers.get(&name) {
            relayed.headers_mut().insert(name, value.clone());
        }
    }
    Ok(relayed)
}

/// `GET /sessions/{id}/owner`: what this node's directory says, without I/O.
async fn owner(State(app): State<Arc<App>>, Path(session): Path<Uuid>) -> Response {
    match app.directory.owner_of(session) {
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
