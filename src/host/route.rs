//! [`SessionHost::route`]: where a request for a session goes, from the host's own rigs and an
//! [`OwnerDirectory`].

use std::sync::Arc;

use uuid::Uuid;

use super::SessionHost;
use crate::directory::{Owner, OwnerDirectory};
use crate::rig::Rig;

/// Where a request for a session goes; see [`SessionHost::route`].
#[derive(Clone, Debug)]
pub enum Route {
    /// This host owns the session, and its lease is valid: work with its rig.
    Here(Arc<Rig>),
    /// Another node owns the session and its host is alive: send the request there (its
    /// [`advertise`](crate::directory::Node::advertise) address).
    There(Owner),
    /// Nobody can take the request now: the session has no owner, its owner's host is gone, or
    /// this host owns it but its rig is being opened or shut down. Try again shortly.
    Nobody,
}

impl Route {
    /// The rig if the session is [`Here`](Route::Here), else a [`NotOwner`] to answer with
    /// (a redirect to the owner, or "try again").
    pub fn into_rig(self) -> Result<Arc<Rig>, NotOwner> {
        match self {
            Route::Here(rig) => Ok(rig),
            Route::There(owner) => Err(NotOwner { owner: Some(owner) }),
            Route::Nobody => Err(NotOwner { owner: None }),
        }
    }
}

/// A request reached a node that does not own its session: what a service turns into a
/// redirect to `owner` (its advertised address), or into "unavailable, try again" when there
/// is none.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", match owner {
    Some(owner) => format!(
        "session {} is owned by node {:?} ({})",
        owner.session,
        owner.node.name,
        owner.node.advertise.as_deref().unwrap_or("no address advertised"),
    ),
    None => "the session has no owner that can take requests now".to_owned(),
})]
#[non_exhaustive]
pub struct NotOwner {
    /// The node that owns the session, if one that is alive does.
    pub owner: Option<Owner>,
}

impl SessionHost {
    /// Where a request for `session` goes: [`Here`](Route::Here) if this host owns it with a
    /// valid lease (whatever `directory` says: the lease is proof, the directory may lag), else
    /// [`There`](Route::There) if `directory` names another node whose host is alive, else
    /// [`Nobody`](Route::Nobody). No I/O.
    pub fn route(&self, session: Uuid, directory: &OwnerDirectory) -> Route {
        if let Some(rig) = self.rig(session).filter(|rig| rig.is_valid()) {
            return Route::Here(rig);
        }
        match directory.owner_of(session) {
            Some(owner) if owner.host_alive && owner.node.store != self.inner.store.id() => {
                Route::There(owner)
            }
            _ => Route::Nobody,
        }
    }
}
