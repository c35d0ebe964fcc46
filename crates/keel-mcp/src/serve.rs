//! [`AgentServer`]: Keel agents offered as the tools of an MCP server, so that an MCP client
//! (an IDE, another agent framework) calls a Keel agent as a tool. Each call is one message
//! sent to the agent's [`AgentExecutor`], the same engine path `keel run` and `keel serve`
//! use, so the agent's policy and budgets are in force.
//!
//! It is served over stdio ([`AgentServer::serve_stdio`], `keel mcp`) or as a streamable HTTP
//! service ([`AgentServer::http_service`]) that `keel serve` mounts at `/mcp` behind the same
//! authentication as its A2A routes: the caller's tenant is the [`AuthContext`] the
//! authentication put in the HTTP request's extensions. A client's `notifications/cancelled`
//! for a call cancels the call's task.

use std::collections::HashSet;
use std::sync::Arc;

use keel_agent::{AgentExecutor, SendOptions};
use keel_core::{AgentError, Message, Task, TaskId, TaskState};
use keel_runtime::AuthContext;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, InitializeResult, JsonObject, ListToolsResult, MetaObject,
    PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt as _;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::{sanitize, McpError, MAX_TOOL_NAME};

/// The name this server gives itself in the MCP handshake.
const SERVER_NAME: &str = "keel";

/// The `_meta` key of a result that names the task the call ran as.
pub const META_TASK: &str = "keel/task";

/// The `_meta` key of a result that names the task's thread: pass it as `thread` to continue.
pub const META_THREAD: &str = "keel/thread";

/// How many of a thread's pending approvals are read to find the one of a task: a thread
/// rarely has more than one task waiting.
const PENDING_PAGE: u32 = 100;

/// The reason a task canceled by its MCP client ends with.
pub const CANCELED_BY_CLIENT: &str = "canceled by the MCP client";

/// The streamable HTTP service of an [`AgentServer`] (an axum or tower service).
pub type HttpService = StreamableHttpService<AgentServer, LocalSessionManager>;

/// An MCP server with one tool per agent: `{message, thread?}` in, the agent's answer out,
/// with the task's and thread's ids in the result's `_meta` ([`META_TASK`], [`META_THREAD`]).
#[derive(Clone)]
pub struct AgentServer {
    tools: Arc<Vec<(Tool, AgentExecutor)>>,
    auth: AuthContext,
}

impl AgentServer {
    /// A server offering `agents`, run for the tenant `auth` (over HTTP: for a request whose
    /// extensions carry no [`AuthContext`] of their own). A tool is named after its
    /// agent, sanitized as the client side names tools (`[A-Za-z0-9_-]`); two agents whose
    /// names sanitize alike, or a name longer than [`MAX_TOOL_NAME`], are refused.
    pub fn new(agents: Vec<AgentExecutor>, auth: AuthContext) -> Result<Self, McpError> {
        let mut taken = HashSet::new();
        let mut tools = Vec::with_capacity(agents.len());
        for executor in agents {
            let card = executor.agent().card();
            let name = sanitize(&card.name);
            if name.len() > MAX_TOOL_NAME || !taken.insert(name.clone()) {
                return Err(McpError::Request {
                    server: SERVER_NAME.into(),
                    reason: format!(
                        "agent `{}` cannot be the MCP tool `{name}`: {}",
                        card.name,
                        if name.len() > MAX_TOOL_NAME {
                            format!("tool names have at most {MAX_TOOL_NAME} characters")
                        } else {
                            "another agent's name gives the same tool name".to_owned()
                        }
                    ),
                });
            }
            let tool = Tool::new(name, card.description.clone(), input_schema());
            tools.push((tool, executor));
        }
        Ok(Self {
            tools: Arc::new(tools),
            auth,
        })
    }

    /// Serve over this process's stdin and stdout until the client closes stdin. Nothing
    /// else may write to stdout meanwhile: it carries the protocol.
    pub async fn serve_stdio(self) -> Result<(), McpError> {
        let failed = |reason: String| McpError::Request {
            server: SERVER_NAME.into(),
            reason,
        };
        let running = self
            .serve(rmcp::transport::stdio_pipes())
            .await
            .map_err(|err| failed(err.to_string()))?;
        running
            .waiting()
            .await
            .map_err(|err| failed(err.to_string()))?;
        Ok(())
    }

    /// The streamable HTTP service of this server, one session per client, each of its
    /// requests run for the [`AuthContext`] found in the request's extensions (put there by
    /// the authentication in front of it). `allowed_hosts` are the `Host` header values
    /// accepted besides loopback ones (DNS rebinding protection); open sessions and their
    /// streams end when `stop` fires.
    pub fn http_service(
        self,
        allowed_hosts: impl IntoIterator<Item = String>,
        stop: CancellationToken,
    ) -> HttpService {
        let mut config = StreamableHttpServerConfig::default();
        config.cancellation_token = stop;
        config.allowed_hosts.extend(allowed_hosts);
        StreamableHttpService::new(
            move || Ok(self.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        )
    }

    /// One call: the agent's answer, or an `isError` result saying why there is none. When
    /// `canceled` fires first (the client's `notifications/cancelled`), the task is canceled.
    async fn call(
        &self,
        auth: &AuthContext,
        executor: &AgentExecutor,
        args: Option<JsonObject>,
        canceled: &CancellationToken,
    ) -> CallToolResult {
        let args = args.unwrap_or_default();
        let mut message = Message::user(
            args.get("message")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        message.thread_id = args.get("thread").and_then(Value::as_str).map(Into::into);
        // The task's id is chosen here so that a cancel can name it while the run goes on.
        let task_id = TaskId::new();
        let options = SendOptions {
            task_id: Some(task_id.clone()),
            ..SendOptions::default()
        };
        let sent = tokio::select! {
            sent = executor.send_message(auth, message, options) => sent,
            () = canceled.cancelled() => {
                cancel(executor, auth, &task_id).await
            }
        };
        let task = match sent {
            Ok(task) => task,
            Err(err) => return error_result(err.to_string()),
        };
        let answer = task.status().text().unwrap_or_default();
        let mut result = match task.state() {
            TaskState::Completed => CallToolResult::success(vec![ContentBlock::text(answer)]),
            TaskState::InputRequired => error_result(waiting(auth, executor, &task).await),
            state => error_result(format!(
                "task {} of agent `{}` ended {state}{}",
                task.id,
                executor.agent().card().name,
                if answer.is_empty() {
                    String::new()
                } else {
                    format!(": {answer}")
                }
            )),
        };
        // The ids a client needs to continue the thread, or to find the task over A2A.
        let mut meta = JsonObject::new();
        meta.insert(META_TASK.into(), json!(task.id));
        meta.insert(META_THREAD.into(), json!(task.thread_id));
        result.meta = Some(MetaObject(meta));
        result
    }

    /// The tenant a request runs for: the one its HTTP request's extensions carry, else this
    /// server's.
    fn tenant(&self, context: &RequestContext<RoleServer>) -> AuthContext {
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<AuthContext>())
            .unwrap_or(&self.auth)
            .clone()
    }
}

/// Cancel the task `task_id` a client gave up on: the canceled task, or why it is not.
async fn cancel(
    executor: &AgentExecutor,
    auth: &AuthContext,
    task_id: &TaskId,
) -> Result<Task, AgentError> {
    tracing::info!(task = %task_id, "the MCP client canceled its call; canceling the task");
    match executor
        .cancel_task(auth, task_id, Some(CANCELED_BY_CLIENT.to_owned()))
        .await
    {
        Ok(task) => Ok(task),
        // It ended meanwhile: its end stands.
        Err(AgentError::TaskNotCancelable { .. }) => executor.get_task(auth, task_id, None).await,
        Err(err) => Err(err),
    }
}

/// What a task that waits says: the action it waits to have approved, and how to answer (an
/// MCP tool call cannot: the action is not taken unchecked).
async fn waiting(auth: &AuthContext, executor: &AgentExecutor, task: &Task) -> String {
    let pending = executor
        .reads()
        .pending_approvals(auth, Some(&task.thread_id), Some(PENDING_PAGE), None)
        .await
        .ok()
        .and_then(|page| page.items.into_iter().find(|p| p.task_id == task.id));
    match pending {
        Some(pending) => format!(
            "task {} (thread {}) waits for approval of `{}` ({}): approve or deny it over \
                 A2A, with `keel serve` on the same store and `keel tasks approve {}`",
            task.id, task.thread_id, pending.request.action.name, pending.request.reason, task.id
        ),
        None => format!(
            "task {} (thread {}) waits for input: {}",
            task.id,
            task.thread_id,
            task.status().text().unwrap_or_default()
        ),
    }
}

/// The input schema of every agent's tool.
fn input_schema() -> JsonObject {
    let schema = json!({
        "type": "object",
        "properties": {
            "message": {"type": "string", "description": "The message to the agent."},
            "thread": {
                "type": "string",
                "description": "The thread to continue (a new one when absent)."
            }
        },
        "required": ["message"]
    });
    match schema {
        Value::Object(object) => object,
        _ => unreachable!("a JSON object literal"),
    }
}

/// A tool result that is an error, for the calling model to read.
fn error_result(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// Arguments that do not fit the schema: an MCP invalid-params error naming the field.
fn check_args(args: Option<&JsonObject>) -> Result<(), ErrorData> {
    let invalid = |what: &str| Err(ErrorData::invalid_params(what.to_owned(), None));
    let Some(args) = args else {
        return invalid("arguments: `message` (a string) is required");
    };
    match args.get("message") {
        Some(Value::String(text)) if !text.trim().is_empty() => {}
        Some(Value::String(_)) => return invalid("arguments.message: must not be empty"),
        Some(_) => return invalid("arguments.message: must be a string"),
        None => return invalid("arguments: `message` (a string) is required"),
    }
    match args.get("thread") {
        None | Some(Value::String(_)) | Some(Value::Null) => Ok(()),
        Some(_) => invalid("arguments.thread: must be a string"),
    }
}

impl ServerHandler for AgentServer {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.tools.iter().map(|(tool, _)| tool.clone()).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some((_, executor)) = self
            .tools
            .iter()
            .find(|(tool, _)| tool.name == request.name)
        else {
            return Err(ErrorData::invalid_params(
                format!("no tool `{}`", request.name),
                None,
            ));
        };
        check_args(request.arguments.as_ref())?;
        let auth = self.tenant(&context);
        Ok(self
            .call(&auth, executor, request.arguments, &context.ct)
            .await
            .into())
    }
}

#[cfg(test)]
mod tests {
    use keel_agent::Agent;
    use keel_core::AgentCard;

    use super::*;

    fn executor(name: &str) -> AgentExecutor {
        let llm = Arc::new(keel_llm::MockLlm::new());
        let agent = Agent::builder(AgentCard::new(name, "an agent", "http://localhost/"))
            .llm_shared(llm.clone())
            .build()
            .unwrap();
        AgentExecutor::new(agent, Arc::new(keel_runtime::Services::in_memory(llm)))
    }

    fn refusal(names: &[&str]) -> String {
        let agents = names.iter().map(|name| executor(name)).collect();
        match AgentServer::new(agents, AuthContext::new("app", "user")) {
            Err(McpError::Request { server, reason }) => {
                assert_eq!(server, SERVER_NAME);
                reason
            }
            Err(other) => panic!("another error: {other}"),
            Ok(_) => panic!("{names:?} were accepted"),
        }
    }

    #[tokio::test]
    async fn agents_whose_tool_names_clash_or_are_too_long_are_refused() {
        assert_eq!(
            refusal(&["a.b", "a_b"]),
            "agent `a_b` cannot be the MCP tool `a_b`: another agent's name gives the same \
             tool name"
        );
        let long = "x".repeat(MAX_TOOL_NAME + 1);
        assert_eq!(
            refusal(&[long.as_str()]),
            format!(
                "agent `{long}` cannot be the MCP tool `{long}`: tool names have at most \
                 {MAX_TOOL_NAME} characters"
            )
        );
    }

    #[tokio::test]
    async fn a_tool_is_the_agents_sanitized_name_with_the_message_schema() {
        let server =
            AgentServer::new(vec![executor("a.b")], AuthContext::new("app", "user")).unwrap();
        let (tool, _) = &server.tools[0];
        assert_eq!(tool.name, "a_b");
        assert_eq!(tool.description.as_deref(), Some("an agent"));
        assert_eq!(tool.input_schema["required"], json!(["message"]));
    }
}
