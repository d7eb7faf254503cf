//! The admission decision: an AdmissionReview in, a response out. A pure
//! function of the request and the [`Holding`], so every replica can answer,
//! a dry-run needs no special path and `sideEffects: None` is true.

use std::collections::{BTreeMap, HashMap};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicResourceScope, Resource};

use super::holds::{Hold, Holding};
use super::node::labels;
use super::patch::add_holds;

/// What happened to one request (as `&str`: the audit log's and annotation's word).
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Outcome {
    /// A Node CREATE in scope: these holds were added.
    Held { added: Vec<Hold> },
    /// A Node CREATE in scope that already carries every hold.
    AlreadyHeld,
    /// A Node CREATE outside the node selector.
    OutOfScope,
    /// Not a Node CREATE: allowed untouched.
    NotANodeCreate,
    /// A request no API server sends (a CREATE without its object).
    Invalid { reason: String },
    /// A Node CREATE in scope whose patch could not be put in the response:
    /// allowed unheld (as a failing webhook would be, with `Ignore`), said so
    /// in the audit annotations and the log rather than called held.
    Unpatched { reason: String },
}

/// The fields of a request worth a log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestSummary {
    pub uid: String,
    pub kind: String,
    pub name: String,
    pub operation: String,
    pub user: String,
    pub dry_run: bool,
}

/// The response to send and what it means.
#[derive(Debug)]
pub struct Decision {
    pub response: AdmissionResponse,
    pub outcome: Outcome,
    pub request: RequestSummary,
}

/// A body that is not an `admission.k8s.io/v1` AdmissionReview with a request.
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    #[error("the body is not an AdmissionReview: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error(
        "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got apiVersion {api_version:?} kind {kind:?}"
    )]
    WrongType { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

/// The part of an admitted object the decision reads: its metadata's name,
/// labels and annotations. Parsing skips the rest (the status and the
/// managedFields are most of a Node's ~5 KB) instead of building JSON trees.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
struct Admitted {
    #[serde(default, deserialize_with = "read_metadata")]
    pub metadata: ObjectMeta,
}

/// The metadata's name, labels and annotations; the other fields are skipped
/// unread (a `null` metadata is an empty one).
fn read_metadata<'de, D: serde::Deserializer<'de>>(input: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Default, serde::Deserialize)]
    struct Read {
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        annotations: Option<BTreeMap<String, String>>,
    }
    let read = <Option<Read> as serde::Deserialize>::deserialize(input)?.unwrap_or_default();
    Ok(ObjectMeta {
        name: read.name,
        labels: read.labels,
        annotations: read.annotations,
        ..ObjectMeta::default()
    })
}

impl Resource for Admitted {
    type DynamicType = ();
    type Scope = DynamicResourceScope;

    // Only the request's own `kind` says what was admitted; these name the
    // one kind the webhook acts on.
    fn kind(_: &()) -> Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

/// Decides on the AdmissionReview in `body`.
pub fn decide(body: &[u8], holding: &Holding) -> Result<Decision, BadReview> {
    let review: AdmissionReview<Admitted> = serde_json::from_slice(body)?;
    if review.types.api_version != API_VERSION || review.types.kind != KIND {
        return Err(BadReview::WrongType {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    let request: AdmissionRequest<Admitted> =
        review.try_into().map_err(|_| BadReview::NoRequest)?;

    let is_node_create = request.kind.group.is_empty()
        && request.kind.kind == "Node"
        && matches!(request.operation, Operation::Create);
    let (response, outcome) = if !is_node_create {
        (AdmissionResponse::from(&request), Outcome::NotANodeCreate)
    } else if let Some(node) = request.object.as_ref() {
        hold_new_node(&request, &node.metadata, holding)
    } else {
        let reason = "a Node CREATE review without its object".to_string();
        let mut response = AdmissionResponse::invalid(&reason);
        response.uid = request.uid.clone();
        (response, Outcome::Invalid { reason })
    };
    let request = RequestSummary {
        uid: request.uid,
        kind: request.kind.kind,
        name: request.name,
        // `Create` as the API says it, `CREATE`.
        operation: format!("{:?}", request.operation).to_uppercase(),
        user: request.user_info.username.unwrap_or_default(),
        dry_run: request.dry_run,
    };
    Ok(Decision {
        response,
        outcome,
        request,
    })
}

/// A Node CREATE's response: the holds it lacks as a patch when in scope, and
/// the audit annotations that say why.
fn hold_new_node(
    request: &AdmissionRequest<Admitted>,
    node: &ObjectMeta,
    holding: &Holding,
) -> (AdmissionResponse, Outcome) {
    let mut response = AdmissionResponse::from(request);
    let in_scope = holding.scope.matches(labels(node));
    let outcome = match in_scope.then(|| add_holds(node, &holding.holds)) {
        None => Outcome::OutOfScope,
        Some((_, added)) if added.is_empty() => Outcome::AlreadyHeld,
        Some((patch, added)) => match response.clone().with_patch(patch) {
            Ok(patched) => {
                response = patched;
                Outcome::Held { added }
            }
            Err(err) => Outcome::Unpatched {
                reason: format!("the patch could not be serialised: {err}"),
            },
        },
    };
    response.audit_annotations = audit_annotations(&outcome, &holding.scope.to_string());
    (response, outcome)
}

/// `auditAnnotations`: the API server stores each as `<webhook name>/<key>`, so keys hold no `/`.
fn audit_annotations(outcome: &Outcome, scope: &str) -> HashMap<String, String> {
    let decision = <&str>::from(outcome).to_string();
    let mut annotations = HashMap::from([("decision".to_string(), decision)]);
    if let Outcome::Held { added } = outcome {
        let holds: Vec<String> = added.iter().map(ToString::to_string).collect();
        annotations.insert("holds-added".to_string(), holds.join(","));
    }
    let reason = match outcome {
        Outcome::Held { .. } => format!("new node in scope ({scope}): held from creation"),
        Outcome::AlreadyHeld => "the node already carries every configured hold".to_string(),
        Outcome::OutOfScope => format!("node labels do not match the node selector ({scope})"),
        Outcome::Unpatched { reason } => format!("allowed unheld: {reason}"),
        Outcome::NotANodeCreate | Outcome::Invalid { .. } => return annotations,
    };
    annotations.insert("reason".to_string(), reason);
    annotations
}

/// The JSON body of the AdmissionReview that carries `response`. kube-rs keeps the patch as raw
/// bytes, which serde writes as an array of numbers; the API server reads `[]byte` from base64, so
/// the patch goes out as base64 (kube-rs issue 1781).
pub fn review_body(response: AdmissionResponse) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Review<'a> {
        api_version: &'a str,
        kind: &'a str,
        response: Response<'a>,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Response<'a> {
        uid: &'a str,
        allowed: bool,
        status: &'a kube::core::Status,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch: Option<String>,
        /// kube sets it (privately) exactly when it sets the patch.
        #[serde(skip_serializing_if = "Option::is_none")]
        patch_type: Option<&'static str>,
        #[serde(skip_serializing_if = "HashMap::is_empty")]
        audit_annotations: &'a HashMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        warnings: Option<&'a Vec<String>>,
    }
    serde_json::to_vec(&Review {
        api_version: &response.types.api_version,
        kind: &response.types.kind,
        response: Response {
            uid: &response.uid,
            allowed: response.allowed,
            status: &response.result,
            patch: response.patch.as_ref().map(|p| STANDARD.encode(p)),
            patch_type: response.patch.is_some().then_some("JSONPatch"),
            audit_annotations: &response.audit_annotations,
            warnings: response.warnings.as_ref(),
        },
    })
}
