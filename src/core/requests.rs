//! The requests operators make through the record (`release`, `hold`):
//! whether one is still pending. Pure; the leader and `status` decide it
//! here.

use jiff::Timestamp;

/// Whether a release request made at `at` is still to be handled: not
/// recorded as done (`done` at or after it), and not consumed by its window
/// (`closed_through`, what the window last consumed, at or after it). The
/// leader and `status` both decide it here.
pub fn release_pending(
    at: Timestamp,
    done: Option<Timestamp>,
    closed_through: Option<Timestamp>,
) -> bool {
    let consumed = closed_through.is_some_and(|through| through >= at);
    !consumed && done.is_none_or(|done| done < at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: u32) -> Timestamp {
        format!("2026-11-22T12:{minute:02}:00Z").parse().unwrap()
    }

    #[test]
    fn a_release_is_pending_until_done_or_consumed_by_its_window() {
        assert!(release_pending(at(10), None, None));
        assert!(
            release_pending(at(10), Some(at(5)), Some(at(9))),
            "an older done, an older close"
        );
        assert!(!release_pending(at(10), Some(at(10)), None), "done");
        assert!(
            !release_pending(at(10), None, Some(at(10))),
            "its window closed through it"
        );
        assert!(!release_pending(at(10), Some(at(11)), Some(at(12))));
    }
}
