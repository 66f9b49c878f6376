//! `Connection::delete_prefix` deletes a namespace a page of 5,000 keys at a time (one request
//! deleting hundreds of thousands outlasts its timeout): every key under the prefix goes,
//! however many pages that takes, the count after each page is told, and no key beside the
//! prefix is touched.

use etcd_client::{GetOptions, Txn, TxnOp};
use leasehold::testing::{EtcdNode, random_namespace};
use leasehold::{ConnectOptions, Connection};

/// Keys under the prefix: two full pages and part of a third.
const KEYS: usize = 12_345;

#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_of_several_pages_goes_page_by_page_and_nothing_beside_it() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let connection = Connection::connect(ConnectOptions::new([etcd.endpoint()]))
        .await
        .expect("connects");
    let mut kv = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("raw client")
        .kv_client();
    let namespace = random_namespace();
    let prefix = namespace.prefix();
    let name = prefix.trim_end_matches('/');
    let under: Vec<String> = (0..KEYS).map(|i| format!("{prefix}k/{i:06}")).collect();
    for keys in under.chunks(128) {
        let puts: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::put(k.as_str(), "v", None))
            .collect();
        kv.txn(Txn::new().and_then(puts)).await.expect("puts");
    }
    // Beside the prefix: the keys just before and just after its range (`/` is 0x2F; the range
    // ends at `{name}0`), and a sibling namespace whose name extends this one's.
    let beside = [
        format!("{name}."),
        format!("{name}0"),
        format!("{name}-sibling/k"),
    ];
    for key in &beside {
        kv.put(key.as_str(), "v", None).await.expect("put beside");
    }

    let mut told = Vec::new();
    let deleted = connection
        .delete_prefix(&prefix, |keys| told.push(keys))
        .await
        .expect("deletes");

    assert_eq!(deleted, KEYS as u64);
    assert_eq!(told, [5_000, 10_000, 12_345], "the count after each page");
    let left = kv
        .get(
            prefix.as_str(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("counts");
    assert_eq!(left.count(), 0, "nothing is left under {prefix}");
    for key in &beside {
        let kept = kv.get(key.as_str(), None).await.expect("gets");
        assert_eq!(kept.kvs().len(), 1, "{key}, beside the prefix, is kept");
    }

    // Nothing left: one page, nothing deleted.
    let mut told = Vec::new();
    let deleted = connection
        .delete_prefix(&prefix, |keys| told.push(keys))
        .await
        .expect("deletes nothing");
    assert_eq!((deleted, told), (0, vec![0]));
}
