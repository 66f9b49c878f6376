use std::time::Duration;

use super::shares::{Quota, shares, weighted_shares};
use super::{leave_bound, to_shed};
use crate::etcd::WritePolicy;

#[test]
fn a_huge_attempt_timeout_leaves_without_a_bound_and_without_overflow() {
    let policy = WritePolicy::default().with_attempt_timeout(Duration::MAX);
    assert_eq!(leave_bound(&policy), Duration::MAX);
    assert!(
        tokio::time::Instant::now()
            .checked_add(leave_bound(&policy))
            .is_none()
    );
    let policy = WritePolicy::default().with_attempt_timeout(Duration::from_secs(1));
    assert_eq!(leave_bound(&policy), Duration::from_secs(3));
}

#[test]
fn sessions_on_their_way_out_count_as_shed() {
    // 150 held, the cap down to 100: 50 to shed.
    assert_eq!(to_shed(150, 0, 150, 100), 50);
    // A tick later 20 of those are still shutting down: none more.
    assert_eq!(to_shed(120, 20, 100, 100), 0);
    // A session finishing (its token cancelled) on a host at its cap sheds no other.
    assert_eq!(to_shed(5, 1, 4, 4), 0);
    assert_eq!(to_shed(3, 5, 0, 1), 0);
    // A move's acquisition under way, over the cap: nothing until it is owned.
    assert_eq!(to_shed(101, 0, 100, 100), 0);
    assert_eq!(to_shed(101, 0, 101, 100), 1);
}

#[test]
fn shares_add_up_and_differ_by_at_most_one() {
    for wanted in 0..40 {
        for live in 1..7usize {
            let shares = shares(wanted, &vec![None; live]);
            assert_eq!(shares.iter().sum::<usize>(), wanted, "{wanted} over {live}");
            let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(max - min <= 1, "{wanted} over {live}: {shares:?}");
            assert!(
                shares.windows(2).all(|w| w[0] >= w[1]),
                "earlier hosts first"
            );
        }
    }
}

#[test]
fn a_capped_host_leaves_the_rest_to_the_others() {
    assert_eq!(shares(10, &[Some(3), None]), [3, 7]);
    assert_eq!(shares(10, &[None, Some(3), None]), [4, 3, 3]);
    assert_eq!(
        shares(10, &[Some(2), Some(2)]),
        [2, 2],
        "no more than the maxima"
    );
    assert_eq!(
        shares(30, &[Some(0), None, None, Some(20)]),
        [0, 10, 10, 10]
    );
    // Any maxima: never above a maximum, the total as large as it can be.
    for wanted in 0..25 {
        for a in 0..6 {
            for b in 0..6 {
                let maxima = [Some(a), None, Some(b), None];
                let got = shares(wanted, &maxima);
                assert_eq!(
                    got.iter().sum::<usize>(),
                    wanted,
                    "{wanted} {maxima:?}: {got:?}"
                );
                assert!(got[0] <= a && got[2] <= b);
                let maxima = [Some(a), Some(b)];
                let got = shares(wanted, &maxima);
                assert_eq!(
                    got.iter().sum::<usize>(),
                    wanted.min(a + b),
                    "{wanted} {maxima:?}"
                );
            }
        }
    }
}

fn quotas(weights: &[u32]) -> Vec<Quota> {
    weights
        .iter()
        .map(|&weight| Quota { max: None, weight })
        .collect()
}

#[test]
fn shares_follow_the_weights() {
    assert_eq!(weighted_shares(300, &quotas(&[2, 1, 1])), [150, 75, 75]);
    assert_eq!(weighted_shares(301, &quotas(&[1, 2, 1])), [76, 150, 75]);
    assert_eq!(weighted_shares(10, &quotas(&[0, 1, 1])), [0, 5, 5]);
    assert_eq!(weighted_shares(10, &quotas(&[0, 0])), [0, 0]);
    assert_eq!(weighted_shares(7, &quotas(&[u32::MAX, u32::MAX])), [4, 3]);
    // A capped heavy host leaves the rest to the others, by their weights.
    let capped = [
        Quota {
            max: Some(10),
            weight: 4,
        },
        Quota {
            max: None,
            weight: 1,
        },
        Quota {
            max: None,
            weight: 3,
        },
    ];
    assert_eq!(weighted_shares(90, &capped), [10, 20, 60]);
    for wanted in 0..60 {
        for weights in [[1, 2, 3], [3, 0, 1], [5, 5, 1], [1, 1, 1]] {
            let got = weighted_shares(wanted, &quotas(&weights));
            assert_eq!(got.iter().sum::<usize>(), wanted, "{wanted} {weights:?}");
            let total: u32 = weights.iter().sum();
            for (share, weight) in got.iter().zip(weights) {
                let exact = wanted as f64 * f64::from(weight) / f64::from(total);
                assert!(
                    (*share as f64 - exact).abs() < 1.0,
                    "{wanted} {weights:?}: {got:?}"
                );
            }
        }
    }
}
