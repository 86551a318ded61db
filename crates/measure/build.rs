//! Records the git commit the crate is built from as `DS4_GIT_COMMIT` (read by
//! `receipt::BUILD_GIT_COMMIT`). An explicit `DS4_GIT_COMMIT` in the build
//! environment wins; without git or a repository nothing is set.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=DS4_GIT_COMMIT");
    if std::env::var_os("DS4_GIT_COMMIT").is_some() {
        return; // passed through by rustc's environment as is
    }
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) else {
        return;
    };
    let git_dir = PathBuf::from(git_dir);
    for p in ["HEAD", "refs/heads", "packed-refs"] {
        println!("cargo:rerun-if-changed={}", git_dir.join(p).display());
    }
    if let Some(commit) = git(&["rev-parse", "HEAD"]).filter(|c| c.len() == 40) {
        println!("cargo:rustc-env=DS4_GIT_COMMIT={commit}");
    }
}
