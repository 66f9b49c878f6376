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
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn tip() -> Tip {
        Tip {
            seq: 7,
            epoch: Epoch(40),
            nonce: Uuid::new_v4(),
        }
    }

    #[test]
    fn records_and_tips_round_trip() {
        let nonce = Uuid::new_v4();
        let event = encode_event(8, Epoch(41), nonce, b"payload");
        assert_eq!(event.len(), RECORD_HEADER + 7);
        assert_eq!(
            decode_record(b"k/r/8", Some(8), &event).unwrap(),
            Record::Event(Event {
                seq: 8,
                epoch: Epoch(41),
                payload: b"payload".to_vec(),
                nonce,
                keyed: None,
            })
        );
        for previous in [None, Some(tip())] {
            let fence = encode_fence(8, Epoch(41), nonce, previous);
            assert_eq!(
                decode_record(b"k", None, &fence).unwrap(),
                Record::Fence(Fence {
                    seq: 8,
                    epoch: Epoch(41),
                    previous,
                    nonce
                })
            );
        }
        let t = tip();
        assert_eq!(decode_tip(b"t", &encode_tip(&t)).unwrap(), t);
        assert_eq!(
            decode_record(b"k", None, &encode_event(1, Epoch(1), nonce, b""))
                .unwrap()
                .seq(),
            1
        );
    }

    fn keyed(part: u32, parts: u32) -> Keyed {
        Keyed {
            key: IdempotencyKey::new("request-1"),
            part,
            parts,
        }
    }

    #[test]
    fn a_keyed_event_is_version_2_and_names_its_whole_append() {
        let nonce = Uuid::new_v4();
        let value = encode_keyed_event(9, Epoch(41), nonce, keyed(1, 3), b"payload");
        assert_eq!(value[0], 2);
        assert_eq!(value.len(), RECORD_HEADER + KEYED_PART + 7);
        let Record::Event(event) = decode_record(b"k/r/9", Some(9), &value).unwrap() else {
            panic!("an event")
        };
        assert_eq!(event.payload, b"payload");
        assert_eq!(
            event.idempotency_key(),
            Some(IdempotencyKey::new("request-1"))
        );
        assert_eq!(event.keyed_append(), Some((8, 10)));
        // Unkeyed events and fences stay version 1, as every release reads them.
        assert_eq!(encode_event(9, Epoch(41), nonce, b"")[0], 1);
        assert_eq!(encode_fence(9, Epoch(41), nonce, None)[0], 1);
        let plain = decode_record(b"k", None, &encode_event(9, Epoch(41), nonce, b""));
        let Ok(Record::Event(plain)) = plain else {
            panic!()
        };
        assert_eq!(
            (plain.idempotency_key(), plain.keyed_append()),
            (None, None)
        );
    }

    #[test]
    fn a_keyed_event_that_cannot_be_one_is_a_typed_error() {
        let nonce = Uuid::new_v4();
        let bad = [
            // Its part past its parts, or before seq 1.
            encode_keyed_event(9, Epoch(1), nonce, keyed(3, 3), b""),
            encode_keyed_event(2, Epoch(1), nonce, keyed(2, 5), b""),
        ];
        for value in bad {
            let seq = u64::from_be_bytes(value[2..10].try_into().unwrap());
            assert!(decode_record(b"k", Some(seq), &value).is_err());
        }
        // A fence never has version 2.
        let mut fence = encode_fence(3, Epoch(1), nonce, None);
        fence[0] = 2;
        let error = decode_record(b"k", Some(3), &fence).unwrap_err();
        assert!(error.reason.contains("fence of version 2"), "{error}");
        // Every truncation of a keyed event's header fails.
        let good = encode_keyed_event(9, Epoch(41), nonce, keyed(0, 1), b"");
        for n in 0..good.len() {
            assert!(decode_record(b"k", Some(9), &good[..n]).is_err(), "{n}");
        }
    }

    #[test]
    fn garbage_is_a_typed_error_naming_the_key_never_a_panic() {
        let good = encode_fence(3, Epoch(9), Uuid::new_v4(), Some(tip()));
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![2],
            b"not a record at all".to_vec(),
            good[..good.len() - 1].to_vec(),
            [good.as_slice(), b"x"].concat(),
        ];
        let mut wrong_kind = good.clone();
        wrong_kind[1] = 9;
        cases.push(wrong_kind);
        // Every truncation of a valid record, too.
        for n in 0..good.len() {
            cases.push(good[..n].to_vec());
        }
        for bad in cases {
            let error =
                decode_record(b"ns/journals/s/r/00000000000000000003", Some(3), &bad).unwrap_err();
            assert_eq!(error.key, "ns/journals/s/r/00000000000000000003");
            assert!(!error.reason.is_empty());
        }
        let misplaced = decode_record(b"k", Some(4), &good).unwrap_err();
        assert!(misplaced.reason.contains("seq 3"), "{misplaced}");
        assert!(decode_tip(b"tip", b"\x01short").is_err());
        for bad in [
            &b""[..],
            b"\x01",
            b"\x02\0\0\0\0\0\0\0\x05",
            b"\x01\0\0\0\0\0\0\0\0",
        ] {
            assert_eq!(decode_base(b"base", bad).unwrap_err().key, "base");
        }
        assert_eq!(decode_base(b"base", &encode_base(7)).unwrap(), 7);
    }

    proptest::proptest! {
        /// Any bytes under a journal's prefix: a typed result, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128),
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            seq in proptest::prelude::any::<Option<u64>>(),
        ) {
            let _ = decode_record(&key, seq, &value);
            let _ = decode_tip(&key, &value);
            let _ = decode_base(&key, &value);
            let _ = seq_of_key(&key);
            let _ = Record::decode(&key, &value);
            let _ = Tip::decode(&key, &value);
        }

        /// Any record or tip round-trips.
        #[test]
        fn records_and_tips_round_trip_for_any_values(
            seq in proptest::prelude::any::<u64>(),
            epoch in proptest::prelude::any::<u64>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let nonce = Uuid::from_u64_pair(seq, epoch);
            let event = encode_event(seq, Epoch(epoch), nonce, &payload);
            let decoded = decode_record(b"k", Some(seq), &event).unwrap();
            proptest::prop_assert_eq!(decoded.seq(), seq);
            proptest::prop_assert_eq!(decoded.epoch(), Epoch(epoch));
            let tip = Tip { seq, epoch: Epoch(epoch), nonce };
            proptest::prop_assert_eq!(decode_tip(b"k", &encode_tip(&tip)).unwrap(), tip);
            let base = decode_base(b"k", &encode_base(seq));
            proptest::prop_assert_eq!(base.ok(), (seq > 0).then_some(seq));
        }
    }

    const RECORD_KEY: &[u8] = b"ns/journals/s/r/00000000000000000007";

    #[test]
    fn a_record_decodes_from_its_key_and_value() {
        let nonce = Uuid::from_u128(5);
        let event = Record::decode(RECORD_KEY, &encode_event(7, Epoch(3), nonce, b"hi")).unwrap();
        assert_eq!(
            event,
            Record::Event(Event {
                seq: 7,
                epoch: Epoch(3),
                payload: b"hi".to_vec(),
                nonce,
                keyed: None,
            })
        );
        let fence = Record::decode(RECORD_KEY, &encode_fence(7, Epoch(3), nonce, Some(tip())));
        assert!(matches!(fence, Ok(Record::Fence(Fence { seq: 7, .. }))));
        // The key's sequence number must be the record's.
        let elsewhere = Record::decode(RECORD_KEY, &encode_event(8, Epoch(3), nonce, b""));
        let error = elsewhere.unwrap_err();
        assert_eq!(error.key.as_bytes(), RECORD_KEY);
        assert!(
            error.reason.contains("seq 8 under the key of seq 7"),
            "{error}"
        );
        // Only record keys hold records.
        for key in [
            &b"ns/journals/s/tip"[..],
            b"ns/journals/s/r/",
            b"ns/journals/s/r/x",
            b"",
        ] {
            let value = encode_event(7, Epoch(3), nonce, b"");
            let error = Record::decode(key, &value).unwrap_err();
            assert_eq!(error.key.as_bytes(), key);
            assert!(error.reason.contains("not a record key"), "{error}");
        }
        // Garbage under a record key is named by its key; a key that is not UTF-8 is shown
        // lossily.
        let error = Record::decode(RECORD_KEY, b"\x03").unwrap_err();
        assert_eq!(error.reason, "unknown format version 3");
        let error = Record::decode(b"ns/journals/\xff/r/7", b"").unwrap_err();
        assert_eq!(error.key, "ns/journals/\u{fffd}/r/7");
    }

    #[test]
    fn a_tip_decodes_from_its_key_and_value() {
        let t = tip();
        assert_eq!(
            Tip::decode(b"ns/journals/s/tip", &encode_tip(&t)).unwrap(),
            t
        );
        let error = Tip::decode(b"ns/journals/s/tip", &encode_tip(&t)[1..]).unwrap_err();
        assert_eq!(error.key, "ns/journals/s/tip");
    }

    /// The fuzz target's seed corpus (`fuzz/corpus/decode_record`): one file per valid
    /// encoding, each a key length byte, the key and the value, as the target reads its input.
    fn seeds() -> Vec<(&'static str, Vec<u8>)> {
        let nonce = Uuid::from_u128(0x5eed);
        let previous = Tip {
            seq: 6,
            epoch: Epoch(2),
            nonce: Uuid::from_u128(0x7),
        };
        let seed = |key: &[u8], value: Vec<u8>| [&[key.len() as u8][..], key, &value].concat();
        let tip_key = b"ns/journals/s/tip";
        vec![
            (
                "event",
                seed(RECORD_KEY, encode_event(7, Epoch(3), nonce, b"payload")),
            ),
            (
                "event-keyed",
                seed(
                    RECORD_KEY,
                    encode_keyed_event(
                        7,
                        Epoch(3),
                        nonce,
                        Keyed {
                            key: IdempotencyKey::new("seed"),
                            part: 1,
                            parts: 2,
                        },
                        b"payload",
                    ),
                ),
            ),
            (
                "event-empty",
                seed(RECORD_KEY, encode_event(7, Epoch(3), nonce, b"")),
            ),
            (
                "fence-first",
                seed(RECORD_KEY, encode_fence(7, Epoch(3), nonce, None)),
            ),
            (
                "fence",
                seed(RECORD_KEY, encode_fence(7, Epoch(3), nonce, Some(previous))),
            ),
            ("tip", seed(tip_key, encode_tip(&previous))),
        ]
    }

    fn corpus_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode_record")
    }

    /// With `LEASEHOLD_WRITE_FUZZ_SEEDS=1` set, it writes the seed corpus first (after a
    /// change of the encoding): `LEASEHOLD_WRITE_FUZZ_SEEDS=1 cargo test --lib journal::record`.
    #[test]
    fn the_committed_fuzz_seeds_are_the_current_encodings() {
        // A packaged crate has no fuzz/: nothing to check there.
        if !Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/Cargo.toml")
            .exists()
        {
            return;
        }
        if std::env::var_os("LEASEHOLD_WRITE_FUZZ_SEEDS").is_some() {
            std::fs::create_dir_all(corpus_dir()).unwrap();
            for (name, bytes) in seeds() {
                std::fs::write(corpus_dir().join(name), bytes).unwrap();
            }
        }
        for (name, bytes) in seeds() {
            let committed = std::fs::read(corpus_dir().join(name)).unwrap_or_default();
            assert!(
                committed == bytes,
                "fuzz/corpus/decode_record/{name} is stale: run \
                 `LEASEHOLD_WRITE_FUZZ_SEEDS=1 cargo test --lib journal::record` to write it again"
            );
            let (key, value) = bytes[1..].split_at(usize::from(bytes[0]));
            assert!(Record::decode(key, value).is_ok() || Tip::decode(key, value).is_ok());
        }
    }

    #[test]
    fn sequence_numbers_come_from_record_keys() {
        assert_eq!(
            seq_of_key(b"ns/journals/s/r/00000000000000000042"),
            Some(42)
        );
        assert_eq!(seq_of_key(b"ns/journals/s/tip"), None);
    }
}
