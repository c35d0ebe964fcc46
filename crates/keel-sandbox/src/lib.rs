//! Sandboxed code execution for Keel's `runCode` (seed 003 §13, decision 11).
//!
//! [`run_code`] takes a [`CodeExecutionRequest`] and returns a [`CodeExecution`] handle at
//! once; awaiting [`CodeExecution::result`] gives a [`CodeExecutionResult`] whose status is
//! exactly one of `success`, `error`, `terminated`, `memory` or `link_error`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use keel_sandbox::{run_code, CodeExecutionRequest, HostFunction, SandboxValue};
//!
//! let lookup = HostFunction::new("lookup", |args: Vec<SandboxValue>| async move {
//!     Ok(SandboxValue::from(format!("hello {}", args[0].as_str().unwrap_or("?"))))
//! });
//! let request = CodeExecutionRequest::new(
//!     "import cfg from 'config';\n\
//!      export default async (who: string) => { console.log(cfg.greeting); return await lookup(who); };",
//! )
//! .with_import("config", SandboxValue::object([(
//!     "default",
//!     SandboxValue::object([("greeting", SandboxValue::from("hi"))]),
//! )]))
//! .with_global("lookup", lookup.into())
//! .with_execute("default", vec![SandboxValue::from("keel")]);
//! let result = run_code(request).result().await;
//! assert_eq!(result.result, SandboxValue::from("hello keel"));
//! assert_eq!(result.console[0].message, "hi");
//! # }
//! ```
//!
//! # How a call runs
//!
//! Each call gets its own OS thread, and on it a fresh QuickJS runtime and context (the
//! "isolate"): no module cache, intrinsic or binding survives the call. Before any caller
//! code runs, a set-up script captures the intrinsics the runtime needs, replaces `eval`
//! and the `Function` constructors (plain, async, generator, async generator — also as
//! reached through `.constructor`) with functions that throw `EvalError`, and deletes
//! `SharedArrayBuffer`, `Atomics` and QuickJS's non-standard `InternalError`. The context
//! is built with the ECMAScript intrinsics only (no `performance`, no `DOMException`, no
//! std/os modules), so `globalThis` holds nothing else.
//!
//! Caller globals (and the captured `console`, unless the caller supplies one) reach each
//! source module through an `import` from a private synthetic module appended after the
//! caller's source, so they are module-scoped, absent from `globalThis`, and the caller's
//! lines and columns do not move; a global that a module declares itself is not injected
//! into that module. `imports` become synthetic modules re-exporting a deep-frozen copy;
//! `modules` are compiled up front under paths resolved against `filename`. The resolver
//! links bare specifiers only to `imports`, relative ones only to `modules`, and refuses
//! everything else (URLs, absolute paths, unknown names) — statically or through `import()`
//! — which settles as `link_error` when uncaught.
//!
//! Values cross by structured clone into [`SandboxValue`]: primitives, bigint, plain
//! objects, arrays, `Map`, `Set`, `Date`, typed arrays and `ArrayBuffer`. Class instances,
//! proxies, symbols, weak collections and sandbox functions are refused with a
//! `SerializationError`. Host functions ([`HostFunction`]) become callable proxies returning
//! promises; their futures run on the caller's tokio runtime, never on the isolate's thread.
//!
//! # Resource enforcement
//!
//! * **Memory:** the isolate allocates through a counting allocator bounded at
//!   `memoryLimitBytes` ([`DEFAULT_MEMORY_LIMIT_BYTES`] = 64 MiB when omitted). Requests above
//!   [`MAX_MEMORY_LIMIT_BYTES`] (1 GiB) are clamped to it (§13.4 option (a)); an overrun
//!   settles as `memory` with a message naming the effective limit, even if the code caught
//!   the out-of-memory error.
//! * **Termination:** [`CodeExecution::terminate`] settles the handle as `terminated` at once
//!   (the reason, when given, is the message) and is idempotent; the isolate stops at its next
//!   interrupt check, which QuickJS runs every few thousand bytecodes, or wakes from waiting
//!   on a host function immediately.
//! * **Safety cap:** by default, 30 s ([`DEFAULT_SAFETY_CAP`]) of JavaScript executing without
//!   finishing settles as `terminated` with a message saying the cap fired. Time spent
//!   waiting on host functions does not count: there is no wall-clock timeout.
//! * A promise that can never settle (nothing pending in the sandbox or on the host) settles
//!   as `error` at once rather than hanging.
//!
//! # Engine choice (measured)
//!
//! **QuickJS (quickjs-ng) through `rquickjs` 0.14, bundled C sources.** QuickJS gives what
//! §13 needs directly: a per-runtime allocator (the memory limit and its `memory` status),
//! an interrupt handler (termination and the safety cap, also inside regular-expression
//! backtracking), an in-memory module resolver/loader, and runtimes cheap enough to build
//! one per call (below). Alternatives, not built here: `boa` is pure Rust but has loop and
//! recursion limits rather than heap accounting, so §13.4's `memory` status could not be
//! honoured; V8 (`rusty_v8`) fetches a prebuilt static library at build time, which this
//! project's machines cannot download, or compiles for far longer than CI's budget.
//!
//! Measured on the 2-core CI-class machine (dev profile, `CARGO_PROFILE_DEV_DEBUG=0`,
//! empty scratch `CARGO_TARGET_DIR`, crates already downloaded):
//!
//! | what | cold build, wall (user) |
//! |---|---|
//! | `rquickjs` alone (QuickJS C sources + bindings) | 12 s (10 s) |
//! | oxc parser + semantic + transformer + codegen alone | 29 s (38 s) |
//! | `cargo build -p keel-sandbox`, every dependency included | 40 s (52 s) |
//!
//! `cargo bench -p keel-sandbox` (release; median / p95 over 200 runs, each a full
//! `run_code(..).result().await` including the thread, runtime, context and lockdown):
//!
//! | what | median | p95 |
//! |---|---|---|
//! | isolate start-up, JavaScript `export default 1` | 0.87 ms | 3.3 ms |
//! | the same in TypeScript (adds oxc erasure) | 1.43 ms | 4.2 ms |
//! | small TypeScript script (`fib(20)`, a `Map`, a sort) | 1.42 ms | 8.0 ms |
//! | `terminate()` to settled handle, tight loop running | 0.004 ms | 0.010 ms |
//!
//! **TypeScript:** `oxc_transformer` with every lowering pass off strips types (enums and
//! namespaces are compiled, not rejected); `oxc_codegen`'s source map maps engine positions
//! back to the caller's source. No type checker runs. oxc is pinned to 0.146, the newest
//! release that builds with Rust 1.95.

// `unsafe` is denied workspace-wide; this crate allows it in exactly two small modules:
// copying bytes out of a typed array (rquickjs offers only raw access) ...
#[allow(unsafe_code)]
mod bytes;
mod execution;
mod isolate;
// ... and the counting allocator behind the memory limit, which has to implement
// rquickjs's `unsafe trait Allocator` and call the inner allocator's `usable_size`.
#[allow(unsafe_code)]
mod limits;
mod request;
mod result;
mod transpile;
mod value;

pub use execution::{run_code, CodeExecution, MAX_CONSOLE_BYTES};
pub use request::{
    CodeExecutionRequest, ExportSelection, Language, DEFAULT_MEMORY_LIMIT_BYTES,
    DEFAULT_SAFETY_CAP, MAX_MEMORY_LIMIT_BYTES,
};
pub use result::{CodeExecutionResult, ConsoleLevel, ConsoleLine, ExecutionError, ExecutionStatus};
pub use value::{HostError, HostFunction, HostFuture, HostResult, SandboxValue, TypedArrayKind};
