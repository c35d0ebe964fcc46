//! The web console in a real browser: headless Debian Chromium, driven by `playwright-core`
//! (tests/browser/console.mjs), against real `keel serve` processes. A message sent from the
//! chat box needs an approval, which appears live and is approved with a click, and the task
//! completes with the tool's result in the run's timeline; a long tool is canceled with a
//! click; a run started through one replica is watched on the other (one Redis).
//!
//! Needs Chromium (`apt-get install -y chromium`, or `KEEL_CHROMIUM`) and node with npm: the
//! test installs `tests/browser`'s locked packages itself, and fails saying what is missing
//! (`cargo xtask ci` installs both). Screenshots go to `target/console-screenshots/`. Also:
//! which `keel serve` serves the console (on loopback by default, `--no-console`,
//! `[server] console`, the flag over the file).

// xtask's own code, included rather than copied: `cargo xtask ci` installs what it finds.
#[path = "../xtask/src/browser.rs"]
#[allow(dead_code)] // installing Chromium is for xtask; the test only looks for it
mod browser;
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;
use support::{redis_url, uuid_like, KeelServer};

/// One browser at a time: the machines that run CI have few cores.
static BROWSER: Mutex<()> = Mutex::new(());

const KEY: &str = "console-test-key";

/// An agent whose every action needs approval, with the sandboxed `run_code` tool, behind
/// an API key.
const CAREFUL: &str = concat!(
    r#"
[server]
store = "memory"

[[server.api_keys]]
key = "${KEEL_TEST_CONSOLE_KEY}"
tenant = "acme/alice"
"#,
    support::careful_agent!()
);

fn screenshots() -> PathBuf {
    browser::test_dir()
        .ancestors()
        .nth(2)
        .expect("the workspace root")
        .join("target")
        .join("console-screenshots")
}

/// Runs `scenario` of console.mjs against `urls` (with `key` typed into the console when
/// given) and returns what it saw; fails with its account of the step that did not happen.
fn drive(scenario: &str, urls: &[&str], key: Option<&str>) -> Value {
    let chromium = browser::chromium().unwrap_or_else(|| {
        panic!(
            "the console's browser test needs Chromium at {} (or {} naming one): install it \
             with `apt-get install -y chromium`; `cargo xtask ci` installs it when missing",
            browser::DEFAULT_CHROMIUM,
            browser::CHROMIUM_ENV
        )
    });
    // One at a time, from the install on: two `npm ci` in one directory break each other.
    let _one_at_a_time = BROWSER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = browser::ensure_node_modules().unwrap_or_else(|err| panic!("{err}"));
    let mut node = Command::new("node");
    node.arg("console.mjs")
        .arg(scenario)
        .args(urls)
        .current_dir(dir)
        .env(browser::CHROMIUM_ENV, chromium)
        .env("KEEL_SCREENSHOTS", screenshots());
    if let Some(key) = key {
        node.env("KEEL_API_KEY", key);
    }
    let output = node
        .output()
        .unwrap_or_else(|err| panic!("could not run node (install node and npm): {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the console's {scenario} scenario failed ({}); screenshots in {}:\n{}\n{stdout}",
        output.status,
        screenshots().display(),
        String::from_utf8_lossy(&output.stderr),
    );
    let line = stdout.lines().last().unwrap_or_default();
    let seen: Value = serde_json::from_str(line)
        .unwrap_or_else(|err| panic!("console.mjs printed no JSON ({err}): {stdout}"));
    let page_errors: Vec<_> = seen["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|p| p.starts_with("page error"))
        .collect();
    assert!(page_errors.is_empty(), "the console threw: {page_errors:?}");
    seen
}

#[test]
fn an_approval_appears_live_and_approving_it_completes_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.toml");
    std::fs::write(&file, CAREFUL).unwrap();
    let server = KeelServer::start_with_env(
        &["--config", file.to_str().unwrap()],
        &[("KEEL_TEST_CONSOLE_KEY", KEY)],
    );
    let seen = drive("approve", &[&server.url], Some(KEY));
    assert_eq!(seen["waiting_for"], "run_code", "{seen}");
    assert_eq!(seen["state"], "completed", "{seen}");
    let result: Value = serde_json::from_str(seen["result"].as_str().unwrap()).unwrap();
    assert_eq!(result["result"], 42, "{seen}");
    assert_eq!(result["status"], "success", "{seen}");
    assert!(
        seen["approval"].as_str().unwrap().starts_with("approved"),
        "{seen}"
    );
    let rows: Vec<&str> = seen["timeline_rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for kind in ["run", "step", "model", "approval", "tool"] {
        assert!(
            rows.contains(&kind),
            "no {kind} bar in the timeline: {rows:?}"
        );
    }
}

#[test]
fn cancel_on_a_long_tool_cancels_the_task() {
    let server = KeelServer::start(&[]);
    let seen = drive("cancel", &[&server.url], None);
    assert_eq!(seen["state"], "canceled", "{seen}");
    assert_eq!(
        seen["cancel_button"], 0,
        "a canceled task offers no Cancel: {seen}"
    );
}

#[test]
fn a_run_started_through_one_replica_is_watched_on_the_other() {
    let url = redis_url();
    let prefix = format!("keel-test-{}:", uuid_like());
    let args = ["--store", url.as_str(), "--redis-prefix", prefix.as_str()];
    let (a, b) = (KeelServer::start_with(&args), KeelServer::start_with(&args));
    let seen = drive("replica", &[&a.url, &b.url], None);
    assert_eq!(seen["state"], "completed", "{seen}");
    assert_eq!(
        seen["served_by"],
        b.url.trim_end_matches('/'),
        "the run was watched on replica B: {seen}"
    );
    assert!(
        seen["result"].as_str().unwrap().contains('1'),
        "the sleep's answer is in B's timeline: {seen}"
    );
}

/// `GET path` of `server` as a browser asks (`Accept: text/html`), redirects not followed:
/// the status and the `Location`.
async fn browser_get(server: &KeelServer, path: &str) -> (u16, Option<String>) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = client
        .get(format!("{}{path}", server.url))
        .header("Accept", "text/html,*/*;q=0.8")
        .send()
        .await
        .unwrap();
    let location = answer
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_owned());
    (answer.status().as_u16(), location)
}

#[tokio::test]
async fn the_console_is_served_on_loopback_unless_turned_off() {
    let on = KeelServer::start(&[]);
    assert_eq!(browser_get(&on, "").await, (303, Some("console/".into())));
    assert_eq!(browser_get(&on, "console/").await.0, 200);

    let off = KeelServer::start(&["--no-console"]);
    assert_eq!(browser_get(&off, "").await, (405, None));
    assert_eq!(browser_get(&off, "console/").await.0, 404);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.toml");
    let config = CAREFUL.replacen("[server]", "[server]\nconsole = false", 1);
    std::fs::write(&file, config).unwrap();
    let env = [("KEEL_TEST_CONSOLE_KEY", KEY)];
    let from_file = KeelServer::start_with_env(&["--config", file.to_str().unwrap()], &env);
    assert_eq!(browser_get(&from_file, "console/").await.0, 404);
    // The flag wins over the file.
    let forced =
        KeelServer::start_with_env(&["--config", file.to_str().unwrap(), "--console"], &env);
    assert_eq!(browser_get(&forced, "console/").await.0, 200);
}

/// A fork made by `keel replay RUN --fork-at 1` on the server's store: its run page in the
/// console names the run and the model call it forked from.
#[test]
fn a_forked_run_names_its_source_in_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let keel = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(args)
            .args(["--store", &store])
            .current_dir(dir.path())
            .env("RUST_LOG", "warn")
            .env_remove("KEEL_CONFIG")
            .output()
            .unwrap();
        assert!(output.status.success(), "keel {args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    keel(&["run", "hello there"]);
    let listed: Value = serde_json::from_str(&keel(&["runs", "list", "--json"])).unwrap();
    let source = listed["runs"][0]["run_id"].as_str().unwrap().to_owned();
    let fork: Value =
        serde_json::from_str(&keel(&["replay", &source, "--fork-at", "1", "--json"])).unwrap();
    let listed: Value = serde_json::from_str(&keel(&["runs", "list", "--json"])).unwrap();
    let forked = &listed["runs"][0];
    assert_eq!(forked["run_id"], fork["run_id"], "{listed}");
    let route = format!(
        "#/thread/{}/task/{}/run/{}",
        forked["thread_id"].as_str().unwrap(),
        forked["task_id"].as_str().unwrap(),
        forked["run_id"].as_str().unwrap()
    );
    let server = KeelServer::start_with(&["--store", &store]);
    let seen = drive("fork", &[server.url.as_str(), route.as_str()], None);
    assert_eq!(seen["forked_from"], source.as_str(), "{seen}");
    assert!(
        seen["text"]
            .as_str()
            .unwrap()
            .starts_with(&format!("Forked from run {source} at model call 1")),
        "{seen}"
    );
}
