//! `move SESSION --to NODE`: moving an owned session to another session host in one graceful
//! handover (`Admin::move_session`).

use std::time::{Duration, Instant};

use clap::Args;
use leasehold::Uuid;
use leasehold::admin::{Admin, MoveError};

use super::drain::host_named;
use crate::Failure;

#[derive(Args)]
pub(crate) struct MoveArgs {
    /// The session to move.
    session: Uuid,
    /// The node to move it to, by its name (see `leasehold hosts`).
    #[arg(long, value_name = "NODE")]
    to: String,
    /// The target host's store id, where several live hosts share the node's name.
    #[arg(long, value_name = "UUID")]
    store: Option<Uuid>,
    /// How long to wait for the move to complete before withdrawing it, e.g. `30s`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    wait: Duration,
}

pub(crate) async fn move_session(admin: &Admin, args: &MoveArgs) -> Result<(), Failure> {
    let target = host_named(admin, &args.to, args.store).await?;
    let started = Instant::now();
    let moved = admin
        .move_session(args.session, target.store, args.wait)
        .await
        .map_err(|error| match error {
            MoveError::Etcd(etcd) => Failure::etcd(etcd.class(), etcd),
            other => Failure::runtime(other),
        })?;
    if moved.already {
        println!(
            "session {} is held by {} already (epoch {})",
            moved.session, target.node, moved.epoch
        );
        return Ok(());
    }
    let from = moved
        .from
        .map_or_else(|| "?".to_owned(), |store| store.to_string());
    println!(
        "moved session {} from store {from} (epoch {}) to {} (epoch {}) in {} ms",
        moved.session,
        moved.from_epoch,
        target.node,
        moved.epoch,
        started.elapsed().as_millis()
    );
    Ok(())
}
