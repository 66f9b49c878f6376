//! The directory's map and how etcd's events and snapshots change it: pure, no I/O.
//!
//! The owner entries are exactly etcd's owner keys at [`State::revision`]: every event up to
//! it has been applied, and none after it. Host keys only mark entries: a store whose host key
//! went while some entry still names it is *gone*, and its entries read `host_alive = false`
//! until etcd deletes them too.

use std::collections::HashMap;
use std::sync::Arc;

use uuid::Uuid;

use super::{Change, Node, Owner};
use crate::lease::Epoch;
use crate::store::{HostValue, OwnerValue};

/// The directory's maps, keyed by UUIDs, with a fast hasher seeded per process.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One owner key as the directory keeps it: 32 bytes beside its session, the node shared with
/// every other entry of the same store.
#[derive(Clone, Debug)]
struct Entry {
    epoch: Epoch,
    lease_id: i64,
    revision: i64,
    node: Arc<Node>,
}

/// An owner key as etcd gives it, in a snapshot or an event.
#[derive(Clone, Debug)]
pub(super) struct OwnerKey {
    pub(super) session: Uuid,
    /// The key's create revision.
    pub(super) epoch: Epoch,
    /// The key's mod revision.
    pub(super) revision: i64,
    pub(super) lease_id: i64,
    /// `None` for a value leasehold did not write.
    pub(super) value: Option<OwnerValue>,
}

/// A host key as etcd gives it.
#[derive(Clone, Debug)]
pub(super) struct HostKey {
    pub(super) store: Uuid,
    pub(super) revision: i64,
    pub(super) value: HostValue,
}

/// A store's node as its entries share it, and how many entries name it.
#[derive(Debug)]
struct Named {
    node: Arc<Node>,
    entries: usize,
    /// Its host key went while entries still named it.
    gone: bool,
}

#[derive(Debug, Default)]
pub(super) struct State {
    owners: Map<Uuid, Entry>,
    /// The stores that entries name.
    named: Map<Uuid, Named>,
    /// The live hosts, by their host keys.
    hosts: Map<Uuid, Arc<Node>>,
    /// The revision the owner entries are etcd's at.
    pub(super) revision: i64,
    /// The revision the host keys are etcd's at.
    pub(super) hosts_revision: i64,
}

impl State {
    /// How many sessions have an owner.
    pub(super) fn len(&self) -> usize {
        self.owners.len()
    }

    pub(super) fn owner_of(&self, session: Uuid) -> Option<Owner> {
        self.owners
            .get(&session)
            .map(|entry| self.owner(session, entry))
    }

    /// Every owner, by session id.
    pub(super) fn owners(&self) -> Vec<Owner> {
        let mut owners: Vec<Owner> = self
            .owners
            .iter()
            .map(|(session, entry)| self.owner(*session, entry))
            .collect();
        owners.sort_by_key(|owner| owner.session);
        owners
    }

    /// Every live host, by store id, with how many sessions it holds.
    pub(super) fn hosts(&self) -> Vec<(Arc<Node>, usize)> {
        let mut hosts: Vec<(Arc<Node>, usize)> = self
            .hosts
            .iter()
            .map(|(store, node)| {
                let held = self.named.get(store).map_or(0, |named| named.entries);
                (node.clone(), held)
            })
            .collect();
        hosts.sort_by_key(|(node, _)| node.store);
        hosts
    }

    fn owner(&self, session: Uuid, entry: &Entry) -> Owner {
        let gone = self
            .named
            .get(&entry.node.store)
            .is_some_and(|named| named.gone);
        Owner {
            session,
            epoch: entry.epoch,
            lease_id: entry.lease_id,
            revision: entry.revision,
            host_alive: !gone,
            node: entry.node.clone(),
        }
    }

    /// The shared node for an owner value, counted as named once more.
    fn name(&mut self, value: Option<OwnerValue>) -> Arc<Node> {
        let node = match value {
            Some(value) => Node {
                store: value.store,
                name: value.node,
                advertise: value.advertise,
                metadata: value.metadata,
            },
            None => Node::default(),
        };
        // A store named anew counts as alive: one that never had a host key (a bare `Store`)
        // is, and a host that left names no new sessions.
        let named = self.named.entry(node.store).or_insert_with(|| Named {
            node: Arc::new(node.clone()),
            entries: 0,
            gone: false,
        });
        named.entries += 1;
        if *named.node != node {
            named.node = Arc::new(node);
        }
        named.node.clone()
    }

    /// One entry naming `store` fewer.
    fn unname(&mut self, store: Uuid) {
        if let Some(named) = self.named.get_mut(&store) {
            named.entries -= 1;
            if named.entries == 0 {
                self.named.remove(&store);
            }
        }
    }

    /// An owner key was put.
    pub(super) fn put_owner(&mut self, key: OwnerKey) -> Option<Change> {
        self.revision = self.revision.max(key.revision);
        let node = self.name(key.value);
        let entry = Entry {
            epoch: key.epoch,
            lease_id: key.lease_id,
            revision: key.revision,
            node,
        };
        let to = self.owner(key.session, &entry);
        let before = self.owners.insert(key.session, entry);
        let before = before.map(|before| {
            let from = self.owner(key.session, &before);
            self.unname(before.node.store);
            (before.epoch, from)
        });
        match before {
            None => Some(Change::Acquired { owner: to }),
            Some((epoch, _)) if epoch == key.epoch => None,
            Some((_, from)) => Some(Change::Moved { from, to }),
        }
    }

    /// An owner key was deleted at `revision`.
    pub(super) fn delete_owner(&mut self, session: Uuid, revision: i64) -> Option<Change> {
        self.revision = self.revision.max(revision);
        let entry = self.owners.remove(&session)?;
        let owner = self.owner(session, &entry);
        self.unname(entry.node.store);
        Some(Change::Released { owner, revision })
    }

    /// A host key was put.
    pub(super) fn put_host(&mut self, key: HostKey) -> Option<Change> {
        self.hosts_revision = self.hosts_revision.max(key.revision);
        let node = Arc::new(Node {
            store: key.store,
            name: key.value.node,
            advertise: key.value.advertise,
            metadata: key.value.metadata,
        });
        if let Some(named) = self.named.get_mut(&key.store) {
            named.gone = false;
        }
        let before = self.hosts.insert(key.store, node.clone());
        before.is_none().then_some(Change::HostJoined {
            node,
            revision: key.revision,
        })
    }

    /// A host key was deleted at `revision`: its store's entries are marked at once.
    pub(super) fn delete_host(&mut self, store: Uuid, revision: i64) -> Option<Change> {
        self.hosts_revision = self.hosts_revision.max(revision);
        let node = self.hosts.remove(&store)?;
        let sessions = match self.named.get_mut(&store) {
            Some(named) => {
                named.gone = true;
                named.entries
            }
            None => 0,
        };
        Some(Change::HostGone {
            node,
            sessions,
            revision,
        })
    }

    /// Replaces the whole state by a snapshot at `revision` (the owner and host keys read at
    /// it), with the changes from the state before: what a watch that missed events (after a
    /// compaction) would have shown, one change per session and host that differs.
    pub(super) fn reset(
        &mut self,
        revision: i64,
        owners: Vec<OwnerKey>,
        hosts: Vec<HostKey>,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        // Hosts first, so that the owner changes tell which of their hosts are gone.
        let live: Map<Uuid, HostKey> = hosts.into_iter().map(|key| (key.store, key)).collect();
        let went: Vec<Uuid> = self
            .hosts
            .keys()
            .filter(|store| !live.contains_key(store))
            .copied()
            .collect();
        changes.extend(
            went.into_iter()
                .filter_map(|s| self.delete_host(s, revision)),
        );
        changes.extend(live.into_values().filter_map(|key| self.put_host(key)));
        let owned: Map<Uuid, OwnerKey> = owners.into_iter().map(|key| (key.session, key)).collect();
        let released: Vec<Uuid> = self
            .owners
            .keys()
            .filter(|session| !owned.contains_key(session))
            .copied()
            .collect();
        changes.extend(
            released
                .into_iter()
                .filter_map(|session| self.delete_owner(session, revision)),
        );
        changes.extend(owned.into_values().filter_map(|key| self.put_owner(key)));
        self.revision = revision;
        self.hosts_revision = revision;
        changes
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
