//! Tenant-scoped map keys for the in-memory stores: a tenant's two names and an id, kept
//! apart so that a lookup borrows all three. Keyed by a namespace string instead, every
//! read built one (an allocation, a format and a free), several times per engine step.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use crate::AuthContext;

/// An owned key: what a map stores.
#[derive(Debug, Clone)]
pub(crate) struct Scoped<K> {
    app: String,
    user: String,
    pub(crate) key: K,
}

impl<K> Scoped<K> {
    pub(crate) fn new(auth: &AuthContext, key: K) -> Self {
        Scoped {
            app: auth.app_name.clone(),
            user: auth.user_name.clone(),
            key,
        }
    }

    /// Whether the key belongs to `auth`'s tenant.
    pub(crate) fn is_of(&self, auth: &AuthContext) -> bool {
        self.app == auth.app_name && self.user == auth.user_name
    }

    /// The tenant the key belongs to.
    pub(crate) fn tenant(&self) -> AuthContext {
        AuthContext::new(self.app.clone(), self.user.clone())
    }
}

/// A key's parts, owned or borrowed: what maps hash and compare.
pub(crate) trait ScopedParts<K: ?Sized> {
    fn parts(&self) -> (&str, &str, &K);
}

impl<K: Borrow<Q>, Q: ?Sized> ScopedParts<Q> for Scoped<K> {
    fn parts(&self) -> (&str, &str, &Q) {
        (&self.app, &self.user, self.key.borrow())
    }
}

impl<K: ?Sized> ScopedParts<K> for (&str, &str, &K) {
    fn parts(&self) -> (&str, &str, &K) {
        (self.0, self.1, self.2)
    }
}

/// The borrowed key of `key` in `auth`'s tenant, for a lookup: `map.get(&scoped(a, k) as &dyn
/// ScopedParts<Q>)`, where the map's keys are `Scoped<K>` and `K` borrows as `Q` (`String`
/// as `str`).
pub(crate) fn scoped<'a, K: ?Sized>(
    auth: &'a AuthContext,
    key: &'a K,
) -> (&'a str, &'a str, &'a K) {
    (&auth.app_name, &auth.user_name, key)
}

impl<'a, K: Borrow<Q> + 'a, Q: ?Sized + 'a> Borrow<dyn ScopedParts<Q> + 'a> for Scoped<K> {
    fn borrow(&self) -> &(dyn ScopedParts<Q> + 'a) {
        self
    }
}

impl<K: Hash + ?Sized> Hash for dyn ScopedParts<K> + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl<K: PartialEq + ?Sized> PartialEq for dyn ScopedParts<K> + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl<K: Eq + ?Sized> Eq for dyn ScopedParts<K> + '_ {}

// The owned key hashes and compares as its borrowed form does, as `Borrow` requires (a key
// and its borrowed form hash alike, by `Borrow`'s own contract).
impl<K: Hash> Hash for Scoped<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.app.as_str(), self.user.as_str(), &self.key).hash(state);
    }
}

impl<K: PartialEq> PartialEq for Scoped<K> {
    fn eq(&self, other: &Self) -> bool {
        (&self.app, &self.user, &self.key) == (&other.app, &other.user, &other.key)
    }
}

impl<K: Eq> Eq for Scoped<K> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_borrowed_key_finds_what_its_owned_key_stored_and_tenants_stay_apart() {
        let (a, b) = (AuthContext::new("ab", "c"), AuthContext::new("a", "bc"));
        let mut map: HashMap<Scoped<String>, u32> = HashMap::new();
        map.insert(Scoped::new(&a, "k".to_owned()), 1);
        let found = map.get(&scoped(&a, "k") as &dyn ScopedParts<str>);
        assert_eq!(found, Some(&1));
        let other = map.get(&scoped(&b, "k") as &dyn ScopedParts<str>);
        assert_eq!(other, None);
        let key = map.keys().next().unwrap();
        assert!(key.is_of(&a) && !key.is_of(&b));
        assert_eq!(key.tenant(), a);
    }
}
