//! The schedule hold's pass at scale: `cargo bench --bench schedule`.
//!
//! What one leader pass computes with `--launch-cost` and
//! `--warm-before-runs`, in the pure core, on 50,000 nodes and 5,000
//! CronJobs (every fifth on a schedule whose gaps are not worth
//! holding), each with a finished run of ten pods on ten nodes and a third of
//! them running now: the known work ([`known_work`]: each CronJob's next run,
//! its last run's size, busy and explained nodes), the nodes kept
//! ([`keep`]) and the runs warmed ([`due_warms`]). Schedules are parsed once
//! per CronJob version in the leader (not per pass), so they are parsed here
//! before timing. divan's allocation profiler reports what a pass allocates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use foldhash::HashSet;
use jiff::Timestamp;
use node_holder::core::due::{Kept, NodeView, Terms, keep};
use node_holder::core::known::{CronJobSpec, JobPod, LastRun, PodShape, known_work};
use node_holder::core::schedule::Schedule;
use node_holder::core::warm::due_warms;

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

const NODES: usize = 50_000;
const CRONJOBS: usize = 5_000;
const PODS_PER_RUN: usize = 10;

fn main() {
    divan::main();
}

/// The cluster one pass reads.
struct Cluster {
    nodes: Vec<String>,
    created: Timestamp,
    cronjobs: Vec<CronJobSpec>,
    /// Each pod: namespace, Job, node, running.
    pods: Vec<(String, String, String, bool)>,
    now: Timestamp,
}

fn cluster() -> Cluster {
    let now: Timestamp = "2026-11-27T10:02:30Z".parse().expect("a time");
    let nodes: Vec<String> = (0..NODES).map(|n| format!("node-{n:05}")).collect();
    let shape = Arc::new(PodShape::default());
    let cronjobs = (0..CRONJOBS)
        .map(|c| {
            let schedule = if c % 5 == 0 {
                "0 * * * *"
            } else {
                "*/5 * * * *"
            };
            CronJobSpec {
                key: format!("team-{}/job-{c}", c % 50),
                uid: Some(format!("{c:08x}-0000")),
                schedule: Schedule::parse(schedule, None),
                suspended: false,
                shape: Some(shape.clone()),
            }
        })
        .collect();
    // Each CronJob's last run (10:00) on ten nodes of its own.
    let minute = "2026-11-27T10:00:00Z"
        .parse::<Timestamp>()
        .expect("a time")
        .as_second()
        / 60;
    let pods = (0..CRONJOBS)
        .flat_map(|c| {
            let nodes = &nodes;
            (0..PODS_PER_RUN).map(move |p| {
                (
                    format!("team-{}", c % 50),
                    format!("job-{c}-{minute}"),
                    nodes[(c * PODS_PER_RUN + p) % NODES].clone(),
                    c % 3 == 0,
                )
            })
        })
        .collect();
    Cluster {
        nodes,
        created: "2026-11-27T09:00:00Z".parse().expect("a time"),
        cronjobs,
        pods,
        now,
    }
}

/// One pass: the known work, the nodes kept, the runs warmed.
#[divan::bench(sample_count = 20)]
fn pass(bencher: divan::Bencher) {
    let c = cluster();
    let terms = Terms {
        launch_cost: Duration::from_secs(300),
        grace: Duration::from_secs(60),
        settle: Duration::from_secs(60),
    };
    let remembered: BTreeMap<String, LastRun> = BTreeMap::new();
    bencher.bench_local(|| {
        let pods = c.pods.iter().map(|(namespace, job, node, running)| JobPod {
            namespace,
            job,
            node: Some(node),
            running: *running,
            placeholder: false,
        });
        let from = c.now.saturating_sub(terms.grace).expect("a time");
        let views: Vec<NodeView<'_>> = c
            .nodes
            .iter()
            .map(|name| NodeView {
                name,
                created: c.created,
                marked: true,
            })
            .collect();
        let in_scope: HashSet<&str> = views.iter().map(|v| v.name).collect();
        let known = known_work(
            &c.cronjobs,
            pods,
            |node| in_scope.contains(node),
            from,
            &remembered,
        );
        let explained: HashSet<String> = known.explained.clone();
        let kept = keep(&views, &known, &explained, c.now, &terms);
        let kept: BTreeMap<String, Kept> = kept
            .iter()
            .map(|(node, k)| (node.to_string(), Kept::from(k)))
            .collect();
        let warms = due_warms(&known, &kept, Duration::from_secs(600), c.now);
        divan::black_box((kept.len(), warms.len()))
    });
}
