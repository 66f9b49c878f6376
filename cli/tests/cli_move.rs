//! `leasehold move SESSION --to NODE`: a session moved to a named node, and a name no live host
//! has refused in one line (exit code 1). The move itself is `Admin::move_session`, whose
//! handover the library's tests/host_move.rs checks in etcd's history.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::fleet::Fleet;
use leasehold::Uuid;
use leasehold::testing::wait_for;

const SESSIONS: usize = 30;

#[tokio::test(flavor = "multi_thread")]
async fn leasehold_move_moves_a_session_to_a_named_node_and_refuses_in_one_line() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let fleet = Fleet::start(&etcd, &sessions).await;
    let session = fleet.hosts[1].held()[0].0;
    let args = |to: &str| {
        vec![
            "move".to_owned(),
            session.to_string(),
            "--to".into(),
            to.into(),
        ]
    };

    let refused = etcd.tool(args("nobody")).await;
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no live session host named \"nobody\""),
        "{stderr}"
    );

    let moved = etcd.tool(args("h0")).await;
    assert!(moved.status.success(), "{moved:?}");
    let stdout = String::from_utf8_lossy(&moved.stdout);
    assert!(
        stdout.contains(&format!("moved session {session}")),
        "{stdout}"
    );
    assert!(stdout.contains("to h0"), "{stdout}");
    wait_for("h0's rig", Duration::from_secs(5), || async {
        fleet.holds(0, session).then_some(())
    })
    .await
    .unwrap();
    for host in &fleet.hosts {
        host.shutdown().await;
    }
}
