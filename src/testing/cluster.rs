//! A multi-member etcd cluster in containers, with fault controls.
//!
//! Each member is attached to two networks: Docker's default bridge, which carries the client
//! port published on loopback, and a peer network of the cluster's own, which carries raft
//! traffic under the alias `m{i}-peer`. Partitioning a member disconnects it from the peer
//! network only: it stays reachable by clients, as a member cut off by a real network fault
//! would, and answers them with errors (or, for a watch with `require_leader`, "no leader").

use std::time::Duration;

use bollard::models::NetworkDisconnectRequest;
use bollard::models::{EndpointSettings, NetworkConnectRequest, NetworkCreateRequest};
use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::image::ETCD_PATH;
use super::node::{CLIENT_PORT, PEER_PORT, START_TIMEOUT, member_args};
use super::{EtcdImage, HarnessError, LABEL, docker, free_port, wait_for, wait_serving};

/// How a cluster is started.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// The number of members (default 3).
    pub members: usize,
    /// The image every member runs (default [`EtcdImage::from_env`]), resolved once for all
    /// members (see [`EtcdImage`]).
    pub image: EtcdImage,
    /// Extra etcd flags for every member, after the harness's own (default none), e.g.
    /// `--max-txn-ops=16`.
    pub args: Vec<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            members: 3,
            image: EtcdImage::from_env(),
            args: Vec::new(),
        }
    }
}

impl ClusterOptions {
    /// Sets the number of members.
    pub fn with_members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// Sets the image.
    pub fn with_image(mut self, image: EtcdImage) -> Self {
        self.image = image;
        self
    }

    /// Adds extra etcd flags for every member.
    pub fn with_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
}

struct Member {
    name: String,
    endpoint: String,
    member_id: u64,
    container: ContainerAsync<GenericImage>,
}

/// An etcd cluster of containers on a network of its own; removed when dropped.
///
/// Members are addressed by index, `0..len()`.
///
/// Unlike an [`EtcdNode`](super::EtcdNode)'s, a member's client port is published at a host
/// port picked in advance (a free port on loopback), not at one Docker picks: Docker picks a
/// new port each time a container starts, so a member brought back by
/// [`restart`](Self::restart) would move to another endpoint, and the clients a fault test
/// made before the crash (and [`endpoints`](Self::endpoints)) would point at nothing. A fixed
/// port keeps a member's endpoint across kill, stop and restart.
pub struct EtcdCluster {
    // Dropped in declaration order: the containers go before their network.
    members: Vec<Member>,
    peer_network: PeerNetwork,
    docker: bollard::Docker,
    image: EtcdImage,
}

impl std::fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .field("image", &self.image.reference())
            .field("peer_network", &self.peer_network.name)
            .finish()
    }
}

impl EtcdCluster {
    /// Starts three members from [`EtcdImage::from_env`] and waits until all serve.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(ClusterOptions::default()).await
    }

    /// Starts a cluster as `options` say; members start concurrently.
    pub async fn start_with(options: ClusterOptions) -> Result<Self, HarnessError> {
        assert!(options.members >= 1, "a cluster needs at least one member");
        let docker = docker().await?;
        let image = options.image.resolve_with(&docker).await?.image;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let id = &id[..12];
        let peer_network = PeerNetwork::create(&docker, format!("leasehold-peers-{id}")).await?;
        let names: Vec<String> = (0..options.members).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .map(|name| format!("{name}=http://{name}-peer:{PEER_PORT}"))
            .collect::<Vec<_>>()
            .join(",");
        let ports = names
            .iter()
            .map(|_| free_port())
            .collect::<Result<Vec<_>, _>>()?;

        let starts = names.iter().zip(&ports).map(|(name, port)| {
            // Fixed across restarts (see `EtcdCluster`).
            let endpoint = format!("http://127.0.0.1:{port}");
            let mut args = member_args(
                name,
                &endpoint,
                &initial_cluster,
                &format!("leasehold-{id}"),
                &format!("http://{name}-peer:{PEER_PORT}"),
            );
            args.extend(options.args.iter().cloned());
            let image = &image;
            let (docker, network) = (&docker, &peer_network.name);
            async move {
                // No wait condition: a member becomes ready only once its peers are reachable,
                // which needs the peer network attached after the start.
                let container = GenericImage::new(image.name(), image.tag())
                    .with_entrypoint(ETCD_PATH)
                    .with_mapped_port(*port, CLIENT_PORT.tcp())
                    .with_label(LABEL, "cluster-member")
                    .with_startup_timeout(START_TIMEOUT)
                    .with_cmd(args)
                    .start()
                    .await
                    .map_err(|e| HarnessError::container(format!("start etcd member {name}"), e))?;
                connect_peer(docker, network, container.id(), name).await?;
                Ok::<_, HarnessError>(Member {
                    name: name.clone(),
                    endpoint,
                    member_id: 0,
                    container,
                })
            }
        });
        let mut members = Vec::with_capacity(options.members);
        for started in futures_util::future::join_all(starts).await {
            members.push(started?);
        }
        let mut cluster = Self {
            members,
            peer_network,
            docker,
            image,
        };
        for i in 0..cluster.len() {
            cluster.wait_ready(i).await?;
            cluster.members[i].member_id = member_status(&cluster.members[i].endpoint)
                .await
                .map_err(|e| HarnessError::container(format!("status of member {i}"), e))?
                .member_id;
        }
        Ok(cluster)
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client URL, by index.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }

    /// Member `i`'s client URL (the same across restarts).
    pub fn endpoint(&self, i: usize) -> &str {
        &self.members[i].endpoint
    }

    /// Member `i`'s etcd member ID.
    pub fn member_id(&self, i: usize) -> u64 {
        self.members[i].member_id
    }

    /// The image the members run: the one the selection settled on.
    pub fn image(&self) -> &EtcdImage {
        &self.image
    }

    /// Kills member `i` (SIGKILL, no shutdown); its data survives for [`restart`](Self::restart).
    pub async fn kill(&self, i: usize) -> Result<(), HarnessError> {
        let options = bollard::query_parameters::KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        let operation = || format!("kill member {i}");
        self.docker
            .kill_container(self.members[i].container.id(), Some(options))
            .await
            .map_err(|e| HarnessError::container(operation(), e))?;
        // Wait until Docker reports it gone, so the caller's clock starts at the crash.
        wait_for(&operation(), Duration::from_secs(10), || async {
            let running = self.members[i].container.is_running().await.unwrap_or(true);
            (!running).then_some(())
        })
        .await
    }

    /// Stops member `i` gracefully (SIGTERM: a leader hands leadership over first, then the
    /// member exits). [`restart`](Self::restart) brings it back.
    pub async fn stop(&self, i: usize) -> Result<(), HarnessError> {
        self.members[i]
            .container
            .stop_with_timeout(Some(10))
            .await
            .map_err(|e| HarnessError::container(format!("stop member {i}"), e))
    }

    /// Starts member `i` again after [`kill`](Self::kill) and waits until it serves.
    pub async fn restart(&self, i: usize) -> Result<(), HarnessError> {
        self.members[i]
            .container
            .start()
            .await
            .map_err(|e| HarnessError::container(format!("restart member {i}"), e))?;
        self.wait_ready(i).await
    }

    /// Freezes member `i`'s processes (SIGSTOP-like, through the cgroup freezer).
    pub async fn pause(&self, i: usize) -> Result<(), HarnessError> {
        self.members[i]
            .container
            .pause()
            .await
            .map_err(|e| HarnessError::container(format!("pause member {i}"), e))
    }

    /// Thaws member `i`.
    pub async fn unpause(&self, i: usize) -> Result<(), HarnessError> {
        self.members[i]
            .container
            .unpause()
            .await
            .map_err(|e| HarnessError::container(format!("unpause member {i}"), e))
    }

    /// Cuts member `i` off from its peers; clients still reach it.
    pub async fn partition(&self, i: usize) -> Result<(), HarnessError> {
        let request = NetworkDisconnectRequest {
            container: self.members[i].container.id().to_owned(),
            force: Some(true),
        };
        self.docker
            .disconnect_network(&self.peer_network.name, request)
            .await
            .map_err(|e| HarnessError::container(format!("partition member {i}"), e))
    }

    /// Reconnects member `i` to its peers after [`partition`](Self::partition).
    pub async fn heal(&self, i: usize) -> Result<(), HarnessError> {
        let member = &self.members[i];
        connect_peer(
            &self.docker,
            &self.peer_network.name,
            member.container.id(),
            &member.name,
        )
        .await
    }

    /// Waits until member `i` serves linearizable reads (it has a leader and caught up).
    pub async fn wait_ready(&self, i: usize) -> Result<(), HarnessError> {
        wait_serving(
            crate::etcd::ConnectOptions::new([self.members[i].endpoint.as_str()]),
            START_TIMEOUT,
        )
        .await
    }

    /// The index of the leader that a majority of members agree on; waits up to 30 s for one.
    pub async fn leader(&self) -> Result<usize, HarnessError> {
        wait_for(
            "a leader agreed by a majority",
            Duration::from_secs(30),
            || async {
                let mut votes = Vec::new();
                for member in &self.members {
                    if let Ok(Ok(status)) = tokio::time::timeout(
                        Duration::from_secs(1),
                        member_status(&member.endpoint),
                    )
                    .await
                    {
                        votes.push(status.leader_id);
                    }
                }
                let majority = self.members.len() / 2 + 1;
                self.members.iter().position(|m| {
                    m.member_id != 0
                        && votes.iter().filter(|&&id| id == m.member_id).count() >= majority
                })
            },
        )
        .await
    }

    /// Moves leadership to member `to` and waits until a majority sees it lead. A transfer
    /// that does not finish in time (raft aborts it when the target lags) is asked for again.
    pub async fn move_leader(&self, to: usize) -> Result<(), HarnessError> {
        let target = self.member_id(to);
        wait_for(
            &format!("member {to} to lead"),
            Duration::from_secs(30),
            || async {
                let leader = self.leader().await.ok()?;
                if leader == to {
                    return Some(());
                }
                let options = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(1))
                    .with_timeout(Duration::from_secs(3));
                let mut client =
                    etcd_client::Client::connect([self.endpoint(leader)], Some(options))
                        .await
                        .ok()?;
                // etcd waits for the transfer without a deadline of its own: the client's
                // timeout bounds it.
                let _ = client.move_leader(target).await;
                None
            },
        )
        .await
    }
}

/// One member's own view, read from it directly (serializable: works without a leader).
async fn member_status(endpoint: &str) -> Result<crate::etcd::MemberStatus, etcd_client::Error> {
    let mut client = etcd_client::Client::connect(
        [endpoint],
        Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(1))),
    )
    .await?;
    let status = client.status().await?;
    Ok(crate::etcd::MemberStatus::from_response(
        endpoint.to_owned(),
        &status,
    ))
}

async fn connect_peer(
    docker: &bollard::Docker,
    network: &str,
    container: &str,
    name: &str,
) -> Result<(), HarnessError> {
    let request = NetworkConnectRequest {
        container: container.to_owned(),
        endpoint_config: Some(EndpointSettings {
            aliases: Some(vec![format!("{name}-peer")]),
            ..Default::default()
        }),
    };
    docker
        .connect_network(network, request)
        .await
        .map_err(|e| HarnessError::container(format!("connect {name} to its peers"), e))
}

/// The cluster's peer network, removed when dropped.
struct PeerNetwork {
    name: String,
}

impl PeerNetwork {
    async fn create(docker: &bollard::Docker, name: String) -> Result<Self, HarnessError> {
        let request = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".to_owned()),
            labels: Some([(LABEL.to_owned(), "cluster".to_owned())].into()),
            ..Default::default()
        };
        docker
            .create_network(request)
            .await
            .map_err(|e| HarnessError::container(format!("create network {name}"), e))?;
        Ok(Self { name })
    }
}

impl Drop for PeerNetwork {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be shutting down: remove the network
        // from a thread of its own, and wait for it so that nothing is left behind.
        let name = std::mem::take(&mut self.name);
        let removal = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let Ok(runtime) = runtime else { return };
            runtime.block_on(async {
                if let Ok(docker) = bollard::Docker::connect_with_defaults()
                    && let Err(error) = docker.remove_network(&name).await
                {
                    eprintln!("leasehold::testing: could not remove network {name}: {error}");
                }
            });
        });
        let _ = removal.join();
    }
}
