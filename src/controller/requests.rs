//! Release and manual hold requests, as the record carries them: which are
//! new, which are done, and what they do to the window.

use super::*;

impl WindowTask {
    /// Whether the record, as changed, carries a release or manual hold
    /// request this leader has not taken yet; takes them.
    pub(super) fn requested(&mut self, meta: &ObjectMeta) -> bool {
        let release = self.release_requested(meta);
        self.hold_requested(meta) || release
    }

    fn hold_requested(&mut self, meta: &ObjectMeta) -> bool {
        let Some(hold) = record::pending_hold(meta) else {
            return false;
        };
        let taken = self.hold_unconfirmed == Some(hold.requested_at)
            || self.hold_request.as_ref() == Some(&hold);
        if taken {
            return false;
        }
        tracing::info!(requested_at = %hold.requested_at, until = %hold.until, by = %hold.by, "manual hold requested");
        self.hold_unconfirmed = Some(hold.requested_at);
        self.hold_request = Some(hold);
        true
    }

    /// Applies the requests taken since the last pass to the window, in the order they were made: a
    /// release after a manual hold ends it, a hold after a release starts after it.
    pub(super) fn apply_requests(&mut self, now: Timestamp) {
        let (release, hold) = (self.release_request.take(), self.hold_request.take());
        let hold_first =
            matches!((release, &hold), (Some(at), Some(hold)) if hold.requested_at <= at);
        if !hold_first {
            self.apply_release(release, now);
        }
        self.apply_hold(hold, now);
        if hold_first {
            self.apply_release(release, now);
        }
    }

    fn apply_release(&mut self, requested: Option<Timestamp>, now: Timestamp) {
        if let Some(at) = requested {
            let was_open = self.window.release_now(at.min(now));
            tracing::info!(requested_at = %at, was_open, "hold window released on request");
        }
    }

    /// Puts a manual hold in the window; the log line and the Event on the
    /// record say who asked, why and until when.
    fn apply_hold(&mut self, hold: Option<ManualHold>, now: Timestamp) {
        let Some(hold) = hold else { return };
        let manual = self.window.manual();
        if manual.is_some_and(|m| m.requested_at == hold.requested_at) {
            // A request an earlier leader put in the window but did not
            // record as done: only the nodes and the record remain to do.
            return;
        }
        let outcome = self.window.hold_manually(hold.clone(), now);
        tracing::info!(
            requested_at = %hold.requested_at,
            until = %hold.until,
            by = %hold.by,
            reason = %hold.reason,
            outcome = ?outcome,
            "manual hold"
        );
        let current = self.window.manual();
        let event = HoldEvent::manual(&self.config.namespace, &hold, outcome, current);
        self.events.send(event);
    }

    fn release_requested(&mut self, meta: &ObjectMeta) -> bool {
        let Some(at) = record::release_request(meta) else {
            return false;
        };
        let new = self.is_new_release(at, record::release_done_at(meta))
            && self.release_request != Some(at);
        if new {
            tracing::info!(requested_at = %at, "release requested");
            self.release_unconfirmed = Some(at);
            self.release_request = Some(at);
        }
        new
    }

    /// Whether a release request is still to be handled: not recorded as
    /// done, and made after what its window last consumed.
    pub(super) fn is_new_release(&self, at: Timestamp, done: Option<Timestamp>) -> bool {
        record::release_pending(at, done, self.window.closed_through())
    }
}
