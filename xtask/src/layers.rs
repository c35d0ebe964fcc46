//! `cargo xtask layers`: the crates depend only downward, as `docs/architecture.md` says.
//!
//! The layer of each crate is read from the code map's headings
//! (``### `crates/keel-core` — layer 0``), so the document and the check cannot drift; the
//! dependencies come from `cargo metadata`. Dev-dependencies are not checked: a test may
//! reach any crate. Besides the layers, the value crates (keel-core, keel-policy,
//! keel-events) may not depend on an async runtime or an I/O crate ([`RUNTIME_AND_IO`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::util::workspace_root;

/// Runtimes and I/O crates: what the value layers (core, policy, events) must not use, so
/// that they stay plain libraries that build without an async runtime (and for wasm).
const RUNTIME_AND_IO: &[&str] = &[
    "tokio",
    "tokio-util",
    "tokio-stream",
    "mio",
    "async-std",
    "smol",
    "socket2",
    "axum",
    "hyper",
    "reqwest",
    "rusqlite",
    "redis",
];

/// External crates a crate must not use (the brief: core does no I/O; only the transport knows
/// HTTP; keel-policy and keel-events are layer-1 values and logic, free of tokio and I/O).
const FORBIDDEN_EXTERNAL: &[(&str, &[&str])] = &[
    ("keel-core", RUNTIME_AND_IO),
    ("keel-policy", RUNTIME_AND_IO),
    ("keel-events", RUNTIME_AND_IO),
    ("keel-agent", &["axum", "reqwest", "hyper"]),
];

/// Departures being removed: printed, but not yet fatal. Empty when the tree is clean.
const PENDING: &[(&str, &str)] = &[];

/// Runs the check; `Err` lists every violation.
pub fn check() -> Result<(), String> {
    let root = workspace_root();
    let doc = root.join("docs/architecture.md");
    let text =
        std::fs::read_to_string(&doc).map_err(|e| format!("reading {}: {e}", doc.display()))?;
    let layer_of_dir = layer_table(&text);
    if layer_of_dir.is_empty() {
        return Err(format!(
            "{} has no code-map headings like \"### `crates/keel-core` — layer 0\"",
            doc.display()
        ));
    }

    let meta = metadata(&root)?;
    let packages = meta["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    // Package name -> layer, through the directory each manifest lives in.
    let mut layers: BTreeMap<String, u32> = BTreeMap::new();
    let mut problems = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default();
        let manifest = Path::new(package["manifest_path"].as_str().unwrap_or_default());
        let Ok(relative) = manifest.strip_prefix(&root) else {
            continue;
        };
        let dir = relative
            .parent()
            .map(|p| p.to_string_lossy().replace('\\', "/"));
        let Some(dir) = dir.filter(|d| d.starts_with("crates/")) else {
            continue;
        };
        match layer_of_dir.get(&dir) {
            Some(layer) => {
                layers.insert(name.to_owned(), *layer);
            }
            None => problems.push(format!(
                "{name} ({dir}) has no layer: give it a heading in docs/architecture.md's code map"
            )),
        }
    }

    let mut pending = Vec::new();
    for package in packages {
        let src = package["name"].as_str().unwrap_or_default();
        let Some(&src_layer) = layers.get(src) else {
            continue;
        };
        let deps = package["dependencies"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for dep in deps {
            if dep["kind"].as_str() == Some("dev") {
                continue;
            }
            let dst = dep["name"].as_str().unwrap_or_default();
            let problem = match layers.get(dst) {
                Some(&dst_layer) => edge_problem(src, src_layer, dst, dst_layer),
                None => external_problem(src, dst),
            };
            if let Some(problem) = problem {
                if PENDING.contains(&(src, dst)) {
                    pending.push(problem);
                } else {
                    problems.push(problem);
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    pending.sort();
    pending.dedup();
    for p in &pending {
        println!("    layering (being removed, not yet fatal): {p}");
    }
    if problems.is_empty() {
        println!("    layering: ok ({} crates)", layers.len());
        Ok(())
    } else {
        for p in &problems {
            println!("    layering: {p}");
        }
        Err(format!("{} layering violation(s)", problems.len()))
    }
}

/// What is wrong with `src` depending on the workspace crate `dst`, if anything.
fn edge_problem(src: &str, src_layer: u32, dst: &str, dst_layer: u32) -> Option<String> {
    let is_store = |name: &str| name.starts_with("keel-store-");
    if is_store(src) && !matches!(dst, "keel-core" | "keel-runtime") {
        return Some(format!(
            "{src} -> {dst}: a store depends only on keel-core and keel-runtime"
        ));
    }
    if matches!(src, "keel-agent" | "keel-transport") && is_store(dst) {
        return Some(format!("{src} -> {dst}: the engine and the transport reach storage only through keel-runtime's traits"));
    }
    (dst_layer >= src_layer).then(|| {
        format!("{src} (layer {src_layer}) -> {dst} (layer {dst_layer}): a crate depends only on lower layers")
    })
}

/// What is wrong with `src` depending on the external crate `dst`, if anything.
fn external_problem(src: &str, dst: &str) -> Option<String> {
    let (_, banned) = FORBIDDEN_EXTERNAL.iter().find(|(name, _)| *name == src)?;
    banned
        .contains(&dst)
        .then(|| format!("{src} -> {dst}: this layer must not use {dst}"))
}

/// `crates/<dir>` -> layer, from headings such as
/// ``### `crates/keel-store-sqlite`, `crates/keel-store-redis` — layer 3``.
fn layer_table(doc: &str) -> BTreeMap<String, u32> {
    let mut table = BTreeMap::new();
    for line in doc.lines() {
        let Some(heading) = line.strip_prefix("### ") else {
            continue;
        };
        let Some((names, layer)) = heading.rsplit_once("layer ") else {
            continue;
        };
        let Ok(layer) = layer.trim().parse::<u32>() else {
            continue;
        };
        for name in names.split('`').filter(|part| part.starts_with("crates/")) {
            table.insert(name.trim_end_matches('/').to_owned(), layer);
        }
    }
    table
}

/// `cargo metadata --no-deps` as JSON.
fn metadata(root: &Path) -> Result<Value, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("reading cargo metadata: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_read_from_code_map_headings() {
        let doc = "## Code map\n### `crates/keel-core` — layer 0\ntext\n\
                   ### `crates/keel-store-sqlite`, `crates/keel-store-redis` — layer 3\n\
                   ### Not a crate\n";
        let table = layer_table(doc);
        assert_eq!(table.get("crates/keel-core"), Some(&0));
        assert_eq!(table.get("crates/keel-store-redis"), Some(&3));
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn upward_sideways_and_store_edges_are_refused() {
        assert!(edge_problem("keel-agent", 3, "keel-transport", 4).is_some());
        assert!(edge_problem("keel-agent", 3, "keel-sandbox", 3).is_some());
        assert!(edge_problem("keel-store-redis", 3, "keel-llm", 1).is_some());
        assert!(edge_problem("keel-transport", 4, "keel-store-sqlite", 3).is_some());
        assert!(edge_problem("keel-agent", 3, "keel-runtime", 2).is_none());
        assert!(edge_problem("keel-store-redis", 3, "keel-runtime", 2).is_none());
        assert!(external_problem("keel-core", "tokio").is_some());
        for crate_name in ["keel-core", "keel-policy", "keel-events"] {
            for io in ["tokio", "mio", "reqwest", "rusqlite"] {
                assert!(
                    external_problem(crate_name, io).is_some(),
                    "{crate_name} -> {io}"
                );
            }
        }
        assert!(external_problem("keel-events", "async-broadcast").is_none());
        assert!(external_problem("keel-agent", "reqwest").is_some());
        assert!(external_problem("keel-transport", "reqwest").is_none());
    }
}
