//! Placement by load: three hosts over 300 sessions, placed by count; then 30 sessions (taken
//! unevenly from the hosts) report 20 times the load of the rest. Within 60 s every host's load
//! is within the band of its target (its weight's share of the total), each by moves within
//! the churn budget, no session acquired twice within its cooldown, every journal advancing
//! throughout and sound; `Admin::hosts` and `Admin::owners` show each host's load and its
//! hottest sessions'. The same with weights 2:1:1, with every session's load published. With
//! the balance by load off, the loads stay out of the band (the first test fails).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use leasehold::admin::Admin;
use leasehold::testing::{AppendHistory, check_journal, wait_for};
use leasehold::{
    CancellationToken, GiveUp, HostEvent, HostOptions, LoadBalance, Rig, SessionHost, Uuid,
};
use tokio::time::Instant;

const SESSIONS: usize = 300;
const HOT: f64 = 20.0;
const BAND: f64 = 0.1;
const BUDGET: usize = 4;
const BUDGET_INTERVAL: Duration = Duration::from_secs(2);
const COOLDOWN: Duration = Duration::from_secs(5);
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// How soon the hosts must reach the band once the load changes.
const WITHIN: Duration = Duration::from_secs(60);
/// The longest a session may go without an acknowledged append (one every 500 ms).
const GAP_BOUND: Duration = Duration::from_secs(3);

fn load_balance() -> LoadBalance {
    LoadBalance::default()
        .with_half_life(Duration::from_secs(1))
        .with_publish_every(PUBLISH_EVERY)
        .with_band(BAND)
        .with_budget(BUDGET, BUDGET_INTERVAL)
        .with_cooldown(COOLDOWN)
}

/// What the sessions' work shares with the test.
#[derive(Clone, Default)]
struct Shared {
    hot: Arc<RwLock<HashSet<Uuid>>>,
    acks: Arc<Mutex<HashMap<Uuid, Vec<Instant>>>>,
    histories: Arc<Mutex<HashMap<Uuid, AppendHistory>>>,
}

/// The work: an append every 500 ms, and the session's load (20 if hot, else 1) reported
/// before each.
async fn work(rig: Arc<Rig>, stop: CancellationToken, shared: Shared) {
    let session = rig.session_id();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut beat = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        let hot = shared.hot.read().unwrap().contains(&session);
        rig.set_load(if hot { HOT } else { 1.0 });
        beat += 1;
        let payload = format!("beat {} {beat}", rig.epoch());
        let result = rig.journal().append(&payload).await;
        if result.is_ok() {
            let mut acks = shared.acks.lock().unwrap();
            acks.entry(session).or_default().push(Instant::now());
        }
        let mut histories = shared.histories.lock().unwrap();
        histories
            .entry(session)
            .or_default()
            .record(&[&payload], &result);
    }
}

/// Each host's events, as they come, with when.
type Seen = Arc<Mutex<Vec<(Instant, HostEvent)>>>;

fn record(host: &SessionHost) -> Seen {
    let seen: Seen = Arc::default();
    let mut events = host.events();
    tokio::spawn({
        let seen = seen.clone();
        async move {
            loop {
                match events.recv().await {
                    Ok(event) => seen.lock().unwrap().push((Instant::now(), event)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        panic!("the test fell behind a host's events")
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    seen
}

/// What happened to `session`, host by host, from `from` on.
fn story(events: &[Vec<(Instant, HostEvent)>], session: Uuid, from: Instant) -> String {
    let mut story: Vec<(Instant, String)> = Vec::new();
    for (h, events) in events.iter().enumerate() {
        for (at, event) in events {
            let (about, what) = match event {
                HostEvent::Acquired { session, epoch } => (session, format!("acquired at {epoch}")),
                HostEvent::GaveUp { session, why, .. } => (session, format!("gave up: {why}")),
                _ => continue,
            };
            if *about == session {
                let t = at
                    .checked_duration_since(from)
                    .map_or_else(|| format!("-{:.3?}", from - *at), |t| format!("{t:.3?}"));
                story.push((*at, format!("{t:>10} host {h} {what}")));
            }
        }
    }
    story.sort();
    story
        .into_iter()
        .map(|(_, line)| line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each host's load and its target: its weight's share of the total.
fn loads(hosts: &[SessionHost], weights: &[u32]) -> Vec<(f64, f64)> {
    let loads: Vec<f64> = hosts.iter().map(SessionHost::load).collect();
    let total: f64 = loads.iter().sum();
    let weight: u32 = weights.iter().sum();
    loads
        .iter()
        .zip(weights)
        .map(|(&load, &w)| (load, total * f64::from(w) / f64::from(weight)))
        .collect()
}

fn within_band(loads: &[(f64, f64)]) -> bool {
    loads
        .iter()
        .all(|(load, target)| (load - target).abs() <= target * BAND)
}

/// Three hosts of `weights`, `load` their balance by load; `hot[h]` of host `h`'s sessions
/// turn hot once they are placed by count.
/// Checks what `Admin::hosts` and `Admin::owners` show: each host's load, and for each host
/// its `listed` hottest sessions with their loads (20 for the hot ones, 1 for the rest), none
/// of another host's.
async fn operator_view(admin: &Admin, hot: &HashSet<Uuid>, listed: usize) -> Result<(), String> {
    let published = admin.hosts().await.map_err(|e| e.to_string())?;
    let owners = admin.owners().await.map_err(|e| e.to_string())?;
    if published.len() != 3 {
        return Err(format!("{} hosts", published.len()));
    }
    for host in &published {
        let load = host.load.ok_or("a host without a load")?;
        let held: Vec<_> = owners
            .iter()
            .filter(|owner| owner.store == Some(host.store))
            .collect();
        let hot_held = held
            .iter()
            .filter(|owner| hot.contains(&owner.session))
            .count();
        let shown: Vec<(bool, f64)> = held
            .iter()
            .filter_map(|owner| Some((hot.contains(&owner.session), owner.load?)))
            .collect();
        let hot_shown = shown.iter().filter(|(hot, _)| *hot).count();
        let loads_right = shown.iter().all(|(hot, load)| {
            let expected = if *hot { HOT } else { 1.0 };
            (load - expected).abs() < 0.5
        });
        let sum: f64 = shown.iter().map(|(_, load)| load).sum();
        if shown.len() != listed.min(held.len())
            || hot_shown != hot_held.min(listed)
            || !loads_right
            || sum > load + 0.5
        {
            return Err(format!(
                "host {} of load {load}, holding {} sessions ({hot_held} hot), shows {shown:?}",
                host.store,
                held.len()
            ));
        }
    }
    // One session alone shows the same.
    let listed = owners.iter().find(|owner| owner.load.is_some()).unwrap();
    let alone = admin
        .owner(listed.session)
        .await
        .map_err(|e| e.to_string())?;
    let load = alone.and_then(|owner| owner.load);
    if load.is_none_or(|load| (load - listed.load.unwrap()).abs() >= 0.5) {
        return Err(format!("{} alone: load {load:?}", listed.session));
    }
    Ok(())
}

async fn spread(weights: [u32; 3], hot: [usize; 3], load: LoadBalance) {
    let listed = load.published_sessions;
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let shared = Shared::default();
    let (mut hosts, mut seen) = (Vec::new(), Vec::new());
    for (i, weight) in weights.into_iter().enumerate() {
        let store = Arc::new(etcd.store(&format!("h{i}"), 3).await);
        let options = HostOptions::default()
            .with_settle(Duration::ZERO)
            .with_weight(weight)
            .with_load_balance(load.clone());
        let shared = shared.clone();
        let host = SessionHost::start(store, options, sessions.clone(), move |rig, stop| {
            work(rig, stop, shared.clone())
        });
        seen.push(record(&host));
        hosts.push(host);
    }
    let total: u32 = weights.iter().sum();
    let by_count: Vec<usize> = weights
        .iter()
        .map(|&w| SESSIONS * w as usize / total as usize)
        .collect();
    wait_for("placed by count", Duration::from_secs(30), || async {
        let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
        (held == by_count).then_some(())
    })
    .await
    .unwrap();
    let placed = Instant::now();

    // --- 30 sessions turn hot, unevenly
    let mut turned = HashSet::new();
    for (host, &n) in hosts.iter().zip(&hot) {
        let mut held: Vec<Uuid> = host.held().into_iter().map(|(s, _)| s).collect();
        held.sort();
        turned.extend(held.into_iter().take(n));
    }
    *shared.hot.write().unwrap() = turned;
    let changed = Instant::now();
    let from_revision = common::revision(&etcd.raw).await;
    // Once every host has seen the new loads: out of the band.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = loads(&hosts, &weights);
    println!("{weights:?}: hot {hot:?}, (load, target) {before:.0?}");
    assert!(
        !within_band(&before),
        "the hot sessions put the hosts out of the band"
    );

    let balanced = wait_for("every host within the band", WITHIN, || async {
        let held: usize = hosts.iter().map(SessionHost::held_count).sum();
        let now = loads(&hosts, &weights);
        (held == SESSIONS && within_band(&now)).then_some(now)
    })
    .await
    .unwrap_or_else(|error| {
        let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
        let owned: HashSet<Uuid> = hosts
            .iter()
            .flat_map(|host| host.held().into_iter().map(|(session, _)| session))
            .collect();
        let events: Vec<Vec<(Instant, HostEvent)>> = seen
            .iter()
            .map(|seen| seen.lock().unwrap().clone())
            .collect();
        let unowned: Vec<String> = sessions
            .iter()
            .filter(|session| !owned.contains(session))
            .map(|session| format!("{session}:\n{}", story(&events, *session, changed)))
            .collect();
        panic!(
            "{error}: {:.0?}, holding {held:?}; not owned: {}",
            loads(&hosts, &weights),
            unowned.join("\n")
        )
    });
    let took = changed.elapsed();
    // It stays there.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = loads(&hosts, &weights);
    assert!(within_band(&after), "still within the band: {after:.0?}");

    // --- what an operator sees: each host's load, and the load of each host's hottest sessions
    let operator = etcd.store("operator", 10).await;
    let admin = Admin::new(operator.connection().clone(), etcd.ns.clone());
    let hot_now = shared.hot.read().unwrap().clone();
    // (Read until the hosts' last publications follow the last moves.)
    let last = Mutex::new(String::new());
    let seen_by_operator = wait_for("the loads shown", Duration::from_secs(10), || async {
        let view = operator_view(&admin, &hot_now, listed).await;
        *last.lock().unwrap() = format!("{view:?}");
        view.ok()
    })
    .await;
    assert!(seen_by_operator.is_ok(), "{}", last.lock().unwrap());
    let end = Instant::now();
    let to_revision = common::revision(&etcd.raw).await;
    for host in &hosts {
        host.shutdown().await;
    }

    // --- the loads' writes: at most one per host per publication interval
    let loads_prefix = etcd.ns.loads_prefix();
    let writes = common::history(&etcd.raw, from_revision, to_revision)
        .await
        .into_iter()
        .filter(|change| change.put && change.key.starts_with(loads_prefix.as_bytes()))
        .count();
    let minutes = (end - changed).as_secs_f64() / 60.0;
    let per_host = writes as f64 / weights.len() as f64;
    let bound = (end - changed).as_secs_f64() / PUBLISH_EVERY.as_secs_f64() + 1.0;
    println!(
        "{weights:?}: {writes} load writes in {:.1?}, {:.0} per host per minute (at most one per {PUBLISH_EVERY:?})",
        end - changed,
        per_host / minutes
    );
    assert!(
        per_host <= bound,
        "{per_host} load writes per host, over {bound:.0}"
    );

    // --- moves within the budget, none twice within its cooldown
    let events: Vec<Vec<(Instant, HostEvent)>> = seen
        .iter()
        .map(|seen| seen.lock().unwrap().clone())
        .collect();
    let mut moves = 0;
    for (h, events) in events.iter().enumerate() {
        let moved: Vec<Instant> = events
            .iter()
            .filter(|(at, _)| *at < end)
            .filter(|(_, event)| {
                matches!(
                    event,
                    HostEvent::GaveUp {
                        why: GiveUp::Moved { .. },
                        ..
                    }
                )
            })
            .map(|(at, _)| *at)
            .collect();
        moves += moved.len();
        for (i, at) in moved.iter().enumerate() {
            let window = moved[i..]
                .iter()
                .take_while(|later| **later - *at < BUDGET_INTERVAL)
                .count();
            // The hand-overs follow the asks by a tick at most: a window one tick longer.
            assert!(
                window <= BUDGET * 2,
                "host {h}: {window} moves within {BUDGET_INTERVAL:?}"
            );
        }
    }
    let mut acquired: HashMap<Uuid, Vec<Instant>> = HashMap::new();
    // Until the shutdown (hosts shut down one by one hand sessions on).
    for (at, event) in events.iter().flatten().filter(|(at, _)| *at < end) {
        if let HostEvent::Acquired { session, .. } = event {
            acquired.entry(*session).or_default().push(*at);
        }
    }
    let acquisitions = acquired
        .values()
        .flatten()
        .filter(|at| **at >= changed)
        .count();
    for (session, times) in &mut acquired {
        times.sort();
        // From the acquisition that placed it on.
        let first = times.iter().rposition(|at| *at < placed).unwrap_or(0);
        times.drain(..first);
        for pair in times.windows(2) {
            assert!(
                pair[1] - pair[0] >= COOLDOWN,
                "session {session} acquired twice within {:?}:\n{}",
                pair[1] - pair[0],
                story(&events, *session, changed)
            );
        }
    }
    let fewest: usize = hot
        .iter()
        .zip(&weights)
        .map(|(&hot, &w)| hot.saturating_sub(30 * w as usize / total as usize))
        .sum();
    println!(
        "{weights:?}: within the band after {took:.1?} (band reached at {:.0?}, \
         5 s later {after:.0?}); {moves} moves by load (each hot session a host held over its \
         share, moved once: {fewest}), {acquisitions} acquisitions since the load changed",
        balanced
    );
    assert!(moves > 0, "the balance moved sessions");

    // --- every journal advancing throughout, and sound
    let acks = shared.acks.lock().unwrap().clone();
    for session in &sessions {
        let times: Vec<Instant> = std::iter::once(changed)
            .chain(acks[session].iter().copied().filter(|at| *at >= changed))
            .chain(std::iter::once(end))
            .collect();
        let gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(
            gap <= GAP_BOUND,
            "session {session} went {gap:?} without an append"
        );
    }
    let histories = std::mem::take(&mut *shared.histories.lock().unwrap());
    let store = etcd.store("checker", 10).await;
    for session in &sessions {
        check_journal(&store, *session, &histories[session])
            .await
            .unwrap_or_else(|violation| panic!("{violation}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hot_sessions_spread_by_load() {
    spread([1, 1, 1], [20, 10, 0], load_balance()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hot_sessions_spread_by_load_and_weight() {
    // Every session's load published, not only the 16 hottest of each host.
    let load = load_balance().with_published_sessions(200);
    spread([2, 1, 1], [0, 15, 15], load).await;
}
