//! Observation: the nodes in scope move the window forward, and what they
//! did is logged and announced (an Event per new node).

use super::*;

impl WindowTask {
    /// Moves the window forward with the nodes in scope, says what each did
    /// ([`Self::observed`]), and logs a line when the window closes.
    pub(super) fn observe(&mut self, snapshot: &[Arc<NodeMeta>], now: Timestamp) {
        let in_scope: Vec<&NodeMeta> = snapshot
            .iter()
            .filter(|node| node.in_scope() && self.counts_in_window(node, now))
            .map(|node| &**node)
            .collect();
        let open_before = self.window.open().is_some();
        let counted: Vec<Timestamp> = in_scope.iter().map(|n| self.counted_at(n)).collect();
        let observed = self.window.observe_all(counted, now, &self.config.window);
        for (node, observed) in in_scope.into_iter().zip(observed) {
            self.observed(node, observed, now);
        }
        if self.window.open().is_none() {
            if open_before {
                let through = self.window.closed_through();
                let through = through.map_or_else(String::new, |t| t.to_string());
                tracing::info!(closed_through = %through, "hold window closed");
            }
            self.announced.clear();
        }
    }

    /// What one node in scope did to the window: the log line of a node
    /// that opened or extended it, the Event of a node new in an open window.
    fn observed(&mut self, node: &NodeMeta, observed: Observed, now: Timestamp) {
        let until = self.window.held_until(now);
        if matches!(observed, Observed::Opened | Observed::Extended) {
            tracing::info!(
                node = %node.name(),
                created = %node.created(),
                deadline = %until.map_or_else(String::new, |d| d.to_string()),
                "hold window {observed}"
            );
        }
        let new_in_window = self
            .window
            .open()
            .is_some_and(|open| self.counted_at(node) >= open.opened_at);
        if new_in_window && !matches!(observed, Observed::Consumed | Observed::Expired) {
            self.announce(node, observed, until);
        }
    }

    /// The Event that says why a new node is held, once per node and leader.
    fn announce(&mut self, node: &NodeMeta, observed: Observed, until: Option<Timestamp>) {
        let key = node.uid().unwrap_or(node.name());
        if self.announced.insert(key.to_string()) {
            self.metrics.new_node(is_marked(node));
            self.events.send(HoldEvent::counted(node, observed, until));
        }
    }
}
