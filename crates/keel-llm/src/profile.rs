//! [`ModelProfile`]: what is known about a model (provider, context window, capabilities),
//! used to size context manifests and to fill provider defaults.

use keel_core::ModelPrice;
use serde::{Deserialize, Serialize};

/// What is known about a model. Figures are `None` where unknown rather than guessed.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// The provider (`openai`, `anthropic`, `gemini`, `openai-compatible`, `mock`).
    pub provider: String,
    /// The model's name as the provider knows it.
    pub model: String,
    /// How many tokens the model reads at most (prompt plus answer).
    pub context_window: Option<u64>,
    /// How many tokens the model writes at most in one answer.
    pub max_output_tokens: Option<u64>,
    /// Whether the model reads images.
    #[serde(default)]
    pub supports_vision: bool,
    /// Whether the model calls tools.
    #[serde(default = "default_true")]
    pub supports_tools: bool,
    /// What its tokens cost, when the deployment says (`keel.toml`'s `[prices]`): the
    /// engine records each call's cost and checks `max_cost_micros` with it.
    #[serde(default)]
    pub price: Option<ModelPrice>,
}

fn default_true() -> bool {
    true
}

impl ModelProfile {
    /// A profile with unknown figures: no context window, tools supported, no vision.
    ///
    /// ```
    /// use keel_llm::ModelProfile;
    /// let profile = ModelProfile::new("openai", "gpt-4o").with_context_window(128_000);
    /// assert_eq!(profile.context_window, Some(128_000));
    /// ```
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            model: model.into(),
            context_window: None,
            max_output_tokens: None,
            supports_vision: false,
            supports_tools: true,
            price: None,
        }
    }

    /// Set the price of the model's tokens.
    ///
    /// ```
    /// use keel_core::ModelPrice;
    /// use keel_llm::ModelProfile;
    /// let price = ModelPrice::per_million(3.0, 15.0).unwrap();
    /// let profile = ModelProfile::new("anthropic", "claude-sonnet-4").with_price(price);
    /// assert_eq!(profile.price, Some(price));
    /// ```
    #[must_use]
    pub fn with_price(mut self, price: ModelPrice) -> Self {
        self.price = Some(price);
        self
    }

    /// Set the context window.
    #[must_use]
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Set the answer length limit.
    #[must_use]
    pub fn with_max_output_tokens(mut self, tokens: u64) -> Self {
        self.max_output_tokens = Some(tokens);
        self
    }

    /// Set whether the model reads images.
    #[must_use]
    pub fn with_vision(mut self, supported: bool) -> Self {
        self.supports_vision = supported;
        self
    }

    /// Set whether the model calls tools.
    #[must_use]
    pub fn with_tools(mut self, supported: bool) -> Self {
        self.supports_tools = supported;
        self
    }

    /// A profile for a well-known model family, with its published limits; unknown models
    /// get [`ModelProfile::new`]'s unknown figures. The table is deliberately small: a
    /// deployment that needs exact figures sets them on the provider's builder.
    ///
    /// Vision follows the family (GPT-4o, 4.1 and 5, o1, o3 and o4-mini, Claude 3 and
    /// later, Gemini 1.5 and later read images; o1-mini and o3-mini do not). For
    /// `openai-compatible` it is off whatever the model's name: whether the server passes
    /// images to the model it runs is not known, so a deployment turns it on explicitly.
    ///
    /// ```
    /// use keel_llm::ModelProfile;
    /// assert!(ModelProfile::known("openai", "gpt-4o").supports_vision);
    /// assert!(!ModelProfile::known("openai", "o3-mini").supports_vision);
    /// assert!(!ModelProfile::known("openai-compatible", "gpt-4o").supports_vision);
    /// ```
    pub fn known(provider: &str, model: &str) -> Self {
        let base = Self::new(provider, model);
        let m = model.to_ascii_lowercase();
        let m = m.strip_prefix("models/").unwrap_or(&m);
        let text_only = m.starts_with("o1-mini") || m.starts_with("o3-mini");
        // Ordered most specific first: `gpt-4o-mini` must not fall into a shorter prefix.
        let (window, output) = if m.starts_with("gpt-4.1") {
            (1_047_576, 32_768)
        } else if m.starts_with("gpt-4o") {
            (128_000, 16_384)
        } else if m.starts_with("gpt-5") {
            (400_000, 128_000)
        } else if m.starts_with("o1-mini") {
            (128_000, 65_536)
        } else if m.starts_with("o1") || m.starts_with("o3") || m.starts_with("o4") {
            (200_000, 100_000)
        } else if m.starts_with("claude-3-5-haiku") || m.starts_with("claude-3-haiku") {
            (200_000, 8_192)
        } else if m.starts_with("claude-2") || m.starts_with("claude-instant") {
            // Text-only predecessors of Claude 3: figures vary by version, so unknown.
            return base;
        } else if m.starts_with("claude") {
            (200_000, 32_000)
        } else if m.starts_with("gemini-1.5-pro") {
            (2_097_152, 8_192)
        } else if m.starts_with("gemini-1.0") || m == "gemini-pro" {
            // Gemini 1.0 Pro read text only.
            return base;
        } else if m.starts_with("gemini") {
            (1_048_576, 65_536)
        } else {
            return base;
        };
        base.with_context_window(window)
            .with_max_output_tokens(output)
            .with_vision(!text_only && provider != "openai-compatible")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_have_windows_and_unknown_ones_do_not() {
        assert_eq!(
            ModelProfile::known("openai", "gpt-4o-mini").context_window,
            Some(128_000)
        );
        assert_eq!(
            ModelProfile::known("anthropic", "claude-sonnet-4-5").context_window,
            Some(200_000)
        );
        let local = ModelProfile::known("openai-compatible", "llama3.2:3b");
        assert_eq!(local.context_window, None);
        assert!(local.supports_tools);
    }

    #[test]
    fn vision_is_reported_per_model_family() {
        // A compatible server's model is text-only until the deployment says otherwise.
        let expected = [
            ("openai", "gpt-4o-mini", true),
            ("openai", "gpt-4.1-nano", true),
            ("openai", "gpt-5", true),
            ("openai", "o1", true),
            ("openai", "o3", true),
            ("openai", "o4-mini", true),
            ("openai", "o1-mini", false),
            ("openai", "o3-mini", false),
            ("openai", "gpt-3.5-turbo", false),
            ("openai", "text-embedding-3-small", false),
            ("anthropic", "claude-3-haiku-20240307", true),
            ("anthropic", "claude-sonnet-4-5", true),
            ("anthropic", "claude-opus-4-1", true),
            ("anthropic", "claude-2.1", false),
            ("anthropic", "claude-instant-1.2", false),
            ("gemini", "gemini-2.5-flash", true),
            ("gemini", "models/gemini-1.5-pro", true),
            ("gemini", "gemini-2.0-flash-lite", true),
            ("gemini", "gemini-1.0-pro", false),
            ("openai-compatible", "gpt-4o", false),
            ("openai-compatible", "llava", false),
        ];
        for (provider, model, reads) in expected {
            let profile = ModelProfile::known(provider, model);
            assert_eq!(profile.supports_vision, reads, "{provider} {model}");
        }
    }
}
