//! `include/tether.h` is what cbindgen makes of `src/lib.rs` now: the
//! header a C program compiles against never drifts from the library it
//! links. `TETHER_BLESS=1 cargo test -p tether-c --test header` writes it.

use std::path::Path;

#[test]
fn the_committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads src/lib.rs");
    let mut made = Vec::new();
    bindings.write(&mut made);
    let path = dir.join("include/tether.h");
    if std::env::var_os("TETHER_BLESS").is_some() {
        std::fs::write(&path, &made).expect("write include/tether.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == made,
        "include/tether.h is not what cbindgen makes of src/lib.rs: run `TETHER_BLESS=1 cargo test -p tether-c --test header`"
    );
}
