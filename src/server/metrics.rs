//! The webhook's metrics, named as controller-runtime's (so operators'
//! dashboards fit), and the TLS port's.

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use strum::IntoEnumIterator;

use super::HandshakeFailure;
use crate::metrics::{CodeLabel, ReasonLabel, code_label, show_at_zero};

/// The webhook's answers known in advance, shown at 0 from the start so a
/// rate over them is 0, not absent (as controller-runtime does).
const WEBHOOK_CODES: [u16; 7] = [200, 400, 408, 413, 415, 500, 503];

#[derive(Clone)]
pub struct WebhookMetrics {
    requests: Family<CodeLabel, Counter>,
    latency: Histogram,
    in_flight: Gauge<i64, AtomicI64>,
    mutations: Counter,
}

impl WebhookMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let requests = Family::<CodeLabel, Counter>::default();
        for code in WEBHOOK_CODES {
            show_at_zero(&requests, code_label(code));
        }
        let metrics = WebhookMetrics {
            requests,
            // 50 us .. ~1.6 s
            latency: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            in_flight: Gauge::default(),
            mutations: Counter::default(),
        };
        registry.register(
            "webhook_requests",
            "Webhook requests by HTTP status code",
            metrics.requests.clone(),
        );
        registry.register(
            "webhook_latency_seconds",
            "Webhook request latency",
            metrics.latency.clone(),
        );
        registry.register(
            "webhook_requests_in_flight",
            "Webhook requests being served",
            metrics.in_flight.clone(),
        );
        registry.register(
            "webhook_mutations",
            "Node CREATEs the webhook put holds on",
            metrics.mutations.clone(),
        );
        metrics
    }

    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    pub fn observe(&self, code: u16, latency: Duration) {
        self.requests.get_or_create(&code_label(code)).inc();
        self.latency.observe(latency.as_secs_f64());
    }

    pub fn mutation(&self) {
        self.mutations.inc();
    }
}

/// Counts a request as in flight until dropped.
pub struct InFlight(Gauge<i64, AtomicI64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The webhook port's TLS: failed handshakes and the certificate's expiry.
#[derive(Clone, Default)]
pub struct TlsMetrics {
    handshake_errors: Family<ReasonLabel, Counter>,
    /// Connections closed at accept: their source had its share open.
    pub source_limited: Counter,
    /// Unix seconds of the serving certificate's notAfter.
    pub not_after: Gauge<i64, AtomicI64>,
}

impl TlsMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let tls = TlsMetrics::default();
        for reason in HandshakeFailure::iter() {
            let reason = reason.into();
            show_at_zero(&tls.handshake_errors, ReasonLabel { reason });
        }
        registry.register(
            "tls_handshake_errors",
            "Webhook connections that failed before TLS was up, by reason",
            tls.handshake_errors.clone(),
        );
        registry.register(
            "webhook_connections_source_limited",
            "Webhook connections closed at accept because their source address had a quarter of --max-connections open",
            tls.source_limited.clone(),
        );
        registry.register(
            "tls_certificate_not_after_seconds",
            "Unix time the webhook's serving certificate expires",
            tls.not_after.clone(),
        );
        tls
    }

    pub fn handshake_error(&self, reason: HandshakeFailure) {
        let reason = reason.into();
        self.handshake_errors
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}
