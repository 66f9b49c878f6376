//! Idle connections stay open. etcd (grpc-go) counts a client's HTTP/2 ping on a connection
//! with no stream open as a strike unless it came two hours after the last one, and closes the
//! connection with `GOAWAY too_many_pings` after the third: a client that pinged idle
//! connections (every 10 s) would lose every idle one within about 40 s, and pay a new
//! connection (a TLS handshake, with TLS) on its next request. leasehold pings only while a
//! request or stream is open on the connection.

use std::time::Duration;

use leasehold::testing::{EtcdNode, FaultProxy};
use leasehold::{ConnectOptions, Connection};

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_connection_is_not_closed_by_etcd_for_its_pings() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let connection = Connection::connect(ConnectOptions::new([proxy.endpoint()]))
        .await
        .expect("connects");
    connection.get("idle-probe").await.expect("a first request");
    let open = proxy.open_connections();
    assert!(open >= 1, "the request opened a connection");

    // Longer than three 10 s ping intervals and the ping timeout, with nothing sent.
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(
        proxy.open_connections(),
        open,
        "etcd closed an idle connection (too_many_pings?)"
    );
    connection.get("idle-probe").await.expect("still usable");
    assert_eq!(
        proxy.open_connections(),
        open,
        "no new connection was needed"
    );
}
