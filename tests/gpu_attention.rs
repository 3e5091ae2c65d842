//! RoPE, the QSA indexer's selection and attention on the device (`kernels/attention.cu`)
//! against the CPU reference (`ops::rope`, `ops::indexer`, `ops::attention`), carried across
//! several steps the way `exec::cpu` carries its states (raw keys appended, pooled block keys
//! cached, k/v appended before attending): at tiny shapes with rows that are sparse, and at the
//! real Qwen3.8-Flash-Next shapes over a context of ~3000 tokens (sparse from row 2051 on). The
//! indexer alone is also run from filled states (tiny shapes at 9000 tokens; the real shape at
//! 2040, 8k, 70k and 256k tokens: several top-k chunks per row) with steps of 1, 3, 8 and 64
//! rows, and with queries that make every score or half of them tie at 0.
//!
//! Runs where a CUDA device is present (the GPU machine: `scripts/gpu_tests.sh`, logs in
//! `results/`). Elsewhere (CI) it says so and checks nothing else.
//!
//! Bounds: RoPE and attention outputs within 1e-5 relative (‖gpu − cpu‖ / ‖cpu‖, and
//! max |diff| / max |cpu| within 1e-4); selections exactly equal (visible, dense or sparse, the
//! block ids). The GPU computes the pooled keys and the block scores with the reference's
//! roundings, so only a score near-tie at the top-k boundary within an ulp or so of the RoPE
//! angles could flip; a mismatch reports the reference's boundary gap to tell that from a bug.

mod common;

use common::gpu::*;
use cudarc::driver::{sys, CudaSlice};
use graphrun::exec::cuda::device::Buf;
use graphrun::exec::cuda::launch::attention::{
    self as attn, GatedAttentionInputs, GatedAttentionShape,
};
use graphrun::exec::cuda::launch::{self, layout};
use graphrun::exec::cuda::{CudaError, Launch};
use graphrun::ops::attention::{attend, split_q_gate, AttnShape};
use graphrun::ops::elementwise::sigmoid_mul;
use graphrun::ops::indexer::{pool_blocks, select, IndexerShape, RowSel};
use graphrun::ops::rope;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The real model's indexer: 4 heads of 128, rot 64, budget 2048 in blocks of 4.
const REAL_INDEXER: IndexerShape = IndexerShape {
    heads: 4,
    head_dim: 128,
    rotary_dim: 64,
    budget: 2048,
    block: 4,
};

#[test]
fn rope_matches_the_cpu_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0001);
    // (rows, heads, head_dim, rot, theta, start): tiny; the real attention q/k and indexer q at
    // ~3000 tokens and near 256k tokens (large angles), one decode row.
    let cases = [
        (5, 4, 16, 8, 10_000.0, 37),
        (3, 2, 8, 4, 10_000.0, 0),
        (64, 24, 256, 64, 1e7, 2990),
        (64, 2, 256, 64, 1e7, 2990),
        (64, 4, 128, 64, 1e7, 2990),
        (16, 24, 256, 64, 1e7, 262_000),
        (1, 4, 128, 64, 1e7, 3054),
    ];
    for (rows, heads, hd, rot, theta, start) in cases {
        let x = random(&mut rng, rows * heads * hd);
        let dx = gpu.upload(&x, "x").unwrap();
        let step = gpu.upload(&[start as i64], "step").unwrap();
        let got = gpu
            .download(
                &attn::rope(&gpu, &dx, rows, &step, hd, rot, theta).unwrap(),
                "y",
            )
            .unwrap();
        let want = rope::rope(&x, rows, start, hd, rot, theta);
        check(
            "rope_reference_f32",
            &format!("T{rows} {heads}x{hd} rot{rot} @{start}"),
            &got,
            &want,
        );
    }
}

/// `norm_rope_f32` (`Op::NormRope`: each head's RMS norm with 1 + w, then RoPE) against the CPU's
/// two ops, with a per-head weight and a per-row weight, at the real q, k and indexer-q shapes.
#[test]
fn norm_rope_matches_the_cpu_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0002);
    let eps = 1e-6;
    // (rows, heads, head_dim, rot, theta, start, weight per row channel)
    let cases = [
        (5, 4, 16, 8, 10_000.0, 37, false),
        (3, 2, 24, 6, 10_000.0, 0, true),
        (1, 24, 256, 64, 1e7, 3054, false),
        (1, 2, 256, 64, 1e7, 3054, false),
        (1, 4, 128, 64, 1e7, 3054, false),
        (64, 24, 256, 64, 1e7, 2990, false),
        (16, 4, 128, 64, 1e7, 262_000, true),
    ];
    for (rows, heads, hd, rot, theta, start, per_row) in cases {
        let x = random(&mut rng, rows * heads * hd);
        let w = random(&mut rng, if per_row { heads * hd } else { hd });
        let (dx, dw) = (gpu.upload(&x, "x").unwrap(), gpu.upload(&w, "w").unwrap());
        let step = gpu.upload(&[start as i64], "step").unwrap();
        let got = gpu
            .download(
                &attn::norm_rope(&gpu, &dx, &dw, rows, &step, hd, rot, eps, theta).unwrap(),
                "y",
            )
            .unwrap();
        let want = rope::norm_rope(&x, &w, rows, start, hd, rot, eps, theta);
        check(
            "norm_rope_f32",
            &format!("T{rows} {heads}x{hd} rot{rot} @{start} w{}", w.len()),
            &got,
            &want,
        );
    }
    // A weight of neither length is an error naming the kernel.
    let x = gpu.upload(&[1.0f32; 64], "x").unwrap();
    let w = gpu.upload(&[1.0f32; 5], "w").unwrap();
    let step = gpu.upload(&[0i64], "step").unwrap();
    let Err(err) = attn::norm_rope(&gpu, &x, &w, 2, &step, 16, 8, eps, 1e4) else {
        panic!("a norm weight of 5 values was accepted")
    };
    assert!(err.to_string().contains("norm_rope_f32"), "{err}");
}

/// One geometry: attention heads, the indexer, the cache capacity and the steps `(start, rows)`.
struct Geometry {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    indexer: IndexerShape,
    theta: f64,
    eps: f32,
    capacity: usize,
    steps: Vec<(usize, usize)>,
    /// Rows of a step longer than this are checked at a sample of rows (the CPU attends slowly).
    check_all_below: usize,
    /// The attention variants run (each on its own caches) and checked at every step.
    variants: &'static [Variant],
}

/// An attention launcher of `attn` (they share one signature) and its kernel's name.
#[derive(Clone, Copy)]
struct Variant {
    kernel: &'static str,
    launch: AttentionFn,
}

type AttentionFn = fn(
    &Launch,
    &CudaSlice<f32>,
    &CudaSlice<f32>,
    &CudaSlice<f32>,
    &CudaSlice<i32>,
    &mut CudaSlice<f32>,
    &mut CudaSlice<f32>,
    usize,
    &CudaSlice<i64>,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
) -> Result<Buf<f32>, CudaError>;

const REFERENCE: Variant = Variant {
    kernel: "attention_reference_f32",
    launch: attn::attention,
};
const SPLIT: Variant = Variant {
    kernel: "attention_split_f32",
    launch: attn::attention_split,
};

/// The reference's score of every complete block for row `t` (as `ops::indexer::select`).
fn reference_scores(
    q: &[f32],
    pooled: &[f32],
    t: usize,
    complete: usize,
    s: &IndexerShape,
) -> Vec<f32> {
    let d = s.head_dim;
    let q = &q[t * s.heads * d..(t + 1) * s.heads * d];
    (0..complete)
        .map(|b| {
            let kb = &pooled[b * d..(b + 1) * d];
            let sum: f32 = (0..s.heads)
                .map(|h| {
                    let dotp: f32 = q[h * d..(h + 1) * d]
                        .iter()
                        .zip(kb)
                        .map(|(a, b)| a * b)
                        .sum();
                    dotp.max(0.0)
                })
                .sum();
            sum / (d as f32).sqrt()
        })
        .collect()
}

/// The selection as `RowSel`s, checking the format (docs/pipeline.md) on the way.
fn decode_selection(sel: &[i32], rows: usize, keep: usize, block: usize) -> Vec<RowSel> {
    assert_eq!(sel.len(), rows * (2 + keep), "selection length");
    sel.chunks(2 + keep)
        .map(|r| {
            let visible = r[0] as usize;
            if r[1] == -1 {
                assert!(r[2..].iter().all(|&x| x == -1), "dense row padding: {r:?}");
                RowSel::Dense { visible }
            } else {
                assert_eq!(r[1] as usize, keep, "sparse row count");
                RowSel::Sparse {
                    visible,
                    blocks: r[2..].iter().map(|&b| b as usize).collect(),
                    block,
                }
            }
        })
        .collect()
}

/// Asserts the device's selection equal to the reference's row by row; a mismatch reports the
/// reference's scores at the top-k boundary (a near-tie within an ulp or so tells a rounding
/// difference from a bug). Returns the number of sparse rows.
fn assert_selection(
    label: &str,
    got: &[RowSel],
    want: &[RowSel],
    queries: &[f32],
    pooled: &[f32],
    start: usize,
    s: &IndexerShape,
) -> usize {
    let keep = s.budget / s.block;
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            let complete = (start + t + 1) / s.block;
            let mut scores = reference_scores(queries, pooled, t, complete, s);
            scores.sort_by(|a, b| b.total_cmp(a));
            let boundary = if complete > keep && keep > 0 {
                let (kth, next) = (scores[keep - 1], scores[keep]);
                format!(
                    "reference scores at the boundary: {kth:e} (k-th) vs {next:e}, relative gap {:e}",
                    ((kth - next) / kth.abs().max(f32::MIN_POSITIVE)) as f64
                )
            } else {
                "row is dense on the reference side".to_string()
            };
            panic!(
                "{label}: selection of row {t} (position {}) differs: {boundary}\n gpu {g:?}\n cpu {w:?}",
                start + t
            );
        }
    }
    want.iter()
        .filter(|r| matches!(r, RowSel::Sparse { .. }))
        .count()
}

fn run_steps(gpu: &Launch, g: &Geometry, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let s = &g.indexer;
    let (ih, id, block) = (s.heads, s.head_dim, s.block);
    let keep = s.budget / block;
    let hd = g.head_dim;
    let kw = g.kv_heads * hd;
    let attn_shape = AttnShape {
        heads: g.heads,
        kv_heads: g.kv_heads,
        head_dim: hd,
    };
    let k_norm = random(&mut rng, id);
    let dk_norm = gpu.upload(&k_norm, "k_norm").unwrap();

    // The states, on both sides.
    let (mut raw, mut pooled, mut kc, mut vc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut d_raw = gpu.zeros::<f32>(g.capacity * id, "raw keys").unwrap();
    // The pooled state as the executor allocates every `Append` state: `capacity` rows (only
    // capacity/block are used); the 256k test uses the exact size.
    let mut d_pooled = gpu.zeros::<f32>(g.capacity * id, "pooled").unwrap();
    // K/V caches per variant: each variant appends the step's rows itself.
    let mut d_caches: Vec<(CudaSlice<f32>, CudaSlice<f32>)> = g
        .variants
        .iter()
        .map(|_| {
            (
                gpu.zeros::<f32>(g.capacity * kw, "k cache").unwrap(),
                gpu.zeros::<f32>(g.capacity * kw, "v cache").unwrap(),
            )
        })
        .collect();

    let mut position = 0;
    for &(start, rows) in &g.steps {
        assert_eq!(start, position, "steps are consecutive");
        position += rows;
        let label = format!("{} T{rows} @{start}", g.name);
        let iq = random(&mut rng, rows * ih * id);
        let ik = random(&mut rng, rows * id);
        let q = random(&mut rng, rows * g.heads * hd);
        let k = random(&mut rng, rows * kw);
        let v = random(&mut rng, rows * kw);

        // Device.
        let step = gpu.upload(&[start as i64], "step").unwrap();
        let (d_iq, d_ik) = (
            gpu.upload(&iq, "iq").unwrap(),
            gpu.upload(&ik, "ik").unwrap(),
        );
        let (d_q, d_k, d_v) = (
            gpu.upload(&q, "q").unwrap(),
            gpu.upload(&k, "k").unwrap(),
            gpu.upload(&v, "v").unwrap(),
        );
        let d_sel = attn::indexer_select(
            gpu,
            &d_iq,
            &d_ik,
            &dk_norm,
            &mut d_raw,
            &mut d_pooled,
            rows,
            &step,
            s,
            g.capacity,
            g.eps,
            g.theta,
        )
        .unwrap();
        let d_ys: Vec<Buf<f32>> = g
            .variants
            .iter()
            .zip(&mut d_caches)
            .map(|(variant, (d_kc, d_vc))| {
                (variant.launch)(
                    gpu, &d_q, &d_k, &d_v, &d_sel, d_kc, d_vc, rows, &step, g.heads, g.kv_heads,
                    hd, g.capacity, keep, block,
                )
                .unwrap()
            })
            .collect();
        gpu.sync(&label).unwrap();
        let sel_dev = gpu.download(&d_sel, "selection").unwrap();

        // Reference (as exec::cpu).
        raw.extend_from_slice(&ik);
        pool_blocks(&raw, &mut pooled, &k_norm, s, g.eps, g.theta, 0);
        let sel_cpu = select(&iq, &pooled, rows, start, s);
        kc.extend_from_slice(&k);
        vc.extend_from_slice(&v);

        // States.
        let raw_dev = gpu.download(&d_raw, "raw keys").unwrap();
        assert!(
            raw_dev[..raw.len()] == raw[..],
            "{label}: raw key cache differs"
        );
        let pooled_dev = gpu.download(&d_pooled, "pooled").unwrap();
        check(
            "indexer_select_prep_f32",
            &format!("{label} {} blocks", pooled.len() / id),
            &pooled_dev[..pooled.len()],
            &pooled,
        );
        for (variant, (d_kc, d_vc)) in g.variants.iter().zip(&d_caches) {
            let (kc_dev, vc_dev) = (
                gpu.download(d_kc, "k cache").unwrap(),
                gpu.download(d_vc, "v cache").unwrap(),
            );
            assert!(
                kc_dev[..kc.len()] == kc[..] && vc_dev[..vc.len()] == vc[..],
                "{label}: kv cache of {} differs",
                variant.kernel
            );
        }

        // Selection: exactly equal.
        let sel_gpu = decode_selection(&sel_dev, rows, keep, block);
        let sparse = assert_selection(&label, &sel_gpu, &sel_cpu, &iq, &pooled, start, s);
        println!(
            "{:<28} {:<34} {rows} rows equal ({sparse} sparse)",
            "indexer_select (selection)", label
        );

        // Attention, with the reference's selection (equal to the device's by now).
        let check_rows: Vec<usize> = if rows <= g.check_all_below {
            (0..rows).collect()
        } else {
            let mut r: Vec<usize> = (0..rows).step_by(rows / 40).collect();
            r.extend(
                [1, 2050, 2051, 2052, rows - 2, rows - 1]
                    .iter()
                    .filter(|&&x| x < rows),
            );
            r.sort_unstable();
            r.dedup();
            r
        };
        let qw = g.heads * hd;
        let q_sub: Vec<f32> = check_rows
            .iter()
            .flat_map(|&t| q[t * qw..(t + 1) * qw].iter().copied())
            .collect();
        let sel_sub: Vec<RowSel> = check_rows.iter().map(|&t| sel_cpu[t].clone()).collect();
        let want = attend(&q_sub, &kc, &vc, &sel_sub, &attn_shape);
        for (variant, d_y) in g.variants.iter().zip(&d_ys) {
            let y_dev = gpu.download(d_y, "attention").unwrap();
            let got: Vec<f32> = check_rows
                .iter()
                .flat_map(|&t| y_dev[t * qw..(t + 1) * qw].iter().copied())
                .collect();
            check(
                variant.kernel,
                &format!("{label} ({} rows)", check_rows.len()),
                &got,
                &want,
            );
        }
    }
}

#[test]
fn qsa_steps_match_the_cpu_reference_at_tiny_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    // iD 8, block 2, budget 4 (2 blocks kept), heads 4/2, hd 16: rows are sparse from position 5
    // (visible 6, 3 complete blocks) on. The steps split blocks across steps (odd starts).
    let g = Geometry {
        name: "tiny",
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        indexer: IndexerShape {
            heads: 2,
            head_dim: 8,
            rotary_dim: 4,
            budget: 4,
            block: 2,
        },
        theta: 10_000.0,
        eps: 1e-6,
        capacity: 48,
        steps: vec![(0, 5), (5, 30), (35, 1), (36, 4)],
        check_all_below: usize::MAX,
        variants: &[REFERENCE],
    };
    run_steps(&gpu, &g, 0x71a7);
    // A block size that does not divide the steps, and a budget below one block (keep 0: the
    // sparse rows attend their tail only).
    let g = Geometry {
        name: "tiny-b3",
        indexer: IndexerShape {
            heads: 3,
            head_dim: 8,
            rotary_dim: 8,
            budget: 9,
            block: 3,
        },
        capacity: 42,
        steps: vec![(0, 7), (7, 1), (8, 25), (33, 1)],
        ..g
    };
    run_steps(&gpu, &g, 0x71a8);
    let g = Geometry {
        name: "tiny-keep0",
        indexer: IndexerShape {
            heads: 2,
            head_dim: 8,
            rotary_dim: 4,
            budget: 1,
            block: 2,
        },
        capacity: 16,
        steps: vec![(0, 9), (9, 1)],
        ..g
    };
    run_steps(&gpu, &g, 0x71a9);
}

#[test]
fn qsa_steps_match_the_cpu_reference_at_real_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    // 24 q heads / 2 kv heads of 256, rot 64, theta 1e7; indexer 4 heads x 128, rot 64, block 4,
    // budget 2048 (512 blocks kept: rows from position 2051 on are sparse). A first step fills the
    // caches for positions 0..2990, then a 64-token prefill and a decode at ~3000 tokens.
    let g = Geometry {
        name: "real",
        heads: 24,
        kv_heads: 2,
        head_dim: 256,
        indexer: REAL_INDEXER,
        theta: 1e7,
        eps: 1e-6,
        capacity: 4096,
        steps: vec![(0, 2990), (2990, 64), (3054, 1)],
        check_all_below: 64,
        variants: &[REFERENCE],
    };
    run_steps(&gpu, &g, 0x3000);
}

/// Consecutive steps from position 0: a step to `fill_to` (if past the last), then `short`
/// steps of 1, 2, ..., 8, 1, 2, ... rows (decodes and short multi-token steps), for each pair.
fn steps_from(plan: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut steps = Vec::new();
    let mut position = 0;
    for &(fill_to, short) in plan {
        if fill_to > position {
            steps.push((position, fill_to - position));
            position = fill_to;
        }
        for i in 0..short {
            let rows = i % 8 + 1;
            steps.push((position, rows));
            position += rows;
        }
    }
    steps
}

/// `attention_split` (flash-decoding) at tiny shapes: steps of 1..8 rows across the dense/sparse
/// boundary, every group bound of the kernel (heads per kv head 1, 2, 6, 12, 16; head_dim 16, 20
/// and 32), block sizes 2 and 3, keep 0; and shapes it refuses (head_dim 6, 17 heads per kv
/// head), which the registry's `split` variant refuses too, so the schedule gives them the
/// reference kernel.
#[test]
fn attention_split_matches_the_cpu_reference_at_tiny_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let steps = steps_from(&[(0, 10)]); // to position 39
    let base = Geometry {
        name: "split-tiny",
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        indexer: IndexerShape {
            heads: 2,
            head_dim: 8,
            rotary_dim: 4,
            budget: 4,
            block: 2,
        },
        theta: 10_000.0,
        eps: 1e-6,
        capacity: 48,
        steps,
        check_all_below: usize::MAX,
        variants: &[SPLIT],
    };
    let shapes = [
        (4, 2, 16),
        (4, 4, 16),
        (12, 2, 32),
        (24, 2, 16),
        (16, 1, 20),
        (6, 2, 6),
        (34, 2, 8),
    ];
    for (i, (heads, kv_heads, head_dim)) in shapes.into_iter().enumerate() {
        let g = Geometry {
            heads,
            kv_heads,
            head_dim,
            indexer: IndexerShape { ..base.indexer },
            steps: base.steps.clone(),
            ..base
        };
        println!("{heads}/{kv_heads} heads of {head_dim}");
        if split_takes(heads / kv_heads, head_dim) {
            run_steps(&gpu, &g, 0x5917 + i as u64);
        } else {
            assert_split_refuses(&gpu, heads, kv_heads, head_dim);
        }
    }
    let g = Geometry {
        name: "split-tiny-b3",
        heads: 24,
        kv_heads: 2,
        indexer: IndexerShape {
            heads: 3,
            head_dim: 8,
            rotary_dim: 8,
            budget: 9,
            block: 3,
        },
        capacity: 42,
        steps: vec![(0, 7), (7, 1), (8, 25), (33, 1), (34, 8)],
        ..base
    };
    run_steps(&gpu, &g, 0x5927);
    let g = Geometry {
        name: "split-tiny-keep0",
        indexer: IndexerShape {
            heads: 2,
            head_dim: 8,
            rotary_dim: 4,
            budget: 1,
            block: 2,
        },
        capacity: 16,
        steps: vec![(0, 9), (9, 1), (10, 2)],
        ..base
    };
    run_steps(&gpu, &g, 0x5937);
}

/// `attention_split` at the real Qwen3.8-Flash-Next shapes (24/2 heads of 256, block 4, budget
/// 2048: sparse from position 2051 on), the caches carried over ~3000 tokens: decodes and steps
/// of 1..8 rows among dense rows (around position 1000), across the boundary (2040..2090) and
/// sparse at ~3000 tokens; the long fill steps between them are checked too (one split per row,
/// many chunks).
#[test]
fn attention_split_matches_the_cpu_reference_at_real_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    // Dense 1000..1036, across the boundary 2040..2082 (sparse from 2051), sparse 2990..3062.
    let steps = steps_from(&[(1000, 8), (2040, 11), (2990, 16)]);
    let g = Geometry {
        name: "split-real",
        heads: 24,
        kv_heads: 2,
        head_dim: 256,
        indexer: REAL_INDEXER,
        theta: 1e7,
        eps: 1e-6,
        capacity: 4096,
        steps,
        check_all_below: 64,
        variants: &[SPLIT],
    };
    run_steps(&gpu, &g, 0x5_3000);
}

/// One geometry of `GatedAttention` (`attn::gated_attention`, `attn::gated_attention_split`):
/// the op's dimensions, the selection's `keep`, the cache capacity, the steps `(start, rows)`.
struct GatedCase {
    name: &'static str,
    shape: GatedAttentionShape,
    keep: usize,
    theta: f64,
    capacity: usize,
    steps: Vec<(usize, usize)>,
    /// Norm weights per channel of the row (`[heads*hd]`, `[kv_heads*hd]`), not per head channel.
    per_row_weights: bool,
    /// Rows of a step longer than this are checked against the CPU at a sample of rows.
    check_all_below: usize,
}

/// A selection of `rows` rows from position `start` as the indexer makes them (rows whose
/// complete blocks number at most `keep` are dense, the others keep `keep` random blocks), as
/// `RowSel`s and in the device format (docs/pipeline.md).
fn random_selection(
    rng: &mut ChaCha8Rng,
    rows: usize,
    start: usize,
    keep: usize,
    block: usize,
) -> (Vec<RowSel>, Vec<i32>) {
    let mut device = Vec::with_capacity(rows * (2 + keep));
    let sel = (0..rows)
        .map(|t| {
            let visible = start + t + 1;
            let complete = visible / block;
            device.push(visible as i32);
            if complete <= keep {
                device.extend(std::iter::repeat_n(-1, 1 + keep));
                RowSel::Dense { visible }
            } else {
                let mut blocks = rand::seq::index::sample(rng, complete, keep).into_vec();
                blocks.sort_unstable();
                device.push(keep as i32);
                device.extend(blocks.iter().map(|&b| b as i32));
                RowSel::Sparse {
                    visible,
                    blocks,
                    block,
                }
            }
        })
        .collect();
    (sel, device)
}

/// The unfused chain on the device, as the executor runs it without the fusion: split_q_gate,
/// norm_rope of q and of k, the attention variant `split` or the reference (each appends k, v),
/// sigmoid_mul by the gate.
#[allow(clippy::too_many_arguments)]
fn unfused_gated_attention(
    gpu: &Launch,
    x: &GatedAttentionInputs,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    s: &GatedAttentionShape,
    capacity: usize,
    keep: usize,
    eps: f32,
    theta: f64,
    split: bool,
) -> Result<Buf<f32>, CudaError> {
    let (hd, rot) = (s.head_dim, s.rotary_dim);
    let (q_raw, gate) = layout::split_q_gate(gpu, x.qg, rows, s.heads, hd)?;
    let q = attn::norm_rope(gpu, &q_raw, x.q_norm, rows, step, hd, rot, eps, theta)?;
    let k = attn::norm_rope(gpu, x.k_raw, x.k_norm, rows, step, hd, rot, eps, theta)?;
    let attend = if split {
        attn::attention_split
    } else {
        attn::attention
    };
    let y = attend(
        gpu, &q, &k, x.v, x.sel, k_cache, v_cache, rows, step, s.heads, s.kv_heads, hd, capacity,
        keep, s.block,
    )?;
    launch::sigmoid_mul(gpu, &y, &gate, rows)
}

/// `GatedAttention`'s two device forms over consecutive steps, each on its own caches: against
/// the CPU reference (`exec::cpu`'s composition: split_q_gate, norm_rope of q and k, the cache
/// appends, attend, sigmoid_mul) within the f32 bound, and against the unfused kernels
/// (`unfused_gated_attention`, caches of their own) bit for bit, output and caches.
fn run_gated_steps(gpu: &Launch, c: &GatedCase, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let s = &c.shape;
    let (heads, hd, rot, block) = (s.heads, s.head_dim, s.rotary_dim, s.block);
    let (qw, kw) = (heads * hd, s.kv_heads * hd);
    let eps = 1e-6;
    let attn_shape = AttnShape {
        heads,
        kv_heads: s.kv_heads,
        head_dim: hd,
    };
    let q_norm = random(&mut rng, if c.per_row_weights { qw } else { hd });
    let k_norm = random(&mut rng, if c.per_row_weights { kw } else { hd });
    let (dq_norm, dk_norm) = (
        gpu.upload(&q_norm, "q_norm").unwrap(),
        gpu.upload(&k_norm, "k_norm").unwrap(),
    );
    // Caches: (fused, unfused) for the reference form, then for the split form.
    let mut caches: Vec<[CudaSlice<f32>; 4]> = (0..2)
        .map(|_| std::array::from_fn(|_| gpu.zeros::<f32>(c.capacity * kw, "cache").unwrap()))
        .collect();
    let (mut kc, mut vc) = (Vec::new(), Vec::new());
    let mut position = 0;
    for &(start, rows) in &c.steps {
        assert_eq!(start, position, "steps are consecutive");
        position += rows;
        let label = format!("{} T{rows} @{start}", c.name);
        let qg = random(&mut rng, rows * 2 * qw);
        let k_raw = random(&mut rng, rows * kw);
        let v = random(&mut rng, rows * kw);
        let (sel, sel_dev) = random_selection(&mut rng, rows, start, c.keep, block);

        let step = gpu.upload(&[start as i64], "step").unwrap();
        let (d_qg, d_k, d_v) = (
            gpu.upload(&qg, "qg").unwrap(),
            gpu.upload(&k_raw, "k_raw").unwrap(),
            gpu.upload(&v, "v").unwrap(),
        );
        let d_sel = gpu.upload(&sel_dev, "selection").unwrap();
        let x = GatedAttentionInputs {
            qg: &d_qg,
            k_raw: &d_k,
            v: &d_v,
            sel: &d_sel,
            q_norm: &dq_norm,
            k_norm: &dk_norm,
        };
        let mut ys = Vec::new();
        let takes = split_takes(heads / s.kv_heads, hd);
        for (split, [fk, fv, uk, uv]) in [false, true].into_iter().zip(&mut caches) {
            if split && !takes {
                let refused = attn::gated_attention_split(
                    gpu, &x, fk, fv, rows, &step, s, c.capacity, c.keep, eps, c.theta,
                );
                assert!(
                    refused.is_err(),
                    "{label}: the split kernels took {heads} heads of {hd}"
                );
                continue;
            }
            let fused = if split {
                attn::gated_attention_split
            } else {
                attn::gated_attention
            };
            let y = fused(
                gpu, &x, fk, fv, rows, &step, s, c.capacity, c.keep, eps, c.theta,
            );
            let unfused = unfused_gated_attention(
                gpu, &x, uk, uv, rows, &step, s, c.capacity, c.keep, eps, c.theta, split,
            );
            ys.push((y.unwrap(), unfused.unwrap()));
        }
        gpu.sync(&label).unwrap();

        // Reference (as exec::cpu).
        let (q_raw, gate) = split_q_gate(&qg, rows, heads, hd);
        let q = rope::norm_rope(&q_raw, &q_norm, rows, start, hd, rot, eps, c.theta);
        let k = rope::norm_rope(&k_raw, &k_norm, rows, start, hd, rot, eps, c.theta);
        kc.extend_from_slice(&k);
        vc.extend_from_slice(&v);
        let check_rows: Vec<usize> = if rows <= c.check_all_below {
            (0..rows).collect()
        } else {
            let mut r: Vec<usize> = (0..rows).step_by(rows / 32).collect();
            r.push(rows - 1);
            r.dedup();
            r
        };
        let pick = |x: &[f32]| -> Vec<f32> {
            check_rows
                .iter()
                .flat_map(|&t| x[t * qw..(t + 1) * qw].iter().copied())
                .collect()
        };
        let sel_sub: Vec<RowSel> = check_rows.iter().map(|&t| sel[t].clone()).collect();
        let attended = attend(&pick(&q), &kc, &vc, &sel_sub, &attn_shape);
        let want = sigmoid_mul(&attended, &pick(&gate), check_rows.len());

        let mut report = Report(Vec::new());
        for ((y, y_unfused), (form, [fk, fv, uk, uv])) in ys.iter().zip(
            ["gated_attention", "gated_attention_split"]
                .iter()
                .zip(&caches),
        ) {
            let got = gpu.download(y, "y").unwrap();
            report.check(
                form,
                &format!("{label} ({} rows)", check_rows.len()),
                &pick(&got),
                &want,
            );
            let unfused = gpu.download(y_unfused, "unfused y").unwrap();
            report.same(&format!("{form} vs unfused"), &label, &got, &unfused);
            let [fk, fv, uk, uv] = [fk, fv, uk, uv].map(|b| gpu.download(b, "cache").unwrap());
            let filled = position * kw;
            report.check(&format!("{form} k cache"), &label, &fk[..filled], &kc);
            assert!(fv[..filled] == vc[..], "{label}: v cache of {form} differs");
            report.same(&format!("{form} k cache vs unfused"), &label, &fk, &uk);
            report.same(&format!("{form} v cache vs unfused"), &label, &fv, &uv);
        }
    }
}

/// `GatedAttention` at tiny shapes: steps of 1..8 rows from an empty cache across the dense /
/// sparse boundary, norm weights per head channel and per row channel, block sizes 2 and 3; and
/// shapes the split kernels refuse (head_dim 6, 17 heads per kv head), where only the reference
/// form runs (the split one is an error, as the registry says).
#[test]
fn gated_attention_matches_the_cpu_and_the_unfused_kernels_at_tiny_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let shape = |heads, kv_heads, head_dim, rotary_dim, block| GatedAttentionShape {
        heads,
        kv_heads,
        head_dim,
        rotary_dim,
        block,
    };
    let base = GatedCase {
        name: "gated-tiny",
        shape: shape(4, 2, 16, 8, 2),
        keep: 2,
        theta: 10_000.0,
        capacity: 48,
        steps: steps_from(&[(0, 10)]), // to position 39
        per_row_weights: false,
        check_all_below: usize::MAX,
    };
    let cases = [
        (shape(4, 2, 16, 8, 2), 2, false),
        (shape(4, 2, 16, 8, 2), 2, true),
        (shape(12, 1, 32, 16, 3), 3, false),
        (shape(24, 2, 20, 20, 2), 0, true),
        (shape(6, 2, 6, 4, 2), 2, false),
        (shape(34, 2, 8, 4, 2), 2, true),
    ];
    for (i, (shape, keep, per_row_weights)) in cases.into_iter().enumerate() {
        println!(
            "{}/{} heads of {} (rot {}, block {}, keep {keep}), per-row weights {per_row_weights}",
            shape.heads, shape.kv_heads, shape.head_dim, shape.rotary_dim, shape.block
        );
        let c = GatedCase {
            shape,
            keep,
            per_row_weights,
            steps: base.steps.clone(),
            ..base
        };
        run_gated_steps(&gpu, &c, 0x6a7e + i as u64);
    }
    // Steps that run past the capacity: rows at or past it are not appended, as append_rows2_f32.
    let c = GatedCase {
        name: "gated-tiny-full",
        capacity: 12,
        steps: vec![(0, 9), (9, 1), (10, 4)],
        ..base
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x6a7f);
    let s = &c.shape;
    let kw = s.kv_heads * s.head_dim;
    let mut fused = [0, 1].map(|_| gpu.zeros::<f32>(c.capacity * kw, "cache").unwrap());
    let mut unfused = [0, 1].map(|_| gpu.zeros::<f32>(c.capacity * kw, "cache").unwrap());
    let q_norm = gpu.upload(&random(&mut rng, s.head_dim), "q_norm").unwrap();
    let k_norm = gpu.upload(&random(&mut rng, s.head_dim), "k_norm").unwrap();
    for &(start, rows) in &c.steps {
        let qg = gpu
            .upload(&random(&mut rng, rows * 2 * s.heads * s.head_dim), "qg")
            .unwrap();
        let k = gpu.upload(&random(&mut rng, rows * kw), "k").unwrap();
        let v = gpu.upload(&random(&mut rng, rows * kw), "v").unwrap();
        let (_, sel) = random_selection(&mut rng, rows, start, c.keep, s.block);
        let sel = gpu.upload(&sel, "sel").unwrap();
        let step = gpu.upload(&[start as i64], "step").unwrap();
        let x = GatedAttentionInputs {
            qg: &qg,
            k_raw: &k,
            v: &v,
            sel: &sel,
            q_norm: &q_norm,
            k_norm: &k_norm,
        };
        let [fk, fv] = &mut fused;
        let y = attn::gated_attention_split(
            &gpu, &x, fk, fv, rows, &step, s, c.capacity, c.keep, 1e-6, c.theta,
        )
        .unwrap();
        let [uk, uv] = &mut unfused;
        let y_unfused = unfused_gated_attention(
            &gpu, &x, uk, uv, rows, &step, s, c.capacity, c.keep, 1e-6, c.theta, true,
        )
        .unwrap();
        let label = format!("{} T{rows} @{start}", c.name);
        let mut report = Report(Vec::new());
        let (got, want) = (
            gpu.download(&y, "y").unwrap(),
            gpu.download(&y_unfused, "y").unwrap(),
        );
        report.same("gated_attention_split vs unfused", &label, &got, &want);
        for (f, u) in fused.iter().zip(&unfused) {
            let (f, u) = (
                gpu.download(f, "cache").unwrap(),
                gpu.download(u, "cache").unwrap(),
            );
            report.same("caches vs unfused", &label, &f, &u);
        }
    }
}

/// `GatedAttention` at the real Qwen3.8-Flash-Next shape (24/2 heads of 256, rot 64, block 4):
/// a prefill of 300 rows, then decodes and a 5-row step, with the real budget (keep 512: every
/// row dense at these positions, the split count of a real decode) and with keep 32 (rows sparse
/// from position 131 on).
#[test]
fn gated_attention_matches_the_cpu_and_the_unfused_kernels_at_real_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let c = GatedCase {
        name: "gated-real",
        shape: GatedAttentionShape {
            heads: 24,
            kv_heads: 2,
            head_dim: 256,
            rotary_dim: 64,
            block: 4,
        },
        keep: 512,
        theta: 1e7,
        capacity: 4096,
        steps: vec![(0, 300), (300, 1), (301, 5), (306, 1), (307, 1)],
        per_row_weights: false,
        check_all_below: 8,
    };
    run_gated_steps(&gpu, &c, 0x6a7e_3000);
    let c = GatedCase {
        name: "gated-real-keep32",
        keep: 32,
        ..c
    };
    run_gated_steps(&gpu, &c, 0x6a7e_3001);
}

/// The top-k at the largest selection the geometry allows: 65536 complete blocks (256k tokens,
/// block 4). The states for positions 0..262139 are uploaded (random raw keys, pooled by the
/// reference: one step of that size would need a score scratch of rows x 65536); then a 4-token
/// step and a decode run through `indexer_select`, completing the last two blocks.
#[test]
fn indexer_select_at_256k_context() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x256);
    let s = REAL_INDEXER;
    let (capacity, eps, theta) = (262_144usize, 1e-6f32, 1e7);
    let (id, keep) = (s.head_dim, s.budget / s.block);
    let k_norm = random(&mut rng, id);
    let dk_norm = gpu.upload(&k_norm, "k_norm").unwrap();
    let filled = capacity - 5;
    let mut raw = random(&mut rng, filled * id);
    let mut pooled = Vec::new();
    pool_blocks(&raw, &mut pooled, &k_norm, &s, eps, theta, 0);
    let padded = |v: &[f32], len: usize| {
        let mut p = v.to_vec();
        p.resize(len, 0.0);
        p
    };
    let mut d_raw = gpu.upload(&padded(&raw, capacity * id), "raw").unwrap();
    let mut d_pooled = gpu
        .upload(&padded(&pooled, capacity / s.block * id), "pooled")
        .unwrap();
    for (start, rows) in [(filled, 4usize), (capacity - 1, 1)] {
        let iq = random(&mut rng, rows * s.heads * id);
        let ik = random(&mut rng, rows * id);
        let step = gpu.upload(&[start as i64], "step").unwrap();
        let d_sel = attn::indexer_select(
            &gpu,
            &gpu.upload(&iq, "iq").unwrap(),
            &gpu.upload(&ik, "ik").unwrap(),
            &dk_norm,
            &mut d_raw,
            &mut d_pooled,
            rows,
            &step,
            &s,
            capacity,
            eps,
            theta,
        )
        .unwrap();
        raw.extend_from_slice(&ik);
        pool_blocks(&raw, &mut pooled, &k_norm, &s, eps, theta, 0);
        let label = format!("256k T{rows} @{start}");
        let pooled_dev = gpu.download(&d_pooled, "pooled").unwrap();
        check(
            "indexer_select_prep_f32",
            &label,
            &pooled_dev[..pooled.len()],
            &pooled,
        );
        let got = decode_selection(
            &gpu.download(&d_sel, "selection").unwrap(),
            rows,
            keep,
            s.block,
        );
        let want = select(&iq, &pooled, rows, start, &s);
        for (t, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{label}: row {t} at position {}", start + t);
        }
        println!(
            "{:<28} {label:<34} {rows} rows equal ({} blocks)",
            "indexer_select (selection)",
            pooled.len() / id
        );
    }
}

/// The queries of a step of [`indexer_steps`].
#[derive(Clone, Copy, Debug)]
enum Queries {
    /// Uniform in [-1, 1).
    Random,
    /// All zero: every score is 0, so every block ties and the lowest `keep` are kept (more
    /// candidates than the top-k keeps in shared memory once a row has over 4096 blocks).
    Zero,
    /// Head 0 only (the other heads zero): about half the scores are 0, so near the dense/sparse
    /// boundary the k-th score is 0 and only some of the tied blocks are kept.
    OneHead,
}

impl Queries {
    /// Shapes one row's query heads `[heads * head_dim]` (drawn uniform) as this kind asks.
    fn shape_row(self, row: &mut [f32], head_dim: usize) {
        match self {
            Queries::Random => {}
            Queries::Zero => row.fill(0.0),
            Queries::OneHead => row[head_dim..].fill(0.0),
        }
    }
}

/// The indexer's key states filled to `fill` positions: random raw keys and the blocks the
/// reference pools from them (`k_norm`), then both as the device holds them, zero-padded to
/// `capacity` rows and `capacity / block` blocks: [raw, pooled, raw padded, pooled padded].
#[allow(clippy::too_many_arguments)]
fn filled_keys(
    rng: &mut ChaCha8Rng,
    s: &IndexerShape,
    k_norm: &[f32],
    fill: usize,
    capacity: usize,
    eps: f32,
    theta: f64,
) -> [Vec<f32>; 4] {
    let id = s.head_dim;
    let raw = random(rng, fill * id);
    let mut pooled = Vec::new();
    pool_blocks(&raw, &mut pooled, k_norm, s, eps, theta, 0);
    let padded = |v: &[f32], len: usize| {
        let mut p = v.to_vec();
        p.resize(len, 0.0);
        p
    };
    let raw_padded = padded(&raw, capacity * id);
    let pooled_padded = padded(&pooled, capacity / s.block * id);
    [raw, pooled, raw_padded, pooled_padded]
}

/// `indexer_select` alone from a state filled to `fill` positions (random raw keys, pooled by
/// the reference and uploaded), then `steps` of (rows, queries) at consecutive positions, each on
/// fresh random keys and queries: the step's raw keys, the pooled keys it completes and the
/// selection are checked against the reference (`ops::indexer`).
#[allow(clippy::too_many_arguments)]
fn indexer_steps(
    gpu: &Launch,
    name: &str,
    s: &IndexerShape,
    theta: f64,
    capacity: usize,
    fill: usize,
    steps: &[(usize, Queries)],
    seed: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let eps = 1e-6f32;
    let (id, keep) = (s.head_dim, s.budget / s.block);
    let k_norm = random(&mut rng, id);
    let dk_norm = gpu.upload(&k_norm, "k_norm").unwrap();
    let [mut raw, mut pooled, raw_padded, pooled_padded] =
        filled_keys(&mut rng, s, &k_norm, fill, capacity, eps, theta);
    let mut d_raw = gpu.upload(&raw_padded, "raw").unwrap();
    let mut d_pooled = gpu.upload(&pooled_padded, "pooled").unwrap();
    let mut start = fill;
    for &(rows, queries) in steps {
        let label = format!(
            "{name} {}x{id} b{} k{keep} T{rows} @{start} {queries:?}",
            s.heads, s.block
        );
        let mut iq = random(&mut rng, rows * s.heads * id);
        iq.chunks_mut(s.heads * id)
            .for_each(|row| queries.shape_row(row, id));
        let ik = random(&mut rng, rows * id);
        let step = gpu.upload(&[start as i64], "step").unwrap();
        let d_sel = attn::indexer_select(
            gpu,
            &gpu.upload(&iq, "iq").unwrap(),
            &gpu.upload(&ik, "ik").unwrap(),
            &dk_norm,
            &mut d_raw,
            &mut d_pooled,
            rows,
            &step,
            s,
            capacity,
            eps,
            theta,
        )
        .unwrap();
        gpu.sync(&label).unwrap();

        // Reference (as exec::cpu).
        raw.extend_from_slice(&ik);
        pool_blocks(&raw, &mut pooled, &k_norm, s, eps, theta, 0);
        let want = select(&iq, &pooled, rows, start, s);

        let raw_dev = gpu
            .stream
            .clone_dtoh(&d_raw.slice(start * id..(start + rows) * id))
            .unwrap();
        assert!(raw_dev == ik, "{label}: raw keys differ");
        let first = start / s.block * id;
        if pooled.len() > first {
            let got = gpu
                .stream
                .clone_dtoh(&d_pooled.slice(first..pooled.len()))
                .unwrap();
            check("indexer_select_prep_f32", &label, &got, &pooled[first..]);
        }
        let got = decode_selection(
            &gpu.download(&d_sel, "selection").unwrap(),
            rows,
            keep,
            s.block,
        );
        let sparse = assert_selection(&label, &got, &want, &iq, &pooled, start, s);
        println!(
            "{:<28} {label:<44} {rows} rows equal ({sparse} sparse, {} blocks)",
            "indexer_select (selection)",
            pooled.len() / id
        );
        start += rows;
    }
}

/// `indexer_select_qk` (`IndexerSelectQk`: the indexer over its projection `[rows, (heads + 1) *
/// head_dim]`) against the unfused chain on the GPU (`norm_rope` of the query heads' slice, then
/// `indexer_select` with the key slice), each on its own copy of the states filled to `fill`
/// positions: the same selection, raw keys and pooled keys bit for bit (the fused launch forms
/// the queries as `norm_rope` does, with its block size); the selection is also checked against
/// the reference (`ops::indexer`) given the GPU's queries, as `indexer_steps` does.
#[allow(clippy::too_many_arguments)]
fn indexer_qk_steps(
    gpu: &Launch,
    name: &str,
    s: &IndexerShape,
    theta: f64,
    capacity: usize,
    fill: usize,
    steps: &[(usize, Queries)],
    seed: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let eps = 1e-6f32;
    let (id, keep, qw) = (s.head_dim, s.budget / s.block, s.heads * s.head_dim);
    let k_norm = random(&mut rng, id);
    let q_norm = random(&mut rng, id);
    let (dk_norm, dq_norm) = (
        gpu.upload(&k_norm, "k_norm").unwrap(),
        gpu.upload(&q_norm, "q_norm").unwrap(),
    );
    let [mut raw, mut pooled, raw_padded, pooled_padded] =
        filled_keys(&mut rng, s, &k_norm, fill, capacity, eps, theta);
    // [fused, unfused] copies of the two states.
    let mut d_raw = [0, 1].map(|_| gpu.upload(&raw_padded, "raw").unwrap());
    let mut d_pooled = [0, 1].map(|_| gpu.upload(&pooled_padded, "pooled").unwrap());
    let mut start = fill;
    for &(rows, queries) in steps {
        let label = format!(
            "{name} {}x{id} b{} k{keep} T{rows} @{start} {queries:?} (projection)",
            s.heads, s.block
        );
        let mut qk = random(&mut rng, rows * (qw + id));
        qk.chunks_mut(qw + id)
            .for_each(|row| queries.shape_row(&mut row[..qw], id));
        let q_raw: Vec<f32> = qk.chunks(qw + id).flat_map(|r| r[..qw].to_vec()).collect();
        let ik: Vec<f32> = qk.chunks(qw + id).flat_map(|r| r[qw..].to_vec()).collect();
        let step = gpu.upload(&[start as i64], "step").unwrap();
        let [raw_f, raw_u] = &mut d_raw;
        let [pooled_f, pooled_u] = &mut d_pooled;
        let fused = attn::indexer_select_qk(
            gpu,
            &gpu.upload(&qk, "qk").unwrap(),
            &dq_norm,
            &dk_norm,
            raw_f,
            pooled_f,
            rows,
            &step,
            s,
            capacity,
            eps,
            theta,
        )
        .unwrap();
        let dq = attn::norm_rope(
            gpu,
            &gpu.upload(&q_raw, "q_raw").unwrap(),
            &dq_norm,
            rows,
            &step,
            id,
            s.rotary_dim,
            eps,
            theta,
        )
        .unwrap();
        let unfused = attn::indexer_select(
            gpu,
            &dq,
            &gpu.upload(&ik, "ik").unwrap(),
            &dk_norm,
            raw_u,
            pooled_u,
            rows,
            &step,
            s,
            capacity,
            eps,
            theta,
        )
        .unwrap();
        gpu.sync(&label).unwrap();
        let sel_f = gpu.download(&fused, "selection").unwrap();
        assert!(
            sel_f == gpu.download(&unfused, "selection").unwrap(),
            "{label}: the fused selection differs from the unfused chain's"
        );
        let rows_of =
            |d: &CudaSlice<f32>, a: usize, b: usize| gpu.stream.clone_dtoh(&d.slice(a..b)).unwrap();
        let (a, b) = (start * id, (start + rows) * id);
        assert!(rows_of(raw_f, a, b) == ik, "{label}: raw keys differ");
        assert!(
            rows_of(raw_u, a, b) == ik,
            "{label}: raw keys differ (unfused)"
        );
        // Reference (as exec::cpu), given the GPU's queries.
        raw.extend_from_slice(&ik);
        pool_blocks(&raw, &mut pooled, &k_norm, s, eps, theta, 0);
        let first = start / s.block * id;
        if pooled.len() > first {
            let got = rows_of(pooled_f, first, pooled.len());
            assert!(
                got == rows_of(pooled_u, first, pooled.len()),
                "{label}: pooled keys differ from the unfused chain's"
            );
            check("indexer_select_prep_f32", &label, &got, &pooled[first..]);
        }
        let iq = gpu.download(&dq, "q").unwrap();
        let want = select(&iq, &pooled, rows, start, s);
        let got = decode_selection(&sel_f, rows, keep, s.block);
        let sparse = assert_selection(&label, &got, &want, &iq, &pooled, start, s);
        println!(
            "{:<28} {label:<44} {rows} rows equal ({sparse} sparse, {} blocks)",
            "indexer_select_qk",
            pooled.len() / id
        );
        start += rows;
    }
}

/// Steps of 1, 3, 8 and 64 rows, then ties (all scores 0) and partial ties (one head).
const ROWS_1_3_8_64: [(usize, Queries); 8] = [
    (1, Queries::Random),
    (3, Queries::Random),
    (8, Queries::Random),
    (64, Queries::Random),
    (1, Queries::Zero),
    (8, Queries::OneHead),
    (64, Queries::Zero),
    (3, Queries::OneHead),
];

/// The indexer at tiny shapes (block 2..4, 1..5 heads, head_dim 6 (not a multiple of 4), 8, 12;
/// keep 0..10), from position 0 (rows crossing into sparse) and from 9000 tokens (4500 blocks:
/// several top-k chunks; the all-zero step has more tied candidates than the top-k holds).
#[test]
fn indexer_select_matches_the_cpu_reference_at_tiny_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let shapes = [
        (2, 8, 4, 4, 2),
        (3, 8, 8, 9, 3),
        (1, 6, 4, 6, 2),
        (5, 12, 6, 40, 4),
        (2, 8, 4, 1, 2),
    ];
    for (i, (heads, head_dim, rotary_dim, budget, block)) in shapes.into_iter().enumerate() {
        let s = IndexerShape {
            heads,
            head_dim,
            rotary_dim,
            budget,
            block,
        };
        for fill in [0, 9000] {
            indexer_steps(
                &gpu,
                "tiny",
                &s,
                10_000.0,
                10_000,
                fill,
                &ROWS_1_3_8_64,
                0x1d0 + i as u64,
            );
        }
    }
}

/// The indexer at the real shapes (4 heads of 128, rot 64, block 4, budget 2048: 512 blocks
/// kept) across the dense/sparse boundary (position 2051; one-head queries there put the k-th
/// score at 0 among ties), at 8k tokens (2048 blocks: one top-k chunk) and at 70k tokens (17.5k
/// blocks: 5 chunks of 4096, the all-zero steps over the top-k's shared candidates): steps of 1,
/// 3, 8 and 64 rows on fresh random inputs.
#[test]
fn indexer_select_matches_the_cpu_reference_at_real_shapes() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let s = REAL_INDEXER;
    let boundary = [
        (8, Queries::Random),
        (64, Queries::OneHead),
        (3, Queries::Zero),
        (1, Queries::OneHead),
        (64, Queries::Random),
    ];
    indexer_steps(&gpu, "real", &s, 1e7, 4096, 2040, &boundary, 0x2051);
    indexer_steps(&gpu, "real", &s, 1e7, 8448, 8100, &ROWS_1_3_8_64, 0x8000);
    indexer_steps(
        &gpu,
        "real",
        &s,
        1e7,
        73_728,
        70_000,
        &ROWS_1_3_8_64,
        0x70000,
    );
}

/// The indexer over its projection (`indexer_select_qk`) at tiny and real shapes, against the
/// unfused chain on the GPU and the reference: from position 0, across the real dense/sparse
/// boundary, and at 8k tokens.
#[test]
fn indexer_select_qk_matches_the_unfused_chain() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    for (i, (heads, head_dim, rotary_dim, budget, block)) in
        [(2, 8, 4, 4, 2), (5, 12, 6, 40, 4), (1, 6, 4, 6, 2)]
            .into_iter()
            .enumerate()
    {
        let s = IndexerShape {
            heads,
            head_dim,
            rotary_dim,
            budget,
            block,
        };
        indexer_qk_steps(
            &gpu,
            "tiny",
            &s,
            10_000.0,
            2048,
            0,
            &ROWS_1_3_8_64,
            0x9c0 + i as u64,
        );
    }
    let s = REAL_INDEXER;
    let boundary = [
        (8, Queries::Random),
        (64, Queries::OneHead),
        (1, Queries::Random),
        (3, Queries::Zero),
    ];
    indexer_qk_steps(&gpu, "real", &s, 1e7, 4096, 2040, &boundary, 0x9c51);
    indexer_qk_steps(&gpu, "real", &s, 1e7, 8448, 8100, &ROWS_1_3_8_64, 0x9c80);
}

/// A bad launch is an error naming the kernel, not a crash.
#[test]
fn shape_errors_name_the_kernel() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let x = gpu.upload(&[1.0f32; 32], "x").unwrap();
    let step = gpu.upload(&[0i64], "step").unwrap();
    let Err(err) = attn::rope(&gpu, &x, 2, &step, 16, 7, 1e4) else {
        panic!("an odd rotary_dim was accepted")
    };
    assert!(err.to_string().contains("rope_reference_f32"), "{err}");
    let sel = gpu.upload(&[1i32, -1, -1], "sel").unwrap();
    let mut kc = gpu.zeros::<f32>(4 * 16, "kc").unwrap();
    let mut vc = gpu.zeros::<f32>(4 * 16, "vc").unwrap();
    let k = gpu.upload(&[1.0f32; 16], "k").unwrap();
    let Err(err) = attn::attention(
        &gpu, &x, &k, &k, &sel, &mut kc, &mut vc, 1, &step, 2, 1, 16, 4, 2, 2,
    ) else {
        panic!("a selection too short for keep 2 was accepted")
    };
    assert!(err.to_string().contains("attention_reference_f32"), "{err}");
    // GatedAttention: a k norm weight of neither length, a qg without its gates.
    let s = GatedAttentionShape {
        heads: 2,
        kv_heads: 1,
        head_dim: 16,
        rotary_dim: 8,
        block: 2,
    };
    let qg = gpu.upload(&[1.0f32; 64], "qg").unwrap();
    let w = gpu.upload(&[1.0f32; 16], "w").unwrap();
    let w5 = gpu.upload(&[1.0f32; 5], "w5").unwrap();
    let mut inputs = GatedAttentionInputs {
        qg: &qg,
        k_raw: &k,
        v: &k,
        sel: &sel,
        q_norm: &w,
        k_norm: &w5,
    };
    for attend in [attn::gated_attention, attn::gated_attention_split] {
        let Err(err) = attend(
            &gpu, &inputs, &mut kc, &mut vc, 1, &step, &s, 4, 1, 1e-6, 1e4,
        ) else {
            panic!("a k norm weight of 5 values was accepted")
        };
        assert!(
            err.to_string().contains("gated_attention_prepare_f32"),
            "{err}"
        );
    }
    inputs.k_norm = &w;
    inputs.qg = &x;
    let Err(err) = attn::gated_attention_split(
        &gpu, &inputs, &mut kc, &mut vc, 1, &step, &s, 4, 1, 1e-6, 1e4,
    ) else {
        panic!("a qg of 32 values for 2 heads of 16 was accepted")
    };
    assert!(
        err.to_string().contains("gated_attention_prepare_f32"),
        "{err}"
    );
}

/// Time per call at the real geometry with 8k and 256k tokens of context (caches of exactly that
/// capacity), rows 1, 8 and 64: the wall time of eager calls (launches, scratch allocation and
/// the kernels, after a sync) and, for the indexer, of a CUDA graph of 20 calls replayed (the
/// kernels back to back, as in a captured decode step):
/// `cargo test --release --test gpu_attention -- --ignored --nocapture`.
#[test]
#[ignore = "timings, run by hand on the GPU machine"]
fn timings_at_8k_and_256k_context() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x7173);
    let s = REAL_INDEXER;
    let (heads, kv_heads, hd) = (24usize, 2usize, 256usize);
    let (eps, theta) = (1e-6f32, 1e7);
    let keep = s.budget / s.block;
    let kw = kv_heads * hd;
    let dk_norm = gpu.upload(&random(&mut rng, s.head_dim), "k_norm").unwrap();
    let n = 20;
    let time = |what: &str, f: &mut dyn FnMut()| {
        f();
        gpu.sync(what).unwrap();
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            f();
        }
        gpu.sync(what).unwrap();
        println!(
            "{what:<52} {:>9.1} us",
            t0.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    };
    let time_graph = |what: &str, f: &mut dyn FnMut()| {
        f();
        gpu.sync(what).unwrap();
        gpu.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
        for _ in 0..n {
            f();
        }
        let graph = gpu
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("the capture made a graph");
        graph.launch().unwrap();
        gpu.sync(what).unwrap();
        let replays = 10;
        let t0 = std::time::Instant::now();
        for _ in 0..replays {
            graph.launch().unwrap();
        }
        gpu.sync(what).unwrap();
        println!(
            "{what:<52} {:>9.1} us per call in a graph",
            t0.elapsed().as_secs_f64() * 1e6 / (n * replays) as f64
        );
    };
    for capacity in [8192usize, 262_144] {
        let mut d_raw = gpu
            .upload(&random(&mut rng, capacity * s.head_dim), "raw")
            .unwrap();
        let mut d_pooled = gpu
            .upload(&random(&mut rng, capacity / s.block * s.head_dim), "pooled")
            .unwrap();
        let mut d_kc = gpu.upload(&random(&mut rng, capacity * kw), "k").unwrap();
        let mut d_vc = gpu.upload(&random(&mut rng, capacity * kw), "v").unwrap();
        for rows in [1usize, 8, 64] {
            let start = capacity - rows;
            let step = gpu.upload(&[start as i64], "step").unwrap();
            let iq = gpu
                .upload(&random(&mut rng, rows * s.heads * s.head_dim), "iq")
                .unwrap();
            let ik = gpu
                .upload(&random(&mut rng, rows * s.head_dim), "ik")
                .unwrap();
            let q = gpu
                .upload(&random(&mut rng, rows * heads * hd), "q")
                .unwrap();
            let k = gpu.upload(&random(&mut rng, rows * kw), "k").unwrap();
            let v = gpu.upload(&random(&mut rng, rows * kw), "v").unwrap();
            time(&format!("rope T{rows} 24x256 rot64"), &mut || {
                attn::rope(&gpu, &q, rows, &step, hd, 64, theta).unwrap();
            });
            let what = format!(
                "indexer_select T{rows} @{start} ({} blocks)",
                capacity / s.block
            );
            let mut select_once = || {
                attn::indexer_select(
                    &gpu,
                    &iq,
                    &ik,
                    &dk_norm,
                    &mut d_raw,
                    &mut d_pooled,
                    rows,
                    &step,
                    &s,
                    capacity,
                    eps,
                    theta,
                )
                .unwrap()
            };
            time(&what, &mut || drop(select_once()));
            time_graph(&what, &mut || drop(select_once()));
            let sel = select_once();
            for variant in [REFERENCE, SPLIT] {
                time(
                    &format!("{} T{rows} 24/2x256 (2051 positions)", variant.kernel),
                    &mut || {
                        (variant.launch)(
                            &gpu, &q, &k, &v, &sel, &mut d_kc, &mut d_vc, rows, &step, heads,
                            kv_heads, hd, capacity, keep, s.block,
                        )
                        .unwrap();
                    },
                );
            }
        }
    }
}

/// Whether the registry's split attention takes `group` query heads a kv head of `head_dim`.
fn split_takes(group: usize, head_dim: usize) -> bool {
    graphrun::registry::cuda::attention::split_kernel(group, head_dim).is_some()
}

/// The split attention refuses a shape its kernels do not take (an error, never another kernel).
fn assert_split_refuses(gpu: &Launch, heads: usize, kv_heads: usize, head_dim: usize) {
    let (rows, capacity, keep, block) = (1, 8, 1, 2);
    let q = gpu.upload(&vec![0.0f32; heads * head_dim], "q").unwrap();
    let kv = gpu
        .upload(&vec![0.0f32; kv_heads * head_dim], "kv")
        .unwrap();
    let sel = gpu.upload(&vec![-1i32; 2 + keep], "selection").unwrap();
    let mut kc = gpu
        .zeros::<f32>(capacity * kv_heads * head_dim, "k cache")
        .unwrap();
    let mut vc = gpu
        .zeros::<f32>(capacity * kv_heads * head_dim, "v cache")
        .unwrap();
    let step = gpu.upload(&[0i64], "step").unwrap();
    let err = attn::attention_split(
        gpu, &q, &kv, &kv, &sel, &mut kc, &mut vc, rows, &step, heads, kv_heads, head_dim,
        capacity, keep, block,
    )
    .expect_err("a shape the split kernels do not take");
    assert!(err.to_string().contains("attention_split"), "{err}");
}
