//! A first service: sessions created on the fly, each owned by one node at a time, each
//! request sent to its owner.
//!
//! Every node hosts the sessions of the registry with a [`SessionHost`]: a session created with
//! [`Admin::create_session`], on any node, is hosted by all and owned by one. An [`HttpRouter`]
//! (over an [`OwnerDirectory`]) handles a request here if this node owns its session, else
//! forwards it to the owner. `POST /sessions` creates a session; `POST /sessions/{id}/events`
//! appends the body to its journal; `GET` there replays the journal (on any node: a replay
//! needs no lease). Ctrl-C hands a node's sessions over before it stops.
//!
//! Run an etcd at 127.0.0.1:2379 (else pass `--endpoints`) and three nodes, a terminal each,
//! then curl once the nodes have settled (twice the TTL of 5 s):
//!
//! ```text
//! etcd --data-dir /tmp/first-service-etcd
//! cargo run --example first_service -- --node a --port 8081
//! cargo run --example first_service -- --node b --port 8082
//! cargo run --example first_service -- --node c --port 8083
//!
//! $ curl -X POST 127.0.0.1:8081/sessions                # created on a, owned by c
//! {"epoch":9,"node":"c","session":"01a2…"}
//! $ curl -d hello 127.0.0.1:8081/sessions/01a2…/events  # a forwards it to c (seq 1: c's fence)
//! {"epoch":9,"node":"c","seq":2,"session":"01a2…"}
//! $ kill -9 <c's pid>                                    # 503s until a or b owns it, within 5 s
//! $ curl --retry 10 -d again 127.0.0.1:8082/sessions/01a2…/events
//! {"epoch":20,"node":"a","seq":4,"session":"01a2…"}
//! $ curl 127.0.0.1:8082/sessions/01a2…/events
//! [{"epoch":9,"payload":"hello","seq":2},{"epoch":20,"payload":"again","seq":4}]
//! ```
//!
//! `examples/operate.rs` drives the same fleet from code.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::Parser;
use futures_util::TryStreamExt as _;
use leasehold::{
    Admin, CancellationToken, HostOptions, HttpRouter, Namespace, Rig, Routed, SessionHost, Store,
    StoreOptions, Uuid,
};
use serde_json::json;

/// How long a killed node's sessions stay its own (its node lease's TTL).
const TTL: Duration = Duration::from_secs(5);

#[derive(Parser)]
struct Args {
    /// This node's name.
    #[arg(long, env = "LEASEHOLD_NODE")]
    node: String,
    /// The port to serve HTTP on, at 127.0.0.1.
    #[arg(long, env = "PORT")]
    port: u16,
    /// etcd client URLs, comma-separated.
    #[arg(long, env = "LEASEHOLD_ENDPOINTS", value_delimiter = ',')]
    #[arg(default_value = "http://127.0.0.1:2379")]
    endpoints: Vec<String>,
    /// The namespace the nodes share.
    #[arg(long, env = "LEASEHOLD_NAMESPACE", default_value = "first-service")]
    namespace: String,
}

/// What every request handler shares.
struct App {
    store: Arc<Store>,
    admin: Admin,
    host: SessionHost,
    router: HttpRouter,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Bound first, so that the address advertised to the other nodes is the one served.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let listen = listener.local_addr()?;
    let options = StoreOptions::new(args.endpoints)
        .with_namespace(Namespace::new(args.namespace)?)
        .with_node(&args.node)
        .with_advertise(format!("http://{listen}"))
        .with_ttl(TTL, Duration::from_secs(1)); // 1 s of margin off each lease's validity
    let store = Arc::new(Store::connect(options).await?);
    let admin = Admin::new(store.connection().clone(), store.namespace().clone());

    // No fixed sessions: every session comes from the registry.
    let registry = HostOptions::default().with_registry();
    let host = SessionHost::start(store.clone(), registry, [], own);
    let router = HttpRouter::new(admin.directory().await?).with_timeout(TTL);
    let app = Arc::new(App {
        store: store.clone(),
        admin,
        host,
        router,
    });
    let routes = Router::new()
        .route("/sessions", post(create))
        .route("/sessions/{id}/events", post(append).get(replay))
        .with_state(app.clone());
    println!("node {}: listening on {listen}", args.node);

    // On Ctrl-C, hand the sessions over while still serving (their requests go to the new
    // owners), then stop serving, then close the store (which revokes the node lease).
    let stopped = async move {
        tokio::signal::ctrl_c().await.expect("a Ctrl-C handler");
        app.host.shutdown().await;
    };
    let server = axum::serve(listener, routes).with_graceful_shutdown(stopped);
    server.await?;
    store.close().await;
    Ok(())
}

/// The work on a session this node owns: be there for its requests, until it is given up.
async fn own(rig: Arc<Rig>, stop: CancellationToken) {
    let (session, epoch) = (rig.session_id(), rig.epoch());
    println!("session {session} owned here at epoch {epoch}");
    stop.cancelled().await;
    println!("session {session} given up");
}

/// `POST /sessions`: a new session in the registry, answered once a node owns it.
async fn create(State(app): State<Arc<App>>) -> Response {
    let session = Uuid::now_v7();
    let directory = app.router.directory();
    // Subscribed before the create, so that no acquisition of the session is missed.
    let mut changes = directory.changes();
    if let Err(error) = app.admin.create_session(session, b"").await {
        return unavailable(error);
    }
    println!("session {session} created");
    let owned = async {
        loop {
            if let Some(owner) = directory.owner_of(session) {
                let (node, epoch) = (&owner.node.name, owner.epoch.get());
                return Some(json!({ "session": session, "node": node, "epoch": epoch }));
            }
            changes.next().await?;
        }
    };
    match tokio::time::timeout(Duration::from_secs(30), owned).await {
        Ok(Some(owned)) => answer(owned),
        // No node took it within 30 s (none has settled yet?): one will.
        _ => answer(json!({ "session": session })),
    }
}

/// `POST /sessions/{id}/events`: the body appended to the session's journal, by its owner.
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
    let body = match to_bytes(request.into_body(), 1 << 20).await {
        Ok(body) => body,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    match rig.journal().append(&body).await {
        Ok(appended) => answer(json!({
            "node": app.store.node(),
            "session": session,
            "epoch": rig.epoch().get(),
            "seq": appended.last_seq,
        })),
        // Lost meanwhile, or etcd failed: the client retries, and the next owner answers.
        Err(error) => unavailable(error),
    }
}

/// `GET /sessions/{id}/events`: the session's journal, read at one revision.
async fn replay(State(app): State<Arc<App>>, Path(session): Path<Uuid>) -> Response {
    match app.store.replay(session).try_collect::<Vec<_>>().await {
        Ok(events) => {
            let events = events.iter().map(|event| {
                let payload = String::from_utf8_lossy(&event.payload);
                json!({ "seq": event.seq, "epoch": event.epoch.get(), "payload": payload })
            });
            answer(events.collect())
        }
        Err(error) => unavailable(error),
    }
}

/// `200 OK` with a JSON body.
fn answer(body: serde_json::Value) -> Response {
    let json = [(header::CONTENT_TYPE, "application/json")];
    (json, body.to_string() + "\n").into_response()
}

/// `503 Service Unavailable`, to be retried in a second.
fn unavailable(why: impl std::fmt::Display) -> Response {
    let retry = [(header::RETRY_AFTER, "1")];
    (StatusCode::SERVICE_UNAVAILABLE, retry, format!("{why}\n")).into_response()
}
