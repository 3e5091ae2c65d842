//! The layout kernels (`kernels/layout.cu`, `exec::cuda::launch::layout`) against the CPU
//! reference on fresh random inputs, at tiny shapes (odd ones too, for the scalar paths) and at
//! the real Qwen3.8-Flash-Next shapes: H 2560, 4 streams, hyper rank 320, 24 attention heads of
//! 256, 48 GDN value heads of 128, the shared expert 2560→640; 1 and 16 rows.
//!
//! Runs where a CUDA device is present (the GPU machine: `scripts/gpu_tests.sh`, logs in
//! `results/`). Elsewhere (CI) it says so and checks nothing else.
//!
//! Bounds as `tests/gpu_kernels.rs`: within 1e-5 relative (‖gpu − cpu‖ / ‖cpu‖), and max |diff| /
//! max |cpu| within 1e-4. bf16 weights are compared with the reference on the same bf16 values
//! widened to f32, so only the summation order differs.

mod common;

use common::gpu::*;
use cudarc::driver::CudaSlice;
use graphrun::exec::cuda::launch::layout::{self, HcReadAct};
use graphrun::exec::cuda::launch::ple::{self as ple_launch, PleMixShape};
use graphrun::exec::cuda::launch::{self, DeviceMatrix};
use graphrun::exec::cuda::{Launch, ReadyInputs};
use graphrun::ir::GateActivation;
use graphrun::ops::{attention, elementwise as ew, hyper, linear, norm, ple};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The weights on the device (as bf16 bits when `bf16`) and the values the reference uses.
fn matrix(gpu: &Launch, w: &[f32], bf16: bool) -> (DeviceMatrix, Vec<f32>) {
    if bf16 {
        let bits = bf16_bits(w);
        let want = widen(&bits);
        (DeviceMatrix::Bf16(gpu.upload(&bits, "w").unwrap()), want)
    } else {
        (DeviceMatrix::F32(gpu.upload(w, "w").unwrap()), w.to_vec())
    }
}

fn dtype(bf16: bool) -> &'static str {
    if bf16 {
        "bf16"
    } else {
        "f32"
    }
}

/// (rows, H, streams): tiny, odd, and the real hyper state of a decode step and a 16-token chunk.
const STREAM_SHAPES: [(usize, usize, usize); 6] = [
    (3, 32, 2),
    (3, 32, 4),
    (2, 33, 3),
    (1, 2560, 4),
    (16, 2560, 4),
    (300, 2560, 4),
];

#[test]
fn layout_kernels_match_the_cpu_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    println!(
        "device: {} (sm_{}{}), {} GiB",
        gpu.info.name,
        gpu.info.compute_capability.0,
        gpu.info.compute_capability.1,
        gpu.info.memory_bytes >> 30
    );
    let mut rng = ChaCha8Rng::seed_from_u64(0x1a70);
    let mut report = Report(Vec::new());
    let get = |gpu: &Launch, y: &cudarc::driver::CudaSlice<f32>| gpu.download(y, "y").unwrap();

    // Stream layout: repeat, mean, write.
    for (rows, h, c) in STREAM_SHAPES {
        let s = format!("T{rows} H{h} C{c}");
        let x = random(&mut rng, rows * h);
        let dx = gpu.upload(&x, "x").unwrap();
        report.check(
            "repeat_streams_reference_f32",
            &s,
            &get(&gpu, &layout::repeat_streams(&gpu, &dx, rows, c).unwrap()),
            &ew::repeat_streams(&x, rows, c),
        );

        let hs = random(&mut rng, rows * c * h);
        let dh = gpu.upload(&hs, "h").unwrap();
        report.check(
            "stream_mean_reference_f32",
            &s,
            &get(&gpu, &layout::stream_mean(&gpu, &dh, rows, c).unwrap()),
            &ew::stream_mean(&hs, rows, c),
        );
        // Its own generator: the draws of the checks after this one stay as they were.
        let up = random(
            &mut ChaCha8Rng::seed_from_u64(0x6a7e + (rows * h * c) as u64),
            rows * c * h,
        );
        let du = gpu.upload(&up, "up").unwrap();
        report.check(
            "gated_stream_mean_f32",
            &s,
            &get(
                &gpu,
                &layout::gated_stream_mean(&gpu, &du, &dh, rows, c).unwrap(),
            ),
            &ew::gated_stream_mean(&up, &hs, rows, c),
        );

        let inj: Vec<f32> = random(&mut rng, rows * c).iter().map(|v| v + 1.0).collect();
        let di = gpu.upload(&inj, "inj").unwrap();
        report.check(
            "hc_write_reference_f32",
            &s,
            &get(
                &gpu,
                &layout::hc_write(&gpu, &dh, &di, &dx, rows, c).unwrap(),
            ),
            &ew::hc_write(&hs, &inj, &x, rows, c),
        );
    }

    // Column slices: tiny, and the real GDN qkv split (q 2048, k 2048, v 6144 of 10240) and the
    // attention q/gate halves of 12288.
    for (rows, width, start, len) in [
        (3, 64, 5, 17),
        (2, 9, 0, 9),
        (1, 10240, 0, 2048),
        (16, 10240, 4096, 6144),
        (16, 12288, 6144, 6144),
    ] {
        let x = random(&mut rng, rows * width);
        let dx = gpu.upload(&x, "x").unwrap();
        report.check(
            "slice_reference_f32",
            &format!("T{rows} W{width} [{start}, +{len})"),
            &get(
                &gpu,
                &layout::slice_cols(&gpu, &dx, rows, start, len).unwrap(),
            ),
            &ew::slice_cols(&x, rows, start, len),
        );
    }

    // The last row: tiny, and the real hyper state and logits input.
    for (rows, width) in [(3, 64), (1, 10240), (16, 10240), (16, 2560)] {
        let x = random(&mut rng, rows * width);
        let dx = gpu.upload(&x, "x").unwrap();
        report.check(
            "last_row (copy)",
            &format!("T{rows} W{width}"),
            &get(&gpu, &layout::last_row(&gpu, &dx, rows).unwrap()),
            &ew::last_row(&x, rows),
        );
    }

    // q/gate split: tiny, odd, and the real 24 heads of 256.
    for (rows, heads, hd) in [(3, 2, 32), (3, 3, 5), (1, 24, 256), (16, 24, 256)] {
        let qg = random(&mut rng, rows * heads * 2 * hd);
        let dqg = gpu.upload(&qg, "qg").unwrap();
        let (q, g) = layout::split_q_gate(&gpu, &dqg, rows, heads, hd).unwrap();
        let (wq, wg) = attention::split_q_gate(&qg, rows, heads, hd);
        let s = format!("T{rows} {heads}x{hd}");
        report.check("split_q_gate_reference_f32 q", &s, &get(&gpu, &q), &wq);
        report.check("split_q_gate_reference_f32 g", &s, &get(&gpu, &g), &wg);
    }

    // Hyper-connection read chain and injection gains: (rows, H, streams, rank). Up to 8 rows
    // take the block-per-output kernels, more the warp-per-output ones; streams dividing 32 split
    // a warp's lanes over the streams, 3 streams do not.
    for (rows, h, c, r) in [
        (3, 32, 2, 8),
        (3, 32, 4, 8),
        (2, 33, 3, 5),
        (9, 32, 4, 8),
        (12, 33, 3, 5),
        (1, 2560, 4, 320),
        (16, 2560, 4, 320),
    ] {
        let width = c * h;
        let hn = random(&mut rng, rows * width);
        let dhn = gpu.upload(&hn, "hn").unwrap();
        let wd = random(&mut rng, r * width);
        let wu = random(&mut rng, width * r);
        let wi = random(&mut rng, c * width);
        for bf16 in [false, true] {
            let s = format!("T{rows} H{h} C{c} R{r}");
            let (dd, rd) = matrix(&gpu, &wd, bf16);
            let (du, ru) = matrix(&gpu, &wu, bf16);
            report.check(
                &format!("hc_mix_gate_{}", dtype(bf16)),
                &s,
                &get(
                    &gpu,
                    &layout::hc_mix(&gpu, &dhn, &dd, &du, rows, c, rows <= 8).unwrap(),
                ),
                &hyper::hc_mix(&hn, &rd, &ru, rows, c),
            );
            let (di, ri) = matrix(&gpu, &wi, bf16);
            report.check(
                &format!("hc_inject_{}", dtype(bf16)),
                &s,
                &get(
                    &gpu,
                    &layout::hc_inject(&gpu, &dhn, &di, rows, c, rows <= 8).unwrap(),
                ),
                &hyper::hc_inject(&hn, &ri, rows, c),
            );
            // The fused read with its RMS norm, `hn` taken as the raw residual h: a norm weight
            // per channel of every stream (C*H) and one shared by the streams (H).
            for norm_len in [width, h] {
                let norm = random(&mut rng, norm_len);
                let dnorm = gpu.upload(&norm, "norm").unwrap();
                let (wx, winj) = hyper::hc_read(&hn, &norm, &rd, &ru, Some(&ri), rows, c, 1e-6);
                let winj = winj.unwrap();
                // The launches `hc_read_exit` replaces (the norm, then hc_mix's two kernels),
                // for the exit checks below: within the f32 bound, not bit for bit (the fused
                // read sums inv·(h·(1 + w)·row) per stream, the unfused rounds hn first).
                let hn_norm = launch::rms_norm(&gpu, &dhn, &dnorm, h, true, 1e-6).unwrap();
                let unfused_exit = get(
                    &gpu,
                    &layout::hc_mix(&gpu, &hn_norm, &dd, &du, rows, c, rows <= 8).unwrap(),
                );
                // Every first-kernel variant (outputs a block), the executor's
                // (the rules' `s2`) among them.
                for v in HcReadAct::ALL {
                    let read =
                        layout::hc_read(&gpu, &dhn, &dnorm, &dd, &du, Some(&di), rows, c, 1e-6, v);
                    // The few-row forms need the gate's early form (a warp's lanes holding an up
                    // row in whole chunks) and take up to 16 rows: refused otherwise, by name.
                    let chunk = if bf16 { 8 } else { 4 };
                    let few_fits = rows <= graphrun::registry::cuda::layout::HC_FEW_ROWS
                        && graphrun::registry::cuda::layout::gate_early(c, r, chunk);
                    if (v.few_rows || v.few_gate) && !few_fits {
                        let Err(err) = read else {
                            panic!("the few-row forms refuse the shape");
                        };
                        assert!(err.to_string().contains("_few_"), "{err}");
                        continue;
                    }
                    let (x, inj) = read.unwrap();
                    let sn = format!("{s} norm{norm_len} {}", v.name());
                    let x = get(&gpu, &x);
                    report.check(&format!("hc_read_gate_{} x", dtype(bf16)), &sn, &x, &wx);
                    report.check(
                        &format!("hc_read_act_{}_{} inj", v.name(), dtype(bf16)),
                        &sn,
                        &get(&gpu, &inj.expect("gains with inject")),
                        &winj,
                    );
                    // The exit's read (fusion `hc_read_exit`: no injection): the CPU reference's
                    // mix, and the same bits as the read with gains (the R activations are the
                    // same blocks' sums in the same order; the gains only add blocks).
                    let (exit, none) =
                        layout::hc_read(&gpu, &dhn, &dnorm, &dd, &du, None, rows, c, 1e-6, v)
                            .unwrap();
                    assert!(none.is_none(), "gains from a read without inject");
                    let exit = get(&gpu, &exit);
                    let name = format!("hc_read_{}_{} exit x", v.name(), dtype(bf16));
                    report.check(&name, &sn, &exit, &wx);
                    report.check(&format!("{name} vs unfused"), &sn, &exit, &unfused_exit);
                    report.same(&name, &sn, &exit, &x);
                }
            }
        }
    }

    // Fused SwiGLU: tiny odd shapes (the scalar path), more tokens than a warp takes at once
    // (8), and the real shared expert 2560→640; one row takes the block-per-row kernel (odd k
    // too).
    for (rows, k, n) in [
        (1, 37, 19),
        (3, 37, 19),
        (3, 64, 24),
        (9, 32, 40),
        (1, 2560, 640),
        (16, 2560, 640),
    ] {
        let x = random(&mut rng, rows * k);
        let dx = gpu.upload(&x, "x").unwrap();
        let wg = random(&mut rng, n * k);
        let wu = random(&mut rng, n * k);
        for bf16 in [false, true] {
            let (dg, rg) = matrix(&gpu, &wg, bf16);
            let (du, ru) = matrix(&gpu, &wu, bf16);
            report.check(
                &format!("swiglu_linear_reference_{}", dtype(bf16)),
                &format!("T{rows} {k}->{n}"),
                &get(
                    &gpu,
                    &layout::swiglu(&gpu, &dx, &dg, &du, rows, k, n, rows == 1).unwrap(),
                ),
                &linear::swiglu(&x, &rg, &ru, rows, k, n),
            );
            // One token, running ahead (its inputs are uploads, complete): the same bits.
            if rows == 1 {
                let plain = get(
                    &gpu,
                    &layout::swiglu(&gpu, &dx, &dg, &du, rows, k, n, rows == 1).unwrap(),
                );
                gpu.set_ready_inputs(ReadyInputs::ALL);
                let ahead = get(
                    &gpu,
                    &layout::swiglu(&gpu, &dx, &dg, &du, rows, k, n, rows == 1).unwrap(),
                );
                report.same(
                    &format!("swiglu_linear_block_{} ahead", dtype(bf16)),
                    &format!("T{rows} {k}->{n}"),
                    &ahead,
                    &plain,
                );
            }
        }
    }

    // Gated RMS norm: (rows, heads, head_dim, weight len): tiny, a per-channel weight, the real
    // GDN output (48 value heads of 128) at decode and prefill sizes, and 24 heads of 256.
    for (rows, heads, hd, wlen) in [
        (3, 4, 32, 32),
        (3, 3, 33, 99),
        (1, 48, 128, 128),
        (16, 48, 128, 128),
        (16, 24, 256, 256),
        (512, 48, 128, 128),
    ] {
        let x = random(&mut rng, rows * heads * hd);
        let gate = random(&mut rng, rows * heads * hd);
        let w = random(&mut rng, wlen);
        let (dx, dg, dw) = (
            gpu.upload(&x, "x").unwrap(),
            gpu.upload(&gate, "gate").unwrap(),
            gpu.upload(&w, "w").unwrap(),
        );
        for (sigmoid, act) in [
            (true, GateActivation::Sigmoid),
            (false, GateActivation::Silu),
        ] {
            report.check(
                "gated_rms_norm_reference_f32",
                &format!(
                    "T{rows} {heads}x{hd} w{wlen} {}",
                    if sigmoid { "sigmoid" } else { "silu" }
                ),
                &get(
                    &gpu,
                    &layout::gated_rms_norm(&gpu, &dx, &dg, &dw, hd, sigmoid, 1e-6).unwrap(),
                ),
                &norm::gated_rms_norm(&x, &gate, &w, hd, act, 1e-6),
            );
        }
    }

    // PLE gate: random at tiny and real shapes, then the edges of the signed square root: a zero
    // dot product (sign 0: gain 1/2) and tiny ones of both signs (under the 1e-6 floor).
    for (rows, h, c) in STREAM_SHAPES {
        let key = random(&mut rng, rows * c * h);
        let query = random(&mut rng, rows * c * h);
        let value = random(&mut rng, rows * h);
        let (dk, dq, dv) = (
            gpu.upload(&key, "key").unwrap(),
            gpu.upload(&query, "query").unwrap(),
            gpu.upload(&value, "value").unwrap(),
        );
        report.check(
            "ple_gate_reference_f32",
            &format!("T{rows} H{h} C{c}"),
            &get(
                &gpu,
                &layout::ple_gate(&gpu, &dk, &dq, &dv, rows, c).unwrap(),
            ),
            &ple::gate(&key, &query, &value, rows, c),
        );
    }
    {
        let (rows, h, c) = (2, 32, 2);
        let mut key = random(&mut rng, rows * c * h);
        let query = random(&mut rng, rows * c * h);
        let value = random(&mut rng, rows * h);
        // Row 0: stream 0 all zero, stream 1 a dot of 1e-8 * query; row 1, stream 0: -1e-8 * query.
        key[..h].fill(0.0);
        key[h..2 * h].fill(0.0);
        key[h] = 1e-8;
        key[2 * h..3 * h].fill(0.0);
        key[2 * h] = -1e-8;
        let (dk, dq, dv) = (
            gpu.upload(&key, "key").unwrap(),
            gpu.upload(&query, "query").unwrap(),
            gpu.upload(&value, "value").unwrap(),
        );
        report.check(
            "ple_gate_reference_f32",
            "T2 H32 C2 zero/tiny dots",
            &get(
                &gpu,
                &layout::ple_gate(&gpu, &dk, &dq, &dv, rows, c).unwrap(),
            ),
            &ple::gate(&key, &query, &value, rows, c),
        );
    }

    // The shared expert's gate and sum: tiny odd shapes (scalar dot), the real H 2560 at 1 and
    // 16 rows.
    for (rows, h, d) in [(3, 37, 19), (2, 64, 33), (1, 2560, 2560), (16, 2560, 2560)] {
        let x = random(&mut rng, rows * h);
        let w = random(&mut rng, h);
        let b = random(&mut rng, rows * d);
        let a = random(&mut rng, rows * d);
        let (dx, dw) = (gpu.upload(&x, "x").unwrap(), gpu.upload(&w, "w").unwrap());
        let (db, da) = (gpu.upload(&b, "b").unwrap(), gpu.upload(&a, "a").unwrap());
        report.check(
            "sigmoid_gated_add_reference_f32",
            &format!("T{rows} H{h} D{d}"),
            &get(
                &gpu,
                &layout::sigmoid_gated_add(&gpu, &dx, &dw, &db, &da, rows).unwrap(),
            ),
            &linear::sigmoid_gated_add(&x, &w, &b, &a, rows),
        );
    }

    gpu.sync("the layout kernel checks").unwrap();
    println!(
        "{} checks passed; compiled this run: {:?}",
        report.0.len(),
        gpu.compiled.lock().unwrap()
    );
}

/// The launches the fusion `ple_mix` replaces, as the unfused program's nodes make them: the
/// key's and h's norms, the gate, gv's norm, the conv (updating `window`), the two sums.
#[allow(clippy::too_many_arguments)]
fn ple_mix_unfused(
    gpu: &Launch,
    key_proj: &CudaSlice<f32>,
    h: &CudaSlice<f32>,
    value: &CudaSlice<f32>,
    norms: &[CudaSlice<f32>],
    conv_w: &CudaSlice<f32>,
    window: &mut CudaSlice<f32>,
    s: PleMixShape,
    eps: f32,
) -> Vec<f32> {
    let hid = h.len() / s.rows / s.streams;
    let key = launch::rms_norm(gpu, key_proj, &norms[0], hid, true, eps).unwrap();
    let query = launch::rms_norm(gpu, h, &norms[1], hid, true, eps).unwrap();
    let gv = layout::ple_gate(gpu, &key, &query, value, s.rows, s.streams).unwrap();
    let gv_norm = launch::rms_norm(gpu, &gv, &norms[2], hid, true, eps).unwrap();
    let how = if s.rows <= 8 {
        launch::gdn::ConvKernel::Step
    } else {
        launch::gdn::ConvKernel::Reference
    };
    let conv = launch::gdn::causal_conv(
        gpu, &gv_norm, window, conv_w, s.rows, s.kernel, s.dilation, true, how,
    )
    .unwrap();
    let out = launch::add(gpu, &gv, &conv).unwrap();
    gpu.download(&launch::add(gpu, h, &out).unwrap(), "h_out")
        .unwrap()
}

/// The PLE mix (`ple_mix_f32`, kernels/ple.cu) over consecutive steps, so that the conv window
/// carries: each step's output and, after the steps, the window against the CPU reference
/// (`ops::ple::mix`) and against the unfused launches the fusion replaces. Shapes (rows, H,
/// streams, kernel, dilation, norm weights per channel of every stream, or the key's and the
/// query's shared by the streams): tiny and odd ones, more rows a step than the dilation (a row's
/// conv reads rows of its own step), a stream wider than the kernel holds in registers (8 a
/// thread of 1024), and the real PLE layer (C 4, H 2560, kernel 4, dilation = ngram 3) at 1 and
/// 8 rows.
#[test]
fn ple_mix_matches_the_cpu_reference_over_steps() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x91e);
    let mut report = Report(Vec::new());
    let get = |y: &CudaSlice<f32>| gpu.download(y, "y").unwrap();
    let eps = 1e-6;
    for (rows, h, c, kernel, dilation, per_channel) in [
        (1, 32, 2, 4, 3, true),
        (3, 33, 3, 3, 2, false),
        (5, 32, 4, 4, 1, true),
        (2, 40, 2, 2, 3, true),
        (2, 8232, 2, 3, 2, false),
        // A window of 15 rows: more than the kernel keeps in registers (PLE_MAX_PAST).
        (3, 64, 2, 4, 5, true),
        (1, 2560, 4, 4, 3, true),
        (8, 2560, 4, 4, 3, true),
        (1, 2560, 4, 4, 3, false),
    ] {
        let width = c * h;
        let norm_lens = if per_channel {
            [width; 3]
        } else {
            [h, h, width]
        };
        let past = (kernel - 1) * dilation;
        let norms: Vec<Vec<f32>> = norm_lens.iter().map(|&n| random(&mut rng, n)).collect();
        let conv_w = random(&mut rng, width * kernel);
        let dn: Vec<_> = norms
            .iter()
            .map(|w| gpu.upload(w, "norm").unwrap())
            .collect();
        let dconv = gpu.upload(&conv_w, "conv").unwrap();
        // A window from earlier steps, the same on the CPU and in both device runs.
        let mut window = random(&mut rng, past * width);
        let mut fused_window = gpu.upload(&window, "window").unwrap();
        let mut plain_window = gpu.upload(&window, "window").unwrap();
        let s = PleMixShape {
            rows,
            streams: c,
            kernel,
            dilation,
        };
        let steps = 4;
        for step in 0..steps {
            let key_proj = random(&mut rng, rows * width);
            let hs = random(&mut rng, rows * width);
            let value = random(&mut rng, rows * h);
            let (dk, dh, dv) = (
                gpu.upload(&key_proj, "key_proj").unwrap(),
                gpu.upload(&hs, "h").unwrap(),
                gpu.upload(&value, "value").unwrap(),
            );
            let want = ple::mix(
                &key_proj,
                &hs,
                &value,
                &norms[0],
                &norms[1],
                &norms[2],
                &conv_w,
                &mut window,
                rows,
                c,
                kernel,
                dilation,
                eps,
            );
            let fused = ple_launch::ple_mix(
                &gpu,
                &dk,
                &dh,
                &dv,
                &dn[0],
                &dn[1],
                &dn[2],
                &dconv,
                &mut fused_window,
                s,
                eps,
            )
            .unwrap();
            let plain =
                ple_mix_unfused(&gpu, &dk, &dh, &dv, &dn, &dconv, &mut plain_window, s, eps);
            let shape =
                format!("T{rows} H{h} C{c} K{kernel} d{dilation} norms {norm_lens:?} step {step}");
            let fused = get(&fused);
            report.check("ple_mix_f32", &shape, &fused, &want);
            report.check("ple_mix_f32 vs unfused", &shape, &fused, &plain);
        }
        if past > 0 {
            let shape = format!("T{rows} H{h} C{c} K{kernel} d{dilation} after {steps} steps");
            let fused = get(&fused_window);
            report.check("ple_mix_f32 window", &shape, &fused, &window);
            report.check(
                "ple_mix_f32 window vs unfused",
                &shape,
                &fused,
                &get(&plain_window),
            );
        }
    }
    gpu.sync("the PLE mix checks").unwrap();
    println!("{} checks passed", report.0.len());
}

/// A bad launch is an error naming the kernel, not a crash.
#[test]
fn layout_shape_errors_name_the_kernel() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let x = gpu.upload(&[1.0f32; 12], "x").unwrap();
    let f32_w = DeviceMatrix::F32(gpu.upload(&[1.0f32; 12], "w").unwrap());
    let bf16_w = DeviceMatrix::Bf16(gpu.upload(&[0u16; 12], "w").unwrap());

    let err = layout::slice_cols(&gpu, &x, 2, 4, 3).expect_err("a shape error");
    assert!(err.to_string().contains("slice_reference_f32"), "{err}");

    let err = layout::swiglu(&gpu, &x, &f32_w, &bf16_w, 3, 4, 3, false).expect_err("a shape error");
    assert!(
        err.to_string().contains("swiglu_linear_reference_f32"),
        "{err}"
    );

    // hn [1, 12], down [1, 12], up of 12 values where 12 are wanted: fine; 6 are not.
    let short = DeviceMatrix::Bf16(gpu.upload(&[0u16; 6], "up").unwrap());
    let err = layout::hc_mix(&gpu, &x, &bf16_w, &short, 1, 4, true).expect_err("a shape error");
    assert!(err.to_string().contains("hc_mix_gate_bf16"), "{err}");

    let err = layout::split_q_gate(&gpu, &x, 1, 2, 4).expect_err("a shape error");
    assert!(
        err.to_string().contains("split_q_gate_reference_f32"),
        "{err}"
    );

    let err = layout::last_row(&gpu, &x, 5).expect_err("a shape error");
    assert!(err.to_string().contains("last_row"), "{err}");

    // hc_read over h [1, 4 streams x 3], rank 1: a first-kernel variant with no kernel.
    let (h, norm) = (
        gpu.upload(&[1.0f32; 12], "h").unwrap(),
        gpu.upload(&[0.0f32; 12], "norm").unwrap(),
    );
    let inject = DeviceMatrix::Bf16(gpu.upload(&[0u16; 48], "inject").unwrap());
    let three = HcReadAct::of(3, false, false);
    let err = layout::hc_read(
        &gpu,
        &h,
        &norm,
        &bf16_w,
        &bf16_w,
        Some(&inject),
        1,
        4,
        1e-6,
        three,
    )
    .expect_err("no such variant");
    assert!(err.to_string().contains("hc_read_act"), "{err}");
    // The same read with f32 gains beside bf16 mix weights: one kernel takes one type.
    let err = layout::hc_read(
        &gpu,
        &h,
        &norm,
        &bf16_w,
        &bf16_w,
        Some(&f32_w),
        1,
        4,
        1e-6,
        HcReadAct::from_variant("s2").unwrap(),
    )
    .expect_err("mixed weight types");
    assert!(err.to_string().contains("hc_read_gate_s_bf16"), "{err}");

    // The PLE mix over h [1, 4 streams x 3], kernel 4, dilation 3: a window of 8 rows where 9
    // are wanted, then a bad norm weight.
    let s = PleMixShape {
        rows: 1,
        streams: 4,
        kernel: 4,
        dilation: 3,
    };
    let (v3, conv) = (
        gpu.upload(&[1.0f32; 3], "value").unwrap(),
        gpu.upload(&[0.0f32; 48], "conv").unwrap(),
    );
    let mut short_window = gpu.upload(&[0.0f32; 8 * 12], "window").unwrap();
    let err = ple_launch::ple_mix(
        &gpu,
        &h,
        &h,
        &v3,
        &norm,
        &norm,
        &norm,
        &conv,
        &mut short_window,
        s,
        1e-6,
    )
    .expect_err("a shape error");
    assert!(err.to_string().contains("ple_mix_f32"), "{err}");
    // A norm weight of neither 12 nor 3 values.
    let norm4 = gpu.upload(&[0.0f32; 4], "norm").unwrap();
    let mut window = gpu.upload(&[0.0f32; 9 * 12], "window").unwrap();
    let err = ple_launch::ple_mix(
        &gpu,
        &h,
        &h,
        &v3,
        &norm,
        &norm4,
        &norm,
        &conv,
        &mut window,
        s,
        1e-6,
    )
    .expect_err("a shape error");
    assert!(err.to_string().contains("ple_mix_f32"), "{err}");
}
