//! Without Docker the harness fails loudly, naming the cause: it never skips.

use std::process::Command;

use leasehold::testing::{EtcdNode, HarnessError};

const CHILD: &str = "LEASEHOLD_HARNESS_CHILD";

/// Runs itself again with `DOCKER_HOST` pointing nowhere: the child asserts the error, and
/// the parent asserts that the child ran and passed.
#[test]
fn without_docker_the_harness_fails_with_a_clear_error() {
    if std::env::var_os(CHILD).is_some() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let error = runtime
            .block_on(EtcdNode::start())
            .expect_err("no etcd without Docker");
        assert!(
            matches!(error, HarnessError::DockerUnavailable { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("Docker is not reachable"), "{message}");
        assert!(message.contains("/nonexistent/docker.sock"), "{message}");
        println!("child saw: {message}");
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_docker_the_harness_fails_with_a_clear_error",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("child saw: Docker is not reachable"),
        "{stdout}"
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
}
