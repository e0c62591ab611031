//! A process started from an image's root file system with `chroot`, so it
//! sees only the files of the image and the ones the test mounts into it.

use openflux_testkit as support;

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::openflux::{http_get, tail};
use support::wait_for;

use crate::archive::Image;

/// Fails unless this process may `chroot` (the e2e tests run as root).
pub fn require_root() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?");
    assert_eq!(
        uid, "0",
        "running a binary from its image's root file system needs chroot, so root (effective uid is {uid})"
    );
}

/// The image's entry point started in its root file system as its user,
/// with only `env` in the environment; stopped (SIGTERM, then kill) on drop,
/// its log tail printed when the test is failing.
pub struct Rooted {
    child: Option<Child>,
    pub log: PathBuf,
    name: String,
}

impl Rooted {
    pub fn start(image: &Image, name: &str, args: &[String], env: &[(&str, &str)]) -> Rooted {
        require_root();
        let log = std::env::temp_dir().join(format!("{}.log", support::unique_name(name)));
        let out = std::fs::File::create(&log).expect("creating the log file");
        let err = out.try_clone().expect("cloning the log file handle");
        let child = Command::new("chroot")
            .arg(format!("--userspec={}", image.field("User")))
            .arg(&image.rootfs)
            .args(image.entrypoint())
            .args(args)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting chroot");
        Rooted {
            child: Some(child),
            log,
            name: name.to_string(),
        }
    }

    /// Waits (bounded) until `GET /readyz` on `health` answers 200; fails
    /// with the log if the process exits first.
    pub async fn wait_ready(&mut self, health: SocketAddr) {
        let what = format!("{} to be ready on {health}", self.name);
        wait_for(&what, Duration::from_secs(60), || {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            let log = self.log.clone();
            async move {
                if let Some(status) = exited {
                    panic!("exited early ({status}):\n{}", tail(&log, 40));
                }
                matches!(http_get(health, "/readyz").await, Some((200, _))).then_some(())
            }
        })
        .await;
    }

    pub fn log_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// SIGTERM, then a bounded wait, then kill.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        openflux_testkit::openflux::stop_child(self.child.take()?)
    }
}

impl Drop for Rooted {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- {} log ({}) ----\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 60)
            );
        }
        self.stop();
    }
}
