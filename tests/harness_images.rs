//! The harness makes its etcd images without any registry: through the image builder, by
//! `docker import` where no builder is usable, and for the 3.4 compatibility target.

use leasehold::testing::{EtcdImage, EtcdNode, ImageBuild};
use leasehold::{ConnectOptions, Connection};

async fn serves_as(node: &EtcdNode, version: &str) {
    let connection = Connection::connect(ConnectOptions::new([node.endpoint()]))
        .await
        .expect("connects");
    assert_eq!(connection.status().await.unwrap().version, version);
    connection.put("leasehold-image-check", "ok").await.unwrap();
    assert_eq!(
        connection.get("leasehold-image-check").await.unwrap(),
        Some(b"ok".to_vec())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_imported_rootfs_runs_etcd() {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let image = EtcdImage::release(EtcdImage::DEFAULT_VERSION)
        .with_reference("leasehold-etcd-import-check", &tag);
    image.rebuild(ImageBuild::Import).await.expect("imports");
    let node = EtcdNode::start_with(image.clone()).await.expect("starts");
    serves_as(&node, EtcdImage::DEFAULT_VERSION).await;
    drop(node);
    image.remove().await.expect("removes the image");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compatibility_image_runs_etcd_3_4() {
    let node = EtcdNode::start_with(EtcdImage::release(EtcdImage::COMPAT_VERSION))
        .await
        .expect("starts");
    serves_as(&node, EtcdImage::COMPAT_VERSION).await;
}
