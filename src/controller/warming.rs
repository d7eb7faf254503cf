//! `--warm-before-runs`, the leader's side of [`crate::core::warm`]: the placeholder Jobs created
//! and deleted, and what each warm did said on its CronJob. Failures are logged and tried again: a
//! warm is an optimisation, never a reason for a pass (and its holds) to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, PostParams};

use super::events::HoldEvent;
use crate::core::known::KnownWork;
use crate::core::node::NodeMeta;
use crate::core::warm::{
    HANDOVER, HandOver, Warm, due_warms, in_window, next_change, placeholder_job, priority_class,
    why_warmed,
};

/// How soon a warm that failed to be created or deleted is tried again.
const RETRY: Duration = Duration::from_secs(10);

/// The leader's warms: those it made and has not ended, by Job name.
#[derive(Debug, Default)]
pub(super) struct Warming {
    made: BTreeMap<String, Made>,
    /// Placeholder Jobs deleted whose pods may still be seen going.
    ended: BTreeSet<String>,
    class_made: bool,
    /// When a warm next starts or hands over (or a failure is retried).
    pub wake: Option<Timestamp>,
}

/// A warm made: for which run, and since when.
#[derive(Debug, Clone)]
struct Made {
    cronjob: String,
    uid: Option<String>,
    at: Timestamp,
    since: Timestamp,
}

impl super::WindowTask {
    /// Brings the placeholder Jobs to what the schedules say now.
    pub(super) async fn warm_for_runs(
        &mut self,
        known: &KnownWork,
        snapshot: &[Arc<NodeMeta>],
        now: Timestamp,
    ) {
        let (Some(lead), Some(terms)) = (self.config.warm_lead, self.config.schedule) else {
            return;
        };
        let due = due_warms(known, &self.kept, lead, now);
        let mut failed = false;
        for warm in &due {
            if !self.warming.made.contains_key(&warm.name) {
                failed |= !self.start_warm(warm, &terms, now).await;
            }
        }
        // A warm goes on while its run is in its window (every due warm's
        // is), even once the schedule keeps its placeholders' nodes for it.
        let in_window = in_window(known, lead, now);
        let going_on: BTreeSet<&str> = in_window.iter().map(String::as_str).collect();
        failed |= !self.end_warms(&going_on, snapshot, now).await;
        let next = next_change(known, lead, now);
        let retry = failed.then(|| crate::core::plus(now, RETRY));
        self.warming.wake = next.into_iter().chain(retry).min();
    }

    /// Creates one run's placeholder Job (one already there counts as made); whether that worked.
    async fn start_warm(
        &mut self,
        warm: &Warm<'_>,
        terms: &crate::core::due::Terms,
        now: Timestamp,
    ) -> bool {
        if !self.warming.class_made && !self.make_priority_class().await {
            return false;
        }
        let namespace = &self.config.namespace;
        let job = placeholder_job(warm, namespace, terms, now);
        let job = serde_json::from_value::<Job>(job).inspect_err(|err| {
            tracing::warn!(error = %err, job = %warm.name, "placeholder Job not built");
        });
        let Ok(job) = job else { return false };
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        let created = match api.create(&PostParams::default(), &job).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 409 => false,
            Err(err) => {
                tracing::warn!(error = %err, job = %warm.name, "placeholder Job not created; trying again");
                return false;
            }
        };
        let run = warm.run;
        if created {
            let why = why_warmed(warm, terms);
            tracing::info!(cronjob = %run.cronjob, run_at = %run.at, job = %warm.name, "warming for a scheduled run: {why}");
            let event = HoldEvent::warm(&run.cronjob, run.uid.as_deref(), "WarmingForRun", why);
            self.events.send(event);
        }
        let made = Made {
            cronjob: run.cronjob.clone(),
            uid: run.uid.clone(),
            at: run.at,
            since: now,
        };
        self.warming.made.insert(warm.name.clone(), made);
        true
    }

    /// Creates the placeholders' PriorityClass if it is not there.
    async fn make_priority_class(&mut self) -> bool {
        let class = serde_json::from_value::<PriorityClass>(priority_class()).inspect_err(|err| {
            tracing::warn!(error = %err, "placeholder PriorityClass not built");
        });
        let Ok(class) = class else { return false };
        let api: Api<PriorityClass> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => {
                tracing::info!(name = ?class.metadata.name, "placeholder PriorityClass created")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(err) => {
                tracing::warn!(error = %err, "placeholder PriorityClass not created; no warm until it is");
                return false;
            }
        }
        self.warming.class_made = true;
        true
    }

    /// Deletes every placeholder Job (made, or seen by its pods) whose warm
    /// is not due any more; whether every delete worked.
    async fn end_warms(
        &mut self,
        due: &BTreeSet<&str>,
        snapshot: &[Arc<NodeMeta>],
        now: Timestamp,
    ) -> bool {
        let Some(watch) = &self.scheduled else {
            return true;
        };
        let seen = watch.placeholders();
        let seen_jobs: BTreeSet<String> = seen.iter().map(|(job, _)| job.clone()).collect();
        self.warming.ended.retain(|job| seen_jobs.contains(job));
        let over: BTreeSet<String> = self
            .warming
            .made
            .keys()
            .chain(seen_jobs.iter())
            .filter(|job| !due.contains(job.as_str()) && !self.warming.ended.contains(*job))
            .cloned()
            .collect();
        let mut ok = true;
        for job in over {
            if !self.delete_placeholder(&job).await {
                ok = false;
                continue;
            }
            if let Some(made) = self.warming.made.remove(&job) {
                self.say_how_it_went(&job, &made, &seen, snapshot, now);
            }
            self.warming.ended.insert(job);
        }
        ok
    }

    async fn delete_placeholder(&self, job: &str) -> bool {
        let api: Api<Job> = Api::namespaced(self.client.clone(), &self.config.namespace);
        match api.delete(job, &DeleteParams::background()).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 404 => true,
            Err(err) => {
                tracing::warn!(error = %err, %job, "placeholder Job not deleted; trying again");
                false
            }
        }
    }

    /// The warm's Event, log line and counts: at the hand-over, its ready
    /// placeholders and node-seconds; before it, that the run no longer comes.
    fn say_how_it_went(
        &self,
        job: &str,
        made: &Made,
        seen: &[(String, Option<String>)],
        snapshot: &[Arc<NodeMeta>],
        now: Timestamp,
    ) {
        if crate::core::plus(now, HANDOVER) < made.at {
            let note = format!(
                "the run at {} is no longer due (suspended, rescheduled or deleted): placeholder Job {job} deleted",
                made.at
            );
            tracing::info!(cronjob = %made.cronjob, "warm cancelled: {note}");
            self.say(made, "WarmCancelled", note);
            return;
        }
        let pods = seen
            .iter()
            .filter(|(j, _)| j == job)
            .map(|(_, node)| node.as_deref());
        let created: BTreeMap<&str, Timestamp> = snapshot
            .iter()
            .map(|node| (node.name(), node.created()))
            .collect();
        let over = HandOver::of(pods, |node| created.get(node).copied(), made.at, made.since);
        let (ready, late) = (over.ready, over.late);
        self.metrics.schedule.warmed(ready, late, over.node_seconds);
        let note = over.note(made.at);
        tracing::info!(cronjob = %made.cronjob, %job, ready, late, "warm handed over: {note}");
        self.say(made, "WarmedForRun", note);
    }

    fn say(&self, made: &Made, reason: &'static str, note: String) {
        let event = HoldEvent::warm(&made.cronjob, made.uid.as_deref(), reason, note);
        self.events.send(event);
    }
}
