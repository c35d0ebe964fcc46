//! `keel mcp` as an MCP client sees it: the official Python MCP SDK's stdio client starts the
//! real binary on a file of offline agents, lists one tool per agent with its schema, and
//! calls them: an answer, a thread continued, a run held for approval and a run over its
//! budget as `isError` results naming the task, and bad calls as JSON-RPC errors.

mod support;

use serde_json::json;
use support::{mcp_python, PythonSteps};

/// Three offline agents: one that answers, one whose every action waits for approval, and
/// one whose budget no answer fits.
const CONFIG: &str = r#"
[server]
store = "memory"

[[agents]]
name = "helper"
description = "Answers with the offline model"

[[agents]]
name = "careful"
description = "Asks before it acts"

[agents.tools]
run_code = true

[agents.policy]
default = "require_approval"

[[agents]]
name = "thrifty"
description = "Has almost no budget"

[agents.budget]
max_output_tokens = 1
"#;

/// JSON-RPC's "invalid params".
const INVALID_PARAMS: i64 = -32602;

/// The client script's steps against `keel mcp --config FILE EXTRA`.
fn session(extra: &[&str]) -> PythonSteps {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let mut args = vec![
        env!("CARGO_BIN_EXE_keel"),
        "mcp",
        "--config",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    PythonSteps::run(mcp_python(), "mcp_agent_client.py", &args)
}

fn tool_names(steps: &PythonSteps) -> Vec<String> {
    steps.step("tools")["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn an_mcp_client_calls_every_agent_of_the_file_as_a_tool() {
    let steps = session(&[]);
    assert_eq!(tool_names(&steps), ["helper", "careful", "thrifty"]);
    let helper = &steps.step("tools")["tools"][0];
    assert_eq!(helper["description"], "Answers with the offline model");
    let schema = &helper["inputSchema"];
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["required"], json!(["message"]));
    assert_eq!(schema["properties"]["message"]["type"], "string");
    assert_eq!(schema["properties"]["thread"]["type"], "string");

    // The agent's answer is the tool's result, with its task and thread in `_meta`.
    let answer = steps.step("answer");
    assert_eq!(answer["isError"], false);
    assert_eq!(answer["text"], "You said: hello over MCP");
    assert!(answer["meta"]["keel/task"].is_string(), "{answer}");

    // `thread` continues the thread the first call's `_meta` named, as a new task.
    let thread = steps.step("thread");
    assert_eq!(thread["again"]["text"], "You said: second");
    assert_eq!(
        thread["again"]["meta"]["keel/thread"],
        thread["first"]["meta"]["keel/thread"]
    );
    assert_ne!(
        thread["again"]["meta"]["keel/task"],
        thread["first"]["meta"]["keel/task"]
    );

    // A failed run is an error result with the engine's reason.
    let budget = steps.step("budget");
    assert_eq!(budget["isError"], true);
    let text = budget["text"].as_str().unwrap();
    let task = budget["meta"]["keel/task"].as_str().unwrap();
    assert!(
        text.contains(&format!("task {task} of agent `thrifty` ended failed"))
            && text.contains("budget exceeded: max_output_tokens"),
        "{text}"
    );

    // Arguments off the schema, and a tool not offered: invalid params.
    assert_eq!(steps.step("bad_args")["errorCode"], INVALID_PARAMS);
    assert_eq!(
        steps.step("bad_args")["errorMessage"],
        "arguments: `message` (a string) is required"
    );
    assert_eq!(steps.step("unknown")["errorCode"], INVALID_PARAMS);
    assert_eq!(steps.step("done")["ok"], true);
}

#[test]
fn a_run_held_for_approval_is_an_error_result_naming_the_task() {
    let steps = session(&["--agent", "careful"]);
    assert_eq!(tool_names(&steps), ["careful"]);
    let held = steps.step("approval");
    assert_eq!(held["isError"], true);
    let text = held["text"].as_str().unwrap();
    let task = held["meta"]["keel/task"].as_str().unwrap();
    for shown in [
        format!("task {task} "),
        "waits for approval of `run_code`".to_owned(),
        format!("`keel tasks approve {task}`"),
        "`keel serve`".to_owned(),
    ] {
        assert!(text.contains(&shown), "`{shown}` not in: {text}");
    }
    assert_eq!(steps.step("done")["ok"], true);
}
