//! What a call of the queue is: its records, where its answer goes, and what it is told.

use tokio::sync::oneshot;
use uuid::Uuid;

use crate::journal::key::IdempotencyKey;
use crate::journal::keyed::Ticket;
use crate::journal::record::{self, Keyed, Tip};
use crate::journal::{Appended, JournalWriteError};
use crate::lease::Epoch;

/// What an append call is told, whether only the resolving read settled its transaction's
/// outcome, and whether etcd answered NOSPACE a transaction it applied (for the metrics).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) result: Result<Appended, JournalWriteError>,
    pub(crate) by_read: bool,
    pub(crate) for_space: bool,
}

impl Answer {
    pub(super) fn refused(error: JournalWriteError) -> Self {
        Self {
            result: Err(error),
            by_read: false,
            for_space: false,
        }
    }
}

/// A call waiting for a transaction: its records, and where its answer goes (with its key's
/// ticket, for the first call of an idempotency key).
pub(super) struct Call {
    pub(super) records: Records,
    pub(super) reply: oneshot::Sender<Answer>,
    pub(super) ticket: Option<Ticket>,
}

impl Call {
    pub(super) fn new(records: Records, reply: oneshot::Sender<Answer>) -> Self {
        Self {
            records,
            reply,
            ticket: None,
        }
    }

    /// Tells the call (and its key's waiting calls) what it came to.
    pub(super) fn answer(mut self, answer: Answer) {
        if let Some(ticket) = self.ticket.take() {
            ticket.answer(&answer.result);
        }
        // A caller that went away meanwhile no longer needs its answer.
        let _ = self.reply.send(answer);
    }

    /// A transaction took it.
    pub(super) fn sent(&mut self) {
        if let Some(ticket) = &mut self.ticket {
            ticket.sent();
        }
    }
}

/// What a call appends.
pub(super) enum Records {
    /// One event per payload.
    Events(Vec<Vec<u8>>),
    /// One event per payload, each carrying the append's idempotency key and its place in it.
    Keyed(IdempotencyKey, Vec<Vec<u8>>),
    /// The journal's fence after the tip it names (`None`: no records yet): the first append
    /// of a journal being opened, alone in its journal's append.
    Fence(Option<Tip>),
}

impl Records {
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Events(payloads) | Self::Keyed(_, payloads) => payloads.len(),
            Self::Fence(_) => 1,
        }
    }

    pub(super) fn is_fence(&self) -> bool {
        matches!(self, Self::Fence(_))
    }

    /// The length of each record's encoded value.
    pub(super) fn value_lens(&self) -> impl Iterator<Item = usize> + '_ {
        let (events, header, fence) = match self {
            Self::Events(payloads) => (payloads.as_slice(), record::RECORD_HEADER, None),
            Self::Keyed(_, payloads) => (
                payloads.as_slice(),
                record::RECORD_HEADER + record::KEYED_PART,
                None,
            ),
            Self::Fence(previous) => ([].as_slice(), 0, Some(record::fence_len(previous.as_ref()))),
        };
        let events = events.iter().map(move |p| header + p.len());
        events.chain(fence)
    }

    /// The encoded values, from `first_seq` on, written with `nonce` at `epoch`.
    pub(super) fn encode(&self, first_seq: u64, epoch: Epoch, nonce: Uuid) -> Vec<Vec<u8>> {
        match self {
            Self::Events(payloads) => payloads
                .iter()
                .zip(first_seq..)
                .map(|(payload, seq)| record::encode_event(seq, epoch, nonce, payload))
                .collect(),
            Self::Keyed(key, payloads) => {
                // Within one transaction's limits: far fewer than u32::MAX records.
                let parts = u32::try_from(payloads.len()).unwrap_or(u32::MAX);
                payloads
                    .iter()
                    .zip(first_seq..)
                    .zip(0..)
                    .map(|((payload, seq), part)| {
                        let keyed = Keyed {
                            key: *key,
                            part,
                            parts,
                        };
                        record::encode_keyed_event(seq, epoch, nonce, keyed, payload)
                    })
                    .collect()
            }
            Self::Fence(previous) => vec![record::encode_fence(first_seq, epoch, nonce, *previous)],
        }
    }
}
