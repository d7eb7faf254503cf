//! The days the churn bench plays, each from a seed, and the demand each
//! puts on the nodes (what the clairvoyant optimum is computed from).
//! Every arm's pool plays the same day.

use anyhow::{Result, bail};

/// Pods of a service: small, three to a node, one beside a Job's pod.
pub const SERVICE_CPU: &str = "250m";
const SERVICE_PER_NODE: i64 = 3;

/// One Job: `pods` pods of a whole node each, started `at` seconds into the
/// day, each running `run_for` seconds.
#[derive(Debug, Clone)]
pub struct Wave {
    pub at: f64,
    pub pods: i32,
    pub run_for: f64,
}

/// A CronJob of the day, run by the cluster's CronJob controller (not the
/// bench): `pods` pods of `run_for` seconds, first `first` minutes into the
/// day, then every `period` minutes, the last starting before minute
/// `until`.
#[derive(Debug, Clone)]
pub struct Scheduled {
    pub name: &'static str,
    pub first: u32,
    pub period: u32,
    pub until: u32,
    pub pods: i32,
    pub run_for: f64,
}

impl Scheduled {
    /// The minutes of the day its runs start at.
    fn minutes(&self) -> impl Iterator<Item = u32> + '_ {
        (self.first..self.until).step_by(self.period.max(1) as usize)
    }

    /// Its runs, as the Jobs they are.
    pub fn runs(&self) -> impl Iterator<Item = Wave> + '_ {
        self.minutes().map(|m| Wave {
            at: f64::from(m) * 60.0,
            pods: self.pods,
            run_for: self.run_for,
        })
    }

    /// Its schedule for a day that starts at minute `origin` of an hour
    /// (UTC): the minutes of the hour its runs start at. A day is shorter
    /// than an hour, so no minute comes twice, and its CronJob is suspended
    /// when the day's work ends.
    pub fn schedule(&self, origin: u32) -> String {
        let mut minutes: Vec<u32> = self.minutes().map(|m| (origin + m) % 60).collect();
        minutes.sort_unstable();
        let minutes: Vec<String> = minutes.iter().map(u32::to_string).collect();
        format!("{} * * * *", minutes.join(","))
    }
}

/// Something the day does at an instant, the same for every arm: start
/// Job `n`, or resize the service.
pub enum Step<'a> {
    Job(usize, &'a Wave),
    Service(f64, i32),
}

impl Step<'_> {
    pub fn at(&self) -> f64 {
        match self {
            Step::Job(_, wave) => wave.at,
            Step::Service(at, _) => *at,
        }
    }
}

/// A day of work for one arm's pool.
#[derive(Debug, Clone)]
pub struct Day {
    pub name: &'static str,
    pub seed: u64,
    /// The Jobs the bench starts.
    pub waves: Vec<Wave>,
    /// The CronJobs the cluster runs.
    pub cronjobs: Vec<Scheduled>,
    /// Pods of a whole node each, all day.
    pub steady: i32,
    /// The service's size: from the start, then each change `(at, replicas)`.
    pub service: (i32, Vec<(f64, i32)>),
    /// When the day's work is over (every Job done); its steady pods and
    /// service go then.
    pub end: f64,
}

impl Day {
    /// The Deployment pods the day's scaling creates: the steady pods, the
    /// service's first replicas and each growth of the service.
    pub fn deployment_pods(&self) -> usize {
        let (first, changes) = &self.service;
        let mut replicas = *first;
        let mut created = i64::from(self.steady) + i64::from(*first);
        for &(_, to) in changes {
            created += i64::from((to - replicas).max(0));
            replicas = to;
        }
        usize::try_from(created).unwrap_or(0)
    }

    /// Its CronJobs whose gaps are longer than `launch` seconds: holding
    /// their nodes through a gap costs more than a launch.
    pub fn long_gaps(&self, launch: f64) -> Vec<&'static str> {
        self.cronjobs
            .iter()
            .filter(|c| f64::from(c.period) * 60.0 > launch)
            .map(|c| c.name)
            .collect()
    }

    /// The day called `name` played from `seed`.
    pub fn generate(name: &str, seed: u64) -> Result<Day> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (name, waves, cronjobs) = match name {
            "compressed" => ("compressed", compressed(&mut rng), Vec::new()),
            "cron" => ("cron", cron(&mut rng), Vec::new()),
            "poisson" => ("poisson", poisson(&mut rng), Vec::new()),
            "working" => ("working", working(&mut rng), Vec::new()),
            "cronjob" => ("cronjob", Vec::new(), vec![every_five(&mut rng)]),
            "two-schedules" => ("two-schedules", Vec::new(), two_schedules(&mut rng)),
            "long-gaps" => ("long-gaps", Vec::new(), vec![every_fifteen(&mut rng)]),
            "mixed" => ("mixed", mixed_jobs(&mut rng), vec![every_four(&mut rng)]),
            other => bail!(
                "a day called {other:?}: expected compressed, cron, poisson, working, \
                 cronjob, two-schedules, long-gaps or mixed"
            ),
        };
        let runs = cronjobs.iter().flat_map(Scheduled::runs);
        let end = waves
            .iter()
            .cloned()
            .chain(runs)
            .map(|w| w.at + w.run_for)
            .fold(0.0, f64::max)
            + 30.0;
        // The service shrinks for the middle third of the day.
        let service = (6, vec![(end / 3.0, 2), (end * 2.0 / 3.0, 6)]);
        Ok(Day {
            name,
            seed,
            waves,
            cronjobs,
            steady: 2,
            service,
            end,
        })
    }

    /// The Jobs and the service's changes, in time order.
    pub fn steps(&self) -> Vec<Step<'_>> {
        let mut steps: Vec<Step<'_>> = self
            .waves
            .iter()
            .enumerate()
            .map(|(n, w)| Step::Job(n, w))
            .collect();
        steps.extend(self.service.1.iter().map(|&(at, r)| Step::Service(at, r)));
        steps.sort_by(|a, b| a.at().total_cmp(&b.at()));
        steps
    }

    /// Every Job of the day: the bench's and the CronJobs' runs.
    pub fn jobs(&self) -> impl Iterator<Item = Wave> + '_ {
        let runs = self.cronjobs.iter().flat_map(Scheduled::runs);
        self.waves.iter().cloned().chain(runs)
    }

    /// The nodes the day's work needs over time, as `(seconds, change)`
    /// steps, if no pod ever waited: every Job pod and steady pod a node of
    /// its own, and the service's pods one beside each of those, the rest
    /// three to a node.
    pub fn demand(&self) -> Vec<(f64, i64)> {
        let mut instants: Vec<f64> = vec![0.0, self.end];
        for wave in self.jobs() {
            instants.extend([wave.at, wave.at + wave.run_for]);
        }
        instants.extend(self.service.1.iter().map(|c| c.0));
        instants.sort_by(f64::total_cmp);
        instants.dedup();
        let mut steps = Vec::new();
        let mut nodes = 0i64;
        for &at in &instants {
            let now = self.nodes_needed(at);
            if now != nodes {
                steps.push((at, now - nodes));
                nodes = now;
            }
        }
        steps
    }

    /// The fewest nodes that hold the work running at `at` (half-open
    /// intervals: a pod ending at `at` has left).
    fn nodes_needed(&self, at: f64) -> i64 {
        if at >= self.end {
            return 0;
        }
        let batch: i64 = self
            .jobs()
            .filter(|w| w.at <= at && at < w.at + w.run_for)
            .map(|w| i64::from(w.pods))
            .sum();
        let whole = batch + i64::from(self.steady);
        let service = self
            .service
            .1
            .iter()
            .rev()
            .find(|c| c.0 <= at)
            .map_or(self.service.0, |c| c.1);
        let rest = (i64::from(service) - whole).max(0);
        whole + (rest + SERVICE_PER_NODE - 1) / SERVICE_PER_NODE
    }
}

/// Eight waves 30-200 s apart, 1-6 pods of 20-80 s.
fn compressed(rng: &mut fastrand::Rng) -> Vec<Wave> {
    let mut at = 30.0;
    (0..8)
        .map(|n| {
            if n > 0 {
                at += f64::from(rng.u32(30..=200));
            }
            Wave {
                at,
                pods: rng.i32(1..=6),
                run_for: f64::from(rng.u32(20..=80)),
            }
        })
        .collect()
}

/// A Job of three pods every 5 minutes (±10 s), each running 60-100 s: the
/// idle gaps fall between the 2m and 5m knobs (karpenter-provider-aws #3059).
fn cron(rng: &mut fastrand::Rng) -> Vec<Wave> {
    (0..8)
        .map(|n| Wave {
            at: 60.0 + f64::from(n) * 300.0 + f64::from(rng.i32(-10..=10)),
            pods: 3,
            run_for: f64::from(rng.u32(60..=100)),
        })
        .collect()
}

/// One CronJob every 5 minutes for 40 minutes, three pods of 60-100 s (the
/// same each run): the cron day as the cluster runs it.
fn every_five(rng: &mut fastrand::Rng) -> Scheduled {
    Scheduled {
        name: "every-5m",
        first: 1,
        period: 5,
        until: 40,
        pods: 3,
        run_for: f64::from(rng.u32(60..=100)),
    }
}

/// Two CronJobs in one pool: one every 3 minutes, a pod of 40-80 s (its
/// gaps, under 2.5 minutes, are worth holding at 5 node-minutes a launch),
/// and one every 15 minutes, three pods of 60-120 s (its gaps are not).
fn two_schedules(rng: &mut fastrand::Rng) -> Vec<Scheduled> {
    vec![
        Scheduled {
            name: "every-3m",
            first: 1,
            period: 3,
            until: 45,
            pods: 1,
            run_for: f64::from(rng.u32(40..=80)),
        },
        Scheduled {
            name: "every-15m",
            first: 2,
            period: 15,
            until: 45,
            pods: 3,
            run_for: f64::from(rng.u32(60..=120)),
        },
    ]
}

/// One CronJob every 15 minutes, three pods of 60-120 s: its gaps are
/// longer than the break-even time at 5 node-minutes a launch, so its nodes
/// go between runs and each run waits for a launch, unless it is warmed.
fn every_fifteen(rng: &mut fastrand::Rng) -> Scheduled {
    Scheduled {
        name: "every-15m",
        first: 1,
        period: 15,
        until: 46,
        pods: 3,
        run_for: f64::from(rng.u32(60..=120)),
    }
}

/// A CronJob every 4 minutes, two pods of 50-90 s, beside the mixed day's
/// random Jobs and the service.
fn every_four(rng: &mut fastrand::Rng) -> Scheduled {
    Scheduled {
        name: "every-4m",
        first: 1,
        period: 4,
        until: 40,
        pods: 2,
        run_for: f64::from(rng.u32(50..=90)),
    }
}

/// The mixed day's unscheduled Jobs: random arrivals, one every 5 minutes on
/// average for 40 minutes, 1-3 pods of 30-120 s.
fn mixed_jobs(rng: &mut fastrand::Rng) -> Vec<Wave> {
    let mut waves = Vec::new();
    let mut at = 60.0;
    loop {
        at += -300.0 * (1.0 - rng.f64()).ln();
        if at >= 2400.0 {
            return waves;
        }
        waves.push(Wave {
            at: at.round(),
            pods: rng.i32(1..=3),
            run_for: f64::from(rng.u32(30..=120)),
        });
    }
}

/// Random arrivals: 20 busy minutes (one every 100 s on average), then 20
/// quiet ones (one every 7 minutes); 1-4 pods of 30-150 s.
fn poisson(rng: &mut fastrand::Rng) -> Vec<Wave> {
    let mut waves = Vec::new();
    let mut at = 30.0;
    for (until, mean) in [(1230.0, 100.0), (2430.0, 420.0)] {
        loop {
            at += -mean * (1.0 - rng.f64()).ln();
            if at >= until {
                at = until;
                break;
            }
            waves.push(Wave {
                at: at.round(),
                pods: rng.i32(1..=4),
                run_for: f64::from(rng.u32(30..=150)),
            });
        }
    }
    waves
}

/// Two busy stretches of six waves 1-5 minutes apart around a quiet 15-20
/// minutes; 1-6 pods of 1-3 minutes.
fn working(rng: &mut fastrand::Rng) -> Vec<Wave> {
    let mut at = 30.0;
    (0..12)
        .map(|n| {
            at += match n {
                0 => 0.0,
                6 => f64::from(rng.u32(900..=1200)),
                _ => f64::from(rng.u32(60..=300)),
            };
            Wave {
                at,
                pods: rng.i32(1..=6),
                run_for: f64::from(rng.u32(60..=180)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_day_is_the_same_for_the_same_seed_and_ends_after_its_last_job() {
        for name in [
            "compressed",
            "cron",
            "poisson",
            "working",
            "cronjob",
            "two-schedules",
            "mixed",
        ] {
            let (a, b) = (
                Day::generate(name, 3).unwrap(),
                Day::generate(name, 3).unwrap(),
            );
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{name}");
            assert!(a.jobs().next().is_some(), "{name}");
            assert!(a.jobs().all(|w| w.at + w.run_for < a.end), "{name}");
            assert!(a.end < 3600.0, "{name}: a day is shorter than an hour");
        }
        assert!(Day::generate("monday", 1).is_err());
    }

    #[test]
    fn cron_idle_gaps_fall_between_the_two_and_five_minute_knobs() {
        let day = Day::generate("cron", 9).unwrap();
        for pair in day.waves.windows(2) {
            let idle = pair[1].at - (pair[0].at + pair[0].run_for);
            assert!((120.0..300.0).contains(&idle), "{idle}");
        }
    }

    #[test]
    fn the_demand_counts_whole_nodes_and_packs_the_service_beside_them() {
        let day = Day {
            name: "test",
            seed: 0,
            cronjobs: Vec::new(),
            waves: vec![Wave {
                at: 10.0,
                pods: 3,
                run_for: 20.0,
            }],
            steady: 2,
            service: (6, vec![(50.0, 2)]),
            end: 100.0,
        };
        // Before the Job: 2 steady nodes, 2 service pods beside them, 4
        // more in 2 nodes. During it: 5 whole nodes hold 5 service pods,
        // the sixth needs one more. After the service shrinks: 2 nodes.
        assert_eq!(
            day.demand(),
            vec![(0.0, 4), (10.0, 2), (30.0, -2), (50.0, -2), (100.0, -2)]
        );
        // 2 steady and 6 service pods; the shrink creates none.
        assert_eq!(day.deployment_pods(), 8);
        // Every generated day: 2 steady, 6 service, 4 more when it grows back.
        assert_eq!(Day::generate("mixed", 1).unwrap().deployment_pods(), 12);
    }

    #[test]
    fn a_cronjobs_runs_are_its_schedules_minutes_from_the_days_start() {
        let day = Day::generate("two-schedules", 1).unwrap();
        let rare = &day.cronjobs[1];
        let starts: Vec<f64> = rare.runs().map(|w| w.at).collect();
        assert_eq!(starts, [120.0, 1020.0, 1920.0]);
        // A day starting at minute 50: its runs at minutes 52, 7 and 22.
        assert_eq!(rare.schedule(50), "7,22,52 * * * *");
        // The short period's idle gaps are worth holding at 5 node-minutes
        // a launch, the long one's are not.
        let often = &day.cronjobs[0];
        assert!(f64::from(often.period) * 60.0 - often.run_for < 300.0);
        assert!(f64::from(rare.period) * 60.0 - rare.run_for > 300.0);
    }
}
