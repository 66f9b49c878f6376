//! The operator's commands: `owners`, `hosts`, `drain`, `undrain`, `journal show|trim|delete`,
//! `revoke`, `check`.
//!
//! Each is a thin command over [`leasehold::admin::Admin`]: it needs a connection to etcd,
//! never a node lease. Human output is aligned tables with relative times; `--json` prints one
//! stable schema per command (below), for scripts. Exit codes are those of the tool: 0 ok, 1 a
//! failure or a violation, 2 bad input, 3 etcd unreachable or unavailable.
//!
//! # JSON schemas
//!
//! - `owners --json`: one object, `{"owners": [owner…]}`, each owner
//!   `{"session", "node", "store", "epoch", "acquired_at", "advertise", "lease_id",
//!   "ttl_left_secs", "tip", "load"}` where `node`, `store`, `acquired_at` (RFC 3339, the
//!   holder's clock), `advertise`, `ttl_left_secs`, `tip` (`{"seq", "epoch"}`) and `load` (the
//!   session's smoothed load as its host last published it, which it does for its hottest
//!   sessions only, 16 by default, none idle) may be `null`.
//! - `owners --watch --json`: JSON Lines: one `{"change": "owner", …}` per owner now, then
//!   `{"change": "snapshot", "revision", "owners"}`, then one line per change as it happens:
//!   `"acquired"`, `"released"` and `"moved"` (with `"from"`, the owner before) carry an owner
//!   `{"session", "node", "store", "epoch", "advertise", "lease_id", "revision",
//!   "host_alive"}`; `"host_joined"` and `"host_gone"` (with `"sessions"`, how many it still
//!   owned) carry `{"store", "node", "advertise", "revision"}`; `"missed"` carries
//!   `"changes"`, how many this output fell behind by.
//! - `hosts --json`: `{"hosts": [host…]}`, each host `{"store", "node", "advertise",
//!   "metadata_hex", "max_sessions", "draining", "weight", "sessions", "load", "started_at",
//!   "lease_id"}` where `advertise`, `max_sessions` (0 while draining), `load` (the sum of its
//!   sessions' smoothed loads as it last published it) and `started_at` (RFC 3339, the host's
//!   clock) may be `null` and `metadata_hex` is `""` without metadata.
//! - `journal show --json`: JSON Lines, one object per record: `{"seq", "epoch", "kind"}`
//!   with `kind` `"event"` or `"fence"`; an event adds `"payload"` (UTF-8 text) or, when the
//!   payload is not UTF-8, `"payload_hex"`; a fence adds `"previous"` (`{"seq", "epoch"}` or
//!   `null`). With `--follow` the lines go on as records commit.
//! - `journal trim --json`: `{"session", "base", "removed"}`.
//! - `journal delete --json`: `{"session", "deleted_keys"}`.
//! - `revoke --json`: `{"session", "epoch", "node"}`: the owner revoked.
//! - `check --json`: `{"sound", "journals": [journal…]}`, each journal `{"session", "sound",
//!   "revision", "base", "records", "events", "fences", "tip", "violations"}`, each violation
//!   `{"seq", "message"}` (`seq` of the offending record, or `null`).

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use futures_util::StreamExt as _;
use leasehold::admin::{Admin, Owner, RevokeError};
use leasehold::journal::JournalCheck;
use leasehold::{Record, ReplayError, ReplayOptions, RetentionError, Tip, Uuid};
use serde::Serialize;
use serde_json::{Value, json};

use super::{Common, Failure};

mod drain;
mod hosts;
mod moves;
mod sessions;
mod watch;

pub(crate) use drain::{DrainArgs, UndrainArgs};
pub(crate) use moves::MoveArgs;

pub(crate) async fn move_session(common: &Common, args: &MoveArgs) -> Result<(), Failure> {
    moves::move_session(&admin(common).await?, args).await
}
pub(crate) use sessions::SessionsCommand;

pub(crate) async fn sessions(common: &Common, command: &SessionsCommand) -> Result<(), Failure> {
    sessions::sessions(&admin(common).await?, command).await
}
pub(crate) use hosts::{HostsArgs, hosts};

pub(crate) async fn drain(common: &Common, args: &DrainArgs) -> Result<(), Failure> {
    drain::drain(&admin(common).await?, args).await
}

pub(crate) async fn undrain(common: &Common, args: &UndrainArgs) -> Result<(), Failure> {
    drain::undrain(&admin(common).await?, args).await
}

#[derive(Args)]
pub(crate) struct OwnersArgs {
    /// Print JSON (see the schema in `leasehold --help`).
    #[arg(long)]
    json: bool,
    /// Then print each change of ownership as it happens (from a watch), until interrupted.
    #[arg(long)]
    watch: bool,
}

#[derive(Subcommand)]
pub(crate) enum JournalCommand {
    /// A journal's bounds and events (or every record, fences included).
    Show(ShowArgs),
    /// Removes the records before `--before`, keeping it and every later record.
    Trim(TrimArgs),
    /// Deletes a finished session's journal (refused while anyone owns the session).
    Delete(DeleteArgs),
}

#[derive(Args)]
pub(crate) struct ShowArgs {
    /// The session.
    session: Uuid,
    /// Every record, fences included (else events only).
    #[arg(long)]
    records: bool,
    /// Start at this sequence number (else at the journal's base).
    #[arg(long, value_name = "SEQ", value_parser = clap::value_parser!(u64).range(1..))]
    from: Option<u64>,
    /// Then stream new records as they commit, until interrupted.
    #[arg(long)]
    follow: bool,
    /// Print JSON Lines, one record per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct TrimArgs {
    /// The session.
    session: Uuid,
    /// The first sequence number to keep.
    #[arg(long, value_name = "SEQ", value_parser = clap::value_parser!(u64).range(1..))]
    before: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct DeleteArgs {
    /// The session.
    session: Uuid,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct RevokeArgs {
    /// The session whose owner key to delete: its holder loses it (`revoked`) and a standby
    /// takes over.
    session: Uuid,
    /// Do not ask for confirmation (it is not asked without a terminal either).
    #[arg(long)]
    yes: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The sessions to check [default: every journal of the namespace].
    sessions: Vec<Uuid>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

async fn admin(common: &Common) -> Result<Admin, Failure> {
    Ok(Admin::new(
        common.connection().await?,
        common.namespace.clone(),
    ))
}

fn retention_failure(error: RetentionError) -> Failure {
    match &error {
        RetentionError::Etcd(etcd) => Failure::etcd(etcd.class(), error),
        RetentionError::BeyondTip { tip: 0, .. } => {
            Failure::runtime_message("the session has no journal")
        }
        RetentionError::BeyondTip { .. } => Failure::usage(error),
        _ => Failure::runtime(error),
    }
}

fn replay_failure(error: ReplayError) -> Failure {
    match &error {
        ReplayError::Etcd(etcd) => Failure::etcd(etcd.class(), error),
        _ => Failure::runtime(error),
    }
}

/// `3m 12s ago`, to the second.
fn ago(at: SystemTime) -> String {
    match SystemTime::now().duration_since(at) {
        Ok(elapsed) => format!(
            "{} ago",
            humantime::format_duration(Duration::from_secs(elapsed.as_secs()))
        ),
        Err(_) => "just now".to_owned(),
    }
}

fn tip_json(tip: Option<Tip>) -> Value {
    tip.map_or(
        Value::Null,
        |tip| json!({"seq": tip.seq, "epoch": tip.epoch.get()}),
    )
}

/// Columns padded to their widest cell; numbers right-aligned.
struct Table {
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    fn new(headers: &[&str], right: &[bool]) -> Self {
        Self {
            rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()],
            right: right.to_vec(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn print(&self) {
        let columns = self.rows[0].len();
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = std::io::stdout().lock();
        for row in &self.rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .zip(&self.right)
                .map(|((cell, &width), &right)| match right {
                    true => format!("{cell:>width$}"),
                    false => format!("{cell:<width$}"),
                })
                .collect();
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
    }
}

#[derive(Serialize)]
struct OwnerJson {
    session: Uuid,
    node: Option<String>,
    store: Option<Uuid>,
    epoch: u64,
    acquired_at: Option<String>,
    advertise: Option<String>,
    lease_id: i64,
    ttl_left_secs: Option<u64>,
    tip: Value,
    load: Option<f64>,
}

impl From<&Owner> for OwnerJson {
    fn from(owner: &Owner) -> Self {
        Self {
            session: owner.session,
            node: owner.node.clone(),
            store: owner.store,
            epoch: owner.epoch.get(),
            acquired_at: owner
                .acquired_at
                .map(|at| humantime::format_rfc3339_millis(at).to_string()),
            advertise: owner.advertise.clone(),
            lease_id: owner.lease_id,
            ttl_left_secs: owner.ttl_left.map(|ttl| ttl.as_secs()),
            tip: tip_json(owner.tip),
            load: owner.load,
        }
    }
}

pub(crate) async fn owners(common: &Common, args: &OwnersArgs) -> Result<(), Failure> {
    let admin = admin(common).await?;
    if args.watch {
        return watch::owners_watch(&admin, args.json).await;
    }
    let owners = admin
        .owners()
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?;
    if args.json {
        let owners: Vec<OwnerJson> = owners.iter().map(OwnerJson::from).collect();
        println!("{}", json!({ "owners": owners }));
        return Ok(());
    }
    if owners.is_empty() {
        println!("no owned sessions in namespace {}", admin.namespace());
        return Ok(());
    }
    let mut table = Table::new(
        &[
            "SESSION", "NODE", "EPOCH", "SINCE", "TTL LEFT", "TIP", "LOAD",
        ],
        &[false, false, true, false, true, true, true],
    );
    for owner in &owners {
        table.row(vec![
            owner.session.to_string(),
            owner.node.clone().unwrap_or_else(|| "?".to_owned()),
            owner.epoch.to_string(),
            owner.acquired_at.map_or_else(|| "-".to_owned(), ago),
            owner
                .ttl_left
                .map_or_else(|| "-".to_owned(), |ttl| format!("{}s", ttl.as_secs())),
            owner
                .tip
                .map_or_else(|| "-".to_owned(), |tip| tip.seq.to_string()),
            owner
                .load
                .map_or_else(|| "-".to_owned(), |load| format!("{load:.1}")),
        ]);
    }
    table.print();
    Ok(())
}

pub(crate) async fn journal(common: &Common, command: &JournalCommand) -> Result<(), Failure> {
    match command {
        JournalCommand::Show(args) => show(common, args).await,
        JournalCommand::Trim(args) => trim(common, args).await,
        JournalCommand::Delete(args) => delete(common, args).await,
    }
}

/// `bytes` in lowercase hex, for JSON fields named `…_hex`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn record_json(record: &Record) -> Value {
    match record {
        Record::Event(event) => {
            let mut line = json!({"seq": event.seq, "epoch": event.epoch.get(), "kind": "event"});
            match std::str::from_utf8(&event.payload) {
                Ok(text) => line["payload"] = json!(text),
                Err(_) => line["payload_hex"] = json!(hex(&event.payload)),
            }
            line
        }
        Record::Fence(fence) => json!({
            "seq": fence.seq,
            "epoch": fence.epoch.get(),
            "kind": "fence",
            "previous": tip_json(fence.previous),
        }),
    }
}

/// One record as a table row: seq, epoch, kind, what it holds.
fn record_row(record: &Record) -> Vec<String> {
    let (kind, what) = match record {
        Record::Event(event) => (
            "event",
            String::from_utf8_lossy(&event.payload)
                .escape_debug()
                .to_string(),
        ),
        Record::Fence(fence) => (
            "fence",
            fence.previous.map_or_else(
                || "opens a new journal".to_owned(),
                |tip| format!("after {} (epoch {})", tip.seq, tip.epoch),
            ),
        ),
    };
    vec![
        record.seq().to_string(),
        record.epoch().to_string(),
        kind.to_owned(),
        what,
    ]
}

async fn show(common: &Common, args: &ShowArgs) -> Result<(), Failure> {
    let admin = admin(common).await?;
    let info = admin
        .journal(args.session)
        .await
        .map_err(retention_failure)?;
    let Some(tip) = info.tip else {
        return Err(Failure::runtime_message(format!(
            "session {} has no journal in namespace {}",
            args.session,
            admin.namespace()
        )));
    };
    if !args.json {
        let owner = info.owner.as_ref().map_or_else(
            || "no owner".to_owned(),
            |owner| {
                format!(
                    "owned by {} at epoch {}",
                    owner.node.as_deref().unwrap_or("?"),
                    owner.epoch
                )
            },
        );
        println!(
            "journal of {}: records {} to {} ({} kept), {owner}",
            args.session,
            info.base,
            tip.seq,
            info.len()
        );
    }
    let shown = |record: &Record| args.records || matches!(record, Record::Event(_));
    let mut replay = admin.records(args.session);
    if let Some(from) = args.from {
        replay = replay.from_seq(from);
    }
    let mut table = Table::new(
        &["SEQ", "EPOCH", "KIND", "RECORD"],
        &[true, true, false, false],
    );
    // `None` once the record at `u64::MAX` is shown: none can follow it.
    let mut next_seq = Some(args.from.unwrap_or(1));
    let mut rows = 0usize;
    while let Some(record) = replay.next().await {
        let record = record.map_err(replay_failure)?;
        next_seq = record.seq().checked_add(1);
        if !shown(&record) {
            continue;
        }
        if args.json {
            println!("{}", record_json(&record));
        } else {
            rows += 1;
            table.row(record_row(&record));
        }
    }
    if !args.json && rows > 0 {
        table.print();
    }
    let Some(next_seq) = next_seq.filter(|_| args.follow) else {
        return Ok(());
    };
    let mut follow = admin.follow(args.session, replay.revision(), next_seq);
    let mut stdout = std::io::stdout();
    loop {
        let record = tokio::select! {
            record = follow.next() => record,
            () = super::node::wait_for_signal() => return Ok(()),
        };
        let Some(record) = record else {
            return Ok(());
        };
        let record = record.map_err(replay_failure)?;
        if !shown(&record) {
            continue;
        }
        let line = match args.json {
            true => record_json(&record).to_string(),
            false => record_row(&record).join("  "),
        };
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
}

async fn trim(common: &Common, args: &TrimArgs) -> Result<(), Failure> {
    let admin = admin(common).await?;
    let trimmed = admin
        .trim(args.session, args.before)
        .await
        .map_err(retention_failure)?;
    if args.json {
        println!(
            "{}",
            json!({"session": args.session, "base": trimmed.base, "removed": trimmed.removed})
        );
    } else {
        println!(
            "journal of {}: removed {} records; it now starts at {}",
            args.session, trimmed.removed, trimmed.base
        );
    }
    Ok(())
}

/// Asks on the terminal; without one (a script), the answer is yes.
fn confirm(question: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Ok(());
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    match answer.trim() {
        "y" | "Y" | "yes" => Ok(()),
        _ => Err(Failure::runtime_message("not confirmed; nothing done")),
    }
}

async fn delete(common: &Common, args: &DeleteArgs) -> Result<(), Failure> {
    let admin = admin(common).await?;
    if !args.yes {
        confirm(&format!(
            "Delete the whole journal of session {}?",
            args.session
        ))?;
    }
    let deleted = admin
        .delete_journal(args.session)
        .await
        .map_err(retention_failure)?;
    if args.json {
        println!(
            "{}",
            json!({"session": args.session, "deleted_keys": deleted.keys})
        );
    } else if deleted.keys == 0 {
        println!("session {} had no journal", args.session);
    } else {
        println!(
            "deleted the journal of {} ({} keys)",
            args.session, deleted.keys
        );
    }
    Ok(())
}

pub(crate) async fn revoke(common: &Common, args: &RevokeArgs) -> Result<(), Failure> {
    let admin = admin(common).await?;
    let owner = admin
        .owner(args.session)
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?
        .ok_or_else(|| {
            Failure::runtime(RevokeError::NotOwned {
                session: args.session,
            })
        })?;
    let node = owner.node.clone().unwrap_or_else(|| "?".to_owned());
    if !args.yes {
        confirm(&format!(
            "Revoke session {} from {node} (epoch {})?",
            args.session, owner.epoch
        ))?;
    }
    // Guarded by the epoch shown: a session that changed hands meanwhile is left alone.
    let revoked = admin
        .revoke(args.session, Some(owner.epoch))
        .await
        .map_err(|error| match &error {
            RevokeError::Etcd(etcd) => Failure::etcd(etcd.class(), error),
            _ => Failure::runtime(error),
        })?;
    if args.json {
        println!(
            "{}",
            json!({"session": revoked.session, "epoch": revoked.epoch.get(), "node": revoked.node})
        );
    } else {
        println!(
            "revoked session {} from {node} (epoch {})",
            revoked.session, revoked.epoch
        );
    }
    Ok(())
}

/// `n` and `noun`, plural unless one: "1 record", "3 fences".
fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn check_json(check: &JournalCheck) -> Value {
    json!({
        "session": check.session,
        "sound": check.is_sound(),
        "revision": check.revision,
        "base": check.base,
        "records": check.records,
        "events": check.events,
        "fences": check.fence_epochs.len(),
        "tip": tip_json(check.tip),
        "violations": check.violations.iter().map(|v| json!({
            "seq": v.seq(),
            "message": v.to_string(),
        })).collect::<Vec<_>>(),
    })
}

/// `check`'s progress on stderr: one line rewritten in place on a terminal; elsewhere (a log,
/// a pipe) a line of its own each time another 1,000 journals are done, and at the end.
/// `total`: how many there are, when known.
struct Progress {
    shown: bool,
    lines: usize,
}

impl Progress {
    fn new() -> Self {
        Self {
            shown: false,
            lines: 0,
        }
    }

    fn show(&mut self, done: usize, total: Option<usize>, last: bool) {
        let said = match total {
            Some(total) => format!("checking {done}/{total}"),
            None => format!("checking {done}"),
        };
        if std::io::stderr().is_terminal() {
            eprint!("\r{said}");
            self.shown = true;
        } else if done / 1000 > self.lines || last {
            self.lines = done / 1000;
            eprintln!("{said}");
        }
    }

    /// Ends the line rewritten in place, if there is one.
    fn end(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

pub(crate) async fn check(common: &Common, args: &CheckArgs) -> Result<(), Failure> {
    let admin = admin(common).await?;
    let mut progress = Progress::new();
    let show = !args.json;
    let mut checks = Vec::with_capacity(args.sessions.len());
    if args.sessions.is_empty() {
        // Every journal, in one pass over the namespace's journal keys.
        let all = admin
            .check_all(&ReplayOptions::default(), |done| {
                if show {
                    progress.show(done, None, false);
                }
            })
            .await;
        checks = all.map_err(replay_failure)?;
        if show && !checks.is_empty() {
            progress.show(checks.len(), Some(checks.len()), true);
        }
    }
    for (i, &session) in args.sessions.iter().enumerate() {
        if show && args.sessions.len() > 1 {
            let last = i + 1 == args.sessions.len();
            progress.show(i + 1, Some(args.sessions.len()), last);
        }
        let check = admin.check(session).await.map_err(replay_failure)?;
        if check.tip.is_none() && check.records == 0 {
            progress.end();
            return Err(Failure::runtime_message(format!(
                "session {session} has no journal in namespace {}",
                admin.namespace()
            )));
        }
        checks.push(check);
    }
    progress.end();
    let sound = checks.iter().all(JournalCheck::is_sound);
    if args.json {
        println!(
            "{}",
            json!({"sound": sound, "journals": checks.iter().map(check_json).collect::<Vec<_>>()})
        );
    } else {
        for check in &checks {
            let bounds = check.tip.map_or_else(
                || "empty".to_owned(),
                |tip| format!("{} to {}", check.base, tip.seq),
            );
            match check.violations.len() {
                0 => println!(
                    "{}: sound ({}, {bounds}; {} kept)",
                    check.session,
                    counted(check.records, "record"),
                    counted(check.fence_epochs.len() as u64, "fence")
                ),
                n => {
                    println!("{}: {n} violations ({bounds})", check.session);
                    for violation in &check.violations {
                        println!("  {violation}");
                    }
                }
            }
        }
        if checks.is_empty() {
            println!("no journals in namespace {}", admin.namespace());
        }
    }
    let broken = checks.iter().filter(|check| !check.is_sound()).count();
    match broken {
        0 => Ok(()),
        n => Err(Failure::runtime_message(format!(
            "{n} of {} journals break the journal invariants",
            checks.len()
        ))),
    }
}
