//! The churn bench's days as the cluster sees them: each step done for
//! one arm's pool.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use testsupport::frontier::days::Step;

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
            let job = super::job(arm, *n, wave.pods, run_for)?;
            jobs.create(&PostParams::default(), &job).await?;
        }
        Step::Service(_, replicas) => {
            super::scale(deployments, &format!("{arm}-service"), *replicas).await?;
        }
    }
    Ok(())
}
