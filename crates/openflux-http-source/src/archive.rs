//! Turning a fetched body into a normalized, content-addressed artifact.
//!
//! Pure functions over bytes: no I/O. The body is a tar.gz (or plain tar) of
//! manifests, or a single YAML file. Reading untrusted archives and packing
//! them deterministically is the producer kit's (`openflux_api::producer`):
//! this module only tells the formats apart and wraps a single YAML file.

use openflux_api::producer::archive::{pack, ArchiveError, File, IgnoreRules, Packed};
use openflux_api::producer::unpack;

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
    pack(&kept)
}

/// Reads the files of a fetched body, validating it.
pub fn read_files(body: &[u8], url_path: &str, max_size: u64) -> Result<Vec<File>, ArchiveError> {
    match detect(body) {
        Format::TarGz => unpack::read_tar_gz(body, max_size),
        Format::Tar => unpack::read_tar(body, max_size),
        Format::Yaml => {
            if body.len() as u64 > max_size {
                return Err(unpack::too_large(max_size));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    const MAX: u64 = 1 << 20;

    fn no_ignore() -> IgnoreRules {
        IgnoreRules::none()
    }

    fn file(path: &str, data: &[u8]) -> File {
        File {
            path: path.into(),
            executable: false,
            data: data.to_vec(),
        }
    }

    fn paths(packed: &Packed) -> Vec<String> {
        unpack::read_tar_gz(&packed.bytes, MAX)
            .unwrap()
            .into_iter()
            .map(|f| f.path)
            .collect()
    }

    #[test]
    fn tells_the_formats_apart() {
        let tgz = pack(&[file("a.yaml", b"kind: A\n")]).unwrap().bytes;
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(tgz.as_slice())
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(detect(&tgz), Format::TarGz);
        assert_eq!(detect(&tar), Format::Tar);
        assert_eq!(detect(b"kind: A\n"), Format::Yaml);
        // The same files give the same artifact, compressed or not.
        let from_tgz = build(&tgz, "/a.tgz", &no_ignore(), MAX).unwrap();
        let from_tar = build(&tar, "/a.tar", &no_ignore(), MAX).unwrap();
        assert_eq!(from_tgz, from_tar);
        assert_eq!(from_tgz.bytes, tgz);
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
    fn rejects_an_oversized_yaml_file() {
        let big = vec![b'a'; 4096];
        let result = build(&big, "/big.yaml", &no_ignore(), 1024);
        assert!(
            matches!(&result, Err(ArchiveError::Rejected(m)) if m.contains("maximum size of 1024")),
            "{result:?}"
        );
    }

    #[test]
    fn wraps_a_single_yaml_file() {
        let yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n";
        let packed = build(yaml, "/releases/v1/install.yaml", &no_ignore(), MAX).unwrap();
        assert_eq!(packed, pack(&[file("install.yaml", yaml)]).unwrap());
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
        let body = pack(&[
            file("README.md", b"x"),
            file("keep.md", b"x"),
            file("app/deploy.yaml", b"kind: A\n"),
            file("app/NOTES.md", b"x"),
            file("tests/t.yaml", b"kind: T\n"),
            file("app/tests/t.yaml", b"kind: T\n"),
        ])
        .unwrap()
        .bytes;
        let packed = build(&body, "/a.tgz", &rules, MAX).unwrap();
        assert_eq!(
            paths(&packed),
            ["app/deploy.yaml", "app/tests/t.yaml", "keep.md"]
        );
        assert_eq!(packed.files, 3);
    }
}
