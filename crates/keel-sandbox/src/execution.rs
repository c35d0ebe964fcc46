//! The handle of one execution: awaiting its result and terminating it from any task.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::isolate::{self, Outcome};
use crate::request::CodeExecutionRequest;
use crate::result::{
    CodeExecutionResult, ConsoleLevel, ConsoleLine, ExecutionError, ExecutionStatus,
};
use crate::value::HostResult;

/// How much console output one execution may capture (1 MiB of text, 10 000 lines);
/// past it lines are dropped and `console_truncated` is set.
pub const MAX_CONSOLE_BYTES: usize = 1024 * 1024;
const MAX_CONSOLE_LINES: usize = 10_000;

/// The isolate's thread stack; QuickJS's own stack limit is well below it.
const ISOLATE_THREAD_STACK: usize = 8 * 1024 * 1024;

/// What wakes the isolate's thread while it waits.
pub(crate) enum Event {
    /// A host function's future finished.
    HostDone { id: f64, result: HostResult },
    /// `terminate` was called.
    Terminate,
}

#[derive(Default)]
struct ConsoleBuffer {
    lines: Vec<ConsoleLine>,
    bytes: usize,
    truncated: bool,
}

/// State seen by both the handle and the isolate's thread.
pub(crate) struct Shared {
    terminate: AtomicBool,
    reason: Mutex<Option<String>>,
    console: Mutex<ConsoleBuffer>,
    outcome: watch::Sender<Option<Arc<CodeExecutionResult>>>,
}

impl Shared {
    fn new() -> Self {
        Self {
            terminate: AtomicBool::new(false),
            reason: Mutex::new(None),
            console: Mutex::new(ConsoleBuffer::default()),
            outcome: watch::Sender::new(None),
        }
    }

    pub fn terminate_requested(&self) -> bool {
        self.terminate.load(Ordering::Acquire)
    }

    /// The message of a caller-initiated termination: the reason, when one was given.
    pub fn termination_message(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "terminated by the caller".to_owned())
    }

    pub fn push_console(&self, level: ConsoleLevel, message: String) {
        let mut console = self.console.lock().unwrap_or_else(PoisonError::into_inner);
        if console.truncated
            || console.lines.len() >= MAX_CONSOLE_LINES
            || console.bytes + message.len() > MAX_CONSOLE_BYTES
        {
            console.truncated = true;
            return;
        }
        console.bytes += message.len();
        console.lines.push(ConsoleLine { level, message });
    }

    fn console_snapshot(&self) -> (Vec<ConsoleLine>, bool) {
        let console = self.console.lock().unwrap_or_else(PoisonError::into_inner);
        (console.lines.clone(), console.truncated)
    }

    fn is_settled(&self) -> bool {
        self.outcome.borrow().is_some()
    }

    /// Settles once; later calls are ignored. Returns whether this call settled.
    fn settle(
        &self,
        status: ExecutionStatus,
        value: crate::SandboxValue,
        error: Option<ExecutionError>,
    ) -> bool {
        let (console, console_truncated) = self.console_snapshot();
        let result = CodeExecutionResult {
            status,
            result: value,
            error,
            console,
            console_truncated,
        };
        let settled = self.outcome.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(Arc::new(result));
            true
        });
        if settled {
            tracing::debug!(status = status.as_str(), "run_code settled");
        }
        settled
    }
}

/// Starts a sandboxed execution (§13) and returns its handle at once.
///
/// The code runs in a fresh QuickJS isolate on a thread of its own; host functions run on
/// the tokio runtime current at this call (if there is none, calling one rejects inside the
/// sandbox). Nothing here blocks the caller.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use keel_sandbox::{run_code, CodeExecutionRequest, ExecutionStatus, SandboxValue};
/// let execution = run_code(CodeExecutionRequest::new(
///     "const xs: number[] = [1, 2, 3];\nexport default xs.reduce((a, b) => a + b, 0);",
/// ));
/// let result = execution.result().await;
/// assert_eq!(result.status, ExecutionStatus::Success);
/// assert_eq!(result.result, SandboxValue::Number(6.0));
/// # }
/// ```
pub fn run_code(request: CodeExecutionRequest) -> CodeExecution {
    let shared = Arc::new(Shared::new());
    let (sender, events) = mpsc::channel();
    let tokio = tokio::runtime::Handle::try_current().ok();
    let span = tracing::debug_span!("run_code", filename = %request.filename);
    let thread_shared = Arc::clone(&shared);
    let thread_sender = sender.clone();
    let spawned = std::thread::Builder::new()
        .name("keel-sandbox".to_owned())
        .stack_size(ISOLATE_THREAD_STACK)
        .spawn(move || {
            let _entered = span.enter();
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                isolate::run(request, &thread_shared, &events, &thread_sender, tokio)
            }))
            .unwrap_or_else(|_| Outcome {
                status: ExecutionStatus::Error,
                value: crate::SandboxValue::Undefined,
                error: Some(ExecutionError::new(
                    "InternalError",
                    "the sandbox failed unexpectedly",
                )),
            });
            thread_shared.settle(outcome.status, outcome.value, outcome.error);
        });
    if let Err(e) = spawned {
        shared.settle(
            ExecutionStatus::Error,
            crate::SandboxValue::Undefined,
            Some(ExecutionError::new(
                "InternalError",
                format!("could not start the sandbox thread: {e}"),
            )),
        );
    }
    CodeExecution {
        inner: Arc::new(Inner { shared, sender }),
    }
}

struct Inner {
    shared: Arc<Shared>,
    sender: Sender<Event>,
}

impl Inner {
    fn terminate(&self, reason: Option<&str>) {
        if self.shared.is_settled() || self.shared.terminate.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(reason) = reason {
            *self
                .shared
                .reason
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(reason.to_owned());
        }
        // Settle now: the handle never waits on the isolate to notice. The isolate stops at
        // its next interrupt check (microseconds in a loop) or wakes from its wait at once.
        let message = self.shared.termination_message();
        self.shared.settle(
            ExecutionStatus::Terminated,
            crate::SandboxValue::Undefined,
            Some(ExecutionError::new("TerminationError", message)),
        );
        let _ = self.sender.send(Event::Terminate);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Nobody can observe the result any more: stop the isolate instead of leaking it.
        self.terminate(Some("the execution handle was dropped"));
    }
}

/// The handle of one execution (§13.9 item 1): await its result, or terminate it.
///
/// Clones share the execution; when the last clone is dropped an unsettled execution is
/// terminated.
#[derive(Clone)]
pub struct CodeExecution {
    inner: Arc<Inner>,
}

impl CodeExecution {
    /// Asks the sandbox to stop; the handle settles as `terminated` at once, with `reason`
    /// (when given) as the error message. Idempotent: later calls, and calls after the
    /// execution settled, do nothing.
    pub fn terminate(&self, reason: Option<&str>) {
        self.inner.terminate(reason);
    }

    /// Waits for the settled result.
    pub async fn result(&self) -> CodeExecutionResult {
        let mut rx = self.inner.shared.outcome.subscribe();
        let settled = rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|slot| slot.as_ref().map(Arc::clone));
        match settled {
            Some(result) => (*result).clone(),
            // Unreachable: `Shared` (and so the sender) lives as long as this handle.
            None => CodeExecutionResult::terminated("the execution vanished", Vec::new()),
        }
    }

    /// The result, if the execution has settled.
    pub fn try_result(&self) -> Option<CodeExecutionResult> {
        self.inner
            .shared
            .outcome
            .borrow()
            .as_ref()
            .map(|r| (**r).clone())
    }

    /// Whether the execution has settled.
    pub fn is_settled(&self) -> bool {
        self.inner.shared.is_settled()
    }
}

impl std::fmt::Debug for CodeExecution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeExecution")
            .field("settled", &self.is_settled())
            .finish_non_exhaustive()
    }
}
