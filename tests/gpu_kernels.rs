//! Every CUDA kernel against the CPU reference on fresh random inputs, at tiny shapes and at the
//! real Qwen3.8-Flash-Next shapes (a bug that hides at tiny shapes must not hide here).
//!
//! Runs where a CUDA device is present (the GPU machine: `scripts/gpu_tests.sh`, logs in
//! `results/`). Elsewhere (CI) it says so and checks nothing else.
//!
//! Bounds: f32 math within 1e-5 relative (‖gpu − cpu‖ / ‖cpu‖, and max |diff| / max |cpu|). bf16
//! weights get the same bound: the CPU reference uses exactly the bf16 values widened to f32,
//! so only the summation order differs, as for f32.

mod common;

use common::gpu::*;
use cudarc::driver::{CudaSlice, DevicePtr};
use graphrun::exec::cuda::launch::linear::{GroupKernel, MmaTile, OneToken};
use graphrun::exec::cuda::launch::{self, DeviceMatrix};
use graphrun::exec::cuda::{Launch, ReadyInputs};
use graphrun::ops::{elementwise as ew, embed, linear, norm};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn kernels_match_the_cpu_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    println!(
        "device: {} (sm_{}{}), {} GiB",
        gpu.info.name,
        gpu.info.compute_capability.0,
        gpu.info.compute_capability.1,
        gpu.info.memory_bytes >> 30
    );
    let mut rng = ChaCha8Rng::seed_from_u64(0x9e37);
    let mut report = Report(Vec::new());

    // Elementwise products over rows, with a per-row factor too (broadcast): tiny, and the real
    // hyper state of a 64-token prefill (64 x 10240). The plain elementwise kernels (silu,
    // sigmoid, div_by, mul_by, add, sigmoid_mul) are checked on every node of the programs by
    // tests/gpu_parity.rs.
    for n in [1000usize, 64 * 10240] {
        let x = random(&mut rng, n);
        let y = random(&mut rng, n);
        let s = format!("n={n}");
        let rows = 40;
        let n = n - n % rows;
        let (xa, ya) = (&x[..n], &y[..n]);
        let (da, db) = (gpu.upload(xa, "a").unwrap(), gpu.upload(ya, "b").unwrap());
        report.check(
            "mul_reference_f32",
            &s,
            &gpu.download(&launch::mul(&gpu, &da, &db, rows).unwrap(), "y")
                .unwrap(),
            &ew::mul(xa, ya, rows),
        );
        let col = gpu.upload(&ya[..rows], "col").unwrap();
        report.check(
            "mul_reference_f32 (bcast)",
            &s,
            &gpu.download(&launch::mul(&gpu, &da, &col, rows).unwrap(), "y")
                .unwrap(),
            &ew::mul(xa, &ya[..rows], rows),
        );
        report.check(
            "sigmoid_mul_reference_f32 (bcast)",
            &s,
            &gpu.download(&launch::sigmoid_mul(&gpu, &da, &col, rows).unwrap(), "y")
                .unwrap(),
            &ew::sigmoid_mul(xa, &ya[..rows], rows),
        );
    }

    // RMS norms: (rows, width, group, weight len): tiny hc_norm; real hc_norm (CH 10240 in
    // groups of H 2560); real q_norm (24 heads of 256, weight shared); real GDN-sized groups;
    // groups that are not whole float4s (the scalar path) and one group of the whole 10240.
    for (rows, width, group, wlen) in [
        (3, 256, 64, 256),
        (2, 74, 37, 74),
        (3, 10240, 10240, 10240),
        (64, 10240, 2560, 10240),
        (16, 6144, 256, 256),
        (1, 10240, 2560, 10240),
        (7, 640, 128, 128),
    ] {
        let x = random(&mut rng, rows * width);
        let w = random(&mut rng, wlen);
        let (dx, dw) = (gpu.upload(&x, "x").unwrap(), gpu.upload(&w, "w").unwrap());
        for unit in [true, false] {
            let got = gpu
                .download(
                    &launch::rms_norm(&gpu, &dx, &dw, group, unit, 1e-6).unwrap(),
                    "y",
                )
                .unwrap();
            let want = norm::rms_norm(&x, &w, group, unit, 1e-6);
            report.check(
                "rms_norm_reference_f32",
                &format!("{rows}x{width} g{group} w{wlen} u{}", unit as u8),
                &got,
                &want,
            );
        }
    }

    // Linear layers: tiny odd shapes (no 16-byte path), and the real decode/prefill shapes:
    // q_proj 2560→12288, o_proj 6144→2560, GDN in_proj_qkv 2560→10240, lm_head 2560→248320.
    // One token: every variant of `OneToken` on each shape, besides the one the shape takes
    // (tiny ones, GDN b/a 2560→48, the router 2560→512, a row past 1024, the real projections).
    let shapes = [
        (1, 37, 53),
        (1, 2560, 48),
        (1, 2560, 512),
        (1, 2560, 1025),
        (5, 64, 129),
        (9, 300, 17),
        (1, 2560, 12288),
        (1, 6144, 2560),
        (4, 2560, 10240),
        (16, 2560, 1280),
        (1, 2560, 248320),
    ];
    for (t, k, n) in shapes {
        let x = random(&mut rng, t * k);
        let w = random(&mut rng, n * k);
        let dx = gpu.upload(&x, "x").unwrap();
        let s = format!("T{t} {k}->{n}");
        if n * k <= 64 << 20 {
            let dw = DeviceMatrix::F32(gpu.upload(&w, "w").unwrap());
            let got = gpu
                .download(&launch::linear_rows(&gpu, &dx, &dw, t, k, n).unwrap(), "y")
                .unwrap();
            report.check("linear_rows_f32", &s, &got, &linear::rows(&x, &w, t, k, n));
        }
        let bits = bf16_bits(&w);
        let dw = DeviceMatrix::Bf16(gpu.upload(&bits, "w").unwrap());
        let got = gpu
            .download(&launch::linear_rows(&gpu, &dx, &dw, t, k, n).unwrap(), "y")
            .unwrap();
        let want_bf16 = linear::rows(&x, &widen(&bits), t, k, n);
        report.check("linear_rows_bf16", &s, &got, &want_bf16);
        // One token: every variant, whichever the shape would take.
        if t == 1 {
            let warp_bits =
                launch::linear::linear_one_token(&gpu, &dx, &dw, k, n, OneToken::WarpPerRow);
            let warp_bits = gpu.download(&warp_bits.unwrap(), "y").unwrap();
            for v in OneToken::ALL.into_iter().chain(OneToken::LINEAR_ONLY) {
                if !v.fits(k, dw.chunk_len()) {
                    // Rows longer than a lane holds: refused, not run.
                    let refused = launch::linear::linear_one_token(&gpu, &dx, &dw, k, n, v);
                    assert!(refused.is_err(), "{} took {s}", v.name());
                    continue;
                }
                let got = gpu
                    .download(
                        &launch::linear::linear_one_token(&gpu, &dx, &dw, k, n, v).unwrap(),
                        "y",
                    )
                    .unwrap();
                report.check(
                    &format!("linear one token {}_bf16", v.name()),
                    &s,
                    &got,
                    &want_bf16,
                );
                // The streamed kernel sums as linear_rows1 does, chunk by chunk.
                if OneToken::LINEAR_ONLY.contains(&v) {
                    report.same(
                        &format!("linear one token {}_bf16", v.name()),
                        &s,
                        &got,
                        &warp_bits,
                    );
                }
                if n * k <= 16 << 20 {
                    let dwf = DeviceMatrix::F32(gpu.upload(&w, "w").unwrap());
                    if !v.fits(k, dwf.chunk_len()) {
                        let refused = launch::linear::linear_one_token(&gpu, &dx, &dwf, k, n, v);
                        assert!(refused.is_err(), "{}_f32 took {s}", v.name());
                        continue;
                    }
                    let got = gpu
                        .download(
                            &launch::linear::linear_one_token(&gpu, &dx, &dwf, k, n, v).unwrap(),
                            "y",
                        )
                        .unwrap();
                    report.check(
                        &format!("linear one token {}_f32", v.name()),
                        &s,
                        &got,
                        &linear::rows(&x, &w, t, k, n),
                    );
                }
            }
        }
    }

    // The output projection fused with the residual write (4 streams): tiny odd k (scalar
    // path), several passes of 8 tokens, and the real GDN out_proj 6144->2560 and QSA o_proj
    // 6144->2560 at one token, both weight types.
    for (t, k, n, c) in [
        (1, 37, 19, 4),
        (3, 64, 40, 2),
        (11, 96, 33, 3),
        (1, 6144, 2560, 4),
        (4, 6144, 2560, 4),
    ] {
        let x = random(&mut rng, t * k);
        let w = random(&mut rng, n * k);
        let h = random(&mut rng, t * c * n);
        let inj = random(&mut rng, t * c);
        let (dx, dh, dinj) = (
            gpu.upload(&x, "x").unwrap(),
            gpu.upload(&h, "h").unwrap(),
            gpu.upload(&inj, "inj").unwrap(),
        );
        let s = format!("T{t} {k}->{n} C{c}");
        let bits = bf16_bits(&w);
        for (dtype, dw, wv) in [
            (
                "f32",
                DeviceMatrix::F32(gpu.upload(&w, "w").unwrap()),
                w.clone(),
            ),
            (
                "bf16",
                DeviceMatrix::Bf16(gpu.upload(&bits, "w").unwrap()),
                widen(&bits),
            ),
        ] {
            let want = linear::linear_hc_write(&h, &inj, &x, &wv, t, c);
            let got = gpu
                .download(
                    &launch::linear_hc_write(&gpu, &dh, &dinj, &dx, &dw, t, c, None).unwrap(),
                    "y",
                )
                .unwrap();
            report.check(
                &format!("linear_hc_write_reference_{dtype}"),
                &s,
                &got,
                &want,
            );
            if t == 1 {
                for v in OneToken::ALL {
                    let got = gpu
                        .download(
                            &launch::linear_hc_write(&gpu, &dh, &dinj, &dx, &dw, t, c, Some(v))
                                .unwrap(),
                            "y",
                        )
                        .unwrap();
                    report.check(
                        &format!("linear_hc_write one token {}_{dtype}", v.name()),
                        &s,
                        &got,
                        &want,
                    );
                }
            }
        }
    }

    // Sibling linears in one launch (LinearGroup): tiny odd parts (scalar path), GDN's four input
    // projections 2560 -> 10240, 6144, 48, 48 and QSA's 2560 -> 12288, 512, 512, 640; one token
    // (one launch) and three (a linear_rows each).
    for (t, k, ns) in [
        (1, 37, vec![5, 7, 1]),
        (1, 2560, vec![10240, 6144, 48, 48]),
        (1, 2560, vec![12288, 512, 512, 640]),
        (1, 1280, vec![300, 7, 1]),
        (3, 64, vec![33, 9]),
    ] {
        let x = random(&mut rng, t * k);
        let dx = gpu.upload(&x, "x").unwrap();
        let ws: Vec<Vec<f32>> = ns.iter().map(|&n| random(&mut rng, n * k)).collect();
        let s = format!("T{t} {k}->{ns:?}");
        for bf16 in [false, true] {
            let (mats, host): (Vec<DeviceMatrix>, Vec<Vec<f32>>) = ws
                .iter()
                .map(|w| {
                    if bf16 {
                        let bits = bf16_bits(w);
                        (
                            DeviceMatrix::Bf16(gpu.upload(&bits, "w").unwrap()),
                            widen(&bits),
                        )
                    } else {
                        (DeviceMatrix::F32(gpu.upload(w, "w").unwrap()), w.clone())
                    }
                })
                .unzip();
            let refs: Vec<&DeviceMatrix> = mats.iter().collect();
            let outs =
                launch::linear::linear_group(&gpu, &dx, &refs, t, GroupKernel::EachRows).unwrap();
            for (p, (out, w)) in outs.iter().zip(&host).enumerate() {
                let got = gpu.download(out, "y").unwrap();
                report.check(
                    &format!(
                        "linear_group_{} part {p}",
                        if bf16 { "bf16" } else { "f32" }
                    ),
                    &s,
                    &got,
                    &linear::rows(&x, w, t, k, ns[p]),
                );
            }
            if t != 1 {
                continue;
            }
            let dtype = if bf16 { "bf16" } else { "f32" };
            // By blocks, whichever kernel the group would take.
            let blocks = launch::linear::linear_group(&gpu, &dx, &refs, t, GroupKernel::Blocks);
            for (p, out) in blocks.unwrap().iter().enumerate() {
                let got = gpu.download(out, "y").unwrap();
                let want = linear::rows(&x, &host[p], t, k, ns[p]);
                report.check(
                    &format!("linear_parts1_{dtype} by blocks, part {p}"),
                    &s,
                    &got,
                    &want,
                );
            }
            // Streamed (the parts' rows end to end, a warp per row): linear_rows1's sums, where
            // a lane holds its share of a row; refused elsewhere.
            let streamed = launch::linear::linear_group(&gpu, &dx, &refs, t, GroupKernel::Streamed);
            if !OneToken::Streamed.fits(k, mats[0].chunk_len()) {
                assert!(streamed.is_err(), "streamed group took {s} {dtype}");
                continue;
            }
            for (p, out) in streamed.unwrap().iter().enumerate() {
                let got = gpu.download(out, "y").unwrap();
                let name = format!("linear_parts1_stream_{dtype} part {p}");
                report.check(&name, &s, &got, &linear::rows(&x, &host[p], t, k, ns[p]));
                let rows1 = launch::linear::linear_one_token(
                    &gpu,
                    &dx,
                    &mats[p],
                    k,
                    ns[p],
                    OneToken::WarpPerRow,
                );
                report.same(
                    &name,
                    &s,
                    &got,
                    &gpu.download(&rows1.unwrap(), "y").unwrap(),
                );
            }
        }
    }
    let mixed = [
        DeviceMatrix::F32(gpu.upload(&[0.5f32; 8], "w").unwrap()),
        DeviceMatrix::Bf16(gpu.upload(&[0u16; 8], "w").unwrap()),
    ];
    let x4 = gpu.upload(&[1.0f32; 4], "x").unwrap();
    let err =
        launch::linear::linear_group(&gpu, &x4, &[&mixed[0], &mixed[1]], 1, GroupKernel::Blocks)
            .expect_err("parts of two weight types");
    assert!(err.to_string().contains("linear_parts1_f32"), "{err}");

    // The MoE block's end (shared expert down projection, gate, sum, residual write): tiny odd
    // sizes and the real 640 -> 2560 with 4 streams, one token and three.
    for (t, hid, inter, c) in [
        (1, 37, 19, 4),
        (3, 64, 40, 2),
        (1, 2560, 640, 4),
        (3, 2560, 640, 4),
    ] {
        let (h, inj) = (random(&mut rng, t * c * hid), random(&mut rng, t * c));
        let (x, sh, a) = (
            random(&mut rng, t * hid),
            random(&mut rng, t * inter),
            random(&mut rng, t * hid),
        );
        let (wd, wg) = (random(&mut rng, hid * inter), random(&mut rng, hid));
        let up = |v: &[f32]| gpu.upload(v, "v").unwrap();
        let (dh, dinj, dx, dsh, da, dwg) = (up(&h), up(&inj), up(&x), up(&sh), up(&a), up(&wg));
        let s = format!("T{t} {inter}->{hid} C{c}");
        let bits = bf16_bits(&wd);
        for (dtype, dwd, wv) in [
            ("f32", DeviceMatrix::F32(up(&wd)), wd.clone()),
            (
                "bf16",
                DeviceMatrix::Bf16(gpu.upload(&bits, "w").unwrap()),
                widen(&bits),
            ),
        ] {
            let run = || {
                let y = launch::linear::moe_shared_write(
                    &gpu, &dh, &dinj, &dx, &dsh, &da, &dwd, &dwg, t, c,
                )
                .unwrap();
                gpu.download(&y, "y").unwrap()
            };
            let got = run();
            report.check(
                &format!("moe_shared_write_reference_{dtype}"),
                &s,
                &got,
                &linear::moe_shared_write(&h, &inj, &x, &sh, &a, &wv, &wg, t, c),
            );
            // Running ahead (x and s ready; a is the node ahead's output, read after the wait):
            // the same bits.
            gpu.set_ready_inputs(ReadyInputs(0b01100));
            let ahead = run();
            report.same(
                &format!("moe_shared_write_reference_{dtype} ahead"),
                &s,
                &ahead,
                &got,
            );
        }
    }

    // The tiled multi-token kernel: odd sizes (partial tiles in every dimension) and real prefill
    // shapes (2048 tokens through q_proj; o_proj; the shared expert's 2560->640).
    for (t, k, n) in [
        (9, 37, 53),
        (65, 100, 130),
        (130, 2560, 640),
        (2048, 2560, 12288),
        (512, 6144, 2560),
    ] {
        let x = random(&mut rng, t * k);
        let w = random(&mut rng, n * k);
        let dx = gpu.upload(&x, "x").unwrap();
        let s = format!("T{t} {k}->{n}");
        let dw = DeviceMatrix::F32(gpu.upload(&w, "w").unwrap());
        let got = gpu
            .download(&launch::linear_tiled(&gpu, &dx, &dw, t, k, n).unwrap(), "y")
            .unwrap();
        report.check(
            "linear_tiled_f32",
            &s,
            &got,
            &linear::tiled(&x, &w, t, k, n),
        );
        let bits = bf16_bits(&w);
        let dw = DeviceMatrix::Bf16(gpu.upload(&bits, "w").unwrap());
        let got = gpu
            .download(&launch::linear_tiled(&gpu, &dx, &dw, t, k, n).unwrap(), "y")
            .unwrap();
        report.check(
            "linear_tiled_bf16",
            &s,
            &got,
            &linear::tiled(&x, &widen(&bits), t, k, n),
        );
    }

    // The tensor-core kernel (bf16 weights; x split into bf16 hi + lo, see kernels/linear.cu):
    // tiny odd shapes (partial tiles in T, n and k; k a multiple of 8, not of 32),
    // whole tiles, large activations, and the real prefill shapes: T 64/512/2048 through GDN
    // in_proj_qkv 2560->10240 and o_proj 6144->2560, and the lm_head 2560->248320 at T 64.
    // Split k adds at most 8 partial products once more (round to nearest), within the same bound.
    // Expected: about 2e-6 relative (the split leaves |x - hi - lo| <= 2^-18 |x| per product,
    // about 2.1e-6 RMS on uniform inputs; the tensor cores accumulate in f32), under the f32
    // bound. Each output starts as NaN (an arena slot filled with NaN): an unwritten value fails.
    // k % 8 != 0 and f32 weights are refused (the schedule gives them linear_tiled).
    let mma_tile = |dx: &CudaSlice<f32>, dw: &DeviceMatrix, t: usize, k: usize, n: usize, tile| {
        let poison = gpu.upload(&vec![f32::NAN; t * n], "poison").unwrap();
        gpu.set_slots(&[(poison.device_ptr(&gpu.stream).0, t * n * 4)]);
        let y = launch::linear::linear_mma_with(&gpu, dx, dw, t, k, n, tile).unwrap();
        let got = gpu.download(&y, "y").unwrap();
        drop(y);
        got
    };
    let mma = |dx: &CudaSlice<f32>, dw: &DeviceMatrix, t: usize, k: usize, n: usize| {
        mma_tile(dx, dw, t, k, n, MmaTile::T64)
    };
    for (t, k, n, scale) in [
        (65, 40, 19, 1.0),
        (1, 8, 1, 1.0),
        (3, 72, 70, 1.0),
        (130, 48, 131, 1.0),
        (128, 64, 128, 1.0),
        (200, 264, 200, 1000.0),
        (64, 2560, 10240, 1.0),
        (512, 2560, 10240, 1.0),
        (2048, 2560, 10240, 1.0),
        (64, 6144, 2560, 1.0),
        (512, 6144, 2560, 1.0),
        (2048, 6144, 2560, 1.0),
        (64, 2560, 248320, 1.0),
        // Narrow products over a long k, split into runs of k (mma_k_splits; asserted below):
        // the hyper-connection mix's 10240 -> 320 and GDN's 2560 -> 48 at T 2048, a run count
        // that leaves a short last run (25 stages in 3), and k not a multiple of 32.
        (2048, 10240, 320, 1.0),
        (2048, 2560, 48, 1.0),
        (130, 776, 70, 1.0),
        (96, 2600, 20, 1000.0),
    ] {
        let x = random_scaled(&mut rng, t * k, scale);
        let bits = bf16_bits(&random(&mut rng, n * k));
        let dx = gpu.upload(&x, "x").unwrap();
        let dw = DeviceMatrix::Bf16(gpu.upload(&bits, "w").unwrap());
        let want = linear::tiled(&x, &widen(&bits), t, k, n);
        let s = format!("T{t} {k}->{n}{}", if scale != 1.0 { " x*1000" } else { "" });
        if n <= 320 && k >= 776 {
            for tile in [MmaTile::T64, MmaTile::Wide] {
                let splits = launch::linear::mma_k_splits(gpu.multiprocessors, tile, t, k, n);
                assert!(
                    splits > 1,
                    "{s}: {tile:?} is meant to split k, not {splits}"
                );
            }
        }
        report.check("linear_mma64_bf16", &s, &mma(&dx, &dw, t, k, n), &want);
        let got = mma_tile(&dx, &dw, t, k, n, MmaTile::Wide);
        report.check("linear_mma_wide_bf16", &s, &got, &want);
    }
    // Shapes the tensor-core tiles do not take are refused, never handed to another kernel.
    for (t, k, n, bf16) in [(9, 37, 53, true), (65, 40, 19, false)] {
        let x = random(&mut rng, t * k);
        let w = random(&mut rng, n * k);
        let dx = gpu.upload(&x, "x").unwrap();
        let dw = if bf16 {
            DeviceMatrix::Bf16(gpu.upload(&bf16_bits(&w), "w").unwrap())
        } else {
            DeviceMatrix::F32(gpu.upload(&w, "w").unwrap())
        };
        for tile in MmaTile::ALL {
            let err = launch::linear::linear_mma_with(&gpu, &dx, &dw, t, k, n, tile)
                .expect_err("a shape the tensor-core tiles do not take");
            assert!(err.to_string().contains("_bf16"), "T{t} {k}->{n}: {err}");
        }
    }

    // Embedding gathers: tiny, and the real vocabulary (248320 x 2560, bf16) and PLE lookup shape.
    for (rows, d, count, bf16) in [
        (99, 16, 7, false),
        (152, 4, 12, true),
        (248_320, 2560, 33, true),
        (4096, 160, 64 * 16, false),
    ] {
        let table = random(&mut rng, rows * d);
        let ids: Vec<i64> = (0..count)
            .map(|_| rng.random_range(0..rows as i64))
            .collect();
        let di = gpu.upload(&ids, "ids").unwrap();
        let (dt, want) = if bf16 {
            let bits = bf16_bits(&table);
            let want = embed::gather(&ids, &widen(&bits), d);
            (
                DeviceMatrix::Bf16(gpu.upload(&bits, "table").unwrap()),
                want,
            )
        } else {
            (
                DeviceMatrix::F32(gpu.upload(&table, "table").unwrap()),
                embed::gather(&ids, &table, d),
            )
        };
        let got = gpu
            .download(&launch::embed(&gpu, &di, &dt, d).unwrap(), "y")
            .unwrap();
        report.check(
            if bf16 {
                "embed_reference_bf16"
            } else {
                "embed_reference_f32"
            },
            &format!("{rows}x{d} ids {count}"),
            &got,
            &want,
        );
    }

    // The token embedding entering the streams (fusion `embed_streams`): against the CPU's
    // gather + repeat and, bit for bit, the unfused launches (copies both). (table rows, d,
    // step rows, ids a row, streams, bf16): tiny and odd, and the real vocabulary into 4 streams
    // at a decode step and a 16-token chunk.
    for (table_rows, d, rows, n, c, bf16) in [
        (99, 16, 3, 1, 4, false),
        (152, 5, 4, 2, 3, true),
        (248_320, 2560, 1, 1, 4, true),
        (248_320, 2560, 16, 1, 4, true),
    ] {
        let table = random(&mut rng, table_rows * d);
        let ids: Vec<i64> = (0..rows * n)
            .map(|_| rng.random_range(0..table_rows as i64))
            .collect();
        let di = gpu.upload(&ids, "ids").unwrap();
        let (dt, widened) = if bf16 {
            let bits = bf16_bits(&table);
            let widened = widen(&bits);
            (
                DeviceMatrix::Bf16(gpu.upload(&bits, "table").unwrap()),
                widened,
            )
        } else {
            (
                DeviceMatrix::F32(gpu.upload(&table, "table").unwrap()),
                table,
            )
        };
        let want = embed::gather_streams(&ids, &widened, d, rows, c);
        let got = gpu
            .download(
                &launch::embed_streams(&gpu, &di, rows, &dt, d, c).unwrap(),
                "y",
            )
            .unwrap();
        let e = launch::embed(&gpu, &di, &dt, d).unwrap();
        let plain = gpu
            .download(
                &launch::layout::repeat_streams(&gpu, &e, rows, c).unwrap(),
                "y",
            )
            .unwrap();
        let what = format!(
            "embed_streams_reference_{}",
            if bf16 { "bf16" } else { "f32" }
        );
        let shape = format!("{table_rows}x{d} T{rows} ids {n} C{c}");
        report.check(&what, &shape, &got, &want);
        report.same(&format!("{what} vs unfused"), &shape, &got, &plain);
    }
    let short = gpu.upload(&[0i64; 3], "ids").unwrap();
    let table = DeviceMatrix::F32(gpu.upload(&[0.0f32; 32], "table").unwrap());
    let err = launch::embed_streams(&gpu, &short, 2, &table, 16, 4).expect_err("3 ids, 2 rows");
    assert!(
        err.to_string().contains("embed_streams_reference_f32"),
        "{err}"
    );
    gpu.sync("the kernel checks").unwrap();
    println!(
        "{} checks passed; compiled this run: {:?}",
        report.0.len(),
        gpu.compiled.lock().unwrap()
    );
}

/// A bad launch is an error naming the kernel, not a crash.
#[test]
fn shape_errors_name_the_kernel() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let x = gpu.upload(&[1.0f32; 10], "x").unwrap();
    let w = DeviceMatrix::F32(gpu.upload(&[1.0f32; 12], "w").unwrap());
    let err = launch::linear_rows(&gpu, &x, &w, 1, 2048, 3).expect_err("a shape error");
    assert!(err.to_string().contains("linear_rows_f32"), "{err}");
    // One token, by the variant given: a block per row, a warp per row.
    let block = OneToken::from_variant("group1_g1u4").unwrap();
    let err =
        launch::linear::linear_one_token(&gpu, &x, &w, 2048, 3, block).expect_err("a shape error");
    assert!(err.to_string().contains("linear_group1_g1u4_f32"), "{err}");
    let err = launch::linear::linear_one_token(&gpu, &x, &w, 10, 2000, OneToken::WarpPerRow)
        .expect_err("a shape error");
    assert!(err.to_string().contains("linear_rows1_f32"), "{err}");
    let x8 = gpu.upload(&[1.0f32; 20], "x").unwrap();
    let err = launch::linear_rows(&gpu, &x8, &w, 2, 10, 3).expect_err("a shape error");
    assert!(err.to_string().contains("linear_rows_f32"), "{err}");
}

/// The greedy choice on the device is `sampling::argmax`'s, ties, NaN and infinities included,
/// on random rows of the real vocabulary and on edge rows.
#[test]
fn device_argmax_is_the_samplers_choice() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    use graphrun::exec::cuda::launch::sampling::{argmax_index, argmax_of, argmax_row};
    use graphrun::runtime::sampling::{argmax, check_logits};
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let mut rows: Vec<(String, Vec<f32>)> = vec![
        ("one value".into(), vec![0.5]),
        ("ties: the first wins".into(), vec![1.0, 3.0, 3.0, 2.0, 3.0]),
        ("NaN at 0".into(), vec![nan, 5.0, 7.0]),
        ("NaN elsewhere".into(), vec![1.0, nan, 0.5, nan]),
        ("all -inf".into(), vec![-inf; 1000]),
        ("+inf".into(), vec![1.0, inf, 2.0, inf]),
        ("-0 and +0 tie".into(), vec![-0.0, 0.0, -1.0]),
    ];
    for n in [1usize << 12, 248_320] {
        let mut x = random(&mut rng, n);
        rows.push((format!("random n={n}"), x.clone()));
        // The largest value repeated far apart: the lowest index must win across blocks.
        let m = x.iter().cloned().fold(f32::MIN, f32::max) + 1.0;
        x[n - 3] = m;
        x[n / 2 + 7] = m;
        x[n / 3] = m;
        rows.push((format!("a tie across blocks n={n}"), x));
    }
    let mut key = gpu.upload(&[7u64], "key").unwrap();
    for (name, x) in &rows {
        let dx = gpu.upload(x, "x").unwrap();
        argmax_row(&gpu, &mut key, &dx.slice(..)).unwrap();
        // A row with a NaN is refused naming its first NaN, as the CPU's check does.
        let got = argmax_of(gpu.download(&key, "key").unwrap()[0]);
        let want = check_logits(x, false).map(|()| argmax(x));
        assert_eq!(
            got.map_err(|b| b.token),
            want.map_err(|b| b.token),
            "{name}"
        );
        println!("argmax_row_f32 {name:<28} -> {got:?}");
    }
    // A slice of a longer buffer (the last row of several): only the slice counts.
    let (a, b) = (random(&mut rng, 300), random(&mut rng, 300));
    let both: Vec<f32> = a.iter().chain(&b).cloned().collect();
    let d = gpu.upload(&both, "rows").unwrap();
    argmax_row(&gpu, &mut key, &d.slice(300..)).unwrap();
    assert_eq!(
        argmax_index(gpu.download(&key, "key").unwrap()[0]),
        argmax(&b)
    );
    // Bad shapes are errors naming the kernel.
    let empty = gpu.upload(&[1.0f32], "x").unwrap();
    let err = argmax_row(&gpu, &mut key, &empty.slice(0..0)).expect_err("an empty row");
    assert!(err.to_string().contains("argmax_row_f32"), "{err}");
}

/// Every kernel the real config's and the tiny model's CUDA programs name (decode and prefill at
/// token counts on both sides of the rules' thresholds, f32 and bf16 matrices) is a kernel of
/// exactly one of `kernels/*.cu` and loads: the registry names no kernel that does not exist.
#[test]
fn every_kernel_the_programs_name_exists_and_loads() {
    use graphrun::ir::{Device, LogitsMode, Phase};
    use graphrun::lower::{lower, GraphSet, LowerOptions};
    use graphrun::plan::ModelPlan;
    use graphrun::registry::WeightFormat;
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let graphs = GraphSet::embedded().unwrap();
    let mut names = std::collections::BTreeSet::new();
    for config in [
        "tests/data/configs/qwen3.8-flash-next.json",
        "models/tiny-qwen4exp/config.json",
    ] {
        let plan = ModelPlan::from_file(&common::repo().join(config)).unwrap();
        for (phase, tokens) in [
            (Phase::Decode, 1),
            (Phase::Prefill, 8),
            (Phase::Prefill, 9),
            (Phase::Prefill, 64),
        ] {
            for format in [WeightFormat::F32, WeightFormat::Bf16] {
                let opts = LowerOptions {
                    device: Device::Cuda,
                    weight_format: Some(format),
                    ..LowerOptions::new(phase, tokens, LogitsMode::Last)
                };
                let p = lower(&plan, &graphs, &opts).unwrap().program;
                names.extend(p.nodes.iter().flat_map(|n| n.kernels.iter().cloned()));
            }
        }
    }
    names.remove("cuMemcpyDtoD");
    let files: Vec<&str> = graphrun::exec::cuda::kernels::files().collect();
    for name in &names {
        let found: Vec<&&str> = files
            .iter()
            .filter(|f| gpu.function(f, name).is_ok())
            .collect();
        assert_eq!(found.len(), 1, "kernel {name} is in {found:?}");
    }
    assert!(names.len() > 60, "only {} kernels named", names.len());
}
