//! What a router and a request handler need: a node's advertised address and metadata in its
//! owner keys and host key (read back by `Admin::owners`, `Admin::hosts`, `leasehold owners`
//! and `leasehold hosts`, and by `OwnerValue::decode` from the raw value), version 1 values
//! byte for byte when a node advertises nothing, typed errors for an address or metadata that
//! cannot be carried, and `SessionHost::rig` / `held` on the owner's side.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold::admin::Admin;
use leasehold::testing::wait_for;
use leasehold::{
    CancellationToken, HostOptions, OwnerValue, Rig, SessionHost, Store, StoreError, StoreOptions,
    Uuid,
};
use serde_json::Value;

const ADVERTISE: &str = "http://127.0.0.1:31501";

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

fn options(etcd: &common::Etcd, node: &str) -> StoreOptions {
    StoreOptions::new([etcd.node.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node(node)
        .with_ttl(Duration::from_secs(10), Duration::from_secs(1))
}

#[tokio::test(flavor = "multi_thread")]
async fn owners_and_hosts_carry_the_advertised_address_and_a_host_hands_out_its_rigs() {
    let etcd = common::Etcd::start().await;
    let routed = options(&etcd, "node a")
        .with_advertise(ADVERTISE)
        .with_metadata(b"zone=a".to_vec());
    let a = Arc::new(Store::connect(routed).await.unwrap());
    let b = Arc::new(Store::connect(options(&etcd, "node b")).await.unwrap());
    assert_eq!((a.advertise(), b.advertise()), (Some(ADVERTISE), None));
    let sessions: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    let hosts = [
        SessionHost::start(
            a.clone(),
            HostOptions::default().with_settle(Duration::ZERO),
            sessions.clone(),
            idle,
        ),
        SessionHost::start(
            b.clone(),
            HostOptions::default().with_settle(Duration::ZERO),
            sessions.clone(),
            idle,
        ),
    ];
    wait_for(
        "all six owned, three each",
        Duration::from_secs(10),
        || async { (hosts[0].held_count() == 3 && hosts[1].held_count() == 3).then_some(()) },
    )
    .await
    .unwrap();

    // --- the owner's side: each held session's rig, and nobody else's
    for (host, other) in [(&hosts[0], &hosts[1]), (&hosts[1], &hosts[0])] {
        for (session, epoch) in host.held() {
            let rig = host.rig(session).expect("a held session's rig");
            assert_eq!((rig.session_id(), rig.epoch()), (session, epoch));
            assert!(rig.is_valid());
            assert!(other.rig(session).is_none(), "not the other host's");
        }
    }
    assert!(hosts[0].rig(Uuid::new_v4()).is_none());

    // --- the owner keys: version 2 with the address, version 1 as before without
    let admin = Admin::new(a.connection().clone(), etcd.ns.clone());
    let owners = admin.owners().await.unwrap();
    assert_eq!(owners.len(), 6);
    let held_by_a: HashMap<Uuid, _> = hosts[0].held().into_iter().collect();
    for owner in &owners {
        let raw = etcd
            .raw
            .clone()
            .get(etcd.ns.owner_key(owner.session), None)
            .await
            .unwrap();
        let value = raw.kvs()[0].value();
        let decoded = OwnerValue::decode(value).expect("a leasehold owner value");
        if let Some(epoch) = held_by_a.get(&owner.session) {
            assert_eq!(owner.epoch, *epoch);
            assert_eq!(owner.advertise.as_deref(), Some(ADVERTISE));
            assert_eq!(owner.metadata, b"zone=a");
            assert!(value.starts_with(b"leasehold-owner/2 "));
            assert_eq!(decoded.advertise.as_deref(), Some(ADVERTISE));
            assert_eq!(decoded.node, "node a");
        } else {
            assert_eq!(
                (owner.advertise.as_deref(), owner.node.as_deref()),
                (None, Some("node b"))
            );
            assert!(owner.metadata.is_empty());
            let expected = format!(
                "leasehold-owner/1 {} {} node b",
                decoded.store, decoded.nonce
            );
            assert_eq!(value, expected.as_bytes(), "version 1, byte for byte");
        }
    }

    // --- the hosts: both, with what each holds
    let listed = admin.hosts().await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let host_a = listed.iter().find(|h| h.node == "node a").unwrap();
    let host_b = listed.iter().find(|h| h.node == "node b").unwrap();
    assert_eq!(host_a.advertise.as_deref(), Some(ADVERTISE));
    assert_eq!(host_a.metadata, b"zone=a");
    assert_eq!(host_b.advertise, None);
    assert_eq!((host_a.sessions, host_b.sessions), (3, 3));
    assert_eq!(host_a.lease_id, a.node_lease_id().unwrap());
    assert!(host_a.started_at.is_some() && host_b.started_at.is_some());

    // --- the same through the tool
    let etcd = &etcd;
    let json = |args: &'static [&'static str]| async move {
        let output = etcd.tool(args).await;
        assert!(output.status.success(), "{args:?}: {output:?}");
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let hosts_json = json(&["hosts", "--json"]).await;
    let mut rows: Vec<(String, Value, String, u64)> = hosts_json["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["node"].as_str().unwrap().to_owned(),
                h["advertise"].clone(),
                h["metadata_hex"].as_str().unwrap().to_owned(),
                h["sessions"].as_u64().unwrap(),
            )
        })
        .collect();
    rows.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        rows,
        [
            (
                "node a".into(),
                Value::from(ADVERTISE),
                "7a6f6e653d61".into(),
                3
            ),
            ("node b".into(), Value::Null, String::new(), 3),
        ]
    );
    let owners_json = json(&["owners", "--json"]).await;
    let advertised = owners_json["owners"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["advertise"] == ADVERTISE)
        .count();
    assert_eq!(advertised, 3);

    for host in &hosts {
        host.shutdown().await;
    }
    assert!(
        admin.hosts().await.unwrap().is_empty(),
        "their keys are gone"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_address_or_metadata_that_cannot_be_carried_is_refused_before_connecting() {
    let etcd = common::Etcd::start().await;
    for advertise in [
        "",
        "-",
        "127.0.0.1:31501",
        "http://",
        "http://a b:1",
        "http://a:1/\n",
        &format!("http://{}", "h".repeat(260)),
    ] {
        let refused = Store::connect(options(&etcd, "n").with_advertise(advertise)).await;
        assert!(
            matches!(&refused, Err(StoreError::InvalidAdvertise { advertise: a }) if a == advertise),
            "{advertise:?}: {refused:?}"
        );
    }
    let refused = Store::connect(options(&etcd, "n").with_metadata(vec![0; 257])).await;
    assert!(
        matches!(refused, Err(StoreError::InvalidMetadata { len: 257 })),
        "{refused:?}"
    );
    let store = Store::connect(
        options(&etcd, "n")
            .with_advertise("https://n1.internal:8443/leasehold")
            .with_metadata(vec![0; 256]),
    )
    .await
    .expect("the longest metadata, an address with a path");
    store.close().await;
    // The tool says the same, with exit code 2.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "--endpoints",
            etcd.node.endpoint(),
            "--namespace",
            etcd.ns.as_str(),
        ])
        .args(["--advertise", "not a url", "node", "--sessions", "1"])
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid advertised address"), "{stderr}");
}
