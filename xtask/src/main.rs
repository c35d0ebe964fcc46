//! `cargo xtask`: Keel's project tasks (CI gate, benchmarks, Python A2A SDK venv).

mod a2a;
mod browser;
mod ci;
mod fuzz;
mod instructions;
mod layers;
mod mcp;
mod postgres;
mod py_sdk;
mod redis;
mod tidy;
mod util;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci               fmt, clippy, tests (with Redis and the Python A2A SDK), per-crate default-feature checks
  bench [args...]  every benchmark: cargo bench --workspace [args...]
  bench stores     the store backends: persisted steps/s beside raw SQLite/Redis ceilings
  bench engine     the thread engine: overhead per step, persisted steps/s per backend, and
                   instructions per step under callgrind (when valgrind is installed;
                   KEEL_BENCH_CALLGRIND=0 skips it)
  bench a2a        the A2A server side by side: the release `keel serve` (memory, SQLite, Redis), a bare
                   axum handler and the official Rust A2A SDK's server, each in its own process on
                   CPU 0, loaded by wrk on CPU 1; req/s, p50, p99, RSS over sends, cold start
                   (KEEL_BENCH_SECS, KEEL_BENCH_RUNS, KEEL_BENCH_BACKENDS, KEEL_BENCH_SCENARIOS,
                   KEEL_BENCH_SENDS, REDIS_URL; installs wrk with apt-get when missing)
  bench bytes      stored bytes per one-message echo turn on SQLite, early and late on one thread
  bench soak       50 clients for 60 s against the release `keel serve`: error rate, p50/p99 per
                   operation, RSS at start and end (KEEL_SOAK_CLIENTS, KEEL_SOAK_SECS,
                   KEEL_SOAK_STORE of memory|sqlite|redis, REDIS_URL); not part of CI
  layers           check that each crate depends only on lower layers (docs/architecture.md)
  tidy             check architecture invariants in the source (keel-transport names no store)
  fuzz [SECONDS]   run each fuzz target of fuzz/ for SECONDS (default 60; needs nightly and cargo-fuzz)
  py-sdk           create/refresh the cached Python A2A SDK venvs (1.x, 0.3.x) and print
                   KEEL_PYTHON=... and KEEL_PYTHON_V03=... lines
  mcp              install the MCP test servers (npm's server-everything, a FastMCP venv) under
                   target/ and print KEEL_MCP_EVERYTHING=... and KEEL_MCP_PYTHON=... lines
  help             print this message";

/// Parses the subcommand and dispatches; every task returns its exit code.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") if args.len() == 1 => ci::run(),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("layers") if args.len() == 1 => match layers::check() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("xtask layers: {e}");
                ExitCode::FAILURE
            }
        },
        Some("tidy") if args.len() == 1 => match tidy::check() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("xtask tidy: {e}");
                ExitCode::FAILURE
            }
        },
        Some("py-sdk") if args.len() == 1 => {
            for venv in [py_sdk::V1, py_sdk::V03] {
                match venv.ensure() {
                    Ok(python) => println!("{}={}", venv.env_var, python.display()),
                    Err(e) => {
                        eprintln!("xtask py-sdk: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Some("mcp") if args.len() == 1 => match mcp::ensure_all() {
            Ok(found) => {
                for (var, path) in found {
                    println!("{var}={}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask mcp: {e}");
                ExitCode::FAILURE
            }
        },
        Some("help" | "-h" | "--help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The named benchmarks: `cargo xtask bench <name>` runs one bench target of one package.
const BENCHES: &[NamedBench] = &[
    NamedBench {
        name: "stores",
        package: "store-bench",
        target: "stores",
    },
    NamedBench {
        name: "engine",
        package: "store-bench",
        target: "engine",
    },
    NamedBench {
        name: "a2a",
        package: "store-bench",
        target: "a2a",
    },
    NamedBench {
        name: "bytes",
        package: "store-bench",
        target: "bytes",
    },
    NamedBench {
        name: "soak",
        package: "store-bench",
        target: "soak",
    },
];

/// A bench target `cargo xtask bench` knows by name.
struct NamedBench {
    name: &'static str,
    package: &'static str,
    target: &'static str,
}

/// `cargo xtask bench <name> [args...]` runs the named bench (args go to the bench binary);
/// `cargo xtask bench [args...]` runs every bench: `cargo bench --workspace [args...]`.
/// Either way a Redis is found or started for the benches that use one, as for CI.
fn bench(args: &[String]) -> ExitCode {
    println!("note: benchmark figures are printed for humans, never asserted");
    let named = args
        .first()
        .and_then(|first| BENCHES.iter().find(|b| b.name == first.as_str()));
    let redis = redis::ensure();
    let mut env: Vec<(&str, std::ffi::OsString)> = redis
        .as_ref()
        .map(|r| ("REDIS_URL", r.url.clone().into()))
        .into_iter()
        .collect();
    // The stores bench measures PostgreSQL too when one answers or can be started.
    let postgres = postgres::ensure()
        .inspect_err(|e| println!("WARNING: {e}; no PostgreSQL rows"))
        .ok();
    env.extend(
        postgres
            .as_ref()
            .map(|p| (postgres::URL_VAR, p.url.clone().into())),
    );
    // The A2A bench runs binaries (servers, wrk) rather than linking what it measures.
    let prepare = match named.map(|b| b.name) {
        Some("a2a") => Some(a2a::prepare as fn() -> Result<_, String>),
        Some("soak") => Some(a2a::prepare_keel as fn() -> Result<_, String>),
        _ => None,
    };
    if let Some(prepare) = prepare {
        match prepare() {
            Ok(extra) => env.extend(extra),
            Err(e) => {
                eprintln!("xtask bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut cmd = util::cargo(&env);
    match named {
        Some(bench) => {
            cmd.args(["bench", "-p", bench.package, "--bench", bench.target]);
            if args.len() > 1 {
                cmd.arg("--").args(&args[1..]);
            }
        }
        None => {
            cmd.args(["bench", "--workspace"]).args(args);
        }
    }
    let mut outcome = util::status(&mut cmd);
    if outcome.is_ok() && named.is_some_and(|b| b.name == "engine") {
        outcome = instructions::engine_per_step();
    }
    drop(redis);
    drop(postgres);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask bench: {e}");
            ExitCode::FAILURE
        }
    }
}
