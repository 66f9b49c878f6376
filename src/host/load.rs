//! Load: what each owned session costs, smoothed, and the balance by load, a pure step over
//! the hosts' published loads (see the [module docs](super#load)).

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

/// A load as a host publishes it: finite, at least 0, rounded to a thousandth.
pub(super) fn published(load: f64) -> f64 {
    if load.is_finite() && load > 0.0 {
        (load * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// The `n` sessions of highest load among `loads`, the hottest first (by session id on ties),
/// none of load 0.
pub(super) fn hottest(loads: impl Iterator<Item = (Uuid, f64)>, n: usize) -> Vec<(Uuid, f64)> {
    let mut loads: Vec<(Uuid, f64)> = loads.filter(|(_, load)| *load > 0.0).collect();
    loads.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    loads.truncate(n);
    loads
}

/// One owned session's load: what its work reports ([`Rig::set_load`](crate::Rig::set_load)),
/// else its appends per second, averaged over time with weights that halve every half-life.
///
/// The meter keeps two decayed sums since the session's acquisition: of load × seconds (an
/// interval's appends, or the reported load times the interval's length), and of seconds. The
/// load is their ratio. Each interval weighs by how long it lasted: a first sample taken a few
/// milliseconds after an acquisition, with one append in it, weighs as little as it covers,
/// where a plain average of samples would take it as the session's rate and keep it for a
/// half-life. Under a steady stream of samples the two are the same average.
#[derive(Debug)]
pub(super) struct Meter {
    /// Load × seconds, decayed.
    sum: f64,
    /// Seconds, decayed.
    weight: f64,
    /// The journal's next sequence number at the last sample, and when it was taken.
    seq: u64,
    at: Instant,
}

impl Meter {
    pub(super) fn new(seq: u64, at: Instant) -> Self {
        Self {
            sum: 0.0,
            weight: 0.0,
            seq,
            at,
        }
    }

    /// Takes a sample at `now`, the journal's next sequence number then being `seq` and the
    /// work's report `reported`: the load.
    pub(super) fn sample(
        &mut self,
        reported: Option<f64>,
        seq: u64,
        now: Instant,
        half_life: Duration,
    ) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        if elapsed <= 0.0 {
            return self.load();
        }
        let carried = match reported {
            Some(load) => published(load) * elapsed,
            None => seq.saturating_sub(self.seq) as f64,
        };
        let kept = if half_life.is_zero() {
            0.0
        } else {
            0.5f64.powf(elapsed / half_life.as_secs_f64())
        };
        self.sum = self.sum * kept + carried;
        self.weight = self.weight * kept + elapsed;
        (self.seq, self.at) = (seq, now);
        self.load()
    }

    /// The load (0 before the first sample).
    pub(super) fn load(&self) -> f64 {
        if self.weight > 0.0 {
            self.sum / self.weight
        } else {
            0.0
        }
    }
}

/// A host as the balance by load sees it: its store, its load (as published, or this host's
/// own now), its weight, and whether it takes sessions (settled, not draining).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct HostLoad {
    pub(super) store: Uuid,
    pub(super) load: f64,
    pub(super) weight: u32,
    pub(super) takes: bool,
}

/// A session this host may move: its load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SessionLoad {
    pub(super) session: Uuid,
    pub(super) load: f64,
}

/// A move the balance by load asks for: `session`, of load `load`, to the host of store `to`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Move {
    pub(super) session: Uuid,
    pub(super) load: f64,
    pub(super) to: Uuid,
}

/// Each host's target: its weight's share of the total load (0 for a host that takes none).
pub(super) fn targets(hosts: &[HostLoad]) -> Vec<f64> {
    let total: f64 = hosts.iter().map(|host| host.load).sum();
    let weights: f64 = hosts
        .iter()
        .filter(|host| host.takes)
        .map(|host| f64::from(host.weight))
        .sum();
    hosts
        .iter()
        .map(|host| {
            if host.takes && weights > 0.0 {
                total * f64::from(host.weight) / weights
            } else {
                0.0
            }
        })
        .collect()
}

/// The balance by load, one step, for the host `me` (an index into `hosts`), which may move
/// the sessions of `movable`: `None` unless its load is over its target and some host's load
/// (its own, or another's) is off its target by more than `band` (a fraction of the target).
/// Otherwise the move of one of its sessions to the host furthest
/// below its target (by the ratio of load to target) that best closes both gaps: a session
/// whose load lies between the two gaps closes the smaller one whole, the coldest such
/// preferred; one whose load exceeds both gaps together would leave them no smaller, and is
/// never moved (a session heavier than a share stays where it is), and so is one whose move
/// would close less than half a band (the smaller target's): not worth two handovers. Every
/// host computes its own step from the same published loads; the caller bounds how many steps
/// it takes.
pub(super) fn plan(
    me: usize,
    hosts: &[HostLoad],
    movable: &[SessionLoad],
    band: f64,
) -> Option<Move> {
    let targets = targets(hosts);
    let mine = hosts.get(me)?;
    let over = mine.load - targets[me];
    let out_of_band = |i: usize| (hosts[i].load - targets[i]).abs() > targets[i] * band;
    // Over its target, and it or another host out of the band.
    let someone_out = out_of_band(me) || (0..hosts.len()).any(|i| hosts[i].takes && out_of_band(i));
    if !mine.takes || over <= 0.0 || !someone_out {
        return None;
    }
    let (to, under, target) = hosts
        .iter()
        .enumerate()
        .filter(|&(i, host)| i != me && host.takes && host.load < targets[i])
        .min_by(|&(i, a), &(j, b)| {
            let ratio = |host: &HostLoad, target: f64| host.load / target;
            ratio(a, targets[i]).total_cmp(&ratio(b, targets[j]))
        })
        .map(|(i, host)| (host.store, targets[i] - host.load, targets[i]))?;
    // How much the sum of the two gaps shrinks when a session of load `g` moves; a move is
    // worth its two handovers only if that is at least half a band.
    let closes = |g: f64| over + under - (over - g).abs() - (under - g).abs();
    let worth = band * targets[me].min(target) / 2.0;
    let best = movable
        .iter()
        .filter(|session| session.load > 0.0 && closes(session.load) > worth.max(0.0))
        .max_by(|a, b| {
            closes(a.load)
                .total_cmp(&closes(b.load))
                // The colder of two that close as much.
                .then(b.load.total_cmp(&a.load))
                .then(b.session.cmp(&a.session))
        })?;
    Some(Move {
        session: best.session,
        load: best.load,
        to,
    })
}

/// The order in which a host over its share of the count sheds its sessions: those out of
/// their cooldown first, and among them those whose load is nearest `each` (what each shed
/// session should take away for the host's load to reach its target: 0, the coldest first,
/// when it is at or below it).
pub(super) fn shed_order(sessions: &mut [(Uuid, f64, bool)], each: f64) {
    sessions.sort_by(|a, b| {
        let (a_cool, b_cool) = (a.2, b.2);
        b_cool
            .cmp(&a_cool)
            .then((a.1 - each).abs().total_cmp(&(b.1 - each).abs()))
            .then(a.0.cmp(&b.0))
    });
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
