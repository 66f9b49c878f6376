//! A three-member cluster under the harness's fault controls.

use std::time::Duration;

use leasehold::testing::{EtcdCluster, random_namespace, wait_for};
use leasehold::{ConnectOptions, Connection, FailureClass, RetryPolicy};

/// A client of one member only, that gives up quickly.
async fn only(endpoint: &str) -> Connection {
    let options = ConnectOptions::new([endpoint])
        .with_retry(RetryPolicy::default().with_deadline(Duration::from_secs(2)))
        .with_request_timeout(Duration::from_secs(1));
    Connection::connect(options).await.expect("member answers")
}

/// Writes `value`, resolving unknown outcomes as a careful writer must: a put that met a
/// fault (a member dying or frozen mid-request, an election under way) may have committed, so
/// read before sending it again. Fine here because each test is the only writer of its keys.
/// Returns how many attempts had an unknown outcome.
async fn put_resolving(connection: &Connection, key: &str, value: &str) -> usize {
    let mut unknown = 0;
    loop {
        match connection.put(key, value).await {
            Ok(_) => return unknown,
            Err(error) if error.class() == FailureClass::OutcomeUnknown && unknown < 5 => {
                unknown += 1;
                if reads(connection, key).await.as_deref() == Some(value.as_bytes()) {
                    return unknown;
                }
            }
            Err(error) => panic!("put {key} failed: {error}"),
        }
    }
}

async fn reads(connection: &Connection, key: &str) -> Option<Vec<u8>> {
    connection.get(key).await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cluster_keeps_serving_when_its_leader_is_killed_and_the_member_rejoins() {
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let connection = Connection::connect(ConnectOptions::new(cluster.endpoints()))
        .await
        .unwrap();
    let prefix = random_namespace().prefix();
    connection
        .put(format!("{prefix}before"), "0")
        .await
        .unwrap();

    // --- phase: the leader dies
    let old_leader = cluster.leader().await.unwrap();
    cluster.kill(old_leader).await.unwrap();
    let mut unknown = 0;
    for i in 0..20 {
        // The retrying client moves past the dead member and waits out the election; reads
        // retry by themselves, writes caught in the failover are resolved by reading.
        let key = format!("{prefix}during-{i}");
        unknown += put_resolving(&connection, &key, &i.to_string()).await;
        assert_eq!(
            connection.get(&key).await.unwrap(),
            Some(i.to_string().into_bytes())
        );
    }
    println!("writes with an unknown outcome during the failover: {unknown}");
    let new_leader = cluster.leader().await.unwrap();
    assert_ne!(new_leader, old_leader);

    // --- phase: the old leader comes back and catches up
    cluster.restart(old_leader).await.unwrap();
    let rejoined = only(cluster.endpoint(old_leader)).await;
    assert_eq!(
        reads(&rejoined, &format!("{prefix}during-19")).await,
        Some(b"19".to_vec()),
        "a linearizable read through the rejoined member sees what was written without it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_member_stops_serving_and_catches_up_after_healing() {
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let connection = Connection::connect(ConnectOptions::new(cluster.endpoints()))
        .await
        .unwrap();
    let key = format!("{}k", random_namespace().prefix());
    connection.put(&key, "before").await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let cut = (leader + 1) % cluster.len();
    let isolated = only(cluster.endpoint(cut)).await;
    assert_eq!(reads(&isolated, &key).await, Some(b"before".to_vec()));

    // --- phase: partitioned from its peers, still reachable by clients
    cluster.partition(cut).await.unwrap();
    let error = isolated
        .get(&key)
        .await
        .expect_err("no linearizable read without its peers");
    assert!(error.class().retry_read(), "{error}");
    put_resolving(&connection, &key, "during").await;

    // --- phase: healed, it catches up
    cluster.heal(cut).await.unwrap();
    wait_for(
        "the healed member to catch up",
        Duration::from_secs(30),
        || async {
            (reads(&isolated, &key).await.as_deref() == Some(b"during".as_slice())).then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn leadership_moves_and_a_paused_member_resumes() {
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let connection = Connection::connect(ConnectOptions::new(cluster.endpoints()))
        .await
        .unwrap();
    let key = format!("{}k", random_namespace().prefix());

    // --- phase: move leadership to each member in turn
    let first = cluster.leader().await.unwrap();
    for step in 1..=cluster.len() {
        let target = (first + step) % cluster.len();
        cluster.move_leader(target).await.unwrap();
        assert_eq!(cluster.leader().await.unwrap(), target);
    }

    // --- phase: a paused follower serves nothing; the others go on; it resumes
    let paused = (cluster.leader().await.unwrap() + 1) % cluster.len();
    cluster.pause(paused).await.unwrap();
    let frozen = tokio::time::timeout(Duration::from_secs(2), async {
        let mut options = ConnectOptions::new([cluster.endpoint(paused)]);
        options.connect_timeout = Duration::from_millis(500);
        Connection::connect(options).await
    })
    .await;
    assert!(
        !matches!(frozen, Ok(Ok(_))),
        "a paused member does not answer"
    );
    put_resolving(&connection, &key, "while paused").await;
    cluster.unpause(paused).await.unwrap();
    cluster.wait_ready(paused).await.unwrap();
    let resumed = only(cluster.endpoint(paused)).await;
    assert_eq!(reads(&resumed, &key).await, Some(b"while paused".to_vec()));
}
