//! The admission handler's CPU per review, in-process: `cargo bench --bench handler`.
//!
//! What `POST /mutate` costs beyond HTTP and TLS: reading the AdmissionReview
//! (`decide`, which parses only the admitted object's metadata) and writing
//! the answer with its JSON Patch (`review_body`), on the 5.6 KB Node CREATE
//! of `benches/fixtures/node-create-review.json` (a Karpenter-launched EC2
//! node as the API server sends it). For comparison, what parsing the same
//! body into kube's generic `AdmissionReview<DynamicObject>` costs.
//!
//! The target: `decide` + `review_body` at most 25 µs per review.

use std::hint::black_box;

use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use node_holder::cli::{Cli, Command};
use node_holder::core::admission::{decide, review_body};
use node_holder::core::holds::Holding;

fn main() {
    divan::main();
}

/// The review as the API server sends it: compact JSON.
fn node_create() -> Vec<u8> {
    testsupport::node_create_fixture().expect("the fixture is JSON")
}

/// The policy `serve` builds from its default flags.
fn default_policy() -> Holding {
    use clap::Parser as _;
    match Cli::try_parse_from(["node-holder", "serve"]).map(|cli| cli.command) {
        Ok(Command::Serve(args)) => args.holding.holding().expect("the default policy is valid"),
        _ => panic!("`node-holder serve` did not parse as serve"),
    }
}

/// What the handler does for one review: decide, then write the answer.
#[divan::bench(sample_count = 500, sample_size = 20)]
fn decide_and_review_body(bencher: divan::Bencher) {
    let (body, policy) = (node_create(), default_policy());
    let answer = review_body(decide(&body, &policy).expect("decided").response).expect("written");
    assert_holds(&answer);
    bencher.bench(|| {
        let decision = decide(black_box(&body), &policy).expect("decided");
        review_body(decision.response).expect("written")
    });
}

/// The answer allows the node and adds the hold annotation.
fn assert_holds(answer: &[u8]) {
    use base64::Engine as _;
    let review: serde_json::Value = serde_json::from_slice(answer).expect("the answer is JSON");
    assert_eq!(review["response"]["allowed"], true, "{review}");
    let patch = review["response"]["patch"].as_str().expect("a patch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("the patch is base64");
    let patch: serde_json::Value = serde_json::from_slice(&patch).expect("the patch is JSON");
    let adds_the_hold = patch.as_array().is_some_and(|ops| {
        ops.iter().any(|op| {
            op["op"] == "add"
                && op["path"] == "/metadata/annotations/karpenter.sh~1do-not-disrupt"
                && op["value"] == "true"
        })
    });
    assert!(adds_the_hold, "the patch does not hold the node: {patch}");
}

/// Reading the review alone.
#[divan::bench(sample_count = 500, sample_size = 20)]
fn decide_only(bencher: divan::Bencher) {
    let (body, policy) = (node_create(), default_policy());
    bencher.bench(|| decide(black_box(&body), &policy).expect("decided"));
}

/// The generic way, for comparison: the whole Node as a JSON tree.
#[divan::bench(sample_count = 500, sample_size = 20)]
fn parse_as_dynamic_object(bencher: divan::Bencher) {
    let body = node_create();
    bencher.bench(|| {
        serde_json::from_slice::<AdmissionReview<DynamicObject>>(black_box(&body)).expect("parsed")
    });
}
