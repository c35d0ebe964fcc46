//! Module linking: checking and preparing the caller's source modules, and the resolver and
//! loader that link only what the request supplied (no URLs, nothing above the module root).

use std::cell::RefCell;
use std::rc::Rc;

use rquickjs::loader::{ImportAttributes, Loader, Resolver};
use rquickjs::{Ctx, Module};

use super::Outcome;
use crate::request::{CodeExecutionRequest, Language};
use crate::result::{ExecutionError, ExecutionStatus};
use crate::transpile::{self, PositionMap};
use crate::value::SandboxValue;

/// A source module after preparation, under its canonical module name.
pub(super) struct SourceModule {
    pub(super) name: String,
    pub(super) code: String,
    pub(super) positions: PositionMap,
}

/// Everything the resolver may link, by canonical name.
#[derive(Default)]
pub(super) struct ModuleTable {
    /// Canonical names of source modules (main and `modules`).
    pub(super) sources: Vec<String>,
    /// Prepared code of the source modules, by canonical name.
    pub(super) code: std::collections::HashMap<String, String>,
    /// Bare specifiers supplied through `imports`.
    pub(super) imports: Vec<String>,
    /// The private module that carries module-scope globals.
    pub(super) globals_module: String,
    /// Every resolution failure, in order (for `link_error` classification).
    pub(super) failures: Vec<String>,
}

#[derive(Clone)]
pub(super) struct Linker(pub(super) Rc<RefCell<ModuleTable>>);

impl Resolver for Linker {
    fn resolve<'js>(
        &mut self,
        _ctx: &Ctx<'js>,
        base: &str,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<String> {
        let mut table = self.0.borrow_mut();
        let resolved = if name == table.globals_module {
            Ok(name.to_owned())
        } else if name.starts_with("./") || name.starts_with("../") {
            let candidate = join_relative(dirname(base), name);
            match candidate {
                Some(path) => find_source(&table.sources, &path)
                    .ok_or_else(|| format!("'{name}' is not supplied in options.modules")),
                None => Err(format!("'{name}' escapes the sandbox's module root")),
            }
        } else if is_url(name) {
            Err(format!("URL imports are not allowed ('{name}')"))
        } else if table.imports.iter().any(|spec| spec == name) {
            Ok(import_module_name(name))
        } else {
            Err(format!("'{name}' is not supplied in options.imports"))
        };
        resolved.map_err(|message| {
            table.failures.push(message.clone());
            rquickjs::Error::new_resolving_message(base, name, message)
        })
    }
}

impl Loader for Linker {
    fn load<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<Module<'js>> {
        // Synthetic modules are declared before evaluation starts; source modules are
        // declared here, on first import, from their prepared code.
        let code = self.0.borrow().code.get(name).cloned();
        let Some(code) = code else {
            let message = format!("'{name}' is not a sandbox module");
            self.0.borrow_mut().failures.push(message.clone());
            return Err(rquickjs::Error::new_loading_message(name, message));
        };
        let module = Module::declare(ctx.clone(), name, code)?;
        module.meta()?.set("url", format!("sandbox:{name}"))?;
        Ok(module)
    }
}

pub(super) fn import_module_name(specifier: &str) -> String {
    format!("import:{specifier}")
}

fn is_url(specifier: &str) -> bool {
    specifier.starts_with('/')
        || specifier.contains("://")
        || ["data:", "file:", "http:", "https:", "blob:", "javascript:"]
            .iter()
            .any(|scheme| specifier.starts_with(scheme))
}

fn dirname(path: &str) -> &str {
    path.rfind('/').map_or("", |i| &path[..i])
}

/// Joins a relative specifier onto a directory; `None` when `..` climbs above the root.
fn join_relative(dir: &str, specifier: &str) -> Option<String> {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in specifier.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

fn find_source(sources: &[String], path: &str) -> Option<String> {
    const SUFFIXES: [&str; 7] = ["", ".ts", ".js", ".mjs", ".mts", "/index.ts", "/index.js"];
    SUFFIXES.iter().find_map(|suffix| {
        let candidate = format!("{path}{suffix}");
        sources.iter().find(|s| **s == candidate).cloned()
    })
}

fn is_identifier(name: &str) -> bool {
    const RESERVED: [&str; 46] = [
        "await",
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "debugger",
        "default",
        "delete",
        "do",
        "else",
        "enum",
        "export",
        "extends",
        "false",
        "finally",
        "for",
        "function",
        "if",
        "implements",
        "import",
        "in",
        "instanceof",
        "interface",
        "let",
        "new",
        "null",
        "package",
        "private",
        "protected",
        "public",
        "return",
        "static",
        "super",
        "switch",
        "this",
        "throw",
        "true",
        "try",
        "typeof",
        "var",
        "void",
        "while",
        "with",
        "yield",
    ];
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c == '$' || c == '_' || c.is_alphabetic());
    first_ok
        && chars.all(|c| c == '$' || c == '_' || c.is_alphanumeric())
        && !RESERVED.contains(&name)
}

pub(super) struct PreparedSources {
    pub(super) modules: Vec<SourceModule>,
    pub(super) globals_module: String,
}

/// Parses (and for TypeScript, erases) every source module and checks names.
pub(super) fn prepare_sources(
    request: &CodeExecutionRequest,
) -> Result<PreparedSources, Box<Outcome>> {
    let main_name = join_relative("", &request.filename)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Box::new(Outcome::link_error(format!(
                "invalid filename '{}'",
                request.filename
            )))
        })?;
    let nonce = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x6b65_656c);
        h.finish()
    };
    let globals_module = format!("keel-globals:{nonce:016x}");
    for name in request.globals.keys() {
        if !is_identifier(name) {
            return Err(Box::new(Outcome::link_error(format!(
                "global '{name}' is not a valid identifier"
            ))));
        }
    }
    for (specifier, namespace) in &request.imports {
        if !matches!(namespace, SandboxValue::Object(_)) {
            return Err(Box::new(Outcome::link_error(format!(
                "import '{specifier}' must be an object (its namespace)"
            ))));
        }
        if specifier.starts_with('.') || is_url(specifier) {
            return Err(Box::new(Outcome::link_error(format!(
                "import '{specifier}' must be a bare specifier"
            ))));
        }
    }
    let mut inputs: Vec<(String, &str)> = vec![(main_name.clone(), request.source.as_str())];
    for (specifier, source) in &request.modules {
        if !(specifier.starts_with("./") || specifier.starts_with("../")) {
            return Err(Box::new(Outcome::link_error(format!(
                "module '{specifier}' must be a relative specifier (./ or ../)"
            ))));
        }
        let Some(name) = join_relative(dirname(&main_name), specifier) else {
            return Err(Box::new(Outcome::link_error(format!(
                "module '{specifier}' escapes the sandbox's module root"
            ))));
        };
        inputs.push((name, source.as_str()));
    }
    let mut global_names: Vec<String> = request.globals.keys().cloned().collect();
    if !request.globals.contains_key("console") {
        global_names.push("console".to_owned());
    }
    let mut modules = Vec::with_capacity(inputs.len());
    for (name, source) in inputs {
        let typescript = request.language == Language::Typescript
            && !(name.ends_with(".js") || name.ends_with(".mjs"));
        // The transformer is third-party code run on untrusted input: contain its panics.
        let prepared = std::panic::catch_unwind(|| transpile::prepare(source, &name, typescript))
            .unwrap_or_else(|_| {
                Err(transpile::EraseError {
                    message: "the TypeScript transformer could not process this source".to_owned(),
                    line: None,
                    column: None,
                })
            });
        let prepared = prepared.map_err(|e| {
            Box::new(Outcome::failure(
                ExecutionStatus::Error,
                ExecutionError {
                    name: "SyntaxError".to_owned(),
                    message: e.message,
                    line: e.line,
                    column: e.column,
                    file: Some(name.clone()),
                },
            ))
        })?;
        let injected: Vec<&str> = global_names
            .iter()
            .filter(|g| !prepared.top_level.contains(g.as_str()))
            .map(String::as_str)
            .collect();
        let mut code = prepared.code;
        if !injected.is_empty() {
            // Appended, not prepended: import declarations are hoisted, and the caller's
            // lines and columns stay where they were.
            code.push_str(&format!(
                "\n;import {{ {} }} from {};\n",
                injected.join(", "),
                js_string(&globals_module)
            ));
        }
        modules.push(SourceModule {
            name,
            code,
            positions: prepared.positions,
        });
    }
    Ok(PreparedSources {
        modules,
        globals_module,
    })
}

pub(super) fn js_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_join_and_refuse_to_climb_out() {
        assert_eq!(join_relative("", "./a/b.ts").as_deref(), Some("a/b.ts"));
        assert_eq!(join_relative("a", "../c.ts").as_deref(), Some("c.ts"));
        assert_eq!(join_relative("", "../c.ts"), None);
    }

    #[test]
    fn identifiers_are_checked() {
        assert!(is_identifier("fetchData"));
        assert!(is_identifier("$x_1"));
        assert!(!is_identifier("1x"));
        assert!(!is_identifier("class"));
        assert!(!is_identifier("a-b"));
    }

    #[test]
    fn urls_are_recognised() {
        assert!(is_url("https://example.com/x.js"));
        assert!(is_url("data:text/javascript,1"));
        assert!(is_url("/etc/passwd"));
        assert!(!is_url("lodash"));
    }
}
