//! The model-facing `run_code` tool (feature `sandbox`): a TypeScript or JavaScript module run
//! in a fresh sandbox isolate (`keel-sandbox`), its result and console returned as the tool's
//! output. The run's cancellation terminates the code at once.

use async_trait::async_trait;
use keel_agent::{AgentBuilder, CodeRequest, CodeRun, CodeRunner, FnTool};
use keel_core::{AgentError, AgentResult};
use keel_sandbox::{run_code, CodeExecution, CodeExecutionRequest, Language};
use serde_json::{json, Value};

/// The name of the tool.
pub const RUN_CODE_TOOL: &str = "run_code";

/// A [`CodeRunner`] over `keel-sandbox`: a fresh isolate per run.
#[derive(Debug, Clone, Copy, Default)]
pub struct SandboxRunner;

struct SandboxRun(CodeExecution);

#[async_trait]
impl CodeRun for SandboxRun {
    async fn result(&self) -> Value {
        let result = self.0.result().await;
        serde_json::to_value(&result).unwrap_or_else(
            |e| json!({"status": "error", "error": {"name": "Error", "message": e.to_string()}}),
        )
    }
    fn terminate(&self, reason: Option<&str>) {
        self.0.terminate(reason);
    }
}

impl CodeRunner for SandboxRunner {
    fn start(&self, request: CodeRequest) -> AgentResult<Box<dyn CodeRun>> {
        let language = match request.language.as_deref() {
            None | Some("typescript") | Some("ts") => Language::Typescript,
            Some("javascript") | Some("js") => Language::Javascript,
            Some(other) => {
                return Err(AgentError::invalid_input(
                    "language",
                    format!("`{other}` is not typescript or javascript"),
                ))
            }
        };
        let mut sandbox = CodeExecutionRequest::new(request.source).with_language(language);
        if let Some(filename) = request.filename {
            sandbox = sandbox.with_filename(filename);
        }
        if let Some(limit) = request.memory_limit_bytes {
            sandbox = sandbox.with_memory_limit_bytes(limit);
        }
        Ok(Box::new(SandboxRun(run_code(sandbox))))
    }
}

/// Give an agent code execution: the [`SandboxRunner`] behind `ThreadState::run_code` and
/// the model-facing [`run_code_tool`].
pub fn with_run_code(builder: AgentBuilder) -> AgentBuilder {
    builder.code_runner(SandboxRunner).tool(run_code_tool())
}

/// A `run_code` tool: `{"source": "...", "language": "typescript" | "javascript"}`, run
/// through the thread's [`ThreadState::run_code`](keel_agent::ThreadState::run_code) (so the
/// agent needs a code runner: see [`with_run_code`]). The module's default export (a value,
/// or a function that is called) is the result; the output is the run's result (status,
/// result, error with line and column, console lines). Canceling the run terminates the code.
///
/// ```
/// let agent = keel::code::with_run_code(keel::agent::Agent::builder(
///     keel::core::AgentCard::new("coder", "runs code", "http://x"),
/// ))
/// .build()?;
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
            let request = CodeRequest {
                source: args["source"].as_str().unwrap_or_default().to_owned(),
                language: args["language"].as_str().map(str::to_owned),
                ..CodeRequest::default()
            };
            let run = ctx.thread.run_code(request)?;
            let result = tokio::select! {
                result = run.result() => result,
                () = ctx.cancel.cancelled() => {
                    run.terminate(Some("the run was canceled"));
                    run.result().await
                }
            };
            Ok(result)
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
        let agent = super::with_run_code(
            Agent::builder(AgentCard::new("coder", "runs code", "http://x")).llm(llm),
        )
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
        let (output, _) = keel_runtime::testing::tool_outputs(&task).remove(0);
        assert_eq!(output["status"], "success", "{output}");
        assert_eq!(output["result"].as_f64(), Some(6.0));
        assert_eq!(output["console"][0]["message"], "summing");
    }
}
