//! `owners --watch`: the owner directory's changes as they happen.

use std::sync::Arc;

use leasehold::admin::Admin;
use leasehold::directory::{Change, Node, Owner};
use serde::Serialize;
use serde_json::json;

use super::Table;
use crate::Failure;
use crate::node::wait_for_signal;

/// A directory owner as `owners --watch --json` prints it.
#[derive(Serialize)]
struct OwnerJson<'a> {
    session: leasehold::Uuid,
    node: &'a str,
    store: leasehold::Uuid,
    epoch: u64,
    advertise: Option<&'a str>,
    lease_id: i64,
    revision: i64,
    host_alive: bool,
}

impl<'a> From<&'a Owner> for OwnerJson<'a> {
    fn from(owner: &'a Owner) -> Self {
        Self {
            session: owner.session,
            node: &owner.node.name,
            store: owner.node.store,
            epoch: owner.epoch.get(),
            advertise: owner.node.advertise.as_deref(),
            lease_id: owner.lease_id,
            revision: owner.revision,
            host_alive: owner.host_alive,
        }
    }
}

fn node_json(node: &Node) -> serde_json::Value {
    json!({ "store": node.store, "node": node.name, "advertise": node.advertise })
}

/// One change as a JSON line.
fn change_json(change: &Change) -> serde_json::Value {
    let with = |kind: &str, owner: &Owner| {
        let mut line = serde_json::to_value(OwnerJson::from(owner)).unwrap_or_default();
        line["change"] = json!(kind);
        line
    };
    match change {
        Change::Acquired { owner } => with("acquired", owner),
        Change::Released { owner, revision } => {
            let mut line = with("released", owner);
            line["revision"] = json!(revision);
            line
        }
        Change::Moved { from, to } => {
            let mut line = with("moved", to);
            line["from"] = serde_json::to_value(OwnerJson::from(from)).unwrap_or_default();
            line
        }
        Change::HostJoined { node, revision } => {
            let mut line = node_json(node);
            line["change"] = json!("host_joined");
            line["revision"] = json!(revision);
            line
        }
        Change::HostGone {
            node,
            sessions,
            revision,
        } => {
            let mut line = node_json(node);
            line["change"] = json!("host_gone");
            line["sessions"] = json!(sessions);
            line["revision"] = json!(revision);
            line
        }
        Change::Missed { changes } => json!({ "change": "missed", "changes": changes }),
        _ => json!({ "change": "unknown" }),
    }
}

fn named(node: &Arc<Node>) -> String {
    match &node.advertise {
        Some(advertise) => format!("{} ({advertise})", node.name),
        None => node.name.clone(),
    }
}

/// One change as a line for people.
fn change_line(change: &Change) -> String {
    match change {
        Change::Acquired { owner } => format!(
            "r{} acquired {} by {} at epoch {}",
            owner.revision,
            owner.session,
            named(&owner.node),
            owner.epoch
        ),
        Change::Released { owner, revision } => format!(
            "r{revision} released {} by {}{}",
            owner.session,
            named(&owner.node),
            if owner.host_alive { "" } else { " (host gone)" }
        ),
        Change::Moved { from, to } => format!(
            "r{} moved {} from {} to {} at epoch {}",
            to.revision,
            to.session,
            named(&from.node),
            named(&to.node),
            to.epoch
        ),
        Change::HostJoined { node, revision } => {
            format!("r{revision} host {} joined", named(node))
        }
        Change::HostGone {
            node,
            sessions,
            revision,
        } => format!(
            "r{revision} host {} gone, its {sessions} sessions no longer served",
            named(node)
        ),
        Change::Missed { changes } => format!(
            "missed {changes} changes (this terminal fell behind); `leasehold owners` shows the current owners"
        ),
        _ => "an unknown change".to_owned(),
    }
}

/// Prints the owners, then every change until interrupted.
pub(super) async fn owners_watch(admin: &Admin, json: bool) -> Result<(), Failure> {
    let directory = admin
        .directory()
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?;
    // Subscribed before the snapshot is printed, so that no change falls between the two.
    let mut changes = directory.changes();
    let snapshot = directory.snapshot();
    if json {
        for owner in &snapshot.owners {
            let mut line = serde_json::to_value(OwnerJson::from(owner)).unwrap_or_default();
            line["change"] = json!("owner");
            println!("{line}");
        }
        println!(
            "{}",
            json!({ "change": "snapshot", "revision": snapshot.revision, "owners": snapshot.owners.len() })
        );
    } else {
        let mut table = Table::new(
            &["SESSION", "NODE", "ADVERTISE", "EPOCH"],
            &[false, false, false, true],
        );
        for owner in &snapshot.owners {
            table.row(vec![
                owner.session.to_string(),
                owner.node.name.clone(),
                owner
                    .node
                    .advertise
                    .clone()
                    .unwrap_or_else(|| "-".to_owned()),
                owner.epoch.to_string(),
            ]);
        }
        if !snapshot.owners.is_empty() {
            table.print();
        }
        println!(
            "{} owned sessions at revision {}; watching (interrupt to stop)",
            snapshot.owners.len(),
            snapshot.revision
        );
    }
    loop {
        let change = tokio::select! {
            change = changes.next() => change,
            () = wait_for_signal() => return Ok(()),
        };
        let Some(change) = change else {
            return Ok(());
        };
        if json {
            println!("{}", change_json(&change));
        } else {
            println!("{}", change_line(&change));
        }
    }
}
