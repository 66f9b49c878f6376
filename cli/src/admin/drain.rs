//! `drain NODE [--wait]` and `undrain NODE`: asking a running session host to hand its
//! sessions over, or to take its share back (`Admin::drain`, `Admin::undrain`).

use std::time::Duration;

use clap::Args;
use leasehold::Uuid;
use leasehold::admin::{Admin, DrainError, Host};

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

/// The one live host named `node` (or with store `store`).
pub(super) async fn host_named(
    admin: &Admin,
    node: &str,
    store: Option<Uuid>,
) -> Result<Host, Failure> {
    let hosts = admin
        .hosts()
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?;
    let named: Vec<Host> = hosts
        .into_iter()
        .filter(|host| host.node == node && store.is_none_or(|store| host.store == store))
        .collect();
    match named.as_slice() {
        [host] => Ok(host.clone()),
        [] => Err(Failure::runtime_message(format!(
            "no live session host named {node:?}{} in namespace {} (see `leasehold hosts`)",
            store.map_or_else(String::new, |store| format!(" with store {store}")),
            admin.namespace()
        ))),
        several => Err(Failure::runtime_message(format!(
            "{} live hosts are named {node:?}: name one with --store ({})",
            several.len(),
            several
                .iter()
                .map(|host| host.store.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
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
