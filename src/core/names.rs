//! Kubernetes names as the API server checks them: label and annotation keys, label values, DNS
//! subdomains. Shared by the hold keys, the node selector, the flags and the certificates.

/// A Kubernetes qualified name with optional DNS-subdomain prefix, as label and
/// annotation keys are.
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix_ok, name) = match key.split_once('/') {
        Some((prefix, name)) => (is_dns_subdomain(prefix), name),
        None => (true, key),
    };
    // The name is what a non-empty label value is.
    prefix_ok && !name.is_empty() && is_label_value(name)
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_` and `.`,
/// beginning and ending with a letter or digit.
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    value.is_empty()
        || (value.len() <= 63
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric())
}

/// An RFC 1123 subdomain: annotation-key prefixes and Service DNS names.
pub fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::is_dns_subdomain;

    #[test]
    fn dns_subdomains_are_valid_and_odd_ones_are_not() {
        for ok in [
            "node-holder.node-holder.svc",
            "a",
            "x1.example.com",
            "node-holder.ns.svc.cluster.local",
        ] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "bad name!",
            "Upper.case",
            "-lead.x",
            "trail-.x",
            "a..b",
            &"a".repeat(64),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
