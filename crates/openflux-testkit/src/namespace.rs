//! Test namespaces: unique names, a label per test, deletion on drop.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Config};

use crate::*;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique across test processes: `<prefix>-<pid>-<n>-<time>`, cut to
/// a valid DNS label (lowercase, at most 63 characters).
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    let suffix = format!("{}-{n}-{:x}", std::process::id(), t & 0xfffff);
    let mut prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    prefix.truncate(62 - suffix.len());
    let prefix = prefix.trim_matches('-');
    if prefix.is_empty() {
        format!("t-{suffix}")
    } else {
        format!("{prefix}-{suffix}")
    }
}

/// A namespace that exists for one test. Deleted (without waiting for the
/// namespace controller to finish) on drop or by [`TestNamespace::delete`].
pub struct TestNamespace {
    name: String,
    config: Config,
    deleted: bool,
}

impl TestNamespace {
    pub(crate) async fn create(env: &Env, prefix: &str) -> Self {
        let name = unique_name(prefix);
        let api: Api<Namespace> = Api::all(env.client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": name, "labels": { TEST_LABEL: prefix_label(prefix) } },
        }))
        .expect("namespace object");
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating test namespace {name}: {e}"));
        TestNamespace {
            name,
            config: env.config.clone(),
            deleted: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace now (the usual end of a test).
    pub async fn delete(mut self) {
        self.deleted = true;
        if let Ok(client) = Client::try_from(self.config.clone()) {
            delete_namespace(client, &self.name).await;
        }
    }
}

fn prefix_label(prefix: &str) -> String {
    let mut label: String = prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    label.truncate(63);
    label.trim_matches('-').to_string()
}

async fn delete_namespace(client: Client, name: &str) {
    let api: Api<Namespace> = Api::all(client);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => eprintln!("warning: deleting test namespace {name}: {e}"),
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        // Drop cannot await and the test's runtime may be shutting down: use
        // a short-lived runtime (and client) on a helper thread.
        let config = self.config.clone();
        let name = self.name.clone();
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    if let Ok(client) = Client::try_from(config) {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(10),
                            delete_namespace(client, &name),
                        )
                        .await;
                    }
                });
            }
        });
        let _ = done.join();
    }
}

// ------------------------------------------------------------ dynamic API --
