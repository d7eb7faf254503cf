//! The Prometheus text format as the tests and benchmarks read it: one
//! parser for node-holder's, Karpenter's and the API server's `/metrics`.

use std::collections::BTreeMap;

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `key`; empty when absent.
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// Every sample of `text`; comments and lines that are no sample skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(sample)
}

/// The samples of metric `name`.
pub fn named<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = Sample<'a>> {
    samples(text).filter(move |s| s.name == name)
}

/// One line as a sample, if it is one. Label values with escaped quotes are
/// not handled: no metric read here has them.
pub fn sample(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}')?),
        None => (series, ""),
    };
    let mut map = BTreeMap::new();
    let mut rest = labels;
    while let Some((key, after)) = rest.split_once("=\"") {
        let end = after.find('"')?;
        map.insert(
            key.trim_start_matches(',').to_string(),
            after[..end].to_string(),
        );
        rest = &after[end + 1..];
    }
    Some(Sample {
        name,
        labels: map,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_labels() {
        let text = "# HELP x y\nup 1\nreqs_total{code=\"200\",path=\"/m\"} 3.5\nbad line\n";
        let all: Vec<Sample> = samples(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].name, all[0].value), ("up", 1.0));
        assert_eq!(all[1].label("code"), "200");
        assert_eq!(all[1].label("path"), "/m");
        assert_eq!(all[1].label("none"), "");
        assert_eq!(named(text, "reqs_total").map(|s| s.value).sum::<f64>(), 3.5);
    }
}
