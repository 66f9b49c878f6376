//! The value of an owner key; its format is documented on [`OwnerValue`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uuid::Uuid;

const V1: &str = "leasehold-owner/1";
const V2: &str = "leasehold-owner/2";

/// The value of an owner key: who wrote it, for which attempt, and how to reach it. A contract:
/// routers and other tools read it (with [`OwnerValue::decode`]), so its versions stay
/// readable.
///
/// ```text
/// leasehold-owner/1 {store id} {nonce} {node name}
/// leasehold-owner/2 {store id} {nonce} {advertise or -} {metadata in hex or -} {node name}
/// ```
///
/// The store id names the [`Store`](crate::store::Store) instance (a fresh UUID per process), so a
/// store recognizes its own keys even when two processes share a node name. The nonce names the
/// acquisition attempt: an acquisition whose outcome is unknown is resolved by reading it
/// back. It is a version 7 UUID, so it also tells when the acquisition was made (by the
/// acquiring node's clock; for people, never for decisions). The node name is for people; it
/// is last, since it may hold spaces.
///
/// Version 2 adds the node's advertised address
/// ([`StoreOptions::with_advertise`](crate::store::StoreOptions::with_advertise), a URL without
/// spaces) and its metadata
/// ([`StoreOptions::with_metadata`](crate::store::StoreOptions::with_metadata), lowercase hex),
/// `-` for either when it has none. A store with neither writes version 1, which every release
/// of leasehold reads.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnerValue {
    /// The holder's store instance (one per process).
    pub store: Uuid,
    /// The acquisition that wrote the key.
    pub nonce: Uuid,
    /// The holder's node name.
    pub node: String,
    /// The holder's advertised address, if it has one.
    pub advertise: Option<String>,
    /// The holder's metadata (empty if none).
    pub metadata: Vec<u8>,
}

impl OwnerValue {
    /// The value written by `store`'s acquisition `nonce`.
    pub(crate) fn new(
        store: Uuid,
        nonce: Uuid,
        node: &str,
        advertise: Option<&str>,
        metadata: &[u8],
    ) -> Self {
        Self {
            store,
            nonce,
            node: node.to_owned(),
            advertise: advertise.map(str::to_owned),
            metadata: metadata.to_vec(),
        }
    }

    /// The bytes written into the owner key: version 1 if there is neither an address nor
    /// metadata, else version 2.
    pub fn encode(&self) -> Vec<u8> {
        let (store, nonce) = (self.store.hyphenated(), self.nonce.hyphenated());
        match route_fields(self.advertise.as_deref(), &self.metadata) {
            None => format!("{V1} {store} {nonce} {}", self.node),
            Some(route) => format!("{V2} {store} {nonce} {route} {}", self.node),
        }
        .into_bytes()
    }

    /// `None` for a value leasehold did not write (never an error: foreign values are held
    /// by someone else, that is all).
    pub fn decode(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        if let Some(rest) = text
            .strip_prefix(V1)
            .and_then(|rest| rest.strip_prefix(' '))
        {
            let mut parts = rest.splitn(3, ' ');
            let store = parts.next()?.parse().ok()?;
            let nonce = parts.next()?.parse().ok()?;
            let node = parts.next()?.to_owned();
            return Some(Self {
                store,
                nonce,
                node,
                advertise: None,
                metadata: Vec::new(),
            });
        }
        let rest = text.strip_prefix(V2)?.strip_prefix(' ')?;
        let mut parts = rest.splitn(5, ' ');
        let store = parts.next()?.parse().ok()?;
        let nonce = parts.next()?.parse().ok()?;
        let advertise = parse_advertise(parts.next()?);
        let metadata = parse_metadata(parts.next()?)?;
        let node = parts.next()?.to_owned();
        Some(Self {
            store,
            nonce,
            node,
            advertise,
            metadata,
        })
    }

    /// When the holder acquired the session, by the holder's clock (read from the nonce;
    /// `None` if it carries no time).
    pub fn acquired_at(&self) -> Option<SystemTime> {
        time_of(self.nonce)
    }
}

/// When a version 7 `nonce` was made, by its maker's clock; `None` if it carries no time.
pub(crate) fn time_of(nonce: Uuid) -> Option<SystemTime> {
    let (secs, nanos) = nonce.get_timestamp()?.to_unix();
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// The two fields version 2 adds (to owner and host values alike), as written:
/// `{advertise or -} {metadata in hex or -}`; `None` when there is neither, and the value is
/// then version 1.
pub(crate) fn route_fields(advertise: Option<&str>, metadata: &[u8]) -> Option<String> {
    if advertise.is_none() && metadata.is_empty() {
        return None;
    }
    let metadata = if metadata.is_empty() {
        "-".to_owned()
    } else {
        hex(metadata)
    };
    Some(format!("{} {metadata}", advertise.unwrap_or("-")))
}

/// The advertise field read back: `-` is none.
pub(crate) fn parse_advertise(field: &str) -> Option<String> {
    (field != "-").then(|| field.to_owned())
}

/// The metadata field read back: `-` is none; `None` if it is not hex.
pub(crate) fn parse_metadata(field: &str) -> Option<Vec<u8>> {
    match field {
        "-" => Some(Vec::new()),
        hex => unhex(hex),
    }
}

/// `bytes` in lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// Lowercase or uppercase hex back into bytes; `None` if it is not hex.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(advertise: Option<&str>, metadata: &[u8]) -> OwnerValue {
        OwnerValue::new(
            Uuid::new_v4(),
            Uuid::now_v7(),
            "node a",
            advertise,
            metadata,
        )
    }

    #[test]
    fn round_trips_and_rejects_foreign_values() {
        for value in [
            value(None, b""),
            value(Some("http://10.0.0.7:31501"), b""),
            value(None, b"\x00zone=b\xff"),
            value(Some("https://n1.example:443/x"), b"zone=b"),
        ] {
            assert_eq!(OwnerValue::decode(&value.encode()), Some(value));
        }
        for foreign in [
            &b""[..],
            b"leasehold-owner/1",
            b"x y z",
            b"leasehold-owner/1 a b c",
            b"leasehold-owner/2 a b c d e",
            b"leasehold-owner/3 a b c",
            b"\xff",
        ] {
            assert_eq!(OwnerValue::decode(foreign), None);
        }
    }

    /// Without an address or metadata the value is version 1 as before, byte for byte, so
    /// older releases sharing the namespace read it; with one it is version 2.
    #[test]
    fn version_one_unless_there_is_an_address_or_metadata() {
        let (store, nonce) = (Uuid::new_v4(), Uuid::now_v7());
        let plain = OwnerValue::new(store, nonce, "n 1", None, b"");
        assert_eq!(
            String::from_utf8(plain.encode()).unwrap(),
            format!("leasehold-owner/1 {store} {nonce} n 1")
        );
        let routed = OwnerValue::new(store, nonce, "n 1", Some("http://h:1"), b"\x01\xab");
        assert_eq!(
            String::from_utf8(routed.encode()).unwrap(),
            format!("leasehold-owner/2 {store} {nonce} http://h:1 01ab n 1")
        );
        let v2 = format!("leasehold-owner/2 {store} {nonce} - 01AB n 1");
        let decoded = OwnerValue::decode(v2.as_bytes()).unwrap();
        assert_eq!((decoded.advertise, decoded.metadata), (None, vec![1, 0xab]));
        for metadata in ["0ab", "+a", "zz"] {
            let bad = format!("leasehold-owner/2 {store} {nonce} - {metadata} n 1");
            assert_eq!(OwnerValue::decode(bad.as_bytes()), None, "{metadata}");
        }
        assert!(plain.acquired_at().is_some());
    }
}
