//! [`ProviderBuilder`]: the one builder every provider uses for the settings they share (the
//! model, the server, the API key, timeouts and retries, the model profile); each provider
//! adds only its own `build`.

use std::fmt;
use std::marker::PhantomData;

use super::http::{ApiKey, HttpClient, HttpOptions};
use crate::{LlmError, LlmErrorKind, ModelProfile};

/// Builds a provider's client `L`, e.g. [`OpenAiBuilder`](super::OpenAiBuilder) (an alias of
/// `ProviderBuilder<OpenAiLlm>`). Start one with the provider's `builder` function; `build`
/// checks the settings and makes the client.
///
/// ```
/// # #[cfg(feature = "anthropic")] {
/// use std::time::Duration;
/// use keel_llm::{providers::{AnthropicLlm, HttpOptions}, Llm};
/// let llm = AnthropicLlm::builder("claude-sonnet-4-5")
///     .with_api_key("sk-ant-secret")
///     .with_base_url("http://127.0.0.1:9/")
///     .with_http_options(HttpOptions::default().with_max_attempts(1))
///     .with_vision(false)
///     .build()?;
/// assert!(!llm.profile().supports_vision);
/// # }
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[must_use]
pub struct ProviderBuilder<L> {
    pub(crate) model: String,
    pub(crate) base_url: String,
    api_key: Option<ApiKey>,
    /// Where a key that was not given is looked up; empty: nowhere.
    key_env: &'static [&'static str],
    options: HttpOptions,
    profile: Option<ModelProfile>,
    vision: Option<bool>,
    client: PhantomData<fn() -> L>,
}

impl<L> ProviderBuilder<L> {
    /// A builder for `model` at `base_url`, reading a key not given from the first set variable
    /// among `key_env`.
    pub(crate) fn new(
        model: impl Into<String>,
        base_url: impl Into<String>,
        key_env: &'static [&'static str],
    ) -> Self {
        Self {
            model: model.into(),
            base_url: base_url.into(),
            api_key: None,
            key_env,
            options: HttpOptions::default(),
            profile: None,
            vision: None,
            client: PhantomData,
        }
    }

    /// Use this API key instead of the provider's environment variable.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = ApiKey::new(key);
        self
    }

    /// Talk to this server instead of the provider's own; the provider's API path is
    /// appended.
    pub fn with_base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }

    /// Set timeouts and retries.
    pub fn with_http_options(mut self, options: HttpOptions) -> Self {
        self.options = options;
        self
    }

    /// Describe the model (context window, limits) instead of the built-in table.
    pub fn with_profile(mut self, profile: ModelProfile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// Say whether the model reads images, over the profile's answer. Without vision the
    /// engine replaces images with a note before the request.
    pub fn with_vision(mut self, supported: bool) -> Self {
        self.vision = Some(supported);
        self
    }

    /// Whether a key is looked up in the environment (and so is required).
    #[cfg_attr(not(feature = "openai"), allow(dead_code))]
    pub(crate) fn reads_key_env(&self) -> bool {
        !self.key_env.is_empty()
    }

    /// The key given to the builder, else the first set variable among its `key_env`.
    pub(crate) fn key(&self) -> Option<ApiKey> {
        self.api_key
            .clone()
            .or_else(|| ApiKey::from_env(self.key_env))
    }

    /// The key, or a configuration error saying `missing` (how to give one).
    pub(crate) fn required_key(&self, missing: &str) -> Result<ApiKey, LlmError> {
        self.key()
            .ok_or_else(|| LlmError::new(LlmErrorKind::Config, self.model.as_str(), missing))
    }

    /// The profile given to the builder, else the built-in one of `provider`'s model, with
    /// the vision setting over either.
    pub(crate) fn profile(&self, provider: &str) -> ModelProfile {
        let mut profile = self
            .profile
            .clone()
            .unwrap_or_else(|| ModelProfile::known(provider, &self.model));
        if let Some(vision) = self.vision {
            profile.supports_vision = vision;
        }
        profile
    }

    /// The HTTP client with the builder's timeouts and retries.
    pub(crate) fn http(&self) -> Result<HttpClient, LlmError> {
        HttpClient::new(self.options.clone(), &self.model)
    }
}

// By hand rather than derived: a derive would ask `L` to be `Clone` and `Debug` as well.
impl<L> Clone for ProviderBuilder<L> {
    fn clone(&self) -> Self {
        Self {
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            api_key: self.api_key.clone(),
            key_env: self.key_env,
            options: self.options.clone(),
            profile: self.profile.clone(),
            vision: self.vision,
            client: PhantomData,
        }
    }
}

impl<L> fmt::Debug for ProviderBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderBuilder")
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key)
            .field("key_env", &self.key_env)
            .field("options", &self.options)
            .field("profile", &self.profile)
            .field("vision", &self.vision)
            .finish()
    }
}
