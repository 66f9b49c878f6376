//! `drain NODE [--wait]` and `undrain NODE`: asking a running session host to hand its
//! sessions over, or to take its share back (`Admin::drain`, `Admin::undrain`).

use std::time::Duration;

use clap::Args;
use leasehold::Uuid;
use leasehold::admin::{Admin, DrainError, Host, HostLookupError};

use crate::Failure;
use crate::node::wait_for_signal;

#[derive(Args)]
pub(crate) struct DrainArgs {
    /// The node to drain, by its name (see `leasehold hosts`).
    node: String,
    /// The host's store id, where several live hosts share the node's name.
    #[arg(long, value_name = "UUID")]
    store: Option<Uuid>,
    /// Return only once the node holds no session, printing how many are left as they go.
    #[arg(long)]
    wait: bool,
}

#[derive(Args)]
pub(crate) struct UndrainArgs {
    /// The node to undrain, by its name (see `leasehold hosts`).
    node: String,
    /// The host's store id, where several live hosts share the node's name.
    #[arg(long, value_name = "UUID")]
    store: Option<Uuid>,
}

/// The one live host named `node` ([`Admin::host_named`]), or, with `store`, the live host of
/// that name and store id.
pub(super) async fn host_named(
    admin: &Admin,
    node: &str,
    store: Option<Uuid>,
) -> Result<Host, Failure> {
    let missing = |with: String| {
        Failure::runtime_message(format!(
            "no live session host named {node:?}{with} in namespace {} (see `leasehold hosts`)",
            admin.namespace()
        ))
    };
    let Some(store) = store else {
        return admin.host_named(node).await.map_err(|error| match error {
            HostLookupError::NoSuchHost { .. } => missing(String::new()),
            HostLookupError::Etcd(etcd) => Failure::etcd(etcd.class(), etcd),
            ambiguous => Failure::runtime_message(format!("{ambiguous}: name one with --store")),
        });
    };
    let hosts = admin
        .hosts()
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?;
    hosts
        .into_iter()
        .find(|host| host.node == node && host.store == store)
        .ok_or_else(|| missing(format!(" with store {store}")))
}

fn drain_failure(error: DrainError) -> Failure {
    match error {
        DrainError::Etcd(etcd) => Failure::etcd(etcd.class(), etcd),
        other => Failure::runtime(other),
    }
}

pub(crate) async fn drain(admin: &Admin, args: &DrainArgs) -> Result<(), Failure> {
    let host = host_named(admin, &args.node, args.store).await?;
    admin.drain(host.store).await.map_err(drain_failure)?;
    println!(
        "asked {} (store {}) to drain: it holds {} sessions",
        host.node, host.store, host.sessions
    );
    if !args.wait {
        return Ok(());
    }
    let mut left = host.sessions;
    loop {
        let hosts = admin
            .hosts()
            .await
            .map_err(|error| Failure::etcd(error.class(), error))?;
        let Some(now) = hosts.into_iter().find(|h| h.store == host.store) else {
            return Err(Failure::runtime_message(format!(
                "{} left before it was drained (its host key is gone)",
                host.node
            )));
        };
        if now.draining && now.sessions == 0 {
            println!("{} drained", now.node);
            return Ok(());
        }
        if now.sessions != left {
            left = now.sessions;
            eprintln!("{}: {left} sessions left", now.node);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = wait_for_signal() => return Err(Failure::message("interrupted", 130)),
        }
    }
}

pub(crate) async fn undrain(admin: &Admin, args: &UndrainArgs) -> Result<(), Failure> {
    let host = host_named(admin, &args.node, args.store).await?;
    admin.undrain(host.store).await.map_err(drain_failure)?;
    println!(
        "asked {} (store {}) to take its share back",
        host.node, host.store
    );
    Ok(())
}
