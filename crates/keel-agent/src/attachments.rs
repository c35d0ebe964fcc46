//! Per-thread attachment stores (Standard Agents §8.1–§8.2): every thread keeps its own files,
//! and a file crossing a thread boundary (a parent's message to a subagent, a subagent's result
//! to its parent) is copied into the destination thread's store and its reference rewritten.
//!
//! Files live in the backend, in the thread's key-value store under reserved `keel:` keys (one
//! record plus base64 chunks that fit the store's value cap), so they survive restarts and are
//! as tenant- and thread-isolated as every other thread value. A file is referred to by a
//! thread-local URI, `keel-attachment://{thread_id}/{path}`, that is only valid in that thread.

use base64::Engine as _;
use chrono::Utc;
use keel_core::{AgentError, AgentResult, FileContent, ThreadId};
use keel_runtime::{AuthContext, LogLevel, Runtime};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The scheme of attachment references.
pub const ATTACHMENT_URI_SCHEME: &str = "keel-attachment://";

const RECORD_PREFIX: &str = "keel:attachment:";
const CHUNK_PREFIX: &str = "keel:attachment-chunk:";
/// Raw bytes per chunk: base64 of it stays well below the default 64 KiB value cap.
const CHUNK_BYTES: usize = 32 * 1024;
/// Longest path kept (the key-value store caps keys at 256 bytes).
const MAX_PATH_BYTES: usize = 160;
/// Largest stored image loaded into a model request: about the smallest per-image limit of
/// the providers (Anthropic's 5 MB). A larger one stays a reference, which the provider names
/// in a note.
const MAX_REQUEST_IMAGE_BYTES: u64 = 5 * 1024 * 1024;
/// Largest other stored file loaded into a request: providers show small text files as text
/// (up to 32 KiB) and only name the others, whose bytes would be read for nothing.
const MAX_REQUEST_FILE_BYTES: u64 = 32 * 1024;

/// A stored attachment's record (its bytes are in chunks beside it).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    size: u64,
    chunks: usize,
    created_at: String,
}

/// The URI of `path` in `thread_id`'s store.
pub fn attachment_uri(thread_id: &ThreadId, path: &str) -> String {
    format!("{ATTACHMENT_URI_SCHEME}{thread_id}/{path}")
}

/// Split an attachment URI into its thread and path.
pub(crate) fn parse_uri(uri: &str) -> Option<(ThreadId, String)> {
    let rest = uri.strip_prefix(ATTACHMENT_URI_SCHEME)?;
    let (thread, path) = rest.split_once('/')?;
    if thread.is_empty() || path.is_empty() {
        return None;
    }
    Some((ThreadId::from(thread.to_owned()), path.to_owned()))
}

/// A path safe to use as a key: the file's base name, restricted to a plain alphabet.
fn clean_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cleaned = cleaned.trim_start_matches('.');
    let mut cleaned = if cleaned.is_empty() {
        "file".to_owned()
    } else {
        cleaned.to_owned()
    };
    cleaned.truncate(MAX_PATH_BYTES - 16);
    cleaned
}

/// One thread's attachment store.
pub(crate) struct AttachmentStore<'a> {
    pub(crate) runtime: &'a dyn Runtime,
    pub(crate) auth: &'a AuthContext,
    pub(crate) thread_id: &'a ThreadId,
}

impl AttachmentStore<'_> {
    async fn record(&self, path: &str) -> AgentResult<Option<Record>> {
        let Some(value) = self
            .runtime
            .thread_store()
            .kv_get(self.auth, self.thread_id, &format!("{RECORD_PREFIX}{path}"))
            .await?
        else {
            return Ok(None);
        };
        serde_json::from_value(value).map(Some).map_err(|e| {
            AgentError::storage(format!("attachment `{path}` has a malformed record: {e}"))
        })
    }

    /// Store `bytes` under a fresh path derived from `name` (a taken path gets a numbered
    /// suffix) and answer its file part.
    pub(crate) async fn put(
        &self,
        name: &str,
        media_type: Option<&str>,
        bytes: &[u8],
    ) -> AgentResult<FileContent> {
        let base = clean_name(name);
        let mut path = base.clone();
        let mut n = 1;
        while self.record(&path).await?.is_some() {
            n += 1;
            path = match base.rsplit_once('.') {
                Some((stem, ext)) if !stem.is_empty() => format!("{stem}-{n}.{ext}"),
                _ => format!("{base}-{n}"),
            };
        }
        let store = self.runtime.thread_store();
        let chunks: Vec<&[u8]> = if bytes.is_empty() {
            Vec::new()
        } else {
            bytes.chunks(CHUNK_BYTES).collect()
        };
        // Chunks first, the record last: a record is only there for a complete file.
        for (i, chunk) in chunks.iter().enumerate() {
            store
                .kv_set(
                    self.auth,
                    self.thread_id,
                    &format!("{CHUNK_PREFIX}{path}:{i}"),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(chunk)),
                )
                .await?;
        }
        let record = Record {
            name: name.to_owned(),
            media_type: media_type.map(str::to_owned),
            size: bytes.len() as u64,
            chunks: chunks.len(),
            created_at: Utc::now().to_rfc3339(),
        };
        store
            .kv_set(
                self.auth,
                self.thread_id,
                &format!("{RECORD_PREFIX}{path}"),
                serde_json::to_value(&record).map_err(AgentError::internal)?,
            )
            .await?;
        Ok(self.file_part(&path, &record))
    }

    fn file_part(&self, path: &str, record: &Record) -> FileContent {
        FileContent {
            name: Some(record.name.clone()),
            media_type: record.media_type.clone(),
            uri: Some(attachment_uri(self.thread_id, path)),
            bytes: None,
        }
    }

    /// The file a URI of this thread names, with its bytes; `None` when there is none. A URI
    /// of another thread is [`AgentError::InvalidInput`]: it is not valid here.
    pub(crate) async fn read(&self, uri: &str) -> AgentResult<Option<(FileContent, Vec<u8>)>> {
        let path = self.local_path(uri)?;
        let Some(record) = self.record(&path).await? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(record.size as usize);
        for i in 0..record.chunks {
            let chunk = self
                .runtime
                .thread_store()
                .kv_get(
                    self.auth,
                    self.thread_id,
                    &format!("{CHUNK_PREFIX}{path}:{i}"),
                )
                .await?;
            let decoded = chunk
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
                .ok_or_else(|| {
                    AgentError::storage(format!("attachment `{path}` is missing chunk {i}"))
                })?;
            bytes.extend_from_slice(&decoded);
        }
        Ok(Some((self.file_part(&path, &record), bytes)))
    }

    /// Every file of the thread.
    pub(crate) async fn list(&self) -> AgentResult<Vec<FileContent>> {
        let mut files = Vec::new();
        let mut keys = self
            .runtime
            .thread_store()
            .kv_keys(self.auth, self.thread_id)
            .await?;
        keys.sort();
        for key in keys {
            if let Some(path) = key.strip_prefix(RECORD_PREFIX) {
                if let Some(record) = self.record(path).await? {
                    files.push(self.file_part(path, &record));
                }
            }
        }
        Ok(files)
    }

    /// Give the request copy of the thread's messages the bytes of the files they name in
    /// this store (`keel-attachment://` references, which no provider can fetch), so a vision
    /// model sees a stored image and a model reads a stored text file. Files too large, of
    /// another thread or gone stay references; a store error is logged and leaves the
    /// reference too: the provider then names the file in a note rather than failing the step.
    pub(crate) async fn load_request_bytes(&self, messages: &mut [keel_llm::LlmMessage]) {
        for file in messages.iter_mut().flat_map(|m| m.attachments.iter_mut()) {
            if file.bytes.is_some() {
                continue;
            }
            let Some(uri) = file.uri.clone() else {
                continue;
            };
            match parse_uri(&uri) {
                Some((thread, path)) if &thread == self.thread_id => {
                    if let Err(error) = self.load_bytes(file, &uri, &path).await {
                        self.runtime.logging_service().log(
                            LogLevel::Warn,
                            &format!(
                                "the stored attachment {uri} could not be read for the model: \
                                 {error}"
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
    }

    async fn load_bytes(&self, file: &mut FileContent, uri: &str, path: &str) -> AgentResult<()> {
        let Some(record) = self.record(path).await? else {
            return Ok(());
        };
        let media_type = record.media_type.as_deref().or(file.media_type.as_deref());
        let limit = if media_type.map_or_else(|| looks_like_image(&record.name), is_image_type) {
            MAX_REQUEST_IMAGE_BYTES
        } else {
            MAX_REQUEST_FILE_BYTES
        };
        if record.size > limit {
            return Ok(());
        }
        if let Some((_, bytes)) = self.read(uri).await? {
            file.bytes = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            if file.media_type.is_none() {
                file.media_type = record.media_type;
            }
        }
        Ok(())
    }

    fn local_path(&self, uri: &str) -> AgentResult<String> {
        match parse_uri(uri) {
            Some((thread, path)) if &thread == self.thread_id => Ok(path),
            Some((thread, _)) => Err(AgentError::invalid_input(
                "attachment",
                format!(
                    "`{uri}` belongs to thread {thread}; attachments of another thread are not \
                     valid in thread {}",
                    self.thread_id
                ),
            )),
            // A bare path is read as this thread's.
            None if !uri.contains("://") && !uri.is_empty() => Ok(uri.to_owned()),
            None => Err(AgentError::invalid_input(
                "attachment",
                format!("`{uri}` is not an attachment reference"),
            )),
        }
    }
}

fn is_image_type(media_type: &str) -> bool {
    media_type.to_ascii_lowercase().starts_with("image/")
}

fn looks_like_image(name: &str) -> bool {
    let ext = name
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase());
    matches!(
        ext.as_deref(),
        Some("png" | "jpg" | "jpeg" | "gif" | "webp" | "bmp" | "tif" | "tiff" | "heic" | "heif")
    )
}

/// Copy the file `uri` (of `from`) into `to`'s store and answer the new file part. A
/// reference that is not in `from`'s store is [`AgentError::InvalidInput`].
pub(crate) async fn copy_attachment(
    runtime: &dyn Runtime,
    auth: &AuthContext,
    from: &ThreadId,
    to: &ThreadId,
    uri: &str,
) -> AgentResult<FileContent> {
    let source = AttachmentStore {
        runtime,
        auth,
        thread_id: from,
    };
    let (file, bytes) = source.read(uri).await?.ok_or_else(|| {
        AgentError::invalid_input(
            "attachment",
            format!("`{uri}` is not a file of thread {from}"),
        )
    })?;
    let destination = AttachmentStore {
        runtime,
        auth,
        thread_id: to,
    };
    destination
        .put(
            file.name.as_deref().unwrap_or("file"),
            file.media_type.as_deref(),
            &bytes,
        )
        .await
}

/// Every attachment URI of `thread_id` mentioned in `text`, in order, without repeats.
pub(crate) fn references_in(text: &str, thread_id: &ThreadId) -> Vec<String> {
    let prefix = attachment_uri(thread_id, "");
    let mut found: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&prefix) {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| {
                c.is_whitespace() || matches!(c, '"' | '\'' | ')' | ']' | '>' | '<' | ',' | '`')
            })
            .unwrap_or(tail.len());
        let uri = tail[..end].trim_end_matches(['.', ';', ':']);
        if uri.len() > prefix.len() && !found.iter().any(|f| f == uri) {
            found.push(uri.to_owned());
        }
        rest = &tail[end.max(prefix.len())..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_in_text_and_deduplicated() {
        let t = ThreadId::from("t1".to_owned());
        let text = "see keel-attachment://t1/a.txt, and (keel-attachment://t1/b-2.csv). \
                    Again keel-attachment://t1/a.txt; not keel-attachment://t2/c.txt";
        assert_eq!(
            references_in(text, &t),
            ["keel-attachment://t1/a.txt", "keel-attachment://t1/b-2.csv"]
        );
    }

    #[test]
    fn names_become_safe_paths() {
        assert_eq!(clean_name("../../etc/passwd"), "passwd");
        assert_eq!(clean_name("my report (1).txt"), "my_report__1_.txt");
        assert_eq!(clean_name(".."), "file");
        assert_eq!(
            parse_uri("keel-attachment://t9/x.txt"),
            Some((ThreadId::from("t9".to_owned()), "x.txt".to_owned()))
        );
        assert_eq!(parse_uri("https://example.com/x"), None);
    }
}
