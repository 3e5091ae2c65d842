//! Embeds the graph files: writes `$OUT_DIR/embedded_graphs.rs`, an array of
//! (path relative to `graphs/`, text) for every `.ron` under `graphs/`, so that adding a block
//! template needs no code change. (CUDA kernel sources under `kernels/` will be embedded the same
//! way with the CUDA executor.)

use std::path::{Path, PathBuf};

fn ron_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("graphs/ exists")
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            ron_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "ron") {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let graphs = root.join("graphs");
    println!("cargo:rerun-if-changed=graphs");
    let mut files = Vec::new();
    ron_files(&graphs, &mut files);
    let mut code = String::from("&[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f
            .strip_prefix(&graphs)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        code.push_str(&format!(
            "    ({rel:?}, include_str!({:?})),\n",
            f.display().to_string()
        ));
    }
    code.push_str("]\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("embedded_graphs.rs");
    std::fs::write(out, code).unwrap();
}
