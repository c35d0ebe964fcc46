//! `MaybeSend` and `MaybeSync`: `Send`/`Sync` on native targets, nothing on `wasm32`, where
//! there are no threads to send to. Service traits name these instead of `Send + Sync` so
//! that one definition serves both (seed 002); on native they are exactly `Send`/`Sync`.
//! Keel's wasm build is not tested (decision 128).

/// `Send` on native targets; every type on `wasm32`.
///
/// ```
/// fn spawnable<T: keel_core::MaybeSend + 'static>(_: T) {}
/// spawnable(String::from("a value"));
/// ```
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + ?Sized> MaybeSend for T {}

/// `Sync` on native targets; every type on `wasm32`.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSync: Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Sync + ?Sized> MaybeSync for T {}

/// `Send` on native targets; every type on `wasm32`.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSend for T {}

/// `Sync` on native targets; every type on `wasm32`.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSync {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSync for T {}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + ?Sized>() {}

    trait Service: MaybeSend + MaybeSync {}

    #[test]
    fn on_native_targets_a_maybe_send_sync_object_is_send_and_sync() {
        // A trait object bounded by the markers can cross threads (behind `Arc`), as the
        // runtime's services must.
        assert_send_sync::<dyn Service>();
    }
}
