//! Keel's service hub: the [`Runtime`] trait through which the engine reaches every service
//! (auth and tenancy, tasks and their event logs, memory, logging, the default model), the
//! store traits, and their in-memory implementations.
//!
//! Every store method takes an [`AuthContext`]: data is namespaced by tenant, so one tenant
//! can never read, list or overwrite another's records, whatever ids it sends.
//!
//! ```
//! use std::sync::Arc;
//! use keel_core::{Message, Task};
//! use keel_llm::MockLlm;
//! use keel_runtime::{Runtime, Services};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel_core::AgentError> {
//! let runtime = Services::in_memory(Arc::new(MockLlm::new()));
//! let auth = runtime.auth_service().auth_context();
//! let task = Task::create(Message::user("hi"));
//! runtime.task_manager().save_task(&auth, &task).await?;
//! assert!(runtime.task_manager().get_task(&auth, &task.id).await?.is_some());
//! # Ok(())
//! # }
//! ```

mod async_calls;
mod auth;
mod changes;
mod lease;
mod logging;
mod memory;
mod run_store;
mod scoped;
mod services;
mod step;
mod stored_text;
pub mod stored_time;
mod task_manager;
#[cfg(feature = "testing")]
pub mod testing;
mod thread;
mod thread_memory;
mod timers;
mod validated;

use std::sync::Arc;

pub use async_calls::{
    AsyncCall, AsyncCallMove, AsyncCallState, AsyncCallStore, InMemoryAsyncCallStore,
};
pub use auth::{ApiKeyAuthService, AuthContext, AuthService, Credentials, StaticAuthService};
pub use changes::{ChangeFeed, StoreChange};
/// The model trait, re-exported because [`Runtime::default_llm`] names it.
pub use keel_llm::Llm;
pub use lease::{lease_blocks, lease_ttl, Lease, LeaseAsk, LeaseRenewal, ThreadLeases};
pub use logging::{ConsoleLoggingService, LogLevel, LoggingService, TracingLoggingService};
pub use memory::{
    memory_expiry_nanos, InMemoryMemoryService, MemoryService, MemoryServiceExt, MemoryWrite,
};
pub use run_store::{
    InMemoryRunStore, IndexedRecord, RecordIndex, RunQuery, RunRecord, RunStore, TaskRecord,
};
pub use services::Services;
pub use step::{StepStore, TaskWrite};
pub use stored_text::{
    decode_record, decode_task_event, decode_task_snapshot, encode_record, encode_task_event,
    encode_task_events, encode_task_snapshot, RecordText,
};
pub use task_manager::{
    attach_history, list_all_tasks, load_task_with_history, updated_micros, InMemoryTaskManager,
    ListTasksFilter, Page, TaskManager, TaskOrder, TaskPageStart, UpdatedCursor,
};
pub use thread::check_ttl as check_lease_ttl;
pub use thread::{
    ChildThread, HistoryEntry, KvLimits, QueuedItem, SubagentRegistry, ThreadHistory, ThreadKv,
    ThreadQueue, ThreadStore,
};
pub use thread_memory::InMemoryThreadStore;
pub use timers::{
    timer_claimable_by, ClaimedTimer, InMemoryThreadTimers, ThreadTimers, TimerClaimRound,
    TimerRecord,
};
pub use validated::Validated;

/// The service hub: everything an agent run needs from its environment. [`Services`] is the
/// plain implementation (a bundle of services); implement it yourself to run Keel's engine on
/// your own infrastructure. The engine never reaches storage another way.
pub trait Runtime: keel_core::MaybeSend + keel_core::MaybeSync {
    /// Authentication and tenancy.
    fn auth_service(&self) -> Arc<dyn AuthService>;
    /// Tasks and their event logs.
    fn task_manager(&self) -> Arc<dyn TaskManager>;
    /// Tenant-namespaced key-value memory.
    fn memory_service(&self) -> Arc<dyn MemoryService>;
    /// Structured logging.
    fn logging_service(&self) -> Arc<dyn LoggingService>;
    /// The model used by agents that do not bring their own.
    fn default_llm(&self) -> Arc<dyn Llm>;
    /// Thread history, queues, key-value stores, the subagent registry and leases.
    fn thread_store(&self) -> Arc<dyn ThreadStore>;
    /// Task snapshots and run reports.
    fn run_store(&self) -> Arc<dyn RunStore>;
    /// A store that writes one persist point of a step (history and task log) in one round
    /// trip, when the backend offers one; `None` makes the engine write them separately.
    fn step_store(&self) -> Option<Arc<dyn StepStore>> {
        None
    }
    /// Durable thread timers (scheduled effects); `None` when this runtime keeps none, and
    /// scheduling an effect is then [`keel_core::AgentError::Unsupported`].
    fn thread_timers(&self) -> Option<Arc<dyn ThreadTimers>> {
        None
    }
    /// Pending asynchronous tool calls, found by id alone when their callback arrives.
    fn async_call_store(&self) -> Arc<dyn AsyncCallStore>;
    /// The store's announcements of what every process sharing it commits, when it makes
    /// them; `None` leaves the engine to its polls.
    fn change_feed(&self) -> Option<Arc<dyn ChangeFeed>> {
        None
    }
}

/// Implements [`Runtime`] for a type that wraps another runtime (usually [`Services`]) in a
/// field and adds something of its own (a builder, cleanup on drop): every service is the
/// field's, and the list of services is written here once instead of in each wrapper.
///
/// ```
/// use std::sync::Arc;
/// use keel_runtime::{Runtime, Services};
///
/// struct Named {
///     services: Services,
///     name: String,
/// }
/// keel_runtime::runtime_from_field!(Named => services);
///
/// let named = Named {
///     services: Services::in_memory(Arc::new(keel_llm::MockLlm::new())),
///     name: "tests".into(),
/// };
/// assert!(named.thread_timers().is_some());
/// # let _ = named.name;
/// ```
#[macro_export]
macro_rules! runtime_from_field {
    ($ty:ty => $field:ident) => {
        impl $crate::Runtime for $ty {
            fn auth_service(&self) -> ::std::sync::Arc<dyn $crate::AuthService> {
                $crate::Runtime::auth_service(&self.$field)
            }
            fn task_manager(&self) -> ::std::sync::Arc<dyn $crate::TaskManager> {
                $crate::Runtime::task_manager(&self.$field)
            }
            fn memory_service(&self) -> ::std::sync::Arc<dyn $crate::MemoryService> {
                $crate::Runtime::memory_service(&self.$field)
            }
            fn logging_service(&self) -> ::std::sync::Arc<dyn $crate::LoggingService> {
                $crate::Runtime::logging_service(&self.$field)
            }
            fn default_llm(&self) -> ::std::sync::Arc<dyn $crate::Llm> {
                $crate::Runtime::default_llm(&self.$field)
            }
            fn thread_store(&self) -> ::std::sync::Arc<dyn $crate::ThreadStore> {
                $crate::Runtime::thread_store(&self.$field)
            }
            fn run_store(&self) -> ::std::sync::Arc<dyn $crate::RunStore> {
                $crate::Runtime::run_store(&self.$field)
            }
            fn step_store(&self) -> ::std::option::Option<::std::sync::Arc<dyn $crate::StepStore>> {
                $crate::Runtime::step_store(&self.$field)
            }
            fn thread_timers(
                &self,
            ) -> ::std::option::Option<::std::sync::Arc<dyn $crate::ThreadTimers>> {
                $crate::Runtime::thread_timers(&self.$field)
            }
            fn async_call_store(&self) -> ::std::sync::Arc<dyn $crate::AsyncCallStore> {
                $crate::Runtime::async_call_store(&self.$field)
            }
            fn change_feed(
                &self,
            ) -> ::std::option::Option<::std::sync::Arc<dyn $crate::ChangeFeed>> {
                $crate::Runtime::change_feed(&self.$field)
            }
        }
    };
}

/// What [`task_manager_from_field!`] names in the code it writes, so that a crate using the
/// macro needs none of these as its own dependencies.
#[doc(hidden)]
pub mod __macro_support {
    pub use async_trait::async_trait;
    pub use keel_core::{AgentResult, Task, TaskEvent, TaskId};
}

/// Implements [`TaskManager`] for a type that wraps another task manager in a field (a test
/// double, a store that counts or fails on cue): the methods written inside the macro are the
/// type's own, and every other method forwards to the field. A wrapper restates only what it
/// changes, and a method added to the trait reaches every wrapper from here.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use keel_core::{AgentResult, Task};
/// use keel_runtime::{AuthContext, InMemoryTaskManager, TaskManager};
///
/// struct CountingSaves {
///     inner: InMemoryTaskManager,
///     saves: AtomicUsize,
/// }
/// keel_runtime::task_manager_from_field! {
///     CountingSaves => inner;
///     async fn save_task(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
///         self.saves.fetch_add(1, Ordering::Relaxed);
///         self.inner.save_task(auth, task).await
///     }
/// }
/// ```
#[macro_export]
macro_rules! task_manager_from_field {
    (
        $ty:ty => $field:ident;
        $($(#[$meta:meta])* async fn $name:ident ($($args:tt)*) -> $ret:ty $body:block)*
    ) => {
        $crate::task_manager_from_field!(@next $ty, $field,
            [$($(#[$meta])* async fn $name($($args)*) -> $ret $body)*],
            own [$($name),*],
            // Every method of the trait, with its parameters.
            todo [
                [get_task(auth: &$crate::AuthContext, task_id: &$crate::__macro_support::TaskId)
                    -> $crate::__macro_support::AgentResult<::std::option::Option<$crate::__macro_support::Task>>]
                [list_tasks(auth: &$crate::AuthContext, filter: &$crate::ListTasksFilter)
                    -> $crate::__macro_support::AgentResult<$crate::Page<$crate::__macro_support::Task>>]
                [save_task(auth: &$crate::AuthContext, task: &$crate::__macro_support::Task)
                    -> $crate::__macro_support::AgentResult<()>]
                [add_task_event(auth: &$crate::AuthContext, task_id: &$crate::__macro_support::TaskId,
                    event: &$crate::__macro_support::TaskEvent) -> $crate::__macro_support::AgentResult<()>]
                [save_task_with_events(auth: &$crate::AuthContext, task: &$crate::__macro_support::Task,
                    events: &[$crate::__macro_support::TaskEvent]) -> $crate::__macro_support::AgentResult<()>]
                [get_task_events(auth: &$crate::AuthContext, task_id: &$crate::__macro_support::TaskId)
                    -> $crate::__macro_support::AgentResult<::std::vec::Vec<$crate::__macro_support::TaskEvent>>]
                [tenants() -> $crate::__macro_support::AgentResult<::std::vec::Vec<$crate::AuthContext>>]
            ]);
    };
    // Every method is either the type's own or forwarded: write the impl.
    (@next $ty:ty, $f:ident, [$($acc:tt)*], own $own:tt, todo []) => {
        #[$crate::__macro_support::async_trait]
        impl $crate::TaskManager for $ty {
            $($acc)*
        }
    };
    (@next $ty:ty, $f:ident, $acc:tt, own [$($own:ident),*], todo [$method:tt $($todo:tt)*]) => {
        $crate::task_manager_from_field!(@scan $method, $ty, $f, $acc, own [$($own),*],
            scan [$($own),*], todo [$($todo)*]);
    };
    // The method is one of the type's own (macro_rules compares names only as literals).
    (@scan [get_task $($sig:tt)*], $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [get_task $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, $acc, own $own, todo $todo);
    };
    (@scan [list_tasks $($sig:tt)*], $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [list_tasks $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, $acc, own $own, todo $todo);
    };
    (@scan [save_task $($sig:tt)*], $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [save_task $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, $acc, own $own, todo $todo);
    };
    (@scan [add_task_event $($sig:tt)*], $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [add_task_event $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, $acc, own $own, todo $todo);
    };
    (@scan [save_task_with_events $($sig:tt)*], $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [save_task_with_events $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, $acc, own $own, todo $todo);
    };
    (@scan [get_task_events $($sig:tt)*], $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [get_task_events $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, $acc, own $own, todo $todo);
    };
    (@scan [tenants $($sig:tt)*], $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [tenants $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, $acc, own $own, todo $todo);
    };
    (@scan $method:tt, $ty:ty, $f:ident, $acc:tt, own $own:tt, scan [$other:ident $(, $s:ident)*], todo $todo:tt) => {
        $crate::task_manager_from_field!(@scan $method, $ty, $f, $acc, own $own, scan [$($s),*], todo $todo);
    };
    // Not the type's own: forward it to the field.
    (@scan [$name:ident ($($p:ident: $pt:ty),*) -> $ret:ty], $ty:ty, $f:ident, [$($acc:tt)*], own $own:tt, scan [], todo $todo:tt) => {
        $crate::task_manager_from_field!(@next $ty, $f, [$($acc)*
            async fn $name(&self $(, $p: $pt)*) -> $ret {
                use $crate::TaskManager as _;
                self.$f.$name($($p),*).await
            }
        ], own $own, todo $todo);
    };
}
