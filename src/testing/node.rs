//! One etcd member in a container.

use std::time::Duration;

use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::image::ETCD_PATH;
use super::{EtcdImage, HarnessError, ImageSource, LABEL, docker, wait_serving};
use crate::keys::Namespace;
use crate::{Store, StoreOptions};

/// etcd's client port inside the container.
pub(crate) const CLIENT_PORT: u16 = 2379;
/// etcd's peer port inside the container.
pub(crate) const PEER_PORT: u16 = 2380;
/// How long a member may take to start serving.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A single-member etcd in a container, removed when dropped.
///
/// Its client port is published at a port Docker picks, and [`endpoint`](Self::endpoint) is
/// read back from testcontainers (`get_host` and `get_host_port_ipv4`): a single member is
/// never restarted, so its endpoint cannot move. The member advertises its own address inside
/// the container; clients here never sync endpoints from it.
pub struct EtcdNode {
    container: ContainerAsync<GenericImage>,
    endpoint: String,
    image: EtcdImage,
    source: ImageSource,
}

impl std::fmt::Debug for EtcdNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdNode")
            .field("endpoint", &self.endpoint)
            .field("image", &self.image.reference())
            .field("source", &self.source)
            .field("container", &self.container.id())
            .finish()
    }
}

/// How an [`EtcdNode`] is started: its image and any extra etcd flags.
///
/// ```no_run
/// use leasehold::testing::EtcdNode;
///
/// # async fn example() -> Result<(), leasehold::testing::HarnessError> {
/// let etcd = EtcdNode::builder()
///     .arg("--max-txn-ops=16")
///     .args(["--quota-backend-bytes=16777216"])
///     .start()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until started"]
pub struct EtcdNodeBuilder {
    image: Option<EtcdImage>,
    args: Vec<String>,
}

impl EtcdNodeBuilder {
    /// The image to run (default [`EtcdImage::from_env`]).
    pub fn image(mut self, image: EtcdImage) -> Self {
        self.image = Some(image);
        self
    }

    /// One more etcd flag, e.g. `--max-txn-ops=16`. Extra flags come after the harness's own,
    /// so a flag given twice takes the value given here.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// More etcd flags, in order (see [`arg`](Self::arg)).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Resolves the image (see [`EtcdImage`]), starts etcd and waits until it serves.
    pub async fn start(self) -> Result<EtcdNode, HarnessError> {
        let docker = docker().await?;
        let choice = self
            .image
            .unwrap_or_else(EtcdImage::from_env)
            .resolve_with(&docker)
            .await?;
        let image = choice.image;
        let mut args = member_args(
            "default",
            // The member's own address, inside its container.
            &format!("http://127.0.0.1:{CLIENT_PORT}"),
            &format!("default=http://127.0.0.1:{PEER_PORT}"),
            "leasehold-node",
            &format!("http://127.0.0.1:{PEER_PORT}"),
        );
        args.extend(self.args);
        let starting = || format!("start etcd ({})", image.reference());
        let container = GenericImage::new(image.name(), image.tag())
            .with_exposed_port(CLIENT_PORT.tcp())
            .with_entrypoint(ETCD_PATH)
            .with_label(LABEL, "node")
            .with_startup_timeout(START_TIMEOUT)
            .with_cmd(args)
            .start()
            .await
            .map_err(|e| HarnessError::container(starting(), e))?;
        let host = container
            .get_host()
            .await
            .map_err(|e| HarnessError::container(starting(), e))?;
        let port = container
            .get_host_port_ipv4(CLIENT_PORT.tcp())
            .await
            .map_err(|e| HarnessError::container(starting(), e))?;
        let endpoint = format!("http://{host}:{port}");
        // Readiness is a served read, not a log line: log formats differ between releases.
        wait_serving(&endpoint, START_TIMEOUT).await?;
        Ok(EtcdNode {
            container,
            endpoint,
            image,
            source: choice.source,
        })
    }
}

impl EtcdNode {
    /// Starts etcd from [`EtcdImage::from_env`] and waits until it serves.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::builder().start().await
    }

    /// Starts etcd from `image` and waits until it serves.
    pub async fn start_with(image: EtcdImage) -> Result<Self, HarnessError> {
        Self::builder().image(image).start().await
    }

    /// A node to be started with another image or extra etcd flags.
    pub fn builder() -> EtcdNodeBuilder {
        EtcdNodeBuilder::default()
    }

    /// The client URL, e.g. `http://localhost:32768`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The image this node runs: the one the selection settled on (for
    /// [`EtcdImage::release`], possibly etcd's upstream image).
    pub fn image(&self) -> &EtcdImage {
        &self.image
    }

    /// The step of the selection the image came from.
    pub fn image_source(&self) -> ImageSource {
        self.source
    }

    /// The Docker container ID.
    pub fn container_id(&self) -> &str {
        self.container.id()
    }

    /// Options for a [`Store`] on this member: its endpoint, `namespace`, node name `node`,
    /// and the default node lease (TTL 10 s, margin 1 s). Change what a test needs, e.g.
    /// `.with_ttl(Duration::from_secs(3), Duration::from_millis(500))`, then
    /// [`Store::connect`].
    pub fn store_options(&self, namespace: &Namespace, node: &str) -> StoreOptions {
        StoreOptions::new([self.endpoint.clone()])
            .with_namespace(namespace.clone())
            .with_node(node)
    }

    /// A [`Store`] connected to this member in `namespace`, as node `node`, with the options
    /// of [`store_options`](Self::store_options).
    pub async fn store(&self, namespace: &Namespace, node: &str) -> Result<Store, HarnessError> {
        Store::connect(self.store_options(namespace, node))
            .await
            .map_err(|source| HarnessError::Store {
                endpoint: self.endpoint.clone(),
                source,
            })
    }
}

/// The command line of one member.
pub(crate) fn member_args(
    name: &str,
    client_url: &str,
    initial_cluster: &str,
    token: &str,
    peer_url: &str,
) -> Vec<String> {
    vec![
        format!("--name={name}"),
        "--data-dir=/var/lib/etcd".to_owned(),
        format!("--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls=http://0.0.0.0:{PEER_PORT}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={initial_cluster}"),
        "--initial-cluster-state=new".to_owned(),
        format!("--initial-cluster-token={token}"),
        "--logger=zap".to_owned(),
    ]
}
