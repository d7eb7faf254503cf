//! A process's VmRSS sampled by a task at a fixed period, for the peak of a
//! phase.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::process::ProcMemory;

/// VmRSS of a process every period, until dropped (or the process is gone).
pub struct RssSampler {
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    pub fn start(pid: u32, period: Duration) -> RssSampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let writer = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Ok(memory) = ProcMemory::read(pid) else {
                    return;
                };
                let mut samples = writer.lock().unwrap_or_else(PoisonError::into_inner);
                samples.push((Instant::now(), memory.rss_kb));
            }
        });
        RssSampler { samples, task }
    }

    /// The largest sample (KiB) taken from `from` to `to`; 0 if none.
    pub fn max_between(&self, from: Instant, to: Instant) -> u64 {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, kb)| *kb)
            .max()
            .unwrap_or(0)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}
