//! Escape attempts: each must fail safely, with a settled result and an intact host.

use std::time::Duration;

use keel_sandbox::{
    run_code, CodeExecutionRequest, CodeExecutionResult, ExecutionStatus, HostFunction, Language,
    SandboxValue,
};

async fn run(request: CodeExecutionRequest) -> CodeExecutionResult {
    run_code(request).result().await
}

fn js(source: &str) -> CodeExecutionRequest {
    CodeExecutionRequest::new(source).with_language(Language::Javascript)
}

fn describe(result: &CodeExecutionResult) -> String {
    format!("{:?} {:?} {:?}", result.status, result.result, result.error)
}

/// Assert that the run succeeded; a failure shows all it returned.
fn assert_succeeded(result: &CodeExecutionResult) {
    assert_eq!(
        result.status,
        ExecutionStatus::Success,
        "{}",
        describe(result)
    );
}

fn echo() -> HostFunction {
    HostFunction::new("echo", |args: Vec<SandboxValue>| async move {
        Ok(args.into_iter().next().unwrap_or_default())
    })
}

#[tokio::test]
async fn constructor_constructor_return_this_is_refused() {
    for attempt in [
        "constructor.constructor('return this')()",
        "({}).constructor.constructor('return this')()",
        "[].map.constructor('return this')()",
        "echo.constructor('return this')()",
        "echo.constructor.constructor('return process')()",
        "Object.getPrototypeOf(async () => {}).constructor('return this')",
    ] {
        let source = format!(
            "let r;\ntry {{ r = typeof ({attempt}); }} catch (e) {{ r = e.name; }}\nexport default r;"
        );
        let result = run(js(&source).with_global("echo", echo().into())).await;
        assert_eq!(
            result.status,
            ExecutionStatus::Success,
            "{attempt}: {}",
            describe(&result)
        );
        assert_ne!(
            result.result,
            SandboxValue::from("object"),
            "{attempt} reached a global"
        );
        assert_ne!(
            result.result,
            SandboxValue::from("function"),
            "{attempt} compiled code"
        );
    }
}

#[tokio::test]
async fn host_objects_process_and_require_are_unreachable() {
    let result = run(js(
        "const probes = [typeof process, typeof require, typeof module, typeof exports, typeof Deno, typeof Bun,\n\
           typeof std, typeof os, typeof print, typeof scriptArgs, typeof __filename, typeof globalThis.global];\n\
         const meta = Object.keys(import.meta);\n\
         const fnKeys = Object.getOwnPropertyNames(echo).sort();\n\
         let constructed = 'no';\n\
         try { new echo(); constructed = 'yes'; } catch (e) { constructed = e.name; }\n\
         let stackHook = 'kept';\n\
         try { Error.prepareStackTrace = (e, frames) => frames; stackHook = typeof Error.prepareStackTrace; } catch (e) { stackHook = e.name; }\n\
         export default { probes, meta, fnKeys, constructed, source: echo.toString().includes('hostCall') ? 'bridge' : 'opaque', stackHook };",
    )
    .with_global("echo", echo().into()))
    .await;
    assert_succeeded(&result);
    let value = &result.result;
    assert_eq!(
        value.get("probes"),
        Some(&SandboxValue::Array(vec!["undefined".into(); 12]))
    );
    assert_eq!(
        value.get("meta"),
        Some(&SandboxValue::Array(vec!["url".into()]))
    );
    assert_eq!(
        value.get("fnKeys"),
        Some(&SandboxValue::Array(vec!["length".into(), "name".into()]))
    );
    assert_eq!(
        value.get("constructed"),
        Some(&SandboxValue::from("TypeError"))
    );
    assert_ne!(
        value.get("stackHook"),
        Some(&SandboxValue::from("function"))
    );
    for module in ["std", "os", "fs", "node:child_process", "qjs:std"] {
        let result = run(js(&format!("export default await import('{module}');"))).await;
        assert_eq!(
            result.status,
            ExecutionStatus::LinkError,
            "{module}: {}",
            describe(&result)
        );
    }
}

#[tokio::test]
async fn prototype_pollution_of_host_objects_stays_inside() {
    let config = SandboxValue::object([(
        "default",
        SandboxValue::object([
            ("name", "keel".into()),
            ("nested", SandboxValue::object([("n", 1.0.into())])),
        ]),
    )]);
    let result = run(js(
        "import cfg from 'config';\nimport * as ns from 'config';\n\
         const attempts = [];\n\
         for (const f of [() => { cfg.name = 'x'; }, () => { cfg.nested.n = 2; }, () => { ns.default = 1; },\n\
                          () => { Object.setPrototypeOf(cfg, null); }, () => { cfg.__proto__.polluted = 1; }]) {\n\
           try { f(); attempts.push('ok'); } catch (e) { attempts.push(e.name); }\n\
         }\n\
         export default { attempts, name: cfg.name, n: cfg.nested.n, polluted: ({}).polluted };",
    )
    .with_import("config", config.clone()))
    .await;
    assert_succeeded(&result);
    assert_eq!(
        result.result.get("attempts"),
        Some(&SandboxValue::Array(vec![
            "TypeError".into(),
            "TypeError".into(),
            "TypeError".into(),
            "TypeError".into(),
            "ok".into() // the sandbox's own Object.prototype: its own business
        ]))
    );
    assert_eq!(result.result.get("name"), Some(&SandboxValue::from("keel")));
    // The host's value is untouched, and the next isolate starts clean.
    assert_eq!(
        config.get("default").and_then(|d| d.get("name")),
        Some(&SandboxValue::from("keel"))
    );
    let next = run(js("export default ({}).polluted;")).await;
    assert_eq!(next.result, SandboxValue::Undefined);
}

#[tokio::test]
async fn tight_loops_are_stopped_by_the_safety_cap() {
    for source in [
        "for (;;) {}",
        "while (true) { Math.random(); }",
        "const spin = () => Promise.resolve().then(spin); spin(); await new Promise(() => {});",
        "/(a+)+$/.test('a'.repeat(40) + '!');",
        "export default { get x() { for (;;) {} } };",
    ] {
        let result = run(js(source).with_safety_cap(Some(Duration::from_millis(100)))).await;
        assert_eq!(
            result.status,
            ExecutionStatus::Terminated,
            "{source}: {}",
            describe(&result)
        );
        let message = result.error.map(|e| e.message).unwrap_or_default();
        assert!(message.contains("safety cap"), "{source}: {message}");
    }
}

#[tokio::test]
async fn memory_bombs_settle_as_memory_or_error_never_crash() {
    for source in [
        "export default 'x'.repeat(2 ** 28).length;",
        "const xs = []; for (;;) xs.push({ a: [1, 2, 3], b: 'y'.repeat(100) });",
        "const m = new Map(); for (let i = 0; ; i++) m.set(i, [i]);",
        "export default new Uint8Array(2 ** 27).length;",
        "let s = 'ab'; for (let i = 0; i < 40; i++) s = s + s; export default s.split('').length;",
    ] {
        let result = run(js(source).with_memory_limit_bytes(16 * 1024 * 1024)).await;
        assert!(
            matches!(
                result.status,
                ExecutionStatus::Memory | ExecutionStatus::Error
            ),
            "{source}: {}",
            describe(&result)
        );
    }
    // Recursion overflows QuickJS's stack, not the host's.
    let deep = run(js("const f = (n) => f(n + 1) + 1; export default f(0);")).await;
    assert_eq!(deep.status, ExecutionStatus::Error, "{}", describe(&deep));
    let parse = run(js("export default JSON.parse('['.repeat(1e6));")).await;
    assert_eq!(parse.status, ExecutionStatus::Error, "{}", describe(&parse));
}

#[tokio::test]
async fn hostile_results_fail_as_serialization_errors() {
    for source in [
        // Too deep for a structured clone (and for the host's stack).
        "let v = []; for (let i = 0; i < 100000; i++) v = [v]; export default v;",
        // Cyclic.
        "const a = []; a.push(a); export default a;",
        // Cheap inside the isolate, huge outside it.
        "const a = []; a.length = 2 ** 32 - 1; export default a;",
        // A getter that throws while the host reads it.
        "export default { get x() { throw new Error('gotcha'); } };",
    ] {
        let result = run(js(source)).await;
        assert_eq!(
            result.status,
            ExecutionStatus::Error,
            "{source}: {}",
            describe(&result)
        );
    }
}

#[tokio::test]
async fn console_floods_are_truncated() {
    let result = run(js("for (let i = 0; i < 100000; i++) console.log('line', i, 'x'.repeat(100)); export default 1;")).await;
    assert_succeeded(&result);
    assert!(result.console_truncated);
    let bytes: usize = result.console.iter().map(|l| l.message.len()).sum();
    assert!(bytes <= keel_sandbox::MAX_CONSOLE_BYTES);
}

#[tokio::test]
async fn a_promise_nothing_can_settle_is_an_error_not_a_hang() {
    let result = run(js("export default await new Promise(() => {});")).await;
    assert_eq!(
        result.status,
        ExecutionStatus::Error,
        "{}",
        describe(&result)
    );
}

#[tokio::test]
async fn dropping_the_handle_stops_the_isolate() {
    let execution = run_code(js("for (;;) {}").with_safety_cap(None));
    let watcher = execution.clone();
    drop(execution);
    assert!(!watcher.is_settled(), "a clone still holds the execution");
    watcher.terminate(None);
    assert_eq!(watcher.result().await.status, ExecutionStatus::Terminated);
}

#[test]
fn host_functions_without_a_tokio_runtime_reject_inside_the_sandbox() {
    let execution = run_code(
        js("let r; try { await echo(1); r = 'called'; } catch (e) { r = e.message; } export default r;")
            .with_global("echo", echo().into()),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let result = runtime.block_on(execution.result());
    assert_succeeded(&result);
    assert!(
        result
            .result
            .as_str()
            .unwrap_or_default()
            .contains("tokio runtime"),
        "{}",
        describe(&result)
    );
}
