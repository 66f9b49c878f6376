//! [`Admin::drain`] and [`Admin::undrain`]: asking a running session host to hand its sessions
//! over, or to take its share back; [`Admin::drain_node`] and [`Admin::undrain_node`] name the
//! host by its node name.
//!
//! A drain request is a key `{ns}/drains/{store}` attached to the host's node lease, so it goes
//! with the host's store. Every host reads its own with the host keys, at each balance tick (at
//! most 1 s apart), and drains while it exists, as
//! [`SessionHost::drain`](crate::SessionHost::drain) does.

use etcd_client::{Compare, CompareOp, KvClient, PutOptions, Txn, TxnOp};
use uuid::Uuid;

use super::hosts::listed;
use super::{Admin, Host, HostLookupError};
use crate::etcd::EtcdError;

/// Asking a host to drain or undrain failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// No live host has that store id (its key is gone, or it never registered). Nothing was
    /// written. Permanent until such a host registers.
    #[error("no live session host with store {store}")]
    NotLive {
        /// The store id asked for.
        store: Uuid,
    },
    /// No live host has that node name. Nothing was written. Permanent until such a host
    /// registers.
    #[error("no live session host named {node:?}")]
    NoSuchHost {
        /// The node name asked for.
        node: String,
    },
    /// Several live hosts have that node name: name one by its store id
    /// ([`drain`](Admin::drain), [`undrain`](Admin::undrain)). Nothing was written.
    #[error(
        "{} live session hosts are named {node:?}: name one by its store id ({})",
        .stores.len(),
        listed(.stores)
    )]
    Ambiguous {
        /// The node name asked for.
        node: String,
        /// The store ids of the hosts with that name, in order.
        stores: Vec<Uuid>,
    },
    /// etcd failed; the request may or may not have been written. Repeating is safe.
    #[error("asking the host failed")]
    Etcd(#[source] EtcdError),
}

impl From<HostLookupError> for DrainError {
    fn from(error: HostLookupError) -> Self {
        match error {
            HostLookupError::NoSuchHost { node } => DrainError::NoSuchHost { node },
            HostLookupError::Ambiguous { node, stores } => DrainError::Ambiguous { node, stores },
            HostLookupError::Etcd(error) => DrainError::Etcd(error),
        }
    }
}

impl Admin {
    /// Asks the live host of store `store` to drain: it hands every session over in order and
    /// takes none until [`undrain`](Self::undrain)ed (or its store's node lease ends). Written
    /// only if the host's key is still there, attached to the node lease it was read with.
    pub async fn drain(&self, store: Uuid) -> Result<(), DrainError> {
        let host_key = self.namespace.host_key(store);
        // Only the host's key: its node lease is what the request is attached to.
        let read = self
            .connection
            .read("host", |mut client: KvClient, _| {
                let key = host_key.clone();
                async move { client.get(key, None).await }
            })
            .await
            .map_err(DrainError::Etcd)?;
        let lease_id = read
            .kvs()
            .first()
            .map(|kv| kv.lease())
            .ok_or(DrainError::NotLive { store })?;
        let txn = Txn::new()
            .when([Compare::lease(
                host_key.as_str(),
                CompareOp::Equal,
                lease_id,
            )])
            .and_then([TxnOp::put(
                self.namespace.drain_key(store),
                "drain",
                Some(PutOptions::new().with_lease(lease_id)),
            )]);
        match self.send("drain", &txn).await? {
            true => Ok(()),
            false => Err(DrainError::NotLive { store }),
        }
    }

    /// Withdraws a drain request of store `store` (nothing happens if there is none): the host
    /// takes its share back at its next balance tick.
    pub async fn undrain(&self, store: Uuid) -> Result<(), DrainError> {
        let txn = Txn::new().and_then([TxnOp::delete(self.namespace.drain_key(store), None)]);
        self.send("undrain", &txn).await.map(|_| ())
    }

    /// [`drain`](Self::drain)s the one live host named `node` (see
    /// [`host_named`](Self::host_named)), and returns it as it was read: `sessions` is how many
    /// it held when asked. [`NoSuchHost`](DrainError::NoSuchHost) or
    /// [`Ambiguous`](DrainError::Ambiguous) when the name does not name exactly one host; then
    /// nothing was written.
    pub async fn drain_node(&self, node: &str) -> Result<Host, DrainError> {
        let host = self.host_named(node).await?;
        self.drain(host.store).await?;
        Ok(host)
    }

    /// [`undrain`](Self::undrain)s the one live host named `node` (see
    /// [`host_named`](Self::host_named)), and returns it as it was read. A host that is not
    /// live has no drain request left (the request goes with its node lease), so only live
    /// hosts are looked at: [`NoSuchHost`](DrainError::NoSuchHost) or
    /// [`Ambiguous`](DrainError::Ambiguous) when the name does not name exactly one; then
    /// nothing was written.
    pub async fn undrain_node(&self, node: &str) -> Result<Host, DrainError> {
        let host = self.host_named(node).await?;
        self.undrain(host.store).await?;
        Ok(host)
    }

    /// Sends `txn` (both requests are idempotent): whether it succeeded (its compares held).
    async fn send(&self, operation: &'static str, txn: &Txn) -> Result<bool, DrainError> {
        let reply = self
            .send_idempotent(operation, txn)
            .await
            .map_err(DrainError::Etcd)?;
        Ok(reply.succeeded())
    }
}
