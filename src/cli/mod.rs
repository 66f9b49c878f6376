//! Command-line parsing, shared flags and error reporting.

pub(crate) mod bench;
pub(crate) mod demo;
pub(crate) mod node;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold::{ConnectOptions, Connection, Namespace, RetryPolicy, Store, StoreOptions};

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Single-writer session ownership on etcd"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: Command,
}

/// Flags every command takes.
#[derive(Args)]
pub(crate) struct Common {
    /// etcd client URLs, comma-separated [default: http://127.0.0.1:2379; `demo` starts its
    /// own etcd when none is given].
    #[arg(
        long,
        env = "LEASEHOLD_ENDPOINTS",
        value_delimiter = ',',
        global = true
    )]
    endpoints: Option<Vec<String>>,
    /// The namespace prefix all keys live under.
    #[arg(long, env = "LEASEHOLD_NAMESPACE", default_value = Namespace::DEFAULT, global = true)]
    namespace: Namespace,
    /// This node's name.
    #[arg(long, env = "LEASEHOLD_NODE", global = true)]
    node: Option<String>,
    /// The node lease's TTL in whole seconds (etcd's minimum is 2).
    #[arg(long, default_value_t = 10, global = true)]
    ttl: u64,
    /// The safety margin in seconds (below 2·TTL/3).
    #[arg(long, default_value_t = 1.0, global = true)]
    margin: f64,
    /// How long to wait for etcd to answer at all, in seconds.
    #[arg(long, default_value_t = 5, global = true)]
    connect_timeout: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Show the etcd member that answers and what the namespace holds.
    Status,
    /// Host sessions: own those it can, stand by on the rest, heartbeat into each owned
    /// session's journal every second; shut down in order on SIGTERM or SIGINT.
    Node(node::NodeArgs),
    /// Three nodes in one process over a handful of sessions: one freezes, another takes
    /// over with a fence, and the frozen node's stale append is refused.
    Demo,
    /// What leasehold costs against what it replaces, measured side by side.
    Bench(bench::BenchArgs),
}

/// A failure and the exit code it maps to.
pub(crate) struct Failure {
    pub(crate) error: Box<dyn std::error::Error>,
    pub(crate) code: u8,
}

impl Failure {
    /// Bad input, or no cluster to talk to: exit code 2.
    pub(crate) fn usage(error: impl std::error::Error + 'static) -> Self {
        Self {
            error: Box::new(error),
            code: 2,
        }
    }

    /// Anything that went wrong after a good start: exit code 1.
    pub(crate) fn runtime(error: impl std::error::Error + 'static) -> Self {
        Self {
            error: Box::new(error),
            code: 1,
        }
    }

    pub(crate) fn message(message: impl Into<String>, code: u8) -> Self {
        Self {
            error: message.into().into(),
            code,
        }
    }
}

impl Common {
    fn endpoints(&self) -> Vec<String> {
        self.endpoints
            .clone()
            .unwrap_or_else(|| vec!["http://127.0.0.1:2379".to_owned()])
    }

    fn retry(&self) -> RetryPolicy {
        RetryPolicy {
            deadline: Duration::from_secs(self.connect_timeout),
            ..RetryPolicy::default()
        }
    }

    /// Store options from the flags, for `endpoints` and node `node`.
    pub(crate) fn store_options(
        &self,
        endpoints: Vec<String>,
        node: &str,
    ) -> Result<StoreOptions, Failure> {
        if !self.margin.is_finite() || self.margin < 0.0 {
            return Err(Failure::message(
                format!(
                    "invalid margin {}: a non-negative number of seconds",
                    self.margin
                ),
                2,
            ));
        }
        let margin = Duration::try_from_secs_f64(self.margin).map_err(|_| {
            Failure::message(
                format!("invalid margin {}: too many seconds", self.margin),
                2,
            )
        })?;
        let mut options = StoreOptions::new(endpoints)
            .with_namespace(self.namespace.clone())
            .with_node(node)
            .with_ttl(Duration::from_secs(self.ttl), margin);
        options.retry = self.retry();
        Ok(options)
    }

    /// Connects a store; configuration errors and an unreachable cluster exit with code 2.
    pub(crate) async fn store(&self, endpoints: Vec<String>, node: &str) -> Result<Store, Failure> {
        Store::connect(self.store_options(endpoints, node)?)
            .await
            .map_err(|error| match error {
                leasehold::StoreError::Grant(_) => Failure::runtime(error),
                _ => Failure::usage(error),
            })
    }
}

pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::Status => status(&cli.common).await,
        Command::Node(args) => node::run(&cli.common, args).await,
        Command::Demo => demo::run(&cli.common).await,
        Command::Bench(args) => bench::run(&cli.common, args).await,
    }
}

async fn status(common: &Common) -> Result<(), Failure> {
    let options = ConnectOptions::new(common.endpoints()).with_retry(common.retry());
    let connection = Connection::connect(options).await.map_err(Failure::usage)?;
    let member = connection.status().await.map_err(Failure::runtime)?;
    let held = connection
        .namespace_status(&common.namespace)
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
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        line.push_str(": ");
        line.push_str(&next.to_string());
        cause = next.source();
    }
    line
}
