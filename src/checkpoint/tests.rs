//! Tests of the module as a whole: write files, open them, break them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A fresh directory under the system temp dir, removed on drop. Unique per
/// process and per call, so tests may run in parallel and next to other
/// test binaries.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "graphrun-checkpoint-test-{}-{n}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn tensor(name: &str, dtype: DType, shape: &[usize], bytes: Vec<u8>) -> TensorData<'static> {
    TensorData {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        bytes: Cow::Owned(bytes),
    }
}

fn f32_tensor(name: &str, values: &[f32]) -> TensorData<'static> {
    tensor(name, DType::F32, &[values.len()], f32_bytes(values))
}

/// Writes a one-tensor-per-name file.
fn write(path: &Path, tensors: &[TensorData]) {
    write_safetensors(path, tensors, None).unwrap();
}

fn open_err(path: &Path) -> CheckpointError {
    Checkpoint::open_files(&[path.to_path_buf()]).unwrap_err()
}

fn open_dir_err(dir: &Path) -> CheckpointError {
    Checkpoint::open_dir(dir).unwrap_err()
}

#[test]
fn round_trip_every_dtype() {
    let tmp = TempDir::new();
    let path = tmp.join("rt.safetensors");
    let f32s = [
        0.0,
        -0.0,
        1.5,
        -3.25e-7,
        f32::MAX,
        f32::MIN_POSITIVE / 8.0,
        f32::INFINITY,
    ];
    // All exactly representable in bf16 (8 significant bits).
    let bf16s = [
        1.0,
        -2.5,
        0.15625,
        65536.0,
        -0.0078125,
        f32::from_bits(0x7f7f_0000),
    ]; // last: largest finite bf16;
       // All exactly representable in f16 (11 significant bits, min subnormal 2^-24).
    let f16s = [
        0.5,
        -1024.0,
        6.103_515_6e-5,
        65504.0,
        2.0f32.powi(-24),
        1.0009766,
    ];
    let i64s = [i64::MIN, -1, 0, 1, i64::MAX, 1 << 40];
    let i32s: [i32; 3] = [i32::MIN, -7, i32::MAX];

    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let tensors = [
        // Deliberately unsorted: the writer sorts.
        tensor("z.f32", DType::F32, &[7], f32_bytes(&f32s)),
        tensor("a.bf16", DType::BF16, &[2, 3], f32_to_bf16_bytes(&bf16s)),
        tensor("m.f16", DType::F16, &[3, 2], f32_to_f16_bytes(&f16s)),
        tensor("i.i64", DType::I64, &[6], i64_bytes(&i64s)),
        tensor(
            "i.i32",
            DType::I32,
            &[3],
            i32s.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        tensor("scalar", DType::F32, &[], f32_bytes(&[42.0])),
        tensor("empty", DType::F32, &[0, 4], Vec::new()),
    ];
    write_safetensors(&path, &tensors, Some(&meta)).unwrap();

    let ck = Checkpoint::open_files(std::slice::from_ref(&path)).unwrap();
    let names: Vec<&str> = ck.names().collect();
    assert_eq!(
        names,
        ["a.bf16", "empty", "i.i32", "i.i64", "m.f16", "scalar", "z.f32"]
    );
    assert_eq!(ck.files(), std::slice::from_ref(&path));
    assert_eq!(ck.file_metadata(0), Some(&meta));
    assert_eq!(ck.file_metadata(1), None);

    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&ck.to_f32("z.f32").unwrap()), bits(&f32s));
    assert_eq!(bits(&ck.to_f32("a.bf16").unwrap()), bits(&bf16s));
    assert_eq!(bits(&ck.to_f32("m.f16").unwrap()), bits(&f16s));
    assert_eq!(ck.to_i64("i.i64").unwrap(), i64s);
    assert_eq!(
        ck.to_i64("i.i32").unwrap(),
        i32s.iter().map(|&v| i64::from(v)).collect::<Vec<_>>()
    );
    assert_eq!(ck.to_f32("scalar").unwrap(), [42.0]);
    assert!(ck.to_f32("empty").unwrap().is_empty());

    assert_eq!(ck.bytes("i.i64").unwrap(), &i64_bytes(&i64s)[..]);
    assert_eq!(
        ck.info("a.bf16").unwrap(),
        TensorInfo {
            name: "a.bf16".to_string(),
            dtype: DType::BF16,
            shape: vec![2, 3],
            file: path.clone(),
        }
    );
    assert!(ck.contains("m.f16"));
    assert!(!ck.contains("nope"));
    assert!(ck.info("nope").is_none());
    assert_eq!(ck.total_bytes(), 28 + 12 + 12 + 48 + 12 + 4);
}

#[test]
fn large_tensors_convert_in_parallel_exactly() {
    let tmp = TempDir::new();
    let path = tmp.join("big.safetensors");
    // Small integers and halves are exact in bf16.
    let values: Vec<f32> = (0..300_001)
        .map(|i| ((i % 256) as f32 - 128.0) * 0.5)
        .collect();
    write(
        &path,
        &[tensor(
            "w",
            DType::BF16,
            &[values.len()],
            f32_to_bf16_bytes(&values),
        )],
    );
    let ck = Checkpoint::open_files(&[path]).unwrap();
    assert_eq!(ck.to_f32("w").unwrap(), values);
}

#[test]
fn writer_output_is_read_by_the_safetensors_crate_and_back() {
    let tmp = TempDir::new();
    let ours = tmp.join("ours.safetensors");
    write(
        &ours,
        &[
            f32_tensor("b", &[1.0, 2.0]),
            tensor("a", DType::I64, &[1, 1], i64_bytes(&[-5])),
        ],
    );
    let buf = fs::read(&ours).unwrap();
    let st = safetensors::SafeTensors::deserialize(&buf).unwrap();
    let b = st.tensor("b").unwrap();
    assert_eq!(b.dtype(), safetensors::Dtype::F32);
    assert_eq!(b.data(), &f32_bytes(&[1.0, 2.0])[..]);
    assert_eq!(st.tensor("a").unwrap().shape(), [1, 1]);

    // And a file written by the crate opens here.
    let data = f32_to_bf16_bytes(&[0.5, -1.0, 2.0, 4.0]);
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![2, 2], &data).unwrap();
    let theirs = tmp.join("theirs.safetensors");
    fs::write(
        &theirs,
        safetensors::serialize([("x", view)], None).unwrap(),
    )
    .unwrap();
    let ck = Checkpoint::open_files(&[theirs]).unwrap();
    assert_eq!(ck.to_f32("x").unwrap(), [0.5, -1.0, 2.0, 4.0]);
}

#[test]
fn rewriting_a_mapped_file_leaves_the_open_checkpoint_intact() {
    let tmp = TempDir::new();
    let path = tmp.join("w.safetensors");
    write(&path, &[f32_tensor("w", &[1.0, 2.0])]);
    let old = Checkpoint::open_files(std::slice::from_ref(&path)).unwrap();
    write(&path, &[f32_tensor("w", &[3.0])]);
    assert_eq!(old.to_f32("w").unwrap(), [1.0, 2.0]);
    let new = Checkpoint::open_files(&[path]).unwrap();
    assert_eq!(new.to_f32("w").unwrap(), [3.0]);
}

#[test]
fn open_dir_single_file_wins() {
    let tmp = TempDir::new();
    write(&tmp.join(SINGLE_FILE), &[f32_tensor("w", &[1.0])]);
    // A stray file that must not be picked up next to model.safetensors.
    write(&tmp.join("other.safetensors"), &[f32_tensor("w", &[2.0])]);
    let ck = Checkpoint::open_dir(&tmp.0).unwrap();
    assert_eq!(ck.files(), [tmp.join(SINGLE_FILE)]);
    assert_eq!(ck.to_f32("w").unwrap(), [1.0]);
}

/// Writes three shards and their index; returns the shard paths.
fn write_shards(tmp: &TempDir) -> Vec<PathBuf> {
    let mut weight_map = BTreeMap::new();
    let mut paths = Vec::new();
    let mut total = 0;
    for i in 1..=3 {
        let name = format!("model-{i:05}-of-00003.safetensors");
        let tensors = [
            f32_tensor(&format!("layers.{i}.w"), &[i as f32; 4]),
            tensor(
                &format!("layers.{i}.ids"),
                DType::I64,
                &[2],
                i64_bytes(&[i, -i]),
            ),
        ];
        for t in &tensors {
            weight_map.insert(t.name.clone(), name.clone());
            total += t.bytes.len() as u64;
        }
        let path = tmp.join(&name);
        write(&path, &tensors);
        paths.push(path);
    }
    write_index(&tmp.join(INDEX_FILE), &weight_map, total).unwrap();
    paths
}

#[test]
fn open_dir_sharded_with_index() {
    let tmp = TempDir::new();
    let shards = write_shards(&tmp);
    // Not listed in the index, so not opened (it even clashes by name).
    write(
        &tmp.join("stray.safetensors"),
        &[f32_tensor("layers.1.w", &[0.0])],
    );

    let ck = Checkpoint::open_dir(&tmp.0).unwrap();
    assert_eq!(ck.files(), &shards[..]);
    assert_eq!(ck.names().count(), 6);
    assert_eq!(ck.info("layers.2.w").unwrap().file, shards[1]);
    assert_eq!(ck.to_f32("layers.3.w").unwrap(), [3.0; 4]);
    assert_eq!(ck.to_i64("layers.2.ids").unwrap(), [2, -2]);
    assert_eq!(ck.total_bytes(), 3 * (16 + 16));

    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(tmp.join(INDEX_FILE)).unwrap()).unwrap();
    assert_eq!(index["metadata"]["total_size"], 96);
    assert_eq!(
        index["weight_map"]["layers.1.ids"],
        "model-00001-of-00003.safetensors"
    );
}

#[test]
fn open_dir_without_index_takes_every_safetensors_file() {
    let tmp = TempDir::new();
    write(&tmp.join("b.safetensors"), &[f32_tensor("y", &[2.0])]);
    write(&tmp.join("a.safetensors"), &[f32_tensor("x", &[1.0])]);
    fs::write(tmp.join("notes.txt"), "not a checkpoint").unwrap();
    let ck = Checkpoint::open_dir(&tmp.0).unwrap();
    assert_eq!(
        ck.files(),
        [tmp.join("a.safetensors"), tmp.join("b.safetensors")]
    );
    assert_eq!(ck.names().collect::<Vec<_>>(), ["x", "y"]);
}

#[test]
fn error_missing_dir_and_not_a_dir() {
    let tmp = TempDir::new();
    let missing = tmp.join("nope");
    assert_eq!(
        open_dir_err(&missing).to_string(),
        format!("checkpoint {}: directory does not exist", missing.display())
    );
    let file = tmp.join("file");
    fs::write(&file, "x").unwrap();
    assert!(matches!(
        open_dir_err(&file),
        CheckpointError::BadDir {
            reason: "not a directory",
            ..
        }
    ));
}

#[test]
fn error_no_safetensors_files() {
    let tmp = TempDir::new();
    fs::write(tmp.join("config.json"), "{}").unwrap();
    let e = open_dir_err(&tmp.0);
    assert!(matches!(e, CheckpointError::NoSafetensors { .. }), "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "checkpoint {}: no safetensors files",
            tmp.0.display()
        )),
        "{e}"
    );
    assert!(matches!(
        Checkpoint::open_files(&[]),
        Err(CheckpointError::NoFilesGiven)
    ));
}

#[test]
fn error_missing_file_is_io_error_naming_it() {
    let tmp = TempDir::new();
    let path = tmp.join("gone.safetensors");
    let e = open_err(&path);
    assert!(
        e.to_string()
            .starts_with(&format!("checkpoint {}: cannot open file", path.display())),
        "{e}"
    );
}

#[test]
fn error_truncated_data() {
    let tmp = TempDir::new();
    let path = tmp.join("model-00002-of-00003.safetensors");
    write(
        &path,
        &[f32_tensor("a", &[1.0; 4]), f32_tensor("b", &[2.0; 4])],
    );
    let full = fs::read(&path).unwrap();
    fs::write(&path, &full[..full.len() - 3]).unwrap();
    assert_eq!(
        open_err(&path).to_string(),
        format!(
            "checkpoint {}: file is truncated: tensor b needs bytes [16,32) \
             but the data section has only 29 bytes",
            path.display()
        )
    );
}

#[test]
fn error_corrupt_header_bytes() {
    let tmp = TempDir::new();
    let path = tmp.join("c.safetensors");
    write(&path, &[f32_tensor("a", &[1.0])]);
    let good = fs::read(&path).unwrap();

    // A byte that cannot occur in UTF-8.
    let mut bad = good.clone();
    bad[10] = 0xff;
    fs::write(&path, &bad).unwrap();
    let e = open_err(&path).to_string();
    assert!(
        e.starts_with(&format!(
            "checkpoint {}: truncated or corrupt header: header is not valid UTF-8",
            path.display()
        )),
        "{e}"
    );

    // Valid UTF-8, but not JSON.
    let mut bad = good.clone();
    bad[8] = b'#';
    fs::write(&path, &bad).unwrap();
    let e = open_err(&path).to_string();
    assert!(e.contains("header is not a valid JSON object"), "{e}");

    // A corrupted dtype string is not an error: it is kept as `Other` (and,
    // being of unknown size, not size-checked), so the bytes stay readable.
    let mut bad = good.clone();
    let at = bad.windows(3).position(|w| w == b"F32").unwrap();
    bad[at] = b'X';
    fs::write(&path, &bad).unwrap();
    let ck = Checkpoint::open_files(std::slice::from_ref(&path)).unwrap();
    assert_eq!(ck.info("a").unwrap().dtype, DType::Other("X32".to_string()));
    assert_eq!(ck.bytes("a").unwrap(), f32_bytes(&[1.0]));
}

#[test]
fn error_header_length_larger_than_file() {
    let tmp = TempDir::new();
    let path = tmp.join("h.safetensors");
    write(&path, &[f32_tensor("a", &[1.0])]);
    let mut bytes = fs::read(&path).unwrap();
    let rest = bytes.len() - 8;
    bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        open_err(&path).to_string(),
        format!(
            "checkpoint {}: truncated or corrupt header: header length is {} bytes \
             but only {rest} bytes follow the length prefix",
            path.display(),
            1u64 << 40
        )
    );
    // u64::MAX must not overflow anything either.
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    assert!(open_err(&path)
        .to_string()
        .contains("truncated or corrupt header"));
}

#[test]
fn error_tiny_files() {
    let tmp = TempDir::new();
    for len in [0, 3] {
        let path = tmp.join(&format!("tiny{len}.safetensors"));
        fs::write(&path, vec![1u8; len]).unwrap();
        assert_eq!(
            open_err(&path).to_string(),
            format!(
                "checkpoint {}: file is only {len} bytes, shorter than the 8-byte header length prefix",
                path.display()
            )
        );
    }
}

#[test]
fn error_index_bad_json() {
    let tmp = TempDir::new();
    let index = tmp.join(INDEX_FILE);
    fs::write(
        &index,
        "{\n  \"weight_map\": {\n    \"a\": \"x.safetensors\",\n  }\n}\n",
    )
    .unwrap();
    let e = open_dir_err(&tmp.0);
    let CheckpointError::IndexJson {
        ref path,
        line,
        column,
        ..
    } = e
    else {
        panic!("wrong error: {e}");
    };
    assert_eq!((path, line, column), (&index, 4, 3));
    assert_eq!(
        e.to_string(),
        format!(
            "checkpoint {}: malformed index (line 4, column 3): trailing comma",
            index.display()
        )
    );

    // Valid JSON without a weight_map is malformed too.
    fs::write(&index, "{\"metadata\": {}}").unwrap();
    let e = open_dir_err(&tmp.0).to_string();
    assert!(e.contains("missing field `weight_map`"), "{e}");
}

#[test]
fn error_index_names_missing_shard() {
    let tmp = TempDir::new();
    let shards = write_shards(&tmp);
    fs::remove_file(&shards[2]).unwrap();
    let e = open_dir_err(&tmp.0);
    assert_eq!(
        e.to_string(),
        format!(
            "checkpoint {}: index names shard model-00003-of-00003.safetensors, \
             which does not exist ({})",
            tmp.join(INDEX_FILE).display(),
            shards[2].display()
        )
    );
}

#[test]
fn error_index_lists_tensor_absent_from_its_shard() {
    let tmp = TempDir::new();
    let shards = write_shards(&tmp);
    // Rewrite shard 2 without one of its tensors.
    write(&shards[1], &[f32_tensor("layers.2.w", &[2.0; 4])]);
    let e = open_dir_err(&tmp.0);
    assert_eq!(
        e.to_string(),
        format!(
            "checkpoint {}: tensor layers.2.ids is listed in {} but absent from this shard",
            shards[1].display(),
            tmp.join(INDEX_FILE).display()
        )
    );

    // Present, but in a different shard than the index says.
    let tmp = TempDir::new();
    let shards = write_shards(&tmp);
    write(&shards[0], &[f32_tensor("layers.1.w", &[1.0; 4])]);
    write(
        &shards[1],
        &[
            f32_tensor("layers.2.w", &[2.0; 4]),
            tensor("layers.2.ids", DType::I64, &[2], i64_bytes(&[2, -2])),
            tensor("layers.1.ids", DType::I64, &[2], i64_bytes(&[1, -1])),
        ],
    );
    assert!(matches!(
        open_dir_err(&tmp.0),
        CheckpointError::IndexMissingTensor { ref tensor, ref path, .. }
            if tensor == "layers.1.ids" && *path == shards[0]
    ));
}

#[test]
fn error_duplicate_tensor_in_two_files() {
    let tmp = TempDir::new();
    let a = tmp.join("a.safetensors");
    let b = tmp.join("b.safetensors");
    write(&a, &[f32_tensor("w", &[1.0]), f32_tensor("x", &[1.0])]);
    write(&b, &[f32_tensor("w", &[2.0])]);
    assert_eq!(
        open_dir_err(&tmp.0).to_string(),
        format!(
            "checkpoint {}: tensor w is also in {}",
            b.display(),
            a.display()
        )
    );

    // Same through an index that (wrongly) lists both shards.
    let tmp = TempDir::new();
    let shards = write_shards(&tmp);
    write(
        &shards[2],
        &[
            f32_tensor("layers.3.w", &[3.0; 4]),
            tensor("layers.3.ids", DType::I64, &[2], i64_bytes(&[3, -3])),
            f32_tensor("layers.1.w", &[9.0; 4]),
        ],
    );
    assert!(matches!(
        open_dir_err(&tmp.0),
        CheckpointError::DuplicateTensor { ref tensor, ref path, ref other }
            if tensor == "layers.1.w" && *path == shards[2] && *other == shards[0]
    ));
}

#[test]
fn error_dtype_mismatch_on_conversion() {
    let tmp = TempDir::new();
    let path = tmp.join("d.safetensors");
    write(
        &path,
        &[
            tensor("ids", DType::I64, &[1], i64_bytes(&[3])),
            tensor("w", DType::F32, &[1], f32_bytes(&[1.0])),
            tensor("mask", DType::U8, &[2], vec![0, 1]),
            tensor("fp8", DType::Other("F8_E4M3".to_string()), &[2], vec![0, 1]),
        ],
    );
    let ck = Checkpoint::open_files(std::slice::from_ref(&path)).unwrap();
    assert_eq!(
        ck.to_f32("ids").unwrap_err().to_string(),
        format!(
            "checkpoint {}: tensor ids has dtype i64, which cannot be converted to f32",
            path.display()
        )
    );
    assert!(matches!(
        ck.to_i64("w"),
        Err(CheckpointError::UnsupportedDtype {
            dtype: DType::F32,
            wanted: "i64",
            ..
        })
    ));
    assert!(ck.to_f32("mask").is_err());
    assert!(ck
        .to_f32("fp8")
        .unwrap_err()
        .to_string()
        .contains("tensor fp8 has dtype F8_E4M3"));
    assert_eq!(ck.bytes("mask").unwrap(), [0, 1]);
    assert_eq!(
        ck.bytes("missing").unwrap_err().to_string(),
        "checkpoint: no tensor named \"missing\""
    );
}

#[test]
fn check_finite_names_the_tensor_and_its_first_bad_element() {
    let tmp = TempDir::new();
    let path = tmp.join("nan.safetensors");
    let mut bad = vec![0.5f32; 12];
    bad[7] = f32::NAN;
    bad[9] = f32::INFINITY;
    write(
        &path,
        &[
            tensor("bad", DType::BF16, &[3, 4], f32_to_bf16_bytes(&bad)),
            f32_tensor("good", &[1.0, -2.0]),
            tensor("ids", DType::I64, &[2], i64_bytes(&[-1, i64::MAX])),
        ],
    );
    let ck = Checkpoint::open_files(std::slice::from_ref(&path)).unwrap();
    ck.check_finite("good").unwrap();
    ck.check_finite("ids").unwrap();
    let err = ck.check_finite("bad").unwrap_err();
    assert!(
        matches!(&err, CheckpointError::NonFinite { tensor, found, .. }
            if tensor == "bad" && found.first_index == 7 && found.count == 2),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "checkpoint {}: tensor bad (bf16 [3, 4]) holds 2 non-finite value(s), the first NaN at element 7 ([1, 3])",
            path.display()
        )
    );
    assert!(matches!(
        ck.check_finite("nope"),
        Err(CheckpointError::NoSuchTensor(_))
    ));
}

#[test]
fn names_with_prefix_is_exact_and_sorted() {
    let tmp = TempDir::new();
    let path = tmp.join("p.safetensors");
    write(
        &path,
        &["a.1", "a.10", "a.2", "a", "ab.1", "b.1"].map(|n| f32_tensor(n, &[0.0])),
    );
    let ck = Checkpoint::open_files(&[path]).unwrap();
    let found: Vec<&str> = ck.names_with_prefix("a.").collect();
    assert_eq!(found, ["a.1", "a.10", "a.2"]);
    assert_eq!(ck.names_with_prefix("c").count(), 0);
    assert_eq!(ck.names_with_prefix("").count(), 6);
    assert_eq!(ck.len(), 6);
}

#[test]
fn read_header_matches_what_opening_the_file_sees() {
    let tmp = TempDir::new();
    let path = tmp.join("h.safetensors");
    write(
        &path,
        &[f32_tensor("w", &[1.0, 2.0]), f32_tensor("v", &[3.0])],
    );
    let image = fs::read(&path).unwrap();
    let infos = read_header(&path, &image).unwrap();
    let ck = Checkpoint::open_files(std::slice::from_ref(&path)).unwrap();
    for info in &infos {
        assert_eq!(Some(info.clone()), ck.info(&info.name));
    }
    assert_eq!(infos.len(), 2);
    let err = read_header(&path, &image[..image.len() - 1]).unwrap_err();
    assert!(matches!(err, CheckpointError::Truncated { .. }), "{err:?}");
}
