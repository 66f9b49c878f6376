//! A sidecar's client, one per session: attaches, stands by until it owns the session, then
//! appends (one appender of single records, one of batches) with a request id per call, each
//! retried with the same id until it is answered; asks `Validate` whether its epoch is still
//! the owner's, as a resource outside etcd would, also for a while after the ownership ends (a
//! `current` answer counts as having seen the session valid when the call was sent: invariant 5
//! holds the sidecar's linearizable read to it); and stops at once on `Lost`, on the stream's
//! end, on a refusal or on a `Validate` that says another epoch owns the session, as the
//! sidecar's one rule says.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use leasehold::sidecar::proto::leasehold_client::LeaseholdClient;
use leasehold::sidecar::proto::{
    Acquire, AppendRequest, AttachRequest, ValidateRequest, attach_request, attach_response,
};
use leasehold::{Appended, CancellationToken, Epoch, JournalWriteError, Uuid};
use tokio::time::{Instant, sleep};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_types::StatusExt as _;

use crate::history::{Entry, History};

/// How long a call is retried with its request id before the client gives up on learning
/// its outcome.
const SETTLE: Duration = Duration::from_secs(30);

/// Owns `session` through the sidecar at `endpoint` whenever it can, until `stop`.
pub(crate) async fn run(
    node: usize,
    endpoint: String,
    session: Uuid,
    pace: Duration,
    history: Arc<History>,
    stop: CancellationToken,
) {
    let channel = Endpoint::from_shared(endpoint)
        .expect("a URL")
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy();
    let client = LeaseholdClient::new(channel);
    while !stop.is_cancelled() {
        own(node, &client, session, pace, &history, &stop).await;
        tokio::select! {
            () = sleep(Duration::from_millis(100)) => {}
            () = stop.cancelled() => {}
        }
    }
}

/// One ownership: attach, acquire, append until it ends.
async fn own(
    node: usize,
    client: &LeaseholdClient<Channel>,
    session: Uuid,
    pace: Duration,
    history: &Arc<History>,
    stop: &CancellationToken,
) {
    let (requests, receiver) = tokio::sync::mpsc::channel(4);
    let acquire = AttachRequest {
        request: Some(attach_request::Request::Acquire(Acquire {
            session: session.to_string(),
            wait: true,
            wait_ms: 0,
        })),
    };
    let _ = requests.send(acquire).await;
    let mut attaching = client.clone();
    let attached = tokio::select! {
        attached = attaching.attach(tokio_stream::wrappers::ReceiverStream::new(receiver)) => attached,
        () = stop.cancelled() => return,
    };
    let Ok(events) = attached else { return };
    let mut events = events.into_inner();
    let (epoch, token) = loop {
        let message = tokio::select! {
            message = events.message() => message,
            () = stop.cancelled() => return,
        };
        match message {
            Ok(Some(message)) => match message.event {
                Some(attach_response::Event::Acquired(acquired)) => {
                    break (acquired.epoch, acquired.token);
                }
                Some(attach_response::Event::Failed(_)) => return,
                _ => continue,
            },
            _ => return,
        }
    };
    history.note(Entry::Acquired {
        at: Instant::now(),
        node,
        session,
        epoch: Epoch(epoch),
    });
    // Cancelled on a loss, the stream's end, a refusal, or the campaign's end.
    let owned = CancellationToken::new();
    let watch = async {
        tokio::select! {
            () = async {
                loop {
                    match events.message().await {
                        Ok(Some(message)) => match message.event {
                            Some(attach_response::Event::Lost(_) | attach_response::Event::Released(_)) => return,
                            _ => continue,
                        },
                        _ => return,
                    }
                }
            } => {}
            () = stop.cancelled() => {}
            () = owned.cancelled() => {}
        }
        owned.cancel();
    };
    let append = |max_batch| {
        let ownership = Ownership {
            session,
            epoch,
            token: token.clone(),
        };
        appender(
            node, client, ownership, max_batch, pace, history, &owned, stop,
        )
    };
    let validate = validator(node, client, session, epoch, pace, history, &owned);
    tokio::join!(watch, append(1), append(5), validate);
    history.note(Entry::Ended {
        at: Instant::now(),
        node,
        session,
        epoch: Epoch(epoch),
    });
    // Dropping the stream releases the session.
    drop(requests);
}

/// What a client holds of an ownership: the session, its epoch and the token to write with.
struct Ownership {
    session: Uuid,
    epoch: u64,
    token: Vec<u8>,
}

#[allow(clippy::too_many_arguments)]
async fn appender(
    node: usize,
    client: &LeaseholdClient<Channel>,
    ownership: Ownership,
    max_batch: usize,
    pace: Duration,
    history: &Arc<History>,
    owned: &CancellationToken,
    stop: &CancellationToken,
) {
    let Ownership {
        session,
        epoch,
        token,
    } = ownership;
    let mut n = 0;
    while !owned.is_cancelled() {
        n += 1;
        let count = 1 + n % max_batch;
        let payloads = (0..count).map(|_| history.payload(session, node)).collect();
        let call = history.call(session, payloads);
        let request_id = Uuid::new_v4().to_string();
        let key = leasehold::IdempotencyKey::new(&request_id);
        let request = AppendRequest {
            session: session.to_string(),
            epoch,
            payloads: call.payloads.clone(),
            request_id,
            token: token.clone(),
        };
        let told = settle(client, request.clone(), history, stop).await;
        let acknowledged = match &told {
            Told::Appended(appended) => Some((appended.first_seq, appended.last_seq)),
            Told::Refused | Told::Unknown => None,
        };
        history.requested(session, key, acknowledged);
        match told {
            Told::Appended(appended) => {
                call.done(&Ok(appended));
                history
                    .sidecar_ok
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n % REPEAT_EVERY == 0 {
                    // As a client whose answer was lost on its way would: the same call again,
                    // to be told the same and append nothing.
                    if let Told::Appended(again) = settle(client, request, history, stop).await {
                        history.requested(session, key, Some((again.first_seq, again.last_seq)));
                        history.repeated.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Told::Refused => {
                // Not appended, and never will be: stop acting on the session.
                call.done(&Err(JournalWriteError::Closed));
                owned.cancel();
            }
            Told::Unknown => {
                call.unknown();
                owned.cancel();
            }
        }
        sleep(pace).await;
    }
}

/// Every this many calls, an acknowledged one is sent again with its request id.
const REPEAT_EVERY: usize = 8;

/// How long an ended ownership's epoch is still asked about, as a resource outside etcd would be
/// by the old owner's late requests.
const LATE: Duration = Duration::from_secs(2);

/// Asks the sidecar whether `epoch` still owns `session`, every few paces, while it is owned;
/// a `current` answer is noted as the session seen valid at the call's sending (the read
/// behind it came after that, so a later epoch acquired before then means a stale read). An
/// answer naming another owner ends the ownership. Once it has ended, a task goes on asking for
/// [`LATE`]: a `current` answer then must also predate any later epoch.
async fn validator(
    node: usize,
    client: &LeaseholdClient<Channel>,
    session: Uuid,
    epoch: u64,
    pace: Duration,
    history: &Arc<History>,
    owned: &CancellationToken,
) {
    let ask = Asker {
        node,
        client: client.clone(),
        session,
        epoch,
        history: history.clone(),
    };
    while !owned.is_cancelled() {
        tokio::select! {
            current = ask.current() => if current == Some(false) {
                // Another epoch owns the session, or nobody: stop acting on it.
                owned.cancel();
            },
            () = owned.cancelled() => break,
        }
        tokio::select! {
            () = sleep(pace * 4) => {}
            () = owned.cancelled() => break,
        }
    }
    tokio::spawn(async move {
        let ended = Instant::now();
        while ended.elapsed() < LATE {
            if ask.current().await == Some(true) {
                ask.history.validated_late.fetch_add(1, Ordering::Relaxed);
            }
            sleep(pace * 4).await;
        }
    });
}

/// One epoch's `Validate` calls.
struct Asker {
    node: usize,
    client: LeaseholdClient<Channel>,
    session: Uuid,
    epoch: u64,
    history: Arc<History>,
}

impl Asker {
    /// Whether the epoch is current (noted as seen valid when it is); `None` if the call failed.
    async fn current(&self) -> Option<bool> {
        let sent = Instant::now();
        let mut call = tonic::Request::new(ValidateRequest {
            session: self.session.to_string(),
            epoch: self.epoch,
        });
        call.set_timeout(Duration::from_secs(2));
        let answer = self.client.clone().validate(call).await.ok()?.into_inner();
        if answer.current {
            let epoch = Epoch(self.epoch);
            self.history
                .seen_valid_at(self.session, epoch, self.node, sent);
            self.history.validated.fetch_add(1, Ordering::Relaxed);
        }
        Some(answer.current)
    }
}

enum Told {
    Appended(Appended),
    Refused,
    Unknown,
}

/// Sends `request` until it is answered for good: appended, or refused (FAILED_PRECONDITION,
/// INVALID_ARGUMENT). A timeout, a lost connection, OUTCOME_UNKNOWN and ETCD_UNAVAILABLE are
/// retried with the same request id, which the sidecar answers exactly once. Unknown if that
/// takes longer than [`SETTLE`], or the campaign ends first.
async fn settle(
    client: &LeaseholdClient<Channel>,
    request: AppendRequest,
    history: &History,
    stop: &CancellationToken,
) -> Told {
    let deadline = Instant::now() + SETTLE;
    for attempt in 0.. {
        let mut call = tonic::Request::new(request.clone());
        call.set_timeout(Duration::from_secs(2));
        match client.clone().append(call).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                if attempt > 0 {
                    history.retried_ok.fetch_add(1, Ordering::Relaxed);
                }
                return Told::Appended(Appended {
                    first_seq: answer.first_seq,
                    last_seq: answer.last_seq,
                    revision: answer.revision,
                });
            }
            Err(status) => {
                let leasehold = status
                    .get_details_error_info()
                    .is_some_and(|info| info.domain == leasehold::sidecar::DOMAIN);
                if leasehold
                    && matches!(
                        status.code(),
                        Code::FailedPrecondition | Code::InvalidArgument
                    )
                {
                    if attempt > 0 {
                        history.retried_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    return Told::Refused;
                }
                // Anything else may have appended, or may yet: ask again.
            }
        }
        if Instant::now() >= deadline || stop.is_cancelled() {
            return Told::Unknown;
        }
        sleep(Duration::from_millis(100)).await;
    }
    unreachable!("attempts go on until one returns")
}
