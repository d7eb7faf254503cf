//! The hold window's metrics, set by the leader's task.

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use strum::IntoEnumIterator;

use super::error::FailureKind;
use crate::core::due::Reason;
use crate::core::plan::Action;
use crate::metrics::{CodeLabel, ReasonLabel, code_label, show_at_zero};

/// Node PATCH failures known in advance, shown at 0 from the start: no
/// response, forbidden, conflict, invalid, throttled, server errors.
const PATCH_ERROR_CODES: [u16; 7] = [0, 403, 409, 422, 429, 500, 503];

/// Whether a new node already carried the hold (from its CREATE) when the
/// window task first saw it: `held` or `unheld`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AtCreateLabel {
    at_create: &'static str,
}

/// A failed pass's kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The hold window's metrics (their help text says what each counts).
#[derive(Clone)]
pub struct WindowMetrics {
    pub deadline: Gauge<f64, AtomicU64>,
    pub hold: Gauge<f64, AtomicU64>,
    pub held_nodes: Gauge<i64, AtomicI64>,
    pub holds_applied: Counter,
    pub holds_released: Counter,
    held_until_stamps: Counter,
    new_nodes: Family<AtCreateLabel, Counter>,
    pass_failures: Family<KindLabel, Counter>,
    patch_errors: Family<CodeLabel, Counter>,
    pub leader: Gauge<i64, AtomicI64>,
    pub pass_duration: Histogram,
    pub schedule: ScheduleMetrics,
}

/// `--launch-cost`: what the schedule keeps, set by the leader each pass;
/// `--warm-before-runs`: what the warms did.
#[derive(Clone, Default)]
pub struct ScheduleMetrics {
    kept_nodes: Family<ReasonLabel, Gauge<i64, AtomicI64>>,
    unpredictable: Gauge<i64, AtomicI64>,
    warm_placeholders: Family<OutcomeLabel, Counter>,
    warm_node_seconds: Counter<f64, AtomicU64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

impl ScheduleMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = ScheduleMetrics::default();
        metrics.show(Reason::iter().map(|reason| (reason.into(), 0)), 0);
        registry.register(
            "schedule_kept_nodes",
            "With --launch-cost: nodes the schedule keeps, by reason: busy (running a CronJob's pod), run (idle, for a run due within the launch cost), settling (new, its pods not seen yet)",
            metrics.kept_nodes.clone(),
        );
        registry.register(
            "schedule_unpredictable_cronjobs",
            "With --launch-cost: CronJobs whose schedule node-holder cannot predict (their runs keep no node)",
            metrics.unpredictable.clone(),
        );
        for outcome in ["ready", "late"] {
            show_at_zero(&metrics.warm_placeholders, OutcomeLabel { outcome });
        }
        registry.register(
            "warm_placeholders",
            "With --warm-before-runs: placeholder pods at their run's start, by outcome: ready (on a node), late (still waiting for one)",
            metrics.warm_placeholders.clone(),
        );
        registry.register(
            "warm_node_seconds",
            "With --warm-before-runs: node-seconds the warm nodes were up before their runs started",
            metrics.warm_node_seconds.clone(),
        );
        metrics
    }

    /// Counts one run's hand-over.
    pub fn warmed(&self, ready: usize, late: usize, node_seconds: f64) {
        for (outcome, n) in [("ready", ready), ("late", late)] {
            let counter = self
                .warm_placeholders
                .get_or_create(&OutcomeLabel { outcome });
            counter.inc_by(n as u64);
        }
        self.warm_node_seconds.inc_by(node_seconds.max(0.0));
    }

    /// Shows one pass's nodes kept by reason, and the unpredictable CronJobs.
    pub fn show(&self, kept: impl Iterator<Item = (&'static str, usize)>, unpredictable: usize) {
        for (reason, n) in kept {
            let gauge = self.kept_nodes.get_or_create(&ReasonLabel { reason });
            gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.unpredictable
            .set(i64::try_from(unpredictable).unwrap_or(i64::MAX));
    }
}

impl WindowMetrics {
    pub fn applied(&self, action: Action) -> &Counter {
        match action {
            Action::Hold => &self.holds_applied,
            Action::Release => &self.holds_released,
            Action::Stamp => &self.held_until_stamps,
        }
    }

    /// Registers the hold window's metrics, each label's known values at 0 from the start.
    pub fn register(registry: &mut Registry) -> Self {
        let window = WindowMetrics {
            deadline: Gauge::default(),
            hold: Gauge::default(),
            held_nodes: Gauge::default(),
            holds_applied: Counter::default(),
            holds_released: Counter::default(),
            held_until_stamps: Counter::default(),
            new_nodes: Family::default(),
            pass_failures: Family::default(),
            patch_errors: Family::default(),
            leader: Gauge::default(),
            // 1 ms .. ~65 s
            pass_duration: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            schedule: ScheduleMetrics::register(registry),
        };
        window.show_labels_at_zero();
        window.register_holds(registry);
        window.register_passes(registry);
        window
    }

    /// Each label's known values, at 0 before anything happens.
    fn show_labels_at_zero(&self) {
        for code in PATCH_ERROR_CODES {
            show_at_zero(&self.patch_errors, code_label(code));
        }
        for at_create in ["held", "unheld"] {
            show_at_zero(&self.new_nodes, AtCreateLabel { at_create });
        }
        for kind in FailureKind::iter() {
            show_at_zero(&self.pass_failures, KindLabel { kind: kind.label() });
        }
    }

    /// The window's deadline, the held nodes and the patches.
    fn register_holds(&self, registry: &mut Registry) {
        let window = self;
        registry.register(
            "window_deadline_seconds",
            "Unix time the hold window closes; 0 while closed",
            window.deadline.clone(),
        );
        registry.register(
            "held_nodes",
            "Nodes carrying node-holder's hold",
            window.held_nodes.clone(),
        );
        registry.register(
            "holds_applied",
            "Holds node-holder's window task put on nodes",
            window.holds_applied.clone(),
        );
        registry.register(
            "holds_released",
            "Holds node-holder's window task removed from nodes",
            window.holds_released.clone(),
        );
        registry.register(
            "held_until_stamps",
            "held-until annotations node-holder's window task wrote in PATCHes of their own: first stamps of nodes held at CREATE, rewrites of stamps that passed or whose hold end moved earlier, removals with stamps off",
            window.held_until_stamps.clone(),
        );
        registry.register(
            "patch_errors",
            "Failed node PATCH requests by HTTP status code",
            window.patch_errors.clone(),
        );
    }

    /// Leadership, the passes and the new nodes they saw.
    fn register_passes(&self, registry: &mut Registry) {
        let window = self;
        registry.register(
            "leader",
            "1 while this replica leads the hold window",
            window.leader.clone(),
        );
        registry.register(
            "pass_duration_seconds",
            "Duration of one pass of the hold window task",
            window.pass_duration.clone(),
        );
        registry.register(
            "window_hold_seconds",
            "The hold the window counts new nodes with: --hold-duration",
            window.hold.clone(),
        );
        registry.register(
            "pass_failures",
            "Failed passes of the window task, by kind: conflict, throttled, forbidden, refused, server (the API's answer), connection, not_leading, other",
            window.pass_failures.clone(),
        );
        registry.register(
            "new_nodes",
            "New nodes in scope the window task saw (once per node and leader), by whether they already carried the hold (held at their CREATE by the webhook or the admission policy)",
            window.new_nodes.clone(),
        );
    }

    pub fn new_node(&self, held_at_create: bool) {
        let at_create = if held_at_create { "held" } else { "unheld" };
        self.new_nodes
            .get_or_create(&AtCreateLabel { at_create })
            .inc();
    }

    pub fn pass_failed(&self, kind: FailureKind) {
        let label = KindLabel { kind: kind.label() };
        self.pass_failures.get_or_create(&label).inc();
    }

    /// Counts a failed node PATCH by HTTP status (`0` for no response).
    pub fn patch_error(&self, code: u16) {
        self.patch_errors.get_or_create(&code_label(code)).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Exposition;

    fn registered() -> (WindowMetrics, Exposition) {
        let mut registry = crate::metrics::registry();
        let window = WindowMetrics::register(&mut registry);
        (window, Exposition::from(registry))
    }

    #[test]
    fn new_nodes_start_at_zero() {
        let text = registered().1.encode().unwrap();
        for at_create in ["held", "unheld"] {
            let line = format!("node_holder_new_nodes_total{{at_create=\"{at_create}\"}} 0");
            assert!(text.contains(&line), "{text}");
        }
    }
}
