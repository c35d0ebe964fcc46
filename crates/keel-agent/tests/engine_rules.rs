//! The engine's rules, proven on every durable backend the engine can run on: the same tests
//! run against the in-memory store and against SQLite (a real file). The cross-process rules
//! are proven on Redis by keel-cli's multi-process tests.

use std::sync::Arc;

use keel_llm::MockLlm;
use keel_runtime::{InMemoryRuntime, Runtime};

mod memory {
    use super::*;

    pub(crate) fn runtime() -> Arc<dyn Runtime> {
        Arc::new(InMemoryRuntime::new(Arc::new(MockLlm::new())))
    }

    mod engine {
        include!("rules/engine.rs");
    }
    mod thread_engine {
        include!("rules/thread_engine.rs");
    }
    mod subagents {
        include!("rules/subagents.rs");
    }
    mod async_tools {
        include!("rules/async_tools.rs");
    }
    mod effects {
        include!("rules/effects.rs");
    }
}

mod sqlite {
    use super::*;

    /// A runtime whose tasks, threads, memory and run records live in a fresh SQLite file.
    pub(crate) fn runtime() -> Arc<dyn Runtime> {
        // Leaked so the file outlives the test's runtime (the OS cleans the temp dir).
        let dir = Box::leak(Box::new(tempfile::tempdir().expect("a temp dir")));
        let store = Arc::new(
            keel_store_sqlite::SqliteStore::open(dir.path().join("keel.db")).expect("open SQLite"),
        );
        Arc::new(
            InMemoryRuntime::new(Arc::new(MockLlm::new()))
                .with_task_manager(store.clone())
                .with_memory_service(store.clone())
                .with_thread_store(store.clone())
                .with_thread_timers(store.clone())
                .with_async_call_store(store.clone())
                .with_run_store(store),
        )
    }

    mod engine {
        include!("rules/engine.rs");
    }
    mod thread_engine {
        include!("rules/thread_engine.rs");
    }
    mod subagents {
        include!("rules/subagents.rs");
    }
    mod async_tools {
        include!("rules/async_tools.rs");
    }
    mod effects {
        include!("rules/effects.rs");
    }
}
