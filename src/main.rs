//! `leasehold`: the command-line tool.
//!
//! - `leasehold status`: the etcd member that answers and what a namespace holds.
//! - `leasehold node`: a session host; see [`cli::node`].
//! - `leasehold demo`: three nodes, a crash, a takeover, a refused stale append; see
//!   [`cli::demo`].
//! - `leasehold owners`, `journal show|trim|delete`, `revoke`, `check`: the operator's
//!   commands; see [`cli::admin`] (and its JSON schemas).
//! - `leasehold bench`: what leasehold costs, side by side with what it replaces.
//!
//! Errors print their whole cause chain on one line. Exit codes: 0 ok, 1 a failure (or a
//! journal that breaks its invariants), 2 bad input (an invalid UUID, a TTL under etcd's
//! minimum), 3 etcd unreachable or unavailable.

mod cli;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // LEASEHOLD_LOG, else RUST_LOG, else warnings only (and, for `serve`, its line per attach,
    // acquisition, loss and release).
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| args.default_log_filter().into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format() {
        cli::LogFormat::Text => logs.init(),
        cli::LogFormat::Json => logs.json().init(),
    }
    match cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("leasehold: {}", cli::chain(failure.error.as_ref()));
            ExitCode::from(failure.code)
        }
    }
}
