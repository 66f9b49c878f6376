//! Seeing and acting on a namespace as an operator: who owns what, what a journal holds, taking
//! a session from a wedged node, trimming and deleting journals, checking them.
//!
//! [`Admin`] needs only a [`Connection`], never a node lease: reading is allowed to anyone, and
//! its writes are guarded like every other write leasehold makes. [`Admin::connect`] makes one
//! from endpoints and a namespace name in one call ([`Admin::connect_with`] with TLS, a user
//! and password, or other timeouts); [`Admin::new`] takes a connection you already have.
//!
//! - [`owners`](Admin::owners): every owned session, with its holder, epoch, when it was
//!   acquired, the holder's advertised address, its node lease TTL left and the journal's
//!   tip, read at one revision.
//! - [`directory`](Admin::directory): an [`OwnerDirectory`], who owns what kept current by a
//!   watch, for routers.
//! - [`drain`](Admin::drain) and [`undrain`](Admin::undrain): ask a running session host to
//!   hand its sessions over, or to take its share back; [`drain_node`](Admin::drain_node) and
//!   [`undrain_node`](Admin::undrain_node) name the host by its node name.
//! - [`move_session`](Admin::move_session): move an owned session to another session host in
//!   one graceful handover; [`move_session_to_node`](Admin::move_session_to_node) names the
//!   target by its node name.
//! - [`hosts`](Admin::hosts): every live session host, with its advertised address and how
//!   many sessions it holds; [`host_named`](Admin::host_named): the one a node name names.
//! - [`journal`](Admin::journal), [`records`](Admin::records), [`follow`](Admin::follow): a
//!   journal's base and tip, its records at one snapshot, and new records as they commit.
//! - [`revoke`](Admin::revoke): deletes an owner key, guarded by its epoch; the holder's
//!   [`lost`](crate::Lease::lost) resolves with [`Revoked`](crate::LossReason::Revoked) and a
//!   standby takes the session over.
//! - [`trim`](Admin::trim) and [`delete_journal`](Admin::delete_journal): the
//!   [retention](mod@crate::journal#retention) protocol without a lease. A trim skips the
//!   owner compare (it never touches the tip, so it never fences the writer); a delete
//!   requires that nobody owns the session.
//! - [`check`](Admin::check): the journal invariants on live data.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use etcd_client::{Client, Compare, CompareOp, GetOptions, KvClient, Txn, TxnOp};
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::directory::OwnerDirectory;
use crate::etcd::write::{self, WritePolicy, Written};
use crate::etcd::{Connection, EtcdError};
use crate::journal::{
    Authority, Deleted, JournalCheck, Replay, ReplayError, ReplayOptions, Retention,
    RetentionError, TRIM_BATCH, Tip, Trimmed,
};
use crate::keys::{Namespace, id_under, prefix_end};
use crate::lease::Epoch;
use crate::store::{LoadValue, OwnerValue};

/// What a namespace holds right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceStatus {
    /// The namespace.
    pub namespace: Namespace,
    /// The revision the counts were read at (one consistent snapshot).
    pub revision: u64,
    /// Sessions that have an owner.
    pub owned_sessions: u64,
    /// Workspace roots that are owned.
    pub owned_workspaces: u64,
    /// All keys under the namespace, journals included.
    pub keys: u64,
}

mod connect;
mod drain;
mod follow;
mod hosts;
mod moves;
mod sessions;
pub use crate::store::MOVE_WITHDRAWN_AFTER;
pub use connect::AdminConnectError;
pub use drain::DrainError;
pub use follow::Follow;
pub use hosts::{Host, HostLookupError};
pub use moves::{MoveError, Moved};
pub use sessions::{Finished, MAX_SESSION_METADATA, RegisteredSession, RegistryError};

/// Concurrent reads when gathering tips and lease TTLs.
const CONCURRENT_READS: usize = 16;

/// How many tips [`Admin::owners`] reads in one transaction (etcd's default limit on the
/// operations of one is 128).
const TIPS_PER_READ: usize = 64;

/// An owned session, as its owner key shows it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Owner {
    /// The session.
    pub session: Uuid,
    /// The holder's epoch (the owner key's create revision).
    pub epoch: Epoch,
    /// The holder's node name; `None` for a value leasehold did not write.
    pub node: Option<String>,
    /// The holder's store instance (one per process).
    pub store: Option<Uuid>,
    /// The address the holder advertises (see
    /// [`StoreOptions::with_advertise`](crate::StoreOptions::with_advertise)); `None` if it
    /// advertises none.
    pub advertise: Option<String>,
    /// The holder's metadata (empty if none).
    pub metadata: Vec<u8>,
    /// When the holder acquired the session, by the holder's clock (read from the
    /// acquisition's nonce; `None` for owner keys that do not carry it).
    pub acquired_at: Option<SystemTime>,
    /// The etcd lease the owner key is attached to (the holder's node lease).
    pub lease_id: i64,
    /// The node lease's TTL left, as etcd counts it; `None` if etcd no longer knows it.
    pub ttl_left: Option<Duration>,
    /// The journal's tip, if the session has a journal.
    pub tip: Option<Tip>,
    /// The session's smoothed load as its host last published it (see
    /// [placement by load](crate::host#load)); `None` unless the host lists it among its
    /// hottest sessions (16 by default, none idle: see
    /// [`LoadBalance::published_sessions`](crate::LoadBalance::published_sessions)), and for a
    /// holder that is not a session host.
    pub load: Option<f64>,
}

/// A journal's bounds and owner, read at one revision.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct JournalInfo {
    /// The session.
    pub session: Uuid,
    /// The revision it was read at.
    pub revision: i64,
    /// The first sequence number kept (1 unless trimmed).
    pub base: u64,
    /// The tip; `None` if the session has no journal.
    pub tip: Option<Tip>,
    /// The session's owner, if any (its `ttl_left`, `tip` and `load` are not filled in).
    pub owner: Option<Owner>,
}

impl JournalInfo {
    /// How many records the journal keeps, `u64::MAX` at most.
    pub fn len(&self) -> u64 {
        self.tip
            .filter(|tip| tip.seq >= self.base)
            .map_or(0, |tip| (tip.seq - self.base).saturating_add(1))
    }

    /// Whether the journal holds no record (or does not exist).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Revoking a session's ownership failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RevokeError {
    /// Nobody owns the session. Permanent until someone does.
    #[error("session {session} is not owned")]
    NotOwned {
        /// The session.
        session: Uuid,
    },
    /// The session is owned at another epoch than the one to revoke: it changed hands. Nothing
    /// was deleted. Permanent.
    #[error("session {session} is owned at epoch {owner}, not {expected}")]
    EpochChanged {
        /// The session.
        session: Uuid,
        /// The epoch to revoke.
        expected: Epoch,
        /// The owner's epoch now.
        owner: Epoch,
    },
    /// etcd failed; the owner key may or may not have been deleted. Repeating is safe.
    /// Transient or permanent as its class says.
    #[error("revoke failed")]
    Etcd(#[source] EtcdError),
}

/// An operator's view of one namespace; see the [module docs](self).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// use leasehold::Admin;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let admin = Admin::connect(["http://127.0.0.1:2379"], "billing").await?;
/// let owners = admin.owners().await?;
/// for owner in &owners {
///     println!("{}: {:?} at epoch {}", owner.session, owner.node, owner.epoch);
/// }
/// if let Some(owner) = owners.first() {
///     // One graceful handover to the host named worker-2, waited for at most 30 s.
///     let wait = Duration::from_secs(30);
///     let moved = admin.move_session_to_node(owner.session, "worker-2", wait).await?;
///     println!("{} now on store {} at epoch {}", moved.session, moved.to, moved.epoch);
/// }
/// // The host named worker-3 hands all of its sessions over to the others.
/// admin.drain_node("worker-3").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Admin {
    connection: Connection,
    namespace: Namespace,
    policy: WritePolicy,
    stop: CancellationToken,
}

impl Admin {
    /// An admin of `namespace` over `connection`.
    pub fn new(connection: Connection, namespace: Namespace) -> Self {
        Self {
            connection,
            namespace,
            policy: WritePolicy::default(),
            stop: CancellationToken::new(),
        }
    }

    /// Counts what the namespace holds, at one revision.
    pub async fn namespace_status(&self) -> Result<NamespaceStatus, EtcdError> {
        let namespace = &self.namespace;
        let count = |prefix: String, revision: i64| {
            let options = GetOptions::new()
                .with_range(prefix_end(&prefix))
                .with_count_only()
                .with_revision(revision);
            self.connection
                .read("count", move |mut client: KvClient, _| {
                    let (prefix, options) = (prefix.clone(), options.clone());
                    async move {
                        let response = client.get(prefix, Some(options)).await?;
                        let revision = response.header().map_or(0, |h| h.revision());
                        Ok((response.count().max(0) as u64, revision))
                    }
                })
        };
        // The first count fixes the revision; the others read at that same revision.
        let (keys, revision) = count(namespace.prefix(), 0).await?;
        let (owned_sessions, _) = count(namespace.owners_prefix(), revision).await?;
        let (owned_workspaces, _) = count(namespace.workspaces_prefix(), revision).await?;
        Ok(NamespaceStatus {
            namespace: namespace.clone(),
            revision: revision.max(0) as u64,
            owned_sessions,
            owned_workspaces,
            keys,
        })
    }

    /// An [`OwnerDirectory`] of the namespace over the same connection: every owner known
    /// locally, kept current by one watch (see [`crate::directory`]).
    pub async fn directory(&self) -> Result<OwnerDirectory, EtcdError> {
        OwnerDirectory::start(self.connection.clone(), self.namespace.clone()).await
    }

    /// The namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// How long a write is re-sent while its outcome is unknown: the connection's retry
    /// deadline.
    fn authority(&self) -> Authority<'static> {
        Authority::admin(self.connection.retry_policy().deadline)
    }

    /// Sends an idempotent `txn` through the one write path, with no resolving read: an
    /// outcome left unknown is an error (repeating the request is safe).
    async fn send_idempotent(
        &self,
        operation: &'static str,
        txn: &Txn,
    ) -> Result<write::Reply, EtcdError> {
        let authority = self.authority();
        let written = write::send(
            &self.connection,
            &self.policy,
            operation,
            txn,
            None,
            || authority.go_on(),
            &self.stop,
        )
        .await;
        match written {
            Written::Replied(reply) => Ok(reply),
            Written::Unknown(error)
            | Written::Failed(error)
            | Written::Refused { error, .. }
            | Written::Resolved { unknown: error, .. } => Err(error),
        }
    }

    fn owner_of(&self, kv: &etcd_client::KeyValue) -> Option<Owner> {
        let session = id_under(&self.namespace.owners_prefix(), kv.key())?;
        let value = OwnerValue::decode(kv.value());
        Some(Owner {
            session,
            epoch: Epoch::from_revision(kv.create_revision()),
            node: value.as_ref().map(|v| v.node.clone()),
            store: value.as_ref().map(|v| v.store),
            advertise: value.as_ref().and_then(|v| v.advertise.clone()),
            metadata: value
                .as_ref()
                .map(|v| v.metadata.clone())
                .unwrap_or_default(),
            acquired_at: value.as_ref().and_then(OwnerValue::acquired_at),
            lease_id: kv.lease(),
            ttl_left: None,
            tip: None,
            load: None,
        })
    }

    /// Every owned session, by session id, read at one revision; with each holder's node lease
    /// TTL left, each journal's tip and each session's load as its host published it, at that
    /// revision. Keys under the owners prefix that are not a session's are skipped.
    pub async fn owners(&self) -> Result<Vec<Owner>, EtcdError> {
        let (kvs, revision) = self
            .connection
            .range_at_one_revision("list owners", &self.namespace.owners_prefix())
            .await?;
        let loads = self.loads_at(revision).await?;
        let mut owners: Vec<Owner> = kvs.iter().filter_map(|kv| self.owner_of(kv)).collect();
        for owner in &mut owners {
            owner.load = owner
                .store
                .and_then(|store| loads.get(&store)?.of(owner.session));
        }
        owners.sort_by_key(|owner| owner.session);
        // The tips, many sessions per read.
        let tips: Vec<Option<Tip>> = futures_util::stream::iter(
            owners
                .chunks(TIPS_PER_READ)
                .map(|owners| self.tips(owners.iter().map(|owner| owner.session), revision)),
        )
        .buffered(CONCURRENT_READS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
        let mut leases: Vec<i64> = owners.iter().map(|owner| owner.lease_id).collect();
        leases.sort_unstable();
        leases.dedup();
        let ttls: HashMap<i64, Option<Duration>> = futures_util::stream::iter(
            leases
                .into_iter()
                .map(|id| async move { self.ttl_left(id).await.map(|ttl| (id, ttl)) }),
        )
        .buffered(CONCURRENT_READS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
        for (owner, tip) in owners.iter_mut().zip(tips) {
            owner.tip = tip;
            owner.ttl_left = ttls.get(&owner.lease_id).copied().flatten();
        }
        Ok(owners)
    }

    /// `session`'s owner, if any (with its TTL left, tip and load).
    pub async fn owner(&self, session: Uuid) -> Result<Option<Owner>, EtcdError> {
        let key = self.namespace.owner_key(session);
        let response = self
            .connection
            .read("owner", |mut client: KvClient, _| {
                let key = key.clone();
                async move { client.get(key, None).await }
            })
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let Some(mut owner) = response.kvs().first().and_then(|kv| self.owner_of(kv)) else {
            return Ok(None);
        };
        owner.tip = self.tip(session, revision).await?;
        owner.ttl_left = self.ttl_left(owner.lease_id).await?;
        if let Some(store) = owner.store {
            let load = self
                .key_at("load", self.namespace.load_key(store), revision)
                .await?;
            owner.load = load.and_then(|kv| LoadValue::decode(kv.value())?.of(session));
        }
        Ok(Some(owner))
    }

    /// The tips of `sessions` at `revision`, in one transaction; an undecodable tip reads as
    /// none.
    async fn tips(
        &self,
        sessions: impl Iterator<Item = Uuid>,
        revision: i64,
    ) -> Result<Vec<Option<Tip>>, EtcdError> {
        let options = (revision > 0).then(|| GetOptions::new().with_revision(revision));
        let gets: Vec<TxnOp> = sessions
            .map(|session| TxnOp::get(self.namespace.tip_key(session), options.clone()))
            .collect();
        let count = gets.len();
        let response = self
            .connection
            .read("tips", |mut client: KvClient, _| {
                let txn = Txn::new().and_then(gets.clone());
                async move { client.txn(txn).await }
            })
            .await?;
        let tips: Vec<Option<Tip>> = crate::etcd::gets(&response)
            .map(|kv| kv.and_then(|kv| crate::journal::decode_tip(kv.key(), kv.value()).ok()))
            .collect();
        if tips.len() != count {
            return Err(EtcdError::unreadable(
                "tips",
                format!("{} answers to {count} reads in one transaction", tips.len()),
            ));
        }
        Ok(tips)
    }

    /// The tip at `revision`; an undecodable tip reads as none.
    async fn tip(&self, session: Uuid, revision: i64) -> Result<Option<Tip>, EtcdError> {
        let tip = self
            .key_at("tip", self.namespace.tip_key(session), revision)
            .await?;
        Ok(tip.and_then(|kv| crate::journal::decode_tip(kv.key(), kv.value()).ok()))
    }

    /// `key` at `revision` (the latest when it is 0), if it exists.
    async fn key_at(
        &self,
        operation: &'static str,
        key: String,
        revision: i64,
    ) -> Result<Option<etcd_client::KeyValue>, EtcdError> {
        let response = self
            .connection
            .read(operation, |mut client: KvClient, _| {
                let key = key.clone();
                let options = (revision > 0).then(|| GetOptions::new().with_revision(revision));
                async move { client.get(key, options).await }
            })
            .await?;
        Ok(response.kvs().first().cloned())
    }

    /// A lease's TTL left; `None` if etcd no longer knows the lease.
    async fn ttl_left(&self, lease_id: i64) -> Result<Option<Duration>, EtcdError> {
        if lease_id == 0 {
            return Ok(None);
        }
        let response = self
            .connection
            .read("lease ttl", |mut client: Client, _| async move {
                client.lease_time_to_live(lease_id, None).await
            })
            .await;
        match response {
            Ok(response) if response.ttl() >= 0 => {
                Ok(Some(Duration::from_secs(response.ttl() as u64)))
            }
            Ok(_) => Ok(None),
            // etcd 3.4 answers an unknown lease with an error.
            Err(error) if error.is_lease_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The sessions that have a journal (a tip), in order: one keys-only read per journal,
    /// skipping over each journal's records.
    pub async fn journals(&self) -> Result<Vec<Uuid>, EtcdError> {
        let prefix = self.namespace.journals_prefix();
        let range_end = prefix_end(&prefix);
        let mut from = prefix.clone().into_bytes();
        let mut sessions = Vec::new();
        loop {
            let response = self
                .connection
                .read("list journals", |mut client: KvClient, _| {
                    let options = GetOptions::new()
                        .with_range(range_end.clone())
                        .with_keys_only()
                        .with_limit(1);
                    let from = from.clone();
                    async move { client.get(from, Some(options)).await }
                })
                .await?;
            let Some(kv) = response.kvs().first() else {
                return Ok(sessions);
            };
            let key = String::from_utf8_lossy(kv.key());
            let rest = key.strip_prefix(&prefix).unwrap_or_default();
            let id = rest.split('/').next().unwrap_or_default();
            if let Ok(session) = id.parse() {
                sessions.push(session);
            }
            // On to the next journal: past every key under `{ns}/journals/{id}/` (or past this
            // stray key).
            from = match rest.contains('/') {
                true => prefix_end(&format!("{prefix}{id}/")),
                false => [kv.key(), &[0]].concat(),
            };
        }
    }

    /// `session`'s journal bounds and owner, at one revision.
    pub async fn journal(&self, session: Uuid) -> Result<JournalInfo, RetentionError> {
        let keys = [
            self.namespace.base_key(session),
            self.namespace.tip_key(session),
            self.namespace.owner_key(session),
        ];
        let first = crate::journal::first_record(&self.namespace.records_prefix(session));
        let response = self
            .connection
            .read("journal", |mut client: KvClient, _| {
                let mut ops = keys.clone().map(|key| TxnOp::get(key, None)).to_vec();
                ops.push(first.clone());
                let txn = Txn::new().and_then(ops);
                async move { client.txn(txn).await }
            })
            .await
            .map_err(RetentionError::Etcd)?;
        let mut gets = crate::etcd::gets(&response);
        let (base, tip, owner, first) = (
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
        );
        Ok(JournalInfo {
            session,
            revision: response.header().map_or(0, |h| h.revision()),
            base: crate::journal::base_of(base.as_ref(), first.as_ref())
                .map_err(RetentionError::Decode)?,
            tip: match tip {
                Some(kv) => Some(
                    crate::journal::decode_tip(kv.key(), kv.value())
                        .map_err(RetentionError::Decode)?,
                ),
                None => None,
            },
            owner: owner.and_then(|kv| self.owner_of(&kv)),
        })
    }

    /// `session`'s records (fences included) at one snapshot revision, from its base; see
    /// [`Replay::from_seq`] to start later.
    pub fn records(&self, session: Uuid) -> Replay {
        Replay::new(
            self.connection.clone(),
            self.namespace.records_prefix(session),
            self.namespace.base_key(session),
            ReplayOptions::default(),
        )
    }

    /// `session`'s records as they commit after `revision` (e.g. a replay's
    /// [`revision`](Replay::revision)), from sequence number `from_seq` on; until the stream is
    /// dropped, or after the record at `u64::MAX` (none can follow it). Trims are not shown.
    /// The watch resumes where it stopped after a failure; if etcd compacted that revision
    /// meanwhile, the stream ends with [`ReplayError::Compacted`].
    pub fn follow(&self, session: Uuid, revision: i64, from_seq: u64) -> Follow {
        let prefix = self.namespace.records_prefix(session);
        Follow::start(self.connection.clone(), prefix, revision, from_seq)
    }

    /// Deletes `session`'s owner key if it is at `epoch` (if given; else whatever owner it
    /// has), and returns the owner revoked. The holder's `lost()` resolves with
    /// [`Revoked`](crate::LossReason::Revoked) as soon as its watch sees the delete; its
    /// journal is fenced by the next owner's fence, whatever the holder still believes.
    pub async fn revoke(&self, session: Uuid, epoch: Option<Epoch>) -> Result<Owner, RevokeError> {
        let owner = self
            .owner(session)
            .await
            .map_err(RevokeError::Etcd)?
            .ok_or(RevokeError::NotOwned { session })?;
        if let Some(expected) = epoch
            && owner.epoch != expected
        {
            return Err(RevokeError::EpochChanged {
                session,
                expected,
                owner: owner.epoch,
            });
        }
        let key = self.namespace.owner_key(session);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                owner.epoch.revision(),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let authority = self.authority();
        let written = write::send(
            &self.connection,
            &self.policy,
            "revoke",
            &txn,
            None,
            || authority.go_on(),
            &self.stop,
        )
        .await;
        match written {
            Written::Replied(response) if response.succeeded() => return Ok(owner),
            Written::Unknown(error) | Written::Failed(error) | Written::Refused { error, .. } => {
                return Err(RevokeError::Etcd(error));
            }
            // Changed meanwhile, or an earlier send applied: read what is there now.
            Written::Replied(_) | Written::Resolved { .. } => {}
        }
        match self.owner(session).await.map_err(RevokeError::Etcd)? {
            // The compare failed, so the key at that epoch is gone: this is another owner's.
            Some(now) => Err(RevokeError::EpochChanged {
                session,
                expected: owner.epoch,
                owner: now.epoch,
            }),
            None => Ok(owner),
        }
    }

    /// Trims `session`'s journal to keep `before` and every record after it, as an operator:
    /// without the owner compare (see the [module docs](self)); in batches of
    /// [`TRIM_BATCH`] records. Works under etcd's NOSPACE alarm too, with deletes only (see
    /// [`Journal::trim`](crate::Journal::trim)).
    pub async fn trim(&self, session: Uuid, before: u64) -> Result<Trimmed, RetentionError> {
        self.retention(session).trim(before, TRIM_BATCH).await
    }

    /// Deletes `session`'s whole journal; refused with [`RetentionError::Owned`] while anyone
    /// owns the session.
    pub async fn delete_journal(&self, session: Uuid) -> Result<Deleted, RetentionError> {
        self.retention(session).delete().await
    }

    fn retention(&self, session: Uuid) -> Retention<'_> {
        Retention {
            connection: &self.connection,
            namespace: &self.namespace,
            policy: &self.policy,
            stop: &self.stop,
            session,
            authority: self.authority(),
        }
    }

    /// Checks `session`'s journal against the journal invariants (see [`JournalCheck`]).
    /// Fails only when etcd does; what is wrong with the journal is in
    /// [`violations`](JournalCheck::violations).
    pub async fn check(&self, session: Uuid) -> Result<JournalCheck, ReplayError> {
        crate::journal::check(&self.connection, &self.namespace, session, |_| {}).await
    }

    /// Checks every journal of the namespace, as [`check`](Self::check) does each, at one
    /// revision: one pass over the namespace's journal keys in pages of `options` (requests
    /// grow with the bytes read, not with the number of journals). `progress` is told how many
    /// journals are checked so far, after each page. In session order.
    pub async fn check_all(
        &self,
        options: &ReplayOptions,
        progress: impl FnMut(usize),
    ) -> Result<Vec<JournalCheck>, ReplayError> {
        crate::journal::check_all(&self.connection, &self.namespace, options, progress).await
    }
}

#[cfg(test)]
mod tests;
