//! The MoE and PLE n-gram kernels (`kernels/moe.cu`, `src/exec/cuda/launch/moe.rs`) against the
//! CPU reference (`ops::moe::{route, token_major}`, `ops::ple::ngram_ids`) on fresh random inputs,
//! at tiny shapes and at the real ones (512 experts, top 10, at 1, 3, 8, 64 and 300 rows; H 2560,
//! I 640 with 64 experts to save memory, at 1, 3, 8 and 64 rows token-major, 8, 64 and 300
//! expert-major).
//!
//! Runs where a CUDA device is present (the GPU machine: `scripts/gpu_tests.sh`, logs in
//! `results/`). Elsewhere (CI) it says so and checks nothing else.
//!
//! Bounds: the router's ids and weights bit-equal to the reference computed with the device's
//! exp (`exp` in f64 rounded to f32); ids equal to `ops::moe::route`'s
//! and weights within 1e-6 relative (the CPU's expf is not the device's; rows with near-ties
//! among the top k + 1 are drawn again, deliberate ties are exact in both). Experts within 1e-5
//! relative (‖gpu − cpu‖ / ‖cpu‖, and max |diff| / max |cpu| within 1e-4), bf16 weights against
//! the reference on the same bf16 values widened; n-gram ids and the carried history exactly
//! equal, and so the fused ids + gather (`ple_embed_*`, kernels/embed.cu) against the CPU and the
//! unfused launches.

mod common;

use common::gpu::*;
use cudarc::driver::CudaSlice;
use graphrun::exec::cuda::device::Buf;
use graphrun::exec::cuda::launch::moe::RouterKernel;
use graphrun::exec::cuda::launch::{self, layout, moe as gmoe, DeviceMatrix};
use graphrun::exec::cuda::{CudaError, Launch, ReadyInputs};
use graphrun::ops::{embed, moe, ple};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ROUTER_WEIGHT_BOUND: f32 = 1e-6;

/// The device's exp: f64, rounded once to f32.
fn device_exp(x: f32) -> f32 {
    (x as f64).exp() as f32
}

/// `ops::moe::route` with the device's exp: what the kernel must equal bit for bit.
fn route_device_exp(
    logits: &[f32],
    experts: usize,
    k: usize,
    normalize: bool,
) -> (Vec<i64>, Vec<f32>) {
    moe::route_with_exp(logits, experts, k, normalize, device_exp)
}

/// Whether two of the `k + 1` largest probabilities are so close that the device's exp (not
/// bit-identical to the CPU's) could order them differently.
fn near_tie(row: &[f32], k: usize) -> bool {
    let mut p = moe::softmax_with_exp(row, f32::exp);
    p.sort_by(|a, b| b.total_cmp(a));
    p[..(k + 1).min(p.len())]
        .windows(2)
        .any(|w| w[0] - w[1] <= 1e-5 * w[0])
}

/// Random router logits `[rows, experts]` without near-ties among each row's top k + 1 (such a
/// row is drawn again).
fn logits(rng: &mut ChaCha8Rng, rows: usize, experts: usize, k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * experts);
    for _ in 0..rows {
        loop {
            let row = random_scaled(rng, experts, 4.0);
            if !near_tie(&row, k) {
                out.extend(row);
                break;
            }
        }
    }
    out
}

/// Logits in steps of 0.5 from -3 to 3: many exact ties, at the k-th place too.
fn tied_logits(rng: &mut ChaCha8Rng, rows: usize, experts: usize) -> Vec<f32> {
    (0..rows * experts)
        .map(|_| rng.random_range(-6i32..=6) as f32 * 0.5)
        .collect()
}

/// Rows where two experts have different logits but the same probability (adjacent floats near
/// -0.3, whose exps round alike on the CPU and the device), the higher logit on the higher id:
/// the logit order and the reference's (probability, then id) disagree. Even rows: the pair at
/// the k-th and (k+1)-th places (the reference keeps the lower id, outside the logit top k);
/// odd rows: both inside the top k (only their order changes). The max logit is 0, a few others
/// just below it, the rest well below and well apart.
fn equal_probability_logits(
    rng: &mut ChaCha8Rng,
    rows: usize,
    experts: usize,
    k: usize,
) -> Vec<f32> {
    assert!(experts >= 64 && k >= 4);
    let mut out = Vec::with_capacity(rows * experts);
    for r in 0..rows {
        // The rest: distinct, 0.003 apart (no near-ties), in a random order, below -1.
        let mut row: Vec<f32> = (0..experts).map(|i| -1.0 - 0.003 * i as f32).collect();
        for i in (1..experts).rev() {
            row.swap(i, rng.random_range(0..=i));
        }
        let mut x = -0.3f32 + 0.001 * r as f32;
        loop {
            let y = x.next_up();
            if device_exp(x) == device_exp(y) && x.exp() == y.exp() && x.exp() == device_exp(x) {
                break;
            }
            x = y;
        }
        let y = x.next_up();
        let (low, high) = if r % 2 == 0 {
            (experts / 8, experts / 2)
        } else {
            (experts / 4 + 1, experts - 3)
        };
        row[3] = 0.0;
        let above = if r % 2 == 0 { k - 2 } else { k - 4 };
        for (b, v) in row[experts - 3 - above - 1..experts - 4]
            .iter_mut()
            .enumerate()
        {
            *v = -0.2 + 0.01 * b as f32;
        }
        row[low] = x;
        row[high] = y;
        out.extend(row);
    }
    out
}

/// Rows whose exps underflow to 0 (and -inf logits): zero probabilities among the chosen,
/// ordered by id.
fn zero_probability_logits(experts: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(2 * experts);
    out.extend((0..experts).map(|i| if i < 5 { i as f32 } else { -200.0 - i as f32 }));
    out.extend((0..experts).map(|i| if i % 100 == 0 { 0.5 } else { f32::NEG_INFINITY }));
    out
}

/// Routes `l` on the device and checks it: bit-equal to the reference with the device's exp;
/// ids equal to `ops::moe::route`'s and weights within ROUTER_WEIGHT_BOUND. By both kernels where
/// the narrow one holds the row (so bit-equal to each other), else by the wide one.
fn check_router(gpu: &Launch, what: &str, l: &[f32], rows: usize, experts: usize, k: usize) {
    let dl = gpu.upload(l, "logits").unwrap();
    let forms = if experts <= RouterKernel::Narrow.max_experts() {
        vec![RouterKernel::Narrow, RouterKernel::Wide]
    } else {
        vec![RouterKernel::Wide]
    };
    for (normalize, form) in [true, false]
        .into_iter()
        .flat_map(|n| forms.iter().map(move |&f| (n, f)))
    {
        let shape = format!("{what} {rows}x{experts} top {k} norm {}", normalize as u8);
        let (want_ids, want_w) = moe::route(l, experts, k, normalize);
        let (exact_ids, exact_w) = route_device_exp(l, experts, k, normalize);
        let (ids, w) = gmoe::moe_router(gpu, &dl, rows, experts, k, normalize, form).unwrap();
        let got_ids = gpu.download(&ids, "ids").unwrap();
        let got_w = gpu.download(&w, "weights").unwrap();
        assert_eq!(got_ids, exact_ids, "moe_router ids at {shape} (device exp)");
        for (i, (g, r)) in got_w.iter().zip(&exact_w).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "moe_router weight {i} at {shape}: {g} vs {r} (device exp)"
            );
        }
        assert_eq!(got_ids, want_ids, "moe_router ids at {shape} (CPU exp)");
        let (mut worst, mut equal) = (0.0f32, 0);
        for (i, (&g, &r)) in got_w.iter().zip(&want_w).enumerate() {
            let rel = if g == r { 0.0 } else { (g - r).abs() / r.abs() };
            assert!(
                rel <= ROUTER_WEIGHT_BOUND,
                "moe_router weight {i} at {shape}: {g} vs {r} (rel {rel:e})"
            );
            worst = worst.max(rel);
            equal += (g.to_bits() == r.to_bits()) as usize;
        }
        println!(
            "{:<28} {shape:<44} bit-equal to the device-exp reference; CPU ref: ids equal, \
             weights rel {worst:.2e}, bit-equal {:.1}%",
            form.name(),
            100.0 * equal as f64 / got_w.len().max(1) as f64
        );
    }
}

#[test]
fn router_matches_the_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0001);
    // (rows, experts, top_k): tiny (one warp); not a multiple of 32 (a padded chunk); chunk
    // counts not a power of two; the real 512/10 at decode, at 3, 8, 64 rows and a prefill;
    // more experts than the block's 1024 threads (2, 3 and 4 a thread; over 32 chunk sums,
    // halved in shared memory first); the largest top k; top k = experts.
    for (rows, experts, k) in [
        (3, 8, 2),
        (5, 60, 7),
        (2, 100, 5),
        (3, 300, 10),
        (1, 512, 10),
        (3, 512, 10),
        (8, 512, 10),
        (64, 512, 10),
        (300, 512, 10),
        (2, 513, 10),
        (2, 1000, 64),
        (2, 1500, 10),
        (1, 2100, 20),
        (2, 4096, 64),
        (4, 64, 64),
        (1, 33, 33),
    ] {
        let l = logits(&mut rng, rows, experts, k);
        check_router(&gpu, "random", &l, rows, experts, k);
    }
    for (rows, experts, k) in [
        (1, 512, 10),
        (8, 512, 10),
        (64, 512, 10),
        (3, 60, 7),
        (2, 64, 64),
    ] {
        let l = tied_logits(&mut rng, rows, experts);
        check_router(&gpu, "tied", &l, rows, experts, k);
    }
    check_router(&gpu, "all equal", &[0.25f32; 3 * 512], 3, 512, 10);
    for (rows, experts, k) in [(4, 512, 10), (4, 64, 8)] {
        let l = equal_probability_logits(&mut rng, rows, experts, k);
        check_router(&gpu, "equal p, other logits", &l, rows, experts, k);
    }
    check_router(
        &gpu,
        "zero probabilities",
        &zero_probability_logits(512),
        2,
        512,
        10,
    );
    gpu.sync("the router checks").unwrap();
}

/// The router's shape checks answer with errors naming the kernel.
#[test]
fn router_shape_errors_name_the_kernel() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let l = gpu.upload(&[0.0f32; 16], "logits").unwrap();
    for (rows, experts, k) in [(2, 8, 9), (3, 8, 2), (1, 16, 0)] {
        for form in [RouterKernel::Narrow, RouterKernel::Wide] {
            let err = gmoe::moe_router(&gpu, &l, rows, experts, k, true, form)
                .expect_err("a shape error");
            assert!(err.to_string().contains(form.name()), "{err}");
        }
    }
    // More experts than the block holds: 1 a thread (narrow), 4 (wide).
    let l = gpu.upload(&vec![0.0f32; 1025], "logits").unwrap();
    let err = gmoe::moe_router(&gpu, &l, 1, 1025, 10, true, RouterKernel::Narrow)
        .expect_err("a shape error");
    assert!(
        err.to_string().contains("moe_router_narrow_f32")
            && err.to_string().contains("1025 experts"),
        "{err}"
    );
    let l = gpu.upload(&vec![0.0f32; 4097], "logits").unwrap();
    let err = gmoe::moe_router(&gpu, &l, 1, 4097, 10, true, RouterKernel::Wide)
        .expect_err("a shape error");
    assert!(
        err.to_string().contains("moe_router_reference_f32")
            && err.to_string().contains("4097 experts"),
        "{err}"
    );
}

/// Weights of one expert bank: f32 or bf16 on the device, and the values the reference uses.
fn bank(gpu: &Launch, w: Vec<f32>, bf16: bool) -> (DeviceMatrix, Vec<f32>) {
    if bf16 {
        let bits = bf16_bits(&w);
        drop(w);
        let dev = DeviceMatrix::Bf16(gpu.upload(&bits, "bank").unwrap());
        (dev, widen(&bits))
    } else {
        (DeviceMatrix::F32(gpu.upload(&w, "bank").unwrap()), w)
    }
}

/// Either expert variant (`moe_experts`, `moe_experts_expert_major`: the same arguments).
type ExpertsFn = fn(
    &Launch,
    &CudaSlice<f32>,
    &CudaSlice<i64>,
    &CudaSlice<f32>,
    &DeviceMatrix,
    &DeviceMatrix,
    usize,
    usize,
    usize,
    usize,
) -> Result<Buf<f32>, CudaError>;

/// An id out of range poisons its token's row with NaN and reads nothing out of bounds; the
/// other tokens are as the reference.
fn bad_id_poisons_only_its_row(
    gpu: &Launch,
    rng: &mut ChaCha8Rng,
    experts_fn: ExpertsFn,
    kernel: &str,
    bf16: bool,
) {
    let (rows, experts, hidden, inter, k) = (2, 3, 16, 8, 2);
    let x = random_scaled(rng, rows * hidden, 1.0);
    let (dgu, gu) = bank(
        gpu,
        random_scaled(rng, experts * 2 * inter * hidden, 0.25),
        bf16,
    );
    let (ddown, down) = bank(
        gpu,
        random_scaled(rng, experts * hidden * inter, 0.35),
        bf16,
    );
    let ids = vec![0i64, 2, 1, experts as i64];
    let w = vec![0.5f32, 0.5, 0.5, 0.5];
    let y = experts_fn(
        gpu,
        &gpu.upload(&x, "x").unwrap(),
        &gpu.upload(&ids, "ids").unwrap(),
        &gpu.upload(&w, "w").unwrap(),
        &dgu,
        &ddown,
        rows,
        k,
        hidden,
        inter,
    )
    .unwrap();
    let got = gpu.download(&y, "y").unwrap();
    assert!(
        got[hidden..].iter().all(|v| v.is_nan()),
        "{kernel}: {got:?}"
    );
    let reference = moe::ExpertBank {
        gate_up: &gu,
        down: &down,
        hidden,
        intermediate: inter,
    };
    let want = moe::token_major(&x[..hidden], &ids[..k], &w[..k], 1, k, &reference);
    check(kernel, "bad id in another row", &got[..hidden], &want);
}

#[test]
fn experts_match_the_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0002);
    let mut rows_form = 0;
    // (experts, hidden, intermediate, top_k, row counts): odd sizes (no 16-byte loads: the
    // scalar paths); sizes with f32 16-byte loads but not bf16 ones; rows of one chunk per lane
    // and partial batches; the real H 2560, I 640, top 10 with 64 experts at decode and more.
    for (experts, hidden, inter, k, row_counts) in [
        (5, 37, 13, 3, &[1, 3, 8][..]),
        (6, 68, 20, 4, &[1, 3, 8][..]),
        (9, 64, 40, 9, &[1, 3, 8][..]),
        (8, 256, 80, 6, &[1, 3][..]),
        (6, 320, 88, 4, &[3][..]),
        (64, 2560, 640, 10, &[1, 3, 8, 64][..]),
    ] {
        for bf16 in [false, true] {
            let gu_scale = 1.0 / (hidden as f32).sqrt();
            let down_scale = 1.0 / (inter as f32).sqrt();
            let (dgu, gu) = bank(
                &gpu,
                random_scaled(&mut rng, experts * 2 * inter * hidden, gu_scale),
                bf16,
            );
            let (ddown, down) = bank(
                &gpu,
                random_scaled(&mut rng, experts * hidden * inter, down_scale),
                bf16,
            );
            let reference = moe::ExpertBank {
                gate_up: &gu,
                down: &down,
                hidden,
                intermediate: inter,
            };
            let kernel = if bf16 {
                "moe_experts_*_bf16"
            } else {
                "moe_experts_*_f32"
            };
            for &rows in row_counts {
                let x = random_scaled(&mut rng, rows * hidden, 1.0);
                let l = logits(&mut rng, rows, experts, k);
                let (ids, w) = moe::route(&l, experts, k, true);
                let dx = gpu.upload(&x, "x").unwrap();
                let di = gpu.upload(&ids, "ids").unwrap();
                let dw = gpu.upload(&w, "w").unwrap();
                let want = moe::token_major(&x, &ids, &w, rows, k, &reference);
                let y =
                    moe_experts_as_ruled(&gpu, &dx, &di, &dw, &dgu, &ddown, rows, k, hidden, inter)
                        .unwrap();
                let got = gpu.download(&y, "y").unwrap();
                let shape = format!("T{rows} E{experts} H{hidden} I{inter} top {k}");
                check(kernel, &shape, &got, &want);
                // Both down kernels, chosen explicitly: a block per output row, and DOWN_ROWS
                // rows a block where the shape allows (else a shape error naming it): the same
                // bits.
                let with_down = |by_rows: bool| {
                    gmoe::moe_experts_with_down(
                        &gpu,
                        &dx,
                        &di,
                        &dw,
                        &dgu,
                        &ddown,
                        [rows, k, hidden, inter],
                        by_rows,
                    )
                };
                let per_row = gpu.download(&with_down(false).unwrap(), "y").unwrap();
                assert_eq!(
                    bits(&per_row),
                    bits(&got),
                    "{kernel} {shape}: a block per row"
                );
                match with_down(true) {
                    Ok(y) => {
                        rows_form += 1;
                        assert_eq!(
                            bits(&gpu.download(&y, "y").unwrap()),
                            bits(&per_row),
                            "{kernel} {shape}: rows a block"
                        );
                    }
                    Err(e) => assert!(e.to_string().contains("moe_experts_down_rows"), "{e}"),
                }
                // Running ahead (its inputs are complete: uploads): the same bits.
                gpu.set_ready_inputs(ReadyInputs::ALL);
                let ahead =
                    moe_experts_as_ruled(&gpu, &dx, &di, &dw, &dgu, &ddown, rows, k, hidden, inter)
                        .unwrap();
                assert_eq!(
                    bits(&gpu.download(&ahead, "y").unwrap()),
                    bits(&got),
                    "{kernel} {shape}: run ahead"
                );

                // The real path: routed on the device, the ids never leave it.
                if rows == 8 || rows == 3 {
                    let dl = gpu.upload(&l, "logits").unwrap();
                    let (ri, rw) =
                        gmoe::moe_router(&gpu, &dl, rows, experts, k, true, ruled_router(experts))
                            .unwrap();
                    assert_eq!(gpu.download(&ri, "ids").unwrap(), ids);
                    let y = moe_experts_as_ruled(
                        &gpu, &dx, &ri, &rw, &dgu, &ddown, rows, k, hidden, inter,
                    )
                    .unwrap();
                    let got = gpu.download(&y, "y").unwrap();
                    check(kernel, &format!("{shape} (device route)"), &got, &want);
                    // As in a decode step: the router, another node (the shared expert's
                    // gate and up), then the experts running ahead of that node.
                    let (ri, rw) =
                        gmoe::moe_router(&gpu, &dl, rows, experts, k, true, ruled_router(experts))
                            .unwrap();
                    let (sg, _) = bank(&gpu, random_scaled(&mut rng, 64 * hidden, 0.1), bf16);
                    let (su, _) = bank(&gpu, random_scaled(&mut rng, 64 * hidden, 0.1), bf16);
                    let x0 = gpu.upload(&x[..hidden], "x row").unwrap();
                    let _shared = layout::swiglu(&gpu, &x0, &sg, &su, 1, hidden, 64, true).unwrap();
                    gpu.set_ready_inputs(ReadyInputs::ALL);
                    let y = moe_experts_as_ruled(
                        &gpu, &dx, &ri, &rw, &dgu, &ddown, rows, k, hidden, inter,
                    )
                    .unwrap();
                    let ahead = gpu.download(&y, "y").unwrap();
                    check(
                        kernel,
                        &format!("{shape} (device route, run ahead)"),
                        &ahead,
                        &want,
                    );
                }
            }
        }
    }

    // The real geometry and most smaller ones take the rows form.
    assert!(rows_form > 10, "the rows form ran {rows_form} times");
    bad_id_poisons_only_its_row(
        &gpu,
        &mut rng,
        moe_experts_as_ruled,
        "moe_experts_*_f32",
        false,
    );
    gpu.sync("the expert checks").unwrap();
}

/// The expert-major variant (many tokens): against `ops::moe::token_major` (and so
/// `ops::moe::expert_major`, equal to it bit for bit) within the f32 bound, on random and on
/// skewed routing (two experts chosen by almost every token: several tiles each, most experts
/// none); the same bits when run again (the grouping's order changes nothing).
#[test]
fn experts_expert_major_match_the_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0004);
    for (experts, hidden, inter, k, row_counts) in [
        (5, 37, 13, 3, &[1, 3, 8, 64][..]),
        (9, 64, 40, 9, &[8, 64][..]),
        (6, 130, 70, 4, &[100][..]),
        (64, 2560, 640, 10, &[8, 64, 300][..]),
    ] {
        for bf16 in [false, true] {
            let (dgu, gu) = bank(
                &gpu,
                random_scaled(
                    &mut rng,
                    experts * 2 * inter * hidden,
                    1.0 / (hidden as f32).sqrt(),
                ),
                bf16,
            );
            let (ddown, down) = bank(
                &gpu,
                random_scaled(
                    &mut rng,
                    experts * hidden * inter,
                    1.0 / (inter as f32).sqrt(),
                ),
                bf16,
            );
            let reference = moe::ExpertBank {
                gate_up: &gu,
                down: &down,
                hidden,
                intermediate: inter,
            };
            let kernel = match (bf16, hidden % 8 == 0 && inter % 8 == 0) {
                (true, true) => "moe_experts_expert_major_*_mma_bf16",
                (true, false) => "moe_experts_expert_major_*_bf16",
                (false, _) => "moe_experts_expert_major_*_f32",
            };
            for &rows in row_counts {
                for skewed in [false, true] {
                    let x = random_scaled(&mut rng, rows * hidden, 1.0);
                    let mut l = logits(&mut rng, rows, experts, k);
                    if skewed {
                        for row in l.chunks_mut(experts) {
                            row[0] += 20.0;
                            row[1] += 15.0;
                        }
                    }
                    let (ids, w) = moe::route(&l, experts, k, true);
                    let dx = gpu.upload(&x, "x").unwrap();
                    let di = gpu.upload(&ids, "ids").unwrap();
                    let dw = gpu.upload(&w, "w").unwrap();
                    let want = moe::token_major(&x, &ids, &w, rows, k, &reference);
                    assert_eq!(
                        gmoe::expert_major_on_tensor_cores(&gpu, &dx, &dgu, &ddown, hidden, inter),
                        kernel.contains("mma"),
                        "{kernel}: the tensor-core tiles are taken exactly where they serve"
                    );
                    let run = || {
                        let y = gmoe::moe_experts_expert_major(
                            &gpu,
                            &dx,
                            &di,
                            &dw,
                            &dgu,
                            &ddown,
                            rows,
                            k,
                            hidden,
                            inter,
                            gmoe::expert_major_on_tensor_cores(
                                &gpu, &dx, &dgu, &ddown, hidden, inter,
                            ),
                        )
                        .unwrap();
                        gpu.download(&y, "y").unwrap()
                    };
                    let got = run();
                    let shape = format!(
                        "T{rows} E{experts} H{hidden} I{inter} top {k}{}",
                        if skewed { " skewed" } else { "" }
                    );
                    check(kernel, &shape, &got, &want);
                    let again = run();
                    assert!(
                        got.iter()
                            .zip(&again)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{kernel} at {shape}: a second run differs"
                    );
                }
            }
        }
    }

    // The SIMT tiles (f32) and the tensor-core tiles (bf16, sizes multiples of 8).
    bad_id_poisons_only_its_row(
        &gpu,
        &mut rng,
        |g, x, i, w, gu, d, r, k, h, n| {
            gmoe::moe_experts_expert_major(g, x, i, w, gu, d, r, k, h, n, false)
        },
        "moe_experts_expert_major_*_f32",
        false,
    );
    bad_id_poisons_only_its_row(
        &gpu,
        &mut rng,
        |g, x, i, w, gu, d, r, k, h, n| {
            gmoe::moe_experts_expert_major(g, x, i, w, gu, d, r, k, h, n, true)
        },
        "moe_experts_expert_major_*_mma_bf16",
        true,
    );
    gpu.sync("the expert-major checks").unwrap();
}

#[test]
fn experts_shape_errors_name_the_kernel() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let x = gpu.upload(&[1.0f32; 8], "x").unwrap();
    let ids = gpu.upload(&[0i64; 2], "ids").unwrap();
    let w = gpu.upload(&[0.5f32; 2], "w").unwrap();
    let gu = DeviceMatrix::F32(gpu.upload(&[1.0f32; 2 * 2 * 4 * 2], "gate_up").unwrap());
    let down = DeviceMatrix::Bf16(gpu.upload(&[0u16; 2 * 4 * 2 + 1], "down").unwrap());
    let err = moe_experts_as_ruled(&gpu, &x, &ids, &w, &gu, &down, 2, 1, 4, 2)
        .expect_err("a shape error");
    assert!(err.to_string().contains("moe_experts_down_bf16"), "{err}");
    let err = moe_experts_as_ruled(&gpu, &x, &ids, &w, &gu, &down, 1, 2, 4, 3)
        .expect_err("a shape error");
    assert!(err.to_string().contains("moe_experts_gate_up_f32"), "{err}");
    // Rows of 4 do not split into the rows form's blocks of 8.
    let good_down = DeviceMatrix::F32(gpu.upload(&[1.0f32; 2 * 4 * 2], "down").unwrap());
    let err = gmoe::moe_experts_with_down(&gpu, &x, &ids, &w, &gu, &good_down, [2, 1, 4, 2], true)
        .expect_err("a shape error");
    assert!(
        err.to_string().contains("moe_experts_down_rows_f32"),
        "{err}"
    );
    let err = gmoe::moe_experts_expert_major(
        &gpu,
        &x,
        &ids,
        &w,
        &gu,
        &down,
        2,
        1,
        4,
        2,
        gmoe::expert_major_on_tensor_cores(&gpu, &x, &gu, &down, 4, 2),
    )
    .expect_err("a shape error");
    assert!(
        err.to_string()
            .contains("moe_experts_expert_major_down_bf16"),
        "{err}"
    );
    let err = gmoe::moe_experts_expert_major(
        &gpu,
        &x,
        &ids,
        &w,
        &gu,
        &down,
        1,
        2,
        4,
        3,
        gmoe::expert_major_on_tensor_cores(&gpu, &x, &gu, &down, 4, 3),
    )
    .expect_err("a shape error");
    assert!(
        err.to_string()
            .contains("moe_experts_expert_major_gate_up_f32"),
        "{err}"
    );
}

/// One n-gram configuration: eos, ngram, heads per n-gram, multipliers, sizes, offsets.
struct Ngram {
    eos: i64,
    ngram: usize,
    hpn: usize,
    multipliers: Vec<i64>,
    sizes: Vec<i64>,
    offsets: Vec<i64>,
}

impl Ngram {
    fn tiny() -> Ngram {
        Ngram {
            eos: 2,
            ngram: 3,
            hpn: 2,
            multipliers: vec![73077407744147129, 4156873792259893, 23288516139688959],
            sizes: vec![31, 37, 41, 43],
            offsets: vec![0, 31, 68, 109],
        }
    }

    /// The real config's first PLE layer (the spec's second test vector).
    fn real() -> Ngram {
        let sizes: Vec<i64> = vec![
            20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
            20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171,
        ];
        Ngram {
            eos: 248044,
            ngram: 3,
            hpn: 8,
            multipliers: vec![23703573157769, 20109073645365, 8052911324071],
            offsets: prefix_sums(&sizes),
            sizes,
        }
    }

    /// Random: full-range multipliers (products wrap, mixes go negative), sizes up to 1e7.
    fn random_scaled(rng: &mut ChaCha8Rng, ngram: usize, hpn: usize) -> Ngram {
        let heads = (ngram - 1) * hpn;
        let sizes: Vec<i64> = (0..heads)
            .map(|_| rng.random_range(2..10_000_000))
            .collect();
        Ngram {
            eos: 2,
            ngram,
            hpn,
            multipliers: (0..ngram).map(|_| rng.random::<i64>() | 1).collect(),
            offsets: prefix_sums(&sizes),
            sizes,
        }
    }

    fn cpu(&self, tokens: &[i64], history: &mut [i64]) -> Vec<i64> {
        ple::ngram_ids(
            tokens,
            history,
            self.eos,
            self.ngram,
            self.hpn,
            &self.multipliers,
            &self.sizes,
            &self.offsets,
        )
    }

    /// Feeds `tokens` to the device in chunks of the given lengths, the history carried in one
    /// device buffer; returns all the ids and the final history.
    fn gpu(&self, gpu: &Launch, tokens: &[i64], chunks: &[usize]) -> (Vec<i64>, Vec<i64>) {
        let m = gpu.upload(&self.multipliers, "multipliers").unwrap();
        let s = gpu.upload(&self.sizes, "sizes").unwrap();
        let o = gpu.upload(&self.offsets, "offsets").unwrap();
        let hash = launch::NgramHash {
            eos: self.eos,
            ngram: self.ngram,
            heads_per_ngram: self.hpn,
            multipliers: &m,
            sizes: &s,
            offsets: &o,
        };
        let mut history = gpu
            .upload(&vec![self.eos; self.ngram - 1], "history")
            .unwrap();
        let mut ids = Vec::new();
        let mut at = 0;
        for &n in chunks {
            let t = gpu.upload(&tokens[at..at + n], "tokens").unwrap();
            let d = gmoe::ple_ngram_ids(gpu, &t, &mut history, &hash).unwrap();
            ids.extend(gpu.download(&d, "ids").unwrap());
            at += n;
        }
        assert_eq!(at, tokens.len());
        (ids, gpu.download(&history, "history").unwrap())
    }
}

fn prefix_sums(sizes: &[i64]) -> Vec<i64> {
    sizes
        .iter()
        .scan(0, |acc, s| {
            let o = *acc;
            *acc += s;
            Some(o)
        })
        .collect()
}

#[test]
fn ngram_ids_match_the_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);

    // The spec's tiny test vector (computed by transformers).
    let tiny = Ngram::tiny();
    let tokens = [5i64, 6, 2, 7, 8, 9];
    let want = [
        [23, 58, 92, 134],
        [9, 38, 105, 121],
        [8, 49, 94, 120],
        [24, 64, 101, 118],
        [26, 58, 107, 135],
        [21, 64, 102, 140],
    ]
    .concat();
    for chunks in [vec![6], vec![1; 6], vec![2, 4], vec![5, 1]] {
        let (ids, history) = tiny.gpu(&gpu, &tokens, &chunks);
        assert_eq!(ids, want, "tiny test vector in chunks {chunks:?}");
        assert_eq!(history, vec![8, 9], "tiny history in chunks {chunks:?}");
    }
    println!("ple_ngram_ids_reference_i64  the spec's tiny test vector: equal");

    // The spec's real test vector: the reference (which its unit test pins to the spec).
    let real = Ngram::real();
    let tokens = [9707i64, 11, 1879, 248044, 151, 33];
    let mut h = vec![real.eos; 2];
    let want = real.cpu(&tokens, &mut h);
    for chunks in [vec![6], vec![3, 3], vec![4, 1, 1]] {
        assert_eq!(real.gpu(&gpu, &tokens, &chunks), (want.clone(), h.clone()));
    }
    println!("ple_ngram_ids_reference_i64  the spec's real test vector: equal");

    // Random: tokens from a small vocabulary so that eos (2) is frequent, runs of eos included;
    // history carried across chunks (5 then 3 tokens equals 8 at once), and more tokens than
    // threads in the block.
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0003);
    for (ngram, hpn) in [(2, 1), (3, 2), (3, 8), (4, 3), (6, 2)] {
        let cfg = Ngram::random_scaled(&mut rng, ngram, hpn);
        for (len, chunks) in [
            (8, vec![8]),
            (8, vec![5, 3]),
            (8, vec![1, 1, 1, 1, 1, 1, 1, 1]),
            (700, vec![700]),
            (700, vec![1, 299, 3, 397]),
        ] {
            let tokens: Vec<i64> = (0..len).map(|_| rng.random_range(0..12)).collect();
            let mut h = vec![cfg.eos; ngram - 1];
            let want = cfg.cpu(&tokens, &mut h);
            let (ids, history) = cfg.gpu(&gpu, &tokens, &chunks);
            assert_eq!(ids, want, "ngram {ngram} hpn {hpn}, chunks {chunks:?}");
            assert_eq!(history, h, "ngram {ngram} hpn {hpn}, chunks {chunks:?}");
        }
        println!("ple_ngram_ids_reference_i64  random, ngram {ngram} hpn {hpn}: equal");
    }
    gpu.sync("the n-gram checks").unwrap();
}

impl Ngram {
    /// The structure of `real()` (or any ngram, hpn) with the multipliers given and sizes drawn
    /// below `max_size`, so that a table with a row for every id fits in a test.
    fn sized(
        rng: &mut ChaCha8Rng,
        eos: i64,
        multipliers: Vec<i64>,
        hpn: usize,
        max_size: i64,
    ) -> Ngram {
        let ngram = multipliers.len();
        let sizes: Vec<i64> = (0..(ngram - 1) * hpn)
            .map(|_| rng.random_range(2..max_size))
            .collect();
        Ngram {
            eos,
            ngram,
            hpn,
            multipliers,
            offsets: prefix_sums(&sizes),
            sizes,
        }
    }

    /// Rows of a table with a row for every id.
    fn table_rows(&self) -> usize {
        (self.offsets.last().unwrap() + self.sizes.last().unwrap()) as usize
    }
}

/// The fused n-gram ids and gather (`ple_embed_*`, kernels/embed.cu) over consecutive steps of a
/// sequence, the token history carried in a device buffer: each step's rows bit for bit the
/// CPU's (`ple::ngram_ids`, then `embed::gather`: copies) and the unfused launches' (the ids
/// kernel, then `launch::embed`), and the history after every step the same in all three. Every
/// other step runs ahead (its tokens ready: hashed and gathered before the wait), for the same
/// bits. Configurations: the spec's tiny one, random ones (ngram 2 to 6), and the real layer's
/// (ngram 3, 8 heads an order, rows of 160, its multipliers; sizes drawn small so that the table
/// fits: the real 320M rows would not), f32 and bf16 tables; steps of 1 token (decode), 2, 8 and
/// 700 (thousands of blocks, every block's ids straddling items), eos frequent.
#[test]
fn ple_embed_matches_the_reference_over_steps() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x91e_e3bd);
    let real = Ngram::real();
    let mut configs = vec![(Ngram::tiny(), 8usize)];
    for (ngram, hpn, d) in [(2, 1, 3), (4, 3, 16), (6, 2, 7)] {
        let multipliers = (0..ngram).map(|_| rng.random::<i64>() | 1).collect();
        configs.push((Ngram::sized(&mut rng, 2, multipliers, hpn, 500), d));
    }
    configs.push((
        Ngram::sized(&mut rng, real.eos, real.multipliers.clone(), 8, 5000),
        160,
    ));
    let steps = [1usize, 1, 2, 8, 1, 700, 1, 3];
    for (cfg, d) in &configs {
        let d = *d;
        let heads = (cfg.ngram - 1) * cfg.hpn;
        let table = random(&mut rng, cfg.table_rows() * d);
        let (m, s, o) = (
            gpu.upload(&cfg.multipliers, "multipliers").unwrap(),
            gpu.upload(&cfg.sizes, "sizes").unwrap(),
            gpu.upload(&cfg.offsets, "offsets").unwrap(),
        );
        let hash = launch::NgramHash {
            eos: cfg.eos,
            ngram: cfg.ngram,
            heads_per_ngram: cfg.hpn,
            multipliers: &m,
            sizes: &s,
            offsets: &o,
        };
        for bf16 in [false, true] {
            let (dt, widened) = if bf16 {
                let bits = bf16_bits(&table);
                let w = widen(&bits);
                (DeviceMatrix::Bf16(gpu.upload(&bits, "table").unwrap()), w)
            } else {
                (
                    DeviceMatrix::F32(gpu.upload(&table, "table").unwrap()),
                    table.clone(),
                )
            };
            let start = vec![cfg.eos; cfg.ngram - 1];
            let mut history = start.clone();
            let mut fused_history = gpu.upload(&start, "history").unwrap();
            let mut plain_history = gpu.upload(&start, "history").unwrap();
            for (k, &rows) in steps.iter().enumerate() {
                let tokens: Vec<i64> = (0..rows)
                    .map(|_| match rng.random_range(0..6) {
                        0 => cfg.eos,
                        _ => rng.random_range(0..250_000),
                    })
                    .collect();
                let ids = cfg.cpu(&tokens, &mut history);
                let want = embed::gather(&ids, &widened, d);
                let dtok = gpu.upload(&tokens, "tokens").unwrap();
                let ahead = k % 2 == 1;
                if ahead {
                    gpu.set_ready_inputs(ReadyInputs::ALL);
                }
                let fused =
                    launch::ple_embed(&gpu, &dtok, &mut fused_history, &hash, &dt, d).unwrap();
                let fused = gpu.download(&fused, "emb").unwrap();
                let plain_ids =
                    gmoe::ple_ngram_ids(&gpu, &dtok, &mut plain_history, &hash).unwrap();
                let plain = gpu
                    .download(&launch::embed(&gpu, &plain_ids, &dt, d).unwrap(), "emb")
                    .unwrap();
                let what = format!(
                    "ngram {} hpn {} d {d} {} step {k} ({rows} rows{})",
                    cfg.ngram,
                    cfg.hpn,
                    if bf16 { "bf16" } else { "f32" },
                    if ahead { ", ahead" } else { "" }
                );
                assert_eq!(fused.len(), rows * heads * d, "{what}");
                assert!(bits(&fused) == bits(&want), "{what}: fused != the CPU's");
                assert!(bits(&fused) == bits(&plain), "{what}: fused != unfused");
                let got = gpu.download(&fused_history, "history").unwrap();
                assert_eq!(got, history, "{what}: history");
                assert_eq!(
                    gpu.download(&plain_history, "history").unwrap(),
                    history,
                    "{what}: unfused history"
                );
            }
            println!(
                "ple_embed_{}  ngram {} hpn {} d {d}: {} steps equal to the CPU and the unfused launches",
                if bf16 { "bf16" } else { "f32" },
                cfg.ngram,
                cfg.hpn,
                steps.len()
            );
        }
    }

    // Bad shapes are errors naming the kernel: a history of the wrong length.
    let t = gpu.upload(&[5i64], "tokens").unwrap();
    let mut short = gpu.upload(&[2i64], "history").unwrap();
    let tiny = Ngram::tiny();
    let (m, s, o) = (
        gpu.upload(&tiny.multipliers, "m").unwrap(),
        gpu.upload(&tiny.sizes, "s").unwrap(),
        gpu.upload(&tiny.offsets, "o").unwrap(),
    );
    let hash = launch::NgramHash {
        eos: 2,
        ngram: 3,
        heads_per_ngram: 2,
        multipliers: &m,
        sizes: &s,
        offsets: &o,
    };
    let table = DeviceMatrix::F32(gpu.upload(&[0.0f32; 152 * 4], "table").unwrap());
    let err = launch::ple_embed(&gpu, &t, &mut short, &hash, &table, 4).expect_err("history of 1");
    assert!(err.to_string().contains("ple_embed_f32"), "{err}");
    // The ids kernel checks the same hash the same way, naming itself.
    let err = gmoe::ple_ngram_ids(&gpu, &t, &mut short, &hash).expect_err("history of 1");
    assert!(
        err.to_string().contains("ple_ngram_ids_reference_i64"),
        "{err}"
    );
    gpu.sync("the PLE gather checks").unwrap();
}

/// The router the rules give `experts` experts (`moe_router.cuda_narrow`).
fn ruled_router(experts: usize) -> RouterKernel {
    if experts <= RouterKernel::Narrow.max_experts() {
        RouterKernel::Narrow
    } else {
        RouterKernel::Wide
    }
}

/// The token-major experts with the down kernel the rules give the shape
/// (`moe.cuda_token_major_rows`: rows a block where the registry's `token_major_rows` accepts it).
#[allow(clippy::too_many_arguments)]
fn moe_experts_as_ruled(
    gpu: &Launch,
    x: &cudarc::driver::CudaSlice<f32>,
    ids: &cudarc::driver::CudaSlice<i64>,
    w: &cudarc::driver::CudaSlice<f32>,
    gate_up: &DeviceMatrix,
    down: &DeviceMatrix,
    rows: usize,
    top_k: usize,
    hidden: usize,
    intermediate: usize,
) -> Result<graphrun::exec::cuda::device::Buf<f32>, graphrun::exec::cuda::CudaError> {
    let by_rows = graphrun::registry::cuda::moe::down_rows_fits(top_k, hidden, intermediate);
    gmoe::moe_experts_with_down(
        gpu,
        x,
        ids,
        w,
        gate_up,
        down,
        [rows, top_k, hidden, intermediate],
        by_rows,
    )
}
