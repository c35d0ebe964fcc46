//! `keel mcp` as an MCP client sees it: the official Python MCP SDK's stdio client starts the
//! real binary on a file of offline agents, lists one tool per agent with its schema, and
//! calls them: an answer, a thread continued, a run held for approval and a run over its
//! budget as `isError` results naming the task, and bad calls as JSON-RPC errors. And
//! `keel serve`'s `/mcp` as the SDK's streamable HTTP client sees it: behind the A2A
//! credentials, each call in the caller's tenant, a call the client cancels canceling its task.

mod support;

use serde_json::{json, Value};
use support::{mcp_python, workspace_root, KeelServer, PythonSteps};

/// Three offline agents: one that answers, one whose every action waits for approval, and
/// one whose budget no answer fits.
const CONFIG: &str = concat!(
    r#"
[server]
store = "memory"

[[agents]]
name = "helper"
description = "Answers with the offline model"
"#,
    support::careful_agent!(),
    r#"
[[agents]]
name = "thrifty"
description = "Has almost no budget"

[agents.budget]
max_output_tokens = 1
"#
);

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

const ALICE: &str = "mcp-alice-key";
const BOB: &str = "mcp-bob-key";

/// Two tenants; an agent that answers, and one whose MCP tool (the FastMCP fixture's `slow`,
/// over stdio) runs until canceled. `{python}`, `{fixture}` and `{markers}` are filled in.
const SERVE_CONFIG: &str = r#"
[server]
store = "memory"

[[server.api_keys]]
key = "${KEEL_TEST_ALICE_KEY}"
tenant = "acme/alice"

[[server.api_keys]]
key = "${KEEL_TEST_BOB_KEY}"
tenant = "globex/bob"

[[agents]]
name = "helper"
description = "Answers with the offline model"

[[agents]]
name = "slow"
description = "Calls a slow MCP tool"

[agents.mcp.fixture]
command = "{python}"
args = ["{fixture}", "stdio", "{markers}"]
timeout_seconds = 600
"#;

/// The A2A JSON-RPC answer to `method` with `params`, sent to the agent at `url` with `key`.
async fn a2a(url: &str, key: &str, method: &str, params: Value) -> Value {
    reqwest::Client::new()
        .post(url)
        .header("A2A-Version", "1.0")
        .header("X-API-Key", key)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn keel_serve_offers_its_agents_at_mcp_behind_its_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let markers = dir.path().join("markers");
    std::fs::create_dir(&markers).unwrap();
    let fixture = workspace_root().join("crates/keel-mcp/tests/fixtures/fastmcp_server.py");
    let python = mcp_python();
    let config = SERVE_CONFIG
        .replace("{python}", python.to_str().unwrap())
        .replace("{fixture}", fixture.to_str().unwrap())
        .replace("{markers}", markers.to_str().unwrap());
    let file = dir.path().join("keel.toml");
    std::fs::write(&file, config).unwrap();
    let env = [("KEEL_TEST_ALICE_KEY", ALICE), ("KEEL_TEST_BOB_KEY", BOB)];
    let server = KeelServer::start_with_env(&["--config", file.to_str().unwrap()], &env);
    let mcp_url = format!("{}mcp", server.url);

    let steps = PythonSteps::run(
        python,
        "mcp_agent_http_client.py",
        &[&mcp_url, ALICE, markers.to_str().unwrap()],
    );

    // Without a valid key: 401, as a JSON-RPC request to the agent is answered.
    let refused = steps.step("unauthorized");
    for case in ["none", "wrong"] {
        assert_eq!(refused[case]["status"], 401, "{refused}");
        let message = refused[case]["body"]["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("authentication required"), "{refused}");
    }

    assert_eq!(steps.step("tools")["tools"], json!(["helper", "slow"]));
    let answer = steps.step("answer");
    assert_eq!(answer["isError"], false);
    assert_eq!(answer["text"], "You said: hello over HTTP");

    // The task is the caller's: alice reads it over A2A, bob is told there is none.
    let task = answer["meta"]["keel/task"].as_str().unwrap();
    let mine = a2a(&server.url, ALICE, "GetTask", json!({"id": task})).await;
    assert_eq!(
        mine["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{mine}"
    );
    let theirs = a2a(&server.url, BOB, "GetTask", json!({"id": task})).await;
    assert_eq!(theirs["error"]["code"], -32001, "{theirs}");

    // The canceled call's task ended canceled, and the cancel reached the MCP tool it ran.
    assert_eq!(steps.step("cancel")["sent"], true);
    let slow = format!("{}agents/slow/", server.url);
    keel_runtime::testing::eventually("the canceled call's task is canceled", || {
        let slow = slow.clone();
        async move {
            let listed = a2a(&slow, ALICE, "ListTasks", json!({})).await;
            let tasks = listed["result"]["tasks"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            tasks
                .iter()
                .any(|task| task["status"]["state"] == "TASK_STATE_CANCELED")
        }
    })
    .await;
    keel_runtime::testing::eventually("the MCP tool sees the cancellation", || {
        let marker = markers.join("cancelled");
        async move { marker.exists() }
    })
    .await;
    assert_eq!(steps.step("done")["ok"], true);
}
