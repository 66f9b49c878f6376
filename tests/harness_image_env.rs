//! `LEASEHOLD_ETCD_IMAGE` itself, read from the environment by `EtcdNode::start`. The variable
//! is set only in child processes (this test binary run again), never in this one, so no other
//! test can see it.

use std::process::Command;
use std::time::Instant;

use leasehold::testing::{EtcdImage, EtcdNode, HarnessError, ImageSource};
use leasehold::{ConnectOptions, Connection};

/// Which scenario a child runs.
const CHILD: &str = "LEASEHOLD_IMAGE_ENV_CHILD";

/// In a child: starts a node as a test would, with nothing but the environment to go on.
async fn child(scenario: &str) {
    let image = std::env::var(EtcdImage::ENV).expect("the parent sets the variable");
    let started = Instant::now();
    let result = EtcdNode::start().await;
    match scenario {
        "unpullable" => {
            let error = result.expect_err("the named image exists nowhere");
            assert!(
                matches!(error, HarnessError::NoEtcdImage { .. }),
                "{error:?}"
            );
            assert!(
                started.elapsed() < EtcdImage::PULL_TIMEOUT,
                "{:?}",
                started.elapsed()
            );
            let message = error.to_string();
            assert!(
                message.contains(&format!("LEASEHOLD_ETCD_IMAGE to an etcd image you have (etcd at /usr/local/bin/etcd): {image} failed:")),
                "{message}"
            );
            println!("child saw: {message}");
        }
        "tagged" => {
            let node = result.expect("starts from the named image");
            assert_eq!(node.image().reference(), image);
            assert_eq!(node.image_source(), ImageSource::Named);
            let connection = Connection::connect(ConnectOptions::new([node.endpoint()]))
                .await
                .unwrap();
            let version = connection.status().await.unwrap().version;
            println!("child ran {image}: etcd {version}");
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// Runs this test again in a child with `LEASEHOLD_ETCD_IMAGE=image`; returns its stdout.
fn run_child(scenario: &str, image: &str) -> String {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "leasehold_etcd_image_selects_the_image_or_fails_clearly",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, scenario)
        .env(EtcdImage::ENV, image)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "child {scenario} failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    stdout
}

#[test]
fn leasehold_etcd_image_selects_the_image_or_fails_clearly() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    if let Ok(scenario) = std::env::var(CHILD) {
        runtime.block_on(child(&scenario));
        return;
    }
    // The children get their own value of the variable, whatever this process has.

    // A name no registry has: one clear error naming it, quickly.
    let fake = format!(
        "leasehold-test-no-such-etcd:{}",
        uuid::Uuid::new_v4().simple()
    );
    let stdout = run_child("unpullable", &fake);
    assert!(
        stdout.contains("child saw: no etcd image to run"),
        "{stdout}"
    );
    assert!(stdout.contains(&fake), "{stdout}");

    // The compatibility etcd under another name: the child runs it although the default
    // version is another.
    let reference = format!("leasehold-test-etcd:{}", uuid::Uuid::new_v4().simple());
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    runtime.block_on(async {
        let compat = EtcdImage::release(EtcdImage::COMPAT_VERSION)
            .resolve()
            .await
            .expect("the compatibility image");
        let (repo, tag) = reference.rsplit_once(':').unwrap();
        let options = bollard::query_parameters::TagImageOptions {
            repo: Some(repo.to_owned()),
            tag: Some(tag.to_owned()),
        };
        docker
            .tag_image(&compat.image.reference(), Some(options))
            .await
            .expect("tags the image");
    });
    let ran = std::panic::catch_unwind(|| run_child("tagged", &reference));
    runtime
        .block_on(EtcdImage::custom(&reference).remove())
        .expect("removes the tag");
    let stdout = ran.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert!(
        stdout.contains(&format!(
            "child ran {reference}: etcd {}",
            EtcdImage::COMPAT_VERSION
        )),
        "{stdout}"
    );
}
