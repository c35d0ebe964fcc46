//! What a client binding does: carry one request of the A2A operations to an agent and bring
//! back its answer or its stream. [`A2aClient`](crate::A2aClient) writes the operations once
//! over this trait; HTTP, the WebSocket and the in-process transport each implement it.

use async_trait::async_trait;
use keel_core::{AgentCard, AgentError, AgentResult, Message, Task, TaskId, TraceParent};
use serde_json::Value;

use crate::stream::StreamEvent;
use crate::task_list::{TaskList, TaskListQuery};
use crate::transport::{SendMessageOptions, TaskEventStream};
use crate::wire;

/// One operation, as each binding names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
}

impl Call {
    /// The A2A method name.
    pub fn method(self) -> &'static str {
        match self {
            Call::SendMessage => "SendMessage",
            Call::SendStreamingMessage => "SendStreamingMessage",
            Call::GetTask => "GetTask",
            Call::ListTasks => "ListTasks",
            Call::CancelTask => "CancelTask",
            Call::SubscribeToTask => "SubscribeToTask",
        }
    }

    /// Whether repeating the call cannot do anything twice: reads and cancel (canceling a
    /// canceled task changes nothing). SendMessage is not: a lost answer may hide a
    /// delivered message.
    pub fn is_idempotent(self) -> bool {
        matches!(self, Call::GetTask | Call::ListTasks | Call::CancelTask)
    }
}

/// A unary request, in Keel's models.
#[derive(Debug, Clone)]
pub enum Request {
    /// Send a message, blocking unless `options.return_immediately`.
    SendMessage {
        message: Message,
        options: SendMessageOptions,
    },
    /// A task, with its last `history_length` messages when given.
    GetTask {
        task_id: TaskId,
        history_length: Option<usize>,
    },
    /// One page of the agent's tasks.
    ListTasks(TaskListQuery),
    /// Cancel a task, with an optional reason.
    CancelTask {
        task_id: TaskId,
        reason: Option<String>,
    },
}

impl Request {
    /// The operation.
    pub fn call(&self) -> Call {
        match self {
            Request::SendMessage { .. } => Call::SendMessage,
            Request::GetTask { .. } => Call::GetTask,
            Request::ListTasks(_) => Call::ListTasks,
            Request::CancelTask { .. } => Call::CancelTask,
        }
    }

    /// The task the request names, for typing a task error.
    pub fn task_id(&self) -> Option<&TaskId> {
        match self {
            Request::SendMessage { message, .. } => message.task_id.as_ref(),
            Request::GetTask { task_id, .. } | Request::CancelTask { task_id, .. } => Some(task_id),
            Request::ListTasks(_) => None,
        }
    }

    /// The W3C trace to send with the request: a message carrying a delegated run's context
    /// names the trace and the delegating tool call's span.
    pub fn trace(&self) -> Option<(TraceParent, Option<String>)> {
        match self {
            Request::SendMessage { message, .. } => trace_of(message),
            _ => None,
        }
    }

    /// The v1.0 params of the request.
    pub fn params(&self) -> Value {
        match self {
            Request::SendMessage { message, options } => wire::encode_send_message(
                message,
                options.return_immediately,
                options.history_length,
            ),
            Request::GetTask {
                task_id,
                history_length,
            } => wire::encode_get_task(task_id, *history_length),
            Request::ListTasks(query) => wire::encode_list_tasks(query),
            Request::CancelTask { task_id, reason } => {
                wire::encode_cancel_task(task_id, reason.as_deref())
            }
        }
    }

    /// The v1.0 result of the request in Keel's models.
    pub fn decode(&self, result: Value) -> AgentResult<Reply> {
        Ok(match self {
            Request::SendMessage { .. } => {
                Reply::Task(Box::new(wire::decode_send_message_result(result)?))
            }
            Request::GetTask { .. } | Request::CancelTask { .. } => {
                Reply::Task(Box::new(wire::decode_task(result)?))
            }
            Request::ListTasks(_) => Reply::Tasks(wire::decode_list_tasks_result(result)?),
        })
    }
}

/// A request answered by a stream of task events.
#[derive(Debug, Clone)]
pub enum StreamRequest {
    /// Send a message and follow its task.
    SendStreamingMessage(Message),
    /// Follow a task that is not terminal.
    Subscribe(TaskId),
}

impl StreamRequest {
    /// The operation.
    pub fn call(&self) -> Call {
        match self {
            StreamRequest::SendStreamingMessage(_) => Call::SendStreamingMessage,
            StreamRequest::Subscribe(_) => Call::SubscribeToTask,
        }
    }

    /// The task the request names, for typing a task error.
    pub fn task_id(&self) -> Option<&TaskId> {
        match self {
            StreamRequest::SendStreamingMessage(message) => message.task_id.as_ref(),
            StreamRequest::Subscribe(task_id) => Some(task_id),
        }
    }

    /// The W3C trace to send with the request (see [`Request::trace`]).
    pub fn trace(&self) -> Option<(TraceParent, Option<String>)> {
        match self {
            StreamRequest::SendStreamingMessage(message) => trace_of(message),
            StreamRequest::Subscribe(_) => None,
        }
    }

    /// Whether the stream ends after `event`: a message's stream at the first terminal or
    /// interrupted status, a subscription only at a terminal one (A2A v1.0, 3.1.6).
    pub fn ends_at(&self, event: &StreamEvent) -> bool {
        match self {
            StreamRequest::SendStreamingMessage(_) => event.is_final(),
            StreamRequest::Subscribe(_) => event.ends_subscription(),
        }
    }

    /// The v1.0 params of the request.
    pub fn params(&self) -> Value {
        match self {
            StreamRequest::SendStreamingMessage(message) => {
                wire::encode_send_message(message, false, None)
            }
            StreamRequest::Subscribe(task_id) => wire::encode_subscribe(task_id),
        }
    }
}

/// The answer to a unary request.
#[derive(Debug)]
pub enum Reply {
    /// A task (SendMessage, GetTask, CancelTask).
    Task(Box<Task>),
    /// A page of tasks (ListTasks).
    Tasks(TaskList),
}

impl Reply {
    pub(crate) fn into_task(self) -> AgentResult<Task> {
        match self {
            Reply::Task(task) => Ok(*task),
            Reply::Tasks(_) => Err(AgentError::internal("a page of tasks answered a task call")),
        }
    }

    pub(crate) fn into_tasks(self) -> AgentResult<TaskList> {
        match self {
            Reply::Tasks(tasks) => Ok(tasks),
            Reply::Task(_) => Err(AgentError::internal("a task answered ListTasks")),
        }
    }
}

/// Why one attempt failed, which decides whether the retry layer tries again.
#[derive(Debug)]
pub enum Failure {
    /// Nothing reached the agent (the card fetch that finds the endpoint failed on its
    /// connection): any request may be tried again.
    NotSent(AgentError),
    /// The connection was lost or refused before an answer arrived: tried again when the
    /// request is idempotent.
    Connection(AgentError),
    /// An answer, even an error or a malformed one: final.
    Answer(AgentError),
}

impl Failure {
    /// The error, whatever the kind of failure.
    pub fn into_error(self) -> AgentError {
        match self {
            Failure::NotSent(err) | Failure::Connection(err) | Failure::Answer(err) => err,
        }
    }

    /// Whether another attempt may help, for a call that is `idempotent` or not.
    pub(crate) fn is_retryable(&self, idempotent: bool) -> bool {
        match self {
            Failure::NotSent(_) => true,
            Failure::Connection(_) => idempotent,
            Failure::Answer(_) => false,
        }
    }
}

impl From<AgentError> for Failure {
    fn from(err: AgentError) -> Self {
        Failure::Answer(err)
    }
}

/// The per-binding part of a client: the card, a unary request, a stream.
#[async_trait]
pub trait ClientBinding: Send + Sync {
    /// The agent's card.
    async fn card(&self) -> Result<AgentCard, Failure>;

    /// Send a unary request and return its answer.
    async fn send(&self, request: Request) -> Result<Reply, Failure>;

    /// Open a stream; an error before the stream starts is the call's.
    async fn open_stream(&self, request: StreamRequest) -> AgentResult<TaskEventStream>;
}

/// The `traceparent` (and `tracestate`) of a message that carries a run context naming its
/// parent span: the trace a delegated run joins, under the delegating call's span.
fn trace_of(message: &Message) -> Option<(TraceParent, Option<String>)> {
    let context = message.metadata.get(keel_core::RUN_CONTEXT_KEY)?;
    let trace = context.get("trace_id")?.as_str()?;
    let span_id = keel_core::SpanId::parse(context.get("parent_span_id")?.as_str()?)?;
    let parent = TraceParent {
        trace_id: keel_core::W3cTraceId::of(&keel_core::TraceId::from(trace)),
        span_id,
        sampled: true,
    };
    let state = context
        .get("trace_state")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some((parent, state))
}
