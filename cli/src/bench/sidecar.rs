//! The sidecar scenario: `sidecar_append`.

use std::sync::Arc;
use std::time::Duration;

use leasehold::Journal;
use leasehold::Uuid;
use leasehold::sidecar::proto::leasehold_client::LeaseholdClient;
use leasehold::sidecar::proto::{
    Acquire, AppendRequest, AttachRequest, attach_request, attach_response,
};
use leasehold::sidecar::{Sidecar, SidecarOptions};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::{Bench, Better, Rounds, timed_callers};
use crate::Failure;

impl Bench {
    /// Appends through `leasehold serve`'s service (a tonic client over loopback TCP, each call
    /// with a request id) vs in-process `Journal::append` on the same store: one after the
    /// other, then 64 concurrent callers on one journal each way.
    ///
    /// Beside them, what the request ids cost (each append of the first lines carries one, and
    /// the ownership's token): the same appends through the sidecar without a request id, one
    /// after the other (interleaved call by call) and with 64 callers (back to back, in turn
    /// first), as the baselines of two more lines.
    ///
    /// And the transport's bound: what a sidecar that cost nothing beyond its calls
    /// would reach. Each of its appends is a no-op call over the same channel (the sidecar's
    /// `grpc.health.v1.Health/Check`, answered from memory) followed by an in-process append,
    /// one after the other and with 64 callers; its ratio to in-process is the highest the
    /// sidecar's can be on this machine.
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
        let channel = Endpoint::from_shared(address)
            .map_err(Failure::runtime)?
            .connect()
            .await
            .map_err(Failure::runtime)?;
        let client = LeaseholdClient::new(channel.clone());
        let noop = Noop(HealthClient::new(channel));
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
        let (epoch, token) = match events.message().await.map_err(Failure::runtime)? {
            Some(message) => match message.event {
                Some(attach_response::Event::Acquired(acquired)) => {
                    (acquired.epoch, acquired.token)
                }
                other => return Err(Failure::message(format!("attach: {other:?}"), 1)),
            },
            None => return Err(Failure::message("attach: the stream ended", 1)),
        };
        let remote = Remote {
            client,
            session,
            epoch,
            token,
        };

        // etcd's count of transactions it started, to tell how many appends each carried.
        let txns = || self.etcd_txns();
        let (mut sequential, mut concurrent) = (Rounds::default(), Rounds::default());
        let (mut sequential_bound, mut concurrent_bound) = (Rounds::default(), Rounds::default());
        let (mut sequential_ids, mut concurrent_ids) = (Rounds::default(), Rounds::default());
        let mut concurrent_calls = Rounds::default();
        let mut per_txn = Rounds::default();
        let mut calls = 0usize;
        for round in 0..self.rounds {
            self.progress(format_args!(
                "sidecar_append: round {}/{}",
                round + 1,
                self.rounds
            ));
            let (mut ours, mut baseline, mut call, mut unkeyed) = (
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
            );
            for _ in 0..PER {
                let started = Instant::now();
                remote.append(Some(calls)).await.map_err(refused)?;
                calls += 1;
                let took = started.elapsed();
                ours += took;
                sequential.latencies.push(took);
                let started = Instant::now();
                remote.append(None).await.map_err(refused)?;
                unkeyed += started.elapsed();
                let started = Instant::now();
                journal
                    .append(vec![7u8; 64])
                    .await
                    .map_err(Failure::runtime)?;
                let appended = started.elapsed();
                baseline += appended;
                let started = Instant::now();
                noop.call().await.map_err(call_failed)?;
                let called = started.elapsed();
                call += called;
                sequential_bound.latencies.push(appended + called);
            }
            let in_process = PER as f64 / baseline.as_secs_f64();
            sequential.ours.push(PER as f64 / ours.as_secs_f64());
            sequential.baseline.push(in_process);
            sequential_bound
                .ours
                .push(PER as f64 / (baseline + call).as_secs_f64());
            sequential_bound.baseline.push(in_process);
            sequential_ids.ours.push(PER as f64 / ours.as_secs_f64());
            sequential_ids
                .baseline
                .push(PER as f64 / unkeyed.as_secs_f64());

            let txns_before = txns().await?;
            let (first, each_remote) = (calls, remote.clone());
            let append = move |caller: usize, i: usize| {
                let remote = each_remote.clone();
                async move { remote.append(Some(first + caller * EACH + i)).await }
            };
            let (rate, latencies) = timed_callers(CALLERS, EACH, append, refused).await?;
            calls += CALLERS * EACH;
            concurrent.ours.push(rate);
            concurrent.latencies.extend(latencies);
            let (txns_between, total) = (txns().await?, (CALLERS * EACH) as f64);
            per_txn.ours.push(total / (txns_between - txns_before));
            let (rate, _) =
                super::journal::appenders(std::iter::repeat_n(journal.clone(), CALLERS), EACH)
                    .await?;
            concurrent.baseline.push(rate);
            per_txn
                .baseline
                .push(total / (txns().await? - txns_between));
            let (bound, latencies) = noop.callers(Some(&journal), CALLERS, EACH).await?;
            concurrent_bound.ours.push(bound);
            concurrent_bound.baseline.push(rate);
            concurrent_bound.latencies.extend(latencies);
            let (noop_rate, latencies) = noop.callers(None, CALLERS, EACH).await?;
            concurrent_calls.ours.push(noop_rate);
            concurrent_calls.baseline.push(rate);
            concurrent_calls.latencies.extend(latencies);
            // With request ids and without, back to back, in turn first.
            for keyed in [round % 2 == 0, round % 2 == 1] {
                let (first, each_remote) = (calls, remote.clone());
                let append = move |caller: usize, i: usize| {
                    let remote = each_remote.clone();
                    let id = keyed.then_some(first + caller * EACH + i);
                    async move { remote.append(id).await }
                };
                let (rate, _) = timed_callers(CALLERS, EACH, append, refused).await?;
                calls += CALLERS * EACH;
                match keyed {
                    true => concurrent_ids.ours.push(rate),
                    false => concurrent_ids.baseline.push(rate),
                }
            }
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
            "sequential, bound",
            "appends/s",
            "in-process Journal::append",
            Better::Higher,
            sequential_bound,
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
            "64 callers, bound",
            "appends/s",
            "in-process, 64 callers",
            Better::Higher,
            concurrent_bound,
        );
        self.report(
            "sidecar_append",
            "64 callers, no-op calls",
            "calls/s",
            "in-process appends, 64 callers",
            Better::Higher,
            concurrent_calls,
        );
        self.report(
            "sidecar_append",
            "sequential, request ids",
            "appends/s",
            "the same without request ids",
            Better::Higher,
            sequential_ids,
        );
        self.report(
            "sidecar_append",
            "64 callers, request ids",
            "appends/s",
            "the same without request ids",
            Better::Higher,
            concurrent_ids,
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
    token: Vec<u8>,
}

impl Remote {
    /// Appends one 64-byte event, with request id `id` if there is one.
    async fn append(&self, id: Option<usize>) -> Result<(), tonic::Status> {
        self.client
            .clone()
            .append(AppendRequest {
                session: self.session.clone(),
                epoch: self.epoch,
                payloads: vec![vec![7u8; 64]],
                request_id: id.map_or_else(String::new, |id| id.to_string()),
                token: self.token.clone(),
            })
            .await
            .map(drop)
    }
}

/// A call that does nothing, over the sidecar's channel: what the transport alone costs.
#[derive(Clone)]
struct Noop(HealthClient<Channel>);

impl Noop {
    /// One `grpc.health.v1.Health/Check` of the whole server.
    async fn call(&self) -> Result<(), tonic::Status> {
        self.0
            .clone()
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(drop)
    }

    /// `callers` concurrent callers, each making `each` no-op calls, each followed by an
    /// in-process append of one 64-byte event to `journal` if there is one: calls/s, and the
    /// time of each call (with its append).
    async fn callers(
        &self,
        journal: Option<&Arc<Journal>>,
        callers: usize,
        each: usize,
    ) -> Result<(f64, Vec<Duration>), Failure> {
        let (noop, journal) = (self.clone(), journal.cloned());
        let call = move |_, _| {
            let (noop, journal) = (noop.clone(), journal.clone());
            async move {
                noop.call().await.map_err(Err)?;
                if let Some(journal) = journal {
                    journal.append(vec![7u8; 64]).await.map_err(Ok)?;
                }
                Ok(())
            }
        };
        timed_callers(callers, each, call, |failed| match failed {
            Ok(appending) => Failure::runtime(appending),
            Err(calling) => call_failed(calling),
        })
        .await
    }
}

fn refused(status: tonic::Status) -> Failure {
    Failure::message(format!("append through the sidecar: {status}"), 1)
}

fn call_failed(status: tonic::Status) -> Failure {
    Failure::message(
        format!("a no-op call to the sidecar (health check): {status}"),
        1,
    )
}
