//! Compact JSON written straight from any `Serialize` value into a `String`, masked by a
//! [`RedactionPolicy`] as it is written. A run report's events used to become a JSON tree
//! (`serde_json::to_value`), be walked once to mask it and once more to write it, and then be
//! freed node by node: most of what a step cost. Written this way, a payload struct goes to
//! text in one pass with no tree in between.
//!
//! The text is what masking `serde_json::to_value(value)` with
//! [`RedactionPolicy::redact_value`] and writing the result would give, except that an
//! object's keys keep the order the value serializes them in (a struct's field order)
//! rather than the sorted order of a JSON tree; the tests below hold it to that.

use serde::ser::{self, Serialize};

use crate::json_text::{write_str, write_value};
use crate::redact::{RedactionPolicy, REDACTED};

/// Why a value could not be written as JSON (a map key that is not a string, a custom
/// `Serialize` error).
#[derive(Debug)]
pub(crate) struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// Append `value` as compact JSON, masked with `policy` when there is one. On an error the
/// text appended so far is removed again, so `out` never holds half a value.
pub(crate) fn write_masked<T: Serialize + ?Sized>(
    out: &mut String,
    value: &T,
    policy: Option<&RedactionPolicy>,
) -> Result<(), Error> {
    let start = out.len();
    let result = value.serialize(&mut Writer { out, policy });
    if result.is_err() {
        out.truncate(start);
    }
    result
}

struct Writer<'a> {
    out: &'a mut String,
    policy: Option<&'a RedactionPolicy>,
}

/// Append a context manifest's event payload (`{"manifest": {...}}`), written field by field
/// rather than through `Serialize`: the manifest is the largest payload of every step, and
/// this writes exactly what [`write_masked`] writes for its derived `Serialize` (the tests
/// hold the two to the same text under several policies) in about a third of the work.
pub(crate) fn write_manifest_payload(
    out: &mut String,
    manifest: &keel_core::ContextManifest,
    policy: Option<&RedactionPolicy>,
) {
    let keel_core::ContextManifest {
        run_id,
        thread_id,
        agent_name,
        provider,
        model,
        system_tokens,
        tool_prompt_tokens,
        history_tokens,
        user_tokens,
        total_estimated_tokens,
        context_window,
        context_items,
    } = manifest;
    let mut writer = Writer { out, policy };
    Fields::object(&mut writer, |payload| {
        payload.field("manifest", |writer| {
            Fields::object(writer, |m| {
                let texts = [
                    ("run_id", run_id.as_ref().map(|id| id.as_str())),
                    ("thread_id", thread_id.as_ref().map(|id| id.as_str())),
                    ("agent_name", agent_name.as_deref()),
                    ("provider", provider.as_deref()),
                    ("model", model.as_deref()),
                ];
                for (key, text) in texts {
                    if let Some(text) = text {
                        m.field(key, |w| w.string(text));
                    }
                }
                let counts = [
                    ("system_tokens", *system_tokens),
                    ("tool_prompt_tokens", *tool_prompt_tokens),
                    ("history_tokens", *history_tokens),
                    ("user_tokens", *user_tokens),
                    ("total_estimated_tokens", *total_estimated_tokens),
                ];
                for (key, count) in counts {
                    m.field(key, |w| w.u64(count));
                }
                if let Some(window) = context_window {
                    m.field("context_window", |w| w.u64(*window));
                }
                m.field("context_items", |w| {
                    w.out.push('[');
                    for (index, item) in context_items.iter().enumerate() {
                        if index > 0 {
                            w.out.push(',');
                        }
                        Fields::object(w, |i| {
                            i.field("section", |w| w.string(&item.section));
                            i.field("tokens", |w| w.u64(item.tokens));
                        });
                    }
                    w.out.push(']');
                });
            });
        });
    });
}

/// Append an action event's payload (`{"action": {...}}`) as [`write_manifest_payload`]
/// does a manifest's: the action's own fields by hand, its input, metadata and artifacts
/// through [`write_masked`]'s serializer. Two of every step's events carry the action. On an
/// error nothing is appended.
pub(crate) fn write_action_payload(
    out: &mut String,
    action: &keel_core::RunAction,
    policy: Option<&RedactionPolicy>,
) -> Result<(), Error> {
    let start = out.len();
    let mut writer = Writer { out, policy };
    let mut outcome = Ok(());
    Fields::object(&mut writer, |payload| {
        payload.field("action", |writer| {
            Fields::object(writer, |fields| outcome = action_fields(fields, action));
        });
    });
    if outcome.is_err() {
        writer.out.truncate(start);
    }
    outcome
}

/// The fields of a [`keel_core::RunAction`], in its `Serialize` order.
fn action_fields(fields: &mut Fields<'_, '_>, action: &keel_core::RunAction) -> Result<(), Error> {
    let keel_core::RunAction {
        id,
        kind,
        name,
        payload,
        capabilities,
        preview,
        result,
        parent_action_id,
        metadata,
    } = action;
    fields.field("id", |w| w.string(id.as_str()));
    fields.field("kind", |w| w.string(kind));
    fields.field("name", |w| w.string(name));
    fields.serialized("payload", payload)?;
    if !capabilities.is_empty() {
        fields.serialized("capabilities", capabilities)?;
    }
    if let Some(preview) = preview {
        fields.serialized("preview", preview)?;
    }
    if let Some(result) = result {
        fields.serialized("result", result)?;
    }
    if let Some(parent) = parent_action_id {
        fields.field("parent_action_id", |w| w.string(parent.as_str()));
    }
    if !metadata.is_empty() {
        fields.serialized("metadata", metadata)?;
    }
    Ok(())
}

/// A JSON object written field by field, each field masked as a derived `Serialize` struct's
/// field is in [`Compound`]: its name judged by the policy, and the value written under a
/// sensitive name replaced unless it is kept (see [`keeps_sensitive`]).
struct Fields<'w, 'a> {
    writer: &'w mut Writer<'a>,
    first: bool,
}

impl<'w, 'a> Fields<'w, 'a> {
    fn object(writer: &'w mut Writer<'a>, fields: impl FnOnce(&mut Fields<'_, 'a>)) {
        writer.out.push('{');
        let mut object = Fields {
            writer,
            first: true,
        };
        fields(&mut object);
        object.writer.out.push('}');
    }

    fn field(&mut self, key: &'static str, value: impl FnOnce(&mut Writer<'a>)) {
        // Cannot fail: the value is written by hand, not serialized.
        let _written = self.entry(key, |writer| {
            value(writer);
            Ok(())
        });
    }

    /// A field whose value goes through the masking serializer.
    fn serialized<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.entry(key, |writer| value.serialize(writer))
    }

    fn entry(
        &mut self,
        key: &'static str,
        value: impl FnOnce(&mut Writer<'a>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if !std::mem::take(&mut self.first) {
            self.writer.out.push(',');
        }
        write_str(self.writer.out, key);
        self.writer.out.push(':');
        let verdict = self.writer.judge_field(key);
        self.writer.entry_with(verdict, value)
    }
}

impl Writer<'_> {
    fn u64(&mut self, value: u64) {
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    fn string(&mut self, text: &str) {
        if self.policy.is_some_and(|p| p.value_is_sensitive(text)) {
            write_str(self.out, REDACTED);
        } else {
            write_str(self.out, text);
        }
    }

    /// The verdict on a key, before its value is written.
    fn judge(&self, key: &str) -> KeyVerdict {
        match self.policy {
            Some(policy) if policy.key_is_sensitive(key) => KeyVerdict::Sensitive {
                token_count: RedactionPolicy::is_token_count_key(key),
            },
            _ => KeyVerdict::Plain,
        }
    }

    /// [`judge`](Self::judge) for a struct's field name.
    fn judge_field(&self, key: &'static str) -> KeyVerdict {
        match self.policy {
            Some(policy) if policy.field_is_sensitive(key) => KeyVerdict::Sensitive {
                token_count: RedactionPolicy::is_token_count_key(key),
            },
            _ => KeyVerdict::Plain,
        }
    }

    /// Write the value of an entry whose key got `verdict`: a sensitive key's value is
    /// replaced unless it is `null` or a token count (a number under a `...tokens` key).
    fn entry_value<V: Serialize + ?Sized>(
        &mut self,
        verdict: KeyVerdict,
        value: &V,
    ) -> Result<(), Error> {
        self.entry_with(verdict, |writer| value.serialize(writer))
    }

    /// [`entry_value`](Self::entry_value) for a value `write` appends itself.
    fn entry_with(
        &mut self,
        verdict: KeyVerdict,
        write: impl FnOnce(&mut Self) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let KeyVerdict::Sensitive { token_count } = verdict else {
            return write(self);
        };
        let start = self.out.len();
        write(self)?;
        if !keeps_sensitive(&self.out[start..], token_count) {
            self.out.truncate(start);
            write_str(self.out, REDACTED);
        }
        Ok(())
    }
}

/// Whether a value written under a sensitive key stays: `null`, or a number under a
/// token-count key.
fn keeps_sensitive(written: &str, token_count: bool) -> bool {
    written == "null"
        || (token_count
            && written
                .as_bytes()
                .first()
                .is_some_and(|b| *b == b'-' || b.is_ascii_digit()))
}

#[derive(Clone, Copy)]
enum KeyVerdict {
    Plain,
    Sensitive { token_count: bool },
}

fn write_float(out: &mut String, value: f64) {
    // A JSON tree holds a non-finite float as `null`; `serde_json` writes the rest.
    write_value(out, &serde_json::Value::from(value));
}

impl<'b, 'a> ser::Serializer for &'b mut Writer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'b, 'a>;
    type SerializeTuple = Compound<'b, 'a>;
    type SerializeTupleStruct = Compound<'b, 'a>;
    type SerializeTupleVariant = Compound<'b, 'a>;
    type SerializeMap = Compound<'b, 'a>;
    type SerializeStruct = Compound<'b, 'a>;
    type SerializeStructVariant = Compound<'b, 'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        write_float(self.out, f64::from(v));
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        write_float(self.out, v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.string(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.string(v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        use ser::SerializeSeq;
        let mut seq = self.serialize_seq(Some(v.len()))?;
        for byte in v {
            seq.serialize_element(byte)?;
        }
        seq.end()
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.string(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.out.push('{');
        write_str(self.out, variant);
        self.out.push(':');
        let verdict = self.judge(variant);
        self.entry_value(verdict, value)?;
        self.out.push('}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'b, 'a>, Error> {
        self.out.push('[');
        Ok(Compound::new(self, "]", None))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'b, 'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Compound<'b, 'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'b, 'a>, Error> {
        let outer = self.open_variant(variant);
        self.out.push('[');
        Ok(Compound::new(self, "]", outer))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'b, 'a>, Error> {
        self.out.push('{');
        Ok(Compound::new(self, "}", None))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Compound<'b, 'a>, Error> {
        self.serialize_map(None)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'b, 'a>, Error> {
        let outer = self.open_variant(variant);
        self.out.push('{');
        Ok(Compound::new(self, "}", outer))
    }
}

impl Writer<'_> {
    /// Open `{"variant":` around a tuple or struct variant's body; answers where the body
    /// starts when the variant's name is a sensitive key (the body is masked at its end).
    fn open_variant(&mut self, variant: &str) -> Option<usize> {
        self.out.push('{');
        write_str(self.out, variant);
        self.out.push(':');
        matches!(self.judge(variant), KeyVerdict::Sensitive { .. }).then_some(self.out.len())
    }
}

/// A sequence, map or struct being written.
pub(crate) struct Compound<'b, 'a> {
    writer: &'b mut Writer<'a>,
    first: bool,
    close: &'static str,
    /// For a variant's body: where it starts, when the variant's name masks it.
    variant_masked_from: Option<usize>,
    /// Whether the variant wrapper `{"name": ... }` needs closing.
    variant: bool,
    /// The verdict on the map key just written.
    pending: KeyVerdict,
}

impl<'b, 'a> Compound<'b, 'a> {
    fn new(writer: &'b mut Writer<'a>, close: &'static str, masked_from: Option<usize>) -> Self {
        Compound {
            writer,
            first: true,
            close,
            variant_masked_from: masked_from,
            variant: false,
            pending: KeyVerdict::Plain,
        }
    }

    fn comma(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.writer.out.push(',');
        }
    }

    fn finish(self) -> Result<(), Error> {
        self.writer.out.push_str(self.close);
        if let Some(start) = self.variant_masked_from {
            self.writer.out.truncate(start);
            write_str(self.writer.out, REDACTED);
        }
        if self.variant || self.variant_masked_from.is_some() {
            self.writer.out.push('}');
        }
        Ok(())
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        self.comma();
        write_str(self.writer.out, key);
        self.writer.out.push(':');
        let verdict = self.writer.judge_field(key);
        self.writer.entry_value(verdict, value)
    }
}

impl ser::SerializeSeq for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.comma();
        value.serialize(&mut *self.writer)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeTuple for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(mut self) -> Result<(), Error> {
        self.variant = true;
        self.finish()
    }
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.comma();
        let mut verdict = KeyVerdict::Plain;
        key.serialize(KeyWriter {
            writer: self.writer,
            verdict: &mut verdict,
        })?;
        self.writer.out.push(':');
        self.pending = verdict;
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let verdict = std::mem::replace(&mut self.pending, KeyVerdict::Plain);
        self.writer.entry_value(verdict, value)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key, value)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key, value)
    }
    fn end(mut self) -> Result<(), Error> {
        self.variant = true;
        self.finish()
    }
}

/// Writes a map key as a JSON string (numbers and booleans quoted, as `serde_json` does)
/// and judges it.
struct KeyWriter<'b, 'a> {
    writer: &'b mut Writer<'a>,
    verdict: &'b mut KeyVerdict,
}

impl KeyWriter<'_, '_> {
    fn key(self, key: &str) -> Result<(), Error> {
        write_str(self.writer.out, key);
        *self.verdict = self.writer.judge(key);
        Ok(())
    }
}

fn key_must_be_a_string() -> Error {
    Error("key must be a string".into())
}

impl ser::Serializer for KeyWriter<'_, '_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = ser::Impossible<(), Error>;
    type SerializeTuple = ser::Impossible<(), Error>;
    type SerializeTupleStruct = ser::Impossible<(), Error>;
    type SerializeTupleVariant = ser::Impossible<(), Error>;
    type SerializeMap = ser::Impossible<(), Error>;
    type SerializeStruct = ser::Impossible<(), Error>;
    type SerializeStructVariant = ser::Impossible<(), Error>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.key(if v { "true" } else { "false" })
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        self.key(itoa::Buffer::new().format(v))
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.key(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.key(v)
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_none(self) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit(self) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.key(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(key_must_be_a_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    /// What the tree path gives: `to_value`, masked, written.
    fn through_tree<T: Serialize>(value: &T, policy: Option<&RedactionPolicy>) -> Value {
        let mut tree = serde_json::to_value(value).unwrap();
        if let Some(policy) = policy {
            policy.redact_value(&mut tree);
        }
        tree
    }

    fn written<T: Serialize>(value: &T, policy: Option<&RedactionPolicy>) -> String {
        let mut out = String::new();
        write_masked(&mut out, value, policy).unwrap();
        out
    }

    #[test]
    fn a_manifest_payload_is_written_as_its_serialize_writes_it() {
        use crate::payload::ManifestJson;
        use keel_core::{ContextItem, ContextManifest, RunId, ThreadId};
        let item = |section: &str, tokens| ContextItem {
            section: section.into(),
            tokens,
        };
        let full = ContextManifest {
            run_id: Some(RunId::new()),
            thread_id: Some(ThreadId::new()),
            agent_name: Some("Bearer agent \"quoted\"\n".into()),
            provider: Some("openai".into()),
            model: Some("gpt-x".into()),
            system_tokens: 3,
            tool_prompt_tokens: 19,
            history_tokens: 120,
            user_tokens: 4,
            total_estimated_tokens: 146,
            context_window: Some(128_000),
            context_items: vec![item("system", 3), item("history", 120)],
        };
        let policies = [
            None,
            Some(RedactionPolicy::default()),
            Some(RedactionPolicy::new().with_key("model")),
            Some(RedactionPolicy::new().with_key("manifest")),
            Some(
                RedactionPolicy::new()
                    .with_key("section")
                    .with_key("window"),
            ),
            Some(RedactionPolicy::new().with_key("items")),
            Some(
                RedactionPolicy::new()
                    .with_value_prefix("gpt")
                    .with_value_prefix("hist"),
            ),
            Some(
                RedactionPolicy::new()
                    .allow_key("total_estimated_tokens")
                    .with_key("id"),
            ),
        ];
        for manifest in [full, ContextManifest::default()] {
            for policy in &policies {
                let mut direct = String::new();
                write_manifest_payload(&mut direct, &manifest, policy.as_ref());
                let payload = ManifestJson {
                    manifest: &manifest,
                };
                assert_eq!(direct, written(&payload, policy.as_ref()), "{policy:?}");
            }
        }
    }

    #[test]
    fn an_action_payload_is_written_as_its_serialize_writes_it() {
        use crate::payload::ActionJson;
        use keel_core::{ActionId, Artifact, RunAction};
        let plain = RunAction::tool_call("noop", json!({}));
        let mut full = RunAction::tool_call(
            "http \"fetch\"",
            json!({"url": "https://x", "api_key": "k-1", "auth": "Bearer abc", "n": [1, {"token": 2}]}),
        );
        full.capabilities = vec!["net.fetch".into(), "Bearer-ish".into()];
        full.preview = Some(Artifact::text("the diff, token sk-1").named("preview"));
        full.result = Some(Artifact::text("Bearer done").named("result"));
        full.parent_action_id = Some(ActionId::new());
        full.metadata.insert("call_id".into(), json!("call_1"));
        full.metadata
            .insert("secret_note".into(), json!({"inner": "x"}));
        let policies = [
            None,
            Some(RedactionPolicy::default()),
            Some(
                RedactionPolicy::new()
                    .with_key("name")
                    .with_key("capabilities"),
            ),
            Some(RedactionPolicy::new().with_key("action")),
            Some(
                RedactionPolicy::new()
                    .with_key("payload")
                    .with_key("metadata"),
            ),
            Some(
                RedactionPolicy::new()
                    .with_key("preview")
                    .with_key("parent"),
            ),
            Some(
                RedactionPolicy::new()
                    .with_value_prefix("tool")
                    .with_value_prefix("net"),
            ),
            Some(RedactionPolicy::new().allow_key("api_key").with_key("id")),
        ];
        for action in [plain, full] {
            for policy in &policies {
                let mut direct = String::new();
                write_action_payload(&mut direct, &action, policy.as_ref()).unwrap();
                let payload = ActionJson { action: &action };
                assert_eq!(direct, written(&payload, policy.as_ref()), "{policy:?}");
            }
        }
    }

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Shape {
        Unit,
        Newtype(String),
        Tuple(u8, String),
        Struct { api_key: String, n: i32 },
    }

    #[derive(Serialize)]
    struct Sample {
        name: String,
        api_key: String,
        input_tokens: u64,
        token: Option<String>,
        secret_tokens: String,
        nested: BTreeMap<String, Value>,
        list: Vec<Shape>,
        password: Shape,
        float: f64,
        nan: f64,
        bytes: serde_bytes_like::Bytes,
        unit: (),
        map_keys: BTreeMap<u32, bool>,
    }

    mod serde_bytes_like {
        pub struct Bytes(pub Vec<u8>);
        impl serde::Serialize for Bytes {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }
    }

    fn sample() -> Sample {
        Sample {
            name: "Bearer abc".into(),
            api_key: "k-1".into(),
            input_tokens: 12,
            token: None,
            secret_tokens: "not a count".into(),
            nested: BTreeMap::from([
                ("Authorization".to_owned(), json!({"inner": [1, 2]})),
                ("plain".to_owned(), json!(["bearer x", "y", null, 1.5, -3])),
                ("cookie".to_owned(), Value::Null),
                ("total_tokens".to_owned(), json!(7)),
                ("quote\"key".to_owned(), json!("tab\there")),
            ]),
            list: vec![
                Shape::Unit,
                Shape::Newtype("n".into()),
                Shape::Tuple(1, "bearer t".into()),
                Shape::Struct {
                    api_key: "s".into(),
                    n: -1,
                },
            ],
            password: Shape::Tuple(2, "x".into()),
            float: 0.1,
            nan: f64::NAN,
            bytes: serde_bytes_like::Bytes(vec![0, 255]),
            unit: (),
            map_keys: BTreeMap::from([(3, true)]),
        }
    }

    #[test]
    fn unmasked_text_is_what_serde_json_writes() {
        let value = sample();
        assert_eq!(
            written(&value, None),
            serde_json::to_string(&value).unwrap()
        );
        let tree = serde_json::to_value(&value).unwrap();
        assert_eq!(written(&tree, None), serde_json::to_string(&tree).unwrap());
        // An f32 is written as the tree holds it (widened to f64).
        let tree = serde_json::to_value(0.1f32).unwrap();
        assert_eq!(
            written(&0.1f32, None),
            serde_json::to_string(&tree).unwrap()
        );
    }

    #[test]
    fn masked_text_reads_as_the_masked_tree() {
        for policy in [
            RedactionPolicy::default(),
            RedactionPolicy::default()
                .with_key("name")
                .allow_key("api_key"),
            RedactionPolicy::default().with_value_prefix("y"),
        ] {
            let value = sample();
            let text = written(&value, Some(&policy));
            let read: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(read, through_tree(&value, Some(&policy)), "{policy:?}");
            // A tree written through the same path gives the tree's own text.
            let tree = serde_json::to_value(&value).unwrap();
            let mut masked = tree.clone();
            policy.redact_value(&mut masked);
            assert_eq!(
                written(&tree, Some(&policy)),
                serde_json::to_string(&masked).unwrap()
            );
        }
    }

    #[test]
    fn a_map_key_that_is_not_a_string_is_an_error_and_writes_nothing() {
        let mut out = String::from("x");
        let bad = BTreeMap::from([(vec![1], 1)]);
        assert!(write_masked(&mut out, &bad, None).is_err());
        assert_eq!(out, "x");
    }
}
