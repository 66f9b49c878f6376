//! The shares of the count: every host computes the same from the same list.

/// What a host's key says of its share: its maximum, and its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::host) struct Quota {
    pub(in crate::host) max: Option<usize>,
    pub(in crate::host) weight: u32,
}

/// The shares of `wanted` sessions among hosts (in key order) with these maxima, all of weight
/// 1; see [`weighted_shares`].
#[cfg(test)]
pub(in crate::host) fn shares(wanted: usize, maxima: &[Option<usize>]) -> Vec<usize> {
    let quotas: Vec<Quota> = maxima.iter().map(|&max| Quota { max, weight: 1 }).collect();
    weighted_shares(wanted, &quotas)
}

/// The shares of `wanted` sessions among hosts (in key order) with these quotas: proportional
/// to the weights as far as the maxima allow (a host's share is `left · weight / Σ weights`,
/// rounded down, the earlier hosts taking one more each until all are given; a host whose
/// maximum is below that takes its maximum, and the rest share what is left the same way), so
/// hosts of equal weight below their maximum differ by at most one; adding up to `wanted`, or
/// to what the maxima and weights allow, whichever is less. Every host computes the same
/// shares from the same list.
pub(in crate::host) fn weighted_shares(wanted: usize, quotas: &[Quota]) -> Vec<usize> {
    let mut shares = vec![0; quotas.len()];
    // Hosts of weight 0 take nothing.
    let mut open: Vec<usize> = (0..quotas.len())
        .filter(|&h| quotas[h].weight > 0)
        .collect();
    let mut left = wanted;
    while !open.is_empty() {
        let total: u128 = open.iter().map(|&h| u128::from(quotas[h].weight)).sum();
        let base: Vec<usize> = open
            .iter()
            .map(|&h| (left as u128 * u128::from(quotas[h].weight) / total) as usize)
            .collect();
        let extra = left - base.iter().sum::<usize>();
        let fair = |rank: usize| base[rank] + usize::from(rank < extra);
        // Hosts whose maximum is below their fair share take their maximum; the rest share
        // what is left.
        let full: Vec<usize> = open
            .iter()
            .enumerate()
            .filter(|&(rank, &host)| quotas[host].max.is_some_and(|max| max < fair(rank)))
            .map(|(_, &host)| host)
            .collect();
        if full.is_empty() {
            for (rank, &host) in open.iter().enumerate() {
                shares[host] = fair(rank);
            }
            break;
        }
        for &host in &full {
            let max = quotas[host].max.unwrap_or(0);
            shares[host] = max;
            left -= max;
        }
        open.retain(|host| !full.contains(host));
    }
    shares
}
