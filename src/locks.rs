//! The one way openflux takes a lock.
//!
//! A lock is poisoned when a thread panicked while holding it. Every critical
//! section in openflux is a short update of plain data (the owner index, the
//! write memo, the metrics registry, the served certificate) that either
//! completes or panics before it changes anything, so the data stays usable:
//! these helpers take the lock whatever its poison flag says. One panic must
//! not turn every later webhook request or reconcile into an error.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Shared access to the data behind `lock`.
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Exclusive access to the data behind `lock`.
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// Exclusive access to the data behind `mutex`.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn poisoned_locks_still_give_their_data() {
        let rw = Arc::new(RwLock::new(1));
        let mutex = Arc::new(Mutex::new(1));
        let (rw2, mutex2) = (rw.clone(), mutex.clone());
        let panicked = std::thread::spawn(move || {
            let _r = rw2.write().unwrap();
            let _m = mutex2.lock().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(panicked.is_err());
        assert!(rw.is_poisoned() && mutex.is_poisoned());
        *write(&rw) += 1;
        *lock(&mutex) += 1;
        assert_eq!((*read(&rw), *lock(&mutex)), (2, 2));
    }
}
