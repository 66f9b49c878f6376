//! `HttpRouter` between two session hosts, each serving HTTP on the address it advertises: a
//! request for a session owned here is handled here; one owned by the other host is forwarded
//! there once and its answer relayed (or redirected there, with `redirecting`); a forwarded
//! request that reaches a node not owning its session is answered 503, never forwarded again;
//! a session no host hosts and nobody owns is 404 at once; one whose owner has no live host is
//! 503 with `Retry-After: 1`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::routing::post;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Request as HttpRequest, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold::testing::wait_for;
use leasehold::{
    CancellationToken, FORWARDED_HEADER, HostOptions, HttpRouter, OwnerDirectory, Rig, Routed,
    SessionHost, Store, StoreOptions, Uuid,
};

const TTL: u64 = 3;
const SESSIONS: u128 = 6;

/// One node: a host, its router, and how many requests its handler took as the owner.
struct Node {
    name: &'static str,
    host: SessionHost,
    router: HttpRouter,
    handled: AtomicUsize,
}

/// A node serving on `127.0.0.1:0`, advertising that address; its router redirects instead of
/// forwarding if `redirect`.
async fn node(
    etcd: &common::Etcd,
    name: &'static str,
    sessions: &[Uuid],
    redirect: bool,
) -> (Arc<Node>, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let options = StoreOptions::new([etcd.node.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node(name)
        .with_advertise(&addr)
        .with_ttl(Duration::from_secs(TTL), Duration::from_millis(500));
    let store = Arc::new(Store::connect(options).await.expect("connects"));
    let directory = OwnerDirectory::start(store.connection().clone(), store.namespace().clone())
        .await
        .expect("the directory starts");
    let host = SessionHost::start(
        store,
        HostOptions::default().with_settle(Duration::ZERO),
        sessions.to_vec(),
        idle,
    );
    let router = HttpRouter::new(directory);
    let router = if redirect {
        router.redirecting()
    } else {
        router
    };
    let node = Arc::new(Node {
        name,
        host,
        router,
        handled: AtomicUsize::new(0),
    });
    let app = Router::new()
        .route("/sessions/{id}", post(handle))
        .with_state(node.clone());
    tokio::spawn(axum::serve(listener, app).into_future());
    (node, addr)
}

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// Answers `{node} {forwarded-by or -} {body}` where the session is owned.
async fn handle(
    State(node): State<Arc<Node>>,
    Path(session): Path<Uuid>,
    request: Request,
) -> Response {
    match node.router.route(&node.host, session, request).await {
        Routed::Here(_rig, request) => {
            node.handled.fetch_add(1, Ordering::SeqCst);
            let by = request
                .headers()
                .get(FORWARDED_HEADER)
                .map_or("-".to_owned(), |by| by.to_str().unwrap().to_owned());
            let body = axum::body::to_bytes(request.into_body(), 1 << 20)
                .await
                .unwrap();
            let text = format!("{} {by} {}", node.name, String::from_utf8_lossy(&body));
            Response::new(Body::from(text))
        }
        Routed::Answered(response) => response.map(Body::from),
    }
}

type Http = Client<HttpConnector, Full<Bytes>>;

/// POSTs `body` to `addr` for `session` (with the forwarded mark if `marked`): status, the
/// `Retry-After` and `Location` headers, and the body.
async fn post_to(
    http: &Http,
    addr: &str,
    session: Uuid,
    body: &str,
    marked: bool,
) -> (StatusCode, Option<String>, Option<String>, String) {
    let mut request = HttpRequest::post(format!("{addr}/sessions/{session}"));
    if marked {
        request = request.header(FORWARDED_HEADER, "elsewhere");
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), http.request(request))
        .await
        .expect("an answer within 20 s")
        .expect("the node answers");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
    };
    let (retry, location) = (header("retry-after"), header("location"));
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry,
        location,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_is_handled_by_its_owner_forwarded_once_or_refused_with_why() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (1..=SESSIONS).map(Uuid::from_u128).collect();
    // One session is owned, before any host starts, by a store that is no host: its owner has
    // no live host, so a request for it waits for the next owner (503).
    let outsider = etcd.store("outsider", TTL).await;
    let orphan = sessions[0];
    let _orphan_lease = outsider.acquire_lease(orphan).await.expect("acquires");
    let (a, a_addr) = node(&etcd, "a", &sessions, false).await;
    let (b, b_addr) = node(&etcd, "b", &sessions, false).await;
    let hosted = |node: &Node| node.host.held().len();
    wait_for(
        "the other sessions spread over a and b",
        Duration::from_secs(30),
        || async {
            let directory = a.router.directory();
            let known = sessions[1..]
                .iter()
                .all(|s| directory.owner_of(*s).is_some_and(|o| o.host_alive))
                && sessions[1..]
                    .iter()
                    .all(|s| b.router.directory().owner_of(*s).is_some());
            let balanced = hosted(&a) >= 2 && hosted(&b) >= 2;
            (known && balanced && hosted(&a) + hosted(&b) == sessions.len() - 1).then_some(())
        },
    )
    .await
    .unwrap();
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    let of_a = a.host.held()[0].0;

    // --- owned here: handled here
    let (status, _, _, body) = post_to(&http, &a_addr, of_a, "one", false).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "a - one"));
    assert_eq!(a.handled.load(Ordering::SeqCst), 1);

    // --- owned elsewhere: forwarded once, marked with the forwarding node, answered by the owner
    let (status, _, _, body) = post_to(&http, &b_addr, of_a, "two", false).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "a b two"));
    assert_eq!(
        a.handled.load(Ordering::SeqCst),
        2,
        "the owner handled it once"
    );
    assert_eq!(b.handled.load(Ordering::SeqCst), 0);

    // --- already forwarded, at a node that does not own it: 503, not forwarded again
    let (status, retry, _, body) = post_to(&http, &b_addr, of_a, "three", true).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert!(
        body.contains("forwarded, but owned by node \"a\""),
        "{body}"
    );
    assert_eq!(a.handled.load(Ordering::SeqCst), 2, "never forwarded again");

    // --- a session nobody hosts and nobody owns: 404 at once, from either node
    for addr in [&a_addr, &b_addr] {
        let (status, retry, _, body) = post_to(&http, addr, Uuid::new_v4(), "four", false).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(retry, None);
        assert!(body.starts_with("no such session"), "{body}");
    }

    // --- hosted, but its owner has no live host: 503, retry in a second
    let (status, retry, _, body) = post_to(&http, &a_addr, orphan, "five", false).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(retry.as_deref(), Some("1"));

    // --- a redirecting router: 307 to the owner's address, same path; nothing forwarded
    let (c, c_addr) = node(&etcd, "c", &[], true).await;
    wait_for(
        "c's directory knows a's session",
        Duration::from_secs(10),
        || async { c.router.directory().owner_of(of_a).map(|_| ()) },
    )
    .await
    .unwrap();
    let (status, _, location, body) = post_to(&http, &c_addr, of_a, "six", false).await;
    assert_eq!(status, StatusCode::TEMPORARY_REDIRECT, "{body}");
    assert_eq!(location, Some(format!("{a_addr}/sessions/{of_a}")));
    assert_eq!(a.handled.load(Ordering::SeqCst), 2);

    for node in [&a, &b, &c] {
        node.host.shutdown().await;
    }
    outsider.close().await;
}
