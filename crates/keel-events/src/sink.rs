//! Where events go: the [`EventSink`] trait and the built-in sinks.
//!
//! A sink observes execution; it never authorizes it.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use keel_core::AgentResult;

use crate::RunEvent;

/// A consumer of run events: a renderer, a WebSocket fan-out, a durable log, a recorder.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Take one event. Events arrive in sequence order from an
    /// [`EventEmitter`](crate::EventEmitter).
    async fn emit(&self, event: &RunEvent) -> AgentResult<()>;
}

#[async_trait]
impl<S: EventSink + ?Sized> EventSink for Arc<S> {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        (**self).emit(event).await
    }
}

/// Keeps every event in memory: for tests, local apps and replay.
#[derive(Debug, Default)]
pub struct InMemoryEventSink {
    events: Mutex<Vec<RunEvent>>,
}

impl InMemoryEventSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events received, in arrival order.
    pub fn events(&self) -> Vec<RunEvent> {
        self.lock().clone()
    }

    /// How many events were received.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Forget the events received.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RunEvent>> {
        // A panic elsewhere while holding the lock leaves a Vec that is still valid.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl EventSink for InMemoryEventSink {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        self.lock().push(event.clone());
        Ok(())
    }
}

/// Broadcasts events to live subscribers (a UI stream, an SSE endpoint).
///
/// Emitting with no subscriber is not an error. A subscriber that falls more than
/// `capacity` events behind misses the oldest (it receives `async_broadcast::RecvError::Overflowed`); live views
/// are lossy by design — the durable log is the record.
#[derive(Debug, Clone)]
pub struct BroadcastEventSink {
    sender: async_broadcast::Sender<RunEvent>,
    /// Keeps the channel open while nobody subscribes, without buffering for anyone.
    _idle: async_broadcast::InactiveReceiver<RunEvent>,
}

impl Default for BroadcastEventSink {
    fn default() -> Self {
        Self::new(1024)
    }
}

impl BroadcastEventSink {
    /// A sink buffering up to `capacity` events per slow subscriber (at least 1).
    pub fn new(capacity: usize) -> Self {
        let (mut sender, receiver) = async_broadcast::broadcast(capacity.max(1));
        // A slow subscriber loses its oldest events (and is told how many) instead of
        // holding the run back.
        sender.set_overflow(true);
        Self {
            sender,
            _idle: receiver.deactivate(),
        }
    }

    /// A new subscriber, receiving events emitted from now on. A subscriber that falls more
    /// than the capacity behind receives `RecvError::Overflowed(n)` once, then the newest
    /// events.
    pub fn subscribe(&self) -> async_broadcast::Receiver<RunEvent> {
        self.sender.new_receiver()
    }

    /// How many subscribers are listening.
    pub fn subscriber_count(&self) -> usize {
        self.sender.receiver_count()
    }
}

#[async_trait]
impl EventSink for BroadcastEventSink {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        // Fails only when nobody listens, which is fine for a live view; a full channel
        // drops its oldest event (overflow mode) rather than waiting.
        let _ = self.sender.try_broadcast(event.clone());
        Ok(())
    }
}

/// Delivers each event to several sinks, in the order added.
///
/// Every sink gets every event even if an earlier one fails; the first error is returned.
#[derive(Clone, Default)]
pub struct MultiSink {
    sinks: Vec<Arc<dyn EventSink>>,
}

impl std::fmt::Debug for MultiSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiSink")
            .field("sinks", &self.sinks.len())
            .finish()
    }
}

impl MultiSink {
    /// No sinks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a sink.
    #[must_use]
    pub fn with(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Add a sink in place.
    pub fn push(&mut self, sink: Arc<dyn EventSink>) {
        self.sinks.push(sink);
    }

    /// How many sinks.
    pub fn len(&self) -> usize {
        self.sinks.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }
}

#[async_trait]
impl EventSink for MultiSink {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        let mut first_error = None;
        for sink in &self.sinks {
            if let Err(e) = sink.emit(event).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
