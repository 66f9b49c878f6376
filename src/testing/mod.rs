//! A real-etcd test harness (feature `testing`): for leasehold's own integration tests and for
//! the tests of applications built on it.
//!
//! - [`EtcdNode`]: one etcd member in a container; gives its client endpoint, and a connected
//!   [`Store`](crate::store::Store) for a test ([`EtcdNode::store`]). [`EtcdNode::builder`] takes
//!   another image and extra etcd flags (`--max-txn-ops=16`, `--quota-backend-bytes=…`), TLS
//!   ([`EtcdNodeBuilder::tls`] with [`TestCertificates`], generated with rcgen: `https://`
//!   only, client certificates required) and authentication ([`EtcdNodeBuilder::auth`]: a root
//!   user, then [`EtcdNode::add_prefix_user`] for users limited to a prefix).
//! - [`EtcdCluster`]: three members by default, on a Docker network of their own, with fault
//!   controls: kill and restart a member, pause and unpause it, partition it from its peers and
//!   heal it, find the leader, move leadership. [`ClusterOptions`] takes extra etcd flags too.
//! - [`FaultProxy`]: a TCP proxy on loopback between ONE client and etcd that can blackhole
//!   traffic, cut connections and drop the replies of requests in flight, so one node can be cut
//!   off from etcd while the others are not.
//! - [`check_journal`]: replays a journal and checks the safety invariants against what its
//!   writers were told ([`AppendHistory`]).
//! - [`random_namespace`]: a namespace of its own for each test, so that tests run in parallel
//!   on one etcd without seeing each other's keys.
//!
//! # Images
//!
//! By default the harness runs etcd 3.5.16, from the first of these that works:
//!
//! 1. `LEASEHOLD_ETCD_IMAGE=repo:tag`, when set: that image and no other, taken from Docker
//!    or else pulled. It must have the etcd binary at `/usr/local/bin/etcd`, as the upstream
//!    images do. When it can be neither found nor pulled, the tests fail with
//!    [`HarnessError::NoEtcdImage`]; no other image is run instead.
//! 2. `leasehold-etcd:3.5.16`, when Docker already has it (the harness built it earlier).
//! 3. The image etcd's releases publish, `gcr.io/etcd-development/etcd:v3.5.16`, when Docker has
//!    it or can pull it.
//! 4. `leasehold-etcd:3.5.16` built now: `FROM scratch`, the etcd binary of Debian 13's
//!    `etcd-server` package plus the `libc.so.6` and dynamic loader it links, built through
//!    testcontainers' [`GenericBuildableImage`](testcontainers::GenericBuildableImage) (or,
//!    where no builder is usable, `docker import` of the same files as a rootfs tarball). The
//!    binary is fetched once with apt into `~/.cache/leasehold` (see `deploy/fetch-etcd.sh`),
//!    so this step needs a Debian-based machine.
//!
//! A pull gives up after [`EtcdImage::PULL_TIMEOUT`] (20 s), so a machine that reaches no
//! registry moves on quickly. When no step works, [`HarnessError::NoEtcdImage`] lists the
//! three ways to provide an image (name one you have, pull the upstream one, let the harness
//! build it from Debian's package) and what each gave. The compatibility target,
//! `EtcdImage::release("3.4.23")` (Debian 12's etcd), follows the same order.
//! [`EtcdImage::select`] is the choice without the environment, and [`EtcdImage::resolve`]
//! says which step gave the image ([`ImageSource`]).
//!
//! # Failing loudly
//!
//! Every constructor checks that Docker answers first and returns
//! [`HarnessError::DockerUnavailable`] when it does not: a test that needs etcd fails, it is
//! never skipped.
//!
//! ```no_run
//! use leasehold::testing::{EtcdNode, random_namespace};
//! use leasehold::{Connection, ConnectOptions};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let etcd = EtcdNode::start().await?;
//! let connection = Connection::connect(ConnectOptions::new([etcd.endpoint()])).await?;
//! let namespace = random_namespace();
//! connection.put(format!("{}k", namespace.prefix()), "v").await?;
//! # Ok(())
//! # }
//! ```

mod checker;
mod cluster;
mod image;
mod node;
mod tls;

use std::future::Future;
use std::time::Duration;

pub use crate::fault::{FaultProxy, ProxyMode};
pub use crate::journal::mutant::Mutant;
pub use checker::{
    AppendHistory, InvariantViolation, Invocation, JournalReport, Violation, check_journal,
};
pub use cluster::{ClusterOptions, EtcdCluster};
pub use image::{EtcdImage, ImageAttempt, ImageBuild, ImageChoice, ImageSource, etcd_binary};
pub use node::{EtcdNode, EtcdNodeBuilder, ROOT_USER};
pub use tls::TestCertificates;

use crate::keys::Namespace;

/// The label put on every container and network the harness creates, so that leftovers of a
/// crashed test run can be found: `docker ps -a --filter label=org.leasehold.testing`.
pub const LABEL: &str = "org.leasehold.testing";

/// The harness could not provide what was asked. Each variant says whether retrying helps.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// Docker did not answer. The integration tests need a running Docker engine (or
    /// `DOCKER_HOST` pointing at one). Permanent for this run.
    #[error(
        "Docker is not reachable at {docker_host}: leasehold's etcd tests need a running Docker engine"
    )]
    DockerUnavailable {
        /// Where Docker was looked for.
        docker_host: String,
        /// What the Docker client said.
        #[source]
        source: bollard::errors::Error,
    },
    /// The etcd binary for an image could not be fetched or inspected. Permanent until the
    /// cause (network, apt) is fixed.
    #[error("cannot provide the etcd {version} binary: {detail}")]
    EtcdBinary {
        /// The etcd version.
        version: String,
        /// What went wrong, including the fetch script's own message.
        detail: String,
    },
    /// Building or importing an etcd image failed. Permanent.
    #[error("cannot build the etcd image {image}")]
    BuildImage {
        /// The image.
        image: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Starting or controlling a container failed. Transient at best.
    #[error("{operation} failed")]
    Container {
        /// What was being done, e.g. `"start etcd member m1"`.
        operation: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A condition did not come true in time (e.g. a member serving, a leader elected).
    #[error("timed out after {waited:?} waiting for {condition}")]
    Timeout {
        /// What was waited for.
        condition: String,
        /// How long.
        waited: Duration,
    },
    /// No etcd image could be had: every step of the selection (see [`EtcdImage`]) failed. The
    /// message names the three ways to provide one (`LEASEHOLD_ETCD_IMAGE`, pulling etcd's
    /// upstream image, the build from Debian's package) and what each gave. Permanent until
    /// one of them is taken.
    #[error("{}", image::no_image_message(.version.as_deref(), .named.as_deref(), .tried))]
    NoEtcdImage {
        /// The etcd version asked for, when known.
        version: Option<String>,
        /// The image asked for, when one was named (`LEASEHOLD_ETCD_IMAGE`,
        /// [`EtcdImage::custom`]): only it may run.
        named: Option<String>,
        /// The steps tried, in order, with why each gave nothing.
        tried: Vec<ImageAttempt>,
    },
    /// A [`Store`](crate::store::Store) could not connect to the harness's etcd; the cause says
    /// whether retrying helps.
    #[error("connect a store to etcd at {endpoint}")]
    Store {
        /// The endpoint.
        endpoint: String,
        /// The cause.
        #[source]
        source: crate::store::StoreError,
    },
    /// A local I/O failure (ports, temporary files, the proxy's listener).
    #[error("{operation} failed")]
    Io {
        /// What was being done.
        operation: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl HarnessError {
    pub(crate) fn container(
        operation: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Container {
            operation: operation.into(),
            source: source.into(),
        }
    }

    pub(crate) fn io(operation: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            operation: operation.into(),
            source,
        }
    }
}

/// A fresh namespace, `lh-test-` and 16 random hex digits, for one test.
pub fn random_namespace() -> Namespace {
    let id = uuid::Uuid::new_v4().simple().to_string();
    Namespace::new(format!("lh-test-{}", &id[..16])).expect("a valid namespace")
}

/// Polls `check` every 50 ms until it returns `Some`, or fails after `timeout` naming
/// `condition`. Tests wait for conditions this way instead of sleeping.
pub async fn wait_for<T, F, Fut>(
    condition: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = crate::deadline::deadline(tokio::time::Instant::now(), timeout);
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                condition: condition.to_owned(),
                waited: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Containers and networks the harness labelled ([`LABEL`]) that are older than this are
/// leftovers of a test run that crashed or was killed: the harness removes them the first time
/// it connects to Docker in a process. (No test of leasehold's runs for an hour.)
pub const LEFTOVER_AGE: Duration = Duration::from_secs(3600);

/// Whether a labelled container created at `created` (Unix seconds) is a leftover at `now`.
fn leftover(created: i64, now: i64) -> bool {
    now.saturating_sub(created) > LEFTOVER_AGE.as_secs() as i64
}

/// Removes leftovers (see [`LEFTOVER_AGE`]), once per process; failures are logged, never
/// fatal.
async fn sweep_leftovers(docker: &bollard::Docker) {
    use bollard::query_parameters::{
        ListContainersOptionsBuilder, PruneNetworksOptionsBuilder, RemoveContainerOptionsBuilder,
    };
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT
        .get_or_init(|| async {
            let labelled = std::collections::HashMap::from([("label", vec![LABEL])]);
            let options = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&labelled)
                .build();
            let containers = match docker.list_containers(Some(options)).await {
                Ok(containers) => containers,
                Err(error) => {
                    tracing::warn!(%error, "listing leftover test containers failed");
                    return;
                }
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs() as i64);
            for container in containers {
                let (Some(id), Some(created)) = (container.id, container.created) else {
                    continue;
                };
                if !leftover(created, now) {
                    continue;
                }
                let force = RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .v(true)
                    .build();
                match docker.remove_container(&id, Some(force)).await {
                    Ok(()) => eprintln!(
                        "leasehold::testing: removed leftover container {id} ({:?}, {} s old)",
                        container.names.unwrap_or_default(),
                        now.saturating_sub(created)
                    ),
                    Err(error) => {
                        tracing::warn!(%id, %error, "removing a leftover container failed")
                    }
                }
            }
            let age = format!("{}s", LEFTOVER_AGE.as_secs());
            let old = std::collections::HashMap::from([
                ("label", vec![LABEL.to_owned()]),
                ("until", vec![age]),
            ]);
            let options = PruneNetworksOptionsBuilder::default().filters(&old).build();
            if let Err(error) = docker.prune_networks(Some(options)).await {
                tracing::warn!(%error, "pruning leftover test networks failed");
            }
        })
        .await;
}

/// Connects to Docker and checks that it answers; the first time in a process, removes the
/// leftovers of crashed test runs (see [`LEFTOVER_AGE`]).
pub(crate) async fn docker() -> Result<bollard::Docker, HarnessError> {
    let docker = connect_docker().await?;
    sweep_leftovers(&docker).await;
    Ok(docker)
}

/// Connects to Docker and checks that it answers.
async fn connect_docker() -> Result<bollard::Docker, HarnessError> {
    let docker_host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_owned());
    let unavailable = |source| HarnessError::DockerUnavailable {
        docker_host: docker_host.clone(),
        source,
    };
    let docker = bollard::Docker::connect_with_defaults().map_err(unavailable)?;
    match tokio::time::timeout(Duration::from_secs(10), docker.ping()).await {
        Ok(Ok(_)) => Ok(docker),
        Ok(Err(source)) => Err(unavailable(source)),
        Err(_) => Err(unavailable(bollard::errors::Error::RequestTimeoutError)),
    }
}

/// A free TCP port on loopback, for a container port published at a fixed host port (so a
/// restarted member keeps its endpoint).
pub(crate) fn free_port() -> Result<u16, HarnessError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| HarnessError::io("find a free port", e))
}

/// Waits until the member that `options` connect to serves a linearizable read (with their
/// TLS options and credentials, if any).
pub(crate) async fn wait_serving(
    options: crate::etcd::ConnectOptions,
    timeout: Duration,
) -> Result<(), HarnessError> {
    let endpoint = options.endpoints.join(",");
    let options = options.with_retry(crate::etcd::RetryPolicy {
        deadline: Duration::from_millis(500),
        ..crate::etcd::RetryPolicy::default()
    });
    wait_for(&format!("etcd at {endpoint} to serve"), timeout, || async {
        let connection = crate::etcd::Connection::connect(options.clone())
            .await
            .ok()?;
        connection
            .get("leasehold-harness-probe")
            .await
            .ok()
            .map(|_| ())
    })
    .await
}

/// The value of one Prometheus metric that etcd serves at `{endpoint}/metrics`, summed over
/// every series whose name is `name` and whose labels include all of `labels` (`key="value"`
/// strings). `None` when no series matches. See [`crate::etcd_metric`].
pub async fn etcd_metric(
    endpoint: &str,
    name: &str,
    labels: &[&str],
) -> Result<Option<f64>, HarnessError> {
    crate::etcd_metric(endpoint, name, labels)
        .await
        .map_err(|e| HarnessError::io(format!("read {endpoint}/metrics"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_labelled_container_is_a_leftover_only_past_an_hour() {
        let now = 1_800_000_000;
        assert!(!leftover(now, now));
        assert!(
            !leftover(now - 3600, now),
            "an hour old: a long test, maybe"
        );
        assert!(leftover(now - 3601, now));
        // Clocks that disagree (created in the future) or garbage: not a leftover, no panic.
        assert!(!leftover(now + 60, now));
        assert!(!leftover(i64::MAX, i64::MIN));
        assert!(leftover(i64::MIN, i64::MAX));
    }
}
