//! Prometheus metrics, named as controller-runtime names its webhook metrics.

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

/// The webhook's metrics and the registry that exposes them.
pub struct Metrics {
    registry: Registry,
    requests: Family<CodeLabel, Counter>,
    latency: Histogram,
    in_flight: Gauge<i64, AtomicI64>,
    mutations: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("node_holder");
        let requests = Family::<CodeLabel, Counter>::default();
        // 50 us .. ~1.6 s
        let latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        let in_flight = Gauge::<i64, AtomicI64>::default();
        let mutations = Counter::default();
        registry.register(
            "webhook_requests",
            "Webhook requests by HTTP status code",
            requests.clone(),
        );
        registry.register(
            "webhook_latency_seconds",
            "Webhook request latency",
            latency.clone(),
        );
        registry.register(
            "webhook_requests_in_flight",
            "Webhook requests being served",
            in_flight.clone(),
        );
        registry.register(
            "webhook_mutations",
            "Node CREATEs the webhook put holds on",
            mutations.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            in_flight,
            mutations,
        }
    }
}

/// Counts a request as in flight until dropped.
pub struct InFlight(Gauge<i64, AtomicI64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    pub fn observe(&self, code: u16, latency: Duration) {
        self.requests
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .inc();
        self.latency.observe(latency.as_secs_f64());
    }

    pub fn mutation(&self) {
        self.mutations.inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}
