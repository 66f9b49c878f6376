//! The sidecar scenario: `sidecar_append`.

use std::sync::Arc;
use std::time::Duration;

use leasehold::Uuid;
use leasehold::sidecar::proto::leasehold_client::LeaseholdClient;
use leasehold::sidecar::proto::{
    Acquire, AppendRequest, AttachRequest, attach_request, attach_response,
};
use leasehold::sidecar::{Sidecar, SidecarOptions};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::Channel;

use super::{Bench, Better, Rounds};
use crate::cli::Failure;

impl Bench {
    /// Appends through `leasehold serve`'s service (a tonic client over loopback TCP, each call
    /// with a request id) vs in-process `Journal::append` on the same store: one after the
    /// other, then 64 concurrent callers on one journal each way.
    pub(super) async fn sidecar_append(&self) -> Result<(), Failure> {
        const PER: usize = 200;
        const CALLERS: usize = 64;
        const EACH: usize = 20;
        let store = Arc::new(self.store("bench-sidecar", 10).await?);
        let (_lease, journal) = self.journal(&store).await?;
        let journal = Arc::new(journal);
        let sidecar = Sidecar::new(store.clone(), SidecarOptions::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Failure::runtime)?;
        let address = format!(
            "http://{}",
            listener.local_addr().map_err(Failure::runtime)?
        );
        let stop = tokio_util::sync::CancellationToken::new();
        let served = AbortOnDropHandle::new(tokio::spawn({
            let (sidecar, stop) = (sidecar.clone(), stop.clone());
            async move {
                sidecar
                    .serve_tcp(listener, None, stop.cancelled_owned())
                    .await
            }
        }));
        let client = LeaseholdClient::connect(address)
            .await
            .map_err(Failure::runtime)?;
        // The sidecar's session, owned through an Attach stream for the whole scenario.
        let session = Uuid::new_v4().to_string();
        let (requests, receiver) = tokio::sync::mpsc::channel(4);
        let _ = requests
            .send(AttachRequest {
                request: Some(attach_request::Request::Acquire(Acquire {
                    session: session.clone(),
                    wait: false,
                    wait_ms: 0,
                })),
            })
            .await;
        let mut events = client
            .clone()
            .attach(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
            .map_err(Failure::runtime)?
            .into_inner();
        let epoch = match events.message().await.map_err(Failure::runtime)? {
            Some(message) => match message.event {
                Some(attach_response::Event::Acquired(acquired)) => acquired.epoch,
                other => return Err(Failure::message(format!("attach: {other:?}"), 1)),
            },
            None => return Err(Failure::message("attach: the stream ended", 1)),
        };
        let remote = Remote {
            client,
            session,
            epoch,
        };

        // etcd's count of transactions it started, to tell how many appends each carried.
        let txns = || self.etcd_txns();
        let (mut sequential, mut concurrent) = (Rounds::default(), Rounds::default());
        let mut per_txn = Rounds::default();
        let mut calls = 0usize;
        for round in 0..self.rounds {
            self.progress(format_args!(
                "sidecar_append: round {}/{}",
                round + 1,
                self.rounds
            ));
            let (mut ours, mut baseline) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..PER {
                let started = Instant::now();
                remote.append(calls).await.map_err(refused)?;
                calls += 1;
                let took = started.elapsed();
                ours += took;
                sequential.latencies.push(took);
                let started = Instant::now();
                journal
                    .append(vec![7u8; 64])
                    .await
                    .map_err(Failure::runtime)?;
                baseline += started.elapsed();
            }
            sequential.ours.push(PER as f64 / ours.as_secs_f64());
            sequential
                .baseline
                .push(PER as f64 / baseline.as_secs_f64());

            let (started, txns_before) = (Instant::now(), txns().await?);
            let tasks: Vec<_> = (0..CALLERS)
                .map(|caller| {
                    let remote = remote.clone();
                    let first = calls + caller * EACH;
                    AbortOnDropHandle::new(tokio::spawn(async move {
                        let mut latencies = Vec::with_capacity(EACH);
                        for i in 0..EACH {
                            let call = Instant::now();
                            remote.append(first + i).await?;
                            latencies.push(call.elapsed());
                        }
                        Ok::<_, tonic::Status>(latencies)
                    }))
                })
                .collect();
            for task in tasks {
                concurrent
                    .latencies
                    .extend(task.await.map_err(Failure::runtime)?.map_err(refused)?);
            }
            calls += CALLERS * EACH;
            concurrent
                .ours
                .push((CALLERS * EACH) as f64 / started.elapsed().as_secs_f64());
            let (txns_between, total) = (txns().await?, (CALLERS * EACH) as f64);
            per_txn.ours.push(total / (txns_between - txns_before));
            let (rate, _) =
                super::journal::appenders(std::iter::repeat_n(journal.clone(), CALLERS), EACH)
                    .await?;
            concurrent.baseline.push(rate);
            per_txn
                .baseline
                .push(total / (txns().await? - txns_between));
        }
        drop(requests);
        stop.cancel();
        let _ = served.await;
        store.close().await;
        self.report(
            "sidecar_append",
            "sequential",
            "appends/s",
            "in-process Journal::append",
            Better::Higher,
            sequential,
        );
        self.report(
            "sidecar_append",
            "64 concurrent callers",
            "appends/s",
            "in-process, 64 callers",
            Better::Higher,
            concurrent,
        );
        self.report(
            "sidecar_append",
            "64 callers, per txn",
            "appends/txn",
            "in-process, 64 callers",
            Better::Higher,
            per_txn,
        );
        Ok(())
    }
}

/// The sidecar's session, as a client appends to it.
#[derive(Clone)]
struct Remote {
    client: LeaseholdClient<Channel>,
    session: String,
    epoch: u64,
}

impl Remote {
    /// Appends one 64-byte event, with request id `id`.
    async fn append(&self, id: usize) -> Result<(), tonic::Status> {
        self.client
            .clone()
            .append(AppendRequest {
                session: self.session.clone(),
                epoch: self.epoch,
                payloads: vec![vec![7u8; 64]],
                request_id: id.to_string(),
            })
            .await
            .map(drop)
    }
}

fn refused(status: tonic::Status) -> Failure {
    Failure::message(format!("append through the sidecar: {status}"), 1)
}
