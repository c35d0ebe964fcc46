//! The engine's rules, proven on every backend the engine can run on: the same tests run
//! against the in-memory store, against SQLite (a real file), against Redis (the server at
//! `REDIS_URL`, default `redis://127.0.0.1:6379`, each test under its own key prefix) and
//! against PostgreSQL (the server at `KEEL_POSTGRES_URL`, each test in its own schema). The
//! cross-process rules are also proven on Redis and PostgreSQL by keel-cli's multi-process
//! tests.

use std::sync::Arc;

use keel_core::AgentResult;
use keel_llm::MockLlm;
use keel_runtime::{AuthContext, AuthService, Credentials, Runtime, Services};

/// Every rule file, as a module of the backend module it is invoked in: each rule test calls
/// that backend's `runtime()` through `super::runtime()`.
macro_rules! rules {
    () => {
        mod fixture {
            include!("rules/fixture.rs");
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
        mod compaction {
            include!("rules/compaction.rs");
        }
        mod explicit_parts {
            include!("rules/explicit_parts.rs");
        }
        mod reads {
            include!("rules/reads.rs");
        }
        mod budgets_and_subscriptions {
            include!("rules/budgets_and_subscriptions.rs");
        }
        mod one_report_fixture {
            include!("rules/one_report_fixture.rs");
        }
        mod one_report {
            include!("rules/one_report.rs");
        }
        mod shutdown {
            include!("rules/shutdown.rs");
        }
        mod replay_fixture {
            include!("rules/replay_fixture.rs");
        }
        mod replay {
            include!("rules/replay.rs");
        }
    };
}

/// The Redis tests' own support (the server at `REDIS_URL`, SCAN and cleanup of a prefix),
/// shared rather than written again.
#[path = "../../keel-store-redis/tests/support/mod.rs"]
mod redis_support;

/// A runtime of its own that outlives every test, for the backends whose data (a Redis
/// connection, PostgreSQL schemas) is set up and cleaned up outside any one test: the rule
/// tests each build their own tokio runtime (and drop it at the end), while `runtime()` is
/// synchronous.
fn driver() -> &'static tokio::runtime::Runtime {
    static DRIVER: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    DRIVER.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the backends' setup and cleanup")
    })
}

/// Run `work` on the driver, from inside a test's runtime (where `block_on` is refused).
fn on_driver<T: Send + 'static>(work: impl std::future::Future<Output = T> + Send + 'static) -> T {
    let driver = driver().handle().clone();
    std::thread::spawn(move || driver.block_on(work))
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// `services` as a runtime whose caller also runs `cleanup` (deleting the test's keys or
/// schema) when it goes: the runtime holds its caller to its end, so the test's data goes
/// with the last handle on the runtime (or just after, when a part of the engine still held
/// the caller).
fn cleaned_up(
    mut services: Services,
    cleanup: impl FnOnce() + Send + Sync + 'static,
) -> Arc<dyn Runtime> {
    services.auth = Arc::new(CleanupOnDrop {
        auth: services.auth,
        cleanup: Some(Box::new(cleanup)),
    });
    Arc::new(services)
}

/// A caller that runs its cleanup when dropped; see [`cleaned_up`].
struct CleanupOnDrop {
    auth: Arc<dyn AuthService>,
    cleanup: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl AuthService for CleanupOnDrop {
    fn auth_context(&self) -> AuthContext {
        self.auth.auth_context()
    }
    fn authenticate(&self, credentials: &Credentials) -> AgentResult<Option<AuthContext>> {
        self.auth.authenticate(credentials)
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            // Not a rule failure when it fails, and a panic here could abort the runtime's
            // shutdown: each cleanup reports what it left instead.
            cleanup();
        }
    }
}

mod memory {
    use super::*;

    pub(crate) fn runtime() -> Arc<dyn Runtime> {
        Arc::new(Services::in_memory(Arc::new(MockLlm::new())))
    }

    rules!();
}

mod sqlite {
    use super::*;

    /// A runtime whose tasks, threads, memory and run records live in a fresh SQLite file.
    pub(crate) fn runtime() -> Arc<dyn Runtime> {
        // Leaked so the file outlives the test's runtime (the OS cleans the temp dir).
        let dir = Box::leak(Box::new(tempfile::tempdir().expect("a temp dir")));
        let store =
            keel_store_sqlite::SqliteStore::open(dir.path().join("keel.db")).expect("open SQLite");
        Arc::new(store.services(Arc::new(MockLlm::new())))
    }

    rules!();

    mod ending {
        //! A run comes to rest in one write where the step store folds it: the final status
        //! and the run's report commit together (decision 278).

        use std::sync::atomic::{AtomicUsize, Ordering};

        use super::*;
        use async_trait::async_trait;
        use keel_agent::{Agent, AgentExecutor, SendOptions};
        use keel_core::conversation::LlmMessage;
        use keel_core::stored::JsonText;
        use keel_core::{AgentCard, Message, Task, TaskEvent, TaskState};
        use keel_runtime::{Lease, RunRecord, StepStore, TaskWrite};
        use keel_store_sqlite::SqliteStore;

        /// SQLite's step store for the steps and the endings, counting the endings (the other
        /// folds are left to their defaults, the writes one after the other).
        struct Endings {
            store: SqliteStore,
            endings: Arc<AtomicUsize>,
        }

        #[async_trait]
        impl StepStore for Endings {
            async fn persist_step(
                &self,
                auth: &AuthContext,
                lease: &Lease,
                history: &[LlmMessage],
                task: &Task,
                write: TaskWrite,
                events: &[TaskEvent],
            ) -> AgentResult<()> {
                let store = &self.store;
                store
                    .persist_step(auth, lease, history, task, write, events)
                    .await
            }

            async fn save_task_and_run(
                &self,
                auth: &AuthContext,
                task: &Task,
                events: &[TaskEvent],
                record: &RunRecord,
                report: &JsonText,
            ) -> AgentResult<()> {
                self.endings.fetch_add(1, Ordering::SeqCst);
                let store = &self.store;
                store
                    .save_task_and_run(auth, task, events, record, report)
                    .await
            }
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_run_rests_with_its_report_in_one_write() {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::open(dir.path().join("keel.db")).unwrap();
            let endings = Arc::new(AtomicUsize::new(0));
            let steps = Endings {
                store: store.clone(),
                endings: endings.clone(),
            };
            let llm = Arc::new(MockLlm::new());
            let services =
                Services::from_store(store.clone(), Default::default(), llm).with_steps(steps);
            let runtime: Arc<dyn Runtime> = Arc::new(services);
            let auth = runtime.auth_service().auth_context();
            let card = AgentCard::new("echo", "echoes", "http://127.0.0.1:0");
            let exec = AgentExecutor::new(Agent::builder(card).build().unwrap(), runtime.clone());
            let task = exec
                .send_message(&auth, Message::user("hi"), SendOptions::default())
                .await
                .unwrap();
            assert_eq!(task.state(), TaskState::Completed);
            assert_eq!(endings.load(Ordering::SeqCst), 1, "one folded ending");
            let ctx = keel_core::RunContext::from_task(&task).unwrap().unwrap();
            let record = runtime
                .run_store()
                .get_run_report(&auth, &ctx.run_id)
                .await
                .unwrap();
            let record = record.expect("the run's report is stored with its ending");
            assert_eq!(record.task_id.as_ref(), Some(&task.id));
            assert!(record.report.is_object(), "{:?}", record.report);
        }
    }
}

mod redis {
    //! Redis: the server at `REDIS_URL`, which CI always provides (`cargo xtask ci` starts
    //! one when none answers); without one every test here fails naming `REDIS_URL`.

    use super::*;
    use crate::redis_support;

    use std::sync::OnceLock;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use keel_store_redis::RedisStore;

    /// What every test prefix starts with; the sweep below only ever touches such keys.
    const PREFIX_ROOT: &str = "keel-rules-";
    /// Keys of a prefix older than this are a crashed run's leftovers and are deleted.
    const STALE_AFTER: Duration = Duration::from_secs(3600);

    /// The connected store, its connection driven by the [`driver`] so that it outlives
    /// every test; each test shares it under a prefix of its own, as one process's services
    /// share one store.
    fn shared() -> &'static RedisStore {
        static SHARED: OnceLock<RedisStore> = OnceLock::new();
        SHARED.get_or_init(|| {
            on_driver(async {
                let url = redis_support::redis_url();
                let store = match RedisStore::connect(&url).await {
                    Ok(store) => store,
                    Err(err) => panic!(
                        "the engine's Redis rule tests need a server at REDIS_URL ({url}), and \
                         it did not answer: {err}\nstart one (e.g. `redis-server --appendonly \
                         yes`), point REDIS_URL at one, or run `cargo xtask ci`, which starts one"
                    ),
                };
                sweep_stale_prefixes().await;
                store
            })
        })
    }

    /// Delete what runs that died before cleaning up left behind: their prefixes carry the
    /// time they were made, and no rule test runs for an hour.
    async fn sweep_stale_prefixes() {
        let keys = redis_support::keys_under(PREFIX_ROOT).await;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let stale: Vec<String> = keys
            .into_iter()
            .filter(|key| {
                key[PREFIX_ROOT.len()..]
                    .split('-')
                    .next()
                    .and_then(|secs| secs.parse::<u64>().ok())
                    .is_some_and(|made| now.saturating_sub(made) > STALE_AFTER.as_secs())
            })
            .collect();
        redis_support::delete_keys(&stale).await;
    }

    /// A runtime wired as `DefaultRuntime` wires Redis (task manager, memory, thread store,
    /// step store, thread timers, async call store, run store) under a fresh key prefix, so
    /// tests and parallel runs never see each other's data, system keys included. The keys
    /// are deleted when the last handle on the runtime goes.
    pub(crate) fn runtime() -> Arc<dyn Runtime> {
        let made = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let prefix = format!("{PREFIX_ROOT}{made}-{}:", uuid::Uuid::new_v4().simple());
        let services = shared()
            .clone()
            .with_prefix(prefix.clone())
            .services(Arc::new(MockLlm::new()));
        cleaned_up(services, move || {
            let cleaned = std::panic::catch_unwind(|| {
                let prefix = prefix.clone();
                on_driver(async move { redis_support::clean_up(&prefix).await })
            });
            if cleaned.is_err() {
                // The next run's sweep deletes them once they are stale.
                eprintln!("could not delete the test's keys under {prefix}");
            }
        })
    }

    rules!();
}

mod postgres {
    //! PostgreSQL: the server at `KEEL_POSTGRES_URL`, which CI always provides (`cargo xtask
    //! ci` starts one when none answers); without one every test here fails naming it.

    use super::*;

    use keel_store_postgres::testing::TestSchema;

    /// A runtime wired as `DefaultRuntime` wires PostgreSQL, in a fresh schema that is
    /// dropped when the last handle on the runtime goes.
    pub(crate) fn runtime() -> Arc<dyn Runtime> {
        let (schema, store) = on_driver(async {
            let schema = TestSchema::new().await?;
            let store = schema.store().await?;
            AgentResult::Ok((schema, store))
        })
        .unwrap_or_else(|err| {
            panic!("the engine's PostgreSQL rule tests need a server at KEEL_POSTGRES_URL: {err}")
        });
        cleaned_up(store.services(Arc::new(MockLlm::new())), move || {
            let name = schema.name.clone();
            if on_driver(schema.drop_schema()).is_err() {
                eprintln!("could not drop the test schema {name}");
            }
        })
    }

    rules!();

    /// Only a store that announces its commits hears another process at once.
    mod heard {
        include!("rules/heard.rs");
    }
}
