//! `leasehold`: the command-line tool.
//!
//! - `leasehold status`: the etcd member that answers and what a namespace holds.
//! - `leasehold node`: a session host; see [`cli::node`].
//! - `leasehold demo`: three nodes, a crash, a takeover, a refused stale append; see
//!   [`cli::demo`].
//!
//! Errors print their whole cause chain on one line; bad input (an invalid UUID, a TTL under
//! etcd's minimum, an unreachable endpoint) exits with code 2.

mod cli;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = cli::Cli::parse();
    match cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("leasehold: {}", cli::chain(failure.error.as_ref()));
            ExitCode::from(failure.code)
        }
    }
}
