//! The hold window bench at scale (`lab/benches/window.rs`): what each of its
//! phases recorded (start-up, hold, the probes while the window is open,
//! release), and the report made of it: node-holder's [`requests`] by phase,
//! the API server's and node-holder's [`logs`], and the [`summary`] against
//! the targets. Its [`cluster`] keeps the bench's view of the control plane.

pub mod cluster;
pub mod logs;
pub mod phases;
pub mod requests;
pub mod summary;

use std::time::Duration;

use jiff::Timestamp;
use testsupport::Served;

use crate::measure::apiserver::{ApiDelta, ApiMetrics};
use crate::measure::audit::{self, AuditPatch};
use crate::measure::machine::Machine;
use crate::measure::node_holder::NodeHolderMetrics;
use crate::measure::observer::{Observe, Observer, OwnSnapshot};
use crate::measure::process::{ProcMemory, mib};
use crate::measure::rss::RssSampler;

/// `node-holder serve` running, its memory sampled and the held count
/// followed.
pub struct Serving {
    pub served: Served,
    pub pid: u32,
    pub sampler: RssSampler,
    pub observer: Observer,
}

/// The API server's counters and the bench's own requests at one step.
pub struct Checkpoint {
    pub api: ApiMetrics,
    pub own: OwnSnapshot,
}

impl Checkpoint {
    /// node-holder's requests from `earlier` until this step: the API
    /// server's less the bench's own in between.
    pub fn since(&self, earlier: &Checkpoint) -> ApiDelta {
        self.api.since(&earlier.api, &self.own.since(&earlier.own))
    }
}

/// From before `serve` started until just before the new node.
pub struct Start {
    /// Before `serve` started.
    pub before: Checkpoint,
    /// `serve` idle after its first pass, just before the new node.
    pub ready: Checkpoint,
    pub nh: NodeHolderMetrics,
    pub idle: ProcMemory,
    pub cpu_idle: Duration,
}

/// One new node opens the window: until every node is held and settled.
pub struct Hold {
    pub start_wall: Timestamp,
    pub end_wall: Timestamp,
    /// From the new node's create until every node was held.
    pub time: Option<Duration>,
    pub settled: Checkpoint,
    pub nh: NodeHolderMetrics,
    pub cpu: Duration,
    /// The largest VmRSS sampled in the phase, KiB.
    pub rss_kb: u64,
}

/// The probes while the window is open.
pub struct Probes {
    pub churn_secs: f64,
    pub churn_window: (Timestamp, Timestamp),
    pub churn_api: ApiDelta,
    pub churn_passes: f64,
    pub extend_window: (Timestamp, Timestamp),
    pub extend_time: Option<Duration>,
    pub extend_api: ApiDelta,
    pub extender_created: Timestamp,
    /// node-holder's holds_applied during the extend probe.
    pub extend_applied: f64,
}

/// The window closes: from its deadline until every hold is gone and
/// settled.
pub struct Release {
    pub deadline: Timestamp,
    pub before: Checkpoint,
    pub settled: Checkpoint,
    pub nh: NodeHolderMetrics,
    /// Seconds from the deadline until no node was held.
    pub time: Option<f64>,
    /// The nodes released.
    pub target: usize,
    pub end_wall: Timestamp,
    pub cpu_before: Duration,
    pub cpu_end: Duration,
    pub end_memory: ProcMemory,
    /// The largest VmRSS sampled in the phase, KiB.
    pub rss_kb: u64,
}

/// Everything one run of the bench measured.
pub struct Run {
    /// The nodes before the window.
    pub nodes: usize,
    pub create_in_flight: usize,
    /// Unrelated node changes of the churn probe.
    pub churn_nodes: usize,
    pub machine: Machine,
    pub observe: Observe,
    pub create_secs: f64,
    pub start: Start,
    pub hold: Hold,
    pub probes: Option<Probes>,
    pub release: Release,
    /// node-holder's node PATCHes, from the audit log.
    pub patches: Vec<AuditPatch>,
    /// The API server's node counters at each step.
    pub raw: Vec<String>,
}

/// node-holder's node PATCHes by phase, as the API server received them.
pub struct Phases<'a> {
    pub before: Vec<&'a AuditPatch>,
    pub hold: Vec<&'a AuditPatch>,
    /// The rest of the open window, after the probes.
    pub open: Vec<&'a AuditPatch>,
    pub release: Vec<&'a AuditPatch>,
    pub after: Vec<&'a AuditPatch>,
}

impl Run {
    /// The PATCHes the API server received from `from` until `to`.
    pub fn patches_between(&self, from: Timestamp, to: Timestamp) -> Vec<&AuditPatch> {
        audit::between(&self.patches, from, to)
    }

    pub fn phases(&self) -> Phases<'_> {
        let (hold, release) = (&self.hold, &self.release);
        let probes_end = self
            .probes
            .as_ref()
            .map_or(hold.end_wall, |p| p.extend_window.1);
        Phases {
            before: self.patches_between(Timestamp::MIN, hold.start_wall),
            hold: self.patches_between(hold.start_wall, hold.end_wall),
            open: self.patches_between(probes_end, release.deadline),
            release: self.patches_between(release.deadline, release.end_wall),
            after: self.patches_between(release.end_wall, Timestamp::MAX),
        }
    }

    /// From `serve`'s start until just before the new node.
    pub fn serve_api(&self) -> ApiDelta {
        let start = &self.start;
        start.ready.api.since(&start.before.api, &start.ready.own)
    }

    /// The whole run, from before `serve` started.
    pub fn whole_api(&self) -> ApiDelta {
        let settled = &self.release.settled;
        settled.api.since(&self.start.before.api, &settled.own)
    }

    /// `== serve memory and CPU ==`: idle, each phase's peak and CPU, the end.
    pub fn print_memory(&self) {
        let (start, hold, release) = (&self.start, &self.hold, &self.release);
        println!("\n== `serve` memory and CPU ==");
        println!("idle before the window: {}", start.idle);
        println!(
            "hold phase: max sampled VmRSS {:.1} MiB; CPU {:.2?}",
            mib(hold.rss_kb),
            hold.cpu.saturating_sub(start.cpu_idle)
        );
        println!(
            "release phase: max sampled VmRSS {:.1} MiB; CPU {:.2?}",
            mib(release.rss_kb),
            release.cpu_end.saturating_sub(release.cpu_before)
        );
        println!(
            "at the end: {}; CPU in all {:.2?}",
            release.end_memory, release.cpu_end
        );
    }
}
