//! The record and tip encodings.
//!
//! Every value leasehold writes under `{ns}/journals/` is a versioned envelope:
//!
//! ```text
//! record  = version:u8 (=1) kind:u8 seq:u64 epoch:u64 nonce:[u8;16] body
//!   kind 0 (event): body = the user's payload, as is
//!   kind 1 (fence): body = has_previous:u8 [seq:u64 epoch:u64 nonce:[u8;16]]
//! record  = version:u8 (=2) kind:u8 (=0) seq:u64 epoch:u64 nonce:[u8;16]
//!           key:[u8;16] part:u32 parts:u32 body
//!   an event of an append made with an idempotency key: `key` is the key, the append has
//!   `parts` records and this is its `part`-th (from 0), `body` the payload, as is
//! tip     = version:u8 (=1) seq:u64 epoch:u64 nonce:[u8;16]
//! base    = version:u8 (=1) seq:u64
//! ```
//!
//! Integers are big-endian. `seq` repeats the key's sequence number, `epoch` is the writer's
//! lease epoch and `nonce` names the transaction that wrote the record (all records of one
//! append share it, and so does the tip it wrote): an append whose outcome is unknown is
//! resolved by reading its first record back. Version 2 is written only for the events of an
//! append with an idempotency key; everything else stays version 1, which every release
//! reads. Any one record of a keyed append names the whole append (its first sequence number
//! is `seq - part`, its last `seq - part + parts - 1`). A reader that meets a version it does
//! not know fails with a typed error naming the key; it never guesses, and never panics.

use uuid::Uuid;

use super::key::{IdempotencyKey, KEY_LEN};
use crate::lease::Epoch;

const VERSION: u8 = 1;
/// The version of a keyed event.
const VERSION_KEYED: u8 = 2;
const KIND_EVENT: u8 = 0;
const KIND_FENCE: u8 = 1;
/// version + kind + seq + epoch + nonce.
pub(crate) const RECORD_HEADER: usize = 1 + 1 + 8 + 8 + 16;
/// What a keyed event adds to the header: key + part + parts.
pub(crate) const KEYED_PART: usize = KEY_LEN + 4 + 4;
pub(crate) const TIP_LEN: usize = 1 + 8 + 8 + 16;
const BASE_LEN: usize = 1 + 8;

/// A value under a journal's prefix could not be decoded. Permanent: the bytes stay bad.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode {key}: {reason}")]
pub struct DecodeError {
    /// The key whose value is bad.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The journal's tip: the last record's sequence number, the epoch of its writer and the
/// nonce of the append that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tip {
    /// The last sequence number.
    pub seq: u64,
    /// The epoch of the append that wrote it.
    pub epoch: Epoch,
    pub(crate) nonce: Uuid,
}

impl Tip {
    /// Decodes a tip as etcd stores it under `key` (`{ns}/journals/{session}/tip`):
    ///
    /// ```text
    /// tip = version:u8 (=1) seq:u64 epoch:u64 nonce:[u8;16]
    /// ```
    ///
    /// (see [`Record::decode`]). Bad bytes are a [`DecodeError`] naming the key, never a
    /// panic.
    ///
    /// ```
    /// use leasehold::Tip;
    ///
    /// // Version 1, seq 12, epoch 7, a nonce.
    /// let mut value = vec![1];
    /// value.extend_from_slice(&12u64.to_be_bytes());
    /// value.extend_from_slice(&7u64.to_be_bytes());
    /// value.extend_from_slice(&[0xab; 16]);
    /// let tip = Tip::decode(b"leasehold/journals/0191e4a2-7c1a-7000-8000-000000000001/tip", &value)?;
    /// assert_eq!((tip.seq, tip.epoch.get()), (12, 7));
    /// # Ok::<(), leasehold::DecodeError>(())
    /// ```
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Tip, DecodeError> {
        decode_tip(key, value)
    }
}

/// A user event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Its sequence number.
    pub seq: u64,
    /// The epoch of the lease it was appended under.
    pub epoch: Epoch,
    /// The payload, as appended.
    pub payload: Vec<u8>,
    pub(crate) nonce: Uuid,
    /// The idempotency key of its append, and its place in it.
    pub(crate) keyed: Option<Keyed>,
}

/// What an event of an append made with an idempotency key carries of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keyed {
    pub(crate) key: IdempotencyKey,
    /// Its place in the append, from 0.
    pub(crate) part: u32,
    /// How many records the append has.
    pub(crate) parts: u32,
}

impl Event {
    /// The idempotency key of the append it is part of, if that append was made with one
    /// ([`Journal::append_with_key`](crate::Journal::append_with_key)).
    pub fn idempotency_key(&self) -> Option<IdempotencyKey> {
        self.keyed.map(|keyed| keyed.key)
    }

    /// The first and last sequence numbers of the keyed append it is part of (`None` for an
    /// event appended without a key).
    pub fn keyed_append(&self) -> Option<(u64, u64)> {
        let keyed = self.keyed?;
        let first = self.seq.checked_sub(u64::from(keyed.part))?;
        let last = first.checked_add(u64::from(keyed.parts).checked_sub(1)?)?;
        Some((first, last))
    }
}

/// The record an owner appends when it opens the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// Its sequence number.
    pub seq: u64,
    /// The epoch of the owner that opened the journal.
    pub epoch: Epoch,
    /// The tip it was appended at; `None` for a new journal.
    pub previous: Option<Tip>,
    pub(crate) nonce: Uuid,
}

/// One journal record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A user event.
    Event(Event),
    /// An owner's fence.
    Fence(Fence),
}

impl Record {
    /// Decodes a record as etcd stores it: `key` is its key (`{ns}/journals/{session}/r/` and
    /// the sequence number, 20 digits), `value` its value, a versioned envelope (integers
    /// big-endian):
    ///
    /// ```text
    /// record = version:u8 (=1) kind:u8 seq:u64 epoch:u64 nonce:[u8;16] body
    ///   kind 0 (event): body = the payload, as appended
    ///   kind 1 (fence): body = has_previous:u8 [seq:u64 epoch:u64 nonce:[u8;16]]
    /// ```
    ///
    /// For reading a journal's keys by hand (`etcdctl get --prefix`, a backup, a debugger);
    /// [`Store::replay_records`](crate::Store::replay_records) decodes the same way. The key
    /// must be a record key, and the record must hold the key's sequence number. Anything else
    /// is a [`DecodeError`] naming the key: decoding never panics, whatever the bytes.
    ///
    /// ```
    /// # fn main() -> Result<(), leasehold::DecodeError> {
    /// use leasehold::Record;
    ///
    /// let key = b"leasehold/journals/0191e4a2-7c1a-7000-8000-000000000001/r/00000000000000000001";
    /// // Version 1, a fence, seq 1, epoch 7, a nonce, no previous tip.
    /// let mut value = vec![1, 1];
    /// value.extend_from_slice(&1u64.to_be_bytes());
    /// value.extend_from_slice(&7u64.to_be_bytes());
    /// value.extend_from_slice(&[0xab; 16]);
    /// value.push(0);
    /// let record = Record::decode(key, &value)?;
    /// assert_eq!((record.seq(), record.epoch().get()), (1, 7));
    /// assert!(matches!(record, Record::Fence(_)));
    ///
    /// let error = Record::decode(key, b"garbage").unwrap_err();
    /// assert!(error.to_string().starts_with("cannot decode leasehold/journals/"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Record, DecodeError> {
        match seq_of_key(key) {
            Some(seq) => decode_record(key, Some(seq), value),
            None => Err(failed(key)(
                "not a record key (r/ and a 20-digit sequence number)".into(),
            )),
        }
    }

    /// The record's sequence number.
    pub fn seq(&self) -> u64 {
        match self {
            Record::Event(event) => event.seq,
            Record::Fence(fence) => fence.seq,
        }
    }

    /// The epoch it was written under.
    pub fn epoch(&self) -> Epoch {
        match self {
            Record::Event(event) => event.epoch,
            Record::Fence(fence) => fence.epoch,
        }
    }

    /// The nonce of the transaction that wrote it: records that share one were committed
    /// together (one append, or appends that group commit coalesced).
    pub fn nonce(&self) -> Uuid {
        match self {
            Record::Event(event) => event.nonce,
            Record::Fence(fence) => fence.nonce,
        }
    }
}

fn header(kind: u8, seq: u64, epoch: Epoch, nonce: Uuid, capacity: usize) -> Vec<u8> {
    versioned_header(VERSION, kind, seq, epoch, nonce, capacity)
}

fn versioned_header(
    version: u8,
    kind: u8,
    seq: u64,
    epoch: Epoch,
    nonce: Uuid,
    capacity: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER + capacity);
    out.push(version);
    out.push(kind);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&epoch.get().to_be_bytes());
    out.extend_from_slice(nonce.as_bytes());
    out
}

pub(crate) fn encode_event(seq: u64, epoch: Epoch, nonce: Uuid, payload: &[u8]) -> Vec<u8> {
    let mut out = header(KIND_EVENT, seq, epoch, nonce, payload.len());
    out.extend_from_slice(payload);
    out
}

/// An event of an append made with `key`: its `part`-th record of `parts` (version 2).
pub(crate) fn encode_keyed_event(
    seq: u64,
    epoch: Epoch,
    nonce: Uuid,
    keyed: Keyed,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = versioned_header(
        VERSION_KEYED,
        KIND_EVENT,
        seq,
        epoch,
        nonce,
        KEYED_PART + payload.len(),
    );
    out.extend_from_slice(keyed.key.as_bytes());
    out.extend_from_slice(&keyed.part.to_be_bytes());
    out.extend_from_slice(&keyed.parts.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

pub(crate) fn encode_fence(seq: u64, epoch: Epoch, nonce: Uuid, previous: Option<Tip>) -> Vec<u8> {
    let mut out = header(KIND_FENCE, seq, epoch, nonce, TIP_LEN);
    match previous {
        None => out.push(0),
        Some(tip) => {
            out.push(1);
            put_tip_body(&mut out, &tip);
        }
    }
    out
}

pub(crate) fn encode_tip(tip: &Tip) -> Vec<u8> {
    let mut out = Vec::with_capacity(TIP_LEN);
    out.push(VERSION);
    put_tip_body(&mut out, tip);
    out
}

/// The length of [`encode_fence`]'s value after `previous`, without encoding it.
pub(crate) fn fence_len(previous: Option<&Tip>) -> usize {
    // The header, a byte saying whether a tip follows, and the tip's body (no version byte).
    RECORD_HEADER + 1 + previous.map_or(0, |_| TIP_LEN - 1)
}

fn put_tip_body(out: &mut Vec<u8>, tip: &Tip) {
    out.extend_from_slice(&tip.seq.to_be_bytes());
    out.extend_from_slice(&tip.epoch.get().to_be_bytes());
    out.extend_from_slice(tip.nonce.as_bytes());
}

/// A cursor over bytes that fails with a reason instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!(
                "truncated: {what} needs {n} bytes, {} left",
                self.bytes.len()
            ));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let bytes = self.take(8, what)?;
        Ok(u64::from_be_bytes(bytes.try_into().expect("8 bytes")))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_be_bytes(bytes.try_into().expect("4 bytes")))
    }

    fn key(&mut self) -> Result<IdempotencyKey, String> {
        let bytes = self.take(KEY_LEN, "idempotency key")?;
        Ok(IdempotencyKey::from_bytes(
            bytes.try_into().expect("16 bytes"),
        ))
    }

    fn uuid(&mut self, what: &str) -> Result<Uuid, String> {
        let bytes = self.take(16, what)?;
        Ok(Uuid::from_bytes(bytes.try_into().expect("16 bytes")))
    }

    fn version(&mut self) -> Result<(), String> {
        match self.u8("version")? {
            VERSION => Ok(()),
            other => Err(format!("unknown format version {other}")),
        }
    }

    fn tip(&mut self) -> Result<Tip, String> {
        Ok(Tip {
            seq: self.u64("tip seq")?,
            epoch: Epoch(self.u64("tip epoch")?),
            nonce: self.uuid("tip nonce")?,
        })
    }

    fn finish(&self) -> Result<(), String> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.bytes.len()))
        }
    }
}

fn failed(key: &[u8]) -> impl FnOnce(String) -> DecodeError + '_ {
    move |reason| DecodeError {
        key: String::from_utf8_lossy(key).into_owned(),
        reason,
    }
}

/// Decodes the record stored under `key`; `expected_seq` is the key's own sequence number.
pub(crate) fn decode_record(
    key: &[u8],
    expected_seq: Option<u64>,
    value: &[u8],
) -> Result<Record, DecodeError> {
    let decode = || -> Result<Record, String> {
        let mut reader = Reader { bytes: value };
        let keyed = match reader.u8("version")? {
            VERSION => false,
            VERSION_KEYED => true,
            other => return Err(format!("unknown format version {other}")),
        };
        let kind = reader.u8("kind")?;
        let seq = reader.u64("seq")?;
        let epoch = Epoch(reader.u64("epoch")?);
        let nonce = reader.uuid("nonce")?;
        if let Some(expected) = expected_seq
            && expected != seq
        {
            return Err(format!("holds seq {seq} under the key of seq {expected}"));
        }
        match kind {
            KIND_EVENT => {
                let keyed = match keyed {
                    false => None,
                    true => {
                        let key = reader.key()?;
                        let (part, parts) = (reader.u32("part")?, reader.u32("parts")?);
                        if part >= parts {
                            return Err(format!("part {part} of an append of {parts} records"));
                        }
                        if u64::from(part) >= seq {
                            return Err(format!("part {part} of an append at seq {seq}"));
                        }
                        Some(Keyed { key, part, parts })
                    }
                };
                Ok(Record::Event(Event {
                    seq,
                    epoch,
                    payload: reader.bytes.to_vec(),
                    nonce,
                    keyed,
                }))
            }
            KIND_FENCE if keyed => Err("a fence of version 2".into()),
            KIND_FENCE => {
                let previous = match reader.u8("fence previous flag")? {
                    0 => None,
                    1 => Some(reader.tip()?),
                    other => return Err(format!("bad fence previous flag {other}")),
                };
                reader.finish()?;
                Ok(Record::Fence(Fence {
                    seq,
                    epoch,
                    previous,
                    nonce,
                }))
            }
            other => Err(format!("unknown record kind {other}")),
        }
    };
    decode().map_err(failed(key))
}

pub(crate) fn encode_base(seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(BASE_LEN);
    out.push(VERSION);
    out.extend_from_slice(&seq.to_be_bytes());
    debug_assert_eq!(out.len(), BASE_LEN);
    out
}

/// Decodes a base value: the first sequence number a trimmed journal keeps (at least 1).
pub(crate) fn decode_base(key: &[u8], value: &[u8]) -> Result<u64, DecodeError> {
    let decode = || -> Result<u64, String> {
        let mut reader = Reader { bytes: value };
        reader.version()?;
        let seq = reader.u64("base seq")?;
        reader.finish()?;
        if seq == 0 {
            return Err("base 0: sequence numbers start at 1".into());
        }
        Ok(seq)
    };
    decode().map_err(failed(key))
}

/// Decodes a tip value.
pub(crate) fn decode_tip(key: &[u8], value: &[u8]) -> Result<Tip, DecodeError> {
    let decode = || -> Result<Tip, String> {
        let mut reader = Reader { bytes: value };
        reader.version()?;
        let tip = reader.tip()?;
        reader.finish()?;
        Ok(tip)
    };
    decode().map_err(failed(key))
}

/// The sequence number a record key ends with.
pub(crate) fn seq_of_key(key: &[u8]) -> Option<u64> {
    let key = std::str::from_utf8(key).ok()?;
    key.rsplit_once("/r/")?.1.parse().ok()
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
