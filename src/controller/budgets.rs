//! `--hold-mechanism budget`: the NodePool reads and writes. The leader
//! brings every NodePool to the plan at each pass: node-holder's budget entry
//! on while the window of its nodes holds, off otherwise; what the list looks
//! like is [`crate::core::budget`]'s.

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail};
use futures::Stream;
use jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{GroupVersionKind, PartialObjectMeta};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use serde_json::Value;

use crate::core::budget::{
    add, budgets_of, carries, entry_slack, marker_ops, remove, renew, self_ending_entry,
    set_budgets,
};
use crate::core::node::labels;
use crate::core::selector::NodeScope;
use crate::state::record::FIELD_MANAGER;

/// Karpenter's maximum of budgets a NodePool may have.
const MAX_BUDGETS: usize = 50;

/// How one NodePool write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Done,
    /// Someone wrote the pool since it was read (409, or 422 from the
    /// `test`): read it again and decide again.
    Changed,
    /// The pool is gone (404).
    Gone,
}

/// The NodePools node-holder holds by budget: Karpenter's `karpenter.sh/v1`
/// NodePools that match a label selector.
#[derive(Clone)]
pub struct Pools {
    api: Api<DynamicObject>,
    /// Their metadata only, for the watch.
    meta: Api<PartialObjectMeta<DynamicObject>>,
    scope: NodeScope,
}

impl Pools {
    pub fn new(client: kube::Client, scope: NodeScope) -> Self {
        let nodepool = GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool");
        let resource = ApiResource::from_gvk_with_plural(&nodepool, "nodepools");
        Pools {
            api: Api::all_with(client.clone(), &resource),
            meta: Api::all_with(client, &resource),
            scope,
        }
    }

    /// The pool's metadata each time a NodePool appears or its spec or
    /// labels change: what may change its plan (someone edits its budgets,
    /// or the selector takes it in or out). Its status, which Karpenter
    /// writes all the time, does not count, nor does a deletion (the next
    /// pass forgets a gone pool). While Karpenter's API is missing, the
    /// watch retries (at most 5 s apart, so a pool is seen soon after the
    /// API is installed) and yields each failure.
    pub fn changes(
        &self,
    ) -> impl Stream<Item = Result<PartialObjectMeta<DynamicObject>, watcher::Error>> + use<> {
        watcher::watcher(self.meta.clone(), watcher::Config::default())
            .backoff(crate::retry::watch_backoff())
            .applied_objects()
            .predicate_filter(
                predicates::generation.combine(predicates::labels),
                Default::default(),
            )
    }

    /// Every NodePool (node-holder's entry comes off pools that left the
    /// selector too).
    async fn list(&self) -> Result<Vec<DynamicObject>> {
        Ok(self
            .api
            .list(&ListParams::default())
            .await
            .context("listing Karpenter's NodePools (karpenter.sh/v1); --hold-mechanism budget needs Karpenter v1")?
            .items)
    }

    /// The NodePool `name` as it is now; `None` once it is gone.
    async fn get(&self, name: &str) -> Result<Option<DynamicObject>> {
        self.api
            .get_opt(name)
            .await
            .with_context(|| format!("reading NodePool {name}"))
    }

    /// Whether the pool is one node-holder holds by budget.
    fn in_scope(&self, pool: &DynamicObject) -> bool {
        self.scope.matches(labels(&pool.metadata))
    }

    /// Sets the pool's budgets to `budgets`, and its budget marker
    /// ([`crate::core::budget::BUDGET_MARKER`]) to
    /// `until` (removed with `None`), if nobody wrote it since it was read.
    async fn write(
        &self,
        pool: &DynamicObject,
        budgets: Vec<Value>,
        until: Option<Timestamp>,
    ) -> Result<Written> {
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        let version = pool
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default();
        let mut ops = set_budgets(&pool.data, version, budgets);
        if let Value::Array(ops) = &mut ops {
            ops.extend(marker_ops(pool.metadata.annotations.as_ref(), until));
        }
        let patch: json_patch::Patch =
            serde_json::from_value(ops).context("building the budgets patch")?;
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        match self
            .api
            .patch(name, &params, &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => Ok(Written::Done),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Written::Gone),
            Err(kube::Error::Api(status)) if status.code == 409 || is_failed_test(&status) => {
                Ok(Written::Changed)
            }
            Err(err) => Err(err).with_context(|| format!("writing NodePool {name}'s budgets")),
        }
    }
}

/// Whether the watch failed because the API server serves no NodePools
/// (Karpenter's CRDs are not installed): each pass says so already.
pub fn api_missing(err: &watcher::Error) -> bool {
    watch_refused(err) == Some(404)
}

/// The HTTP status the API server refused a watch's list or start with.
pub fn watch_refused(err: &watcher::Error) -> Option<u16> {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// A 422 from the patch's `test` (the pool changed), not from validation.
fn is_failed_test(status: &kube::core::Status) -> bool {
    status.code == 422 && status.message.contains("test failed")
}

use crate::retry::POOL_WRITE_ATTEMPTS as WRITE_ATTEMPTS;

impl super::WindowTask {
    /// Brings every NodePool to the plan: node-holder's budget on the pools
    /// in scope whose window holds, off every other. Returns the pools whose
    /// budget holds their nodes now; `None` without `--hold-mechanism
    /// budget`. A pool whose budget could not be written is left out (its
    /// nodes are held by annotation instead) and logged.
    pub(super) async fn hold_pools(&mut self, now: Timestamp) -> Result<Option<BTreeSet<String>>> {
        let Some(pools) = self.pools.clone() else {
            return Ok(None);
        };
        let listed = pools.list().await?;
        let names: BTreeSet<String> = listed
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let mut covered = BTreeSet::new();
        for pool in listed {
            let name = pool.metadata.name.clone().unwrap_or_default();
            let hold = pools.in_scope(&pool).then(|| self.pool_hold(now)).flatten();
            match self.pool_to_plan(&pools, pool, hold).await {
                Ok(true) => {
                    covered.insert(name);
                }
                Ok(false) => {}
                Err(err) => tracing::warn!(
                    pool = %name,
                    error = format!("{err:#}"),
                    "NodePool budget not written; its nodes are held by annotation"
                ),
            }
        }
        // node-holder's entry went with a pool that is gone.
        self.added.retain(|name, _| names.contains(name));
        self.save_record().await?;
        self.metrics
            .pools_held
            .set(i64::try_from(covered.len()).unwrap_or(i64::MAX));
        Ok(Some(covered))
    }

    /// The hold the pools need at `now`: until when the window holds, and
    /// until when node-holder's entry is to run; `None` when they are not
    /// held.
    fn pool_hold(&self, now: Timestamp) -> Option<PoolHold> {
        let deadline = self.window.held_until(now)?;
        let slack = entry_slack(self.config.window.hold);
        let slack = jiff::SignedDuration::try_from(slack).unwrap_or_default();
        Some(PoolHold {
            now,
            deadline,
            entry_until: deadline.saturating_add(slack).unwrap_or(deadline),
        })
    }

    /// After a write to pool `name` (`held`: node-holder's entry on or
    /// renewed): logged, and forgotten once off. Whether the pool carries it.
    fn pool_written(&mut self, name: &str, held: bool) -> bool {
        let action = if held { "hold" } else { "release" };
        let ends = self.added.get(name).and_then(|a| a.ends);
        tracing::info!(pool = %name, action, ends = ?ends.map(|e| e.to_string()), "NodePool budget written");
        if !held {
            self.added.remove(name);
        }
        held
    }

    /// Puts node-holder's entry on the pool (`hold`), renews it when the
    /// deadline passed its end, or takes it off, reading the pool again
    /// while someone else writes it; returns whether the pool carries it
    /// now. What is added is recorded before the write, so that a leader
    /// that dies after it still finds what to remove.
    async fn pool_to_plan(
        &mut self,
        pools: &Pools,
        mut pool: DynamicObject,
        hold: Option<PoolHold>,
    ) -> Result<bool> {
        let name = pool.metadata.name.clone().unwrap_or_default();
        for attempt in 0..WRITE_ATTEMPTS {
            let budgets = budgets_of(&pool.data);
            let step = match hold {
                Some(hold) => self.plan_hold(&name, &budgets, hold, attempt)?,
                None => self.plan_release(&name, &budgets),
            };
            let (budgets, held) = match step {
                Step::Done(held) => return Ok(held),
                Step::Write { budgets, held } => (budgets, held),
            };
            if held {
                self.save_record().await?;
            }
            let until = self.added.get(&name).and_then(|a| a.ends).filter(|_| held);
            match pools.write(&pool, budgets, until).await? {
                Written::Done => return Ok(self.pool_written(&name, held)),
                Written::Changed => match pools.get(&name).await? {
                    Some(fresh) => pool = fresh,
                    None => break,
                },
                Written::Gone => break,
            }
        }
        if pools.get(&name).await?.is_none() {
            self.added.remove(&name);
            return Ok(false);
        }
        bail!(
            "NodePool {name} kept changing: its budgets were not written in {WRITE_ATTEMPTS} attempts"
        )
    }

    /// The write that holds pool `name` (its `budgets` as read) until
    /// `hold.deadline`, or nothing to write when its entry already does.
    fn plan_hold(
        &mut self,
        name: &str,
        budgets: &[Value],
        hold: PoolHold,
        attempt: u32,
    ) -> Result<Step> {
        let entry = self_ending_entry(hold.now, hold.entry_until);
        if let Some(added) = self.added.get(name) {
            if carries(budgets, added) {
                if added.holds_until(hold.deadline) {
                    return Ok(Step::Done(true));
                }
                if let Some((with, renewed)) = renew(budgets, added, entry.clone()) {
                    self.added.insert(name.to_string(), renewed);
                    return Ok(Step::Write {
                        budgets: with,
                        held: true,
                    });
                }
            } else if attempt == 0 {
                // Someone took it off (a GitOps sync?), or a write did
                // not land before a restart.
                tracing::warn!(
                    pool = %name,
                    "node-holder's budget entry is missing from the NodePool; putting it back"
                );
            }
        }
        if budgets.len() >= MAX_BUDGETS {
            bail!(
                "NodePool {name} has {} budgets, Karpenter's maximum: node-holder cannot add its own",
                budgets.len()
            );
        }
        let (with, added) = add(budgets, entry);
        self.added.insert(name.to_string(), added);
        Ok(Step::Write {
            budgets: with,
            held: true,
        })
    }

    /// The write that takes node-holder's entry off pool `name`, or nothing
    /// to write when it carries none.
    fn plan_release(&mut self, name: &str, budgets: &[Value]) -> Step {
        let Some(added) = self.added.get(name) else {
            return Step::Done(false);
        };
        match remove(budgets, added) {
            Some(without) => Step::Write {
                budgets: without,
                held: false,
            },
            None => {
                self.added.remove(name);
                Step::Done(false)
            }
        }
    }
}

/// A pool's hold at a pass: `now`, its window's deadline, and until when
/// node-holder's entry is to run (the deadline and a slack).
#[derive(Debug, Clone, Copy)]
struct PoolHold {
    now: Timestamp,
    deadline: Timestamp,
    entry_until: Timestamp,
}

/// What one pool needs at one attempt.
enum Step {
    /// Nothing to write; whether the pool carries node-holder's entry.
    Done(bool),
    /// Write these budgets; `held`: with node-holder's entry on.
    Write { budgets: Vec<Value>, held: bool },
}
