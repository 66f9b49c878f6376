//! Public handles can cross threads and tasks: checked at compile time.

use leasehold::{Connection, Lease, Lost, Ownership, Store};

fn is_send_sync<T: Send + Sync>() {}
fn is_send<T: Send>(_: &T) {}

#[test]
fn handles_are_send_and_sync() {
    is_send_sync::<Store>();
    is_send_sync::<Lease>();
    is_send_sync::<Ownership>();
    is_send_sync::<Lost>();
    is_send_sync::<Connection>();
    is_send_sync::<leasehold::AcquireError>();
    is_send_sync::<leasehold::testing::FaultProxy>();
    is_send_sync::<leasehold::testing::EtcdCluster>();
}

#[allow(dead_code, clippy::diverging_sub_expression)]
async fn futures_are_send(store: &Store, lease: &Lease) {
    let session = uuid::Uuid::new_v4();
    is_send(&store.acquire_lease(session));
    is_send(&store.acquire_lease_wait(session, std::time::Duration::ZERO));
    is_send(&lease.release());
    is_send(&store.close());
}
