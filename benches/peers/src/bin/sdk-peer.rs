//! An echo agent on the official Rust A2A SDK's server (`a2a-server-lf`): its JSON-RPC router,
//! its default request handler and its in-memory task store, with an executor that completes
//! each task at once with the user's text as the agent's answer. The SDK as a user would
//! take it off the shelf.

use std::sync::Arc;

use a2a::{
    A2AError, AgentCapabilities, Message, Part, Role, StreamResponse, Task, TaskState, TaskStatus,
};
use a2a_server::{AgentExecutor, DefaultRequestHandler, ExecutorContext, InMemoryTaskStore};
use futures::stream::{self, BoxStream};

/// Answers every message with its own parts, completing the task in one event.
struct Echo;

impl AgentExecutor for Echo {
    fn execute(
        &self,
        ctx: ExecutorContext,
    ) -> BoxStream<'static, Result<StreamResponse, A2AError>> {
        let parts = ctx
            .message
            .as_ref()
            .map(|m| m.parts.clone())
            .unwrap_or_else(|| vec![Part::text("")]);
        let mut answer = Message::new(Role::Agent, parts);
        answer.context_id = Some(ctx.context_id.clone());
        answer.task_id = Some(ctx.task_id.clone());
        let task = Task {
            id: ctx.task_id,
            context_id: ctx.context_id,
            status: TaskStatus {
                state: TaskState::Completed,
                message: Some(answer),
                timestamp: None,
            },
            artifacts: None,
            history: ctx.message.map(|m| vec![m]),
            metadata: None,
        };
        Box::pin(stream::once(async move { Ok(StreamResponse::Task(task)) }))
    }

    fn cancel(&self, ctx: ExecutorContext) -> BoxStream<'static, Result<StreamResponse, A2AError>> {
        let task = Task {
            id: ctx.task_id,
            context_id: ctx.context_id,
            status: TaskStatus {
                state: TaskState::Canceled,
                message: None,
                timestamp: None,
            },
            artifacts: None,
            history: None,
            metadata: None,
        };
        Box::pin(stream::once(async move { Ok(StreamResponse::Task(task)) }))
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let handler = DefaultRequestHandler::new(Echo, InMemoryTaskStore::new()).with_capabilities(
        AgentCapabilities {
            streaming: Some(true),
            ..AgentCapabilities::default()
        },
    );
    let router = a2a_server::jsonrpc::jsonrpc_router(Arc::new(handler));
    let listener = a2a_bench_peers::bind("sdk-peer").await?;
    axum::serve(listener, router).await
}
