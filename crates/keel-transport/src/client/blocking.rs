//! The blocking client: [`BlockingClient`] runs [`A2aClient`]'s calls to completion on a
//! private runtime, for code that is not async (a UI thread, a signal handler's helper, a
//! plain `fn main`) and has to cancel or read a task another thread or process is running.

use keel_core::{AgentCard, AgentError, AgentResult, Message, Task, TaskId};

use super::{A2aClient, ClientBinding, HttpBinding};
use crate::transport::SendMessageOptions;

/// [`A2aClient`] without `async`: each method blocks the calling thread until the answer
/// arrives, with the same models, typed errors and retry layer as the async client.
///
/// A blocking call can only stop work that runs somewhere else — on another thread, in
/// another process, or on another agent: it cannot interrupt the call stack it blocks.
/// It is meant for threads that run no async code; on a `spawn_blocking` thread it works
/// too, but on an async worker it stalls that worker for the whole call (and on a
/// single-threaded runtime that serves the agent, forever): use [`A2aClient`] there.
///
/// ```no_run
/// use keel_core::TaskId;
/// use keel_transport::A2aClient;
/// # fn demo(task_id: TaskId) -> keel_core::AgentResult<()> {
/// let client = A2aClient::new("http://127.0.0.1:8080").blocking()?;
/// let task = client.cancel_task(&task_id, Some("the user pressed stop".into()))?;
/// println!("{} is {}", task.id, task.state());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct BlockingClient<B = HttpBinding> {
    client: A2aClient<B>,
    /// A current-thread runtime, driven only while a call blocks. `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
}

impl<B: ClientBinding> A2aClient<B> {
    /// This client as a [`BlockingClient`], with a runtime of its own to drive its calls.
    pub fn blocking(self) -> AgentResult<BlockingClient<B>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                AgentError::internal(format!("start the blocking client's runtime: {e}"))
            })?;
        Ok(BlockingClient {
            client: self,
            runtime: Some(runtime),
        })
    }
}

impl<B: ClientBinding> BlockingClient<B> {
    /// The async client underneath.
    pub fn client(&self) -> &A2aClient<B> {
        &self.client
    }

    /// Cancel a task; `reason` travels as `metadata.reason`. See [`A2aClient::cancel_task`].
    pub fn cancel_task(&self, task_id: &TaskId, reason: Option<String>) -> AgentResult<Task> {
        self.block_on(self.client.cancel_task(task_id, reason))
    }

    /// A task, with its last `history_length` messages when given. See
    /// [`A2aClient::get_task`].
    pub fn get_task(&self, task_id: &TaskId, history_length: Option<usize>) -> AgentResult<Task> {
        self.block_on(self.client.get_task(task_id, history_length))
    }

    /// Send a message. See [`A2aClient::send_message`].
    pub fn send_message(&self, message: Message, options: SendMessageOptions) -> AgentResult<Task> {
        self.block_on(self.client.send_message(message, options))
    }

    /// The agent's card. See [`A2aClient::get_card`].
    pub fn get_card(&self) -> AgentResult<AgentCard> {
        self.block_on(self.client.get_card())
    }

    /// Drive `call` to its end on the private runtime. A thread that belongs to an async
    /// runtime (a `spawn_blocking` thread, or worse a worker) may not start another runtime
    /// there, so the call is then driven on a short-lived thread of its own.
    fn block_on<T: Send>(
        &self,
        call: impl std::future::Future<Output = AgentResult<T>> + Send,
    ) -> AgentResult<T> {
        let Some(runtime) = &self.runtime else {
            return Err(AgentError::internal("the blocking client is shutting down"));
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return runtime.block_on(call);
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| runtime.block_on(call))
                .join()
                .unwrap_or_else(|_| Err(AgentError::internal("a blocking client call panicked")))
        })
    }
}

impl<B> Drop for BlockingClient<B> {
    /// Shut the runtime down without waiting, so dropping the client inside async code (where
    /// a runtime's normal drop would panic) is safe.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
