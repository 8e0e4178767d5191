use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

/// The workspace root (the directory holding `Cargo.lock`): the parent of the crate under test
/// (cargo names it to tests and benches when they run), else of the directory this crate was
/// built in (a clone that reuses another clone's build directory would find that one's files).
pub fn workspace_root() -> PathBuf {
    let here = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    here.parent().expect("every crate sits one level below the workspace root").to_path_buf()
}

/// A bundled sample dataset under `testdata/lerobot/`.
pub fn testdata(name: &str) -> PathBuf {
    let p = workspace_root().join("testdata/lerobot").join(name);
    assert!(p.join("meta/info.json").is_file(), "bundled dataset {} is missing", p.display());
    p
}

/// The shared data directory with real third-party datasets (`lerobot-real/`) and LeRobot's
/// reference dumps (`fixtures/reference/`): `$LAKE_SHARED_DIR`, else `../shared` next to the
/// workspace.
///
/// # Panics
/// With a message saying how to provide it, when it does not exist.
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("LAKE_SHARED_DIR").map_or_else(|| workspace_root().join("../shared"), PathBuf::from);
    assert!(
        dir.join("lerobot-real").is_dir(),
        "shared test data not found at {}: these tests read real LeRobot datasets from `lerobot-real/` there; \
         set LAKE_SHARED_DIR to the directory that holds it",
        dir.display()
    );
    dir
}

/// Copies a directory tree (files are copied, not linked, so tests may change them).
///
/// # Panics
/// On I/O errors.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap_or_else(|e| panic!("create {}: {e}", dst.display()));
    for entry in std::fs::read_dir(src).unwrap_or_else(|e| panic!("read {}: {e}", src.display())) {
        let entry = entry.expect("dir entry");
        let to = dst.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
            let mut perms = std::fs::metadata(&to).expect("metadata").permissions();
            #[allow(clippy::permissions_set_readonly_false)] // copies of read-only fixtures must be writable
            perms.set_readonly(false);
            std::fs::set_permissions(&to, perms).expect("make writable");
        }
    }
}

/// Every path under `dir` (directories too) with a BLAKE3 of each file's bytes: two equal
/// snapshots mean the tree is byte for byte the same. Paths starting with any of `exclude`
/// (relative, `/`-separated) are left out.
pub fn snapshot(dir: &Path, exclude: &[&str]) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, exclude: &[&str], out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(root).expect("under root").to_string_lossy().replace('\\', "/");
            if exclude.iter().any(|e| rel.starts_with(e)) {
                continue;
            }
            if path.is_dir() {
                out.insert(format!("{rel}/"), "dir".into());
                walk(root, &path, exclude, out);
            } else {
                let bytes = std::fs::read(&path).unwrap_or_default();
                out.insert(rel, blake3::hash(&bytes).to_hex().to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, exclude, &mut out);
    out
}

/// The snapshot of a lake's committed state: everything except in-flight staging leases and
/// data directories that no commit record refers to (what a killed ingest leaves behind until
/// the next ingest collects it).
pub fn committed_snapshot(lake: &Path) -> BTreeMap<String, String> {
    let mut referenced = Vec::new();
    for rec in snapshot(&lake.join("catalog"), &[]).keys().filter(|k| k.ends_with(".json")) {
        let text = std::fs::read_to_string(lake.join("catalog").join(rec)).expect("record");
        let v: serde_json::Value = serde_json::from_str(&text).expect("record json");
        referenced.push(format!("{}/", v["tables"]["dir"].as_str().expect("tables.dir")));
    }
    snapshot(lake, &["staging"])
        .into_iter()
        .filter(|(k, _)| !k.starts_with("datasets/") || referenced.iter().any(|r| k.starts_with(r.as_str()) || r.starts_with(k.as_str())))
        .collect()
}

/// Runs the `ffmpeg` command line tool (used to make test media).
///
/// # Panics
/// When ffmpeg is not installed (`scripts/setup.sh` installs it) or fails.
pub fn ffmpeg(args: &[&str]) {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ffmpeg ({e}); scripts/setup.sh installs it"));
    assert!(out.status.success(), "ffmpeg {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A working directory for a benchmark: a fresh temporary directory removed when the returned
/// guard drops, or, when `LAKE_BENCH_DIR` is set, a new directory inside it that is kept for a
/// look afterwards (the guard is then `None`).
///
/// # Panics
/// When the directory cannot be made.
pub fn bench_workdir() -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("LAKE_BENCH_DIR") {
        Some(dir) => (None, tempfile::Builder::new().prefix("lake-bench-").tempdir_in(dir).expect("bench dir").keep()),
        None => {
            let t = tempfile::tempdir().expect("tmp");
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    }
}

/// Runs the `lake` binary `bin` on the lake at `root` and returns what it printed.
///
/// # Panics
/// When it cannot start or fails (with its stderr).
pub fn run_lake(bin: &Path, root: &Path, args: &[&str]) -> String {
    let out = Command::new(bin).arg("--lake").arg(root).args(args).output().expect("run lake");
    assert!(out.status.success(), "lake {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A benchmark's lake (in [`bench_workdir`]) holding the bundled `v30-av1-small` sample repeated
/// `repeats` times (600 steps each), ingested by `bin` as dataset `bench`. Returns the work
/// directory's guard and the lake root.
///
/// # Panics
/// When the data cannot be made or ingested.
pub fn bench_lake(bin: &Path, repeats: usize) -> (Option<tempfile::TempDir>, PathBuf) {
    let (guard, work) = bench_workdir();
    let src = work.join(format!("av1-small-x{repeats}"));
    crate::repeat_dataset(&testdata("v30-av1-small"), &src, repeats);
    let root = work.join("lake");
    run_lake(bin, &root, &["ingest", src.to_str().expect("utf-8"), "--name", "bench"]);
    (guard, root)
}
