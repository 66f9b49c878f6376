//! [`JournalLimits`] (etcd's limits, checked before each append) and [`ReplayOptions`].

/// etcd's limits, as the journal checks them before sending, and how many append
/// transactions a store keeps in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalLimits {
    /// etcd's `--max-txn-ops` (default 128): operations per transaction branch. At least
    /// [`MIN_TXN_OPS`]: an append compares three keys.
    pub max_txn_ops: usize,
    /// etcd's `--max-request-bytes` (default 1.5 MiB).
    pub max_request_bytes: usize,
    /// Kept free below `max_request_bytes` for etcd's own wrapping (at least 1 KiB).
    pub headroom: usize,
    /// The most append transactions a store has in flight together (default 8, at least 1,
    /// at most [`MAX_IN_FLIGHT`]).
    /// Appends of its journals that arrive while all are in flight wait, and the next free
    /// one takes them together, in one transaction (see the [journal docs](super)).
    pub in_flight: usize,
    /// The most idempotency keys a store's open journals hold together (default 1,000,000):
    /// each append made with [`Journal::append_with_key`](crate::Journal::append_with_key)
    /// takes one until its journal is dropped (about 50 bytes of memory), so that a retry of
    /// it, however late, is never appended again. Past it, such appends are refused with
    /// [`KeysExhausted`](crate::JournalWriteError::KeysExhausted) until journals close.
    pub max_keys: usize,
}

/// The smallest `--max-txn-ops` an append fits in: its compares (three: the tip, the owner
/// key, the first record's absence).
pub const MIN_TXN_OPS: usize = super::cas::APPEND_COMPARES;

/// The largest `in_flight` a store takes: as many transactions as a semaphore counts
/// (`usize::MAX >> 3`).
pub const MAX_IN_FLIGHT: usize = tokio::sync::Semaphore::MAX_PERMITS;

impl Default for JournalLimits {
    fn default() -> Self {
        Self {
            max_txn_ops: 128,
            max_request_bytes: 1_572_864,
            headroom: 1024,
            in_flight: 8,
            max_keys: 1_000_000,
        }
    }
}

impl JournalLimits {
    /// Sets etcd's `--max-txn-ops`.
    pub fn with_max_txn_ops(mut self, ops: usize) -> Self {
        self.max_txn_ops = ops;
        self
    }

    /// Sets etcd's `--max-request-bytes`.
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// Sets the room kept free for etcd's own wrapping (at least 1 KiB counts).
    pub fn with_headroom(mut self, bytes: usize) -> Self {
        self.headroom = bytes;
        self
    }

    /// Sets how many append transactions a store has in flight together.
    pub fn with_in_flight(mut self, transactions: usize) -> Self {
        self.in_flight = transactions;
        self
    }

    /// Sets how many idempotency keys a store's open journals hold together.
    pub fn with_max_keys(mut self, keys: usize) -> Self {
        self.max_keys = keys;
        self
    }

    /// Whether an append fits these limits at all, and one can be sent.
    pub(crate) fn usable(&self) -> bool {
        self.max_txn_ops >= MIN_TXN_OPS && (1..=MAX_IN_FLIGHT).contains(&self.in_flight)
    }

    /// The most records one append takes: the tip is one more put.
    pub fn max_records(&self) -> usize {
        self.max_txn_ops.saturating_sub(1)
    }

    /// The largest encoded append accepted.
    pub fn max_bytes(&self) -> usize {
        self.max_request_bytes
            .saturating_sub(self.headroom.max(1024))
    }
}

/// How replays page through a journal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// The most records one page holds.
    pub page_records: usize,
    /// The most bytes one page should hold (etcd-client decodes at most 4 MiB per reply).
    pub page_bytes: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            page_records: 1000,
            page_bytes: 2 * 1024 * 1024,
        }
    }
}

impl ReplayOptions {
    /// Sets the most records one page holds.
    pub fn with_page_records(mut self, records: usize) -> Self {
        self.page_records = records;
        self
    }

    /// Sets the most bytes one page should hold.
    pub fn with_page_bytes(mut self, bytes: usize) -> Self {
        self.page_bytes = bytes;
        self
    }
}
