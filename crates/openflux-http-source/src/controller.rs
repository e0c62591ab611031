//! The HttpSource controller: fetch on the interval, build and store the
//! artifact, publish it as an openflux `Artifact`, report in the status.
//!
//! The Artifact is the whole contract with openflux: it is written by
//! server-side apply (field manager `openflux-http-source`) in the
//! HttpSource's namespace, under the HttpSource's name, with a controller
//! ownerReference to the HttpSource. Nothing else of openflux is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use openflux_api::duration;
use openflux_api::producer::archive::{ArchiveError, IgnoreRules};
use openflux_api::producer::digest::{Algorithm, Digest};
use openflux_api::producer::storage::{Retention, Storage};
use openflux_api::producer::{PublishError, Publisher};
use openflux_api::{Artifact, ArtifactSpec};
use tracing::{debug, info, instrument, warn};

use crate::api::{
    reason, ArtifactSummary, HttpSource, HttpSourceSpec, HttpSourceStatus, API_VERSION, KIND,
    REQUESTED_AT_ANNOTATION,
};
use crate::archive;
use crate::fetch::{self, Auth, FetchError, Fetched, Remembered};
use crate::metrics::{self, Health, Metrics};
use crate::schedule::{self, Attempt, Triggers};
use crate::status::{self, Outcome};

/// Field manager of every write this controller makes.
pub const FIELD_MANAGER: &str = "openflux-http-source";

/// Requeue delay after an error talking to the API server.
const API_ERROR_REQUEUE: Duration = Duration::from_secs(5);

/// Errors that end a reconcile early (the API server or storage failed).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("HttpSource has no namespace or uid")]
    Incomplete,
}

/// Everything a reconcile needs.
pub struct Context {
    pub client: Client,
    pub http: reqwest::Client,
    pub storage: Storage,
    /// Writes the Artifacts.
    pub publisher: Publisher,
    /// Who publishes Events. A Recorder is made per Event: a shared one would
    /// fold Events of the same reason into one series and keep the first
    /// note ("stored artifact with revision A" for revision B); Events are
    /// only emitted on changes, so there is nothing to fold.
    pub reporter: Reporter,
    pub metrics: Arc<Metrics>,
    /// Largest artifact accepted, in decompressed bytes.
    pub max_size: u64,
    pub retention: Retention,
    /// Per source: the last fetch attempt and the validators of the response
    /// the published artifact was built from.
    memory: Mutex<HashMap<ObjectRef<HttpSource>, Memory>>,
}

#[derive(Debug, Clone)]
struct Memory {
    uid: Option<String>,
    generation: Option<i64>,
    attempt: Attempt,
    remembered: Option<Remembered>,
}

impl Context {
    pub fn new(
        client: Client,
        http: reqwest::Client,
        storage: Storage,
        reporter: Reporter,
        metrics: Arc<Metrics>,
        max_size: u64,
        retention: Retention,
    ) -> Self {
        Context {
            publisher: Publisher::new(client.clone(), FIELD_MANAGER),
            client,
            http,
            storage,
            reporter,
            metrics,
            max_size,
            retention,
            memory: Mutex::default(),
        }
    }

    fn memory_of(&self, key: &ObjectRef<HttpSource>, uid: Option<&String>) -> Option<Memory> {
        let memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.get(key).filter(|m| m.uid.as_ref() == uid).cloned()
    }

    fn remember(&self, key: ObjectRef<HttpSource>, value: Memory) {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.insert(key, value);
    }

    fn forget_missing(&self, store: &Store<HttpSource>) {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.retain(|key, _| store.get(key).is_some());
    }
}

/// A spec made usable.
#[derive(Debug, Clone)]
pub struct Plan {
    pub url: reqwest::Url,
    pub interval: Duration,
    pub timeout: Duration,
    pub ignore: IgnoreRules,
    /// The expected digest of the artifact.
    pub digest: Option<Digest>,
}

/// Validates a spec. The CRD schema checks most of it; this also covers
/// objects written while the schema was older.
pub fn plan(spec: &HttpSourceSpec) -> Result<Plan, String> {
    let url = reqwest::Url::parse(&spec.url).map_err(|e| format!("invalid url: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("unsupported url scheme {:?}", url.scheme()));
    }
    let interval = duration::parse(&spec.interval).map_err(|e| format!("interval: {e}"))?;
    if interval.is_zero() {
        return Err("interval must be greater than zero".into());
    }
    let timeout = duration::parse(&spec.timeout).map_err(|e| format!("timeout: {e}"))?;
    if timeout.is_zero() {
        return Err("timeout must be greater than zero".into());
    }
    let digest = match &spec.digest {
        Some(d) => match d.parse::<Digest>() {
            Ok(digest) if digest.algorithm() == Algorithm::Sha256 => Some(digest),
            _ => return Err(format!("digest {d:?} is not sha256:<64 lowercase hex>")),
        },
        None => None,
    };
    let ignore = IgnoreRules::parse(spec.ignore.as_deref())?;
    Ok(Plan {
        url,
        interval,
        timeout,
        ignore,
        digest,
    })
}

/// When to try again after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Soon, with backoff: the cause is likely transient.
    Backoff,
    /// On the interval: the remote content is the problem.
    Interval,
    /// Not until the spec changes.
    Never,
}

#[derive(Debug, Clone)]
struct Failure {
    reason: &'static str,
    message: String,
    retry: Retry,
}

impl Failure {
    fn new(reason: &'static str, message: impl Into<String>, retry: Retry) -> Self {
        Failure {
            reason,
            message: message.into(),
            retry,
        }
    }
}

fn archive_failure(e: ArchiveError) -> Failure {
    match e {
        ArchiveError::Invalid(m) => Failure::new(reason::INVALID_ARTIFACT, m, Retry::Interval),
        ArchiveError::Rejected(m) => Failure::new(reason::ARCHIVE_REJECTED, m, Retry::Interval),
        ArchiveError::Unreadable(m) => Failure::new(reason::INVALID_ARTIFACT, m, Retry::Interval),
    }
}

/// The Artifact spec an HttpSource publishes (under its own name, owned by
/// it: see `openflux_api::producer::publish`).
pub fn artifact_spec(summary: &ArtifactSummary) -> ArtifactSpec {
    ArtifactSpec {
        url: summary.url.clone(),
        revision: summary.revision.clone(),
        digest: Some(summary.digest.clone()),
        path: Some(summary.path.clone()),
        size: Some(summary.size),
        last_update_time: Some(summary.last_update_time.clone()),
        metadata: None,
    }
}

/// Hash of what should trigger a reconcile: a new generation or a new
/// `reconcile.fluxcd.io/requestedAt` value (status updates do not).
fn reconcile_trigger(hs: &HttpSource) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hs.metadata.generation.hash(&mut h);
    hs.annotations().get(REQUESTED_AT_ANNOTATION).hash(&mut h);
    Some(h.finish())
}

#[instrument(skip_all, fields(namespace = hs.namespace().unwrap_or_default(), name = hs.name_any()))]
pub async fn reconcile(hs: Arc<HttpSource>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_source(&hs, &ctx).await;
    let label = match &result {
        Ok((_, true)) => metrics::SUCCESS,
        _ => metrics::FAILURE,
    };
    ctx.metrics
        .reconciled(label, started.elapsed().as_secs_f64());
    result.map(|(action, _)| action)
}

pub fn error_policy(hs: Arc<HttpSource>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(
        namespace = hs.namespace().unwrap_or_default(),
        name = hs.name_any(),
        %error,
        "reconcile failed"
    );
    Action::requeue(API_ERROR_REQUEUE)
}

/// One reconcile; the flag tells whether the source is Ready afterwards.
async fn reconcile_source(hs: &HttpSource, ctx: &Context) -> Result<(Action, bool), Error> {
    let ns = hs.namespace().ok_or(Error::Incomplete)?;
    if hs.metadata.deletion_timestamp.is_some() {
        return Ok((Action::await_change(), true));
    }
    if hs.spec.suspend {
        debug!("suspended: not fetching");
        return Ok((Action::await_change(), true));
    }
    let status = hs.status.as_ref();
    let requested_at = hs.annotations().get(REQUESTED_AT_ANNOTATION).cloned();

    let plan = match plan(&hs.spec) {
        Ok(plan) => plan,
        Err(message) => {
            let failure = Failure::new(reason::INVALID_SPEC, message, Retry::Never);
            write_outcome(hs, ctx, requested_at.as_deref(), &Err(failure)).await?;
            return Ok((Action::await_change(), false));
        }
    };

    let key = ObjectRef::from_obj(hs);
    let memory = ctx.memory_of(&key, hs.metadata.uid.as_ref());
    let published = status.and_then(|s| s.artifact.as_ref());
    let stored = match published {
        Some(a) => ctx.storage.exists(&a.path).await,
        None => true,
    };

    let auth = match read_auth(hs, ctx, &ns).await {
        Ok(auth) => auth,
        Err(failure) => {
            let failures = memory.as_ref().map_or(0, |m| m.attempt.failures) + 1;
            ctx.remember(
                key,
                Memory {
                    uid: hs.metadata.uid.clone(),
                    generation: hs.metadata.generation,
                    attempt: Attempt {
                        at: Instant::now(),
                        fingerprint: String::new(),
                        failures,
                    },
                    remembered: memory.and_then(|m| m.remembered),
                },
            );
            write_outcome(hs, ctx, requested_at.as_deref(), &Err(failure)).await?;
            return Ok((
                Action::requeue(schedule::retry_delay(failures, plan.interval)),
                false,
            ));
        }
    };
    let fingerprint = fetch::fingerprint(
        &hs.spec.url,
        &auth,
        hs.spec.ignore.as_deref(),
        hs.spec.digest.as_deref(),
    );

    let triggers = Triggers {
        requested: requested_at.is_some()
            && requested_at.as_ref() != status.and_then(|s| s.last_handled_reconcile_at.as_ref()),
        new_generation: memory.as_ref().map(|m| m.generation) != Some(hs.metadata.generation),
        stored,
    };
    let last = memory.as_ref().map(|m| &m.attempt);
    if let Some(wait) =
        schedule::next_fetch(last, Instant::now(), plan.interval, &fingerprint, triggers)
    {
        // Not due: keep the Artifact as published (a no-op when unchanged;
        // restores it when it was deleted or edited).
        if let Some(summary) = published {
            apply_artifact(hs, ctx, summary).await?;
        }
        let ready = hs
            .condition(crate::api::condition::READY)
            .is_some_and(|c| c.status == "True");
        return Ok((Action::requeue(wait), ready));
    }

    let remembered = memory.as_ref().and_then(|m| m.remembered.clone());
    let fetched = fetch_and_store(
        hs,
        ctx,
        &ns,
        &plan,
        &auth,
        &fingerprint,
        remembered.as_ref(),
        published.filter(|_| stored),
    )
    .await;
    let result = match fetched {
        Ok((summary, new_remembered)) => match apply_artifact(hs, ctx, &summary).await {
            Ok(_) => Ok((summary, new_remembered)),
            Err(e) => Err(Failure::new(
                reason::ARTIFACT_WRITE_FAILED,
                format!("cannot write Artifact: {e}"),
                Retry::Backoff,
            )),
        },
        Err(failure) => Err(failure),
    };

    let previous_failures = memory.as_ref().map_or(0, |m| m.attempt.failures);
    let failures = if result.is_ok() {
        0
    } else {
        previous_failures + 1
    };
    let remembered = match &result {
        Ok((_, Some(new))) => Some(new.clone()),
        Ok((_, None)) => remembered,
        Err(_) => remembered,
    };
    ctx.remember(
        key,
        Memory {
            uid: hs.metadata.uid.clone(),
            generation: hs.metadata.generation,
            attempt: Attempt {
                at: Instant::now(),
                fingerprint,
                failures,
            },
            remembered,
        },
    );

    let outcome = result.map(|(summary, _)| summary);
    write_outcome(hs, ctx, requested_at.as_deref(), &outcome).await?;
    match outcome {
        Ok(summary) => {
            if published.map(|p| &p.digest) != Some(&summary.digest) {
                let (name, current) = (hs.name_any(), summary.path.as_str());
                match ctx
                    .storage
                    .collect_garbage(&ns, &name, Some(current), ctx.retention)
                    .await
                {
                    Ok(n) if n > 0 => debug!(removed = n, "collected old artifacts"),
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "cannot collect old artifacts"),
                }
            }
            Ok((Action::requeue(plan.interval), true))
        }
        Err(failure) => {
            let action = match failure.retry {
                Retry::Backoff => Action::requeue(schedule::retry_delay(failures, plan.interval)),
                Retry::Interval => Action::requeue(plan.interval),
                Retry::Never => Action::await_change(),
            };
            Ok((action, false))
        }
    }
}

async fn read_auth(hs: &HttpSource, ctx: &Context, ns: &str) -> Result<Auth, Failure> {
    let Some(secret_ref) = &hs.spec.secret_ref else {
        return Ok(Auth::default());
    };
    let fail = |m: String| Failure::new(reason::AUTHENTICATION_FAILED, m, Retry::Backoff);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = secrets
        .get_opt(&secret_ref.name)
        .await
        .map_err(|e| fail(format!("cannot read secret '{}': {e}", secret_ref.name)))?
        .ok_or_else(|| fail(format!("secret '{}' not found", secret_ref.name)))?;
    let data = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    fetch::auth_from_secret(&data).map_err(|m| fail(format!("secret '{}': {m}", secret_ref.name)))
}

/// Fetches, builds, verifies and stores. Returns the artifact to publish and,
/// after a full download, the validators to remember.
#[allow(clippy::too_many_arguments)]
async fn fetch_and_store(
    hs: &HttpSource,
    ctx: &Context,
    ns: &str,
    plan: &Plan,
    auth: &Auth,
    fingerprint: &str,
    remembered: Option<&Remembered>,
    published: Option<&ArtifactSummary>,
) -> Result<(ArtifactSummary, Option<Remembered>), Failure> {
    let conditional = fetch::conditional_headers(
        remembered,
        fingerprint,
        published.map(|a| a.digest.as_str()),
        published.is_some(),
    );
    let url = plan.url.as_str();
    let fetched = fetch::fetch(
        &ctx.http,
        url,
        auth,
        &conditional,
        plan.timeout,
        ctx.max_size,
    )
    .await;
    let (bytes, validators) = match fetched {
        Ok(Fetched::NotModified) => {
            ctx.metrics.fetch(metrics::NOT_MODIFIED);
            let Some(published) = published else {
                return Err(Failure::new(
                    reason::FETCH_FAILED,
                    "unexpected 304 Not Modified",
                    Retry::Backoff,
                ));
            };
            debug!(revision = %published.revision, "not modified");
            let summary = ArtifactSummary {
                url: ctx.storage.url(&published.path),
                ..published.clone()
            };
            return Ok((summary, None));
        }
        Ok(Fetched::Body { bytes, validators }) => {
            ctx.metrics.fetch(metrics::DOWNLOADED);
            ctx.metrics.downloaded_bytes.inc_by(bytes.len() as u64);
            (bytes, validators)
        }
        Err(FetchError::TooLarge(limit)) => {
            ctx.metrics.fetch(metrics::FAILED);
            return Err(Failure::new(
                reason::ARCHIVE_REJECTED,
                format!("download exceeds the maximum size of {limit} bytes"),
                Retry::Interval,
            ));
        }
        Err(FetchError::Failed(message)) => {
            ctx.metrics.fetch(metrics::FAILED);
            return Err(Failure::new(reason::FETCH_FAILED, message, Retry::Backoff));
        }
    };

    let url_path = plan.url.path().to_string();
    let ignore = plan.ignore.clone();
    let max_size = ctx.max_size;
    let packed =
        tokio::task::spawn_blocking(move || archive::build(&bytes, &url_path, &ignore, max_size))
            .await
            .map_err(|e| {
                Failure::new(
                    reason::INVALID_ARTIFACT,
                    format!("building the artifact failed: {e}"),
                    Retry::Interval,
                )
            })?
            .map_err(archive_failure)?;
    if let Some(expected) = &plan.digest {
        expected
            .verify(&packed.bytes)
            .map_err(|e| Failure::new(reason::DIGEST_MISMATCH, e.to_string(), Retry::Interval))?;
    }

    let path = ctx
        .storage
        .store_packed(ns, &hs.name_any(), &packed)
        .await
        .map_err(|e| {
            Failure::new(
                reason::STORAGE_OPERATION_FAILED,
                format!("cannot store artifact: {e}"),
                Retry::Backoff,
            )
        })?;
    let unchanged = published.filter(|p| p.digest == packed.digest);
    if unchanged.is_none() {
        ctx.metrics.artifacts_stored.inc();
        info!(revision = %packed.digest, files = packed.files, size = packed.bytes.len(), "stored new artifact");
    }
    let summary = ArtifactSummary {
        url: ctx.storage.url(&path),
        revision: packed.digest.clone(),
        digest: packed.digest.clone(),
        path,
        size: packed.bytes.len() as i64,
        last_update_time: unchanged
            .map(|p| p.last_update_time.clone())
            .unwrap_or_else(|| Time(Timestamp::now())),
    };
    let remembered = (!validators.is_empty()).then(|| Remembered {
        fingerprint: fingerprint.to_string(),
        validators,
        digest: packed.digest,
    });
    Ok((summary, remembered))
}

async fn apply_artifact(
    hs: &HttpSource,
    ctx: &Context,
    summary: &ArtifactSummary,
) -> Result<Artifact, Error> {
    let name = hs.name_any();
    Ok(ctx
        .publisher
        .publish(hs, &name, artifact_spec(summary))
        .await?)
}

/// Writes the status an outcome implies (when it differs) and emits Events.
async fn write_outcome(
    hs: &HttpSource,
    ctx: &Context,
    requested_at: Option<&str>,
    outcome: &Result<ArtifactSummary, Failure>,
) -> Result<(), Error> {
    let outcome = match outcome {
        Ok(summary) => Outcome::Published(summary.clone()),
        Err(f) => {
            warn!(reason = f.reason, message = %f.message, "reconcile failed");
            Outcome::Failed {
                reason: f.reason,
                message: f.message.clone(),
                stalled: f.retry == Retry::Never,
            }
        }
    };
    let now = Time(Timestamp::now());
    let old = hs.status.as_ref();
    let new: HttpSourceStatus =
        status::next_status(old, hs.metadata.generation, requested_at, &outcome, &now);
    if old != Some(&new) {
        let ns = hs.namespace().ok_or(Error::Incomplete)?;
        let api: Api<HttpSource> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "status": new,
        });
        api.patch_status(
            &hs.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    let reference = hs.object_ref(&());
    for notice in status::notices(old, &new, &hs.spec.url) {
        let event = Event {
            type_: if notice.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: notice.reason,
            note: Some(notice.message),
            action: "Reconcile".to_string(),
            secondary: None,
        };
        let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
        if let Err(e) = recorder.publish(&event, &reference).await {
            warn!(error = %e, "cannot publish event");
        }
    }
    Ok(())
}

/// Runs the controller until a termination signal.
pub async fn run(ctx: Arc<Context>, health: Health, namespace: Option<String>, concurrency: u16) {
    let client = ctx.client.clone();
    let (sources, artifacts): (Api<HttpSource>, Api<Artifact>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let (reader, writer) = reflector::store();
    let synced = health.clone();
    let stream = watcher(sources, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .inspect_ok(move |event| {
            if matches!(event, watcher::Event::InitDone) && !synced.is_ready() {
                info!("HttpSource watch synced");
                synced.set_ready();
            }
        })
        .applied_objects()
        .predicate_filter(reconcile_trigger, Default::default());

    let sweeper = tokio::spawn(sweep_storage(reader.clone(), ctx.clone(), health));
    Controller::for_stream(stream, reader)
        .owns(artifacts, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => debug!(object = %object, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile error"),
            }
        })
        .await;
    sweeper.abort();
}

/// Once the watch synced (the store is complete, so a source missing from
/// it is gone), periodically removes the storage of deleted HttpSources and
/// expired artifacts.
async fn sweep_storage(store: Store<HttpSource>, ctx: Arc<Context>, health: Health) {
    health.wait_ready().await;
    let every = (ctx.retention.ttl / 2).clamp(Duration::from_secs(5), Duration::from_secs(60));
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        ctx.forget_missing(&store);
        let sources = match ctx.storage.sources().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot list storage");
                continue;
            }
        };
        for (namespace, name) in sources {
            let key = ObjectRef::<HttpSource>::new(&name).within(&namespace);
            match store.get(&key) {
                None => match ctx.storage.remove_source(&namespace, &name).await {
                    Ok(()) => info!(%namespace, %name, "removed storage of a deleted HttpSource"),
                    Err(e) => warn!(%namespace, %name, error = %e, "cannot remove storage"),
                },
                Some(hs) => {
                    let current = hs
                        .status
                        .as_ref()
                        .and_then(|s| s.artifact.as_ref())
                        .map(|a| a.path.clone());
                    // The sweep only expires by age: a reconcile may be
                    // storing a newer artifact than the status says yet.
                    let by_age = Retention {
                        records: usize::MAX,
                        ..ctx.retention
                    };
                    if let Err(e) = ctx
                        .storage
                        .collect_garbage(&namespace, &name, current.as_deref(), by_age)
                        .await
                    {
                        warn!(%namespace, %name, error = %e, "cannot collect old artifacts");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(spec: serde_json::Value) -> HttpSource {
        serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "app", "namespace": "team", "uid": "u-1", "generation": 3},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn plans_valid_specs_and_explains_invalid_ones() {
        let ok = plan(
            &source(serde_json::json!({"url": "https://e.com/a.tgz", "interval": "1m30s"})).spec,
        )
        .unwrap();
        assert_eq!(ok.interval, Duration::from_secs(90));
        assert_eq!(ok.timeout, Duration::from_secs(60));

        for (spec, needle) in [
            (
                serde_json::json!({"url": "ftp://e.com/a", "interval": "1m"}),
                "scheme",
            ),
            (
                serde_json::json!({"url": "not a url", "interval": "1m"}),
                "invalid url",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "1d"}),
                "interval",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "0s"}),
                "greater than zero",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "1m", "digest": "sha256:XY"}),
                "digest",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "1m", "ignore": "a{b\n[z-a]\n"}),
                "ignore",
            ),
        ] {
            let err = plan(&source(spec.clone()).spec).unwrap_err();
            assert!(err.contains(needle), "{spec}: {err}");
        }
    }

    #[test]
    fn the_artifact_is_owned_by_its_source() {
        let hs = source(serde_json::json!({"url": "https://e.com/a.tgz", "interval": "1m"}));
        let summary = ArtifactSummary {
            url: "http://storage/team/app/ab.tar.gz".into(),
            revision: "sha256:ab".into(),
            digest: "sha256:ab".into(),
            path: "team/app/ab.tar.gz".into(),
            size: 42,
            last_update_time: Time(Timestamp::from_second(1_700_000_000).unwrap()),
        };
        let artifact =
            openflux_api::producer::artifact_for(&hs, "app", artifact_spec(&summary)).unwrap();
        let json = serde_json::to_value(&artifact).unwrap();
        assert_eq!(
            json["metadata"]["ownerReferences"],
            serde_json::json!([{
                "apiVersion": "sources.openflux.dev/v1alpha1",
                "kind": "HttpSource",
                "name": "app",
                "uid": "u-1",
                "controller": true,
                "blockOwnerDeletion": true
            }])
        );
        assert_eq!(json["metadata"]["namespace"], "team");
        assert_eq!(json["spec"]["digest"], "sha256:ab");
        assert_eq!(json["spec"]["lastUpdateTime"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn reconciles_on_generation_or_request_only() {
        let hs = source(serde_json::json!({"url": "https://e.com/a.tgz", "interval": "1m"}));
        let mut with_status = hs.clone();
        with_status.status = Some(HttpSourceStatus {
            observed_generation: Some(3),
            ..HttpSourceStatus::default()
        });
        assert_eq!(reconcile_trigger(&hs), reconcile_trigger(&with_status));
        let mut requested = hs.clone();
        requested
            .annotations_mut()
            .insert(REQUESTED_AT_ANNOTATION.into(), "now".into());
        assert_ne!(reconcile_trigger(&hs), reconcile_trigger(&requested));
        let mut newer = hs.clone();
        newer.metadata.generation = Some(4);
        assert_ne!(reconcile_trigger(&hs), reconcile_trigger(&newer));
    }
}
