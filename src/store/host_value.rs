//! The value of a host key (`{ns}/hosts/{store}`, written by a
//! [`SessionHost`](crate::host::SessionHost), attached to its node lease):
//!
//! ```text
//! leasehold-host/1 {max or -} {nonce} {node name}
//! leasehold-host/2 {max or -} {nonce} {advertise or -} {metadata in hex or -} {node name}
//! leasehold-host/3 {max or -} {weight} {nonce} {advertise or -} {metadata in hex or -} {node name}
//! ```
//!
//! As with the [owner value](super::owner_value), version 2 carries the node's advertised
//! address and metadata, and a host with neither writes version 1; version 3 adds the host's
//! weight in the balance, and only a host whose weight is not 1 writes it. The nonce makes the value
//! unique to the host (its leave's delete is guarded by it); it is a version 7 UUID, so it
//! also tells when the host started (by its own clock). Hosts that wrote no nonce read the
//! nonce as part of the node's name, which only names the host.

use std::time::SystemTime;

use uuid::Uuid;

use super::owner_value::{parse_advertise, parse_metadata, route_fields, time_of};

const V1: &str = "leasehold-host/1";
const V2: &str = "leasehold-host/2";
const V3: &str = "leasehold-host/3";

/// A decoded host value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostValue {
    pub(crate) max: Option<usize>,
    /// Its weight in the balance (1 unless version 3 says otherwise).
    pub(crate) weight: u32,
    pub(crate) nonce: Uuid,
    pub(crate) node: String,
    pub(crate) advertise: Option<String>,
    pub(crate) metadata: Vec<u8>,
}

impl HostValue {
    pub(crate) fn encode(&self) -> String {
        let max = self
            .max
            .map_or_else(|| "-".to_owned(), |max| max.to_string());
        let route = route_fields(self.advertise.as_deref(), &self.metadata);
        match (self.weight, route) {
            (1, None) => format!("{V1} {max} {} {}", self.nonce, self.node),
            (1, Some(route)) => format!("{V2} {max} {} {route} {}", self.nonce, self.node),
            (weight, route) => format!(
                "{V3} {max} {weight} {} {} {}",
                self.nonce,
                route.unwrap_or_else(|| "- -".to_owned()),
                self.node
            ),
        }
    }

    /// Anything unreadable counts as a host without a maximum (or an address).
    pub(crate) fn decode(value: &[u8]) -> Self {
        let text = String::from_utf8_lossy(value);
        let (version, rest) = text.split_once(' ').unwrap_or((&text, ""));
        // The fields after the version, the node's name last (it may hold spaces).
        let mut fields: Vec<&str> = match version {
            V1 => rest.splitn(3, ' ').collect(),
            V2 => rest.splitn(5, ' ').collect(),
            V3 => rest.splitn(6, ' ').collect(),
            _ => Vec::new(),
        };
        // Version 3 is version 2 with the weight after the maximum.
        let weight = match version {
            V3 if fields.len() > 1 => fields.remove(1).parse().unwrap_or(1),
            _ => 1,
        };
        let field = |i: usize| fields.get(i).copied();
        let (advertise, metadata, node) = match version {
            V2 | V3 => (
                field(2).and_then(parse_advertise),
                field(3).and_then(parse_metadata).unwrap_or_default(),
                field(4),
            ),
            _ => (None, Vec::new(), field(2)),
        };
        Self {
            weight,
            max: field(0).and_then(|max| max.parse().ok()),
            nonce: field(1)
                .and_then(|nonce| nonce.parse().ok())
                .unwrap_or_default(),
            node: node.unwrap_or_default().to_owned(),
            advertise,
            metadata,
        }
    }

    /// When the host started, by its own clock (from the nonce), if it tells.
    pub(crate) fn started_at(&self) -> Option<SystemTime> {
        time_of(self.nonce)
    }
}

/// The value of a load key (`{ns}/loads/{store}`, written by a session host at most once per
/// [`LoadBalance::publish_every`](crate::LoadBalance::publish_every), attached to its node
/// lease): the smoothed load of the sessions it holds, how many they are, the host's nonce
/// (its leave's delete is guarded by the value), and its hottest sessions, each with its own
/// smoothed load (as many as
/// [`LoadBalance::published_sessions`](crate::LoadBalance::published_sessions) says, the
/// hottest first, none of load 0).
///
/// ```text
/// leasehold-load/1 {load} {sessions} {host nonce}[ {session}={load}]…
/// ```
///
/// A reader of an earlier release ignores the sessions after the nonce.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LoadValue {
    pub(crate) load: f64,
    pub(crate) sessions: usize,
    pub(crate) nonce: Uuid,
    pub(crate) hottest: Vec<(Uuid, f64)>,
}

const LOAD_V1: &str = "leasehold-load/1";

impl LoadValue {
    pub(crate) fn encode(&self) -> String {
        let mut text = format!("{LOAD_V1} {} {} {}", self.load, self.sessions, self.nonce);
        for (session, load) in &self.hottest {
            text.push_str(&format!(" {session}={load}"));
        }
        text
    }

    /// Each store's load value, from the load keys of a read of `prefix` (`{ns}/loads/`); keys
    /// or values this release does not read are skipped.
    pub(crate) fn by_store(
        prefix: &str,
        kvs: &[etcd_client::KeyValue],
    ) -> std::collections::HashMap<Uuid, Self> {
        kvs.iter()
            .filter_map(|kv| {
                let store = crate::keys::id_under(prefix, kv.key())?;
                Some((store, Self::decode(kv.value())?))
            })
            .collect()
    }

    /// `session`'s load, if this host lists it among its hottest.
    pub(crate) fn of(&self, session: Uuid) -> Option<f64> {
        self.hottest
            .iter()
            .find(|(listed, _)| *listed == session)
            .map(|(_, load)| *load)
    }

    /// `None` for anything that is not a load value of a version this release reads (or
    /// whose load is not finite and at least 0).
    pub(crate) fn decode(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut fields = text.split(' ');
        if fields.next()? != LOAD_V1 {
            return None;
        }
        let load = Self::load(fields.next()?)?;
        let sessions = fields.next()?.parse().ok()?;
        let nonce = fields.next()?.parse().ok()?;
        // A listed session this release does not read is skipped.
        let hottest = fields
            .filter_map(|field| {
                let (session, load) = field.split_once('=')?;
                Some((session.parse().ok()?, Self::load(load)?))
            })
            .collect();
        Some(Self {
            load,
            sessions,
            nonce,
            hottest,
        })
    }

    /// A load as written: finite and at least 0.
    fn load(text: &str) -> Option<f64> {
        let load: f64 = text.parse().ok()?;
        (load.is_finite() && load >= 0.0).then_some(load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_values_round_trip_and_garbage_is_none() {
        for load in [0.0, 1.5, 870.125, 1e12] {
            for hottest in [vec![], vec![(Uuid::new_v4(), load), (Uuid::new_v4(), 0.25)]] {
                let value = LoadValue {
                    load,
                    sessions: 300,
                    nonce: Uuid::now_v7(),
                    hottest,
                };
                assert_eq!(LoadValue::decode(value.encode().as_bytes()), Some(value));
            }
        }
        // Listed sessions this release does not read are skipped; the rest is kept.
        let (nonce, session) = (Uuid::now_v7(), Uuid::new_v4());
        let value = LoadValue::decode(
            format!("leasehold-load/1 3 2 {nonce} {session}=2.5 x=1 {session}=NaN {session}")
                .as_bytes(),
        )
        .unwrap();
        assert_eq!((value.load, value.hottest), (3.0, vec![(session, 2.5)]));
        let nonce = Uuid::nil();
        for garbage in [
            String::new(),
            format!("leasehold-load/2 1 2 {nonce}"),
            format!("leasehold-load/1 NaN 2 {nonce}"),
            format!("leasehold-load/1 -1 2 {nonce}"),
            format!("leasehold-load/1 inf 2 {nonce}"),
            "leasehold-load/1 1 2".to_owned(),
        ] {
            assert_eq!(LoadValue::decode(garbage.as_bytes()), None, "{garbage:?}");
        }
    }

    #[test]
    fn host_values_round_trip_and_garbage_has_no_maximum() {
        for (max, weight) in [
            (None, 1),
            (Some(0), 1),
            (Some(12), 1),
            (None, 3),
            (Some(5), 0),
        ] {
            for (advertise, metadata) in [
                (None, &b""[..]),
                (Some("http://10.0.0.7:31501"), &b""[..]),
                (None, &b"zone=b"[..]),
                (Some("http://h:1"), &b"\x00\xff"[..]),
            ] {
                let value = HostValue {
                    max,
                    weight,
                    nonce: Uuid::now_v7(),
                    node: "node a".into(),
                    advertise: advertise.map(str::to_owned),
                    metadata: metadata.to_vec(),
                };
                let encoded = value.encode();
                assert_eq!(
                    encoded.starts_with(V1),
                    weight == 1 && advertise.is_none() && metadata.is_empty(),
                    "{encoded}"
                );
                assert_eq!(encoded.starts_with(V3), weight != 1, "{encoded}");
                assert_eq!(HostValue::decode(encoded.as_bytes()), value);
                assert!(value.started_at().is_some());
            }
        }
        assert_eq!(HostValue::decode(b"\xff 3 x").max, None);
        assert_eq!(HostValue::decode(b"").max, None);
        assert_eq!(HostValue::decode(b"leasehold-host/9 3 x y").max, None);
        assert_eq!(HostValue::decode(b"leasehold-host/9 3 x y").weight, 1);
        // Version 1 as earlier releases wrote it.
        let nonce = Uuid::new_v4();
        let old = HostValue::decode(format!("leasehold-host/1 7 {nonce} n 1").as_bytes());
        assert_eq!(
            (old.max, old.nonce, old.node.as_str()),
            (Some(7), nonce, "n 1")
        );
        assert_eq!(old.advertise, None);
    }
}
