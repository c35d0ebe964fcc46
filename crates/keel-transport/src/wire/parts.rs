//! Parts: Keel's typed parts as A2A data parts marked `keel.partType`, files as raw or url
//! parts when A2A can hold them exactly.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use keel_core::{AgentResult, FileContent, Metadata, Part, PartContent};
use serde_json::Value;

use super::codec::{each_from_wire, invalid, keel_metadata, to_json, wire_metadata};

const PART_TYPE_KEY: &str = "keel.partType";

/// Part types that decode through Keel's own JSON form of [`PartContent`].
const TYPED_PARTS: &[&str] = &[
    "text",
    "file",
    "tool_call",
    "tool_output",
    "infer",
    "infer_output",
    "error",
    "status",
    "route",
    "decision",
];

/// The A2A content for a file part, when A2A can hold it exactly (one of bytes or uri, bytes in
/// canonical standard base64).
fn file_content_to_wire(file: &FileContent) -> Option<a2a::PartContent> {
    match (&file.bytes, &file.uri) {
        (Some(bytes), None) => {
            let raw = BASE64.decode(bytes).ok()?;
            (BASE64.encode(&raw) == *bytes).then_some(a2a::PartContent::Raw(raw))
        }
        (None, Some(uri)) => Some(a2a::PartContent::Url(uri.clone())),
        _ => None,
    }
}

/// A typed Keel part as an A2A data part: the part's fields, marked with `keel.partType`.
fn typed_part_to_wire(content: &PartContent, mut metadata: Metadata) -> a2a::Part {
    let type_name = content.type_name();
    let data = match content {
        PartContent::Json { content } => content.clone(),
        other => match to_json(other) {
            Value::Object(mut fields) => {
                fields.remove("type");
                Value::Object(fields)
            }
            value => value,
        },
    };
    metadata.insert(PART_TYPE_KEY.into(), Value::String(type_name.into()));
    a2a::Part {
        content: a2a::PartContent::Data(data),
        filename: None,
        media_type: None,
        metadata: wire_metadata(metadata),
    }
}

pub(super) fn part_to_wire(part: &Part) -> a2a::Part {
    let metadata = part.metadata.clone();
    match &part.content {
        PartContent::Text { text } => a2a::Part {
            content: a2a::PartContent::Text(text.clone()),
            filename: None,
            media_type: None,
            metadata: wire_metadata(metadata),
        },
        PartContent::Data { data } => a2a::Part {
            content: a2a::PartContent::Data(data.clone()),
            filename: None,
            media_type: None,
            metadata: wire_metadata(metadata),
        },
        PartContent::File { file } => match file_content_to_wire(file) {
            Some(content) => a2a::Part {
                content,
                filename: file.name.clone(),
                media_type: file.media_type.clone(),
                metadata: wire_metadata(metadata),
            },
            None => typed_part_to_wire(&part.content, metadata),
        },
        other => typed_part_to_wire(other, metadata),
    }
}

fn part_from_wire(part: a2a::Part, field: &str) -> AgentResult<Part> {
    let mut metadata = keel_metadata(part.metadata);
    let content = match part.content {
        a2a::PartContent::Text(text) => PartContent::Text { text },
        a2a::PartContent::Raw(raw) => PartContent::File {
            file: FileContent {
                name: part.filename,
                media_type: part.media_type,
                uri: None,
                bytes: Some(BASE64.encode(raw)),
            },
        },
        a2a::PartContent::Url(uri) => PartContent::File {
            file: FileContent {
                name: part.filename,
                media_type: part.media_type,
                uri: Some(uri),
                bytes: None,
            },
        },
        a2a::PartContent::Data(data) => {
            let part_type = metadata
                .get(PART_TYPE_KEY)
                .and_then(Value::as_str)
                .map(str::to_owned);
            match part_type.as_deref() {
                Some("json") => {
                    metadata.remove(PART_TYPE_KEY);
                    PartContent::Json { content: data }
                }
                Some("data") => {
                    metadata.remove(PART_TYPE_KEY);
                    PartContent::Data { data }
                }
                Some(type_name) if TYPED_PARTS.contains(&type_name) => {
                    let Value::Object(mut fields) = data else {
                        return Err(invalid(
                            format!("{field}.data"),
                            format!("a `{type_name}` part needs an object"),
                        ));
                    };
                    fields.insert("type".into(), Value::String(type_name.into()));
                    let content = serde_json::from_value(Value::Object(fields)).map_err(|e| {
                        invalid(
                            format!("{field}.data"),
                            format!("not a valid `{type_name}` part: {e}"),
                        )
                    })?;
                    metadata.remove(PART_TYPE_KEY);
                    content
                }
                // A plain data part, or a type this version does not know: keep it as data
                // and leave the marker in the metadata.
                _ => PartContent::Data { data },
            }
        }
    };
    Ok(Part { content, metadata })
}

pub(super) fn parts_from_wire(parts: Vec<a2a::Part>, field: &str) -> AgentResult<Vec<Part>> {
    each_from_wire(parts, &format!("{field}.parts"), part_from_wire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{every_part, through_wire_json};
    use keel_core::AgentError;
    use serde_json::json;

    #[test]
    fn every_part_kind_round_trips_through_the_wire() {
        for part in every_part() {
            let wire = through_wire_json(part_to_wire(&part));
            let back = part_from_wire(wire, "part").unwrap();
            assert_eq!(back, part, "{}", part.content.type_name());
        }
    }

    #[test]
    fn typed_parts_travel_as_data_parts_marked_in_metadata() {
        let wire = to_json(&part_to_wire(&Part::tool_call(
            "c1",
            "add",
            json!({"a": 1}),
        )));
        assert_eq!(
            wire,
            json!({
                "data": {"call_id": "c1", "tool_name": "add", "args": {"a": 1}},
                "metadata": {"keel.partType": "tool_call"}
            })
        );
        let wire = to_json(&part_to_wire(&Part::json(json!({"ok": true}))));
        assert_eq!(
            wire,
            json!({"data": {"ok": true}, "metadata": {"keel.partType": "json"}})
        );
    }

    #[test]
    fn file_bytes_travel_as_raw_and_urls_as_url() {
        let wire = to_json(&part_to_wire(&Part::file(FileContent {
            name: Some("a.txt".into()),
            media_type: Some("text/plain".into()),
            uri: None,
            bytes: Some("aGk=".into()),
        })));
        assert_eq!(
            wire,
            json!({"raw": "aGk=", "filename": "a.txt", "mediaType": "text/plain"})
        );
        let wire = to_json(&part_to_wire(&Part::file(FileContent {
            uri: Some("https://x/y".into()),
            ..Default::default()
        })));
        assert_eq!(wire, json!({"url": "https://x/y"}));
    }

    #[test]
    fn plain_wire_parts_become_plain_keel_parts() {
        let parts: Vec<a2a::Part> = serde_json::from_value(json!([
            {"text": "hi"},
            {"data": {"k": 1}},
            {"data": 5, "metadata": {"keel.partType": "hologram"}},
            {"raw": "aGk=", "filename": "f"}
        ]))
        .unwrap();
        let parts = parts_from_wire(parts, "message").unwrap();
        assert_eq!(parts[0], Part::text("hi"));
        assert_eq!(parts[1], Part::data(json!({"k": 1})));
        assert_eq!(parts[2].content, PartContent::Data { data: json!(5) });
        assert_eq!(parts[2].metadata["keel.partType"], "hologram");
        assert_eq!(
            parts[3].content,
            PartContent::File {
                file: FileContent {
                    name: Some("f".into()),
                    bytes: Some("aGk=".into()),
                    ..Default::default()
                }
            }
        );
    }

    #[test]
    fn malformed_typed_part_is_invalid_input_naming_the_part() {
        let part: a2a::Part = serde_json::from_value(
            json!({"data": {"call_id": 1}, "metadata": {"keel.partType": "tool_call"}}),
        )
        .unwrap();
        let err = part_from_wire(part, "message.parts[0]").unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.parts[0].data"),
            "{err:?}"
        );
    }
}
