//! The journal checker is able to fail: journals broken on purpose with the raw client, one per
//! invariant, each reported as its specific violation.

mod common;

use leasehold::testing::{AppendHistory, InvariantViolation, Violation, check_journal};
use leasehold::{Appended, Epoch, Uuid};

/// Writes a journal's keys directly, in the record encoding `leasehold::journal` documents.
struct Raw<'a> {
    etcd: &'a common::Etcd,
    session: Uuid,
}

fn header(kind: u8, seq: u64, epoch: u64, nonce: Uuid) -> Vec<u8> {
    let mut out = vec![1, kind];
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(nonce.as_bytes());
    out
}

impl Raw<'_> {
    async fn put(&self, key: String, value: Vec<u8>) {
        self.etcd.raw.clone().put(key, value, None).await.unwrap();
    }

    async fn fence(&self, seq: u64, epoch: u64, previous: Option<(u64, u64, Uuid)>) -> Uuid {
        let nonce = Uuid::new_v4();
        let mut value = header(1, seq, epoch, nonce);
        match previous {
            None => value.push(0),
            Some((seq, epoch, nonce)) => {
                value.push(1);
                value.extend_from_slice(&seq.to_be_bytes());
                value.extend_from_slice(&epoch.to_be_bytes());
                value.extend_from_slice(nonce.as_bytes());
            }
        }
        self.put(self.etcd.ns.record_key(self.session, seq), value)
            .await;
        nonce
    }

    async fn event(&self, seq: u64, epoch: u64, nonce: Uuid, payload: &str) {
        let mut value = header(0, seq, epoch, nonce);
        value.extend_from_slice(payload.as_bytes());
        self.put(self.etcd.ns.record_key(self.session, seq), value)
            .await;
    }

    async fn tip(&self, seq: u64, epoch: u64, nonce: Uuid) {
        let mut value = vec![1];
        value.extend_from_slice(&seq.to_be_bytes());
        value.extend_from_slice(&epoch.to_be_bytes());
        value.extend_from_slice(nonce.as_bytes());
        self.put(self.etcd.ns.tip_key(self.session), value).await;
    }
}

fn acknowledged(history: &mut AppendHistory, payloads: &[&str]) {
    let appended = Appended {
        first_seq: 0,
        last_seq: 0,
        revision: 0,
    };
    history.record(payloads, &Ok(appended));
}

/// Checks the journal and returns its violations (none if it passes).
async fn violations(raw: &Raw<'_>, history: &AppendHistory) -> Vec<Violation> {
    let store = raw.etcd.store("checker", 10).await;
    match check_journal(&store, raw.session, history).await {
        Ok(_) => Vec::new(),
        Err(InvariantViolation { violations, .. }) => violations,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_broken_journal_is_reported_as_its_own_violation() {
    let etcd = common::Etcd::start().await;
    let journal = || Raw {
        etcd: &etcd,
        session: Uuid::new_v4(),
    };

    // --- a sound journal: fence, two events in one append, a second owner's fence, an event
    let raw = journal();
    let mut history = AppendHistory::default();
    raw.fence(1, 10, None).await;
    let n = Uuid::new_v4();
    raw.event(2, 10, n, "a").await;
    raw.event(3, 10, n, "b").await;
    acknowledged(&mut history, &["a", "b"]);
    raw.fence(4, 20, Some((3, 10, n))).await;
    let m = Uuid::new_v4();
    raw.event(5, 20, m, "c").await;
    raw.tip(5, 20, m).await;
    acknowledged(&mut history, &["c"]);
    assert_eq!(violations(&raw, &history).await, [], "the control passes");

    // --- gap: record 3 is missing
    let raw = journal();
    raw.fence(1, 10, None).await;
    let n = Uuid::new_v4();
    raw.event(2, 10, n, "x").await;
    raw.event(4, 10, n, "y").await;
    raw.tip(4, 10, n).await;
    assert!(
        violations(&raw, &AppendHistory::default())
            .await
            .contains(&Violation::Gap {
                expected: 3,
                found: 4
            })
    );

    // --- fork: the second owner fenced from an older tip than the record before its fence
    let raw = journal();
    let f = raw.fence(1, 10, None).await;
    let n = Uuid::new_v4();
    raw.event(2, 10, n, "x").await;
    let g = raw.fence(3, 20, Some((1, 10, f))).await;
    raw.tip(3, 20, g).await;
    assert_eq!(
        violations(&raw, &AppendHistory::default()).await,
        [Violation::Fork {
            fence: 3,
            names: Some((1, Epoch(10))),
            before: Some((2, Epoch(10)))
        }]
    );

    // --- duplicate: one acknowledged append present twice
    let raw = journal();
    let mut history = AppendHistory::default();
    raw.fence(1, 10, None).await;
    let (n, o) = (Uuid::new_v4(), Uuid::new_v4());
    raw.event(2, 10, n, "x").await;
    raw.event(3, 10, o, "x").await;
    raw.tip(3, 10, o).await;
    acknowledged(&mut history, &["x"]);
    assert_eq!(
        violations(&raw, &history).await,
        [Violation::Acknowledged {
            payload: "x".into(),
            present: 2
        }]
    );

    // --- a stale-epoch record after a newer fence
    let raw = journal();
    let f = raw.fence(1, 10, None).await;
    let g = raw.fence(2, 20, Some((1, 10, f))).await;
    let _ = g;
    let n = Uuid::new_v4();
    raw.event(3, 10, n, "late").await;
    raw.tip(3, 10, n).await;
    let found = violations(&raw, &AppendHistory::default()).await;
    assert!(
        found.contains(&Violation::StaleRecord {
            seq: 3,
            epoch: Epoch(10),
            fence: Epoch(20)
        }),
        "{found:?}"
    );

    // --- an acknowledged append missing
    let raw = journal();
    let mut history = AppendHistory::default();
    let f = raw.fence(1, 10, None).await;
    raw.tip(1, 10, f).await;
    acknowledged(&mut history, &["lost"]);
    assert_eq!(
        violations(&raw, &history).await,
        [Violation::Acknowledged {
            payload: "lost".into(),
            present: 0
        }]
    );

    // --- an outcome-unknown batch present in part
    let raw = journal();
    let mut history = AppendHistory::default();
    raw.fence(1, 10, None).await;
    let n = Uuid::new_v4();
    raw.event(2, 10, n, "half-1").await;
    raw.tip(2, 10, n).await;
    history.record_unknown(&["half-1", "half-2"]);
    assert_eq!(
        violations(&raw, &history).await,
        [Violation::Torn {
            first: "half-1".into(),
            present: 1,
            of: 2
        }]
    );

    // --- acknowledged appends out of order
    let raw = journal();
    let mut history = AppendHistory::default();
    raw.fence(1, 10, None).await;
    let (n, o) = (Uuid::new_v4(), Uuid::new_v4());
    raw.event(2, 10, n, "second").await;
    raw.event(3, 10, o, "first").await;
    raw.tip(3, 10, o).await;
    acknowledged(&mut history, &["first"]);
    acknowledged(&mut history, &["second"]);
    assert_eq!(
        violations(&raw, &history).await,
        [Violation::OutOfOrder {
            earlier: "first".into(),
            later: "second".into()
        }]
    );

    // --- concurrent callers: calls that overlapped may land in either order, but not one
    //     that started after another was acknowledged
    let raw = journal();
    let mut history = AppendHistory::default();
    raw.fence(1, 10, None).await;
    let nonce = Uuid::new_v4();
    raw.event(2, 10, nonce, "b").await;
    raw.event(3, 10, nonce, "c").await;
    let last = Uuid::new_v4();
    raw.event(4, 10, last, "a").await;
    raw.tip(4, 10, last).await;
    let ok = Ok(Appended {
        first_seq: 0,
        last_seq: 0,
        revision: 0,
    });
    let (a, b) = (history.invoke(), history.invoke());
    history.complete(b, &["b"], &ok);
    history.complete(a, &["a"], &ok);
    let c = history.invoke();
    history.complete(c, &["c"], &ok);
    assert_eq!(
        violations(&raw, &history).await,
        [Violation::OutOfOrder {
            earlier: "a".into(),
            later: "c".into()
        }]
    );

    // --- a tip behind the last record: no owner can open the journal
    let raw = journal();
    let f = raw.fence(1, 10, None).await;
    raw.event(2, 10, Uuid::new_v4(), "x").await;
    raw.tip(1, 10, f).await;
    assert_eq!(
        violations(&raw, &AppendHistory::default()).await,
        [Violation::TipBehind {
            tip: (1, Epoch(10)),
            last: (2, Epoch(10))
        }]
    );

    // --- a tip that does not name the last record
    let raw = journal();
    raw.fence(1, 10, None).await;
    let x = Uuid::new_v4();
    raw.event(2, 10, x, "x").await;
    raw.tip(3, 10, x).await;
    assert_eq!(
        violations(&raw, &AppendHistory::default()).await,
        [Violation::TipMismatch {
            tip: Some((3, Epoch(10))),
            last: Some((2, Epoch(10)))
        }]
    );

    // --- a batch split across two transactions (two nonces)
    let raw = journal();
    let mut history = AppendHistory::default();
    raw.fence(1, 10, None).await;
    let (n, o) = (Uuid::new_v4(), Uuid::new_v4());
    raw.event(2, 10, n, "p").await;
    raw.event(3, 10, o, "q").await;
    raw.tip(3, 10, o).await;
    acknowledged(&mut history, &["p", "q"]);
    assert_eq!(
        violations(&raw, &history).await,
        [Violation::Torn {
            first: "p".into(),
            present: 2,
            of: 2
        }]
    );

    // --- a trimmed journal that lost a record above its base (base 2, records from 3), an
    // undecodable record, an undecodable tip
    let raw = journal();
    let f = raw.fence(1, 10, None).await;
    let g = raw.fence(2, 20, Some((1, 10, f))).await;
    let n = Uuid::new_v4();
    raw.event(3, 20, n, "kept").await;
    raw.tip(3, 20, n).await;
    let _ = g;
    let base = etcd.ns.base_key(raw.session);
    raw.put(base, [vec![1], 2u64.to_be_bytes().to_vec()].concat())
        .await;
    for seq in 1..3 {
        let key = etcd.ns.record_key(raw.session, seq);
        etcd.raw.clone().delete(key, None).await.unwrap();
    }
    let raw = journal();
    let f = raw.fence(1, 10, None).await;
    raw.put(
        etcd.ns.record_key(raw.session, 2),
        b"\x01\x00garbage".to_vec(),
    )
    .await;
    raw.tip(1, 10, f).await;
    let raw = journal();
    let f = raw.fence(1, 10, None).await;
    raw.tip(1, 10, f).await;
    raw.put(etcd.ns.base_key(raw.session), b"no base".to_vec())
        .await;
    let raw = journal();
    let f = raw.fence(1, 10, None).await;
    let _ = f;
    raw.put(etcd.ns.tip_key(raw.session), b"no tip".to_vec())
        .await;

    // --- every journal at once, in small pages, is checked as each is on its own
    let admin = leasehold::admin::Admin::new(
        leasehold::Connection::connect(leasehold::ConnectOptions::new([etcd.node.endpoint()]))
            .await
            .unwrap(),
        etcd.ns.clone(),
    );
    let mut seen = Vec::new();
    let options = leasehold::ReplayOptions::default().with_page_records(3);
    let all = admin
        .check_all(&options, |done| seen.push(done))
        .await
        .unwrap();
    let sessions = admin.journals().await.unwrap();
    assert_eq!(all.len(), sessions.len(), "one check per journal");
    assert!(
        seen.len() > sessions.len() / 2,
        "progress after each page: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&all.len()));
    let mut broken = 0;
    for (at_once, session) in all.iter().zip(sessions) {
        let mut alone = admin.check(session).await.unwrap();
        alone.revision = at_once.revision;
        assert_eq!(at_once, &alone, "{session}");
        broken += usize::from(!alone.is_sound());
    }
    // The two gaps, the fork, the stale record, the tip behind, the tip that names another
    // record, the undecodable record, base and tip (the rest break only what their callers
    // were told).
    assert_eq!(broken, 9, "the journals broken above are found broken");
}
