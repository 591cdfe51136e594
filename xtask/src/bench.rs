//! `cargo xtask bench`: placeholder replaced below.
use std::path::Path;

use anyhow::Result;

pub fn run(_root: &Path, _quick: bool) -> Result<()> {
    Ok(())
}
