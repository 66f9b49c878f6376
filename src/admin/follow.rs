//! [`Admin::follow`](super::Admin::follow): one journal's records as they commit, from a watch
//! that resumes after failures.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::etcd::Connection;
use crate::journal::{Record, ReplayError};

/// New records of one journal as they commit; see [`Admin::follow`](super::Admin::follow).
#[derive(Debug)]
pub struct Follow {
    receiver: mpsc::Receiver<Result<Record, ReplayError>>,
    _stop: tokio_util::sync::DropGuard,
}

impl Follow {
    /// Starts the watch of the records under `prefix` after `revision`, from `from_seq` on.
    pub(super) fn start(
        connection: Connection,
        prefix: String,
        revision: i64,
        from_seq: u64,
    ) -> Self {
        let (sender, receiver) = mpsc::channel(256);
        let stop = CancellationToken::new();
        tokio::spawn(follow(
            connection,
            prefix,
            revision,
            from_seq,
            sender,
            stop.clone(),
        ));
        Self {
            receiver,
            _stop: stop.drop_guard(),
        }
    }
}

impl Stream for Follow {
    type Item = Result<Record, ReplayError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(cx)
    }
}

/// The watch behind [`Follow`]: resumes after failures from the last revision seen.
async fn follow(
    connection: Connection,
    prefix: String,
    mut revision: i64,
    mut next_seq: u64,
    sender: mpsc::Sender<Result<Record, ReplayError>>,
    stop: CancellationToken,
) {
    // Deterministic, 100 ms doubling up to 2 s; reset by every response of a watch.
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision.saturating_add(1));
        let (client, endpoint) = connection.stream_client();
        let open = async {
            client
                .ready()
                .await?
                .watch(prefix.as_str(), Some(options))
                .await
        };
        let opened = tokio::select! {
            opened = tokio::time::timeout(Duration::from_secs(5), open) => opened,
            _ = stop.cancelled() => return,
        };
        if let Ok(Ok(mut stream)) = opened {
            loop {
                let message = tokio::select! {
                    message = stream.message() => message,
                    _ = stop.cancelled() => return,
                    _ = sender.closed() => return,
                };
                let Ok(Some(response)) = message else { break };
                if response.compact_revision() > 0 {
                    let _ = sender
                        .send(Err(ReplayError::Compacted {
                            revision: revision.saturating_add(1),
                        }))
                        .await;
                    return;
                }
                if response.canceled() {
                    break;
                }
                backoff.reset();
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    revision = revision.max(kv.mod_revision());
                    if event.event_type() != EventType::Put {
                        continue;
                    }
                    let seq = crate::journal::seq_of_key(kv.key());
                    if seq.is_none_or(|seq| seq < next_seq) {
                        continue;
                    }
                    let record = crate::journal::decode_record(kv.key(), seq, kv.value())
                        .map_err(ReplayError::Decode);
                    // After the record at `u64::MAX`, no record can follow.
                    let next = record.as_ref().ok().and_then(|r| r.seq().checked_add(1));
                    if sender.send(record).await.is_err() {
                        return;
                    }
                    match next {
                        Some(next) => next_seq = next,
                        None => return,
                    }
                }
            }
        }
        tracing::debug!(endpoint, "the journal watch stopped; resuming");
        connection.rotate();
        tokio::select! {
            _ = tokio::time::sleep(backoff.next()) => {}
            _ = stop.cancelled() => return,
        }
    }
}
