//! The machine a bench runs on: its cores, CPU model and load.

/// The machine the bench runs on.
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub loadavg: String,
}

impl Machine {
    pub fn read() -> Machine {
        use procfs::Current as _;
        let cpus = procfs::CpuInfo::current().ok();
        Machine {
            cores: cpus.as_ref().map_or(0, procfs::CpuInfo::num_cores),
            cpu_model: cpus
                .as_ref()
                .and_then(|c| c.model_name(0))
                .unwrap_or("unknown CPU")
                .to_string(),
            loadavg: procfs::LoadAverage::current()
                .map(|l| format!("{:.2} {:.2} {:.2}", l.one, l.five, l.fifteen))
                .unwrap_or_default(),
        }
    }
}
