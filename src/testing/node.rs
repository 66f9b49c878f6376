//! One etcd member in a container.

use std::time::Duration;

use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::image::ETCD_PATH;
use super::{EtcdImage, HarnessError, ImageSource, LABEL, TestCertificates, docker, wait_serving};
use crate::etcd::{ConnectOptions, Credentials, TlsOptions};
use crate::keys::Namespace;
use crate::store::{Store, StoreOptions};

/// The user the harness enables authentication with ([`EtcdNodeBuilder::auth`]).
pub const ROOT_USER: &str = "root";
/// Where a TLS member's certificates are copied inside its container.
const TLS_DIR: &str = "/etc/leasehold-tls";

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
    tls: Option<TlsOptions>,
    root: Option<Credentials>,
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
    tls: Option<TestCertificates>,
    root_password: Option<String>,
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

    /// Serves clients over TLS only (`https://`), with the members' certificate of
    /// `certificates`, and requires client certificates signed by its CA
    /// (`--client-cert-auth`). [`EtcdNode::tls`] then gives options that trust the CA and
    /// present its client certificate.
    pub fn tls(mut self, certificates: TestCertificates) -> Self {
        self.tls = Some(certificates);
        self
    }

    /// Enables etcd's authentication once the member serves: user [`ROOT_USER`] with
    /// `root_password` and the root role, then `auth enable`. Add users with
    /// [`EtcdNode::add_prefix_user`]; the token's kind and TTL are etcd flags
    /// (`.args(["--auth-token=simple", "--auth-token-ttl=2"])`).
    pub fn auth(mut self, root_password: impl Into<String>) -> Self {
        self.root_password = Some(root_password.into());
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
        if self.tls.is_some() {
            // Later flags win: clients are served over TLS only.
            args.extend([
                format!("--listen-client-urls=https://0.0.0.0:{CLIENT_PORT}"),
                format!("--advertise-client-urls=https://127.0.0.1:{CLIENT_PORT}"),
                format!("--cert-file={TLS_DIR}/server.pem"),
                format!("--key-file={TLS_DIR}/server-key.pem"),
                format!("--trusted-ca-file={TLS_DIR}/ca.pem"),
                "--client-cert-auth".to_owned(),
            ]);
        }
        args.extend(self.args);
        let starting = || format!("start etcd ({})", image.reference());
        let mut request = GenericImage::new(image.name(), image.tag())
            .with_exposed_port(CLIENT_PORT.tcp())
            .with_entrypoint(ETCD_PATH)
            .with_label(LABEL, "node")
            .with_startup_timeout(START_TIMEOUT)
            .with_cmd(args);
        if let Some(certificates) = &self.tls {
            let (cert, key) = certificates.server_pem();
            for (file, pem) in [
                ("ca.pem", certificates.ca_pem()),
                ("server.pem", cert),
                ("server-key.pem", key),
            ] {
                request =
                    request.with_copy_to(format!("{TLS_DIR}/{file}"), pem.as_bytes().to_vec());
            }
        }
        let container = request
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
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://{host}:{port}");
        let tls = self.tls.as_ref().map(TestCertificates::client_tls);
        // Readiness is a served read, not a log line: log formats differ between releases.
        let probe = ConnectOptions::new([endpoint.as_str()]);
        let probe = match &tls {
            Some(tls) => probe.with_tls(tls.clone()),
            None => probe,
        };
        wait_serving(probe, START_TIMEOUT).await?;
        let root = match self.root_password {
            Some(password) => {
                enable_auth(&endpoint, tls.as_ref(), &password).await?;
                Some(Credentials::new(ROOT_USER, password))
            }
            None => None,
        };
        Ok(EtcdNode {
            container,
            endpoint,
            tls,
            root,
            image,
            source: choice.source,
        })
    }
}

/// A raw etcd-client client for `endpoint`, with `tls` and as `user`.
async fn raw_client(
    endpoint: &str,
    tls: Option<&TlsOptions>,
    user: Option<&Credentials>,
) -> Result<etcd_client::Client, etcd_client::Error> {
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10))
        .with_auto_token_refresh(true);
    if let Some(tls) = tls {
        options = options.with_tls(tls.to_etcd());
    }
    if let Some(user) = user {
        let (name, password) = user.pair();
        options = options.with_user(name, password);
    }
    etcd_client::Client::connect([endpoint], Some(options)).await
}

/// Adds the root user and role and enables authentication.
async fn enable_auth(
    endpoint: &str,
    tls: Option<&TlsOptions>,
    password: &str,
) -> Result<(), HarnessError> {
    let failed = |e| HarnessError::container(format!("enable authentication on {endpoint}"), e);
    let mut client = raw_client(endpoint, tls, None).await.map_err(failed)?;
    client.role_add(ROOT_USER).await.map_err(failed)?;
    client
        .user_add(ROOT_USER, password, None)
        .await
        .map_err(failed)?;
    client
        .user_grant_role(ROOT_USER, ROOT_USER)
        .await
        .map_err(failed)?;
    client.auth_enable().await.map_err(failed)?;
    Ok(())
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
    ///
    /// On a TLS member the options trust its CA and present the client certificate; on a
    /// member with authentication they authenticate as [`ROOT_USER`].
    pub fn store_options(&self, namespace: &Namespace, node: &str) -> StoreOptions {
        let mut options = StoreOptions::new([self.endpoint.clone()])
            .with_namespace(namespace.clone())
            .with_node(node);
        options.tls = self.tls.clone();
        options.credentials = self.root.clone();
        options
    }

    /// Connection options for this member: its endpoint, its TLS options and the root user,
    /// as [`store_options`](Self::store_options).
    pub fn connect_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::new([self.endpoint.clone()]);
        options.tls = self.tls.clone();
        options.credentials = self.root.clone();
        options
    }

    /// TLS options that trust this member's CA and present the test client certificate;
    /// `None` for a plain member.
    pub fn tls(&self) -> Option<&TlsOptions> {
        self.tls.as_ref()
    }

    /// The root user's credentials, on a member with authentication.
    pub fn root_credentials(&self) -> Option<&Credentials> {
        self.root.as_ref()
    }

    /// A raw etcd-client client for this member, with its TLS options and as the root user
    /// (tests use it to look at and change keys from outside).
    pub async fn raw_client(&self) -> Result<etcd_client::Client, HarnessError> {
        raw_client(&self.endpoint, self.tls.as_ref(), self.root.as_ref())
            .await
            .map_err(|e| HarnessError::container(format!("connect to {}", self.endpoint), e))
    }

    /// Adds `user` with `password` and a role of the same name that may read and write the
    /// keys under `prefix` and nothing else (on a member with authentication).
    pub async fn add_prefix_user(
        &self,
        user: &str,
        password: &str,
        prefix: &str,
    ) -> Result<(), HarnessError> {
        let failed = |e| HarnessError::container(format!("add user {user}"), e);
        let mut client = self.raw_client().await?;
        client.role_add(user).await.map_err(failed)?;
        let permission = etcd_client::Permission::read_write(prefix).with_prefix();
        client
            .role_grant_permission(user, permission)
            .await
            .map_err(failed)?;
        client
            .user_add(user, password, None)
            .await
            .map_err(failed)?;
        client.user_grant_role(user, user).await.map_err(failed)?;
        Ok(())
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
