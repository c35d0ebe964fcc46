//! Instructions per engine step, counted by callgrind: a figure that does not depend on the
//! machine's speed or load, unlike the engine bench's wall-clock figures.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::util::{cargo, workspace_root};

/// Runs the engine bench's in-memory row (64 threads on one tokio worker, 2 s) under
/// callgrind and prints its instruction count divided by the steps it ran. Skipped, with a
/// note, when valgrind is not installed or `KEEL_BENCH_CALLGRIND=0`.
pub fn engine_per_step() -> Result<(), String> {
    if std::env::var("KEEL_BENCH_CALLGRIND").is_ok_and(|v| v.trim() == "0") {
        return Ok(());
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("\ninstructions per step: skipped (valgrind is not installed)");
        return Ok(());
    }
    let binary = engine_bench_binary()?;
    let out_file =
        std::env::temp_dir().join(format!("keel-engine-{}.callgrind", std::process::id()));
    println!("\ninstructions per step: running the memory row under callgrind (about a minute)");
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(&binary)
        .envs([
            ("KEEL_BENCH_WORKERS", "1"),
            ("KEEL_BENCH_BACKENDS", "memory"),
            ("KEEL_BENCH_THREADS", "64"),
            ("KEEL_BENCH_SECS", "2"),
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running valgrind: {e}"))?;
    let _ = std::fs::remove_file(&out_file);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "the engine bench failed under callgrind:\n{stderr}"
        ));
    }
    let steps = number_after(&stdout, "steps run in all:")
        .ok_or("the engine bench did not print `steps run in all: N`")?;
    let instructions =
        number_after(&stderr, "Collected :").ok_or("callgrind did not print `Collected : N`")?;
    if steps == 0 {
        return Err("the engine bench ran no steps under callgrind".into());
    }
    println!(
        "instructions per step: {:.1}k ({instructions} instructions over {steps} steps, whole process; \
         memory store, 64 threads on one worker)",
        instructions as f64 / steps as f64 / 1000.0
    );
    Ok(())
}

/// The engine bench's executable, built by `cargo bench --no-run`.
fn engine_bench_binary() -> Result<PathBuf, String> {
    let output = cargo(&[])
        .args([
            "bench",
            "-p",
            "store-bench",
            "--bench",
            "engine",
            "--no-run",
        ])
        .args(["--message-format=json"])
        .current_dir(workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo bench --no-run: {e}"))?;
    if !output.status.success() {
        return Err("cargo bench --no-run failed".into());
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["target"]["name"] == "engine")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo bench --no-run named no engine executable".into())
}

/// The first whole number after `label` in `text`, ignoring thousands separators.
fn number_after(text: &str, label: &str) -> Option<u64> {
    let rest = &text[text.find(label)? + label.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::number_after;

    #[test]
    fn numbers_are_read_after_their_label() {
        assert_eq!(
            number_after("==1== Collected : 2,870,619,647\n", "Collected :"),
            Some(2_870_619_647)
        );
        assert_eq!(
            number_after("steps run in all: 23040\n", "steps run in all:"),
            Some(23_040)
        );
        assert_eq!(number_after("nothing here", "Collected :"), None);
    }
}
