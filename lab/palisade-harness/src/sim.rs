//! `palisade sim`: many seeds of the deterministic simulator (`palisade-sim`),
//! in parallel, with a progress bar and a summary; for a failing seed, its
//! shortest failing prefix, its history (JSON) and its timeline (SVG).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use palisade_sim::{FaultSet, OutcomeLine, Planted, RecipeBugs, SimConfig};

use crate::exit;

/// The simulated time since the start of the running simulation, if this
/// thread is inside one (log lines of a simulation are stamped with it, so a
/// replay's lines match the original's).
pub fn simulated_time() -> Option<Duration> {
    palisade_sim::simulated_time()
}

/// A bug to plant on purpose (`--plant`), to watch the simulator catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlantArg {
    /// The log acknowledges an append before its fdatasync.
    AckBeforeSync,
    /// A new leader expires every session at once instead of restarting its
    /// countdown at the full TTL.
    NoLeaseRestart,
    /// A semaphore admits one permit more than it has.
    ExtraPermit,
    /// A read/write lock lets a writer in while readers hold.
    WriterBesideReaders,
    /// An election seats a second leader beside the first.
    SecondLeader,
}

/// `palisade sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// How many seeds to run, counting up from --seed.
    #[arg(long, default_value_t = 100)]
    pub seeds: u64,
    /// The first seed; with `--seeds 1`, replays exactly that seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Cluster size: 3 or 5.
    #[arg(long, default_value_t = 3, value_parser = nodes_arg)]
    pub nodes: usize,
    /// Faults to inject, comma-separated: crash, torn, blackout, partition,
    /// oneway, delay, loss, dup, reorder, pause, cut, skew; or all, none
    /// (docs/simulation.md says what each does).
    #[arg(long, default_value = "all", value_parser = FaultSet::parse)]
    pub faults: FaultSet,
    /// Client hosts per run.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Simulated time during which faults are injected.
    #[arg(long, default_value = "20s", value_parser = crate::duration_arg)]
    pub fault_window: Duration,
    /// Simulated time after every fault healed, in which every acquire must be
    /// answered.
    #[arg(long, default_value = "10s", value_parser = crate::duration_arg)]
    pub quiet: Duration,
    /// Processes running seeds at once (default: one per CPU). A simulation
    /// is deterministic one at a time per process, so each job is a process.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Where a failing seed's history and timeline are written.
    #[arg(long, default_value = "sim-failures")]
    pub out: PathBuf,
    /// Write the history of every run (JSON) into --out, passing or not.
    #[arg(long)]
    pub keep_histories: bool,
    /// Plant a bug on purpose (repeatable), to watch the simulator catch it.
    #[arg(long, value_enum)]
    pub plant: Vec<PlantArg>,
    /// Internal: run as job N of --jobs, one JSON line per seed on stdout.
    #[arg(long, hide = true)]
    pub worker: Option<usize>,
}

fn nodes_arg(s: &str) -> Result<usize, String> {
    match s {
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err("a simulated cluster has 3 or 5 nodes".into()),
    }
}

impl SimArgs {
    fn config(&self, seed: u64) -> SimConfig {
        let mut config = SimConfig::new(seed);
        config.nodes = self.nodes;
        config.clients = self.clients;
        config.faults = self.faults;
        config.fault_window = self.fault_window;
        config.quiet = self.quiet;
        config.planted = Planted {
            ack_before_sync: self.plant.contains(&PlantArg::AckBeforeSync),
            no_lease_restart: self.plant.contains(&PlantArg::NoLeaseRestart),
            recipes: RecipeBugs {
                extra_permit: self.plant.contains(&PlantArg::ExtraPermit),
                writer_beside_readers: self.plant.contains(&PlantArg::WriterBesideReaders),
                second_leader: self.plant.contains(&PlantArg::SecondLeader),
            },
        };
        config
    }

    /// The `--plant` flags, as typed.
    fn plant_flags(&self) -> Vec<String> {
        self.plant
            .iter()
            .filter_map(clap::ValueEnum::to_possible_value)
            .flat_map(|v| ["--plant".to_owned(), v.get_name().to_owned()])
            .collect()
    }

    /// The arguments that make a worker process run this invocation's seeds.
    fn worker_args(&self, job: usize, jobs: usize) -> Vec<String> {
        let mut args = vec![
            "sim".to_owned(),
            "--seeds".into(),
            self.seeds.to_string(),
            "--seed".into(),
            self.seed.to_string(),
            "--nodes".into(),
            self.nodes.to_string(),
            "--faults".into(),
            self.faults.to_string(),
            "--clients".into(),
            self.clients.to_string(),
            "--fault-window".into(),
            format!("{}ms", self.fault_window.as_millis()),
            "--quiet".into(),
            format!("{}ms", self.quiet.as_millis()),
            "--out".into(),
            self.out.display().to_string(),
            "--jobs".into(),
            jobs.to_string(),
            "--worker".into(),
            job.to_string(),
        ];
        if self.keep_histories {
            args.push("--keep-histories".into());
        }
        args.extend(self.plant_flags());
        args
    }
}

/// The totals of a `palisade sim` invocation.
#[derive(Debug, Default)]
pub struct Totals {
    /// Seeds run.
    pub seeds: u64,
    /// Seeds that broke an invariant or did not complete, with what went wrong.
    pub failed: Vec<(u64, String)>,
    /// Simulated time, summed over the runs.
    pub simulated: Duration,
    /// Faults injected, summed.
    pub faults: usize,
    /// Grants checked, summed.
    pub grants: usize,
}

/// Runs `palisade sim`; exit status 0 when every seed passed, 1 otherwise.
///
/// # Errors
/// When the output directory cannot be written or a worker process fails.
pub async fn run(args: SimArgs) -> anyhow::Result<i32> {
    // Each run builds tokio runtimes of its own (one per simulated host): off
    // this runtime's threads.
    tokio::task::spawn_blocking(move || match args.worker {
        Some(job) => run_worker(&args, job),
        None => run_all(&args),
    })
    .await
    .context("the simulation thread")?
}

/// The seeds of job `job` of `jobs`.
fn seeds_of(args: &SimArgs, job: usize, jobs: usize) -> impl Iterator<Item = u64> + use<> {
    let (first, count) = (args.seed, args.seeds);
    (job as u64..count)
        .step_by(jobs.max(1))
        .map(move |i| first + i)
}

/// One simulation, its history kept if asked.
fn run_seed(args: &SimArgs, seed: u64) -> anyhow::Result<OutcomeLine> {
    let outcome = palisade_sim::run(&args.config(seed));
    if args.keep_histories {
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        let path = args.out.join(format!("seed-{seed}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&outcome.history)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(outcome.line())
}

fn run_worker(args: &SimArgs, job: usize) -> anyhow::Result<i32> {
    use std::io::Write;
    let jobs = args.jobs.unwrap_or(1);
    let mut out = std::io::stdout().lock();
    for seed in seeds_of(args, job, jobs) {
        let line = run_seed(args, seed)?;
        writeln!(out, "{}", serde_json::to_string(&line)?)?;
        out.flush()?;
    }
    Ok(0)
}

fn run_all(args: &SimArgs) -> anyhow::Result<i32> {
    let started = Instant::now();
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, args.seeds.max(1) as usize);
    let bar = ProgressBar::new(args.seeds);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} seeds · {elapsed} · {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let lines: Mutex<Vec<OutcomeLine>> = Mutex::new(Vec::new());
    let record = |line: OutcomeLine| {
        if !line.passed() {
            bar.println(format!("seed {} FAILED: {}", line.seed, line.failure()));
        }
        bar.inc(1);
        let mut all = lines.lock().expect("poisoned");
        all.push(line);
        let failed = all.iter().filter(|l| !l.passed()).count();
        bar.set_message(format!("{failed} failed"));
    };
    if jobs == 1 {
        for seed in seeds_of(args, 0, 1) {
            record(run_seed(args, seed)?);
        }
    } else {
        let exe = std::env::current_exe().context("finding the palisade binary")?;
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..jobs)
                .map(|job| {
                    let (exe, record) = (&exe, &record);
                    scope.spawn(move || -> anyhow::Result<()> {
                        let mut child = std::process::Command::new(exe)
                            .args(args.worker_args(job, jobs))
                            .stdout(std::process::Stdio::piped())
                            .spawn()
                            .context("starting a simulation worker")?;
                        let stdout = child.stdout.take().context("the worker's stdout")?;
                        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                            record(serde_json::from_str(&line?).context("a worker's line")?);
                        }
                        let status = child.wait()?;
                        anyhow::ensure!(status.success(), "simulation worker {job}: {status}");
                        Ok(())
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")))
                })
                .collect()
        });
        for r in results {
            r?;
        }
    }
    bar.finish_and_clear();
    let mut lines = lines.into_inner().expect("poisoned");
    lines.sort_by_key(|l| l.seed);
    anyhow::ensure!(
        lines.len() as u64 == args.seeds,
        "{} of {} seeds reported",
        lines.len(),
        args.seeds
    );
    let mut totals = Totals {
        seeds: args.seeds,
        ..Totals::default()
    };
    for l in &lines {
        totals.simulated += Duration::from_millis(l.simulated_ms);
        totals.faults += l.faults;
        totals.grants += l.grants;
        if !l.passed() {
            totals.failed.push((l.seed, l.failure()));
        }
    }
    print!("{}", summary_table(args, &totals, started.elapsed()));
    if let Some((seed, _)) = totals.failed.first() {
        report_failure(args, *seed)?;
        return Ok(exit::FAILURE);
    }
    Ok(0)
}

/// The summary printed after every invocation.
fn summary_table(args: &SimArgs, t: &Totals, took: Duration) -> String {
    let rows = [
        ("seeds", format!("{} (from {})", t.seeds, args.seed)),
        ("nodes", args.nodes.to_string()),
        ("clients per run", args.clients.to_string()),
        ("faults", args.faults.to_string()),
        (
            "planted bugs",
            if args.plant.is_empty() {
                "none".into()
            } else {
                format!("{:?}", args.plant)
            },
        ),
        (
            "simulated time",
            format!("{:.0} s", t.simulated.as_secs_f64()),
        ),
        ("faults injected", t.faults.to_string()),
        ("grants checked", t.grants.to_string()),
        ("real time", format!("{:.1} s", took.as_secs_f64())),
        (
            "failed seeds",
            if t.failed.is_empty() {
                "none".into()
            } else {
                t.failed
                    .iter()
                    .map(|(seed, _)| seed.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
    ];
    let mut text = String::new();
    for (name, value) in rows {
        text.push_str(&format!("{name:<16} {value}\n"));
    }
    text
}

/// For the first failing seed: cut it down to the fewest faults that still
/// fail (the same seed replays the same history up to the first fault left
/// out), then write that run's history and timeline and say how to replay it.
fn report_failure(args: &SimArgs, seed: u64) -> anyhow::Result<()> {
    let full = palisade_sim::run(&args.config(seed));
    let mut shortest = full.clone();
    let mut low = 0;
    let mut high = full.faults;
    // The smallest number of faults that still fails, by bisection (failure
    // is not monotonic in the number of faults, so this is the shortest
    // prefix found, not always the shortest that exists).
    while low < high {
        let mid = (low + high) / 2;
        let mut config = args.config(seed);
        config.max_faults = Some(mid);
        let run = palisade_sim::run(&config);
        if run.passed() {
            low = mid + 1;
        } else {
            high = mid;
            shortest = run;
        }
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json = args.out.join(format!("seed-{seed}.json"));
    let svg = args.out.join(format!("seed-{seed}.svg"));
    std::fs::write(&json, serde_json::to_vec_pretty(&shortest.history)?)
        .with_context(|| format!("writing {}", json.display()))?;
    std::fs::write(&svg, palisade_chaos::timeline_svg(&shortest.history))
        .with_context(|| format!("writing {}", svg.display()))?;
    println!(
        "\nseed {seed} failed: {}\nshortest failing prefix: {} of {} faults, {:.1} s simulated",
        full.line().failure(),
        shortest.faults,
        full.faults,
        shortest.simulated.as_secs_f64()
    );
    for v in &shortest.verdict.violations {
        println!("  - {v}");
    }
    println!(
        "history: {}\ntimeline: {}\nreplay: palisade sim --seeds 1 --seed {seed} --nodes {} --faults {} \
         --clients {} --fault-window {}ms --quiet {}ms{}",
        json.display(),
        svg.display(),
        args.nodes,
        args.faults,
        args.clients,
        args.fault_window.as_millis(),
        args.quiet.as_millis(),
        args.plant_flags()
            .iter()
            .map(|f| format!(" {f}"))
            .collect::<String>()
    );
    Ok(())
}
