//! The system under test: a 3-member etcd cluster and nodes, each a `SessionHost` on its own
//! single-threaded runtime (so that one node's runtime can be stalled while the rest goes on),
//! reaching every member through its own fault proxies, appending continuously to the
//! sessions it owns.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use leasehold::sidecar::{Sidecar, SidecarOptions};
use leasehold::testing::{EtcdCluster, FaultProxy, Mutant};
use leasehold::{
    CancellationToken, ConnectOptions, Connection, HostOptions, Namespace, Rig, SessionHost, Store,
    StoreOptions, Uuid,
};
use tokio::runtime::Handle;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::client;
use crate::history::{Entry, History};

/// How the nodes run.
#[derive(Clone, Debug)]
pub(crate) struct NodeConfig {
    pub(crate) ttl: Duration,
    pub(crate) margin: Duration,
    /// The pause between two appends of one appender.
    pub(crate) pace: Duration,
    pub(crate) mutant: Mutant,
    /// How long the work on a session may take to stop before the host aborts it.
    pub(crate) stop_grace: Duration,
}

/// One node: a store and a host on a runtime of their own; or a store and a sidecar on a runtime
/// of their own, with one gRPC client per session on the campaign's runtime (another process,
/// as it were), reaching the sidecar through a fault proxy of its own.
pub(crate) struct Node {
    pub(crate) index: usize,
    pub(crate) proxies: Vec<FaultProxy>,
    namespace: Namespace,
    config: NodeConfig,
    /// Its runtime and store: a sidecar node's are replaced when it is killed and started again.
    running: std::sync::Mutex<Running>,
    role: Role,
}

/// A node's runtime (one thread) and what runs on it.
struct Running {
    handle: Handle,
    store: Arc<Store>,
    /// The sidecar on it, for a sidecar node.
    sidecar: Option<Sidecar>,
    stop: Option<tokio::sync::oneshot::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Ends the runtime. `kill`: at once, as SIGKILL would: every task dropped where it
    /// stands, nothing released, the node lease left to expire.
    async fn end(&mut self, kill: bool) {
        let thread = self.thread.take();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(kill);
        }
        if let Some(thread) = thread {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .unwrap()
                .expect("the node's runtime thread ends without a panic");
        }
    }
}

enum Role {
    Host(Arc<SessionHost>),
    Sidecar {
        /// Where the sidecar listens (the same address after a restart).
        address: std::net::SocketAddr,
        /// Between the clients and the sidecar.
        front: FaultProxy,
        /// Which side the next outage cuts: etcd's, the clients', or both, in turn.
        turn: AtomicUsize,
        clients: CancellationToken,
        running: TaskTracker,
    },
}

/// A runtime of one thread for node `index`: its handle, the sender that stops it (`true`:
/// killed, its tasks dropped at once), and its thread.
fn runtime(
    index: usize,
) -> (
    Handle,
    tokio::sync::oneshot::Sender<bool>,
    std::thread::JoinHandle<()>,
) {
    let (handle_sender, handle_receiver) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<bool>();
    let thread = std::thread::Builder::new()
        .name(format!("node-{index}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            handle_sender.send(runtime.handle().clone()).unwrap();
            let killed = runtime.block_on(async { stopped.await.unwrap_or(false) });
            if killed {
                runtime.shutdown_background();
            }
        })
        .unwrap();
    (handle_receiver.recv().unwrap(), stop, thread)
}

/// A store for node `index` through `proxies`, connected on `handle`'s runtime.
async fn store(
    index: usize,
    handle: &Handle,
    proxies: &[FaultProxy],
    namespace: &Namespace,
    config: &NodeConfig,
) -> Arc<Store> {
    let options = StoreOptions::new(proxies.iter().map(FaultProxy::endpoint))
        .with_namespace(namespace.clone())
        .with_node(format!("node-{index}"))
        .with_ttl(config.ttl, config.margin)
        .with_mutant(config.mutant);
    Arc::new(
        handle
            .spawn(Store::connect(options))
            .await
            .unwrap()
            .expect("the store connects"),
    )
}

/// A sidecar over `store` on `handle`'s runtime, listening on `address`.
fn serve(handle: &Handle, store: &Arc<Store>, address: std::net::SocketAddr) -> Sidecar {
    let sidecar = Sidecar::new(
        store.clone(),
        SidecarOptions::default().with_client_keepalive(Duration::from_secs(1)),
    );
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // The address a killed sidecar listened on is bound again at once.
    socket.set_reuseaddr(true).unwrap();
    let served = sidecar.clone();
    handle.spawn(async move {
        socket.bind(address).unwrap();
        let listener = socket.listen(1024).unwrap();
        let _ = served
            .serve_tcp(listener, None, std::future::pending())
            .await;
    });
    sidecar
}

impl Node {
    pub(crate) async fn start(
        index: usize,
        cluster: &EtcdCluster,
        namespace: &Namespace,
        sessions: &[Uuid],
        config: &NodeConfig,
        history: &Arc<History>,
        sidecar: bool,
    ) -> Self {
        let mut proxies = Vec::new();
        for member in 0..cluster.len() {
            proxies.push(FaultProxy::start(cluster.endpoint(member)).await.unwrap());
        }
        let (handle, stop, thread) = runtime(index);
        let store = store(index, &handle, &proxies, namespace, config).await;
        let mut running = Running {
            handle,
            store,
            sidecar: None,
            stop: Some(stop),
            thread: Some(thread),
        };
        let role = if sidecar {
            let address = {
                let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                free.local_addr().unwrap()
            };
            running.sidecar = Some(serve(&running.handle, &running.store, address));
            let front = FaultProxy::start(&address.to_string()).await.unwrap();
            let (clients, tasks) = (CancellationToken::new(), TaskTracker::new());
            for session in sessions {
                tasks.spawn(client::run(
                    index,
                    front.endpoint(),
                    *session,
                    config.pace,
                    history.clone(),
                    clients.clone(),
                ));
            }
            Role::Sidecar {
                address,
                front,
                turn: AtomicUsize::new(0),
                clients,
                running: tasks,
            }
        } else {
            let (work, grace) = (work(index, config.pace, history.clone()), config.stop_grace);
            let (store, sessions) = (running.store.clone(), sessions.to_vec());
            let host = running
                .handle
                .spawn(async move {
                    SessionHost::start(
                        store,
                        HostOptions::default().with_stop_grace(grace),
                        sessions,
                        work,
                    )
                })
                .await
                .unwrap();
            Role::Host(Arc::new(host))
        };
        Self {
            index,
            proxies,
            namespace: namespace.clone(),
            config: config.clone(),
            running: std::sync::Mutex::new(running),
            role,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap()
    }

    /// Whether it is a sidecar node.
    pub(crate) fn is_sidecar(&self) -> bool {
        matches!(self.role, Role::Sidecar { .. })
    }

    /// Kills a sidecar node's process, as it were (its runtime ends at once: nothing released,
    /// its node lease left to expire), then after `down` starts a new store and sidecar on the
    /// same address. Its clients go on, retrying with their request ids.
    pub(crate) async fn kill_and_restart_sidecar(&self, down: Duration) {
        let Role::Sidecar { address, .. } = &self.role else {
            panic!("node-{} is no sidecar", self.index)
        };
        let mut killed = {
            let mut running = self.running();
            Running {
                handle: running.handle.clone(),
                store: running.store.clone(),
                sidecar: running.sidecar.take(),
                stop: running.stop.take(),
                thread: running.thread.take(),
            }
        };
        killed.end(true).await;
        drop(killed);
        tokio::time::sleep(down).await;
        let (handle, stop, thread) = runtime(self.index);
        let store = store(
            self.index,
            &handle,
            &self.proxies,
            &self.namespace,
            &self.config,
        )
        .await;
        let sidecar = serve(&handle, &store, *address);
        *self.running() = Running {
            handle,
            store,
            sidecar: Some(sidecar),
            stop: Some(stop),
            thread: Some(thread),
        };
    }

    /// The proxies the next outage cuts: all of a host node's; a sidecar node's etcd side,
    /// its clients' side, or both, in turn.
    fn cut(&self) -> Vec<&FaultProxy> {
        match &self.role {
            Role::Host(_) => self.proxies.iter().collect(),
            Role::Sidecar { front, turn, .. } => match turn.fetch_add(1, Ordering::Relaxed) % 3 {
                0 => self.proxies.iter().collect(),
                1 => vec![front],
                _ => self.proxies.iter().chain([front]).collect(),
            },
        }
    }

    /// A sidecar node's proxy in front of it.
    fn front(&self) -> Option<&FaultProxy> {
        match &self.role {
            Role::Host(_) => None,
            Role::Sidecar { front, .. } => Some(front),
        }
    }

    /// Freezes every task of this node for `pause` (a stop-the-world pause): the runtime's
    /// one thread sleeps.
    pub(crate) fn stall(&self, pause: Duration) {
        self.running()
            .handle
            .spawn(async move { std::thread::sleep(pause) });
    }

    pub(crate) fn blackhole(&self) {
        self.cut().into_iter().for_each(FaultProxy::blackhole);
    }

    pub(crate) fn drop_replies(&self) {
        self.cut().into_iter().for_each(FaultProxy::drop_replies);
    }

    pub(crate) fn reject(&self) {
        self.cut().into_iter().for_each(FaultProxy::reject);
    }

    pub(crate) fn heal(&self) {
        self.proxies.iter().for_each(FaultProxy::heal);
        self.front().into_iter().for_each(FaultProxy::heal);
    }

    /// What this node is, for the campaign's log.
    pub(crate) fn role(&self) -> &'static str {
        match self.role {
            Role::Host(_) => "SessionHost",
            Role::Sidecar { .. } => "sidecar, one gRPC client per session",
        }
    }

    /// Shuts the host down (every owned session in order), closes the store and stops the
    /// runtime.
    pub(crate) async fn stop(self) {
        let (handle, store, sidecar) = {
            let running = self.running();
            (
                running.handle.clone(),
                running.store.clone(),
                running.sidecar.clone(),
            )
        };
        let closing = match &self.role {
            Role::Host(host) => {
                let host = host.clone();
                handle.spawn(async move {
                    host.shutdown().await;
                    store.close().await;
                })
            }
            Role::Sidecar {
                clients, running, ..
            } => {
                // The clients stop first (each settling what it has in flight), then the
                // sidecar releases what they still hold.
                clients.cancel();
                running.close();
                if tokio::time::timeout(Duration::from_secs(60), running.wait())
                    .await
                    .is_err()
                {
                    eprintln!(
                        "campaign: node-{}'s clients did not stop in 60 s",
                        self.index
                    );
                }
                let sidecar = sidecar.expect("a sidecar node serves");
                handle.spawn(async move {
                    sidecar.shutdown().await;
                    store.close().await;
                })
            }
        };
        if tokio::time::timeout(Duration::from_secs(30), closing)
            .await
            .is_err()
        {
            eprintln!("campaign: node-{} did not shut down in 30 s", self.index);
        }
        let mut running = self.running.into_inner().unwrap();
        running.end(false).await;
    }
}

/// The user's work on an owned session: two appenders, one of single appends and one of
/// batches, until the host says stop.
fn work(
    node: usize,
    pace: Duration,
    history: Arc<History>,
) -> impl Fn(Arc<Rig>, CancellationToken) -> futures_util::future::BoxFuture<'static, ()>
+ Send
+ Sync
+ 'static {
    use futures_util::FutureExt as _;
    move |rig, token| {
        let history = history.clone();
        async move {
            let (session, epoch) = (rig.session_id(), rig.epoch());
            history.note(Entry::Acquired {
                at: Instant::now(),
                node,
                session,
                epoch,
            });
            tokio::join!(
                appender(&rig, &token, &history, node, 1, pace),
                appender(&rig, &token, &history, node, 5, pace),
            );
            history.note(Entry::Ended {
                at: Instant::now(),
                node,
                session,
                epoch,
            });
        }
        .boxed()
    }
}

async fn appender(
    rig: &Rig,
    token: &CancellationToken,
    history: &Arc<History>,
    node: usize,
    max_batch: usize,
    pace: Duration,
) {
    let (session, epoch) = (rig.session_id(), rig.epoch());
    let journal = rig.journal();
    let mut n = 0;
    while !token.is_cancelled() {
        if journal.is_broken() {
            // The host gives the session up; nothing to do until it says so.
            token.cancelled().await;
            break;
        }
        if rig.is_valid() {
            history.seen_valid(session, epoch, node);
        }
        n += 1;
        let count = 1 + n % max_batch;
        let payloads = (0..count).map(|_| history.payload(session, node)).collect();
        let call = history.call(session, payloads);
        let result = journal.append_batch(&call.payloads).await;
        let failed = result.is_err();
        call.done(&result);
        if failed {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(pace).await;
    }
}

/// An operator's view of the cluster, straight to the members (no proxy).
pub(crate) async fn connection(cluster: &EtcdCluster) -> Connection {
    Connection::connect(ConnectOptions::new(cluster.endpoints()))
        .await
        .expect("the operator connects")
}
