//! What leasehold's safety costs over plain etcd writes, measured side by side in one process
//! against one etcd container (absolute times drift on a shared machine; ratios hold better).
//!
//! `cargo bench --all-features --bench overhead` prints, for each operation, the median time
//! of leasehold's call and of its baseline over interleaved rounds, and their ratio:
//!
//! - acquire (one guarded txn) vs an unconditional put of a key;
//! - append of one event (one txn with three compares) vs a put;
//! - append of a 100-event batch vs a txn of 100 puts;
//! - replay of 10,000 records (paged, decoded) vs one raw range read of the same keys.

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, Txn, TxnOp};
use futures_util::StreamExt as _;
use leasehold::testing::{EtcdNode, random_namespace};
use leasehold::{Store, StoreOptions, Uuid};

const ROUNDS: usize = 7;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn report(name: &str, ours: Vec<Duration>, baseline: Vec<Duration>, per: usize) {
    let (ours, baseline) = (median(ours), median(baseline));
    println!(
        "{name:<34} leasehold {:>9.1} µs   baseline {:>9.1} µs   ratio {:>5.2}",
        ours.as_secs_f64() * 1e6 / per as f64,
        baseline.as_secs_f64() * 1e6 / per as f64,
        ours.as_secs_f64() / baseline.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let etcd = EtcdNode::start().await.expect("etcd starts (needs Docker)");
    let ns = random_namespace();
    let store = Store::connect(
        StoreOptions::new([etcd.endpoint()])
            .with_namespace(ns.clone())
            .with_node("bench"),
    )
    .await
    .expect("store");
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("raw client");
    println!(
        "etcd at {}; median of {ROUNDS} interleaved rounds, per operation",
        etcd.endpoint()
    );

    // --- acquire vs put
    let per = 200;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..per {
            let lease = store.acquire_lease(Uuid::new_v4()).await.unwrap();
            drop(lease);
        }
        ours.push(started.elapsed());
        let started = Instant::now();
        for i in 0..per {
            raw.put(format!("{}raw/{round}/{i}", ns.prefix()), "v", None)
                .await
                .unwrap();
        }
        base.push(started.elapsed());
    }
    report("acquire (+ background release)", ours, base, per);

    // --- single appends vs puts
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    let per = 300;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let started = Instant::now();
        for i in 0..per {
            journal.append(format!("event {round} {i}")).await.unwrap();
        }
        ours.push(started.elapsed());
        let started = Instant::now();
        for i in 0..per {
            raw.put(
                format!("{}raw/e/{round}/{i}", ns.prefix()),
                format!("event {round} {i}"),
                None,
            )
            .await
            .unwrap();
        }
        base.push(started.elapsed());
    }
    report("append 1 event vs put", ours, base, per);

    // --- batches vs a txn of puts
    let per = 20;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let started = Instant::now();
        for i in 0..per {
            let batch: Vec<String> = (0..100).map(|j| format!("batch {round} {i} {j}")).collect();
            journal.append_batch(&batch).await.unwrap();
        }
        ours.push(started.elapsed());
        let started = Instant::now();
        for i in 0..per {
            let puts: Vec<TxnOp> = (0..100)
                .map(|j| TxnOp::put(format!("{}raw/b/{round}/{i}/{j}", ns.prefix()), "v", None))
                .collect();
            raw.txn(Txn::new().and_then(puts)).await.unwrap();
        }
        base.push(started.elapsed());
    }
    report("append 100-event batch vs txn", ours, base, per);

    // --- replay vs one raw range read
    let records = journal_len(&store, session).await;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let mut replay = store.replay_records(session);
        let mut n = 0;
        while let Some(record) = replay.next().await {
            record.unwrap();
            n += 1;
        }
        assert_eq!(n, records);
        ours.push(started.elapsed());
        let started = Instant::now();
        let response = raw
            .get(
                ns.records_prefix(session),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        assert_eq!(response.kvs().len(), records);
        base.push(started.elapsed());
    }
    report(
        &format!("replay {records} records vs range"),
        ours,
        base,
        records,
    );
    store.close().await;
}

async fn journal_len(store: &Store, session: Uuid) -> usize {
    store.replay_records(session).count().await
}
