//! The §13.9 conformance checklist of seed 003, one test per item, plus the SHOULDs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_sandbox::{
    run_code, CodeExecutionRequest, ConsoleLevel, ExecutionStatus, HostError, HostFunction,
    Language, SandboxValue, TypedArrayKind, DEFAULT_MEMORY_LIMIT_BYTES, MAX_MEMORY_LIMIT_BYTES,
};
use tokio::sync::Notify;

async fn run(request: CodeExecutionRequest) -> keel_sandbox::CodeExecutionResult {
    run_code(request).result().await
}

fn obj<const N: usize>(entries: [(&str, SandboxValue); N]) -> SandboxValue {
    SandboxValue::object(entries)
}

/// A host function `name` that answers `null`, and the notice it gives each time the code
/// calls it: a test waits on that instead of guessing how long the code takes to get there.
fn signalling(name: &str) -> (HostFunction, Arc<Notify>) {
    let called = Arc::new(Notify::new());
    let notice = called.clone();
    let function = HostFunction::new(name, move |_| {
        notice.notify_one();
        async { Ok(SandboxValue::Null) }
    });
    (function, called)
}

/// `event`, or a panic after 10 s.
async fn within_10s(event: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(10), event)
        .await
        .expect("the code got there within 10 s");
}

fn message(result: &keel_sandbox::CodeExecutionResult) -> String {
    result
        .error
        .as_ref()
        .map(|e| format!("{}: {}", e.name, e.message))
        .unwrap_or_default()
}

/// Assert that the run succeeded; a failure names the error it raised.
fn assert_succeeded(result: &keel_sandbox::CodeExecutionResult) {
    assert_eq!(
        result.status,
        ExecutionStatus::Success,
        "{}",
        message(result)
    );
}

// 1. Expose ThreadState.runCode(source, options?) returning a CodeExecution handle.
#[tokio::test]
async fn item01_run_code_returns_a_code_execution_handle() {
    let execution = run_code(CodeExecutionRequest::new("export default 40 + 2;"));
    let result = execution.result().await;
    assert_succeeded(&result);
    assert_eq!(result.result, SandboxValue::Number(42.0));
    assert!(execution.is_settled());
    assert_eq!(execution.try_result(), Some(result));
}

// 2. Accept TypeScript source by default and evaluate it as an ES module.
#[tokio::test]
async fn item02_typescript_is_the_default_and_runs_as_an_es_module() {
    let request = CodeExecutionRequest::new(
        "interface Point { x: number; y: number }\n\
         enum Axis { X = 'x', Y = 'y' }\n\
         type Pair<T> = [T, T];\n\
         class Box<T> { constructor(private readonly value: T) {} get(): T { return this.value; } }\n\
         const p: Point = { x: 1, y: 2 };\n\
         const pair: Pair<number> = [p.x, p.y as number];\n\
         const top = await Promise.resolve(new Box<number>(pair[0]! + pair[1]).get());\n\
         export default { sum: top, axis: Axis.Y, url: import.meta.url, strict: (function (this: unknown) { return this === undefined; })() };",
    );
    assert_eq!(request.language, Language::Typescript);
    let result = run(request).await;
    assert_succeeded(&result);
    assert_eq!(
        result.result,
        obj([
            ("sum", 3.0.into()),
            ("axis", "y".into()),
            ("url", "sandbox:main.ts".into()),
            ("strict", true.into()),
        ])
    );
    // JavaScript is accepted when asked for, and type syntax is then an error.
    let js = run(CodeExecutionRequest::new("export default 1 as number;")
        .with_language(Language::Javascript))
    .await;
    assert_eq!(js.status, ExecutionStatus::Error);
    assert_eq!(
        js.error.as_ref().map(|e| e.name.as_str()),
        Some("SyntaxError")
    );
}

// 3. Resolve bare-specifier imports only from options.imports, relative imports only from
//    options.modules, and fail linkage on URL or unknown specifiers.
#[tokio::test]
async fn item03_imports_resolve_only_from_imports_and_modules() {
    let ok = run(CodeExecutionRequest::new(
        "import cfg, { level } from 'config';\n\
         import { double } from './lib/math.ts';\n\
         import helper from './lib/helper.js';\n\
         export default [cfg.name, level, double(21), helper(), (await import('./lib/math.ts')).double(1)];",
    )
    .with_import(
        "config",
        obj([("default", obj([("name", "keel".into())])), ("level", 3.0.into())]),
    )
    .with_module("./lib/math.ts", "export const double = (n: number): number => n * 2;")
    .with_module("./lib/helper.js", "import { double } from './math';\nexport default () => double(5);"))
    .await;
    assert_eq!(ok.status, ExecutionStatus::Success, "{}", message(&ok));
    assert_eq!(
        ok.result,
        SandboxValue::Array(vec![
            "keel".into(),
            3.0.into(),
            42.0.into(),
            10.0.into(),
            2.0.into()
        ])
    );

    for source in [
        "import x from 'lodash'; export default x;",
        "import x from 'https://example.com/mod.js'; export default x;",
        "import x from './missing.ts'; export default x;",
        "import x from '/etc/passwd'; export default x;",
        "export default (await import('https://example.com/mod.js')).default;",
        "export default (await import('./missing.ts')).default;",
        "export default (await import('node:fs')).default;",
    ] {
        let result = run(CodeExecutionRequest::new(source)).await;
        assert_eq!(
            result.status,
            ExecutionStatus::LinkError,
            "{source}: {}",
            message(&result)
        );
    }
    // A caught dynamic import failure is the program's business.
    let caught = run(CodeExecutionRequest::new(
        "let r = 'none'; try { await import('https://x.test/a.js'); } catch (e) { r = 'caught'; } export default r;",
    ))
    .await;
    assert_eq!(caught.result, SandboxValue::from("caught"));
}

// 4. Install options.globals at module scope but not on globalThis.
#[tokio::test]
async fn item04_globals_are_module_scoped_not_on_global_this() {
    let result = run(CodeExecutionRequest::new(
        "import { seen } from './other.ts';\n\
         export default { apiKey, seen, onGlobal: 'apiKey' in globalThis, keys: Object.keys(globalThis), viaThis: typeof globalThis.apiKey };",
    )
    .with_module("./other.ts", "export const seen = apiKey.length;")
    .with_global("apiKey", "secret".into()))
    .await;
    assert_succeeded(&result);
    assert_eq!(
        result.result,
        obj([
            ("apiKey", "secret".into()),
            ("seen", 6.0.into()),
            ("onGlobal", false.into()),
            ("keys", SandboxValue::Array(vec![])),
            ("viaThis", "undefined".into()),
        ])
    );
    // A module may declare the same name itself; its own declaration wins.
    let shadow = run(
        CodeExecutionRequest::new("const apiKey = 'mine'; export default apiKey;")
            .with_global("apiKey", "secret".into()),
    )
    .await;
    assert_eq!(shadow.result, SandboxValue::from("mine"));
    // A global that is not an identifier cannot be installed.
    let bad =
        run(CodeExecutionRequest::new("export default 1;").with_global("not-valid", 1.0.into()))
            .await;
    assert_eq!(bad.status, ExecutionStatus::LinkError);
}

// 5. Present an isolated globalThis with only ECMAScript intrinsics.
#[tokio::test]
async fn item05_global_this_holds_only_ecmascript_intrinsics() {
    const ECMASCRIPT: &[&str] = &[
        "Object",
        "Function",
        "Array",
        "Number",
        "parseFloat",
        "parseInt",
        "Infinity",
        "NaN",
        "undefined",
        "Boolean",
        "String",
        "Symbol",
        "Date",
        "Promise",
        "RegExp",
        "Error",
        "AggregateError",
        "EvalError",
        "RangeError",
        "ReferenceError",
        "SyntaxError",
        "TypeError",
        "URIError",
        "SuppressedError",
        "globalThis",
        "JSON",
        "Math",
        "Intl",
        "ArrayBuffer",
        "Atomics",
        "Uint8Array",
        "Int8Array",
        "Uint16Array",
        "Int16Array",
        "Uint32Array",
        "Int32Array",
        "Float16Array",
        "Float32Array",
        "Float64Array",
        "Uint8ClampedArray",
        "BigUint64Array",
        "BigInt64Array",
        "DataView",
        "Map",
        "BigInt",
        "Set",
        "WeakMap",
        "WeakSet",
        "Proxy",
        "Reflect",
        "FinalizationRegistry",
        "WeakRef",
        "decodeURI",
        "decodeURIComponent",
        "encodeURI",
        "encodeURIComponent",
        "escape",
        "unescape",
        "eval",
        "isFinite",
        "isNaN",
        "Iterator",
        "DisposableStack",
        "AsyncDisposableStack",
        "queueMicrotask",
    ];
    let result = run(CodeExecutionRequest::new(
        "export default [Object.getOwnPropertyNames(globalThis), Object.getOwnPropertySymbols(globalThis).length,\n\
         [typeof fetch, typeof setTimeout, typeof setInterval, typeof process, typeof require, typeof globalThis.console, typeof performance, typeof WebAssembly, typeof navigator, typeof Deno, typeof std, typeof os]];",
    ))
    .await;
    assert_succeeded(&result);
    let SandboxValue::Array(parts) = &result.result else {
        panic!("{:?}", result.result)
    };
    let SandboxValue::Array(names) = &parts[0] else {
        panic!()
    };
    for name in names {
        let name = name.as_str().unwrap_or_default();
        assert!(ECMASCRIPT.contains(&name), "non-ECMAScript global: {name}");
    }
    // Symbol.toStringTag is the only symbol-keyed global property an engine may have.
    assert!(parts[1].as_f64().unwrap_or(9.0) <= 1.0);
    assert_eq!(parts[2], SandboxValue::Array(vec!["undefined".into(); 12]));
}

// 6. Reject eval, new Function(source), SharedArrayBuffer, Atomics, and URL dynamic imports.
#[tokio::test]
async fn item06_code_generation_shared_memory_and_url_imports_are_rejected() {
    let attempts = [
        "eval('1 + 1')",
        "(0, eval)('1 + 1')",
        "globalThis.eval('1')",
        "new Function('return 1')()",
        "Function('return 1')()",
        "(() => {}).constructor('return 1')()",
        "(async () => {}).constructor('return 1')",
        "(function* () {}).constructor('yield 1')",
        "(async function* () {}).constructor('yield 1')",
        "Reflect.construct(Function, ['return 1'])",
        "new SharedArrayBuffer(8)",
        "Atomics.add(new Int32Array(1), 0, 1)",
    ];
    for attempt in attempts {
        let source = format!(
            "let outcome;\ntry {{ outcome = ['ran', String({attempt})]; }} catch (e) {{ outcome = [e.name, e.message]; }}\nexport default outcome;"
        );
        let result =
            run(CodeExecutionRequest::new(source).with_language(Language::Javascript)).await;
        assert_eq!(
            result.status,
            ExecutionStatus::Success,
            "{attempt}: {}",
            message(&result)
        );
        let SandboxValue::Array(outcome) = &result.result else {
            panic!()
        };
        assert_ne!(
            outcome[0],
            SandboxValue::from("ran"),
            "{attempt} ran: {:?}",
            outcome
        );
    }
    let types = run(CodeExecutionRequest::new(
        "export default [typeof SharedArrayBuffer, typeof Atomics];",
    ))
    .await;
    assert_eq!(
        types.result,
        SandboxValue::Array(vec!["undefined".into(), "undefined".into()])
    );
    let url = run(CodeExecutionRequest::new(
        "export default await import('data:text/javascript,export default 1');",
    ))
    .await;
    assert_eq!(url.status, ExecutionStatus::LinkError, "{}", message(&url));
}

// 7. Enforce options.memoryLimitBytes; settle with status 'memory' on overrun.
#[tokio::test]
async fn item07_memory_limit_settles_as_memory() {
    let bomb = "const xs = []; for (;;) xs.push(new Array(10000).fill(Math.random()));";
    let result =
        run(CodeExecutionRequest::new(bomb).with_memory_limit_bytes(8 * 1024 * 1024)).await;
    assert_eq!(
        result.status,
        ExecutionStatus::Memory,
        "{}",
        message(&result)
    );
    assert!(message(&result).contains("8388608"), "{}", message(&result));

    // Catching the out-of-memory error does not turn an overrun into a success.
    let caught = run(CodeExecutionRequest::new(
        "let s = 'x'; try { const xs = []; for (;;) xs.push(new Array(100000).fill(1)); } catch (e) { s = 'recovered'; } export default s;",
    )
    .with_memory_limit_bytes(4 * 1024 * 1024))
    .await;
    assert_eq!(
        caught.status,
        ExecutionStatus::Memory,
        "{}",
        message(&caught)
    );

    // A limit too small for the runtime itself settles the same way.
    let tiny =
        run(CodeExecutionRequest::new("export default 1;").with_memory_limit_bytes(1024)).await;
    assert_eq!(tiny.status, ExecutionStatus::Memory, "{}", message(&tiny));

    // The default applies when none is given, and requests above the ceiling are clamped.
    let request = CodeExecutionRequest::new("export default 1;");
    assert_eq!(request.effective_memory_limit(), DEFAULT_MEMORY_LIMIT_BYTES);
    let huge = CodeExecutionRequest::new("export default 1;").with_memory_limit_bytes(usize::MAX);
    assert_eq!(huge.effective_memory_limit(), MAX_MEMORY_LIMIT_BYTES);
    let buffer = run(CodeExecutionRequest::new(
        "export default new ArrayBuffer(1.5 * 2 ** 30).byteLength;",
    )
    .with_memory_limit_bytes(usize::MAX))
    .await;
    assert_eq!(
        buffer.status,
        ExecutionStatus::Memory,
        "{}",
        message(&buffer)
    );
    assert!(message(&buffer).contains(&MAX_MEMORY_LIMIT_BYTES.to_string()));
}

// 8. Settle the handle with status 'terminated' within 50 ms of handle.terminate().
//    The handle settles inside `terminate` itself, so no timing is needed to check it
//    (the benchmark reports how fast the isolate's thread actually stops).
#[tokio::test]
async fn item08_terminate_settles_the_handle_as_terminated() {
    // The code calls `started` just before its endless loop; terminate once it has.
    let (started, entered) = signalling("started");
    let execution = run_code(
        CodeExecutionRequest::new("await started(); for (;;) {}")
            .with_global("started", started.into())
            .with_safety_cap(None),
    );
    within_10s(entered.notified()).await;
    let other = execution.clone();
    tokio::spawn(async move { other.terminate(Some("deadline passed")) })
        .await
        .expect("terminating task");
    assert!(execution.is_settled(), "settled as terminate returned");
    let result = execution.result().await;
    assert_eq!(result.status, ExecutionStatus::Terminated);
    assert_eq!(
        result.error.as_ref().map(|e| e.message.as_str()),
        Some("deadline passed")
    );
    // Idempotent: a second call changes nothing.
    execution.terminate(Some("again"));
    assert_eq!(execution.result().await, result);

    // While the sandbox awaits a slow host function (one that never answers in test time),
    // terminated once the code has called it.
    let entered = Arc::new(Notify::new());
    let calls = entered.clone();
    let slow = HostFunction::new("slow", move |_| {
        calls.notify_one();
        async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(SandboxValue::Null)
        }
    });
    let execution = run_code(
        CodeExecutionRequest::new("export default await slow();").with_global("slow", slow.into()),
    );
    within_10s(entered.notified()).await;
    execution.terminate(None);
    let result = execution.result().await;
    assert_eq!(result.status, ExecutionStatus::Terminated);
    assert_eq!(
        result.error.as_ref().map(|e| e.message.as_str()),
        Some("terminated by the caller")
    );

    // After settling, terminate is a no-op.
    let done = run_code(CodeExecutionRequest::new("export default 1;"));
    let first = done.result().await;
    done.terminate(Some("late"));
    assert_eq!(done.result().await, first);
}

// 9. Marshal values across the boundary by structured clone / callable proxy, with no
//    shared references.
#[tokio::test]
async fn item09_values_cross_by_structured_clone_and_callable_proxy() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let echo = HostFunction::new("echo", move |args: Vec<SandboxValue>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move { Ok(SandboxValue::Array(args)) }
    });
    let fail = HostFunction::from_fn("fail", |_| Err(HostError::new("nope")));
    let input = obj([
        ("n", 1.5.into()),
        ("big", SandboxValue::BigInt("12345678901234567890".into())),
        ("when", SandboxValue::Date(86_400_000.0)),
        ("tags", SandboxValue::Set(vec!["a".into(), "b".into()])),
        ("index", SandboxValue::Map(vec![(1.0.into(), "one".into())])),
        (
            "bytes",
            SandboxValue::TypedArray {
                kind: TypedArrayKind::Uint16,
                bytes: vec![1, 0, 2, 0],
            },
        ),
        ("__proto__", obj([("polluted", true.into())])),
        ("nothing", SandboxValue::Undefined),
    ]);
    let result = run(CodeExecutionRequest::new(
        "export default async (input: any) => {\n\
           const types = [typeof input.big, input.when instanceof Date, input.tags instanceof Set, input.index.get(1), input.bytes instanceof Uint16Array, input.bytes[1], ({} as any).polluted, Object.getPrototypeOf(input) === Object.prototype];\n\
           input.n = 99; // mutating the clone changes nothing on the host\n\
           const [back] = await echo(input.tags);\n\
           let failure = '';\n\
           try { await fail(); } catch (e) { failure = e.message; }\n\
           let refused = '';\n\
           try { await echo(new (class Secret {})()); } catch (e) { refused = e.name; }\n\
           return { types, back, failure, refused, big: input.big * 2n, map: new Map([['k', new Date(0)]]), f32: new Float32Array([0.5]), nothing: input.nothing };\n\
         };",
    )
    .with_global("echo", echo.into())
    .with_global("fail", fail.into())
    .with_execute("default", vec![input.clone()]))
    .await;
    assert_succeeded(&result);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the refused call never reached the host"
    );
    let value = &result.result;
    assert_eq!(
        value.get("types"),
        Some(&SandboxValue::Array(vec![
            "bigint".into(),
            true.into(),
            true.into(),
            "one".into(),
            true.into(),
            2.0.into(),
            SandboxValue::Undefined,
            true.into(),
        ]))
    );
    assert_eq!(
        value.get("back"),
        Some(&SandboxValue::Set(vec!["a".into(), "b".into()]))
    );
    assert_eq!(value.get("failure"), Some(&SandboxValue::from("nope")));
    assert_eq!(
        value.get("refused"),
        Some(&SandboxValue::from("SerializationError"))
    );
    assert_eq!(
        value.get("big"),
        Some(&SandboxValue::BigInt("24691357802469135780".into()))
    );
    assert_eq!(
        value.get("map"),
        Some(&SandboxValue::Map(vec![(
            "k".into(),
            SandboxValue::Date(0.0)
        )]))
    );
    assert_eq!(
        value.get("f32"),
        Some(&SandboxValue::TypedArray {
            kind: TypedArrayKind::Float32,
            bytes: 0.5f32.to_ne_bytes().to_vec()
        })
    );
    assert_eq!(value.get("nothing"), Some(&SandboxValue::Undefined));
    assert_eq!(input.get("n"), Some(&SandboxValue::Number(1.5)));

    // Non-transferable results settle as a serialization error.
    for source in [
        "export default new (class Secret { x = 1 })();",
        "export default new WeakMap();",
        "export default Symbol('s');",
        "export default { f: () => 1 };",
        "export default () => () => 1;",
        "export default new Proxy({}, {});",
        "const a: any = {}; a.self = a; export default a;",
    ] {
        let result =
            run(CodeExecutionRequest::new(source).with_language(Language::Typescript)).await;
        assert_eq!(result.status, ExecutionStatus::Error, "{source}");
        assert_eq!(
            result.error.as_ref().map(|e| e.name.as_str()),
            Some("SerializationError"),
            "{source}: {}",
            message(&result)
        );
    }
}

// 10. Resolve the configured export per §13.5.
#[tokio::test]
async fn item10_configured_export_resolution() {
    let module = "export const value = 7;\n\
                  export const add = (a: number, b: number) => a + b;\n\
                  export const later = async (x: number) => ({ then(resolve: (v: unknown) => void) { resolve(Promise.resolve(x * 3)); } });\n\
                  export const boom = () => { throw new TypeError('bad input'); };\n\
                  export const reject = async () => { throw new RangeError('too far'); };\n\
                  export default () => 'default ran';";
    let cases: Vec<(&str, Vec<SandboxValue>, ExecutionStatus, SandboxValue)> = vec![
        (
            "default",
            vec![],
            ExecutionStatus::Success,
            "default ran".into(),
        ),
        ("value", vec![], ExecutionStatus::Success, 7.0.into()),
        (
            "add",
            vec![2.0.into(), 3.0.into()],
            ExecutionStatus::Success,
            5.0.into(),
        ),
        (
            "later",
            vec![4.0.into()],
            ExecutionStatus::Success,
            12.0.into(),
        ),
        (
            "missing",
            vec![],
            ExecutionStatus::LinkError,
            SandboxValue::Undefined,
        ),
        (
            "value",
            vec![1.0.into()],
            ExecutionStatus::Error,
            SandboxValue::Undefined,
        ),
        (
            "boom",
            vec![],
            ExecutionStatus::Error,
            SandboxValue::Undefined,
        ),
        (
            "reject",
            vec![],
            ExecutionStatus::Error,
            SandboxValue::Undefined,
        ),
    ];
    for (function, args, status, value) in cases {
        let result = run(CodeExecutionRequest::new(module).with_execute(function, args)).await;
        assert_eq!(result.status, status, "{function}: {}", message(&result));
        assert_eq!(result.result, value, "{function}");
    }
    let thrown = run(CodeExecutionRequest::new(module).with_execute("boom", vec![])).await;
    assert_eq!(
        thrown.error.as_ref().map(|e| e.name.as_str()),
        Some("TypeError")
    );
    // A module with no default export and no selection is a link error (§13.5).
    let none = run(CodeExecutionRequest::new("const x = 1;")).await;
    assert_eq!(none.status, ExecutionStatus::LinkError);
}

// 11. Return CodeExecutionResult with the exact status codes of the caller-facing spec.
#[tokio::test]
async fn item11_result_carries_the_exact_status_codes() {
    let spelled: Vec<String> = [
        ExecutionStatus::Success,
        ExecutionStatus::Error,
        ExecutionStatus::Terminated,
        ExecutionStatus::Memory,
        ExecutionStatus::LinkError,
    ]
    .iter()
    .map(|s| {
        serde_json::to_value(s)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    })
    .collect();
    assert_eq!(
        spelled,
        ["success", "error", "terminated", "memory", "link_error"]
    );
    let result = run(CodeExecutionRequest::new(
        "console.log('hi'); export default { ok: true };",
    ))
    .await;
    let json = serde_json::to_value(&result).expect("serializes");
    assert_eq!(json["status"], "success");
    assert_eq!(json["result"], serde_json::json!({ "ok": true }));
    assert_eq!(json["console"][0]["message"], "hi");
    assert!(json.get("error").is_none());
    let failed =
        serde_json::to_value(run(CodeExecutionRequest::new("throw new Error('x');")).await)
            .expect("serializes");
    assert_eq!(failed["status"], "error");
    assert_eq!(failed["error"]["name"], "Error");
    assert_eq!(failed["error"]["line"], 1);
}

// 12. Create a fresh isolate per call; leak no state between calls.
#[tokio::test]
async fn item12_each_call_gets_a_fresh_isolate() {
    let first = run(CodeExecutionRequest::new(
        "(globalThis as any).leak = 1;\n\
         (Object.prototype as any).polluted = true;\n\
         Array.prototype.push = () => 0;\n\
         JSON.stringify = () => 'hijacked';\n\
         export default 'dirty';",
    ))
    .await;
    assert_succeeded(&first);
    let second = run(CodeExecutionRequest::new(
        "const xs: number[] = []; xs.push(1);\n\
         export default [typeof (globalThis as any).leak, ({} as any).polluted, xs.length, JSON.stringify({ a: 1 })];",
    ))
    .await;
    assert_eq!(
        second.result,
        SandboxValue::Array(vec![
            "undefined".into(),
            SandboxValue::Undefined,
            1.0.into(),
            "{\"a\":1}".into()
        ])
    );
}

// SHOULD: capture console.* logs when no console global is supplied.
#[tokio::test]
async fn should_capture_console_when_no_console_global_is_supplied() {
    let result = run(CodeExecutionRequest::new(
        "console.log('a', 1, { b: [2] }, 3n);\nconsole.warn('careful');\nconsole.error(new TypeError('bad'));\nconsole.info(undefined, null);\nexport default typeof console;",
    ))
    .await;
    let lines: Vec<(ConsoleLevel, &str)> = result
        .console
        .iter()
        .map(|l| (l.level, l.message.as_str()))
        .collect();
    assert_eq!(
        lines,
        [
            (ConsoleLevel::Log, "a 1 {\"b\":[2]} 3n"),
            (ConsoleLevel::Warn, "careful"),
            (ConsoleLevel::Error, "TypeError: bad"),
            (ConsoleLevel::Info, "undefined null"),
        ]
    );
    // A caller-supplied console replaces the capture.
    let logged = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&logged);
    let log = HostFunction::from_fn("log", move |_| {
        count.fetch_add(1, Ordering::SeqCst);
        Ok(SandboxValue::Undefined)
    });
    let own = run(
        CodeExecutionRequest::new("await console.log('x'); export default 1;")
            .with_global("console", obj([("log", log.into())])),
    )
    .await;
    assert_eq!(own.status, ExecutionStatus::Success, "{}", message(&own));
    assert!(own.console.is_empty());
    assert_eq!(logged.load(Ordering::SeqCst), 1);
}

// SHOULD: surface syntactic and linker errors with line/column in the caller's source.
#[tokio::test]
async fn should_report_errors_at_the_callers_line_and_column() {
    let syntax = run(CodeExecutionRequest::new("const a = 1;\nconst b = ;\n")).await;
    let error = syntax.error.expect("syntax error");
    assert_eq!((error.name.as_str(), error.line), ("SyntaxError", Some(2)));
    assert!(error.column.is_some());

    // A runtime throw after erased type-only lines still points at the caller's line.
    let thrown = run(CodeExecutionRequest::new(
        "interface A {\n  x: number;\n}\ntype B = A;\nconst f = (a: A): number => a.x;\n    null!.boom;\nexport default f;",
    ))
    .await;
    let error = thrown.error.expect("runtime error");
    assert_eq!(error.name, "TypeError");
    assert_eq!(error.line, Some(6), "{error:?}");
    assert_eq!(error.file.as_deref(), Some("main.ts"));

    // In JavaScript the engine's own positions are the caller's.
    let js = run(
        CodeExecutionRequest::new("\n\n  undefinedName;\nexport default 1;")
            .with_language(Language::Javascript),
    )
    .await;
    let error = js.error.expect("reference error");
    assert_eq!(
        (error.name.as_str(), error.line, error.column),
        ("ReferenceError", Some(3), Some(3))
    );

    // Errors in a supplied module name that module.
    let nested = run(
        CodeExecutionRequest::new("import './lib/bad.ts';\nexport default 1;")
            .with_module("./lib/bad.ts", "\nthrow new Error('in module');"),
    )
    .await;
    let error = nested.error.expect("module error");
    assert_eq!(
        (error.file.as_deref(), error.line),
        (Some("lib/bad.ts"), Some(2))
    );
}
