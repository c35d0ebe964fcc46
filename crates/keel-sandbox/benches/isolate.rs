//! Start-up and run-time figures for `run_code`: `cargo bench -p keel-sandbox`.
//!
//! Plain `std::time` measurements (no harness), printed as a table: each figure is the
//! median and 95th percentile over the iterations.

use std::time::{Duration, Instant};

use keel_sandbox::{run_code, CodeExecutionRequest, ExecutionStatus, Language};

fn measure(
    runtime: &tokio::runtime::Runtime,
    iterations: usize,
    request: &CodeExecutionRequest,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let result = runtime.block_on(run_code(request.clone()).result());
        samples.push(started.elapsed());
        assert_eq!(
            result.status,
            ExecutionStatus::Success,
            "{:?}",
            result.error
        );
    }
    samples
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let pick = |q: f64| {
        let idx = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(idx).copied().unwrap_or_default()
    };
    println!(
        "{name:<48} median {:>9.3} ms   p95 {:>9.3} ms   (n={})",
        pick(0.5).as_secs_f64() * 1e3,
        pick(0.95).as_secs_f64() * 1e3,
        samples.len()
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let iterations = 200;

    let empty = CodeExecutionRequest::new("export default 1;").with_language(Language::Javascript);
    let _warm = measure(&runtime, 10, &empty);
    report(
        "isolate start-up (JS `export default 1`)",
        measure(&runtime, iterations, &empty),
    );

    let ts = CodeExecutionRequest::new(
        "interface P { x: number }\nconst p: P = { x: 1 };\nexport default p.x as number;",
    );
    report(
        "isolate start-up + TypeScript erasure",
        measure(&runtime, iterations, &ts),
    );

    let small = CodeExecutionRequest::new(
        "const fib = (n: number): number => (n < 2 ? n : fib(n - 1) + fib(n - 2));\n\
         const words = 'the quick brown fox jumps over the lazy dog'.split(' ');\n\
         const counts = new Map<string, number>();\n\
         for (const w of words) counts.set(w, (counts.get(w) ?? 0) + 1);\n\
         export default { fib: fib(20), distinct: counts.size, sorted: [...words].sort() };",
    );
    report(
        "small script (fib(20), map, sort; TS)",
        measure(&runtime, iterations, &small),
    );

    let mut latencies = Vec::with_capacity(50);
    for _ in 0..50 {
        let execution = run_code(CodeExecutionRequest::new("for (;;) {}").with_safety_cap(None));
        std::thread::sleep(Duration::from_millis(5));
        let started = Instant::now();
        execution.terminate(Some("bench"));
        let result = runtime.block_on(execution.result());
        latencies.push(started.elapsed());
        assert_eq!(result.status, ExecutionStatus::Terminated);
    }
    report("terminate() -> handle settled (tight loop)", latencies);
}
