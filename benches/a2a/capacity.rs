//! The capacity figure: with the offline model answering after [`MODEL_WAIT`] (a stand-in
//! for a real model's wait), how many conversations one `keel serve` on one core holds at
//! once while its p99 stays within [`OVERHEAD`] of that wait, and the memory each one takes.
//!
//! Each level is `C` keep-alive connections sending blocking SendMessage (each a new
//! conversation), so `C` tasks are in flight at every moment; each connection's first send
//! starts at a random moment within the model's wait, as conversations arrive over time. The
//! server's resident memory is sampled through the run; its peak over the idle server (whose
//! stores the warm-up filled), divided by `C`, is the memory of one in-flight task.

use std::time::Duration;

use crate::servers::{Kind, Server, Store};
use crate::wrk::Load;
use crate::{latency, mib, Bench, Scenario};

/// How long the offline model takes to answer.
const MODEL_WAIT: Duration = Duration::from_millis(200);
/// The p99 over [`MODEL_WAIT`] a level may add and still count.
const OVERHEAD: Duration = Duration::from_millis(20);

/// Runs the levels of `KEEL_BENCH_CAPACITY` (connections, comma-separated; `0` skips).
pub fn capacity(bench: &mut Bench, levels: &[u32]) -> Result<(), String> {
    if levels.is_empty() {
        println!("capacity: skipped (KEEL_BENCH_CAPACITY=0)");
        return Ok(());
    }
    let wait = format!("mock:{}ms", MODEL_WAIT.as_millis());
    println!(
        "capacity: keel (memory) with the offline model answering after {} ms; C connections of blocking SendMessage, each a new conversation",
        MODEL_WAIT.as_millis()
    );
    println!(
        "{:>6} {:>9} {:>10} {:>10} {:>10} {:>11} {:>13} {:>7}",
        "C", "req/s", "p50", "p99", "p99-wait", "peak RSS", "RSS/in-flight", "errors"
    );
    let place = bench.place(Kind::Keel(Store::Memory))?;
    let server = Server::start_with(
        &bench.bins,
        Kind::Keel(Store::Memory),
        place,
        &["--llm", &wait],
    )?;
    let (script, seconds) = (bench.script.clone(), bench.settings.secs);
    let load = |connections: u32, prefix: &str| {
        Load {
            script: &script,
            port: server.port,
            connections,
            seconds,
            scenario: Scenario::Send.name(),
            prefix,
            task_id: "",
            // Conversations arrive over the model's wait rather than at one instant: a level
            // is the load held, and wrk opening every connection at once would otherwise be
            // a burst of C sends whose queue alone sets the p99 of a short run.
            ramp_ms: MODEL_WAIT.as_millis() as u64,
        }
        .run()
    };
    // Warm at the highest level, long enough for the in-memory stores to reach their
    // retention caps: the memory of the tasks they keep is then in `idle`, and what a level
    // adds over it is the memory of the tasks in flight.
    let top = levels.iter().copied().max().unwrap_or(1);
    load(top, &format!("c{}-", bench.next()))?;
    let idle = server.rss_kib().unwrap_or(0);
    let mut held = None;
    for &connections in levels {
        let prefix = format!("c{}-", bench.next());
        let (figure, peak) = std::thread::scope(|scope| {
            let running = scope.spawn(|| load(connections, &prefix));
            let mut peak = idle;
            while !running.is_finished() {
                peak = peak.max(server.rss_kib().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(50));
            }
            (
                running
                    .join()
                    .unwrap_or_else(|_| Err("wrk panicked".into())),
                peak,
            )
        });
        let figure = figure?;
        let overhead_us = figure.p99_us - MODEL_WAIT.as_micros() as f64;
        let per_task = peak.saturating_sub(idle) as f64 / f64::from(connections);
        println!(
            "{:>6} {:>9.0} {:>10} {:>10} {:>10} {:>11} {:>10.1} KiB {:>7}",
            connections,
            figure.per_sec,
            latency(figure.p50_us),
            latency(figure.p99_us),
            latency(overhead_us.max(0.0)),
            mib(Some(peak)),
            per_task,
            figure.errors
        );
        if figure.errors == 0 && overhead_us <= OVERHEAD.as_micros() as f64 {
            held = Some((connections, per_task));
        }
    }
    server.stop();
    match held {
        Some((connections, per_task)) => println!(
            "capacity: {connections} concurrent conversations on one core at p99 within {} ms of the model's wait; {per_task:.1} KiB of RSS per in-flight task (idle {})",
            OVERHEAD.as_millis(),
            mib(Some(idle))
        ),
        None => println!(
            "capacity: no level held p99 within {} ms of the model's wait",
            OVERHEAD.as_millis()
        ),
    }
    println!();
    Ok(())
}
