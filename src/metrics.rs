//! What every subsystem's metrics share: the process's one registry, its
//! OpenMetrics text and the label helpers. A leaf: it imports no subsystem.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// A new registry with the process's prefix and its build info.
pub fn registry() -> Registry {
    let mut registry = Registry::with_prefix("node_holder");
    registry.register(
        "build",
        "node-holder's version (the value is always 1)",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    registry
}

/// The registry with every subsystem's metrics: what `/metrics` serves.
pub struct Exposition(Registry);

impl From<Registry> for Exposition {
    fn from(registry: Registry) -> Self {
        Exposition(registry)
    }
}

impl Exposition {
    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.0)?;
        Ok(text)
    }
}

/// Exposes `label`'s series of `family` at 0, before its first event.
pub fn show_at_zero<L: Clone + std::hash::Hash + Eq>(family: &Family<L, Counter>, label: L) {
    let _created = family.get_or_create(&label);
}

/// An HTTP status as a label.
pub fn code_label(code: u16) -> CodeLabel {
    let code = code.to_string();
    CodeLabel { code }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    code: String,
}

/// Why something happened, as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_info_names_the_version() {
        let text = Exposition::from(registry()).encode().unwrap();
        let version = format!(
            "node_holder_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&version), "{text}");
    }
}
