//! # leasehold
//!
//! Single-writer ownership of live session journals, on etcd.
//!
//! A *session*, identified by a UUID, has exactly one live owner among many nodes that share
//! one etcd cluster. The owner holds a lease whose **epoch** is an etcd revision, so epochs
//! strictly increase across handovers, and the session's append-only journal is fenced by that
//! epoch at every compare-and-swap, so a stale owner (after a GC pause, a network blip) loses
//! the CAS instead of forking the journal.
//!
//! This release provides the foundation the leases and journals stand on:
//!
//! - [`Connection`]: a connection to an etcd cluster that fails over between endpoints and
//!   retries only what is safe to retry (see [`FailureClass`]);
//! - [`Namespace`]: the key layout every deployment lives under (see [`keys`]);
//! - `leasehold::testing` (feature `testing`): a real-etcd harness on testcontainers, with
//!   fault-injecting clusters and a loopback fault proxy, for leasehold's tests and yours.
//!
//! # Quick start
//!
//! ```no_run
//! use leasehold::{ConnectOptions, Connection, Namespace};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let connection = Connection::connect(ConnectOptions::new(["http://127.0.0.1:2379"])).await?;
//! let status = connection.namespace_status(&Namespace::default()).await?;
//! println!(
//!     "{}: {} owned sessions at revision {}",
//!     status.namespace, status.owned_sessions, status.revision
//! );
//! # Ok(())
//! # }
//! ```

mod connection;
mod error;
pub mod keys;
pub mod lease;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use connection::{
    ConnectError, ConnectOptions, Connection, MemberStatus, NamespaceStatus, RetryPolicy,
};
pub use error::{
    AcquireError, EtcdError, FailureClass, LeaseHeldError, LeaseLostError, ReleaseError, StoreError,
};
pub use keys::{InvalidNamespaceError, Namespace};
pub use lease::{Epoch, Lease, LossReason, Lost, MarginError, Ownership};
pub use store::{Store, StoreOptions};
