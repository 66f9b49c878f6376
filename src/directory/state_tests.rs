use super::*;
use crate::directory::Change;

const A: Uuid = Uuid::from_u128(0xa);
const B: Uuid = Uuid::from_u128(0xb);
const BARE: Uuid = Uuid::from_u128(0xc);

fn value(store: Uuid, node: &str) -> Option<OwnerValue> {
    Some(OwnerValue::new(
        store,
        Uuid::now_v7(),
        node,
        Some("http://127.0.0.1:1"),
        b"",
    ))
}

fn owner_key(session: u128, epoch: u64, store: Uuid) -> OwnerKey {
    OwnerKey {
        session: Uuid::from_u128(session),
        epoch: Epoch(epoch),
        revision: epoch as i64,
        lease_id: store.as_u128() as i64,
        value: value(store, &format!("node {store}")),
    }
}

fn host_key(store: Uuid, revision: i64) -> HostKey {
    HostKey {
        store,
        revision,
        value: HostValue {
            max: None,
            weight: 1,
            nonce: Uuid::now_v7(),
            node: format!("node {store}"),
            advertise: Some("http://127.0.0.1:1".into()),
            metadata: Vec::new(),
        },
    }
}

fn alive(state: &State, session: u128) -> Option<bool> {
    state
        .owner_of(Uuid::from_u128(session))
        .map(|owner| owner.host_alive)
}

/// What each change is, in short: its kind, its session or store, its revision.
fn short(changes: &[Change]) -> Vec<(&'static str, u128, i64)> {
    changes
        .iter()
        .map(|change| {
            let revision = change.revision().unwrap_or(-1);
            match change {
                Change::Acquired { owner } => ("acquired", owner.session.as_u128(), revision),
                Change::Moved { to, .. } => ("moved", to.session.as_u128(), revision),
                Change::Released { owner, .. } => ("released", owner.session.as_u128(), revision),
                Change::HostJoined { node, .. } => ("joined", node.store.as_u128(), revision),
                Change::HostGone { node, .. } => ("gone", node.store.as_u128(), revision),
                Change::Missed { .. } => ("missed", 0, revision),
            }
        })
        .collect()
}

#[test]
fn events_acquire_move_and_release_and_an_unchanged_epoch_is_no_change() {
    let mut state = State::default();
    let mut changes = Vec::new();
    changes.extend(state.put_owner(owner_key(1, 10, A)));
    changes.extend(state.put_owner(owner_key(1, 10, A)));
    changes.extend(state.put_owner(owner_key(1, 12, B)));
    changes.extend(state.delete_owner(Uuid::from_u128(1), 13));
    changes.extend(state.delete_owner(Uuid::from_u128(1), 14));
    assert_eq!(
        short(&changes),
        [("acquired", 1, 10), ("moved", 1, 12), ("released", 1, 13)]
    );
    let Change::Moved { from, to } = &changes[1] else {
        unreachable!()
    };
    assert_eq!((from.epoch, from.node.store), (Epoch(10), A));
    assert_eq!((to.epoch, to.node.store), (Epoch(12), B));
    assert_eq!(to.node.advertise.as_deref(), Some("http://127.0.0.1:1"));
    assert_eq!(state.revision, 14);
    assert!(state.owner_of(Uuid::from_u128(1)).is_none());
    assert!(state.named.is_empty(), "no store is named any more");
}

#[test]
fn a_host_key_that_goes_marks_its_sessions_at_once_and_only_its_own() {
    let mut state = State::default();
    state.put_host(host_key(A, 1));
    state.put_host(host_key(B, 2));
    state.put_owner(owner_key(1, 10, A));
    state.put_owner(owner_key(2, 11, A));
    state.put_owner(owner_key(3, 12, B));
    state.put_owner(owner_key(4, 13, BARE));
    let gone = state.delete_host(A, 20);
    assert!(
        matches!(&gone, Some(Change::HostGone { node, sessions: 2, revision: 20 }) if node.store == A),
        "{gone:?}"
    );
    let marks: Vec<_> = (1..=4).map(|s| alive(&state, s)).collect();
    assert_eq!(marks, [Some(false), Some(false), Some(true), Some(true)]);
    assert_eq!(
        state
            .hosts()
            .iter()
            .map(|(n, held)| (n.store, *held))
            .collect::<Vec<_>>(),
        [(B, 1)]
    );

    // --- the owner keys go one by one; the last one unnames the store
    state.delete_owner(Uuid::from_u128(1), 21);
    assert_eq!(alive(&state, 2), Some(false));
    state.delete_owner(Uuid::from_u128(2), 22);
    // A later owner of that store (a host that registered again) starts alive.
    state.put_owner(owner_key(5, 30, A));
    assert_eq!(alive(&state, 5), Some(true));

    // --- a host key put again marks its sessions alive again
    state.delete_host(B, 31);
    assert_eq!(alive(&state, 3), Some(false));
    state.put_host(host_key(B, 32));
    assert_eq!(alive(&state, 3), Some(true));
}

#[test]
fn a_snapshot_after_a_gap_is_applied_as_the_changes_it_shows() {
    let mut state = State::default();
    state.reset(
        9,
        vec![owner_key(1, 5, A), owner_key(2, 6, A), owner_key(3, 7, B)],
        vec![host_key(A, 1), host_key(B, 2)],
    );
    assert_eq!((state.len(), state.revision), (3, 9));

    // At 40: A's host key went, 1 was released, 2 is kept, 3 moved to A's store at a newer
    // epoch, 4 is new.
    let changes = state.reset(
        40,
        vec![owner_key(2, 6, A), owner_key(3, 30, A), owner_key(4, 31, B)],
        vec![host_key(B, 2)],
    );
    let mut short = short(&changes);
    short.sort();
    assert_eq!(
        short,
        [
            ("acquired", 4, 31),
            ("gone", A.as_u128(), 40),
            ("moved", 3, 30),
            ("released", 1, 40),
        ]
    );
    // The host went before the owner changes were applied: they tell it.
    let released = changes
        .iter()
        .find(|c| matches!(c, Change::Released { .. }))
        .unwrap();
    assert!(matches!(released, Change::Released { owner, .. } if !owner.host_alive));
    assert_eq!(state.revision, 40);
    assert_eq!(state.hosts_revision, 40);
    let owners: Vec<(u128, u64, bool)> = state
        .owners()
        .iter()
        .map(|o| (o.session.as_u128(), o.epoch.get(), o.host_alive))
        .collect();
    assert_eq!(owners, [(2, 6, false), (3, 30, false), (4, 31, true)]);
}

#[test]
fn an_entry_is_small_and_its_node_is_shared() {
    assert!(
        std::mem::size_of::<Entry>() <= 32,
        "{}",
        std::mem::size_of::<Entry>()
    );
    let mut state = State::default();
    for session in 0..100 {
        state.put_owner(owner_key(session, 10 + session as u64, A));
    }
    let nodes: Vec<_> = state.owners().into_iter().map(|o| o.node).collect();
    assert!(nodes.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    assert_eq!(state.named[&A].entries, 100);
}
