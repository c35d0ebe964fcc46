//! Remote delegation: a remote A2A agent used as a tool. Each call sends the model's message
//! to the remote agent through [`keel_transport::A2aClient`], with the child run's
//! [`RunContext`] (`ctx.run.child(name)`: new run id, same trace, workspace, permissions and
//! budget, `parent_run_id`, extended `agent_chain`) in the message's metadata under
//! [`RUN_CONTEXT_KEY`](keel_core::RUN_CONTEXT_KEY), waits for the remote task to rest and
//! answers its result. When the parent run is canceled (or the call is abandoned), the remote
//! task gets a `CancelTask`.
//!
//! ```no_run
//! use keel::delegation::RemoteAgentTool;
//! let researcher = RemoteAgentTool::new(
//!     "researcher",
//!     "Ask the research agent; it answers with a summary.",
//!     "http://127.0.0.1:8081",
//! );
//! # let _ = researcher;
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_agent::{TaskRest, Tool, ToolContext};
use keel_core::{AgentError, AgentResult, Message, Task, TaskId, TaskState, RUN_CONTEXT_KEY};
use keel_transport::{A2aClient, SendMessageOptions};
use serde_json::{json, Value};

/// How often a delegation looks at the remote task by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The reason sent with the `CancelTask` of a remote child whose parent run was canceled.
pub const PARENT_CANCELED_REASON: &str = "parent run canceled";

/// A tool that delegates to a remote A2A agent. Arguments: `{"message": "..."}`. The output
/// is `{"task_id", "state", "answer", "artifacts"}` when the remote task completes or asks for
/// input; a failed, rejected or canceled remote task is a tool error.
pub struct RemoteAgentTool {
    name: String,
    description: String,
    client: Arc<A2aClient>,
    poll_interval: Duration,
}

impl RemoteAgentTool {
    /// A tool named `name` that delegates to the A2A agent at `base_url` (its card is read
    /// from `<base_url>/.well-known/agent-card.json`).
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        base_url: impl Into<String>,
    ) -> Self {
        Self::with_client(name, description, A2aClient::new(base_url))
    }

    /// A tool that delegates through an already configured client.
    pub fn with_client(
        name: impl Into<String>,
        description: impl Into<String>,
        client: A2aClient,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            client: Arc::new(client),
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }

    /// How often to look at the remote task while it works.
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(10));
        self
    }

    fn failed(&self, message: impl Into<String>) -> AgentError {
        AgentError::ToolFailed {
            tool: self.name.clone(),
            message: message.into(),
        }
    }

    /// The tool's output for a remote task that rests.
    fn result_of(&self, task: &Task) -> AgentResult<Value> {
        let answer = task.status().text();
        match task.state() {
            TaskState::Completed | TaskState::InputRequired | TaskState::AuthRequired => {
                let artifacts: Vec<Value> = task
                    .artifacts
                    .iter()
                    .map(|a| {
                        let text: String = a.parts.iter().filter_map(|p| p.as_text()).collect();
                        json!({"name": a.name, "text": text})
                    })
                    .collect();
                Ok(json!({
                    "task_id": task.id.as_str(),
                    "state": task.state().to_string(),
                    "answer": answer,
                    "artifacts": artifacts,
                }))
            }
            state => Err(self.failed(format!(
                "remote task {} ended {state}{}",
                task.id,
                answer.map(|a| format!(": {a}")).unwrap_or_default()
            ))),
        }
    }
}

/// Sends `CancelTask` for the remote task when dropped while armed: the engine aborts a
/// canceled run's tool, so the cancel must not depend on the tool's future running on. Armed
/// from the moment the message is sent: a call dropped while the send is in flight lets the
/// send finish, off the call, and cancels the task it created (the request may have reached
/// the remote agent already).
struct CancelOnDrop {
    client: Arc<A2aClient>,
    child: Child,
}

/// The remote task as far as the delegating call knows it.
enum Child {
    /// Nothing to cancel: the send failed, or the call has its answer.
    Disarmed,
    /// The message is on its way; the task it creates is not known yet.
    Sending(tokio::task::JoinHandle<AgentResult<Task>>),
    /// The remote task the message created.
    Created(TaskId),
}

impl CancelOnDrop {
    /// Send `message` (on a task of its own, so that dropping the call does not drop it).
    fn send(client: &Arc<A2aClient>, message: Message, options: SendMessageOptions) -> Self {
        let sender = client.clone();
        CancelOnDrop {
            client: client.clone(),
            child: Child::Sending(tokio::spawn(async move {
                sender.send_message(message, options).await
            })),
        }
    }

    /// The task the message created, once the remote agent answers the send.
    async fn sent(&mut self) -> AgentResult<Task> {
        let Child::Sending(handle) = &mut self.child else {
            return Err(AgentError::internal(
                "the delegated message was already sent",
            ));
        };
        let sent = handle
            .await
            .map_err(AgentError::internal)
            .and_then(|sent| sent);
        self.child = match &sent {
            Ok(task) => Child::Created(task.id.clone()),
            Err(_) => Child::Disarmed,
        };
        sent
    }

    fn disarm(&mut self) {
        self.child = Child::Disarmed;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let child = std::mem::replace(&mut self.child, Child::Disarmed);
        if matches!(child, Child::Disarmed) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        handle.spawn(async move {
            let task_id = match child {
                Child::Created(task_id) => task_id,
                Child::Sending(sending) => match sending.await {
                    Ok(Ok(task)) => task.id,
                    _ => return,
                },
                Child::Disarmed => return,
            };
            match client
                .cancel_task(&task_id, Some(PARENT_CANCELED_REASON.into()))
                .await
            {
                Ok(_) | Err(AgentError::TaskNotCancelable { .. }) => {}
                Err(err) => {
                    tracing::warn!(task_id = %task_id, error = %err, "cannot cancel the remote child task");
                }
            }
        });
    }
}

/// Whether the remote task has an answer for the delegating tool: it rests by the engine's
/// definition, and not for an asynchronous tool of its own (that one calls back and the
/// remote run goes on). The remote queue is not visible from here; its length only matters
/// for that last rest, which does not end the wait anyway.
fn is_resting(task: &Task) -> bool {
    TaskRest::of(task, 0).is_some_and(|rest| rest.answers())
}

#[async_trait]
impl Tool for RemoteAgentTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"message": {"type": "string", "description": "What to ask the remote agent."}},
            "required": ["message"],
            "additionalProperties": false
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let text = args["message"].as_str().unwrap_or_default();
        if text.trim().is_empty() {
            return Err(AgentError::invalid_input("message", "must not be empty"));
        }
        let child = ctx.delegated_run(self.name.clone());
        let mut message = Message::user(text);
        message.metadata.insert(
            RUN_CONTEXT_KEY.into(),
            serde_json::to_value(&child).map_err(AgentError::internal)?,
        );
        let options = SendMessageOptions {
            return_immediately: true,
            history_length: Some(0),
        };
        let mut guard = CancelOnDrop::send(&self.client, message, options);
        let mut task = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                // Dropping the armed guard cancels the child the send creates.
                drop(guard);
                return Err(AgentError::Canceled { reason: PARENT_CANCELED_REASON.into() });
            }
            sent = guard.sent() => sent?,
        };
        while !is_resting(&task) {
            tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => {
                    // Dropping the armed guard sends CancelTask to the child.
                    drop(guard);
                    return Err(AgentError::Canceled { reason: PARENT_CANCELED_REASON.into() });
                }
                () = tokio::time::sleep(self.poll_interval) => {}
            }
            task = self.client.get_task(&task.id, Some(0)).await?;
        }
        guard.disarm();
        self.result_of(&task)
    }
}
