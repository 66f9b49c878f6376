//! Streaming replay at one fixed revision, one bounded page at a time.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use etcd_client::{GetOptions, KvClient, Txn, TxnOp, TxnOpResponse};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, Stream};

use super::ReplayOptions;
use super::record::{Record, decode_record, seq_of_key};
use super::retention::{base_of, first_record};
use crate::etcd::Connection;
use crate::journal::ReplayError;

struct Page {
    revision: i64,
    /// The base at the snapshot revision, read with the first page.
    base: Option<u64>,
    kvs: Vec<(Vec<u8>, Vec<u8>)>,
    more: bool,
}

/// A journal's records in sequence order, as of one revision; a [`Stream`].
///
/// The first page fixes the snapshot revision (a linearizable read, which also reads the
/// journal's base); every later page reads at that revision. A trimmed journal's records start
/// at its [`base`](Self::base): the records below it were trimmed, not lost. (A journal trimmed
/// while etcd refused puts for space has no base key until a later trim writes it again: its
/// base is then its first record; see [`Journal::trim`](crate::Journal::trim).) Memory is bounded by one page: at most `page_records` records, and fewer when
/// records are large, so that a page stays near `page_bytes`.
pub struct Replay {
    connection: Connection,
    prefix: String,
    base_key: String,
    next_key: Vec<u8>,
    range_end: Vec<u8>,
    revision: i64,
    base: u64,
    options: ReplayOptions,
    /// The largest record seen so far; `None` before the first page.
    largest_record: Option<usize>,
    buffered: VecDeque<Record>,
    /// An error met in the middle of a page, yielded after the records before it.
    failed: Option<ReplayError>,
    /// Lowered when a page came back larger than etcd-client decodes (4 MiB).
    cap: usize,
    pending: Option<BoxFuture<'static, Result<Page, ReplayError>>>,
    done: bool,
    pages: usize,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("revision", &self.revision)
            .field("pages", &self.pages)
            .finish()
    }
}

impl Replay {
    /// A replay of the records under `prefix` (`r/` of a journal whose base is at
    /// `base_key`).
    pub(crate) fn new(
        connection: Connection,
        prefix: String,
        base_key: String,
        options: ReplayOptions,
    ) -> Self {
        Self {
            connection,
            range_end: crate::keys::prefix_end(&prefix),
            next_key: prefix.clone().into_bytes(),
            prefix,
            base_key,
            revision: 0,
            base: 1,
            options: options.clone(),
            largest_record: None,
            buffered: VecDeque::new(),
            failed: None,
            cap: options.page_records.max(1),
            pending: None,
            done: false,
            pages: 0,
        }
    }

    /// The snapshot revision, once the first page is read (0 before).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Starts at sequence number `seq` instead of the journal's first record. Call it before
    /// the first poll.
    pub fn from_seq(mut self, seq: u64) -> Self {
        if self.pages == 0 {
            self.next_key = format!("{}{seq:020}", self.prefix).into_bytes();
        }
        self
    }

    /// The journal's base at the snapshot revision, once the first page is read: its first
    /// kept sequence number (1 for a journal never trimmed, and before the first page).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// How many pages were read so far.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// The records the next page may hold: bounded by count, and by bytes given the largest
    /// record seen so far. The first page holds one record: nothing is known of sizes yet, and
    /// one record fits any reply.
    fn page_limit(&self) -> usize {
        page_limit(self.largest_record, self.options.page_bytes, self.cap)
    }

    fn fetch(&self) -> BoxFuture<'static, Result<Page, ReplayError>> {
        if self.revision == 0 {
            return self.fetch_first();
        }
        let connection = self.connection.clone();
        let (from, to, revision) = (self.next_key.clone(), self.range_end.clone(), self.revision);
        let limit = etcd_limit(self.page_limit());
        async move {
            let response = connection
                .read("replay", |mut client: KvClient, _| {
                    let mut options = GetOptions::new().with_range(to.clone()).with_limit(limit);
                    if revision > 0 {
                        options = options.with_revision(revision);
                    }
                    let from = from.clone();
                    async move { client.get(from, Some(options)).await }
                })
                .await
                .map_err(ReplayError::reading_at(revision))?;
            Ok(Page {
                revision: response.header().map_or(0, |h| h.revision()),
                base: None,
                more: response.more(),
                kvs: response
                    .kvs()
                    .iter()
                    .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                    .collect(),
            })
        }
        .boxed()
    }

    /// The first page: one linearizable transaction reads the base (the base key, and the first
    /// record for a journal without one) and the first records, and fixes the snapshot
    /// revision.
    fn fetch_first(&self) -> BoxFuture<'static, Result<Page, ReplayError>> {
        let connection = self.connection.clone();
        let (from, to, base_key, prefix) = (
            self.next_key.clone(),
            self.range_end.clone(),
            self.base_key.clone(),
            self.prefix.clone(),
        );
        let limit = etcd_limit(self.page_limit());
        async move {
            let response = connection
                .read("replay", |mut client: KvClient, _| {
                    let txn = Txn::new().and_then([
                        TxnOp::get(base_key.clone(), None),
                        first_record(&prefix),
                        TxnOp::get(
                            from.clone(),
                            Some(GetOptions::new().with_range(to.clone()).with_limit(limit)),
                        ),
                    ]);
                    async move { client.txn(txn).await }
                })
                .await
                .map_err(ReplayError::Etcd)?;
            let mut ranges = response
                .op_responses()
                .into_iter()
                .filter_map(|op| match op {
                    TxnOpResponse::Get(get) => Some(get),
                    _ => None,
                });
            let (base, first, records) = (ranges.next(), ranges.next(), ranges.next());
            let base = base_of(
                base.as_ref().and_then(|get| get.kvs().first()),
                first.as_ref().and_then(|get| get.kvs().first()),
            )
            .map(Some)
            .map_err(ReplayError::Decode)?;
            Ok(Page {
                revision: response.header().map_or(0, |h| h.revision()),
                base,
                more: records.as_ref().is_some_and(|get| get.more()),
                kvs: records
                    .map(|get| {
                        get.kvs()
                            .iter()
                            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        .boxed()
    }

    /// Buffers a page's records; an undecodable one ends the replay after the records before
    /// it.
    fn take_page(&mut self, page: Page) {
        self.pages += 1;
        if self.revision == 0 {
            self.revision = page.revision;
        }
        if let Some(base) = page.base {
            self.base = base;
        }
        if let Some((last, _)) = page.kvs.last() {
            let mut next = last.clone();
            next.push(0);
            self.next_key = next;
        }
        self.done = !page.more || page.kvs.is_empty();
        for (key, value) in page.kvs {
            let size = key.len() + value.len();
            self.largest_record = Some(self.largest_record.map_or(size, |l| l.max(size)));
            let decoded = match seq_of_key(&key) {
                Some(seq) => decode_record(&key, Some(seq), &value),
                None => Err(super::DecodeError {
                    key: String::from_utf8_lossy(&key).into_owned(),
                    reason: "not a record key (r/ and a 20-digit sequence number)".into(),
                }),
            };
            match decoded {
                Ok(record) => self.buffered.push_back(record),
                Err(error) => {
                    self.failed = Some(ReplayError::Decode(error));
                    self.done = true;
                    return;
                }
            }
        }
    }
}

impl Stream for Replay {
    type Item = Result<Record, ReplayError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(record) = self.buffered.pop_front() {
                return Poll::Ready(Some(Ok(record)));
            }
            if let Some(error) = self.failed.take() {
                return Poll::Ready(Some(Err(error)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if self.pending.is_none() {
                self.pending = Some(self.fetch());
            }
            let page = match self.pending.as_mut().expect("set above").poll_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(page) => page,
            };
            self.pending = None;
            match page {
                Ok(page) => self.take_page(page),
                // Records larger than those seen so far made the reply too large to decode:
                // read the same page again, smaller.
                Err(ReplayError::Etcd(error))
                    if error.is_reply_too_large() && self.page_limit() > 1 =>
                {
                    self.cap = (self.page_limit() / 2).max(1);
                }
                Err(error) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(error)));
                }
            }
        }
    }
}

/// [`Replay::page_limit`]: at least 1 and at most `cap` (or 1).
pub(super) fn page_limit(largest_record: Option<usize>, page_bytes: usize, cap: usize) -> usize {
    let Some(largest) = largest_record else {
        return 1;
    };
    (page_bytes / largest.max(1)).clamp(1, cap.max(1))
}

/// A page limit as etcd takes it (an `i64`, where 0 or less means no limit): at most
/// `i64::MAX`.
pub(super) fn etcd_limit(records: usize) -> i64 {
    i64::try_from(records).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any replay options: every page asks etcd for at least one record and at most
        /// `page_records`, never for "no limit".
        #[test]
        fn any_replay_options_page_within_bounds(
            page_records in proptest::prelude::any::<usize>(),
            page_bytes in proptest::prelude::any::<usize>(),
            largest in proptest::option::of(proptest::prelude::any::<usize>()),
        ) {
            let options = ReplayOptions::default()
                .with_page_records(page_records)
                .with_page_bytes(page_bytes);
            // As `Replay::new` caps it, and as a too large reply halves it.
            for cap in [options.page_records.max(1), (options.page_records / 2).max(1)] {
                let limit = etcd_limit(page_limit(largest, options.page_bytes, cap));
                proptest::prop_assert!(limit >= 1);
                proptest::prop_assert!(limit as u128 <= page_records.max(1) as u128);
            }
        }
    }
}
