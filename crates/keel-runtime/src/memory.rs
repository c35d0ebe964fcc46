//! Tenant-namespaced key-value memory for skills: caches, state, knowledge.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;

use crate::scoped::{scoped, Scoped, ScopedParts};
use keel_core::{AgentError, AgentResult};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::AuthContext;

/// JSON values by key, namespaced by tenant, optionally expiring.
#[async_trait]
pub trait MemoryService: keel_core::MaybeSend + keel_core::MaybeSync {
    /// Carry out one write (see [`MemoryWrite`]): the one write every backend implements, in
    /// one atomic step. Answers whether the value was stored: always, unless `if_absent`
    /// found a live value.
    async fn write_value(&self, auth: &AuthContext, write: MemoryWrite<'_>) -> AgentResult<bool>;
    /// Store `value` under `key` for this tenant, replacing what was there.
    async fn save_serialized(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
    ) -> AgentResult<()> {
        let write = MemoryWrite::new(key, value, None);
        self.write_value(auth, write).await.map(drop)
    }
    /// Like [`MemoryService::save_serialized`], but the value expires after `ttl`.
    async fn save_serialized_with_ttl(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<()> {
        let write = MemoryWrite::new(key, value, Some(ttl));
        self.write_value(auth, write).await.map(drop)
    }
    /// The value under `key` for this tenant, if any and not expired.
    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>>;
    /// Remove `key`; answers whether it existed.
    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool>;

    /// Store `value` under `key`, expiring after `ttl`, only if the key holds no live value;
    /// answers whether it was stored. This is a claim: of several callers (in any process
    /// on the store) racing for one key, exactly one gets `true` until the value expires or
    /// is deleted.
    async fn save_if_absent(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<bool> {
        let write = MemoryWrite {
            if_absent: true,
            ..MemoryWrite::new(key, value, Some(ttl))
        };
        self.write_value(auth, write).await
    }
}

/// When a value written at `now` with `ttl` expires, both in nanoseconds since the epoch (the
/// unit of the SQL backends' columns): `None` without a TTL or with one too long to
/// represent, which never expires, as in the in-memory store.
pub fn memory_expiry_nanos(now: i64, ttl: Option<Duration>) -> Option<i64> {
    ttl.and_then(|ttl| i64::try_from(ttl.as_nanos()).ok())
        .and_then(|ttl| now.checked_add(ttl))
}

/// One write of a [`MemoryService`] value, as a backend carries it out.
#[derive(Debug, Clone)]
pub struct MemoryWrite<'a> {
    /// The key, in the caller's tenant.
    pub key: &'a str,
    /// The value.
    pub value: Value,
    /// When given, the value expires this long after the write.
    pub ttl: Option<Duration>,
    /// Store only when the key holds no live value (a claim); otherwise replace what is there.
    pub if_absent: bool,
}

impl<'a> MemoryWrite<'a> {
    /// A write that replaces what `key` holds.
    pub fn new(key: &'a str, value: Value, ttl: Option<Duration>) -> Self {
        Self {
            key,
            value,
            ttl,
            if_absent: false,
        }
    }
}

/// Typed access to a [`MemoryService`]: values go in and come out as serde types, so a skill
/// keeps its state as a struct instead of handling JSON by hand. Implemented for every
/// memory service, boxed or not.
///
/// A value that cannot be encoded is [`AgentError::InvalidInput`] naming the key; a stored
/// value that does not decode as `T` (written by other code, or by an older version of the
/// type) is [`AgentError::Storage`] naming the key, never a panic.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_core::AgentError> {
/// use keel_runtime::{AuthContext, InMemoryMemoryService, MemoryServiceExt};
/// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
/// struct Visits { count: u32 }
/// let memory = InMemoryMemoryService::new();
/// let auth = AuthContext::new("app", "alice");
/// memory.save(&auth, "visits", &Visits { count: 3 }).await?;
/// assert_eq!(memory.load::<Visits>(&auth, "visits").await?, Some(Visits { count: 3 }));
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait MemoryServiceExt: MemoryService {
    /// Store `value` under `key`, replacing what was there.
    async fn save<T: Serialize + Sync + ?Sized>(
        &self,
        auth: &AuthContext,
        key: &str,
        value: &T,
    ) -> AgentResult<()> {
        let value = encode(key, value)?;
        self.save_serialized(auth, key, value).await
    }

    /// Like [`save`](Self::save), but the value expires after `ttl`.
    async fn save_with_ttl<T: Serialize + Sync + ?Sized>(
        &self,
        auth: &AuthContext,
        key: &str,
        value: &T,
        ttl: Duration,
    ) -> AgentResult<()> {
        let value = encode(key, value)?;
        self.save_serialized_with_ttl(auth, key, value, ttl).await
    }

    /// The value under `key` as a `T`, if any and not expired.
    async fn load<T: DeserializeOwned>(
        &self,
        auth: &AuthContext,
        key: &str,
    ) -> AgentResult<Option<T>> {
        match self.load_serialized(auth, key).await? {
            None => Ok(None),
            Some(value) => serde_json::from_value(value).map(Some).map_err(|e| {
                AgentError::storage(format_args!(
                    "memory value `{key}` is not a {}: {e}",
                    std::any::type_name::<T>()
                ))
            }),
        }
    }
}

impl<M: MemoryService + ?Sized> MemoryServiceExt for M {}

fn encode<T: Serialize + ?Sized>(key: &str, value: &T) -> AgentResult<Value> {
    serde_json::to_value(value).map_err(|e| {
        AgentError::invalid_input(
            format!("memory value `{key}`"),
            format!("cannot be stored as JSON: {e}"),
        )
    })
}

/// A [`MemoryService`] over a concurrent hash map.
///
/// It keeps at most [`Self::DEFAULT_MAX_EXPIRING`] (or the configured number of) values
/// with a TTL, give or take one sweep's writes: past it, the values that would expire soonest
/// go first (decision 279). A value without a TTL is never dropped.
#[derive(Debug)]
pub struct InMemoryMemoryService {
    values: DashMap<Scoped<String>, (Value, Option<Instant>), foldhash::fast::RandomState>,
    /// Expiring writes since the last sweep.
    expiring_writes: AtomicU64,
    /// The most values with a TTL kept after a sweep.
    max_expiring: usize,
}

/// Every this many expiring writes, expired values are swept, so keys written once with a
/// TTL and never read again (claims, cursors) do not pile up.
const SWEEP_EVERY: u64 = 1024;

impl Default for InMemoryMemoryService {
    fn default() -> Self {
        Self {
            values: DashMap::default(),
            expiring_writes: AtomicU64::new(0),
            max_expiring: Self::DEFAULT_MAX_EXPIRING,
        }
    }
}

impl InMemoryMemoryService {
    /// How many values with a TTL the store keeps by default: ten times what the in-memory
    /// task store retains ([`InMemoryTaskManager::DEFAULT_FINISHED_CAP`]), since every
    /// `SendMessage` claims its message id for a day (so a server under load would otherwise
    /// grow by a claim a request for that day), and a claim outliving its task answers
    /// nothing anyway.
    ///
    /// [`InMemoryTaskManager::DEFAULT_FINISHED_CAP`]: crate::InMemoryTaskManager::DEFAULT_FINISHED_CAP
    pub const DEFAULT_MAX_EXPIRING: usize = 100_000;

    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep at most `max` values with a TTL (at least one sweep's worth), dropping those that
    /// expire soonest beyond it.
    pub fn with_max_expiring(mut self, max: usize) -> Self {
        self.max_expiring = max.max(1);
        self
    }

    /// Count an expiring write; every [`SWEEP_EVERY`]th drops the expired values, and the
    /// soonest to expire of those beyond the cap (amortized O(1) per write).
    fn after_expiring_write(&self) {
        if self.expiring_writes.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            let now = Instant::now();
            // Past the cap, everything expiring no later than the cap's oldest goes too. A
            // store holding no more values than the cap cannot be past it: no times are read.
            let mut cutoff = now;
            if self.values.len() > self.max_expiring {
                let mut expiring: Vec<Instant> = self
                    .values
                    .iter()
                    .filter_map(|entry| entry.1.filter(|e| *e > now))
                    .collect();
                if let Some(over) = expiring.len().checked_sub(self.max_expiring + 1) {
                    cutoff = *expiring.select_nth_unstable(over).1;
                }
            }
            self.values
                .retain(|_, (_, expires)| expires.is_none_or(|e| e > cutoff));
        }
    }

    /// How many values the store holds, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the store holds no value at all.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

#[async_trait]
impl MemoryService for InMemoryMemoryService {
    async fn write_value(&self, auth: &AuthContext, write: MemoryWrite<'_>) -> AgentResult<bool> {
        let now = Instant::now();
        let entry = (write.value, write.ttl.and_then(|ttl| now.checked_add(ttl)));
        // The entry's shard lock makes the check and the write one step.
        let stored = match self.values.entry(Scoped::new(auth, write.key.to_owned())) {
            dashmap::Entry::Occupied(mut held) => {
                let free = !write.if_absent || held.get().1.is_some_and(|e| e <= now);
                if free {
                    held.insert(entry);
                }
                free
            }
            dashmap::Entry::Vacant(free) => {
                free.insert(entry);
                true
            }
        };
        // Outside the entry's lock: the sweep takes every shard's.
        if stored && write.ttl.is_some() {
            self.after_expiring_write();
        }
        Ok(stored)
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        let parts = scoped(auth, key);
        // A read of a cancel flag at every checkpoint of a run: nothing is allocated for it.
        let key: &dyn ScopedParts<str> = &parts;
        let now = Instant::now();
        let expired = |expires: &Option<Instant>| expires.is_some_and(|e| e <= now);
        // A read takes the shard's read lock only; the write lock is for removing an expired
        // entry (removed on read, so a TTL frees memory without a sweeper).
        match self.values.get(key) {
            Some(entry) if !expired(&entry.1) => return Ok(Some(entry.0.clone())),
            Some(_) => {}
            None => return Ok(None),
        }
        self.values
            .remove_if(key, |_, (_, expires)| expired(expires));
        Ok(self
            .values
            .get(key)
            .filter(|entry| !expired(&entry.1))
            .map(|entry| entry.0.clone()))
    }

    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        let now = Instant::now();
        Ok(self
            .values
            .remove(&scoped(auth, key) as &dyn ScopedParts<str>)
            .is_some_and(|(_, (_, expires))| expires.is_none_or(|e| e > now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Profile {
        name: String,
        visits: u32,
    }

    #[tokio::test]
    async fn typed_values_round_trip_through_the_ext_trait() {
        let store: std::sync::Arc<dyn MemoryService> =
            std::sync::Arc::new(InMemoryMemoryService::new());
        let auth = AuthContext::new("app", "alice");
        let profile = Profile {
            name: "Ada".into(),
            visits: 2,
        };
        store.save(&auth, "profile", &profile).await.unwrap();
        assert_eq!(
            store.load::<Profile>(&auth, "profile").await.unwrap(),
            Some(profile)
        );
        assert_eq!(store.load::<Profile>(&auth, "missing").await.unwrap(), None);
        // The typed form is the plain JSON form: untyped readers see the same value.
        assert_eq!(
            store.load_serialized(&auth, "profile").await.unwrap(),
            Some(json!({"name": "Ada", "visits": 2}))
        );
    }

    #[tokio::test]
    async fn a_stored_value_of_another_shape_is_a_storage_error_naming_the_key() {
        let store = InMemoryMemoryService::new();
        let auth = AuthContext::new("app", "alice");
        store
            .save(&auth, "profile", &json!(["not", "a", "profile"]))
            .await
            .unwrap();
        let err = store.load::<Profile>(&auth, "profile").await.unwrap_err();
        assert!(matches!(err, AgentError::Storage { .. }), "{err:?}");
        assert!(err.to_string().contains("`profile`"), "{err}");
    }

    #[tokio::test]
    async fn a_value_json_cannot_hold_is_invalid_input() {
        let store = InMemoryMemoryService::new();
        let auth = AuthContext::new("app", "alice");
        // JSON object keys must be strings.
        let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let err = store.save(&auth, "pairs", &map).await.unwrap_err();
        assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
        assert_eq!(store.load_serialized(&auth, "pairs").await.unwrap(), None);
    }

    #[tokio::test]
    async fn tenants_whose_names_run_together_see_only_their_own_values() {
        let store = InMemoryMemoryService::new();
        let (a, b) = (AuthContext::new("ab", "c"), AuthContext::new("a", "bc"));
        store.save_serialized(&a, "k", json!("a's")).await.unwrap();
        assert_eq!(store.load_serialized(&b, "k").await.unwrap(), None);
        assert!(!store.delete(&b, "k").await.unwrap());
        assert_eq!(
            store.load_serialized(&a, "k").await.unwrap(),
            Some(json!("a's"))
        );
        assert!(store.delete(&a, "k").await.unwrap());
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn expired_values_never_read_again_are_swept() {
        let store = InMemoryMemoryService::new();
        let auth = AuthContext::new("app", "alice");
        store
            .save_serialized(&auth, "kept", json!(1))
            .await
            .unwrap();
        for i in 0..SWEEP_EVERY {
            let claimed = store
                .save_if_absent(&auth, &format!("claim:{i}"), json!(true), Duration::ZERO)
                .await
                .unwrap();
            assert!(claimed);
        }
        // Every claim expired at once; the sweep left only the value without a TTL.
        assert_eq!(store.len(), 1);
        assert_eq!(
            store.load_serialized(&auth, "kept").await.unwrap(),
            Some(json!(1))
        );
    }

    #[tokio::test]
    async fn past_the_cap_the_values_expiring_soonest_go_and_lasting_ones_stay() {
        let cap = 100;
        let store = InMemoryMemoryService::new().with_max_expiring(cap);
        let auth = AuthContext::new("app", "alice");
        store
            .save_serialized(&auth, "kept", json!(1))
            .await
            .unwrap();
        // Later writes expire later: the first ones written are the soonest to expire.
        let writes = SWEEP_EVERY as usize;
        for i in 0..writes {
            let ttl = Duration::from_secs(3600 + i as u64);
            store
                .save_serialized_with_ttl(&auth, &format!("claim:{i}"), json!(i), ttl)
                .await
                .unwrap();
        }
        assert_eq!(
            store.len(),
            cap + 1,
            "the cap's worth of claims and the lasting value"
        );
        for (key, kept) in [("kept", true), ("claim:0", false), ("claim:1023", true)] {
            let value = store.load_serialized(&auth, key).await.unwrap();
            assert_eq!(value.is_some(), kept, "{key}");
        }
        assert_eq!(
            store
                .load_serialized(&auth, &format!("claim:{}", writes - cap))
                .await
                .unwrap(),
            Some(json!(writes - cap)),
            "the newest `cap` claims stay"
        );
        assert_eq!(
            store
                .load_serialized(&auth, &format!("claim:{}", writes - cap - 1))
                .await
                .unwrap(),
            None,
            "the one before them went"
        );
    }

    /// The claim rules every backend shares (once, per tenant, again after delete) are
    /// `testing::memory_save_if_absent_claims_once`; an expired claim frees the key.
    #[tokio::test]
    async fn an_expired_claim_frees_the_key() {
        let store = InMemoryMemoryService::new();
        let alice = AuthContext::new("app", "alice");
        assert!(store
            .save_if_absent(&alice, "c", json!(4), Duration::ZERO)
            .await
            .unwrap());
        assert!(store
            .save_if_absent(&alice, "c", json!(5), Duration::from_secs(60))
            .await
            .unwrap());
        assert_eq!(
            store.load_serialized(&alice, "c").await.unwrap(),
            Some(json!(5))
        );
    }
}
