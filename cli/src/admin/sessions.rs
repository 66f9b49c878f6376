//! `sessions create|finish|list`: the shared session registry (`Admin::create_session`,
//! `Admin::finish_session`, `Admin::sessions`).

use std::time::Duration;

use clap::{Args, Subcommand};
use leasehold::Uuid;
use leasehold::admin::{Admin, RegisteredSession, RegistryError};
use serde_json::json;

use super::{hex, retention_failure};
use crate::Failure;

#[derive(Subcommand)]
pub(crate) enum SessionsCommand {
    /// Register a session: hosts that follow the registry (`node --registry`) host it at once.
    Create(CreateArgs),
    /// Finish a session: remove it from the registry, wait for its owner to release it, then
    /// delete its journal.
    Finish(FinishArgs),
    /// The registered sessions.
    List(ListArgs),
}

#[derive(Args)]
pub(crate) struct CreateArgs {
    /// The session (else a new random one, printed).
    session: Option<Uuid>,
    /// Its metadata, as text (at most 4096 bytes).
    #[arg(long)]
    metadata: Option<String>,
}

#[derive(Args)]
pub(crate) struct FinishArgs {
    /// The session.
    session: Uuid,
    /// How long to wait for its owner to release it, e.g. `30s`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    wait: Duration,
}

#[derive(Args)]
pub(crate) struct ListArgs {
    /// Print JSON Lines: `{"session", "created_revision", "metadata"}` (or `metadata_hex`).
    #[arg(long)]
    json: bool,
}

fn registry_failure(error: RegistryError) -> Failure {
    match error {
        RegistryError::Etcd(etcd) => Failure::etcd(etcd.class(), etcd),
        RegistryError::Journal(retention) => retention_failure(retention),
        RegistryError::MetadataTooLarge { .. } => Failure::usage(error),
        other => Failure::runtime(other),
    }
}

pub(crate) async fn sessions(admin: &Admin, command: &SessionsCommand) -> Result<(), Failure> {
    match command {
        SessionsCommand::Create(args) => {
            let session = args.session.unwrap_or_else(Uuid::new_v4);
            let metadata = args.metadata.as_deref().unwrap_or_default().as_bytes();
            let (registered, created) = admin
                .create_session(session, metadata)
                .await
                .map_err(registry_failure)?;
            let state = if created { "created" } else { "exists" };
            println!(
                "{state} session={} revision={}",
                registered.session, registered.created_revision
            );
        }
        SessionsCommand::Finish(args) => {
            let finished = admin
                .finish_session(args.session, args.wait)
                .await
                .map_err(registry_failure)?;
            println!(
                "finished session={} registered={} journal_keys_deleted={}",
                args.session, finished.was_registered, finished.journal.keys
            );
        }
        SessionsCommand::List(args) => {
            let sessions = admin
                .sessions()
                .await
                .map_err(|error| Failure::etcd(error.class(), error))?;
            for session in &sessions {
                print_session(session, args.json);
            }
            if !args.json {
                let count = sessions.len();
                let noun = if count == 1 { "session" } else { "sessions" };
                eprintln!("{count} {noun} registered");
            }
        }
    }
    Ok(())
}

fn print_session(session: &RegisteredSession, json: bool) {
    let text = std::str::from_utf8(&session.metadata).ok();
    if json {
        let mut line = json!({
            "session": session.session.to_string(),
            "created_revision": session.created_revision,
        });
        match text {
            Some(text) => line["metadata"] = json!(text),
            None => line["metadata_hex"] = json!(hex(&session.metadata)),
        }
        println!("{line}");
    } else {
        let metadata = text.map_or_else(|| hex(&session.metadata), str::to_owned);
        println!(
            "{} revision={} {metadata}",
            session.session, session.created_revision
        );
    }
}
