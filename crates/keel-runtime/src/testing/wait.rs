//! Waiting for state that other tasks (or processes sharing a store) reach in their own time:
//! tests poll for it with a deadline instead of sleeping a fixed time.

use std::future::Future;
use std::time::Duration;

/// How long [`eventually`] waits before it fails: generous, so a loaded machine does not
/// fail a test that is only slow.
pub const WAIT_DEADLINE: Duration = Duration::from_secs(20);

/// What a check answers: `true` / `Some(value)` when the state is reached.
pub trait Reached {
    /// What [`eventually`] returns once the state is reached.
    type Value;
    /// The value, once reached.
    fn reached(self) -> Option<Self::Value>;
}

impl Reached for bool {
    type Value = ();
    fn reached(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Reached for Option<T> {
    type Value = T;
    fn reached(self) -> Option<T> {
        self
    }
}

/// Run `check` every few milliseconds until it answers `true` or `Some(value)`, and return
/// the value; panic naming `what` once [`WAIT_DEADLINE`] has passed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use keel_runtime::testing::eventually;
/// let mut polls = 0;
/// let found = eventually("the third poll", || {
///     polls += 1;
///     let done = polls == 3;
///     async move { done.then_some(polls) }
/// })
/// .await;
/// assert_eq!(found, 3);
/// # }
/// ```
pub async fn eventually<R, F, Fut>(what: &str, check: F) -> R::Value
where
    R: Reached,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    eventually_within(what, WAIT_DEADLINE, check).await
}

/// [`eventually`] with a deadline of its own, for a state whose known bound is longer than
/// [`WAIT_DEADLINE`] (a client's backed-off reconnection, a pool of slow tasks filling up).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use keel_runtime::testing::eventually_within;
/// let mut polls = 0;
/// eventually_within("the second poll", Duration::from_secs(60), || {
///     polls += 1;
///     let done = polls == 2;
///     async move { done }
/// })
/// .await;
/// # }
/// ```
pub async fn eventually_within<R, F, Fut>(what: &str, within: Duration, mut check: F) -> R::Value
where
    R: Reached,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await.reached() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
