//! `cargo xtask bench stores`: persisted steps/s of every store backend at 1 and 64
//! concurrent threads, each beside the raw ceiling measured in the same run. Prints a table;
//! asserts nothing.
//!
//! Settings (environment): `KEEL_BENCH_SECS` (seconds per measurement, default 2),
//! `KEEL_BENCH_DIR` (where the SQLite files go, default the system temp dir), `REDIS_URL`
//! (default `redis://127.0.0.1:6379`; without a server the Redis rows say "skipped"),
//! `KEEL_POSTGRES_URL` (likewise for the PostgreSQL rows).

use std::process::ExitCode;

fn main() -> ExitCode {
    // `cargo bench` passes `--bench` and any filter words; this bench has no options.
    let settings = match store_bench::Settings::from_env() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("store bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("store bench: cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(store_bench::run(&settings)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("store bench: {e}");
            ExitCode::FAILURE
        }
    }
}
