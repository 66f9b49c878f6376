//! Unit tests of `record.rs`: the codec, garbage under a journal's keys, the fuzz seeds.

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
