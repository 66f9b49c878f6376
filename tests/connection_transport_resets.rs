//! A connection that the client's own HTTP/2 layer closes under its requests.
//!
//! h2 counts the streams it resets by itself, among them each answer that arrives for a
//! stream it cancelled and has since forgotten (it remembers 50, for 1 s); at 1,024 it closes
//! the connection with `GOAWAY(ENHANCE_YOUR_CALM, too_many_internal_resets)`. tonic reports
//! that to every request still in flight on it as `RESOURCE_EXHAUSTED`, the code etcd itself
//! gives "database space exceeded", which is permanent. The transport's is not: it comes with
//! the h2 error as its source, and such a request may have been applied. It is outcome
//! unknown.
//!
//! The fault, made on purpose: a proxy holds etcd's replies while 1,500 writes are sent at
//! once and 200 more once etcd has the first; the first 1,500 time out (2 s) and are
//! cancelled, then the replies flow: 1,500 answers to forgotten streams, and the connection is
//! closed while the 200 are still waiting. With the connection's window (128 requests in flight at
//! most) the same load never gets near the limit.

mod common;

use std::time::Duration;

use common::resets::ResetLimits;
use leasehold::testing::{EtcdNode, FaultProxy, etcd_metric, wait_for};
use leasehold::{ConnectOptions, Connection, EtcdError, FailureClass};
use tokio::time::sleep;

const FIRST: usize = 1500;
const SECOND: usize = 200;
/// The connection's request timeout: the second wave must be sent within it of the first.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Puts `count` keys starting with `prefix` at once, in a task of their own. The keys are
/// short and the values empty: every request must reach etcd although its window updates
/// are held with its replies, so all of them together must fit in the 64 KiB of HTTP/2 flow
/// control it grants a connection to begin with (some 15 bytes each).
fn wave(
    connection: &Connection,
    prefix: String,
    count: usize,
) -> tokio::task::JoinHandle<Vec<Result<u64, EtcdError>>> {
    let connection = connection.clone();
    tokio::spawn(async move {
        let puts = (0..count).map(|i| connection.put(format!("{prefix}{i}"), ""));
        futures_util::future::join_all(puts).await
    })
}

/// `Put` requests etcd has received.
async fn puts(etcd: &EtcdNode) -> usize {
    let labels = ["grpc_method=\"Put\"", "grpc_type=\"unary\""];
    etcd_metric(etcd.endpoint(), "grpc_server_started_total", &labels)
        .await
        .expect("etcd serves /metrics")
        .unwrap_or(0.0) as usize
}

/// Waits until etcd has received `count` puts in all.
async fn received(etcd: &EtcdNode, count: usize) {
    wait_for(
        "etcd received the wave",
        Duration::from_secs(10),
        || async { (puts(etcd).await >= count).then_some(()) },
    )
    .await
    .unwrap();
}

/// The two waves through `proxy` as the module docs say, each sent once etcd has the one
/// before; the second wave's outcomes.
async fn waves(
    etcd: &EtcdNode,
    connection: &Connection,
    proxy: &FaultProxy,
    name: &str,
) -> Vec<Result<u64, EtcdError>> {
    let before = puts(etcd).await;
    proxy.hold_replies();
    let first = wave(connection, format!("{name}a"), FIRST);
    received(etcd, before + FIRST).await;
    let second = wave(connection, format!("{name}b"), SECOND);
    received(etcd, before + FIRST + SECOND).await;
    // The first wave has timed out (every reply is held): the second is waiting, and its
    // timeouts started later.
    let first = first.await.unwrap();
    assert!(
        first.iter().all(Result::is_err),
        "a reply came through the hold"
    );
    proxy.heal();
    second.await.unwrap()
}

fn connection_options(proxy: &FaultProxy, max_in_flight: usize) -> ConnectOptions {
    ConnectOptions::new([proxy.endpoint()])
        .with_request_timeout(TIMEOUT)
        .with_max_in_flight(max_in_flight)
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_cut_by_the_clients_own_http2_layer_are_outcome_unknown_and_the_window_avoids_it()
{
    let resets = ResetLimits::install();
    let etcd = EtcdNode::start().await.expect("etcd starts");

    // --- no window: h2 closes the connection under the second wave
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let connection = Connection::connect(connection_options(&proxy, 1 << 20))
        .await
        .expect("connects");
    let second = waves(&etcd, &connection, &proxy, "u").await;
    let closed = resets.count();
    let cut: Vec<&EtcdError> = second
        .iter()
        .filter_map(|put| put.as_ref().err())
        .filter(|error| error.code() == Some(tonic::Code::ResourceExhausted))
        .collect();
    println!(
        "no window: {closed} connection(s) closed at h2's reset limit; of the second wave, {} \
         cut as RESOURCE_EXHAUSTED, {} answered",
        cut.len(),
        second.iter().filter(|put| put.is_ok()).count()
    );
    assert!(
        closed > 0,
        "the fault did not happen: no connection reached h2's reset limit"
    );
    assert!(
        !cut.is_empty(),
        "no request was cut by the connection's close"
    );
    for error in &cut {
        assert_eq!(error.class(), FailureClass::OutcomeUnknown, "{error:?}");
        assert!(!error.is_no_space(), "{error:?}");
    }
    for error in second.iter().filter_map(|put| put.as_ref().err()) {
        assert_ne!(error.class(), FailureClass::Permanent, "{error:?}");
    }

    // --- the default window: the same load never closes the connection. It keeps 128 in
    // flight, so only those time out while the replies are held (twice: 256 streams
    // cancelled), and the rest wait their turn.
    let window = ConnectOptions::DEFAULT_MAX_IN_FLIGHT;
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let connection = Connection::connect(connection_options(&proxy, window))
        .await
        .expect("connects");
    let before = puts(&etcd).await;
    proxy.hold_replies();
    let all = wave(&connection, "w".to_owned(), FIRST + SECOND);
    received(&etcd, before + window).await;
    sleep(2 * TIMEOUT + Duration::from_millis(500)).await;
    proxy.heal();
    let outcomes = all.await.unwrap();
    let closed_windowed = resets.count() - closed;
    let answered = outcomes.iter().filter(|put| put.is_ok()).count();
    println!(
        "window {window}: {closed_windowed} connection(s) closed; {answered} of {} answered",
        FIRST + SECOND
    );
    assert_eq!(
        closed_windowed, 0,
        "a connection was closed within the window"
    );
    // Timed out in the window, or (after retries) kept out of it: never permanent.
    for error in outcomes.iter().filter_map(|put| put.as_ref().err()) {
        assert!(
            matches!(
                error.class(),
                FailureClass::OutcomeUnknown | FailureClass::NotSent
            ),
            "{error:?}"
        );
    }
    assert!(
        answered >= FIRST + SECOND - 3 * window,
        "only those in the window timed out"
    );
}
