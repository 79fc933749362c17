//! `palisade chaos`: the fault drills of the essay and the Redlock page, on real
//! processes — five `redis-server`s (each under Palisade's clock-shift preload), a
//! three-node Palisade cluster, a three-server ZooKeeper ensemble, a three-member
//! etcd cluster, a PostgreSQL server, the fenced object store, and one process
//! per client, with a fault proxy on every client-server link. Workers take
//! correctness locks only through the backend registry and the `FencedLocks`
//! trait, and the harness starts, kills, pauses and restarts servers only
//! through the testkit's `Servers`: a backend in the registry with a testkit
//! launcher drills like the others.
//!
//! Every trial records a history (client events on `CLOCK_MONOTONIC`, the store's
//! own journal of the writes it decided on, the faults injected), which
//! `palisade_chaos::check` judges. The report counts what went wrong per
//! scenario × backend × fencing.

mod env;
mod scenarios;
pub mod worker;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use palisade_chaos::{History, Summary, check, timeline_svg};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::FencingArg;
use env::{Env, Trial};
use scenarios::{Knobs, SCENARIOS, Scenario};
use worker::Backend;

/// `palisade chaos`.
#[derive(Args)]
pub struct ChaosArgs {
    /// Scenarios to run (default: all): holder-pause, delayed-write,
    /// redlock-clock-jump, redlock-pause-during-acquire, redis-crash-restart,
    /// redlock-replica-failover, leader-failure, mixed, leader-pause (`--list` says which
    /// backends each applies to).
    scenarios: Vec<String>,
    /// Backends to drill (default: every one the scenario applies to).
    #[arg(long, value_enum, value_delimiter = ',')]
    backend: Vec<Backend>,
    /// Whether the store checks tokens (default: both; `on` only applies to
    /// backends that issue tokens).
    #[arg(long, value_enum, value_delimiter = ',')]
    fencing: Vec<FencingArg>,
    /// Trials per scenario × variant × backend × fencing.
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Seed of the first trial (each trial uses seed + its number). Default: random.
    #[arg(long)]
    seed: Option<u64>,
    /// Write the histories (JSON), a Markdown report and SVG timelines here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// One JSON object per line per scenario × variant × backend × fencing.
    #[arg(long)]
    json: bool,
    /// How long each `mixed` trial injects faults.
    #[arg(long, default_value = "8s", value_parser = crate::duration_arg)]
    mixed_duration: Duration,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Run the Palisade cluster with TLS on every link (peers by mutual TLS,
    /// workers by client certificate), from a CA made for the run.
    #[arg(long)]
    tls: bool,
}

/// One scenario × variant × backend × fencing to run.
struct Cell {
    scenario: &'static Scenario,
    variant: &'static str,
    backend: Backend,
    fenced: bool,
}

/// What one cell produced.
struct Outcome {
    cell: Cell,
    histories: Vec<History>,
    notes: Vec<String>,
    errors: usize,
}

impl Outcome {
    /// The cell's row; named after the cell even when no trial produced a history.
    fn summary(&self) -> Summary {
        let mut s = Summary::from_histories(&self.histories);
        s.scenario = self.cell.scenario.name.to_owned();
        s.variant = self.cell.variant.to_owned();
        s.backend = self.cell.backend.name().to_owned();
        s.fencing = self.cell.fenced;
        s
    }
}

fn plan(a: &ChaosArgs) -> Result<Vec<Cell>, String> {
    for name in &a.scenarios {
        if scenarios::find(name).is_none() {
            let known: Vec<_> = SCENARIOS.iter().map(|s| s.name).collect();
            return Err(format!(
                "unknown scenario {name:?}; known: {}",
                known.join(", ")
            ));
        }
    }
    let fencings: Vec<bool> = if a.fencing.is_empty() {
        vec![true, false]
    } else {
        a.fencing.iter().map(|f| *f == FencingArg::On).collect()
    };
    let mut cells = Vec::new();
    for s in SCENARIOS {
        if !a.scenarios.is_empty() && !a.scenarios.iter().any(|n| n == s.name) {
            continue;
        }
        for &variant in s.variants {
            for backend in s.backends() {
                if !a.backend.is_empty() && !a.backend.contains(&backend) {
                    continue;
                }
                if !s.applies(variant, backend) {
                    continue;
                }
                for &fenced in &fencings {
                    // Efficiency locks have no token: there is nothing to fence with.
                    if fenced && !backend.has_tokens() {
                        continue;
                    }
                    cells.push(Cell {
                        scenario: s,
                        variant,
                        backend,
                        fenced,
                    });
                }
            }
        }
    }
    if cells.is_empty() {
        let with_tokens: Vec<_> = Backend::fenced().iter().map(|b| b.name()).collect();
        return Err(format!(
            "nothing to run: no scenario applies to the chosen backends and fencing \
             (fencing on needs a backend with tokens: {})",
            with_tokens.join(", ")
        ));
    }
    Ok(cells)
}

fn label(c: &Cell) -> String {
    format!(
        "{}{}{} · {} · fencing {}",
        c.scenario.name,
        if c.variant.is_empty() { "" } else { "/" },
        c.variant,
        c.backend.name(),
        if c.fenced { "on" } else { "off" }
    )
}

fn file_stem(c: &Cell) -> String {
    format!(
        "{}{}{}-{}-fencing-{}",
        c.scenario.name,
        if c.variant.is_empty() { "" } else { "-" },
        c.variant,
        c.backend.name(),
        if c.fenced { "on" } else { "off" }
    )
}

/// Runs the drills; the exit status is 1 when the harness itself failed.
pub async fn run(a: ChaosArgs) -> Result<i32> {
    if a.list {
        for s in SCENARIOS {
            let backends: Vec<_> = s.backends().iter().map(|b| b.name()).collect();
            let exceptions: Vec<_> = s
                .backends()
                .into_iter()
                .flat_map(|b| {
                    s.exceptions(b)
                        .into_iter()
                        .map(move |v| format!("{v} not on {}", b.name()))
                })
                .collect();
            let variants = s.variants.join(", ");
            println!(
                "{:<30} [{}]{}{}\n    {}",
                s.name,
                backends.join(", "),
                if variants.is_empty() {
                    String::new()
                } else {
                    format!(" variants: {variants}")
                },
                if exceptions.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", exceptions.join("; "))
                },
                s.about
            );
        }
        return Ok(0);
    }
    let cells = match plan(&a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("palisade chaos: {e}");
            return Ok(crate::exit::USAGE);
        }
    };
    let base_seed = a.seed.unwrap_or_else(rand::random);
    let knobs = Knobs {
        mixed_duration: a.mixed_duration,
    };
    let bar = ProgressBar::new((cells.len() * a.trials) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} trials · {elapsed} · {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut env = Env::new(a.tls)?;
    let mut outcomes = Vec::new();
    let mut trial_number = 0u64;
    for cell in cells {
        bar.set_message(label(&cell));
        let mut outcome = Outcome {
            histories: Vec::new(),
            notes: Vec::new(),
            errors: 0,
            cell,
        };
        let c = &outcome.cell;
        for i in 0..a.trials {
            let seed = base_seed.wrapping_add(trial_number);
            trial_number += 1;
            let result = run_trial(&mut env, c, seed, i, &knobs).await;
            match result {
                Ok((history, notes)) => {
                    outcome.histories.push(history);
                    outcome.notes.extend(notes);
                }
                Err(e) => {
                    outcome.errors += 1;
                    outcome
                        .notes
                        .push(format!("trial {i}: harness error: {e:#}"));
                    bar.suspend(|| eprintln!("palisade chaos: {}: {e:#}", label(c)));
                }
            }
            bar.inc(1);
        }
        let summary = outcome.summary();
        if a.json {
            bar.suspend(|| println!("{}", summary.json_line()));
        }
        outcomes.push(outcome);
    }
    bar.finish_and_clear();
    env.shutdown().await;

    let rows: Vec<Summary> = outcomes.iter().map(Outcome::summary).collect();
    if !a.json {
        println!("{}", Summary::text_table(&rows));
        println!("seed {base_seed} (rerun with --seed {base_seed})");
    }
    if let Some(dir) = &a.out {
        write_out(dir, &outcomes, &rows, base_seed, &a)?;
        if !a.json {
            println!("report, histories and timelines in {}", dir.display());
        }
    }
    let errors: usize = outcomes.iter().map(|o| o.errors).sum();
    Ok(if errors > 0 { crate::exit::FAILURE } else { 0 })
}

async fn run_trial(
    env: &mut Env,
    c: &Cell,
    seed: u64,
    number: usize,
    knobs: &Knobs,
) -> Result<(History, Vec<String>)> {
    env.ensure(c.backend, c.fenced).await?;
    let mut trial = Trial::new(
        env,
        c.scenario.name,
        c.variant,
        c.backend,
        c.fenced,
        seed,
        number,
        c.scenario.ttl,
    )?;
    let mut rng = StdRng::seed_from_u64(seed);
    scenarios::run(c.scenario.drill, env, &mut trial, &mut rng, knobs).await?;
    // Writes held in a proxy may still be on their way to the store's journal.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok((trial.history()?, trial.notes().to_vec()))
}

fn write_out(
    dir: &Path,
    outcomes: &[Outcome],
    rows: &[Summary],
    seed: u64,
    a: &ChaosArgs,
) -> Result<()> {
    let histories = dir.join("histories");
    let timelines = dir.join("timelines");
    std::fs::create_dir_all(&histories)
        .with_context(|| format!("creating {}", histories.display()))?;
    std::fs::create_dir_all(&timelines)?;
    let mut md = String::new();
    md.push_str("# Palisade fault drills\n\n");
    md.push_str(&format!(
        "Produced by `palisade chaos{}{} --trials {} --seed {seed}{}` (mixed: {} of faults per trial).\n\n",
        if a.scenarios.is_empty() { "" } else { " " },
        a.scenarios.join(" "),
        a.trials,
        if a.backend.is_empty() {
            String::new()
        } else {
            format!(
                " --backend {}",
                a.backend.iter().map(|b| b.name()).collect::<Vec<_>>().join(",")
            )
        },
        humantime(a.mixed_duration),
    ));
    md.push_str(&Summary::markdown_table(rows));
    md.push_str("\n\n## Scenarios\n\n");
    for s in SCENARIOS {
        md.push_str(&format!("- **{}**: {}\n", s.name, s.about));
    }
    md.push_str("\n## Per cell\n");
    for (o, row) in outcomes.iter().zip(rows) {
        let stem = file_stem(&o.cell);
        md.push_str(&format!("\n### {}\n\n", label(&o.cell)));
        for (i, h) in o.histories.iter().enumerate() {
            let path = histories.join(format!("{stem}-{i}.json"));
            std::fs::write(&path, serde_json::to_vec_pretty(h)?)?;
        }
        // The timeline shows the first trial that went wrong, else the first.
        if let Some((i, h)) = o
            .histories
            .iter()
            .enumerate()
            .find(|(_, h)| {
                let r = check(h);
                r.overlaps + r.stale_writes_accepted + r.lost_updates + r.non_monotonic_tokens > 0
            })
            .or_else(|| o.histories.iter().enumerate().next())
        {
            std::fs::write(timelines.join(format!("{stem}.svg")), timeline_svg(h))?;
            md.push_str(&format!(
                "![timeline of trial {i}](timelines/{stem}.svg)\n\n"
            ));
        }
        md.push_str(&format!(
            "{} trials, {} with overlapping holders, {} with a write after another client was granted the lock.\n",
            row.trials, row.trials_with_overlap, row.trials_with_stale_write
        ));
        let mut notes: Vec<(String, usize)> = Vec::new();
        for n in &o.notes {
            match notes.iter_mut().find(|(m, _)| m == n) {
                Some((_, count)) => *count += 1,
                None => notes.push((n.clone(), 1)),
            }
        }
        for (n, count) in notes {
            md.push_str(&format!("- {n} (×{count})\n"));
        }
    }
    std::fs::write(dir.join("report.md"), md)?;
    // The rows again, for machines (`palisade review --drills DIR` reads them).
    let lines: String = rows.iter().map(|r| r.json_line() + "\n").collect();
    std::fs::write(dir.join("summary.jsonl"), lines)?;
    Ok(())
}

fn humantime(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
