//! Packing files into a normalized, content-addressed tar.gz.
//!
//! What is packed is re-packed the way Flux packs its artifacts, so that the
//! same content always yields the same bytes, and so the same sha256 digest:
//!
//! - regular files, plus the directories implied by their paths;
//! - entries sorted by path, uid/gid 0, no owner names, mtime 0 (the epoch);
//! - mode 0644 for files (0755 when any execute bit was set), 0755 for
//!   directories;
//! - gzip without file name or mtime in its header.
//!
//! The digest also depends on the gzip encoder, so it is stable for a given
//! version of this crate.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::Path;

use flate2::{write::GzEncoder, Compression, GzBuilder};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use tar::{EntryType, Header};

use super::digest::Digest;

/// Why content cannot become an artifact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveError {
    /// The content is not an archive or manifests at all.
    #[error("{0}")]
    Invalid(String),
    /// The content is an archive, but an unsafe or oversized one.
    #[error("{0}")]
    Rejected(String),
    /// A local file or directory could not be read.
    #[error("{0}")]
    Unreadable(String),
}

/// A regular file of an artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Slash-separated path relative to the archive root, without `.` or `..`.
    pub path: String,
    /// Whether any execute bit was set.
    pub executable: bool,
    pub data: Vec<u8>,
}

/// A normalized artifact, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// The tar.gz bytes.
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    /// Number of regular files in the artifact.
    pub files: usize,
}

impl Packed {
    /// The hex part of the digest.
    pub fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }
}

/// Packs files into a deterministic tar.gz (see the module documentation).
/// The order of `files` does not matter; a later duplicate path wins.
pub fn pack(files: &[File]) -> Result<Packed, ArchiveError> {
    let by_path: BTreeMap<&str, &File> = files.iter().map(|f| (f.path.as_str(), f)).collect();
    let count = by_path.len();
    let mut directories = BTreeSet::new();
    for path in by_path.keys() {
        for (i, _) in path.match_indices('/') {
            directories.insert(&path[..i]);
        }
    }
    // A directory sorts before its content: it is a prefix of every path in it.
    let mut entries: Vec<(&str, Option<&File>)> = directories
        .into_iter()
        .map(|d| (d, None))
        .chain(by_path.into_iter().map(|(p, f)| (p, Some(f))))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));

    let failed = |e: io::Error| ArchiveError::Invalid(format!("cannot pack artifact: {e}"));
    let gz: GzEncoder<Vec<u8>> = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), Compression::default());
    let mut builder = tar::Builder::new(gz);
    for (path, file) in entries {
        let mut header = Header::new_gnu();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        match file {
            None => {
                header.set_entry_type(EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, format!("{path}/"), io::empty())
                    .map_err(failed)?;
            }
            Some(file) => {
                header.set_entry_type(EntryType::Regular);
                header.set_mode(if file.executable { 0o755 } else { 0o644 });
                header.set_size(file.data.len() as u64);
                builder
                    .append_data(&mut header, path, file.data.as_slice())
                    .map_err(failed)?;
            }
        }
    }
    let mut gz = builder.into_inner().map_err(failed)?;
    gz.flush().map_err(failed)?;
    let bytes = gz.finish().map_err(failed)?;
    Ok(Packed {
        digest: Digest::sha256(&bytes).to_string(),
        bytes,
        files: count,
    })
}

/// Packs the regular files under `dir` that `ignore` keeps, as [`pack`]
/// does. Symlinks, devices and other special files are left out (Flux packs
/// regular files only); a name that is not UTF-8 is an error.
pub fn pack_dir(dir: &Path, ignore: &IgnoreRules) -> Result<Packed, ArchiveError> {
    let mut files = Vec::new();
    collect(dir, "", ignore, &mut files)?;
    pack(&files)
}

fn collect(
    dir: &Path,
    prefix: &str,
    ignore: &IgnoreRules,
    out: &mut Vec<File>,
) -> Result<(), ArchiveError> {
    let unreadable = |p: &Path, e: io::Error| {
        ArchiveError::Unreadable(format!("cannot read {}: {e}", p.display()))
    };
    let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, e))?;
        let full = entry.path();
        let name = entry.file_name().into_string().map_err(|n| {
            ArchiveError::Rejected(format!("file name {n:?} in {} is not UTF-8", dir.display()))
        })?;
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        // Not followed: a symlink's own type.
        let kind = entry.file_type().map_err(|e| unreadable(&full, e))?;
        if kind.is_dir() {
            if !ignore.is_ignored_dir(&path) {
                collect(&full, &path, ignore, out)?;
            }
        } else if kind.is_file() && !ignore.is_ignored(&path) {
            let data = std::fs::read(&full).map_err(|e| unreadable(&full, e))?;
            let metadata = entry.metadata().map_err(|e| unreadable(&full, e))?;
            out.push(File {
                path,
                executable: is_executable(&metadata),
                data,
            });
        }
    }
    Ok(())
}

#[cfg(unix)]
fn is_executable(metadata: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    metadata.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_: &std::fs::Metadata) -> bool {
    false
}

/// Flux's default exclusions, used when no patterns are given: VCS
/// metadata, CI configuration and binary/media files.
pub const DEFAULT_IGNORE: &str = "\
.git/
.gitignore
.gitmodules
.gitattributes
.hg/
.svn/
*.jpg
*.jpeg
*.gif
*.png
*.wmv
*.flv
*.tar.gz
*.zip
.github/
.circleci/
.travis.yml
.gitlab-ci.yml
appveyor.yml
.drone.yml
cloudbuild.yaml
codeship-services.yml
codeship-steps.yml
**/.goreleaser.yml
**/.sops.yaml
**/.flux.yaml
";

/// gitignore-style exclusion patterns (Flux's `.spec.ignore` format).
#[derive(Debug, Clone)]
pub struct IgnoreRules(Gitignore);

impl IgnoreRules {
    /// Parses newline-separated patterns; `None` means [`DEFAULT_IGNORE`].
    pub fn parse(patterns: Option<&str>) -> Result<Self, String> {
        let mut builder = GitignoreBuilder::new("");
        for line in patterns.unwrap_or(DEFAULT_IGNORE).lines() {
            builder
                .add_line(None, line)
                .map_err(|e| format!("invalid ignore pattern {line:?}: {e}"))?;
        }
        builder
            .build()
            .map(IgnoreRules)
            .map_err(|e| format!("invalid ignore patterns: {e}"))
    }

    /// Rules that exclude nothing.
    pub fn none() -> Self {
        IgnoreRules(Gitignore::empty())
    }

    /// Whether a file at `path` (relative, slash-separated) is excluded,
    /// directly or through one of its directories.
    pub fn is_ignored(&self, path: &str) -> bool {
        self.0.matched_path_or_any_parents(path, false).is_ignore()
    }

    /// Whether a directory at `path` is excluded, with everything in it.
    pub fn is_ignored_dir(&self, path: &str) -> bool {
        self.0.matched_path_or_any_parents(path, true).is_ignore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::testutil::{listing, MAX};
    use crate::producer::unpack;

    fn file(path: &str, data: &[u8]) -> File {
        File {
            path: path.into(),
            executable: false,
            data: data.to_vec(),
        }
    }

    #[test]
    fn packing_is_deterministic_and_normalized() {
        let one = pack(&[
            file("app/b.yaml", b"kind: B\n"),
            file("top.yaml", b"kind: T\n"),
            file("app/a.yaml", b"kind: A\n"),
        ])
        .unwrap();
        let two = pack(&[
            file("top.yaml", b"kind: T\n"),
            file("app/a.yaml", b"kind: A\n"),
            file("app/b.yaml", b"kind: B\n"),
        ])
        .unwrap();
        assert_eq!(one, two);
        assert_eq!(one.files, 3);
        assert_eq!(one.digest, Digest::sha256(&one.bytes).to_string());
        assert_eq!(one.hex().len(), 64);

        let shape: Vec<_> = listing(&one.bytes)
            .into_iter()
            .map(|(p, m, t, uid, mtime, _)| (p, m, t, uid, mtime))
            .collect();
        assert_eq!(
            shape,
            [
                ("app/".to_string(), 0o755, EntryType::Directory, 0, 0),
                ("app/a.yaml".to_string(), 0o644, EntryType::Regular, 0, 0),
                ("app/b.yaml".to_string(), 0o644, EntryType::Regular, 0, 0),
                ("top.yaml".to_string(), 0o644, EntryType::Regular, 0, 0),
            ]
        );
        // No mtime or file name in the gzip header.
        assert_eq!(&one.bytes[3..8], &[0, 0, 0, 0, 0]);
    }

    /// The bytes of a known input are pinned: a change of the packing (or
    /// of the gzip encoder) changes every published digest, and must be a
    /// deliberate one.
    #[test]
    fn the_digest_of_known_content_is_pinned() {
        let packed = pack(&[file("a.yaml", b"kind: A\n")]).unwrap();
        assert_eq!(
            packed.digest,
            "sha256:8e2150a77ed7447d2b5ebf036eebe919ad31e0e85829e69ea7f89fc5afe877a3"
        );
    }

    #[test]
    fn different_content_gives_a_different_digest() {
        let a = pack(&[file("a.yaml", b"kind: A\n")]).unwrap();
        let b = pack(&[file("a.yaml", b"kind: B\n")]).unwrap();
        assert_ne!(a.digest, b.digest);
    }

    #[test]
    fn keeps_the_execute_bit() {
        let mut script = file("run.sh", b"#!/bin/sh\n");
        script.executable = true;
        let packed = pack(&[script]).unwrap();
        assert_eq!(listing(&packed.bytes)[0].1, 0o755);
    }

    #[cfg(unix)]
    #[test]
    fn packs_a_directory_like_the_same_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("app/.git")).unwrap();
        std::fs::write(root.join("app/a.yaml"), "kind: A\n").unwrap();
        std::fs::write(root.join("app/.git/HEAD"), "ref").unwrap();
        std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::fs::write(root.join("logo.png"), "png").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link.yaml")).unwrap();

        let packed = pack_dir(root, &IgnoreRules::parse(None).unwrap()).unwrap();
        let mut script = file("run.sh", b"#!/bin/sh\n");
        script.executable = true;
        let expected = pack(&[file("app/a.yaml", b"kind: A\n"), script]).unwrap();
        assert_eq!(packed, expected);

        let everything = pack_dir(root, &IgnoreRules::none()).unwrap();
        assert_eq!(everything.files, 4, "links are never packed");
        let unpacked = unpack::read_tar_gz(&everything.bytes, MAX).unwrap();
        assert!(unpacked.iter().any(|f| f.path == "app/.git/HEAD"));
    }

    #[test]
    fn an_unreadable_directory_is_an_error() {
        let err = pack_dir(Path::new("/nonexistent/dir"), &IgnoreRules::none()).unwrap_err();
        assert!(matches!(err, ArchiveError::Unreadable(ref m) if m.contains("/nonexistent/dir")));
    }

    #[test]
    fn default_ignore_drops_vcs_and_ci_files() {
        let rules = IgnoreRules::parse(None).unwrap();
        assert!(rules.is_ignored(".git/config"));
        assert!(rules.is_ignored("sub/.git/HEAD"));
        assert!(rules.is_ignored_dir("sub/.git"));
        assert!(rules.is_ignored(".github/workflows/ci.yaml"));
        assert!(rules.is_ignored("logo.png"));
        assert!(!rules.is_ignored("deploy/app.yaml"));
        // Setting patterns replaces the defaults, as in Flux.
        assert!(!IgnoreRules::parse(Some("*.md"))
            .unwrap()
            .is_ignored("logo.png"));
        assert!(IgnoreRules::parse(Some("a{b\n[z-a]\n")).is_err());
    }
}
