//! Decoding what lies under a journal's prefix never panics, and what it accepts is consistent.
//!
//! The input is one byte `n`, then the key (the next `n` bytes, fewer if the input ends there),
//! then the value (the rest). The seeds in `corpus/decode_record` are valid records and a tip in
//! that form (written by `LEASEHOLD_WRITE_FUZZ_SEEDS=1 cargo test --lib journal::record`).
#![no_main]

use leasehold::{Record, Tip};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&n, rest)) = input.split_first() else {
        return;
    };
    let (key, value) = rest.split_at(usize::from(n).min(rest.len()));
    let shown = String::from_utf8_lossy(key);

    match Record::decode(key, value) {
        // A record is accepted only under the key of its own sequence number.
        Ok(record) => {
            let (_, seq) = shown.rsplit_once("/r/").expect("a record key");
            assert_eq!(seq.parse::<u64>().ok(), Some(record.seq()));
        }
        Err(error) => {
            assert_eq!(error.key, shown);
            assert!(!error.reason.is_empty());
        }
    }
    match Tip::decode(key, value) {
        Ok(_) => assert_eq!(value.len(), 1 + 8 + 8 + 16),
        Err(error) => assert_eq!(error.key, shown),
    }
});
