//! `cargo xtask fuzz [SECONDS]`: run every fuzz target of `fuzz/` (cargo-fuzz, nightly) for a
//! bounded time each. A crash fails the command and leaves its input in
//! `fuzz/artifacts/<target>/`; turn it into a regression test.

use std::path::Path;
use std::process::{Command, ExitCode};

/// The targets, in the order they run.
const TARGETS: &[&str] = &["jsonrpc", "rest"];

/// Run each target for `seconds` (default 60).
pub fn run(args: &[String]) -> ExitCode {
    let seconds = match args.first().map(|s| s.parse::<u64>()) {
        None => 60,
        Some(Ok(s)) if s > 0 => s,
        _ => {
            eprintln!("xtask fuzz: the argument is the number of seconds per target, e.g. `cargo xtask fuzz 30`");
            return ExitCode::from(2);
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fuzz_dir = root.join("fuzz");
    for target in TARGETS {
        println!("==> fuzz {target} for {seconds} s");
        // New inputs go to a scratch corpus under target/; the committed seeds stay as they are.
        let scratch = fuzz_dir.join("target").join("corpus").join(target);
        if let Err(e) = std::fs::create_dir_all(&scratch) {
            eprintln!("xtask fuzz: cannot create {}: {e}", scratch.display());
            return ExitCode::FAILURE;
        }
        let status = Command::new("cargo")
            .current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", target])
            .arg(&scratch)
            .arg(fuzz_dir.join("corpus").join(target))
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .status();
        match status {
            Ok(status) if status.success() => println!("    {target}: no crash in {seconds} s"),
            Ok(status) => {
                eprintln!("xtask fuzz: {target} failed ({status}); see fuzz/artifacts/{target}/");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("xtask fuzz: cannot run cargo fuzz ({e}); install it with `cargo install cargo-fuzz`");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
