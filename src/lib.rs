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
//! - [`Store`]: one per node. It grants one etcd lease for the node, keeps it alive on one
//!   stream, watches ownership changes, and acquires and releases session leases; see the
//!   [`store`] module for the protocol.
//! - [`Lease`]: ownership of one session, with its [`Epoch`], a lock-free
//!   [`is_valid`](Lease::is_valid), a [`lost`](Lease::lost) signal with its [`LossReason`], and
//!   an idempotent [`release`](Lease::release). [`Ownership`] is the read-only view of it that
//!   cannot release; its [`guard`](Ownership::guard) makes an etcd transaction conditional on
//!   still owning. See the [`lease`] module.
//! - [`Journal`]: a session's append-only journal, fenced by the epoch: opening it appends a
//!   fence, every append is one compare-and-swap transaction, and an append whose reply was
//!   lost is resolved, never guessed. See the [`journal`] module.
//! - [`Rig`]: the composition root of a live session (lease, workspace root, journal) with an
//!   ordered shutdown, and the [`GcView`] that object GC gets. See the [`rig`] module.
//! - [`SessionHost`]: keeps a set of sessions owned and worked on across a cluster of hosts,
//!   balanced, giving up in order and standing by again whenever a session cannot go on. See
//!   the [`host`] module.
//! - [`admin::Admin`]: an operator's view of a namespace, needing no lease: who owns what,
//!   journals read, followed, trimmed, deleted and checked, sessions revoked.
//! - [`OwnerDirectory`]: who owns which session, known locally and kept current by one watch,
//!   with each owner's advertised address and whether its host is alive: what a router needs.
//!   See the [`directory`] module.
//! - `fault::FaultProxy` (feature `fault`): a loopback TCP proxy that injects network faults
//!   between one client and etcd, for tests, demos and drills.
//! - [`Connection`]: a connection to an etcd cluster that fails over between endpoints and
//!   retries only what is safe to retry (see [`FailureClass`]).
//! - [`Namespace`]: the key layout every deployment lives under (see [`keys`]).
//! - [`metrics`]: what leasehold records through the `metrics` facade, for any exporter.
//! - `leasehold::testing` (feature `testing`): a real-etcd harness on testcontainers, with
//!   fault-injecting clusters and a loopback fault proxy, for leasehold's tests and yours.
//!
//! # Layers
//!
//! Bottom up; a module imports only from its own layer and the ones below, and no two modules
//! import each other round a loop (`tests/layers.rs` checks both from the imports; see
//! ARCHITECTURE.md):
//!
//! 1. [`keys`] (the key layout), `fault` (the fault proxy), the clock helpers, the one
//!    backoff every retry loop pauses by, the hooks a lease's loss and a journal's breaking
//!    run, and the one way a std mutex is locked.
//! 2. `etcd`: etcd as leasehold talks to it ([`Connection`], the one write path, [`EtcdError`]);
//!    it knows nothing of sessions.
//! 3. [`metrics`]: what is recorded, under labels the layers above give it.
//! 4. [`lease`]: session leases, their validity and loss.
//! 5. [`journal`]: fenced journals: the fence, appends, replay, retention, the checker.
//! 6. [`store`]: the node: its lease, keepalive, owner watch, acquisitions, cleanup.
//! 7. [`admin`], [`directory`] and [`rig`]: the operator's view; the owner directory; the
//!    composition root of a live session.
//! 8. [`host`]: sessions kept owned across hosts, balanced; `sidecar` (feature `grpc`): the
//!    gRPC service behind `leasehold serve`, sessions owned for clients in any language.
//! 9. `testing`, the harness. The `leasehold` tool is a package of its own (`leasehold-cli`,
//!    in `cli/`) built on this library's public API.
//!
//! # Features
//!
//! None is on by default: the library alone builds no command-line, HTTP-server or exporter
//! dependencies.
//!
//! - `grpc`: the `sidecar` module, the gRPC service of
//!   `proto/leasehold/v1/leasehold.proto` with its generated client (tonic, prost,
//!   tonic-health, tonic-reflection, tonic-types).
//! - `fault`: the `fault` module.
//! - `testing`: the `testing` harness (implies `fault`).
//!
//! # Quick start
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use leasehold::{Store, StoreOptions, Uuid};
//!
//! # async fn do_work(_: leasehold::Ownership) {}
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::connect(StoreOptions::new(["http://127.0.0.1:2379"]).with_node("node-a"))
//!     .await?;
//! let session = Uuid::new_v4();
//! // Owns the session at once if it is free; else stands by until its owner lets go.
//! let lease = store.acquire_lease_wait(session, Duration::from_secs(30)).await?;
//! println!("owning {session} at epoch {}", lease.epoch());
//! tokio::select! {
//!     reason = lease.lost() => println!("lost ownership: {reason}"),
//!     () = do_work(lease.ownership()) => lease.release().await?,
//! }
//! store.close().await;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
mod backoff;
mod clock;
mod deadline;
pub mod directory;
mod etcd;
#[cfg(feature = "fault")]
#[cfg_attr(docsrs, doc(cfg(feature = "fault")))]
pub mod fault;
mod hooks;
pub mod host;
pub mod journal;
pub mod keys;
pub mod lease;
pub mod metrics;
pub mod rig;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod sidecar;
pub mod store;
mod sync;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

/// The etcd client leasehold is built on, re-exported so that the types in leasehold's API
/// that come from it ([`Ownership::guard`]'s `Compare`, [`Store::connect_with_client`]'s
/// `Client`) need no second, matching dependency.
pub use etcd_client;

pub use admin::{Admin, NamespaceStatus};
pub use directory::OwnerDirectory;
pub use etcd::{
    ConnectError, ConnectOptions, Connection, Credentials, EtcdError, FailureClass, MINIMUM_ETCD,
    MemberStatus, RetryPolicy, TlsOptions, WritePolicy, etcd_metric,
};
pub use host::{
    FORWARDED_HEADER, GiveUp, HostEvent, HostEvents, HostOptions, HttpRouter, LoadBalance,
    MAX_PUBLISHED_SESSIONS, NotOwner, Route, Routed, SessionHost,
};
pub use journal::{
    AppendError, Appended, DecodeError, Deleted, Event, Fence, Found, IdempotencyKey, Journal,
    JournalLeaseLostError, JournalLimits, JournalWriteError, NilLeaseError, OpenJournalError,
    Record, Replay, ReplayError, ReplayOptions, RetentionError, Tip, Trimmed, Unknowable,
};
pub use keys::{InvalidNamespaceError, Namespace};
pub use lease::{
    Epoch, Lease, LeaseLostError, LossReason, Lost, MarginError, Ownership, ReleaseError,
};
pub use rig::{GcView, Rig};
pub use store::{AcquireError, LeaseHeldError, OwnerValue, Store, StoreError, StoreOptions};
pub use tokio_util::sync::CancellationToken;
pub use uuid::Uuid;

/// README.md's code blocks, compiled as doctests (`no_run` where they need etcd). The testing
/// block needs the harness, so they are checked with `--all-features`.
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's code blocks (docs/guide/, and docs/guarantees.md), compiled as doctests where
/// they are Rust.
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../docs/guide/1-own-a-session.md")]
#[doc = include_str!("../docs/guide/2-host-sessions.md")]
#[doc = include_str!("../docs/guide/3-routing.md")]
#[doc = include_str!("../docs/guide/4-operate.md")]
#[doc = include_str!("../docs/guide/5-any-language.md")]
#[doc = include_str!("../docs/guide/6-testing.md")]
#[doc = include_str!("../docs/guide/7-production.md")]
#[doc = include_str!("../docs/guarantees.md")]
pub struct GuideDoctests;

/// docs/production.md's code blocks, compiled as doctests where they are Rust.
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../docs/production.md")]
pub struct ProductionDoctests;
