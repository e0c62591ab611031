// Records the commit a binary of this workspace is built from, for its
// `--version` (openflux here; openflux-http-source includes this file).
//
// `OPENFLUX_BUILD_COMMIT` wins when set (a build from a source tarball, or
// one that must name its commit explicitly); otherwise `git rev-parse HEAD`
// in the source tree; a tree without git metadata builds as "unknown".

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=OPENFLUX_BUILD_COMMIT");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let commit = match std::env::var("OPENFLUX_BUILD_COMMIT") {
        Ok(commit) if !commit.is_empty() => commit,
        _ => match git(dir, &["rev-parse", "HEAD"]) {
            Some(commit) => {
                // Rebuild when HEAD moves: HEAD itself, the branch it names
                // and packed-refs (paths as git resolves them, worktrees too).
                let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
                if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
                    watched.push(branch);
                }
                for name in watched {
                    if let Some(path) = git(dir, &["rev-parse", "--git-path", &name]) {
                        let path = dir.join(path);
                        if path.exists() {
                            println!("cargo:rerun-if-changed={}", path.display());
                        }
                    }
                }
                commit
            }
            None => "unknown".to_owned(),
        },
    };
    println!("cargo:rustc-env=OPENFLUX_BUILD_COMMIT={commit}");
}
