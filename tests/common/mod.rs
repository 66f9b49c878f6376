//! Helpers shared by the lease tests.
#![allow(dead_code)]

use std::time::Duration;

use leasehold::{Namespace, Store, StoreOptions};

/// A store on `endpoints` in `namespace`, with a TTL and margin suited to the test.
pub(crate) async fn store(
    endpoints: &[String],
    namespace: &Namespace,
    node: &str,
    ttl: u64,
) -> Store {
    let margin = Duration::from_millis(if ttl <= 3 { 500 } else { 1000 });
    let options = StoreOptions::new(endpoints.iter().cloned())
        .with_namespace(namespace.clone())
        .with_node(node)
        .with_ttl(Duration::from_secs(ttl), margin);
    Store::connect(options).await.expect("store connects")
}

/// The `Txn` requests the member at `endpoint` has received (from its own counters).
pub(crate) async fn txns(endpoint: &str) -> f64 {
    let labels = ["grpc_method=\"Txn\"", "grpc_type=\"unary\""];
    leasehold::testing::etcd_metric(endpoint, "grpc_server_started_total", &labels)
        .await
        .expect("etcd serves /metrics")
        .expect("etcd counts its Txn requests")
}

/// A raw etcd client, to inspect and tamper with keys from outside.
pub(crate) async fn raw(endpoint: &str) -> etcd_client::Client {
    etcd_client::Client::connect([endpoint], None)
        .await
        .expect("raw client")
}

/// The owner key's create_revision, 0 when absent.
pub(crate) async fn create_revision(client: &etcd_client::Client, key: &str) -> i64 {
    let response = client.clone().get(key, None).await.expect("get");
    response.kvs().first().map_or(0, |kv| kv.create_revision())
}

/// How many keys lie under `prefix`.
pub(crate) async fn count(client: &etcd_client::Client, prefix: &str) -> i64 {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    client
        .clone()
        .get(prefix, Some(options))
        .await
        .expect("count")
        .count()
}

/// A store whose unary requests time out after `request_timeout` (faster unknown outcomes).
pub(crate) async fn store_timeout(
    endpoints: &[String],
    namespace: &Namespace,
    node: &str,
    ttl: u64,
    request_timeout: Duration,
) -> Store {
    let margin = Duration::from_millis(if ttl <= 3 { 500 } else { 1000 });
    let mut options = StoreOptions::new(endpoints.iter().cloned())
        .with_namespace(namespace.clone())
        .with_node(node)
        .with_ttl(Duration::from_secs(ttl), margin);
    options.request_timeout = request_timeout;
    Store::connect(options).await.expect("store connects")
}

/// What a late commit of an abandoned acquisition leaves: the owner value of a key written by
/// the store that holds `held`, with a nonce no lease of it holds. Read from `held`'s own key:
/// `leasehold-owner/1 {store} {nonce} {node}`.
pub(crate) async fn orphan_value(raw: &etcd_client::Client, held: &leasehold::Lease) -> String {
    let response = raw.clone().get(held.owner_key(), None).await.expect("get");
    let value = std::str::from_utf8(response.kvs()[0].value()).expect("an owner value");
    let fields: Vec<&str> = value.splitn(4, ' ').collect();
    format!(
        "leasehold-owner/1 {} {} {}",
        fields[1],
        leasehold::Uuid::new_v4(),
        fields[3]
    )
}

/// The current etcd revision, read from outside.
pub(crate) async fn revision(client: &etcd_client::Client) -> i64 {
    client
        .clone()
        .get("leasehold-test-revision-probe", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision()
}

/// Every key on `raw`'s etcd, in order.
pub(crate) async fn all_keys(raw: &etcd_client::Client) -> Vec<String> {
    let options = etcd_client::GetOptions::new()
        .with_all_keys()
        .with_keys_only();
    let response = raw.clone().get("", Some(options)).await.expect("get");
    response
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Every key put on `raw`'s etcd at revision `from` or later, up to now: read from etcd's
/// history, so that keys written and then deleted are there too.
pub(crate) async fn keys_put_since(
    raw: &etcd_client::Client,
    from: i64,
) -> std::collections::BTreeSet<String> {
    let now = revision(raw).await;
    let mut put = std::collections::BTreeSet::new();
    if now < from {
        return put;
    }
    let options = etcd_client::WatchOptions::new()
        .with_all_keys()
        .with_start_revision(from);
    let mut history = raw.clone().watch("", Some(options)).await.expect("watch");
    let mut seen = 0;
    while seen < now {
        let response = tokio::time::timeout(Duration::from_secs(10), history.message())
            .await
            .expect("the history up to now within 10 s")
            .expect("watch")
            .expect("a watch response");
        for event in response.events() {
            let kv = event.kv().expect("a key");
            seen = seen.max(kv.mod_revision());
            if event.event_type() == etcd_client::EventType::Put {
                put.insert(String::from_utf8_lossy(kv.key()).into_owned());
            }
        }
    }
    put
}

/// `n keys: [the first three, …]`, for a failure message that a long list would bury.
pub(crate) fn few<'a>(keys: impl IntoIterator<Item = &'a String>) -> String {
    let keys: Vec<&String> = keys.into_iter().collect();
    let first: Vec<&&String> = keys.iter().take(3).collect();
    let more = if keys.len() > 3 { ", …" } else { "" };
    format!("{} keys: {first:?}{more}", keys.len())
}

/// One etcd member, a fresh namespace on it, and a raw client for looking from outside.
pub(crate) struct Etcd {
    pub(crate) ns: Namespace,
    pub(crate) raw: etcd_client::Client,
    // Last: the container outlives the clients above.
    pub(crate) node: leasehold::testing::EtcdNode,
}

impl Etcd {
    /// Two proxies to this member: two ways for one store to reach it, to be failed apart.
    pub(crate) async fn two_ways(&self) -> ([leasehold::testing::FaultProxy; 2], Vec<String>) {
        let way = || leasehold::testing::FaultProxy::start(self.node.endpoint());
        let proxies = [way().await.unwrap(), way().await.unwrap()];
        let endpoints = proxies.iter().map(|p| p.endpoint()).collect();
        (proxies, endpoints)
    }

    pub(crate) async fn start() -> Self {
        let node = leasehold::testing::EtcdNode::start()
            .await
            .expect("etcd starts");
        Self {
            ns: leasehold::testing::random_namespace(),
            raw: raw(node.endpoint()).await,
            node,
        }
    }

    /// A store connected directly, in this namespace.
    pub(crate) async fn store(&self, node: &str, ttl: u64) -> Store {
        store(&[self.node.endpoint().to_owned()], &self.ns, node, ttl).await
    }

    /// Runs the `leasehold` tool with `args` against this member, in this namespace.
    pub(crate) async fn tool<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: impl IntoIterator<Item = S>,
    ) -> std::process::Output {
        tool(self.node.endpoint(), &self.ns, args).await
    }
}

/// Runs the `leasehold` tool with `args` against `endpoint`, in namespace `ns` (the
/// environment's endpoints and namespace removed; the warning that the test's etcd is older
/// than the production minimum silenced). Only the tool's own tests (`cli/tests/`,
/// which share these helpers) have the binary.
pub(crate) async fn tool<S: AsRef<std::ffi::OsStr>>(
    endpoint: &str,
    ns: &Namespace,
    args: impl IntoIterator<Item = S>,
) -> std::process::Output {
    let Some(binary) = option_env!("CARGO_BIN_EXE_leasehold") else {
        panic!("the tool runs in the tests of its own package, cli/tests/")
    };
    tokio::process::Command::new(binary)
        .args(["--endpoints", endpoint, "--namespace", ns.as_str()])
        .args(args)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .env("LEASEHOLD_NO_VERSION_WARNING", "true")
        .output()
        .await
        .expect("the tool runs")
}

/// One change in etcd's history: its kind, key, value and the key's version after it.
pub(crate) struct Change {
    pub(crate) put: bool,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) version: i64,
}

/// Every change etcd made from revision `from` to `to`, in order, read from a watch of all
/// keys. Every revision changes some key, so the history is read up to `to` once an event of
/// `to` or later has come.
pub(crate) async fn history(raw: &etcd_client::Client, from: i64, to: i64) -> Vec<Change> {
    let mut changes = Vec::new();
    if to < from {
        return changes;
    }
    let options = etcd_client::WatchOptions::new()
        .with_all_keys()
        .with_start_revision(from);
    let mut watch = raw.clone().watch("", Some(options)).await.unwrap();
    let mut seen = 0;
    while seen < to {
        let response = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("etcd's history within 10 s")
            .unwrap()
            .expect("a watch response");
        for event in response.events() {
            let kv = event.kv().expect("a key");
            seen = seen.max(kv.mod_revision());
            if kv.mod_revision() <= to {
                changes.push(Change {
                    put: event.event_type() == etcd_client::EventType::Put,
                    key: kv.key().to_vec(),
                    value: kv.value().to_vec(),
                    version: kv.version(),
                });
            }
        }
    }
    changes
}

/// The revisions at which each of `keys` was deleted, read from a watch of etcd's history.
pub(crate) async fn delete_revisions(
    history: &mut etcd_client::WatchStream,
    keys: &[&str],
) -> Vec<i64> {
    let mut deleted: Vec<Option<i64>> = vec![None; keys.len()];
    while deleted.iter().any(Option::is_none) {
        let response = tokio::time::timeout(Duration::from_secs(10), history.message())
            .await
            .expect("the deletes happen")
            .unwrap()
            .unwrap();
        for event in response.events() {
            let kv = event.kv().unwrap();
            if event.event_type() == etcd_client::EventType::Delete
                && let Some(i) = keys.iter().position(|key| key.as_bytes() == kv.key())
            {
                deleted[i] = Some(kv.mod_revision());
            }
        }
    }
    deleted.into_iter().map(Option::unwrap).collect()
}

/// The revisions at which each of `keys` was deleted, from revision `from` on, read from
/// etcd's history under `prefix`.
pub(crate) async fn deletes_since(
    raw: &etcd_client::Client,
    prefix: &str,
    from: i64,
    keys: &[&str],
) -> Vec<i64> {
    let options = etcd_client::WatchOptions::new()
        .with_prefix()
        .with_start_revision(from);
    let mut history = raw.clone().watch(prefix, Some(options)).await.unwrap();
    delete_revisions(&mut history, keys).await
}

/// What a continuous writer saw: its history, the instants of its acknowledged appends, and
/// the error that stopped it, if any.
pub(crate) struct Appends {
    pub(crate) history: leasehold::testing::AppendHistory,
    pub(crate) acks: Vec<tokio::time::Instant>,
    pub(crate) error: Option<leasehold::JournalWriteError>,
}

/// Appends to `journal` every `pause` until `stop` (or the first error).
pub(crate) fn append_continuously(
    journal: std::sync::Arc<leasehold::Journal>,
    stop: leasehold::CancellationToken,
    pause: Duration,
) -> tokio::task::JoinHandle<Appends> {
    tokio::spawn(async move {
        let mut appends = Appends {
            history: leasehold::testing::AppendHistory::default(),
            acks: Vec::new(),
            error: None,
        };
        let mut i = 0;
        while !stop.is_cancelled() {
            i += 1;
            let payload = format!("event {i}");
            let result = journal.append(&payload).await;
            appends.history.record(&[&payload], &result);
            match result {
                Ok(_) => appends.acks.push(tokio::time::Instant::now()),
                Err(error) => {
                    appends.error = Some(error);
                    break;
                }
            }
            tokio::time::sleep(pause).await;
        }
        appends
    })
}

/// A store that reaches etcd through a fault proxy, with a journal open on a fresh session.
pub(crate) struct ProxiedJournal {
    pub(crate) journal: std::sync::Arc<leasehold::Journal>,
    pub(crate) lease: leasehold::Lease,
    pub(crate) store: Store,
    pub(crate) session: leasehold::Uuid,
    pub(crate) proxy: leasehold::testing::FaultProxy,
    // Last: the container outlives the rest.
    pub(crate) etcd: Etcd,
}

impl ProxiedJournal {
    /// Starts etcd, a proxy to it, and store "a" (node lease TTL `ttl`) through the proxy.
    pub(crate) async fn start(ttl: u64) -> Self {
        let etcd = Etcd::start().await;
        let proxy = leasehold::testing::FaultProxy::start(etcd.node.endpoint())
            .await
            .unwrap();
        let store = store(&[proxy.endpoint()], &etcd.ns, "a", ttl).await;
        let session = leasehold::Uuid::new_v4();
        let lease = store.acquire_lease(session).await.unwrap();
        let journal = store.open_journal(session, Some(&lease)).await.unwrap();
        Self {
            journal: std::sync::Arc::new(journal),
            lease,
            store,
            session,
            proxy,
            etcd,
        }
    }

    /// Appends `payload` on a task of its own.
    pub(crate) fn append(
        &self,
        payload: &'static str,
    ) -> tokio::task::JoinHandle<Result<leasehold::Appended, leasehold::JournalWriteError>> {
        let journal = self.journal.clone();
        tokio::spawn(async move { journal.append(payload).await })
    }

    /// Waits until record `seq` is in etcd (seen from outside).
    pub(crate) async fn committed(&self, seq: u64) {
        let key = self.etcd.ns.record_key(self.session, seq);
        leasehold::testing::wait_for("the append to commit", Duration::from_secs(5), || async {
            (create_revision(&self.etcd.raw, &key).await > 0).then_some(())
        })
        .await
        .unwrap();
    }
}

/// Sends SIGTERM to a `leasehold` process and waits (at most `within`) for it to exit.
pub(crate) async fn terminate(
    child: &mut tokio::process::Child,
    within: Duration,
) -> std::process::ExitStatus {
    let pid = child.id().expect("still running").to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    tokio::time::timeout(within, child.wait())
        .await
        .expect("it exits on SIGTERM")
        .expect("its status")
}

pub(crate) mod fleet;
pub(crate) mod nospace;
pub(crate) mod prometheus;
pub(crate) mod resets;
pub(crate) mod sidecar;

/// A plain HTTP/1.1 GET of `path` on `addr` (a node's metrics and health server): (status,
/// body).
pub(crate) async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP status: {response}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the series of `name` in a Prometheus `scrape` whose labels include `labels`.
pub(crate) fn sample(scrape: &str, name: &str, labels: &[&str]) -> Option<f64> {
    scrape
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}
