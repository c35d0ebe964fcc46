//! Copying the bytes of a `Uint8Array` out of the isolate.

use rquickjs::TypedArray;

/// Copies the bytes a `Uint8Array` views; `None` when its buffer is detached.
pub(crate) fn copy_bytes(array: &TypedArray<'_, u8>) -> Option<Vec<u8>> {
    let raw = array.as_raw()?;
    // SAFETY: `as_raw` returned the live backing store of the array. It is copied at once,
    // before any JavaScript can run (and so before anything could detach or resize it),
    // and the isolate's thread is the only one that touches it.
    Some(unsafe { raw.as_ref() }.to_vec())
}
