//! [`Admin::hosts`]: the live session hosts; [`Admin::host_named`]: the one a node name
//! names.

use std::collections::HashMap;
use std::time::SystemTime;

use uuid::Uuid;

use super::Admin;
use crate::etcd::EtcdError;
use crate::keys::id_under;
use crate::store::{HostValue, LoadValue, OwnerValue};

/// A live session host, as its host key (`{ns}/hosts/{store}`, attached to its node lease)
/// shows it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Host {
    /// The host's store instance (one per process): the owner values of the sessions it
    /// holds name it.
    pub store: Uuid,
    /// The host's node name.
    pub node: String,
    /// The address the host advertises; `None` if it advertises none.
    pub advertise: Option<String>,
    /// The host's metadata (empty if none).
    pub metadata: Vec<u8>,
    /// The most sessions it may hold (`HostOptions::max_sessions`), if capped; 0 while it
    /// drains.
    pub max_sessions: Option<usize>,
    /// Whether it is draining ([`SessionHost::drain`](crate::SessionHost::drain)): it takes
    /// no sessions, and the others' shares leave it out.
    pub draining: bool,
    /// Its weight in the balance (`HostOptions::weight`; 1 for hosts of releases before
    /// weights).
    pub weight: u32,
    /// How many sessions its store holds, at the same revision.
    pub sessions: usize,
    /// The load it last published (see the [load docs](crate::host#load)): the sum of its
    /// sessions' smoothed loads; `None` for a host that published none (yet, or of a release
    /// before load).
    pub load: Option<f64>,
    /// When the host started, by its own clock (`None` for hosts of releases that did not
    /// write it).
    pub started_at: Option<SystemTime>,
    /// The etcd lease its key is attached to (its store's node lease).
    pub lease_id: i64,
}

/// Finding the live session host a node name names failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostLookupError {
    /// No live session host has that node name. Permanent until a host of that name
    /// registers.
    #[error("no live session host named {node:?}")]
    NoSuchHost {
        /// The node name asked for.
        node: String,
    },
    /// Several live session hosts have that node name (node names are not unique: two
    /// processes of one node, or a host that died and whose node lease has not expired yet).
    /// Name one by its store id. Permanent until all but one have left.
    #[error("{} live session hosts are named {node:?} (stores {})", .stores.len(), listed(.stores))]
    Ambiguous {
        /// The node name asked for.
        node: String,
        /// The store ids of the hosts with that name, in order.
        stores: Vec<Uuid>,
    },
    /// etcd failed; nothing was written. Asking again is safe. Transient or permanent as its
    /// class says.
    #[error("listing the session hosts failed")]
    Etcd(#[source] EtcdError),
}

/// The store ids as `a, b, c`.
pub(super) fn listed(stores: &[Uuid]) -> String {
    stores
        .iter()
        .map(Uuid::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Admin {
    /// The hosts' load keys at `revision`, by store.
    pub(super) async fn loads_at(
        &self,
        revision: i64,
    ) -> Result<HashMap<Uuid, LoadValue>, EtcdError> {
        let prefix = self.namespace.loads_prefix();
        let (loads, _) = self
            .connection
            .range_at("list loads", &prefix, revision)
            .await?;
        Ok(LoadValue::by_store(&prefix, &loads))
    }

    /// Every live session host, by store id, how many sessions each holds and the load it
    /// published: the host, owner and load keys read at one revision. A host's key goes with its node lease, so a
    /// host that died is listed until etcd expires that lease.
    pub async fn hosts(&self) -> Result<Vec<Host>, EtcdError> {
        let prefix = self.namespace.hosts_prefix();
        let (kvs, revision) = self
            .connection
            .range_at_one_revision("list hosts", &prefix)
            .await?;
        let (owners, _) = self
            .connection
            .range_at("list owners", &self.namespace.owners_prefix(), revision)
            .await?;
        let loads = self.loads_at(revision).await?;
        let mut held: HashMap<Uuid, usize> = HashMap::new();
        for owner in owners
            .iter()
            .filter_map(|kv| OwnerValue::decode(kv.value()))
        {
            *held.entry(owner.store).or_default() += 1;
        }
        let mut hosts: Vec<Host> = kvs
            .iter()
            .filter_map(|kv| {
                let store = id_under(&prefix, kv.key())?;
                let value = HostValue::decode(kv.value());
                Some(Host {
                    store,
                    sessions: held.get(&store).copied().unwrap_or(0),
                    load: loads.get(&store).map(|value| value.load),
                    started_at: value.started_at(),
                    node: value.node,
                    advertise: value.advertise,
                    metadata: value.metadata,
                    draining: value.max == Some(0),
                    weight: value.weight,
                    max_sessions: value.max,
                    lease_id: kv.lease(),
                })
            })
            .collect();
        hosts.sort_by_key(|host| host.store);
        Ok(hosts)
    }

    /// The one live session host whose node name is `node` (as
    /// [`StoreOptions::with_node`](crate::StoreOptions::with_node) set it; compared exactly),
    /// read from [`hosts`](Self::hosts): [`NoSuchHost`](HostLookupError::NoSuchHost) if none
    /// is, [`Ambiguous`](HostLookupError::Ambiguous) with every store id if several are. A host
    /// that died is found until etcd expires its node lease, as in [`hosts`](Self::hosts).
    pub async fn host_named(&self, node: &str) -> Result<Host, HostLookupError> {
        let mut named: Vec<Host> = self
            .hosts()
            .await
            .map_err(HostLookupError::Etcd)?
            .into_iter()
            .filter(|host| host.node == node)
            .collect();
        match named.len() {
            1 => Ok(named.remove(0)),
            0 => Err(HostLookupError::NoSuchHost {
                node: node.to_owned(),
            }),
            _ => Err(HostLookupError::Ambiguous {
                node: node.to_owned(),
                stores: named.iter().map(|host| host.store).collect(),
            }),
        }
    }
}
