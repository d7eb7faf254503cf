//! The chaos soak: three replicas of `serve` (policy mode) beside the real
//! Karpenter, Jobs that make Karpenter launch nodes, and faults at random
//! moments (a seeded order, so a run can be repeated): the leader or a
//! follower SIGKILLed and a new replica started, the leader SIGSTOPped past
//! its Lease and let go on, the API server killed and restarted,
//! node-holder's node writes answered 500 (a failing webhook) or 429 (a
//! one-seat priority level) for 15 s, a person's hold put on a node and
//! taken off, the NodePool's owner rewriting its budgets. A checker reads the cluster every second and counts every
//! broken promise:
//! - a node is held from at most [`UNHELD_BOUND`] after its creation until
//!   its window's deadline (its creation plus the hold; every node extends
//!   the window, no cap is reached);
//! - node-holder's marker stays at most [`OVERSTAY_BOUND`] past the latest
//!   deadline any node set;
//! - a person's hold is never removed nor claimed;
//! - the record never goes backwards (`closedThrough`, an open window's
//!   opening and deadline);
//! - the NodePool's budgets are the owner's, as last written.
//!
//! `cargo bench -p node-holder-lab --bench soak` runs it for 20 minutes
//! (`lab/tests/soak.rs`, a few minutes of it, in the suite).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::Disruption;
use testsupport::Served;
use testsupport::karpenter::Autoscaled;
use testsupport::policy;

/// The hold annotation and node-holder's own keys.
const HOLD: &str = "karpenter.sh/do-not-disrupt";
const MARKER: &str = "node-holder.dev/held";
const HOLD_KEYS: &str = "node-holder.dev/hold-keys";
/// Each new node's hold (the window's extension).
const HOLD_FOR: Duration = Duration::from_secs(45);
const REPLICAS: usize = 3;
/// A node in its window may go unheld this long after its creation: the
/// admission policy holds it at CREATE; the window task's backstop would
/// within a pass.
pub const UNHELD_BOUND: Duration = Duration::from_secs(5);
/// node-holder's marker may outlast the deadline this long: a failover (3 s
/// Lease, a SIGSTOPped leader for 8 s), an API server down for 5 s, a pass.
pub const OVERSTAY_BOUND: Duration = Duration::from_secs(45);

/// How long, and with which seed.
pub struct Soak {
    /// At least this long.
    pub duration: Duration,
    /// And until each kind of fault was injected this many times (at most
    /// [`MAX_ROUNDS`] rounds).
    pub each_fault: usize,
    pub seed: u64,
}

/// Rounds at most, whatever [`Soak::each_fault`] asks.
const MAX_ROUNDS: usize = 200;

/// What a soak did and saw.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub faults: BTreeMap<&'static str, usize>,
    pub jobs: usize,
    pub checks: u64,
    pub violations: Vec<String>,
    pub nodes_seen: usize,
    /// The longest a node in its window went unheld after its creation.
    pub worst_unheld: Duration,
    /// The longest node-holder's marker stayed past the latest deadline.
    pub worst_overstay: Duration,
}

/// What the fault injector changes and the checker must know.
#[derive(Default)]
struct Shared {
    /// Nodes a person holds now; those being changed are not checked.
    person_holds: BTreeSet<String>,
    changing: BTreeSet<String>,
    /// Nodes whose person took their hold off, and when: node-holder holds
    /// them within a pass from then, not from their creation.
    released_by_person: BTreeMap<String, Timestamp>,
    /// The budgets the owner wrote last; `None` while a write is under way.
    owner_budgets: Option<Value>,
    /// Every node seen, with its creation.
    created: BTreeMap<String, Timestamp>,
    last_record: Option<RecordMarks>,
    report: Report,
}

/// The record's parts that must never go backwards.
#[derive(Clone, Debug, PartialEq)]
struct RecordMarks {
    closed_through: Option<Timestamp>,
    open: Option<(Timestamp, Timestamp)>,
}

type State = Arc<Mutex<Shared>>;

fn lock(state: &State) -> std::sync::MutexGuard<'_, Shared> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the soak; the report counts faults, checks and violations.
pub async fn run(soak: &Soak) -> Report {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    let objects = policy::objects(&[]);
    policy::apply(a.cp(), &objects, &testsupport::node("soak-probe"), HOLD).await;
    let state: State = Arc::default();
    lock(&state).owner_budgets = Some(pool_budgets(&a.client).await.unwrap_or(Value::Null));
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(start_replica(&a).await);
    }
    let checking = Arc::new(AtomicBool::new(true));
    let checker = tokio::spawn(check_loop(
        a.client.clone(),
        Arc::clone(&state),
        Arc::clone(&checking),
    ));

    let mut rng = fastrand::Rng::with_seed(soak.seed);
    // Every kind once in each round of the faults, in a seeded order.
    let mut order = FAULTS;
    rng.shuffle(&mut order);
    let started = Instant::now();
    let mut round = 0usize;
    let more_faults = |state: &State| {
        let s = lock(state);
        FAULTS
            .iter()
            .any(|f| s.report.faults.get(f).copied().unwrap_or(0) < soak.each_fault)
    };
    while round < MAX_ROUNDS && (started.elapsed() < soak.duration || more_faults(&state)) {
        if rng.bool() || round.is_multiple_of(3) {
            start_job(&a, &state, &mut rng, round).await;
        }
        let fault = order[round % order.len()];
        if inject(fault, &mut a, &mut replicas, &state, &mut rng).await {
            *lock(&state).report.faults.entry(fault).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_secs(rng.u64(5..15))).await;
        round += 1;
    }
    settle(&a).await;
    checking.store(false, Ordering::Relaxed);
    let _ = checker.await;
    drop(replicas);
    let mut report = lock(&state).report.clone();
    report.nodes_seen = lock(&state).created.len();
    report
}

pub const FAULTS: [&str; 9] = [
    "kill-leader",
    "kill-follower",
    "stop-leader",
    "restart-apiserver",
    "person-hold-on",
    "person-hold-off",
    "owner-edits-budgets",
    "api-500",
    "api-429",
];

/// How long an injected API error lasts.
const API_ERRORS_FOR: Duration = Duration::from_secs(15);

async fn start_replica(a: &Autoscaled) -> Served {
    let hold = format!("--hold-duration={}s", HOLD_FOR.as_secs());
    policy::serve(a.cp(), &[&hold, "--lease-duration=3s"]).await
}

/// A Job of 1-3 pods that each fill a node, running 20-60 s.
async fn start_job(a: &Autoscaled, state: &State, rng: &mut fastrand::Rng, round: usize) {
    let job = testenv::filler_job(
        &format!("soak-{round}"),
        rng.i32(1..=3),
        Duration::from_secs(rng.u64(20..60)),
    );
    let jobs: Api<Job> = Api::namespaced(a.client.clone(), "default");
    if jobs.create(&PostParams::default(), &job).await.is_ok() {
        lock(state).report.jobs += 1;
    }
}

/// Injects `fault`; whether there was something to inject it on (a
/// leader, a node for a person's hold).
async fn inject(
    fault: &'static str,
    a: &mut Autoscaled,
    replicas: &mut Vec<Served>,
    state: &State,
    rng: &mut fastrand::Rng,
) -> bool {
    match fault {
        "kill-leader" | "kill-follower" => {
            let leader = leader_index(a, replicas).await;
            let victim = match (fault, leader) {
                ("kill-leader", Some(i)) => i,
                (_, Some(i)) => (i + 1 + rng.usize(..replicas.len() - 1)) % replicas.len(),
                (_, None) => rng.usize(..replicas.len()),
            };
            drop(replicas.remove(victim)); // SIGKILL
            tokio::time::sleep(Duration::from_secs(rng.u64(3..8))).await;
            replicas.push(start_replica(a).await);
            fault == "kill-follower" || leader.is_some()
        }
        "stop-leader" => {
            let Some(i) = leader_index(a, replicas).await else {
                return false;
            };
            signal(&replicas[i], "-STOP");
            tokio::time::sleep(Duration::from_secs(8)).await;
            signal(&replicas[i], "-CONT");
            true
        }
        "restart-apiserver" => {
            let cp = a.cluster.control_plane_mut();
            cp.restart_apiserver(Duration::from_secs(5))
                .await
                .expect("the API server restarts");
            true
        }
        "person-hold-on" | "person-hold-off" => {
            person_hold(a, state, fault == "person-hold-on").await
        }
        "api-500" | "api-429" => {
            let objects = if fault == "api-500" {
                failing_webhook()
            } else {
                throttling_flow_schema()
            };
            for_a_while(a, &objects).await;
            true
        }
        _ => {
            owner_edits(a, state, rng).await;
            true
        }
    }
}

/// A validating webhook for node-holder's node writes whose server is not
/// there, with `failurePolicy: Fail`: the API server answers each of them
/// 500 (`failed calling webhook`), and nobody else's.
fn failing_webhook() -> Vec<Value> {
    vec![json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "soak-api-500"},
        "webhooks": [{
            "name": "api-500.soak.test",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 1,
            "clientConfig": {"url": "https://127.0.0.1:1/never"},
            "rules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["nodes"], "scope": "Cluster"
            }],
            "matchConditions": [{
                "name": "node-holder-only",
                "expression": format!("request.userInfo.username == '{}'", testenv::NODE_HOLDER_USER)
            }]
        }]
    })]
}

/// A priority level of one seat that rejects what does not fit, for
/// node-holder's node writes: bursts of its PATCHes get 429.
fn throttling_flow_schema() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration",
            "metadata": {"name": "soak-429"},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 1,
                "lendablePercent": 0,
                "limitResponse": {"type": "Reject"}
            }}
        }),
        json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": "soak-429"},
            "spec": {
                "priorityLevelConfiguration": {"name": "soak-429"},
                "matchingPrecedence": 100,
                "rules": [{
                    "subjects": [{"kind": "ServiceAccount",
                        "serviceAccount": {"name": "node-holder", "namespace": "node-holder"}}],
                    "resourceRules": [{"verbs": ["patch"], "apiGroups": [""],
                        "resources": ["nodes"], "clusterScope": true}]
                }]
            }
        }),
    ]
}

/// Creates `objects` for [`API_ERRORS_FOR`], then deletes them (an API
/// server down for a moment may leave them a round longer).
async fn for_a_while(a: &Autoscaled, objects: &[Value]) {
    let _ = testenv::apply_objects(&a.client, objects).await;
    tokio::time::sleep(API_ERRORS_FOR).await;
    let _ = testenv::delete_objects(&a.client, objects).await;
}

fn signal(served: &Served, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, &served.child.id().to_string()])
        .status();
}

/// The replica that holds the Lease, by its identity (`serve-<admin port>`).
async fn leader_index(a: &Autoscaled, replicas: &[Served]) -> Option<usize> {
    let leases: Api<Lease> = Api::namespaced(a.client.clone(), testenv::NODE_HOLDER_NAMESPACE);
    let lease = leases.get_opt("node-holder-window").await.ok()??;
    let holder = lease.spec?.holder_identity?;
    replicas
        .iter()
        .position(|r| holder == format!("serve-{}", r.admin_port))
}

/// A person's hold. On: a person adds a node of their own (outside
/// Karpenter) that carries their hold from its CREATE, so the admission
/// policy must not claim it; off: they take their hold off that node again
/// (node-holder may then hold it like any other, within a pass).
async fn person_hold(a: &Autoscaled, state: &State, on: bool) -> bool {
    if on {
        let name = format!(
            "soak-person-{}",
            lock(state).report.faults.values().sum::<usize>()
        );
        lock(state).changing.insert(name.clone());
        let node = testsupport::node_with(&name, &[], &[(HOLD, "true")]);
        let done = a.nodes.create(&PostParams::default(), &node).await.is_ok();
        let mut s = lock(state);
        if done {
            s.person_holds.insert(name.clone());
        }
        s.changing.remove(&name);
        return done;
    }
    let Some(name) = lock(state).person_holds.iter().next().cloned() else {
        return false;
    };
    {
        let mut s = lock(state);
        s.changing.insert(name.clone());
        s.person_holds.remove(&name);
    }
    let patch = json!({"metadata": {"annotations": {HOLD: Value::Null}}});
    let done = a
        .nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .is_ok();
    let mut s = lock(state);
    s.released_by_person.insert(name.clone(), Timestamp::now());
    s.changing.remove(&name);
    done
}

/// The owner writes the pool's budgets anew.
async fn owner_edits(a: &Autoscaled, state: &State, rng: &mut fastrand::Rng) {
    let choices = [
        json!([{"nodes": "10%"}]),
        json!([{"nodes": "100%"}]),
        json!([{"nodes": "50%"}, {"nodes": "1", "reasons": ["Drifted"]}]),
    ];
    let budgets = choices[rng.usize(..choices.len())].clone();
    lock(state).owner_budgets = None;
    let patch = json!({"spec": {"disruption": {"budgets": budgets}}});
    let pools = testenv::node_pools(&a.client);
    let _ = pools
        .patch(
            testenv::NODE_POOL,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
    lock(state).owner_budgets = pool_budgets(&a.client).await;
}

async fn pool_budgets(client: &kube::Client) -> Option<Value> {
    let pool: DynamicObject = testenv::node_pools(client)
        .get(testenv::NODE_POOL)
        .await
        .ok()?;
    Some(pool.data["spec"]["disruption"]["budgets"].clone())
}

/// The end: no more faults or Jobs; the checker goes on until every node's
/// window is over and its holds are off (or the bound has passed).
async fn settle(a: &Autoscaled) {
    let deadline = Instant::now() + HOLD_FOR * 2 + OVERSTAY_BOUND + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Ok(list) = a.nodes.list(&Default::default()).await else {
            continue;
        };
        let now = Timestamp::now();
        if !list.items.iter().any(|n| marked(n) || in_window(n, now)) {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn check_loop(client: kube::Client, state: State, running: Arc<AtomicBool>) {
    while running.load(Ordering::Relaxed) {
        // An API server down for a moment: this round is skipped.
        let _ = check_once(&client, &state).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn check_once(client: &kube::Client, state: &State) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&Default::default()).await?;
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), testenv::NODE_HOLDER_NAMESPACE);
    let record = records.get_opt("node-holder-window").await?;
    let budgets = pool_budgets(client).await;
    let now = Timestamp::now();
    let mut s = lock(state);
    for node in &list.items {
        if let (Some(name), Some(created)) =
            (&node.metadata.name, &node.metadata.creation_timestamp)
        {
            s.created.entry(name.clone()).or_insert(created.0);
        }
    }
    let latest_deadline = s.created.values().map(|c| after(*c, HOLD_FOR)).max();
    for node in &list.items {
        check_node(&mut s, node, now, latest_deadline);
    }
    if let Some(marks) = record.as_ref().and_then(record_marks) {
        check_record(&mut s, marks);
    }
    if let (Some(owner), Some(seen)) = (s.owner_budgets.clone(), budgets) {
        s.report.checks += 1;
        if owner != seen {
            s.report.violations.push(format!(
                "{now}: the pool's budgets {seen} are not the owner's {owner}"
            ));
        }
    }
    Ok(())
}

fn check_node(s: &mut Shared, node: &Node, now: Timestamp, latest_deadline: Option<Timestamp>) {
    let Some(name) = node.metadata.name.clone() else {
        return;
    };
    if s.changing.contains(&name) {
        return;
    }
    s.report.checks += 1;
    if s.person_holds.contains(&name) {
        if !carries_hold(node) {
            s.report
                .violations
                .push(format!("{now}: {name}: a person's hold was removed"));
        }
        if listed(node) {
            s.report
                .violations
                .push(format!("{now}: {name}: a person's hold was claimed"));
        }
        return;
    }
    let created = s.created.get(&name).copied().unwrap_or(now);
    let created = s
        .released_by_person
        .get(&name)
        .map_or(created, |r| created.max(*r));
    if in_window(node, now) && !(marked(node) && carries_hold(node)) {
        let unheld = elapsed(created, now);
        s.report.worst_unheld = s.report.worst_unheld.max(unheld);
        if unheld > UNHELD_BOUND {
            s.report.violations.push(format!(
                "{now}: {name}: in its window and unheld {unheld:?} after its creation"
            ));
        }
    }
    if let Some(deadline) = latest_deadline.filter(|d| marked(node) && now > *d) {
        let overstay = elapsed(deadline, now);
        s.report.worst_overstay = s.report.worst_overstay.max(overstay);
        if overstay > OVERSTAY_BOUND {
            s.report.violations.push(format!(
                "{now}: {name}: held {overstay:?} past the latest deadline {deadline}"
            ));
        }
    }
}

fn check_record(s: &mut Shared, marks: RecordMarks) {
    s.report.checks += 1;
    if let Some(last) = s.last_record.clone() {
        let backwards = marks.closed_through < last.closed_through
            || matches!((last.open, marks.open), (Some((o1, d1)), Some((o2, d2))) if o1 == o2 && d2 < d1);
        if backwards {
            s.report.violations.push(format!(
                "the record went backwards: {last:?} then {marks:?}"
            ));
        }
    }
    s.last_record = Some(marks);
}

/// The record's closedThrough and open window (opening, deadline).
fn record_marks(record: &ConfigMap) -> Option<RecordMarks> {
    let text = record.data.as_ref()?.get("window.json")?;
    let window: Value = serde_json::from_str(text).ok()?;
    let time = |v: &Value| v.as_str().and_then(|t| t.parse::<Timestamp>().ok());
    let open = window["open"].is_object().then(|| {
        Some((
            time(&window["open"]["openedAt"])?,
            time(&window["open"]["deadline"])?,
        ))
    });
    Some(RecordMarks {
        closed_through: time(&window["closedThrough"]),
        open: open.flatten(),
    })
}

fn annotation<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn marked(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(MARKER).is_some_and(|v| v == "true"))
}

fn carries_hold(node: &Node) -> bool {
    annotation(node, HOLD) == Some("true")
}

fn listed(node: &Node) -> bool {
    annotation(node, HOLD_KEYS).is_some_and(|keys| keys.split(',').any(|k| k.trim() == HOLD))
}

/// Created less than the hold ago: its own window holds it still (a
/// second's margin for the pass that releases at the deadline).
fn in_window(node: &Node, now: Timestamp) -> bool {
    node.metadata
        .creation_timestamp
        .as_ref()
        .is_some_and(|c| now < after(c.0, HOLD_FOR) - SignedDuration::from_secs(1))
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    t + SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::try_from(to.duration_since(from)).unwrap_or_default()
}
