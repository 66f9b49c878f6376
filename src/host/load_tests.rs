use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::{HostLoad, Meter, Move, SessionLoad, hottest, plan, published, shed_order, targets};

fn host(n: u128, load: f64, weight: u32) -> HostLoad {
    HostLoad {
        store: Uuid::from_u128(n),
        load,
        weight,
        takes: true,
    }
}

fn sessions(loads: &[f64]) -> Vec<SessionLoad> {
    loads
        .iter()
        .enumerate()
        .map(|(i, &load)| SessionLoad {
            session: Uuid::from_u128(100 + i as u128),
            load,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_meter_counts_appends_per_second_unless_the_work_reports_its_load() {
    let (second, half_life) = (Duration::from_secs(1), Duration::from_secs(1));
    let t0 = Instant::now();
    let mut meter = Meter::new(10, t0);
    assert_eq!(meter.load(), 0.0);
    // 20 appends in 2 s.
    assert_eq!(meter.sample(None, 30, t0 + second * 2, half_life), 10.0);
    // Sampled twice at once: the same load.
    assert_eq!(meter.sample(None, 30, t0 + second * 2, half_life), 10.0);
    // The work reports 25 for a second: the two seconds before weigh half as much now.
    let load = meter.sample(Some(25.0), 90, t0 + second * 3, half_life);
    assert!((load - (10.0 + 25.0) / 2.0).abs() < 1e-9, "{load}");
    // Then 4 for two seconds: each interval before weighs as of its end, the two seconds at
    // 10 three half-lives ago (1/8), the second at 25 two (1/4).
    let load = meter.sample(Some(4.0), 90, t0 + second * 5, half_life);
    let expected = (10.0 * 2.0 / 8.0 + 25.0 / 4.0 + 4.0 * 2.0) / (2.0 / 8.0 + 1.0 / 4.0 + 2.0);
    assert!((load - expected).abs() < 1e-9, "{load}, not {expected}");
    // A report that is not a load counts as 0; so does a half-life of 0, all but the last.
    let mut meter = Meter::new(0, t0);
    assert_eq!(meter.sample(Some(f64::NAN), 5, t0 + second, half_life), 0.0);
    assert_eq!(
        meter.sample(Some(4.0), 5, t0 + second * 2, Duration::ZERO),
        4.0
    );
    assert_eq!(published(-3.0), 0.0);
    assert_eq!(published(f64::INFINITY), 0.0);
    assert_eq!(published(1.23456), 1.235);
}

#[tokio::test(start_paused = true)]
async fn a_level_held_for_one_half_life_counts_for_half() {
    let (tick, half_life) = (Duration::from_secs(1), Duration::from_secs(30));
    let mut at = Instant::now();
    let mut meter = Meter::new(0, at);
    // Twenty half-lives at 2 (the average is settled), then one at 8.
    for level in std::iter::repeat_n(2.0, 600).chain(std::iter::repeat_n(8.0, 30)) {
        at += tick;
        meter.sample(Some(level), 0, at, half_life);
    }
    assert!((meter.load() - 5.0).abs() < 1e-3, "{}", meter.load());
}

#[tokio::test(start_paused = true)]
async fn a_first_sample_weighs_as_little_as_the_time_it_covers() {
    // One append 50 ms after the acquisition (20 a second, for so short a time), then 5 a
    // second: the load is near 5 at once, not 20 for a half-life.
    let half_life = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut meter = Meter::new(1, t0);
    let first = meter.sample(None, 2, t0 + Duration::from_millis(50), half_life);
    assert!((first - 20.0).abs() < 1e-9, "{first}");
    let then = meter.sample(None, 7, t0 + Duration::from_millis(1050), half_life);
    assert!((5.0..5.8).contains(&then), "{then}");
    let later = meter.sample(None, 12, t0 + Duration::from_millis(2050), half_life);
    assert!((5.0..5.4).contains(&later), "{later}");
}

#[test]
fn targets_are_the_weights_shares_of_the_total() {
    let hosts = [host(1, 385.0, 2), host(2, 290.0, 1), host(3, 195.0, 1)];
    assert_eq!(targets(&hosts), [435.0, 217.5, 217.5]);
    let mut draining = hosts.clone();
    draining[2].takes = false;
    assert_eq!(targets(&draining), [580.0, 290.0, 0.0]);
    // No weight among those that take: no target (not a division by 0).
    let weightless = [host(1, 10.0, 0), host(2, 20.0, 0)];
    assert_eq!(targets(&weightless), [0.0, 0.0]);
}

#[test]
fn the_band_s_edge_is_within_it() {
    // Targets 100, a band of 25 %: 125 and 85 are within it.
    let hosts = [host(1, 125.0, 1), host(2, 85.0, 1), host(3, 90.0, 1)];
    assert_eq!(plan(0, &hosts, &sessions(&[15.0]), 0.25), None);
    // Over by 10 and host 3 under by 40 (half a band: 12.5): a session of 6.25 closes exactly
    // 12.5, not more: not worth it. One of 6.5 closes 13.
    let hosts = [host(1, 110.0, 1), host(2, 130.0, 1), host(3, 60.0, 1)];
    assert_eq!(plan(0, &hosts, &sessions(&[6.25]), 0.25), None);
    assert!(plan(0, &hosts, &sessions(&[6.5]), 0.25).is_some());
}

#[test]
fn a_host_that_takes_no_sessions_moves_none_by_load() {
    let mut hosts = [host(1, 100.0, 1), host(2, 50.0, 1), host(3, 50.0, 1)];
    hosts[0].takes = false;
    assert_eq!(plan(0, &hosts, &sessions(&[20.0, 30.0]), 0.1), None);
}

#[test]
fn the_host_furthest_below_is_so_by_its_share_not_its_load() {
    // Weights 1:2:1, targets 100, 200, 100: host 2 (150 of 200) is further below than host 3
    // (90 of 100), though its load is higher.
    let hosts = [host(1, 160.0, 1), host(2, 150.0, 2), host(3, 90.0, 1)];
    let planned = plan(0, &hosts, &sessions(&[50.0]), 0.1).unwrap();
    assert_eq!(planned.to, Uuid::from_u128(2));
}

#[test]
fn a_host_within_its_band_moves_nothing() {
    let mine = sessions(&[20.0, 10.0, 1.0]);
    // Target 100 each; 109 and 91 are within a band of 10 %.
    let hosts = [host(1, 109.0, 1), host(2, 100.0, 1), host(3, 91.0, 1)];
    assert_eq!(plan(0, &hosts, &mine, 0.1), None);
    // 111 is not.
    let hosts = [host(1, 111.0, 1), host(2, 100.0, 1), host(3, 89.0, 1)];
    assert!(plan(0, &hosts, &mine, 0.1).is_some());
    // A host under its target moves nothing, whatever the others.
    assert_eq!(plan(2, &hosts, &mine, 0.1), None);
    // Within the band itself, but another host is under it by more: it moves.
    let hosts = [host(1, 105.0, 1), host(2, 107.0, 1), host(3, 88.0, 1)];
    assert!(plan(0, &hosts, &mine, 0.1).is_some());
}

#[test]
fn the_move_that_best_closes_both_gaps_goes_to_the_host_furthest_below() {
    let mine = sessions(&[20.0, 1.0, 1.0, 40.0, 5.0]);
    // Targets 290: over by 95; host 3 under by 95, host 2 at its target.
    let hosts = [host(1, 385.0, 1), host(2, 290.0, 1), host(3, 195.0, 1)];
    let planned = plan(0, &hosts, &mine, 0.1).unwrap();
    assert_eq!(planned.to, Uuid::from_u128(3));
    assert_eq!(planned.load, 40.0, "the one that closes the most");
    // Gaps of 15: the 20 closes 15 (what a 15 would), the 5 closes only 5.
    let hosts = [host(1, 305.0, 1), host(2, 290.0, 1), host(3, 275.0, 1)];
    let planned = plan(0, &hosts, &mine, 0.01).unwrap();
    assert_eq!(planned.load, 20.0);
    // Gaps of 15 and 30 (two hosts under): the 20 and the 40 would both close 30 in all;
    // the colder is moved, to the host furthest below.
    let hosts = [host(1, 320.0, 1), host(2, 290.0, 1), host(3, 260.0, 1)];
    let planned = plan(0, &hosts, &mine, 0.01).unwrap();
    assert_eq!((planned.load, planned.to), (20.0, Uuid::from_u128(3)));
}

#[test]
fn a_move_that_closes_less_than_half_a_band_is_not_made() {
    // Host 1 barely over its target (290), host 3 under it by more than the band: a cold
    // session would close 2 of the gaps, a hot one no more; half a band is 14.5.
    let mine = sessions(&[1.0, 1.0, 20.0]);
    let hosts = [host(1, 291.0, 1), host(2, 320.0, 1), host(3, 259.0, 1)];
    assert_eq!(plan(0, &hosts, &mine, 0.1), None);
    // Host 2, over by 30: its hot session closes 40.
    let planned = plan(1, &hosts, &mine, 0.1).unwrap();
    assert_eq!((planned.load, planned.to), (20.0, Uuid::from_u128(3)));
}

#[test]
fn a_session_heavier_than_both_gaps_together_stays() {
    // One giant of 500 and a host that holds it alone.
    let mine = sessions(&[500.0]);
    let hosts = [host(1, 500.0, 1), host(2, 50.0, 1), host(3, 50.0, 1)];
    assert_eq!(plan(0, &hosts, &mine, 0.1), None);
    // Its smaller sessions do move.
    let mine = sessions(&[500.0, 10.0, 10.0]);
    let hosts = [host(1, 520.0, 1), host(2, 50.0, 1), host(3, 50.0, 1)];
    let planned = plan(0, &hosts, &mine, 0.1).unwrap();
    assert_eq!(planned.load, 10.0);
}

#[test]
fn no_load_and_no_room_move_nothing() {
    let mine = sessions(&[0.0, 0.0]);
    let idle = [host(1, 0.0, 1), host(2, 0.0, 1)];
    assert_eq!(plan(0, &idle, &mine, 0.1), None);
    // Every other host drains.
    let mine = sessions(&[5.0, 5.0]);
    let mut hosts = [host(1, 10.0, 1), host(2, 0.0, 1)];
    hosts[1].takes = false;
    assert_eq!(plan(0, &hosts, &mine, 0.1), None);
    // Not in the list: no plan.
    assert_eq!(plan(5, &hosts, &mine, 0.1), None);
}

#[test]
fn a_host_publishes_at_most_the_most_sessions_loads() {
    use crate::host::{LoadBalance, MAX_PUBLISHED_SESSIONS};
    assert_eq!(LoadBalance::default().published_sessions, 16);
    let many = LoadBalance::default().with_published_sessions(usize::MAX);
    assert_eq!(many.published_sessions, MAX_PUBLISHED_SESSIONS);
}

#[test]
fn a_host_lists_its_hottest_sessions_first_and_none_idle() {
    let id = |n: u128| Uuid::from_u128(n);
    let loads = [
        (id(1), 0.5),
        (id(2), 0.0),
        (id(3), 20.0),
        (id(4), 0.5),
        (id(5), 3.0),
    ];
    assert_eq!(
        hottest(loads.into_iter(), 3),
        [(id(3), 20.0), (id(5), 3.0), (id(1), 0.5)]
    );
    assert_eq!(hottest(loads.into_iter(), 10).len(), 4, "none of load 0");
    assert!(hottest(loads.into_iter(), 0).is_empty());
}

#[test]
fn shedding_by_count_prefers_sessions_out_of_their_cooldown_then_the_nearest_load() {
    let id = Uuid::from_u128;
    let mut order = vec![
        (id(1), 20.0, true),
        (id(2), 1.0, false),
        (id(3), 1.0, true),
        (id(4), 5.0, true),
    ];
    shed_order(&mut order, 0.0);
    let ids: Vec<Uuid> = order.iter().map(|s| s.0).collect();
    assert_eq!(
        ids,
        [id(3), id(4), id(1), id(2)],
        "coldest first, cooling last"
    );
    shed_order(&mut order, 18.0);
    let ids: Vec<Uuid> = order.iter().map(|s| s.0).collect();
    assert_eq!(
        ids,
        [id(1), id(4), id(3), id(2)],
        "nearest the load to shed first"
    );
    // Nearest by distance, above or below, whatever the order before.
    for (each, nearest) in [(6.0, id(1)), (8.0, id(2))] {
        let (four, nine) = ((id(1), 4.0, true), (id(2), 9.0, true));
        for mut order in [vec![four, nine], vec![nine, four]] {
            shed_order(&mut order, each);
            assert_eq!(order[0].0, nearest, "shedding {each} each");
        }
    }
}

/// A fleet as the hosts balance it: each host plans within a budget per round, against the
/// loads published at the round's start; each move is followed by the count's return (the
/// target sheds its coldest session, which the mover takes back).
struct Fleet {
    weights: Vec<u32>,
    /// Each host's sessions' loads.
    held: Vec<Vec<SessionLoad>>,
    moves: usize,
}

impl Fleet {
    fn loads(&self) -> Vec<f64> {
        self.held
            .iter()
            .map(|held| held.iter().map(|s| s.load).sum())
            .collect()
    }

    fn hosts(&self) -> Vec<HostLoad> {
        let loads = self.loads();
        (0..self.held.len())
            .map(|h| host(h as u128, loads[h], self.weights[h]))
            .collect()
    }

    /// One round: every host plans at most `budget` moves; true if any was made.
    fn round(&mut self, budget: usize, band: f64) -> bool {
        let published = self.hosts();
        let mut moved = false;
        for me in 0..self.held.len() {
            let mut seen = published.clone();
            seen[me].load = self.loads()[me];
            let mut cooling: Vec<Uuid> = Vec::new();
            for _ in 0..budget {
                let movable: Vec<SessionLoad> = self.held[me]
                    .iter()
                    .filter(|s| !cooling.contains(&s.session))
                    .copied()
                    .collect();
                let Some(Move { session, load, to }) = plan(me, &seen, &movable, band) else {
                    break;
                };
                let to = to.as_u128() as usize;
                let at = self.held[me]
                    .iter()
                    .position(|s| s.session == session)
                    .unwrap();
                let taken = self.held[me].remove(at);
                // The target sheds its coldest (it was not moved there), the mover takes it.
                let coldest = (0..self.held[to].len())
                    .min_by(|&a, &b| self.held[to][a].load.total_cmp(&self.held[to][b].load))
                    .unwrap();
                let back = self.held[to].remove(coldest);
                self.held[to].push(taken);
                cooling.push(back.session);
                self.held[me].push(back);
                seen[me].load += back.load - load;
                seen[to].load += load - back.load;
                self.moves += 1;
                moved = true;
            }
        }
        moved
    }
}

/// 300 sessions, 30 of them 20 times as heavy, placed by count with the hot ones uneven:
/// `hot[h]` on host `h`.
fn fleet(weights: &[u32], counts: &[usize], hot: &[usize]) -> Fleet {
    let mut next = 0u128;
    let mut session = |load| {
        next += 1;
        SessionLoad {
            session: Uuid::from_u128(next),
            load,
        }
    };
    let held = counts
        .iter()
        .zip(hot)
        .map(|(&count, &hot)| {
            (0..count)
                .map(|i| session(if i < hot { 20.0 } else { 1.0 }))
                .collect()
        })
        .collect();
    Fleet {
        weights: weights.to_vec(),
        held,
        moves: 0,
    }
}

fn within_band(fleet: &Fleet, band: f64) -> bool {
    let targets = targets(&fleet.hosts());
    fleet
        .loads()
        .iter()
        .zip(&targets)
        .all(|(load, target)| (load - target).abs() <= target * band)
}

#[test]
fn hot_sessions_placed_by_count_spread_within_the_band_in_a_few_moves() {
    for (weights, counts, hot) in [
        (vec![1, 1, 1], vec![100, 100, 100], vec![20, 10, 0]),
        (vec![1, 1, 1], vec![100, 100, 100], vec![30, 0, 0]),
        (vec![2, 1, 1], vec![150, 75, 75], vec![0, 15, 15]),
        (vec![2, 1, 1], vec![150, 75, 75], vec![30, 0, 0]),
    ] {
        let mut fleet = fleet(&weights, &counts, &hot);
        assert!(
            !within_band(&fleet, 0.1),
            "{weights:?} {hot:?} starts out of its band"
        );
        let mut rounds = 0;
        while fleet.round(2, 0.1) {
            rounds += 1;
            assert!(
                rounds < 20,
                "{weights:?} {hot:?}: still moving after 20 rounds"
            );
        }
        assert!(
            within_band(&fleet, 0.1),
            "{weights:?} {hot:?}: {:?}",
            fleet.loads()
        );
        // The fewest moves: each hot session a host holds beyond its share, moved once.
        let loads: Vec<usize> = fleet.held.iter().map(Vec::len).collect();
        assert_eq!(loads, counts, "the counts are kept");
        let total: u32 = weights.iter().sum();
        let fewest: usize = hot
            .iter()
            .zip(&weights)
            .map(|(&hot, &w)| hot.saturating_sub(30 * w as usize / total as usize))
            .sum();
        assert!(
            fleet.moves <= fewest + 2,
            "{weights:?} {hot:?}: {} moves, the fewest {fewest}",
            fleet.moves
        );
        println!(
            "{weights:?} {hot:?}: {} moves in {rounds} rounds (fewest {fewest})",
            fleet.moves
        );
    }
}

#[test]
fn loads_that_are_alike_move_nothing() {
    for hot in [[10, 10, 10], [0, 0, 0], [11, 10, 9]] {
        let mut alike = fleet(&[1, 1, 1], &[100, 100, 100], &hot);
        assert!(!alike.round(2, 0.1), "{hot:?}");
    }
}

#[test]
fn a_session_heavier_than_a_share_stays_and_the_hot_ones_move_off_its_host() {
    // Host 0 holds a session of load 600 (more than a host's share of the 1,170 in all) and
    // 10 of the 30 hot sessions; hosts 1 and 2 hold 10 each.
    let mut fleet = fleet(&[1, 1, 1], &[100, 100, 100], &[10, 10, 10]);
    let giant = fleet.held[0][99].session;
    fleet.held[0][99].load = 600.0;
    let mut rounds = 0;
    while fleet.round(2, 0.1) {
        rounds += 1;
        assert!(
            rounds < 20,
            "still moving after 20 rounds: {:?}",
            fleet.loads()
        );
    }
    assert!(
        fleet.held[0].iter().any(|s| s.session == giant),
        "the heavy session stays where it is"
    );
    let hot: Vec<usize> = fleet
        .held
        .iter()
        .map(|held| held.iter().filter(|s| s.load == 20.0).count())
        .collect();
    assert_eq!(hot, [0, 15, 15], "its host's hot sessions moved off it");
    assert_eq!(fleet.moves, 10, "each of those once: {:?}", fleet.loads());
}
