//! The names MCP tools get before a model: `{server}_{tool}` in the alphabet every provider
//! accepts (`[A-Za-z0-9_-]`, at most 64 characters), unique among an agent's tools.

use std::collections::HashSet;

/// The longest tool name providers accept (OpenAI's limit; the others allow as much or more).
pub const MAX_TOOL_NAME: usize = 64;

/// Characters of the stable hash that keeps a shortened or clashing name unique.
const HASH_CHARS: usize = 8;

/// `text` with every character outside `[A-Za-z0-9_-]` replaced by `_`.
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The name of the tool `tool` of the server `server`, not one of `taken` (to which it is
/// added). Usually `{server}_{tool}` sanitized; a name too long, or one that two tools would
/// share once sanitized (`a.b` and `a_b`), is cut and ends in a hash of the server's and the
/// tool's own names, so it is the same in every process (a thread's history names it).
pub fn tool_name(server: &str, tool: &str, taken: &mut HashSet<String>) -> String {
    let plain = sanitize(&format!("{server}_{tool}"));
    if plain.len() <= MAX_TOOL_NAME && !taken.contains(&plain) {
        taken.insert(plain.clone());
        return plain;
    }
    let mut hash = fnv1a(
        server.as_bytes(),
        fnv1a(&[0], fnv1a(tool.as_bytes(), FNV_OFFSET)),
    );
    loop {
        let keep = MAX_TOOL_NAME - HASH_CHARS - 1;
        let head: String = plain.chars().take(keep).collect();
        let name = format!("{head}_{hash:08x}");
        if taken.insert(name.clone()) {
            return name;
        }
        // Two tools whose hashes clash too: hash again until free (practically never).
        hash = fnv1a(&hash.to_le_bytes(), hash);
    }
}

const FNV_OFFSET: u32 = 0x811c_9dc5;

/// 32-bit FNV-1a: stable across processes and Rust versions, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8], mut hash: u32) -> u32 {
    for byte in bytes {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_sanitized() {
        let mut taken = HashSet::new();
        assert_eq!(tool_name("files", "read", &mut taken), "files_read");
        assert_eq!(
            tool_name("everything", "get-tiny-image", &mut taken),
            "everything_get-tiny-image"
        );
        assert_eq!(tool_name("srv", "a.b/c d", &mut taken), "srv_a_b_c_d");
    }

    #[test]
    fn a_clash_after_sanitizing_gets_a_stable_hash() {
        let mut taken = HashSet::new();
        let first = tool_name("srv", "a.b", &mut taken);
        let second = tool_name("srv", "a_b", &mut taken);
        assert_eq!(first, "srv_a_b");
        assert_ne!(second, first);
        assert!(second.starts_with("srv_a_b_"), "{second}");
        // The same in another process: the hash depends only on the names.
        let mut again = HashSet::from([first.clone()]);
        assert_eq!(tool_name("srv", "a_b", &mut again), second);
    }

    #[test]
    fn long_names_are_cut_to_64_and_stay_distinct() {
        let mut taken = HashSet::new();
        let long_a = format!("{}a", "x".repeat(80));
        let long_b = format!("{}b", "x".repeat(80));
        let a = tool_name("server", &long_a, &mut taken);
        let b = tool_name("server", &long_b, &mut taken);
        assert_eq!(a.len(), MAX_TOOL_NAME);
        assert_eq!(b.len(), MAX_TOOL_NAME);
        assert_ne!(a, b);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
    }
}
