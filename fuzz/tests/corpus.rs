//! Every fuzz target, on the stable toolchain and without libFuzzer, over
//! its saved inputs: the seed corpus `seeds/TARGET/` (minimised by
//! cargo-fuzz from a run of `scripts/fuzz`) and the inputs that once
//! failed, `regressions/TARGET/`. A saved input that panics fails the test,
//! naming the file. And the targets are named alike everywhere
//! (`tether_fuzz::TARGETS`, the `[[bin]]`s of Cargo.toml, `fuzz_targets/`,
//! `seeds/`, `regressions/`, the modules of `src/`), so a target added
//! later cannot be left out of CI.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tether_fuzz::TARGETS;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `(name, path)` of every `[[bin]]` in Cargo.toml.
fn bins() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut bins = Vec::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
            if in_bin {
                bins.push((String::new(), String::new()));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let value = value.trim().trim_matches('"').to_string();
        match (in_bin, key.trim(), bins.last_mut()) {
            (true, "name", Some(bin)) => bin.0 = value,
            (true, "path", Some(bin)) => bin.1 = value,
            _ => {}
        }
    }
    bins
}

/// The names in `dir` (none if it does not exist), sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = read.map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths
}

#[test]
fn every_target_is_named_everywhere() {
    let targets: BTreeSet<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(targets.len(), TARGETS.len(), "a target listed twice in src/lib.rs");
    let bins = bins();
    let names: BTreeSet<&str> = bins.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, targets, "the [[bin]]s of Cargo.toml and the targets of src/lib.rs differ");
    for (name, path) in &bins {
        assert_eq!(path, &format!("fuzz_targets/{name}.rs"), "[[bin]] {name}");
        let source = std::fs::read_to_string(root().join(path)).unwrap();
        assert!(
            source.contains(&format!("tether_fuzz::{name}::run(")),
            "{path} does not run tether_fuzz::{name}::run, which the replay runs"
        );
    }
    for file in entries(&root().join("fuzz_targets")) {
        let stem = file.file_stem().unwrap().to_str().unwrap();
        assert!(targets.contains(stem), "{} is no [[bin]] of Cargo.toml", file.display());
    }
    for file in entries(&root().join("src")) {
        let stem = file.file_stem().unwrap().to_str().unwrap();
        assert!(stem == "lib" || targets.contains(stem), "{} is not in tether_fuzz::TARGETS", file.display());
    }
    for name in &targets {
        let seeds = root().join("seeds").join(name);
        assert!(
            entries(&seeds).iter().any(|p| p.is_file()),
            "no seed corpus in {} (fuzz/seeds/README.md says how to make one)",
            seeds.display()
        );
    }
    // A directory for a target renamed or gone would not be replayed.
    for dir in ["seeds", "regressions"] {
        for path in entries(&root().join(dir)).iter().filter(|p| p.is_dir()) {
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(targets.contains(name), "{} names no fuzz target", path.display());
        }
    }
}

#[test]
// The wall clock times the replay of each target; nothing here is sans-IO.
#[allow(clippy::disallowed_methods)]
fn saved_inputs_replay() {
    let mut failed = Vec::new();
    for &(name, run) in TARGETS {
        let start = Instant::now();
        let mut count = 0;
        for dir in ["seeds", "regressions"] {
            for path in entries(&root().join(dir).join(name)).iter().filter(|p| p.is_file()) {
                let data = std::fs::read(path).unwrap();
                count += 1;
                if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
                    failed.push(format!("fuzz/{dir}/{name}/{}", path.file_name().unwrap().to_string_lossy()));
                }
            }
        }
        eprintln!("{name}: {count} inputs in {:.2?}", start.elapsed());
    }
    assert!(
        failed.is_empty(),
        "{} saved inputs failed (replay one under libFuzzer with `cargo fuzz run TARGET FILE`): {failed:#?}",
        failed.len()
    );
}
