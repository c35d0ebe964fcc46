//! The model-facing `run_code` tool (feature `sandbox`): a TypeScript or JavaScript module run
//! in a fresh sandbox isolate (`keel-sandbox`), its result and console returned as the tool's
//! output. The run's cancellation terminates the code at once.

use keel_agent::FnTool;
use keel_core::AgentError;
use keel_sandbox::{run_code, CodeExecutionRequest, Language};
use serde_json::json;

/// The name of the tool.
pub const RUN_CODE_TOOL: &str = "run_code";

/// A `run_code` tool: `{"source": "...", "language": "typescript" | "javascript"}`. The
/// module's default export (a value, or a function that is called) is the result; the
/// output is the sandbox's `CodeExecutionResult` (status, result, error with line and
/// column, console lines).
///
/// ```
/// let tool = keel::code::run_code_tool();
/// let agent = keel::agent::Agent::builder(keel::core::AgentCard::new("coder", "runs code", "http://x"))
///     .tool(tool)
///     .build()?;
/// # let _ = agent;
/// # Ok::<(), keel::core::AgentError>(())
/// ```
pub fn run_code_tool() -> FnTool {
    FnTool::new(
        RUN_CODE_TOOL,
        "Run a TypeScript (default) or JavaScript ES module in a sandbox with no I/O. Put the \
         answer in `export default` (a value, or a function that returns one).",
        json!({
            "type": "object",
            "properties": {
                "source": {"type": "string", "description": "The module's source."},
                "language": {"type": "string", "enum": ["typescript", "javascript"]}
            },
            "required": ["source"],
            "additionalProperties": false
        }),
        |args, ctx| async move {
            let language = match args["language"].as_str() {
                Some("javascript") => Language::Javascript,
                _ => Language::Typescript,
            };
            let source = args["source"].as_str().unwrap_or_default().to_owned();
            let execution = run_code(CodeExecutionRequest::new(source).with_language(language));
            let result = tokio::select! {
                result = execution.result() => result,
                () = ctx.cancel.cancelled() => {
                    execution.terminate(Some("the run was canceled"));
                    execution.result().await
                }
            };
            serde_json::to_value(&result).map_err(AgentError::internal)
        },
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keel_agent::{Agent, AgentExecutor, SendOptions};
    use keel_core::{AgentCard, Message, TaskState};
    use keel_llm::{MockLlm, MockResponse, ToolCall};
    use keel_runtime::Runtime;
    use serde_json::json;

    use crate::DefaultRuntime;

    #[tokio::test(flavor = "multi_thread")]
    async fn the_model_runs_code_through_the_tool() {
        let llm = MockLlm::scripted(vec![
            MockResponse::ToolCalls(vec![ToolCall::new(
                "run_code",
                json!({"source": "const xs: number[] = [1, 2, 3]; console.log('summing'); export default xs.reduce((a, b) => a + b, 0);"}),
            )]),
            MockResponse::Text("the sum is 6".into()),
        ]);
        let agent = Agent::builder(AgentCard::new("coder", "runs code", "http://x"))
            .llm(llm)
            .tool(super::run_code_tool())
            .build()
            .unwrap();
        let runtime = Arc::new(DefaultRuntime::offline());
        let auth = runtime.auth_service().auth_context();
        let exec = AgentExecutor::new(agent, runtime);
        let task = exec
            .send_message(&auth, Message::user("sum 1..3"), SendOptions::default())
            .await
            .unwrap();
        assert_eq!(task.state(), TaskState::Completed);
        let output = task
            .history
            .iter()
            .flat_map(|m| &m.parts)
            .find_map(|p| match &p.content {
                keel_core::PartContent::ToolOutput { output, .. } => Some(output.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(output["status"], "success", "{output}");
        assert_eq!(output["result"].as_f64(), Some(6.0));
        assert_eq!(output["console"][0]["message"], "summing");
    }
}
