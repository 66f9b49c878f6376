//! Paged reads of a whole prefix at one revision.

use etcd_client::{GetOptions, KvClient};

use super::connection::Connection;
use super::error::EtcdError;
use crate::keys::prefix_end;

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
        const PAGE: i64 = 1000;
        let range_end = prefix_end(prefix);
        let mut from = prefix.as_bytes().to_vec();
        let mut revision = revision.max(0);
        let mut all = Vec::new();
        loop {
            let response = self
                .read(operation, |mut client: KvClient, _| {
                    let mut options = GetOptions::new()
                        .with_range(range_end.clone())
                        .with_limit(PAGE);
                    if revision > 0 {
                        options = options.with_revision(revision);
                    }
                    let from = from.clone();
                    async move { client.get(from, Some(options)).await }
                })
                .await?;
            if revision == 0 {
                revision = response.header().map_or(0, |h| h.revision());
            }
            let kvs = response.kvs();
            all.extend_from_slice(kvs);
            match kvs.last() {
                Some(last) if response.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok((all, revision)),
            }
        }
    }
}
