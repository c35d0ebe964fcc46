//! `cargo xtask ci`: the whole gate, step by step, stopping at the first failure.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use crate::util::{status, workspace_root};

/// A cargo command of the gate. CI builds from a cold `target/` once, so incremental
/// compilation only costs time and disk: its caches are written and never read again (a run
/// on a machine with little disk left stopped with "No space left on device").
fn cargo(extra_env: &[(&str, OsString)]) -> Command {
    let mut cmd = crate::util::cargo(extra_env);
    cmd.env("CARGO_INCREMENTAL", "0");
    cmd
}

/// How a step ended, for the summary.
enum Outcome {
    Passed,
    Skipped(String),
    Failed(String),
}

/// Runs steps with a header and timing each, and remembers them for the summary.
struct Runner {
    started: Instant,
    done: Vec<(String, Outcome, f64)>,
}

impl Runner {
    /// Runs one step; `Ok(Some(note))` from the body means the step was skipped.
    fn step(
        &mut self,
        name: &str,
        body: impl FnOnce() -> Result<Option<String>, String>,
    ) -> Result<(), String> {
        println!("\n==> {name}");
        let t = Instant::now();
        let result = body();
        let secs = t.elapsed().as_secs_f64();
        let (outcome, ret) = match result {
            Ok(None) => (Outcome::Passed, Ok(())),
            Ok(Some(note)) => {
                println!("    skipped: {note}");
                (Outcome::Skipped(note), Ok(()))
            }
            Err(e) => (
                Outcome::Failed(e.clone()),
                Err(format!("step `{name}` failed: {e}")),
            ),
        };
        println!("    ({secs:.1} s) {name}");
        self.done.push((name.to_owned(), outcome, secs));
        ret
    }

    /// Prints one line per step and the total time.
    fn summary(&self) {
        println!("\n==> summary");
        for (name, outcome, secs) in &self.done {
            let (label, note) = match outcome {
                Outcome::Passed => ("ok     ", String::new()),
                Outcome::Skipped(note) => ("skipped", format!(" ({note})")),
                Outcome::Failed(e) => ("FAILED ", format!(": {e}")),
            };
            println!("    {label} {secs:7.1} s  {name}{note}");
        }
        println!("    total {:.1} s", self.started.elapsed().as_secs_f64());
    }
}

/// Entry point of `cargo xtask ci`.
pub fn run() -> ExitCode {
    let mut runner = Runner {
        started: Instant::now(),
        done: Vec::new(),
    };
    // `redis` and `postgres` live until the end of this function, so a server we started is
    // killed on success and on failure alike.
    let mut redis = None;
    let mut postgres = None;
    let result = steps(&mut runner, &mut redis, &mut postgres);
    drop(redis);
    drop(postgres);
    runner.summary();
    match result {
        Ok(()) => {
            println!("\nci: all steps passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nci: FAILED — {e}");
            ExitCode::FAILURE
        }
    }
}

/// The steps, in order.
fn steps(
    r: &mut Runner,
    redis: &mut Option<crate::redis::Redis>,
    postgres: &mut Option<crate::postgres::Postgres>,
) -> Result<(), String> {
    r.step("cargo fmt --check", || {
        exec(cargo(&[]).args(["fmt", "--all", "--", "--check"]))
    })?;
    r.step(
        "cargo clippy (workspace, all targets, all features)",
        || {
            exec(
                cargo(&[])
                    .args(["clippy", "--workspace", "--all-targets", "--all-features"])
                    .args(["--", "-D", "warnings"]),
            )
        },
    )?;

    let mut test_env: Vec<(&str, OsString)> = Vec::new();
    for (venv, what) in [
        (crate::py_sdk::V1, "python A2A SDK 1.x venv"),
        (crate::py_sdk::V03, "python A2A SDK 0.3.x venv"),
    ] {
        r.step(what, || match venv.ensure() {
            Ok(python) => {
                println!("    {}={}", venv.env_var, python.display());
                test_env.push((venv.env_var, python.into_os_string()));
                Ok(None)
            }
            Err(e) => {
                println!(
                    "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
                );
                println!("WARNING: could not create the {what}: {e}");
                println!(
                    "WARNING: {} is NOT set; the Python interop tests that need it fail or skip.",
                    venv.env_var
                );
                println!(
                    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
                );
                Ok(Some("venv unavailable (see warning above)".to_owned()))
            }
        })?;
    }
    r.step("MCP test servers", || crate::mcp::ci_step(&mut test_env))?;
    // The console's browser test fails, saying so, without these: install them here.
    r.step(
        "chromium and playwright-core (console browser test)",
        || {
            let chromium = crate::browser::ensure_chromium()?;
            crate::browser::ensure_node_modules()?;
            println!(
                "    {}={}",
                crate::browser::CHROMIUM_ENV,
                chromium.display()
            );
            test_env.push((crate::browser::CHROMIUM_ENV, chromium.into_os_string()));
            Ok(None)
        },
    )?;
    r.step("redis", || {
        *redis = crate::redis::ensure();
        match redis {
            Some(found) => {
                test_env.push(("REDIS_URL", found.url.clone().into()));
                Ok(None)
            }
            None => Ok(Some("no Redis available".to_owned())),
        }
    })?;
    r.step("postgres", || {
        let found = crate::postgres::ensure()?;
        test_env.push((crate::postgres::URL_VAR, found.url.clone().into()));
        *postgres = Some(found);
        Ok(None)
    })?;

    r.step("cargo test (workspace, all features)", || {
        exec(cargo(&test_env).args(["test", "--workspace", "--all-features"]))
    })?;

    // Examples are documentation that runs: each must finish offline and exit 0 (they check
    // what they show, e.g. that a canceled side effect was never committed).
    for name in examples()? {
        r.step(&format!("example {name}"), || {
            exec(cargo(&[]).args([
                "run",
                "-q",
                "-p",
                "keel",
                "--all-features",
                "--example",
                &name,
            ]))
        })?;
    }

    let featured = crates_with_features()?;
    if featured.is_empty() {
        println!("\nno crate declares [features]; no per-crate default-feature checks");
    }
    for name in featured {
        r.step(
            &format!("cargo clippy -p {name} (default features)"),
            || {
                exec(
                    cargo(&[])
                        .args(["clippy", "-p", &name, "--all-targets"])
                        .args(["--", "-D", "warnings"]),
                )
            },
        )?;
        r.step(&format!("cargo test -p {name} (default features)"), || {
            exec(cargo(&test_env).args(["test", "-p", &name]))
        })?;
    }

    r.step(
        "layers (docs/architecture.md's table against cargo metadata)",
        || crate::layers::check().map(|()| None),
    )?;
    r.step(
        "tidy (keel-transport names no keel-runtime store trait and calls no .runtime())",
        || crate::tidy::check().map(|()| None),
    )?;
    Ok(())
}

/// Runs a command as a step body.
fn exec(cmd: &mut Command) -> Result<Option<String>, String> {
    status(cmd).map(|()| None)
}

/// The names of the examples in `examples/` (registered on the facade crate), sorted.
fn examples() -> Result<Vec<String>, String> {
    let dir = workspace_root().join("examples");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

/// Package names of the `crates/*` whose manifest has a `[features]` table, sorted.
fn crates_with_features() -> Result<Vec<String>, String> {
    let dir = workspace_root().join("crates");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut manifests: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path().join("Cargo.toml"))
        .filter(|p| p.is_file())
        .collect();
    manifests.sort();
    let mut names = Vec::new();
    for manifest in manifests {
        let text = std::fs::read_to_string(&manifest)
            .map_err(|e| format!("reading {}: {e}", manifest.display()))?;
        if !text
            .lines()
            .any(|l| l.trim_start().starts_with("[features]"))
        {
            continue;
        }
        let name = package_name(&text)
            .ok_or_else(|| format!("no [package] name in {}", manifest.display()))?;
        names.push(name);
    }
    Ok(names)
}

/// The `name = "..."` of the `[package]` table in a manifest.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(value) = line.strip_prefix("name").map(str::trim_start) {
                if let Some(value) = value.strip_prefix('=') {
                    return Some(value.trim().trim_matches('"').to_owned());
                }
            }
        }
    }
    None
}
