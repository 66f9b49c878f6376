//! Reading a Prometheus text scrape.

use std::collections::BTreeMap;

/// A sample's metric name and its labels, sorted.
pub(crate) type Series = (String, BTreeMap<String, String>);

/// `name{labels} value` lines of a Prometheus text scrape, labels sorted.
pub(crate) fn parse(text: &str) -> BTreeMap<Series, f64> {
    let mut samples = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        samples.insert((name.to_owned(), labels), value.parse().unwrap());
    }
    samples
}
