//! [`lock`]: the one way leasehold takes a std mutex.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, also when a panic elsewhere poisoned it. Every std mutex in leasehold guards a
/// map, a list or a slot that each critical section changes in one step (an insert, a remove, a
/// take, a swap) and never across a call that could panic halfway, so what a panicking holder
/// left is whole; and a bug that panics in one task must not take every other session's task
/// down with it, one poisoned lock after another.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
