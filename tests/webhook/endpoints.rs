//! `openflux run` with a metrics, health or webhook port that another
//! process holds stops at once with an error naming the flag, instead of
//! running on where no probe (or no API server) can reach it.

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A kubeconfig whose API server nothing answers (`tls`: how the cluster's
/// certificate is checked): the process must fail on its port before it
/// needs the cluster.
fn kubeconfig(dir: &std::path::Path, tls: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:1', {tls}}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u, namespace: default}}}}]\n\
             current-context: x\n"
        ),
    )
    .expect("writing the kubeconfig");
    path
}

fn free() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// The three listening flags of `openflux run`.
const ADDR_FLAGS: [&str; 3] = ["--metrics-addr", "--health-addr", "--webhook-addr"];

/// `openflux run` against `kubeconfig` in namespace default, each of
/// ADDR_FLAGS at the address `addr` gives for it, with its output piped.
fn openflux_run(kubeconfig: &std::path::Path, addr: impl Fn(&str) -> SocketAddr) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_openflux"));
    command.arg("--kubeconfig").arg(kubeconfig).arg("run");
    for flag in ADDR_FLAGS {
        command.arg(format!("{flag}={}", addr(flag)));
    }
    command
        .arg("--namespace=default")
        .arg("--watch-all-namespaces=false")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs `openflux run` with `flag` at `taken` and the other two ports
/// free, for at most 20 s: its exit status (None: still running, then
/// killed) and its output.
fn run_with(
    kubeconfig: &std::path::Path,
    flag: &str,
    taken: SocketAddr,
) -> (Option<std::process::ExitStatus>, String) {
    let mut child = openflux_run(kubeconfig, |name| if name == flag { taken } else { free() })
        .spawn()
        .expect("starting openflux");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("polling openflux") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("openflux's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (status, text)
}

#[test]
fn a_taken_port_stops_the_process_with_its_flag() {
    let dir = std::env::temp_dir().join(format!("openflux-endpoints-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let kubeconfig = kubeconfig(&dir, "insecure-skip-tls-verify: true");
    for flag in ADDR_FLAGS {
        let held = TcpListener::bind("127.0.0.1:0").expect("binding a port to hold");
        let taken = held.local_addr().expect("the held port");
        // The other two ports are free when picked but not held (the child
        // must bind them): a process running beside the test may take one
        // in between. That run says so, naming that other flag; it is
        // tried again with new ports, a bounded number of times.
        let mut attempts = 0;
        let (status, text) = loop {
            attempts += 1;
            let (status, text) = run_with(&kubeconfig, flag, taken);
            let other_taken = ADDR_FLAGS.iter().any(|other| {
                *other != flag && text.contains(&format!("cannot listen on {other} "))
            });
            if !other_taken || attempts == 5 {
                break (status, text);
            }
        };
        let status = status
            .unwrap_or_else(|| panic!("openflux kept running with {flag}={taken} taken:\n{text}"));
        assert!(!status.success(), "{flag}: exit {status}\n{text}");
        let said = format!("cannot listen on {flag} {taken}");
        assert!(text.contains(&said), "{flag}: no `{said}` in\n{text}");
        assert!(text.contains("Address already in use"), "{text}");
        drop(held);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// openflux's image carries no CA roots. Events posted over plain HTTP (the
/// shipped Deployment's `--events-addr`) must not need them: before, the
/// events client refused to build and openflux exited at start.
#[test]
fn plain_http_events_start_without_ca_roots() {
    let dir = std::env::temp_dir().join(format!("openflux-no-roots-{}", std::process::id()));
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).expect("a temporary directory");
    // The API server's CA from the kubeconfig, as in a Pod: the system's
    // roots are the only thing missing.
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("a CA");
    let tls = format!(
        "certificate-authority-data: {}",
        base64_of(ca.cert.pem().as_bytes())
    );
    let kubeconfig = kubeconfig(&dir, &tls);
    let webhook = free();
    let mut child = openflux_run(&kubeconfig, |flag| {
        if flag == "--webhook-addr" {
            webhook
        } else {
            free()
        }
    })
    .env("SSL_CERT_FILE", dir.join("none.pem"))
    .env("SSL_CERT_DIR", &empty)
    .arg("--events-addr=http://127.0.0.1:1/")
    .spawn()
    .expect("starting openflux");
    let deadline = Instant::now() + Duration::from_secs(30);
    let serving = loop {
        if child.try_wait().expect("polling openflux").is_some() {
            break false;
        }
        if std::net::TcpStream::connect(webhook).is_ok() {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let out = child.wait_with_output().expect("openflux's output");
    assert!(
        serving,
        "openflux did not serve its webhook without CA roots:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
