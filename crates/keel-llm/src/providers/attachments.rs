//! How a message's attachments reach a model (Standard Agents §4): images as each API's
//! multimodal content, small text files as text, and anything else as a short note naming
//! the file, so nothing attached is dropped without the model being told.
//!
//! Each provider maps an [`Attachment`] onto its own wire shape; the choice of form is made
//! here once, so the three providers agree on what a file becomes.

use base64::Engine as _;
use keel_core::FileContent;

use crate::message::{is_image, media_type_of as media_type};
use crate::LlmMessage;

/// The largest text file (decoded bytes) sent as text; a longer one becomes a note, so one
/// attached log cannot fill the context window.
pub(crate) const MAX_TEXT_FILE_BYTES: usize = 32 * 1024;

/// What one attachment becomes in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attachment<'a> {
    /// An image sent inline: its media type and base64 bytes.
    InlineImage {
        /// The image's media type (`image/png`).
        media_type: String,
        /// Its bytes, base64 (standard alphabet).
        data: &'a str,
    },
    /// An image the provider fetches from a public URL.
    ImageUrl {
        /// The image's media type (`image/png`).
        media_type: String,
        /// Its `http(s)` URL.
        url: &'a str,
    },
    /// Text the model reads instead of the file: a text file's contents, or a note naming
    /// the file and saying why its contents are not shown.
    Text(String),
}

/// The form `file` takes for a model that accepts the image formats `accepted`.
pub(crate) fn attachment<'a>(file: &'a FileContent, accepted: &[&str]) -> Attachment<'a> {
    let name = display_name(file);
    let media_type = media_type(file);
    if is_image(file) {
        let Some(media_type) = media_type.filter(|m| accepted.contains(&m.as_str())) else {
            let shown = file.media_type.as_deref().unwrap_or("unknown type");
            return Attachment::Text(format!(
                "[image `{name}` ({shown}) attached; this model does not accept that format]"
            ));
        };
        if let Some(data) = &file.bytes {
            return Attachment::InlineImage { media_type, data };
        }
        match file.uri.as_deref() {
            Some(uri) if is_web_url(uri) => {
                return Attachment::ImageUrl {
                    media_type,
                    url: uri,
                }
            }
            Some(uri) => {
                if let Some(data) = uri
                    .strip_prefix("data:")
                    .and_then(|rest| rest.split_once(";base64,"))
                    .map(|(_, data)| data)
                {
                    return Attachment::InlineImage { media_type, data };
                }
            }
            None => {}
        }
        return Attachment::Text(format!(
            "[image `{name}` attached; it has neither bytes nor a public URL the model can read]"
        ));
    }
    Attachment::Text(text_form(file, &name, media_type.as_deref()))
}

/// A user turn's content parts: each attachment, then the text (files before the question,
/// the order every provider's guide shows; decision 60). `part` writes one in the
/// provider's shape; the text reaches it as [`Attachment::Text`], and empty text is left out.
pub(crate) fn user_parts<T>(
    message: &LlmMessage,
    accepted: &[&str],
    part: impl Fn(Attachment<'_>) -> T,
) -> Vec<T> {
    let files = message
        .attachments
        .iter()
        .map(|file| attachment(file, accepted));
    let text = (!message.content.is_empty()).then(|| Attachment::Text(message.content.clone()));
    files.chain(text).map(part).collect()
}

/// A tool result for APIs that take images with it (Anthropic's `tool_result` blocks,
/// Gemini's parts beside a `functionResponse`): its text, with every attachment that does
/// not go as an image in text form, and the images in the formats `accepted`.
pub(crate) fn tool_result_parts<'a>(
    message: &'a LlmMessage,
    accepted: &[&str],
) -> (String, Vec<Attachment<'a>>) {
    let mut text = message.content.clone();
    let mut images = Vec::new();
    for file in &message.attachments {
        let note = if is_image(file) {
            match attachment(file, accepted) {
                Attachment::Text(note) => note,
                image => {
                    images.push(image);
                    continue;
                }
            }
        } else {
            attachment_as_text(file)
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&note);
    }
    (text, images)
}

/// `file` as text only, for turns that carry no images (tool results, assistant turns).
pub(crate) fn attachment_as_text(file: &FileContent) -> String {
    if is_image(file) {
        return format!(
            "[image `{}` attached; not shown: this turn cannot carry images]",
            display_name(file)
        );
    }
    text_form(file, &display_name(file), media_type(file).as_deref())
}

/// A message's text followed by the text form of each of its attachments: how a turn that
/// cannot carry multimodal content still tells the model what was attached.
pub(crate) fn text_with_attachments(message: &LlmMessage) -> String {
    let mut text = message.content.clone();
    for file in &message.attachments {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&attachment_as_text(file));
    }
    text
}

/// A text file's contents when it is small UTF-8 text with its bytes at hand, else a note.
fn text_form(file: &FileContent, name: &str, media_type: Option<&str>) -> String {
    let shown = media_type.unwrap_or("unknown type");
    let text_like = media_type.is_some_and(is_text_media_type);
    let Some(encoded) = file.bytes.as_deref() else {
        let place = file
            .uri
            .as_deref()
            .filter(|uri| is_web_url(uri) && *uri != name)
            .map(|uri| format!(" at {uri}"))
            .unwrap_or_default();
        return format!(
            "[file `{name}` ({shown}){place} attached; its contents are not shown to the model]"
        );
    };
    // A file too large is known before decoding it: base64's estimate counts the padding as
    // bytes, so that is taken off.
    let encoded = encoded.trim();
    let padding = encoded.bytes().rev().take_while(|b| *b == b'=').count();
    let size = base64::decoded_len_estimate(encoded.len()).saturating_sub(padding);
    if text_like && size <= MAX_TEXT_FILE_BYTES {
        if let Some(text) = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
        {
            return format!("[file `{name}` ({shown})]\n{text}\n[end of file `{name}`]");
        }
    }
    let why = if text_like && size > MAX_TEXT_FILE_BYTES {
        "too large to show to the model"
    } else {
        "its contents are not shown to the model"
    };
    format!("[file `{name}` ({shown}, {size} bytes) attached; {why}]")
}

/// What the model is told the file is called.
fn display_name(file: &FileContent) -> String {
    let name = file
        .name
        .as_deref()
        .or_else(|| file.uri.as_deref().filter(|uri| !uri.starts_with("data:")));
    name.unwrap_or("unnamed").to_owned()
}

fn is_web_url(uri: &str) -> bool {
    let lower = uri.get(..8).unwrap_or(uri).to_ascii_lowercase();
    lower.starts_with("https://") || lower.starts_with("http://")
}

fn is_text_media_type(media_type: &str) -> bool {
    media_type.starts_with("text/")
        || media_type == "application/json"
        || media_type.ends_with("+json")
        || matches!(
            media_type,
            "application/xml" | "application/yaml" | "application/x-yaml" | "application/toml"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAI_IMAGES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];
    const ANTHROPIC_IMAGES: &[&str] = OPENAI_IMAGES;
    const GEMINI_IMAGES: &[&str] = &["image/png", "image/jpeg", "image/webp", "image/heic"];

    fn file(name: &str, media_type: Option<&str>) -> FileContent {
        FileContent {
            name: Some(name.into()),
            media_type: media_type.map(str::to_owned),
            ..Default::default()
        }
    }

    /// A file known by `uri` (and `name`, when given) only.
    fn linked(name: Option<&str>, uri: &str) -> FileContent {
        FileContent {
            name: name.map(str::to_owned),
            uri: Some(uri.into()),
            ..Default::default()
        }
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn an_image_with_bytes_goes_inline_with_its_media_type() {
        let mut photo = file("cat.JPG", None);
        photo.bytes = Some("AAAA".into());
        assert_eq!(
            attachment(&photo, OPENAI_IMAGES),
            Attachment::InlineImage {
                media_type: "image/jpeg".into(),
                data: "AAAA"
            }
        );
    }

    #[test]
    fn an_image_by_url_or_data_url_keeps_its_source() {
        for (uri, formats, expected) in [
            (
                "https://example.com/a.png?size=2",
                GEMINI_IMAGES,
                Attachment::ImageUrl {
                    media_type: "image/png".into(),
                    url: "https://example.com/a.png?size=2",
                },
            ),
            (
                "data:image/webp;base64,UklG",
                ANTHROPIC_IMAGES,
                Attachment::InlineImage {
                    media_type: "image/webp".into(),
                    data: "UklG",
                },
            ),
        ] {
            let image = linked(None, uri);
            assert_eq!(attachment(&image, formats), expected, "{uri}");
        }
    }

    #[test]
    fn an_image_the_model_cannot_read_becomes_a_note() {
        let local = linked(Some("shot.png"), "keel-attachment://t1/shot.png");
        assert_eq!(
            attachment(&local, OPENAI_IMAGES),
            Attachment::Text(
                "[image `shot.png` attached; it has neither bytes nor a public URL the model \
                 can read]"
                    .into()
            )
        );
        let mut bitmap = file("scan.bmp", Some("image/bmp"));
        bitmap.bytes = Some("Qk0=".into());
        assert_eq!(
            attachment(&bitmap, ANTHROPIC_IMAGES),
            Attachment::Text(
                "[image `scan.bmp` (image/bmp) attached; this model does not accept that format]"
                    .into()
            )
        );
    }

    #[test]
    fn small_text_files_are_shown_and_others_are_named() {
        let mut notes = file("notes.md", Some("text/markdown; charset=utf-8"));
        notes.bytes = Some(b64("# Plan\nship it".as_bytes()));
        assert_eq!(
            attachment(&notes, OPENAI_IMAGES),
            Attachment::Text(
                "[file `notes.md` (text/markdown)]\n# Plan\nship it\n[end of file `notes.md`]"
                    .into()
            )
        );
        // Exactly at the limit (its base64 ends in padding) is still shown.
        let mut limit = file("limit.txt", Some("text/plain"));
        limit.bytes = Some(b64(&vec![b'a'; MAX_TEXT_FILE_BYTES]));
        let shown = attachment(&limit, OPENAI_IMAGES);
        assert!(
            matches!(&shown, Attachment::Text(text) if text.starts_with("[file `limit.txt` (text/plain)]\n")),
            "{shown:?}"
        );
        let mut big = file("big.json", None);
        big.bytes = Some(b64(&vec![b' '; MAX_TEXT_FILE_BYTES + 1]));
        assert_eq!(
            attachment(&big, OPENAI_IMAGES),
            Attachment::Text(
                "[file `big.json` (application/json, 32769 bytes) attached; too large to \
                 show to the model]"
                    .into()
            )
        );
        let mut pdf = file("report.pdf", Some("application/pdf"));
        pdf.bytes = Some(b64(b"%PDF-1.7"));
        assert_eq!(
            attachment(&pdf, OPENAI_IMAGES),
            Attachment::Text(
                "[file `report.pdf` (application/pdf, 8 bytes) attached; its contents are \
                 not shown to the model]"
                    .into()
            )
        );
        let remote = linked(Some("data.bin"), "https://example.com/data.bin");
        assert_eq!(
            attachment_as_text(&remote),
            "[file `data.bin` (unknown type) at https://example.com/data.bin attached; its \
             contents are not shown to the model]"
        );
    }
}
