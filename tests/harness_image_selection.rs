//! The order in which the harness finds an etcd image, against real Docker: a named image is
//! run as is or fails with one clear error, quickly; leasehold's own local image comes before
//! the upstream one; the upstream pull fails fast where no registry is reachable and the build
//! from Debian's package follows. The value of `LEASEHOLD_ETCD_IMAGE` is passed to
//! `EtcdImage::select` here, never set: harness_image_env.rs runs the variable itself.

use std::time::{Duration, Instant};

use leasehold::testing::{EtcdImage, EtcdNode, HarnessError, ImageSource};
use leasehold::{ConnectOptions, Connection};

/// What a pull that cannot succeed may take beyond the harness's bound.
const SLACK: Duration = Duration::from_secs(3);

fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_defaults().expect("a Docker client")
}

async fn version_served(node: &EtcdNode) -> String {
    let connection = Connection::connect(ConnectOptions::new([node.endpoint()]))
        .await
        .expect("connects");
    connection.status().await.expect("status").version
}

/// The image ID a container runs.
async fn image_id_of_container(id: &str) -> String {
    let container = docker()
        .inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .expect("inspect container");
    container.image.expect("the container's image ID")
}

async fn image_id(reference: &str) -> String {
    let image = docker()
        .inspect_image(reference)
        .await
        .expect("inspect image");
    image.id.expect("an image ID")
}

/// Runs `body` with `source` also tagged as `reference`, then removes that tag, also when
/// `body` panics.
async fn with_tag<F>(source: &str, reference: &str, body: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let (repo, tag) = reference.rsplit_once(':').unwrap();
    let options = bollard::query_parameters::TagImageOptions {
        repo: Some(repo.to_owned()),
        tag: Some(tag.to_owned()),
    };
    docker()
        .tag_image(source, Some(options))
        .await
        .expect("tags the image");
    let outcome = tokio::spawn(body).await;
    EtcdImage::custom(reference)
        .remove()
        .await
        .expect("removes the tag");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_named_image_that_cannot_be_pulled_fails_fast_with_one_clear_error() {
    let name = format!(
        "leasehold-test-no-such-etcd:{}",
        uuid::Uuid::new_v4().simple()
    );
    let started = Instant::now();
    let error = EtcdNode::start_with(EtcdImage::select(Some(&name), EtcdImage::DEFAULT_VERSION))
        .await
        .expect_err("no such image anywhere");
    let took = started.elapsed();
    let HarnessError::NoEtcdImage { tried, .. } = &error else {
        panic!("not the no-image error: {error:?}");
    };
    assert_eq!(tried.len(), 1, "{tried:?}");
    assert_eq!(tried[0].source, ImageSource::Named);
    assert!(
        took < EtcdImage::PULL_TIMEOUT + SLACK,
        "took {took:?}: {error}"
    );
    let message = error.to_string();
    println!("{message}");
    for part in [
        &format!(
            "set LEASEHOLD_ETCD_IMAGE to an etcd image you have (etcd at /usr/local/bin/etcd): {name} failed: not in Docker, and pulling it failed:"
        ),
        "`docker pull gcr.io/etcd-development/etcd:v3.5.16`: not tried: an image was named (LEASEHOLD_ETCD_IMAGE or EtcdImage::custom)",
        "build leasehold-etcd:3.5.16 from Debian's etcd-server package",
    ] {
        assert!(message.contains(part), "{part:?} not in:\n{message}");
    }
}

/// A registry that accepts connections and never answers: the pull is given up at the
/// harness's bound (Docker itself waits longer here), not left to hang.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_that_gets_no_answer_is_given_up_at_the_bound() {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            held.push(connection);
        }
    });
    let name = format!("127.0.0.1:{port}/etcd:v3.5.16");
    let started = Instant::now();
    let error = EtcdImage::select(Some(&name), EtcdImage::DEFAULT_VERSION)
        .resolve()
        .await
        .expect_err("nothing answers");
    let took = started.elapsed();
    silent.abort();
    let message = error.to_string();
    println!("after {took:?}: {message}");
    assert!(
        took < EtcdImage::PULL_TIMEOUT + SLACK,
        "took {took:?}: {message}"
    );
    assert!(
        message.contains(&format!(
            "{name} failed: not in Docker, and pulling it failed: gave up after 20s"
        )),
        "{message}"
    );
}

/// The compatibility etcd under a name of the test's own, selected as LEASEHOLD_ETCD_IMAGE
/// would: the node runs exactly that image, although the default version is another.
#[tokio::test(flavor = "multi_thread")]
async fn a_named_local_image_under_another_tag_is_the_one_run() {
    let compat = EtcdImage::release(EtcdImage::COMPAT_VERSION)
        .resolve()
        .await
        .expect("the compatibility image");
    let reference = format!("leasehold-test-etcd:{}", uuid::Uuid::new_v4().simple());
    let named = reference.clone();
    with_tag(&compat.image.reference(), &reference, async move {
        let node =
            EtcdNode::start_with(EtcdImage::select(Some(&named), EtcdImage::DEFAULT_VERSION))
                .await
                .expect("starts from the named image");
        assert_eq!(node.image().reference(), named);
        assert_eq!(node.image_source(), ImageSource::Named);
        assert_eq!(
            image_id_of_container(node.container_id()).await,
            image_id(&named).await,
            "the container runs the named image"
        );
        assert_eq!(version_served(&node).await, EtcdImage::COMPAT_VERSION);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leaseholds_local_image_comes_before_the_upstream_one() {
    let default = EtcdImage::release(EtcdImage::DEFAULT_VERSION);
    let first = default.resolve().await.expect("an image");
    if first.source == ImageSource::Upstream {
        // A registry answered and no local image existed; the build step is not reached.
        println!("the upstream image was pulled: {:?}", first.passed_over);
        return;
    }
    // leasehold-etcd:3.5.16 exists now, whichever step made it.
    let again = default.resolve().await.expect("an image");
    assert_eq!(again.source, ImageSource::Local, "{again:?}");
    assert_eq!(again.image.reference(), "leasehold-etcd:3.5.16");
    assert!(again.passed_over.is_empty(), "{:?}", again.passed_over);
}

/// A release under a reference nobody built yet: the local step misses, the upstream pull
/// fails within the bound (no registry is reachable here), and the build from Debian's
/// package provides the image.
#[tokio::test(flavor = "multi_thread")]
async fn the_upstream_step_fails_fast_here_and_the_build_from_debian_follows() {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let image =
        EtcdImage::release(EtcdImage::DEFAULT_VERSION).with_reference("leasehold-test-order", &tag);
    let outcome = tokio::spawn(falls_through_to_debian(image.clone(), tag)).await;
    // Removed also when the test failed (it may not exist then).
    let _ = image.remove().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
}

async fn falls_through_to_debian(image: EtcdImage, tag: String) {
    let choice = image.resolve().await.expect("an image");
    println!("{:?} after {:?}", choice.source, choice.passed_over);
    let steps: Vec<ImageSource> = choice.passed_over.iter().map(|t| t.source).collect();
    match choice.source {
        ImageSource::Upstream => {
            // Only where a registry answers.
            assert_eq!(steps, [ImageSource::Local]);
            assert_eq!(
                choice.image.reference(),
                "gcr.io/etcd-development/etcd:v3.5.16"
            );
            return;
        }
        ImageSource::Debian => {}
        other => panic!("unexpected step {other:?}"),
    }
    assert_eq!(steps, [ImageSource::Local, ImageSource::Upstream]);
    let local = &choice.passed_over[0];
    assert_eq!(local.image, format!("leasehold-test-order:{tag}"));
    assert_eq!(local.failure, "not in Docker");
    let upstream = &choice.passed_over[1];
    assert_eq!(upstream.image, "gcr.io/etcd-development/etcd:v3.5.16");
    assert!(
        upstream
            .failure
            .starts_with("not in Docker, and pulling it failed"),
        "{upstream:?}"
    );
    assert!(
        upstream.took < EtcdImage::PULL_TIMEOUT + SLACK,
        "{upstream:?}"
    );
    assert_eq!(choice.image, image);

    let node = EtcdNode::start_with(choice.image.clone())
        .await
        .expect("starts from the built image");
    assert_eq!(node.image_source(), ImageSource::Local, "built by now");
    assert_eq!(version_served(&node).await, EtcdImage::DEFAULT_VERSION);
}
