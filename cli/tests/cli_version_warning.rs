//! The warning that etcd is older than the minimum for production (the test's etcd, 3.5.16, is)
//! comes at most once per process: in a loop of 20 tool commands each says it once, and none
//! says it with `--no-version-warning` or `LEASEHOLD_NO_VERSION_WARNING`.

#[path = "../../tests/common/mod.rs"]
mod common;

/// Commands that connect to etcd and exit at once, taken in turn.
const COMMANDS: [&[&str]; 5] = [
    &["status"],
    &["owners"],
    &["hosts"],
    &["sessions", "create"],
    &["sessions", "list"],
];

/// How many lines of `stderr` are the version warning.
fn warnings(stderr: &[u8]) -> usize {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|line| line.contains("is older than 3.5.28"))
        .count()
}

/// Runs `leasehold` with `args` against `etcd`; with `silence`, that environment variable set.
async fn run(etcd: &common::Etcd, args: &[&str], silence: Option<&str>) -> std::process::Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(["--endpoints", etcd.node.endpoint(), "--namespace"])
        .arg(etcd.ns.as_str())
        .args(args)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .env_remove("LEASEHOLD_NO_VERSION_WARNING");
    if let Some(variable) = silence {
        command.env(variable, "true");
    }
    command.output().await.expect("the tool runs")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_loop_of_commands_warns_once_in_each_and_never_when_silenced() {
    let etcd = common::Etcd::start().await;
    for round in 0..20 {
        let args = COMMANDS[round % COMMANDS.len()];
        let ran = run(&etcd, args, None).await;
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert!(ran.status.success(), "{args:?}: {ran:?}");
        assert_eq!(warnings(&ran.stderr), 1, "{args:?} warns once: {stderr}");
    }
    for round in 0..20 {
        let args = COMMANDS[round % COMMANDS.len()];
        let ran = if round % 2 == 0 {
            let flagged: Vec<&str> = args
                .iter()
                .copied()
                .chain(["--no-version-warning"])
                .collect();
            run(&etcd, &flagged, None).await
        } else {
            run(&etcd, args, Some("LEASEHOLD_NO_VERSION_WARNING")).await
        };
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert!(ran.status.success(), "{args:?}: {ran:?}");
        assert_eq!(warnings(&ran.stderr), 0, "{args:?} silenced: {stderr}");
        assert!(!stderr.contains("WARN"), "{args:?} silenced: {stderr}");
    }
}
