//! `cargo xtask`: Keel's project tasks (CI gate, benchmarks, Python A2A SDK venv).

mod ci;
mod py_sdk;
mod redis;
mod util;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci               fmt, clippy, tests (with Redis and the Python A2A SDK), per-crate default-feature checks
  bench [args...]  cargo bench --workspace [args...] (figures are printed, never asserted)
  py-sdk           create/refresh the cached Python A2A SDK venv and print its python path
  help             print this message";

/// Parses the subcommand and dispatches; every task returns its exit code.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") if args.len() == 1 => ci::run(),
        Some("bench") => bench(&args[1..]),
        Some("py-sdk") if args.len() == 1 => match py_sdk::ensure() {
            Ok(python) => {
                println!("{}", python.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask py-sdk: {e}");
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

/// `cargo xtask bench [args...]`: a thin wrapper over `cargo bench --workspace`.
fn bench(extra: &[String]) -> ExitCode {
    println!("note: benchmark figures are printed for humans, never asserted");
    let mut cmd = util::cargo(&[]);
    cmd.args(["bench", "--workspace"]).args(extra);
    match util::status(&mut cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask bench: {e}");
            ExitCode::FAILURE
        }
    }
}
