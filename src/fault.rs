//! [`FaultProxy`]: a TCP proxy on loopback between one client and etcd, with faults on demand,
//! for tests, demos and chaos drills. (`leasehold::testing` re-exports it.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

/// What the proxy does to traffic; see [`FaultProxy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward everything.
    Pass,
    /// Move no bytes either way; hold them until the mode changes.
    Blackhole,
    /// Forward requests; discard replies.
    DropReplies,
    /// Forward requests; hold replies until the mode changes: a member that answers late.
    HoldReplies,
    /// Close every connection, and each new one at once.
    Reject,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

/// A TCP proxy on loopback between one client and etcd, with network faults on demand.
///
/// Point one node's client at [`FaultProxy::endpoint`] instead of etcd, and that node alone
/// can be cut off while the others keep their direct connections. The faults:
///
/// | mode | new connections | bytes client → etcd | bytes etcd → client |
/// | --- | --- | --- | --- |
/// | [`Pass`](ProxyMode::Pass) | proxied | forwarded | forwarded |
/// | [`Blackhole`](ProxyMode::Blackhole) | accepted, silent | held | held |
/// | [`DropReplies`](ProxyMode::DropReplies) | proxied | forwarded | discarded |
/// | [`HoldReplies`](ProxyMode::HoldReplies) | proxied | forwarded | held |
/// | [`Reject`](ProxyMode::Reject) | closed at once | connections closed | connections closed |
///
/// A blackhole behaves like a network partition that TCP rides out: bytes are held, not lost,
/// and flow again in order on [`heal`](FaultProxy::heal). Holding replies does so one way:
/// etcd answers every request and the client hears each answer late (after its timeout, for
/// requests it has given up on by then). Dropping replies lets requests reach
/// etcd (and commit) while the client never hears back: the "outcome unknown" case. A
/// connection that lost bytes can never be trusted again, so leaving `DropReplies` closes every
/// connection that dropped anything. [`cut`](FaultProxy::cut) closes the open connections once
/// and lets new ones through: a blip.
///
/// One fault aims at single requests rather than the whole link:
/// [`reject_requests_containing`](FaultProxy::reject_requests_containing) closes the
/// connection that carries a request with given bytes (a key, say) before forwarding it. etcd
/// never sees that request, the client sees its connection lost (an unknown outcome), and every
/// other request goes through: e.g. one key's deletes fail while the rest of the node works.
///
/// The proxy stops, closing every connection, when dropped.
pub struct FaultProxy {
    local: SocketAddr,
    upstream: String,
    mode: watch::Sender<ProxyMode>,
    filter: watch::Sender<Option<Vec<u8>>>,
    /// How many requests the filter has matched.
    matched: Arc<AtomicUsize>,
    connections: Arc<Mutex<JoinSet<()>>>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("endpoint", &self.endpoint())
            .field("upstream", &self.upstream)
            .field("mode", &self.mode())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream`, an etcd client URL (`http://host:port`) or `host:port`.
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let local = listener.local_addr()?;
        let (mode, _) = watch::channel(ProxyMode::Pass);
        let (filter, _) = watch::channel(None);
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let matched = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream.clone(),
            mode.clone(),
            (filter.clone(), matched.clone()),
            connections.clone(),
        ));
        Ok(Self {
            local,
            upstream,
            mode,
            filter,
            matched,
            connections,
            accept,
        })
    }

    /// The URL a client should use, e.g. `http://127.0.0.1:41234`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.local)
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// Switches to `mode` (see [`FaultProxy`] for what each does).
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
        tracing::debug!(proxy = %self.local, ?mode, "fault proxy mode");
    }

    /// Holds all bytes both ways: a partition.
    pub fn blackhole(&self) {
        self.set_mode(ProxyMode::Blackhole);
    }

    /// Lets requests through and discards replies.
    pub fn drop_replies(&self) {
        self.set_mode(ProxyMode::DropReplies);
    }

    /// Lets requests through and holds replies until healed.
    pub fn hold_replies(&self) {
        self.set_mode(ProxyMode::HoldReplies);
    }

    /// Closes every connection and refuses new ones until healed.
    pub fn reject(&self) {
        self.set_mode(ProxyMode::Reject);
    }

    /// Back to [`ProxyMode::Pass`]; held bytes flow, connections that dropped bytes close.
    pub fn heal(&self) {
        self.set_mode(ProxyMode::Pass);
    }

    /// From now on, closes the connection of any request whose bytes contain `pattern`
    /// (e.g. a key), before forwarding it. An empty pattern matches nothing.
    pub fn reject_requests_containing(&self, pattern: impl Into<Vec<u8>>) {
        let pattern = pattern.into();
        tracing::debug!(proxy = %self.local, pattern = %String::from_utf8_lossy(&pattern), "fault proxy request filter");
        self.filter
            .send_replace(Some(pattern).filter(|p| !p.is_empty()));
    }

    /// Lets every request through again.
    pub fn clear_request_filter(&self) {
        self.filter.send_replace(None);
    }

    /// How many requests [`reject_requests_containing`](Self::reject_requests_containing)
    /// has cut so far: each one a send that etcd never saw.
    pub fn requests_rejected(&self) -> usize {
        self.matched.load(Ordering::SeqCst)
    }

    /// Closes every open connection once; new connections are proxied as the mode says.
    pub fn cut(&self) {
        crate::sync::lock(&self.connections).abort_all();
    }

    /// The number of connections open through the proxy.
    pub fn open_connections(&self) -> usize {
        let mut connections = crate::sync::lock(&self.connections);
        while connections.try_join_next().is_some() {}
        connections.len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        crate::sync::lock(&self.connections).abort_all();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    mode: watch::Sender<ProxyMode>,
    (filter, matched): (watch::Sender<Option<Vec<u8>>>, Arc<AtomicUsize>),
    connections: Arc<Mutex<JoinSet<()>>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *mode.borrow() == ProxyMode::Reject {
            drop(client);
            continue;
        }
        let mut connections = crate::sync::lock(&connections);
        while connections.try_join_next().is_some() {}
        connections.spawn(proxy_connection(
            client,
            upstream.clone(),
            mode.subscribe(),
            Filter {
                pattern: filter.subscribe(),
                matched: matched.clone(),
            },
        ));
    }
}

async fn proxy_connection(
    client: TcpStream,
    upstream: String,
    mut mode: watch::Receiver<ProxyMode>,
    filter: Filter,
) {
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let tainted = Arc::new(AtomicBool::new(false));
    let kill = Notify::new();
    let requests = pump(
        client_read,
        server_write,
        Direction::Request,
        mode.clone(),
        Some((filter, &kill)),
        tainted.clone(),
    );
    let replies = pump(
        server_read,
        client_write,
        Direction::Reply,
        mode.clone(),
        None,
        tainted.clone(),
    );
    let supervise = async {
        // A connection that lost bytes is closed as soon as the mode stops dropping them.
        loop {
            let changed = tokio::select! {
                changed = mode.changed() => changed,
                // A filtered request: close the connection without forwarding it.
                _ = kill.notified() => return,
            };
            if changed.is_err() {
                return;
            }
            let now = *mode.borrow_and_update();
            if now == ProxyMode::Reject
                || (now != ProxyMode::DropReplies && tainted.load(Ordering::SeqCst))
            {
                return;
            }
        }
    };
    // Whichever ends first ends the connection; dropping the halves closes both sockets.
    tokio::select! {
        _ = async { tokio::join!(requests, replies) } => {}
        _ = supervise => {}
    }
}

/// A connection's view of the request filter: the pattern, and the count of its matches.
struct Filter {
    pattern: watch::Receiver<Option<Vec<u8>>>,
    matched: Arc<AtomicUsize>,
}

/// Moves bytes one way as the mode allows, until either side closes. Requests are checked
/// against the filter, if one is given: a match notifies `kill` instead of being forwarded.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    mut mode: watch::Receiver<ProxyMode>,
    filter: Option<(Filter, &Notify)>,
    tainted: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    // The last bytes forwarded, so that a pattern split across two reads is still found.
    let mut carry: Vec<u8> = Vec::new();
    loop {
        // Read only while bytes may move; a blackhole holds them in the kernel's buffers.
        if !wait_while_held(&mut mode, direction).await {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            // Re-check the mode before reading on (read is cancel-safe: nothing is lost).
            _ = mode.changed() => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Bytes read just before a blackhole began are held until it ends.
        if !wait_while_held(&mut mode, direction).await {
            return;
        }
        if direction == Direction::Reply && *mode.borrow() == ProxyMode::DropReplies {
            tainted.store(true, Ordering::SeqCst);
            continue;
        }
        if let Some((filter, kill)) = &filter {
            let pattern = filter.pattern.borrow().clone();
            if let Some(pattern) = pattern {
                carry.extend_from_slice(&buffer[..n]);
                if carry
                    .windows(pattern.len())
                    .any(|w| w == pattern.as_slice())
                {
                    filter.matched.fetch_add(1, Ordering::SeqCst);
                    kill.notify_one();
                    return;
                }
                let keep = carry.len().min(pattern.len() - 1);
                carry.drain(..carry.len() - keep);
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits while the mode holds bytes going in `direction`; false when the connection must
/// close.
async fn wait_while_held(mode: &mut watch::Receiver<ProxyMode>, direction: Direction) -> bool {
    loop {
        match *mode.borrow_and_update() {
            ProxyMode::Blackhole => {}
            ProxyMode::HoldReplies if direction == Direction::Reply => {}
            ProxyMode::Reject => return false,
            ProxyMode::Pass | ProxyMode::DropReplies | ProxyMode::HoldReplies => return true,
        }
        if mode.changed().await.is_err() {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// An echo server that also reports every byte it received.
    async fn echo_server() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen, received) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 {
                            break;
                        }
                        let _ = seen.send(buffer[..n].to_vec());
                        if socket.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (addr, received)
    }

    async fn read_some(socket: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut buffer = [0u8; 1024];
        match tokio::time::timeout(within, socket.read(&mut buffer)).await {
            Ok(Ok(n)) => Some(buffer[..n].to_vec()),
            Ok(Err(_)) => Some(Vec::new()),
            Err(_) => None,
        }
    }

    const SHORT: Duration = Duration::from_millis(200);
    const LONG: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn pass_forwards_both_ways() {
        let (server, _) = echo_server().await;
        let proxy = FaultProxy::start(&server.to_string()).await.unwrap();
        let mut client = TcpStream::connect(proxy.local).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        assert_eq!(read_some(&mut client, LONG).await.unwrap(), b"ping");
        assert_eq!(proxy.open_connections(), 1);
    }

    #[tokio::test]
    async fn held_replies_come_late_and_in_order_while_requests_go_through() {
        let (server, mut received) = echo_server().await;
        let proxy = FaultProxy::start(&server.to_string()).await.unwrap();
        let mut client = TcpStream::connect(proxy.local).await.unwrap();
        proxy.hold_replies();
        client.write_all(b"a").await.unwrap();
        assert_eq!(
            received.recv().await.unwrap(),
            b"a",
            "the request went through"
        );
        client.write_all(b"b").await.unwrap();
        assert_eq!(received.recv().await.unwrap(), b"b");
        assert_eq!(read_some(&mut client, SHORT).await, None, "no reply yet");

        proxy.heal();
        let mut echoed = Vec::new();
        while echoed.len() < 2 {
            echoed.extend(read_some(&mut client, LONG).await.unwrap());
        }
        assert_eq!(echoed, b"ab");
        assert_eq!(
            proxy.open_connections(),
            1,
            "nothing was lost: the connection stays"
        );
    }

    #[tokio::test]
    async fn blackhole_holds_bytes_and_heal_delivers_them_in_order() {
        let (server, mut received) = echo_server().await;
        let proxy = FaultProxy::start(&format!("http://{server}"))
            .await
            .unwrap();
        let mut client = TcpStream::connect(proxy.local).await.unwrap();
        client.write_all(b"a").await.unwrap();
        assert_eq!(read_some(&mut client, LONG).await.unwrap(), b"a");
        received.recv().await.unwrap();

        proxy.blackhole();
        client.write_all(b"bc").await.unwrap();
        assert_eq!(read_some(&mut client, SHORT).await, None, "no reply");
        assert!(received.try_recv().is_err(), "nothing reached the server");

        proxy.heal();
        let mut echoed = Vec::new();
        while echoed.len() < 2 {
            echoed.extend(read_some(&mut client, LONG).await.unwrap());
        }
        assert_eq!(echoed, b"bc");
    }

    #[tokio::test]
    async fn drop_replies_delivers_requests_and_heal_closes_the_connection() {
        let (server, mut received) = echo_server().await;
        let proxy = FaultProxy::start(&server.to_string()).await.unwrap();
        let mut client = TcpStream::connect(proxy.local).await.unwrap();
        proxy.drop_replies();
        client.write_all(b"put").await.unwrap();
        assert_eq!(
            received.recv().await.unwrap(),
            b"put",
            "the request arrived"
        );
        assert_eq!(
            read_some(&mut client, SHORT).await,
            None,
            "its reply did not"
        );

        proxy.heal();
        assert_eq!(
            read_some(&mut client, LONG).await.unwrap(),
            b"",
            "a connection that lost bytes is closed"
        );
        let mut fresh = TcpStream::connect(proxy.local).await.unwrap();
        fresh.write_all(b"again").await.unwrap();
        assert_eq!(read_some(&mut fresh, LONG).await.unwrap(), b"again");
    }

    #[tokio::test]
    async fn reject_closes_open_and_new_connections() {
        let (server, _) = echo_server().await;
        let proxy = FaultProxy::start(&server.to_string()).await.unwrap();
        let mut open = TcpStream::connect(proxy.local).await.unwrap();
        open.write_all(b"x").await.unwrap();
        read_some(&mut open, LONG).await.unwrap();

        proxy.reject();
        assert_eq!(read_some(&mut open, LONG).await.unwrap(), b"");
        let mut new = TcpStream::connect(proxy.local).await.unwrap();
        assert_eq!(read_some(&mut new, LONG).await.unwrap(), b"");

        proxy.heal();
        let mut healed = TcpStream::connect(proxy.local).await.unwrap();
        healed.write_all(b"y").await.unwrap();
        assert_eq!(read_some(&mut healed, LONG).await.unwrap(), b"y");
    }

    #[tokio::test]
    async fn a_filtered_request_closes_its_connection_unforwarded() {
        let (server, mut received) = echo_server().await;
        let proxy = FaultProxy::start(&server.to_string()).await.unwrap();
        proxy.reject_requests_containing("secret-key");
        let mut client = TcpStream::connect(proxy.local).await.unwrap();
        client.write_all(b"harmless").await.unwrap();
        assert_eq!(read_some(&mut client, LONG).await.unwrap(), b"harmless");
        received.recv().await.unwrap();
        // Split across two writes: still found.
        client.write_all(b"put secret-").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.write_all(b"key now").await.unwrap();
        let mut echoed = Vec::new();
        loop {
            let chunk = read_some(&mut client, LONG).await.unwrap();
            if chunk.is_empty() {
                break;
            }
            echoed.extend(chunk);
        }
        assert_eq!(
            echoed, b"put secret-",
            "only the bytes before the match went through"
        );
        assert_eq!(received.recv().await.unwrap(), b"put secret-");
        assert!(
            received.try_recv().is_err(),
            "the matching bytes never arrived"
        );

        proxy.clear_request_filter();
        let mut fresh = TcpStream::connect(proxy.local).await.unwrap();
        fresh.write_all(b"secret-key").await.unwrap();
        assert_eq!(read_some(&mut fresh, LONG).await.unwrap(), b"secret-key");
    }

    #[tokio::test]
    async fn cut_closes_open_connections_once() {
        let (server, _) = echo_server().await;
        let proxy = FaultProxy::start(&server.to_string()).await.unwrap();
        let mut open = TcpStream::connect(proxy.local).await.unwrap();
        open.write_all(b"x").await.unwrap();
        read_some(&mut open, LONG).await.unwrap();

        proxy.cut();
        assert_eq!(read_some(&mut open, LONG).await.unwrap(), b"");
        let mut next = TcpStream::connect(proxy.local).await.unwrap();
        next.write_all(b"z").await.unwrap();
        assert_eq!(read_some(&mut next, LONG).await.unwrap(), b"z");
    }
}
