//! Why a pass failed: its `anyhow` chain told apart once, here, by what it
//! means for the operator (the metric's `kind`), not by its text.

use crate::state::lease::NotLeading;

/// What kind of failure ended a pass: the label of
/// `node_holder_pass_failures_total`, each shown at 0 from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum FailureKind {
    /// 409 or 422: someone else wrote the object first.
    Conflict,
    /// 429: the API server's priority and fairness held node-holder back.
    Throttled,
    /// 401 or 403: node-holder's RBAC lacks a right.
    Forbidden,
    /// Another 4xx.
    Refused,
    /// 5xx.
    Server,
    /// No answer from the API server.
    Connection,
    /// This replica does not hold the Lease now (another replica leads, or
    /// its Lease ran out while the API server was away).
    NotLeading,
    /// Anything else (a watch that ended, a record that cannot be read).
    Other,
}

impl FailureKind {
    pub fn label(self) -> &'static str {
        self.into()
    }

    fn of_kube(error: &kube::Error) -> FailureKind {
        match error {
            kube::Error::Api(status) => match status.code {
                409 | 422 => FailureKind::Conflict,
                429 => FailureKind::Throttled,
                401 | 403 => FailureKind::Forbidden,
                400..=499 => FailureKind::Refused,
                500..=599 => FailureKind::Server,
                _ => FailureKind::Other,
            },
            _ => FailureKind::Connection,
        }
    }
}

/// The kind of a failed pass: that of the first error in the chain that
/// says one (this replica not leading, or a Kubernetes API error).
pub fn kind(error: &anyhow::Error) -> FailureKind {
    let kind = |e: &(dyn std::error::Error + 'static)| {
        if e.is::<NotLeading>() {
            Some(FailureKind::NotLeading)
        } else {
            e.downcast_ref::<kube::Error>().map(FailureKind::of_kube)
        }
    };
    error.chain().find_map(kind).unwrap_or(FailureKind::Other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> anyhow::Error {
        let status = kube::core::Status::failure("injected", "Injected").with_code(code);
        anyhow::Error::new(kube::Error::Api(Box::new(status))).context("writing something")
    }

    #[test]
    fn a_failed_pass_is_told_by_its_api_status_or_the_lease() {
        assert_eq!(kind(&api(409)), FailureKind::Conflict);
        assert_eq!(kind(&api(422)), FailureKind::Conflict);
        assert_eq!(kind(&api(429)), FailureKind::Throttled);
        assert_eq!(kind(&api(403)), FailureKind::Forbidden);
        assert_eq!(kind(&api(404)), FailureKind::Refused);
        assert_eq!(kind(&api(503)), FailureKind::Server);
        let not_leading = anyhow::Error::new(NotLeading {
            lease: "ns/node-holder-window".into(),
            holder: "b".into(),
            renewed: "never".into(),
            identity: "a".into(),
        })
        .context("a pass");
        assert_eq!(kind(&not_leading), FailureKind::NotLeading);
        assert_eq!(
            format!("{not_leading:#}"),
            "a pass: not acting: the Lease ns/node-holder-window is held by b (renewed never), not by a"
        );
        let other = anyhow::anyhow!("the node watch ended");
        assert_eq!(kind(&other), FailureKind::Other);
        // As `release` run by hand prints a failed pass: the chain once.
        let printed = format!("{:#}", api(503).context("release"));
        assert!(
            printed.starts_with("release: writing something: "),
            "{printed}"
        );
        assert_eq!(printed.matches("writing something").count(), 1, "{printed}");
        assert_eq!(printed.matches("ApiError").count(), 1, "{printed}");
    }

    #[test]
    fn every_kind_has_its_own_label() {
        use strum::IntoEnumIterator;
        let labels: std::collections::BTreeSet<&str> =
            FailureKind::iter().map(FailureKind::label).collect();
        assert_eq!(labels.len(), FailureKind::iter().count());
    }
}
