//! Which nodes are in scope: a label selector in kubectl's syntax, parsed into
//! kube's [`Selector`] (which does the matching).

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector, SelectorExt};

use super::names::{is_label_value, is_qualified_name};

/// The nodes node-holder acts on. The empty selector selects every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeScope {
    selector: Selector,
    text: String,
}

impl NodeScope {
    /// Parses `a=b,c!=d,e,!f,g in (h,i),j notin (k)`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expressions = split_requirements(text)?
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NodeScope {
            selector: expressions.into_iter().collect(),
            text: text.trim().to_string(),
        })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }

    /// The selector as given (kubectl syntax; empty for every node).
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for NodeScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.selector.selects_all() {
            f.write_str("all nodes")
        } else {
            f.write_str(&self.text)
        }
    }
}

/// Splits on the commas that are not inside `( )`.
fn split_requirements(text: &str) -> Result<Vec<&str>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let unbalanced = || format!("unbalanced parentheses in selector {text:?}");
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(unbalanced());
        }
    }
    if depth != 0 {
        return Err(unbalanced());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(requirement: &str) -> Result<Expression, String> {
    let r = requirement.trim();
    let key = |k: &str| {
        let k = k.trim();
        let err = || format!("invalid label key {k:?} in selector requirement {r:?}");
        is_qualified_name(k).then(|| k.to_string()).ok_or_else(err)
    };
    let value = |v: &str| {
        let v = v.trim();
        let err = || format!("invalid label value {v:?} in {r:?}");
        is_label_value(v).then(|| v.to_string()).ok_or_else(err)
    };
    let set = |s: &str| -> Result<BTreeSet<String>, String> {
        let inner = s
            .trim()
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| format!("expected (values) in {r:?}"))?;
        inner.split(',').map(value).collect()
    };
    if r.is_empty() {
        return Err("empty requirement in selector".to_string());
    }
    if let Some(k) = r.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key(k)?));
    }
    if let Some((k, v)) = r.split_once("!=") {
        return Ok(Expression::NotEqual(key(k)?, value(v)?));
    }
    if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
        return Ok(Expression::Equal(key(k)?, value(v)?));
    }
    let words: Vec<&str> = r.splitn(2, char::is_whitespace).collect();
    if let [k, rest] = words[..] {
        let rest = rest.trim_start();
        if let Some(values) = rest.strip_prefix("notin") {
            return Ok(Expression::NotIn(key(k)?, set(values)?));
        }
        if let Some(values) = rest.strip_prefix("in") {
            return Ok(Expression::In(key(k)?, set(values)?));
        }
        return Err(format!("unknown operator in selector requirement {r:?}"));
    }
    Ok(Expression::Exists(key(r)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_empty_selector_selects_every_node() {
        let scope = NodeScope::parse("").unwrap();
        assert!(scope.selector.selects_all());
        assert!(scope.matches(&labels(&[])));
        assert_eq!(scope.to_string(), "all nodes");
    }

    #[test]
    fn every_operator_of_kubectl_syntax_matches_as_kubernetes_does() {
        let scope =
            NodeScope::parse("karpenter.sh/nodepool, tier in (batch, gpu),zone!=z3,!node-role.kubernetes.io/control-plane,env notin (dev),team=ml")
                .unwrap();
        let good = labels(&[
            ("karpenter.sh/nodepool", "p"),
            ("tier", "gpu"),
            ("zone", "z1"),
            ("team", "ml"),
        ]);
        assert!(scope.matches(&good));
        for (key, value) in [
            ("tier", "web"),
            ("zone", "z3"),
            ("node-role.kubernetes.io/control-plane", ""),
            ("env", "dev"),
            ("team", "x"),
        ] {
            let mut bad = good.clone();
            bad.insert(key.to_string(), value.to_string());
            assert!(!scope.matches(&bad), "{key}={value} should be out of scope");
        }
        let mut missing = good.clone();
        missing.remove("karpenter.sh/nodepool");
        assert!(!scope.matches(&missing));
    }

    #[test]
    fn malformed_selectors_are_refused_with_the_reason() {
        for (bad, why) in [
            ("a in (b", "unbalanced"),
            ("a in b", "expected (values)"),
            ("a,,b", "empty requirement"),
            ("bad key=1", "invalid label key"),
            ("k=v v", "invalid label value"),
            ("a ~ b", "unknown operator"),
        ] {
            let err = NodeScope::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
