//! `leasehold demo`: the whole story in one process, as a readable timeline.
//!
//! Three nodes share one etcd (a throwaway one, started from the `etcd` binary with its data in
//! a temporary directory, unless `--endpoints` names a cluster). node-a and node-b own two
//! sessions each; node-c stands by on all four. node-a freezes (a long GC pause, played by
//! cutting its connection to etcd) right as it sends an append: its local deadline tells it
//! that it lost ownership, etcd expires its lease, node-c takes over with a fence, and when
//! node-a wakes up its stale append is refused with `AppendError`. node-b then leaves
//! gracefully and node-c takes its sessions at once. Last, every journal is printed.
//!
//! node-c's four acquisitions run from the moment it stands by, each on a task of its own, and
//! each notes the time it completed; node-a's loss is timed the same way. The lines carry these
//! event times (`node-a knows it lost session … at 2.183 s`, `node-c took over session … at
//! epoch … at 2.902 s`), so the order they show is the order things happened, not the order of
//! the code that prints them.
//!
//! On a cluster of yours (`--endpoints`) the demo writes in a namespace of its own beside
//! `--namespace` and deletes it however it ends ([`super::scratch`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::fault::FaultProxy;
use leasehold::{
    AcquireError, ConnectOptions, Connection, JournalWriteError, Lease, Lost, Namespace, Record,
    RetryPolicy, Rig, Store, WritePolicy,
};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use uuid::Uuid;

use super::node::{Timeline, numbered_session};
use super::scratch::Reached;
use super::{Common, Failure};

/// A throwaway etcd: killed and its data removed when dropped.
pub(crate) struct ThrowawayEtcd {
    _child: Child,
    _data: tempfile::TempDir,
    pub(crate) endpoint: String,
}

fn etcd_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LEASEHOLD_ETCD_BIN") {
        return Some(PathBuf::from(path));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("etcd"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        let home = std::env::var_os("HOME")?;
        let cached = PathBuf::from(home).join(".cache/leasehold/etcd-3.5.16/usr/bin/etcd");
        cached.is_file().then_some(cached)
    })
}

fn free_port() -> Result<u16, Failure> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(Failure::runtime)
}

pub(crate) async fn start_etcd(timeline: &Timeline) -> Result<ThrowawayEtcd, Failure> {
    let binary = etcd_binary().ok_or_else(|| {
        Failure::message(
            "no etcd binary: set LEASEHOLD_ETCD_BIN, put etcd on PATH, or run ./deploy/dev.sh demo",
            2,
        )
    })?;
    let data = tempfile::tempdir().map_err(Failure::runtime)?;
    let (client, peer) = (free_port()?, free_port()?);
    let endpoint = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(data.path().join("etcd.log")).map_err(Failure::runtime)?;
    let child = Command::new(&binary)
        .arg("--name=demo")
        .arg(format!("--data-dir={}", data.path().join("data").display()))
        .arg(format!("--listen-client-urls={endpoint}"))
        .arg(format!("--advertise-client-urls={endpoint}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=demo={peer_url}"))
        .stdout(log.try_clone().map_err(Failure::runtime)?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| {
            Failure::message(format!("cannot start {}: {error}", binary.display()), 2)
        })?;
    let etcd = ThrowawayEtcd {
        _child: child,
        _data: data,
        endpoint,
    };
    let options = ConnectOptions::new([etcd.endpoint.as_str()])
        .with_retry(RetryPolicy::default().with_deadline(Duration::from_secs(15)));
    let connection = Connection::connect(options)
        .await
        .map_err(Failure::runtime)?;
    let status = connection.status().await.map_err(Failure::runtime)?;
    timeline.say(
        "etcd",
        format_args!(
            "{} started at {} (throwaway: data in a temporary directory)",
            status.version, etcd.endpoint
        ),
    );
    Ok(etcd)
}

pub(crate) async fn run(common: &Common) -> Result<(), Failure> {
    // A namespace of its own, beside --namespace, so that the demo can run against any
    // cluster; removed however the demo ends, also on SIGINT or SIGTERM (exit code 130).
    let namespace = super::scratch::namespace(common, "demo")?;
    let timeline = Timeline::new();
    let reached = Reached::default();
    let demo = demo(common, &namespace, &timeline, &reached);
    super::scratch::run_then_remove(common, &namespace, &timeline, "demo", &reached, demo).await
}

async fn demo(
    common: &Common,
    namespace: &Namespace,
    timeline: &Timeline,
    reached: &Reached,
) -> Result<(), Failure> {
    let say = |who: &str, what: std::fmt::Arguments<'_>| timeline.say(who, what);
    let (endpoints, _etcd) = match &common.endpoints {
        Some(endpoints) => (endpoints.clone(), None),
        None if common.is_secured() => {
            return Err(Failure::message(
                "the demo's own etcd is plain: TLS and --user need --endpoints",
                2,
            ));
        }
        None => {
            let etcd = start_etcd(timeline).await?;
            (vec![etcd.endpoint.clone()], Some(etcd))
        }
    };
    let options = |node: &str, endpoints: Vec<String>| {
        let mut options = common.store_options(endpoints, node)?;
        options.namespace = namespace.clone();
        options.ttl = Duration::from_secs(3);
        options.margin = Duration::from_secs(1);
        Ok::<_, Failure>(options)
    };
    let connect =
        |options| async move { Store::connect(options).await.map_err(super::store_failure) };

    // node-a reaches etcd through a proxy, so that the demo can freeze it.
    let proxy = FaultProxy::start(&endpoints[0])
        .await
        .map_err(Failure::runtime)?;
    // node-a waits up to 3 s for each answer: its last read, which settles the append it sent
    // as it froze, then outlasts the freeze even on a loaded machine, and the demo can show
    // that append refused rather than unknown.
    let a = connect(
        options("node-a", vec![proxy.endpoint()])?
            .with_write_policy(WritePolicy::default().with_attempt_timeout(Duration::from_secs(3))),
    )
    .await?;
    reached.set();
    let b = connect(options("node-b", endpoints.clone())?).await?;
    let c = Arc::new(connect(options("node-c", endpoints.clone())?).await?);
    say(
        "demo",
        format_args!("three nodes, node lease TTL 3 s, safety margin 1 s, namespace {namespace}"),
    );
    let sessions: Vec<Uuid> = (0..4).map(|i| numbered_session(namespace, i)).collect();
    // Numbered sessions differ in their last digits.
    let short = |s: &Uuid| s.simple().to_string()[24..].to_owned();

    // --- acquisitions
    let mut rigs = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let (store, name) = if i < 2 {
            (&a, "node-a")
        } else {
            (&b, "node-b")
        };
        let rig = Rig::open(store, *session, &format!("ws-{session}"))
            .await
            .map_err(Failure::runtime)?;
        say(
            name,
            format_args!(
                "acquired session {} at epoch {}; journal fenced and open",
                short(session),
                rig.epoch()
            ),
        );
        for n in 1..=2 {
            rig.journal()
                .append(format!("{name}: work {n}"))
                .await
                .map_err(Failure::runtime)?;
        }
        rigs.push(Some(rig));
    }
    // Each acquisition on a task of its own, running from now on, noting when it completed.
    let mut standbys: Vec<AbortOnDropHandle<(Result<Lease, AcquireError>, Duration)>> = sessions
        .iter()
        .map(|session| {
            let (c, session, timeline) = (c.clone(), *session, timeline.clone());
            AbortOnDropHandle::new(tokio::spawn(async move {
                let lease = c.acquire_lease_wait(session, Duration::from_secs(60)).await;
                (lease, timeline.elapsed())
            }))
        })
        .collect();
    say(
        "node-c",
        format_args!("stands by on all four sessions (watching their owner keys)"),
    );

    // --- node-a freezes as it sends an append
    let frozen = rigs[0].take().expect("node-a's first rig");
    let second = rigs[1].take().expect("node-a's second rig");
    // When node-a learns of each loss, timed as the acquisitions are.
    let lost_at = |lost: Lost| {
        let timeline = timeline.clone();
        async move {
            let reason = lost.await;
            (reason, timeline.elapsed())
        }
    };
    let frozen_lost = lost_at(frozen.lost());
    let second_lost = lost_at(second.lost());
    say(
        "node-a",
        format_args!("freezes (a long GC pause): its connection to etcd goes silent"),
    );
    let frozen_at = Instant::now();
    proxy.blackhole();
    let stale = AbortOnDropHandle::new(tokio::spawn(async move {
        let result = frozen
            .journal()
            .append("node-a: a write from before the pause")
            .await;
        (result, frozen)
    }));
    let losses = tokio::join!(frozen_lost, second_lost);
    for (i, (reason, at)) in [losses.0, losses.1].into_iter().enumerate() {
        let whose = if standbys[i].is_finished() {
            "but node-c already took it over"
        } else {
            "its own deadline; no one else owns it yet"
        };
        say(
            "node-a",
            format_args!(
                "knows it lost session {} at {:.3} s: {reason} ({whose})",
                short(&sessions[i]),
                at.as_secs_f64()
            ),
        );
    }
    let mut taken = Vec::new();
    for (i, standby) in standbys.iter_mut().enumerate().take(2) {
        let (lease, at) = standby.await.map_err(Failure::runtime)?;
        let lease = lease.map_err(Failure::runtime)?;
        let epoch = lease.epoch();
        let rig = Rig::with_lease(&c, lease, &format!("ws-{}", sessions[i]))
            .await
            .map_err(Failure::runtime)?;
        say(
            "node-c",
            format_args!(
                "took over session {} at epoch {epoch} at {:.3} s, once etcd expired node-a's lease; its fence is in",
                short(&sessions[i]),
                at.as_secs_f64()
            ),
        );
        taken.push(rig);
    }

    // --- node-a wakes up
    proxy.heal();
    say(
        "node-a",
        format_args!(
            "wakes up after {:.1} s; its append, sent as it froze, reaches etcd",
            frozen_at.elapsed().as_secs_f64()
        ),
    );
    let (result, frozen) = stale.await.map_err(Failure::runtime)?;
    match result {
        Err(JournalWriteError::Fenced(error)) => {
            say(
                "node-a",
                format_args!("stale append refused: AppendError: {error}"),
            );
        }
        other => {
            return Err(Failure::message(
                format!(
                    "the stale append was expected to be refused with AppendError, got {other:?}"
                ),
                1,
            ));
        }
    }
    drop(frozen);
    drop(second);

    // --- node-b leaves gracefully
    say(
        "node-b",
        format_args!("leaves gracefully: last append, workspace root, lease"),
    );
    let left = timeline.elapsed();
    for rig in rigs.iter_mut().skip(2).filter_map(Option::take) {
        rig.shutdown().await.map_err(Failure::runtime)?;
    }
    for (i, standby) in standbys.iter_mut().enumerate().skip(2) {
        let (lease, at) = standby.await.map_err(Failure::runtime)?;
        let lease = lease.map_err(Failure::runtime)?;
        say(
            "node-c",
            format_args!(
                "took over session {} at epoch {} at {:.3} s, {} ms after node-b began to leave",
                short(&sessions[i]),
                lease.epoch(),
                at.as_secs_f64(),
                at.saturating_sub(left).as_millis()
            ),
        );
        let rig = Rig::with_lease(&c, lease, &format!("ws-{}", sessions[i]))
            .await
            .map_err(Failure::runtime)?;
        taken.push(rig);
    }
    for rig in &taken {
        rig.journal()
            .append("node-c: work 1")
            .await
            .map_err(Failure::runtime)?;
    }

    // --- the journals
    for session in &sessions {
        println!("\njournal of session {}:", short(session));
        let mut records = c.replay_records(*session);
        while let Some(record) = records.next().await {
            match record.map_err(Failure::runtime)? {
                Record::Fence(fence) => println!(
                    "  {:>3}  fence  epoch {:<6} {}",
                    fence.seq,
                    fence.epoch,
                    fence
                        .previous
                        .map_or("(new journal)".to_owned(), |tip| format!(
                            "(after seq {}, epoch {})",
                            tip.seq, tip.epoch
                        ))
                ),
                Record::Event(event) => println!(
                    "  {:>3}  event  epoch {:<6} {}",
                    event.seq,
                    event.epoch,
                    String::from_utf8_lossy(&event.payload)
                ),
            }
        }
    }
    println!();
    drop(standbys);
    for rig in taken {
        rig.shutdown().await.map_err(Failure::runtime)?;
    }
    for store in [&a, &b, &*c] {
        store.close().await;
    }
    say("demo", format_args!("done"));
    Ok(())
}
