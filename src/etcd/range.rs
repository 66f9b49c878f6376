//! Paged reads of a whole prefix at one revision.
//!
//! etcd counts every key left in a range for each page it serves (its reply says how many
//! there are), so paging one large range costs time quadratic in its size: 1.9 s over 100,000
//! owner keys, 213 s over 1,000,000 (etcd 3.5). A prefix that does not fit in one page is
//! therefore read as 16 ranges, split at the first byte after the prefix (`1` … `9`, `a` …
//! `f`: session ids and store ids are UUIDs in hex), each paged on its own at the same
//! revision: each page counts only what is left of its range.

use etcd_client::{GetOptions, KvClient};

use super::connection::Connection;
use super::error::EtcdError;
use crate::keys::prefix_end;

/// Keys per page: far below etcd-client's 4 MiB reply limit with the largest owner values.
const PAGE: i64 = 1000;

/// Where the 16 ranges of a prefix split: after the prefix, these first bytes start a range.
const SPLITS: &[u8; 15] = b"123456789abcdef";

impl Connection {
    /// Every key-value under `prefix` at one revision (the first page's, linearizable), read
    /// page by page so that each reply stays far below etcd-client's 4 MiB limit; with that
    /// revision.
    pub(crate) async fn range_at_one_revision(
        &self,
        operation: &'static str,
        prefix: &str,
    ) -> Result<(Vec<etcd_client::KeyValue>, i64), EtcdError> {
        self.range_at(operation, prefix, 0).await
    }

    /// [`range_at_one_revision`](Self::range_at_one_revision) at `revision` (0: the latest).
    pub(crate) async fn range_at(
        &self,
        operation: &'static str,
        prefix: &str,
        revision: i64,
    ) -> Result<(Vec<etcd_client::KeyValue>, i64), EtcdError> {
        let end = prefix_end(prefix);
        let mut all = Vec::new();
        // The first page of the whole prefix: most prefixes fit in it.
        let (more, revision) = self
            .page(
                operation,
                prefix.as_bytes().to_vec(),
                &end,
                revision,
                &mut all,
            )
            .await?;
        let Some(from) = more else {
            return Ok((all, revision));
        };
        // The rest, range by range, each from where the one before left off.
        let mut bounds: Vec<Vec<u8>> = SPLITS
            .iter()
            .map(|split| [prefix.as_bytes(), &[*split]].concat())
            .collect();
        bounds.push(end);
        let mut start = from;
        for bound in bounds {
            while start < bound {
                match self
                    .page(operation, start.clone(), &bound, revision, &mut all)
                    .await?
                    .0
                {
                    Some(next) => start = next,
                    None => start = bound.clone(),
                }
            }
        }
        Ok((all, revision))
    }

    /// One page of `[from, end)` at `revision` (0: the latest, linearizable) appended to `all`:
    /// where the next page starts if the range holds more, and the revision read at.
    async fn page(
        &self,
        operation: &'static str,
        from: Vec<u8>,
        end: &[u8],
        revision: i64,
        all: &mut Vec<etcd_client::KeyValue>,
    ) -> Result<(Option<Vec<u8>>, i64), EtcdError> {
        let response = self
            .read(operation, |mut client: KvClient, _| {
                let mut options = GetOptions::new().with_range(end.to_vec()).with_limit(PAGE);
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                let from = from.clone();
                async move { client.get(from, Some(options)).await }
            })
            .await?;
        let revision = match revision {
            0 => response.header().map_or(0, |h| h.revision()),
            revision => revision,
        };
        let kvs = response.kvs();
        all.extend_from_slice(kvs);
        let next = match kvs.last() {
            Some(last) if response.more() => {
                let mut next = last.key().to_vec();
                next.push(0);
                Some(next)
            }
            _ => None,
        };
        Ok((next, revision))
    }
}
