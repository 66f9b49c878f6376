//! `Owner` and `WatchOwners`: the sidecar's [`OwnerDirectory`], for clients in any language.
//!
//! The directory is started at the first call that needs it (one snapshot and one watch for
//! the whole sidecar, shared by every call), and lives as long as the sidecar. A `WatchOwners`
//! stream buffers at most 256 changes for its client, then the directory's own 4,096; past
//! them it is told how many it `missed`.

use etcd_client::KvClient;
use tokio::sync::mpsc;
use tonic::{Response, Status};
use uuid::Uuid;

use super::proto::{
    HostChange, HostInfo, OwnerChange, OwnerInfo, OwnerMoved, OwnerReleased, OwnerRequest,
    OwnerResponse, WatchOwnersRequest, owner_change,
};
use super::refusal::Refusal;
use super::{BoxStream, Sidecar, hold, parse_session};
use crate::directory::{Change, Node, Owner, OwnerDirectory};
use crate::lease::Epoch;
use crate::store::OwnerValue;

impl Sidecar {
    /// The sidecar's directory, started on first use.
    async fn directory(&self) -> Result<&OwnerDirectory, Status> {
        let store = &self.inner.store;
        self.inner
            .directory
            .get_or_try_init(|| {
                OwnerDirectory::start(store.connection().clone(), store.namespace().clone())
            })
            .await
            .map_err(|error| Refusal::etcd(&error).status())
    }

    pub(super) async fn owner_call(
        &self,
        request: OwnerRequest,
    ) -> Result<Response<OwnerResponse>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let directory = self.directory().await?;
        // One read of the map for both, so the owner is etcd's at the revision sent.
        let (owner, at) = directory.owner_at(session);
        Ok(Response::new(OwnerResponse {
            owner: owner.as_ref().map(owner_info),
            revision: revision(at),
        }))
    }

    pub(super) async fn watch_owners_call(
        &self,
        _request: WatchOwnersRequest,
    ) -> Result<Response<BoxStream<OwnerChange>>, Status> {
        let open = hold(
            &self.inner.bounds.watches,
            1,
            "TOO_MANY_WATCHES",
            &format!(
                "{} WatchOwners streams are open (--max-watches)",
                self.inner.options.max_watches
            ),
        )?;
        let directory = self.directory().await?.clone();
        // Subscribed before the snapshot is read, so that no change falls between the two.
        let mut changes = directory.changes();
        let snapshot = directory.snapshot();
        let (sender, receiver) = mpsc::channel(256);
        let stop = self.inner.stop.clone();
        tokio::spawn(async move {
            let _open = open;
            let first = snapshot
                .owners
                .iter()
                .map(|owner| owner_change::Change::Owner(owner_info(owner)))
                .chain([owner_change::Change::Snapshot(revision(snapshot.revision))]);
            for change in first {
                let change = OwnerChange {
                    change: Some(change),
                };
                if sender.send(Ok(change)).await.is_err() {
                    return;
                }
            }
            loop {
                let change = tokio::select! {
                    change = changes.next() => change,
                    () = sender.closed() => return,
                    () = stop.cancelled() => return,
                };
                let Some(change) = change.map(|change| change_of(&change)) else {
                    return;
                };
                let change = OwnerChange {
                    change: Some(change),
                };
                if sender.send(Ok(change)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }
}

impl Sidecar {
    /// The owner of `session` from a linearizable read: its epoch and node name.
    pub(super) async fn owner(&self, session: Uuid) -> Result<Option<(Epoch, String)>, Refusal> {
        let key = self.inner.store.namespace().owner_key(session);
        let response = self
            .inner
            .store
            .connection()
            .read("owner", |mut client: KvClient, _| {
                let key = key.clone();
                async move { client.get(key, None).await }
            })
            .await
            .map_err(|error| Refusal::etcd(&error))?;
        Ok(response.kvs().first().map(|kv| {
            let node = OwnerValue::decode(kv.value()).map_or_else(String::new, |value| value.node);
            (Epoch::from_revision(kv.create_revision()), node)
        }))
    }
}

fn revision(revision: i64) -> u64 {
    revision.max(0) as u64
}

fn owner_info(owner: &Owner) -> OwnerInfo {
    OwnerInfo {
        session: owner.session.to_string(),
        epoch: owner.epoch.get(),
        node: owner.node.name.clone(),
        store: owner.node.store.to_string(),
        advertise: owner.node.advertise.clone().unwrap_or_default(),
        metadata: owner.node.metadata.clone(),
        lease_id: owner.lease_id,
        revision: revision(owner.revision),
        host_alive: owner.host_alive,
    }
}

fn host_info(node: &Node) -> HostInfo {
    HostInfo {
        store: node.store.to_string(),
        node: node.name.clone(),
        advertise: node.advertise.clone().unwrap_or_default(),
        metadata: node.metadata.clone(),
    }
}

/// A directory change as the proto carries it.
fn change_of(change: &Change) -> owner_change::Change {
    use owner_change::Change as Proto;
    match change {
        Change::Acquired { owner } => Proto::Acquired(owner_info(owner)),
        Change::Released {
            owner,
            revision: at,
        } => Proto::Released(OwnerReleased {
            owner: Some(owner_info(owner)),
            revision: revision(*at),
        }),
        Change::Moved { from, to } => Proto::Moved(OwnerMoved {
            from: Some(owner_info(from)),
            to: Some(owner_info(to)),
        }),
        Change::HostJoined { node, revision: at } => Proto::HostJoined(HostChange {
            host: Some(host_info(node)),
            revision: revision(*at),
            sessions: 0,
        }),
        Change::HostGone {
            node,
            sessions,
            revision: at,
        } => Proto::HostGone(HostChange {
            host: Some(host_info(node)),
            revision: revision(*at),
            sessions: *sessions as u64,
        }),
        Change::Missed { changes } => Proto::Missed(*changes),
    }
}
