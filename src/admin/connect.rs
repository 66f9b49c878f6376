//! [`Admin::connect`] and [`Admin::connect_with`]: an admin from endpoints and a namespace
//! name, connected in one call.

use super::Admin;
use crate::etcd::{ConnectError, ConnectOptions, Connection};
use crate::keys::{InvalidNamespaceError, Namespace};

/// [`Admin::connect`] or [`Admin::connect_with`] failed.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum AdminConnectError {
    /// The namespace is not valid. Nothing was dialled. Permanent.
    #[error(transparent)]
    Namespace(#[from] InvalidNamespaceError),
    /// Connecting to etcd failed. Transient or permanent as the [`ConnectError`] says:
    /// [`Unreachable`](ConnectError::Unreachable) is transient (etcd may come up);
    /// [`NoEndpoints`](ConnectError::NoEndpoints),
    /// [`InvalidEndpoint`](ConnectError::InvalidEndpoint) and
    /// [`Refused`](ConnectError::Refused) (credentials) are permanent, and
    /// [`Tls`](ConnectError::Tls) is permanent until the certificates or the TLS options are
    /// fixed.
    #[error("cannot connect to etcd")]
    Connect(#[source] ConnectError),
}

/// The error and its causes on one line, `error: cause: cause`: what a `main` that returns it
/// (through `?` and `Box<dyn Error>`) prints, rather than a dump of its fields.
impl std::fmt::Debug for AdminConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::etcd::chain(self))
    }
}

impl Admin {
    /// An admin of `namespace` on the etcd cluster at `endpoints` (client URLs such as
    /// `http://127.0.0.1:2379`), with [`ConnectOptions::new`]'s defaults: 3 s to open a
    /// connection, 5 s a request, and the default [`RetryPolicy`](crate::RetryPolicy). For
    /// TLS, a user and password, or other timeouts, see [`connect_with`](Self::connect_with).
    ///
    /// The namespace is a name, validated as [`Namespace::new`] does (for a [`Namespace`] held
    /// already, its [`as_str`](Namespace::as_str)), before anything is dialled
    /// ([`AdminConnectError::Namespace`]). Then at least one endpoint must answer a status
    /// request within the retry policy's deadline, 10 s ([`AdminConnectError::Connect`], with
    /// the last failure, when none does): an admin that is returned has reached etcd. The same
    /// as [`Admin::new`] over [`Connection::connect`], in one call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use leasehold::admin::Admin;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let admin = Admin::connect(["http://127.0.0.1:2379"], "billing").await?;
    /// println!("{} owned sessions", admin.namespace_status().await?.owned_sessions);
    /// // The host named worker-3 hands its sessions over to the others.
    /// let host = admin.drain_node("worker-3").await?;
    /// println!("asked store {} to drain", host.store);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
        namespace: impl Into<String>,
    ) -> Result<Self, AdminConnectError> {
        Self::connect_with(ConnectOptions::new(endpoints), namespace).await
    }

    /// [`connect`](Self::connect) with `options`: the same knobs as a store's connection
    /// ([`StoreOptions`](crate::StoreOptions)) has, TLS ([`ConnectOptions::with_tls`]), a
    /// user and password ([`ConnectOptions::with_user`]), how long opening a connection and a
    /// request may take, the retry policy (whose deadline bounds how long connecting is tried)
    /// and the requests in flight per endpoint.
    ///
    /// The namespace is validated before anything is dialled; then at least one endpoint must
    /// answer within the retry policy's deadline (`options.retry.deadline`), each connection
    /// opened within `options.connect_timeout`, or [`AdminConnectError::Connect`] says why none
    /// did.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use leasehold::admin::Admin;
    /// use leasehold::{ConnectOptions, RetryPolicy, TlsOptions};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let options = ConnectOptions::new(["https://etcd-0:2379", "https://etcd-1:2379"])
    ///     .with_tls(TlsOptions::new(std::fs::read("ca.pem")?))
    ///     .with_user("operator", std::fs::read_to_string("password")?)
    ///     .with_connect_timeout(Duration::from_secs(1))
    ///     .with_retry(RetryPolicy::default().with_deadline(Duration::from_secs(5)));
    /// let admin = Admin::connect_with(options, "billing").await?;
    /// for host in admin.hosts().await? {
    ///     println!("{} ({}): {} sessions", host.node, host.store, host.sessions);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_with(
        options: ConnectOptions,
        namespace: impl Into<String>,
    ) -> Result<Self, AdminConnectError> {
        let namespace = Namespace::new(namespace)?;
        let connection = Connection::connect(options)
            .await
            .map_err(AdminConnectError::Connect)?;
        Ok(Self::new(connection, namespace))
    }
}
