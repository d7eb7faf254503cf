//! Observation: the nodes in scope move the windows forward, and what they
//! did is logged and announced (an Event per new node).

use super::*;

impl WindowTask {
    /// Moves the windows forward with the nodes in scope, and says what they
    /// did: a log line for each node that opens or extends one, an Event for
    /// each new node of an open window (once per leader), a line when one
    /// closes.
    pub(super) fn observe(&mut self, snapshot: &[Arc<NodeMeta>], now: Timestamp) {
        let cfg = &self.config.window.clone();
        let in_scope: Vec<InScope> = snapshot
            .iter()
            .filter(|node| node.in_scope() && self.counts_in_window(node, now))
            .map(|node| InScope {
                node,
                group: cfg.groups.group_of(&**node),
            })
            .collect();
        let open_before = self.open_groups();
        let counted: Vec<(&str, Timestamp)> = in_scope
            .iter()
            .map(|n| (n.group, self.counted_at(n.node)))
            .collect();
        let observed = self.windows.observe_all(counted, now, cfg);
        for (node, observed) in in_scope.iter().zip(observed) {
            self.observed(node, observed, now);
        }
        self.log_closed(open_before);
    }

    /// The groups whose window is open (ended or not).
    fn open_groups(&self) -> Vec<String> {
        self.windows
            .iter()
            .filter(|(_, w)| w.open().is_some())
            .map(|(group, _)| group.to_string())
            .collect()
    }

    /// What one node in scope did to its window: the log line of a node that
    /// opened or extended it, the Event of a node new in an open window.
    pub(super) fn observed(&mut self, in_scope: &InScope, observed: Observed, now: Timestamp) {
        let (node, group) = (in_scope.node, in_scope.group);
        let until = self.windows.held_until(group, now);
        if matches!(observed, Observed::Opened | Observed::Extended) {
            tracing::info!(
                node = %node.name(),
                group = self.group_field(group),
                created = %node.created(),
                deadline = %until.map_or_else(String::new, |d| d.to_string()),
                "hold window {observed}"
            );
        }
        let new_in_window = self
            .windows
            .window(group)
            .and_then(Window::open)
            .is_some_and(|open| self.counted_at(node) >= open.opened_at);
        if new_in_window && !matches!(observed, Observed::Consumed | Observed::Expired) {
            self.announce(node, observed, until);
        }
    }

    /// The log lines of the windows that closed at this pass.
    fn log_closed(&mut self, open_before: Vec<String>) {
        for group in open_before {
            let Some(w) = self.windows.window(&group).filter(|w| w.open().is_none()) else {
                continue;
            };
            tracing::info!(
                group = self.group_field(&group),
                closed_through = %w.closed_through().map_or_else(String::new, |t| t.to_string()),
                "hold window closed"
            );
        }
        if self.open_groups().is_empty() {
            self.announced.clear();
        }
    }

    /// A group as a log field: only when windows are grouped.
    fn group_field<'g>(&self, group: &'g str) -> Option<&'g str> {
        self.config
            .window
            .groups
            .key()
            .map(|_| grouping::display(group))
    }

    /// The Event that says why a new node is held, once per node and leader.
    fn announce(&mut self, node: &NodeMeta, observed: Observed, until: Option<Timestamp>) {
        let key = node.uid().unwrap_or(node.name());
        if self.announced.insert(key.to_string()) {
            if self.config.pools.is_none() {
                self.metrics.new_node(is_marked(node));
            }
            self.events.send(HoldEvent::counted(node, observed, until));
        }
    }
}
