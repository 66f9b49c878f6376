//! The shared session registry: [`Admin::create_session`], [`Admin::finish_session`] and
//! [`Admin::sessions`].
//!
//! A registered session is a key `{ns}/sessions/{session}` holding its metadata (at most
//! [`MAX_SESSION_METADATA`] bytes, opaque to leasehold), not attached to any lease: it lives
//! until the session is finished. Hosts started with
//! [`HostOptions::with_registry`](crate::HostOptions::with_registry) follow the registry (a
//! snapshot, then a watch): a session created anywhere is hosted by every such host within one
//! watch event, so they agree on the set by construction, and owned by one of them after one
//! acquisition. Finishing deletes the key (the hosts stop hosting the session: its owner
//! releases it in order), waits for the owner key to go, then deletes the journal as
//! [`Admin::delete_journal`] does.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;
use uuid::Uuid;

use super::Admin;
use crate::etcd::EtcdError;
use crate::journal::{Deleted, RetentionError};
use crate::keys::id_under;

/// The most bytes of metadata a registered session may carry.
pub const MAX_SESSION_METADATA: usize = 4096;

/// A session of the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegisteredSession {
    /// The session.
    pub session: Uuid,
    /// Its metadata, as created.
    pub metadata: Vec<u8>,
    /// The revision at which it was created (its key's create revision).
    pub created_revision: i64,
}

/// What [`Admin::finish_session`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finished {
    /// Whether the session was in the registry (finishing one that is not still deletes its
    /// journal once nobody owns it); true also when a send whose outcome was unknown may have
    /// deleted it.
    pub was_registered: bool,
    /// The journal's delete.
    pub journal: Deleted,
}

/// A registry request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The metadata is over [`MAX_SESSION_METADATA`]. Nothing was written.
    #[error("session metadata of {len} bytes is over the limit of {MAX_SESSION_METADATA}")]
    MetadataTooLarge {
        /// The metadata's length.
        len: usize,
    },
    /// The session is no longer registered, but it was still owned when the wait ran out (a
    /// host with a fixed set that holds it, or one that has not yet seen the delete): its
    /// journal is kept. Finishing it again later deletes the journal.
    #[error("session {session} is still owned (by {node}) after {waited:?}: its journal is kept")]
    StillOwned {
        /// The session.
        session: Uuid,
        /// Its holder's node name.
        node: String,
        /// How long it was waited for.
        waited: Duration,
    },
    /// etcd failed; the request may or may not have been written. Repeating it is safe.
    #[error("the registry request failed")]
    Etcd(#[source] EtcdError),
    /// Deleting the journal failed (see [`Admin::delete_journal`]).
    #[error("deleting the finished session's journal failed")]
    Journal(#[source] RetentionError),
}

fn registered(prefix: &str, kv: &KeyValue) -> Option<RegisteredSession> {
    Some(RegisteredSession {
        session: id_under(prefix, kv.key())?,
        metadata: kv.value().to_vec(),
        created_revision: kv.create_revision(),
    })
}

impl Admin {
    /// Registers `session` with `metadata`: hosts that follow the registry host it from their
    /// next watch event. Idempotent: a session already registered is left as it is (its
    /// metadata too) and returned, with `false`.
    pub async fn create_session(
        &self,
        session: Uuid,
        metadata: &[u8],
    ) -> Result<(RegisteredSession, bool), RegistryError> {
        if metadata.len() > MAX_SESSION_METADATA {
            return Err(RegistryError::MetadataTooLarge {
                len: metadata.len(),
            });
        }
        let key = self.namespace.session_key(session);
        let txn = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), metadata, None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let response = self
            .send_idempotent("create session", &txn)
            .await
            .map_err(RegistryError::Etcd)?;
        if response.succeeded() {
            let revision = response.header().map_or(0, |header| header.revision());
            let created = RegisteredSession {
                session,
                metadata: metadata.to_vec(),
                created_revision: revision,
            };
            return Ok((created, true));
        }
        let prefix = self.namespace.sessions_prefix();
        let existing = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().and_then(|kv| registered(&prefix, kv)),
            _ => None,
        });
        // Deleted between the compare and the read cannot happen: they are one transaction.
        let existing = existing.expect("the existing key read in the same transaction");
        // A first send of this call that applied unseen created it.
        let created = response.after_unknown() && existing.metadata == metadata;
        Ok((existing, created))
    }

    /// Every registered session, read at one revision (in pages), sorted by id.
    pub async fn sessions(&self) -> Result<Vec<RegisteredSession>, EtcdError> {
        let prefix = self.namespace.sessions_prefix();
        let (kvs, _) = self
            .connection
            .range_at_one_revision("list sessions", &prefix)
            .await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| registered(&prefix, kv))
            .collect())
    }

    /// Finishes `session`: removes it from the registry (hosts that follow it stop hosting it:
    /// its owner releases it in order), waits up to `wait` for its owner key to go, then
    /// deletes its journal. Refused with [`RegistryError::StillOwned`] (the journal kept) if it
    /// is still owned after `wait`. Idempotent.
    pub async fn finish_session(
        &self,
        session: Uuid,
        wait: Duration,
    ) -> Result<Finished, RegistryError> {
        let key = self.namespace.session_key(session);
        let txn = Txn::new().and_then([TxnOp::delete(key.as_str(), None)]);
        let response = self
            .send_idempotent("finish session", &txn)
            .await
            .map_err(RegistryError::Etcd)?;
        // A first send that applied unseen deleted it.
        let was_registered = response.after_unknown()
            || response.op_responses().into_iter().any(|op| match op {
                TxnOpResponse::Delete(delete) => delete.deleted() > 0,
                _ => false,
            });
        let started = Instant::now();
        let until = started.checked_add(wait);
        loop {
            let owner = self.owner(session).await.map_err(RegistryError::Etcd)?;
            let Some(owner) = owner else { break };
            if until.is_some_and(|until| Instant::now() >= until) {
                return Err(RegistryError::StillOwned {
                    session,
                    node: owner.node.unwrap_or_default(),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let journal = self
            .delete_journal(session)
            .await
            .map_err(RegistryError::Journal)?;
        Ok(Finished {
            was_registered,
            journal,
        })
    }
}
