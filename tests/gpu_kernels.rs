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
use graphrun::exec::cuda::launch::{self, DeviceMatrix};
use graphrun::ops::{elementwise as ew, embed, linear, norm};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn kernels_match_the_cpu_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    println!(
        "device: {} (sm_{}{}), {} GiB",
        gpu.info.name,
        gpu.info.compute_capability.0,
        gpu.info.compute_capability.1,
        gpu.info.memory_bytes >> 30
    );
    let mut rng = ChaCha8Rng::seed_from_u64(0x9e37);
    let mut report = Report(Vec::new());

    // Elementwise: tiny, and the real hyper state of a 64-token prefill (64 x 10240).
    for n in [1000usize, 64 * 10240] {
        let x = random(&mut rng, n);
        let y = random(&mut rng, n);
        let dx = gpu.upload(&x, "x").unwrap();
        let dy = gpu.upload(&y, "y").unwrap();
        let s = format!("n={n}");
        report.check(
            "silu_reference_f32",
            &s,
            &gpu.download(&launch::unary(&gpu, "silu", &dx).unwrap(), "y")
                .unwrap(),
            &ew::silu_all(&x),
        );
        report.check(
            "sigmoid_reference_f32",
            &s,
            &gpu.download(&launch::unary(&gpu, "sigmoid", &dx).unwrap(), "y")
                .unwrap(),
            &ew::sigmoid_all(&x),
        );
        report.check(
            "div_by_reference_f32",
            &s,
            &gpu.download(&launch::scalar(&gpu, "div_by", &dx, 4.0).unwrap(), "y")
                .unwrap(),
            &ew::div_by(&x, 4.0),
        );
        report.check(
            "mul_by_reference_f32",
            &s,
            &gpu.download(&launch::scalar(&gpu, "mul_by", &dx, 2.0).unwrap(), "y")
                .unwrap(),
            &ew::mul_by(&x, 2.0),
        );
        report.check(
            "add_reference_f32",
            &s,
            &gpu.download(&launch::add(&gpu, &dx, &dy).unwrap(), "y")
                .unwrap(),
            &ew::add(&x, &y),
        );
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
    }

    // RMS norms: (rows, width, group, weight len): tiny hc_norm; real hc_norm (CH 10240 in
    // groups of H 2560); real q_norm (24 heads of 256, weight shared); real GDN-sized groups.
    for (rows, width, group, wlen) in [
        (3, 256, 64, 256),
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
    let shapes = [
        (1, 37, 53),
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
        report.check(
            "linear_rows_bf16",
            &s,
            &got,
            &linear::rows(&x, &widen(&bits), t, k, n),
        );
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
    let Some(gpu) = gpu_or_skip() else { return };
    let x = gpu.upload(&[1.0f32; 10], "x").unwrap();
    let w = DeviceMatrix::F32(gpu.upload(&[1.0f32; 12], "w").unwrap());
    let err = launch::linear_rows(&gpu, &x, &w, 1, 10, 3).expect_err("a shape error");
    assert!(err.to_string().contains("linear_rows_f32"), "{err}");
}
