//! `node-holder self-check`, what the chart's `helm test` runs. Two checks, each tried again until
//! `--timeout`: a Node created as a server-side dry run (nothing stored, no kubelet) comes back
//! with every hold; a replica holds the Lease, live. It needs `create` on nodes (a dry run is
//! authorized as a create) and `get` on the Lease, nothing else.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

use crate::cli::SelfCheckArgs;
use crate::core::holds::Holds;
use crate::core::names::{is_label_value, is_qualified_name};
use crate::state::lease::{self, Holder};
use crate::state::record::NAME;

/// The test Node's name prefix (the API server adds a suffix).
const NODE_PREFIX: &str = "node-holder-self-check-";

/// The wait before a failed check is tried again.
const POLL: Duration = Duration::from_secs(2);

/// The `self-check` subcommand.
pub async fn run(args: &SelfCheckArgs) -> Result<()> {
    let holds = args.holds.holds()?;
    let node = test_node(node_labels(&args.node_label)?);
    let client = crate::cluster::command_client("self-check", &args.client).await?;
    let namespace = args.record.namespace.as_str();
    let deadline = Instant::now().checked_add(args.timeout);
    let deadline = deadline.context("--timeout is too long")?;
    let held = until(deadline, POLL, || held_at_create(&client, &node, &holds)).await?;
    println!("{held}");
    let leading = until(deadline, POLL, async || {
        verdict_on_leader(lease::read_holder(&client, namespace).await?, namespace)
    });
    println!("{}", leading.await?);
    Ok(())
}

/// The labels `--node-label` gives, as `key=value`.
fn node_labels(given: &[String]) -> Result<BTreeMap<String, String>> {
    given
        .iter()
        .map(|text| {
            let (key, value) = text
                .split_once('=')
                .ok_or_else(|| anyhow!("--node-label {text:?}: expected key=value"))?;
            if !is_qualified_name(key) || !is_label_value(value) {
                bail!("--node-label {text:?}: not a label key=value");
            }
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

/// The Node created as a dry run: a generated name and `labels`.
fn test_node(labels: BTreeMap<String, String>) -> Node {
    Node {
        metadata: ObjectMeta {
            generate_name: Some(NODE_PREFIX.to_string()),
            labels: (!labels.is_empty()).then_some(labels),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// `check` every `poll` until it passes; its last error when the next try would pass `deadline`.
async fn until(
    deadline: Instant,
    poll: Duration,
    mut check: impl AsyncFnMut() -> Result<String>,
) -> Result<String> {
    loop {
        match check().await {
            Ok(said) => return Ok(said),
            Err(err) if Instant::now() + poll >= deadline => return Err(err),
            Err(_) => tokio::time::sleep(poll).await,
        }
    }
}

/// Creates `node` as a server-side dry run and checks it came back held.
async fn held_at_create(client: &kube::Client, node: &Node, holds: &Holds) -> Result<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let created = nodes.create(&params, node).await;
    let created = created.context("creating a Node as a server-side dry run")?;
    verdict_on_holds(created.metadata.annotations.as_ref(), holds)
}

/// Whether a new Node's annotations carry every hold, in words.
fn verdict_on_holds(given: Option<&BTreeMap<String, String>>, holds: &Holds) -> Result<String> {
    let got = |key: &str| given.and_then(|a| a.get(key)).map_or("", String::as_str);
    let missing: Vec<String> = holds
        .iter()
        .filter(|hold| got(&hold.key) != hold.value)
        .map(|hold| format!("{}={:?} (not {:?})", hold.key, got(&hold.key), hold.value))
        .collect();
    if !missing.is_empty() {
        bail!(
            "not held: a new Node gets {}; is node-holder's webhook (or its admission policy) in place, and does its selector take a node with these labels?",
            missing.join(", ")
        );
    }
    let held: Vec<String> = holds.iter().map(ToString::to_string).collect();
    Ok(format!("held: a new Node gets {}", held.join(", ")))
}

/// The Lease's `holder`, in words: an error unless it is live.
fn verdict_on_leader(holder: Option<Holder>, namespace: &str) -> Result<String> {
    match holder {
        Some(holder) if !holder.expired => Ok(format!(
            "leading: {} holds the Lease {namespace}/{NAME}",
            holder.identity
        )),
        Some(holder) => bail!(
            "no live leader: the Lease {namespace}/{NAME} of {} ran out; are node-holder's replicas running?",
            holder.identity
        ),
        None => bail!(
            "no leader: nobody holds the Lease {namespace}/{NAME}; are node-holder's replicas running?"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::holds::{Hold, Preset};

    fn holds() -> Holds {
        let hold = Hold {
            key: "example.com/hold".to_string(),
            value: "yes".to_string(),
        };
        Holds::new(&[Preset::KarpenterV1], &[hold]).unwrap()
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_node_with_every_hold_passes() {
        let got = annotations(&[
            ("karpenter.sh/do-not-disrupt", "true"),
            ("example.com/hold", "yes"),
        ]);
        let said = verdict_on_holds(Some(&got), &holds()).unwrap();
        assert_eq!(
            said,
            "held: a new Node gets karpenter.sh/do-not-disrupt=true, example.com/hold=yes"
        );
    }

    #[test]
    fn a_node_missing_a_hold_or_with_another_value_fails_and_names_it() {
        let got = annotations(&[("karpenter.sh/do-not-disrupt", "false")]);
        let err = verdict_on_holds(Some(&got), &holds()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "not held: a new Node gets karpenter.sh/do-not-disrupt=\"false\" (not \"true\"), example.com/hold=\"\" (not \"yes\")"
            ),
            "{text}"
        );
        assert!(verdict_on_holds(None, &holds()).is_err());
    }

    fn holder(expired: bool) -> Holder {
        Holder {
            identity: "node-holder-abc".to_string(),
            renewed_at: None,
            expired,
            live_until: None,
        }
    }

    #[test]
    fn only_a_live_lease_holder_passes() {
        assert_eq!(
            verdict_on_leader(Some(holder(false)), "ns").unwrap(),
            "leading: node-holder-abc holds the Lease ns/node-holder-window"
        );
        let ran_out = verdict_on_leader(Some(holder(true)), "ns").unwrap_err();
        assert!(
            ran_out.to_string().starts_with("no live leader"),
            "{ran_out}"
        );
        let nobody = verdict_on_leader(None, "ns").unwrap_err();
        assert!(nobody.to_string().starts_with("no leader"), "{nobody}");
    }

    #[test]
    fn node_labels_are_key_value_pairs_of_valid_labels() {
        let labels = node_labels(&["pool=a".to_string(), "example.com/x=".to_string()]).unwrap();
        assert_eq!(labels, annotations(&[("pool", "a"), ("example.com/x", "")]));
        for wrong in ["pool", "bad key=a", "pool=not a value"] {
            assert!(node_labels(&[wrong.to_string()]).is_err(), "{wrong}");
        }
        let node = test_node(BTreeMap::new());
        assert_eq!(node.metadata.generate_name.as_deref(), Some(NODE_PREFIX));
        assert!(node.metadata.labels.is_none());
    }

    #[tokio::test]
    async fn a_check_is_tried_again_until_it_passes_or_the_deadline() {
        // No time left: one try, and its error.
        let mut tries = 0;
        let err = until(Instant::now(), POLL, || {
            tries += 1;
            async { Err::<String, _>(anyhow!("not yet")) }
        })
        .await
        .unwrap_err();
        assert_eq!((err.to_string().as_str(), tries), ("not yet", 1));
        // Time left: again until it passes.
        let mut tries = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        let said = until(deadline, Duration::from_millis(1), || {
            tries += 1;
            let done = tries == 3;
            async move {
                if done {
                    Ok("done".to_string())
                } else {
                    bail!("not yet")
                }
            }
        })
        .await
        .unwrap();
        assert_eq!((said.as_str(), tries), ("done", 3));
    }
}
