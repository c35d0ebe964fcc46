//! `cargo xtask bench bytes`: what one conversation turn leaves on disk. An echo agent (one
//! model call that answers at once, no tools) takes one-message turns on one thread against a
//! SQLite file; after each stretch of turns the file's live bytes are read with SQLite's
//! `dbstat` table (payload bytes per table and index, WAL included, free pages left out) and
//! printed per turn: for the first stretch and for a late one, so a per-turn cost that grows
//! with the thread shows as a difference between the two. Asserts nothing.
//!
//! Settings: `KEEL_BENCH_TURNS` (turns in all, default 500), `KEEL_BENCH_STRETCH` (turns per
//! measured stretch, default 50), `KEEL_BENCH_DB` (the SQLite file to write and keep, for
//! reading what a turn stored; default a temporary file).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use keel_agent::{Agent, AgentExecutor, SendOptions};
use keel_core::{AgentCard, AgentResult, Message, ThreadId};
use keel_llm::{Llm, LlmRequest, LlmResponse};
use store_bench::count_from_env;

/// A model that answers every request with the same short text: the echo turn of issue 41.
struct EchoLlm;

#[async_trait]
impl Llm for EchoLlm {
    fn model_name(&self) -> &str {
        "echo"
    }
    async fn complete(&self, _request: LlmRequest) -> AgentResult<LlmResponse> {
        Ok(LlmResponse::text("hello back"))
    }
}

/// Live payload bytes per table or index of the SQLite file at `path`, read through a second
/// connection (it sees the WAL, so no checkpoint is needed).
fn stored_bytes(path: &Path) -> rusqlite::Result<BTreeMap<String, i64>> {
    let conn = rusqlite::Connection::open(path)?;
    let mut statement =
        conn.prepare("SELECT name, SUM(payload) FROM dbstat GROUP BY name ORDER BY name")?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    rows.collect()
}

/// Bytes per turn in each table between two readings, largest first, without the tables that
/// did not grow.
fn per_turn(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>, turns: usize) -> String {
    let mut grown: Vec<(i64, &str)> = after
        .iter()
        .map(|(name, bytes)| {
            (
                bytes - before.get(name).copied().unwrap_or(0),
                name.as_str(),
            )
        })
        .filter(|(grew, _)| *grew > 0)
        .collect();
    grown.sort_by(|a, b| b.cmp(a));
    let parts: Vec<String> = grown
        .iter()
        .map(|(grew, name)| format!("{name} {}", grew / turns as i64))
        .collect();
    parts.join(", ")
}

fn main() -> ExitCode {
    let turns = count_from_env("KEEL_BENCH_TURNS", 500);
    let stretch = count_from_env("KEEL_BENCH_STRETCH", 50).min(turns);
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        eprintln!("bytes bench: cannot start a tokio runtime");
        return ExitCode::FAILURE;
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = std::env::var_os("KEEL_BENCH_DB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("bytes.db"));
    let store = match keel_store_sqlite::SqliteStore::open(&path) {
        Ok(store) => store,
        Err(e) => {
            eprintln!("bytes bench: cannot open SQLite: {e}");
            return ExitCode::FAILURE;
        }
    };
    let agent = Agent::builder(AgentCard::new("bench", "bench", "http://127.0.0.1:0"))
        .llm(EchoLlm)
        .max_steps(1)
        .build()
        .expect("a valid agent");
    let runtime: Arc<dyn keel_runtime::Runtime> = Arc::new(store.services(Arc::new(EchoLlm)));
    let executor = AgentExecutor::new(agent, runtime.clone());
    let auth = runtime.auth_service().auth_context();
    let thread = ThreadId::new();
    println!("bytes per turn: SQLite, one-message echo turns on one thread, {turns} turns");
    let result: Result<(), String> = rt.block_on(async {
        let mut before = stored_bytes(&path).map_err(|e| e.to_string())?;
        let mut done = 0;
        while done < turns {
            let count = stretch.min(turns - done);
            for _ in 0..count {
                let message = Message::user("hello").in_thread(thread.clone());
                executor
                    .send_message(&auth, message, SendOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let after = stored_bytes(&path).map_err(|e| e.to_string())?;
            let total: i64 = after.values().sum::<i64>() - before.values().sum::<i64>();
            if done == 0 || done + count == turns {
                println!(
                    "bytes per turn, turns {:>4}-{:<4} {:>7}   ({})",
                    done + 1,
                    done + count,
                    total / count as i64,
                    per_turn(&before, &after, count)
                );
            }
            before = after;
            done += count;
        }
        executor.shutdown().await;
        Ok(())
    });
    match result {
        Ok(()) => {
            println!(
                "(payload bytes from SQLite's dbstat: rows and index entries, not free pages)"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bytes bench: {e}");
            ExitCode::FAILURE
        }
    }
}
