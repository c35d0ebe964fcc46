//! What a caller asks of `run_code`: the source, its language, what it may import and see.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::value::SandboxValue;

/// The memory limit when a request names none: 64 MiB of QuickJS heap.
pub const DEFAULT_MEMORY_LIMIT_BYTES: usize = 64 * 1024 * 1024;

/// The platform ceiling on `memory_limit_bytes`: 1 GiB.
///
/// A larger request is **clamped** to this ceiling (§13.4 option (a)); an overrun then
/// settles as `memory` with a message naming the effective limit.
pub const MAX_MEMORY_LIMIT_BYTES: usize = 1024 * 1024 * 1024;

/// The default safety cap: 30 s of JavaScript running without a break.
///
/// This is **not** a wall-clock timeout: time the sandbox spends waiting on host functions
/// does not count, only time spent executing JavaScript. When it fires the execution
/// settles as `terminated` with a message saying so (§13.4 "safety caps").
pub const DEFAULT_SAFETY_CAP: Duration = Duration::from_secs(30);

/// The source language (§13.6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// TypeScript: types are erased (never checked) before evaluation. The default.
    #[default]
    #[serde(alias = "ts")]
    Typescript,
    /// JavaScript, evaluated as written.
    #[serde(alias = "js")]
    Javascript,
}

/// Which export to run after module evaluation, and with what (§13.5).
#[derive(Clone, Debug, PartialEq)]
pub struct ExportSelection {
    /// The export to read; `"default"` unless set.
    pub function: String,
    /// Arguments when the export is a function; a non-function export with arguments
    /// settles as `error`.
    pub args: Vec<SandboxValue>,
}

impl Default for ExportSelection {
    fn default() -> Self {
        Self {
            function: "default".to_owned(),
            args: Vec::new(),
        }
    }
}

/// One `runCode` call: everything the sandbox may see comes from here.
///
/// ```
/// use keel_sandbox::{CodeExecutionRequest, Language, SandboxValue};
/// let request = CodeExecutionRequest::new("export default (a: number) => a * 2;")
///     .with_filename("double.ts")
///     .with_execute("default", vec![SandboxValue::from(21.0)]);
/// assert_eq!(request.language, Language::Typescript);
/// ```
#[derive(Clone, Debug)]
pub struct CodeExecutionRequest {
    /// The module source.
    pub source: String,
    /// The module's file name: `import.meta.url` is `sandbox:<filename>` and errors name it.
    pub filename: String,
    /// TypeScript (default) or JavaScript.
    pub language: Language,
    /// Bare specifier → the object whose frozen copy is that module's namespace; its
    /// `default` key, when present, is the default export.
    pub imports: BTreeMap<String, SandboxValue>,
    /// Relative specifier (`./util.ts`, resolved against `filename`) → module source,
    /// evaluated inside the sandbox in the request's language (`.js`/`.mjs` files as
    /// JavaScript).
    pub modules: BTreeMap<String, String>,
    /// Identifiers installed at module scope in every source module (never on
    /// `globalThis`). A `console` here replaces the built-in console capture.
    pub globals: BTreeMap<String, SandboxValue>,
    /// QuickJS heap limit; [`DEFAULT_MEMORY_LIMIT_BYTES`] when `None`, clamped to
    /// [`MAX_MEMORY_LIMIT_BYTES`].
    pub memory_limit_bytes: Option<usize>,
    /// The export to run (§13.5).
    pub execute: ExportSelection,
    /// The safety cap on uninterrupted JavaScript execution; `None` disables it, leaving
    /// `terminate` as the only way to stop a tight loop.
    pub safety_cap: Option<Duration>,
}

impl CodeExecutionRequest {
    /// A TypeScript request for `source` named `main.ts`, with no imports, modules or
    /// globals, the default memory limit and the default safety cap.
    pub fn new(source: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            filename: "main.ts".to_owned(),
            language: Language::Typescript,
            imports: BTreeMap::new(),
            modules: BTreeMap::new(),
            globals: BTreeMap::new(),
            memory_limit_bytes: None,
            execute: ExportSelection::default(),
            safety_cap: Some(DEFAULT_SAFETY_CAP),
        }
    }

    /// Sets the file name.
    #[must_use]
    pub fn with_filename(mut self, filename: impl Into<String>) -> Self {
        self.filename = filename.into();
        self
    }

    /// Sets the language.
    #[must_use]
    pub fn with_language(mut self, language: Language) -> Self {
        self.language = language;
        self
    }

    /// Offers a synthetic module under a bare specifier.
    #[must_use]
    pub fn with_import(mut self, specifier: impl Into<String>, namespace: SandboxValue) -> Self {
        self.imports.insert(specifier.into(), namespace);
        self
    }

    /// Offers a source module under a relative specifier.
    #[must_use]
    pub fn with_module(mut self, specifier: impl Into<String>, source: impl Into<String>) -> Self {
        self.modules.insert(specifier.into(), source.into());
        self
    }

    /// Installs a module-scope identifier.
    #[must_use]
    pub fn with_global(mut self, name: impl Into<String>, value: SandboxValue) -> Self {
        self.globals.insert(name.into(), value);
        self
    }

    /// Sets the memory limit in bytes.
    #[must_use]
    pub fn with_memory_limit_bytes(mut self, bytes: usize) -> Self {
        self.memory_limit_bytes = Some(bytes);
        self
    }

    /// Selects the export to run and its arguments.
    #[must_use]
    pub fn with_execute(mut self, function: impl Into<String>, args: Vec<SandboxValue>) -> Self {
        self.execute = ExportSelection {
            function: function.into(),
            args,
        };
        self
    }

    /// Sets (or with `None` removes) the safety cap.
    #[must_use]
    pub fn with_safety_cap(mut self, cap: Option<Duration>) -> Self {
        self.safety_cap = cap;
        self
    }

    /// The memory limit that applies: the requested one (or the default), clamped to the
    /// ceiling.
    pub fn effective_memory_limit(&self) -> usize {
        self.memory_limit_bytes
            .unwrap_or(DEFAULT_MEMORY_LIMIT_BYTES)
            .min(MAX_MEMORY_LIMIT_BYTES)
    }
}
