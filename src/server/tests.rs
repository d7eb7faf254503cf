//! The HTTP edge in-process: the webhook's and the admin port's routers
//! driven with `tower::ServiceExt::oneshot`, no socket and no TLS (the
//! integration tests cover those): every status the routes promise, and the
//! metrics they count.

use super::*;

use axum::body::Body;
use axum::http::Method;
use tower::ServiceExt;

use crate::core::holds::Holds;
use crate::core::selector::NodeScope;

/// A real Node CREATE review, as the API server sends it.
const REVIEW: &str = include_str!("../../benches/fixtures/node-create-review.json");

fn state() -> Arc<WebhookState> {
    let mut registry = crate::metrics::registry();
    let metrics = super::metrics::WebhookMetrics::register(&mut registry);
    Arc::new(WebhookState {
        holding: Holding {
            holds: Holds::new(&[], &[]).unwrap(),
            scope: NodeScope::parse("").unwrap(),
        },
        metrics,
        exposition: crate::metrics::Exposition::from(registry),
    })
}

fn webhook(state: &Arc<WebhookState>) -> Router {
    webhook_router(Arc::clone(state), Duration::from_secs(2))
}

fn request(method: Method, path: &str, content_type: &str, body: &str) -> Request {
    axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// The status and body of `router`'s answer to `request`.
async fn answer(router: Router, request: Request) -> (StatusCode, String) {
    let response = router.oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_node_create_is_answered_with_the_hold_and_counted() {
    let state = state();
    let post = request(Method::POST, "/mutate", "application/json", REVIEW);
    let (status, body) = answer(webhook(&state), post).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let review: serde_json::Value = serde_json::from_str(&body).unwrap();
    let sent: serde_json::Value = serde_json::from_str(REVIEW).unwrap();
    assert_eq!(review["response"]["uid"], sent["request"]["uid"]);
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(review["response"]["patchType"], "JSONPatch");
    let metrics = state.exposition.encode().unwrap();
    assert!(
        metrics.contains("node_holder_webhook_requests_total{code=\"200\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("node_holder_webhook_mutations_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_requests_get_their_status_and_a_reason() {
    let state = state();
    let cases = [
        (
            Method::POST,
            "/mutate",
            "application/json",
            "{not json",
            StatusCode::BAD_REQUEST,
            "not an AdmissionReview",
        ),
        (
            Method::POST,
            "/mutate",
            "text/plain",
            REVIEW,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type application/json",
        ),
        (
            Method::GET,
            "/mutate",
            "application/json",
            "",
            StatusCode::METHOD_NOT_ALLOWED,
            "",
        ),
        (
            Method::POST,
            "/validate",
            "application/json",
            REVIEW,
            StatusCode::NOT_FOUND,
            "",
        ),
    ];
    for (method, path, content_type, body, status, reason) in cases {
        let (got, text) = answer(webhook(&state), request(method, path, content_type, body)).await;
        assert_eq!(got, status, "{path} {content_type}: {text}");
        assert!(text.contains(reason), "{text}");
    }
    let metrics = state.exposition.encode().unwrap();
    for code in ["400", "415"] {
        let line = format!("node_holder_webhook_requests_total{{code=\"{code}\"}} 1");
        assert!(metrics.contains(&line), "{metrics}");
    }
}

/// A body declared over the limit gets 413 before it is sent, with
/// `Expect: 100-continue` or without (a size past the whole body allowance
/// must not wait for permits that never come).
#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_before_it_is_sent() {
    for (declared, expect) in [
        (MAX_BODY_BYTES + 1, Some("100-continue")),
        (MAX_BODY_BYTES + 1, None),
        (64 << 20, None),
    ] {
        let mut post = axum::http::Request::builder()
            .method(Method::POST)
            .uri("/mutate")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, declared.to_string());
        if let Some(expect) = expect {
            post = post.header(header::EXPECT, expect);
        }
        let post = post.body(Body::empty()).unwrap();
        let (status, text) = answer(webhook(&state()), post).await;
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{declared} {expect:?}: {text}"
        );
        assert!(text.contains("over the limit"), "{text}");
    }
}

#[tokio::test]
async fn the_admin_port_says_healthy_ready_only_when_ready_and_serves_openmetrics() {
    let readiness = Arc::new(Readiness::default());
    let admin = || admin_router(Arc::clone(&readiness), state());
    let get = |path: &str| request(Method::GET, path, "text/plain", "");
    assert_eq!(answer(admin(), get("/healthz")).await.0, StatusCode::OK);
    let (status, text) = answer(admin(), get("/readyz")).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    );
    readiness.api_reachable.store(true, Ordering::Relaxed);
    assert_eq!(answer(admin(), get("/readyz")).await.0, StatusCode::OK);
    readiness.shutting_down.cancel();
    assert_eq!(
        answer(admin(), get("/readyz")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let response = admin().oneshot(get("/metrics")).await.unwrap();
    let content_type = response.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("node_holder_build_info"), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
}

/// The fixture review with `edit` applied, as a body.
fn review_with(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut review: serde_json::Value = serde_json::from_str(REVIEW).unwrap();
    edit(&mut review);
    review.to_string()
}

/// The AdmissionReview's `response` of the webhook's answer to `body`.
async fn response_to(body: String) -> serde_json::Value {
    let post = request(Method::POST, "/mutate", "application/json", &body);
    let (status, text) = answer(webhook(&state()), post).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the API server expects a review back: {text}"
    );
    let review: serde_json::Value = serde_json::from_str(&text).unwrap();
    review["response"].clone()
}

#[tokio::test]
async fn a_body_over_seven_mebibytes_is_refused_with_413() {
    let huge = review_with(|r| {
        r["request"]["object"]["metadata"]["annotations"] =
            serde_json::json!({"blob": "x".repeat(MAX_BODY_BYTES)});
    });
    let post = request(Method::POST, "/mutate", "application/json", &huge);
    let (status, text) = answer(webhook(&state()), post).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
}

#[tokio::test]
async fn other_kinds_and_operations_are_allowed_untouched() {
    let pod = review_with(|r| {
        r["request"]["kind"]["kind"] = "Pod".into();
        r["request"]["resource"]["resource"] = "pods".into();
        r["request"]["object"] =
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    });
    let update = review_with(|r| r["request"]["operation"] = "UPDATE".into());
    let delete = review_with(|r| r["request"]["operation"] = "DELETE".into());
    for body in [pod, update, delete] {
        let response = response_to(body).await;
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response.get("patch").is_none(), "{response}");
    }
}

#[tokio::test]
async fn a_node_create_without_its_object_is_answered_as_an_invalid_request() {
    let sent: serde_json::Value = serde_json::from_str(REVIEW).unwrap();
    let response = response_to(review_with(|r| {
        r["request"]["object"] = serde_json::Value::Null;
    }))
    .await;
    assert_eq!(response["uid"], sent["request"]["uid"]);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["reason"], "InvalidRequest");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("without its object"), "{response}");
}
