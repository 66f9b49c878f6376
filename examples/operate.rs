//! Operating a fleet from code with [`Admin`]: who is there, the session registry, a move, a
//! drain; what `leasehold hosts`, `owners`, `move`, `drain` and `sessions` do, as calls.
//!
//! Start the three nodes of `examples/first_service.rs` (its header says how), then:
//!
//! ```text
//! cargo run --example operate -- --drain b
//! ```
//!
//! It lists the live hosts and the owned sessions; creates a session in the registry and waits
//! until a node owns it; moves it to another node; drains `b` and waits until it holds nothing
//! (the nodes print the sessions leaving it); undrains `b`; and finishes the session (out of the
//! registry, its journal deleted). An admin holds no lease: run it from anywhere etcd is.

use std::time::Duration;

use clap::Parser;
use leasehold::{Admin, Uuid};

/// How long each step may take.
const WAIT: Duration = Duration::from_secs(30);

#[derive(Parser)]
struct Args {
    /// The node to drain.
    #[arg(long)]
    drain: String,
    /// etcd client URLs, comma-separated.
    #[arg(long, env = "LEASEHOLD_ENDPOINTS", value_delimiter = ',')]
    #[arg(default_value = "http://127.0.0.1:2379")]
    endpoints: Vec<String>,
    /// The namespace of the fleet.
    #[arg(long, env = "LEASEHOLD_NAMESPACE", default_value = "first-service")]
    namespace: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let drained = args.drain.as_str();
    let admin = Admin::connect(args.endpoints, args.namespace).await?;
    show(&admin).await?;

    // --- a session of the registry: every host of the registry hosts it, and one owns it
    let session = Uuid::now_v7();
    admin.create_session(session, b"operate.rs").await?;
    let owner = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(owner) = admin.owner(session).await? {
                return Ok::<_, leasehold::EtcdError>(owner);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await??;
    let (holder, epoch) = (owner.node.unwrap_or_default(), owner.epoch);
    println!("created {session}: owned by {holder} at epoch {epoch}");

    // --- a move, to a node by name: the holder hands the session straight to it, in order
    let hosts = admin.hosts().await?;
    if let Some(target) = hosts.iter().find(|host| host.node != holder) {
        let to = &target.node;
        let epoch = admin.move_session_to_node(session, to, WAIT).await?.epoch;
        println!("moved {session} to {to}: owned there at epoch {epoch}");
    }

    // --- a drain: the host hands every session over and takes none until undrained
    let held = admin.drain_node(drained).await?.sessions;
    println!("draining {drained}, which holds {held} session(s)");
    tokio::time::timeout(WAIT, async {
        loop {
            let host = admin.host_named(drained).await?;
            if host.draining && host.sessions == 0 {
                return Ok::<_, leasehold::admin::HostLookupError>(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await??;
    println!("{drained} is drained");
    show(&admin).await?;
    admin.undrain_node(drained).await?;
    println!("undrained {drained}: it takes its share back as the others shed");

    // --- finished: out of the registry, released by its owner, its journal deleted
    let deleted = admin.finish_session(session, WAIT).await?.journal.keys;
    println!("finished {session}: {deleted} journal keys deleted");
    Ok(())
}

/// Prints the live hosts and the owned sessions, each list read at one revision.
async fn show(admin: &Admin) -> Result<(), leasehold::EtcdError> {
    for host in admin.hosts().await? {
        let (node, held) = (&host.node, host.sessions);
        let address = host.advertise.as_deref().unwrap_or("-");
        let draining = if host.draining { ", draining" } else { "" };
        println!("host {node} at {address}: {held} session(s){draining}");
    }
    for owner in admin.owners().await? {
        let (session, epoch) = (owner.session, owner.epoch);
        let node = owner.node.as_deref().unwrap_or("?");
        let seq = owner.tip.map_or(0, |tip| tip.seq);
        println!("  session {session} on {node}, epoch {epoch}, journal at seq {seq}");
    }
    Ok(())
}
