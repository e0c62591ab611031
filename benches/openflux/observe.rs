//! A watch that records when objects reach a state, as a client of the API
//! server sees it: the clock of every latency the cluster benchmarks report.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use openflux::locks;
use tokio::sync::oneshot;

/// Reads the watched value of an object (e.g. its revision).
pub type Extract = fn(&DynamicObject) -> Option<String>;

#[derive(Default)]
struct State {
    /// Last value seen per object name.
    values: HashMap<String, String>,
    /// When each object was first seen.
    first_seen: HashMap<String, Instant>,
    /// When each object was first seen with `Ready=True`.
    first_ready: HashMap<String, Instant>,
    /// Who waits for (name, value).
    waits: HashMap<(String, String), oneshot::Sender<Instant>>,
    /// The initial list is complete.
    synced: bool,
}

/// Watches one resource in one namespace for the lifetime of the value.
pub struct Observer {
    what: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Starts watching; `value` picks what [`Observer::expect`] compares.
    pub fn start(what: &str, api: Api<DynamicObject>, value: Extract) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let now = Instant::now();
                let Ok(event) = event else { continue };
                let mut s = locks::lock(&shared);
                match event {
                    watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                        let name = obj.name_any();
                        s.first_seen.entry(name.clone()).or_insert(now);
                        if is_ready(&obj) {
                            s.first_ready.entry(name.clone()).or_insert(now);
                        }
                        if let Some(v) = value(&obj) {
                            if let Some(tx) = s.waits.remove(&(name.clone(), v.clone())) {
                                let _ = tx.send(now);
                            }
                            s.values.insert(name, v);
                        }
                    }
                    watcher::Event::Delete(obj) => {
                        let name = obj.name_any();
                        s.values.remove(&name);
                    }
                    watcher::Event::InitDone => s.synced = true,
                    watcher::Event::Init => {}
                }
            }
        });
        Observer {
            what: what.to_string(),
            state,
            task,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        locks::lock(&self.state)
    }

    /// Waits (bounded) for the initial list.
    pub async fn synced(&self, timeout: Duration) -> anyhow::Result<()> {
        self.until(timeout, "the initial list", |s| s.synced).await
    }

    /// Registers interest in `name` reaching `value`; call before the write
    /// that causes it. Resolves with the time the watch delivered it.
    pub fn expect(&self, name: &str, value: &str) -> Expectation {
        let (tx, rx) = oneshot::channel();
        let mut s = self.lock();
        if s.values.get(name).map(String::as_str) == Some(value) {
            let _ = tx.send(Instant::now());
        } else {
            s.waits.insert((name.to_string(), value.to_string()), tx);
        }
        Expectation {
            what: format!("{} {name} at {value}", self.what),
            rx,
        }
    }

    /// Objects seen so far.
    pub fn count(&self) -> usize {
        self.lock().first_seen.len()
    }

    /// Objects seen with `Ready=True` so far.
    pub fn ready_count(&self) -> usize {
        self.lock().first_ready.len()
    }

    /// When the first of the objects seen so far was first seen.
    pub fn first_first_seen(&self) -> Option<Instant> {
        self.lock().first_seen.values().min().copied()
    }

    /// When the last of the objects seen so far was first seen.
    pub fn last_first_seen(&self) -> Option<Instant> {
        self.lock().first_seen.values().max().copied()
    }

    /// Polls (every 20 ms, bounded) until `done` holds for the state.
    async fn until(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&State) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.lock()) {
                return Ok(());
            }
            if self.task.is_finished() {
                bail!("the {} watch ended", self.what);
            }
            if Instant::now() >= deadline {
                bail!(
                    "timed out after {timeout:?} waiting for {what} of {}",
                    self.what
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (bounded) until `n` objects were seen, `check` is called on
    /// every poll to fail early (e.g. when the process under test died).
    pub async fn until_count(
        &self,
        n: usize,
        ready: bool,
        timeout: Duration,
        mut check: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let have = if ready {
                self.ready_count()
            } else {
                self.count()
            };
            if have >= n {
                return Ok(());
            }
            check()?;
            if Instant::now() >= deadline {
                let which = if ready { "Ready " } else { "" };
                bail!(
                    "timed out after {timeout:?}: {have} of {n} {which}{} seen",
                    self.what
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pending [`Observer::expect`].
pub struct Expectation {
    what: String,
    rx: oneshot::Receiver<Instant>,
}

impl Expectation {
    /// When the watch delivered the expected value (bounded wait).
    pub async fn wait(self, timeout: Duration) -> anyhow::Result<Instant> {
        match tokio::time::timeout(timeout, self.rx).await {
            Ok(Ok(at)) => Ok(at),
            Ok(Err(_)) => Err(anyhow!("the watch for {} ended", self.what)),
            Err(_) => Err(anyhow!(
                "timed out after {timeout:?} waiting for {}",
                self.what
            )),
        }
    }
}

/// `Ready=True` among the status conditions.
pub fn is_ready(obj: &DynamicObject) -> bool {
    obj.data
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// A string at a JSON pointer of the object.
pub fn string_at(obj: &DynamicObject, pointer: &str) -> Option<String> {
    obj.data
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .map(String::from)
}
