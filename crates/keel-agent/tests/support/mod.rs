//! What several of keel-agent's test binaries set up alike: an agent's executor on an
//! in-memory runtime, with the events of its runs collected, and the report a run stored.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor};
use keel_core::RunId;
use keel_events::InMemoryEventSink;
use keel_llm::MockLlm;
use keel_runtime::{AuthContext, RunRecord, Runtime, Services};

/// An executor for `agent` on an in-memory runtime, the runtime's caller, and a sink that
/// collects every event of its runs.
pub fn executor(agent: Agent) -> (AgentExecutor, AuthContext, Arc<InMemoryEventSink>) {
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let auth = runtime.auth_service().auth_context();
    let exec = AgentExecutor::new(agent, runtime);
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    (exec, auth, sink)
}

/// The run report `exec`'s run store holds for `run`.
pub async fn stored_report(exec: &AgentExecutor, auth: &AuthContext, run: &RunId) -> RunRecord {
    exec.runtime()
        .run_store()
        .get_run_report(auth, run)
        .await
        .unwrap()
        .expect("the run's report is stored")
}
