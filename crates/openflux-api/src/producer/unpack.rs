//! Reading the files of an untrusted tar or tar.gz (a download, an upload).
//!
//! Pure functions over bytes: nothing is written to disk. Unsafe archives
//! are rejected rather than cleaned: an absolute path, a `..` component, a
//! link pointing outside the archive, a device or fifo, a path that is both
//! a file and a directory, or more than `max_size` decompressed bytes (so a
//! gzip bomb is cut off early). Links inside the archive are left out.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::rc::Rc;

use flate2::read::MultiGzDecoder;
use tar::EntryType;

use super::archive::{ArchiveError, File};

/// The files of a tar.gz.
pub fn read_tar_gz(bytes: &[u8], max_size: u64) -> Result<Vec<File>, ArchiveError> {
    read_tar(MultiGzDecoder::new(bytes), max_size)
}

/// The files of a tar read from `reader`, sorted by path.
pub fn read_tar<R: Read>(reader: R, max_size: u64) -> Result<Vec<File>, ArchiveError> {
    let exceeded = Rc::new(Cell::new(false));
    let limited = Limited {
        inner: reader,
        left: max_size,
        exceeded: exceeded.clone(),
    };
    let result = read_entries(limited);
    if exceeded.get() {
        return Err(too_large(max_size));
    }
    let files = result?;
    check_file_directory_clashes(&files)?;
    Ok(files.into_values().collect())
}

/// The rejection of content larger than `max_size` decompressed bytes.
pub fn too_large(max_size: u64) -> ArchiveError {
    ArchiveError::Rejected(format!(
        "artifact exceeds the maximum size of {max_size} bytes (decompressed)"
    ))
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

fn read_entries<R: Read>(reader: R) -> Result<BTreeMap<String, File>, ArchiveError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::archive::pack;
    use crate::producer::testutil::{gzip, listing, tar_of, Raw, MAX};

    fn read_tgz(entries: &[Raw]) -> Result<Vec<File>, ArchiveError> {
        read_tar_gz(&gzip(&tar_of(entries), 0, ""), MAX)
    }

    fn rejected(result: Result<Vec<File>, ArchiveError>, needle: &str) {
        match result {
            Err(ArchiveError::Rejected(msg)) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("expected a rejection mentioning {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn rejects_absolute_paths() {
        rejected(read_tgz(&[Raw::file("/etc/passwd", b"x")]), "absolute path");
    }

    #[test]
    fn rejects_parent_components() {
        rejected(read_tgz(&[Raw::file("a/../../evil.yaml", b"x")]), "'..'");
        rejected(read_tgz(&[Raw::file("../evil.yaml", b"x")]), "'..'");
    }

    #[test]
    fn rejects_links_pointing_outside() {
        rejected(
            read_tgz(&[Raw::link("a/l", EntryType::Symlink, "../../etc/passwd")]),
            "symlink",
        );
        rejected(
            read_tgz(&[Raw::link("l", EntryType::Symlink, "/etc/passwd")]),
            "points outside",
        );
        rejected(
            read_tgz(&[Raw::link("a/l", EntryType::Link, "../x")]),
            "hard link",
        );
    }

    #[test]
    fn drops_links_inside_the_archive() {
        let files = read_tgz(&[
            Raw::file("a/x.yaml", b"kind: A\n"),
            Raw::link("a/l.yaml", EntryType::Symlink, "x.yaml"),
            Raw::link("a/h.yaml", EntryType::Link, "a/x.yaml"),
        ])
        .unwrap();
        let paths: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a/x.yaml"]);
    }

    #[test]
    fn rejects_devices_and_fifos() {
        for kind in [EntryType::Char, EntryType::Block, EntryType::Fifo] {
            let mut raw = Raw::file("dev", b"");
            raw.kind = kind;
            rejected(read_tgz(&[raw]), "device or fifo");
        }
    }

    #[test]
    fn rejects_oversized_archives() {
        let big = vec![b'a'; 4096];
        let tgz = gzip(&tar_of(&[Raw::file("big.yaml", &big)]), 0, "");
        assert!(tgz.len() < 1024, "compresses well: a bomb in small");
        rejected(read_tar_gz(&tgz, 4096), "maximum size of 4096");
        assert!(read_tar_gz(&tgz, 16 * 1024).is_ok());
    }

    #[test]
    fn rejects_a_file_that_is_also_a_directory() {
        rejected(
            read_tgz(&[Raw::file("a", b"x"), Raw::file("a/b.yaml", b"y")]),
            "both a file and a directory",
        );
    }

    #[test]
    fn garbage_is_invalid() {
        let result = read_tar_gz(b"\x1f\x8bnot really gzip", MAX);
        assert!(
            matches!(result, Err(ArchiveError::Invalid(_))),
            "{result:?}"
        );
    }

    /// Whatever the archive's mtimes, owners, modes and order, the files
    /// read from it pack into the same artifact.
    #[test]
    fn repacking_normalizes_what_was_read() {
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

        let first = pack(&read_tar_gz(&gzip(&one, 0, ""), MAX).unwrap()).unwrap();
        let second =
            pack(&read_tar_gz(&gzip(&two, 1_700_000_000, "upstream.tar"), MAX).unwrap()).unwrap();
        let third = pack(&read_tar(two.as_slice(), MAX).unwrap()).unwrap();
        assert_eq!(first, second);
        assert_eq!(first, third);
        assert_eq!(listing(&first.bytes).len(), 4);
    }

    #[test]
    fn keeps_the_execute_bit() {
        let mut script = Raw::file("run.sh", b"#!/bin/sh\n");
        script.mode = 0o700;
        let files = read_tgz(&[script]).unwrap();
        assert!(files[0].executable);
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
