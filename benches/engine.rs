//! `cargo xtask bench engine`: what the thread engine costs per step. With the offline model
//! and the in-memory store it prints the engine's own overhead per step (one model call plus
//! one tool call, every message persisted, every event emitted); on SQLite and Redis it prints
//! persisted steps/s at 1 and 64 concurrent threads, each beside the raw store ceiling
//! measured in the same run (SQLite commits/s on one connection, Redis `SET`s/s at the same
//! concurrency; see `store_bench::ceiling`). Asserts nothing.
//!
//! Settings: `KEEL_BENCH_SECS` (seconds per figure, default 2), `KEEL_BENCH_STEPS` (steps per
//! task, default 10), `KEEL_BENCH_BACKENDS` (a comma-separated subset of
//! `memory,sqlite,redis,postgres`, default all) and `KEEL_BENCH_THREADS` (the concurrencies, default
//! `1,64`): the last two pick one row to run under a profiler. With the memory backend and a
//! concurrency of 1, it first prints the engine's overhead alone: one task at a time on one
//! tokio thread, tasks of `KEEL_BENCH_STEPS` steps against tasks of one step, which separates
//! what a step costs from what a task costs besides its steps; `KEEL_BENCH_REPEAT=N` runs
//! that section N times and prints each figure's minimum and median, which a noisy machine
//! needs (the same build's single readings differ by a third there). `KEEL_BENCH_REPORT=path`
//! writes one task's run report there and prints its size; `KEEL_BENCH_WORKERS=1` runs the
//! table on one tokio thread too (a current-thread runtime), leaving out cross-thread
//! wake-ups. `REDIS_URL`, `KEEL_POSTGRES_URL` (PostgreSQL: statements per step and per
//! `SendMessage` printed beside its row).

/// The allocator `keel serve` runs on, so the figures are the server's (feature `mimalloc`,
/// on by default; `--no-default-features` measures the system allocator).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Which allocator the figures are for.
const ALLOCATOR_NAME: &str = if cfg!(feature = "mimalloc") {
    "mimalloc, as keel serve"
} else {
    "the system allocator"
};

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, AgentResult, Message, ThreadId};
use keel_llm::{Llm, LlmRequest, LlmResponse, LlmRole, ToolCall};
use keel_runtime::{Runtime, Services};
use serde_json::{json, Value};
use store_bench::count_from_env;

/// Steps per task: each step is one model call that asks for the `noop` tool. Set once from
/// `KEEL_BENCH_STEPS` (default 10): comparing 1 with 10 separates what a task costs once from
/// what each step costs.
static STEPS_PER_TASK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn steps_per_task() -> usize {
    *STEPS_PER_TASK.get_or_init(|| count_from_env("KEEL_BENCH_STEPS", 10))
}

/// A model that asks for `noop` until the task has had `steps` steps, then answers.
struct LoopLlm {
    steps: usize,
}

#[async_trait]
impl Llm for LoopLlm {
    fn model_name(&self) -> &str {
        "loop"
    }
    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        // Count the tool results since the last user message: the current task's steps.
        let done = request
            .messages
            .iter()
            .rev()
            .take_while(|m| m.role != LlmRole::User)
            .filter(|m| m.role == LlmRole::Tool)
            .count();
        Ok(if done < self.steps {
            LlmResponse {
                content: None,
                tool_calls: vec![ToolCall::new("noop", json!({}))],
                usage: Default::default(),
            }
        } else {
            LlmResponse::text("done")
        })
    }
}

/// Steps this process has run (one per `noop` call), printed at the end so that
/// `cargo xtask bench engine` can divide callgrind's instruction count by it.
static STEPS_RUN: AtomicU64 = AtomicU64::new(0);

fn agent(steps: usize) -> Agent {
    let noop = FnTool::new(
        "noop",
        "Do nothing",
        json!({"type": "object"}),
        |_a, _c| async {
            STEPS_RUN.fetch_add(1, Ordering::Relaxed);
            Ok(Value::Null)
        },
    );
    Agent::builder(AgentCard::new("bench", "bench", "http://127.0.0.1:0"))
        .llm(LoopLlm { steps })
        .tool(noop)
        .max_steps(steps as u32 + 1)
        .build()
        .expect("a valid agent")
}

/// Run tasks on `threads` threads for `duration`, after a warm-up (not counted) of a quarter
/// of it, at most half a second, and at least `warm_tasks` tasks: the first tasks of a
/// process pay for growing its heap and the stores' tables, which a server does once, so the
/// figure is the steady state's. Answers steps/s.
async fn measure(
    runtime: Arc<dyn Runtime>,
    threads: usize,
    duration: Duration,
    warm_tasks: usize,
) -> f64 {
    measure_tasks_of(runtime, steps_per_task(), threads, duration, warm_tasks).await
}

/// [`measure`] with tasks of `steps` steps.
async fn measure_tasks_of(
    runtime: Arc<dyn Runtime>,
    steps: usize,
    threads: usize,
    duration: Duration,
    warm_tasks: usize,
) -> f64 {
    let executor = AgentExecutor::new(agent(steps), runtime.clone());
    let auth = runtime.auth_service().auth_context();
    let warm_up = (duration / 4).min(Duration::from_millis(500));
    let mut warmed = run_for(&executor, &auth, threads, warm_up, steps).await;
    while warmed / steps < warm_tasks {
        warmed += run_for(&executor, &auth, threads, warm_up, steps).await;
    }
    let started = Instant::now();
    let steps = run_for(&executor, &auth, threads, duration, steps).await;
    let rate = steps as f64 / started.elapsed().as_secs_f64();
    executor.shutdown().await;
    if let Ok(path) = std::env::var("KEEL_BENCH_REPORT") {
        write_one_report(runtime.as_ref(), &auth, &path).await;
    }
    rate
}

/// Write the newest run report to `path` (pretty) and print its size: what a step costs to
/// report is most of what it costs to run.
async fn write_one_report(runtime: &dyn Runtime, auth: &keel_runtime::AuthContext, path: &str) {
    let query = keel_runtime::RunQuery::default();
    match runtime.run_store().find_run_reports(auth, &query).await {
        Ok(records) => match records.first() {
            Some(record) => {
                let compact = record.report.to_string();
                println!(
                    "report: {} bytes for one task of {} steps, written to {path}",
                    compact.len(),
                    steps_per_task()
                );
                let pretty = serde_json::to_string_pretty(&record.report).unwrap_or_default();
                if let Err(e) = std::fs::write(path, pretty) {
                    eprintln!("engine bench: cannot write {path}: {e}");
                }
            }
            None => eprintln!("engine bench: no run report was saved"),
        },
        Err(e) => eprintln!("engine bench: cannot read run reports: {e}"),
    }
}

/// Tasks on `threads` threads until `duration` has passed; answers the steps run.
async fn run_for(
    executor: &AgentExecutor,
    auth: &keel_runtime::AuthContext,
    threads: usize,
    duration: Duration,
    steps_per_task: usize,
) -> usize {
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..threads {
        let (executor, auth) = (executor.clone(), auth.clone());
        workers.push(tokio::spawn(async move {
            // A fresh thread per task: what is measured is the engine per step, not a
            // conversation growing without bound (each step sends the whole history).
            let mut steps = 0usize;
            while started.elapsed() < duration {
                let message = Message::user("go").in_thread(ThreadId::new());
                if executor
                    .send_message(&auth, message, SendOptions::default())
                    .await
                    .is_err()
                {
                    break;
                }
                steps += steps_per_task;
            }
            steps
        }));
    }
    let mut steps = 0;
    for worker in workers {
        steps += worker.await.unwrap_or(0);
    }
    steps
}

/// The Postgres row at `threads`: in a fresh schema of the server at `KEEL_POSTGRES_URL`
/// (dropped after), beside single-row commits on as many connections as the store's pool
/// holds, with the statements the store sent per step and per `SendMessage`.
async fn postgres_row(threads: usize, duration: Duration, row: &impl Fn(&str, usize, f64, String)) {
    use keel_store_postgres::{testing::TestSchema, PostgresStore};
    const POOL: usize = 16;
    let schema = match TestSchema::new().await {
        Ok(schema) => schema,
        Err(e) => {
            println!("postgres {threads:>8} skipped ({e})");
            return;
        }
    };
    match PostgresStore::connect_with_pool_size(&schema.url, POOL).await {
        Ok(store) => {
            let (statements, steps_run) = (
                PostgresStore::statements_sent(),
                STEPS_RUN.load(Ordering::Relaxed),
            );
            let steps = measure(Arc::new(store.services(loop_llm())), threads, duration, 0).await;
            let statements = PostgresStore::statements_sent() - statements;
            let steps_run = (STEPS_RUN.load(Ordering::Relaxed) - steps_run).max(1);
            let connections = threads.min(POOL);
            let ceiling =
                match store_bench::ceiling::postgres_commits(&schema.url, connections, duration)
                    .await
                {
                    Ok(rate) => format!(
                        "{:.0} single-row commits/s ({connections} conn.)",
                        rate.per_sec()
                    ),
                    Err(e) => format!("PostgreSQL ceiling failed: {e}"),
                };
            let per_step = statements as f64 / steps_run as f64;
            row(
                "postgres",
                threads,
                steps,
                format!(
                    "{ceiling}; {per_step:.1} statements/step, {:.0} per SendMessage",
                    per_step * steps_per_task() as f64
                ),
            );
        }
        Err(e) => println!("postgres {threads:>8} skipped ({e})"),
    }
    let _ = schema.drop_schema().await;
}

/// How many finished tasks, threads and run records the in-memory stores keep in the bench
/// (the defaults keep 10,000 of each): the warm-up runs past it, so what is measured is a
/// heap that has stopped growing (recycling evicted records), not the kernel zeroing the
/// pages of a heap on its way to its steady size.
const MEMORY_RETAINED: usize = 1_000;

fn memory() -> Arc<dyn Runtime> {
    Arc::new(
        Services::in_memory(loop_llm())
            .with_tasks(keel_runtime::InMemoryTaskManager::with_finished_cap(
                MEMORY_RETAINED,
            ))
            .with_threads(keel_runtime::Validated::new(
                keel_runtime::InMemoryThreadStore::new().with_max_threads(MEMORY_RETAINED),
                keel_runtime::KvLimits::DEFAULT,
            ))
            .with_runs(keel_runtime::InMemoryRunStore::with_capacity(
                MEMORY_RETAINED,
            )),
    )
}

/// The default model of the backend runs: one step per task.
fn loop_llm() -> Arc<dyn Llm> {
    Arc::new(LoopLlm { steps: 1 })
}

/// The engine's own cost, apart from the scheduler's: one task at a time on a
/// current-thread runtime (no hand-offs between worker threads), with the in-memory store.
/// Tasks of `KEEL_BENCH_STEPS` steps and tasks of one step, each measured, give what one
/// more step costs and what a task costs besides its steps.
fn engine_overhead(duration: Duration) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
    let steps = steps_per_task();
    let per_task_of = |n: usize| {
        let rate = rt.block_on(measure_tasks_of(
            memory(),
            n,
            1,
            duration,
            2 * MEMORY_RETAINED,
        ));
        if rate > 0.0 {
            n as f64 * 1e6 / rate
        } else {
            f64::NAN
        }
    };
    // How many times the section runs: `KEEL_BENCH_REPEAT` (default 1).
    let repeats = count_from_env("KEEL_BENCH_REPEAT", 1);
    println!("engine overhead (in-memory store, one task at a time on one tokio thread):");
    // Per run: µs per step of tasks of `steps` steps, and (with more than one step) what one
    // more step costs and what a task costs besides its steps.
    let mut runs: Vec<[f64; 3]> = Vec::new();
    for run in 1..=repeats {
        if repeats > 1 {
            println!("  run {run} of {repeats}:");
        }
        let many = per_task_of(steps);
        println!(
            "  tasks of {steps} steps: {:.1} µs per step ({many:.0} µs per task)",
            many / steps as f64
        );
        let (mut step, mut task) = (f64::NAN, f64::NAN);
        if steps > 1 {
            let one = per_task_of(1);
            step = (many - one) / (steps - 1) as f64;
            task = one - step;
            println!("  tasks of 1 step: {one:.1} µs per task");
            println!(
                "  so one more step costs {step:.1} µs, and a task {task:.1} µs besides its steps (target: 20 µs per step)"
            );
        }
        runs.push([many / steps as f64, step, task]);
    }
    if repeats > 1 {
        let names = [
            format!("per step, tasks of {steps} steps"),
            "one more step".to_owned(),
            "a task besides its steps".to_owned(),
        ];
        println!("  over {repeats} runs (a busy machine reads high, so the minimum and median say more than the mean):");
        for (index, name) in names.iter().enumerate() {
            let mut figures: Vec<f64> = runs
                .iter()
                .map(|run| run[index])
                .filter(|f| f.is_finite())
                .collect();
            if figures.is_empty() {
                continue;
            }
            figures.sort_by(f64::total_cmp);
            println!(
                "    {name}: min {:.1} µs, median {:.1} µs",
                figures[0],
                median(&figures)
            );
        }
    }
    Ok(())
}

/// The median of sorted, non-empty figures.
fn median(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

fn main() -> ExitCode {
    let secs = std::env::var("KEEL_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(2.0);
    let duration = Duration::from_secs_f64(secs);
    let backends = std::env::var("KEEL_BENCH_BACKENDS").unwrap_or_default();
    let wanted = |name: &str| backends.is_empty() || backends.split(',').any(|b| b.trim() == name);
    let concurrencies: Vec<usize> = std::env::var("KEEL_BENCH_THREADS")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .filter(|n| *n > 0)
                .collect()
        })
        .filter(|list: &Vec<usize>| !list.is_empty())
        .unwrap_or_else(|| vec![1, 64]);
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    if wanted("memory") && concurrencies.contains(&1) {
        if let Err(e) = engine_overhead(duration) {
            eprintln!("engine bench: {e}");
            return ExitCode::FAILURE;
        }
    }
    let one_worker = std::env::var("KEEL_BENCH_WORKERS").is_ok_and(|w| w.trim() == "1");
    let mut builder = if one_worker {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let Ok(rt) = builder.enable_all().build() else {
        eprintln!("engine bench: cannot start a tokio runtime");
        return ExitCode::FAILURE;
    };
    rt.block_on(async {
        println!("engine: {} steps per task (model call + tool call, all persisted, events emitted); allocator: {ALLOCATOR_NAME}", steps_per_task());
        println!("{:<8} {:>8} {:>14} {:>16}   raw ceiling (same run)", "backend", "threads", "steps/s", "per step");
        let row = |backend: &str, threads: usize, steps_per_sec: f64, ceiling: String| {
            let per_step = if steps_per_sec > 0.0 { format!("{:.1} µs", 1e6 / steps_per_sec) } else { "-".into() };
            println!("{backend:<8} {threads:>8} {steps_per_sec:>14.0} {per_step:>16}   {ceiling}");
        };
        for threads in concurrencies.iter().copied().filter(|_| wanted("memory")) {
            let steps = measure(memory(), threads, duration, 2 * MEMORY_RETAINED).await;
            row("memory", threads, steps, "-".into());
        }
        let dir = tempfile::tempdir().expect("a temp dir");
        for threads in concurrencies.iter().copied().filter(|_| wanted("sqlite")) {
            let path = dir.path().join(format!("engine-{threads}.db"));
            match keel_store_sqlite::SqliteStore::open(&path) {
                Ok(store) => {
                    let steps = measure(Arc::new(store.services(loop_llm())), threads, duration, 0).await;
                    let raw = dir.path().join(format!("raw-{threads}.db"));
                    let ceiling = match tokio::task::spawn_blocking(move || store_bench::ceiling::sqlite_commits(&raw, duration)).await {
                        Ok(Ok(rate)) => format!("{:.0} SQLite commits/s", rate.per_sec()),
                        Ok(Err(e)) => format!("SQLite ceiling failed: {e}"),
                        Err(e) => format!("SQLite ceiling failed: {e}"),
                    };
                    row("sqlite", threads, steps, ceiling);
                }
                Err(e) => println!("sqlite   {threads:>8} skipped ({e})"),
            }
        }
        for threads in concurrencies.iter().copied().filter(|_| wanted("redis")) {
            let prefix = format!("keel-bench-{}:", uuid::Uuid::new_v4().simple());
            match keel_store_redis::RedisStore::connect(&redis_url).await {
                Ok(store) => {
                    let steps = measure(Arc::new(store.with_prefix(prefix.clone()).services(loop_llm())), threads, duration, 0).await;
                    let ceiling = match store_bench::ceiling::redis_sets(&redis_url, &prefix, threads, duration).await {
                        Ok(rate) => format!("{:.0} Redis SETs/s ({threads} concurrent)", rate.per_sec()),
                        Err(e) => format!("Redis ceiling failed: {e}"),
                    };
                    let _ = store_bench::ceiling::delete_keys(&redis_url, &prefix).await;
                    row("redis", threads, steps, ceiling);
                }
                Err(_) => println!("redis    {threads:>8} skipped (no Redis at {redis_url})"),
            }
        }
        for threads in concurrencies.iter().copied().filter(|_| wanted("postgres")) {
            postgres_row(threads, duration, &row).await;
        }
        if !one_worker {
            println!("(the table's runtime has a worker thread per core: one task alone also pays for hand-offs between them, which the engine overhead above leaves out)");
        }
        println!("(a persisted step writes several records, so steps/s sits below the raw ceiling)");
    });
    println!("steps run in all: {}", STEPS_RUN.load(Ordering::Relaxed));
    ExitCode::SUCCESS
}
