//! The memory allocator's settings for a process running openflux's code:
//! the `openflux` command and the benchmark that measures its webhook in
//! process both declare mimalloc their global allocator and call
//! [`purge_freed_memory_at_once`] first, so what is measured allocates as
//! what ships.

// The options below are mimalloc's C functions: its crate brings the
// library they are linked from.
extern crate mimalloc;

/// mimalloc's option `purge_delay` (its number in `mi_option_t`, the same
/// in mimalloc 2 and 3).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

extern "C" {
    fn mi_option_set_default(option: std::ffi::c_int, value: std::ffi::c_long);
    #[cfg(test)]
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
}

/// Returns memory openflux freed to the system at once rather than a
/// second later (mimalloc 3's default). A restart with every object
/// present makes and drops the first lists, the owner index's entries and
/// a reconcile per source within a second or two; held for that second,
/// memory no longer used counted as resident, against the Pod's limit: a
/// restart with 10,000 sources peaked at 103 MiB instead of 78 MiB.
/// `MIMALLOC_PURGE_DELAY` in the environment still decides.
pub fn purge_freed_memory_at_once() {
    // SAFETY: sets one of mimalloc's options, which it reads atomically;
    // callable at any time, from any thread.
    unsafe { mi_option_set_default(MI_OPTION_PURGE_DELAY, 0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_purged_at_once() {
        // SAFETY: reads one of mimalloc's options.
        let default = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(
            default, 1000,
            "mimalloc 3 delays purges by 1000 ms: if not, the option's number no longer names purge_delay"
        );
        purge_freed_memory_at_once();
        // SAFETY: as above.
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, 0);
    }
}
