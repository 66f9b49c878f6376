//! The sidecar's tests' helpers: a sidecar served on loopback, an `Attach` stream, requests and
//! what their refusals say.

use std::sync::Arc;
use std::time::Duration;

use leasehold::Store;
use leasehold::sidecar::proto::leasehold_client::LeaseholdClient;
use leasehold::sidecar::proto::{
    Acquire, Acquired, AppendRequest, AttachRequest, AttachResponse, Release, ReplayRequest,
    ReplayResponse, attach_request, attach_response, replay_response,
};
use leasehold::sidecar::{DOMAIN, Sidecar, SidecarOptions};
use leasehold::testing::FaultProxy;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

/// A sidecar over `store`, served on a loopback port; and a client of it.
pub(crate) struct Served {
    pub(crate) sidecar: Sidecar,
    pub(crate) client: LeaseholdClient<Channel>,
    pub(crate) address: String,
    stop: tokio_util::sync::CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

impl Served {
    pub(crate) async fn start(store: Store) -> Self {
        Self::start_with(store, SidecarOptions::default()).await
    }

    /// A sidecar over `store` with `options`.
    pub(crate) async fn start_with(store: Store, options: SidecarOptions) -> Self {
        let sidecar = Sidecar::new(Arc::new(store), options);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let stop = tokio_util::sync::CancellationToken::new();
        let served = tokio::spawn({
            let (sidecar, stop) = (sidecar.clone(), stop.clone());
            async move {
                sidecar
                    .serve_tcp(listener, None, stop.cancelled_owned())
                    .await
                    .expect("serves");
            }
        });
        let client = LeaseholdClient::connect(address.clone()).await.unwrap();
        Self {
            sidecar,
            client,
            address,
            stop,
            served,
        }
    }

    /// A sidecar whose store reaches `etcd` through a fault proxy (returned), with a node
    /// lease of `ttl` seconds.
    pub(crate) async fn behind_proxy(etcd: &super::Etcd, ttl: u64) -> (FaultProxy, Self) {
        let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
        let store = super::store(&[proxy.endpoint()], &etcd.ns, "sidecar", ttl).await;
        (proxy, Self::start(store).await)
    }

    /// Another client, on a connection of its own.
    pub(crate) async fn client(&self) -> LeaseholdClient<Channel> {
        LeaseholdClient::connect(self.address.clone())
            .await
            .unwrap()
    }

    pub(crate) async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.served)
            .await
            .expect("the server stops once its streams end")
            .unwrap();
        self.sidecar.store().close().await;
    }
}

/// One client's `Attach` stream.
pub(crate) struct Attached {
    pub(crate) requests: mpsc::Sender<AttachRequest>,
    pub(crate) responses: tonic::Streaming<AttachResponse>,
}

impl Attached {
    pub(crate) async fn open(client: &mut LeaseholdClient<Channel>) -> Self {
        let (requests, receiver) = mpsc::channel(16);
        let responses = client
            .attach(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
            .expect("attached")
            .into_inner();
        Self {
            requests,
            responses,
        }
    }

    pub(crate) async fn acquire(
        &mut self,
        session: &str,
        wait: Option<u32>,
    ) -> attach_response::Event {
        self.send(attach_request::Request::Acquire(Acquire {
            session: session.to_owned(),
            wait: wait.is_some(),
            wait_ms: wait.unwrap_or(0),
        }))
        .await;
        self.next().await
    }

    pub(crate) async fn release(&mut self, session: &str) -> attach_response::Event {
        self.send(attach_request::Request::Release(Release {
            session: session.to_owned(),
        }))
        .await;
        self.next().await
    }

    pub(crate) async fn send(&self, request: attach_request::Request) {
        self.requests
            .send(AttachRequest {
                request: Some(request),
            })
            .await
            .expect("the stream is open");
    }

    /// The next event, within 10 s.
    pub(crate) async fn next(&mut self) -> attach_response::Event {
        let message = tokio::time::timeout(Duration::from_secs(10), self.responses.message())
            .await
            .expect("an event within 10 s")
            .expect("no error")
            .expect("the stream goes on");
        message.event.expect("an event")
    }
}

pub(crate) fn acquired(event: attach_response::Event) -> Acquired {
    match event {
        attach_response::Event::Acquired(acquired) => acquired,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// An append for the ownership `owned` (its session, epoch and token).
pub(crate) fn append(owned: &Acquired, payloads: &[&str], request_id: &str) -> AppendRequest {
    append_as(
        &owned.session,
        owned.epoch,
        &owned.token,
        payloads,
        request_id,
    )
}

/// An append under `session`, `epoch` and `token`, whoever's they are.
pub(crate) fn append_as(
    session: &str,
    epoch: u64,
    token: &[u8],
    payloads: &[&str],
    request_id: &str,
) -> AppendRequest {
    AppendRequest {
        session: session.to_owned(),
        epoch,
        payloads: payloads.iter().map(|p| p.as_bytes().to_vec()).collect(),
        request_id: request_id.to_owned(),
        token: token.to_vec(),
    }
}

/// The status's ErrorInfo reason (domain checked) and one metadata value.
pub(crate) fn reason(
    status: &tonic::Status,
) -> (String, std::collections::HashMap<String, String>) {
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("an ErrorInfo in {status:?}"));
    assert_eq!(info.domain, DOMAIN);
    (info.reason, info.metadata)
}

pub(crate) async fn replay(
    client: &mut LeaseholdClient<Channel>,
    session: &str,
    records: bool,
) -> Vec<ReplayResponse> {
    let mut stream = client
        .replay(ReplayRequest {
            session: session.to_owned(),
            from_seq: 0,
            records,
            follow: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut all = Vec::new();
    while let Some(record) = stream.message().await.unwrap() {
        all.push(record);
    }
    all
}

pub(crate) fn events(records: &[ReplayResponse]) -> Vec<(u64, String)> {
    records
        .iter()
        .filter_map(|r| match &r.kind {
            Some(replay_response::Kind::Event(payload)) => {
                Some((r.seq, String::from_utf8_lossy(payload).into_owned()))
            }
            _ => None,
        })
        .collect()
}
