//! [`DefaultRuntime`]: the service hub with Keel's built-in services.

use std::sync::Arc;

use keel_llm::{Llm, MockLlm};
use keel_runtime::{
    AuthService, InMemoryRuntime, LoggingService, MemoryService, RunStore, Runtime,
    StaticAuthService, TaskManager, ThreadStore,
};

/// The out-of-the-box [`Runtime`]: a static tenant, in-process task and memory stores,
/// `tracing` logs, and a default model.
///
/// ```
/// use keel::prelude::*;
/// let runtime = DefaultRuntime::builder()
///     .llm(MockLlm::new())
///     .auth(keel::services::StaticAuthService::new(AuthContext::new("acme", "ops")))
///     .build();
/// assert_eq!(runtime.auth_service().auth_context().app_name, "acme");
/// ```
#[derive(Clone)]
pub struct DefaultRuntime {
    services: InMemoryRuntime,
}

impl DefaultRuntime {
    /// The default services with `llm` as the default model.
    pub fn new(llm: impl Llm + 'static) -> Self {
        Self::builder().llm(llm).build()
    }

    /// The default services with the offline [`MockLlm`]: no API key, no network.
    pub fn offline() -> Self {
        Self::builder().build()
    }

    /// Choose the services one by one.
    pub fn builder() -> DefaultRuntimeBuilder {
        DefaultRuntimeBuilder {
            llm: None,
            auth: None,
        }
    }
}

impl Runtime for DefaultRuntime {
    fn auth_service(&self) -> Arc<dyn AuthService> {
        self.services.auth_service()
    }
    fn task_manager(&self) -> Arc<dyn TaskManager> {
        self.services.task_manager()
    }
    fn memory_service(&self) -> Arc<dyn MemoryService> {
        self.services.memory_service()
    }
    fn logging_service(&self) -> Arc<dyn LoggingService> {
        self.services.logging_service()
    }
    fn default_llm(&self) -> Arc<dyn Llm> {
        self.services.default_llm()
    }
    fn thread_store(&self) -> Arc<dyn ThreadStore> {
        self.services.thread_store()
    }
    fn run_store(&self) -> Arc<dyn RunStore> {
        self.services.run_store()
    }
}

/// Builds a [`DefaultRuntime`].
#[must_use]
pub struct DefaultRuntimeBuilder {
    llm: Option<Arc<dyn Llm>>,
    auth: Option<StaticAuthService>,
}

impl DefaultRuntimeBuilder {
    /// The default model (the offline [`MockLlm`] when not set).
    pub fn llm(mut self, llm: impl Llm + 'static) -> Self {
        self.llm = Some(Arc::new(llm));
        self
    }

    /// The tenant every request runs as.
    pub fn auth(mut self, auth: StaticAuthService) -> Self {
        self.auth = Some(auth);
        self
    }

    /// The runtime.
    pub fn build(self) -> DefaultRuntime {
        let llm = self.llm.unwrap_or_else(|| Arc::new(MockLlm::new()));
        let mut services = InMemoryRuntime::new(llm);
        if let Some(auth) = self.auth {
            services = services.with_auth_service(auth);
        }
        DefaultRuntime { services }
    }
}
