//! A small etcd that fills up, and the operator's way out of its NOSPACE alarm, done from
//! outside with a raw client as `etcdctl` would (docs/production.md, "Quota and the NOSPACE
//! alarm").

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, CompactionOptions};

/// etcd's quota in these tests: 16 MiB.
pub(crate) const QUOTA: u64 = 16 * 1024 * 1024;

/// One etcd member whose backend quota is [`QUOTA`].
pub(crate) async fn small_etcd() -> super::Etcd {
    small_etcd_with(&[]).await
}

/// [`small_etcd`], started with `args` as well.
pub(crate) async fn small_etcd_with(args: &[&str]) -> super::Etcd {
    let node = leasehold::testing::EtcdNode::builder()
        .arg(format!("--quota-backend-bytes={QUOTA}"))
        .args(args.iter().copied())
        .start()
        .await
        .expect("etcd starts");
    super::Etcd {
        ns: leasehold::testing::random_namespace(),
        raw: super::raw(node.endpoint()).await,
        node,
    }
}

/// The alarms raised, as `etcdctl alarm list` shows them.
pub(crate) async fn alarms(raw: &etcd_client::Client) -> Vec<(u64, AlarmType)> {
    let response = raw
        .clone()
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .expect("alarm list");
    response
        .alarms()
        .iter()
        .map(|alarm| (alarm.member_id(), alarm.alarm()))
        .collect()
}

/// Whether etcd's NOSPACE alarm is raised.
pub(crate) async fn nospace(raw: &etcd_client::Client) -> bool {
    alarms(raw)
        .await
        .iter()
        .any(|(_, alarm)| *alarm == AlarmType::Nospace)
}

/// The backend database's size, as `etcdctl endpoint status` shows it.
pub(crate) async fn db_size(raw: &etcd_client::Client) -> i64 {
    raw.clone().status().await.expect("status").db_size()
}

/// `etcdctl compact $rev` (physical: it returns once the history is gone), `etcdctl defrag`.
pub(crate) async fn compact_and_defrag(raw: &etcd_client::Client) {
    let mut raw = raw.clone();
    let revision = super::revision(&raw).await;
    match raw
        .compact(revision, Some(CompactionOptions::new().with_physical()))
        .await
    {
        Ok(_) => {}
        // Nothing was written since the last compaction, which reached this revision.
        Err(error)
            if error
                .to_string()
                .contains("required revision has been compacted") => {}
        Err(error) => panic!("compact: {error}"),
    }
    raw.defragment().await.expect("defrag");
}

/// `etcdctl alarm disarm`: every alarm raised, deactivated.
pub(crate) async fn disarm(raw: &etcd_client::Client) {
    for (member, alarm) in alarms(raw).await {
        let mut options = AlarmOptions::new();
        options.with_member(member);
        raw.clone()
            .alarm(AlarmAction::Deactivate, alarm, Some(options))
            .await
            .expect("alarm disarm");
    }
}
