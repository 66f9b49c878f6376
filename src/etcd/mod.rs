//! The bottom layer: etcd itself, as leasehold talks to it. It knows nothing of sessions,
//! leases or journals (it imports nothing of the crate but `keys` and the clock helpers).
//!
//! - `options`: where and how to connect ([`ConnectOptions`], [`RetryPolicy`], [`TlsOptions`],
//!   [`Credentials`]).
//! - `connect`: why a connection could not be made ([`ConnectError`], with the TLS probe), and
//!   the status a member answers with ([`MemberStatus`], [`MINIMUM_ETCD`]).
//! - `connection`: [`Connection`], one client per endpoint, failover, bounded attempts.
//! - `write`: the one write path (send, re-send byte-identical, resolve by reading).
//! - `shared`: independent writes that share transactions, each a transaction of its own
//!   within one (acquisitions, workspace roots, guarded deletes).
//! - `error`: [`EtcdError`] and what a failure means for its request ([`FailureClass`]).
//! - `txn`: the guarded delete, and the gets of a reply.
//! - `scrape`: [`etcd_metric`], one metric a member serves.

mod connect;
pub(crate) mod connection;
pub(crate) mod error;
mod member;
mod options;
mod range;
mod scrape;
pub(crate) mod shared;
mod txn;
pub(crate) mod write;

pub(crate) use connect::parse_version;
pub use connect::{ConnectError, MINIMUM_ETCD, MemberStatus};
pub use connection::Connection;
pub(crate) use error::chain;
pub use error::{EtcdError, FailureClass};
pub use options::{ConnectOptions, Credentials, RetryPolicy, TlsOptions};
pub use scrape::etcd_metric;
pub(crate) use txn::{Delete, gets};
pub use write::WritePolicy;
