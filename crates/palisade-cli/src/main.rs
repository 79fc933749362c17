//! `palisade`: the command-line entry point.
//!
//! Subcommands map onto the crates: `serve` runs `palisade-server`, `lock` takes a
//! lock through `palisade-backends`' registry, `redis …` drives
//! `palisade-redis`, `review` writes the design-review record ([`review`]).
//! `chaos`, `sim`, `bench` and `demo` are the test rigs of `palisade-harness`,
//! linked only with the default `lab` feature. Exit statuses are in [`exit`] and
//! the README.

mod certs_cmd;
mod child;
mod config_file;
mod dev_cluster;
mod fence_cmd;
mod redis_cmd;
mod review;
mod review_cmd;
mod server_cmd;

use std::time::Duration;

use clap::{Parser, Subcommand};
pub use palisade_backends::{self as backends, duration_arg, exit};
#[cfg(feature = "lab")]
use palisade_harness::{bench, chaos, demo};

#[derive(Parser)]
#[command(
    name = "palisade",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("PALISADE_COMMIT"), ")"),
    about = "Distributed locks with fencing tokens, and honest efficiency locks on Redis"
)]
struct Cli {
    /// How log lines on stderr look: `text` for people, `json` (one object
    /// per line: timestamp, level, message and fields) for log pipelines.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "PALISADE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// See `--log-format`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr, filtered by `PALISADE_LOG` (default: a node's role changes
/// and the events operators act on; with `quiet`, errors only).
fn init_logging(format: LogFormat, quiet: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PALISADE_LOG")
        // A node says in one line each when it leads, follows or
        // snapshots; openraft's own warnings are the expected noise of
        // an election (votes racing, a peer not up yet), its errors are not.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(if quiet {
                "error"
            } else {
                "warn,palisade_server=info,palisade_fence=info,openraft=error"
            })
        });
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(SimulatedOrWall)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().with_current_span(false).init(),
        LogFormat::Text => logs
            // Colour codes only for a person at a terminal, never into a log file.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            // Module paths help whoever turned on PALISADE_LOG; others read words.
            .with_target(std::env::var_os("PALISADE_LOG").is_some())
            .init(),
    }
}

/// Stamps log lines with the simulated clock inside `palisade sim` (so that a
/// replay's lines match the original's, line for line), the wall clock elsewhere.
struct SimulatedOrWall;

impl tracing_subscriber::fmt::time::FormatTime for SimulatedOrWall {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        #[cfg(feature = "lab")]
        if let Some(t) = palisade_harness::sim::simulated_time() {
            return write!(w, "sim+{:.6}s", t.as_secs_f64());
        }
        tracing_subscriber::fmt::time::SystemTime.format_time(w)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a Palisade node (single-node on a fresh data directory by default).
    Serve(server_cmd::ServeArgs),
    /// A local cluster in this terminal (3 nodes on 127.0.0.1:7420, 7422,
    /// 7424), for trying Palisade; Ctrl-C stops it.
    DevCluster(dev_cluster::DevClusterArgs),
    /// Run CMD holding a correctness lock; CMD gets PALISADE_FENCING_TOKEN.
    /// --permits N takes a semaphore permit, --read/--write a read/write lock.
    Lock(server_cmd::LockArgs),
    /// Run CMD while leader of an election (CMD gets the leader's
    /// PALISADE_FENCING_TOKEN), or --observe the leaders.
    Elect(server_cmd::ElectArgs),
    /// Cluster status: members, leader, term, commit index.
    Status(server_cmd::QueryArgs),
    /// All locks: name, holder, token, waiters.
    Locks(server_cmd::QueryArgs),
    /// Is TOKEN still the current holder's token for NAME? (exit 0 yes, 1 no)
    CheckToken(server_cmd::CheckTokenArgs),
    /// The fenced object store: objects written with a Fencing-Token header;
    /// stale tokens get 409.
    FenceStore(fence_cmd::FenceStoreArgs),
    /// Demonstrations on real processes.
    #[cfg(feature = "lab")]
    #[command(subcommand)]
    Demo(demo::DemoCommand),
    /// Certificates for TLS (a CA, nodes, clients) and bearer tokens.
    #[command(subcommand)]
    Certs(certs_cmd::CertsCommand),
    /// Membership changes.
    #[command(subcommand)]
    Cluster(server_cmd::ClusterCommand),
    /// Efficiency locks on Redis: single instance and Redlock (no fencing token).
    #[command(subcommand)]
    Redis(redis_cmd::RedisCommand),
    /// Write the design-review record of a lock as deployed (Markdown): what
    /// the lease is measured on, fencing, the resource, the Redis audit, the
    /// budget, the drills, and a verdict by need. Exit 1 when it falls short.
    Review(review_cmd::ReviewArgs),
    /// Benchmarks that start their own servers.
    #[cfg(feature = "lab")]
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Fault drills on real processes: pauses, partitions, delays, crashes and
    /// clock jumps against Redis, Redlock, Palisade, ZooKeeper, etcd and
    /// PostgreSQL, with and without fencing.
    #[cfg(feature = "lab")]
    Chaos(chaos::ChaosArgs),
    /// Deterministic simulation of the whole server and its clients: many
    /// seeded fault histories (crashes with torn writes, partitions, slow
    /// links, client pauses), each checked; a failing seed replays exactly.
    #[cfg(feature = "lab")]
    Sim(palisade_harness::sim::SimArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell):
    /// `palisade completions bash > /etc/bash_completion.d/palisade`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `palisade man > palisade.1`.
    Man,
    /// One client process of `palisade chaos`.
    #[cfg(feature = "lab")]
    #[command(hide = true)]
    ChaosWorker(chaos::worker::WorkerArgs),
}

/// Writes `bytes` to stdout; a reader that went away early (`| head`) is fine.
fn print_all(bytes: &[u8]) -> anyhow::Result<i32> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

/// In a build without the `lab` feature, says why `chaos`, `sim`, `bench` or
/// `demo` is missing instead of clap's bare "unrecognized subcommand".
#[cfg(not(feature = "lab"))]
fn refuse_lab_command(args: &[std::ffi::OsString]) {
    const LAB: [&str; 5] = ["chaos", "sim", "bench", "demo", "chaos-worker"];
    let mut rest = args.iter().skip(1).filter_map(|a| a.to_str());
    while let Some(arg) = rest.next() {
        if arg == "--log-format" {
            rest.next();
        } else if !arg.starts_with('-') {
            if LAB.contains(&arg) {
                eprintln!(
                    "palisade: `{arg}` is a test rig, left out of this build \
                     (--no-default-features); a build with the default features has it: \
                     cargo install --locked --path crates/palisade-cli"
                );
                std::process::exit(exit::USAGE);
            }
            return;
        }
    }
}

fn main() {
    let args = config_file::merge(
        <Cli as clap::CommandFactory>::command(),
        std::env::args_os().collect(),
    )
    .unwrap_or_else(|message| {
        eprintln!("palisade: {message}");
        std::process::exit(exit::USAGE)
    });
    #[cfg(not(feature = "lab"))]
    refuse_lab_command(&args);
    let cli = Cli::parse_from(args);
    // `palisade sim` runs thousands of simulated nodes in this process: their
    // role changes and snapshots are not news (PALISADE_LOG still shows them).
    #[cfg(feature = "lab")]
    let quiet = matches!(cli.command, Command::Sim(_));
    #[cfg(not(feature = "lab"))]
    let quiet = false;
    init_logging(cli.log_format, quiet);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Command::Serve(a) = &cli.command
        && let Some(threads) = a.worker_threads()
    {
        runtime.worker_threads(threads);
    }
    let runtime = runtime.build().expect("tokio runtime");
    let code = runtime.block_on(async {
        match cli.command {
            Command::Serve(a) => server_cmd::serve(a).await,
            Command::DevCluster(a) => dev_cluster::run(a).await,
            Command::Lock(a) => server_cmd::lock(a).await,
            Command::Elect(a) => server_cmd::elect(a).await,
            Command::Status(a) => server_cmd::status(a).await,
            Command::Locks(a) => server_cmd::locks(a).await,
            Command::CheckToken(a) => server_cmd::check_token(a).await,
            Command::Cluster(c) => server_cmd::cluster(c).await,
            Command::Certs(c) => certs_cmd::run(c),
            Command::FenceStore(a) => fence_cmd::serve(a).await,
            #[cfg(feature = "lab")]
            Command::Demo(c) => demo::run(c).await,
            Command::Redis(c) => redis_cmd::run(c).await,
            Command::Review(a) => review_cmd::run(a).await,
            #[cfg(feature = "lab")]
            Command::Bench(c) => bench::run(c).await,
            #[cfg(feature = "lab")]
            Command::Chaos(a) => chaos::run(a).await,
            #[cfg(feature = "lab")]
            Command::Sim(a) => palisade_harness::sim::run(a).await,
            #[cfg(feature = "lab")]
            Command::ChaosWorker(a) => chaos::worker::run(a).await,
            Command::Completions { shell } => {
                let mut text = Vec::new();
                let mut cli = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut cli, "palisade", &mut text);
                print_all(&text)
            }
            Command::Man => {
                let mut text = Vec::new();
                clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
                    .render(&mut text)?;
                print_all(&text)
            }
        }
    });
    let code = code.unwrap_or_else(|e| {
        eprintln!("palisade: error: {e:#}");
        exit::FAILURE
    });
    // Dropping the runtime would wait for background releases; they are best effort.
    runtime.shutdown_timeout(Duration::from_secs(1));
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command, config_file};

    #[test]
    fn the_documented_config_file_is_read_and_flags_win_over_it() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/serve.toml");
        let args = ["palisade", "serve", "--config", path, "--id", "2"].map(Into::into);
        let merged = config_file::merge(Cli::command(), args.to_vec()).expect("docs/serve.toml");
        let Command::Serve(serve) = Cli::try_parse_from(merged).expect("parses").command else {
            panic!("not serve");
        };
        assert_eq!(serve.id(), 2, "the flag wins");
        assert_eq!(
            serve.listen().to_string(),
            "10.0.0.1:7420",
            "the file's value"
        );
    }
}
