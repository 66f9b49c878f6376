//! The owner directory against real etcd: it follows a fleet of hosts, marks a dead host's
//! sessions as soon as etcd deletes its host key, shows every moved session's new owner as soon
//! as etcd commits it (both measured against a raw etcd watch in the same process), never
//! names an owner etcd did not have at the revision it reports (checked against etcd's own
//! history), routes requests (`SessionHost::route`), and, cut off past a compaction, reads a
//! new snapshot and converges.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{GetOptions, WatchOptions};
use leasehold::admin::Admin;
use leasehold::directory::{Change, OwnerDirectory, SILENCE};
use leasehold::testing::{FaultProxy, wait_for};
use leasehold::{
    CancellationToken, ConnectOptions, Connection, HostOptions, Namespace, Rig, Route, SessionHost,
    Store, StoreOptions, Uuid,
};
use tokio::time::Instant;

/// The longest a change may take to reach the directory after a raw watch saw it.
const PROPAGATION: Duration = Duration::from_millis(100);

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// When a raw watch of `prefix` (in this process) first received each revision.
fn raw_receipts(
    raw: &etcd_client::Client,
    prefix: String,
    stop: CancellationToken,
) -> Arc<Mutex<HashMap<i64, Instant>>> {
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let (mut raw, into) = (raw.clone(), seen.clone());
    tokio::spawn(async move {
        let options = WatchOptions::new().with_prefix();
        let mut stream = raw.watch(prefix, Some(options)).await.unwrap();
        loop {
            let response = tokio::select! {
                response = stream.message() => response.unwrap().unwrap(),
                _ = stop.cancelled() => return,
            };
            let at = Instant::now();
            for event in response.events() {
                let revision = event.kv().unwrap().mod_revision();
                into.lock().unwrap().entry(revision).or_insert(at);
            }
        }
    });
    seen
}

/// The owners etcd had at `revision`: session → epoch.
async fn owners_at(
    raw: &etcd_client::Client,
    ns: &Namespace,
    revision: i64,
) -> BTreeMap<Uuid, u64> {
    let prefix = ns.owners_prefix();
    let options = GetOptions::new().with_prefix().with_revision(revision);
    let response = raw
        .clone()
        .get(prefix.as_str(), Some(options))
        .await
        .unwrap();
    response
        .kvs()
        .iter()
        .map(|kv| {
            let session = kv.key_str().unwrap().strip_prefix(&prefix).unwrap();
            (session.parse().unwrap(), kv.create_revision() as u64)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_directory_follows_a_fleet_and_marks_a_dead_hosts_sessions_at_once() {
    let etcd = common::Etcd::start().await;
    let ns = etcd.ns.clone();
    // --- phase: three hosts, each reaching etcd through a proxy (to kill it), over 300 sessions
    let sessions: Vec<Uuid> = (0..300).map(|_| Uuid::new_v4()).collect();
    let (mut proxies, mut stores, mut hosts) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..3 {
        let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
        let options = StoreOptions::new([proxy.endpoint()])
            .with_namespace(ns.clone())
            .with_node(format!("host {i}"))
            .with_advertise(format!("http://127.0.0.1:{}", 31500 + i))
            .with_ttl(Duration::from_secs(3), Duration::from_millis(500));
        let store = Arc::new(Store::connect(options).await.unwrap());
        hosts.push(SessionHost::start(
            store.clone(),
            HostOptions::default(),
            sessions.clone(),
            idle,
        ));
        proxies.push(proxy);
        stores.push(store);
    }
    // The router's side: a connection of its own.
    let connection = Connection::connect(ConnectOptions::new([etcd.node.endpoint()]))
        .await
        .unwrap();
    let admin = Admin::new(connection, ns.clone());
    let directory = admin.directory().await.unwrap();
    wait_for(
        "all 300 owned, 100 each, as the directory shows",
        Duration::from_secs(30),
        || async {
            let balanced = hosts.iter().all(|host| host.held_count() == 100);
            (balanced && directory.len() == 300 && directory.hosts().len() == 3).then_some(())
        },
    )
    .await
    .unwrap();

    // --- phase: it agrees with etcd, and routes
    let owners = admin.owners().await.unwrap();
    assert_eq!(owners.len(), 300);
    for owner in &owners {
        let known = directory.owner_of(owner.session).expect("known");
        assert_eq!(known.epoch, owner.epoch);
        assert_eq!(Some(known.node.store), owner.store);
        assert_eq!(known.node.advertise, owner.advertise);
        assert_eq!(Some(known.node.name.clone()), owner.node);
        assert!(known.host_alive);
    }
    let per_host: Vec<usize> = directory.hosts().iter().map(|h| h.sessions).collect();
    assert_eq!(per_host, [100, 100, 100]);
    let (one, two) = (&hosts[1], &hosts[2]);
    let (mine, _) = one.held()[0];
    let (theirs, _) = two.held()[0];
    assert!(matches!(one.route(mine, &directory), Route::Here(rig) if rig.session_id() == mine));
    match one.route(theirs, &directory) {
        Route::There(owner) => {
            assert_eq!(owner.node.store, stores[2].id());
            assert_eq!(
                owner.node.advertise.as_deref(),
                Some("http://127.0.0.1:31502")
            );
        }
        other => panic!("{other:?}"),
    }
    let stranger = Uuid::new_v4();
    assert!(matches!(one.route(stranger, &directory), Route::Unknown));
    let refused = one.route(theirs, &directory).into_rig().unwrap_err();
    assert!(
        refused.to_string().contains("http://127.0.0.1:31502"),
        "{refused}"
    );

    // --- phase: a raw watch, a sampler and the changes, all recording when
    let stop = CancellationToken::new();
    let raw_owners = raw_receipts(&etcd.raw, ns.owners_prefix(), stop.clone());
    let raw_hosts = raw_receipts(&etcd.raw, ns.hosts_prefix(), stop.clone());
    let dead = stores[0].id();
    let changes = Arc::new(Mutex::new(Vec::new()));
    // How many of the dead host's entries read alive when its HostGone arrived.
    let alive_at_gone = Arc::new(Mutex::new(None));
    {
        let (mut feed, into, alive_at_gone) =
            (directory.changes(), changes.clone(), alive_at_gone.clone());
        let (directory, stop) = (directory.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    change = feed.next() => change.unwrap(),
                    _ = stop.cancelled() => return,
                };
                let at = Instant::now();
                if matches!(&change, Change::HostGone { node, .. } if node.store == dead) {
                    let alive = directory
                        .snapshot()
                        .owners
                        .iter()
                        .filter(|o| o.node.store == dead && o.host_alive)
                        .count();
                    *alive_at_gone.lock().unwrap() = Some(alive);
                }
                into.lock().unwrap().push((change, at));
            }
        });
    }
    let samples = Arc::new(Mutex::new(Vec::new()));
    {
        let (directory, stop, into) = (directory.clone(), stop.clone(), samples.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let snapshot = directory.snapshot();
                let owners: BTreeMap<Uuid, u64> = snapshot
                    .owners
                    .iter()
                    .map(|o| (o.session, o.epoch.get()))
                    .collect();
                into.lock().unwrap().push((snapshot.revision, owners));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // --- phase: host 0 dies: cut off from etcd, its node lease expires
    let orphaned: HashSet<Uuid> = hosts[0].held().into_iter().map(|(s, _)| s).collect();
    assert!(!orphaned.is_empty());
    proxies[0].blackhole();
    wait_for(
        "every session owned by the survivors",
        Duration::from_secs(30),
        || async {
            let snapshot = directory.snapshot();
            let moved = snapshot.owners.len() == 300
                && snapshot
                    .owners
                    .iter()
                    .all(|o| o.node.store != dead && o.host_alive);
            (moved && one.held_count() + two.held_count() == 300).then_some(())
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();

    // --- checks: the dead host marked at once
    let changes = changes.lock().unwrap().clone();
    let (gone_revision, gone_at) = changes
        .iter()
        .find_map(|(change, at)| match change {
            Change::HostGone { node, revision, .. } if node.store == dead => Some((*revision, *at)),
            _ => None,
        })
        .expect("the dead host's HostGone");
    let raw_gone = raw_hosts.lock().unwrap()[&gone_revision];
    let marked_after = gone_at.saturating_duration_since(raw_gone);
    assert!(
        marked_after <= PROPAGATION,
        "marked {marked_after:?} after etcd's delete"
    );
    assert_eq!(
        *alive_at_gone.lock().unwrap(),
        Some(0),
        "none of its sessions read alive"
    );

    // --- checks: every moved session's new owner shown at once
    let raw_owners = raw_owners.lock().unwrap().clone();
    let mut delays: Vec<Duration> = changes
        .iter()
        .filter_map(|(change, at)| match change {
            Change::Acquired { owner } if orphaned.contains(&owner.session) => {
                Some(at.saturating_duration_since(raw_owners[&owner.revision]))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        delays.len(),
        orphaned.len(),
        "one acquisition seen per moved session"
    );
    delays.sort();
    let worst = *delays.last().unwrap();
    println!(
        "{} sessions moved; shown after etcd's commit: p50 {:?}, worst {worst:?}; dead host marked after {marked_after:?}",
        delays.len(),
        delays[delays.len() / 2]
    );
    assert!(
        worst <= PROPAGATION,
        "a new owner shown {worst:?} after etcd's commit"
    );
    let released: HashSet<Uuid> = changes
        .iter()
        .filter_map(|(change, _)| match change {
            Change::Released { owner, .. } => Some(owner.session),
            _ => None,
        })
        .collect();
    assert_eq!(
        released, orphaned,
        "exactly the dead host's sessions were released"
    );

    // --- checks: never an owner etcd did not have at the revision reported
    let samples = samples.lock().unwrap().clone();
    assert!(samples.len() > 20, "{} samples", samples.len());
    let mut revisions = HashSet::new();
    for (revision, owners) in &samples {
        if revisions.insert(*revision) {
            let etcd_had = owners_at(&etcd.raw, &ns, *revision).await;
            let differ: Vec<_> = owners
                .iter()
                .filter(|(session, epoch)| etcd_had.get(session) != Some(epoch))
                .chain(
                    etcd_had
                        .iter()
                        .filter(|(session, _)| !owners.contains_key(session)),
                )
                .collect();
            assert!(
                differ.is_empty(),
                "the directory at revision {revision}: {} sessions differ from etcd's, e.g. {:?}",
                differ.len(),
                &differ[..differ.len().min(3)]
            );
        }
    }
    println!(
        "{} samples at {} revisions agree with etcd's history",
        samples.len(),
        revisions.len()
    );

    // --- phase: a host that leaves deletes its key first: its sessions read dead before etcd
    // deletes their owner keys one by one
    let leaving = stores[1].id();
    let mut feed = directory.changes();
    let shutdown = tokio::spawn({
        let host = hosts.remove(1);
        async move { host.shutdown().await }
    });
    let (mut gone, mut released_dead, mut released_alive) = (false, 0, 0);
    while released_dead + released_alive < 150 {
        let change = tokio::time::timeout(Duration::from_secs(10), feed.next())
            .await
            .expect("the leaving host's changes")
            .unwrap();
        match change {
            Change::HostGone { node, sessions, .. } if node.store == leaving => {
                assert!(sessions > 0, "its key went before its sessions");
                gone = true;
            }
            Change::Released { owner, .. } if owner.node.store == leaving => {
                assert!(gone, "released after its host key went");
                if owner.host_alive {
                    released_alive += 1;
                } else {
                    released_dead += 1;
                }
            }
            _ => {}
        }
    }
    assert_eq!((released_dead, released_alive), (150, 0));
    shutdown.await.unwrap();
    for host in &hosts[1..] {
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_cut_off_past_a_compaction_snapshots_again_and_converges() {
    let etcd = common::Etcd::start().await;
    let ns = etcd.ns.clone();
    let store = etcd.store("writer", 10).await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let connection = Connection::connect(ConnectOptions::new([proxy.endpoint()]))
        .await
        .unwrap();
    let directory = OwnerDirectory::start(connection, ns.clone()).await.unwrap();
    let mut leases = Vec::new();
    for _ in 0..20 {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.unwrap());
    }
    wait_for(
        "the directory knows all 20",
        Duration::from_secs(10),
        || async { (directory.len() == 20).then_some(()) },
    )
    .await
    .unwrap();
    assert!(directory.lag().silent_for < SILENCE);

    // --- phase: cut off; 10 released and 10 acquired meanwhile, then etcd compacts
    let mut feed = directory.changes();
    let before = directory.revision();
    proxy.blackhole();
    let kept = leases.split_off(10);
    let mut released = HashSet::new();
    for lease in leases {
        released.insert(lease.session_id());
        lease.release().await.unwrap();
    }
    let mut acquired = HashSet::new();
    let mut newer = Vec::new();
    for _ in 0..10 {
        let lease = store.acquire_lease(Uuid::new_v4()).await.unwrap();
        acquired.insert(lease.session_id());
        newer.push(lease);
    }
    let latest = etcd
        .raw
        .clone()
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let lag = wait_for(
        "the directory hears nothing",
        Duration::from_secs(10),
        || async {
            let lag = directory.lag();
            (lag.silent_for >= Duration::from_secs(2)).then_some(lag)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        lag.applied, before,
        "nothing applied while cut off: {lag:?}"
    );
    assert!(lag.applied < latest, "{lag:?} vs {latest}");
    assert_eq!(directory.len(), 20, "its map as of its revision");
    etcd.raw.clone().compact(latest, None).await.unwrap();
    // Past the silence, so that the watch is taken for cut off and re-opened (in vain, first).
    tokio::time::sleep(SILENCE + Duration::from_secs(1)).await;

    // --- phase: healed: a new snapshot, applied as changes
    proxy.heal();
    wait_for(
        "the directory converges",
        Duration::from_secs(20),
        || async { (directory.revision() >= latest).then_some(()) },
    )
    .await
    .unwrap();
    let snapshot = directory.snapshot();
    assert_eq!(
        snapshot
            .owners
            .iter()
            .map(|o| o.session)
            .collect::<HashSet<_>>(),
        owners_at(&etcd.raw, &ns, snapshot.revision)
            .await
            .into_keys()
            .collect(),
    );
    let (mut seen_released, mut seen_acquired) = (HashSet::new(), HashSet::new());
    while seen_released.len() + seen_acquired.len() < 20 {
        let change = tokio::time::timeout(Duration::from_secs(5), feed.next())
            .await
            .expect("the gap's changes")
            .unwrap();
        match change {
            Change::Released { owner, revision } => {
                assert!(revision >= latest, "at the snapshot's revision: {revision}");
                seen_released.insert(owner.session);
            }
            Change::Acquired { owner } => {
                seen_acquired.insert(owner.session);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((seen_released, seen_acquired), (released, acquired));
    let lag = directory.lag();
    assert!(lag.silent_for < Duration::from_secs(2), "{lag:?}");
    assert!(lag.applied >= latest && lag.heard >= lag.applied, "{lag:?}");

    // --- phase: and it follows again
    let session = kept[0].session_id();
    kept[0].release().await.unwrap();
    wait_for("the release seen", Duration::from_secs(5), || async {
        directory.owner_of(session).is_none().then_some(())
    })
    .await
    .unwrap();
    store.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn owners_watch_prints_the_owners_then_each_change() {
    use tokio::io::{AsyncBufReadExt as _, BufReader};

    let etcd = common::Etcd::start().await;
    let store = Store::connect(
        StoreOptions::new([etcd.node.endpoint()])
            .with_namespace(etcd.ns.clone())
            .with_node("watched")
            .with_advertise("http://127.0.0.1:31599"),
    )
    .await
    .unwrap();
    let first = store.acquire_lease(Uuid::new_v4()).await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "--endpoints",
            etcd.node.endpoint(),
            "--namespace",
            etcd.ns.as_str(),
        ])
        .args(["owners", "--watch", "--json"])
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("a line")
            .unwrap()
            .expect("not ended");
        serde_json::from_str(&line).unwrap()
    };
    let owner = next().await;
    assert_eq!(owner["change"], "owner");
    assert_eq!(owner["session"], first.session_id().to_string());
    assert_eq!(owner["node"], "watched");
    assert_eq!(owner["advertise"], "http://127.0.0.1:31599");
    assert_eq!(owner["epoch"], first.epoch().get());
    assert_eq!(owner["host_alive"], true);
    let snapshot = next().await;
    assert_eq!(
        (&snapshot["change"], &snapshot["owners"]),
        (&"snapshot".into(), &1.into())
    );

    let second = store.acquire_lease(Uuid::new_v4()).await.unwrap();
    let acquired = next().await;
    assert_eq!(acquired["change"], "acquired");
    assert_eq!(acquired["session"], second.session_id().to_string());
    assert_eq!(acquired["revision"], second.epoch().get());
    first.release().await.unwrap();
    let released = next().await;
    assert_eq!(released["change"], "released");
    assert_eq!(released["session"], first.session_id().to_string());
    assert!(released["revision"].as_i64().unwrap() > acquired["revision"].as_i64().unwrap());
    child.kill().await.unwrap();
    store.close().await;
}

/// More owner keys than one page: the snapshot reads them range by range, all of them once, at
/// one revision (Admin::owners and the store's own owner snapshot read the same way).
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_many_pages_reads_every_key_once() {
    let etcd = common::Etcd::start().await;
    let store = Uuid::new_v4();
    let mut sessions: Vec<Uuid> = (0..2500).map(|_| Uuid::new_v4()).collect();
    // Keys at the ranges' edges too.
    sessions.extend(
        ["00000000", "1fffffff", "9fffffff", "a0000000", "ffffffff"].map(|head| {
            format!("{head}-0000-4000-8000-000000000000")
                .parse::<Uuid>()
                .unwrap()
        }),
    );
    for chunk in sessions.chunks(100) {
        let puts: Vec<etcd_client::TxnOp> = chunk
            .iter()
            .map(|session| {
                let value = format!("leasehold-owner/1 {store} {} many", Uuid::new_v4());
                etcd_client::TxnOp::put(etcd.ns.owner_key(*session), value, None)
            })
            .collect();
        etcd.raw
            .clone()
            .txn(etcd_client::Txn::new().and_then(puts))
            .await
            .unwrap();
    }
    let connection = Connection::connect(ConnectOptions::new([etcd.node.endpoint()]))
        .await
        .unwrap();
    let admin = Admin::new(connection, etcd.ns.clone());
    let directory = admin.directory().await.unwrap();
    let mut known: Vec<Uuid> = directory
        .snapshot()
        .owners
        .iter()
        .map(|o| o.session)
        .collect();
    let mut listed: Vec<Uuid> = admin
        .owners()
        .await
        .unwrap()
        .iter()
        .map(|o| o.session)
        .collect();
    sessions.sort();
    listed.sort();
    known.sort();
    for (what, got) in [("the directory", &known), ("Admin::owners", &listed)] {
        assert!(
            *got == sessions,
            "{what}: {} sessions, of {}",
            got.len(),
            sessions.len()
        );
    }
}
