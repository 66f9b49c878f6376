//! `hosts [--json]`: the live session hosts.

use clap::Args;
use leasehold::Uuid;
use leasehold::admin::Host;
use serde::Serialize;
use serde_json::json;

use super::{Table, admin, ago, hex};
use crate::{Common, Failure};

#[derive(Args)]
pub(crate) struct HostsArgs {
    /// Print JSON (see the schema in `leasehold --help`).
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct HostJson {
    store: Uuid,
    node: String,
    advertise: Option<String>,
    metadata_hex: String,
    max_sessions: Option<usize>,
    draining: bool,
    weight: u32,
    sessions: usize,
    load: Option<f64>,
    started_at: Option<String>,
    lease_id: i64,
}

impl From<&Host> for HostJson {
    fn from(host: &Host) -> Self {
        Self {
            store: host.store,
            node: host.node.clone(),
            advertise: host.advertise.clone(),
            metadata_hex: hex(&host.metadata),
            max_sessions: host.max_sessions,
            draining: host.draining,
            weight: host.weight,
            sessions: host.sessions,
            load: host.load,
            started_at: host
                .started_at
                .map(|at| humantime::format_rfc3339_millis(at).to_string()),
            lease_id: host.lease_id,
        }
    }
}

pub(crate) async fn hosts(common: &Common, args: &HostsArgs) -> Result<(), Failure> {
    let admin = admin(common).await?;
    let hosts = admin
        .hosts()
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?;
    if args.json {
        let hosts: Vec<HostJson> = hosts.iter().map(HostJson::from).collect();
        println!("{}", json!({ "hosts": hosts }));
        return Ok(());
    }
    if hosts.is_empty() {
        println!("no live session hosts in namespace {}", admin.namespace());
        return Ok(());
    }
    let mut table = Table::new(
        &[
            "NODE",
            "ADVERTISE",
            "SESSIONS",
            "LOAD",
            "MAX",
            "SINCE",
            "STORE",
        ],
        &[false, false, true, true, true, false, false],
    );
    for host in &hosts {
        table.row(vec![
            host.node.clone(),
            host.advertise.clone().unwrap_or_else(|| "-".to_owned()),
            host.sessions.to_string(),
            host.load
                .map_or_else(|| "-".to_owned(), |load| format!("{load:.1}")),
            match host.max_sessions {
                _ if host.draining => "draining".to_owned(),
                Some(max) => max.to_string(),
                None => "-".to_owned(),
            },
            host.started_at.map_or_else(|| "-".to_owned(), ago),
            host.store.to_string(),
        ]);
    }
    table.print();
    Ok(())
}
