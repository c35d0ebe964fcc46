//! What the MCP tests share: the real servers they run (installed by `cargo xtask mcp`, found
//! the same way through the xtask's own file), and agents made of their tools.

#![allow(dead_code)] // each test file uses part of it

#[path = "../../../../xtask/src/py_sdk.rs"]
mod py_sdk;
#[path = "../../../../xtask/src/mcp.rs"]
mod servers;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use keel_agent::{Agent, AgentBuilder, AgentExecutor, Tool};
use keel_core::AgentCard;
use keel_mcp::{McpServer, McpTool, ServerSpec, TransportSpec};

/// A server command or python: the variable when set, else the cached install (made now if
/// missing). Panics naming what is missing and how to install it: a test that needs a real
/// server never passes without one.
fn for_test(var: &str, ensure: impl FnOnce() -> Result<PathBuf, String>) -> PathBuf {
    if let Some(found) = std::env::var_os(var) {
        return PathBuf::from(found);
    }
    ensure().unwrap_or_else(|error| {
        panic!(
            "this test needs the MCP test servers (npm's {} and a venv with the Python MCP \
             SDK), installed under target/ by `{}` (node, npm, python3 with venv, and access to \
             the npm registry and PyPI). They could not be installed: {error}\nRun `{1}`, or \
             set {var}.",
            servers::EVERYTHING_PACKAGE,
            servers::INSTALL_COMMAND,
        )
    })
}

/// The everything server's command.
pub fn everything_command() -> PathBuf {
    for_test(servers::EVERYTHING_ENV, servers::ensure_everything)
}

/// A python with FastMCP.
pub fn python() -> PathBuf {
    for_test(servers::PYTHON.env_var, || servers::PYTHON.ensure())
}

/// The spec of the everything server over stdio, named `everything`.
pub fn everything_spec() -> ServerSpec {
    let command = everything_command().display().to_string();
    ServerSpec::new(
        "everything",
        TransportSpec::Stdio {
            command: command.clone(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
        },
        command,
    )
}

/// The tools of `server`, named as an agent with only it would have them.
pub async fn tools_of(server: &Arc<McpServer>) -> Vec<Arc<McpTool>> {
    let listed = McpTool::list(server, &mut HashSet::new())
        .await
        .expect("tools listed");
    listed.into_iter().map(Arc::new).collect()
}

/// `spec`'s server, started, and an agent on all its tools (see [`executor`]).
pub async fn serving(spec: ServerSpec) -> (Arc<McpServer>, AgentExecutor) {
    let server = McpServer::start(spec).await.unwrap();
    let exec = executor(&tools_of(&server).await, |b| b);
    (server, exec)
}

/// An agent on the offline model (which calls `/TOOL {json}`) with `tools`, on an in-memory
/// runtime; `build` adds to it (a policy).
pub fn executor(
    tools: &[Arc<McpTool>],
    build: impl FnOnce(AgentBuilder) -> AgentBuilder,
) -> AgentExecutor {
    let llm = Arc::new(keel_llm::MockLlm::new());
    let mut builder = Agent::builder(AgentCard::new(
        "mcp-user",
        "Uses MCP tools.",
        "http://127.0.0.1/",
    ))
    .llm_shared(llm.clone());
    for tool in tools {
        builder = builder.tool_shared(tool.clone() as Arc<dyn Tool>);
    }
    let agent = build(builder).build().expect("agent builds");
    AgentExecutor::new(agent, Arc::new(keel_runtime::Services::in_memory(llm)))
}

/// The task of `text` sent to `exec` by its runtime's caller, which must complete.
pub async fn completed(exec: &AgentExecutor, text: &str) -> keel_core::Task {
    let auth = exec.runtime().auth_service().auth_context();
    let task = exec
        .send_message(
            &auth,
            keel_core::Message::user(text),
            keel_agent::SendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(task.state(), keel_core::TaskState::Completed, "{task:?}");
    task
}

/// Kill a process at once (SIGKILL): a server that crashes.
pub fn kill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -9 {pid}");
}

/// Call `tool` of `exec`'s agent directly, with no model, through policy, budget and events
/// as a model's call goes (`AgentExecutor::call_tool_in_context`), in a new thread.
pub async fn call(
    exec: &AgentExecutor,
    tool: &str,
    arguments: serde_json::Value,
) -> keel_core::AgentResult<serde_json::Value> {
    let auth = exec.runtime().auth_service().auth_context();
    exec.call_tool_in_context(
        &auth,
        keel_core::ThreadId::new(),
        tool,
        arguments,
        keel_core::RunContext::new(),
    )
    .await
}

/// Every one of `expected` is among the tool `names`.
pub fn assert_offered(names: &[&str], expected: &[&str]) {
    for name in expected {
        assert!(names.contains(name), "{name} not in {names:?}");
    }
}
