//! The `Replay` stream: a session's journal at one revision, then what commits after.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use uuid::Uuid;

use super::proto::{self, ReplayRequest, ReplayResponse};
use super::refusal::Refusal;
use crate::journal::Record;
use crate::store::Store;

/// Streams `session`'s journal at one revision, then (with `follow`) what commits after.
pub(super) async fn replay(
    store: Arc<Store>,
    session: Uuid,
    request: ReplayRequest,
    sender: mpsc::Sender<Result<ReplayResponse, Status>>,
    stop: CancellationToken,
) {
    use futures_util::StreamExt as _;
    let mut records = store.replay_records(session);
    if request.from_seq > 0 {
        records = records.from_seq(request.from_seq);
    }
    let mut next_seq = request.from_seq.max(1);
    loop {
        let record = tokio::select! {
            record = records.next() => record,
            () = sender.closed() => return,
            () = stop.cancelled() => return,
        };
        let Some(record) = record else { break };
        let record = record.map_err(|error| Refusal::of_read(&error).status());
        if let Ok(record) = &record {
            next_seq = record.seq().saturating_add(1);
        }
        if !send_record(&sender, record, request.records).await {
            return;
        }
    }
    if !request.follow {
        return;
    }
    let admin = crate::admin::Admin::new(store.connection().clone(), store.namespace().clone());
    let mut follow = admin.follow(session, records.revision(), next_seq);
    loop {
        let record = tokio::select! {
            record = follow.next() => record,
            () = sender.closed() => return,
            () = stop.cancelled() => return,
        };
        let Some(record) = record else { return };
        let record = record.map_err(|error| Refusal::of_read(&error).status());
        if !send_record(&sender, record, request.records).await {
            return;
        }
    }
}

/// Sends one record (fences only with `records`); false once the stream is over.
async fn send_record(
    sender: &mpsc::Sender<Result<ReplayResponse, Status>>,
    record: Result<Record, Status>,
    records: bool,
) -> bool {
    let message = match record {
        Err(status) => {
            let _ = sender.send(Err(status)).await;
            return false;
        }
        Ok(Record::Event(event)) => ReplayResponse {
            seq: event.seq,
            epoch: event.epoch.get(),
            kind: Some(proto::replay_response::Kind::Event(event.payload)),
        },
        Ok(Record::Fence(fence)) if records => ReplayResponse {
            seq: fence.seq,
            epoch: fence.epoch.get(),
            kind: Some(proto::replay_response::Kind::Fence(proto::Fence {
                epoch: fence.epoch.get(),
                previous_seq: fence.previous.as_ref().map_or(0, |tip| tip.seq),
                previous_epoch: fence.previous.as_ref().map_or(0, |tip| tip.epoch.get()),
            })),
        },
        Ok(Record::Fence(_)) => return true,
    };
    sender.send(Ok(message)).await.is_ok()
}
