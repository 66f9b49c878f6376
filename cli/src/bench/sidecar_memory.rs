//! The sidecar's memory: `sidecar_memory`.

use std::process::Stdio;
use std::time::Duration;

use leasehold::Uuid;
use leasehold::sidecar::proto::leasehold_client::LeaseholdClient;
use leasehold::sidecar::proto::{
    Acquire, AppendRequest, AttachRequest, attach_request, attach_response,
};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tonic::transport::{Channel, Endpoint};

use super::{Bench, Better, Rounds, timed_callers};
use crate::Failure;

/// Streams the scenario attaches, and the sessions each owns.
const STREAMS: usize = 64;
const PER_STREAM: usize = 16;
/// Appends with a request id of their own, unless `--scale-sessions`; and their callers.
pub(super) const REQUEST_IDS: usize = 50_000;
const CALLERS: usize = 64;

/// The defaults the memory at defaults is computed for (`leasehold serve --help`).
const DEFAULT_SESSIONS: f64 = 16_384.0;
const DEFAULT_REQUEST_IDS: f64 = 1_000_000.0;
const DEFAULT_BYTES_IN_FLIGHT: f64 = 64.0 * 1024.0 * 1024.0;

/// A `leasehold serve` of this binary, as a process of its own.
struct Serve {
    child: tokio::process::Child,
    address: String,
}

impl Serve {
    async fn start(bench: &Bench) -> Result<Self, Failure> {
        let binary = std::env::current_exe().map_err(Failure::runtime)?;
        let mut child = tokio::process::Command::new(binary)
            .args(["--endpoints", &bench.endpoints.join(",")])
            .args(["--namespace", bench.namespace.as_str()])
            .args([
                "--node",
                "bench-sidecar",
                "serve",
                "--listen",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(Failure::runtime)?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let address = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split("serving leasehold.v1.Leasehold on ").nth(1) {
                    return rest.split(',').next().map(str::to_owned);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| Failure::message("leasehold serve did not serve within 30 s", 1))?;
        // Its later lines are not read: drained, so that it never blocks on them.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { child, address })
    }

    /// Its resident memory, in bytes.
    fn resident(&self) -> Result<f64, Failure> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| Failure::message("leasehold serve ended", 1))?;
        let statm =
            std::fs::read_to_string(format!("/proc/{pid}/statm")).map_err(Failure::runtime)?;
        let pages: f64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|pages| pages.parse().ok())
            .ok_or_else(|| Failure::message(format!("cannot read /proc/{pid}/statm"), 1))?;
        Ok(pages * 4096.0)
    }
}

/// One owned session, as its client holds it.
#[derive(Clone)]
struct Ownership {
    session: String,
    epoch: u64,
    token: Vec<u8>,
}

impl Bench {
    /// `leasehold serve` at its defaults, in a process of its own: its resident memory when
    /// started, then per owned session (64 Attach streams of 16 sessions each), then per
    /// request id (`ids` appends of one 16-byte record, each with a request id of its own,
    /// 64 callers at once), each against a budget; and the memory it needs at its defaults,
    /// computed from them: 16,384 sessions, 1,000,000 request ids and 64 MiB of payloads in
    /// flight.
    pub(super) async fn sidecar_memory(&self, ids: usize) -> Result<(), Failure> {
        let each = ids.div_ceil(CALLERS);
        let mut serve = Serve::start(self).await?;
        let channel = Endpoint::from_shared(format!("http://{}", serve.address))
            .map_err(Failure::runtime)?
            .connect()
            .await
            .map_err(Failure::runtime)?;
        let client = LeaseholdClient::new(channel);
        // Settled after its first connection.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = serve.resident()?;

        self.progress(format_args!(
            "sidecar_memory: {STREAMS} streams of {PER_STREAM} sessions"
        ));
        let mut streams = Vec::new();
        let mut owned = Vec::new();
        for _ in 0..STREAMS {
            let (requests, ownerships) = attach(&client, PER_STREAM).await?;
            streams.push(requests);
            owned.extend(ownerships);
        }
        let sessions = owned.len() as f64;
        let with_sessions = serve.resident()?;
        let per_session = (with_sessions - started) / sessions;

        self.progress(format_args!(
            "sidecar_memory: {ids} appends, each with a request id of its own"
        ));
        let (first, owned) = (Uuid::new_v4(), std::sync::Arc::new(owned));
        let append = move |caller: usize, i: usize| {
            let (mut client, owned) = (client.clone(), owned.clone());
            async move {
                let n = caller * each + i;
                let ownership = &owned[n % owned.len()];
                client
                    .append(AppendRequest {
                        session: ownership.session.clone(),
                        epoch: ownership.epoch,
                        token: ownership.token.clone(),
                        payloads: vec![vec![7u8; 16]],
                        request_id: format!("{first}-{n}"),
                    })
                    .await
                    .map(drop)
            }
        };
        let (rate, latencies) = timed_callers(CALLERS, each, append, |status| {
            Failure::message(format!("append through the sidecar: {status}"), 1)
        })
        .await?;
        let ids = (CALLERS * each) as f64;
        let with_ids = serve.resident()?;
        let per_id = (with_ids - with_sessions) / ids;
        self.progress(format_args!(
            "sidecar_memory: {rate:.0} appends/s; resident {:.1} MiB at start, {:.1} MiB with {sessions} sessions, {:.1} MiB with {ids} request ids",
            started / MIB,
            with_sessions / MIB,
            with_ids / MIB
        ));
        drop(streams);
        let _ = serve.child.kill().await;

        let at_defaults = started
            + DEFAULT_SESSIONS * per_session
            + DEFAULT_REQUEST_IDS * per_id
            + DEFAULT_BYTES_IN_FLIGHT;
        let line = |ours: f64, budget: f64, latencies: Vec<Duration>| Rounds {
            ours: vec![ours],
            baseline: vec![budget],
            latencies,
        };
        self.report(
            "sidecar_memory",
            "resident at start",
            "MiB",
            "32 MiB budget",
            Better::Lower,
            line(started / MIB, 32.0, Vec::new()),
        );
        self.report(
            "sidecar_memory",
            "per owned session",
            "KiB",
            "8 KiB budget",
            Better::Lower,
            line(per_session / 1024.0, 8.0, Vec::new()),
        );
        self.report(
            "sidecar_memory",
            "per request id",
            "bytes",
            "64 bytes budget",
            Better::Lower,
            line(per_id, 64.0, latencies),
        );
        self.report(
            "sidecar_memory",
            "at its defaults",
            "MiB",
            "512 MiB budget",
            Better::Lower,
            line(at_defaults / MIB, 512.0, Vec::new()),
        );
        Ok(())
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// An Attach stream owning `sessions` new sessions: the sender that keeps it open, and the
/// ownerships.
async fn attach(
    client: &LeaseholdClient<Channel>,
    sessions: usize,
) -> Result<(tokio::sync::mpsc::Sender<AttachRequest>, Vec<Ownership>), Failure> {
    let (requests, receiver) = tokio::sync::mpsc::channel(sessions + 1);
    for _ in 0..sessions {
        let acquire = Acquire {
            session: Uuid::new_v4().to_string(),
            wait: false,
            wait_ms: 0,
        };
        let request = AttachRequest {
            request: Some(attach_request::Request::Acquire(acquire)),
        };
        requests.send(request).await.map_err(Failure::runtime)?;
    }
    let mut events = client
        .clone()
        .attach(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .map_err(Failure::runtime)?
        .into_inner();
    let mut owned = Vec::with_capacity(sessions);
    while owned.len() < sessions {
        match events.message().await.map_err(Failure::runtime)? {
            Some(message) => match message.event {
                Some(attach_response::Event::Acquired(acquired)) => owned.push(Ownership {
                    session: acquired.session,
                    epoch: acquired.epoch,
                    token: acquired.token,
                }),
                other => return Err(Failure::message(format!("attach: {other:?}"), 1)),
            },
            None => return Err(Failure::message("attach: the stream ended", 1)),
        }
    }
    // The events that come later (none, unless a loss) are read and dropped.
    tokio::spawn(async move { while let Ok(Some(_)) = events.message().await {} });
    Ok((requests, owned))
}
