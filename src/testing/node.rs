//! One etcd member in a container.

use std::time::Duration;

use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::image::ETCD_PATH;
use super::{EtcdImage, HarnessError, LABEL, docker, free_port, wait_serving};

/// etcd's client port inside the container.
pub(crate) const CLIENT_PORT: u16 = 2379;
/// etcd's peer port inside the container.
pub(crate) const PEER_PORT: u16 = 2380;
/// How long a member may take to start serving.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A single-member etcd in a container, removed when dropped.
pub struct EtcdNode {
    container: ContainerAsync<GenericImage>,
    endpoint: String,
    image: EtcdImage,
}

impl std::fmt::Debug for EtcdNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdNode")
            .field("endpoint", &self.endpoint)
            .field("image", &self.image.reference())
            .field("container", &self.container.id())
            .finish()
    }
}

impl EtcdNode {
    /// Starts etcd from [`EtcdImage::from_env`] and waits until it serves.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(EtcdImage::from_env()).await
    }

    /// Starts etcd from `image` and waits until it serves.
    pub async fn start_with(image: EtcdImage) -> Result<Self, HarnessError> {
        let docker = docker().await?;
        let image = image.resolve_with(&docker).await?.image;
        let port = free_port()?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let container = GenericImage::new(image.name(), image.tag())
            .with_entrypoint(ETCD_PATH)
            .with_mapped_port(port, CLIENT_PORT.tcp())
            .with_label(LABEL, "node")
            .with_startup_timeout(START_TIMEOUT)
            .with_cmd(member_args(
                "default",
                &endpoint,
                &format!("default=http://127.0.0.1:{PEER_PORT}"),
                "leasehold-node",
                &format!("http://127.0.0.1:{PEER_PORT}"),
            ))
            .start()
            .await
            .map_err(|e| {
                HarnessError::container(format!("start etcd ({})", image.reference()), e)
            })?;
        // Readiness is a served read, not a log line: log formats differ between releases.
        wait_serving(&endpoint, START_TIMEOUT).await?;
        Ok(Self {
            container,
            endpoint,
            image,
        })
    }

    /// The client URL, e.g. `http://127.0.0.1:32768`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The image this node runs: the one the selection settled on (for
    /// [`EtcdImage::release`], possibly etcd's upstream image).
    pub fn image(&self) -> &EtcdImage {
        &self.image
    }

    /// The Docker container ID.
    pub fn container_id(&self) -> &str {
        self.container.id()
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
        // Clients reach members through the published port on loopback.
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls=http://0.0.0.0:{PEER_PORT}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={initial_cluster}"),
        "--initial-cluster-state=new".to_owned(),
        format!("--initial-cluster-token={token}"),
        "--logger=zap".to_owned(),
    ]
}
