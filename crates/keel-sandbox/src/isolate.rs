//! One QuickJS isolate per call: set-up, lockdown, the event loop, host calls, teardown; module
//! linking and the structured clone across the boundary sit in the submodules.
//!
//! Everything here runs on the execution's own thread: a QuickJS runtime is `!Send` and never
//! leaves it. The thread talks to the rest of the process through [`Event`]s (host-function
//! completions, termination) and the [`Shared`] state the handle also sees.

mod linking;
mod structured_clone;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rquickjs::context::intrinsic;
use rquickjs::promise::PromiseState;
use rquickjs::{
    Array, CatchResultExt, CaughtError, Context, Ctx, Function, Module, Object, Promise, Runtime,
    Value,
};

use linking::{
    import_module_name, js_string, prepare_sources, Linker, ModuleTable, PreparedSources,
};
use structured_clone::{to_host, to_sandbox, PREALLOCATE};

use crate::execution::{Event, Shared};
use crate::limits::{LimitedAllocator, MemoryControl};
use crate::request::CodeExecutionRequest;
use crate::result::{ConsoleLevel, ExecutionError, ExecutionStatus};
use crate::value::{HostFunction, SandboxValue};

/// QuickJS's own stack limit; the thread running the isolate gets a larger stack.
const MAX_STACK_BYTES: usize = 1024 * 1024;

/// How a run ended, before the handle adds the console lines.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub status: ExecutionStatus,
    pub value: SandboxValue,
    pub error: Option<ExecutionError>,
}

impl Outcome {
    fn success(value: SandboxValue) -> Self {
        Self {
            status: ExecutionStatus::Success,
            value,
            error: None,
        }
    }

    fn failure(status: ExecutionStatus, error: ExecutionError) -> Self {
        Self {
            status,
            value: SandboxValue::Undefined,
            error: Some(error),
        }
    }

    fn link_error(message: impl Into<String>) -> Self {
        Self::failure(
            ExecutionStatus::LinkError,
            ExecutionError::new("LinkError", message),
        )
    }
}
/// Safety-cap bookkeeping shared between the event loop and the interrupt handler.
struct Clock {
    started: Instant,
    waiting: Cell<Duration>,
    cap: Option<Duration>,
    fired: Cell<bool>,
}

impl Clock {
    fn running_time(&self) -> Duration {
        self.started.elapsed().saturating_sub(self.waiting.get())
    }
}

/// Runs one request to completion on the current thread.
pub(crate) fn run(
    request: CodeExecutionRequest,
    shared: &Arc<Shared>,
    events: &Receiver<Event>,
    sender: &Sender<Event>,
    tokio: Option<tokio::runtime::Handle>,
) -> Outcome {
    let limit = request.effective_memory_limit();
    let prepared = match prepare_sources(&request) {
        Ok(p) => p,
        Err(outcome) => return *outcome,
    };
    let allocator = LimitedAllocator::new(limit);
    let memory = allocator.control();
    let memory_outcome = move || {
        Outcome::failure(
            ExecutionStatus::Memory,
            ExecutionError::new(
                "RangeError",
                format!("memory limit of {limit} bytes exceeded (the effective memoryLimitBytes)"),
            ),
        )
    };
    let Ok(runtime) = Runtime::new_with_alloc(allocator) else {
        return memory_outcome();
    };
    runtime.set_max_stack_size(MAX_STACK_BYTES);
    let clock = Rc::new(Clock {
        started: Instant::now(),
        waiting: Cell::new(Duration::ZERO),
        cap: request.safety_cap,
        fired: Cell::new(false),
    });
    {
        let shared = Arc::clone(shared);
        let memory = memory.clone();
        let clock = Rc::clone(&clock);
        runtime.set_interrupt_handler(Some(Box::new(move || {
            if shared.terminate_requested() || memory.exceeded() {
                return true;
            }
            if let Some(cap) = clock.cap {
                if clock.running_time() > cap {
                    clock.fired.set(true);
                    return true;
                }
            }
            false
        })));
    }
    let table = Rc::new(RefCell::new(ModuleTable {
        sources: prepared.modules.iter().map(|m| m.name.clone()).collect(),
        code: prepared
            .modules
            .iter()
            .map(|m| (m.name.clone(), m.code.clone()))
            .collect(),
        imports: request.imports.keys().cloned().collect(),
        globals_module: prepared.globals_module.clone(),
        failures: Vec::new(),
    }));
    runtime.set_loader(Linker(Rc::clone(&table)), Linker(Rc::clone(&table)));
    let context = Context::builder()
        .with::<intrinsic::Date>()
        .with::<intrinsic::Eval>()
        .with::<intrinsic::RegExpCompiler>()
        .with::<intrinsic::RegExp>()
        .with::<intrinsic::Json>()
        .with::<intrinsic::Proxy>()
        .with::<intrinsic::MapSet>()
        .with::<intrinsic::TypedArrays>()
        .with::<intrinsic::Promise>()
        .with::<intrinsic::WeakRef>()
        .build(&runtime);
    let Ok(context) = context else {
        return memory_outcome();
    };
    let bridge = Bridge {
        shared: Arc::clone(shared),
        sender: sender.clone(),
        tokio,
        functions: RefCell::new(Vec::new()),
        outstanding: Cell::new(0),
    };
    let bridge = Rc::new(bridge);
    let mut outcome = context.with(|ctx| {
        let session = Session {
            ctx: ctx.clone(),
            request: &request,
            prepared: &prepared,
            table: &table,
            bridge: &bridge,
            clock: &clock,
            memory: &memory,
            events,
            shared,
        };
        session.run()
    });
    // Classify stops that the event loop saw only as an uncatchable interrupt.
    if shared.terminate_requested() {
        outcome = Outcome::failure(
            ExecutionStatus::Terminated,
            ExecutionError::new("TerminationError", shared.termination_message()),
        );
    } else if memory.exceeded() {
        outcome = memory_outcome();
    } else if clock.fired.get() {
        let cap = clock.cap.unwrap_or_default();
        outcome = Outcome::failure(
            ExecutionStatus::Terminated,
            ExecutionError::new(
                "TerminationError",
                format!(
                    "safety cap: the sandbox ran JavaScript for more than {} ms without finishing",
                    cap.as_millis()
                ),
            ),
        );
    }
    drop(context);
    drop(runtime);
    outcome
}

/// The host side of the callable proxies: host functions, outstanding calls, the way back.
struct Bridge {
    shared: Arc<Shared>,
    sender: Sender<Event>,
    tokio: Option<tokio::runtime::Handle>,
    functions: RefCell<Vec<HostFunction>>,
    outstanding: Cell<usize>,
}

impl Bridge {
    fn register(&self, function: &HostFunction) -> usize {
        let mut functions = self.functions.borrow_mut();
        functions.push(function.clone());
        functions.len() - 1
    }

    /// Starts host function `index` off the isolate's thread.
    fn start(&self, index: usize, id: f64, args: Vec<SandboxValue>) -> Result<(), String> {
        if self.shared.terminate_requested() {
            return Err("the execution is terminating".to_owned());
        }
        let function = self
            .functions
            .borrow()
            .get(index)
            .cloned()
            .ok_or_else(|| "unknown host function".to_owned())?;
        let Some(tokio) = self.tokio.as_ref() else {
            return Err(format!(
                "host function '{}' needs a tokio runtime: call run_code from within one",
                function.name()
            ));
        };
        let sender = self.sender.clone();
        let future = function.call(args);
        self.outstanding.set(self.outstanding.get() + 1);
        tokio.spawn(async move {
            let result = future.await;
            // The isolate may be gone (terminated); then nobody listens and that is fine.
            let _ = sender.send(Event::HostDone { id, result });
        });
        Ok(())
    }
}

/// The private helpers returned by `setup.js`.
struct Helpers<'js> {
    object: Object<'js>,
}

impl<'js> Helpers<'js> {
    fn func(&self, name: &str) -> rquickjs::Result<Function<'js>> {
        self.object.get(name)
    }

    /// What helper `name` answers for `value`; a failure becomes its text.
    fn call_on<T: rquickjs::FromJs<'js>>(
        &self,
        name: &str,
        value: impl rquickjs::IntoJs<'js>,
    ) -> Result<T, String> {
        self.func(name)
            .and_then(|f| f.call((value,)))
            .map_err(|e| e.to_string())
    }
}

/// One evaluation inside an entered context.
struct Session<'a, 'js> {
    ctx: Ctx<'js>,
    request: &'a CodeExecutionRequest,
    prepared: &'a PreparedSources,
    table: &'a Rc<RefCell<ModuleTable>>,
    bridge: &'a Rc<Bridge>,
    clock: &'a Rc<Clock>,
    memory: &'a MemoryControl,
    events: &'a Receiver<Event>,
    shared: &'a Arc<Shared>,
}

/// Why the event loop stopped waiting.
enum Wait<'js> {
    Settled(Value<'js>),
    Threw(Value<'js>),
    Stopped,
    Stuck,
}

impl<'js> Session<'_, 'js> {
    fn run(&self) -> Outcome {
        let helpers = match self.install() {
            Ok(h) => h,
            Err(e) => return self.engine_failure(None, e),
        };
        if !self.memory.enforce() {
            // `run` reports the overrun with the effective limit.
            return self.stopped_outcome();
        }
        self.evaluate(&helpers)
    }

    /// Runs `setup.js`, declares the synthetic modules and every source module.
    fn install(&self) -> rquickjs::Result<Helpers<'js>> {
        let ctx = &self.ctx;
        let setup: Function = ctx.eval(include_str!("setup.js"))?;
        let bridge = Rc::clone(self.bridge);
        let limit = self.request.effective_memory_limit();
        let host_call = Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, index: f64, id: f64, args: Array<'js>, helpers: Object<'js>| {
                let helpers = Helpers { object: helpers };
                let mut budget = limit;
                let mut out = Vec::with_capacity(args.len().min(PREALLOCATE));
                for arg in args.iter::<Value>() {
                    match to_host(&helpers, arg?, 0, &mut budget) {
                        Ok(v) => out.push(v),
                        Err(message) => {
                            let error = make_error(&helpers, "SerializationError", &message)?;
                            return Err(ctx.throw(error));
                        }
                    }
                }
                let index = if index.is_finite() && index >= 0.0 {
                    index as usize
                } else {
                    usize::MAX
                };
                if let Err(message) = bridge.start(index, id, out) {
                    let error = make_error(&helpers, "Error", &message)?;
                    return Err(ctx.throw(error));
                }
                Ok(())
            },
        )?;
        let shared = Arc::clone(self.shared);
        let console_write = Function::new(ctx.clone(), move |level: String, text: String| {
            let level = match level.as_str() {
                "info" => ConsoleLevel::Info,
                "warn" => ConsoleLevel::Warn,
                "error" => ConsoleLevel::Error,
                "debug" => ConsoleLevel::Debug,
                _ => ConsoleLevel::Log,
            };
            shared.push_console(level, text);
        })?;
        let object: Object = setup.call((host_call, console_write))?;
        let helpers = Helpers { object };

        // Module-scope globals, carried by a private synthetic module.
        let globals = Object::new(ctx.clone())?;
        for (name, value) in &self.request.globals {
            let v = self.to_sandbox(&helpers, value, 0)?;
            globals.set(name.as_str(), v)?;
        }
        if !self.request.globals.contains_key("console") {
            let console: Value = helpers.object.get("console")?;
            globals.set("console", console)?;
        }
        let mut names: Vec<String> = self.request.globals.keys().cloned().collect();
        if !self.request.globals.contains_key("console") {
            names.push("console".to_owned());
        }
        self.declare_synthetic(&self.prepared.globals_module, &names, globals.into_value())?;

        // Synthetic modules for `imports`: frozen copies with `default` as default export.
        for (specifier, namespace) in &self.request.imports {
            let value = self.to_sandbox(&helpers, namespace, 0)?;
            let frozen: Value = helpers.func("deepFreeze")?.call((value,))?;
            let keys: Vec<String> = match namespace {
                SandboxValue::Object(entries) => entries.iter().map(|(k, _)| k.clone()).collect(),
                _ => Vec::new(),
            };
            self.declare_synthetic(&import_module_name(specifier), &keys, frozen)?;
        }
        Ok(helpers)
    }

    /// Declares a module that re-exports `keys` of `value` (handed over via `import.meta`).
    fn declare_synthetic(
        &self,
        name: &str,
        keys: &[String],
        value: Value<'js>,
    ) -> rquickjs::Result<()> {
        let mut source = String::from("const __keel_value = import.meta.keelValue;\n");
        for (i, key) in keys.iter().enumerate() {
            source.push_str(&format!(
                "const __keel_{i} = __keel_value[{key}];\nexport {{ __keel_{i} as {key} }};\n",
                key = js_string(key)
            ));
        }
        let module = Module::declare(self.ctx.clone(), name, source)?;
        let meta = module.meta()?;
        meta.set("keelValue", value)?;
        meta.set("url", format!("sandbox:{name}"))?;
        Ok(())
    }

    fn evaluate(&self, helpers: &Helpers<'js>) -> Outcome {
        // The main module; the others are declared by the loader as they are imported.
        let Some(source) = self.prepared.modules.first() else {
            return Outcome::link_error("no main module");
        };
        let main =
            match Module::declare(self.ctx.clone(), source.name.as_str(), source.code.as_str())
                .catch(&self.ctx)
            {
                Ok(module) => module,
                Err(caught) => return self.caught_outcome(helpers, caught),
            };
        let url = format!("sandbox:{}", source.name);
        if let Err(e) = main.meta().and_then(|m| m.set("url", url)) {
            return self.engine_failure(Some(helpers), e);
        }
        let (module, promise) = match main.eval().catch(&self.ctx) {
            Ok(pair) => pair,
            Err(caught) => return self.caught_outcome(helpers, caught),
        };
        match self.wait(helpers, &promise) {
            Wait::Settled(_) => {}
            Wait::Threw(error) => return self.thrown_outcome(helpers, error),
            Wait::Stopped => return self.stopped_outcome(),
            Wait::Stuck => return stuck_outcome("module evaluation"),
        }

        // Configured export resolution (§13.5).
        let selection = &self.request.execute;
        let namespace = match module.namespace() {
            Ok(ns) => ns,
            Err(e) => return self.engine_failure(Some(helpers), e),
        };
        let has_export = namespace
            .contains_key(selection.function.as_str())
            .unwrap_or(false);
        if !has_export {
            return Outcome::link_error(format!(
                "the module has no export named '{}'",
                selection.function
            ));
        }
        let mut candidate: Value = match namespace.get(selection.function.as_str()).catch(&self.ctx)
        {
            Ok(v) => v,
            Err(caught) => return self.caught_outcome(helpers, caught),
        };
        if let Some(function) = candidate.as_function().cloned() {
            let mut args = rquickjs::function::Args::new(self.ctx.clone(), selection.args.len());
            for arg in &selection.args {
                let pushed = self
                    .to_sandbox(helpers, arg, 0)
                    .and_then(|v| args.push_arg(v));
                if let Err(e) = pushed {
                    return self.engine_failure(Some(helpers), e);
                }
            }
            candidate = match function.call_arg::<Value>(args).catch(&self.ctx) {
                Ok(v) => v,
                Err(caught) => return self.caught_outcome(helpers, caught),
            };
        } else if !selection.args.is_empty() {
            return Outcome::failure(
                ExecutionStatus::Error,
                ExecutionError::new(
                    "TypeError",
                    format!(
                        "export '{}' is not a function, but execute.args were given",
                        selection.function
                    ),
                ),
            );
        }
        // Await thenables until the value is not one.
        loop {
            if !self.is_thenable(&candidate) {
                break;
            }
            let promise = match self.promise_resolve(candidate) {
                Ok(p) => p,
                Err(e) => return self.engine_failure(Some(helpers), e),
            };
            candidate = match self.wait(helpers, &promise) {
                Wait::Settled(v) => v,
                Wait::Threw(error) => return self.thrown_outcome(helpers, error),
                Wait::Stopped => return self.stopped_outcome(),
                Wait::Stuck => return stuck_outcome("the selected export's promise"),
            };
        }
        match to_host(
            helpers,
            candidate,
            0,
            &mut self.request.effective_memory_limit(),
        ) {
            Ok(value) => Outcome::success(value),
            Err(message) => {
                if self.any_stop() {
                    return self.stopped_outcome();
                }
                Outcome::failure(
                    ExecutionStatus::Error,
                    ExecutionError::new("SerializationError", message),
                )
            }
        }
    }

    fn is_thenable(&self, value: &Value<'js>) -> bool {
        if value.is_promise() {
            return true;
        }
        match value.as_object() {
            Some(obj) => obj
                .get::<_, Value>("then")
                .map(|then| then.is_function())
                .unwrap_or(false),
            None => false,
        }
    }

    fn promise_resolve(&self, value: Value<'js>) -> rquickjs::Result<Promise<'js>> {
        let (promise, resolve, _reject) = self.ctx.promise()?;
        let _: Value = resolve.call((value,))?;
        Ok(promise)
    }

    fn any_stop(&self) -> bool {
        self.shared.terminate_requested() || self.clock.fired.get()
    }

    /// Drives the job queue and host completions until `promise` settles.
    fn wait(&self, helpers: &Helpers<'js>, promise: &Promise<'js>) -> Wait<'js> {
        loop {
            while self.ctx.execute_pending_job() {
                if self.any_stop() {
                    return Wait::Stopped;
                }
            }
            if self.any_stop() {
                return Wait::Stopped;
            }
            match promise.state() {
                PromiseState::Resolved => {
                    return match promise.result::<Value>() {
                        Some(Ok(v)) => Wait::Settled(v),
                        _ => Wait::Threw(self.ctx.catch()),
                    };
                }
                PromiseState::Rejected => {
                    let _ = promise.result::<Value>();
                    return Wait::Threw(self.ctx.catch());
                }
                PromiseState::Pending => {}
            }
            if self.bridge.outstanding.get() == 0 {
                return Wait::Stuck;
            }
            let waited = Instant::now();
            let event = self.events.recv();
            self.clock
                .waiting
                .set(self.clock.waiting.get() + waited.elapsed());
            match event {
                Ok(Event::HostDone { id, result }) => {
                    self.bridge
                        .outstanding
                        .set(self.bridge.outstanding.get().saturating_sub(1));
                    if self.deliver(helpers, id, result).is_err() && self.any_stop() {
                        return Wait::Stopped;
                    }
                }
                Ok(Event::Terminate) | Err(_) => return Wait::Stopped,
            }
        }
    }

    /// Settles a proxy's promise with a host function's result.
    fn deliver(
        &self,
        helpers: &Helpers<'js>,
        id: f64,
        result: Result<SandboxValue, crate::value::HostError>,
    ) -> rquickjs::Result<()> {
        let settle = helpers.func("settle")?;
        let (ok, value) = match result {
            Ok(value) => match self.to_sandbox(helpers, &value, 0) {
                Ok(v) => (true, v),
                Err(_) => (
                    false,
                    make_error(
                        helpers,
                        "SerializationError",
                        "could not clone the host function's result",
                    )?,
                ),
            },
            Err(error) => (false, make_error(helpers, &error.name, &error.message)?),
        };
        let _: Value = settle
            .call((id, ok, value))
            .catch(&self.ctx)
            .map_err(|_| rquickjs::Error::Exception)?;
        Ok(())
    }

    /// Structured clone host → sandbox.
    fn to_sandbox(
        &self,
        helpers: &Helpers<'js>,
        value: &SandboxValue,
        depth: usize,
    ) -> rquickjs::Result<Value<'js>> {
        to_sandbox(&self.ctx, helpers, self.bridge, value, depth)
    }

    fn stopped_outcome(&self) -> Outcome {
        // `run` replaces this with the precise terminated/memory/safety-cap outcome.
        Outcome::failure(
            ExecutionStatus::Terminated,
            ExecutionError::new("TerminationError", self.shared.termination_message()),
        )
    }

    fn engine_failure(&self, helpers: Option<&Helpers<'js>>, error: rquickjs::Error) -> Outcome {
        if matches!(error, rquickjs::Error::Exception) {
            let thrown = self.ctx.catch();
            return match helpers {
                Some(helpers) => self.thrown_outcome(helpers, thrown),
                None => self.thrown_outcome_plain(thrown),
            };
        }
        Outcome::failure(
            ExecutionStatus::Error,
            ExecutionError::new("InternalError", error.to_string()),
        )
    }

    fn caught_outcome(&self, helpers: &Helpers<'js>, caught: CaughtError<'js>) -> Outcome {
        match caught {
            CaughtError::Exception(e) => self.thrown_outcome(helpers, e.into_value()),
            CaughtError::Value(v) => self.thrown_outcome(helpers, v),
            CaughtError::Error(e) => {
                if let rquickjs::Error::Resolving { .. } | rquickjs::Error::Loading { .. } = e {
                    return Outcome::link_error(e.to_string());
                }
                Outcome::failure(
                    ExecutionStatus::Error,
                    ExecutionError::new("InternalError", e.to_string()),
                )
            }
        }
    }

    fn thrown_outcome_plain(&self, thrown: Value<'js>) -> Outcome {
        let message = thrown
            .as_object()
            .and_then(|o| o.get::<_, String>("message").ok())
            .unwrap_or_else(|| "uncaught exception".to_owned());
        Outcome::failure(
            ExecutionStatus::Error,
            ExecutionError::new("Error", message),
        )
    }

    /// Turns a thrown value into an outcome with a position in the caller's source.
    fn thrown_outcome(&self, helpers: &Helpers<'js>, thrown: Value<'js>) -> Outcome {
        let mut error = ExecutionError::new("Error", "uncaught exception");
        let mut stack = None;
        if let Some(obj) = thrown.as_object().filter(|_| thrown.is_error()) {
            if let Ok(name) = obj.get::<_, String>("name") {
                error.name = name;
            }
            if let Ok(message) = obj.get::<_, String>("message") {
                error.message = message;
            }
            stack = obj.get::<_, String>("stack").ok();
        } else if let Ok(text) = helpers.call_on::<String>("format", thrown.clone()) {
            error.message = text;
        }
        if let Some(stack) = stack {
            self.locate(&mut error, &stack);
        }
        let link_failed = !self.table.borrow().failures.is_empty()
            && (error.message.starts_with("Error resolving module")
                || error.message.starts_with("Error loading module"));
        let status = if link_failed {
            ExecutionStatus::LinkError
        } else if error.message == "out of memory" {
            ExecutionStatus::Memory
        } else {
            ExecutionStatus::Error
        };
        Outcome::failure(status, error)
    }

    /// Finds the first stack frame in a source module and maps it to the caller's source.
    fn locate(&self, error: &mut ExecutionError, stack: &str) {
        for frame in stack.lines() {
            let frame = frame.trim();
            let Some(rest) = frame.strip_prefix("at ") else {
                continue;
            };
            let location = match (rest.rfind('('), rest.ends_with(')')) {
                (Some(open), true) => &rest[open + 1..rest.len() - 1],
                _ => rest,
            };
            let mut parts = location.rsplitn(3, ':');
            let (Some(col), Some(line), Some(file)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(line), Ok(col)) = (line.parse::<u32>(), col.parse::<u32>()) else {
                continue;
            };
            if let Some(module) = self.prepared.modules.iter().find(|m| m.name == file) {
                let (line, column) = module.positions.original(line, col);
                error.line = Some(line);
                error.column = Some(column);
                error.file = Some(module.name.clone());
                return;
            }
        }
    }
}

fn stuck_outcome(what: &str) -> Outcome {
    Outcome::failure(
        ExecutionStatus::Error,
        ExecutionError::new(
            "Error",
            format!("{what} never settles: it awaits a promise nothing can resolve"),
        ),
    )
}

fn make_error<'js>(
    helpers: &Helpers<'js>,
    name: &str,
    message: &str,
) -> rquickjs::Result<Value<'js>> {
    helpers.func("makeError")?.call((name, message))
}
