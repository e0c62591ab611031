//! Archives for the tests of this module: raw tar entries (names written
//! byte for byte, so unsafe ones can be made), gzip and listings.

use std::io::{Read, Write};

use flate2::{read::MultiGzDecoder, Compression, GzBuilder};
use tar::{EntryType, Header};

pub const MAX: u64 = 1 << 20;

/// A raw tar entry, written with the given header fields as they are.
pub struct Raw<'a> {
    pub name: &'a str,
    pub kind: EntryType,
    pub data: &'a [u8],
    pub link: &'a str,
    pub mode: u32,
    pub mtime: u64,
    pub uid: u64,
    pub owner: &'a str,
}

impl<'a> Raw<'a> {
    pub fn file(name: &'a str, data: &'a [u8]) -> Self {
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

    pub fn link(name: &'a str, kind: EntryType, target: &'a str) -> Self {
        Raw {
            link: target,
            kind,
            ..Raw::file(name, b"")
        }
    }

    pub fn dir(name: &'a str) -> Self {
        Raw {
            kind: EntryType::Directory,
            mode: 0o700,
            ..Raw::file(name, b"")
        }
    }
}

pub fn tar_of(entries: &[Raw]) -> Vec<u8> {
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

pub fn gzip(bytes: &[u8], mtime: u32, name: &str) -> Vec<u8> {
    let mut gz = GzBuilder::new()
        .mtime(mtime)
        .filename(name)
        .write(Vec::new(), Compression::best());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// One entry of a tar.gz: path, mode, type, uid, mtime and content.
pub type Listed = (String, u32, EntryType, u64, u64, Vec<u8>);

/// The entries of a tar.gz, in order.
pub fn listing(tgz: &[u8]) -> Vec<Listed> {
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
