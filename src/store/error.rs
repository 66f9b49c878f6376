//! What a store's operations return: [`StoreError`] (connecting), [`AcquireError`] and
//! [`LeaseHeldError`] (acquiring).

use std::time::Duration;

use uuid::Uuid;

use crate::etcd::{ConnectError, EtcdError, FailureClass};
use crate::keys::InvalidNamespaceError;
use crate::lease::{Epoch, LossReason, MarginError};

/// The session is owned by someone else. Transient: it may be released later (see
/// [`Store::acquire_lease_wait`](crate::store::Store::acquire_lease_wait)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("session {session_id} is held at epoch {holder_epoch}")]
pub struct LeaseHeldError {
    /// The session.
    pub session_id: Uuid,
    /// The holder's epoch: its owner key's `create_revision`.
    pub holder_epoch: Epoch,
}

/// [`Store::acquire_lease`](crate::store::Store::acquire_lease) or
/// [`acquire_lease_wait`](crate::store::Store::acquire_lease_wait) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// Someone else owns the session. Transient.
    #[error(transparent)]
    Held(#[from] LeaseHeldError),
    /// The store's node lease is not valid right now (lost and being replaced, or past its
    /// deadline). Transient: a fresh node lease is granted in the background.
    #[error("the node lease is not valid; retry once a fresh one is granted")]
    NodeLeaseInvalid,
    /// etcd failed the request; see the error's [`FailureClass`]. Transient or permanent.
    #[error("acquire failed")]
    Etcd(#[source] EtcdError),
    /// The acquisition's outcome stayed unknown until the node lease stopped being valid, and
    /// reading the owner key could not settle it. The error is the first failure that may have
    /// applied. If it committed, the key is deleted in the background. Outcome unknown:
    /// retrying is safe.
    #[error("the acquisition's outcome is unknown")]
    OutcomeUnknown(#[source] EtcdError),
    /// The session is not held, but is being moved to another node
    /// ([`Admin::move_session`](crate::Admin::move_session)): only the target's store may
    /// acquire it until the move ends. Transient.
    #[error("session {session_id} is being moved to store {target}")]
    Moving {
        /// The session.
        session_id: Uuid,
        /// The store it moves to.
        target: Uuid,
    },
    /// The session stayed held until the deadline. Transient.
    #[error("session {session_id} was still held at the deadline ({waited:?})")]
    TimedOut {
        /// The session.
        session_id: Uuid,
        /// How long the standby waited.
        waited: Duration,
    },
    /// The store was closed. Permanent.
    #[error("the store is closed")]
    StoreClosed,
    /// The acquisition committed, but the lease was lost before it could be handed over (the
    /// owner key was deleted or overtaken meanwhile). Transient: stand by and try again.
    #[error("the session was lost while it was being acquired ({0})")]
    Lost(LossReason),
    /// The session is not in the registry ([`Store::acquire_registered`](crate::Store::acquire_registered)):
    /// it was finished, or never created. Nothing was written. Permanent until the session is
    /// created again.
    #[error("session {session_id} is not in the registry (finished, or never created)")]
    NotRegistered {
        /// The session.
        session_id: Uuid,
    },
}

impl AcquireError {
    /// Whether standing by and trying again can succeed: everything but a closed store and a
    /// permanent etcd failure.
    pub fn is_transient(&self) -> bool {
        match self {
            AcquireError::Held(_)
            | AcquireError::Moving { .. }
            | AcquireError::NodeLeaseInvalid
            | AcquireError::OutcomeUnknown(_)
            | AcquireError::TimedOut { .. }
            | AcquireError::Lost(_) => true,
            AcquireError::Etcd(error) => error.class() != FailureClass::Permanent,
            AcquireError::StoreClosed | AcquireError::NotRegistered { .. } => false,
        }
    }
}

/// [`Store::connect`](crate::store::Store::connect) failed.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The namespace is not valid. Permanent.
    #[error(transparent)]
    Namespace(#[from] InvalidNamespaceError),
    /// The TTL is below etcd's minimum of 2 s, above its maximum of 9,000,000,000 s, or not
    /// a whole number of seconds. Permanent.
    #[error("node lease TTL {ttl:?} is invalid: etcd takes whole seconds, from 2 to 9000000000")]
    InvalidTtl {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// The node name is empty, longer than
    /// [`MAX_NODE_LEN`](crate::store::MAX_NODE_LEN) bytes, or has a newline. Permanent.
    #[error("invalid node name {node:?}: it must be non-empty, on one line, and at most 256 bytes")]
    InvalidNode {
        /// The name as given.
        node: String,
    },
    /// The advertised address is not a URL with a scheme and a host, has a space or a
    /// control character, or is longer than
    /// [`MAX_ADVERTISE_LEN`](crate::store::MAX_ADVERTISE_LEN) bytes. Permanent.
    #[error(
        "invalid advertised address {advertise:?}: it must be a URL with a scheme and a host (such as http://10.0.0.7:31501), without spaces, at most 256 bytes"
    )]
    InvalidAdvertise {
        /// The address as given.
        advertise: String,
    },
    /// The metadata is longer than [`MAX_METADATA_LEN`](crate::store::MAX_METADATA_LEN)
    /// bytes. Permanent.
    #[error("metadata of {len} bytes is too long: at most 256")]
    InvalidMetadata {
        /// Its length.
        len: usize,
    },
    /// A write attempt would time out before it is sent: the attempt and re-send timeouts
    /// must be above zero. Permanent.
    #[error("invalid write policy {policy:?}: attempt timeouts must be above zero")]
    InvalidWritePolicy {
        /// The policy as given.
        policy: crate::etcd::WritePolicy,
    },
    /// The journal limits leave no room for an append: `max_txn_ops` below
    /// [`MIN_TXN_OPS`](crate::journal::MIN_TXN_OPS), or no transaction in flight (or more
    /// than [`MAX_IN_FLIGHT`](crate::journal::MAX_IN_FLIGHT)). Permanent.
    #[error(
        "invalid journal limits {limits:?}: max_txn_ops must be at least {} and in_flight from 1 to {}",
        crate::journal::MIN_TXN_OPS,
        crate::journal::MAX_IN_FLIGHT
    )]
    InvalidJournalLimits {
        /// The limits as given.
        limits: crate::journal::JournalLimits,
    },
    /// The safety margin leaves no room to renew. Permanent for these settings.
    #[error(transparent)]
    Margin(#[from] MarginError),
    /// Connecting to etcd failed. Transient or permanent as the [`ConnectError`] says:
    /// [`Unreachable`](ConnectError::Unreachable) is transient (etcd may come up);
    /// [`NoEndpoints`](ConnectError::NoEndpoints),
    /// [`InvalidEndpoint`](ConnectError::InvalidEndpoint) and
    /// [`Refused`](ConnectError::Refused) (credentials) are permanent, and
    /// [`Tls`](ConnectError::Tls) is permanent until the certificates or the TLS options are
    /// fixed.
    #[error("cannot connect to etcd")]
    Connect(#[source] ConnectError),
    /// Granting the node lease failed. Transient or permanent as its class says.
    #[error("cannot grant the node lease")]
    Grant(#[source] EtcdError),
}

/// The error and its causes on one line, `error: cause: cause`: what a `main` that returns it
/// (through `?` and `Box<dyn Error>`) prints, rather than a dump of its fields.
impl std::fmt::Debug for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::etcd::chain(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acquisition_whose_outcome_is_unknown_is_stood_by_whatever_its_error() {
        let error = |status| EtcdError::new("acquire", "e", etcd_client::Error::GRpcStatus(status));
        let permanent = error(tonic::Status::permission_denied("no"));
        assert_eq!(permanent.class(), FailureClass::Permanent);
        // An unknown outcome may have committed: retrying (standing by) is always right.
        assert!(AcquireError::OutcomeUnknown(permanent).is_transient());
        assert!(!AcquireError::Etcd(error(tonic::Status::permission_denied("no"))).is_transient());
        assert!(
            AcquireError::Etcd(error(tonic::Status::unavailable("etcdserver: no leader")))
                .is_transient()
        );
        assert!(AcquireError::Lost(LossReason::Overtaken).is_transient());
        assert!(!AcquireError::StoreClosed.is_transient());
    }
}
