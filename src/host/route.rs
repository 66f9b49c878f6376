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
    /// The session is not one this host hosts (not in its fixed set, and, for a host of the
    /// registry, not registered as of the last registry event it saw), and the directory
    /// names no owner: no such session, an answer of its own (HTTP 404), not a wait. A
    /// session created a moment ago may be reported so until this host sees its creation.
    Unknown,
}

impl Route {
    /// The rig if the session is [`Here`](Route::Here), else a [`NotOwner`] to answer with
    /// (a redirect to the owner, or "try again").
    pub fn into_rig(self) -> Result<Arc<Rig>, NotOwner> {
        match self {
            Route::Here(rig) => Ok(rig),
            Route::There(owner) => Err(NotOwner {
                owner: Some(owner),
                unknown: false,
            }),
            Route::Nobody => Err(NotOwner {
                owner: None,
                unknown: false,
            }),
            Route::Unknown => Err(NotOwner {
                owner: None,
                unknown: true,
            }),
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
    None if *unknown => "no such session: this host does not host it and nobody owns it".to_owned(),
    None => "the session has no owner that can take requests now".to_owned(),
})]
#[non_exhaustive]
pub struct NotOwner {
    /// The node that owns the session, if one that is alive does.
    pub owner: Option<Owner>,
    /// The session is not one this host hosts and nobody owns it ([`Route::Unknown`]).
    pub unknown: bool,
}

impl SessionHost {
    /// Where a request for `session` goes: [`Here`](Route::Here) if this host owns it with a
    /// valid lease (whatever `directory` says: the lease is proof, the directory may lag), else
    /// [`There`](Route::There) if `directory` names another node whose host is alive, else
    /// [`Unknown`](Route::Unknown) if this host does not host the session and `directory`
    /// names no owner at all, else [`Nobody`](Route::Nobody). No I/O.
    pub fn route(&self, session: Uuid, directory: &OwnerDirectory) -> Route {
        if let Some(rig) = self.rig(session).filter(|rig| rig.is_valid()) {
            return Route::Here(rig);
        }
        match directory.owner_of(session) {
            Some(owner) if owner.host_alive && owner.node.store != self.inner.store.id() => {
                Route::There(owner)
            }
            None if !self.hosts(session) => Route::Unknown,
            _ => Route::Nobody,
        }
    }
}
