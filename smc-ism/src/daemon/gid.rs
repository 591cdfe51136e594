//! The persistent device GID.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::client::Gid;
use crate::error::IsmError;
use crate::sys;

fn setup<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> IsmError + 'a {
    move |source| IsmError::Setup {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Reads `state_dir/gid`, or creates it once with a random version-4 UUID. Two daemons racing
/// to create it agree on one value (`link(2)` of a complete temporary file never overwrites).
/// A corrupt file is moved aside to `gid.corrupt` and replaced.
pub(crate) fn load_or_create(state_dir: &Path) -> Result<Gid, IsmError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(state_dir)
        .map_err(setup("creating state directory", state_dir))?;
    let path = state_dir.join("gid");
    for _ in 0..4 {
        match fs::read_to_string(&path) {
            Ok(s) => match Gid::parse(&s) {
                Some(g) if g != Gid::default() => return Ok(g),
                _ => {
                    #[cfg(feature = "daemon")]
                    log::warn!("{}: corrupt GID file, replacing it", path.display());
                    let _ = fs::rename(&path, state_dir.join("gid.corrupt"));
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(setup("reading", &path)(e)),
        }
        let mut b = [0u8; 16];
        sys::random_bytes(&mut b).map_err(setup("getrandom for", &path))?;
        b[6] = (b[6] & 0x0f) | 0x40; // version 4
        b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
        let gid = Gid::from_bytes(b);
        let tmp = state_dir.join(format!(".gid.{}.tmp", std::process::id()));
        let _ = fs::remove_file(&tmp);
        {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)
                .map_err(setup("creating", &tmp))?;
            writeln!(f, "{gid}").map_err(setup("writing", &tmp))?;
            f.sync_all().map_err(setup("syncing", &tmp))?;
        }
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                if let Ok(d) = fs::File::open(state_dir) {
                    let _ = d.sync_all();
                }
                return Ok(gid);
            }
            // Somebody else created it first: loop and read theirs.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(setup("linking", &path)(e)),
        }
    }
    Err(IsmError::Config(format!(
        "{}: could not read or create the GID file",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persists() {
        let dir = std::env::temp_dir().join(format!("smc-ism-gid-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = load_or_create(&dir).unwrap();
        let b = load_or_create(&dir).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, Gid::default());
        fs::write(dir.join("gid"), "garbage").unwrap();
        let c = load_or_create(&dir).unwrap();
        assert_ne!(c, a);
        assert!(dir.join("gid.corrupt").exists());
        assert_eq!(load_or_create(&dir).unwrap(), c);
        fs::remove_dir_all(&dir).unwrap();
    }
}
