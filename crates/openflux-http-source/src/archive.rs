//! Turning fetched bytes into a normalized, content-addressed artifact.
//!
//! Pure functions over bytes: no I/O. The fetched body is a tar.gz (or plain
//! tar) of manifests, or a single YAML file. Unsafe archives are rejected;
//! what is kept is re-packed the way Flux packs its artifacts so that the same
//! content always yields the same bytes, and so the same sha256 digest:
//!
//! - regular files, plus the directories implied by their paths; links are
//!   left out (a link pointing outside the archive rejects it);
//! - entries sorted by path, uid/gid 0, no owner names, mtime 0 (the epoch);
//! - mode 0644 for files (0755 when any execute bit was set), 0755 for
//!   directories;
//! - gzip without file name or mtime in its header.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::rc::Rc;

use flate2::{read::MultiGzDecoder, write::GzEncoder, Compression, GzBuilder};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

/// Why fetched content cannot become an artifact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveError {
    /// The content is not an archive or manifests at all.
    #[error("{0}")]
    Invalid(String),
    /// The content is an archive, but an unsafe or oversized one.
    #[error("{0}")]
    Rejected(String),
}

/// A regular file of the artifact.
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

/// What the fetched bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    TarGz,
    Tar,
    Yaml,
}

/// Recognizes gzip by its magic bytes and tar by its `ustar` magic; anything
/// else is taken for YAML (and validated as such).
pub fn detect(body: &[u8]) -> Format {
    if body.starts_with(&[0x1f, 0x8b]) {
        Format::TarGz
    } else if body.len() >= 262 && &body[257..262] == b"ustar" {
        Format::Tar
    } else {
        Format::Yaml
    }
}

/// `sha256:<hex>` of some bytes.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Builds the normalized artifact from a fetched body.
///
/// `url_path` (the path part of the URL) names the file a single YAML body
/// is wrapped as; `max_size` bounds the decompressed size.
pub fn build(
    body: &[u8],
    url_path: &str,
    ignore: &IgnoreRules,
    max_size: u64,
) -> Result<Packed, ArchiveError> {
    let files = read_files(body, url_path, max_size)?;
    let kept: Vec<File> = files
        .into_iter()
        .filter(|f| !ignore.is_ignored(&f.path))
        .collect();
    let bytes = pack(&kept)?;
    Ok(Packed {
        digest: digest(&bytes),
        bytes,
        files: kept.len(),
    })
}

/// Checks the artifact's digest against the expected one, if any.
pub fn verify_digest(actual: &str, expected: Option<&str>) -> Result<(), String> {
    match expected {
        Some(expected) if expected != actual => Err(format!(
            "artifact digest {actual} does not match the expected {expected}"
        )),
        _ => Ok(()),
    }
}

/// Reads the files of a fetched body, validating it.
pub fn read_files(body: &[u8], url_path: &str, max_size: u64) -> Result<Vec<File>, ArchiveError> {
    match detect(body) {
        Format::TarGz => read_tar(MultiGzDecoder::new(body), max_size),
        Format::Tar => read_tar(body, max_size),
        Format::Yaml => {
            if body.len() as u64 > max_size {
                return Err(too_large(max_size));
            }
            validate_yaml(body)?;
            Ok(vec![File {
                path: single_file_name(url_path),
                executable: false,
                data: body.to_vec(),
            }])
        }
    }
}

fn too_large(max_size: u64) -> ArchiveError {
    ArchiveError::Rejected(format!(
        "artifact exceeds the maximum size of {max_size} bytes (decompressed)"
    ))
}

/// A single YAML file must hold at least one object (a mapping) and nothing
/// but objects, so an HTML error page or a stray binary is not taken for one.
fn validate_yaml(body: &[u8]) -> Result<(), ArchiveError> {
    use serde::Deserialize;
    let invalid = |why: String| {
        ArchiveError::Invalid(format!(
            "content is neither a tar(.gz) archive nor YAML manifests: {why}"
        ))
    };
    let text = std::str::from_utf8(body).map_err(|_| invalid("not UTF-8 text".into()))?;
    let mut objects = 0;
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value =
            serde_yaml_ng::Value::deserialize(document).map_err(|e| invalid(e.to_string()))?;
        match value {
            serde_yaml_ng::Value::Mapping(_) => objects += 1,
            serde_yaml_ng::Value::Null => {}
            _ => return Err(invalid("a YAML document is not an object".into())),
        }
    }
    if objects == 0 {
        return Err(invalid("no YAML object found".into()));
    }
    Ok(())
}

/// The name a single YAML file is stored under: the last segment of the URL
/// path without its extension, plus `.yaml` (`manifests.yaml` when empty).
pub fn single_file_name(url_path: &str) -> String {
    let last = url_path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("");
    let mut stem = last;
    for ext in [".yaml", ".yml", ".json"] {
        if let Some(s) = stem.strip_suffix(ext) {
            stem = s;
            break;
        }
    }
    let cleaned: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let cleaned = cleaned.trim_start_matches('.');
    if cleaned.is_empty() {
        "manifests.yaml".to_string()
    } else {
        format!("{cleaned}.yaml")
    }
}

/// A reader that fails once more than `limit` bytes went through it, and
/// remembers that it did (the tar reader wraps the error).
struct Limited<R> {
    inner: R,
    left: u64,
    exceeded: Rc<Cell<bool>>,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.exceeded.set(true);
            return Err(io::Error::other("size limit exceeded"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn read_tar<R: Read>(reader: R, max_size: u64) -> Result<Vec<File>, ArchiveError> {
    let exceeded = Rc::new(Cell::new(false));
    let limited = Limited {
        inner: reader,
        left: max_size,
        exceeded: exceeded.clone(),
    };
    let result = read_tar_entries(limited);
    if exceeded.get() {
        return Err(too_large(max_size));
    }
    let files = result?;
    check_file_directory_clashes(&files)?;
    Ok(files.into_values().collect())
}

fn read_tar_entries<R: Read>(reader: R) -> Result<BTreeMap<String, File>, ArchiveError> {
    let unreadable = |e: io::Error| ArchiveError::Invalid(format!("cannot read archive: {e}"));
    let mut archive = tar::Archive::new(reader);
    let mut files = BTreeMap::new();
    for entry in archive.entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::XGlobalHeader) {
            continue;
        }
        let raw_path = entry.path_bytes().into_owned();
        let path = clean_path(&raw_path)?;
        match kind {
            EntryType::Regular | EntryType::Continuous => {
                if path.is_empty() {
                    return Err(ArchiveError::Rejected(
                        "archive holds a file without a name".into(),
                    ));
                }
                let executable = entry
                    .header()
                    .mode()
                    .map(|m| m & 0o111 != 0)
                    .unwrap_or(false);
                let mut data = Vec::new();
                entry.read_to_end(&mut data).map_err(unreadable)?;
                files.insert(
                    path.clone(),
                    File {
                        path,
                        executable,
                        data,
                    },
                );
            }
            EntryType::Directory => {}
            EntryType::Symlink | EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target = String::from_utf8_lossy(&target);
                let hard = matches!(kind, EntryType::Link);
                if link_escapes(&path, &target, hard) {
                    return Err(ArchiveError::Rejected(format!(
                        "{} {path:?} points outside the archive ({target:?})",
                        if hard { "hard link" } else { "symlink" }
                    )));
                }
                // Links inside the archive are left out of the artifact.
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                return Err(ArchiveError::Rejected(format!(
                    "archive holds a device or fifo {path:?}"
                )));
            }
            other => {
                return Err(ArchiveError::Rejected(format!(
                    "archive entry {path:?} has an unsupported type {other:?}"
                )));
            }
        }
    }
    Ok(files)
}

/// Cleans an entry name into a relative slash path, rejecting absolute
/// paths, `..` components and names that are not UTF-8. `./` and empty
/// components are dropped; the result may be empty (the root).
pub fn clean_path(raw: &[u8]) -> Result<String, ArchiveError> {
    let name = std::str::from_utf8(raw).map_err(|_| {
        ArchiveError::Rejected(format!(
            "archive entry name {:?} is not UTF-8",
            String::from_utf8_lossy(raw)
        ))
    })?;
    if name.starts_with('/') {
        return Err(ArchiveError::Rejected(format!(
            "archive entry {name:?} has an absolute path"
        )));
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(ArchiveError::Rejected(format!(
                    "archive entry {name:?} has a '..' path component"
                )))
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// Whether a link at `path` with `target` resolves outside the archive root.
/// Symlink targets are relative to the link's directory, hard link targets
/// to the root.
pub fn link_escapes(path: &str, target: &str, hard: bool) -> bool {
    if target.starts_with('/') {
        return true;
    }
    let mut stack: Vec<&str> = if hard {
        Vec::new()
    } else {
        let mut parents: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        parents.pop();
        parents
    };
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if stack.pop().is_none() {
                    return true;
                }
            }
            p => stack.push(p),
        }
    }
    false
}

fn check_file_directory_clashes(files: &BTreeMap<String, File>) -> Result<(), ArchiveError> {
    for path in files.keys() {
        for (i, _) in path.match_indices('/') {
            let parent = &path[..i];
            if files.contains_key(parent) {
                return Err(ArchiveError::Rejected(format!(
                    "archive entry {parent:?} is both a file and a directory"
                )));
            }
        }
    }
    Ok(())
}

/// Packs files into a deterministic tar.gz (see the module documentation).
/// The order of `files` does not matter; a later duplicate path wins.
pub fn pack(files: &[File]) -> Result<Vec<u8>, ArchiveError> {
    let by_path: BTreeMap<&str, &File> = files.iter().map(|f| (f.path.as_str(), f)).collect();
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
    gz.finish().map_err(failed)
}

/// Flux's default exclusions, used when `spec.ignore` is not set: VCS
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

    /// Whether a file at `path` (relative, slash-separated) is excluded,
    /// directly or through one of its directories.
    pub fn is_ignored(&self, path: &str) -> bool {
        self.0.matched_path_or_any_parents(path, false).is_ignore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = 1 << 20;

    /// A raw tar entry, written with the given header fields as they are
    /// (names are written byte for byte, so unsafe names can be made).
    struct Raw<'a> {
        name: &'a str,
        kind: EntryType,
        data: &'a [u8],
        link: &'a str,
        mode: u32,
        mtime: u64,
        uid: u64,
        owner: &'a str,
    }

    impl<'a> Raw<'a> {
        fn file(name: &'a str, data: &'a [u8]) -> Self {
            Raw {
                name,
                kind: EntryType::Regular,
                data,
                link: "",
                mode: 0o644,
                mtime: 0,
                uid: 0,
                owner: "",
            }
        }
        fn link(name: &'a str, kind: EntryType, target: &'a str) -> Self {
            Raw {
                link: target,
                kind,
                ..Raw::file(name, b"")
            }
        }
        fn dir(name: &'a str) -> Self {
            Raw {
                kind: EntryType::Directory,
                mode: 0o700,
                ..Raw::file(name, b"")
            }
        }
    }

    fn tar_of(entries: &[Raw]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for e in entries {
            let mut header = Header::new_ustar();
            header.as_mut_bytes()[..100].fill(0);
            header.as_mut_bytes()[..e.name.len()].copy_from_slice(e.name.as_bytes());
            header.set_entry_type(e.kind);
            header.set_size(e.data.len() as u64);
            header.set_mode(e.mode);
            header.set_mtime(e.mtime);
            header.set_uid(e.uid);
            header.set_gid(e.uid);
            header.set_username(e.owner).unwrap();
            header.set_groupname(e.owner).unwrap();
            if !e.link.is_empty() {
                let bytes = e.link.as_bytes();
                header.as_old_mut().linkname[..bytes.len()].copy_from_slice(bytes);
            }
            header.set_cksum();
            builder.append(&header, e.data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn gzip(bytes: &[u8], mtime: u32, name: &str) -> Vec<u8> {
        let mut gz = GzBuilder::new()
            .mtime(mtime)
            .filename(name)
            .write(Vec::new(), Compression::best());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    fn no_ignore() -> IgnoreRules {
        IgnoreRules::parse(Some("")).unwrap()
    }

    fn build_tgz(entries: &[Raw]) -> Result<Packed, ArchiveError> {
        build(
            &gzip(&tar_of(entries), 0, ""),
            "/a.tar.gz",
            &no_ignore(),
            MAX,
        )
    }

    fn rejected(result: Result<Packed, ArchiveError>, needle: &str) {
        match result {
            Err(ArchiveError::Rejected(msg)) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("expected a rejection mentioning {needle:?}, got {other:?}"),
        }
    }

    /// The (path, mode, type, uid, mtime, content) of each entry of a tar.gz.
    fn listing(tgz: &[u8]) -> Vec<(String, u32, EntryType, u64, u64, Vec<u8>)> {
        let mut archive = tar::Archive::new(MultiGzDecoder::new(tgz));
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let h = e.header().clone();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (
                    String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                    h.mode().unwrap(),
                    h.entry_type(),
                    h.uid().unwrap(),
                    h.mtime().unwrap(),
                    data,
                )
            })
            .collect()
    }

    #[test]
    fn rejects_absolute_paths() {
        rejected(
            build_tgz(&[Raw::file("/etc/passwd", b"x")]),
            "absolute path",
        );
    }

    #[test]
    fn rejects_parent_components() {
        rejected(build_tgz(&[Raw::file("a/../../evil.yaml", b"x")]), "'..'");
        rejected(build_tgz(&[Raw::file("../evil.yaml", b"x")]), "'..'");
    }

    #[test]
    fn rejects_links_pointing_outside() {
        rejected(
            build_tgz(&[Raw::link("a/l", EntryType::Symlink, "../../etc/passwd")]),
            "symlink",
        );
        rejected(
            build_tgz(&[Raw::link("l", EntryType::Symlink, "/etc/passwd")]),
            "points outside",
        );
        rejected(
            build_tgz(&[Raw::link("a/l", EntryType::Link, "../x")]),
            "hard link",
        );
    }

    #[test]
    fn drops_links_inside_the_archive() {
        let packed = build_tgz(&[
            Raw::file("a/x.yaml", b"kind: A\n"),
            Raw::link("a/l.yaml", EntryType::Symlink, "x.yaml"),
            Raw::link("a/h.yaml", EntryType::Link, "a/x.yaml"),
        ])
        .unwrap();
        let paths: Vec<_> = listing(&packed.bytes).into_iter().map(|e| e.0).collect();
        assert_eq!(paths, ["a/", "a/x.yaml"]);
    }

    #[test]
    fn rejects_devices_and_fifos() {
        for kind in [EntryType::Char, EntryType::Block, EntryType::Fifo] {
            let mut raw = Raw::file("dev", b"");
            raw.kind = kind;
            rejected(build_tgz(&[raw]), "device or fifo");
        }
    }

    #[test]
    fn rejects_oversized_archives() {
        let big = vec![b'a'; 4096];
        let tgz = gzip(&tar_of(&[Raw::file("big.yaml", &big)]), 0, "");
        assert!(tgz.len() < 1024, "compresses well: a bomb in small");
        rejected(
            build(&tgz, "/a.tar.gz", &no_ignore(), 4096),
            "maximum size of 4096",
        );
        assert!(build(&tgz, "/a.tar.gz", &no_ignore(), 16 * 1024).is_ok());
        rejected(
            build(&big, "/big.yaml", &no_ignore(), 1024),
            "maximum size of 1024",
        );
    }

    #[test]
    fn rejects_a_file_that_is_also_a_directory() {
        rejected(
            build_tgz(&[Raw::file("a", b"x"), Raw::file("a/b.yaml", b"y")]),
            "both a file and a directory",
        );
    }

    #[test]
    fn rejects_garbage_as_invalid() {
        let result = build(b"\x1f\x8bnot really gzip", "/a.tar.gz", &no_ignore(), MAX);
        assert!(
            matches!(result, Err(ArchiveError::Invalid(_))),
            "{result:?}"
        );
        for body in [
            &b"<html><body>Not Found</body></html>"[..],
            b"just a line of text",
            b"- a\n- list\n",
            b"",
            b"\xff\xfe\x00binary",
        ] {
            let result = build(body, "/x.yaml", &no_ignore(), MAX);
            assert!(
                matches!(result, Err(ArchiveError::Invalid(_))),
                "{body:?}: {result:?}"
            );
        }
    }

    #[test]
    fn normalization_is_deterministic() {
        let one = tar_of(&[
            Raw::dir("app"),
            Raw::file("app/a.yaml", b"kind: A\n"),
            Raw::file("app/b.yaml", b"kind: B\n"),
            Raw::file("./top.yaml", b"kind: T\n"),
        ]);
        let mut later = Raw::file("app/b.yaml", b"kind: B\n");
        later.mtime = 1_700_000_000;
        later.uid = 1000;
        later.owner = "alice";
        later.mode = 0o600;
        let mut a = Raw::file("app/a.yaml", b"kind: A\n");
        a.mtime = 1_600_000_000;
        a.owner = "bob";
        a.mode = 0o664;
        let two = tar_of(&[Raw::file("top.yaml", b"kind: T\n"), later, a]);

        let first = build(&gzip(&one, 0, ""), "/x.tgz", &no_ignore(), MAX).unwrap();
        let second = build(
            &gzip(&two, 1_700_000_000, "upstream.tar"),
            "/y.tgz",
            &no_ignore(),
            MAX,
        )
        .unwrap();
        assert_eq!(first.digest, second.digest);
        assert_eq!(first.bytes, second.bytes);
        assert_eq!(first.files, 3);
        // An uncompressed tar of the same content gives the same artifact too.
        let third = build(&two, "/z.tar", &no_ignore(), MAX).unwrap();
        assert_eq!(first.digest, third.digest);
        assert_eq!(first.digest, digest(&first.bytes));

        let entries = listing(&first.bytes);
        let shape: Vec<_> = entries
            .iter()
            .map(|(p, m, t, uid, mtime, _)| (p.as_str(), *m, *t, *uid, *mtime))
            .collect();
        assert_eq!(
            shape,
            [
                ("app/", 0o755, EntryType::Directory, 0, 0),
                ("app/a.yaml", 0o644, EntryType::Regular, 0, 0),
                ("app/b.yaml", 0o644, EntryType::Regular, 0, 0),
                ("top.yaml", 0o644, EntryType::Regular, 0, 0),
            ]
        );
        // No mtime or file name in the gzip header.
        assert_eq!(&first.bytes[3..8], &[0, 0, 0, 0, 0]);
    }

    #[test]
    fn different_content_gives_a_different_digest() {
        let a = build_tgz(&[Raw::file("a.yaml", b"kind: A\n")]).unwrap();
        let b = build_tgz(&[Raw::file("a.yaml", b"kind: B\n")]).unwrap();
        assert_ne!(a.digest, b.digest);
    }

    #[test]
    fn keeps_the_execute_bit() {
        let mut script = Raw::file("run.sh", b"#!/bin/sh\n");
        script.mode = 0o700;
        let packed = build_tgz(&[script]).unwrap();
        assert_eq!(listing(&packed.bytes)[0].1, 0o755);
    }

    #[test]
    fn wraps_a_single_yaml_file() {
        let yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n";
        let packed = build(yaml, "/releases/v1/install.yaml", &no_ignore(), MAX).unwrap();
        let entries = listing(&packed.bytes);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].0, "install.yaml");
        assert_eq!(entries[0].1, 0o644);
        assert_eq!(entries[0].5, yaml);
        assert_eq!(packed.files, 1);
        // Same file, same artifact.
        assert_eq!(
            build(yaml, "/install.yaml", &no_ignore(), MAX)
                .unwrap()
                .digest,
            packed.digest
        );
    }

    #[test]
    fn names_single_files_from_the_url() {
        assert_eq!(single_file_name("/a/b/deploy.yaml"), "deploy.yaml");
        assert_eq!(single_file_name("/a/b/deploy.yml"), "deploy.yaml");
        assert_eq!(single_file_name("/install"), "install.yaml");
        assert_eq!(single_file_name("/dir/"), "dir.yaml");
        assert_eq!(single_file_name("/"), "manifests.yaml");
        assert_eq!(single_file_name(""), "manifests.yaml");
        assert_eq!(single_file_name("/..yaml"), "manifests.yaml");
        assert_eq!(single_file_name("/a%20b.yaml"), "a-20b.yaml");
    }

    #[test]
    fn applies_ignore_patterns() {
        let rules = IgnoreRules::parse(Some("# comment\n*.md\n/tests/\n!keep.md\n")).unwrap();
        let packed = build(
            &gzip(
                &tar_of(&[
                    Raw::file("README.md", b"x"),
                    Raw::file("keep.md", b"x"),
                    Raw::file("app/deploy.yaml", b"kind: A\n"),
                    Raw::file("app/NOTES.md", b"x"),
                    Raw::file("tests/t.yaml", b"kind: T\n"),
                    Raw::file("app/tests/t.yaml", b"kind: T\n"),
                ]),
                0,
                "",
            ),
            "/a.tgz",
            &rules,
            MAX,
        )
        .unwrap();
        let paths: Vec<_> = listing(&packed.bytes).into_iter().map(|e| e.0).collect();
        assert_eq!(
            paths,
            [
                "app/",
                "app/deploy.yaml",
                "app/tests/",
                "app/tests/t.yaml",
                "keep.md"
            ]
        );
        assert_eq!(packed.files, 3);
    }

    #[test]
    fn default_ignore_drops_vcs_and_ci_files() {
        let rules = IgnoreRules::parse(None).unwrap();
        assert!(rules.is_ignored(".git/config"));
        assert!(rules.is_ignored("sub/.git/HEAD"));
        assert!(rules.is_ignored(".github/workflows/ci.yaml"));
        assert!(rules.is_ignored("logo.png"));
        assert!(!rules.is_ignored("deploy/app.yaml"));
        // Setting spec.ignore replaces the defaults, as in Flux.
        assert!(!IgnoreRules::parse(Some("*.md"))
            .unwrap()
            .is_ignored("logo.png"));
    }

    #[test]
    fn verifies_the_expected_digest() {
        let packed = build_tgz(&[Raw::file("a.yaml", b"kind: A\n")]).unwrap();
        assert_eq!(verify_digest(&packed.digest, None), Ok(()));
        assert_eq!(verify_digest(&packed.digest, Some(&packed.digest)), Ok(()));
        let wrong = format!("sha256:{}", "0".repeat(64));
        let err = verify_digest(&packed.digest, Some(&wrong)).unwrap_err();
        assert!(
            err.contains(&packed.digest) && err.contains(&wrong),
            "{err}"
        );
    }

    #[test]
    fn cleans_paths_and_judges_links() {
        assert_eq!(clean_path(b"./a//b/./c.yaml").unwrap(), "a/b/c.yaml");
        assert_eq!(clean_path(b"./").unwrap(), "");
        assert!(clean_path(b"\xffname").is_err());
        assert!(!link_escapes("a/b/l", "../c", false));
        assert!(link_escapes("a/l", "../../c", false));
        assert!(!link_escapes("a/l", "a/c", true));
        assert!(link_escapes("a/l", "../c", true));
        assert!(link_escapes("l", "/c", false));
    }
}
