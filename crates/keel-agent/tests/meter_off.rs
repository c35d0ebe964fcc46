//! A process that installed a `metrics` recorder but did not turn the run meter on
//! (`keel_agent::meter::enable`) has nothing of its runs counted: no metric is registered,
//! so no label is built per event. Its own test binary, since the switch is process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor};
use keel_core::{AgentCard, Message, TaskState};
use keel_llm::MockLlm;
use keel_runtime::{Runtime, Services};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Counts how many metrics were registered (each macro call registers one).
#[derive(Default)]
struct Registrations(AtomicUsize);

impl Recorder for &'static Registrations {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        self.0.fetch_add(1, Ordering::SeqCst);
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        self.0.fetch_add(1, Ordering::SeqCst);
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        self.0.fetch_add(1, Ordering::SeqCst);
        Histogram::noop()
    }
}

async fn one_run(exec: &AgentExecutor, runtime: &Arc<dyn Runtime>) {
    let auth = runtime.auth_service().auth_context();
    let task = exec
        .send_message(&auth, Message::user("hello"), Default::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
}

#[tokio::test]
async fn runs_register_no_metric_until_the_meter_is_enabled() {
    let seen: &'static Registrations = Box::leak(Box::default());
    metrics::set_global_recorder(seen).unwrap();
    let runtime: Arc<dyn Runtime> = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let agent = Agent::builder(AgentCard::new("quiet", "answers", "http://127.0.0.1:0"))
        .llm(MockLlm::new())
        .build()
        .unwrap();
    let exec = AgentExecutor::new(agent, runtime.clone());

    one_run(&exec, &runtime).await;
    assert_eq!(
        seen.0.load(Ordering::SeqCst),
        0,
        "a run was counted while off"
    );

    keel_agent::meter::enable();
    one_run(&exec, &runtime).await;
    assert!(
        seen.0.load(Ordering::SeqCst) > 0,
        "an enabled meter counts runs"
    );
}
