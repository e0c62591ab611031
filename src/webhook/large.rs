//! Large request bodies are parsed on one thread of their own, one at a
//! time, at a lower CPU priority than the runtime's workers (on Linux, nice
//! [`LARGE_PARSE_NICE`] for that thread alone): when the CPU is short, the
//! small reviews on the workers get it first, and the large ones take what
//! is left.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Bytes;
use tokio::sync::oneshot;

use super::review::{self, ReviewError};
use crate::rewrite::admission::AdmissionRequest;

/// How much nicer than the process the parsing thread runs (the workers
/// keep the process's own priority).
pub const LARGE_PARSE_NICE: i32 = 10;

type Job = (
    Bytes,
    oneshot::Sender<Result<AdmissionRequest, ReviewError>>,
);

/// The parsing thread, started on first use.
#[derive(Clone)]
pub struct LargeParser {
    jobs: Arc<Mutex<mpsc::Sender<Job>>>,
}

/// The parser has stopped (its thread could not start, or ended).
#[derive(Debug, thiserror::Error)]
#[error("the large-body parser is not running")]
pub struct ParserGone;

impl LargeParser {
    /// The process's one parsing thread.
    pub fn shared() -> Result<LargeParser, ParserGone> {
        static SHARED: OnceLock<Option<LargeParser>> = OnceLock::new();
        SHARED
            .get_or_init(|| LargeParser::start().ok())
            .clone()
            .ok_or(ParserGone)
    }

    fn start() -> std::io::Result<LargeParser> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("openflux-large-bodies".into())
            .spawn(move || {
                lower_priority();
                for (body, answer) in queue {
                    let _ = answer.send(review::parse(&body));
                }
            })?;
        Ok(LargeParser {
            jobs: Arc::new(Mutex::new(jobs)),
        })
    }

    /// Parses `body` on the parsing thread, after the bodies queued before.
    pub async fn parse(
        &self,
        body: impl Into<Bytes>,
    ) -> Result<Result<AdmissionRequest, ReviewError>, ParserGone> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((body.into(), tx))
            .map_err(|_| ParserGone)?;
        rx.await.map_err(|_| ParserGone)
    }
}

/// Lowers the calling thread's CPU priority (Linux: a thread is its own
/// scheduling entity, so `setpriority` on its id leaves the other threads
/// as they were).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions; setpriority only reads its
        // arguments and reports failure through its return value.
        let failed = unsafe {
            let tid = libc::gettid() as libc::id_t;
            let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
            libc::setpriority(libc::PRIO_PROCESS, tid, (nice + LARGE_PARSE_NICE).min(19)) != 0
        };
        if failed {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "cannot lower the priority of the large-body parser"
            );
        }
    }
}

/// The nice value of the calling thread (Linux; for tests).
#[cfg(all(test, target_os = "linux"))]
fn own_nice() -> i32 {
    // SAFETY: as above.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parses_on_a_thread_of_lower_priority() {
        let parser = LargeParser::shared().expect("the parser");
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","resource":{"group":"","version":"v1","resource":"pods"},"object":{"spec":{}}}}"#;
        let parsed = parser.parse(body.to_vec()).await.expect("parsed");
        assert!(parsed.is_ok(), "{parsed:?}");
        let garbage = parser.parse(b"{".to_vec()).await.expect("answered");
        assert!(garbage.is_err());
        #[cfg(target_os = "linux")]
        {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                lower_priority();
                let _ = tx.send(own_nice());
            });
            let nice = rx.recv().expect("the nice value");
            let own = own_nice();
            assert!(nice > own || own == 19, "nice {nice}, the test's {own}");
        }
    }
}
