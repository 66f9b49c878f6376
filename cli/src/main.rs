//! `leasehold`: the command-line tool.
//!
//! - `leasehold status`: the etcd member that answers and what a namespace holds.
//! - `leasehold node`: a session host; see [`node`].
//! - `leasehold demo`: three nodes, a crash, a takeover, a refused stale append; see
//!   [`demo`].
//! - `leasehold owners`, `journal show|trim|delete`, `revoke`, `check`: the operator's
//!   commands; see [`admin`] (and its JSON schemas).
//! - `leasehold bench`: what leasehold costs, side by side with what it replaces.
//!
//! Errors print their whole cause chain on one line. Exit codes: 0 ok, 1 a failure (or a
//! journal that breaks its invariants), 2 bad input (an invalid UUID, a TTL under etcd's
//! minimum), 3 etcd unreachable or unavailable.

pub(crate) mod admin;
pub(crate) mod bench;
pub(crate) mod demo;
pub(crate) mod node;
pub(crate) mod scratch;
pub(crate) mod serve;
pub(crate) mod sidecar;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold::{
    ConnectError, ConnectOptions, Connection, Credentials, FailureClass, Namespace, RetryPolicy,
    StoreError, StoreOptions, TlsOptions,
};

/// What `--help` says after the commands.
const AFTER_HELP: &str = "\
Exit codes:
  0  success
  1  failure, or a journal that breaks its invariants (check)
  2  bad input: flags, values, a session id that is not a UUID, a certificate, key or
     password file that cannot be read, credentials etcd refuses
  3  etcd unreachable or unavailable, also a TLS handshake etcd or leasehold refuses
     (a wrong CA, an expired or missing client certificate)

Secured etcd: --cacert, --cert, --key, --tls-server-name (TLS), --user with
--password-file or LEASEHOLD_PASSWORD (authentication); each flag also as LEASEHOLD_CACERT,
LEASEHOLD_CERT, LEASEHOLD_KEY, LEASEHOLD_TLS_SERVER_NAME, LEASEHOLD_USER,
LEASEHOLD_PASSWORD_FILE. A permission the user lacks (a namespace outside its roles) fails
with exit code 1.

Environment read besides the flags' [env: ...]: LEASEHOLD_LOG (else RUST_LOG) sets the log
level, e.g. debug or leasehold=debug (default: warn); LEASEHOLD_PASSWORD the --user's
password; LEASEHOLD_ETCD_BIN the etcd binary that demo and bench start when no --endpoints
are given (else etcd on PATH, else ~/.cache/leasehold/etcd-3.5.16/usr/bin/etcd).

--json output: one documented schema per command (owners, hosts, journal show, journal trim,
journal delete, revoke, check); see the crate documentation of the leasehold tool.";

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Single-writer session ownership on etcd",
    after_help = AFTER_HELP
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
    /// etcd client URLs, comma-separated [default: http://127.0.0.1:2379; `demo` and `bench`
    /// start their own etcd when none is given].
    #[arg(
        long,
        env = "LEASEHOLD_ENDPOINTS",
        value_delimiter = ',',
        global = true
    )]
    endpoints: Option<Vec<String>>,
    /// The namespace prefix all keys live under (`demo` and `bench` write beside it, never
    /// under it: in `{namespace}-demo-XXXXXXXX` and `{namespace}-bench-XXXXXXXX`).
    #[arg(long, env = "LEASEHOLD_NAMESPACE", default_value = Namespace::DEFAULT, global = true)]
    namespace: Namespace,
    /// This node's name, for people: in `owners`, log lines and the metrics' `node` label
    /// (ownership and balancing go by an id of each store's own, so nodes that share a name
    /// work, but cannot be told apart) [default: node-{process id}: node-1 in every
    /// container, so name each one].
    #[arg(long, env = "LEASEHOLD_NODE", global = true)]
    node: Option<String>,
    /// Where this node is reached, a URL such as `http://10.0.0.7:31501` (its own gRPC or HTTP
    /// address): written into its owner keys and host key, shown by `owners` and `hosts`, so
    /// that a request for a session can be sent to its owner (`node` and `serve`).
    #[arg(long, env = "LEASEHOLD_ADVERTISE", value_name = "URL", global = true)]
    advertise: Option<String>,
    /// The node lease's TTL in whole seconds (etcd's minimum is 2); `demo` and `bench` ignore
    /// it and use their own.
    #[arg(long, default_value_t = 10, global = true)]
    ttl: u64,
    /// The safety margin in seconds (below 2·TTL/3); `demo` and `bench` ignore it and use
    /// their own.
    #[arg(long, default_value_t = 1.0, global = true)]
    margin: f64,
    /// How long to wait for etcd to answer at all, in seconds (0: no wait;
    /// 18446744073709551615: forever). It is also every later request's retry deadline: a
    /// read, or a write etcd refused unapplied, is retried on the next endpoints for this
    /// long, and an operator command's write whose outcome is unknown is re-sent for this long.
    #[arg(long, default_value_t = 5, global = true)]
    connect_timeout: u64,
    /// How many requests may be in flight on the connection to one endpoint at once; more wait
    /// their turn (at least 1).
    #[arg(
        long,
        default_value_t = ConnectOptions::DEFAULT_MAX_IN_FLIGHT as u64,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000),
        global = true
    )]
    max_in_flight: u64,
    /// Say nothing of an etcd older than the minimum for production (3.5.28), which is
    /// otherwise said once per process and endpoint at WARN: for tests and fleets that run
    /// one knowingly.
    #[arg(long, env = "LEASEHOLD_NO_VERSION_WARNING", global = true)]
    no_version_warning: bool,
    /// How log lines (on stderr; LEASEHOLD_LOG or RUST_LOG set the level) are written.
    #[arg(
        long,
        value_enum,
        env = "LEASEHOLD_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    /// TLS: the CA certificate(s) (PEM file) that sign the etcd members' certificates; the
    /// endpoints are then https:// [default endpoint: https://127.0.0.1:2379].
    #[arg(long, env = "LEASEHOLD_CACERT", value_name = "PATH", global = true)]
    cacert: Option<PathBuf>,
    /// TLS: a client certificate (PEM file) for members that require one; with --key.
    #[arg(long, env = "LEASEHOLD_CERT", value_name = "PATH", global = true)]
    cert: Option<PathBuf>,
    /// TLS: the client certificate's private key (PEM file).
    #[arg(long, env = "LEASEHOLD_KEY", value_name = "PATH", global = true)]
    key: Option<PathBuf>,
    /// TLS: the name the members' certificates are checked against, instead of each
    /// endpoint's host (for endpoints given by IP address whose certificates name a DNS
    /// name); with --cacert.
    #[arg(
        long,
        env = "LEASEHOLD_TLS_SERVER_NAME",
        value_name = "NAME",
        global = true
    )]
    tls_server_name: Option<String>,
    /// The etcd user to authenticate as. The password is read from --password-file or the
    /// environment variable LEASEHOLD_PASSWORD, never from a flag.
    #[arg(long, env = "LEASEHOLD_USER", value_name = "NAME", global = true)]
    user: Option<String>,
    /// A file holding the user's password (its first line).
    #[arg(
        long,
        env = "LEASEHOLD_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    password_file: Option<PathBuf>,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line, with the spans (node, namespace, session, epoch) in it.
    Json,
}

impl Cli {
    pub(crate) fn log_format(&self) -> LogFormat {
        self.common.log_format
    }

    /// The log filter when neither LEASEHOLD_LOG nor RUST_LOG is set.
    pub(crate) fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Serve(_) => "warn,leasehold::sidecar=info",
            _ => "warn",
        }
    }
}

/// The environment variable a password may come from (there is no flag for it).
const PASSWORD_ENV: &str = "LEASEHOLD_PASSWORD";

#[derive(Subcommand)]
enum Command {
    /// Show the etcd member that answers and what the namespace holds.
    Status,
    /// Host sessions: own those it can, stand by on the rest, heartbeat into each owned
    /// session's journal every second; shut down in order on SIGTERM or SIGINT.
    Node(node::NodeArgs),
    /// Three nodes in one process over a handful of sessions: one freezes, another takes
    /// over with a fence, and the frozen node's stale append is refused.
    ///
    /// Its own etcd unless --endpoints; on a cluster of yours it writes in a namespace of its
    /// own beside --namespace, `{namespace}-demo-XXXXXXXX` (8 random hex digits; with --user,
    /// the role needs readwrite on the prefix `{namespace}-demo-`), and deletes that prefix
    /// however it ends, giving up when etcd does not answer for 10 s. SIGINT or SIGTERM stops
    /// it: exit code 130. Node lease TTL 3 s, safety margin 1 s (--ttl and --margin are
    /// ignored).
    Demo,
    /// What leasehold costs against what it replaces, measured side by side.
    ///
    /// Its own etcd unless --endpoints; on a cluster of yours it writes in a namespace of its
    /// own beside --namespace, `{namespace}-bench-XXXXXXXX` (8 random hex digits), and deletes
    /// that prefix however it ends (done, a scenario's error, SIGINT or SIGTERM), giving up
    /// when etcd does not answer for 10 s. SIGINT or SIGTERM stops it: exit code 130. Each
    /// scenario sets its own node lease TTL and margin (--ttl and --margin are ignored).
    Bench(bench::BenchArgs),
    /// Every owned session: holder node, epoch, since when, node lease TTL left, journal tip,
    /// and its load as its host published it (each host publishes its hottest sessions', 16 by
    /// default).
    Owners(admin::OwnersArgs),
    /// The live session hosts: node, advertised address, sessions held, load, since when.
    Hosts(admin::HostsArgs),
    /// Ask a running session host to hand every session over, in order, and take none until
    /// undrained (the others take its share at once); --wait returns once it holds none.
    Drain(admin::DrainArgs),
    /// Ask a drained session host to take its share back.
    Undrain(admin::UndrainArgs),
    /// Move an owned session to another session host in one graceful handover: the target
    /// stands by, the holder releases it in order, the target takes it; no other node can
    /// take it meanwhile. Refused in one line if the target is not live, drains, or does not
    /// host the session.
    Move(admin::MoveArgs),
    /// The shared session registry: create, finish (the journal deleted once released) or
    /// list sessions; nodes started with --registry host every registered session.
    #[command(subcommand)]
    Sessions(admin::SessionsCommand),
    /// Read, trim or delete a session's journal.
    #[command(subcommand)]
    Journal(admin::JournalCommand),
    /// Take a session from its holder: delete its owner key (the holder loses it, `revoked`).
    Revoke(admin::RevokeArgs),
    /// Check journals against the journal invariants: exit 0 if sound, 1 on a violation.
    Check(admin::CheckArgs),
    /// Serve fenced journals to any language over gRPC (leasehold.v1.Leasehold, with health
    /// and reflection): one store for all clients, ownership scoped to each client's Attach
    /// stream; shut down in order on SIGTERM or SIGINT (every stream's sessions released,
    /// then the store closed). See docs/sidecar.md.
    Serve(sidecar::ServeArgs),
}

/// A failure and the exit code it maps to.
pub(crate) struct Failure {
    pub(crate) error: Box<dyn std::error::Error>,
    pub(crate) code: u8,
}

impl Failure {
    /// Bad input: exit code 2.
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

    /// An etcd failure: exit code 3 when etcd is unreachable or unavailable (retrying may
    /// help), else 1.
    pub(crate) fn etcd(class: FailureClass, error: impl std::error::Error + 'static) -> Self {
        Self {
            error: Box::new(error),
            code: match class {
                FailureClass::Permanent => 1,
                _ => 3,
            },
        }
    }

    /// Connecting failed: exit code 3 when no endpoint answered or the TLS handshake was
    /// refused, 2 for bad endpoints and refused credentials.
    pub(crate) fn connect(error: ConnectError) -> Self {
        match error {
            ConnectError::Unreachable { .. } | ConnectError::Tls { .. } => Self {
                error: Box::new(error),
                code: 3,
            },
            _ => Self::usage(error),
        }
    }

    /// A failure told in words: exit code 1.
    pub(crate) fn runtime_message(message: impl Into<String>) -> Self {
        Self::message(message, 1)
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
        let scheme = if self.cacert.is_some() {
            "https"
        } else {
            "http"
        };
        self.endpoints
            .clone()
            .unwrap_or_else(|| vec![format!("{scheme}://127.0.0.1:2379")])
    }

    /// Whether TLS or authentication was asked for.
    pub(crate) fn is_secured(&self) -> bool {
        self.cacert.is_some() || self.user.is_some()
    }

    /// The TLS options and credentials from the flags; a file that cannot be read, or a user
    /// without a password, is bad input (exit code 2).
    pub(crate) fn security(&self) -> Result<(Option<TlsOptions>, Option<Credentials>), Failure> {
        fn read(flag: &str, path: &Path) -> Result<Vec<u8>, Failure> {
            std::fs::read(path).map_err(|error| {
                Failure::message(format!("cannot read {flag} {}: {error}", path.display()), 2)
            })
        }
        // Which flags need which is checked here rather than by clap: a global flag's
        // `requires` misses one given after the command when the other comes from the
        // environment.
        let needs = |flag: &str, given: bool, other: &str, present: bool| {
            if given && !present {
                Err(Failure::message(format!("{flag} needs {other}"), 2))
            } else {
                Ok(())
            }
        };
        needs(
            "--cert (LEASEHOLD_CERT)",
            self.cert.is_some(),
            "--key",
            self.key.is_some(),
        )?;
        needs(
            "--key (LEASEHOLD_KEY)",
            self.key.is_some(),
            "--cert",
            self.cert.is_some(),
        )?;
        needs(
            "--cert (LEASEHOLD_CERT)",
            self.cert.is_some(),
            "--cacert",
            self.cacert.is_some(),
        )?;
        needs(
            "--tls-server-name (LEASEHOLD_TLS_SERVER_NAME)",
            self.tls_server_name.is_some(),
            "--cacert",
            self.cacert.is_some(),
        )?;
        needs(
            "--password-file (LEASEHOLD_PASSWORD_FILE)",
            self.password_file.is_some(),
            "--user",
            self.user.is_some(),
        )?;
        let tls = match &self.cacert {
            Some(ca) => {
                let mut tls = TlsOptions::new(read("--cacert", ca)?);
                if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                    tls = tls.with_client_identity(read("--cert", cert)?, read("--key", key)?);
                }
                if let Some(name) = &self.tls_server_name {
                    tls = tls.with_domain_name(name);
                }
                Some(tls)
            }
            None => None,
        };
        let password = match &self.password_file {
            Some(path) => {
                // The file's bytes are wiped once its first line is taken.
                let bytes = zeroize::Zeroizing::new(read("--password-file", path)?);
                let text = std::str::from_utf8(&bytes).map_err(|_| {
                    Failure::message(
                        format!("--password-file {} is not UTF-8", path.display()),
                        2,
                    )
                })?;
                Some(text.lines().next().unwrap_or_default().to_owned())
            }
            None => std::env::var(PASSWORD_ENV).ok(),
        };
        let credentials = match (&self.user, password) {
            (Some(user), Some(password)) => Some(Credentials::new(user, password)),
            (Some(user), None) => {
                return Err(Failure::message(
                    format!(
                        "--user {user} needs a password: --password-file PATH or {PASSWORD_ENV}"
                    ),
                    2,
                ));
            }
            (None, _) => None,
        };
        Ok((tls, credentials))
    }

    /// Connection options for `endpoints` from the flags (retry deadline, TLS, credentials).
    pub(crate) fn connect_options(
        &self,
        endpoints: Vec<String>,
    ) -> Result<ConnectOptions, Failure> {
        let (tls, credentials) = self.security()?;
        let mut options = ConnectOptions::new(endpoints).with_retry(self.retry());
        options.connect_timeout = options
            .connect_timeout
            .min(Duration::from_secs(self.connect_timeout.max(1)));
        options.tls = tls;
        options.credentials = credentials;
        options.max_in_flight = self.max_in_flight();
        options.version_warning = !self.no_version_warning;
        Ok(options)
    }

    fn max_in_flight(&self) -> usize {
        usize::try_from(self.max_in_flight).unwrap_or(usize::MAX)
    }

    fn retry(&self) -> RetryPolicy {
        RetryPolicy::default().with_deadline(Duration::from_secs(self.connect_timeout))
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
        options.advertise = self.advertise.clone();
        options.retry = self.retry();
        options.max_in_flight = self.max_in_flight();
        options.version_warning = !self.no_version_warning;
        (options.tls, options.credentials) = self.security()?;
        Ok(options)
    }

    /// A connection to the cluster (no node lease); an unreachable cluster exits with code 3.
    pub(crate) async fn connection(&self) -> Result<Connection, Failure> {
        let options = self.connect_options(self.endpoints())?;
        Connection::connect(options).await.map_err(Failure::connect)
    }
}

/// The exit code of a failed store connect.
pub(crate) fn store_failure(error: StoreError) -> Failure {
    match error {
        StoreError::Connect(ConnectError::Unreachable { .. } | ConnectError::Tls { .. }) => {
            Failure {
                error: Box::new(error),
                code: 3,
            }
        }
        StoreError::Grant(ref grant) => Failure::etcd(grant.class(), error),
        _ => Failure::usage(error),
    }
}

pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::Status => status(&cli.common).await,
        Command::Node(args) => node::run(&cli.common, args).await,
        Command::Serve(args) => sidecar::run(&cli.common, args).await,
        Command::Demo => demo::run(&cli.common).await,
        Command::Bench(args) => bench::run(&cli.common, args).await,
        Command::Owners(args) => admin::owners(&cli.common, args).await,
        Command::Hosts(args) => admin::hosts(&cli.common, args).await,
        Command::Drain(args) => admin::drain(&cli.common, args).await,
        Command::Undrain(args) => admin::undrain(&cli.common, args).await,
        Command::Move(args) => admin::move_session(&cli.common, args).await,
        Command::Sessions(command) => admin::sessions(&cli.common, command).await,
        Command::Journal(command) => admin::journal(&cli.common, command).await,
        Command::Revoke(args) => admin::revoke(&cli.common, args).await,
        Command::Check(args) => admin::check(&cli.common, args).await,
    }
}

async fn status(common: &Common) -> Result<(), Failure> {
    let connection = common.connection().await?;
    let member = connection
        .status()
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?;
    let held = leasehold::Admin::new(connection.clone(), common.namespace.clone())
        .namespace_status()
        .await
        .map_err(|error| Failure::etcd(error.class(), error))?;
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

#[tokio::main]
async fn main() -> ExitCode {
    let args = Cli::parse();
    // LEASEHOLD_LOG, else RUST_LOG, else warnings only (and, for `serve`, its line per attach,
    // acquisition, loss and release).
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| args.default_log_filter().into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format() {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("leasehold: {}", chain(failure.error.as_ref()));
            ExitCode::from(failure.code)
        }
    }
}
