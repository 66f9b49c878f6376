//! `leasehold`: the command-line tool.
//!
//! `leasehold status` connects to etcd and shows what a namespace holds. Errors print their
//! whole cause chain on one line; bad input and an unreachable cluster exit with code 2.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use leasehold::{ConnectOptions, Connection, Namespace, RetryPolicy};

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Single-writer session ownership on etcd"
)]
struct Cli {
    /// etcd client URLs, comma-separated.
    #[arg(
        long,
        env = "LEASEHOLD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        global = true
    )]
    endpoints: Vec<String>,
    /// The namespace prefix all keys live under.
    #[arg(long, env = "LEASEHOLD_NAMESPACE", default_value = Namespace::DEFAULT, global = true)]
    namespace: Namespace,
    /// How long to wait for etcd to answer at all, in seconds.
    #[arg(long, default_value_t = 5, global = true)]
    connect_timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the etcd member that answers and what the namespace holds.
    Status,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { error, code }) => {
            eprintln!("leasehold: {}", chain(error.as_ref()));
            ExitCode::from(code)
        }
    }
}

struct Failure {
    error: Box<dyn std::error::Error>,
    code: u8,
}

impl Failure {
    /// Bad input or no cluster to talk to.
    fn usage(error: impl std::error::Error + 'static) -> Self {
        Self {
            error: Box::new(error),
            code: 2,
        }
    }

    fn runtime(error: impl std::error::Error + 'static) -> Self {
        Self {
            error: Box::new(error),
            code: 1,
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let options = ConnectOptions::new(cli.endpoints).with_retry(RetryPolicy {
        deadline: Duration::from_secs(cli.connect_timeout),
        ..RetryPolicy::default()
    });
    let connection = Connection::connect(options).await.map_err(Failure::usage)?;
    match cli.command {
        Command::Status => status(&connection, &cli.namespace).await,
    }
}

async fn status(connection: &Connection, namespace: &Namespace) -> Result<(), Failure> {
    let member = connection.status().await.map_err(Failure::runtime)?;
    let held = connection
        .namespace_status(namespace)
        .await
        .map_err(Failure::runtime)?;
    println!(
        "etcd {} at {}: member {:x}, leader {:x}, raft term {}",
        member.version, member.endpoint, member.member_id, member.leader_id, member.raft_term
    );
    println!(
        "namespace {}: {} owned sessions, {} owned workspaces, {} keys (revision {})",
        held.namespace, held.owned_sessions, held.owned_workspaces, held.keys, held.revision
    );
    Ok(())
}

/// `error: cause: cause`, one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        line.push_str(": ");
        line.push_str(&next.to_string());
        cause = next.source();
    }
    line
}
