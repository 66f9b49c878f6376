//! `leasehold demo` tells the whole story and exits 0.

use std::process::Command;

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_prints_the_timeline_and_exits_0() {
    let etcd = leasehold::testing::etcd_binary("3.5.16")
        .await
        .expect("the etcd binary");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("demo")
            .env("LEASEHOLD_ETCD_BIN", etcd)
            .env_remove("LEASEHOLD_ENDPOINTS")
            .output()
            .expect("runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "node-a acquired session",
        "node-a freezes",
        "node-a knows it lost session",
        "node-c took over session",
        "stale append refused: AppendError",
        "node-b leaves gracefully",
        "fence  epoch",
        "demo done",
    ] {
        assert!(stdout.contains(line), "missing {line:?}");
    }
    // node-a knew before node-c owned.
    let knew = stdout.find("node-a knows it lost").unwrap();
    let took = stdout.find("node-c took over").unwrap();
    assert!(knew < took);
}
