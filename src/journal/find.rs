//! Finding an append by its idempotency key in a journal's own records.
//!
//! Every record of an append made with a key carries the key and its place in the append (see
//! the [encoding](super#encoding)), so the journal itself says whether such an append is in
//! it, for anyone who asks, with no memory of the process that made it.
//!
//! [`Store::find_append`](crate::Store::find_append) reads, at one linearizable revision, the
//! session's owner key, the journal's tip and base, then the records back from the tip, one
//! bounded page at a time, passing over the records of later epochs, until it meets the
//! key (its append's records are read back and compared with the caller's payloads) or the
//! fence of the append's epoch (the epoch's records are all read: the key is not among them).
//! Records of an epoch form one run, after its fence, so the read stops there. Its cost: one
//! read for the owner, tip and base, then one page for every 1,000 records (fewer when records
//! are large) from the tip back to the key or the epoch's fence.
//!
//! The key's records are there: [`Found::Appended`], with the append's sequence numbers and
//! the revision it committed at. The epoch's records are read to its fence without the key:
//! if the owner key no longer has that epoch, no transaction of the epoch can apply any more
//! (every append compares the owner key's `create_revision`, and a revision never comes back),
//! so the append never applied and never will ([`Found::NotAppended`]); while the owner key
//! still has it, the epoch's owner may still append it ([`Unknowable::StillOwned`]). The read
//! reaches the journal's base before the epoch's fence: records that may have held it were
//! trimmed ([`Unknowable::Trimmed`]), or the epoch never fenced this journal and may have
//! written an earlier one since deleted ([`Unknowable::NoFence`]).

use etcd_client::{GetOptions, KvClient, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use uuid::Uuid;

use super::key::IdempotencyKey;
use super::record::{Record, decode_record, decode_tip, seq_of_key};
use super::replay::{etcd_limit, page_limit};
use super::retention::{base_of, first_record};
use super::{Appended, ReplayError, ReplayOptions};
use crate::etcd::Connection;
use crate::keys::Namespace;
use crate::lease::Epoch;

/// What a journal's records say of an append made with an idempotency key (see
/// [`Store::find_append`](crate::Store::find_append)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Found {
    /// Its records are in the journal: where, and the revision it committed at.
    Appended(Appended),
    /// Its records are not in the journal, and no transaction can put them there any more:
    /// the session's owner key no longer has the append's epoch.
    NotAppended,
    /// Records with the key hold other payloads: the key names another append.
    Reused {
        /// That append's first sequence number.
        first_seq: u64,
        /// Its last.
        last_seq: u64,
    },
    /// The journal cannot tell, and says why.
    Unknown(Unknowable),
}

/// Why a journal cannot tell whether an append is in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unknowable {
    /// The session is still owned at the append's epoch, and the epoch's records do not hold
    /// the key: its owner may yet append it. Asking again once the ownership ends tells.
    StillOwned,
    /// Records of the epoch were trimmed: the append may have been among them. For good.
    Trimmed,
    /// The epoch's fence is not in the journal: it never opened this journal, or wrote one
    /// that was deleted since. For good.
    NoFence,
}

impl std::fmt::Display for Unknowable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unknowable::StillOwned => {
                "the session is still owned at that epoch, and its records do not hold the key: \
                 they may yet"
            }
            Unknowable::Trimmed => "records of that epoch were trimmed",
            Unknowable::NoFence => {
                "that epoch's fence is not in the journal (it never opened it, or the journal \
                 was deleted since)"
            }
        })
    }
}

/// Finds the append of `session`'s journal made under `epoch` with `key` (see the module
/// docs), comparing its records with `payloads`.
pub(crate) async fn find<P: AsRef<[u8]>>(
    connection: &Connection,
    namespace: &Namespace,
    session: Uuid,
    epoch: Epoch,
    key: IdempotencyKey,
    payloads: &[P],
) -> Result<Found, ReplayError> {
    let start = Start::read(connection, namespace, session).await?;
    let Some(tip) = start.tip else {
        // No journal: no fence of the epoch either.
        return Ok(start.absent_unless_owned(epoch, Unknowable::NoFence));
    };
    let options = ReplayOptions::default();
    let mut largest = None;
    let mut cap = options.page_records;
    let mut high = tip;
    loop {
        let limit = page_limit(largest, options.page_bytes, cap);
        let page = match records_down(
            connection,
            namespace,
            session,
            (start.base, high),
            limit,
            start.revision,
        )
        .await
        {
            Ok(page) => page,
            // Records larger than those seen so far: the same page again, smaller.
            Err(ReplayError::Etcd(error)) if error.is_reply_too_large() && limit > 1 => {
                cap = (limit / 2).max(1);
                continue;
            }
            Err(error) => return Err(error),
        };
        for (record, size, _) in &page {
            largest = Some(largest.map_or(*size, |l: usize| l.max(*size)));
            match record {
                // A later epoch's record: the epoch's run is further down.
                record if record.epoch() > epoch => {}
                // Past the epoch's run, or at its fence: the key is not in it.
                record if record.epoch() < epoch => {
                    return Ok(start.absent_unless_owned(epoch, Unknowable::StillOwned));
                }
                Record::Fence(_) => {
                    return Ok(start.absent_unless_owned(epoch, Unknowable::StillOwned));
                }
                Record::Event(event) if event.idempotency_key() == Some(key) => {
                    let (first, last) = event.keyed_append().expect("a keyed event");
                    return read_append(
                        connection,
                        namespace,
                        session,
                        key,
                        (first, last),
                        payloads,
                        start.revision,
                    )
                    .await;
                }
                Record::Event(_) => {}
            }
        }
        match page.last() {
            Some((record, _, _)) if record.seq() > start.base => high = record.seq() - 1,
            // Down to the base without the epoch's fence.
            _ if start.base > 1 => return Ok(Found::Unknown(Unknowable::Trimmed)),
            _ => return Ok(Found::Unknown(Unknowable::NoFence)),
        }
    }
}

/// What one linearizable read found before the records: its revision, the owner key's epoch,
/// the journal's tip and base.
struct Start {
    revision: i64,
    owner: Option<Epoch>,
    tip: Option<u64>,
    base: u64,
}

impl Start {
    async fn read(
        connection: &Connection,
        namespace: &Namespace,
        session: Uuid,
    ) -> Result<Start, ReplayError> {
        let keys = [
            namespace.owner_key(session),
            namespace.tip_key(session),
            namespace.base_key(session),
        ];
        let prefix = namespace.records_prefix(session);
        let response = connection
            .read("find append", |mut client: KvClient, _| {
                let gets = keys.iter().map(|key| TxnOp::get(key.as_str(), None));
                let txn =
                    Txn::new().and_then(gets.chain([first_record(&prefix)]).collect::<Vec<_>>());
                async move { client.txn(txn).await }
            })
            .await
            .map_err(ReplayError::Etcd)?;
        let mut gets = response.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
        let (owner, tip, base, first) = (
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
        );
        let tip = tip
            .map(|kv| decode_tip(kv.key(), kv.value()))
            .transpose()
            .map_err(ReplayError::Decode)?;
        Ok(Start {
            revision: response.header().map_or(0, |h| h.revision()),
            owner: owner.map(|kv| Epoch::from_revision(kv.create_revision())),
            tip: tip.map(|tip| tip.seq),
            base: base_of(base.as_ref(), first.as_ref()).map_err(ReplayError::Decode)?,
        })
    }

    /// The append is not in the journal: never, unless the session is still owned at its
    /// epoch (`otherwise`: why the journal cannot tell).
    fn absent_unless_owned(&self, epoch: Epoch, otherwise: Unknowable) -> Found {
        match self.owner {
            Some(owner) if owner == epoch => Found::Unknown(Unknowable::StillOwned),
            _ if otherwise == Unknowable::StillOwned => Found::NotAppended,
            _ => Found::Unknown(otherwise),
        }
    }
}

/// Up to `limit` records of `session`'s journal from `high` down to `low`, at `revision`,
/// decoded, each with its size and revision (see [`decoded`]).
async fn records_down(
    connection: &Connection,
    namespace: &Namespace,
    session: Uuid,
    (low, high): (u64, u64),
    limit: usize,
    revision: i64,
) -> Result<Vec<(Record, usize, i64)>, ReplayError> {
    let (from, to) = (
        namespace.record_key(session, low),
        namespace.record_key(session, high.saturating_add(1)),
    );
    let response = connection
        .read("find append", |mut client: KvClient, _| {
            let options = GetOptions::new()
                .with_range(to.as_str())
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_limit(etcd_limit(limit))
                .with_revision(revision);
            let from = from.clone();
            async move { client.get(from, Some(options)).await }
        })
        .await
        .map_err(ReplayError::reading_at(revision))?;
    decoded(response.kvs())
}

/// Each record of `kvs`, decoded, with its size and the revision it was written at.
fn decoded(kvs: &[etcd_client::KeyValue]) -> Result<Vec<(Record, usize, i64)>, ReplayError> {
    kvs.iter()
        .map(|kv| {
            let record = decode_record(kv.key(), seq_of_key(kv.key()), kv.value())
                .map_err(ReplayError::Decode)?;
            Ok((record, kv.key().len() + kv.value().len(), kv.mod_revision()))
        })
        .collect()
}

/// The append of `key` at `first..=last`, read back at `revision` (0: now, linearizable) and
/// compared with `payloads`: the append, or another append's records under the key. Records
/// trimmed away are not compared; none left at all is [`Unknowable::Trimmed`].
pub(crate) async fn read_append<P: AsRef<[u8]>>(
    connection: &Connection,
    namespace: &Namespace,
    session: Uuid,
    key: IdempotencyKey,
    (first, last): (u64, u64),
    payloads: &[P],
    revision: i64,
) -> Result<Found, ReplayError> {
    let (from, to) = (
        namespace.record_key(session, first),
        namespace.record_key(session, last.saturating_add(1)),
    );
    let response = connection
        .read("find append", |mut client: KvClient, _| {
            let mut options = GetOptions::new().with_range(to.as_str());
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let from = from.clone();
            async move { client.get(from, Some(options)).await }
        })
        .await
        .map_err(ReplayError::reading_at(revision))?;
    let records = decoded(response.kvs())?;
    let reused = Found::Reused {
        first_seq: first,
        last_seq: last,
    };
    if last - first + 1 != payloads.len() as u64 {
        return Ok(reused);
    }
    let mut committed = None;
    for (record, _, written) in records {
        let Record::Event(event) = record else {
            return Ok(reused);
        };
        let at = usize::try_from(event.seq - first).unwrap_or(usize::MAX);
        let ours = event.idempotency_key() == Some(key)
            && event.keyed_append() == Some((first, last))
            && payloads
                .get(at)
                .is_some_and(|p| p.as_ref() == event.payload.as_slice());
        if !ours {
            return Ok(reused);
        }
        committed = Some(written);
    }
    Ok(match committed {
        Some(revision) => Found::Appended(Appended {
            first_seq: first,
            last_seq: last,
            revision,
        }),
        None => Found::Unknown(Unknowable::Trimmed),
    })
}
