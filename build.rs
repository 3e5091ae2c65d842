//! Embeds the data the binary carries, so that adding a file needs no code change:
//! `$OUT_DIR/embedded_graphs.rs` holds (path relative to `graphs/`, text) for every `.ron` under
//! `graphs/`; `$OUT_DIR/embedded_kernels.rs` the same for every `.cu`/`.cuh` under `kernels/`.

use std::path::{Path, PathBuf};

fn files_with(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_with(&p, exts, out);
        } else if p.extension().is_some_and(|e| exts.iter().any(|x| e == *x)) {
            out.push(p);
        }
    }
}

/// Writes `$OUT_DIR/<name>`: a Rust array of (relative path, include_str!(file)).
fn embed(root: &Path, sub: &str, exts: &[&str], name: &str) {
    let dir = root.join(sub);
    println!("cargo:rerun-if-changed={sub}");
    let mut files = Vec::new();
    files_with(&dir, exts, &mut files);
    let mut code = String::from("&[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f
            .strip_prefix(&dir)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        code.push_str(&format!(
            "    ({rel:?}, include_str!({:?})),\n",
            f.display().to_string()
        ));
    }
    code.push_str("]\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join(name);
    std::fs::write(out, code).unwrap();
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    embed(&root, "graphs", &["ron"], "embedded_graphs.rs");
    embed(&root, "kernels", &["cu", "cuh"], "embedded_kernels.rs");
}
