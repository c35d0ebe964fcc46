//! `cargo xtask tidy`: architecture invariants read off the source, as rust-analyzer's tidy
//! tests do. Today one: keel-transport reaches the engine's stores only through the engine's
//! read-and-watch API (`keel_agent::reads`), so `crates/keel-transport/src` never names a
//! keel-runtime store trait and never calls `.runtime()`.
//!
//! The trait names are read from keel-runtime's source (every `pub trait` outside its
//! `testing` module that its `lib.rs` exports), so a new store trait is covered the day it is
//! added. Comments, string and character literals are blanked before looking, and a name
//! reached through another crate's path (`tokio::runtime::Runtime`) is not keel-runtime's.

use std::path::{Path, PathBuf};

use crate::util::workspace_root;

/// The source tree that may not name a store.
const GUARDED: &str = "crates/keel-transport/src";
/// Where the store traits are defined.
const RUNTIME_SRC: &str = "crates/keel-runtime/src";

/// Runs the check; `Err` lists every violation as `file:line: what`.
pub fn check() -> Result<(), String> {
    let root = workspace_root();
    let traits = store_traits(&root.join(RUNTIME_SRC))?;
    if traits.is_empty() {
        return Err(format!("found no `pub trait` in {RUNTIME_SRC}"));
    }
    let mut problems = Vec::new();
    for file in rust_files(&root.join(GUARDED))? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let label = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        problems.extend(violations(&label, &text, &traits));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{GUARDED} must reach stores only through keel_agent::reads \
             (the engine's read-and-watch API):\n{}",
            problems.join("\n")
        ))
    }
}

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The traits keel-runtime exports: each `pub trait Name` of its source outside `testing/`
/// that its `lib.rs` names.
fn store_traits(src: &Path) -> Result<Vec<String>, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs"))
        .map_err(|e| format!("reading {}/lib.rs: {e}", src.display()))?;
    let lib_code = blank_comments_and_literals(&lib);
    let mut names = Vec::new();
    for file in rust_files(src)? {
        if file
            .strip_prefix(src)
            .is_ok_and(|p| p.starts_with("testing"))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        names.extend(declared_traits(&blank_comments_and_literals(&text)));
    }
    names.retain(|name| words(&lib_code).any(|(_, word)| word == name));
    names.sort();
    names.dedup();
    Ok(names)
}

/// The names after `pub trait` in `code`.
fn declared_traits(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut previous: [&str; 2] = ["", ""];
    for (_, word) in words(code) {
        if previous == ["pub", "trait"] {
            out.push(word.to_owned());
        }
        previous = [previous[1], word];
    }
    out
}

/// Where `text` (a file of `crates/keel-transport/src`, shown as `label`) names one of
/// `traits` as keel-runtime's, or calls `.runtime()`: one line per finding.
fn violations(label: &str, text: &str, traits: &[String]) -> Vec<String> {
    let code = blank_comments_and_literals(text);
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (at, word) in words(&code) {
        if word == "runtime" && code[..at].trim_end().ends_with('.') {
            let after = code[at + word.len()..].trim_start();
            if after.starts_with('(') {
                out.push(format!(
                    "{label}:{}: calls `.runtime()` (read through `executor.reads()`)",
                    line_of(at)
                ));
            }
        } else if traits.iter().any(|t| t == word) && is_keel_runtimes(&code[..at]) {
            out.push(format!(
                "{label}:{}: names keel-runtime's store trait `{word}`",
                line_of(at)
            ));
        }
    }
    out
}

/// Whether a name that follows `before` is reached through keel-runtime (or no path at all):
/// not when the path just before it, or before the `{` of the use group it sits in, names
/// another crate or module (`tokio::runtime::Runtime`, `use tokio::runtime::{Builder, Runtime}`).
fn is_keel_runtimes(before: &str) -> bool {
    let path_end = match before.trim_end().strip_suffix("::") {
        Some(path) => Some(path),
        None => enclosing_group(before),
    };
    match path_end.map(last_segment) {
        None => true,
        Some(segment) => matches!(segment, "keel_runtime" | "services"),
    }
}

/// The text before the `::{` that opens the brace group `before` ends inside, if any.
fn enclosing_group(before: &str) -> Option<&str> {
    let mut depth = 0usize;
    for (at, c) in before.char_indices().rev() {
        match c {
            '}' => depth += 1,
            '{' if depth > 0 => depth -= 1,
            '{' => return before[..at].trim_end().strip_suffix("::"),
            ';' => return None,
            _ => {}
        }
    }
    None
}

/// The last identifier of `path`.
fn last_segment(path: &str) -> &str {
    let trimmed = path.trim_end();
    let start = trimmed
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    &trimmed[start..]
}

/// The identifiers of `code` with their byte offsets.
fn words(code: &str) -> impl Iterator<Item = (usize, &str)> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut at = 0;
    std::iter::from_fn(move || {
        let start = at + code[at..].find(is_word)?;
        let len = code[start..]
            .find(|c| !is_word(c))
            .unwrap_or(code.len() - start);
        at = start + len;
        Some((start, &code[start..start + len]))
    })
}

/// `text` with comments and the contents of string and character literals replaced by
/// spaces (line breaks kept, so line numbers hold).
fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#.
            let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('r');
            i += 2 + hashes;
            out.push_str(&" ".repeat(hashes + 1));
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                blank(&mut out, chars[i]);
                i += 1;
            }
            out.push_str(&" ".repeat(closing.len().min(chars.len() - i)));
            i += closing.len();
        } else if c == '"' {
            i = blank_quoted(&chars, i, &mut out);
        } else if c == '\'' && (chars.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            i = blank_quoted(&chars, i, &mut out);
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Blank the literal quoted by `chars[start]` (a string or a character, escapes honoured)
/// into `out`; answers where the text after it starts.
fn blank_quoted(chars: &[char], start: usize, out: &mut String) -> usize {
    let quote = chars[start];
    out.push(' ');
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        let skip = if chars[i] == '\\' { 2 } else { 1 };
        for &c in &chars[i..(i + skip).min(chars.len())] {
            out.push(if c == '\n' { '\n' } else { ' ' });
        }
        i += skip;
    }
    out.push(' ');
    i + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traits() -> Vec<String> {
        ["Runtime", "TaskManager", "MemoryService"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn a_store_trait_or_a_runtime_call_is_named_with_its_file_and_line() {
        let snippet = "use keel_runtime::{AuthContext, TaskManager};\n\
                       fn f(e: &AgentExecutor) {\n\
                       \x20   let t = e.runtime().task_manager();\n\
                       \x20   let m: Arc<dyn keel_runtime::MemoryService> = todo!();\n\
                       }\n";
        assert_eq!(
            violations("src/x.rs", snippet, &traits()),
            [
                "src/x.rs:1: names keel-runtime's store trait `TaskManager`",
                "src/x.rs:3: calls `.runtime()` (read through `executor.reads()`)",
                "src/x.rs:4: names keel-runtime's store trait `MemoryService`",
            ]
        );
    }

    #[test]
    fn comments_literals_and_other_crates_names_are_not_violations() {
        let snippet = "// the runtime's TaskManager, e.runtime()\n\
                       /* MemoryService */ let s = \"TaskManager .runtime()\";\n\
                       let c = '\"'; let r = r#\"MemoryService\"#;\n\
                       let rt: tokio::runtime::Runtime = todo!();\n\
                       use tokio::runtime::{Builder, Runtime};\n\
                       fn runtime() {}\n\
                       let task_manager = 1;\n";
        assert_eq!(
            violations("src/y.rs", snippet, &traits()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_trait_list_is_read_from_keel_runtimes_source() {
        let traits = store_traits(&workspace_root().join(RUNTIME_SRC)).unwrap();
        for name in [
            "Runtime",
            "TaskManager",
            "MemoryService",
            "ThreadStore",
            "RunStore",
        ] {
            assert!(traits.iter().any(|t| t == name), "{name} in {traits:?}");
        }
        // The testing module's helpers are not stores.
        assert!(!traits.iter().any(|t| t == "Reached"), "{traits:?}");
    }
}
