//! Agent cards: the interfaces a card lists, security schemes, and Keel's card extras in the
//! [`KEEL_CARD_EXTENSION_URI`] extension.

use std::collections::{BTreeMap, HashMap};

use keel_core::{
    AgentCapabilities, AgentCard, AgentResult, AgentRole, AgentSkill, Metadata, SecurityScheme,
    TransportKind,
};
use serde_json::{Map, Value};

use super::codec::{bad_answer, take, to_json, WireMetadata};

/// The URI of the agent-card extension that carries Keel's card extras (role, tags, transport,
/// capability flags, skill input/output schemas) in its `params`.
pub const KEEL_CARD_EXTENSION_URI: &str = "https://keel.dev/extensions/card/v1";

/// The URI of the extension by which a client answers an action waiting for approval: a
/// message to the `input-required` task whose one part is the data part
/// `{"approval": {"requestId", "decision": "approve" | "deny", "reason"?}}`, answering the
/// request in the task's `metadata.keel.pendingApproval` (`docs/approvals.md`).
pub const KEEL_APPROVAL_EXTENSION_URI: &str = "https://keel.dev/extensions/approval/v1";

/// The protocol binding of the JSON-RPC interface in `supportedInterfaces`.
pub(crate) const JSONRPC_BINDING: &str = a2a::TRANSPORT_PROTOCOL_JSONRPC;
/// The protocol binding of the REST interface in `supportedInterfaces`.
const HTTP_JSON_BINDING: &str = a2a::TRANSPORT_PROTOCOL_HTTP_JSON;

/// A protocol binding a server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// JSON-RPC 2.0 over HTTP.
    JsonRpc,
    /// HTTP+JSON (REST).
    HttpJson,
    /// gRPC (the `grpc` feature).
    #[cfg(feature = "grpc")]
    Grpc,
}

/// One entry of a card's `supportedInterfaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub url: String,
    pub binding: Binding,
    pub protocol_version: String,
}

/// Where a card says its interfaces are, for a client that speaks A2A 1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Endpoints {
    /// The JSON-RPC interface (a 1.x one when the card lists several).
    pub jsonrpc: Option<String>,
    /// The HTTP+JSON interface (a 1.x one when the card lists several).
    pub http_json: Option<String>,
}

fn security_scheme_to_wire(name: &str, scheme: &SecurityScheme) -> Option<a2a::SecurityScheme> {
    Some(match scheme.clone() {
        SecurityScheme::ApiKey {
            location,
            name,
            description,
        } => a2a::SecurityScheme::ApiKey(a2a::ApiKeySecurityScheme {
            location,
            name,
            description,
        }),
        SecurityScheme::Http {
            scheme,
            bearer_format,
            description,
        } => a2a::SecurityScheme::HttpAuth(a2a::HttpAuthSecurityScheme {
            scheme,
            description,
            bearer_format,
        }),
        SecurityScheme::OAuth2 { flows, description } => {
            match serde_json::from_value::<a2a::OAuthFlows>(flows) {
                Ok(flows) => a2a::SecurityScheme::OAuth2(a2a::OAuth2SecurityScheme {
                    flows,
                    description,
                    oauth2_metadata_url: None,
                }),
                Err(err) => {
                    tracing::warn!(scheme = name, error = %err, "OAuth2 flows are not in A2A's shape; the scheme is left off the card");
                    return None;
                }
            }
        }
        SecurityScheme::OpenIdConnect {
            open_id_connect_url,
            description,
        } => a2a::SecurityScheme::OpenIdConnect(a2a::OpenIdConnectSecurityScheme {
            open_id_connect_url,
            description,
        }),
        SecurityScheme::MutualTls { description } => {
            a2a::SecurityScheme::MutualTls(a2a::MutualTlsSecurityScheme { description })
        }
    })
}

fn security_scheme_from_wire(scheme: a2a::SecurityScheme) -> SecurityScheme {
    match scheme {
        a2a::SecurityScheme::ApiKey(s) => SecurityScheme::ApiKey {
            location: s.location,
            name: s.name,
            description: s.description,
        },
        a2a::SecurityScheme::HttpAuth(s) => SecurityScheme::Http {
            scheme: s.scheme,
            bearer_format: s.bearer_format,
            description: s.description,
        },
        a2a::SecurityScheme::OAuth2(s) => SecurityScheme::OAuth2 {
            flows: to_json(&s.flows),
            description: s.description,
        },
        a2a::SecurityScheme::OpenIdConnect(s) => SecurityScheme::OpenIdConnect {
            open_id_connect_url: s.open_id_connect_url,
            description: s.description,
        },
        a2a::SecurityScheme::MutualTls(s) => SecurityScheme::MutualTls {
            description: s.description,
        },
    }
}

/// The approval extension: every Keel agent takes approval decisions by message. Its params
/// name the data part's key and the path, in the task's metadata, of the pending request.
fn approval_extension() -> a2a::AgentExtension {
    let mut params = WireMetadata::new();
    params.insert(
        "dataPartKey".into(),
        Value::from(keel_agent::APPROVAL_PART_KEY),
    );
    params.insert(
        "pendingMetadataPath".into(),
        serde_json::json!([super::KEEL_METADATA_KEY, "pendingApproval"]),
    );
    a2a::AgentExtension {
        uri: KEEL_APPROVAL_EXTENSION_URI.into(),
        description: Some(
            "Approve or deny an action waiting for approval: send the input-required task a \
             message whose one part is the data part {\"approval\": {\"requestId\", \
             \"decision\": \"approve\" | \"deny\", \"reason\"?}}"
                .into(),
        ),
        required: Some(false),
        params: Some(params),
    }
}

fn card_extension(card: &AgentCard) -> a2a::AgentExtension {
    let mut params = WireMetadata::new();
    params.insert("role".into(), to_json(&card.role));
    params.insert("transport".into(), to_json(&card.transport));
    params.insert("tags".into(), to_json(&card.tags));
    params.insert("capabilities".into(), to_json(&card.capabilities));
    let schemas: Map<String, Value> = card
        .skills
        .iter()
        .filter(|s| s.input_schema.is_some() || s.output_schema.is_some())
        .map(|s| {
            let mut entry = Map::new();
            if let Some(schema) = &s.input_schema {
                entry.insert("inputSchema".into(), schema.clone());
            }
            if let Some(schema) = &s.output_schema {
                entry.insert("outputSchema".into(), schema.clone());
            }
            (s.id.clone(), Value::Object(entry))
        })
        .collect();
    if !schemas.is_empty() {
        params.insert("skillSchemas".into(), Value::Object(schemas));
    }
    a2a::AgentExtension {
        uri: KEEL_CARD_EXTENSION_URI.into(),
        description: Some(
            "Keel card extras: role, tags, transport, capability flags, skill schemas".into(),
        ),
        required: Some(false),
        params: Some(params),
    }
}

fn card_to_wire_with(card: &AgentCard, interfaces: &[Interface]) -> a2a::AgentCard {
    let skills = card
        .skills
        .iter()
        .map(|skill| a2a::AgentSkill {
            id: skill.id.clone(),
            name: skill.name.clone(),
            description: skill.description.clone(),
            tags: skill.tags.clone(),
            examples: (!skill.examples.is_empty()).then(|| skill.examples.clone()),
            input_modes: Some(card.input_formats.clone()),
            output_modes: Some(card.output_formats.clone()),
            security_requirements: None,
        })
        .collect();
    let security_schemes: HashMap<String, a2a::SecurityScheme> = card
        .security_schemes
        .iter()
        .filter_map(|(name, scheme)| Some((name.clone(), security_scheme_to_wire(name, scheme)?)))
        .collect();
    a2a::AgentCard {
        name: card.name.clone(),
        description: card.description.clone(),
        version: card.version.clone(),
        supported_interfaces: interfaces
            .iter()
            .map(|i| a2a::AgentInterface {
                url: i.url.clone(),
                protocol_binding: match i.binding {
                    Binding::JsonRpc => JSONRPC_BINDING.into(),
                    Binding::HttpJson => HTTP_JSON_BINDING.into(),
                    #[cfg(feature = "grpc")]
                    Binding::Grpc => a2a::TRANSPORT_PROTOCOL_GRPC.into(),
                },
                protocol_version: i.protocol_version.clone(),
                tenant: None,
            })
            .collect(),
        capabilities: a2a::AgentCapabilities {
            streaming: Some(card.capabilities.streaming),
            push_notifications: Some(card.capabilities.push_notifications),
            extensions: Some(vec![card_extension(card), approval_extension()]),
            extended_agent_card: Some(false),
        },
        default_input_modes: card.input_formats.clone(),
        default_output_modes: card.output_formats.clone(),
        skills,
        provider: None,
        documentation_url: None,
        icon_url: None,
        security_schemes: (!security_schemes.is_empty()).then_some(security_schemes),
        security_requirements: None,
        signatures: None,
    }
}

/// The interface of this binding, preferring one that speaks A2A 1.x.
fn find_interface<'a>(
    interfaces: &'a [a2a::AgentInterface],
    binding: &str,
) -> Option<&'a a2a::AgentInterface> {
    let of_binding = || {
        interfaces
            .iter()
            .filter(move |i| i.protocol_binding.eq_ignore_ascii_case(binding))
    };
    of_binding()
        .find(|i| i.protocol_version.starts_with("1."))
        .or_else(|| of_binding().next())
}

/// Keel's view of a wire card, and where its interfaces are.
fn card_from_wire(card: a2a::AgentCard) -> (AgentCard, Endpoints) {
    let jsonrpc = find_interface(&card.supported_interfaces, JSONRPC_BINDING);
    let endpoints = Endpoints {
        jsonrpc: jsonrpc.map(|i| i.url.clone()),
        http_json: find_interface(&card.supported_interfaces, HTTP_JSON_BINDING)
            .map(|i| i.url.clone()),
    };
    let interface = jsonrpc.or_else(|| card.supported_interfaces.first());
    let mut out = AgentCard::new(
        card.name,
        card.description,
        interface.map(|i| i.url.clone()).unwrap_or_default(),
    );
    if let Some(interface) = interface {
        out.protocol_version = interface.protocol_version.clone();
    }
    out.version = card.version;
    out.input_formats = card.default_input_modes;
    out.output_formats = card.default_output_modes;

    let params = card
        .capabilities
        .extensions
        .iter()
        .flatten()
        .find(|e| e.uri == KEEL_CARD_EXTENSION_URI)
        .and_then(|e| e.params.clone())
        .map(|p| p.into_iter().collect::<Metadata>())
        .unwrap_or_default();
    let mut params = params;
    out.role = take::<AgentRole>(&mut params, "role").unwrap_or_default();
    out.transport = take::<TransportKind>(&mut params, "transport").unwrap_or_default();
    out.tags = take(&mut params, "tags").unwrap_or_default();
    out.capabilities = take::<AgentCapabilities>(&mut params, "capabilities").unwrap_or_default();
    out.capabilities.streaming = card.capabilities.streaming.unwrap_or(false);
    out.capabilities.push_notifications = card.capabilities.push_notifications.unwrap_or(false);
    let schemas: Map<String, Value> = take(&mut params, "skillSchemas").unwrap_or_default();

    out.skills = card
        .skills
        .into_iter()
        .map(|skill| {
            let schema = schemas.get(&skill.id);
            AgentSkill {
                input_schema: schema.and_then(|s| s.get("inputSchema")).cloned(),
                output_schema: schema.and_then(|s| s.get("outputSchema")).cloned(),
                id: skill.id,
                name: skill.name,
                description: skill.description,
                tags: skill.tags,
                examples: skill.examples.unwrap_or_default(),
            }
        })
        .collect();
    out.security_schemes = card
        .security_schemes
        .unwrap_or_default()
        .into_iter()
        .map(|(name, scheme)| (name, security_scheme_from_wire(scheme)))
        .collect::<BTreeMap<_, _>>();
    (out, endpoints)
}

/// A card as the wire `AgentCard` object, listing these interfaces.
pub(crate) fn encode_card_with(card: &AgentCard, interfaces: &[Interface]) -> Value {
    to_json(&card_to_wire_with(card, interfaces))
}

/// A wire `AgentCard` as Keel's card, with where its interfaces are.
pub(crate) fn decode_card(card: Value) -> AgentResult<(AgentCard, Endpoints)> {
    let card: a2a::AgentCard =
        serde_json::from_value(card).map_err(|e| bad_answer("agent card", e))?;
    Ok(card_from_wire(card))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{full_card, through_wire_json};
    use serde_json::json;

    /// The card with one interface, JSON-RPC at its own URL.
    fn card_to_wire(card: &AgentCard) -> a2a::AgentCard {
        card_to_wire_with(
            card,
            &[Interface {
                url: card.url.clone(),
                binding: Binding::JsonRpc,
                protocol_version: card.protocol_version.clone(),
            }],
        )
    }

    fn encode_card(card: &AgentCard) -> Value {
        to_json(&card_to_wire(card))
    }

    #[test]
    fn card_round_trips_through_the_wire() {
        for card in [AgentCard::new("a", "b", "http://x/"), full_card()] {
            let wire = through_wire_json(card_to_wire(&card));
            let (back, endpoints) = card_from_wire(wire);
            assert_eq!(back, card);
            assert_eq!(endpoints.jsonrpc.as_deref(), Some(card.url.as_str()));
            assert_eq!(endpoints.http_json, None);
        }
    }

    #[test]
    fn the_card_declares_approvals_by_message() {
        let wire = encode_card(&AgentCard::new("a", "b", "http://x/"));
        let ext = wire["capabilities"]["extensions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["uri"] == KEEL_APPROVAL_EXTENSION_URI)
            .expect("the approval extension");
        assert_eq!(ext["required"], false);
        assert_eq!(ext["params"]["dataPartKey"], "approval");
        assert_eq!(
            ext["params"]["pendingMetadataPath"],
            serde_json::json!(["keel", "pendingApproval"])
        );
    }

    #[test]
    fn card_extras_travel_in_the_keel_extension() {
        let wire = encode_card(&full_card());
        assert_eq!(
            wire["supportedInterfaces"],
            json!([{"url": "http://127.0.0.1:9/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}])
        );
        assert_eq!(wire["capabilities"]["streaming"], false);
        let ext = &wire["capabilities"]["extensions"][0];
        assert_eq!(ext["uri"], KEEL_CARD_EXTENSION_URI);
        assert_eq!(ext["params"]["role"], "orchestrator");
        assert_eq!(ext["params"]["tags"], json!(["finance"]));
        assert_eq!(
            ext["params"]["skillSchemas"]["forecast"]["inputSchema"],
            json!({"type": "object"})
        );
        assert_eq!(
            wire["securitySchemes"]["key"]["apiKeySecurityScheme"]["name"],
            "X-Api-Key"
        );
        assert_eq!(wire["skills"][0]["examples"], json!(["Athens tomorrow?"]));
    }
}
