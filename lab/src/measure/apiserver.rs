//! The API server's own counters, from its `/metrics`: requests by resource
//! and verb, open long-running requests, and watchers the watch cache closed;
//! and what changed between two scrapes, less the bench's own requests.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

use super::observer::OwnSnapshot;

/// The API server's request counters (`apiserver_request_total`, by resource
/// and verb, all codes) and open long-running requests.
#[derive(Debug, Clone, Default)]
pub struct ApiMetrics {
    requests: BTreeMap<(String, String), f64>,
    longrunning: BTreeMap<(String, String), f64>,
    /// `apiserver_terminated_watchers_total`: watchers the watch cache closed
    /// because they did not keep up.
    terminated: BTreeMap<(String, String), f64>,
}

impl ApiMetrics {
    pub async fn scrape(admin: &kube::Client) -> Result<ApiMetrics> {
        let request = hyper::Request::get("/metrics").body(Vec::new())?;
        let text = admin
            .request_text(request)
            .await
            .context("API server /metrics")?;
        let mut metrics = ApiMetrics::default();
        for sample in text.lines().filter_map(testenv::metrics::sample) {
            metrics.add(sample);
        }
        Ok(metrics)
    }

    /// Counts `sample` if it is one of the counters kept (the API server's
    /// own component only).
    fn add(&mut self, sample: testenv::metrics::Sample<'_>) {
        let target = match sample.name {
            "apiserver_request_total" => &mut self.requests,
            "apiserver_longrunning_requests" => &mut self.longrunning,
            "apiserver_terminated_watchers_total" => &mut self.terminated,
            _ => return,
        };
        let labels = &sample.labels;
        if labels.get("component").is_some_and(|c| c != "apiserver") {
            return;
        }
        let key = (
            labels.get("resource").cloned().unwrap_or_default(),
            labels.get("verb").cloned().unwrap_or_default(),
        );
        *target.entry(key).or_default() += sample.value;
    }

    /// Requests between `earlier` and now, less the benchmark's own node
    /// LISTs and WATCHes in `own`.
    pub fn since(&self, earlier: &ApiMetrics, own: &OwnSnapshot) -> ApiDelta {
        let mut delta = BTreeMap::new();
        for (key, value) in &self.requests {
            let before = earlier.requests.get(key).copied().unwrap_or(0.0);
            delta.insert(key.clone(), value - before);
        }
        let key = |verb: &str| ("nodes".to_string(), verb.to_string());
        *delta.entry(key("LIST")).or_default() -= own.lists as f64;
        *delta.entry(key("WATCH")).or_default() -= own.watches_ended as f64;
        ApiDelta(delta)
    }

    /// The raw node counters, for the record.
    pub fn raw_nodes(&self, label: &str, own: &OwnSnapshot) -> String {
        let get = |map: &BTreeMap<(String, String), f64>, verb: &str| {
            map.get(&("nodes".to_string(), verb.to_string()))
                .copied()
                .unwrap_or(0.0)
        };
        format!(
            "{label:<22} LIST {:>5} WATCH ended {:>3} open {:>2} terminated {:>2} PATCH {:>6} POST {:>5} \
             | bench's own: LIST {} WATCH ended {} open {}",
            get(&self.requests, "LIST"),
            get(&self.requests, "WATCH"),
            self.open_watches("nodes"),
            self.terminated_nodes(),
            get(&self.requests, "PATCH"),
            get(&self.requests, "POST"),
            own.lists,
            own.watches_ended,
            own.open_watches
        )
    }

    /// Node watchers the watch cache closed for not keeping up.
    pub fn terminated_nodes(&self) -> f64 {
        self.terminated
            .iter()
            .filter(|((resource, _), _)| resource == "nodes")
            .fold(0.0, |sum, (_, v)| sum + v)
    }

    /// Open WATCHes of `resource`.
    pub fn open_watches(&self, resource: &str) -> f64 {
        self.longrunning
            .get(&(resource.to_string(), "WATCH".to_string()))
            .copied()
            .unwrap_or(0.0)
    }
}

/// Requests by resource and verb between two scrapes.
pub struct ApiDelta(BTreeMap<(String, String), f64>);

impl ApiDelta {
    pub fn get(&self, resource: &str, verb: &str) -> f64 {
        self.0
            .get(&(resource.to_string(), verb.to_string()))
            .copied()
            .unwrap_or(0.0)
    }

    pub fn nodes(&self, verb: &str) -> f64 {
        self.get("nodes", verb)
    }

    /// POSTs, PATCHes and PUTs of `resource`.
    pub fn writes(&self, resource: &str) -> f64 {
        ["POST", "PATCH", "PUT"]
            .iter()
            .fold(0.0, |sum, verb| sum + self.get(resource, verb))
    }

    pub fn event_writes(&self) -> f64 {
        self.writes("events")
    }
}
