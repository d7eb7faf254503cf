//! The churn bench's work as the cluster sees it, each part pinned to one
//! arm's pool: the steady and service Deployments, the day's Jobs, each step
//! of the day done for one arm, and the wait until the Jobs are done.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Pod, PodTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use super::arms::{ARM_LABEL, Arm};
use super::days::{Scheduled, Step};

/// A Deployment `<arm>-<part>` of `replicas` pods of `cpu`, pinned to the
/// arm's pool.
pub fn deployment(arm: &str, part: &str, replicas: i32, cpu: &str) -> Result<Deployment> {
    let mut object = serde_json::to_value(testenv::filler_deployment(
        &format!("{arm}-{part}"),
        replicas,
    ))?;
    let template = &mut object["spec"]["template"];
    template["metadata"]["labels"][ARM_LABEL] = json!(arm);
    template["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!(cpu);
    testenv::in_pool(&mut template["spec"], arm);
    Ok(serde_json::from_value(object)?)
}

/// A Job `<arm>-<n>` of `pods` pods running `run_for`, pinned to the arm's
/// pool; the Job and its pods carry the arm's label.
pub fn job(arm: &str, n: usize, pods: i32, run_for: Duration) -> Result<Job> {
    let mut object =
        serde_json::to_value(testenv::filler_job(&format!("{arm}-{n}"), pods, run_for))?;
    object["metadata"]["labels"][ARM_LABEL] = json!(arm);
    let template = &mut object["spec"]["template"];
    template["metadata"]["labels"][ARM_LABEL] = json!(arm);
    testenv::in_pool(&mut template["spec"], arm);
    Ok(serde_json::from_value(object)?)
}

/// The CronJob `<arm>-<name>` of `scheduled`, for a day that starts at
/// minute `origin` of an hour, pinned to the arm's pool; its Jobs and pods
/// carry the arm's label, and every Job is kept to be counted.
pub fn cronjob(arm: &str, scheduled: &Scheduled, origin: u32) -> Result<CronJob> {
    let name = format!("{arm}-{}", scheduled.name);
    let run_for = Duration::from_secs_f64(scheduled.run_for);
    let mut object = serde_json::to_value(testenv::filler_cronjob(
        &name,
        &scheduled.schedule(origin),
        run_for,
    ))?;
    object["metadata"]["labels"] = json!({ARM_LABEL: arm});
    let spec = &mut object["spec"];
    spec["successfulJobsHistoryLimit"] = json!(100);
    spec["failedJobsHistoryLimit"] = json!(100);
    let job = &mut spec["jobTemplate"]["spec"];
    job["parallelism"] = json!(scheduled.pods);
    job["completions"] = json!(scheduled.pods);
    let template = &mut job["template"];
    template["metadata"]["labels"][ARM_LABEL] = json!(arm);
    testenv::in_pool(&mut template["spec"], arm);
    Ok(serde_json::from_value(object)?)
}

/// The PodTemplate and the Karpenter `CapacityBuffer` (one chunk per pod
/// of a run) that keep room for each run of `scheduled` in the arm's pool
/// all day: what an operator sets up for runs that must not wait.
pub fn buffer(arm: &str, scheduled: &Scheduled, origin: u32) -> Result<(PodTemplate, Value)> {
    let cronjob = serde_json::to_value(cronjob(arm, scheduled, origin)?)?;
    let name = format!("{arm}-{}", scheduled.name);
    let template: PodTemplate = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { ARM_LABEL: arm } },
        "template": cronjob["spec"]["jobTemplate"]["spec"]["template"],
    }))?;
    let buffer = json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1",
        "kind": "CapacityBuffer",
        "metadata": { "name": name, "labels": { ARM_LABEL: arm } },
        "spec": { "podTemplateRef": { "name": name }, "replicas": scheduled.pods },
    });
    Ok((template, buffer))
}

/// Karpenter's `CapacityBuffer`s in `default`.
pub fn buffers(client: &kube::Client) -> Api<DynamicObject> {
    let kind = GroupVersionKind::gvk("autoscaling.x-k8s.io", "v1beta1", "CapacityBuffer");
    let resource = ApiResource::from_gvk_with_plural(&kind, "capacitybuffers");
    Api::namespaced_with(client.clone(), "default", &resource)
}

/// Suspends the CronJob `name`: the day's work is over.
pub async fn suspend(cronjobs: &Api<CronJob>, name: &str) -> Result<()> {
    merge_spec(cronjobs, name, json!({"suspend": true})).await
}

pub async fn scale(deployments: &Api<Deployment>, name: &str, replicas: i32) -> Result<()> {
    merge_spec(deployments, name, json!({"replicas": replicas})).await
}

/// Merges `spec` into the spec of the object `name`.
async fn merge_spec<K>(api: &Api<K>, name: &str, spec: serde_json::Value) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = Patch::Merge(json!({ "spec": &spec }));
    api.patch(name, &PatchParams::default(), &patch)
        .await
        .with_context(|| format!("setting {spec} on {name}"))?;
    Ok(())
}

/// Does `step` for `arm`.
pub async fn apply(
    step: &Step<'_>,
    jobs: &Api<Job>,
    deployments: &Api<Deployment>,
    arm: &str,
) -> Result<()> {
    match step {
        Step::Job(n, wave) => {
            let run_for = Duration::from_secs_f64(wave.run_for);
            let job = job(arm, *n, wave.pods, run_for)?;
            jobs.create(&PostParams::default(), &job).await?;
        }
        Step::Service(_, replicas) => {
            scale(deployments, &format!("{arm}-service"), *replicas).await?;
        }
    }
    Ok(())
}

/// Until every arm's Jobs are done; the failed pods (evicted while they
/// ran, run again) per arm.
pub async fn wait_jobs_done(
    client: &kube::Client,
    arms: &[Arm],
    limit: Duration,
) -> Result<BTreeMap<String, i32>> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + limit;
    loop {
        let listed = jobs.list(&ListParams::default()).await?.items;
        let running = listed.iter().filter(|j| !finished(j)).count();
        if running == 0 {
            return Ok(failed_per_arm(&listed, arms));
        }
        if Instant::now() > deadline {
            let stuck = stuck(client, &listed).await;
            bail!("{running} Jobs still running {limit:?} after the day's end: {stuck}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Per arm, its Jobs not finished and the phases of its pods: what a run
/// that did not end was waiting for.
async fn stuck(client: &kube::Client, jobs: &[Job]) -> String {
    let mut per_arm: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for job in jobs.iter().filter(|j| !finished(j)) {
        *per_arm
            .entry(arm_of(&job.metadata))
            .or_default()
            .entry("Jobs".into())
            .or_default() += 1;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    match pods.list(&ListParams::default().labels(ARM_LABEL)).await {
        Ok(list) => {
            for pod in list.items {
                let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                let phase = format!("{} pods", phase.as_deref().unwrap_or("unknown"));
                *per_arm
                    .entry(arm_of(&pod.metadata))
                    .or_default()
                    .entry(phase)
                    .or_default() += 1;
            }
        }
        Err(err) => return format!("{per_arm:?} (pods not listed: {err})"),
    }
    format!("{per_arm:?}")
}

/// The arm an object's `bench-arm` label names.
fn arm_of(meta: &ObjectMeta) -> String {
    let label = meta.labels.as_ref().and_then(|l| l.get(ARM_LABEL));
    label.map_or_else(|| "no arm".to_string(), Clone::clone)
}

/// The failed pods of each arm's Jobs.
fn failed_per_arm(jobs: &[Job], arms: &[Arm]) -> BTreeMap<String, i32> {
    let mut failed = BTreeMap::new();
    for arm in arms {
        let prefix = format!("{}-", arm.name);
        let of_arm = jobs.iter().filter(|j| {
            j.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&prefix))
        });
        let count = of_arm.filter_map(|j| j.status.as_ref()?.failed).sum();
        failed.insert(arm.name.clone(), count);
    }
    failed
}

fn finished(job: &Job) -> bool {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| {
        cs.iter()
            .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_keeps_one_chunk_per_pod_of_a_run_shaped_and_pinned_like_it() {
        let day = super::super::days::Day::generate("long-gaps", 1).unwrap();
        let scheduled = &day.cronjobs[0];
        let (template, buffer) = buffer("kcb-0s", scheduled, 7).unwrap();
        let name = format!("kcb-0s-{}", scheduled.name);
        assert_eq!(template.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(buffer["spec"]["podTemplateRef"]["name"], name.as_str());
        assert_eq!(buffer["spec"]["replicas"], scheduled.pods);
        let spec = serde_json::to_value(template.template.and_then(|t| t.spec)).unwrap();
        assert_eq!(spec["nodeSelector"]["karpenter.sh/nodepool"], "kcb-0s");
        let requests = &spec["containers"][0]["resources"]["requests"]["cpu"];
        assert_eq!(requests, testenv::POD_CPU);
    }
}
